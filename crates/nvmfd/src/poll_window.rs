//! Adaptive polling: how long a reactor keeps polling its sockets (epoll
//! with a zero timeout) after a loop turn that did work, before it blocks in
//! the kernel. Owns that decision and nothing else; `reactor.rs` asks it
//! after every working turn and tells it how long each idle stretch lasted.
//!
//! Polling trades CPU for latency: it saves the wake-up of a sleeping thread
//! (a few to tens of microseconds) when the next event comes soon, and burns
//! the core while waiting. It pays only while it finds work, so two rules
//! decide (docs/DESIGN.md, "Adaptive polling"):
//!
//! 1. **Nothing to poll for.** When every command the reactor holds is
//!    executing in a backend (librbd, io_uring, the helper pool), and no
//!    connection waits for the rest of a PDU or for H2C data, the reactor
//!    does not poll at all: a backend's completion wakes it through its
//!    eventfd however it waits, and the hosts have nothing to send until
//!    they get an answer. This is the RBD gateway's usual state: polling
//!    there only took CPU from librbd and the OSDs.
//! 2. **The window follows the gaps** (the rule of Linux's haltpoll cpuidle
//!    governor). Each idle stretch (from the end of a working turn to the
//!    event that ends it) adjusts the window: a stretch longer than the
//!    window but within the cap (`--poll-us`) means a longer window would
//!    have caught it: the window grows (doubled, at least
//!    [`GROW_START`]); a stretch longer than the cap means even the longest
//!    window would have polled in vain: it halves (below 1 µs: 0, the
//!    reactor sleeps at once). A stretch within the window leaves it as it
//!    is. So a host that keeps the reactor busy keeps the full window, and
//!    a trickle of I/O with long gaps ends up with none.
//!
//! `--poll-us` is the cap; 0 turns polling off altogether.

use std::time::Duration;

/// Smallest window after a grow: a grow from 0 starts here (or at the cap,
/// if that is smaller).
pub const GROW_START: Duration = Duration::from_micros(10);

/// A window shrunk below this is 0.
const FLOOR: Duration = Duration::from_micros(1);

/// One reactor's polling window.
#[derive(Debug, Clone)]
pub struct PollWindow {
    cap: Duration,
    cur: Duration,
    /// Working turns after which rule 1 said not to poll.
    skipped_backend: u64,
}

/// What a reactor holds when a working turn ends, as far as polling goes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// Commands executing in a backend (their completion wakes the reactor).
    pub in_backends: usize,
    /// Something only the hosts or polling can move on: commands not in a
    /// backend (waiting for H2C data, a buffer, or their answer to leave),
    /// a partial PDU, RDMA queues (their CQs are polled).
    pub other: bool,
}

impl Holding {
    /// Adds one TCP connection's state.
    pub fn add(&mut self, in_flight: usize, in_backend: usize, partial_input: bool) {
        self.in_backends += in_backend;
        self.other |= partial_input || in_flight > in_backend;
    }

    /// Rule 1: all the reactor waits for is backends, which wake it.
    pub fn backends_only(&self) -> bool {
        self.in_backends > 0 && !self.other
    }
}

impl PollWindow {
    /// A window capped at `cap` (`--poll-us`), starting at the cap.
    pub fn new(cap: Duration) -> PollWindow {
        PollWindow {
            cap,
            cur: cap,
            skipped_backend: 0,
        }
    }

    /// The window now.
    pub fn current(&self) -> Duration {
        self.cur
    }

    /// Working turns after which the reactor slept at once because it held
    /// only backend work (rule 1).
    pub fn skipped_backend(&self) -> u64 {
        self.skipped_backend
    }

    /// How long to poll after a working turn that leaves `held` behind
    /// (None: block in epoll now).
    pub fn after_work(&mut self, held: Holding) -> Option<Duration> {
        if self.cur.is_zero() {
            return None;
        }
        if held.backends_only() {
            self.skipped_backend += 1;
            return None;
        }
        Some(self.cur)
    }

    /// An idle stretch of `idle` ended with an event: rule 2.
    pub fn idle_ended(&mut self, idle: Duration) {
        if self.cap.is_zero() {
            return;
        }
        if idle > self.cap {
            let half = self.cur / 2;
            self.cur = if half < FLOOR { Duration::ZERO } else { half };
        } else if idle > self.cur {
            self.cur = (self.cur * 2).max(GROW_START).min(self.cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    fn busy(n: usize) -> Holding {
        let mut h = Holding::default();
        h.add(n, 0, false);
        h
    }

    #[test]
    fn starts_at_the_cap_and_zero_cap_never_polls() {
        let mut w = PollWindow::new(50 * US);
        assert_eq!(w.after_work(Holding::default()), Some(50 * US));
        let mut off = PollWindow::new(Duration::ZERO);
        off.idle_ended(3 * US);
        assert_eq!(off.after_work(busy(1)), None);
        assert_eq!(off.current(), Duration::ZERO);
    }

    #[test]
    fn gaps_within_the_window_keep_it() {
        let mut w = PollWindow::new(50 * US);
        for _ in 0..1000 {
            w.idle_ended(20 * US);
        }
        assert_eq!(w.current(), 50 * US);
    }

    #[test]
    fn long_gaps_shrink_it_to_zero_and_short_ones_grow_it_back() {
        let mut w = PollWindow::new(50 * US);
        // Gaps of 1 ms (a slow trickle of I/O): 50, 25, 12.5, ... 0.
        let mut steps = 0;
        while !w.current().is_zero() {
            w.idle_ended(1000 * US);
            steps += 1;
            assert!(steps < 20, "never reached 0: {:?}", w.current());
        }
        assert_eq!(w.after_work(busy(1)), None, "a zero window must not poll");
        // The load comes back: gaps of 30 µs, which the cap would catch.
        w.idle_ended(30 * US);
        assert_eq!(w.current(), GROW_START);
        w.idle_ended(30 * US);
        assert_eq!(w.current(), 20 * US);
        w.idle_ended(30 * US);
        assert_eq!(w.current(), 40 * US);
        // 30 µs < 40 µs: caught, unchanged.
        w.idle_ended(30 * US);
        assert_eq!(w.current(), 40 * US);
        w.idle_ended(45 * US);
        assert_eq!(w.current(), 50 * US, "never above the cap");
    }

    #[test]
    fn a_cap_below_grow_start_is_respected() {
        let mut w = PollWindow::new(4 * US);
        w.idle_ended(Duration::from_millis(5));
        w.idle_ended(Duration::from_millis(5));
        w.idle_ended(Duration::from_millis(5));
        assert_eq!(w.current(), Duration::ZERO);
        w.idle_ended(3 * US);
        assert_eq!(w.current(), 4 * US);
    }

    #[test]
    fn backend_only_work_does_not_poll() {
        let mut w = PollWindow::new(50 * US);
        let mut rbd = Holding::default();
        rbd.add(128, 128, false);
        assert!(rbd.backends_only());
        assert_eq!(w.after_work(rbd), None);
        assert_eq!(w.skipped_backend(), 1);
        // One command waiting for its H2C data: the host will send it.
        let mut h2c = rbd;
        h2c.add(1, 0, false);
        assert_eq!(w.after_work(h2c), Some(50 * US));
        // The rest of a PDU on its way.
        let mut partial = rbd;
        partial.add(0, 0, true);
        assert_eq!(w.after_work(partial), Some(50 * US));
        // Nothing held at all: the host's next command is what comes.
        assert_eq!(w.after_work(Holding::default()), Some(50 * US));
        assert_eq!(w.skipped_backend(), 1);
    }
}
