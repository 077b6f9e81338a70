//! Always-on per-queue I/O statistics: latency histograms, per-namespace
//! counters and errors by status.
//!
//! Owns [`Histogram`] (fixed-size log-linear latency buckets), [`NsStats`]
//! (one namespace's reads, writes, bytes, errors and read/write latency as
//! seen by one queue), [`ErrorTable`] (error completions by status code) and
//! the clock [`now_ns`]. Everything here is plain integers owned by the one
//! thread that owns the queue pair: recording is a few adds and one array
//! index, no atomics, no locks, no allocation (a queue's per-namespace table
//! grows once per namespace it sees, never per I/O). The control plane reads
//! copies (reactor snapshots) and adds them up.
//!
//! The `stats-off` feature (for measuring what the statistics cost, never
//! for production) turns the clock reads and the recording into no-ops.

/// Statistics are recorded (false only in a `stats-off` measurement build).
pub const ENABLED: bool = !cfg!(feature = "stats-off");

/// Monotonic clock in nanoseconds (CLOCK_MONOTONIC through the vDSO, the
/// clock `Instant` uses). 0 when statistics are off.
#[inline]
pub fn now_ns() -> u64 {
    if !ENABLED {
        return 0;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Sub-buckets per power of two (4: each bucket spans at most 25 % of its
/// lower bound, so a quantile read from the buckets is within 25 %).
const SUB: usize = 4;
/// Values below 2^FIRST_OCTAVE ns (1024 ns) go to 256 ns linear buckets.
const FIRST_OCTAVE: u32 = 10;
/// Highest octave with its own buckets: 2^36 ns ≈ 68.7 s; above goes to the
/// last bucket.
const LAST_OCTAVE: u32 = 36;
/// Number of buckets.
pub const HIST_BUCKETS: usize = SUB + (LAST_OCTAVE - FIRST_OCTAVE + 1) as usize * SUB;

/// Latency histogram: log-linear buckets in nanoseconds (256 ns steps below
/// 1 µs, then 4 buckets per power of two up to ~137 s), count and sum.
/// 912 bytes, recording is branch-light integer arithmetic.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Histogram {
    counts: [u64; HIST_BUCKETS],
    count: u64,
    sum_ns: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            counts: [0; HIST_BUCKETS],
            count: 0,
            sum_ns: 0,
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count)
            .field("sum_ns", &self.sum_ns)
            .finish_non_exhaustive()
    }
}

/// Bucket of a value in nanoseconds.
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    if ns < (1 << FIRST_OCTAVE) {
        return (ns >> (FIRST_OCTAVE - 2)) as usize;
    }
    let octave = 63 - ns.leading_zeros(); // ≥ FIRST_OCTAVE
    if octave > LAST_OCTAVE {
        return HIST_BUCKETS - 1;
    }
    let sub = ((ns >> (octave - 2)) & 3) as usize;
    SUB + (octave - FIRST_OCTAVE) as usize * SUB + sub
}

/// Exclusive upper bound of bucket `i` in nanoseconds (the last bucket
/// also holds everything above it).
pub fn bucket_upper_ns(i: usize) -> u64 {
    if i < SUB {
        return ((i + 1) as u64) << (FIRST_OCTAVE - 2);
    }
    let octave = FIRST_OCTAVE + ((i - SUB) / SUB) as u32;
    let sub = ((i - SUB) % SUB) as u64;
    (SUB as u64 + sub + 1) << (octave - 2)
}

impl Histogram {
    /// Records one value.
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts[bucket_of(ns)] += 1;
        self.count += 1;
        self.sum_ns = self.sum_ns.wrapping_add(ns);
    }

    pub fn add(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.count += o.count;
        self.sum_ns = self.sum_ns.wrapping_add(o.sum_ns);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the values (ns).
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns
    }

    /// Count per bucket (see [`bucket_upper_ns`]).
    pub fn buckets(&self) -> &[u64; HIST_BUCKETS] {
        &self.counts
    }

    /// The difference `self - earlier` (both from the same queue(s), taken
    /// in that order): the values recorded in between.
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let mut h = *self;
        for (a, b) in h.counts.iter_mut().zip(earlier.counts.iter()) {
            *a = a.saturating_sub(*b);
        }
        h.count = h.count.saturating_sub(earlier.count);
        h.sum_ns = h.sum_ns.wrapping_sub(earlier.sum_ns);
        h
    }

    /// Upper bound (ns) of the bucket holding quantile `q` (0..=1); 0 when
    /// empty.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        quantile_of(&self.counts, self.count, q)
    }
}

/// Upper bound (ns) of the bucket holding quantile `q` of `counts` (which
/// hold `total` values); 0 when empty.
pub fn quantile_of(counts: &[u64], total: u64, q: f64) -> u64 {
    if total == 0 {
        return 0;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    for (i, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= rank {
            return bucket_upper_ns(i);
        }
    }
    bucket_upper_ns(counts.len() - 1)
}

/// One namespace's I/O as one queue saw it. Reads and Writes only (Flush,
/// Write Zeroes, Dataset Management count in the queue's commands).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsStats {
    pub nsid: u32,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Reads and Writes that completed with an error status.
    pub errors: u64,
    /// Capsule received → response queued, successful and failed alike.
    pub read_latency: Histogram,
    pub write_latency: Histogram,
}

impl NsStats {
    pub fn new(nsid: u32) -> NsStats {
        NsStats {
            nsid,
            ..Default::default()
        }
    }

    pub fn add(&mut self, o: &NsStats) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.errors += o.errors;
        self.read_latency.add(&o.read_latency);
        self.write_latency.add(&o.write_latency);
    }
}

/// Most namespaces one queue keeps apart; I/O to further namespaces is
/// counted under NSID 0 ("other").
pub const NS_PER_QUEUE: usize = 32;

/// Per-namespace statistics of one queue: a short list searched linearly
/// (a queue usually talks to one or a few namespaces; the last one used is
/// tried first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsTable {
    entries: Vec<NsStats>,
    last: usize,
}

impl NsTable {
    /// The entry of `nsid` (created on first use: an allocation once per
    /// namespace, not per I/O).
    #[inline]
    pub fn entry(&mut self, nsid: u32) -> &mut NsStats {
        if self.entries.get(self.last).is_some_and(|e| e.nsid == nsid) {
            return &mut self.entries[self.last];
        }
        let i = match self.entries.iter().position(|e| e.nsid == nsid) {
            Some(i) => i,
            None => self.insert_cold(nsid),
        };
        self.last = i;
        &mut self.entries[i]
    }

    #[cold]
    fn insert_cold(&mut self, nsid: u32) -> usize {
        let nsid = if self.entries.len() >= NS_PER_QUEUE {
            0
        } else {
            nsid
        };
        if let Some(i) = self.entries.iter().position(|e| e.nsid == nsid) {
            return i;
        }
        self.entries.push(NsStats::new(nsid));
        self.entries.len() - 1
    }

    pub fn iter(&self) -> impl Iterator<Item = &NsStats> {
        self.entries.iter()
    }

    /// Adds `o`'s entries to this table's (by NSID).
    pub fn add(&mut self, o: &NsTable) {
        for e in &o.entries {
            match self.entries.iter_mut().find(|x| x.nsid == e.nsid) {
                Some(x) => x.add(e),
                None => self.entries.push(e.clone()),
            }
        }
    }

    /// Records one completed Read or Write.
    #[inline]
    pub fn record(&mut self, nsid: u32, write: bool, bytes: u64, ok: bool, latency_ns: u64) {
        if !ENABLED {
            return;
        }
        let e = self.entry(nsid);
        if write {
            e.writes += 1;
            e.write_latency.record(latency_ns);
            if ok {
                e.bytes_written += bytes;
            }
        } else {
            e.reads += 1;
            e.read_latency.record(latency_ns);
            if ok {
                e.bytes_read += bytes;
            }
        }
        if !ok {
            e.errors += 1;
        }
    }
}

/// Distinct statuses an [`ErrorTable`] keeps apart; more are counted in
/// `other`.
pub const ERROR_KINDS: usize = 8;

/// Error completions by status (SCT, SC), fixed size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErrorTable {
    /// (SCT << 8 | SC, count); count 0 = unused.
    entries: [(u16, u64); ERROR_KINDS],
    /// Errors of statuses beyond the first `ERROR_KINDS` seen.
    pub other: u64,
}

impl ErrorTable {
    /// Counts one error completion with status `sct`/`sc`.
    #[inline]
    pub fn record(&mut self, sct: u8, sc: u8) {
        let key = u16::from(sct) << 8 | u16::from(sc);
        for e in self.entries.iter_mut() {
            if e.1 == 0 {
                *e = (key, 1);
                return;
            }
            if e.0 == key {
                e.1 += 1;
                return;
            }
        }
        self.other += 1;
    }

    pub fn add(&mut self, o: &ErrorTable) {
        for &(key, n) in o.entries.iter().filter(|e| e.1 != 0) {
            self.record_n(key, n);
        }
        self.other += o.other;
    }

    fn record_n(&mut self, key: u16, n: u64) {
        for e in self.entries.iter_mut() {
            if e.1 == 0 {
                *e = (key, n);
                return;
            }
            if e.0 == key {
                e.1 += n;
                return;
            }
        }
        self.other += n;
    }

    /// (SCT, SC, count) of each status seen.
    pub fn iter(&self) -> impl Iterator<Item = (u8, u8, u64)> + '_ {
        self.entries
            .iter()
            .filter(|e| e.1 != 0)
            .map(|&(k, n)| ((k >> 8) as u8, k as u8, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut prev = 0;
        for i in 0..HIST_BUCKETS {
            let up = bucket_upper_ns(i);
            assert!(up > prev, "bucket {i} upper {up} <= {prev}");
            // The bucket's lower bound maps to it, and upper - 1 too.
            assert_eq!(bucket_of(prev), i, "lower bound of bucket {i}");
            assert_eq!(bucket_of(up - 1), i, "upper bound - 1 of bucket {i}");
            prev = up;
        }
        assert_eq!(bucket_of(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_a_bucket() {
        let mut h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000); // 1 µs .. 1 ms
        }
        let p50 = h.quantile_ns(0.5);
        let p99 = h.quantile_ns(0.99);
        assert!((500_000..=625_000).contains(&p50), "p50 {p50}");
        assert!((990_000..=1_250_000).contains(&p99), "p99 {p99}");
        assert_eq!(h.count(), 1000);
        assert_eq!(h.sum_ns(), 500_500_000);
        let d = h.since(&Histogram::default());
        assert_eq!(d, h);
    }

    #[test]
    fn error_table_keeps_statuses_apart() {
        let mut t = ErrorTable::default();
        t.record(0, 0x80);
        t.record(0, 0x80);
        t.record(1, 0x82);
        let v: Vec<_> = t.iter().collect();
        assert_eq!(v, vec![(0, 0x80, 2), (1, 0x82, 1)]);
        for sc in 0..20 {
            t.record(2, sc);
        }
        assert_eq!(t.iter().count(), ERROR_KINDS);
        assert_eq!(t.other, 20 - (ERROR_KINDS as u64 - 2));
    }

    #[test]
    fn ns_table_counts_per_namespace() {
        let mut t = NsTable::default();
        t.record(1, false, 4096, true, 5_000);
        t.record(2, true, 8192, true, 7_000);
        t.record(1, true, 512, false, 9_000);
        let v: Vec<_> = t.iter().cloned().collect();
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].nsid, v[0].reads, v[0].writes), (1, 1, 1));
        assert_eq!(
            (v[0].bytes_read, v[0].bytes_written, v[0].errors),
            (4096, 0, 1)
        );
        assert_eq!((v[1].nsid, v[1].writes, v[1].bytes_written), (2, 1, 8192));
        assert_eq!(v[1].write_latency.count(), 1);
    }
}
