//! NVMe completion status codes: the `Status` value carried in the upper half of
//! completion queue entry dword 3, the named codes this target uses, and the
//! human readable names an initiator prints.

use core::fmt;

/// Status Code Type values (bits 11:9 of the status field).
pub mod sct {
    /// Generic command status.
    pub const GENERIC: u8 = 0;
    /// Status specific to the command that was executed.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and data integrity errors.
    pub const MEDIA: u8 = 2;
    /// Path related status (ANA, transport paths).
    pub const PATH: u8 = 3;
    /// Vendor specific.
    pub const VENDOR: u8 = 7;
}

/// A completion status: type, code and the two flag bits the target sets.
///
/// The phase tag and the Command Retry Delay bits are not part of this value;
/// `to_field` leaves them zero and `from_field` ignores them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status {
    /// Status Code Type (3 bits).
    pub sct: u8,
    /// Status Code.
    pub sc: u8,
    /// Do Not Retry: the same command would fail again.
    pub dnr: bool,
    /// More: extra information is available in the Error log page.
    pub more: bool,
}

macro_rules! codes {
    ($( $(#[$m:meta])* $name:ident = ($sct:expr, $sc:expr); )*) => {
        impl Status {
            $( $(#[$m])* pub const $name: Status = Status::new($sct, $sc); )*

            /// Every named status constant with its Rust name (for tables and tests).
            pub const ALL: &'static [(&'static str, Status)] = &[$((stringify!($name), Status::$name),)*];
        }
    };
}

codes! {
    /// The command finished without error.
    SUCCESS = (sct::GENERIC, 0x00);
    INVALID_OPCODE = (sct::GENERIC, 0x01);
    INVALID_FIELD = (sct::GENERIC, 0x02);
    CID_CONFLICT = (sct::GENERIC, 0x03);
    DATA_TRANSFER_ERROR = (sct::GENERIC, 0x04);
    ABORTED_POWER_LOSS = (sct::GENERIC, 0x05);
    INTERNAL_ERROR = (sct::GENERIC, 0x06);
    ABORTED_BY_REQUEST = (sct::GENERIC, 0x07);
    ABORTED_SQ_DELETION = (sct::GENERIC, 0x08);
    ABORTED_FAILED_FUSED = (sct::GENERIC, 0x09);
    ABORTED_MISSING_FUSED = (sct::GENERIC, 0x0a);
    INVALID_NAMESPACE = (sct::GENERIC, 0x0b);
    COMMAND_SEQUENCE_ERROR = (sct::GENERIC, 0x0c);
    /// Invalid SGL Segment Descriptor (the last segment descriptor was bad).
    INVALID_SGL_LAST_SEG = (sct::GENERIC, 0x0d);
    INVALID_SGL_COUNT = (sct::GENERIC, 0x0e);
    SGL_DATA_LENGTH_INVALID = (sct::GENERIC, 0x0f);
    SGL_METADATA_LENGTH_INVALID = (sct::GENERIC, 0x10);
    SGL_INVALID_DESCRIPTOR_TYPE = (sct::GENERIC, 0x11);
    INVALID_CMB_USE = (sct::GENERIC, 0x12);
    PRP_OFFSET_INVALID = (sct::GENERIC, 0x13);
    ATOMIC_WRITE_UNIT_EXCEEDED = (sct::GENERIC, 0x14);
    OPERATION_DENIED = (sct::GENERIC, 0x15);
    SGL_OFFSET_INVALID = (sct::GENERIC, 0x16);
    HOST_ID_INCONSISTENT_FORMAT = (sct::GENERIC, 0x18);
    KEEP_ALIVE_EXPIRED = (sct::GENERIC, 0x19);
    KEEP_ALIVE_INVALID = (sct::GENERIC, 0x1a);
    ABORTED_PREEMPT = (sct::GENERIC, 0x1b);
    SANITIZE_FAILED = (sct::GENERIC, 0x1c);
    SANITIZE_IN_PROGRESS = (sct::GENERIC, 0x1d);
    SGL_DATA_BLOCK_GRANULARITY_INVALID = (sct::GENERIC, 0x1e);
    NS_WRITE_PROTECTED = (sct::GENERIC, 0x20);
    COMMAND_INTERRUPTED = (sct::GENERIC, 0x21);
    /// A transport error that may go away on retry (used for data digest errors).
    TRANSIENT_TRANSPORT_ERROR = (sct::GENERIC, 0x22);
    LBA_OUT_OF_RANGE = (sct::GENERIC, 0x80);
    CAPACITY_EXCEEDED = (sct::GENERIC, 0x81);
    NAMESPACE_NOT_READY = (sct::GENERIC, 0x82);
    RESERVATION_CONFLICT = (sct::GENERIC, 0x83);
    FORMAT_IN_PROGRESS = (sct::GENERIC, 0x84);

    COMPLETION_QUEUE_INVALID = (sct::COMMAND_SPECIFIC, 0x00);
    INVALID_QUEUE_ID = (sct::COMMAND_SPECIFIC, 0x01);
    INVALID_QUEUE_SIZE = (sct::COMMAND_SPECIFIC, 0x02);
    ABORT_LIMIT_EXCEEDED = (sct::COMMAND_SPECIFIC, 0x03);
    ASYNC_EVENT_LIMIT_EXCEEDED = (sct::COMMAND_SPECIFIC, 0x05);
    INVALID_FIRMWARE_SLOT = (sct::COMMAND_SPECIFIC, 0x06);
    INVALID_FIRMWARE_IMAGE = (sct::COMMAND_SPECIFIC, 0x07);
    INVALID_INTERRUPT_VECTOR = (sct::COMMAND_SPECIFIC, 0x08);
    INVALID_LOG_PAGE = (sct::COMMAND_SPECIFIC, 0x09);
    INVALID_FORMAT = (sct::COMMAND_SPECIFIC, 0x0a);
    INVALID_QUEUE_DELETION = (sct::COMMAND_SPECIFIC, 0x0c);
    FEATURE_NOT_SAVEABLE = (sct::COMMAND_SPECIFIC, 0x0d);
    FEATURE_NOT_CHANGEABLE = (sct::COMMAND_SPECIFIC, 0x0e);
    FEATURE_NOT_NS_SPECIFIC = (sct::COMMAND_SPECIFIC, 0x0f);
    NS_ALREADY_ATTACHED = (sct::COMMAND_SPECIFIC, 0x18);
    NS_IS_PRIVATE = (sct::COMMAND_SPECIFIC, 0x19);
    NS_NOT_ATTACHED = (sct::COMMAND_SPECIFIC, 0x1a);
    INVALID_CONTROLLER_ID = (sct::COMMAND_SPECIFIC, 0x1f);
    ANA_GROUP_ID_INVALID = (sct::COMMAND_SPECIFIC, 0x24);
    /// Dataset Management: the requested attributes conflict (same code as
    /// `CONNECT_INCOMPATIBLE_FORMAT`; which one applies depends on the command).
    CONFLICTING_ATTRIBUTES = (sct::COMMAND_SPECIFIC, 0x80);
    INVALID_PROTECTION_INFO = (sct::COMMAND_SPECIFIC, 0x81);
    WRITE_TO_READ_ONLY_RANGE = (sct::COMMAND_SPECIFIC, 0x82);
    /// Copy: more ranges than MSRC, a range longer than MSSRL or a copy
    /// longer than MCL (the same code as `CONNECT_RESTART_DISCOVERY`).
    COMMAND_SIZE_LIMIT_EXCEEDED = (sct::COMMAND_SPECIFIC, 0x83);
    /// Fabrics Connect: record format not supported.
    CONNECT_INCOMPATIBLE_FORMAT = (sct::COMMAND_SPECIFIC, 0x80);
    /// Fabrics Connect: the controller is busy (e.g. queue already connected).
    CONNECT_CONTROLLER_BUSY = (sct::COMMAND_SPECIFIC, 0x81);
    /// Fabrics Connect: a parameter is invalid (the `more`/dw0 carry which one).
    CONNECT_INVALID_PARAMETERS = (sct::COMMAND_SPECIFIC, 0x82);
    /// Fabrics Connect: the host should re-run discovery.
    CONNECT_RESTART_DISCOVERY = (sct::COMMAND_SPECIFIC, 0x83);
    /// Fabrics Connect: the host is not allowed to connect.
    CONNECT_INVALID_HOST = (sct::COMMAND_SPECIFIC, 0x84);
    INVALID_QUEUE_TYPE = (sct::COMMAND_SPECIFIC, 0x90);
    /// Fabrics: Discover Restart (the same code as `INVALID_QUEUE_TYPE`;
    /// which one applies depends on the command).
    DISCOVER_RESTART = (sct::COMMAND_SPECIFIC, 0x90);
    /// Fabrics: the queue must finish in-band authentication (DH-HMAC-CHAP)
    /// before this command (the Linux host's `NVME_SC_AUTH_REQUIRED` 0x191).
    AUTH_REQUIRED = (sct::COMMAND_SPECIFIC, 0x91);

    WRITE_FAULT = (sct::MEDIA, 0x80);
    UNRECOVERED_READ_ERROR = (sct::MEDIA, 0x81);
    GUARD_CHECK_ERROR = (sct::MEDIA, 0x82);
    APPTAG_CHECK_ERROR = (sct::MEDIA, 0x83);
    REFTAG_CHECK_ERROR = (sct::MEDIA, 0x84);
    COMPARE_FAILURE = (sct::MEDIA, 0x85);
    ACCESS_DENIED = (sct::MEDIA, 0x86);
    DEALLOCATED_OR_UNWRITTEN = (sct::MEDIA, 0x87);

    INTERNAL_PATH_ERROR = (sct::PATH, 0x00);
    ANA_PERSISTENT_LOSS = (sct::PATH, 0x01);
    ANA_INACCESSIBLE = (sct::PATH, 0x02);
    ANA_TRANSITION = (sct::PATH, 0x03);
    CONTROLLER_PATH_ERROR = (sct::PATH, 0x60);
    HOST_PATH_ERROR = (sct::PATH, 0x70);
    ABORTED_BY_HOST = (sct::PATH, 0x71);
}

impl Status {
    /// A status with the given type and code and no flags.
    pub const fn new(sct: u8, sc: u8) -> Status {
        Status {
            sct,
            sc,
            dnr: false,
            more: false,
        }
    }

    /// The same status with Do Not Retry set.
    pub const fn with_dnr(self) -> Status {
        Status { dnr: true, ..self }
    }

    /// The same status with More set.
    pub const fn with_more(self) -> Status {
        Status { more: true, ..self }
    }

    /// True for Successful Completion (flags are ignored).
    pub const fn is_success(&self) -> bool {
        self.sct == sct::GENERIC && self.sc == 0
    }

    /// Pack into the 16-bit status field of the CQE (dword 3 bits 31:16),
    /// with the phase tag (bit 0) left at zero.
    ///
    /// Layout: bit 0 phase, bits 8:1 SC, bits 11:9 SCT, bits 13:12 CRD,
    /// bit 14 More, bit 15 DNR.
    pub const fn to_field(&self) -> u16 {
        ((self.sc as u16) << 1)
            | (((self.sct & 0x7) as u16) << 9)
            | ((self.more as u16) << 14)
            | ((self.dnr as u16) << 15)
    }

    /// Unpack a 16-bit CQE status field (phase and CRD are ignored).
    pub const fn from_field(field: u16) -> Status {
        Status {
            sc: (field >> 1) as u8,
            sct: ((field >> 9) & 0x7) as u8,
            more: field & (1 << 14) != 0,
            dnr: field & (1 << 15) != 0,
        }
    }

    /// The name of this status as the NVMe specifications spell it.
    ///
    /// A few command specific codes mean different things for different
    /// commands (0x80..0x82 are Dataset Management / NVM errors for I/O commands
    /// and Connect errors for Fabrics Connect); those names list both meanings.
    pub fn name(&self) -> &'static str {
        match (self.sct, self.sc) {
            (sct::GENERIC, sc) => match sc {
                0x00 => "Successful Completion",
                0x01 => "Invalid Command Opcode",
                0x02 => "Invalid Field in Command",
                0x03 => "Command ID Conflict",
                0x04 => "Data Transfer Error",
                0x05 => "Commands Aborted due to Power Loss Notification",
                0x06 => "Internal Error",
                0x07 => "Command Abort Requested",
                0x08 => "Command Aborted due to SQ Deletion",
                0x09 => "Command Aborted due to Failed Fused Command",
                0x0a => "Command Aborted due to Missing Fused Command",
                0x0b => "Invalid Namespace or Format",
                0x0c => "Command Sequence Error",
                0x0d => "Invalid SGL Segment Descriptor",
                0x0e => "Invalid Number of SGL Descriptors",
                0x0f => "Data SGL Length Invalid",
                0x10 => "Metadata SGL Length Invalid",
                0x11 => "SGL Descriptor Type Invalid",
                0x12 => "Invalid Use of Controller Memory Buffer",
                0x13 => "PRP Offset Invalid",
                0x14 => "Atomic Write Unit Exceeded",
                0x15 => "Operation Denied",
                0x16 => "SGL Offset Invalid",
                0x18 => "Host Identifier Inconsistent Format",
                0x19 => "Keep Alive Timer Expired",
                0x1a => "Keep Alive Timeout Invalid",
                0x1b => "Command Aborted due to Preempt and Abort",
                0x1c => "Sanitize Failed",
                0x1d => "Sanitize In Progress",
                0x1e => "SGL Data Block Granularity Invalid",
                0x20 => "Namespace is Write Protected",
                0x21 => "Command Interrupted",
                0x22 => "Transient Transport Error",
                0x80 => "LBA Out of Range",
                0x81 => "Capacity Exceeded",
                0x82 => "Namespace Not Ready",
                0x83 => "Reservation Conflict",
                0x84 => "Format In Progress",
                _ => "Unknown Generic Status",
            },
            (sct::COMMAND_SPECIFIC, sc) => match sc {
                0x00 => "Completion Queue Invalid",
                0x01 => "Invalid Queue Identifier",
                0x02 => "Invalid Queue Size",
                0x03 => "Abort Command Limit Exceeded",
                0x05 => "Asynchronous Event Request Limit Exceeded",
                0x06 => "Invalid Firmware Slot",
                0x07 => "Invalid Firmware Image",
                0x08 => "Invalid Interrupt Vector",
                0x09 => "Invalid Log Page",
                0x0a => "Invalid Format",
                0x0c => "Invalid Queue Deletion",
                0x0d => "Feature Identifier Not Saveable",
                0x0e => "Feature Not Changeable",
                0x0f => "Feature Not Namespace Specific",
                0x18 => "Namespace Already Attached",
                0x19 => "Namespace Is Private",
                0x1a => "Namespace Not Attached",
                0x1f => "Invalid Controller Identifier",
                0x24 => "ANA Group Identifier Invalid",
                0x80 => "Conflicting Attributes / Incompatible Format",
                0x81 => "Invalid Protection Information / Controller Busy",
                0x82 => "Attempted Write to Read Only Range / Connect Invalid Parameters",
                0x83 => "Connect Restart Discovery",
                0x84 => "Connect Invalid Host",
                0x90 => "Invalid Queue Type / Discover Restart",
                0x91 => "Authentication Required",
                _ => "Unknown Command Specific Status",
            },
            (sct::MEDIA, sc) => match sc {
                0x80 => "Write Fault",
                0x81 => "Unrecovered Read Error",
                0x82 => "End-to-end Guard Check Error",
                0x83 => "End-to-end Application Tag Check Error",
                0x84 => "End-to-end Reference Tag Check Error",
                0x85 => "Compare Failure",
                0x86 => "Access Denied",
                0x87 => "Deallocated or Unwritten Logical Block",
                _ => "Unknown Media Error",
            },
            (sct::PATH, sc) => match sc {
                0x00 => "Internal Path Error",
                0x01 => "Asymmetric Access Persistent Loss",
                0x02 => "Asymmetric Access Inaccessible",
                0x03 => "Asymmetric Access Transition",
                0x60 => "Controller Pathing Error",
                0x70 => "Host Pathing Error",
                0x71 => "Command Aborted By Host",
                _ => "Unknown Path Related Status",
            },
            (sct::VENDOR, _) => "Vendor Specific Status",
            _ => "Unknown Status Code Type",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (sct {:#x}, sc {:#04x}",
            self.name(),
            self.sct,
            self.sc
        )?;
        if self.dnr {
            f.write_str(", dnr")?;
        }
        if self.more {
            f.write_str(", more")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_round_trip() {
        let s = Status::INVALID_FIELD.with_dnr();
        assert_eq!(s.to_field(), (0x02 << 1) | (1 << 15));
        assert_eq!(Status::from_field(s.to_field()), s);
        let s = Status::CONNECT_INVALID_HOST.with_more();
        assert_eq!(s.to_field(), (0x84 << 1) | (1 << 9) | (1 << 14));
        assert_eq!(Status::from_field(s.to_field() | 1), s, "phase ignored");
        for sct in 0..8u8 {
            for sc in 0..=255u8 {
                for (dnr, more) in [(false, false), (true, false), (false, true), (true, true)] {
                    let s = Status { sct, sc, dnr, more };
                    assert_eq!(Status::from_field(s.to_field()), s);
                    assert_eq!(s.to_field() & 1, 0);
                }
            }
        }
    }

    #[test]
    fn every_constant_has_a_spec_name() {
        assert!(Status::ALL.len() > 70);
        for (rust_name, s) in Status::ALL {
            let n = s.name();
            assert!(!n.starts_with("Unknown"), "{rust_name} has no name");
            assert!(!n.is_empty());
        }
    }

    #[test]
    fn names() {
        assert_eq!(Status::SUCCESS.name(), "Successful Completion");
        assert_eq!(Status::INVALID_FIELD.name(), "Invalid Field in Command");
        assert_eq!(Status::LBA_OUT_OF_RANGE.name(), "LBA Out of Range");
        assert_eq!(Status::CONNECT_INVALID_HOST.name(), "Connect Invalid Host");
        assert_eq!(Status::WRITE_FAULT.name(), "Write Fault");
        assert_eq!(
            Status::TRANSIENT_TRANSPORT_ERROR.name(),
            "Transient Transport Error"
        );
        assert!(Status::SUCCESS.is_success());
        assert!(!Status::INVALID_OPCODE.is_success());
        let shown = Status::INVALID_OPCODE.with_dnr().to_string();
        assert!(shown.starts_with("Invalid Command Opcode"), "{shown}");
    }
}
