//! The record layer on loopback as the reactor and the host use it: the server handshake stepped on
//! a non-blocking socket (poll(2) between steps), the client handshake on a blocking socket, then
//! 4 MiB each way through `write_gather` (several slices per call, partial sends under a full socket
//! buffer, a `read` between a blocked write and its retry) and `read`, the accepted identity
//! reported, a clear-text ICReq refused by name.

use nvmf_core::tls::psk::ConfiguredPsk;
use nvmf_tls::{accept, connect, Handshake, TlsStream};
use std::io::{self, IoSlice};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
const SUB: &str = "nqn.2024-01.io.nvmfd:stream";
const LEN: usize = 4 << 20;

fn wait(fd: i32, write: bool, deadline: Instant) {
    assert!(Instant::now() < deadline, "timed out");
    let mut p = libc::pollfd {
        fd,
        events: if write { libc::POLLOUT } else { libc::POLLIN },
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 100) };
}

/// Server side: handshake, then echo LEN bytes back, all non-blocking.
fn serve(listener: TcpListener) -> Result<(String, String), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let psk = ConfiguredPsk::parse(KEY)
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
        nvmf_tls::Ktls::Off,
    )
    .map_err(|e| e.to_string())?;
    let (sock, _) = listener.accept().unwrap();
    sock.set_nonblocking(true).unwrap();
    let fd = sock.as_raw_fd();
    // A small send buffer: the echo's 64 KiB writes leave in several sends, and block between.
    let small: libc::c_int = 8192;
    // SAFETY: setsockopt with a pointer to a live c_int and its size.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&small as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let mut hs = accept(&ctx, fd);
    let mut tls: TlsStream = loop {
        match hs {
            Handshake::Done(t) => break t,
            Handshake::Failed(why) => return Err(why),
            Handshake::Pending(p) => {
                wait(fd, p.wants_write(), deadline);
                hs = p.resume();
            }
        }
    };
    let id = tls.psk_identity().unwrap_or("").to_string();
    let mut data = vec![0u8; LEN];
    let mut got = 0;
    while got < LEN {
        assert!(Instant::now() < deadline, "server read timed out");
        match tls.read(&mut data[got..]) {
            Ok(0) => return Err("early EOF".into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(fd, false, deadline),
            Err(e) => return Err(e.to_string()),
        }
    }
    let mut sent = 0;
    while sent < LEN {
        assert!(Instant::now() < deadline, "server write timed out");
        // Three slices per call, as the connection's send queue hands them out.
        let rest = &data[sent..];
        let a = rest.len().min(100);
        let b = (rest.len() - a).min(30_000);
        let iov = [
            IoSlice::new(&rest[..a]),
            IoSlice::new(&rest[a..a + b]),
            IoSlice::new(&rest[a + b..]),
        ];
        match tls.write_gather(&iov) {
            Ok(0) => return Err("write_gather took nothing".into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait(fd, true, deadline);
                // As the reactor does: a read between the blocked write and its retry (it
                // sends what is left of the blocked write's records; the retry must not
                // encrypt those bytes again).
                let mut scratch = [0u8; 64];
                match tls.read(&mut scratch) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Ok(0) => return Err("early EOF".into()),
                    Ok(_) => return Err("data from the client during the echo".into()),
                    Err(e) => return Err(e.to_string()),
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok((id, tls.cipher().to_string()))
}

#[test]
fn nonblocking_server_echoes_through_gathered_records() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || serve(listener));
    let psk = ConfiguredPsk::parse(KEY)
        .unwrap()
        .tls_psk_v1(HOST, SUB)
        .unwrap();
    let identity = psk.identity.clone();
    let cctx = nvmf_tls::client_context(psk, nvmf_tls::Ktls::Off).unwrap();
    let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut c = connect(&cctx, sock.as_raw_fd()).expect("client handshake");
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
    // Write the whole pattern (blocking socket), then read the echo.
    let writer = {
        let mut sent = 0;
        while sent < LEN {
            let n = c.write_gather(&[IoSlice::new(&pattern[sent..])]).unwrap();
            assert!(n > 0, "write_gather took nothing");
            sent += n;
        }
        sent
    };
    assert_eq!(writer, LEN);
    // Records leave gathered: one send per staged write (64 KiB, four records), not one each.
    let records = LEN.div_ceil(16384) as u64;
    assert!(
        c.send_calls() <= records / 2,
        "{} sends for {records} records",
        c.send_calls()
    );
    let mut back = vec![0u8; LEN];
    let mut got = 0;
    while got < LEN {
        let n = c.read(&mut back[got..]).unwrap();
        assert!(n > 0, "EOF after {got} bytes");
        got += n;
    }
    assert!(back == pattern, "echo differs");
    let (seen, cipher) = server.join().unwrap().unwrap();
    assert_eq!(seen, identity);
    assert_eq!(cipher, "TLS_AES_128_GCM_SHA256");
    assert_eq!(c.cipher(), "TLS_AES_128_GCM_SHA256");
}

#[test]
fn clear_text_icreq_is_refused_with_a_reason() {
    use std::io::Write;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || serve(listener));
    let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // An NVMe/TCP ICReq: type 0x00, hlen 128, plen 128.
    let mut icreq = [0u8; 128];
    icreq[2] = 128;
    icreq[4] = 128;
    sock.write_all(&icreq).unwrap();
    let why = server.join().unwrap().unwrap_err();
    assert!(why.starts_with("TLS handshake:"), "{why}");
}
