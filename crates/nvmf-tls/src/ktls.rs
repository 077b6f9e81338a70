//! Kernel TLS (kTLS): once OpenSSL's handshake is done, the session's record protection moves into
//! the kernel (`setsockopt(TCP_ULP, "tls")`, then `TLS_RX` and `TLS_TX` with the negotiated
//! cipher's key, IV and sequence number), so that reads and writes are plain `recvmsg`/`sendmsg`
//! on the socket: no staging copy, no OpenSSL buffer, the kernel builds the records.
//!
//! What this file owns:
//! - the traffic secrets: OpenSSL hands them only to a key-log callback (`CLIENT_TRAFFIC_SECRET_0`,
//!   `SERVER_TRAFFIC_SECRET_0`); [`want`] installs one that keeps them in the connection's own
//!   ex_data (never logged), and they are wiped once the kernel has its keys or it refused them;
//! - the key schedule step from a traffic secret to the record key and IV (RFC 8446 §7.3,
//!   HKDF-Expand-Label "key" and "iv", through `nvmf_core::tls::psk`);
//! - the `tls_crypto_info` layouts of `<linux/tls.h>` for AES-128-GCM, AES-256-GCM and
//!   ChaCha20-Poly1305 with TLS 1.3;
//! - record I/O on an offloaded socket: data records, and the others the kernel hands over with
//!   their type (`TLS_GET_RECORD_TYPE`): close_notify is the end of the stream, a
//!   NewSessionTicket is ignored, a KeyUpdate is refused (the kernels this runs on cannot take a
//!   new receive key: the connection ends, with a message that says so), any other alert ends it.
//!
//! Sequence numbers start at 0 in both directions: the handshake contexts keep OpenSSL from
//! reading ahead of the handshake (so no application record was consumed by OpenSSL), the server
//! sends no session tickets, and neither side writes after its Finished before the offload.
//!
//! When the kernel refuses (no `tls` module, an old kernel, an unknown cipher), nothing was changed
//! that matters: a socket with the `tls` ULP and no keys passes bytes through, and the session
//! goes on with OpenSSL's records ([`Offload::fallback`] says why, for the log). Receive is
//! offloaded first: if it is taken and transmit is refused, OpenSSL keeps writing (it never reads
//! again), which a receive-only kTLS socket passes through.

use foreign_types::ForeignTypeRef;
use nvmf_core::tls::psk::{hkdf_expand_label_prk, PskHash};
use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslContext, SslContextBuilder, SslRef};
use std::io::{self, IoSlice};
use std::os::fd::RawFd;
use std::sync::OnceLock;

/// Whether a context hands established sessions to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ktls {
    /// Always OpenSSL's records in user space.
    Off,
    /// Kernel TLS where the kernel takes the keys, OpenSSL's records otherwise (the reason logged
    /// by the caller from [`crate::TlsStream::ktls_fallback`]).
    #[default]
    Auto,
    /// Tests: behave as a kernel that refuses the transmit keys (receive is offloaded).
    #[doc(hidden)]
    RefuseTx,
    /// Tests: behave as a kernel that refuses the receive keys (nothing is offloaded).
    #[doc(hidden)]
    RefuseRx,
}

impl std::str::FromStr for Ktls {
    type Err = String;
    fn from_str(s: &str) -> Result<Ktls, String> {
        match s {
            "auto" => Ok(Ktls::Auto),
            "off" => Ok(Ktls::Off),
            other => Err(format!("kernel TLS: expected auto or off, got {other:?}")),
        }
    }
}

// <linux/tls.h>
const SOL_TLS: libc::c_int = 282;
const TCP_ULP: libc::c_int = 31;
const TLS_TX: libc::c_int = 1;
const TLS_RX: libc::c_int = 2;
const TLS_SET_RECORD_TYPE: libc::c_int = 1;
const TLS_GET_RECORD_TYPE: libc::c_int = 2;
const TLS_RX_EXPECT_NO_PAD: libc::c_int = 4;
const TLS_1_3_VERSION: u16 = 0x0304;
const CIPHER_AES_GCM_128: u16 = 51;
const CIPHER_AES_GCM_256: u16 = 52;
const CIPHER_CHACHA20_POLY1305: u16 = 54;

// TLS record content types (RFC 8446 §5.1) and handshake message types (§4).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// The two application traffic secrets, as the key-log callback saw them.
#[derive(Default)]
struct Secrets {
    client: Vec<u8>,
    server: Vec<u8>,
}

impl Secrets {
    fn wipe(&mut self) {
        wipe(&mut self.client);
        wipe(&mut self.server);
    }
}

fn wipe(v: &mut [u8]) {
    for b in v.iter_mut() {
        // SAFETY: a valid, aligned &mut u8; volatile so the wipe is not optimized away.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
}

fn secrets_index() -> Index<Ssl, Secrets> {
    static I: OnceLock<Index<Ssl, Secrets>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}

fn mode_index() -> Index<SslContext, Ktls> {
    static I: OnceLock<Index<SslContext, Ktls>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("OpenSSL ex_data index"))
}

/// Makes `b`'s sessions candidates for kTLS (`mode` other than Off): keeps the traffic secrets and
/// reads the handshake record by record (never ahead of it).
pub(crate) fn want(b: &mut SslContextBuilder, mode: Ktls) {
    if mode == Ktls::Off {
        return;
    }
    b.set_ex_data(mode_index(), mode);
    b.set_read_ahead(false);
    b.set_keylog_callback(|ssl, line| {
        let mut parts = line.split(' ');
        let (Some(label), Some(_random), Some(hex)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let client = match label {
            "CLIENT_TRAFFIC_SECRET_0" => true,
            "SERVER_TRAFFIC_SECRET_0" => false,
            _ => return,
        };
        let Some(secret) = unhex(hex) else { return };
        // SAFETY: the callback runs inside OpenSSL's handshake on this SSL, which nothing else
        // borrows meanwhile; only this SSL's own ex_data is changed.
        let ssl = unsafe { SslRef::from_ptr_mut(ssl.as_ptr()) };
        if ssl.ex_data(secrets_index()).is_none() {
            ssl.set_ex_data(secrets_index(), Secrets::default());
        }
        if let Some(s) = ssl.ex_data_mut(secrets_index()) {
            let slot = if client { &mut s.client } else { &mut s.server };
            wipe(slot);
            *slot = secret;
        }
    });
}

/// The context's kTLS mode (Off when [`want`] was not called).
pub(crate) fn mode(ssl: &SslRef) -> Ktls {
    ssl.ssl_context()
        .ex_data(mode_index())
        .copied()
        .unwrap_or(Ktls::Off)
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// What the kernel took over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offload {
    /// Received records are decrypted by the kernel.
    pub rx: bool,
    /// Sent records are built by the kernel.
    pub tx: bool,
    /// Why a direction stayed in user space (None when both were offloaded, or kTLS is off).
    pub fallback: Option<String>,
}

/// The record protection of one direction: cipher, key and the 12-byte IV.
struct Keys {
    cipher: u16,
    key: Vec<u8>,
    iv: Vec<u8>,
}

impl Drop for Keys {
    fn drop(&mut self) {
        wipe(&mut self.key);
        wipe(&mut self.iv);
    }
}

impl Keys {
    /// RFC 8446 §7.3: key = HKDF-Expand-Label(secret, "key", "", key_len), iv = ... "iv" ... 12.
    fn derive(suite: &str, secret: &[u8]) -> Result<Keys, String> {
        let (cipher, hash, key_len) = match suite {
            "TLS_AES_128_GCM_SHA256" => (CIPHER_AES_GCM_128, PskHash::Sha256, 16),
            "TLS_AES_256_GCM_SHA384" => (CIPHER_AES_GCM_256, PskHash::Sha384, 32),
            "TLS_CHACHA20_POLY1305_SHA256" => (CIPHER_CHACHA20_POLY1305, PskHash::Sha256, 32),
            other => return Err(format!("no kernel TLS for the cipher suite {other}")),
        };
        let key = hkdf_expand_label_prk(hash, secret, "key", key_len)
            .map_err(|e| format!("traffic key: {e}"))?;
        let iv = hkdf_expand_label_prk(hash, secret, "iv", 12)
            .map_err(|e| format!("traffic IV: {e}"))?;
        Ok(Keys { cipher, key, iv })
    }

    /// `struct tls12_crypto_info_*` for TLS 1.3 with record sequence number 0: the GCM ciphers
    /// split the IV into a 4-byte salt and an 8-byte part, ChaCha20-Poly1305 takes all 12.
    fn crypto_info(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(56);
        v.extend_from_slice(&TLS_1_3_VERSION.to_ne_bytes());
        v.extend_from_slice(&self.cipher.to_ne_bytes());
        if self.cipher == CIPHER_CHACHA20_POLY1305 {
            v.extend_from_slice(&self.iv);
            v.extend_from_slice(&self.key);
        } else {
            v.extend_from_slice(&self.iv[4..]);
            v.extend_from_slice(&self.key);
            v.extend_from_slice(&self.iv[..4]);
        }
        v.extend_from_slice(&[0u8; 8]); // rec_seq
        v
    }
}

fn setsockopt(fd: RawFd, level: libc::c_int, name: libc::c_int, val: &[u8]) -> io::Result<()> {
    // SAFETY: val is valid for val.len() bytes; the kernel copies it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            val.as_ptr().cast(),
            val.len() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Hands the established session on `fd` to the kernel as far as it takes it (see the file
/// comment). The secrets are wiped whatever happens.
pub(crate) fn offload(fd: RawFd, ssl: &SslRef) -> Offload {
    let mode = mode(ssl);
    if mode == Ktls::Off {
        return Offload::default();
    }
    // SAFETY: the handshake is over; nothing else borrows this SSL's ex_data now.
    let ssl_mut = unsafe { SslRef::from_ptr_mut(ssl.as_ptr()) };
    let secrets = ssl_mut.ex_data_mut(secrets_index()).map(|s| {
        let out = (s.client.clone(), s.server.clone());
        s.wipe();
        out
    });
    let mut out = Offload::default();
    let Some((mut client, mut server)) = secrets else {
        out.fallback = Some("OpenSSL did not hand over the traffic secrets".into());
        return out;
    };
    let suite = ssl.current_cipher().map(|c| c.name()).unwrap_or("?");
    let (rx_secret, tx_secret) = if ssl.is_server() {
        (&client, &server)
    } else {
        (&server, &client)
    };
    let keys =
        Keys::derive(suite, rx_secret).and_then(|rx| Ok((rx, Keys::derive(suite, tx_secret)?)));
    wipe(&mut client);
    wipe(&mut server);
    let (rx, tx) = match keys {
        Ok(k) => k,
        Err(e) => {
            out.fallback = Some(e);
            return out;
        }
    };
    if mode == Ktls::RefuseRx {
        out.fallback = Some("receive keys refused (test)".into());
        return out;
    }
    if let Err(e) = setsockopt(fd, libc::IPPROTO_TCP, TCP_ULP, b"tls") {
        out.fallback = Some(match e.raw_os_error() {
            Some(libc::ENOENT) => "the kernel has no tls module (TCP_ULP \"tls\": ENOENT)".into(),
            _ => format!("TCP_ULP \"tls\": {e}"),
        });
        return out;
    }
    let mut info = rx.crypto_info();
    let r = setsockopt(fd, SOL_TLS, TLS_RX, &info);
    wipe(&mut info);
    if let Err(e) = r {
        out.fallback = Some(format!("TLS_RX ({suite}): {e}"));
        return out;
    }
    out.rx = true;
    // TLS 1.3 records from OpenSSL and the Linux host carry no padding: the kernel may decrypt
    // straight into the caller's buffer (Linux 6.0+; older kernels refuse, which costs nothing).
    let _ = setsockopt(fd, SOL_TLS, TLS_RX_EXPECT_NO_PAD, &1u32.to_ne_bytes());
    if mode == Ktls::RefuseTx {
        out.fallback = Some("transmit keys refused (test)".into());
        return out;
    }
    let mut info = tx.crypto_info();
    let r = setsockopt(fd, SOL_TLS, TLS_TX, &info);
    wipe(&mut info);
    match r {
        Ok(()) => out.tx = true,
        Err(e) => out.fallback = Some(format!("TLS_TX ({suite}): {e}")),
    }
    out
}

/// Reads decrypted application data from an offloaded socket into `buf`: Ok(0) at close_notify or
/// EOF; WouldBlock when nothing is there. Ignores session tickets; a KeyUpdate or another alert
/// is an error (the connection ends).
pub(crate) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // A peer may send a few tickets; more handshake records than this in a row is not a session.
    for _ in 0..16 {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut cbuf = [0u64; 4];
        // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
        // SAFETY: msg describes valid buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        let mut record = APPLICATION_DATA;
        // SAFETY: msg was filled by recvmsg; the CMSG macros stay within msg_control.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            if !c.is_null() && (*c).cmsg_level == SOL_TLS && (*c).cmsg_type == TLS_GET_RECORD_TYPE {
                record = *libc::CMSG_DATA(c);
            }
        }
        match record {
            APPLICATION_DATA => return Ok(n),
            ALERT if n >= 2 && buf[1] == 0 => return Ok(0), // close_notify
            ALERT if n >= 2 => {
                return Err(io::Error::other(format!(
                    "TLS: alert {} ({}) from the peer",
                    buf[1],
                    if buf[0] == 2 { "fatal" } else { "warning" }
                )))
            }
            HANDSHAKE if n >= 1 && buf[0] == NEW_SESSION_TICKET => continue,
            HANDSHAKE if n >= 1 && buf[0] == KEY_UPDATE => {
                return Err(io::Error::other(
                    "TLS: the peer sent a KeyUpdate; kernel TLS on this connection cannot take new \
                     receive keys, so the connection ends (run with kernel TLS off to allow key updates)",
                ))
            }
            other => {
                return Err(io::Error::other(format!(
                    "TLS: unexpected record (type {other}, {n} bytes) on a kernel TLS socket"
                )))
            }
        }
    }
    Err(io::Error::other(
        "TLS: more than 16 handshake records in a row from the peer",
    ))
}

/// Sends the front of `iov` as application data through the kernel's records: the bytes taken
/// (fewer when the socket is full), or WouldBlock.
pub(crate) fn send(fd: RawFd, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // IoSlice is ABI-compatible with iovec on Unix.
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len().min(1024) as _;
    // SAFETY: msg points at `iov`, valid for the call.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Sends close_notify as a kernel-built alert record (best effort, non-blocking).
pub(crate) fn close_notify(fd: RawFd) {
    let alert = [1u8, 0u8]; // warning, close_notify
    let mut iov = libc::iovec {
        iov_base: alert.as_ptr() as *mut libc::c_void,
        iov_len: alert.len(),
    };
    let mut cbuf = [0u64; 4];
    // SAFETY: zeroed msghdr is valid; the control buffer is large enough for one cmsg of 1 byte.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(1) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = SOL_TLS;
        (*c).cmsg_type = TLS_SET_RECORD_TYPE;
        (*c).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(c) = ALERT;
        libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crypto_info_layouts_match_linux_tls_h() {
        let secret = [7u8; 32];
        let k = Keys::derive("TLS_AES_128_GCM_SHA256", &secret).unwrap();
        let info = k.crypto_info();
        assert_eq!(info.len(), 40, "tls12_crypto_info_aes_gcm_128");
        assert_eq!(&info[0..4], &[0x04, 0x03, 51, 0]);
        assert_eq!(&info[4..12], &k.iv[4..], "iv: the IV's last 8 bytes");
        assert_eq!(&info[12..28], &k.key[..]);
        assert_eq!(&info[28..32], &k.iv[..4], "salt: the IV's first 4 bytes");
        assert_eq!(&info[32..], &[0u8; 8], "rec_seq 0");
        let k = Keys::derive("TLS_AES_256_GCM_SHA384", &[9u8; 48]).unwrap();
        assert_eq!(k.crypto_info().len(), 56, "tls12_crypto_info_aes_gcm_256");
        let k = Keys::derive("TLS_CHACHA20_POLY1305_SHA256", &secret).unwrap();
        let info = k.crypto_info();
        assert_eq!(info.len(), 56, "tls12_crypto_info_chacha20_poly1305");
        assert_eq!(&info[4..16], &k.iv[..]);
        assert!(Keys::derive("TLS_AES_128_CCM_SHA256", &secret).is_err());
        assert!(
            Keys::derive("TLS_AES_256_GCM_SHA384", &[1u8; 3]).is_err(),
            "short secret"
        );
    }

    /// RFC 8448 §3 (simple 1-RTT handshake): the server's application traffic secret and the
    /// key and IV derived from it.
    #[test]
    fn traffic_key_and_iv_follow_rfc_8448() {
        let secret =
            unhex("a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643").unwrap();
        let k = Keys::derive("TLS_AES_128_GCM_SHA256", &secret).unwrap();
        assert_eq!(k.key, unhex("9f02283b6c9c07efc26bb9f2ac92e356").unwrap());
        assert_eq!(k.iv, unhex("cf782b88dd83549aadf1e984").unwrap());
    }

    #[test]
    fn modes_parse() {
        assert_eq!("auto".parse::<Ktls>(), Ok(Ktls::Auto));
        assert_eq!("off".parse::<Ktls>(), Ok(Ktls::Off));
        assert!("on".parse::<Ktls>().is_err());
        assert_eq!(unhex("0aff"), Some(vec![10, 255]));
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
    }
}
