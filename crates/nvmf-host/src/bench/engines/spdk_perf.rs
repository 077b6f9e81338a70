//! bench/engines/spdk_perf.rs — the `spdk-perf` engine: SPDK's
//! `spdk_nvme_perf` as the load generator. Owns the command line built from
//! a job (`perf_args`), running it with the measured window's edges taken
//! from its output (`Engine::run`), and reading its text report back into an
//! `EngineResult` (`parse_output`).
//!
//! Ramp: perf's own warm-up (`-a SECS`): it runs the load, then clears its
//! statistics and measures `-t SECS`. It prints nothing when the warm-up
//! ends (unless on a terminal), so `Window::Start` is called `ramp` seconds
//! after its "Initialization complete. Launching workers." line, and
//! `Window::End` when its report begins (or it exits). Its stdout is a
//! pipe, which stdio block-buffers: perf runs under `stdbuf -oL` so those
//! lines arrive when printed (without stdbuf on PATH, Start is timed from
//! the spawn, less exactly).
//!
//! Latency: `-LL` (software latency tracking with the full histogram); the
//! percentiles and the curve come from the histogram buckets of every core
//! merged (a bucket's upper edge stands for its I/Os, as perf's own
//! summary does). perf reports reads and writes together: for a mixed
//! workload the I/O count is split by the mix and the per-direction latency
//! is left empty (only `all` is filled).
//!
//! CPU: perf's own utime + stime (/proc/PID/stat) read at the two edges
//! is the run's `initiator_cpu_s` (perf busy-polls: about one core per
//! perf core).
//!
//! Memory: perf needs hugepages, or `--no-huge -s MB` (plain memory), which
//! is used when fewer than the needed MiB of hugepages are free.

use crate::bench::cpu::Proc;
use crate::bench::engine::{Engine, EngineJob, Window};
use crate::bench::results::{DirFigures, EngineResult, Latency};
use crate::bench::targets::spdk::{
    cpu_list_arg, free_hugepage_mib, remove_dpdk_runtime_dir, shell_words,
};
use crate::perf::Workload;
use anyhow::{anyhow, bail, Context};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Time allowed on top of ramp + runtime for connecting, reporting and
/// exiting before perf is killed.
const SLACK: Duration = Duration::from_secs(60);

/// The `spdk_nvme_perf` engine.
pub struct SpdkPerfEngine {
    binary: PathBuf,
    host_nqn: Option<String>,
}

impl SpdkPerfEngine {
    /// `binary`: the spec's `spdk_perf`, or None to find `spdk_nvme_perf` on
    /// PATH (an error naming the fix when it is not there).
    pub fn new(binary: Option<&Path>, host_nqn: Option<String>) -> anyhow::Result<SpdkPerfEngine> {
        let binary = match binary {
            Some(b) => b.to_path_buf(),
            None => find_on_path("spdk_nvme_perf").ok_or_else(|| {
                anyhow!(
                    "engine spdk-perf: spdk_nvme_perf is not on PATH; set spdk_perf = \"PATH\" in the spec (SPDK's build/bin/spdk_nvme_perf)"
                )
            })?,
        };
        Ok(SpdkPerfEngine { binary, host_nqn })
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// MiB of memory perf needs: its I/O buffers (queue depth × queues × block
/// size, twice for slack) plus 256 MiB for DPDK and SPDK themselves.
pub fn memory_mib(qd: u16, queues: u16, bs: u32) -> u64 {
    let buffers = qd as u64 * queues as u64 * bs as u64 * 2;
    256 + buffers.div_ceil(1 << 20)
}

/// The arguments of one run (without the binary). `no_huge`: plain memory
/// (`--no-huge -s MB`).
pub fn perf_args(job: &EngineJob<'_>, host_nqn: Option<&str>, no_huge: bool) -> Vec<String> {
    let w = job.workload;
    let t = job.trid;
    let adrfam = if t.traddr.contains(':') {
        "IPv6"
    } else {
        "IPv4"
    };
    let mut trid = format!(
        "trtype:TCP adrfam:{adrfam} traddr:{} trsvcid:{} subnqn:{} ns:{}",
        t.traddr, t.trsvcid, t.subnqn, job.nsid
    );
    if let Some(h) = job.host_nqn.or(host_nqn) {
        trid += &format!(" hostnqn:{h}");
    }
    let mut a: Vec<String> = vec!["-r".into(), trid];
    for (k, v) in [
        ("-q", w.qd.to_string()),
        ("-o", w.bs.to_string()),
        ("-w", w.rw.name().to_string()),
    ] {
        a.push(k.into());
        a.push(v);
    }
    if matches!(w.rw, Workload::Rw | Workload::RandRw) {
        a.push("-M".into());
        a.push(w.mix.to_string());
    }
    a.push("-t".into());
    a.push(w.runtime_s.to_string());
    if w.ramp_s > 0 {
        a.push("-a".into());
        a.push(w.ramp_s.to_string());
    }
    // One core per queue when pinned to enough CPUs (each core gets its own
    // queue to the namespace); else one core with `queues` queues.
    let queues = w.queues as usize;
    let cores: Vec<usize> = if job.pin.len() >= queues && queues > 1 {
        job.pin[..queues].to_vec()
    } else {
        job.pin.first().map(|&c| vec![c]).unwrap_or_default()
    };
    if !cores.is_empty() {
        a.push("-c".into());
        a.push(cpu_list_arg(&cores));
    }
    if cores.len() > 1 {
        a.push("--use-every-core".into());
    } else if queues > 1 {
        a.push("-P".into());
        a.push(queues.to_string());
    }
    a.push("-LL".into());
    if no_huge {
        a.push("--no-huge".into());
        a.push("-s".into());
        a.push(memory_mib(w.qd, w.queues, w.bs).to_string());
    }
    a
}

/// What the reader thread saw on perf's stdout.
enum Event {
    /// "Initialization complete. Launching workers."
    Launched,
    /// The report began (the load is over).
    Report,
    /// stdout closed (perf exited), with everything it printed.
    Closed(String),
}

impl Engine for SpdkPerfEngine {
    fn name(&self) -> &'static str {
        "spdk-perf"
    }

    fn version(&self) -> String {
        spdk_version_near(&self.binary)
    }

    fn run(
        &mut self,
        job: &EngineJob<'_>,
        window: &mut dyn FnMut(Window),
    ) -> anyhow::Result<EngineResult> {
        let w = job.workload;
        let need = memory_mib(w.qd, w.queues, w.bs);
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let no_huge = free_hugepage_mib(&meminfo) < need;
        let args = perf_args(job, self.host_nqn.as_deref(), no_huge);
        let command = shell_words(
            std::iter::once(self.binary.display().to_string()).chain(args.iter().cloned()),
        );
        // perf's stdout is block-buffered into a pipe: line-buffer it
        // (coreutils' stdbuf, which execs perf, same pid) so its lines come
        // when printed; without stdbuf the window is timed from the spawn.
        let stdbuf = find_on_path("stdbuf");
        let mut cmd = match &stdbuf {
            Some(sb) => {
                let mut c = Command::new(sb);
                c.arg("-oL").arg(&self.binary);
                c
            }
            None => Command::new(&self.binary),
        };
        let spawned = Instant::now();
        let mut child = cmd
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("Initialization complete") {
                    let _ = tx.send(Event::Launched);
                } else if line.starts_with("Device Information") {
                    let _ = tx.send(Event::Report);
                }
                all.push_str(&line);
                all.push('\n');
            }
            let _ = tx.send(Event::Closed(all));
        });
        let mut stderr = child.stderr.take().expect("piped stderr");
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });

        let deadline = Instant::now() + Duration::from_secs(w.ramp_s + w.runtime_s) + SLACK;
        let ramp = Duration::from_secs(w.ramp_s);
        let mut start_at = stdbuf.is_none().then(|| spawned + ramp);
        let mut edges = Edges::new(pid);
        let (mut stopping, mut timed_out) = (false, false);
        let mut output = String::new();
        loop {
            let now = Instant::now();
            if start_at.is_some_and(|t| now >= t) {
                edges.start(window);
            }
            if job.stop.load(Ordering::Relaxed) && !stopping {
                // perf prints what it measured so far on SIGINT.
                stopping = true;
                // SAFETY: kill(2) on our own unreaped child.
                unsafe { libc::kill(pid as i32, libc::SIGINT) };
            }
            if now >= deadline && !timed_out {
                timed_out = true;
                let _ = child.kill();
            }
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(Event::Launched) if stdbuf.is_some() => start_at = Some(Instant::now() + ramp),
                Ok(Event::Launched) => {}
                Ok(Event::Report) => edges.end(window),
                Ok(Event::Closed(all)) => {
                    edges.end(window);
                    output = all;
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    edges.end(window);
                    break;
                }
            }
        }
        let status = child.wait().context("waiting for spdk_nvme_perf")?;
        let _ = reader.join();
        let errtext = err_reader.join().unwrap_or_default();
        remove_dpdk_runtime_dir(pid);
        let out = output;
        if timed_out {
            bail!(
                "spdk_nvme_perf did not finish within ramp + runtime + {} s and was killed\ncommand: {command}\n{}",
                SLACK.as_secs(),
                tail(&errtext, 10)
            );
        }
        if !status.success() && !stopping {
            bail!(
                "spdk_nvme_perf failed ({status})\ncommand: {command}\n{}{}",
                tail(&out, 5),
                tail(&errtext, 10)
            );
        }
        let wall = edges.seconds().unwrap_or(w.runtime_s as f64);
        let mut r = parse_output(&out, w.rw, w.mix, w.bs, wall).map_err(|e| {
            anyhow!(
                "spdk_nvme_perf output: {e}\ncommand: {command}\n{}",
                tail(&errtext, 10)
            )
        })?;
        r.command = command;
        r.initiator_pids = vec![pid];
        r.initiator_cpu_s = edges.cpu_s();
        Ok(r)
    }
}

/// The measured window's edges, each reported once and in order, with
/// perf's CPU time (utime + stime from /proc) read at each.
struct Edges {
    pid: u32,
    proc_: Proc,
    start: Option<(Instant, Option<f64>)>,
    end: Option<(Instant, Option<f64>)>,
}

impl Edges {
    fn new(pid: u32) -> Edges {
        Edges {
            pid,
            proc_: Proc::system(),
            start: None,
            end: None,
        }
    }

    fn cpu(&self) -> Option<f64> {
        self.proc_.process_cpu_s(&self.pid.to_string())
    }

    fn start(&mut self, window: &mut dyn FnMut(Window)) {
        if self.start.is_none() {
            self.start = Some((Instant::now(), self.cpu()));
            window(Window::Start);
        }
    }

    fn end(&mut self, window: &mut dyn FnMut(Window)) {
        self.start(window);
        if self.end.is_none() {
            window(Window::End);
            self.end = Some((Instant::now(), self.cpu()));
        }
    }

    fn seconds(&self) -> Option<f64> {
        Some(self.end?.0.duration_since(self.start?.0).as_secs_f64())
    }

    /// CPU seconds perf used between the edges.
    fn cpu_s(&self) -> Option<f64> {
        Some((self.end?.1? - self.start?.1?).max(0.0))
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let mut t = lines[lines.len().saturating_sub(n)..].join("\n");
    if !t.is_empty() {
        t.push('\n');
    }
    t
}

/// SPDK's version from an application next to `binary` (perf itself has
/// no --version): `nvmf_tgt --version` or `spdk_tgt --version`.
fn spdk_version_near(binary: &Path) -> String {
    let dir = binary.parent().unwrap_or(Path::new("."));
    for app in ["nvmf_tgt", "spdk_tgt"] {
        let p = dir.join(app);
        if !p.is_file() {
            continue;
        }
        if let Ok(o) = Command::new(&p)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
        {
            let v = String::from_utf8_lossy(&o.stdout);
            if let Some(l) = v.lines().find(|l| l.starts_with("SPDK")) {
                return format!("spdk_nvme_perf ({})", l.trim());
            }
        }
    }
    "spdk_nvme_perf (SPDK version unknown)".into()
}

/// The "Total" row of perf's report: IOPS, MiB/s, average, min, max (µs).
fn total_row(out: &str) -> Option<[f64; 5]> {
    let line = out.lines().find(|l| l.starts_with("Total "))?;
    let (_, nums) = line.split_once(':')?;
    let v: Vec<f64> = nums
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    v.try_into().ok()
}

/// The histogram buckets of every core, merged: (upper edge µs, I/Os),
/// ascending. Lines look like `   17.231 -    17.329:    1.5164%  (      964)`.
fn histogram(out: &str) -> Vec<(f64, u64)> {
    let mut buckets: std::collections::BTreeMap<u64, u64> = Default::default();
    let mut inside = false;
    for l in out.lines() {
        if l.starts_with("Latency histogram for") {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        let l = l.trim();
        if l.is_empty() {
            inside = false;
            continue;
        }
        let Some((range, rest)) = l.split_once(':') else {
            continue;
        };
        let Some((_, hi)) = range.split_once(" - ") else {
            continue;
        };
        let count = rest
            .rsplit_once('(')
            .and_then(|(_, c)| c.trim_end_matches(')').trim().parse::<u64>().ok());
        if let (Ok(hi), Some(count)) = (hi.trim().parse::<f64>(), count) {
            // Key on nanoseconds so equal edges from different cores merge.
            *buckets.entry((hi * 1000.0).round() as u64).or_default() += count;
        }
    }
    buckets
        .into_iter()
        .map(|(ns, c)| (ns as f64 / 1000.0, c))
        .collect()
}

/// The latency at percentile `p` (0..100) of merged buckets.
fn percentile(h: &[(f64, u64)], total: u64, p: f64) -> f64 {
    let want = (p / 100.0 * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for &(edge, c) in h {
        seen += c;
        if seen >= want {
            return edge;
        }
    }
    h.last().map(|b| b.0).unwrap_or(0.0)
}

/// Most points kept in the latency curve.
const CURVE_POINTS: usize = 200;

/// Read perf's report. `wall`: measured seconds, used only when the output
/// has no histogram (then I/Os = IOPS × wall).
pub fn parse_output(
    out: &str,
    rw: Workload,
    mix: u32,
    bs: u32,
    wall: f64,
) -> Result<EngineResult, String> {
    let [iops, _mibps, mean, min, max] = total_row(out)
        .ok_or_else(|| "no \"Total\" row (did it connect? no report printed)".to_string())?;
    let h = histogram(out);
    let hist_ios: u64 = h.iter().map(|b| b.1).sum();
    let (ios, seconds) = if hist_ios > 0 && iops > 0.0 {
        (hist_ios, hist_ios as f64 / iops)
    } else {
        ((iops * wall).round() as u64, wall)
    };
    let mut all = Latency {
        mean_us: mean,
        min_us: min,
        max_us: max,
        ..Latency::default()
    };
    if hist_ios > 0 {
        all.p50_us = percentile(&h, hist_ios, 50.0);
        all.p99_us = percentile(&h, hist_ios, 99.0);
        all.p999_us = percentile(&h, hist_ios, 99.9);
        all.p9999_us = percentile(&h, hist_ios, 99.99);
        let step = h.len().div_ceil(CURVE_POINTS).max(1);
        let mut seen = 0u64;
        for (i, &(edge, c)) in h.iter().enumerate() {
            seen += c;
            if i % step == 0 || i + 1 == h.len() {
                all.curve
                    .push((seen as f64 * 100.0 / hist_ios as f64, edge));
            }
        }
    }
    let reads = match rw {
        Workload::Read | Workload::RandRead => ios,
        Workload::Write | Workload::RandWrite => 0,
        Workload::Rw | Workload::RandRw => (ios as f64 * mix as f64 / 100.0).round() as u64,
    };
    let writes = ios - reads;
    let dir = |n: u64, whole: bool| DirFigures {
        ios: n,
        bytes: n * bs as u64,
        latency: if whole && n > 0 {
            all.clone()
        } else {
            Latency::default()
        },
    };
    Ok(EngineResult {
        seconds,
        read: dir(reads, writes == 0),
        write: dir(writes, reads == 0),
        all,
        errors: 0,
        command: String::new(),
        initiator_pids: Vec::new(),
        initiator_cpu_s: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::spec::WorkloadSpec;
    use crate::trid::TransportId;
    use std::sync::atomic::AtomicBool;

    const RANDRW: &str =
        include_str!("../../../tests/fixtures/spdk_nvme_perf/randrw-75-qd8-1core-LL.txt");
    const READ2: &str =
        include_str!("../../../tests/fixtures/spdk_nvme_perf/read-128k-qd4-2cores-LL.txt");

    #[test]
    fn parses_a_one_core_mixed_run() {
        let r = parse_output(RANDRW, Workload::RandRw, 75, 4096, 99.0).unwrap();
        let ios = r.read.ios + r.write.ios;
        // The histogram's counts add up to the I/Os; IOPS × seconds agrees.
        assert_eq!(ios, histogram(RANDRW).iter().map(|b| b.1).sum::<u64>());
        assert_eq!(ios, 225600);
        assert!((ios as f64 / r.seconds - 112349.03).abs() < 0.01, "{r:?}");
        assert!((r.seconds - 2.0).abs() < 0.05, "{}", r.seconds);
        assert_eq!(r.read.ios, (ios as f64 * 0.75).round() as u64);
        assert_eq!(r.read.bytes, r.read.ios * 4096);
        assert_eq!(
            (r.all.mean_us, r.all.min_us, r.all.max_us),
            (71.42, 15.88, 12190.57)
        );
        // perf's own summary: 50% 18.905 us, 99% 99.249 us, 99.9% 8217.206 us, 99.99% 12149.366 us.
        assert_eq!(
            (r.all.p50_us, r.all.p99_us, r.all.p999_us, r.all.p9999_us),
            (18.905, 99.249, 8217.206, 12149.366)
        );
        // Mixed: no per-direction latency.
        assert_eq!(r.read.latency, Latency::default());
        let c = &r.all.curve;
        assert!(c.len() > 10 && c.len() <= CURVE_POINTS + 1, "{}", c.len());
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert_eq!(c.last().unwrap(), &(100.0, 12199.778));
    }

    #[test]
    fn parses_a_two_core_run_by_merging_histograms() {
        let r = parse_output(READ2, Workload::Read, 100, 131072, 99.0).unwrap();
        assert_eq!(r.write.ios, 0);
        // Core 0's histogram counts 308 I/Os, core 1's 1585 (counted by hand).
        assert_eq!(r.read.ios, 308 + 1585);
        assert!((r.read.ios as f64 / r.seconds - 1885.74).abs() < 0.01);
        assert_eq!(
            (r.all.mean_us, r.all.min_us, r.all.max_us),
            (4233.99, 55.35, 103521.14)
        );
        // Pure reads: the read direction carries the latency.
        assert_eq!(r.read.latency, r.all);
        // Both cores' buckets are in: the total is above either core's.
        let h = histogram(READ2);
        assert!(h.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(r.all.p50_us > 55.35 && r.all.p50_us <= 103521.14 && r.all.p99_us >= r.all.p50_us);
    }

    #[test]
    fn output_without_a_report_is_an_error() {
        let e = parse_output(
            "Initializing NVMe Controllers\n",
            Workload::Read,
            100,
            4096,
            1.0,
        )
        .unwrap_err();
        assert!(e.contains("Total"), "{e}");
        // No histogram (perf without -LL): I/Os from IOPS × the measured wall time.
        let total = RANDRW.lines().find(|l| l.starts_with("Total")).unwrap();
        let r = parse_output(total, Workload::RandRead, 100, 4096, 2.0).unwrap();
        assert_eq!(r.read.ios, 224698);
        assert_eq!(r.all.p99_us, 0.0);
    }

    #[test]
    fn command_line_for_a_job() {
        let trid = TransportId::tcp("127.0.0.1", "4540", "nqn.2016-06.io.spdk:cnode1");
        let mut w = WorkloadSpec {
            name: "w".into(),
            rw: Workload::RandRw,
            mix: 70,
            bs: 4096,
            qd: 16,
            queues: 2,
            runtime_s: 5,
            ramp_s: 2,
        };
        let stop = AtomicBool::new(false);
        let job = |w: &WorkloadSpec, pin: &'static [usize]| {
            perf_args(
                &EngineJob {
                    trid: &trid,
                    nsid: 2,
                    workload: w,
                    pin,
                    host_nqn: None,
                    stop: &stop,
                },
                Some("nqn.h"),
                false,
            )
            .join(" ")
        };
        assert_eq!(
            job(&w, &[1, 3]),
            "-r trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4540 subnqn:nqn.2016-06.io.spdk:cnode1 ns:2 hostnqn:nqn.h \
             -q 16 -o 4096 -w randrw -M 70 -t 5 -a 2 -c [1,3] --use-every-core -LL"
        );
        // Fewer pinned CPUs than queues: one core, -P queues.
        assert!(
            job(&w, &[1]).ends_with("-c [1] -P 2 -LL"),
            "{}",
            job(&w, &[1])
        );
        w.rw = Workload::Read;
        w.queues = 1;
        w.ramp_s = 0;
        let a = job(&w, &[]);
        assert!(
            a.contains("-w read -t 5 -LL") && !a.contains("-M") && !a.contains("-c"),
            "{a}"
        );
        let a = perf_args(
            &EngineJob {
                trid: &trid,
                nsid: 1,
                workload: &w,
                pin: &[],
                host_nqn: None,
                stop: &stop,
            },
            None,
            true,
        );
        assert_eq!(a[a.len() - 3..], ["--no-huge", "-s", "257"]);
        assert_eq!(memory_mib(128, 4, 1 << 20), 256 + 1024);
    }
}
