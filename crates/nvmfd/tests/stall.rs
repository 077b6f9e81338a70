//! Stall hunt: many short `nvmf perf` runs against the real daemon (two
//! reactors, malloc and null namespaces) with mixed I/O sizes (512 B to
//! 128 KiB, in-capsule and R2T writes), queue depths 1 to 128, digests on
//! and off, the initiator busy-polling or sleeping, two runs at a time,
//! while another thread keeps the JSON-RPC control plane busy (stats,
//! qpair listings, namespace add/remove, bdev create/delete). Every run
//! must finish cleanly and no single I/O may take longer than `MAX_LAT`:
//! a lost wake-up in the reactor or the initiator shows up as an I/O stuck
//! until some unrelated event (a 100 ms tick, the next RPC, ...). This is
//! a behaviour check ("no command stuck"), not a performance assertion.
//! On failure the message carries the kernel's TCP retransmission counters
//! so a stall caused by the network stack (RTO backoff) can be told apart.
//!
//! Also here (same daemon harness): an idle daemon uses no CPU after I/O
//! (adaptive polling stops), and the handshake limits close connections
//! that never send ICReq or never Connect, but not connected ones.

use nvmf_testkit::bins::nvmf as nvmf_path;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_rpc::RpcClient;
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:stall";
/// Longest acceptable single I/O (the target and initiator are on the same
/// small machine; a healthy run stays far below this even under load).
const MAX_LAT: Duration = Duration::from_secs(2);
/// Namespace size in 512-byte blocks (32 MiB).
const BLOCKS: u64 = 65536;

fn config(port: u16) -> String {
    let listen = |nqn: &str| {
        json!({"method": "nvmf_subsystem_add_listener", "params": {"nqn": nqn,
            "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                               "trsvcid": port.to_string()}}})
    };
    json!({"subsystems": [
        {"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create",
             "params": {"name": "Malloc0", "num_blocks": BLOCKS, "block_size": 512}},
            {"method": "bdev_null_create",
             "params": {"name": "Null0", "num_blocks": BLOCKS, "block_size": 512}}
        ]},
        {"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
            {"method": "nvmf_create_subsystem",
             "params": {"nqn": NQN, "serial_number": "STALL0001", "allow_any_host": true}},
            {"method": "nvmf_subsystem_add_ns",
             "params": {"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "nsid": 1}}},
            {"method": "nvmf_subsystem_add_ns",
             "params": {"nqn": NQN, "namespace": {"bdev_name": "Null0", "nsid": 2}}},
            listen(NQN)
        ]}
    ]})
    .to_string()
}

/// A running nvmfd (nvmf-testkit's: killed on drop, config and socket
/// removed).
struct Daemon {
    nvmfd: nvmf_testkit::Daemon,
    port: u16,
    sock: PathBuf,
}

impl std::ops::Deref for Daemon {
    type Target = nvmf_testkit::Daemon;
    fn deref(&self) -> &nvmf_testkit::Daemon {
        &self.nvmfd
    }
}

impl Daemon {
    fn start(extra: &[&str]) -> Daemon {
        let nvmfd = nvmf_testkit::Daemon::start_on_free_port(|port| {
            nvmf_testkit::Daemon::builder(config(port))
                .args(["-m", "0,1"])
                .args(extra)
                .env("NO_COLOR", "1")
                .listening(&[port])
                .ready_when("RPC server listening on")
        });
        Daemon {
            port: nvmfd.port(),
            sock: nvmfd.rpc_socket.clone(),
            nvmfd,
        }
    }

    fn trid(&self) -> String {
        nvmf_testkit::trid(self.port, NQN)
    }
}

/// Kernel TCP counters that show retransmission timeouts (a stall outside
/// nvmfd) — for the failure message.
fn tcp_counters() -> String {
    let mut out = Vec::new();
    for f in ["/proc/net/snmp", "/proc/net/netstat"] {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.chunks(2) {
            if pair.len() < 2 {
                continue;
            }
            for (k, v) in pair[0].split_whitespace().zip(pair[1].split_whitespace()) {
                if matches!(
                    k,
                    "RetransSegs" | "TCPTimeouts" | "TCPLossProbes" | "TCPLostRetransmit"
                ) {
                    out.push(format!("{k}={v}"));
                }
            }
        }
    }
    out.join(" ")
}

/// One perf run's parameters.
#[derive(Debug, Clone)]
struct Run {
    nsid: u32,
    size: u32,
    qd: u16,
    digests: bool,
    workload: &'static str,
    verify: bool,
    in_capsule: Option<u32>,
    queues: u16,
    poll_us: u32,
}

fn runs() -> Vec<Run> {
    let sizes = [512u32, 4096, 8192, 16384, 65536, 131072];
    let qds = [1u16, 8, 32, 128, 4, 64];
    let mut v = Vec::new();
    for i in 0..12usize {
        let size = sizes[i % sizes.len()];
        let qd = qds[(i * 5 + 1) % qds.len()];
        let workload = ["randrw", "randread", "write", "randwrite"][i % 4];
        v.push(Run {
            nsid: if i % 3 == 2 { 2 } else { 1 },
            size,
            qd,
            digests: i % 2 == 1,
            workload,
            // Verify needs writes and is pointless on the null bdev.
            verify: i % 3 != 2 && workload != "randread" && i % 4 == 0,
            in_capsule: if i % 5 == 3 { Some(0) } else { None },
            queues: if i % 4 == 1 { 2 } else { 1 },
            poll_us: if i % 2 == 0 { 0 } else { 1000 },
        });
    }
    v
}

/// Runs one `nvmf perf -t 1 --json` and checks it: exit 0, no errors, no
/// lost I/Os, max latency below MAX_LAT. Returns a description of the
/// problem, if any.
fn perf_once(d: &Daemon, r: &Run) -> Result<(u64, u64), String> {
    let mut cmd = Command::new(nvmf_path());
    cmd.args([
        "perf",
        "-r",
        &d.trid(),
        "-t",
        "1",
        "--json",
        "--no-progress",
    ])
    .args(["--ns", &r.nsid.to_string()])
    .args(["-o", &r.size.to_string(), "-q", &r.qd.to_string()])
    .args(["-w", r.workload, "-M", "70"])
    .args(["--queues", &r.queues.to_string()])
    .args(["--poll-us", &r.poll_us.to_string()]);
    if r.digests {
        cmd.args(["--hdr-digest", "--data-digest"]);
    }
    if r.verify {
        cmd.arg("--verify");
    }
    if let Some(n) = r.in_capsule {
        cmd.args(["--in-capsule", &n.to_string()]);
    }
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn nvmf perf: {e}"))?;
    // 1 s run + drain + verify read-back; a stuck I/O would hold it 10 s+.
    let limit = Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{r:?}: nvmf perf ran past {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{r:?}: nvmf perf failed ({}): {}\n{stdout}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v: Value = serde_json::from_str(&stdout).map_err(|e| format!("{r:?}: json: {e}"))?;
    let errors = v["total"]["error"].as_u64().unwrap_or(u64::MAX);
    let failures = v["failures"].as_array().map_or(0, |a| a.len());
    let mut ios = 0;
    let mut max = 0;
    for dir in ["read", "write"] {
        ios += v["total"][dir]["total_ios"].as_u64().unwrap_or(0);
        max = max.max(v["total"][dir]["lat_ns"]["max"].as_u64().unwrap_or(0));
    }
    if errors != 0 || failures != 0 || ios == 0 {
        return Err(format!(
            "{r:?}: errors {errors}, failures {:?}, {ios} I/Os",
            v["failures"]
        ));
    }
    if max > MAX_LAT.as_nanos() as u64 {
        return Err(format!(
            "{r:?}: an I/O took {:.3} s (limit {MAX_LAT:?}) over {ios} I/Os",
            max as f64 / 1e9
        ));
    }
    Ok((ios, max))
}

/// Keeps the control plane busy until `stop`: reads (stats, qpairs,
/// controllers) and changes (a malloc bdev and namespace 9 come and go).
fn rpc_churn(sock: PathBuf, stop: Arc<AtomicBool>, calls: Arc<AtomicU64>) -> Result<(), String> {
    let mut c = RpcClient::connect(&sock, 50).map_err(|e| format!("rpc connect: {e}"))?;
    c.set_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let (m, p) = match i % 7 {
            0 => ("nvmf_get_stats", json!({})),
            1 => ("nvmf_subsystem_get_qpairs", json!({"nqn": NQN})),
            2 => (
                "bdev_malloc_create",
                json!({"name": "Churn0", "num_blocks": 2048, "block_size": 512}),
            ),
            3 => (
                "nvmf_subsystem_add_ns",
                json!({"nqn": NQN, "namespace": {"bdev_name": "Churn0", "nsid": 9}}),
            ),
            4 => ("nvmf_subsystem_get_controllers", json!({"nqn": NQN})),
            5 => ("nvmf_subsystem_remove_ns", json!({"nqn": NQN, "nsid": 9})),
            _ => ("bdev_malloc_delete", json!({"name": "Churn0"})),
        };
        c.call(m, Some(&p)).map_err(|e| format!("{m}: {e:?}"))?;
        calls.fetch_add(1, Ordering::Relaxed);
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

#[test]
fn no_io_stuck_under_mixed_load_and_rpc() {
    let d = Daemon::start(&[]);
    let before = tcp_counters();
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let churn = {
        let (sock, stop, calls) = (d.sock.clone(), stop.clone(), calls.clone());
        std::thread::spawn(move || rpc_churn(sock, stop, calls))
    };
    let all = runs();
    let mut problems = Vec::new();
    let mut total = 0u64;
    let mut worst = 0u64;
    // Two perf processes at a time (their queues land on both reactors).
    for pair in all.chunks(2) {
        let results: Vec<Result<(u64, u64), String>> = std::thread::scope(|s| {
            let hs: Vec<_> = pair
                .iter()
                .map(|r| {
                    let d = &d;
                    s.spawn(move || perf_once(d, r))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            match r {
                Ok((ios, max)) => {
                    total += ios;
                    worst = worst.max(max);
                }
                Err(e) => problems.push(e),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let churn = churn.join().unwrap();
    let after = tcp_counters();
    eprintln!(
        "stall test: {} runs, {total} I/Os, worst latency {:.1} ms, {} RPC calls; \
         TCP before: {before}; after: {after}",
        all.len(),
        worst as f64 / 1e6,
        calls.load(Ordering::Relaxed)
    );
    assert!(
        problems.is_empty() && churn.is_ok(),
        "stuck or failed I/O: {problems:#?}\nrpc: {churn:?}\nTCP counters before: {before}\n\
         after: {after}\n--- nvmfd ---\n{}",
        d.logs()
    );
    assert!(
        calls.load(Ordering::Relaxed) > 10,
        "the RPC churn did not run"
    );
}

/// utime + stime of a process in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields overall.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Adaptive polling must not turn into always-polling: after I/O, with a
/// connection still open (admin keep-alive only) and with none, an idle
/// daemon uses about no CPU.
#[test]
fn idle_daemon_uses_no_cpu_after_io() {
    // A long window, so that a reactor which never stopped polling would
    // clearly show.
    let d = Daemon::start(&["--poll-us", "1000"]);
    let r = Run {
        nsid: 2,
        size: 4096,
        qd: 1,
        digests: false,
        workload: "randread",
        verify: false,
        in_capsule: None,
        queues: 2,
        poll_us: 1000,
    };
    perf_once(&d, &r).unwrap();
    // Idle with no connection.
    std::thread::sleep(Duration::from_millis(200));
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let t0 = cpu_ticks(d.pid());
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let used = (cpu_ticks(d.pid()) - t0) as f64 / hz;
    let share = used / start.elapsed().as_secs_f64();
    assert!(
        share < 0.05,
        "idle nvmfd used {:.1}% of a core over 2 s after I/O",
        share * 100.0
    );

    // Idle with an open connection (its reactor wakes for the 100 ms tick).
    let mut c = RpcClient::connect(&d.sock, 50).unwrap();
    c.call("nvmf_get_stats", None).unwrap();
    let held = std::net::TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = cpu_ticks(d.pid());
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let used = (cpu_ticks(d.pid()) - t0) as f64 / hz;
    let share = used / start.elapsed().as_secs_f64();
    drop(held);
    assert!(
        share < 0.05,
        "nvmfd with an idle connection used {:.1}% of a core over 2 s",
        share * 100.0
    );
}

/// Reads until the peer closes (EOF or reset) or `limit` passes; returns
/// how long that took, None on timeout. Data read is discarded.
fn wait_closed(s: &mut std::net::TcpStream, limit: Duration) -> Option<Duration> {
    use std::io::Read;
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = [0u8; 512];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

#[test]
fn handshake_limits_close_silent_connections() {
    use std::io::{Read, Write};
    // The Connect limit is well below the 1 s perf run at the end, so a
    // limit that also hit connected queues would cut that run short.
    let d = Daemon::start(&["--icreq-timeout-ms", "300", "--connect-timeout-ms", "600"]);
    // 1. TCP only, no ICReq.
    let mut silent = std::net::TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    // 2. ICReq, then nothing (no Connect).
    let mut half = std::net::TcpStream::connect(("127.0.0.1", d.port)).unwrap();
    let mut req = Vec::new();
    nvmf_wire::pdu::encode_ic_req(&mut req, 0, false, false, 0);
    half.write_all(&req).unwrap();
    let mut resp = [0u8; 128];
    half.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    half.read_exact(&mut resp).unwrap();
    assert_eq!(resp[0], 1, "ICResp expected");

    let t = wait_closed(&mut silent, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("a connection without ICReq stayed open:\n{}", d.logs()));
    assert!(t < Duration::from_secs(3), "closed only after {t:?}");
    let t2 = wait_closed(&mut half, Duration::from_secs(8))
        .unwrap_or_else(|| panic!("a connection without Connect stayed open:\n{}", d.logs()));
    assert!(
        t2 + t >= Duration::from_millis(500),
        "closed too early: {t2:?}"
    );
    // (the log line may reach us just after the close does)
    d.wait_log("no ICReq within");
    d.wait_log("no Fabrics Connect within");

    // Connected queues are not affected: a run longer than both limits.
    let r = Run {
        nsid: 1,
        size: 4096,
        qd: 4,
        digests: false,
        workload: "randrw",
        verify: true,
        in_capsule: None,
        queues: 1,
        poll_us: 0,
    };
    let mut cmd_ok = perf_once(&d, &r);
    if let Err(e) = &cmd_ok {
        cmd_ok = Err(format!("{e}\n{}", d.logs()));
    }
    cmd_ok.unwrap();
    let logs = d.logs();
    assert_eq!(
        logs.matches("no Fabrics Connect within").count(),
        1,
        "a connected queue was closed by the Connect limit:\n{logs}"
    );
}
