//! The request lifecycle every transport shares. `slots.rs`: per-command
//! slots, their states and data buffers against the target-wide budget;
//! `engine.rs`: [`RequestEngine`], which drives a queue's commands from
//! capsule to response through a transport's [`Fabric`] operations. A
//! transport (nvmf-tcp, the RDMA transport) owns only its wire: decoding,
//! moving data, sending responses.

mod engine;
mod slots;

pub use engine::{
    DataDesc, DataOut, Fabric, Fault, FaultKind, RequestEngine, RequestParams, RequestStats,
    SglKind,
};
pub use slots::{
    AlignedBuf, AllocError, BufBudget, BufPolicy, RequestState, Slot, Slots, Xfer, BUF_ALIGN,
};
