//! One two-guest soft-RoCE interop case from start to verdict, so each RDMA test file says only
//! what it tests.
//!
//! Every such test does the same around its own scenario: take the interop switch and the serial
//! lock, make a work dir and an [`RxeLink`], start a listening guest (nvmfd, an RDMA server, or
//! the kernel target) and wait for it to serve, run a scenario in the connecting guest with no
//! checkpoints, tell the listening guest to stop (`/job/stop`) and collect what it left, print
//! one summary line, and fail with both guests' reports. [`RdmaCase`] owns those steps; the
//! environments the scripts share (`ROLE`/`PORT`/`NQN`, `TARGET_IP`/`HOSTNQN`) come from
//! [`RdmaCase::target_env`] and [`RdmaCase::host_env`].

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use crate::rdma::RDMA_PORT;
use crate::{
    begin, host_nqn, nvmf_binary, nvmfd_binary, run_guest_rxe, say, work_dir, GuestRun, Kernel,
    KernelTarget, ListenGuest, RxeLink,
};

/// The verdict of a guest scenario: exit status 0 and the script's last line.
pub fn guest_passed(r: &GuestRun) -> bool {
    r.status == 0 && r.stdout.contains("ALL STEPS PASSED")
}

/// The scenario's first `FAIL:` line, or a pointer to the report.
pub fn first_fail(r: &GuestRun) -> &str {
    r.stdout
        .lines()
        .find(|l| l.starts_with("FAIL:"))
        .unwrap_or("(no FAIL line; see the report)")
}

/// A running two-guest case: its name (the test's), work dir and link; holds the interop lock.
pub struct RdmaCase {
    pub name: &'static str,
    pub dir: PathBuf,
    pub link: RxeLink,
    started: Instant,
    _serial: MutexGuard<'static, ()>,
}

impl RdmaCase {
    /// `None` when the interop switch is off (the test then passes as skipped); otherwise the
    /// case with `work_dir(dir_name)` and a fresh link.
    pub fn begin(name: &'static str, dir_name: &str) -> Option<RdmaCase> {
        let serial = begin(name)?;
        Some(RdmaCase {
            name,
            dir: work_dir(dir_name),
            link: RxeLink::new(),
            started: Instant::now(),
            _serial: serial,
        })
    }

    /// [`RdmaCase::begin`] with both guests on `kernel`, whatever `NVMFD_INTEROP_KERNEL` says.
    pub fn begin_on(name: &'static str, dir_name: &str, kernel: Kernel) -> Option<RdmaCase> {
        let mut case = Self::begin(name, dir_name)?;
        case.link.kernel = kernel;
        Some(case)
    }

    /// Since the case began.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The listening side of the scripts: `ROLE=target`, `PORT`=[`RDMA_PORT`], `NQN`.
    pub fn target_env(&self, nqn: &str) -> Vec<(&'static str, String)> {
        vec![
            ("ROLE", "target".to_string()),
            ("PORT", RDMA_PORT.to_string()),
            ("NQN", nqn.to_string()),
        ]
    }

    /// The connecting side: `PORT`, `TARGET_IP` (the link's listening end), `NQN`, and
    /// `HOSTNQN` (+ `HOSTID`) of `host_id`.
    pub fn host_env(&self, nqn: &str, host_id: &str) -> Vec<(&'static str, String)> {
        vec![
            ("PORT", RDMA_PORT.to_string()),
            ("TARGET_IP", self.link.target_ip.to_string()),
            ("NQN", nqn.to_string()),
            ("HOSTNQN", host_nqn(host_id)),
            ("HOSTID", host_id.to_string()),
        ]
    }

    /// Starts `script` in the listening guest and waits (at most `wait`) until it has created
    /// `/job/serving`; panics with that guest's output if it does not.
    pub fn serve(
        &self,
        script: &str,
        env: &[(&str, String)],
        put_bins: &[&Path],
        timeout: Duration,
        wait: Duration,
    ) -> ListenGuest {
        let mut g = ListenGuest::start(&self.dir, &self.link, script, env, put_bins, timeout);
        if let Err(e) = g.wait_for("serving", wait) {
            panic!("{}: listening guest ({script}): {e}", self.name);
        }
        g
    }

    /// nvmfd's NVMe/RDMA target in the listening guest (`nvmfd-rdma.sh` role target, a 32 MiB
    /// malloc namespace `nqn`, `nvmfd` and `nvmf` shipped; `WAIT_S` 200) with `extra` env, up and
    /// serving (bounded: 120 s to serve, 260 s in all).
    pub fn serve_nvmfd(&self, nqn: &str, extra: &[(&'static str, String)]) -> ListenGuest {
        let (nvmfd, nvmf) = (nvmfd_binary(), nvmf_binary());
        let mut env = self.target_env(nqn);
        env.push(("WAIT_S", "200".to_string()));
        env.extend(extra.iter().cloned());
        self.serve(
            "nvmfd-rdma.sh",
            &env,
            &[nvmfd.as_path(), nvmf.as_path()],
            Duration::from_secs(260),
            Duration::from_secs(120),
        )
    }

    /// nvmet-rdma in the listening guest (one `size_mb` MiB namespace), timed in a line.
    pub fn kernel_target(&self, nqn: &str, size_mb: u32) -> KernelTarget {
        let t0 = Instant::now();
        let target = KernelTarget::start_rdma(&self.dir, &self.link, nqn, 1, size_mb, &[]);
        say(&format!(
            "interop {}: nvmet-rdma ready on {}:{RDMA_PORT} (link 127.0.0.1:{}) in {:.1} s",
            self.name,
            self.link.target_ip,
            self.link.port,
            t0.elapsed().as_secs_f64()
        ));
        target
    }

    /// Runs `script` in the connecting guest (no checkpoints), bounded by `timeout`.
    pub fn run_host(
        &self,
        script: &str,
        env: &[(&str, String)],
        put_bins: &[&Path],
        timeout: Duration,
    ) -> GuestRun {
        run_guest_rxe(
            &self.dir,
            &self.link,
            script,
            env,
            put_bins,
            timeout,
            |cp, _| format!("fail: no checkpoint {cp} in this scenario"),
        )
    }

    /// Tells the listening guest to stop (`/job/stop`) and collects it (at most `within`).
    pub fn stop(&self, listener: ListenGuest, within: Duration) -> GuestRun {
        let _ = fs::write(listener.job_dir().join("stop"), b"");
        listener.finish(within)
    }

    /// The listening guest's `nvmfd.log` (empty if it has none).
    pub fn nvmfd_log(&self) -> String {
        fs::read_to_string(self.dir.join("listen-guest").join("nvmfd.log")).unwrap_or_default()
    }

    /// Prints the summary line `interop NAME: passed|FAILED (DETAIL, total N s)` and returns
    /// `passed`.
    pub fn summary(&self, passed: bool, detail: &str) -> bool {
        say(&format!(
            "interop {}: {} ({detail}, total {:.1} s)",
            self.name,
            if passed { "passed" } else { "FAILED" },
            self.elapsed().as_secs_f64()
        ));
        passed
    }

    /// The verdict of a host guest against a listening guest: both passed (and `extra_ok`);
    /// prints the summary and panics with both reports (and nvmfd's log, if any) otherwise.
    pub fn conclude_pair(
        &self,
        host: &GuestRun,
        listener: &GuestRun,
        extra_ok: bool,
        detail: &str,
    ) {
        let passed = self.summary(
            guest_passed(host) && guest_passed(listener) && extra_ok,
            detail,
        );
        if !passed {
            panic!(
                "{} failed\n==== connecting guest ====\n{}\n==== listening guest ====\n{}\n==== \
                 nvmfd.log ====\n{}",
                self.name,
                host.report(None),
                listener.report(None),
                self.nvmfd_log()
            );
        }
    }

    /// The verdict of a host guest against nvmet-rdma: it passed, and the kernel target logged
    /// a controller for `nqn`; prints the report and summary, panics with the target's dmesg.
    pub fn conclude_kernel(&self, run: &GuestRun, target: &KernelTarget, nqn: &str) {
        let report = run.report(None);
        println!("{report}");
        let ok = self.summary(
            guest_passed(run),
            &format!(
                "guest status {}, guest {:.1} s",
                run.status,
                run.wall.as_secs_f64()
            ),
        );
        assert!(
            ok,
            "{} failed: {}\n{report}\n---- kernel target dmesg ----\n{}",
            self.name,
            first_fail(run),
            target.dmesg()
        );
        let tdmesg = target.dmesg();
        assert!(
            tdmesg
                .lines()
                .any(|l| l.contains("creating nvm controller") && l.contains(nqn)),
            "the kernel target logged no controller for {nqn}:\n{tdmesg}"
        );
    }
}
