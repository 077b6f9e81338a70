//! NVMe/TCP TLS pre-shared keys: the PSK interchange format (`NVMeTLSkey-1:HH:base64(key || crc32):`),
//! the retained PSK (HKDF with the host NQN), the PSK digest, the TLS PSK identities (`NVMe0R0x` and
//! `NVMe1R0x` forms) and the TLS PSK handed to the handshake. Hash crates only; no TLS library here.
//!
//! Derivations (NVMe/TCP transport spec, secure channel; the Linux host's libnvme/keyring use the same):
//! - retained PSK = HKDF-Expand-Label(HKDF-Extract(0, configured PSK), "HostNQN", host NQN, L)
//!   (interchange hash 00: the configured PSK is used as the retained PSK unchanged);
//! - PSK digest = base64(HMAC(retained PSK, "<hostnqn> <subnqn> NVMe-over-Fabrics"));
//! - TLS PSK = HKDF-Expand-Label(HKDF-Extract(0, retained PSK), "nvme-tls-psk", context, L) where the
//!   context is `"0x <digest>"` (x = hash id) for the version-1 identity.
//!
//! HKDF-Expand-Label is TLS 1.3's: info = u16 L || u8 len || "tls13 " label || u8 len || context.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Sha256, Sha384};

/// Prefix of every PSK in interchange format.
pub const PREFIX: &str = "NVMeTLSkey-1:";

/// Hash named by a PSK: the `HH` field of the interchange format, and the hash of the identity and
/// cipher suite (SHA-256 → TLS_AES_128_GCM_SHA256, SHA-384 → TLS_AES_256_GCM_SHA384).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PskHash {
    Sha256,
    Sha384,
}

impl PskHash {
    /// Two-digit id used in the identity (`NVMe0R01`, `NVMe0R02`).
    pub fn id(self) -> u8 {
        match self {
            PskHash::Sha256 => 1,
            PskHash::Sha384 => 2,
        }
    }
    /// Key and digest length of this hash.
    pub fn key_len(self) -> usize {
        match self {
            PskHash::Sha256 => 32,
            PskHash::Sha384 => 48,
        }
    }
    /// OpenSSL / IANA name of the TLS 1.3 cipher suite this PSK goes with.
    pub fn cipher_suite(self) -> &'static str {
        match self {
            PskHash::Sha256 => "TLS_AES_128_GCM_SHA256",
            PskHash::Sha384 => "TLS_AES_256_GCM_SHA384",
        }
    }
}

/// Why a PSK string or an input to a derivation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PskError {
    #[error("PSK does not start with \"NVMeTLSkey-1:\"")]
    BadPrefix,
    #[error("PSK hash field {0:?} is not 00, 01 or 02")]
    BadHash(String),
    #[error("PSK has no ':' after the hash field or the key")]
    MissingColon,
    #[error("PSK key is not valid base64: {0}")]
    BadBase64(String),
    #[error(
        "PSK key is {0} bytes after base64 decoding; need 36 or 52 (32 or 48 key bytes + CRC-32)"
    )]
    BadLength(usize),
    #[error("PSK hash {hash:02} needs a {need}-byte key, this one has {got}")]
    HashLengthMismatch { hash: u8, need: usize, got: usize },
    #[error("PSK CRC-32 mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadCrc { stored: u32, computed: u32 },
    #[error("{what} is {len} bytes; the HKDF label context allows at most 255")]
    ContextTooLong { what: &'static str, len: usize },
    #[error("{what} contains a space or control character")]
    BadNqn { what: &'static str },
}

/// A configured PSK parsed from the interchange format.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    /// `None` for hash field 00 (the key is the retained PSK as is).
    transform: Option<PskHash>,
    key: Vec<u8>,
}

// Never print key bytes.
impl std::fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfiguredPsk")
            .field("transform", &self.transform)
            .field("key_len", &self.key.len())
            .finish()
    }
}

impl ConfiguredPsk {
    /// A PSK from raw key bytes; `transform` None means hash field 00.
    pub fn new(transform: Option<PskHash>, key: &[u8]) -> Result<Self, PskError> {
        check_len(transform, key.len())?;
        Ok(ConfiguredPsk {
            transform,
            key: key.to_vec(),
        })
    }

    /// Parse `NVMeTLSkey-1:HH:base64(key || crc32-le):` (surrounding white space ignored).
    pub fn parse(text: &str) -> Result<Self, PskError> {
        let rest = text
            .trim()
            .strip_prefix(PREFIX)
            .ok_or(PskError::BadPrefix)?;
        let (hh, rest) = rest.split_once(':').ok_or(PskError::MissingColon)?;
        let transform = match hh {
            "00" => None,
            "01" => Some(PskHash::Sha256),
            "02" => Some(PskHash::Sha384),
            other => return Err(PskError::BadHash(other.to_string())),
        };
        let b64 = rest.strip_suffix(':').ok_or(PskError::MissingColon)?;
        let raw = B64
            .decode(b64)
            .map_err(|e| PskError::BadBase64(e.to_string()))?;
        if raw.len() != 36 && raw.len() != 52 {
            return Err(PskError::BadLength(raw.len()));
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        check_len(transform, key.len())?;
        let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        let computed = crc32fast::hash(key);
        if stored != computed {
            return Err(PskError::BadCrc { stored, computed });
        }
        Ok(ConfiguredPsk {
            transform,
            key: key.to_vec(),
        })
    }

    /// The interchange form of this PSK (what `parse` reads back).
    pub fn to_interchange(&self) -> String {
        let hh = self.transform.map_or(0, PskHash::id);
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        format!("{PREFIX}{hh:02}:{}:", B64.encode(raw))
    }

    /// Hash of identity, digest and cipher suite: the transform, or for 00 the one matching the key length.
    pub fn hash(&self) -> PskHash {
        self.transform.unwrap_or(if self.key.len() == 48 {
            PskHash::Sha384
        } else {
            PskHash::Sha256
        })
    }

    /// The retained PSK for `hostnqn`.
    pub fn retained(&self, hostnqn: &str) -> Result<Vec<u8>, PskError> {
        check_nqn("host NQN", hostnqn)?;
        match self.transform {
            None => Ok(self.key.clone()),
            Some(h) => hkdf_expand_label(h, &self.key, "HostNQN", hostnqn.as_bytes(), h.key_len()),
        }
    }

    /// Everything the handshake needs for one host/subsystem pair, version-1 identity (with digest).
    pub fn tls_psk_v1(&self, hostnqn: &str, subnqn: &str) -> Result<TlsPsk, PskError> {
        let hash = self.hash();
        let retained = self.retained(hostnqn)?;
        let digest = psk_digest(hash, &retained, hostnqn, subnqn)?;
        let identity = identity_v1(hash, hostnqn, subnqn, &digest)?;
        let context = format!("{:02} {digest}", hash.id());
        let key = hkdf_expand_label(
            hash,
            &retained,
            "nvme-tls-psk",
            context.as_bytes(),
            hash.key_len(),
        )?;
        Ok(TlsPsk {
            hash,
            identity,
            key,
        })
    }

    /// Version-0 identity (`NVMe0R0x host sub`): the Linux host's compatibility form, where the
    /// retained PSK is used as the TLS PSK (libnvme's behaviour for version 0; see docs/TLS.md).
    pub fn tls_psk_v0(&self, hostnqn: &str, subnqn: &str) -> Result<TlsPsk, PskError> {
        let hash = self.hash();
        Ok(TlsPsk {
            hash,
            identity: identity_v0(hash, hostnqn, subnqn)?,
            key: self.retained(hostnqn)?,
        })
    }
}

/// A TLS PSK ready for the handshake: identity string, key bytes and the cipher suite's hash.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsPsk {
    pub hash: PskHash,
    pub identity: String,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for TlsPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPsk")
            .field("hash", &self.hash)
            .field("identity", &self.identity)
            .field("key_len", &self.key.len())
            .finish()
    }
}

/// `NVMe0R0x <hostnqn> <subnqn>`.
pub fn identity_v0(hash: PskHash, hostnqn: &str, subnqn: &str) -> Result<String, PskError> {
    check_nqn("host NQN", hostnqn)?;
    check_nqn("subsystem NQN", subnqn)?;
    Ok(format!("NVMe0R{:02} {hostnqn} {subnqn}", hash.id()))
}

/// `NVMe1R0x <hostnqn> <subnqn> <PSK digest>`.
pub fn identity_v1(
    hash: PskHash,
    hostnqn: &str,
    subnqn: &str,
    digest: &str,
) -> Result<String, PskError> {
    check_nqn("host NQN", hostnqn)?;
    check_nqn("subsystem NQN", subnqn)?;
    Ok(format!(
        "NVMe1R{:02} {hostnqn} {subnqn} {digest}",
        hash.id()
    ))
}

/// base64(HMAC-hash(retained, "<hostnqn> <subnqn> NVMe-over-Fabrics")).
pub fn psk_digest(
    hash: PskHash,
    retained: &[u8],
    hostnqn: &str,
    subnqn: &str,
) -> Result<String, PskError> {
    check_nqn("host NQN", hostnqn)?;
    check_nqn("subsystem NQN", subnqn)?;
    let msg = format!("{hostnqn} {subnqn} NVMe-over-Fabrics");
    let mac = match hash {
        PskHash::Sha256 => {
            let mut m =
                <Hmac<Sha256> as Mac>::new_from_slice(retained).expect("HMAC takes any key");
            m.update(msg.as_bytes());
            m.finalize().into_bytes().to_vec()
        }
        PskHash::Sha384 => {
            let mut m =
                <Hmac<Sha384> as Mac>::new_from_slice(retained).expect("HMAC takes any key");
            m.update(msg.as_bytes());
            m.finalize().into_bytes().to_vec()
        }
    };
    Ok(B64.encode(mac))
}

/// HKDF-Extract (no salt) then TLS 1.3 HKDF-Expand-Label.
pub fn hkdf_expand_label(
    hash: PskHash,
    ikm: &[u8],
    label: &str,
    context: &[u8],
    len: usize,
) -> Result<Vec<u8>, PskError> {
    let full = format!("tls13 {label}");
    if context.len() > 255 {
        return Err(PskError::ContextTooLong {
            what: "label context",
            len: context.len(),
        });
    }
    let mut info = Vec::with_capacity(4 + full.len() + context.len());
    info.extend_from_slice(&(len as u16).to_be_bytes());
    info.push(full.len() as u8);
    info.extend_from_slice(full.as_bytes());
    info.push(context.len() as u8);
    info.extend_from_slice(context);
    let mut out = vec![0u8; len];
    match hash {
        PskHash::Sha256 => Hkdf::<Sha256>::new(None, ikm)
            .expand(&info, &mut out)
            .expect("length ≤ 255 × hash"),
        PskHash::Sha384 => Hkdf::<Sha384>::new(None, ikm)
            .expand(&info, &mut out)
            .expect("length ≤ 255 × hash"),
    }
    Ok(out)
}

fn check_len(transform: Option<PskHash>, len: usize) -> Result<(), PskError> {
    match transform {
        None if len == 32 || len == 48 => Ok(()),
        None => Err(PskError::BadLength(len + 4)),
        Some(h) if h.key_len() == len => Ok(()),
        Some(h) => Err(PskError::HashLengthMismatch {
            hash: h.id(),
            need: h.key_len(),
            got: len,
        }),
    }
}

fn check_nqn(what: &'static str, nqn: &str) -> Result<(), PskError> {
    if nqn.len() > 255 {
        return Err(PskError::ContextTooLong {
            what,
            len: nqn.len(),
        });
    }
    if nqn.is_empty() || nqn.chars().any(|c| c == ' ' || c.is_control()) {
        return Err(PskError::BadNqn { what });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    // Expected values were computed independently with Python's hmac/hashlib (HKDF-Extract/Expand
    // written out by hand from RFC 5869 / RFC 8446 §7.1, zlib.crc32, base64); see docs/TLS.md.
    use super::*;

    /// Example PSK printed in the Linux/nvme-cli documentation (its CRC checks out).
    const EXAMPLE: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    const SHA384_KEY: &str =
        "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
    const SUB: &str = "nqn.2024-01.io.nvmfd:tls1";

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn parses_and_round_trips() {
        for s in [EXAMPLE, SHA384_KEY] {
            let k = ConfiguredPsk::parse(s).unwrap();
            assert_eq!(k.to_interchange(), s);
        }
        assert_eq!(
            ConfiguredPsk::parse(EXAMPLE).unwrap().hash(),
            PskHash::Sha256
        );
        assert_eq!(
            ConfiguredPsk::parse(SHA384_KEY).unwrap().hash(),
            PskHash::Sha384
        );
        let raw = ConfiguredPsk::new(None, &[7u8; 48]).unwrap();
        assert_eq!(ConfiguredPsk::parse(&raw.to_interchange()).unwrap(), raw);
        assert_eq!(raw.hash(), PskHash::Sha384);
        // Debug never shows key bytes.
        assert!(!format!("{raw:?}").contains("7, 7"));
    }

    #[test]
    fn refuses_malformed() {
        let e = |s: &str| ConfiguredPsk::parse(s).unwrap_err();
        assert_eq!(e("DHHC-1:01:abcd:"), PskError::BadPrefix);
        assert_eq!(e("NVMeTLSkey-1:03:AAAA:"), PskError::BadHash("03".into()));
        assert_eq!(e("NVMeTLSkey-1:01"), PskError::MissingColon);
        assert_eq!(
            e("NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ"),
            PskError::MissingColon
        );
        assert!(matches!(e("NVMeTLSkey-1:01:!!!!:"), PskError::BadBase64(_)));
        assert_eq!(e("NVMeTLSkey-1:01:AAAA:"), PskError::BadLength(3));
        assert_eq!(
            e(&SHA384_KEY.replace(":02:", ":01:")),
            PskError::HashLengthMismatch {
                hash: 1,
                need: 32,
                got: 48
            }
        );
        // Flip one key character: CRC must catch it.
        let bad = EXAMPLE.replace("VRLb", "VRLc");
        assert!(matches!(e(&bad), PskError::BadCrc { .. }));
        assert!(ConfiguredPsk::new(None, &[0; 40]).is_err());
    }

    #[test]
    fn derives_sha256() {
        let k = ConfiguredPsk::parse(EXAMPLE).unwrap();
        assert_eq!(
            hex(&k.retained(HOST).unwrap()),
            "f0af1bc718d4f23bdd7c1683a3d79bd953ea789d106a0f5207bb574bbe5446ce"
        );
        let t = k.tls_psk_v1(HOST, SUB).unwrap();
        assert_eq!(
            t.identity,
            format!("NVMe1R01 {HOST} {SUB} D8KxRam10GjHGSoTiKxD8KYob8CvGws5Syt/kONDl3Y=")
        );
        assert_eq!(
            hex(&t.key),
            "69b67c0ca20646816b6df9c9df6947041f1334b11f3ff7a1c96b450c720258cc"
        );
        let v0 = k.tls_psk_v0(HOST, SUB).unwrap();
        assert_eq!(v0.identity, format!("NVMe0R01 {HOST} {SUB}"));
        assert_eq!(v0.key, k.retained(HOST).unwrap());
        assert_eq!(t.hash.cipher_suite(), "TLS_AES_128_GCM_SHA256");
    }

    #[test]
    fn derives_sha384() {
        let k = ConfiguredPsk::parse(SHA384_KEY).unwrap();
        assert_eq!(
            hex(&k.retained(HOST).unwrap()),
            "9199e9844a95310712a6436350cb36769e36bb02461989493acb7f9419f9d1ca81374a176479e87994f6c7c17c5f2800"
        );
        let t = k.tls_psk_v1(HOST, SUB).unwrap();
        assert!(t
            .identity
            .ends_with(" urSuSitCoxBcxpk6A1vYtN24/I5uNUZTjxBUa5n6iiO9D5LWJQISr0bo4wvB0VuE"));
        assert!(t.identity.starts_with("NVMe1R02 "));
        assert_eq!(
            hex(&t.key),
            "6649c7a1bd147854e152850f9362b53bd928bc356978074f53a91687ee76a359f9d32bd990f1b1de4ec85c628faebc35"
        );
    }

    #[test]
    fn refuses_bad_nqns() {
        let k = ConfiguredPsk::parse(EXAMPLE).unwrap();
        assert!(matches!(k.retained(""), Err(PskError::BadNqn { .. })));
        assert!(matches!(
            k.tls_psk_v1(HOST, "a b"),
            Err(PskError::BadNqn { .. })
        ));
        let long = "n".repeat(300);
        assert!(matches!(
            k.retained(&long),
            Err(PskError::ContextTooLong { .. })
        ));
    }
}
