//! bench/results.rs — the data model of a bench run, shared by the runner,
//! the engines, the outputs (JSON/CSV/Markdown/HTML) and `bench compare`:
//! what one run of one cell measured (`Measurement`), the figures derived
//! per cell over its rounds (`CellSummary`: min/mean/max ranges,
//! efficiency against the baseline, ratio to the goal), the machine the
//! run happened on (`MachineContext`) and the whole report
//! (`BenchReport`), which is what the JSON output holds and what `bench
//! compare` reads back. Plain serde structs, no I/O.

use serde::{Deserialize, Serialize};

/// Version of the JSON layout (bump on incompatible changes).
pub const REPORT_FORMAT: u32 = 1;

/// Latency figures of one direction or of all I/O, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub mean_us: f64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
    pub max_us: f64,
    /// The percentile curve for charts: (percentile 0..100, microseconds),
    /// ascending; may be empty when the engine gives no distribution.
    #[serde(default)]
    pub curve: Vec<(f64, f64)>,
}

/// What one direction did during the measured window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DirFigures {
    pub ios: u64,
    pub bytes: u64,
    pub latency: Latency,
}

/// What an engine measured in one run (the measured window only; ramp
/// excluded).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineResult {
    /// Measured seconds (wall clock of the measured window).
    pub seconds: f64,
    pub read: DirFigures,
    pub write: DirFigures,
    /// Latency over reads and writes together.
    pub all: Latency,
    /// Commands that failed (any status other than success, lost I/O).
    pub errors: u64,
    /// The exact command line that reproduces this run by hand (for an
    /// in-process engine, the equivalent `nvmf perf` command).
    pub command: String,
    /// Process ids of the initiator's own processes, when the engine ran
    /// outside this process (for CPU accounting); empty = this process.
    #[serde(default)]
    pub initiator_pids: Vec<u32>,
    /// CPU seconds (user + system) the initiator used in the measured
    /// window, when the engine measured it itself (fio reports it).
    #[serde(default)]
    pub initiator_cpu_s: Option<f64>,
}

/// CPU figures of one run, from /proc (utime + stime, all threads).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuFigures {
    /// CPU seconds used by the initiator during the measured window.
    pub initiator_s: Option<f64>,
    /// CPU seconds used by the target's processes (when they are local
    /// and known) during the measured window.
    pub target_s: Option<f64>,
    /// initiator_s / I/Os, in microseconds.
    pub initiator_us_per_io: Option<f64>,
    pub target_us_per_io: Option<f64>,
    /// Cores busy on average: cpu seconds / measured seconds.
    pub initiator_cores: Option<f64>,
    pub target_cores: Option<f64>,
    /// `perf stat` counts per I/O where the machine can count them
    /// (None with a reason in `Measurement::notes` when it cannot).
    pub target_cycles_per_io: Option<f64>,
    pub target_instructions_per_io: Option<f64>,
    pub initiator_cycles_per_io: Option<f64>,
    pub initiator_instructions_per_io: Option<f64>,
}

/// One run: one cell in one round.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// `target/workload`.
    pub cell: String,
    pub target: String,
    pub workload: String,
    /// 0-based round.
    pub round: u32,
    /// Engine name (`nvmf-perf`, `fio`, `fio-kernel`, `spdk-perf`, ...).
    pub engine: String,
    /// Client machines that generated the load together (1 unless fio
    /// client/server mode drove several); per-client figures and the goal
    /// ratio divide by it.
    #[serde(default = "one")]
    pub clients: u32,
    pub result: EngineResult,
    /// I/O per second over reads and writes.
    pub iops: f64,
    /// MiB/s (2^20 bytes) over reads and writes.
    pub mibps: f64,
    /// Gbit/s of payload (10^9 bits), reads and writes together.
    pub gbps: f64,
    pub cpu: CpuFigures,
    /// The target's own I/O counters for the measured window when the
    /// harness can read them (nvmfd: `nvmf_get_stats`), for a cross-check
    /// with the engine's count (reads, writes).
    pub target_ios: Option<(u64, u64)>,
    /// Host load during the run: 1-minute load average at the end and the
    /// share of CPU time stolen by the hypervisor (percent).
    pub load1: Option<f64>,
    pub steal_pct: Option<f64>,
    /// CPUs the initiator was pinned to.
    pub pinned: Vec<usize>,
    /// Warnings (placement, busy cores, counter mismatch, no perf counters).
    pub notes: Vec<String>,
    /// Seconds since the Unix epoch when the measured window began.
    pub started_unix: f64,
}

fn one() -> u32 {
    1
}

/// min / mean / max of one figure over a cell's rounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Range {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

impl Range {
    /// The range of `v` (None when empty).
    pub fn of(v: impl IntoIterator<Item = f64>) -> Option<Range> {
        let (mut n, mut sum, mut min, mut max) = (0usize, 0.0, f64::INFINITY, f64::NEG_INFINITY);
        for x in v {
            n += 1;
            sum += x;
            min = min.min(x);
            max = max.max(x);
        }
        (n > 0).then(|| Range {
            min,
            mean: sum / n as f64,
            max,
        })
    }
    /// Whether two ranges share any value.
    pub fn overlaps(&self, o: &Range) -> bool {
        self.min <= o.max && o.min <= self.max
    }
}

/// The figures of one cell over all its rounds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CellSummary {
    pub cell: String,
    pub target: String,
    pub workload: String,
    /// Rounds that completed.
    pub runs: u32,
    pub iops: Range,
    pub mibps: Range,
    pub gbps: Range,
    pub lat_mean_us: Range,
    pub lat_p50_us: Range,
    pub lat_p99_us: Range,
    pub lat_p999_us: Range,
    pub lat_p9999_us: Range,
    pub initiator_us_per_io: Option<Range>,
    pub target_us_per_io: Option<Range>,
    pub target_cycles_per_io: Option<Range>,
    pub errors: u64,
    /// Mean IOPS of this cell / mean IOPS of its baseline cell (the
    /// baseline target on the same workload, or the named cell).
    pub efficiency: Option<f64>,
    /// The baseline cell compared with.
    pub baseline_cell: Option<String>,
    /// Mean per-client figure / declared goal.
    pub goal_ratio: Option<f64>,
}

/// Where and on what the run happened.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineContext {
    pub hostname: String,
    pub cpu_model: String,
    /// Online CPUs.
    pub cpus: usize,
    pub numa_nodes: usize,
    pub kernel: String,
    pub memory_gib: f64,
    /// Interfaces used (name, driver, speed in Mbit/s when known).
    pub nics: Vec<String>,
    /// `nvmf` version and the versions of external tools used.
    pub versions: Vec<(String, String)>,
    /// 1-minute load average before the first run.
    pub load1_before: f64,
    /// Whether a hypervisor is visible (cpuinfo `hypervisor` flag).
    pub virtualized: bool,
}

/// Where one target's initiator was placed (from `placement.rs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlacementRecord {
    pub target: String,
    pub interface: Option<String>,
    pub node: Option<u32>,
    pub node_cpus: Vec<usize>,
    pub pinned: Vec<usize>,
    /// CPUs a harness-started target's reactors were pinned to.
    pub target_cpus: Vec<usize>,
    pub warnings: Vec<String>,
}

/// A whole bench run: what the JSON output holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub format: u32,
    /// The spec as given (file path or preset name) and its text.
    pub spec_source: String,
    pub spec_text: String,
    /// The command line of this `nvmf bench run`.
    pub command: String,
    pub started_unix: f64,
    pub finished_unix: f64,
    /// True when Ctrl-C (or an error) ended the run before the matrix was
    /// done; the measurements so far are kept.
    pub interrupted: bool,
    pub machine: MachineContext,
    pub placements: Vec<PlacementRecord>,
    pub baseline: Option<String>,
    /// The goal as text (`10000 IOPS per client`).
    pub goal: Option<String>,
    pub measurements: Vec<Measurement>,
    pub cells: Vec<CellSummary>,
    /// Runs that failed (cell, round, why).
    pub failures: Vec<(String, u32, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_of_and_overlap() {
        assert_eq!(Range::of(Vec::<f64>::new()), None);
        let a = Range::of([1.0, 3.0, 2.0]).unwrap();
        assert_eq!((a.min, a.mean, a.max), (1.0, 2.0, 3.0));
        let b = Range::of([3.0, 4.0]).unwrap();
        let c = Range::of([3.5, 4.0]).unwrap();
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&c) && !c.overlaps(&a));
    }

    #[test]
    fn report_round_trips_through_json() {
        let mut r = BenchReport {
            format: REPORT_FORMAT,
            ..Default::default()
        };
        r.measurements.push(Measurement {
            cell: "a/b".into(),
            target_ios: Some((1, 2)),
            ..Default::default()
        });
        let s = serde_json::to_string(&r).unwrap();
        let back: BenchReport = serde_json::from_str(&s).unwrap();
        assert_eq!(back, r);
    }
}
