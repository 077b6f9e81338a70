//! What SPDK v26.05's `scripts/rpc.py` sends for each method nvmfd
//! implements, when the user gives only the required arguments: rpc.py
//! leaves out options that are unset (None) but always sends `store_true` /
//! `store_false` flags and options with a default, so those parameters are
//! in every request. Each request below is what `rpc.py --dry-run` printed
//! for the command line in its comment (v26.05 tag); nvmfd must accept every
//! one. Also the SPDK-internal tuning methods nvmfd accepts with no effect.
//! When a new SPDK release adds a default-sent parameter, add its request
//! here (and the parameter to nvmf-config or the ignored list).

mod common;

use common::*;
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

#[test]
fn every_request_rpc_py_v26_05_sends_by_default_is_accepted() {
    let h = Harness::with(nvmf_config::TargetConfig::default(), true);
    let mut c = h.client();
    let file = h.dir.path().join("disk.img");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let file = file.to_str().unwrap();

    let requests: Vec<(&str, &str, Value)> = vec![
        (
            "rpc_get_methods",
            "rpc_get_methods",
            json!({"current": false, "include_aliases": false}),
        ),
        ("spdk_get_version", "spdk_get_version", json!({})),
        (
            "framework_get_subsystems",
            "framework_get_subsystems",
            json!({}),
        ),
        (
            "framework_get_config bdev",
            "framework_get_config",
            json!({"name": "bdev", "with_batches": false}),
        ),
        ("framework_wait_init", "framework_wait_init", json!({})),
        (
            "bdev_malloc_create -b M0 64 512",
            "bdev_malloc_create",
            json!({"num_blocks": 131072, "block_size": 512, "name": "M0",
                   "md_interleave": false, "dif_is_head_of_md": false}),
        ),
        (
            "bdev_null_create N0 64 512",
            "bdev_null_create",
            json!({"num_blocks": 131072, "block_size": 512, "name": "N0",
                   "dif_is_head_of_md": false}),
        ),
        (
            "bdev_aio_create FILE A0 512",
            "bdev_aio_create",
            json!({"filename": file, "name": "A0", "block_size": 512,
                   "readonly": false, "fallocate": false, "nowait": false}),
        ),
        (
            "bdev_uring_create FILE U0 512",
            "bdev_uring_create",
            json!({"filename": file, "name": "U0", "block_size": 512}),
        ),
        (
            "bdev_rbd_register_cluster c1",
            "bdev_rbd_register_cluster",
            json!({"name": "c1"}),
        ),
        (
            "bdev_rbd_create -c c1 rbd img 4096",
            "bdev_rbd_create",
            json!({"pool_name": "rbd", "rbd_name": "img", "block_size": 4096,
                   "cluster_name": "c1", "read_only": false}),
        ),
        (
            "bdev_rbd_get_clusters_info",
            "bdev_rbd_get_clusters_info",
            json!({}),
        ),
        ("bdev_get_bdevs", "bdev_get_bdevs", json!({})),
        (
            "bdev_get_iostat",
            "bdev_get_iostat",
            json!({"per_channel": false}),
        ),
        (
            "nvmf_create_transport -t TCP",
            "nvmf_create_transport",
            json!({"no_srq": false, "c2h_success": true, "trtype": "TCP", "zcopy": false,
                   "dif_insert_or_strip": false, "no_wr_batching": false,
                   "disable_mappable_bar0": false, "disable_adaptive_irq": false,
                   "disable_shadow_doorbells": false, "disable_command_passthru": false}),
        ),
        (
            "nvmf_create_transport -t RDMA",
            "nvmf_create_transport",
            json!({"no_srq": false, "c2h_success": true, "trtype": "RDMA", "zcopy": false,
                   "dif_insert_or_strip": false, "no_wr_batching": false,
                   "disable_mappable_bar0": false, "disable_adaptive_irq": false,
                   "disable_shadow_doorbells": false, "disable_command_passthru": false}),
        ),
        ("nvmf_get_transports", "nvmf_get_transports", json!({})),
        (
            "nvmf_create_subsystem NQN -a",
            "nvmf_create_subsystem",
            json!({"nqn": NQN, "allow_any_host": true, "ana_reporting": false,
                   "passthrough": false, "enable_nssr": false}),
        ),
        (
            "nvmf_subsystem_add_ns NQN M0",
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "M0", "no_auto_visible": false,
                                             "hide_metadata": false}}),
        ),
        (
            "nvmf_subsystem_add_listener NQN -t tcp -a 127.0.0.1 -s 4420",
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "secure_channel": false,
                   "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"}}),
        ),
        (
            "nvmf_subsystem_add_listener discovery -t tcp -a 127.0.0.1 -s 4420",
            "nvmf_subsystem_add_listener",
            json!({"nqn": "nqn.2014-08.org.nvmexpress.discovery", "secure_channel": false,
                   "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"}}),
        ),
        (
            "nvmf_subsystem_allow_any_host NQN --no-allow-any-host",
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": NQN, "allow_any_host": false}),
        ),
        (
            "nvmf_subsystem_add_host NQN HOST",
            "nvmf_subsystem_add_host",
            json!({"nqn": NQN, "host": "nqn.2014-08.org.nvmexpress:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8"}),
        ),
        (
            "nvmf_subsystem_remove_host NQN HOST",
            "nvmf_subsystem_remove_host",
            json!({"nqn": NQN, "host": "nqn.2014-08.org.nvmexpress:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8"}),
        ),
        ("nvmf_get_subsystems", "nvmf_get_subsystems", json!({})),
        (
            "nvmf_subsystem_get_controllers NQN",
            "nvmf_subsystem_get_controllers",
            json!({"nqn": NQN}),
        ),
        (
            "nvmf_subsystem_get_qpairs NQN",
            "nvmf_subsystem_get_qpairs",
            json!({"nqn": NQN}),
        ),
        (
            "nvmf_subsystem_get_listeners NQN",
            "nvmf_subsystem_get_listeners",
            json!({"nqn": NQN}),
        ),
        (
            "nvmf_subsystem_remove_listener NQN -t tcp -a 127.0.0.1 -s 4420",
            "nvmf_subsystem_remove_listener",
            json!({"nqn": NQN,
                   "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"}}),
        ),
        ("nvmf_set_config", "nvmf_set_config", json!({})),
        ("nvmf_get_stats", "nvmf_get_stats", json!({})),
        ("thread_get_stats", "thread_get_stats", json!({})),
        ("keyring_get_keys", "keyring_get_keys", json!({})),
        (
            "nvmf_subsystem_remove_ns NQN 1",
            "nvmf_subsystem_remove_ns",
            json!({"nqn": NQN, "nsid": 1}),
        ),
        (
            "nvmf_delete_subsystem NQN",
            "nvmf_delete_subsystem",
            json!({"nqn": NQN}),
        ),
        (
            "bdev_rbd_delete Ceph0",
            "bdev_rbd_delete",
            json!({"name": "Ceph0"}),
        ),
        (
            "bdev_rbd_unregister_cluster c1",
            "bdev_rbd_unregister_cluster",
            json!({"name": "c1"}),
        ),
        (
            "bdev_malloc_delete M0",
            "bdev_malloc_delete",
            json!({"name": "M0"}),
        ),
        (
            "bdev_null_delete N0",
            "bdev_null_delete",
            json!({"name": "N0"}),
        ),
        (
            "bdev_aio_delete A0",
            "bdev_aio_delete",
            json!({"name": "A0"}),
        ),
        (
            "bdev_uring_delete U0",
            "bdev_uring_delete",
            json!({"name": "U0"}),
        ),
        // SPDK-internal tuning nvmfd accepts with no effect.
        (
            "iobuf_set_options",
            "iobuf_set_options",
            json!({"enable_numa": false}),
        ),
        (
            "sock_impl_set_options -i posix",
            "sock_impl_set_options",
            json!({"impl_name": "posix"}),
        ),
        (
            "sock_set_default_impl -i posix",
            "sock_set_default_impl",
            json!({"impl_name": "posix"}),
        ),
        ("accel_set_options", "accel_set_options", json!({})),
        ("bdev_set_options", "bdev_set_options", json!({})),
        (
            "bdev_nvme_set_options",
            "bdev_nvme_set_options",
            json!({"delay_cmd_submit": true, "disable_auto_failback": false,
                   "generate_uuids": false, "nvme_error_stat": false, "io_path_stat": false,
                   "allow_accel_sequence": false, "enable_flush": false}),
        ),
        ("bdev_wait_for_examine", "bdev_wait_for_examine", json!({})),
        (
            "framework_set_scheduler static",
            "framework_set_scheduler",
            json!({"name": "static"}),
        ),
        ("vmd_enable", "vmd_enable", json!({})),
        (
            "bdev_iscsi_set_options",
            "bdev_iscsi_set_options",
            json!({}),
        ),
        (
            "iscsi_set_options",
            "iscsi_set_options",
            json!({"disable_chap": false, "require_chap": false, "mutual_chap": false,
                   "immediate_data": false, "allow_duplicated_isid": false}),
        ),
        ("bdev_raid_set_options", "bdev_raid_set_options", json!({})),
        ("nvmf_set_crdt", "nvmf_set_crdt", json!({})),
        (
            "ublk_create_target",
            "ublk_create_target",
            json!({"disable_user_copy": false}),
        ),
    ];
    let mut refused = Vec::new();
    for (line, method, params) in &requests {
        if let Err(e) = call(&mut c, method, params.clone()) {
            refused.push(format!("rpc.py {line}: {} {}", e.code, e.message));
        }
    }
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
}
