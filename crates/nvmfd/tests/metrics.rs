//! Per-path observability against the real daemon: one subsystem with one
//! RAM namespace served on two listeners, `--metrics` on.
//! - `nvmf perf` through one listener raises that listener's counters and
//!   latency histograms only; then through the other, both have counts and
//!   the first's stay where they were (`nvmf_get_path_stats`,
//!   `nvmf_get_stats` `listeners`);
//! - `GET /metrics` (OpenMetrics content type, `# EOF`) carries the same
//!   values with the subsystem / listener / host / cntlid / namespace labels;
//! - bad HTTP: unknown path 404, other method 405, garbage 400, an
//!   oversized head 431, a client that never finishes its request is cut
//!   off within the time limit and the endpoint keeps answering;
//! - `nvmf top --once` shows IOPS on the busy listener and flags a path
//!   with a command stuck waiting for its data (never sent) as STALLED;
//!   `nvmf_subsystem_get_qpairs` shows that command in flight on its queue;
//! - controllers coming and going (hundreds of connect / write /
//!   disconnect cycles, most with a host NQN of their own) leave a bounded
//!   exposition and path table: gone controllers fold into `cntlid="closed"`
//!   per host, at most `GONE_HOSTS_MAX` hosts per listener then
//!   `host="other"`; the totals still add up to what was done and no
//!   series goes backwards between scrapes.

use nvmf_host::{ConnectOptions, Controller, TransportId};
use nvmf_rpc::RpcClient;
use nvmf_testkit::{bins::nvmf as nvmf_path, free_port, run_bounded};
use nvmf_wire::command::Command as NvmeCommand;
use nvmf_wire::opcode::IoOpcode;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2016-06.io.spdk:metrics";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000beef";

/// A running nvmfd (nvmf-testkit's: killed on drop, its config and socket
/// removed) with two listeners and the metrics endpoint.
struct Daemon {
    nvmfd: nvmf_testkit::Daemon,
    ports: [u16; 2],
    metrics: u16,
    sock: PathBuf,
}

impl Daemon {
    fn start() -> Daemon {
        let ports = [free_port(), free_port()];
        let metrics = free_port();
        let listener = |p: u16| {
            format!(
                r#"{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{p}"}}}}}}"#
            )
        };
        let cfg = format!(
            r#"{{"subsystems":[{{"subsystem":"bdev","config":[{{"method":"bdev_malloc_create","params":{{"name":"M0","num_blocks":32768,"block_size":512}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"M0"}}}}}},
{},{}]}}]}}"#,
            listener(ports[0]),
            listener(ports[1])
        );
        let nvmfd = nvmf_testkit::Daemon::builder(cfg)
            .args(["-m", "0", "--metrics", &format!("127.0.0.1:{metrics}")])
            .start();
        let d = Daemon {
            sock: nvmfd.rpc_socket.clone(),
            nvmfd,
            ports,
            metrics,
        };
        d.nvmfd.wait_log("RPC server listening on");
        d.nvmfd.wait_log("metrics (Prometheus) on");
        d
    }

    fn listener(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i])
    }

    fn trid(&self, i: usize) -> String {
        format!(
            "{} hostnqn:{HOSTNQN}",
            nvmf_testkit::trid(self.ports[i], NQN)
        )
    }

    fn perf(&self, i: usize, secs: u32) {
        let mut cmd = Command::new(nvmf_path());
        cmd.args(["perf", "-r", &self.trid(i), "--no-progress"])
            .args(["-q", "8", "-o", "4096", "-w", "randrw", "-M", "50"])
            .args(["-t", &secs.to_string()]);
        let out = run_bounded(cmd, Duration::from_secs(60));
        assert!(
            out.status.success(),
            "nvmf perf: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn rpc(&self, method: &str) -> Value {
        self.rpc_with(method, None)
    }

    fn rpc_with(&self, method: &str, params: Option<Value>) -> Value {
        let mut c = RpcClient::connect(&self.sock, 10).unwrap();
        c.set_timeout(Some(Duration::from_secs(10))).unwrap();
        c.call(method, params.as_ref()).unwrap()
    }

    /// The path of listener `i` (one controller per perf run: all added).
    fn listener_totals(&self, v: &Value, i: usize) -> Totals {
        let l = self.listener(i);
        let mut t = Totals::default();
        for p in v["paths"].as_array().unwrap() {
            if p["listener"] == l.as_str() {
                assert_eq!(p["subnqn"], NQN);
                assert_eq!(p["hostnqn"], HOSTNQN);
                t.paths += 1;
                t.reads += p["reads"].as_u64().unwrap();
                t.writes += p["writes"].as_u64().unwrap();
                t.bytes_read += p["bytes_read"].as_u64().unwrap();
                t.bytes_written += p["bytes_written"].as_u64().unwrap();
                t.read_lat_count += p["read_latency"]["count"].as_u64().unwrap();
                t.write_lat_count += p["write_latency"]["count"].as_u64().unwrap();
                let ns = &p["namespaces"][0];
                assert_eq!(ns["nsid"], 1);
                assert_eq!(ns["reads"], p["reads"]);
            }
        }
        t
    }

    fn http(&self, req: &[u8]) -> (String, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).to_string();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (head.to_string(), body.to_string())
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Totals {
    paths: u64,
    reads: u64,
    writes: u64,
    bytes_read: u64,
    bytes_written: u64,
    read_lat_count: u64,
    write_lat_count: u64,
}

/// Value of the series `name{labels...}` whose labels contain all of `want`.
fn series(body: &str, name: &str, want: &[(&str, &str)]) -> Vec<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            want.iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .collect()
}

#[test]
fn per_listener_counters_rise_only_on_the_used_path_and_metrics_agree() {
    let d = Daemon::start();
    let before = d.rpc("nvmf_get_path_stats");
    assert_eq!(d.listener_totals(&before, 0), Totals::default());

    d.perf(0, 1);
    let s1 = d.rpc("nvmf_get_path_stats");
    let a1 = d.listener_totals(&s1, 0);
    let b1 = d.listener_totals(&s1, 1);
    assert!(
        a1.reads > 100 && a1.writes > 100,
        "listener 0: {a1:?}\n{s1:#}"
    );
    assert_eq!(a1.bytes_read, a1.reads * 4096, "{s1:#}");
    assert_eq!(a1.bytes_written, a1.writes * 4096);
    assert_eq!(a1.read_lat_count, a1.reads, "every read has a latency");
    assert_eq!(a1.write_lat_count, a1.writes);
    assert_eq!(b1, Totals::default(), "nothing went through listener 1");

    d.perf(1, 1);
    let s2 = d.rpc("nvmf_get_path_stats");
    let a2 = d.listener_totals(&s2, 0);
    let b2 = d.listener_totals(&s2, 1);
    assert_eq!(a2, a1, "listener 0 unchanged by I/O through listener 1");
    assert!(b2.reads > 100 && b2.writes > 100, "listener 1: {b2:?}");

    // nvmf_get_stats keeps SPDK's shape and adds per-listener totals.
    let st = d.rpc("nvmf_get_stats");
    assert!(
        st["poll_groups"][0]["transports"][0]["reads"]
            .as_u64()
            .unwrap()
            >= a2.reads + b2.reads
    );
    let ls = st["listeners"].as_array().unwrap();
    for (i, t) in [(0, a2), (1, b2)] {
        let l = ls
            .iter()
            .find(|x| x["listener"] == d.listener(i).as_str())
            .unwrap_or_else(|| panic!("no listener {i} in {st:#}"));
        assert_eq!(l["reads"].as_u64().unwrap(), t.reads);
        assert_eq!(l["bytes_written"].as_u64().unwrap(), t.bytes_written);
        assert!(l["read_latency_p99_ns"].as_u64().unwrap() > 0);
    }

    // The Prometheus endpoint says the same.
    let (head, body) = d.http(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    for (i, t) in [(0, a2), (1, b2)] {
        let l = d.listener(i);
        let labels = [
            ("subsystem", NQN),
            ("listener", l.as_str()),
            ("host", HOSTNQN),
            ("namespace", "1"),
        ];
        let sum = |name: &str| series(&body, name, &labels).iter().sum::<f64>() as u64;
        assert_eq!(sum("nvmf_ns_reads_total"), t.reads, "{body}");
        assert_eq!(sum("nvmf_ns_writes_total"), t.writes);
        assert_eq!(sum("nvmf_ns_read_bytes_total"), t.bytes_read);
        assert_eq!(sum("nvmf_ns_written_bytes_total"), t.bytes_written);
        assert_eq!(sum("nvmf_ns_read_latency_seconds_count"), t.reads);
        let inf: Vec<(&str, &str)> = labels.iter().copied().chain([("le", "+Inf")]).collect();
        assert_eq!(
            series(&body, "nvmf_ns_write_latency_seconds_bucket", &inf)
                .iter()
                .sum::<f64>() as u64,
            t.writes
        );
        assert!(series(&body, "nvmf_path_commands_total", &labels[..3])
            .iter()
            .all(|&v| v > 0.0));
    }
    assert!(body.contains("cntlid=\""), "controller ID label");
}

/// Hosts whose gone controllers keep a series of their own per listener
/// (nvmfd's `paths::GONE_HOSTS_MAX`); further ones are `host="other"`.
const GONE_HOSTS_MAX: usize = 64;

/// Every series of a family in an exposition: (labels, value).
fn family(body: &str, name: &str) -> Vec<(String, f64)> {
    body.lines()
        .filter_map(|l| l.strip_prefix(&format!("{name}{{")))
        .map(|l| {
            let (labels, v) = l.rsplit_once("} ").unwrap();
            (labels.to_string(), v.parse::<f64>().unwrap())
        })
        .collect()
}

/// One short-lived controller: connect as `host` through listener `i`,
/// one 4 KiB write on an I/O queue, disconnect.
fn connect_write_disconnect(d: &Daemon, i: usize, host: &str) {
    let trid = TransportId::parse(&nvmf_testkit::trid(d.ports[i], NQN)).unwrap();
    let ctrl = Controller::connect(&ConnectOptions::new(trid).with_hostnqn(host))
        .unwrap_or_else(|e| panic!("connect as {host}: {e}"));
    let mut q = ctrl.create_io_queue(1, 4, 4096).unwrap();
    let slot = q.alloc().unwrap();
    q.buf_mut(slot)[..4096].fill(0x5a);
    q.submit_write(slot, 1, 0, 8, 4096).unwrap();
    q.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = loop {
        q.poll(Some(Duration::from_millis(100))).unwrap();
        if let Some(c) = q.next_completion() {
            break c;
        }
        assert!(Instant::now() < deadline, "write as {host} not answered");
    };
    assert!(c.status.is_success(), "write as {host}: {:?}", c.status);
    drop(q);
    drop(ctrl);
}

#[test]
fn controllers_coming_and_going_keep_the_exposition_bounded() {
    let d = Daemon::start();
    // Cycle k: listener k % 2; every third one as HOSTNQN, the others as a
    // host of their own (240 distinct hosts, 120 per listener; 80 per
    // listener, past the cap, by the first check).
    const CYCLES: usize = 360;
    const MID: usize = 240;
    let host = |k: usize| {
        if k.is_multiple_of(3) {
            HOSTNQN.to_string()
        } else {
            format!("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-{k:012}")
        }
    };
    let all_gone = || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let v = d.rpc("nvmf_get_path_stats");
            let open: u64 = v["paths"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["qpairs"].as_u64().unwrap())
                .sum();
            if open == 0 {
                return v;
            }
            assert!(Instant::now() < deadline, "queues still open: {v:#}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let scrape = || {
        let (head, body) = d.http(b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        body
    };
    // Every check of one moment, after `done` cycles with all controllers gone.
    let check = |done: usize| -> (String, Value) {
        let v = all_gone();
        let body = scrape();
        let commands = family(&body, "nvmf_path_commands_total");
        let lines = body.lines().count();
        // Bounded: one series per (listener, host) at most, hosts capped.
        assert!(
            commands.len() <= 2 * (GONE_HOSTS_MAX + 1),
            "{} path series after {done} cycles ({lines} lines)",
            commands.len()
        );
        let paths = v["paths"].as_array().unwrap();
        assert!(
            paths.len() <= 2 * (GONE_HOSTS_MAX + 1),
            "{} nvmf_get_path_stats entries after {done} cycles",
            paths.len()
        );
        // No controller is left, so no series names one.
        assert!(
            commands
                .iter()
                .all(|(l, _)| l.contains(r#"cntlid="closed""#)),
            "a gone controller keeps its own series"
        );
        // The totals are all that was done: one 4 KiB write per cycle, and
        // every command the reactor counted.
        let sum = |name: &str| family(&body, name).iter().map(|x| x.1).sum::<f64>() as u64;
        assert_eq!(sum("nvmf_ns_writes_total"), done as u64);
        assert_eq!(sum("nvmf_ns_written_bytes_total"), done as u64 * 4096);
        let st = d.rpc("nvmf_get_stats");
        let completed: u64 = st["poll_groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["completed_nvme_io"].as_u64().unwrap())
            .sum();
        assert_eq!(sum("nvmf_path_commands_total"), completed);
        let rpc_commands: u64 = paths.iter().map(|p| p["commands"].as_u64().unwrap()).sum();
        let rpc_writes: u64 = paths.iter().map(|p| p["writes"].as_u64().unwrap()).sum();
        assert_eq!(rpc_commands, completed, "nvmf_get_path_stats commands");
        assert_eq!(rpc_writes, done as u64, "nvmf_get_path_stats writes");
        // The listener totals of nvmf_get_stats still see every write.
        let lw: u64 = st["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["writes"].as_u64().unwrap())
            .sum();
        assert_eq!(lw, done as u64);
        (body, v)
    };

    for k in 0..MID {
        connect_write_disconnect(&d, k % 2, &host(k));
    }
    let (mid, _) = check(MID);
    for k in MID..CYCLES {
        connect_write_disconnect(&d, k % 2, &host(k));
    }
    let (end, v) = check(CYCLES);

    // Past the cap nothing new appears: the same series, no more lines.
    let mid_series = family(&mid, "nvmf_path_commands_total");
    let end_series = family(&end, "nvmf_path_commands_total");
    assert_eq!(mid.lines().count(), end.lines().count(), "exposition grew");
    // Counters never go backwards for a label set that is still there.
    for (labels, before) in &mid_series {
        if let Some((_, after)) = end_series.iter().find(|(l, _)| l == labels) {
            assert!(after >= before, "{labels}: {before} -> {after}");
        }
    }
    // Hosts past the cap are folded together; HOSTNQN came first on both
    // listeners, so it has its own series there.
    for i in 0..2 {
        let l = d.listener(i);
        let on = |h: &str| {
            end_series.iter().any(|(labels, _)| {
                labels.contains(&format!(r#"listener="{l}""#))
                    && labels.contains(&format!(r#"host="{h}""#))
            })
        };
        assert!(on(HOSTNQN), "{HOSTNQN} through {l}");
        assert!(on("other"), "host=\"other\" through {l}");
    }
    let others: Vec<&Value> = v["paths"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["hostnqn"] == "other")
        .collect();
    assert_eq!(others.len(), 2, "{others:#?}");
    assert!(others.iter().all(|p| p["cntlid"] == 0 && p["qpairs"] == 0));
}

#[test]
fn metrics_endpoint_answers_bad_requests_and_stays_up() {
    let d = Daemon::start();
    let (head, _) = d.http(b"GET /nope HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    let (head, _) = d.http(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    assert!(head.contains("Allow: GET"), "{head}");
    let (head, _) = d.http(b"\x16\x03\x01 not http at all\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let mut big = b"GET /metrics HTTP/1.1\r\nX-Filler: ".to_vec();
    big.extend(std::iter::repeat_n(b'a', 9000));
    big.extend_from_slice(b"\r\n\r\n");
    let (head, _) = d.http(&big);
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
    let (head, body) = d.http(b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert!(
        head.starts_with("HTTP/1.1 200") && body.is_empty(),
        "{head}"
    );

    // A client that never finishes its request is dropped within the limit.
    let mut slow = TcpStream::connect(("127.0.0.1", d.metrics)).unwrap();
    slow.write_all(b"GET /metr").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 64];
    let n = slow.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "no answer to an unfinished request");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "cut off after {:?}",
        t.elapsed()
    );
    let (head, _) = d.http(b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // The data path was never involved: I/O still works.
    d.perf(0, 1);
}

#[test]
fn nvmf_top_once_shows_the_busy_path_and_flags_a_stalled_one() {
    let d = Daemon::start();
    // Listener 1: a 64 KiB write whose data (R2T) the host never sends.
    let mut trid = TransportId::parse(&d.trid(1)).unwrap();
    trid.hostnqn = Some(HOSTNQN.into());
    let ctrl = Controller::connect(&ConnectOptions::new(trid)).unwrap();
    let mut q = ctrl.create_io_queue(1, 8, 65536).unwrap();
    q.set_in_capsule_size(0);
    let slot = q.alloc().unwrap();
    let mut cmd = NvmeCommand::new(IoOpcode::Write as u8, 0);
    cmd.set_nsid(1).set_lba_range(0, 128);
    q.submit(slot, cmd, 65536).unwrap();
    q.flush().unwrap();

    // Listener 0: steady I/O while top samples.
    let mut perf = Command::new(nvmf_path())
        .args(["perf", "-r", &d.trid(0), "--no-progress"])
        .args(["-q", "4", "-o", "4096", "-w", "randread", "-t", "4"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let mut top = Command::new(nvmf_path());
    top.arg("top").arg("-s").arg(&d.sock).arg("--once");
    let out = run_bounded(top, Duration::from_secs(30));
    let _ = perf.wait();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains('\x1b'),
        "plain output when not a terminal:\n{text}"
    );

    // The listener view: "IOPS MiB/s mean p99 inflt errs FLAG name".
    let row = |l: &str| -> Vec<String> {
        text.lines()
            .find(|x| x.ends_with(&format!("{l} {NQN}")))
            .unwrap_or_else(|| panic!("no row for {l}:\n{text}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let busy = row(&d.listener(0));
    assert!(
        busy[0].parse::<f64>().unwrap() > 100.0,
        "IOPS on listener 0:\n{text}"
    );
    assert!(
        busy[2].parse::<f64>().unwrap() > 0.0,
        "mean latency:\n{text}"
    );
    assert_ne!(busy[6], "STALLED", "{text}");
    let stuck = row(&d.listener(1));
    assert_eq!(stuck[0], "0", "{text}");
    assert_eq!(stuck[4], "1", "one command in flight:\n{text}");
    assert_eq!(stuck[6], "STALLED", "{text}");
    // Per queue: nvmf_subsystem_get_qpairs shows the stuck command on its
    // I/O queue.
    let qps = d.rpc_with(
        "nvmf_subsystem_get_qpairs",
        Some(serde_json::json!({ "nqn": NQN })),
    );
    let io = qps
        .as_array()
        .unwrap()
        .iter()
        .find(|x| {
            x["qid"] == 1 && x["listen_address"]["trsvcid"] == d.ports[1].to_string().as_str()
        })
        .unwrap_or_else(|| panic!("no I/O queue on listener 1: {qps:#}"));
    assert_eq!(io["stats"]["in_flight"], 1, "{io:#}");
    assert!(io["stats"]["commands"].as_u64().unwrap() >= 1, "{io:#}");
    drop(q);
    drop(ctrl);
}
