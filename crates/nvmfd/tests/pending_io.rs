//! `nvmf_get_stats` reports `pending_bdev_io`: the I/O commands executing in
//! a backend at that moment. nvmfd serves a file bdev (io_uring, O_DIRECT on
//! the target/ filesystem, so reads really wait for the disk) while `nvmf
//! perf` keeps 64 reads in flight; sampled during the run the counter must
//! be seen above 0 (and never above the queue depth), and back at 0 once
//! the host is done.

use nvmf_rpc::RpcClient;
use nvmf_testkit::{bins::nvmf as nvmf_path, free_port};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.nvmfd:pending";
const QD: u64 = 64;

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nvmfd_pending_io");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn pending(c: &mut RpcClient) -> u64 {
    let v = c.call("nvmf_get_stats", None).expect("nvmf_get_stats");
    v["poll_groups"]
        .as_array()
        .expect("poll_groups")
        .iter()
        .map(|g| g["pending_bdev_io"].as_u64().expect("pending_bdev_io"))
        .sum()
}

#[test]
fn pending_bdev_io_counts_commands_in_the_backend() {
    let img = tmp("f0.img");
    let _ = std::fs::remove_file(&img);
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(256 << 20).unwrap();
    drop(f);
    let port = free_port();
    let cfg = format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[{{"method":"bdev_uring_create","params":{{"name":"F0","filename":"{}","block_size":4096}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"F0"}}}}}},
{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#,
        img.display()
    );
    let d = nvmf_testkit::Daemon::builder(cfg)
        .args(["-m", "0"])
        .listening(&[port])
        .start();
    let mut c = RpcClient::connect(&d.rpc_socket, 50).expect("rpc connect");
    assert_eq!(pending(&mut c), 0, "idle");

    let mut perf = Command::new(nvmf_path())
        .args([
            "perf",
            "-r",
            &nvmf_testkit::trid(port, NQN),
            "--no-progress",
        ])
        .args([
            "-q",
            &QD.to_string(),
            "-o",
            "4096",
            "-w",
            "randread",
            "-t",
            "3",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvmf perf");
    let start = Instant::now();
    let mut seen = Vec::new();
    while perf.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(30), "nvmf perf hangs");
        if start.elapsed() > Duration::from_millis(500) {
            seen.push(pending(&mut c));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = perf.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nvmf perf failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.logs()
    );
    let max = seen.iter().copied().max().unwrap_or(0);
    eprintln!("pending_bdev_io samples: {} taken, max {max}", seen.len());
    assert!(
        max > 0,
        "pending_bdev_io never above 0 in {} samples",
        seen.len()
    );
    assert!(max <= QD, "pending_bdev_io {max} above the queue depth");
    // The host is gone: nothing executing any more.
    let deadline = Instant::now() + Duration::from_secs(5);
    while pending(&mut c) != 0 {
        assert!(Instant::now() < deadline, "pending_bdev_io stays above 0");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(d);
    let _ = std::fs::remove_file(&img);
}
