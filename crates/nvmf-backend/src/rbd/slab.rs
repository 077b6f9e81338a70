//! Per-operation contexts for librbd callbacks, without an allocation or
//! a lock per I/O.
//!
//! Owns a fixed array of [`Slot`]s per image and a lock-free queue of the
//! free ones (`crossbeam_queue::ArrayQueue`): any reactor takes a slot at
//! submission, and the librbd thread that runs the completion callback
//! gives it back. A slot's address is what librbd hands to the callback.
//! When every slot is busy (more operations in flight than [`SLOTS`]) an
//! extra slot is boxed and freed after its completion: an allocation only
//! past that depth. The number of operations in flight is counted
//! ([`Slab::in_flight`]) so the image's closing thread can tell when no
//! callback can touch the slab any more. Failed operations are counted
//! and logged from the callback, at most once per [`ERROR_LOG_INTERVAL_MS`]
//! per image (a cluster outage fails thousands of I/Os a second).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crossbeam_queue::ArrayQueue;

use crate::{CompletionSink, IoTag};

use super::ffi;

/// Slots per image (operations in flight before slots are boxed).
pub const SLOTS: usize = 1024;

/// What an operation does (for its status on error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    WriteZeroes,
    Discard,
}

/// Everything the completion needs: where to post, and what to chain.
#[derive(Debug)]
pub struct Ctx {
    pub tag: IoTag,
    /// The queue pair's sink; this clone keeps its buffers alive (parked
    /// if the queue closes) until the completion is posted.
    pub sink: Arc<CompletionSink>,
    pub op: Op,
    /// Bytes a read must return.
    pub expect: usize,
    /// Send a flush after the write (FUA with librbd's cache on).
    pub flush_after: bool,
    pub image: ffi::Image,
}

/// Milliseconds between two logged I/O errors of one image.
pub const ERROR_LOG_INTERVAL_MS: u64 = 1000;

/// Where slots go back to, the count of slots in use, and the image's
/// error log state.
struct Home {
    free: ArrayQueue<u32>,
    in_flight: AtomicUsize,
    /// The bdev's name (for the error log).
    name: String,
    /// Failed operations not yet logged.
    errors: AtomicU64,
    /// When an error was last logged (ms since [`epoch`]; 0: never).
    logged_ms: AtomicU64,
}

/// A process-wide monotonic origin for the error log's clock.
fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

impl Home {
    /// Counts a failed operation; logs it (with the count since the last
    /// line) when the last line is old enough. Returns whether it logged.
    fn report(&self, op: Op, rc: i64, status: nvmf_wire::status::Status) -> bool {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let now = epoch().elapsed().as_millis() as u64 + 1;
        let last = self.logged_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < ERROR_LOG_INTERVAL_MS {
            return false;
        }
        if self
            .logged_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        let n = self.errors.swap(0, Ordering::Relaxed);
        tracing::warn!(
            bdev = %self.name,
            failed_since_last_report = n,
            "rbd {op:?} failed: {} -> {}",
            ffi::describe(rc),
            status.name()
        );
        true
    }
}

/// One operation's context, at a stable address for librbd's callback.
pub struct Slot {
    home: *const Home,
    /// Index in the slab, or `u32::MAX` for a boxed overflow slot.
    idx: u32,
    /// Parts still to complete (librbd operations, plus one held by the
    /// submitter until it has submitted them all).
    pub remaining: AtomicU32,
    /// First negative return code seen (0: none).
    pub err: AtomicI64,
    ctx: UnsafeCell<Option<Ctx>>,
}

impl Slot {
    fn new(home: *const Home, idx: u32) -> Slot {
        Slot {
            home,
            idx,
            remaining: AtomicU32::new(0),
            err: AtomicI64::new(0),
            ctx: UnsafeCell::new(None),
        }
    }

    /// The context of a slot in use.
    ///
    /// # Safety
    /// Only the slot's current owner (the submitter until it has released
    /// its part, then the callback that finished the last part) may call it,
    /// and not twice at once.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn ctx(&self) -> &mut Option<Ctx> {
        // SAFETY: exclusive by the caller's contract.
        unsafe { &mut *self.ctx.get() }
    }

    /// The context of a slot in use, to read.
    ///
    /// # Safety
    /// The caller holds an unfinished part of the slot's operation (so
    /// nobody takes the context out meanwhile).
    pub unsafe fn ctx_ref(&self) -> Option<&Ctx> {
        // SAFETY: by the caller's contract nobody writes it meanwhile.
        unsafe { (*self.ctx.get()).as_ref() }
    }

    /// Counts and (rate-limited) logs this slot's failed operation.
    ///
    /// # Safety
    /// The slot is in use (its slab alive): call before [`Slab::give_back`].
    pub unsafe fn report(&self, op: Op, rc: i64, status: nvmf_wire::status::Status) -> bool {
        // SAFETY: the slab outlives slots in use (caller's contract).
        unsafe { &*self.home }.report(op, rc, status)
    }

    /// Records `rc` if it is the first error.
    pub fn fail(&self, rc: i64) {
        let _ = self
            .err
            .compare_exchange(0, rc, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The slots of one image.
pub struct Slab {
    home: Box<Home>,
    slots: Box<[Slot]>,
}

// SAFETY: a slot's context is only touched by its owner (handed over
// through the free queue, whose push/pop order the accesses, and through
// the `remaining` count's AcqRel decrement); the raw `home` pointers point
// into this same slab's box, which outlives every slot in use (see
// `in_flight`). `Ctx` itself is Send (an image handle is used from any
// thread).
unsafe impl Send for Slab {}
// SAFETY: see Send.
unsafe impl Sync for Slab {}
// SAFETY: a Slot in flight is owned by one thread at a time (see Slab).
unsafe impl Send for Slot {}
// SAFETY: see Send.
unsafe impl Sync for Slot {}

impl Slab {
    /// `n` slots for the image of bdev `name`.
    pub fn new(n: usize, name: &str) -> Arc<Slab> {
        let home = Box::new(Home {
            free: ArrayQueue::new(n.max(1)),
            in_flight: AtomicUsize::new(0),
            name: name.to_string(),
            errors: AtomicU64::new(0),
            logged_ms: AtomicU64::new(0),
        });
        let hp: *const Home = &*home;
        let slots: Box<[Slot]> = (0..n as u32).map(|i| Slot::new(hp, i)).collect();
        for i in 0..n as u32 {
            let _ = home.free.push(i);
        }
        Arc::new(Slab { home, slots })
    }

    /// Takes a slot for `ctx`, its `remaining` set to `parts`.
    pub fn take(&self, ctx: Ctx, parts: u32) -> &Slot {
        self.home.in_flight.fetch_add(1, Ordering::Relaxed);
        let slot: &Slot = match self.home.free.pop() {
            Some(i) => &self.slots[i as usize],
            None => Box::leak(Box::new(Slot::new(&*self.home, u32::MAX))),
        };
        slot.remaining.store(parts, Ordering::Relaxed);
        slot.err.store(0, Ordering::Relaxed);
        // SAFETY: the slot just came off the free queue (or was made
        // here): nobody else owns it.
        unsafe { *slot.ctx() = Some(ctx) };
        slot
    }

    /// Operations in flight (slots taken and not given back).
    pub fn in_flight(&self) -> usize {
        self.home.in_flight.load(Ordering::Acquire)
    }

    /// Takes the context out of a finished slot and returns the slot. After
    /// this the caller must not touch the slot or its slab again (the slab
    /// may be freed as soon as the in-flight count reaches zero).
    ///
    /// # Safety
    /// `slot` is in use, owned by the caller, and its slab still alive.
    pub unsafe fn give_back(slot: &Slot) -> Option<Ctx> {
        // SAFETY: owned by the caller.
        let ctx = unsafe { slot.ctx() }.take();
        let home = slot.home;
        if slot.idx == u32::MAX {
            // SAFETY: overflow slots are leaked boxes (see `take`), owned
            // by the caller and referenced by nobody else now.
            drop(unsafe { Box::from_raw(slot as *const Slot as *mut Slot) });
        } else {
            // SAFETY: the slab (and its home) lives while this slot is in use.
            let _ = unsafe { &*home }.free.push(slot.idx);
        }
        // SAFETY: as above; the last touch of the slab.
        unsafe { &*home }.in_flight.fetch_sub(1, Ordering::Release);
        ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(sink: &Arc<CompletionSink>) -> Ctx {
        Ctx {
            tag: IoTag {
                cid: 1,
                bytes: 0,
                write: false,
                nsid: 0,
            },
            sink: sink.clone(),
            op: Op::Read,
            expect: 0,
            flush_after: false,
            image: std::ptr::null_mut(),
        }
    }

    /// Slots are reused, overflow slots come and go, and the in-flight
    /// count follows, from several threads at once.
    #[test]
    fn slots_cycle_across_threads() {
        let slab = Slab::new(4, "t");
        let sink = CompletionSink::new();
        let taken: Vec<usize> = (0..6)
            .map(|_| slab.take(ctx(&sink), 1) as *const Slot as usize)
            .collect();
        assert_eq!(slab.in_flight(), 6);
        let threads: Vec<_> = taken
            .into_iter()
            .map(|p| {
                std::thread::spawn(move || {
                    // SAFETY: each slot is owned by exactly one thread here.
                    let c = unsafe { Slab::give_back(&*(p as *const Slot)) };
                    assert!(c.is_some());
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(slab.in_flight(), 0);
        assert_eq!(Arc::strong_count(&sink), 1, "contexts dropped");
        assert_eq!(slab.home.free.len(), 4, "every fixed slot back");
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;
    use nvmf_wire::status::Status;

    /// The first error is logged, the next ones within the interval only
    /// counted, and one after it logged again.
    #[test]
    fn errors_are_logged_rate_limited() {
        let slab = Slab::new(1, "r");
        let st = Status::NAMESPACE_NOT_READY;
        assert!(slab.home.report(Op::Write, -110, st));
        for _ in 0..1000 {
            assert!(!slab.home.report(Op::Write, -110, st));
        }
        assert_eq!(slab.home.errors.load(Ordering::Relaxed), 1000);
        std::thread::sleep(std::time::Duration::from_millis(ERROR_LOG_INTERVAL_MS + 50));
        assert!(slab
            .home
            .report(Op::Read, -5, Status::UNRECOVERED_READ_ERROR));
        assert_eq!(slab.home.errors.load(Ordering::Relaxed), 0);
    }
}
