//! NVMe/RDMA between two testbed guests over soft-RoCE: the Linux kernel target (nvmet-rdma,
//! one 32 MiB brd namespace) in guest A, the Linux kernel host (nvme-rdma, nvme-cli, fio) in
//! guest B, joined by a qemu socket link with `rxe0` on both ends. Guest B
//! (`tests/interop/rdma-kernel.sh`) checks rxe0 is ACTIVE and seen by libibverbs, runs `rping`
//! (user-space verbs + rdma_cm) over it, runs this workspace's `nvmfd` binary shipped with
//! `--put-bin` (`--help`: a Rust program linked against the host's glibc/libssl starts there),
//! then `nvme discover`/`connect -t rdma`, fio 4k randrw with crc32c verify (8 MiB) and
//! disconnect with a clean dmesg. This is the foundation the nvmfd RDMA transport's tests build
//! on (nvmfd in guest A instead of nvmet). Opt-in with NVMFD_INTEROP=1, like kernel_host.rs.

use std::time::Duration;

use nvmf_interop::*;

const NQN: &str = "nqn.2024-01.io.nvmfd:rdma-ref";

#[test]
fn kernel_host_to_kernel_target_over_rxe() {
    let Some(case) = RdmaCase::begin("kernel_host_to_kernel_target_over_rxe", "rdma_testbed")
    else {
        return;
    };
    let nvmfd = nvmfd_binary();
    let target = case.kernel_target(NQN, 32);
    let mut env = case.host_env(NQN, HOST_ID);
    env.push(("FIO_MB", "8".to_string()));
    env.push(("PUT_BIN", "nvmfd".to_string()));
    let run = case.run_host(
        "rdma-kernel.sh",
        &env,
        &[nvmfd.as_path()],
        Duration::from_secs(240),
    );
    // the target saw this host's controllers come and go over rdma
    case.conclude_kernel(&run, &target, NQN);
}

/// User-space verbs + rdma_cm from one guest to the other (not only within one guest): an
/// `rping` server in the listening guest ([`ListenGuest`]), the client in the connecting one.
/// The way a user-space NVMe/RDMA target in a guest will be reached.
#[test]
fn user_space_rdma_between_guests() {
    let Some(case) = RdmaCase::begin("user_space_rdma_between_guests", "rdma_testbed_rping") else {
        return;
    };
    let server = case.serve(
        "rdma-rping.sh",
        &[("ROLE", "server".to_string())],
        &[],
        Duration::from_secs(120),
        Duration::from_secs(60),
    );
    let client = case.run_host(
        "rdma-rping.sh",
        &[
            ("ROLE", "client".to_string()),
            ("PEER_IP", case.link.target_ip.to_string()),
        ],
        &[],
        Duration::from_secs(120),
    );
    // a server whose client failed would wait for one until its timeout: stop it then
    let server = server.finish(if guest_passed(&client) {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    });
    case.conclude_pair(
        &client,
        &server,
        true,
        &format!("client {}, server {}", client.status, server.status),
    );
}
