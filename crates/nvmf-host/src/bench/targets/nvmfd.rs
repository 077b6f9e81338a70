//! bench/targets/nvmfd.rs — an nvmfd the harness starts and stops itself:
//! the binary from `--nvmfd`, else the `nvmfd` next to the running `nvmf`,
//! else on PATH; started with the spec's config, a private RPC socket and
//! log in a temp dir, its reactors pinned (`--cores`) to CPUs of the NIC's
//! node that the initiator does not use (when none is left: the node's
//! CPUs, shared); ready once it is alive, its RPC socket answers and the
//! config's listener accepts (bounded); stopped with SIGTERM, then SIGKILL
//! (bounded). The endpoint is the first subsystem of the config and its
//! first listener; I/O counters come from `nvmf_get_stats` (reads and
//! writes summed over the poll groups, closed connections included).

use super::TargetOptions;
use crate::bench::placement::format_cpulist;
use crate::bench::target::{BenchTarget, Endpoint};
use crate::trid::TransportId;
use anyhow::{anyhow, bail, Context};
use nvmf_rpc::RpcClient;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long nvmfd may take to serve after it was started.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long nvmfd may take to exit after SIGTERM before it gets SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

pub struct NvmfdTarget {
    name: String,
    config: PathBuf,
    addr: String,
    opts: TargetOptions,
    child: Option<Child>,
    dir: Option<PathBuf>,
    rpc: Option<RpcClient>,
    cpus: Vec<usize>,
    version: String,
    /// More nvmfd options from the spec (`args`).
    args: Vec<String>,
}

impl NvmfdTarget {
    pub fn new(name: &str, config: &Path, addr: &str, opts: &TargetOptions) -> NvmfdTarget {
        NvmfdTarget {
            name: name.to_string(),
            config: config.to_path_buf(),
            addr: addr.to_string(),
            opts: opts.clone(),
            child: None,
            dir: None,
            rpc: None,
            cpus: Vec::new(),
            version: String::new(),
            args: Vec::new(),
        }
    }

    /// More nvmfd options (the spec's `args`).
    pub fn with_args(mut self, args: &[String]) -> NvmfdTarget {
        self.args = args.to_vec();
        self
    }

    fn binary(&self) -> anyhow::Result<PathBuf> {
        if let Some(p) = &self.opts.nvmfd {
            if !p.is_file() {
                bail!("--nvmfd {}: no such file", p.display());
            }
            return Ok(p.clone());
        }
        if let Some(p) = std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.join("nvmfd")))
            .filter(|p| p.is_file())
        {
            return Ok(p);
        }
        std::env::var_os("PATH")
            .and_then(|path| {
                std::env::split_paths(&path)
                    .map(|d| d.join("nvmfd"))
                    .find(|p| p.is_file())
            })
            .ok_or_else(|| {
                anyhow!("nvmfd not found (not next to nvmf, not on PATH): give --nvmfd PATH")
            })
    }

    fn log_tail(&self) -> String {
        let Some(d) = &self.dir else {
            return String::new();
        };
        let text = std::fs::read_to_string(d.join("nvmfd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n    ")
    }

    fn kill_child(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        if let Ok(None) = c.try_wait() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if let Ok(None) = c.try_wait() {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

/// What the config says to connect to: the first subsystem, its first
/// listener (a wildcard address replaced by `addr`) and first namespace.
pub fn endpoint_of(cfg: &nvmf_config::TargetConfig, addr: &str) -> anyhow::Result<Endpoint> {
    let Some(s) = cfg.subsystems.first() else {
        bail!("the config has no subsystem (nvmf_create_subsystem): nothing to measure");
    };
    let Some(l) = s.listeners.first() else {
        bail!(
            "subsystem {} has no listener (nvmf_subsystem_add_listener): nothing to connect to",
            s.nqn
        );
    };
    let Some(ns) = s.namespaces.first() else {
        bail!(
            "subsystem {} has no namespace (nvmf_subsystem_add_ns): nothing to measure",
            s.nqn
        );
    };
    let traddr = match l.traddr.as_str() {
        "0.0.0.0" | "::" | "[::]" => addr,
        a => a,
    };
    let trid = TransportId::parse(&format!(
        "trtype:TCP adrfam:{} traddr:{traddr} trsvcid:{} subnqn:{}",
        l.adrfam.as_str(),
        l.trsvcid,
        s.nqn
    ))
    .map_err(|e| anyhow!("the config's listener: {e}"))?;
    Ok(Endpoint {
        trid,
        nsid: ns.nsid,
    })
}

/// Reactor CPUs: the node's CPUs the initiator does not use; when none is
/// left, all of the node's (shared).
pub fn reactor_cpus(node: &[usize], initiator: &[usize]) -> Vec<usize> {
    let free: Vec<usize> = node
        .iter()
        .copied()
        .filter(|c| !initiator.contains(c))
        .collect();
    if free.is_empty() {
        node.to_vec()
    } else {
        free
    }
}

fn socket_addr(t: &TransportId) -> anyhow::Result<SocketAddr> {
    let host = t.traddr.trim_start_matches('[').trim_end_matches(']');
    (host, t.trsvcid.parse::<u16>().context("trsvcid")?)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow!("{}:{} does not resolve", t.traddr, t.trsvcid))
}

/// Sum of `reads` / `writes` over `nvmf_get_stats`' poll groups.
pub fn counters_of(stats: &serde_json::Value) -> Option<(u64, u64)> {
    let groups = stats.get("poll_groups")?.as_array()?;
    let (mut r, mut w) = (0u64, 0u64);
    for g in groups {
        for t in g.get("transports")?.as_array()? {
            r += t.get("reads")?.as_u64()?;
            w += t.get("writes")?.as_u64()?;
        }
    }
    Some((r, w))
}

impl BenchTarget for NvmfdTarget {
    fn kind(&self) -> &'static str {
        "nvmfd"
    }

    fn start(&mut self) -> anyhow::Result<Endpoint> {
        let cfg = nvmf_config::load_file(&self.config)
            .map_err(|e| anyhow!("nvmfd config {}: {e}", self.config.display()))?;
        let ep = endpoint_of(&cfg, &self.addr)
            .with_context(|| format!("nvmfd config {}", self.config.display()))?;
        let listen = socket_addr(&ep.trid)?;
        let bin = self.binary()?;
        self.version = Command::new(&bin)
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown".into());
        let dir =
            std::env::temp_dir().join(format!("nvmf-bench-{}-{}", std::process::id(), self.name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        self.dir = Some(dir.clone());
        let sock = dir.join("rpc.sock");
        let log = std::fs::File::create(dir.join("nvmfd.log"))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("-c")
            .arg(&self.config)
            .arg("-r")
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if !self.opts.no_pin && !self.opts.node_cpus.is_empty() {
            self.cpus = reactor_cpus(&self.opts.node_cpus, &self.opts.initiator_cpus);
            cmd.arg("--cores").arg(format_cpulist(&self.cpus));
        }
        cmd.args(&self.args);
        // Own process group: a Ctrl-C on the terminal goes to `nvmf` only,
        // which stops the run and then this target itself.
        cmd.process_group(0);
        // SAFETY: prctl is async-signal-safe; the child dies with us if we
        // are killed (a second Ctrl-C) instead of staying behind.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                bail!(
                    "nvmfd exited ({st}) before serving; its log ({}):\n    {}",
                    dir.join("nvmfd.log").display(),
                    self.log_tail()
                );
            }
            if self.rpc.is_none() {
                self.rpc = RpcClient::connect(&sock, 0).ok();
            }
            if self.rpc.is_some()
                && TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_ok()
            {
                break;
            }
            if Instant::now() >= deadline {
                self.kill_child();
                bail!(
                    "nvmfd did not serve {listen} within {} s; its log:\n    {}",
                    START_TIMEOUT.as_secs(),
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(r) = self.rpc.as_mut() {
            let _ = r.set_timeout(Some(Duration::from_secs(5)));
        }
        Ok(ep)
    }

    fn pids(&self) -> Vec<u32> {
        self.child.iter().map(|c| c.id()).collect()
    }

    fn cpus(&self) -> Vec<usize> {
        self.cpus.clone()
    }

    fn io_counters(&mut self) -> Option<(u64, u64)> {
        let v = self.rpc.as_mut()?.call("nvmf_get_stats", None).ok()?;
        counters_of(&v)
    }

    fn version(&self) -> String {
        self.version.clone()
    }

    fn stop(&mut self) {
        self.rpc = None;
        self.kill_child();
        if let Some(d) = self.dir.take() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

impl Drop for NvmfdTarget {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_from_the_first_subsystem() {
        let cfg = nvmf_config::TargetConfig::from_json_str(
            r#"{"subsystems":[{"subsystem":"bdev","config":[
              {"method":"bdev_malloc_create","params":{"name":"M0","block_size":512,"num_blocks":2048}}]},
             {"subsystem":"nvmf","config":[
              {"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
              {"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2024-01.io.nvmfd:b","allow_any_host":true}},
              {"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2024-01.io.nvmfd:b","namespace":{"nsid":3,"bdev_name":"M0"}}},
              {"method":"nvmf_subsystem_add_listener","params":{"nqn":"nqn.2024-01.io.nvmfd:b",
                "listen_address":{"trtype":"TCP","adrfam":"IPv4","traddr":"0.0.0.0","trsvcid":"4510"}}}]}]}"#,
        )
        .unwrap();
        let ep = endpoint_of(&cfg, "127.0.0.1").unwrap();
        assert_eq!(ep.nsid, 3);
        assert_eq!(ep.trid.traddr, "127.0.0.1");
        assert_eq!(ep.trid.trsvcid, "4510");
        assert_eq!(ep.trid.subnqn, "nqn.2024-01.io.nvmfd:b");
        let empty = nvmf_config::TargetConfig::from_json_str(r#"{"subsystems":[]}"#).unwrap();
        let e = endpoint_of(&empty, "127.0.0.1").unwrap_err().to_string();
        assert!(e.contains("no subsystem"), "{e}");
    }

    #[test]
    fn reactors_avoid_the_initiator_cpus() {
        assert_eq!(reactor_cpus(&[0, 1, 2, 3], &[0, 1]), [2, 3]);
        // Nothing left: share the node's CPUs.
        assert_eq!(reactor_cpus(&[0, 1], &[0, 1]), [0, 1]);
    }

    #[test]
    fn counters_sum_the_poll_groups() {
        let v = serde_json::json!({"poll_groups": [
            {"transports": [{"reads": 5, "writes": 1}]},
            {"transports": [{"reads": 7, "writes": 2}]}]});
        assert_eq!(counters_of(&v), Some((12, 3)));
        assert_eq!(counters_of(&serde_json::json!({})), None);
    }
}
