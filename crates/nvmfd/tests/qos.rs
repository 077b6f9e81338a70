//! QoS rate limits per bdev (`bdev_set_qos_limit`, docs/QOS.md) on the real
//! daemon over TCP: `nvmfd -m 0,1` (two reactors), one controller whose 4
//! I/O queues (split 2 + 2 over the reactors by placement) keep 16 Reads and
//! Writes each outstanding on namespace 1 (bdev Malloc0, limited), and a 5th
//! queue on namespace 2 (bdev Malloc1, no limit) at the same time. Rates are
//! measured from the initiator over a fixed window after a warm-up:
//! - `rw_ios_per_sec` 5000 with 4 KiB I/O (writes in the capsule): within
//!   ±5 %, while the unlimited bdev runs much faster;
//! - a live change to 2000 takes effect within a second (measured from one
//!   second after the call);
//! - `rw_mbytes_per_sec` 8 (IOPS limit off) with 16 KiB I/O (writes through
//!   R2T): within ±5 % in bytes;
//! - turning every limit off lets the bdev run free again;
//! - no command fails, and `bdev_get_iostat` counts throttled commands.
//!
//! Also: `assigned_rate_limits` in `bdev_get_bdevs`, the errors of bad
//! calls, the `save_config` entry and a restart from `--state` that keeps
//! the limits.

use nvmf_host::controller::{ConnectOptions, Controller};
use nvmf_host::queue::IoQueue;
use nvmf_host::trid::TransportId;
use nvmf_rpc::RpcClient;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.nvmfd:qos";
/// 8 MiB of 512-byte blocks per bdev.
const NS_BLOCKS: u64 = 16384;
/// Outstanding commands per queue.
const QD: usize = 16;

fn config(port: u16) -> String {
    let l =
        format!(r#"{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}"#);
    format!(
        r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":{NS_BLOCKS}}}}},
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc1","block_size":512,"num_blocks":{NS_BLOCKS}}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP","in_capsule_data_size":4096,"max_io_size":131072}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true,"serial_number":"NVMFDQOS000001"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":2,"bdev_name":"Malloc1"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{l}}}}}
 ]}}]}}"#
    )
}

fn start(args: &[&str]) -> nvmf_testkit::Daemon {
    nvmf_testkit::Daemon::start_on_free_port(|port| {
        nvmf_testkit::Daemon::builder(config(port))
            .args(["-m", "0,1"])
            .args(args)
            .listening(&[port])
            .ready_when(&format!("listening on 127.0.0.1:{port} (tcp)"))
            .ready_within(Duration::from_secs(10))
    })
}

fn call(d: &nvmf_testkit::Daemon, method: &str, params: Value) -> Result<Value, String> {
    let mut c = RpcClient::connect(&d.rpc_socket, 50).expect("connect to the RPC socket");
    c.set_timeout(Some(Duration::from_secs(10))).unwrap();
    c.call(method, Some(&params)).map_err(|e| format!("{e}"))
}

fn ok(d: &nvmf_testkit::Daemon, method: &str, params: Value) -> Value {
    call(d, method, params.clone()).unwrap_or_else(|e| panic!("{method} {params}: {e}"))
}

/// What one queue's driver thread counts.
#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

/// Load on a set of queues: each thread keeps `QD` commands outstanding,
/// Writes and Reads alternating, of `io_len` bytes (changeable).
struct Load {
    stop: Arc<AtomicBool>,
    io_len: Arc<AtomicU32>,
    counts: Vec<Arc<Counts>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(queues: Vec<(IoQueue, u32)>, io_len: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let len = Arc::new(AtomicU32::new(io_len));
        let mut counts = Vec::new();
        let mut threads = Vec::new();
        for (q, nsid) in queues {
            let c = Arc::new(Counts::default());
            counts.push(c.clone());
            let (stop, len) = (stop.clone(), len.clone());
            threads.push(std::thread::spawn(move || drive(q, nsid, &stop, &len, &c)));
        }
        Load {
            stop,
            io_len: len,
            counts,
            threads,
        }
    }

    /// (commands, bytes, errors) of queues `range` so far.
    fn sample(&self, range: std::ops::Range<usize>) -> (u64, u64, u64) {
        self.counts[range].iter().fold((0, 0, 0), |a, c| {
            (
                a.0 + c.ops.load(Relaxed),
                a.1 + c.bytes.load(Relaxed),
                a.2 + c.errors.load(Relaxed),
            )
        })
    }

    fn stop(self) {
        self.stop.store(true, Relaxed);
        for t in self.threads {
            t.join().expect("driver thread");
        }
    }
}

fn drive(mut q: IoQueue, nsid: u32, stop: &AtomicBool, len: &AtomicU32, c: &Counts) {
    let mut k: u64 = 0;
    let submit = |q: &mut IoQueue, s, k: u64| {
        let len = len.load(Relaxed);
        let nlb = u64::from(len / 512);
        let lba = (k * nlb) % (NS_BLOCKS - nlb);
        let r = if k.is_multiple_of(2) {
            q.submit_write(s, nsid, lba, nlb as u32, len)
        } else {
            q.submit_read(s, nsid, lba, nlb as u32, len)
        };
        r.expect("submit");
        len
    };
    let mut lens = std::collections::HashMap::new();
    for _ in 0..QD {
        let s = q.alloc().expect("free slot");
        lens.insert(s, submit(&mut q, s, k));
        k += 1;
    }
    let mut outstanding = QD;
    let deadline = |_: ()| Instant::now() + Duration::from_secs(20);
    let mut drain_until = None;
    while outstanding > 0 {
        if stop.load(Relaxed) && drain_until.is_none() {
            drain_until = Some(deadline(()));
        }
        if drain_until.is_some_and(|t| Instant::now() > t) {
            panic!("queue {}: {outstanding} commands never completed", q.qid());
        }
        q.poll(Some(Duration::from_millis(50)))
            .expect("queue failed");
        while let Some(done) = q.next_completion() {
            if !done.status.is_success() {
                c.errors.fetch_add(1, Relaxed);
            }
            c.ops.fetch_add(1, Relaxed);
            c.bytes.fetch_add(u64::from(lens[&done.slot]), Relaxed);
            if drain_until.is_some() {
                q.release(done.slot);
                outstanding -= 1;
            } else {
                lens.insert(done.slot, submit(&mut q, done.slot, k));
                k += 1;
            }
        }
    }
}

/// Commands and bytes per second of queues `range` over `window`.
fn rate(l: &Load, range: std::ops::Range<usize>, window: Duration) -> (f64, f64) {
    let (o0, b0, _) = l.sample(range.clone());
    let t0 = Instant::now();
    std::thread::sleep(window);
    let (o1, b1, _) = l.sample(range);
    let s = t0.elapsed().as_secs_f64();
    ((o1 - o0) as f64 / s, (b1 - b0) as f64 / s)
}

fn assert_within(what: &str, got: f64, want: f64) {
    let err = (got - want) / want;
    eprintln!("{what}: {got:.0} (limit {want:.0}, {:+.2} %)", err * 100.0);
    assert!(
        err.abs() <= 0.05,
        "{what}: measured {got:.0}, limit {want:.0} ({:+.1} %, allowed ±5 %)",
        err * 100.0
    );
}

#[test]
fn limits_hold_across_queues_and_reactors_and_change_live() {
    let d = start(&[]);
    let trid = TransportId::tcp("127.0.0.1", &d.port().to_string(), NQN);
    let ctrl = Controller::connect(&ConnectOptions::new(trid)).expect("connect");
    assert!(ctrl.set_num_queues(5).expect("Number of Queues") >= 5);
    let queues: Vec<(IoQueue, u32)> = (1..=5u16)
        .map(|qid| {
            let q = ctrl
                .create_io_queue(qid, QD as u16, 16384)
                .expect("I/O queue");
            (q, if qid <= 4 { 1 } else { 2 })
        })
        .collect();
    // The four limited queues are on both reactors.
    let qp = ok(&d, "nvmf_subsystem_get_qpairs", json!({ "nqn": NQN }));
    let threads: std::collections::HashSet<&str> = qp
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["qid"].as_u64().is_some_and(|i| (1..=4).contains(&i)))
        .map(|q| q["thread"].as_str().unwrap())
        .collect();
    assert_eq!(threads.len(), 2, "4 queues over 2 reactors: {qp}");

    ok(
        &d,
        "bdev_set_qos_limit",
        json!({ "name": "Malloc0", "rw_ios_per_sec": 5000 }),
    );
    let load = Load::start(queues, 4096);
    let warm = Duration::from_millis(700);
    let window = Duration::from_secs(3);

    // 1. 5000 IOPS on Malloc0 over 4 queues and 2 reactors; Malloc1 free.
    std::thread::sleep(warm);
    let (o0, _, _) = load.sample(4..5);
    let t0 = Instant::now();
    let (iops, _) = rate(&load, 0..4, window);
    let free = (load.sample(4..5).0 - o0) as f64 / t0.elapsed().as_secs_f64();
    assert_within("rw_ios_per_sec 5000", iops, 5000.0);
    eprintln!("unlimited bdev meanwhile: {free:.0} IOPS on one queue");
    assert!(
        free > 2.0 * 5000.0,
        "the unlimited bdev is slowed down: {free:.0} IOPS"
    );

    // 2. A live change takes effect within a second.
    ok(
        &d,
        "bdev_set_qos_limit",
        json!({ "name": "Malloc0", "rw_ios_per_sec": 2000 }),
    );
    std::thread::sleep(Duration::from_secs(1));
    let (iops, _) = rate(&load, 0..4, Duration::from_secs(2));
    assert_within("rw_ios_per_sec 2000 (1 s after the change)", iops, 2000.0);

    // 3. Bandwidth: 8 MiB/s of 16 KiB Reads and Writes (through R2T).
    load.io_len.store(16384, Relaxed);
    ok(
        &d,
        "bdev_set_qos_limit",
        json!({ "name": "Malloc0", "rw_ios_per_sec": 0, "rw_mbytes_per_sec": 8 }),
    );
    std::thread::sleep(warm + Duration::from_millis(300));
    let (_, bps) = rate(&load, 0..4, window);
    assert_within("rw_mbytes_per_sec 8 (bytes/s)", bps, 8.0 * 1048576.0);

    // 4. Off: free again.
    ok(
        &d,
        "bdev_set_qos_limit",
        json!({ "name": "Malloc0", "rw_mbytes_per_sec": 0 }),
    );
    std::thread::sleep(Duration::from_millis(300));
    let (iops, _) = rate(&load, 0..4, Duration::from_secs(1));
    eprintln!("no limit: {iops:.0} IOPS of 16 KiB");
    assert!(
        iops > 1.5 * 512.0,
        "still limited after turning it off: {iops:.0}"
    );

    let (ops, _, errors) = load.sample(0..5);
    load.stop();
    assert_eq!(errors, 0, "no command may fail ({ops} completed)");
    let st = ok(&d, "bdev_get_iostat", json!({ "name": "Malloc0" }));
    let throttled = st["bdevs"][0]["qos_throttled_ios"].as_u64().unwrap();
    assert!(throttled > 1000, "throttled commands counted: {st}");
    let st = ok(&d, "bdev_get_iostat", json!({ "name": "Malloc1" }));
    assert_eq!(st["bdevs"][0]["qos_throttled_ios"], 0, "{st}");
    drop(ctrl);
}

fn tmp_dir(tag: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("nvmfd-qos-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn limits_of(d: &nvmf_testkit::Daemon, bdev: &str) -> Value {
    let b = ok(d, "bdev_get_bdevs", json!({ "name": bdev }));
    b[0]["assigned_rate_limits"].clone()
}

#[test]
fn limits_are_shown_checked_saved_and_kept_across_a_restart() {
    let dir = tmp_dir("state");
    let state = dir.join("state.json");
    let st = state.to_str().unwrap();
    let d = start(&["--state", st]);
    assert_eq!(
        limits_of(&d, "Malloc0"),
        json!({"rw_ios_per_sec": 0, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 0})
    );
    // Through the CLI, as rpc.py's options; rounded up to 3000.
    d.rpc_ok(&[
        "bdev_set_qos_limit",
        "Malloc0",
        "--rw-ios-per-sec",
        "2500",
        "--w-mbytes-per-sec",
        "20",
    ]);
    let want = json!({"rw_ios_per_sec": 3000, "rw_mbytes_per_sec": 0, "r_mbytes_per_sec": 0, "w_mbytes_per_sec": 20});
    assert_eq!(limits_of(&d, "Malloc0"), want);
    // Bad calls change nothing and say why.
    for (p, code, text) in [
        (
            json!({"name": "Nope", "rw_ios_per_sec": 1000}),
            -19,
            "no bdev named \"Nope\"",
        ),
        (json!({"name": "Malloc0"}), -32602, "no rate limit given"),
        (
            json!({"name": "Malloc0", "rw_ios_per_sec": -5}),
            -32602,
            "rw_ios_per_sec",
        ),
        (
            json!({"name": "Malloc0", "r_mbytes_per_sec": 1u64 << 50}),
            -32602,
            "too large",
        ),
    ] {
        let e = call(&d, "bdev_set_qos_limit", p.clone()).unwrap_err();
        assert!(e.contains(text), "{p}: {e}");
        assert!(e.contains(&code.to_string()), "{p}: {e}");
    }
    assert_eq!(limits_of(&d, "Malloc0"), want);
    // save_config: the entry right after the bdev's creation.
    let saved = ok(&d, "save_config", json!({}));
    let bdev = saved["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["subsystem"] == "bdev")
        .unwrap();
    let methods: Vec<(&str, &str)> = bdev["config"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["method"].as_str().unwrap(),
                e["params"]["name"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let i = methods
        .iter()
        .position(|m| *m == ("bdev_malloc_create", "Malloc0"))
        .unwrap();
    assert_eq!(methods[i + 1], ("bdev_set_qos_limit", "Malloc0"), "{bdev}");
    assert!(
        !methods.contains(&("bdev_set_qos_limit", "Malloc1")),
        "{bdev}"
    );
    // The saved document loads into another daemon with the same limits.
    let cfg = dir.join("saved.json");
    std::fs::write(&cfg, saved.to_string()).unwrap();
    let port = d.port();
    drop(d);

    // Restart from the state file (which keeps the listener's port).
    let d = nvmf_testkit::Daemon::builder(config(port))
        .args(["-m", "0,1", "--state", st])
        .listening(&[port])
        .ready_when(&format!("listening on 127.0.0.1:{port} (tcp)"))
        .ready_within(Duration::from_secs(10))
        .start();
    assert_eq!(limits_of(&d, "Malloc0"), want);
    // And the limit is enforced after the restart.
    let trid = TransportId::tcp("127.0.0.1", &d.port().to_string(), NQN);
    let ctrl = Controller::connect(&ConnectOptions::new(trid)).expect("connect");
    let q = ctrl.create_io_queue(1, QD as u16, 4096).expect("I/O queue");
    let load = Load::start(vec![(q, 1)], 4096);
    std::thread::sleep(Duration::from_millis(500));
    let (iops, _) = rate(&load, 0..1, Duration::from_secs(1));
    load.stop();
    assert!(
        iops < 3000.0 * 1.1,
        "{iops:.0} IOPS after restart, limit 3000"
    );
    drop(ctrl);
    drop(d);
    loaded_from_file(&cfg, &want);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A daemon started with the saved document as its config file.
fn loaded_from_file(cfg: &Path, want: &Value) {
    let text = std::fs::read_to_string(cfg).unwrap();
    let d = nvmf_testkit::Daemon::start_on_free_port(|port| {
        // The saved listener's port is the old daemon's: use a new one.
        let v: Value = serde_json::from_str(&text).unwrap();
        let s = v.to_string();
        let l = "\"trsvcid\":\"";
        let at = s.find(l).unwrap() + l.len();
        let end = at + s[at..].find('"').unwrap();
        let old = &s[at..end];
        let s = s.replace(&format!("{l}{old}\""), &format!("{l}{port}\""));
        nvmf_testkit::Daemon::builder(s)
            .args(["-m", "0"])
            .listening(&[port])
            .ready_when(&format!("listening on 127.0.0.1:{port} (tcp)"))
            .ready_within(Duration::from_secs(10))
    });
    assert_eq!(&limits_of(&d, "Malloc0"), want);
}
