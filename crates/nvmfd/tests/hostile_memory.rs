//! A hostile host against the real `nvmfd`: it opens every I/O queue its
//! controller may have and fills each with large writes (Transport SGL, so
//! nvmfd answers with R2Ts and must find a data buffer for each) whose
//! H2CData it never sends. nvmfd's memory (VmRSS) must stay under the
//! configured data buffer budget (`num_shared_buffers` × `io_unit_size`)
//! plus a fixed overhead, a bystander host doing verified 4 KiB
//! write/read at QD1 on its own controller must keep its latency (p99
//! during the attack within a small factor of before), and the attacker's
//! queues must be closed by the H2CData timeout.
//!
//! `NVMFD_BIN=/path/to/nvmfd` runs the attack against another build (one
//! without the budget and timeout options: only the memory part is run),
//! to show the bound is what fails on unbounded code.

#[path = "common/raw_sock.rs"]
mod raw_sock;
#[path = "../../nvmf-tcp/tests/common/mod.rs"]
mod tcp_common;

use nvmf_testkit::{bins::nvmfd_command, free_port, p99, rss, Process as Nvmfd};
use nvmf_wire::command::{Command, SglDescriptor};
use raw_sock::Sock;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tcp_common::host::*;

const NQN: &str = DEFAULT_NQN;
/// I/O queues per controller (the attacker opens all of them).
const QUEUES: u16 = 16;
/// Queue depth of each I/O queue (SQSIZE + 1).
const DEPTH: u16 = 128;
/// Size of each unanswered write.
const IO: u32 = 131072;
/// The data buffer budget: NUM_SHARED_BUFFERS × 128 KiB io_unit_size.
const NUM_SHARED_BUFFERS: u64 = 64;
const BUDGET: u64 = NUM_SHARED_BUFFERS * 131072;
/// What may come on top of the budget: one overdraft buffer per queue
/// (a queue with nothing charged always gets one), receive/send buffers,
/// slot tables, allocator slack, thread stacks touched. (Measured: the
/// whole rise is about budget + overdrafts + 1 MiB; unbounded code pins
/// QUEUES × DEPTH × IO = 256 MiB.)
const OVERHEAD: u64 = (QUEUES as u64 + 2) * 131072 + (8 << 20);
const H2C_TIMEOUT_MS: u64 = 5000;

fn config(port: u16) -> String {
    let l =
        format!(r#"{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}"#);
    format!(
        r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":16384}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP","max_queue_depth":{DEPTH},
     "max_io_qpairs_per_ctrlr":{QUEUES},"max_io_size":131072,"io_unit_size":131072,
     "num_shared_buffers":{NUM_SHARED_BUFFERS}}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{l}}}}}
 ]}}]}}"#
    )
}

fn sock(port: u16) -> Sock {
    Sock::connect(port, Duration::from_secs(10))
}

/// I/O queue `qid` of controller `cntlid`.
fn io_queue(port: u16, cntlid: u16, qid: u16) -> (Sock, Host) {
    let mut s = sock(port);
    let mut h = Host::new();
    init(&mut s, &mut h, false, false);
    let c = connect(&mut s, &mut h, qid, DEPTH - 1, cntlid, NQN, HOSTNQN);
    assert_eq!(
        c.status(),
        nvmf_wire::status::Status::SUCCESS,
        "I/O connect qid {qid}"
    );
    (s, h)
}

/// `n` verified 4 KiB write + read pairs at QD1; returns each pair's latency.
fn bystander_io(s: &mut Sock, h: &mut Host, n: usize, seed: u64) -> Vec<Duration> {
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let slba = (i as u64 % 64) * 8;
        let data = pattern(seed + i as u64, 4096);
        let t = Instant::now();
        let st = write(s, h, slba, &data, true);
        let (rs, back) = read(s, h, slba, 4096);
        lat.push(t.elapsed());
        assert!(st.is_success() && rs.is_success(), "bystander I/O failed");
        assert!(back == data, "bystander read back what it wrote");
    }
    lat
}

#[test]
fn unanswered_r2ts_on_every_queue_stay_within_the_buffer_budget() {
    let legacy = std::env::var_os("NVMFD_BIN");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (mut d, port, cfg) = {
        let mut started = None;
        for attempt in 0..5 {
            let port = free_port();
            let cfg = dir.join(format!("hostile-{}-{attempt}.json", std::process::id()));
            std::fs::write(&cfg, config(port)).unwrap();
            let rpc = dir.join(format!("hostile-{}-{attempt}.sock", std::process::id()));
            let mut cmd = match &legacy {
                Some(bin) => std::process::Command::new(bin),
                None => nvmfd_command(),
            };
            cmd.arg("-c").arg(&cfg).args(["-m", "0", "-r"]).arg(&rpc);
            if legacy.is_none() {
                cmd.args(["--h2c-timeout-ms", &H2C_TIMEOUT_MS.to_string()]);
            }
            let mut n = Nvmfd::spawn(&mut cmd);
            if n.wait_ready("listening on 127.0.0.1", Duration::from_secs(20)) {
                started = Some((n, port, cfg));
                break;
            }
            let _ = std::fs::remove_file(&cfg);
        }
        started.expect("nvmfd did not start")
    };
    let pid = d.pid();

    // The bystander: its own controller, one I/O queue, QD1 verified I/O.
    let mut badmin = sock(port);
    let mut bah = Host::new();
    let bcntl = admin_up(&mut badmin, &mut bah, false, false);
    let (mut bs, mut bh) = io_queue(port, bcntl, 1);
    bystander_io(&mut bs, &mut bh, 50, 1); // warm-up
    let t = Instant::now();
    let mut lat_before = bystander_io(&mut bs, &mut bh, 300, 100);
    let rate_before = 300.0 / t.elapsed().as_secs_f64();
    let before = p99(&mut lat_before);
    let rss_before = rss(pid);

    // The bystander keeps doing verified QD1 I/O in its own thread for
    // the whole attack (set-up included); latencies stamped with their end.
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let bystander = std::thread::spawn(move || {
        let mut lat = Vec::new();
        let mut i = 0u64;
        while !stop2.load(Ordering::Relaxed) {
            let l = bystander_io(&mut bs, &mut bh, 1, 1000 + i)[0];
            lat.push((Instant::now(), l));
            i += 1;
        }
        (bs, bh, lat)
    });
    std::thread::sleep(Duration::from_millis(100));
    let attack_start = Instant::now();

    // The attacker: every I/O queue, each full of 128 KiB writes whose
    // data never comes.
    let mut aadmin = sock(port);
    let mut aah = Host::new();
    let acntl = admin_up(&mut aadmin, &mut aah, false, false);
    let mut attackers = Vec::new();
    let mut rss_max = rss(pid);
    for qid in 1..=QUEUES {
        let (mut s, h) = io_queue(port, acntl, qid);
        let mut bytes = Vec::new();
        for cid in 0..DEPTH {
            let mut cmd = Command::new(0x01, 1000 + cid);
            cmd.set_nsid(1);
            cmd.set_lba_range(u64::from(cid) * 256 % 16384, IO / 512);
            cmd.set_sgl(SglDescriptor::transport(IO));
            bytes.extend(h.capsule(&cmd, &[]));
        }
        s.send(&bytes);
        attackers.push(s);
        rss_max = rss_max.max(rss(pid));
    }
    // The attack holds: RSS sampled for 2 s while the bystander goes on.
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(50));
        rss_max = rss_max.max(rss(pid));
    }
    stop.store(true, Ordering::Relaxed);
    let attack_time = attack_start.elapsed();
    let (mut bs, mut bh, lat) = bystander.join().expect("bystander thread");
    let during: Vec<Duration> = lat
        .iter()
        .filter(|(end, _)| *end >= attack_start)
        .map(|(_, l)| *l)
        .collect();
    assert!(
        during.len() >= 50,
        "bystander did only {} I/Os during the attack",
        during.len()
    );
    let during_p99 = p99(&mut during.clone());
    // QD1 latency percentiles hide stalls (one slow I/O per stall), the
    // I/O rate does not.
    let rate_during = during.len() as f64 / attack_time.as_secs_f64();
    let bound = rss_before + BUDGET + OVERHEAD;
    eprintln!(
        "hostile_memory: RSS before attack {} KiB, max during {} KiB (+{} KiB), bound {} KiB \
         (budget {} KiB + overhead {} KiB); bystander p99 before {:?}, during {:?}; I/O pairs per second before {:.0}, during {:.0}; \
         unfixed would pin {} MiB of slot buffers",
        rss_before >> 10,
        rss_max >> 10,
        rss_max.saturating_sub(rss_before) >> 10,
        bound >> 10,
        BUDGET >> 10,
        OVERHEAD >> 10,
        before,
        during_p99,
        rate_before,
        rate_during,
        (u64::from(QUEUES) * u64::from(DEPTH) * u64::from(IO)) >> 20,
    );
    assert!(
        rss_max <= bound,
        "nvmfd RSS {} KiB exceeds the bound {} KiB (before: {} KiB)",
        rss_max >> 10,
        bound >> 10,
        rss_before >> 10
    );
    if legacy.is_some() {
        return;
    }
    let allowed = (before * 5).max(Duration::from_millis(10));
    assert!(
        during_p99 <= allowed,
        "bystander p99 {during_p99:?} during the attack vs {before:?} before"
    );
    assert!(
        rate_during >= rate_before / 4.0,
        "bystander I/O rate {rate_during:.0}/s during the attack vs {rate_before:.0}/s before"
    );

    // The H2CData timeout closes every attacker queue (the R2Ts they were
    // sent are still in their sockets: read through them to EOF).
    for (i, s) in attackers.iter_mut().enumerate() {
        s.s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut tmp = [0u8; 65536];
        loop {
            match s.s.read(&mut tmp) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e)
                    if (e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut)
                        && attack_start.elapsed()
                            < Duration::from_millis(H2C_TIMEOUT_MS + 5000) => {}
                Err(e) => panic!(
                    "attacker queue {} not closed {:?} after the attack: {e}\n{}",
                    i + 1,
                    attack_start.elapsed(),
                    d.logs()
                ),
            }
        }
    }
    let closed_after = attack_start.elapsed();
    assert!(
        closed_after >= Duration::from_millis(H2C_TIMEOUT_MS - 200),
        "closed before the H2CData timeout ({closed_after:?})"
    );
    assert!(
        d.logged("H2CData timeout"),
        "the close is logged:\n{}",
        d.logs()
    );
    // The bystander is unaffected, and the controller's budget is free again.
    bystander_io(&mut bs, &mut bh, 20, 5000);
    d.kill();
    let _ = std::fs::remove_file(&cfg);
}
