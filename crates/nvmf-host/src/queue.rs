//! queue.rs — `IoQueue`: one NVMe/TCP or NVMe/RDMA queue pair (admin or I/O)
//! with a fixed set of command slots, for pipelined, allocation-free I/O.
//! The slot bookkeeping here is shared by both links; the TCP link is
//! `transport.rs`, the RDMA link `rdma.rs` (see there for its work requests).
//!
//! Each slot is one command identifier (CID = slot index) plus a data buffer
//! of `buf_size` bytes, all allocated when the queue is created. The cycle:
//!
//! ```text
//! alloc() -> slot  ->  fill buf_mut(slot) (writes)  ->  submit*(slot, ..)
//!   -> poll(..) drives the socket -> next_completion() -> {slot, status}
//!   -> read buf(slot) (reads) -> submit again with the same slot, or release(slot)
//! ```
//!
//! `submit` only encodes the command capsule into the send buffer (with its
//! data in the capsule when it is a write no larger than the in-capsule limit);
//! `poll` writes everything queued in one go, reads as much as the socket
//! holds, and handles every complete PDU: R2T (answered with H2CData PDUs of
//! at most MAXH2CDATA bytes, straight from the slot's buffer), C2HData (copied
//! into the slot's buffer; with the SUCCESS flag it also completes the
//! command) and CapsuleResp. Nothing here allocates or locks after creation.
//! One queue belongs to one thread.

use crate::error::{Error, NvmeError, Result};
use crate::rdma::{LinkParams, RdmaLink};
use crate::transport::{Negotiated, RxEvent, RxSink, Transport, TransportParams, TxBuf};
use nvmf_wire::command::FLAGS_PSDT_SGL_MPTR_CONTIG;
use nvmf_wire::digest::crc32c;
use nvmf_wire::fabrics::{self, ConnectData};
use nvmf_wire::pdu::{self, CapsuleCmdHeader, CommonHeader, DataHeader, EncodeOpts, Pdu, PduType};
use nvmf_wire::zerocopy::IntoBytes;
use nvmf_wire::{Command, DataDirection, IoOpcode, SglDescriptor, Status};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// FUSE field of command dword 0: first / second half of a fused operation.
const FUSE_FIRST: u8 = 0x01;
const FUSE_SECOND: u8 = 0x02;

/// A slot (command) index; also the command's CID.
pub type Slot = u16;

/// Largest in-capsule data we put in an admin queue capsule (Connect data
/// and small admin writes), as Linux does: 8 KiB.
pub const ADMIN_IN_CAPSULE: u32 = 8192;

/// How to open a queue.
#[derive(Debug, Clone)]
pub struct QueueParams {
    /// "host:port".
    pub addr: String,
    /// 0 = admin queue.
    pub qid: u16,
    /// Queue size announced in Connect (SQSIZE = entries - 1); also the
    /// most commands outstanding at once.
    pub entries: u16,
    /// Slots (and buffers) actually allocated; at most `entries`.
    pub slots: u16,
    /// Bytes of data buffer per slot: the largest transfer of one command.
    pub buf_size: u32,
    /// Largest write sent as in-capsule data (0 = never).
    pub in_capsule: u32,
    pub transport: TransportParams,
    /// Keep Alive Timeout in ms (admin queue; 0 = none).
    pub kato_ms: u32,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub subnqn: String,
    /// 0xffff on the admin queue; the admin queue's CNTLID on I/O queues.
    pub cntlid: u16,
    /// Limit for the TCP connect, ICReq and Connect.
    pub timeout: Duration,
    /// Ask the target to disable SQ flow control (Connect CATTR bit 2): it
    /// may then end a read with a C2HData SUCCESS flag instead of a response
    /// capsule. This host never uses SQHD (it bounds commands by its slots).
    pub disable_sqflow: bool,
    /// TLS 1.3 with this PSK before the ICReq (None: clear text).
    pub tls: Option<nvmf_core::tls::psk::TlsPsk>,
    /// Whether the TLS session goes to the kernel's TLS after the handshake.
    pub ktls: nvmf_tls::Ktls,
    /// Zero-copy sends of H2C payloads (clear-text NVMe/TCP; None: copy).
    pub zerocopy: Option<ZeroCopySend>,
}

/// Zero-copy sends (`MSG_ZEROCOPY`) of write data from the slot buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroCopySend {
    /// Smallest payload sent zero-copy, in bytes.
    pub threshold: u32,
    /// Never turned off; else off for a connection whose calls the kernel
    /// reports it copied anyway (loopback, a NIC without scatter-gather).
    pub always: bool,
}

impl ZeroCopySend {
    /// The default: 16 KiB and up, off where the kernel copies anyway.
    pub const AUTO: ZeroCopySend = ZeroCopySend {
        threshold: 16384,
        always: false,
    };
}

/// The connection under a queue: one TCP socket or one RDMA queue pair.
enum Link {
    Tcp(Transport),
    Rdma(RdmaLink),
}

/// One finished command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoCompletion {
    pub slot: Slot,
    pub status: Status,
    pub dw0: u32,
    pub dw1: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    /// Allocated by the caller (or completed and not yet released).
    Owned,
    InFlight,
    /// Answered, waiting for the kernel's report of the zero-copy call
    /// that sent its data (still in flight for the caller).
    ZcWait,
}

#[derive(Debug, Clone, Copy)]
struct SlotInfo {
    state: State,
    dir: DataDirection,
    len: u32,
    /// C2H bytes received so far.
    received: u32,
    /// A C2HData PDU of this command failed its data digest.
    digest_error: bool,
    /// The caller's buffer this command's data moves to or from (null: the
    /// slot's own buffer).
    ext: *mut u8,
}

/// Everything but the connection, so PDU handling can borrow it while the
/// transport is borrowed for parsing.
pub(crate) struct Slots {
    qid: u16,
    info: Box<[SlotInfo]>,
    /// All slot buffers, `info.len() * buf_size` bytes, owned (freed in
    /// Drop). Held as a raw pointer because queued output refers to it
    /// (`TxBuf::push_ext`) while the caller fills other slots.
    bufs: *mut u8,
    bufs_len: usize,
    buf_size: usize,
    free: Vec<Slot>,
    done: VecDeque<IoCompletion>,
    inflight: usize,
    maxh2cdata: u32,
    sqhd: u16,
    /// Completions of writes whose data went out zero-copy, held until the
    /// kernel reports the call (the zero-copy call's number): the slot is
    /// the caller's again only when the kernel no longer reads its buffer.
    zc_held: Vec<(u32, IoCompletion)>,
    /// The kernel never reported some zero-copy call before the queue
    /// closed: the slot buffers are leaked, not freed (it may still read
    /// them).
    leak_bufs: bool,
}

/// An NVMe/TCP or NVMe/RDMA queue pair with preallocated command slots.
pub struct IoQueue {
    // Dropped before the slots: the RDMA link's memory region covers their buffers.
    t: Link,
    s: Slots,
    entries: u16,
    in_capsule: u32,
    cntlid: u16,
}

impl IoQueue {
    /// Connect a queue: TCP, ICReq/ICResp (or rdma_cm connect with the
    /// NVMe/RDMA private data when `p.transport.rdma`), Fabrics Connect. On
    /// success the queue is ready for commands; `cntlid()` is the
    /// controller's ID (from the Connect response on the admin queue).
    pub fn connect(p: &QueueParams) -> Result<IoQueue> {
        if p.entries < 2 {
            return Err(Error::InvalidArg(format!(
                "queue size {} is too small (minimum 2)",
                p.entries
            )));
        }
        let rdma = p.transport.rdma;
        if rdma && (p.transport.hdr_digest || p.transport.data_digest || p.tls.is_some()) {
            return Err(Error::InvalidArg(
                "header/data digests and TLS are NVMe/TCP options; NVMe/RDMA has neither".into(),
            ));
        }
        let nslots = p.slots.clamp(1, p.entries) as usize;
        let buf_size = p.buf_size.max(4096) as usize;
        let info = vec![
            SlotInfo {
                state: State::Free,
                dir: DataDirection::None,
                len: 0,
                received: 0,
                digest_error: false,
                ext: std::ptr::null_mut(),
            };
            nslots
        ]
        .into_boxed_slice();
        let mut free: Vec<Slot> = Vec::with_capacity(nslots);
        free.extend((0..nslots as u16).rev());
        let mut s = Slots {
            qid: p.qid,
            info,
            bufs: Box::into_raw(vec![0u8; nslots * buf_size].into_boxed_slice()) as *mut u8,
            bufs_len: nslots * buf_size,
            buf_size,
            free,
            done: VecDeque::with_capacity(nslots),
            inflight: 0,
            maxh2cdata: 0,
            sqhd: 0,
            zc_held: Vec::new(),
            leak_bufs: false,
        };
        let t = if rdma {
            Link::Rdma(RdmaLink::connect(
                &LinkParams {
                    addr: &p.addr,
                    qid: p.qid,
                    entries: p.entries,
                    cntlid: p.cntlid,
                    timeout: p.timeout,
                },
                &s,
            )?)
        } else {
            let t = Transport::connect(
                &p.addr,
                p.transport,
                buf_size as u32,
                p.timeout,
                p.tls.as_ref().map(|psk| (psk, p.ktls)),
            )?;
            s.maxh2cdata = t.negotiated().maxh2cdata;
            let mut t = t;
            if let (Some(z), None) = (p.zerocopy, &p.tls) {
                // A kernel without SO_ZEROCOPY: copy, unless always was asked.
                if let Err(e) = t.enable_zerocopy(z.threshold as usize, z.always, nslots) {
                    if z.always {
                        return Err(e);
                    }
                }
            }
            Link::Tcp(t)
        };
        let in_capsule = match (p.qid, rdma) {
            // The Linux target posts no in-capsule buffers on an RDMA admin queue.
            (0, true) => 0,
            (0, false) => ADMIN_IN_CAPSULE,
            _ => p.in_capsule,
        };
        let mut q = IoQueue {
            t,
            s,
            entries: p.entries,
            in_capsule,
            cntlid: p.cntlid,
        };

        // Fabrics Connect, with its 1024-byte data in the capsule.
        let slot = q.alloc().expect("fresh queue has a free slot");
        let cattr = if p.disable_sqflow {
            fabrics::CATTR_DISABLE_SQ_FLOW_CONTROL
        } else {
            0
        };
        let cmd = Command::connect(slot, p.qid, p.entries - 1, cattr, p.kato_ms);
        let data = ConnectData::new(p.hostid, p.cntlid, &p.subnqn, &p.hostnqn);
        q.buf_mut(slot)[..1024].copy_from_slice(data.as_bytes());
        let c = q.execute(slot, cmd, 1024, p.timeout).map_err(|e| match e {
            Error::Timeout(_) => Error::Timeout(format!(
                "no answer to Connect (qid {}) from {} within {:?}",
                p.qid, p.addr, p.timeout
            )),
            e => e,
        })?;
        q.release(slot);
        if !c.status.is_success() {
            return Err(Error::Nvme(NvmeError {
                op: "Connect",
                status: c.status,
                dw0: c.dw0,
                connect: true,
            }));
        }
        if p.qid == 0 {
            q.cntlid = c.dw0 as u16;
        }
        Ok(q)
    }

    // ---- queue facts ----

    pub fn qid(&self) -> u16 {
        self.s.qid
    }
    /// Controller ID this queue belongs to.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }
    /// Queue size announced in Connect.
    pub fn entries(&self) -> u16 {
        self.entries
    }
    /// Number of command slots (the most commands in flight at once).
    pub fn depth(&self) -> usize {
        self.s.info.len()
    }
    /// Data buffer bytes per slot.
    pub fn buf_size(&self) -> usize {
        self.s.buf_size
    }
    /// Writes up to this many bytes go in the command capsule.
    pub fn in_capsule_size(&self) -> u32 {
        self.in_capsule
    }
    /// Use in-capsule data for writes up to `n` bytes (0 = always R2T).
    pub fn set_in_capsule_size(&mut self, n: u32) {
        self.in_capsule = n;
    }
    /// Commands submitted and not completed yet.
    pub fn inflight(&self) -> usize {
        self.s.inflight
    }
    /// Completions waiting in `next_completion`.
    pub fn completions_ready(&self) -> usize {
        self.s.done.len()
    }
    /// Zero-copy sends of write data: calls made, calls the kernel copied
    /// anyway, and whether zero-copy is still on (all 0/false: off).
    pub fn zc_stats(&self) -> (u64, u64, bool) {
        match &self.t {
            Link::Tcp(t) => t.zc_stats(),
            Link::Rdma(_) => (0, 0, false),
        }
    }
    /// Free slots.
    pub fn free_slots(&self) -> usize {
        self.s.free.len()
    }
    /// Digest and data-size parameters of the connection (RDMA: none).
    pub fn negotiated(&self) -> Negotiated {
        match &self.t {
            Link::Tcp(t) => t.negotiated(),
            Link::Rdma(_) => Negotiated {
                hdr_digest: false,
                data_digest: false,
                cpda: 0,
                maxh2cdata: 0,
            },
        }
    }
    /// Whether this queue runs over NVMe/RDMA.
    pub fn is_rdma(&self) -> bool {
        matches!(self.t, Link::Rdma(_))
    }
    /// The fd to poll(2) for, for a caller that polls several queues itself:
    /// the socket, or the RDMA completion channel (armed whenever `poll`
    /// returns without a completion).
    pub fn raw_fd(&self) -> i32 {
        match &self.t {
            Link::Tcp(t) => t.raw_fd(),
            Link::Rdma(r) => r.raw_fd(),
        }
    }
    /// poll(2) events to wait for on `raw_fd()`.
    pub fn poll_events(&self) -> i16 {
        match &self.t {
            Link::Tcp(t) => t.poll_events(),
            Link::Rdma(_) => libc::POLLIN,
        }
    }
    /// Received bytes already decrypted (TLS) and not yet read: poll(2) on
    /// the socket would not see them; poll the queue without sleeping.
    pub fn has_buffered(&self) -> bool {
        match &self.t {
            Link::Tcp(t) => t.has_buffered(),
            Link::Rdma(_) => false,
        }
    }
    /// SQ head pointer from the latest response capsule.
    pub fn sq_head(&self) -> u16 {
        self.s.sqhd
    }

    // ---- slots ----

    /// Take a free slot, or None if all are in use.
    #[inline]
    pub fn alloc(&mut self) -> Option<Slot> {
        let s = self.s.free.pop()?;
        self.s.info[s as usize].state = State::Owned;
        Some(s)
    }

    /// Give a slot back (it must not be in flight).
    #[inline]
    pub fn release(&mut self, slot: Slot) {
        let i = &mut self.s.info[slot as usize];
        assert!(i.state == State::Owned, "release of a slot not owned");
        i.state = State::Free;
        self.s.free.push(slot);
    }

    /// The slot's data buffer.
    #[inline]
    pub fn buf(&self, slot: Slot) -> &[u8] {
        self.s.buf(slot as usize)
    }

    /// The slot's data buffer, to fill before a write. (Changing it while
    /// a write from it is in flight changes what is sent.)
    #[inline]
    pub fn buf_mut(&mut self, slot: Slot) -> &mut [u8] {
        self.s.buf_mut(slot as usize)
    }

    // ---- submission ----

    /// Queue command `cmd` on `slot` with a data transfer of `len` bytes
    /// (direction from the opcode). The CID and data pointer are filled in
    /// here. Output is only collected; `poll` (or `flush`) sends it.
    pub fn submit(&mut self, slot: Slot, mut cmd: Command, len: u32) -> Result<()> {
        let i = slot as usize;
        if i >= self.s.info.len() || self.s.info[i].state != State::Owned {
            return Err(Error::InvalidArg(format!("slot {slot} is not allocated")));
        }
        if len as usize > self.s.buf_size {
            return Err(Error::InvalidArg(format!(
                "transfer of {len} bytes exceeds the queue's {} byte buffers",
                self.s.buf_size
            )));
        }
        let dir = if len == 0 {
            DataDirection::None
        } else {
            cmd.data_direction()
        };
        cmd.set_cid(slot);
        cmd.flags = (cmd.flags & !nvmf_wire::command::FLAGS_PSDT_MASK) | FLAGS_PSDT_SGL_MPTR_CONTIG;
        match &mut self.t {
            Link::Tcp(t) => {
                let enc = t.encode_opts();
                if dir == DataDirection::HostToController && len <= self.in_capsule {
                    cmd.set_sgl(SglDescriptor::in_capsule(0, len));
                    let data = self.s.data_ptr(i);
                    encode_capsule_cmd_header(t.tx().bytes(), &enc, &cmd, len as usize);
                    // SAFETY: the slot buffer lives as long as the queue (which owns
                    // the TxBuf) and has at least `len` bytes.
                    unsafe { send_data(t.tx(), &enc, data, len as usize, i as u16) };
                } else {
                    cmd.set_sgl(SglDescriptor::transport(len));
                    pdu::encode_capsule_cmd(t.tx().bytes(), &enc, &cmd, &[]);
                }
            }
            Link::Rdma(r) => r.submit(&self.s, i, &mut cmd, dir, len, self.in_capsule)?,
        }
        self.s.info[i] = SlotInfo {
            state: State::InFlight,
            dir,
            len,
            received: 0,
            digest_error: false,
            ext: self.s.info[i].ext,
        };
        self.s.inflight += 1;
        Ok(())
    }

    /// Read `nlb` blocks at `slba` into the slot's buffer (`len` = nlb × block size).
    #[inline]
    pub fn submit_read(
        &mut self,
        slot: Slot,
        nsid: u32,
        slba: u64,
        nlb: u32,
        len: u32,
    ) -> Result<()> {
        let mut c = Command::new(IoOpcode::Read as u8, 0);
        c.set_nsid(nsid).set_lba_range(slba, nlb);
        self.submit(slot, c, len)
    }

    /// As [`IoQueue::submit_read`], with the data placed straight into the
    /// caller's `dst` instead of the slot's buffer (NVMe/TCP; no copy).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, and not read or
    /// written by anyone else, until the command's completion is taken.
    pub unsafe fn submit_read_into(
        &mut self,
        slot: Slot,
        nsid: u32,
        slba: u64,
        nlb: u32,
        len: u32,
        dst: *mut u8,
    ) -> Result<()> {
        let mut c = Command::new(IoOpcode::Read as u8, 0);
        c.set_nsid(nsid).set_lba_range(slba, nlb);
        self.submit_ext(slot, c, len, dst)
    }

    /// As [`IoQueue::submit_write`], with the data sent straight from the
    /// caller's `src` instead of the slot's buffer (NVMe/TCP; no copy).
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes, and unchanged, until the
    /// command's completion is taken.
    pub unsafe fn submit_write_from(
        &mut self,
        slot: Slot,
        nsid: u32,
        slba: u64,
        nlb: u32,
        len: u32,
        src: *const u8,
    ) -> Result<()> {
        let mut c = Command::new(IoOpcode::Write as u8, 0);
        c.set_nsid(nsid).set_lba_range(slba, nlb);
        self.submit_ext(slot, c, len, src as *mut u8)
    }

    /// `submit` with the command's data in the caller's buffer `ext`.
    unsafe fn submit_ext(
        &mut self,
        slot: Slot,
        cmd: Command,
        len: u32,
        ext: *mut u8,
    ) -> Result<()> {
        if matches!(self.t, Link::Rdma(_)) {
            return Err(Error::InvalidArg(
                "caller buffers are for NVMe/TCP queues (NVMe/RDMA moves only registered slot buffers)"
                    .into(),
            ));
        }
        let i = slot as usize;
        if i >= self.s.info.len() || self.s.info[i].state != State::Owned {
            return Err(Error::InvalidArg(format!("slot {slot} is not allocated")));
        }
        if ext.is_null() {
            return Err(Error::InvalidArg("null data buffer".into()));
        }
        self.s.info[i].ext = ext;
        let r = self.submit(slot, cmd, len);
        if r.is_err() {
            self.s.info[i].ext = std::ptr::null_mut();
        }
        r
    }

    /// Write `nlb` blocks at `slba` from the slot's buffer.
    #[inline]
    pub fn submit_write(
        &mut self,
        slot: Slot,
        nsid: u32,
        slba: u64,
        nlb: u32,
        len: u32,
    ) -> Result<()> {
        let mut c = Command::new(IoOpcode::Write as u8, 0);
        c.set_nsid(nsid).set_lba_range(slba, nlb);
        self.submit(slot, c, len)
    }

    /// Fused Compare and Write of `nlb` blocks at `slba` (`len` = nlb ×
    /// block size): a Compare (FUSE first) on `compare` whose buffer holds
    /// the expected data, and right behind it a Write (FUSE second) on
    /// `write` whose buffer holds the new data. The target writes only if
    /// the data matched, atomically (VMware's test-and-set): then both
    /// complete with success; on a miscompare the Compare gets Compare
    /// Failure and the Write Command Aborted due to Failed Fused Command.
    /// Nothing else may be submitted on this queue between the two, so both
    /// go out in this call.
    pub fn submit_compare_and_write(
        &mut self,
        compare: Slot,
        write: Slot,
        nsid: u32,
        slba: u64,
        nlb: u32,
        len: u32,
    ) -> Result<()> {
        if compare == write {
            return Err(Error::InvalidArg(
                "compare and write need two different slots".into(),
            ));
        }
        let mut c = Command::new(IoOpcode::Compare as u8, 0);
        c.set_nsid(nsid).set_lba_range(slba, nlb);
        c.flags |= FUSE_FIRST;
        let mut w = Command::new(IoOpcode::Write as u8, 0);
        w.set_nsid(nsid).set_lba_range(slba, nlb);
        w.flags |= FUSE_SECOND;
        // Check both before sending either: a lone first half would fail.
        for s in [compare, write] {
            let i = s as usize;
            if i >= self.s.info.len() || self.s.info[i].state != State::Owned {
                return Err(Error::InvalidArg(format!("slot {s} is not allocated")));
            }
        }
        if len as usize > self.s.buf_size {
            return Err(Error::InvalidArg(format!(
                "transfer of {len} bytes exceeds the queue's {} byte buffers",
                self.s.buf_size
            )));
        }
        self.submit(compare, c, len)?;
        self.submit(write, w, len)
    }

    /// Flush the namespace's volatile write cache.
    pub fn submit_flush(&mut self, slot: Slot, nsid: u32) -> Result<()> {
        let mut c = Command::new(IoOpcode::Flush as u8, 0);
        c.set_nsid(nsid);
        self.submit(slot, c, 0)
    }

    /// Write Zeroes over `nlb` blocks at `slba` (`deallocate` sets DEAC).
    pub fn submit_write_zeroes(
        &mut self,
        slot: Slot,
        nsid: u32,
        slba: u64,
        nlb: u32,
        deallocate: bool,
    ) -> Result<()> {
        let mut c = Command::new(IoOpcode::WriteZeroes as u8, 0);
        c.set_nsid(nsid).set_lba_range(slba, nlb);
        if deallocate {
            c.set_cdw12(c.cdw12() | (1 << 25));
        }
        self.submit(slot, c, 0)
    }

    /// Dataset Management, Deallocate (TRIM) of `(slba, nlb)` ranges (≤ 256).
    pub fn submit_deallocate(
        &mut self,
        slot: Slot,
        nsid: u32,
        ranges: &[(u64, u32)],
    ) -> Result<()> {
        if ranges.is_empty() || ranges.len() > 256 || ranges.len() * 16 > self.s.buf_size {
            return Err(Error::InvalidArg(format!(
                "{} DSM ranges (1 to 256 allowed)",
                ranges.len()
            )));
        }
        let buf = self.buf_mut(slot);
        for (k, &(slba, nlb)) in ranges.iter().enumerate() {
            let r = &mut buf[k * 16..k * 16 + 16];
            r[0..4].copy_from_slice(&0u32.to_le_bytes()); // context attributes
            r[4..8].copy_from_slice(&nlb.to_le_bytes());
            r[8..16].copy_from_slice(&slba.to_le_bytes());
        }
        let mut c = Command::new(IoOpcode::DatasetManagement as u8, 0);
        c.set_nsid(nsid)
            .set_cdw10(ranges.len() as u32 - 1)
            .set_cdw11(1 << 2); // AD: deallocate
        self.submit(slot, c, (ranges.len() * 16) as u32)
    }

    // ---- progress ----

    /// Send what was submitted without waiting. Returns true if all is out.
    pub fn flush(&mut self) -> Result<bool> {
        match &mut self.t {
            Link::Tcp(t) => t.flush(),
            // RDMA work requests are posted at submit.
            Link::Rdma(_) => Ok(true),
        }
    }

    /// Drive the connection: send pending output, receive and handle every
    /// PDU that has arrived. If no completion is ready and `timeout` is not
    /// zero, sleep in poll(2) up to `timeout` (None = forever) for more.
    /// Returns the number of completions ready for `next_completion`.
    pub fn poll(&mut self, timeout: Option<Duration>) -> Result<usize> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let t = match &mut self.t {
            Link::Tcp(t) => t,
            Link::Rdma(r) => return poll_rdma(r, &mut self.s, timeout, deadline),
        };
        loop {
            t.flush()?;
            // Drain what the socket has (bounded, so a busy queue returns).
            for _ in 0..8 {
                let n = t.recv()?;
                t.parse(&mut self.s)?;
                if n == 0 {
                    break;
                }
            }
            if t.tx().zc_outstanding() > 0 {
                let fd = t.raw_fd();
                // A failing error queue (the socket reset) is the receive
                // path's to report; unreported calls keep their completions.
                let _ = t.tx().zc_drain(fd);
                self.s.release_zc(t.tx());
            }
            if t.eof() {
                // Hand out what arrived before the close; the next poll fails.
                if !self.s.done.is_empty() {
                    return Ok(self.s.done.len());
                }
                return Err(Error::Closed(String::new()));
            }
            if t.tx_pending() {
                t.flush()?;
            }
            if !self.s.done.is_empty() || timeout == Some(Duration::ZERO) {
                return Ok(self.s.done.len());
            }
            let Some(left) = time_left(deadline) else {
                return Ok(0);
            };
            t.wait(left)?;
        }
    }

    /// Take the oldest completion. Its slot is owned by the caller again:
    /// read its buffer, submit it again, or `release` it.
    #[inline]
    pub fn next_completion(&mut self) -> Option<IoCompletion> {
        let c = self.s.done.pop_front();
        // The caller may refill the slot now: the kernel must be done with
        // any zero-copy call that sent from it (tests run debug builds).
        #[cfg(debug_assertions)]
        if let (Some(c), Link::Tcp(t)) = (&c, &self.t) {
            assert!(
                t.zc_unreported(c.slot as usize).is_none(),
                "completion of slot {} handed out before the kernel reported its zero-copy send",
                c.slot
            );
        }
        c
    }

    /// Take the completion of `slot` if it has arrived, leaving the others
    /// queued (for a long-lived command such as an Asynchronous Event
    /// Request on the admin queue).
    pub fn take_completion(&mut self, slot: Slot) -> Option<IoCompletion> {
        let pos = self.s.done.iter().position(|c| c.slot == slot)?;
        self.s.done.remove(pos)
    }

    /// Submit `cmd` on `slot` and wait for its completion (other completions
    /// stay queued). For admin commands and tools, not for the fast path.
    pub fn execute(
        &mut self,
        slot: Slot,
        cmd: Command,
        len: u32,
        timeout: Duration,
    ) -> Result<IoCompletion> {
        self.submit(slot, cmd, len)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pos) = self.s.done.iter().position(|c| c.slot == slot) {
                return Ok(self.s.done.remove(pos).expect("position is valid"));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout(format!(
                    "command (opcode {:#04x}) on queue {} not completed within {timeout:?}",
                    cmd.opcode(),
                    self.s.qid
                )));
            }
            self.poll(Some(deadline - now))?;
        }
    }

    /// Close the connection.
    pub fn shutdown(&self) {
        match &self.t {
            Link::Tcp(t) => t.shutdown(),
            Link::Rdma(r) => r.shutdown(),
        }
    }
}

/// What is left of a poll's `deadline`: `Some(None)` with none (wait for
/// ever), `Some(Some(left))` before it, `None` once it has passed.
fn time_left(deadline: Option<Instant>) -> Option<Option<Duration>> {
    match deadline {
        None => Some(None),
        Some(d) => d
            .checked_duration_since(Instant::now())
            .filter(|l| !l.is_zero())
            .map(Some),
    }
}

/// `IoQueue::poll` over RDMA: drain the CQ; when nothing completed, arm it,
/// look once more, then sleep on the completion channel (and CM events).
/// A poll with timeout 0 leaves the CQ armed, so `raw_fd()` wakes a caller
/// that polls it itself.
fn poll_rdma(
    r: &mut RdmaLink,
    s: &mut Slots,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
) -> Result<usize> {
    loop {
        r.progress(s)?;
        if !s.done.is_empty() {
            return Ok(s.done.len());
        }
        if r.arm()? {
            // A completion may have arrived before the arm: look again.
            continue;
        }
        if timeout == Some(Duration::ZERO) {
            return Ok(0);
        }
        let Some(left) = time_left(deadline) else {
            return Ok(0);
        };
        r.wait(left)?;
    }
}

// SAFETY: `bufs` is an allocation owned by this struct alone.
unsafe impl Send for Slots {}

impl Drop for IoQueue {
    /// Zero-copy calls the kernel has not reported when the queue goes: it
    /// may still read the slot buffers (a retransmission), so they are
    /// given up to 100 ms to be reported after the socket is shut down, and
    /// leaked (never freed early) if some are not.
    fn drop(&mut self) {
        let Link::Tcp(t) = &mut self.t else {
            return;
        };
        if t.tx().zc_outstanding() == 0 {
            return;
        }
        t.shutdown();
        let fd = t.raw_fd();
        let deadline = Instant::now() + Duration::from_millis(100);
        while t.tx().zc_outstanding() > 0 && Instant::now() < deadline {
            let _ = t.tx().zc_drain(fd);
            std::thread::sleep(Duration::from_millis(1));
        }
        if t.tx().zc_outstanding() > 0 {
            self.s.leak_bufs = true;
        }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if self.leak_bufs {
            return;
        }
        // SAFETY: `bufs`/`bufs_len` came from Box::into_raw of a boxed slice.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.bufs,
                self.bufs_len,
            )));
        }
    }
}

impl Slots {
    /// Number of slots.
    pub(crate) fn nslots(&self) -> usize {
        self.info.len()
    }
    /// Bytes per slot buffer.
    pub(crate) fn buf_size(&self) -> usize {
        self.buf_size
    }
    /// All slot buffers: start and length (slot i at i × buf_size).
    pub(crate) fn region(&self) -> (*mut u8, usize) {
        (self.bufs, self.bufs_len)
    }
    /// Completions waiting.
    pub(crate) fn done_len(&self) -> usize {
        self.done.len()
    }
    pub(crate) fn set_sqhd(&mut self, sqhd: u16) {
        self.sqhd = sqhd;
    }

    #[inline]
    fn buf_ptr(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.info.len());
        // SAFETY: i < slots, so the offset is inside the allocation.
        unsafe { self.bufs.add(i * self.buf_size) }
    }
    /// Where slot `i`'s command data is: the caller's buffer given to
    /// `submit_read_into`/`submit_write_from`, else the slot's own.
    #[inline]
    fn data_ptr(&self, i: usize) -> *mut u8 {
        let e = self.info[i].ext;
        if e.is_null() {
            self.buf_ptr(i)
        } else {
            e
        }
    }
    #[inline]
    fn buf(&self, i: usize) -> &[u8] {
        assert!(i < self.info.len(), "slot out of range");
        // SAFETY: in bounds; shared borrow of self.
        unsafe { std::slice::from_raw_parts(self.buf_ptr(i), self.buf_size) }
    }
    #[inline]
    fn buf_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.info.len(), "slot out of range");
        // SAFETY: in bounds; exclusive borrow of self.
        unsafe { std::slice::from_raw_parts_mut(self.buf_ptr(i), self.buf_size) }
    }

    pub(crate) fn slot_for(&mut self, cid: u16, what: &str) -> Result<usize> {
        let i = cid as usize;
        if i >= self.info.len() || self.info[i].state != State::InFlight {
            return Err(Error::Protocol(format!(
                "{what} for command id {cid}, which is not outstanding on queue {}",
                self.qid
            )));
        }
        Ok(i)
    }

    pub(crate) fn complete(&mut self, i: usize, status: Status, dw0: u32, dw1: u32) {
        self.complete_after(i, status, dw0, dw1, None);
    }

    /// As `complete`; with `zc_call`, the completion waits for the kernel's
    /// report of that zero-copy call (`release_zc`).
    fn complete_after(
        &mut self,
        i: usize,
        status: Status,
        dw0: u32,
        dw1: u32,
        zc_call: Option<u32>,
    ) {
        let info = &mut self.info[i];
        let status = if info.digest_error && status.is_success() {
            Status::TRANSIENT_TRANSPORT_ERROR
        } else {
            status
        };
        let c = IoCompletion {
            slot: i as Slot,
            status,
            dw0,
            dw1,
        };
        if let Some(seq) = zc_call {
            // Still in flight for the caller (and for a duplicate response,
            // which `slot_for` then refuses as for a free slot).
            info.state = State::ZcWait;
            self.zc_held.push((seq, c));
            return;
        }
        info.state = State::Owned;
        info.ext = std::ptr::null_mut();
        self.inflight -= 1;
        self.done.push_back(c);
    }

    /// Hands out the held completions whose zero-copy call the kernel has
    /// reported.
    fn release_zc(&mut self, tx: &TxBuf) {
        let mut k = 0;
        while k < self.zc_held.len() {
            if tx.zc_done(self.zc_held[k].0) {
                let (_, c) = self.zc_held.swap_remove(k);
                self.info[c.slot as usize].state = State::Owned;
                self.info[c.slot as usize].ext = std::ptr::null_mut();
                self.inflight -= 1;
                self.done.push_back(c);
            } else {
                k += 1;
            }
        }
    }

    /// Validate a C2HData header for `len` payload bytes; returns the slot.
    fn check_c2h(&mut self, hdr: &DataHeader, len: usize) -> Result<usize> {
        let i = self.slot_for(hdr.cccid(), "C2HData")?;
        let info = &self.info[i];
        let off = hdr.datao() as usize;
        if info.dir != DataDirection::ControllerToHost {
            return Err(Error::Protocol(format!(
                "C2HData for command {} that reads no data",
                hdr.cccid()
            )));
        }
        if off + len > info.len as usize {
            return Err(Error::Protocol(format!(
                "C2HData offset {off} + {len} beyond the {} byte transfer of command {}",
                info.len,
                hdr.cccid()
            )));
        }
        Ok(i)
    }

    /// Account C2HData payload that is in the slot buffer now.
    fn c2h_done(&mut self, i: usize, hdr: &DataHeader, len: usize, digest_ok: bool) -> Result<()> {
        let info = &mut self.info[i];
        if !digest_ok {
            info.digest_error = true;
        }
        info.received += len as u32;
        if hdr.success() {
            if info.received != info.len {
                return Err(Error::Protocol(format!(
                    "C2HData SUCCESS after {} of {} bytes",
                    info.received, info.len
                )));
            }
            self.complete(i, Status::SUCCESS, 0, 0);
        }
        Ok(())
    }

    fn handle(&mut self, pdu: &Pdu<'_>, tx: &mut TxBuf, enc: &EncodeOpts) -> Result<()> {
        match *pdu {
            Pdu::CapsuleResp(r) => {
                let cqe = &r.cqe;
                let i = self.slot_for(cqe.cid(), "response")?;
                self.sqhd = cqe.sqhd();
                let zc = tx.zc_unreported(i);
                self.complete_after(i, cqe.status(), cqe.dw0(), cqe.dw1(), zc);
            }
            Pdu::C2HData {
                hdr,
                data,
                data_digest_ok,
            } => {
                let i = self.check_c2h(hdr, data.len())?;
                let off = hdr.datao() as usize;
                // SAFETY: off + len <= the transfer length (checked), which fits
                // the slot's data buffer (its own, or the caller's of `submit_read_into`).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        self.data_ptr(i).add(off),
                        data.len(),
                    )
                };
                self.c2h_done(i, hdr, data.len(), data_digest_ok)?;
            }
            Pdu::R2T(r) => {
                let i = self.slot_for(r.cccid(), "R2T")?;
                let info = self.info[i];
                let (off, len) = (r.r2to() as usize, r.r2tl() as usize);
                if info.dir != DataDirection::HostToController {
                    return Err(Error::Protocol(format!(
                        "R2T for command {} that writes no data",
                        r.cccid()
                    )));
                }
                if len == 0 || off + len > info.len as usize {
                    return Err(Error::Protocol(format!(
                        "R2T offset {off} length {len} outside the {} byte transfer of command {}",
                        info.len,
                        r.cccid()
                    )));
                }
                let data = self.data_ptr(i);
                let chunk = self.maxh2cdata as usize;
                let mut done = 0;
                while done < len {
                    let n = chunk.min(len - done);
                    let last = done + n == len;
                    pdu::encode_h2c_data_header(
                        tx.bytes(),
                        enc,
                        r.cccid(),
                        r.ttag(),
                        (off + done) as u32,
                        n as u32,
                        if last { pdu::DATA_LAST } else { 0 },
                    );
                    // SAFETY: off + len <= the slot's transfer length <=
                    // buf_size (checked above); the buffer outlives the TxBuf
                    // contents (both belong to the queue).
                    unsafe { send_data(tx, enc, data.add(off + done), n, i as u16) };
                    done += n;
                }
            }
            other => {
                return Err(Error::Protocol(format!(
                    "unexpected {:?} PDU",
                    other.pdu_type()
                )))
            }
        }
        Ok(())
    }
}

impl RxSink for Slots {
    fn on_event(&mut self, ev: RxEvent<'_, '_>, tx: &mut TxBuf, enc: &EncodeOpts) -> Result<()> {
        match ev {
            RxEvent::Pdu(p) => self.handle(p, tx, enc),
            RxEvent::C2HPlaced { hdr, digest_ok } => {
                // Validated by c2h_place before the payload arrived.
                let i = hdr.cccid() as usize;
                self.c2h_done(i, hdr, hdr.datal() as usize, digest_ok)
            }
        }
    }

    fn c2h_place(&mut self, hdr: &DataHeader) -> Result<Option<*mut u8>> {
        let i = self.check_c2h(hdr, hdr.datal() as usize)?;
        // SAFETY: datao + datal <= the transfer length <= buf_size (checked).
        Ok(Some(unsafe { self.data_ptr(i).add(hdr.datao() as usize) }))
    }
}

/// Payloads smaller than this are copied into the send buffer; larger ones
/// are sent from the slot buffer by reference (gather send).
const COPY_BELOW: usize = 2048;

/// Queue `len` payload bytes at `data` and, if negotiated, their data digest.
///
/// # Safety
/// `data..data+len` must be valid for reads until the TxBuf is flushed.
#[inline]
unsafe fn send_data(tx: &mut TxBuf, enc: &EncodeOpts, data: *const u8, len: usize, slot: u16) {
    let bytes = std::slice::from_raw_parts(data, len);
    if len < COPY_BELOW {
        pdu::append_data(tx.bytes(), enc, bytes);
        return;
    }
    tx.push_slot_data(data, len, slot);
    if enc.ddgst {
        tx.bytes().extend_from_slice(&crc32c(bytes).to_le_bytes());
    }
}

// TODO(wire): a header-only capsule encoder (like `encode_h2c_data_header`)
// would let in-capsule data go out from the caller's buffer without this
// local copy of the framing rules.
/// Append a command capsule's header, header digest and padding for
/// `data_len` bytes of in-capsule data that the caller queues next.
fn encode_capsule_cmd_header(out: &mut Vec<u8>, enc: &EncodeOpts, cmd: &Command, data_len: usize) {
    if data_len == 0 {
        pdu::encode_capsule_cmd(out, enc, cmd, &[]);
        return;
    }
    let ty = PduType::CapsuleCmd;
    let hd = if enc.hdgst { 4 } else { 0 };
    let dd = if enc.ddgst { 4 } else { 0 };
    let align = (enc.pda as usize % 32 + 1) * 4;
    let pdo = (ty.hlen() + hd).div_ceil(align) * align;
    let plen = pdo + data_len + dd;
    let mut flags = 0;
    if enc.hdgst {
        flags |= pdu::HDGSTF;
    }
    if enc.ddgst {
        flags |= pdu::DDGSTF;
    }
    let h = CapsuleCmdHeader {
        ch: CommonHeader::new(ty, flags, pdo as u8, plen as u32),
        cmd: *cmd,
    };
    let start = out.len();
    out.extend_from_slice(h.as_bytes());
    if enc.hdgst {
        let d = crc32c(h.as_bytes());
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.resize(start + pdo, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write's response arrives while the zero-copy call that sent its
    /// data is unreported (a receiver that has read nothing): the
    /// completion is held, the slot stays in flight, and it is handed out
    /// once the kernel reports the call.
    #[test]
    fn a_write_completes_only_after_its_zero_copy_call_is_reported() {
        use nvmf_wire::pdu::{DecodeOpts, Role};
        use nvmf_wire::Completion;
        use std::io::Read;
        use std::net::{TcpListener, TcpStream};
        use std::os::fd::AsRawFd;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut rx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (sock, _) = l.accept().unwrap();
        sock.set_nonblocking(true).unwrap();
        nvmf_zerocopy::enable(sock.as_raw_fd()).unwrap();
        let fd = sock.as_raw_fd();
        let buf_size = 8usize << 20;
        let mut s = Slots {
            qid: 1,
            info: vec![
                SlotInfo {
                    state: State::Free,
                    dir: DataDirection::None,
                    len: 0,
                    received: 0,
                    digest_error: false,
                    ext: std::ptr::null_mut(),
                };
                2
            ]
            .into_boxed_slice(),
            bufs: Box::into_raw(vec![5u8; 2 * buf_size].into_boxed_slice()) as *mut u8,
            bufs_len: 2 * buf_size,
            buf_size,
            free: vec![0],
            done: VecDeque::new(),
            inflight: 1,
            maxh2cdata: 0,
            sqhd: 0,
            zc_held: Vec::new(),
            leak_bufs: false,
        };
        s.info[1].state = State::InFlight;
        s.info[1].dir = DataDirection::HostToController;
        s.info[1].len = buf_size as u32;
        let mut tx = TxBuf::new();
        tx.enable_zerocopy(16384, true, 2);
        let enc = EncodeOpts::default();
        // SAFETY: the slot buffer outlives the writes below.
        unsafe { send_data(&mut tx, &enc, s.buf_ptr(1), buf_size, 1) };
        assert!(!tx.write_to(fd).unwrap(), "8 MiB fit in the socket");
        assert!(tx.zc_unreported(1).is_some());
        // The target's answer (as if it had the data).
        let mut resp = Vec::new();
        pdu::encode_capsule_resp(
            &mut resp,
            &enc,
            &Completion::new(1, 1, 0, Status::SUCCESS, 0),
        );
        let Ok(pdu::Decoded::Pdu { pdu, .. }) = pdu::decode(&resp, &DecodeOpts::new(Role::Host))
        else {
            panic!("response does not decode");
        };
        s.handle(&pdu, &mut tx, &enc).unwrap();
        s.release_zc(&tx);
        assert!(
            s.done.is_empty(),
            "completion handed out with its zero-copy call unreported"
        );
        assert_eq!(s.inflight, 1);
        // The receiver takes everything; the kernel reports; the completion follows.
        let reader = std::thread::spawn(move || {
            let mut sink = vec![0u8; 1 << 20];
            let mut n = 0;
            rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            while n < (8 << 20) {
                match rx.read(&mut sink) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => n += k,
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tx.write_to(fd).unwrap() {
            assert!(Instant::now() < deadline, "write timed out");
            std::thread::sleep(Duration::from_millis(1));
        }
        reader.join().unwrap();
        while s.done.is_empty() {
            assert!(Instant::now() < deadline, "never reported");
            let _ = tx.zc_drain(fd);
            s.release_zc(&tx);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(s.done[0].slot, 1);
        assert_eq!(s.inflight, 0);
        assert!(s.info[1].state == State::Owned);
    }

    #[test]
    fn capsule_header_matches_the_wire_encoder() {
        let mut cmd = Command::new(IoOpcode::Write as u8, 7);
        cmd.set_nsid(1).set_lba_range(0, 8);
        cmd.set_sgl(SglDescriptor::in_capsule(0, 4096));
        let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        for (h, d, pda) in [
            (false, false, 0),
            (true, false, 0),
            (true, true, 0),
            (true, true, 3),
        ] {
            let enc = EncodeOpts {
                hdgst: h,
                ddgst: d,
                pda,
            };
            let mut want = Vec::new();
            pdu::encode_capsule_cmd(&mut want, &enc, &cmd, &data);
            let mut got = Vec::new();
            encode_capsule_cmd_header(&mut got, &enc, &cmd, data.len());
            pdu::append_data(&mut got, &enc, &data);
            assert_eq!(got, want, "hdgst {h} ddgst {d} pda {pda}");
        }
    }
}
