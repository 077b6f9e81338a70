//! The Ceph RBD methods through a real socket with the recording live
//! target: `bdev_rbd_register_cluster` / `_unregister_cluster` /
//! `_get_clusters_info`, `bdev_rbd_create` / `_delete` / `_resize`, and
//! `bdev_get_bdevs` of an rbd bdev (SPDK's shapes and error codes, refusals
//! while in use, state unchanged on error); they persist through the state
//! file; and `nvmf rpc` takes rpc.py's command lines for them.

mod common;

use common::*;
use nvmf_config::{BdevKind, TargetConfig};
use nvmf_rpc::cli::{parse_args, Invocation};
use nvmf_rpc::error::*;
use nvmf_rpc::{Change, RpcClient};
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

#[test]
fn clusters_bdevs_resize_and_refusals() {
    let h = Harness::with(TargetConfig::default(), true);
    let mut c = h.client();

    // Clusters.
    assert_eq!(
        call(&mut c, "bdev_rbd_get_clusters_info", Value::Null).unwrap(),
        json!([])
    );
    let r = call(
        &mut c,
        "bdev_rbd_register_cluster",
        json!({"name": "ceph1", "user_id": "nvmfd", "config_param": {"mon_host": "127.0.0.1:6789"},
               "key_file": "/etc/ceph/k", "core_mask": "0x1"}),
    )
    .unwrap();
    assert_eq!(r, json!("ceph1"));
    assert_eq!(
        call(
            &mut c,
            "bdev_rbd_get_clusters_info",
            json!({"name": "ceph1"})
        )
        .unwrap(),
        json!({"cluster_name": "ceph1", "user_id": "nvmfd",
               "config_param": {"mon_host": "127.0.0.1:6789"}, "key_file": "/etc/ceph/k"})
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_get_clusters_info",
        json!({"name": "x"}),
        ENODEV,
        "no cluster named \"x\"",
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_register_cluster",
        json!({"name": "ceph1"}),
        INVALID_PARAMS,
        "already registered",
    );

    // Bdevs.
    let name = call(
        &mut c,
        "bdev_rbd_create",
        json!({"name": "Rbd0", "pool_name": "rbd", "rbd_name": "img0", "block_size": 4096, "cluster_name": "ceph1"}),
    )
    .unwrap();
    assert_eq!(name, json!("Rbd0"));
    let name = call(
        &mut c,
        "bdev_rbd_create",
        json!({"pool_name": "rbd", "rbd_name": "img1", "block_size": 512, "config": {"mon_host": "10.0.0.9"}}),
    )
    .unwrap();
    assert_eq!(name, json!("Ceph0"), "SPDK's default name");
    let changes = h.live.take_changes();
    assert!(matches!(&changes[0], Change::RegisterRbdCluster(cl) if cl.name == "ceph1"));
    assert!(
        matches!(&changes[1], Change::AddBdev(b) if b.kind == BdevKind::Rbd && b.name == "Rbd0")
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_create",
        json!({"pool_name": "rbd", "rbd_name": "i", "block_size": 512, "cluster_name": "nope"}),
        INVALID_PARAMS,
        "no cluster \"nope\"",
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_create",
        json!({"pool_name": "rbd", "rbd_name": "i", "block_size": 520}),
        EINVAL,
        "block_size",
    );

    fails(
        &h,
        &mut c,
        "bdev_rbd_create",
        json!({"name": "Rbd0", "pool_name": "rbd", "rbd_name": "other", "block_size": 512}),
        EEXIST,
        "already exists",
    );

    // bdev_get_bdevs: SPDK's driver_specific.rbd; num_blocks from the live target.
    h.live.set_num_blocks("Rbd0", 256);
    let b = call(&mut c, "bdev_get_bdevs", json!({"name": "Rbd0"})).unwrap();
    let b = &b[0];
    assert_eq!(b["product_name"], "Ceph Rbd Disk");
    assert_eq!(
        (b["block_size"].as_u64(), b["num_blocks"].as_u64()),
        (Some(4096), Some(256))
    );
    assert_eq!(
        b["driver_specific"],
        json!({"rbd": {"pool_name": "rbd", "rbd_name": "img0", "cluster_name": "ceph1", "user_id": "nvmfd",
                       "config_param": {"mon_host": "127.0.0.1:6789"}, "key_file": "/etc/ceph/k"}})
    );
    let b = call(&mut c, "bdev_get_bdevs", json!({"name": "Ceph0"})).unwrap();
    assert_eq!(
        b[0]["driver_specific"],
        json!({"rbd": {"pool_name": "rbd", "rbd_name": "img1", "config": {"mon_host": "10.0.0.9"}}})
    );

    // Resize: MiB, only growing (compared in MiB, as SPDK).
    assert_eq!(
        call(
            &mut c,
            "bdev_rbd_resize",
            json!({"name": "Rbd0", "new_size": 2})
        )
        .unwrap(),
        json!(true)
    );
    assert_eq!(
        h.live.take_changes(),
        vec![Change::ResizeBdev {
            name: "Rbd0".into(),
            num_blocks: 512
        }]
    );
    let b = call(&mut c, "bdev_get_bdevs", json!({"name": "Rbd0"})).unwrap();
    assert_eq!(b[0]["num_blocks"], 512, "num_blocks follows the resize");
    fails(
        &h,
        &mut c,
        "bdev_rbd_resize",
        json!({"name": "Rbd0", "new_size": 1}),
        EINVAL,
        "rbd bdevs only grow",
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_resize",
        json!({"name": "Nope", "new_size": 9}),
        ENODEV,
        "no bdev named",
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_resize",
        json!({"name": "Rbd0"}),
        INVALID_PARAMS,
        "new_size",
    );
    call(
        &mut c,
        "bdev_null_create",
        json!({"name": "N", "num_blocks": 8, "block_size": 512}),
    )
    .unwrap();
    fails(
        &h,
        &mut c,
        "bdev_rbd_resize",
        json!({"name": "N", "new_size": 9}),
        EINVAL,
        "not by bdev_rbd_create",
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_delete",
        json!({"name": "N"}),
        ENODEV,
        "not by bdev_rbd_create",
    );

    // In use: a namespace holds the bdev, the bdev holds the cluster.
    call(
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": NQN, "allow_any_host": true}),
    )
    .unwrap();
    call(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": NQN, "namespace": {"bdev_name": "Rbd0"}}),
    )
    .unwrap();
    fails(
        &h,
        &mut c,
        "bdev_rbd_delete",
        json!({"name": "Rbd0"}),
        EBUSY,
        "nvmf_subsystem_remove_ns",
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_unregister_cluster",
        json!({"name": "ceph1"}),
        EBUSY,
        "used by rbd bdev \"Rbd0\"",
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_unregister_cluster",
        json!({"name": "x"}),
        ENODEV,
        "no cluster named",
    );

    // Persisted: clusters before bdevs, rbd parameters, no size.
    let saved = std::fs::read_to_string(h.state_path()).unwrap();
    let reloaded = TargetConfig::from_json_str(&saved).unwrap();
    assert_eq!(reloaded.rbd_clusters, h.service.config().rbd_clusters);
    assert_eq!(reloaded.bdevs, h.service.config().bdevs);
    assert!(saved.find("bdev_rbd_register_cluster") < saved.find("bdev_rbd_create"));

    // Taken apart in order.
    call(
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": NQN, "nsid": 1}),
    )
    .unwrap();
    assert_eq!(
        call(&mut c, "bdev_rbd_delete", json!({"name": "Rbd0"})).unwrap(),
        json!(true)
    );
    assert_eq!(
        call(
            &mut c,
            "bdev_rbd_unregister_cluster",
            json!({"name": "ceph1"})
        )
        .unwrap(),
        json!(true)
    );
    let changes = h.live.take_changes();
    assert!(changes.contains(&Change::DeleteBdev {
        name: "Rbd0".into()
    }));
    assert_eq!(
        changes.last(),
        Some(&Change::UnregisterRbdCluster {
            name: "ceph1".into()
        })
    );
    let saved = std::fs::read_to_string(h.state_path()).unwrap();
    assert!(
        !saved.contains("ceph1") && !saved.contains("img0"),
        "{saved}"
    );
    assert!(saved.contains("img1"));
}

/// What rpc.py v26.05 sends for `bdev_rbd_create` (with and without `-r`):
/// accepted; `read_only: true` reaches the live target in the bdev entry,
/// `bdev_get_bdevs` shows the bdev without write support and the state file
/// keeps it; anything but a boolean is refused, naming the parameter.
#[test]
fn read_only_is_accepted_and_kept() {
    let h = Harness::with(TargetConfig::default(), true);
    let mut c = h.client();
    let rw = json!({"name": "Rw", "pool_name": "rbd", "rbd_name": "a", "block_size": 512,
                    "config": {"mon_host": "10.0.0.9"}, "read_only": false});
    let ro = json!({"name": "Ro", "pool_name": "rbd", "rbd_name": "b", "block_size": 4096,
                    "config": {"mon_host": "10.0.0.9"}, "read_only": true});
    assert_eq!(call(&mut c, "bdev_rbd_create", rw).unwrap(), json!("Rw"));
    assert_eq!(call(&mut c, "bdev_rbd_create", ro).unwrap(), json!("Ro"));
    let changes = h.live.take_changes();
    let added: Vec<(String, bool)> = changes
        .iter()
        .filter_map(|ch| match ch {
            Change::AddBdev(b) => Some((b.name.clone(), b.rbd.as_ref().unwrap().read_only)),
            _ => None,
        })
        .collect();
    assert_eq!(added, vec![("Rw".into(), false), ("Ro".into(), true)]);

    let b = call(&mut c, "bdev_get_bdevs", json!({"name": "Ro"})).unwrap();
    let io = &b[0]["supported_io_types"];
    assert_eq!(
        (
            io["read"].as_bool(),
            io["write"].as_bool(),
            io["unmap"].as_bool(),
            io["write_zeroes"].as_bool()
        ),
        (Some(true), Some(false), Some(false), Some(false)),
        "{b}"
    );
    assert_eq!(b[0]["driver_specific"]["rbd"]["read_only"], json!(true));
    let b = call(&mut c, "bdev_get_bdevs", json!({"name": "Rw"})).unwrap();
    assert_eq!(b[0]["supported_io_types"]["write"], json!(true));
    assert!(b[0]["driver_specific"]["rbd"].get("read_only").is_none());

    let saved = std::fs::read_to_string(h.state_path()).unwrap();
    let reloaded = TargetConfig::from_json_str(&saved).unwrap();
    assert!(reloaded.bdev("Ro").unwrap().rbd.as_ref().unwrap().read_only);
    assert!(!reloaded.bdev("Rw").unwrap().rbd.as_ref().unwrap().read_only);

    // Its image is open read-only: no resize through it.
    h.live.set_num_blocks("Ro", 256);
    fails(
        &h,
        &mut c,
        "bdev_rbd_resize",
        json!({"name": "Ro", "new_size": 2}),
        EINVAL,
        "is read-only",
    );
    fails(
        &h,
        &mut c,
        "bdev_rbd_create",
        json!({"name": "X", "pool_name": "rbd", "rbd_name": "c", "block_size": 512, "read_only": 1}),
        INVALID_PARAMS,
        "read_only",
    );
}

#[test]
fn a_failing_open_changes_nothing() {
    // The live target refuses (as the daemon does when the image cannot be
    // opened): model and state file stay as they were.
    let h = Harness::with(TargetConfig::default(), true);
    let mut c = h.client();
    h.live
        .fail_with(Some("bdev R: cannot connect to the cluster"));
    let e = call(
        &mut c,
        "bdev_rbd_create",
        json!({"name": "R", "pool_name": "rbd", "rbd_name": "i", "block_size": 512}),
    )
    .unwrap_err();
    assert_eq!(e.code, INTERNAL_ERROR);
    assert!(
        e.message.contains("cannot connect to the cluster"),
        "{}",
        e.message
    );
    assert!(h.service.config().bdevs.is_empty());
}

fn cli(line: &str) -> Value {
    let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    match parse_args(&words).unwrap_or_else(|e| panic!("{line}: {e}")) {
        Invocation::Call { params, .. } => params.unwrap_or(Value::Null),
        Invocation::Help(_) => panic!("{line}: help"),
    }
}

#[test]
fn rpc_py_command_lines() {
    assert_eq!(
        cli("bdev_rbd_register_cluster c1 --user admin --config-param mon_host=1.2.3.4:6789 \
             --config-param key=AQ== --config-file /etc/ceph/ceph.conf --key-file /k --core-mask 0x3"),
        json!({"name": "c1", "user_id": "admin", "config_param": {"mon_host": "1.2.3.4:6789", "key": "AQ=="},
               "config_file": "/etc/ceph/ceph.conf", "key_file": "/k", "core_mask": "0x3"})
    );
    assert_eq!(cli("bdev_rbd_unregister_cluster c1"), json!({"name": "c1"}));
    assert_eq!(cli("bdev_rbd_get_clusters_info"), Value::Null);
    assert_eq!(
        cli("bdev_rbd_get_clusters_info -b c1"),
        json!({"name": "c1"})
    );
    assert_eq!(
        cli("bdev_rbd_create rbd img 4096 -b R0 -c c1 -u 6ba7b810-9dad-11d1-80b4-00c04fd430c8"),
        json!({"pool_name": "rbd", "rbd_name": "img", "block_size": 4096, "name": "R0",
               "cluster_name": "c1", "uuid": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
               "read_only": false})
    );
    // rpc.py v26.05 sends read_only always (store_true): so do we.
    assert_eq!(
        cli("bdev_rbd_create rbd img 4096 -r"),
        json!({"pool_name": "rbd", "rbd_name": "img", "block_size": 4096, "read_only": true})
    );
    assert_eq!(
        cli("bdev_rbd_create rbd img 4096 --readonly")["read_only"],
        json!(true)
    );
    assert_eq!(
        cli("bdev_rbd_create rbd img 512 --user u --config rbd_cache=false --config a=b=c"),
        json!({"pool_name": "rbd", "rbd_name": "img", "block_size": 512, "user_id": "u",
               "config": {"rbd_cache": "false", "a": "b=c"}, "read_only": false})
    );
    assert_eq!(cli("bdev_rbd_delete R0"), json!({"name": "R0"}));
    assert_eq!(
        cli("bdev_rbd_resize R0 4096"),
        json!({"name": "R0", "new_size": 4096})
    );
    let words: Vec<String> = "bdev_rbd_create rbd img 512 --config nokey"
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let e = parse_args(&words).unwrap_err();
    assert!(e.contains("not in key=value form"), "{e}");
}

/// A live target whose bdev creation takes `delay` (an rbd image opened over
/// the network), telling the test when it started.
struct SlowLive {
    delay: std::time::Duration,
    started: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
}

impl nvmf_rpc::LiveTarget for SlowLive {
    fn apply(&self, change: &Change, _new: &TargetConfig) -> Result<(), String> {
        if matches!(change, Change::AddBdev(b) if b.kind == BdevKind::Rbd) {
            let _ = self.started.lock().unwrap().send(());
            std::thread::sleep(self.delay);
        }
        Ok(())
    }
    fn controllers(&self, _nqn: &str) -> Vec<Value> {
        Vec::new()
    }
    fn qpairs(&self, _nqn: &str) -> Vec<Value> {
        Vec::new()
    }
    fn stats(&self) -> Value {
        nvmf_rpc::live::empty_stats()
    }
}

#[test]
fn queries_answer_while_a_slow_create_is_made_live() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let dir = TempDir::new("slow");
    let sock = dir.path().join("rpc.sock");
    let (tx, rx) = std::sync::mpsc::channel();
    let live = Arc::new(SlowLive {
        delay: Duration::from_millis(1500),
        started: std::sync::Mutex::new(tx),
    });
    let service = Arc::new(nvmf_rpc::RpcService::new(
        TargetConfig::default(),
        live,
        None,
    ));
    let _server = nvmf_rpc::serve(&sock, service).unwrap();
    let client = || {
        let mut c = RpcClient::connect(&sock, 0).unwrap();
        c.set_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    };
    let mut slow = client();
    let creating = std::thread::spawn(move || {
        call(
            &mut slow,
            "bdev_rbd_create",
            json!({"name": "R", "pool_name": "rbd", "rbd_name": "i", "block_size": 512}),
        )
    });
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let t0 = Instant::now();
    let mut c = client();
    let bdevs = call(&mut c, "bdev_get_bdevs", Value::Null).unwrap();
    let saved = call(&mut c, "save_config", Value::Null).unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(700), "queries waited {took:?}");
    assert_eq!(bdevs, json!([]), "not committed yet");
    assert!(!saved.to_string().contains("bdev_rbd_create"));
    // Another change waits for the first (one at a time).
    let t1 = Instant::now();
    call(
        &mut c,
        "bdev_null_create",
        json!({"name": "N", "num_blocks": 8, "block_size": 512}),
    )
    .unwrap();
    assert!(
        t1.elapsed() > Duration::from_millis(500),
        "changes are serialized"
    );
    assert_eq!(creating.join().unwrap().unwrap(), json!("R"));
    let names: Vec<Value> = call(&mut c, "bdev_get_bdevs", Value::Null)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("R"), json!("N")]);
}
