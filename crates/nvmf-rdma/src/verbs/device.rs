//! The device a connection runs on (as librdmacm opened it): its limits, its asynchronous
//! events (QP and CQ errors, port changes, device fatal) and the protection domain every
//! connection on it shares.

use std::os::fd::RawFd;
use std::ptr::null_mut;
use std::sync::Arc;

use crate::cm::{set_nonblocking, CmId};
use crate::ffi::{self, ibv_context};
use crate::{lib, Error, Result};

/// An RDMA device, as librdmacm opened it for a [`CmId`] ([`CmId::device`]). Valid while the
/// device exists: after a `DeviceRemoval` event drop every object made from it. Two ids on
/// the same device give equal values (a key for sharing one [`ProtectionDomain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    pub(crate) ctx: *mut ibv_context,
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
    pub(crate) pd: *mut ffi::ibv_pd,
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
}
