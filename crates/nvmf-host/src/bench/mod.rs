//! `nvmf bench`: benchmark matrices against NVMe-oF targets (issue 11).
//! Built so far: the spec (`spec.rs`: TOML file or preset, checked), the
//! run matrix (`matrix.rs`: targets × workloads × rounds, alternating and
//! rotating), the initiator's placement (`placement.rs`: route, NUMA
//! node, CPUs, busy cores), and here the plan that `nvmf bench plan`
//! prints from them; the reports of a run (`summary.rs`: per-cell
//! figures; `output.rs`: JSON, CSV, Markdown, terminal table; `html.rs`:
//! the HTML pages with charts) and `compare.rs` (`nvmf bench compare`);
//! the runner (`run.rs`, with `cpu.rs` and `machine.rs`), the load
//! generators behind `engine.rs` (`engines/`) and the targets behind
//! `target.rs` (`targets/`).

pub mod compare;
pub mod cpu;
pub mod engine;
pub mod engines;
pub mod html;
pub mod machine;
pub mod matrix;
pub mod output;
pub mod placement;
pub mod results;
pub mod run;
pub mod spec;
pub mod summary;
pub mod target;
pub mod targets;

use matrix::Run;
use placement::{format_cpulist, Host, Placement};
use spec::{size_name, BenchSpec, Goal, TargetKind};
use std::fmt::Write as _;
use std::time::Duration;

/// Everything `nvmf bench plan` shows.
#[derive(Debug, Clone)]
pub struct Plan {
    pub spec: BenchSpec,
    /// One per target, in spec order.
    pub placements: Vec<Placement>,
    pub runs: Vec<Run>,
    pub estimated: Duration,
}

impl Plan {
    /// Place every target on `host` (busy cores sampled for `sample`) and
    /// expand the matrix.
    pub fn new(spec: BenchSpec, host: &Host, sample: Duration) -> Plan {
        let busy = if sample.is_zero() {
            Vec::new()
        } else {
            host.sample_busy(sample)
        };
        // One pinned initiator thread per queue of the widest workload.
        let want = spec
            .workloads
            .iter()
            .map(|w| w.queues as usize)
            .max()
            .unwrap_or(1);
        let placements = spec
            .targets
            .iter()
            .map(|t| placement::place(host, t.addr(), want, &busy))
            .collect();
        let runs = matrix::expand(&spec);
        let estimated = matrix::estimated_time(&spec, &runs);
        Plan {
            spec,
            placements,
            runs,
            estimated,
        }
    }

    /// The text `nvmf bench plan` prints.
    pub fn render(&self) -> String {
        let s = &self.spec;
        let mut o = String::new();
        let _ = writeln!(o, "Targets and placement:");
        for (t, p) in s.targets.iter().zip(&self.placements) {
            let what = match &t.kind {
                TargetKind::Nvmfd {
                    config,
                    addr,
                    binary,
                    args,
                } => {
                    let mut w = format!("nvmfd started from {} on {addr}", config.display());
                    if let Some(b) = binary {
                        w += &format!(" ({})", b.display());
                    }
                    if !args.is_empty() {
                        w += &format!(" with {}", args.join(" "));
                    }
                    w
                }
                TargetKind::Trid(trid) => format!("running target '{trid}'"),
                TargetKind::Spdk(sp) => format!(
                    "SPDK {} started from {} on '{}'",
                    sp.binary.display(),
                    sp.config.display(),
                    sp.trid
                ),
                TargetKind::Kernel(k) => format!(
                    "Linux kernel target (configfs) on '{}', backed by {}",
                    k.trid(),
                    k.backing.display()
                ),
            };
            let _ = writeln!(o, "  {}: {what}", t.name);
            let node = match p.node {
                Some(n) => format!("NUMA node {n}, its CPUs {}", format_cpulist(&p.cpus)),
                None => format!(
                    "no NUMA information, CPUs {} (all online)",
                    format_cpulist(&p.cpus)
                ),
            };
            let _ = writeln!(
                o,
                "    interface {}, {node}",
                p.interface.as_deref().unwrap_or("unknown"),
            );
            let _ = writeln!(o, "    initiator pinned to CPUs {}", format_cpulist(&p.pin));
            for w in &p.warnings {
                let _ = writeln!(o, "    WARNING: {w}");
            }
        }
        let _ = writeln!(o, "\nWorkloads:");
        for w in &s.workloads {
            let mix = match w.rw {
                crate::perf::Workload::Rw | crate::perf::Workload::RandRw => {
                    format!(" {}% reads", w.mix)
                }
                _ => String::new(),
            };
            let _ = writeln!(
                o,
                "  {}: {}{mix}, bs {}, qd {}, {} queue(s), {} s + {} s ramp",
                w.name,
                w.rw.name(),
                size_name(w.bs),
                w.qd,
                w.queues,
                w.runtime_s,
                w.ramp_s
            );
        }
        let _ = write!(o, "Engine: {}", s.engine.name());
        if let Some(p) = s.spdk_perf.as_ref().or(s.fio_engine.as_ref()) {
            let _ = write!(o, " ({})", p.display());
        }
        if !s.clients.is_empty() {
            let c: Vec<String> = s.clients.iter().map(|c| c.to_string()).collect();
            let _ = write!(o, ", clients {}", c.join(", "));
        }
        let _ = writeln!(o);
        if let Some(b) = &s.baseline {
            let _ = writeln!(o, "Baseline: {b}");
        }
        match s.goal {
            Some(Goal::Iops(v)) => {
                let _ = writeln!(o, "Goal: {v} IOPS per client");
            }
            Some(Goal::MiBps(v)) => {
                let _ = writeln!(o, "Goal: {v} MiB/s per client");
            }
            None => {}
        }
        let _ = writeln!(
            o,
            "\nRuns: {} targets x {} workloads x {} rounds = {}",
            s.targets.len(),
            s.workloads.len(),
            s.repetitions,
            self.runs.len()
        );
        for r in &self.runs {
            let w = &s.workloads[r.workload];
            let _ = writeln!(
                o,
                "  {:>4}  round {:<3} {}  ({} s)",
                r.index + 1,
                r.round + 1,
                r.cell,
                w.ramp_s + w.runtime_s
            );
        }
        let secs = self.estimated.as_secs();
        let _ = writeln!(
            o,
            "Estimated time: {}h{:02}m{:02}s (ramp + runtime; connection and target start-up not counted)",
            secs / 3600,
            secs / 60 % 60,
            secs % 60
        );
        o
    }
}
