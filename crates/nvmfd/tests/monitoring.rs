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
use nvmf_testkit::prometheus::{
    dashboard_queries, need_tool, pack, promtool, Prometheus, GROUP_ROW,
};
use nvmf_testkit::{bins::nvmf as nvmf_path, free_port, Process, TestDir};
use nvmf_wire::command::Command as NvmeCommand;
use nvmf_wire::opcode::IoOpcode;
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

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

const NQN: &str = "nqn.2016-06.io.spdk:monitoring";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000c0de";

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
    let prom = Prometheus::start(&[format!("127.0.0.1:{metrics}")], Some(&fast_rules(&rules)));

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
    let mut checked = 0;
    let mut empty = Vec::new();
    for q in dashboard_queries("10s") {
        let r = prom.query(&q.expr);
        checked += 1;
        if !q.row.starts_with(GROUP_ROW) && r.is_empty() {
            empty.push(format!("{}: {}", q.panel, q.expr));
        }
    }
    assert!(checked >= 30, "only {checked} dashboard queries");
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}",
        empty.join("\n")
    );
    // The template variables' queries too.
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(pack("nvmfd-dashboard.json")).unwrap())
            .unwrap();
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
