//! The rbd control plane of the real daemon, without a Ceph cluster: an rbd
//! bdev on a cluster that cannot be reached fails with an error naming the
//! bdev within a bound, over RPC (the daemon keeps answering, nothing is
//! saved) and in the startup config (nvmfd exits with the reason). The
//! cluster is a port on 127.0.0.1 that nobody listens on. The tests with a
//! real one-node cluster are nvmf-interop's (docs/RBD.md, "Test cluster").

use std::time::{Duration, Instant};

use nvmf_testkit::{bins, free_port, run_bounded, text, Daemon};

/// How long opening an image on an unreachable cluster may take before it
/// fails: the rbd backend's bounded connect timeout, plus slack for this
/// 2-core machine.
const OPEN_BOUND: Duration = Duration::from_secs(90);

fn dead_cluster() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// `nvmf rpc -t 300 ARGS` (the client waits longer than the bound: the
/// bound is checked here) → (success, output, time taken).
fn timed_rpc(d: &Daemon, args: &[&str]) -> (bool, String, Duration) {
    let started = Instant::now();
    let mut cmd = std::process::Command::new(bins::nvmf());
    cmd.arg("rpc")
        .arg("-s")
        .arg(&d.rpc_socket)
        .args(["-t", "300"])
        .args(args);
    let out = run_bounded(cmd, OPEN_BOUND + Duration::from_secs(30));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    (out.status.success(), said, started.elapsed())
}

/// The `message` of a JSON-RPC error as `nvmf rpc` prints it (the request
/// it echoes first also names things).
fn message(said: &str) -> &str {
    said.split("\"message\"").nth(1).unwrap_or("")
}

#[test]
fn rbd_create_on_an_unreachable_cluster_fails_in_bounds() {
    let d = Daemon::builder(r#"{"subsystems":[]}"#)
        .args(["-m", "0"])
        .ready_when("RPC server listening on")
        .start();
    let mon = dead_cluster();
    let mon_host = format!("mon_host={mon}");
    let key = "key=AQBrxmJlAAAAABAAtnN0YXRpY2tleWZvcnRlc3Rz";

    // Registering connects when the rbd backend is linked: then it fails
    // in bounds, naming the cluster; else only the model records it.
    let (ok, said, took) = timed_rpc(
        &d,
        &[
            "bdev_rbd_register_cluster",
            "c1",
            "--config-param",
            &mon_host,
            "--config-param",
            key,
        ],
    );
    assert!(took < OPEN_BOUND, "register took {took:?}: {said}");
    if ok {
        d.rpc_ok(&["bdev_rbd_unregister_cluster", "c1"]);
    } else {
        assert!(message(&said).contains("c1"), "names the cluster: {said}");
        eprintln!(
            "bdev_rbd_register_cluster on {mon} failed after {took:?}: {}",
            message(&said)
        );
    }

    // A bdev with its own connection.
    let (ok, said, took) = timed_rpc(
        &d,
        &[
            "bdev_rbd_create",
            "-b",
            "R0",
            "--config",
            &mon_host,
            "--config",
            key,
            "rbd",
            "img",
            "512",
        ],
    );
    assert!(!ok, "created on a dead cluster: {said}");
    assert!(took < OPEN_BOUND, "took {took:?}: {said}");
    assert!(
        message(&said).contains("bdev R0"),
        "the error names the bdev: {said}"
    );
    eprintln!(
        "bdev_rbd_create on {mon} failed after {took:?}: {}",
        message(&said)
    );

    // The daemon answers and kept nothing of it.
    let bdevs = d.rpc_ok(&["bdev_get_bdevs"]);
    assert!(!bdevs.contains("R0"), "{bdevs}");
    let saved = d.rpc_ok(&["save_config"]);
    assert!(!saved.contains("bdev_rbd"), "{saved}");
}

#[test]
fn rbd_bdev_in_the_startup_config_on_an_unreachable_cluster_stops_nvmfd() {
    let mon = dead_cluster();
    let cfg = format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[
  {{"method":"bdev_rbd_create","params":{{"name":"R1","pool_name":"rbd","rbd_name":"img","block_size":512,
    "config":{{"mon_host":"{mon}","key":"AQBrxmJlAAAAABAAtnN0YXRpY2tleWZvcnRlc3Rz"}}}}}}]}}]}}"#
    );
    let started = Instant::now();
    let e = Daemon::builder(cfg)
        .args(["-m", "0"])
        .ready_when("RPC server listening on")
        .ready_within(OPEN_BOUND)
        .try_start()
        .err()
        .expect("nvmfd started with an rbd bdev on a dead cluster");
    let took = started.elapsed();
    assert!(e.contains("exited"), "{e}");
    assert!(e.contains("R1"), "the reason names the bdev: {e}");
    assert!(took < OPEN_BOUND, "took {took:?}");
    eprintln!("nvmfd with R1 on {mon} stopped after {took:?}");
}
