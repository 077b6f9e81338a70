//! nvmf-fuzz: fuzz harnesses for the target: whole NVMe/TCP connections
//! (below), DH-HMAC-CHAP ([`auth`]) and NVMe/RDMA queues ([`rdma`]).
//! Structured inputs ([`Input`]: host actions over up to [`MAX_CONNS`]
//! connections) are played against real `nvmf_tcp::Connection`s of an
//! in-process `nvmf_core::Target` (a subsystem with a RAM and a null
//! namespace, allow any host, plus discovery), and the invariants a hostile
//! host must not break are asserted (see [`harness`]).
//!
//! Used by the cargo-fuzz targets in `fuzz/` (nightly, libFuzzer) and by the
//! stable replay tests in `tests/` (corpus + PRNG inputs).
//!
//! | file | owns |
//! |---|---|
//! | `input.rs` | the `Arbitrary` input types (what a case can do) |
//! | `harness.rs` | the target, the fake host, playing a case, the invariants |
//! | `shadow.rs` | the data-integrity model of the RAM namespace |
//! | `seeds.rs` | an encoder for hand-made inputs, and the seed sessions |
//! | `auth.rs` | DH-HMAC-CHAP messages: parsers and one queue's authentication ([`auth::run_auth_bytes`]) |
//! | `rdma.rs` | NVMe/RDMA queues: its input types, the harness as host and device of `nvmf_rdma::RdmaQueue`s, the invariants ([`rdma::run_rdma_bytes`]) |

pub mod auth;
pub mod harness;
pub mod input;
pub mod rdma;
pub mod seeds;
pub mod shadow;

pub use harness::{run_input, target_config, Report};
pub use input::{Input, MAX_CONNS};

use arbitrary::{Arbitrary, Unstructured};

/// Decodes `bytes` into an [`Input`] (the same way for the fuzz target and
/// the replay test, so corpus files replay identically) and plays it.
/// Panics when an invariant breaks. `None` when the bytes do not decode.
pub fn run_bytes(bytes: &[u8]) -> Option<Report> {
    let input = Input::arbitrary_take_rest(Unstructured::new(bytes)).ok()?;
    Some(run_input(&input))
}
