//! The server follows the hash the client binds its PSK with, not the identity's: the Linux host
//! (tlshd/GnuTLS) binds SHA-384 (`NVMe1R02`) keys with SHA-256 (docs/TLS.md, "the Linux host and
//! SHA-384 keys"). Our client is made to do the same here: same identity and 48 key bytes, SHA-256
//! binder and suite; the handshake must complete with a SHA-256 suite.

use nvmf_core::tls::psk::{ConfiguredPsk, PskHash, TlsPsk};
use openssl::ssl::Ssl;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

const KEY384: &str =
    "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6f1b1f3c-0c52-4c6e-9d1e-6e7666d00384";
const SUB: &str = "nqn.2016-06.io.nvmfd:tls";

/// One handshake and a 4-byte echo; Ok((client cipher, server cipher)) or the first error.
fn handshake(server_psk: TlsPsk, client_psk: TlsPsk) -> Result<(String, String), String> {
    let ctx = nvmf_tls::server_context(
        move |id| {
            (id == server_psk.identity)
                .then(|| server_psk.clone())
                .into_iter()
                .collect()
        },
        nvmf_tls::Ktls::Off,
    )
    .map_err(|e| e.to_string())?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = std::thread::spawn(move || -> Result<String, String> {
        let (sock, _) = listener.accept().map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let mut s = Ssl::new(&ctx)
            .map_err(|e| e.to_string())?
            .accept(sock)
            .map_err(|e| format!("server: {e}"))?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
        s.write_all(&buf).map_err(|e| e.to_string())?;
        Ok(s.ssl()
            .current_cipher()
            .map(|c| c.name())
            .unwrap_or("?")
            .to_string())
    });
    let cctx =
        nvmf_tls::client_context(client_psk, nvmf_tls::Ktls::Off).map_err(|e| e.to_string())?;
    let sock = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let client = (|| -> Result<String, String> {
        let mut c = Ssl::new(&cctx)
            .map_err(|e| e.to_string())?
            .connect(sock)
            .map_err(|e| format!("client: {e}"))?;
        c.write_all(b"ping").map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).map_err(|e| e.to_string())?;
        if &buf != b"ping" {
            return Err(format!("echo {buf:?}"));
        }
        Ok(c.ssl()
            .current_cipher()
            .map(|c| c.name())
            .unwrap_or("?")
            .to_string())
    })();
    let server = server
        .join()
        .map_err(|_| "server thread panicked".to_string())?;
    Ok((client?, server?))
}

#[test]
fn sha384_key_bound_with_sha256_completes_with_a_sha256_suite() {
    let k = ConfiguredPsk::parse(KEY384).unwrap();
    let server_psk = k.tls_psk_v1(HOST, SUB).unwrap();
    assert_eq!(server_psk.hash, PskHash::Sha384);
    // what tlshd does: the same identity and key bytes, SHA-256 binder and suite
    let linux_like = TlsPsk {
        hash: PskHash::Sha256,
        ..server_psk.clone()
    };
    let (c, s) = handshake(server_psk.clone(), linux_like).expect("handshake");
    assert_eq!(
        (c.as_str(), s.as_str()),
        ("TLS_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256")
    );
    // a client that binds with SHA-384 still gets AES-256
    let (c, _) = handshake(server_psk.clone(), server_psk).expect("handshake");
    assert_eq!(c, "TLS_AES_256_GCM_SHA384");
}
