//! Adaptive polling never sleeps through a completion
//! (`crates/nvmfd/src/poll_window.rs`).
//!
//! With the default `--poll-us`, a reactor that holds only commands
//! executing in backends sleeps at once and counts on the backend to wake
//! it. This test takes away the tick's safety net (debug builds:
//! `NVMFD_DEBUG_TICK_MS`, ten minutes instead of 100 ms), so a completion
//! whose wake-up the reactor missed would hang its command instead of
//! arriving on the next tick, and drives both kinds of backend wake-up:
//! - a file bdev (io_uring, O_DIRECT on the target/ filesystem): the kernel
//!   signals the reactor's eventfd; `nvmf perf --verify` at QD 1 and QD 16;
//! - a RAM bdev's Write Zeroes of 1 MiB, which runs on the helper pool: a
//!   helper thread posts the completion and writes the eventfd; 200 of
//!   them at QD 1, each read back.
//!
//! Every command must complete within 10 s, the data must verify, and
//! `/metrics` must show that the reactor did sleep holding only backend
//! work (`nvmf_reactor_backend_waits_total` > 0), so the path under test
//! was taken.

use nvmf_host::controller::{ConnectOptions, Controller};
use nvmf_host::trid::TransportId;
use nvmf_testkit::{bins::nvmf as nvmf_path, free_port, metric_total, scrape_metrics};
use nvmf_wire::command::Command as NvmeCommand;
use nvmf_wire::opcode::IoOpcode;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.nvmfd:adaptive-polling";
const BLOCK: u32 = 4096;

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvmfd_adaptive_polling");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn backend_waits(body: &str) -> u64 {
    metric_total(body, "nvmf_reactor_backend_waits_total")
}

fn perf(port: u16, args: &[&str]) -> String {
    let mut child = Command::new(nvmf_path())
        .args([
            "perf",
            "-r",
            &nvmf_testkit::trid(port, NQN),
            "--no-progress",
            "--ns",
            "1",
        ])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvmf perf");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("nvmf perf {args:?} hung: a completion was never delivered");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "nvmf perf {args:?} failed\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" 0 mismatched - OK"), "{stdout}");
    stdout
}

#[test]
fn reactor_never_sleeps_through_a_backend_completion() {
    let img = tmp("f0.img");
    let _ = std::fs::remove_file(&img);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let port = free_port();
    let metrics = free_port();
    let cfg = format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[
{{"method":"bdev_uring_create","params":{{"name":"F0","filename":"{}","block_size":4096}}}},
{{"method":"bdev_malloc_create","params":{{"name":"M0","num_blocks":4096,"block_size":4096}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"F0"}}}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":2,"bdev_name":"M0"}}}}}},
{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#,
        img.display()
    );
    // The default --poll-us (adaptive polling on), no tick for 10 minutes.
    let d = nvmf_testkit::Daemon::builder(cfg)
        .args(["-m", "0", "--metrics", &format!("127.0.0.1:{metrics}")])
        .env("NVMFD_DEBUG_TICK_MS", "600000")
        .listening(&[port])
        .start();
    d.wait_log("file bdev opened (io_uring)");
    assert!(d.logs().contains("direct=true"), "{}", d.logs());
    assert_eq!(
        backend_waits(&scrape_metrics(metrics)),
        0,
        "nothing served yet"
    );

    // 1. io_uring completions (the kernel writes the eventfd).
    for qd in ["1", "16"] {
        let out = perf(
            port,
            &[
                "-q", qd, "-o", "4096", "-w", "randrw", "-M", "50", "-t", "2", "--verify",
            ],
        );
        eprintln!("QD {qd}:\n{out}");
    }
    let after_uring = backend_waits(&scrape_metrics(metrics));
    assert!(
        after_uring > 0,
        "the reactor never slept holding only io_uring work: the path is not tested\n{}",
        scrape_metrics(metrics)
    );

    // 2. Helper-pool completions (another thread posts and wakes): Write
    //    Zeroes of 1 MiB on the RAM namespace, over a pattern, read back.
    let trid = TransportId::tcp("127.0.0.1", &port.to_string(), NQN);
    let ctrl = Controller::connect(&ConnectOptions::new(trid)).expect("connect");
    assert!(ctrl.set_num_queues(1).expect("Number of Queues") >= 1);
    const CHUNK: u32 = 128 << 10;
    let mut q = ctrl.create_io_queue(1, 8, CHUNK).expect("I/O queue");
    let nlb = (1u32 << 20) / BLOCK;
    let chunk_nlb = CHUNK / BLOCK;
    let limit = Duration::from_secs(10);
    for i in 0..200u64 {
        let lba = (i % 3) * u64::from(nlb);
        let s = q.alloc().expect("slot");
        // A pattern in the last 128 KiB of the range, which the zeroing
        // must reach.
        let at = lba + u64::from(nlb - chunk_nlb);
        q.buf_mut(s)[..CHUNK as usize].fill(0xa5);
        let mut w = NvmeCommand::new(IoOpcode::Write as u8, 0);
        w.set_nsid(2).set_lba_range(at, chunk_nlb);
        let c = q.execute(s, w, CHUNK, limit).expect("write");
        assert!(c.status.is_success(), "write {i}: {:?}", c.status);
        let mut z = NvmeCommand::new(IoOpcode::WriteZeroes as u8, 0);
        z.set_nsid(2).set_lba_range(lba, nlb);
        let c = q
            .execute(s, z, 0, limit)
            .unwrap_or_else(|e| panic!("Write Zeroes {i} never completed: {e}"));
        assert!(c.status.is_success(), "Write Zeroes {i}: {:?}", c.status);
        let mut r = NvmeCommand::new(IoOpcode::Read as u8, 0);
        r.set_nsid(2).set_lba_range(at, chunk_nlb);
        let c = q.execute(s, r, CHUNK, limit).expect("read");
        assert!(c.status.is_success(), "read {i}: {:?}", c.status);
        assert!(
            q.buf(s)[..CHUNK as usize].iter().all(|&b| b == 0),
            "Write Zeroes {i} left data behind"
        );
        q.release(s);
    }
    let after_helper = backend_waits(&scrape_metrics(metrics));
    assert!(
        after_helper > after_uring,
        "the reactor never slept holding only helper-pool work ({after_uring} -> {after_helper})"
    );
    eprintln!("backend waits: {after_uring} after io_uring, {after_helper} after the helper pool");
}
