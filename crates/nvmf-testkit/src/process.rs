//! A child process as tests need it: [`Process`] (spawned with stdin closed, stderr lines
//! collected by a thread and optionally copied to a log file, SIGTERM when the spawning
//! thread ends so nothing outlives a killed test binary, killed and reaped on drop) and
//! one-shot commands under a time limit ([`run_bounded`], [`nvmf`]).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::text;

/// Makes the child get `sig` when the thread that spawned it exits (prctl
/// PR_SET_PDEATHSIG), so nothing a test starts outlives a test binary that is killed
/// outright (normally Drop stops it first).
pub fn die_with_parent(cmd: &mut Command, sig: i32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0);
            Ok(())
        });
    }
}

/// Sends `sig` to a child we spawned and have not reaped.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: plain kill(2) on the pid of our own unreaped child.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// Stops a child: SIGTERM, up to `grace` to exit, then SIGKILL; always reaps it.
pub fn stop_child(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    signal(child, libc::SIGTERM);
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait().ok()
}

/// A spawned child whose stderr lines are collected (see the top comment).
pub struct Process {
    pub child: Child,
    /// Every stderr line so far.
    pub log: Arc<Mutex<Vec<String>>>,
    exit: Option<ExitStatus>,
    /// On drop: SIGTERM and this long to exit before SIGKILL; `None`: SIGKILL at once.
    pub stop_grace: Option<Duration>,
}

impl Process {
    /// Spawns `cmd` with stdin and stdout closed and stderr collected. Unless `cmd` sets
    /// RUST_LOG itself, the child runs without it (the daemon's default log level).
    pub fn spawn(cmd: &mut Command) -> Process {
        Process::spawn_logged(cmd, None)
    }

    /// [`Process::spawn`], also appending stdout and every stderr line to `log_file`.
    pub fn spawn_logged(cmd: &mut Command, log_file: Option<&Path>) -> Process {
        if !cmd.get_envs().any(|(k, _)| k == "RUST_LOG") {
            cmd.env_remove("RUST_LOG");
        }
        let mut file = log_file.map(append);
        let stdout = match &file {
            Some(f) => Stdio::from(f.try_clone().expect("dup log file")),
            None => Stdio::null(),
        };
        die_with_parent(cmd, libc::SIGTERM);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {:?}: {e}", cmd.get_program()));
        let log = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().unwrap();
        let l2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if let Some(f) = file.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
                l2.lock().unwrap().push(line);
            }
        });
        Process {
            child,
            log,
            exit: None,
            stop_grace: None,
        }
    }

    /// The stderr lines so far, joined.
    pub fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// How many stderr lines so far.
    pub fn log_lines(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// Whether some line so far contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Waits (20 s at most) for a line containing `needle`; panics with the log otherwise.
    pub fn wait_log(&self, needle: &str) {
        self.wait_log_for(needle, Duration::from_secs(20))
    }

    /// Waits up to `limit` for a line containing `needle`; panics with the log otherwise.
    pub fn wait_log_for(&self, needle: &str, limit: Duration) {
        let start = Instant::now();
        while !self.logged(needle) {
            assert!(
                start.elapsed() < limit,
                "nvmfd never logged {needle:?} within {limit:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `limit` for a line containing `ready`: true once logged, false if the
    /// process exits first or time runs out.
    pub fn wait_ready(&mut self, ready: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.logged(ready) {
                return true;
            }
            if !self.running() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Whether the process has not exited (its status is kept once it has).
    pub fn running(&mut self) -> bool {
        self.try_exit().is_none()
    }

    /// Its exit status, if it has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exit = Some(st);
            }
        }
        self.exit
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(st) = self.try_exit() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` (if it has not been reaped).
    pub fn signal(&mut self, sig: i32) {
        if self.exit.is_none() {
            signal(&self.child, sig);
        }
    }

    /// `kill -9` and reap (a crash: no teardown). Also what drop does by default.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        if let Ok(st) = self.child.wait() {
            self.exit.get_or_insert(st);
        }
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL; reaps it.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = stop_child(&mut self.child, grace);
        }
        self.exit
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        match self.stop_grace {
            Some(g) => {
                self.stop(g);
            }
            None => self.kill(),
        }
    }
}

/// Runs `cmd` (stdin closed, output captured), killing it and panicking if it runs past
/// `limit` (the panic shows what it wrote so far).
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"));
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} ran past {limit:?}\nstdout:\n{}\nstderr:\n{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Runs the `nvmf` CLI with `args` under `limit` (see [`run_bounded`]).
pub fn nvmf(args: &[&str], limit: Duration) -> Output {
    let mut cmd = Command::new(crate::bins::nvmf());
    cmd.args(args);
    run_bounded(cmd, limit)
}

/// Spawns the `nvmf` CLI with `args` (stdin closed, output captured), for a run a test
/// does something during; finish it with [`wait_bounded`].
pub fn spawn_nvmf(args: &[&str]) -> Child {
    Command::new(crate::bins::nvmf())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvmf")
}

/// Waits for `child` (spawned with captured output); kills it and panics, showing its
/// output and `what`, after `limit`.
pub fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} still running after {limit:?}\nstdout:\n{}\nstderr:\n{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Opens (creating) `path` for appending: a log file several writers share.
pub fn append(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collects_stderr_and_kills_on_drop() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo one >&2; echo two >&2; exec sleep 30"]);
        let p = Process::spawn(&mut cmd);
        p.wait_log_for("two", Duration::from_secs(10));
        assert_eq!(p.logs(), "one\ntwo");
        let pid = p.pid();
        drop(p);
        // Reaped: the pid is gone (or reused by an unrelated process, not a zombie of ours).
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(!st.contains("(sleep)"), "still there: {st}");
    }

    #[test]
    fn wait_ready_is_false_when_the_process_exits() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo starting >&2; exit 3"]);
        let mut p = Process::spawn(&mut cmd);
        let t = Instant::now();
        assert!(!p.wait_ready("listening", Duration::from_secs(10)));
        assert!(t.elapsed() < Duration::from_secs(5), "waited out the limit");
        assert_eq!(p.wait_exit(Duration::from_secs(5)).unwrap().code(), Some(3));
    }

    #[test]
    #[should_panic(expected = "ran past")]
    fn run_bounded_panics_past_its_limit() {
        let mut cmd = Command::new("sleep");
        cmd.arg("10");
        run_bounded(cmd, Duration::from_millis(200));
    }
}
