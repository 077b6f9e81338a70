//! The 16-byte NVMe completion queue entry (`Completion`).

use crate::status::Status;
use core::mem::size_of;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// A completion queue entry.
///
/// Dword 0 (and for 64-bit results, dword 1) carries the command's result;
/// then the SQ head pointer, the SQ id, the command id, and the status field
/// (bit 0 phase tag, bits 15:1 the `Status`). NVMe-oF has no phase tag in
/// practice; it is left 0.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct Completion {
    pub dw0: U32,
    pub dw1: U32,
    pub sqhd: U16,
    pub sqid: U16,
    pub cid: U16,
    pub status: U16,
}
const _: () = assert!(size_of::<Completion>() == 16);

impl Default for Completion {
    fn default() -> Self {
        Completion::new_zeroed()
    }
}

impl Completion {
    /// A completion for command `cid` on queue `sqid`.
    pub fn new(cid: u16, sqid: u16, sqhd: u16, status: Status, dw0: u32) -> Self {
        Completion {
            dw0: U32::new(dw0),
            dw1: U32::new(0),
            sqhd: U16::new(sqhd),
            sqid: U16::new(sqid),
            cid: U16::new(cid),
            status: U16::new(status.to_field()),
        }
    }

    /// Command specific result (dword 0).
    pub fn result(&self) -> u32 {
        self.dw0.get()
    }
    pub fn dw0(&self) -> u32 {
        self.dw0.get()
    }
    pub fn dw1(&self) -> u32 {
        self.dw1.get()
    }
    /// Dwords 0 and 1 as one 64-bit value (Property Get of an 8-byte register).
    pub fn result64(&self) -> u64 {
        self.dw0() as u64 | ((self.dw1() as u64) << 32)
    }
    pub fn sqhd(&self) -> u16 {
        self.sqhd.get()
    }
    pub fn sqid(&self) -> u16 {
        self.sqid.get()
    }
    pub fn cid(&self) -> u16 {
        self.cid.get()
    }
    /// The decoded status (phase bit dropped).
    pub fn status(&self) -> Status {
        Status::from_field(self.status.get())
    }
    /// The raw 16-bit status field including the phase bit.
    pub fn status_field(&self) -> u16 {
        self.status.get()
    }
    /// Phase tag (bit 0 of the status field).
    pub fn phase(&self) -> bool {
        self.status.get() & 1 != 0
    }

    pub fn set_dw0(&mut self, v: u32) -> &mut Self {
        self.dw0.set(v);
        self
    }
    pub fn set_dw1(&mut self, v: u32) -> &mut Self {
        self.dw1.set(v);
        self
    }
    /// Set dword 0 and 1 from a 64-bit value.
    pub fn set_result64(&mut self, v: u64) -> &mut Self {
        self.dw0.set(v as u32);
        self.dw1.set((v >> 32) as u32);
        self
    }
    pub fn set_sqhd(&mut self, v: u16) -> &mut Self {
        self.sqhd.set(v);
        self
    }
    pub fn set_sqid(&mut self, v: u16) -> &mut Self {
        self.sqid.set(v);
        self
    }
    pub fn set_cid(&mut self, v: u16) -> &mut Self {
        self.cid.set(v);
        self
    }
    /// Set the status, keeping the current phase bit.
    pub fn set_status(&mut self, s: Status) -> &mut Self {
        let phase = self.status.get() & 1;
        self.status.set(s.to_field() | phase);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn layout() {
        assert_eq!(offset_of!(Completion, dw0), 0);
        assert_eq!(offset_of!(Completion, dw1), 4);
        assert_eq!(offset_of!(Completion, sqhd), 8);
        assert_eq!(offset_of!(Completion, sqid), 10);
        assert_eq!(offset_of!(Completion, cid), 12);
        assert_eq!(offset_of!(Completion, status), 14);
    }

    #[test]
    fn new_and_bytes() {
        let c = Completion::new(0xabcd, 1, 5, Status::INVALID_FIELD.with_dnr(), 0x11223344);
        let b = c.as_bytes();
        assert_eq!(&b[0..4], &[0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&b[8..10], &[5, 0]);
        assert_eq!(&b[10..12], &[1, 0]);
        assert_eq!(&b[12..14], &[0xcd, 0xab]);
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), 0x8004);
        assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr());
        assert!(!c.phase());
        let mut c = c;
        c.set_result64(0x1_0000_0002);
        assert_eq!(c.result64(), 0x1_0000_0002);
    }
}
