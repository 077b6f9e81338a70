//! Shared by the RBD tests: the one-node Ceph cluster they run against
//! (`nvmf_testkit::CephCluster::shared()`: one per test binary, started on
//! first use, stopped by its watchdog when the binary exits), images, bdev
//! entries, and waiting for completions the way a reactor does (on the
//! thread's wake-up eventfd). Tests are skipped only with
//! `NVMFD_SKIP_CEPH=1`; without Ceph installed they fail and say what to
//! install.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nvmf_backend::rbd::{self, RbdBackend};
use nvmf_backend::{Backend, BlockOp, CompletionSink, DsmRanges, IoTag, Submitted};
use nvmf_config::{BdevConfig, BdevKind, RbdBdev, RbdCluster};
pub use nvmf_testkit::ceph::POOL;
pub use nvmf_testkit::CephCluster as Cluster;
use nvmf_wire::status::Status;

/// Whether to skip (`NVMFD_SKIP_CEPH=1`); panics naming what is missing
/// when Ceph is not installed.
pub fn skip() -> bool {
    match nvmf_testkit::ceph::ceph_check() {
        Ok(run) => !run,
        Err(e) => panic!("{e}"),
    }
}

/// The test binary's cluster (started on first use).
pub fn cluster() -> &'static Cluster {
    Cluster::shared()
}

/// A fresh image of `mib` MiB without exclusive-lock.
pub fn image(c: &Cluster, mib: u64) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "t{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    rbd_cli(
        c,
        &[
            "create",
            "--size",
            &format!("{mib}M"),
            "--image-feature",
            "layering",
            &format!("{POOL}/{name}"),
        ],
    );
    name
}

pub fn rbd_cli(c: &Cluster, args: &[&str]) {
    let out = c.rbd(args);
    assert!(
        out.status.success(),
        "rbd {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Registers the test cluster once, under "test".
pub fn registered(c: &Cluster) -> &'static str {
    static R: OnceLock<()> = OnceLock::new();
    R.get_or_init(|| {
        rbd::register_cluster(&RbdCluster {
            name: "test".into(),
            user_id: None,
            config_param: BTreeMap::new(),
            config_file: Some(c.conf_path().to_string_lossy().into_owned()),
            key_file: None,
        })
        .expect("register the test cluster");
    });
    "test"
}

pub fn cfg(name: &str, image: &str, cluster: Option<&str>, params: &[(&str, &str)]) -> BdevConfig {
    BdevConfig {
        name: name.into(),
        kind: BdevKind::Rbd,
        block_size: 4096,
        num_blocks: 0,
        uuid: None,
        file: None,
        rbd: Some(RbdBdev {
            pool_name: POOL.into(),
            rbd_name: image.into(),
            user_id: None,
            config_param: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cluster_name: cluster.map(str::to_string),
            read_only: false,
        }),
    }
}

pub fn open(c: &Cluster, mib: u64) -> (RbdBackend, String) {
    let img = image(c, mib);
    let b = RbdBackend::open(&cfg("r", &img, Some(registered(c)), &[])).expect("open");
    (b, img)
}

pub fn tag(cid: u16) -> IoTag {
    IoTag {
        cid,
        bytes: 0,
        write: false,
        nsid: 0,
    }
}

/// Waits on this thread's wake-up eventfd (as a reactor does) until `n`
/// completions were drained from `sink`; returns them and how many waits
/// the eventfd ended (not the timeout).
pub fn collect(sink: &Arc<CompletionSink>, n: usize) -> (Vec<(IoTag, Status)>, usize) {
    let fd = nvmf_backend::wake::fd().unwrap();
    let mut got = Vec::new();
    let mut woken = 0;
    let start = Instant::now();
    while got.len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "only {} of {n} completions",
            got.len()
        );
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, 100) } == 1 {
            woken += 1;
        }
        nvmf_backend::wake::clear();
        sink.drain(|t, s| got.push((t, s)));
    }
    (got, woken)
}

/// Runs one operation to completion.
pub fn run(b: &RbdBackend, op: BlockOp<'_>) -> Status {
    let sink = CompletionSink::new();
    match b.submit(op, tag(1), &sink) {
        Submitted::Done(s) => s,
        Submitted::ZeroData => Status::SUCCESS,
        Submitted::Pending => collect(&sink, 1).0[0].1,
    }
}

pub fn dsm(b: &RbdBackend, ranges: &[(u64, u32)]) -> Status {
    let mut d = vec![0u8; ranges.len() * 16];
    for (r, &(slba, nlb)) in d.chunks_exact_mut(16).zip(ranges) {
        r[4..8].copy_from_slice(&nlb.to_le_bytes());
        r[8..16].copy_from_slice(&slba.to_le_bytes());
    }
    let sink = CompletionSink::new();
    match b.deallocate(DsmRanges::new(&d, ranges.len()).unwrap(), tag(2), &sink) {
        Submitted::Done(s) => s,
        Submitted::ZeroData => Status::SUCCESS,
        Submitted::Pending => collect(&sink, 1).0[0].1,
    }
}

pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
