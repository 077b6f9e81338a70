//! Test scaffolding shared by every crate whose tests run the real `nvmfd` daemon or the
//! `nvmf` CLI (nvmfd's integration tests, nvmf-host's end-to-end tests, the nvmf-interop
//! harness). Dev-only: used as a dev-dependency (or by the test-only nvmf-interop crate),
//! never linked into nvmfd.
//!
//! * [`bins`]: where the built `nvmfd` and `nvmf` binaries are (`$NVMFD_BIN`/`$NVMF_BIN`,
//!   else `target/<profile>/`, built on demand).
//! * [`process`]: [`Process`], a spawned child whose stderr lines are collected, that dies
//!   with the test process and is killed on drop; [`run_bounded`] for one-shot commands.
//! * [`daemon`]: [`Daemon`], an `nvmfd` started from config JSON in its own directory, ready
//!   once it logged `listening on` for its ports, with its RPC socket and [`Daemon::rpc`].
//! * [`ceph`]: [`CephCluster`], a throw-away one-node Ceph cluster on 127.0.0.1
//!   (`testbed/ceph-cluster`) with the `rbd`/`ceph` CLIs against it, for RBD namespaces.
//! * [`netns`]: [`CuttableNetns`], a network namespace whose link to 127.0.0.1 a test cuts
//!   and heals (a member partitioned from the Ceph cluster but reachable by the host).
//! * [`prometheus`]: a real Prometheus of the test's own scraping nvmfd, its HTTP API, and
//!   the monitoring pack's dashboard queries.
//! * [`model`]: in-process target configurations (one subsystem, one namespace) for the
//!   core's and the transports' own tests.
//! * [`inproc`]: around such a model, the target, a connection's `PortInfo` and an NVMe/RDMA
//!   queue's request-engine limits (the request engine's and the RDMA queue's tests).
//! * Here: [`free_port`], [`trid`], [`text`], [`TestDir`], and the measurements the hostile
//!   tests share ([`p99`], [`rss`]).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub mod bins;
pub mod ceph;
pub mod daemon;
pub mod inproc;
pub mod model;
pub mod netns;
pub mod process;
pub mod prometheus;

pub use ceph::CephCluster;
pub use daemon::{Daemon, DaemonBuilder};
pub use netns::CuttableNetns;
pub use process::{die_with_parent, nvmf, run_bounded, stop_child, Process};

/// A port that was free on 127.0.0.1 when asked (another process may still take it before
/// the daemon binds it). Never the same port twice in one test process, and never from the
/// kernel's ephemeral range: asking the kernel for port 0 twice can return the same port
/// (seen in CI: two listeners of one daemon on one port), and an outgoing connection of a
/// parallel test can take an ephemeral port at any time. Ports come from 20000..32000,
/// starting at an offset derived from the process ID so that concurrent test processes
/// start far apart.
pub fn free_port() -> u16 {
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicUsize = AtomicUsize::new(usize::MAX);
    let start = (std::process::id().wrapping_mul(2_654_435_761) % SPAN) as usize;
    let _ = NEXT.compare_exchange(usize::MAX, start, Ordering::SeqCst, Ordering::SeqCst);
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let port = (LOW + (n as u32 % SPAN)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!(
        "free_port: no free port on 127.0.0.1 in {LOW}..{}",
        LOW + SPAN
    );
}

/// The transport ID string `nvmf perf`/`nvmf identify` take for `nqn` on 127.0.0.1:`port`.
pub fn trid(port: u16, nqn: &str) -> String {
    format!("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}")
}

/// The body of nvmfd's `/metrics` (`--metrics 127.0.0.1:PORT`), fetched with a plain HTTP/1.0
/// GET (10 s read timeout).
pub fn scrape_metrics(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// The sum over all label sets of counter `name` (its `_total` series) in a `/metrics` body.
pub fn metric_total(body: &str, name: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Bytes (a child's output) as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A fresh directory `<temp>/nvmf-test-<pid>-<n>-<tag>`, removed (with its contents) on
/// drop.
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    pub fn new(tag: &str) -> TestDir {
        let path = std::env::temp_dir().join(format!(
            "nvmf-test-{}-{}-{tag}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create test dir");
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `path/name`.
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The 99th percentile of `lat` (sorted in place; must not be empty).
pub fn p99(lat: &mut [Duration]) -> Duration {
    assert!(!lat.is_empty());
    lat.sort_unstable();
    lat[(lat.len() * 99 / 100).min(lat.len() - 1)]
}

/// Resident memory (VmRSS) of process `pid` in bytes.
pub fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let line = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("VmRSS value");
    kib * 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_dir_is_removed_on_drop() {
        let d = TestDir::new("kit");
        std::fs::write(d.join("f"), b"x").unwrap();
        let p = d.path().to_path_buf();
        assert!(p.join("f").is_file());
        drop(d);
        assert!(!p.exists());
    }

    #[test]
    fn p99_of_a_sample() {
        let mut v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        v.reverse();
        assert_eq!(p99(&mut v), Duration::from_millis(100));
        assert_eq!(
            trid(4420, "nqn.x"),
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.x"
        );
    }

    #[test]
    fn free_ports_are_distinct_and_outside_the_ephemeral_range() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let p = free_port();
            assert!((20_000..32_000).contains(&p), "{p}");
            assert!(seen.insert(p), "port {p} handed out twice");
        }
    }
}
