//! Memory the device may touch: registrations of caller-owned buffers (lkey for local
//! scatter/gather entries, rkey for the peer) and type 2 memory windows (bound by a work
//! request; what an initiator hands a target per I/O, invalidated by Send with Invalidate).

use std::os::raw::c_void;
use std::sync::Arc;

use super::{ProtectionDomain, Sge};
use crate::ffi;
use crate::{lib, Error, Result};

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
    pub(crate) mr: *mut ffi::ibv_mr,
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
/// [`Access::MW_BIND`]) bound by a [`SendOp::BindMw`](super::SendOp::BindMw) work request, invalidated by the peer's
/// Send with Invalidate (or a new bind). What an NVMe/RDMA initiator hands out per I/O.
pub struct MemoryWindow {
    pub(crate) mw: *mut ffi::ibv_mw,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
