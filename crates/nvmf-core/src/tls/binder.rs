//! TLS 1.3 PSK binders (RFC 8446 §4.2.11.2), to choose between TLS PSKs that share one identity.
//!
//! A version-0 identity (`NVMe0R01 <hostnqn> <subnqn>`) is the same string whichever HKDF label
//! encoding the host derived its TLS PSK with (`psk::PskLabels`: SPDK uses RFC 8446's, the Linux
//! host libnvme's), and so is a version-1 identity of a hash-00 key. OpenSSL's server takes one
//! key per identity and fails the handshake if the binder does not verify, so the target
//! computes the binder of each candidate key itself over the ClientHello it received and hands
//! OpenSSL the one that matches.
//!
//! binder = HMAC(finished_key, Transcript-Hash(truncated ClientHello)), where
//! early_secret = HKDF-Extract(0, PSK), binder_key = HKDF-Expand-Label(early_secret,
//! "ext binder", Hash(""), Hlen), finished_key = HKDF-Expand-Label(binder_key, "finished", "",
//! Hlen), and the truncated ClientHello is the handshake message (with its 4-byte header) up to
//! the binders list. After a HelloRetryRequest the transcript is message_hash(ClientHello1) ||
//! HelloRetryRequest || truncated ClientHello2 (RFC 8446 §4.4.1).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha384};
use subtle::ConstantTimeEq;

use super::psk::{hkdf, hkdf_label, PskHash, TlsPsk};

/// Handshake message type of a ClientHello.
pub const CLIENT_HELLO: u8 = 1;
/// Handshake message type of a ServerHello (a HelloRetryRequest is one too).
pub const SERVER_HELLO: u8 = 2;
/// Extension type of pre_shared_key.
const PRE_SHARED_KEY: usize = 41;

/// The pre_shared_key extension of a ClientHello.
#[derive(Debug, PartialEq, Eq)]
pub struct PskOffer<'a> {
    pub identities: Vec<&'a [u8]>,
    pub binders: Vec<&'a [u8]>,
    /// Length of the ClientHello message (header included) before the binders list.
    pub truncated_len: usize,
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<usize> {
        Some(self.take(1)?[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        let s = self.take(2)?;
        Some(u16::from_be_bytes([s[0], s[1]]) as usize)
    }
}

/// Parses the pre_shared_key extension out of a ClientHello handshake message (4-byte header
/// included). None if the message is malformed or carries no PSK offer; pre_shared_key must be
/// the last extension, so the binders list ends the message.
pub fn psk_offer(msg: &[u8]) -> Option<PskOffer<'_>> {
    let mut r = Reader { b: msg, at: 0 };
    if r.u8()? != CLIENT_HELLO as usize {
        return None;
    }
    let body_len = {
        let l = r.take(3)?;
        (l[0] as usize) << 16 | (l[1] as usize) << 8 | l[2] as usize
    };
    if body_len != msg.len() - 4 {
        return None;
    }
    r.take(2 + 32)?; // legacy_version, random
    let n = r.u8()?;
    r.take(n)?; // legacy_session_id
    let n = r.u16()?;
    r.take(n)?; // cipher_suites
    let n = r.u8()?;
    r.take(n)?; // legacy_compression_methods
    let ext_end = r.u16()? + r.at;
    if ext_end != msg.len() {
        return None;
    }
    while r.at < ext_end {
        let ty = r.u16()?;
        let len = r.u16()?;
        let start = r.at;
        let body = r.take(len)?;
        if ty != PRE_SHARED_KEY {
            continue;
        }
        if r.at != ext_end {
            return None;
        }
        let mut e = Reader { b: body, at: 0 };
        let ids_len = e.u16()?;
        let ids_end = e.at + ids_len;
        let mut identities = Vec::new();
        while e.at < ids_end {
            let n = e.u16()?;
            identities.push(e.take(n)?);
            e.take(4)?; // obfuscated_ticket_age
        }
        if e.at != ids_end {
            return None;
        }
        let truncated_len = start + e.at;
        let binders_len = e.u16()?;
        if e.at + binders_len != body.len() {
            return None;
        }
        let mut binders = Vec::new();
        while e.at < body.len() {
            let n = e.u8()?;
            binders.push(e.take(n)?);
        }
        if identities.is_empty() || identities.len() != binders.len() {
            return None;
        }
        return Some(PskOffer {
            identities,
            binders,
            truncated_len,
        });
    }
    None
}

fn digest(hash: PskHash, parts: &[&[u8]]) -> Vec<u8> {
    match hash {
        PskHash::Sha256 => {
            let mut h = Sha256::new();
            parts.iter().for_each(|p| h.update(p));
            h.finalize().to_vec()
        }
        PskHash::Sha384 => {
            let mut h = Sha384::new();
            parts.iter().for_each(|p| h.update(p));
            h.finalize().to_vec()
        }
    }
}

fn hmac(hash: PskHash, key: &[u8], msg: &[u8]) -> Vec<u8> {
    match hash {
        PskHash::Sha256 => {
            let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key");
            m.update(msg);
            m.finalize().into_bytes().to_vec()
        }
        PskHash::Sha384 => {
            let mut m = <Hmac<Sha384> as Mac>::new_from_slice(key).expect("HMAC takes any key");
            m.update(msg);
            m.finalize().into_bytes().to_vec()
        }
    }
}

/// The binder of an external PSK `key` over a transcript whose hash (with `hash`) is
/// `transcript_hash`.
pub fn binder(hash: PskHash, key: &[u8], transcript_hash: &[u8]) -> Vec<u8> {
    let hlen = hash.key_len();
    let early = {
        // HKDF-Extract(salt = 0, key) = HMAC(0^Hlen, key)
        hmac(hash, &vec![0u8; hlen], key)
    };
    let info = hkdf_label("ext binder", &digest(hash, &[]), hlen).expect("short context");
    let binder_key = hkdf(hash, None, Some(&early), &info, hlen);
    let info = hkdf_label("finished", &[], hlen).expect("empty context");
    let finished = hkdf(hash, None, Some(&binder_key), &info, hlen);
    hmac(hash, &finished, transcript_hash)
}

/// The transcript hash a binder of the last ClientHello in `msgs` covers: `msgs` is the
/// handshake so far as received and sent, `[ClientHello]` or `[ClientHello1,
/// HelloRetryRequest, ClientHello2]`. None for any other shape.
pub fn transcript_hash(hash: PskHash, msgs: &[&[u8]], truncated_len: usize) -> Option<Vec<u8>> {
    match msgs {
        [ch] => Some(digest(hash, &[ch.get(..truncated_len)?])),
        [ch1, hrr, ch2] if hrr.first() == Some(&SERVER_HELLO) => {
            let h1 = digest(hash, &[ch1]);
            let synthetic = [254u8, 0, 0, h1.len() as u8];
            Some(digest(
                hash,
                &[&synthetic, &h1, hrr, ch2.get(..truncated_len)?],
            ))
        }
        _ => None,
    }
}

/// Of `candidates` (TLS PSKs for `identity`), the one whose binder is the one the last
/// ClientHello of `msgs` carries for `identity`; None if none verifies or the hello cannot be
/// read. The binder's length gives its hash (the Linux host binds SHA-384 keys with SHA-256).
pub fn pick<'c>(candidates: &'c [TlsPsk], identity: &str, msgs: &[&[u8]]) -> Option<&'c TlsPsk> {
    let offer = psk_offer(msgs.last()?)?;
    let i = offer
        .identities
        .iter()
        .position(|id| *id == identity.as_bytes())?;
    let sent = offer.binders[i];
    let hash = match sent.len() {
        32 => PskHash::Sha256,
        48 => PskHash::Sha384,
        _ => return None,
    };
    let th = transcript_hash(hash, msgs, offer.truncated_len)?;
    candidates
        .iter()
        .find(|c| bool::from(binder(hash, &c.key, &th).as_slice().ct_eq(sent)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::psk::PskLabels;

    /// A minimal ClientHello: no suites or other extensions, one PSK identity, binder `b`.
    fn hello(identity: &[u8], binder: &[u8]) -> Vec<u8> {
        let mut psk = Vec::new();
        psk.extend_from_slice(&((identity.len() + 6) as u16).to_be_bytes());
        psk.extend_from_slice(&(identity.len() as u16).to_be_bytes());
        psk.extend_from_slice(identity);
        psk.extend_from_slice(&[0, 0, 0, 0]);
        psk.extend_from_slice(&((binder.len() + 1) as u16).to_be_bytes());
        psk.push(binder.len() as u8);
        psk.extend_from_slice(binder);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[0x11; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        let mut ext = vec![0, 41];
        ext.extend_from_slice(&(psk.len() as u16).to_be_bytes());
        ext.extend_from_slice(&psk);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut m = vec![1, 0];
        m.extend_from_slice(&(body.len() as u16).to_be_bytes());
        m.extend_from_slice(&body);
        m
    }

    /// The binder of a fixed key over a fixed transcript hash, computed independently in Python
    /// from RFC 8446 §4.2.11.2 / §7.1 (hmac/hashlib): key 32 × 0x01, transcript hash = SHA-256("abc").
    #[test]
    fn binder_vector() {
        let th = digest(PskHash::Sha256, &[b"abc"]);
        assert_eq!(
            hex(&binder(PskHash::Sha256, &[1u8; 32], &th)),
            BINDER_VECTOR
        );
    }
    const BINDER_VECTOR: &str = "37c6ad60957dded6c0e361cc79ec4ca99350b1d3f9c5731be95d66dcb849e870";

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn parses_the_pre_shared_key_extension() {
        let m = hello(b"NVMe0R01 h s", &[9u8; 32]);
        let o = psk_offer(&m).unwrap();
        assert_eq!(o.identities, vec![&b"NVMe0R01 h s"[..]]);
        assert_eq!(o.binders, vec![&[9u8; 32][..]]);
        assert_eq!(o.truncated_len, m.len() - 2 - 33);
        // Truncated, wrong type, trailing bytes: refused.
        assert_eq!(psk_offer(&m[..m.len() - 1]), None);
        let mut t = m.clone();
        t[0] = 2;
        assert_eq!(psk_offer(&t), None);
        let mut t = m.clone();
        t.push(0);
        assert_eq!(psk_offer(&t), None);
    }

    /// The SPDK case: one identity, two keys (libnvme's and RFC 8446's encodings); the binder
    /// picks the key it was made with, and a binder of a third key picks none.
    #[test]
    fn picks_the_key_the_binder_was_made_with() {
        let k = crate::tls::psk::ConfiguredPsk::parse(
            "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
        )
        .unwrap();
        let (h, s) = ("nqn.2014-08.org.x:h", "nqn.2014-08.org.x:s");
        let c: Vec<TlsPsk> = PskLabels::ALL
            .iter()
            .map(|&l| k.tls_psk_v0_with(h, s, l).unwrap())
            .collect();
        let id = c[0].identity.clone();
        for want in &c {
            // Build the hello with a zero binder, then fill in the real one over its truncation.
            let mut m = hello(id.as_bytes(), &[0u8; 32]);
            let o = psk_offer(&m).unwrap();
            let th = transcript_hash(PskHash::Sha256, &[&m], o.truncated_len).unwrap();
            let b = binder(PskHash::Sha256, &want.key, &th);
            let n = m.len();
            m[n - 32..].copy_from_slice(&b);
            assert_eq!(pick(&c, &id, &[&m]).map(|p| p.labels), Some(want.labels));
            // The same binder after a HelloRetryRequest covers another transcript.
            let hrr = [2u8, 0, 0, 0];
            assert_eq!(pick(&c, &id, &[&m, &hrr, &m]), None);
        }
        let m = hello(id.as_bytes(), &[7u8; 32]);
        assert_eq!(pick(&c, &id, &[&m]), None);
        assert_eq!(pick(&c, "NVMe0R01 other s", &[&m]), None);
    }
}
