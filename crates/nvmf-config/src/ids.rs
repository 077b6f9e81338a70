//! Owns namespace identifiers (NGUID, EUI-64, UUID): their text forms (parse
//! and format, as SPDK writes them), deterministic derivation for namespaces
//! the config gives none for, and fresh random ones for future RPC use.
//! Also holds the small SHA-256 used for derivation.

use std::fmt;
use std::str::FromStr;

/// A 16-byte UUID, text form `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uuid16(pub [u8; 16]);

impl Uuid16 {
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl From<[u8; 16]> for Uuid16 {
    fn from(b: [u8; 16]) -> Self {
        Uuid16(b)
    }
}

impl fmt::Display for Uuid16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_uuid(&self.0))
    }
}

impl FromStr for Uuid16 {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_uuid(s).map(Uuid16)
    }
}

/// The three identifiers of one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NamespaceIds {
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub uuid: [u8; 16],
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn parse_hex_exact<const N: usize>(s: &str, what: &str) -> Result<[u8; N], String> {
    let b = s.as_bytes();
    if b.len() != N * 2 {
        return Err(format!(
            "{what} must be exactly {} hex digits, got {} characters: \"{s}\"",
            N * 2,
            s.chars().count()
        ));
    }
    let mut out = [0u8; N];
    for (i, pair) in b.chunks(2).enumerate() {
        match (hex_val(pair[0]), hex_val(pair[1])) {
            (Some(h), Some(l)) => out[i] = (h << 4) | l,
            _ => return Err(format!("{what} has a non-hex character: \"{s}\"")),
        }
    }
    Ok(out)
}

fn hex_upper(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789ABCDEF";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(D[usize::from(b >> 4)] as char);
        s.push(D[usize::from(b & 15)] as char);
    }
    s
}

/// Parses an NGUID: 32 hex digits (either case).
pub fn parse_nguid(s: &str) -> Result<[u8; 16], String> {
    parse_hex_exact::<16>(s, "NGUID")
}

/// Parses an EUI-64: 16 hex digits (either case).
pub fn parse_eui64(s: &str) -> Result<[u8; 8], String> {
    parse_hex_exact::<8>(s, "EUI-64")
}

/// Formats an NGUID as SPDK does: 32 upper-case hex digits.
pub fn format_nguid(b: &[u8; 16]) -> String {
    hex_upper(b)
}

/// Formats an EUI-64 as SPDK does: 16 upper-case hex digits.
pub fn format_eui64(b: &[u8; 8]) -> String {
    hex_upper(b)
}

/// Parses a UUID in the 8-4-4-4-12 form (either case).
pub fn parse_uuid(s: &str) -> Result<[u8; 16], String> {
    let b = s.as_bytes();
    let bad = || format!("UUID must look like xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, got \"{s}\"");
    if b.len() != 36 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    let mut nib = 0usize;
    for (i, &c) in b.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return Err(bad());
            }
            continue;
        }
        let v = hex_val(c).ok_or_else(bad)?;
        out[nib / 2] |= if nib & 1 == 0 { v << 4 } else { v };
        nib += 1;
    }
    Ok(out)
}

/// Formats a UUID as 8-4-4-4-12 lower-case hex (SPDK's form).
pub fn format_uuid(b: &[u8; 16]) -> String {
    let h = hex_upper(b).to_ascii_lowercase();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Sets the RFC 9562 variant bits and the given version nibble.
fn set_uuid_bits(u: &mut [u8; 16], version: u8) {
    u[6] = (u[6] & 0x0f) | (version << 4);
    u[8] = (u[8] & 0x3f) | 0x80;
}

/// Makes a random-looking EUI-64 a valid locally administered unicast one.
fn set_eui64_bits(e: &mut [u8; 8]) {
    e[0] = (e[0] & 0xfc) | 0x02;
}

fn nonzero16(mut b: [u8; 16]) -> [u8; 16] {
    if b.iter().all(|&x| x == 0) {
        b[15] = 1;
    }
    b
}

/// Derives a namespace's identifiers deterministically, so they are the same
/// on every start and distinct between namespaces.
///
/// With a bdev UUID, the namespace UUID is the bdev UUID and the NGUID holds
/// the same 16 bytes (what SPDK reports for a bdev with a UUID). Otherwise the
/// NGUID and UUID are SHA-256 of (subsystem NQN, NSID, bdev name) under
/// distinct labels, the UUID with version 8 (custom) bits set. The EUI-64 is
/// always hashed and marked locally administered. None is ever all-zero.
pub fn derive_namespace_ids(
    subsystem_nqn: &str,
    nsid: u32,
    bdev_name: &str,
    bdev_uuid: Option<&Uuid16>,
) -> NamespaceIds {
    let digest = |label: &str| -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"nvmfd namespace id v1\0");
        h.update(label.as_bytes());
        h.update(b"\0");
        h.update(subsystem_nqn.as_bytes());
        h.update(b"\0");
        h.update(&nsid.to_be_bytes());
        h.update(bdev_name.as_bytes());
        h.update(b"\0");
        if let Some(u) = bdev_uuid {
            h.update(&u.0);
        }
        h.finish()
    };
    let first16 = |d: [u8; 32]| -> [u8; 16] { d[..16].try_into().expect("16 of 32") };
    let (nguid, uuid) = match bdev_uuid {
        Some(u) if u.0.iter().any(|&b| b != 0) => (u.0, u.0),
        _ => {
            let mut uuid = first16(digest("uuid"));
            set_uuid_bits(&mut uuid, 8);
            (nonzero16(first16(digest("nguid"))), uuid)
        }
    };
    let mut eui64: [u8; 8] = digest("eui64")[..8].try_into().expect("8 of 32");
    set_eui64_bits(&mut eui64);
    NamespaceIds { nguid, eui64, uuid }
}

/// Fresh random identifiers (UUID version 4), e.g. for a namespace added at
/// run time. Reads the OS random source; falls back to hashing the clock,
/// the process id and a per-process counter.
pub fn random_namespace_ids() -> NamespaceIds {
    let mut buf = [0u8; 40];
    if !fill_os_random(&mut buf) {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut h = Sha256::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        h.update(&now.to_le_bytes());
        h.update(&std::process::id().to_le_bytes());
        h.update(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        let a = h.finish();
        let b = Sha256::digest(&a);
        buf[..32].copy_from_slice(&a);
        buf[32..].copy_from_slice(&b[..8]);
    }
    let mut uuid: [u8; 16] = buf[0..16].try_into().expect("16");
    set_uuid_bits(&mut uuid, 4);
    let nguid = nonzero16(buf[16..32].try_into().expect("16"));
    let mut eui64: [u8; 8] = buf[32..40].try_into().expect("8");
    set_eui64_bits(&mut eui64);
    NamespaceIds { nguid, eui64, uuid }
}

fn fill_os_random(buf: &mut [u8]) -> bool {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .is_ok()
}

/// Minimal SHA-256 (FIPS 180-4), enough for hashing short identifiers.
pub(crate) struct Sha256 {
    state: [u32; 8],
    block: [u8; 64],
    filled: usize,
    total: u64,
}

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

impl Sha256 {
    pub(crate) fn new() -> Sha256 {
        Sha256 {
            state: [
                0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
                0x5be0cd19,
            ],
            block: [0; 64],
            filled: 0,
            total: 0,
        }
    }

    pub(crate) fn digest(data: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(data);
        h.finish()
    }

    pub(crate) fn update(&mut self, mut data: &[u8]) {
        self.total = self.total.wrapping_add(data.len() as u64);
        while !data.is_empty() {
            let n = (64 - self.filled).min(data.len());
            self.block[self.filled..self.filled + n].copy_from_slice(&data[..n]);
            self.filled += n;
            data = &data[n..];
            if self.filled == 64 {
                let block = self.block;
                self.compress(&block);
                self.filled = 0;
            }
        }
    }

    pub(crate) fn finish(mut self) -> [u8; 32] {
        let bits = self.total.wrapping_mul(8);
        self.update(&[0x80]);
        while self.filled != 56 {
            self.update(&[0]);
        }
        self.update(&bits.to_be_bytes());
        let mut out = [0u8; 32];
        for (i, w) in self.state.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    fn compress(&mut self, block: &[u8; 64]) {
        let mut w = [0u32; 64];
        for (i, c) in block.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([c[0], c[1], c[2], c[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = self.state;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = h
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            h = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (s, v) in self.state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
            *s = s.wrapping_add(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        hex_upper(b).to_ascii_lowercase()
    }

    #[test]
    fn sha256_known_answers() {
        assert_eq!(
            hex(&Sha256::digest(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&Sha256::digest(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        let mut h = Sha256::new();
        for _ in 0..1000 {
            h.update(&[b'a'; 1000]);
        }
        assert_eq!(
            hex(&h.finish()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }

    #[test]
    fn uuid_text_round_trip() {
        let s = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        let u = parse_uuid(s).unwrap();
        assert_eq!(format_uuid(&u), s);
        assert_eq!(parse_uuid(&s.to_uppercase()).unwrap(), u);
        assert!(parse_uuid("6ba7b8109dad11d180b400c04fd430c8").is_err());
        assert!(parse_uuid("6ba7b810-9dad-11d1-80b4-00c04fd430cg").is_err());
        assert!(parse_uuid("6ba7b810-9dad-11d1-80b4_00c04fd430c8").is_err());
    }

    #[test]
    fn hex_ids() {
        let n = parse_nguid("000102030405060708090a0b0c0d0e0F").unwrap();
        assert_eq!(n[15], 15);
        assert_eq!(format_nguid(&n), "000102030405060708090A0B0C0D0E0F");
        assert!(parse_nguid("0001").is_err());
        assert!(parse_eui64("00010203040506zz").is_err());
        assert_eq!(
            format_eui64(&parse_eui64("abcdef0123456789").unwrap()),
            "ABCDEF0123456789"
        );
    }

    #[test]
    fn derived_ids_are_stable_and_marked() {
        let a = derive_namespace_ids("nqn.2024-01.io.nvmfd:a", 1, "Malloc0", None);
        let b = derive_namespace_ids("nqn.2024-01.io.nvmfd:a", 1, "Malloc0", None);
        assert_eq!(a, b);
        assert_eq!(a.uuid[6] >> 4, 8);
        assert_eq!(a.uuid[8] & 0xc0, 0x80);
        assert_eq!(a.eui64[0] & 0x03, 0x02);
        let c = derive_namespace_ids("nqn.2024-01.io.nvmfd:a", 2, "Malloc0", None);
        assert_ne!(a.nguid, c.nguid);
        let u = Uuid16(parse_uuid("6ba7b810-9dad-11d1-80b4-00c04fd430c8").unwrap());
        let d = derive_namespace_ids("nqn.2024-01.io.nvmfd:a", 1, "Malloc0", Some(&u));
        assert_eq!(d.uuid, u.0);
        assert_eq!(d.nguid, u.0);
    }

    #[test]
    fn random_ids_differ() {
        let a = random_namespace_ids();
        let b = random_namespace_ids();
        assert_ne!(a, b);
        assert_eq!(a.uuid[6] >> 4, 4);
        assert_eq!(a.eui64[0] & 0x03, 0x02);
    }
}
