//! bench/engines/fio.rs — the fio engines of `nvmf bench`: build fio's job
//! for a workload, run fio (bounded: ramp + runtime + margin, killed
//! after), report the measured window's edges, and read its JSON (parsed
//! in `fio_json.rs`). Three variants, one type:
//! - `fio`: fio with our external ioengine (`libnvmf_fio.so`), the target's
//!   transport ID as the filename; no kernel host involved;
//! - `fio-kernel`: fio with libaio and `direct=1` on a block device (the
//!   target connected by the kernel host, or any file);
//! - either of them in client/server mode: `fio --client=H1 --client=H2
//!   JOBFILE`, one `fio --server` per client machine (started by the
//!   operator), results summed over the clients.
//!
//! The window's edges: fio does not say when its ramp ends, so the job
//! runs `exec_prerun=true` (fio runs it right before the job's clock
//! starts and saves its output in `nvmf-bench.prerun.txt`, in fio's
//! working directory = the run's scratch directory); Start is sent `ramp`
//! seconds after that file appeared (client mode: after the spawn, about
//! half a second early), End when the fio process has exited (before it
//! is reaped, so that its CPU times can still be read from /proc). The
//! figures themselves come from fio's JSON and cover exactly fio's own
//! measured window. See docs/BENCH.md.

use super::fio_json::{percentile_list, FioOutput};
use crate::bench::engine::{Engine, EngineJob, Window};
use crate::bench::results::EngineResult;
use crate::bench::spec::{BenchSpec, Client, EngineKind, Target};
use crate::perf::Workload;
use crate::trid::TransportId;
use anyhow::{bail, Context};
use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Seconds fio may run past ramp + runtime before it is killed (start-up,
/// connection, teardown, writing the JSON).
pub const DEFAULT_MARGIN_S: u64 = 30;

/// Environment variable naming our ioengine's .so (as crates/nvmf-fio
/// documents it).
pub const ENGINE_ENV: &str = "NVMF_FIO_ENGINE";

/// Where scripts/build-fio-engine.sh installs our ioengine, relative to
/// the workspace root.
pub const DEFAULT_ENGINE_PATH: &str = "target/nvmf-fio/libnvmf_fio.so";

/// The ioengine to use when none is named: `$NVMF_FIO_ENGINE`, else
/// [`DEFAULT_ENGINE_PATH`] (relative to the current directory).
pub fn default_engine() -> PathBuf {
    std::env::var_os(ENGINE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ENGINE_PATH))
}

/// What fio loads.
#[derive(Debug, Clone, PartialEq)]
pub enum FioTarget {
    /// The target through our external ioengine (`libnvmf_fio.so` at this
    /// path); the filename is the trid (see [`nvmf_filename`]).
    Nvmf { engine: PathBuf },
    /// A block device (or file) through libaio with `direct=1`: the
    /// target as connected by the kernel host (`/dev/nvme1n1`); None =
    /// each target's own `device` from the spec (see `Engine::for_target`).
    Kernel { device: Option<PathBuf> },
}

/// How to run fio. Defaults: `fio` from PATH, local (no clients), margin
/// [`DEFAULT_MARGIN_S`], no extra options, scratch files in the system
/// temporary directory.
#[derive(Debug, Clone, PartialEq)]
pub struct FioOptions {
    /// The fio binary.
    pub fio: PathBuf,
    pub target: FioTarget,
    /// fio servers to drive (`host` or `host,port`, as fio's `--client`
    /// takes them); empty = run fio here.
    pub clients: Vec<String>,
    /// Seconds allowed past ramp + runtime.
    pub margin_s: u64,
    /// Extra job options (`key`, `value`), added last (they override ours).
    pub extra: Vec<(String, String)>,
    /// Where the job file and fio's output are written (a fresh directory
    /// is made under it per run and removed after); None = temp dir.
    pub scratch: Option<PathBuf>,
    /// Host NQN for our ioengine when the job names none (None: the
    /// ioengine's default).
    pub host_nqn: Option<String>,
}

impl FioOptions {
    /// fio with our external ioengine at `engine`.
    pub fn nvmf(engine: impl Into<PathBuf>) -> FioOptions {
        FioOptions::with(FioTarget::Nvmf {
            engine: engine.into(),
        })
    }

    /// fio with libaio, direct I/O, on `device`.
    pub fn kernel(device: impl Into<PathBuf>) -> FioOptions {
        FioOptions::with(FioTarget::Kernel {
            device: Some(device.into()),
        })
    }

    /// fio-kernel whose device is each target's `device` (from the spec).
    pub fn kernel_per_target() -> FioOptions {
        FioOptions::with(FioTarget::Kernel { device: None })
    }

    fn with(target: FioTarget) -> FioOptions {
        FioOptions {
            fio: PathBuf::from("fio"),
            target,
            clients: Vec::new(),
            margin_s: DEFAULT_MARGIN_S,
            extra: Vec::new(),
            scratch: None,
            host_nqn: None,
        }
    }
}

/// fio's filename for our external ioengine: space-separated `key=value`
/// pairs (`trtype=tcp traddr=127.0.0.1 trsvcid=4420 subnqn=NQN ns=1`,
/// plus `hostnqn=` when one is given), with every `:` escaped as `\:`
/// because fio splits filenames on unescaped colons (NQNs and IPv6
/// addresses hold colons; fio removes the backslashes before the engine
/// sees the name).
pub fn nvmf_filename(trid: &TransportId, nsid: u32, host_nqn: Option<&str>) -> String {
    let mut s = format!(
        "trtype=tcp traddr={} trsvcid={} subnqn={} ns={nsid}",
        trid.traddr, trid.trsvcid, trid.subnqn
    );
    if let Some(h) = host_nqn {
        s.push_str(&format!(" hostnqn={h}"));
    }
    s.replace(':', "\\:")
}

/// fio's `--client` form of a spec client: `host` or `host,port`, an
/// IPv6 address as `ip6:ADDR`.
pub fn fio_client(c: &Client) -> String {
    let host = if c.host.contains(':') {
        format!("ip6:{}", c.host)
    } else {
        c.host.clone()
    };
    match c.port {
        Some(p) => format!("{host},{p}"),
        None => host,
    }
}

/// fio's name for a workload pattern.
fn fio_rw(w: Workload) -> &'static str {
    match w {
        Workload::Read => "read",
        Workload::Write => "write",
        Workload::RandRead => "randread",
        Workload::RandWrite => "randwrite",
        Workload::Rw => "rw",
        Workload::RandRw => "randrw",
    }
}

/// The fio engines (one type for all variants; see the top of this file).
pub struct FioEngine {
    opts: FioOptions,
    version: OnceCell<String>,
    /// The device of the target of the next run (fio-kernel without a
    /// device of its own).
    target_device: Option<PathBuf>,
}

static RUNS: AtomicU64 = AtomicU64::new(0);

/// The file fio writes when a job's `exec_prerun` runs (named after the
/// job), the moment the job's clock starts.
const PRERUN_MARKER: &str = "nvmf-bench.prerun.txt";

impl FioEngine {
    pub fn new(opts: FioOptions) -> FioEngine {
        FioEngine {
            opts,
            version: OnceCell::new(),
            target_device: None,
        }
    }

    /// The engine a spec asks for (`engine = "fio"` or `"fio-kernel"`,
    /// `fio_engine`, `clients`); checks that fio runs here and, for a local
    /// `fio`, that the ioengine exists.
    pub fn for_spec(spec: &BenchSpec, host_nqn: Option<String>) -> anyhow::Result<FioEngine> {
        let mut o = match spec.engine {
            EngineKind::Fio => {
                let so = spec.fio_engine.clone().unwrap_or_else(default_engine);
                if spec.clients.is_empty() && !so.is_file() {
                    bail!(
                        "engine fio: no ioengine at {} (scripts/build-fio-engine.sh builds it; fio_engine in the spec or ${ENGINE_ENV} names another)",
                        so.display()
                    );
                }
                FioOptions::nvmf(so)
            }
            EngineKind::FioKernel => FioOptions::kernel_per_target(),
            other => bail!("engine {} is not a fio engine", other.name()),
        };
        o.clients = spec.clients.iter().map(fio_client).collect();
        o.host_nqn = host_nqn;
        let e = FioEngine::new(o);
        if e.version() == "unknown" {
            bail!(
                "engine {}: `{} --version` did not run (is fio installed?)",
                e.name(),
                e.opts.fio.display()
            );
        }
        Ok(e)
    }

    /// The device a fio-kernel run loads.
    fn device(&self) -> Option<&Path> {
        match &self.opts.target {
            FioTarget::Kernel { device } => device.as_deref().or(self.target_device.as_deref()),
            FioTarget::Nvmf { .. } => None,
        }
    }

    pub fn options(&self) -> &FioOptions {
        &self.opts
    }

    fn client_mode(&self) -> bool {
        !self.opts.clients.is_empty()
    }

    /// The job's options (`key`, `value`) in order, as they go on fio's
    /// command line (`--key=value`) or in a job file (`key=value`).
    pub fn job_options(&self, job: &EngineJob<'_>) -> Vec<(String, String)> {
        let w = job.workload;
        let mut o: Vec<(String, String)> = Vec::new();
        let mut put = |k: &str, v: String| o.push((k.to_string(), v));
        // Local runs start fio in the scratch directory: make our paths
        // absolute (the clients' paths are theirs, left as given).
        let local = !self.client_mode();
        let path = |p: &Path| {
            if local {
                std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
            } else {
                p.to_path_buf()
            }
        };
        match &self.opts.target {
            FioTarget::Nvmf { engine } => {
                put("ioengine", format!("external:{}", path(engine).display()));
                let host = job.host_nqn.or(self.opts.host_nqn.as_deref());
                put("filename", nvmf_filename(job.trid, job.nsid, host));
            }
            FioTarget::Kernel { .. } => {
                // run() refuses a run without a device before this.
                let device = self.device().unwrap_or(Path::new("DEVICE"));
                put("ioengine", "libaio".into());
                put("direct", "1".into());
                put(
                    "filename",
                    path(device).display().to_string().replace(':', "\\:"),
                );
            }
        }
        // Jobs as threads of one process: /proc sees all their CPU time.
        put("thread", "1".into());
        put("rw", fio_rw(w.rw).into());
        if matches!(w.rw, Workload::Rw | Workload::RandRw) {
            put("rwmixread", w.rw.read_pct(w.mix).to_string());
        }
        if w.rw.is_random() {
            put("norandommap", "1".into());
            put("randrepeat", "0".into());
        }
        put("bs", w.bs.to_string());
        put("iodepth", w.qd.to_string());
        put("numjobs", w.queues.to_string());
        put("time_based", "1".into());
        put("runtime", w.runtime_s.to_string());
        if w.ramp_s > 0 {
            put("ramp_time", w.ramp_s.to_string());
        }
        put("group_reporting", "1".into());
        // Count failed I/O (like `nvmf perf`) instead of stopping the job.
        put("continue_on_error", "io".into());
        // Percentiles and json+ histogram of the total latency
        // (submission to completion), not of clat alone.
        put("lat_percentiles", "1".into());
        put("clat_percentiles", "0".into());
        put("percentile_list", percentile_list());
        if local {
            // The start marker: fio runs this just before a job's clock
            // (and its ramp) starts, saving its output in
            // `nvmf-bench.prerun.txt` in its working directory.
            put("exec_prerun", "true".into());
        }
        // The pinned CPUs are this machine's: meaningless on clients.
        if !job.pin.is_empty() && local {
            let list: Vec<String> = job.pin.iter().map(|c| c.to_string()).collect();
            put("cpus_allowed", list.join(","));
            put("cpus_allowed_policy", "split".into());
        }
        for (k, v) in &self.opts.extra {
            put(k, v.clone());
        }
        o
    }

    /// fio's arguments (without the binary): results as json+ into
    /// `output`; local runs carry the job on the command line, client
    /// runs read it from `job_file` (written by the caller).
    pub fn args(&self, job: &EngineJob<'_>, output: &Path, job_file: &Path) -> Vec<String> {
        let mut a = Vec::new();
        for c in &self.opts.clients {
            a.push(format!("--client={c}"));
        }
        a.push("--output-format=json+".to_string());
        a.push(format!("--output={}", output.display()));
        if self.client_mode() {
            a.push(job_file.display().to_string());
        } else {
            a.push("--name=nvmf-bench".to_string());
            for (k, v) in self.job_options(job) {
                a.push(format!("--{k}={v}"));
            }
        }
        a
    }

    /// The job file for client mode.
    pub fn job_file(&self, job: &EngineJob<'_>) -> String {
        let mut s = String::from("[nvmf-bench]\n");
        for (k, v) in self.job_options(job) {
            s.push_str(&format!("{k}={v}\n"));
        }
        s
    }

    fn scratch_dir(&self) -> anyhow::Result<PathBuf> {
        let base = self.opts.scratch.clone().unwrap_or_else(std::env::temp_dir);
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let d = base.join(format!("nvmf-bench-fio-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(d)
    }

    fn run_in(
        &self,
        dir: &Path,
        job: &EngineJob<'_>,
        window: &mut dyn FnMut(Window),
    ) -> anyhow::Result<EngineResult> {
        let w = job.workload;
        let output = dir.join("fio.json");
        let job_path = dir.join("nvmf-bench.fio");
        let job_text = self.job_file(job);
        if self.client_mode() {
            std::fs::write(&job_path, &job_text)
                .with_context(|| format!("writing {}", job_path.display()))?;
        }
        let args = self.args(job, &output, &job_path);
        let mut command = std::iter::once(self.opts.fio.display().to_string())
            .chain(args.iter().cloned())
            .map(|a| shell_quote(&a))
            .collect::<Vec<_>>()
            .join(" ");
        if self.client_mode() {
            command.push_str(&format!("\n# {}:\n{job_text}", job_path.display()));
        }
        let log_path = dir.join("fio.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut cmd = Command::new(&self.opts.fio);
        if !self.client_mode() {
            cmd.current_dir(dir);
        }
        let mut child = Reaper(
            cmd.args(&args)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("starting {}", self.opts.fio.display()))?,
        );
        let pid = child.0.id();
        let t0 = Instant::now();
        let ramp = Duration::from_secs(w.ramp_s);
        let limit = ramp + Duration::from_secs(w.runtime_s + self.opts.margin_s);
        let (mut started, mut interrupted) = (false, false);
        // When Window::Start is due (since the spawn): `ramp` after the
        // first job's prerun marker appeared; in client mode (the jobs run
        // elsewhere) `ramp` after the spawn.
        let marker = dir.join(PRERUN_MARKER);
        let mut start_at = self.client_mode().then_some(ramp);
        let status = loop {
            // Exited? Look without reaping: the zombie keeps its CPU times
            // readable in /proc until Window::End has been handled.
            if exited(pid) {
                if started {
                    window(Window::End);
                }
                break child.0.wait()?;
            }
            let now = t0.elapsed();
            if start_at.is_none() && marker.exists() {
                start_at = Some(now + ramp);
            }
            if !started && start_at.is_some_and(|s| now >= s) {
                window(Window::Start);
                started = true;
            }
            if job.stop.load(Ordering::Relaxed) && !interrupted {
                // fio stops its jobs on SIGINT and still writes its results.
                // SAFETY: plain kill(2) on our own child's pid.
                unsafe { libc::kill(pid as i32, libc::SIGINT) };
                interrupted = true;
            }
            if now >= limit {
                child.kill();
                bail!(
                    "fio did not finish within {} s (ramp {} + runtime {} + margin {}); killed it. Output:\n{}",
                    limit.as_secs(),
                    w.ramp_s,
                    w.runtime_s,
                    self.opts.margin_s,
                    tail(&log_path)
                );
            }
            let step = match start_at {
                _ if started => Duration::from_millis(50),
                Some(s) => s.saturating_sub(now).min(Duration::from_millis(50)),
                // Watching for the marker.
                None => Duration::from_millis(2),
            };
            std::thread::sleep(step.max(Duration::from_millis(1)));
        };
        let text = std::fs::read_to_string(&output).unwrap_or_default();
        let parsed = FioOutput::parse(&text).and_then(|o| {
            // fio exits non-zero when a job stopped on an error (an error
            // it went on after, `continue_on_error`, leaves it at 0); after
            // our SIGINT its status does not matter.
            if !status.success() && !interrupted {
                let why = o.job_errors();
                bail!(
                    "fio failed: {}",
                    if why.is_empty() {
                        "no job error in its JSON".to_string()
                    } else {
                        why.join("; ")
                    }
                );
            }
            let want = self.opts.clients.len().max(1) as u32;
            if o.clients() != want {
                bail!(
                    "{want} fio client(s) asked for, results from {}",
                    o.clients()
                );
            }
            o.to_result()
        });
        let mut r = match parsed {
            Ok(r) => r,
            Err(e) => bail!(
                "{}{e:#}\nfio exited with {status}; its output:\n{}",
                if interrupted {
                    "stopped (Ctrl-C) before fio reported: "
                } else {
                    ""
                },
                tail(&log_path)
            ),
        };
        r.command = command;
        r.initiator_pids = vec![pid];
        Ok(r)
    }
}

/// fio's process: killed and reaped when dropped (a panicking window
/// callback or an error must not leave fio running); both are no-ops
/// once it has been waited for.
struct Reaper(std::process::Child);

impl Reaper {
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The run's scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether child `pid` has exited, without reaping it.
fn exited(pid: u32) -> bool {
    // SAFETY: zeroed siginfo_t is a valid out-parameter for waitid(2);
    // WNOWAIT leaves the child waitable for Child::wait.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        rc == 0 && info.si_pid() != 0
    }
}

/// The last lines of fio's stdout/stderr, for error messages.
fn tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    let from = lines.len().saturating_sub(20);
    let t = lines[from..].join("\n");
    if t.trim().is_empty() {
        "(none)".to_string()
    } else {
        t
    }
}

/// Quote `s` for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=.,/:+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

impl Engine for FioEngine {
    fn name(&self) -> &'static str {
        match self.opts.target {
            FioTarget::Nvmf { .. } => "fio",
            FioTarget::Kernel { .. } => "fio-kernel",
        }
    }

    fn version(&self) -> String {
        self.version
            .get_or_init(|| {
                Command::new(&self.opts.fio)
                    .arg("--version")
                    .stdin(Stdio::null())
                    .output()
                    .ok()
                    .filter(|o| o.status.success())
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                    .unwrap_or_else(|| "unknown".to_string())
            })
            .clone()
    }

    fn clients(&self) -> u32 {
        self.opts.clients.len().max(1) as u32
    }

    fn for_target(&mut self, target: &Target) {
        self.target_device = target.device.clone();
    }

    fn run(
        &mut self,
        job: &EngineJob<'_>,
        window: &mut dyn FnMut(Window),
    ) -> anyhow::Result<EngineResult> {
        if matches!(self.opts.target, FioTarget::Kernel { .. }) && self.device().is_none() {
            bail!("engine fio-kernel: no device for this target (give the target device = \"/dev/nvmeXnY\")");
        }
        let dir = Scratch(self.scratch_dir()?);
        self.run_in(&dir.0, job, window)
    }
}
