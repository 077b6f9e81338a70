//! The RBD backend against a live one-node Ceph cluster on 127.0.0.1:
//! data round trip of every operation, concurrent I/O completing on
//! librbd's threads and waking each submitting thread's eventfd, resize
//! (ours and an outside `rbd resize` seen through the watch), dropping
//! the backend with I/O in flight, a shared registered cluster, and an
//! unreachable cluster failing fast. The cluster
//! (`nvmf_testkit::CephCluster::shared()`) and helpers: see
//! `support/mod.rs`. Skipped only with `NVMFD_SKIP_CEPH=1`; without Ceph
//! installed the tests fail and say what to install.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_backend::rbd::{self, RbdBackend};
use nvmf_backend::{Backend, BlockOp, CompletionSink, IoTag, Submitted};
use nvmf_config::RbdCluster;
use nvmf_wire::status::Status;
use support::*;

/// Write (plain and FUA), read back, flush, write zeroes, deallocate:
/// the data read back is what was written, zeroed ranges read zero, and
/// operations past the end are refused with LBA Out of Range.
#[test]
fn round_trip_every_operation() {
    if skip() {
        return;
    }
    let c = cluster();
    let (b, _) = open(c, 16);
    assert_eq!(
        (b.kind(), b.block_size(), b.num_blocks()),
        ("rbd", 4096, 4096)
    );
    assert!(b.needs_stable_buffers());
    assert!(!b.deallocate_reads_zeroes());
    assert!(!b.cache(), "nvmfd opens images with rbd_cache off");

    let data = pattern(7, 64 << 10);
    for (lba, fua) in [(0u64, false), (100, true), (4096 - 16, false)] {
        let op = BlockOp::Write {
            lba,
            buf: &data,
            fua,
        };
        assert_eq!(run(&b, op), Status::SUCCESS, "write at {lba}");
        let mut back = vec![0u8; data.len()];
        let op = BlockOp::Read {
            lba,
            buf: &mut back,
        };
        assert_eq!(run(&b, op), Status::SUCCESS);
        assert!(back == data, "read back at {lba} differs");
    }
    assert_eq!(run(&b, BlockOp::Flush), Status::SUCCESS);

    let zero = BlockOp::WriteZeroes {
        lba: 2,
        blocks: 3,
        fua: true,
    };
    assert_eq!(run(&b, zero), Status::SUCCESS);
    let mut back = vec![1u8; data.len()];
    let op = BlockOp::Read {
        lba: 0,
        buf: &mut back,
    };
    assert_eq!(run(&b, op), Status::SUCCESS);
    assert_eq!(&back[..8192], &data[..8192]);
    assert!(back[8192..5 * 4096].iter().all(|&x| x == 0), "not zeroed");
    assert_eq!(&back[5 * 4096..], &data[5 * 4096..]);

    assert_eq!(
        dsm(&b, &[(100, 16), (4096 - 16, 16), (0, 0)]),
        Status::SUCCESS
    );

    let oob = Status::LBA_OUT_OF_RANGE.with_dnr();
    let op = BlockOp::Write {
        lba: 4096 - 15,
        buf: &data,
        fua: false,
    };
    assert_eq!(run(&b, op), oob);
    assert_eq!(dsm(&b, &[(0, 1), (4096, 1)]), oob);
}

/// With the operator's rbd_cache=true (own connection, from
/// config_param), writes are still read back, FUA goes through the
/// chained flush, and the backend says its cache is on.
#[test]
fn own_connection_with_cache_on() {
    if skip() {
        return;
    }
    let c = cluster();
    let img = image(c, 8);
    let (mon, keyring) = (
        c.mon_addr().to_string(),
        c.keyring_path().to_string_lossy().into_owned(),
    );
    let b = RbdBackend::open(&cfg(
        "own",
        &img,
        None,
        &[
            ("mon_host", &mon),
            ("keyring", &keyring),
            ("rbd_cache", "true"),
        ],
    ))
    .expect("open with its own connection");
    assert!(b.cache());
    let data = pattern(3, 8192);
    let op = BlockOp::Write {
        lba: 10,
        buf: &data,
        fua: true,
    };
    assert_eq!(run(&b, op), Status::SUCCESS);
    let mut back = vec![0u8; 8192];
    let op = BlockOp::Read {
        lba: 10,
        buf: &mut back,
    };
    assert_eq!(run(&b, op), Status::SUCCESS);
    assert!(back == data);
}

/// Four threads, each with its own sink (and wake-up eventfd), keep 32
/// operations in flight: every completion arrives, with data intact, and
/// the threads are woken through their eventfds (completions are posted
/// from librbd's threads, not the submitter's).
/// Records an operation that librbd finished before `submit` returned
/// (its callback ran first: a legitimate inline completion) in `inline`;
/// anything else must be pending.
fn submitted(s: Submitted, i: usize, inline: &mut Vec<(IoTag, Status)>) {
    match s {
        Submitted::Pending => {}
        Submitted::Done(st) => {
            assert_eq!(st, Status::SUCCESS, "operation {i}");
            inline.push((tag(i as u16), st));
        }
        other => panic!("operation {i}: {other:?}"),
    }
}

#[test]
fn concurrent_io_wakes_each_thread() {
    if skip() {
        return;
    }
    let c = cluster();
    let (b, _) = open(c, 32);
    let b = Arc::new(b);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                let sink = CompletionSink::new();
                let me = std::thread::current().id();
                let base = t * 1024;
                let mut bufs: Vec<Vec<u8>> =
                    (0..32).map(|i| pattern((t * 32 + i) as u8, 4096)).collect();
                let mut inline = Vec::new();
                for (i, buf) in bufs.iter().enumerate() {
                    let op = BlockOp::Write {
                        lba: base + i as u64,
                        buf,
                        fua: false,
                    };
                    submitted(b.submit(op, tag(i as u16), &sink), i, &mut inline);
                }
                let (mut got, woken) = collect(&sink, 32 - inline.len());
                assert!(got.iter().all(|(_, s)| *s == Status::SUCCESS));
                assert!(
                    woken > 0 || inline.len() == 32,
                    "thread {t} never woken by its eventfd"
                );
                got.append(&mut inline);
                assert_eq!(got.len(), 32);
                for buf in bufs.iter_mut() {
                    buf.fill(0);
                }
                let mut inline = Vec::new();
                for (i, buf) in bufs.iter_mut().enumerate() {
                    let op = BlockOp::Read {
                        lba: base + i as u64,
                        buf,
                    };
                    submitted(b.submit(op, tag(i as u16), &sink), i, &mut inline);
                }
                let (mut got, woken) = collect(&sink, 32 - inline.len());
                assert!(woken > 0 || inline.len() == 32);
                got.append(&mut inline);
                let mut cids: Vec<u16> = got.iter().map(|(t, _)| t.cid).collect();
                cids.sort();
                assert_eq!(cids, (0..32).collect::<Vec<u16>>());
                for (i, buf) in bufs.iter().enumerate() {
                    assert!(
                        *buf == pattern((t * 32 + i as u64) as u8, 4096),
                        "thread {t} block {i}"
                    );
                }
                assert_eq!(std::thread::current().id(), me);
                assert_eq!(
                    Arc::strong_count(&sink),
                    1,
                    "a context still holds the sink"
                );
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(b.in_flight(), 0);
}

/// Our resize changes the size at once; an `rbd resize` from outside
/// reaches the hook (through the watch) with the new block count.
#[test]
fn resize_and_outside_resize_hook() {
    if skip() {
        return;
    }
    let c = cluster();
    let (b, img) = open(c, 8);
    assert_eq!(b.num_blocks(), 2048);
    let seen = Arc::new(AtomicU64::new(0));
    let s2 = seen.clone();
    b.watch_size(Arc::new(move |n| s2.store(n, Ordering::SeqCst)));
    b.resize(4096).expect("resize");
    assert_eq!(b.num_blocks(), 4096);
    rbd_cli(c, &["resize", "--size", "32M", &format!("{POOL}/{img}")]);
    let start = Instant::now();
    while seen.load(Ordering::SeqCst) != 8192 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "hook not called with 8192 (last {})",
            seen.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(b.num_blocks(), 8192);
    // A write in the new space works.
    let data = pattern(1, 4096);
    let op = BlockOp::Write {
        lba: 8191,
        buf: &data,
        fua: false,
    };
    assert_eq!(run(&b, op), Status::SUCCESS);
}

/// Dropping the backend with 64 writes and reads in flight: every one
/// still completes through its sink (its buffer untouched by us until
/// then), the sinks are released, and the image is closed on the
/// closing thread without the dropping thread waiting.
#[test]
fn drop_with_io_in_flight() {
    if skip() {
        return;
    }
    let c = cluster();
    let (b, _) = open(c, 64);
    let closed = b.closed_flag();
    let sink = CompletionSink::new();
    let data = pattern(9, 128 << 10);
    let mut reads: Vec<Vec<u8>> = (0..32).map(|_| vec![0u8; 128 << 10]).collect();
    for i in 0..32u16 {
        let op = BlockOp::Write {
            lba: u64::from(i) * 32,
            buf: &data,
            fua: false,
        };
        assert_eq!(b.submit(op, tag(i), &sink), Submitted::Pending);
    }
    for (i, buf) in reads.iter_mut().enumerate() {
        let op = BlockOp::Read {
            lba: 4096 + i as u64 * 32,
            buf,
        };
        assert_eq!(b.submit(op, tag(100 + i as u16), &sink), Submitted::Pending);
    }
    assert!(b.in_flight() > 0, "nothing in flight at the drop");
    let t = Instant::now();
    drop(b);
    let took = t.elapsed();
    // The drop returned while the operations were still running: it did
    // not wait for them (rbd_close would) on the caller's thread.
    assert!(
        Arc::strong_count(&sink) > 1,
        "drop waited for the I/O on the caller's thread ({took:?})"
    );
    assert!(took < Duration::from_millis(100), "drop took {took:?}");
    let (got, _) = collect(&sink, 64);
    assert_eq!(got.len(), 64);
    assert!(got.iter().all(|(_, s)| *s == Status::SUCCESS), "{got:?}");
    let start = Instant::now();
    while !closed.load(Ordering::Acquire) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "image never closed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(Arc::strong_count(&sink), 1);
}

/// Two bdevs share one registered cluster; the cluster cannot be
/// unregistered while they use it, and can once they are gone.
#[test]
fn registered_cluster_is_shared() {
    if skip() {
        return;
    }
    let c = cluster();
    let conf = c.conf_path().to_string_lossy().into_owned();
    let spec = RbdCluster {
        name: "shared".into(),
        user_id: Some("admin".into()),
        config_param: BTreeMap::new(),
        config_file: Some(conf),
        key_file: None,
    };
    rbd::register_cluster(&spec).expect("register");
    assert!(rbd::register_cluster(&spec)
        .unwrap_err()
        .contains("already"));
    let (i1, i2) = (image(c, 4), image(c, 4));
    let b1 = RbdBackend::open(&cfg("s1", &i1, Some("shared"), &[])).unwrap();
    let b2 = RbdBackend::open(&cfg("s2", &i2, Some("shared"), &[])).unwrap();
    let e = rbd::unregister_cluster("shared").unwrap_err();
    assert!(e.contains("still used by 2"), "{e}");
    let (f1, f2) = (b1.closed_flag(), b2.closed_flag());
    drop(b1);
    let e = rbd::unregister_cluster("shared").unwrap_err();
    assert!(e.contains("still used by 1"), "{e}");
    drop(b2);
    // At once, while the images may still be closing on their own threads
    // (what rpc.py's teardown order does: delete, then unregister): the
    // name is free again and can be registered anew.
    rbd::unregister_cluster("shared").expect("unregister once no bdev is open");
    rbd::register_cluster(&spec).expect("register the same name again");
    rbd::unregister_cluster("shared").expect("unregister again");
    let start = Instant::now();
    while !(f1.load(Ordering::Acquire) && f2.load(Ordering::Acquire)) {
        assert!(start.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A cluster nobody answers for: creating the bdev fails within the
/// connection timeouts with a message that says so, and the registry
/// constructor (what bdev_rbd_create uses) says it the same way.
#[test]
fn unreachable_cluster_fails_fast() {
    if skip() {
        return;
    }
    let c = cluster();
    let keyring = c.keyring_path().to_string_lossy().into_owned();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mon = format!("127.0.0.1:{port}");
    let cfg = cfg(
        "gone",
        "img",
        None,
        &[("mon_host", &mon), ("keyring", &keyring)],
    );
    let start = Instant::now();
    let e = nvmf_backend::create(&cfg).unwrap_err();
    let took = start.elapsed();
    eprintln!("unreachable cluster: failed after {took:?}: {e}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(e.to_string().contains("gone"), "{e}");
    assert!(e.reason.contains("cannot connect"), "{e}");
}

/// Opening an image that has the exclusive-lock feature (rbd's default
/// features) logs a warning that says why two gateways should not serve
/// it; an image without it does not.
#[test]
fn exclusive_lock_image_warns_at_open() {
    if skip() {
        return;
    }
    let c = cluster();
    let locked = format!("{}-xl", image(c, 4));
    rbd_cli(c, &["create", "--size", "4M", &format!("{POOL}/{locked}")]);
    let plain = image(c, 4);
    let log = |img: &str| {
        let buf = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let b2 = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || Capture(b2.clone()))
            .with_ansi(false)
            .finish();
        let b = tracing::subscriber::with_default(sub, || {
            RbdBackend::open(&cfg("xl", img, Some(registered(c)), &[])).expect("open")
        });
        drop(b);
        let out = String::from_utf8_lossy(&buf.lock().unwrap()).into_owned();
        out
    };
    let out = log(&locked);
    assert!(
        out.contains("WARN") && out.contains("exclusive-lock") && out.contains("two gateways"),
        "no warning: {out}"
    );
    let out = log(&plain);
    assert!(
        !out.contains("exclusive-lock"),
        "warned without the feature: {out}"
    );
}

/// A writer into a shared buffer (captures log output).
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
