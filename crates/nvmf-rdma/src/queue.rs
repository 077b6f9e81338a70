//! One NVMe/RDMA queue as a sans-I/O state machine: the NVMe/RDMA binding
//! of the core's request engine, with no verbs call in it.
//!
//! Owns [`RdmaQueue`]: the receive buffers for command capsules (SQE +
//! in-capsule data, one per queue entry; none when the queue pair takes its
//! receives from a shared receive queue, see below), the response buffers (one CQE per
//! slot, plus a few for completions without a slot), the queue's RDMA READ
//! accounting (at most the negotiated read depth in flight; more wait in
//! order), and the core's `RequestEngine`, to which it is the [`Fabric`].
//! Input: work completions ([`RdmaQueue::on_completion`]) and timer ticks
//! ([`RdmaQueue::poll`]). Output: work requests ([`RdmaQueue::take_work`]),
//! which the caller posts to the queue pair, receives and sends each as one
//! list (one doorbell each), and a close request
//! ([`RdmaQueue::close_reason`]).
//!
//! Request flow (compare SPDK's `nvmf_rdma_request_process` and the
//! kernel's `nvmet_rdma_handle_command`): RECV completion → the SQE (and
//! in-capsule data) to the engine → keyed SGL write: RDMA READ into the
//! slot buffer, `fetched` on its completion → execute → read data: RDMA
//! WRITE from the slot buffer (unsignaled) followed by the response SEND
//! (signaled; SEND with Invalidate when the host's descriptor asked for it)
//! → the slot is free once the SEND completed, so neither its data nor its
//! response buffer is reused while the device may still read them. Every
//! RECV is reposted as soon as its capsule was handed over.
//!
//! Shared receive queue ([`RdmaQueueParams::shared_receives`]): the queue
//! owns no receive buffer and posts no receive. A capsule arrives in a
//! buffer of the device's [`RecvPool`]; [`RdmaQueue::on_shared_recv`]
//! parses the SQE in place and gives the in-capsule data to the engine, which
//! never keeps the capsule past the call (in-capsule data is copied into
//! the slot when the backend is asynchronous, else executed from the
//! buffer before it returns; a host over its queue size is a protocol
//! fault, so no command waits holding its capsule). The buffer goes back to
//! the pool before the call returns, also when the completion failed (a
//! flush) or the queue is closing: no copy, no buffer held across turns.
//!
//! Liveness ([`Liveness`]): a connected queue that saw no work completion
//! for [`Liveness::idle`] (10 s) gets a probe, a signaled zero-length RDMA
//! WRITE ([`WorkRequest::Probe`]: no local buffer, no remote key; the host's
//! HCA acknowledges it and touches no memory, the host sees no completion).
//! A probe that completes in error, or not within [`Liveness::deadline`]
//! (5 s), closes the queue: the peer is gone. This catches a host that died
//! when nothing else would: keep-alive off (KATO 0) and a queue pair whose
//! ACK timeout is infinite or whose retries outlast the wait (soft-RoCE).
//! While completions arrive no probe is sent; per I/O the cost is one
//! counter increment.
//!
//! Buffers the work requests name ([`Region`]) belong to this queue (receive
//! and response buffers, slot buffers) or are the shared zero buffer; the
//! caller registers them (once per buffer, not per I/O: slot buffers only
//! change when a slot's buffer grows) and translates regions to local keys.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_config::TransportType;
use nvmf_core::queue::AER_LIMIT;
use nvmf_core::request::{
    BufPolicy, DataDesc, DataOut, Fabric, Fault, RequestEngine, RequestParams, SglKind, Slots,
};
use nvmf_core::{PortInfo, QueuePair, Target};
use nvmf_wire::command::{Command, SglDescriptor, SGL_ID_IN_CAPSULE};
use nvmf_wire::completion::Completion;
use nvmf_wire::rdma::{ConnectRequest, KeyedSgl, KeyedSglError};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::{FromBytes, IntoBytes};
use tracing::debug;

use crate::srq::RecvPool;

/// Bytes of a submission queue entry.
const SQE_LEN: usize = 64;
/// Bytes of a completion queue entry.
const CQE_LEN: usize = 16;
/// Response buffers for completions without a slot (AERs answered after
/// their slot was given up).
const EXTRA_RESPONSES: usize = AER_LIMIT + 4;

/// When a queue probes its peer and when it gives up on it (see the module
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// A connected queue with no work completion for this long sends a
    /// probe (zero: never).
    pub idle: Duration,
    /// A probe not completed this long after it was posted closes the queue.
    pub deadline: Duration,
}

impl Default for Liveness {
    fn default() -> Liveness {
        Liveness {
            idle: Duration::from_secs(10),
            deadline: Duration::from_secs(5),
        }
    }
}

/// Parameters of one NVMe/RDMA queue.
#[derive(Debug, Clone)]
pub struct RdmaQueueParams {
    /// The request engine's limits (NVMe/RDMA's transport configuration).
    pub requests: RequestParams,
    /// Queue entries (HSQSIZE + 1 from the connect request): receive
    /// buffers posted, and the most commands outstanding.
    pub entries: u16,
    /// RDMA READs in flight at most (negotiated from the host's initiator
    /// depth and the device's limit).
    pub read_depth: u8,
    /// The queue pair takes its receives from a shared receive queue: no
    /// receive buffer of its own, capsules through
    /// [`RdmaQueue::on_shared_recv`].
    pub shared_receives: bool,
    /// The RDMA_CM connect request the queue was accepted for: its
    /// Fabrics Connect must name the same QID and SQSIZE (= HSQSIZE) and,
    /// for an I/O queue that named one, the same controller. `None` only
    /// where no CM exchange took place (in-process tests and tools): the
    /// queue still never holds more commands than `entries`.
    pub connect: Option<ConnectRequest>,
}

/// The request engine's limits for NVMe/RDMA queues: the RDMA transport's
/// configuration (`target`'s), with the caller's data timeout and fetch
/// allowance (nvmfd's `--h2c-timeout-ms` and `--max-r2t-bytes`).
pub fn request_params(
    target: &Target,
    fetch_timeout: Duration,
    max_fetch_bytes: u32,
) -> RequestParams {
    let l = target.limits_for(TransportType::Rdma);
    let max_io = l.max_io_size.max(4096);
    let budget = usize::try_from(l.data_buffer_budget()).unwrap_or(usize::MAX);
    RequestParams {
        in_capsule_data_size: l.in_capsule_data_size,
        admin_in_capsule_data_size: l.in_capsule_data_size,
        max_io_size: max_io,
        buffers: BufPolicy::new(
            budget,
            (l.in_capsule_data_size as usize).max(4096),
            max_io as usize,
        ),
        max_fetch_bytes,
        fetch_timeout,
        fetch_timeout_name: "RDMA READ timeout",
    }
}

/// A buffer a work request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// Receive buffer `i` (capsule: SQE + in-capsule data).
    Recv(u16),
    /// Response buffer `i` (one CQE; slots first, then the extra ones).
    Response(u16),
    /// Slot `i`'s data buffer.
    Slot(u16),
    /// The shared zero buffer (`backend::zeroes`), read only.
    Zeroes,
}

/// Local memory of a work request: `len` bytes at `offset` in `region`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Local {
    pub region: Region,
    pub offset: u32,
    pub len: u32,
}

/// A work request to post.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkRequest {
    /// Post a receive buffer (receive queue).
    Recv { wr_id: u64, local: Local },
    /// RDMA READ of host memory into `local` (signaled).
    Read {
        wr_id: u64,
        local: Local,
        remote_addr: u64,
        rkey: u32,
    },
    /// RDMA WRITE of `local` to host memory (unsignaled; the SEND after it
    /// on the same queue pair completes after it).
    Write {
        wr_id: u64,
        local: Local,
        remote_addr: u64,
        rkey: u32,
    },
    /// SEND of a response capsule (signaled); with `invalidate`, SEND with
    /// Invalidate of that remote key.
    Send {
        wr_id: u64,
        local: Local,
        invalidate: Option<u32>,
    },
    /// Liveness probe: a signaled zero-length RDMA WRITE (no scatter/gather
    /// entry, remote address and key 0, which a zero-length WRITE does not
    /// check).
    Probe { wr_id: u64 },
}

/// What completed, as the caller read it from the completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    /// The work request succeeded (IBV_WC_SUCCESS).
    pub ok: bool,
    /// Bytes received (receives only).
    pub byte_len: u32,
}

/// Work request ID kinds (high 32 bits of `wr_id`; the low bits are the
/// buffer or slot index).
const WR_RECV: u64 = 1 << 32;
const WR_READ: u64 = 2 << 32;
const WR_SEND: u64 = 3 << 32;
const WR_SEND_EXTRA: u64 = 4 << 32;
const WR_WRITE: u64 = 5 << 32;
const WR_PROBE: u64 = 7 << 32;
// The shared receive pool's kind is seen on the same completion queue: no
// kind of the queue's may equal it.
const _: () = {
    let kinds = [WR_RECV, WR_READ, WR_SEND, WR_SEND_EXTRA, WR_WRITE, WR_PROBE];
    let mut i = 0;
    while i < kinds.len() {
        assert!(kinds[i] != crate::srq::WR_SHARED_RECV);
        i += 1;
    }
};
const WR_KIND: u64 = 0xffff_ffff << 32;

/// The NVMe/RDMA side of the queue: the engine's [`Fabric`].
struct Wire {
    out: Vec<WorkRequest>,
    /// One CQE per slot, then `EXTRA_RESPONSES` more.
    responses: Vec<u8>,
    slots: usize,
    extra_free: Vec<u16>,
    read_depth: u8,
    reads_in_flight: u8,
    /// Slots whose RDMA READ waits for read depth, oldest first.
    reads_waiting: VecDeque<(u16, u32)>,
    /// SENDs posted and not completed (each holds a slot or an extra buffer).
    sends_in_flight: usize,
    /// The connect request's values the Fabrics Connect must match.
    cm: Option<ConnectRequest>,
    /// A response for a slot beyond the response buffers was asked for
    /// (cannot happen while the engine honours `slots_for`): the
    /// queue closes rather than write past or over a buffer.
    overflow: bool,
}

/// One NVMe/RDMA queue (see the module documentation).
pub struct RdmaQueue {
    engine: RequestEngine,
    wire: Wire,
    /// `entries` receive buffers of `recv_len` bytes each (none with a
    /// shared receive queue).
    recv: Vec<u8>,
    recv_len: usize,
    entries: u16,
    live: Liveness,
    /// Work completions seen (the probe's idle clock restarts when it moves).
    completions: u64,
    /// `completions` at the last tick, and since when it has not moved.
    seen: u64,
    quiet_since: Option<Instant>,
    /// The probe in flight: when it was posted.
    probe_at: Option<Instant>,
    /// Probes posted and answered (statistics and tests).
    probes: u64,
}

impl Wire {
    /// Writes `cqe` into response buffer `at`; `None` when there is no
    /// such buffer.
    fn response_slot(&mut self, at: usize, cqe: &Completion) -> Option<u16> {
        let b = self.responses.get_mut(at * CQE_LEN..(at + 1) * CQE_LEN)?;
        b.copy_from_slice(cqe.as_bytes());
        Some(at as u16)
    }

    fn post_read(&mut self, slots: &Slots, idx: u16, len: u32) {
        let Some(k) = slots
            .get(idx)
            .and_then(|s| KeyedSgl::decode(s.cmd.sgl()).ok())
        else {
            return;
        };
        self.reads_in_flight += 1;
        self.out.push(WorkRequest::Read {
            wr_id: WR_READ | u64::from(idx),
            local: Local {
                region: Region::Slot(idx),
                offset: 0,
                len,
            },
            remote_addr: k.address,
            rkey: k.key,
        });
    }
}

impl Fabric for Wire {
    fn describe(&self, sgl: &SglDescriptor) -> DataDesc {
        match KeyedSgl::decode(sgl) {
            Ok(k) => DataDesc {
                kind: SglKind::Transport,
                len: k.length,
            },
            Err(KeyedSglError::NotKeyed(_)) => {
                let id = (sgl.sgl_type() << 4) | sgl.subtype();
                DataDesc {
                    kind: if id == SGL_ID_IN_CAPSULE {
                        SglKind::InCapsule
                    } else {
                        SglKind::Unsupported
                    },
                    len: sgl.length(),
                }
            }
            Err(_) => DataDesc {
                kind: SglKind::Unsupported,
                len: sgl.keyed_length(),
            },
        }
    }

    fn fetch(&mut self, slots: &mut Slots, idx: u16, len: u32) {
        if self.reads_in_flight < self.read_depth {
            self.post_read(slots, idx, len);
        } else {
            self.reads_waiting.push_back((idx, len));
        }
    }

    fn respond(
        &mut self,
        slots: &Slots,
        idx: u16,
        cqe: &Completion,
        data: DataOut,
        _sq_flow_disabled: bool,
    ) -> bool {
        if usize::from(idx) >= self.slots {
            // Its response buffer would be an extra one (AER answers the
            // device may still be reading) or past the end.
            self.overflow = true;
            return false;
        }
        let keyed = slots
            .get(idx)
            .and_then(|s| KeyedSgl::decode(s.cmd.sgl()).ok());
        let local = match data {
            DataOut::None => None,
            DataOut::Slot(len) => Some(Local {
                region: Region::Slot(idx),
                offset: 0,
                len,
            }),
            DataOut::Zeroes(z) => Some(Local {
                region: Region::Zeroes,
                offset: 0,
                len: z.len() as u32,
            }),
        };
        if let (Some(local), Some(k)) = (local, keyed) {
            self.out.push(WorkRequest::Write {
                wr_id: WR_WRITE | u64::from(idx),
                local,
                remote_addr: k.address,
                rkey: k.key,
            });
        }
        let Some(at) = self.response_slot(usize::from(idx), cqe) else {
            self.overflow = true;
            return false;
        };
        self.out.push(WorkRequest::Send {
            wr_id: WR_SEND | u64::from(idx),
            local: Local {
                region: Region::Response(at),
                offset: 0,
                len: CQE_LEN as u32,
            },
            invalidate: keyed.filter(|k| k.invalidate).map(|k| k.key),
        });
        self.sends_in_flight += 1;
        // The slot (its data and its response buffer) stays busy until the
        // SEND completed.
        true
    }

    fn respond_unslotted(&mut self, cqe: &Completion) {
        let Some(i) = self.extra_free.pop() else {
            // At most AER_LIMIT such completions exist at once; more would
            // be a bug: drop with a log line rather than overwrite a buffer
            // the device may be reading.
            debug!(
                cid = cqe.cid(),
                "no free response buffer for a slotless completion"
            );
            return;
        };
        let Some(at) = self.response_slot(self.slots + usize::from(i), cqe) else {
            self.extra_free.push(i);
            return;
        };
        self.out.push(WorkRequest::Send {
            wr_id: WR_SEND_EXTRA | u64::from(i),
            local: Local {
                region: Region::Response(at),
                offset: 0,
                len: CQE_LEN as u32,
            },
            invalidate: None,
        });
        self.sends_in_flight += 1;
    }

    fn check_connect(&self, qid: u16, sqsize: u16, cntlid: u16) -> Result<(), Status> {
        let Some(req) = self.cm else {
            return Ok(());
        };
        if !req.matches_connect(qid, sqsize) {
            debug!(
                cm_qid = req.qid,
                cm_hsqsize = req.hsqsize,
                qid,
                sqsize,
                "NVMe/RDMA Connect does not match the connect request's QID/HSQSIZE: refused"
            );
            return Err(Status::CONNECT_INVALID_PARAMETERS.with_dnr());
        }
        if !req.is_admin() && req.cntlid != 0 && req.cntlid != cntlid {
            debug!(
                cm_cntlid = req.cntlid,
                cntlid,
                "NVMe/RDMA I/O Connect names another controller than its connect request: refused"
            );
            return Err(Status::CONNECT_INVALID_PARAMETERS.with_dnr());
        }
        Ok(())
    }

    fn slots_for(&self, depth: usize) -> usize {
        // A response's slot stays busy until its SEND completed, and the
        // host may reuse its submission queue entry (and CID) as soon as it
        // has the response: up to `depth` new commands while as many
        // responses are still in flight. Never more than the response
        // buffers (`self.slots`, twice the entries of the CM request).
        (2 * depth).min(self.slots)
    }
}

impl RdmaQueue {
    /// A queue accepted on `port` with `params`. Nothing is posted yet:
    /// [`RdmaQueue::start`] posts the receive buffers.
    pub fn new(target: Arc<Target>, port: Arc<PortInfo>, params: &RdmaQueueParams) -> RdmaQueue {
        let entries = params.entries.max(1);
        let recv_len = SQE_LEN + params.requests.in_capsule_data_size as usize;
        // Slots grow at Connect to twice the queue depth (`slots_for`): the
        // host may not have more than `entries` commands outstanding, and
        // as many responses may still be in flight (their SEND not yet
        // completed); a response buffer per slot.
        let slots = 2 * usize::from(entries);
        RdmaQueue {
            engine: RequestEngine::new(target, port, &params.requests),
            wire: Wire {
                out: Vec::with_capacity(2 * slots),
                responses: vec![0; (slots + EXTRA_RESPONSES) * CQE_LEN],
                slots,
                extra_free: (0..EXTRA_RESPONSES as u16).rev().collect(),
                read_depth: params.read_depth.max(1),
                reads_in_flight: 0,
                reads_waiting: VecDeque::new(),
                sends_in_flight: 0,
                cm: params.connect,
                overflow: false,
            },
            recv: if params.shared_receives {
                Vec::new()
            } else {
                vec![0; usize::from(entries) * recv_len]
            },
            recv_len,
            entries: if params.shared_receives { 0 } else { entries },
            live: Liveness::default(),
            completions: 0,
            seen: 0,
            quiet_since: None,
            probe_at: None,
            probes: 0,
        }
    }

    /// Sets when the queue probes its peer (default [`Liveness::default`]).
    pub fn set_liveness(&mut self, live: Liveness) {
        self.live = live;
    }

    /// Liveness probes posted so far.
    pub fn probes(&self) -> u64 {
        self.probes
    }

    /// Whether a liveness probe is in flight.
    pub fn probing(&self) -> bool {
        self.probe_at.is_some()
    }

    /// Posts every receive buffer (once, before accepting the connection;
    /// nothing with a shared receive queue).
    pub fn start(&mut self) {
        for i in 0..self.entries {
            self.post_recv(i);
        }
    }

    fn post_recv(&mut self, i: u16) {
        self.wire.out.push(WorkRequest::Recv {
            wr_id: WR_RECV | u64::from(i),
            local: Local {
                region: Region::Recv(i),
                offset: 0,
                len: self.recv_len as u32,
            },
        });
    }

    /// The core queue pair.
    pub fn queue(&self) -> &QueuePair {
        self.engine.queue()
    }

    /// Work requests to post, in order. Receives go to the receive queue,
    /// the rest to the send queue, each kind as one list.
    pub fn take_work(&mut self, into: &mut Vec<WorkRequest>) {
        into.append(&mut self.wire.out);
    }

    /// Whether work requests wait to be posted.
    pub fn has_work(&self) -> bool {
        !self.wire.out.is_empty()
    }

    /// The transport itself ends the queue (its completion queue failed).
    pub fn close_now(&mut self, reason: &'static str) {
        self.engine.close(reason);
    }

    /// Set once the queue must be disconnected.
    pub fn close_reason(&self) -> Option<&'static str> {
        if self.wire.overflow {
            return Some("NVMe/RDMA response buffers exceeded");
        }
        self.engine.close_reason()
    }

    /// Commands wait for an asynchronous backend.
    pub fn has_executing(&self) -> bool {
        self.engine.executing() > 0
    }

    /// Commands executing in a backend now.
    pub fn executing(&self) -> usize {
        self.engine.executing()
    }

    /// Commands received and not answered.
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }

    /// SENDs posted whose completion has not been seen: the queue pair must
    /// not be destroyed before they completed or were flushed.
    pub fn sends_in_flight(&self) -> usize {
        self.wire.sends_in_flight
    }

    /// The bytes of a region (the caller registers them; tests play the
    /// host's DMA through them).
    pub fn region_mut(&mut self, r: Region) -> &mut [u8] {
        match r {
            Region::Recv(i) => {
                let at = usize::from(i) * self.recv_len;
                self.recv.get_mut(at..at + self.recv_len).unwrap_or(&mut [])
            }
            Region::Response(i) => {
                let at = usize::from(i) * CQE_LEN;
                self.wire
                    .responses
                    .get_mut(at..at + CQE_LEN)
                    .unwrap_or(&mut [])
            }
            Region::Slot(i) => match self.engine.slots_mut().get_mut(i) {
                Some(s) => {
                    let cap = s.capacity();
                    s.data_mut(cap)
                }
                None => &mut [],
            },
            Region::Zeroes => &mut [],
        }
    }

    /// The allocation ID of slot `i`'s data buffer (0: none); see
    /// `Slot::buffer_id`.
    pub fn slot_buffer_id(&self, i: u16) -> u64 {
        self.engine.slots().get(i).map_or(0, |s| s.buffer_id())
    }

    /// All receive buffers (one registration).
    pub fn recv_buffers(&mut self) -> &mut [u8] {
        &mut self.recv
    }

    /// All response buffers (one registration).
    pub fn response_buffers(&mut self) -> &mut [u8] {
        &mut self.wire.responses
    }

    /// One work completion. Errors (a flushed or failed work request) close
    /// the queue: the connection is gone or broken.
    pub fn on_completion(&mut self, wc: &WorkCompletion, now_ns: u64) {
        let idx = (wc.wr_id & 0xffff) as u16;
        let kind = wc.wr_id & WR_KIND;
        self.completions = self.completions.wrapping_add(1);
        if kind == WR_PROBE {
            self.probe_at = None;
            if wc.ok {
                debug!(peer = %self.engine.queue().port().peer, qid = self.engine.queue().qid(), "liveness probe answered");
            } else {
                self.engine.close("liveness probe failed (peer gone)");
            }
            return;
        }
        if kind == WR_SEND || kind == WR_SEND_EXTRA {
            self.wire.sends_in_flight = self.wire.sends_in_flight.saturating_sub(1);
        }
        if kind == WR_READ {
            self.wire.reads_in_flight = self.wire.reads_in_flight.saturating_sub(1);
        }
        if !wc.ok {
            self.engine.close("RDMA work request failed or flushed");
            return;
        }
        let res = match kind {
            WR_RECV => self.on_recv(idx, wc.byte_len, now_ns),
            WR_READ => {
                let r = self.engine.fetched(&mut self.wire, idx);
                self.start_waiting_reads();
                r
            }
            WR_SEND => {
                self.engine.sent(idx);
                self.engine.after_output(&mut self.wire)
            }
            WR_SEND_EXTRA => {
                self.wire.extra_free.push(idx);
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(f) = res {
            self.fault(f);
        }
        self.check_overflow();
    }

    fn start_waiting_reads(&mut self) {
        while self.wire.reads_in_flight < self.wire.read_depth {
            let Some((idx, len)) = self.wire.reads_waiting.pop_front() else {
                break;
            };
            let slots = self.engine.slots();
            self.wire.post_read(slots, idx, len);
        }
    }

    fn on_recv(&mut self, i: u16, byte_len: u32, now_ns: u64) -> Result<(), Fault> {
        let at = usize::from(i) * self.recv_len;
        let len = (byte_len as usize).min(self.recv_len);
        let Some(buf) = self.recv.get_mut(at..at + len) else {
            return Ok(());
        };
        let r = on_capsule(&mut self.engine, &mut self.wire, buf, now_ns);
        // The capsule was consumed (in-capsule data copied or executed):
        // the buffer can take the next command.
        self.post_recv(i);
        r
    }

    /// A receive completion of a shared receive queue (its `wr_id` names a
    /// buffer of `pool`, it arrived on this queue's queue pair): the capsule
    /// is parsed from the pool's buffer, which is given back to the pool
    /// before this returns (the caller reposts the pool's idle buffers in a
    /// batch). A failed (flushed) receive closes the queue, as its own
    /// receives do. A `wr_id` the pool does not hold as posted is ignored.
    pub fn on_shared_recv(&mut self, pool: &mut RecvPool, wc: &WorkCompletion, now_ns: u64) {
        self.completions = self.completions.wrapping_add(1);
        let Some(i) = pool.complete(wc.wr_id) else {
            debug!(
                wr_id = wc.wr_id,
                "receive completion for a shared buffer not posted: ignored"
            );
            return;
        };
        if !wc.ok {
            pool.give_back(i);
            self.engine.close("RDMA work request failed or flushed");
            return;
        }
        let buf = pool.capsule(i, wc.byte_len as usize);
        let r = on_capsule(&mut self.engine, &mut self.wire, buf, now_ns);
        // The engine keeps nothing of the capsule (see the module
        // documentation): the buffer can go back at once.
        pool.give_back(i);
        if let Err(f) = r {
            self.fault(f);
        }
        self.check_overflow();
    }

    /// Timer tick: late completions, timeouts, buffer waits, liveness.
    pub fn poll(&mut self, now: Instant) {
        if let Err(f) = self.engine.poll(&mut self.wire, now) {
            self.fault(f);
        }
        self.check_overflow();
        self.check_liveness(now);
    }

    /// Probes a quiet peer; closes the queue when a probe went unanswered.
    fn check_liveness(&mut self, now: Instant) {
        if self.live.idle.is_zero() || self.engine.close_reason().is_some() {
            return;
        }
        if let Some(at) = self.probe_at {
            if now.saturating_duration_since(at) > self.live.deadline {
                debug!(peer = %self.engine.queue().port().peer, "liveness probe unanswered");
                self.engine
                    .close("liveness probe not answered in time (peer gone)");
            }
            return;
        }
        if self.completions != self.seen || !self.engine.queue().is_connected() {
            self.seen = self.completions;
            self.quiet_since = Some(now);
            return;
        }
        let since = *self.quiet_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= self.live.idle {
            debug!(peer = %self.engine.queue().port().peer, qid = self.engine.queue().qid(), "liveness probe sent");
            self.probe_at = Some(now);
            self.probes += 1;
            self.wire.out.push(WorkRequest::Probe { wr_id: WR_PROBE });
        }
    }

    /// Whether the queue owns its receive buffers (no shared receive queue).
    pub fn owns_receives(&self) -> bool {
        self.entries > 0
    }

    /// A response buffer overflow (see `Wire::overflow`) ends the queue.
    fn check_overflow(&mut self) {
        if self.wire.overflow && self.engine.close_reason().is_none() {
            debug!(peer = %self.engine.queue().port().peer, "NVMe/RDMA response buffers exceeded: disconnecting");
            self.engine.close("NVMe/RDMA response buffers exceeded");
        }
    }

    fn fault(&mut self, f: Fault) {
        debug!(peer = %self.engine.queue().port().peer, reason = f.reason, "NVMe/RDMA queue fault: disconnecting");
        self.engine.close(f.reason);
    }
}

/// One capsule (SQE + in-capsule data, `buf` as received) to the engine.
/// A capsule shorter than an SQE closes the queue.
fn on_capsule(
    engine: &mut RequestEngine,
    wire: &mut Wire,
    buf: &mut [u8],
    now_ns: u64,
) -> Result<(), Fault> {
    if buf.len() < SQE_LEN {
        engine.close("NVMe/RDMA capsule shorter than a command");
        return Ok(());
    }
    let (sqe, icd) = buf.split_at_mut(SQE_LEN);
    let Ok(cmd) = Command::ref_from_bytes(sqe) else {
        engine.close("NVMe/RDMA capsule unreadable");
        return Ok(());
    };
    engine.on_command(wire, cmd, icd, true, now_ns)?;
    engine.after_input(wire)
}
