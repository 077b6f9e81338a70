//! The real daemon serving an RBD image of the test Ceph cluster to the
//! user-space initiator (no guest): `nvmf perf --verify` reads back what it
//! wrote through nvmfd; and removing the namespace, then `bdev_rbd_delete`,
//! while 128 KiB writes at QD64 are in flight ends that I/O in bounds — the
//! RPCs answer, the initiator's run ends (with errors for the namespace that
//! went away, not a hang), and the daemon keeps serving the subsystem's other
//! namespace. And a bdev created read-only over RPC as rpc.py does
//! (`bdev_rbd_create -r`) serves reads, refuses writes with Namespace Is
//! Write Protected and cannot be resized. And fused Compare and Write on an
//! RBD namespace (reads and writes that complete later, in librbd): two
//! queues doing rounds of test-and-set on one block while a third writes
//! next to it, exactly one winner per round (docs/COMPARE-AND-WRITE.md).
//! The kernel-host tests over RBD are nvmf-interop's `rbd.rs`.

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

/// One 4096-byte block in a state of the lock: (round, owner) then a fill.
fn lock_state(round: u64, owner: u64) -> Vec<u8> {
    let mut b = vec![(round as u8) ^ (owner as u8).wrapping_mul(31); 4096];
    b[..8].copy_from_slice(&round.to_le_bytes());
    b[8..16].copy_from_slice(&owner.to_le_bytes());
    b
}

/// Submits on `q` and waits for every completion of `slots` (bounded).
fn wait_slots(q: &mut nvmf_host::queue::IoQueue, slots: &[u16]) -> Vec<nvmf_wire::status::Status> {
    q.flush().expect("send");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = vec![None; slots.len()];
    while out.iter().any(Option::is_none) {
        assert!(Instant::now() < deadline, "no completion in 30 s");
        q.poll(Some(Duration::from_millis(20))).expect("queue");
        for (i, &s) in slots.iter().enumerate() {
            if out[i].is_none() {
                if let Some(c) = q.take_completion(s) {
                    out[i] = Some(c.status);
                }
            }
        }
    }
    out.into_iter().map(|s| s.unwrap()).collect()
}

#[test]
fn rbd_compare_and_write_test_and_set() {
    use nvmf_host::controller::{ConnectOptions, Controller};
    use nvmf_host::trid::TransportId;
    use nvmf_wire::status::Status;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::{Arc, Barrier, Mutex};

    match ceph_check() {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("skipped: NVMFD_SKIP_CEPH=1");
            return;
        }
        Err(e) => panic!("{e}"),
    }
    const LOCK: u64 = 100;
    const ROUNDS: u64 = 40;
    let c = CephCluster::shared();
    let image = format!("nvmfd-caw-{}", std::process::id());
    c.create_image(POOL, &image, 64, "layering")
        .unwrap_or_else(|e| panic!("{e}"));
    let port = free_port();
    let d = Daemon::builder(config(c, &image, port))
        .args(["-m", "0"])
        .listening(&[port])
        .ready_within(Duration::from_secs(60))
        .start();
    let ctrl = Controller::connect(&ConnectOptions::new(TransportId::tcp(
        "127.0.0.1",
        &port.to_string(),
        NQN,
    )))
    .expect("connect");
    assert!(ctrl.set_num_queues(3).expect("Number of Queues") >= 3);
    let mut qs: Vec<_> = (1..=3u16)
        .map(|qid| ctrl.create_io_queue(qid, 8, 16384).expect("I/O queue"))
        .collect();
    let mut writer = qs.pop().unwrap();

    // The lock starts free at round 1.
    let s = qs[0].alloc().unwrap();
    qs[0].buf_mut(s)[..4096].copy_from_slice(&lock_state(1, 0));
    qs[0].submit_write(s, 1, LOCK, 1, 4096).unwrap();
    assert_eq!(wait_slots(&mut qs[0], &[s]), [Status::SUCCESS]);
    qs[0].release(s);

    // Writes right next to the lock the whole time (the block after it).
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let w = std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop2.load(Relaxed) {
            let s = writer.alloc().unwrap();
            writer.buf_mut(s)[..4096].fill(n as u8);
            writer.submit_write(s, 1, LOCK + 1, 1, 4096).unwrap();
            let st = wait_slots(&mut writer, &[s]);
            writer.release(s);
            assert_eq!(st, [Status::SUCCESS], "write next to the lock");
            n += 1;
        }
        n
    });

    let barrier = Arc::new(Barrier::new(2));
    let winners = Arc::new(Mutex::new(vec![Vec::new(); ROUNDS as usize]));
    let wins = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let threads: Vec<_> = qs
        .into_iter()
        .enumerate()
        .map(|(i, mut q)| {
            let (barrier, winners, wins) = (barrier.clone(), winners.clone(), wins.clone());
            std::thread::spawn(move || {
                let me = i as u64 + 1;
                let caw = |q: &mut nvmf_host::queue::IoQueue, old: &[u8], new: &[u8]| {
                    let (s1, s2) = (q.alloc().unwrap(), q.alloc().unwrap());
                    q.buf_mut(s1)[..4096].copy_from_slice(old);
                    q.buf_mut(s2)[..4096].copy_from_slice(new);
                    q.submit_compare_and_write(s1, s2, 1, LOCK, 1, 4096)
                        .unwrap();
                    let st = wait_slots(q, &[s1, s2]);
                    q.release(s1);
                    q.release(s2);
                    (st[0], st[1])
                };
                for r in 1..=ROUNDS {
                    barrier.wait();
                    let st = caw(&mut q, &lock_state(r, 0), &lock_state(r, me));
                    if st == (Status::SUCCESS, Status::SUCCESS) {
                        wins[i].fetch_add(1, Relaxed);
                        winners.lock().unwrap()[r as usize - 1].push(me);
                    } else {
                        assert_eq!(
                            st,
                            (
                                Status::COMPARE_FAILURE.with_dnr(),
                                Status::ABORTED_FAILED_FUSED
                            ),
                            "round {r} queue {me}"
                        );
                    }
                    barrier.wait();
                    let who = winners.lock().unwrap()[r as usize - 1].clone();
                    assert_eq!(who.len(), 1, "round {r}: winners {who:?}");
                    if who[0] == me {
                        let st = caw(&mut q, &lock_state(r, me), &lock_state(r + 1, 0));
                        assert_eq!(st, (Status::SUCCESS, Status::SUCCESS), "release {r}");
                    }
                }
                q
            })
        })
        .collect();
    let mut qs: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().expect("test-and-set thread"))
        .collect();
    stop.store(true, Relaxed);
    let writes = w.join().expect("writer thread");
    let s = qs[0].alloc().unwrap();
    qs[0].submit_read(s, 1, LOCK, 1, 4096).unwrap();
    assert_eq!(wait_slots(&mut qs[0], &[s]), [Status::SUCCESS]);
    assert!(
        qs[0].buf(s)[..4096] == lock_state(ROUNDS + 1, 0)[..],
        "the lock block is not in its final state"
    );
    eprintln!(
        "RBD: {ROUNDS} rounds of test-and-set: queue 1 won {}, queue 2 won {}; {writes} writes next to the lock",
        wins[0].load(Relaxed),
        wins[1].load(Relaxed)
    );
    assert!(!d.logs().contains("panicked"), "{}", d.logs());
    drop(qs);
    drop(ctrl);
    drop(d);
    let _ = c.remove_image(POOL, &image);
}
