//! This workspace's NVMe/RDMA initiator (`nvmf`, trtype:RDMA) against the Linux kernel target
//! (nvmet-rdma, one 32 MiB brd namespace) over soft-RoCE between two testbed guests (issue 13,
//! test 2): nvmet-rdma in guest A ([`KernelTarget::start_rdma`]); in guest B
//! (`tests/interop/nvmf-host-rdma.sh`) our `nvmf` binary, shipped with `--put-bin`, runs
//! `nvmf discover -t rdma` (the subsystem listed with trtype rdma), `nvmf identify` (the
//! namespace's size), `nvmf perf --verify` 4 KiB randrw (writes travel in the capsule: the
//! kernel target's IOCCSZ allows 4 KiB) and 128 KiB sequential writes then reads (Keyed SGLs:
//! the target RDMA READs our buffers and RDMA WRITEs reads into them), each 0 mismatches and
//! 0 errors, and a Connect to an unknown subsystem NQN that must fail with a clear error, not
//! hang. Every step is bounded (`timeout`). Opt-in with NVMFD_INTEROP=1, like the others.

use std::time::{Duration, Instant};

use nvmf_interop::rdma::RDMA_PORT;
use nvmf_interop::*;

const NQN: &str = "nqn.2024-01.io.nvmfd:rdma-host";

#[test]
fn nvmf_host_against_kernel_target_over_rxe() {
    let Some(_serial) = begin("nvmf_host_against_kernel_target_over_rxe") else {
        return;
    };
    let t_all = Instant::now();
    let dir = work_dir("rdma_host");
    let nvmf = nvmf_binary();
    let link = RxeLink::new();
    let t0 = Instant::now();
    let target = KernelTarget::start_rdma(&dir, &link, NQN, 1, 32, &[]);
    say(&format!(
        "interop nvmf_host_against_kernel_target_over_rxe: nvmet-rdma ready on {}:{RDMA_PORT} in \
         {:.1} s",
        link.target_ip,
        t0.elapsed().as_secs_f64()
    ));
    let env = vec![
        ("PORT", RDMA_PORT.to_string()),
        ("TARGET_IP", link.target_ip.to_string()),
        ("NQN", NQN.to_string()),
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("SECONDS_EACH", "3".to_string()),
    ];
    let run = run_guest_rxe(
        &dir,
        &link,
        "nvmf-host-rdma.sh",
        &env,
        &[nvmf.as_path()],
        Duration::from_secs(180),
        |cp, _| format!("fail: no checkpoint {cp} in this scenario"),
    );
    let report = run.report(None);
    println!("{report}");
    let ok = run.status == 0 && run.stdout.contains("ALL STEPS PASSED");
    say(&format!(
        "interop nvmf_host_against_kernel_target_over_rxe: {} (guest status {}, guest {:.1} s, \
         total {:.1} s)",
        if ok { "passed" } else { "FAILED" },
        run.status,
        run.wall.as_secs_f64(),
        t_all.elapsed().as_secs_f64()
    ));
    assert!(
        ok,
        "nvmf over rdma failed: {}\n{report}\n---- kernel target dmesg ----\n{}",
        run.stdout
            .lines()
            .find(|l| l.starts_with("FAIL:"))
            .unwrap_or("(no FAIL line; see the report)"),
        target.dmesg()
    );
    let tdmesg = target.dmesg();
    assert!(
        tdmesg
            .lines()
            .any(|l| l.contains("creating nvm controller") && l.contains(NQN)),
        "the kernel target logged no controller for {NQN}:\n{tdmesg}"
    );
}

/// The same `nvmf` scenario against nvmfd's own NVMe/RDMA target (a 32 MiB malloc namespace,
/// the listening guest of `tests/interop/nvmfd-rdma.sh`, role target): both sides of this
/// workspace over a real RDMA link; nvmfd must then shut down with every queue closed.
#[test]
fn nvmf_host_against_nvmfd_over_rxe() {
    let Some(_serial) = begin("nvmf_host_against_nvmfd_over_rxe") else {
        return;
    };
    let t_all = Instant::now();
    let dir = work_dir("rdma_host_nvmfd");
    let nvmfd = nvmfd_binary();
    let nvmf = nvmf_binary();
    let link = RxeLink::new();
    let nqn = "nqn.2024-01.io.nvmfd:rdma";
    let mut target = ListenGuest::start(
        &dir,
        &link,
        "nvmfd-rdma.sh",
        &[
            ("ROLE", "target".to_string()),
            ("PORT", RDMA_PORT.to_string()),
            ("NQN", nqn.to_string()),
            ("WAIT_S", "200".to_string()),
            ("REJECTED", "0".to_string()),
        ],
        &[nvmfd.as_path(), nvmf.as_path()],
        Duration::from_secs(260),
    );
    if let Err(e) = target.wait_for("serving", Duration::from_secs(120)) {
        panic!("nvmfd guest: {e}");
    }
    let host = run_guest_rxe(
        &dir,
        &link,
        "nvmf-host-rdma.sh",
        &[
            ("PORT", RDMA_PORT.to_string()),
            ("TARGET_IP", link.target_ip.to_string()),
            ("NQN", nqn.to_string()),
            ("HOSTNQN", host_nqn(HOST_ID)),
            ("SECONDS_EACH", "3".to_string()),
        ],
        &[nvmf.as_path()],
        Duration::from_secs(180),
        |cp, _| format!("fail: no checkpoint {cp} in this scenario"),
    );
    let _ = std::fs::write(dir.join("listen-guest").join("stop"), b"");
    let target = target.finish(Duration::from_secs(60));
    let ok = |r: &GuestRun| r.status == 0 && r.stdout.contains("ALL STEPS PASSED");
    let passed = ok(&host) && ok(&target);
    say(&format!(
        "interop nvmf_host_against_nvmfd_over_rxe: {} (host guest {:.1} s, total {:.1} s)",
        if passed { "passed" } else { "FAILED" },
        host.wall.as_secs_f64(),
        t_all.elapsed().as_secs_f64()
    ));
    let log =
        std::fs::read_to_string(dir.join("listen-guest").join("nvmfd.log")).unwrap_or_default();
    assert!(
        passed,
        "nvmf against nvmfd over rdma failed\n==== host guest ====\n{}\n==== nvmfd guest \
         ====\n{}\n==== nvmfd.log ====\n{}",
        host.report(None),
        target.report(None),
        log
    );
}
