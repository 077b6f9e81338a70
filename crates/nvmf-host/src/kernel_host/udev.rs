//! udev.rs: `nvmf udev-name`, the program behind nvmf's udev rule
//! (packaging/udev/70-nvmfd.rules) that gives each nvmfd namespace on a Linux host a readable
//! name that stays the same across reboots and reconnects:
//! `/dev/disk/by-nvmfd/SUBSYSTEM-NQN/NAME` (and `NAME-partN` for its partitions).
//!
//! For one block device of the kernel's NVMe host (a multipath head `nvmeXnY`, or a namespace
//! without native multipath) it asks the namespace for its Identify Namespace data through the
//! device itself (`NVME_IOCTL_ID`, then Identify CNS 00h with `NVME_IOCTL_ADMIN_CMD`, as
//! `nvme id-ns` does) and, when nvmfd served it (nvmfd's mark in the vendor-specific area:
//! `nvmf_wire::identify::VS_NAME_MAGIC`, the namespace's bdev name), prints the udev
//! properties `NVMFD_SUBSYSTEM` (from sysfs' `subsysnqn`), `NVMFD_NAME` and `NVMFD_NSID`.
//! Another target's namespace prints nothing, so the rule adds no link. Both names are made
//! safe as one path component (see [`path_component`]).

use std::os::fd::AsRawFd;
use std::path::Path;

use anyhow::{bail, Context, Result};
use nvmf_wire::identify::IdentifyNamespace;
use nvmf_wire::zerocopy::FromBytes;

/// `_IO('N', 0x40)`: the namespace ID of an NVMe block device.
pub const NVME_IOCTL_ID: u64 = 0x4E40;
/// `_IOWR('N', 0x41, struct nvme_passthru_cmd)` (72 bytes): an admin command.
pub const NVME_IOCTL_ADMIN_CMD: u64 = 0xC048_4E41;

/// Linux's `struct nvme_passthru_cmd` (include/uapi/linux/nvme_ioctl.h).
#[repr(C)]
#[derive(Debug, Default)]
struct PassthruCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}
const _: () = assert!(std::mem::size_of::<PassthruCmd>() == 72);

/// What the rule imports for one device: (property, value) pairs; empty when the namespace
/// is not nvmfd's.
pub fn properties(id: &IdentifyNamespace, subsysnqn: &str, nsid: u32) -> Vec<(String, String)> {
    let Some(name) = id.vendor_name() else {
        return Vec::new();
    };
    let (Some(sub), Some(name)) = (path_component(subsysnqn), path_component(name)) else {
        return Vec::new();
    };
    vec![
        ("NVMFD_SUBSYSTEM".into(), sub),
        ("NVMFD_NAME".into(), name),
        ("NVMFD_NSID".into(), nsid.to_string()),
    ]
}

/// `s` as one component of a path under /dev/disk/by-nvmfd: every byte other than ASCII
/// letters, digits and `. _ - : + @` becomes `_`, at most 200 bytes; None for an empty
/// result and for `.` or `..`.
pub fn path_component(s: &str) -> Option<String> {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-:+@".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect();
    match out.as_str() {
        "" | "." | ".." => None,
        _ => Some(out),
    }
}

/// The subsystem NQN of block device `kname` (e.g. `nvme0n1`): `subsysnqn` of its parent
/// device in sysfs (the NVMe subsystem for a multipath head, the controller otherwise).
pub fn subsysnqn_of(sysfs: &Path, kname: &str) -> Result<String> {
    let p = sysfs
        .join("class/block")
        .join(kname)
        .join("device/subsysnqn");
    let s = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    Ok(s.trim().to_string())
}

/// Namespace ID and Identify Namespace of the NVMe block device at `dev`.
pub fn identify_device(dev: &Path) -> Result<(u32, IdentifyNamespace)> {
    let f = std::fs::File::open(dev).with_context(|| format!("opening {}", dev.display()))?;
    let fd = f.as_raw_fd();
    // SAFETY: NVME_IOCTL_ID takes no argument and returns the NSID or -1.
    let nsid = unsafe { libc::ioctl(fd, NVME_IOCTL_ID as _) };
    if nsid <= 0 {
        bail!(
            "{}: not an NVMe namespace (NVME_IOCTL_ID: {})",
            dev.display(),
            std::io::Error::last_os_error()
        );
    }
    let mut buf = vec![0u8; 4096];
    let mut cmd = PassthruCmd {
        opcode: 0x06, // Identify
        nsid: nsid as u32,
        addr: buf.as_mut_ptr() as u64,
        data_len: buf.len() as u32,
        cdw10: 0, // CNS 00h: Identify Namespace
        timeout_ms: 10_000,
        ..Default::default()
    };
    // SAFETY: `cmd` is a valid nvme_passthru_cmd whose buffer (`buf`, 4096 bytes, alive for
    // the call) is what the kernel writes the Identify data into.
    let rc = unsafe { libc::ioctl(fd, NVME_IOCTL_ADMIN_CMD as _, &mut cmd as *mut PassthruCmd) };
    if rc != 0 {
        let why = if rc < 0 {
            std::io::Error::last_os_error().to_string()
        } else {
            format!("NVMe status {rc:#x}")
        };
        bail!("{}: Identify Namespace failed: {why}", dev.display());
    }
    let id = IdentifyNamespace::read_from_bytes(&buf)
        .map_err(|_| anyhow::anyhow!("Identify Namespace: short buffer"))?;
    Ok((nsid as u32, id))
}

/// `nvmf udev-name --dev DEVNODE`: prints `KEY=VALUE` lines for udev's `IMPORT{program}`.
pub fn udev_name(dev: &Path, sysfs: &Path) -> Result<String> {
    let kname = dev
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: no device name", dev.display()))?
        .to_string();
    let (nsid, id) = identify_device(dev)?;
    if id.vendor_name().is_none() {
        return Ok(String::new());
    }
    let nqn = subsysnqn_of(sysfs, &kname)?;
    Ok(properties(&id, &nqn, nsid)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_wire::zerocopy::FromZeros;

    #[test]
    fn ioctl_numbers_are_linuxs() {
        // _IOC(dir, type, nr, size) = dir << 30 | size << 16 | type << 8 | nr
        let ioc = |dir: u64, nr: u64, size: u64| dir << 30 | size << 16 | (b'N' as u64) << 8 | nr;
        assert_eq!(NVME_IOCTL_ID, ioc(0, 0x40, 0));
        assert_eq!(NVME_IOCTL_ADMIN_CMD, ioc(3, 0x41, 72));
    }

    #[test]
    fn properties_of_an_nvmfd_namespace_only() {
        let mut id = IdentifyNamespace::new_zeroed();
        assert!(properties(&id, "nqn.x:y", 1).is_empty(), "not nvmfd's");
        id.set_vendor_name("vm-101-disk-0");
        assert_eq!(
            properties(&id, "nqn.2016-06.io.spdk:cnode1", 3),
            vec![
                (
                    "NVMFD_SUBSYSTEM".into(),
                    "nqn.2016-06.io.spdk:cnode1".to_string()
                ),
                ("NVMFD_NAME".into(), "vm-101-disk-0".to_string()),
                ("NVMFD_NSID".into(), "3".to_string()),
            ]
        );
    }

    #[test]
    fn names_become_one_safe_path_component() {
        assert_eq!(path_component("a/b c\n").as_deref(), Some("a_b_c_"));
        assert_eq!(path_component("..").as_deref(), None);
        assert_eq!(path_component(".").as_deref(), None);
        assert_eq!(path_component("").as_deref(), None);
        assert_eq!(path_component("disk-é").as_deref(), Some("disk-_"));
        assert_eq!(path_component(&"x".repeat(300)).unwrap().len(), 200);
        let mut id = IdentifyNamespace::new_zeroed();
        id.set_vendor_name("../../etc");
        let p = properties(&id, "nqn.a/../b", 1);
        assert_eq!(p[0].1, "nqn.a_.._b");
        assert_eq!(p[1].1, ".._.._etc");
    }

    #[test]
    fn subsysnqn_is_read_from_the_parent_device() {
        let dir = std::env::temp_dir().join(format!("udev-name-{}", std::process::id()));
        let dev = dir.join("class/block/nvme0n1/device");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("subsysnqn"), "nqn.2016-06.io.nvmfd:s1\n").unwrap();
        assert_eq!(
            subsysnqn_of(&dir, "nvme0n1").unwrap(),
            "nqn.2016-06.io.nvmfd:s1"
        );
        assert!(subsysnqn_of(&dir, "nvme9n9").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
