//! perf.rs — the load generator behind `nvmf perf`: connects a controller,
//! opens N I/O queues, runs a fixed-time workload (read, write, random or
//! sequential, or a read/write mix) with one thread per core, each thread
//! driving its queues with pipelined submissions, and reports IOPS,
//! bandwidth and latency percentiles (HdrHistogram) per queue and in total,
//! as text or fio-style JSON. With `verify`, every written block carries its
//! LBA and a generation tag, reads are checked against what was last
//! written, and all written blocks are read back and checked at the end.
//!
//! Per I/O there is no allocation and no lock: slots are reused, latency
//! goes into preallocated histograms, random LBAs come from a xorshift PRNG,
//! and progress counters are per-thread relaxed atomics.
//!
//! Waiting: a thread busy-polls its sockets (non-blocking reads) while
//! completions keep coming, for up to `poll_us` without one, and only then
//! sleeps in poll(2) — like spdk_nvme_perf, which always polls, but an
//! initiator whose target stalls does not burn its core forever.

use crate::controller::{ConnectOptions, Controller};
use crate::error::{Error, Result};
use crate::queue::{IoCompletion, IoQueue, Slot};
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Read,
    Write,
    RandRead,
    RandWrite,
    /// Sequential mix of reads and writes (`read_pct` reads).
    Rw,
    /// Random mix of reads and writes (`read_pct` reads).
    RandRw,
}

impl Workload {
    pub fn parse(s: &str) -> Option<Workload> {
        Some(match s {
            "read" => Workload::Read,
            "write" => Workload::Write,
            "randread" => Workload::RandRead,
            "randwrite" => Workload::RandWrite,
            "rw" | "readwrite" => Workload::Rw,
            "randrw" => Workload::RandRw,
            _ => return None,
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::RandRead => "randread",
            Workload::RandWrite => "randwrite",
            Workload::Rw => "rw",
            Workload::RandRw => "randrw",
        }
    }
    pub fn is_random(self) -> bool {
        matches!(
            self,
            Workload::RandRead | Workload::RandWrite | Workload::RandRw
        )
    }
    /// Percentage of reads given the mix setting.
    pub fn read_pct(self, mix: u32) -> u32 {
        match self {
            Workload::Read | Workload::RandRead => 100,
            Workload::Write | Workload::RandWrite => 0,
            Workload::Rw | Workload::RandRw => mix.min(100),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct PerfConfig {
    pub connect: ConnectOptions,
    pub nsid: u32,
    /// Outstanding I/Os per queue.
    pub queue_depth: u16,
    /// Bytes per I/O (a multiple of the block size).
    pub io_size: u32,
    pub workload: Workload,
    /// Reads in percent for the mixed workloads.
    pub read_pct: u32,
    pub duration: Duration,
    pub queues: u16,
    /// Pin one thread per listed CPU (queues spread round-robin); None: one
    /// unpinned thread per queue.
    pub cores: Option<Vec<usize>>,
    pub verify: bool,
    /// Override the in-capsule write limit (0 = every write uses R2T).
    pub in_capsule: Option<u32>,
    /// Print a progress line every second (to stdout).
    pub progress: bool,
    /// Busy-poll for up to this long without progress before sleeping in
    /// poll(2) (zero: sleep whenever there is nothing to do).
    pub poll: Duration,
}

/// Default busy-poll window of `nvmf perf` (`--poll-us`).
pub const DEFAULT_POLL_US: u64 = 1000;

impl PerfConfig {
    pub fn new(connect: ConnectOptions) -> PerfConfig {
        PerfConfig {
            connect,
            nsid: 1,
            queue_depth: 32,
            io_size: 4096,
            workload: Workload::RandRead,
            read_pct: 50,
            duration: Duration::from_secs(10),
            queues: 1,
            cores: None,
            verify: false,
            in_capsule: None,
            progress: false,
            poll: Duration::from_micros(DEFAULT_POLL_US),
        }
    }
}

/// Statistics of one direction (read or write) of one queue.
#[derive(Debug, Clone)]
pub struct DirStats {
    pub ios: u64,
    pub bytes: u64,
    pub sum_ns: u128,
    pub min_ns: u64,
    pub max_ns: u64,
    pub hist: Histogram<u64>,
}

impl DirStats {
    fn new() -> DirStats {
        DirStats {
            ios: 0,
            bytes: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            // 1 ns .. 1 hour, 3 significant digits.
            hist: Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"),
        }
    }
    #[inline]
    fn record(&mut self, bytes: u32, ns: u64) {
        self.ios += 1;
        self.bytes += bytes as u64;
        self.sum_ns += ns as u128;
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
        self.hist.saturating_record(ns.max(1));
    }
    fn merge(&mut self, o: &DirStats) {
        self.ios += o.ios;
        self.bytes += o.bytes;
        self.sum_ns += o.sum_ns;
        self.min_ns = self.min_ns.min(o.min_ns);
        self.max_ns = self.max_ns.max(o.max_ns);
        let _ = self.hist.add(&o.hist);
    }
    pub fn mean_ns(&self) -> f64 {
        if self.ios == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.ios as f64
        }
    }
    pub fn min(&self) -> u64 {
        if self.ios == 0 {
            0
        } else {
            self.min_ns
        }
    }
    pub fn iops(&self, secs: f64) -> f64 {
        if secs > 0.0 {
            self.ios as f64 / secs
        } else {
            0.0
        }
    }
    pub fn mib_s(&self, secs: f64) -> f64 {
        if secs > 0.0 {
            self.bytes as f64 / secs / (1024.0 * 1024.0)
        } else {
            0.0
        }
    }
    /// Latency at `q` percent (e.g. 99.9), in ns.
    pub fn percentile(&self, q: f64) -> u64 {
        if self.ios == 0 {
            0
        } else {
            self.hist.value_at_percentile(q)
        }
    }
}

/// One block whose content was not what was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub lba: u64,
    /// LBA and tag words found in the block (the tag is seed << 32 | generation).
    pub found_lba: u64,
    pub found_tag: u64,
    pub expected_tag: u64,
    /// First differing byte within the block.
    pub offset: usize,
}

/// Results of one queue.
#[derive(Debug, Clone)]
pub struct QueueReport {
    pub qid: u16,
    pub core: Option<usize>,
    pub read: DirStats,
    pub write: DirStats,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Blocks checked by verify (during the run and in the read-back).
    pub verified_blocks: u64,
    pub mismatched_blocks: u64,
    pub mismatches: Vec<Mismatch>,
    /// I/Os that were still outstanding when the drain timed out.
    pub lost: u64,
}

/// Results of a run.
#[derive(Debug, Clone)]
pub struct PerfReport {
    pub workload: Workload,
    pub io_size: u32,
    pub queue_depth: u16,
    pub read_pct: u32,
    pub nsid: u32,
    pub block_size: u32,
    pub ns_blocks: u64,
    pub in_capsule: u32,
    pub hdr_digest: bool,
    pub data_digest: bool,
    pub verify: bool,
    pub trid: String,
    pub runtime: Duration,
    pub queues: Vec<QueueReport>,
    /// Queue-level failures (a connection that died).
    pub failures: Vec<String>,
}

impl PerfReport {
    pub fn total_read(&self) -> DirStats {
        let mut t = DirStats::new();
        for q in &self.queues {
            t.merge(&q.read);
        }
        t
    }
    pub fn total_write(&self) -> DirStats {
        let mut t = DirStats::new();
        for q in &self.queues {
            t.merge(&q.write);
        }
        t
    }
    pub fn errors(&self) -> u64 {
        self.queues.iter().map(|q| q.errors + q.lost).sum::<u64>() + self.failures.len() as u64
    }
    pub fn mismatched_blocks(&self) -> u64 {
        self.queues.iter().map(|q| q.mismatched_blocks).sum()
    }
    pub fn verified_blocks(&self) -> u64 {
        self.queues.iter().map(|q| q.verified_blocks).sum()
    }
    /// True when there were no I/O errors, no lost I/O and no mismatches.
    pub fn ok(&self) -> bool {
        self.errors() == 0 && self.mismatched_blocks() == 0
    }
}

// ---------------------------------------------------------------------------
// PRNG and verify pattern
// ---------------------------------------------------------------------------

/// xorshift64* generator.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed | 1)
    }
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in 0..n (n > 0).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

#[inline]
fn pattern_seed(lba: u64, tag: u64) -> u64 {
    (lba.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ tag.rotate_left(23)) | 1
}

/// Fill one block: word 0 = LBA, word 1 = tag, the rest a stream derived
/// from both.
#[inline]
pub fn fill_block(b: &mut [u8], lba: u64, tag: u64) {
    let mut x = pattern_seed(lba, tag);
    for (k, w) in b.chunks_exact_mut(8).enumerate() {
        let v = match k {
            0 => lba,
            1 => tag,
            _ => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            }
        };
        w.copy_from_slice(&v.to_le_bytes());
    }
}

/// Check one block; None if it holds what `fill_block(lba, tag)` wrote.
#[inline]
pub fn check_block(b: &[u8], lba: u64, tag: u64) -> Option<Mismatch> {
    let mut x = pattern_seed(lba, tag);
    for (k, w) in b.chunks_exact(8).enumerate() {
        let v = match k {
            0 => lba,
            1 => tag,
            _ => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            }
        };
        let got = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        if got != v {
            let word = |i: usize| {
                b.get(i * 8..i * 8 + 8)
                    .map_or(0, |s| u64::from_le_bytes(s.try_into().expect("8")))
            };
            let diff = (got ^ v).trailing_zeros() as usize / 8;
            return Some(Mismatch {
                lba,
                found_lba: word(0),
                found_tag: word(1),
                expected_tag: tag,
                offset: k * 8 + diff,
            });
        }
    }
    None
}

// ---------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------

const OP_READ: u8 = 0;
const OP_WRITE: u8 = 1;
/// Read issued by the final verify read-back (not in the statistics).
const OP_READBACK: u8 = 2;
/// Generation value for "unknown" (a write failed).
const GEN_UNKNOWN: u32 = u32::MAX;
/// Most mismatches kept per queue for the report.
const KEEP_MISMATCHES: usize = 16;
/// Largest verify table per queue (units); larger regions are clipped.
const MAX_VERIFY_UNITS: u64 = 4 << 20;

struct Shared {
    /// Per thread: I/Os and bytes done so far (for the progress line).
    ios: Vec<PaddedCounter>,
    bytes: Vec<PaddedCounter>,
    stop: AtomicBool,
}

#[repr(align(64))]
struct PaddedCounter(AtomicU64);

struct QueueWorker {
    q: IoQueue,
    core: Option<usize>,
    nsid: u32,
    bs: u32,
    nlb: u32,
    io_size: u32,
    /// First unit (in I/O-size units) and unit count of this queue's region.
    first_unit: u64,
    units: u64,
    seq_next: u64,
    random: bool,
    read_pct: u32,
    rng: XorShift,
    /// Per slot: submit time (ns since `base`), op, unit.
    start_ns: Vec<u64>,
    op: Vec<u8>,
    unit: Vec<u64>,
    gen_of_slot: Vec<u32>,
    // verify state
    verify: bool,
    seed: u64,
    gens: Vec<u32>,
    busy: Vec<u64>,
    next_gen: u32,
    readback_next: u64,
    // results
    read: DirStats,
    write: DirStats,
    errors: u64,
    first_error: Option<String>,
    verified_blocks: u64,
    mismatched_blocks: u64,
    mismatches: Vec<Mismatch>,
}

impl QueueWorker {
    #[inline]
    fn is_busy(&self, u: u64) -> bool {
        self.busy[(u / 64) as usize] & (1 << (u % 64)) != 0
    }
    #[inline]
    fn set_busy(&mut self, u: u64, on: bool) {
        let w = &mut self.busy[(u / 64) as usize];
        if on {
            *w |= 1 << (u % 64);
        } else {
            *w &= !(1 << (u % 64));
        }
    }

    /// Choose the next unit; None if none is free (verify with a tiny region).
    #[inline]
    fn pick_unit(&mut self) -> Option<u64> {
        let mut u = if self.random {
            self.rng.below(self.units)
        } else {
            let u = self.seq_next;
            self.seq_next = if u + 1 >= self.units { 0 } else { u + 1 };
            u
        };
        if self.verify {
            let mut tries = 0;
            while self.is_busy(u) {
                tries += 1;
                if tries > 64 || tries as u64 >= self.units {
                    return None;
                }
                u = if u + 1 >= self.units { 0 } else { u + 1 };
            }
        }
        Some(u)
    }

    /// Start one I/O on `slot`; false if nothing could be started.
    #[inline]
    fn start_io(&mut self, slot: Slot, base: Instant) -> Result<bool> {
        let Some(u) = self.pick_unit() else {
            return Ok(false);
        };
        let is_read = match self.read_pct {
            100 => true,
            0 => false,
            p => (self.rng.below(100) as u32) < p,
        };
        let s = slot as usize;
        let lba = (self.first_unit + u) * self.nlb as u64;
        self.unit[s] = u;
        if self.verify {
            self.set_busy(u, true);
        }
        if is_read {
            self.op[s] = OP_READ;
            self.start_ns[s] = base.elapsed().as_nanos() as u64;
            self.q
                .submit_read(slot, self.nsid, lba, self.nlb, self.io_size)?;
        } else {
            self.op[s] = OP_WRITE;
            if self.verify {
                let gen = self.next_gen;
                self.next_gen = if gen + 1 == GEN_UNKNOWN { 1 } else { gen + 1 };
                self.gen_of_slot[s] = gen;
                let tag = (self.seed << 32) | gen as u64;
                let bs = self.bs as usize;
                let buf = &mut self.q.buf_mut(slot)[..self.io_size as usize];
                for (k, blk) in buf.chunks_exact_mut(bs).enumerate() {
                    fill_block(blk, lba + k as u64, tag);
                }
            }
            self.start_ns[s] = base.elapsed().as_nanos() as u64;
            self.q
                .submit_write(slot, self.nsid, lba, self.nlb, self.io_size)?;
        }
        Ok(true)
    }

    fn note_error(&mut self, what: &str, lba: u64, c: &IoCompletion) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(format!(
                "{what} of LBA {lba} on queue {} failed: {} (sct {:#x}, sc {:#04x})",
                self.q.qid(),
                c.status.name(),
                c.status.sct,
                c.status.sc
            ));
        }
    }

    fn check(&mut self, slot: Slot, lba: u64, gen: u32) {
        let tag = (self.seed << 32) | gen as u64;
        let bs = self.bs as usize;
        let io = self.io_size as usize;
        let mut bad = 0u64;
        let mut blocks = 0u64;
        for (k, blk) in self.q.buf(slot)[..io].chunks_exact(bs).enumerate() {
            blocks += 1;
            if let Some(m) = check_block(blk, lba + k as u64, tag) {
                bad += 1;
                if self.mismatches.len() < KEEP_MISMATCHES {
                    self.mismatches.push(m);
                }
            }
        }
        self.verified_blocks += blocks;
        self.mismatched_blocks += bad;
    }

    /// Account one completion. Returns the slot to the caller.
    #[inline]
    fn complete(&mut self, c: &IoCompletion, base: Instant) {
        let s = c.slot as usize;
        let now = base.elapsed().as_nanos() as u64;
        let lat = now.saturating_sub(self.start_ns[s]);
        let u = self.unit[s];
        let lba = (self.first_unit + u) * self.nlb as u64;
        let ok = c.status.is_success();
        match self.op[s] {
            OP_READ => {
                if ok {
                    self.read.record(self.io_size, lat);
                    if self.verify {
                        let gen = self.gens[u as usize];
                        if gen != 0 && gen != GEN_UNKNOWN {
                            self.check(c.slot, lba, gen);
                        }
                    }
                } else {
                    self.note_error("read", lba, c);
                }
            }
            OP_WRITE => {
                if ok {
                    self.write.record(self.io_size, lat);
                    if self.verify {
                        self.gens[u as usize] = self.gen_of_slot[s];
                    }
                } else {
                    self.note_error("write", lba, c);
                    if self.verify {
                        self.gens[u as usize] = GEN_UNKNOWN;
                    }
                }
            }
            _ => {
                if ok {
                    let gen = self.gens[u as usize];
                    self.check(c.slot, lba, gen);
                } else {
                    self.note_error("verify read-back", lba, c);
                }
            }
        }
        if self.verify {
            self.set_busy(u, false);
        }
    }

    /// Start one read-back I/O of the next written unit; false when done.
    fn start_readback(&mut self, slot: Slot, base: Instant) -> Result<bool> {
        while self.readback_next < self.units {
            let u = self.readback_next;
            self.readback_next += 1;
            let g = self.gens[u as usize];
            if g == 0 || g == GEN_UNKNOWN {
                continue;
            }
            let s = slot as usize;
            self.unit[s] = u;
            self.op[s] = OP_READBACK;
            self.start_ns[s] = base.elapsed().as_nanos() as u64;
            let lba = (self.first_unit + u) * self.nlb as u64;
            self.q
                .submit_read(slot, self.nsid, lba, self.nlb, self.io_size)?;
            return Ok(true);
        }
        Ok(false)
    }

    fn report(self) -> QueueReport {
        QueueReport {
            qid: self.q.qid(),
            core: self.core,
            read: self.read,
            write: self.write,
            errors: self.errors,
            first_error: self.first_error,
            verified_blocks: self.verified_blocks,
            mismatched_blocks: self.mismatched_blocks,
            mismatches: self.mismatches,
            lost: self.q.inflight() as u64,
        }
    }
}

/// Pin the calling thread to one CPU.
pub fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET bounds-checks against its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Wait until one of the queues' sockets is ready or `timeout` passes.
fn wait_any(fds: &mut [libc::pollfd], qs: &[QueueWorker], timeout: Duration) {
    for (p, w) in fds.iter_mut().zip(qs) {
        p.fd = w.q.raw_fd();
        p.events = w.q.poll_events();
        p.revents = 0;
    }
    let ms = crate::transport::timeout_ms(Some(timeout)).max(1);
    // SAFETY: `fds` is a valid array of pollfd for the call.
    unsafe {
        libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms);
    }
}

/// Run one thread's queues until `deadline`, drain, then (verify) read back.
fn run_thread(
    qs: &mut [QueueWorker],
    tix: usize,
    shared: &Shared,
    base: Instant,
    deadline: Instant,
    drain: Duration,
    spin: Duration,
) -> Result<()> {
    let mut last_progress = Instant::now();
    let mut fds = vec![
        libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0
        };
        qs.len()
    ];
    let mut running = true;
    let mut drain_until = deadline + drain;
    let mut ios_total = 0u64;
    let mut bytes_total = 0u64;
    // Phase 1: timed run. Phase 2 (verify): read-back.
    for phase in 0..2 {
        if phase == 1 {
            if !qs.iter().any(|w| w.verify) {
                break;
            }
            running = true;
            drain_until = Instant::now() + Duration::from_secs(600);
        }
        loop {
            let now = Instant::now();
            if running && (now >= deadline || shared.stop.load(Ordering::Relaxed)) && phase == 0 {
                running = false;
            }
            let mut progress = false;
            let mut inflight = 0;
            for w in qs.iter_mut() {
                if running {
                    while let Some(slot) = w.q.alloc() {
                        let started = if phase == 0 {
                            w.start_io(slot, base)?
                        } else {
                            w.start_readback(slot, base)?
                        };
                        if !started {
                            w.q.release(slot);
                            break;
                        }
                        progress = true;
                    }
                }
                w.q.poll(Some(Duration::ZERO))?;
                while let Some(c) = w.q.next_completion() {
                    progress = true;
                    w.complete(&c, base);
                    ios_total += 1;
                    bytes_total += w.io_size as u64;
                    let again = running
                        && if phase == 0 {
                            w.start_io(c.slot, base)?
                        } else {
                            w.start_readback(c.slot, base)?
                        };
                    if !again {
                        w.q.release(c.slot);
                    }
                }
                inflight += w.q.inflight();
            }
            shared.ios[tix].0.store(ios_total, Ordering::Relaxed);
            shared.bytes[tix].0.store(bytes_total, Ordering::Relaxed);
            if phase == 1 && running && inflight == 0 {
                // Nothing left to read back.
                let left = qs.iter().any(|w| w.readback_next < w.units);
                if !left {
                    running = false;
                }
            }
            if !running && inflight == 0 {
                break;
            }
            if !running && Instant::now() >= drain_until {
                break; // lost I/Os are reported per queue
            }
            if progress {
                if !spin.is_zero() {
                    last_progress = Instant::now();
                }
            } else if !spin.is_zero() && inflight > 0 && last_progress.elapsed() < spin {
                // Busy-poll: the next completion is likely within
                // microseconds; a sleep would add a wake-up to it.
                std::hint::spin_loop();
            } else {
                let now = Instant::now();
                let wait = if running && phase == 0 {
                    deadline.saturating_duration_since(now)
                } else {
                    drain_until.saturating_duration_since(now)
                }
                .min(Duration::from_millis(10));
                wait_any(&mut fds, qs, wait);
            }
        }
    }
    Ok(())
}

/// Connect, run the workload, and collect the report.
pub fn run(cfg: &PerfConfig) -> Result<PerfReport> {
    if cfg.queues == 0 || cfg.queue_depth == 0 {
        return Err(Error::InvalidArg(
            "queues and queue depth must be at least 1".into(),
        ));
    }
    let ctrl = Controller::connect(&cfg.connect)?;
    if ctrl.is_discovery() {
        return Err(Error::InvalidArg(format!(
            "{} is a discovery subsystem; give the NQN of an NVM subsystem (see `nvmf discover`)",
            cfg.connect.trid.subnqn
        )));
    }
    let ns = ctrl.identify_namespace(cfg.nsid)?;
    let nsze = ns.nsze.get();
    if nsze == 0 {
        return Err(Error::InvalidArg(format!(
            "namespace {} is not active on {}",
            cfg.nsid, cfg.connect.trid.subnqn
        )));
    }
    let bs = ns.block_size() as u32;
    if bs == 0 || cfg.io_size == 0 || !cfg.io_size.is_multiple_of(bs) {
        return Err(Error::InvalidArg(format!(
            "I/O size {} is not a multiple of the namespace's {bs} byte blocks",
            cfg.io_size
        )));
    }
    let nlb = cfg.io_size / bs;
    if nlb > 65536 {
        return Err(Error::InvalidArg(format!(
            "I/O size {} is more than 65536 blocks",
            cfg.io_size
        )));
    }
    let total_units = nsze / nlb as u64;
    let nq = cfg.queues as u64;
    if total_units < nq {
        return Err(Error::InvalidArg(format!(
            "namespace of {nsze} blocks is too small for {nq} queues of {} byte I/O",
            cfg.io_size
        )));
    }
    if cfg.verify && cfg.workload.read_pct(cfg.read_pct) == 100 {
        return Err(Error::InvalidArg(
            "--verify needs a workload that writes (write, randwrite, rw, randrw)".into(),
        ));
    }
    let granted = ctrl.set_num_queues(cfg.queues)?;
    if granted < cfg.queues {
        return Err(Error::InvalidArg(format!(
            "controller grants only {granted} I/O queues, {} requested",
            cfg.queues
        )));
    }

    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ (std::process::id() as u64) << 20;
    // One region per queue when sequential or verifying (so no two queues
    // touch the same blocks); random runs without verify use the whole
    // namespace from every queue.
    let split = cfg.verify || !cfg.workload.is_random();
    let per_queue = total_units / nq;
    let nthreads = match &cfg.cores {
        Some(c) if !c.is_empty() => c.len().min(cfg.queues as usize),
        _ => cfg.queues as usize,
    };
    let mut groups: Vec<Vec<QueueWorker>> = (0..nthreads).map(|_| Vec::new()).collect();
    for i in 0..cfg.queues {
        let mut q = ctrl.create_io_queue(i + 1, cfg.queue_depth, cfg.io_size)?;
        if let Some(n) = cfg.in_capsule {
            q.set_in_capsule_size(n.min(ctrl.in_capsule_size()));
        }
        let (first_unit, mut units) = if split {
            (i as u64 * per_queue, per_queue)
        } else {
            (0, total_units)
        };
        if cfg.verify {
            units = units.min(MAX_VERIFY_UNITS);
        }
        let depth = q.depth();
        let t = i as usize % nthreads;
        let core = cfg.cores.as_ref().and_then(|c| c.get(t).copied());
        groups[t].push(QueueWorker {
            q,
            core,
            nsid: cfg.nsid,
            bs,
            nlb,
            io_size: cfg.io_size,
            first_unit,
            units,
            seq_next: 0,
            random: cfg.workload.is_random(),
            read_pct: cfg.workload.read_pct(cfg.read_pct),
            rng: XorShift::new(
                seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            ),
            start_ns: vec![0; depth],
            op: vec![0; depth],
            unit: vec![0; depth],
            gen_of_slot: vec![0; depth],
            verify: cfg.verify,
            seed: (seed >> 16) & 0xffff_ffff,
            gens: if cfg.verify {
                vec![0; units as usize]
            } else {
                Vec::new()
            },
            busy: if cfg.verify {
                vec![0; units.div_ceil(64) as usize]
            } else {
                Vec::new()
            },
            next_gen: 1,
            readback_next: 0,
            read: DirStats::new(),
            write: DirStats::new(),
            errors: 0,
            first_error: None,
            verified_blocks: 0,
            mismatched_blocks: 0,
            mismatches: Vec::new(),
        });
    }

    let shared = Arc::new(Shared {
        ios: (0..nthreads)
            .map(|_| PaddedCounter(AtomicU64::new(0)))
            .collect(),
        bytes: (0..nthreads)
            .map(|_| PaddedCounter(AtomicU64::new(0)))
            .collect(),
        stop: AtomicBool::new(false),
    });
    let barrier = Arc::new(Barrier::new(nthreads + 1));
    let base = Instant::now();
    let mut handles = Vec::new();
    for (t, mut qs) in groups.into_iter().enumerate() {
        let shared = Arc::clone(&shared);
        let barrier = Arc::clone(&barrier);
        let core = cfg.cores.as_ref().and_then(|c| c.get(t).copied());
        let duration = cfg.duration;
        let spin = cfg.poll;
        let h = std::thread::Builder::new()
            .name(format!("nvmf-perf-{t}"))
            .spawn(move || {
                let pin = core.map(pin_to_cpu);
                barrier.wait();
                if let Some(Err(e)) = pin {
                    return (
                        qs,
                        Some(format!("pinning to CPU {}: {e}", core.unwrap_or(0))),
                    );
                }
                let start = Instant::now();
                let r = run_thread(
                    &mut qs,
                    t,
                    &shared,
                    base,
                    start + duration,
                    Duration::from_secs(10),
                    spin,
                );
                (qs, r.err().map(|e| e.to_string()))
            })
            .expect("spawn perf thread");
        handles.push(h);
    }
    barrier.wait();
    let start = Instant::now();

    // Progress once a second while the threads run.
    let mut last = (0u64, 0u64, start);
    let mut printed = false;
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if cfg.progress && last.2.elapsed() >= Duration::from_secs(1) {
            let ios: u64 = shared.ios.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
            let bytes: u64 = shared
                .bytes
                .iter()
                .map(|c| c.0.load(Ordering::Relaxed))
                .sum();
            let dt = last.2.elapsed().as_secs_f64();
            let el = start.elapsed().as_secs_f64();
            print!(
                "\r[{:>5.1}s/{:.0}s] {:>12.0} IOPS {:>10.2} MiB/s   ",
                el.min(cfg.duration.as_secs_f64() + 99.0),
                cfg.duration.as_secs_f64(),
                (ios - last.0) as f64 / dt,
                (bytes - last.1) as f64 / dt / 1048576.0
            );
            let _ = std::io::Write::flush(&mut std::io::stdout());
            printed = true;
            last = (ios, bytes, Instant::now());
        }
    }
    if printed {
        println!();
    }
    let runtime = start
        .elapsed()
        .min(cfg.duration.max(Duration::from_millis(1)));
    let mut queues = Vec::new();
    let mut failures = Vec::new();
    for h in handles {
        match h.join() {
            Ok((qs, err)) => {
                if let Some(e) = err {
                    failures.push(e);
                }
                queues.extend(qs.into_iter().map(|w| w.report()));
            }
            Err(_) => failures.push("a perf thread panicked".into()),
        }
    }
    queues.sort_by_key(|q| q.qid);
    if let Some(e) = ctrl.keep_alive_error() {
        failures.push(format!("keep alive failed: {e}"));
    }
    let neg_in_capsule = match cfg.in_capsule {
        Some(n) => n.min(ctrl.in_capsule_size()),
        None => ctrl.in_capsule_size(),
    };
    Ok(PerfReport {
        workload: cfg.workload,
        io_size: cfg.io_size,
        queue_depth: cfg.queue_depth,
        read_pct: cfg.workload.read_pct(cfg.read_pct),
        nsid: cfg.nsid,
        block_size: bs,
        ns_blocks: nsze,
        in_capsule: neg_in_capsule,
        hdr_digest: cfg.connect.hdr_digest,
        data_digest: cfg.connect.data_digest,
        verify: cfg.verify,
        trid: cfg.connect.trid.to_string(),
        runtime,
        queues,
        failures,
    })
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

const PCTS: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];

fn us(ns: f64) -> f64 {
    ns / 1000.0
}

fn text_row(s: &mut String, name: &str, op: &str, d: &DirStats, secs: f64) {
    let _ = write!(
        s,
        "{name:<14} {op:<5} {:>11.0} {:>9.2} {:>9.1} {:>8.1} {:>9.1}",
        d.iops(secs),
        d.mib_s(secs),
        us(d.mean_ns()),
        us(d.min() as f64),
        us(d.max_ns as f64)
    );
    for p in PCTS {
        let _ = write!(s, " {:>9.1}", us(d.percentile(p) as f64));
    }
    s.push('\n');
}

/// Human-readable report.
pub fn format_text(r: &PerfReport) -> String {
    let secs = r.runtime.as_secs_f64();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "nvmf perf: {} {} B, QD {} x {} queue(s), {:.1} s, ns {} ({} x {} B), in-capsule <= {} B, digests: {}{}",
        r.workload.name(),
        r.io_size,
        r.queue_depth,
        r.queues.len(),
        secs,
        r.nsid,
        r.ns_blocks,
        r.block_size,
        r.in_capsule,
        match (r.hdr_digest, r.data_digest) {
            (false, false) => "none",
            (true, false) => "header",
            (false, true) => "data",
            (true, true) => "header+data",
        },
        if r.verify { ", verify" } else { "" }
    );
    let _ = writeln!(s, "target: {}", r.trid);
    let _ = write!(
        s,
        "{:<14} {:<5} {:>11} {:>9} {:>9} {:>8} {:>9}",
        "queue", "op", "IOPS", "MiB/s", "mean(us)", "min(us)", "max(us)"
    );
    for p in PCTS {
        let _ = write!(s, " {:>9}", format!("p{p}"));
    }
    s.push('\n');
    let want_read = r.read_pct > 0;
    let want_write = r.read_pct < 100;
    for q in &r.queues {
        let name = match q.core {
            Some(c) => format!("q{} (cpu {c})", q.qid),
            None => format!("q{}", q.qid),
        };
        if want_read {
            text_row(&mut s, &name, "read", &q.read, secs);
        }
        if want_write {
            text_row(&mut s, &name, "write", &q.write, secs);
        }
    }
    let (tr, tw) = (r.total_read(), r.total_write());
    if want_read {
        text_row(&mut s, "total", "read", &tr, secs);
    }
    if want_write {
        text_row(&mut s, "total", "write", &tw, secs);
    }
    let mut all = tr.clone();
    all.merge(&tw);
    let _ = writeln!(
        s,
        "total: {:.0} IOPS, {:.2} MiB/s, mean latency {:.1} us",
        all.iops(secs),
        all.mib_s(secs),
        us(all.mean_ns())
    );
    for q in &r.queues {
        if let Some(e) = &q.first_error {
            let _ = writeln!(s, "ERROR: q{}: {} I/O errors; first: {e}", q.qid, q.errors);
        }
        if q.lost > 0 {
            let _ = writeln!(
                s,
                "ERROR: q{}: {} I/Os never completed (drain timed out)",
                q.qid, q.lost
            );
        }
    }
    for f in &r.failures {
        let _ = writeln!(s, "ERROR: {f}");
    }
    if r.verify {
        let bad = r.mismatched_blocks();
        let _ = writeln!(
            s,
            "verify: {} blocks checked, {} mismatched{}",
            r.verified_blocks(),
            bad,
            if bad == 0 { " - OK" } else { " - FAILED" }
        );
        for q in &r.queues {
            for m in &q.mismatches {
                let _ = writeln!(
                    s,
                    "  MISMATCH q{} LBA {}: found LBA {} tag {:#x}, expected tag {:#x}, first difference at byte {}",
                    q.qid, m.lba, m.found_lba, m.found_tag, m.expected_tag, m.offset
                );
            }
        }
    }
    s
}

fn dir_json(d: &DirStats, secs: f64) -> Value {
    let mean = d.mean_ns();
    let stddev = if d.ios > 0 { d.hist.stdev() } else { 0.0 };
    let mut pct = Map::new();
    for p in [
        1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9,
        99.95, 99.99,
    ] {
        pct.insert(format!("{p:.6}"), json!(d.percentile(p)));
    }
    let lat = json!({
        "min": d.min(), "max": d.max_ns, "mean": mean, "stddev": stddev, "N": d.ios,
    });
    let mut clat = lat.clone();
    clat["percentile"] = Value::Object(pct);
    json!({
        "io_bytes": d.bytes,
        "io_kbytes": d.bytes / 1024,
        "bw_bytes": (d.bytes as f64 / secs.max(1e-9)) as u64,
        "bw": (d.bytes as f64 / 1024.0 / secs.max(1e-9)) as u64,
        "iops": d.iops(secs),
        "runtime": (secs * 1000.0) as u64,
        "total_ios": d.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "slat_ns": {"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0},
        "clat_ns": clat,
        "lat_ns": lat,
    })
}

/// fio-style JSON report: `jobs[]` (one per queue) with `read`/`write`
/// objects using fio's field names (`iops`, `bw` in KiB/s, `lat_ns`,
/// `clat_ns.percentile`), plus `total` and `verify`.
pub fn to_json(r: &PerfReport) -> Value {
    let secs = r.runtime.as_secs_f64();
    let jobs: Vec<Value> = r
        .queues
        .iter()
        .map(|q| {
            json!({
                "jobname": format!("q{}", q.qid),
                "groupid": 0,
                "qid": q.qid,
                "cpu": q.core,
                "error": q.errors + q.lost,
                "first_error": q.first_error,
                "job_runtime": (secs * 1000.0) as u64,
                "read": dir_json(&q.read, secs),
                "write": dir_json(&q.write, secs),
                "verify": {"blocks_checked": q.verified_blocks, "mismatched_blocks": q.mismatched_blocks},
            })
        })
        .collect();
    let mismatches: Vec<Value> = r
        .queues
        .iter()
        .flat_map(|q| {
            q.mismatches.iter().map(move |m| {
                json!({"qid": q.qid, "lba": m.lba, "found_lba": m.found_lba,
                       "found_tag": m.found_tag, "expected_tag": m.expected_tag, "offset": m.offset})
            })
        })
        .collect();
    json!({
        "nvmf_version": env!("CARGO_PKG_VERSION"),
        "timestamp": SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        "global options": {
            "rw": r.workload.name(),
            "bs": r.io_size.to_string(),
            "iodepth": r.queue_depth.to_string(),
            "rwmixread": r.read_pct.to_string(),
            "numjobs": r.queues.len().to_string(),
            "runtime": format!("{:.3}", secs),
            "trid": r.trid,
            "nsid": r.nsid,
            "block_size": r.block_size,
            "in_capsule": r.in_capsule,
            "hdr_digest": r.hdr_digest,
            "data_digest": r.data_digest,
        },
        "jobs": jobs,
        "total": {
            "read": dir_json(&r.total_read(), secs),
            "write": dir_json(&r.total_write(), secs),
            "error": r.errors(),
        },
        "failures": r.failures,
        "verify": {
            "enabled": r.verify,
            "blocks_checked": r.verified_blocks(),
            "mismatched_blocks": r.mismatched_blocks(),
            "mismatches": mismatches,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_round_trip_and_mismatch() {
        let mut b = vec![0u8; 512];
        fill_block(&mut b, 77, 0x1234_0000_0005);
        assert!(check_block(&b, 77, 0x1234_0000_0005).is_none());
        let m = check_block(&b, 77, 0x1234_0000_0006).unwrap();
        assert_eq!(m.found_lba, 77);
        assert_eq!(m.found_tag, 0x1234_0000_0005);
        assert_eq!(m.offset, 8);
        let m = check_block(&b, 78, 0x1234_0000_0005).unwrap();
        assert_eq!(m.offset, 0);
        b[300] ^= 0x10;
        assert_eq!(check_block(&b, 77, 0x1234_0000_0005).unwrap().offset, 300);
    }

    #[test]
    fn rng_below_in_range() {
        let mut r = XorShift::new(42);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[r.below(10) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn stats_and_json_shape() {
        let mut d = DirStats::new();
        for i in 1..=1000u64 {
            d.record(4096, i * 1000);
        }
        assert_eq!(d.ios, 1000);
        assert_eq!(d.min(), 1000);
        let p99 = d.percentile(99.0);
        assert!((985_000..=995_000).contains(&p99), "{p99}");
        let v = dir_json(&d, 1.0);
        assert_eq!(v["iops"], json!(1000.0));
        assert_eq!(v["bw"], json!(4000));
        assert!(v["clat_ns"]["percentile"]["99.000000"].as_u64().unwrap() > 0);
        assert_eq!(v["lat_ns"]["min"], json!(1000));
    }

    #[test]
    fn workload_names() {
        for w in ["read", "write", "randread", "randwrite", "rw", "randrw"] {
            assert_eq!(Workload::parse(w).unwrap().name(), w);
        }
        assert_eq!(Workload::RandRw.read_pct(70), 70);
        assert_eq!(Workload::Write.read_pct(70), 0);
    }
}
