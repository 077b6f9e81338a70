//! bench/targets/kernel.rs — the Linux kernel NVMe-oF target (nvmet +
//! nvmet-tcp) as a bench target (`kind = "kernel"`): set up through
//! configfs (a subsystem open to any host, namespace `nsid` on the backing
//! device or file, a TCP port, the port → subsystem link) and torn down in
//! reverse order, removing only what it created. The configfs root is a
//! parameter, so all of it runs against a plain directory in tests.
//!
//! Counters: none (the kernel target keeps no per-namespace I/O counters
//! in configfs), so `io_counters` is None. CPU: its work runs in kernel
//! threads and softirqs, not in processes of its own, so `pids` is empty
//! and the target's CPU time is not measured. Version: the kernel release.
//!
//! It needs the nvmet and nvmet-tcp modules: `start` loads them
//! (`modprobe nvmet-tcp`) and refuses with the reason and the way out
//! when they cannot be loaded (e.g. a kernel built without them).

use crate::bench::spec::KernelSpec;
use crate::bench::target::{BenchTarget, Endpoint};
use anyhow::{bail, Context};
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where nvmet's configfs tree is on a real system.
pub const NVMET_ROOT: &str = "/sys/kernel/config/nvmet";
/// Highest nvmet port id (a 16-bit number).
const MAX_PORT_ID: u32 = 65535;

/// Are nvmet and nvmet-tcp loaded (or built in)? `sys_module` is
/// /sys/module. Err names what is missing.
pub fn modules_present(sys_module: &Path) -> Result<(), String> {
    let missing: Vec<&str> = ["nvmet", "nvmet_tcp"]
        .into_iter()
        .filter(|m| !sys_module.join(m).exists())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing.join(", "))
    }
}

/// The refusal when the modules are missing (`why`: what modprobe said).
fn no_modules_error(missing: &str, why: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "kind = \"kernel\" needs the Linux kernel target modules nvmet and nvmet-tcp; {missing} not loaded and `modprobe nvmet-tcp` failed: {why}. \
         This kernel ({}) has no NVMe/TCP target (CONFIG_NVME_TARGET_TCP). Run this target on a host whose kernel has it \
         (most distribution kernels do: `modprobe nvmet-tcp`), or use the testbed's QEMU guest kernel (crates/nvmf-interop, tests/kernel_target.rs)",
        kernel_release()
    )
}

/// `uname -r`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// A kernel target set up through configfs under `root`.
pub struct KernelTarget {
    name: String,
    spec: KernelSpec,
    nsid: u32,
    root: PathBuf,
    /// Load the modules first (false for a fake configfs tree).
    load_modules: bool,
    port_id: Option<u32>,
    /// What start created, in creation order (torn down in reverse).
    created: Vec<Created>,
    /// How long to wait for the port to accept connections (0 = don't).
    listen_timeout: Duration,
    /// What teardown could not remove (path and error), also warned on stderr.
    teardown_left: Vec<String>,
}

#[derive(Debug, Clone)]
enum Created {
    Dir(PathBuf),
    Link(PathBuf),
    /// A namespace enabled (`enable` = 1): disabled before its rmdir.
    Enabled(PathBuf),
}

impl KernelTarget {
    /// The real thing: configfs at [`NVMET_ROOT`], modules loaded on start.
    pub fn new(name: &str, spec: &KernelSpec, nsid: u32) -> KernelTarget {
        let mut t = KernelTarget::at(Path::new(NVMET_ROOT), name, spec, nsid);
        t.load_modules = true;
        t.listen_timeout = Duration::from_secs(5);
        t
    }

    /// Against a configfs tree at `root` (a plain directory in tests: no
    /// modules are loaded and the port is not probed).
    pub fn at(root: &Path, name: &str, spec: &KernelSpec, nsid: u32) -> KernelTarget {
        KernelTarget {
            name: name.to_string(),
            spec: spec.clone(),
            nsid,
            root: root.to_path_buf(),
            load_modules: false,
            port_id: None,
            created: Vec::new(),
            listen_timeout: Duration::ZERO,
            teardown_left: Vec::new(),
        }
    }

    /// What teardown could not remove so far ("PATH (error)"); empty when
    /// it left configfs as it found it.
    pub fn teardown_left(&self) -> &[String] {
        &self.teardown_left
    }

    /// The port id start used.
    pub fn port_id(&self) -> Option<u32> {
        self.port_id
    }

    fn ensure_modules(&self) -> anyhow::Result<()> {
        let sys = Path::new("/sys/module");
        let Err(missing) = modules_present(sys) else {
            return Ok(());
        };
        let out = std::process::Command::new("modprobe")
            .arg("nvmet-tcp")
            .stdin(std::process::Stdio::null())
            .output();
        let why = match out {
            Ok(o) if o.status.success() => match modules_present(sys) {
                Ok(()) => return Ok(()),
                Err(m) => format!("still missing after modprobe: {m}"),
            },
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => format!("cannot run modprobe: {e}"),
        };
        Err(no_modules_error(&missing, &why))
    }

    fn mkdir(&mut self, p: PathBuf) -> anyhow::Result<()> {
        std::fs::create_dir(&p).with_context(|| format!("configfs: mkdir {}", p.display()))?;
        self.created.push(Created::Dir(p));
        Ok(())
    }

    fn set_up(&mut self) -> anyhow::Result<()> {
        if self.load_modules {
            self.ensure_modules()?;
        }
        if !self.root.is_dir() {
            bail!(
                "{} does not exist: configfs is not mounted or nvmet is not loaded (mount -t configfs none /sys/kernel/config; modprobe nvmet-tcp)",
                self.root.display()
            );
        }
        let subsys = self.root.join("subsystems").join(&self.spec.nqn);
        if subsys.exists() {
            bail!(
                "kernel target \"{}\": subsystem {} already exists in {} (set up by someone else?); remove it or choose another nqn",
                self.name,
                self.spec.nqn,
                self.root.display()
            );
        }
        let (addr, port) = (&self.spec.addr.clone(), self.spec.port.to_string());
        let ports = self.root.join("ports");
        // A port already serving addr:port would take our link's listener.
        if let Ok(rd) = std::fs::read_dir(&ports) {
            for e in rd.flatten() {
                let a = read_attr(&e.path(), "addr_traddr");
                let s = read_attr(&e.path(), "addr_trsvcid");
                if a.as_deref() == Some(addr.as_str()) && s.as_deref() == Some(port.as_str()) {
                    bail!(
                        "kernel target \"{}\": nvmet port {} already listens on {addr}:{port}; choose another port",
                        self.name,
                        e.path().display()
                    );
                }
            }
        }
        self.mkdir(subsys.clone())?;
        write_attr(&subsys, "attr_allow_any_host", "1")?;
        let ns = subsys.join("namespaces").join(self.nsid.to_string());
        if !subsys.join("namespaces").is_dir() {
            // A real configfs makes it with the subsystem; a plain tree does not.
            std::fs::create_dir(subsys.join("namespaces"))?;
        }
        self.mkdir(ns.clone())?;
        write_attr(&ns, "device_path", &self.spec.backing.display().to_string())?;
        write_attr(&ns, "enable", "1")?;
        self.created.push(Created::Enabled(ns));
        let id = (1..=MAX_PORT_ID)
            .find(|i| !ports.join(i.to_string()).exists())
            .context("no free nvmet port id")?;
        let port_dir = ports.join(id.to_string());
        self.mkdir(port_dir.clone())?;
        self.port_id = Some(id);
        let adrfam = if addr.contains(':') { "ipv6" } else { "ipv4" };
        for (k, v) in [
            ("addr_trtype", "tcp"),
            ("addr_adrfam", adrfam),
            ("addr_traddr", addr.as_str()),
            ("addr_trsvcid", port.as_str()),
        ] {
            write_attr(&port_dir, k, v)?;
        }
        let link_dir = port_dir.join("subsystems");
        if !link_dir.is_dir() {
            // As for `namespaces`: only a plain tree lacks it.
            std::fs::create_dir(&link_dir)?;
        }
        let link = link_dir.join(&self.spec.nqn);
        // Linking enables the port: the kernel starts listening here.
        std::os::unix::fs::symlink(&subsys, &link).with_context(|| {
            format!(
                "configfs: linking {} to port {id} (does {addr}:{port} exist here and is it free?)",
                self.spec.nqn
            )
        })?;
        self.created.push(Created::Link(link));
        if !self.listen_timeout.is_zero() {
            let sa = SocketAddr::new(addr.parse()?, self.spec.port);
            let until = Instant::now() + self.listen_timeout;
            while TcpStream::connect_timeout(&sa, Duration::from_millis(200)).is_err() {
                if Instant::now() >= until {
                    bail!("the kernel target does not accept on {sa} after setup");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    fn tear_down(&mut self) {
        let mut left = Vec::new();
        while let Some(c) = self.created.pop() {
            let res = match &c {
                Created::Link(p) => match std::fs::remove_file(p) {
                    Err(e) if e.kind() != ErrorKind::NotFound => Err((p, e)),
                    _ => Ok(()),
                },
                Created::Enabled(ns) => {
                    // rmdir of the namespace disables it too; a failure here is
                    // seen there.
                    let _ = write_attr(ns, "enable", "0");
                    Ok(())
                }
                Created::Dir(p) => rmdir(p).map_err(|e| (p, e)),
            };
            if let Err((p, e)) = res {
                left.push(format!("{} ({e})", p.display()));
            }
        }
        if !left.is_empty() {
            // stop() has no error to return: say it, so a leftover subsystem
            // or listening port does not go unnoticed (the next run on this
            // nqn or port would be refused).
            eprintln!(
                "nvmf bench: warning: kernel target \"{}\": teardown could not remove {}; remove it by hand (rm the port link, rmdir namespaces, subsystem, port)",
                self.name,
                left.join(", ")
            );
        }
        self.teardown_left.extend(left);
        self.port_id = None;
    }
}

fn read_attr(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .map(|s| s.trim().to_string())
}

fn write_attr(dir: &Path, name: &str, value: &str) -> anyhow::Result<()> {
    let p = dir.join(name);
    std::fs::write(&p, format!("{value}\n"))
        .with_context(|| format!("configfs: writing {value} to {}", p.display()))
}

/// rmdir a configfs directory. configfs removes its attribute files with
/// the directory; a plain directory (tests) still holds the files we
/// wrote, which are removed first. Gone already is fine.
fn rmdir(p: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir(p) {
        Err(e) if e.kind() == ErrorKind::DirectoryNotEmpty => {
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    let path = e.path();
                    if path.is_dir() {
                        let _ = std::fs::remove_dir(&path);
                    } else {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            std::fs::remove_dir(p)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

impl BenchTarget for KernelTarget {
    fn kind(&self) -> &'static str {
        "kernel"
    }

    fn start(&mut self) -> anyhow::Result<Endpoint> {
        if let Err(e) = self.set_up() {
            self.tear_down();
            return Err(e);
        }
        Ok(Endpoint {
            trid: self.spec.trid(),
            nsid: self.nsid,
        })
    }

    fn pids(&self) -> Vec<u32> {
        Vec::new()
    }

    fn cpus(&self) -> Vec<usize> {
        Vec::new()
    }

    fn io_counters(&mut self) -> Option<(u64, u64)> {
        None
    }

    fn notes(&self) -> Vec<String> {
        vec!["kernel target: no target I/O counters and no target CPU time (it runs in kernel threads)".into()]
    }

    fn version(&self) -> String {
        format!("Linux kernel target (nvmet) {}", kernel_release())
    }

    fn stop(&mut self) {
        self.tear_down();
    }
}

impl Drop for KernelTarget {
    fn drop(&mut self) {
        self.tear_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tmp(PathBuf);
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn tmp(tag: &str) -> Tmp {
        let d =
            std::env::temp_dir().join(format!("nvmf-bench-kernel-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("nvmet/subsystems")).unwrap();
        std::fs::create_dir_all(d.join("nvmet/ports")).unwrap();
        Tmp(d)
    }
    fn spec(nqn: &str, port: u16) -> KernelSpec {
        KernelSpec {
            backing: "/dev/nullb0".into(),
            addr: "127.0.0.1".into(),
            port,
            nqn: nqn.into(),
        }
    }
    fn listing(root: &Path) -> Vec<String> {
        fn walk(base: &Path, p: &Path, out: &mut Vec<String>) {
            let mut v: Vec<_> = std::fs::read_dir(p).unwrap().flatten().collect();
            v.sort_by_key(|e| e.file_name());
            for e in v {
                let rel = e.path().strip_prefix(base).unwrap().display().to_string();
                let ft = std::fs::symlink_metadata(e.path()).unwrap().file_type();
                if ft.is_symlink() {
                    let to = std::fs::read_link(e.path()).unwrap();
                    out.push(format!(
                        "{rel} -> {}",
                        to.strip_prefix(base).unwrap().display()
                    ));
                } else if ft.is_dir() {
                    out.push(format!("{rel}/"));
                    walk(base, &e.path(), out);
                } else {
                    let v = std::fs::read_to_string(e.path()).unwrap();
                    out.push(format!("{rel} = {}", v.trim()));
                }
            }
        }
        let mut out = Vec::new();
        walk(root, root, &mut out);
        out
    }

    #[test]
    fn sets_up_and_tears_down_a_fake_configfs() {
        let d = tmp("setup");
        let root = d.0.join("nvmet");
        // Someone else's port 1 (another address) stays untouched.
        std::fs::create_dir_all(root.join("ports/1")).unwrap();
        std::fs::write(root.join("ports/1/addr_traddr"), "10.0.0.1\n").unwrap();
        std::fs::write(root.join("ports/1/addr_trsvcid"), "4420\n").unwrap();
        let before = listing(&root);
        let mut t = KernelTarget::at(
            &root,
            "linux",
            &spec("nqn.2024-01.io.nvmfd:bench-linux", 4420),
            3,
        );
        let ep = t.start().unwrap();
        assert_eq!(ep.nsid, 3);
        assert_eq!(
            ep.trid.to_string(),
            spec("nqn.2024-01.io.nvmfd:bench-linux", 4420)
                .trid()
                .to_string()
        );
        assert_eq!(t.port_id(), Some(2));
        let s = "subsystems/nqn.2024-01.io.nvmfd:bench-linux";
        let want = [
            "ports/".to_string(),
            "ports/1/".into(),
            "ports/1/addr_traddr = 10.0.0.1".into(),
            "ports/1/addr_trsvcid = 4420".into(),
            "ports/2/".into(),
            "ports/2/addr_adrfam = ipv4".into(),
            "ports/2/addr_traddr = 127.0.0.1".into(),
            "ports/2/addr_trsvcid = 4420".into(),
            "ports/2/addr_trtype = tcp".into(),
            "ports/2/subsystems/".into(),
            format!("ports/2/{s} -> {s}"),
            "subsystems/".into(),
            format!("{s}/"),
            format!("{s}/attr_allow_any_host = 1"),
            format!("{s}/namespaces/"),
            format!("{s}/namespaces/3/"),
            format!("{s}/namespaces/3/device_path = /dev/nullb0"),
            format!("{s}/namespaces/3/enable = 1"),
        ];
        assert_eq!(listing(&root), want);
        assert_eq!(t.io_counters(), None);
        assert!(t.pids().is_empty());
        assert!(t.version().starts_with("Linux kernel target (nvmet) "));
        t.stop();
        assert_eq!(listing(&root), before);
        // stop twice (and drop) is harmless.
        t.stop();
    }

    #[test]
    fn refuses_what_it_did_not_create_and_undoes_a_half_setup() {
        let d = tmp("refuse");
        let root = d.0.join("nvmet");
        let nqn = "nqn.2024-01.io.nvmfd:taken";
        std::fs::create_dir_all(root.join("subsystems").join(nqn)).unwrap();
        let mut t = KernelTarget::at(&root, "k", &spec(nqn, 4420), 1);
        let e = t.start().unwrap_err().to_string();
        assert!(e.contains("already exists") && e.contains(nqn), "{e}");
        assert!(root.join("subsystems").join(nqn).is_dir(), "left alone");
        // A port already on 127.0.0.1:4545.
        std::fs::create_dir_all(root.join("ports/7")).unwrap();
        std::fs::write(root.join("ports/7/addr_traddr"), "127.0.0.1\n").unwrap();
        std::fs::write(root.join("ports/7/addr_trsvcid"), "4545\n").unwrap();
        let before = listing(&root);
        let mut t = KernelTarget::at(&root, "k", &spec("nqn.2024-01.io.nvmfd:free", 4545), 1);
        let e = t.start().unwrap_err().to_string();
        assert!(e.contains("already listens on 127.0.0.1:4545"), "{e}");
        assert_eq!(listing(&root), before);
        // A failure half-way (no port directory can be made: `ports` is a
        // file) removes the subsystem and namespace it had made.
        std::fs::remove_dir_all(root.join("ports")).unwrap();
        std::fs::write(root.join("ports"), "").unwrap();
        let before = listing(&root);
        let mut t = KernelTarget::at(&root, "k", &spec("nqn.2024-01.io.nvmfd:half", 4546), 1);
        let e = format!("{:#}", t.start().unwrap_err());
        assert!(e.contains("mkdir") && e.contains("ports/1"), "{e}");
        assert_eq!(listing(&root), before);
        // No configfs at all.
        let mut t = KernelTarget::at(&d.0.join("gone"), "k", &spec("nqn.x:y", 1), 1);
        let e = t.start().unwrap_err().to_string();
        assert!(e.contains("configfs is not mounted"), "{e}");
    }

    /// On a host without nvmet (this development host), start refuses
    /// with modprobe's reason. Runs only where `modprobe -n nvmet-tcp`
    /// fails, so it never loads a module or touches a real configfs.
    #[test]
    fn refused_where_the_kernel_has_no_nvmet() {
        let dry = std::process::Command::new("modprobe")
            .args(["-n", "nvmet-tcp"])
            .output();
        if modules_present(Path::new("/sys/module")).is_ok()
            || dry.is_ok_and(|o| o.status.success())
        {
            println!("refused_where_the_kernel_has_no_nvmet: skipped: this kernel has nvmet-tcp");
            return;
        }
        let mut t = KernelTarget::new("k", &spec("nqn.2024-01.io.nvmfd:bench-k", 4547), 1);
        let e = t.start().unwrap_err().to_string();
        for w in [
            "nvmet and nvmet-tcp",
            "modprobe nvmet-tcp",
            "QEMU",
            &kernel_release(),
        ] {
            assert!(e.contains(w), "{e} lacks {w}");
        }
        println!("{e}");
    }

    /// The real nvmet (6.1, testbed guest) refuses to rmdir a port that
    /// still has a subsystem linked (ENOTEMPTY) and that subsystem (EBUSY),
    /// and stop() has no error to return: what teardown
    /// could not remove is recorded and warned, never silently left.
    #[test]
    fn teardown_names_what_it_could_not_remove() {
        let d = tmp("left");
        let root = d.0.join("nvmet");
        let mut t = KernelTarget::at(&root, "k", &spec("nqn.2024-01.io.nvmfd:left", 4548), 1);
        t.start().unwrap();
        assert!(t.teardown_left().is_empty());
        // Something in the port that rmdir cannot take away (a non-empty
        // directory stands in for the kernel's EBUSY).
        std::fs::create_dir_all(root.join("ports/1/busy/inner")).unwrap();
        t.stop();
        let left = t.teardown_left().join("; ");
        assert_eq!(t.teardown_left().len(), 1, "{left}");
        assert!(left.contains("ports/1 ("), "{left}");
        // The rest was still removed.
        assert!(!root.join("subsystems/nqn.2024-01.io.nvmfd:left").exists());
        // A clean teardown records nothing.
        std::fs::remove_dir_all(root.join("ports/1")).unwrap();
        let mut t = KernelTarget::at(&root, "k", &spec("nqn.2024-01.io.nvmfd:left", 4548), 1);
        t.start().unwrap();
        t.stop();
        assert!(t.teardown_left().is_empty(), "{:?}", t.teardown_left());
    }

    #[test]
    fn missing_modules_are_named() {
        let d = tmp("mods");
        let m = d.0.join("module");
        std::fs::create_dir_all(m.join("nvmet")).unwrap();
        assert_eq!(modules_present(&m), Err("nvmet_tcp".into()));
        std::fs::create_dir_all(m.join("nvmet_tcp")).unwrap();
        assert_eq!(modules_present(&m), Ok(()));
        let e =
            no_modules_error("nvmet, nvmet_tcp", "FATAL: Module nvmet-tcp not found").to_string();
        for w in [
            "nvmet-tcp",
            "Module nvmet-tcp not found",
            "QEMU",
            "modprobe nvmet-tcp",
        ] {
            assert!(e.contains(w), "{e} lacks {w}");
        }
    }
}
