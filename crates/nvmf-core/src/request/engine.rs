//! The request lifecycle of one queue, shared by every transport: what
//! happens to a command between "its capsule arrived" and "its response
//! left", except the bytes on the wire.
//!
//! Owns [`RequestEngine`] (the core `QueuePair`, the request slots, the FIFO
//! of commands waiting for a data buffer or for fetch allowance, the FIFO
//! of commands parked for their bdev's QoS tokens (docs/QOS.md), the
//! accounting of host data being fetched, late completions, the queue's
//! close reason), [`RequestParams`], [`Fabric`] (the transport operations
//! the engine calls: classify an SGL, fetch host data, send a response) and
//! [`Fault`] (a protocol error the transport must end the connection for).
//!
//! Flow (compare SPDK's `nvmf_*_req_process` state machines and the
//! kernel's `nvmet_req_init` / `nvmet_req_complete`): the transport decodes a
//! command capsule and calls [`RequestEngine::on_command`] → slot → either
//! in-capsule data (executed in place), or a data buffer reserved against
//! the target-wide budget and then, for host→controller data,
//! [`Fabric::fetch`] (NVMe/TCP: R2T; NVMe/RDMA: RDMA READ) and
//! [`RequestEngine::fetched`] once it landed → `QueuePair::execute` →
//! [`Fabric::respond`] with the controller→host data (sent in place from the
//! slot buffer) and the completion → [`RequestEngine::sent`] frees the slot
//! when the transport is done with its buffer. Asynchronous completions and
//! timers come through [`RequestEngine::poll`].
//!
//! Memory: slots are bounded by the queue depth, buffers by the budget (see
//! `slots.rs`), outstanding fetches by `max_fetch_bytes`, and a fetch whose
//! data does not all arrive within `fetch_timeout` closes the queue.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_wire::command::{Command, SglDescriptor, FLAGS_FUSE_MASK};
use nvmf_wire::completion::Completion;
use nvmf_wire::fabrics::CATTR_DISABLE_SQ_FLOW_CONTROL;
use nvmf_wire::opcode::{AdminOpcode, FabricsType, IoOpcode};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::FromBytes;
use tracing::{debug, warn};

use super::slots::{AllocError, BufPolicy, RequestState, Slots, Xfer};
use crate::queue::{Exec, PortInfo, QueuePair, QueueState};
use crate::target::Target;

/// Slots before Connect (Connect itself, plus slack for a pipelining host).
const PRE_CONNECT_SLOTS: usize = 4;
/// How often `poll` looks for expired fetches and idle buffers to free.
const HOUSEKEEPING: Duration = Duration::from_millis(50);

/// Limits of one transport's queues, as the engine enforces them.
#[derive(Debug, Clone)]
pub struct RequestParams {
    /// In-capsule data accepted on I/O queues.
    pub in_capsule_data_size: u32,
    /// In-capsule data accepted on the admin queue (NVMe/TCP: at least
    /// 8 KiB whatever the I/O queues take).
    pub admin_in_capsule_data_size: u32,
    /// Largest transfer of one command (MDTS); bigger ones fail.
    pub max_io_size: u32,
    /// Slot data buffers: the target-wide budget (shared by every clone of
    /// these parameters), the retained size and the largest buffer.
    pub buffers: BufPolicy,
    /// Host data one queue may be fetching at once, in bytes; a write whose
    /// fetch would go beyond it waits until earlier fetches finish (one
    /// fetch is always allowed, whatever its size).
    pub max_fetch_bytes: u32,
    /// Close the queue when a fetch's data has not all arrived this long
    /// after it started (checked on the timer tick; zero: never).
    pub fetch_timeout: Duration,
    /// What the log and the close reason call that timeout, in the
    /// transport's words ("H2CData timeout").
    pub fetch_timeout_name: &'static str,
}

/// What a transport reads in a command's SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataDesc {
    pub kind: SglKind,
    /// Transfer length in bytes (where the descriptor keeps it depends on
    /// its type: 32 bits in a data block, 24 in a keyed data block).
    pub len: u32,
}

/// Where a command's data is, by its SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SglKind {
    /// Data in the capsule after the SQE (host→controller only); the
    /// descriptor's address is the offset into it.
    InCapsule,
    /// Data moved by the transport: fetched from the host for a write,
    /// sent to the host for a read (NVMe/TCP Transport SGL Data Block,
    /// NVMe/RDMA Keyed SGL Data Block).
    Transport,
    /// Not a descriptor this transport takes: SGL Descriptor Type Invalid.
    Unsupported,
}

/// Controller→host data of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataOut {
    /// No data (not a read, empty, or the command failed).
    None,
    /// The first `len` bytes of the slot buffer.
    Slot(u32),
    /// This many zero bytes from the shared zero buffer
    /// (`backend::zeroes`): a read the backend knew to be all zeroes.
    Zeroes(&'static [u8]),
}

/// The transport operations the engine calls (the transport's half of the
/// seam; the kernel target's `nvmet_fabrics_ops` plays this part).
pub trait Fabric {
    /// How this transport reads `sgl`.
    fn describe(&self, sgl: &SglDescriptor) -> DataDesc;

    /// Start fetching slot `idx`'s host→controller data (`len` bytes, into
    /// its buffer, which holds them). The transport calls
    /// [`RequestEngine::fetched`] once all of it landed.
    fn fetch(&mut self, slots: &mut Slots, idx: u16, len: u32);

    /// Queue slot `idx`'s response: `data` first, then the completion
    /// `cqe`. `sq_flow_disabled`: the host disabled SQ flow control at
    /// Connect. Returns true when queued output still refers to the slot
    /// buffer (the transport calls [`RequestEngine::sent`] once it is
    /// sent); false lets the engine free the slot now.
    fn respond(
        &mut self,
        slots: &Slots,
        idx: u16,
        cqe: &Completion,
        data: DataOut,
        sq_flow_disabled: bool,
    ) -> bool;

    /// Queue a completion that belongs to no slot (an answer for a command
    /// whose slot was already given up).
    fn respond_unslotted(&mut self, cqe: &Completion);

    /// The transport's say in a Fabrics Connect, before the core executes
    /// it: `qid` and `sqsize` from the command, `cntlid` from its data.
    /// An error status completes the Connect unexecuted (NVMe/RDMA: the
    /// queue was sized from the RDMA_CM connect request, which the Connect
    /// must match). Control path only (one call per Connect).
    fn check_connect(&self, qid: u16, sqsize: u16, cntlid: u16) -> Result<(), Status> {
        let _ = (qid, sqsize, cntlid);
        Ok(())
    }

    /// How many slots the engine keeps for a queue of `depth` entries
    /// (the Connect's SQSIZE + 1): at most what the transport can answer for
    /// (its response buffers), so a host that sends more is a protocol
    /// fault, not an index past a buffer. A transport whose response leaves
    /// its slot busy after the host already has it (RDMA: until the SEND
    /// completes) keeps room for those as well.
    fn slots_for(&self, depth: usize) -> usize {
        depth
    }
}

/// What kind of protocol error a [`Fault`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// A command out of sequence: before Fabrics Connect, or more commands
    /// outstanding than the queue holds.
    Sequence,
    /// A command whose Command Identifier is already in use.
    CommandId,
}

/// A protocol error the transport ends the connection for, the way its
/// binding prescribes (NVMe/TCP: C2HTermReq; NVMe/RDMA: disconnect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub reason: &'static str,
}

impl Fault {
    fn sequence(reason: &'static str) -> Fault {
        Fault {
            kind: FaultKind::Sequence,
            reason,
        }
    }
}

/// Counters of one queue's requests.
#[derive(Debug, Default, Clone, Copy)]
pub struct RequestStats {
    pub commands: u64,
    /// Fetches of host data started.
    pub fetches: u64,
    /// Commands whose data the transport saw damaged (completed with a
    /// transient transport error).
    pub data_errors: u64,
    /// Commands that had to wait for a data buffer or fetch allowance.
    pub buffer_waits: u64,
    /// Commands parked for their bdev's QoS tokens (`qos.rs`).
    pub qos_waits: u64,
}

/// A fused command on its queue (`RequestEngine::fuse_arrived`).
#[derive(Debug, Clone, Copy)]
struct Half {
    idx: u16,
    link: Link,
    /// Its data is in (held in its slot until its pair's is).
    ready: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// A first whose next capsule has not arrived.
    Open,
    /// Paired with this slot.
    Pair(u16),
    /// Fails with this status once its data is in.
    Fail(Status),
}

/// Whether a command waiting for its data phase could start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    Started,
    /// The budget has no room for its buffer.
    NoBuffer,
    /// The queue's outstanding fetch data is at `max_fetch_bytes`.
    NoFetchCredit,
}

/// Where a command's data lives when it is executed.
enum Src<'a> {
    None,
    /// In-capsule data, still in the transport's receive buffer.
    Capsule(&'a mut [u8]),
    /// The slot buffer (fetched data, or room for controller→host data).
    Slot,
}

/// The requests of one queue (see the module documentation).
pub struct RequestEngine {
    /// Backend I/O still in flight points into `slots`' buffers: `Drop`
    /// hands them to the core, which frees them once that I/O is done.
    qp: QueuePair,
    params: RequestParams,
    slots: Slots,
    /// Commands waiting for a data buffer or fetch allowance, oldest first
    /// (slots in state `NeedBuffer`; at most one per slot).
    need_buf: VecDeque<u16>,
    /// Commands parked for their bdev's QoS tokens, oldest first (slots in
    /// state `Executing`, so the queue polls and stays on its thread while
    /// any waits; each counted in `qos::parked_here`).
    throttled: VecDeque<u16>,
    /// `throttled` or `halves` may hold something: `execute` takes its
    /// slow path (set on every push, cleared there once both are empty).
    detour: bool,
    /// Fused halves on this I/O queue (`fused.rs`; empty on queues that
    /// never see one): pairs waiting for both halves' data, lone halves
    /// to fail. See `fuse_arrived`.
    halves: Vec<Half>,
    /// The latest command to arrive was a FUSE-first one (its slot): the
    /// next capsule must be its second half.
    fuse_open: Option<u16>,
    /// `FLAGS_FUSE_MASK` while `fuse_open` is set, else 0: `on_command`
    /// tests it together with the command's FUSE bits (one test).
    fuse_mark: u8,
    /// Slot releases + finished fetches when the FIFO last failed to start
    /// its head: nothing to retry before this changes (or a tick).
    wait_mark: u64,
    /// Fetches finished (their allowance returned).
    fetch_done: u64,
    /// Fetches whose data has not all arrived, and their bytes.
    fetch_count: u32,
    fetch_bytes: u64,
    /// The time of the last `poll` (timer tick): stamps fetches without a
    /// clock read per I/O.
    coarse_now: Instant,
    /// When `poll` next checks the fetch timeout and idle buffers.
    next_housekeeping: Instant,
    late: Vec<Completion>,
    /// In-capsule data that fits whichever queue this is (the smaller of
    /// the two limits): the inline fast path's check.
    icd_either: u32,
    sq_flow_disabled: bool,
    close: Option<&'static str>,
    stats: RequestStats,
}

impl std::fmt::Debug for RequestEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestEngine")
            .field("qid", &self.qp.qid())
            .field("in_flight", &self.slots.in_use())
            .field("waiting", &self.need_buf.len())
            .field("fetches", &self.fetch_count)
            .field("close", &self.close)
            .finish()
    }
}

impl Drop for RequestEngine {
    /// Never waits: request buffers that backend I/O still points into are
    /// handed to the core (`QueuePair::hand_over`), which frees them when
    /// the I/O finishes.
    fn drop(&mut self) {
        crate::qos::unpark_here(self.throttled.len());
        let slots = std::mem::replace(&mut self.slots, Slots::new(0, self.params.buffers.clone()));
        let bytes = slots.buffer_bytes();
        self.qp.hand_over(Box::new(slots), bytes);
    }
}

impl RequestEngine {
    /// The requests of a new connection on `port`.
    pub fn new(target: Arc<Target>, port: Arc<PortInfo>, params: &RequestParams) -> RequestEngine {
        let now = Instant::now();
        RequestEngine {
            qp: QueuePair::new(target, port),
            params: params.clone(),
            slots: Slots::new(PRE_CONNECT_SLOTS, params.buffers.clone()),
            need_buf: VecDeque::new(),
            throttled: VecDeque::new(),
            detour: false,
            halves: Vec::new(),
            fuse_open: None,
            fuse_mark: 0,
            wait_mark: 0,
            fetch_done: 0,
            fetch_count: 0,
            fetch_bytes: 0,
            coarse_now: now,
            next_housekeeping: now,
            late: Vec::with_capacity(16),
            icd_either: params
                .in_capsule_data_size
                .min(params.admin_in_capsule_data_size),
            sq_flow_disabled: false,
            close: None,
            stats: RequestStats::default(),
        }
    }

    /// The core queue pair.
    pub fn queue(&self) -> &QueuePair {
        &self.qp
    }

    pub fn params(&self) -> &RequestParams {
        &self.params
    }

    pub fn stats(&self) -> &RequestStats {
        &self.stats
    }

    /// The slots (the transport reads a slot's state, length and buffer
    /// while it moves data).
    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    pub fn slots_mut(&mut self) -> &mut Slots {
        &mut self.slots
    }

    /// Set once the queue must close.
    pub fn close_reason(&self) -> Option<&'static str> {
        self.close
    }

    /// The transport ends the queue (a protocol error, the host left).
    pub fn close(&mut self, reason: &'static str) {
        self.close.get_or_insert(reason);
    }

    /// The host disabled SQ flow control at Connect.
    pub fn sq_flow_disabled(&self) -> bool {
        self.sq_flow_disabled
    }

    /// Commands waiting for an asynchronous backend.
    pub fn executing(&self) -> usize {
        self.slots.executing()
    }

    /// Commands received and not yet answered (any slot not free); on the
    /// admin queue this includes outstanding Asynchronous Event Requests.
    pub fn in_flight(&self) -> usize {
        self.slots.in_use()
    }

    /// Commands waiting for a data buffer or fetch allowance.
    pub fn waiting_for_buffer(&self) -> usize {
        self.need_buf.len()
    }

    /// Commands parked for their bdev's QoS tokens.
    pub fn waiting_for_qos(&self) -> usize {
        self.throttled.len()
    }

    /// Fetches whose data has not all arrived.
    pub fn fetches_outstanding(&self) -> usize {
        self.fetch_count as usize
    }

    /// Bytes of slot buffers this queue has charged to the budget.
    pub fn buffer_bytes_charged(&self) -> usize {
        self.slots.charged()
    }

    /// I/O commands executing in a backend now (SPDK's `pending_bdev_io`):
    /// 0 on the admin queue, whose only long-lived commands are AERs.
    pub fn backend_pending(&self) -> usize {
        if self.qp.qid() == 0 {
            0
        } else {
            self.slots.executing()
        }
    }

    /// Whether this queue may move to another thread now: no command is
    /// executing in a backend (io_uring operations complete only on the
    /// ring of the thread that submitted them).
    pub fn movable(&self) -> bool {
        self.slots.executing() == 0 && self.qp.backend_ops_in_flight() == 0
    }

    /// Called by the thread that takes the queue over (after `movable`):
    /// binds the queue's completion wake-ups to this thread.
    pub fn adopt_current_thread(&mut self) -> bool {
        self.movable() && self.qp.adopt_current_thread()
    }

    /// The transport has sent what queued output held of slot `idx`'s
    /// buffer: the slot is free again.
    #[inline]
    pub fn sent(&mut self, idx: u16) {
        if self.slots.get(idx).map(|x| x.state) == Some(RequestState::TransferringToHost) {
            self.slots.release(idx);
        }
    }

    // ---------------------------------------------------------------------
    // Commands
    // ---------------------------------------------------------------------

    /// A command capsule arrived. `data`: its in-capsule data (empty when
    /// none), which stays in the transport's buffer for this call only.
    /// `data_ok`: false when the transport saw that data damaged (the
    /// command fails with a transient transport error). `start_ns`: when the
    /// capsule was received (latency statistics).
    #[inline]
    pub fn on_command<F: Fabric>(
        &mut self,
        fab: &mut F,
        cmd: &Command,
        data: &mut [u8],
        data_ok: bool,
        start_ns: u64,
    ) -> Result<(), Fault> {
        self.stats.commands += 1;
        if !self.qp.is_connected() && !is_connect(cmd) {
            // Nothing but a Connect may come first: fail before asking for
            // (or taking in) any data.
            return Err(Fault::sequence("command before Fabrics Connect"));
        }
        let idx = self.alloc(cmd)?;
        if (cmd.flags | self.fuse_mark) & FLAGS_FUSE_MASK != 0 {
            self.fuse_arrived(fab, idx, cmd.fuse());
        }
        // One look-up of the new slot: its arrival time, and the direction
        // `alloc` worked out.
        let Some(slot) = self.slots.get_mut(idx) else {
            return Ok(());
        };
        slot.start_ns = start_ns;
        let xfer = slot.xfer;
        if !data_ok {
            self.stats.data_errors += 1;
            debug!(peer = %self.qp.port().peer, cid = cmd.cid(), "in-capsule data damaged");
            self.complete_status(fab, idx, Status::TRANSIENT_TRANSPORT_ERROR);
            return Ok(());
        }
        let sgl = cmd.sgl();
        let DataDesc { kind, len } = fab.describe(sgl);
        match xfer {
            Xfer::None => self.execute(fab, idx, Src::None),
            Xfer::Bidi => {
                self.complete_status(fab, idx, Status::INVALID_FIELD.with_dnr());
                Ok(())
            }
            _ if len == 0 => self.execute(fab, idx, Src::None),
            _ if len > self.params.max_io_size => {
                self.complete_status(fab, idx, Status::SGL_DATA_LENGTH_INVALID.with_dnr());
                Ok(())
            }
            Xfer::HostToCtrl if kind == SglKind::InCapsule => {
                let offset = sgl.address();
                if offset == 0
                    && len <= self.icd_either
                    && data.len() == len as usize
                    && !self.qp.needs_stable_buffers()
                {
                    // The common case, kept inline: executed in place.
                    self.execute(fab, idx, Src::Capsule(data))
                } else {
                    self.in_capsule(fab, idx, offset, len, data)
                }
            }
            Xfer::HostToCtrl if kind == SglKind::Transport => {
                // (`alloc` set `received` to 0.)
                slot.len = len;
                self.start_or_wait(fab, idx, xfer, len)
            }
            // A read's data always goes through the transport; NVMe/TCP
            // hosts may describe it as in-capsule (ignored for reads).
            Xfer::CtrlToHost if kind != SglKind::Unsupported => {
                slot.len = len;
                self.start_or_wait(fab, idx, xfer, len)
            }
            _ => {
                self.complete_status(fab, idx, Status::SGL_INVALID_DESCRIPTOR_TYPE.with_dnr());
                Ok(())
            }
        }
    }

    /// Takes a free slot for `cmd`. A Command Identifier in use is fatal,
    /// except the ID of an outstanding AER the host abandoned.
    #[inline]
    fn alloc(&mut self, cmd: &Command) -> Result<u16, Fault> {
        const CID_IN_USE: Fault = Fault {
            kind: FaultKind::CommandId,
            reason: "command ID already in use",
        };
        match self.slots.alloc(cmd) {
            Ok(i) => Ok(i),
            Err(AllocError::CidConflict) if self.abandon_aer(cmd.cid()) => {
                self.slots.alloc(cmd).map_err(|_| CID_IN_USE)
            }
            Err(AllocError::CidConflict) => {
                let holder = (0..self.slots.len() as u16)
                    .filter_map(|i| self.slots.get(i))
                    .find(|s| s.state != RequestState::Free && s.cmd.cid() == cmd.cid())
                    .map(|s| s.state);
                debug!(
                    peer = %self.qp.port().peer,
                    qid = self.qp.qid(),
                    cid = cmd.cid(),
                    opcode = cmd.opcode(),
                    ?holder,
                    "command ID already in use"
                );
                Err(CID_IN_USE)
            }
            Err(AllocError::Full) => Err(Fault::sequence(
                "more commands outstanding than the queue size",
            )),
        }
    }

    /// Host→controller data in the capsule: the checks, and the copy into
    /// the slot buffer for an asynchronous backend.
    #[inline(never)]
    fn in_capsule<F: Fabric>(
        &mut self,
        fab: &mut F,
        idx: u16,
        offset: u64,
        len: u32,
        data: &mut [u8],
    ) -> Result<(), Fault> {
        let icd = if self.qp.qid() == 0 {
            self.params.admin_in_capsule_data_size
        } else {
            self.params.in_capsule_data_size
        };
        if offset != 0 {
            self.complete_status(fab, idx, Status::SGL_OFFSET_INVALID.with_dnr());
            Ok(())
        } else if len > icd || data.len() != len as usize {
            self.complete_status(fab, idx, Status::SGL_DATA_LENGTH_INVALID.with_dnr());
            Ok(())
        } else if self.qp.needs_stable_buffers() {
            // An asynchronous backend keeps using the data after execute()
            // returns: the receive buffer is reused, the (aligned) slot
            // buffer is not. Within the retained size (no budget); must not
            // wait: the data is in the transport's buffer.
            self.slots.reserve(idx, len as usize, true);
            if let Some(slot) = self.slots.get_mut(idx) {
                slot.len = len;
                let dst = slot.data_mut(len as usize);
                let n = dst.len();
                dst.copy_from_slice(&data[..n]);
            }
            self.execute(fab, idx, Src::Slot)
        } else {
            self.execute(fab, idx, Src::Capsule(data))
        }
    }

    /// A new command reuses the ID of an outstanding Asynchronous Event
    /// Request: the host abandoned that request (see
    /// `QueuePair::abandon_aer`). Its slot is freed without a response and
    /// true returned; any other conflict stays fatal.
    #[cold]
    fn abandon_aer(&mut self, cid: u16) -> bool {
        let Some(old) = self.slots.find(cid, RequestState::Executing) else {
            return false;
        };
        if !self.qp.abandon_aer(cid) {
            return false;
        }
        debug!(peer = %self.qp.port().peer, cid, "host reused the command ID of an outstanding AER: request dropped");
        self.slots.release(old);
        true
    }

    /// All of slot `idx`'s host data is in its buffer (the transport kept
    /// `received` and `data_error`): execute it, or fail a damaged transfer.
    #[inline]
    pub fn fetched<F: Fabric>(&mut self, fab: &mut F, idx: u16) -> Result<(), Fault> {
        let Some(slot) = self.slots.get_mut(idx) else {
            return Ok(());
        };
        if slot.state != RequestState::AwaitingHostData {
            return Ok(());
        }
        // The fetch is over: its allowance is free again.
        self.fetch_count = self.fetch_count.saturating_sub(1);
        self.fetch_bytes = self.fetch_bytes.saturating_sub(u64::from(slot.len));
        self.fetch_done += 1;
        if slot.data_error {
            self.stats.data_errors += 1;
            let cid = slot.cmd.cid();
            debug!(peer = %self.qp.port().peer, cid, "host data damaged in transfer");
            self.complete_status(fab, idx, Status::TRANSIENT_TRANSPORT_ERROR);
            return Ok(());
        }
        self.slots.set_state(idx, RequestState::ReadyToExecute);
        self.execute(fab, idx, Src::Slot)
    }

    // ---------------------------------------------------------------------
    // Waiting for buffers and fetch allowance
    // ---------------------------------------------------------------------

    /// Starts slot `idx` (a command with data through the transport) now,
    /// or queues it behind the commands already waiting.
    #[inline]
    fn start_or_wait<F: Fabric>(
        &mut self,
        fab: &mut F,
        idx: u16,
        xfer: Xfer,
        len: u32,
    ) -> Result<(), Fault> {
        if xfer == Xfer::CtrlToHost && self.slots.fits_without_budget(idx, len as usize) {
            // The slot's buffer is big enough, or may grow within the
            // retained size: no budget, no wait.
            self.slots.reserve(idx, len as usize, true);
            return self.execute(fab, idx, Src::Slot);
        }
        self.start_or_wait_slow(fab, idx)
    }

    #[inline(never)]
    fn start_or_wait_slow<F: Fabric>(&mut self, fab: &mut F, idx: u16) -> Result<(), Fault> {
        if self.need_buf.is_empty() {
            match self.try_start(fab, idx)? {
                Start::Started => return Ok(()),
                blocked => {
                    self.wait_mark = self.wait_progress();
                    self.slots.set_waiter(blocked == Start::NoBuffer);
                }
            }
        }
        self.stats.buffer_waits += 1;
        self.slots.set_state(idx, RequestState::NeedBuffer);
        self.need_buf.push_back(idx);
        Ok(())
    }

    /// Starts slot `idx`'s data phase if there is room: for a write, a
    /// buffer and fetch allowance, then the fetch; for a read, a buffer,
    /// then execution.
    fn try_start<F: Fabric>(&mut self, fab: &mut F, idx: u16) -> Result<Start, Fault> {
        let Some(slot) = self.slots.get(idx) else {
            return Ok(Start::Started);
        };
        let (len, xfer) = (slot.len, slot.xfer);
        if xfer == Xfer::HostToCtrl {
            if self.fetch_count > 0
                && self.fetch_bytes + u64::from(len) > u64::from(self.params.max_fetch_bytes)
            {
                return Ok(Start::NoFetchCredit);
            }
            if !self.slots.reserve(idx, len as usize, false) {
                return Ok(Start::NoBuffer);
            }
            if let Some(slot) = self.slots.get_mut(idx) {
                slot.received = 0;
                slot.fetch_at = self.coarse_now;
            }
            self.slots.set_state(idx, RequestState::AwaitingHostData);
            self.stats.fetches += 1;
            self.fetch_count += 1;
            self.fetch_bytes += u64::from(len);
            fab.fetch(&mut self.slots, idx, len);
            Ok(Start::Started)
        } else {
            if !self.slots.reserve(idx, len as usize, false) {
                return Ok(Start::NoBuffer);
            }
            self.slots.set_state(idx, RequestState::ReadyToExecute);
            self.execute(fab, idx, Src::Slot)?;
            Ok(Start::Started)
        }
    }

    /// Slot releases plus finished fetches: changes whenever room for a
    /// waiting command may have appeared in this queue.
    fn wait_progress(&self) -> u64 {
        self.slots.releases() + self.fetch_done
    }

    /// Starts waiting commands in order until the oldest cannot start.
    fn run_waiting<F: Fabric>(&mut self, fab: &mut F) -> Result<(), Fault> {
        while self.close.is_none() {
            let Some(&idx) = self.need_buf.front() else {
                break;
            };
            match self.try_start(fab, idx) {
                Ok(Start::Started) => {
                    self.need_buf.pop_front();
                }
                Ok(blocked) => {
                    self.wait_mark = self.wait_progress();
                    self.slots.set_waiter(blocked == Start::NoBuffer);
                    return Ok(());
                }
                Err(e) => {
                    self.need_buf.pop_front();
                    self.slots.set_waiter(false);
                    return Err(e);
                }
            }
        }
        self.slots.set_waiter(false);
        Ok(())
    }

    /// After the transport handled a batch of input: starts waiting
    /// commands that may have room now, and collects completions of
    /// asynchronous commands.
    #[inline]
    pub fn after_input<F: Fabric>(&mut self, fab: &mut F) -> Result<(), Fault> {
        if !self.need_buf.is_empty()
            && self.close.is_none()
            && self.wait_progress() != self.wait_mark
        {
            self.run_waiting(fab)?;
        }
        if self.slots.executing() > 0 && self.close.is_none() {
            self.poll(fab, Instant::now())?;
        }
        Ok(())
    }

    /// After the transport freed slots (sent data): starts waiting commands
    /// if room may have appeared.
    #[inline]
    pub fn after_output<F: Fabric>(&mut self, fab: &mut F) -> Result<(), Fault> {
        if !self.need_buf.is_empty() && self.wait_progress() != self.wait_mark {
            self.run_waiting(fab)?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------------
    // Timer tick, execution, completion
    // ---------------------------------------------------------------------

    /// Timer tick / loop turn: collects late completions (AER, asynchronous
    /// backends), learns whether the queue must close, expires fetches,
    /// frees idle buffers under pressure and retries waiting commands.
    pub fn poll<F: Fabric>(&mut self, fab: &mut F, now: Instant) -> Result<(), Fault> {
        if self.close.is_some() {
            return Ok(());
        }
        if self.qp.qid() != 0 && self.qp.controller().is_some_and(|c| c.abort_asked()) {
            self.run_aborts(fab);
        }
        self.coarse_now = now;
        let mut late = std::mem::take(&mut self.late);
        let state = self.qp.poll(now, &mut |c| late.push(c));
        for c in late.drain(..) {
            match self.slots.find(c.cid(), RequestState::Executing) {
                Some(idx) => self.complete(fab, idx, c, false),
                None => fab.respond_unslotted(&c),
            }
        }
        self.late = late;
        if let QueueState::Close { reason } = state {
            self.close(reason);
            return Ok(());
        }
        if now >= self.next_housekeeping {
            // At most every HOUSEKEEPING (poll also runs per loop turn for
            // queues with asynchronous commands): slot scans.
            self.next_housekeeping = now + HOUSEKEEPING;
            if self.fetch_count > 0 && !self.params.fetch_timeout.is_zero() {
                self.check_fetch_timeout(now);
            }
            if self.slots.charged() > 0 && self.slots.budget().under_pressure() {
                self.slots.trim_idle();
            }
        }
        if !self.throttled.is_empty() {
            // QoS tokens may be back (a new time slice).
            self.run_throttled(fab)?;
        }
        if !self.need_buf.is_empty() {
            // Room may have been freed by other queues.
            self.run_waiting(fab)?;
        }
        Ok(())
    }

    /// Aborts (admin 08h) asked for on this queue: a command still waiting
    /// for a data buffer (`need_buf`) or for QoS tokens (`throttled`) is
    /// completed with Command Aborted by Request and its slot freed; any
    /// other (its data arriving, in a backend, already answered, unknown)
    /// is not aborted. Each Abort gets its answer through the admin queue.
    #[cold]
    fn run_aborts<F: Fabric>(&mut self, fab: &mut F) {
        let Some(ctrl) = self.qp.controller().cloned() else {
            return;
        };
        for ask in ctrl.take_aborts(self.qp.qid()) {
            let holds =
                |slots: &Slots, i: u16| slots.get(i).is_some_and(|s| s.cmd.cid() == ask.cid);
            if let Some(pos) = self.need_buf.iter().position(|&i| holds(&self.slots, i)) {
                if let Some(idx) = self.need_buf.remove(pos) {
                    if pos == 0 {
                        self.slots.set_waiter(false);
                    }
                    // Never executed: its SQ entry is consumed now.
                    self.complete_status(fab, idx, Status::ABORTED_BY_REQUEST);
                }
                ask.answer(true);
            } else if let Some(pos) = self.throttled.iter().position(|&i| holds(&self.slots, i)) {
                if let Some(idx) = self.throttled.remove(pos) {
                    crate::qos::unpark_here(1);
                    if let Some(cmd) = self.slots.get(idx).map(|s| s.cmd) {
                        // Parked after its SQ entry was consumed.
                        let c = self.qp.complete_parked(&cmd, Status::ABORTED_BY_REQUEST);
                        self.complete(fab, idx, c, false);
                    }
                }
                ask.answer(true);
            } else {
                ask.answer(false);
            }
        }
    }

    /// Closes the queue when its oldest outstanding fetch has waited longer
    /// than `fetch_timeout` for its data.
    fn check_fetch_timeout(&mut self, now: Instant) {
        let Some(oldest) = self.slots.oldest_fetch() else {
            return;
        };
        let waited = now.saturating_duration_since(oldest);
        if waited > self.params.fetch_timeout {
            warn!(
                peer = %self.qp.port().peer,
                qid = self.qp.qid(),
                outstanding_fetches = self.fetch_count,
                outstanding_bytes = self.fetch_bytes,
                waited_ms = waited.as_millis() as u64,
                "{}: the host did not send the data it was asked for, closing",
                self.params.fetch_timeout_name
            );
            self.close(self.params.fetch_timeout_name);
        }
    }

    #[inline]
    fn execute<F: Fabric>(&mut self, fab: &mut F, idx: u16, src: Src<'_>) -> Result<(), Fault> {
        if self.detour {
            return self.execute_detour(fab, idx, src);
        }
        self.execute_now(fab, idx, src)
    }

    /// `execute` while fused halves or QoS-parked commands may exist: a
    /// fused half goes to its pairing, a command behind parked ones to the
    /// same namespace waits behind them; the rest runs.
    #[cold]
    #[inline(never)]
    fn execute_detour<F: Fabric>(
        &mut self,
        fab: &mut F,
        idx: u16,
        src: Src<'_>,
    ) -> Result<(), Fault> {
        if self.halves.is_empty() && self.throttled.is_empty() {
            self.detour = false;
        }
        if !self.halves.is_empty() && self.halves.iter().any(|h| h.idx == idx) {
            return self.execute_half(fab, idx, src);
        }
        if !self.throttled.is_empty() && self.waits_behind(idx) {
            // QoS: in order behind the commands to this namespace that
            // are waiting for tokens.
            if let Some(cmd) = self.slots.get(idx).map(|s| s.cmd) {
                self.qp.take_sq_entry(&cmd);
            }
            self.park(idx, src);
            return Ok(());
        }
        self.execute_now(fab, idx, src)
    }

    #[inline]
    fn execute_now<F: Fabric>(&mut self, fab: &mut F, idx: u16, src: Src<'_>) -> Result<(), Fault> {
        let Some(slot) = self.slots.get_mut(idx) else {
            return Ok(());
        };
        if is_connect(&slot.cmd) {
            if let Err(st) =
                transport_connect_check(fab, &slot.cmd, &src, slot.data(slot.len as usize))
            {
                self.complete_status(fab, idx, st);
                return Ok(());
            }
        }
        let Some(slot) = self.slots.get_mut(idx) else {
            return Ok(());
        };
        // The command is read in place from its slot (no copy). A command
        // QoS parks keeps where its data is (`park`).
        let res = match src {
            Src::None => {
                let r = self.qp.execute(&slot.cmd, &mut []);
                if matches!(r, Exec::Throttled) {
                    self.park(idx, Src::None);
                    return Ok(());
                }
                r
            }
            Src::Capsule(d) => {
                let r = self.qp.execute(&slot.cmd, d);
                if matches!(r, Exec::Throttled) {
                    self.park(idx, Src::Capsule(d));
                    return Ok(());
                }
                r
            }
            Src::Slot => {
                let (cmd, data) = slot.cmd_and_data_mut();
                let r = self.qp.execute(cmd, data);
                if matches!(r, Exec::Throttled) {
                    self.park(idx, Src::Slot);
                    return Ok(());
                }
                r
            }
        };
        self.finish(fab, idx, res)
    }

    /// What `QueuePair::execute` (or `resume`) answered for slot `idx`.
    #[inline]
    fn finish<F: Fabric>(&mut self, fab: &mut F, idx: u16, res: Exec) -> Result<(), Fault> {
        match res {
            Exec::Complete(c) => {
                self.complete(fab, idx, c, false);
                Ok(())
            }
            Exec::CompleteZeroData(c) => {
                self.complete(fab, idx, c, true);
                Ok(())
            }
            Exec::Pending => {
                self.slots.set_state(idx, RequestState::Executing);
                Ok(())
            }
            Exec::Fatal { reason } => {
                self.slots.release(idx);
                Err(Fault::sequence(reason))
            }
            Exec::Throttled => {
                self.park(idx, Src::Slot);
                Ok(())
            }
        }
    }

    // ---------------------------------------------------------------------
    // Fused operations (Compare and Write): pairing in arrival order
    // ---------------------------------------------------------------------

    /// A command arrived with FUSE bits set, or right after a FUSE-first
    /// one (arrival order is submission order). A first is paired with the
    /// command that arrives next if that is a FUSE-second; otherwise the
    /// first gets Command Aborted due to Missing Fused Command, and so
    /// does a second that follows no first. FUSE 11b is reserved: Invalid
    /// Field. Fused commands on the admin queue are not paired (the admin
    /// command set has none).
    #[cold]
    fn fuse_arrived<F: Fabric>(&mut self, fab: &mut F, idx: u16, fuse: u8) {
        if self.qp.qid() == 0 {
            return;
        }
        if let Some(first) = self.take_fuse_open() {
            if fuse == crate::fused::FUSE_SECOND {
                if let Some(h) = self.halves.iter_mut().find(|h| h.idx == first) {
                    h.link = Link::Pair(idx);
                    self.halves.push(Half {
                        idx,
                        link: Link::Pair(first),
                        ready: false,
                    });
                    self.detour = true;
                    return;
                }
            } else {
                self.fail_half(fab, first, crate::fused::MISSING_FUSED);
            }
        }
        let link = match fuse {
            0 => return,
            crate::fused::FUSE_FIRST => {
                self.set_fuse_open(Some(idx));
                Link::Open
            }
            crate::fused::FUSE_SECOND => Link::Fail(crate::fused::MISSING_FUSED),
            _ => Link::Fail(Status::INVALID_FIELD.with_dnr()),
        };
        self.halves.push(Half {
            idx,
            link,
            ready: false,
        });
        self.detour = true;
    }

    fn set_fuse_open(&mut self, first: Option<u16>) {
        self.fuse_open = first;
        self.fuse_mark = if first.is_some() { FLAGS_FUSE_MASK } else { 0 };
    }

    fn take_fuse_open(&mut self) -> Option<u16> {
        let first = self.fuse_open;
        self.set_fuse_open(None);
        first
    }

    /// Half `idx` must fail with `st`: now if it waits for its pair, else
    /// when its data is in.
    fn fail_half<F: Fabric>(&mut self, fab: &mut F, idx: u16, st: Status) {
        let Some(i) = self.halves.iter().position(|h| h.idx == idx) else {
            return;
        };
        if self.fuse_open == Some(idx) {
            self.set_fuse_open(None);
        }
        if self.halves[i].ready {
            self.halves.remove(i);
            self.complete_status(fab, idx, st);
        } else {
            self.halves[i].link = Link::Fail(st);
        }
    }

    /// Slot `idx` is being completed without running: if it is a fused
    /// half, it is forgotten and its pair fails (Command Aborted due to
    /// Failed Fused Command).
    #[cold]
    fn half_gone<F: Fabric>(&mut self, fab: &mut F, idx: u16) {
        let Some(i) = self.halves.iter().position(|h| h.idx == idx) else {
            return;
        };
        let h = self.halves.remove(i);
        if self.fuse_open == Some(idx) {
            self.set_fuse_open(None);
        }
        if let Link::Pair(p) = h.link {
            self.fail_half(fab, p, crate::fused::FAILED_FUSED);
        }
    }

    /// A fused half has its data: it fails (lone), waits for its pair
    /// (held: its data kept in its slot buffer), or runs with its pair
    /// through `QueuePair::execute_fused`.
    #[cold]
    fn execute_half<F: Fabric>(
        &mut self,
        fab: &mut F,
        idx: u16,
        src: Src<'_>,
    ) -> Result<(), Fault> {
        let Some(i) = self.halves.iter().position(|h| h.idx == idx) else {
            return Ok(());
        };
        let pair = match self.halves[i].link {
            Link::Fail(st) => {
                self.halves.remove(i);
                self.complete_status(fab, idx, st);
                return Ok(());
            }
            Link::Pair(p) if self.halves.iter().any(|h| h.idx == p && h.ready) => p,
            _ => {
                // Wait for the other half: keep the data in the slot.
                if let Src::Capsule(d) = src {
                    self.keep_in_slot(idx, d);
                }
                self.slots.set_state(idx, RequestState::Executing);
                self.halves[i].ready = true;
                return Ok(());
            }
        };
        self.halves.retain(|h| h.idx != idx && h.idx != pair);
        let held = |slots: &Slots, i: u16| {
            slots
                .get(i)
                .map(|s| (s.cmd, s.data(s.len as usize).to_vec()))
        };
        let (Some(other), Some(mine_cmd)) =
            (held(&self.slots, pair), self.slots.get(idx).map(|s| s.cmd))
        else {
            return Ok(());
        };
        let mine_data: Vec<u8> = match src {
            Src::None => Vec::new(),
            Src::Capsule(d) => d.to_vec(),
            Src::Slot => self
                .slots
                .get(idx)
                .map(|s| s.data(s.len as usize).to_vec())
                .unwrap_or_default(),
        };
        let ((fi, fc, fd), (si, sc, sd)) = if mine_cmd.fuse() == crate::fused::FUSE_FIRST {
            ((idx, mine_cmd, mine_data), (pair, other.0, other.1))
        } else {
            ((pair, other.0, other.1), (idx, mine_cmd, mine_data))
        };
        let (e1, e2) = self.qp.execute_fused(&fc, &fd, &sc, &sd);
        self.finish(fab, fi, e1)?;
        self.finish(fab, si, e2)
    }

    // ---------------------------------------------------------------------
    // QoS: commands waiting for their bdev's tokens
    // ---------------------------------------------------------------------

    /// Slot `idx` is a Read or Write on an I/O queue to a namespace that
    /// has commands waiting for QoS tokens here: it must wait behind them.
    #[cold]
    fn waits_behind(&self, idx: u16) -> bool {
        let Some(cmd) = self.slots.get(idx).map(|s| &s.cmd) else {
            return false;
        };
        let op = cmd.opcode();
        if self.qp.qid() == 0 || (op != IoOpcode::Read as u8 && op != IoOpcode::Write as u8) {
            return false;
        }
        let nsid = cmd.nsid();
        self.throttled
            .iter()
            .any(|&i| self.slots.get(i).is_some_and(|s| s.cmd.nsid() == nsid))
    }

    /// Parks slot `idx` until its bdev has tokens: the slot and its buffer
    /// stay reserved (state `Executing`: the reactor polls the queue every
    /// time slice, and the queue does not move to another thread). Data
    /// still in the transport's receive buffer (in-capsule) is copied into
    /// the slot buffer first, within the retained size.
    #[cold]
    fn park(&mut self, idx: u16, src: Src<'_>) {
        if let Src::Capsule(d) = src {
            self.keep_in_slot(idx, d);
        }
        self.slots.set_state(idx, RequestState::Executing);
        self.throttled.push_back(idx);
        self.detour = true;
        self.stats.qos_waits += 1;
        crate::qos::park_here(1);
    }

    /// Copies in-capsule data `d`, still in the transport's receive buffer,
    /// into slot `idx`'s buffer (within the retained size) for a command
    /// that runs later.
    fn keep_in_slot(&mut self, idx: u16, d: &[u8]) {
        let len = d.len();
        self.slots.reserve(idx, len, true);
        if let Some(slot) = self.slots.get_mut(idx) {
            slot.len = len as u32;
            let dst = slot.data_mut(len);
            let n = dst.len();
            dst.copy_from_slice(&d[..n]);
        }
    }

    /// Offers the parked commands to their bdevs again, oldest first, until
    /// one still has to wait.
    fn run_throttled<F: Fabric>(&mut self, fab: &mut F) -> Result<(), Fault> {
        while self.close.is_none() {
            let Some(&idx) = self.throttled.front() else {
                break;
            };
            let res = match self.slots.get_mut(idx) {
                Some(slot) => {
                    let (cmd, data) = slot.cmd_and_data_mut();
                    self.qp.resume(cmd, data)
                }
                None => Exec::Pending,
            };
            if matches!(res, Exec::Throttled) {
                break;
            }
            self.throttled.pop_front();
            crate::qos::unpark_here(1);
            self.slots.set_state(idx, RequestState::ReadyToExecute);
            self.finish(fab, idx, res)?;
        }
        Ok(())
    }

    /// Completes slot `idx` with a status the transport or the engine made
    /// (never executed).
    pub fn complete_status<F: Fabric>(&mut self, fab: &mut F, idx: u16, status: Status) {
        let Some(cmd) = self.slots.get(idx).map(|s| s.cmd) else {
            return;
        };
        if !self.halves.is_empty() {
            // A fused half failed before it could run: its pair fails too.
            self.half_gone(fab, idx);
        }
        // The command consumed an SQ entry: the core moves SQHD and fills
        // it in.
        let c = self.qp.complete_unexecuted(&cmd, status);
        self.complete(fab, idx, c, false);
    }

    /// Hands slot `idx`'s data (if any) and response to the transport; with
    /// `zero_data` the data is the shared zero buffer, not the slot's (a
    /// null read: `Exec::CompleteZeroData`).
    #[inline]
    fn complete<F: Fabric>(&mut self, fab: &mut F, idx: u16, cqe: Completion, zero_data: bool) {
        let Some(slot) = self.slots.get(idx) else {
            return;
        };
        let (xfer, len) = (slot.xfer, slot.len);
        let ok = cqe.status().is_success();
        // Per-namespace counters and latency (capsule received → response
        // queued, here), from the command in its slot (no copy).
        self.qp.record_io(&slot.cmd, ok, slot.start_ns);
        if is_connect(&slot.cmd) {
            let cmd = slot.cmd;
            let slots = fab.slots_for(usize::from(self.qp.depth()));
            self.after_connect(&cmd, ok, slots);
        }
        self.slots.set_state(idx, RequestState::Completing);
        let data = if xfer == Xfer::CtrlToHost && len > 0 && ok {
            match zero_data
                .then(|| crate::backend::zeroes(len as usize))
                .flatten()
            {
                Some(z) => DataOut::Zeroes(z),
                None => {
                    if zero_data {
                        // Longer than the shared buffer (the backend
                        // checks, so not expected): zero the slot's own.
                        if let Some(s) = self.slots.get_mut(idx) {
                            s.data_mut(len as usize).fill(0);
                        }
                    }
                    DataOut::Slot(len)
                }
            }
        } else {
            DataOut::None
        };
        if fab.respond(&self.slots, idx, &cqe, data, self.sq_flow_disabled) {
            // Freed by `sent` once the data has left; the CID is free now
            // (the completion is on its way: the host may reuse it at once).
            self.slots.set_state(idx, RequestState::TransferringToHost);
            self.slots.release_cid(idx);
        } else {
            self.slots.release(idx);
        }
    }

    fn after_connect(&mut self, cmd: &Command, ok: bool, slots: usize) {
        if ok && self.qp.is_connected() {
            // As many slots as the transport has room to answer for
            // (`Fabric::slots_for`): beyond that a host is over its queue
            // size, which `alloc` turns into a protocol fault.
            let depth = slots.max(1);
            self.slots.grow(depth);
            self.need_buf.reserve(depth);
            self.throttled.reserve(depth);
            self.sq_flow_disabled = cmd.cattr() & CATTR_DISABLE_SQ_FLOW_CONTROL != 0;
        }
        // A rejected Connect (unknown subsystem, host not allowed, Busy...)
        // leaves the queue open and unconnected, as SPDK's target and nvmet
        // do: the host reads the status and hangs up itself. Only another
        // Connect is accepted; the daemon's connect timeout closes a
        // connection that never gets connected.
    }
}

/// Asks the transport about a Connect ([`Fabric::check_connect`]): the
/// controller ID comes from the Connect data, wherever it is (in the
/// capsule or fetched into the slot); without readable data the core's own
/// checks answer.
#[cold]
fn transport_connect_check<F: Fabric>(
    fab: &F,
    cmd: &Command,
    src: &Src<'_>,
    slot_data: &[u8],
) -> Result<(), Status> {
    let data: &[u8] = match src {
        Src::None => &[],
        Src::Capsule(d) => d,
        Src::Slot => slot_data,
    };
    let cntlid = nvmf_wire::fabrics::ConnectData::ref_from_prefix(data)
        .map(|(d, _)| d.cntlid())
        .unwrap_or(0);
    fab.check_connect(cmd.qid(), cmd.sqsize(), cntlid)
}

/// A Fabrics Connect command.
fn is_connect(cmd: &Command) -> bool {
    cmd.opcode() == AdminOpcode::FabricsCommand as u8 && cmd.fctype() == FabricsType::Connect as u8
}
