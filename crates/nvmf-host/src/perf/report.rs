//! perf/report.rs — the results of `nvmf perf` and their two forms: the
//! statistics of one direction (`DirStats`: counts, bytes, HdrHistogram
//! latencies), per queue (`QueueReport`), per path (`PathReport`) and per
//! run (`PerfReport`); the text tables and the fio-style JSON.

use super::workload::{Mismatch, Workload};
use crate::multipath::Policy;
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Statistics of one direction (read or write) of one queue.
#[derive(Debug, Clone)]
pub struct DirStats {
    pub ios: u64,
    pub bytes: u64,
    pub sum_ns: u128,
    pub min_ns: u64,
    pub max_ns: u64,
    pub hist: Histogram<u64>,
}

impl DirStats {
    pub(crate) fn new() -> DirStats {
        DirStats {
            ios: 0,
            bytes: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            // 1 ns .. 1 hour, 3 significant digits.
            hist: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"),
        }
    }
    /// Back to empty (the histogram keeps its allocation).
    pub(crate) fn reset(&mut self) {
        self.ios = 0;
        self.bytes = 0;
        self.sum_ns = 0;
        self.min_ns = u64::MAX;
        self.max_ns = 0;
        self.hist.reset();
    }
    #[inline]
    pub(crate) fn record(&mut self, bytes: u32, ns: u64) {
        self.ios += 1;
        self.bytes += bytes as u64;
        self.sum_ns += ns as u128;
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
        self.hist.saturating_record(ns.max(1));
    }
    pub(crate) fn merge(&mut self, o: &DirStats) {
        self.ios += o.ios;
        self.bytes += o.bytes;
        self.sum_ns += o.sum_ns;
        self.min_ns = self.min_ns.min(o.min_ns);
        self.max_ns = self.max_ns.max(o.max_ns);
        let _ = self.hist.add(&o.hist);
    }
    pub fn mean_ns(&self) -> f64 {
        if self.ios == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.ios as f64
        }
    }
    pub fn min(&self) -> u64 {
        if self.ios == 0 {
            0
        } else {
            self.min_ns
        }
    }
    pub fn iops(&self, secs: f64) -> f64 {
        if secs > 0.0 {
            self.ios as f64 / secs
        } else {
            0.0
        }
    }
    pub fn mib_s(&self, secs: f64) -> f64 {
        if secs > 0.0 {
            self.bytes as f64 / secs / (1024.0 * 1024.0)
        } else {
            0.0
        }
    }
    /// Latency at `q` percent (e.g. 99.9), in ns.
    pub fn percentile(&self, q: f64) -> u64 {
        if self.ios == 0 {
            0
        } else {
            self.hist.value_at_percentile(q)
        }
    }
}

/// Results of one queue.
#[derive(Debug, Clone)]
pub struct QueueReport {
    pub qid: u16,
    /// The CPU its thread was pinned to (`cores`), if any.
    pub core: Option<usize>,
    /// Index of the thread that drove it (0..threads).
    pub thread: usize,
    /// The CPU its thread was on when it finished (sched_getcpu; with
    /// pinning, where its I/O ran).
    pub ran_on: Option<usize>,
    pub read: DirStats,
    pub write: DirStats,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Blocks checked by verify (during the run and in the read-back).
    pub verified_blocks: u64,
    pub mismatched_blocks: u64,
    pub mismatches: Vec<Mismatch>,
    /// I/Os that were still outstanding when the drain timed out.
    pub lost: u64,
    /// Zero-copy send calls of write data, and those the kernel reported
    /// it copied anyway.
    pub zc_calls: u64,
    pub zc_copied: u64,
}

/// Results of a run.
#[derive(Debug, Clone)]
pub struct PerfReport {
    pub workload: Workload,
    pub io_size: u32,
    pub queue_depth: u16,
    pub read_pct: u32,
    pub nsid: u32,
    pub block_size: u32,
    pub ns_blocks: u64,
    pub in_capsule: u32,
    pub hdr_digest: bool,
    pub data_digest: bool,
    pub verify: bool,
    pub trid: String,
    pub runtime: Duration,
    pub queues: Vec<QueueReport>,
    /// Queue-level failures (a connection that died).
    pub failures: Vec<String>,
    /// Path selection policy (meaningful with more than one path).
    pub policy: Policy,
    /// One per path (controller), in the order given.
    pub paths: Vec<PathReport>,
}

/// Results of one path (one controller reached through one transport ID).
#[derive(Debug, Clone)]
pub struct PathReport {
    /// `traddr:trsvcid`.
    pub name: String,
    pub trid: String,
    pub cntlid: u16,
    /// Whether the controller reports ANA (CMIC bit 3).
    pub ana_reporting: bool,
    /// ANA state at the end ("optimized", ...), or "failed".
    pub state: String,
    /// ANA state changes and path failures seen during the run.
    pub state_changes: u64,
    /// ANA log pages read (at start, on the ANA Change event, on ANA statuses).
    pub ana_log_reads: u64,
    pub read: DirStats,
    pub write: DirStats,
    /// Times the path was connected again after being lost (`reconnect`).
    pub reconnects: u64,
    /// Commands that left this path for another (path lost, path status).
    pub failed_over: u64,
    /// Commands re-issued on this path after failing elsewhere (or here,
    /// with a retryable status).
    pub retried: u64,
    /// Commands that failed on this path and were not retried.
    pub errors: u64,
    /// Seconds into the run of the first and last completion on this path.
    pub first_io_s: Option<f64>,
    pub last_io_s: Option<f64>,
    /// Why and when (seconds into the run) the path was lost, if it was.
    pub failure: Option<String>,
    pub failed_at_s: Option<f64>,
}

impl PathReport {
    pub fn ios(&self) -> u64 {
        self.read.ios + self.write.ios
    }
}

impl PerfReport {
    pub fn total_read(&self) -> DirStats {
        let mut t = DirStats::new();
        for q in &self.queues {
            t.merge(&q.read);
        }
        t
    }
    pub fn total_write(&self) -> DirStats {
        let mut t = DirStats::new();
        for q in &self.queues {
            t.merge(&q.write);
        }
        t
    }
    pub fn errors(&self) -> u64 {
        self.queues.iter().map(|q| q.errors + q.lost).sum::<u64>() + self.failures.len() as u64
    }
    pub fn mismatched_blocks(&self) -> u64 {
        self.queues.iter().map(|q| q.mismatched_blocks).sum()
    }
    pub fn verified_blocks(&self) -> u64 {
        self.queues.iter().map(|q| q.verified_blocks).sum()
    }
    /// True when there were no I/O errors, no lost I/O and no mismatches.
    pub fn ok(&self) -> bool {
        self.errors() == 0 && self.mismatched_blocks() == 0
    }
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

const PCTS: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];

fn us(ns: f64) -> f64 {
    ns / 1000.0
}

fn text_row(s: &mut String, name: &str, op: &str, d: &DirStats, secs: f64) {
    let _ = write!(
        s,
        "{name:<14} {op:<5} {:>11.0} {:>9.2} {:>9.1} {:>8.1} {:>9.1}",
        d.iops(secs),
        d.mib_s(secs),
        us(d.mean_ns()),
        us(d.min() as f64),
        us(d.max_ns as f64)
    );
    for p in PCTS {
        let _ = write!(s, " {:>9.1}", us(d.percentile(p) as f64));
    }
    s.push('\n');
}

/// Human-readable report.
pub fn format_text(r: &PerfReport) -> String {
    let secs = r.runtime.as_secs_f64();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "nvmf perf: {} {} B, QD {} x {} queue(s), {:.1} s, ns {} ({} x {} B), in-capsule <= {} B, digests: {}{}",
        r.workload.name(),
        r.io_size,
        r.queue_depth,
        r.queues.len(),
        secs,
        r.nsid,
        r.ns_blocks,
        r.block_size,
        r.in_capsule,
        match (r.hdr_digest, r.data_digest) {
            (false, false) => "none",
            (true, false) => "header",
            (false, true) => "data",
            (true, true) => "header+data",
        },
        if r.verify { ", verify" } else { "" }
    );
    if r.paths.len() > 1 {
        let _ = writeln!(
            s,
            "targets: {} paths, policy {}",
            r.paths.len(),
            r.policy.name()
        );
    } else {
        let _ = writeln!(s, "target: {}", r.trid);
    }
    let _ = write!(
        s,
        "{:<14} {:<5} {:>11} {:>9} {:>9} {:>8} {:>9}",
        "queue", "op", "IOPS", "MiB/s", "mean(us)", "min(us)", "max(us)"
    );
    for p in PCTS {
        let _ = write!(s, " {:>9}", format!("p{p}"));
    }
    s.push('\n');
    let want_read = r.read_pct > 0;
    let want_write = r.read_pct < 100;
    for q in &r.queues {
        let name = match q.core {
            Some(c) => format!("q{} (cpu {c})", q.qid),
            None => format!("q{}", q.qid),
        };
        if want_read {
            text_row(&mut s, &name, "read", &q.read, secs);
        }
        if want_write {
            text_row(&mut s, &name, "write", &q.write, secs);
        }
    }
    let (tr, tw) = (r.total_read(), r.total_write());
    if want_read {
        text_row(&mut s, "total", "read", &tr, secs);
    }
    if want_write {
        text_row(&mut s, "total", "write", &tw, secs);
    }
    let mut all = tr.clone();
    all.merge(&tw);
    let _ = writeln!(
        s,
        "total: {:.0} IOPS, {:.2} MiB/s, mean latency {:.1} us",
        all.iops(secs),
        all.mib_s(secs),
        us(all.mean_ns())
    );
    let (zc, copied) = r
        .queues
        .iter()
        .fold((0, 0), |(a, b), q| (a + q.zc_calls, b + q.zc_copied));
    if zc > 0 {
        let _ = writeln!(
            s,
            "zero-copy sends of write data: {zc} call(s), {copied} copied by the kernel anyway"
        );
    }
    if r.paths.len() > 1 {
        format_paths(&mut s, r, secs);
    }
    for q in &r.queues {
        if let Some(e) = &q.first_error {
            let _ = writeln!(s, "ERROR: q{}: {} I/O errors; first: {e}", q.qid, q.errors);
        }
        if q.lost > 0 {
            let _ = writeln!(
                s,
                "ERROR: q{}: {} I/Os never completed (drain timed out)",
                q.qid, q.lost
            );
        }
    }
    for f in &r.failures {
        let _ = writeln!(s, "ERROR: {f}");
    }
    if r.verify {
        let bad = r.mismatched_blocks();
        let _ = writeln!(
            s,
            "verify: {} blocks checked, {} mismatched{}",
            r.verified_blocks(),
            bad,
            if bad == 0 { " - OK" } else { " - FAILED" }
        );
        for q in &r.queues {
            for m in &q.mismatches {
                let _ = writeln!(
                    s,
                    "  MISMATCH q{} LBA {}: found LBA {} tag {:#x}, expected tag {:#x}, first difference at byte {}",
                    q.qid, m.lba, m.found_lba, m.found_tag, m.expected_tag, m.offset
                );
            }
        }
    }
    s
}

/// The per-path table: figures of each path and what happened to it.
fn format_paths(s: &mut String, r: &PerfReport, secs: f64) {
    let _ = writeln!(
        s,
        "{:<22} {:>6} {:<15} {:>11} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7} {:>7} {:>13}",
        "path",
        "cntlid",
        "state",
        "IOPS",
        "MiB/s",
        "mean(us)",
        "p99(us)",
        "retried",
        "failover",
        "errors",
        "changes",
        "I/O from-to s"
    );
    for p in &r.paths {
        let mut all = p.read.clone();
        all.merge(&p.write);
        let span = match (p.first_io_s, p.last_io_s) {
            (Some(a), Some(b)) => format!("{a:.1}-{b:.1}"),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "{:<22} {:>6} {:<15} {:>11.0} {:>9.2} {:>9.1} {:>9.1} {:>8} {:>8} {:>7} {:>7} {:>13}",
            p.name,
            p.cntlid,
            p.state,
            all.iops(secs),
            all.mib_s(secs),
            us(all.mean_ns()),
            us(all.percentile(99.0) as f64),
            p.retried,
            p.failed_over,
            p.errors,
            p.state_changes,
            span
        );
    }
    for p in &r.paths {
        if let Some(f) = &p.failure {
            let _ = writeln!(
                s,
                "path {} lost at {:.2} s: {f}{}",
                p.name,
                p.failed_at_s.unwrap_or(0.0),
                match p.reconnects {
                    0 => String::new(),
                    n => format!(" (connected again {n} time(s))"),
                }
            );
        }
    }
}

fn path_json(p: &PathReport, secs: f64) -> Value {
    json!({
        "path": p.name,
        "trid": p.trid,
        "cntlid": p.cntlid,
        "ana_reporting": p.ana_reporting,
        "state": p.state,
        "state_changes": p.state_changes,
        "ana_log_reads": p.ana_log_reads,
        "total_ios": p.ios(),
        "read": dir_json(&p.read, secs),
        "write": dir_json(&p.write, secs),
        "retried": p.retried,
        "failed_over": p.failed_over,
        "reconnects": p.reconnects,
        "error": p.errors,
        "first_io_s": p.first_io_s,
        "last_io_s": p.last_io_s,
        "failure": p.failure,
        "failed_at_s": p.failed_at_s,
    })
}

fn dir_json(d: &DirStats, secs: f64) -> Value {
    let mean = d.mean_ns();
    let stddev = if d.ios > 0 { d.hist.stdev() } else { 0.0 };
    let mut pct = Map::new();
    for p in [
        1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9,
        99.95, 99.99,
    ] {
        pct.insert(format!("{p:.6}"), json!(d.percentile(p)));
    }
    let lat = json!({
        "min": d.min(), "max": d.max_ns, "mean": mean, "stddev": stddev, "N": d.ios,
    });
    let mut clat = lat.clone();
    clat["percentile"] = Value::Object(pct);
    json!({
        "io_bytes": d.bytes,
        "io_kbytes": d.bytes / 1024,
        "bw_bytes": (d.bytes as f64 / secs.max(1e-9)) as u64,
        "bw": (d.bytes as f64 / 1024.0 / secs.max(1e-9)) as u64,
        "iops": d.iops(secs),
        "runtime": (secs * 1000.0) as u64,
        "total_ios": d.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "slat_ns": {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0},
        "clat_ns": clat,
        "lat_ns": lat,
    })
}

/// fio-style JSON report: `jobs[]` (one per queue) with `read`/`write`
/// objects using fio's field names (`iops`, `bw` in KiB/s, `lat_ns`,
/// `clat_ns.percentile`), plus `total`, `verify`, `policy` and `paths[]`
/// (one per path: its figures, retries, fail-overs, ANA state, failure).
pub fn to_json(r: &PerfReport) -> Value {
    let secs = r.runtime.as_secs_f64();
    let jobs: Vec<Value> = r
        .queues
        .iter()
        .map(|q| {
            json!({
                "jobname": format!("q{}", q.qid),
                "groupid": 0,
                "qid": q.qid,
                "cpu": q.core,
                "thread": q.thread,
                "ran_on_cpu": q.ran_on,
                "error": q.errors + q.lost,
                "first_error": q.first_error,
                "job_runtime": (secs * 1000.0) as u64,
                "read": dir_json(&q.read, secs),
                "write": dir_json(&q.write, secs),
                "verify": {"blocks_checked": q.verified_blocks, "mismatched_blocks": q.mismatched_blocks},
            })
        })
        .collect();
    let mismatches: Vec<Value> = r
        .queues
        .iter()
        .flat_map(|q| {
            q.mismatches.iter().map(move |m| {
                json!({"qid": q.qid, "lba": m.lba, "found_lba": m.found_lba,
                       "found_tag": m.found_tag, "expected_tag": m.expected_tag, "offset": m.offset})
            })
        })
        .collect();
    json!({
        "nvmf_version": env!("CARGO_PKG_VERSION"),
        "timestamp": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "global options": {
            "rw": r.workload.name(),
            "bs": r.io_size.to_string(),
            "iodepth": r.queue_depth.to_string(),
            "rwmixread": r.read_pct.to_string(),
            "numjobs": r.queues.len().to_string(),
            "runtime": format!("{:.3}", secs),
            "trid": r.trid,
            "nsid": r.nsid,
            "block_size": r.block_size,
            "in_capsule": r.in_capsule,
            "hdr_digest": r.hdr_digest,
            "data_digest": r.data_digest,
        },
        "jobs": jobs,
        "total": {
            "read": dir_json(&r.total_read(), secs),
            "write": dir_json(&r.total_write(), secs),
            "error": r.errors(),
        },
        "failures": r.failures,
        "policy": r.policy.name(),
        "paths": r.paths.iter().map(|p| path_json(p, secs)).collect::<Vec<_>>(),
        "verify": {
            "enabled": r.verify,
            "blocks_checked": r.verified_blocks(),
            "mismatched_blocks": r.mismatched_blocks(),
            "mismatches": mismatches,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_json_shape() {
        let mut d = DirStats::new();
        for i in 1..=1000u64 {
            d.record(4096, i * 1000);
        }
        assert_eq!(d.ios, 1000);
        assert_eq!(d.min(), 1000);
        let p99 = d.percentile(99.0);
        assert!((985_000..=995_000).contains(&p99), "{p99}");
        let v = dir_json(&d, 1.0);
        assert_eq!(v["iops"], json!(1000.0));
        assert_eq!(v["bw"], json!(4000));
        assert!(v["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
        assert_eq!(v["lat_ns"]["min"], json!(1000));
    }
}
