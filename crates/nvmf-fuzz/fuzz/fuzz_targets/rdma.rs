//! Fuzz one NVMe/RDMA queue at a time (up to three, with an optional
//! shared receive queue): libFuzzer's bytes decode (through `arbitrary`)
//! into a session of connect requests, capsules, device completions in any
//! order, flushes and disconnects, played by
//! `nvmf_fuzz::rdma::run_rdma_bytes`, which panics when an invariant breaks
//! (see crates/nvmf-fuzz/src/rdma.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = nvmf_fuzz::rdma::run_rdma_bytes(data);
});
