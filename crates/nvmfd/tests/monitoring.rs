//! The monitoring pack (packaging/monitoring/, docs/MONITORING.md) against a
//! real Prometheus (Debian's `prometheus` package: `prometheus` and
//! `promtool`, installed by scripts/test.sh) scraping a real nvmfd under
//! load:
//! - `promtool check rules` accepts the alert rules and `promtool check
//!   config` the example configuration;
//! - every query of the Grafana dashboard returns data (its variables set
//!   to "all", `$__rate_interval` to 10 s), except the gateway-group row,
//!   whose series only members of a `--gateway-group` export: those must be
//!   valid queries;
//! - every alert rule evaluates without error, and every series an alert
//!   reads (outside the gateway-group ones) is scraped;
//! - with I/O flowing nothing fires; a path with a command that never
//!   completes (a 64 KiB Write whose data the host never sends: in flight
//!   on the target, no read or write completing on that path) fires
//!   `NvmfdPathStalled` for that path only; killing nvmfd fires `NvmfdDown`.
//!
//! The rules are loaded with every `for` and range window shortened to
//! seconds (scrapes and evaluations every second) so that the alerts fire
//! within the test; their expressions are otherwise the shipped ones.

use nvmf_host::{ConnectOptions, Controller, TransportId};
use nvmf_testkit::{bins::nvmf as nvmf_path, free_port, Process, TestDir};
use nvmf_wire::command::Command as NvmeCommand;
use nvmf_wire::opcode::IoOpcode;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2016-06.io.spdk:monitoring";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000c0de";

fn pack(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging/monitoring")
        .join(name)
}

fn need_tool(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{tool} not found: install Debian's prometheus package (scripts/test.sh does)"
    );
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The alert rules with every `for: Nm` and range `[Nm]` shortened.
fn fast_rules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let l = if line.trim_start().starts_with("for:") {
            let indent = &line[..line.len() - line.trim_start().len()];
            format!("{indent}for: 3s")
        } else {
            line.replace("[2m]", "[8s]")
                .replace("[5m]", "[8s]")
                .replace("[10m]", "[8s]")
        };
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// A Prometheus of its own (killed on drop with its directory).
struct Prometheus {
    proc: Process,
    port: u16,
    _dir: TestDir,
}

impl Prometheus {
    fn start(metrics_port: u16, rules: &str) -> Prometheus {
        let dir = TestDir::new("prometheus");
        std::fs::write(dir.join("rules.yml"), rules).unwrap();
        let cfg = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: nvmfd\n    scrape_timeout: 900ms\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n",
            dir.join("rules.yml").display()
        );
        std::fs::write(dir.join("prometheus.yml"), cfg).unwrap();
        promtool(&[
            "check",
            "config",
            dir.join("prometheus.yml").to_str().unwrap(),
        ]);
        let port = free_port();
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null());
        let proc = Process::spawn(&mut cmd);
        let p = Prometheus {
            proc,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if ureq::get(&p.url("/-/ready")).call().is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready in 60 s:\n{}",
                p.proc.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn api(&self, path: &str, query: Option<&str>) -> Value {
        let mut req = ureq::get(&self.url(path));
        if let Some(q) = query {
            req = req.query("query", q);
        }
        let body = match req.call() {
            Ok(mut r) => r.body_mut().read_to_string().unwrap(),
            Err(e) => panic!("prometheus {path} {query:?}: {e}"),
        };
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{path} {query:?}: {v}");
        v
    }

    /// The instant vector of `expr` now.
    fn query(&self, expr: &str) -> Vec<Value> {
        let v = self.api("/api/v1/query", Some(expr));
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Active alerts as (name, state, labels).
    fn alerts(&self) -> Vec<(String, String, Value)> {
        let v = self.api("/api/v1/alerts", None);
        v["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                    a["state"].as_str().unwrap_or("").to_string(),
                    a["labels"].clone(),
                )
            })
            .collect()
    }

    /// Waits (at most `limit`) until alert `name` fires with labels that
    /// satisfy `matches`.
    fn wait_firing(
        &self,
        name: &str,
        limit: Duration,
        matches: impl Fn(&Value) -> bool,
    ) -> Duration {
        let t0 = Instant::now();
        loop {
            let a = self.alerts();
            if a.iter()
                .any(|(n, s, l)| n == name && s == "firing" && matches(l))
            {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < limit,
                "{name} did not fire within {limit:?}; active alerts: {a:#?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// The metric names an expression reads.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        let w = &expr[start..i];
        let prefixed = w.starts_with("nvmf_") || w.starts_with("process_") || w == "up";
        // a label name inside {...} or by (...) is not a metric: metrics are
        // followed by `{`, `[` or whitespace/`)` and never by `=`/`~`
        let next = expr[i..].trim_start().chars().next();
        if prefixed
            && !matches!(next, Some('=') | Some('!') | Some('~'))
            && !names.iter().any(|n| n == w)
        {
            names.push(w.to_string());
        }
        if i == start {
            i += 1;
        }
    }
    names
}

fn config(ports: [u16; 2]) -> String {
    let listener = |p: u16| {
        format!(
            r#"{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{p}"}}}}}}"#
        )
    };
    format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[{{"method":"bdev_malloc_create","params":{{"name":"M0","num_blocks":32768,"block_size":512}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true,"ana_reporting":true}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"M0"}}}}}},
{},{},
{{"method":"nvmf_subsystem_listener_set_ana_state","params":{{"nqn":"{NQN}","ana_state":"non_optimized","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{}"}}}}}}]}}]}}"#,
        listener(ports[0]),
        listener(ports[1]),
        ports[1]
    )
}

fn connect(port: u16) -> Controller {
    let mut trid = TransportId::parse(&nvmf_testkit::trid(port, NQN)).unwrap();
    trid.hostnqn = Some(HOSTNQN.into());
    let mut opts = ConnectOptions::new(trid);
    // no keep-alive: the controller stays however long the test holds it
    opts.kato = Duration::ZERO;
    Controller::connect(&opts).unwrap()
}

#[test]
fn prometheus_scrapes_the_dashboard_and_the_alerts_fire() {
    need_tool("prometheus");
    need_tool("promtool");
    let rules_path = pack("nvmfd-alerts.yml");
    let out = promtool(&["check", "rules", rules_path.to_str().unwrap()]);
    assert!(out.contains("SUCCESS"), "{out}");
    // The example configuration, pointed at the rules in the tree.
    let dir = TestDir::new("prom-example");
    let example = std::fs::read_to_string(pack("prometheus-nvmfd.yml"))
        .unwrap()
        .replace(
            "/usr/share/nvmfd/monitoring/nvmfd-alerts.yml",
            rules_path.to_str().unwrap(),
        );
    std::fs::write(dir.join("prometheus.yml"), example).unwrap();
    promtool(&[
        "check",
        "config",
        dir.join("prometheus.yml").to_str().unwrap(),
    ]);

    // nvmfd: one RAM namespace, ANA reporting, two listeners, --metrics.
    let ports = [free_port(), free_port()];
    let metrics = free_port();
    let mut d = nvmf_testkit::Daemon::builder(config(ports))
        .args(["-m", "0", "--metrics", &format!("127.0.0.1:{metrics}")])
        .listening(&ports)
        .ready_when("metrics (Prometheus) on")
        .start();
    let rules = std::fs::read_to_string(&rules_path).unwrap();
    let prom = Prometheus::start(metrics, &fast_rules(&rules));

    // Load through listener 0 for the whole first part, and one read past
    // the end of the namespace (an error status for the errors panels).
    let trid0 = format!("{} hostnqn:{HOSTNQN}", nvmf_testkit::trid(ports[0], NQN));
    let mut perf = Process::spawn(
        Command::new(nvmf_path())
            .args(["perf", "-r", &trid0, "--no-progress"])
            .args([
                "-q", "8", "-o", "4096", "-w", "randrw", "-M", "70", "-t", "40",
            ])
            .stdin(Stdio::null()),
    );
    let bad = connect(ports[0]);
    let mut q = bad.create_io_queue(1, 4, 4096).unwrap();
    let slot = q.alloc().unwrap();
    let mut cmd = NvmeCommand::new(IoOpcode::Read as u8, 0);
    cmd.set_nsid(1).set_lba_range(32768, 8);
    let c = q.execute(slot, cmd, 4096, Duration::from_secs(10)).unwrap();
    assert!(
        c.status.sct != 0 || c.status.sc != 0,
        "a read past the end must fail"
    );
    drop(q);
    drop(bad);

    // 12 s of scrapes under load.
    std::thread::sleep(Duration::from_secs(12));
    assert!(perf.running(), "nvmf perf ended early:\n{}", perf.logs());

    // Every dashboard query returns data (gateway-group row: valid only).
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(pack("nvmfd-dashboard.json")).unwrap())
            .unwrap();
    let mut in_group_row = false;
    let mut checked = 0;
    let mut empty = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            in_group_row = p["title"].as_str().unwrap().starts_with("Gateway group");
            continue;
        }
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "10s")
                .replace("$instance", ".*")
                .replace("$subsystem", ".*");
            let r = prom.query(&expr);
            checked += 1;
            if !in_group_row && r.is_empty() {
                empty.push(format!("{}: {expr}", p["title"]));
            }
        }
    }
    assert!(checked >= 30, "only {checked} dashboard queries");
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}",
        empty.join("\n")
    );
    // The template variables' queries too.
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str() {
            let metric = q
                .trim_start_matches("label_values(")
                .rsplit_once(',')
                .unwrap()
                .0
                .replace("$instance", ".*");
            assert!(
                !prom.query(&metric).is_empty(),
                "variable {}: {q}",
                v["name"]
            );
        }
    }

    // Every rule evaluates cleanly; every series an alert reads is there.
    let groups = prom.api("/api/v1/rules", None);
    let mut n_rules = 0;
    for g in groups["data"]["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            n_rules += 1;
            assert_eq!(r["health"], "ok", "rule {}: {r}", r["name"]);
            let expr = r["query"].as_str().unwrap();
            for m in metric_names(expr) {
                if m.starts_with("nvmf_group_") {
                    continue;
                }
                let sel = if m == "up" {
                    "up{job=\"nvmfd\"}".to_string()
                } else {
                    format!("{m}{{job=\"nvmfd\"}}")
                };
                assert!(
                    !prom.query(&sel).is_empty(),
                    "alert {} reads {m}: no such series",
                    r["name"]
                );
            }
        }
    }
    assert_eq!(n_rules, 13, "{groups}");

    // Healthy: neither a stalled path nor a down gateway.
    let firing = |name: &str| {
        prom.alerts()
            .into_iter()
            .any(|(n, s, _)| n == name && s == "firing")
    };
    assert!(!firing("NvmfdPathStalled"), "{:#?}", prom.alerts());
    assert!(!firing("NvmfdDown"), "{:#?}", prom.alerts());
    assert!(!firing("NvmfdAnaGroupUnserved"), "{:#?}", prom.alerts());

    // A stalled path: through listener 1, a 64 KiB write whose data (R2T)
    // the host never sends.
    let stuck = connect(ports[1]);
    let mut q = stuck.create_io_queue(1, 8, 65536).unwrap();
    q.set_in_capsule_size(0);
    let slot = q.alloc().unwrap();
    let mut cmd = NvmeCommand::new(IoOpcode::Write as u8, 0);
    cmd.set_nsid(1).set_lba_range(0, 128);
    q.submit(slot, cmd, 65536).unwrap();
    q.flush().unwrap();
    let l1 = format!("127.0.0.1:{}", ports[1]);
    let took = prom.wait_firing("NvmfdPathStalled", Duration::from_secs(60), |l| {
        l["listener"] == l1.as_str() && l["host"] == HOSTNQN
    });
    eprintln!("NvmfdPathStalled fired {took:?} after the write got stuck");
    // The busy path is not stalled.
    let l0 = format!("127.0.0.1:{}", ports[0]);
    let wrong = prom
        .alerts()
        .into_iter()
        .filter(|(n, _, l)| n == "NvmfdPathStalled" && l["listener"] == l0.as_str())
        .count();
    assert_eq!(
        wrong,
        0,
        "the path with I/O flowing flagged: {:#?}",
        prom.alerts()
    );
    let _ = perf.wait_exit(Duration::from_secs(60));

    // A dead gateway.
    d.kill();
    let took = prom.wait_firing("NvmfdDown", Duration::from_secs(60), |l| {
        l["instance"] == format!("127.0.0.1:{metrics}").as_str()
    });
    eprintln!("NvmfdDown fired {took:?} after kill -9");
    drop(q);
    drop(stuck);
}

#[test]
fn metric_names_are_read_from_expressions() {
    assert_eq!(
        metric_names(
            r#"sum by (job, instance) (nvmf_path_in_flight{job="nvmfd"}) > 0 unless on (job) rate(nvmf_ns_reads_total{job="nvmfd"}[2m])"#
        ),
        ["nvmf_path_in_flight", "nvmf_ns_reads_total"]
    );
    assert_eq!(metric_names(r#"up{job="nvmfd"} == 0"#), ["up"]);
    assert_eq!(
        metric_names("process_open_fds / process_max_fds > 0.9"),
        ["process_open_fds", "process_max_fds"]
    );
}
