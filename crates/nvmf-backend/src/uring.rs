//! The per-thread io_uring of the file backend.
//!
//! Owns one io_uring instance per thread (a reactor thread in nvmfd; any
//! thread in tests), created lazily on first use and never shared: no locks
//! on the I/O path. Owns the table of operations in flight (user_data = index
//! into it), submission batching, reaping completions (short transfers and
//! EAGAIN are resubmitted, errors mapped to NVMe status codes), the eventfd
//! the kernel signals on every completion (the reactor registers it in its
//! epoll set), and the zero buffer used to emulate Write Zeroes.
//!
//! Lifetime rule: an operation holds raw pointers into its request's data
//! buffer, an `Arc` of the file it targets and an `Arc` of the queue pair's
//! [`CompletionSink`]. A closing transport hands its buffers to
//! [`super::parked`] (`QueuePair::hand_over`), which frees them once no
//! operation holds the sink any more ([`flush`] reaps them on every reactor
//! turn), so the kernel never writes into freed memory and teardown never
//! waits. A queue pair dropped without handing over falls back to waiting
//! ([`wait_sink_idle`]).
//!
//! Dataset Management on a file is one operation ([`OpKind::PunchRanges`]):
//! its ranges' fallocate(PUNCH_HOLE)s are submitted one after another,
//! each from the previous one's completion, reading the range list from
//! the request's (stable) data buffer. A Write Zeroes with FUA is followed
//! by an fdatasync before it completes.
//!
//! Batching: operations are queued in the submission ring and submitted by
//! [`flush`] (called by `QueuePair::poll` after a batch of commands and by
//! the reactor before it sleeps). Outside batch mode (the default for a
//! thread that never called [`set_batching`]) every operation is submitted
//! at once.

use std::cell::{Cell, RefCell};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{opcode, squeue, types, IoUring};
use nvmf_wire::status::Status;

use super::file::FileShared;
use super::{CompletionSink, IoTag};

/// Submission queue entries per ring (completion queue is twice that).
const RING_ENTRIES: u32 = 512;
/// Bytes of the shared zero buffer (Write Zeroes emulation).
const ZERO_BUF: usize = 1 << 20;
/// `FALLOC_FL_KEEP_SIZE | FALLOC_FL_ZERO_RANGE`.
const ZERO_RANGE_MODE: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
/// `FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE`.
const PUNCH_MODE: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    /// Write with Force Unit Access: RWF_DSYNC on every submission of it
    /// (resubmitted remainders of a short write included).
    WriteFua,
    Flush,
    /// fallocate(ZERO_RANGE); falls back to `WriteZeroBuf` when unsupported.
    ZeroRange,
    /// Write the zero buffer over the range, in chunks.
    WriteZeroBuf,
    /// Dataset Management deallocate: `buf` points at `len` 16-byte range
    /// descriptors, `done` is the next one; fallocate(PUNCH_HOLE) each.
    PunchRanges,
}

/// One operation in flight.
struct Op {
    file: Arc<FileShared>,
    sink: Arc<CompletionSink>,
    tag: IoTag,
    kind: OpKind,
    /// Data buffer (Read/Write): valid while the request's slot is Executing.
    buf: *mut u8,
    /// Bytes to move (or zero).
    len: u64,
    /// Bytes done so far.
    done: u64,
    /// File offset of byte 0.
    offset: u64,
    /// fdatasync once the operation itself succeeded (FUA Write Zeroes).
    sync_after: bool,
}

/// A new operation (see [`submit`]).
pub(crate) struct NewOp {
    pub file: Arc<FileShared>,
    pub sink: Arc<CompletionSink>,
    pub tag: IoTag,
    pub kind: OpKind,
    pub buf: *mut u8,
    pub len: u64,
    pub offset: u64,
    pub sync_after: bool,
}

/// Moves `op.done` past range descriptors with NLB 0; the next range to
/// punch as (byte offset, byte length), or `None` when none is left.
fn next_range(op: &mut Op) -> Option<(u64, u64)> {
    let bs = u64::from(op.file.block_size());
    while op.done < op.len {
        let mut d = [0u8; 16];
        // SAFETY: `buf` points at `len` descriptors of 16 bytes that stay
        // valid and unmoved while the op is in the table (module docs);
        // `done < len`, so these 16 bytes are inside them.
        unsafe {
            std::ptr::copy_nonoverlapping(op.buf.add(op.done as usize * 16), d.as_mut_ptr(), 16)
        };
        let (slba, nlb) = super::decode_range(&d);
        if nlb != 0 {
            return Some((slba.saturating_mul(bs), nlb.saturating_mul(bs)));
        }
        op.done += 1;
    }
    None
}

struct ZeroBuf(*mut u8);

impl ZeroBuf {
    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(ZERO_BUF, 4096).expect("valid layout")
    }
}

impl Drop for ZeroBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `Ring::zero_buf` with this layout.
        unsafe { std::alloc::dealloc(self.0, Self::layout()) }
    }
}

struct Ring {
    ring: IoUring,
    /// Shared with the sinks of this thread's queue pairs (helper wake-ups).
    eventfd: Arc<super::wake::Waker>,
    ops: Vec<Option<Op>>,
    free: Vec<u32>,
    /// Entries pushed but not yet submitted.
    queued: usize,
    /// Operations the kernel owns.
    inflight: usize,
    zero: Option<ZeroBuf>,
}

thread_local! {
    static RING: RefCell<Option<Ring>> = const { RefCell::new(None) };
    static RING_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
    static BATCHING: Cell<bool> = const { Cell::new(false) };
}

impl Ring {
    fn new() -> std::io::Result<Ring> {
        // SINGLE_ISSUER: only this thread ever submits. No DEFER_TASKRUN:
        // completions must signal the eventfd while the thread sleeps in
        // epoll, without it entering the ring first.
        let ring = IoUring::builder()
            .setup_single_issuer()
            .build(RING_ENTRIES)
            .or_else(|_| IoUring::new(RING_ENTRIES))?;
        // The thread's wake-up eventfd (`wake`): one descriptor in the
        // reactor's epoll for ring completions and foreign posts alike.
        let eventfd = super::wake::thread_waker()?;
        ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
        Ok(Ring {
            ring,
            eventfd,
            ops: Vec::with_capacity(256),
            free: Vec::with_capacity(256),
            queued: 0,
            inflight: 0,
            zero: None,
        })
    }

    fn zero_buf(&mut self) -> *mut u8 {
        if self.zero.is_none() {
            // SAFETY: non-zero size layout.
            let p = unsafe { std::alloc::alloc_zeroed(ZeroBuf::layout()) };
            if p.is_null() {
                std::alloc::handle_alloc_error(ZeroBuf::layout());
            }
            self.zero = Some(ZeroBuf(p));
        }
        self.zero.as_ref().map_or(std::ptr::null_mut(), |z| z.0)
    }

    /// The submission entry for the next step of operation `idx`.
    fn entry(&mut self, idx: u32) -> squeue::Entry {
        if let Some(op) = self.ops[idx as usize].as_mut() {
            if op.kind == OpKind::PunchRanges {
                let fd = types::Fd(op.file.fd());
                // `submit` and `complete_one` only queue a PunchRanges op
                // with a range left; (0, 0) would fail with EINVAL.
                let (off, len) = next_range(op).unwrap_or((0, 0));
                return opcode::Fallocate::new(fd, len)
                    .offset(off)
                    .mode(PUNCH_MODE)
                    .build()
                    .user_data(u64::from(idx));
            }
        }
        let zero = if matches!(
            self.ops[idx as usize].as_ref().map(|o| o.kind),
            Some(OpKind::WriteZeroBuf)
        ) {
            self.zero_buf()
        } else {
            std::ptr::null_mut()
        };
        let op = self.ops[idx as usize].as_ref().expect("op in table");
        let fd = types::Fd(op.file.fd());
        let off = op.offset + op.done;
        let rest = op.len - op.done;
        let e = match op.kind {
            OpKind::Read => {
                // SAFETY (of the pointer): valid for `len` bytes while the
                // op is in the table (module docs).
                let p = op.buf.wrapping_add(op.done as usize);
                opcode::Read::new(fd, p, rest as u32).offset(off).build()
            }
            OpKind::Write | OpKind::WriteFua => {
                let p = op.buf.wrapping_add(op.done as usize);
                opcode::Write::new(fd, p, rest as u32)
                    .offset(off)
                    .rw_flags(rw_flags(op.kind))
                    .build()
            }
            OpKind::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            OpKind::ZeroRange => opcode::Fallocate::new(fd, rest)
                .offset(off)
                .mode(ZERO_RANGE_MODE)
                .build(),
            OpKind::WriteZeroBuf => {
                let n = rest.min(ZERO_BUF as u64) as u32;
                opcode::Write::new(fd, zero, n).offset(off).build()
            }
            OpKind::PunchRanges => unreachable!("handled above"),
        };
        e.user_data(u64::from(idx))
    }

    fn push(&mut self, idx: u32) -> std::io::Result<()> {
        let e = self.entry(idx);
        loop {
            // SAFETY: the entry's buffers stay valid until its completion
            // is reaped (module docs).
            let pushed = unsafe { self.ring.submission().push(&e) };
            if pushed.is_ok() {
                break;
            }
            // Submission queue full: hand what is queued to the kernel.
            self.submit_queued()?;
        }
        self.queued += 1;
        Ok(())
    }

    fn submit_queued(&mut self) -> std::io::Result<()> {
        if self.queued == 0 {
            return Ok(());
        }
        loop {
            match self.ring.submit() {
                Ok(n) => {
                    self.queued = self.queued.saturating_sub(n);
                    self.inflight += n;
                    if self.queued == 0 || n == 0 {
                        return Ok(());
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    // Completion queue overflow: reap first, then retry.
                    self.reap();
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Processes every completion; returns how many operations finished.
    fn reap(&mut self) -> usize {
        let mut finished = 0;
        let mut again: Vec<u32> = Vec::new();
        loop {
            let mut cq = self.ring.completion();
            cq.sync();
            let mut got = 0;
            let mut batch: [(u64, i32); 64] = [(0, 0); 64];
            for cqe in cq.by_ref().take(64) {
                batch[got] = (cqe.user_data(), cqe.result());
                got += 1;
            }
            drop(cq);
            for &(ud, res) in &batch[..got] {
                self.inflight = self.inflight.saturating_sub(1);
                if self.complete_one(ud as u32, res) {
                    finished += 1;
                } else {
                    again.push(ud as u32);
                }
            }
            if got < 64 {
                break;
            }
        }
        for idx in again {
            if let Err(e) = self.push(idx) {
                self.fail(idx, Some(e.raw_os_error().unwrap_or(libc::EIO)));
                finished += 1;
            }
        }
        finished
    }

    /// Handles one completion. True when the operation is finished (posted
    /// and removed), false when it must be resubmitted.
    fn complete_one(&mut self, idx: u32, res: i32) -> bool {
        let Some(op) = self.ops.get_mut(idx as usize).and_then(|o| o.as_mut()) else {
            return true;
        };
        if res == -libc::EAGAIN || res == -libc::EINTR {
            return false;
        }
        match op.kind {
            OpKind::PunchRanges => {
                if res == -libc::EOPNOTSUPP || res == -libc::ENOSYS {
                    // A hint the file cannot take: stop trying.
                    op.file.dealloc_unsupported();
                    self.finish(idx, Status::SUCCESS);
                    return true;
                }
                if res < 0 {
                    self.fail(idx, Some(-res));
                    return true;
                }
                op.done += 1;
                if next_range(op).is_some() {
                    return false;
                }
                self.finish(idx, Status::SUCCESS);
                true
            }
            OpKind::Flush => {
                if res < 0 {
                    self.fail(idx, Some(-res));
                } else {
                    self.finish(idx, Status::SUCCESS);
                }
                true
            }
            OpKind::ZeroRange => {
                if res == -libc::EOPNOTSUPP || res == -libc::EINVAL || res == -libc::ENOSYS {
                    op.file.zero_range_unsupported();
                    op.kind = OpKind::WriteZeroBuf;
                    return false;
                }
                if res < 0 {
                    self.fail(idx, Some(-res));
                } else if op.sync_after {
                    op.sync_after = false;
                    op.kind = OpKind::Flush;
                    return false;
                } else {
                    self.finish(idx, Status::SUCCESS);
                }
                true
            }
            OpKind::Read | OpKind::Write | OpKind::WriteFua | OpKind::WriteZeroBuf => {
                if res < 0 {
                    self.fail(idx, Some(-res));
                    return true;
                }
                if res == 0 {
                    // End of file: the file shrank behind our back.
                    self.fail(idx, None);
                    return true;
                }
                op.done += res as u64;
                if op.done < op.len {
                    // Short transfer: resubmit the remainder.
                    return false;
                }
                if op.sync_after {
                    op.sync_after = false;
                    op.kind = OpKind::Flush;
                    return false;
                }
                self.finish(idx, Status::SUCCESS);
                true
            }
        }
    }

    /// Fails operation `idx` (errno, or `None` for end of file).
    fn fail(&mut self, idx: u32, errno: Option<i32>) {
        let Some(op) = self.ops.get(idx as usize).and_then(|o| o.as_ref()) else {
            return;
        };
        let status = errno_status(op.kind, errno);
        let what = match errno {
            Some(e) => std::io::Error::from_raw_os_error(e).to_string(),
            None => "unexpected end of file (file truncated?)".to_string(),
        };
        tracing::warn!(
            bdev = %op.file.name(),
            op = ?op.kind,
            offset = op.offset + op.done,
            len = op.len,
            errno = errno.unwrap_or(0),
            status = status.name(),
            "file bdev I/O failed: {what}"
        );
        self.finish(idx, status);
    }

    fn finish(&mut self, idx: u32, status: Status) {
        if let Some(op) = self.ops.get_mut(idx as usize).and_then(Option::take) {
            op.sink.post(op.tag, status);
            self.free.push(idx);
        }
    }

    fn insert(&mut self, op: Op) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.ops[i as usize] = Some(op);
                i
            }
            None => {
                self.ops.push(Some(op));
                (self.ops.len() - 1) as u32
            }
        }
    }
}

/// Per-I/O flags (`RWF_*`) of a write submission: RWF_DSYNC for FUA, so
/// the kernel completes the write only once it is durable.
pub fn rw_flags(kind: OpKind) -> i32 {
    match kind {
        OpKind::WriteFua => libc::RWF_DSYNC,
        _ => 0,
    }
}

/// The NVMe status for a failed operation (`errno`, or `None` for a
/// transfer that hit end of file).
pub fn errno_status(kind: OpKind, errno: Option<i32>) -> Status {
    let write = !matches!(kind, OpKind::Read);
    match errno {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => {
            Status::CAPACITY_EXCEEDED.with_dnr()
        }
        Some(libc::EROFS) | Some(libc::EPERM) | Some(libc::EACCES) if write => {
            Status::NS_WRITE_PROTECTED.with_dnr()
        }
        Some(libc::EOPNOTSUPP) => Status::INVALID_OPCODE.with_dnr(),
        Some(libc::ENOMEM) | Some(libc::ENOBUFS) => Status::INTERNAL_ERROR,
        Some(libc::ECANCELED) => Status::ABORTED_BY_REQUEST,
        Some(libc::EINVAL) | Some(libc::EFAULT) => Status::DATA_TRANSFER_ERROR,
        Some(libc::ENODEV) | Some(libc::ENXIO) => Status::NAMESPACE_NOT_READY,
        _ if matches!(kind, OpKind::Read) => Status::UNRECOVERED_READ_ERROR,
        _ => Status::WRITE_FAULT,
    }
}

/// Set (to anything) in the environment, no thread gets an io_uring (file
/// bdevs cannot be created): for tests of the paths that must work without
/// one, e.g. completions posted from other threads waking the reactor.
pub const NO_URING_ENV: &str = "NVMFD_NO_URING";

fn with_ring<R>(f: impl FnOnce(&mut Ring) -> R) -> Result<R, String> {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            if let Some(e) = RING_ERROR.with(|e| e.borrow().clone()) {
                return Err(e);
            }
            if std::env::var_os(NO_URING_ENV).is_some() {
                let msg = format!("io_uring disabled by {NO_URING_ENV}");
                RING_ERROR.with(|x| *x.borrow_mut() = Some(msg.clone()));
                return Err(msg);
            }
            match Ring::new() {
                Ok(r) => *slot = Some(r),
                Err(e) => {
                    let msg = format!("cannot create io_uring: {e}");
                    RING_ERROR.with(|x| *x.borrow_mut() = Some(msg.clone()));
                    return Err(msg);
                }
            }
        }
        Ok(f(slot.as_mut().expect("ring created")))
    })
}

/// Whether io_uring works here (creates this thread's ring).
pub fn available() -> Result<(), String> {
    with_ring(|_| ())
}

/// Queue an operation on this thread's ring. On error the caller completes
/// the command inline with the returned status.
pub(crate) fn submit(new: NewOp) -> Result<(), Status> {
    let res = with_ring(|r| {
        let idx = r.insert(Op {
            file: new.file,
            sink: new.sink,
            tag: new.tag,
            kind: new.kind,
            buf: new.buf,
            len: new.len,
            done: 0,
            offset: new.offset,
            sync_after: new.sync_after,
        });
        if let Err(e) = r.push(idx) {
            let op = r.ops[idx as usize].take();
            r.free.push(idx);
            return Err((e, op.map(|o| o.file)));
        }
        if !BATCHING.with(Cell::get) {
            if let Err(e) = r.submit_queued() {
                tracing::warn!("io_uring submit failed: {e}");
            }
        }
        Ok(())
    });
    match res {
        Ok(Ok(())) => Ok(()),
        Ok(Err((e, file))) => {
            let name = file.as_ref().map_or("?", |f| f.name()).to_string();
            tracing::warn!(bdev = %name, "cannot queue file bdev I/O: {e}");
            Err(Status::INTERNAL_ERROR)
        }
        Err(msg) => {
            tracing::warn!("file bdev I/O impossible: {msg}");
            Err(Status::INTERNAL_ERROR)
        }
    }
}

/// Batch mode for this thread: operations wait in the submission queue
/// until [`flush`] (the reactor calls it before sleeping).
pub fn set_batching(on: bool) {
    BATCHING.with(|b| b.set(on));
}

/// Submits queued operations and processes completions that arrived.
/// Returns how many operations finished (their sinks have posts). Cheap
/// when the ring was never created or is idle.
pub fn flush() -> usize {
    let done = flush_ring();
    super::parked::reap();
    done
}

fn flush_ring() -> usize {
    RING.with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return 0;
        };
        let Some(r) = slot.as_mut() else { return 0 };
        if r.queued == 0 && r.inflight == 0 {
            return 0;
        }
        let done = r.reap();
        if let Err(e) = r.submit_queued() {
            tracing::warn!("io_uring submit failed: {e}");
        }
        done
    })
}

/// This thread's completion eventfd (creating the ring). The kernel writes
/// it on every completion; the reader resets it with [`clear_eventfd`].
pub fn eventfd() -> Result<RawFd, String> {
    with_ring(|r| r.eventfd.as_raw_fd())
}

/// Resets the eventfd counter (non-blocking): the thread's wake-up
/// eventfd, shared with helpers ([`super::wake::clear`]).
pub fn clear_eventfd() {
    super::wake::clear();
}

/// Operations this thread's ring holds (queued or in the kernel).
pub fn outstanding() -> usize {
    RING.with(|cell| {
        cell.try_borrow()
            .ok()
            .and_then(|s| s.as_ref().map(|r| r.ops.len() - r.free.len()))
            .unwrap_or(0)
    })
}

/// Blocks until every operation holding `sink` finished (this thread's
/// ring holds the file backend's; other backends complete on their own
/// threads). Used when a queue pair is dropped with I/O in flight by a
/// transport that did not hand its buffers over, so that they outlive the
/// backend's use of them: it never gives up (freeing them early would let
/// the kernel or a foreign thread write into freed memory). Logs after 5 s
/// and then every 30 s while waiting.
pub fn wait_sink_idle(sink: &Arc<CompletionSink>) {
    let start = Instant::now();
    let mut next_warn = start + Duration::from_secs(5);
    while Arc::strong_count(sink) > 1 {
        let progressed = RING.with(|cell| {
            let Ok(mut slot) = cell.try_borrow_mut() else {
                return false;
            };
            let Some(r) = slot.as_mut() else { return false };
            if r.submit_queued().is_err() {
                return false;
            }
            if r.inflight == 0 {
                return false;
            }
            // Wait for at least one completion, then process them all.
            match r.ring.submit_and_wait(1) {
                Ok(_) | Err(_) => {}
            }
            r.reap();
            true
        });
        if !progressed && Arc::strong_count(sink) > 1 {
            // Not ours to wait for (a helper, another thread's callback).
            std::thread::sleep(Duration::from_millis(1));
        }
        let now = Instant::now();
        if now >= next_warn {
            next_warn = now + Duration::from_secs(30);
            tracing::warn!(
                waited_s = start.elapsed().as_secs(),
                "closed queue still waits for backend I/O in flight (its buffers are kept)"
            );
        }
    }
    // Pairs with the release of the operations' sink clones (see
    // `parked::reap`): their writes happen before the caller frees.
    std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
}
