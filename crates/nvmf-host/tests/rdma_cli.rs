//! `nvmf` over trtype:RDMA where it cannot run: without rdma-core or an RDMA device every
//! command that opens a queue prints `nvmf_rdma::available()`'s message and exits 1 (no hang,
//! no panic); TCP-only options over RDMA are refused with a clear error. The working path is
//! tested between guests over soft-RoCE (nvmf-interop `tests/rdma_host.rs`).

use std::process::Command;
use std::time::{Duration, Instant};

fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

fn nvmf(args: &[&str]) -> (i32, String) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_nvmf"))
        .args(args)
        .output()
        .expect("run nvmf");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "nvmf {args:?} took {:?}",
        t.elapsed()
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("panicked"),
        "nvmf {args:?} panicked:\n{text}"
    );
    (out.status.code().unwrap_or(-1), text)
}

const TRID: &str = "trtype:RDMA adrfam:IPv4 traddr:192.0.2.1 trsvcid:4420 subnqn:nqn.x";

#[test]
fn rdma_without_a_device_names_what_is_missing() {
    if has_rdma_device() {
        eprintln!("skipped: this machine has an RDMA device");
        return;
    }
    for args in [
        vec!["identify", "-r", TRID],
        vec!["perf", "-r", TRID, "-t", "1"],
        vec!["discover", "-t", "rdma", "-a", "192.0.2.1", "-s", "4420"],
    ] {
        let (code, text) = nvmf(&args);
        assert_eq!(code, 1, "nvmf {args:?}:\n{text}");
        assert!(
            text.contains("NVMe/RDMA needs librdmacm and libibverbs"),
            "nvmf {args:?}:\n{text}"
        );
    }
}

#[test]
fn tcp_only_options_are_refused_over_rdma() {
    let (code, text) = nvmf(&["identify", "-r", TRID, "--hdr-digest"]);
    assert_ne!(code, 0, "{text}");
    // refused before any RDMA set-up, device or not
    assert!(
        text.contains("digests and TLS are NVMe/TCP options"),
        "{text}"
    );
    let (code, text) = nvmf(&["discover", "-t", "fc", "-a", "192.0.2.1"]);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("'fc' is not supported (tcp or rdma)"),
        "{text}"
    );
}
