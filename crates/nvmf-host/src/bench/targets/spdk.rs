//! bench/targets/spdk.rs — SPDK's `nvmf_tgt` as a bench target
//! (`kind = "spdk"`): start it from the spec's JSON config with its
//! reactors on the chosen CPUs (`-m`) and a private JSON-RPC socket (`-r`),
//! wait (bounded) until its listener accepts, read its I/O counters
//! (`bdev_get_iostat` of the bdev behind the namespace, over JSON-RPC with
//! nvmf-rpc's client) and version (`spdk_get_version`), and stop it
//! (`spdk_kill_instance`, then SIGTERM, then SIGKILL, each bounded), leaving
//! nothing behind. Also the small helpers the spdk-perf engine shares:
//! hugepage accounting, DPDK's run directory, cpulists, shell quoting.
//!
//! Memory: with at least [`TARGET_MEM_MIB`] of free hugepages it runs on
//! them (`-s 2048`); otherwise on plain memory (`--no-huge -s 2048`), which
//! is said in its notes (hugepages: `echo 1024 > /proc/sys/vm/nr_hugepages`).
//! 2 GiB: SPDK v26.05 cannot fit the benchmark's 1 GiB malloc bdev and its
//! buffer pools in 1 GiB (`malloc_buf spdk_zmalloc() failed`).

use crate::bench::spec::SpdkSpec;
use crate::bench::target::{BenchTarget, Endpoint};
use anyhow::{anyhow, bail, Context};
use nvmf_rpc::client::RpcClient;
use serde_json::{json, Value};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// MiB nvmf_tgt gets (`-s`).
pub const TARGET_MEM_MIB: u64 = 2048;
/// How long nvmf_tgt may take until its listener accepts.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long it may take to exit after spdk_kill_instance / SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Free hugepage memory in MiB from /proc/meminfo's text
/// (HugePages_Free × Hugepagesize); 0 when the lines are missing.
pub fn free_hugepage_mib(meminfo: &str) -> u64 {
    match (
        meminfo_field(meminfo, "HugePages_Free:"),
        meminfo_field(meminfo, "Hugepagesize:"),
    ) {
        (Some(n), Some(kb)) => n * kb / 1024,
        _ => 0,
    }
}

fn meminfo_field(meminfo: &str, name: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
}

/// DPDK leaves /var/run/dpdk/spdk_pid<PID> behind; remove it for a process
/// of ours that has exited.
pub fn remove_dpdk_runtime_dir(pid: u32) {
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/spdk_pid{pid}"));
}

/// SPDK's core list form: "[0,2,3]".
pub fn cpu_list_arg(cpus: &[usize]) -> String {
    let v: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
    format!("[{}]", v.join(","))
}

/// A command line a shell reads back as these words.
pub fn shell_words(words: impl IntoIterator<Item = String>) -> String {
    let quote = |w: String| {
        let plain = !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@+%".contains(c));
        if plain {
            w
        } else {
            format!("'{}'", w.replace('\'', "'\\''"))
        }
    };
    words.into_iter().map(quote).collect::<Vec<_>>().join(" ")
}

/// CPUs for a started target's reactors: the node's CPUs the initiator is
/// not pinned to (all of the node's when that leaves none).
pub fn target_cpus(node_cpus: &[usize], initiator_cpus: &[usize]) -> Vec<usize> {
    let free: Vec<usize> = node_cpus
        .iter()
        .copied()
        .filter(|c| !initiator_cpus.contains(c))
        .collect();
    if free.is_empty() {
        node_cpus.to_vec()
    } else {
        free
    }
}

/// The memory arguments for nvmf_tgt and the note to record, from
/// /proc/meminfo's text.
pub fn memory_args(meminfo: &str) -> (Vec<String>, Option<String>) {
    let free = free_hugepage_mib(meminfo);
    let s = TARGET_MEM_MIB.to_string();
    let page_kb = meminfo_field(meminfo, "Hugepagesize:")
        .unwrap_or(2048)
        .max(1);
    if free >= TARGET_MEM_MIB {
        (vec!["-s".into(), s], None)
    } else {
        (
            vec!["--no-huge".into(), "-s".into(), s],
            Some(format!(
                "nvmf_tgt ran on plain memory (--no-huge -s {TARGET_MEM_MIB}): {free} MiB of hugepages free, {TARGET_MEM_MIB} needed \
                 (for hugepages: echo {} > /proc/sys/vm/nr_hugepages)",
                (TARGET_MEM_MIB * 1024).div_ceil(page_kb)
            )),
        )
    }
}

/// A harness-started SPDK nvmf_tgt.
pub struct SpdkTarget {
    name: String,
    spec: SpdkSpec,
    nsid: u32,
    cpus: Vec<usize>,
    /// Private directory: the RPC socket (unless the spec names one) and the log.
    dir: PathBuf,
    rpc_path: PathBuf,
    child: Option<Child>,
    pid: Option<u32>,
    rpc: Option<RpcClient>,
    /// The bdev behind `nsid` (from nvmf_get_subsystems).
    bdev: Option<String>,
    version: Option<String>,
    notes: Vec<String>,
}

impl SpdkTarget {
    /// `cpus`: the reactor CPUs when the spec gives no `cores` (see
    /// [`target_cpus`]); empty = SPDK's default (core 0).
    pub fn new(name: &str, spec: &SpdkSpec, nsid: u32, cpus: &[usize]) -> SpdkTarget {
        let dir =
            std::env::temp_dir().join(format!("nvmf-bench-spdk-{}-{name}", std::process::id()));
        let rpc_path = spec
            .rpc_socket
            .clone()
            .unwrap_or_else(|| dir.join("rpc.sock"));
        SpdkTarget {
            name: name.to_string(),
            cpus: spec.cores.clone().unwrap_or_else(|| cpus.to_vec()),
            spec: spec.clone(),
            nsid,
            dir,
            rpc_path,
            child: None,
            pid: None,
            rpc: None,
            bdev: None,
            version: None,
            notes: Vec::new(),
        }
    }

    /// The command line it is started with.
    pub fn command(&self, memory: &[String]) -> Vec<String> {
        let mut a = vec![
            self.spec.binary.display().to_string(),
            "--json".into(),
            self.spec.config.display().to_string(),
            "-r".into(),
            self.rpc_path.display().to_string(),
            // Our own socket and CPUs: no clash with another SPDK app's core locks.
            "--disable-cpumask-locks".into(),
        ];
        if !self.cpus.is_empty() {
            a.push("-m".into());
            a.push(cpu_list_arg(&self.cpus));
        }
        a.extend(memory.iter().cloned());
        a
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("nvmf_tgt.log")
    }

    fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        let t = &self.spec.trid;
        let ip: std::net::IpAddr = t.traddr.parse().context("listener traddr")?;
        let port: u16 = t.trsvcid.parse().context("listener trsvcid")?;
        Ok(SocketAddr::new(ip, port))
    }

    /// One JSON-RPC call (connecting on first use; 5 s timeout).
    fn call(&mut self, method: &str, params: Option<&Value>) -> anyhow::Result<Value> {
        if self.rpc.is_none() {
            let mut c = RpcClient::connect(&self.rpc_path, 0)?;
            c.set_timeout(Some(Duration::from_secs(5)))?;
            self.rpc = Some(c);
        }
        let r = self.rpc.as_mut().expect("connected").call(method, params);
        if r.is_err() {
            self.rpc = None;
        }
        r.map_err(|e| anyhow!("nvmf_tgt RPC {method}: {e}"))
    }

    fn start_inner(&mut self) -> anyhow::Result<Endpoint> {
        let addr = self.listen_addr()?;
        if TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok() {
            bail!(
                "target \"{}\": something already listens on {addr} (another target still running?); nvmf_tgt would not get the port",
                self.name
            );
        }
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let (memory, note) = memory_args(&meminfo);
        self.notes.extend(note);
        let argv = self.command(&memory);
        let log = std::fs::File::create(self.log_path())?;
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", argv[0]))?;
        self.pid = Some(child.id());
        self.child = Some(child);
        let until = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "nvmf_tgt exited ({st}) before listening on {addr}\ncommand: {}\n{}",
                    shell_words(argv),
                    self.log_tail()
                );
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            if Instant::now() >= until {
                bail!(
                    "nvmf_tgt did not listen on {addr} within {} s\ncommand: {}\n{}",
                    START_TIMEOUT.as_secs(),
                    shell_words(argv),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Its RPC server may come up just after the listener: wait for it
        // (bounded, 50 × 200 ms).
        let mut c = RpcClient::connect(&self.rpc_path, 50)
            .with_context(|| format!("nvmf_tgt's RPC socket\n{}", self.log_tail()))?;
        c.set_timeout(Some(Duration::from_secs(5)))?;
        self.rpc = Some(c);
        self.version = self
            .call("spdk_get_version", None)
            .ok()
            .and_then(|v| v["version"].as_str().map(String::from));
        let subs = self.call("nvmf_get_subsystems", None)?;
        self.bdev = bdev_of(&subs, &self.spec.trid.subnqn, self.nsid);
        if self.bdev.is_none() {
            bail!(
                "nvmf_tgt: subsystem {} has no namespace {} (check the config's nvmf_subsystem_add_ns, or the target's nsid)",
                self.spec.trid.subnqn,
                self.nsid
            );
        }
        Ok(Endpoint {
            trid: self.spec.trid.clone(),
            nsid: self.nsid,
        })
    }
}

/// The bdev behind namespace `nsid` of subsystem `nqn` in an
/// `nvmf_get_subsystems` result.
pub fn bdev_of(subsystems: &Value, nqn: &str, nsid: u32) -> Option<String> {
    subsystems.as_array()?.iter().find(|s| s["nqn"] == nqn)?["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["nsid"] == nsid)?["bdev_name"]
        .as_str()
        .map(String::from)
}

/// (reads, writes) of a `bdev_get_iostat` result.
pub fn iostat_counts(iostat: &Value) -> Option<(u64, u64)> {
    let b = iostat["bdevs"].as_array()?.first()?;
    Some((b["num_read_ops"].as_u64()?, b["num_write_ops"].as_u64()?))
}

impl BenchTarget for SpdkTarget {
    fn kind(&self) -> &'static str {
        "spdk"
    }

    fn start(&mut self) -> anyhow::Result<Endpoint> {
        let r = self.start_inner();
        if r.is_err() {
            self.stop();
        }
        r
    }

    fn pids(&self) -> Vec<u32> {
        self.pid.into_iter().collect()
    }

    fn cpus(&self) -> Vec<usize> {
        self.cpus.clone()
    }

    fn io_counters(&mut self) -> Option<(u64, u64)> {
        let name = self.bdev.clone()?;
        // SPDK v26.01 replaced the parameter `name` by `names` (a list); older releases
        // (v24.01) know only `name`.
        let v = self
            .call("bdev_get_iostat", Some(&json!({ "names": [&name] })))
            .or_else(|_| self.call("bdev_get_iostat", Some(&json!({ "name": name }))))
            .ok()?;
        iostat_counts(&v)
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }

    fn version(&self) -> String {
        if let Some(v) = &self.version {
            return v.clone();
        }
        Command::new(&self.spec.binary)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .find(|l| l.starts_with("SPDK"))
                    .map(|l| l.trim().to_string())
            })
            .unwrap_or_else(|| "SPDK (version unknown)".into())
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                // Ask nicely, then SIGTERM, then SIGKILL; each bounded.
                let _ = self.call(
                    "spdk_kill_instance",
                    Some(&json!({ "sig_name": "SIGTERM" })),
                );
                self.rpc = None;
                let mut exited = wait_exit(&mut child, STOP_GRACE);
                if !exited {
                    // SAFETY: kill(2) on our own unreaped child.
                    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                    exited = wait_exit(&mut child, STOP_GRACE);
                }
                if !exited {
                    let _ = child.kill();
                }
            }
            let _ = child.wait();
            remove_dpdk_runtime_dir(child.id());
            // A killed nvmf_tgt leaves its socket and lock file.
            let _ = std::fs::remove_file(&self.rpc_path);
            let mut lock = self.rpc_path.clone().into_os_string();
            lock.push(".lock");
            let _ = std::fs::remove_file(lock);
        }
        self.rpc = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for SpdkTarget {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wait_exit(child: &mut Child, grace: Duration) -> bool {
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Does `p` look like an SPDK tree's `build/bin` (for tests and help)?
pub fn spdk_bin(dir: &Path, app: &str) -> Option<PathBuf> {
    let p = dir.join("build/bin").join(app);
    p.is_file().then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal: 8000000 kB\nHugePages_Total:    2048\nHugePages_Free:      300\nHugepagesize:       2048 kB\n";

    #[test]
    fn hugepages_decide_the_memory_arguments() {
        assert_eq!(free_hugepage_mib(MEMINFO), 600);
        assert_eq!(free_hugepage_mib("MemTotal: 1 kB\n"), 0);
        let (a, note) = memory_args(MEMINFO);
        assert_eq!(a, ["--no-huge", "-s", "2048"]);
        let note = note.unwrap();
        assert!(
            note.contains("600 MiB") && note.contains("echo 1024 > /proc/sys/vm/nr_hugepages"),
            "{note}"
        );
        let (a, note) = memory_args(&MEMINFO.replace("Free:      300", "Free:     1024"));
        assert_eq!((a, note), (vec!["-s".to_string(), "2048".into()], None));
    }

    #[test]
    fn rpc_results_give_the_bdev_and_its_counters() {
        let subs = json!([
            {"nqn": "nqn.2014-08.org.nvmexpress.discovery", "namespaces": []},
            {"nqn": "nqn.x:1", "namespaces": [
                {"nsid": 1, "bdev_name": "Malloc0"}, {"nsid": 2, "bdev_name": "Null0"}]}
        ]);
        assert_eq!(bdev_of(&subs, "nqn.x:1", 2).as_deref(), Some("Null0"));
        assert_eq!(bdev_of(&subs, "nqn.x:1", 3), None);
        assert_eq!(bdev_of(&subs, "nqn.y", 1), None);
        let st = json!({"tick_rate": 1, "bdevs": [{"name": "Null0", "num_read_ops": 268358, "num_write_ops": 88770}]});
        assert_eq!(iostat_counts(&st), Some((268358, 88770)));
        assert_eq!(iostat_counts(&json!({"bdevs": []})), None);
    }

    #[test]
    fn command_line_and_cpus() {
        assert_eq!(target_cpus(&[0, 1, 2, 3], &[1]), [0, 2, 3]);
        assert_eq!(target_cpus(&[0, 1], &[0, 1]), [0, 1]);
        let spec = SpdkSpec {
            binary: "/spdk/nvmf_tgt".into(),
            config: "/c/spdk.json".into(),
            addr: "127.0.0.1".into(),
            trid: crate::trid::TransportId::tcp("127.0.0.1", "4540", "nqn.x:1"),
            cores: None,
            rpc_socket: None,
        };
        let t = SpdkTarget::new("s", &spec, 1, &[2, 3]);
        let c = shell_words(t.command(&["--no-huge".into(), "-s".into(), "1024".into()]));
        assert!(
            c.starts_with("/spdk/nvmf_tgt --json /c/spdk.json -r /")
                && c.ends_with("/rpc.sock --disable-cpumask-locks -m '[2,3]' --no-huge -s 1024"),
            "{c}"
        );
        let t = SpdkTarget::new(
            "s",
            &SpdkSpec {
                cores: Some(vec![5]),
                rpc_socket: Some("/r.sock".into()),
                ..spec
            },
            1,
            &[2, 3],
        );
        assert_eq!(t.cpus(), [5]);
        assert!(t
            .command(&[])
            .join(" ")
            .contains("-r /r.sock --disable-cpumask-locks -m [5]"));
        assert_eq!(
            shell_words(["a b".to_string(), "it's".into(), "x".into()]),
            "'a b' 'it'\\''s' x"
        );
    }
}
