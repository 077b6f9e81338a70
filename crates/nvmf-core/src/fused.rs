//! Fused Compare and Write (NVMe Base Specification, "Fused Operations";
//! what VMware VMFS uses for its atomic test-and-set locks, ATS).
//!
//! Owns [`WriteGate`] (per bdev: how many write-group commands are in
//! flight, and the gate one compare-and-write at a time closes), [`CawOp`]
//! (one fused Compare + Write being executed on a queue, moved on by its
//! queue pair), the checks of a pair (`start`) and the limits reported in
//! Identify (FUSES, ACWU). Pairing the two halves on their queue in
//! arrival order is the request engine's (`request/engine.rs`).
//!
//! Atomicity: a compare-and-write must not interleave with any other write
//! to its range, from any queue, reactor or host of this process. Every
//! write-group command (Write, Write Zeroes, Dataset Management, Copy)
//! counts itself in its bdev's gate before it reaches the backend and
//! uncounts itself when the backend is done (`enter` / `leave`: one atomic
//! add on a counter shared by the queues of one shard, and one load of the
//! gate; reads pay nothing). A compare-and-write first closes the gate
//! (one at a time per bdev; later ones wait), so every write that has not
//! counted itself yet waits (the queue parks it, as for QoS, and offers it
//! again each time slice); then it waits until the count is zero, i.e.
//! every write already in a backend is done; only then does it read,
//! compare and write, and it opens the gate when its write is done. The
//! count and the gate check are sequentially consistent on both sides, so
//! a write either sees the gate closed or is seen counted. The gate covers
//! the whole bdev, not only the range: simpler, and a compare-and-write
//! (one or a few blocks) holds it for one read and one write.
//!
//! Not covered: writes through another process (a second gateway on the
//! same RBD image, issue 25).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use nvmf_wire::command::Command;
use nvmf_wire::opcode::IoOpcode;
use nvmf_wire::status::Status;

use crate::backend::{Backend, BlockOp, CompletionSink, IoTag, Submitted};
use crate::namespace::Namespace;
use crate::request::AlignedBuf;

/// FUSE field values (command dword 0 bits 9:8).
pub const FUSE_FIRST: u8 = 1;
pub const FUSE_SECOND: u8 = 2;

/// Identify Controller FUSES bit 0: Compare and Write is supported.
pub const FUSES_COMPARE_AND_WRITE: u16 = 1;
/// The most blocks one compare-and-write may cover; reported as ACWU
/// (0's based). Atomicity holds for any length here; the limit keeps the
/// time the gate is closed short. VMFS uses one block.
pub const CAW_MAX_BLOCKS: u32 = 16;

/// A lone fused half (a first not followed by its second, or a second
/// without a first).
pub const MISSING_FUSED: Status = Status::ABORTED_MISSING_FUSED;
/// The other half of a fused operation failed.
pub const FAILED_FUSED: Status = Status::ABORTED_FAILED_FUSED;
const INVALID_FIELD: Status = Status::INVALID_FIELD.with_dnr();

/// Counters per gate; queues pick theirs round robin at creation.
pub const GATE_SHARDS: usize = 16;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard(AtomicI64);

/// After a compare-and-write opens a gate that writes found closed, the
/// next one waits this long before it may close it again, so the writes
/// waiting (offered again every 1 ms time slice) get their turn even when
/// a host sends nothing but compare-and-writes.
pub const WRITERS_TURN: Duration = Duration::from_millis(2);

/// One bdev's write gate (see the module documentation).
#[derive(Debug, Default)]
pub struct WriteGate {
    /// A compare-and-write owns the bdev's writes.
    closed: AtomicBool,
    /// A write found the gate closed since it was last closed.
    refused: AtomicBool,
    /// When it was last opened (`qos::now_ns`).
    opened_ns: AtomicU64,
    /// Write-group commands in flight, summed over the shards.
    shards: [Shard; GATE_SHARDS],
    /// Compare-and-writes executed, and how many of them miscompared.
    caws: AtomicU64,
    miscompares: AtomicU64,
}

impl WriteGate {
    /// A write-group command is about to reach the backend: counted, and
    /// true; false (not counted) while a compare-and-write holds the gate:
    /// the command must wait.
    #[inline]
    pub fn enter(&self, shard: usize) -> bool {
        let s = &self.shards[shard % GATE_SHARDS].0;
        s.fetch_add(1, SeqCst);
        if self.closed.load(SeqCst) {
            s.fetch_sub(1, SeqCst);
            self.refused.store(true, Relaxed);
            return false;
        }
        true
    }

    /// A counted command is done with the backend.
    #[inline]
    pub fn leave(&self, shard: usize) {
        self.shards[shard % GATE_SHARDS].0.fetch_sub(1, SeqCst);
    }

    /// Whether a compare-and-write holds the gate.
    pub fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    /// Write-group commands counted in flight.
    pub fn in_flight(&self) -> i64 {
        self.shards.iter().map(|s| s.0.load(SeqCst)).sum()
    }

    /// (compare-and-writes executed, miscompares).
    pub fn counts(&self) -> (u64, u64) {
        (self.caws.load(Relaxed), self.miscompares.load(Relaxed))
    }

    fn try_close(&self) -> bool {
        if self.refused.load(Relaxed) {
            let since = crate::qos::now_ns().saturating_sub(self.opened_ns.load(Relaxed));
            if since < WRITERS_TURN.as_nanos() as u64 {
                // Writes were kept waiting: their turn first.
                return false;
            }
        }
        let closed = self
            .closed
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_ok();
        if closed {
            self.refused.store(false, Relaxed);
        }
        closed
    }

    fn open(&self) {
        self.opened_ns.store(crate::qos::now_ns(), Relaxed);
        self.closed.store(false, SeqCst);
    }
}

/// The gate of the bdev `backend` is (namespaces on one bdev share it, as
/// their writes land on the same blocks). Control path (a lock).
pub fn gate_for(backend: &Arc<dyn Backend>) -> Arc<WriteGate> {
    static GATES: Mutex<Option<HashMap<usize, Weak<WriteGate>>>> = Mutex::new(None);
    // A gate lives only as long as namespaces holding the backend too, so
    // the address is not reused while its entry can still be upgraded.
    let key = Arc::as_ptr(backend) as *const () as usize;
    let mut g = GATES.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(gate) = map.get(&key).and_then(Weak::upgrade) {
        return gate;
    }
    map.retain(|_, w| w.strong_count() > 0);
    let gate = Arc::new(WriteGate::default());
    map.insert(key, Arc::downgrade(&gate));
    gate
}

/// A gate held until every counted write has finished (Reservation
/// Acquire with Preempt and Abort: no write of a preempted host may land
/// after the command completes). Dropped, it opens the gate.
#[derive(Debug)]
pub(crate) struct GateHold {
    gate: Arc<WriteGate>,
    holding: bool,
}

impl GateHold {
    pub fn new(gate: &Arc<WriteGate>) -> GateHold {
        GateHold {
            gate: gate.clone(),
            holding: false,
        }
    }

    /// True once this holds the gate and no counted write is left (then
    /// `release`). Writes that come meanwhile wait, parked.
    pub fn drained(&mut self) -> bool {
        if !self.holding {
            if !self.gate.try_close() {
                return false;
            }
            self.holding = true;
        }
        self.gate.in_flight() == 0
    }

    pub fn release(&mut self) {
        if std::mem::take(&mut self.holding) {
            self.gate.open();
        }
    }
}

impl Drop for GateHold {
    fn drop(&mut self) {
        self.release();
    }
}

/// A write-group command counted in a gate for as long as this lives (a
/// Copy in flight holds one).
#[derive(Debug)]
pub(crate) struct GateTicket {
    gate: Arc<WriteGate>,
    shard: u8,
}

impl GateTicket {
    /// Counted, or `None` while a compare-and-write holds the gate.
    pub fn enter(gate: &Arc<WriteGate>, shard: u8) -> Option<GateTicket> {
        gate.enter(usize::from(shard)).then(|| GateTicket {
            gate: gate.clone(),
            shard,
        })
    }
}

impl Drop for GateTicket {
    fn drop(&mut self) {
        self.gate.leave(usize::from(self.shard));
    }
}

/// A queue's counted write-group commands still in a backend, per
/// namespace (uncounted by their completions' `IoTag::nsid`). What is
/// left when the queue goes away is uncounted when this is dropped:
/// after its backend operations are all done (`QueuePair::hand_over`).
#[derive(Debug, Default)]
pub(crate) struct GatedWrites {
    shard: u8,
    by_ns: Vec<(u32, Arc<WriteGate>, u32)>,
}

impl GatedWrites {
    pub fn new(shard: u8) -> GatedWrites {
        GatedWrites {
            shard,
            by_ns: Vec::new(),
        }
    }

    /// A counted command to namespace `nsid` (whose gate is `gate`) went
    /// into its backend.
    #[inline]
    pub fn submitted(&mut self, nsid: u32, gate: &Arc<WriteGate>) {
        match self
            .by_ns
            .iter_mut()
            .find(|(n, g, _)| *n == nsid && Arc::ptr_eq(g, gate))
        {
            Some((_, _, k)) => *k += 1,
            None => {
                self.by_ns.retain(|(_, _, k)| *k > 0);
                self.by_ns.push((nsid, gate.clone(), 1));
            }
        }
    }

    /// A counted command to namespace `nsid` completed. (Should a
    /// namespace ID have been reused for another bdev while commands to
    /// the old one were in flight, the oldest entry is uncounted first:
    /// each gate still gets exactly its own count back once all are done.)
    #[inline]
    pub fn completed(&mut self, nsid: u32) {
        if let Some((_, g, k)) = self.by_ns.iter_mut().find(|(n, _, k)| *n == nsid && *k > 0) {
            *k -= 1;
            g.leave(usize::from(self.shard));
        }
    }
}

impl Drop for GatedWrites {
    fn drop(&mut self) {
        for (_, g, k) in self.by_ns.drain(..) {
            for _ in 0..k {
                g.leave(usize::from(self.shard));
            }
        }
    }
}

/// The next queue's shard.
pub(crate) fn next_shard() -> u8 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    (NEXT.fetch_add(1, Relaxed) % GATE_SHARDS) as u8
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the gate (another compare-and-write holds it).
    Gate,
    /// Holding the gate, waiting for counted writes to finish.
    Drain,
    /// The read is in the backend.
    Reading,
    /// The write is in the backend.
    Writing,
    Done,
}

/// One fused Compare and Write being executed (own buffers: the range as
/// read, the host's compare data and its write data).
#[derive(Debug)]
pub(crate) struct CawOp {
    /// CIDs of the Compare and of the Write (backend operations are tagged
    /// with the Write's).
    pub cmp_cid: u16,
    pub write_cid: u16,
    ns: Arc<Namespace>,
    /// The host, for the reservation check once the gate is held.
    hostid: [u8; 16],
    slba: u64,
    fua: bool,
    read: AlignedBuf,
    expected: Vec<u8>,
    data: AlignedBuf,
    phase: Phase,
}

/// The statuses of the Compare and of the Write.
pub(crate) type PairStatus = (Status, Status);

impl CawOp {
    /// Waiting for the gate or for writes to drain (nothing in a backend):
    /// the queue must be offered a turn every time slice.
    pub fn waiting(&self) -> bool {
        matches!(self.phase, Phase::Gate | Phase::Drain)
    }

    /// Moves on as far as it can without a backend completion. `Some`
    /// once both halves have their status.
    pub fn advance(&mut self, sink: &Arc<CompletionSink>) -> Option<PairStatus> {
        let gate = self.ns.write_gate().clone();
        if self.phase == Phase::Gate {
            if !gate.try_close() {
                return None;
            }
            self.phase = Phase::Drain;
            // Checked again with the gate held: a Preempt and Abort that
            // completed while this waited must not be followed by its
            // write.
            let r = self.ns.reservations();
            if r.held() {
                if let Err(st) = r.check(&self.hostid, true) {
                    return Some(self.finish(FAILED_FUSED, st));
                }
            }
        }
        if self.phase == Phase::Drain {
            if gate.in_flight() > 0 {
                return None;
            }
            self.phase = Phase::Reading;
            let len = self.expected.len();
            self.read.grow(len);
            let tag = self.tag(false);
            let ns = self.ns.clone();
            // The backend may keep a pointer into `read` until it completes
            // (its allocation does not move with the op).
            let sub = ns.backend().submit(
                BlockOp::Read {
                    lba: self.slba,
                    buf: &mut self.read[..len],
                },
                tag,
                sink,
            );
            return match sub {
                Submitted::Pending => None,
                Submitted::Done(st) => self.read_done(st, sink),
                Submitted::ZeroData => self.read_done(Status::SUCCESS, sink),
            };
        }
        None
    }

    /// Its backend operation (read or write) ended with `st`.
    pub fn completed(&mut self, st: Status, sink: &Arc<CompletionSink>) -> Option<PairStatus> {
        match self.phase {
            Phase::Reading => self.read_done(st, sink),
            Phase::Writing => Some(self.finish(Status::SUCCESS, st)),
            _ => None,
        }
    }

    fn read_done(&mut self, st: Status, sink: &Arc<CompletionSink>) -> Option<PairStatus> {
        if !st.is_success() {
            return Some(self.finish(st, FAILED_FUSED));
        }
        let gate = self.ns.write_gate();
        gate.caws.fetch_add(1, Relaxed);
        if self.read.get(..self.expected.len()) != Some(&self.expected[..]) {
            gate.miscompares.fetch_add(1, Relaxed);
            return Some(self.finish(crate::io::COMPARE_FAILURE, FAILED_FUSED));
        }
        self.phase = Phase::Writing;
        let len = self.expected.len();
        let tag = self.tag(true);
        let ns = self.ns.clone();
        let sub = ns.backend().submit(
            BlockOp::Write {
                lba: self.slba,
                buf: &mut self.data[..len],
                fua: self.fua,
            },
            tag,
            sink,
        );
        match sub {
            Submitted::Pending => None,
            Submitted::Done(st) => Some(self.finish(Status::SUCCESS, st)),
            Submitted::ZeroData => Some(self.finish(Status::SUCCESS, Status::SUCCESS)),
        }
    }

    fn finish(&mut self, cmp: Status, write: Status) -> PairStatus {
        self.release();
        (cmp, write)
    }

    /// Opens the gate if this op holds it.
    fn release(&mut self) {
        if matches!(self.phase, Phase::Drain | Phase::Reading | Phase::Writing) {
            self.ns.write_gate().open();
        }
        self.phase = Phase::Done;
    }

    fn tag(&self, write: bool) -> IoTag {
        IoTag {
            cid: self.write_cid,
            bytes: 0,
            write,
            nsid: 0,
        }
    }
}

impl Drop for CawOp {
    /// A queue that goes away keeps its ops until their backend operations
    /// are done (`QueuePair::hand_over`): only then is the gate opened.
    fn drop(&mut self) {
        self.release();
    }
}

/// The checks of a fused pair `first` (must be Compare) + `second` (must
/// be Write) whose namespace `ns` the caller looked up for each half
/// (`ns_cmp`, `ns_write`: the look-up's answer for that half, ANA and
/// reservations applied). Returns the op to run, or both statuses: the
/// half that fails gets its error, the other Command Aborted due to
/// Failed Fused Command.
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    first: &Command,
    first_data: &[u8],
    second: &Command,
    second_data: &[u8],
    ns_cmp: Result<&Arc<Namespace>, Status>,
    ns_write: Result<&Arc<Namespace>, Status>,
    hostid: [u8; 16],
    max_transfer: u32,
    write_cache: bool,
) -> Result<CawOp, PairStatus> {
    if first.opcode() != IoOpcode::Compare as u8 {
        return Err((INVALID_FIELD, FAILED_FUSED));
    }
    if second.opcode() != IoOpcode::Write as u8 {
        return Err((FAILED_FUSED, INVALID_FIELD));
    }
    if first.nsid() != second.nsid() || first.slba() != second.slba() || first.nlb() != second.nlb()
    {
        // The two halves must name the same blocks.
        return Err((INVALID_FIELD, FAILED_FUSED));
    }
    let ns = match (ns_cmp, ns_write) {
        (Ok(ns), Ok(_)) => ns,
        // Both halves refused alike (unknown or inactive namespace, an
        // ANA state of this path): each gets that status, so a host
        // retries the pair on another path.
        (Err(a), Err(b)) => return Err((a, b)),
        (Err(a), Ok(_)) => return Err((a, FAILED_FUSED)),
        (Ok(_), Err(b)) => return Err((FAILED_FUSED, b)),
    };
    if ns.read_only() {
        return Err((FAILED_FUSED, Status::NS_WRITE_PROTECTED.with_dnr()));
    }
    let nlb = first.nlb();
    let len = u64::from(nlb) << ns.block_shift();
    if nlb > CAW_MAX_BLOCKS || len > u64::from(max_transfer) {
        return Err((INVALID_FIELD, FAILED_FUSED));
    }
    if first_data.len() as u64 != len {
        return Err((Status::SGL_DATA_LENGTH_INVALID.with_dnr(), FAILED_FUSED));
    }
    if second_data.len() as u64 != len {
        return Err((FAILED_FUSED, Status::SGL_DATA_LENGTH_INVALID.with_dnr()));
    }
    let slba = first.slba();
    if !matches!(slba.checked_add(u64::from(nlb)), Some(end) if end <= ns.num_blocks()) {
        return Err((Status::LBA_OUT_OF_RANGE.with_dnr(), FAILED_FUSED));
    }
    let mut data = AlignedBuf::new();
    data.grow(len as usize);
    data[..len as usize].copy_from_slice(second_data);
    Ok(CawOp {
        cmp_cid: first.cid(),
        write_cid: second.cid(),
        ns: ns.clone(),
        hostid,
        slba,
        fua: second.fua() || !write_cache,
        read: AlignedBuf::new(),
        expected: first_data.to_vec(),
        data,
        phase: Phase::Gate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MallocBackend;

    #[test]
    fn gate_counts_and_refuses_while_closed() {
        let g = WriteGate::default();
        assert!(g.enter(3));
        assert!(g.enter(19));
        assert_eq!(g.in_flight(), 2);
        assert!(g.try_close());
        assert!(!g.try_close(), "one compare-and-write at a time");
        assert!(!g.enter(1), "a write waits while the gate is closed");
        assert_eq!(g.in_flight(), 2, "a refused write is not counted");
        g.leave(3);
        g.leave(19);
        assert_eq!(g.in_flight(), 0);
        g.open();
        assert!(g.enter(1));
        g.leave(1);
        // A write was refused: the next compare-and-write waits its turn.
        assert!(!g.try_close(), "writers' turn after a refusal");
        std::thread::sleep(WRITERS_TURN);
        assert!(g.try_close());
        g.open();
        assert!(g.try_close(), "no write refused meanwhile: no wait");
        g.open();
    }

    #[test]
    fn namespaces_on_one_bdev_share_a_gate() {
        let a: Arc<dyn Backend> = Arc::new(MallocBackend::new("a", 512, 8).unwrap());
        let b: Arc<dyn Backend> = Arc::new(MallocBackend::new("b", 512, 8).unwrap());
        let (ga, ga2, gb) = (gate_for(&a), gate_for(&a), gate_for(&b));
        assert!(Arc::ptr_eq(&ga, &ga2));
        assert!(!Arc::ptr_eq(&ga, &gb));
    }
}
