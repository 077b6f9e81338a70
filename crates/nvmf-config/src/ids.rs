//! Owns namespace identifiers (NGUID, EUI-64, UUID): their text forms (parse
//! and format, as SPDK writes them), deterministic derivation for namespaces
//! the config gives none for, and fresh random ones for future RPC use.
//! SHA-256 (derivation) comes from `sha2`, UUID text forms from `uuid`.

use sha2::{Digest, Sha256};
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

/// Parses a UUID in the 8-4-4-4-12 form (either case); the other forms the
/// `uuid` crate knows (simple, braced, URN) are refused, as SPDK writes only
/// this one.
pub fn parse_uuid(s: &str) -> Result<[u8; 16], String> {
    let bad = || format!("UUID must look like xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, got \"{s}\"");
    if s.len() != 36 {
        return Err(bad());
    }
    uuid::Uuid::try_parse(s)
        .map(|u| *u.as_bytes())
        .map_err(|_| bad())
}

/// Formats a UUID as 8-4-4-4-12 lower-case hex (SPDK's form).
pub fn format_uuid(b: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*b).hyphenated().to_string()
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
        h.update(nsid.to_be_bytes());
        h.update(bdev_name.as_bytes());
        h.update(b"\0");
        if let Some(u) = bdev_uuid {
            h.update(u.0);
        }
        h.finalize().into()
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
        h.update(now.to_le_bytes());
        h.update(std::process::id().to_le_bytes());
        h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        let a: [u8; 32] = h.finalize().into();
        let b: [u8; 32] = Sha256::digest(a).into();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Derived identifiers are what hosts see as the disk's identity
    /// (udev names, multipath WWIDs): they must never change for a given
    /// (subsystem NQN, NSID, bdev). These values were computed before the
    /// hand-written SHA-256 and UUID code gave way to `sha2` and `uuid`.
    #[test]
    fn derived_ids_never_change() {
        let u: Uuid16 = "6ba7b810-9dad-11d1-80b4-00c04fd430c8".parse().unwrap();
        for (nqn, nsid, bdev, uuid, want) in [
            (
                "nqn.2016-06.io.spdk:cnode1",
                1u32,
                "Malloc0",
                None,
                "9048A63BB00783F316029F7C43D91639 22F75DCD0575BB16 1d059472-8180-80dd-bafc-6e8dc34d6e73",
            ),
            (
                "nqn.2024-01.io.nvmfd:default",
                7,
                "Null3",
                None,
                "F477BF1954638B16A4CEA5E10766B0FE 46370F44E8655B55 9929cfb8-b095-8ab1-8ac9-66f3db55465c",
            ),
            (
                "nqn.x",
                2,
                "B",
                Some(u),
                "6BA7B8109DAD11D180B400C04FD430C8 12E14B8A17EC1363 6ba7b810-9dad-11d1-80b4-00c04fd430c8",
            ),
        ] {
            let ids = derive_namespace_ids(nqn, nsid, bdev, uuid.as_ref());
            let got = format!(
                "{} {} {}",
                format_nguid(&ids.nguid),
                format_eui64(&ids.eui64),
                format_uuid(&ids.uuid)
            );
            assert_eq!(got, want, "{nqn} nsid {nsid} bdev {bdev}");
        }
    }

    #[test]
    fn uuid_text_round_trip() {
        let s = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";
        let u = parse_uuid(s).unwrap();
        assert_eq!(format_uuid(&u), s);
        assert_eq!(parse_uuid(&s.to_uppercase()).unwrap(), u);
        assert!(parse_uuid("6ba7b8109dad11d180b400c04fd430c8").is_err());
        assert!(parse_uuid("{6ba7b810-9dad-11d1-80b4-00c04fd430c}").is_err());
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
