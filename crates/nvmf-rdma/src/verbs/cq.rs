//! Completion queues with their own completion channel (an fd for epoll: arm, drain the
//! events, poll), and the work completions polled into a caller's array.

use std::os::fd::RawFd;
use std::os::raw::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::Device;
use crate::cm::set_nonblocking;
use crate::ffi::{self, ibv_cq};
use crate::{lib, Error, Result};

/// A completion queue with its own completion channel.
pub struct CompletionQueue {
    pub(crate) cq: *mut ibv_cq,
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

#[cfg(test)]
mod tests {
    use super::*;

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
