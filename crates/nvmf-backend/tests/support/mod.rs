//! Shared by the RBD tests: the one-node Ceph cluster they run against,
//! images, bdev entries, and waiting for completions the way a reactor
//! does (on the thread's wake-up eventfd).
//!
//! The cluster: `NVMFD_CEPH_CONF` names the ceph.conf of a running one
//! (with its keyring next to it and a pool `rbd`, as
//! `testbed/ceph-cluster` makes them), else one is started for the test
//! process with `testbed/ceph-cluster` (`NVMFD_CEPH_CLUSTER_SCRIPT`
//! overrides the path) and stopped by its owner watchdog when the process
//! ends. Tests are skipped only with `NVMFD_SKIP_CEPH=1`; without Ceph
//! installed they fail and say so.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use nvmf_backend::rbd::{self, RbdBackend};
use nvmf_backend::{Backend, BlockOp, CompletionSink, DsmRanges, IoTag, Submitted};
use nvmf_config::{BdevConfig, BdevKind, RbdBdev, RbdCluster};
use nvmf_wire::status::Status;

pub const POOL: &str = "rbd";

pub struct Cluster {
    pub conf: PathBuf,
}

pub fn skip() -> bool {
    std::env::var("NVMFD_SKIP_CEPH").is_ok_and(|v| v == "1")
}

/// The cluster harness script.
pub fn script() -> PathBuf {
    match std::env::var("NVMFD_CEPH_CLUSTER_SCRIPT") {
        Ok(p) => p.into(),
        Err(_) => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testbed/ceph-cluster"),
    }
}

impl Cluster {
    /// The cluster's directory (where its ceph.conf is).
    pub fn dir(&self) -> &Path {
        self.conf.parent().expect("ceph.conf in a directory")
    }

    /// `mon_host` from the cluster's ceph.conf.
    pub fn mon_host(&self) -> String {
        let conf = std::fs::read_to_string(&self.conf).unwrap();
        conf.lines()
            .find_map(|l| l.strip_prefix("mon_host = "))
            .expect("mon_host in ceph.conf")
            .to_string()
    }

    /// The client keyring next to ceph.conf.
    pub fn keyring(&self) -> String {
        self.conf
            .with_file_name("keyring")
            .to_string_lossy()
            .into_owned()
    }

    /// Runs the harness script on this cluster (`osd-stop DIR 0`, ...).
    pub fn harness(&self, cmd: &str, args: &[&str]) {
        let st = Command::new(script())
            .arg(cmd)
            .arg(self.dir())
            .args(args)
            .status()
            .expect("run the cluster script");
        assert!(st.success(), "ceph-cluster {cmd} {args:?} failed");
    }
}

/// The shared cluster (started on first use).
pub fn cluster() -> &'static Cluster {
    static C: OnceLock<Cluster> = OnceLock::new();
    C.get_or_init(|| {
        if let Ok(conf) = std::env::var("NVMFD_CEPH_CONF") {
            return Cluster { conf: conf.into() };
        }
        let script = script();
        assert!(
            Path::new("/usr/bin/ceph-mon").exists(),
            "Ceph is not installed (ceph-mon missing): scripts/test.sh installs it; \
             NVMFD_SKIP_CEPH=1 skips these tests"
        );
        assert!(script.exists(), "{} missing", script.display());
        let dir = std::env::temp_dir().join(format!("nvmfd-rbd-test-{}", std::process::id()));
        let st = Command::new(&script)
            .arg("start")
            .arg(&dir)
            .args(["--osds", "1", "--pool", POOL, "--owner-pid"])
            .arg(std::process::id().to_string())
            .status()
            .expect("run testbed/ceph-cluster");
        assert!(st.success(), "ceph-cluster start failed");
        Cluster {
            conf: dir.join("ceph.conf"),
        }
    })
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
    let out = Command::new("timeout")
        .arg("60")
        .arg("rbd")
        .arg("-c")
        .arg(&c.conf)
        .args(args)
        .output()
        .expect("run rbd");
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
            config_file: Some(c.conf.to_string_lossy().into_owned()),
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
