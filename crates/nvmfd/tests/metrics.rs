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
//!   `nvmf_subsystem_get_qpairs` shows that command in flight on its queue.

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
