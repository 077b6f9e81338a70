//! Gateway groups on Ceph (issue 25, docs/GATEWAY-GROUPS.md): several
//! nvmfd gateways serving the same RBD images, each ANA group owned by one
//! live member, taken over with fencing when its owner's lease expires.
//!
//! `doc` is the shared record in RADOS, `plan` the rules (pure), `member`
//! the thread that renews the lease and acts.

pub mod doc;
pub mod member;
pub mod plan;
pub mod resv;
pub mod shared;

pub use member::{GroupOptions, Handle};
