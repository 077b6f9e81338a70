//! Parked buffers: what a closed queue pair leaves behind while backend
//! operations still point into it.
//!
//! Owns a per-thread list of (the queue's [`CompletionSink`], a keep-alive
//! box holding the transport's request buffers). Every operation in flight
//! (an io_uring op, a helper job) holds a clone of its queue's sink and
//! drops it when it finishes, so "the sink's strong count is 1" means
//! "nobody can touch these buffers any more": [`reap`] then frees them.
//! Teardown therefore never waits for the kernel or a helper; the reactor
//! calls [`reap`] on every loop turn (through `uring::flush`), and the
//! thread's wake-up eventfd (`wake`: the ring and other threads' posts
//! signal it) wakes it when operations end.
//! Entries parked longer than [`PARKED_WARN`] are logged, at most once per
//! [`PARKED_WARN`] per thread.
//!
//! Nothing here ever frees early: an entry waits however long its backend
//! takes (a cluster that stops answering can take minutes), and a thread
//! that ends with entries still in use leaks them rather than free them
//! under a foreign writer. The memory is accounted process-wide
//! ([`parked_bytes`], [`parked_total`]; the transport's charged buffers
//! also stay charged to its buffer budget while parked, which is what
//! bounds it: a gateway whose backend hangs runs out of budget, and new
//! commands wait, instead of growing without end).

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::CompletionSink;

/// Age after which parked buffers are reported (and the report interval).
pub const PARKED_WARN: Duration = Duration::from_secs(30);

struct Parked {
    sink: Arc<CompletionSink>,
    _keep: Box<dyn Any>,
    bytes: usize,
    since: Instant,
}

/// Bytes parked on every thread (what the transports said they hold).
static BYTES: AtomicUsize = AtomicUsize::new(0);
/// Entries parked on every thread.
static TOTAL: AtomicUsize = AtomicUsize::new(0);

impl Drop for Parked {
    fn drop(&mut self) {
        BYTES.fetch_sub(self.bytes, Ordering::Relaxed);
        TOTAL.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The per-thread list. When the thread ends with entries still in use
/// (a reactor stopped while the kernel still holds their buffers), those
/// are leaked rather than freed under the kernel's feet.
struct List(Vec<Parked>);

impl Drop for List {
    fn drop(&mut self) {
        for e in self.0.drain(..) {
            if Arc::strong_count(&e.sink) > 1 {
                std::mem::forget(e);
            }
        }
    }
}

thread_local! {
    static PARKED: RefCell<List> = const { RefCell::new(List(Vec::new())) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
    static LAST_WARN: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Keeps `keep` (about `bytes` of memory) alive on this thread until no
/// operation holds `sink` any more, however long that takes (dropped at
/// once when none does).
pub fn park(sink: Arc<CompletionSink>, keep: Box<dyn Any>, bytes: usize) {
    if Arc::strong_count(&sink) <= 1 {
        return;
    }
    BYTES.fetch_add(bytes, Ordering::Relaxed);
    TOTAL.fetch_add(1, Ordering::Relaxed);
    PARKED.with(|p| {
        let p = &mut p.borrow_mut().0;
        p.push(Parked {
            sink,
            _keep: keep,
            bytes,
            since: Instant::now(),
        });
        COUNT.with(|c| c.set(p.len()));
    });
}

/// Entries parked on this thread.
pub fn parked() -> usize {
    COUNT.with(Cell::get)
}

/// Bytes parked on all threads (entries leaked by ended threads included:
/// they are still held).
pub fn parked_bytes() -> usize {
    BYTES.load(Ordering::Relaxed)
}

/// Entries parked on all threads.
pub fn parked_total() -> usize {
    TOTAL.load(Ordering::Relaxed)
}

/// Frees every parked entry whose operations all finished; returns how
/// many are still parked. One thread-local read when nothing is parked.
pub fn reap() -> usize {
    if parked() == 0 {
        return 0;
    }
    reap_at(Instant::now()).0
}

/// [`reap`] as if it were `now`; also says whether it logged the
/// "still waiting" warning.
fn reap_at(now: Instant) -> (usize, bool) {
    let mut warned = false;
    let Some((left, oldest)) = PARKED.with(|p| {
        // Not re-entrant: a drop below cannot reach here, but be safe.
        let mut guard = p.try_borrow_mut().ok()?;
        let p = &mut guard.0;
        p.retain(|e| {
            let busy = Arc::strong_count(&e.sink) > 1;
            if !busy {
                // The count is read relaxed and the operations' last sink
                // clones were dropped with release: this fence orders their
                // writes into the buffers before the free (as `Arc`'s own
                // drop does).
                std::sync::atomic::fence(Ordering::Acquire);
            }
            busy
        });
        COUNT.with(|c| c.set(p.len()));
        Some((p.len(), p.iter().map(|e| e.since).min()))
    }) else {
        return (parked(), false);
    };
    if let Some(oldest) = oldest {
        let age = now.saturating_duration_since(oldest);
        if age >= PARKED_WARN {
            let due = LAST_WARN.with(|w| {
                w.get()
                    .is_none_or(|t| now.saturating_duration_since(t) >= PARKED_WARN)
            });
            if due {
                LAST_WARN.with(|w| w.set(Some(now)));
                warned = true;
                tracing::warn!(
                    parked = left,
                    oldest_s = age.as_secs(),
                    parked_bytes_all_threads = parked_bytes(),
                    "buffers of closed queues still wait for backend I/O (device not answering?)"
                );
            }
        }
    }
    (left, warned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn freed_only_once_the_sink_is_idle() {
        let freed = Arc::new(AtomicBool::new(false));
        let sink = CompletionSink::new();
        let op = sink.clone(); // an operation in flight
        park(sink, Box::new(Flag(freed.clone())), 0);
        assert_eq!(parked(), 1);
        assert_eq!(reap(), 1);
        assert!(!freed.load(Ordering::SeqCst), "freed while in use");
        drop(op);
        assert_eq!(reap(), 0);
        assert!(freed.load(Ordering::SeqCst), "never freed");

        // Nothing in flight: dropped at once.
        let freed2 = Arc::new(AtomicBool::new(false));
        park(CompletionSink::new(), Box::new(Flag(freed2.clone())), 0);
        assert!(freed2.load(Ordering::SeqCst));
        assert_eq!(parked(), 0);
    }

    /// Entries parked past PARKED_WARN are reported, at most once per
    /// PARKED_WARN.
    #[test]
    fn long_parked_entries_are_reported_rate_limited() {
        let sink = CompletionSink::new();
        let op = sink.clone();
        park(sink, Box::new(()), 0);
        let t0 = Instant::now();
        assert_eq!(reap_at(t0), (1, false), "young entries are not reported");
        let late = t0 + PARKED_WARN + Duration::from_secs(1);
        assert_eq!(reap_at(late), (1, true));
        assert_eq!(
            reap_at(late + Duration::from_secs(1)),
            (1, false),
            "rate limited"
        );
        assert_eq!(reap_at(late + PARKED_WARN), (1, true));
        drop(op);
        assert_eq!(reap_at(late + PARKED_WARN * 3), (0, false));
    }

    /// A request buffer whose drop records whether the backend's late
    /// write had landed (the canary) and whether it was posted first.
    struct Canary {
        buf: Vec<u8>,
        posted: Arc<AtomicBool>,
        freed_ok: Arc<AtomicBool>,
        freed: Arc<AtomicBool>,
    }
    impl Drop for Canary {
        fn drop(&mut self) {
            let ok = self.posted.load(Ordering::SeqCst) && self.buf.iter().all(|&b| b == 0xc5);
            self.freed_ok.store(ok, Ordering::SeqCst);
            self.freed.store(true, Ordering::SeqCst);
        }
    }

    /// A backend that completes long after its queue closed (a foreign
    /// thread writes the read data into the parked buffer, then posts):
    /// the buffer is not freed before that write (canary checked on drop;
    /// under Miri a use after free is reported), it is freed soon after the
    /// completion (the post wakes the owner's wake-up eventfd), and the
    /// parked-memory accounting goes back down.
    #[test]
    fn late_completion_after_close_never_frees_early() {
        const BYTES: usize = 1 << 20;
        let delay = Duration::from_millis(if cfg!(miri) { 5 } else { 350 });
        let (posted, freed_ok, freed) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let mut buf = vec![0u8; if cfg!(miri) { 4096 } else { BYTES }];
        let (ptr, len) = (buf.as_mut_ptr() as usize, buf.len());
        let sink = CompletionSink::new();
        let op = sink.clone(); // held by the operation in flight
        let tag = crate::IoTag {
            cid: 3,
            bytes: len as u32,
            write: false,
            nsid: 0,
        };
        let p2 = posted.clone();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            // SAFETY: the buffer is parked until `op` is dropped below.
            let b = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
            b.fill(0xc5);
            p2.store(true, Ordering::SeqCst);
            let at = Instant::now();
            CompletionSink::post_and_wake(op, tag, nvmf_wire::status::Status::SUCCESS);
            at
        });
        let canary = Canary {
            buf,
            posted: posted.clone(),
            freed_ok: freed_ok.clone(),
            freed: freed.clone(),
        };
        // The queue closes: its buffers are handed over, its sink dropped.
        park(sink, Box::new(canary), BYTES);
        assert_eq!(parked(), 1);
        assert!(parked_bytes() >= BYTES && parked_total() >= 1);
        let start = Instant::now();
        while !freed.load(Ordering::SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(15), "never freed");
            #[cfg(not(miri))]
            {
                let mut pfd = libc::pollfd {
                    fd: crate::wake::fd().unwrap(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd. A long timeout: only the
                // wake-up can end the wait soon after the completion.
                unsafe { libc::poll(&mut pfd, 1, 3000) };
                crate::wake::clear();
            }
            #[cfg(miri)]
            std::thread::sleep(Duration::from_millis(1));
            reap();
        }
        #[cfg(not(miri))]
        let freed_at = Instant::now();
        assert!(
            freed_ok.load(Ordering::SeqCst),
            "freed before the backend's late write"
        );
        assert!(start.elapsed() >= delay, "freed before the completion");
        assert_eq!(parked(), 0);
        assert!(parked_bytes() < BYTES, "parked memory not returned");
        let posted_at = writer.join().unwrap();
        #[cfg(not(miri))]
        assert!(
            // Without the wake-up the owner sleeps out its 3 s poll; the
            // bound leaves room for a loaded 2-core CI machine's
            // scheduling delays (300 ms seen).
            freed_at.saturating_duration_since(posted_at) < Duration::from_millis(1000),
            "freed {:?} after the completion: the post did not wake the owner",
            freed_at.saturating_duration_since(posted_at)
        );
    }
}
