//! `nvmf rpc` command lines (rpc.py's arguments and flags) → the request
//! parameters rpc.py would send, for every method; global options; errors;
//! help; and end-to-end runs of `cli_main` against a server.

mod common;

use common::*;
use nvmf_rpc::cli::{main_help, parse_args, Globals, Invocation};
use nvmf_rpc::{cli_main, DEFAULT_RPC_SOCKET};
use serde_json::{json, Value};

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn parse(s: &str) -> (Globals, String, Option<Value>) {
    match parse_args(&words(s)).unwrap_or_else(|e| panic!("{s}: {e}")) {
        Invocation::Call {
            globals,
            method,
            params,
            ..
        } => (globals, method, params),
        Invocation::Help(_) => panic!("{s}: help"),
    }
}

fn params(s: &str) -> Value {
    parse(s).2.unwrap_or(Value::Null)
}

fn err(s: &str) -> String {
    parse_args(&words(s)).expect_err(s)
}

#[test]
fn globals() {
    let (g, m, p) = parse("spdk_get_version");
    assert_eq!(g.server, DEFAULT_RPC_SOCKET);
    assert_eq!(DEFAULT_RPC_SOCKET, "/var/tmp/spdk.sock");
    assert_eq!(m, "spdk_get_version");
    assert_eq!(p, None);
    let (g, _, _) = parse("-s /tmp/x.sock -t 5 -r 3 -v --dry-run spdk_get_version");
    assert_eq!(g.server, "/tmp/x.sock");
    assert_eq!(g.timeout, 5.0);
    assert_eq!(g.retries, 3);
    assert!(g.dry_run);
    let (g, _, _) = parse("--server=/tmp/y.sock spdk_get_version");
    assert_eq!(g.server, "/tmp/y.sock");
    // -s after the method belongs to the method.
    let (g, _, p) = parse("nvmf_create_subsystem nqn.2016-06.io.spdk:cnode1 -s SN1");
    assert_eq!(g.server, DEFAULT_RPC_SOCKET);
    assert_eq!(p.unwrap()["serial_number"], "SN1");
    assert!(err("").contains("requires a subcommand"));
    assert!(err("bdev_frob").contains("unrecognized subcommand 'bdev_frob'"));
    assert!(err("-x spdk_get_version").contains("'-x'"));
    assert!(err("-r x spdk_get_version").contains("invalid value 'x' for '--conn-retries"));
    assert_eq!(parse("--conn-retries 4 spdk_get_version").0.retries, 4);
    // Errors are clap's: they end with the usage line of the method.
    assert!(
        err("bdev_malloc_delete").contains("Usage: nvmf rpc bdev_malloc_delete <NAME>"),
        "{}",
        err("bdev_malloc_delete")
    );
    assert!(
        matches!(parse_args(&words("--help")), Ok(Invocation::Help(h)) if h.contains("nvmf_subsystem_add_ns"))
    );
    assert!(main_help().contains("/var/tmp/spdk.sock"));
    match parse_args(&words("nvmf_subsystem_add_listener -h")).unwrap() {
        Invocation::Help(h) => {
            assert!(h.contains("-t, --trtype"), "{h}");
            assert!(h.contains("-s, --trsvcid"), "{h}");
            assert!(h.contains("example:"), "{h}");
            assert!(
                h.contains("[possible values: optimized, non_optimized"),
                "{h}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn simple_methods() {
    assert_eq!(
        params("rpc_get_methods"),
        json!({"current": false, "include_aliases": false})
    );
    assert_eq!(
        params("rpc_get_methods -c --include-aliases"),
        json!({"current": true, "include_aliases": true})
    );
    assert_eq!(
        params("bdev_malloc_delete Malloc0"),
        json!({"name": "Malloc0"})
    );
    assert_eq!(params("bdev_null_delete Null0"), json!({"name": "Null0"}));
    assert_eq!(params("bdev_get_bdevs"), Value::Null);
    assert_eq!(
        params("bdev_get_bdevs -b Malloc0 -t 100"),
        json!({"name": "Malloc0", "timeout": 100})
    );
    assert_eq!(
        params("bdev_get_bdevs --name=Malloc0"),
        json!({"name": "Malloc0"})
    );
    assert_eq!(
        params("nvmf_get_transports --trtype TCP"),
        json!({"trtype": "TCP"})
    );
    assert_eq!(params("nvmf_get_subsystems"), Value::Null);
    assert_eq!(
        params("nvmf_get_subsystems nqn.2016-06.io.spdk:cnode1"),
        json!({"nqn": "nqn.2016-06.io.spdk:cnode1"})
    );
    assert_eq!(
        params("nvmf_delete_subsystem nqn.2016-06.io.spdk:cnode1 -t nvmf_tgt"),
        json!({"nqn": "nqn.2016-06.io.spdk:cnode1", "tgt_name": "nvmf_tgt"})
    );
    assert_eq!(
        params("nvmf_subsystem_remove_ns nqn.2016-06.io.spdk:cnode1 2"),
        json!({"nqn": "nqn.2016-06.io.spdk:cnode1", "nsid": 2})
    );
    assert_eq!(
        params("nvmf_subsystem_add_host nqn.a:b nqn.c:d"),
        json!({"nqn": "nqn.a:b", "host": "nqn.c:d"})
    );
    assert_eq!(
        params("nvmf_subsystem_remove_host nqn.a:b nqn.c:d -T 100"),
        json!({"nqn": "nqn.a:b", "host": "nqn.c:d", "timeout_ms": 100})
    );
    for m in [
        "nvmf_subsystem_get_controllers",
        "nvmf_subsystem_get_qpairs",
        "nvmf_subsystem_get_listeners",
    ] {
        assert_eq!(params(&format!("{m} nqn.a:b")), json!({"nqn": "nqn.a:b"}));
        assert!(err(m).contains("NQN"));
    }
    assert_eq!(params("nvmf_get_stats"), Value::Null);
    // As rpc.py v26.05: per_channel always sent, names a comma list.
    assert_eq!(params("bdev_get_iostat"), json!({"per_channel": false}));
    assert_eq!(
        params("bdev_get_iostat --names Malloc0,Rbd0 --reset-mode none"),
        json!({"per_channel": false, "names": ["Malloc0", "Rbd0"], "reset_mode": "none"})
    );
    assert_eq!(
        params("bdev_get_iostat -b Malloc0"),
        json!({"name": "Malloc0", "per_channel": false})
    );
    assert!(err("bdev_get_iostat --reset-mode some").contains("invalid value"));
    assert!(err("nvmf_subsystem_remove_ns nqn.a:b x").contains("invalid value 'x' for '<NSID>'"));
    assert!(err("bdev_malloc_delete").contains("required"));
    assert!(err("bdev_malloc_delete a b").contains("unexpected argument 'b'"));
}

#[test]
fn bdev_create() {
    // 512 MiB of 512-byte blocks.
    assert_eq!(
        params("bdev_malloc_create -b Malloc0 512 512"),
        json!({"name": "Malloc0", "num_blocks": 1048576, "block_size": 512, "md_interleave": false, "dif_is_head_of_md": false})
    );
    assert_eq!(
        params(
            "bdev_malloc_create 0.5 4096 -u 6ba7b810-9dad-11d1-80b4-00c04fd430c8 -m 0 -t 0 -n -1"
        ),
        json!({"num_blocks": 128, "block_size": 4096, "uuid": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
               "md_size": 0, "dif_type": 0, "numa_id": -1, "md_interleave": false, "dif_is_head_of_md": false})
    );
    assert!(err("bdev_malloc_create 512").contains("BLOCK_SIZE"));
    // argparse: a repeated option keeps its last value; "-1" is a number, not a flag.
    assert_eq!(params("bdev_malloc_create 1 512 -t 1 -t 2")["dif_type"], 2);
    assert!(err("bdev_malloc_create -1 512").contains("must not be negative"));
    assert!(err("bdev_malloc_create x 512").contains("invalid value 'x' for '<TOTAL_SIZE>'"));
    assert!(err("bdev_malloc_create inf 512").contains("not a finite number"));
    assert!(err("bdev_malloc_create 1 512 -t 7").contains("invalid value '7' for '--dif-type"));
    assert_eq!(
        params("bdev_null_create Null0 1024 4096 -d"),
        json!({"name": "Null0", "num_blocks": 262144, "block_size": 4096, "dif_is_head_of_md": true})
    );
    assert!(err("bdev_null_create Null0 1.5 4096").contains("invalid value '1.5'"));
    assert_eq!(
        params("bdev_uring_create /dev/nvme0n1 U0"),
        json!({"filename": "/dev/nvme0n1", "name": "U0"})
    );
    assert_eq!(
        params("bdev_uring_create /f U0 4096 -u 6ba7b810-9dad-11d1-80b4-00c04fd430c8"),
        json!({"filename": "/f", "name": "U0", "block_size": 4096, "uuid": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"})
    );
    assert_eq!(
        params("bdev_aio_create /f A0 -r --fallocate"),
        json!({"filename": "/f", "name": "A0", "readonly": true, "fallocate": true, "nowait": false})
    );
    assert_eq!(params("bdev_aio_delete A0"), json!({"name": "A0"}));
    assert_eq!(params("bdev_uring_delete U0"), json!({"name": "U0"}));
    assert!(err("bdev_null_create Null0 1 4096 -t 1").contains("--md-size"));
}

#[test]
fn transport() {
    assert_eq!(
        params("nvmf_create_transport -t TCP -u 8192 -i 131072 -c 8192"),
        json!({"trtype": "TCP", "io_unit_size": 8192, "max_io_size": 131072, "in_capsule_data_size": 8192,
               "c2h_success": true, "zcopy": false, "no_srq": false, "dif_insert_or_strip": false,
               "no_wr_batching": false, "disable_mappable_bar0": false, "disable_adaptive_irq": false,
               "disable_shadow_doorbells": false, "disable_command_passthru": false})
    );
    let p = params("nvmf_create_transport --trtype=tcp -q 64 -m 8 -a 32 -o -z --masked-oncs all --masked-fuses fcws");
    assert_eq!(p["max_queue_depth"], 64);
    assert_eq!(p["max_io_qpairs_per_ctrlr"], 8);
    assert_eq!(p["max_aq_depth"], 32);
    assert_eq!(p["c2h_success"], false);
    assert_eq!(p["zcopy"], true);
    assert_eq!(
        p["masked_oncs"],
        json!(["nvmcmps", "nvmdsmsv", "nvmwzsv", "reservs", "nvmcpys"])
    );
    assert_eq!(p["masked_fuses"], json!(["fcws"]));
    // RDMA: SPDK's option letters and JSON keys.
    let p = params(
        "nvmf_create_transport -t RDMA -u 8192 -i 131072 -c 8192 -n 4096 -s 1024 -r -l 64 -w -d 2048",
    );
    assert_eq!(
        p,
        json!({"trtype": "RDMA", "io_unit_size": 8192, "max_io_size": 131072, "in_capsule_data_size": 8192,
               "num_shared_buffers": 4096, "max_srq_depth": 1024, "no_srq": true, "acceptor_backlog": 64,
               "no_wr_batching": true, "num_cqe": 2048, "c2h_success": true, "zcopy": false,
               "dif_insert_or_strip": false, "disable_mappable_bar0": false, "disable_adaptive_irq": false,
               "disable_shadow_doorbells": false, "disable_command_passthru": false})
    );
    let p = params("nvmf_create_transport --trtype rdma --max-srq-depth 64 --no-srq --acceptor-backlog 8 --no-wr-batching --num-cqe 16");
    assert_eq!(
        (
            p["max_srq_depth"].clone(),
            p["no_srq"].clone(),
            p["acceptor_backlog"].clone(),
            p["no_wr_batching"].clone(),
            p["num_cqe"].clone()
        ),
        (json!(64), json!(true), json!(8), json!(true), json!(16))
    );
    assert!(err("nvmf_create_transport -u 8192").contains("not provided:\n  --trtype"));
    assert!(err("nvmf_create_transport -t TCP --masked-oncs foo").contains("foo"));
}

#[test]
fn subsystem_ns_listener_host() {
    assert_eq!(
        params("nvmf_create_subsystem nqn.2016-06.io.spdk:cnode1 -a -s SPDK00000000000001 -d SPDK_Controller1"),
        json!({"nqn": "nqn.2016-06.io.spdk:cnode1", "allow_any_host": true, "serial_number": "SPDK00000000000001",
               "model_number": "SPDK_Controller1", "ana_reporting": false, "passthrough": false, "enable_nssr": false})
    );
    let p = params("nvmf_create_subsystem nqn.a:b -m 8 -i 5 -I 10 -r");
    assert_eq!(
        (
            p["max_namespaces"].clone(),
            p["min_cntlid"].clone(),
            p["max_cntlid"].clone(),
            p["ana_reporting"].clone()
        ),
        (json!(8), json!(5), json!(10), json!(true))
    );

    assert_eq!(
        params("nvmf_subsystem_add_ns nqn.2016-06.io.spdk:cnode1 Malloc0"),
        json!({"nqn": "nqn.2016-06.io.spdk:cnode1",
               "namespace": {"bdev_name": "Malloc0", "no_auto_visible": false, "hide_metadata": false}})
    );
    assert_eq!(
        params("nvmf_subsystem_add_ns nqn.a:b Malloc0 -n 3 -g 0123456789abcdef0123456789abcdef -e 0123456789abcdef -u 6ba7b810-9dad-11d1-80b4-00c04fd430c8 -t tgt"),
        json!({"nqn": "nqn.a:b", "tgt_name": "tgt",
               "namespace": {"bdev_name": "Malloc0", "nsid": 3, "nguid": "0123456789abcdef0123456789abcdef",
                             "eui64": "0123456789abcdef", "uuid": "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
                             "no_auto_visible": false, "hide_metadata": false}})
    );

    assert_eq!(
        params(
            "nvmf_subsystem_add_listener nqn.2016-06.io.spdk:cnode1 -t tcp -a 127.0.0.1 -s 4420"
        ),
        json!({"nqn": "nqn.2016-06.io.spdk:cnode1", "secure_channel": false,
               "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"}})
    );
    assert_eq!(
        params("nvmf_subsystem_add_listener nqn.2016-06.io.spdk:cnode1 -t rdma -a 192.168.100.8 -s 4420"),
        json!({"nqn": "nqn.2016-06.io.spdk:cnode1", "secure_channel": false,
               "listen_address": {"trtype": "rdma", "traddr": "192.168.100.8", "trsvcid": "4420"}})
    );
    assert_eq!(
        params("nvmf_subsystem_add_listener discovery -t rdma -a fd00::8 -f ipv6"),
        json!({"nqn": "nqn.2014-08.org.nvmexpress.discovery", "secure_channel": false,
               "listen_address": {"trtype": "rdma", "traddr": "fd00::8", "adrfam": "ipv6"}})
    );
    assert_eq!(
        params("nvmf_subsystem_add_listener discovery -t tcp -a ::1 -f ipv6 -s 8009 -n optimized"),
        json!({"nqn": "nqn.2014-08.org.nvmexpress.discovery", "secure_channel": false, "ana_state": "optimized",
               "listen_address": {"trtype": "tcp", "traddr": "::1", "trsvcid": "8009", "adrfam": "ipv6"}})
    );
    // ANA: rpc.py's spelling of the two ANA methods
    assert_eq!(
        params("nvmf_subsystem_listener_set_ana_state nqn.a:b -n inaccessible -t tcp -a 127.0.0.1 -s 4420 -g 2"),
        json!({"nqn": "nqn.a:b", "ana_state": "inaccessible", "anagrpid": 2,
               "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"}})
    );
    assert!(
        err("nvmf_subsystem_listener_set_ana_state nqn.a:b -t tcp -a 127.0.0.1 -s 4420")
            .contains("not provided:\n  --ana-state")
    );
    assert!(
        err("nvmf_subsystem_listener_set_ana_state nqn.a:b -n sleepy -t tcp -a 127.0.0.1")
            .contains("invalid value 'sleepy' for '--ana-state")
    );
    assert_eq!(
        params("nvmf_subsystem_set_ns_ana_group nqn.a:b 3 2"),
        json!({"nqn": "nqn.a:b", "nsid": 3, "anagrpid": 2})
    );
    assert_eq!(
        params("nvmf_create_subsystem nqn.a:b -r -i 100 -I 199")["ana_reporting"],
        json!(true)
    );
    assert!(err("nvmf_subsystem_add_listener nqn.a:b -a 127.0.0.1")
        .contains("not provided:\n  --trtype"));
    assert!(
        err("nvmf_subsystem_add_listener nqn.a:b -t tcp -a 1.2.3.4 -n best")
            .contains("invalid value 'best' for '--ana-state")
    );
    assert_eq!(
        params("nvmf_subsystem_remove_listener nqn.a:b -t tcp -a 127.0.0.1 -s 4420"),
        json!({"nqn": "nqn.a:b", "listen_address": {"trtype": "tcp", "traddr": "127.0.0.1", "trsvcid": "4420"}})
    );

    assert_eq!(
        params("nvmf_subsystem_allow_any_host nqn.a:b --allow-any-host"),
        json!({"nqn": "nqn.a:b", "allow_any_host": true})
    );
    assert_eq!(
        params("nvmf_subsystem_allow_any_host nqn.a:b --no-allow-any-host"),
        json!({"nqn": "nqn.a:b", "allow_any_host": false})
    );
    assert_eq!(
        params("nvmf_subsystem_allow_any_host nqn.a:b -e")["allow_any_host"],
        true
    );
    assert_eq!(
        params("nvmf_subsystem_allow_any_host nqn.a:b -d")["allow_any_host"],
        false
    );
    assert!(err("nvmf_subsystem_allow_any_host nqn.a:b").contains("required"));
    // argparse: the last of --x / --no-x wins; -e and -d exclude each other.
    assert_eq!(
        params("nvmf_subsystem_allow_any_host nqn.a:b --allow-any-host --no-allow-any-host")
            ["allow_any_host"],
        false
    );
    assert!(err("nvmf_subsystem_allow_any_host nqn.a:b -e -d").contains("cannot be used with"));
}

#[test]
fn save_and_load_config_options() {
    match parse_args(&words("save_config -i 4 -s nvmf")).unwrap() {
        Invocation::Call {
            method,
            params,
            local,
            ..
        } => {
            assert_eq!(method, "save_config");
            assert_eq!(params, None);
            assert_eq!(local["indent"], 4);
            assert_eq!(local["subsystems"], "nvmf");
        }
        other => panic!("{other:?}"),
    }
    match parse_args(&words("load_config -j /tmp/f.json")).unwrap() {
        Invocation::Call { local, .. } => assert_eq!(local["json_conf"], "/tmp/f.json"),
        other => panic!("{other:?}"),
    }
}

/// rpc.py / argparse behaviours beyond one flag per option: rpc.py's ignored
/// globals, `--x` / `--no-x` (last wins), `--opt=-1`, `--` before a
/// positional that starts with '-', comma lists.
#[test]
fn argparse_corners() {
    let (g, _, _) = parse("--timeout 2.5 -p 5260 --verbose INFO -v spdk_get_version");
    assert_eq!((g.timeout, g.server.as_str()), (2.5, DEFAULT_RPC_SOCKET));
    let local = |line: &str| match parse_args(&words(line)).unwrap() {
        Invocation::Call { local, .. } => Value::Object(local),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        local("save_config --indent=-1 --with-batches"),
        json!({"indent": -1, "with_batches": true})
    );
    assert_eq!(
        local("save_config --with-batches --no-with-batches"),
        json!({"with_batches": false})
    );
    assert_eq!(
        params("nvmf_subsystem_add_ns nqn.a:b -- -weird")["namespace"]["bdev_name"],
        "-weird"
    );
    assert_eq!(
        params("nvmf_create_transport -t TCP --masked-oncs nvmcmps,reservs")["masked_oncs"],
        json!(["nvmcmps", "reservs"])
    );
    assert!(err("nvmf_create_transport -t TCP --masked-oncs foo").contains("Usage:"));
}

#[test]
fn cli_main_end_to_end() {
    let h = Harness::new();
    let s = h.sock.to_str().unwrap().to_string();
    let run = |line: &str| cli_main(&words(&format!("-s {s} {line}")));
    assert_eq!(
        run("nvmf_create_transport -t TCP -u 8192 -i 131072 -c 8192"),
        0
    );
    assert_eq!(run("bdev_malloc_create -b Malloc0 64 512"), 0);
    assert_eq!(run("nvmf_create_subsystem nqn.2016-06.io.spdk:cnode1 -a -s SPDK00000000000001 -d SPDK_Controller1"), 0);
    assert_eq!(
        run("nvmf_subsystem_add_ns nqn.2016-06.io.spdk:cnode1 Malloc0"),
        0
    );
    assert_eq!(
        run("nvmf_subsystem_add_listener nqn.2016-06.io.spdk:cnode1 -t tcp -a 127.0.0.1 -s 4420"),
        0
    );
    assert_eq!(
        run("nvmf_subsystem_add_listener discovery -t tcp -a 127.0.0.1 -s 4420"),
        0
    );
    assert_eq!(run("nvmf_get_subsystems"), 0);
    assert_eq!(run("save_config"), 0);
    // RPC error: exit 1; bad command line: exit 2; no server: exit 1.
    assert_eq!(run("bdev_malloc_delete Malloc0"), 1);
    assert_eq!(run("bdev_malloc_delete"), 2);
    assert_eq!(
        cli_main(&words("-s /nonexistent/x.sock spdk_get_version")),
        1
    );
    assert_eq!(cli_main(&words("--help")), 0);
    assert_eq!(run("--dry-run spdk_get_version"), 0);
    // Timeouts out of range are command-line errors, never a panic.
    assert_eq!(
        cli_main(&words(&format!("-s {s} -t 1e30 spdk_get_version"))),
        2
    );
    assert_eq!(
        cli_main(&words(&format!("-s {s} -t 0 spdk_get_version"))),
        2
    );
    assert_eq!(
        cli_main(&words(&format!("-s {s} -t 5 spdk_get_version"))),
        0
    );

    let cfg = h.service.config();
    assert_eq!(cfg.bdevs[0].num_blocks, 131072);
    assert_eq!(cfg.transports[0].io_unit_size, 8192);
    let sub = cfg.subsystem("nqn.2016-06.io.spdk:cnode1").unwrap();
    assert!(sub.allow_any_host);
    assert_eq!(sub.serial_number, "SPDK00000000000001");
    assert_eq!(sub.namespaces[0].bdev_name, "Malloc0");
    assert_eq!(sub.listeners[0].trsvcid, "4420");
    assert_eq!(cfg.discovery_listeners.len(), 1);

    // load_config -j FILE into another server: same configuration.
    let file = h.dir.path().join("saved.json");
    std::fs::write(&file, cfg.to_json_string_pretty()).unwrap();
    let h2 = Harness::new();
    let s2 = h2.sock.to_str().unwrap();
    assert_eq!(
        cli_main(&words(&format!(
            "-s {s2} load_config -j {}",
            file.display()
        ))),
        0
    );
    assert_eq!(h2.service.config().to_json_value(), cfg.to_json_value());
    assert_eq!(
        cli_main(&words(&format!(
            "-s {s2} load_config -j {{\"subsystems\":5}}"
        ))),
        1
    );
}
