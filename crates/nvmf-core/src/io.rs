//! NVM I/O command execution: the data path.
//!
//! Owns Read, Write, Flush, Write Zeroes, Dataset Management (deallocate),
//! Compare and Verify (`start_check`; their reads go to a buffer of their
//! own, finished by `queue.rs` when the read ends), and Copy (`start_copy`:
//! sources read into a buffer of its own, then written; `CopyOp::step`
//! moves it on as its backend operations end)
//! checks and their hand-off to the namespace's backend. Runs on the reactor
//! thread that owns the queue pair: no locks, no allocation, every field from
//! the wire range-checked. Order of checks: namespace (Invalid Namespace,
//! Internal Path Error while it is being removed), transfer size (Invalid Field beyond MDTS, Data SGL
//! Length Invalid when the data is not NLB × block size, as nvmet), LBA range
//! (LBA Out of Range).
//!
//! Write protection: on a read-only namespace (its backend's `read_only`,
//! e.g. an rbd bdev created with `read_only`) Write, Write Zeroes and
//! Dataset Management with Deallocate get Namespace Is Write Protected
//! (with DNR) right after the namespace lookup, before any other check,
//! and never reach the backend; Flush succeeds at once (nothing was
//! written); Read and DSM without Deallocate are served. One plain bool
//! read from the namespace per I/O.
//!
//! Reservations: while one is held on a namespace (one atomic load per
//! command tells), a command the reservation type forbids this host gets
//! Reservation Conflict, right after the ANA check (`reservation.rs`; the
//! read command group is Read, the write group everything else here).
//!
//! ANA: through a path whose group is inaccessible, in persistent loss or in
//! change, every command to a namespace of that group gets the ANA status
//! (`ana.rs`), checked right after the namespace lookup.
//!
//! QoS (docs/QOS.md): `qos_wait`, called by the queue pair before
//! `execute`, says whether a Read or Write must wait for its bdev's rate
//! limit tokens (commands that fail these checks anyway never wait).
//!
//! Fused Compare and Write (`fused.rs`): every write-group command (Write,
//! Write Zeroes, Dataset Management deallocate, Copy) counts itself in its
//! bdev's write gate around the backend call (`gated`); while a
//! compare-and-write holds the gate it is not executed and the queue parks
//! it (`GATE_CLOSED`). Reads, Compare and Verify pay nothing.
//!
//! Volatile write cache: with the controller's cache disabled (Set Features
//! 06h = 0; `write_cache` false) every Write and Write Zeroes is executed
//! with FUA, so it is durable when it completes.

use std::sync::Arc;

use nvmf_wire::command::Command;
use nvmf_wire::opcode::IoOpcode;
use nvmf_wire::status::Status;

use crate::ana::{io_status, PathAna};
use crate::backend::{BlockOp, CompletionSink, DsmRanges, IoTag, Submitted};
use crate::controller::QueueStats;
use crate::error::{INVALID_FIELD, INVALID_NAMESPACE, INVALID_OPCODE, SGL_LENGTH_INVALID};
use crate::namespace::{Namespace, NamespaceTable};
use crate::qos::BdevQos;

/// Dataset Management: most ranges in one command.
pub const DSM_MAX_RANGES: usize = 256;
/// Dataset Management: bytes per range descriptor.
pub const DSM_RANGE_SIZE: usize = 16;
/// Dataset Management CDW11 bit 2: Attribute – Deallocate.
const DSM_AD: u32 = 1 << 2;

const LBA_OUT_OF_RANGE: Status = Status::LBA_OUT_OF_RANGE.with_dnr();
/// A command that would modify a write-protected namespace.
const WRITE_PROTECTED: Status = Status::NS_WRITE_PROTECTED.with_dnr();

/// A command that reaches a namespace being removed (namespace or subsystem
/// delete, a live reconfiguration) in the moment before this queue sees the
/// new table or closes: a path-related status (SCT 3h) with DNR clear. The
/// Linux host treats any SCT 3h status on a multipath device as a path error
/// and fails the I/O over (`nvme_failover_req`: another live path, or it
/// waits for this controller's reconnect), never to the application;
/// Namespace Not Ready (generic) would be retried in place five times with
/// no delay and then fail the I/O. Internal Path Error rather than an ANA
/// status: it says nothing about ANA groups, so a host does not re-read the
/// ANA log for it.
const NS_GOING_AWAY: Status = Status::INTERNAL_PATH_ERROR;

/// The namespace a command names, served through this path (ANA) to
/// this host (a reservation held on it: `write` says whether the command
/// is of the write command group; one atomic load when none is held).
#[inline]
pub(crate) fn lookup<'t>(
    table: &'t NamespaceTable,
    ana: Option<&PathAna>,
    host: &Host,
    nsid: u32,
    write: bool,
) -> Result<&'t Arc<Namespace>, Status> {
    match table.get(nsid) {
        Some(ns) if ns.is_active() => {
            if let Some(st) = ana.and_then(|p| io_status(p, ns.anagrpid())) {
                return Err(st);
            }
            if ns.reservations().held() {
                ns.reservations().check(&host.hostid, write)?;
            }
            Ok(ns)
        }
        Some(_) => Err(NS_GOING_AWAY),
        None => Err(INVALID_NAMESPACE),
    }
}

/// Who sends the commands of a queue, as the I/O path needs it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host {
    /// The 128-bit host identifier from Connect (reservations' registrant).
    pub hostid: [u8; 16],
    /// The queue's counter in write gates (`fused.rs`).
    pub shard: u8,
}

/// A write-group command found its bdev's write gate closed (a fused
/// Compare and Write runs): nothing was done, the queue parks it. Never
/// sent to a host.
pub(crate) const GATE_CLOSED: Status = Status::new(7, 0xFE);

/// The reservation check of a write-group command again, now that it is
/// counted in the write gate: a Reservation Acquire with Preempt and Abort
/// that completed since the first check (in `lookup`) waited for every
/// counted write, so a write of the preempted host that got past the first
/// check is either counted (and waited for) or refused here. One atomic
/// load while no reservation is held.
#[inline(always)]
fn recheck_reservation(ns: &Namespace, host: &Host) -> Result<(), Status> {
    if ns.reservations().held() {
        return recheck_held(ns, host);
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn recheck_held(ns: &Namespace, host: &Host) -> Result<(), Status> {
    ns.reservations().check(&host.hostid, true)
}

/// Counts a write-group command in its bdev's write gate (`fused.rs`) for
/// as long as `submit` keeps it: uncounted at once unless the backend
/// answered Pending (then the queue uncounts it on its completion, by the
/// tag's `nsid`). `GATE_CLOSED` while a compare-and-write holds the gate.
#[inline(always)]
fn gated(ns: &Namespace, host: &Host, submit: impl FnOnce() -> Submitted) -> Submitted {
    let gate = ns.write_gate();
    if !gate.enter(usize::from(host.shard)) {
        return Submitted::Done(GATE_CLOSED);
    }
    if let Err(st) = recheck_reservation(ns, host) {
        gate.leave(usize::from(host.shard));
        return Submitted::Done(st);
    }
    let sub = submit();
    if !matches!(sub, Submitted::Pending) {
        gate.leave(usize::from(host.shard));
    }
    sub
}

#[inline]
fn in_range(ns: &Namespace, slba: u64, nlb: u64) -> bool {
    matches!(slba.checked_add(nlb), Some(end) if end <= ns.num_blocks())
}

/// Execute one I/O command against the namespace table snapshot.
/// `write_cache`: the controller's volatile write cache is enabled (when
/// not, writes are forced to FUA).
// Always inlined into the queue's `execute_io` (the data path).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn execute(
    table: &NamespaceTable,
    ana: Option<&PathAna>,
    host: &Host,
    cmd: &Command,
    data: &mut [u8],
    max_transfer: u32,
    write_cache: bool,
    stats: &mut QueueStats,
    sink: &Arc<CompletionSink>,
) -> Submitted {
    let op = match IoOpcode::try_from(cmd.opcode()) {
        Ok(op) => op,
        Err(_) => return Submitted::Done(INVALID_OPCODE),
    };
    match op {
        IoOpcode::Read | IoOpcode::Write => read_write(
            table,
            ana,
            host,
            cmd,
            op,
            data,
            max_transfer,
            write_cache,
            stats,
            sink,
        ),
        IoOpcode::Flush => {
            let ns = match lookup(table, ana, host, cmd.nsid(), true) {
                Ok(ns) => ns,
                Err(s) => return Submitted::Done(s),
            };
            if ns.read_only() {
                return Submitted::Done(Status::SUCCESS);
            }
            let tag = IoTag {
                cid: cmd.cid(),
                bytes: 0,
                write: false,
                nsid: 0,
            };
            ns.backend().submit(BlockOp::Flush, tag, sink)
        }
        IoOpcode::WriteZeroes => {
            let ns = match lookup(table, ana, host, cmd.nsid(), true) {
                Ok(ns) => ns,
                Err(s) => return Submitted::Done(s),
            };
            if ns.read_only() {
                return Submitted::Done(WRITE_PROTECTED);
            }
            let slba = cmd.slba();
            let nlb = u64::from(cmd.nlb());
            if !in_range(ns, slba, nlb) {
                return Submitted::Done(LBA_OUT_OF_RANGE);
            }
            let tag = IoTag {
                cid: cmd.cid(),
                bytes: 0,
                write: true,
                nsid: cmd.nsid(),
            };
            gated(ns, host, || {
                ns.backend().submit(
                    BlockOp::WriteZeroes {
                        lba: slba,
                        blocks: nlb,
                        fua: cmd.fua() || !write_cache,
                    },
                    tag,
                    sink,
                )
            })
        }
        IoOpcode::DatasetManagement => dataset_management(table, ana, host, cmd, data, sink),
        _ => Submitted::Done(INVALID_OPCODE),
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn read_write(
    table: &NamespaceTable,
    ana: Option<&PathAna>,
    host: &Host,
    cmd: &Command,
    op: IoOpcode,
    data: &mut [u8],
    max_transfer: u32,
    write_cache: bool,
    stats: &mut QueueStats,
    sink: &Arc<CompletionSink>,
) -> Submitted {
    let write = op == IoOpcode::Write;
    let ns = match lookup(table, ana, host, cmd.nsid(), write) {
        Ok(ns) => ns,
        Err(s) => return Submitted::Done(s),
    };
    if write && ns.read_only() {
        return Submitted::Done(WRITE_PROTECTED);
    }
    let slba = cmd.slba();
    let nlb = u64::from(cmd.nlb()); // 1..=65536
    let len = nlb << ns.block_shift(); // ≤ 2^32
    if len > u64::from(max_transfer) {
        return Submitted::Done(INVALID_FIELD);
    }
    if data.len() as u64 != len {
        return Submitted::Done(SGL_LENGTH_INVALID);
    }
    if !in_range(ns, slba, nlb) {
        return Submitted::Done(LBA_OUT_OF_RANGE);
    }
    let submitted = if write {
        // Counted in the bdev's write gate (`fused.rs`) while the backend
        // has it; written out here rather than through `gated` (a closure
        // the compiler does not inline into this path).
        let gate = ns.write_gate();
        let shard = usize::from(host.shard);
        if !gate.enter(shard) {
            return Submitted::Done(GATE_CLOSED);
        }
        if let Err(st) = recheck_reservation(ns, host) {
            gate.leave(shard);
            return Submitted::Done(st);
        }
        stats.writes += 1;
        let tag = IoTag {
            cid: cmd.cid(),
            bytes: len as u32,
            write,
            nsid: cmd.nsid(),
        };
        let sub = ns.backend().submit(
            BlockOp::Write {
                lba: slba,
                buf: data,
                fua: cmd.fua() || !write_cache,
            },
            tag,
            sink,
        );
        if !matches!(sub, Submitted::Pending) {
            gate.leave(shard);
        }
        sub
    } else {
        let tag = IoTag {
            cid: cmd.cid(),
            bytes: len as u32,
            write,
            nsid: 0,
        };
        stats.reads += 1;
        ns.backend().submit(
            BlockOp::Read {
                lba: slba,
                buf: data,
            },
            tag,
            sink,
        )
    };
    if matches!(
        submitted,
        Submitted::Done(Status::SUCCESS) | Submitted::ZeroData
    ) {
        if write {
            stats.bytes_written += len;
        } else {
            stats.bytes_read += len;
        }
    }
    submitted
}

/// A Compare or Verify in flight: the range is read into its own buffer
/// (never the host's), then checked when the read ends.
#[derive(Debug)]
pub(crate) struct Check {
    pub cid: u16,
    pub buf: crate::request::AlignedBuf,
    /// Compare: the host's data (Verify: `None`).
    pub expected: Option<Vec<u8>>,
}

impl Check {
    /// The command's status, the read having ended with `read`.
    pub fn status(&self, read: Status) -> Status {
        if !read.is_success() {
            return read;
        }
        match &self.expected {
            Some(e) if self.buf.get(..e.len()) != Some(&e[..]) => COMPARE_FAILURE,
            _ => Status::SUCCESS,
        }
    }
}

/// Compare: the data differ.
pub(crate) const COMPARE_FAILURE: Status = Status::COMPARE_FAILURE.with_dnr();

/// Compare (05h, `data` the host's) and Verify (0Ch): commands of the read
/// group (reservations) that read the range into a buffer of their own and
/// compare it with the host's data (Compare) or only check that it reads
/// (Verify; nvmfd keeps no protection information). At most the largest
/// transfer (MDTS; Verify: VSL, reported as the same). A fused Compare
/// is paired by the request engine and run by `fused.rs`; one that reaches
/// here (a queue driven without the engine) is Invalid Field. Returns the
/// submission and the check to finish when the read ends.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_check(
    table: &NamespaceTable,
    ana: Option<&PathAna>,
    host: &Host,
    cmd: &Command,
    data: &[u8],
    max_transfer: u32,
    compare: bool,
    sink: &Arc<CompletionSink>,
) -> Result<(Submitted, Check), Status> {
    if cmd.fuse() != 0 {
        return Err(INVALID_FIELD);
    }
    let ns = lookup(table, ana, host, cmd.nsid(), false)?;
    let slba = cmd.slba();
    let nlb = u64::from(cmd.nlb());
    let len = nlb << ns.block_shift();
    if len > u64::from(max_transfer) {
        return Err(INVALID_FIELD);
    }
    if compare && data.len() as u64 != len {
        return Err(SGL_LENGTH_INVALID);
    }
    if !in_range(ns, slba, nlb) {
        return Err(LBA_OUT_OF_RANGE);
    }
    let mut buf = crate::request::AlignedBuf::new();
    buf.grow(len as usize);
    let tag = IoTag {
        cid: cmd.cid(),
        bytes: 0,
        write: false,
        nsid: 0,
    };
    // The backend may keep a pointer into `buf`'s allocation until the read
    // completes: moving the `AlignedBuf` into the check does not move it.
    let sub = ns.backend().submit(
        BlockOp::Read {
            lba: slba,
            buf: &mut buf[..],
        },
        tag,
        sink,
    );
    Ok((
        sub,
        Check {
            cid: cmd.cid(),
            buf,
            expected: compare.then(|| data.to_vec()),
        },
    ))
}

/// Copy: source ranges one command takes (MSRC + 1).
pub const COPY_MAX_RANGES: usize = 128;
/// Copy: bytes per source range descriptor (format 0).
const COPY_RANGE_SIZE: usize = 32;
const COPY_SIZE_LIMIT: Status = Status::COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr();

/// Copy's limits for a namespace, in blocks: (MSSRL, MCL), so that the
/// whole copy fits one buffer of at most the largest transfer (MDTS).
pub fn copy_limits(block_shift: u8, max_transfer: u32) -> (u16, u32) {
    let mcl = (max_transfer >> block_shift).max(1);
    (mcl.min(u32::from(u16::MAX)) as u16, mcl)
}

/// Where a Copy is: reading its sources into its buffer, or writing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyPhase {
    /// Source reads still in the backend.
    Reading(u32),
    Writing,
}

/// A Copy in flight in an asynchronous backend (its own buffer).
#[derive(Debug)]
pub(crate) struct CopyOp {
    pub cid: u16,
    pub ns: Arc<Namespace>,
    pub buf: crate::request::AlignedBuf,
    pub phase: CopyPhase,
    /// The first error of a source read.
    pub status: Status,
    pub sdlba: u64,
    pub fua: bool,
    /// Counted in the bdev's write gate until the Copy is over (dropped).
    pub _gate: crate::fused::GateTicket,
}

impl CopyOp {
    /// One of its backend operations ended with `st`. Returns the Copy's
    /// status once it is over (`None`: still running; the write may have
    /// been submitted here).
    pub fn step(&mut self, st: Status, sink: &Arc<CompletionSink>) -> Option<Status> {
        match self.phase {
            CopyPhase::Writing => Some(st),
            CopyPhase::Reading(left) => {
                if !st.is_success() && self.status.is_success() {
                    self.status = st;
                }
                let left = left.saturating_sub(1);
                self.phase = CopyPhase::Reading(left);
                if left > 0 {
                    return None;
                }
                if !self.status.is_success() {
                    return Some(self.status);
                }
                self.phase = CopyPhase::Writing;
                match self.write(sink) {
                    Submitted::Pending => None,
                    Submitted::Done(st) => Some(st),
                    Submitted::ZeroData => Some(Status::SUCCESS),
                }
            }
        }
    }

    fn write(&mut self, sink: &Arc<CompletionSink>) -> Submitted {
        let tag = IoTag {
            cid: self.cid,
            bytes: 0,
            write: true,
            nsid: 0,
        };
        let ns = self.ns.clone();
        ns.backend().submit(
            BlockOp::Write {
                lba: self.sdlba,
                buf: &mut self.buf[..],
                fua: self.fua,
            },
            tag,
            sink,
        )
    }
}

/// Copy (19h), source range descriptor format 0, within one namespace:
/// the sources are read into one buffer of the command's own, then written
/// at SDLBA (CDW10-11). A write-group command for reservations; write
/// protection applies. Limits (Identify Namespace MSRC, MSSRL, MCL): at
/// most [`COPY_MAX_RANGES`] ranges and MDTS bytes in all, else Command Size
/// Limit Exceeded. Returns what the backend answered and, when part of it
/// is still running, the Copy to finish later.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn start_copy(
    table: &NamespaceTable,
    ana: Option<&PathAna>,
    host: &Host,
    cmd: &Command,
    data: &[u8],
    max_transfer: u32,
    write_cache: bool,
    sink: &Arc<CompletionSink>,
) -> Result<Option<CopyOp>, Status> {
    let ns = lookup(table, ana, host, cmd.nsid(), true)?;
    if ns.read_only() {
        return Err(WRITE_PROTECTED);
    }
    let cdw12 = cmd.cdw12();
    if (cdw12 >> 8) & 0xF != 0 {
        // Only descriptor format 0.
        return Err(INVALID_FIELD);
    }
    let nr = (cdw12 & 0xFF) as usize + 1;
    if nr > COPY_MAX_RANGES {
        return Err(COPY_SIZE_LIMIT);
    }
    if data.len() < nr * COPY_RANGE_SIZE {
        return Err(SGL_LENGTH_INVALID);
    }
    let (mssrl, mcl) = copy_limits(ns.block_shift(), max_transfer);
    let mut total = 0u64;
    let mut ranges = [(0u64, 0u64); COPY_MAX_RANGES];
    for (i, d) in data.chunks_exact(COPY_RANGE_SIZE).take(nr).enumerate() {
        let slba = u64::from_le_bytes(d[8..16].try_into().unwrap_or([0; 8]));
        let nlb = u64::from(u16::from_le_bytes([d[16], d[17]])) + 1;
        if nlb > u64::from(mssrl) {
            return Err(COPY_SIZE_LIMIT);
        }
        if !in_range(ns, slba, nlb) {
            return Err(LBA_OUT_OF_RANGE);
        }
        total += nlb;
        ranges[i] = (slba, nlb);
    }
    if total > u64::from(mcl) {
        return Err(COPY_SIZE_LIMIT);
    }
    let sdlba = u64::from(cmd.cdw10()) | (u64::from(cmd.cdw11()) << 32);
    if !in_range(ns, sdlba, total) {
        return Err(LBA_OUT_OF_RANGE);
    }
    let shift = ns.block_shift();
    let gate = crate::fused::GateTicket::enter(ns.write_gate(), host.shard).ok_or(GATE_CLOSED)?;
    recheck_reservation(ns, host)?;
    let mut op = CopyOp {
        cid: cmd.cid(),
        ns: ns.clone(),
        buf: crate::request::AlignedBuf::new(),
        phase: CopyPhase::Reading(0),
        status: Status::SUCCESS,
        sdlba,
        fua: cdw12 & (1 << 30) != 0 || !write_cache,
        _gate: gate,
    };
    op.buf.grow((total << shift) as usize);
    let tag = IoTag {
        cid: cmd.cid(),
        bytes: 0,
        write: false,
        nsid: 0,
    };
    let mut off = 0usize;
    let mut pending = 0u32;
    for &(slba, nlb) in &ranges[..nr] {
        let len = (nlb << shift) as usize;
        // The backend may keep a pointer into the buffer's allocation
        // until the read completes (it does not move with `op`).
        let buf = &mut op.buf[off..off + len];
        match ns
            .backend()
            .submit(BlockOp::Read { lba: slba, buf }, tag, sink)
        {
            Submitted::Pending => pending += 1,
            Submitted::Done(st) if !st.is_success() => {
                if op.status.is_success() {
                    op.status = st;
                }
            }
            // A read of zeroes left the (zeroed) buffer as it was.
            Submitted::Done(_) | Submitted::ZeroData => {}
        }
        off += len;
    }
    if pending > 0 {
        op.phase = CopyPhase::Reading(pending);
        return Ok(Some(op));
    }
    if !op.status.is_success() {
        return Err(op.status);
    }
    op.phase = CopyPhase::Writing;
    match op.write(sink) {
        Submitted::Pending => Ok(Some(op)),
        Submitted::Done(st) if st.is_success() => Ok(None),
        Submitted::Done(st) => Err(st),
        Submitted::ZeroData => Ok(None),
    }
}

/// Dataset Management: only the Deallocate attribute does anything; the
/// others are hints. All ranges are checked before any is deallocated, and
/// the backend gets them all as one operation (it may complete later).
fn dataset_management(
    table: &NamespaceTable,
    ana: Option<&PathAna>,
    host: &Host,
    cmd: &Command,
    data: &[u8],
    sink: &Arc<CompletionSink>,
) -> Submitted {
    let ns = match lookup(table, ana, host, cmd.nsid(), true) {
        Ok(ns) => ns,
        Err(s) => return Submitted::Done(s),
    };
    let nr = (cmd.cdw10() & 0xFF) as usize + 1;
    let Some(ranges) = DsmRanges::new(data, nr) else {
        return Submitted::Done(SGL_LENGTH_INVALID);
    };
    if cmd.cdw11() & DSM_AD == 0 {
        return Submitted::Done(Status::SUCCESS);
    }
    if ns.read_only() {
        return Submitted::Done(WRITE_PROTECTED);
    }
    if ranges.iter().any(|(slba, nlb)| !in_range(ns, slba, nlb)) {
        return Submitted::Done(LBA_OUT_OF_RANGE);
    }
    let tag = IoTag {
        cid: cmd.cid(),
        bytes: 0,
        write: true,
        nsid: cmd.nsid(),
    };
    gated(ns, host, || ns.backend().deallocate(ranges, tag, sink))
}

/// QoS (`qos.rs`): whether a Read or Write must wait for its bdev's
/// tokens. Returns the bdev's QoS state when it must (nothing taken); `None`
/// when it may run now (tokens taken) or QoS does not apply: no limit on
/// the bdev, another opcode, or a command `execute` answers with an error
/// at once (unknown or inactive namespace, ANA, Reservation Conflict,
/// write-protected, too long, out of range), which costs no tokens and
/// never waits.
#[inline]
pub(crate) fn qos_wait<'t>(
    table: &'t NamespaceTable,
    ana: Option<&PathAna>,
    host: &Host,
    cmd: &Command,
    max_transfer: u32,
) -> Option<&'t Arc<BdevQos>> {
    let write = match cmd.opcode() {
        op if op == IoOpcode::Write as u8 => true,
        op if op == IoOpcode::Read as u8 => false,
        _ => return None,
    };
    let q = table.get(cmd.nsid())?.qos();
    if !q.is_active() {
        return None;
    }
    let ns = lookup(table, ana, host, cmd.nsid(), write).ok()?;
    if write && ns.read_only() {
        return None;
    }
    let nlb = u64::from(cmd.nlb());
    let len = nlb << ns.block_shift();
    if len > u64::from(max_transfer) || !in_range(ns, cmd.slba(), nlb) {
        return None;
    }
    if q.admit(write, len, crate::qos::now_ns()) {
        None
    } else {
        Some(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MallocBackend;
    use crate::namespace::NamespaceState;

    #[test]
    fn path_error_while_removing() {
        let b: Arc<dyn crate::backend::Backend> =
            Arc::new(MallocBackend::new("m", 512, 8).unwrap());
        let ns = Arc::new(Namespace::new(1, b, [1; 16], [2; 8], [3; 16]));
        let table = NamespaceTable::from_namespaces([ns.clone()]);
        let sink = CompletionSink::new();
        let mut stats = QueueStats::default();
        let mut cmd = Command::new(IoOpcode::Read as u8, 1);
        cmd.set_nsid(1).set_lba_range(0, 1);
        let mut buf = [0u8; 512];
        let r = execute(
            &table,
            None,
            &Host::default(),
            &cmd,
            &mut buf,
            1 << 17,
            true,
            &mut stats,
            &sink,
        );
        assert_eq!(r, Submitted::Done(Status::SUCCESS));
        ns.set_state(NamespaceState::Removing);
        let r = execute(
            &table,
            None,
            &Host::default(),
            &cmd,
            &mut buf,
            1 << 17,
            true,
            &mut stats,
            &sink,
        );
        assert_eq!(r, Submitted::Done(Status::INTERNAL_PATH_ERROR));
        let Submitted::Done(st) = r else {
            unreachable!()
        };
        assert_eq!((st.sct, st.dnr), (3, false), "path related, retryable");
        assert_eq!(stats.reads, 1);
        assert_eq!(stats.bytes_read, 512);
    }

    /// Records the FUA flag of every write it gets.
    #[derive(Debug, Default)]
    struct FuaProbe {
        fua: std::sync::Mutex<Vec<bool>>,
    }

    impl crate::backend::Backend for FuaProbe {
        fn name(&self) -> &str {
            "probe"
        }
        fn kind(&self) -> &'static str {
            "probe"
        }
        fn block_size(&self) -> u32 {
            512
        }
        fn num_blocks(&self) -> u64 {
            64
        }
        fn deallocate_reads_zeroes(&self) -> bool {
            false
        }
        fn submit(&self, op: BlockOp<'_>, _: IoTag, _: &Arc<CompletionSink>) -> Submitted {
            match op {
                BlockOp::Write { fua, .. } | BlockOp::WriteZeroes { fua, .. } => {
                    self.fua.lock().unwrap().push(fua)
                }
                _ => {}
            }
            Submitted::Done(Status::SUCCESS)
        }
        fn deallocate(&self, _: DsmRanges<'_>, _: IoTag, _: &Arc<CompletionSink>) -> Submitted {
            Submitted::Done(Status::SUCCESS)
        }
    }

    /// With the volatile write cache disabled every Write and Write Zeroes
    /// reaches the backend as FUA; with it enabled only those the host
    /// marked FUA.
    #[test]
    fn write_cache_off_forces_fua() {
        let probe = Arc::new(FuaProbe::default());
        let b: Arc<dyn crate::backend::Backend> = probe.clone();
        let ns = Arc::new(Namespace::new(1, b, [1; 16], [2; 8], [3; 16]));
        let table = NamespaceTable::from_namespaces([ns]);
        let sink = CompletionSink::new();
        let mut stats = QueueStats::default();
        let mut buf = [0u8; 512];
        for (wce, host_fua) in [(true, false), (true, true), (false, false)] {
            for op in [IoOpcode::Write, IoOpcode::WriteZeroes] {
                let mut cmd = Command::new(op as u8, 1);
                cmd.set_nsid(1).set_lba_range(0, 1);
                if host_fua {
                    cmd.set_cdw12(cmd.cdw12() | (1 << 30));
                }
                let data: &mut [u8] = if op == IoOpcode::Write {
                    &mut buf
                } else {
                    &mut []
                };
                let r = execute(
                    &table,
                    None,
                    &Host::default(),
                    &cmd,
                    data,
                    1 << 17,
                    wce,
                    &mut stats,
                    &sink,
                );
                assert_eq!(r, Submitted::Done(Status::SUCCESS));
            }
        }
        let seen = probe.fua.lock().unwrap().clone();
        assert_eq!(seen, vec![false, false, true, true, true, true]);
    }
}
