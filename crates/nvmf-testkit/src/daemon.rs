//! [`Daemon`]: the real `nvmfd` started for a test. [`DaemonBuilder`] writes the config JSON
//! to `nvmfd.json` in the daemon's directory (a fresh [`TestDir`] removed on drop, or one
//! the test names and keeps), runs `nvmfd -c nvmfd.json -r rpc.sock [args]` as a
//! [`Process`] and waits until it logged `listening on ...:PORT` for every port named with
//! [`DaemonBuilder::listening`] and every line named with [`DaemonBuilder::ready_when`]
//! (panicking with its log if it exits or times out first; [`DaemonBuilder::try_start`]
//! returns that instead, and [`Daemon::start_on_free_port`] retries on a port a parallel
//! test took first). [`Daemon::rpc`] talks to it through `nvmf rpc -s rpc.sock`.

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
    ready: Vec<String>,
    limit: Duration,
    dir: Option<PathBuf>,
    log_file: bool,
    stop_grace: Option<Duration>,
    netns: Option<String>,
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

    /// Ready once a line containing `needle` is logged (as well as the listening lines).
    pub fn ready_when(mut self, needle: &str) -> Self {
        self.ready.push(needle.to_string());
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

    /// Runs it in network namespace `name` (`ip netns exec`, which execs it: the process is
    /// nvmfd itself, for signals and its exit status), e.g. a [`crate::CuttableNetns`].
    pub fn in_netns(mut self, name: &str) -> Self {
        self.netns = Some(name.to_string());
        self
    }

    /// Starts it; panics (with its log and config) if it exits or is not ready in time.
    pub fn start(self) -> Daemon {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts it; Err(what happened, its log, its config) if it exits or is not ready in
    /// time (the daemon is gone then).
    pub fn try_start(self) -> Result<Daemon, String> {
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
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
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
        let listening = self.ports.iter().map(|p| format!(":{p}"));
        let mut waits: Vec<(bool, String)> = listening.map(|w| (true, w)).collect();
        waits.extend(self.ready.iter().map(|r| (false, r.clone())));
        for (is_port, want) in &waits {
            loop {
                let ready =
                    d.log.lock().unwrap().iter().any(|l| {
                        l.contains(want.as_str()) && (!is_port || l.contains("listening on"))
                    });
                if ready {
                    break;
                }
                if !d.running() || Instant::now() > deadline {
                    let what = if *is_port {
                        format!("`listening on ...{want}`")
                    } else {
                        format!("{want:?}")
                    };
                    let why = match d.try_exit() {
                        Some(st) => format!("exited ({st}) before logging {what}"),
                        None => format!("did not log {what} within {:?}", self.limit),
                    };
                    d.kill();
                    return Err(format!(
                        "nvmfd ({} -c {}) {why}\n---- nvmfd log ----\n{}\n---- config ----\n{}",
                        bin.display(),
                        d.config.display(),
                        d.logs(),
                        self.config
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(d)
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
            ready: Vec::new(),
            limit: Duration::from_secs(20),
            dir: None,
            log_file: false,
            stop_grace: None,
            netns: None,
        }
    }

    /// Starts `config` with `args`, ready once listening on every port of `ports`.
    pub fn start(config: impl Into<String>, args: &[&str], ports: &[u16]) -> Daemon {
        Daemon::builder(config).args(args).listening(ports).start()
    }

    /// Starts `make(port)` for a free `port`; when that daemon exits with "Address already
    /// in use" (a parallel test took the port first), tries again with another port (5
    /// tries in all). Panics on any other failure.
    pub fn start_on_free_port(make: impl Fn(u16) -> DaemonBuilder) -> Daemon {
        let mut last = String::new();
        for _ in 0..5 {
            match make(crate::free_port()).try_start() {
                Ok(d) => return d,
                Err(e) if e.contains("Address already in use") => last = e,
                Err(e) => panic!("{e}"),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("no free port for nvmfd after 5 tries; the last:\n{last}");
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::OnceLock;

    /// A stand-in nvmfd (`$NVMFD_BIN`, a script in target/<profile>/): writes its config
    /// file to stderr as its log, exits 1 if the config says `exit`, else sleeps. Only this
    /// module's tests start a daemon, so setting the variable here touches no other test.
    fn fake_nvmfd() {
        static DONE: OnceLock<()> = OnceLock::new();
        DONE.get_or_init(|| {
            let bin = bins::profile_dir().join("nvmf-testkit-fake-nvmfd");
            std::fs::write(
                &bin,
                "#!/bin/sh\ncat \"$2\" >&2\ngrep -q exit \"$2\" && exit 1\nexec sleep 30\n",
            )
            .unwrap();
            std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::env::set_var("NVMFD_BIN", &bin);
        });
    }

    #[test]
    fn ready_once_listening_and_gone_on_drop() {
        fake_nvmfd();
        let d = Daemon::builder("x\nlistening on 127.0.0.1:4420 (tcp)\nRPC server up\n")
            .listening(&[4420])
            .ready_when("RPC server up")
            .start();
        assert!(d.config.is_file());
        assert_eq!(d.rpc_socket.parent(), d.config.parent());
        let dir = d.config.parent().unwrap().to_path_buf();
        let pid = d.pid();
        drop(d);
        assert!(!dir.exists(), "its directory is removed");
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(!st.contains("(sleep)"), "still running: {st}");
    }

    #[test]
    fn not_ready_is_an_error_with_the_log() {
        fake_nvmfd();
        let e = Daemon::builder("listening on 127.0.0.1:1 (tcp)\nno more\n")
            .listening(&[2])
            .ready_within(Duration::from_millis(300))
            .try_start()
            .err()
            .expect("not ready");
        assert!(e.contains("did not log `listening on ...:2`"), "{e}");
        assert!(e.contains("no more"), "{e}");
        let e = Daemon::builder("Address already in use\nexit\n")
            .listening(&[3])
            .try_start()
            .err()
            .expect("exited");
        assert!(e.contains("exited (exit status: 1)"), "{e}");
    }
}
