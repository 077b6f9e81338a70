//! NVMe/TCP TLS 1.3 external-PSK handshake contexts over OpenSSL: a server context that looks the
//! client's PSK identity up and a client context (tests, `nvmf` host) that offers one identity.
//! Keys and identities come from `nvmf_core::tls::psk`; docs/TLS.md says why OpenSSL and what is left
//! (TLS_AES_256_GCM_SHA384 needs the find-session callback, not wrapped by the `openssl` crate yet).

use nvmf_core::tls::psk::TlsPsk;
use openssl::ssl::{SslContext, SslContextBuilder, SslMethod, SslVersion};

/// Why a context could not be built.
#[derive(Debug, thiserror::Error)]
#[error("OpenSSL: {0}")]
pub struct TlsError(#[from] openssl::error::ErrorStack);

/// Cipher suite this layer offers today (SHA-256 PSKs).
pub const SUITES: &str = "TLS_AES_128_GCM_SHA256";

fn base(method: SslMethod) -> Result<SslContextBuilder, TlsError> {
    let mut b = SslContext::builder(method)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites(SUITES)?;
    Ok(b)
}

/// Server context: `lookup(identity)` returns the TLS PSK for a known identity, None refuses it.
pub fn server_context<F>(lookup: F) -> Result<SslContext, TlsError>
where
    F: Fn(&str) -> Option<TlsPsk> + Send + Sync + 'static,
{
    let mut b = base(SslMethod::tls_server())?;
    b.set_psk_server_callback(move |_ssl, identity, out| {
        let found = identity
            .and_then(|id| std::str::from_utf8(id).ok())
            .and_then(&lookup);
        match found {
            Some(psk) if psk.key.len() <= out.len() => {
                out[..psk.key.len()].copy_from_slice(&psk.key);
                Ok(psk.key.len())
            }
            _ => Ok(0), // unknown identity: handshake refused
        }
    });
    Ok(b.build())
}

/// Client context offering one PSK identity.
pub fn client_context(psk: TlsPsk) -> Result<SslContext, TlsError> {
    let mut b = base(SslMethod::tls_client())?;
    b.set_psk_client_callback(move |_ssl, _hint, id_out, key_out| {
        let id = psk.identity.as_bytes();
        if id.len() + 1 > id_out.len() || psk.key.len() > key_out.len() {
            return Ok(0);
        }
        id_out[..id.len()].copy_from_slice(id);
        id_out[id.len()] = 0;
        key_out[..psk.key.len()].copy_from_slice(&psk.key);
        Ok(psk.key.len())
    });
    Ok(b.build())
}
