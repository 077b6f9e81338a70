//! bench/run.rs — `nvmf bench run`: executes a plan's runs in order. Each
//! target is started once before its first run and all are stopped at the
//! end (also after a failure or Ctrl-C); each run goes to the engine with
//! the placement's pinned CPUs, and around the engine's measured window
//! (`Window::Start` / `Window::End`) the runner reads the target's CPU
//! time (`/proc/PID/stat` of its pids), the initiator's (this process, or
//! what the engine measured itself), `/proc/stat` steal, `/proc/loadavg`,
//! the target's own I/O counters, and `perf stat` cycles/instructions
//! where perf can count. It derives the per-run figures (`derive`), keeps
//! failed runs in `failures` and goes on, and at the end summarizes the
//! cells and writes the outputs.

use super::cpu::{self, Counts, PerfStat, Proc, StatTotals};
use super::engine::{EngineJob, Window};
use super::engines::{self, EngineOptions};
use super::machine::Machine;
use super::matrix::Run;
use super::results::{
    BenchReport, CpuFigures, EngineResult, Measurement, PlacementRecord, REPORT_FORMAT,
};
use super::spec::{Goal, WorkloadSpec};
use super::target::{BenchTarget, Endpoint};
use super::targets::{self, TargetOptions};
use super::Plan;
use super::{output, summary};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// How `nvmf bench run` was asked to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Where the outputs go (created if missing).
    pub out: PathBuf,
    /// `--nvmfd PATH`.
    pub nvmfd: Option<PathBuf>,
    /// `--no-pin`: neither the initiator nor a started target is pinned.
    pub no_pin: bool,
    pub engine: EngineOptions,
    /// The spec as given (path or preset) and its text, for the report.
    pub spec_source: String,
    pub spec_text: String,
    /// This command line, for the report.
    pub command: String,
}

/// What the runner tells its caller as it goes (for the progress display).
#[derive(Debug)]
pub enum Event<'a> {
    /// A target is being started.
    TargetStarting { target: &'a str },
    /// Run `run` begins; `left_s` is the estimated time left with it.
    RunStarting {
        run: &'a Run,
        total: usize,
        left_s: u64,
    },
    /// Run `run` ended: `Ok(measurement)` or `Err(why)`.
    RunDone {
        run: &'a Run,
        total: usize,
        outcome: Result<&'a Measurement, &'a str>,
    },
}

/// The whole bench: the report and the output files written.
pub struct Outcome {
    pub report: BenchReport,
    pub files: Vec<PathBuf>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What is read at one edge of the measured window.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub unix: f64,
    pub target_cpu_s: Option<f64>,
    pub initiator_cpu_s: Option<f64>,
    pub stat: Option<StatTotals>,
    pub io: Option<(u64, u64)>,
    /// Seconds the target's counter read took (an RPC round trip): the
    /// engine keeps doing I/O meanwhile, which the cross-check allows for.
    pub io_read_s: f64,
}

/// What one window saw, beside the engine's own result.
#[derive(Debug, Clone, Default)]
pub struct WindowReads {
    pub start: Snapshot,
    pub end: Snapshot,
    pub load1: Option<f64>,
    pub target_counts: Option<Counts>,
    pub initiator_counts: Option<Counts>,
}

/// Time the counter cross-check allows for the engine's threads and the
/// runner to see a window edge at different instants.
pub const EDGE_SKEW_S: f64 = 0.002;

/// Turn an engine result and the window's reads into a measurement's
/// figures (iops, MiB/s, Gbit/s, CPU per I/O and cores, cycles and
/// instructions per I/O, counter cross-check). `in_flight` is how many
/// I/Os can be outstanding (qd × queues).
pub fn derive(r: &EngineResult, w: &WindowReads, in_flight: u64, m: &mut Measurement) {
    let ios = r.read.ios + r.write.ios;
    let bytes = r.read.bytes + r.write.bytes;
    let s = r.seconds;
    let per_s = |x: f64| if s > 0.0 { x / s } else { 0.0 };
    m.iops = per_s(ios as f64);
    m.mibps = per_s(bytes as f64 / 1048576.0);
    m.gbps = per_s(bytes as f64 * 8.0 / 1e9);
    let delta = |a: Option<f64>, b: Option<f64>| Some((b? - a?).max(0.0));
    // This process's CPU time is the initiator's only when the engine ran
    // in it; an engine of other processes must measure them itself.
    let initiator_s = match (r.initiator_cpu_s, r.initiator_pids.is_empty()) {
        (Some(v), _) => Some(v),
        (None, true) => delta(w.start.initiator_cpu_s, w.end.initiator_cpu_s),
        (None, false) => {
            m.notes.push(format!(
                "initiator CPU not measured: the engine ran in processes {:?} and gave no CPU time",
                r.initiator_pids
            ));
            None
        }
    };
    let target_s = delta(w.start.target_cpu_s, w.end.target_cpu_s);
    let per_io = |x: Option<f64>| x.filter(|_| ios > 0).map(|v| v * 1e6 / ios as f64);
    let cores = |x: Option<f64>| x.filter(|_| s > 0.0).map(|v| v / s);
    let count_per_io = |c: Option<u64>| c.filter(|_| ios > 0).map(|v| v as f64 / ios as f64);
    let tc = w.target_counts.unwrap_or_default();
    let ic = w.initiator_counts.unwrap_or_default();
    m.cpu = CpuFigures {
        initiator_s,
        target_s,
        initiator_us_per_io: per_io(initiator_s),
        target_us_per_io: per_io(target_s),
        initiator_cores: cores(initiator_s),
        target_cores: cores(target_s),
        target_cycles_per_io: count_per_io(tc.cycles),
        target_instructions_per_io: count_per_io(tc.instructions),
        initiator_cycles_per_io: count_per_io(ic.cycles),
        initiator_instructions_per_io: count_per_io(ic.instructions),
    };
    m.steal_pct = match (w.start.stat, w.end.stat) {
        (Some(a), Some(b)) => cpu::steal_pct(a, b),
        _ => None,
    };
    m.load1 = w.load1;
    m.started_unix = w.start.unix;
    m.target_ios = match (w.start.io, w.end.io) {
        (Some(a), Some(b)) => Some((b.0.saturating_sub(a.0), b.1.saturating_sub(a.1))),
        _ => None,
    };
    if let Some((tr, tw)) = m.target_ios {
        let theirs = tr + tw;
        let diff = theirs.abs_diff(ios);
        // The I/Os in flight at either edge, plus what completes while each
        // edge's counter read (an RPC round trip) is under way and during
        // EDGE_SKEW_S (the engine's threads and the runner see an edge at
        // slightly different instants: timer wake-ups, scheduling).
        let read_s = w.start.io_read_s + w.end.io_read_s;
        let allowed = in_flight * 2 + (m.iops * (read_s + EDGE_SKEW_S)).ceil() as u64;
        if diff > allowed {
            m.notes.push(format!(
                "COUNTER MISMATCH: the target counted {theirs} I/Os in the window, the engine {ios} \
                 (difference {diff} > {allowed}: the I/Os that can be in flight at the window edges \
                 plus those done during the {:.1} ms the counter reads took)",
                read_s * 1e3
            ));
        }
    }
    if r.errors > 0 {
        m.notes.push(format!("{} I/O errors", r.errors));
    }
}

/// Whether (and why not) `perf stat` can count cycles here; asked once.
fn perf_usable() -> Result<(), String> {
    let me = [std::process::id()];
    let p = PerfStat::start(&me)?;
    std::thread::sleep(std::time::Duration::from_millis(100));
    p.finish().map(|_| ())
}

struct Started {
    /// None when no driver could be made for it.
    target: Option<Box<dyn BenchTarget>>,
    endpoint: Result<Endpoint, String>,
    /// Stopped while another target ran; started again before its next run.
    parked: bool,
    /// Notes every run of this target carries (serious placement warnings).
    notes: Vec<String>,
}

/// The `SHARED CPUS` warning when a started target's CPUs overlap the
/// initiator's.
fn shared_cpus_warning(target_cpus: &[usize], pinned: &[usize]) -> Option<String> {
    let shared: Vec<usize> = target_cpus
        .iter()
        .copied()
        .filter(|c| pinned.contains(c))
        .collect();
    (!shared.is_empty()).then(|| {
        format!(
            "SHARED CPUS: the target's reactors share CPUs {} with the initiator (not enough CPUs on the node for both)",
            super::placement::format_cpulist(&shared)
        )
    })
}

/// Run the plan. Never fails for a run's or a target's sake (those are
/// recorded in `failures`); errors are for what stops the whole bench
/// (no engine, the output directory).
pub fn run(
    plan: &Plan,
    opts: &RunOptions,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(Event<'_>),
) -> anyhow::Result<Outcome> {
    let spec = &plan.spec;
    let proc_ = Proc::system();
    let machine = Machine::system();
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| anyhow::anyhow!("--out {}: {e}", opts.out.display()))?;
    let mut engine = engines::for_spec(spec, &opts.engine)?;
    let mut report = BenchReport {
        format: REPORT_FORMAT,
        spec_source: opts.spec_source.clone(),
        spec_text: opts.spec_text.clone(),
        command: opts.command.clone(),
        started_unix: unix_now(),
        baseline: spec.baseline.clone(),
        goal: spec.goal.map(|g| match g {
            Goal::Iops(v) => format!("{v} IOPS per client"),
            Goal::MiBps(v) => format!("{v} MiB/s per client"),
        }),
        ..Default::default()
    };
    // Load before anything of ours runs.
    let load_before = proc_.load1().unwrap_or(0.0);
    let perf_ok = perf_usable();
    let mut started: Vec<Option<Started>> = (0..spec.targets.len()).map(|_| None).collect();
    let total = plan.runs.len();
    let mut left_s: u64 = plan.estimated.as_secs();
    for run in &plan.runs {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let t = &spec.targets[run.target];
        let w = &spec.workloads[run.workload];
        let placement = &plan.placements[run.target];
        let pin: Vec<usize> = if opts.no_pin {
            Vec::new()
        } else {
            placement
                .pin
                .iter()
                .copied()
                .take(w.queues as usize)
                .collect()
        };
        // Only one harness-started target runs at a time: a target that
        // busy-polls (SPDK's reactors, nvmfd under --poll-us) would
        // otherwise take CPU from the one being measured. The previous
        // target is stopped when the matrix moves to another one and
        // started afresh before its next run.
        for (i, st) in started.iter_mut().enumerate() {
            if let Some(st) = st.as_mut() {
                if i != run.target && !st.parked {
                    if let Some(target) = st.target.as_mut() {
                        target.stop();
                    }
                    st.parked = true;
                }
            }
        }
        if let Some(st) = started[run.target].as_mut() {
            if st.parked {
                if let Some(target) = st.target.as_mut() {
                    progress(Event::TargetStarting { target: &t.name });
                    st.endpoint = target.start().map_err(|e| format!("{e:#}"));
                }
                st.parked = false;
            }
        }
        if started[run.target].is_none() {
            progress(Event::TargetStarting { target: &t.name });
            let topts = TargetOptions {
                nvmfd: opts.nvmfd.clone(),
                node_cpus: placement.cpus.clone(),
                initiator_cpus: placement.pin.clone(),
                no_pin: opts.no_pin,
            };
            // OFF-NODE and BUSY CORE go with every run; the milder ones
            // stay in the placement record.
            let mut notes: Vec<String> = placement
                .warnings
                .iter()
                .filter(|w| w.starts_with("OFF-NODE") || w.starts_with("BUSY CORE"))
                .cloned()
                .collect();
            started[run.target] = Some(match targets::for_target(t, &topts) {
                Ok(mut target) => {
                    let endpoint = target.start().map_err(|e| format!("{e:#}"));
                    let pinned = if opts.no_pin {
                        &[][..]
                    } else {
                        &placement.pin[..]
                    };
                    notes.extend(shared_cpus_warning(&target.cpus(), pinned));
                    Started {
                        target: Some(target),
                        endpoint,
                        parked: false,
                        notes,
                    }
                }
                Err(e) => Started {
                    target: None,
                    endpoint: Err(format!("{e:#}")),
                    parked: false,
                    notes,
                },
            });
        }
        let st = started[run.target].as_mut().expect("set above");
        progress(Event::RunStarting { run, total, left_s });
        left_s = left_s.saturating_sub(w.ramp_s + w.runtime_s);
        let result = match (&st.endpoint, st.target.as_mut()) {
            (Err(e), _) => Err(format!("target {} did not start: {e}", t.name)),
            (Ok(_), None) => Err(format!("target {} has no driver", t.name)),
            (Ok(ep), Some(target)) => {
                let ep = ep.clone();
                engine.for_target(t);
                measure_one(
                    &mut *engine,
                    &mut **target,
                    &ep,
                    w,
                    &pin,
                    &proc_,
                    &perf_ok,
                    stop,
                )
            }
        };
        match result {
            Ok((r, reads, mut notes)) => {
                let mut m = Measurement {
                    cell: run.cell.clone(),
                    target: t.name.clone(),
                    workload: w.name.clone(),
                    round: run.round,
                    engine: engine.name().to_string(),
                    clients: engine.clients(),
                    pinned: pin.clone(),
                    ..Default::default()
                };
                derive(&r, &reads, w.qd as u64 * w.queues as u64, &mut m);
                m.result = r;
                m.notes.append(&mut notes);
                m.notes.extend(st.notes.iter().cloned());
                // What the target itself says about this start (SPDK on
                // plain memory, a kernel target without counters, ...).
                if let Some(tg) = st.target.as_ref() {
                    m.notes.extend(tg.notes());
                }
                if stop.load(Ordering::Relaxed) {
                    let why = format!(
                        "interrupted (Ctrl-C) after {:.1} s of {} s measured",
                        m.result.seconds, w.runtime_s
                    );
                    progress(Event::RunDone {
                        run,
                        total,
                        outcome: Err(&why),
                    });
                    report.failures.push((run.cell.clone(), run.round, why));
                } else {
                    progress(Event::RunDone {
                        run,
                        total,
                        outcome: Ok(&m),
                    });
                    report.measurements.push(m);
                }
            }
            Err(why) => {
                progress(Event::RunDone {
                    run,
                    total,
                    outcome: Err(&why),
                });
                report.failures.push((run.cell.clone(), run.round, why));
            }
        }
    }
    report.interrupted = stop.load(Ordering::Relaxed);
    // Placement records (with the CPUs a started target was given) and
    // the versions of what was used; then stop every target.
    let mut versions = vec![(engine.name().to_string(), engine.version())];
    for (i, (t, p)) in spec.targets.iter().zip(&plan.placements).enumerate() {
        let mut rec = PlacementRecord {
            target: t.name.clone(),
            interface: p.interface.clone(),
            node: p.node,
            node_cpus: p.cpus.clone(),
            pinned: if opts.no_pin {
                Vec::new()
            } else {
                p.pin.clone()
            },
            target_cpus: Vec::new(),
            warnings: p.warnings.clone(),
        };
        if let Some(Started {
            target: Some(target),
            endpoint,
            ..
        }) = started[i].as_mut()
        {
            rec.target_cpus = target.cpus();
            rec.warnings
                .extend(shared_cpus_warning(&rec.target_cpus, &rec.pinned));
            if endpoint.is_ok() {
                versions.push((target.kind().to_string(), target.version()));
            }
            target.stop();
        }
        report.placements.push(rec);
    }
    let ifaces: Vec<String> = plan
        .placements
        .iter()
        .filter_map(|p| p.interface.clone())
        .collect();
    report.machine = machine.context(&ifaces, &versions);
    report.machine.load1_before = load_before;
    report.finished_unix = unix_now();
    report.cells = summary::summarize(&report.measurements, spec.baseline.as_deref(), spec.goal);
    let files = output::write_outputs(&report, &opts.out)?;
    Ok(Outcome { report, files })
}

/// The table printed at the end.
pub fn text_summary(report: &BenchReport) -> String {
    output::text_summary(report)
}

/// One run: the engine with the window reads around its measured part.
#[allow(clippy::too_many_arguments)]
fn measure_one(
    engine: &mut dyn super::engine::Engine,
    target: &mut dyn BenchTarget,
    ep: &Endpoint,
    w: &WorkloadSpec,
    pin: &[usize],
    proc_: &Proc,
    perf_ok: &Result<(), String>,
    stop: &AtomicBool,
) -> Result<(EngineResult, WindowReads, Vec<String>), String> {
    let pids = target.pids();
    let mut reads = WindowReads::default();
    let mut notes: Vec<String> = Vec::new();
    let mut perf: (Option<PerfStat>, Option<PerfStat>) = (None, None);
    let mut perf_err: Option<String> = perf_ok.clone().err();
    let me = [std::process::id()];
    let mut window_end: Option<Instant> = None;
    // The target's counters first: the engine counts from the edge on,
    // and every millisecond later lets more I/Os through uncounted.
    let take = |target: &mut dyn BenchTarget| {
        let t0 = Instant::now();
        let io = target.io_counters();
        let io_read_s = t0.elapsed().as_secs_f64();
        Snapshot {
            io_read_s,
            unix: unix_now(),
            target_cpu_s: proc_.pids_cpu_s(&pids),
            initiator_cpu_s: proc_.self_cpu_s(),
            stat: proc_.stat_totals(),
            io,
        }
    };
    let mut edge = |e: Window| match e {
        Window::Start => {
            reads.start = take(target);
            // perf attaches a few milliseconds after this (documented).
            if perf_err.is_none() {
                if !pids.is_empty() {
                    match PerfStat::start(&pids) {
                        Ok(p) => perf.0 = Some(p),
                        Err(e) => perf_err = Some(e),
                    }
                }
                match PerfStat::start(&me) {
                    Ok(p) => perf.1 = Some(p),
                    Err(e) => perf_err = Some(e),
                }
            }
        }
        Window::End => {
            reads.end = take(target);
            reads.load1 = proc_.load1();
            window_end = Some(Instant::now());
            if let Some(p) = perf.0.take() {
                match p.finish() {
                    Ok(c) => reads.target_counts = Some(c),
                    Err(e) => perf_err = Some(e),
                }
            }
            if let Some(p) = perf.1.take() {
                match p.finish() {
                    Ok(c) => reads.initiator_counts = Some(c),
                    Err(e) => perf_err = Some(e),
                }
            }
        }
    };
    let job = EngineJob {
        trid: &ep.trid,
        nsid: ep.nsid,
        workload: w,
        pin,
        host_nqn: None,
        stop,
    };
    let r = engine.run(&job, &mut edge).map_err(|e| format!("{e:#}"));
    drop(perf);
    let r = r?;
    if window_end.is_none() {
        return Err("the engine never reported the end of its measured window".into());
    }
    if let Some(e) = perf_err {
        notes.push(format!("no cycle/instruction counts: {e}"));
    }
    if pids.is_empty() {
        notes.push(format!(
            "target CPU not measured: no local process known for a {} target",
            target.kind()
        ));
    }
    Ok((r, reads, notes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::results::DirFigures;

    #[test]
    fn shared_cpus() {
        assert_eq!(shared_cpus_warning(&[1, 2], &[0]), None);
        let w = shared_cpus_warning(&[0, 1], &[0, 1]).unwrap();
        assert!(w.starts_with("SHARED CPUS") && w.contains("0-1"), "{w}");
    }

    #[test]
    fn derived_figures() {
        let r = EngineResult {
            seconds: 2.0,
            read: DirFigures {
                ios: 150_000,
                bytes: 150_000 * 4096,
                ..Default::default()
            },
            write: DirFigures {
                ios: 50_000,
                bytes: 50_000 * 4096,
                ..Default::default()
            },
            ..Default::default()
        };
        let w = WindowReads {
            start: Snapshot {
                unix: 100.0,
                target_cpu_s: Some(10.0),
                initiator_cpu_s: Some(5.0),
                stat: Some(StatTotals {
                    total: 1000,
                    steal: 10,
                }),
                io: Some((1000, 500)),
                io_read_s: 0.0,
            },
            end: Snapshot {
                unix: 102.0,
                target_cpu_s: Some(11.5),
                initiator_cpu_s: Some(6.0),
                stat: Some(StatTotals {
                    total: 1400,
                    steal: 14,
                }),
                io: Some((151_000, 50_500)),
                io_read_s: 0.0,
            },
            load1: Some(1.5),
            target_counts: Some(Counts {
                cycles: Some(2_000_000_000),
                instructions: None,
            }),
            initiator_counts: None,
        };
        let mut m = Measurement::default();
        derive(&r, &w, 64, &mut m);
        assert_eq!(m.iops, 100_000.0);
        assert!((m.mibps - 200_000.0 * 4096.0 / 1048576.0 / 2.0).abs() < 1e-9);
        assert!((m.gbps - m.mibps * 8.0 * 1.048576 / 1000.0).abs() < 1e-9);
        assert_eq!(m.cpu.target_s, Some(1.5));
        assert_eq!(m.cpu.initiator_s, Some(1.0));
        assert_eq!(m.cpu.target_us_per_io, Some(7.5));
        assert_eq!(m.cpu.initiator_us_per_io, Some(5.0));
        assert_eq!(m.cpu.target_cores, Some(0.75));
        assert_eq!(m.cpu.initiator_cores, Some(0.5));
        assert_eq!(m.cpu.target_cycles_per_io, Some(10_000.0));
        assert_eq!(m.cpu.target_instructions_per_io, None);
        assert_eq!(m.steal_pct, Some(1.0));
        assert_eq!(m.target_ios, Some((150_000, 50_000)));
        assert_eq!(m.load1, Some(1.5));
        assert!(m.notes.is_empty(), "{:?}", m.notes);
        // The engine's own CPU figure wins over /proc/self.
        let r2 = EngineResult {
            initiator_cpu_s: Some(0.25),
            ..r.clone()
        };
        let mut m2 = Measurement::default();
        derive(&r2, &w, 64, &mut m2);
        assert_eq!(m2.cpu.initiator_s, Some(0.25));
        // Other processes without their own figure: not this process's.
        let r5 = EngineResult {
            initiator_pids: vec![4242],
            ..r.clone()
        };
        let mut m5 = Measurement::default();
        derive(&r5, &w, 64, &mut m5);
        assert_eq!(m5.cpu.initiator_s, None);
        assert!(m5.notes[0].contains("4242"), "{:?}", m5.notes);
        // Counters further apart than 2 × in flight + 2 ms of I/O: a note.
        let mut w3 = w.clone();
        w3.end.io = Some((151_000, 50_829));
        let mut m3 = Measurement::default();
        derive(&r, &w3, 64, &mut m3);
        assert!(
            m3.notes.iter().any(|n| n.contains("COUNTER MISMATCH")),
            "{:?}",
            m3.notes
        );
        let mut w4 = w.clone();
        w4.end.io = Some((151_000, 50_828));
        let mut m4 = Measurement::default();
        derive(&r, &w4, 64, &mut m4);
        assert!(m4.notes.is_empty(), "{:?}", m4.notes);
        // Counter reads that took 1 ms each at 100K IOPS: 200 I/Os more
        // are allowed (128 + 200 for the skew + 200 = 528).
        let mut w6 = w.clone();
        w6.start.io_read_s = 0.001;
        w6.end.io_read_s = 0.001;
        w6.end.io = Some((151_000, 51_028));
        let mut m6 = Measurement::default();
        derive(&r, &w6, 64, &mut m6);
        assert!(m6.notes.is_empty(), "{:?}", m6.notes);
        w6.end.io = Some((151_000, 51_029));
        derive(&r, &w6, 64, &mut m6);
        assert!(m6.notes[0].contains("COUNTER MISMATCH"), "{:?}", m6.notes);
    }
}
