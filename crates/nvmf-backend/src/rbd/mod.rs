//! The Ceph RBD backend: a namespace backed by an RBD image, through
//! librbd's asynchronous API.
//!
//! Owns [`RbdBackend`] (registered as bdev kind "rbd"): opening an image
//! (on its own connection or a registered cluster's, see [`conn`]),
//! submitting read / write / flush / write zeroes / discard with
//! `rbd_aio_*`, delivering completions, keeping the size current, and
//! closing the image off the reactor. A `read_only` bdev opens its image
//! with `rbd_open_read_only` (no exclusive lock is taken, librbd refuses
//! writes with -EROFS) and reports [`Backend::read_only`], so the core
//! write-protects its namespaces; writes that reach it anyway are answered
//! Namespace Is Write Protected without a librbd call. Submodules: [`ffi`] (the binding,
//! loaded at run time), [`conn`] (connections and registered clusters),
//! [`slab`] (per-operation callback contexts), [`group`] (the RADOS
//! primitives of gateway groups: leases, fencing, guarded objects; issue
//! 25, not used by the daemon yet).
//!
//! Completion path: librbd calls [`on_complete`] on one of its own
//! threads. It reads the return code, releases the librbd completion,
//! gives the context's slot back (lock-free queue), and posts `(tag,
//! status)` to the queue pair's sink with
//! [`CompletionSink::post_and_wake`], which wakes the owning reactor's
//! eventfd. It never touches reactor state. Submission (`rbd_aio_*`) does
//! not block: librbd queues the operation (`rbd_non_blocking_aio`, on by
//! default) and returns.
//!
//! FUA: with librbd's cache off (nvmfd's default) a write completes only
//! once it is in the OSDs, so FUA needs nothing more. With the operator's
//! `rbd_cache=true`, a FUA write or write zeroes is followed by
//! `rbd_aio_flush` before it completes. Flush always goes to librbd.
//!
//! Deallocate: `rbd_aio_discard` per range. Reads of discarded blocks are
//! not guaranteed to return zeroes (librbd skips discards of partial
//! objects by default — `rbd_skip_partial_discard` — and a clone may show
//! its parent's data again), so DLFEAT does not say they do. Write Zeroes
//! uses `rbd_aio_write_zeroes`, which does read back as zeroes.
//!
//! librbd return codes → NVMe status ([`status_for`]):
//!
//! | librbd                                          | NVMe status                      | DNR |
//! |-------------------------------------------------|----------------------------------|-----|
//! | ≥ 0 (a read: exactly the bytes asked)           | Success                          |     |
//! | read shorter than asked, -EINVAL, -ERANGE       | LBA Out of Range                 | yes |
//! | -ETIMEDOUT, -EAGAIN, -ENOTCONN, -ESHUTDOWN (Ceph's EBLOCKLISTED), -ECONNREFUSED, -ECONNRESET, -EHOSTUNREACH, -ENETUNREACH, -EBUSY, -EINTR, -ECANCELED | Namespace Not Ready (the host retries) | no |
//! | -EROFS                                          | Namespace Is Write Protected     | yes |
//! | -EPERM, -EACCES                                 | Access Denied                    | yes |
//! | -ENOSPC, -EDQUOT                                | Capacity Exceeded                | yes |
//! | -EOPNOTSUPP                                     | Invalid Command Opcode           | yes |
//! | -ENOENT, -ENODEV, -ENXIO (image gone)           | Namespace Not Ready              | yes |
//! | -ENOMEM                                         | Internal Error                   | no  |
//! | -EIO and anything else, reads                   | Unrecovered Read Error           | no  |
//! | -EIO and anything else, other commands          | Write Fault                      | no  |
//!
//! Size: [`Backend::num_blocks`] is an atomic kept current by an
//! `rbd_update_watch` callback, which only signals a small watcher thread
//! (`nvmf-rbd-watch`); that thread calls `rbd_get_size` (which may
//! refresh the image and must not run inside librbd's callback) and calls
//! the [`ResizeHook`] when the size changed.
//!
//! Teardown: dropping the backend moves the image to a closing thread
//! (`nvmf-rbd-close`) that unwatches, calls `rbd_close` (which waits for
//! the image's in-flight operations and their callbacks), waits for the
//! last callback to give its slot back, then shuts the connection down;
//! nothing on the reactor waits, also when no thread can be spawned then
//! (`closer.rs`: the long-lived fallback closer). Buffers of I/O still in flight stay alive
//! through the sink clones each context holds (see [`crate::parked`]).

pub mod closer;
pub mod conn;
pub mod ffi;
pub mod group;
pub mod slab;

use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmf_config::BdevConfig;
use nvmf_wire::status::Status;

use crate::{
    byte_range, Backend, BdevError, BlockOp, CompletionSink, DsmRanges, IoTag, ResizeHook,
    Submitted,
};

pub use conn::{register_cluster, unregister_cluster};
use conn::{Conn, ConnSpec};
use slab::{Ctx, Op, Slab, Slot};

/// The NVMe status for a librbd return code `rc` (negative errno) of an
/// operation of kind `op` (see the module's table).
pub fn status_for(op: Op, rc: i64) -> Status {
    if rc >= 0 {
        return Status::SUCCESS;
    }
    let e = rc.unsigned_abs().min(i32::MAX as u64) as i32;
    match e {
        libc::EINVAL | libc::ERANGE => Status::LBA_OUT_OF_RANGE.with_dnr(),
        libc::ETIMEDOUT
        | libc::EAGAIN
        | libc::ENOTCONN
        | libc::ESHUTDOWN
        | libc::ECONNREFUSED
        | libc::ECONNRESET
        | libc::EHOSTUNREACH
        | libc::ENETUNREACH
        | libc::EBUSY
        | libc::EINTR
        | libc::ECANCELED => Status::NAMESPACE_NOT_READY,
        libc::EROFS => Status::NS_WRITE_PROTECTED.with_dnr(),
        libc::EPERM | libc::EACCES => Status::ACCESS_DENIED.with_dnr(),
        libc::ENOSPC | libc::EDQUOT => Status::CAPACITY_EXCEEDED.with_dnr(),
        libc::EOPNOTSUPP => Status::INVALID_OPCODE.with_dnr(),
        libc::ENOENT | libc::ENODEV | libc::ENXIO => Status::NAMESPACE_NOT_READY.with_dnr(),
        libc::ENOMEM => Status::INTERNAL_ERROR,
        _ if op == Op::Read => Status::UNRECOVERED_READ_ERROR,
        _ => Status::WRITE_FAULT,
    }
}

/// The open image and what it was opened through. Dropped on the closing
/// thread only.
struct Image {
    conn: Arc<Conn>,
    ioctx: ffi::Ioctx,
    raw: ffi::Image,
}

// SAFETY: librbd image handles and librados ioctxs may be used from any
// thread; this struct only closes them, once, in Drop.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

impl Drop for Image {
    fn drop(&mut self) {
        let lib = self.conn.lib;
        // SAFETY: our open image; rbd_close waits for its in-flight aio.
        let rc = unsafe { (lib.rbd_close)(self.raw) };
        if rc < 0 {
            tracing::warn!("rbd_close: {}", ffi::describe(rc.into()));
        }
        // SAFETY: our ioctx; the image made from it is closed.
        unsafe { (lib.rados_ioctx_destroy)(self.ioctx) };
    }
}

/// The size watch: librbd's handle, the argument its callback gets, and
/// the watcher thread.
struct Watch {
    handle: u64,
    arg: *mut SyncSender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

// SAFETY: `arg` is a boxed SyncSender (Send) only freed after unwatch.
unsafe impl Send for Watch {}

/// A bdev backed by a Ceph RBD image.
pub struct RbdBackend {
    name: String,
    block_size: u32,
    blocks: Arc<AtomicU64>,
    cache: bool,
    /// Opened with `rbd_open_read_only` (`read_only` in the bdev entry).
    read_only: bool,
    lib: &'static ffi::Lib,
    raw: ffi::Image,
    slab: Arc<Slab>,
    hook: Arc<Mutex<Option<ResizeHook>>>,
    /// `Some` until dropped (then moved to the closing thread).
    image: Option<Image>,
    watch: Option<Watch>,
    closed: Arc<AtomicBool>,
    /// Counts this bdev as a user of its connection until it is dropped
    /// (not until its image has closed: see [`conn::User`]).
    _user: conn::User,
}

// SAFETY: `raw` is a librbd image handle, usable from any thread; every
// other field is Send + Sync.
unsafe impl Send for RbdBackend {}
// SAFETY: as above; librbd's aio calls are thread-safe.
unsafe impl Sync for RbdBackend {}

impl std::fmt::Debug for RbdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdBackend")
            .field("name", &self.name)
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks())
            .field("cache", &self.cache)
            .field("read_only", &self.read_only)
            .finish()
    }
}

extern "C" fn on_update(arg: *mut c_void) {
    // SAFETY: `arg` is the Watch's boxed sender, freed only after
    // rbd_update_unwatch returned (no callback runs after that).
    let tx = unsafe { &*(arg as *const SyncSender<()>) };
    // Full: a check is already due.
    let _ = tx.try_send(());
}

/// librbd's completion callback (a librbd thread): see the module comment.
extern "C" fn on_complete(c: ffi::Completion, arg: *mut c_void) {
    let Ok(lib) = ffi::lib() else {
        return;
    };
    // SAFETY: `c` is the completion this callback was registered on.
    let rc = unsafe { (lib.rbd_aio_get_return_value)(c) } as i64;
    // SAFETY: ours to release, once; nothing uses it afterwards.
    unsafe { (lib.rbd_aio_release)(c) };
    // SAFETY: `arg` is the slot taken for this operation; its slab lives
    // until every slot is given back (the closing thread waits for that).
    let slot = unsafe { &*(arg as *const Slot) };
    if rc < 0 {
        slot.fail(rc);
    } else {
        // SAFETY: set before submission; only read until the last part ends.
        let short =
            unsafe { slot.ctx_ref() }.is_some_and(|c| c.op == Op::Read && (rc as usize) < c.expect);
        if short {
            slot.fail(-i64::from(libc::ERANGE));
        }
    }
    if let Some((ctx, status)) = part_done(lib, slot) {
        CompletionSink::post_and_wake(ctx.sink, ctx.tag, status);
    }
}

/// Starts one librbd operation for `slot` (`submit` gets the new
/// completion). On failure the completion is released and the error
/// returned (the callback will not run for it).
fn aio(
    lib: &ffi::Lib,
    slot: &Slot,
    submit: impl FnOnce(ffi::Completion) -> std::ffi::c_int,
) -> Result<(), i64> {
    let mut c: ffi::Completion = std::ptr::null_mut();
    // SAFETY: `slot` outlives the operation (see on_complete); `c` is a
    // valid out pointer.
    let rc = unsafe {
        (lib.rbd_aio_create_completion)(slot as *const Slot as *mut c_void, on_complete, &mut c)
    };
    if rc < 0 {
        return Err(rc.into());
    }
    let rc = submit(c);
    if rc < 0 {
        // SAFETY: never submitted: ours to release.
        unsafe { (lib.rbd_aio_release)(c) };
        return Err(rc.into());
    }
    Ok(())
}

/// One part of `slot`'s operation ended. When it was the last: chains the
/// FUA flush if one is due, else gives the slot back and returns the
/// context and its status for the caller to deliver.
fn part_done(lib: &ffi::Lib, slot: &Slot) -> Option<(Ctx, Status)> {
    if slot.remaining.fetch_sub(1, Ordering::AcqRel) != 1 {
        return None;
    }
    // SAFETY: the last part: this thread owns the slot now.
    let ctx = unsafe { slot.ctx() };
    if let Some(c) = ctx.as_mut() {
        if c.flush_after && slot.err.load(Ordering::Acquire) == 0 {
            c.flush_after = false;
            let image = c.image;
            slot.remaining.store(1, Ordering::Release);
            // SAFETY: the image is open while operations are in flight.
            match aio(lib, slot, |comp| unsafe {
                (lib.rbd_aio_flush)(image, comp)
            }) {
                // The flush's callback owns the slot now: do not touch it.
                Ok(()) => return None,
                Err(rc) => slot.fail(rc),
            }
        }
    }
    let err = slot.err.load(Ordering::Acquire);
    let op = ctx.as_ref().map_or(Op::Flush, |c| c.op);
    let status = status_for(op, err);
    if err != 0 {
        // SAFETY: still in use (given back below).
        unsafe { slot.report(op, err, status) };
    }
    // SAFETY: owned by this thread (last part); not touched afterwards.
    let ctx = unsafe { slab::Slab::give_back(slot) }?;
    Some((ctx, status))
}

impl RbdBackend {
    /// Opens the image `cfg` names (blocking: connects to the cluster
    /// unless `cluster_name` names a registered one, then opens the image
    /// and starts the size watch). Runs on the control plane (bdev
    /// creation), never on a reactor. Fails within the connection
    /// timeouts (see [`conn::DEFAULTS`]) with a message for the operator:
    /// library missing, cluster unreachable, pool or image not found.
    pub fn open(cfg: &BdevConfig) -> Result<RbdBackend, BdevError> {
        let err = |reason: String| BdevError {
            name: cfg.name.clone(),
            reason,
        };
        // Closing must never fall back to the dropping thread.
        closer::ensure_started().map_err(err)?;
        let r = cfg
            .rbd
            .as_ref()
            .ok_or_else(|| err("rbd bdev without rbd parameters".to_string()))?;
        let conn = match &r.cluster_name {
            Some(name) => conn::cluster(name)
                .ok_or_else(|| err(format!("no registered rbd cluster named {name}")))?,
            None => {
                let label = format!("bdev {}", cfg.name);
                Conn::connect(&ConnSpec {
                    label: &label,
                    user_id: r.user_id.as_deref(),
                    params: Some(&r.config_param),
                    ..ConnSpec::default()
                })
                .map_err(err)?
            }
        };
        let lib = conn.lib;
        let pool = CString::new(r.pool_name.as_str())
            .map_err(|_| err("pool_name contains a NUL byte".into()))?;
        let image_name = CString::new(r.rbd_name.as_str())
            .map_err(|_| err("rbd_name contains a NUL byte".into()))?;
        let mut ioctx: ffi::Ioctx = std::ptr::null_mut();
        // SAFETY: connected handle, NUL-terminated name, valid out pointer.
        let rc = unsafe { (lib.rados_ioctx_create)(conn.raw, pool.as_ptr(), &mut ioctx) };
        if rc < 0 {
            return Err(err(format!(
                "pool {}: {}",
                r.pool_name,
                ffi::describe(rc.into())
            )));
        }
        let mut raw: ffi::Image = std::ptr::null_mut();
        let open = if r.read_only {
            lib.rbd_open_read_only
        } else {
            lib.rbd_open
        };
        // SAFETY: valid ioctx, NUL-terminated name, no snapshot (null).
        let rc = unsafe { open(ioctx, image_name.as_ptr(), &mut raw, std::ptr::null()) };
        if rc < 0 {
            // SAFETY: our ioctx, unused by anything else.
            unsafe { (lib.rados_ioctx_destroy)(ioctx) };
            return Err(err(format!(
                "image {}/{}: {}",
                r.pool_name,
                r.rbd_name,
                ffi::describe(rc.into())
            )));
        }
        let cache = conn.cache;
        let user = conn::User::new(&conn);
        let image = Image { conn, ioctx, raw };
        let mut size = 0u64;
        // SAFETY: open image, valid out pointer.
        let rc = unsafe { (lib.rbd_get_size)(raw, &mut size) };
        if rc < 0 {
            return Err(err(format!("rbd_get_size: {}", ffi::describe(rc.into()))));
        }
        let blocks = size / u64::from(cfg.block_size);
        if blocks == 0 {
            return Err(err(format!(
                "image {}/{} ({size} bytes) is smaller than one {}-byte block",
                r.pool_name, r.rbd_name, cfg.block_size
            )));
        }
        let mut features = 0u64;
        // SAFETY: open image, valid out pointer.
        if !r.read_only
            && unsafe { (lib.rbd_get_features)(raw, &mut features) } >= 0
            && features & ffi::RBD_FEATURE_EXCLUSIVE_LOCK != 0
        {
            tracing::warn!(
                bdev = %cfg.name,
                "image {}/{} has the exclusive-lock feature: two gateways writing it will \
                 pass the lock back and forth, and a killed gateway stalls the other; \
                 create images served by several gateways with --image-feature layering",
                r.pool_name,
                r.rbd_name
            );
        }
        let mut b = RbdBackend {
            name: cfg.name.clone(),
            block_size: cfg.block_size,
            blocks: Arc::new(AtomicU64::new(blocks)),
            cache,
            read_only: r.read_only,
            lib,
            raw,
            slab: Slab::new(slab::SLOTS, &cfg.name),
            hook: Arc::new(Mutex::new(None)),
            image: Some(image),
            watch: None,
            closed: Arc::new(AtomicBool::new(false)),
            _user: user,
        };
        b.watch = b.start_watch();
        tracing::info!(
            bdev = %cfg.name,
            "opened rbd image {}/{}{}: {blocks} blocks of {}, librbd cache {}",
            r.pool_name,
            r.rbd_name,
            if r.read_only { " read-only" } else { "" },
            cfg.block_size,
            if cache { "on (FUA = write + flush)" } else { "off" }
        );
        Ok(b)
    }

    /// Whether librbd's write-back cache is on for this image.
    pub fn cache(&self) -> bool {
        self.cache
    }

    /// Set once the image is closed and everything about it freed (after
    /// the backend was dropped), for tests and logs.
    pub fn closed_flag(&self) -> Arc<AtomicBool> {
        self.closed.clone()
    }

    /// Operations in flight on this image.
    pub fn in_flight(&self) -> usize {
        self.slab.in_flight()
    }

    fn start_watch(&self) -> Option<Watch> {
        let (tx, rx) = sync_channel::<()>(1);
        let arg = Box::into_raw(Box::new(tx));
        let mut handle = 0u64;
        // SAFETY: open image; `arg` lives until after rbd_update_unwatch.
        let rc =
            unsafe { (self.lib.rbd_update_watch)(self.raw, &mut handle, on_update, arg.cast()) };
        if rc < 0 {
            // SAFETY: never handed to librbd successfully.
            drop(unsafe { Box::from_raw(arg) });
            tracing::warn!(
                bdev = %self.name,
                "rbd_update_watch: {}: size changes made elsewhere are not seen",
                ffi::describe(rc.into())
            );
            return None;
        }
        let (lib, raw) = (self.lib, self.raw as usize);
        let (blocks, hook, bs, name) = (
            self.blocks.clone(),
            self.hook.clone(),
            u64::from(self.block_size),
            self.name.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("nvmf-rbd-watch".into())
            .spawn(move || {
                // Ends when the sender is freed (after unwatch, at close).
                for () in rx {
                    let mut size = 0u64;
                    // SAFETY: the image stays open until this thread is joined.
                    let rc = unsafe { (lib.rbd_get_size)(raw as ffi::Image, &mut size) };
                    if rc < 0 {
                        tracing::warn!(bdev = %name, "rbd_get_size: {}", ffi::describe(rc.into()));
                        continue;
                    }
                    let n = size / bs;
                    if blocks.swap(n, Ordering::AcqRel) != n {
                        tracing::info!(bdev = %name, "rbd image resized: {n} blocks");
                        let h = hook.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        if let Some(h) = h {
                            h(n);
                        }
                    }
                }
            });
        match thread {
            Ok(t) => Some(Watch {
                handle,
                arg,
                thread: Some(t),
            }),
            Err(e) => {
                tracing::warn!(bdev = %self.name, "no size watcher thread: {e}");
                // SAFETY: our watch on our open image; then nothing calls back.
                unsafe { (self.lib.rbd_update_unwatch)(self.raw, handle) };
                // SAFETY: unwatched: librbd no longer holds it.
                drop(unsafe { Box::from_raw(arg) });
                None
            }
        }
    }

    /// Submits one librbd operation for `ctx` (the reactor's path).
    fn one(&self, ctx: Ctx, submit: impl FnOnce(ffi::Completion) -> std::ffi::c_int) -> Submitted {
        // Two parts: the operation and the submitter's hold, released
        // below, so whoever ends last (this thread or the callback)
        // completes it.
        let slot = self.slab.take(ctx, 2);
        if let Err(rc) = aio(self.lib, slot, submit) {
            slot.fail(rc);
            // The operation's part never runs: release it here.
            slot.remaining.fetch_sub(1, Ordering::AcqRel);
        }
        self.release(slot)
    }

    /// Drops the submitter's hold on `slot`: completes inline if every
    /// part already ended.
    fn release(&self, slot: &Slot) -> Submitted {
        match part_done(self.lib, slot) {
            None => Submitted::Pending,
            Some((ctx, status)) => {
                drop(ctx);
                Submitted::Done(status)
            }
        }
    }

    fn ctx(&self, tag: IoTag, sink: &Arc<CompletionSink>, op: Op) -> Ctx {
        Ctx {
            tag,
            sink: sink.clone(),
            op,
            expect: 0,
            flush_after: false,
            image: self.raw,
        }
    }

    /// Byte offset and length of `blocks` at `lba`, if inside the image.
    fn range(&self, lba: u64, blocks: u64) -> Option<(u64, usize)> {
        byte_range(lba, blocks, self.block_size, self.num_blocks())
            .map(|(off, len)| (off as u64, len))
    }
}

const OUT_OF_RANGE: Submitted = Submitted::Done(Status::LBA_OUT_OF_RANGE.with_dnr());
const WRITE_PROTECTED: Submitted = Submitted::Done(Status::NS_WRITE_PROTECTED.with_dnr());

impl Backend for RbdBackend {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        "rbd"
    }
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.blocks.load(Ordering::Relaxed)
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        false
    }
    fn needs_stable_buffers(&self) -> bool {
        true
    }
    fn read_only(&self) -> bool {
        self.read_only
    }

    fn submit(&self, op: BlockOp<'_>, tag: IoTag, sink: &Arc<CompletionSink>) -> Submitted {
        let (lib, image) = (self.lib, self.raw);
        let bs = u64::from(self.block_size);
        match op {
            BlockOp::Read { lba, buf } => {
                if !(buf.len() as u64).is_multiple_of(bs) {
                    return OUT_OF_RANGE;
                }
                let Some((off, len)) = self.range(lba, buf.len() as u64 / bs) else {
                    return OUT_OF_RANGE;
                };
                let ptr = buf.as_mut_ptr();
                let mut ctx = self.ctx(tag, sink, Op::Read);
                ctx.expect = len;
                // SAFETY: the buffer stays valid and unmoved until the
                // completion is posted (Submitted::Pending contract; the
                // context's sink clone keeps it alive if the queue closes).
                self.one(ctx, |c| unsafe {
                    (lib.rbd_aio_read)(image, off, len, ptr.cast(), c)
                })
            }
            BlockOp::Write { .. } | BlockOp::WriteZeroes { .. } if self.read_only => {
                WRITE_PROTECTED
            }
            BlockOp::Write { lba, buf, fua } => {
                if !(buf.len() as u64).is_multiple_of(bs) {
                    return OUT_OF_RANGE;
                }
                let Some((off, len)) = self.range(lba, buf.len() as u64 / bs) else {
                    return OUT_OF_RANGE;
                };
                let ptr = buf.as_ptr();
                let mut ctx = self.ctx(tag, sink, Op::Write);
                ctx.flush_after = fua && self.cache;
                // SAFETY: as for reads.
                self.one(ctx, |c| unsafe {
                    (lib.rbd_aio_write2)(image, off, len, ptr.cast(), c, 0)
                })
            }
            BlockOp::Flush => {
                let ctx = self.ctx(tag, sink, Op::Flush);
                // SAFETY: open image.
                self.one(ctx, |c| unsafe { (lib.rbd_aio_flush)(image, c) })
            }
            BlockOp::WriteZeroes { lba, blocks, fua } => {
                let Some((off, len)) = self.range(lba, blocks) else {
                    return OUT_OF_RANGE;
                };
                let mut ctx = self.ctx(tag, sink, Op::WriteZeroes);
                ctx.flush_after = fua && self.cache;
                // SAFETY: open image; no buffer involved.
                self.one(ctx, |c| unsafe {
                    (lib.rbd_aio_write_zeroes)(image, off, len, c, 0, 0)
                })
            }
        }
    }

    fn deallocate(
        &self,
        ranges: DsmRanges<'_>,
        tag: IoTag,
        sink: &Arc<CompletionSink>,
    ) -> Submitted {
        if self.read_only {
            return WRITE_PROTECTED;
        }
        // Checked first, submitted after: no list is built.
        let mut parts = 0u32;
        for (slba, nlb) in ranges.iter() {
            if self.range(slba, nlb).is_none() {
                return OUT_OF_RANGE;
            }
            parts = parts.saturating_add(1);
        }
        if parts == 0 {
            return Submitted::Done(Status::SUCCESS);
        }
        let (lib, image) = (self.lib, self.raw);
        let ctx = self.ctx(tag, sink, Op::Discard);
        let slot = self.slab.take(ctx, parts.saturating_add(1));
        for (slba, nlb) in ranges.iter().take(parts as usize) {
            let (off, len) = self.range(slba, nlb).unwrap_or((0, 0));
            // SAFETY: open image; no buffer involved.
            let r = aio(lib, slot, |c| unsafe {
                (lib.rbd_aio_discard)(image, off, len as u64, c)
            });
            if let Err(rc) = r {
                slot.fail(rc);
                slot.remaining.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.release(slot)
    }

    fn resize(&self, num_blocks: u64) -> Result<(), BdevError> {
        if self.read_only {
            return Err(BdevError {
                name: self.name.clone(),
                reason: "the image is open read-only (read_only): it cannot be resized \
                         through this bdev"
                    .to_string(),
            });
        }
        let bytes = num_blocks
            .checked_mul(u64::from(self.block_size))
            .ok_or_else(|| BdevError {
                name: self.name.clone(),
                reason: format!("{num_blocks} blocks is too large"),
            })?;
        // SAFETY: open image; blocking call on the control plane.
        let rc = unsafe { (self.lib.rbd_resize)(self.raw, bytes) };
        if rc < 0 {
            return Err(BdevError {
                name: self.name.clone(),
                reason: format!("rbd_resize to {bytes} bytes: {}", ffi::describe(rc.into())),
            });
        }
        self.blocks.store(num_blocks, Ordering::Release);
        Ok(())
    }

    fn watch_size(&self, hook: ResizeHook) {
        *self.hook.lock().unwrap_or_else(|e| e.into_inner()) = Some(hook);
    }
}

/// How long the closing thread waits between reports while the image's
/// operations do not end.
const CLOSE_REPORT: Duration = Duration::from_secs(10);

impl Drop for RbdBackend {
    fn drop(&mut self) {
        let Some(image) = self.image.take() else {
            return;
        };
        let watch = self.watch.take();
        let slab = self.slab.clone();
        let (lib, name, closed) = (self.lib, self.name.clone(), self.closed.clone());
        let close = move || {
            let start = Instant::now();
            let in_flight = slab.in_flight();
            if in_flight > 0 {
                // rbd_close below waits for these (at most the OSD op
                // timeout when the cluster stopped answering).
                tracing::info!(bdev = %name, in_flight, "closing rbd image with I/O in flight");
            }
            if let Some(mut w) = watch {
                // SAFETY: our watch on the still-open image; once it
                // returns no update callback runs any more.
                unsafe { (lib.rbd_update_unwatch)(image.raw, w.handle) };
                // SAFETY: unwatched: librbd no longer holds the sender;
                // dropping it ends the watcher thread.
                drop(unsafe { Box::from_raw(w.arg) });
                if let Some(t) = w.thread.take() {
                    let _ = t.join();
                }
            }
            // rbd_close waits for the image's operations in flight.
            drop(image);
            // Their callbacks may still be giving slots back.
            let mut last = Instant::now();
            while slab.in_flight() > 0 {
                if last.elapsed() >= CLOSE_REPORT {
                    last = Instant::now();
                    tracing::warn!(
                        bdev = %name,
                        in_flight = slab.in_flight(),
                        waited_s = start.elapsed().as_secs(),
                        "rbd image closed but completions still running"
                    );
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(slab);
            closed.store(true, Ordering::Release);
            tracing::info!(
                bdev = %name,
                in_flight_at_close = in_flight,
                took_ms = start.elapsed().as_millis() as u64,
                "rbd image closed"
            );
        };
        match closer::hand_off(Box::new(close), closer::spawn_thread) {
            Ok(closer::Where::OwnThread) => {}
            Ok(closer::Where::Fallback) => tracing::warn!(
                bdev = %self.name,
                "cannot start a closing thread: the image closes on nvmf-rbd-closer"
            ),
            Err(e) => tracing::error!(bdev = %self.name, "{e}"),
        }
    }
}

/// The registry's constructor for kind "rbd" (control plane: blocks while
/// connecting and opening).
pub(crate) fn new_rbd(cfg: &BdevConfig) -> Result<Arc<dyn Backend>, BdevError> {
    Ok(Arc::new(RbdBackend::open(cfg)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table in the module comment.
    #[test]
    fn error_mapping() {
        let s = |op, e: i32| status_for(op, -i64::from(e));
        assert_eq!(status_for(Op::Read, 4096), Status::SUCCESS);
        assert_eq!(status_for(Op::Write, 0), Status::SUCCESS);
        for e in [
            libc::ETIMEDOUT,
            libc::EAGAIN,
            libc::ENOTCONN,
            libc::ESHUTDOWN,
        ] {
            let st = s(Op::Write, e);
            assert_eq!(st, Status::NAMESPACE_NOT_READY, "errno {e}");
            assert_eq!(st.to_field() & 0x8000, 0, "errno {e}: retryable, no DNR");
        }
        assert_eq!(
            s(Op::Write, libc::EROFS),
            Status::NS_WRITE_PROTECTED.with_dnr()
        );
        assert_eq!(
            s(Op::Read, libc::EINVAL),
            Status::LBA_OUT_OF_RANGE.with_dnr()
        );
        assert_eq!(
            s(Op::Read, libc::ERANGE),
            Status::LBA_OUT_OF_RANGE.with_dnr()
        );
        assert_eq!(s(Op::Read, libc::EIO), Status::UNRECOVERED_READ_ERROR);
        assert_eq!(s(Op::Write, libc::EIO), Status::WRITE_FAULT);
        assert_eq!(
            s(Op::Discard, libc::EOPNOTSUPP),
            Status::INVALID_OPCODE.with_dnr()
        );
        assert_eq!(
            s(Op::Write, libc::ENOSPC),
            Status::CAPACITY_EXCEEDED.with_dnr()
        );
        assert_eq!(s(Op::Write, libc::EACCES), Status::ACCESS_DENIED.with_dnr());
        assert_eq!(s(Op::Flush, libc::ENOMEM), Status::INTERNAL_ERROR);
    }

    /// A bdev entry without its rbd parameters, or naming a cluster that
    /// is not registered, is refused with the bdev's name.
    #[test]
    fn bad_entries_are_refused() {
        let mut cfg = BdevConfig {
            name: "r0".into(),
            kind: nvmf_config::BdevKind::Rbd,
            block_size: 512,
            num_blocks: 0,
            uuid: None,
            file: None,
            rbd: None,
        };
        let e = RbdBackend::open(&cfg).unwrap_err();
        assert!(e.to_string().contains("r0"), "{e}");
        cfg.rbd = Some(nvmf_config::RbdBdev {
            pool_name: "p".into(),
            rbd_name: "i".into(),
            user_id: None,
            config_param: Default::default(),
            cluster_name: Some("nvmfd-no-such-cluster".into()),
            read_only: false,
        });
        let e = RbdBackend::open(&cfg).unwrap_err();
        assert!(e.reason.contains("no registered rbd cluster"), "{e}");
    }
}
