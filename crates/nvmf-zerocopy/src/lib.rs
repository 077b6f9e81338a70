//! Zero-copy sends (`MSG_ZEROCOPY`) for both ends of NVMe/TCP: the target's
//! C2HData (nvmf-tcp's send queue, nvmfd's reactor) and the host's H2CData
//! (nvmf-host's transport).
//!
//! | file | owns |
//! |---|---|
//! | `tracker.rs` | which calls the kernel has reported done ([`ZcTracker`]) |
//! | `socket.rs` | `SO_ZEROCOPY`, the send call, the error-queue reports |

pub mod socket;
pub mod tracker;

pub use socket::{drain, enable, send, SendKind};
pub use tracker::{ZcTracker, COPIED_TO_STOP, MAX_OUTSTANDING};
