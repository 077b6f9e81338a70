//! bench/engines/perf.rs — the `nvmf-perf` engine: this crate's load
//! generator (`crate::perf::run_hooked`) run in process for one bench job,
//! with its ramp and window edges passed through, and its report turned
//! into an `EngineResult` (counts, bytes, latency percentiles and the
//! percentile curve from the HdrHistograms, the equivalent `nvmf perf`
//! command line).

use super::EngineOptions;
use crate::bench::engine::{Engine, EngineJob, Window};
use crate::bench::placement::format_cpulist;
use crate::bench::results::{DirFigures, EngineResult, Latency};
use crate::bench::spec::size_name;
use crate::perf::{self, DirStats, Edge, Hooks, PerfConfig, Workload};
use crate::ConnectOptions;
use anyhow::anyhow;
use std::time::Duration;

/// Percentiles of the latency curve kept per direction.
pub const CURVE: &[f64] = &[
    0.0, 1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999,
    100.0,
];

/// `nvmf perf` in this process.
pub struct PerfEngine {
    opts: EngineOptions,
}

impl PerfEngine {
    pub fn new(opts: EngineOptions) -> PerfEngine {
        PerfEngine { opts }
    }

    fn config(&self, job: &EngineJob<'_>) -> PerfConfig {
        let mut c = ConnectOptions::new(job.trid.clone());
        if let Some(h) = job.host_nqn.or(self.opts.host_nqn.as_deref()) {
            c = c.with_hostnqn(h);
        }
        let w = job.workload;
        let mut cfg = PerfConfig::new(c);
        cfg.nsid = job.nsid;
        cfg.queue_depth = w.qd;
        cfg.io_size = w.bs;
        cfg.workload = w.rw;
        cfg.read_pct = w.mix;
        cfg.duration = Duration::from_secs(w.runtime_s);
        cfg.ramp = Duration::from_secs(w.ramp_s);
        cfg.queues = w.queues;
        cfg.cores = (!job.pin.is_empty()).then(|| job.pin.to_vec());
        cfg.poll = self.opts.poll;
        cfg.progress = false;
        cfg
    }
}

/// The `nvmf perf` command line that runs `cfg` by hand.
pub fn command_line(cfg: &PerfConfig, hostnqn: Option<&str>) -> String {
    let mut s = format!(
        "nvmf perf -r '{}' --ns {} -w {} -o {} -q {} --queues {} -t {}",
        cfg.connect.trid,
        cfg.nsid,
        cfg.workload.name(),
        size_name(cfg.io_size),
        cfg.queue_depth,
        cfg.queues,
        cfg.duration.as_secs()
    );
    if matches!(cfg.workload, Workload::Rw | Workload::RandRw) {
        s += &format!(" -M {}", cfg.read_pct);
    }
    if !cfg.ramp.is_zero() {
        s += &format!(" --ramp {}", cfg.ramp.as_secs());
    }
    if let Some(c) = &cfg.cores {
        s += &format!(" --cores {}", format_cpulist(c));
    }
    if cfg.poll != Duration::from_micros(perf::DEFAULT_POLL_US) {
        s += &format!(" --poll-us {}", cfg.poll.as_micros());
    }
    if let Some(h) = hostnqn {
        s += &format!(" --hostnqn {h}");
    }
    s
}

/// Latency figures (µs) of a histogram, with the percentile curve.
pub fn latency(d: &DirStats) -> Latency {
    let us = |ns: u64| ns as f64 / 1000.0;
    if d.ios == 0 {
        return Latency::default();
    }
    // The histogram answers a bucket's upper edge: keep it within the
    // exact min and max so the curve never passes the maximum.
    let pct = |p: f64| us(d.percentile(p).clamp(d.min(), d.max_ns));
    Latency {
        mean_us: d.mean_ns() / 1000.0,
        min_us: us(d.min()),
        p50_us: pct(50.0),
        p99_us: pct(99.0),
        p999_us: pct(99.9),
        p9999_us: pct(99.99),
        max_us: us(d.max_ns),
        curve: CURVE
            .iter()
            .map(|&p| {
                let v = match p {
                    0.0 => us(d.min()),
                    100.0 => us(d.max_ns),
                    _ => pct(p),
                };
                (p, v)
            })
            .collect(),
    }
}

fn figures(d: &DirStats) -> DirFigures {
    DirFigures {
        ios: d.ios,
        bytes: d.bytes,
        latency: latency(d),
    }
}

impl Engine for PerfEngine {
    fn name(&self) -> &'static str {
        "nvmf-perf"
    }

    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    fn run(
        &mut self,
        job: &EngineJob<'_>,
        window: &mut dyn FnMut(Window),
    ) -> anyhow::Result<EngineResult> {
        let cfg = self.config(job);
        let mut edge = |e: Edge| {
            window(match e {
                Edge::Start => Window::Start,
                Edge::End => Window::End,
            })
        };
        let hooks = Hooks {
            window: Some(&mut edge),
            stop: Some(job.stop),
        };
        let r = perf::run_hooked(&cfg, hooks).map_err(|e| anyhow!("nvmf perf: {e}"))?;
        if !r.failures.is_empty() {
            return Err(anyhow!("nvmf perf: {}", r.failures.join("; ")));
        }
        let (read, write) = (r.total_read(), r.total_write());
        let mut all = read.clone();
        all.merge(&write);
        Ok(EngineResult {
            seconds: r.runtime.as_secs_f64(),
            read: figures(&read),
            write: figures(&write),
            all: latency(&all),
            errors: r.errors(),
            command: command_line(&cfg, job.host_nqn.or(self.opts.host_nqn.as_deref())),
            initiator_pids: Vec::new(),
            initiator_cpu_s: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_reproduces_the_job() {
        let trid = crate::TransportId::parse(
            "trtype:TCP traddr:127.0.0.1 trsvcid:4500 subnqn:nqn.2024-01.io.nvmfd:b",
        )
        .unwrap();
        let mut cfg = PerfConfig::new(ConnectOptions::new(trid));
        cfg.workload = Workload::RandRw;
        cfg.read_pct = 75;
        cfg.io_size = 4096;
        cfg.queue_depth = 64;
        cfg.queues = 2;
        cfg.duration = Duration::from_secs(30);
        cfg.ramp = Duration::from_secs(5);
        cfg.cores = Some(vec![2, 3]);
        let c = command_line(&cfg, None);
        assert_eq!(
            c,
            "nvmf perf -r 'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4500 subnqn:nqn.2024-01.io.nvmfd:b' --ns 1 -w randrw -o 4k -q 64 --queues 2 -t 30 -M 75 --ramp 5 --cores 2-3"
        );
    }

    #[test]
    fn latency_curve_is_ascending_and_in_microseconds() {
        let mut d = DirStats::new();
        for ns in [10_000u64, 20_000, 30_000, 1_000_000] {
            d.record(4096, ns);
        }
        let l = latency(&d);
        assert_eq!(l.min_us, 10.0);
        assert!((l.max_us - 1000.0).abs() < 1.0, "{l:?}");
        assert!((l.mean_us - 265.0).abs() < 1.0, "{l:?}");
        assert_eq!(l.curve.len(), CURVE.len());
        assert!(l.curve.windows(2).all(|w| w[0].1 <= w[1].1), "{l:?}");
        assert_eq!(latency(&DirStats::new()), Latency::default());
    }
}
