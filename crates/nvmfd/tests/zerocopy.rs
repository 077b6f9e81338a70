//! Zero-copy sends of read data (`--zerocopy-send`, `nvmfd/src/zerocopy.rs`,
//! `nvmf-tcp/src/zerocopy.rs`) through the real daemon and `nvmf perf
//! --verify` on loopback, where the kernel copies every zero-copy send after
//! all and says so in its reports:
//! - `always`: C2HData payloads of 16 KiB and up go out zero-copy for the
//!   whole run (`nvmf_tcp_zerocopy_sends_total` counts them, every one
//!   reported copied), reads verify, and a host killed with 128 KiB reads
//!   in flight leaves the daemon serving the next host (its connection's
//!   buffers waited for the kernel's reports);
//! - `auto` (the default): the same reads verify, and the connection stops
//!   asking for zero-copy once the kernel has copied 64 calls in a row;
//! - `off`: no zero-copy call at all.

use nvmf_testkit::{bins::nvmf as nvmf_path, free_port, metric_total, scrape_metrics};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.nvmfd:zerocopy";

struct Target {
    d: nvmf_testkit::Daemon,
    port: u16,
    metrics: u16,
}

fn start(mode: &str) -> Target {
    let port = free_port();
    let metrics = free_port();
    let cfg = format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[
{{"method":"bdev_malloc_create","params":{{"name":"M0","num_blocks":16384,"block_size":4096}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"M0"}}}}}},
{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#
    );
    let d = nvmf_testkit::Daemon::builder(cfg)
        .args([
            "-m",
            "0",
            "--metrics",
            &format!("127.0.0.1:{metrics}"),
            "--zerocopy-send",
            mode,
        ])
        .listening(&[port])
        .start();
    Target { d, port, metrics }
}

fn perf_cmd(port: u16, args: &[&str]) -> Command {
    let mut c = Command::new(nvmf_path());
    c.args([
        "perf",
        "-r",
        &nvmf_testkit::trid(port, NQN),
        "--no-progress",
    ])
    .args(args)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

/// Runs `nvmf perf --verify` with `args`; returns the I/Os it counted.
fn verify(t: &Target, args: &[&str]) -> u64 {
    let mut child = perf_cmd(t.port, args)
        .args(["--verify", "--json"])
        .spawn()
        .expect("spawn nvmf perf");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("nvmf perf {args:?} hung\n{}", t.d.logs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "nvmf perf {args:?} failed\n{stdout}\n{}\n--- nvmfd ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        t.d.logs()
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("perf --json");
    assert_eq!(
        v["verify"]["mismatched_blocks"].as_u64(),
        Some(0),
        "{stdout}"
    );
    assert!(v["verify"]["blocks_checked"].as_u64() > Some(0), "{stdout}");
    v["total"]["read"]["total_ios"]
        .as_u64()
        .expect("total.read.total_ios")
}

#[test]
fn always_sends_zero_copy_verifies_and_survives_a_killed_host() {
    let t = start("always");
    let ios = verify(
        &t,
        &[
            "-q", "16", "-o", "131072", "-w", "randrw", "-M", "70", "-t", "2",
        ],
    );
    let ios16 = verify(
        &t,
        &[
            "-q", "32", "-o", "16384", "-w", "randrw", "-M", "80", "-t", "2",
        ],
    );
    let m = scrape_metrics(t.metrics);
    let calls = metric_total(&m, "nvmf_tcp_zerocopy_sends_total");
    let copied = metric_total(&m, "nvmf_tcp_zerocopy_copied_total");
    eprintln!("{ios} + {ios16} I/Os, {calls} zero-copy calls, {copied} reported copied");
    // Every read of 16 KiB or more went out zero-copy (a call may carry
    // several payloads, so fewer calls than reads).
    assert!(
        calls > ios16 / 32,
        "{calls} zero-copy calls for {ios16} 16 KiB reads"
    );
    assert!(
        calls > ios / 32,
        "{calls} zero-copy calls for {ios} 128 KiB reads"
    );
    assert!(copied > 0, "loopback copies, and the kernel says so:\n{m}");

    // A host killed with reads in flight.
    let mut victim = perf_cmd(
        t.port,
        &["-q", "32", "-o", "131072", "-w", "read", "-t", "30"],
    )
    .spawn()
    .expect("spawn nvmf perf");
    std::thread::sleep(Duration::from_millis(1500));
    victim.kill().unwrap();
    let _ = victim.wait();
    t.d.wait_log("closed");
    verify(
        &t,
        &[
            "-q", "16", "-o", "65536", "-w", "randrw", "-M", "50", "-t", "2",
        ],
    );
    let mut t = t;
    assert!(t.d.running(), "{}", t.d.logs());
}

#[test]
fn auto_turns_off_where_the_kernel_copies() {
    let t = start("auto");
    let ios = verify(
        &t,
        &[
            "-q", "16", "-o", "131072", "-w", "randrw", "-M", "80", "-t", "2",
        ],
    );
    let m = scrape_metrics(t.metrics);
    let calls = metric_total(&m, "nvmf_tcp_zerocopy_sends_total");
    eprintln!("{ios} reads of 128 KiB, {calls} zero-copy calls");
    assert!(calls > 0, "auto starts with zero-copy on:\n{m}");
    assert!(
        calls < ios / 2,
        "{calls} zero-copy calls for {ios} reads: auto never turned it off on loopback"
    );
}

#[test]
fn off_never_sends_zero_copy() {
    let t = start("off");
    verify(
        &t,
        &[
            "-q", "16", "-o", "131072", "-w", "randrw", "-M", "80", "-t", "1",
        ],
    );
    let m = scrape_metrics(t.metrics);
    assert_eq!(metric_total(&m, "nvmf_tcp_zerocopy_sends_total"), 0, "{m}");
}

/// `nvmf perf --verify --zerocopy-send MODE` writing 128 KiB (the host's side:
/// H2C payloads from its slot buffers); the zero-copy calls and copies its
/// report counts (0, 0 when it prints none).
fn host_zero_copy(t: &Target, mode: &str) -> (u64, u64) {
    let out = perf_cmd(
        t.port,
        &[
            "-q",
            "8",
            "-o",
            "131072",
            "-w",
            "randrw",
            "-M",
            "20",
            "-t",
            "2",
            "--verify",
            "--zerocopy-send",
            mode,
        ],
    )
    .output()
    .expect("run nvmf perf");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && text.contains("0 mismatched - OK"),
        "nvmf perf --zerocopy-send {mode} failed\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let Some(line) = text
        .lines()
        .find(|l| l.starts_with("zero-copy sends of write data:"))
    else {
        return (0, 0);
    };
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums[0], nums[1])
}

/// The host side (`nvmf --zerocopy-send`, nvmf-host's transport): writes
/// verify with their data sent zero-copy for the whole run (always; every
/// call reported copied on loopback, and no completion handed out before
/// its call was reported: a debug assertion in the queue), for the first
/// calls only (auto), or never (off).
#[test]
fn host_sends_write_data_zero_copy() {
    let t = start("off");
    let (calls, copied) = host_zero_copy(&t, "always");
    eprintln!("always: {calls} zero-copy calls, {copied} copied");
    assert!(calls > 200, "always: only {calls} zero-copy calls");
    assert_eq!(calls, copied, "loopback copies every call");
    let (calls, _) = host_zero_copy(&t, "auto");
    eprintln!("auto: {calls} zero-copy calls");
    assert!(
        calls > 0 && calls < 200,
        "auto: {calls} zero-copy calls (on at first, off after 64 copies)"
    );
    assert_eq!(host_zero_copy(&t, "off"), (0, 0));
}
