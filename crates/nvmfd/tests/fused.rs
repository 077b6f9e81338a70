//! Fused Compare and Write (VMware's atomic test-and-set) on the real
//! daemon over TCP: `nvmfd -m 0,1` (two reactors), two hosts (different
//! host NQNs and host IDs, each its own controller) with two I/O queues
//! each, placed over both reactors. On a RAM namespace (malloc: writes
//! done inside the reactor) and on an io_uring file namespace (writes in
//! flight in the kernel when a compare-and-write arrives):
//! - rounds of test-and-set on one lock range from both hosts at once:
//!   each round exactly one host wins (both halves succeed) and the other
//!   gets Compare Failure + Command Aborted due to Failed Fused Command;
//!   the winner releases the lock with a second compare-and-write;
//! - meanwhile each host's other queue keeps writing right next to the
//!   lock range: none of those writes fails, and every block holds the
//!   last data written to it at the end;
//! - the lock range is never torn: at the end every block of it holds the
//!   final state, and each round's state was seen whole by the winner's
//!   compare;
//! - on the file namespace the compare-and-write spans 16 blocks (ACWU +
//!   1, 8 KiB: both halves' data through R2T), on the RAM one 8 blocks
//!   (4 KiB, in the capsule);
//! - Identify Controller reports FUSES bit 0 and ACWU;
//! - `/metrics` counts each bdev's compare-and-writes and miscompares
//!   (3 compared per round: both tries and the release; 1 miscompare).

use nvmf_host::controller::{ConnectOptions, Controller};
use nvmf_host::queue::IoQueue;
use nvmf_host::trid::TransportId;
use nvmf_wire::status::Status;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.nvmfd:fused";
const NS_BLOCKS: u64 = 16384;
/// First block of the lock range.
const LOCK: u64 = 4096;
/// Rounds of test-and-set per namespace.
const ROUNDS: u64 = 150;
/// Blocks each host's writer keeps rewriting next to the lock range.
const AROUND: u64 = 64;

fn config(port: u16, img: &std::path::Path) -> String {
    let l =
        format!(r#"{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}"#);
    format!(
        r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":{NS_BLOCKS}}}}},
   {{"method":"bdev_uring_create","params":{{"name":"F0","filename":"{img}","block_size":512}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP","in_capsule_data_size":4096,"max_io_size":131072}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true,"serial_number":"NVMFDFUSED0001"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":2,"bdev_name":"F0"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{l}}}}}
 ]}}]}}"#,
        img = img.display()
    )
}

/// The lock range's content in a state: every 512-byte block starts with
/// (round, owner) and is filled with a byte made of both.
fn state(round: u64, owner: u64, nlb: u32) -> Vec<u8> {
    let mut b = vec![0u8; nlb as usize * 512];
    for blk in b.chunks_mut(512) {
        blk.fill((round as u8) ^ (owner as u8).wrapping_mul(31));
        blk[..8].copy_from_slice(&round.to_le_bytes());
        blk[8..16].copy_from_slice(&owner.to_le_bytes());
    }
    b
}

fn wait_one(q: &mut IoQueue, slot: u16, what: &str) -> Status {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(c) = q.take_completion(slot) {
            q.release(slot);
            return c.status;
        }
        assert!(Instant::now() < deadline, "{what}: no completion in 10 s");
        q.poll(Some(Duration::from_millis(20)))
            .expect("queue failed");
    }
}

/// Fused Compare (`expected`) + Write (`new`) on the lock range: the two
/// statuses.
fn compare_and_write(q: &mut IoQueue, nsid: u32, expected: &[u8], new: &[u8]) -> (Status, Status) {
    let nlb = (expected.len() / 512) as u32;
    let len = expected.len() as u32;
    let s1 = q.alloc().expect("slot");
    let s2 = q.alloc().expect("slot");
    q.buf_mut(s1)[..expected.len()].copy_from_slice(expected);
    q.buf_mut(s2)[..new.len()].copy_from_slice(new);
    q.submit_compare_and_write(s1, s2, nsid, LOCK, nlb, len)
        .expect("submit compare and write");
    q.flush().expect("send");
    (wait_one(q, s1, "compare"), wait_one(q, s2, "write"))
}

fn read(q: &mut IoQueue, nsid: u32, lba: u64, nlb: u32) -> Vec<u8> {
    let s = q.alloc().expect("slot");
    q.submit_read(s, nsid, lba, nlb, nlb * 512).expect("read");
    q.flush().expect("send");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(c) = q.take_completion(s) {
            assert!(c.status.is_success(), "read failed: {:?}", c.status);
            let d = q.buf(s)[..nlb as usize * 512].to_vec();
            q.release(s);
            return d;
        }
        assert!(Instant::now() < deadline, "read: no completion");
        q.poll(Some(Duration::from_millis(20)))
            .expect("queue failed");
    }
}

/// Keeps 8 one-block writes outstanding over `first..first + AROUND`, each
/// block's data (host, sequence); returns the last sequence written to
/// each block and the failures.
fn write_around(
    mut q: IoQueue,
    nsid: u32,
    host: u64,
    first: u64,
    stop: &AtomicBool,
) -> (IoQueue, Vec<u64>, u64) {
    let mut last = vec![0u64; AROUND as usize];
    let mut inflight: std::collections::HashMap<u16, (u64, u64)> = Default::default();
    let mut seq = 0u64;
    let mut failed = 0u64;
    let submit = |q: &mut IoQueue, s: u16, seq: u64| {
        let blk = seq % AROUND;
        let b = q.buf_mut(s);
        b[..512].fill(seq as u8);
        b[..8].copy_from_slice(&host.to_le_bytes());
        b[8..16].copy_from_slice(&seq.to_le_bytes());
        q.submit_write(s, nsid, first + blk, 1, 512)
            .expect("submit write");
        (blk, seq)
    };
    for _ in 0..8 {
        seq += 1;
        let s = q.alloc().expect("slot");
        inflight.insert(s, submit(&mut q, s, seq));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !inflight.is_empty() {
        assert!(Instant::now() < deadline, "writer never finished");
        q.poll(Some(Duration::from_millis(20)))
            .expect("writer queue failed");
        while let Some(c) = q.next_completion() {
            let (blk, s) = inflight.remove(&c.slot).expect("known slot");
            if c.status.is_success() {
                // Writes to one block are never outstanding together (8 in
                // flight over 64 blocks, in order), so the last completed is
                // the last written.
                last[blk as usize] = last[blk as usize].max(s);
            } else {
                failed += 1;
            }
            if stop.load(Relaxed) {
                q.release(c.slot);
            } else {
                seq += 1;
                inflight.insert(c.slot, submit(&mut q, c.slot, seq));
            }
        }
        q.flush().expect("send");
    }
    (q, last, failed)
}

struct Host {
    _ctrl: Controller,
    caw: IoQueue,
    writer: IoQueue,
}

fn host(port: u16, n: u8) -> Host {
    let trid = TransportId::tcp("127.0.0.1", &port.to_string(), NQN);
    let mut opts = ConnectOptions::new(trid);
    opts.hostnqn =
        format!("nqn.2014-08.org.nvmexpress:uuid:0000000{n}-0000-0000-0000-00000000f05e");
    opts.hostid = [n; 16];
    let ctrl = Controller::connect(&opts).expect("connect");
    let id = ctrl.identify();
    assert_eq!(id.fuses.get() & 1, 1, "FUSES: Compare and Write");
    assert_eq!(id.acwu.get(), 15, "ACWU (0's based)");
    assert!(ctrl.set_num_queues(2).expect("Number of Queues") >= 2);
    let caw = ctrl.create_io_queue(1, 8, 16384).expect("I/O queue 1");
    let writer = ctrl.create_io_queue(2, 16, 65536).expect("I/O queue 2");
    Host {
        _ctrl: ctrl,
        caw,
        writer,
    }
}

/// One namespace's rounds; returns the hosts' queues for the next.
fn rounds(hosts: Vec<Host>, nsid: u32, nlb: u32) -> Vec<Host> {
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(2));
    let wins = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let winners: Arc<Mutex<Vec<Vec<u64>>>> =
        Arc::new(Mutex::new(vec![Vec::new(); ROUNDS as usize]));
    let t0 = Instant::now();
    let mut threads = Vec::new();
    for (i, h) in hosts.into_iter().enumerate() {
        let me = i as u64 + 1;
        let (stop, barrier, wins, winners) =
            (stop.clone(), barrier.clone(), wins.clone(), winners.clone());
        threads.push(std::thread::spawn(move || {
            let Host {
                _ctrl,
                mut caw,
                writer,
            } = h;
            // Host 1 writes just below the lock range, host 2 just above.
            let first = if me == 1 {
                LOCK - AROUND
            } else {
                LOCK + u64::from(nlb)
            };
            let wstop = stop.clone();
            let w = std::thread::spawn(move || write_around(writer, nsid, me, first, &wstop));
            for r in 1..=ROUNDS {
                barrier.wait();
                let (c, wr) =
                    compare_and_write(&mut caw, nsid, &state(r, 0, nlb), &state(r, me, nlb));
                if c.is_success() {
                    assert!(
                        wr.is_success(),
                        "round {r} host {me}: compare ok, write {wr:?}"
                    );
                    wins[i].fetch_add(1, Relaxed);
                    winners.lock().unwrap()[r as usize - 1].push(me);
                } else {
                    assert_eq!(c, Status::COMPARE_FAILURE.with_dnr(), "round {r} host {me}");
                    assert_eq!(wr, Status::ABORTED_FAILED_FUSED, "round {r} host {me}");
                }
                barrier.wait();
                let n = winners.lock().unwrap()[r as usize - 1].clone();
                assert_eq!(n.len(), 1, "round {r}: winners {n:?}");
                if n[0] == me {
                    // Release: only the owner's state matches.
                    let (c, wr) = compare_and_write(
                        &mut caw,
                        nsid,
                        &state(r, me, nlb),
                        &state(r + 1, 0, nlb),
                    );
                    assert_eq!(
                        (c, wr),
                        (Status::SUCCESS, Status::SUCCESS),
                        "round {r}: release"
                    );
                }
            }
            barrier.wait();
            stop.store(true, Relaxed);
            let (mut writer, last, failed) = w.join().expect("writer thread");
            assert_eq!(failed, 0, "host {me}: writes next to the lock failed");
            // Every block holds the last data written to it.
            let got = read(&mut writer, nsid, first, AROUND as u32);
            for (b, blk) in got.chunks(512).enumerate() {
                let seq = u64::from_le_bytes(blk[8..16].try_into().unwrap());
                assert_eq!(
                    (u64::from_le_bytes(blk[..8].try_into().unwrap()), seq),
                    (me, last[b]),
                    "host {me} block {b}"
                );
                assert!(
                    blk[16..].iter().all(|&x| x == seq as u8),
                    "host {me} block {b} torn"
                );
            }
            Host { _ctrl, caw, writer }
        }));
    }
    let hosts: Vec<Host> = threads
        .into_iter()
        .map(|t| t.join().expect("host thread"))
        .collect();
    let (a, b) = (wins[0].load(Relaxed), wins[1].load(Relaxed));
    eprintln!(
        "nsid {nsid}: {ROUNDS} rounds of test-and-set ({nlb} blocks) in {:.2} s: host 1 won {a}, host 2 won {b}",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(a + b, ROUNDS);
    hosts
}

#[test]
fn two_hosts_test_and_set_with_writes_around_on_ram_and_file() {
    let img = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("nvmfd-fused-{}.img", std::process::id()));
    std::fs::File::create(&img)
        .unwrap()
        .set_len(NS_BLOCKS * 512)
        .unwrap();
    let metrics = nvmf_testkit::free_port();
    let d = nvmf_testkit::Daemon::start_on_free_port(|port| {
        nvmf_testkit::Daemon::builder(config(port, &img))
            .args(["-m", "0,1", "--metrics", &format!("127.0.0.1:{metrics}")])
            .listening(&[port])
            .ready_when(&format!("listening on 127.0.0.1:{port} (tcp)"))
            .ready_within(Duration::from_secs(10))
    });
    let mut hosts = vec![host(d.port(), 1), host(d.port(), 2)];
    for (nsid, nlb) in [(1u32, 8u32), (2, 16)] {
        // The lock starts free at round 1.
        let s = hosts[0].caw.alloc().unwrap();
        hosts[0].caw.buf_mut(s)[..nlb as usize * 512].copy_from_slice(&state(1, 0, nlb));
        hosts[0]
            .caw
            .submit_write(s, nsid, LOCK, nlb, nlb * 512)
            .unwrap();
        hosts[0].caw.flush().unwrap();
        assert!(wait_one(&mut hosts[0].caw, s, "initial write").is_success());
        hosts = rounds(hosts, nsid, nlb);
        // Not torn: every block of the range holds the final state.
        let got = read(&mut hosts[1].caw, nsid, LOCK, nlb);
        assert!(
            got == state(ROUNDS + 1, 0, nlb),
            "nsid {nsid}: the lock range is not in its final state"
        );
    }
    let body = scrape(metrics);
    for bdev in ["Malloc0", "F0"] {
        for (name, want) in [
            ("nvmf_bdev_compare_and_writes_total", 3 * ROUNDS),
            ("nvmf_bdev_compare_and_write_miscompares_total", ROUNDS),
        ] {
            let line = format!("{name}{{bdev=\"{bdev}\"}} {want}\n");
            assert!(body.contains(&line), "no {line:?} in\n{body}");
        }
    }
    drop(hosts);
    drop(d);
    let _ = std::fs::remove_file(&img);
}

/// The body of `GET /metrics` on 127.0.0.1:`port`.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}
