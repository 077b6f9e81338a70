//! Soft-RoCE between two testbed guests, for NVMe/RDMA interop tests.
//!
//! This host's kernel has no `rdma_rxe`, so RDMA runs only inside guests: two guests are joined
//! by a qemu socket link (`eth1`, point to point, through a free TCP port on 127.0.0.1) and each
//! creates the soft-RoCE device `rxe0` on it (testbed `--link`, `--link-ip`, `--rxe`). The
//! guest that listens on the link starts first: the kernel NVMe/RDMA target
//! ([`KernelTarget::start_rdma`]) or any script ([`ListenGuest`], e.g. a user-space RDMA server
//! such as nvmfd); a scenario then runs in the connecting guest ([`run_guest_rxe`]). Both guests boot Debian 12's 6.1 kernel; the guest image carries
//! `rdma_rxe`, `nvme-rdma`, `nvmet-rdma`, libibverbs + librdmacm with the rxe provider, and
//! `ibv_devices`/`ibv_devinfo`/`rping`, so user-space RDMA programs work there too
//! (a host-built program goes in with `--put-bin`; see testbed/README.md "soft-RoCE").

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nvmf_testkit::{die_with_parent, stop_child};

use crate::{
    free_port, guest, prepare_kernel, repo_root, testbed, GuestRun, Kernel, KernelTarget, SIGTERM,
};

/// The port nvmet-rdma listens on, on the target's link address.
pub const RDMA_PORT: u16 = 4420;

/// The link between the two guests: the qemu socket's host port and each end's `eth1`
/// address (a /24 of its own, apart from the guests' user-mode 10.0.2.0/24).
pub struct RxeLink {
    /// 127.0.0.1:`port` is where the first guest's qemu listens for the second's.
    pub port: u16,
    /// The listening (target) guest's `eth1` address.
    pub target_ip: &'static str,
    /// The connecting (host) guest's `eth1` address.
    pub host_ip: &'static str,
    /// The kernel both guests boot (`NVMFD_INTEROP_KERNEL`, else Debian 12's 6.1; a case may
    /// ask for one: `RdmaCase::begin_on`).
    pub kernel: Kernel,
}

impl Default for RxeLink {
    fn default() -> Self {
        RxeLink::new()
    }
}

impl RxeLink {
    /// A link on a free host port (nvmf-testkit's `free_port`), 10.77.0.1 ↔ 10.77.0.2.
    pub fn new() -> RxeLink {
        RxeLink {
            port: free_port(),
            target_ip: "10.77.0.1",
            host_ip: "10.77.0.2",
            kernel: Kernel::from_env(),
        }
    }

    /// The testbed options of the listening end (start it first); soft-RoCE on.
    pub fn listen_args(&self) -> Vec<String> {
        vec![
            "--link".into(),
            format!("listen=127.0.0.1:{}", self.port),
            "--link-ip".into(),
            format!("{}/24", self.target_ip),
            "--rxe".into(),
        ]
    }

    /// The testbed options of the connecting end; soft-RoCE on.
    pub fn connect_args(&self) -> Vec<String> {
        vec![
            "--link".into(),
            format!("connect=127.0.0.1:{}", self.port),
            "--link-ip".into(),
            format!("{}/24", self.host_ip),
            "--rxe".into(),
        ]
    }
}

impl KernelTarget {
    /// The kernel NVMe/RDMA target (nvmet-rdma) in a background guest listening on the link
    /// end of `link` (`target_ip`:[`RDMA_PORT`]), with `namespaces` brd namespaces of
    /// `size_mb` MiB; `extra` as for [`KernelTarget::start`]. Waits (bounded: 120 s) until it
    /// is configured; stopped when dropped. `port` of the result is [`RDMA_PORT`].
    pub fn start_rdma(
        dir: &Path,
        link: &RxeLink,
        nqn: &str,
        namespaces: u32,
        size_mb: u32,
        extra: &[&str],
    ) -> KernelTarget {
        let mut args = vec!["--transport".to_string(), "rdma".to_string()];
        // target-start turns --rxe on for rdma by itself; listen_args ends with it
        args.extend(
            link.listen_args()
                .into_iter()
                .filter(|a| a.as_str() != "--rxe"),
        );
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        KernelTarget::start(dir, RDMA_PORT, nqn, namespaces, size_mb, &args)
    }
}

/// Runs `tests/interop/<script>` (with `lib.sh`) in a guest on the connecting end of `link`
/// (`rxe0` ACTIVE before the script starts; the script sees its own address as
/// `TESTBED_LINK_IP`). `put_bins` are host programs copied to `/job/` with the libraries the
/// guest lacks (`--put-bin`). `env` is exported to the script; `on_checkpoint` answers its
/// checkpoints, as for [`run_guest`](crate::run_guest). Bounded by `timeout` plus a grace
/// period; the guest is killed if the test dies.
pub fn run_guest_rxe(
    dir: &Path,
    link: &RxeLink,
    script: &str,
    env: &[(&str, String)],
    put_bins: &[&Path],
    timeout: Duration,
    on_checkpoint: impl FnMut(&str, &str) -> String,
) -> GuestRun {
    // The link's kernel: Debian 12's unless NVMFD_INTEROP_KERNEL=6.12 or the case asks for
    // the backports one (a newer soft-RoCE: it reports last-WQE-reached events, 6.1's does not).
    let kernel = link.kernel;
    prepare_kernel(kernel);
    let mut tb_args: Vec<OsString> = link.connect_args().into_iter().map(Into::into).collect();
    tb_args.extend(crate::put_bin_args(put_bins));
    let tb_env = [("NVMFD_TESTBED_KERNEL", kernel.series())];
    guest(
        &tb_env,
        &[],
        &tb_args,
        dir,
        script,
        &[],
        env,
        timeout,
        on_checkpoint,
    )
}

/// A guest running `tests/interop/<script>` (with `lib.sh`) in the background, on the
/// listening end of a link (e.g. a user-space RDMA server the connecting guest talks to) or,
/// with [`ListenGuest::start_connecting`], on its connecting end (a host the test can kill). The
/// script tells the test it is serving by creating a file in `/job` ([`ListenGuest::wait_for`]).
/// Killed (with its qemu) when dropped; bounded by `timeout` in any case.
pub struct ListenGuest {
    child: Option<Child>,
    job: PathBuf,
    tb_log: PathBuf,
    started: Instant,
    timeout: Duration,
}

impl ListenGuest {
    /// Boots the guest (`dir/listen-guest` is its job dir) with `env` exported to the script and
    /// `put_bins` shipped with `--put-bin`; returns at once. `GUEST_SMP` in `env` sets the
    /// guest's vCPUs.
    pub fn start(
        dir: &Path,
        link: &RxeLink,
        script: &str,
        env: &[(&str, String)],
        put_bins: &[&Path],
        timeout: Duration,
    ) -> ListenGuest {
        Self::spawn(
            &dir.join("listen-guest"),
            &dir.join("listen-guest.log"),
            link.kernel,
            &link.listen_args(),
            script,
            env,
            put_bins,
            timeout,
        )
    }

    /// The same on the *connecting* end of `link` (its `host_ip`), job dir `dir/<name>`: a host
    /// the test lets run in the background, e.g. to kill it mid-I/O ([`ListenGuest::kill_qemu`]).
    /// Start it after the listening end.
    pub fn start_connecting(
        dir: &Path,
        name: &str,
        link: &RxeLink,
        script: &str,
        env: &[(&str, String)],
        put_bins: &[&Path],
        timeout: Duration,
    ) -> ListenGuest {
        Self::spawn(
            &dir.join(name),
            &dir.join(format!("{name}.log")),
            link.kernel,
            &link.connect_args(),
            script,
            env,
            put_bins,
            timeout,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        job: &Path,
        tb_log: &Path,
        kernel: Kernel,
        link_args: &[String],
        script: &str,
        env: &[(&str, String)],
        put_bins: &[&Path],
        timeout: Duration,
    ) -> ListenGuest {
        prepare_kernel(kernel);
        let root = repo_root();
        let _ = fs::remove_dir_all(job);
        fs::create_dir_all(job).expect("create the background guest's job dir");
        let mut cmd = Command::new("bash");
        cmd.env("NVMFD_TESTBED_KERNEL", kernel.series())
            .arg(testbed())
            .arg("run")
            .arg("--timeout")
            .arg(timeout.as_secs().to_string())
            .arg("--out")
            .arg(job)
            .arg("--put")
            .arg(root.join("tests/interop/lib.sh"))
            .args(link_args);
        // GUEST_SMP in `env`: the guest's vCPUs (the testbed's default is 1).
        if let Some((_, n)) = env.iter().find(|(k, _)| *k == "GUEST_SMP") {
            cmd.arg("--smp").arg(n);
        }
        for b in put_bins {
            cmd.arg("--put-bin").arg(b);
        }
        for (k, v) in env {
            cmd.arg("--env").arg(format!("{k}={v}"));
        }
        cmd.arg(root.join("tests/interop").join(script))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(tb_log).expect("create the background guest's testbed log"));
        // the testbed traps TERM and kills its qemu
        die_with_parent(&mut cmd, SIGTERM);
        let child = cmd.spawn().expect("spawn testbed/nvmfd-testbed run");
        ListenGuest {
            child: Some(child),
            job: job.to_path_buf(),
            tb_log: tb_log.to_path_buf(),
            started: Instant::now(),
            timeout,
        }
    }

    /// The guest's job dir (its `/job`).
    pub fn job_dir(&self) -> &Path {
        &self.job
    }

    /// Kills the guest's qemu with SIGKILL (the machine vanishes: no shutdown, nothing more on
    /// its link) and waits (at most 10 s) for the testbed to notice. Err if qemu's pid file is
    /// missing or the kill failed.
    pub fn kill_qemu(&mut self) -> Result<(), String> {
        let pidf = self.job.join("qemu.pid");
        let pid: i32 = fs::read_to_string(&pidf)
            .map_err(|e| format!("{}: {e}", pidf.display()))?
            .trim()
            .parse()
            .map_err(|_| format!("{}: not a pid", pidf.display()))?;
        if pid <= 1 {
            return Err(format!("{}: pid {pid}", pidf.display()));
        }
        // SAFETY: kill(2) with a pid read from qemu's own pid file; no memory is involved.
        if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
            return Err(format!(
                "kill -KILL {pid}: {}",
                std::io::Error::last_os_error()
            ));
        }
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                break;
            }
            sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Waits (at most `timeout`) until the script has created `/job/<name>`; Err with the
    /// testbed's output if the guest ended first or the time ran out.
    pub fn wait_for(&mut self, name: &str, timeout: Duration) -> Result<(), String> {
        let until = Instant::now() + timeout;
        loop {
            if self.job.join(name).exists() {
                return Ok(());
            }
            let ended = match self.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(None)) => None,
                Some(Ok(Some(st))) => Some(format!("{st}")),
                Some(Err(e)) => Some(e.to_string()),
                None => Some("already finished".into()),
            };
            if let Some(how) = ended {
                return Err(format!(
                    "the listening guest ended ({how}) before /job/{name} appeared
{}",
                    self.context()
                ));
            }
            if Instant::now() > until {
                return Err(format!(
                    "no /job/{name} from the listening guest after {timeout:?}
{}",
                    self.context()
                ));
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// Waits up to `within` for the script to end (never past the guest's `timeout` plus 30 s),
    /// stops the guest if it has not (status 124), and returns what it left.
    pub fn finish(mut self, within: Duration) -> GuestRun {
        let deadline =
            (self.started + self.timeout + Duration::from_secs(30)).min(Instant::now() + within);
        let mut child = self.child.take().expect("a running guest");
        let status = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break st.code().unwrap_or(125);
            }
            if Instant::now() > deadline {
                stop_child(&mut child, Duration::from_secs(10));
                break 124;
            }
            sleep(Duration::from_millis(100));
        };
        let read = |n: &str| fs::read_to_string(self.job.join(n)).unwrap_or_default();
        GuestRun {
            status,
            stdout: read("stdout"),
            stderr: read("stderr"),
            testbed_log: fs::read_to_string(&self.tb_log).unwrap_or_default(),
            dmesg: read("dmesg.log"),
            wall: self.started.elapsed(),
            job_dir: self.job.clone(),
        }
    }

    fn context(&self) -> String {
        let read = |p: &Path| fs::read_to_string(p).unwrap_or_default();
        format!(
            "---- listening guest: testbed ----\n{}\n---- its stdout ----\n{}\n---- its console (tail) ----\n{}",
            read(&self.tb_log),
            read(&self.job.join("stdout")),
            crate::tail(&read(&self.job.join("console.log")), 30)
        )
    }
}

impl Drop for ListenGuest {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
    }
}

/// `target/<profile>/examples/<name>` of the nvmf-rdma crate, (re)built with cargo so it is
/// never stale; `$env_override` names a prebuilt one instead.
pub fn rdma_example(name: &str, env_override: &str) -> PathBuf {
    crate::example_binary("nvmf-rdma", name, env_override)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_ends_match() {
        let l = RxeLink {
            port: 17001,
            target_ip: "10.77.0.1",
            host_ip: "10.77.0.2",
            kernel: Kernel::Debian12,
        };
        assert_eq!(
            l.listen_args(),
            [
                "--link",
                "listen=127.0.0.1:17001",
                "--link-ip",
                "10.77.0.1/24",
                "--rxe"
            ]
        );
        assert_eq!(
            l.connect_args(),
            [
                "--link",
                "connect=127.0.0.1:17001",
                "--link-ip",
                "10.77.0.2/24",
                "--rxe"
            ]
        );
    }
}
