//! Errors and status helpers.
//!
//! Owns [`CoreError`] (what building or changing a [`crate::Target`] can fail
//! with, on the control path) and the small helpers that turn wire statuses
//! into what the command handlers return. Nothing on the data path allocates
//! an error: command failures are plain [`nvmf_wire::status::Status`] values.

use nvmf_wire::status::Status;
use thiserror::Error;

/// A control-path failure: building the target from its configuration, or a
/// later change to it (adding or removing a namespace).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CoreError {
    /// A bdev could not be created.
    #[error("bdev {name}: {reason}")]
    Bdev { name: String, reason: String },
    /// Two bdevs share a name.
    #[error("bdev {0}: defined twice")]
    DuplicateBdev(String),
    /// Two subsystems share an NQN (or one uses the discovery NQN).
    #[error("subsystem {nqn}: {reason}")]
    Subsystem { nqn: String, reason: String },
    /// A namespace is invalid (bad NSID, unknown bdev, NSID in use).
    #[error("subsystem {nqn}: namespace {nsid}: {reason}")]
    Namespace {
        nqn: String,
        nsid: u32,
        reason: String,
    },
    /// No subsystem has this NQN.
    #[error("subsystem {0}: not found")]
    UnknownSubsystem(String),
}

/// Result of a command handler: the status plus completion dwords 0 and 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub status: Status,
    pub dw0: u32,
    pub dw1: u32,
}

impl Outcome {
    pub const fn ok() -> Outcome {
        Outcome {
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
        }
    }

    pub const fn ok_dw0(dw0: u32) -> Outcome {
        Outcome {
            status: Status::SUCCESS,
            dw0,
            dw1: 0,
        }
    }

    pub const fn err(status: Status) -> Outcome {
        Outcome {
            status,
            dw0: 0,
            dw1: 0,
        }
    }
}

impl From<Status> for Outcome {
    fn from(status: Status) -> Outcome {
        Outcome::err(status)
    }
}

/// Invalid Field in Command, Do Not Retry.
pub(crate) const INVALID_FIELD: Status = Status::INVALID_FIELD.with_dnr();
/// Invalid Command Opcode, Do Not Retry.
pub(crate) const INVALID_OPCODE: Status = Status::INVALID_OPCODE.with_dnr();
/// Invalid Namespace or Format, Do Not Retry.
pub(crate) const INVALID_NAMESPACE: Status = Status::INVALID_NAMESPACE.with_dnr();
/// Data SGL Length Invalid, Do Not Retry (what nvmet answers when the
/// transfer length does not match what the command describes).
pub(crate) const SGL_LENGTH_INVALID: Status = Status::SGL_DATA_LENGTH_INVALID.with_dnr();

/// Dword 0 of a Connect completion with status Connect Invalid Parameters or
/// Connect Invalid Host, as the Linux host and nvmet lay it out: bits 15:0
/// IPO (byte offset of the bad field), bit 16 IATTR (1 = the field is in the
/// Connect data, 0 = in the SQE).
// TODO(wire): nvmf_wire's `Completion::connect_invalid_param` packs IPO into
// bits 31:16 and IATTR into bit 0, which the Linux host would misreport; core
// builds dword 0 itself with this helper.
pub(crate) const fn connect_ipo_iattr(in_data: bool, offset: u16) -> u32 {
    ((in_data as u32) << 16) | offset as u32
}

impl From<nvmf_backend::BdevError> for CoreError {
    fn from(e: nvmf_backend::BdevError) -> CoreError {
        CoreError::Bdev {
            name: e.name,
            reason: e.reason,
        }
    }
}
