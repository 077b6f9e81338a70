//! Owns the tests of the NVMe/RDMA parts of the configuration model: the
//! `RDMA` transport type and SPDK's RDMA defaults, the RDMA-only options
//! (stored and written back), their validation, RDMA listeners (IPv4, IPv6,
//! default port, next to TCP listeners on the same address) and the load →
//! save → load round trip of all of it.

use nvmf_config::{
    AddressFamily, ConfigError, ListenerConfig, RdmaOptions, TargetConfig, TransportConfig,
    TransportType,
};
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

/// A document: Malloc0, the given transports, subsystem NQN with Malloc0,
/// then `extra` nvmf entries.
fn doc(transports: &[Value], extra: &[Value]) -> String {
    let mut nvmf: Vec<Value> = transports
        .iter()
        .map(|p| json!({"method":"nvmf_create_transport","params":p}))
        .collect();
    nvmf.push(json!({"method":"nvmf_create_subsystem","params":{"nqn":NQN,"allow_any_host":true}}));
    nvmf.push(json!({"method":"nvmf_subsystem_add_ns","params":{"nqn":NQN,"namespace":{"bdev_name":"Malloc0"}}}));
    nvmf.extend_from_slice(extra);
    json!({"subsystems":[
        {"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":64,"block_size":512}}]},
        {"subsystem":"nvmf","config":nvmf}
    ]})
    .to_string()
}

fn load(transports: &[Value], extra: &[Value]) -> Result<TargetConfig, ConfigError> {
    TargetConfig::from_json_str(&doc(transports, extra))
}

fn listener(nqn: &str, trtype: &str, traddr: &str, trsvcid: Option<&str>) -> Value {
    let mut a = json!({"trtype": trtype, "traddr": traddr});
    if let Some(s) = trsvcid {
        a["trsvcid"] = json!(s);
    }
    json!({"method":"nvmf_subsystem_add_listener","params":{"nqn":nqn,"listen_address":a}})
}

/// save → load gives the same model, and saving that gives the same text.
#[track_caller]
fn round_trip(c: &TargetConfig) -> String {
    let text = c.to_json_string_pretty();
    let again = TargetConfig::from_json_str(&text).expect("saved config loads");
    assert_eq!(&again, c);
    assert_eq!(again.to_json_string_pretty(), text);
    text
}

#[track_caller]
fn transport_err(params: Value, param: &str, problem: &str) {
    let e = load(&[params], &[]).expect_err("must be refused");
    let msg = e.to_string();
    assert_eq!(e.method(), Some("nvmf_create_transport"), "{msg}");
    assert_eq!(e.param(), Some(param), "{msg}");
    assert!(
        msg.contains(problem),
        "{msg:?} does not mention {problem:?}"
    );
}

#[test]
fn transport_type_parses_spdk_spellings() {
    for s in ["RDMA", "rdma", "Rdma"] {
        assert_eq!(TransportType::parse(s), Some(TransportType::Rdma), "{s}");
    }
    assert_eq!(TransportType::Rdma.as_str(), "RDMA");
    assert_eq!(TransportType::Rdma.to_string(), "RDMA");
    for s in ["VFIOUSER", "FC", "PCIe", "rdma ", ""] {
        assert_eq!(TransportType::parse(s), None, "{s}");
    }
}

#[test]
fn rdma_defaults_are_spdks() {
    let t = TransportConfig::rdma_default();
    assert_eq!(t.trtype, TransportType::Rdma);
    assert_eq!(t.max_queue_depth, 128);
    assert_eq!(t.max_io_qpairs_per_ctrlr, 127);
    assert_eq!(t.in_capsule_data_size, 4096);
    assert_eq!(t.max_io_size, 131_072);
    assert_eq!(t.io_unit_size, 8192);
    assert_eq!(t.max_aq_depth, 128);
    assert_eq!(t.num_shared_buffers, 4095);
    assert!(!t.c2h_success);
    assert_eq!(
        t.rdma,
        Some(RdmaOptions {
            max_srq_depth: 4096,
            no_srq: false,
            num_cqe: 4096,
            acceptor_backlog: 100,
            no_wr_batching: false,
        })
    );
    assert_eq!(TransportConfig::default_for(TransportType::Rdma), t);
    assert_eq!(
        TransportConfig::default_for(TransportType::Tcp),
        TransportConfig::tcp_default()
    );
    assert_eq!(TransportConfig::tcp_default().rdma, None);

    // `nvmf_create_transport -t RDMA` alone gives exactly the defaults.
    let c = load(&[json!({"trtype":"rdma"})], &[]).unwrap();
    assert_eq!(c.transports, vec![t]);
    assert!(c.ignored_params.is_empty(), "{:?}", c.ignored_params);
}

#[test]
fn rdma_options_are_stored_and_written_back() {
    let params = json!({
        "trtype": "RDMA",
        "max_queue_depth": 256,
        "max_io_qpairs_per_ctrlr": 16,
        "in_capsule_data_size": 8192,
        "max_io_size": 131072,
        "io_unit_size": 8192,
        "max_aq_depth": 64,
        "num_shared_buffers": 8191,
        "max_srq_depth": 1024,
        "no_srq": true,
        "num_cqe": 2048,
        "acceptor_backlog": 64,
        "no_wr_batching": true,
    });
    let c = load(std::slice::from_ref(&params), &[]).unwrap();
    let t = c.transport(TransportType::Rdma).unwrap();
    assert_eq!(
        (
            t.max_queue_depth,
            t.max_io_qpairs_per_ctrlr,
            t.in_capsule_data_size,
            t.io_unit_size,
            t.max_aq_depth,
            t.num_shared_buffers
        ),
        (256, 16, 8192, 8192, 64, 8191)
    );
    assert_eq!(
        t.rdma,
        Some(RdmaOptions {
            max_srq_depth: 1024,
            no_srq: true,
            num_cqe: 2048,
            acceptor_backlog: 64,
            no_wr_batching: true,
        })
    );
    assert!(c.ignored_params.is_empty(), "{:?}", c.ignored_params);
    // Written back with SPDK's names, without TCP's c2h_success.
    let saved = round_trip(&c);
    let v: Value = serde_json::from_str(&saved).unwrap();
    let entry = v["subsystems"][1]["config"][0].clone();
    assert_eq!(entry["method"], "nvmf_create_transport");
    assert_eq!(entry["params"], params);
    assert_eq!(t.to_json_params(), params);
}

#[test]
fn num_cqe_is_written_only_when_it_matters() {
    // As SPDK's save_config: with SRQ (the default) num_cqe is unused.
    let c = load(&[json!({"trtype":"RDMA"})], &[]).unwrap();
    let p = c.transports[0].to_json_params();
    assert!(p.get("num_cqe").is_none(), "{p}");
    assert_eq!(p["no_srq"], false);
    assert!(p.get("c2h_success").is_none(), "{p}");
    round_trip(&c);
    // A non-default value survives even with SRQ.
    let c = load(&[json!({"trtype":"RDMA","num_cqe":100})], &[]).unwrap();
    assert_eq!(c.transports[0].to_json_params()["num_cqe"], 100);
    round_trip(&c);
    // Without SRQ it is always written.
    let c = load(&[json!({"trtype":"RDMA","no_srq":true})], &[]).unwrap();
    assert_eq!(c.transports[0].to_json_params()["num_cqe"], 4096);
    round_trip(&c);
}

#[test]
fn what_spdk_writes_for_an_rdma_transport_loads() {
    // The shape of an SPDK save_config RDMA transport entry, including the
    // generic options nvmfd does not act on and rpc.py's c2h_success.
    let params = json!({
        "trtype": "RDMA",
        "max_queue_depth": 128,
        "max_io_qpairs_per_ctrlr": 127,
        "in_capsule_data_size": 4096,
        "max_io_size": 131072,
        "io_unit_size": 8192,
        "max_aq_depth": 128,
        "num_shared_buffers": 4095,
        "buf_cache_size": 4294967295u32,
        "dif_insert_or_strip": false,
        "zcopy": false,
        "c2h_success": true,
        "abort_timeout_sec": 1,
        "ack_timeout": 0,
        "data_wr_pool_size": 4095,
        "max_srq_depth": 4096,
        "no_srq": false,
        "acceptor_backlog": 100,
        "no_wr_batching": false,
    });
    let c = load(&[params], &[]).unwrap();
    assert_eq!(c.transports, vec![TransportConfig::rdma_default()]);
    for p in [
        "nvmf_create_transport.c2h_success",
        "nvmf_create_transport.buf_cache_size",
        "nvmf_create_transport.data_wr_pool_size",
    ] {
        assert!(c.ignored_params.contains(&p.to_string()), "{p}");
        assert!(nvmf_config::ignored_param_names().contains(&p.to_string()));
    }
}

#[test]
fn rdma_only_options_on_tcp_are_ignored_as_before() {
    let c = load(
        &[json!({"trtype":"TCP","no_srq":false,"max_srq_depth":64,"acceptor_backlog":5})],
        &[],
    )
    .unwrap();
    assert_eq!(c.transports, vec![TransportConfig::tcp_default()]);
    assert_eq!(
        c.ignored_params,
        vec![
            "nvmf_create_transport.max_srq_depth".to_string(),
            "nvmf_create_transport.no_srq".to_string(),
            "nvmf_create_transport.acceptor_backlog".to_string(),
        ]
    );
    // And TCP's c2h_success still works.
    let c = load(&[json!({"trtype":"TCP","c2h_success":false})], &[]).unwrap();
    assert!(!c.transports[0].c2h_success);
}

#[test]
fn rdma_transport_validation() {
    let r = |extra: Value| {
        let mut p = json!({"trtype": "RDMA"});
        for (k, v) in extra.as_object().unwrap() {
            p[k] = v.clone();
        }
        p
    };
    transport_err(
        r(json!({"c2h_success": false})),
        "c2h_success",
        "NVMe/TCP option",
    );
    transport_err(
        r(json!({"in_capsule_data_size": 32768})),
        "in_capsule_data_size",
        "larger than 16384",
    );
    transport_err(
        r(json!({"in_capsule_data_size": 4100})),
        "in_capsule_data_size",
        "not a multiple of 16",
    );
    transport_err(
        r(json!({"in_capsule_data_size": 8192, "max_io_size": 4096})),
        "in_capsule_data_size",
        "larger than max_io_size",
    );
    transport_err(
        r(json!({"io_unit_size": 4096})),
        "io_unit_size",
        "at most 16 buffers (use io_unit_size >= 8192)",
    );
    transport_err(
        r(json!({"max_io_size": 1048576})),
        "io_unit_size",
        "use io_unit_size >= 65536",
    );
    transport_err(r(json!({"max_aq_depth": 16})), "max_aq_depth", "below 32");
    transport_err(
        r(json!({"num_shared_buffers": 31})),
        "num_shared_buffers",
        "below 32",
    );
    transport_err(
        r(json!({"max_srq_depth": 0})),
        "max_srq_depth",
        "no entries",
    );
    transport_err(r(json!({"num_cqe": 0})), "num_cqe", "minimum of 1");
    transport_err(r(json!({"num_cqe": -5})), "num_cqe", "minimum of 1");
    transport_err(
        r(json!({"acceptor_backlog": 0})),
        "acceptor_backlog",
        "minimum of 1",
    );
    transport_err(r(json!({"no_srq": "yes"})), "no_srq", "expected a boolean");
    transport_err(r(json!({"bogus": 1})), "bogus", "unknown parameter");
    // Limits that are fine: the edges.
    load(
        &[r(
            json!({"in_capsule_data_size": 16384, "max_aq_depth": 32, "num_shared_buffers": 32,
            "io_unit_size": 65536, "max_io_size": 1048576, "acceptor_backlog": 1, "num_cqe": 1,
            "max_srq_depth": 1}),
        )],
        &[],
    )
    .unwrap();
    let c = load(&[r(json!({"in_capsule_data_size": 0}))], &[]).unwrap();
    assert_eq!(c.transports[0].in_capsule_data_size, 0);
    // One RDMA transport only; next to a TCP one is fine.
    let e = load(&[json!({"trtype":"RDMA"}), json!({"trtype":"rdma"})], &[]).unwrap_err();
    assert!(
        e.to_string().contains("a RDMA transport already exists"),
        "{e}"
    );
    let c = load(&[json!({"trtype":"TCP"}), json!({"trtype":"RDMA"})], &[]).unwrap();
    assert_eq!(c.transports.len(), 2);
    round_trip(&c);
}

#[test]
fn rdma_listeners() {
    let c = load(
        &[json!({"trtype":"TCP"}), json!({"trtype":"RDMA"})],
        &[
            listener(NQN, "rdma", "192.168.100.8", Some("4420")),
            listener(NQN, "RDMA", "fd00::8", None),
            // TCP on the same address and port: a different listener.
            listener(NQN, "tcp", "192.168.100.8", Some("4420")),
            listener(
                "nqn.2014-08.org.nvmexpress.discovery",
                "rdma",
                "192.168.100.8",
                None,
            ),
        ],
    )
    .unwrap();
    let s = c.subsystem(NQN).unwrap();
    assert_eq!(
        s.listeners,
        vec![
            ListenerConfig {
                trtype: TransportType::Rdma,
                adrfam: AddressFamily::Ipv4,
                traddr: "192.168.100.8".into(),
                trsvcid: "4420".into(),
            },
            ListenerConfig {
                trtype: TransportType::Rdma,
                adrfam: AddressFamily::Ipv6,
                traddr: "fd00::8".into(),
                trsvcid: "4420".into(),
            },
            ListenerConfig {
                trtype: TransportType::Tcp,
                adrfam: AddressFamily::Ipv4,
                traddr: "192.168.100.8".into(),
                trsvcid: "4420".into(),
            },
        ]
    );
    assert_eq!(c.discovery_listeners[0].trtype, TransportType::Rdma);
    assert_eq!(c.discovery_listeners[0].trsvcid, "4420");
    assert_eq!(c.listen_addresses().len(), 3);
    let saved = round_trip(&c);
    assert!(saved.contains("\"trtype\": \"RDMA\""), "{saved}");

    // Adding the same RDMA listener twice is refused; adfram must match.
    let e = load(
        &[json!({"trtype":"RDMA"})],
        &[
            listener(NQN, "rdma", "10.0.0.1", None),
            listener(NQN, "rdma", "10.0.0.1", Some("4420")),
        ],
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("already listens on 10.0.0.1:4420"),
        "{e}"
    );
    let bad_fam = json!({"method":"nvmf_subsystem_add_listener","params":{"nqn":NQN,
        "listen_address":{"trtype":"RDMA","adrfam":"IPv6","traddr":"10.0.0.1","trsvcid":"4420"}}});
    let e = load(&[json!({"trtype":"RDMA"})], &[bad_fam]).unwrap_err();
    assert!(e.to_string().contains("is not an IPv6 address"), "{e}");
    let bad_port = listener(NQN, "rdma", "10.0.0.1", Some("0"));
    let e = load(&[json!({"trtype":"RDMA"})], &[bad_port]).unwrap_err();
    assert_eq!(e.param(), Some("listen_address.trsvcid"), "{e}");
    // TCP listeners still need their port.
    let e = load(
        &[json!({"trtype":"TCP"})],
        &[listener(NQN, "tcp", "10.0.0.1", None)],
    )
    .unwrap_err();
    assert!(e.to_string().contains("missing required parameter"), "{e}");
}

#[test]
fn rdma_listener_needs_the_transport_and_no_tls() {
    let e = load(
        &[json!({"trtype":"TCP"})],
        &[listener(NQN, "RDMA", "10.0.0.1", Some("4420"))],
    )
    .unwrap_err();
    assert_eq!(e.param(), Some("listen_address.trtype"), "{e}");
    assert!(
        e.to_string()
            .contains("no RDMA transport (nvmf_create_transport must come first)"),
        "{e}"
    );
    let mut secure = listener(NQN, "RDMA", "10.0.0.1", Some("4420"));
    secure["params"]["secure_channel"] = json!(true);
    let e = load(&[json!({"trtype":"RDMA"})], &[secure]).unwrap_err();
    assert_eq!(e.param(), Some("secure_channel"), "{e}");
    assert!(e.to_string().contains("TLS over NVMe/TCP"), "{e}");
}

#[test]
fn rdma_listener_next_to_a_tls_listener() {
    // A TCP listener that requires TLS and an RDMA listener on the same
    // address and port share nothing: both are accepted, the RDMA one is
    // not secure, and the TCP address still is.
    // (Another subsystem's TCP listener: one subsystem may mix anyway.)
    let disc = "nqn.2014-08.org.nvmexpress.discovery";
    let mut tls = listener(disc, "TCP", "10.0.0.1", Some("4420"));
    tls["params"]["secure_channel"] = json!(true);
    let c = load(
        &[json!({"trtype":"TCP"}), json!({"trtype":"RDMA"})],
        &[tls.clone(), listener(NQN, "RDMA", "10.0.0.1", Some("4420"))],
    )
    .unwrap();
    assert_eq!(c.secure_discovery_listeners.len(), 1);
    let s = c.subsystem(NQN).unwrap();
    assert_eq!(s.listeners.len(), 1);
    assert!(s.secure_listeners.is_empty());
    assert!(c.listener_secure("10.0.0.1", "4420"));
    round_trip(&c);
    // The other order too: a clear RDMA listener does not stop TLS on TCP.
    let c = load(
        &[json!({"trtype":"TCP"}), json!({"trtype":"RDMA"})],
        &[listener(NQN, "RDMA", "10.0.0.1", Some("4420")), tls],
    )
    .unwrap();
    assert!(c.listener_secure("10.0.0.1", "4420"));
    // A clear TCP listener of another subsystem there still conflicts.
    let e = load(
        &[json!({"trtype":"TCP"}), json!({"trtype":"RDMA"})],
        &[listener(NQN, "TCP", "10.0.0.1", Some("4420")), {
            let mut t = listener(disc, "TCP", "10.0.0.1", Some("4420"));
            t["params"]["secure_channel"] = json!(true);
            t
        }],
    )
    .unwrap_err();
    assert_eq!(e.param(), Some("secure_channel"), "{e}");
}
