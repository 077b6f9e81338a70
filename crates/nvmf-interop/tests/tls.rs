//! NVMe/TCP TLS with the Linux 6.12 host (issue 12): the TLS userland of the guest (nvme-cli 2.13,
//! libnvme 1.13, keyutils, tlshd from Debian 13; `run_guest_tls`) is the judge.
//!
//! - `psk_derivation_matches_linux_612`: the TLS PSKs and identities nvme-cli puts into the
//!   kernel's `.nvme` keyring (identity versions 0 and 1, keys with hash 01, 02 and 00) equal
//!   `nvmf_core::tls::psk`'s; and what `nvme connect --tls` (kernel + tlshd) offers in its
//!   ClientHello (PSK identities, cipher suites), captured by a listener on the host.
//!
//! Opt-in with NVMFD_INTEROP=1 (tests/interop/tls-*.sh run in the guest).

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nvmf_core::tls::psk::{ConfiguredPsk, TlsPsk};
use nvmf_interop::*;

const SUB: &str = "nqn.2016-06.io.nvmfd:tls";
/// The example key of the Linux/nvme-cli documentation (hash 01, SHA-256).
const PSK01: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
/// Bytes 00..2f (hash 02, SHA-384).
const PSK02: &str =
    "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:";
/// Bytes 20..3f, used untransformed (hash 00).
const PSK00: &str = "NVMeTLSkey-1:00:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj/jBqb2:";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn suite_name(id: u16) -> String {
    match id {
        0x1301 => "TLS_AES_128_GCM_SHA256".into(),
        0x1302 => "TLS_AES_256_GCM_SHA384".into(),
        0x1303 => "TLS_CHACHA20_POLY1305_SHA256".into(),
        0x1304 => "TLS_AES_128_CCM_SHA256".into(),
        0x1305 => "TLS_AES_128_CCM_8_SHA256".into(),
        // TLS 1.2 PSK suites GnuTLS also lists
        0x00aa => "TLS_DHE_PSK_WITH_AES_128_GCM_SHA256".into(),
        0x00ab => "TLS_DHE_PSK_WITH_AES_256_GCM_SHA384".into(),
        0xc0a6 => "TLS_DHE_PSK_WITH_AES_128_CCM".into(),
        0xccac => "TLS_ECDHE_PSK_WITH_CHACHA20_POLY1305_SHA256".into(),
        0xccad => "TLS_DHE_PSK_WITH_CHACHA20_POLY1305_SHA256".into(),
        other => format!("{other:#06x}"),
    }
}

/// What a TLS 1.3 ClientHello offered.
#[derive(Debug, Clone)]
struct Hello {
    suites: Vec<u16>,
    identities: Vec<String>,
    /// Length of each PSK binder: the hash the client uses with the PSK (32 SHA-256, 48 SHA-384).
    binder_lens: Vec<usize>,
}

/// Parses the ClientHello in `rec` (one TLS record: 5-byte header then the handshake message).
fn parse_client_hello(rec: &[u8]) -> Result<Hello, String> {
    struct Cur<'a>(&'a [u8]);
    impl<'a> Cur<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
            if self.0.len() < n {
                return Err(format!("truncated: need {n} bytes, {} left", self.0.len()));
            }
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            Ok(a)
        }
        fn u8(&mut self) -> Result<usize, String> {
            Ok(self.take(1)?[0] as usize)
        }
        fn u16(&mut self) -> Result<usize, String> {
            let b = self.take(2)?;
            Ok(u16::from_be_bytes([b[0], b[1]]) as usize)
        }
        fn u24(&mut self) -> Result<usize, String> {
            let b = self.take(3)?;
            Ok(((b[0] as usize) << 16) | ((b[1] as usize) << 8) | b[2] as usize)
        }
    }
    let mut c = Cur(rec);
    let ctype = c.u8()?;
    if ctype != 22 {
        return Err(format!(
            "record type {ctype}, not a handshake (first bytes {:02x?})",
            &rec[..rec.len().min(8)]
        ));
    }
    c.take(2)?;
    let len = c.u16()?;
    let mut c = Cur(c.take(len)?);
    let htype = c.u8()?;
    if htype != 1 {
        return Err(format!("handshake type {htype}, not ClientHello"));
    }
    let hlen = c.u24()?;
    let mut c = Cur(c.take(hlen)?);
    c.take(2 + 32)?; // legacy version, random
    let n = c.u8()?;
    c.take(n)?; // session id
    let n = c.u16()?;
    let mut s = Cur(c.take(n)?);
    let mut suites = Vec::new();
    while !s.0.is_empty() {
        suites.push(s.u16()? as u16);
    }
    let n = c.u8()?;
    c.take(n)?; // compression methods
    let mut identities = Vec::new();
    let mut binder_lens = Vec::new();
    if !c.0.is_empty() {
        let n = c.u16()?;
        let mut e = Cur(c.take(n)?);
        while !e.0.is_empty() {
            let ty = e.u16()?;
            let n = e.u16()?;
            let mut body = Cur(e.take(n)?);
            if ty == 41 {
                // pre_shared_key: identities<7..2^16-1> of (identity<1..2^16-1>, u32 age)
                let n = body.u16()?;
                let mut ids = Cur(body.take(n)?);
                while !ids.0.is_empty() {
                    let n = ids.u16()?;
                    identities.push(String::from_utf8_lossy(ids.take(n)?).into_owned());
                    ids.take(4)?;
                }
                let n = body.u16()?;
                let mut binders = Cur(body.take(n)?);
                while !binders.0.is_empty() {
                    let n = binders.u8()?;
                    binders.take(n)?;
                    binder_lens.push(n);
                }
            }
        }
    }
    Ok(Hello {
        suites,
        identities,
        binder_lens,
    })
}

/// A listener on the host that takes one TLS record from every connection, parses it as a
/// ClientHello and closes the connection (the handshake never completes). Stopped on drop.
struct HelloCapture {
    port: u16,
    hellos: Arc<Mutex<Vec<Result<Hello, String>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HelloCapture {
    fn start() -> HelloCapture {
        let port = free_port();
        let l = TcpListener::bind(("127.0.0.1", port)).expect("bind capture listener");
        l.set_nonblocking(true).unwrap();
        let hellos = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, st) = (hellos.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((s, _)) => {
                        let r = read_record(s);
                        h.lock()
                            .unwrap()
                            .push(r.and_then(|rec| parse_client_hello(&rec)));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        HelloCapture {
            port,
            hellos,
            stop,
            thread: Some(thread),
        }
    }

    /// The ClientHellos (or parse errors) captured since the last call.
    fn take(&self) -> Vec<Result<Hello, String>> {
        std::mem::take(&mut *self.hellos.lock().unwrap())
    }
}

impl Drop for HelloCapture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One TLS record (header + body), read within 10 s.
fn read_record(mut s: TcpStream) -> Result<Vec<u8>, String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut hdr = [0u8; 5];
    s.read_exact(&mut hdr)
        .map_err(|e| format!("reading the record header: {e}"))?;
    let len = u16::from_be_bytes([hdr[3], hdr[4]]) as usize;
    let mut rec = hdr.to_vec();
    rec.resize(5 + len, 0);
    s.read_exact(&mut rec[5..])
        .map_err(|e| format!("reading a {len}-byte record: {e}"))?;
    Ok(rec)
}

/// Both derivations of `key` for (host, SUB).
fn ours(key: &str, host: &str) -> [TlsPsk; 2] {
    let k = ConfiguredPsk::parse(key).unwrap();
    [
        k.tls_psk_v0(host, SUB).unwrap(),
        k.tls_psk_v1(host, SUB).unwrap(),
    ]
}

/// Compares the guest's `CONFIGURED|key` / `PSK|identity|hex` lines with our derivations.
fn compare_keys(stdout: &str, host: &str, keys: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen: Vec<(String, String, String)> = Vec::new(); // (configured, identity, hex)
    let mut current = String::new();
    for l in stdout.lines() {
        if let Some(k) = l.strip_prefix("CONFIGURED|") {
            current = k.to_string();
        } else if let Some(rest) = l.strip_prefix("PSK|") {
            match rest.rsplit_once('|') {
                Some((id, hx)) => seen.push((current.clone(), id.to_string(), hx.to_string())),
                None => problems.push(format!("unparsable guest line {l:?}")),
            }
        }
    }
    for key in keys {
        for t in ours(key, host) {
            let got: Vec<&(String, String, String)> = seen
                .iter()
                .filter(|(c, id, _)| c == key && id.starts_with(&t.identity[..5]))
                .collect();
            match got.as_slice() {
                [(_, id, hx)] => {
                    if *id != t.identity {
                        problems.push(format!(
                            "{key}: Linux identity {id:?}, ours {:?}",
                            t.identity
                        ));
                    } else if *hx != hex(&t.key) {
                        problems.push(format!(
                            "{key} {}: Linux TLS PSK {hx}, ours {}",
                            &t.identity[..8],
                            hex(&t.key)
                        ));
                    } else {
                        say(&format!(
                            "interop tls: {key} {}: identity and TLS PSK equal ({})",
                            &t.identity[..8],
                            &hx[..16]
                        ));
                    }
                }
                other => problems.push(format!(
                    "{key}: expected one {} key in the guest's keyring, found {}",
                    &t.identity[..5],
                    other.len()
                )),
            }
        }
    }
    problems
}

#[test]
fn psk_derivation_matches_linux_612() {
    let Some(_serial) = begin("psk_derivation_matches_linux_612") else {
        return;
    };
    let dir = work_dir("tls-psk");
    let host = host_nqn(HOST_ID);
    let cap = HelloCapture::start();
    let hello_keys = [PSK01, PSK02];
    let env = vec![
        ("PORT", cap.port.to_string()),
        ("HOSTNQN", host.clone()),
        ("HOSTID", HOST_ID.to_string()),
        ("SUBNQN", SUB.to_string()),
        ("PSKS", [PSK01, PSK02, PSK00].join(" ")),
        ("HELLO_PSKS", hello_keys.join(" ")),
    ];
    let mut problems = Vec::new();
    let run = run_guest_tls(
        &dir,
        "tls-psk.sh",
        &[cap.port],
        &env,
        Duration::from_secs(240),
        |cp, detail| {
            // detail: "<key> both|0" (which identity versions are in the guest's keyring)
            let (Some(_), Some((key, versions))) =
                (cp.strip_prefix("hello-"), detail.split_once(' '))
            else {
                return format!("fail: unknown checkpoint {cp} {detail:?}");
            };
            let key = key.to_string();
            // the connect has failed by now; give a late ClientHello a moment
            let t0 = Instant::now();
            let mut hellos = cap.take();
            while hellos.is_empty() && t0.elapsed() < Duration::from_secs(5) {
                thread::sleep(Duration::from_millis(100));
                hellos = cap.take();
            }
            let [v0, v1] = ours(&key, &host);
            let mut lines = Vec::new();
            for h in &hellos {
                match h {
                    Ok(h) => {
                        let suites: Vec<String> = h.suites.iter().map(|s| suite_name(*s)).collect();
                        let line = format!(
                            "{key} (keyring: identity versions {versions}): ClientHello identities {:?}, binder lengths {:?}, cipher suites {}",
                            h.identities,
                            h.binder_lens,
                            suites.join(",")
                        );
                        say(&format!("interop tls: {line}"));
                        lines.push(line);
                        if !h
                            .identities
                            .iter()
                            .any(|i| *i == v0.identity || *i == v1.identity)
                        {
                            problems.push(format!(
                                "{key}: the host offered {:?}, none of our identities ({:?}, {:?})",
                                h.identities, v0.identity, v1.identity
                            ));
                        }
                        let want = match v1.hash.cipher_suite() {
                            "TLS_AES_256_GCM_SHA384" => 0x1302,
                            _ => 0x1301,
                        };
                        if !h.suites.contains(&want) {
                            problems.push(format!(
                                "{key}: the host does not offer {}",
                                suite_name(want)
                            ));
                        }
                    }
                    Err(e) => problems.push(format!("{key}: bad ClientHello: {e}")),
                }
            }
            if hellos.is_empty() {
                problems.push(format!("{key}: no ClientHello reached the host"));
                return "fail: no ClientHello reached the host".into();
            }
            format!("ok {}", lines.join("; "))
        },
    );
    drop(cap);
    println!("{}", run.report(None));
    problems.extend(compare_keys(&run.stdout, &host, &[PSK01, PSK02, PSK00]));
    say(&format!(
        "interop psk_derivation_matches_linux_612: guest status {}, {:.1} s",
        run.status,
        run.wall.as_secs_f64()
    ));
    assert_eq!(
        run.status,
        0,
        "guest scenario failed:\n{}",
        run.report(None)
    );
    assert!(
        problems.is_empty(),
        "the Linux host and nvmf_core::tls::psk disagree:\n  {}\n\n{}",
        problems.join("\n  "),
        run.report(None)
    );
}

const NQN: &str = "nqn.2016-06.io.nvmfd:tls";
/// The second host (SHA-384 key).
const HOST2_ID: &str = "6f1b1f3c-0c52-4c6e-9d1e-6e7666d00384";

/// nvmfd with subsystem NQN (one 32 MiB namespace) on a secure listener at `port` (hosts
/// HOST_ID with PSK01 and HOST2_ID with PSK02) and the discovery subsystem in clear text at `dport`.
fn tls_config(dir: &std::path::Path, port: u16, dport: u16) -> serde_json::Value {
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;
    let key_file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, format!("{text}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p.to_string_lossy().into_owned()
    };
    let addr = |p: u16| json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": p.to_string()});
    json!({"subsystems": [
        {"subsystem": "keyring", "config": [
            {"method": "keyring_file_add_key", "params": {"name": "key0", "path": key_file("key0", PSK01)}},
            {"method": "keyring_file_add_key", "params": {"name": "key1", "path": key_file("key1", PSK02)}},
        ]},
        {"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 65536, "block_size": 512}},
        ]},
        {"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
            {"method": "nvmf_create_subsystem", "params": {"nqn": NQN, "serial_number": "TLS001",
                "model_number": "nvmfd tls", "allow_any_host": false}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "nsid": 1}}},
            {"method": "nvmf_subsystem_add_host", "params": {"nqn": NQN, "host": host_nqn(HOST_ID), "psk": "key0"}},
            {"method": "nvmf_subsystem_add_host", "params": {"nqn": NQN, "host": host_nqn(HOST2_ID), "psk": "key1"}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": NQN, "secure_channel": true, "listen_address": addr(port)}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2014-08.org.nvmexpress.discovery", "listen_address": addr(dport)}},
        ]},
    ]})
}

/// The Linux 6.12 host with tlshd against nvmfd's secure listener: discovery shows TLS 1.3
/// required; clear text and wrong PSKs refused (and named in nvmfd's log); the configured PSK
/// connects (identity version and cipher suite read from nvmfd's log) and fio verifies over TLS;
/// a second host's SHA-384 PSK connects with TLS_CHACHA20_POLY1305_SHA256: the Linux host's binder
/// for such a key is SHA-256, so that is the suite Linux itself negotiates (docs/TLS.md).
#[test]
fn kernel_host_612_tls() {
    let Some(_serial) = begin("kernel_host_612_tls") else {
        return;
    };
    let dir = work_dir("tls-nvmfd");
    let (port, dport) = (free_port(), free_port());
    let mut nvmfd = Nvmfd::start(&dir, &tls_config(&dir, port, dport), port);
    let host = host_nqn(HOST_ID);
    let env = vec![
        ("PORT", port.to_string()),
        ("DPORT", dport.to_string()),
        ("NQN", NQN.to_string()),
        ("HOSTNQN", host.clone()),
        ("HOSTID", HOST_ID.to_string()),
        ("PSK", PSK01.to_string()),
        // another SHA-256 key for the same host and subsystem
        ("WRONG_PSK", PSK00.to_string()),
        ("HOST2NQN", host_nqn(HOST2_ID)),
        ("HOST2ID", HOST2_ID.to_string()),
        ("PSK2", PSK02.to_string()),
        ("FIO_MB", "4".to_string()),
    ];
    let mut failures = Vec::new();
    // log lines seen by the previous checkpoint: each check looks only at what is new
    let mut seen = 0usize;
    let run = run_guest_tls(
        &dir,
        "tls-nvmfd.sh",
        &[port, dport],
        &env,
        Duration::from_secs(300),
        |cp, _| {
            let wait_for = |pred: &dyn Fn(&str) -> bool, seen: usize| -> Option<String> {
                let t0 = Instant::now();
                loop {
                    let log = nvmfd.log();
                    if let Some(l) = log.lines().skip(seen).find(|l| pred(l)) {
                        return Some(l.trim().to_string());
                    }
                    if t0.elapsed() > Duration::from_secs(5) {
                        return None;
                    }
                    thread::sleep(Duration::from_millis(100));
                }
            };
            let r: Result<String, String> = match cp {
                "after-clear" => wait_for(&|l| l.contains("refused: a clear-text ICReq"), seen)
                    .ok_or_else(|| "no 'refused: a clear-text ICReq' line in nvmfd's log".into()),
                "after-wrong" | "after-wrong-v0" => {
                    wait_for(&|l| l.contains("TLS handshake refused or failed"), seen)
                        .ok_or_else(|| "no 'TLS handshake refused or failed' line".into())
                }
                "connected" => wait_for(
                    &|l| l.contains("TLS 1.3 session established") && l.contains(&host),
                    seen,
                )
                .ok_or_else(|| "no 'TLS 1.3 session established' line naming the host".into())
                .and_then(|l| {
                    if l.contains("TLS_AES_128_GCM_SHA256") {
                        Ok(l)
                    } else {
                        Err(format!("expected TLS_AES_128_GCM_SHA256: {l}"))
                    }
                }),
                "connected-384" => wait_for(
                    &|l| l.contains("TLS 1.3 session established") && l.contains(HOST2_ID),
                    seen,
                )
                .ok_or_else(|| "no 'TLS 1.3 session established' line naming host 2".into())
                .and_then(|l| {
                    if l.contains("TLS_CHACHA20_POLY1305_SHA256") {
                        Ok(l)
                    } else {
                        Err(format!("expected TLS_CHACHA20_POLY1305_SHA256: {l}"))
                    }
                }),
                _ => {
                    let r = expect_no_controllers(&nvmfd);
                    if r.starts_with("ok") {
                        Ok(r)
                    } else {
                        Err(r)
                    }
                }
            };
            seen = nvmfd.log().lines().count();
            match r {
                Ok(l) => {
                    say(&format!("interop kernel_host_612_tls: {cp}: {l}"));
                    format!("ok {l}")
                }
                Err(e) => {
                    failures.push(format!("checkpoint {cp}: {e}"));
                    format!("failed: {e}")
                }
            }
        },
    );
    let log = nvmfd.log();
    if log.contains("VRLbtnN9") || log.contains("AAECAwQF") || log.contains("ICEiIyQl") {
        failures.push("nvmfd logged a key".to_string());
    }
    finish("kernel_host_612_tls", &run, &mut nvmfd, &failures);
}

/// Kernel TLS with a kernel that has it (the 6.12 TLS guest; this machine's kernel has no `tls`
/// module, where nvmf-tls's `tests/ktls.rs` covers the fallback): `tests/interop/ktls.sh` runs
/// nvmf-tls's `ktls_check --require-kernel` (kTLS both ways, one way, refused keys, KeyUpdate
/// refused by name), nvmfd and `nvmf perf --verify` with kernel TLS on both sides and mixed with
/// OpenSSL records, and the Linux host (tlshd, kernel TLS) with fio verify against nvmfd's kernel
/// TLS — all inside the guest. `NVMFD_KTLS_BENCH=1` adds the TLS/clear figures (BENCHMARKS.md).
#[test]
fn ktls_in_the_612_guest() {
    let Some(_serial) = begin("ktls_in_the_612_guest") else {
        return;
    };
    let dir = work_dir("ktls");
    let check = example_binary("nvmf-tls", "ktls_check", "NVMF_KTLS_CHECK_BIN");
    let (nvmfd, nvmf) = (nvmfd_binary(), nvmf_binary());
    let bench = std::env::var("NVMFD_KTLS_BENCH").is_ok_and(|v| v == "1");
    let env = vec![
        ("PORT", "4420".to_string()),
        ("CPORT", "4421".to_string()),
        ("UPORT", "4422".to_string()),
        ("NQN", SUB.to_string()),
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("HOSTID", HOST_ID.to_string()),
        ("PSK", PSK01.to_string()),
        ("FIO_MB", "4".to_string()),
        ("BENCH", if bench { "1" } else { "0" }.to_string()),
        ("BENCH_S", "5".to_string()),
    ];
    let run = run_guest_tls_with_bins(
        &dir,
        "ktls.sh",
        &env,
        &[check.as_path(), nvmfd.as_path(), nvmf.as_path()],
        Duration::from_secs(if bench { 420 } else { 300 }),
    );
    let report = run.report(None);
    println!("{report}");
    for l in run.stdout.lines().filter(|l| l.starts_with("BENCH ")) {
        say(&format!("interop ktls_in_the_612_guest: {l}"));
    }
    say(&format!(
        "interop ktls_in_the_612_guest: {} (guest status {}, {:.1} s)",
        if run.status == 0 { "passed" } else { "FAILED" },
        run.status,
        run.wall.as_secs_f64()
    ));
    assert!(
        run.status == 0 && run.stdout.contains("ktls: all steps passed"),
        "interop ktls_in_the_612_guest failed: {}\n\n{report}",
        run.stdout
            .lines()
            .find(|l| l.starts_with("FAIL:"))
            .unwrap_or("(no FAIL line; see the report)")
    );
}
