//! Owns the tests that every invalid config is rejected with an error naming
//! the config entry, the SPDK method, the parameter and the problem.

use nvmf_config::{load_file, ConfigError, TargetConfig};
use serde_json::json;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

/// bdev section: Malloc0, Malloc1 then `bdev_extra`; nvmf section: TCP
/// transport, subsystem NQN, then `nvmf_extra`.
fn doc(bdev_extra: &[serde_json::Value], nvmf_extra: &[serde_json::Value]) -> String {
    let mut bdev = vec![
        json!({"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":64,"block_size":512}}),
        json!({"method":"bdev_malloc_create","params":{"name":"Malloc1","num_blocks":64,"block_size":512}}),
    ];
    bdev.extend_from_slice(bdev_extra);
    let mut nvmf = vec![
        json!({"method":"nvmf_create_transport","params":{"trtype":"TCP"}}),
        json!({"method":"nvmf_create_subsystem","params":{"nqn":NQN,"max_namespaces":4}}),
    ];
    nvmf.extend_from_slice(nvmf_extra);
    json!({"subsystems":[{"subsystem":"bdev","config":bdev},{"subsystem":"nvmf","config":nvmf}]})
        .to_string()
}

fn load(
    bdev_extra: &[serde_json::Value],
    nvmf_extra: &[serde_json::Value],
) -> Result<TargetConfig, ConfigError> {
    TargetConfig::from_json_str(&doc(bdev_extra, nvmf_extra))
}

fn bdev_err(extra: serde_json::Value) -> ConfigError {
    load(&[extra], &[]).expect_err("config must be rejected")
}

fn nvmf_err(extra: &[serde_json::Value]) -> ConfigError {
    load(&[], extra).expect_err("config must be rejected")
}

fn add_ns(ns: serde_json::Value) -> serde_json::Value {
    json!({"method":"nvmf_subsystem_add_ns","params":{"nqn":NQN,"namespace":ns}})
}

/// Asserts method, parameter, that the message contains `problem`, and the
/// Display form `method: parameter "p": ... (config entry LOC)`.
#[track_caller]
fn check(e: &ConfigError, method: &str, param: Option<&str>, problem: &str, entry: &str) {
    let msg = e.to_string();
    assert_eq!(e.method(), Some(method), "{msg}");
    assert_eq!(e.param(), param, "{msg}");
    assert_eq!(e.entry(), Some(entry), "{msg}");
    let head = match param {
        Some(p) => format!("{method}: parameter \"{p}\": "),
        None => format!("{method}: "),
    };
    assert!(
        msg.starts_with(&head),
        "{msg:?} does not start with {head:?}"
    );
    assert!(
        msg.contains(problem),
        "{msg:?} does not mention {problem:?}"
    );
    assert!(msg.ends_with(&format!("(config entry {entry})")), "{msg}");
}

const B2: &str = "subsystems[0].config[2]";
const N2: &str = "subsystems[1].config[2]";
const N3: &str = "subsystems[1].config[3]";

#[test]
fn base_document_is_valid() {
    load(&[], &[]).unwrap();
}

#[test]
fn unknown_bdev_in_add_ns_matches_documented_message() {
    let e = nvmf_err(&[add_ns(json!({"bdev_name":"Malloc9"}))]);
    assert_eq!(
        e.to_string(),
        format!("nvmf_subsystem_add_ns: parameter \"namespace.bdev_name\": no bdev named \"Malloc9\" (config entry {N2})")
    );
}

#[test]
fn malformed_json() {
    let e =
        TargetConfig::from_json_str("{\"subsystems\": [ {\"subsystem\": \"bdev\", }").unwrap_err();
    assert!(matches!(e, ConfigError::Json { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("malformed JSON") && msg.contains("line 1"),
        "{msg}"
    );
}

#[test]
fn bad_document_shape() {
    for (text, problem) in [
        ("[]", "must be an object"),
        ("{}", "missing \"subsystems\""),
        ("{\"subsystems\": {}}", "must be an array"),
        ("{\"subsystems\": [], \"extra\": 1}", "unknown top-level key"),
        ("{\"subsystems\": [{\"config\": []}]}", "without a \"subsystem\""),
        ("{\"subsystems\": [{\"subsystem\": \"bdev\", \"config\": {}}]}", "must be an array or null"),
        ("{\"subsystems\": [{\"subsystem\": \"bdev\", \"config\": [{\"params\": {}}]}]}", "without \"method\""),
        ("{\"subsystems\": [{\"subsystem\": \"bdev\", \"config\": [{\"method\": \"bdev_wait_for_examine\", \"x\": 1}]}]}", "unknown key \"x\""),
        ("{\"subsystems\": [{\"subsystem\": \"bdev\", \"config\": [5]}]}", "must be an object"),
    ] {
        let e = TargetConfig::from_json_str(text).expect_err(text);
        assert!(e.to_string().contains(problem), "{text}: {e}");
    }
}

#[test]
fn missing_required_parameter() {
    let e = bdev_err(json!({"method":"bdev_malloc_create","params":{"name":"M","block_size":512}}));
    check(
        &e,
        "bdev_malloc_create",
        Some("num_blocks"),
        "missing required parameter",
        B2,
    );
    let e =
        bdev_err(json!({"method":"bdev_null_create","params":{"num_blocks":8,"block_size":512}}));
    check(
        &e,
        "bdev_null_create",
        Some("name"),
        "missing required parameter",
        B2,
    );
    let e = nvmf_err(&[add_ns(json!({"nsid":1}))]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.bdev_name"),
        "missing required parameter",
        N2,
    );
    let e = nvmf_err(&[json!({"method":"nvmf_subsystem_add_ns","params":{"nqn":NQN}})]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace"),
        "missing required parameter",
        N2,
    );
    let e = nvmf_err(&[
        json!({"method":"nvmf_subsystem_add_listener","params":{"nqn":NQN,"listen_address":{"trtype":"TCP","traddr":"127.0.0.1"}}}),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_listener",
        Some("listen_address.trsvcid"),
        "missing required parameter",
        N2,
    );
    let e = nvmf_err(&[json!({"method":"nvmf_subsystem_allow_any_host","params":{"nqn":NQN}})]);
    check(
        &e,
        "nvmf_subsystem_allow_any_host",
        Some("allow_any_host"),
        "missing required parameter",
        N2,
    );
}

#[test]
fn wrong_type() {
    let e = bdev_err(
        json!({"method":"bdev_malloc_create","params":{"name":"M","num_blocks":8,"block_size":"512"}}),
    );
    check(
        &e,
        "bdev_malloc_create",
        Some("block_size"),
        "expected an unsigned 32-bit integer, got string \"512\"",
        B2,
    );
    let e = bdev_err(
        json!({"method":"bdev_malloc_create","params":{"name":"M","num_blocks":-8,"block_size":512}}),
    );
    check(
        &e,
        "bdev_malloc_create",
        Some("num_blocks"),
        "expected an unsigned 64-bit integer",
        B2,
    );
    let e = nvmf_err(&[
        json!({"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2016-06.io.spdk:x","allow_any_host":"yes"}}),
    ]);
    check(
        &e,
        "nvmf_create_subsystem",
        Some("allow_any_host"),
        "expected a boolean",
        N2,
    );
    let e = nvmf_err(&[add_ns(json!({"bdev_name":"Malloc0","nsid":1.5}))]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.nsid"),
        "expected an unsigned 32-bit integer",
        N2,
    );
    // ignored parameters are still type-checked
    let e = bdev_err(
        json!({"method":"bdev_malloc_create","params":{"name":"M","num_blocks":8,"block_size":512,"optimal_io_boundary":"x"}}),
    );
    check(
        &e,
        "bdev_malloc_create",
        Some("optimal_io_boundary"),
        "expected",
        B2,
    );
    let e = bdev_err(json!({"method":"bdev_malloc_create","params":[1]}));
    check(
        &e,
        "bdev_malloc_create",
        Some("params"),
        "expected an object",
        B2,
    );
}

#[test]
fn out_of_range_integer() {
    let text = doc(&[], &[]).replace(
        "\"trtype\":\"TCP\"",
        "\"trtype\":\"TCP\",\"max_queue_depth\":70000",
    );
    let e = TargetConfig::from_json_str(&text);
    let e = e.unwrap_err();
    check(
        &e,
        "nvmf_create_transport",
        Some("max_queue_depth"),
        "expected an unsigned 16-bit integer, got number 70000",
        "subsystems[1].config[0]",
    );
}

#[test]
fn unknown_parameter() {
    let text = doc(&[], &[]).replace("\"trtype\":\"TCP\"", "\"trtype\":\"TCP\",\"max_foo\":1");
    let e = TargetConfig::from_json_str(&text).unwrap_err();
    check(
        &e,
        "nvmf_create_transport",
        Some("max_foo"),
        "unknown parameter",
        "subsystems[1].config[0]",
    );
    let e = nvmf_err(&[add_ns(json!({"bdev_name":"Malloc0","colour":"red"}))]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.colour"),
        "unknown parameter",
        N2,
    );
    let e = bdev_err(
        json!({"method":"bdev_null_create","params":{"name":"N","num_blocks":8,"block_size":512,"optimal_io_boundary":0}}),
    );
    check(
        &e,
        "bdev_null_create",
        Some("optimal_io_boundary"),
        "unknown parameter",
        B2,
    );
}

#[test]
fn invalid_nqn() {
    for bad in [
        "nqn.2016-06.io.spdk",
        "iqn.2016-06.io.spdk:x",
        "nqn.2016-6.io.spdk:x",
        "nqn.2014-08.org.nvmexpress:uuid:1234",
    ] {
        let e = nvmf_err(&[json!({"method":"nvmf_create_subsystem","params":{"nqn":bad}})]);
        check(&e, "nvmf_create_subsystem", Some("nqn"), "NQN", N2);
    }
    let long = format!("nqn.2016-06.io.spdk:{}", "a".repeat(204));
    assert_eq!(long.len(), 224);
    let e = nvmf_err(&[json!({"method":"nvmf_create_subsystem","params":{"nqn":long}})]);
    check(
        &e,
        "nvmf_create_subsystem",
        Some("nqn"),
        "the limit is 223",
        N2,
    );
    let ok = format!("nqn.2016-06.io.spdk:{}", "a".repeat(203));
    load(
        &[],
        &[json!({"method":"nvmf_create_subsystem","params":{"nqn":ok}})],
    )
    .unwrap();
    let e = nvmf_err(&[
        json!({"method":"nvmf_subsystem_add_host","params":{"nqn":NQN,"host":"host1"}}),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_host",
        Some("host"),
        "must start with \"nqn.\"",
        N2,
    );
    let e = nvmf_err(&[
        json!({"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2014-08.org.nvmexpress.discovery"}}),
    ]);
    check(
        &e,
        "nvmf_create_subsystem",
        Some("nqn"),
        "discovery subsystem",
        N2,
    );
}

#[test]
fn duplicates() {
    let e = bdev_err(
        json!({"method":"bdev_null_create","params":{"name":"Malloc1","num_blocks":8,"block_size":512}}),
    );
    check(
        &e,
        "bdev_null_create",
        Some("name"),
        "a bdev named \"Malloc1\" already exists",
        B2,
    );
    let u = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
    let e = load(&[
        json!({"method":"bdev_null_create","params":{"name":"N0","num_blocks":8,"block_size":512,"uuid":u}}),
        json!({"method":"bdev_null_create","params":{"name":"N1","num_blocks":8,"block_size":512,"uuid":u}}),
    ], &[]).unwrap_err();
    check(
        &e,
        "bdev_null_create",
        Some("uuid"),
        "already used by bdev \"N0\"",
        "subsystems[0].config[3]",
    );
    let e = nvmf_err(&[json!({"method":"nvmf_create_subsystem","params":{"nqn":NQN}})]);
    check(
        &e,
        "nvmf_create_subsystem",
        Some("nqn"),
        "already exists",
        N2,
    );
    let e = nvmf_err(&[json!({"method":"nvmf_create_transport","params":{"trtype":"tcp"}})]);
    check(
        &e,
        "nvmf_create_transport",
        Some("trtype"),
        "a TCP transport already exists",
        N2,
    );
    let host = "nqn.2014-08.org.nvmexpress:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8";
    let e = nvmf_err(&[
        json!({"method":"nvmf_subsystem_add_host","params":{"nqn":NQN,"host":host}}),
        json!({"method":"nvmf_subsystem_add_host","params":{"nqn":NQN,"host":host}}),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_host",
        Some("host"),
        "already allowed",
        N3,
    );
    let l = json!({"method":"nvmf_subsystem_add_listener","params":{"nqn":NQN,"listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"4420"}}});
    let e = nvmf_err(&[l.clone(), l]);
    check(
        &e,
        "nvmf_subsystem_add_listener",
        Some("listen_address"),
        "already listens on 127.0.0.1:4420",
        N3,
    );
}

#[test]
fn duplicate_nsid_and_nsid_limits() {
    let e = nvmf_err(&[
        add_ns(json!({"bdev_name":"Malloc0","nsid":1})),
        add_ns(json!({"bdev_name":"Malloc1","nsid":1})),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.nsid"),
        "already has a namespace with NSID 1",
        N3,
    );
    let e = nvmf_err(&[add_ns(json!({"bdev_name":"Malloc0","nsid":5}))]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.nsid"),
        "larger than max_namespaces (4)",
        N2,
    );
    // max_namespaces 4: the fifth automatic NSID does not exist
    let bdevs: Vec<_> = (0..5)
        .map(|i| json!({"method":"bdev_null_create","params":{"name":format!("N{i}"),"num_blocks":8,"block_size":512}}))
        .collect();
    let nss: Vec<_> = (0..5)
        .map(|i| add_ns(json!({"bdev_name":format!("N{i}")})))
        .collect();
    let e = load(&bdevs, &nss).unwrap_err();
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.nsid"),
        "no free NSID",
        "subsystems[1].config[6]",
    );
}

#[test]
fn bdev_used_twice() {
    let e = nvmf_err(&[
        json!({"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2016-06.io.spdk:cnode2"}}),
        add_ns(json!({"bdev_name":"Malloc0"})),
        json!({"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2016-06.io.spdk:cnode2","namespace":{"bdev_name":"Malloc0"}}}),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.bdev_name"),
        "already namespace 1 of subsystem \"nqn.2016-06.io.spdk:cnode1\"",
        "subsystems[1].config[4]",
    );
}

#[test]
fn unknown_subsystem() {
    for (method, extra) in [
        (
            "nvmf_subsystem_add_ns",
            json!({"namespace":{"bdev_name":"Malloc0"}}),
        ),
        (
            "nvmf_subsystem_add_host",
            json!({"host":"nqn.2016-06.io.spdk:host1"}),
        ),
        (
            "nvmf_subsystem_allow_any_host",
            json!({"allow_any_host":true}),
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"listen_address":{"trtype":"TCP","traddr":"127.0.0.1","trsvcid":"4420"}}),
        ),
    ] {
        let mut params = extra.as_object().unwrap().clone();
        params.insert("nqn".into(), json!("nqn.2016-06.io.spdk:nope"));
        let e = nvmf_err(&[json!({"method":method,"params":params})]);
        check(
            &e,
            method,
            Some("nqn"),
            "no subsystem \"nqn.2016-06.io.spdk:nope\"",
            N2,
        );
    }
    let e = nvmf_err(&[
        json!({"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2014-08.org.nvmexpress.discovery","namespace":{"bdev_name":"Malloc0"}}}),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("nqn"),
        "discovery subsystem",
        N2,
    );
}

#[test]
fn block_size_and_size() {
    for bs in [0u32, 256, 520, 1000, 8192] {
        let e = bdev_err(
            json!({"method":"bdev_malloc_create","params":{"name":"M","num_blocks":8,"block_size":bs}}),
        );
        check(
            &e,
            "bdev_malloc_create",
            Some("block_size"),
            "not a power of two in 512..=4096",
            B2,
        );
    }
    for bs in [512u32, 1024, 2048, 4096] {
        load(&[json!({"method":"bdev_null_create","params":{"name":"N","num_blocks":8,"block_size":bs}})], &[]).unwrap();
    }
    let e = bdev_err(
        json!({"method":"bdev_malloc_create","params":{"name":"M","num_blocks":0,"block_size":512}}),
    );
    check(
        &e,
        "bdev_malloc_create",
        Some("num_blocks"),
        "greater than 0",
        B2,
    );
    let e = bdev_err(
        json!({"method":"bdev_null_create","params":{"name":"N","num_blocks":0,"block_size":512}}),
    );
    check(
        &e,
        "bdev_null_create",
        Some("num_blocks"),
        "greater than 0",
        B2,
    );
    let e = bdev_err(
        json!({"method":"bdev_malloc_create","params":{"name":"M","num_blocks":u64::MAX,"block_size":512}}),
    );
    check(
        &e,
        "bdev_malloc_create",
        Some("num_blocks"),
        "overflows",
        B2,
    );
    let e = bdev_err(
        json!({"method":"bdev_malloc_create","params":{"name":"M","num_blocks":8,"block_size":512,"md_size":8}}),
    );
    check(
        &e,
        "bdev_malloc_create",
        Some("md_size"),
        "not supported",
        B2,
    );
    let e = bdev_err(
        json!({"method":"bdev_null_create","params":{"name":"N","num_blocks":8,"block_size":512,"dif_type":1}}),
    );
    check(
        &e,
        "bdev_null_create",
        Some("dif_type"),
        "not supported",
        B2,
    );
}

#[test]
fn bad_hex_ids() {
    for (param, value, problem) in [
        (
            "nguid",
            "0123456789ABCDEF0123456789ABCDE",
            "exactly 32 hex digits",
        ),
        ("nguid", "0123456789ABCDEF0123456789ABCDEG", "non-hex"),
        ("eui64", "0123456789ABCDE", "exactly 16 hex digits"),
        ("eui64", "0123456789ABCDEX", "non-hex"),
        ("uuid", "0123456789ABCDEF0123456789ABCDEF", "xxxxxxxx-xxxx"),
        (
            "uuid",
            "6ba7b810-9dad-11d1-80b4-00c04fd430cz",
            "xxxxxxxx-xxxx",
        ),
    ] {
        let e = nvmf_err(&[add_ns(json!({"bdev_name":"Malloc0", param: value}))]);
        check(
            &e,
            "nvmf_subsystem_add_ns",
            Some(&format!("namespace.{param}")),
            problem,
            N2,
        );
    }
    let e = bdev_err(
        json!({"method":"bdev_malloc_create","params":{"name":"M","num_blocks":8,"block_size":512,"uuid":"nope"}}),
    );
    check(&e, "bdev_malloc_create", Some("uuid"), "xxxxxxxx-xxxx", B2);
}

#[test]
fn duplicate_explicit_ids() {
    let g = "000102030405060708090A0B0C0D0E0F";
    let e = nvmf_err(&[
        add_ns(json!({"bdev_name":"Malloc0","nguid":g})),
        add_ns(json!({"bdev_name":"Malloc1","nguid":g.to_lowercase()})),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.nguid"),
        "NGUID is already used by namespace 1",
        N3,
    );
    let u = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
    let e = nvmf_err(&[
        json!({"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2016-06.io.spdk:cnode2"}}),
        add_ns(json!({"bdev_name":"Malloc0","uuid":u})),
        json!({"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2016-06.io.spdk:cnode2","namespace":{"bdev_name":"Malloc1","uuid":u}}}),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.uuid"),
        "UUID is already used by namespace 1 of subsystem \"nqn.2016-06.io.spdk:cnode1\"",
        "subsystems[1].config[4]",
    );
    let x = "0011223344556677";
    let e = nvmf_err(&[
        add_ns(json!({"bdev_name":"Malloc0","eui64":x})),
        add_ns(json!({"bdev_name":"Malloc1","eui64":x})),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.eui64"),
        "EUI-64 is already used",
        N3,
    );
}

#[test]
fn unsupported_methods_and_transports() {
    for m in [
        "bdev_nvme_attach_controller",
        // bdev_aio_create is supported (file bdevs, tests/file_bdev.rs).
        "bdev_lvol_create_lvstore",
        // bdev_rbd_create is supported (Ceph RBD, tests/rbd_bdev.rs).
        "bdev_iscsi_create",
        "nvmf_discovery_add_referral",
        "nbd_start_disk",
        "made_up_method",
    ] {
        let e = bdev_err(json!({"method":m,"params":{"name":"x"}}));
        check(&e, m, None, "not supported by nvmfd", B2);
    }
    let text = doc(&[], &[]).replace("\"trtype\":\"TCP\"", "\"trtype\":\"VFIOUSER\"");
    let e = TargetConfig::from_json_str(&text).unwrap_err();
    check(
        &e,
        "nvmf_create_transport",
        Some("trtype"),
        "transport \"VFIOUSER\" is not supported by nvmfd (TCP and RDMA are)",
        "subsystems[1].config[0]",
    );
    let e = nvmf_err(&[
        json!({"method":"nvmf_subsystem_add_listener","params":{"nqn":NQN,"listen_address":{"trtype":"FC","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"4420"}}}),
    ]);
    check(
        &e,
        "nvmf_subsystem_add_listener",
        Some("listen_address.trtype"),
        "not supported",
        N2,
    );
    // listener before any transport
    let text = json!({"subsystems":[{"subsystem":"nvmf","config":[
        {"method":"nvmf_create_subsystem","params":{"nqn":NQN}},
        {"method":"nvmf_subsystem_add_listener","params":{"nqn":NQN,"listen_address":{"trtype":"TCP","traddr":"127.0.0.1","trsvcid":"4420"}}}]}]}).to_string();
    let e = TargetConfig::from_json_str(&text).unwrap_err();
    check(
        &e,
        "nvmf_subsystem_add_listener",
        Some("listen_address.trtype"),
        "no TCP transport",
        "subsystems[0].config[1]",
    );
}

#[test]
fn unsupported_security_and_visibility() {
    let l = |extra: serde_json::Value| {
        let mut p = json!({"nqn":NQN,"listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"4420"}});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"method":"nvmf_subsystem_add_listener","params":p})
    };
    let e = nvmf_err(&[l(json!({"secure_channel":"yes"}))]);
    check(
        &e,
        "nvmf_subsystem_add_listener",
        Some("secure_channel"),
        "boolean",
        N2,
    );
    load(
        &[],
        &[l(
            json!({"secure_channel":false, "ana_state":"optimized", "sock_impl":"posix"}),
        )],
    )
    .unwrap();
    // TLS PSK and DH-HMAC-CHAP key names must be in the keyring.
    for (key, msg) in [
        ("psk", "no key named \"key0\""),
        ("dhchap_key", "no key named \"key0\""),
        ("dhchap_ctrlr_key", "no key named \"key0\""),
    ] {
        let mut params = json!({"nqn":NQN,"host":"nqn.2016-06.io.spdk:h"});
        params[key] = json!("key0");
        let e = nvmf_err(&[json!({"method":"nvmf_subsystem_add_host","params":params})]);
        check(&e, "nvmf_subsystem_add_host", Some(key), msg, N2);
    }
    // no_auto_visible is modelled (tests/visibility.rs); a wrong type is not.
    let e = nvmf_err(&[add_ns(
        json!({"bdev_name":"Malloc0","no_auto_visible":"yes"}),
    )]);
    check(
        &e,
        "nvmf_subsystem_add_ns",
        Some("namespace.no_auto_visible"),
        "",
        N2,
    );
}

#[test]
fn listener_address_checks() {
    let l = |addr: serde_json::Value| json!({"method":"nvmf_subsystem_add_listener","params":{"nqn":NQN,"listen_address":addr}});
    let e = nvmf_err(&[l(
        json!({"trtype":"TCP","adrfam":"IPv6","traddr":"127.0.0.1","trsvcid":"4420"}),
    )]);
    check(
        &e,
        "nvmf_subsystem_add_listener",
        Some("listen_address.traddr"),
        "not an IPv6 address",
        N2,
    );
    let e = nvmf_err(&[l(
        json!({"trtype":"TCP","adrfam":"IB","traddr":"127.0.0.1","trsvcid":"4420"}),
    )]);
    check(
        &e,
        "nvmf_subsystem_add_listener",
        Some("listen_address.adrfam"),
        "not supported",
        N2,
    );
    let e = nvmf_err(&[l(
        json!({"trtype":"TCP","traddr":"localhost","trsvcid":"4420"}),
    )]);
    check(
        &e,
        "nvmf_subsystem_add_listener",
        Some("listen_address.traddr"),
        "not an IP address",
        N2,
    );
    for port in ["0", "65536", "http", "04420"] {
        let e = nvmf_err(&[l(
            json!({"trtype":"TCP","traddr":"127.0.0.1","trsvcid":port}),
        )]);
        check(
            &e,
            "nvmf_subsystem_add_listener",
            Some("listen_address.trsvcid"),
            "not a TCP port",
            N2,
        );
    }
    let c = load(
        &[],
        &[l(
            json!({"trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":"4421"}),
        )],
    )
    .unwrap();
    assert_eq!(c.subsystems[0].listeners[0].port(), Some(4421));
}

#[test]
fn subsystem_field_checks() {
    let s = |extra: serde_json::Value| {
        let mut p = json!({"nqn":"nqn.2016-06.io.spdk:x"});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"method":"nvmf_create_subsystem","params":p})
    };
    let e = nvmf_err(&[s(json!({"serial_number":"123456789012345678901"}))]);
    check(
        &e,
        "nvmf_create_subsystem",
        Some("serial_number"),
        "printable ASCII",
        N2,
    );
    let e = nvmf_err(&[s(json!({"model_number":"caf\u{e9}"}))]);
    check(
        &e,
        "nvmf_create_subsystem",
        Some("model_number"),
        "printable ASCII",
        N2,
    );
    let e = nvmf_err(&[s(json!({"min_cntlid":0}))]);
    check(
        &e,
        "nvmf_create_subsystem",
        Some("min_cntlid"),
        "outside",
        N2,
    );
    let e = nvmf_err(&[s(json!({"min_cntlid":10,"max_cntlid":5}))]);
    check(
        &e,
        "nvmf_create_subsystem",
        Some("max_cntlid"),
        "outside",
        N2,
    );
    let c = load(&[], &[s(json!({"max_namespaces":0,"min_cntlid":10,"max_cntlid":20,"ana_reporting":false,"dmrsl":0,"wzsl":0,"passthrough":false,"enable_nssr":false,"tgt_name":"nvmf_tgt"}))]).unwrap();
    let sub = c.subsystem("nqn.2016-06.io.spdk:x").unwrap();
    assert_eq!(
        (
            sub.max_namespaces,
            sub.min_cntlid,
            sub.max_cntlid,
            sub.ana_reporting
        ),
        (32, 10, 20, false)
    );
    assert!(c
        .ignored_params
        .contains(&"nvmf_create_subsystem.dmrsl".to_string()));
    assert!(c
        .ignored_params
        .contains(&"nvmf_create_subsystem.tgt_name".to_string()));
}

#[test]
fn transport_field_checks() {
    let t = |extra: &str| {
        doc(&[], &[]).replace("\"trtype\":\"TCP\"", &format!("\"trtype\":\"TCP\",{extra}"))
    };
    for (extra, param, problem) in [
        ("\"max_queue_depth\":1", "max_queue_depth", "minimum of 2"),
        ("\"max_aq_depth\":5000", "max_aq_depth", "outside 2..=4096"),
        (
            "\"max_io_qpairs_per_ctrlr\":0",
            "max_io_qpairs_per_ctrlr",
            "outside 1..=65534",
        ),
        (
            "\"in_capsule_data_size\":1000",
            "in_capsule_data_size",
            "multiple of 16",
        ),
        (
            "\"in_capsule_data_size\":8192,\"max_io_size\":4096",
            "in_capsule_data_size",
            "larger than max_io_size",
        ),
        ("\"max_io_size\":512", "max_io_size", "minimum of 4096"),
    ] {
        let e = TargetConfig::from_json_str(&t(extra)).unwrap_err();
        check(
            &e,
            "nvmf_create_transport",
            Some(param),
            problem,
            "subsystems[1].config[0]",
        );
    }
    let c = TargetConfig::from_json_str(&t(
        "\"max_qpairs_per_ctrlr\":9,\"in_capsule_data_size\":8192,\"c2h_success\":false,\"kas\":10",
    ))
    .unwrap();
    let tc = &c.transports[0];
    assert_eq!(
        (
            tc.max_io_qpairs_per_ctrlr,
            tc.in_capsule_data_size,
            tc.c2h_success
        ),
        (8, 8192, false)
    );
    assert_eq!(
        c.ignored_params,
        vec!["nvmf_create_transport.kas".to_string()]
    );
}

#[test]
fn entry_location_counts_every_section() {
    let text = json!({"subsystems":[
        {"subsystem":"iobuf","config":[{"method":"iobuf_set_options","params":{}}]},
        {"subsystem":"bdev","config":[[{"method":"bdev_wait_for_examine"}, {"method":"bdev_malloc_create","params":{"name":"M"}}]]}
    ]}).to_string();
    let e = TargetConfig::from_json_str(&text).unwrap_err();
    check(
        &e,
        "bdev_malloc_create",
        Some("num_blocks"),
        "missing",
        "subsystems[1].config[0][1]",
    );
}

#[test]
fn apply_method_is_all_or_nothing() {
    let mut c = load(&[], &[]).unwrap();
    let before = c.clone();
    // valid parts first, then a bad one: nothing may stick
    let bad =
        json!({"nqn":NQN,"namespace":{"bdev_name":"Malloc0","ptpl_file":"/tmp/x","nguid":"zz"}});
    assert!(c.apply_method("nvmf_subsystem_add_ns", Some(&bad)).is_err());
    assert_eq!(c, before);
    let bad =
        json!({"name":"New","num_blocks":8,"block_size":512,"physical_block_size":512,"bogus":1});
    assert!(c.apply_method("bdev_malloc_create", Some(&bad)).is_err());
    assert_eq!(c, before);
    let good = json!({"nqn":NQN,"namespace":{"bdev_name":"Malloc0","ptpl_file":"/tmp/x","hide_metadata":false}});
    c.apply_method("nvmf_subsystem_add_ns", Some(&good))
        .unwrap();
    assert_eq!(c.subsystems[0].namespaces.len(), 1);
    // ptpl_file is real (reservations persist there); hide_metadata is not.
    assert_eq!(
        c.subsystems[0].namespaces[0].ptpl_file.as_deref(),
        Some("/tmp/x")
    );
    assert_eq!(
        c.ignored_params,
        vec!["nvmf_subsystem_add_ns.namespace.hide_metadata".to_string()]
    );
    // and save_config writes it back
    let saved = c.to_json_value();
    assert!(
        saved.to_string().contains(r#""ptpl_file":"/tmp/x""#),
        "{saved}"
    );
    c.apply_method("sock_impl_set_options", Some(&json!({"impl_name":"posix"})))
        .unwrap();
    assert_eq!(c.skipped, vec!["sock_impl_set_options".to_string()]);
    // an unnamed malloc bdev gets the lowest free MallocN, like SPDK
    c.apply_method(
        "bdev_malloc_create",
        Some(&json!({"num_blocks":8,"block_size":512})),
    )
    .unwrap();
    assert_eq!(c.bdevs.last().unwrap().name, "Malloc2");
}

#[test]
fn load_file_errors_name_the_path() {
    let dir = std::env::temp_dir().join(format!("nvmf-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.json");
    let e = load_file(&missing).unwrap_err();
    assert!(matches!(e, ConfigError::Io { .. }));
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );
    let bad = dir.join("bad.json");
    std::fs::write(&bad, doc(&[], &[add_ns(json!({"bdev_name":"Malloc9"}))])).unwrap();
    let e = load_file(&bad).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "{}: nvmf_subsystem_add_ns: parameter",
            bad.display()
        )),
        "{msg}"
    );
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "{ nope").unwrap();
    let e = load_file(&junk).unwrap_err();
    assert!(e.to_string().contains(&junk.display().to_string()), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
