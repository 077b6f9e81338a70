//! End-to-end tests of file bdevs through the real daemon: nvmfd serves a
//! file (on the target/ filesystem, so O_DIRECT is used) through
//! `bdev_uring_create` / `bdev_aio_create`, and the `nvmf perf --verify`
//! initiator from nvmf-host drives a random read/write mix against it at
//! 512- and 4096-byte block sizes. Also: a host killed with I/O in flight
//! leaves the daemon serving. The `nvmf` binary is taken from this build's
//! target dir (built with `cargo build -p nvmf-host` if missing).

use nvmf_testkit::{bins::nvmf as nvmf_path, free_port};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.nvmfd:file-test";

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvmfd_file_bdev");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// target/<profile>/nvmf, built on demand; must exist.
fn nvmf() -> PathBuf {
    let p = nvmf_path();
    assert!(p.exists(), "no nvmf binary at {}", p.display());
    p
}

/// A running nvmfd (nvmf-testkit's: killed on drop, config and socket
/// removed).
struct Daemon {
    nvmfd: nvmf_testkit::Daemon,
    port: u16,
}

impl std::ops::Deref for Daemon {
    type Target = nvmf_testkit::Daemon;
    fn deref(&self) -> &nvmf_testkit::Daemon {
        &self.nvmfd
    }
}

impl Daemon {
    fn start(tag: &str, method: &str, block_size: u32, size: u64) -> Daemon {
        let img = tmp(&format!("{tag}.img"));
        let _ = std::fs::remove_file(&img);
        std::fs::File::create(&img).unwrap().set_len(size).unwrap();
        let port = free_port();
        let extra = if method == "bdev_aio_create" {
            r#","fallocate":true"#
        } else {
            ""
        };
        let cfg = format!(
            r#"{{"subsystems":[{{"subsystem":"bdev","config":[{{"method":"{method}","params":{{"name":"F0","filename":"{}","block_size":{block_size}{extra}}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"F0"}}}}}},
{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#,
            img.display()
        );
        let nvmfd = nvmf_testkit::Daemon::builder(cfg).args(["-m", "0"]).start();
        let d = Daemon { nvmfd, port };
        d.wait_log("listening on");
        d
    }

    fn trid(&self) -> String {
        nvmf_testkit::trid(self.port, NQN)
    }

    fn perf(&self, args: &[&str], limit: Duration) -> Output {
        let trid = self.trid();
        let mut child = Command::new(nvmf())
            .args(["perf", "-r", &trid, "--no-progress"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nvmf");
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > limit {
                let _ = child.kill();
                panic!("nvmf perf {args:?} ran past {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.wait_with_output().unwrap()
    }
}

fn perf_verify(method: &str, block_size: u32, io: &str) {
    let tag = format!("{method}-{block_size}-{io}");
    let d = Daemon::start(&tag, method, block_size, 64 << 20);
    d.wait_log("file bdev opened (io_uring)");
    assert!(
        d.logs().contains("direct=true"),
        "O_DIRECT on the target/ filesystem:\n{}",
        d.logs()
    );
    let args = [
        "-q", "16", "-o", io, "-w", "randrw", "-M", "75", "-t", "3", "--verify",
    ];
    let out = d.perf(&args, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nvmf perf failed\n{stdout}\n{}\n--- nvmfd ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.logs()
    );
    assert!(stdout.contains(" 0 mismatched - OK"), "{stdout}");
    eprintln!("{stdout}");
}

#[test]
fn perf_verify_uring_512() {
    perf_verify("bdev_uring_create", 512, "4096");
}

#[test]
fn perf_verify_uring_4096() {
    perf_verify("bdev_uring_create", 4096, "4096");
}

#[test]
fn perf_verify_aio_4096_large_io() {
    // 128 KiB I/O: R2T writes and multi-PDU reads through the file.
    perf_verify("bdev_aio_create", 4096, "131072");
}

#[test]
fn host_killed_with_io_in_flight() {
    let d = Daemon::start("killed", "bdev_uring_create", 4096, 64 << 20);
    let trid = d.trid();
    for _ in 0..3 {
        let mut child = Command::new(nvmf())
            .args([
                "perf",
                "-r",
                &trid,
                "--no-progress",
                "-q",
                "64",
                "-o",
                "65536",
                "-w",
                "randwrite",
                "-t",
                "10",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(700));
        // Still running (a 10 s run at queue depth 64): killed mid-I/O.
        let early = child.try_wait().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            early.is_none(),
            "nvmf perf exited ({early:?}) before it was killed:\n{}",
            d.logs()
        );
    }
    // The daemon survived and still serves correct data.
    let out = d.perf(
        &[
            "-q", "8", "-o", "4096", "-w", "randrw", "-t", "1", "--verify",
        ],
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        d.logs()
    );
}

/// Compare and Verify on an io_uring file bdev (their reads complete
/// later, on the reactor's ring, into buffers of their own): equal data
/// succeeds, one byte off is Compare Failure, Verify reads the range.
#[test]
fn compare_and_verify_on_a_uring_file() {
    use nvmf_host::{ConnectOptions, Controller, TransportId};
    use nvmf_wire::command::Command;
    use nvmf_wire::opcode::IoOpcode;
    let d = Daemon::start("cmp", "bdev_uring_create", 4096, 16 << 20);
    d.wait_log("file bdev opened (io_uring)");
    let ctrl = Controller::connect(&ConnectOptions::new(TransportId::parse(&d.trid()).unwrap()))
        .expect("connect");
    let mut q = ctrl.create_io_queue(1, 16, 65536).expect("I/O queue");
    let mut run = |op: IoOpcode, slba: u64, nlb: u32, data: &[u8]| {
        let slot = q.alloc().unwrap();
        q.buf_mut(slot)[..data.len()].copy_from_slice(data);
        let mut c = Command::new(op as u8, 0);
        c.set_nsid(1).set_lba_range(slba, nlb);
        let r = q
            .execute(slot, c, data.len() as u32, Duration::from_secs(10))
            .unwrap();
        q.release(slot);
        r.status
    };
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    assert!(run(IoOpcode::Write, 10, 2, &pattern).is_success());
    let st = run(IoOpcode::Compare, 10, 2, &pattern);
    assert!(st.is_success(), "{st:?}");
    let mut off = pattern.clone();
    off[5000] ^= 0x80;
    let st = run(IoOpcode::Compare, 10, 2, &off);
    assert_eq!((st.sct, st.sc), (2, 0x85), "{st:?}");
    let st = run(IoOpcode::Verify, 0, 16, &[]);
    assert!(st.is_success(), "{st:?}");
    let st = run(IoOpcode::Verify, 4095, 2, &[]);
    assert_eq!((st.sct, st.sc), (0, 0x80), "LBA out of range: {st:?}");
}
