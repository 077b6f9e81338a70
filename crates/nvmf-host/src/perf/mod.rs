//! perf/mod.rs — the load generator behind `nvmf perf`: what to run
//! (`PerfConfig`) and the run itself (`run`): connect one controller per
//! path (one path, several `-r` transport IDs of one subsystem, or every
//! path a discovery service lists), check that they show the same
//! namespace, read their ANA state, open N I/O queues on each path, start
//! one thread per core (or per queue) driving the engine, print progress,
//! and gather the report.
//!
//! The parts: workload.rs (access patterns, PRNG, verify pattern),
//! engine.rs (the per-thread I/O engine, multipath selection and
//! fail-over), report.rs (results, text and JSON). Path state and the
//! monitor thread (AER, ANA log, keep-alive failures) live in
//! `crate::multipath`.

mod engine;
mod report;
mod workload;

pub use engine::pin_to_cpu;
pub use report::{format_text, to_json, DirStats, PathReport, PerfReport, QueueReport};
pub use workload::{check_block, fill_block, Mismatch, Workload, XorShift};

use crate::controller::ConnectOptions;
use crate::error::{Error, Result};
use crate::multipath::{self, ana_state_name, Monitor, Path, Policy, ReconnectSpec};
use crate::trid::TransportId;
use engine::{PaddedCounter, PathQueue, PathStats, Shared, Worker, WorkerSetup, MAX_VERIFY_UNITS};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What to run.
#[derive(Debug, Clone)]
pub struct PerfConfig {
    /// Host identity, digests, timeouts; its transport ID is the path when
    /// `paths` is empty.
    pub connect: ConnectOptions,
    /// Several paths to one subsystem (empty: `connect.trid` alone).
    pub paths: Vec<TransportId>,
    /// How I/O is spread over the usable paths.
    pub policy: Policy,
    /// Connect lost paths again in the background and use them when back;
    /// commands then wait up to 30 s for a path even when none is left.
    pub reconnect: bool,
    pub nsid: u32,
    /// Outstanding I/Os per queue.
    pub queue_depth: u16,
    /// Bytes per I/O (a multiple of the block size).
    pub io_size: u32,
    pub workload: Workload,
    /// Reads in percent for the mixed workloads.
    pub read_pct: u32,
    pub duration: Duration,
    /// Load run before the measured `duration` (statistics restart when
    /// it ends; zero = measure from the first I/O).
    pub ramp: Duration,
    pub queues: u16,
    /// Pin one thread per listed CPU (queues spread round-robin); None: one
    /// unpinned thread per queue.
    pub cores: Option<Vec<usize>>,
    pub verify: bool,
    /// Override the in-capsule write limit (0 = every write uses R2T).
    pub in_capsule: Option<u32>,
    /// Print a progress line every second (to stdout).
    pub progress: bool,
    /// Busy-poll for up to this long without progress before sleeping in
    /// poll(2) (zero: sleep whenever there is nothing to do).
    pub poll: Duration,
}

/// Default busy-poll window of `nvmf perf` (`--poll-us`).
pub const DEFAULT_POLL_US: u64 = 1000;

impl PerfConfig {
    pub fn new(connect: ConnectOptions) -> PerfConfig {
        PerfConfig {
            connect,
            paths: Vec::new(),
            policy: Policy::RoundRobin,
            reconnect: false,
            nsid: 1,
            queue_depth: 32,
            io_size: 4096,
            workload: Workload::RandRead,
            read_pct: 50,
            duration: Duration::from_secs(10),
            ramp: Duration::ZERO,
            queues: 1,
            cores: None,
            verify: false,
            in_capsule: None,
            progress: false,
            poll: Duration::from_micros(DEFAULT_POLL_US),
        }
    }
}

/// Connect every path and check that they lead to one namespace; returns
/// the paths and the namespace's size in blocks and block size.
fn connect_paths(cfg: &PerfConfig, trids: &[TransportId]) -> Result<(Vec<Path>, u64, u32)> {
    let many = trids.len() > 1;
    let mut paths = Vec::with_capacity(trids.len());
    let mut geometry: Option<(u64, u32)> = None;
    for t in trids {
        // With several paths, say which one failed.
        let ctx = |e: Error| -> Error {
            if many {
                Error::InvalidArg(format!("path {}:{}: {e}", t.traddr, t.trsvcid))
            } else {
                e
            }
        };
        let mut p = Path::connect(&cfg.connect, t).map_err(ctx)?;
        if p.ctrl.is_discovery() {
            return Err(Error::InvalidArg(format!(
                "{} is a discovery subsystem; give the NQN of an NVM subsystem (see `nvmf discover`)",
                t.subnqn
            )));
        }
        let ns = p.ctrl.identify_namespace(cfg.nsid).map_err(ctx)?;
        let nsze = ns.nsze.get();
        if nsze == 0 {
            return Err(Error::InvalidArg(format!(
                "namespace {} is not active on {}{}",
                cfg.nsid,
                t.subnqn,
                if many {
                    format!(" (path {}:{})", t.traddr, t.trsvcid)
                } else {
                    String::new()
                }
            )));
        }
        let bs = ns.block_size() as u32;
        match geometry {
            None => geometry = Some((nsze, bs)),
            Some(g) if g != (nsze, bs) => {
                return Err(Error::InvalidArg(format!(
                    "path {}:{} shows namespace {} as {nsze} blocks of {bs} bytes, the first path as {} blocks of {} bytes: not one namespace",
                    t.traddr, t.trsvcid, cfg.nsid, g.0, g.1
                )));
            }
            Some(_) => {}
        }
        let granted = p.ctrl.set_num_queues(cfg.queues).map_err(ctx)?;
        if granted < cfg.queues {
            return Err(Error::InvalidArg(format!(
                "controller grants only {granted} I/O queues, {} requested",
                cfg.queues
            )));
        }
        p.init_ana(cfg.nsid).map_err(ctx)?;
        paths.push(p);
    }
    let (nsze, bs) = geometry.ok_or_else(|| Error::InvalidArg("no path given".into()))?;
    Ok((paths, nsze, bs))
}

/// CPUs this process may run on (its affinity mask), ascending.
pub fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; CPU_ISSET bounds-checks against its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect())
    }
}

/// Every CPU of a `cores` list must be one this process may be pinned to
/// (checked before connecting, so a typo fails at once and clearly).
fn check_cpus(cores: &[usize]) -> Result<()> {
    let Ok(allowed) = allowed_cpus() else {
        return Ok(()); // cannot tell: pinning reports it
    };
    for &c in cores {
        if !allowed.contains(&c) {
            return Err(Error::InvalidArg(format!(
                "CPU {c} does not exist or this process may not run on it (its CPUs: {})",
                crate::bench::placement::format_cpulist(&allowed)
            )));
        }
    }
    Ok(())
}

/// The measured window's edges, as `Hooks::window` is told them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// The ramp is over (with no ramp: every queue is connected and no
    /// I/O has been sent yet).
    Start,
    /// Every I/O has completed (or was given up); the connections are
    /// still open.
    End,
}

/// What a caller embedding the load generator (`nvmf bench`) can hook in;
/// both are looked at by the main thread only, never on the I/O path.
#[derive(Default)]
pub struct Hooks<'a> {
    /// Called at the measured window's edges.
    pub window: Option<&'a mut dyn FnMut(Edge)>,
    /// When set, stop submitting, drain and report what was measured.
    pub stop: Option<&'a AtomicBool>,
}

/// Connect, run the workload, and collect the report.
pub fn run(cfg: &PerfConfig) -> Result<PerfReport> {
    run_hooked(cfg, Hooks::default())
}

/// `run` with window edges reported and an external stop flag.
pub fn run_hooked(cfg: &PerfConfig, mut hooks: Hooks<'_>) -> Result<PerfReport> {
    if cfg.queues == 0 || cfg.queue_depth == 0 {
        return Err(Error::InvalidArg(
            "queues and queue depth must be at least 1".into(),
        ));
    }
    let trids = if cfg.paths.is_empty() {
        vec![cfg.connect.trid.clone()]
    } else {
        cfg.paths.clone()
    };
    multipath::check_same_subsystem(&trids)?;
    if trids.len() > 64 {
        return Err(Error::InvalidArg(format!(
            "{} paths given; at most 64 are supported",
            trids.len()
        )));
    }
    if cfg.verify && cfg.workload.read_pct(cfg.read_pct) == 100 {
        return Err(Error::InvalidArg(
            "--verify needs a workload that writes (write, randwrite, rw, randrw)".into(),
        ));
    }
    if let Some(cores) = &cfg.cores {
        check_cpus(cores)?;
    }
    let (paths, nsze, bs) = connect_paths(cfg, &trids)?;
    if bs == 0 || cfg.io_size == 0 || !cfg.io_size.is_multiple_of(bs) {
        return Err(Error::InvalidArg(format!(
            "I/O size {} is not a multiple of the namespace's {bs} byte blocks",
            cfg.io_size
        )));
    }
    let nlb = cfg.io_size / bs;
    if nlb > 65536 {
        return Err(Error::InvalidArg(format!(
            "I/O size {} is more than 65536 blocks",
            cfg.io_size
        )));
    }
    let total_units = nsze / nlb as u64;
    let nq = cfg.queues as u64;
    if total_units < nq {
        return Err(Error::InvalidArg(format!(
            "namespace of {nsze} blocks is too small for {nq} queues of {} byte I/O",
            cfg.io_size
        )));
    }

    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ (std::process::id() as u64) << 20;
    // One region per queue when sequential or verifying (so no two queues
    // touch the same blocks); random runs without verify use the whole
    // namespace from every queue.
    let split = cfg.verify || !cfg.workload.is_random();
    let per_queue = total_units / nq;
    let nthreads = match &cfg.cores {
        Some(c) if !c.is_empty() => c.len().min(cfg.queues as usize),
        _ => cfg.queues as usize,
    };
    let shared_paths: Vec<_> = paths.iter().map(|p| Arc::clone(&p.shared)).collect();
    let mut groups: Vec<Vec<Worker>> = (0..nthreads).map(|_| Vec::new()).collect();
    for i in 0..cfg.queues {
        let mut pqs = Vec::with_capacity(paths.len());
        for p in &paths {
            let mut q = p
                .ctrl
                .create_io_queue(i + 1, cfg.queue_depth, cfg.io_size)?;
            if let Some(n) = cfg.in_capsule {
                q.set_in_capsule_size(n.min(p.ctrl.in_capsule_size()));
            }
            pqs.push(PathQueue::new(q));
        }
        let (first_unit, mut units) = if split {
            (i as u64 * per_queue, per_queue)
        } else {
            (0, total_units)
        };
        if cfg.verify {
            units = units.min(MAX_VERIFY_UNITS);
        }
        let depth = pqs
            .iter()
            .filter_map(|p| p.q.as_ref().map(|q| q.depth()))
            .min()
            .unwrap_or(1);
        let t = i as usize % nthreads;
        let core = cfg.cores.as_ref().and_then(|c| c.get(t).copied());
        groups[t].push(Worker::new(
            WorkerSetup {
                qid: i + 1,
                core,
                nsid: cfg.nsid,
                bs,
                io_size: cfg.io_size,
                first_unit,
                units,
                random: cfg.workload.is_random(),
                read_pct: cfg.workload.read_pct(cfg.read_pct),
                rng_seed: seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                verify: cfg.verify,
                seed: (seed >> 16) & 0xffff_ffff,
                depth,
                policy: cfg.policy,
                reconnect: cfg.reconnect,
            },
            pqs,
            shared_paths.clone(),
        ));
    }

    let shared = Arc::new(Shared {
        ios: (0..nthreads)
            .map(|_| PaddedCounter(AtomicU64::new(0)))
            .collect(),
        bytes: (0..nthreads)
            .map(|_| PaddedCounter(AtomicU64::new(0)))
            .collect(),
        stop: AtomicBool::new(false),
        ramp_over: AtomicBool::new(false),
    });
    let barrier = Arc::new(Barrier::new(nthreads + 1));
    let base = Instant::now();
    let reconnect = cfg.reconnect.then(|| ReconnectSpec {
        opts: cfg.connect.clone(),
        queues: cfg.queues,
        depth: cfg.queue_depth,
        io_size: cfg.io_size,
        in_capsule: cfg.in_capsule,
    });
    let monitor = Monitor::start(paths, cfg.nsid, base, reconnect);
    let mut handles = Vec::new();
    for (t, mut qs) in groups.into_iter().enumerate() {
        let shared = Arc::clone(&shared);
        let barrier = Arc::clone(&barrier);
        let core = cfg.cores.as_ref().and_then(|c| c.get(t).copied());
        let duration = cfg.ramp + cfg.duration;
        let ramp = cfg.ramp;
        let spin = cfg.poll;
        let io_timeout = cfg.connect.timeout;
        let stall = cfg.connect.timeout + cfg.connect.kato;
        let h = std::thread::Builder::new()
            .name(format!("nvmf-perf-{t}"))
            .spawn(move || {
                let pin = core.map(pin_to_cpu);
                barrier.wait();
                if let Some(Err(e)) = pin {
                    return (
                        qs,
                        Some(format!("pinning to CPU {}: {e}", core.unwrap_or(0))),
                    );
                }
                let start = Instant::now();
                let r = engine::run_thread(
                    &mut qs,
                    t,
                    &shared,
                    base,
                    start + duration,
                    io_timeout,
                    stall,
                    spin,
                    !ramp.is_zero(),
                );
                // SAFETY: sched_getcpu has no preconditions.
                let cpu = unsafe { libc::sched_getcpu() };
                for w in qs.iter_mut() {
                    w.thread = t;
                    w.ran_on = usize::try_from(cpu).ok();
                }
                (qs, r.err().map(|e| e.to_string()))
            })
            .expect("spawn perf thread");
        handles.push(h);
    }
    // No ramp: the window opens before the first I/O is sent.
    let mut window_open = cfg.ramp.is_zero();
    if window_open {
        if let Some(w) = hooks.window.as_mut() {
            w(Edge::Start);
        }
    }
    barrier.wait();
    let start = Instant::now();
    let ramp_end = start + cfg.ramp;
    // When the measured window began (the workers' statistics restart).
    let mut measured_from = ramp_end;

    // Progress once a second while the threads run.
    let mut last = (0u64, 0u64, start);
    let mut printed = false;
    while handles.iter().any(|h| !h.is_finished()) {
        let nap = if window_open {
            Duration::from_millis(50)
        } else {
            ramp_end
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50))
        };
        std::thread::sleep(nap);
        if !window_open && Instant::now() >= ramp_end {
            window_open = true;
            // The runner reads the target's counters first; the workers
            // restart their statistics only after that, so the two counts
            // start together (up to the I/O done while that read ran).
            if let Some(w) = hooks.window.as_mut() {
                w(Edge::Start);
            }
            measured_from = Instant::now();
            shared.ramp_over.store(true, Ordering::Release);
        }
        if hooks.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            shared.stop.store(true, Ordering::Relaxed);
        }
        if cfg.progress && last.2.elapsed() >= Duration::from_secs(1) {
            let ios: u64 = shared.ios.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
            let bytes: u64 = shared
                .bytes
                .iter()
                .map(|c| c.0.load(Ordering::Relaxed))
                .sum();
            let dt = last.2.elapsed().as_secs_f64();
            let el = start.elapsed().as_secs_f64();
            print!(
                "\r[{:>5.1}s/{:.0}s] {:>12.0} IOPS {:>10.2} MiB/s   ",
                el.min(cfg.duration.as_secs_f64() + 99.0),
                cfg.duration.as_secs_f64(),
                (ios - last.0) as f64 / dt,
                (bytes - last.1) as f64 / dt / 1048576.0
            );
            let _ = std::io::Write::flush(&mut std::io::stdout());
            printed = true;
            last = (ios, bytes, Instant::now());
        }
    }
    if printed {
        println!();
    }
    let stopped_in_ramp = !window_open;
    if let Some(w) = hooks.window.as_mut() {
        if window_open {
            w(Edge::End);
        }
    }
    let runtime = Instant::now()
        .saturating_duration_since(measured_from)
        .min(cfg.duration.max(Duration::from_millis(1)));
    let paths = monitor.finish();
    let mut queues = Vec::new();
    let mut failures = Vec::new();
    let mut pstats: Vec<PathStats> = Vec::new();
    for h in handles {
        match h.join() {
            Ok((qs, err)) => {
                if let Some(e) = err {
                    failures.push(e);
                }
                for w in qs {
                    let (qr, ps) = w.report();
                    queues.push(qr);
                    if pstats.is_empty() {
                        pstats = ps;
                    } else {
                        for (a, b) in pstats.iter_mut().zip(&ps) {
                            a.merge(b);
                        }
                    }
                }
            }
            Err(_) => failures.push("a perf thread panicked".into()),
        }
    }
    queues.sort_by_key(|q| q.qid);
    let single = paths.len() == 1;
    let ns_s = |ns: u64| {
        (ns > 0)
            .then(|| ns.saturating_sub(start.duration_since(base).as_nanos() as u64) as f64 / 1e9)
    };
    let mut path_reports = Vec::with_capacity(paths.len());
    for (k, p) in paths.iter().enumerate() {
        let ps = pstats.get(k).cloned();
        if single {
            // One path: a lost keep-alive is a failure of the run, as before.
            if let Some(e) = p.ctrl.keep_alive_error() {
                failures.push(format!("keep alive failed: {e}"));
            }
        }
        let failure = p.shared.failure();
        let ps = ps.unwrap_or_else(|| PathStats {
            read: DirStats::new(),
            write: DirStats::new(),
            failed_over: 0,
            retried: 0,
            errors: 0,
            first_ns: 0,
            last_ns: 0,
        });
        path_reports.push(PathReport {
            name: p.shared.name.clone(),
            trid: p.trid.to_string(),
            cntlid: p.ctrl.cntlid(),
            ana_reporting: p.ana,
            state: ana_state_name(p.shared.state()).to_string(),
            state_changes: p.shared.state_changes(),
            ana_log_reads: p.shared.ana_log_reads(),
            read: ps.read,
            write: ps.write,
            reconnects: p.shared.reconnects(),
            failed_over: ps.failed_over,
            retried: ps.retried,
            errors: ps.errors,
            first_io_s: ns_s(ps.first_ns),
            last_io_s: ns_s(ps.last_ns),
            failed_at_s: failure.as_ref().and_then(|f| ns_s(f.1)),
            failure: failure.map(|f| f.0),
        });
    }
    let first = &paths[0];
    let neg_in_capsule = match cfg.in_capsule {
        Some(n) => n.min(first.ctrl.in_capsule_size()),
        None => first.ctrl.in_capsule_size(),
    };
    if stopped_in_ramp {
        failures.push("stopped during the ramp: nothing was measured".into());
    }
    Ok(PerfReport {
        workload: cfg.workload,
        io_size: cfg.io_size,
        queue_depth: cfg.queue_depth,
        read_pct: cfg.workload.read_pct(cfg.read_pct),
        nsid: cfg.nsid,
        block_size: bs,
        ns_blocks: nsze,
        in_capsule: neg_in_capsule,
        hdr_digest: cfg.connect.hdr_digest,
        data_digest: cfg.connect.data_digest,
        verify: cfg.verify,
        trid: first.trid.to_string(),
        runtime,
        queues,
        failures,
        policy: cfg.policy,
        paths: path_reports,
    })
}
