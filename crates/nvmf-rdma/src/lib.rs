//! nvmf-rdma: the NVMe/RDMA transport.
//!
//! | file | owns |
//! |---|---|
//! | `queue.rs` | [`RdmaQueue`]: one NVMe/RDMA queue as a sans-I/O state machine over the core's request engine (capsules from RECVs, RDMA READ / WRITE / SEND work requests out) |

pub mod queue;

/// What NVMe/RDMA states about its capsules (each connection's
/// `PortInfo::caps`): host memory is reached through Keyed SGL Data Block
/// descriptors, one per command.
pub const CAPS: nvmf_core::TransportCaps = nvmf_core::TransportCaps {
    keyed_sgls: true,
    msdbd: 1,
};

pub use queue::{Local, RdmaQueue, RdmaQueueParams, Region, WorkCompletion, WorkRequest};
