//! The run matrix: targets × workloads × repetitions expanded into the
//! ordered list of runs the bench executes.
//!
//! A cell is one (target, workload) pair; its id is `target/workload`. A
//! round runs every cell once. Within a round the targets alternate
//! (workload-major, target-minor: every target runs a workload before the
//! next workload starts), and each round rotates both orders by its number
//! (round r starts at target r mod T and workload r mod W), so slow drift
//! (warming caches, filling devices, thermal limits, a neighbour's load)
//! lands on every variant alike instead of always on the same one. Pure
//! and deterministic: the same spec always gives the same list.

use super::spec::BenchSpec;
use std::time::Duration;

/// One run of the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// Position in the whole list (0-based).
    pub index: usize,
    /// Round (repetition), 0-based.
    pub round: u32,
    /// Index into `BenchSpec::targets`.
    pub target: usize,
    /// Index into `BenchSpec::workloads`.
    pub workload: usize,
    /// Stable cell id: `target/workload`.
    pub cell: String,
}

/// The cell id of a target and a workload.
pub fn cell_id(target: &str, workload: &str) -> String {
    format!("{target}/{workload}")
}

/// Expand the spec into its ordered run list.
pub fn expand(spec: &BenchSpec) -> Vec<Run> {
    let (nt, nw) = (spec.targets.len(), spec.workloads.len());
    let mut runs = Vec::with_capacity(nt * nw * spec.repetitions as usize);
    for round in 0..spec.repetitions {
        let r = round as usize;
        for wi in 0..nw {
            let w = (wi + r) % nw;
            for ti in 0..nt {
                let t = (ti + r) % nt;
                runs.push(Run {
                    index: runs.len(),
                    round,
                    target: t,
                    workload: w,
                    cell: cell_id(&spec.targets[t].name, &spec.workloads[w].name),
                });
            }
        }
    }
    runs
}

/// Time the runs take: ramp + runtime each (connection set-up and a
/// harness-started target's start-up are not counted).
pub fn estimated_time(spec: &BenchSpec, runs: &[Run]) -> Duration {
    Duration::from_secs(
        runs.iter()
            .map(|r| {
                let w = &spec.workloads[r.workload];
                w.ramp_s + w.runtime_s
            })
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn spec(targets: usize, workloads: usize, reps: u32) -> BenchSpec {
        let mut t = format!("repetitions = {reps}\n");
        for i in 0..targets {
            t += &format!(
                "[[target]]\nname = \"t{i}\"\nkind = \"trid\"\ntrid = \"traddr:127.0.0.1 trsvcid:{} subnqn:nqn.x\"\n",
                4420 + i
            );
        }
        for i in 0..workloads {
            t += &format!("[[workload]]\nname = \"w{i}\"\nruntime = 10\nramp = {i}\n");
        }
        BenchSpec::from_toml(&t, std::path::Path::new("."), &[]).unwrap()
    }

    #[test]
    fn counts_and_every_cell_once_per_round() {
        let s = spec(3, 2, 4);
        let runs = expand(&s);
        assert_eq!(runs.len(), 3 * 2 * 4);
        for (i, r) in runs.iter().enumerate() {
            assert_eq!(r.index, i);
            assert_eq!(r.cell, format!("t{}/w{}", r.target, r.workload));
        }
        for round in 0..4 {
            let cells: HashSet<&str> = runs
                .iter()
                .filter(|r| r.round == round)
                .map(|r| r.cell.as_str())
                .collect();
            assert_eq!(cells.len(), 6, "round {round}");
        }
        // Rounds are contiguous: all of round r before round r+1.
        assert!(runs.windows(2).all(|w| w[0].round <= w[1].round));
        // ramp + runtime: 4 rounds × 3 targets × ((0+10) + (1+10)) s.
        assert_eq!(estimated_time(&s, &runs), Duration::from_secs(4 * 3 * 21));
    }

    #[test]
    fn targets_alternate_and_rounds_rotate() {
        let s = spec(2, 2, 3);
        let runs = expand(&s);
        let order = |round: u32| -> Vec<&str> {
            runs.iter()
                .filter(|r| r.round == round)
                .map(|r| r.cell.as_str())
                .collect()
        };
        assert_eq!(order(0), ["t0/w0", "t1/w0", "t0/w1", "t1/w1"]);
        assert_eq!(order(1), ["t1/w1", "t0/w1", "t1/w0", "t0/w0"]);
        for r in 0..2 {
            assert_ne!(order(r), order(r + 1), "round {r} and {} alike", r + 1);
            // Each round starts with a different cell than the last.
            assert_ne!(order(r)[0], order(r + 1)[0]);
        }
        // Over two rounds each target goes first for each workload once.
        let firsts: HashSet<&str> = (0..2)
            .flat_map(|r| order(r).chunks(2).map(|c| c[0]).collect::<Vec<_>>())
            .collect();
        assert_eq!(firsts.len(), 4);
    }

    #[test]
    fn deterministic() {
        let s = spec(3, 4, 5);
        assert_eq!(expand(&s), expand(&s));
        assert_eq!(expand(&spec(1, 1, 2)).len(), 2);
    }
}
