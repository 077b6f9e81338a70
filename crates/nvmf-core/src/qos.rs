//! QoS rate limits per bdev (SPDK's `bdev_set_qos_limit`; docs/QOS.md).
//!
//! Owns [`BdevQos`]: the live limits of one bdev and their token buckets,
//! shared (one `Arc`) by every namespace on that bdev and so by every queue
//! and reactor serving it, plus the thread-local count of commands parked
//! for QoS on this thread ([`parked_here`]) that tells a reactor to wake up
//! for the next time slice.
//!
//! Buckets: time runs in 1 ms slices. Each limit (rw I/Os, rw bytes, read
//! bytes, write bytes) has a signed budget, an atomic in the bdev's
//! `BdevQos`. The first command that sees a new slice starts it (one
//! compare-and-swap on the slice start) and refills every budget with one
//! slice's quota per slice elapsed (at most [`MAX_SLICES_BANKED`] of them,
//! so an idle bdev does not bank a burst), after dropping what was left
//! unused and keeping any overdraft. A Read or Write is admitted when every
//! budget that applies to it is above zero; it then takes its cost from each
//! (1 I/O; its bytes), which may overdraw: the overdraft is paid back from
//! the next slices, so the long-run rate is exact whatever the I/O size.
//! Everything is relaxed atomics on the bdev's own cache lines: no lock,
//! and no thread that must run for others to progress (any reactor with a
//! waiting command starts the next slice itself).
//!
//! Cost: with no limit on any bdev of the process, an I/O pays one relaxed
//! load ([`any_active`]); with limits somewhere, a bdev without limits costs
//! a relaxed load of its own flag; a limited one a clock read and a few
//! atomic adds per command.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nvmf_config::QosLimits;

/// Length of one time slice (SPDK's QoS time slice, 1 ms).
pub const TIMESLICE: Duration = Duration::from_millis(1);
const TIMESLICE_NS: u64 = 1_000_000;
/// Most slices of quota one refill grants (after an idle stretch, or when
/// no waiting reactor woke up in time: epoll's timeout has millisecond
/// granularity). Bounds the burst an idle bdev may take to 8 ms of quota.
pub const MAX_SLICES_BANKED: u64 = 8;
/// Smallest quota of a slice: 1 I/O, 512 bytes (SPDK's minimums).
const MIN_IOS_PER_SLICE: i64 = 1;
const MIN_BYTES_PER_SLICE: i64 = 512;

/// The four limits, in SPDK's order.
const RW_IOS: usize = 0;
const RW_BYTES: usize = 1;
const R_BYTES: usize = 2;
const W_BYTES: usize = 3;

/// Bdevs with at least one limit, in the whole process: 0 lets every I/O
/// skip QoS with one relaxed load.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Commands parked for QoS by the queues of this thread.
    static PARKED: Cell<usize> = const { Cell::new(0) };
}

/// Whether any bdev of this process has a limit (one relaxed load).
#[inline]
pub fn any_active() -> bool {
    ACTIVE.load(Relaxed) != 0
}

/// Commands parked for QoS on this thread's queues: while not zero, the
/// thread must poll its queues with executing commands once per
/// [`TIMESLICE`] (nvmfd's reactor does), since nothing else wakes it when
/// tokens come back.
#[inline]
pub fn parked_here() -> usize {
    PARKED.with(Cell::get)
}

pub(crate) fn park_here(n: usize) {
    PARKED.with(|p| p.set(p.get() + n));
}

pub(crate) fn unpark_here(n: usize) {
    PARKED.with(|p| p.set(p.get().saturating_sub(n)));
}

/// Monotonic nanoseconds since the first call in this process.
#[inline]
pub fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    // The base is before any caller's now, and 2^64 ns is 584 years.
    Instant::now().saturating_duration_since(base).as_nanos() as u64 + TIMESLICE_NS
}

/// One bdev's QoS state (see the module documentation).
#[derive(Debug, Default)]
pub struct BdevQos {
    /// At least one limit is set.
    active: AtomicBool,
    /// The limits per second as set (I/Os, bytes, bytes, bytes; 0: off).
    per_sec: [AtomicU64; 4],
    /// Quota of one slice (0: that limit is off).
    per_slice: [AtomicI64; 4],
    /// What is left of the current slice (negative: overdrawn).
    remaining: [AtomicI64; 4],
    /// Start of the current slice (`now_ns`).
    slice_start: AtomicU64,
    /// Commands that had to wait (counted once each).
    throttled: AtomicU64,
}

impl Drop for BdevQos {
    fn drop(&mut self) {
        if *self.active.get_mut() {
            ACTIVE.fetch_sub(1, Relaxed);
        }
    }
}

impl BdevQos {
    /// A bdev without limits.
    pub fn new() -> BdevQos {
        BdevQos::default()
    }

    /// Sets the limits (live: queues see them with their next command;
    /// commands waiting are tried again on the next slice). All zero turns
    /// QoS off for this bdev.
    pub fn set_limits(&self, l: &QosLimits) {
        let (rw_b, r_b, w_b) = l.bytes_per_sec();
        let values = [l.rw_ios_per_sec, rw_b, r_b, w_b];
        let now = now_ns();
        self.slice_start.store(now, Relaxed);
        for (k, &v) in values.iter().enumerate() {
            let min = if k == RW_IOS {
                MIN_IOS_PER_SLICE
            } else {
                MIN_BYTES_PER_SLICE
            };
            let per = per_slice(v, min);
            self.per_sec[k].store(v, Relaxed);
            self.per_slice[k].store(per, Relaxed);
            self.remaining[k].store(per, Relaxed);
        }
        let on = !l.is_unlimited();
        if self.active.swap(on, Relaxed) != on {
            if on {
                ACTIVE.fetch_add(1, Relaxed);
            } else {
                ACTIVE.fetch_sub(1, Relaxed);
            }
        }
    }

    /// The limits as set: (rw I/Os, rw bytes, read bytes, write bytes) per
    /// second, 0 = off.
    pub fn limits_per_sec(&self) -> [u64; 4] {
        std::array::from_fn(|k| self.per_sec[k].load(Relaxed))
    }

    /// At least one limit is set (one relaxed load).
    #[inline]
    pub fn is_active(&self) -> bool {
        self.active.load(Relaxed)
    }

    /// Commands that had to wait for this bdev's tokens since it was made.
    pub fn throttled(&self) -> u64 {
        self.throttled.load(Relaxed)
    }

    pub(crate) fn count_throttled(&self) {
        self.throttled.fetch_add(1, Relaxed);
    }

    /// May a Read (`write` false) or Write of `bytes` start at `now`
    /// (`now_ns`)? Yes takes its tokens (possibly overdrawing); no leaves
    /// everything as it was, and the caller tries again later.
    pub fn admit(&self, write: bool, bytes: u64, now: u64) -> bool {
        if !self.is_active() {
            return true;
        }
        self.refill(now);
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        let cost = |k: usize| -> i64 {
            match k {
                RW_IOS => 1,
                RW_BYTES => bytes,
                R_BYTES if !write => bytes,
                W_BYTES if write => bytes,
                _ => 0,
            }
        };
        for k in 0..4 {
            if cost(k) > 0
                && self.per_slice[k].load(Relaxed) > 0
                && self.remaining[k].load(Relaxed) <= 0
            {
                return false;
            }
        }
        for k in 0..4 {
            if cost(k) > 0 && self.per_slice[k].load(Relaxed) > 0 {
                self.remaining[k].fetch_sub(cost(k), Relaxed);
            }
        }
        true
    }

    /// Starts the slice `now` falls in if it is not the current one: one
    /// thread wins the compare-and-swap and refills.
    #[inline]
    fn refill(&self, now: u64) {
        let start = self.slice_start.load(Relaxed);
        let elapsed = now.saturating_sub(start);
        if elapsed < TIMESLICE_NS {
            return;
        }
        let slices = elapsed / TIMESLICE_NS;
        let next = start + slices * TIMESLICE_NS;
        if self
            .slice_start
            .compare_exchange(start, next, Relaxed, Relaxed)
            .is_err()
        {
            return;
        }
        let slices = slices.min(MAX_SLICES_BANKED) as i64;
        for k in 0..4 {
            let per = self.per_slice[k].load(Relaxed);
            if per == 0 {
                continue;
            }
            // Unused quota is dropped, an overdraft is kept.
            let _ = self.remaining[k].fetch_update(Relaxed, Relaxed, |r| {
                Some(r.min(0).saturating_add(per.saturating_mul(slices)))
            });
        }
    }
}

/// One slice's quota of a limit of `v` per second (0: off), at least `min`.
fn per_slice(v: u64, min: i64) -> i64 {
    if v == 0 {
        return 0;
    }
    let q = u128::from(v) * u128::from(TIMESLICE_NS) / 1_000_000_000;
    i64::try_from(q).unwrap_or(i64::MAX).max(min)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(ios: u64, rw: u64, r: u64, w: u64) -> QosLimits {
        QosLimits {
            rw_ios_per_sec: ios,
            rw_mbytes_per_sec: rw,
            r_mbytes_per_sec: r,
            w_mbytes_per_sec: w,
        }
    }

    /// Admits as many 4 KiB commands as it can every `step_ns` for
    /// `total_ns` (the clock is simulated): the count admitted.
    fn drive(
        q: &BdevQos,
        write: impl Fn(u64) -> bool,
        bytes: u64,
        step_ns: u64,
        total_ns: u64,
    ) -> u64 {
        let start = q.slice_start.load(Relaxed);
        let mut n = 0;
        let mut t = start;
        let mut i = 0;
        while t < start + total_ns {
            while q.admit(write(i), bytes, t) {
                n += 1;
                i += 1;
            }
            t += step_ns;
        }
        n
    }

    #[test]
    fn per_slice_quota_and_minimums() {
        assert_eq!(per_slice(0, 1), 0);
        assert_eq!(per_slice(5000, 1), 5);
        assert_eq!(per_slice(1000, 1), 1);
        assert_eq!(per_slice(500, 1), 1, "at least one I/O a slice");
        assert_eq!(per_slice(10 << 20, 512), 10485);
        assert_eq!(per_slice(100_000, 512), 512, "at least 512 bytes a slice");
        assert_eq!(per_slice(u64::MAX, 1), 18_446_744_073_709_551);
    }

    #[test]
    fn iops_limit_is_exact_over_a_second() {
        let q = BdevQos::new();
        q.set_limits(&limits(5000, 0, 0, 0));
        // A reactor polling every 1 ms and one that wakes late (every 3 ms).
        for step in [TIMESLICE_NS, 3 * TIMESLICE_NS] {
            q.set_limits(&limits(5000, 0, 0, 0));
            let n = drive(&q, |_| false, 4096, step, 1_000_000_000);
            assert!((5000..=5010).contains(&n), "step {step}: {n} admitted");
        }
    }

    #[test]
    fn byte_limits_count_reads_and_writes_apart() {
        // 8 MiB/s of writes only: reads pass freely, writes are held.
        let q = BdevQos::new();
        q.set_limits(&limits(0, 0, 0, 8));
        let w = drive(&q, |_| true, 128 << 10, TIMESLICE_NS, 1_000_000_000);
        assert!(
            (64..=65).contains(&w),
            "{w} writes of 128 KiB in 1 s at 8 MiB/s"
        );
        let t = q.slice_start.load(Relaxed);
        for _ in 0..10_000 {
            assert!(q.admit(false, 128 << 10, t), "reads are not limited");
        }
        // rw bytes: reads and writes share 4 MiB/s.
        let q = BdevQos::new();
        q.set_limits(&limits(0, 4, 0, 0));
        let n = drive(&q, |i| i % 2 == 0, 64 << 10, TIMESLICE_NS, 1_000_000_000);
        assert!((64..=65).contains(&n), "{n} commands of 64 KiB at 4 MiB/s");
    }

    #[test]
    fn large_commands_overdraw_and_pay_back() {
        // 1 MiB/s, 1 MiB commands: one a second on average, not one a slice.
        let q = BdevQos::new();
        q.set_limits(&limits(0, 1, 0, 0));
        let n = drive(&q, |_| false, 1 << 20, TIMESLICE_NS, 3_000_000_000);
        assert!((3..=4).contains(&n), "{n}");
    }

    #[test]
    fn idle_bdev_banks_at_most_a_few_slices() {
        let q = BdevQos::new();
        q.set_limits(&limits(10_000, 0, 0, 0));
        let t0 = q.slice_start.load(Relaxed);
        // Nothing for 10 s, then a burst: at most MAX_SLICES_BANKED slices.
        let t = t0 + 10_000_000_000;
        let mut n = 0;
        while q.admit(false, 512, t) {
            n += 1;
        }
        assert_eq!(n, 10 * MAX_SLICES_BANKED);
    }

    #[test]
    fn zero_turns_off_and_counts_active_bdevs() {
        let q = BdevQos::new();
        assert!(!q.is_active());
        q.set_limits(&limits(1000, 0, 0, 0));
        assert!(q.is_active() && any_active());
        assert_eq!(q.limits_per_sec(), [1000, 0, 0, 0]);
        let t = q.slice_start.load(Relaxed);
        assert!(q.admit(true, 4096, t));
        assert!(!q.admit(true, 4096, t), "one a slice at 1000/s");
        q.set_limits(&QosLimits::default());
        assert!(!q.is_active());
        assert!(q.admit(true, 4096, t), "off: everything passes");
    }
}
