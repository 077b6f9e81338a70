//! Tests of the io_uring file backend against real files (in cargo's
//! per-crate temp dir under target/, a disk filesystem, so O_DIRECT is
//! exercised) and a loop block device (root; NVMFD_SKIP_LOOP=1 skips it): 512 and 4096
//! byte blocks, read/write/flush/write-zeroes/deallocate, short files
//! (truncated behind the backend's back), unaligned buffers, readonly.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use nvmf_config::TargetConfig;
use nvmf_core::backend::{
    self, uring, Backend, BlockOp, CompletionSink, DsmRanges, IoTag, Submitted,
};
use nvmf_wire::status::Status;

struct Buf {
    ptr: *mut u8,
    layout: Layout,
}

impl Buf {
    fn new(len: usize, align: usize) -> Buf {
        let layout = Layout::from_size_align(len, align).unwrap();
        // SAFETY: non-zero layout.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Buf { ptr, layout }
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: allocated with layout.size() bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in new with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("file_backend");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn make_file(name: &str, size: u64) -> PathBuf {
    let p = tmp(name);
    let _ = std::fs::remove_file(&p);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(size).unwrap();
    p
}

fn open(method: &str, path: &str, extra: &str) -> Arc<dyn Backend> {
    let json = format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[{{"method":"{method}","params":{{"name":"F0","filename":"{path}"{extra}}}}}]}}]}}"#
    );
    let cfg = TargetConfig::from_json_str(&json).unwrap();
    backend::create(&cfg.bdevs[0]).unwrap()
}

const TAG: IoTag = IoTag {
    cid: 7,
    bytes: 0,
    write: false,
    nsid: 0,
};

/// Runs one op to completion (waiting on this thread's ring).
fn run(b: &dyn Backend, op: BlockOp<'_>) -> Status {
    let sink = CompletionSink::new();
    let submitted = b.submit(op, TAG, &sink);
    wait(&sink, submitted)
}

/// Deallocates `ranges` ((SLBA, NLB) each) as one Dataset Management
/// operation, descriptors in an aligned (stable) buffer, and waits.
fn dsm_dealloc(b: &dyn Backend, ranges: &[(u64, u32)]) -> Status {
    let mut d = Buf::new(4096, 4096);
    for (i, &(slba, nlb)) in ranges.iter().enumerate() {
        let r = &mut d.slice()[i * 16..(i + 1) * 16];
        r[4..8].copy_from_slice(&nlb.to_le_bytes());
        r[8..16].copy_from_slice(&slba.to_le_bytes());
    }
    let sink = CompletionSink::new();
    let bytes = &d.slice()[..];
    let submitted = b.deallocate(DsmRanges::new(bytes, ranges.len()).unwrap(), TAG, &sink);
    wait(&sink, submitted)
}

/// Waits (driving this thread's ring) for the completion of `submitted`.
fn wait(sink: &Arc<CompletionSink>, submitted: Submitted) -> Status {
    match submitted {
        Submitted::Done(s) => s,
        Submitted::ZeroData => panic!("a file backend never answers ZeroData"),
        Submitted::Pending => {
            let start = std::time::Instant::now();
            loop {
                uring::flush();
                let mut got = None;
                sink.drain(|t, s| {
                    assert_eq!(t.cid, 7);
                    got = Some(s);
                });
                if let Some(s) = got {
                    // A helper job drops its clone right after posting.
                    let t = std::time::Instant::now();
                    while Arc::strong_count(sink) > 1 && t.elapsed().as_secs() < 5 {
                        std::thread::yield_now();
                    }
                    assert_eq!(Arc::strong_count(sink), 1, "op released the sink");
                    return s;
                }
                assert!(start.elapsed().as_secs() < 20, "I/O never completed");
                std::thread::yield_now();
            }
        }
    }
}

fn pattern(buf: &mut [u8], seed: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
}

fn exercise(b: &dyn Backend, bs: usize) {
    assert_eq!(b.block_size() as usize, bs);
    let n = 8 * bs;
    let mut w = Buf::new(n, 4096);
    pattern(w.slice(), 3);
    assert_eq!(
        run(
            b,
            BlockOp::Write {
                lba: 2,
                buf: w.slice(),
                fua: false
            }
        ),
        Status::SUCCESS
    );
    let mut r = Buf::new(n, 4096);
    assert_eq!(
        run(
            b,
            BlockOp::Read {
                lba: 2,
                buf: r.slice()
            }
        ),
        Status::SUCCESS
    );
    assert_eq!(r.slice(), w.slice());
    assert_eq!(run(b, BlockOp::Flush), Status::SUCCESS);

    // Write Zeroes over blocks 3..5.
    assert_eq!(
        run(
            b,
            BlockOp::WriteZeroes {
                lba: 3,
                blocks: 2,
                fua: false
            }
        ),
        Status::SUCCESS
    );
    run(
        b,
        BlockOp::Read {
            lba: 2,
            buf: r.slice(),
        },
    );
    assert_eq!(&r.slice()[..bs], &w.slice()[..bs]);
    assert!(r.slice()[bs..3 * bs].iter().all(|&x| x == 0));
    assert_eq!(&r.slice()[3 * bs..], &w.slice()[3 * bs..]);

    // Deallocate the last block written; zeroes when DLFEAT says so.
    assert_eq!(dsm_dealloc(b, &[(9, 1)]), Status::SUCCESS);
    run(
        b,
        BlockOp::Read {
            lba: 2,
            buf: r.slice(),
        },
    );
    if b.deallocate_reads_zeroes() {
        assert!(r.slice()[7 * bs..].iter().all(|&x| x == 0));
    }

    // Out of range.
    let last = b.num_blocks() - 1;
    assert_eq!(
        run(
            b,
            BlockOp::Read {
                lba: last,
                buf: r.slice()
            }
        ),
        Status::LBA_OUT_OF_RANGE.with_dnr()
    );

    // Unaligned buffer: still correct (bounced).
    let mut u = Buf::new(n + 64, 4096);
    let ub = &mut u.slice()[64..64 + bs];
    assert_eq!(run(b, BlockOp::Read { lba: 2, buf: ub }), Status::SUCCESS);
    assert_eq!(&ub[..], &w.slice()[..bs]);
}

/// One Dataset Management operation with many ranges (NLB 0 ones among
/// them) punches exactly those blocks, asynchronously.
#[test]
fn deallocate_many_ranges_is_one_async_op() {
    let p = make_file("dsm.img", 4 << 20);
    let b = open(
        "bdev_uring_create",
        p.to_str().unwrap(),
        r#","block_size":4096"#,
    );
    assert!(b.deallocate_reads_zeroes());
    let mut w = Buf::new(4 << 20, 4096);
    w.slice().fill(0xee);
    let all = BlockOp::Write {
        lba: 0,
        buf: w.slice(),
        fua: false,
    };
    assert_eq!(run(&*b, all), Status::SUCCESS);
    // Every 4th block, 256 ranges, with NLB 0 descriptors mixed in.
    let ranges: Vec<(u64, u32)> = (0..256u64)
        .map(|i| (i * 4, if i % 10 == 3 { 0 } else { 1 }))
        .collect();
    let mut d = Buf::new(4096, 4096);
    for (i, &(slba, nlb)) in ranges.iter().enumerate() {
        let r = &mut d.slice()[i * 16..(i + 1) * 16];
        r[4..8].copy_from_slice(&nlb.to_le_bytes());
        r[8..16].copy_from_slice(&slba.to_le_bytes());
    }
    let sink = CompletionSink::new();
    let submitted = b.deallocate(DsmRanges::new(d.slice(), 256).unwrap(), TAG, &sink);
    assert_eq!(
        submitted,
        Submitted::Pending,
        "file deallocate runs on the ring"
    );
    assert_eq!(uring::outstanding(), 1, "256 ranges are one ring operation");
    assert_eq!(wait(&sink, submitted), Status::SUCCESS);
    let mut r = Buf::new(4 << 20, 4096);
    let back = BlockOp::Read {
        lba: 0,
        buf: r.slice(),
    };
    assert_eq!(run(&*b, back), Status::SUCCESS);
    for (blk, data) in r.slice().chunks_exact(4096).enumerate() {
        let blk = blk as u64;
        let punched = ranges.iter().any(|&(s, n)| n != 0 && s == blk);
        let want = if punched { 0 } else { 0xee };
        assert!(
            data.iter().all(|&x| x == want),
            "block {blk}: want {want:#x}"
        );
    }
}

#[test]
fn uring_file_512() {
    let p = make_file("f512.img", 1 << 20);
    let b = open("bdev_uring_create", p.to_str().unwrap(), "");
    assert_eq!(b.num_blocks(), (1 << 20) / 512);
    exercise(&*b, 512);
}

#[test]
fn aio_file_4096_fallocate() {
    let p = make_file("f4k.img", 1 << 20);
    let b = open(
        "bdev_aio_create",
        p.to_str().unwrap(),
        r#","block_size":4096,"fallocate":true"#,
    );
    assert_eq!(b.num_blocks(), 256);
    assert!(
        b.deallocate_reads_zeroes(),
        "punch hole works on this filesystem"
    );
    exercise(&*b, 4096);
}

#[test]
fn aio_without_fallocate_writes_zero_buffers() {
    let p = make_file("nofalloc.img", 1 << 20);
    let b = open(
        "bdev_aio_create",
        p.to_str().unwrap(),
        r#","block_size":4096"#,
    );
    assert!(!b.deallocate_reads_zeroes());
    exercise(&*b, 4096);
    // A multi-chunk Write Zeroes (larger than the 1 MiB zero buffer is not
    // possible on a 1 MiB file; 255 blocks still spans the whole buffer).
    assert_eq!(
        run(
            &*b,
            BlockOp::WriteZeroes {
                lba: 1,
                blocks: 255,
                fua: true
            }
        ),
        Status::SUCCESS
    );
}

#[test]
fn readonly_rejects_writes() {
    let p = make_file("ro.img", 1 << 16);
    let b = open(
        "bdev_aio_create",
        p.to_str().unwrap(),
        r#","readonly":true"#,
    );
    let mut w = Buf::new(512, 4096);
    assert_eq!(
        run(
            &*b,
            BlockOp::Write {
                lba: 0,
                buf: w.slice(),
                fua: false
            }
        ),
        Status::NS_WRITE_PROTECTED.with_dnr()
    );
    assert_eq!(
        run(
            &*b,
            BlockOp::Read {
                lba: 0,
                buf: w.slice()
            }
        ),
        Status::SUCCESS
    );
}

#[test]
fn read_past_truncated_end_is_a_media_error() {
    let p = make_file("trunc.img", 1 << 20);
    let b = open("bdev_uring_create", p.to_str().unwrap(), "");
    // Shrink the file behind the backend's back.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let mut r = Buf::new(8192, 4096);
    // Entirely past the end: the kernel returns 0 bytes.
    assert_eq!(
        run(
            &*b,
            BlockOp::Read {
                lba: 64,
                buf: r.slice()
            }
        ),
        Status::UNRECOVERED_READ_ERROR
    );
    // Straddling the end: a short read, then 0 bytes for the rest.
    assert_eq!(
        run(
            &*b,
            BlockOp::Read {
                lba: 4,
                buf: r.slice()
            }
        ),
        Status::UNRECOVERED_READ_ERROR
    );
    // Still serving what exists.
    assert_eq!(
        run(
            &*b,
            BlockOp::Read {
                lba: 0,
                buf: &mut r.slice()[..4096]
            }
        ),
        Status::SUCCESS
    );
}

#[test]
fn errno_mapping() {
    use uring::{errno_status, OpKind};
    assert_eq!(
        errno_status(OpKind::Write, Some(libc::ENOSPC)),
        Status::CAPACITY_EXCEEDED.with_dnr()
    );
    assert_eq!(
        errno_status(OpKind::Read, Some(libc::EIO)),
        Status::UNRECOVERED_READ_ERROR
    );
    assert_eq!(
        errno_status(OpKind::Read, None),
        Status::UNRECOVERED_READ_ERROR
    );
    assert_eq!(
        errno_status(OpKind::Write, Some(libc::EIO)),
        Status::WRITE_FAULT
    );
    assert_eq!(errno_status(OpKind::Write, None), Status::WRITE_FAULT);
    assert_eq!(
        errno_status(OpKind::Flush, Some(libc::EIO)),
        Status::WRITE_FAULT
    );
    assert_eq!(
        errno_status(OpKind::Write, Some(libc::EROFS)),
        Status::NS_WRITE_PROTECTED.with_dnr()
    );
    assert_eq!(
        errno_status(OpKind::Read, Some(libc::EINVAL)),
        Status::DATA_TRANSFER_ERROR
    );
}

/// A loop block device over a file: geometry from the kernel, 512- and
/// 4096-byte logical blocks. Needs root and /dev/loop-control (the test
/// machines and scripts/test.sh run as root); where loop devices cannot
/// be had, NVMFD_SKIP_LOOP=1 skips it (with a reason), otherwise it fails.
#[test]
fn loop_device() {
    if std::env::var("NVMFD_SKIP_LOOP").as_deref() == Ok("1") {
        eprintln!("SKIP loop_device: NVMFD_SKIP_LOOP=1");
        return;
    }
    let hint = "loop_device needs root and /dev/loop-control; set NVMFD_SKIP_LOOP=1 to skip it";
    for bs in [512u32, 4096] {
        let p = make_file(&format!("loop{bs}.img"), 4 << 20);
        let out = Command::new("losetup")
            .args(["-f", "--show", "--sector-size", &bs.to_string()])
            .arg(&p)
            .output();
        let dev = match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
            Ok(o) => panic!(
                "losetup failed: {} ({hint})",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => panic!("cannot run losetup: {e} ({hint})"),
        };
        let result = std::panic::catch_unwind(|| {
            let b = open("bdev_uring_create", &dev, "");
            assert_eq!(b.block_size(), bs, "detected logical block size");
            assert_eq!(b.num_blocks(), (4 << 20) / u64::from(bs));
            exercise(&*b, bs as usize);
            if bs == 4096 {
                // block_size below the device's logical block size.
                let json = format!(
                    r#"{{"subsystems":[{{"subsystem":"bdev","config":[{{"method":"bdev_uring_create","params":{{"name":"F0","filename":"{dev}","block_size":512}}}}]}}]}}"#
                );
                let e = TargetConfig::from_json_str(&json).unwrap_err().to_string();
                assert!(e.contains("block_size") && e.contains("smaller"), "{e}");
            }
        });
        let detached = Command::new("losetup").args(["-d", &dev]).status();
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
        assert!(
            detached.as_ref().is_ok_and(|s| s.success()),
            "losetup -d {dev}: {detached:?} (loop device left attached)"
        );
    }
}

/// FUA writes (RWF_DSYNC on the ring, fdatasync after a bounce-buffer
/// write) complete and read back, aligned and unaligned, and the data is in
/// the file itself (read through a separate descriptor).
#[test]
fn fua_write_completes_and_reads_back() {
    let p = make_file("fua.img", 1 << 20);
    let b = open("bdev_uring_create", p.to_str().unwrap(), "");
    let bs = b.block_size() as usize;
    let n = 4 * bs;
    // Aligned: goes through io_uring with RWF_DSYNC.
    let mut w = Buf::new(n, 4096);
    pattern(w.slice(), 11);
    let op = BlockOp::Write {
        lba: 8,
        buf: w.slice(),
        fua: true,
    };
    assert_eq!(run(&*b, op), Status::SUCCESS);
    let mut r = Buf::new(n, 4096);
    let op = BlockOp::Read {
        lba: 8,
        buf: r.slice(),
    };
    assert_eq!(run(&*b, op), Status::SUCCESS);
    assert_eq!(r.slice(), w.slice());

    // Unaligned buffer (bounce path when the file is opened O_DIRECT).
    let mut big = Buf::new(n + 8, 4096);
    let un = &mut big.slice()[8..8 + n];
    pattern(un, 23);
    let expect = un.to_vec();
    let op = BlockOp::Write {
        lba: 16,
        buf: un,
        fua: true,
    };
    assert_eq!(run(&*b, op), Status::SUCCESS);
    let op = BlockOp::Read {
        lba: 16,
        buf: r.slice(),
    };
    assert_eq!(run(&*b, op), Status::SUCCESS);
    assert_eq!(r.slice(), &expect[..]);

    let file = std::fs::read(&p).unwrap();
    assert_eq!(&file[8 * bs..12 * bs], w.slice());
    assert_eq!(&file[16 * bs..20 * bs], &expect[..]);
}

/// Only FUA writes carry RWF_DSYNC.
#[test]
fn fua_sets_rwf_dsync() {
    use uring::{rw_flags, OpKind};
    assert_eq!(rw_flags(OpKind::WriteFua), libc::RWF_DSYNC);
    for k in [
        OpKind::Write,
        OpKind::Read,
        OpKind::Flush,
        OpKind::WriteZeroBuf,
    ] {
        assert_eq!(rw_flags(k), 0, "{k:?}");
    }
}
