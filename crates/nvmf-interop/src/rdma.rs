//! Soft-RoCE between two testbed guests, for NVMe/RDMA interop tests.
//!
//! This host's kernel has no `rdma_rxe`, so RDMA runs only inside guests: two guests are joined
//! by a qemu socket link (`eth1`, point to point, through a free TCP port on 127.0.0.1) and each
//! creates the soft-RoCE device `rxe0` on it (testbed `--link`, `--link-ip`, `--rxe`). The
//! guest that listens on the link starts first; here that is the kernel NVMe/RDMA target
//! ([`KernelTarget::start_rdma`]), and a scenario runs in the connecting guest
//! ([`run_guest_rxe`]). Both guests boot Debian 12's 6.1 kernel; the guest image carries
//! `rdma_rxe`, `nvme-rdma`, `nvmet-rdma`, libibverbs + librdmacm with the rxe provider, and
//! `ibv_devices`/`ibv_devinfo`/`rping`, so user-space RDMA programs work there too
//! (a host-built program goes in with `--put-bin`; see testbed/README.md "soft-RoCE").

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use crate::{free_port, guest, prepare_kernel, GuestRun, Kernel, KernelTarget};

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
    prepare_kernel(Kernel::Debian12);
    let mut tb_args: Vec<OsString> = link.connect_args().into_iter().map(Into::into).collect();
    for b in put_bins {
        tb_args.push("--put-bin".into());
        tb_args.push(b.as_os_str().to_owned());
    }
    let tb_env = [("NVMFD_TESTBED_KERNEL", Kernel::Debian12.series())];
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_ends_match() {
        let l = RxeLink {
            port: 17001,
            target_ip: "10.77.0.1",
            host_ip: "10.77.0.2",
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
