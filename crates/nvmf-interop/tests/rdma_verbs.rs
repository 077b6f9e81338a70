//! nvmf-rdma's verbs + rdma_cm layer on a real RDMA link: its example program `rdma_pingpong`
//! (built here, shipped into both guests with `--put-bin`) serves in the listening guest and
//! connects from the other over soft-RoCE (`tests/interop/rdma-verbs.sh`): a connect with a
//! wrong private data is rejected with the server's reject data, the right one is accepted
//! with the accept data (the server's QP takes its receives from a shared receive queue);
//! the client SENDs the addresses and keys of a source buffer (its MR's
//! rkey) and a destination (a type 2 memory window it bound); the server RDMA READs the source,
//! RDMA WRITEs it back transformed and SENDs with invalidate of the window's rkey in one post;
//! the client checks the data and the invalidated rkey; the server checks that an RDMA WRITE
//! under that rkey now fails (remote access error) and disconnects; both see `Disconnected`.
//! Opt-in with NVMFD_INTEROP=1, like rdma_testbed.rs.

use std::path::PathBuf;
use std::time::Duration;

use nvmf_interop::*;

/// The server's port on its link address (nothing else listens in that guest).
const PORT: u16 = 4420;

/// `target/<profile>/examples/rdma_pingpong`, (re)built with cargo so it is never stale.
fn pingpong_binary() -> PathBuf {
    nvmf_interop::rdma::rdma_example("rdma_pingpong", "NVMF_RDMA_PINGPONG_BIN")
}

#[test]
fn verbs_pingpong_between_guests() {
    let Some(case) = RdmaCase::begin("verbs_pingpong_between_guests", "rdma_verbs") else {
        return;
    };
    let bin = pingpong_binary();
    let env = |role: &str| {
        vec![
            ("ROLE", role.to_string()),
            ("PORT", PORT.to_string()),
            ("TIMEOUT", "90".to_string()),
            ("PEER_IP", case.link.target_ip.to_string()),
            // the server listens on the IPv6 wildcard (dual stack): an IPv6 sockaddr, and a
            // listener bound to no device, whose connections each bring their own
            ("LISTEN_IP", "[::]".to_string()),
        ]
    };
    let server = case.serve(
        "rdma-verbs.sh",
        &env("server"),
        &[bin.as_path()],
        Duration::from_secs(150),
        Duration::from_secs(90),
    );
    let client = case.run_host(
        "rdma-verbs.sh",
        &env("client"),
        &[bin.as_path()],
        Duration::from_secs(150),
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
    // the program's own checks ran (not only its exit status)
    let peer_line = format!("connection from peer {} port", case.link.host_ip);
    for (who, run, line) in [
        ("client", &client, "rejected as expected"),
        ("client", &client, "invalidated by the server's SEND"),
        ("server", &server, "sent with invalidate of rkey"),
        ("server", &server, "failed as it must"),
        ("server", &server, peer_line.as_str()),
        ("server", &server, "device limits DeviceLimits"),
        ("server", &server, ", srq depth "),
    ] {
        assert!(
            run.stdout.contains(line),
            "the {who} did not print {line:?}:\n{}",
            run.stdout
        );
    }
}
