//! Per-path statistics: what a reactor reports for each path (subsystem,
//! listener `traddr:trsvcid`, transport, host NQN, controller ID) and how
//! the control plane adds reactors' reports up.
//!
//! Owns [`PathKey`], [`PathStats`], [`PathTable`] (a reactor's totals of
//! closed queues by path, and the sum of one snapshot), [`GoneHosts`] (which
//! hosts keep a series of their own once their controllers are gone), the
//! JSON form of `nvmf_get_path_stats` and the per-namespace sums
//! `bdev_get_iostat` is made of ([`namespace_io`]). Nothing here runs per
//! I/O: the reactor folds a queue's counters (`QueuePair::stats`,
//! `QueuePair::ns_stats`) in when the queue closes, and copies the open
//! queues' counters when asked for a snapshot.
//!
//! Bounded: a path of a live controller is keyed by its controller ID; once
//! the controller is gone (no queue holds it any more: its `Weak` no longer
//! upgrades), its counters are folded into the path's "gone" entry for its
//! host (`cntlid` [`CNTLID_GONE`]), so a reconnecting host adds nothing.
//! Per (subsystem, listener, transport) at most [`GONE_HOSTS_MAX`] hosts
//! get a gone entry of their own, first come first kept; the gone
//! controllers of further hosts are folded under host [`OTHER_HOSTS`]. The
//! choice is made once, process-wide ([`GoneHosts`], shared by every
//! reactor and the gatherer), so a host never moves between its own entry
//! and "other" and every total only grows. A reactor sweeps its table when
//! it has grown to twice its size at the last sweep; the gatherer sweeps
//! each snapshot with one verdict per controller, so all parts of one
//! controller land on the same side in one answer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use nvmf_core::controller::{Controller, QueueStats};
use nvmf_core::queue::QueuePair;
use nvmf_core::stats::{bucket_upper_ns, Histogram, NsTable};
use nvmf_wire::status::Status;
use serde_json::{json, Value};

/// `PathKey::cntlid` of the entry that holds the counters of a host's
/// controllers that are gone (a real controller ID is never 0).
pub const CNTLID_GONE: u16 = 0;

/// Hosts per (subsystem, listener, transport) whose gone controllers keep
/// an entry of their own; the gone controllers of further hosts are added
/// up under [`OTHER_HOSTS`]. Live controllers are bounded by the target's
/// host limits (`--max-controllers`), so with this every table is bounded.
pub const GONE_HOSTS_MAX: usize = 64;

/// Host "NQN" of the gone controllers of hosts past [`GONE_HOSTS_MAX`] (a
/// host NQN starts with `nqn.`, so no host is called that).
pub const OTHER_HOSTS: &str = "other";

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
    /// The host NQN, or [`OTHER_HOSTS`] (gone controllers of hosts past
    /// [`GONE_HOSTS_MAX`]).
    pub hostnqn: String,
    /// [`CNTLID_GONE`]: that host's controllers that are gone, together.
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

    /// True for the entry of gone controllers.
    pub fn is_gone(&self) -> bool {
        self.cntlid == CNTLID_GONE
    }
}

/// Which hosts have a gone entry of their own, per (subsystem, listener,
/// transport): the first [`GONE_HOSTS_MAX`] hosts whose controller went
/// away there. Shared by every reactor and the gatherer (taken only when a
/// controller's counters are folded, never per I/O); a host once admitted
/// stays, so the same host always folds the same way.
#[derive(Debug, Default)]
pub struct GoneHosts {
    admitted: Mutex<HashMap<ListenerOf, HashSet<String>>>,
}

/// (subsystem NQN, listener, transport) of a path.
type ListenerOf = (String, String, &'static str);

impl GoneHosts {
    /// The gone entry a controller of path `k` folds into.
    pub fn gone_key(&self, k: &PathKey) -> PathKey {
        let mut g = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        let hosts = g
            .entry((k.subnqn.clone(), k.listener.clone(), k.trtype))
            .or_default();
        let own = hosts.contains(&k.hostnqn)
            || (hosts.len() < GONE_HOSTS_MAX && hosts.insert(k.hostnqn.clone()));
        PathKey {
            subnqn: k.subnqn.clone(),
            listener: k.listener.clone(),
            trtype: k.trtype,
            hostnqn: if own {
                k.hostnqn.clone()
            } else {
                OTHER_HOSTS.to_string()
            },
            cntlid: CNTLID_GONE,
        }
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
    /// The controller of a live path, to tell when it is gone (None for a
    /// gone entry, or an entry made up by hand).
    pub ctrl: Option<Weak<Controller>>,
}

impl PathStats {
    /// Adds `o`'s counters (the controller stays this entry's, if it has
    /// one).
    pub fn add(&mut self, o: &PathStats) {
        if self.ctrl.is_none() {
            self.ctrl.clone_from(&o.ctrl);
        }
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
    /// Entries after the last sweep (the next one comes at twice as many).
    swept_len: usize,
}

/// Entries a reactor's table may reach before its first sweep.
const SWEEP_MIN: usize = 64;

impl PathTable {
    /// Folds a closing queue's counters in; gone controllers are swept out
    /// from time to time (see the module comment), so the table stays
    /// bounded however many controllers come and go.
    pub fn fold_closed(&mut self, q: &QueuePair, gone: &GoneHosts) {
        let (Some(key), Some(ctrl)) = (PathKey::of(q), q.controller()) else {
            return;
        };
        // A controller ID used again: the entry is an earlier controller's.
        if let Some(old) = self.paths.get(&key) {
            let same = old
                .ctrl
                .as_ref()
                .is_none_or(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(ctrl)));
            if !same {
                let old = self.paths.remove(&key).expect("just seen");
                self.add_gone(&key, &old, gone);
            }
        }
        let e = self.paths.entry(key).or_default();
        if e.ctrl.is_none() {
            e.ctrl = Some(Arc::downgrade(ctrl));
        }
        e.stats.add(q.stats());
        e.ns.add(q.ns_stats());
        if self.paths.len() >= (2 * self.swept_len).max(SWEEP_MIN) {
            self.sweep(gone);
        }
    }

    /// Adds an open queue (`in_flight` commands outstanding).
    pub fn add_open(&mut self, q: &QueuePair, in_flight: usize) {
        let (Some(key), Some(ctrl)) = (PathKey::of(q), q.controller()) else {
            return;
        };
        let e = self.paths.entry(key).or_default();
        if e.ctrl.is_none() {
            e.ctrl = Some(Arc::downgrade(ctrl));
        }
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

    /// Folds the entries of controllers that are gone into their gone
    /// entries.
    pub fn sweep(&mut self, gone: &GoneHosts) {
        self.sweep_with(gone, &mut HashMap::new());
    }

    /// `sweep` with the verdicts of a whole gathering: one per controller
    /// (by address), decided the first time it is seen.
    fn sweep_with(&mut self, gone: &GoneHosts, alive: &mut HashMap<usize, bool>) {
        let dead: Vec<PathKey> = self
            .paths
            .iter()
            .filter(|(k, p)| {
                !k.is_gone()
                    && p.ctrl.as_ref().is_some_and(|w| {
                        !*alive
                            .entry(w.as_ptr() as usize)
                            .or_insert_with(|| w.strong_count() > 0)
                    })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in dead {
            if let Some(p) = self.paths.remove(&k) {
                self.add_gone(&k, &p, gone);
            }
        }
        self.swept_len = self.paths.len();
    }

    fn add_gone(&mut self, k: &PathKey, p: &PathStats, gone: &GoneHosts) {
        let e = self.paths.entry(gone.gone_key(k)).or_default();
        // A gone controller has no open queue and nothing in flight.
        e.stats.add(&p.stats);
        e.ns.add(&p.ns);
    }

    /// The reactors' snapshot tables added up, gone controllers swept out
    /// of each first with one verdict per controller (what every reader of
    /// the path table gets: RPCs and `/metrics`).
    pub fn gather<'a>(
        tables: impl IntoIterator<Item = &'a PathTable>,
        gone: &GoneHosts,
    ) -> PathTable {
        let mut alive = HashMap::new();
        let mut t = PathTable::default();
        for s in tables {
            let mut s = s.clone();
            s.sweep_with(gone, &mut alive);
            t.merge(&s);
        }
        t
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(host: &str, listener: &str) -> PathKey {
        PathKey {
            subnqn: "nqn.s".into(),
            listener: listener.into(),
            trtype: "TCP",
            hostnqn: host.into(),
            cntlid: 7,
        }
    }

    #[test]
    fn gone_hosts_are_capped_per_listener_and_never_move() {
        let g = GoneHosts::default();
        for i in 0..GONE_HOSTS_MAX {
            let k = g.gone_key(&key(&format!("nqn.h{i}"), "a:1"));
            assert_eq!(k.hostnqn, format!("nqn.h{i}"));
            assert!(k.is_gone());
        }
        // Past the cap: "other"; another listener has its own cap.
        assert_eq!(g.gone_key(&key("nqn.late", "a:1")).hostnqn, OTHER_HOSTS);
        assert_eq!(g.gone_key(&key("nqn.late", "b:1")).hostnqn, "nqn.late");
        // An admitted host keeps its entry, a late one stays "other".
        assert_eq!(g.gone_key(&key("nqn.h3", "a:1")).hostnqn, "nqn.h3");
        assert_eq!(g.gone_key(&key("nqn.late", "a:1")).hostnqn, OTHER_HOSTS);
    }

    #[test]
    fn entries_without_a_controller_are_kept_by_a_sweep() {
        let g = GoneHosts::default();
        let mut t = PathTable::default();
        let mut p = PathStats::default();
        p.stats.commands = 5;
        t.paths.insert(key("nqn.h", "a:1"), p.clone());
        // A controller that is gone: its Weak no longer upgrades.
        p.ctrl = Some(Weak::new());
        let mut k = key("nqn.h", "a:1");
        k.cntlid = 8;
        t.paths.insert(k, p);
        let s = PathTable::gather([&t], &g);
        assert_eq!(s.paths.len(), 2, "{s:#?}");
        assert_eq!(s.paths[&key("nqn.h", "a:1")].stats.commands, 5);
        let gone = g.gone_key(&key("nqn.h", "a:1"));
        assert_eq!(s.paths[&gone].stats.commands, 5);
    }
}
