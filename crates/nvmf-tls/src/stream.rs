//! TLS record layer around a socket someone else owns: the server handshake driven step by step on a
//! non-blocking socket (a reactor calls [`accept`] / [`ServerHandshake::resume`] whenever the socket
//! is ready, never blocks), the client handshake on a socket with timeouts ([`connect`]), and
//! afterwards [`TlsStream`]: decrypt straight into the caller's receive buffer, encrypt gathered
//! output through one preallocated staging buffer (no allocation per I/O), and send the records
//! of one staged write (up to four 16 KiB records) with one `send` instead of one each.
//!
//! The socket is borrowed by file descriptor ([`FdIo`]): the reactor keeps its own `TcpStream` for
//! epoll registration and moving the connection between threads; this layer never closes the fd.
//!
//! With kernel TLS (a context made with [`crate::Ktls::Auto`]), the session is handed to the kernel
//! right after the handshake ([`crate::ktls`]); reads and writes of an offloaded direction are then
//! plain socket calls, the others stay with OpenSSL.

use openssl::ssl::{ErrorCode, HandshakeError, MidHandshakeSslStream, Ssl, SslContext, SslStream};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::RawFd;

/// Plaintext bytes staged per `ssl_write`: several 16 KiB records leave in one call.
pub const STAGE_LEN: usize = 64 * 1024;

/// Read/Write on a socket file descriptor owned elsewhere (never closed here). `send` uses
/// MSG_NOSIGNAL, so a peer that went away gives EPIPE, not SIGPIPE.
///
/// Once the session is established ([`TlsStream`]), writes are gathered: OpenSSL's records go
/// into `out` and [`FdIo::flush_out`] sends them with as few `send` calls as the socket allows
/// (OpenSSL writes every record with a call of its own). During the handshake they go straight
/// to the socket.
#[derive(Debug)]
pub struct FdIo {
    fd: RawFd,
    /// Records written by OpenSSL and not yet sent (None: unbuffered, the handshake).
    out: Option<Vec<u8>>,
    /// Bytes of `out` already sent.
    sent: usize,
    /// `send` calls made (handshake included).
    sends: u64,
}

impl FdIo {
    /// Unbuffered I/O on `fd` (for the handshake).
    pub fn new(fd: RawFd) -> FdIo {
        FdIo {
            fd,
            out: None,
            sent: 0,
            sends: 0,
        }
    }

    /// From now on, gathers written records until [`FdIo::flush_out`].
    fn gather(&mut self, capacity: usize) {
        if self.out.is_none() {
            self.out = Some(Vec::with_capacity(capacity));
        }
    }

    /// Gathered record bytes not yet sent.
    pub fn unsent(&self) -> usize {
        self.out.as_ref().map_or(0, |o| o.len() - self.sent)
    }

    /// Sends the gathered records: Ok(true) once all are sent, Ok(false) when the socket is
    /// full (call again when it is writable).
    pub fn flush_out(&mut self) -> io::Result<bool> {
        let Some(out) = self.out.as_mut() else {
            return Ok(true);
        };
        while self.sent < out.len() {
            let rest = &out[self.sent..];
            // SAFETY: rest is valid for rest.len() bytes; the fd is a socket owned by the caller.
            let n = unsafe {
                libc::send(
                    self.fd,
                    rest.as_ptr().cast(),
                    rest.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => return Ok(false),
                    _ => return Err(e),
                }
            }
            self.sent += n as usize;
            self.sends += 1;
        }
        out.clear();
        self.sent = 0;
        Ok(true)
    }
}

impl Read for FdIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for buf.len() bytes; the fd is a socket owned by the caller.
        let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl Write for FdIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(out) = self.out.as_mut() {
            out.extend_from_slice(buf);
            return Ok(buf.len());
        }
        self.sends += 1;
        // SAFETY: as above.
        let n = unsafe { libc::send(self.fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Where a server handshake stands.
pub enum Handshake {
    /// Done: the connection speaks TLS from now on.
    Done(TlsStream),
    /// Waiting for the socket: call [`ServerHandshake::resume`] when it is readable (or
    /// writable, if [`ServerHandshake::wants_write`]).
    Pending(ServerHandshake),
    /// Refused or broken; the text says why (for the log; no key material in it).
    Failed(String),
}

/// A server handshake waiting for the socket.
pub struct ServerHandshake(MidHandshakeSslStream<FdIo>);

impl ServerHandshake {
    /// Continues after the socket became ready.
    pub fn resume(self) -> Handshake {
        step(self.0.handshake())
    }

    /// The handshake waits to write (the socket's send buffer was full), not to read.
    pub fn wants_write(&self) -> bool {
        self.0.error().code() == ErrorCode::WANT_WRITE
    }
}

fn step(r: Result<SslStream<FdIo>, HandshakeError<FdIo>>) -> Handshake {
    match r {
        Ok(s) => Handshake::Done(TlsStream::new(s)),
        Err(HandshakeError::WouldBlock(mid)) => Handshake::Pending(ServerHandshake(mid)),
        Err(HandshakeError::SetupFailure(e)) => Handshake::Failed(format!("TLS setup: {e}")),
        Err(HandshakeError::Failure(mid)) => Handshake::Failed(describe(mid.error())),
    }
}

/// A handshake error in words: the OpenSSL reason (e.g. "binder does not verify", "no suitable
/// key share", "wrong version number" for a clear-text peer) or the socket error.
fn describe(e: &openssl::ssl::Error) -> String {
    if let Some(io) = e.io_error() {
        return format!("TLS handshake: {io}");
    }
    if let Some(stack) = e.ssl_error() {
        let reasons: Vec<String> = stack
            .errors()
            .iter()
            .map(|x| x.reason().unwrap_or("?").to_string())
            .collect();
        if !reasons.is_empty() {
            return format!("TLS handshake: {}", reasons.join("; "));
        }
    }
    if e.code() == ErrorCode::SYSCALL {
        return "TLS handshake: peer closed the connection".into();
    }
    format!("TLS handshake: {e}")
}

/// Starts the server side of a TLS handshake on the non-blocking socket `fd` with `ctx` (from
/// [`crate::server_context`]).
pub fn accept(ctx: &SslContext, fd: RawFd) -> Handshake {
    match Ssl::new(ctx) {
        Ok(ssl) => step(ssl.accept(FdIo::new(fd))),
        Err(e) => Handshake::Failed(format!("TLS setup: {e}")),
    }
}

/// Runs the client side of a TLS handshake on `fd`, a blocking socket whose receive timeout bounds
/// the handshake (a timeout is reported as an error).
pub fn connect(ctx: &SslContext, fd: RawFd) -> Result<TlsStream, String> {
    let ssl = Ssl::new(ctx).map_err(|e| format!("TLS setup: {e}"))?;
    match ssl.connect(FdIo::new(fd)) {
        Ok(s) => Ok(TlsStream::new(s)),
        Err(HandshakeError::WouldBlock(_)) => {
            Err("TLS handshake: timed out waiting for the target".into())
        }
        Err(HandshakeError::SetupFailure(e)) => Err(format!("TLS setup: {e}")),
        Err(HandshakeError::Failure(mid)) => Err(describe(mid.error())),
    }
}

/// An established TLS 1.3 session on a borrowed socket.
pub struct TlsStream {
    ssl: SslStream<FdIo>,
    /// Plaintext being written: OpenSSL wants a retried write with the same bytes, so what was
    /// staged stays until it is written in full.
    stage: Box<[u8]>,
    staged: usize,
    /// The staged bytes are already encrypted: their records are in the socket layer's buffer
    /// (partly sent, or sent by a `read` meanwhile); they must not be encrypted again.
    sealed: bool,
    /// The socket, for the directions the kernel took over.
    fd: RawFd,
    /// What the kernel took over, and why not the rest.
    offload: crate::Offload,
}

impl TlsStream {
    fn new(mut ssl: SslStream<FdIo>) -> TlsStream {
        crate::forget_hellos(ssl.ssl());
        let fd = ssl.get_ref().fd;
        let offload = crate::ktls::offload(fd, ssl.ssl());
        if !offload.rx && crate::ktls::mode(ssl.ssl()) != crate::Ktls::Off {
            // OpenSSL keeps reading: whole socket buffers per read again (the handshake was read
            // record by record so that none of the peer's data went past the kernel).
            use foreign_types::ForeignTypeRef;
            // SAFETY: a valid SSL owned by `ssl`.
            unsafe { crate::ffi::SSL_set_read_ahead(ssl.ssl().as_ptr(), 1) };
        }
        // The staged plaintext as records: 5 bytes of header and 17 of type and tag each.
        ssl.get_mut()
            .gather(STAGE_LEN + STAGE_LEN.div_ceil(16384) * 32);
        TlsStream {
            ssl,
            stage: vec![0u8; STAGE_LEN].into_boxed_slice(),
            staged: 0,
            sealed: false,
            fd,
            offload,
        }
    }

    /// What kernel TLS took over: `(receive, transmit)`.
    pub fn kernel_tls(&self) -> (bool, bool) {
        (self.offload.rx, self.offload.tx)
    }

    /// Why a direction stayed with OpenSSL's user-space records although kernel TLS was wanted
    /// (e.g. the kernel has no `tls` module); None when both were offloaded or kTLS is off.
    pub fn ktls_fallback(&self) -> Option<&str> {
        self.offload.fallback.as_deref()
    }

    /// The PSK identity the handshake used (server side: the one the client offered and our
    /// lookup accepted).
    pub fn psk_identity(&self) -> Option<&str> {
        self.ssl
            .ssl()
            .ex_data(crate::identity_index())
            .map(|s| s.as_str())
    }

    /// How the accepted PSK was derived (server side), e.g. "RFC 8446 HKDF labels".
    pub fn psk_labels(&self) -> Option<&'static str> {
        self.ssl.ssl().ex_data(crate::labels_index()).copied()
    }

    /// The negotiated cipher suite, e.g. `TLS_AES_128_GCM_SHA256`.
    pub fn cipher(&self) -> &'static str {
        self.ssl
            .ssl()
            .current_cipher()
            .map(|c| c.name())
            .unwrap_or("?")
    }

    /// Decrypts into `buf`: Ok(0) when the peer closed (close_notify or EOF), WouldBlock when
    /// nothing is there. One call returns at most one record's data; call again until WouldBlock.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.offload.rx {
            return crate::ktls::recv(self.fd, buf);
        }
        // What OpenSSL wrote while reading (a KeyUpdate's answer, an alert) goes out too.
        if self.ssl.get_ref().unsent() > 0 {
            self.ssl.get_mut().flush_out()?;
        }
        match self.ssl.ssl_read(buf) {
            Ok(n) => Ok(n),
            // close_notify, or EOF without it (IGNORE_UNEXPECTED_EOF makes that a clean close too).
            Err(e) if e.code() == ErrorCode::ZERO_RETURN => Ok(0),
            Err(e) => Err(to_io(e)),
        }
    }

    /// Decrypted bytes OpenSSL holds beyond what was read (the socket may show no new event).
    pub fn pending(&self) -> usize {
        if self.offload.rx {
            return 0;
        }
        self.ssl.ssl().pending()
    }

    /// OpenSSL holds received bytes not yet returned by `read`: decrypted ones, or raw record
    /// bytes it read ahead from the socket. A caller that sleeps in poll(2) must not while this
    /// is true (the socket may show no event for them).
    pub fn has_buffered(&self) -> bool {
        use foreign_types::ForeignTypeRef;
        if self.offload.rx {
            return false;
        }
        // SAFETY: a valid SSL for the life of `self`; SSL_has_pending only reads its buffers.
        self.pending() > 0 || unsafe { crate::ffi::SSL_has_pending(self.ssl.ssl().as_ptr()) == 1 }
    }

    /// Encrypts and sends the front of `iov` (up to [`STAGE_LEN`] bytes); Ok(n) = the first n bytes
    /// of `iov` left. WouldBlock: call again with output starting with the same bytes (the staged
    /// copy is resent; `iov` may have grown at its end meanwhile).
    pub fn write_gather(&mut self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.offload.tx {
            // The kernel builds the records from the caller's buffers: no staging copy.
            return crate::ktls::send(self.fd, iov);
        }
        // The staged bytes were encrypted by an earlier call: they are written once all their
        // records have left (a `read` may have sent the rest meanwhile).
        if self.sealed {
            if !self.ssl.get_mut().flush_out()? {
                return Err(io::Error::from(io::ErrorKind::WouldBlock));
            }
            self.sealed = false;
            return Ok(std::mem::take(&mut self.staged));
        }
        // Records OpenSSL wrote while reading (an alert, a KeyUpdate's answer) go first.
        if self.ssl.get_ref().unsent() > 0 && !self.ssl.get_mut().flush_out()? {
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        if self.staged == 0 {
            for s in iov {
                let room = STAGE_LEN - self.staged;
                if room == 0 {
                    break;
                }
                let n = s.len().min(room);
                self.stage[self.staged..self.staged + n].copy_from_slice(&s[..n]);
                self.staged += n;
            }
            if self.staged == 0 {
                return Ok(0);
            }
        }
        match self.ssl.ssl_write(&self.stage[..self.staged]) {
            Ok(n) => {
                debug_assert_eq!(n, self.staged);
                // Every record is gathered: one send for all of them.
                self.sealed = true;
                if !self.ssl.get_mut().flush_out()? {
                    return Err(io::Error::from(io::ErrorKind::WouldBlock));
                }
                self.sealed = false;
                self.staged = 0;
                Ok(n)
            }
            Err(e) => Err(to_io(e)),
        }
    }

    /// Tests: asks the peer for nothing but sends a TLS 1.3 KeyUpdate with the next write (OpenSSL's
    /// records only; a kernel-TLS transmit direction cannot rekey and refuses).
    #[doc(hidden)]
    pub fn key_update(&mut self) -> io::Result<()> {
        use foreign_types::ForeignTypeRef;
        if self.offload.tx {
            return Err(io::Error::other("kernel TLS cannot send a KeyUpdate"));
        }
        // SAFETY: a valid SSL; 0 = SSL_KEY_UPDATE_NOT_REQUESTED.
        if unsafe { crate::ffi::SSL_key_update(self.ssl.ssl().as_ptr(), 0) } != 1 {
            return Err(io::Error::other("SSL_key_update failed"));
        }
        Ok(())
    }

    /// Bytes staged and not yet accepted by the socket.
    pub fn staged(&self) -> usize {
        self.staged
    }

    /// `send` calls made on the socket, the handshake's included (after it, one per staged
    /// write when the socket takes it all: up to four 16 KiB records each).
    pub fn send_calls(&self) -> u64 {
        self.ssl.get_ref().sends
    }

    /// Sends close_notify (best effort, non-blocking).
    pub fn shutdown(&mut self) {
        if self.offload.tx {
            crate::ktls::close_notify(self.fd);
            return;
        }
        let _ = self.ssl.shutdown();
        let _ = self.ssl.get_mut().flush_out();
    }
}

fn to_io(e: openssl::ssl::Error) -> io::Error {
    match e.code() {
        ErrorCode::WANT_READ | ErrorCode::WANT_WRITE => io::Error::from(io::ErrorKind::WouldBlock),
        _ => match e.into_io_error() {
            Ok(io) => io,
            Err(e) => io::Error::other(describe_record(&e)),
        },
    }
}

fn describe_record(e: &openssl::ssl::Error) -> String {
    match e.ssl_error() {
        Some(stack) => {
            let reasons: Vec<&str> = stack
                .errors()
                .iter()
                .map(|x| x.reason().unwrap_or("?"))
                .collect();
            format!("TLS: {}", reasons.join("; "))
        }
        None if e.code() == ErrorCode::SYSCALL => "TLS: peer closed the connection".into(),
        None => format!("TLS: {e}"),
    }
}
