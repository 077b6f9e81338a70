//! kernel_host/: the Linux kernel's NVMe over Fabrics host, as `nvmf` drives and checks it (not
//! nvmf's own user-space initiator).
//!
//! * mod.rs (this file): the host identity (`/etc/nvme/hostnqn`, `/etc/nvme/hostid`) and what
//!   sysfs says about the kernel's controllers, their paths and their subsystems. Every reader
//!   takes the root of its tree (`/sys`, `/etc`), so tests run against a fake tree.
//! * fabrics.rs: the option string nvme-cli writes to `/dev/nvme-fabrics`, and the write.
//! * persist.rs: recording connections for nvme-cli's boot-time `nvme connect-all`
//!   (`/etc/nvme/discovery.conf`, `/etc/nvme/config.json`).
//! * doctor.rs: `nvmf doctor`, checks of a host with one finding per line.
//! * udev.rs: `nvmf udev-name`, the program of the udev rule that names nvmfd's namespaces
//!   `/dev/disk/by-nvmfd/SUBSYSTEM/NAME` (packaging/udev/70-nvmfd.rules).
//! * cli.rs: the clap arguments, help and run functions of `connect`, `connect-all`, `doctor`,
//!   `udev-name`.

pub mod cli;
pub mod doctor;
pub mod fabrics;
pub mod persist;
pub mod udev;

use std::path::{Path, PathBuf};

/// The first line of a file, trimmed; `None` when the file is missing or that line is empty.
pub(crate) fn read_first_line(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().next().unwrap_or("").trim();
    (!line.is_empty()).then(|| line.to_string())
}

/// A sysfs attribute, trimmed (`None` when missing or unreadable).
pub(crate) fn attr(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .map(|s| s.trim().to_string())
}

/// The host NQN and host ID nvme-cli would use: the first line of `<etc>/nvme/hostnqn` and of
/// `<etc>/nvme/hostid` (`None` where the file is missing or empty).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostIdentity {
    pub hostnqn: Option<String>,
    pub hostid: Option<String>,
}

impl HostIdentity {
    /// From `<etc_root>/nvme/`.
    pub fn read(etc_root: &Path) -> HostIdentity {
        HostIdentity::read_config_dir(&etc_root.join("nvme"))
    }

    /// From a configuration directory like `/etc/nvme` (`--config-dir`).
    pub fn read_config_dir(dir: &Path) -> HostIdentity {
        HostIdentity {
            hostnqn: read_first_line(&dir.join("hostnqn")),
            hostid: read_first_line(&dir.join("hostid")),
        }
    }
}

/// The UUID of a host NQN of the form `nqn.2014-08.org.nvmexpress:uuid:<UUID>` (lower case).
pub fn uuid_of_hostnqn(nqn: &str) -> Option<String> {
    let rest = nqn.strip_prefix("nqn.2014-08.org.nvmexpress:uuid:")?;
    uuid::Uuid::try_parse(rest)
        .ok()
        .map(|u| u.hyphenated().to_string())
}

/// One path of a namespace through a controller: `nvme0c1n1` in sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KPath {
    pub name: String,
    pub ana_state: Option<String>,
    pub ana_grpid: Option<String>,
    pub nsid: Option<String>,
}

/// A kernel NVMe controller, `/sys/class/nvme/nvmeN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KController {
    pub name: String,
    pub dir: PathBuf,
    pub transport: String,
    /// The raw `address` attribute (`traddr=...,trsvcid=...,src_addr=...`).
    pub address: String,
    pub traddr: Option<String>,
    pub trsvcid: Option<String>,
    /// `host_traddr`, else the `src_addr` the kernel reports for NVMe/TCP.
    pub host_traddr: Option<String>,
    pub host_iface: Option<String>,
    pub subsysnqn: String,
    pub state: String,
    /// Keep-alive timeout in seconds (`kato`; absent on old kernels).
    pub kato: Option<String>,
    /// `ctrl_loss_tmo`: seconds, or `off` (reconnect forever).
    pub ctrl_loss_tmo: Option<String>,
    pub reconnect_delay: Option<String>,
    pub paths: Vec<KPath>,
}

impl KController {
    /// Whether this is a fabrics controller (not PCIe).
    pub fn is_fabrics(&self) -> bool {
        matches!(self.transport.as_str(), "tcp" | "rdma" | "fc" | "loop")
    }

    /// `traddr:trsvcid` for messages.
    pub fn target(&self) -> String {
        format!(
            "{} {}:{}",
            self.transport,
            self.traddr.as_deref().unwrap_or("?"),
            self.trsvcid.as_deref().unwrap_or("?")
        )
    }
}

/// The fields of a controller's `address` attribute.
pub fn parse_address(address: &str) -> Vec<(String, String)> {
    address
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The number in `nvme12` (after `prefix`) for a natural sort order; names that do not fit
/// sort last.
fn name_key(name: &str, prefix: &str) -> (u64, String) {
    let n = name
        .strip_prefix(prefix)
        .and_then(|r| r.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    (n, name.to_string())
}

/// Directory entries of `dir` whose names satisfy `keep`, sorted naturally.
fn entries(dir: &Path, prefix: &str, keep: impl Fn(&str) -> bool) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            keep(&name).then(|| (name, e.path()))
        })
        .collect();
    v.sort_by_key(|(n, _)| name_key(n, prefix));
    v
}

/// `nvme<digits>`.
fn is_ctrl_name(n: &str) -> bool {
    n.strip_prefix("nvme")
        .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}

/// `nvme<d>c<d>n<d>`: a path device under its controller.
fn is_path_name(n: &str) -> bool {
    let Some(r) = n.strip_prefix("nvme") else {
        return false;
    };
    let Some((a, rest)) = r.split_once('c') else {
        return false;
    };
    let Some((b, c)) = rest.split_once('n') else {
        return false;
    };
    [a, b, c]
        .iter()
        .all(|s| !s.is_empty() && s.bytes().all(|x| x.is_ascii_digit()))
}

/// Every controller in `<sysfs>/class/nvme`, in name order.
pub fn controllers(sysfs: &Path) -> Vec<KController> {
    entries(&sysfs.join("class/nvme"), "nvme", is_ctrl_name)
        .into_iter()
        .map(|(name, dir)| read_controller(name, dir))
        .collect()
}

fn read_controller(name: String, dir: PathBuf) -> KController {
    let address = attr(&dir, "address").unwrap_or_default();
    let fields = parse_address(&address);
    let get = |k: &str| {
        fields
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    let paths = entries(&dir, "", is_path_name)
        .into_iter()
        .map(|(pname, pdir)| KPath {
            ana_state: attr(&pdir, "ana_state"),
            ana_grpid: attr(&pdir, "ana_grpid"),
            nsid: attr(&pdir, "nsid"),
            name: pname,
        })
        .collect();
    KController {
        transport: attr(&dir, "transport").unwrap_or_default(),
        traddr: get("traddr"),
        trsvcid: get("trsvcid"),
        host_traddr: get("host_traddr").or_else(|| get("src_addr")),
        host_iface: get("host_iface"),
        subsysnqn: attr(&dir, "subsysnqn").unwrap_or_default(),
        state: attr(&dir, "state").unwrap_or_default(),
        kato: attr(&dir, "kato"),
        ctrl_loss_tmo: attr(&dir, "ctrl_loss_tmo"),
        reconnect_delay: attr(&dir, "reconnect_delay"),
        address,
        paths,
        name,
        dir,
    }
}

/// A kernel NVMe subsystem, `/sys/class/nvme-subsystem/nvme-subsysN`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KSubsystem {
    pub name: String,
    pub dir: PathBuf,
    pub nqn: String,
    /// `numa`, `round-robin` or (6.11+) `queue-depth`.
    pub iopolicy: Option<String>,
    /// Names of its controllers (`nvme0`, ...).
    pub controllers: Vec<String>,
}

/// Every subsystem in `<sysfs>/class/nvme-subsystem`, in name order.
pub fn subsystems(sysfs: &Path) -> Vec<KSubsystem> {
    entries(&sysfs.join("class/nvme-subsystem"), "nvme-subsys", |n| {
        n.starts_with("nvme-subsys")
    })
    .into_iter()
    .map(|(name, dir)| KSubsystem {
        nqn: attr(&dir, "subsysnqn").unwrap_or_default(),
        iopolicy: attr(&dir, "iopolicy"),
        controllers: entries(&dir, "nvme", is_ctrl_name)
            .into_iter()
            .map(|(n, _)| n)
            .collect(),
        name,
        dir,
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_ctrl_name("nvme12"));
        assert!(!is_ctrl_name("nvme"));
        assert!(!is_ctrl_name("nvme0n1"));
        assert!(is_path_name("nvme0c1n2"));
        assert!(!is_path_name("nvme0n1"));
        assert!(!is_path_name("nvme0c1"));
    }

    #[test]
    fn address_fields() {
        let f = parse_address("traddr=10.0.0.1,trsvcid=4420,src_addr=10.0.0.2\n");
        assert_eq!(f[0], ("traddr".into(), "10.0.0.1".into()));
        assert_eq!(f[2], ("src_addr".into(), "10.0.0.2".into()));
    }

    #[test]
    fn hostnqn_uuid() {
        assert_eq!(
            uuid_of_hostnqn("nqn.2014-08.org.nvmexpress:uuid:0E3A8E02-1C21-4F5B-9E3A-1D2C3B4A5F60")
                .as_deref(),
            Some("0e3a8e02-1c21-4f5b-9e3a-1d2c3b4a5f60")
        );
        assert_eq!(uuid_of_hostnqn("nqn.2024-01.io.example:host1"), None);
    }
}
