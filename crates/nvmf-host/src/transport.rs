//! transport.rs — one NVMe/TCP connection, host side: TCP connect, the
//! ICReq/ICResp exchange (digests, alignment, MAXH2CDATA), and the byte
//! pumps around the socket: a send buffer that collects every PDU produced in
//! one loop turn and goes out in as few `write` calls as possible, and a large
//! receive buffer that is filled in big reads and parsed PDU by PDU with the
//! zero-copy decoder of `nvmf-wire`. Knows nothing about commands or slots
//! (that is `queue.rs`).
//!
//! After the handshake the socket is non-blocking; `wait` sleeps in poll(2)
//! until it is readable (or writable while output is pending).
//!
//! TLS (`--tls-key`): with a PSK, a TLS 1.3 handshake (nvmf-tls, OpenSSL) runs
//! right after the TCP connect, before the ICReq; from then on every read
//! decrypts into the same buffers (C2HData payloads still land directly in the
//! command buffers) and every write goes out as TLS records. The clear-text
//! path is unchanged but for one `Option` check per read/write call.

use crate::error::{Error, Result};
use nvmf_wire::digest::crc32c;
use nvmf_wire::pdu::{self, DataHeader, DecodeOpts, Decoded, EncodeOpts, Pdu, PduType, Role};
use nvmf_wire::zerocopy::FromBytes;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// What the host asks for in its ICReq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransportParams {
    /// Ask for header digests.
    pub hdr_digest: bool,
    /// Ask for data digests.
    pub data_digest: bool,
    /// The queue runs over NVMe/RDMA (`rdma.rs`), not this TCP transport.
    pub rdma: bool,
}

/// What the controller granted in its ICResp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub hdr_digest: bool,
    pub data_digest: bool,
    /// Controller PDU data alignment (H2C data starts at (cpda+1)*4).
    pub cpda: u8,
    /// Largest H2CData payload the controller accepts.
    pub maxh2cdata: u32,
}

/// A connected NVMe/TCP socket with its buffers.
pub struct Transport {
    sock: TcpStream,
    /// The TLS session over `sock`, when the connection uses TLS.
    tls: Option<Box<nvmf_tls::TlsStream>>,
    peer: String,
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    /// Total length (from `rx_start`) the decoder asked for last time.
    rx_need: usize,
    tx: TxBuf,
    /// The peer closed its side; what was received before still counts.
    eof: bool,
    /// A C2HData payload being received straight into the command's buffer.
    direct: Option<Direct>,
    /// Largest single read into `rx` (smaller while large C2HData PDUs
    /// arrive, so their payloads go directly to the command buffers).
    read_cap: usize,
    dec: DecodeOpts,
    enc: EncodeOpts,
    neg: Negotiated,
}

/// Size of the ICReq/ICResp PDUs.
const IC_LEN: usize = 128;

fn resolve(addr: &str) -> Result<Vec<SocketAddr>> {
    let v: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Error::Connect {
            addr: addr.to_string(),
            err: e,
        })?
        .collect();
    if v.is_empty() {
        return Err(Error::Connect {
            addr: addr.to_string(),
            err: io::Error::new(io::ErrorKind::NotFound, "address resolves to nothing"),
        });
    }
    Ok(v)
}

impl Transport {
    /// Open a TCP connection to `addr` ("host:port"), exchange ICReq/ICResp,
    /// and return the connection in non-blocking mode. `max_data_len` is the
    /// largest data payload we accept in one received PDU (the largest
    /// transfer of any command we will send on this connection).
    pub fn connect(
        addr: &str,
        params: TransportParams,
        max_data_len: u32,
        timeout: Duration,
        tls: Option<(&nvmf_core::tls::psk::TlsPsk, nvmf_tls::Ktls)>,
    ) -> Result<Transport> {
        let mut last = None;
        let mut sock = None;
        for sa in resolve(addr)? {
            match TcpStream::connect_timeout(&sa, timeout) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let sock = sock.ok_or_else(|| Error::Connect {
            addr: addr.to_string(),
            err: last.unwrap_or_else(|| io::Error::other("no address")),
        })?;
        sock.set_nodelay(true)
            .map_err(|e| Error::io("setting TCP_NODELAY", e))?;

        let rx_len = (2 * (max_data_len as usize + 512)).max(512 * 1024);
        let tls = match tls {
            Some((psk, ktls)) => Some(Box::new(tls_handshake(&sock, psk, ktls, timeout)?)),
            None => None,
        };
        let mut t = Transport {
            sock,
            tls,
            peer: addr.to_string(),
            rx: vec![0u8; rx_len].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            rx_need: 0,
            tx: TxBuf::new(),
            eof: false,
            direct: None,
            read_cap: usize::MAX,
            dec: DecodeOpts {
                max_data_len,
                ..DecodeOpts::new(Role::Host)
            },
            enc: EncodeOpts::default(),
            neg: Negotiated {
                hdr_digest: false,
                data_digest: false,
                cpda: 0,
                maxh2cdata: 0,
            },
        };
        t.handshake(params, timeout)?;
        t.sock
            .set_nonblocking(true)
            .map_err(|e| Error::io("setting O_NONBLOCK", e))?;
        Ok(t)
    }

    fn handshake(&mut self, params: TransportParams, timeout: Duration) -> Result<()> {
        let mut req = Vec::with_capacity(IC_LEN);
        // HPDA 0 (no alignment needed), MAXR2T 0 (one R2T per command at a time).
        pdu::encode_ic_req(&mut req, 0, params.hdr_digest, params.data_digest, 0);
        self.sock
            .set_write_timeout(Some(timeout))
            .and_then(|_| self.sock.set_read_timeout(Some(timeout)))
            .map_err(|e| Error::io("setting socket timeouts", e))?;
        match &mut self.tls {
            Some(t) => write_all_tls(t, &req),
            None => self.sock.write_all(&req),
        }
        .map_err(|e| Error::io("sending ICReq", e))?;
        let deadline = Instant::now() + timeout;
        loop {
            match pdu::decode(&self.rx[..self.rx_end], &self.dec) {
                Ok(Decoded::Incomplete { need }) => {
                    if need > self.rx.len() {
                        return Err(Error::Protocol("ICResp too large".into()));
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout(format!(
                            "no ICResp from {} within {timeout:?}",
                            self.peer
                        )));
                    }
                    let buf = &mut self.rx[self.rx_end..];
                    let r = match &mut self.tls {
                        Some(t) => t.read(buf),
                        None => self.sock.read(buf),
                    };
                    let n = match r {
                        Ok(0) => {
                            return Err(Error::Closed(
                                " during the ICReq/ICResp exchange (not an NVMe/TCP target?)"
                                    .into(),
                            ))
                        }
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                            ) =>
                        {
                            return Err(Error::Timeout(format!(
                                "no ICResp from {} within {timeout:?}",
                                self.peer
                            )))
                        }
                        Err(e) => return Err(Error::io("receiving ICResp", e)),
                    };
                    self.rx_end += n;
                }
                Ok(Decoded::Pdu { len, pdu }) => {
                    match pdu {
                        Pdu::IcResp(r) => {
                            if r.pfv() != pdu::PFV_1_0 {
                                return Err(Error::Protocol(format!(
                                    "ICResp PDU format version {} (expected 0)",
                                    r.pfv()
                                )));
                            }
                            if r.maxh2cdata() < 4096 || r.maxh2cdata() % 4 != 0 {
                                return Err(Error::Protocol(format!(
                                    "ICResp MAXH2CDATA {} is invalid",
                                    r.maxh2cdata()
                                )));
                            }
                            if params.hdr_digest && !r.hdgst_enabled() {
                                return Err(Error::Protocol(
                                    "header digest requested but not enabled by the target".into(),
                                ));
                            }
                            if params.data_digest && !r.ddgst_enabled() {
                                return Err(Error::Protocol(
                                    "data digest requested but not enabled by the target".into(),
                                ));
                            }
                            if (r.hdgst_enabled() && !params.hdr_digest)
                                || (r.ddgst_enabled() && !params.data_digest)
                            {
                                return Err(Error::Protocol(
                                    "target enabled a digest that was not requested".into(),
                                ));
                            }
                            if r.cpda() > 31 {
                                return Err(Error::Protocol(format!(
                                    "ICResp CPDA {} out of range",
                                    r.cpda()
                                )));
                            }
                            self.neg = Negotiated {
                                hdr_digest: r.hdgst_enabled(),
                                data_digest: r.ddgst_enabled(),
                                cpda: r.cpda(),
                                maxh2cdata: r.maxh2cdata(),
                            };
                        }
                        Pdu::C2HTermReq { hdr, .. } => {
                            return Err(Error::Terminated {
                                fes: hdr.fes(),
                                fei: hdr.fei(),
                                reason: fes_reason(hdr.fes()),
                            })
                        }
                        other => {
                            return Err(Error::Protocol(format!(
                                "expected ICResp, got {:?}",
                                other.pdu_type()
                            )))
                        }
                    }
                    self.rx_start = len;
                    if self.rx_start == self.rx_end {
                        self.rx_start = 0;
                        self.rx_end = 0;
                    }
                    break;
                }
                Err(e) => {
                    return Err(Error::Protocol(format!("bad ICResp: {e}")));
                }
            }
        }
        self.dec.hdgst = self.neg.hdr_digest;
        self.dec.ddgst = self.neg.data_digest;
        self.enc = EncodeOpts {
            hdgst: self.neg.hdr_digest,
            ddgst: self.neg.data_digest,
            pda: self.neg.cpda,
        };
        Ok(())
    }

    /// The ICResp parameters.
    pub fn negotiated(&self) -> Negotiated {
        self.neg
    }
    /// Encoder settings for PDUs we send.
    pub fn encode_opts(&self) -> EncodeOpts {
        self.enc
    }
    /// "host:port" we connected to.
    pub fn peer(&self) -> &str {
        &self.peer
    }
    /// The socket's file descriptor (for a caller's own poll over many queues).
    pub fn raw_fd(&self) -> i32 {
        self.sock.as_raw_fd()
    }

    /// The send buffer: append PDUs, then `flush`.
    pub fn tx(&mut self) -> &mut TxBuf {
        &mut self.tx
    }
    /// Output queued but not yet written to the socket.
    /// Turns zero-copy sends of H2C payloads of `threshold` bytes or more
    /// on (`SO_ZEROCOPY`; clear text only) for a queue of `slots` slots.
    pub fn enable_zerocopy(&mut self, threshold: usize, always: bool, slots: usize) -> Result<()> {
        if self.tls.is_some() {
            return Err(Error::InvalidArg(
                "zero-copy sends are for clear-text NVMe/TCP (TLS builds records)".into(),
            ));
        }
        nvmf_zerocopy::enable(self.sock.as_raw_fd())
            .map_err(|e| Error::io("setting SO_ZEROCOPY", e))?;
        self.tx.enable_zerocopy(threshold, always, slots);
        Ok(())
    }

    /// See [`TxBuf::zc_unreported`].
    pub fn zc_unreported(&self, slot: usize) -> Option<u32> {
        self.tx.zc_unreported(slot)
    }

    /// See [`TxBuf::zc_stats`].
    pub fn zc_stats(&self) -> (u64, u64, bool) {
        self.tx.zc_stats()
    }

    pub fn tx_pending(&self) -> bool {
        self.tx.pending()
    }

    /// Write as much pending output as the socket takes without blocking,
    /// with gather writes (sendmsg, MSG_NOSIGNAL) over the queued segments. Returns true
    /// when everything has been written.
    pub fn flush(&mut self) -> Result<bool> {
        let r = match &mut self.tls {
            Some(t) => self.tx.write_tls(t),
            None => self.tx.write_to(self.sock.as_raw_fd()),
        };
        match r {
            Ok(done) => Ok(done),
            Err(e) if is_reset(&e) => Err(Error::Closed(format!(" ({e})"))),
            Err(e) if e.kind() == io::ErrorKind::WriteZero => {
                Err(Error::Closed(" while sending".into()))
            }
            Err(e) => Err(Error::io("sending to the target", e)),
        }
    }

    /// One non-blocking read into the receive buffer (as much as fits).
    /// Returns the number of bytes read, 0 if nothing was available. When
    /// the peer closes, `eof()` turns true (parse what was received first);
    /// reading again after that is `Error::Closed`.
    pub fn recv(&mut self) -> Result<usize> {
        if self.eof {
            return Err(Error::Closed(String::new()));
        }
        if let Some(d) = &mut self.direct {
            if d.got < d.len {
                // SAFETY: `c2h_place` promised `len` writable bytes at `dst`
                // that stay valid until the PDU is complete.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(d.dst.add(d.got), d.len - d.got) };
                return match read_some(&mut self.sock, &mut self.tls, dst)? {
                    None => {
                        self.eof = true;
                        Ok(0)
                    }
                    Some(n) => {
                        d.got += n;
                        Ok(n)
                    }
                };
            }
        }
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        } else if self.rx_start > 0
            && (self.rx.len() - self.rx_end < 64 * 1024
                || self.rx.len() - self.rx_start < self.rx_need)
        {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        if self.rx_end == self.rx.len() {
            // Full of complete PDUs not parsed yet; the caller parses first.
            return Ok(0);
        }
        let end = self.rx.len().min(self.rx_end.saturating_add(self.read_cap));
        match read_some(
            &mut self.sock,
            &mut self.tls,
            &mut self.rx[self.rx_end..end],
        )? {
            None => {
                self.eof = true;
                Ok(0)
            }
            Some(n) => {
                self.rx_end += n;
                Ok(n)
            }
        }
    }

    /// The peer has closed the connection.
    pub fn eof(&self) -> bool {
        self.eof
    }

    /// Decode every complete PDU in the receive buffer and hand each to `f`
    /// together with the send queue and the encoder settings (for replies
    /// such as H2CData). A C2HTermReq ends the connection with
    /// `Error::Terminated`; a malformed PDU makes us send an H2CTermReq and
    /// fail with `Error::Protocol`. Returns the number of PDUs handled.
    pub fn parse<S: RxSink>(&mut self, sink: &mut S) -> Result<usize> {
        let mut count = 0;
        loop {
            if let Some(d) = &self.direct {
                if d.got < d.len {
                    return Ok(count);
                }
                let digest_ok = if d.ddgst {
                    if self.rx_end - self.rx_start < 4 {
                        self.rx_need = 4;
                        return Ok(count);
                    }
                    let at = self.rx_start;
                    let got = u32::from_le_bytes(self.rx[at..at + 4].try_into().expect("4"));
                    self.rx_start += 4;
                    // SAFETY: as in `recv`; the whole payload is there now.
                    let data = unsafe { std::slice::from_raw_parts(d.dst, d.len) };
                    got == crc32c(data)
                } else {
                    true
                };
                let hdr = d.hdr;
                self.direct = None;
                self.rx_need = 0;
                count += 1;
                let r = sink.on_event(
                    RxEvent::C2HPlaced {
                        hdr: &hdr,
                        digest_ok,
                    },
                    &mut self.tx,
                    &self.enc,
                );
                self.fail_on_protocol_error(r)?;
                continue;
            }
            let buf = &self.rx[self.rx_start..self.rx_end];
            match pdu::decode(buf, &self.dec) {
                Ok(Decoded::Incomplete { need }) => {
                    if need > self.rx.len() {
                        let msg = format!(
                            "PDU of {need} bytes exceeds the {} byte receive buffer",
                            self.rx.len()
                        );
                        self.terminate(pdu::FES_DATA_LIMIT_EXCEEDED, 0);
                        return Err(Error::Protocol(msg));
                    }
                    self.rx_need = need;
                    if self.try_direct(sink)? {
                        continue;
                    }
                    return Ok(count);
                }
                Ok(Decoded::Pdu { len, pdu }) => {
                    if let Pdu::C2HTermReq { hdr, .. } = pdu {
                        return Err(Error::Terminated {
                            fes: hdr.fes(),
                            fei: hdr.fei(),
                            reason: fes_reason(hdr.fes()),
                        });
                    }
                    if let Pdu::C2HData { data, .. } = pdu {
                        self.read_cap = if data.len() >= DIRECT_MIN {
                            DIRECT_READ_CAP
                        } else {
                            usize::MAX
                        };
                    }
                    let r = sink.on_event(RxEvent::Pdu(&pdu), &mut self.tx, &self.enc);
                    self.rx_start += len;
                    self.rx_need = 0;
                    count += 1;
                    self.fail_on_protocol_error(r)?;
                }
                Err(e) => {
                    let buf = &self.rx[self.rx_start..self.rx_end];
                    let hdr = pdu::offending_header(buf).to_vec();
                    let mut out = Vec::new();
                    pdu::encode_term_req(&mut out, Role::Host, e.fes(), e.fei(), &hdr);
                    self.send_now(&out);
                    return Err(Error::Protocol(format!(
                        "malformed PDU from the target: {e}"
                    )));
                }
            }
        }
    }

    fn fail_on_protocol_error(&mut self, r: Result<()>) -> Result<()> {
        if let Err(e) = r {
            if let Error::Protocol(_) = e {
                self.terminate(pdu::FES_PDU_SEQUENCE_ERROR, 0);
            }
            return Err(e);
        }
        Ok(())
    }

    /// The front of `rx` is an incomplete PDU. If it is a C2HData PDU with a
    /// large payload whose header is all here, check the header, ask the
    /// sink where the payload goes, move what is buffered there and switch
    /// to receiving the rest straight into it. Returns true if it did.
    fn try_direct<S: RxSink>(&mut self, sink: &mut S) -> Result<bool> {
        let buf = &self.rx[self.rx_start..self.rx_end];
        if buf.len() < 8 || buf[0] != PduType::C2HData as u8 {
            return Ok(false);
        }
        let (flags, hlen, pdo) = (buf[1], buf[2] as usize, buf[3] as usize);
        let plen = u32::from_le_bytes(buf[4..8].try_into().expect("4")) as usize;
        let hd = if self.dec.hdgst { 4 } else { 0 };
        let ddgst = flags & pdu::DDGSTF != 0;
        let dd = if ddgst { 4 } else { 0 };
        // Anything unusual goes the normal way (the decoder reports it once
        // the PDU is complete).
        if hlen != PduType::C2HData.hlen()
            || (flags & pdu::HDGSTF != 0) != self.dec.hdgst
            || (ddgst && !self.dec.ddgst)
            || (self.dec.ddgst && !ddgst)
            || pdo < hlen + hd
            || plen < pdo + dd
            || buf.len() < pdo
        {
            return Ok(false);
        }
        let len = plen - pdo - dd;
        if len < DIRECT_MIN || len > self.dec.max_data_len as usize {
            return Ok(false);
        }
        if hd > 0 {
            let want = crc32c(&buf[..hlen]);
            if u32::from_le_bytes(buf[hlen..hlen + 4].try_into().expect("4")) != want {
                let hdr = pdu::offending_header(buf).to_vec();
                let mut out = Vec::new();
                pdu::encode_term_req(&mut out, Role::Host, pdu::FES_HEADER_DIGEST_ERROR, 0, &hdr);
                self.send_now(&out);
                return Err(Error::Protocol("header digest mismatch in C2HData".into()));
            }
        }
        let hdr = DataHeader::read_from_bytes(&buf[..hlen]).expect("24 bytes");
        if hdr.datal() as usize != len || (hdr.success() && !hdr.last()) {
            return Ok(false);
        }
        let dst = match sink.c2h_place(&hdr) {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(false),
            Err(e) => {
                self.fail_on_protocol_error(Err(e))?;
                unreachable!("fail_on_protocol_error returns the error");
            }
        };
        let have = (buf.len() - pdo).min(len);
        // SAFETY: `c2h_place` promised `len` writable bytes at `dst`.
        unsafe { std::ptr::copy_nonoverlapping(buf[pdo..].as_ptr(), dst, have) };
        self.rx_start += pdo + have;
        self.rx_need = 0;
        self.read_cap = DIRECT_READ_CAP;
        self.direct = Some(Direct {
            hdr,
            dst,
            len,
            got: have,
            ddgst,
        });
        Ok(true)
    }

    /// Best effort: tell the target we are giving up on the connection.
    fn terminate(&mut self, fes: u16, fei: u32) {
        let mut out = Vec::new();
        pdu::encode_term_req(&mut out, Role::Host, fes, fei, &[]);
        self.send_now(&out);
    }

    fn send_now(&mut self, bytes: &[u8]) {
        // Pending output first so the termination is the last thing sent.
        let _ = self.flush();
        self.tx.clear();
        let _ = self.sock.set_nonblocking(false);
        let _ = self
            .sock
            .set_write_timeout(Some(Duration::from_millis(100)));
        let _ = match &mut self.tls {
            Some(t) => write_all_tls(t, bytes),
            None => self.sock.write_all(bytes),
        };
        let _ = self.sock.set_nonblocking(true);
    }

    /// Sleep until the socket is readable, or writable while output is
    /// pending, or `timeout` passes (None = forever). Returns false on timeout.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        if self.has_buffered() {
            return Ok(true);
        }
        let mut pfd = libc::pollfd {
            fd: self.raw_fd(),
            events: self.poll_events(),
            revents: 0,
        };
        let ms = timeout_ms(timeout);
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(true);
            }
            return Err(Error::io("poll", e));
        }
        Ok(r > 0)
    }

    /// poll(2) events this connection waits for.
    pub fn poll_events(&self) -> i16 {
        if self.tx_pending() {
            libc::POLLIN | libc::POLLOUT
        } else {
            libc::POLLIN
        }
    }

    /// Bytes TLS already decrypted and nobody read yet (the socket may show
    /// no event for them).
    pub fn has_buffered(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.has_buffered())
    }

    /// Close the TCP connection (both directions).
    pub fn shutdown(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// Milliseconds for poll(2) (-1 = forever), rounding up.
pub(crate) fn timeout_ms(t: Option<Duration>) -> i32 {
    match t {
        None => -1,
        Some(d) => {
            let us = d.as_micros();
            us.div_ceil(1000).min(i32::MAX as u128) as i32
        }
    }
}

fn is_reset(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// Human text for a Fatal Error Status.
pub fn fes_reason(fes: u16) -> &'static str {
    match fes {
        pdu::FES_INVALID_HEADER_FIELD => "invalid PDU header field",
        pdu::FES_PDU_SEQUENCE_ERROR => "PDU sequence error",
        pdu::FES_HEADER_DIGEST_ERROR => "header digest error",
        pdu::FES_DATA_OUT_OF_RANGE => "data transfer out of range",
        pdu::FES_DATA_LIMIT_EXCEEDED => "data transfer limit exceeded",
        pdu::FES_UNSUPPORTED_PARAMETER => "unsupported parameter",
        _ => "unknown fatal error",
    }
}

/// C2HData payloads at least this large are received straight into the
/// command's buffer when they are not already buffered whole.
pub const DIRECT_MIN: usize = 16 * 1024;
/// Read size into the receive buffer while large C2HData PDUs arrive: a
/// header and a little more, so most of each payload lands directly.
const DIRECT_READ_CAP: usize = 4096;

/// A C2HData payload being received directly into a command buffer.
#[derive(Debug, Clone, Copy)]
struct Direct {
    hdr: DataHeader,
    dst: *mut u8,
    len: usize,
    got: usize,
    ddgst: bool,
}

// SAFETY: `dst` points into a buffer owned by whoever owns the Transport
// (the queue), valid until the PDU is complete (the `c2h_place` contract).
unsafe impl Send for Direct {}

/// What `Transport::parse` hands to its sink.
pub enum RxEvent<'a, 'p> {
    /// A whole PDU, borrowed from the receive buffer.
    Pdu(&'a Pdu<'p>),
    /// A C2HData PDU whose payload was received straight into the place
    /// `c2h_place` gave for it.
    C2HPlaced {
        hdr: &'a DataHeader,
        digest_ok: bool,
    },
}

/// The consumer of received PDUs (the queue).
pub trait RxSink {
    /// Handle one PDU; may queue replies (H2CData) on `tx`.
    fn on_event(&mut self, ev: RxEvent<'_, '_>, tx: &mut TxBuf, enc: &EncodeOpts) -> Result<()>;
    /// Where to put the `datal` payload bytes of this C2HData PDU, or None
    /// to get it as a normal `RxEvent::Pdu`. The memory must stay valid and
    /// untouched by others until the matching `C2HPlaced` event.
    fn c2h_place(&mut self, hdr: &DataHeader) -> Result<Option<*mut u8>>;
}

/// The TLS 1.3 client handshake on the still blocking `sock` (its timeouts
/// bound it), with the PSK and identity of `psk`.
fn tls_handshake(
    sock: &TcpStream,
    psk: &nvmf_core::tls::psk::TlsPsk,
    ktls: nvmf_tls::Ktls,
    timeout: Duration,
) -> Result<nvmf_tls::TlsStream> {
    sock.set_write_timeout(Some(timeout))
        .and_then(|_| sock.set_read_timeout(Some(timeout)))
        .map_err(|e| Error::io("setting socket timeouts", e))?;
    let ctx = nvmf_tls::client_context(psk.clone(), ktls).map_err(|e| Error::Tls(e.to_string()))?;
    nvmf_tls::connect(&ctx, sock.as_raw_fd()).map_err(|e| {
        let hint = if e.contains("wrong version number") || e.contains("peer closed") {
            " (does the target require TLS on this port? a clear-text listener closes a TLS hello)"
        } else if e.contains("alert") || e.contains("binder") || e.contains("handshake failure") {
            " (the target refused the PSK: wrong key, or no key for this host NQN/subsystem)"
        } else {
            ""
        };
        Error::Tls(format!("{e}{hint}"))
    })
}

/// Writes all of `bytes` through TLS on a blocking socket.
fn write_all_tls(t: &mut nvmf_tls::TlsStream, bytes: &[u8]) -> io::Result<()> {
    let mut at = 0;
    while at < bytes.len() {
        match t.write_gather(&[io::IoSlice::new(&bytes[at..])]) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One non-blocking read (through TLS when `tls` is set); None at end of
/// file, Some(0) if nothing is there.
fn read_some(
    sock: &mut TcpStream,
    tls: &mut Option<Box<nvmf_tls::TlsStream>>,
    buf: &mut [u8],
) -> Result<Option<usize>> {
    loop {
        let r = match tls {
            Some(t) => t.read(buf),
            None => sock.read(buf),
        };
        match r {
            Ok(0) if !buf.is_empty() => return Ok(None),
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Some(0)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_reset(&e) => return Err(Error::Closed(format!(" ({e})"))),
            Err(e) => return Err(Error::io("receiving from the target", e)),
        }
    }
}

/// One piece of queued output.
#[derive(Debug, Clone, Copy)]
enum Seg {
    /// `TxBuf::buf[start..end]`.
    Own(usize, usize),
    /// Caller memory (a command's data buffer), sent without copying; the
    /// slot it belongs to ([`NO_SLOT`]: none).
    Ext(*const u8, usize, u16),
}

/// `Seg::Ext` owner of memory that is no slot's.
pub const NO_SLOT: u16 = u16::MAX;

/// Zero-copy sends (`MSG_ZEROCOPY`) of H2C data from the slot buffers: a
/// payload of `threshold` bytes or more goes out in a call of its own, and
/// the slot's last such call is remembered; the queue hands out the
/// command's completion only once the kernel has reported that call
/// (`zc_unreported`), so a slot buffer is never refilled while the kernel
/// may still read it.
#[derive(Debug)]
pub struct HostZc {
    threshold: usize,
    /// Never turned off (for measuring); else off once the kernel copies
    /// every call (loopback).
    always: bool,
    on: bool,
    tracker: nvmf_zerocopy::ZcTracker,
    /// Per slot: the last zero-copy call that carried its bytes.
    slot_seq: Vec<Option<u32>>,
}

/// Most iovecs handed to one sendmsg.
const MAX_IOV: usize = 256;

/// The send queue: PDU headers, digests and small payloads are appended to
/// an owned byte buffer; large payloads are queued by reference (`push_ext`)
/// and go out straight from the command's buffer. `flush` writes it all with
/// sendmsg, as few calls as the socket allows. Allocation-free once its
/// vectors have grown to the queue's working size.
pub struct TxBuf {
    buf: Vec<u8>,
    segs: Vec<Seg>,
    /// `buf[own_mark..]` is not yet covered by a segment.
    own_mark: usize,
    /// Next segment to write and bytes of it already written.
    idx: usize,
    off: usize,
    iov: Vec<libc::iovec>,
    zc: Option<HostZc>,
}

// SAFETY: the external segments point at memory the owner of the TxBuf
// keeps alive and unmodified until flushed (the contract of `push_ext`);
// nothing else is shared.
unsafe impl Send for TxBuf {}

impl Default for TxBuf {
    fn default() -> Self {
        TxBuf::new()
    }
}

impl TxBuf {
    pub fn new() -> TxBuf {
        TxBuf {
            buf: Vec::with_capacity(256 * 1024),
            segs: Vec::with_capacity(1024),
            own_mark: 0,
            idx: 0,
            off: 0,
            iov: Vec::with_capacity(MAX_IOV),
            zc: None,
        }
    }

    /// Send H2C payloads of `threshold` bytes or more zero-copy (the socket
    /// has `SO_ZEROCOPY`) for a queue of `slots` slots.
    pub fn enable_zerocopy(&mut self, threshold: usize, always: bool, slots: usize) {
        self.zc = Some(HostZc {
            threshold: threshold.max(1),
            always,
            on: true,
            tracker: nvmf_zerocopy::ZcTracker::default(),
            slot_seq: vec![None; slots],
        });
    }

    /// The zero-copy call that carried `slot`'s bytes and that the kernel
    /// has not reported yet, if any.
    #[inline]
    pub fn zc_unreported(&self, slot: usize) -> Option<u32> {
        let z = self.zc.as_ref()?;
        let seq = (*z.slot_seq.get(slot)?)?;
        (!z.tracker.is_done(seq)).then_some(seq)
    }

    /// Whether zero-copy call `seq` is reported done.
    #[inline]
    pub fn zc_done(&self, seq: u32) -> bool {
        self.zc.as_ref().is_none_or(|z| z.tracker.is_done(seq))
    }

    /// Zero-copy calls not yet reported.
    #[inline]
    pub fn zc_outstanding(&self) -> u32 {
        self.zc.as_ref().map_or(0, |z| z.tracker.outstanding())
    }

    /// Zero-copy calls made and reported copied by the kernel, and whether
    /// zero-copy is still on.
    pub fn zc_stats(&self) -> (u64, u64, bool) {
        self.zc
            .as_ref()
            .map_or((0, 0, false), |z| (z.tracker.calls, z.tracker.copied, z.on))
    }

    /// Reads the kernel's zero-copy reports from `fd`'s error queue; turns
    /// zero-copy off (unless `always`) once it copies every call.
    pub fn zc_drain(&mut self, fd: i32) -> io::Result<usize> {
        let Some(z) = self.zc.as_mut() else {
            return Ok(0);
        };
        if z.tracker.outstanding() == 0 {
            return Ok(0);
        }
        let t = &mut z.tracker;
        let n = nvmf_zerocopy::drain(fd, |lo, hi, copied| t.complete(lo, hi, copied))?;
        if !z.always && z.tracker.copies_everything() {
            z.on = false;
        }
        Ok(n)
    }

    /// The owned byte buffer, for appending encoded PDUs.
    #[inline]
    pub fn bytes(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Queue `len` bytes at `ptr` to be sent after what is queued so far.
    ///
    /// # Safety
    /// The memory must stay valid, and should stay unchanged, until `flush`
    /// has written it (or the TxBuf is cleared or dropped).
    #[inline]
    pub unsafe fn push_ext(&mut self, ptr: *const u8, len: usize) {
        self.push_slot_data(ptr, len, NO_SLOT);
    }

    /// As [`TxBuf::push_ext`], for bytes of slot `slot`'s buffer (which may
    /// go out zero-copy; see [`HostZc`]).
    ///
    /// # Safety
    /// As for `push_ext`; and the slot's buffer must stay unchanged until
    /// the kernel has reported the call ([`TxBuf::zc_unreported`]).
    #[inline]
    pub unsafe fn push_slot_data(&mut self, ptr: *const u8, len: usize, slot: u16) {
        self.close_own();
        if len > 0 {
            self.segs.push(Seg::Ext(ptr, len, slot));
        }
    }

    #[inline]
    fn close_own(&mut self) {
        if self.buf.len() > self.own_mark {
            self.segs.push(Seg::Own(self.own_mark, self.buf.len()));
            self.own_mark = self.buf.len();
        }
    }

    /// Anything left to write.
    #[inline]
    pub fn pending(&self) -> bool {
        self.idx < self.segs.len() || self.buf.len() > self.own_mark
    }

    /// Drop everything queued.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.segs.clear();
        self.own_mark = 0;
        self.idx = 0;
        self.off = 0;
    }

    /// Write to a non-blocking fd until done or it would block.
    /// As `write_to`, through a TLS session (records of up to 64 KiB of the
    /// queued segments each).
    fn write_tls(&mut self, t: &mut nvmf_tls::TlsStream) -> io::Result<bool> {
        self.close_own();
        while self.idx < self.segs.len() {
            let mut iov = [io::IoSlice::new(&[]); 32];
            let mut cnt = 0;
            let mut len = 0;
            for (k, seg) in self.segs[self.idx..].iter().take(iov.len()).enumerate() {
                let (p, n) = match *seg {
                    Seg::Own(a, b) => (self.buf[a..b].as_ptr(), b - a),
                    Seg::Ext(p, n, _) => (p, n),
                };
                let skip = if k == 0 { self.off } else { 0 };
                // SAFETY: as in `write_to`: our buffer, or the caller's memory
                // that push_ext promised stays valid until written.
                iov[k] =
                    io::IoSlice::new(unsafe { std::slice::from_raw_parts(p.add(skip), n - skip) });
                cnt = k + 1;
                len += n - skip;
                if len >= nvmf_tls::stream::STAGE_LEN {
                    break;
                }
            }
            let r = match t.write_gather(&iov[..cnt]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.advance(r);
        }
        self.clear();
        Ok(true)
    }

    /// `r` bytes from the front of the queued segments left.
    fn advance(&mut self, r: usize) {
        let mut left = r;
        while left > 0 {
            let n = match self.segs[self.idx] {
                Seg::Own(a, b) => b - a,
                Seg::Ext(_, n, _) => n,
            } - self.off;
            if left >= n {
                left -= n;
                self.idx += 1;
                self.off = 0;
            } else {
                self.off += left;
                left = 0;
            }
        }
    }

    /// Zero-copy on: where the next zero-copy call starts (the first slot
    /// payload of `threshold` bytes or more at or after `idx`).
    fn next_zc(&self) -> Option<usize> {
        let z = self.zc.as_ref().filter(|z| z.on && z.tracker.has_room())?;
        self.segs[self.idx..]
            .iter()
            .take(MAX_IOV)
            .enumerate()
            .find(|(k, seg)| {
                let skip = if *k == 0 { self.off } else { 0 };
                matches!(seg, Seg::Ext(_, n, slot) if *slot != NO_SLOT && n - skip >= z.threshold)
            })
            .map(|(k, _)| self.idx + k)
    }

    /// One zero-copy call of what is left of segment `idx` (a slot
    /// payload): Ok(None) when the socket is full.
    fn write_zc(&mut self, fd: i32) -> io::Result<Option<usize>> {
        let Seg::Ext(p, n, slot) = self.segs[self.idx] else {
            unreachable!("zero-copy of an owned segment")
        };
        // SAFETY: off < n; the caller's memory by the contract of push_slot_data.
        let data = unsafe { std::slice::from_raw_parts(p.add(self.off), n - self.off) };
        match nvmf_zerocopy::send(
            fd,
            &[io::IoSlice::new(data)],
            nvmf_zerocopy::SendKind::ZeroCopy,
        ) {
            Ok(0) => Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(r) => {
                let z = self.zc.as_mut().expect("zero-copy on");
                let seq = z.tracker.sent();
                if let Some(s) = z.slot_seq.get_mut(slot as usize) {
                    *s = Some(seq);
                }
                Ok(Some(r))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            // Out of option memory for the notifications: copy this time.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                let n = nvmf_zerocopy::send(
                    fd,
                    &[io::IoSlice::new(data)],
                    nvmf_zerocopy::SendKind::Copy { more: false },
                );
                match n {
                    Ok(r) => Ok(Some(r)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn write_to(&mut self, fd: i32) -> io::Result<bool> {
        self.close_own();
        while self.idx < self.segs.len() {
            let zc_at = self.next_zc();
            if zc_at == Some(self.idx) {
                match self.write_zc(fd)? {
                    Some(r) => {
                        self.advance(r);
                        continue;
                    }
                    None => return Ok(false),
                }
            }
            // Copied segments up to the next zero-copy payload (which then
            // joins them in the segment: MSG_MORE).
            let end = zc_at.unwrap_or(self.segs.len());
            self.iov.clear();
            for (k, seg) in self.segs[self.idx..end].iter().take(MAX_IOV).enumerate() {
                let (p, n) = match *seg {
                    Seg::Own(a, b) => (self.buf[a..b].as_ptr(), b - a),
                    Seg::Ext(p, n, _) => (p, n),
                };
                let skip = if k == 0 { self.off } else { 0 };
                self.iov.push(libc::iovec {
                    // SAFETY: skip < n for the first segment (advance keeps it so).
                    iov_base: unsafe { p.add(skip) } as *mut libc::c_void,
                    iov_len: n - skip,
                });
            }
            // sendmsg with MSG_NOSIGNAL, not writev: a peer that is gone
            // must be an EPIPE error (a lost path, handled), never SIGPIPE,
            // whose default action (the `nvmf` CLI restores it for piped
            // output) would end the process.
            // SAFETY: zeroed msghdr is valid; every iovec points at live
            // memory: our buffer or, by the contract of push_ext, the caller's.
            let r = unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = self.iov.as_mut_ptr();
                msg.msg_iovlen = self.iov.len() as _;
                let more = if zc_at.is_some() { libc::MSG_MORE } else { 0 };
                libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | more)
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(false),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            if r == 0 {
                return Err(io::Error::from(io::ErrorKind::WriteZero));
            }
            self.advance(r as usize);
        }
        self.clear();
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// Owned and external segments come out in order, across partial writes.
    #[test]
    fn a_send_to_a_closed_peer_is_epipe_not_sigpipe() {
        // SAFETY: SIGPIPE back to its default action, as the nvmf CLI sets
        // it: a send that raised it would end this test process.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        let mut tx = TxBuf::new();
        tx.bytes().extend_from_slice(b"keep alive");
        let e = tx.write_to(a.as_raw_fd()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    /// A slot payload sent zero-copy to a receiver that reads nothing yet:
    /// the call stays unreported (the queue holds the command's completion)
    /// until the receiver has taken the bytes; the bytes on the wire are the
    /// slot's, header first.
    #[test]
    fn zero_copy_payload_stays_unreported_until_the_kernel_is_done() {
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut rx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (tx_sock, _) = l.accept().unwrap();
        tx_sock.set_nonblocking(true).unwrap();
        nvmf_zerocopy::enable(tx_sock.as_raw_fd()).unwrap();
        let fd = tx_sock.as_raw_fd();
        let slot: Vec<u8> = (0..8u32 << 20).map(|i| (i * 7 + 1) as u8).collect();
        let mut tx = TxBuf::new();
        tx.enable_zerocopy(16384, true, 2);
        tx.bytes().extend_from_slice(b"header");
        // SAFETY: `slot` outlives every write below.
        unsafe { tx.push_slot_data(slot.as_ptr(), slot.len(), 1) };
        // The receiver reads nothing: the socket fills mid-payload.
        assert!(!tx.write_to(fd).unwrap(), "8 MiB fit in the socket");
        let _ = tx.zc_drain(fd);
        assert!(tx.zc_outstanding() > 0, "no zero-copy call made");
        assert!(
            tx.zc_unreported(1).is_some(),
            "slot 1 reported done while the receiver read nothing"
        );
        assert_eq!(tx.zc_unreported(0), None, "slot 0 sent nothing");
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            while got.len() < 6 + (8 << 20) {
                match rx.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            got
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !tx.write_to(fd).unwrap() {
            assert!(Instant::now() < deadline, "write timed out");
            std::thread::sleep(Duration::from_millis(1));
        }
        let got = reader.join().unwrap();
        assert_eq!(&got[..6], b"header");
        assert!(
            got[6..] == slot[..],
            "bytes on the wire differ from the slot's"
        );
        while tx.zc_unreported(1).is_some() {
            assert!(
                Instant::now() < deadline,
                "the kernel never reported the calls"
            );
            let _ = tx.zc_drain(fd);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(tx.zc_outstanding(), 0);
        let (calls, _, on) = tx.zc_stats();
        assert!(
            calls > 0 && on,
            "always: zero-copy stays on ({calls} calls)"
        );
    }

    #[test]
    fn txbuf_gather_writes_in_order() {
        let (a, mut b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut tx = TxBuf::new();
        let mut want = Vec::new();
        for round in 0..40usize {
            tx.bytes().extend_from_slice(&[round as u8; 24]);
            want.extend_from_slice(&[round as u8; 24]);
            let part = &big[round * 1000..round * 1000 + 1000 + round * 3000];
            // SAFETY: `big` outlives every flush below.
            unsafe { tx.push_ext(part.as_ptr(), part.len()) };
            want.extend_from_slice(part);
        }
        tx.bytes().extend_from_slice(b"tail");
        want.extend_from_slice(b"tail");
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = [0u8; 7000];
            loop {
                let n = b.read(&mut buf).unwrap();
                if n == 0 {
                    return got;
                }
                got.extend_from_slice(&buf[..n]);
            }
        });
        let fd = a.as_raw_fd();
        while !tx.write_to(fd).unwrap() {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!tx.pending());
        drop(a);
        let got = reader.join().unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want);
    }
}
