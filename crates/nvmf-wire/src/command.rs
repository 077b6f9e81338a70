//! The 64-byte NVMe submission queue entry (`Command`) and the SGL descriptor
//! that NVMe-oF uses for its data pointer. Fabrics-specific views of the same
//! 64 bytes (Connect, Property Get/Set) live in `fabrics`.

use core::mem::size_of;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// SGL descriptor type: a single data block.
pub const SGL_TYPE_DATA_BLOCK: u8 = 0x0;
/// SGL descriptor type: bit bucket (data to be discarded).
pub const SGL_TYPE_BIT_BUCKET: u8 = 0x1;
/// SGL descriptor type: segment (points to more descriptors).
pub const SGL_TYPE_SEGMENT: u8 = 0x2;
/// SGL descriptor type: last segment.
pub const SGL_TYPE_LAST_SEGMENT: u8 = 0x3;
/// SGL descriptor type: keyed data block (RDMA).
pub const SGL_TYPE_KEYED_DATA_BLOCK: u8 = 0x4;
/// SGL descriptor type: transport data block (data moved by the transport,
/// e.g. NVMe/TCP R2T/H2CData or C2HData).
pub const SGL_TYPE_TRANSPORT_DATA_BLOCK: u8 = 0x5;

/// SGL subtype: the address field is a memory address.
pub const SGL_SUBTYPE_ADDRESS: u8 = 0x0;
/// SGL subtype: the address field is an offset into the in-capsule data.
pub const SGL_SUBTYPE_OFFSET: u8 = 0x1;
/// SGL subtype: transport specific (NVMe/TCP uses 0xA).
pub const SGL_SUBTYPE_TRANSPORT: u8 = 0xa;
/// SGL subtype of a keyed data block: address, and the host asks the target
/// to invalidate the key remotely (NVMe/RDMA Send with Invalidate).
pub const SGL_SUBTYPE_INVALIDATE_KEY: u8 = 0xf;

/// Descriptor id used by NVMe/TCP for in-capsule data (data block, offset).
pub const SGL_ID_IN_CAPSULE: u8 = (SGL_TYPE_DATA_BLOCK << 4) | SGL_SUBTYPE_OFFSET;
/// Descriptor id used by NVMe/TCP for data moved by R2T/H2CData or C2HData.
pub const SGL_ID_TRANSPORT: u8 = (SGL_TYPE_TRANSPORT_DATA_BLOCK << 4) | SGL_SUBTYPE_TRANSPORT;

/// SQE flags byte: fused operation bits 1:0.
pub const FLAGS_FUSE_MASK: u8 = 0x03;
/// SQE flags byte: PSDT bits 7:6.
pub const FLAGS_PSDT_MASK: u8 = 0xc0;
/// PSDT value "SGL, metadata pointer is a single buffer" (what NVMe-oF hosts send).
pub const FLAGS_PSDT_SGL_MPTR_CONTIG: u8 = 0x40;
/// PSDT value "SGL, metadata pointer is an SGL segment".
pub const FLAGS_PSDT_SGL_MPTR_SGL: u8 = 0x80;

/// Direction of a command's data transfer, from the low two bits of the
/// opcode (or of FCTYPE for Fabrics commands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataDirection {
    /// No data.
    None,
    /// Host to controller (writes, Connect, Set Features with data).
    HostToController,
    /// Controller to host (reads, Identify, Get Log Page).
    ControllerToHost,
    /// Both directions (bits 11b; not used by this target).
    Bidirectional,
}

impl DataDirection {
    /// Decode the two transfer bits.
    pub const fn from_bits(bits: u8) -> DataDirection {
        match bits & 0x3 {
            0 => DataDirection::None,
            1 => DataDirection::HostToController,
            2 => DataDirection::ControllerToHost,
            _ => DataDirection::Bidirectional,
        }
    }
}

/// A 16-byte SGL descriptor (the DPTR field of an NVMe-oF command).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct SglDescriptor {
    /// Address or offset, meaning depends on the subtype.
    pub address: U64,
    /// Length of the data in bytes.
    pub length: U32,
    /// Reserved for TCP. A keyed descriptor (RDMA) has a 24-bit length and
    /// a 32-bit key in bytes 8..15: see [`SglDescriptor::keyed`].
    pub rsvd: [u8; 3],
    /// `type << 4 | subtype`.
    pub id: u8,
}
const _: () = assert!(size_of::<SglDescriptor>() == 16);

impl SglDescriptor {
    /// A descriptor with the given fields.
    pub fn new(id: u8, address: u64, length: u32) -> Self {
        SglDescriptor {
            address: U64::new(address),
            length: U32::new(length),
            rsvd: [0; 3],
            id,
        }
    }
    /// In-capsule data at `offset` from the start of the capsule data.
    pub fn in_capsule(offset: u64, length: u32) -> Self {
        Self::new(SGL_ID_IN_CAPSULE, offset, length)
    }
    /// Data transferred by the transport (R2T/H2CData or C2HData).
    pub fn transport(length: u32) -> Self {
        Self::new(SGL_ID_TRANSPORT, 0, length)
    }
    /// A keyed data block (NVMe/RDMA): `length` (24 bits, higher bits are
    /// dropped) of host memory at `address` under remote key `key`; subtype
    /// invalidate-key when `invalidate`. `rdma::KeyedSgl` checks and reads it.
    pub fn keyed(address: u64, length: u32, key: u32, invalidate: bool) -> Self {
        let subtype = if invalidate {
            SGL_SUBTYPE_INVALIDATE_KEY
        } else {
            SGL_SUBTYPE_ADDRESS
        };
        let k = key.to_le_bytes();
        SglDescriptor {
            address: U64::new(address),
            length: U32::new((length & 0x00ff_ffff) | (u32::from(k[0]) << 24)),
            rsvd: [k[1], k[2], k[3]],
            id: (SGL_TYPE_KEYED_DATA_BLOCK << 4) | subtype,
        }
    }
    /// Keyed data block: the 24-bit length (bytes 8..11).
    pub fn keyed_length(&self) -> u32 {
        self.length.get() & 0x00ff_ffff
    }
    /// Keyed data block: the 32-bit key (bytes 11..15).
    pub fn keyed_key(&self) -> u32 {
        let l = self.length.get().to_le_bytes();
        u32::from_le_bytes([l[3], self.rsvd[0], self.rsvd[1], self.rsvd[2]])
    }
    /// Descriptor type (upper nibble of `id`).
    pub fn sgl_type(&self) -> u8 {
        self.id >> 4
    }
    /// Descriptor subtype (lower nibble of `id`).
    pub fn subtype(&self) -> u8 {
        self.id & 0xf
    }
    /// Address/offset field.
    pub fn address(&self) -> u64 {
        self.address.get()
    }
    /// Length field.
    pub fn length(&self) -> u32 {
        self.length.get()
    }
}

/// A 64-byte NVMe submission queue entry.
///
/// Common layout: CDW0 = opcode, flags, command id; NSID; CDW2-3; metadata
/// pointer; data pointer (for NVMe-oF always an SGL descriptor); CDW10-15.
/// Fabrics commands reuse bytes 4.. differently (`fctype()` is byte 4); see
/// the accessors in `fabrics`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct Command {
    pub opcode: u8,
    pub flags: u8,
    pub cid: U16,
    pub nsid: U32,
    pub cdw2: U32,
    pub cdw3: U32,
    pub mptr: U64,
    pub dptr: SglDescriptor,
    pub cdw10: U32,
    pub cdw11: U32,
    pub cdw12: U32,
    pub cdw13: U32,
    pub cdw14: U32,
    pub cdw15: U32,
}
const _: () = assert!(size_of::<Command>() == 64);

impl Default for Command {
    fn default() -> Self {
        Command::new_zeroed()
    }
}

impl Command {
    /// An all-zero command with the given opcode and command id.
    pub fn new(opcode: u8, cid: u16) -> Self {
        let mut c = Command::new_zeroed();
        c.opcode = opcode;
        c.cid.set(cid);
        c
    }

    pub fn opcode(&self) -> u8 {
        self.opcode
    }
    pub fn flags(&self) -> u8 {
        self.flags
    }
    pub fn cid(&self) -> u16 {
        self.cid.get()
    }
    pub fn nsid(&self) -> u32 {
        self.nsid.get()
    }
    pub fn cdw10(&self) -> u32 {
        self.cdw10.get()
    }
    pub fn cdw11(&self) -> u32 {
        self.cdw11.get()
    }
    pub fn cdw12(&self) -> u32 {
        self.cdw12.get()
    }
    pub fn cdw13(&self) -> u32 {
        self.cdw13.get()
    }
    pub fn cdw14(&self) -> u32 {
        self.cdw14.get()
    }
    pub fn cdw15(&self) -> u32 {
        self.cdw15.get()
    }
    /// The data pointer read as an SGL descriptor.
    pub fn sgl(&self) -> &SglDescriptor {
        &self.dptr
    }
    /// Mutable access to the SGL descriptor.
    pub fn sgl_mut(&mut self) -> &mut SglDescriptor {
        &mut self.dptr
    }
    /// Fused operation bits (0 = normal command).
    pub fn fuse(&self) -> u8 {
        self.flags & FLAGS_FUSE_MASK
    }
    /// Fabrics command type: byte 4 of the SQE (only meaningful when the
    /// opcode is 0x7f).
    pub fn fctype(&self) -> u8 {
        self.as_bytes()[4]
    }

    pub fn set_opcode(&mut self, v: u8) -> &mut Self {
        self.opcode = v;
        self
    }
    pub fn set_flags(&mut self, v: u8) -> &mut Self {
        self.flags = v;
        self
    }
    pub fn set_cid(&mut self, v: u16) -> &mut Self {
        self.cid.set(v);
        self
    }
    pub fn set_nsid(&mut self, v: u32) -> &mut Self {
        self.nsid.set(v);
        self
    }
    pub fn set_cdw10(&mut self, v: u32) -> &mut Self {
        self.cdw10.set(v);
        self
    }
    pub fn set_cdw11(&mut self, v: u32) -> &mut Self {
        self.cdw11.set(v);
        self
    }
    pub fn set_cdw12(&mut self, v: u32) -> &mut Self {
        self.cdw12.set(v);
        self
    }
    pub fn set_cdw13(&mut self, v: u32) -> &mut Self {
        self.cdw13.set(v);
        self
    }
    pub fn set_cdw14(&mut self, v: u32) -> &mut Self {
        self.cdw14.set(v);
        self
    }
    pub fn set_cdw15(&mut self, v: u32) -> &mut Self {
        self.cdw15.set(v);
        self
    }
    pub fn set_sgl(&mut self, sgl: SglDescriptor) -> &mut Self {
        self.dptr = sgl;
        self
    }
    /// Set the Fabrics command type (byte 4). Also sets opcode 0x7f.
    pub fn set_fctype(&mut self, fctype: u8) -> &mut Self {
        self.opcode = crate::opcode::AdminOpcode::FabricsCommand as u8;
        let mut nsid = self.nsid.get().to_le_bytes();
        nsid[0] = fctype;
        self.nsid = U32::new(u32::from_le_bytes(nsid));
        self
    }

    /// Data transfer direction: the opcode's low two bits, or for Fabrics
    /// commands (opcode 0x7f) the FCTYPE's low two bits.
    pub fn data_direction(&self) -> DataDirection {
        if self.opcode == crate::opcode::AdminOpcode::FabricsCommand as u8 {
            DataDirection::from_bits(self.fctype())
        } else {
            DataDirection::from_bits(self.opcode)
        }
    }

    // ---- NVM I/O command fields (Read, Write, Write Zeroes, Compare) ----

    /// Starting LBA (CDW10 | CDW11 << 32).
    pub fn slba(&self) -> u64 {
        self.cdw10() as u64 | ((self.cdw11() as u64) << 32)
    }
    /// Number of logical blocks, converted from the 0-based field (CDW12 15:0).
    pub fn nlb(&self) -> u32 {
        (self.cdw12() & 0xffff) + 1
    }
    /// Set SLBA and the block count (`nlb` is 1-based here; stored 0-based).
    pub fn set_lba_range(&mut self, slba: u64, nlb: u32) -> &mut Self {
        self.cdw10.set(slba as u32);
        self.cdw11.set((slba >> 32) as u32);
        let high = self.cdw12() & 0xffff_0000;
        self.cdw12.set(high | (nlb.saturating_sub(1) & 0xffff));
        self
    }
    /// Force Unit Access bit (CDW12 bit 30).
    pub fn fua(&self) -> bool {
        self.cdw12() & (1 << 30) != 0
    }

    // ---- Admin command fields ----

    /// Identify: Controller or Namespace Structure (CDW10 7:0).
    pub fn cns(&self) -> u8 {
        self.cdw10() as u8
    }
    /// Identify: controller identifier (CDW10 31:16).
    pub fn cntid(&self) -> u16 {
        (self.cdw10() >> 16) as u16
    }
    /// Get/Set Features: feature identifier (CDW10 7:0).
    pub fn fid(&self) -> u8 {
        self.cdw10() as u8
    }
    /// Set Features: save bit (CDW10 bit 31).
    pub fn save(&self) -> bool {
        self.cdw10() & (1 << 31) != 0
    }
    /// Get Features: select field (CDW10 10:8).
    pub fn sel(&self) -> u8 {
        ((self.cdw10() >> 8) & 0x7) as u8
    }
    /// Get Log Page: log page identifier (CDW10 7:0).
    pub fn lid(&self) -> u8 {
        self.cdw10() as u8
    }
    /// Get Log Page: log specific field (CDW10 14:8).
    pub fn lsp(&self) -> u8 {
        ((self.cdw10() >> 8) & 0x7f) as u8
    }
    /// Get Log Page: retain asynchronous event (CDW10 bit 15).
    pub fn rae(&self) -> bool {
        self.cdw10() & (1 << 15) != 0
    }
    /// Get Log Page: number of bytes requested (NUMDU:NUMDL + 1 dwords, × 4).
    pub fn log_len_bytes(&self) -> u64 {
        let numdl = (self.cdw10() >> 16) as u64;
        let numdu = (self.cdw11() & 0xffff) as u64;
        (((numdu << 16) | numdl) + 1) * 4
    }
    /// Get Log Page: byte offset into the log (CDW12 | CDW13 << 32).
    pub fn log_offset(&self) -> u64 {
        self.cdw12() as u64 | ((self.cdw13() as u64) << 32)
    }
    /// Set the Get Log Page fields: id, length in bytes (multiple of 4, ≥ 4), offset.
    pub fn set_get_log_page(&mut self, lid: u8, len_bytes: u32, offset: u64) -> &mut Self {
        let numd = (len_bytes / 4).saturating_sub(1);
        self.cdw10.set(lid as u32 | ((numd & 0xffff) << 16));
        self.cdw11.set(numd >> 16);
        self.cdw12.set(offset as u32);
        self.cdw13.set((offset >> 32) as u32);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn layout() {
        assert_eq!(offset_of!(Command, opcode), 0);
        assert_eq!(offset_of!(Command, flags), 1);
        assert_eq!(offset_of!(Command, cid), 2);
        assert_eq!(offset_of!(Command, nsid), 4);
        assert_eq!(offset_of!(Command, cdw2), 8);
        assert_eq!(offset_of!(Command, cdw3), 12);
        assert_eq!(offset_of!(Command, mptr), 16);
        assert_eq!(offset_of!(Command, dptr), 24);
        assert_eq!(offset_of!(Command, cdw10), 40);
        assert_eq!(offset_of!(Command, cdw11), 44);
        assert_eq!(offset_of!(Command, cdw12), 48);
        assert_eq!(offset_of!(Command, cdw13), 52);
        assert_eq!(offset_of!(Command, cdw14), 56);
        assert_eq!(offset_of!(Command, cdw15), 60);
        assert_eq!(offset_of!(SglDescriptor, address), 0);
        assert_eq!(offset_of!(SglDescriptor, length), 8);
        assert_eq!(offset_of!(SglDescriptor, id), 15);
    }

    #[test]
    fn accessors_are_little_endian() {
        let mut c = Command::new(0x02, 0x1234);
        c.set_nsid(1).set_lba_range(0x1_0000_0002, 8);
        c.set_sgl(SglDescriptor::transport(4096));
        let b = c.as_bytes();
        assert_eq!(b[0], 0x02);
        assert_eq!(&b[2..4], &[0x34, 0x12]);
        assert_eq!(&b[4..8], &[1, 0, 0, 0]);
        assert_eq!(&b[40..44], &[2, 0, 0, 0]);
        assert_eq!(&b[44..48], &[1, 0, 0, 0]);
        assert_eq!(&b[48..50], &[7, 0]);
        assert_eq!(&b[32..36], &4096u32.to_le_bytes());
        assert_eq!(b[39], 0x5a);
        let c2 = Command::read_from_bytes(b).unwrap();
        assert_eq!(c2.slba(), 0x1_0000_0002);
        assert_eq!(c2.nlb(), 8);
        assert_eq!(c2.sgl().sgl_type(), SGL_TYPE_TRANSPORT_DATA_BLOCK);
        assert_eq!(c2.sgl().subtype(), SGL_SUBTYPE_TRANSPORT);
        assert_eq!(SglDescriptor::in_capsule(0, 512).id, 0x01);
    }

    #[test]
    fn fabrics_fctype_and_log_page() {
        let mut c = Command::new(0, 7);
        c.set_fctype(0x04);
        assert_eq!(c.opcode(), 0x7f);
        assert_eq!(c.fctype(), 0x04);
        assert_eq!(c.as_bytes()[4], 0x04);
        assert_eq!(c.data_direction(), DataDirection::None);
        c.set_fctype(0x01); // Connect
        assert_eq!(c.data_direction(), DataDirection::HostToController);
        assert_eq!(
            Command::new(0x02, 0).data_direction(),
            DataDirection::ControllerToHost
        );
        assert_eq!(
            Command::new(0x06, 0).data_direction(),
            DataDirection::ControllerToHost
        );
        assert_eq!(
            Command::new(0x01, 0).data_direction(),
            DataDirection::HostToController
        );
        assert_eq!(Command::new(0x18, 0).data_direction(), DataDirection::None);

        let mut c = Command::new(0x02, 1);
        c.set_get_log_page(0x70, 4096, 1024);
        assert_eq!(c.lid(), 0x70);
        assert_eq!(c.log_len_bytes(), 4096);
        assert_eq!(c.log_offset(), 1024);
        c.set_get_log_page(0x02, 4 << 20, 0);
        assert_eq!(c.log_len_bytes(), 4 << 20);
    }
}
