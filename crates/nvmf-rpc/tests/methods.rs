//! Every method's success path and bad-input cases, through a real socket,
//! with the recording live target: results in SPDK's shapes, errors with
//! SPDK's codes and a message naming the problem, state unchanged on error.

mod common;

use common::*;
use nvmf_config::{AddressFamily, ListenerConfig, RdmaOptions, TransportType, DISCOVERY_NQN};
use nvmf_rpc::cli::Invocation;
use nvmf_rpc::error::*;
use nvmf_rpc::{Change, RpcClient};
use serde_json::{json, Value};

const CNODE1: &str = "nqn.2016-06.io.spdk:cnode1";

#[test]
fn meta_methods() {
    let h = Harness::new();
    let mut c = h.client();
    let methods = call(&mut c, "rpc_get_methods", Value::Null).unwrap();
    let list: Vec<&str> = methods
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for m in nvmf_rpc::service::METHODS {
        assert!(list.contains(m), "{m} missing");
    }
    assert!(
        list.contains(&"sock_impl_set_options"),
        "skipped SPDK methods listed for rpc.py load_config"
    );
    let mut sorted = list.clone();
    sorted.sort();
    assert_eq!(list, sorted);
    call(
        &mut c,
        "rpc_get_methods",
        json!({"current": true, "include_aliases": false}),
    )
    .unwrap();
    fails(
        &h,
        &mut c,
        "rpc_get_methods",
        json!({"current": 1}),
        INVALID_PARAMS,
        "\"current\"",
    );

    let v = call(&mut c, "spdk_get_version", Value::Null).unwrap();
    assert_eq!(
        v,
        json!({"version": "nvmfd v0.1.0", "fields": {"major": 0, "minor": 1, "patch": 0, "suffix": ""}})
    );
    fails(
        &h,
        &mut c,
        "spdk_get_version",
        json!({"x": 1}),
        INVALID_PARAMS,
        "unknown parameter",
    );
    fails(
        &h,
        &mut c,
        "bdev_frobnicate",
        Value::Null,
        METHOD_NOT_FOUND,
        "bdev_frobnicate",
    );

    assert_eq!(
        call(&mut c, "framework_get_subsystems", Value::Null).unwrap(),
        json!([{"subsystem": "keyring", "depends_on": []}, {"subsystem": "bdev", "depends_on": []}, {"subsystem": "nvmf", "depends_on": ["bdev", "keyring"]}])
    );
    assert_eq!(
        call(&mut c, "framework_get_config", json!({"name": "bdev"})).unwrap(),
        json!([])
    );
    fails(
        &h,
        &mut c,
        "framework_get_config",
        json!({"name": "vhost"}),
        INVALID_PARAMS,
        "vhost",
    );
    assert_eq!(
        call(&mut c, "framework_wait_init", Value::Null).unwrap(),
        json!(true)
    );
    // SPDK-internal tuning calls (from SPDK save_config dumps) are accepted as no-ops.
    let before = h.service.config();
    assert_eq!(
        call(
            &mut c,
            "sock_impl_set_options",
            json!({"impl_name": "posix", "recv_buf_size": 2097152})
        )
        .unwrap(),
        json!(true)
    );
    assert_eq!(h.service.config(), before);
    fails(
        &h,
        &mut c,
        "iobuf_set_options",
        json!([1]),
        INVALID_PARAMS,
        "object",
    );
    assert!(h.live.changes().is_empty());
}

#[test]
fn bdevs() {
    let h = Harness::new();
    let mut c = h.client();
    let name = call(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 2048, "block_size": 512}),
    )
    .unwrap();
    assert_eq!(name, json!("Malloc0"));
    // Unnamed malloc bdevs are named MallocN, as SPDK does.
    let name = call(
        &mut c,
        "bdev_malloc_create",
        json!({"num_blocks": 16, "block_size": 4096}),
    )
    .unwrap();
    assert_eq!(name, json!("Malloc1"));
    let name = call(
        &mut c,
        "bdev_null_create",
        json!({"name": "Null0", "num_blocks": 100, "block_size": 4096, "uuid": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"}),
    )
    .unwrap();
    assert_eq!(name, json!("Null0"));
    let changes = h.live.take_changes();
    assert_eq!(changes.len(), 3);
    assert!(
        matches!(&changes[0], Change::AddBdev(b) if b.name == "Malloc0" && b.num_blocks == 2048)
    );

    fails(
        &h,
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 1, "block_size": 512}),
        EEXIST,
        "already exists",
    );
    fails(
        &h,
        &mut c,
        "bdev_malloc_create",
        json!({"name": "M", "num_blocks": 1, "block_size": 1000}),
        EINVAL,
        "block_size",
    );
    fails(
        &h,
        &mut c,
        "bdev_malloc_create",
        json!({"name": "M", "block_size": 512}),
        EINVAL,
        "num_blocks",
    );
    fails(
        &h,
        &mut c,
        "bdev_malloc_create",
        json!({"name": "M", "num_blocks": "10", "block_size": 512}),
        EINVAL,
        "num_blocks",
    );
    fails(
        &h,
        &mut c,
        "bdev_malloc_create",
        json!({"name": "M", "num_blocks": 1, "block_size": 512, "bogus": 1}),
        INVALID_PARAMS,
        "bogus",
    );
    fails(
        &h,
        &mut c,
        "bdev_null_create",
        json!({"num_blocks": 1, "block_size": 512}),
        INVALID_PARAMS,
        "name",
    );

    let all = call(&mut c, "bdev_get_bdevs", Value::Null).unwrap();
    assert_eq!(all.as_array().unwrap().len(), 3);
    let one = call(&mut c, "bdev_get_bdevs", json!({"name": "Null0"})).unwrap();
    let b = &one[0];
    assert_eq!(b["name"], "Null0");
    assert_eq!(b["product_name"], "Null disk");
    assert_eq!(b["block_size"], 4096);
    assert_eq!(b["num_blocks"], 100);
    assert_eq!(b["claimed"], false);
    assert_eq!(b["uuid"], "6ba7b810-9dad-11d1-80b4-00c04fd430c8");
    assert_eq!(b["supported_io_types"]["write_zeroes"], true);
    fails(
        &h,
        &mut c,
        "bdev_get_bdevs",
        json!({"name": "Nope"}),
        ENODEV,
        "Nope",
    );

    fails(
        &h,
        &mut c,
        "bdev_malloc_delete",
        json!({"name": "Nope"}),
        ENODEV,
        "Nope",
    );
    fails(
        &h,
        &mut c,
        "bdev_malloc_delete",
        json!({"name": "Null0"}),
        ENODEV,
        "bdev_null_create",
    );
    fails(
        &h,
        &mut c,
        "bdev_malloc_delete",
        Value::Null,
        INVALID_PARAMS,
        "\"name\"",
    );
    assert_eq!(
        call(&mut c, "bdev_malloc_delete", json!({"name": "Malloc1"})).unwrap(),
        json!(true)
    );
    assert_eq!(
        call(&mut c, "bdev_null_delete", json!({"name": "Null0"})).unwrap(),
        json!(true)
    );
    assert_eq!(
        h.live.take_changes(),
        vec![
            Change::DeleteBdev {
                name: "Malloc1".into()
            },
            Change::DeleteBdev {
                name: "Null0".into()
            }
        ]
    );
    let names: Vec<String> = h
        .service
        .config()
        .bdevs
        .iter()
        .map(|b| b.name.clone())
        .collect();
    assert_eq!(names, ["Malloc0"]);
}

#[test]
fn subsystems_namespaces_listeners_hosts() {
    let h = Harness::new();
    let mut c = h.client();
    quickstart(&mut c);
    let changes = h.live.take_changes();
    let kinds: Vec<&str> = changes.iter().map(Change::kind).collect();
    assert_eq!(
        kinds,
        [
            "CreateTransport",
            "AddBdev",
            "CreateSubsystem",
            "AddNamespace",
            "AddListener"
        ]
    );
    match &changes[3] {
        Change::AddNamespace { nqn, ns } => {
            assert_eq!(nqn, CNODE1);
            assert_eq!(ns.nsid, 1);
            assert_eq!(ns.bdev_name, "Malloc0");
        }
        other => panic!("{other:?}"),
    }

    // transports
    let t = call(&mut c, "nvmf_get_transports", Value::Null).unwrap();
    assert_eq!(t[0]["trtype"], "TCP");
    assert_eq!(t[0]["io_unit_size"], 8192);
    assert_eq!(t[0]["in_capsule_data_size"], 8192);
    assert_eq!(t[0]["max_queue_depth"], 128);
    call(&mut c, "nvmf_get_transports", json!({"trtype": "tcp"})).unwrap();
    fails(
        &h,
        &mut c,
        "nvmf_get_transports",
        json!({"trtype": "RDMA"}),
        INVALID_PARAMS,
        "RDMA",
    );
    fails(
        &h,
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "TCP"}),
        INTERNAL_ERROR,
        "already exists",
    );
    fails(
        &h,
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "VFIOUSER"}),
        INVALID_PARAMS,
        "VFIOUSER",
    );
    fails(
        &h,
        &mut c,
        "nvmf_create_transport",
        json!({}),
        INVALID_PARAMS,
        "trtype",
    );

    // subsystems
    fails(
        &h,
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": CNODE1}),
        INTERNAL_ERROR,
        "already exists",
    );
    fails(
        &h,
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": "iqn.bad"}),
        INVALID_PARAMS,
        "invalid NQN",
    );
    fails(
        &h,
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": 5}),
        INVALID_PARAMS,
        "nqn",
    );
    // a controller ID range that is empty or outside 1..=0xFFEF
    fails(
        &h,
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": "nqn.2016-06.io.spdk:ids", "min_cntlid": 100, "max_cntlid": 50}),
        INVALID_PARAMS,
        "max_cntlid",
    );
    fails(
        &h,
        &mut c,
        "nvmf_create_subsystem",
        json!({"nqn": "nqn.2016-06.io.spdk:ids", "min_cntlid": 0xFFF0}),
        INVALID_PARAMS,
        "min_cntlid",
    );
    let cnode2 = "nqn.2016-06.io.spdk:cnode2";
    assert_eq!(
        call(
            &mut c,
            "nvmf_create_subsystem",
            json!({"nqn": cnode2, "max_namespaces": 4})
        )
        .unwrap(),
        json!(true)
    );
    let subs = call(&mut c, "nvmf_get_subsystems", Value::Null).unwrap();
    assert_eq!(subs[0]["nqn"], DISCOVERY_NQN);
    assert_eq!(subs[0]["subtype"], "Discovery");
    assert_eq!(subs[1]["nqn"], CNODE1);
    assert_eq!(subs[1]["subtype"], "NVMe");
    assert_eq!(subs[1]["allow_any_host"], true);
    assert_eq!(subs[1]["serial_number"], "SPDK00000000000001");
    assert_eq!(subs[1]["model_number"], "SPDK_Controller1");
    assert_eq!(subs[1]["namespaces"][0]["nsid"], 1);
    assert_eq!(subs[1]["namespaces"][0]["name"], "Malloc0");
    assert_eq!(
        subs[1]["listen_addresses"][0],
        json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4420"})
    );
    assert_eq!(subs[2]["allow_any_host"], false);
    assert_eq!(
        call(&mut c, "nvmf_get_subsystems", json!({"nqn": cnode2}))
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    fails(
        &h,
        &mut c,
        "nvmf_get_subsystems",
        json!({"nqn": "nqn.2016-06.io.spdk:x"}),
        INVALID_PARAMS,
        "no subsystem",
    );

    // namespaces
    call(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Malloc1", "num_blocks": 64, "block_size": 512}),
    )
    .unwrap();
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": cnode2, "namespace": {"bdev_name": "Malloc0"}}),
        INVALID_PARAMS,
        "already namespace 1",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": cnode2, "namespace": {"bdev_name": "Nope"}}),
        INVALID_PARAMS,
        "no bdev named \"Nope\"",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": CNODE1, "namespace": {"bdev_name": "Malloc1", "nsid": 1}}),
        INVALID_PARAMS,
        "NSID 1",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": cnode2, "namespace": {"bdev_name": "Malloc1", "nsid": 9}}),
        INVALID_PARAMS,
        "max_namespaces",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": "nqn.2016-06.io.spdk:x", "namespace": {"bdev_name": "Malloc1"}}),
        INVALID_PARAMS,
        "no subsystem",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": cnode2}),
        INVALID_PARAMS,
        "namespace",
    );
    assert_eq!(
        call(
            &mut c,
            "nvmf_subsystem_add_ns",
            json!({"nqn": cnode2, "namespace": {"bdev_name": "Malloc1", "nsid": 3}})
        )
        .unwrap(),
        json!(3)
    );
    let b = call(&mut c, "bdev_get_bdevs", json!({"name": "Malloc1"})).unwrap();
    assert_eq!(b[0]["claimed"], true);
    fails(
        &h,
        &mut c,
        "bdev_malloc_delete",
        json!({"name": "Malloc1"}),
        EBUSY,
        "namespace 3",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": cnode2, "nsid": 1}),
        INVALID_PARAMS,
        "NSID 1",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": cnode2}),
        INVALID_PARAMS,
        "nsid",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": cnode2, "nsid": -1}),
        INVALID_PARAMS,
        "nsid",
    );
    assert_eq!(
        call(
            &mut c,
            "nvmf_subsystem_remove_ns",
            json!({"nqn": cnode2, "nsid": 3})
        )
        .unwrap(),
        json!(true)
    );
    assert_eq!(
        call(&mut c, "bdev_malloc_delete", json!({"name": "Malloc1"})).unwrap(),
        json!(true)
    );

    // listeners
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": CNODE1, "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"}}),
        INVALID_PARAMS,
        "already listens",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": CNODE1, "listen_address": {"trtype": "tcp", "traddr": "localhost", "trsvcid": "4420"}}),
        INVALID_PARAMS,
        "not an IP address",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": CNODE1, "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "99999"}}),
        INVALID_PARAMS,
        "trsvcid",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": CNODE1, "listen_address": {"trtype": "rdma", "traddr": "127.0.0.1", "trsvcid": "4420"}}),
        INVALID_PARAMS,
        "no RDMA transport",
    );
    let disc = json!({"nqn": DISCOVERY_NQN, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4420"}});
    assert_eq!(
        call(&mut c, "nvmf_subsystem_add_listener", disc.clone()).unwrap(),
        json!(true)
    );
    let l = call(
        &mut c,
        "nvmf_subsystem_get_listeners",
        json!({"nqn": CNODE1}),
    )
    .unwrap();
    assert_eq!(
        l,
        json!([{"address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4420"}}])
    );
    assert_eq!(
        call(
            &mut c,
            "nvmf_subsystem_get_listeners",
            json!({"nqn": DISCOVERY_NQN})
        )
        .unwrap()
        .as_array()
        .unwrap()
        .len(),
        1
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_get_listeners",
        json!({"nqn": cnode2 .replace('2', "9")}),
        INVALID_PARAMS,
        "no subsystem",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": CNODE1, "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4421"}}),
        INVALID_PARAMS,
        "does not listen",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": CNODE1}),
        INVALID_PARAMS,
        "listen_address",
    );
    h.live.take_changes();
    assert_eq!(
        call(&mut c, "nvmf_subsystem_remove_listener", disc).unwrap(),
        json!(true)
    );
    assert_eq!(
        call(&mut c, "nvmf_subsystem_remove_listener", json!({"nqn": CNODE1, "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"}})).unwrap(),
        json!(true)
    );
    let ch = h.live.take_changes();
    assert!(matches!(&ch[0], Change::RemoveListener { nqn, .. } if nqn == DISCOVERY_NQN));
    assert!(
        matches!(&ch[1], Change::RemoveListener { nqn, listener } if nqn == CNODE1 && listener.trsvcid == "4420")
    );

    // hosts
    let host = "nqn.2014-08.org.nvmexpress:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8";
    assert_eq!(
        call(
            &mut c,
            "nvmf_subsystem_add_host",
            json!({"nqn": cnode2, "host": host})
        )
        .unwrap(),
        json!(true)
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": cnode2, "host": host}),
        INVALID_PARAMS,
        "already allowed",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": cnode2, "host": "nqn.bad"}),
        INVALID_PARAMS,
        "invalid NQN",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": cnode2, "host": "nqn.2016-06.io.spdk:h", "psk": "key0"}),
        INVALID_PARAMS,
        "no key named \"key0\"",
    );
    let subs = call(&mut c, "nvmf_get_subsystems", json!({"nqn": cnode2})).unwrap();
    assert_eq!(subs[0]["hosts"], json!([{"nqn": host}]));
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_remove_host",
        json!({"nqn": cnode2, "host": "nqn.2016-06.io.spdk:other"}),
        INVALID_PARAMS,
        "not on the allowed list",
    );
    assert_eq!(
        call(
            &mut c,
            "nvmf_subsystem_remove_host",
            json!({"nqn": cnode2, "host": host})
        )
        .unwrap(),
        json!(true)
    );
    assert_eq!(
        call(
            &mut c,
            "nvmf_subsystem_allow_any_host",
            json!({"nqn": cnode2, "allow_any_host": true})
        )
        .unwrap(),
        json!(true)
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_allow_any_host",
        json!({"nqn": cnode2}),
        INVALID_PARAMS,
        "allow_any_host",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_allow_any_host",
        json!({"nqn": cnode2, "allow_any_host": "yes"}),
        INVALID_PARAMS,
        "allow_any_host",
    );
    let ch = h.live.take_changes();
    assert_eq!(
        ch,
        vec![
            Change::AddHost {
                nqn: cnode2.into(),
                host: host.into()
            },
            Change::RemoveHost {
                nqn: cnode2.into(),
                host: host.into()
            },
            Change::AllowAnyHost {
                nqn: cnode2.into(),
                allow: true
            },
        ]
    );

    // delete
    fails(
        &h,
        &mut c,
        "nvmf_delete_subsystem",
        json!({"nqn": DISCOVERY_NQN}),
        INVALID_PARAMS,
        "discovery",
    );
    fails(
        &h,
        &mut c,
        "nvmf_delete_subsystem",
        json!({"nqn": "nqn.2016-06.io.spdk:x"}),
        INVALID_PARAMS,
        "no subsystem",
    );
    assert_eq!(
        call(
            &mut c,
            "nvmf_delete_subsystem",
            json!({"nqn": CNODE1, "tgt_name": "nvmf_tgt"})
        )
        .unwrap(),
        json!(true)
    );
    assert_eq!(
        h.live.take_changes(),
        vec![Change::DeleteSubsystem { nqn: CNODE1.into() }]
    );
    // Its namespace's bdev is free again.
    assert_eq!(
        call(&mut c, "bdev_malloc_delete", json!({"name": "Malloc0"})).unwrap(),
        json!(true)
    );
}

#[test]
fn live_queries_and_refusals() {
    let h = Harness::new();
    let mut c = h.client();
    quickstart(&mut c);
    let ctrlr = json!({"cntlid": 1, "cntrltype": "io", "hostnqn": "nqn.2016-06.io.spdk:host1", "hostid": "27dad528-6368-41c3-82d3-0b956b49025d", "num_io_qpairs": 2});
    h.live.push_controller(CNODE1, ctrlr.clone());
    h.live
        .push_qpair(CNODE1, json!({"cntlid": 1, "qid": 0, "state": "active"}));
    h.live
        .set_stats(json!({"tick_rate": 1000, "poll_groups": [{"name": "reactor0"}]}));
    assert_eq!(
        call(
            &mut c,
            "nvmf_subsystem_get_controllers",
            json!({"nqn": CNODE1})
        )
        .unwrap(),
        json!([ctrlr])
    );
    assert_eq!(
        call(&mut c, "nvmf_subsystem_get_qpairs", json!({"nqn": CNODE1}))
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        call(&mut c, "nvmf_get_stats", Value::Null).unwrap()["poll_groups"][0]["name"],
        "reactor0"
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_get_controllers",
        json!({"nqn": "nqn.2016-06.io.spdk:x"}),
        INVALID_PARAMS,
        "no subsystem",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_get_qpairs",
        json!({}),
        INVALID_PARAMS,
        "nqn",
    );
    fails(
        &h,
        &mut c,
        "nvmf_get_stats",
        json!({"foo": 1}),
        INVALID_PARAMS,
        "foo",
    );

    // The live target refusing a change: error, nothing committed.
    h.live.fail_with(Some("port 4421 is in use"));
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": CNODE1, "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4421"}}),
        INTERNAL_ERROR,
        "port 4421 is in use",
    );
    h.live.fail_with(None);
    call(&mut c, "nvmf_subsystem_add_listener", json!({"nqn": CNODE1, "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4421"}})).unwrap();
}

#[test]
fn save_load_save_is_byte_identical() {
    let h = Harness::new();
    let mut c = h.client();
    quickstart(&mut c);
    call(
        &mut c,
        "bdev_null_create",
        json!({"name": "Null0", "num_blocks": 100, "block_size": 4096}),
    )
    .unwrap();
    call(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": CNODE1, "host": "nqn.2016-06.io.spdk:host1"}),
    )
    .unwrap();
    let saved = call(&mut c, "save_config", Value::Null).unwrap();
    let text1 = serde_json::to_string_pretty(&saved).unwrap();
    assert_eq!(saved, h.service.config().to_json_value());
    // framework_get_config (what rpc.py's save_config uses) gives the same sections.
    assert_eq!(
        call(&mut c, "framework_get_config", json!({"name": "nvmf"})).unwrap(),
        saved["subsystems"][1]["config"]
    );

    // Into a fresh server (it replaces everything there).
    let h2 = Harness::new();
    let mut c2 = h2.client();
    call(
        &mut c2,
        "bdev_malloc_create",
        json!({"name": "Other", "num_blocks": 8, "block_size": 512}),
    )
    .unwrap();
    h2.live.take_changes();
    assert_eq!(
        call(&mut c2, "load_config", saved.clone()).unwrap(),
        json!(true)
    );
    assert_eq!(h2.live.take_changes(), vec![Change::LoadConfig]);
    let text2 =
        serde_json::to_string_pretty(&call(&mut c2, "save_config", Value::Null).unwrap()).unwrap();
    assert_eq!(text1, text2);
    // And into the same server.
    call(&mut c, "load_config", saved).unwrap();
    let text3 =
        serde_json::to_string_pretty(&call(&mut c, "save_config", Value::Null).unwrap()).unwrap();
    assert_eq!(text1, text3);

    // A bad document changes nothing.
    fails(
        &h2,
        &mut c2,
        "load_config",
        json!({"subsystems": [{"subsystem": "nvmf", "config": [{"method": "nvmf_subsystem_add_ns", "params": {"nqn": CNODE1, "namespace": {"bdev_name": "Nope"}}}]}]}),
        INVALID_PARAMS,
        "no subsystem",
    );
    fails(
        &h2,
        &mut c2,
        "load_config",
        json!({"config": []}),
        INVALID_PARAMS,
        "subsystems",
    );
    fails(
        &h2,
        &mut c2,
        "load_config",
        Value::Null,
        INVALID_PARAMS,
        "save_config document",
    );

    // rpc.py's client-side load_config: one call per entry, SPDK's internal
    // tuning entries included, into an empty target.
    let h3 = Harness::new();
    let mut c3 = h3.client();
    let spdk_like: Value = serde_json::from_str(&text1).unwrap();
    call(
        &mut c3,
        "iobuf_set_options",
        json!({"small_pool_count": 8192}),
    )
    .unwrap();
    for sec in spdk_like["subsystems"].as_array().unwrap() {
        for e in sec["config"].as_array().unwrap() {
            call(&mut c3, e["method"].as_str().unwrap(), e["params"].clone()).unwrap();
        }
    }
    let text4 =
        serde_json::to_string_pretty(&call(&mut c3, "save_config", Value::Null).unwrap()).unwrap();
    assert_eq!(text1, text4);
}

/// `nvmf_create_transport -t RDMA` with rpc.py's parameters, RDMA listeners
/// on a subsystem and on the discovery NQN, what `nvmf_get_transports` and
/// `nvmf_subsystem_get_listeners` show, the refusals, and save → load.
#[test]
fn rdma_transport_and_listeners() {
    let h = Harness::new();
    let mut c = h.client();
    quickstart(&mut c);
    h.live.take_changes();

    // What `nvmf rpc` (and rpc.py) sends for
    // nvmf_create_transport -t RDMA -u 8192 -i 131072 -c 8192 -s 1024 -r -l 64 -w -d 2048
    let Invocation::Call { params, .. } = nvmf_rpc::cli::parse_args(
        &"nvmf_create_transport -t RDMA -u 8192 -i 131072 -c 8192 -s 1024 -r -l 64 -w -d 2048"
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>(),
    )
    .unwrap() else {
        panic!("not a call")
    };
    let params = params.unwrap();
    assert_eq!(params["c2h_success"], true, "rpc.py always sends it");
    assert_eq!(
        call(&mut c, "nvmf_create_transport", params).unwrap(),
        json!(true)
    );
    let rdma = match h.live.take_changes().as_slice() {
        [Change::CreateTransport(t)] => t.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(rdma.trtype, TransportType::Rdma);
    assert_eq!(
        rdma.rdma,
        Some(RdmaOptions {
            max_srq_depth: 1024,
            no_srq: true,
            num_cqe: 2048,
            acceptor_backlog: 64,
            no_wr_batching: true,
        })
    );
    assert_eq!(
        (
            rdma.io_unit_size,
            rdma.max_io_size,
            rdma.in_capsule_data_size
        ),
        (8192, 131072, 8192)
    );
    let t = call(&mut c, "nvmf_get_transports", json!({"trtype": "rdma"})).unwrap();
    assert_eq!(
        t,
        json!([{"trtype": "RDMA", "max_queue_depth": 128, "max_io_qpairs_per_ctrlr": 127,
                "in_capsule_data_size": 8192, "max_io_size": 131072, "io_unit_size": 8192,
                "max_aq_depth": 128, "num_shared_buffers": 4095, "max_srq_depth": 1024,
                "no_srq": true, "num_cqe": 2048, "acceptor_backlog": 64, "no_wr_batching": true}])
    );
    let all = call(&mut c, "nvmf_get_transports", Value::Null).unwrap();
    let types: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["trtype"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["TCP", "RDMA"]);
    assert!(all[0].get("max_srq_depth").is_none());

    // Refusals change nothing.
    fails(
        &h,
        &mut c,
        "nvmf_create_transport",
        json!({"trtype": "rdma"}),
        INTERNAL_ERROR,
        "already exists",
    );
    let h2 = Harness::new();
    let mut c2 = h2.client();
    for (p, needle) in [
        (
            json!({"trtype": "RDMA", "c2h_success": false}),
            "NVMe/TCP option",
        ),
        (
            json!({"trtype": "RDMA", "in_capsule_data_size": 32768}),
            "larger than 16384",
        ),
        (
            json!({"trtype": "RDMA", "acceptor_backlog": 0}),
            "acceptor_backlog",
        ),
        (json!({"trtype": "RDMA", "max_aq_depth": 8}), "below 32"),
    ] {
        fails(
            &h2,
            &mut c2,
            "nvmf_create_transport",
            p,
            INVALID_PARAMS,
            needle,
        );
    }

    // Listeners: IPv4 with the port, IPv6 without (4420), the discovery NQN.
    for la in [
        json!({"trtype": "rdma", "traddr": "192.168.100.8", "trsvcid": "4420"}),
        json!({"trtype": "RDMA", "adrfam": "ipv6", "traddr": "fd00::8"}),
    ] {
        assert_eq!(
            call(
                &mut c,
                "nvmf_subsystem_add_listener",
                json!({"nqn": CNODE1, "listen_address": la})
            )
            .unwrap(),
            json!(true)
        );
    }
    assert_eq!(
        call(
            &mut c,
            "nvmf_subsystem_add_listener",
            json!({"nqn": DISCOVERY_NQN, "listen_address": {"trtype": "rdma", "traddr": "192.168.100.8", "trsvcid": "4420"}})
        )
        .unwrap(),
        json!(true)
    );
    let changes = h.live.take_changes();
    let added: Vec<(String, ListenerConfig)> = changes
        .into_iter()
        .map(|ch| match ch {
            Change::AddListener { nqn, listener } => (nqn, listener),
            other => panic!("{other:?}"),
        })
        .collect();
    let rdma_l = |fam, addr: &str| ListenerConfig {
        trtype: TransportType::Rdma,
        adrfam: fam,
        traddr: addr.to_string(),
        trsvcid: "4420".to_string(),
    };
    assert_eq!(
        added,
        vec![
            (
                CNODE1.to_string(),
                rdma_l(AddressFamily::Ipv4, "192.168.100.8")
            ),
            (CNODE1.to_string(), rdma_l(AddressFamily::Ipv6, "fd00::8")),
            (
                DISCOVERY_NQN.to_string(),
                rdma_l(AddressFamily::Ipv4, "192.168.100.8")
            ),
        ]
    );
    let l = call(
        &mut c,
        "nvmf_subsystem_get_listeners",
        json!({"nqn": CNODE1}),
    )
    .unwrap();
    let addrs: Vec<(Value, Value, Value)> = l
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let a = &x["address"];
            (
                a["trtype"].clone(),
                a["adrfam"].clone(),
                a["traddr"].clone(),
            )
        })
        .collect();
    assert_eq!(
        addrs,
        vec![
            (json!("TCP"), json!("IPv4"), json!("127.0.0.1")),
            (json!("RDMA"), json!("IPv4"), json!("192.168.100.8")),
            (json!("RDMA"), json!("IPv6"), json!("fd00::8")),
        ]
    );
    let d = call(
        &mut c,
        "nvmf_subsystem_get_listeners",
        json!({"nqn": DISCOVERY_NQN}),
    )
    .unwrap();
    assert_eq!(d[0]["address"]["trtype"], "RDMA");
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": CNODE1, "secure_channel": true, "listen_address": {"trtype": "rdma", "traddr": "10.0.0.1", "trsvcid": "4420"}}),
        INVALID_PARAMS,
        "TLS over NVMe/TCP",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": CNODE1, "listen_address": {"trtype": "rdma", "traddr": "192.168.100.8", "trsvcid": "4420"}}),
        INVALID_PARAMS,
        "already listens",
    );

    // save_config → load_config elsewhere → the same document.
    let saved = call(&mut c, "save_config", Value::Null).unwrap();
    let h3 = Harness::new();
    let mut c3 = h3.client();
    call(&mut c3, "load_config", saved.clone()).unwrap();
    assert_eq!(call(&mut c3, "save_config", Value::Null).unwrap(), saved);
    // The same model (what was ignored on the way in is not saved).
    let mut want = h.service.config();
    want.ignored_params.clear();
    assert_eq!(h3.service.config(), want);

    // Removing an RDMA listener.
    assert_eq!(
        call(
            &mut c,
            "nvmf_subsystem_remove_listener",
            json!({"nqn": CNODE1, "listen_address": {"trtype": "RDMA", "traddr": "fd00::8", "trsvcid": "4420"}})
        )
        .unwrap(),
        json!(true)
    );
    assert_eq!(
        h.service
            .config()
            .subsystem(CNODE1)
            .unwrap()
            .listeners
            .len(),
        2
    );
}

#[test]
fn requests_validated_like_spdk() {
    let h = Harness::new();
    let mut s = h.raw();
    // jsonrpc must be "2.0"; method a string; id string/number/null; params object/array.
    for (req, needle) in [
        (
            r#"{"jsonrpc":"1.0","method":"spdk_get_version","id":1}"#,
            "jsonrpc",
        ),
        (r#"{"jsonrpc":"2.0","method":5,"id":1}"#, "method"),
        (r#"{"jsonrpc":"2.0","id":1}"#, "method"),
        (
            r#"{"jsonrpc":"2.0","method":"spdk_get_version","id":[1]}"#,
            "id",
        ),
        (
            r#"{"jsonrpc":"2.0","method":"spdk_get_version","id":1,"params":3}"#,
            "params",
        ),
        (
            r#"{"jsonrpc":"2.0","method":"spdk_get_version","id":1,"extra":3}"#,
            "extra",
        ),
        ("42", "object"),
        ("[]", "empty batch"),
    ] {
        send(&mut s, req.as_bytes());
        let r = read_values(&mut s, 1).remove(0);
        assert_eq!(r["error"]["code"], INVALID_REQUEST, "{req}: {r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains(needle),
            "{req}: {r}"
        );
        assert_eq!(r["id"], Value::Null);
    }
    // Params as an array: valid request, invalid params for these methods.
    send(
        &mut s,
        br#"{"jsonrpc":"2.0","method":"bdev_get_bdevs","id":"a","params":["x"]}"#,
    );
    let r = read_values(&mut s, 1).remove(0);
    assert_eq!(r["error"]["code"], INVALID_PARAMS);
    assert_eq!(r["id"], "a");
    // A notification (no id) gets no response; the next request does.
    send(
        &mut s,
        br#"{"jsonrpc":"2.0","method":"bdev_malloc_create","params":{"name":"N","num_blocks":8,"block_size":512}}{"jsonrpc":"2.0","method":"bdev_get_bdevs","id":null}"#,
    );
    let r = read_values(&mut s, 1).remove(0);
    assert_eq!(r["id"], Value::Null);
    assert_eq!(r["result"][0]["name"], "N");
    // Batch: one array response, notifications left out.
    send(
        &mut s,
        br#"[{"jsonrpc":"2.0","method":"spdk_get_version","id":1},{"jsonrpc":"2.0","method":"nope","id":2},{"jsonrpc":"2.0","method":"spdk_get_version"},7]"#,
    );
    let r = read_values(&mut s, 1).remove(0);
    let arr = r.as_array().unwrap();
    assert_eq!(arr.len(), 3);
    assert_eq!(arr[0]["id"], 1);
    assert_eq!(arr[1]["error"]["code"], METHOD_NOT_FOUND);
    assert_eq!(arr[2]["error"]["code"], INVALID_REQUEST);
}

/// ANA over RPC: reporting, groups, per-listener states, their errors, what
/// the live target is told, and that the state file keeps them.
#[test]
fn ana_states_and_groups() {
    let h = Harness::with(nvmf_config::TargetConfig::default(), true);
    let mut c = h.client();
    let nqn = "nqn.2016-06.io.spdk:ana";
    let addr = |port: &str| json!({"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": port});
    for (m, p) in [
        (
            "bdev_malloc_create",
            json!({"name": "M0", "num_blocks": 64, "block_size": 512}),
        ),
        (
            "bdev_malloc_create",
            json!({"name": "M1", "num_blocks": 64, "block_size": 512}),
        ),
        ("nvmf_create_transport", json!({"trtype": "TCP"})),
        (
            "nvmf_create_subsystem",
            json!({"nqn": nqn, "ana_reporting": true, "max_namespaces": 2, "min_cntlid": 100, "max_cntlid": 199}),
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": nqn, "namespace": {"bdev_name": "M0"}}),
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": nqn, "namespace": {"bdev_name": "M1", "anagrpid": 1}}),
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": nqn, "listen_address": addr("4420")}),
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": nqn, "listen_address": addr("4421"), "ana_state": "non_optimized"}),
        ),
    ] {
        call(&mut c, m, p.clone()).unwrap_or_else(|e| panic!("{m} {p}: {}", e.message));
    }
    h.live.take_changes();
    let states = |c: &mut RpcClient| -> Vec<Vec<String>> {
        let l = call(c, "nvmf_subsystem_get_listeners", json!({"nqn": nqn})).unwrap();
        l.as_array()
            .unwrap()
            .iter()
            .map(|x| {
                x["ana_states"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| g["ana_state"].as_str().unwrap().to_string())
                    .collect()
            })
            .collect()
    };
    assert_eq!(
        states(&mut c),
        vec![
            vec!["optimized", "optimized"],
            vec!["non_optimized", "non_optimized"]
        ]
    );
    call(
        &mut c,
        "nvmf_subsystem_listener_set_ana_state",
        json!({"nqn": nqn, "listen_address": addr("4420"), "ana_state": "inaccessible", "anagrpid": 2}),
    )
    .unwrap();
    call(
        &mut c,
        "nvmf_subsystem_listener_set_ana_state",
        json!({"nqn": nqn, "listen_address": addr("4421"), "ana_state": "optimized"}),
    )
    .unwrap();
    assert_eq!(
        states(&mut c),
        vec![
            vec!["optimized", "inaccessible"],
            vec!["optimized", "optimized"]
        ]
    );
    call(
        &mut c,
        "nvmf_subsystem_set_ns_ana_group",
        json!({"nqn": nqn, "nsid": 2, "anagrpid": 2}),
    )
    .unwrap();
    assert_eq!(
        h.live.take_changes(),
        vec![Change::AnaChange { nqn: nqn.into() }; 3]
    );
    let subs = call(&mut c, "nvmf_get_subsystems", json!({"nqn": nqn})).unwrap();
    assert_eq!(subs[0]["namespaces"][1]["anagrpid"], json!(2));
    assert_eq!(subs[0]["ana_reporting"], json!(true));
    assert_eq!(
        (subs[0]["min_cntlid"].clone(), subs[0]["max_cntlid"].clone()),
        (json!(100), json!(199))
    );

    // errors: unknown group, bad state, unknown listener, unknown namespace
    for (p, needle) in [
        (
            json!({"nqn": nqn, "listen_address": addr("4420"), "ana_state": "optimized", "anagrpid": 3}),
            "outside 1..=2",
        ),
        (
            json!({"nqn": nqn, "listen_address": addr("4420"), "ana_state": "half_optimized"}),
            "not an ANA state",
        ),
        (
            json!({"nqn": nqn, "listen_address": addr("4999"), "ana_state": "optimized"}),
            "no listener",
        ),
        (
            json!({"nqn": nqn, "ana_state": "optimized"}),
            "listen_address",
        ),
    ] {
        fails(
            &h,
            &mut c,
            "nvmf_subsystem_listener_set_ana_state",
            p,
            INVALID_PARAMS,
            needle,
        );
    }
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_set_ns_ana_group",
        json!({"nqn": nqn, "nsid": 7, "anagrpid": 1}),
        INVALID_PARAMS,
        "no namespace 7",
    );
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_set_ns_ana_group",
        json!({"nqn": nqn, "nsid": 1, "anagrpid": 9}),
        INVALID_PARAMS,
        "outside 1..=2",
    );

    // the state file has it all: a restart starts where we left off
    let saved = nvmf_rpc::StateFile::new(h.state_path())
        .load()
        .unwrap()
        .unwrap();
    assert_eq!(saved, h.service.config());
    let s = saved.subsystem(nqn).unwrap();
    assert_eq!(s.namespace(2).unwrap().anagrpid, 2);
    let l0 = s.listeners[0].clone();
    assert_eq!(s.ana_state(&l0, 2), nvmf_config::AnaState::Inaccessible);

    // a removed listener forgets its states (as SPDK: re-added = optimized)
    call(
        &mut c,
        "nvmf_subsystem_remove_listener",
        json!({"nqn": nqn, "listen_address": addr("4420")}),
    )
    .unwrap();
    call(
        &mut c,
        "nvmf_subsystem_add_listener",
        json!({"nqn": nqn, "listen_address": addr("4420")}),
    )
    .unwrap();
    assert_eq!(
        states(&mut c),
        vec![
            vec!["optimized", "optimized"],
            vec!["optimized", "optimized"]
        ]
    );
}

#[test]
fn keyring_and_dhchap_methods() {
    use std::os::unix::fs::PermissionsExt;
    let h = Harness::new();
    let mut c = h.client();
    quickstart(&mut c);
    let host = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
    let secret = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    let file = |name: &str, mode: u32| {
        let p = h.dir.path().join(name);
        std::fs::write(&p, secret).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p.to_string_lossy().into_owned()
    };
    let (k0, loose) = (file("key0", 0o600), file("loose", 0o640));
    fails(
        &h,
        &mut c,
        "keyring_file_add_key",
        json!({"name": "key0", "path": loose}),
        INVALID_PARAMS,
        "accessible by group or others",
    );
    call(
        &mut c,
        "keyring_file_add_key",
        json!({"name": "key0", "path": k0}),
    )
    .unwrap();
    assert!(matches!(h.live.changes().last(), Some(Change::AuthKeys)));
    let keys = call(&mut c, "keyring_get_keys", Value::Null).unwrap();
    assert_eq!(keys[0]["name"], "key0");
    assert_eq!(keys[0]["path"], k0.as_str());
    assert!(!keys.to_string().contains("DHHC-1"), "{keys}");
    fails(
        &h,
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": CNODE1, "host": host, "dhchap_key": "nokey"}),
        INVALID_PARAMS,
        "no key named \"nokey\"",
    );
    call(
        &mut c,
        "nvmf_subsystem_add_host",
        json!({"nqn": CNODE1, "host": host, "dhchap_key": "key0"}),
    )
    .unwrap();
    assert_eq!(keys_refcnt(&mut c), 1);
    fails(
        &h,
        &mut c,
        "keyring_file_remove_key",
        json!({"name": "key0"}),
        INVALID_PARAMS,
        "in use",
    );
    call(
        &mut c,
        "nvmf_set_config",
        json!({"dhchap_digests": ["sha256", "sha512"], "dhchap_dhgroups": ["null"]}),
    )
    .unwrap();
    assert!(matches!(h.live.changes().last(), Some(Change::AuthKeys)));
    fails(
        &h,
        &mut c,
        "nvmf_set_config",
        json!({"dhchap_dhgroups": ["ffdhe1024"]}),
        INVALID_PARAMS,
        "ffdhe1024",
    );
    let saved = call(&mut c, "save_config", Value::Null)
        .unwrap()
        .to_string();
    assert!(saved.contains("\"dhchap_key\":\"key0\"") && saved.contains(&k0));
    assert!(!saved.contains("DHHC-1"), "{saved}");
    let kr = call(&mut c, "framework_get_config", json!({"name": "keyring"})).unwrap();
    assert_eq!(kr[0]["method"], "keyring_file_add_key");
    // Keys off for the host, then the key can go.
    call(
        &mut c,
        "nvmf_subsystem_set_keys",
        json!({"nqn": CNODE1, "host": host}),
    )
    .unwrap();
    assert_eq!(keys_refcnt(&mut c), 0);
    call(&mut c, "keyring_file_remove_key", json!({"name": "key0"})).unwrap();
    assert_eq!(
        call(&mut c, "keyring_get_keys", Value::Null).unwrap(),
        json!([])
    );
}

fn keys_refcnt(c: &mut RpcClient) -> u64 {
    call(c, "keyring_get_keys", Value::Null).unwrap()[0]["refcnt"]
        .as_u64()
        .unwrap()
}

#[test]
fn ns_visibility_methods() {
    let h = Harness::new();
    let mut c = h.client();
    quickstart(&mut c);
    let host = "nqn.2016-06.io.spdk:host1";
    call(
        &mut c,
        "bdev_malloc_create",
        json!({"name": "Hidden0", "num_blocks": 64, "block_size": 512}),
    )
    .unwrap();
    let nsid = call(
        &mut c,
        "nvmf_subsystem_add_ns",
        json!({"nqn": CNODE1, "namespace": {"bdev_name": "Hidden0", "no_auto_visible": true}}),
    )
    .unwrap();
    assert_eq!(nsid, json!(2));
    h.live.take_changes();
    assert_eq!(
        call(
            &mut c,
            "nvmf_ns_add_host",
            json!({"nqn": CNODE1, "nsid": 2, "host": host})
        )
        .unwrap(),
        json!(true)
    );
    assert_eq!(
        h.live.take_changes(),
        vec![Change::NsVisibility {
            nqn: CNODE1.into(),
            nsid: 2
        }]
    );
    assert_eq!(
        h.service.config().subsystems[0].ns_visibility[&2],
        vec![host]
    );
    // save_config as SPDK writes it.
    let saved = call(&mut c, "save_config", Value::Null)
        .unwrap()
        .to_string();
    assert!(saved.contains(r#""no_auto_visible":true"#), "{saved}");
    assert!(
        saved.contains(&format!(
            r#"{{"method":"nvmf_ns_add_host","params":{{"host":"{host}","nqn":"{CNODE1}","nsid":2}}}}"#
        )),
        "{saved}"
    );

    // Errors: SPDK's code (invalid params) and a message naming the problem.
    fails(
        &h,
        &mut c,
        "nvmf_ns_add_host",
        json!({"nqn": CNODE1, "nsid": 1, "host": host}),
        INVALID_PARAMS,
        "visible to every host",
    );
    fails(
        &h,
        &mut c,
        "nvmf_ns_remove_host",
        json!({"nqn": CNODE1, "nsid": 9, "host": host}),
        INVALID_PARAMS,
        "no namespace 9",
    );
    fails(
        &h,
        &mut c,
        "nvmf_ns_add_host",
        json!({"nqn": "nqn.2016-06.io.spdk:none", "nsid": 2, "host": host}),
        INVALID_PARAMS,
        "no subsystem",
    );

    call(
        &mut c,
        "nvmf_ns_remove_host",
        json!({"nqn": CNODE1, "nsid": 2, "host": host}),
    )
    .unwrap();
    assert!(h.service.config().subsystems[0].ns_visibility[&2].is_empty());
    // Removing the namespace drops its rule.
    call(
        &mut c,
        "nvmf_subsystem_remove_ns",
        json!({"nqn": CNODE1, "nsid": 2}),
    )
    .unwrap();
    assert!(h.service.config().subsystems[0].ns_visibility.is_empty());
}
