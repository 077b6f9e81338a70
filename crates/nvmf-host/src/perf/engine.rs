//! perf/engine.rs — the I/O engine of `nvmf perf`: one `Worker` per
//! logical queue, holding that queue's `IoQueue` on every path, run by a
//! thread that drives its workers with pipelined submissions until the
//! deadline, drains, and (verify) reads every written unit back.
//!
//! A worker's commands are *tags* (0..depth): a tag carries the unit, the
//! operation, the verify generation and the submit time, and is in flight
//! on at most one path at a time (`tag_path`, `tag_slot`). A new command
//! goes to a path chosen by the policy among the usable paths of the best
//! ANA class (optimized, else non-optimized; never inaccessible, persistent
//! loss, change or lost). When a path is lost (its queue's socket fails, or
//! the monitor marked it), every tag in flight on it is queued to be
//! re-issued, unchanged (same LBA; a write is refilled with the same tagged
//! data), on another path; a completion with a path status (SCT 3) or
//! another retryable status (DNR clear) is re-issued the same way, a
//! bounded number of times. The verify map only changes when a write
//! completes successfully, so a write whose outcome was unknown is exact
//! once its re-issue completes.
//!
//! Per I/O there is no allocation and no lock: tags and slots come from
//! preallocated free lists, the re-issue queue has room for every tag,
//! latency goes into preallocated histograms, and a path's state is one
//! relaxed atomic load.
//!
//! Waiting: a thread busy-polls its sockets (non-blocking reads) while
//! completions keep coming, for up to `poll_us` without one, and only then
//! sleeps in poll(2).

use super::report::{DirStats, QueueReport};
use super::workload::{check_block, fill_block, Mismatch, XorShift};
use crate::error::{Error, Result};
use crate::multipath::{PathShared, Policy};
use crate::queue::{IoCompletion, IoQueue, Slot};
use nvmf_wire::status::sct;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) const OP_READ: u8 = 0;
pub(crate) const OP_WRITE: u8 = 1;
/// Read issued by the final verify read-back (not in the statistics).
pub(crate) const OP_READBACK: u8 = 2;
/// Generation value for "unknown" (a write failed).
const GEN_UNKNOWN: u32 = u32::MAX;
/// Most mismatches kept per queue for the report.
const KEEP_MISMATCHES: usize = 16;
/// Largest verify table per queue (units); larger regions are clipped.
pub(crate) const MAX_VERIFY_UNITS: u64 = 4 << 20;
/// `tag_path` of a tag that is not in flight.
const NO_PATH: u8 = u8::MAX;
/// Times one command may be re-issued (path losses and retryable statuses).
const MAX_TRIES: u8 = 16;
/// Re-issues after a retryable status that is not a path status (as the
/// Linux host's default of 5).
const MAX_STATUS_RETRIES: u8 = 5;
/// How long commands may wait for a usable path while some path is still
/// connected (in ANA change or inaccessible) before the run fails.
pub(crate) const NO_PATH_WAIT: Duration = Duration::from_secs(30);

/// Progress counters shared with the main thread.
pub(crate) struct Shared {
    /// Per thread: I/Os and bytes done so far (for the progress line).
    pub ios: Vec<PaddedCounter>,
    pub bytes: Vec<PaddedCounter>,
    pub stop: AtomicBool,
    /// Set by the main thread when the ramp is over (after the runner has
    /// read the target's counters at the window's start): every worker
    /// restarts its statistics at its next loop turn, so the engine counts
    /// from just after that read, not from a clock edge the runner's read
    /// may lag by milliseconds.
    pub ramp_over: AtomicBool,
}

#[repr(align(64))]
pub(crate) struct PaddedCounter(pub AtomicU64);

/// What one worker did on one path.
#[derive(Debug, Clone)]
pub(crate) struct PathStats {
    pub read: DirStats,
    pub write: DirStats,
    pub failed_over: u64,
    pub retried: u64,
    pub errors: u64,
    /// ns since base of the first and last completion here (0 = none).
    pub first_ns: u64,
    pub last_ns: u64,
}

impl PathStats {
    fn new() -> PathStats {
        PathStats {
            read: DirStats::new(),
            write: DirStats::new(),
            failed_over: 0,
            retried: 0,
            errors: 0,
            first_ns: 0,
            last_ns: 0,
        }
    }
    pub fn merge(&mut self, o: &PathStats) {
        self.read.merge(&o.read);
        self.write.merge(&o.write);
        self.failed_over += o.failed_over;
        self.retried += o.retried;
        self.errors += o.errors;
        if o.first_ns != 0 && (self.first_ns == 0 || o.first_ns < self.first_ns) {
            self.first_ns = o.first_ns;
        }
        self.last_ns = self.last_ns.max(o.last_ns);
    }
}

/// One logical queue's `IoQueue` on one path.
pub(crate) struct PathQueue {
    /// None once the path is lost for this worker.
    pub q: Option<IoQueue>,
    /// Tag carried by each slot while in flight.
    tag_of_slot: Vec<u16>,
}

impl PathQueue {
    pub fn new(q: IoQueue) -> PathQueue {
        let n = q.depth();
        PathQueue {
            q: Some(q),
            tag_of_slot: vec![0; n],
        }
    }

    /// Use `q` (from a reconnect) from now on.
    fn install(&mut self, q: IoQueue) {
        self.tag_of_slot.resize(q.depth(), 0);
        self.q = Some(q);
    }
}

/// One logical queue: its workload state, its queues on every path, and
/// its results.
pub(crate) struct Worker {
    pub qid: u16,
    pub core: Option<usize>,
    /// The thread driving it, and the CPU that thread was on at its end.
    pub thread: usize,
    pub ran_on: Option<usize>,
    pub nsid: u32,
    pub bs: u32,
    pub nlb: u32,
    pub io_size: u32,
    /// First unit (in I/O-size units) and unit count of this queue's region.
    pub first_unit: u64,
    pub units: u64,
    pub seq_next: u64,
    pub random: bool,
    pub read_pct: u32,
    pub rng: XorShift,
    pub paths: Vec<PathQueue>,
    pub shared_paths: Vec<Arc<PathShared>>,
    pub policy: Policy,
    /// Connection epoch of each path's queue (see `PathShared::epoch`).
    epochs: Vec<u64>,
    /// Lost paths may come back (the monitor reconnects them).
    reconnect: bool,
    rr: usize,
    // per tag
    free_tags: Vec<u16>,
    tag_path: Vec<u8>,
    tag_slot: Vec<Slot>,
    start_ns: Vec<u64>,
    op: Vec<u8>,
    unit: Vec<u64>,
    gen_of_tag: Vec<u32>,
    tries: Vec<u8>,
    status_tries: Vec<u8>,
    /// Tags waiting to be (re-)issued on a usable path.
    pending: VecDeque<u16>,
    /// Since when `pending` found no usable path.
    no_path_since: Option<Instant>,
    // verify state
    pub verify: bool,
    pub seed: u64,
    gens: Vec<u32>,
    busy: Vec<u64>,
    next_gen: u32,
    readback_next: u64,
    /// ns since base of the latest completion batch (see `poll_paths`).
    now_ns: u64,
    // results: `read`/`write` are filled from `pstats` by `report`
    read: DirStats,
    write: DirStats,
    pub pstats: Vec<PathStats>,
    errors: u64,
    first_error: Option<String>,
    verified_blocks: u64,
    mismatched_blocks: u64,
    mismatches: Vec<Mismatch>,
}

/// What a worker is started with.
pub(crate) struct WorkerSetup {
    pub qid: u16,
    pub core: Option<usize>,
    pub nsid: u32,
    pub bs: u32,
    pub io_size: u32,
    pub first_unit: u64,
    pub units: u64,
    pub random: bool,
    pub read_pct: u32,
    pub rng_seed: u64,
    pub verify: bool,
    pub seed: u64,
    pub depth: usize,
    pub policy: Policy,
    pub reconnect: bool,
}

impl Worker {
    pub fn new(
        s: WorkerSetup,
        paths: Vec<PathQueue>,
        shared_paths: Vec<Arc<PathShared>>,
    ) -> Worker {
        let d = s.depth;
        let np = paths.len();
        Worker {
            qid: s.qid,
            core: s.core,
            thread: 0,
            ran_on: None,
            nsid: s.nsid,
            bs: s.bs,
            nlb: s.io_size / s.bs,
            io_size: s.io_size,
            first_unit: s.first_unit,
            units: s.units,
            seq_next: 0,
            random: s.random,
            read_pct: s.read_pct,
            rng: XorShift::new(s.rng_seed),
            paths,
            shared_paths,
            policy: s.policy,
            epochs: vec![0; np],
            reconnect: s.reconnect,
            // Spread the first choices of the queues over the paths.
            rr: (s.qid as usize).wrapping_sub(1) % np.max(1),
            free_tags: (0..d as u16).rev().collect(),
            tag_path: vec![NO_PATH; d],
            tag_slot: vec![0; d],
            start_ns: vec![0; d],
            op: vec![0; d],
            unit: vec![0; d],
            gen_of_tag: vec![0; d],
            tries: vec![0; d],
            status_tries: vec![0; d],
            pending: VecDeque::with_capacity(d),
            no_path_since: None,
            verify: s.verify,
            seed: s.seed,
            gens: if s.verify {
                vec![0; s.units as usize]
            } else {
                Vec::new()
            },
            busy: if s.verify {
                vec![0; s.units.div_ceil(64) as usize]
            } else {
                Vec::new()
            },
            next_gen: 1,
            readback_next: 0,
            now_ns: 0,
            read: DirStats::new(),
            write: DirStats::new(),
            pstats: (0..np).map(|_| PathStats::new()).collect(),
            errors: 0,
            first_error: None,
            verified_blocks: 0,
            mismatched_blocks: 0,
            mismatches: Vec::new(),
        }
    }

    /// Commands owned by the worker (in flight or waiting for a path).
    #[inline]
    fn outstanding(&self) -> usize {
        self.tag_path.len() - self.free_tags.len()
    }

    /// Tags sent on a path and not completed (not those waiting for one).
    fn in_flight(&self) -> usize {
        self.tag_path.iter().filter(|&&p| p != NO_PATH).count()
    }

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

    /// The path for the next command: among connected paths of the best
    /// ANA class, by the policy. None if no path is usable now.
    #[inline]
    fn pick_path(&mut self) -> Option<usize> {
        let n = self.paths.len();
        if n == 1 {
            return (self.paths[0].q.is_some() && self.shared_paths[0].class() < 2).then_some(0);
        }
        let (paths, shared) = (&self.paths, &self.shared_paths);
        choose_path(self.policy, &mut self.rr, n, |p| {
            paths[p]
                .q
                .as_ref()
                .map(|q| (shared[p].class(), q.inflight()))
        })
    }

    /// Send tag `t` (its op, unit and generation already set) on path `p`.
    #[inline]
    fn issue(&mut self, t: u16, p: usize) -> Result<()> {
        let ti = t as usize;
        let lba = (self.first_unit + self.unit[ti]) * self.nlb as u64;
        let (nsid, nlb, io_size, bs) = (self.nsid, self.nlb, self.io_size, self.bs as usize);
        let op = self.op[ti];
        let tag = (self.seed << 32) | self.gen_of_tag[ti] as u64;
        let verify = self.verify;
        let pq = &mut self.paths[p];
        let q = pq.q.as_mut().expect("issue on a connected path");
        let slot = q
            .alloc()
            .ok_or_else(|| Error::InvalidArg("no free slot on a path queue".into()))?;
        pq.tag_of_slot[slot as usize] = t;
        self.tag_path[ti] = p as u8;
        self.tag_slot[ti] = slot;
        let r = if op == OP_WRITE {
            if verify {
                let buf = &mut q.buf_mut(slot)[..io_size as usize];
                for (k, blk) in buf.chunks_exact_mut(bs).enumerate() {
                    fill_block(blk, lba + k as u64, tag);
                }
            }
            q.submit_write(slot, nsid, lba, nlb, io_size)
        } else {
            q.submit_read(slot, nsid, lba, nlb, io_size)
        };
        if let Err(e) = r {
            q.release(slot);
            self.tag_path[ti] = NO_PATH;
            return Err(e);
        }
        Ok(())
    }

    /// Start one new I/O on a free tag; false if nothing could be started.
    /// `path`: the path chosen for the whole batch (one path: its state
    /// cannot change within a batch that only encodes), else None.
    #[inline]
    fn start_io(&mut self, now_ns: u64, path: Option<usize>) -> Result<bool> {
        if self.free_tags.is_empty() {
            return Ok(false);
        }
        let Some(p) = path.or_else(|| self.pick_path()) else {
            self.no_usable_path()?;
            return Ok(false);
        };
        self.no_path_since = None;
        let Some(u) = self.pick_unit() else {
            return Ok(false);
        };
        let t = self.free_tags.pop().expect("checked non-empty");
        let ti = t as usize;
        let is_read = match self.read_pct {
            100 => true,
            0 => false,
            pct => (self.rng.below(100) as u32) < pct,
        };
        self.unit[ti] = u;
        self.tries[ti] = 0;
        self.status_tries[ti] = 0;
        if self.verify {
            self.set_busy(u, true);
        }
        if is_read {
            self.op[ti] = OP_READ;
        } else {
            self.op[ti] = OP_WRITE;
            if self.verify {
                let gen = self.next_gen;
                self.next_gen = if gen + 1 == GEN_UNKNOWN { 1 } else { gen + 1 };
                self.gen_of_tag[ti] = gen;
            }
        }
        self.start_ns[ti] = now_ns;
        self.issue(t, p)?;
        Ok(true)
    }

    /// Start one read-back of the next written unit; false when done (or
    /// no tag or path is free now).
    fn start_readback(&mut self, now_ns: u64) -> Result<bool> {
        if self.free_tags.is_empty() {
            return Ok(false);
        }
        while self.readback_next < self.units {
            let u = self.readback_next;
            let g = self.gens[u as usize];
            if g == 0 || g == GEN_UNKNOWN {
                self.readback_next += 1;
                continue;
            }
            let Some(p) = self.pick_path() else {
                self.no_usable_path()?;
                return Ok(false);
            };
            self.no_path_since = None;
            self.readback_next += 1;
            let t = self.free_tags.pop().expect("checked non-empty");
            let ti = t as usize;
            self.unit[ti] = u;
            self.op[ti] = OP_READBACK;
            self.tries[ti] = 0;
            self.status_tries[ti] = 0;
            self.start_ns[ti] = now_ns;
            self.issue(t, p)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Start new I/Os (phase 0) or read-backs (phase 1) on every free tag;
    /// true if any started. `now_ns` (ns since base, read once per batch,
    /// not per I/O) is their submit time: they go out together at the next
    /// poll.
    fn start_all(&mut self, phase: usize, now_ns: u64) -> Result<bool> {
        let mut any = false;
        // One path: look at its state once per batch, not per I/O.
        let path = if self.paths.len() == 1 && !self.free_tags.is_empty() {
            self.pick_path()
        } else {
            None
        };
        loop {
            let started = if phase == 0 {
                self.start_io(now_ns, path)?
            } else {
                self.start_readback(now_ns)?
            };
            if !started {
                return Ok(any);
            }
            any = true;
        }
    }

    /// Re-issue waiting tags while a path is usable. Err when no path is
    /// left at all (or none came back within `NO_PATH_WAIT`).
    fn reissue(&mut self) -> Result<()> {
        while let Some(&t) = self.pending.front() {
            match self.pick_path() {
                Some(p) => {
                    self.pending.pop_front();
                    self.pstats[p].retried += 1;
                    self.issue(t, p)?;
                    self.no_path_since = None;
                }
                None => return self.no_usable_path(),
            }
        }
        Ok(())
    }

    /// No path is usable now: wait (Ok) while some path is connected, for
    /// at most `NO_PATH_WAIT`; Err when none is left or the wait ran out.
    fn no_usable_path(&mut self) -> Result<()> {
        let any_connected = self.reconnect
            || self
                .paths
                .iter()
                .zip(&self.shared_paths)
                .any(|(pq, sh)| pq.q.is_some() && !sh.is_failed());
        let since = *self.no_path_since.get_or_insert_with(Instant::now);
        if !any_connected {
            return Err(Error::Closed(format!(
                " on every path: no usable path left for queue {} ({} command(s) waiting; {})",
                self.qid,
                self.pending.len(),
                self.path_summary()
            )));
        }
        if since.elapsed() >= NO_PATH_WAIT {
            return Err(Error::Timeout(format!(
                "no usable path left for queue {} for {NO_PATH_WAIT:?} ({} command(s) waiting; {})",
                self.qid,
                self.pending.len(),
                self.path_summary()
            )));
        }
        Ok(())
    }

    fn path_summary(&self) -> String {
        self.shared_paths
            .iter()
            .map(|s| format!("{} {}", s.name, crate::multipath::ana_state_name(s.state())))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Path `p` is lost for this worker: mark it lost (for this epoch),
    /// drop its queue and queue its commands for re-issue elsewhere.
    fn fail_path(&mut self, p: usize, why: &str, base: Instant) {
        self.shared_paths[p].fail(self.epochs[p], why, base.elapsed().as_nanos() as u64);
        self.drop_queue(p);
    }

    /// Drop path `p`'s queue and queue every tag in flight on it for
    /// re-issue elsewhere.
    fn drop_queue(&mut self, p: usize) {
        let Some(q) = self.paths[p].q.take() else {
            return;
        };
        q.shutdown();
        drop(q);
        for ti in 0..self.tag_path.len() {
            if self.tag_path[ti] == p as u8 {
                self.tag_path[ti] = NO_PATH;
                self.pstats[p].failed_over += 1;
                self.requeue(ti as u16);
            }
        }
    }

    /// Queue tag `t` for re-issue, or fail it when it was tried too often.
    fn requeue(&mut self, t: u16) {
        let ti = t as usize;
        self.tries[ti] = self.tries[ti].saturating_add(1);
        if self.tries[ti] > MAX_TRIES {
            let lba = (self.first_unit + self.unit[ti]) * self.nlb as u64;
            let msg = format!(
                "{} of LBA {lba} on queue {} failed: re-issued {MAX_TRIES} times without success",
                op_name(self.op[ti]),
                self.qid
            );
            self.give_up(t, msg, None);
            return;
        }
        self.pending.push_back(t);
    }

    /// Count tag `t` as failed and free it (its verify unit becomes unknown
    /// if it was a write).
    fn give_up(&mut self, t: u16, msg: String, p: Option<usize>) {
        let ti = t as usize;
        self.errors += 1;
        if let Some(p) = p {
            self.pstats[p].errors += 1;
        }
        if self.first_error.is_none() {
            self.first_error = Some(msg);
        }
        if self.verify {
            let u = self.unit[ti];
            if self.op[ti] == OP_WRITE {
                self.gens[u as usize] = GEN_UNKNOWN;
            }
            self.set_busy(u, false);
        }
        self.free_tags.push(t);
    }

    fn check(&mut self, p: usize, slot: Slot, lba: u64, gen: u32) {
        let tag = (self.seed << 32) | gen as u64;
        let bs = self.bs as usize;
        let io = self.io_size as usize;
        let mut bad = 0u64;
        let mut blocks = 0u64;
        let q = self.paths[p]
            .q
            .as_ref()
            .expect("completion on a connected path");
        for (k, blk) in q.buf(slot)[..io].chunks_exact(bs).enumerate() {
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

    /// Account one completion on path `p`, seen at `now` (ns since base,
    /// read once per received batch); frees or re-queues its tag.
    #[inline]
    fn complete(&mut self, p: usize, c: &IoCompletion, now: u64) {
        let t = self.paths[p].tag_of_slot[c.slot as usize];
        let ti = t as usize;
        self.tag_path[ti] = NO_PATH;
        let lat = now.saturating_sub(self.start_ns[ti]);
        let u = self.unit[ti];
        let lba = (self.first_unit + u) * self.nlb as u64;
        let st = c.status;
        if !st.is_success() {
            let path_status = st.sct == sct::PATH;
            if path_status && (0x01..=0x03).contains(&st.sc) {
                self.shared_paths[p].note_ana_status(st.sc);
            }
            let retry = !st.dnr
                && (path_status || {
                    self.status_tries[ti] += 1;
                    self.status_tries[ti] <= MAX_STATUS_RETRIES
                });
            self.release_slot(p, c.slot);
            if retry {
                self.pstats[p].failed_over += 1;
                self.requeue(t);
            } else {
                let msg = format!(
                    "{} of LBA {lba} on queue {} via {} failed: {} (sct {:#x}, sc {:#04x}{})",
                    op_name(self.op[ti]),
                    self.qid,
                    self.shared_paths[p].name,
                    st.name(),
                    st.sct,
                    st.sc,
                    if st.dnr { ", DNR" } else { "" }
                );
                self.give_up(t, msg, Some(p));
            }
            return;
        }
        let ps = &mut self.pstats[p];
        if ps.first_ns == 0 {
            ps.first_ns = now.max(1);
        }
        ps.last_ns = now;
        match self.op[ti] {
            // Recorded per path only; the queue's totals are their sum
            // (`report`): one histogram update per I/O, not two.
            OP_READ => {
                self.pstats[p].read.record(self.io_size, lat);
                if self.verify {
                    let gen = self.gens[u as usize];
                    if gen != 0 && gen != GEN_UNKNOWN {
                        self.check(p, c.slot, lba, gen);
                    }
                }
            }
            OP_WRITE => {
                self.pstats[p].write.record(self.io_size, lat);
                if self.verify {
                    self.gens[u as usize] = self.gen_of_tag[ti];
                }
            }
            _ => {
                let gen = self.gens[u as usize];
                self.check(p, c.slot, lba, gen);
            }
        }
        if self.verify {
            self.set_busy(u, false);
        }
        self.release_slot(p, c.slot);
        self.free_tags.push(t);
    }

    #[inline]
    fn release_slot(&mut self, p: usize, slot: Slot) {
        if let Some(q) = self.paths[p].q.as_mut() {
            q.release(slot);
        }
    }

    /// Drive every path's queue once: send, receive, account completions.
    /// A queue whose connection fails is dropped and its commands re-queued.
    /// The clock is read once per path that had completions (their common
    /// completion time), kept in `now_ns` for the refill that follows.
    fn poll_paths(&mut self, base: Instant) -> usize {
        let mut done = 0;
        for p in 0..self.paths.len() {
            let e = self.shared_paths[p].epoch();
            if e != self.epochs[p] {
                // Connected again: the old queue (if this thread had not
                // seen it fail yet) is done; take the new one.
                self.epochs[p] = e;
                self.drop_queue(p);
                if let Some(q) = self.shared_paths[p].take_queue(self.qid) {
                    self.paths[p].install(q);
                }
            }
            if self.paths[p].q.is_none() {
                continue;
            }
            if self.shared_paths[p].is_failed() {
                // The monitor (or another thread) saw the path go.
                let why = self.shared_paths[p]
                    .failure()
                    .map(|f| f.0)
                    .unwrap_or_else(|| "path lost".into());
                self.fail_path(p, &why, base);
                continue;
            }
            let r = self.paths[p]
                .q
                .as_mut()
                .expect("checked")
                .poll(Some(Duration::ZERO));
            // Completions that arrived before a failure count.
            if self.paths[p]
                .q
                .as_ref()
                .is_some_and(|q| q.completions_ready() > 0)
            {
                self.now_ns = base.elapsed().as_nanos() as u64;
            }
            while let Some(c) = self.paths[p].q.as_mut().and_then(|q| q.next_completion()) {
                done += 1;
                let now = self.now_ns;
                self.complete(p, &c, now);
            }
            if let Err(e) = r {
                self.fail_path(p, &format!("I/O queue {}: {e}", self.qid), base);
            }
        }
        done
    }

    /// Forget the statistics gathered so far (end of the ramp): counts,
    /// latencies and errors start again; commands in flight are kept and
    /// count when they complete. Called once per run, not per I/O.
    pub fn reset_stats(&mut self) {
        self.read.reset();
        self.write.reset();
        for ps in &mut self.pstats {
            ps.read.reset();
            ps.write.reset();
            ps.failed_over = 0;
            ps.retried = 0;
            ps.errors = 0;
            ps.first_ns = 0;
            ps.last_ns = 0;
        }
        self.errors = 0;
        self.first_error = None;
    }

    pub fn report(mut self) -> (QueueReport, Vec<PathStats>) {
        let lost = self.outstanding() as u64;
        let zc = self
            .paths
            .iter()
            .filter_map(|p| p.q.as_ref())
            .fold((0, 0), |(c, k), q| {
                let (a, b, _) = q.zc_stats();
                (c + a, k + b)
            });
        for ps in &self.pstats {
            self.read.merge(&ps.read);
            self.write.merge(&ps.write);
        }
        (
            QueueReport {
                qid: self.qid,
                core: self.core,
                thread: self.thread,
                ran_on: self.ran_on,
                read: self.read,
                write: self.write,
                errors: self.errors,
                first_error: self.first_error,
                verified_blocks: self.verified_blocks,
                mismatched_blocks: self.mismatched_blocks,
                mismatches: self.mismatches,
                lost,
                zc_calls: zc.0,
                zc_copied: zc.1,
            },
            self.pstats,
        )
    }
}

/// The path choice: `view(p)` is None for a path without a queue, else
/// its class (0 optimized, 1 non-optimized, 2 unusable) and commands in
/// flight. Only paths of the best class present are candidates; `rr` is
/// the last path chosen (round-robin goes on from it; queue-depth breaks
/// ties in the same order).
#[inline]
fn choose_path(
    policy: Policy,
    rr: &mut usize,
    n: usize,
    view: impl Fn(usize) -> Option<(u8, usize)>,
) -> Option<usize> {
    let mut best = 2u8;
    for p in 0..n {
        if let Some((c, _)) = view(p) {
            best = best.min(c);
        }
    }
    if best >= 2 {
        return None;
    }
    let mut pick = None;
    let mut least = usize::MAX;
    for k in 1..=n {
        let p = (*rr + k) % n;
        if let Some((c, f)) = view(p) {
            if c != best {
                continue;
            }
            if policy == Policy::RoundRobin {
                pick = Some(p);
                break;
            }
            if f < least {
                least = f;
                pick = Some(p);
            }
        }
    }
    if let Some(p) = pick {
        *rr = p;
    }
    pick
}

fn op_name(op: u8) -> &'static str {
    match op {
        OP_READ => "read",
        OP_WRITE => "write",
        _ => "verify read-back",
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
fn wait_any(fds: &mut [libc::pollfd], qs: &[Worker], timeout: Duration) {
    let mut n = 0;
    let mut buffered = false;
    for w in qs {
        for pq in &w.paths {
            if let (Some(q), Some(p)) = (pq.q.as_ref(), fds.get_mut(n)) {
                p.fd = q.raw_fd();
                p.events = q.poll_events();
                p.revents = 0;
                buffered |= q.has_buffered();
                n += 1;
            }
        }
    }
    // Decrypted TLS bytes wait in a queue: look at the sockets, do not sleep.
    let ms = if buffered {
        0
    } else {
        crate::transport::timeout_ms(Some(timeout)).max(1)
    };
    // SAFETY: the first `n` entries of `fds` are valid pollfds.
    unsafe {
        libc::poll(fds.as_mut_ptr(), n as libc::nfds_t, ms);
    }
}

/// Err when the thread's workers have I/Os in flight on a path (not only
/// waiting for one) after `stall` without a completion.
fn stalled(qs: &[Worker], phase: usize, stall: Duration) -> Result<()> {
    let stuck: usize = qs.iter().map(Worker::in_flight).sum();
    if stuck == 0 {
        return Ok(());
    }
    let paths = qs
        .iter()
        .find(|w| w.in_flight() > 0)
        .map(Worker::path_summary)
        .unwrap_or_default();
    Err(Error::Timeout(format!(
        "{}: {stuck} I/O(s) never completed: no completion for {stall:?} (the I/O timeout \
         --timeout plus the keep-alive timeout) from {paths}",
        if phase == 1 {
            "verify read-back"
        } else {
            "I/O"
        }
    )))
}

/// Run one thread's workers until `deadline`, drain (at most `io_timeout`
/// after it), then (verify) read back. Neither phase may stall: when I/Os
/// are in flight and none of the thread's queues completed anything for
/// `stall` (the I/O timeout plus the keep-alive timeout: longer than a
/// keep-alive takes to find a frozen path, so with several paths the
/// commands of a frozen one move first) (a target that stopped answering without closing: a frozen
/// process, a machine gone from an RDMA fabric that reports no error), the
/// thread fails naming how many I/Os never completed and on which paths
/// (they are also reported per queue). The read-back has no overall limit:
/// it reads every written unit.
/// With `ramp_pending`, every worker's statistics restart when the main
/// thread sets `shared.ramp_over` (the end of the ramp).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_thread(
    qs: &mut [Worker],
    tix: usize,
    shared: &Shared,
    base: Instant,
    deadline: Instant,
    io_timeout: Duration,
    stall: Duration,
    spin: Duration,
    mut ramp_pending: bool,
) -> Result<()> {
    let mut last_progress = Instant::now();
    let nfds: usize = qs.iter().map(|w| w.paths.len()).sum();
    let mut fds = vec![
        libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0
        };
        nfds
    ];
    let mut running = true;
    let mut drain_until = deadline + io_timeout;
    let mut ios_total = 0u64;
    let mut bytes_total = 0u64;
    let mut last_completion = Instant::now();
    // Phase 0: timed run. Phase 1 (verify): read-back.
    for phase in 0..2 {
        if phase == 1 {
            if !qs.iter().any(|w| w.verify) {
                break;
            }
            running = true;
            last_completion = Instant::now();
            drain_until = last_completion + io_timeout;
        }
        loop {
            let now = Instant::now();
            let now_ns = now.saturating_duration_since(base).as_nanos() as u64;
            // End of the ramp: one check per loop turn, not per I/O.
            if ramp_pending && shared.ramp_over.load(Ordering::Acquire) {
                ramp_pending = false;
                qs.iter_mut().for_each(Worker::reset_stats);
            }
            if running && (now >= deadline || shared.stop.load(Ordering::Relaxed)) && phase == 0 {
                running = false;
            }
            let mut progress = false;
            let mut outstanding = 0;
            for w in qs.iter_mut() {
                w.reissue()?;
                if running && w.start_all(phase, now_ns)? {
                    progress = true;
                }
                let n = w.poll_paths(base);
                if n > 0 {
                    progress = true;
                    last_completion = now;
                    if phase == 1 {
                        drain_until = last_completion + io_timeout;
                    }
                    ios_total += n as u64;
                    bytes_total += n as u64 * w.io_size as u64;
                    // Refill at once: the next poll sends these (as the
                    // completions' own re-submission would).
                    w.reissue()?;
                    if running {
                        let t = w.now_ns;
                        w.start_all(phase, t)?;
                    }
                }
                outstanding += w.outstanding();
            }
            shared.ios[tix].0.store(ios_total, Ordering::Relaxed);
            shared.bytes[tix].0.store(bytes_total, Ordering::Relaxed);
            if phase == 1 && running && outstanding == 0 {
                // Nothing left to read back.
                if !qs.iter().any(|w| w.readback_next < w.units) {
                    running = false;
                }
            }
            if !running && outstanding == 0 {
                break;
            }
            // `now` (this turn's start) is recent enough for these
            // second-scale limits: no further clock reads per turn.
            if outstanding > 0 && now.saturating_duration_since(last_completion) >= stall {
                stalled(qs, phase, stall)?;
            }
            if !running && Instant::now() >= drain_until {
                break; // lost I/Os are reported per queue
            }
            if progress {
                last_progress = now;
            } else if !spin.is_zero()
                && outstanding > 0
                && now.saturating_duration_since(last_progress) < spin
            {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn picks(policy: Policy, view: &[Option<(u8, usize)>], times: usize) -> Vec<Option<usize>> {
        let mut rr = 0;
        (0..times)
            .map(|_| choose_path(policy, &mut rr, view.len(), |p| view[p]))
            .collect()
    }

    #[test]
    fn round_robin_over_the_best_class_only() {
        // All optimized: each in turn.
        let all = [Some((0, 0)), Some((0, 0)), Some((0, 0))];
        assert_eq!(
            picks(Policy::RoundRobin, &all, 4),
            [Some(1), Some(2), Some(0), Some(1)]
        );
        // One optimized, one non-optimized, one inaccessible: only the optimized.
        let mixed = [Some((1, 0)), Some((2, 0)), Some((0, 9))];
        assert_eq!(picks(Policy::RoundRobin, &mixed, 3), [Some(2); 3]);
        // No optimized left: the non-optimized ones, in turn; a lost path (None) never.
        let degraded = [Some((1, 0)), None, Some((2, 0)), Some((1, 0))];
        assert_eq!(
            picks(Policy::RoundRobin, &degraded, 3),
            [Some(3), Some(0), Some(3)]
        );
        // Nothing usable.
        let none = [Some((2, 0)), None];
        assert_eq!(picks(Policy::RoundRobin, &none, 1), [None]);
    }

    #[test]
    fn queue_depth_takes_the_least_busy_of_the_best_class() {
        let v = [Some((0, 5)), Some((0, 2)), Some((1, 0)), Some((0, 7))];
        assert_eq!(picks(Policy::QueueDepth, &v, 2), [Some(1), Some(1)]);
        // Ties go on from the last choice.
        let tie = [Some((0, 3)), Some((0, 3))];
        assert_eq!(
            picks(Policy::QueueDepth, &tie, 3),
            [Some(1), Some(0), Some(1)]
        );
        // The idle non-optimized path is not taken while an optimized one exists.
        let v = [Some((1, 0)), Some((0, 30))];
        assert_eq!(picks(Policy::QueueDepth, &v, 1), [Some(1)]);
    }
}
