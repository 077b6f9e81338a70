//! The bench spec: what `nvmf bench` measures, read from a TOML file or
//! taken from a built-in preset, checked field by field.
//!
//! ```toml
//! repetitions = 3                 # rounds of the whole matrix (default 3)
//! baseline = "nvmfd"              # a target name or a cell "target/workload" (optional)
//! goal = { iops = 10000 }         # per client: iops or mibps (optional)
//! engine = "nvmf-perf"            # nvmf-perf (default), fio, fio-kernel, spdk-perf
//! fio_engine = "libnvmf_fio.so"   # engine fio: our external ioengine (optional)
//! spdk_perf = "/opt/spdk/build/bin/spdk_nvme_perf"  # engine spdk-perf (default: PATH)
//! clients = ["host", "host:8765"] # engine fio/fio-kernel: fio servers (optional)
//!
//! [[target]]
//! name = "nvmfd"
//! kind = "nvmfd"                  # the harness starts it from `config` (relative to this file)
//! config = "nvmfd.json"
//! addr = "127.0.0.1"              # where it listens (default 127.0.0.1)
//! nsid = 1                        # namespace to load (any kind; default 1)
//! device = "/dev/nvme1n1"         # engine fio-kernel only (required there)
//! binary = "/tmp/old/nvmfd"       # this target's nvmfd (default: --nvmfd), e.g. an earlier build
//! args = ["--poll-us", "0"]       # more nvmfd options (not -c, -r, -m or --cores)
//!
//! [[target]]
//! name = "other"
//! kind = "trid"                   # an already running target, any vendor
//! trid = "trtype:TCP traddr:10.0.0.2 trsvcid:4420 subnqn:nqn.2016-06.io.spdk:cnode1"
//!
//! [[target]]
//! name = "spdk"
//! kind = "spdk"                   # SPDK nvmf_tgt, started by the harness
//! binary = "/opt/spdk/build/bin/nvmf_tgt"
//! config = "spdk.json"            # for `nvmf_tgt --json`; its first TCP listener is the trid
//! cores = "0x3"                   # -m: a mask or a cpulist "0-1" (default: placement)
//! rpc_socket = "/tmp/spdk.sock"   # -r (default: a private one per run)
//!
//! [[target]]
//! name = "linux"
//! kind = "kernel"                 # the Linux kernel target (nvmet), set up through configfs
//! backing = "/dev/nullb0"         # block device or file
//! addr = "127.0.0.1"              # default 127.0.0.1
//! port = 4420                     # default 4420
//! nqn = "nqn.2024-01.io.nvmfd:bench-linux"  # default nqn.2024-01.io.nvmfd:bench-NAME
//!
//! [[workload]]
//! name = "4k-randrw"              # default: derived from the fields
//! rw = "randrw"                   # read write randread randwrite rw randrw (default randread)
//! mix = 75                        # % reads, rw/randrw only (default 50)
//! bs = "4k"                       # bytes, suffixes k/m (default 4k)
//! qd = 64                         # per queue (default 32)
//! queues = 1                      # connections / jobs (default 1; alias `jobs`)
//! runtime = 30                    # seconds measured, or "30s"/"2m" (default 10)
//! ramp = 5                        # seconds run before measuring (default 0)
//! ```
//!
//! Every mistake is a [`SpecError`] naming the field and what it allows;
//! unknown keys are rejected (serde `deny_unknown_fields`).

use crate::perf::Workload;
use crate::trid::TransportId;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A bench spec that failed to parse or validate (the message names the field).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

fn err<T>(m: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError(m.into()))
}

/// Defaults (documented in docs/BENCH.md and the `nvmf bench` help).
pub const DEFAULT_REPETITIONS: u32 = 3;
pub const DEFAULT_RW: Workload = Workload::RandRead;
pub const DEFAULT_MIX: u32 = 50;
pub const DEFAULT_BS: u32 = 4096;
pub const DEFAULT_QD: u16 = 32;
pub const DEFAULT_QUEUES: u16 = 1;
pub const DEFAULT_RUNTIME_S: u64 = 10;
pub const DEFAULT_RAMP_S: u64 = 0;
pub const DEFAULT_NVMFD_ADDR: &str = "127.0.0.1";
pub const DEFAULT_NSID: u32 = 1;
pub const DEFAULT_KERNEL_PORT: u16 = 4420;
/// Default subsystem NQN of a kernel target: this prefix + the target's name.
pub const DEFAULT_KERNEL_NQN_PREFIX: &str = "nqn.2024-01.io.nvmfd:bench-";
/// Largest queue depth and queue count accepted (sanity bounds).
pub const MAX_QD: u16 = 4096;
pub const MAX_QUEUES: u16 = 1024;

/// A checked bench spec.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchSpec {
    pub targets: Vec<Target>,
    pub workloads: Vec<WorkloadSpec>,
    pub repetitions: u32,
    /// A target name or cell id (`target/workload`) the others are compared with.
    pub baseline: Option<String>,
    pub goal: Option<Goal>,
    /// The load generator every run uses.
    pub engine: EngineKind,
    /// Engine fio: path of our external ioengine (`libnvmf_fio.so`);
    /// None = the fio engine's own default.
    pub fio_engine: Option<PathBuf>,
    /// Engine spdk-perf: the `spdk_nvme_perf` binary; None = found on PATH.
    pub spdk_perf: Option<PathBuf>,
    /// Engine fio/fio-kernel: fio servers driven in client/server mode
    /// (empty = fio runs here).
    pub clients: Vec<Client>,
}

/// Which load generator runs the workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// `nvmf perf`, in process (the default).
    NvmfPerf,
    /// fio with our external ioengine (user-space NVMe/TCP).
    Fio,
    /// fio with libaio on a kernel block device (`device` per target).
    FioKernel,
    /// SPDK's `spdk_nvme_perf`.
    SpdkPerf,
}

/// The engine names a spec accepts.
pub const ENGINES: &str = "nvmf-perf, fio, fio-kernel, spdk-perf";

impl EngineKind {
    /// The name in specs and results.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::NvmfPerf => "nvmf-perf",
            EngineKind::Fio => "fio",
            EngineKind::FioKernel => "fio-kernel",
            EngineKind::SpdkPerf => "spdk-perf",
        }
    }

    pub fn parse(s: &str) -> Option<EngineKind> {
        Some(match s {
            "nvmf-perf" => EngineKind::NvmfPerf,
            "fio" => EngineKind::Fio,
            "fio-kernel" => EngineKind::FioKernel,
            "spdk-perf" => EngineKind::SpdkPerf,
            _ => return None,
        })
    }
}

/// A fio server for client/server mode: a host name or address and an
/// optional port (None: fio's default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub host: String,
    pub port: Option<u16>,
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.port, self.host.contains(':')) {
            (None, _) => write!(f, "{}", self.host),
            (Some(p), false) => write!(f, "{}:{p}", self.host),
            (Some(p), true) => write!(f, "[{}]:{p}", self.host),
        }
    }
}

/// What a run is measured against.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub name: String,
    pub kind: TargetKind,
    /// Namespace to load (default 1; a trid's `ns:` when it has one).
    pub nsid: u32,
    /// Engine fio-kernel: the kernel block device that reaches this target
    /// (required there, refused with the other engines).
    pub device: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TargetKind {
    /// An nvmfd the harness starts from `config` and stops; it listens on
    /// `addr`. `binary`: this target's nvmfd (e.g. an earlier build, for a
    /// before/after table in one run; None: `--nvmfd`); `args`: more nvmfd
    /// options (e.g. `["--zerocopy-send", "off"]`).
    Nvmfd {
        config: PathBuf,
        addr: String,
        binary: Option<PathBuf>,
        args: Vec<String>,
    },
    /// An already running target, reached by this transport ID.
    Trid(TransportId),
    /// SPDK `nvmf_tgt` started by the harness (`binary --json config`).
    Spdk(SpdkSpec),
    /// The Linux kernel target (nvmet), set up through configfs by the
    /// harness and torn down after.
    Kernel(KernelSpec),
}

/// A `kind = "spdk"` target.
#[derive(Debug, Clone, PartialEq)]
pub struct SpdkSpec {
    /// `nvmf_tgt`.
    pub binary: PathBuf,
    /// SPDK JSON config for `--json`.
    pub config: PathBuf,
    /// Where the initiator connects (the listener's address, or `addr`).
    pub addr: String,
    /// Where it listens: the config's first TCP listener, with `addr` as
    /// traddr when the listener is a wildcard (0.0.0.0 / ::).
    pub trid: TransportId,
    /// Reactor CPUs (`-m`); None = the placement's target CPUs.
    pub cores: Option<Vec<usize>>,
    /// Its JSON-RPC socket (`-r`); None = a private one per run.
    pub rpc_socket: Option<PathBuf>,
}

/// A `kind = "kernel"` target.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelSpec {
    /// Block device or file backing namespace `nsid`.
    pub backing: PathBuf,
    pub addr: String,
    pub port: u16,
    pub nqn: String,
}

impl KernelSpec {
    /// The transport ID the port listens on.
    pub fn trid(&self) -> TransportId {
        TransportId::tcp(&self.addr, &self.port.to_string(), &self.nqn)
    }
}

impl Target {
    /// The address the initiator connects to (for placement).
    pub fn addr(&self) -> &str {
        match &self.kind {
            TargetKind::Nvmfd { addr, .. } => addr,
            TargetKind::Trid(t) => &t.traddr,
            TargetKind::Spdk(s) => &s.addr,
            TargetKind::Kernel(k) => &k.addr,
        }
    }
}

/// One workload of the matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    pub name: String,
    pub rw: Workload,
    /// % reads (meaningful for rw/randrw; 100 or 0 for the pure kinds).
    pub mix: u32,
    pub bs: u32,
    pub qd: u16,
    pub queues: u16,
    pub runtime_s: u64,
    pub ramp_s: u64,
}

/// A declared goal, per client (initiator).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    Iops(f64),
    MiBps(f64),
}

// ---- raw TOML shape -------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    #[serde(default, rename = "target")]
    targets: Vec<RawTarget>,
    #[serde(default, rename = "workload")]
    workloads: Vec<RawWorkload>,
    repetitions: Option<toml::Value>,
    baseline: Option<String>,
    goal: Option<RawGoal>,
    engine: Option<String>,
    fio_engine: Option<String>,
    spdk_perf: Option<String>,
    clients: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: Option<String>,
    kind: Option<String>,
    config: Option<String>,
    addr: Option<String>,
    trid: Option<String>,
    nsid: Option<toml::Value>,
    device: Option<String>,
    binary: Option<String>,
    args: Option<Vec<String>>,
    cores: Option<toml::Value>,
    rpc_socket: Option<String>,
    backing: Option<String>,
    port: Option<toml::Value>,
    nqn: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    name: Option<String>,
    rw: Option<String>,
    mix: Option<toml::Value>,
    bs: Option<toml::Value>,
    qd: Option<toml::Value>,
    #[serde(alias = "jobs")]
    queues: Option<toml::Value>,
    runtime: Option<toml::Value>,
    ramp: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGoal {
    iops: Option<f64>,
    mibps: Option<f64>,
}

// ---- parsing and checks ---------------------------------------------------

/// Names of the built-in presets.
pub const PRESETS: &[&str] = &["quick", "seed-4k-randrw", "latency", "throughput"];

impl BenchSpec {
    /// Parse and check a TOML spec. Relative `config` paths are resolved
    /// against `base_dir` (the spec file's directory). `extra_targets` are
    /// transport IDs given on the command line (`--target`), added after
    /// the spec's own targets.
    pub fn from_toml(
        text: &str,
        base_dir: &Path,
        extra_targets: &[String],
    ) -> Result<BenchSpec, SpecError> {
        let raw: RawSpec = toml::from_str(text).map_err(|e| {
            SpecError(format!(
                "bench spec: {}",
                e.to_string().trim_end().replace('\n', "\n  ")
            ))
        })?;
        let mut targets = Vec::new();
        for (i, t) in raw.targets.into_iter().enumerate() {
            targets.push(check_target(i, t, base_dir)?);
        }
        for (i, s) in extra_targets.iter().enumerate() {
            targets.push(cli_target(targets.len(), i, s)?);
        }
        if targets.is_empty() {
            return err(
                "bench spec: no target: add a [[target]] (kind = \"nvmfd\", \"trid\", \"spdk\" or \"kernel\") or give --target TRID",
            );
        }
        let mut workloads = Vec::new();
        for (i, w) in raw.workloads.into_iter().enumerate() {
            workloads.push(check_workload(i, w)?);
        }
        if workloads.is_empty() {
            return err("bench spec: no [[workload]]: add at least one (e.g. rw = \"randread\")");
        }
        unique("target", targets.iter().map(|t| t.name.as_str()))?;
        unique("workload", workloads.iter().map(|w| w.name.as_str()))?;
        let repetitions = match &raw.repetitions {
            None => DEFAULT_REPETITIONS,
            Some(r) => int_in("bench spec", "repetitions", r, 1, 1000)?,
        };
        if let Some(b) = &raw.baseline {
            let is_target = targets.iter().any(|t| &t.name == b);
            let is_cell = b.split_once('/').is_some_and(|(t, w)| {
                targets.iter().any(|x| x.name == t) && workloads.iter().any(|x| x.name == w)
            });
            if !is_target && !is_cell {
                let names: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
                return err(format!(
                    "baseline = \"{b}\": not a target name ({}) nor a cell \"target/workload\"",
                    names.join(", ")
                ));
            }
        }
        let goal = match raw.goal {
            None => None,
            Some(g) => Some(match (g.iops, g.mibps) {
                (Some(v), None) if v > 0.0 && v.is_finite() => Goal::Iops(v),
                (None, Some(v)) if v > 0.0 && v.is_finite() => Goal::MiBps(v),
                (Some(_), Some(_)) => {
                    return err("goal: give one of iops or mibps, not both");
                }
                (None, None) => return err("goal: give iops = N or mibps = N (per client)"),
                _ => return err("goal: the value must be a positive number"),
            }),
        };
        let engine = match &raw.engine {
            None => EngineKind::NvmfPerf,
            Some(e) => EngineKind::parse(e)
                .ok_or_else(|| SpecError(format!("engine = \"{e}\" is not one of {ENGINES}")))?,
        };
        let fio_engine = match raw.fio_engine {
            None => None,
            Some(_) if engine != EngineKind::Fio => {
                return err(format!(
                    "fio_engine is for engine = \"fio\", not \"{}\"",
                    engine.name()
                ))
            }
            Some(p) => Some(existing_file("fio_engine", base_dir, &p)?),
        };
        let spdk_perf = match raw.spdk_perf {
            None => None,
            Some(_) if engine != EngineKind::SpdkPerf => {
                return err(format!(
                    "spdk_perf is for engine = \"spdk-perf\", not \"{}\"",
                    engine.name()
                ))
            }
            Some(p) => Some(existing_file("spdk_perf", base_dir, &p)?),
        };
        let clients = match raw.clients {
            None => Vec::new(),
            Some(_) if !matches!(engine, EngineKind::Fio | EngineKind::FioKernel) => {
                return err(format!(
                    "clients (fio client/server mode) are for engine = \"fio\" or \"fio-kernel\", not \"{}\"",
                    engine.name()
                ))
            }
            Some(c) if c.is_empty() => {
                return err("clients = []: list at least one \"host\" or \"host:port\" (or leave clients out)")
            }
            Some(c) => c
                .iter()
                .map(String::as_str)
                .map(parse_client)
                .collect::<Result<Vec<_>, _>>()?,
        };
        for (i, c) in clients.iter().enumerate() {
            if clients[..i].contains(c) {
                return err(format!("clients: \"{c}\" is listed twice"));
            }
        }
        for t in &targets {
            match (&t.device, engine) {
                (None, EngineKind::FioKernel) => {
                    return err(format!(
                        "[[target]] \"{}\": engine = \"fio-kernel\" needs device = \"/dev/nvmeXnY\" (the kernel block device connected to this target)",
                        t.name
                    ))
                }
                (Some(_), e) if e != EngineKind::FioKernel => {
                    return err(format!(
                        "[[target]] \"{}\": device is for engine = \"fio-kernel\", not \"{}\"",
                        t.name,
                        e.name()
                    ))
                }
                _ => {}
            }
        }
        Ok(BenchSpec {
            targets,
            workloads,
            repetitions,
            baseline: raw.baseline,
            goal,
            engine,
            fio_engine,
            spdk_perf,
            clients,
        })
    }

    /// Read a spec file.
    pub fn from_file(path: &Path, extra_targets: &[String]) -> Result<BenchSpec, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError(format!("bench spec {}: {e}", path.display())))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        BenchSpec::from_toml(&text, dir, extra_targets)
            .map_err(|e| SpecError(format!("{}: {}", path.display(), e.0)))
    }

    /// A built-in preset by name (targets come from `extra_targets`).
    pub fn preset(name: &str, extra_targets: &[String]) -> Option<Result<BenchSpec, SpecError>> {
        Some(BenchSpec::from_toml(
            preset_toml(name)?,
            Path::new("."),
            extra_targets,
        ))
    }

    /// SPEC as the command line gives it: a preset name, else a file path.
    pub fn load(spec: &str, extra_targets: &[String]) -> Result<BenchSpec, SpecError> {
        let path = Path::new(spec);
        if !path.exists() {
            if let Some(r) = BenchSpec::preset(spec, extra_targets) {
                return r;
            }
            return err(format!(
                "'{spec}' is neither a spec file nor a preset ({})",
                PRESETS.join(", ")
            ));
        }
        BenchSpec::from_file(path, extra_targets)
    }
}

/// The TOML text of a preset (also shown by `nvmf bench --help`).
pub fn preset_toml(name: &str) -> Option<&'static str> {
    Some(match name {
        "quick" => {
            "repetitions = 1\n[[workload]]\nname = \"quick-4k-randread\"\nrw = \"randread\"\nbs = \"4k\"\nqd = 32\nruntime = 5\nramp = 1\n"
        }
        "seed-4k-randrw" => {
            "repetitions = 3\n[[workload]]\nname = \"4k-randrw-75-qd64\"\nrw = \"randrw\"\nmix = 75\nbs = \"4k\"\nqd = 64\nruntime = 30\nramp = 5\n"
        }
        "latency" => {
            "repetitions = 3\n[[workload]]\nname = \"4k-randread-qd1\"\nrw = \"randread\"\nbs = \"4k\"\nqd = 1\nruntime = 30\nramp = 5\n"
        }
        "throughput" => {
            "repetitions = 3\n[[workload]]\nname = \"128k-read-qd32\"\nrw = \"read\"\nbs = \"128k\"\nqd = 32\nqueues = 4\nruntime = 30\nramp = 5\n"
        }
        _ => return None,
    })
}

fn unique<'a>(what: &str, names: impl Iterator<Item = &'a str>) -> Result<(), SpecError> {
    let mut seen = std::collections::HashSet::new();
    for n in names {
        if !seen.insert(n) {
            return err(format!(
                "{what} name \"{n}\" is used twice (names must be unique)"
            ));
        }
    }
    Ok(())
}

fn check_name(ctx: &str, n: &str) -> Result<(), SpecError> {
    if n.is_empty() || n.contains('/') || n.chars().any(char::is_whitespace) {
        return err(format!(
            "{ctx}: name \"{n}\" must be non-empty, without '/' or spaces"
        ));
    }
    Ok(())
}

const KINDS: &str = "nvmfd, trid, spdk, kernel";

/// Which kinds each per-kind field belongs to (for "X is for kind Y").
const FIELD_KINDS: &[(&str, &[&str])] = &[
    ("config", &["nvmfd", "spdk"]),
    ("addr", &["nvmfd", "spdk", "kernel"]),
    ("trid", &["trid"]),
    ("binary", &["spdk", "nvmfd"]),
    ("args", &["nvmfd"]),
    ("cores", &["spdk"]),
    ("rpc_socket", &["spdk"]),
    ("backing", &["kernel"]),
    ("port", &["kernel"]),
    ("nqn", &["kernel"]),
];

/// `p` with every `${NAME}` replaced by the environment variable NAME
/// (so a spec can name tools that live in different places on different
/// machines, e.g. `"${NVMFD_SPDK_DIR}/build/bin/nvmf_tgt"`); an unset or
/// empty variable, or an unclosed `${`, is an error naming it.
pub fn expand_env(ctx: &str, p: &str) -> Result<String, SpecError> {
    expand_env_with(ctx, p, |k| std::env::var(k).ok())
}

fn expand_env_with(
    ctx: &str,
    p: &str,
    get: impl Fn(&str) -> Option<String>,
) -> Result<String, SpecError> {
    let mut out = String::new();
    let mut rest = p;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(j) = after.find('}') else {
            return err(format!("{ctx} \"{p}\": '${{' without a closing '}}'"));
        };
        let name = &after[..j];
        match get(name).filter(|v| !v.is_empty()) {
            Some(v) => out.push_str(&v),
            None => {
                return err(format!(
                    "{ctx} \"{p}\": environment variable {name} is not set"
                ))
            }
        }
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `base_dir/p` (after `${NAME}` expansion), which must be a file.
fn existing_file(ctx: &str, base_dir: &Path, p: &str) -> Result<PathBuf, SpecError> {
    let path = base_dir.join(expand_env(ctx, p)?);
    if !path.is_file() {
        return err(format!("{ctx} \"{}\" is not a file", path.display()));
    }
    Ok(path)
}

fn check_ip(ctx: &str, addr: &str) -> Result<(), SpecError> {
    if addr.parse::<std::net::IpAddr>().is_err() {
        return err(format!("{ctx}: addr \"{addr}\" is not an IP address"));
    }
    Ok(())
}

fn check_target(i: usize, t: RawTarget, base_dir: &Path) -> Result<Target, SpecError> {
    let ctx = match &t.name {
        Some(n) => format!("[[target]] \"{n}\""),
        None => format!("[[target]] #{}", i + 1),
    };
    let Some(name) = t.name.clone() else {
        return err(format!("{ctx}: name is missing"));
    };
    check_name(&ctx, &name)?;
    let Some(kind) = t.kind.clone() else {
        return err(format!("{ctx}: kind is missing (one of {KINDS})"));
    };
    if !KINDS.split(", ").any(|k| k == kind) {
        return err(format!("{ctx}: kind = \"{kind}\" is not one of {KINDS}"));
    }
    let given: &[(&str, bool)] = &[
        ("config", t.config.is_some()),
        ("addr", t.addr.is_some()),
        ("trid", t.trid.is_some()),
        ("binary", t.binary.is_some()),
        ("cores", t.cores.is_some()),
        ("rpc_socket", t.rpc_socket.is_some()),
        ("backing", t.backing.is_some()),
        ("port", t.port.is_some()),
        ("nqn", t.nqn.is_some()),
    ];
    for (field, kinds) in FIELD_KINDS {
        let set = given.iter().any(|(f, s)| f == field && *s);
        if set && !kinds.contains(&kind.as_str()) {
            let kinds: Vec<String> = kinds.iter().map(|k| format!("\"{k}\"")).collect();
            return err(format!(
                "{ctx}: {field} is for kind = {}, not kind = \"{kind}\"",
                kinds.join(" or ")
            ));
        }
    }
    let mut nsid = match &t.nsid {
        None => None,
        Some(v) => Some(int_in::<u32>(&ctx, "nsid", v, 1, 0xFFFF_FFFE)?),
    };
    let device = t.device.map(PathBuf::from);
    let kind = match kind.as_str() {
        "nvmfd" => {
            let Some(config) = t.config else {
                return err(format!(
                    "{ctx}: kind = \"nvmfd\" needs config = \"PATH\" (nvmfd's JSON config)"
                ));
            };
            let config = existing_file(&format!("{ctx}: config"), base_dir, &config)?;
            let addr = t.addr.unwrap_or_else(|| DEFAULT_NVMFD_ADDR.to_string());
            check_ip(&ctx, &addr)?;
            let binary = match t.binary {
                Some(b) => Some(existing_file(&format!("{ctx}: binary"), base_dir, &b)?),
                None => None,
            };
            let args = t.args.unwrap_or_default();
            if let Some(a) = args.iter().find(|a| {
                matches!(
                    a.as_str(),
                    "-c" | "--config" | "-r" | "--rpc-socket" | "--cores" | "-m"
                )
            }) {
                return err(format!(
                    "{ctx}: args may not contain {a} (the harness sets the config, RPC socket and cores)"
                ));
            }
            TargetKind::Nvmfd {
                config,
                addr,
                binary,
                args,
            }
        }
        "trid" => {
            let Some(s) = t.trid else {
                return err(format!(
                    "{ctx}: kind = \"trid\" needs trid = \"trtype:TCP traddr:ADDR trsvcid:PORT subnqn:NQN\""
                ));
            };
            let trid = parse_trid(&ctx, &s)?;
            match (nsid, trid.nsid) {
                (Some(a), Some(b)) if a != b => {
                    return err(format!(
                        "{ctx}: nsid = {a} and the trid's ns:{b} disagree (give one)"
                    ))
                }
                (None, Some(b)) => nsid = Some(b),
                _ => {}
            }
            TargetKind::Trid(trid)
        }
        "spdk" => {
            let Some(binary) = t.binary else {
                return err(format!(
                    "{ctx}: kind = \"spdk\" needs binary = \"PATH\" (SPDK's build/bin/nvmf_tgt)"
                ));
            };
            let binary = existing_file(&format!("{ctx}: binary"), base_dir, &binary)?;
            let Some(config) = t.config else {
                return err(format!(
                    "{ctx}: kind = \"spdk\" needs config = \"PATH\" (SPDK JSON config for nvmf_tgt --json)"
                ));
            };
            let config = existing_file(&format!("{ctx}: config"), base_dir, &config)?;
            let text = std::fs::read_to_string(&config)
                .map_err(|e| SpecError(format!("{ctx}: config \"{}\": {e}", config.display())))?;
            let mut trid = spdk_config_listener(&text)
                .map_err(|e| SpecError(format!("{ctx}: config \"{}\": {e}", config.display())))?;
            if let Some(a) = &t.addr {
                check_ip(&ctx, a)?;
            }
            let wildcard = matches!(trid.traddr.as_str(), "0.0.0.0" | "::");
            let addr = match t.addr {
                Some(a) if wildcard => a,
                Some(a) if a != trid.traddr => {
                    return err(format!(
                        "{ctx}: addr \"{a}\" differs from the config's listener traddr {} (leave addr out, or listen on it)",
                        trid.traddr
                    ))
                }
                Some(a) => a,
                None if wildcard => DEFAULT_NVMFD_ADDR.to_string(),
                None => trid.traddr.clone(),
            };
            check_ip(&ctx, &addr)?;
            trid = TransportId {
                hostnqn: None,
                nsid: None,
                ..TransportId::tcp(&addr, &trid.trsvcid, &trid.subnqn)
            };
            let cores = match &t.cores {
                None => None,
                Some(v) => Some(parse_cores(&ctx, v)?),
            };
            TargetKind::Spdk(SpdkSpec {
                binary,
                config,
                addr,
                trid,
                cores,
                rpc_socket: t.rpc_socket.map(PathBuf::from),
            })
        }
        _ => {
            // "kernel"
            let Some(backing) = t.backing else {
                return err(format!(
                    "{ctx}: kind = \"kernel\" needs backing = \"PATH\" (a block device or file for the namespace)"
                ));
            };
            let backing = base_dir.join(backing);
            if !backing.exists() {
                return err(format!(
                    "{ctx}: backing \"{}\" does not exist",
                    backing.display()
                ));
            }
            let addr = t.addr.unwrap_or_else(|| DEFAULT_NVMFD_ADDR.to_string());
            check_ip(&ctx, &addr)?;
            let port = match &t.port {
                None => DEFAULT_KERNEL_PORT,
                Some(v) => int_in(&ctx, "port", v, 1, 65535)?,
            };
            let nqn = t
                .nqn
                .unwrap_or_else(|| format!("{DEFAULT_KERNEL_NQN_PREFIX}{name}"));
            if !nqn.starts_with("nqn.") || nqn.len() > 223 || nqn.chars().any(char::is_whitespace) {
                return err(format!(
                    "{ctx}: nqn \"{nqn}\" is not an NVMe qualified name (nqn.YYYY-MM.domain:name, at most 223 bytes, no spaces)"
                ));
            }
            TargetKind::Kernel(KernelSpec {
                backing,
                addr,
                port,
                nqn,
            })
        }
    };
    Ok(Target {
        name,
        kind,
        nsid: nsid.unwrap_or(DEFAULT_NSID),
        device,
    })
}

/// `cores`: a hex mask string ("0x3"), a cpulist string ("0-1,4") or a
/// list of CPU numbers ([0, 1]). Non-empty.
fn parse_cores(ctx: &str, v: &toml::Value) -> Result<Vec<usize>, SpecError> {
    let bad = |why: String| {
        SpecError(format!(
            "{ctx}: cores = {v}: {why} (a mask \"0x3\", a cpulist \"0-1,4\" or a list [0, 1])"
        ))
    };
    let cpus = match v {
        toml::Value::String(s) => {
            let s = s.trim();
            if let Some(hex) = s.strip_prefix("0x").or(s.strip_prefix("0X")) {
                let m = u128::from_str_radix(hex, 16)
                    .map_err(|_| bad("not a hex mask of up to 128 CPUs".into()))?;
                (0..128).filter(|b| m >> b & 1 == 1).collect()
            } else {
                super::placement::parse_cpulist(s).map_err(bad)?
            }
        }
        toml::Value::Array(a) => {
            let mut cpus = Vec::new();
            for x in a {
                match x.as_integer() {
                    Some(c) if (0..=super::placement::MAX_CPU as i64).contains(&c) => {
                        cpus.push(c as usize)
                    }
                    _ => return Err(bad(format!("{x} is not a CPU number"))),
                }
            }
            cpus
        }
        _ => return Err(bad("not a string or a list".into())),
    };
    if cpus.is_empty() {
        return Err(bad("no CPU".into()));
    }
    Ok(cpus)
}

/// The transport ID of the first TCP listener an SPDK JSON config adds
/// (`nvmf_subsystem_add_listener` in the "nvmf" subsystem).
pub fn spdk_config_listener(text: &str) -> Result<TransportId, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let calls = v
        .get("subsystems")
        .and_then(|s| s.as_array())
        .ok_or("no \"subsystems\" list (not an SPDK JSON config)")?
        .iter()
        .filter(|s| s.get("subsystem").and_then(|n| n.as_str()) == Some("nvmf"))
        .filter_map(|s| s.get("config").and_then(|c| c.as_array()))
        .flatten();
    for c in calls {
        if c.get("method").and_then(|m| m.as_str()) != Some("nvmf_subsystem_add_listener") {
            continue;
        }
        let p = c.get("params");
        let la = p.and_then(|p| p.get("listen_address"));
        let field = |k: &str| la.and_then(|l| l.get(k)).and_then(|x| x.as_str());
        if !field("trtype").is_some_and(|t| t.eq_ignore_ascii_case("tcp")) {
            continue;
        }
        let nqn = p
            .and_then(|p| p.get("nqn"))
            .and_then(|x| x.as_str())
            .ok_or("nvmf_subsystem_add_listener without params.nqn")?;
        let traddr = field("traddr").ok_or("a TCP listener without listen_address.traddr")?;
        let trsvcid = field("trsvcid").unwrap_or("4420");
        if traddr.parse::<std::net::IpAddr>().is_err() {
            return Err(format!("listener traddr \"{traddr}\" is not an IP address"));
        }
        return Ok(TransportId::tcp(traddr, trsvcid, nqn));
    }
    Err("no TCP listener: add an nvmf_subsystem_add_listener call (trtype TCP) to the \"nvmf\" subsystem".into())
}

/// A fio server: "host", "host:port", "[v6]:port" or a bare IPv6 address.
fn parse_client(s: &str) -> Result<Client, SpecError> {
    let bad = || {
        SpecError(format!(
            "clients: \"{s}\" is not \"host\" or \"host:port\" (port 1..65535)"
        ))
    };
    let s2 = s.trim();
    let (host, port) = if let Some(rest) = s2.strip_prefix('[') {
        let (h, p) = rest.split_once(']').ok_or_else(bad)?;
        match p {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else if s2.matches(':').count() == 1 {
        let (h, p) = s2.split_once(':').ok_or_else(bad)?;
        (h, Some(p))
    } else {
        (s2, None)
    };
    if host.is_empty()
        || host
            .chars()
            .any(|c| c.is_whitespace() || c == ',' || c == '/')
    {
        return Err(bad());
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(n),
            _ => return Err(bad()),
        },
    };
    Ok(Client {
        host: host.to_string(),
        port,
    })
}

fn parse_trid(ctx: &str, s: &str) -> Result<TransportId, SpecError> {
    let t = TransportId::parse(s).map_err(|e| SpecError(format!("{ctx}: trid: {e}")))?;
    if t.subnqn == crate::trid::DISCOVERY_NQN {
        return err(format!(
            "{ctx}: trid: subnqn:NQN is missing (a discovery service has no namespaces to measure)"
        ));
    }
    if t.traddr.parse::<std::net::IpAddr>().is_err() {
        return err(format!(
            "{ctx}: trid: traddr \"{}\" is not an IP address",
            t.traddr
        ));
    }
    Ok(t)
}

/// A `--target TRID` from the command line, named `target1`, `target2`, ...
fn cli_target(n: usize, i: usize, s: &str) -> Result<Target, SpecError> {
    let ctx = format!("--target #{} '{s}'", i + 1);
    let trid = parse_trid(&ctx, s)?;
    Ok(Target {
        name: format!("target{}", n + 1),
        nsid: trid.nsid.unwrap_or(DEFAULT_NSID),
        kind: TargetKind::Trid(trid),
        device: None,
    })
}

/// A whole number from `lo` to `hi`.
fn int_in<T: TryFrom<i64>>(
    ctx: &str,
    field: &str,
    v: &toml::Value,
    lo: i64,
    hi: i64,
) -> Result<T, SpecError> {
    match v.as_integer() {
        Some(i) if (lo..=hi).contains(&i) => {
            T::try_from(i).map_err(|_| SpecError(format!("{ctx}: {field} = {v}: out of range")))
        }
        _ => err(format!(
            "{ctx}: {field} = {v}: must be a whole number from {lo} to {hi}"
        )),
    }
}

/// A size: an integer (bytes) or a string with an optional k/m suffix.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = if let Some(n) = t.strip_suffix("kib").or(t.strip_suffix('k')) {
        (n, 1024u64)
    } else if let Some(n) = t.strip_suffix("mib").or(t.strip_suffix('m')) {
        (n, 1024 * 1024)
    } else {
        (t.as_str(), 1)
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mul)
}

/// Seconds: an integer, or a string "30", "30s", "2m".
fn parse_secs(ctx: &str, field: &str, v: &toml::Value) -> Result<u64, SpecError> {
    let bad = || {
        SpecError(format!(
            "{ctx}: {field} = {v}: not a duration (seconds as a number, or \"30s\", \"2m\")"
        ))
    };
    let s = match v {
        toml::Value::Integer(i) if *i >= 0 => return Ok(*i as u64),
        toml::Value::String(s) => s.trim(),
        _ => return Err(bad()),
    };
    let (num, mul) = if let Some(n) = s.strip_suffix('m') {
        (n, 60)
    } else {
        (s.strip_suffix('s').unwrap_or(s), 1)
    };
    num.trim()
        .parse::<u64>()
        .map(|n| n * mul)
        .map_err(|_| bad())
}

fn check_workload(i: usize, w: RawWorkload) -> Result<WorkloadSpec, SpecError> {
    let ctx = match &w.name {
        Some(n) => format!("[[workload]] \"{n}\""),
        None => format!("[[workload]] #{}", i + 1),
    };
    let rw = match &w.rw {
        None => DEFAULT_RW,
        Some(s) => Workload::parse(s).ok_or_else(|| {
            SpecError(format!(
                "{ctx}: rw = \"{s}\" is not one of read, write, randread, randwrite, rw, randrw"
            ))
        })?,
    };
    let mixed = matches!(rw, Workload::Rw | Workload::RandRw);
    let mix = match (&w.mix, mixed) {
        (Some(m), true) => int_in(&ctx, "mix", m, 0, 100)?,
        (None, true) => DEFAULT_MIX,
        (Some(_), false) => {
            return err(format!(
                "{ctx}: mix (% reads) only applies to rw = \"rw\" or \"randrw\", not \"{}\"",
                rw.name()
            ))
        }
        (None, false) => match rw {
            Workload::Read | Workload::RandRead => 100,
            _ => 0,
        },
    };
    let bs = match &w.bs {
        None => DEFAULT_BS,
        Some(v) => {
            let n = match v {
                toml::Value::Integer(i) if *i > 0 => Some(*i as u64),
                toml::Value::String(s) => parse_size(s),
                _ => None,
            };
            match n {
                Some(n) if n >= 512 && n.is_multiple_of(512) && n <= 16 * 1024 * 1024 => n as u32,
                _ => {
                    return err(format!(
                        "{ctx}: bs = {v}: must be a multiple of 512 bytes up to 16m (e.g. 4096, \"4k\", \"128k\", \"1m\")"
                    ))
                }
            }
        }
    };
    let qd = match &w.qd {
        None => DEFAULT_QD,
        Some(q) => int_in(&ctx, "qd", q, 1, MAX_QD as i64)?,
    };
    let queues = match &w.queues {
        None => DEFAULT_QUEUES,
        Some(q) => int_in(&ctx, "queues", q, 1, MAX_QUEUES as i64)?,
    };
    let runtime_s = match &w.runtime {
        None => DEFAULT_RUNTIME_S,
        Some(v) => parse_secs(&ctx, "runtime", v)?,
    };
    if runtime_s == 0 {
        return err(format!("{ctx}: runtime must be at least 1 second"));
    }
    let ramp_s = match &w.ramp {
        None => DEFAULT_RAMP_S,
        Some(v) => parse_secs(&ctx, "ramp", v)?,
    };
    let name = match w.name {
        Some(n) => n,
        None => {
            let mut n = format!("{}-{}", rw.name(), size_name(bs));
            if mixed {
                n += &format!("-{mix}r");
            }
            n + &format!("-qd{qd}")
                + &if queues > 1 {
                    format!("x{queues}")
                } else {
                    String::new()
                }
        }
    };
    check_name(&ctx, &name)?;
    Ok(WorkloadSpec {
        name,
        rw,
        mix,
        bs,
        qd,
        queues,
        runtime_s,
        ramp_s,
    })
}

/// "4k", "128k", "1m", or bytes.
pub fn size_name(bs: u32) -> String {
    if bs.is_multiple_of(1024 * 1024) {
        format!("{}m", bs / (1024 * 1024))
    } else if bs.is_multiple_of(1024) {
        format!("{}k", bs / 1024)
    } else {
        bs.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRID: &str =
        "trtype:TCP traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.nvmfd:default";

    fn parse(text: &str) -> Result<BenchSpec, SpecError> {
        BenchSpec::from_toml(text, Path::new("/nonexistent"), &[])
    }

    fn error_of(text: &str) -> String {
        parse(text).unwrap_err().0
    }

    fn with_target(rest: &str) -> String {
        // Top-level keys in `rest` must come before any table.
        format!("{rest}[[target]]\nname = \"t\"\nkind = \"trid\"\ntrid = \"{TRID}\"\n")
    }

    #[test]
    fn defaults_and_full_workload() {
        let s = parse(&with_target(
            "[[workload]]\n[[workload]]\nname = \"mixed\"\nrw = \"randrw\"\nmix = 75\nbs = \"128k\"\nqd = 64\njobs = 4\nruntime = \"2m\"\nramp = \"5s\"\n",
        ))
        .unwrap();
        assert_eq!(s.repetitions, DEFAULT_REPETITIONS);
        assert_eq!(s.targets[0].addr(), "127.0.0.1");
        let d = &s.workloads[0];
        assert_eq!(
            (d.rw, d.mix, d.bs, d.qd, d.queues, d.runtime_s, d.ramp_s),
            (Workload::RandRead, 100, 4096, 32, 1, 10, 0)
        );
        assert_eq!(d.name, "randread-4k-qd32");
        let m = &s.workloads[1];
        assert_eq!(
            (m.rw, m.mix, m.bs, m.qd, m.queues, m.runtime_s, m.ramp_s),
            (Workload::RandRw, 75, 131072, 64, 4, 120, 5)
        );
    }

    #[test]
    fn presets_parse_with_a_cli_target() {
        for p in PRESETS {
            let s = BenchSpec::preset(p, &[TRID.to_string()]).unwrap().unwrap();
            assert_eq!(s.targets[0].name, "target1");
        }
        let s = BenchSpec::preset("seed-4k-randrw", &[TRID.into()])
            .unwrap()
            .unwrap();
        let w = &s.workloads[0];
        assert_eq!((w.rw, w.mix, w.bs, w.qd), (Workload::RandRw, 75, 4096, 64));
        // A preset without --target names the missing piece.
        let e = BenchSpec::preset("quick", &[]).unwrap().unwrap_err().0;
        assert!(e.contains("--target"), "{e}");
        assert!(BenchSpec::preset("nope", &[]).is_none());
    }

    #[test]
    fn bad_fields_are_named_with_allowed_values() {
        let cases: &[(&str, &[&str])] = &[
            (
                "[[workload]]\nrw = \"sideways\"\n",
                &["rw", "randrw", "sideways"],
            ),
            (
                "[[workload]]\nrw = \"read\"\nmix = 70\n",
                &["mix", "randrw"],
            ),
            (
                "[[workload]]\nrw = \"randrw\"\nmix = 170\n",
                &["mix", "0 to 100"],
            ),
            ("[[workload]]\nbs = 1000\n", &["bs", "512"]),
            ("[[workload]]\nbs = \"lots\"\n", &["bs"]),
            ("[[workload]]\nqd = 0\n", &["qd", "1 to"]),
            (
                "[[workload]]\nqd = \"deep\"\n",
                &["qd = \"deep\"", "whole number from 1 to 4096"],
            ),
            ("[[workload]]\nqueues = -1\n", &["queues"]),
            ("[[workload]]\nruntime = \"soon\"\n", &["runtime"]),
            ("[[workload]]\nruntime = 0\n", &["runtime"]),
            ("[[workload]]\nbsz = 4096\n", &["bsz", "bs"]),
            ("repetitions = 0\n[[workload]]\n", &["repetitions"]),
            ("colour = 1\n[[workload]]\n", &["colour", "repetitions"]),
            ("baseline = \"x\"\n[[workload]]\n", &["baseline", "x"]),
            (
                "goal = { iops = 1, mibps = 2 }\n[[workload]]\n",
                &["goal", "both"],
            ),
            ("goal = { watts = 1 }\n[[workload]]\n", &["watts", "iops"]),
            (
                "[[workload]]\nname = \"a\"\n[[workload]]\nname = \"a\"\n",
                &["\"a\"", "twice"],
            ),
            ("[[workload]]\nname = \"a/b\"\n", &["name", "/"]),
        ];
        for (rest, words) in cases {
            let e = error_of(&with_target(rest));
            for w in *words {
                assert!(e.contains(w), "error for {rest:?} lacks {w:?}: {e}");
            }
        }
    }

    #[test]
    fn bad_targets() {
        let w = "[[workload]]\n";
        let cases: &[(&str, &[&str])] = &[
            ("[[target]]\nname = \"s\"\nkind = \"spdk\"\n", &["kind = \"spdk\" needs binary"]),
            ("[[target]]\nname = \"k\"\nkind = \"kernel\"\n", &["kind = \"kernel\" needs backing"]),
            ("[[target]]\nname = \"x\"\nkind = \"magic\"\n", &["magic", "nvmfd, trid, spdk, kernel"]),
            ("[[target]]\nname = \"x\"\n", &["kind is missing"]),
            ("[[target]]\nkind = \"trid\"\n", &["#1", "name"]),
            ("[[target]]\nname = \"x\"\nkind = \"trid\"\n", &["needs trid"]),
            ("[[target]]\nname = \"x\"\nkind = \"trid\"\ntrid = \"traddr:nowhere subnqn:nqn.x\"\n", &["traddr", "nowhere"]),
            ("[[target]]\nname = \"x\"\nkind = \"trid\"\ntrid = \"traddr:127.0.0.1\"\n", &["subnqn", "missing"]),
            ("[[target]]\nname = \"x\"\nkind = \"nvmfd\"\n", &["needs config"]),
            ("[[target]]\nname = \"x\"\nkind = \"nvmfd\"\nconfig = \"missing.json\"\n", &["missing.json", "not a file"]),
            ("[[target]]\nname = \"x\"\nkind = \"trid\"\nconfig = \"a\"\ntrid = \"traddr:1.2.3.4 subnqn:nqn.x\"\n", &["config", "kind = \"nvmfd\""]),
            ("", &["no target"]),
        ];
        for (t, words) in cases {
            let e = error_of(&format!("{t}{w}"));
            for x in *words {
                assert!(e.contains(x), "error for {t:?} lacks {x:?}: {e}");
            }
        }
        assert!(error_of(&with_target("")).contains("no [[workload]]"));
    }

    #[test]
    fn nvmfd_target_config_resolves_against_the_spec_dir() {
        let dir = std::env::temp_dir().join(format!("nvmf-bench-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("n.json"), "{}").unwrap();
        let s = BenchSpec::from_toml(
            "baseline = \"n/w\"\ngoal = { iops = 10000 }\n[[target]]\nname = \"n\"\nkind = \"nvmfd\"\nconfig = \"n.json\"\n[[workload]]\nname = \"w\"\n",
            &dir,
            &[TRID.into()],
        )
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            s.targets[0].kind,
            TargetKind::Nvmfd {
                config: dir.join("n.json"),
                addr: "127.0.0.1".into(),
                binary: None,
                args: Vec::new(),
            }
        );
        assert_eq!(s.targets[1].name, "target2");
        assert_eq!(s.goal, Some(Goal::Iops(10000.0)));
        assert_eq!(s.baseline.as_deref(), Some("n/w"));
    }

    #[test]
    fn nvmfd_target_binary_and_args() {
        let dir = std::env::temp_dir().join(format!("nvmf-bench-spec-ba-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("n.json"), "{}").unwrap();
        std::fs::write(dir.join("old-nvmfd"), "").unwrap();
        let t = |extra: &str| {
            BenchSpec::from_toml(
                &format!("[[target]]\nname = \"old\"\nkind = \"nvmfd\"\nconfig = \"n.json\"\n{extra}[[workload]]\nname = \"w\"\n"),
                &dir,
                &[],
            )
        };
        let s = t("binary = \"old-nvmfd\"\nargs = [\"--poll-us\", \"0\"]\n").unwrap();
        assert_eq!(
            s.targets[0].kind,
            TargetKind::Nvmfd {
                config: dir.join("n.json"),
                addr: "127.0.0.1".into(),
                binary: Some(dir.join("old-nvmfd")),
                args: vec!["--poll-us".into(), "0".into()],
            }
        );
        let e = t("binary = \"gone\"\n").unwrap_err().to_string();
        assert!(e.contains("binary") && e.contains("gone"), "{e}");
        let e = t("args = [\"-m\", \"0x3\"]\n").unwrap_err().to_string();
        assert!(e.contains("args may not contain -m"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A scratch directory with an nvmf_tgt stand-in, an SPDK config and a
    /// backing file; removed on drop.
    struct Scratch(std::path::PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn scratch(tag: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("nvmf-bench-spec-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nvmf_tgt"), "").unwrap();
        std::fs::write(dir.join("perf"), "").unwrap();
        std::fs::write(dir.join("backing.img"), "").unwrap();
        std::fs::write(dir.join("spdk.json"), SPDK_CONFIG).unwrap();
        std::fs::write(
            dir.join("wild.json"),
            SPDK_CONFIG.replace("127.0.0.1", "0.0.0.0"),
        )
        .unwrap();
        std::fs::write(
            dir.join("nolistener.json"),
            r#"{"subsystems": [{"subsystem": "nvmf", "config": []}]}"#,
        )
        .unwrap();
        Scratch(dir)
    }

    const SPDK_CONFIG: &str = r#"{"subsystems": [
      {"subsystem": "bdev", "config": [{"method": "bdev_null_create", "params": {"name": "Null0", "num_blocks": 2048, "block_size": 512}}]},
      {"subsystem": "nvmf", "config": [
        {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
        {"method": "nvmf_create_subsystem", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1", "allow_any_host": true}},
        {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1",
          "listen_address": {"trtype": "RDMA", "adrfam": "IPv4", "traddr": "10.9.9.9", "trsvcid": "4420"}}},
        {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1",
          "listen_address": {"trtype": "tcp", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4541"}}}
      ]}]}"#;

    #[test]
    fn spdk_and_kernel_targets_and_engine_fields() {
        let d = scratch("kinds");
        let text = "engine = \"spdk-perf\"\nspdk_perf = \"perf\"\n\
            [[target]]\nname = \"spdk\"\nkind = \"spdk\"\nbinary = \"nvmf_tgt\"\nconfig = \"spdk.json\"\ncores = \"0x5\"\nrpc_socket = \"/tmp/s.sock\"\nnsid = 2\n\
            [[target]]\nname = \"wild\"\nkind = \"spdk\"\nbinary = \"nvmf_tgt\"\nconfig = \"wild.json\"\naddr = \"127.0.0.2\"\ncores = [1, 3]\n\
            [[target]]\nname = \"list\"\nkind = \"spdk\"\nbinary = \"nvmf_tgt\"\nconfig = \"spdk.json\"\ncores = \"1-2,5\"\n\
            [[target]]\nname = \"linux\"\nkind = \"kernel\"\nbacking = \"backing.img\"\n\
            [[target]]\nname = \"linux2\"\nkind = \"kernel\"\nbacking = \"backing.img\"\naddr = \"::1\"\nport = 4542\nnqn = \"nqn.2024-01.x:y\"\n\
            [[workload]]\n";
        let s = BenchSpec::from_toml(text, &d.0, &[]).unwrap();
        assert_eq!(s.engine, EngineKind::SpdkPerf);
        assert_eq!(s.spdk_perf, Some(d.0.join("perf")));
        let TargetKind::Spdk(sp) = &s.targets[0].kind else {
            panic!()
        };
        assert_eq!(sp.binary, d.0.join("nvmf_tgt"));
        assert_eq!(sp.cores, Some(vec![0, 2]));
        assert_eq!(sp.rpc_socket, Some(PathBuf::from("/tmp/s.sock")));
        assert_eq!(
            sp.trid.to_string(),
            TransportId::tcp("127.0.0.1", "4541", "nqn.2016-06.io.spdk:cnode1").to_string()
        );
        assert_eq!(s.targets[0].addr(), "127.0.0.1");
        assert_eq!(s.targets[0].nsid, 2);
        // A wildcard listener is reached at addr.
        let TargetKind::Spdk(w) = &s.targets[1].kind else {
            panic!()
        };
        assert_eq!(
            (w.trid.traddr.as_str(), w.cores.clone()),
            ("127.0.0.2", Some(vec![1, 3]))
        );
        assert_eq!(s.targets[1].nsid, 1);
        let TargetKind::Spdk(l) = &s.targets[2].kind else {
            panic!()
        };
        assert_eq!(l.cores, Some(vec![1, 2, 5]));
        let TargetKind::Kernel(k) = &s.targets[3].kind else {
            panic!()
        };
        assert_eq!(
            (k.addr.as_str(), k.port, k.nqn.as_str(), &k.backing),
            (
                "127.0.0.1",
                4420,
                "nqn.2024-01.io.nvmfd:bench-linux",
                &d.0.join("backing.img")
            )
        );
        let TargetKind::Kernel(k) = &s.targets[4].kind else {
            panic!()
        };
        assert_eq!(
            (k.addr.as_str(), k.port, k.nqn.as_str()),
            ("::1", 4542, "nqn.2024-01.x:y")
        );
        assert_eq!(k.trid().trsvcid, "4542");

        // Defaults: nvmf-perf, nothing else; fio-kernel with devices; fio clients.
        let s = parse(&with_target("[[workload]]\n")).unwrap();
        assert_eq!(
            (s.engine, s.fio_engine.clone(), s.spdk_perf.clone()),
            (EngineKind::NvmfPerf, None, None)
        );
        assert!(s.clients.is_empty());
        assert_eq!(s.targets[0].nsid, 1);
        let s = parse(&format!(
            "engine = \"fio-kernel\"\nclients = [\"a\", \"b:8765\", \"[fe80::1]:9\", \"::1\"]\n\
             [[target]]\nname = \"t\"\nkind = \"trid\"\ntrid = \"{TRID} ns:3\"\ndevice = \"/dev/nvme1n1\"\n[[workload]]\n"
        ))
        .unwrap();
        assert_eq!(s.engine, EngineKind::FioKernel);
        assert_eq!(s.targets[0].device, Some(PathBuf::from("/dev/nvme1n1")));
        assert_eq!(s.targets[0].nsid, 3);
        let c: Vec<String> = s.clients.iter().map(|c| c.to_string()).collect();
        assert_eq!(c, ["a", "b:8765", "[fe80::1]:9", "::1"]);
        assert_eq!(s.clients[1].port, Some(8765));
        let s = BenchSpec::from_toml(
            &with_target("engine = \"fio\"\nfio_engine = \"perf\"\n[[workload]]\n"),
            &d.0,
            &[],
        )
        .unwrap();
        assert_eq!(s.fio_engine, Some(d.0.join("perf")));
    }

    #[test]
    fn impossible_engine_and_target_combinations() {
        let d = scratch("bad");
        let spdk = "[[target]]\nname = \"s\"\nkind = \"spdk\"\nbinary = \"nvmf_tgt\"\nconfig = \"spdk.json\"\n";
        let kern = "[[target]]\nname = \"k\"\nkind = \"kernel\"\nbacking = \"backing.img\"\n";
        let trid = format!("[[target]]\nname = \"t\"\nkind = \"trid\"\ntrid = \"{TRID}\"\n");
        let cases: Vec<(String, &[&str])> = vec![
            (format!("engine = \"dd\"\n{trid}"), &["engine = \"dd\"", "nvmf-perf, fio, fio-kernel, spdk-perf"]),
            (format!("clients = [\"a\"]\n{trid}"), &["clients", "fio", "not \"nvmf-perf\""]),
            (format!("engine = \"spdk-perf\"\nclients = [\"a\"]\n{trid}"), &["clients", "not \"spdk-perf\""]),
            (format!("engine = \"fio\"\nclients = []\n{trid}"), &["clients = []"]),
            (format!("engine = \"fio\"\nclients = [\"a:0\"]\n{trid}"), &["\"a:0\"", "port"]),
            (format!("engine = \"fio\"\nclients = [\"a b\"]\n{trid}"), &["\"a b\""]),
            (format!("engine = \"fio\"\nclients = [\"a\", \"a\"]\n{trid}"), &["\"a\"", "twice"]),
            (format!("fio_engine = \"perf\"\n{trid}"), &["fio_engine", "engine = \"fio\""]),
            (format!("engine = \"fio\"\nfio_engine = \"nope.so\"\n{trid}"), &["fio_engine", "nope.so", "not a file"]),
            (format!("spdk_perf = \"perf\"\n{trid}"), &["spdk_perf", "engine = \"spdk-perf\""]),
            (format!("engine = \"spdk-perf\"\nspdk_perf = \"nope\"\n{trid}"), &["spdk_perf", "nope", "not a file"]),
            (format!("{trid}device = \"/dev/nvme1n1\"\n"), &["\"t\"", "device is for engine = \"fio-kernel\""]),
            (format!("engine = \"fio-kernel\"\n{trid}"), &["\"t\"", "fio-kernel\" needs device"]),
            (format!("{trid}nsid = 0\n"), &["nsid = 0", "1 to 4294967294"]),
            (format!("[[target]]\nname = \"t\"\nkind = \"trid\"\ntrid = \"{TRID} ns:2\"\nnsid = 3\n"), &["nsid = 3", "ns:2", "disagree"]),
            (format!("{trid}binary = \"nvmf_tgt\"\n"), &["binary is for kind = \"spdk\" or \"nvmfd\", not kind = \"trid\""]),
            (format!("{kern}config = \"spdk.json\"\n"), &["config is for kind = \"nvmfd\" or \"spdk\", not kind = \"kernel\""]),
            (format!("{spdk}backing = \"backing.img\"\n"), &["backing is for kind = \"kernel\""]),
            (format!("{spdk}port = 1\n"), &["port is for kind = \"kernel\""]),
            (format!("{spdk}nqn = \"nqn.x\"\n"), &["nqn is for kind = \"kernel\""]),
            (format!("{kern}cores = \"0x1\"\n"), &["cores is for kind = \"spdk\""]),
            (format!("{kern}rpc_socket = \"/tmp/x\"\n"), &["rpc_socket is for kind = \"spdk\""]),
            ("[[target]]\nname = \"s\"\nkind = \"spdk\"\nbinary = \"nvmf_tgt\"\n".into(), &["needs config", "--json"]),
            ("[[target]]\nname = \"s\"\nkind = \"spdk\"\nbinary = \"gone\"\nconfig = \"spdk.json\"\n".into(), &["binary", "gone", "not a file"]),
            ("[[target]]\nname = \"s\"\nkind = \"spdk\"\nbinary = \"nvmf_tgt\"\nconfig = \"nolistener.json\"\n".into(), &["nolistener.json", "no TCP listener"]),
            ("[[target]]\nname = \"s\"\nkind = \"spdk\"\nbinary = \"nvmf_tgt\"\nconfig = \"backing.img\"\n".into(), &["backing.img", "not JSON"]),
            (format!("{spdk}addr = \"10.0.0.1\"\n"), &["addr \"10.0.0.1\" differs", "127.0.0.1"]),
            (format!("{spdk}cores = \"0xZ\"\n"), &["cores = \"0xZ\"", "hex mask"]),
            (format!("{spdk}cores = []\n"), &["cores = []", "no CPU"]),
            (format!("{spdk}cores = \"3-1\"\n"), &["cores", "3-1"]),
            (format!("{spdk}cores = 7\n"), &["cores = 7", "a list [0, 1]"]),
            ("[[target]]\nname = \"k\"\nkind = \"kernel\"\nbacking = \"gone.img\"\n".into(), &["backing", "gone.img", "does not exist"]),
            (format!("{kern}port = 70000\n"), &["port = 70000", "1 to 65535"]),
            (format!("{kern}nqn = \"bad nqn\"\n"), &["nqn \"bad nqn\"", "qualified name"]),
            (format!("{kern}addr = \"host\"\n"), &["addr \"host\"", "IP address"]),
        ];
        for (t, words) in &cases {
            let e = BenchSpec::from_toml(&format!("{t}[[workload]]\n"), &d.0, &[])
                .unwrap_err()
                .0;
            for x in *words {
                assert!(e.contains(x), "error for {t:?} lacks {x:?}: {e}");
            }
        }
    }

    #[test]
    fn spdk_listener_from_a_config() {
        let t = spdk_config_listener(SPDK_CONFIG).unwrap();
        assert_eq!(
            (t.traddr.as_str(), t.trsvcid.as_str(), t.subnqn.as_str()),
            ("127.0.0.1", "4541", "nqn.2016-06.io.spdk:cnode1")
        );
        assert!(spdk_config_listener("{}")
            .unwrap_err()
            .contains("subsystems"));
        assert!(spdk_config_listener("[").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn env_expansion_in_paths() {
        let get = |k: &str| match k {
            "SPDK" => Some("/opt/spdk".to_string()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let x = |p: &str| expand_env_with("binary", p, get);
        assert_eq!(
            x("${SPDK}/build/bin/nvmf_tgt").unwrap(),
            "/opt/spdk/build/bin/nvmf_tgt"
        );
        assert_eq!(x("a${SPDK}b${SPDK}").unwrap(), "a/opt/spdkb/opt/spdk");
        assert_eq!(x("plain/$path").unwrap(), "plain/$path");
        let e = x("${NOPE}/x").unwrap_err().0;
        assert!(e.contains("environment variable NOPE is not set"), "{e}");
        assert!(x("${EMPTY}/x").unwrap_err().0.contains("EMPTY is not set"));
        assert!(x("${SPDK").unwrap_err().0.contains("without a closing"));
    }
}
