//! Per-host namespace visibility (`no_auto_visible`, `nvmf_ns_add_host`,
//! `nvmf_ns_remove_host`; docs/VISIBILITY.md) on the real daemon over TCP
//! with the nvmf-host initiator: two host NQNs each see only their own
//! namespace; `nvmf_ns_add_host` while connected raises Namespace Attribute
//! Changed with the NSID in the Changed Namespace List and the namespace
//! works without a reconnect; `nvmf_ns_remove_host` under I/O makes new I/O
//! fail with Invalid Namespace while the daemon keeps running; the rules
//! survive a `--state` restart and a `save_config` → `-c` round trip.

use std::process::Command;
use std::time::{Duration, Instant};

use nvmf_host::{ConnectOptions, Controller, IoQueue, TransportId};
use nvmf_testkit::{bins, run_bounded, text, Daemon, TestDir};
use nvmf_wire::status::Status;

const NQN: &str = "nqn.2016-06.io.spdk:vis";
const H1: &str = "nqn.2024-01.io.test:host1";
const H2: &str = "nqn.2024-01.io.test:host2";
const BLOCKS: u64 = 2048;
/// Namespace Attribute Changed notice, log page 04h (AER dword 0).
const NS_ATTR_NOTICE: u32 = 0x0004_0002;
const INVALID_NS: Status = Status::INVALID_NAMESPACE.with_dnr();

/// Namespace 1 (M1) seen by host 1, namespace 2 (M2) by host 2, both
/// `no_auto_visible`; any host may connect.
fn config(port: u16) -> String {
    serde_json::json!({"subsystems":[
        {"subsystem":"bdev","config":[
            {"method":"bdev_malloc_create","params":{"name":"M1","num_blocks":BLOCKS,"block_size":512}},
            {"method":"bdev_malloc_create","params":{"name":"M2","num_blocks":BLOCKS,"block_size":512}}]},
        {"subsystem":"nvmf","config":[
            {"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
            {"method":"nvmf_create_subsystem","params":{"nqn":NQN,"allow_any_host":true}},
            {"method":"nvmf_subsystem_add_ns","params":{"nqn":NQN,"namespace":{"bdev_name":"M1","nsid":1,"no_auto_visible":true}}},
            {"method":"nvmf_ns_add_host","params":{"nqn":NQN,"nsid":1,"host":H1}},
            {"method":"nvmf_subsystem_add_ns","params":{"nqn":NQN,"namespace":{"bdev_name":"M2","nsid":2,"no_auto_visible":true}}},
            {"method":"nvmf_ns_add_host","params":{"nqn":NQN,"nsid":2,"host":H2}},
            {"method":"nvmf_subsystem_add_listener","params":{"nqn":NQN,"listen_address":{"trtype":"tcp","adrfam":"ipv4","traddr":"127.0.0.1","trsvcid":port.to_string()}}}]}]})
    .to_string()
}

fn connect(d: &Daemon, host: &str) -> Controller {
    let trid = TransportId::tcp("127.0.0.1", &d.port().to_string(), NQN);
    let mut o = ConnectOptions::new(trid).with_hostnqn(host);
    o.timeout = Duration::from_secs(10);
    let c =
        Controller::connect(&o).unwrap_or_else(|e| panic!("connect as {host}: {e}\n{}", d.logs()));
    c.set_num_queues(1).unwrap();
    c
}

/// Read one block of `nsid` on `q`: the completion status.
fn read(q: &mut IoQueue, nsid: u32) -> Status {
    let s = q.alloc().expect("free slot");
    let mut cmd = nvmf_wire::command::Command::new(nvmf_wire::opcode::IoOpcode::Read as u8, 0);
    cmd.set_nsid(nsid).set_lba_range(0, 1);
    let c = q
        .execute(s, cmd, 512, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("read of {nsid}: {e}"));
    q.release(s);
    c.status
}

/// The Asynchronous Event completion's dword 0, if one arrives within `wait`.
fn event_within(c: &Controller, wait: Duration) -> Option<u32> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Some(e) = c.poll_async_event().unwrap() {
            return Some(e.dw0);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn changed_list(c: &Controller) -> Vec<u32> {
    let mut buf = vec![0u8; 4096];
    c.get_log_page(0x04, 0xFFFF_FFFF, 0, &mut buf).unwrap();
    buf.chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .take_while(|&n| n != 0)
        .collect()
}

/// Host 1 sees `h1`, host 2 sees `h2` (active list; I/O to the others gets
/// Invalid Namespace, Identify Namespace of them is all zero).
fn check_views(d: &Daemon, h1: &[u32], h2: &[u32]) {
    for (host, sees) in [(H1, h1), (H2, h2)] {
        let c = connect(d, host);
        assert_eq!(
            c.active_namespaces().unwrap(),
            sees,
            "active list of {host}"
        );
        let mut q = c.create_io_queue(1, 4, 4096).unwrap();
        for nsid in [1u32, 2] {
            let id = c.identify_namespace(nsid).unwrap();
            if sees.contains(&nsid) {
                assert_eq!(id.nsze.get(), BLOCKS, "{host}: NSZE of {nsid}");
                assert_eq!(read(&mut q, nsid), Status::SUCCESS, "{host} reads {nsid}");
            } else {
                assert_eq!(id.nsze.get(), 0, "{host}: hidden {nsid} is inactive");
                assert_eq!(read(&mut q, nsid), INVALID_NS, "{host} reads {nsid}");
            }
        }
    }
}

#[test]
fn each_host_sees_its_own_namespace_add_host_applies_live_and_rules_persist() {
    let dir = TestDir::new("ns-vis");
    let state = dir.join("state.json");
    let state_arg = state.to_str().unwrap().to_string();
    let d = Daemon::start_on_free_port(|port| {
        Daemon::builder(config(port))
            .args(["-m", "0", "--state", &state_arg])
            .listening(&[port])
    });
    let port = d.port();
    check_views(&d, &[1], &[2]);

    // nvmf_ns_add_host while both hosts are connected: host 2 is told and
    // uses namespace 1 at once; host 1 hears nothing (its view is unchanged).
    let c1 = connect(&d, H1);
    let c2 = connect(&d, H2);
    let mut q2 = c2.create_io_queue(1, 4, 4096).unwrap();
    assert_eq!(read(&mut q2, 1), INVALID_NS);
    c1.arm_async_event().unwrap();
    c2.arm_async_event().unwrap();
    d.rpc_ok(&["nvmf_ns_add_host", NQN, "1", H2]);
    assert_eq!(
        event_within(&c2, Duration::from_secs(5)),
        Some(NS_ATTR_NOTICE),
        "host 2: Namespace Attribute Changed\n{}",
        d.logs()
    );
    assert_eq!(changed_list(&c2), vec![1]);
    assert_eq!(c2.active_namespaces().unwrap(), vec![1, 2]);
    assert_eq!(read(&mut q2, 1), Status::SUCCESS, "no reconnect needed");
    assert_eq!(
        event_within(&c1, Duration::from_millis(300)),
        None,
        "host 1"
    );

    // Errors are clear and change nothing.
    let e = d
        .rpc(&["nvmf_ns_add_host", NQN, "3", H2])
        .expect_err("no namespace 3");
    assert!(e.contains("no namespace 3"), "{e}");

    // save_config writes the rules as SPDK does.
    let saved = d.rpc_ok(&["save_config"]);
    let doc: serde_json::Value = serde_json::from_str(&saved).unwrap();
    let entries: Vec<&serde_json::Value> = doc["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["subsystem"] == "nvmf")
        .flat_map(|s| s["config"].as_array().unwrap())
        .collect();
    let add_host: Vec<(u64, &str)> = entries
        .iter()
        .filter(|e| e["method"] == "nvmf_ns_add_host")
        .map(|e| {
            (
                e["params"]["nsid"].as_u64().unwrap(),
                e["params"]["host"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(add_host, vec![(1, H1), (1, H2), (2, H2)]);
    assert!(entries
        .iter()
        .filter(|e| e["method"] == "nvmf_subsystem_add_ns")
        .all(|e| e["params"]["namespace"]["no_auto_visible"] == true));
    drop((q2, c1, c2));
    drop(d);

    // --state restart: the same rules (the state file wins over -c).
    let d = Daemon::builder(config(port))
        .args(["-m", "0", "--state", &state_arg])
        .listening(&[port])
        .start();
    check_views(&d, &[1], &[1, 2]);
    drop(d);

    // save_config → -c: the same rules again.
    let d = Daemon::builder(saved)
        .args(["-m", "0"])
        .listening(&[port])
        .start();
    check_views(&d, &[1], &[1, 2]);
}

#[test]
fn ns_remove_host_under_io_fails_new_io_with_invalid_namespace() {
    let mut d = Daemon::start_on_free_port(|port| {
        Daemon::builder(config(port))
            .args(["-m", "0"])
            .listening(&[port])
    });
    let c1 = connect(&d, H1);
    c1.arm_async_event().unwrap();
    let mut q = c1.create_io_queue(1, 32, 4096).unwrap();

    // Keep 32 reads of namespace 1 in flight while another thread removes
    // host 1 from it.
    let sock = d.rpc_socket.clone();
    let remover = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let mut cmd = Command::new(bins::nvmf());
        cmd.arg("rpc")
            .arg("-s")
            .arg(&sock)
            .args(["nvmf_ns_remove_host", NQN, "1", H1]);
        let out = run_bounded(cmd, Duration::from_secs(30));
        assert!(out.status.success(), "{}", text(&out.stderr));
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut ok, mut invalid) = (0u64, 0u64);
    let mut lba = 0u64;
    while invalid < 64 {
        assert!(
            Instant::now() < deadline,
            "no Invalid Namespace after {ok} reads"
        );
        while let Some(s) = q.alloc() {
            q.submit_read(s, 1, lba % BLOCKS, 1, 512).unwrap();
            lba += 1;
        }
        q.flush().unwrap();
        q.poll(Some(Duration::from_millis(100))).unwrap();
        while let Some(c) = q.next_completion() {
            q.release(c.slot);
            match c.status {
                s if s.is_success() => ok += 1,
                s if s == INVALID_NS => invalid += 1,
                s => panic!("read under nvmf_ns_remove_host: {}", s.name()),
            }
        }
    }
    remover.join().unwrap();
    // Drain what is still in flight: each finishes, nothing hangs.
    while q.inflight() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} reads never answered",
            q.inflight()
        );
        q.poll(Some(Duration::from_millis(100))).unwrap();
        while let Some(c) = q.next_completion() {
            q.release(c.slot);
            assert!(c.status.is_success() || c.status == INVALID_NS);
        }
    }
    assert!(ok > 0, "reads succeeded before the change");
    assert_eq!(read(&mut q, 1), INVALID_NS);
    assert_eq!(
        event_within(&c1, Duration::from_secs(5)),
        Some(NS_ATTR_NOTICE)
    );
    assert_eq!(changed_list(&c1), vec![1]);
    assert!(c1.active_namespaces().unwrap().is_empty());
    // The daemon is alive and serves the other host.
    assert!(d.running());
    assert!(!d.logs().contains("panicked"), "{}", d.logs());
    let c2 = connect(&d, H2);
    let mut q2 = c2.create_io_queue(1, 4, 4096).unwrap();
    assert_eq!(read(&mut q2, 2), Status::SUCCESS);
}

#[test]
fn a_no_auto_visible_namespace_added_live_stays_hidden_until_add_host() {
    let d = Daemon::start_on_free_port(|port| {
        Daemon::builder(config(port))
            .args(["-m", "0"])
            .listening(&[port])
    });
    let c1 = connect(&d, H1);
    c1.arm_async_event().unwrap();
    d.rpc_ok(&["bdev_malloc_create", "-b", "M3", "1", "512"]);
    // `nvmf rpc nvmf_subsystem_add_ns -i`: no_auto_visible.
    d.rpc_ok(&["nvmf_subsystem_add_ns", NQN, "M3", "-n", "3", "-i"]);
    assert_eq!(
        event_within(&c1, Duration::from_millis(500)),
        None,
        "nobody sees namespace 3 yet"
    );
    assert_eq!(c1.active_namespaces().unwrap(), vec![1]);
    let mut q = c1.create_io_queue(1, 4, 4096).unwrap();
    assert_eq!(read(&mut q, 3), INVALID_NS);
    d.rpc_ok(&["nvmf_ns_add_host", NQN, "3", H1]);
    assert_eq!(
        event_within(&c1, Duration::from_secs(5)),
        Some(NS_ATTR_NOTICE)
    );
    assert_eq!(changed_list(&c1), vec![3]);
    assert_eq!(c1.active_namespaces().unwrap(), vec![1, 3]);
    assert_eq!(read(&mut q, 3), Status::SUCCESS);
    // An auto-visible namespace refuses per-host rules, with a clear message.
    d.rpc_ok(&["bdev_malloc_create", "-b", "M4", "1", "512"]);
    d.rpc_ok(&["nvmf_subsystem_add_ns", NQN, "M4", "-n", "4"]);
    let e = d
        .rpc(&["nvmf_ns_remove_host", NQN, "4", H1])
        .expect_err("namespace 4 is visible to every host");
    assert!(e.contains("visible to every host"), "{e}");
}
