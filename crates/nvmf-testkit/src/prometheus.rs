//! A real Prometheus (Debian's `prometheus` package; `promtool` beside it) of a test's own,
//! scraping nvmfd `/metrics` endpoints every second and evaluating rules every second, with
//! its HTTP API (`ureq`): instant queries and active alerts. Also the monitoring pack's files
//! (packaging/monitoring/) and the queries of its Grafana dashboard, by row.
//! Used by nvmfd's tests/monitoring.rs (one nvmfd under load) and tests/gateway_group.rs (the
//! gateway-group row and alerts on real members).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{free_port, Process, TestDir};

/// A file of packaging/monitoring/.
pub fn pack(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../packaging/monitoring")
        .join(name)
}

/// Panics unless `tool` is on PATH, naming the package that has it.
pub fn need_tool(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{tool} not found: install Debian's prometheus package (scripts/test.sh does)"
    );
}

/// `promtool ARGS...`, which must succeed; its output.
pub fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool").args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// One query of the dashboard: its row's title, its panel's title and the expression with
/// the variables set to "all" and `$__rate_interval` to `rate_interval`.
#[derive(Debug, Clone)]
pub struct DashboardQuery {
    pub row: String,
    pub panel: String,
    pub expr: String,
}

/// Every query of packaging/monitoring/nvmfd-dashboard.json, in order.
pub fn dashboard_queries(rate_interval: &str) -> Vec<DashboardQuery> {
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(pack("nvmfd-dashboard.json")).unwrap())
            .unwrap();
    let mut row = String::new();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        let title = p["title"].as_str().unwrap_or("").to_string();
        if p["type"] == "row" {
            row = title;
            continue;
        }
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", rate_interval)
                .replace("$instance", ".*")
                .replace("$subsystem", ".*");
            out.push(DashboardQuery {
                row: row.clone(),
                panel: title.clone(),
                expr,
            });
        }
    }
    out
}

/// The title of the dashboard's gateway-group row starts so.
pub const GROUP_ROW: &str = "Gateway group";

/// A Prometheus of the test's own (killed on drop, its directory removed).
pub struct Prometheus {
    proc: Process,
    port: u16,
    _dir: TestDir,
}

impl Prometheus {
    /// Scrapes `targets` (`host:port` of nvmfd `/metrics` endpoints) as job `nvmfd` every
    /// second, evaluating `rules` (a rule file's text) every second.
    pub fn start(targets: &[String], rules: Option<&str>) -> Prometheus {
        need_tool("prometheus");
        let dir = TestDir::new("prometheus");
        let mut cfg = String::from("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n");
        if let Some(r) = rules {
            std::fs::write(dir.join("rules.yml"), r).unwrap();
            cfg.push_str(&format!(
                "rule_files:\n  - {}\n",
                dir.join("rules.yml").display()
            ));
        }
        let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        cfg.push_str(&format!(
            "scrape_configs:\n  - job_name: nvmfd\n    scrape_timeout: 900ms\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        ));
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
        while ureq::get(&p.url("/-/ready")).call().is_err() {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready in 60 s:\n{}",
                p.proc.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// GET `path` of the HTTP API (with `query=` when given); its JSON, whose status must
    /// be "success".
    pub fn api(&self, path: &str, query: Option<&str>) -> Value {
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
    pub fn query(&self, expr: &str) -> Vec<Value> {
        let v = self.api("/api/v1/query", Some(expr));
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Active alerts as (name, state, labels).
    pub fn alerts(&self) -> Vec<(String, String, Value)> {
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

    /// Waits (at most `limit`) until alert `name` fires with labels that satisfy
    /// `matches`; how long it took.
    pub fn wait_firing(
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
