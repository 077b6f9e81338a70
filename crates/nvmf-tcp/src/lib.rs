//! nvmf-tcp: the NVMe/TCP transport as a sans-I/O state machine. A
//! [`Connection`] takes the bytes a socket delivered, decodes every complete
//! PDU in place, hands commands to the core's request engine (slots,
//! buffers, execution: `nvmf_core::request`) as its NVMe/TCP `Fabric`
//! (R2T/H2CData to fetch data, C2HData/CapsuleResp to respond), and queues
//! the response bytes for one vectored write.
//! The reactor in `nvmfd` owns the sockets; nothing here does I/O.
//!
//! | file | owns |
//! |---|---|
//! | `connection.rs` | [`Connection`]: receive buffer, decode loop, PDU handlers, termination |
//! | `icreq.rs` | ICReq checks and the ICResp |
//! | `txq.rs` | the send queue (bytes + slot data referenced in place; slots parked for zero-copy calls) |

mod connection;
mod icreq;
mod txq;
/// `MSG_ZEROCOPY` calls the kernel has not reported done (the shared
/// `nvmf-zerocopy` crate's tracker).
pub use nvmf_zerocopy::tracker as zerocopy;

/// What NVMe/TCP states about its capsules (each connection's
/// `PortInfo::caps`): data moves through the transport (C2HData, R2T +
/// H2CData) or in the capsule, one data descriptor per command.
pub const CAPS: nvmf_core::TransportCaps = nvmf_core::TransportCaps::MESSAGE_BASED;

pub use connection::{Connection, ConnectionStats, TcpParams, H2C_TIMEOUT, MAX_R2T_BYTES};
pub use icreq::Negotiated;
pub use nvmf_core::request::{BufBudget, BufPolicy, RequestState, Xfer};
pub use txq::SendKind;
