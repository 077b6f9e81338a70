//! Block backends (SPDK calls them bdevs): the storage a namespace exposes.
//!
//! Owns the [`Backend`] trait, the operations it executes ([`BlockOp`]), how an
//! operation completes ([`Submitted`], inline or later through a
//! [`CompletionSink`]), and creating backends from `nvmf_config::BdevConfig`.
//!
//! Contract: the caller (the I/O command path) has already checked that the
//! LBA range lies inside the device and that every buffer is exactly
//! `blocks * block_size` bytes; backends check again where a mistake would
//! touch memory outside their own (malloc) and answer LBA Out of Range rather
//! than panic.

pub mod file;
pub mod malloc;
pub mod null;
pub mod uring;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use nvmf_config::{BdevConfig, BdevKind};
use nvmf_wire::status::Status;

use crate::error::CoreError;

pub use file::FileBackend;
pub use malloc::MallocBackend;
pub use null::NullBackend;

/// One block operation. LBAs and block counts are in the backend's blocks.
#[derive(Debug)]
pub enum BlockOp<'a> {
    /// Read `buf.len() / block_size` blocks starting at `lba` into `buf`.
    Read { lba: u64, buf: &'a mut [u8] },
    /// Write `buf` starting at `lba`. With `fua` (Force Unit Access) the
    /// data must be on stable media when the operation completes; backends
    /// without a volatile cache (malloc, null) ignore it.
    Write { lba: u64, buf: &'a [u8], fua: bool },
    /// Make previously completed writes durable.
    Flush,
    /// Set `blocks` blocks starting at `lba` to zero.
    WriteZeroes { lba: u64, blocks: u64 },
}

/// How a submitted operation went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// Finished inline with this status.
    Done(Status),
    /// Will finish later: the backend posts `(tag, status)` to the
    /// [`CompletionSink`] it was given, and the queue pair's `poll` turns it
    /// into a completion. Until then the request's data buffer stays valid,
    /// at the same address, and untouched by the transport (the slot is
    /// kept): an asynchronous backend may keep a raw pointer to it and read
    /// into it / write from it later (the file backend's io_uring does).
    /// Backends that do say so with [`Backend::needs_stable_buffers`], and
    /// hold a clone of the sink until the operation is finished; the queue
    /// pair does not go away (and so the transport does not free the
    /// buffers) while such clones exist (see `QueuePair`'s `Drop`).
    Pending,
}

/// Identifies an operation to its queue pair when it completes later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoTag {
    /// Command identifier of the NVMe command.
    pub cid: u16,
    /// Bytes the command moves (for statistics when it completes).
    pub bytes: u32,
    /// True for commands that move data host → controller.
    pub write: bool,
}

/// Where asynchronous backends post completions for one queue pair.
///
/// Inline backends (malloc, null) never touch it. The queue pair checks
/// [`CompletionSink::is_empty`] (one relaxed atomic load) on every `poll`, so
/// an idle sink costs nothing. The io_uring file backend posts from the
/// reactor thread that owns the queue pair, so the lock is uncontended.
///
/// No allocation per completion: `drain` swaps the posted list with a spare
/// one (emptied by the previous drain, capacity kept), so after warm-up both
/// vectors have room for a queue's worth of completions and `post` only
/// pushes.
#[derive(Debug, Default)]
pub struct CompletionSink {
    count: AtomicUsize,
    done: Mutex<Vec<(IoTag, Status)>>,
    /// Owned by whoever drains: empty between drains.
    spare: Mutex<Vec<(IoTag, Status)>>,
}

impl CompletionSink {
    pub fn new() -> Arc<CompletionSink> {
        Arc::new(CompletionSink::default())
    }

    /// Post the completion of an operation that returned [`Submitted::Pending`].
    pub fn post(&self, tag: IoTag, status: Status) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        done.push((tag, status));
        self.count.store(done.len(), Ordering::Release);
    }

    /// True when nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    /// Hand every posted completion to `f`, oldest first.
    pub fn drain(&self, mut f: impl FnMut(IoTag, Status)) {
        if self.is_empty() {
            return;
        }
        // Busy only when `f` itself drains this sink: what it would get is
        // left for the next drain.
        let mut spare = match self.spare.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        spare.clear();
        {
            let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
            self.count.store(0, Ordering::Release);
            std::mem::swap(&mut *done, &mut *spare);
        }
        // `done` is unlocked: `f` (or the ring) may post again meanwhile.
        for (tag, status) in spare.drain(..) {
            f(tag, status);
        }
    }

    /// (pointer, capacity) of both internal vectors, for allocation tests.
    #[cfg(test)]
    fn buffers(&self) -> [(usize, usize); 2] {
        let d = self.done.lock().unwrap();
        let s = self.spare.lock().unwrap();
        let mut v = [
            (d.as_ptr() as usize, d.capacity()),
            (s.as_ptr() as usize, s.capacity()),
        ];
        v.sort();
        v
    }
}

/// A block device a namespace exposes. Shared by every reactor thread.
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// The bdev name from the configuration.
    fn name(&self) -> &str;
    /// "malloc", "null", ...
    fn kind(&self) -> &'static str;
    /// Bytes per block (a power of two, ≥ 512).
    fn block_size(&self) -> u32;
    /// Number of blocks.
    fn num_blocks(&self) -> u64;
    /// Whether reads of deallocated blocks return zeroes (reported in the
    /// namespace's DLFEAT).
    fn deallocate_reads_zeroes(&self) -> bool;
    /// Execute one operation. `tag` and `sink` are only used when the
    /// backend answers [`Submitted::Pending`].
    fn submit(&self, op: BlockOp<'_>, tag: IoTag, sink: &Arc<CompletionSink>) -> Submitted;
    /// The host no longer needs `blocks` blocks at `lba` (Dataset Management
    /// deallocate). Always completes inline: one command can carry 256
    /// ranges, and a hint needs no completion tracking.
    fn deallocate(&self, lba: u64, blocks: u64) -> Status;
    /// True when operations keep pointers into the data buffer after
    /// `submit` returned [`Submitted::Pending`]: the transport must then pass
    /// buffers that stay put until completion (its request slot buffer,
    /// 4096-byte aligned for O_DIRECT) rather than e.g. in-capsule data in a
    /// receive buffer that moves.
    fn needs_stable_buffers(&self) -> bool {
        false
    }
}

/// Create the backend a bdev entry describes.
pub fn create(cfg: &BdevConfig) -> Result<Arc<dyn Backend>, CoreError> {
    let bad = |reason: &str| CoreError::Bdev {
        name: cfg.name.clone(),
        reason: reason.to_string(),
    };
    if cfg.block_size < 512 || !cfg.block_size.is_power_of_two() || cfg.block_size > 65536 {
        return Err(bad("block_size must be a power of two from 512 to 65536"));
    }
    if cfg.num_blocks == 0 {
        return Err(bad("num_blocks must be at least 1"));
    }
    match cfg.kind {
        BdevKind::Malloc => Ok(Arc::new(MallocBackend::new(
            &cfg.name,
            cfg.block_size,
            cfg.num_blocks,
        )?)),
        BdevKind::Null => Ok(Arc::new(NullBackend::new(
            &cfg.name,
            cfg.block_size,
            cfg.num_blocks,
        ))),
        BdevKind::File(_) => {
            let f = cfg
                .file
                .as_ref()
                .ok_or_else(|| bad("file bdev without file parameters"))?;
            Ok(Arc::new(FileBackend::new(cfg, f)?))
        }
    }
}

/// Byte range of `blocks` blocks at `lba`, or `None` when it leaves the device
/// (or overflows).
pub(crate) fn byte_range(
    lba: u64,
    blocks: u64,
    block_size: u32,
    num_blocks: u64,
) -> Option<(usize, usize)> {
    let end = lba.checked_add(blocks)?;
    if end > num_blocks {
        return None;
    }
    let start = usize::try_from(lba.checked_mul(block_size as u64)?).ok()?;
    let len = usize::try_from(blocks.checked_mul(block_size as u64)?).ok()?;
    Some((start, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op_status(b: &dyn Backend, op: BlockOp<'_>) -> Status {
        let sink = CompletionSink::new();
        let tag = IoTag {
            cid: 0,
            bytes: 0,
            write: false,
        };
        match b.submit(op, tag, &sink) {
            Submitted::Done(s) => s,
            Submitted::Pending => panic!("inline backends never pend"),
        }
    }

    #[test]
    fn malloc_round_trip_and_bounds() {
        let m = MallocBackend::new("m", 512, 16).unwrap();
        assert_eq!(
            (m.block_size(), m.num_blocks(), m.kind()),
            (512, 16, "malloc")
        );
        let mut zero = vec![1u8; 512 * 16];
        assert!(op_status(
            &m,
            BlockOp::Read {
                lba: 0,
                buf: &mut zero
            }
        )
        .is_success());
        assert!(zero.iter().all(|&b| b == 0), "starts zeroed");

        let data: Vec<u8> = (0..1024).map(|i| i as u8).collect();
        assert!(op_status(
            &m,
            BlockOp::Write {
                lba: 14,
                buf: &data,
                fua: false
            }
        )
        .is_success());
        let mut back = vec![0u8; 1024];
        assert!(op_status(
            &m,
            BlockOp::Read {
                lba: 14,
                buf: &mut back
            }
        )
        .is_success());
        assert_eq!(back, data);

        let oob = Status::LBA_OUT_OF_RANGE.with_dnr();
        assert_eq!(
            op_status(
                &m,
                BlockOp::Write {
                    lba: 15,
                    buf: &data,
                    fua: false
                }
            ),
            oob
        );
        assert_eq!(
            op_status(
                &m,
                BlockOp::Read {
                    lba: u64::MAX,
                    buf: &mut back
                }
            ),
            oob
        );
        assert_eq!(
            op_status(
                &m,
                BlockOp::Read {
                    lba: 0,
                    buf: &mut back[..100]
                }
            ),
            oob
        );
        assert_eq!(
            op_status(&m, BlockOp::WriteZeroes { lba: 10, blocks: 7 }),
            oob
        );
        assert_eq!(m.deallocate(u64::MAX, 2), oob);

        assert!(op_status(&m, BlockOp::WriteZeroes { lba: 14, blocks: 1 }).is_success());
        op_status(
            &m,
            BlockOp::Read {
                lba: 14,
                buf: &mut back,
            },
        );
        assert!(back[..512].iter().all(|&b| b == 0));
        assert_eq!(&back[512..], &data[512..]);
        assert!(m.deallocate(15, 1).is_success());
        op_status(
            &m,
            BlockOp::Read {
                lba: 14,
                buf: &mut back,
            },
        );
        assert!(back.iter().all(|&b| b == 0));
        assert!(op_status(&m, BlockOp::Flush).is_success());
    }

    #[test]
    fn malloc_large_is_lazy() {
        // 4 GiB of address space: only works because calloc maps lazily.
        if let Ok(m) = MallocBackend::new("big", 4096, 1 << 20) {
            let mut b = vec![1u8; 4096];
            op_status(
                &m,
                BlockOp::Read {
                    lba: (1 << 20) - 1,
                    buf: &mut b,
                },
            );
            assert!(b.iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn null_reads_zeroes() {
        let n = NullBackend::new("n", 4096, 4);
        let mut b = vec![9u8; 8192];
        assert!(op_status(
            &n,
            BlockOp::Write {
                lba: 2,
                buf: &b,
                fua: false
            }
        )
        .is_success());
        assert!(op_status(
            &n,
            BlockOp::Read {
                lba: 2,
                buf: &mut b
            }
        )
        .is_success());
        assert!(b.iter().all(|&x| x == 0));
        assert!(!op_status(
            &n,
            BlockOp::Read {
                lba: 3,
                buf: &mut b
            }
        )
        .is_success());
        assert!(!n.deallocate(4, 1).is_success());
    }

    #[test]
    fn create_validates() {
        let mut cfg = BdevConfig {
            name: "x".into(),
            kind: BdevKind::Malloc,
            block_size: 512,
            num_blocks: 0,
            uuid: None,
            file: None,
        };
        assert!(create(&cfg).is_err());
        cfg.num_blocks = 1;
        cfg.block_size = 520;
        assert!(create(&cfg).is_err());
        cfg.block_size = 4096;
        assert_eq!(create(&cfg).unwrap().num_blocks(), 1);
        cfg.num_blocks = u64::MAX;
        assert!(create(&cfg).is_err());
    }

    #[test]
    fn completion_sink() {
        let s = CompletionSink::new();
        assert!(s.is_empty());
        let tag = IoTag {
            cid: 5,
            bytes: 512,
            write: true,
        };
        s.post(tag, Status::SUCCESS);
        assert!(!s.is_empty());
        let mut got = Vec::new();
        s.drain(|t, st| got.push((t.cid, st)));
        assert_eq!(got, vec![(5, Status::SUCCESS)]);
        assert!(s.is_empty());
    }

    /// After warm-up, post + drain cycles reuse the same two buffers: no
    /// allocation per completion.
    #[test]
    fn completion_sink_keeps_capacity() {
        let s = CompletionSink::new();
        let tag = |cid| IoTag {
            cid,
            bytes: 4096,
            write: false,
        };
        let batch = 64u16;
        // Warm-up: both vectors grow to a batch.
        for _ in 0..2 {
            for cid in 0..batch {
                s.post(tag(cid), Status::SUCCESS);
            }
            s.drain(|_, _| {});
        }
        let warm = s.buffers();
        assert!(warm.iter().all(|&(_, cap)| cap >= batch as usize));
        let mut seen = 0usize;
        for round in 0..1000u16 {
            let n = 1 + round % batch;
            for cid in 0..n {
                s.post(tag(cid), Status::SUCCESS);
            }
            let mut next = 0u16;
            s.drain(|t, st| {
                assert_eq!(t.cid, next, "oldest first");
                assert_eq!(st, Status::SUCCESS);
                next += 1;
                seen += 1;
            });
            assert_eq!(next, n);
            assert!(s.is_empty());
            assert_eq!(s.buffers(), warm, "round {round} reallocated");
        }
        assert!(seen > 1000);
    }

    /// Completions posted while a drain hands others out (and a drain from
    /// inside the callback) are kept for the next drain.
    #[test]
    fn completion_sink_post_during_drain() {
        let s = CompletionSink::new();
        let tag = |cid| IoTag {
            cid,
            bytes: 0,
            write: true,
        };
        s.post(tag(1), Status::SUCCESS);
        let mut got = Vec::new();
        s.drain(|t, _| {
            got.push(t.cid);
            s.post(tag(2), Status::SUCCESS);
            s.drain(|_, _| panic!("nested drain hands nothing out"));
        });
        assert_eq!(got, vec![1]);
        assert!(!s.is_empty());
        s.drain(|t, _| got.push(t.cid));
        assert_eq!(got, vec![1, 2]);
        assert!(s.is_empty());
    }
}
