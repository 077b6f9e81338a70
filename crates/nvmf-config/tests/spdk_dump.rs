//! Owns the tests that load a realistic SPDK save_config dump and the
//! save → load → save round trip.

use nvmf_config::{
    format_nguid, format_uuid, ignored_param_names, load_file, AddressFamily, BdevKind,
    TargetConfig, DEFAULT_MODEL_NUMBER, SKIPPED_METHODS,
};

const DUMP: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/spdk_v24_save_config.json"
);

fn dump() -> TargetConfig {
    load_file(DUMP).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn realistic_dump_loads_with_skipped_list() {
    let c = dump();
    assert_eq!(
        c.skipped,
        vec![
            "iobuf/iobuf_set_options",
            "sock/sock_set_default_impl",
            "sock/sock_impl_set_options",
            "sock/sock_impl_set_options",
            "accel/accel_set_options",
            "bdev/bdev_set_options",
            "bdev/bdev_raid_set_options",
            "bdev/bdev_iscsi_set_options",
            "bdev/bdev_nvme_set_options",
            "bdev/bdev_nvme_set_hotplug",
            "bdev/bdev_wait_for_examine",
            "scheduler/framework_set_scheduler",
            "nvmf/nvmf_set_config",
            "nvmf/nvmf_set_max_subsystems",
            "nvmf/nvmf_set_crdt",
        ]
    );
    for s in &c.skipped {
        let method = s.split('/').nth(1).unwrap();
        assert!(SKIPPED_METHODS.contains(&method));
    }
    let names: Vec<_> = c.bdevs.iter().map(|b| (b.name.as_str(), b.kind)).collect();
    assert_eq!(
        names,
        vec![
            ("Malloc0", BdevKind::Malloc),
            ("Malloc1", BdevKind::Malloc),
            ("Null0", BdevKind::Null)
        ]
    );
    assert_eq!(c.bdevs[1].block_size, 4096);
    assert_eq!(c.bdevs[2].num_blocks, 2097152);
    assert_eq!(
        c.bdevs[0].uuid.unwrap().to_string(),
        "2f5a3c1e-8d4b-4a7e-9c61-0b3e5d7f9a21"
    );

    let t = &c.transports[0];
    assert!(!t.c2h_success);
    assert_eq!(
        t.num_shared_buffers, 511,
        "num_shared_buffers is used, not ignored"
    );
    assert_eq!(t.max_queue_depth, 128);

    assert_eq!(c.subsystems.len(), 2);
    let s1 = &c.subsystems[0];
    assert_eq!(s1.nqn, "nqn.2016-06.io.spdk:cnode1");
    assert_eq!(s1.serial_number, "SPDK00000000000001");
    assert_eq!(s1.model_number, "SPDK bdev Controller");
    assert!(!s1.allow_any_host);
    assert_eq!(
        s1.hosts,
        vec!["nqn.2014-08.org.nvmexpress:uuid:f0e1d2c3-b4a5-4968-8776-5a4b3c2d1e0f"]
    );
    assert!(s1.host_allowed(&s1.hosts[0]));
    assert!(
        !s1.host_allowed("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001")
    );
    assert_eq!(s1.namespaces.len(), 2);
    let ns2 = s1.namespace(2).unwrap();
    assert_eq!(ns2.bdev_name, "Malloc1");
    assert_eq!(format_nguid(&ns2.nguid), "7C0E4B521F3A4D8EA6B925C4E8F0D613");
    assert_eq!(
        format_uuid(&ns2.uuid),
        "7c0e4b52-1f3a-4d8e-a6b9-25c4e8f0d613"
    );
    assert_ne!(ns2.eui64, [0; 8], "missing EUI-64 is derived");
    assert_eq!(s1.listeners.len(), 1);
    assert_eq!(s1.listeners[0].adrfam, AddressFamily::Ipv4);
    assert_eq!(c.discovery_listeners.len(), 1);
    assert_eq!(c.discovery_listeners[0].trsvcid, "8009");
    // 4420 (shared by both subsystems) and 8009
    assert_eq!(c.listen_addresses().len(), 2);

    let s2 = &c.subsystems[1];
    assert!(s2.allow_any_host);
    assert_eq!(s2.namespaces[0].bdev_name, "Null0");

    for p in [
        "bdev_malloc_create.physical_block_size",
        "bdev_malloc_create.optimal_io_boundary",
        "bdev_malloc_create.dif_is_head_of_md",
        "bdev_malloc_create.dif_pi_format",
        "bdev_null_create.physical_block_size",
        "nvmf_create_transport.buf_cache_size",
        "nvmf_create_transport.zcopy",
        "nvmf_create_transport.sock_priority",
        "nvmf_create_transport.abort_timeout_sec",
        "nvmf_create_transport.ack_timeout",
        "nvmf_create_transport.data_wr_pool_size",
        "nvmf_create_transport.dif_insert_or_strip",
    ] {
        assert!(
            c.ignored_params.iter().any(|i| i == p),
            "{p} not in {:?}",
            c.ignored_params
        );
    }
    let all = ignored_param_names();
    for p in &c.ignored_params {
        assert!(all.contains(p), "{p} not in ignored_param_names()");
    }
    // each listed once
    let mut dedup = c.ignored_params.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(dedup.len(), c.ignored_params.len());
}

#[test]
fn save_load_save_is_byte_identical() {
    for original in [dump(), TargetConfig::embedded_default()] {
        let saved = original.to_json_string_pretty();
        let reloaded =
            TargetConfig::from_json_str(&saved).unwrap_or_else(|e| panic!("{e}\n{saved}"));
        assert_eq!(reloaded.to_json_string_pretty(), saved);
        // Same model, apart from the lists of what was skipped or ignored.
        let mut expect = original.clone();
        expect.skipped.clear();
        expect.ignored_params.clear();
        assert_eq!(reloaded, expect);
        assert!(reloaded.skipped.is_empty());
        assert!(reloaded.ignored_params.is_empty());
        // The value form carries the same document.
        let v: serde_json::Value = serde_json::from_str(&saved).unwrap();
        assert_eq!(v, original.to_json_value());
        assert_eq!(TargetConfig::from_json_value(&v).unwrap(), expect);
    }
}

#[test]
fn derived_ids_are_written_and_stable_across_loads() {
    let text = r#"{"subsystems":[
      {"subsystem":"bdev","config":[
        {"method":"bdev_malloc_create","params":{"name":"M0","num_blocks":64,"block_size":512}}]},
      {"subsystem":"nvmf","config":[
        {"method":"nvmf_create_transport","params":{"trtype":"tcp"}},
        {"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2024-01.io.nvmfd:a"}},
        {"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2024-01.io.nvmfd:a","namespace":{"bdev_name":"M0"}}}]}]}"#;
    let a = TargetConfig::from_json_str(text).unwrap();
    let b = TargetConfig::from_json_str(text).unwrap();
    assert_eq!(a, b);
    let s = &a.subsystems[0];
    assert_eq!(s.model_number, DEFAULT_MODEL_NUMBER);
    assert_eq!(s.serial_number, "00000000000000000000");
    assert_eq!(s.max_namespaces, 32);
    let ns = &s.namespaces[0];
    assert_eq!(ns.nsid, 1);
    let saved = a.to_json_string_pretty();
    assert!(saved.contains(&format_nguid(&ns.nguid)));
    assert!(saved.contains(&format_uuid(&ns.uuid)));
    assert_eq!(TargetConfig::from_json_str(&saved).unwrap(), a);
}

#[test]
fn batched_entries_and_empty_sections_load() {
    // Newer SPDK groups entries into nested arrays ("batches").
    let text = r#"{"subsystems":[
      {"subsystem":"scsi","config":null},
      {"subsystem":"vfio_user_target","config":null},
      {"subsystem":"keyring","config":[]},
      {"subsystem":"some_future_subsystem","config":[]},
      {"subsystem":"bdev","config":[[{"method":"bdev_null_create","params":{"name":"N","num_blocks":8,"block_size":4096}}]]},
      {"subsystem":"nvmf","config":[
        {"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
        [{"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2024-01.io.nvmfd:b","allow_any_host":true}}],
        [],
        [{"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2024-01.io.nvmfd:b","namespace":{"bdev_name":"N","nsid":0}}}],
        [{"method":"nvmf_subsystem_add_listener","params":{"nqn":"nqn.2024-01.io.nvmfd:b","listen_address":{"trtype":"tcp","traddr":"::1","trsvcid":"4420"}}}]
      ]}]}"#;
    let c = TargetConfig::from_json_str(text).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.skipped.is_empty());
    assert_eq!(c.subsystems[0].namespaces[0].nsid, 1);
    assert_eq!(c.subsystems[0].listeners[0].adrfam, AddressFamily::Ipv6);
}

#[test]
fn nvmf_section_may_come_before_bdev_section() {
    let text = r#"{"subsystems":[
      {"subsystem":"nvmf","config":[
        {"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
        {"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2024-01.io.nvmfd:c"}},
        {"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2024-01.io.nvmfd:c","namespace":{"bdev_name":"M"}}}]},
      {"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"M","num_blocks":8,"block_size":512}}]}]}"#;
    TargetConfig::from_json_str(text).unwrap_or_else(|e| panic!("{e}"));
}
