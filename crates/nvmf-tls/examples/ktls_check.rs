//! Kernel TLS checks on a real loopback socket, for this machine's kernel: a TLS session between
//! nvmf-tls's server (non-blocking, stepped as the reactor steps it) and client (blocking) with
//! kernel TLS wanted on one side, both or neither, or refused by a simulated kernel in one
//! direction; 1 MiB each way (the server echoes what it read), then close_notify. And a client
//! with OpenSSL's records that sends a KeyUpdate mid-stream.
//!
//! Where the kernel has the `tls` module, the sides that want kTLS must get it and the KeyUpdate
//! must end the server's session with an error that names it; where it has none, every session
//! must fall back to OpenSSL's records with the reason given, and the KeyUpdate is taken by
//! OpenSSL. `--require-kernel` fails if this kernel takes no kTLS (the testbed guest's check,
//! `tests/interop/ktls.sh`). nvmf-tls's `tests/ktls.rs` runs the same checks in the suite.
//!
//! Run: `cargo run -p nvmf-tls --example ktls_check [-- --require-kernel]`

use nvmf_core::tls::psk::ConfiguredPsk;
use nvmf_tls::{accept, connect, Handshake, Ktls, TlsStream};
use std::io::{self, IoSlice};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
const KEY384: &str =
    "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
const SUB: &str = "nqn.2024-01.io.nvmfd:ktls";
const LEN: usize = 1 << 20;

/// Whether this kernel takes the `tls` ULP on a TCP socket (it loads the module on demand).
pub fn kernel_has_ktls() -> bool {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    // SAFETY: setsockopt on a live socket with a 3-byte value.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            31,
            b"tls".as_ptr().cast(),
            3,
        )
    };
    r == 0
}

fn wait(fd: i32, write: bool, deadline: Instant) -> Result<(), String> {
    if Instant::now() >= deadline {
        return Err("timed out".into());
    }
    let mut p = libc::pollfd {
        fd,
        events: if write { libc::POLLOUT } else { libc::POLLIN },
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 100) };
    Ok(())
}

/// What one session showed.
#[derive(Debug)]
pub struct Seen {
    pub server: (bool, bool),
    pub client: (bool, bool),
    pub server_fallback: Option<String>,
    pub client_fallback: Option<String>,
    pub cipher: String,
    /// The server's read ended with this error (None: it read all and saw close_notify).
    pub server_error: Option<String>,
}

/// What the server side saw: (kTLS receive, transmit), fallback reason, read error, cipher.
type Served = ((bool, bool), Option<String>, Option<String>, String);

/// Server: handshake, read LEN bytes, echo them, then read until close_notify (Ok(0)).
fn serve(listener: TcpListener, mode: Ktls, key: &'static str) -> Result<Served, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let psk = ConfiguredPsk::parse(key)
        .unwrap()
        .tls_psk_v1(HOST, SUB)
        .unwrap();
    let ctx = nvmf_tls::server_context(
        move |id| {
            (id == psk.identity)
                .then(|| psk.clone())
                .into_iter()
                .collect()
        },
        mode,
    )
    .map_err(|e| e.to_string())?;
    let (sock, _) = listener.accept().map_err(|e| e.to_string())?;
    sock.set_nonblocking(true).unwrap();
    let fd = sock.as_raw_fd();
    let mut hs = accept(&ctx, fd);
    let mut tls: TlsStream = loop {
        match hs {
            Handshake::Done(t) => break t,
            Handshake::Failed(why) => return Err(why),
            Handshake::Pending(p) => {
                wait(fd, p.wants_write(), deadline)?;
                hs = p.resume();
            }
        }
    };
    let offload = tls.kernel_tls();
    let fallback = tls.ktls_fallback().map(str::to_string);
    let cipher = tls.cipher().to_string();
    let mut data = vec![0u8; LEN];
    let mut got = 0;
    let read_err = |e: io::Error| {
        Ok((
            offload,
            fallback.clone(),
            Some(e.to_string()),
            cipher.clone(),
        ))
    };
    while got < LEN {
        match tls.read(&mut data[got..]) {
            Ok(0) => return Err(format!("early EOF after {got} bytes")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(fd, false, deadline)?,
            Err(e) => return read_err(e),
        }
    }
    let mut sent = 0;
    while sent < LEN {
        let rest = &data[sent..];
        let a = rest.len().min(100);
        let iov = [IoSlice::new(&rest[..a]), IoSlice::new(&rest[a..])];
        match tls.write_gather(&iov) {
            Ok(0) => return Err("write_gather took nothing".into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(fd, true, deadline)?,
            Err(e) => return Err(format!("server write: {e}")),
        }
    }
    let mut scratch = [0u8; 4096];
    loop {
        match tls.read(&mut scratch) {
            Ok(0) => break,
            Ok(n) => return Err(format!("{n} unexpected bytes before close_notify")),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(fd, false, deadline)?,
            Err(e) => return read_err(e),
        }
    }
    Ok((offload, fallback, None, cipher))
}

fn write_all(c: &mut TlsStream, mut b: &[u8]) -> Result<(), String> {
    while !b.is_empty() {
        let n = c
            .write_gather(&[IoSlice::new(b)])
            .map_err(|e| format!("client write: {e}"))?;
        if n == 0 {
            return Err("client write took nothing".into());
        }
        b = &b[n..];
    }
    Ok(())
}

/// One session: server in `server`, client in `client` mode; with `key_update`, the client
/// (OpenSSL records) sends a KeyUpdate after the first half of its data.
pub fn session(
    server: Ktls,
    client: Ktls,
    key: &'static str,
    key_update: bool,
) -> Result<Seen, String> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let srv = std::thread::spawn(move || serve(listener, server, key));
    let psk = ConfiguredPsk::parse(key)
        .unwrap()
        .tls_psk_v1(HOST, SUB)
        .unwrap();
    let cctx = nvmf_tls::client_context(psk, client).map_err(|e| e.to_string())?;
    let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sock.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut c = connect(&cctx, sock.as_raw_fd())?;
    let client_offload = c.kernel_tls();
    let client_fallback = c.ktls_fallback().map(str::to_string);
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 13 + i / 4096) as u8).collect();
    let half = LEN / 2;
    let mut res = write_all(&mut c, &pattern[..half]);
    if res.is_ok() && key_update {
        res = c.key_update().map_err(|e| e.to_string());
    }
    if res.is_ok() {
        res = write_all(&mut c, &pattern[half..]);
    }
    let mut echo = vec![0u8; LEN];
    let mut got = 0;
    if res.is_ok() {
        while got < LEN {
            match c.read(&mut echo[got..]) {
                Ok(0) => {
                    res = Err(format!("client: early EOF after {got} bytes"));
                    break;
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    res = Err(format!("client read: {e}"));
                    break;
                }
            }
        }
    }
    if res.is_ok() && echo != pattern {
        res = Err("the echo differs from what was sent".into());
    }
    c.shutdown();
    drop(sock);
    let (server_offload, server_fallback, server_error, cipher) = srv
        .join()
        .map_err(|_| "server thread panicked".to_string())??;
    if server_error.is_none() {
        res?;
    }
    Ok(Seen {
        server: server_offload,
        client: client_offload,
        server_fallback,
        client_fallback,
        cipher,
        server_error,
    })
}

/// Runs every check; `kernel` says whether this kernel takes kTLS. Returns the failures.
pub fn run_checks(kernel: bool) -> Vec<String> {
    let mut fails = Vec::new();
    let mut check = |name: &str, r: Result<(), String>| match r {
        Ok(()) => println!("PASS {name}"),
        Err(e) => {
            println!("FAIL {name}: {e}");
            fails.push(format!("{name}: {e}"));
        }
    };
    let both = if kernel { (true, true) } else { (false, false) };
    let expect = |s: &Seen, server: (bool, bool), client: (bool, bool)| -> Result<(), String> {
        if s.server != server || s.client != client {
            return Err(format!(
                "offload server {:?} client {:?}, expected {server:?} {client:?}: {s:?}",
                s.server, s.client
            ));
        }
        if let Some(e) = &s.server_error {
            return Err(format!("server: {e}"));
        }
        Ok(())
    };
    let no_module = |f: &Option<String>| -> Result<(), String> {
        match f {
            Some(w) if w.contains("tls module") || w.contains("TCP_ULP") => Ok(()),
            other => Err(format!(
                "fallback reason {other:?} does not name the missing tls module"
            )),
        }
    };
    for (key, name) in [(KEY, "AES-128-GCM"), (KEY384, "AES-256-GCM")] {
        check(
            &format!("both sides kTLS auto, {name}"),
            (|| {
                let s = session(Ktls::Auto, Ktls::Auto, key, false)?;
                expect(&s, both, both)?;
                if kernel {
                    if s.server_fallback.is_some() || s.client_fallback.is_some() {
                        return Err(format!("fallback given although offloaded: {s:?}"));
                    }
                } else {
                    no_module(&s.server_fallback)?;
                    no_module(&s.client_fallback)?;
                }
                println!("  cipher {}", s.cipher);
                Ok(())
            })(),
        );
    }
    check(
        "kTLS server, OpenSSL client",
        (|| {
            let s = session(Ktls::Auto, Ktls::Off, KEY, false)?;
            expect(&s, both, (false, false))?;
            if s.client_fallback.is_some() {
                return Err("a client with kTLS off gave a fallback reason".into());
            }
            Ok(())
        })(),
    );
    check(
        "OpenSSL server, kTLS client",
        (|| {
            let s = session(Ktls::Off, Ktls::Auto, KEY, false)?;
            expect(&s, (false, false), both)
        })(),
    );
    check(
        "kernel refuses transmit keys: receive by the kernel, send by OpenSSL",
        (|| {
            let s = session(Ktls::RefuseTx, Ktls::Auto, KEY, false)?;
            expect(&s, (kernel, false), both)?;
            if kernel
                && !s
                    .server_fallback
                    .as_deref()
                    .unwrap_or("")
                    .contains("transmit")
            {
                return Err(format!(
                    "fallback {:?} does not say transmit",
                    s.server_fallback
                ));
            }
            Ok(())
        })(),
    );
    check(
        "kernel refuses receive keys: all by OpenSSL",
        (|| {
            let s = session(Ktls::RefuseRx, Ktls::Auto, KEY, false)?;
            expect(&s, (false, false), both)?;
            match &s.server_fallback {
                Some(_) => Ok(()),
                None => Err("no fallback reason".into()),
            }
        })(),
    );
    check(
        "KeyUpdate from an OpenSSL client",
        (|| {
            let s = session(Ktls::Auto, Ktls::Off, KEY, true)?;
            if kernel {
                match &s.server_error {
                    Some(e) if e.contains("KeyUpdate") => {
                        println!("  server: {e}");
                        Ok(())
                    }
                    other => Err(format!(
                        "a kTLS server must end the session naming the KeyUpdate, got {other:?}"
                    )),
                }
            } else {
                expect(&s, (false, false), (false, false))
            }
        })(),
    );
    fails
}

#[allow(dead_code)]
fn main() {
    let require = std::env::args().any(|a| a == "--require-kernel");
    let kernel = kernel_has_ktls();
    println!(
        "kernel TLS on this kernel: {}",
        if kernel { "yes" } else { "no" }
    );
    if require && !kernel {
        eprintln!("--require-kernel: this kernel does not take the tls ULP (modprobe tls?)");
        std::process::exit(2);
    }
    let fails = run_checks(kernel);
    if fails.is_empty() {
        println!(
            "ktls_check: all passed ({})",
            if kernel { "kernel TLS" } else { "fallback" }
        );
    } else {
        eprintln!("ktls_check: {} failed", fails.len());
        std::process::exit(1);
    }
}
