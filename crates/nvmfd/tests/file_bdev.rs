//! End-to-end tests of file bdevs through the real daemon: nvmfd serves a
//! file (on the target/ filesystem, so O_DIRECT is used) through
//! `bdev_uring_create` / `bdev_aio_create`, and the `nvmf perf --verify`
//! initiator from nvmf-host drives a random read/write mix against it at
//! 512- and 4096-byte block sizes. Also: a host killed with I/O in flight
//! leaves the daemon serving. The `nvmf` binary is taken from this build's
//! target dir (built with `cargo build -p nvmf-host` if missing).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.nvmfd:file-test";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvmfd_file_bdev");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// target/<profile>/nvmf, built on demand.
fn nvmf_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("nvmf");
    if !p.exists() {
        let st = Command::new(env!("CARGO"))
            .args(["build", "-p", "nvmf-host", "--bin", "nvmf"])
            .status()
            .expect("cargo build -p nvmf-host");
        assert!(st.success(), "building the nvmf CLI failed");
    }
    assert!(p.exists(), "no nvmf binary at {}", p.display());
    p
}

struct Daemon {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
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
        let cfg_path = tmp(&format!("{tag}.json"));
        std::fs::write(&cfg_path, cfg).unwrap();
        let sock = tmp(&format!("{tag}.sock"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_nvmfd"))
            .args(["-c", cfg_path.to_str().unwrap(), "-m", "0"])
            .arg("-r")
            .arg(&sock)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nvmfd");
        let log = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().unwrap();
        let l2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                l2.lock().unwrap().push(line);
            }
        });
        let d = Daemon { child, port, log };
        d.wait_log("listening on");
        d
    }

    fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn wait_log(&self, needle: &str) {
        let start = Instant::now();
        while !self.logs().contains(needle) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nvmfd never logged {needle:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn trid(&self) -> String {
        format!(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{} subnqn:{NQN}",
            self.port
        )
    }

    fn perf(&self, args: &[&str], limit: Duration) -> Output {
        let trid = self.trid();
        let mut child = Command::new(nvmf_path())
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

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
        let mut child = Command::new(nvmf_path())
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
        let _ = child.kill();
        let _ = child.wait();
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
