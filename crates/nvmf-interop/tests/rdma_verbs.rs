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
use std::time::{Duration, Instant};

use nvmf_interop::*;

/// The server's port on its link address (nothing else listens in that guest).
const PORT: u16 = 4420;

/// `target/<profile>/examples/rdma_pingpong`, (re)built with cargo so it is never stale.
fn pingpong_binary() -> PathBuf {
    nvmf_interop::rdma::rdma_example("rdma_pingpong", "NVMF_RDMA_PINGPONG_BIN")
}

#[test]
fn verbs_pingpong_between_guests() {
    let Some(_serial) = begin("verbs_pingpong_between_guests") else {
        return;
    };
    let t_all = Instant::now();
    let bin = pingpong_binary();
    let dir = work_dir("rdma_verbs");
    let link = RxeLink::new();
    let env = |role: &str| {
        vec![
            ("ROLE", role.to_string()),
            ("PORT", PORT.to_string()),
            ("TIMEOUT", "90".to_string()),
            ("PEER_IP", link.target_ip.to_string()),
            // the server listens on the IPv6 wildcard (dual stack): an IPv6 sockaddr, and a
            // listener bound to no device, whose connections each bring their own
            ("LISTEN_IP", "[::]".to_string()),
        ]
    };
    let mut server = ListenGuest::start(
        &dir,
        &link,
        "rdma-verbs.sh",
        &env("server"),
        &[bin.as_path()],
        Duration::from_secs(150),
    );
    if let Err(e) = server.wait_for("serving", Duration::from_secs(90)) {
        panic!("rdma_pingpong server guest: {e}");
    }
    let client = run_guest_rxe(
        &dir,
        &link,
        "rdma-verbs.sh",
        &env("client"),
        &[bin.as_path()],
        Duration::from_secs(150),
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
        "interop verbs_pingpong_between_guests: {} (client {}, server {}, total {:.1} s)",
        if passed { "passed" } else { "FAILED" },
        client.status,
        server.status,
        t_all.elapsed().as_secs_f64()
    ));
    assert!(
        passed,
        "rdma_pingpong between guests failed\n==== client guest ====\n{}\n==== server guest ====\n{}",
        client.report(None),
        server.report(None)
    );
    // the program's own checks ran (not only its exit status)
    let peer_line = format!("connection from peer {} port", link.host_ip);
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
