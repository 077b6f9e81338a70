//! The JSON-RPC control plane of the real daemon over its Unix socket:
//! SPDK's nvmf walkthrough through `nvmf rpc -s SOCK ...` on a daemon that
//! starts with no namespaces, I/O with `nvmf perf --verify` while
//! get_controllers/get_qpairs/get_stats show the connection, restart from
//! `--state` (same namespace identifiers, I/O works), SIGKILL during a burst
//! of RPCs (the state file holds a complete configuration), bad input over
//! the socket (daemon keeps running, state unchanged), remove_listener
//! refuses new connections, save_config → `-c` → save_config byte-identical,
//! the socket-in-use / stale-socket rules, delete_subsystem closing its
//! queues before it answers with a reconnect refused without DNR, and the
//! clear refusal of NVMe/RDMA listeners (at start and live) where RDMA is missing,
//! and `bdev_get_iostat` counting the I/O an initiator did.

use nvmf_testkit::{
    bins::nvmf as nvmf_path, bins::nvmfd_command, free_port, run_bounded, Process as Nvmfd,
};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nvmf_rpc::RpcClient;
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";

/// A fresh directory under target/tmp (short: Unix socket paths are limited).
fn tmp_dir(tag: &str) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "rpc-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A running nvmfd (killed on drop: see [`Nvmfd`]).
struct Daemon {
    nvmfd: Nvmfd,
    sock: PathBuf,
}

impl std::ops::Deref for Daemon {
    type Target = Nvmfd;
    fn deref(&self) -> &Nvmfd {
        &self.nvmfd
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Nvmfd {
        &mut self.nvmfd
    }
}

impl Daemon {
    /// nvmfd -m 0 -r DIR/sock [--state DIR/state.json] [-c CFG].
    fn start(dir: &Path, cfg: Option<&Path>, state: bool) -> Daemon {
        let d = Daemon::spawn(dir, cfg, state);
        d.wait_log("RPC server listening on");
        d
    }

    fn spawn(dir: &Path, cfg: Option<&Path>, state: bool) -> Daemon {
        let sock = dir.join("sock");
        let mut cmd = nvmfd_command();
        cmd.args(["-m", "0", "-r"]).arg(&sock);
        if state {
            cmd.arg("--state").arg(dir.join("state.json"));
        }
        if let Some(c) = cfg {
            cmd.arg("-c").arg(c);
        }
        let nvmfd = Nvmfd::spawn(cmd.env("NO_COLOR", "1"));
        Daemon { nvmfd, sock }
    }

    /// `nvmf rpc -s SOCK ARGS` → (success, stdout + stderr).
    fn cli(&self, args: &[&str]) -> (bool, String) {
        let mut cmd = Command::new(nvmf_path());
        cmd.arg("rpc").arg("-s").arg(&self.sock).args(args);
        let out = run_bounded(cmd, Duration::from_secs(30));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// `nvmf rpc` that must succeed; its stdout parsed as JSON.
    fn ok(&self, args: &[&str]) -> Value {
        let (ok, text) = self.cli(args);
        assert!(
            ok,
            "nvmf rpc {args:?} failed: {text}\n--- nvmfd ---\n{}",
            self.logs()
        );
        serde_json::from_str(text.trim()).unwrap_or(Value::String(text))
    }

    fn client(&self) -> RpcClient {
        let mut c = RpcClient::connect(&self.sock, 50).expect("connect to the RPC socket");
        c.set_timeout(Some(Duration::from_secs(30))).unwrap();
        c
    }

    fn call(&self, method: &str, params: Value) -> Value {
        self.client()
            .call(method, Some(&params))
            .unwrap_or_else(|e| panic!("{method}: {e:?}"))
    }

    fn walkthrough(&self, port: u16) {
        self.ok(&[
            "nvmf_create_transport",
            "-t",
            "TCP",
            "-u",
            "8192",
            "-i",
            "131072",
            "-c",
            "8192",
        ]);
        self.ok(&["bdev_malloc_create", "-b", "Malloc0", "64", "512"]);
        self.ok(&[
            "nvmf_create_subsystem",
            NQN,
            "-a",
            "-s",
            "SPDK00000000000001",
            "-d",
            "SPDK_Controller1",
        ]);
        self.ok(&["nvmf_subsystem_add_ns", NQN, "Malloc0"]);
        self.ok(&[
            "nvmf_subsystem_add_listener",
            NQN,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port.to_string(),
        ]);
    }
}

fn empty_config(dir: &Path) -> PathBuf {
    let p = dir.join("empty.json");
    std::fs::write(&p, r#"{"subsystems":[]}"#).unwrap();
    p
}

fn perf(port: u16, secs: u32) -> Output {
    let trid = nvmf_testkit::trid(port, NQN);
    let mut cmd = Command::new(nvmf_path());
    cmd.args([
        "perf",
        "-r",
        &trid,
        "--no-progress",
        "-q",
        "8",
        "-o",
        "4096",
    ])
    .args([
        "-w",
        "randrw",
        "-M",
        "50",
        "--verify",
        "-t",
        &secs.to_string(),
    ]);
    run_bounded(cmd, Duration::from_secs(60 + u64::from(secs)))
}

fn assert_perf_ok(out: &Output, d: &Daemon) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(" 0 mismatched - OK"),
        "nvmf perf failed\n{stdout}\n{}\n--- nvmfd ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.logs()
    );
}

#[test]
fn spdk_walkthrough_io_and_restart_from_state() {
    let dir = tmp_dir("walk");
    let empty = empty_config(&dir);
    let port = free_port();
    let mut d = Daemon::start(&dir, Some(&empty), true);
    assert_eq!(
        d.call("nvmf_get_subsystems", json!({}))
            .as_array()
            .unwrap()
            .len(),
        1
    );
    d.walkthrough(port);
    let busy = |d: &Daemon| -> (u64, u64) {
        let t = d.call("thread_get_stats", json!({}));
        assert_eq!(t["tick_rate"], 1_000_000_000u64, "{t}");
        let th = t["threads"].as_array().expect("threads");
        assert!(!th.is_empty(), "one entry per reactor: {t}");
        th.iter().fold((0, 0), |(b, i), x| {
            (
                b + x["busy"].as_u64().unwrap(),
                i + x["idle"].as_u64().unwrap(),
            )
        })
    };
    let (busy0, idle0) = busy(&d);

    // I/O while get_controllers / get_qpairs / get_stats show the connection.
    let io = std::thread::spawn(move || perf(port, 4));
    let start = Instant::now();
    let (ctrls, qpairs) = loop {
        let c = d.call("nvmf_subsystem_get_controllers", json!({ "nqn": NQN }));
        let q = d.call("nvmf_subsystem_get_qpairs", json!({ "nqn": NQN }));
        if c.as_array().unwrap().len() == 1 && q.as_array().unwrap().len() >= 2 {
            break (c, q);
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no controller: {c} {q}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let c = &ctrls[0];
    assert!(c["cntlid"].as_u64().unwrap() >= 1, "{c}");
    assert!(c["hostnqn"].as_str().unwrap().starts_with("nqn."), "{c}");
    assert_eq!(c["num_io_qpairs"], 1, "{c}");
    let qs = qpairs.as_array().unwrap();
    assert!(qs.iter().any(|q| q["qid"] == 0), "{qpairs}");
    assert!(qs.iter().any(|q| q["qid"] == 1), "{qpairs}");
    for q in qs {
        assert_eq!(q["state"], "active", "{q}");
        assert_eq!(q["listen_address"]["trsvcid"], port.to_string(), "{q}");
        assert_eq!(q["peer_address"]["traddr"], "127.0.0.1", "{q}");
    }
    let stats = d.call("nvmf_get_stats", json!({}));
    let pg = &stats["poll_groups"][0];
    assert_eq!(pg["current_io_qpairs"], 1, "{stats}");
    assert_eq!(pg["transports"][0]["trtype"], "TCP", "{stats}");
    let out = io.join().unwrap();
    assert_perf_ok(&out, &d);
    let stats = d.call("nvmf_get_stats", json!({}));
    assert!(
        stats["poll_groups"][0]["completed_nvme_io"]
            .as_u64()
            .unwrap()
            > 1000,
        "{stats}"
    );
    // The reactors were busy for the I/O, and idle is counted too.
    let (busy1, idle1) = busy(&d);
    assert!(
        busy1 > busy0 + 10_000_000,
        "thread_get_stats: busy {busy0} -> {busy1} ns over 4 s of I/O"
    );
    assert!(
        idle1 > idle0,
        "thread_get_stats: idle {idle0} -> {idle1} ns"
    );
    // framework_get_reactors (SPDK's): the same reactors, their busy time.
    let r = d.call("framework_get_reactors", json!({}));
    let rs = r["reactors"].as_array().expect("reactors");
    assert!(!rs.is_empty(), "{r}");
    let busy_r: u64 = rs.iter().map(|x| x["busy"].as_u64().unwrap()).sum();
    assert!(
        busy_r >= busy1,
        "framework_get_reactors busy {busy_r} < {busy1}: {r}"
    );
    assert_eq!(
        rs[0]["lw_threads"][0]["name"], "nvmf_tgt_poll_group_000",
        "{r}"
    );

    // Restart with the same --state (and -c, which the state file overrides).
    let before = d.call("nvmf_get_subsystems", json!({}));
    let saved_before = d.call("save_config", json!({}));
    let ns = &before[1]["namespaces"][0];
    assert!(ns["nguid"].as_str().unwrap().len() == 32, "{before}");
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    assert!(d
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    assert!(!d.sock.exists(), "the socket file is removed at shutdown");
    let d = Daemon::start(&dir, Some(&empty), true);
    d.wait_log("-c");
    assert!(d.logs().contains("is ignored"), "{}", d.logs());
    assert_eq!(d.call("nvmf_get_subsystems", json!({})), before);
    assert_eq!(d.call("save_config", json!({})), saved_before);
    let out = perf(port, 2);
    assert_perf_ok(&out, &d);
}

/// add_host calls in the burst: many more than the kill waits for.
const BURST: usize = 200;

#[test]
fn sigkill_during_rpc_burst_leaves_a_complete_state() {
    let dir = tmp_dir("kill");
    let empty = empty_config(&dir);
    let mut d = Daemon::start(&dir, Some(&empty), true);
    d.ok(&["nvmf_create_subsystem", NQN, "-s", "SPDK1"]);
    let sock = d.sock.clone();
    let burst = std::thread::spawn(move || {
        let mut c = RpcClient::connect(&sock, 10).unwrap();
        c.set_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut acked = 0;
        for i in 0..BURST {
            let p = json!({"nqn": NQN, "host": format!("nqn.2014-08.org.example:host{i}")});
            if c.call("nvmf_subsystem_add_host", Some(&p)).is_err() {
                break;
            }
            acked += 1;
        }
        acked
    });
    // Kill in the middle of the burst.
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(dir.join("state.json")).unwrap_or_default();
        if text.contains("host5\"") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the burst never reached host5:\n{}",
            d.logs()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    unsafe { libc::kill(d.child.id() as i32, libc::SIGKILL) };
    assert!(
        d.wait_exit(Duration::from_secs(10)).is_some(),
        "nvmfd survived SIGKILL"
    );
    let acked = burst.join().unwrap();
    assert!(
        (5..BURST).contains(&acked),
        "the kill did not land mid-burst: {acked} of {BURST} calls acknowledged"
    );
    drop(d);

    let d = Daemon::start(&dir, None, true);
    let subs = d.call("nvmf_get_subsystems", json!({ "nqn": NQN }));
    let hosts: Vec<String> = subs[0]["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["nqn"].as_str().unwrap().to_string())
        .collect();
    // A prefix of the burst: every acknowledged call, maybe one more.
    assert!(
        hosts.len() >= acked && hosts.len() <= acked + 1,
        "acked {acked}, restored {hosts:?}"
    );
    for (i, h) in hosts.iter().enumerate() {
        assert_eq!(h, &format!("nqn.2014-08.org.example:host{i}"));
    }
    eprintln!(
        "killed after {acked} acknowledged add_host calls; restored {} hosts",
        hosts.len()
    );
}

#[test]
fn bad_input_over_the_socket_changes_nothing() {
    let dir = tmp_dir("bad");
    let empty = empty_config(&dir);
    let port = free_port();
    let mut d = Daemon::start(&dir, Some(&empty), true);
    d.walkthrough(port);
    d.ok(&["bdev_malloc_create", "-b", "Malloc1", "8", "512"]);
    let state = || std::fs::read(dir.join("state.json")).unwrap();
    let saved = d.call("save_config", json!({}));
    let file = state();

    let mut c = d.client();
    let cases: Vec<(&str, Value)> = vec![
        ("no_such_method", json!({})),
        (
            "bdev_malloc_create",
            json!({"num_blocks": "many", "block_size": 512}),
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc1", "nsid": 1}}),
        ),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": NQN, "namespace": {"bdev_name": "Malloc0"}}),
        ),
        (
            "nvmf_subsystem_add_listener",
            json!({"nqn": NQN, "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()}}),
        ),
        ("bdev_malloc_delete", json!({"name": "Malloc0"})),
        ("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 7})),
        ("nvmf_create_subsystem", json!({"nqn": NQN})),
        (
            "nvmf_subsystem_add_ns",
            json!({"nqn": "nqn.2016-06.io.spdk:nope", "namespace": {"bdev_name": "Malloc1"}}),
        ),
    ];
    for (m, p) in &cases {
        let r = c.call(m, Some(p));
        assert!(r.is_err(), "{m} {p} should fail, got {r:?}");
    }
    // Raw garbage on a second connection: a parse error, the daemon stays.
    {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&d.sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"{\"method\": nope}").unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("-32700"));
    }
    // A listener on a port something else holds: refused, nothing bound.
    let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = squatter.local_addr().unwrap().port().to_string();
    let (ok, text) = d.cli(&[
        "nvmf_subsystem_add_listener",
        NQN,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &busy,
    ]);
    assert!(!ok, "{text}");
    assert!(d.running(), "{}", d.logs());
    assert_eq!(d.call("save_config", json!({})), saved);
    assert_eq!(state(), file, "the state file is unchanged");
    // Still fully working.
    d.ok(&["nvmf_subsystem_add_ns", NQN, "Malloc1"]);
    let out = perf(port, 1);
    assert_perf_ok(&out, &d);
}

#[test]
fn remove_listener_refuses_new_connections() {
    let dir = tmp_dir("rmlis");
    let empty = empty_config(&dir);
    let port = free_port();
    let d = Daemon::start(&dir, Some(&empty), false);
    d.walkthrough(port);
    let held = TcpStream::connect(("127.0.0.1", port)).expect("listening after add_listener");
    d.ok(&[
        "nvmf_subsystem_remove_listener",
        NQN,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port.to_string(),
    ]);
    let e =
        TcpStream::connect(("127.0.0.1", port)).expect_err("port refuses after remove_listener");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    drop(held);
    // And it comes back.
    d.ok(&[
        "nvmf_subsystem_add_listener",
        NQN,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port.to_string(),
    ]);
    assert_perf_ok(&perf(port, 1), &d);
}

#[test]
fn save_config_loads_with_c_and_round_trips() {
    let dir = tmp_dir("save");
    let empty = empty_config(&dir);
    let port = free_port();
    let d = Daemon::start(&dir, Some(&empty), false);
    d.walkthrough(port);
    d.ok(&["nvmf_subsystem_add_host", NQN, "nqn.2014-08.org.example:h1"]);
    let (ok, saved1) = d.cli(&["save_config"]);
    assert!(ok, "{saved1}");
    drop(d);
    let dir2 = tmp_dir("save2");
    let cfg = dir2.join("saved.json");
    std::fs::write(&cfg, &saved1).unwrap();
    let d2 = Daemon::start(&dir2, Some(&cfg), false);
    let (ok, saved2) = d2.cli(&["save_config"]);
    assert!(ok, "{saved2}");
    assert_eq!(saved1, saved2, "save → load → save is byte-identical");
    assert_perf_ok(&perf(port, 1), &d2);
}

#[test]
fn socket_in_use_is_an_error_and_a_stale_one_is_replaced() {
    let dir = tmp_dir("sock");
    let empty = empty_config(&dir);
    let d = Daemon::start(&dir, Some(&empty), false);
    let mut second = Daemon::spawn(&dir, Some(&empty), false);
    let st = second
        .wait_exit(Duration::from_secs(10))
        .expect("second daemon exits");
    assert!(!st.success());
    second.wait_log("another process serves RPC");
    assert!(d.sock.exists(), "the first daemon's socket stays");
    d.ok(&["spdk_get_version"]);
    // SIGKILL leaves the socket file behind: the next start replaces it.
    let mut d = d;
    d.child.kill().unwrap();
    let _ = d.wait_exit(Duration::from_secs(5));
    assert!(d.sock.exists());
    let d2 = Daemon::start(&dir, Some(&empty), false);
    d2.ok(&["spdk_get_version"]);
}

#[test]
fn load_config_with_a_redefined_bdev_reattaches_its_namespace() {
    let dir = tmp_dir("redef");
    let empty = empty_config(&dir);
    let port = free_port();
    let d = Daemon::start(&dir, Some(&empty), false);
    d.walkthrough(port); // Malloc0: 64 MiB of 512-byte blocks = 131072 blocks
    let identify = || {
        let trid = nvmf_testkit::trid(port, NQN);
        let mut cmd = Command::new(nvmf_path());
        cmd.args(["identify", "-r", &trid]);
        let out = run_bounded(cmd, Duration::from_secs(30));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(identify().contains("131072 blocks"), "{}", identify());

    // The same configuration with Malloc0 twice as large.
    let mut cfg = d.call("save_config", json!({}));
    for sub in cfg["subsystems"].as_array_mut().unwrap() {
        for entry in sub["config"].as_array_mut().into_iter().flatten() {
            if entry["method"] == "bdev_malloc_create" {
                entry["params"]["num_blocks"] = json!(262144);
            }
        }
    }
    assert_eq!(d.call("load_config", cfg), json!(true));
    let bdevs = d.call("bdev_get_bdevs", json!({"name": "Malloc0"}));
    assert_eq!(bdevs[0]["num_blocks"], json!(262144));
    // The namespace serves the new bdev, as the model and a restart would.
    let now = identify();
    assert!(
        now.contains("262144 blocks"),
        "namespace still on the old bdev:\n{now}"
    );
    assert_perf_ok(&perf(port, 1), &d);
}

/// Live maintenance: `nvmf_delete_subsystem` closes its controllers'
/// connections before the RPC answers (not on a later reactor tick), a
/// reconnect while the subsystem is gone is refused without Do Not Retry
/// (so a Linux host keeps trying), and once it is re-created the host is
/// back with verified I/O.
#[test]
fn delete_subsystem_closes_queues_at_once_and_reconnect_may_retry() {
    use nvmf_host::{ConnectOptions, Controller, TransportId};
    let dir = tmp_dir("delsub");
    let empty = empty_config(&dir);
    let port = free_port();
    let d = Daemon::start(&dir, Some(&empty), false);
    d.walkthrough(port);
    // The port stays bound while the subsystem is gone (as with any other
    // subsystem or a discovery listener on it).
    d.ok(&[
        "nvmf_subsystem_add_listener",
        "nqn.2014-08.org.nvmexpress.discovery",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port.to_string(),
    ]);
    let opts = ConnectOptions::new(TransportId::parse(&nvmf_testkit::trid(port, NQN)).unwrap());
    let ctrl = Controller::connect(&opts).expect("connect");
    let q = ctrl.create_io_queue(1, 32, 4096).expect("I/O queue");

    d.ok(&["nvmf_delete_subsystem", NQN]);
    // Closed already: the socket is at end of file (or reset) at once.
    let mut pfd = libc::pollfd {
        fd: q.raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a bounded wait.
    let n = unsafe { libc::poll(&mut pfd, 1, 5) };
    assert_eq!(n, 1, "I/O queue still open after delete_subsystem returned");
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a local buffer.
    let r = unsafe { libc::recv(pfd.fd, b.as_mut_ptr().cast(), 1, libc::MSG_DONTWAIT) };
    assert!(r <= 0, "expected end of file, read {r}");
    drop(q);
    drop(ctrl);

    let Err(e) = Controller::connect(&opts) else {
        panic!("connected to a deleted subsystem")
    };
    let s = e
        .nvme_status()
        .unwrap_or_else(|| panic!("not an NVMe status: {e}"));
    assert_eq!((s.sct, s.sc), (1, 0x82), "Connect Invalid Parameters: {e}");
    assert!(!s.dnr, "no Do Not Retry: the subsystem may come back ({e})");

    d.ok(&[
        "nvmf_create_subsystem",
        NQN,
        "-a",
        "-s",
        "SPDK00000000000001",
        "-d",
        "SPDK_Controller1",
    ]);
    d.ok(&["nvmf_subsystem_add_ns", NQN, "Malloc0"]);
    d.ok(&[
        "nvmf_subsystem_add_listener",
        NQN,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port.to_string(),
    ]);
    assert_perf_ok(&perf(port, 1), &d);
}

/// An RDMA transport is accepted into the configuration. On this machine
/// (no RDMA device) an RDMA listener is refused with a clear error saying
/// what is missing: live (nothing changes, the daemon keeps serving TCP) and
/// at start (nvmfd exits 1 naming the listener). Where RDMA works, a live
/// add starts serving it (tests/interop/nvmfd-rdma.sh).
#[test]
fn rdma_listener_is_refused_where_rdma_is_missing() {
    let dir = tmp_dir("rdma");
    let empty = empty_config(&dir);
    let port = free_port();
    let mut d = Daemon::start(&dir, Some(&empty), true);
    d.walkthrough(port);
    d.ok(&[
        "nvmf_create_transport",
        "-t",
        "RDMA",
        "-u",
        "8192",
        "-c",
        "8192",
    ]);
    let t = d.call("nvmf_get_transports", json!({"trtype": "RDMA"}));
    assert_eq!(t[0]["max_srq_depth"], 4096, "{t}");
    let before = d.call("save_config", json!({}));
    let state = std::fs::read(dir.join("state.json")).unwrap();
    let (ok, text) = d.cli(&[
        "nvmf_subsystem_add_listener",
        NQN,
        "-t",
        "rdma",
        "-a",
        "127.0.0.1",
        "-s",
        "4420",
    ]);
    assert!(!ok, "{text}");
    assert!(
        text.contains(
            "NVMe/RDMA listener 127.0.0.1:4420: NVMe/RDMA needs librdmacm and libibverbs"
        ),
        "{text}"
    );
    assert!(d.running(), "{}", d.logs());
    assert_eq!(d.call("save_config", json!({})), before);
    assert_eq!(std::fs::read(dir.join("state.json")).unwrap(), state);
    assert_perf_ok(&perf(port, 1), &d);
    drop(d);

    // A configuration with an RDMA listener does not start on a machine
    // without an RDMA device (this one: no rdma_rxe in its kernel), and
    // says what is missing.
    let mut cfg = before.clone();
    let nvmf = cfg["subsystems"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|s| s["subsystem"] == "nvmf")
        .unwrap();
    nvmf["config"].as_array_mut().unwrap().push(json!({
        "method": "nvmf_subsystem_add_listener",
        "params": {"nqn": NQN, "listen_address": {"trtype": "RDMA", "adrfam": "IPv4",
                   "traddr": "127.0.0.1", "trsvcid": "4420"}}
    }));
    let file = dir.join("rdma.json");
    std::fs::write(&file, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    std::fs::create_dir_all(dir.join("start")).unwrap();
    let mut d = Daemon::spawn(&dir.join("start"), Some(&file), false);
    let st = d
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("nvmfd must refuse the RDMA listener\n{}", d.logs()));
    assert_eq!(st.code(), Some(1), "{}", d.logs());
    d.wait_log("NVMe/RDMA listener 127.0.0.1:4420: NVMe/RDMA needs librdmacm and libibverbs");
}

/// `nvmf perf --json` against the walkthrough's namespace: one queue at
/// depth 1 (so nothing is left in flight when it stops), `-w WORKLOAD`
/// for `secs` → (reads, writes, bytes read, bytes written) it completed.
fn perf_counted(port: u16, workload: &str, secs: u32, d: &Daemon) -> (u64, u64, u64, u64) {
    let trid = nvmf_testkit::trid(port, NQN);
    let mut cmd = Command::new(nvmf_path());
    cmd.args(["perf", "-r", &trid, "--no-progress", "--json", "-q", "1"])
        .args(["-o", "4096", "-w", workload, "-t", &secs.to_string()]);
    let out = run_bounded(cmd, Duration::from_secs(60 + u64::from(secs)));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nvmf perf failed\n{stdout}\n{}\n--- nvmfd ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.logs()
    );
    let v: Value = serde_json::from_str(&stdout).expect("perf --json");
    let t = &v["total"];
    assert_eq!(t["error"], 0, "{t}");
    let ios = |dir: &str| {
        t[dir]["total_ios"]
            .as_u64()
            .unwrap_or_else(|| panic!("no I/O count in {t}"))
    };
    (
        ios("read"),
        ios("write"),
        t["read"]["io_bytes"].as_u64().unwrap(),
        t["write"]["io_bytes"].as_u64().unwrap(),
    )
}

/// `bdev_get_iostat` (SPDK users script against it): SPDK's shape, the
/// namespace's Reads and Writes added to its bdev and equal to what the
/// initiator did, a bdev without a namespace at zero, `names` (v26.05) and
/// `name` (older rpc.py) filtering, an unknown bdev -19, and what nvmfd
/// does not support refused with the parameter named.
#[test]
fn bdev_get_iostat_counts_the_io_done() {
    let dir = tmp_dir("iostat");
    let empty = empty_config(&dir);
    let port = free_port();
    let mut d = Daemon::start(&dir, Some(&empty), false);
    d.walkthrough(port);
    d.ok(&["bdev_malloc_create", "-b", "Malloc1", "8", "4096"]);

    let zero = d.ok(&["bdev_get_iostat"]);
    assert_eq!(zero["tick_rate"], 1_000_000_000u64, "{zero}");
    let names: Vec<&str> = zero["bdevs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Malloc0", "Malloc1"], "{zero}");
    assert_eq!(zero["bdevs"][0]["num_read_ops"], 0, "{zero}");

    let (r1, w1, br1, bw1) = perf_counted(port, "randread", 1, &d);
    let (r2, w2, br2, bw2) = perf_counted(port, "randwrite", 1, &d);
    let (reads, writes) = (r1 + r2, w1 + w2);
    assert!(
        reads > 100 && writes > 100,
        "{reads} reads, {writes} writes"
    );

    let s = d.ok(&["bdev_get_iostat", "--names", "Malloc0"]);
    assert!(
        s["ticks"].as_u64().unwrap() > zero["ticks"].as_u64().unwrap(),
        "{s}"
    );
    let list = s["bdevs"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{s}");
    let b = &list[0];
    assert_eq!(b["name"], "Malloc0", "{s}");
    assert_eq!(b["num_read_ops"], reads, "{s}");
    assert_eq!(b["num_write_ops"], writes, "{s}");
    assert_eq!(b["bytes_read"], br1 + br2, "{s}");
    assert_eq!(b["bytes_written"], bw1 + bw2, "{s}");
    assert_eq!(b["bytes_read"], reads * 4096, "{s}");
    for k in ["read_latency_ticks", "write_latency_ticks"] {
        let ticks = b[k].as_u64().unwrap();
        // 1 tick = 1 ns: between 100 ns and 1 s per I/O on average.
        let ops = if k.starts_with("read") { reads } else { writes };
        assert!(ticks > ops * 100 && ticks < ops * 1_000_000_000, "{k}: {s}");
    }
    assert_eq!(b["num_unmap_ops"], 0, "{s}");

    // Older rpc.py's `name`, through the client; the unused bdev is zero.
    let one = d.call("bdev_get_iostat", json!({"name": "Malloc1"}));
    assert_eq!(one["bdevs"][0]["name"], "Malloc1", "{one}");
    assert_eq!(one["bdevs"][0]["num_read_ops"], 0, "{one}");
    assert_eq!(one["bdevs"][0]["bytes_written"], 0, "{one}");

    let err = |params: Value| -> (i64, String) {
        let e = d
            .client()
            .call("bdev_get_iostat", Some(&params))
            .expect_err("refused");
        match e {
            nvmf_rpc::ClientError::Rpc(e) => (e.code.into(), e.message),
            other => panic!("{other:?}"),
        }
    };
    let (code, msg) = err(json!({"names": ["Malloc0", "nope"]}));
    assert_eq!(code, -19, "{msg}");
    assert!(msg.contains("\"nope\""), "{msg}");
    let (code, msg) = err(json!({"per_channel": true}));
    assert_eq!(code, -32602, "{msg}");
    assert!(msg.contains("per_channel"), "{msg}");
    let (_, msg) = err(json!({"reset_mode": "all"}));
    assert!(msg.contains("reset_mode"), "{msg}");
    let (_, msg) = err(json!({"names": "Malloc0"}));
    assert!(msg.contains("array of strings"), "{msg}");
    assert!(d.running(), "{}", d.logs());
}

/// NVMe reservations seen from the control plane: `nvmf_subsystem_add_ns
/// --ptpl-file` (kept in save_config and --state), `nvmf_ns_get_reservation`
/// showing what hosts did over NVMe/TCP (registrants, holder, type,
/// generation, PTPL), Reservation Conflicts counted in the path statistics,
/// and the reservation back after a restart from the state file.
#[test]
fn reservations_over_rpc_and_through_a_restart() {
    use nvmf_host::{ConnectOptions, Controller, TransportId};
    use nvmf_wire::command::Command;
    use nvmf_wire::opcode::IoOpcode;
    let dir = tmp_dir("resv");
    let empty = empty_config(&dir);
    let port = free_port();
    let ptpl = dir.join("Malloc0.ptpl");
    let d = Daemon::start(&dir, Some(&empty), true);
    d.ok(&["nvmf_create_transport", "-t", "TCP"]);
    d.ok(&["bdev_malloc_create", "-b", "Malloc0", "64", "512"]);
    d.ok(&["nvmf_create_subsystem", NQN, "-a"]);
    d.ok(&[
        "nvmf_subsystem_add_ns",
        NQN,
        "Malloc0",
        "-p",
        ptpl.to_str().unwrap(),
    ]);
    d.ok(&[
        "nvmf_subsystem_add_listener",
        NQN,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port.to_string(),
    ]);
    let empty_resv = d.ok(&["nvmf_ns_get_reservation", NQN, "1"]);
    assert_eq!(empty_resv["rtype"], 0, "{empty_resv}");
    assert_eq!(empty_resv["ptpl_file"], ptpl.to_str().unwrap());
    let (ok, text) = d.cli(&["nvmf_ns_get_reservation", NQN, "9"]);
    assert!(!ok && text.contains("no namespace 9"), "{text}");

    let host = |nqn: &str| {
        let trid = TransportId::parse(&nvmf_testkit::trid(port, NQN)).unwrap();
        let c = Controller::connect(&ConnectOptions::new(trid).with_hostnqn(nqn)).expect("connect");
        let q = c.create_io_queue(1, 16, 4096).expect("I/O queue");
        (c, q)
    };
    let run = |q: &mut nvmf_host::queue::IoQueue, c: Command, out: &[u8], len: u32| {
        let slot = q.alloc().unwrap();
        q.buf_mut(slot)[..out.len()].copy_from_slice(out);
        let r = q.execute(slot, c, len, Duration::from_secs(10)).unwrap();
        q.release(slot);
        r.status
    };
    let a_nqn = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0000-4000-8000-00000000000a";
    let (_ca, mut qa) = host(a_nqn);
    let mut reg = Command::new(IoOpcode::ReservationRegister as u8, 0);
    reg.set_nsid(1).set_cdw10(3 << 30);
    let mut k = 0u64.to_le_bytes().to_vec();
    k.extend_from_slice(&5u64.to_le_bytes());
    assert!(run(&mut qa, reg, &k, 16).is_success());
    let mut acq = Command::new(IoOpcode::ReservationAcquire as u8, 0);
    acq.set_nsid(1).set_cdw10(1 << 8);
    let mut k = 5u64.to_le_bytes().to_vec();
    k.extend_from_slice(&0u64.to_le_bytes());
    assert!(run(&mut qa, acq, &k, 16).is_success());

    let r = d.ok(&["nvmf_ns_get_reservation", NQN, "1"]);
    assert_eq!(
        (r["rtype"].as_u64(), r["ptpl"].as_bool()),
        (Some(1), Some(true)),
        "{r}"
    );
    assert_eq!(r["holder"], "0a0a0a0a-0000-4000-8000-00000000000a", "{r}");
    assert_eq!(r["registrants"][0]["rkey"], 5, "{r}");
    assert_eq!(r["registrants"][0]["holder"], true, "{r}");

    // Another host's write conflicts, and the statistics count it.
    let (_cb, mut qb) =
        host("nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0000-4000-8000-00000000000b");
    let mut w = Command::new(IoOpcode::Write as u8, 0);
    w.set_nsid(1).set_lba_range(0, 1);
    let st = run(&mut qb, w, &[0u8; 512], 512);
    assert_eq!((st.sct, st.sc), (0, 0x83), "{st:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = d.call("nvmf_get_path_stats", json!({}));
        if s.to_string().contains("Reservation Conflict") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no Reservation Conflict counted: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let saved = d.call("save_config", json!({}));
    assert!(
        saved
            .to_string()
            .contains(&format!(r#""ptpl_file":"{}""#, ptpl.display())),
        "{saved}"
    );
    drop((qa, qb));

    // Restart from --state: the namespace comes back with its PTPL file,
    // and the reservation with it.
    let mut d = d;
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    assert!(d
        .wait_exit(Duration::from_secs(10))
        .is_some_and(|s| s.success()));
    let d = Daemon::start(&dir, Some(&empty), true);
    let again = d.ok(&["nvmf_ns_get_reservation", NQN, "1"]);
    assert_eq!(again["rtype"], 1, "{again}");
    assert_eq!(again["registrants"], r["registrants"], "{again}");
}

/// A state file of today's format 0 (nvmf-rpc's golden file, written before files carried a
/// format version) restores and serves under this version; the next change rewrites it in
/// the current format; a state file of a newer format (a downgrade) stops nvmfd at start
/// with a message naming both versions, and the file is left as it was.
#[test]
fn an_old_state_file_is_served_and_a_newer_format_is_refused() {
    let dir = tmp_dir("golden");
    let golden = include_str!("../../nvmf-rpc/tests/golden/state-format0.json");
    // Its key and backing file, and free ports instead of the fixed ones.
    std::fs::write(
        dir.join("host.key"),
        "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("host.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::File::create(dir.join("disk.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let mut text = golden.replace("/tmp/golden/", &format!("{}/", dir.display()));
    for p in ["4420", "4421", "8009"] {
        text = text.replace(&format!("\"{p}\""), &format!("\"{}\"", free_port()));
    }
    let state = dir.join("state.json");
    std::fs::write(&state, &text).unwrap();

    let d = Daemon::start(&dir, None, true);
    let subs = d.call("nvmf_get_subsystems", json!({}));
    let g1 = subs
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["nqn"] == "nqn.2016-06.io.nvmfd:golden1")
        .unwrap_or_else(|| panic!("golden1 not served: {subs}"));
    assert_eq!(g1["namespaces"].as_array().unwrap().len(), 2, "{g1}");
    assert_eq!(
        std::fs::read_to_string(&state).unwrap(),
        text,
        "not rewritten at start"
    );
    d.call(
        "bdev_malloc_create",
        json!({"name": "M9", "num_blocks": 2048, "block_size": 512}),
    );
    let now: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(
        now["nvmfd"]["format"],
        json!(nvmf_config::FORMAT_VERSION),
        "{now}"
    );
    drop(d);

    let mut newer = now.clone();
    newer["nvmfd"] = json!({"format": nvmf_config::FORMAT_VERSION + 1, "version": "99.0.0"});
    let newer = serde_json::to_string_pretty(&newer).unwrap();
    std::fs::write(&state, &newer).unwrap();
    let mut d = Daemon::spawn(&dir, None, true);
    let st = d.wait_exit(Duration::from_secs(20));
    assert!(
        st.is_some_and(|s| !s.success()),
        "nvmfd must refuse a newer state file: {st:?}\n{}",
        d.logs()
    );
    let log = d.logs();
    assert!(
        log.contains("99.0.0") && log.contains("Refusing to misread") && log.contains("state.json"),
        "{log}"
    );
    assert_eq!(
        std::fs::read_to_string(&state).unwrap(),
        newer,
        "left as it was"
    );
}
