//! Kernel TLS set-up and its fallback on this machine's kernel (the checks live in
//! `examples/ktls_check.rs`, which the testbed guest also runs with a kernel that has the `tls`
//! module): here, without it, every session must fall back to OpenSSL's records with the reason
//! given, and still carry 1 MiB each way, close_notify and a KeyUpdate; where the module is there,
//! the sides that want kTLS get it.

#[path = "../examples/ktls_check.rs"]
mod ktls_check;

#[test]
fn ktls_or_its_fallback_carries_every_session() {
    let kernel = ktls_check::kernel_has_ktls();
    let fails = ktls_check::run_checks(kernel);
    assert!(
        fails.is_empty(),
        "kernel TLS ({kernel}) checks failed: {fails:#?}"
    );
}
