//! The bench spec: what `nvmf bench` measures, read from a TOML file or
//! taken from a built-in preset, checked field by field.
//!
//! ```toml
//! repetitions = 3                 # rounds of the whole matrix (default 3)
//! baseline = "nvmfd"              # a target name or a cell "target/workload" (optional)
//! goal = { iops = 10000 }         # per client: iops or mibps (optional)
//!
//! [[target]]
//! name = "nvmfd"
//! kind = "nvmfd"                  # the harness starts it from `config` (relative to this file)
//! config = "nvmfd.json"
//! addr = "127.0.0.1"              # where it listens (default 127.0.0.1)
//!
//! [[target]]
//! name = "other"
//! kind = "trid"                   # an already running target, any vendor
//! trid = "trtype:TCP traddr:10.0.0.2 trsvcid:4420 subnqn:nqn.2016-06.io.spdk:cnode1"
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
}

/// What a run is measured against.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub name: String,
    pub kind: TargetKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum TargetKind {
    /// An nvmfd the harness starts from `config` and stops; it listens on `addr`.
    Nvmfd { config: PathBuf, addr: String },
    /// An already running target, reached by this transport ID.
    Trid(TransportId),
}

impl Target {
    /// The address the initiator connects to (for placement).
    pub fn addr(&self) -> &str {
        match &self.kind {
            TargetKind::Nvmfd { addr, .. } => addr,
            TargetKind::Trid(t) => &t.traddr,
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
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: Option<String>,
    kind: Option<String>,
    config: Option<String>,
    addr: Option<String>,
    trid: Option<String>,
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
                "bench spec: no target: add a [[target]] (kind = \"nvmfd\" or \"trid\") or give --target TRID",
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
        Ok(BenchSpec {
            targets,
            workloads,
            repetitions,
            baseline: raw.baseline,
            goal,
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

const KINDS: &str = "nvmfd, trid (spdk and kernel: planned, not supported yet)";

fn check_target(i: usize, t: RawTarget, base_dir: &Path) -> Result<Target, SpecError> {
    let ctx = match &t.name {
        Some(n) => format!("[[target]] \"{n}\""),
        None => format!("[[target]] #{}", i + 1),
    };
    let Some(name) = t.name else {
        return err(format!("{ctx}: name is missing"));
    };
    check_name(&ctx, &name)?;
    let Some(kind) = t.kind else {
        return err(format!("{ctx}: kind is missing (one of {KINDS})"));
    };
    let kind = match kind.as_str() {
        "nvmfd" => {
            if t.trid.is_some() {
                return err(format!(
                    "{ctx}: trid is for kind = \"trid\"; an nvmfd target takes config (and addr)"
                ));
            }
            let Some(config) = t.config else {
                return err(format!(
                    "{ctx}: kind = \"nvmfd\" needs config = \"PATH\" (nvmfd's JSON config)"
                ));
            };
            let config = base_dir.join(config);
            if !config.is_file() {
                return err(format!(
                    "{ctx}: config \"{}\" is not a file",
                    config.display()
                ));
            }
            let addr = t.addr.unwrap_or_else(|| DEFAULT_NVMFD_ADDR.to_string());
            if addr.parse::<std::net::IpAddr>().is_err() {
                return err(format!("{ctx}: addr \"{addr}\" is not an IP address"));
            }
            TargetKind::Nvmfd { config, addr }
        }
        "trid" => {
            if t.config.is_some() || t.addr.is_some() {
                return err(format!(
                    "{ctx}: config and addr are for kind = \"nvmfd\"; a trid target takes trid only"
                ));
            }
            let Some(s) = t.trid else {
                return err(format!(
                    "{ctx}: kind = \"trid\" needs trid = \"trtype:TCP traddr:ADDR trsvcid:PORT subnqn:NQN\""
                ));
            };
            TargetKind::Trid(parse_trid(&ctx, &s)?)
        }
        "spdk" | "kernel" => {
            return err(format!(
                "{ctx}: kind = \"{kind}\" is not supported yet (supported now: nvmfd, trid)"
            ))
        }
        other => return err(format!("{ctx}: kind = \"{other}\" is not one of {KINDS}")),
    };
    Ok(Target { name, kind })
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
    Ok(Target {
        name: format!("target{}", n + 1),
        kind: TargetKind::Trid(parse_trid(&ctx, s)?),
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
            ("[[target]]\nname = \"s\"\nkind = \"spdk\"\n", &["kind = \"spdk\" is not supported yet (supported now: nvmfd, trid)"]),
            ("[[target]]\nname = \"k\"\nkind = \"kernel\"\n", &["kernel", "not supported yet"]),
            ("[[target]]\nname = \"x\"\nkind = \"magic\"\n", &["magic", "nvmfd, trid"]),
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
                addr: "127.0.0.1".into()
            }
        );
        assert_eq!(s.targets[1].name, "target2");
        assert_eq!(s.goal, Some(Goal::Iops(10000.0)));
        assert_eq!(s.baseline.as_deref(), Some("n/w"));
    }
}
