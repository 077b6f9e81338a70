//! RDMA verbs (libibverbs) for one connection's data path, one file each:
//! [`device`] (the device, its limits and asynchronous events, the protection domain shared by
//! every connection on it), [`memory`] (registrations of caller-owned buffers, memory
//! windows), [`cq`] (completion queues with their completion channel, completions) and [`qp`]
//! (the RC queue pair on a [`CmId`](crate::CmId), work requests posted in batches, shared
//! receive queues).
//!
//! A reactor's completion loop: [`CompletionQueue::arm`] once, then on each readable fd
//! [`CompletionQueue::drain_events`], [`CompletionQueue::poll`] until it returns 0,
//! [`CompletionQueue::arm`], and [`CompletionQueue::poll`] once more (a completion that landed
//! between the last poll and the arm raises no event).

pub mod cq;
pub mod device;
pub mod memory;
pub mod qp;

pub use cq::{Completion, CompletionQueue, WcOpcode};
pub use device::{AsyncEvent, AsyncEventKind, Device, DeviceLimits, ProtectionDomain};
pub use memory::{next_rkey, Access, MemoryRegion, MemoryWindow};
pub(crate) use qp::QpResources;
pub use qp::{PostError, QpCaps, RecvWr, SendOp, SendWr, Sge, SharedReceiveQueue};
