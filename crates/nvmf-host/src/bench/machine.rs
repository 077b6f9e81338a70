//! bench/machine.rs — the machine context of a bench report: host name,
//! CPU model, online CPUs, NUMA nodes, kernel, memory, the interfaces the
//! runs went over (driver and link speed from sysfs), the versions of
//! nvmf and of every engine and target used, the load before the first
//! run and whether a hypervisor is visible. Everything is read under an
//! injectable root (`proc/...`, `sys/...`), so the tests use fake trees.

use super::placement::Host;
use super::results::MachineContext;
use std::path::{Path, PathBuf};

/// Reads the machine under `root` (`/` for the running system).
pub struct Machine {
    root: PathBuf,
}

impl Machine {
    pub fn system() -> Machine {
        Machine::at("/")
    }

    pub fn at(root: impl Into<PathBuf>) -> Machine {
        Machine { root: root.into() }
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel))
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// `name (driver, N Mbit/s)`; parts unknown are left out (`lo`).
    pub fn nic(&self, ifname: &str) -> String {
        let driver = std::fs::read_link(
            self.root
                .join(format!("sys/class/net/{ifname}/device/driver")),
        )
        .ok()
        .and_then(|p| Some(p.file_name()?.to_string_lossy().into_owned()));
        // `speed` is -1 (or unreadable) without a link or for virtual devices.
        let speed = self
            .read(&format!("sys/class/net/{ifname}/speed"))
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|s| *s > 0);
        let mut parts = Vec::new();
        if let Some(d) = driver {
            parts.push(d);
        }
        if let Some(s) = speed {
            parts.push(format!("{s} Mbit/s"));
        }
        if parts.is_empty() {
            ifname.to_string()
        } else {
            format!("{ifname} ({})", parts.join(", "))
        }
    }

    /// The context; `interfaces` are those the runs used, `versions`
    /// (tool, version) are added after `nvmf`'s own.
    pub fn context(&self, interfaces: &[String], versions: &[(String, String)]) -> MachineContext {
        let cpuinfo = self.read("proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        let cpu_model = field("model name")
            .or_else(|| field("Model"))
            .or_else(|| field("cpu model"))
            .unwrap_or_else(|| "unknown".into());
        let virtualized =
            field("flags").is_some_and(|f| f.split_whitespace().any(|x| x == "hypervisor"));
        let memory_gib = self
            .read("proc/meminfo")
            .and_then(|m| {
                m.lines().find_map(|l| {
                    let kb: f64 = l
                        .strip_prefix("MemTotal:")?
                        .trim()
                        .strip_suffix("kB")?
                        .trim()
                        .parse()
                        .ok()?;
                    Some(kb / (1024.0 * 1024.0))
                })
            })
            .unwrap_or(0.0);
        let host = Host::at(&self.root);
        let mut nics: Vec<String> = Vec::new();
        for i in interfaces {
            let n = self.nic(i);
            if !nics.contains(&n) {
                nics.push(n);
            }
        }
        let mut all_versions = vec![("nvmf".to_string(), env!("CARGO_PKG_VERSION").to_string())];
        for v in versions {
            if !all_versions.contains(v) {
                all_versions.push(v.clone());
            }
        }
        MachineContext {
            hostname: self
                .read("proc/sys/kernel/hostname")
                .unwrap_or_else(|| "unknown".into()),
            cpu_model,
            cpus: host.online_cpus().len(),
            numa_nodes: host.nodes().len().max(1),
            kernel: self
                .read("proc/sys/kernel/osrelease")
                .unwrap_or_else(|| "unknown".into()),
            memory_gib,
            nics,
            versions: all_versions,
            load1_before: super::cpu::Proc::at(&self.root, 100.0)
                .load1()
                .unwrap_or(0.0),
            virtualized,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_from_a_fake_tree() {
        let root = std::env::temp_dir().join(format!("nvmf-bench-machine-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let files = [
            ("proc/sys/kernel/hostname", "bench1\n"),
            ("proc/sys/kernel/osrelease", "6.18.0-test\n"),
            (
                "proc/cpuinfo",
                "processor\t: 0\nmodel name\t: Fake CPU @ 3.0GHz\nflags\t\t: fpu sse2 hypervisor avx2\n\nprocessor\t: 1\nmodel name\t: Fake CPU @ 3.0GHz\n",
            ),
            ("proc/meminfo", "MemTotal:       16777216 kB\nMemFree: 1 kB\n"),
            ("proc/loadavg", "0.75 0.50 0.25 1/100 42\n"),
            ("sys/devices/system/cpu/online", "0-7\n"),
            ("sys/devices/system/node/node0/cpulist", "0-3\n"),
            ("sys/devices/system/node/node1/cpulist", "4-7\n"),
            ("sys/class/net/eth0/speed", "25000\n"),
            ("sys/class/net/lo/speed", "-1\n"),
            ("sys/bus/pci/drivers/mlx5_core/.keep", ""),
        ];
        for (p, t) in files {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, t).unwrap();
        }
        std::fs::create_dir_all(root.join("sys/class/net/eth0/device")).unwrap();
        std::os::unix::fs::symlink(
            root.join("sys/bus/pci/drivers/mlx5_core"),
            root.join("sys/class/net/eth0/device/driver"),
        )
        .unwrap();
        let m = Machine::at(&root).context(
            &["eth0".into(), "lo".into(), "eth0".into()],
            &[("fio".into(), "fio-3.33".into())],
        );
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(m.hostname, "bench1");
        assert_eq!(m.kernel, "6.18.0-test");
        assert_eq!(m.cpu_model, "Fake CPU @ 3.0GHz");
        assert!(m.virtualized);
        assert_eq!(m.cpus, 8);
        assert_eq!(m.numa_nodes, 2);
        assert_eq!(m.memory_gib, 16.0);
        assert_eq!(m.load1_before, 0.75);
        assert_eq!(m.nics, ["eth0 (mlx5_core, 25000 Mbit/s)", "lo"]);
        assert_eq!(m.versions[0].0, "nvmf");
        assert_eq!(m.versions[1], ("fio".to_string(), "fio-3.33".to_string()));
    }

    #[test]
    fn an_empty_tree_gives_unknowns_not_a_panic() {
        let m = Machine::at("/nonexistent-nvmf-bench").context(&["eth9".into()], &[]);
        assert_eq!(m.hostname, "unknown");
        assert_eq!(m.cpu_model, "unknown");
        assert!(!m.virtualized);
        assert_eq!(m.numa_nodes, 1);
        assert_eq!(m.nics, ["eth9"]);
    }
}
