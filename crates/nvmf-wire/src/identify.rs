//! Identify data structures: Identify Controller (CNS 01h), Identify Namespace
//! (CNS 00h) with its LBA formats, the Namespace Identification Descriptor list
//! (CNS 03h) builder, CNS values and the space-padded ASCII helper.

use core::mem::size_of;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Controller or Namespace Structure values (Identify CDW10 7:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Cns {
    /// Identify Namespace for the NSID in the command.
    Namespace = 0x00,
    /// Identify Controller.
    Controller = 0x01,
    /// Active namespace ID list (NSIDs greater than the one given).
    ActiveNsList = 0x02,
    /// Namespace Identification Descriptor list.
    NsDescList = 0x03,
    /// I/O command set specific Identify Namespace.
    CsiNamespace = 0x05,
    /// I/O command set specific Identify Controller.
    CsiController = 0x06,
    /// I/O command set independent Identify Namespace.
    CsIndependentNamespace = 0x08,
}

impl TryFrom<u8> for Cns {
    type Error = crate::opcode::UnknownValue;
    fn try_from(v: u8) -> Result<Self, Self::Error> {
        Ok(match v {
            0x00 => Cns::Namespace,
            0x01 => Cns::Controller,
            0x02 => Cns::ActiveNsList,
            0x03 => Cns::NsDescList,
            0x05 => Cns::CsiNamespace,
            0x06 => Cns::CsiController,
            0x08 => Cns::CsIndependentNamespace,
            value => return Err(crate::opcode::UnknownValue { kind: "CNS", value }),
        })
    }
}

/// Copy `s` into `dst`, padding the rest with ASCII spaces and truncating if
/// too long (the format of the SN, MN and FR fields).
pub fn fill_ascii(dst: &mut [u8], s: &str) {
    let n = s.len().min(dst.len());
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
    dst[n..].fill(b' ');
}

/// The text of a space-padded ASCII field with the padding removed.
pub fn ascii_trimmed(b: &[u8]) -> &str {
    let s = match core::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or(""),
    };
    s.trim_end_matches([' ', '\0'])
}

/// One power state descriptor (32 bytes) inside Identify Controller.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct PowerStateDescriptor {
    /// Maximum power, in centiwatts (or 0.0001 W units if MXPS is set).
    pub mp: U16,
    pub rsvd2: u8,
    /// Bit 0 MXPS (max power scale), bit 1 NOPS (non-operational state).
    pub flags: u8,
    /// Entry latency in microseconds.
    pub enlat: U32,
    /// Exit latency in microseconds.
    pub exlat: U32,
    pub rrt: u8,
    pub rrl: u8,
    pub rwt: u8,
    pub rwl: u8,
    pub idlp: U16,
    pub ips: u8,
    pub rsvd19: u8,
    pub actp: U16,
    pub apw_aps: u8,
    pub rsvd23: [u8; 9],
}
const _: () = assert!(size_of::<PowerStateDescriptor>() == 32);

/// Identify Controller data structure (4096 bytes).
///
/// Field names follow the specification's abbreviations. All multi-byte
/// fields are little-endian; use `.get()`/`.set()` on them.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct IdentifyController {
    /// PCI vendor id.
    pub vid: U16,
    /// PCI subsystem vendor id.
    pub ssvid: U16,
    /// Serial number, ASCII, space padded.
    pub sn: [u8; 20],
    /// Model number, ASCII, space padded.
    pub mn: [u8; 40],
    /// Firmware revision, ASCII, space padded.
    pub fr: [u8; 8],
    /// Recommended arbitration burst.
    pub rab: u8,
    /// IEEE OUI.
    pub ieee: [u8; 3],
    /// Multi-path / multi-controller capabilities.
    pub cmic: u8,
    /// Maximum data transfer size as a power of two of the minimum page size (0 = no limit).
    pub mdts: u8,
    /// Controller id.
    pub cntlid: U16,
    /// Version, same encoding as the VS property.
    pub ver: U32,
    /// RTD3 resume latency (µs).
    pub rtd3r: U32,
    /// RTD3 entry latency (µs).
    pub rtd3e: U32,
    /// Optional asynchronous events supported.
    pub oaes: U32,
    /// Controller attributes.
    pub ctratt: U32,
    /// Read recovery levels supported.
    pub rrls: U16,
    pub rsvd102: [u8; 9],
    /// Controller type: 1 I/O, 2 discovery, 3 administrative.
    pub cntrltype: u8,
    /// FRU globally unique identifier.
    pub fguid: [u8; 16],
    /// Command retry delay times.
    pub crdt1: U16,
    pub crdt2: U16,
    pub crdt3: U16,
    pub rsvd134: [u8; 119],
    /// NVM subsystem report, VPD write cycle info, management endpoint caps.
    pub nvmsr: u8,
    pub vwci: u8,
    pub mec: u8,
    /// Optional admin command support.
    pub oacs: U16,
    /// Abort command limit (0-based).
    pub acl: u8,
    /// Asynchronous event request limit (0-based).
    pub aerl: u8,
    /// Firmware updates.
    pub frmw: u8,
    /// Log page attributes.
    pub lpa: u8,
    /// Error log page entries (0-based).
    pub elpe: u8,
    /// Number of power states supported (0-based).
    pub npss: u8,
    /// Admin vendor specific command configuration.
    pub avscc: u8,
    /// Autonomous power state transition attributes.
    pub apsta: u8,
    /// Warning composite temperature threshold (Kelvin).
    pub wctemp: U16,
    /// Critical composite temperature threshold (Kelvin).
    pub cctemp: U16,
    pub mtfa: U16,
    pub hmpre: U32,
    pub hmmin: U32,
    /// Total NVM capacity in bytes (128-bit).
    pub tnvmcap: [u8; 16],
    /// Unallocated NVM capacity in bytes (128-bit).
    pub unvmcap: [u8; 16],
    pub rpmbs: U32,
    pub edstt: U16,
    pub dsto: u8,
    pub fwug: u8,
    /// Keep alive support: granularity in 100 ms units (0 = not supported).
    pub kas: U16,
    pub hctma: U16,
    pub mntmt: U16,
    pub mxtmt: U16,
    pub sanicap: U32,
    pub hmminds: U32,
    pub hmmaxd: U16,
    pub nsetidmax: U16,
    pub endgidmax: U16,
    /// ANA transition time (seconds).
    pub anatt: u8,
    /// ANA capabilities.
    pub anacap: u8,
    /// ANA group identifier maximum.
    pub anagrpmax: U32,
    /// Number of ANA group identifiers.
    pub nanagrpid: U32,
    pub pels: U32,
    pub domainid: U16,
    pub rsvd358: [u8; 10],
    pub megcap: [u8; 16],
    pub rsvd384: [u8; 128],
    /// Submission queue entry size: bits 3:0 required, 7:4 maximum (log2).
    pub sqes: u8,
    /// Completion queue entry size: bits 3:0 required, 7:4 maximum (log2).
    pub cqes: u8,
    /// Maximum outstanding commands.
    pub maxcmd: U16,
    /// Number of namespaces (largest valid NSID).
    pub nn: U32,
    /// Optional NVM command support.
    pub oncs: U16,
    /// Fused operation support.
    pub fuses: U16,
    /// Format NVM attributes.
    pub fna: u8,
    /// Volatile write cache: bit 0 present, bits 2:1 flush behaviour for NSID FFFFFFFFh.
    pub vwc: u8,
    pub awun: U16,
    pub awupf: U16,
    /// I/O command set vendor specific command configuration.
    pub nvscc: u8,
    /// Namespace write protection capabilities.
    pub nwpc: u8,
    pub acwu: U16,
    /// Optional copy formats supported.
    pub ocfs: U16,
    /// SGL support.
    pub sgls: U32,
    /// Maximum number of allowed namespaces.
    pub mnan: U32,
    pub maxdna: [u8; 16],
    pub maxcna: U32,
    pub rsvd564: [u8; 204],
    /// NVM subsystem NQN, NUL terminated.
    pub subnqn: [u8; 256],
    pub rsvd1024: [u8; 768],
    /// Fabrics: I/O queue command capsule supported size, in 16-byte units.
    pub ioccsz: U32,
    /// Fabrics: I/O queue response capsule supported size, in 16-byte units.
    pub iorcsz: U32,
    /// Fabrics: in-capsule data offset, in 16-byte units.
    pub icdoff: U16,
    /// Fabrics: controller attributes (bit 0 dynamic controller model).
    pub fcatt: u8,
    /// Fabrics: maximum SGL data block descriptors per command.
    pub msdbd: u8,
    /// Fabrics: optional fabric commands supported.
    pub ofcs: U16,
    pub rsvd1806: [u8; 242],
    /// Power state descriptors 0..=31.
    pub psd: [PowerStateDescriptor; 32],
    /// Vendor specific.
    pub vs: [u8; 1024],
}
const _: () = assert!(size_of::<IdentifyController>() == 4096);

/// Controller types for `IdentifyController::cntrltype`.
pub const CNTRLTYPE_IO: u8 = 1;
pub const CNTRLTYPE_DISCOVERY: u8 = 2;
pub const CNTRLTYPE_ADMIN: u8 = 3;

/// `oaes` bit: namespace attribute notices.
pub const OAES_NS_ATTR: u32 = 1 << 8;
/// `oaes` bit: firmware activation notices.
pub const OAES_FW_ACTIVATION: u32 = 1 << 9;
/// `oaes` bit: ANA change notices.
pub const OAES_ANA_CHANGE: u32 = 1 << 11;
/// `oaes` bit: discovery log page change notices.
pub const OAES_DISCOVERY_CHANGE: u32 = 1 << 31;

/// `lpa` bit: SMART log per namespace.
pub const LPA_SMART_PER_NS: u8 = 1 << 0;
/// `lpa` bit: Commands Supported and Effects log page.
pub const LPA_CMD_EFFECTS: u8 = 1 << 1;
/// `lpa` bit: extended data for Get Log Page (offsets, 32-bit NUMD).
pub const LPA_EXTENDED: u8 = 1 << 2;

/// `oncs` bit: Compare.
pub const ONCS_COMPARE: u16 = 1 << 0;
/// `oncs` bit: Write Uncorrectable.
pub const ONCS_WRITE_UNCORRECTABLE: u16 = 1 << 1;
/// `oncs` bit: Dataset Management.
pub const ONCS_DSM: u16 = 1 << 2;
/// `oncs` bit: Write Zeroes.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// `oncs` bit: Reservations.
pub const ONCS_RESERVATIONS: u16 = 1 << 5;

/// `sgls` bits: SGLs supported, no alignment requirement.
pub const SGLS_SUPPORTED: u32 = 1 << 0;
/// `sgls` bit: keyed SGL data block descriptor.
pub const SGLS_KEYED: u32 = 1 << 2;
/// `sgls` bit: address field may be an offset (in-capsule data).
pub const SGLS_OFFSET: u32 = 1 << 20;
/// `sgls` bit: transport SGL data block descriptor.
pub const SGLS_TRANSPORT: u32 = 1 << 21;

/// `vwc` bit: a volatile write cache is present.
pub const VWC_PRESENT: u8 = 1 << 0;

/// `cmic` bit: the subsystem may have more than one controller.
pub const CMIC_MULTI_CTRL: u8 = 1 << 1;
/// `cmic` bit: ANA reporting supported.
pub const CMIC_ANA: u8 = 1 << 3;

impl IdentifyController {
    /// Serial number without padding.
    pub fn serial(&self) -> &str {
        ascii_trimmed(&self.sn)
    }
    /// Model number without padding.
    pub fn model(&self) -> &str {
        ascii_trimmed(&self.mn)
    }
    /// Firmware revision without padding.
    pub fn firmware(&self) -> &str {
        ascii_trimmed(&self.fr)
    }
    /// Subsystem NQN as text.
    pub fn subnqn(&self) -> &str {
        crate::fabrics::nqn_from_bytes(&self.subnqn)
    }
    /// Set the subsystem NQN (NUL padded).
    pub fn set_subnqn(&mut self, nqn: &str) {
        crate::fabrics::copy_nqn(&mut self.subnqn, nqn);
    }
}

/// One LBA format descriptor (4 bytes).
#[repr(C)]
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
pub struct LbaFormat {
    /// Metadata bytes per block.
    pub ms: U16,
    /// Block size as log2 (9 = 512 bytes, 12 = 4096).
    pub lbads: u8,
    /// Relative performance (bits 1:0, 0 = best).
    pub rp: u8,
}
const _: () = assert!(size_of::<LbaFormat>() == 4);

impl LbaFormat {
    /// A format with `block_size` bytes per block (must be a power of two) and no metadata.
    pub fn new(block_size: u32) -> LbaFormat {
        LbaFormat {
            ms: U16::new(0),
            lbads: block_size.trailing_zeros() as u8,
            rp: 0,
        }
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> u64 {
        1u64 << (self.lbads & 63)
    }
}

/// Identify Namespace data structure for the NVM command set (4096 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct IdentifyNamespace {
    /// Namespace size in blocks.
    pub nsze: U64,
    /// Namespace capacity in blocks.
    pub ncap: U64,
    /// Namespace utilization in blocks.
    pub nuse: U64,
    /// Namespace features.
    pub nsfeat: u8,
    /// Number of LBA formats (0-based).
    pub nlbaf: u8,
    /// Formatted LBA size: bits 3:0 index into `lbaf`.
    pub flbas: u8,
    /// Metadata capabilities.
    pub mc: u8,
    /// End-to-end data protection capabilities.
    pub dpc: u8,
    /// End-to-end data protection type settings.
    pub dps: u8,
    /// Namespace multi-path and sharing capabilities (bit 0: may be shared).
    pub nmic: u8,
    /// Reservation capabilities.
    pub rescap: u8,
    /// Format progress indicator.
    pub fpi: u8,
    /// Deallocate logical block features.
    pub dlfeat: u8,
    pub nawun: U16,
    pub nawupf: U16,
    pub nacwu: U16,
    pub nabsn: U16,
    pub nabo: U16,
    pub nabspf: U16,
    /// Optimal I/O boundary in blocks.
    pub noiob: U16,
    /// NVM capacity in bytes (128-bit).
    pub nvmcap: [u8; 16],
    pub npwg: U16,
    pub npwa: U16,
    pub npdg: U16,
    pub npda: U16,
    pub nows: U16,
    pub mssrl: U16,
    pub mcl: U32,
    pub msrc: u8,
    pub rsvd81: u8,
    pub nulbaf: u8,
    pub rsvd83: [u8; 9],
    /// ANA group id this namespace belongs to.
    pub anagrpid: U32,
    pub rsvd96: [u8; 3],
    /// Namespace attributes (bit 0: write protected).
    pub nsattr: u8,
    pub nvmsetid: U16,
    pub endgid: U16,
    /// Namespace globally unique identifier.
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier.
    pub eui64: [u8; 8],
    /// LBA formats 0..=15.
    pub lbaf: [LbaFormat; 16],
    pub rsvd192: [u8; 192],
    pub vs: [u8; 3712],
}
const _: () = assert!(size_of::<IdentifyNamespace>() == 4096);

/// `nsfeat` bit: thin provisioning.
pub const NSFEAT_THIN: u8 = 1 << 0;
/// `nsfeat` bit: NAWUN/NAWUPF/NACWU are valid.
pub const NSFEAT_ATOMICS: u8 = 1 << 1;
/// `nsfeat` bit: deallocated/unwritten error supported.
pub const NSFEAT_DEALLOC_ERR: u8 = 1 << 2;
/// `nsfeat` bit: NPWG/NPWA/NPDG/NPDA/NOWS are valid.
pub const NSFEAT_IO_OPT: u8 = 1 << 4;
/// `nmic` bit: the namespace may be attached to several controllers.
pub const NMIC_SHARED: u8 = 1 << 0;
/// `nsattr` bit 0: the namespace is write protected.
pub const NSATTR_WRITE_PROTECTED: u8 = 1 << 0;

impl IdentifyNamespace {
    /// The LBA format selected by `flbas`.
    pub fn current_lbaf(&self) -> &LbaFormat {
        &self.lbaf[(self.flbas & 0xf) as usize]
    }
    /// Block size of the current format in bytes.
    pub fn block_size(&self) -> u64 {
        self.current_lbaf().block_size()
    }

    /// Writes `name` (its first [`VS_NAME_MAX`] bytes, cut at a character
    /// boundary) as nvmfd's namespace name in the vendor-specific area.
    pub fn set_vendor_name(&mut self, name: &str) {
        let mut n = name.len().min(VS_NAME_MAX);
        while !name.is_char_boundary(n) {
            n -= 1;
        }
        self.vs[..VS_NAME_MAGIC.len()].copy_from_slice(&VS_NAME_MAGIC);
        self.vs[6] = VS_NAME_VERSION;
        self.vs[7] = n as u8;
        self.vs[8..8 + n].copy_from_slice(&name.as_bytes()[..n]);
    }

    /// nvmfd's namespace name from the vendor-specific area: None unless
    /// the area starts with nvmfd's mark (another target's namespace) and
    /// holds valid UTF-8.
    pub fn vendor_name(&self) -> Option<&str> {
        if self.vs[..VS_NAME_MAGIC.len()] != VS_NAME_MAGIC || self.vs[6] != VS_NAME_VERSION {
            return None;
        }
        let n = usize::from(self.vs[7]);
        core::str::from_utf8(&self.vs[8..8 + n]).ok()
    }
}

/// nvmfd's mark at the start of Identify Namespace's vendor-specific area
/// (bytes 384..): `nvmfd\0`, a version byte (1), a length byte N, then N
/// bytes of UTF-8: the namespace's name (its bdev's), from which a Linux
/// host's udev gives the disk a readable name (`nvmf udev-name`,
/// /dev/disk/by-nvmfd/SUBSYSTEM/NAME).
pub const VS_NAME_MAGIC: [u8; 6] = *b"nvmfd\0";
/// Layout version of the name in the vendor-specific area.
pub const VS_NAME_VERSION: u8 = 1;
/// Longest name kept there, in bytes.
pub const VS_NAME_MAX: usize = 255;

/// Namespace identifier types for the descriptor list.
pub const NIDT_EUI64: u8 = 1;
pub const NIDT_NGUID: u8 = 2;
pub const NIDT_UUID: u8 = 3;
pub const NIDT_CSI: u8 = 4;

/// Builder for the 4096-byte Namespace Identification Descriptor list
/// (Identify CNS 03h). Each entry is: type, length, two reserved bytes, then
/// `length` bytes of identifier. The list ends at the first zero type.
/// The whole page lives inline; no allocation.
#[derive(Clone)]
pub struct NsDescriptorList {
    buf: [u8; 4096],
    len: usize,
}

impl Default for NsDescriptorList {
    fn default() -> Self {
        Self::new()
    }
}

impl NsDescriptorList {
    pub fn new() -> Self {
        NsDescriptorList {
            buf: [0; 4096],
            len: 0,
        }
    }
    /// Append one descriptor. Returns false (and adds nothing) if it does not fit.
    pub fn push(&mut self, nidt: u8, nid: &[u8]) -> bool {
        let need = 4 + nid.len();
        if nid.len() > 255 || self.len + need > self.buf.len() {
            return false;
        }
        let b = &mut self.buf[self.len..self.len + need];
        b[0] = nidt;
        b[1] = nid.len() as u8;
        b[2] = 0;
        b[3] = 0;
        b[4..].copy_from_slice(nid);
        self.len += need;
        true
    }
    pub fn push_eui64(&mut self, eui64: &[u8; 8]) -> bool {
        self.push(NIDT_EUI64, eui64)
    }
    pub fn push_nguid(&mut self, nguid: &[u8; 16]) -> bool {
        self.push(NIDT_NGUID, nguid)
    }
    pub fn push_uuid(&mut self, uuid: &[u8; 16]) -> bool {
        self.push(NIDT_UUID, uuid)
    }
    /// Command set identifier (0 = NVM).
    pub fn push_csi(&mut self, csi: u8) -> bool {
        self.push(NIDT_CSI, &[csi])
    }
    /// The full 4096-byte page (zero filled after the last descriptor).
    pub fn as_bytes(&self) -> &[u8; 4096] {
        &self.buf
    }
    /// Bytes used by descriptors so far.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Iterate over the descriptors in a Namespace Identification Descriptor
/// list: yields `(nidt, nid)` until a zero type or the end of the buffer.
pub fn ns_descriptors(page: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut off = 0usize;
    core::iter::from_fn(move || {
        let hdr = page.get(off..off + 4)?;
        if hdr[0] == 0 {
            return None;
        }
        let len = hdr[1] as usize;
        let nid = page.get(off + 4..off + 4 + len)?;
        off += 4 + len;
        Some((hdr[0], nid))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;
    use zerocopy::FromZeros;

    #[test]
    fn namespace_name_in_the_vendor_specific_area() {
        let mut id = IdentifyNamespace::new_zeroed();
        assert_eq!(id.vendor_name(), None, "no mark: not nvmfd's");
        id.set_vendor_name("vm-101-disk-0");
        assert_eq!(id.vendor_name(), Some("vm-101-disk-0"));
        assert_eq!(&id.vs[..8], b"nvmfd\0\x01\x0d");
        // bytes 384.. of the 4096-byte page
        assert_eq!(offset_of!(IdentifyNamespace, vs), 384);
        // too long: cut at a character boundary within 255 bytes
        let long = "é".repeat(200);
        id.set_vendor_name(&long);
        let got = id.vendor_name().unwrap();
        assert_eq!(got.len(), 254);
        assert!(long.starts_with(got));
        // another target's vendor data is not read as a name
        id.vs[0] = b'X';
        assert_eq!(id.vendor_name(), None);
    }

    #[test]
    fn controller_layout() {
        type C = IdentifyController;
        assert_eq!(offset_of!(C, vid), 0);
        assert_eq!(offset_of!(C, ssvid), 2);
        assert_eq!(offset_of!(C, sn), 4);
        assert_eq!(offset_of!(C, mn), 24);
        assert_eq!(offset_of!(C, fr), 64);
        assert_eq!(offset_of!(C, rab), 72);
        assert_eq!(offset_of!(C, ieee), 73);
        assert_eq!(offset_of!(C, cmic), 76);
        assert_eq!(offset_of!(C, mdts), 77);
        assert_eq!(offset_of!(C, cntlid), 78);
        assert_eq!(offset_of!(C, ver), 80);
        assert_eq!(offset_of!(C, rtd3r), 84);
        assert_eq!(offset_of!(C, rtd3e), 88);
        assert_eq!(offset_of!(C, oaes), 92);
        assert_eq!(offset_of!(C, ctratt), 96);
        assert_eq!(offset_of!(C, rrls), 100);
        assert_eq!(offset_of!(C, cntrltype), 111);
        assert_eq!(offset_of!(C, fguid), 112);
        assert_eq!(offset_of!(C, crdt1), 128);
        assert_eq!(offset_of!(C, crdt3), 132);
        assert_eq!(offset_of!(C, nvmsr), 253);
        assert_eq!(offset_of!(C, oacs), 256);
        assert_eq!(offset_of!(C, acl), 258);
        assert_eq!(offset_of!(C, aerl), 259);
        assert_eq!(offset_of!(C, frmw), 260);
        assert_eq!(offset_of!(C, lpa), 261);
        assert_eq!(offset_of!(C, elpe), 262);
        assert_eq!(offset_of!(C, npss), 263);
        assert_eq!(offset_of!(C, avscc), 264);
        assert_eq!(offset_of!(C, apsta), 265);
        assert_eq!(offset_of!(C, wctemp), 266);
        assert_eq!(offset_of!(C, cctemp), 268);
        assert_eq!(offset_of!(C, mtfa), 270);
        assert_eq!(offset_of!(C, hmpre), 272);
        assert_eq!(offset_of!(C, hmmin), 276);
        assert_eq!(offset_of!(C, tnvmcap), 280);
        assert_eq!(offset_of!(C, unvmcap), 296);
        assert_eq!(offset_of!(C, rpmbs), 312);
        assert_eq!(offset_of!(C, edstt), 316);
        assert_eq!(offset_of!(C, dsto), 318);
        assert_eq!(offset_of!(C, fwug), 319);
        assert_eq!(offset_of!(C, kas), 320);
        assert_eq!(offset_of!(C, hctma), 322);
        assert_eq!(offset_of!(C, sanicap), 328);
        assert_eq!(offset_of!(C, hmminds), 332);
        assert_eq!(offset_of!(C, hmmaxd), 336);
        assert_eq!(offset_of!(C, nsetidmax), 338);
        assert_eq!(offset_of!(C, endgidmax), 340);
        assert_eq!(offset_of!(C, anatt), 342);
        assert_eq!(offset_of!(C, anacap), 343);
        assert_eq!(offset_of!(C, anagrpmax), 344);
        assert_eq!(offset_of!(C, nanagrpid), 348);
        assert_eq!(offset_of!(C, pels), 352);
        assert_eq!(offset_of!(C, megcap), 368);
        assert_eq!(offset_of!(C, sqes), 512);
        assert_eq!(offset_of!(C, cqes), 513);
        assert_eq!(offset_of!(C, maxcmd), 514);
        assert_eq!(offset_of!(C, nn), 516);
        assert_eq!(offset_of!(C, oncs), 520);
        assert_eq!(offset_of!(C, fuses), 522);
        assert_eq!(offset_of!(C, fna), 524);
        assert_eq!(offset_of!(C, vwc), 525);
        assert_eq!(offset_of!(C, awun), 526);
        assert_eq!(offset_of!(C, awupf), 528);
        assert_eq!(offset_of!(C, nvscc), 530);
        assert_eq!(offset_of!(C, nwpc), 531);
        assert_eq!(offset_of!(C, acwu), 532);
        assert_eq!(offset_of!(C, ocfs), 534);
        assert_eq!(offset_of!(C, sgls), 536);
        assert_eq!(offset_of!(C, mnan), 540);
        assert_eq!(offset_of!(C, maxdna), 544);
        assert_eq!(offset_of!(C, maxcna), 560);
        assert_eq!(offset_of!(C, subnqn), 768);
        assert_eq!(offset_of!(C, ioccsz), 1792);
        assert_eq!(offset_of!(C, iorcsz), 1796);
        assert_eq!(offset_of!(C, icdoff), 1800);
        assert_eq!(offset_of!(C, fcatt), 1802);
        assert_eq!(offset_of!(C, msdbd), 1803);
        assert_eq!(offset_of!(C, ofcs), 1804);
        assert_eq!(offset_of!(C, psd), 2048);
        assert_eq!(offset_of!(C, vs), 3072);
    }

    #[test]
    fn power_state_layout() {
        type P = PowerStateDescriptor;
        assert_eq!(offset_of!(P, mp), 0);
        assert_eq!(offset_of!(P, flags), 3);
        assert_eq!(offset_of!(P, enlat), 4);
        assert_eq!(offset_of!(P, exlat), 8);
        assert_eq!(offset_of!(P, rrt), 12);
        assert_eq!(offset_of!(P, rwl), 15);
        assert_eq!(offset_of!(P, idlp), 16);
        assert_eq!(offset_of!(P, ips), 18);
        assert_eq!(offset_of!(P, actp), 20);
        assert_eq!(offset_of!(P, apw_aps), 22);
    }

    #[test]
    fn namespace_layout() {
        type N = IdentifyNamespace;
        assert_eq!(offset_of!(N, nsze), 0);
        assert_eq!(offset_of!(N, ncap), 8);
        assert_eq!(offset_of!(N, nuse), 16);
        assert_eq!(offset_of!(N, nsfeat), 24);
        assert_eq!(offset_of!(N, nlbaf), 25);
        assert_eq!(offset_of!(N, flbas), 26);
        assert_eq!(offset_of!(N, mc), 27);
        assert_eq!(offset_of!(N, dpc), 28);
        assert_eq!(offset_of!(N, dps), 29);
        assert_eq!(offset_of!(N, nmic), 30);
        assert_eq!(offset_of!(N, rescap), 31);
        assert_eq!(offset_of!(N, fpi), 32);
        assert_eq!(offset_of!(N, dlfeat), 33);
        assert_eq!(offset_of!(N, nawun), 34);
        assert_eq!(offset_of!(N, nawupf), 36);
        assert_eq!(offset_of!(N, nacwu), 38);
        assert_eq!(offset_of!(N, nabsn), 40);
        assert_eq!(offset_of!(N, nabo), 42);
        assert_eq!(offset_of!(N, nabspf), 44);
        assert_eq!(offset_of!(N, noiob), 46);
        assert_eq!(offset_of!(N, nvmcap), 48);
        assert_eq!(offset_of!(N, npwg), 64);
        assert_eq!(offset_of!(N, nows), 72);
        assert_eq!(offset_of!(N, mssrl), 74);
        assert_eq!(offset_of!(N, mcl), 76);
        assert_eq!(offset_of!(N, msrc), 80);
        assert_eq!(offset_of!(N, nulbaf), 82);
        assert_eq!(offset_of!(N, anagrpid), 92);
        assert_eq!(offset_of!(N, nsattr), 99);
        assert_eq!(offset_of!(N, nvmsetid), 100);
        assert_eq!(offset_of!(N, endgid), 102);
        assert_eq!(offset_of!(N, nguid), 104);
        assert_eq!(offset_of!(N, eui64), 120);
        assert_eq!(offset_of!(N, lbaf), 128);
        assert_eq!(offset_of!(N, vs), 384);
        assert_eq!(offset_of!(LbaFormat, ms), 0);
        assert_eq!(offset_of!(LbaFormat, lbads), 2);
        assert_eq!(offset_of!(LbaFormat, rp), 3);
    }

    #[test]
    fn ascii_and_fields() {
        let mut c = IdentifyController::new_zeroed();
        fill_ascii(&mut c.sn, "NVMFD0000000001");
        fill_ascii(&mut c.mn, "nvmfd RAM disk");
        fill_ascii(&mut c.fr, "0.1.0-too-long");
        c.set_subnqn("nqn.2024-01.io.nvmfd:default");
        c.ver.set(crate::fabrics::VS_1_3);
        assert_eq!(&c.sn, b"NVMFD0000000001     ");
        assert_eq!(c.serial(), "NVMFD0000000001");
        assert_eq!(c.model(), "nvmfd RAM disk");
        assert_eq!(&c.fr, b"0.1.0-to");
        assert_eq!(c.subnqn(), "nqn.2024-01.io.nvmfd:default");
        let b = zerocopy::IntoBytes::as_bytes(&c);
        assert_eq!(&b[80..84], &[0x00, 0x03, 0x01, 0x00]);
        assert_eq!(&b[768..771], b"nqn");

        let mut ns = IdentifyNamespace::new_zeroed();
        ns.lbaf[0] = LbaFormat::new(512);
        ns.lbaf[1] = LbaFormat::new(4096);
        ns.flbas = 1;
        assert_eq!(ns.block_size(), 4096);
        assert_eq!(ns.lbaf[0].lbads, 9);
    }

    #[test]
    fn cns_values() {
        assert_eq!(Cns::try_from(1), Ok(Cns::Controller));
        assert_eq!(Cns::NsDescList as u8, 3);
        assert!(Cns::try_from(0x04).is_err());
    }

    #[test]
    fn descriptor_list() {
        let mut l = NsDescriptorList::new();
        assert!(l.push_eui64(&[1; 8]));
        assert!(l.push_nguid(&[2; 16]));
        assert!(l.push_uuid(&[3; 16]));
        assert_eq!(l.len(), 12 + 20 + 20);
        let b = l.as_bytes();
        assert_eq!(&b[0..4], &[1, 8, 0, 0]);
        assert_eq!(&b[12..16], &[2, 16, 0, 0]);
        assert_eq!(&b[32..36], &[3, 16, 0, 0]);
        let v: Vec<_> = ns_descriptors(b).collect();
        assert_eq!(v.len(), 3);
        assert_eq!(v[1], (NIDT_NGUID, &[2u8; 16][..]));
        // Fill it up: pushes fail cleanly once there is no room.
        let mut n = 0;
        while l.push_uuid(&[4; 16]) {
            n += 1;
        }
        assert!(n > 100);
        assert!(l.len() <= 4096);
    }
}
