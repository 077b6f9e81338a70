//! NVMe over Fabrics command layouts: the Connect command's data block
//! (`ConnectData`), accessors on `Command` for Connect / Property Get / Property
//! Set / Disconnect, controller property (register) offsets and bits, and
//! NQN string helpers.

use crate::command::{Command, SglDescriptor};
use crate::completion::Completion;
use crate::opcode::FabricsType;
use crate::status::Status;
use core::mem::size_of;
use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Property offset: Controller Capabilities (8 bytes).
pub const CAP: u32 = 0x00;
/// Property offset: Version (4 bytes).
pub const VS: u32 = 0x08;
/// Property offset: Controller Configuration (4 bytes).
pub const CC: u32 = 0x14;
/// Property offset: Controller Status (4 bytes).
pub const CSTS: u32 = 0x1c;
/// Property offset: NVM Subsystem Reset (4 bytes).
pub const NSSR: u32 = 0x20;

/// CC.EN: enable the controller.
pub const CC_EN: u32 = 1 << 0;
/// CC.SHN shift (bits 15:14): 1 = normal shutdown, 2 = abrupt shutdown.
pub const CC_SHN_SHIFT: u32 = 14;
/// CC.SHN mask.
pub const CC_SHN_MASK: u32 = 0x3 << CC_SHN_SHIFT;
/// CC.IOSQES shift (bits 19:16), log2 of SQE size.
pub const CC_IOSQES_SHIFT: u32 = 16;
/// CC.IOCQES shift (bits 23:20), log2 of CQE size.
pub const CC_IOCQES_SHIFT: u32 = 20;
/// CSTS.RDY: controller ready.
pub const CSTS_RDY: u32 = 1 << 0;
/// CSTS.CFS: controller fatal status.
pub const CSTS_CFS: u32 = 1 << 1;
/// CSTS.SHST shift (bits 3:2): 0 normal, 1 shutdown in progress, 2 complete.
pub const CSTS_SHST_SHIFT: u32 = 2;
/// CSTS.SHST value: shutdown processing complete.
pub const CSTS_SHST_COMPLETE: u32 = 2 << CSTS_SHST_SHIFT;

/// Build a CAP register value.
/// `mqes` is the 0-based maximum queue size, `to_500ms` the ready timeout in
/// 500 ms units. The NVM command set bit is set; doorbell stride 0;
/// contiguous queues required; page size min = max = 4 KiB.
pub const fn cap_value(mqes: u16, to_500ms: u8) -> u64 {
    (mqes as u64) | (1 << 16) | ((to_500ms as u64) << 24) | (1u64 << 37)
}

/// Version register value for NVMe 1.3.
pub const VS_1_3: u32 = 0x0001_0300;
/// Version register value for NVMe 2.0.
pub const VS_2_0: u32 = 0x0002_0000;

/// Connect record format 0, the only one defined.
pub const CONNECT_RECFMT_0: u16 = 0;
/// Connect cattr bit: the host wants SQ flow control disabled.
pub const CATTR_DISABLE_SQ_FLOW_CONTROL: u8 = 1 << 2;
/// Controller id in `ConnectData.cntlid` asking for a dynamic controller.
pub const CNTLID_DYNAMIC: u16 = 0xffff;

/// Property Get/Set attribute size values (bits 2:0 of `attrib`).
pub const PROP_SIZE_4: u8 = 0;
pub const PROP_SIZE_8: u8 = 1;

/// The 1024-byte data block sent with a Connect command.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct ConnectData {
    /// Host identifier (a UUID).
    pub hostid: [u8; 16],
    /// Requested controller id: 0xffff for dynamic on the admin queue; the
    /// controller id returned by the admin Connect for I/O queues.
    pub cntlid: U16,
    pub rsvd18: [u8; 238],
    /// NUL-terminated subsystem NQN.
    pub subnqn: [u8; 256],
    /// NUL-terminated host NQN.
    pub hostnqn: [u8; 256],
    pub rsvd768: [u8; 256],
}
const _: () = assert!(size_of::<ConnectData>() == 1024);

impl ConnectData {
    pub fn cntlid(&self) -> u16 {
        self.cntlid.get()
    }
    /// Subsystem NQN as text (up to the first NUL).
    pub fn subnqn(&self) -> &str {
        nqn_from_bytes(&self.subnqn)
    }
    /// Host NQN as text (up to the first NUL).
    pub fn hostnqn(&self) -> &str {
        nqn_from_bytes(&self.hostnqn)
    }
    /// Build a Connect data block.
    pub fn new(hostid: [u8; 16], cntlid: u16, subnqn: &str, hostnqn: &str) -> Self {
        let mut d = <ConnectData as zerocopy::FromZeros>::new_zeroed();
        d.hostid = hostid;
        d.cntlid.set(cntlid);
        copy_nqn(&mut d.subnqn, subnqn);
        copy_nqn(&mut d.hostnqn, hostnqn);
        d
    }
}

/// Copy `s` into a fixed NQN field, truncating so a NUL terminator remains,
/// and zero the rest.
pub fn copy_nqn(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let n = s.len().min(dst.len().saturating_sub(1));
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// The text of a NUL-padded NQN field: bytes up to the first NUL. If the bytes
/// are not valid UTF-8, the longest valid prefix is returned.
pub fn nqn_from_bytes(b: &[u8]) -> &str {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let b = &b[..end];
    match core::str::from_utf8(b) {
        Ok(s) => s,
        // valid_up_to is a char boundary, so this cannot fail.
        Err(e) => core::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or(""),
    }
}

/// Fabrics command fields on the SQE. These read bytes 40.. of the command,
/// which for ordinary commands are CDW10 and up.
impl Command {
    /// Connect / Disconnect: record format (bytes 41:40).
    pub fn recfmt(&self) -> u16 {
        self.cdw10() as u16
    }
    /// Connect: queue id (bytes 43:42). 0 = admin queue.
    pub fn qid(&self) -> u16 {
        (self.cdw10() >> 16) as u16
    }
    /// Connect: submission queue size, 0-based (bytes 45:44).
    pub fn sqsize(&self) -> u16 {
        self.cdw11() as u16
    }
    /// Connect: connect attributes (byte 46).
    pub fn cattr(&self) -> u8 {
        (self.cdw11() >> 16) as u8
    }
    /// Connect: keep alive timeout in milliseconds (bytes 51:48).
    pub fn kato(&self) -> u32 {
        self.cdw12()
    }
    /// Property Get/Set: attributes (byte 40); bits 2:0 give the size.
    pub fn prop_attrib(&self) -> u8 {
        self.cdw10() as u8
    }
    /// Property Get/Set: size of the property in bytes (4 or 8), or `None`
    /// for a reserved size code.
    pub fn prop_size(&self) -> Option<usize> {
        match self.prop_attrib() & 0x7 {
            PROP_SIZE_4 => Some(4),
            PROP_SIZE_8 => Some(8),
            _ => None,
        }
    }
    /// Property Get/Set: property offset (bytes 47:44).
    pub fn prop_offset(&self) -> u32 {
        self.cdw11()
    }
    /// Property Set: value (bytes 55:48; the upper half is ignored for 4-byte properties).
    pub fn prop_value(&self) -> u64 {
        self.cdw12() as u64 | ((self.cdw13() as u64) << 32)
    }

    /// Build a Connect command. `sqsize` is 0-based; the 1024-byte
    /// `ConnectData` goes as in-capsule data (or via R2T).
    pub fn connect(cid: u16, qid: u16, sqsize: u16, cattr: u8, kato_ms: u32) -> Command {
        let mut c = Command::new(0, cid);
        c.set_fctype(FabricsType::Connect as u8);
        c.set_cdw10(CONNECT_RECFMT_0 as u32 | ((qid as u32) << 16));
        c.set_cdw11(sqsize as u32 | ((cattr as u32) << 16));
        c.set_cdw12(kato_ms);
        c.set_sgl(SglDescriptor::in_capsule(
            0,
            size_of::<ConnectData>() as u32,
        ));
        c
    }
    /// Build a Property Get command.
    pub fn property_get(cid: u16, offset: u32, size8: bool) -> Command {
        let mut c = Command::new(0, cid);
        c.set_fctype(FabricsType::PropertyGet as u8);
        c.set_cdw10(if size8 { PROP_SIZE_8 } else { PROP_SIZE_4 } as u32);
        c.set_cdw11(offset);
        c
    }
    /// Build a Property Set command.
    pub fn property_set(cid: u16, offset: u32, size8: bool, value: u64) -> Command {
        let mut c = Command::new(0, cid);
        c.set_fctype(FabricsType::PropertySet as u8);
        c.set_cdw10(if size8 { PROP_SIZE_8 } else { PROP_SIZE_4 } as u32);
        c.set_cdw11(offset);
        c.set_cdw12(value as u32);
        c.set_cdw13((value >> 32) as u32);
        c
    }
    /// Build a Disconnect command (for an I/O queue).
    pub fn disconnect(cid: u16) -> Command {
        let mut c = Command::new(0, cid);
        c.set_fctype(FabricsType::Disconnect as u8);
        c
    }
}

/// Connect response helpers: dword 0 holds the controller id (bits 15:0) on
/// success; on CONNECT_INVALID_PARAMETERS it holds which parameter was wrong.
impl Completion {
    /// A successful Connect completion carrying the controller id.
    pub fn connect_success(cid: u16, sqid: u16, sqhd: u16, cntlid: u16) -> Completion {
        Completion::new(cid, sqid, sqhd, Status::SUCCESS, cntlid as u32)
    }
    /// A Connect "invalid parameters" completion. `in_data` says whether the
    /// bad field is in the data block (true) or in the SQE (false);
    /// `byte_offset` is its offset there.
    pub fn connect_invalid_param(
        cid: u16,
        sqid: u16,
        sqhd: u16,
        in_data: bool,
        byte_offset: u16,
    ) -> Completion {
        // dw0: IPO (bits 15:0) = byte offset of the bad field, IATTR (bit 16)
        // = 1 if that field is in the Connect data, 0 if in the SQE. This is
        // the layout the Linux host decodes when it logs the failure.
        let dw0 = ((in_data as u32) << 16) | byte_offset as u32;
        Completion::new(
            cid,
            sqid,
            sqhd,
            Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
            dw0,
        )
    }

    /// For a Connect Invalid Parameters completion: (IATTR, IPO) — whether the
    /// bad field is in the Connect data, and its byte offset.
    pub fn connect_invalid_field(&self) -> (bool, u16) {
        let dw0 = self.dw0();
        (dw0 & (1 << 16) != 0, dw0 as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;
    use zerocopy::IntoBytes;

    #[test]
    fn connect_invalid_param_layout_matches_linux_host() {
        // The Linux host reads IPO from bits 15:0 and IATTR from bit 16.
        let c = Completion::connect_invalid_param(1, 0, 0, true, 256);
        assert_eq!(c.dw0(), (1 << 16) | 256);
        assert_eq!(c.connect_invalid_field(), (true, 256));
        let c = Completion::connect_invalid_param(1, 0, 0, false, 44);
        assert_eq!(c.dw0(), 44);
        assert_eq!(c.connect_invalid_field(), (false, 44));
    }

    #[test]
    fn connect_data_layout() {
        assert_eq!(offset_of!(ConnectData, hostid), 0);
        assert_eq!(offset_of!(ConnectData, cntlid), 16);
        assert_eq!(offset_of!(ConnectData, subnqn), 256);
        assert_eq!(offset_of!(ConnectData, hostnqn), 512);
    }

    #[test]
    fn connect_command_fields() {
        let c = Command::connect(3, 2, 127, CATTR_DISABLE_SQ_FLOW_CONTROL, 120_000);
        let b = c.as_bytes();
        assert_eq!(b[0], 0x7f);
        assert_eq!(b[4], 0x01);
        assert_eq!(&b[40..42], &[0, 0]); // recfmt
        assert_eq!(&b[42..44], &[2, 0]); // qid
        assert_eq!(&b[44..46], &[127, 0]); // sqsize
        assert_eq!(b[46], 4); // cattr
        assert_eq!(&b[48..52], &120_000u32.to_le_bytes());
        assert_eq!(
            (c.recfmt(), c.qid(), c.sqsize(), c.cattr(), c.kato()),
            (0, 2, 127, 4, 120_000)
        );
        assert_eq!(b[39], 0x01);
        assert_eq!(c.sgl().length(), 1024);
    }

    #[test]
    fn property_fields() {
        let c = Command::property_set(1, CC, false, 0x0046_0001);
        assert_eq!(c.fctype(), FabricsType::PropertySet as u8);
        assert_eq!(c.as_bytes()[40], 0);
        assert_eq!(&c.as_bytes()[44..48], &CC.to_le_bytes());
        assert_eq!(c.prop_size(), Some(4));
        assert_eq!(c.prop_offset(), 0x14);
        assert_eq!(c.prop_value(), 0x0046_0001);
        let g = Command::property_get(2, CAP, true);
        assert_eq!(g.prop_size(), Some(8));
        assert_eq!(g.fctype(), 0x04);
    }

    #[test]
    fn nqn_helpers() {
        let d = ConnectData::new(
            [7; 16],
            CNTLID_DYNAMIC,
            "nqn.2024-01.io.nvmfd:default",
            "nqn.host",
        );
        assert_eq!(d.subnqn(), "nqn.2024-01.io.nvmfd:default");
        assert_eq!(d.hostnqn(), "nqn.host");
        assert_eq!(d.cntlid(), 0xffff);
        assert_eq!(d.as_bytes()[16..18], [0xff, 0xff]);
        assert_eq!(nqn_from_bytes(b"abc\0\0def"), "abc");
        assert_eq!(nqn_from_bytes(b"abc"), "abc");
        assert_eq!(nqn_from_bytes(b"ab\xffc\0"), "ab");
        let mut f = [1u8; 4];
        copy_nqn(&mut f, "abcdef");
        assert_eq!(&f, b"abc\0");
    }

    #[test]
    fn cap() {
        let cap = cap_value(127, 30);
        assert_eq!(cap & 0xffff, 127);
        assert_eq!((cap >> 24) & 0xff, 30);
        assert_eq!((cap >> 37) & 1, 1);
    }
}
