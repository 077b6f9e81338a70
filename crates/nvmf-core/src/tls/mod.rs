//! NVMe/TCP TLS 1.3 secure channel: the parts that need no TLS library. `psk.rs`: the PSK
//! interchange format, derivations and identities; `table.rs`: the running target's TLS state
//! (secure listen addresses, hosts' PSKs, the identity lookup the handshake calls); `binder.rs`:
//! TLS 1.3 PSK binders, to pick between keys that share an identity. The handshake
//! library and how it plugs into the transport are described in docs/TLS.md.

pub mod binder;
pub mod psk;
pub mod table;

pub use table::{load_tls, parse_identity, Identity, TlsTable};
