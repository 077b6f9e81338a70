//! nvmf-core: the transport-agnostic NVMe over Fabrics target.
//!
//! A [`Target`] is built once from `nvmf_config::TargetConfig` and shared by
//! every reactor thread. Each transport connection gets a [`QueuePair`]; the
//! transport hands it decoded commands with their data ([`QueuePair::execute`])
//! and polls it for late completions and for whether to close
//! ([`QueuePair::poll`]).
//!
//! | file | owns |
//! |---|---|
//! | `target.rs` | [`Target`], runtime namespace changes |
//! | `transport.rs` | the core side of the transport seam: [`TransportLimits`] by transport type, [`TransportCaps`] |
//! | `subsystem.rs` | [`Subsystem`]: NQN, hosts, listeners, namespace table, controller IDs |
//! | `namespace.rs` | [`Namespace`], [`NamespaceTable`] snapshot |
//! | `visibility.rs` | per-host namespace visibility (`no_auto_visible`): rules and per-host table views |
//! | `controller.rs` | [`Controller`]: registers, features, events, keep-alive value, stats |
//! | `queue.rs` | [`QueuePair`], [`PortInfo`], [`Exec`], [`QueueState`] |
//! | `request/` | the request lifecycle all transports share: slots, data buffers and their budget, [`request::RequestEngine`] and the transport operations it calls ([`request::Fabric`]) |
//! | `fabrics.rs` | Connect, Property Get/Set |
//! | `auth/` | DH-HMAC-CHAP: secrets, responses, FFDHE, policy, per-queue authentication state machine |
//! | `admin.rs` | admin dispatch, features, AER, Keep Alive, Abort |
//! | `identify.rs` | Identify pages |
//! | `logpage.rs` | Get Log Page |
//! | `discovery.rs` | discovery log page |
//! | `io.rs` | Read, Write, Flush, Write Zeroes, Dataset Management, Compare, Verify, Copy |
//! | `fused.rs` | fused Compare and Write: the per-bdev write gate, the compare-and-write op, FUSES/ACWU |
//! | `reservation.rs` | reservations: state, access rule, Register/Acquire/Release/Report, PTPL file |
//! | `backend` | re-export of the `nvmf-backend` crate: [`Backend`] trait, backends, sinks, parked buffers |
//! | `error.rs` | [`CoreError`], status helpers |

pub mod admin;
pub mod ana;
pub mod auth;
/// The block backends live in their own crate (`nvmf-backend`).
pub use nvmf_backend as backend;
pub mod controller;
pub mod discovery;
pub mod error;
pub mod fabrics;
pub mod fused;
pub mod identify;
pub mod io;
pub mod logpage;
pub mod namespace;
pub mod qos;
pub mod queue;
pub mod request;
pub mod reservation;
pub mod stats;
pub mod subsystem;
pub mod target;
pub mod tls;
pub mod transport;
pub mod visibility;

pub use backend::{Backend, BlockOp, CompletionSink, IoTag, MallocBackend, NullBackend, Submitted};
pub use controller::{CloseReason, Controller, QueueStats};
pub use error::CoreError;
pub use namespace::{Namespace, NamespaceState, NamespaceTable};
pub use queue::{Exec, PortInfo, QueuePair, QueueState};
pub use subsystem::{Subsystem, SubsystemKind};
pub use target::{HostLimits, HostUsage, LimitHit, LimitHits, SizeChange, Target};
pub use transport::{TransportCaps, TransportLimits};
pub use visibility::NsVisibility;
