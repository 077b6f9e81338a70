//! nvmf-wire: the byte layouts of NVMe, NVMe over Fabrics and NVMe/TCP.
//!
//! This crate only describes bytes: submission and completion queue entries,
//! status codes, opcodes, Identify and log pages, Fabrics commands, the
//! NVMe/TCP PDUs with a zero-copy decoder and appending encoders, the
//! NVMe/RDMA connection private data, keyed SGLs and TSAS, plus the CRC32C
//! digests. It performs no I/O and the decoder never allocates.
//!
//! All multi-byte wire fields are little-endian (`zerocopy::little_endian`
//! types, read with `.get()`, written with `.set()`), and every on-wire
//! struct can be viewed in place over a byte buffer with zerocopy
//! (`T::ref_from_bytes(buf)`, `t.as_bytes()`).

pub mod auth;
pub mod command;
pub mod completion;
pub mod digest;
pub mod fabrics;
pub mod identify;
pub mod log;
pub mod opcode;
pub mod pdu;
pub mod rdma;
pub mod status;

pub use command::{Command, DataDirection, SglDescriptor};
pub use completion::Completion;
pub use opcode::{AdminOpcode, FabricsType, FeatureId, IoOpcode, LogPageId, UnknownValue};
pub use pdu::{DecodeOpts, Decoded, EncodeOpts, Pdu, PduError, PduType, Role};
pub use status::Status;

/// Re-exported so users of this crate can name the zerocopy traits and
/// little-endian types without depending on zerocopy themselves.
pub use zerocopy;
