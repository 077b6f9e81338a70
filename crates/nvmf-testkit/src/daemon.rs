//! [`Daemon`]: the real `nvmfd` started for a test. [`DaemonBuilder`] writes the config JSON
//! to `nvmfd.json` in the daemon's directory (a fresh [`TestDir`] removed on drop, or one
//! the test names and keeps), runs `nvmfd -c nvmfd.json -r rpc.sock [args]` as a
//! [`Process`] and waits until it logged `listening on ...:PORT` for every port named with
//! [`DaemonBuilder::listening`] (panicking with its log if it exits or times out first).
//! [`Daemon::rpc`] talks to it through `nvmf rpc -s rpc.sock`.

use std::ffi::OsString;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::{run_bounded, Process};
use crate::{bins, text, TestDir};

/// How to start an nvmfd (see the top comment).
pub struct DaemonBuilder {
    config: String,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    ports: Vec<u16>,
    limit: Duration,
    dir: Option<PathBuf>,
    log_file: bool,
    stop_grace: Option<Duration>,
}

impl DaemonBuilder {
    /// More command-line arguments after `-c CONFIG -r SOCKET` (e.g. `-m 0`).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable for the daemon (RUST_LOG is removed unless set here).
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Ready once `listening on ...:port` is logged (for each port given).
    pub fn listening(mut self, ports: &[u16]) -> Self {
        self.ports.extend_from_slice(ports);
        self
    }

    /// How long to wait for readiness (default 20 s).
    pub fn ready_within(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// Use (create, keep) `dir` instead of a fresh temporary directory, and copy the
    /// daemon's output to `dir/nvmfd.log` (kept for debugging).
    pub fn in_dir(mut self, dir: &Path) -> Self {
        self.dir = Some(dir.to_path_buf());
        self.log_file = true;
        self
    }

    /// On drop, SIGTERM and up to `grace` to exit before SIGKILL (default: SIGKILL at once).
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = Some(grace);
        self
    }

    pub fn start(self) -> Daemon {
        let (dir, owned) = match &self.dir {
            Some(d) => {
                std::fs::create_dir_all(d).expect("create daemon dir");
                (d.clone(), None)
            }
            None => {
                let t = TestDir::new("nvmfd");
                (t.path().to_path_buf(), Some(t))
            }
        };
        let config = dir.join("nvmfd.json");
        std::fs::write(&config, &self.config).expect("write nvmfd config");
        let rpc_socket = dir.join("rpc.sock");
        let log_path = self.log_file.then(|| dir.join("nvmfd.log"));
        if let Some(p) = &log_path {
            // A restart in the same directory starts a fresh log.
            std::fs::File::create(p).expect("create nvmfd.log");
        }
        let bin = bins::nvmfd();
        let mut cmd = Command::new(&bin);
        cmd.arg("-c")
            .arg(&config)
            .arg("-r")
            .arg(&rpc_socket)
            .args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut proc = Process::spawn_logged(&mut cmd, log_path.as_deref());
        proc.stop_grace = self.stop_grace;
        let mut d = Daemon {
            proc,
            ports: self.ports.clone(),
            config,
            rpc_socket,
            log_path,
            _dir: owned,
        };
        let deadline = Instant::now() + self.limit;
        for p in &self.ports {
            let want = format!(":{p}");
            loop {
                let ready = d
                    .log
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|l| l.contains("listening on") && l.contains(&want));
                if ready {
                    break;
                }
                if !d.running() || Instant::now() > deadline {
                    let why = match d.try_exit() {
                        Some(st) => format!("exited ({st})"),
                        None => format!(
                            "did not log `listening on ...{want}` within {:?}",
                            self.limit
                        ),
                    };
                    panic!(
                        "nvmfd ({} -c {}) {why}\n---- nvmfd log ----\n{}\n---- config ----\n{}",
                        bin.display(),
                        d.config.display(),
                        d.logs(),
                        self.config
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        d
    }
}

/// A running nvmfd (see the top comment); a [`Process`] (log, kill, wait) by deref. Killed
/// on drop, then its temporary directory (config, socket) removed.
pub struct Daemon {
    proc: Process,
    /// The ports it was started listening on.
    pub ports: Vec<u16>,
    /// Its config file.
    pub config: PathBuf,
    /// Its JSON-RPC socket (`-r`).
    pub rpc_socket: PathBuf,
    /// Where its output is copied (with [`DaemonBuilder::in_dir`]).
    pub log_path: Option<PathBuf>,
    // Declared after `proc`: the daemon is stopped before its directory goes.
    _dir: Option<TestDir>,
}

impl Daemon {
    /// An nvmfd with config `config` (SPDK `save_config`-shaped JSON).
    pub fn builder(config: impl Into<String>) -> DaemonBuilder {
        DaemonBuilder {
            config: config.into(),
            args: Vec::new(),
            env: Vec::new(),
            ports: Vec::new(),
            limit: Duration::from_secs(20),
            dir: None,
            log_file: false,
            stop_grace: None,
        }
    }

    /// Starts `config` with `args`, ready once listening on every port of `ports`.
    pub fn start(config: impl Into<String>, args: &[&str], ports: &[u16]) -> Daemon {
        Daemon::builder(config).args(args).listening(ports).start()
    }

    /// The first port it was started listening on.
    pub fn port(&self) -> u16 {
        self.ports[0]
    }

    /// `nvmf rpc -s SOCKET ARGS...` with a 30 s bound: Ok(stdout) on exit status 0,
    /// Err(the command, its status, stdout and stderr) otherwise.
    pub fn rpc(&self, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(bins::nvmf());
        cmd.arg("rpc").arg("-s").arg(&self.rpc_socket).args(args);
        let out = run_bounded(cmd, Duration::from_secs(30));
        let so = text(&out.stdout);
        if out.status.success() {
            Ok(so)
        } else {
            Err(format!(
                "nvmf rpc {args:?}: {}\n{so}{}",
                out.status,
                text(&out.stderr)
            ))
        }
    }

    /// [`Daemon::rpc`] that must succeed (panics with the failure otherwise).
    pub fn rpc_ok(&self, args: &[&str]) -> String {
        self.rpc(args).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Deref for Daemon {
    type Target = Process;
    fn deref(&self) -> &Process {
        &self.proc
    }
}

impl DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.proc
    }
}
