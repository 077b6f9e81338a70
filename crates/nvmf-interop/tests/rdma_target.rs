//! nvmfd's NVMe/RDMA target against the Linux kernel's NVMe/RDMA host, over soft-RoCE between
//! two testbed guests (`tests/interop/nvmfd-rdma.sh`): this workspace's `nvmfd` (shipped with
//! `--put-bin`) serves a malloc namespace on an RDMA listener (subsystem and discovery) in the
//! listening guest; in the other, nvme-rdma discovers it (trtype rdma), connects, checks
//! Identify's keyed SGL support, runs fio 4k randrw 75/25 (writes of 4 KiB travel in the
//! capsule) and 128k sequential (writes fetched by RDMA READ, reads by RDMA WRITE) with
//! crc32c verify, and disconnects with a clean dmesg; then nvmfd is stopped with SIGTERM and
//! its log must show every queue torn down and the controller freed. Before that, bad input
//! from a real link: `rdma_connect_probe` (nvmf-rdma's example, shipped too) sends connect
//! requests with a wrong RECFMT, QID, HSQSIZE (admin and I/O) and HRQSIZE, each of which must
//! be rejected with its NVMe/RDMA status, and one good admin queue whose host then vanishes
//! (exits without a disconnect, never sends Connect): nvmfd keeps serving (the kernel host's
//! run follows) and disconnects the orphan. Opt-in with NVMFD_INTEROP=1, like the other
//! interop tests.

use std::time::{Duration, Instant};

use nvmf_interop::rdma::RDMA_PORT;
use nvmf_interop::*;

const NQN: &str = "nqn.2024-01.io.nvmfd:rdma";

#[test]
fn kernel_host_against_nvmfd_over_rxe() {
    let Some(_serial) = begin("kernel_host_against_nvmfd_over_rxe") else {
        return;
    };
    let t_all = Instant::now();
    let dir = work_dir("rdma_target");
    let nvmfd = nvmfd_binary();
    let probe = nvmf_interop::rdma::rdma_example("rdma_connect_probe", "NVMF_RDMA_PROBE_BIN");
    let link = RxeLink::new();
    let target_env = vec![
        ("ROLE", "target".to_string()),
        ("PORT", RDMA_PORT.to_string()),
        ("NQN", NQN.to_string()),
        ("WAIT_S", "240".to_string()),
    ];
    let mut target = ListenGuest::start(
        &dir,
        &link,
        "nvmfd-rdma.sh",
        &target_env,
        &[nvmfd.as_path()],
        Duration::from_secs(300),
    );
    if let Err(e) = target.wait_for("serving", Duration::from_secs(120)) {
        panic!("nvmfd guest: {e}");
    }
    let t_serving = t_all.elapsed();
    let host_env = vec![
        ("ROLE", "host".to_string()),
        ("PORT", RDMA_PORT.to_string()),
        ("TARGET_IP", link.target_ip.to_string()),
        ("NQN", NQN.to_string()),
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("HOSTID", HOST_ID.to_string()),
        ("FIO_MB", "8".to_string()),
    ];
    let host = run_guest_rxe(
        &dir,
        &link,
        "nvmfd-rdma.sh",
        &host_env,
        &[probe.as_path()],
        Duration::from_secs(240),
        |cp, _| format!("fail: no checkpoint {cp} in this scenario"),
    );
    // The host is done (or failed): let nvmfd's guest stop it and check its log.
    let _ = std::fs::write(dir.join("listen-guest").join("stop"), b"");
    let target = target.finish(Duration::from_secs(60));
    let ok = |r: &GuestRun| r.status == 0 && r.stdout.contains("ALL STEPS PASSED");
    let passed = ok(&host) && ok(&target);
    say(&format!(
        "interop kernel_host_against_nvmfd_over_rxe: {} (nvmfd serving after {:.1} s, host guest \
         {:.1} s, total {:.1} s)",
        if passed { "passed" } else { "FAILED" },
        t_serving.as_secs_f64(),
        host.wall.as_secs_f64(),
        t_all.elapsed().as_secs_f64()
    ));
    let log =
        std::fs::read_to_string(dir.join("listen-guest").join("nvmfd.log")).unwrap_or_default();
    assert!(
        passed,
        "kernel host against nvmfd over rdma failed\n==== host guest ====\n{}\n==== nvmfd guest \
         ====\n{}\n==== nvmfd.log ====\n{}",
        host.report(None),
        target.report(None),
        log
    );
}
