//! One NVMe/TCP connection as a sans-I/O state machine: owns the receive
//! buffer and the decode loop, the connection phase (waiting for ICReq,
//! ready, terminating), the negotiated digests, H2CData placement and the
//! send queue; its commands' lifecycle is the core's `RequestEngine`, to
//! which this file is the NVMe/TCP [`Fabric`] (R2T to fetch host data,
//! C2HData + CapsuleResp to respond). Input: bytes (`recv_buf` + `on_recv`)
//! and timer ticks (`poll`). Output: byte ranges for one `writev` (`output`
//! + `consume_output`) and a close request (`close_reason`).
//!
//! Request flow (compare SPDK's `nvmf_tcp_req_process` and the kernel's
//! `nvmet_tcp_done_recv_pdu`): CapsuleCmd → engine (slot, buffer) →
//! (in-capsule data | R2T + H2CData | C2H buffer) → `QueuePair::execute` →
//! C2HData (slot buffer sent in place) + CapsuleResp → slot freed once its
//! bytes left. Protocol errors send a C2HTermReq quoting the offending
//! header and close the connection.
//!
//! Memory bounds of one connection (see docs/DESIGN.md, "Bounded memory"):
//! - receive buffer: grows to the largest PDU the decoder accepts (MAXH2CDATA
//!   or the in-capsule size plus headers, rounded up to a power of two: 256
//!   KiB with the defaults) and no further;
//! - slot buffers: depth × retained size, plus what the target-wide
//!   [`BufBudget`](nvmf_core::request::BufBudget) grants (commands that get
//!   nothing wait in the engine's FIFO, state `NeedBuffer`);
//! - outstanding R2T data: at most `max_r2t_bytes` (one R2T is always
//!   allowed); an R2T whose data has not all arrived within `h2c_timeout`
//!   closes the connection;
//! - send queue: reading stops while more than `TX_BYTES_HIGH_WATER` header /
//!   response bytes (or `TX_HIGH_WATER` bytes including slot data sent in
//!   place) wait for the socket; what one receive buffer of commands and the
//!   late completions (at most one per slot, plus AERs) add on top is bounded
//!   by the queue depth, so a host that never reads cannot grow it further.

use crate::icreq;
use crate::txq::{SendKind, TxQueue};
use nvmf_core::request::{
    BufPolicy, DataDesc, DataOut, Fabric, Fault, FaultKind, RequestEngine, RequestParams,
    RequestState, SglKind, Slots,
};
use nvmf_core::{PortInfo, QueuePair, Target, TransportLimits};
use nvmf_wire::command::{Command, SglDescriptor, SGL_ID_IN_CAPSULE, SGL_ID_TRANSPORT};
use nvmf_wire::completion::Completion;
use nvmf_wire::digest::crc32c;
use nvmf_wire::pdu::{
    decode, encode_c2h_data_header, encode_capsule_resp, encode_r2t, encode_term_req,
    offending_header, peek_layout, DecodeOpts, Decoded, EncodeOpts, Pdu, PduError, PduType, Role,
    DATA_LAST, DATA_SUCCESS, FES_DATA_LIMIT_EXCEEDED, FES_DATA_OUT_OF_RANGE,
    FES_HEADER_DIGEST_ERROR, FES_INVALID_HEADER_FIELD, FES_PDU_SEQUENCE_ERROR,
};
use nvmf_wire::zerocopy::FromBytes;
use nvmf_zerocopy::ZcTracker;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// In-capsule data limit of the admin queue (NVMe/TCP: 8 KiB).
const ADMIN_ICD: u32 = 8192;
/// Initial receive buffer; grows to the largest PDU actually seen.
const RX_INITIAL: usize = 64 * 1024;
/// Smallest free space worth a read() call.
const RX_MIN_READ: usize = 8 * 1024;
/// H2CData payloads with at least this much still to come are received
/// straight into the slot buffer.
const DIRECT_MIN: usize = 4096;
/// Stop reading while this much output is queued (backpressure), slot data
/// sent in place included.
const TX_HIGH_WATER: usize = 16 << 20;
/// Stop reading while this many header/response bytes (the send queue's own
/// memory) wait for the socket.
const TX_BYTES_HIGH_WATER: usize = 256 << 10;
/// Default of [`TcpParams::h2c_timeout`].
pub const H2C_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of [`TcpParams::max_r2t_bytes`].
pub const MAX_R2T_BYTES: u32 = 4 << 20;
/// FEI values: byte offsets of fields in the PDU header.
const FEI_CAPSULE_CID: u32 = 8 + 2;
const FEI_DATA_CCCID: u32 = 8;
const FEI_DATA_TTAG: u32 = 10;
const FEI_DATA_DATAO: u32 = 12;
const FEI_DATA_DATAL: u32 = 16;
/// Common header FLAGS byte (H2CData DATA_LAST).
const FEI_FLAGS: u32 = 1;
/// CapsuleCmd header: the 8-byte common header and the 64-byte command.
const CAPSULE_CMD_HLEN: usize = 72;

/// Transport parameters shared by every connection of a target.
#[derive(Debug, Clone)]
pub struct TcpParams {
    /// In-capsule data accepted on I/O queues (IOCCSZ - 64 bytes).
    pub in_capsule_data_size: u32,
    /// Largest transfer of one command (MDTS); bigger ones fail.
    pub max_io_size: u32,
    /// MAXH2CDATA announced in ICResp.
    pub maxh2cdata: u32,
    /// Finish successful reads with the C2HData SUCCESS flag instead of a
    /// response capsule (only on queues that disabled SQ flow control).
    pub c2h_success: bool,
    /// Slot data buffers: the target-wide budget (shared by every clone of
    /// these parameters), the retained size and the largest buffer.
    pub buffers: BufPolicy,
    /// R2T data one connection may have outstanding, in bytes; a write whose
    /// R2T would go beyond it waits until earlier transfers finish (one R2T
    /// is always allowed, whatever its size).
    pub max_r2t_bytes: u32,
    /// Close the connection when an R2T's data has not all arrived this long
    /// after the R2T was queued (checked on the timer tick; zero: never).
    pub h2c_timeout: Duration,
    /// Zero-copy sends of C2HData payloads of at least this many bytes
    /// (`MSG_ZEROCOPY`, `zerocopy.rs`); None: never. The connection then
    /// keeps room for as many responses waiting for the kernel as commands.
    pub zerocopy_threshold: Option<usize>,
    /// Keep sending zero-copy even when the kernel reports it copies
    /// (`--zerocopy-send always`, for measuring); otherwise it goes off for
    /// the connection after [`nvmf_zerocopy::COPIED_TO_STOP`] copies in a row.
    pub zerocopy_always: bool,
}

impl TcpParams {
    /// Parameters from the core's transport limits.
    pub fn new(limits: &TransportLimits, c2h_success: bool) -> TcpParams {
        let max_io = limits.max_io_size.max(4096);
        // A multiple of 4, at least 4 KiB, at most 128 KiB.
        let maxh2cdata = (max_io.min(128 * 1024) & !3).max(4096);
        let budget = usize::try_from(limits.data_buffer_budget()).unwrap_or(usize::MAX);
        let retain = (limits.in_capsule_data_size as usize).max(4096);
        TcpParams {
            in_capsule_data_size: limits.in_capsule_data_size,
            max_io_size: max_io,
            maxh2cdata,
            c2h_success,
            buffers: BufPolicy::new(budget, retain, max_io.max(ADMIN_ICD) as usize),
            max_r2t_bytes: MAX_R2T_BYTES,
            h2c_timeout: H2C_TIMEOUT,
            zerocopy_threshold: None,
            zerocopy_always: false,
        }
    }

    /// What the core's request engine enforces for these parameters.
    pub fn requests(&self) -> RequestParams {
        RequestParams {
            in_capsule_data_size: self.in_capsule_data_size,
            admin_in_capsule_data_size: ADMIN_ICD.max(self.in_capsule_data_size),
            max_io_size: self.max_io_size,
            buffers: self.buffers.clone(),
            max_fetch_bytes: self.max_r2t_bytes,
            fetch_timeout: self.h2c_timeout,
            fetch_timeout_name: "H2CData timeout",
        }
    }
}

/// Counters of one connection.
#[derive(Debug, Default, Clone, Copy)]
pub struct ConnectionStats {
    pub pdus_in: u64,
    pub commands: u64,
    pub r2ts: u64,
    pub h2c_pdus: u64,
    /// H2CData payloads received straight into their slot buffer.
    pub direct_h2c: u64,
    pub c2h_pdus: u64,
    pub digest_errors: u64,
    /// Commands that had to wait for a data buffer or R2T allowance.
    pub buffer_waits: u64,
    /// Zero-copy send calls made, and those the kernel reported it copied.
    pub zc_calls: u64,
    pub zc_copied: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but an ICReq is acceptable.
    AwaitIcReq,
    /// ICResp sent; commands flow.
    Ready,
}

/// One NVMe/TCP connection (see the module documentation).
pub struct Connection {
    /// The commands' lifecycle (slots, buffers, the core queue pair).
    /// Dropping it never waits for backend I/O in flight.
    engine: RequestEngine,
    /// The send side: what the engine calls to fetch data and respond.
    wire: Wire,
    params: TcpParams,
    phase: Phase,
    dopts: DecodeOpts,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    /// Total bytes the decoder wants buffered before it can go on.
    rx_need: usize,
    /// An H2CData payload being received straight into a slot buffer.
    direct: Option<Direct>,
    /// When the bytes being processed were received (`stats::now_ns`).
    rx_ns: u64,
}

/// The NVMe/TCP send side: the engine's [`Fabric`].
struct Wire {
    tx: TxQueue,
    eopts: EncodeOpts,
    c2h_success: bool,
    stats: ConnectionStats,
    /// Zero-copy calls not yet reported done (`zerocopy.rs`).
    zc: ZcTracker,
    /// Zero-copy allowed on this connection (threshold set).
    zc_on: bool,
}

/// Progress of a directly placed H2CData payload.
#[derive(Debug, Clone, Copy)]
struct Direct {
    slot: u16,
    /// DATAO of the PDU.
    start: u32,
    /// Next byte to receive (absolute offset in the transfer).
    pos: u32,
    /// DATAO + DATAL.
    end: u32,
    /// A 4-byte data digest follows the payload (it arrives through the
    /// receive buffer).
    ddgst: bool,
}

impl Fabric for Wire {
    /// With zero-copy sends, a read's slot stays busy after its response
    /// until the kernel is done with its data, while the host may already
    /// reuse the command's entry: room for as many again (as NVMe/RDMA).
    fn slots_for(&self, depth: usize) -> usize {
        if self.zc_on {
            2 * depth
        } else {
            depth
        }
    }

    #[inline]
    fn describe(&self, sgl: &SglDescriptor) -> DataDesc {
        let kind = match (sgl.sgl_type() << 4) | sgl.subtype() {
            SGL_ID_IN_CAPSULE => SglKind::InCapsule,
            SGL_ID_TRANSPORT => SglKind::Transport,
            _ => SglKind::Unsupported,
        };
        DataDesc {
            kind,
            len: sgl.length(),
        }
    }

    /// One R2T for the whole transfer (TTAG = slot index); the host splits
    /// it into H2CData PDUs of at most MAXH2CDATA bytes.
    fn fetch(&mut self, slots: &mut Slots, idx: u16, len: u32) {
        let Some(cid) = slots.get(idx).map(|s| s.cmd.cid()) else {
            return;
        };
        encode_r2t(self.tx.buf(), &self.eopts, cid, idx, 0, len);
        self.tx.commit_bytes();
    }

    #[inline]
    fn respond(
        &mut self,
        slots: &Slots,
        idx: u16,
        cqe: &Completion,
        data: DataOut,
        sq_flow_disabled: bool,
    ) -> bool {
        let len = match data {
            DataOut::None => {
                encode_capsule_resp(self.tx.buf(), &self.eopts, cqe);
                self.tx.commit_bytes();
                return false;
            }
            DataOut::Slot(len) => len,
            DataOut::Zeroes(z) => z.len() as u32,
        };
        let success_flag = self.c2h_success && sq_flow_disabled;
        let flags = DATA_LAST | if success_flag { DATA_SUCCESS } else { 0 };
        encode_c2h_data_header(self.tx.buf(), &self.eopts, cqe.cid(), 0, 0, len, flags);
        match data {
            DataOut::Zeroes(_) => self.tx.push_zeroes(idx, len as usize),
            _ => self.tx.push_slot(idx, len as usize),
        }
        if self.eopts.ddgst {
            let crc = match data {
                DataOut::Zeroes(z) => crc32c(z),
                _ => slots.get(idx).map_or(0, |s| crc32c(s.data(len as usize))),
            };
            self.tx.buf().extend_from_slice(&crc.to_le_bytes());
        }
        if !success_flag {
            encode_capsule_resp(self.tx.buf(), &self.eopts, cqe);
        }
        self.tx.commit_bytes();
        self.stats.c2h_pdus += 1;
        true
    }

    fn respond_unslotted(&mut self, cqe: &Completion) {
        encode_capsule_resp(self.tx.buf(), &self.eopts, cqe);
        self.tx.commit_bytes();
    }
}

/// The C2HTermReq for an engine fault.
fn fault_pdu(f: Fault) -> PduError {
    match f.kind {
        FaultKind::Sequence => PduError::new(FES_PDU_SEQUENCE_ERROR, 0, f.reason),
        FaultKind::CommandId => PduError::new(FES_INVALID_HEADER_FIELD, FEI_CAPSULE_CID, f.reason),
    }
}

impl Connection {
    /// A new connection accepted on `port`.
    pub fn new(target: Arc<Target>, port: Arc<PortInfo>, params: &TcpParams) -> Connection {
        Connection {
            engine: RequestEngine::new(target, port, &params.requests()),
            wire: Wire {
                tx: TxQueue::with_capacity(64 * 1024, 256),
                eopts: EncodeOpts::new(false, false),
                c2h_success: params.c2h_success,
                stats: ConnectionStats::default(),
                zc: ZcTracker::default(),
                zc_on: params.zerocopy_threshold.is_some(),
            },
            params: params.clone(),
            phase: Phase::AwaitIcReq,
            dopts: DecodeOpts::new(Role::Target),
            rx: vec![0; RX_INITIAL],
            rx_start: 0,
            rx_end: 0,
            rx_need: 0,
            direct: None,
            rx_ns: 0,
        }
    }

    /// The core queue pair (for statistics and tests).
    pub fn queue(&self) -> &QueuePair {
        self.engine.queue()
    }

    /// This connection's counters (PDUs from the wire, commands from the
    /// request engine).
    pub fn stats(&self) -> ConnectionStats {
        let e = self.engine.stats();
        ConnectionStats {
            commands: e.commands,
            r2ts: e.fetches,
            digest_errors: e.data_errors,
            buffer_waits: e.buffer_waits,
            ..self.wire.stats
        }
    }

    /// Where the next socket read should go: free space at the end of the
    /// receive buffer (compacted or grown as needed so that the PDU being
    /// assembled fits).
    pub fn recv_buf(&mut self) -> &mut [u8] {
        if let Some(d) = self.direct {
            if d.pos < d.end {
                if let Some(slot) = self.engine.slots_mut().get_mut(d.slot) {
                    let len = slot.len as usize;
                    let buf = slot.data_mut(len);
                    let end = (d.end as usize).min(buf.len());
                    return &mut buf[(d.pos as usize).min(end)..end];
                }
            }
        }
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        }
        let used = self.rx_end - self.rx_start;
        let free = self.rx.len() - self.rx_end;
        if free < RX_MIN_READ || used + free < self.rx_need {
            if self.rx_start > 0 {
                self.rx.copy_within(self.rx_start..self.rx_end, 0);
                self.rx_start = 0;
                self.rx_end = used;
            }
            let want = self.rx_need.max(used + RX_MIN_READ);
            if self.rx.len() < want {
                // Bounded: the decoder rejects PDUs larger than the
                // negotiated limits before asking for their bytes.
                self.rx.resize(want.next_power_of_two(), 0);
            }
        }
        &mut self.rx[self.rx_end..]
    }

    /// `n` bytes were read into `recv_buf()`: processes every complete PDU.
    pub fn on_recv(&mut self, n: usize) {
        if let Some(d) = self.direct.as_mut() {
            if d.pos < d.end {
                d.pos = (d.pos as usize + n).min(d.end as usize) as u32;
                if d.pos < d.end || d.ddgst {
                    // More payload to come, or its digest (read into the
                    // receive buffer next).
                    return;
                }
                let d = *d;
                self.direct = None;
                if let Err(e) = self.finish_direct(d, None) {
                    self.terminate(e, &[]);
                }
                return;
            }
        }
        self.rx_end = (self.rx_end + n).min(self.rx.len());
        // One clock read per receive: the arrival time of every command in
        // these bytes (latency statistics).
        self.rx_ns = nvmf_core::stats::now_ns();
        self.process();
    }

    /// Convenience for tests and simple callers: copies `bytes` in and
    /// processes them.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() && self.engine.close_reason().is_none() {
            let buf = self.recv_buf();
            let n = buf.len().min(bytes.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.on_recv(n);
        }
    }

    /// Whether the reactor should read from the socket now.
    pub fn wants_read(&self) -> bool {
        self.engine.close_reason().is_none()
            && self.wire.tx.pending() < TX_HIGH_WATER
            && self.wire.tx.bytes_pending() < TX_BYTES_HIGH_WATER
    }

    /// The ICReq/ICResp exchange is done (PDUs other than ICReq may flow).
    pub fn initialized(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// Bytes of an incomplete PDU are buffered.
    pub fn has_partial_input(&self) -> bool {
        self.rx_end > self.rx_start || self.direct.is_some()
    }

    /// Commands wait for an asynchronous backend (the reactor polls such
    /// connections when the backend signals completions).
    pub fn has_executing(&self) -> bool {
        self.engine.executing() > 0
    }

    /// Whether this connection may move to another thread now: no command
    /// is executing in a backend (io_uring operations complete only on the
    /// ring of the thread that submitted them). Everything else it holds
    /// (buffered input, queued output, commands waiting for a buffer or for
    /// R2T data) is owned data and moves with it.
    pub fn movable(&self) -> bool {
        self.engine.movable()
    }

    /// Called by the thread that takes a connection over (after
    /// [`Connection::movable`] said yes on the old one): binds the queue's
    /// completion wake-ups to this thread. False when it could not (a
    /// command was executing); completions are then seen on the next poll.
    pub fn adopt_current_thread(&mut self) -> bool {
        self.engine.adopt_current_thread()
    }

    /// I/O commands executing in a backend now (SPDK's `pending_bdev_io`):
    /// 0 on the admin queue, whose only long-lived commands are AERs.
    pub fn backend_pending(&self) -> usize {
        self.engine.backend_pending()
    }

    /// Commands received and not yet answered (any slot not free: waiting
    /// for data, executing, sending read data); on the admin queue this
    /// includes outstanding Asynchronous Event Requests.
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }

    /// Commands waiting for a data buffer or R2T allowance.
    pub fn waiting_for_buffer(&self) -> usize {
        self.engine.waiting_for_buffer()
    }

    /// R2Ts whose data has not all arrived.
    pub fn r2ts_outstanding(&self) -> usize {
        self.engine.fetches_outstanding()
    }

    /// Bytes of slot buffers this connection has charged to the budget.
    pub fn buffer_bytes_charged(&self) -> usize {
        self.engine.buffer_bytes_charged()
    }

    /// Output is waiting to be written.
    pub fn has_output(&self) -> bool {
        !self.wire.tx.is_empty()
    }

    /// Bytes waiting to be written.
    pub fn output_len(&self) -> usize {
        self.wire.tx.pending()
    }

    /// Fills `iov` with queued output (headers from the send buffer, read
    /// data straight from slot buffers); returns the number of entries used.
    pub fn output<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> usize {
        let slots = self.engine.slots();
        self.wire.tx.iovecs(iov, move |s, len| {
            slots.get(s).map(|slot| slot.data(len)).unwrap_or(&[])
        })
    }

    /// Like [`Self::output`], split for zero-copy sends (`TxQueue::iovecs_split`):
    /// how to make the call. Always [`SendKind::Copy`] when zero-copy is off
    /// for this connection, or the kernel has too many calls unreported.
    pub fn output_split<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> (usize, SendKind) {
        let slots = self.engine.slots();
        let data = move |s, len| slots.get(s).map(|slot| slot.data(len)).unwrap_or(&[]);
        match self.params.zerocopy_threshold {
            Some(t) if self.wire.zc_on && self.wire.zc.has_room() => {
                self.wire.tx.iovecs_split(iov, t, data)
            }
            _ => (
                self.wire.tx.iovecs(iov, data),
                SendKind::Copy { more: false },
            ),
        }
    }

    /// `n` bytes of a [`SendKind::ZeroCopy`] call were written (the call
    /// sent something, so the kernel numbered it).
    pub fn consume_output_zc(&mut self, n: usize) {
        let seq = self.wire.zc.sent();
        self.wire.stats.zc_calls += 1;
        let engine = &mut self.engine;
        self.wire.tx.consume_zc(n, seq, |s| engine.sent(s));
        self.release_reported();
        if let Err(f) = self.engine.after_output(&mut self.wire) {
            self.terminate(fault_pdu(f), &[]);
        }
    }

    /// The kernel reported zero-copy calls `lo..=hi` done (`copied`: it
    /// copied their data after all): their slots are released. Returns true
    /// when this report turned zero-copy off for the connection (the kernel
    /// copied [`nvmf_zerocopy::COPIED_TO_STOP`] calls in a row; calls
    /// already made are still reported and released as they come).
    pub fn zc_completed(&mut self, lo: u32, hi: u32, copied: bool) -> bool {
        self.wire.zc.complete(lo, hi, copied);
        self.wire.stats.zc_copied = self.wire.zc.copied;
        let engine = &mut self.engine;
        if self.wire.tx.release_done(&self.wire.zc, |s| engine.sent(s)) > 0 {
            if let Err(f) = self.engine.after_output(&mut self.wire) {
                self.terminate(fault_pdu(f), &[]);
            }
        }
        if self.wire.zc_on && !self.params.zerocopy_always && self.wire.zc.copies_everything() {
            self.wire.zc_on = false;
            return true;
        }
        false
    }

    /// Takes the record of zero-copy calls (for a closed connection whose
    /// calls the kernel has not all reported: the reactor keeps waiting).
    pub fn take_zc_calls(&mut self) -> ZcTracker {
        std::mem::take(&mut self.wire.zc)
    }

    /// Zero-copy calls the kernel has not reported done.
    pub fn zc_outstanding(&self) -> u32 {
        self.wire.zc.outstanding()
    }

    /// Slots held until the kernel reports their zero-copy calls done.
    pub fn zc_parked(&self) -> usize {
        self.wire.tx.zc_parked()
    }

    /// Releases slots parked for zero-copy calls the kernel has already
    /// reported: a slot whose last bytes went out in a copying call after
    /// its first ones went zero-copy (zero-copy turned off mid-slot, or
    /// ENOBUFS) is parked under that earlier call, which may have been
    /// reported before: no report would come to release it.
    #[inline]
    fn release_reported(&mut self) {
        if self.wire.tx.zc_parked() > 0 {
            let engine = &mut self.engine;
            self.wire.tx.release_done(&self.wire.zc, |s| engine.sent(s));
        }
    }

    /// `n` bytes of `output()` were written.
    pub fn consume_output(&mut self, n: usize) {
        let engine = &mut self.engine;
        self.wire.tx.consume(n, |s| engine.sent(s));
        self.release_reported();
        if let Err(f) = self.engine.after_output(&mut self.wire) {
            self.terminate(fault_pdu(f), &[]);
        }
    }

    /// Set once the connection must be closed (after the queued output,
    /// e.g. a C2HTermReq, has been written).
    pub fn close_reason(&self) -> Option<&'static str> {
        self.engine.close_reason()
    }

    /// Timer tick / loop turn: collects late completions (AER, asynchronous
    /// backends), learns whether the queue must close, expires R2Ts whose
    /// data never came, and retries commands waiting for a buffer.
    pub fn poll(&mut self, now: Instant) {
        if let Err(f) = self.engine.poll(&mut self.wire, now) {
            self.terminate(fault_pdu(f), &[]);
        }
    }

    // ---------------------------------------------------------------------
    // Decode loop
    // ---------------------------------------------------------------------

    fn process(&mut self) {
        let mut rx = std::mem::take(&mut self.rx);
        let mut start = self.rx_start;
        let end = self.rx_end;
        // The data digest of a directly placed payload comes first.
        if let Some(d) = self.direct {
            if d.pos < d.end || end - start < 4 {
                self.rx = rx;
                return;
            }
            self.direct = None;
            let digest = le32(&rx, start);
            start += 4;
            if let Err(e) = self.finish_direct(d, Some(digest)) {
                self.terminate(e, &[]);
            }
        }
        while self.engine.close_reason().is_none() && start < end {
            let pdu_start = start;
            let res = match decode(&rx[start..end], &self.dopts) {
                Err(e) => Err(e),
                Ok(Decoded::Incomplete { need }) => {
                    self.rx_need = need;
                    match self.try_direct(&rx[start..end]) {
                        Ok(true) => {
                            start = end;
                            self.rx_need = 0;
                            break;
                        }
                        Ok(false) => break,
                        Err(e) => Err(e),
                    }
                }
                Ok(Decoded::Pdu { len, pdu }) => {
                    start += len;
                    self.rx_need = 0;
                    self.wire.stats.pdus_in += 1;
                    // Copy what the handlers need out of the borrowed PDU,
                    // keeping only the data's position, so that in-capsule
                    // data can be handed to the core mutably in place.
                    let base = rx.as_ptr() as usize;
                    let data = pdu.data();
                    let dlen = data.len();
                    // Empty data may be a static slice outside `rx`.
                    let doff = if dlen == 0 {
                        0
                    } else {
                        (data.as_ptr() as usize).wrapping_sub(base)
                    };
                    match pdu {
                        Pdu::IcReq(req) => {
                            let req = *req;
                            self.on_icreq(&req)
                        }
                        Pdu::H2CTermReq { hdr, .. } => {
                            let (fes, fei) = (hdr.fes(), hdr.fei());
                            self.on_h2c_term(fes, fei);
                            Ok(())
                        }
                        Pdu::CapsuleCmd { data_digest_ok, .. } => {
                            // The command is used where it arrived (no
                            // copy): the receive buffer is split after the
                            // 72-byte header, the in-capsule data (if any)
                            // being behind it.
                            let hend = pdu_start + CAPSULE_CMD_HLEN;
                            let (head, tail) = rx.split_at_mut(hend);
                            let data = if dlen == 0 {
                                &mut []
                            } else {
                                let at = doff - hend;
                                &mut tail[at..at + dlen]
                            };
                            match Command::ref_from_bytes(&head[pdu_start + 8..]) {
                                Ok(cmd) => self.on_capsule(cmd, data, data_digest_ok),
                                Err(_) => Err(PduError::new(
                                    FES_INVALID_HEADER_FIELD,
                                    0,
                                    "CapsuleCmd header unreadable",
                                )),
                            }
                        }
                        Pdu::H2CData {
                            hdr,
                            data,
                            data_digest_ok,
                        } => {
                            let h = H2C {
                                cccid: hdr.cccid(),
                                ttag: hdr.ttag(),
                                datao: hdr.datao(),
                                datal: hdr.datal(),
                                last: hdr.last(),
                            };
                            self.on_h2c_data(h, data, data_digest_ok)
                        }
                        // Host-bound types never decode in the target role.
                        _ => Err(PduError::new(
                            FES_INVALID_HEADER_FIELD,
                            0,
                            "PDU type not valid from a host",
                        )),
                    }
                }
            };
            if let Err(e) = res {
                let quoted = offending_header(&rx[pdu_start..end]);
                self.terminate(e, quoted);
                break;
            }
        }
        if start >= end {
            self.rx_start = 0;
            self.rx_end = 0;
        } else {
            self.rx_start = start;
            self.rx_end = end;
        }
        self.rx = rx;
        if self.engine.close_reason().is_none() {
            if let Err(f) = self.engine.after_input(&mut self.wire) {
                self.terminate(fault_pdu(f), &[]);
            }
        }
    }

    fn terminate(&mut self, e: PduError, offending: &[u8]) {
        warn!(
            peer = %self.engine.queue().port().peer,
            fes = e.fes,
            fei = e.fei,
            "terminating connection: {}",
            e.msg
        );
        encode_term_req(self.wire.tx.buf(), Role::Target, e.fes, e.fei, offending);
        self.wire.tx.commit_bytes();
        self.engine.close(e.msg);
    }

    // ---------------------------------------------------------------------
    // PDU handlers
    // ---------------------------------------------------------------------

    fn on_icreq(&mut self, req: &nvmf_wire::pdu::IcReq) -> Result<(), PduError> {
        if self.phase != Phase::AwaitIcReq {
            return Err(PduError::new(
                FES_PDU_SEQUENCE_ERROR,
                0,
                "second ICReq on a connection",
            ));
        }
        let n = icreq::answer(req, &self.params, self.wire.tx.buf())?;
        self.wire.tx.commit_bytes();
        self.dopts.hdgst = n.hdgst;
        self.dopts.ddgst = n.ddgst;
        self.dopts.max_data_len = n
            .maxh2cdata
            .max(self.params.in_capsule_data_size)
            .max(ADMIN_ICD);
        self.wire.eopts = EncodeOpts {
            hdgst: n.hdgst,
            ddgst: n.ddgst,
            pda: n.hpda,
        };
        self.phase = Phase::Ready;
        debug!(
            peer = %self.engine.queue().port().peer,
            hdgst = n.hdgst,
            ddgst = n.ddgst,
            maxh2cdata = n.maxh2cdata,
            "ICReq accepted"
        );
        Ok(())
    }

    fn on_h2c_term(&mut self, fes: u16, fei: u32) {
        debug!(peer = %self.engine.queue().port().peer, fes, fei, "host sent H2CTermReq");
        self.engine.close("host sent H2CTermReq");
    }

    fn require_ready(&self) -> Result<(), PduError> {
        if self.phase == Phase::Ready {
            Ok(())
        } else {
            Err(PduError::new(FES_PDU_SEQUENCE_ERROR, 0, "PDU before ICReq"))
        }
    }

    fn on_capsule(&mut self, cmd: &Command, data: &mut [u8], ddok: bool) -> Result<(), PduError> {
        self.require_ready()?;
        if !ddok {
            debug!(peer = %self.engine.queue().port().peer, cid = cmd.cid(), "in-capsule data digest error");
        }
        self.engine
            .on_command(&mut self.wire, cmd, data, ddok, self.rx_ns)
            .map_err(fault_pdu)
    }

    fn on_h2c_data(&mut self, h: H2C, data: &[u8], ddok: bool) -> Result<(), PduError> {
        self.require_ready()?;
        self.wire.stats.h2c_pdus += 1;
        let idx = self.check_h2c(&h)?;
        let Some(slot) = self.engine.slots_mut().get_mut(idx) else {
            return Ok(());
        };
        let len = slot.len as usize;
        let end = h.datao as usize + data.len();
        // check_h2c: datao + datal <= len, and the buffer holds len bytes.
        slot.data_mut(len)[h.datao as usize..end].copy_from_slice(data);
        self.h2c_landed(idx, end as u32, ddok)
    }

    /// Validates an H2CData header against its command: the transfer tag
    /// names a slot waiting for data, the CCCID matches, and the data lands
    /// exactly where the previous PDU stopped and inside the transfer.
    /// Returns the slot.
    fn check_h2c(&self, h: &H2C) -> Result<u16, PduError> {
        let Some(slot) = self
            .engine
            .slots()
            .get(h.ttag)
            .filter(|s| s.state == RequestState::AwaitingHostData)
        else {
            return Err(PduError::new(
                FES_INVALID_HEADER_FIELD,
                FEI_DATA_TTAG,
                "H2CData for an unknown transfer tag",
            ));
        };
        if slot.cmd.cid() != h.cccid {
            return Err(PduError::new(
                FES_INVALID_HEADER_FIELD,
                FEI_DATA_CCCID,
                "H2CData command ID does not match its transfer tag",
            ));
        }
        if h.datal == 0 {
            return Err(PduError::new(
                FES_INVALID_HEADER_FIELD,
                FEI_DATA_DATAL,
                "H2CData without data",
            ));
        }
        if h.datal > self.params.maxh2cdata {
            return Err(PduError::new(
                FES_DATA_LIMIT_EXCEEDED,
                FEI_DATA_DATAL,
                "H2CData larger than MAXH2CDATA",
            ));
        }
        if h.datao != slot.received {
            return Err(PduError::new(
                FES_DATA_OUT_OF_RANGE,
                FEI_DATA_DATAO,
                "H2CData offset outside the requested range",
            ));
        }
        let end = u64::from(h.datao) + u64::from(h.datal);
        if end > u64::from(slot.len) {
            return Err(PduError::new(
                FES_DATA_OUT_OF_RANGE,
                FEI_DATA_DATAL,
                "H2CData beyond the command's transfer length",
            ));
        }
        // One R2T covers the whole transfer, so its last PDU (LAST set) is
        // exactly the one that ends the transfer.
        if h.last != (end == u64::from(slot.len)) {
            return Err(PduError::new(
                FES_INVALID_HEADER_FIELD,
                FEI_FLAGS,
                if h.last {
                    "H2CData LAST flag before the end of the transfer"
                } else {
                    "final H2CData without the LAST flag"
                },
            ));
        }
        Ok(h.ttag)
    }

    /// An H2CData payload ending at `end` is in slot `idx`'s buffer: when
    /// the transfer is complete, execute (or fail a digest error).
    fn h2c_landed(&mut self, idx: u16, end: u32, ddok: bool) -> Result<(), PduError> {
        let Some(slot) = self.engine.slots_mut().get_mut(idx) else {
            return Ok(());
        };
        slot.received = end;
        if !ddok {
            slot.data_error = true;
        }
        if slot.received < slot.len {
            return Ok(());
        }
        if slot.data_error {
            let cid = slot.cmd.cid();
            debug!(peer = %self.engine.queue().port().peer, cid, "H2CData data digest error");
        }
        // Transfer complete (a digest error fails the command there).
        self.engine.fetched(&mut self.wire, idx).map_err(fault_pdu)
    }

    /// Direct data placement: `buf` starts with an H2CData PDU whose header
    /// is here but whose payload mostly is not. Validate the header now, move
    /// the payload bytes already buffered into the slot, and let the next
    /// reads land straight in the slot buffer (no receive-buffer copy).
    /// Returns true when `buf` was consumed.
    fn try_direct(&mut self, buf: &[u8]) -> Result<bool, PduError> {
        let Some(lay) = peek_layout(buf, &self.dopts)? else {
            return Ok(false);
        };
        if lay.ty != PduType::H2CData || buf.len() < lay.data_start {
            return Ok(false);
        }
        let have = buf.len() - lay.data_start;
        let data_len = lay.data_len();
        if have >= data_len || data_len - have < DIRECT_MIN {
            return Ok(false);
        }
        if lay.hdgst {
            let want = crc32c(&buf[..lay.hlen]);
            if le32(buf, lay.hlen) != want {
                return Err(PduError::new(
                    FES_HEADER_DIGEST_ERROR,
                    0,
                    "header digest mismatch",
                ));
            }
        }
        let h = H2C {
            cccid: le16(buf, 8),
            ttag: le16(buf, 10),
            datao: le32(buf, 12),
            datal: le32(buf, 16),
            last: buf[1] & DATA_LAST != 0,
        };
        if h.datal as usize != data_len {
            return Err(PduError::new(
                FES_INVALID_HEADER_FIELD,
                FEI_DATA_DATAL,
                "DATAL does not match the PDU length",
            ));
        }
        self.require_ready()?;
        let idx = self.check_h2c(&h)?;
        self.wire.stats.h2c_pdus += 1;
        let Some(slot) = self.engine.slots_mut().get_mut(idx) else {
            return Ok(false);
        };
        let len = slot.len as usize;
        let at = h.datao as usize;
        slot.data_mut(len)[at..at + have].copy_from_slice(&buf[lay.data_start..]);
        self.wire.stats.direct_h2c += 1;
        self.direct = Some(Direct {
            slot: idx,
            start: h.datao,
            pos: h.datao + have as u32,
            end: h.datao + h.datal,
            ddgst: lay.ddgst,
        });
        Ok(true)
    }

    /// The direct payload is complete; `digest` is the received data
    /// digest when data digests are on.
    fn finish_direct(&mut self, d: Direct, digest: Option<u32>) -> Result<(), PduError> {
        let ok = match (digest, self.engine.slots().get(d.slot)) {
            (Some(dg), Some(slot)) => crc32c(&slot.data(d.end as usize)[d.start as usize..]) == dg,
            _ => true,
        };
        self.h2c_landed(d.slot, d.end, ok)
    }
}

/// Little-endian u16 at `at` (caller checked the bounds).
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Little-endian u32 at `at` (caller checked the bounds).
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The H2CData header fields the handler uses.
#[derive(Debug, Clone, Copy)]
struct H2C {
    cccid: u16,
    ttag: u16,
    datao: u32,
    datal: u32,
    /// DATA_LAST flag.
    last: bool,
}
