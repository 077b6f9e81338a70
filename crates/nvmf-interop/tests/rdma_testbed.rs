//! NVMe/RDMA between two testbed guests over soft-RoCE: the Linux kernel target (nvmet-rdma,
//! one 32 MiB brd namespace) in guest A, the Linux kernel host (nvme-rdma, nvme-cli, fio) in
//! guest B, joined by a qemu socket link with `rxe0` on both ends. Guest B
//! (`tests/interop/rdma-kernel.sh`) checks rxe0 is ACTIVE and seen by libibverbs, runs `rping`
//! (user-space verbs + rdma_cm) over it, runs this workspace's `nvmfd` binary shipped with
//! `--put-bin` (`--help`: a Rust program linked against the host's glibc/libssl starts there),
//! then `nvme discover`/`connect -t rdma`, fio 4k randrw with crc32c verify (8 MiB) and
//! disconnect with a clean dmesg. This is the foundation the nvmfd RDMA transport's tests build
//! on (nvmfd in guest A instead of nvmet). Opt-in with NVMFD_INTEROP=1, like kernel_host.rs.

use std::time::{Duration, Instant};

use nvmf_interop::rdma::RDMA_PORT;
use nvmf_interop::*;

const NQN: &str = "nqn.2024-01.io.nvmfd:rdma-ref";

#[test]
fn kernel_host_to_kernel_target_over_rxe() {
    let Some(_serial) = begin("kernel_host_to_kernel_target_over_rxe") else {
        return;
    };
    let t_all = Instant::now();
    let dir = work_dir("rdma_testbed");
    let nvmfd = nvmfd_binary();
    let link = RxeLink::new();
    let t0 = Instant::now();
    let target = KernelTarget::start_rdma(&dir, &link, NQN, 1, 32, &[]);
    say(&format!(
        "interop kernel_host_to_kernel_target_over_rxe: nvmet-rdma ready on {}:{RDMA_PORT} \
         (link 127.0.0.1:{}) in {:.1} s",
        link.target_ip,
        link.port,
        t0.elapsed().as_secs_f64()
    ));
    let env = vec![
        ("PORT", RDMA_PORT.to_string()),
        ("TARGET_IP", link.target_ip.to_string()),
        ("NQN", NQN.to_string()),
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("HOSTID", HOST_ID.to_string()),
        ("FIO_MB", "8".to_string()),
        ("PUT_BIN", "nvmfd".to_string()),
    ];
    let run = run_guest_rxe(
        &dir,
        &link,
        "rdma-kernel.sh",
        &env,
        &[nvmfd.as_path()],
        Duration::from_secs(240),
        |cp, _| format!("fail: no checkpoint {cp} in this scenario"),
    );
    let report = run.report(None);
    println!("{report}");
    let ok = run.status == 0 && run.stdout.contains("ALL STEPS PASSED");
    say(&format!(
        "interop kernel_host_to_kernel_target_over_rxe: {} (guest status {}, guest {:.1} s, total {:.1} s)",
        if ok { "passed" } else { "FAILED" },
        run.status,
        run.wall.as_secs_f64(),
        t_all.elapsed().as_secs_f64()
    ));
    assert!(
        ok,
        "rdma scenario failed: {}\n{report}\n---- kernel target dmesg ----\n{}",
        run.stdout
            .lines()
            .find(|l| l.starts_with("FAIL:"))
            .unwrap_or("(no FAIL line; see the report)"),
        target.dmesg()
    );
    // the target saw this host's controllers come and go over rdma
    let tdmesg = target.dmesg();
    assert!(
        tdmesg
            .lines()
            .any(|l| l.contains("creating nvm controller") && l.contains(NQN)),
        "the kernel target logged no controller for {NQN}:\n{tdmesg}"
    );
}

/// User-space verbs + rdma_cm from one guest to the other (not only within one guest): an
/// `rping` server in the listening guest ([`ListenGuest`]), the client in the connecting one.
/// The way a user-space NVMe/RDMA target in a guest will be reached.
#[test]
fn user_space_rdma_between_guests() {
    let Some(_serial) = begin("user_space_rdma_between_guests") else {
        return;
    };
    let t_all = Instant::now();
    let dir = work_dir("rdma_testbed_rping");
    let link = RxeLink::new();
    let mut server = ListenGuest::start(
        &dir,
        &link,
        "rdma-rping.sh",
        &[("ROLE", "server".to_string())],
        &[],
        Duration::from_secs(120),
    );
    if let Err(e) = server.wait_for("serving", Duration::from_secs(60)) {
        panic!("rping server guest: {e}");
    }
    let client = run_guest_rxe(
        &dir,
        &link,
        "rdma-rping.sh",
        &[
            ("ROLE", "client".to_string()),
            ("PEER_IP", link.target_ip.to_string()),
        ],
        &[],
        Duration::from_secs(120),
        |cp, _| format!("fail: no checkpoint {cp} in this scenario"),
    );
    let ok = |r: &GuestRun| r.status == 0 && r.stdout.contains("ALL STEPS PASSED");
    // a server whose client failed would wait for one until its timeout: stop it then
    let server = server.finish(if ok(&client) {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    });
    let passed = ok(&client) && ok(&server);
    say(&format!(
        "interop user_space_rdma_between_guests: {} (client {}, server {}, total {:.1} s)",
        if passed { "passed" } else { "FAILED" },
        client.status,
        server.status,
        t_all.elapsed().as_secs_f64()
    ));
    assert!(
        passed,
        "rping between guests failed\n==== client guest ====\n{}\n==== server guest ====\n{}",
        client.report(None),
        server.report(None)
    );
}
