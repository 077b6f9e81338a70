//! One PSK identity, two keys: SPDK's host derives its TLS PSK with RFC 8446's HKDF labels, the
//! Linux host with libnvme's, and both offer the same version-0 identity. The server gets both
//! candidates from its lookup (libnvme's first, as nvmfd's table returns them) and must hand
//! OpenSSL the one the client's binder was made with: each client completes, a wrong key is
//! still refused, and so is the right identity with a third key. `openssl s_client` with a group
//! the server lacks forces a HelloRetryRequest (the binder then covers another transcript).

use nvmf_core::tls::psk::{ConfiguredPsk, PskLabels, TlsPsk};
use openssl::ssl::Ssl;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
const KEY384: &str =
    "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
const SUB: &str = "nqn.2024-01.io.nvmfd:tls1";

/// Version-0 TLS PSKs of `key` in both encodings, libnvme's first.
fn both(key: &str) -> Vec<TlsPsk> {
    let k = ConfiguredPsk::parse(key).unwrap();
    PskLabels::ALL
        .iter()
        .map(|&l| k.tls_psk_v0_with(HOST, SUB, l).unwrap())
        .collect()
}

/// A server on an ephemeral port whose lookup returns `candidates` for their identity; it
/// completes one handshake and echoes 4 bytes. Returns (port, join handle → cipher or error).
fn serve(candidates: Vec<TlsPsk>) -> (u16, std::thread::JoinHandle<Result<String, String>>) {
    let ctx = nvmf_tls::server_context(
        move |id| {
            candidates
                .iter()
                .filter(|c| c.identity == id)
                .cloned()
                .collect()
        },
        nvmf_tls::Ktls::Off,
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (sock, _) = listener.accept().map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut s = Ssl::new(&ctx)
            .unwrap()
            .accept(sock)
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
        s.write_all(&buf).map_err(|e| e.to_string())?;
        Ok(s.ssl().current_cipher().unwrap().name().to_string())
    });
    (port, h)
}

/// Handshake with our client offering `psk`; Ok(cipher) or the server's error.
fn client(candidates: Vec<TlsPsk>, psk: TlsPsk) -> Result<String, String> {
    let (port, server) = serve(candidates);
    let cctx = nvmf_tls::client_context(psk, nvmf_tls::Ktls::Off).unwrap();
    let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let c = (|| {
        let mut c = Ssl::new(&cctx)
            .unwrap()
            .connect(sock)
            .map_err(|e| e.to_string())?;
        c.write_all(b"ping").map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).map_err(|e| e.to_string())?;
        assert_eq!(&buf, b"ping");
        Ok::<_, String>(())
    })();
    let s = server.join().unwrap();
    match (c, s) {
        (Ok(()), Ok(cipher)) => Ok(cipher),
        (_, Err(e)) => Err(e),
        (Err(e), Ok(_)) => Err(format!("client: {e}")),
    }
}

#[test]
fn the_binder_picks_the_encoding() {
    for (key, suite) in [
        (KEY, "TLS_AES_128_GCM_SHA256"),
        (KEY384, "TLS_AES_256_GCM_SHA384"),
    ] {
        let c = both(key);
        assert_eq!(c[0].identity, c[1].identity);
        assert_ne!(c[0].key, c[1].key);
        for offered in &c {
            assert_eq!(
                client(c.clone(), offered.clone()).as_deref(),
                Ok(suite),
                "{key} {:?}",
                offered.labels
            );
        }
        // The Linux host binds a SHA-384 key with SHA-256 (docs/TLS.md): a 32-byte binder, a
        // SHA-256 suite, still the key it was made with.
        if key == KEY384 {
            let linux_like = TlsPsk {
                hash: nvmf_core::tls::psk::PskHash::Sha256,
                ..c[0].clone()
            };
            assert_eq!(
                client(c.clone(), linux_like).as_deref(),
                Ok("TLS_AES_128_GCM_SHA256")
            );
        }
        // The right identity with a third key: no candidate verifies, refused as before.
        let mut wrong = c[1].clone();
        wrong.key[0] ^= 1;
        let e = client(c.clone(), wrong).unwrap_err();
        assert!(e.contains("binder does not verify"), "{e}");
    }
}

/// `openssl s_client` (OpenSSL's own binder code) with the spec encoding's key, its key share for
/// ffdhe2048 only (the server allows X25519/P-256/P-384): a HelloRetryRequest, then the second
/// ClientHello's binder covers message_hash(ClientHello1) || HelloRetryRequest || ClientHello2.
#[test]
fn after_a_hello_retry_request() {
    use std::process::{Command, Stdio};
    let c = both(KEY);
    let rfc = c[1].clone();
    assert_eq!(rfc.labels, PskLabels::Rfc8446);
    let (port, server) = serve(c);
    let hex: String = rfc.key.iter().map(|b| format!("{b:02x}")).collect();
    let mut child = Command::new("openssl")
        .args(["s_client", "-tls1_3", "-msg", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-groups", "ffdhe2048:X25519", "-psk", &hex, "-psk_identity"])
        .arg(&rfc.identity)
        .args(["-ciphersuites", "TLS_AES_128_GCM_SHA256"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client (install the openssl package)");
    child.stdin.take().unwrap().write_all(b"ping").unwrap();
    let s = server.join().unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        s.as_deref(),
        Ok("TLS_AES_128_GCM_SHA256"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hellos = text.matches(", ClientHello").count();
    assert_eq!(hellos, 2, "no HelloRetryRequest happened:\n{text}");
}
