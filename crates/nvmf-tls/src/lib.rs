//! NVMe/TCP TLS 1.3 external-PSK handshake contexts over OpenSSL: a server context that looks the
//! client's PSK identity up and a client context (tests, `nvmf` host) that offers one identity.
//! Keys and identities come from `nvmf_core::tls::psk`; docs/TLS.md says why OpenSSL. The TLS 1.3
//! PSK session callbacks (`SSL_CTX_set_psk_find_session_callback` / `..._use_session_callback`) are
//! not wrapped by the `openssl` crate, so the few declarations they need live in `ffi` below; they
//! let the PSK's hash pick the cipher suite (SHA-256 → AES-128-GCM, SHA-384 → AES-256-GCM); on the
//! server the hash the client binds the PSK with wins (a client-hello callback reads it: the Linux
//! host binds SHA-384 keys with SHA-256, which ends in ChaCha20-Poly1305; docs/TLS.md). When an
//! identity has two candidate keys (SPDK's and the Linux host's HKDF label encodings give the same
//! version-0 identity), a message callback keeps the ClientHello and the find-session callback
//! hands OpenSSL the key whose binder verifies (`nvmf_core::tls::binder`).

pub mod ktls;
pub mod stream;

pub use ktls::{Ktls, Offload};
pub use stream::{accept, connect, FdIo, Handshake, ServerHandshake, TlsStream};

use foreign_types::ForeignTypeRef;
use nvmf_core::tls::binder;
use nvmf_core::tls::psk::{PskHash, TlsPsk};
use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslRef, SslVersion};
use std::os::raw::{c_int, c_uchar};
use std::sync::OnceLock;

/// Why a context could not be built.
#[derive(Debug, thiserror::Error)]
#[error("OpenSSL: {0}")]
pub struct TlsError(#[from] openssl::error::ErrorStack);

/// Cipher suites offered (the PSK's hash decides which one a handshake uses).
pub const SUITES: &str = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";

pub(crate) mod ffi {
    use openssl_sys::{EVP_MD, SSL, SSL_CIPHER, SSL_CTX, SSL_SESSION};
    use std::os::raw::{c_int, c_uchar};
    pub type FindCb =
        unsafe extern "C" fn(*mut SSL, *const c_uchar, usize, *mut *mut SSL_SESSION) -> c_int;
    pub type UseCb = unsafe extern "C" fn(
        *mut SSL,
        *const EVP_MD,
        *mut *const c_uchar,
        *mut usize,
        *mut *mut SSL_SESSION,
    ) -> c_int;
    extern "C" {
        pub fn SSL_CTX_set_psk_find_session_callback(ctx: *mut SSL_CTX, cb: Option<FindCb>);
        pub fn SSL_CTX_set_psk_use_session_callback(ctx: *mut SSL_CTX, cb: Option<UseCb>);
        pub fn SSL_SESSION_new() -> *mut SSL_SESSION;
        pub fn SSL_SESSION_free(s: *mut SSL_SESSION);
        pub fn SSL_SESSION_set1_master_key(
            s: *mut SSL_SESSION,
            k: *const c_uchar,
            l: usize,
        ) -> c_int;
        pub fn SSL_SESSION_set_cipher(s: *mut SSL_SESSION, c: *const SSL_CIPHER) -> c_int;
        pub fn SSL_SESSION_set_protocol_version(s: *mut SSL_SESSION, v: c_int) -> c_int;
        pub fn SSL_CIPHER_find(ssl: *mut SSL, id: *const c_uchar) -> *const SSL_CIPHER;
        pub fn SSL_has_pending(ssl: *const SSL) -> c_int;
        pub fn SSL_set_read_ahead(ssl: *mut SSL, yes: c_int);
        pub fn SSL_key_update(ssl: *mut SSL, updatetype: c_int) -> c_int;
        pub fn SSL_CTX_set_msg_callback(ctx: *mut SSL_CTX, cb: Option<MsgCb>);
    }
    pub type MsgCb = unsafe extern "C" fn(
        write_p: c_int,
        version: c_int,
        content_type: c_int,
        buf: *const std::ffi::c_void,
        len: usize,
        ssl: *mut SSL,
        arg: *mut std::ffi::c_void,
    );
}

type Lookup = Box<dyn Fn(&str) -> Vec<TlsPsk> + Send + Sync>;

fn lookup_index() -> Index<SslContext, Lookup> {
    static I: OnceLock<Index<SslContext, Lookup>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("OpenSSL ex_data index"))
}
/// The PSK identity a server handshake accepted (set by the find-session callback).
pub(crate) fn identity_index() -> Index<Ssl, String> {
    static I: OnceLock<Index<Ssl, String>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}
/// How the accepted PSK was derived (`PskLabels::name`; set by the find-session callback).
pub(crate) fn labels_index() -> Index<Ssl, &'static str> {
    static I: OnceLock<Index<Ssl, &'static str>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}
/// The ClientHello(s) received and the HelloRetryRequest sent, as the message callback saw them
/// (at most three: what a binder's transcript covers).
fn hellos_index() -> Index<Ssl, Vec<Vec<u8>>> {
    static I: OnceLock<Index<Ssl, Vec<Vec<u8>>>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}
/// Frees the ClientHello copies once the handshake is over (a connection lives long).
pub(crate) fn forget_hellos(ssl: &SslRef) {
    if ssl.ex_data(hellos_index()).is_some() {
        // SAFETY: the SSL outlives this call, and nothing else borrows its ex_data now.
        let ssl = unsafe { SslRef::from_ptr_mut(ssl.as_ptr()) };
        ssl.set_ex_data(hellos_index(), Vec::new());
    }
}
fn client_index() -> Index<SslContext, TlsPsk> {
    static I: OnceLock<Index<SslContext, TlsPsk>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("OpenSSL ex_data index"))
}

/// An `SSL_SESSION` carrying `psk` for TLS 1.3 with a suite of `hash` (normally the PSK's own; see
/// `binder_hash_cb`); null on failure.
unsafe fn psk_session(
    ssl: *mut openssl_sys::SSL,
    psk: &TlsPsk,
    hash: PskHash,
) -> *mut openssl_sys::SSL_SESSION {
    let id: [c_uchar; 2] = match hash {
        PskHash::Sha256 => [0x13, 0x01],
        PskHash::Sha384 => [0x13, 0x02],
    };
    let cipher = ffi::SSL_CIPHER_find(ssl, id.as_ptr());
    if cipher.is_null() {
        return std::ptr::null_mut();
    }
    let s = ffi::SSL_SESSION_new();
    if s.is_null() {
        return s;
    }
    if ffi::SSL_SESSION_set1_master_key(s, psk.key.as_ptr(), psk.key.len()) != 1
        || ffi::SSL_SESSION_set_cipher(s, cipher) != 1
        || ffi::SSL_SESSION_set_protocol_version(s, 0x0304) != 1
    {
        ffi::SSL_SESSION_free(s);
        return std::ptr::null_mut();
    }
    s
}

unsafe extern "C" fn find_cb(
    ssl: *mut openssl_sys::SSL,
    id: *const c_uchar,
    id_len: usize,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> c_int {
    *sess = std::ptr::null_mut(); // unknown identity: no session, the handshake is refused
    let ssl_ref = SslRef::from_ptr_mut(ssl);
    let Some(lookup) = ssl_ref.ssl_context().ex_data(lookup_index()) else {
        return 0;
    };
    let Ok(identity) = std::str::from_utf8(std::slice::from_raw_parts(id, id_len)) else {
        return 1;
    };
    let candidates = lookup(identity);
    let psk = match candidates.len() {
        0 => None,
        1 => candidates.first(),
        // One identity, several keys: the one the client's binder was made with, else the
        // first (the handshake then fails: "binder does not verify", as for a wrong key).
        _ => {
            let hellos: Vec<&[u8]> = ssl_ref
                .ex_data(hellos_index())
                .map(|v| v.iter().map(Vec::as_slice).collect())
                .unwrap_or_default();
            binder::pick(&candidates, identity, &hellos).or(candidates.first())
        }
    };
    if let Some(psk) = psk {
        let hash = ssl_ref
            .ex_data(binder_hash_index())
            .copied()
            .unwrap_or(psk.hash);
        let s = psk_session(ssl, psk, hash);
        if s.is_null() {
            return 0;
        }
        ssl_ref.set_ex_data(identity_index(), identity.to_string());
        ssl_ref.set_ex_data(labels_index(), psk.labels.name());
        *sess = s;
    }
    1
}

/// Message callback (server): keeps the handshake messages a PSK binder covers: each
/// ClientHello received and a ServerHello (HelloRetryRequest) sent before the second one.
unsafe extern "C" fn msg_cb(
    write_p: c_int,
    _version: c_int,
    content_type: c_int,
    buf: *const std::ffi::c_void,
    len: usize,
    ssl: *mut openssl_sys::SSL,
    _arg: *mut std::ffi::c_void,
) {
    // 22 = handshake; OpenSSL hands over whole messages, 4-byte header included.
    if content_type != 22 || buf.is_null() || len < 4 {
        return;
    }
    let msg = std::slice::from_raw_parts(buf as *const u8, len);
    let wanted = matches!(
        (write_p, msg[0]),
        (0, binder::CLIENT_HELLO) | (1, binder::SERVER_HELLO)
    );
    if !wanted {
        return;
    }
    let ssl_ref = SslRef::from_ptr_mut(ssl);
    match ssl_ref.ex_data_mut(hellos_index()) {
        Some(v) if v.len() < 3 => v.push(msg.to_vec()),
        Some(_) => {}
        None if msg[0] == binder::CLIENT_HELLO => {
            ssl_ref.set_ex_data(hellos_index(), vec![msg.to_vec()]);
        }
        None => {}
    }
}

unsafe extern "C" fn use_cb(
    ssl: *mut openssl_sys::SSL,
    _md: *const openssl_sys::EVP_MD,
    id: *mut *const c_uchar,
    id_len: *mut usize,
    sess: *mut *mut openssl_sys::SSL_SESSION,
) -> c_int {
    let ssl_ref = SslRef::from_ptr(ssl);
    let Some(psk) = ssl_ref.ssl_context().ex_data(client_index()) else {
        return 0;
    };
    let s = psk_session(ssl, psk, psk.hash);
    if s.is_null() {
        return 0;
    }
    *id = psk.identity.as_ptr();
    *id_len = psk.identity.len();
    *sess = s;
    1
}

/// The hash of the PSK binder the client sent (server side, set by `binder_hash_cb`).
fn binder_hash_index() -> Index<Ssl, PskHash> {
    static I: OnceLock<Index<Ssl, PskHash>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}

/// Length of the first binder in a ClientHello `pre_shared_key` extension body
/// (`identities<..>` then `binders<..>`, each binder u8-length-prefixed); None if malformed.
fn first_binder_len(ext: &[u8]) -> Option<usize> {
    let ids = u16::from_be_bytes([*ext.first()?, *ext.get(1)?]) as usize;
    let binders = ext.get(2 + ids..)?;
    binders.get(2).map(|&n| n as usize)
}

/// Client-hello callback: the Linux host (tlshd/GnuTLS) computes the binder of a SHA-384 (`R02`)
/// PSK with SHA-256 and offers TLS_AES_256_GCM_SHA384 and TLS_CHACHA20_POLY1305_SHA256. TLS 1.3
/// ties a PSK to one hash, so the session must follow the binder's hash, not the identity's:
/// a 32-byte binder → a SHA-256 session and the SHA-256 suites (AES-128-GCM, or ChaCha20-Poly1305,
/// the only one such a host offers), a 48-byte binder → SHA-384 and AES-256-GCM. docs/TLS.md.
fn binder_hash_cb(
    ssl: &mut SslRef,
    _alert: &mut openssl::ssl::SslAlert,
) -> Result<openssl::ssl::ClientHelloResponse, openssl::error::ErrorStack> {
    let mut p: *const c_uchar = std::ptr::null();
    let mut len = 0usize;
    // SAFETY: called inside the client-hello callback, where the extension data (owned by the SSL)
    // stays valid for the callback's duration; 41 = pre_shared_key.
    let ext = unsafe {
        if openssl_sys::SSL_client_hello_get0_ext(ssl.as_ptr(), 41, &mut p, &mut len) == 1
            && !p.is_null()
        {
            Some(std::slice::from_raw_parts(p, len))
        } else {
            None
        }
    };
    match ext.and_then(first_binder_len) {
        Some(32) => {
            ssl.set_ciphersuites("TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256")?;
            ssl.set_ex_data(binder_hash_index(), PskHash::Sha256);
        }
        Some(48) => {
            ssl.set_ciphersuites("TLS_AES_256_GCM_SHA384")?;
            ssl.set_ex_data(binder_hash_index(), PskHash::Sha384);
        }
        _ => {}
    }
    Ok(openssl::ssl::ClientHelloResponse::SUCCESS)
}

fn base(method: SslMethod) -> Result<SslContextBuilder, TlsError> {
    let mut b = SslContext::builder(method)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites(SUITES)?;
    // Key exchange (psk_dhe_ke) only with cheap elliptic groups: a handshake runs on a reactor, and
    // a finite-field group (ffdhe8192) would cost it milliseconds per connection attempt.
    b.set_groups_list("X25519:P-256:P-384")?;
    // EOF without close_notify reads as a close, as a clear-text EOF does.
    b.set_options(SslOptions::IGNORE_UNEXPECTED_EOF);
    Ok(b)
}

/// Server context: `lookup(identity)` returns the TLS PSKs a known identity may use (more than one
/// when HKDF label encodings differ: the client's binder picks), none refuses it. With `ktls`
/// Auto, established sessions go to the kernel's TLS where it takes them ([`ktls`]).
pub fn server_context<F>(lookup: F, ktls: Ktls) -> Result<SslContext, TlsError>
where
    F: Fn(&str) -> Vec<TlsPsk> + Send + Sync + 'static,
{
    let mut b = base(SslMethod::tls_server())?;
    // Read whole socket buffers, not one record header and body at a time (two syscalls per
    // record). Safe for the reactor: it reads until WouldBlock, and OpenSSL only says
    // WouldBlock when what it holds is no complete record.
    b.set_read_ahead(true);
    // No NewSessionTicket after the handshake (OpenSSL sends two by default): the Linux host hands
    // the socket to kTLS right after tlshd's handshake and fails the queue on any post-handshake
    // handshake record ("nvme_tcp: queue 0: unhandled TLS record 22"); NVMe/TCP has no resumption.
    b.set_num_tickets(0)?;
    b.set_client_hello_callback(binder_hash_cb);
    ktls::want(&mut b, ktls);
    b.set_ex_data(lookup_index(), Box::new(lookup) as Lookup);
    // SAFETY: the callback only reads the context's ex_data set above, which lives as long as the context.
    unsafe { ffi::SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_cb)) };
    // SAFETY: the callback only touches the SSL's own ex_data.
    unsafe { ffi::SSL_CTX_set_msg_callback(b.as_ptr(), Some(msg_cb)) };
    Ok(b.build())
}

/// Client context offering one PSK identity; `ktls` as for [`server_context`].
pub fn client_context(psk: TlsPsk, ktls: Ktls) -> Result<SslContext, TlsError> {
    let mut b = base(SslMethod::tls_client())?;
    // Offer only the suite of the PSK's hash: OpenSSL's server picks the suite before it looks the
    // PSK up, and ignores a PSK whose hash differs from the suite's.
    b.set_ciphersuites(psk.hash.cipher_suite())?;
    // Whole socket buffers per read (not a header and a body syscall per record); callers that
    // sleep in poll(2) check `TlsStream::has_buffered` first.
    b.set_read_ahead(true);
    b.set_ex_data(client_index(), psk);
    ktls::want(&mut b, ktls);
    // SAFETY: as above; the identity pointer handed to OpenSSL points into the context's ex_data.
    unsafe { ffi::SSL_CTX_set_psk_use_session_callback(b.as_ptr(), Some(use_cb)) };
    Ok(b.build())
}

#[cfg(test)]
mod binder_tests {
    use super::first_binder_len;

    #[test]
    fn first_binder_length_of_a_pre_shared_key_extension() {
        // identities: one 3-byte identity + 4-byte age; binders: one 32-byte binder
        let mut ext = vec![0, 9, 0, 3, b'a', b'b', b'c', 0, 0, 0, 0, 0, 33, 32];
        ext.extend_from_slice(&[7u8; 32]);
        assert_eq!(first_binder_len(&ext), Some(32));
        ext[13] = 48;
        assert_eq!(first_binder_len(&ext), Some(48));
        assert_eq!(first_binder_len(&ext[..12]), None);
        assert_eq!(first_binder_len(&[0xff, 0xff, 1]), None);
        assert_eq!(first_binder_len(&[]), None);
    }
}
