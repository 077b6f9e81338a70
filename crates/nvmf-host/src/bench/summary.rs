//! bench/summary.rs — per-cell figures over a cell's rounds: min / mean /
//! max of every figure, errors summed, efficiency against the baseline
//! cell and the ratio to the declared goal (`CellSummary`, results.rs).
//! Pure functions over `Measurement`s; no I/O.
//!
//! Efficiency compares means: mean IOPS of the cell / mean IOPS of its
//! baseline cell, except for throughput cells, where it is the ratio of
//! mean MiB/s. A cell counts as throughput when its average I/O size
//! (mean MiB/s × 2^20 / mean IOPS, i.e. bytes per I/O of the measured
//! windows) is at least 64 KiB (`THROUGHPUT_IO_BYTES`); the rated cell's
//! size picks the figure for both sides. The baseline is a
//! target name (each cell is compared with that target's cell on the same
//! workload) or a cell id `target/workload` (every cell is compared with
//! that one cell).

use super::results::{CellSummary, Measurement, Range};
use super::spec::Goal;

/// Average I/O size from which a cell is a throughput cell (efficiency in
/// MiB/s instead of IOPS).
pub const THROUGHPUT_IO_BYTES: f64 = 64.0 * 1024.0;

/// Average bytes per I/O of a summarized cell (None without I/O).
pub fn io_bytes(c: &CellSummary) -> Option<f64> {
    (c.iops.mean > 0.0).then(|| c.mibps.mean * 1048576.0 / c.iops.mean)
}

/// Whether a cell is judged by MiB/s rather than IOPS.
pub fn is_throughput(c: &CellSummary) -> bool {
    io_bytes(c).is_some_and(|b| b >= THROUGHPUT_IO_BYTES)
}

/// A Range over the rounds that have the figure (None when none has it).
fn opt_range<'a>(
    ms: &[&'a Measurement],
    f: impl Fn(&'a Measurement) -> Option<f64>,
) -> Option<Range> {
    Range::of(ms.iter().filter_map(|m| f(m)))
}

/// Summarize `measurements` per cell, in the order cells first appear.
/// `baseline` and `goal` as in the spec (see the top comment).
pub fn summarize(
    measurements: &[Measurement],
    baseline: Option<&str>,
    goal: Option<Goal>,
) -> Vec<CellSummary> {
    let mut order: Vec<&str> = Vec::new();
    for m in measurements {
        if !order.contains(&m.cell.as_str()) {
            order.push(&m.cell);
        }
    }
    let mut cells: Vec<CellSummary> = order
        .iter()
        .map(|&id| {
            let ms: Vec<&Measurement> = measurements.iter().filter(|m| m.cell == id).collect();
            let r =
                |f: fn(&Measurement) -> f64| Range::of(ms.iter().map(|m| f(m))).unwrap_or_default();
            let goal_ratio = goal.map(|g| {
                let (figure, want) = match g {
                    Goal::Iops(v) => (r(|m| m.iops / m.clients.max(1) as f64).mean, v),
                    Goal::MiBps(v) => (r(|m| m.mibps / m.clients.max(1) as f64).mean, v),
                };
                figure / want
            });
            CellSummary {
                cell: id.to_string(),
                target: ms[0].target.clone(),
                workload: ms[0].workload.clone(),
                runs: ms.len() as u32,
                iops: r(|m| m.iops),
                mibps: r(|m| m.mibps),
                gbps: r(|m| m.gbps),
                lat_mean_us: r(|m| m.result.all.mean_us),
                lat_p50_us: r(|m| m.result.all.p50_us),
                lat_p99_us: r(|m| m.result.all.p99_us),
                lat_p999_us: r(|m| m.result.all.p999_us),
                lat_p9999_us: r(|m| m.result.all.p9999_us),
                initiator_us_per_io: opt_range(&ms, |m| m.cpu.initiator_us_per_io),
                target_us_per_io: opt_range(&ms, |m| m.cpu.target_us_per_io),
                target_cycles_per_io: opt_range(&ms, |m| m.cpu.target_cycles_per_io),
                errors: ms.iter().map(|m| m.result.errors).sum(),
                efficiency: None,
                baseline_cell: None,
                goal_ratio,
            }
        })
        .collect();
    if let Some(b) = baseline {
        // (cell, mean IOPS, mean MiB/s)
        let means: Vec<(String, f64, f64)> = cells
            .iter()
            .map(|c| (c.cell.clone(), c.iops.mean, c.mibps.mean))
            .collect();
        for c in &mut cells {
            // A target name has no '/' (spec.rs refuses it), a cell id has one.
            let base = if b.contains('/') {
                b.to_string()
            } else {
                super::matrix::cell_id(b, &c.workload)
            };
            let Some((_, base_iops, base_mibps)) = means.iter().find(|(id, ..)| *id == base) else {
                continue;
            };
            // The rated cell's I/O size picks the figure, for both sides.
            let (own, base_fig) = if is_throughput(c) {
                (c.mibps.mean, *base_mibps)
            } else {
                (c.iops.mean, *base_iops)
            };
            c.efficiency = (base_fig > 0.0).then(|| own / base_fig);
            c.baseline_cell = Some(base);
        }
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::{CpuFigures, EngineResult, Latency};

    /// A measurement of `cell` with `iops` 4 KiB I/Os per second over 1 s
    /// (or `bs`-byte I/Os), p99 `p99` µs.
    fn m(cell: &str, round: u32, iops: f64, bs: f64, p99: f64) -> Measurement {
        let (t, w) = cell.split_once('/').unwrap();
        Measurement {
            cell: cell.into(),
            target: t.into(),
            workload: w.into(),
            round,
            clients: 1,
            iops,
            mibps: iops * bs / 1048576.0,
            gbps: iops * bs * 8.0 / 1e9,
            result: EngineResult {
                seconds: 1.0,
                all: Latency {
                    p99_us: p99,
                    ..Default::default()
                },
                errors: round as u64,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn ranges_errors_and_first_seen_order() {
        let mut ms = vec![
            m("b/w", 0, 300.0, 4096.0, 50.0),
            m("a/w", 0, 100.0, 4096.0, 10.0),
            m("a/w", 1, 200.0, 4096.0, 30.0),
            m("b/w", 1, 500.0, 4096.0, 70.0),
            m("a/w", 2, 600.0, 4096.0, 20.0),
        ];
        ms[1].cpu = CpuFigures {
            target_us_per_io: Some(4.0),
            ..Default::default()
        };
        ms[4].cpu.target_us_per_io = Some(8.0);
        let s = summarize(&ms, None, None);
        assert_eq!(
            s.iter().map(|c| c.cell.as_str()).collect::<Vec<_>>(),
            ["b/w", "a/w"]
        );
        let a = &s[1];
        assert_eq!(
            (a.target.as_str(), a.workload.as_str(), a.runs),
            ("a", "w", 3)
        );
        assert_eq!((a.iops.min, a.iops.mean, a.iops.max), (100.0, 300.0, 600.0));
        // 300 IOPS x 4096 B = 1228800 B/s = 1.171875 MiB/s.
        assert_eq!(a.mibps.mean, 1.171875);
        assert_eq!(
            (a.lat_p99_us.min, a.lat_p99_us.mean, a.lat_p99_us.max),
            (10.0, 20.0, 30.0)
        );
        // Only the rounds that have a figure count; none -> None.
        assert_eq!(
            a.target_us_per_io,
            Some(Range {
                min: 4.0,
                mean: 6.0,
                max: 8.0
            })
        );
        assert_eq!(a.initiator_us_per_io, None);
        // errors = round numbers summed: 0 + 1 + 2.
        assert_eq!(a.errors, 3);
        assert_eq!(s[0].errors, 1);
        assert_eq!(
            (a.efficiency, a.goal_ratio, a.baseline_cell.as_ref()),
            (None, None, None)
        );
    }

    #[test]
    fn efficiency_against_a_target_or_a_cell() {
        let ms = vec![
            m("n/w1", 0, 1000.0, 4096.0, 1.0),
            m("n/w1", 1, 3000.0, 4096.0, 1.0), // mean 2000
            m("s/w1", 0, 4000.0, 4096.0, 1.0), // mean 4000
            m("n/w2", 0, 100.0, 4096.0, 1.0),
            m("s/w2", 0, 400.0, 4096.0, 1.0),
        ];
        let s = summarize(&ms, Some("s"), None);
        let e: Vec<_> = s
            .iter()
            .map(|c| (c.efficiency, c.baseline_cell.as_deref()))
            .collect();
        assert_eq!(
            e,
            [
                (Some(0.5), Some("s/w1")),
                (Some(1.0), Some("s/w1")),
                (Some(0.25), Some("s/w2")),
                (Some(1.0), Some("s/w2")),
            ]
        );
        // A cell id: every cell against that one (mean 2000 IOPS).
        let s = summarize(&ms, Some("n/w1"), None);
        let e: Vec<_> = s.iter().map(|c| c.efficiency.unwrap()).collect();
        assert_eq!(e, [1.0, 2.0, 0.05, 0.2]);
        assert!(s.iter().all(|c| c.baseline_cell.as_deref() == Some("n/w1")));
        // A baseline without a measured cell on that workload: left out.
        let s = summarize(&ms[..3], Some("s"), None);
        assert_eq!(s[0].efficiency, Some(0.5));
        let s = summarize(&ms[3..4], Some("s"), None);
        assert_eq!((s[0].efficiency, s[0].baseline_cell.as_ref()), (None, None));
    }

    #[test]
    fn throughput_cells_compare_mibps() {
        // 128 KiB I/Os: A does 100 IOPS = 12.5 MiB/s; B does 50 IOPS of
        // 256 KiB = 12.5 MiB/s: equal throughput (1.0) though the IOPS
        // differ by 2x. Small I/Os compare IOPS (0.5) though MiB/s match.
        let ms = vec![
            m("a/seq", 0, 100.0, 131072.0, 1.0),
            m("b/seq", 0, 50.0, 262144.0, 1.0),
            m("a/small", 0, 100.0, 4096.0, 1.0),
            m("b/small", 0, 50.0, 8192.0, 1.0),
            m("a/edge", 0, 100.0, 65536.0, 1.0),
            m("b/edge", 0, 50.0, 131072.0, 1.0),
            m("a/under", 0, 100.0, 65024.0, 1.0),
            m("b/under", 0, 50.0, 130048.0, 1.0),
        ];
        let s = summarize(&ms, Some("a"), None);
        assert!(is_throughput(&s[0]) && is_throughput(&s[1]));
        assert_eq!(io_bytes(&s[0]), Some(131072.0));
        let e: Vec<_> = s.iter().map(|c| c.efficiency.unwrap()).collect();
        assert_eq!(e[..4], [1.0, 1.0, 1.0, 0.5]);
        // The rated cell's I/O size picks the figure for both sides:
        // exactly 64 KiB is throughput (MiB/s ratio 1), 512 bytes less is
        // not (IOPS ratio 2).
        let s = summarize(&ms, Some("b"), None);
        assert!(is_throughput(&s[4]) && !is_throughput(&s[6]));
        assert_eq!((s[4].efficiency, s[6].efficiency), (Some(1.0), Some(2.0)));
    }

    #[test]
    fn goal_ratio_is_per_client() {
        let mut ms = vec![
            m("a/w", 0, 10000.0, 4096.0, 1.0),
            m("a/w", 1, 30000.0, 4096.0, 1.0),
        ];
        ms[1].clients = 2; // 15000 per client; mean per client (10000 + 15000) / 2
        let s = summarize(&ms, None, Some(Goal::Iops(10000.0)));
        assert_eq!(s[0].goal_ratio, Some(1.25));
        // MiB/s goal: 10000 x 4 KiB = 39.0625 MiB/s, 30000 / 2 x 4 KiB = 58.59375.
        let s = summarize(&ms, None, Some(Goal::MiBps(48.828125)));
        assert_eq!(s[0].goal_ratio, Some(1.0));
        // clients = 0 (a broken file) counts as 1, never a division by zero.
        ms[1].clients = 0;
        let s = summarize(&ms, None, Some(Goal::Iops(20000.0)));
        assert_eq!(s[0].goal_ratio, Some(1.0));
    }
}
