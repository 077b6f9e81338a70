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

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::CompletionSink;

/// Age after which parked buffers are reported (and the report interval).
pub const PARKED_WARN: Duration = Duration::from_secs(30);

struct Parked {
    sink: Arc<CompletionSink>,
    _keep: Box<dyn Any>,
    since: Instant,
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

/// Keeps `keep` alive on this thread until no operation holds `sink` any
/// more (dropped at once when none does).
pub fn park(sink: Arc<CompletionSink>, keep: Box<dyn Any>) {
    if Arc::strong_count(&sink) <= 1 {
        return;
    }
    PARKED.with(|p| {
        let p = &mut p.borrow_mut().0;
        p.push(Parked {
            sink,
            _keep: keep,
            since: Instant::now(),
        });
        COUNT.with(|c| c.set(p.len()));
    });
}

/// Entries parked on this thread.
pub fn parked() -> usize {
    COUNT.with(Cell::get)
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
        p.retain(|e| Arc::strong_count(&e.sink) > 1);
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
        park(sink, Box::new(Flag(freed.clone())));
        assert_eq!(parked(), 1);
        assert_eq!(reap(), 1);
        assert!(!freed.load(Ordering::SeqCst), "freed while in use");
        drop(op);
        assert_eq!(reap(), 0);
        assert!(freed.load(Ordering::SeqCst), "never freed");

        // Nothing in flight: dropped at once.
        let freed2 = Arc::new(AtomicBool::new(false));
        park(CompletionSink::new(), Box::new(Flag(freed2.clone())));
        assert!(freed2.load(Ordering::SeqCst));
        assert_eq!(parked(), 0);
    }

    /// Entries parked past PARKED_WARN are reported, at most once per
    /// PARKED_WARN.
    #[test]
    fn long_parked_entries_are_reported_rate_limited() {
        let sink = CompletionSink::new();
        let op = sink.clone();
        park(sink, Box::new(()));
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
}
