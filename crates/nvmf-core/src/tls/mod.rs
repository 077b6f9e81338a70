//! NVMe/TCP TLS 1.3 secure channel: the parts that need no TLS library (keys, derivation, identities).
//! The handshake library and how it plugs into the transport are described in docs/TLS.md.

pub mod psk;
