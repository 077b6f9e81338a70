//! nvmf-rdma: the NVMe/RDMA transport.
//!
//! | file | owns |
//! |---|---|
//! | `queue.rs` | [`RdmaQueue`]: one NVMe/RDMA queue as a sans-I/O state machine over the core's request engine (capsules from RECVs, RDMA READ / WRITE / SEND work requests out) |

pub mod queue;

pub use queue::{Local, RdmaQueue, RdmaQueueParams, Region, WorkCompletion, WorkRequest};
