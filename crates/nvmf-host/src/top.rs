//! `nvmf top`: a live view of nvmfd's per-path statistics.
//!
//! Owns the interval arithmetic and the text rendering of `nvmf top`: two
//! samples of `nvmf_get_path_stats` (counters and latency histograms per
//! subsystem, listener, host, controller and namespace) are subtracted into
//! per-interval rates (IOPS, MiB/s, mean and p99 latency from the
//! histogram buckets that filled in the interval), grouped four ways
//! (listener, path, host, namespace), and flagged: `STALLED` when commands
//! are in flight and none completed in the interval (a dead or hung path),
//! `SLOW` when a row's mean or p99 latency is more than `SLOW_FACTOR` times
//! the median of its view's rows with I/O. The CLI (`bin/nvmf.rs`) does the
//! RPC calls, the timing and the terminal.
//!
//! A controller that went away between two samples has its counts folded
//! into its host's gone entry (cntlid 0; host `other` when nvmfd folds that
//! host's gone controllers together): that entry's interval starts from
//! its earlier value plus the vanished controller's, so the move is not
//! shown as I/O.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// A row is `SLOW` when its mean or p99 latency exceeds this many times
/// the median of the rows of its view that had I/O.
pub const SLOW_FACTOR: f64 = 3.0;

/// Latency histogram as the RPC reports it: count, sum and non-empty
/// buckets by upper bound (ns).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lat {
    pub count: u64,
    pub sum_ns: u64,
    pub buckets: BTreeMap<u64, u64>,
}

impl Lat {
    fn from_json(v: &Value) -> Lat {
        let mut l = Lat {
            count: v["count"].as_u64().unwrap_or(0),
            sum_ns: v["sum_ns"].as_u64().unwrap_or(0),
            buckets: BTreeMap::new(),
        };
        for b in v["buckets"].as_array().into_iter().flatten() {
            if let (Some(up), Some(n)) = (b[0].as_u64(), b[1].as_u64()) {
                *l.buckets.entry(up).or_default() += n;
            }
        }
        l
    }

    fn add(&mut self, o: &Lat) {
        self.count += o.count;
        self.sum_ns = self.sum_ns.wrapping_add(o.sum_ns);
        for (k, v) in &o.buckets {
            *self.buckets.entry(*k).or_default() += v;
        }
    }

    fn since(&self, earlier: &Lat) -> Lat {
        let mut l = self.clone();
        l.count = l.count.saturating_sub(earlier.count);
        l.sum_ns = l.sum_ns.wrapping_sub(earlier.sum_ns);
        for (k, v) in &earlier.buckets {
            if let Some(x) = l.buckets.get_mut(k) {
                *x = x.saturating_sub(*v);
            }
        }
        l
    }

    /// Mean in µs (0 without values).
    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.count as f64 / 1000.0
        }
    }

    /// Upper bound (µs) of the bucket holding quantile `q`.
    pub fn quantile_us(&self, q: f64) -> f64 {
        let total: u64 = self.buckets.values().sum();
        if total == 0 {
            return 0.0;
        }
        let rank = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (up, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return *up as f64 / 1000.0;
            }
        }
        0.0
    }
}

/// Counters of one row (a path, or a sum of paths / namespaces).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counters {
    /// All commands (paths only; namespaces count reads + writes).
    pub commands: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    /// A gauge: commands outstanding at the sample (paths only).
    pub in_flight: u64,
    pub lat: Lat,
}

impl Counters {
    fn add(&mut self, o: &Counters) {
        self.commands += o.commands;
        self.reads += o.reads;
        self.writes += o.writes;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.errors += o.errors;
        self.in_flight += o.in_flight;
        self.lat.add(&o.lat);
    }

    /// What happened between `earlier` and `self` (the gauge is `self`'s).
    fn since(&self, earlier: &Counters) -> Counters {
        Counters {
            commands: self.commands.saturating_sub(earlier.commands),
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            bytes_read: self.bytes_read.saturating_sub(earlier.bytes_read),
            bytes_written: self.bytes_written.saturating_sub(earlier.bytes_written),
            errors: self.errors.saturating_sub(earlier.errors),
            in_flight: self.in_flight,
            lat: self.lat.since(&earlier.lat),
        }
    }
}

/// Identity of a path in a sample.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathId {
    pub subnqn: String,
    pub listener: String,
    pub hostnqn: String,
    pub cntlid: u64,
}

/// One `nvmf_get_path_stats` result, parsed.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub paths: HashMap<PathId, Counters>,
    /// (subsystem, NSID) of each path's namespaces.
    pub ns: HashMap<(PathId, u64), Counters>,
}

fn lat_of(v: &Value) -> Lat {
    let mut l = Lat::from_json(&v["read_latency"]);
    l.add(&Lat::from_json(&v["write_latency"]));
    l
}

impl Sample {
    pub fn from_json(v: &Value) -> Sample {
        let mut s = Sample::default();
        for p in v["paths"].as_array().into_iter().flatten() {
            let id = PathId {
                subnqn: p["subnqn"].as_str().unwrap_or("").to_string(),
                listener: p["listener"].as_str().unwrap_or("").to_string(),
                hostnqn: p["hostnqn"].as_str().unwrap_or("").to_string(),
                cntlid: p["cntlid"].as_u64().unwrap_or(0),
            };
            let c = Counters {
                commands: p["commands"].as_u64().unwrap_or(0),
                reads: p["reads"].as_u64().unwrap_or(0),
                writes: p["writes"].as_u64().unwrap_or(0),
                bytes_read: p["bytes_read"].as_u64().unwrap_or(0),
                bytes_written: p["bytes_written"].as_u64().unwrap_or(0),
                errors: p["errors"].as_u64().unwrap_or(0),
                in_flight: p["in_flight"].as_u64().unwrap_or(0),
                lat: lat_of(p),
            };
            for n in p["namespaces"].as_array().into_iter().flatten() {
                let reads = n["reads"].as_u64().unwrap_or(0);
                let writes = n["writes"].as_u64().unwrap_or(0);
                let nc = Counters {
                    commands: reads + writes,
                    reads,
                    writes,
                    bytes_read: n["bytes_read"].as_u64().unwrap_or(0),
                    bytes_written: n["bytes_written"].as_u64().unwrap_or(0),
                    errors: n["errors"].as_u64().unwrap_or(0),
                    in_flight: 0,
                    lat: lat_of(n),
                };
                s.ns.insert((id.clone(), n["nsid"].as_u64().unwrap_or(0)), nc);
            }
            s.paths.insert(id, c);
        }
        s
    }
}

/// One line of a view.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    pub iops: f64,
    pub mib_s: f64,
    pub mean_us: f64,
    pub p99_us: f64,
    pub in_flight: u64,
    pub errors: u64,
    /// `STALLED`, `SLOW`, or empty.
    pub flag: &'static str,
}

/// The four views of one interval.
#[derive(Debug, Clone, Default)]
pub struct Frame {
    pub seconds: f64,
    pub listeners: Vec<Row>,
    pub paths: Vec<Row>,
    pub hosts: Vec<Row>,
    pub namespaces: Vec<Row>,
}

fn rows(groups: BTreeMap<String, Counters>, secs: f64, stall_check: bool) -> Vec<Row> {
    let secs = secs.max(1e-6);
    let mut v: Vec<Row> = groups
        .into_iter()
        .map(|(name, d)| {
            let done = d.commands;
            let stalled = stall_check && d.in_flight > 0 && done == 0;
            Row {
                name,
                iops: (d.reads + d.writes) as f64 / secs,
                mib_s: (d.bytes_read + d.bytes_written) as f64 / secs / 1048576.0,
                mean_us: d.lat.mean_us(),
                p99_us: d.lat.quantile_us(0.99),
                in_flight: d.in_flight,
                errors: d.errors,
                flag: if stalled { "STALLED" } else { "" },
            }
        })
        .collect();
    // Latency outliers against the median of rows with I/O.
    let mut means: Vec<f64> = v
        .iter()
        .filter(|r| r.iops > 0.0)
        .map(|r| r.mean_us)
        .collect();
    let mut p99s: Vec<f64> = v
        .iter()
        .filter(|r| r.iops > 0.0)
        .map(|r| r.p99_us)
        .collect();
    if means.len() >= 2 {
        means.sort_by(f64::total_cmp);
        p99s.sort_by(f64::total_cmp);
        let (mm, pm) = (median(&means), median(&p99s));
        for r in v.iter_mut().filter(|r| r.iops > 0.0 && r.flag.is_empty()) {
            if r.mean_us > SLOW_FACTOR * mm || r.p99_us > SLOW_FACTOR * pm {
                r.flag = "SLOW";
            }
        }
    }
    v
}

/// Median of a sorted, non-empty list (the lower one of an even count, so
/// one slow row of two stands out against the other).
fn median(sorted: &[f64]) -> f64 {
    sorted[(sorted.len() - 1) / 2]
}

/// Host NQN of the gone entry of hosts nvmfd folds together.
pub const OTHER_HOSTS: &str = "other";

/// Where the counts of `prev`'s paths that are gone from `cur` went: their
/// host's gone entry (cntlid 0) in `cur`, else the `other` one.
fn vanished_into(prev: &Sample, cur: &Sample) -> HashMap<PathId, Vec<PathId>> {
    let mut into: HashMap<PathId, Vec<PathId>> = HashMap::new();
    for id in prev.paths.keys() {
        if id.cntlid == 0 || cur.paths.contains_key(id) {
            continue;
        }
        let mut gone = PathId {
            cntlid: 0,
            ..id.clone()
        };
        if !cur.paths.contains_key(&gone) {
            gone.hostnqn = OTHER_HOSTS.to_string();
        }
        into.entry(gone).or_default().push(id.clone());
    }
    into
}

/// The interval between two samples taken `secs` apart.
pub fn frame(prev: &Sample, cur: &Sample, secs: f64) -> Frame {
    let into = vanished_into(prev, cur);
    // An entry's earlier value, with what vanished into it.
    let base = |id: &PathId| -> Counters {
        let mut b = prev.paths.get(id).cloned().unwrap_or_default();
        for v in into.get(id).into_iter().flatten() {
            b.add(&prev.paths[v]);
        }
        b
    };
    let ns_base = |id: &PathId, nsid: u64| -> Counters {
        let mut b = prev
            .ns
            .get(&(id.clone(), nsid))
            .cloned()
            .unwrap_or_default();
        for v in into.get(id).into_iter().flatten() {
            if let Some(c) = prev.ns.get(&(v.clone(), nsid)) {
                b.add(c);
            }
        }
        b
    };
    let mut listeners: BTreeMap<String, Counters> = BTreeMap::new();
    let mut paths = BTreeMap::new();
    let mut hosts: BTreeMap<String, Counters> = BTreeMap::new();
    let mut namespaces: BTreeMap<String, Counters> = BTreeMap::new();
    for (id, c) in &cur.paths {
        let d = c.since(&base(id));
        listeners
            .entry(format!("{} {}", id.listener, id.subnqn))
            .or_default()
            .add(&d);
        hosts.entry(id.hostnqn.clone()).or_default().add(&d);
        paths.insert(
            format!(
                "{} {} {} ctrl {}",
                id.listener, id.subnqn, id.hostnqn, id.cntlid
            ),
            d,
        );
    }
    for ((id, nsid), c) in &cur.ns {
        let d = c.since(&ns_base(id, *nsid));
        namespaces
            .entry(format!("{} ns {nsid}", id.subnqn))
            .or_default()
            .add(&d);
    }
    Frame {
        seconds: secs,
        listeners: rows(listeners, secs, true),
        paths: rows(paths, secs, true),
        hosts: rows(hosts, secs, true),
        namespaces: rows(namespaces, secs, false),
    }
}

/// The frame as text; `color` highlights flagged rows (ANSI, terminals only).
pub fn render(f: &Frame, color: bool) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "nvmf top: last {:.1} s", f.seconds);
    for (title, rows) in [
        ("LISTENER SUBSYSTEM", &f.listeners),
        ("PATH (LISTENER SUBSYSTEM HOST CONTROLLER)", &f.paths),
        ("HOST", &f.hosts),
        ("NAMESPACE", &f.namespaces),
    ] {
        let _ = writeln!(
            out,
            "\n{:>10} {:>9} {:>9} {:>9} {:>7} {:>6} {:<7} {title}",
            "IOPS", "MiB/s", "mean_us", "p99_us", "inflt", "errs", "FLAG"
        );
        if rows.is_empty() {
            let _ = writeln!(out, "{:>10} (none)", "-");
        }
        for r in rows.iter() {
            let line = format!(
                "{:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>6} {:<7} {}",
                r.iops, r.mib_s, r.mean_us, r.p99_us, r.in_flight, r.errors, r.flag, r.name
            );
            if color && !r.flag.is_empty() {
                let _ = writeln!(out, "\x1b[1;31m{line}\x1b[0m");
            } else {
                let _ = writeln!(out, "{line}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path(listener: &str, commands: u64, reads: u64, in_flight: u64, lat_sum: u64) -> Value {
        json!({
            "subnqn": "nqn.x", "listener": listener, "hostnqn": "nqn.h", "cntlid": 1,
            "commands": commands, "reads": reads, "writes": 0,
            "bytes_read": reads * 4096, "bytes_written": 0, "errors": 0,
            "in_flight": in_flight,
            "read_latency": { "count": reads, "sum_ns": lat_sum, "buckets": [[lat_sum / reads.max(1), reads]] },
            "write_latency": { "count": 0, "sum_ns": 0, "buckets": [] },
            "namespaces": [{ "nsid": 1, "reads": reads, "writes": 0, "bytes_read": reads * 4096,
                "bytes_written": 0, "errors": 0,
                "read_latency": { "count": reads, "sum_ns": lat_sum, "buckets": [[lat_sum / reads.max(1), reads]] },
                "write_latency": { "count": 0, "sum_ns": 0, "buckets": [] } }],
        })
    }

    fn path_of(host: &str, cntlid: u64, reads: u64) -> Value {
        let mut p = path("10.0.0.1:4420", reads, reads, 0, reads * 20_000);
        p["hostnqn"] = json!(host);
        p["cntlid"] = json!(cntlid);
        p
    }

    #[test]
    fn a_controller_folded_into_its_gone_entry_is_not_io() {
        let a = Sample::from_json(&json!({ "paths": [
            path_of("nqn.h", 1, 1000),
            path_of("nqn.h", 0, 500),
            path_of("nqn.late", 2, 300),
            path_of("other", 0, 100),
        ]}));
        // Both controllers gone: nqn.h's into its own entry (+10 reads
        // since), nqn.late's into "other" (+5 reads since).
        let b = Sample::from_json(&json!({ "paths": [
            path_of("nqn.h", 0, 1510),
            path_of("other", 0, 405),
        ]}));
        let f = frame(&a, &b, 1.0);
        assert_eq!(f.listeners.len(), 1);
        assert_eq!(f.listeners[0].iops, 15.0, "{f:#?}");
        assert_eq!(f.namespaces[0].iops, 15.0, "{f:#?}");
        let host = |h: &str| f.hosts.iter().find(|r| r.name == h).unwrap().iops;
        assert_eq!(host("nqn.h"), 10.0);
        assert_eq!(host("other"), 5.0);
    }

    #[test]
    fn rates_and_flags() {
        let a = Sample::from_json(&json!({ "paths": [
            path("10.0.0.1:4420", 10, 10, 0, 10 * 20_000),
            path("10.0.0.2:4420", 10, 10, 0, 10 * 20_000),
            path("10.0.0.3:4420", 10, 10, 0, 10 * 20_000),
        ]}));
        let b = Sample::from_json(&json!({ "paths": [
            // 1000 reads of 20 µs.
            path("10.0.0.1:4420", 1010, 1010, 4, 1010 * 20_000),
            // In flight, nothing completed: stalled.
            path("10.0.0.2:4420", 10, 10, 8, 10 * 20_000),
            // 1000 reads of 200 µs: slow.
            path("10.0.0.3:4420", 1010, 1010, 2, 10 * 20_000 + 1000 * 200_000),
        ]}));
        let f = frame(&a, &b, 1.0);
        assert_eq!(f.listeners.len(), 3);
        let l = &f.listeners;
        assert_eq!(l[0].iops, 1000.0);
        assert!((l[0].mib_s - 1000.0 * 4096.0 / 1048576.0).abs() < 1e-9);
        assert_eq!(l[0].mean_us, 20.0);
        assert_eq!(l[0].flag, "");
        assert_eq!(l[1].flag, "STALLED");
        assert_eq!(l[1].in_flight, 8);
        assert_eq!(l[2].flag, "SLOW");
        assert_eq!(l[2].mean_us, 200.0);
        assert_eq!(f.hosts.len(), 1);
        assert_eq!(f.hosts[0].iops, 2000.0);
        assert_eq!(f.namespaces.len(), 1);
        assert_eq!(f.namespaces[0].iops, 2000.0);
        let text = render(&f, false);
        assert!(text.contains("STALLED"), "{text}");
        assert!(!text.contains('\x1b'));
        assert!(render(&f, true).contains("\x1b[1;31m"));
    }
}
