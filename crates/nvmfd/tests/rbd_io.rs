//! The real daemon serving an RBD image of the test Ceph cluster to the
//! user-space initiator (no guest): `nvmf perf --verify` reads back what it
//! wrote through nvmfd; and removing the namespace, then `bdev_rbd_delete`,
//! while 128 KiB writes at QD64 are in flight ends that I/O in bounds — the
//! RPCs answer, the initiator's run ends (with errors for the namespace that
//! went away, not a hang), and the daemon keeps serving the subsystem's other
//! namespace. And a bdev created read-only over RPC as rpc.py does
//! (`bdev_rbd_create -r`) serves reads, refuses writes with Namespace Is
//! Write Protected and cannot be resized. The kernel-host tests over RBD are
//! nvmf-interop's `rbd.rs`.

use std::time::{Duration, Instant};

use nvmf_testkit::ceph::{ceph_check, POOL};
use nvmf_testkit::{bins, free_port, run_bounded, text, trid, CephCluster, Daemon};

const NQN: &str = "nqn.2016-06.io.nvmfd:rbd-io";

/// How long the namespace removal and the bdev delete may take together
/// under load on a 2-core machine (the image closes off the RPC thread;
/// librbd's in-flight writes finish in milliseconds on a healthy cluster).
const DELETE_BOUND: Duration = Duration::from_secs(30);

fn config(c: &CephCluster, image: &str, port: u16) -> String {
    let conf = c.conf_path();
    let keyring = c.keyring_path();
    format!(
        r#"{{"subsystems":[
  {{"subsystem":"bdev","config":[
    {{"method":"bdev_rbd_register_cluster","params":{{"name":"ceph0",
      "config_file":"{conf}","key_file":"{keyring}"}}}},
    {{"method":"bdev_rbd_create","params":{{"name":"Rbd0","pool_name":"{POOL}",
      "rbd_name":"{image}","block_size":4096,"cluster_name":"ceph0"}}}},
    {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","num_blocks":8192,"block_size":4096}}}}]}},
  {{"subsystem":"nvmf","config":[
    {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
    {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}},
    {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"bdev_name":"Rbd0","nsid":1}}}}}},
    {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"bdev_name":"Malloc0","nsid":2}}}}}},
    {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}",
      "listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#,
        conf = conf.display(),
        keyring = keyring.display(),
    )
}

/// `nvmf perf` against namespace `ns` of `port` with `args`, bounded.
fn perf(port: u16, ns: &str, args: &[&str], limit: Duration) -> (bool, String) {
    let mut cmd = std::process::Command::new(bins::nvmf());
    cmd.args(["perf", "-r", &trid(port, NQN), "--ns", ns, "--no-progress"])
        .args(args);
    let out = run_bounded(cmd, limit);
    (
        out.status.success(),
        format!("{}{}", text(&out.stdout), text(&out.stderr)),
    )
}

#[test]
fn rbd_namespace_verifies_and_deletes_under_io() {
    match ceph_check() {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("skipped: NVMFD_SKIP_CEPH=1");
            return;
        }
        Err(e) => panic!("{e}"),
    }
    let c = CephCluster::shared();
    let image = format!("nvmfd-io-{}", std::process::id());
    c.create_image(POOL, &image, 64, "layering")
        .unwrap_or_else(|e| panic!("{e}"));
    let port = free_port();
    let mut d = Daemon::builder(config(c, &image, port))
        .args(["-m", "0"])
        .listening(&[port])
        .ready_within(Duration::from_secs(60))
        .start();

    // What the initiator writes, it reads back through nvmfd and librbd.
    let (ok, said) = perf(
        port,
        "1",
        &[
            "-w", "randrw", "-o", "4k", "-q", "32", "-t", "3", "--verify",
        ],
        Duration::from_secs(60),
    );
    assert!(ok, "perf --verify over RBD failed: {said}");
    assert!(
        !said.contains("mismatch") || said.contains(" 0 mismatch"),
        "{said}"
    );

    // Remove the namespace and delete the bdev under 128 KiB QD64 writes.
    let load = std::thread::spawn(move || {
        perf(
            port,
            "1",
            &["-w", "randwrite", "-o", "128k", "-q", "64", "-t", "10"],
            Duration::from_secs(60),
        )
    });
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    d.rpc_ok(&["nvmf_subsystem_remove_ns", NQN, "1"]);
    d.rpc_ok(&["bdev_rbd_delete", "Rbd0"]);
    let took = t0.elapsed();
    assert!(
        took < DELETE_BOUND,
        "remove_ns + bdev_rbd_delete took {took:?}"
    );
    d.wait_log_for("rbd image closed", DELETE_BOUND);
    let started = Instant::now();
    let (_, said) = load.join().expect("load thread");
    eprintln!(
        "remove_ns + bdev_rbd_delete under load answered in {took:?}; the load ended {:?} later: {}",
        started.elapsed(),
        said.lines().last().unwrap_or("")
    );
    // The cluster registration can go right away (rpc.py's teardown order).
    d.rpc_ok(&["bdev_rbd_unregister_cluster", "ceph0"]);

    // The daemon still serves the subsystem's other namespace.
    assert!(d.running(), "nvmfd exited: {}", d.logs());
    let (ok, said) = perf(
        port,
        "2",
        &["-w", "randrw", "-o", "4k", "-q", "8", "-t", "1", "--verify"],
        Duration::from_secs(30),
    );
    assert!(ok, "the malloc namespace after the rbd delete: {said}");
    assert!(!d.logs().contains("panicked"), "{}", d.logs());
    drop(d);
    let _ = c.remove_image(POOL, &image);
}

/// A daemon serving no rbd bdev yet: the cluster registered, a TCP
/// listener on `port` for an empty subsystem.
fn empty_config(c: &CephCluster, port: u16) -> String {
    let conf = c.conf_path();
    let keyring = c.keyring_path();
    format!(
        r#"{{"subsystems":[
  {{"subsystem":"bdev","config":[
    {{"method":"bdev_rbd_register_cluster","params":{{"name":"ceph0",
      "config_file":"{conf}","key_file":"{keyring}"}}}}]}},
  {{"subsystem":"nvmf","config":[
    {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
    {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}},
    {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}",
      "listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#,
        conf = conf.display(),
        keyring = keyring.display(),
    )
}

#[test]
fn read_only_rbd_bdev_refuses_writes() {
    match ceph_check() {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("skipped: NVMFD_SKIP_CEPH=1");
            return;
        }
        Err(e) => panic!("{e}"),
    }
    let c = CephCluster::shared();
    let image = format!("nvmfd-ro-{}", std::process::id());
    c.create_image(POOL, &image, 16, "layering")
        .unwrap_or_else(|e| panic!("{e}"));
    let port = free_port();
    let d = Daemon::builder(empty_config(c, port))
        .args(["-m", "0"])
        .listening(&[port])
        .ready_within(Duration::from_secs(60))
        .start();

    // rpc.py's command line: -r sends read_only true.
    let name = d.rpc_ok(&[
        "bdev_rbd_create",
        "-b",
        "RbdRo",
        "-c",
        "ceph0",
        "-r",
        POOL,
        &image,
        "4096",
    ]);
    assert_eq!(name.trim(), "RbdRo");
    d.rpc_ok(&["nvmf_subsystem_add_ns", NQN, "RbdRo"]);
    let bdevs = d.rpc_ok(&["bdev_get_bdevs", "-b", "RbdRo"]);
    let v: serde_json::Value = serde_json::from_str(&bdevs).unwrap();
    assert_eq!(v[0]["supported_io_types"]["write"], false, "{bdevs}");
    assert!(d.logs().contains("read-only"), "{}", d.logs());

    // Reads are served; writes end with Namespace Is Write Protected.
    let (ok, said) = perf(
        port,
        "1",
        &["-w", "randread", "-o", "4k", "-q", "8", "-t", "1"],
        Duration::from_secs(30),
    );
    assert!(ok, "reads of the read-only namespace: {said}");
    let (ok, said) = perf(
        port,
        "1",
        &["-w", "randwrite", "-o", "4k", "-q", "1", "-t", "1"],
        Duration::from_secs(30),
    );
    assert!(!ok, "writes to the read-only namespace succeeded: {said}");
    assert!(said.contains("Write Protected"), "{said}");

    // The image cannot be grown through a read-only bdev.
    let e = d
        .rpc(&["bdev_rbd_resize", "RbdRo", "32"])
        .expect_err("resize of a read-only bdev");
    assert!(e.contains("read-only"), "{e}");
    assert_eq!(c.image_size(POOL, &image).unwrap(), 16 << 20);

    d.rpc_ok(&["nvmf_subsystem_remove_ns", NQN, "1"]);
    d.rpc_ok(&["bdev_rbd_delete", "RbdRo"]);
    assert!(!d.logs().contains("panicked"), "{}", d.logs());
    drop(d);
    let _ = c.remove_image(POOL, &image);
}
