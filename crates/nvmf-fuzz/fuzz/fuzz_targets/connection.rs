//! Fuzz whole NVMe/TCP connections: libFuzzer's bytes decode (through
//! `arbitrary`) into a host session over up to four connections, played
//! against an in-process target by `nvmf_fuzz::run_bytes`, which panics
//! when an invariant breaks (see crates/nvmf-fuzz/src/harness.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = nvmf_fuzz::run_bytes(data);
});
