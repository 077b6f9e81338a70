//! TLS 1.3 external-PSK handshake on loopback between our server and client contexts: identity and
//! cipher checked (SHA-256 → AES-128-GCM, SHA-384 → AES-256-GCM), data exchanged both ways, a wrong
//! PSK and an unknown identity refused.

use nvmf_core::tls::psk::{ConfiguredPsk, TlsPsk};
use openssl::ssl::Ssl;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
const KEY384: &str =
    "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:";
const SUB: &str = "nqn.2024-01.io.nvmfd:tls1";

/// One handshake on 127.0.0.1:`port`; returns (client result, identity the server saw).
fn run(
    port: u16,
    server_psk: TlsPsk,
    client_psk: TlsPsk,
) -> (Result<String, String>, Option<String>) {
    let seen = Arc::new(Mutex::new(None));
    let seen2 = seen.clone();
    let ctx = nvmf_tls::server_context(
        move |id| {
            *seen2.lock().unwrap() = Some(id.to_string());
            (id == server_psk.identity)
                .then(|| server_psk.clone())
                .into_iter()
                .collect()
        },
        nvmf_tls::Ktls::Off,
    )
    .unwrap();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let server = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut s = Ssl::new(&ctx)
            .unwrap()
            .accept(sock)
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
        s.write_all(b"pong:").map_err(|e| e.to_string())?;
        s.write_all(&buf).map_err(|e| e.to_string())?;
        Ok::<String, String>(s.ssl().current_cipher().unwrap().name().to_string())
    });
    let cctx = nvmf_tls::client_context(client_psk, nvmf_tls::Ktls::Off).unwrap();
    let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let client = (|| {
        let mut c = Ssl::new(&cctx)
            .unwrap()
            .connect(sock)
            .map_err(|e| e.to_string())?;
        c.write_all(b"hello").map_err(|e| e.to_string())?;
        let mut buf = [0u8; 10];
        c.read_exact(&mut buf).map_err(|e| e.to_string())?;
        assert_eq!(&buf, b"pong:hello");
        assert_eq!(c.ssl().version_str(), "TLSv1.3");
        Ok(c.ssl().current_cipher().unwrap().name().to_string())
    })();
    let server = server.join().unwrap();
    if let Ok(cipher) = &client {
        assert_eq!(server.as_ref(), Ok(cipher), "server and client disagree");
    }
    let seen = seen.lock().unwrap().clone();
    (client, seen)
}

#[test]
fn psk_handshake_and_refusals() {
    let good = ConfiguredPsk::parse(KEY)
        .unwrap()
        .tls_psk_v1(HOST, SUB)
        .unwrap();
    let (r, seen) = run(4630, good.clone(), good.clone());
    assert_eq!(r.unwrap(), "TLS_AES_128_GCM_SHA256");
    assert_eq!(seen.as_deref(), Some(good.identity.as_str()));

    // Same identity, one key byte wrong: the binder does not verify.
    let mut wrong = good.clone();
    wrong.key[0] ^= 1;
    let (r, _) = run(4631, good.clone(), wrong);
    assert!(r.is_err(), "wrong PSK accepted");

    // Unknown identity (another host NQN) offered with the right key bytes: the identity alone
    // must make the server refuse.
    let other = TlsPsk {
        identity: good
            .identity
            .replace(HOST, "nqn.2014-08.org.nvmexpress:uuid:other"),
        ..good.clone()
    };
    let (r, seen) = run(4632, good.clone(), other.clone());
    assert!(r.is_err(), "unknown identity accepted");
    assert_eq!(seen.as_deref(), Some(other.identity.as_str()));
}

#[test]
fn sha384_psk_uses_aes256() {
    let k = ConfiguredPsk::parse(KEY384)
        .unwrap()
        .tls_psk_v1(HOST, SUB)
        .unwrap();
    let (r, seen) = run(4633, k.clone(), k.clone());
    assert_eq!(r.unwrap(), "TLS_AES_256_GCM_SHA384");
    assert_eq!(seen.as_deref(), Some(k.identity.as_str()));
    // Version-0 identity, SHA-256 key.
    let v0 = ConfiguredPsk::parse(KEY)
        .unwrap()
        .tls_psk_v0(HOST, SUB)
        .unwrap();
    let (r, _) = run(4634, v0.clone(), v0);
    assert_eq!(r.unwrap(), "TLS_AES_128_GCM_SHA256");
}

/// Independent client: `openssl s_client` (OpenSSL's own PSK code path) against our server context.
#[test]
fn openssl_s_client_against_our_server() {
    use std::process::{Command, Stdio};
    let psk = ConfiguredPsk::parse(KEY)
        .unwrap()
        .tls_psk_v1(HOST, SUB)
        .unwrap();
    let hex: String = psk.key.iter().map(|b| format!("{b:02x}")).collect();
    let expected = psk.identity.clone();
    let ctx = nvmf_tls::server_context(
        move |id| {
            (id == psk.identity)
                .then(|| psk.clone())
                .into_iter()
                .collect()
        },
        nvmf_tls::Ktls::Off,
    )
    .unwrap();
    let listener = TcpListener::bind(("127.0.0.1", 4635)).unwrap();
    let server = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut s = Ssl::new(&ctx)
            .unwrap()
            .accept(sock)
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
        s.write_all(b"pong\n").map_err(|e| e.to_string())?;
        let _ = s.shutdown();
        Ok::<_, String>((buf, s.ssl().current_cipher().unwrap().name().to_string()))
    });
    let mut child = Command::new("timeout")
        .args([
            "10",
            "openssl",
            "s_client",
            "-tls1_3",
            "-quiet",
            "-connect",
            "127.0.0.1:4635",
        ])
        .args(["-psk", &hex, "-psk_identity", &expected])
        .args(["-ciphersuites", "TLS_AES_128_GCM_SHA256"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl binary (package openssl)");
    child.stdin.as_mut().unwrap().write_all(b"hello").unwrap();
    let (buf, cipher) = server.join().unwrap().unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(&buf, b"hello");
    assert_eq!(cipher, "TLS_AES_128_GCM_SHA256");
    assert!(String::from_utf8_lossy(&out.stdout).contains("pong"));
}
