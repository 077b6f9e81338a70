//! Log page layouts: Error Information entries, SMART / Health, Firmware Slot
//! Information, Changed Namespace List, Asymmetric Namespace Access (header,
//! group descriptors, state codes), and the Discovery log (header and
//! entries) with its transport/address/subsystem-type constants.

use core::mem::size_of;
use zerocopy::little_endian::{U128, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// One Error Information log entry (64 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct ErrorLogEntry {
    /// Unique, increasing error count (0 = entry invalid).
    pub error_count: U64,
    pub sqid: U16,
    pub cmdid: U16,
    /// CQE status field of the failed command.
    pub status_field: U16,
    /// Byte (bits 7:0) and bit (10:8) in the command that was in error.
    pub parm_error_location: U16,
    pub lba: U64,
    pub nsid: U32,
    pub vs: u8,
    pub trtype: u8,
    pub rsvd30: [u8; 2],
    pub cs: U64,
    pub trtype_spec_info: U16,
    pub rsvd42: [u8; 22],
}
const _: () = assert!(size_of::<ErrorLogEntry>() == 64);

/// SMART / Health Information log page (512 bytes). The 128-bit counters are
/// in units defined by the spec (data units are 1000 × 512 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct SmartLog {
    pub critical_warning: u8,
    /// Composite temperature in Kelvin.
    pub temperature: U16,
    pub avail_spare: u8,
    pub spare_thresh: u8,
    pub percent_used: u8,
    pub endu_grp_crit_warn_sumry: u8,
    pub rsvd7: [u8; 25],
    pub data_units_read: U128,
    pub data_units_written: U128,
    pub host_reads: U128,
    pub host_writes: U128,
    pub ctrl_busy_time: U128,
    pub power_cycles: U128,
    pub power_on_hours: U128,
    pub unsafe_shutdowns: U128,
    pub media_errors: U128,
    pub num_err_log_entries: U128,
    pub warning_temp_time: U32,
    pub critical_comp_time: U32,
    pub temp_sensor: [U16; 8],
    pub thm_temp1_trans_count: U32,
    pub thm_temp2_trans_count: U32,
    pub thm_temp1_total_time: U32,
    pub thm_temp2_total_time: U32,
    pub rsvd232: [u8; 280],
}
const _: () = assert!(size_of::<SmartLog>() == 512);

/// Firmware Slot Information log page (512 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct FirmwareSlotLog {
    /// Active firmware info: bits 2:0 active slot, bits 6:4 slot for next reset.
    pub afi: u8,
    pub rsvd1: [u8; 7],
    /// Firmware revision for slots 1..=7 (ASCII, space padded).
    pub frs: [[u8; 8]; 7],
    pub rsvd64: [u8; 448],
}
const _: () = assert!(size_of::<FirmwareSlotLog>() == 512);

/// Changed Namespace List log page: up to 1024 NSIDs, zero terminated.
/// If more than 1024 changed, the first entry is FFFFFFFFh.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct ChangedNsList {
    pub nsid: [U32; 1024],
}
const _: () = assert!(size_of::<ChangedNsList>() == 4096);

/// Asymmetric Namespace Access log page (0Ch) header (16 bytes); group
/// descriptors follow, each trailed by its NSIDs (`nnsids` × u32).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct AnaLogHeader {
    /// Incremented whenever the page's content changes.
    pub chgcnt: U64,
    /// Number of group descriptors that follow.
    pub ngrps: U16,
    pub rsvd10: [u8; 6],
}
const _: () = assert!(size_of::<AnaLogHeader>() == 16);

/// One ANA group descriptor (32 bytes) of log page 0Ch, followed by
/// `nnsids` namespace IDs (none when the host asked for groups only).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct AnaGroupDescriptor {
    pub anagrpid: U32,
    /// NSIDs listed after this descriptor.
    pub nnsids: U32,
    /// Change count of this group.
    pub chgcnt: U64,
    /// ANA state (bits 3:0): one of the `ANA_*` constants.
    pub state: u8,
    pub rsvd17: [u8; 15],
}
const _: () = assert!(size_of::<AnaGroupDescriptor>() == 32);

/// ANA state: optimized.
pub const ANA_OPTIMIZED: u8 = 0x1;
/// ANA state: non-optimized.
pub const ANA_NON_OPTIMIZED: u8 = 0x2;
/// ANA state: inaccessible.
pub const ANA_INACCESSIBLE: u8 = 0x3;
/// ANA state: persistent loss.
pub const ANA_PERSISTENT_LOSS: u8 = 0x4;
/// ANA state: change (transition in progress).
pub const ANA_CHANGE: u8 = 0xF;
/// Get Log Page 0Ch log specific field bit 0: Return Groups Only (no NSID lists).
pub const ANA_LSP_RGO: u8 = 1 << 0;

/// Discovery log page header (1024 bytes); entries follow at offset 1024.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct DiscoveryLogHeader {
    /// Generation counter: changes whenever the log content changes.
    pub genctr: U64,
    /// Number of records.
    pub numrec: U64,
    /// Record format (0).
    pub recfmt: U16,
    pub rsvd18: [u8; 1006],
}
const _: () = assert!(size_of::<DiscoveryLogHeader>() == 1024);

/// One Discovery log entry (1024 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct DiscoveryLogEntry {
    /// Transport type (`TRTYPE_*`).
    pub trtype: u8,
    /// Address family (`ADRFAM_*`).
    pub adrfam: u8,
    /// Subsystem type (`SUBTYPE_*`).
    pub subtype: u8,
    /// Transport requirements (`TREQ_*`).
    pub treq: u8,
    pub portid: U16,
    /// 0xffff for the dynamic controller model.
    pub cntlid: U16,
    /// Admin max SQ size.
    pub asqsz: U16,
    /// Entry flags (`EFLAGS_*`).
    pub eflags: U16,
    pub rsvd12: [u8; 20],
    /// Transport service id (TCP port as text), space padded.
    pub trsvcid: [u8; 32],
    pub rsvd64: [u8; 192],
    /// Subsystem NQN, NUL padded.
    pub subnqn: [u8; 256],
    /// Transport address (IP address as text), space padded.
    pub traddr: [u8; 256],
    /// Transport specific address subtype; for TCP, byte 0 is `sectype`.
    pub tsas: [u8; 256],
}
const _: () = assert!(size_of::<DiscoveryLogEntry>() == 1024);

/// Transport types.
pub const TRTYPE_RDMA: u8 = 1;
pub const TRTYPE_FC: u8 = 2;
pub const TRTYPE_TCP: u8 = 3;
pub const TRTYPE_LOOP: u8 = 254;

/// Address families.
pub const ADRFAM_IPV4: u8 = 1;
pub const ADRFAM_IPV6: u8 = 2;
pub const ADRFAM_IB: u8 = 3;
pub const ADRFAM_FC: u8 = 4;

/// Subsystem types: a referral to another discovery subsystem.
pub const SUBTYPE_DISCOVERY: u8 = 1;
/// Subsystem types: an NVM subsystem.
pub const SUBTYPE_NVM: u8 = 2;
/// Subsystem types: the discovery subsystem being queried.
pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;

/// Transport requirements: secure channel not specified.
pub const TREQ_SECURE_CHANNEL_NOT_SPECIFIED: u8 = 0;
/// Transport requirements: secure channel required.
pub const TREQ_SECURE_CHANNEL_REQUIRED: u8 = 1;
/// Transport requirements: secure channel not required.
pub const TREQ_SECURE_CHANNEL_NOT_REQUIRED: u8 = 2;
/// Transport requirements: SQ flow control may be disabled.
pub const TREQ_DISABLE_SQFLOW: u8 = 1 << 2;

/// Entry flags: duplicate returned information.
pub const EFLAGS_DUPRETINFO: u16 = 1 << 0;
/// Entry flags: explicit persistent connection support for discovery.
pub const EFLAGS_EPCSD: u16 = 1 << 1;
/// Entry flags: no CDC connectivity.
pub const EFLAGS_NCC: u16 = 1 << 2;

/// TCP TSAS security type: none.
pub const TSAS_TCP_SECTYPE_NONE: u8 = 0;
/// TCP TSAS security type: TLS 1.2.
pub const TSAS_TCP_SECTYPE_TLS12: u8 = 1;
/// TCP TSAS security type: TLS 1.3.
pub const TSAS_TCP_SECTYPE_TLS13: u8 = 2;

impl DiscoveryLogEntry {
    /// Build an entry: text fields are space padded (trsvcid, traddr) or NUL
    /// padded (subnqn) as hosts expect; `tsas` is zero (TCP, no security).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        trtype: u8,
        adrfam: u8,
        subtype: u8,
        treq: u8,
        portid: u16,
        asqsz: u16,
        trsvcid: &str,
        subnqn: &str,
        traddr: &str,
    ) -> Self {
        let mut e = <Self as zerocopy::FromZeros>::new_zeroed();
        e.trtype = trtype;
        e.adrfam = adrfam;
        e.subtype = subtype;
        e.treq = treq;
        e.portid.set(portid);
        e.cntlid.set(0xffff);
        e.asqsz.set(asqsz);
        crate::identify::fill_ascii(&mut e.trsvcid, trsvcid);
        crate::fabrics::copy_nqn(&mut e.subnqn, subnqn);
        crate::identify::fill_ascii(&mut e.traddr, traddr);
        e.tsas[0] = TSAS_TCP_SECTYPE_NONE;
        e
    }
    pub fn subnqn(&self) -> &str {
        crate::fabrics::nqn_from_bytes(&self.subnqn)
    }
    pub fn traddr(&self) -> &str {
        crate::identify::ascii_trimmed(&self.traddr)
    }
    pub fn trsvcid(&self) -> &str {
        crate::identify::ascii_trimmed(&self.trsvcid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn error_log_layout() {
        assert_eq!(offset_of!(ErrorLogEntry, sqid), 8);
        assert_eq!(offset_of!(ErrorLogEntry, cmdid), 10);
        assert_eq!(offset_of!(ErrorLogEntry, status_field), 12);
        assert_eq!(offset_of!(ErrorLogEntry, lba), 16);
        assert_eq!(offset_of!(ErrorLogEntry, nsid), 24);
        assert_eq!(offset_of!(ErrorLogEntry, trtype), 29);
        assert_eq!(offset_of!(ErrorLogEntry, cs), 32);
        assert_eq!(offset_of!(ErrorLogEntry, trtype_spec_info), 40);
    }

    #[test]
    fn smart_layout() {
        assert_eq!(offset_of!(SmartLog, temperature), 1);
        assert_eq!(offset_of!(SmartLog, avail_spare), 3);
        assert_eq!(offset_of!(SmartLog, percent_used), 5);
        assert_eq!(offset_of!(SmartLog, data_units_read), 32);
        assert_eq!(offset_of!(SmartLog, data_units_written), 48);
        assert_eq!(offset_of!(SmartLog, host_reads), 64);
        assert_eq!(offset_of!(SmartLog, power_on_hours), 128);
        assert_eq!(offset_of!(SmartLog, num_err_log_entries), 176);
        assert_eq!(offset_of!(SmartLog, warning_temp_time), 192);
        assert_eq!(offset_of!(SmartLog, temp_sensor), 200);
        assert_eq!(offset_of!(SmartLog, thm_temp1_trans_count), 216);
        assert_eq!(offset_of!(SmartLog, thm_temp2_total_time), 228);
    }

    #[test]
    fn ana_layout() {
        assert_eq!(offset_of!(AnaLogHeader, chgcnt), 0);
        assert_eq!(offset_of!(AnaLogHeader, ngrps), 8);
        assert_eq!(offset_of!(AnaGroupDescriptor, anagrpid), 0);
        assert_eq!(offset_of!(AnaGroupDescriptor, nnsids), 4);
        assert_eq!(offset_of!(AnaGroupDescriptor, chgcnt), 8);
        assert_eq!(offset_of!(AnaGroupDescriptor, state), 16);
    }

    #[test]
    fn firmware_and_discovery_layout() {
        assert_eq!(offset_of!(FirmwareSlotLog, frs), 8);
        assert_eq!(offset_of!(DiscoveryLogHeader, numrec), 8);
        assert_eq!(offset_of!(DiscoveryLogHeader, recfmt), 16);
        type E = DiscoveryLogEntry;
        assert_eq!(offset_of!(E, trtype), 0);
        assert_eq!(offset_of!(E, adrfam), 1);
        assert_eq!(offset_of!(E, subtype), 2);
        assert_eq!(offset_of!(E, treq), 3);
        assert_eq!(offset_of!(E, portid), 4);
        assert_eq!(offset_of!(E, cntlid), 6);
        assert_eq!(offset_of!(E, asqsz), 8);
        assert_eq!(offset_of!(E, eflags), 10);
        assert_eq!(offset_of!(E, trsvcid), 32);
        assert_eq!(offset_of!(E, subnqn), 256);
        assert_eq!(offset_of!(E, traddr), 512);
        assert_eq!(offset_of!(E, tsas), 768);
    }

    #[test]
    fn discovery_entry_builder() {
        let e = DiscoveryLogEntry::new(
            TRTYPE_TCP,
            ADRFAM_IPV4,
            SUBTYPE_NVM,
            TREQ_SECURE_CHANNEL_NOT_REQUIRED,
            1,
            32,
            "4420",
            "nqn.2024-01.io.nvmfd:default",
            "127.0.0.1",
        );
        let b = zerocopy::IntoBytes::as_bytes(&e);
        assert_eq!(&b[0..4], &[3, 1, 2, 2]);
        assert_eq!(&b[6..8], &[0xff, 0xff]);
        assert_eq!(&b[32..38], b"4420  ");
        assert_eq!(e.trsvcid(), "4420");
        assert_eq!(e.traddr(), "127.0.0.1");
        assert_eq!(e.subnqn(), "nqn.2024-01.io.nvmfd:default");
    }
}
