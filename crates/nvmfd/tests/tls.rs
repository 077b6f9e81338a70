//! NVMe/TCP over TLS 1.3 (PSK) against the real daemon: one subsystem whose listener requires TLS
//! (`secure_channel`), hosts with PSKs from key files (`keyring_file_add_key`, `add_host psk`), and
//! a clear-text discovery listener. Judged here at the transport level with our TLS client (the
//! `nvmf` host side and the Linux host have their own tests):
//! - a host with the right PSK completes the handshake (version-1 and version-0 identities, a
//!   SHA-384 key gets TLS_AES_256_GCM_SHA384) and gets an ICResp to its ICReq through TLS;
//! - a clear-text ICReq on the secure listener is refused and the log says why;
//! - a wrong key, and the right key under another host's identity, fail the handshake;
//! - the discovery log (clear listener) marks the secure listener TLS 1.3 / required;
//! - `save_config` keeps `secure_channel` and `psk` (the key name, never the key);
//! - a listener on the same address without TLS for another subsystem is refused;
//! - the `nvmf` host over TLS: `perf --verify` 4 KiB and 128 KiB with a SHA-256 key (identity
//!   v1) and a SHA-384 key (identity v0); the wrong key, clear text to the TLS port and TLS to a
//!   clear-text port fail with the reason named;
//! - hostile peers: a handshake that stops half-way is closed by the ICReq timeout, garbage after a
//!   TLS record header fails the handshake, and the daemon keeps serving TLS hosts throughout.

use nvmf_core::tls::psk::{ConfiguredPsk, TlsPsk};
use nvmf_host::{ConnectOptions, Controller, TransportId};
use nvmf_testkit::{free_port, TestDir};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

const NQN: &str = "nqn.2024-01.io.nvmfd:tls";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
const HOST384: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000384";
const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
const KEY384: &str =
    "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:";

struct Tls {
    d: nvmf_testkit::Daemon,
    secure: u16,
    clear: u16,
    _dir: TestDir,
}

fn key_file(dir: &TestDir, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_string_lossy().into_owned()
}

fn start() -> Tls {
    start_with(&[])
}

fn start_with(extra: &[&str]) -> Tls {
    let dir = TestDir::new("tls");
    let k0 = key_file(&dir, "k0", KEY);
    let k1 = key_file(&dir, "k1", KEY384);
    let (secure, clear) = (free_port(), free_port());
    let cfg = format!(
        r#"{{"subsystems":[
{{"subsystem":"keyring","config":[
 {{"method":"keyring_file_add_key","params":{{"name":"key0","path":"{k0}"}}}},
 {{"method":"keyring_file_add_key","params":{{"name":"key1","path":"{k1}"}}}}]}},
{{"subsystem":"bdev","config":[{{"method":"bdev_malloc_create","params":{{"name":"M0","num_blocks":8192,"block_size":512}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
 {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}"}}}},
 {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"M0"}}}}}},
 {{"method":"nvmf_subsystem_add_host","params":{{"nqn":"{NQN}","host":"{HOST}","psk":"key0"}}}},
 {{"method":"nvmf_subsystem_add_host","params":{{"nqn":"{NQN}","host":"{HOST384}","psk":"key1"}}}},
 {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","secure_channel":true,"listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{secure}"}}}}}},
 {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"nqn.2014-08.org.nvmexpress.discovery","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{clear}"}}}}}}]}}]}}"#
    );
    let mut args = vec!["-m", "0"];
    args.extend_from_slice(extra);
    let d = nvmf_testkit::Daemon::builder(cfg)
        .args(args)
        .listening(&[secure, clear])
        .start();
    Tls {
        d,
        secure,
        clear,
        _dir: dir,
    }
}

/// An NVMe/TCP ICReq (PFV 0, no digests, MAXR2T 0).
fn icreq() -> [u8; 128] {
    let mut b = [0u8; 128];
    b[2] = 128; // HLEN
    b[4] = 128; // PLEN
    b
}

/// Handshake with `psk` on `port`, then ICReq → ICResp over TLS. Ok(cipher) or Err(why).
fn tls_icreq(port: u16, psk: TlsPsk) -> Result<String, String> {
    let ctx = nvmf_tls::client_context(psk, nvmf_tls::Ktls::Off).map_err(|e| e.to_string())?;
    let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut t = nvmf_tls::connect(&ctx, sock.as_raw_fd())?;
    let req = icreq();
    let mut sent = 0;
    while sent < req.len() {
        sent += t
            .write_gather(&[std::io::IoSlice::new(&req[sent..])])
            .map_err(|e| e.to_string())?;
    }
    let mut resp = [0u8; 128];
    let mut got = 0;
    while got < resp.len() {
        match t.read(&mut resp[got..]) {
            Ok(0) => return Err(format!("closed after {got} bytes of ICResp")),
            Ok(n) => got += n,
            Err(e) => return Err(format!("reading the ICResp: {e}")),
        }
    }
    if resp[0] != 0x01 || resp[2] != 128 {
        return Err(format!("not an ICResp: {:02x?}", &resp[..8]));
    }
    Ok(t.cipher().to_string())
}

#[test]
fn psk_hosts_get_an_icresp_over_tls() {
    let t = start();
    let k = ConfiguredPsk::parse(KEY).unwrap();
    assert_eq!(
        tls_icreq(t.secure, k.tls_psk_v1(HOST, NQN).unwrap()).unwrap(),
        "TLS_AES_128_GCM_SHA256"
    );
    assert_eq!(
        tls_icreq(t.secure, k.tls_psk_v0(HOST, NQN).unwrap()).unwrap(),
        "TLS_AES_128_GCM_SHA256"
    );
    let k384 = ConfiguredPsk::parse(KEY384).unwrap();
    assert_eq!(
        tls_icreq(t.secure, k384.tls_psk_v1(HOST384, NQN).unwrap()).unwrap(),
        "TLS_AES_256_GCM_SHA384"
    );
    t.d.wait_log_for("TLS 1.3 session established", Duration::from_secs(5));
}

#[test]
fn wrong_keys_and_clear_text_are_refused() {
    let t = start();
    // One key byte wrong: the binder does not verify.
    let mut wrong = ConfiguredPsk::parse(KEY)
        .unwrap()
        .tls_psk_v1(HOST, NQN)
        .unwrap();
    wrong.key[0] ^= 1;
    assert!(tls_icreq(t.secure, wrong).is_err(), "wrong key accepted");
    // HOST's key offered under HOST384's name (a v0 identity carries no digest).
    let k = ConfiguredPsk::parse(KEY).unwrap();
    let mut borrowed = k.tls_psk_v0(HOST, NQN).unwrap();
    borrowed.identity = borrowed.identity.replace(HOST, HOST384);
    assert!(
        tls_icreq(t.secure, borrowed).is_err(),
        "key of another host accepted"
    );
    t.d.wait_log_for("TLS handshake refused or failed", Duration::from_secs(5));

    // Clear text on the secure listener: closed without an ICResp.
    let mut s = TcpStream::connect(("127.0.0.1", t.secure)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&icreq()).unwrap();
    let mut b = [0u8; 128];
    match s.read(&mut b) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("{n} bytes answered a clear-text ICReq on a TLS listener"),
    }
    t.d.wait_log_for("a clear-text ICReq", Duration::from_secs(5));

    // The daemon still serves TLS hosts.
    tls_icreq(t.secure, k.tls_psk_v1(HOST, NQN).unwrap()).unwrap();
}

#[test]
fn discovery_marks_the_secure_listener_and_config_round_trips() {
    let t = start();
    let trid = TransportId::parse(&format!(
        "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{} subnqn:nqn.2014-08.org.nvmexpress.discovery hostnqn:{HOST}",
        t.clear
    ))
    .unwrap();
    let ctrl = Controller::connect(&ConnectOptions::new(trid)).unwrap();
    let log = ctrl.discovery_log().unwrap();
    let e = log
        .entries
        .iter()
        .find(|e| e.subnqn == NQN)
        .expect("the subsystem's record");
    assert_eq!(e.trsvcid, t.secure.to_string());
    assert_eq!(e.treq & 0x3, 1, "TREQ secure channel required");
    assert_eq!(e.sectype, 2, "TSAS TLS 1.3");
    let cur = log
        .entries
        .iter()
        .find(|e| e.subnqn != NQN)
        .expect("the discovery record");
    assert_eq!(cur.sectype, 0, "the clear discovery listener");

    let saved = t.d.rpc_ok(&["save_config"]);
    assert!(saved.contains("\"secure_channel\": true"), "{saved}");
    assert!(saved.contains("\"psk\": \"key0\""), "{saved}");
    assert!(
        !saved.contains("NVMeTLSkey"),
        "a key leaked into save_config"
    );

    // Another subsystem may not listen on the TLS address in clear text.
    t.d.rpc_ok(&["nvmf_create_subsystem", "nqn.2024-01.io.nvmfd:other", "-a"]);
    let r = t.d.rpc(&[
        "nvmf_subsystem_add_listener",
        "nqn.2024-01.io.nvmfd:other",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &t.secure.to_string(),
    ]);
    let err = r.expect_err("clear listener on a TLS address accepted");
    assert!(err.contains("secure_channel"), "{err}");
}

#[test]
fn stalled_and_garbage_handshakes_are_closed() {
    let t = start_with(&["--icreq-timeout-ms", "700"]);
    // A record header announcing a ClientHello, then silence.
    let mut stalled = TcpStream::connect(("127.0.0.1", t.secure)).unwrap();
    stalled
        .write_all(&[0x16, 0x03, 0x01, 0x00, 0x80, 0x01])
        .unwrap();
    // A handshake record full of garbage.
    let mut garbage = TcpStream::connect(("127.0.0.1", t.secure)).unwrap();
    let mut junk = vec![0x16, 0x03, 0x01, 0x00, 0x40];
    junk.extend((0..0x40u32).map(|i| (i * 37) as u8));
    garbage.write_all(&junk).unwrap();
    for (what, s) in [("garbage", &mut garbage), ("stalled", &mut stalled)] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 256];
        let t0 = std::time::Instant::now();
        loop {
            match s.read(&mut b) {
                Ok(0) | Err(_) => break,
                Ok(_) => {} // an alert record
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{what}: never closed"
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "{what}: closed too late"
        );
    }
    t.d.wait_log_for("no ICReq within", Duration::from_secs(5));
    let k = ConfiguredPsk::parse(KEY).unwrap();
    tls_icreq(t.secure, k.tls_psk_v1(HOST, NQN).unwrap()).unwrap();
}

fn nvmf_run(args: &[&str]) -> (bool, String) {
    let out = nvmf_testkit::nvmf(args, Duration::from_secs(60));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn nvmf_host_runs_verified_io_over_tls() {
    let t = start();
    let dir = TestDir::new("tls-host");
    let k0 = key_file(&dir, "k0", KEY);
    let k1 = key_file(&dir, "k1", KEY384);
    let trid = |port: u16, nqn: &str| {
        format!("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}")
    };
    let secure = trid(t.secure, NQN);
    for (size, q) in [("4096", "16"), ("131072", "4")] {
        let (ok, out) = nvmf_run(&[
            "perf",
            "-r",
            &secure,
            "--hostnqn",
            HOST,
            "--tls-key",
            &k0,
            "-w",
            "randrw",
            "-o",
            size,
            "-q",
            q,
            "-t",
            "1",
            "--verify",
        ]);
        assert!(ok, "perf {size} over TLS failed:\n{out}");
    }
    let (ok, out) = nvmf_run(&[
        "perf",
        "-r",
        &secure,
        "--hostnqn",
        HOST384,
        "--tls-key",
        &k1,
        "--tls-identity",
        "0",
        "-w",
        "randrw",
        "-o",
        "4096",
        "-q",
        "8",
        "-t",
        "1",
        "--verify",
    ]);
    assert!(ok, "perf with a SHA-384 key, identity 0, failed:\n{out}");
    t.d.wait_log_for("TLS_AES_256_GCM_SHA384", Duration::from_secs(5));
    // Kernel TLS (--ktls auto, both sides' default): sessions name who builds the records, and
    // a kernel without the tls module is said once (the testbed guest checks the kernel side).
    let log = t.d.log.lock().unwrap().join("\n");
    assert!(
        log.contains("records by kernel TLS")
            || (log.contains("records by OpenSSL") && log.contains("kernel TLS not used")),
        "nvmfd's log must say who builds the TLS records, and why not the kernel:\n{log}"
    );
    let (ok, out) = nvmf_run(&[
        "perf",
        "-r",
        &secure,
        "--hostnqn",
        HOST,
        "--tls-key",
        &k0,
        "--ktls",
        "off",
        "-w",
        "randrw",
        "-o",
        "4096",
        "-q",
        "4",
        "-t",
        "1",
        "--verify",
    ]);
    assert!(ok, "perf with --ktls off failed:\n{out}");
    let (ok, out) = nvmf_run(&[
        "perf",
        "-r",
        &secure,
        "--hostnqn",
        HOST,
        "--tls-key",
        &k0,
        "--ktls",
        "on",
        "-t",
        "1",
    ]);
    assert!(
        !ok && out.contains("auto or off"),
        "--ktls on must be refused by name: {out}"
    );

    // HOST384's key presented by HOST: refused, and the error says TLS.
    let (ok, out) = nvmf_run(&[
        "identify",
        "-r",
        &secure,
        "--hostnqn",
        HOST,
        "--tls-key",
        &k1,
    ]);
    assert!(!ok && out.contains("TLS"), "wrong key: {out}");
    // Clear text to the TLS port.
    let (ok, out) = nvmf_run(&[
        "identify",
        "-r",
        &secure,
        "--hostnqn",
        HOST,
        "--timeout",
        "3",
    ]);
    assert!(!ok, "clear text to a TLS listener worked: {out}");
    // TLS to the clear-text discovery port.
    let disc = trid(t.clear, "nqn.2014-08.org.nvmexpress.discovery");
    let (ok, out) = nvmf_run(&[
        "identify",
        "-r",
        &disc,
        "--hostnqn",
        HOST,
        "--tls-key",
        &k0,
        "--timeout",
        "3",
    ]);
    assert!(!ok && out.contains("TLS"), "TLS to a clear listener: {out}");
    // A key file others can read is refused before connecting.
    std::fs::set_permissions(&k0, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, out) = nvmf_run(&[
        "identify",
        "-r",
        &secure,
        "--hostnqn",
        HOST,
        "--tls-key",
        &k0,
    ]);
    assert!(!ok && out.contains("--tls-key"), "loose key file: {out}");
}
