//! kernel_host/doctor.rs — `nvmf doctor`: checks of a Linux NVMe-oF host, each finding with a
//! severity and the command that fixes it. It reads only files (a sysfs tree, an /etc tree,
//! systemd unit directories) and asks one injected function for routes (`ip -j route get`),
//! so tests run it against a fake tree. Checks, in order: transport modules, native
//! multipath, host NQN and host ID, boot-time autoconnect, and per subsystem: I/O policy,
//! each controller's state, keep-alive and loss timeouts, the MTU and NUMA node of the
//! interfaces its paths leave by, and each namespace path's ANA state.

use super::{controllers, subsystems, uuid_of_hostnqn, HostIdentity, KController};
use crate::kernel_host::persist;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// How bad a finding is. `Error` makes `nvmf doctor` exit 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Ok,
    Info,
    Warning,
    Error,
}

impl Severity {
    pub fn label(self) -> &'static str {
        match self {
            Severity::Ok => "OK",
            Severity::Info => "INFO",
            Severity::Warning => "WARN",
            Severity::Error => "ERROR",
        }
    }
}

/// One finding: which check, about what, what it found, and the command that fixes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub severity: Severity,
    /// What it is about: a module, a file, `nvme-subsys0`, `nvme1`, `eth0`, `nvme0c1n1`.
    pub subject: String,
    pub message: String,
    /// A shell command that fixes it (or, where only the target can, shows or changes it there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    /// The one-line text form: `SEVERITY check subject: message [fix: command]`.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{:<5} {:<11} {}: {}",
            self.severity.label(),
            self.check,
            self.subject,
            self.message
        );
        if let Some(f) = &self.fix {
            s.push_str(&format!("  [fix: {f}]"));
        }
        s
    }
}

/// Finds the interface a packet to `dst` (from `src`, when given) leaves by, or says why not.
pub type RouteFn<'a> = &'a dyn Fn(&str, Option<&str>) -> Result<String, String>;

/// Where doctor looks.
pub struct Env<'a> {
    /// The sysfs root (`/sys`).
    pub sysfs: PathBuf,
    /// The /etc root (`/etc`).
    pub etc: PathBuf,
    /// Directories with systemd units, searched in order after `<etc>/systemd/system`
    /// (`/lib/systemd/system`, `/usr/lib/systemd/system`).
    pub unit_dirs: Vec<PathBuf>,
    /// The interface a packet to `dst` (from `src`, when given) leaves by, or why not.
    pub route: RouteFn<'a>,
}

/// Runs every check.
pub fn run(env: &Env) -> Vec<Finding> {
    let mut out = Vec::new();
    check_modules(env, &mut out);
    check_multipath(env, &mut out);
    check_host_identity(env, &mut out);
    check_autoconnect(env, &mut out);
    let ctrls = controllers(&env.sysfs);
    check_subsystems(env, &ctrls, &mut out);
    out
}

/// Errors in `findings`.
pub fn errors(findings: &[Finding]) -> usize {
    findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count()
}

fn push(
    out: &mut Vec<Finding>,
    check: &'static str,
    severity: Severity,
    subject: impl Into<String>,
    message: impl Into<String>,
    fix: Option<String>,
) {
    out.push(Finding {
        check,
        severity,
        subject: subject.into(),
        message: message.into(),
        fix,
    });
}

fn check_modules(env: &Env, out: &mut Vec<Finding>) {
    let has_rdma_device = std::fs::read_dir(env.sysfs.join("class/infiniband"))
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    for (module, name, missing, why) in [
        (
            "nvme_fabrics",
            "nvme-fabrics",
            Severity::Error,
            "the kernel cannot connect to any NVMe-oF target (/dev/nvme-fabrics is missing)",
        ),
        (
            "nvme_tcp",
            "nvme-tcp",
            Severity::Warning,
            "NVMe/TCP connects fail until it is loaded",
        ),
        (
            "nvme_rdma",
            "nvme-rdma",
            if has_rdma_device {
                Severity::Warning
            } else {
                Severity::Info
            },
            if has_rdma_device {
                "this host has an RDMA device, but NVMe/RDMA connects fail until it is loaded"
            } else {
                "needed only for NVMe/RDMA (this host has no RDMA device)"
            },
        ),
    ] {
        if env.sysfs.join("module").join(module).is_dir() {
            push(out, "module", Severity::Ok, module, "loaded", None);
        } else {
            let etc = env.etc.display();
            push(
                out,
                "module",
                missing,
                module,
                format!("not loaded: {why}"),
                Some(format!(
                    "modprobe {name} && echo {name} > {etc}/modules-load.d/{name}.conf"
                )),
            );
        }
    }
}

fn check_multipath(env: &Env, out: &mut Vec<Finding>) {
    let p = env.sysfs.join("module/nvme_core/parameters/multipath");
    match super::attr(p.parent().unwrap_or(&p), "multipath").as_deref() {
        Some("Y") | Some("y") | Some("1") => push(
            out,
            "multipath",
            Severity::Ok,
            "nvme_core",
            "native NVMe multipath is on (one /dev/nvmeXnY per namespace over all its paths)",
            None,
        ),
        Some(v) => push(
            out,
            "multipath",
            Severity::Warning,
            "nvme_core",
            format!(
                "native NVMe multipath is off (multipath={v}): every path is its own block \
                 device and ANA states are not followed unless dm-multipath is set up"
            ),
            Some(format!(
                "echo 'options nvme_core multipath=Y' > {}/modprobe.d/nvme-multipath.conf && update-initramfs -u && reboot",
                env.etc.display()
            )),
        ),
        None => push(
            out,
            "multipath",
            Severity::Info,
            "nvme_core",
            format!("{} is missing (nvme_core not loaded)", p.display()),
            Some("modprobe nvme-core".into()),
        ),
    }
}

fn check_host_identity(env: &Env, out: &mut Vec<Finding>) {
    let nqn_path = env.etc.join("nvme/hostnqn");
    let id_path = env.etc.join("nvme/hostid");
    let id = HostIdentity::read(&env.etc);
    let from_nqn_fix = format!(
        "sed -n 's/.*:uuid://p' {} > {}",
        nqn_path.display(),
        id_path.display()
    );
    let nqn_uuid = id.hostnqn.as_deref().and_then(uuid_of_hostnqn);
    let hostid_fix = if nqn_uuid.is_some() {
        from_nqn_fix.clone()
    } else {
        format!("uuidgen > {}", id_path.display())
    };
    match &id.hostnqn {
        None => push(
            out,
            "hostnqn",
            Severity::Error,
            nqn_path.display().to_string(),
            "missing or empty: each connect would present a generated host NQN that can change, \
             and targets allow hosts by NQN",
            Some(format!("nvme gen-hostnqn > {}", nqn_path.display())),
        ),
        Some(n) if !n.starts_with("nqn.") || n.len() > 223 => push(
            out,
            "hostnqn",
            Severity::Error,
            nqn_path.display().to_string(),
            format!("'{n}' is not an NQN (nqn.yyyy-mm.reverse-domain:..., at most 223 bytes)"),
            Some(format!("nvme gen-hostnqn > {}", nqn_path.display())),
        ),
        Some(n) => push(
            out,
            "hostnqn",
            Severity::Ok,
            nqn_path.display().to_string(),
            n.clone(),
            None,
        ),
    }
    match &id.hostid {
        None => push(
            out,
            "hostid",
            Severity::Warning,
            id_path.display().to_string(),
            "missing or empty: the kernel then sends a host ID made up when nvme-fabrics loads, \
             which changes at every boot (reservations and per-host state on targets follow the host ID)",
            Some(hostid_fix),
        ),
        Some(h) if uuid::Uuid::try_parse(h).is_err() => push(
            out,
            "hostid",
            Severity::Error,
            id_path.display().to_string(),
            format!("'{h}' is not a UUID; the kernel refuses to connect with it"),
            Some(hostid_fix),
        ),
        Some(h) => match &nqn_uuid {
            Some(u) if !u.eq_ignore_ascii_case(h) => push(
                out,
                "hostid",
                Severity::Warning,
                id_path.display().to_string(),
                format!(
                    "{h} does not match the UUID in the host NQN ({u}): targets that key hosts \
                     by host ID see another host than the NQN says, and nvme-cli 2.5+ warns at \
                     every connect (Debian 12's nvme-cli package writes the two independently)"
                ),
                Some(from_nqn_fix),
            ),
            Some(_) => push(
                out,
                "hostid",
                Severity::Ok,
                id_path.display().to_string(),
                format!("{h} (matches the host NQN)"),
                None,
            ),
            None => push(
                out,
                "hostid",
                Severity::Ok,
                id_path.display().to_string(),
                format!("{h} (the host NQN has no UUID to compare with)"),
                None,
            ),
        },
    }
}

fn check_autoconnect(env: &Env, out: &mut Vec<Finding>) {
    const UNIT: &str = "nvmf-autoconnect.service";
    let conf = env.etc.join("nvme/discovery.conf");
    let json = env.etc.join("nvme/config.json");
    let (has_conf, has_json) = (conf.exists(), json.exists());
    // Debian ships a discovery.conf of comments only: entries are what count
    let conf_entries = std::fs::read_to_string(&conf)
        .map(|t| {
            t.lines()
                .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
                .count()
        })
        .unwrap_or(0);
    if conf_entries == 0 && !has_json {
        push(
            out,
            "autoconnect",
            Severity::Info,
            UNIT,
            format!(
                "nothing to restore at boot (no {} or {}; `nvmf connect --persist` writes them)",
                conf.display(),
                json.display()
            ),
            None,
        );
        return;
    }
    let mut dirs = vec![env.etc.join("systemd/system")];
    dirs.extend(env.unit_dirs.iter().cloned());
    let Some(unit) = dirs
        .iter()
        .map(|d| d.join(UNIT))
        .find_map(|p| std::fs::read_to_string(p).ok())
    else {
        push(
            out,
            "autoconnect",
            Severity::Warning,
            UNIT,
            "not installed: nothing runs `nvme connect-all` at boot, so recorded connections \
             are not restored",
            Some("apt install nvme-cli".into()),
        );
        return;
    };
    let enabled = std::fs::read_dir(env.etc.join("systemd/system"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".wants"))
        .any(|e| e.path().join(UNIT).exists() || e.path().join(UNIT).is_symlink());
    if !enabled {
        push(
            out,
            "autoconnect",
            Severity::Warning,
            UNIT,
            "not enabled: recorded connections are not restored at boot",
            Some(format!("systemctl enable {UNIT}")),
        );
    }
    if persist::autoconnect_unit_needs_both_missing(&unit)
        && !persist::autoconnect_dropin_resets_condition(&env.etc)
    {
        if has_conf && has_json {
            push(
                out,
                "autoconnect",
                Severity::Error,
                UNIT,
                format!(
                    "this nvme-cli's unit runs only while {} or {} is MISSING (fixed in nvme-cli \
                     2.5); with both present nothing is connected at boot",
                    conf.display(),
                    json.display()
                ),
                Some(persist::autoconnect_fix_command(&env.etc)),
            );
        } else {
            push(
                out,
                "autoconnect",
                Severity::Info,
                UNIT,
                "runs at boot now, but this nvme-cli's unit skips itself once both \
                 discovery.conf and config.json exist",
                Some(persist::autoconnect_fix_command(&env.etc)),
            );
        }
    } else if enabled {
        push(
            out,
            "autoconnect",
            Severity::Ok,
            UNIT,
            "enabled; restores the recorded connections at boot",
            None,
        );
    }
}

/// The command that reconnects `c` with other options (for keep-alive and loss timeouts).
fn reconnect_command(c: &KController, extra: &str) -> String {
    format!(
        "nvme disconnect -d {} && nvmf connect -t {} -a {} -s {} -n {}{}{}",
        c.name,
        c.transport,
        c.traddr.as_deref().unwrap_or("ADDR"),
        c.trsvcid.as_deref().unwrap_or("4420"),
        c.subsysnqn,
        c.host_traddr
            .as_deref()
            .filter(|_| c.transport == "rdma")
            .map(|h| format!(" --host-traddr {h}"))
            .unwrap_or_default(),
        extra
    )
}

fn check_subsystems(env: &Env, ctrls: &[KController], out: &mut Vec<Finding>) {
    let by_name: BTreeMap<&str, &KController> =
        ctrls.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut seen_ifaces = BTreeSet::new();
    for s in subsystems(&env.sysfs) {
        let members: Vec<&KController> = s
            .controllers
            .iter()
            .filter_map(|n| by_name.get(n.as_str()).copied())
            .filter(|c| c.is_fabrics())
            .collect();
        if members.is_empty() || s.nqn == crate::DISCOVERY_NQN {
            continue;
        }
        let subject = format!("{} ({})", s.name, s.nqn);
        // I/O policy
        match (members.len(), s.iopolicy.as_deref()) {
            (_, None) => {}
            (1, Some(p)) => push(
                out,
                "iopolicy",
                Severity::Ok,
                subject.clone(),
                format!("{p} (one path: the policy does not matter yet)"),
                None,
            ),
            (n, Some("numa")) => push(
                out,
                "iopolicy",
                Severity::Warning,
                subject.clone(),
                format!(
                    "numa with {n} paths: all I/O of a NUMA node goes down one path, the others \
                     stay idle until it fails. round-robin (or queue-depth on 6.11+) spreads I/O \
                     over every optimized path"
                ),
                Some(format!(
                    "echo round-robin > {} && echo 'ACTION==\"add|change\", SUBSYSTEM==\"nvme-subsystem\", ATTR{{subsysnqn}}==\"{}\", ATTR{{iopolicy}}=\"round-robin\"' >> {}/udev/rules.d/71-nvmf-iopolicy.rules",
                    s.dir.join("iopolicy").display(),
                    s.nqn,
                    env.etc.display()
                )),
            ),
            (n, Some(p)) => push(
                out,
                "iopolicy",
                Severity::Ok,
                subject.clone(),
                format!("{p}: I/O is spread over the {n} paths"),
                None,
            ),
        }
        for c in &members {
            check_controller(c, members.len(), out);
        }
        check_interfaces(env, &subject, &members, &mut seen_ifaces, out);
        check_ana(&subject, &members, out);
    }
}

fn check_controller(c: &KController, paths: usize, out: &mut Vec<Finding>) {
    let subject = format!("{} ({})", c.name, c.target());
    if c.state != "live" {
        push(
            out,
            "state",
            Severity::Warning,
            subject.clone(),
            format!(
                "state {}: this path carries no I/O",
                if c.state.is_empty() {
                    "unknown"
                } else {
                    &c.state
                }
            ),
            Some(format!(
                "dmesg | grep -w {}; ping -c 3 {}",
                c.name,
                c.traddr.as_deref().unwrap_or("ADDR")
            )),
        );
    }
    let kato = c.kato.as_deref().and_then(|k| k.parse::<u64>().ok());
    let loss = c.ctrl_loss_tmo.as_deref();
    let delay = c
        .reconnect_delay
        .as_deref()
        .and_then(|d| d.parse::<u64>().ok());
    let values = format!(
        "keep-alive {} s, ctrl_loss_tmo {}, reconnect_delay {} s",
        c.kato.as_deref().unwrap_or("?"),
        loss.map(|l| if l == "off" {
            "off (forever)".to_string()
        } else {
            format!("{l} s")
        })
        .unwrap_or_else(|| "?".into()),
        c.reconnect_delay.as_deref().unwrap_or("?")
    );
    if kato == Some(0) {
        push(
            out,
            "timeouts",
            Severity::Warning,
            subject,
            format!("{values}: without keep-alive a dead target or path is noticed only when I/O times out"),
            Some(reconnect_command(c, " --keep-alive-tmo 5")),
        );
        return;
    }
    let loss_s = loss.and_then(|l| l.parse::<u64>().ok());
    if let (Some(l), Some(d)) = (loss_s, delay) {
        if l < d {
            push(
                out,
                "timeouts",
                Severity::Warning,
                subject,
                format!("{values}: the controller is given up before its first reconnect"),
                Some(reconnect_command(
                    c,
                    &format!(" --ctrl-loss-tmo {}", d * 60),
                )),
            );
            return;
        }
    }
    let note = match (paths, loss_s) {
        (1, Some(l)) => format!(
            "{values}: the only path; a target away longer than {l} s fails the I/O waiting for it"
        ),
        _ => values,
    };
    push(
        out,
        "timeouts",
        if c.kato.is_none() {
            Severity::Info
        } else {
            Severity::Ok
        },
        subject,
        note,
        None,
    );
}

fn check_interfaces(
    env: &Env,
    subject: &str,
    members: &[&KController],
    seen: &mut BTreeSet<String>,
    out: &mut Vec<Finding>,
) {
    // interface -> (MTU, the controllers leaving by it)
    let mut ifaces: BTreeMap<String, (Option<u32>, Vec<String>)> = BTreeMap::new();
    for c in members {
        if !matches!(c.transport.as_str(), "tcp" | "rdma") {
            continue;
        }
        let Some(dst) = c.traddr.as_deref() else {
            continue;
        };
        let dev = match (env.route)(dst, c.host_traddr.as_deref()) {
            Ok(d) => d,
            Err(e) => {
                push(
                    out,
                    "route",
                    Severity::Warning,
                    format!("{} ({})", c.name, c.target()),
                    format!("no route to {dst}: {e}"),
                    Some(format!("ip route get {dst}")),
                );
                continue;
            }
        };
        let mtu = super::attr(&env.sysfs.join("class/net").join(&dev), "mtu")
            .and_then(|m| m.parse::<u32>().ok());
        ifaces
            .entry(dev)
            .or_insert((mtu, Vec::new()))
            .1
            .push(c.name.clone());
    }
    let mtus: BTreeSet<u32> = ifaces.values().filter_map(|(m, _)| *m).collect();
    let list = ifaces
        .iter()
        .map(|(d, (m, cs))| {
            format!(
                "{d} MTU {} ({})",
                m.map_or("?".to_string(), |m| m.to_string()),
                cs.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    if mtus.len() > 1 {
        let max = *mtus.iter().max().unwrap_or(&1500);
        let fix = ifaces
            .iter()
            .filter(|(_, (m, _))| m.is_some_and(|m| m < max))
            .map(|(d, _)| format!("ip link set dev {d} mtu {max}"))
            .collect::<Vec<_>>()
            .join(" && ");
        push(
            out,
            "mtu",
            Severity::Warning,
            subject.to_string(),
            format!(
                "the paths leave by interfaces with different MTUs: {list}. Paths then differ in \
                 throughput and a failover changes it; make them equal (the switch ports too)"
            ),
            Some(fix),
        );
    } else if !ifaces.is_empty() {
        push(out, "mtu", Severity::Ok, subject.to_string(), list, None);
    }
    for dev in ifaces.keys() {
        if !seen.insert(dev.clone()) {
            continue;
        }
        let node = super::attr(
            &env.sysfs.join("class/net").join(dev).join("device"),
            "numa_node",
        );
        let msg = match node.as_deref() {
            Some("-1") => {
                "NUMA node -1 (the machine has one node, or the firmware does not say)".to_string()
            }
            Some(n) => format!(
                "NUMA node {n}: I/O submitted from CPUs of node {n} avoids a cross-node hop \
                 (`nvmf bench plan` places load so)"
            ),
            None => "no NUMA node (a virtual interface, or no PCI device)".to_string(),
        };
        push(out, "numa", Severity::Info, dev.clone(), msg, None);
    }
}

/// `(subsystem instance, head instance)` of a path name `nvmeXcYnZ`: the namespace it is a
/// path of (`/dev/nvmeXnZ`).
fn head_of(path: &str) -> Option<(String, String)> {
    let r = path.strip_prefix("nvme")?;
    let (x, rest) = r.split_once('c')?;
    let (_, z) = rest.split_once('n')?;
    Some((x.to_string(), z.to_string()))
}

fn check_ana(subject: &str, members: &[&KController], out: &mut Vec<Finding>) {
    // namespace head -> [(path, controller, state, group)]
    type PathRow<'a> = (&'a str, &'a KController, &'a str, Option<&'a str>);
    let mut heads: BTreeMap<(String, String), Vec<PathRow>> = BTreeMap::new();
    for c in members {
        for p in &c.paths {
            let (Some(state), Some(head)) = (p.ana_state.as_deref(), head_of(&p.name)) else {
                continue;
            };
            heads.entry(head).or_default().push((
                p.name.as_str(),
                c,
                state,
                p.ana_grpid.as_deref(),
            ));
        }
    }
    for ((x, z), paths) in heads {
        let usable = paths
            .iter()
            .filter(|(_, _, s, _)| matches!(*s, "optimized" | "non-optimized"))
            .count();
        let dev = format!("/dev/nvme{x}n{z}");
        for (name, c, state, grp) in &paths {
            if matches!(*state, "optimized" | "non-optimized") {
                push(
                    out,
                    "ana",
                    Severity::Ok,
                    format!("{name} ({})", c.target()),
                    format!("{state} (a path of {dev})"),
                    None,
                );
                continue;
            }
            let fix = format!(
                "nvmf rpc nvmf_subsystem_listener_set_ana_state {} -n optimized -t {} -a {} -s {}{}   # on the target, if it is nvmfd or SPDK; or: nvme ana-log /dev/{}",
                c.subsysnqn,
                c.transport,
                c.traddr.as_deref().unwrap_or("ADDR"),
                c.trsvcid.as_deref().unwrap_or("4420"),
                grp.map(|g| format!(" -g {g}")).unwrap_or_default(),
                c.name
            );
            push(
                out,
                "ana",
                if usable == 0 {
                    Severity::Error
                } else {
                    Severity::Warning
                },
                format!("{name} ({})", c.target()),
                if usable == 0 {
                    format!("{state}: {dev} of {subject} has no optimized or non-optimized path, its I/O waits or fails")
                } else {
                    format!(
                        "{state}: this path of {dev} carries no I/O ({usable} other path(s) do)"
                    )
                },
                Some(fix),
            );
        }
    }
}

/// `ip -j route get DST [from SRC]` answered as JSON: the `dev` of its first route.
pub fn parse_route_json(text: &str) -> Result<String, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("unexpected `ip -j` output: {e}"))?;
    v.get(0)
        .and_then(|r| r.get("dev"))
        .and_then(|d| d.as_str())
        .map(str::to_string)
        .ok_or_else(|| "no dev in `ip -j route get` output".to_string())
}

/// The interface `ip` (the program `ip_cmd`) routes `dst` by: with `from src` first (the
/// path's own source address), then without it.
pub fn ip_route_dev(ip_cmd: &Path, dst: &str, src: Option<&str>) -> Result<String, String> {
    let run = |from: Option<&str>| -> Result<String, String> {
        let mut cmd = std::process::Command::new(ip_cmd);
        cmd.args(["-j", "route", "get", dst]);
        if let Some(s) = from {
            cmd.args(["from", s]);
        }
        let o = cmd
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", ip_cmd.display()))?;
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
        }
        parse_route_json(&String::from_utf8_lossy(&o.stdout))
    };
    match src {
        Some(s) => run(Some(s)).or_else(|_| run(None)),
        None => run(None),
    }
}

/// The default systemd unit directories doctor searches after `<etc>/systemd/system`.
pub fn default_unit_dirs() -> Vec<PathBuf> {
    vec![
        Path::new("/lib/systemd/system").to_path_buf(),
        Path::new("/usr/lib/systemd/system").to_path_buf(),
    ]
}
