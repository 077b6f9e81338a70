//! kernel_host/cli.rs — the `nvmf connect`, `nvmf connect-all` and `nvmf doctor` commands:
//! their clap arguments, help texts and what they run (the binary nvmf.rs only dispatches).
//! `connect` and `connect-all` drive the Linux kernel host through /dev/nvme-fabrics, the way
//! nvme-cli does; discovery for `connect-all` is nvmf's own user-space initiator.

use super::doctor::{self, Env, Severity};
use super::fabrics::{kernel_connect, ConnectParams};
use super::persist::{self, DiscoveryRecord, PortRecord};
use super::{controllers, HostIdentity};
use crate::{ConnectOptions, Controller, TransportId, DISCOVERY_NQN};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub const CONNECT_HELP: &str = "\
Connects the LINUX KERNEL host (not nvmf's user-space initiator): writes the option string
nvme-cli writes to /dev/nvme-fabrics and prints the controller the kernel made (nvmeN); its
namespaces appear as /dev/nvmeXnY. Needs root and the nvme-tcp (or nvme-rdma) module.
A controller already connected to the same subsystem, address and port is reported, not
duplicated. The host NQN and host ID default to /etc/nvme/hostnqn and /etc/nvme/hostid,
as with nvme-cli; ctrl-loss-tmo defaults to nvme-cli's 600 s.

--persist records the connection in /etc/nvme/config.json (libnvme's format: hosts ->
subsystems -> ports), merged with what is there. At boot, nvmf-autoconnect.service runs
`nvme connect-all`, which asks the discovery controller at each recorded address and port
and connects what it lists for this host. nvme-cli uses the host of /etc/nvme/hostnqn there.

Examples:
  nvmf connect -t tcp -a 10.0.0.1 -n nqn.2016-06.io.spdk:cnode1
  nvmf connect -t tcp -a 10.0.0.1 -s 4420 -n nqn.2016-06.io.spdk:cnode1 --persist
  nvmf connect -a 10.0.0.2 -n NQN --ctrl-loss-tmo -1 --keep-alive-tmo 5 --nr-io-queues 8
  nvmf connect -a 10.0.0.1 -n NQN --dry-run          # print the option string only
  nvme disconnect -n NQN                              # undo (nvme-cli)";

pub const CONNECT_ALL_HELP: &str = "\
Reads the discovery log at ADDR:PORT (with nvmf's user-space initiator) and connects the LINUX
KERNEL host to every NVM subsystem entry of the same transport, as `nvme connect-all` does.
Entries already connected are skipped; referrals to other discovery controllers are listed,
not followed. Exit status 1 when any connect failed.

--persist adds the discovery controller to /etc/nvme/discovery.conf (one line of connect-all
arguments, e.g. `--transport=tcp --traddr=10.0.0.1 --trsvcid=4420`); at boot
nvmf-autoconnect.service runs `nvme connect-all`, which reads the line and connects
everything that discovery controller then lists. An existing line for the same address and
port is updated in place (its other options kept), never duplicated.

Examples:
  nvmf connect-all -t tcp -a 10.0.0.1 -s 8009
  nvmf connect-all -a 10.0.0.1 -s 4420 --persist --ctrl-loss-tmo -1
  nvmf connect-all -a 10.0.0.1 --dry-run              # show what would be connected";

pub const DOCTOR_HELP: &str = "\
Checks this host as an NVMe-oF host of the Linux kernel and prints one finding per line:
severity (OK, INFO, WARN, ERROR), check, subject, what was found, and [fix: the command].

Checks: nvme-fabrics / nvme-tcp / nvme-rdma loaded; native multipath
(nvme_core multipath=Y); /etc/nvme/hostnqn and /etc/nvme/hostid present, well-formed and
consistent (a uuid host NQN must carry the host ID); nvmf-autoconnect.service able to
restore recorded connections; per subsystem: its iopolicy (round-robin recommended with
several paths: numa sends all I/O of a NUMA node down one path), each controller's state,
keep-alive, ctrl_loss_tmo and reconnect_delay; the interface each path leaves by (`ip -j
route get`), their MTUs (should be equal) and NUMA nodes; each path's ANA state (anything
but optimized / non-optimized is flagged; an error when a namespace has no usable path).

Exit status: 0 when no finding is an error, 1 otherwise.

Examples:
  nvmf doctor
  nvmf doctor --json | jq '.findings[] | select(.severity != \"ok\")'
  nvmf doctor --sysfs-root /srv/capture/sys --etc-root /srv/capture/etc   # a copied tree";

fn parse_transport(s: &str) -> std::result::Result<String, String> {
    let t = s.to_ascii_lowercase();
    match t.as_str() {
        "tcp" | "rdma" => Ok(t),
        _ => Err(format!(
            "'{s}' is not a transport the kernel host connects over here (tcp, rdma)"
        )),
    }
}

/// Options shared by `connect` and `connect-all`.
#[derive(Args, Debug, Clone)]
pub struct KernelConnOpts {
    /// Host NQN (default: the first line of CONFIG_DIR/hostnqn, as nvme-cli)
    #[arg(short = 'q', long, value_name = "NQN")]
    pub hostnqn: Option<String>,
    /// Host ID, a UUID (default: CONFIG_DIR/hostid; none when missing, as nvme-cli)
    #[arg(short = 'I', long, value_name = "UUID")]
    pub hostid: Option<String>,
    /// Source address of the connection (host_traddr)
    #[arg(short = 'w', long, value_name = "ADDR")]
    pub host_traddr: Option<String>,
    /// Network interface to connect from (host_iface, NVMe/TCP)
    #[arg(short = 'f', long, value_name = "IFACE")]
    pub host_iface: Option<String>,
    /// Seconds to keep reconnecting a lost controller before failing its I/O; -1 = forever
    /// (default 600, as nvme-cli)
    #[arg(
        short = 'l',
        long,
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub ctrl_loss_tmo: Option<i32>,
    /// Keep-alive timeout in seconds (default: the kernel's, 5 s on recent kernels)
    #[arg(short = 'k', long, value_name = "SECONDS")]
    pub keep_alive_tmo: Option<u32>,
    /// Seconds between reconnect attempts (default: the kernel's, 10)
    #[arg(short = 'c', long, value_name = "SECONDS")]
    pub reconnect_delay: Option<u32>,
    /// Number of I/O queues (default: the kernel's, one per CPU)
    #[arg(short = 'i', long, value_name = "N")]
    pub nr_io_queues: Option<u32>,
    /// Record what was connected for nvme-cli's boot-time `nvme connect-all`
    #[arg(long)]
    pub persist: bool,
    /// Where hostnqn, hostid and the --persist files are
    #[arg(long, value_name = "DIR", default_value = "/etc/nvme")]
    pub config_dir: PathBuf,
    /// Print the option strings (and what --persist would record); connect nothing, write nothing
    #[arg(long)]
    pub dry_run: bool,
    /// The kernel's fabrics device (tests)
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/dev/nvme-fabrics",
        hide = true
    )]
    pub fabrics_dev: PathBuf,
    /// The sysfs root, to find controllers already connected (tests)
    #[arg(long, value_name = "DIR", default_value = "/sys", hide = true)]
    pub sysfs_root: PathBuf,
}

impl KernelConnOpts {
    /// Host NQN and ID: the options, else the files. A host NQN is required.
    fn identity(&self) -> Result<(String, Option<String>)> {
        let files = HostIdentity::read_config_dir(&self.config_dir);
        let nqn = match (&self.hostnqn, files.hostnqn) {
            (Some(n), _) => n.clone(),
            (None, Some(n)) => n,
            (None, None) => bail!(
                "no host NQN: {} is missing or empty; create it with `nvme gen-hostnqn > {}` \
                 (and its host ID: `sed -n 's/.*:uuid://p' {} > {}`) or give --hostnqn",
                self.config_dir.join("hostnqn").display(),
                self.config_dir.join("hostnqn").display(),
                self.config_dir.join("hostnqn").display(),
                self.config_dir.join("hostid").display(),
            ),
        };
        let id = self.hostid.clone().or(files.hostid);
        Ok((nqn, id))
    }

    fn params(
        &self,
        transport: &str,
        traddr: &str,
        trsvcid: &str,
        nqn: &str,
    ) -> Result<ConnectParams> {
        let (hostnqn, hostid) = self.identity()?;
        let p = ConnectParams {
            transport: transport.to_string(),
            traddr: traddr.to_string(),
            trsvcid: trsvcid.to_string(),
            nqn: nqn.to_string(),
            hostnqn: Some(hostnqn),
            hostid,
            host_traddr: self.host_traddr.clone(),
            host_iface: self.host_iface.clone(),
            nr_io_queues: self.nr_io_queues,
            keep_alive_tmo: self.keep_alive_tmo,
            reconnect_delay: self.reconnect_delay,
            ctrl_loss_tmo: self.ctrl_loss_tmo,
        };
        p.validate()?;
        Ok(p)
    }

    /// Connects `p` unless a live controller already goes there; the controller's name and
    /// whether it is new. With --dry-run: prints the option string.
    fn connect_one(&self, p: &ConnectParams) -> Result<Option<(String, bool)>> {
        if let Some(c) = controllers(&self.sysfs_root)
            .into_iter()
            .find(|c| p.matches(c))
        {
            return Ok(Some((c.name, false)));
        }
        let opts = p.option_string();
        if self.dry_run {
            println!("would write to {}: {opts}", self.fabrics_dev.display());
            return Ok(None);
        }
        kernel_connect(&self.fabrics_dev, &opts).map(|n| Some((n, true)))
    }

    /// After --persist: warns when nvme-cli's boot-time connect will not use what was recorded.
    fn warn_autoconnect(&self, hostnqn: &str) {
        let files = HostIdentity::read_config_dir(&self.config_dir);
        if files.hostnqn.as_deref().is_some_and(|f| f != hostnqn) {
            eprintln!(
                "nvmf: warning: recorded under host {hostnqn}, but `nvme connect-all` at boot \
                 connects as the host in {} ({}); it will not restore this",
                self.config_dir.join("hostnqn").display(),
                files.hostnqn.unwrap_or_default()
            );
        }
        let both = self.config_dir.join("config.json").exists()
            && self.config_dir.join("discovery.conf").exists();
        let etc = self.config_dir.parent().unwrap_or(Path::new("/etc"));
        let mut dirs = vec![etc.join("systemd/system")];
        dirs.extend(doctor::default_unit_dirs());
        let unit = dirs
            .iter()
            .find_map(|d| std::fs::read_to_string(d.join("nvmf-autoconnect.service")).ok());
        if both
            && unit.is_some_and(|u| persist::autoconnect_unit_needs_both_missing(&u))
            && !persist::autoconnect_dropin_resets_condition(etc)
        {
            eprintln!(
                "nvmf: warning: this nvme-cli's nvmf-autoconnect.service skips itself when both \
                 discovery.conf and config.json exist, so nothing is restored at boot; fix: {}",
                persist::autoconnect_fix_command(etc)
            );
        }
    }
}

/// `nvmf connect`.
#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Transport: tcp or rdma
    #[arg(short = 't', long, default_value = "tcp", value_parser = parse_transport)]
    pub transport: String,
    /// Target address
    #[arg(short = 'a', long, value_name = "ADDR")]
    pub traddr: String,
    /// Target port
    #[arg(short = 's', long, default_value = "4420", value_name = "PORT")]
    pub trsvcid: String,
    /// Subsystem NQN
    #[arg(short = 'n', long, value_name = "NQN")]
    pub nqn: String,
    #[command(flatten)]
    pub opts: KernelConnOpts,
}

/// `nvmf connect-all`.
#[derive(Args, Debug, Clone)]
pub struct ConnectAllArgs {
    /// Transport: tcp or rdma
    #[arg(short = 't', long, default_value = "tcp", value_parser = parse_transport)]
    pub transport: String,
    /// Discovery controller address
    #[arg(short = 'a', long, value_name = "ADDR")]
    pub traddr: String,
    /// Discovery controller port (nvme-cli's default for NVMe/TCP is 8009; nvmfd answers
    /// discovery on every listener)
    #[arg(short = 's', long, default_value = "4420", value_name = "PORT")]
    pub trsvcid: String,
    /// Seconds to wait for the discovery controller
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub timeout: u64,
    #[command(flatten)]
    pub opts: KernelConnOpts,
}

pub fn connect(a: ConnectArgs) -> Result<ExitCode> {
    if a.nqn == DISCOVERY_NQN {
        bail!("{DISCOVERY_NQN} is the discovery NQN: use `nvmf connect-all` (or `nvmf discover`)");
    }
    let p = a.opts.params(&a.transport, &a.traddr, &a.trsvcid, &a.nqn)?;
    let record = PortRecord {
        hostnqn: p.hostnqn.clone().unwrap_or_default(),
        hostid: p.hostid.clone(),
        nqn: p.nqn.clone(),
        transport: p.transport.clone(),
        traddr: p.traddr.clone(),
        trsvcid: p.trsvcid.clone(),
        host_traddr: p.host_traddr.clone(),
        host_iface: p.host_iface.clone(),
        nr_io_queues: p.nr_io_queues,
        keep_alive_tmo: p.keep_alive_tmo,
        reconnect_delay: p.reconnect_delay,
        ctrl_loss_tmo: p.ctrl_loss_tmo,
    };
    // a file --persist cannot merge into stops us before the kernel connects
    let planned = if a.opts.persist {
        let path = a.opts.config_dir.join("config.json");
        Some(persist::plan(&path, |old| {
            persist::merge_config_json(old, &record)
        })?)
    } else {
        None
    };
    match a.opts.connect_one(&p)? {
        Some((name, true)) => println!(
            "{name}: connected to {} at {} {}:{}",
            p.nqn, p.transport, p.traddr, p.trsvcid
        ),
        Some((name, false)) => println!(
            "{name}: already connected to {} at {} {}:{} (nothing done)",
            p.nqn, p.transport, p.traddr, p.trsvcid
        ),
        None => {}
    }
    if let Some((path, text, outcome)) = planned {
        if a.opts.dry_run {
            println!("would write {} ({outcome:?}):\n{text}", path.display());
        } else {
            let (path, outcome) = persist::record_port(&a.opts.config_dir, &record)?;
            println!("persist: {} {}", outcome.describe(), path.display());
            a.opts.warn_autoconnect(&record.hostnqn);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn connect_all(a: ConnectAllArgs) -> Result<ExitCode> {
    // the checks of a connect, on the discovery controller's own address
    let disc = a
        .opts
        .params(&a.transport, &a.traddr, &a.trsvcid, DISCOVERY_NQN)?;
    let mut trid = TransportId::tcp(&a.traddr, &a.trsvcid, DISCOVERY_NQN);
    if a.transport == "rdma" {
        trid.trtype = crate::trid::TrType::Rdma;
    }
    let hostnqn = disc.hostnqn.clone().unwrap_or_default();
    let mut o = ConnectOptions::new(trid).with_hostnqn(&hostnqn);
    if let Some(id) = disc
        .hostid
        .as_deref()
        .and_then(|i| uuid::Uuid::try_parse(i).ok())
    {
        o.hostid = *id.as_bytes();
    }
    o.timeout = std::time::Duration::from_secs(a.timeout.max(1));
    let record = DiscoveryRecord {
        transport: a.transport.clone(),
        traddr: a.traddr.clone(),
        trsvcid: a.trsvcid.clone(),
        host_traddr: a.opts.host_traddr.clone(),
        host_iface: a.opts.host_iface.clone(),
        hostnqn: a.opts.hostnqn.clone(),
        hostid: a.opts.hostid.clone(),
        nr_io_queues: a.opts.nr_io_queues,
        keep_alive_tmo: a.opts.keep_alive_tmo,
        reconnect_delay: a.opts.reconnect_delay,
        ctrl_loss_tmo: a.opts.ctrl_loss_tmo,
    };
    // a file --persist cannot merge into stops us before anything is connected
    if a.opts.persist {
        let path = a.opts.config_dir.join("discovery.conf");
        persist::plan(&path, |old| persist::merge_discovery_conf(old, &record))?;
    }
    let log = Controller::connect(&o)
        .and_then(|c| c.discovery_log())
        .with_context(|| {
            format!(
                "reading the discovery log at {} {}:{}",
                a.transport, a.traddr, a.trsvcid
            )
        })?;
    let want_trtype = if a.transport == "rdma" {
        nvmf_wire::log::TRTYPE_RDMA
    } else {
        nvmf_wire::log::TRTYPE_TCP
    };
    let (mut connected, mut failed) = (0usize, 0usize);
    for e in &log.entries {
        let tr = crate::discovery::trtype_str(e.trtype);
        if e.subtype != nvmf_wire::log::SUBTYPE_NVM {
            if e.subnqn != DISCOVERY_NQN || e.traddr != a.traddr || e.trsvcid != a.trsvcid {
                println!(
                    "referral: {} at {tr} {}:{} (not followed)",
                    e.subnqn, e.traddr, e.trsvcid
                );
            }
            continue;
        }
        if e.trtype != want_trtype {
            println!(
                "skipped: {} at {tr} {}:{} (another transport)",
                e.subnqn, e.traddr, e.trsvcid
            );
            continue;
        }
        let r = a
            .opts
            .params(&a.transport, &e.traddr, &e.trsvcid, &e.subnqn)
            .and_then(|p| a.opts.connect_one(&p));
        match r {
            Ok(Some((name, new))) => {
                connected += 1;
                println!(
                    "{name}: {} {} at {tr} {}:{}",
                    if new {
                        "connected to"
                    } else {
                        "already connected to"
                    },
                    e.subnqn,
                    e.traddr,
                    e.trsvcid
                );
            }
            Ok(None) => {}
            Err(err) => {
                failed += 1;
                eprintln!(
                    "nvmf: {} at {tr} {}:{}: {err:#}",
                    e.subnqn, e.traddr, e.trsvcid
                );
            }
        }
    }
    if log
        .entries
        .iter()
        .all(|e| e.subtype != nvmf_wire::log::SUBTYPE_NVM)
    {
        println!(
            "the discovery log at {}:{} lists no NVM subsystem for this host",
            a.traddr, a.trsvcid
        );
    }
    if a.opts.persist {
        if a.opts.dry_run {
            let path = a.opts.config_dir.join("discovery.conf");
            let (path, text, outcome) =
                persist::plan(&path, |old| persist::merge_discovery_conf(old, &record))?;
            println!("would write {} ({outcome:?}):\n{text}", path.display());
        } else {
            let (path, outcome) = persist::record_discovery(&a.opts.config_dir, &record)?;
            println!("persist: {} {}", outcome.describe(), path.display());
            a.opts.warn_autoconnect(&hostnqn);
        }
    }
    if failed > 0 {
        eprintln!("nvmf: {failed} of {} connects failed", failed + connected);
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `nvmf doctor`.
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Print the findings as JSON ({"findings": [...], "errors": N, "warnings": N})
    #[arg(long)]
    pub json: bool,
    /// The sysfs tree to read
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// The /etc tree to read (nvme/hostnqn, nvme/hostid, systemd/system, ...)
    #[arg(long, value_name = "DIR", default_value = "/etc")]
    pub etc_root: PathBuf,
    /// Directories with systemd units (tests; default /lib/systemd/system, /usr/lib/systemd/system)
    #[arg(long, value_name = "DIR", hide = true)]
    pub unit_dir: Vec<PathBuf>,
    /// The `ip` program (tests)
    #[arg(long, value_name = "PATH", default_value = "ip", hide = true)]
    pub ip: PathBuf,
}

pub fn doctor(a: DoctorArgs) -> Result<ExitCode> {
    let ip = a.ip.clone();
    let route = move |dst: &str, src: Option<&str>| doctor::ip_route_dev(&ip, dst, src);
    let env = Env {
        sysfs: a.sysfs_root.clone(),
        etc: a.etc_root.clone(),
        unit_dirs: if a.unit_dir.is_empty() {
            doctor::default_unit_dirs()
        } else {
            a.unit_dir.clone()
        },
        route: &route,
    };
    let findings = doctor::run(&env);
    let errors = doctor::errors(&findings);
    let warnings = findings
        .iter()
        .filter(|f| f.severity == Severity::Warning)
        .count();
    let text = if a.json {
        let v = serde_json::json!({"findings": findings, "errors": errors, "warnings": warnings});
        format!("{}\n", serde_json::to_string_pretty(&v)?)
    } else {
        let mut s: String = findings.iter().map(|f| f.line() + "\n").collect();
        s.push_str(&format!(
            "{} findings: {errors} error(s), {warnings} warning(s)\n",
            findings.len()
        ));
        s
    };
    // a closed pipe (`| head`) is no reason to panic
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(if errors > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// Help after `nvmf udev-name --help`.
pub const UDEV_NAME_HELP: &str = "\
What it is for:
  nvmf's udev rule (/lib/udev/rules.d/70-nvmfd.rules, in the nvmf package) runs it for every
  NVMe disk the kernel adds; for a namespace nvmfd serves it prints the properties from which
  the rule makes /dev/disk/by-nvmfd/SUBSYSTEM-NQN/NAME (NAME: the namespace's bdev on the
  target) and NAME-partN for its partitions. Another target's namespace prints nothing.

Example:
  nvmf udev-name --dev /dev/nvme0n1
    NVMFD_SUBSYSTEM=nqn.2016-06.io.spdk:cnode1
    NVMFD_NAME=vm-101-disk-0
    NVMFD_NSID=1
  udevadm trigger --subsystem-match=block --action=change   # (re)make the links now
  ls -l /dev/disk/by-nvmfd/*/
";

/// `nvmf udev-name`.
#[derive(Args, Debug, Clone)]
pub struct UdevNameArgs {
    /// The NVMe block device (a multipath head such as /dev/nvme0n1)
    #[arg(long, value_name = "DEVNODE")]
    pub dev: PathBuf,
    /// The sysfs tree to read the subsystem NQN from
    #[arg(long, value_name = "DIR", default_value = "/sys", hide = true)]
    pub sysfs_root: PathBuf,
}

pub fn udev_name(a: UdevNameArgs) -> Result<ExitCode> {
    let out = super::udev::udev_name(&a.dev, &a.sysfs_root)?;
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes());
    Ok(ExitCode::SUCCESS)
}
