//! RDMA verbs (libibverbs) for one connection's data path: the protection domain (one per
//! device, shared by every connection on it), completion queues with their completion channel
//! (an fd for epoll), shared receive queues (optional), the RC queue pair created on a
//! [`CmId`], memory registration of
//! caller-owned buffers, memory windows (type 2, bound by a work request: what an initiator
//! exposes so a target can invalidate it with Send with Invalidate), work requests posted in
//! batches (one list, one doorbell) and completions polled into a caller's array.
//!
//! A reactor's completion loop: [`CompletionQueue::arm`] once, then on each readable fd
//! [`CompletionQueue::drain_events`], [`CompletionQueue::poll`] until it returns 0,
//! [`CompletionQueue::arm`], and [`CompletionQueue::poll`] once more (a completion that landed
//! between the last poll and the arm raises no event).

use std::os::fd::RawFd;
use std::os::raw::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::cm::{set_nonblocking, CmId};
use crate::ffi::{self, ibv_context, ibv_cq};
use crate::{lib, Error, Result};

/// An RDMA device, as librdmacm opened it for a [`CmId`] ([`CmId::device`]). Valid while the
/// device exists: after a `DeviceRemoval` event drop every object made from it. Two ids on
/// the same device give equal values (a key for sharing one [`ProtectionDomain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    ctx: *mut ibv_context,
}

// SAFETY: an ibv_context may be used from any thread.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Device {
    /// A number that identifies the device within this process.
    pub fn key(&self) -> usize {
        self.ctx as usize
    }

    /// The device's limits (`ibv_query_device`).
    pub fn limits(&self) -> Result<DeviceLimits> {
        let l = lib()?;
        // SAFETY: all-zero is a valid ibv_device_attr; `ctx` is live.
        let mut a: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let r = unsafe { (l.ibv_query_device)(self.ctx, &mut a) };
        if r != 0 {
            return Err(Error::errno("ibv_query_device", r.abs()));
        }
        let u = |v: i32| v.max(0) as u32;
        Ok(DeviceLimits {
            max_qp_wr: u(a.max_qp_wr),
            max_sge: u(a.max_sge),
            max_cqe: u(a.max_cqe),
            max_mr_size: a.max_mr_size,
            max_qp_rd_atom: u(a.max_qp_rd_atom),
            max_qp_init_rd_atom: u(a.max_qp_init_rd_atom),
            max_mw: u(a.max_mw),
            max_srq: u(a.max_srq),
            max_srq_wr: u(a.max_srq_wr),
        })
    }
}

impl Device {
    /// The device's asynchronous-event fd (QP and CQ errors, port changes, device fatal),
    /// made non-blocking: register it with epoll (one owner per device) and call
    /// [`next_async_event`](Device::next_async_event) until `Ok(None)`.
    pub fn async_fd(&self) -> Result<RawFd> {
        // SAFETY: `ctx` is live.
        let fd = unsafe { (*self.ctx).async_fd };
        set_nonblocking(fd, "ibv_context.async_fd: O_NONBLOCK")?;
        Ok(fd)
    }

    /// The next asynchronous event, acknowledged; `Ok(None)` when none is pending (after
    /// [`async_fd`](Device::async_fd) made the fd non-blocking; before, this waits for one).
    pub fn next_async_event(&self) -> Result<Option<AsyncEvent>> {
        let l = lib()?;
        let mut ev = ffi::ibv_async_event {
            element: null_mut(),
            event_type: 0,
        };
        // SAFETY: `ctx` is live; `ev` receives the event.
        if unsafe { (l.ibv_get_async_event)(self.ctx, &mut ev) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(Error {
                op: "ibv_get_async_event",
                source: e,
            });
        }
        let kind = AsyncEventKind::from_raw(ev.event_type);
        let qp_num = match kind {
            AsyncEventKind::QpFatal
            | AsyncEventKind::QpRequestError
            | AsyncEventKind::QpAccessError
            | AsyncEventKind::CommEstablished
            | AsyncEventKind::SqDrained
            | AsyncEventKind::QpLastWqeReached
                if !ev.element.is_null() =>
            {
                // SAFETY: for QP events the element is the QP, live until acknowledged.
                Some(unsafe { (*(ev.element as *mut ffi::ibv_qp)).qp_num })
            }
            _ => None,
        };
        let port = match kind {
            AsyncEventKind::PortActive | AsyncEventKind::PortError => {
                Some(ev.element as usize as u32 as u8)
            }
            _ => None,
        };
        // SAFETY: acknowledged once, after its element was read.
        unsafe { (l.ibv_ack_async_event)(&mut ev) };
        Ok(Some(AsyncEvent { kind, qp_num, port }))
    }
}

/// An asynchronous event of a device (`struct ibv_async_event`, copied out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: AsyncEventKind,
    /// The QP it is about (QP events).
    pub qp_num: Option<u32>,
    /// The port (port events).
    pub port: Option<u8>,
}

/// `enum ibv_event_type`, the kinds a transport acts on named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEventKind {
    CqError,
    /// The QP is in the error state: tear its connection down.
    QpFatal,
    QpRequestError,
    QpAccessError,
    CommEstablished,
    SqDrained,
    /// The device is unusable: drop everything of it.
    DeviceFatal,
    PortActive,
    PortError,
    SrqError,
    SrqLimitReached,
    QpLastWqeReached,
    Other(u32),
}

impl AsyncEventKind {
    fn from_raw(v: u32) -> AsyncEventKind {
        use AsyncEventKind::*;
        match v {
            0 => CqError,
            1 => QpFatal,
            2 => QpRequestError,
            3 => QpAccessError,
            4 => CommEstablished,
            5 => SqDrained,
            8 => DeviceFatal,
            9 => PortActive,
            10 => PortError,
            14 => SrqError,
            15 => SrqLimitReached,
            16 => QpLastWqeReached,
            n => Other(n),
        }
    }
}

/// What a device allows (the part a transport sizes its queues and RDMA READ depth by).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per work request.
    pub max_sge: u32,
    /// Entries per completion queue.
    pub max_cqe: u32,
    /// Largest memory registration.
    pub max_mr_size: u64,
    /// RDMA READs a QP can serve at once as responder (`responder_resources` it can grant).
    pub max_qp_rd_atom: u32,
    /// RDMA READs a QP can have outstanding as requester (`initiator_depth`).
    pub max_qp_init_rd_atom: u32,
    /// Memory windows (0: none).
    pub max_mw: u32,
    /// Shared receive queues (0: none).
    pub max_srq: u32,
    /// Work requests per shared receive queue.
    pub max_srq_wr: u32,
}

impl CmId {
    /// The device this id is bound to: after `listen` on a specific address, address
    /// resolution, or on a connection request's id; `None` before (or on a wildcard listener).
    pub fn device(&self) -> Option<Device> {
        // SAFETY: `raw` is live.
        let ctx = unsafe { (*self.raw).verbs };
        (!ctx.is_null()).then_some(Device { ctx })
    }
}

/// A protection domain; memory regions, windows and QPs of one device share it.
pub struct ProtectionDomain {
    pd: *mut ffi::ibv_pd,
}

// SAFETY: libibverbs objects are thread-safe.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates one on `dev`.
    pub fn new(dev: Device) -> Result<Arc<ProtectionDomain>> {
        let l = lib()?;
        // SAFETY: `dev.ctx` is a live device context.
        let pd = unsafe { (l.ibv_alloc_pd)(dev.ctx) };
        if pd.is_null() {
            return Err(Error::last("ibv_alloc_pd"));
        }
        Ok(Arc::new(ProtectionDomain { pd }))
    }

    /// The device it belongs to.
    pub fn device(&self) -> Device {
        // SAFETY: `pd` is live.
        Device {
            ctx: unsafe { (*self.pd).context },
        }
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        if let Ok(l) = lib() {
            // SAFETY: every MR, MW and QP of this PD holds an Arc to it, so none is left.
            unsafe { (l.ibv_dealloc_pd)(self.pd) };
        }
    }
}

/// Memory access rights of a registration or window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Access(u32);

impl Access {
    /// The device may write it (receive buffers, RDMA READ destinations).
    pub const LOCAL_WRITE: Access = Access(ffi::IBV_ACCESS_LOCAL_WRITE);
    /// The peer may RDMA WRITE into it.
    pub const REMOTE_WRITE: Access = Access(ffi::IBV_ACCESS_REMOTE_WRITE);
    /// The peer may RDMA READ from it.
    pub const REMOTE_READ: Access = Access(ffi::IBV_ACCESS_REMOTE_READ);
    /// Memory windows may be bound to it.
    pub const MW_BIND: Access = Access(ffi::IBV_ACCESS_MW_BIND);

    /// The raw `IBV_ACCESS_*` bits.
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, o: Access) -> Access {
        Access(self.0 | o.0)
    }
}

/// A registration of caller-owned memory: its `lkey` for local scatter/gather entries and its
/// `rkey` for a peer's RDMA READ/WRITE. Deregistered when dropped.
pub struct MemoryRegion {
    mr: *mut ffi::ibv_mr,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs objects are thread-safe.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Registers `len` bytes at `addr` with `access`.
    ///
    /// # Safety
    /// The memory must stay allocated (and not be moved) until the region is dropped, and the
    /// caller must not rely on its contents while work requests or peers using the keys may
    /// write it (the device writes it behind the compiler's back).
    pub unsafe fn new(
        pd: &Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion> {
        let l = lib()?;
        if addr.is_null() || len == 0 {
            return Err(Error::invalid(
                "ibv_reg_mr",
                format!("cannot register {len} bytes at {addr:?}"),
            ));
        }
        let mr = (l.ibv_reg_mr)(pd.pd, addr as *mut c_void, len, access.0 as i32);
        if mr.is_null() {
            return Err(Error::last("ibv_reg_mr"));
        }
        Ok(MemoryRegion {
            mr,
            _pd: pd.clone(),
        })
    }

    /// Key for local scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is live.
        unsafe { (*self.mr).lkey }
    }

    /// Key a peer uses to reach this memory.
    pub fn rkey(&self) -> u32 {
        // SAFETY: `mr` is live.
        unsafe { (*self.mr).rkey }
    }

    /// Start address (as used in work requests).
    pub fn addr(&self) -> u64 {
        // SAFETY: `mr` is live.
        unsafe { (*self.mr).addr as u64 }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        // SAFETY: `mr` is live.
        unsafe { (*self.mr).length }
    }

    /// Whether it is empty (never: registration refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A scatter/gather entry for `len` bytes at `offset` in this region (not range-checked
    /// here: the device fails a work request outside the region with a protection error).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr() + offset as u64,
            len,
            lkey: self.lkey(),
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if let Ok(l) = lib() {
            // SAFETY: `mr` is live and deregistered once.
            unsafe { (l.ibv_dereg_mr)(self.mr) };
        }
    }
}

/// A type 2 memory window: a remote key over part of a [`MemoryRegion`] (registered with
/// [`Access::MW_BIND`]) bound by a [`SendOp::BindMw`] work request, invalidated by the peer's
/// Send with Invalidate (or a new bind). What an NVMe/RDMA initiator hands out per I/O.
pub struct MemoryWindow {
    mw: *mut ffi::ibv_mw,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs objects are thread-safe.
unsafe impl Send for MemoryWindow {}
// SAFETY: as above.
unsafe impl Sync for MemoryWindow {}

impl MemoryWindow {
    /// Allocates one (EOPNOTSUPP if the device has no memory windows).
    pub fn new(pd: &Arc<ProtectionDomain>) -> Result<MemoryWindow> {
        // SAFETY: `pd` is live, so is its context.
        let ops = unsafe { ffi::ops((*pd.pd).context) };
        let Some(alloc) = ops.alloc_mw else {
            return Err(Error::errno("ibv_alloc_mw", libc::EOPNOTSUPP));
        };
        // SAFETY: the device's own alloc_mw on its PD.
        let mw = unsafe { alloc(pd.pd, ffi::IBV_MW_TYPE_2) };
        if mw.is_null() {
            return Err(Error::last("ibv_alloc_mw"));
        }
        Ok(MemoryWindow {
            mw,
            _pd: pd.clone(),
        })
    }

    /// The rkey the device gave it at allocation (a bind uses [`next_rkey`] of the last one).
    pub fn rkey(&self) -> u32 {
        // SAFETY: `mw` is live.
        unsafe { (*self.mw).rkey }
    }
}

/// The key to bind a window with next: same index, the low 8 bits (the consumer's tag)
/// advanced, so a stale key of an earlier binding no longer matches.
pub fn next_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: `mw` and its context are live.
        let ops = unsafe { ffi::ops((*self.mw).context) };
        if let Some(dealloc) = ops.dealloc_mw {
            // SAFETY: deallocated once.
            unsafe { dealloc(self.mw) };
        }
    }
}

/// A completion queue with its own completion channel.
pub struct CompletionQueue {
    cq: *mut ibv_cq,
    channel: *mut ffi::ibv_comp_channel,
    depth: u32,
    events: AtomicU32,
}

// SAFETY: libibverbs CQs may be polled and armed from any thread.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// A CQ of at least `depth` entries on `dev` with a non-blocking completion channel.
    pub fn new(dev: Device, depth: u32) -> Result<Arc<CompletionQueue>> {
        let l = lib()?;
        let depth_c = i32::try_from(depth)
            .ok()
            .filter(|d| *d > 0)
            .ok_or_else(|| Error::invalid("ibv_create_cq", format!("depth {depth}")))?;
        // SAFETY: `dev.ctx` is live.
        let channel = unsafe { (l.ibv_create_comp_channel)(dev.ctx) };
        if channel.is_null() {
            return Err(Error::last("ibv_create_comp_channel"));
        }
        // SAFETY: `channel` is live.
        let fd = unsafe { (*channel).fd };
        if let Err(e) = set_nonblocking(fd, "ibv_create_comp_channel: O_NONBLOCK") {
            // SAFETY: unused channel.
            unsafe { (l.ibv_destroy_comp_channel)(channel) };
            return Err(e);
        }
        // SAFETY: `dev.ctx` and `channel` are live.
        let cq = unsafe { (l.ibv_create_cq)(dev.ctx, depth_c, null_mut(), channel, 0) };
        if cq.is_null() {
            let e = Error::last("ibv_create_cq");
            // SAFETY: unused channel.
            unsafe { (l.ibv_destroy_comp_channel)(channel) };
            return Err(e);
        }
        Ok(Arc::new(CompletionQueue {
            cq,
            channel,
            depth,
            events: AtomicU32::new(0),
        }))
    }

    /// The completion channel's fd (readable after an armed CQ got a completion).
    pub fn fd(&self) -> RawFd {
        // SAFETY: `channel` is live.
        unsafe { (*self.channel).fd }
    }

    /// The depth asked for.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Requests one event on the channel for the next completion.
    pub fn arm(&self) -> Result<()> {
        // SAFETY: `cq` and its context are live.
        let r = unsafe { (ffi::ops((*self.cq).context).req_notify_cq)(self.cq, 0) };
        if r != 0 {
            return Err(Error::errno("ibv_req_notify_cq", r.abs()));
        }
        Ok(())
    }

    /// Reads (and acknowledges) every pending event of the channel; returns how many there
    /// were (0: the fd woke for nothing). Never blocks.
    pub fn drain_events(&self) -> Result<u32> {
        let l = lib()?;
        let mut n = 0u32;
        // bounded: each event needs an arm, so only a few can be pending
        for _ in 0..4096 {
            let mut cq: *mut ibv_cq = null_mut();
            let mut ctx: *mut c_void = null_mut();
            // SAFETY: `channel` is live; non-blocking fd.
            if unsafe { (l.ibv_get_cq_event)(self.channel, &mut cq, &mut ctx) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    self.ack(n);
                    return Err(Error {
                        op: "ibv_get_cq_event",
                        source: e,
                    });
                }
                break;
            }
            n += 1;
        }
        self.ack(n);
        Ok(n)
    }

    fn ack(&self, n: u32) {
        if n == 0 {
            return;
        }
        if let Ok(l) = lib() {
            // SAFETY: `n` events of this CQ were read from its channel.
            unsafe { (l.ibv_ack_cq_events)(self.cq, n) };
            self.events.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Events seen so far (for statistics and tests).
    pub fn events_seen(&self) -> u32 {
        self.events.load(Ordering::Relaxed)
    }

    /// Moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let n = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: `Completion` is a transparent `ibv_wc`; `out` has room for `n`.
        let r = unsafe {
            (ffi::ops((*self.cq).context).poll_cq)(self.cq, n, out.as_mut_ptr() as *mut ffi::ibv_wc)
        };
        if r < 0 {
            return Err(Error::errno("ibv_poll_cq", libc::EIO));
        }
        Ok(r as usize)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        if let Ok(l) = lib() {
            // SAFETY: every QP using this CQ holds an Arc to it, so none is left; every event
            // read was acknowledged in drain_events.
            unsafe {
                (l.ibv_destroy_cq)(self.cq);
                (l.ibv_destroy_comp_channel)(self.channel);
            }
        }
    }
}

/// A shared receive queue: receive buffers for every QP created with it (an NVMe/RDMA target's
/// option to size receive memory per reactor instead of per queue). Its receive completions
/// arrive on each QP's receive CQ, told apart by [`Completion::qp_num`].
pub struct SharedReceiveQueue {
    srq: *mut ffi::ibv_srq,
    depth: u32,
    scratch: Mutex<WrScratch>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs SRQs may be posted to from any thread; the scratch is behind a mutex.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// One of at least `depth` receives (one SGE each) in `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, depth: u32) -> Result<Arc<SharedReceiveQueue>> {
        let l = lib()?;
        if depth == 0 {
            return Err(Error::invalid("ibv_create_srq", "depth 0".into()));
        }
        let mut attr = ffi::ibv_srq_init_attr {
            srq_context: null_mut(),
            max_wr: depth,
            max_sge: 1,
            srq_limit: 0,
        };
        // SAFETY: `pd` is live; attr is complete.
        let srq = unsafe { (l.ibv_create_srq)(pd.pd, &mut attr) };
        if srq.is_null() {
            return Err(Error::last("ibv_create_srq"));
        }
        Ok(Arc::new(SharedReceiveQueue {
            srq,
            depth: attr.max_wr,
            scratch: Mutex::new(WrScratch::default()),
            _pd: pd.clone(),
        }))
    }

    /// The depth the device granted.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Posts receive buffers as one list. Never blocks (beyond an uncontended mutex); fails if
    /// the queue is full.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        let total = wrs.len();
        if wrs.is_empty() {
            return Ok(());
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let list = scratch.build_recv(wrs);
        let mut bad: *mut ffi::ibv_recv_wr = null_mut();
        // SAFETY: the list is live for the call; `srq` and its context are live.
        let r = unsafe { (ffi::ops((*self.srq).context).post_srq_recv)(self.srq, list, &mut bad) };
        if r != 0 {
            return Err(PostError {
                posted: posted_before(list, bad),
                total,
                error: Error::errno("ibv_post_srq_recv", r.abs()),
            });
        }
        Ok(())
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        if let Ok(l) = lib() {
            // SAFETY: every QP using it holds an Arc to it, so none is left.
            unsafe { (l.ibv_destroy_srq)(self.srq) };
        }
    }
}

/// What a completion was for (`enum ibv_wc_opcode`; meaningless when the status is an error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    BindMw,
    LocalInv,
    Recv,
    RecvRdmaWithImm,
    Other(u32),
}

/// One work completion (`struct ibv_wc`), filled by [`CompletionQueue::poll`].
#[repr(transparent)]
#[derive(Clone, Copy, Default)]
pub struct Completion(ffi::ibv_wc);

impl Completion {
    /// The work request's id.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// Whether it succeeded.
    pub fn is_ok(&self) -> bool {
        self.0.status == 0
    }
    /// `enum ibv_wc_status` (0: success; 5: flushed, after disconnect or a QP error).
    pub fn status(&self) -> u32 {
        self.0.status
    }
    /// The status in words (libibverbs' text).
    pub fn status_str(&self) -> String {
        match lib() {
            Ok(l) => {
                // SAFETY: returns a static string for any value.
                let p = unsafe { (l.ibv_wc_status_str)(self.0.status) };
                if p.is_null() {
                    format!("status {}", self.0.status)
                } else {
                    // SAFETY: NUL-terminated static string.
                    unsafe { std::ffi::CStr::from_ptr(p) }
                        .to_string_lossy()
                        .into_owned()
                }
            }
            Err(_) => format!("status {}", self.0.status),
        }
    }
    /// The operation.
    pub fn opcode(&self) -> WcOpcode {
        match self.0.opcode {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            5 => WcOpcode::BindMw,
            6 => WcOpcode::LocalInv,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            n => WcOpcode::Other(n),
        }
    }
    /// Bytes received (receives) or transferred (RDMA READ).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// For a receive of a Send with Invalidate: the rkey the peer invalidated.
    ///
    /// Besides `IBV_WC_WITH_INV` this takes the bit user space calls `IBV_WC_IP_CSUM_OK` on a
    /// receive: soft-RoCE (rdma_rxe, Linux 6.1) sets the kernel's `IB_WC_WITH_INVALIDATE`
    /// there, and an IP checksum flag has no meaning on the RC QPs this crate creates.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        let recv = matches!(self.opcode(), WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        let inv = self.0.wc_flags & ffi::IBV_WC_WITH_INV != 0
            || (recv && self.0.wc_flags & ffi::IBV_WC_IP_CSUM_OK_OR_KERNEL_INV != 0);
        (recv && inv).then_some(self.0.invalidated_rkey)
    }
    /// `ibv_wc.wc_flags` as the device set them.
    pub fn wc_flags(&self) -> u32 {
        self.0.wc_flags
    }
    /// The local QP it belongs to.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// The device's own error detail.
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("invalidated_rkey", &self.invalidated_rkey())
            .field("wc_flags", &self.wc_flags())
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

/// A local scatter/gather entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// A receive work request: one buffer.
#[derive(Clone, Copy, Debug)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sge: Sge,
}

/// The operation of a [`SendWr`].
#[derive(Clone, Copy)]
pub enum SendOp<'a> {
    /// SEND of the local buffers.
    Send,
    /// SEND, and the peer's device invalidates `rkey` (its memory window / fast-registered
    /// region) before the receive completes.
    SendWithInvalidate { rkey: u32 },
    /// RDMA WRITE of the local buffers to the peer's `remote_addr` under `rkey`.
    RdmaWrite { remote_addr: u64, rkey: u32 },
    /// RDMA READ from the peer's `remote_addr` under `rkey` into the local buffers.
    RdmaRead { remote_addr: u64, rkey: u32 },
    /// Binds `mw` to `len` bytes at `addr` of `mr` with key `rkey` (see [`next_rkey`]) and
    /// `access` (remote read and/or write). No local buffers.
    BindMw {
        mw: &'a MemoryWindow,
        mr: &'a MemoryRegion,
        rkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    },
}

/// A send-queue work request.
#[derive(Clone, Copy)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp<'a>,
    /// Local buffers (gathered for SEND/WRITE, scattered into for READ).
    pub local: &'a [Sge],
    /// Whether it produces a completion (unsignaled ones complete silently, in order).
    pub signaled: bool,
    /// Copy the data into the work request at post time (SEND/WRITE up to the QP's
    /// `max_inline`; no lkey needed, the buffer is free again on return).
    pub inline: bool,
}

/// Queue pair sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    pub send_depth: u32,
    pub recv_depth: u32,
    pub send_sge: u32,
    pub recv_sge: u32,
    pub max_inline: u32,
}

/// A post that failed at `posted` (the work requests before it are on the queue).
#[derive(Debug, thiserror::Error)]
#[error("{error} ({posted} of {total} work requests posted)")]
pub struct PostError {
    pub posted: usize,
    pub total: usize,
    #[source]
    pub error: Error,
}

/// What a CmId with a QP holds: the objects the QP uses (released after it) and the space
/// work-request lists are built in.
pub(crate) struct QpResources {
    _pd: Arc<ProtectionDomain>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    srq: Option<Arc<SharedReceiveQueue>>,
    caps: QpCaps,
    scratch: WrScratch,
}

impl CmId {
    /// Creates this connection's RC queue pair (`rdma_create_qp`) in `pd` with the two CQs;
    /// returns the sizes the device granted (at least those asked for). Once per id.
    pub fn create_qp(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<QpCaps> {
        self.create_qp_with(pd, send_cq, recv_cq, None, caps)
    }

    /// As [`create_qp`](CmId::create_qp), taking receives from `srq` when given (the QP then
    /// has no receive queue of its own: `recv_depth`/`recv_sge` are ignored and
    /// [`post_recv`](CmId::post_recv) is refused).
    pub fn create_qp_with(
        &mut self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        caps: QpCaps,
    ) -> Result<QpCaps> {
        let l = lib()?;
        if self.qp.is_some() {
            return Err(Error::invalid(
                "rdma_create_qp",
                "this id has a QP already".into(),
            ));
        }
        let (recv_depth, recv_sge) = if srq.is_some() {
            (0, 0)
        } else {
            (caps.recv_depth, caps.recv_sge)
        };
        let mut attr = ffi::ibv_qp_init_attr {
            qp_context: null_mut(),
            send_cq: send_cq.cq,
            recv_cq: recv_cq.cq,
            srq: srq.map_or(null_mut(), |q| q.srq),
            cap: ffi::ibv_qp_cap {
                max_send_wr: caps.send_depth,
                max_recv_wr: recv_depth,
                max_send_sge: caps.send_sge,
                max_recv_sge: recv_sge,
                max_inline_data: caps.max_inline,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: `raw`, `pd` and the CQs are live; attr is complete.
        if unsafe { (l.rdma_create_qp)(self.raw, pd.pd, &mut attr) } != 0 {
            return Err(Error::last("rdma_create_qp"));
        }
        let got = QpCaps {
            send_depth: attr.cap.max_send_wr,
            recv_depth: attr.cap.max_recv_wr,
            send_sge: attr.cap.max_send_sge,
            recv_sge: attr.cap.max_recv_sge,
            max_inline: attr.cap.max_inline_data,
        };
        self.qp = Some(QpResources {
            _pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            srq: srq.cloned(),
            caps: got,
            scratch: WrScratch::default(),
        });
        Ok(got)
    }

    /// The QP's number (`None` before [`create_qp`](CmId::create_qp)).
    pub fn qp_num(&self) -> Option<u32> {
        // SAFETY: `raw` is live; `qp` is set by rdma_create_qp.
        let qp = unsafe { (*self.raw).qp };
        (self.qp.is_some() && !qp.is_null()).then(|| unsafe { (*qp).qp_num })
    }

    /// The granted sizes (`None` before [`create_qp`](CmId::create_qp)).
    pub fn qp_caps(&self) -> Option<QpCaps> {
        self.qp.as_ref().map(|q| q.caps)
    }

    fn qp_ptr(&self, op: &'static str) -> Result<*mut ffi::ibv_qp> {
        // SAFETY: `raw` is live.
        let qp = unsafe { (*self.raw).qp };
        if self.qp.is_none() || qp.is_null() {
            return Err(Error::invalid(op, "no queue pair on this id".into()));
        }
        Ok(qp)
    }

    /// Posts `wrs` as one list (one doorbell). Never blocks; fails if the send queue is full.
    pub fn post_send(&mut self, wrs: &[SendWr]) -> std::result::Result<(), PostError> {
        let total = wrs.len();
        let fail = |posted, error| PostError {
            posted,
            total,
            error,
        };
        let qp = self.qp_ptr("ibv_post_send").map_err(|e| fail(0, e))?;
        if wrs.is_empty() {
            return Ok(());
        }
        let res = self.qp.as_mut().expect("checked by qp_ptr");
        let caps = res.caps;
        let list = res.scratch.build_send(wrs, &caps).map_err(|e| fail(0, e))?;
        let mut bad: *mut ffi::ibv_send_wr = null_mut();
        // SAFETY: the list, its SGEs and the objects it names are live for the call; the
        // provider copies what it keeps.
        let r = unsafe { (ffi::ops((*qp).context).post_send)(qp, list, &mut bad) };
        if r != 0 {
            return Err(fail(
                posted_before(list, bad),
                Error::errno("ibv_post_send", r.abs()),
            ));
        }
        Ok(())
    }

    /// Posts receive buffers as one list. Never blocks; fails if the receive queue is full.
    pub fn post_recv(&mut self, wrs: &[RecvWr]) -> std::result::Result<(), PostError> {
        let total = wrs.len();
        let fail = |posted, error| PostError {
            posted,
            total,
            error,
        };
        let qp = self.qp_ptr("ibv_post_recv").map_err(|e| fail(0, e))?;
        if wrs.is_empty() {
            return Ok(());
        }
        let res = self.qp.as_mut().expect("checked by qp_ptr");
        if res.srq.is_some() {
            let e = "this QP takes its receives from a shared receive queue".to_string();
            return Err(fail(0, Error::invalid("ibv_post_recv", e)));
        }
        let list = res.scratch.build_recv(wrs);
        let mut bad: *mut ffi::ibv_recv_wr = null_mut();
        // SAFETY: as in post_send.
        let r = unsafe { (ffi::ops((*qp).context).post_recv)(qp, list, &mut bad) };
        if r != 0 {
            return Err(fail(
                posted_before(list, bad),
                Error::errno("ibv_post_recv", r.abs()),
            ));
        }
        Ok(())
    }
}

/// How many work requests of `list` precede `bad` (the one the device refused).
fn posted_before<T>(list: *mut T, bad: *mut T) -> usize {
    if bad.is_null() {
        0
    } else {
        // SAFETY: the provider sets `bad` to an element of `list`.
        unsafe { bad.offset_from(list).max(0) as usize }
    }
}

/// Where work-request lists are built for the C library: reused from post to post, so
/// posting allocates nothing once the vectors have grown to the largest batch.
#[derive(Default)]
pub(crate) struct WrScratch {
    send_wrs: Vec<ffi::ibv_send_wr>,
    recv_wrs: Vec<ffi::ibv_recv_wr>,
    sges: Vec<ffi::ibv_sge>,
}

impl WrScratch {
    /// The C list for `wrs` (linked through `next`), checked against the QP's `caps`.
    fn build_send(&mut self, wrs: &[SendWr], caps: &QpCaps) -> Result<*mut ffi::ibv_send_wr> {
        self.sges.clear();
        self.send_wrs.clear();
        for (i, w) in wrs.iter().enumerate() {
            if w.local.len() > caps.send_sge as usize {
                return Err(Error::invalid(
                    "ibv_post_send",
                    format!(
                        "work request {i}: {} scatter/gather entries, the QP allows {}",
                        w.local.len(),
                        caps.send_sge
                    ),
                ));
            }
            let inline_len: u64 = w.local.iter().map(|s| s.len as u64).sum();
            if w.inline && inline_len > caps.max_inline as u64 {
                return Err(Error::invalid(
                    "ibv_post_send",
                    format!(
                        "work request {i}: {inline_len} bytes inline, the QP allows {}",
                        caps.max_inline
                    ),
                ));
            }
            self.sges.extend(w.local.iter().map(|s| ffi::ibv_sge {
                addr: s.addr,
                length: s.len,
                lkey: s.lkey,
            }));
        }
        let mut at = 0usize;
        let base = self.sges.as_mut_ptr();
        for w in wrs {
            let mut raw = ffi::ibv_send_wr::default();
            raw.wr_id = w.wr_id;
            let n = w.local.len();
            if n > 0 {
                // SAFETY: `at + n <= sges.len()`; the vector does not change until posted.
                raw.sg_list = unsafe { base.add(at) };
            }
            raw.num_sge = n as i32;
            at += n;
            raw.send_flags = if w.signaled {
                ffi::IBV_SEND_SIGNALED
            } else {
                0
            };
            if w.inline {
                raw.send_flags |= ffi::IBV_SEND_INLINE;
            }
            match w.op {
                SendOp::Send => raw.opcode = ffi::IBV_WR_SEND,
                SendOp::SendWithInvalidate { rkey } => {
                    raw.opcode = ffi::IBV_WR_SEND_WITH_INV;
                    raw.invalidate_rkey = rkey;
                }
                SendOp::RdmaWrite { remote_addr, rkey } => {
                    raw.opcode = ffi::IBV_WR_RDMA_WRITE;
                    raw.remote_addr = remote_addr;
                    raw.rkey = rkey;
                }
                SendOp::RdmaRead { remote_addr, rkey } => {
                    raw.opcode = ffi::IBV_WR_RDMA_READ;
                    raw.remote_addr = remote_addr;
                    raw.rkey = rkey;
                }
                SendOp::BindMw {
                    mw,
                    mr,
                    rkey,
                    addr,
                    len,
                    access,
                } => {
                    raw.opcode = ffi::IBV_WR_BIND_MW;
                    raw.bind_mw = mw.mw;
                    raw.bind_rkey = rkey;
                    raw.bind_info = ffi::ibv_mw_bind_info {
                        mr: mr.mr,
                        addr,
                        length: len,
                        mw_access_flags: access.0,
                    };
                }
            }
            self.send_wrs.push(raw);
        }
        let list = self.send_wrs.as_mut_ptr();
        for i in 1..self.send_wrs.len() {
            // SAFETY: both indexes are in bounds; the vector no longer grows.
            unsafe { (*list.add(i - 1)).next = list.add(i) };
        }
        Ok(list)
    }

    /// The C list for `wrs` (one SGE each, linked through `next`).
    fn build_recv(&mut self, wrs: &[RecvWr]) -> *mut ffi::ibv_recv_wr {
        self.sges.clear();
        self.recv_wrs.clear();
        self.sges.extend(wrs.iter().map(|w| ffi::ibv_sge {
            addr: w.sge.addr,
            length: w.sge.len,
            lkey: w.sge.lkey,
        }));
        let base = self.sges.as_mut_ptr();
        for (i, w) in wrs.iter().enumerate() {
            self.recv_wrs.push(ffi::ibv_recv_wr {
                wr_id: w.wr_id,
                next: null_mut(),
                // SAFETY: `i < sges.len()`.
                sg_list: unsafe { base.add(i) },
                num_sge: 1,
            });
        }
        let list = self.recv_wrs.as_mut_ptr();
        for i in 1..self.recv_wrs.len() {
            // SAFETY: in bounds; the vector no longer grows.
            unsafe { (*list.add(i - 1)).next = list.add(i) };
        }
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn async_event_kinds_follow_the_c_enum() {
        assert_eq!(AsyncEventKind::from_raw(1), AsyncEventKind::QpFatal);
        assert_eq!(AsyncEventKind::from_raw(8), AsyncEventKind::DeviceFatal);
        assert_eq!(
            AsyncEventKind::from_raw(16),
            AsyncEventKind::QpLastWqeReached
        );
        assert_eq!(AsyncEventKind::from_raw(19), AsyncEventKind::Other(19));
    }

    #[test]
    fn next_rkey_advances_only_the_tag() {
        assert_eq!(next_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(next_rkey(0x1234_56ff), 0x1234_5600);
    }

    #[test]
    fn access_bits_are_the_c_values() {
        assert_eq!(
            (Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE).bits(),
            0b111
        );
        assert_eq!(Access::MW_BIND.bits(), 16);
    }

    fn caps() -> QpCaps {
        QpCaps {
            send_depth: 16,
            recv_depth: 16,
            send_sge: 2,
            recv_sge: 1,
            max_inline: 64,
        }
    }

    #[test]
    fn send_list_is_one_chain_with_the_c_fields() {
        let mut s = WrScratch::default();
        let a = [Sge {
            addr: 0x1000,
            len: 4096,
            lkey: 7,
        }];
        let b = [
            Sge {
                addr: 0x2000,
                len: 16,
                lkey: 8,
            },
            Sge {
                addr: 0x3000,
                len: 48,
                lkey: 8,
            },
        ];
        let wrs = [
            SendWr {
                wr_id: 1,
                op: SendOp::RdmaRead {
                    remote_addr: 0xdead_0000,
                    rkey: 0x42,
                },
                local: &a,
                signaled: true,
                inline: false,
            },
            SendWr {
                wr_id: 2,
                op: SendOp::RdmaWrite {
                    remote_addr: 0xbeef_0000,
                    rkey: 0x43,
                },
                local: &a,
                signaled: false,
                inline: false,
            },
            SendWr {
                wr_id: 3,
                op: SendOp::SendWithInvalidate { rkey: 0x44 },
                local: &b,
                signaled: true,
                inline: true,
            },
        ];
        let list = s.build_send(&wrs, &caps()).unwrap();
        // SAFETY: walks the list just built; it lives in `s`.
        let got: Vec<ffi::ibv_send_wr> = unsafe {
            let mut v = Vec::new();
            let mut p = list;
            while !p.is_null() && v.len() < 10 {
                v.push(*p);
                p = (*p).next;
            }
            v
        };
        assert_eq!(got.len(), 3, "one chain of all three");
        assert_eq!(got.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(
            got.iter().map(|w| w.opcode).collect::<Vec<_>>(),
            [
                ffi::IBV_WR_RDMA_READ,
                ffi::IBV_WR_RDMA_WRITE,
                ffi::IBV_WR_SEND_WITH_INV
            ]
        );
        assert_eq!(
            got.iter().map(|w| w.send_flags).collect::<Vec<_>>(),
            [
                ffi::IBV_SEND_SIGNALED,
                0,
                ffi::IBV_SEND_SIGNALED | ffi::IBV_SEND_INLINE
            ]
        );
        assert_eq!((got[0].remote_addr, got[0].rkey), (0xdead_0000, 0x42));
        assert_eq!((got[1].remote_addr, got[1].rkey), (0xbeef_0000, 0x43));
        assert_eq!(got[2].invalidate_rkey, 0x44);
        assert_eq!(got[2].num_sge, 2);
        // SAFETY: sg_list points at the scratch SGEs.
        let sg2 = unsafe { std::slice::from_raw_parts(got[2].sg_list, 2) };
        assert_eq!((sg2[0].addr, sg2[0].length, sg2[0].lkey), (0x2000, 16, 8));
        assert_eq!((sg2[1].addr, sg2[1].length, sg2[1].lkey), (0x3000, 48, 8));
        // SAFETY: as above.
        let sg0 = unsafe { &*got[0].sg_list };
        assert_eq!((sg0.addr, sg0.length, sg0.lkey), (0x1000, 4096, 7));
    }

    #[test]
    fn send_list_limits_are_checked() {
        let mut s = WrScratch::default();
        let three = [Sge::default(); 3];
        let big = [Sge {
            addr: 1,
            len: 65,
            lkey: 1,
        }];
        let wr = |local| SendWr {
            wr_id: 9,
            op: SendOp::Send,
            local,
            signaled: true,
            inline: true,
        };
        let e = s.build_send(&[wr(&three)], &caps()).err().unwrap();
        assert!(e.to_string().contains("3 scatter/gather entries"), "{e}");
        let e = s.build_send(&[wr(&big)], &caps()).err().unwrap();
        assert!(e.to_string().contains("65 bytes inline"), "{e}");
    }

    #[test]
    fn recv_list_is_one_chain() {
        let mut s = WrScratch::default();
        let wrs: Vec<RecvWr> = (0..4)
            .map(|i| RecvWr {
                wr_id: 100 + i,
                sge: Sge {
                    addr: 0x1000 * (i + 1),
                    len: 4160,
                    lkey: 5,
                },
            })
            .collect();
        let mut p = s.build_recv(&wrs);
        let mut n = 0;
        while !p.is_null() && n < 10 {
            // SAFETY: walks the list just built.
            let w = unsafe { &*p };
            // SAFETY: one SGE each.
            let sge = unsafe { &*w.sg_list };
            assert_eq!(w.wr_id, 100 + n);
            assert_eq!(
                (sge.addr, sge.length, sge.lkey),
                (0x1000 * (n + 1), 4160, 5)
            );
            n += 1;
            p = w.next;
        }
        assert_eq!(n, 4);
    }

    #[test]
    fn completion_fields() {
        let mut wc = ffi::ibv_wc {
            wr_id: 42,
            opcode: 128,
            byte_len: 64,
            invalidated_rkey: 0x77,
            ..Default::default()
        };
        let c = Completion(wc);
        assert!(c.is_ok());
        assert_eq!(c.opcode(), WcOpcode::Recv);
        assert_eq!(c.invalidated_rkey(), None, "no IBV_WC_WITH_INV flag");
        wc.wc_flags = ffi::IBV_WC_WITH_INV;
        wc.status = 5;
        let c = Completion(wc);
        assert_eq!(c.invalidated_rkey(), Some(0x77));
        assert!(!c.is_ok());
        assert_eq!(c.wr_id(), 42);
        // soft-RoCE's flag (the kernel's IB_WC_WITH_INVALIDATE, GRH set too)
        wc.wc_flags = 0b101;
        assert_eq!(Completion(wc).invalidated_rkey(), Some(0x77));
        // on a send completion neither bit means an invalidation
        wc.opcode = 0;
        assert_eq!(Completion(wc).invalidated_rkey(), None);
    }
}
