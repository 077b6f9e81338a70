//! Fuzz DH-HMAC-CHAP: libFuzzer's bytes go to both authentication message
//! parsers and, as Authentication Send/Receive commands, through one queue
//! whose host must authenticate (`nvmf_fuzz::auth::run_auth_bytes`, which
//! panics when an invariant breaks).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = nvmf_fuzz::auth::run_auth_bytes(data);
});
