//! Scaffolding shared by nvmfd's integration tests (`mod common;` in each
//! tests/*.rs). It owns what every test file needs around the real daemon:
//! a free TCP port, the path of the `nvmf` CLI (built on demand), running a
//! command under a time limit, the host's transport ID string, and
//! [`Nvmfd`]: a spawned `nvmfd` whose stderr lines are collected by a
//! thread and which is killed on drop. Each test file keeps its own
//! `Daemon` (its `-m`/`-r`/`-c` arguments, config and readiness rules) on
//! top of it. Also the measurements the hostile_* tests share: [`p99`] of
//! a latency sample and [`rss`] of a process. Not every test file uses
//! every item. The raw-socket NVMe/TCP host is in `common/raw_sock.rs`,
//! included only by the files that also include nvmf-tcp's test codec.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A port that was free when asked (a parallel test may take it before
/// nvmfd binds it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// target/<profile>/nvmf, built on demand.
pub fn nvmf_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("nvmf");
    if !p.exists() {
        let st = Command::new(env!("CARGO"))
            .args(["build", "-p", "nvmf-host", "--bin", "nvmf"])
            .status()
            .expect("cargo build -p nvmf-host");
        assert!(st.success(), "building the nvmf CLI failed");
    }
    p
}

/// Runs `cmd` (stdin closed, output captured), killing it and panicking if
/// it runs past `limit`.
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The transport ID `nvmf perf`/`nvmf identify` take for `nqn` on
/// 127.0.0.1:`port`.
pub fn trid(port: u16, nqn: &str) -> String {
    format!("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}")
}

/// A spawned `nvmfd` process: its stderr lines are collected by a thread;
/// killed (and reaped) on drop.
pub struct Nvmfd {
    pub child: Child,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Nvmfd {
    /// Spawns `cmd` (the nvmfd binary with the caller's arguments and
    /// environment) without RUST_LOG, stdin and stdout closed, stderr
    /// collected.
    pub fn spawn(cmd: &mut Command) -> Nvmfd {
        let mut child = cmd
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nvmfd");
        let log = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().unwrap();
        let l2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                l2.lock().unwrap().push(line);
            }
        });
        Nvmfd { child, log }
    }

    /// `Command::new(nvmfd)`.
    pub fn command() -> Command {
        Command::new(env!("CARGO_BIN_EXE_nvmfd"))
    }

    pub fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Whether some log line so far contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Waits (20 s at most) for a log line containing `needle`.
    pub fn wait_log(&self, needle: &str) {
        let start = Instant::now();
        while !self.logs().contains(needle) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nvmfd never logged {needle:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `limit` for a log line containing `ready`: true once
    /// logged, false if the process exits first or time runs out.
    pub fn wait_ready(&mut self, ready: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.logged(ready) {
                return true;
            }
            if self.child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills and reaps the process (also done on drop).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nvmfd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The 99th percentile of `lat` (sorted in place; must not be empty).
pub fn p99(lat: &mut [Duration]) -> Duration {
    assert!(!lat.is_empty());
    lat.sort_unstable();
    lat[(lat.len() * 99 / 100).min(lat.len() - 1)]
}

/// Resident memory (VmRSS) of process `pid` in bytes.
pub fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let line = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS value");
    kib * 1024
}
