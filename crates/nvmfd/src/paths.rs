//! Per-path statistics: what a reactor reports for each path (subsystem,
//! listener `traddr:trsvcid`, host NQN, controller ID) and how the control
//! plane adds reactors' reports up.
//!
//! Owns [`PathKey`], [`PathStats`], [`PathTable`] (a reactor's totals of
//! closed queues by path, and the sum of one snapshot), the JSON form of
//! `nvmf_get_path_stats` and the per-namespace sums `bdev_get_iostat` is
//! made of ([`namespace_io`]). Nothing here runs per I/O: the reactor folds a
//! queue's counters (`QueuePair::stats`, `QueuePair::ns_stats`) in when the
//! queue closes, and copies the open queues' counters when asked for a
//! snapshot.

use std::collections::HashMap;

use nvmf_core::controller::QueueStats;
use nvmf_core::queue::QueuePair;
use nvmf_core::stats::{bucket_upper_ns, Histogram, NsTable};
use nvmf_wire::status::Status;
use serde_json::{json, Value};

/// Closed paths a reactor keeps apart; the queues of further controllers
/// are folded into controller ID 0 of their (subsystem, listener, host).
pub const CLOSED_PATHS_MAX: usize = 1024;

/// One path: which subsystem, through which listener, which host, which
/// controller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathKey {
    pub subnqn: String,
    /// `traddr:trsvcid` of the listener the host connected through.
    pub listener: String,
    /// Its transport, SPDK's spelling (`TCP`, `RDMA`): a TCP and an RDMA
    /// listener may share `traddr:trsvcid`.
    pub trtype: &'static str,
    pub hostnqn: String,
    /// 0: controllers gone, folded together (see `CLOSED_PATHS_MAX`).
    pub cntlid: u16,
}

impl PathKey {
    /// The path of a connected queue; None before Connect.
    pub fn of(q: &QueuePair) -> Option<PathKey> {
        let ctrl = q.controller()?;
        let port = q.port();
        Some(PathKey {
            subnqn: ctrl.subsystem().nqn().to_string(),
            listener: listener_name(&port.traddr, &port.trsvcid),
            trtype: port.trtype.as_str(),
            hostnqn: ctrl.hostnqn().to_string(),
            cntlid: ctrl.cntlid(),
        })
    }
}

/// `traddr:trsvcid` (IPv6 addresses in brackets).
pub fn listener_name(traddr: &str, trsvcid: &str) -> String {
    if traddr.contains(':') {
        format!("[{traddr}]:{trsvcid}")
    } else {
        format!("{traddr}:{trsvcid}")
    }
}

/// Counters of one path (all its queues, open and closed).
#[derive(Debug, Clone, Default)]
pub struct PathStats {
    /// Queue pairs open now (admin + I/O).
    pub qpairs: u64,
    /// Commands received and not yet answered, on the open I/O queues.
    pub in_flight: u64,
    pub stats: QueueStats,
    pub ns: NsTable,
}

impl PathStats {
    pub fn add(&mut self, o: &PathStats) {
        self.qpairs += o.qpairs;
        self.in_flight += o.in_flight;
        self.stats.add(&o.stats);
        self.ns.add(&o.ns);
    }

    /// Reads and writes over all namespaces: (reads, writes, bytes read,
    /// bytes written, read latency, write latency).
    pub fn io_totals(&self) -> (u64, u64, u64, u64, Histogram, Histogram) {
        let mut t = (0, 0, 0, 0, Histogram::default(), Histogram::default());
        for n in self.ns.iter() {
            t.0 += n.reads;
            t.1 += n.writes;
            t.2 += n.bytes_read;
            t.3 += n.bytes_written;
            t.4.add(&n.read_latency);
            t.5.add(&n.write_latency);
        }
        t
    }
}

/// Paths and their counters.
#[derive(Debug, Clone, Default)]
pub struct PathTable {
    pub paths: HashMap<PathKey, PathStats>,
}

impl PathTable {
    /// Folds a closing queue's counters in (bounded: see
    /// `CLOSED_PATHS_MAX`).
    pub fn fold_closed(&mut self, q: &QueuePair) {
        let Some(mut key) = PathKey::of(q) else {
            return;
        };
        if !self.paths.contains_key(&key) && self.paths.len() >= CLOSED_PATHS_MAX {
            key.cntlid = 0;
        }
        let e = self.paths.entry(key).or_default();
        e.stats.add(q.stats());
        e.ns.add(q.ns_stats());
    }

    /// Adds an open queue (`in_flight` commands outstanding).
    pub fn add_open(&mut self, q: &QueuePair, in_flight: usize) {
        let Some(key) = PathKey::of(q) else {
            return;
        };
        let e = self.paths.entry(key).or_default();
        e.qpairs += 1;
        if q.qid() != 0 {
            e.in_flight += in_flight as u64;
        }
        e.stats.add(q.stats());
        e.ns.add(q.ns_stats());
    }

    /// Adds another table (another reactor's).
    pub fn merge(&mut self, o: &PathTable) {
        for (k, v) in &o.paths {
            self.paths.entry(k.clone()).or_default().add(v);
        }
    }

    /// Paths sorted by key.
    pub fn sorted(&self) -> Vec<(&PathKey, &PathStats)> {
        let mut v: Vec<_> = self.paths.iter().collect();
        v.sort_by(|a, b| a.0.cmp(b.0));
        v
    }
}

/// Reads and Writes per (subsystem, NSID) over every path: what
/// `bdev_get_iostat` adds up by bdev. NSID 0 (a queue's namespaces beyond
/// `NS_PER_QUEUE`, folded together) names no namespace and is left out.
pub fn namespace_io(t: &PathTable) -> Vec<nvmf_rpc::NamespaceIo> {
    let mut by_ns: HashMap<(&str, u32), nvmf_rpc::NamespaceIo> = HashMap::new();
    for (key, p) in &t.paths {
        for n in p.ns.iter().filter(|n| n.nsid != 0) {
            let e = by_ns
                .entry((key.subnqn.as_str(), n.nsid))
                .or_insert_with(|| nvmf_rpc::NamespaceIo {
                    nqn: key.subnqn.clone(),
                    nsid: n.nsid,
                    ..Default::default()
                });
            e.reads += n.reads;
            e.writes += n.writes;
            e.bytes_read += n.bytes_read;
            e.bytes_written += n.bytes_written;
            e.read_latency_ns = e.read_latency_ns.wrapping_add(n.read_latency.sum_ns());
            e.write_latency_ns = e.write_latency_ns.wrapping_add(n.write_latency.sum_ns());
        }
    }
    let mut v: Vec<_> = by_ns.into_values().collect();
    v.sort_by(|a, b| (&a.nqn, a.nsid).cmp(&(&b.nqn, b.nsid)));
    v
}

/// A histogram as JSON: count, sum, mean, p50/p90/p99/p999 (bucket upper
/// bounds, ns) and the non-empty buckets as `[upper_ns, count]`.
pub fn histogram_json(h: &Histogram) -> Value {
    let buckets: Vec<Value> = h
        .buckets()
        .iter()
        .enumerate()
        .filter(|(_, &c)| c != 0)
        .map(|(i, &c)| json!([bucket_upper_ns(i), c]))
        .collect();
    json!({
        "count": h.count(),
        "sum_ns": h.sum_ns(),
        "mean_ns": h.sum_ns().checked_div(h.count()).unwrap_or(0),
        "p50_ns": h.quantile_ns(0.50),
        "p90_ns": h.quantile_ns(0.90),
        "p99_ns": h.quantile_ns(0.99),
        "p999_ns": h.quantile_ns(0.999),
        "buckets": buckets,
    })
}

/// Errors by status as JSON: `[{sct, sc, name, count}]` (+ `other`).
pub fn errors_json(s: &QueueStats) -> Value {
    let mut v: Vec<Value> = s
        .errors_by_status
        .iter()
        .map(|(sct, sc, n)| {
            let st = Status {
                sct,
                sc,
                dnr: false,
                more: false,
            };
            json!({ "sct": sct, "sc": sc, "name": st.name(), "count": n })
        })
        .collect();
    if s.errors_by_status.other != 0 {
        v.push(json!({ "name": "other", "count": s.errors_by_status.other }));
    }
    Value::Array(v)
}

/// `nvmf_get_path_stats` result.
pub fn path_stats_json(t: &PathTable, tick_rate: u64, uptime_us: u64) -> Value {
    let paths: Vec<Value> = t
        .sorted()
        .into_iter()
        .map(|(k, p)| {
            let (reads, writes, br, bw, rl, wl) = p.io_totals();
            let ns: Vec<Value> = {
                let mut v: Vec<_> = p.ns.iter().collect();
                v.sort_by_key(|n| n.nsid);
                v.into_iter()
                    .map(|n| {
                        json!({
                            "nsid": n.nsid,
                            "reads": n.reads,
                            "writes": n.writes,
                            "bytes_read": n.bytes_read,
                            "bytes_written": n.bytes_written,
                            "errors": n.errors,
                            "read_latency": histogram_json(&n.read_latency),
                            "write_latency": histogram_json(&n.write_latency),
                        })
                    })
                    .collect()
            };
            json!({
                "subnqn": k.subnqn,
                "listener": k.listener,
                "trtype": k.trtype,
                "hostnqn": k.hostnqn,
                "cntlid": k.cntlid,
                "qpairs": p.qpairs,
                "in_flight": p.in_flight,
                "commands": p.stats.commands,
                "errors": p.stats.errors,
                "errors_by_status": errors_json(&p.stats),
                "reads": reads,
                "writes": writes,
                "bytes_read": br,
                "bytes_written": bw,
                "read_latency": histogram_json(&rl),
                "write_latency": histogram_json(&wl),
                "namespaces": ns,
            })
        })
        .collect();
    json!({ "tick_rate": tick_rate, "uptime_us": uptime_us, "paths": paths })
}

/// Per-listener totals for `nvmf_get_stats` (`listeners`): every path
/// through a listener (address and transport) added up.
pub fn listeners_json(t: &PathTable) -> Value {
    let mut by: std::collections::BTreeMap<(&str, &str), PathStats> = Default::default();
    for (k, p) in &t.paths {
        by.entry((k.listener.as_str(), k.trtype))
            .or_default()
            .add(p);
    }
    Value::Array(
        by.into_iter()
            .map(|((l, trtype), p)| {
                let (reads, writes, br, bw, rl, wl) = p.io_totals();
                json!({
                    "listener": l,
                    "trtype": trtype,
                    "qpairs": p.qpairs,
                    "in_flight": p.in_flight,
                    "commands": p.stats.commands,
                    "reads": reads,
                    "writes": writes,
                    "bytes_read": br,
                    "bytes_written": bw,
                    "errors": p.stats.errors,
                    "read_latency_mean_ns": rl.sum_ns().checked_div(rl.count()).unwrap_or(0),
                    "read_latency_p99_ns": rl.quantile_ns(0.99),
                    "write_latency_mean_ns": wl.sum_ns().checked_div(wl.count()).unwrap_or(0),
                    "write_latency_p99_ns": wl.quantile_ns(0.99),
                })
            })
            .collect(),
    )
}
