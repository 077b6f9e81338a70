//! bench/engines/fio_json.rs — reads fio's `--output-format=json+` output
//! (fio 3.x; checked against fio 3.33) into the bench's `EngineResult`:
//! per-job or per-client entries (`jobs`, or `client_stats` in
//! client/server mode, where fio adds an "All clients" sum), summed over
//! entries; latency from the total-latency histogram (`lat_ns.bins`,
//! present with `lat_percentiles=1`), percentiles recomputed from the
//! merged histogram the way fio computes them; CPU time from `usr_cpu`,
//! `sys_cpu` and `job_runtime`. Pure parsing, no I/O. See docs/BENCH.md
//! ("fio engines") for which figure comes from which field.

use crate::bench::results::{DirFigures, EngineResult, Latency};
use anyhow::{anyhow, bail, Context};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Percentiles asked of fio (`percentile_list`, at most 20 entries) and
/// used for the latency curve.
pub const PERCENTILES: &[f64] = &[
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99, 99.999,
];

/// fio's `percentile_list` value for [`PERCENTILES`].
pub fn percentile_list() -> String {
    PERCENTILES
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(":")
}

/// Name fio gives the summed entry in client/server mode.
const ALL_CLIENTS: &str = "All clients";

#[derive(Debug, Clone, Default, Deserialize)]
struct RawOutput {
    #[serde(rename = "fio version", default)]
    version: String,
    #[serde(default)]
    jobs: Vec<FioJob>,
    #[serde(default)]
    client_stats: Vec<FioJob>,
}

/// One entry of fio's `jobs` (or `client_stats`) array: one job, or one
/// group of jobs with `group_reporting`, or one client.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FioJob {
    #[serde(default)]
    pub jobname: String,
    /// Client mode: the server the entry came from.
    #[serde(default)]
    pub hostname: Option<String>,
    /// Client mode: the server's port.
    #[serde(default)]
    pub port: Option<u64>,
    /// errno of the first error that stopped the job (0: none).
    #[serde(default)]
    pub error: i64,
    /// With `continue_on_error`: I/O errors the job went on after.
    #[serde(default)]
    pub total_err: Option<u64>,
    /// Milliseconds the job(s) ran, summed over the jobs of the entry.
    #[serde(default)]
    pub job_runtime: u64,
    /// User / system CPU time as percent of `job_runtime`.
    #[serde(default)]
    pub usr_cpu: f64,
    #[serde(default)]
    pub sys_cpu: f64,
    #[serde(default)]
    pub read: FioDir,
    #[serde(default)]
    pub write: FioDir,
}

/// One direction of a job entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FioDir {
    #[serde(default)]
    pub io_bytes: u64,
    #[serde(default)]
    pub total_ios: u64,
    /// Milliseconds of the longest job of the entry in this direction.
    #[serde(default)]
    pub runtime: u64,
    #[serde(default)]
    pub short_ios: u64,
    #[serde(default)]
    pub drop_ios: u64,
    /// Total latency (submission to completion).
    #[serde(default)]
    pub lat_ns: FioLat,
}

/// A latency block of fio's JSON, in nanoseconds.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FioLat {
    #[serde(default)]
    pub min: u64,
    #[serde(default)]
    pub max: u64,
    #[serde(default)]
    pub mean: f64,
    #[serde(rename = "N", default)]
    pub n: u64,
    /// "99.900000" → ns (only with lat_percentiles=1).
    #[serde(default)]
    pub percentile: BTreeMap<String, u64>,
    /// json+ only: bucket value in ns (as text) → samples.
    #[serde(default)]
    pub bins: BTreeMap<String, u64>,
}

/// fio's JSON output, read.
#[derive(Debug, Clone, Default)]
pub struct FioOutput {
    /// `fio version` (`fio-3.33`).
    pub version: String,
    /// The entries to sum: `jobs`, or the clients of `client_stats`
    /// without fio's own "All clients" sum.
    pub entries: Vec<FioJob>,
    /// fio's "All clients" entry, when it gave one (several clients).
    pub all_clients: Option<FioJob>,
    /// Whether this came from client/server mode (`client_stats`).
    pub client_mode: bool,
}

impl FioOutput {
    /// Parse fio's output. Text before the first `{` (fio sometimes
    /// prints notes on the same stream) is skipped.
    pub fn parse(text: &str) -> anyhow::Result<FioOutput> {
        let start = text
            .find('{')
            .ok_or_else(|| anyhow!("fio output holds no JSON object: {}", excerpt(text)))?;
        let raw: RawOutput = serde_json::from_str(&text[start..])
            .with_context(|| format!("fio JSON output: {}", excerpt(&text[start..])))?;
        let client_mode = !raw.client_stats.is_empty();
        let (mut entries, mut all_clients) = (Vec::new(), None);
        for j in if client_mode {
            raw.client_stats
        } else {
            raw.jobs
        } {
            if client_mode && j.jobname == ALL_CLIENTS {
                all_clients = Some(j);
            } else {
                entries.push(j);
            }
        }
        if entries.is_empty() {
            bail!("fio JSON output has no job results (no `jobs` or `client_stats` entries)");
        }
        Ok(FioOutput {
            version: raw.version,
            entries,
            all_clients,
            client_mode,
        })
    }

    /// Distinct clients that reported (1 outside client/server mode).
    pub fn clients(&self) -> u32 {
        if !self.client_mode {
            return 1;
        }
        let mut hosts: Vec<(&str, Option<u64>)> = self
            .entries
            .iter()
            .map(|e| (e.hostname.as_deref().unwrap_or(""), e.port))
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts.len() as u32
    }

    /// What fio says went wrong per entry (errno and its text), for the
    /// entries whose `error` is set.
    pub fn job_errors(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter(|e| e.error != 0)
            .map(|e| {
                let host = match (&e.hostname, e.port) {
                    (Some(h), Some(p)) => format!(" on {h},{p}"),
                    (Some(h), None) => format!(" on {h}"),
                    _ => String::new(),
                };
                format!(
                    "job '{}'{host}: error {} ({})",
                    e.jobname,
                    e.error,
                    std::io::Error::from_raw_os_error(e.error as i32)
                )
            })
            .collect()
    }

    /// Sum the entries into one `EngineResult` (`command` and
    /// `initiator_pids` left empty for the caller). Jobs that stopped on
    /// an error are an error (fio's errno named); I/O errors a job went on
    /// after (`continue_on_error`) are counted in `errors`.
    pub fn to_result(&self) -> anyhow::Result<EngineResult> {
        let errors: u64 = self.entries.iter().filter_map(|e| e.total_err).sum();
        if errors == 0 && self.entries.iter().any(|e| e.error != 0) {
            bail!("fio stopped: {}", self.job_errors().join("; "));
        }
        let read = dir_sum(self.entries.iter().map(|e| &e.read));
        let write = dir_sum(self.entries.iter().map(|e| &e.write));
        let all = merge_lat(
            self.entries
                .iter()
                .flat_map(|e| [&e.read.lat_ns, &e.write.lat_ns]),
        );
        // Each entry's directions ran for their own `runtime` (ms, the
        // longest job of the entry); the window is the longest of them.
        let ms = self
            .entries
            .iter()
            .flat_map(|e| [e.read.runtime, e.write.runtime])
            .max()
            .unwrap_or(0);
        let cpu_s: f64 = self
            .entries
            .iter()
            .map(|e| (e.usr_cpu + e.sys_cpu) / 100.0 * e.job_runtime as f64 / 1000.0)
            .sum();
        Ok(EngineResult {
            seconds: ms as f64 / 1000.0,
            read: read.figures(),
            write: write.figures(),
            all: all.latency(),
            errors,
            command: String::new(),
            initiator_pids: Vec::new(),
            initiator_cpu_s: Some(cpu_s),
        })
    }
}

fn excerpt(s: &str) -> String {
    let s = s.trim();
    let mut e: String = s.chars().take(200).collect();
    if e.len() < s.len() {
        e.push_str("...");
    }
    if e.is_empty() {
        e.push_str("(empty)");
    }
    e
}

/// A latency distribution merged over fio entries.
#[derive(Debug, Default)]
struct Merged {
    n: u64,
    sum_ns: f64,
    min_ns: u64,
    max_ns: u64,
    /// Bucket value (ns) → samples, ascending.
    bins: BTreeMap<u64, u64>,
    /// Whether some entry with samples had no bins (plain `json` output).
    missing_bins: bool,
    /// Percentiles as fio gave them per entry, for the no-bins case.
    fio_pct: Vec<BTreeMap<String, u64>>,
}

fn merge_lat<'a>(lats: impl Iterator<Item = &'a FioLat>) -> Merged {
    let mut m = Merged {
        min_ns: u64::MAX,
        ..Default::default()
    };
    for l in lats.filter(|l| l.n > 0) {
        m.n += l.n;
        m.sum_ns += l.mean * l.n as f64;
        m.min_ns = m.min_ns.min(l.min);
        m.max_ns = m.max_ns.max(l.max);
        if l.bins.is_empty() {
            m.missing_bins = true;
        }
        for (k, v) in &l.bins {
            if let Ok(ns) = k.parse::<u64>() {
                *m.bins.entry(ns).or_insert(0) += v;
            }
        }
        m.fio_pct.push(l.percentile.clone());
    }
    if m.n == 0 {
        m.min_ns = 0;
    }
    m
}

impl Merged {
    /// The value at percentile `p` the way fio computes it: the first
    /// bucket (ascending) where the running count reaches p/100 × samples.
    fn at(&self, p: f64) -> Option<u64> {
        if self.missing_bins || self.bins.is_empty() {
            // No histogram (plain `json` output): fio's own figures, exact
            // for one entry, the largest (an upper bound) over several.
            return self
                .fio_pct
                .iter()
                .filter_map(|pct| {
                    pct.iter()
                        .find(|(k, _)| k.parse::<f64>().is_ok_and(|x| (x - p).abs() < 1e-9))
                        .map(|(_, v)| *v)
                })
                .max();
        }
        let total: u64 = self.bins.values().sum();
        let want = p / 100.0 * total as f64;
        let mut run = 0u64;
        for (ns, c) in &self.bins {
            run += c;
            if run as f64 >= want {
                return Some(*ns);
            }
        }
        self.bins.keys().next_back().copied()
    }

    fn latency(&self) -> Latency {
        if self.n == 0 {
            return Latency::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        // A percentile fio did not report reads 0 (never NaN: the report
        // must round-trip through JSON).
        let at = |p: f64| self.at(p).map(us).unwrap_or(0.0);
        Latency {
            mean_us: self.sum_ns / self.n as f64 / 1000.0,
            min_us: us(self.min_ns),
            p50_us: at(50.0),
            p99_us: at(99.0),
            p999_us: at(99.9),
            p9999_us: at(99.99),
            max_us: us(self.max_ns),
            curve: PERCENTILES
                .iter()
                .filter_map(|&p| self.at(p).map(|v| (p, us(v))))
                .collect(),
        }
    }
}

struct DirSum {
    ios: u64,
    bytes: u64,
    lat: Merged,
}

impl DirSum {
    fn figures(&self) -> DirFigures {
        DirFigures {
            ios: self.ios,
            bytes: self.bytes,
            latency: self.lat.latency(),
        }
    }
}

fn dir_sum<'a>(dirs: impl Iterator<Item = &'a FioDir> + Clone) -> DirSum {
    DirSum {
        ios: dirs.clone().map(|d| d.total_ios).sum(),
        bytes: dirs.clone().map(|d| d.io_bytes).sum(),
        lat: merge_lat(dirs.map(|d| &d.lat_ns)),
    }
}

#[cfg(test)]
mod tests {
    //! Fixtures: real fio 3.33 json+ output captured on the dev machine
    //! (commands in tests/fixtures/fio/README.md).
    use super::*;
    use serde_json::Value;

    fn fixture(name: &str) -> String {
        let p = format!("{}/tests/fixtures/fio/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    /// The fixture as plain JSON (fio may print error lines first).
    fn value(text: &str) -> Value {
        serde_json::from_str(&text[text.find('{').unwrap()..]).unwrap()
    }

    fn pct(v: &Value, p: f64) -> f64 {
        v["lat_ns"]["percentile"][format!("{p:.6}")]
            .as_u64()
            .unwrap_or_else(|| panic!("no percentile {p} in {v}")) as f64
            / 1000.0
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn percentile_list_is_what_fio_accepts() {
        assert!(PERCENTILES.len() <= 20, "fio takes at most 20 percentiles");
        assert!(PERCENTILES.windows(2).all(|w| w[0] < w[1]));
        assert!(
            percentile_list().starts_with("1:5:10:")
                && percentile_list().ends_with(":99.99:99.999")
        );
    }

    #[test]
    fn libaio_randrw_job_figures() {
        let text = fixture("randrw-libaio.json");
        let v = value(&text);
        let j = &v["jobs"][0];
        let o = FioOutput::parse(&text).unwrap();
        assert_eq!(
            (o.version.as_str(), o.client_mode, o.clients()),
            ("fio-3.33", false, 1)
        );
        let r = o.to_result().unwrap();
        for (dir, got) in [("read", &r.read), ("write", &r.write)] {
            let d = &j[dir];
            assert_eq!(got.ios, d["total_ios"].as_u64().unwrap(), "{dir} ios");
            assert_eq!(got.bytes, d["io_bytes"].as_u64().unwrap(), "{dir} bytes");
            let l = &d["lat_ns"];
            assert!(close(
                got.latency.mean_us,
                l["mean"].as_f64().unwrap() / 1000.0
            ));
            assert!(close(
                got.latency.min_us,
                l["min"].as_f64().unwrap() / 1000.0
            ));
            assert!(close(
                got.latency.max_us,
                l["max"].as_f64().unwrap() / 1000.0
            ));
            // Percentiles recomputed from the histogram equal fio's own.
            assert_eq!(got.latency.p50_us, pct(d, 50.0), "{dir} p50");
            assert_eq!(got.latency.p99_us, pct(d, 99.0), "{dir} p99");
            assert_eq!(got.latency.p999_us, pct(d, 99.9), "{dir} p99.9");
            assert_eq!(got.latency.p9999_us, pct(d, 99.99), "{dir} p99.99");
            assert_eq!(got.latency.curve.len(), PERCENTILES.len());
            for &(p, us) in &got.latency.curve {
                assert_eq!(us, pct(d, p), "{dir} curve at {p}");
            }
        }
        // All I/O: mean weighted by samples, extremes over both.
        let (rl, wl) = (&j["read"]["lat_ns"], &j["write"]["lat_ns"]);
        let n = |l: &Value| l["N"].as_f64().unwrap();
        let mean = (rl["mean"].as_f64().unwrap() * n(rl) + wl["mean"].as_f64().unwrap() * n(wl))
            / (n(rl) + n(wl))
            / 1000.0;
        assert!(close(r.all.mean_us, mean));
        assert_eq!(
            r.all.max_us,
            r.read.latency.max_us.max(r.write.latency.max_us)
        );
        assert_eq!(
            r.all.min_us,
            r.read.latency.min_us.min(r.write.latency.min_us)
        );
        assert!(r.all.p99_us >= r.all.p50_us && r.all.p9999_us >= r.all.p999_us);
        // Window and CPU: runtime 1 s; cpu = (usr+sys)% of job_runtime
        // (2 jobs: 2000 ms summed).
        assert_eq!(r.seconds, 1.0);
        assert_eq!(j["job_runtime"].as_u64(), Some(2000));
        let cpu = (j["usr_cpu"].as_f64().unwrap() + j["sys_cpu"].as_f64().unwrap()) / 100.0 * 2.0;
        assert!(cpu > 0.0 && close(r.initiator_cpu_s.unwrap(), cpu));
        assert_eq!(r.errors, 0);
        // The result survives the report's JSON round trip (no NaN).
        let back: EngineResult = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn two_clients_sum_to_fios_all_clients() {
        let text = fixture("clients-2.json");
        let o = FioOutput::parse(&text).unwrap();
        assert!(o.client_mode);
        assert_eq!(o.entries.len(), 2);
        assert_eq!(o.clients(), 2);
        let all = o.all_clients.clone().expect("fio's All clients entry");
        let r = o.to_result().unwrap();
        assert_eq!(r.read.ios, all.read.total_ios);
        assert_eq!(
            r.read.ios,
            o.entries.iter().map(|e| e.read.total_ios).sum::<u64>()
        );
        assert_eq!(r.read.bytes, all.read.io_bytes);
        assert_eq!(r.write.ios, 0);
        let a = &all.read.lat_ns;
        assert!(close(r.read.latency.mean_us, a.mean / 1000.0));
        assert_eq!(r.read.latency.max_us, a.max as f64 / 1000.0);
        assert_eq!(r.read.latency.min_us, a.min as f64 / 1000.0);
        // fio gives no percentiles for "All clients"; a percentile of the
        // merged histogram lies between the clients' own.
        let v = value(&text);
        assert_eq!(v["client_stats"][2]["jobname"], "All clients");
        assert!(v["client_stats"][2]["read"]["lat_ns"]
            .get("percentile")
            .is_none());
        let (c0, c1) = (&v["client_stats"][0]["read"], &v["client_stats"][1]["read"]);
        assert_eq!(r.read.latency.curve.len(), PERCENTILES.len());
        for &(p, us) in &r.read.latency.curve {
            let (a, b) = (pct(c0, p), pct(c1, p));
            assert!(
                a.min(b) <= us && us <= a.max(b),
                "curve at {p}: {us} not in [{a}, {b}]"
            );
        }
        assert_ne!(
            pct(c0, 50.0),
            pct(c1, 50.0),
            "the clients differ (else the check is weak)"
        );
        let cpu = (all.usr_cpu + all.sys_cpu) / 100.0 * all.job_runtime as f64 / 1000.0;
        assert!(
            (r.initiator_cpu_s.unwrap() - cpu).abs() < 1e-3,
            "{:?} vs {cpu}",
            r.initiator_cpu_s
        );
        assert_eq!(r.seconds, 1.001);
    }

    #[test]
    fn one_client() {
        let o = FioOutput::parse(&fixture("clients-1.json")).unwrap();
        assert!(o.client_mode && o.all_clients.is_none());
        assert_eq!(o.clients(), 1);
        assert_eq!(o.to_result().unwrap().read.ios, 1000);
    }

    #[test]
    fn errors_fio_went_on_after_are_counted() {
        // psync writes to /dev/full with ignore_error=,ENOSPC: 16 failed.
        let o = FioOutput::parse(&fixture("errors-counted.json")).unwrap();
        let r = o.to_result().unwrap();
        assert_eq!(r.errors, 16);
        assert_eq!(r.write.ios, 16);
    }

    #[test]
    fn a_job_that_could_not_start_is_an_error() {
        // libaio on /nonexistent/dir/dev: fio's error 22 before any I/O.
        let text = fixture("open-failure.json");
        let o = FioOutput::parse(&text).unwrap();
        let e = o.to_result().unwrap_err().to_string();
        assert!(e.contains("error 22") && e.contains("nvmf-bench"), "{e}");
    }

    #[test]
    fn a_job_stopped_by_an_error_names_it() {
        // psync writes to /dev/full: fio stopped the job on ENOSPC (and
        // exited 1, which the engine turns into a failure).
        let o = FioOutput::parse(&fixture("errors-devfull.json")).unwrap();
        let e = o.job_errors();
        assert_eq!(e.len(), 1);
        assert!(
            e[0].contains("error 28") && e[0].contains("No space left"),
            "{e:?}"
        );
    }

    #[test]
    fn bad_output_is_a_clear_error() {
        let e = FioOutput::parse("fio: engine not found\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no JSON object") && e.contains("engine not found"),
            "{e}"
        );
        let text = fixture("randrw-libaio.json");
        let e = FioOutput::parse(&text[..text.len() / 2]).unwrap_err();
        assert!(format!("{e:#}").contains("fio JSON output"), "{e:#}");
        let e = FioOutput::parse("{\"jobs\": []}").unwrap_err().to_string();
        assert!(e.contains("no job results"), "{e}");
        assert!(FioOutput::parse("").is_err());
    }

    #[test]
    fn plain_json_without_bins_uses_fios_percentiles() {
        // The same job with its histograms removed (as plain `json` output).
        let mut v = value(&fixture("randrw-libaio.json"));
        for d in ["read", "write"] {
            v["jobs"][0][d]["lat_ns"]
                .as_object_mut()
                .unwrap()
                .remove("bins");
        }
        let o = FioOutput::parse(&v.to_string()).unwrap();
        let r = o.to_result().unwrap();
        assert_eq!(r.read.latency.p99_us, pct(&v["jobs"][0]["read"], 99.0));
        // Over reads and writes no exact merge: the larger (upper bound).
        let hi = pct(&v["jobs"][0]["read"], 99.0).max(pct(&v["jobs"][0]["write"], 99.0));
        assert_eq!(r.all.p99_us, hi);
    }
}
