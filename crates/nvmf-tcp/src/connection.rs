//! One NVMe/TCP connection as a sans-I/O state machine: owns the receive
//! buffer and the decode loop, the connection phase (waiting for ICReq,
//! ready, terminating), the negotiated digests, the request slots, the core
//! `QueuePair` and the send queue. Input: bytes (`recv_buf` + `on_recv`) and
//! timer ticks (`poll`). Output: byte ranges for one `writev` (`output` +
//! `consume_output`) and a close request (`close_reason`).
//!
//! Request flow (compare SPDK's `nvmf_tcp_req_process` and the kernel's
//! `nvmet_tcp_done_recv_pdu`): CapsuleCmd → slot → (in-capsule data | R2T +
//! H2CData | C2H buffer) → `QueuePair::execute` → C2HData (slot buffer sent
//! in place) + CapsuleResp → slot freed once its bytes left. Protocol errors
//! send a C2HTermReq quoting the offending header and close the connection.
//!
//! Memory bounds of one connection (see docs/DESIGN.md, "Bounded memory"):
//! - receive buffer: grows to the largest PDU the decoder accepts (MAXH2CDATA
//!   or the in-capsule size plus headers, rounded up to a power of two: 256
//!   KiB with the defaults) and no further;
//! - slot buffers: depth × retained size, plus what the target-wide
//!   [`BufBudget`](crate::BufBudget) grants (commands that get nothing wait
//!   in a FIFO, state `NeedBuffer`);
//! - outstanding R2T data: at most `max_r2t_bytes` (one R2T is always
//!   allowed); an R2T whose data has not all arrived within `h2c_timeout`
//!   closes the connection;
//! - send queue: reading stops while more than `TX_BYTES_HIGH_WATER` header /
//!   response bytes (or `TX_HIGH_WATER` bytes including slot data sent in
//!   place) wait for the socket; what one receive buffer of commands and the
//!   late completions (at most one per slot, plus AERs) add on top is bounded
//!   by the queue depth, so a host that never reads cannot grow it further.

use crate::icreq;
use crate::request::{AllocError, BufPolicy, RequestState, Slots, Xfer};
use crate::txq::TxQueue;
use nvmf_core::{Exec, PortInfo, QueuePair, QueueState, Target, TransportLimits};
use nvmf_wire::command::{Command, SGL_ID_IN_CAPSULE, SGL_ID_TRANSPORT};
use nvmf_wire::completion::Completion;
use nvmf_wire::digest::crc32c;
use nvmf_wire::fabrics::CATTR_DISABLE_SQ_FLOW_CONTROL;
use nvmf_wire::opcode::{AdminOpcode, FabricsType};
use nvmf_wire::pdu::{
    decode, encode_c2h_data_header, encode_capsule_resp, encode_r2t, encode_term_req,
    offending_header, peek_layout, DecodeOpts, Decoded, EncodeOpts, Pdu, PduError, PduType, Role,
    DATA_LAST, DATA_SUCCESS, FES_DATA_LIMIT_EXCEEDED, FES_DATA_OUT_OF_RANGE,
    FES_HEADER_DIGEST_ERROR, FES_INVALID_HEADER_FIELD, FES_PDU_SEQUENCE_ERROR,
};
use nvmf_wire::status::Status;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// In-capsule data limit of the admin queue (NVMe/TCP: 8 KiB).
const ADMIN_ICD: u32 = 8192;
/// Slots before Connect (Connect itself, plus slack for a pipelining host).
const PRE_CONNECT_SLOTS: usize = 4;
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
/// How often `poll` looks for expired R2Ts and idle buffers to free.
const HOUSEKEEPING: Duration = Duration::from_millis(50);
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
const FABRICS_OPCODE: u8 = 0x7f;
const FCTYPE_CONNECT: u8 = 0x01;

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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but an ICReq is acceptable.
    AwaitIcReq,
    /// ICResp sent; commands flow.
    Ready,
}

/// Where a command's data lives when it is executed.
enum Src<'a> {
    None,
    /// In-capsule data, still in the receive buffer.
    Rx(&'a mut [u8]),
    /// The slot buffer (R2T data received, or room for C2H data).
    Slot,
}

/// One NVMe/TCP connection (see the module documentation).
pub struct Connection {
    /// Backend I/O still in flight points into `slots`' buffers: `Drop`
    /// hands them to the core, which frees them once that I/O is done.
    qp: QueuePair,
    params: TcpParams,
    phase: Phase,
    dopts: DecodeOpts,
    eopts: EncodeOpts,
    sqflow_disabled: bool,
    slots: Slots,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    /// Total bytes the decoder wants buffered before it can go on.
    rx_need: usize,
    tx: TxQueue,
    close: Option<&'static str>,
    late: Vec<Completion>,
    /// An H2CData payload being received straight into a slot buffer.
    direct: Option<Direct>,
    stats: ConnectionStats,
    /// Commands waiting for a data buffer or R2T allowance, oldest first
    /// (slots in state `NeedBuffer`; at most one per slot).
    need_buf: VecDeque<u16>,
    /// Slot releases + finished R2T transfers when the FIFO last failed to
    /// start its head: nothing to retry before this changes (or a tick).
    wait_mark: u64,
    /// R2T transfers finished (their allowance returned).
    r2t_done: u64,
    /// R2Ts whose data has not all arrived, and their bytes.
    r2t_count: u32,
    r2t_bytes: u64,
    /// The time of the last `poll` (timer tick): stamps R2Ts without a clock
    /// read per I/O.
    coarse_now: Instant,
    /// When `poll` next checks the H2CData timeout and idle buffers.
    next_housekeeping: Instant,
    /// When the bytes being processed were received (`stats::now_ns`).
    rx_ns: u64,
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

impl Drop for Connection {
    /// Never waits: request buffers that backend I/O still points into are
    /// handed to the core (`QueuePair::hand_over`), which frees them when
    /// the I/O finishes.
    fn drop(&mut self) {
        let slots = std::mem::replace(&mut self.slots, Slots::new(0, self.params.buffers.clone()));
        let bytes = slots.buffer_bytes();
        self.qp.hand_over(Box::new(slots), bytes);
    }
}

impl Connection {
    /// A new connection accepted on `port`.
    pub fn new(target: Arc<Target>, port: Arc<PortInfo>, params: &TcpParams) -> Connection {
        Connection {
            qp: QueuePair::new(target, port),
            params: params.clone(),
            phase: Phase::AwaitIcReq,
            dopts: DecodeOpts::new(Role::Target),
            eopts: EncodeOpts::new(false, false),
            sqflow_disabled: false,
            slots: Slots::new(PRE_CONNECT_SLOTS, params.buffers.clone()),
            rx: vec![0; RX_INITIAL],
            rx_start: 0,
            rx_end: 0,
            rx_need: 0,
            tx: TxQueue::with_capacity(64 * 1024, 256),
            close: None,
            late: Vec::with_capacity(16),
            direct: None,
            stats: ConnectionStats::default(),
            need_buf: VecDeque::new(),
            wait_mark: 0,
            r2t_done: 0,
            r2t_count: 0,
            r2t_bytes: 0,
            coarse_now: Instant::now(),
            next_housekeeping: Instant::now(),
            rx_ns: 0,
        }
    }

    /// The core queue pair (for statistics and tests).
    pub fn queue(&self) -> &QueuePair {
        &self.qp
    }

    pub fn stats(&self) -> &ConnectionStats {
        &self.stats
    }

    /// Where the next socket read should go: free space at the end of the
    /// receive buffer (compacted or grown as needed so that the PDU being
    /// assembled fits).
    pub fn recv_buf(&mut self) -> &mut [u8] {
        if let Some(d) = self.direct {
            if d.pos < d.end {
                if let Some(slot) = self.slots.get_mut(d.slot) {
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
        while !bytes.is_empty() && self.close.is_none() {
            let buf = self.recv_buf();
            let n = buf.len().min(bytes.len());
            buf[..n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.on_recv(n);
        }
    }

    /// Whether the reactor should read from the socket now.
    pub fn wants_read(&self) -> bool {
        self.close.is_none()
            && self.tx.pending() < TX_HIGH_WATER
            && self.tx.bytes_pending() < TX_BYTES_HIGH_WATER
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
        self.slots.executing() > 0
    }

    /// Whether this connection may move to another thread now: no command
    /// is executing in a backend (io_uring operations complete only on the
    /// ring of the thread that submitted them). Everything else it holds
    /// (buffered input, queued output, commands waiting for a buffer or for
    /// R2T data) is owned data and moves with it.
    pub fn movable(&self) -> bool {
        self.slots.executing() == 0 && self.qp.backend_ops_in_flight() == 0
    }

    /// Called by the thread that takes a connection over (after
    /// [`Connection::movable`] said yes on the old one): binds the queue's
    /// completion wake-ups to this thread. False when it could not (a
    /// command was executing); completions are then seen on the next poll.
    pub fn adopt_current_thread(&mut self) -> bool {
        self.movable() && self.qp.adopt_current_thread()
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

    /// Commands received and not yet answered (any slot not free: waiting
    /// for data, executing, sending read data); on the admin queue this
    /// includes outstanding Asynchronous Event Requests.
    pub fn in_flight(&self) -> usize {
        self.slots.in_use()
    }

    /// Commands waiting for a data buffer or R2T allowance.
    pub fn waiting_for_buffer(&self) -> usize {
        self.need_buf.len()
    }

    /// R2Ts whose data has not all arrived.
    pub fn r2ts_outstanding(&self) -> usize {
        self.r2t_count as usize
    }

    /// Bytes of slot buffers this connection has charged to the budget.
    pub fn buffer_bytes_charged(&self) -> usize {
        self.slots.charged()
    }

    /// Output is waiting to be written.
    pub fn has_output(&self) -> bool {
        !self.tx.is_empty()
    }

    /// Bytes waiting to be written.
    pub fn output_len(&self) -> usize {
        self.tx.pending()
    }

    /// Fills `iov` with queued output (headers from the send buffer, read
    /// data straight from slot buffers); returns the number of entries used.
    pub fn output<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> usize {
        let slots = &self.slots;
        self.tx.iovecs(iov, move |s, len| {
            slots.get(s).map(|slot| slot.data(len)).unwrap_or(&[])
        })
    }

    /// `n` bytes of `output()` were written.
    pub fn consume_output(&mut self, n: usize) {
        let slots = &mut self.slots;
        self.tx.consume(n, |s| {
            if slots.get(s).map(|x| x.state) == Some(RequestState::TransferringC2H) {
                slots.release(s);
            }
        });
        if !self.need_buf.is_empty() && self.wait_progress() != self.wait_mark {
            self.run_waiting();
        }
    }

    /// Set once the connection must be closed (after the queued output,
    /// e.g. a C2HTermReq, has been written).
    pub fn close_reason(&self) -> Option<&'static str> {
        self.close
    }

    /// Timer tick / loop turn: collects late completions (AER, asynchronous
    /// backends) and learns whether the queue must close.
    pub fn poll(&mut self, now: Instant) {
        if self.close.is_some() {
            return;
        }
        self.coarse_now = now;
        let mut late = std::mem::take(&mut self.late);
        let state = self.qp.poll(now, &mut |c| late.push(c));
        for c in late.drain(..) {
            match self.slots.find(c.cid(), RequestState::Executing) {
                Some(idx) => self.complete(idx, c),
                None => {
                    encode_capsule_resp(self.tx.buf(), &self.eopts, &c);
                    self.tx.commit_bytes();
                }
            }
        }
        self.late = late;
        if let QueueState::Close { reason } = state {
            self.close = Some(reason);
            return;
        }
        if now >= self.next_housekeeping {
            // At most every HOUSEKEEPING (poll also runs per loop turn for
            // connections with asynchronous commands): slot scans.
            self.next_housekeeping = now + HOUSEKEEPING;
            if self.r2t_count > 0 && !self.params.h2c_timeout.is_zero() {
                self.check_h2c_timeout(now);
            }
            if self.slots.charged() > 0 && self.slots.budget().under_pressure() {
                self.slots.trim_idle();
            }
        }
        if !self.need_buf.is_empty() {
            // Room may have been freed by other connections.
            self.run_waiting();
        }
    }

    /// Closes the connection when its oldest outstanding R2T has waited
    /// longer than `h2c_timeout` for its data.
    fn check_h2c_timeout(&mut self, now: Instant) {
        let Some(oldest) = self.slots.oldest_r2t() else {
            return;
        };
        let waited = now.saturating_duration_since(oldest);
        if waited > self.params.h2c_timeout {
            warn!(
                peer = %self.qp.port().peer,
                qid = self.qp.qid(),
                outstanding_r2ts = self.r2t_count,
                outstanding_bytes = self.r2t_bytes,
                waited_ms = waited.as_millis() as u64,
                "H2CData timeout: the host did not send the data it was asked for, closing"
            );
            self.close = Some("H2CData timeout");
        }
    }

    /// Slot releases plus finished R2T transfers: changes whenever room for
    /// a waiting command may have appeared in this connection.
    fn wait_progress(&self) -> u64 {
        self.slots.releases() + self.r2t_done
    }

    /// Starts waiting commands in order until the oldest cannot start.
    fn run_waiting(&mut self) {
        while self.close.is_none() {
            let Some(&idx) = self.need_buf.front() else {
                break;
            };
            match self.try_start(idx) {
                Ok(Start::Started) => {
                    self.need_buf.pop_front();
                }
                Ok(blocked) => {
                    self.wait_mark = self.wait_progress();
                    self.set_budget_waiter(blocked == Start::NoBuffer);
                    return;
                }
                Err(e) => {
                    self.need_buf.pop_front();
                    self.terminate(e, &[]);
                    break;
                }
            }
        }
        self.set_budget_waiter(false);
    }

    fn set_budget_waiter(&mut self, on: bool) {
        self.slots.set_waiter(on);
    }

    /// Starts slot `idx`'s data phase if there is room: for a write, a
    /// buffer and R2T allowance, then the R2T; for a read, a buffer, then
    /// execution.
    fn try_start(&mut self, idx: u16) -> Result<Start, PduError> {
        let Some(slot) = self.slots.get(idx) else {
            return Ok(Start::Started);
        };
        let (len, xfer, cid) = (slot.len, slot.xfer, slot.cmd.cid());
        if xfer == Xfer::HostToCtrl {
            if self.r2t_count > 0
                && self.r2t_bytes + u64::from(len) > u64::from(self.params.max_r2t_bytes)
            {
                return Ok(Start::NoR2tCredit);
            }
            if !self.slots.reserve(idx, len as usize, false) {
                return Ok(Start::NoBuffer);
            }
            if let Some(slot) = self.slots.get_mut(idx) {
                slot.received = 0;
                slot.r2t_at = self.coarse_now;
            }
            self.slots.set_state(idx, RequestState::AwaitingH2CData);
            encode_r2t(self.tx.buf(), &self.eopts, cid, idx, 0, len);
            self.tx.commit_bytes();
            self.stats.r2ts += 1;
            self.r2t_count += 1;
            self.r2t_bytes += u64::from(len);
            Ok(Start::Started)
        } else {
            if !self.slots.reserve(idx, len as usize, false) {
                return Ok(Start::NoBuffer);
            }
            self.slots.set_state(idx, RequestState::ReadyToExecute);
            self.execute(idx, Src::Slot)?;
            Ok(Start::Started)
        }
    }

    /// Starts slot `idx` (a command with data through the transport) now,
    /// or queues it behind the commands already waiting.
    #[inline]
    fn start_or_wait(&mut self, idx: u16, xfer: Xfer, len: u32) -> Result<(), PduError> {
        if xfer == Xfer::CtrlToHost && self.slots.fits_without_budget(idx, len as usize) {
            // The slot's buffer is big enough, or may grow within the
            // retained size: no budget, no wait.
            self.slots.reserve(idx, len as usize, true);
            return self.execute(idx, Src::Slot);
        }
        self.start_or_wait_slow(idx)
    }

    #[inline(never)]
    fn start_or_wait_slow(&mut self, idx: u16) -> Result<(), PduError> {
        if self.need_buf.is_empty() {
            match self.try_start(idx)? {
                Start::Started => return Ok(()),
                blocked => {
                    self.wait_mark = self.wait_progress();
                    self.set_budget_waiter(blocked == Start::NoBuffer);
                }
            }
        }
        self.stats.buffer_waits += 1;
        self.slots.set_state(idx, RequestState::NeedBuffer);
        self.need_buf.push_back(idx);
        Ok(())
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
        while self.close.is_none() && start < end {
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
                    self.stats.pdus_in += 1;
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
                        Pdu::CapsuleCmd {
                            hdr,
                            data_digest_ok,
                            ..
                        } => {
                            let cmd = hdr.cmd;
                            let data = &mut rx[doff..doff + dlen];
                            self.on_capsule(cmd, data, data_digest_ok)
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
        if !self.need_buf.is_empty()
            && self.close.is_none()
            && self.wait_progress() != self.wait_mark
        {
            self.run_waiting();
        }
        if self.slots.executing() > 0 && self.close.is_none() {
            self.poll(Instant::now());
        }
    }

    fn terminate(&mut self, e: PduError, offending: &[u8]) {
        warn!(
            peer = %self.qp.port().peer,
            fes = e.fes,
            fei = e.fei,
            "terminating connection: {}",
            e.msg
        );
        encode_term_req(self.tx.buf(), Role::Target, e.fes, e.fei, offending);
        self.tx.commit_bytes();
        self.close = Some(e.msg);
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
        let n = icreq::answer(req, &self.params, self.tx.buf())?;
        self.tx.commit_bytes();
        self.dopts.hdgst = n.hdgst;
        self.dopts.ddgst = n.ddgst;
        self.dopts.max_data_len = n
            .maxh2cdata
            .max(self.params.in_capsule_data_size)
            .max(ADMIN_ICD);
        self.eopts = EncodeOpts {
            hdgst: n.hdgst,
            ddgst: n.ddgst,
            pda: n.hpda,
        };
        self.phase = Phase::Ready;
        debug!(
            peer = %self.qp.port().peer,
            hdgst = n.hdgst,
            ddgst = n.ddgst,
            maxh2cdata = n.maxh2cdata,
            "ICReq accepted"
        );
        Ok(())
    }

    fn on_h2c_term(&mut self, fes: u16, fei: u32) {
        debug!(peer = %self.qp.port().peer, fes, fei, "host sent H2CTermReq");
        self.close = Some("host sent H2CTermReq");
    }

    fn require_ready(&self) -> Result<(), PduError> {
        if self.phase == Phase::Ready {
            Ok(())
        } else {
            Err(PduError::new(FES_PDU_SEQUENCE_ERROR, 0, "PDU before ICReq"))
        }
    }

    fn on_capsule(&mut self, cmd: Command, data: &mut [u8], ddok: bool) -> Result<(), PduError> {
        self.require_ready()?;
        self.stats.commands += 1;
        if !self.qp.is_connected() && !is_connect(&cmd) {
            // Nothing but a Connect may come first: fail before asking for
            // (or taking in) any data.
            return Err(PduError::new(
                FES_PDU_SEQUENCE_ERROR,
                0,
                "command before Fabrics Connect",
            ));
        }
        let idx = match self.slots.alloc(&cmd) {
            Ok(i) => i,
            Err(AllocError::CidConflict) if self.abandon_aer(cmd.cid()) => {
                match self.slots.alloc(&cmd) {
                    Ok(i) => i,
                    Err(_) => {
                        return Err(PduError::new(
                            FES_INVALID_HEADER_FIELD,
                            FEI_CAPSULE_CID,
                            "command ID already in use",
                        ))
                    }
                }
            }
            Err(AllocError::CidConflict) => {
                return Err(PduError::new(
                    FES_INVALID_HEADER_FIELD,
                    FEI_CAPSULE_CID,
                    "command ID already in use",
                ))
            }
            Err(AllocError::Full) => {
                return Err(PduError::new(
                    FES_PDU_SEQUENCE_ERROR,
                    0,
                    "more commands outstanding than the queue size",
                ))
            }
        };
        if let Some(s) = self.slots.get_mut(idx) {
            s.start_ns = self.rx_ns;
        }
        if !ddok {
            self.stats.digest_errors += 1;
            debug!(peer = %self.qp.port().peer, cid = cmd.cid(), "in-capsule data digest error");
            self.complete_status(idx, Status::TRANSIENT_TRANSPORT_ERROR);
            return Ok(());
        }
        let sgl = *cmd.sgl();
        let sgl_id = (sgl.sgl_type() << 4) | sgl.subtype();
        let len = sgl.length();
        let xfer = Xfer::of(&cmd);
        match xfer {
            Xfer::None => self.execute(idx, Src::None),
            Xfer::Bidi => {
                self.complete_status(idx, Status::INVALID_FIELD.with_dnr());
                Ok(())
            }
            _ if len == 0 => self.execute(idx, Src::None),
            _ if len > self.params.max_io_size => {
                self.complete_status(idx, Status::SGL_DATA_LENGTH_INVALID.with_dnr());
                Ok(())
            }
            Xfer::HostToCtrl if sgl_id == SGL_ID_IN_CAPSULE => {
                let icd = if self.qp.qid() == 0 {
                    ADMIN_ICD.max(self.params.in_capsule_data_size)
                } else {
                    self.params.in_capsule_data_size
                };
                if sgl.address() != 0 {
                    self.complete_status(idx, Status::SGL_OFFSET_INVALID.with_dnr());
                } else if len > icd || data.len() != len as usize {
                    self.complete_status(idx, Status::SGL_DATA_LENGTH_INVALID.with_dnr());
                } else if self.qp.needs_stable_buffers() {
                    // An asynchronous backend keeps using the data after
                    // execute() returns: the receive buffer moves, the
                    // (aligned) slot buffer does not.
                    // Within the retained size (no budget); must not wait:
                    // the data is in the receive buffer.
                    self.slots.reserve(idx, len as usize, true);
                    if let Some(slot) = self.slots.get_mut(idx) {
                        slot.len = len;
                        let dst = slot.data_mut(len as usize);
                        let n = dst.len();
                        dst.copy_from_slice(&data[..n]);
                    }
                    return self.execute(idx, Src::Slot);
                } else {
                    return self.execute(idx, Src::Rx(data));
                }
                Ok(())
            }
            Xfer::HostToCtrl if sgl_id == SGL_ID_TRANSPORT => {
                // Ask for the whole transfer in one R2T (once a buffer and
                // R2T allowance are there); the host splits it into
                // H2CData PDUs of at most MAXH2CDATA bytes.
                let Some(slot) = self.slots.get_mut(idx) else {
                    return Ok(());
                };
                slot.len = len;
                slot.received = 0;
                self.start_or_wait(idx, xfer, len)
            }
            Xfer::CtrlToHost if sgl_id == SGL_ID_TRANSPORT || sgl_id == SGL_ID_IN_CAPSULE => {
                if let Some(slot) = self.slots.get_mut(idx) {
                    slot.len = len;
                }
                self.start_or_wait(idx, xfer, len)
            }
            _ => {
                self.complete_status(idx, Status::SGL_INVALID_DESCRIPTOR_TYPE.with_dnr());
                Ok(())
            }
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

    fn on_h2c_data(&mut self, h: H2C, data: &[u8], ddok: bool) -> Result<(), PduError> {
        self.require_ready()?;
        self.stats.h2c_pdus += 1;
        let idx = self.check_h2c(&h)?;
        let Some(slot) = self.slots.get_mut(idx) else {
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
            .slots
            .get(h.ttag)
            .filter(|s| s.state == RequestState::AwaitingH2CData)
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
        let Some(slot) = self.slots.get_mut(idx) else {
            return Ok(());
        };
        slot.received = end;
        if !ddok {
            slot.digest_error = true;
        }
        if slot.received < slot.len {
            return Ok(());
        }
        // Transfer complete: its R2T allowance is free again.
        self.r2t_count = self.r2t_count.saturating_sub(1);
        self.r2t_bytes = self.r2t_bytes.saturating_sub(u64::from(slot.len));
        self.r2t_done += 1;
        if slot.digest_error {
            self.stats.digest_errors += 1;
            let cid = slot.cmd.cid();
            debug!(peer = %self.qp.port().peer, cid, "H2CData data digest error");
            self.complete_status(idx, Status::TRANSIENT_TRANSPORT_ERROR);
            return Ok(());
        }
        self.slots.set_state(idx, RequestState::ReadyToExecute);
        self.execute(idx, Src::Slot)
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
        self.stats.h2c_pdus += 1;
        let Some(slot) = self.slots.get_mut(idx) else {
            return Ok(false);
        };
        let len = slot.len as usize;
        let at = h.datao as usize;
        slot.data_mut(len)[at..at + have].copy_from_slice(&buf[lay.data_start..]);
        self.stats.direct_h2c += 1;
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
        let ok = match (digest, self.slots.get(d.slot)) {
            (Some(dg), Some(slot)) => crc32c(&slot.data(d.end as usize)[d.start as usize..]) == dg,
            _ => true,
        };
        self.h2c_landed(d.slot, d.end, ok)
    }

    // ---------------------------------------------------------------------
    // Execution and completion
    // ---------------------------------------------------------------------

    fn execute(&mut self, idx: u16, src: Src<'_>) -> Result<(), PduError> {
        let Some(slot) = self.slots.get_mut(idx) else {
            return Ok(());
        };
        let cmd = slot.cmd;
        let res = match src {
            Src::None => self.qp.execute(&cmd, &mut []),
            Src::Rx(d) => self.qp.execute(&cmd, d),
            Src::Slot => {
                let len = slot.len as usize;
                self.qp.execute(&cmd, slot.data_mut(len))
            }
        };
        match res {
            Exec::Complete(c) => {
                self.complete(idx, c);
                Ok(())
            }
            Exec::CompleteZeroData(c) => {
                self.complete_with(idx, c, true);
                Ok(())
            }
            Exec::Pending => {
                self.slots.set_state(idx, RequestState::Executing);
                Ok(())
            }
            Exec::Fatal { reason } => {
                self.slots.release(idx);
                Err(PduError::new(FES_PDU_SEQUENCE_ERROR, 0, reason))
            }
        }
    }

    /// Completes slot `idx` with a transport-made status (never executed).
    fn complete_status(&mut self, idx: u16, status: Status) {
        let Some(cmd) = self.slots.get(idx).map(|s| s.cmd) else {
            return;
        };
        // The command consumed an SQ entry: the core moves SQHD and fills
        // it in.
        let c = self.qp.complete_unexecuted(&cmd, status);
        self.complete(idx, c);
    }

    /// Queues C2H data (if any) and the response of slot `idx`.
    fn complete(&mut self, idx: u16, cqe: Completion) {
        self.complete_with(idx, cqe, false)
    }

    /// As `complete`; with `zero_data` the C2H data is the shared zero
    /// buffer, not the slot's (a null read: `Exec::CompleteZeroData`).
    fn complete_with(&mut self, idx: u16, cqe: Completion, zero_data: bool) {
        let Some(slot) = self.slots.get(idx) else {
            return;
        };
        let cmd = slot.cmd;
        let (xfer, len, start_ns) = (slot.xfer, slot.len, slot.start_ns);
        self.slots.set_state(idx, RequestState::Completing);
        let ok = cqe.status().is_success();
        // Per-namespace counters and latency (capsule received → response
        // queued, here).
        self.qp.record_io(&cmd, ok, start_ns);
        if cmd.opcode() == FABRICS_OPCODE && cmd.fctype() == FCTYPE_CONNECT {
            self.after_connect(&cmd, ok);
        }
        if xfer == Xfer::CtrlToHost && len > 0 && ok {
            let success_flag = self.params.c2h_success && self.sqflow_disabled;
            let flags = DATA_LAST | if success_flag { DATA_SUCCESS } else { 0 };
            encode_c2h_data_header(self.tx.buf(), &self.eopts, cmd.cid(), 0, 0, len, flags);
            let zeroes = zero_data
                .then(|| nvmf_core::backend::zeroes(len as usize))
                .flatten();
            match zeroes {
                Some(_) => self.tx.push_zeroes(idx, len as usize),
                None => {
                    if zero_data {
                        // Longer than the shared buffer (the backend checks,
                        // so not expected): zero the slot's own buffer.
                        if let Some(s) = self.slots.get_mut(idx) {
                            s.data_mut(len as usize).fill(0);
                        }
                    }
                    self.tx.push_slot(idx, len as usize)
                }
            }
            if self.eopts.ddgst {
                let crc = match zeroes {
                    Some(z) => crc32c(z),
                    None => self
                        .slots
                        .get(idx)
                        .map_or(0, |s| crc32c(s.data(len as usize))),
                };
                self.tx.buf().extend_from_slice(&crc.to_le_bytes());
            }
            if !success_flag {
                encode_capsule_resp(self.tx.buf(), &self.eopts, &cqe);
            }
            self.tx.commit_bytes();
            self.stats.c2h_pdus += 1;
            // Freed by consume_output() once the data has left.
            self.slots.set_state(idx, RequestState::TransferringC2H);
        } else {
            encode_capsule_resp(self.tx.buf(), &self.eopts, &cqe);
            self.tx.commit_bytes();
            self.slots.release(idx);
        }
    }

    fn after_connect(&mut self, cmd: &Command, ok: bool) {
        if ok && self.qp.is_connected() {
            let depth = usize::from(self.qp.depth()).max(1);
            self.slots.grow(depth);
            self.need_buf.reserve(depth);
            self.sqflow_disabled = cmd.cattr() & CATTR_DISABLE_SQ_FLOW_CONTROL != 0;
        }
        // A rejected Connect (unknown subsystem, host not allowed, Busy...)
        // leaves the connection open and unconnected, as SPDK's target and
        // nvmet do: the host reads the status and hangs up itself (SPDK's
        // host fails the queue without reporting the status if the socket
        // closes under it). Only another Connect is accepted; the reactor's
        // connect timeout closes a connection that never gets connected.
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

/// A Fabrics Connect command.
fn is_connect(cmd: &Command) -> bool {
    cmd.opcode() == AdminOpcode::FabricsCommand as u8 && cmd.fctype() == FabricsType::Connect as u8
}

/// Whether a command waiting for its data phase could start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    Started,
    /// The budget has no room for its buffer.
    NoBuffer,
    /// The connection's outstanding R2T data is at `max_r2t_bytes`.
    NoR2tCredit,
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
