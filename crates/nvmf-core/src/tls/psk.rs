//! NVMe/TCP TLS pre-shared keys: the PSK interchange format (`NVMeTLSkey-1:HH:base64(key || crc32):`),
//! the retained PSK (HKDF with the host NQN), the PSK digest, the TLS PSK identities (`NVMe0R0x` and
//! `NVMe1R0x` forms) and the TLS PSK handed to the handshake. Hash crates only; no TLS library here.
//!
//! Derivations (NVMe/TCP transport spec, "TLS PSK and PSK identity derivation"):
//! - retained PSK = HKDF-Expand-Label(HKDF-Extract(0, configured PSK), "HostNQN", host NQN, L)
//!   (interchange hash 00: the configured PSK is used as the retained PSK unchanged);
//! - PSK digest = base64(HMAC(retained PSK, "<hostnqn> <subnqn> NVMe-over-Fabrics"));
//! - TLS PSK = HKDF-Expand-Label(HKDF-Extract(0, retained PSK), "nvme-tls-psk", context, L), where
//!   the context is `"0x <digest>"` (x = hash id) for the version-1 identity and the whole
//!   version-0 identity string (`NVMe0R0x <hostnqn> <subnqn>`) for version 0.
//!
//! Peers disagree on how HKDF-Expand-Label's "info" is encoded ([`PskLabels`]): SPDK (host and
//! target) encodes it as RFC 8446 §7.1 and the spec say (big-endian L, a length byte before the
//! "tls13 " label and before the context); the Linux host's userland (libnvme 1.13 / nvme-cli 2.13,
//! checked in a 6.12 guest by crates/nvmf-interop/tests/tls.rs) writes L little-endian and no
//! length bytes. The identity does not say which one a host used (both offer `NVMe0R01 host sub`),
//! so the target derives both and keeps the one the ClientHello's PSK binder verifies with
//! (`binder.rs`). The `tls_psk_v0`/`tls_psk_v1`/`retained` shorthands are the libnvme encoding.

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

/// How the HKDF "info" (HkdfLabel) of the retained-PSK and TLS-PSK derivations is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PskLabels {
    /// RFC 8446 §7.1, as the NVMe/TCP spec's HKDF-Expand-Label says: u16 L big-endian, u8 length
    /// + "tls13 " + label, u8 length + context. SPDK's host and target.
    Rfc8446,
    /// The Linux host's userland (libnvme 1.13): u16 L little-endian || "tls13 " || label ||
    /// context, no length bytes.
    Libnvme,
}

impl PskLabels {
    /// Both encodings, the Linux host's first.
    pub const ALL: [PskLabels; 2] = [PskLabels::Libnvme, PskLabels::Rfc8446];

    /// For logs.
    pub fn name(self) -> &'static str {
        match self {
            PskLabels::Rfc8446 => "RFC 8446 HKDF labels",
            PskLabels::Libnvme => "libnvme HKDF labels",
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
    #[error("a traffic secret of {got} bytes; its hash needs {need}")]
    ShortSecret { need: usize, got: usize },
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

    /// The retained PSK for `hostnqn` (libnvme's encoding; see [`Self::retained_with`]).
    pub fn retained(&self, hostnqn: &str) -> Result<Vec<u8>, PskError> {
        self.retained_with(hostnqn, PskLabels::Libnvme)
    }

    /// The retained PSK for `hostnqn` with the HKDF info encoded as `labels` says.
    pub fn retained_with(&self, hostnqn: &str, labels: PskLabels) -> Result<Vec<u8>, PskError> {
        check_nqn("host NQN", hostnqn)?;
        match self.transform {
            None => Ok(self.key.clone()),
            Some(h) => expand(
                labels,
                h,
                &self.key,
                "HostNQN",
                &[hostnqn.as_bytes()],
                h.key_len(),
            ),
        }
    }

    /// Everything the handshake needs for one host/subsystem pair, version-1 identity (with
    /// digest), libnvme's encoding.
    pub fn tls_psk_v1(&self, hostnqn: &str, subnqn: &str) -> Result<TlsPsk, PskError> {
        self.tls_psk_v1_with(hostnqn, subnqn, PskLabels::Libnvme)
    }

    /// Version-1 identity and its TLS PSK, the HKDF info encoded as `labels` says.
    pub fn tls_psk_v1_with(
        &self,
        hostnqn: &str,
        subnqn: &str,
        labels: PskLabels,
    ) -> Result<TlsPsk, PskError> {
        let hash = self.hash();
        let retained = self.retained_with(hostnqn, labels)?;
        let digest = psk_digest(hash, &retained, hostnqn, subnqn)?;
        let identity = identity_v1(hash, hostnqn, subnqn, &digest)?;
        let hash_id = format!("{:02} ", hash.id());
        let key = expand(
            labels,
            hash,
            &retained,
            "nvme-tls-psk",
            &[hash_id.as_bytes(), digest.as_bytes()],
            hash.key_len(),
        )?;
        Ok(TlsPsk {
            hash,
            identity,
            key,
            labels,
        })
    }

    /// Version-0 identity (`NVMe0R0x host sub`, NVMe/TCP 1.0c): the TLS PSK is derived from the
    /// retained PSK with the identity string itself as the context (what libnvme inserts for
    /// `--identity=0`; see docs/TLS.md). libnvme's encoding.
    pub fn tls_psk_v0(&self, hostnqn: &str, subnqn: &str) -> Result<TlsPsk, PskError> {
        self.tls_psk_v0_with(hostnqn, subnqn, PskLabels::Libnvme)
    }

    /// Version-0 identity and its TLS PSK, the HKDF info encoded as `labels` says (SPDK's host
    /// offers only this identity, with [`PskLabels::Rfc8446`]).
    pub fn tls_psk_v0_with(
        &self,
        hostnqn: &str,
        subnqn: &str,
        labels: PskLabels,
    ) -> Result<TlsPsk, PskError> {
        let hash = self.hash();
        let identity = identity_v0(hash, hostnqn, subnqn)?;
        let retained = self.retained_with(hostnqn, labels)?;
        let key = expand(
            labels,
            hash,
            &retained,
            "nvme-tls-psk",
            &[identity.as_bytes()],
            hash.key_len(),
        )?;
        Ok(TlsPsk {
            hash,
            identity,
            key,
            labels,
        })
    }
}

/// A TLS PSK ready for the handshake: identity string, key bytes and the cipher suite's hash.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsPsk {
    pub hash: PskHash,
    pub identity: String,
    pub key: Vec<u8>,
    /// How the key was derived (which encoding the peer must use too).
    pub labels: PskLabels,
}

impl std::fmt::Debug for TlsPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPsk")
            .field("hash", &self.hash)
            .field("identity", &self.identity)
            .field("key_len", &self.key.len())
            .field("labels", &self.labels)
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

/// HKDF-Extract (no salt) then HKDF-Expand with `label` and the concatenated `context` pieces,
/// the info encoded as `labels` says.
fn expand(
    labels: PskLabels,
    hash: PskHash,
    ikm: &[u8],
    label: &str,
    context: &[&[u8]],
    len: usize,
) -> Result<Vec<u8>, PskError> {
    match labels {
        PskLabels::Libnvme => Ok(nvme_expand(hash, ikm, label, context, len)),
        PskLabels::Rfc8446 => hkdf_expand_label(hash, ikm, label, &context.concat(), len),
    }
}

/// HKDF-Extract (no salt) then HKDF-Expand with the info the Linux userland builds (see the top
/// comment): u16 `len` little-endian || "tls13 " || label || the context pieces, no length bytes.
fn nvme_expand(hash: PskHash, ikm: &[u8], label: &str, context: &[&[u8]], len: usize) -> Vec<u8> {
    let mut info = Vec::with_capacity(128);
    info.extend_from_slice(&(len as u16).to_le_bytes());
    info.extend_from_slice(b"tls13 ");
    info.extend_from_slice(label.as_bytes());
    for c in context {
        info.extend_from_slice(c);
    }
    hkdf(hash, Some(ikm), None, &info, len)
}

/// RFC 8446 §7.1's HkdfLabel: u16 `len` big-endian, u8 length + "tls13 " + `label`, u8 length +
/// `context`. Errors if the context is over 255 bytes (a version-0 identity of two long NQNs).
pub fn hkdf_label(label: &str, context: &[u8], len: usize) -> Result<Vec<u8>, PskError> {
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
    Ok(info)
}

/// HKDF-Extract (no salt) then TLS 1.3 HKDF-Expand-Label as RFC 8446 §7.1 encodes it (the
/// NVMe/TCP spec's derivation, SPDK's encoding).
pub fn hkdf_expand_label(
    hash: PskHash,
    ikm: &[u8],
    label: &str,
    context: &[u8],
    len: usize,
) -> Result<Vec<u8>, PskError> {
    Ok(hkdf(
        hash,
        Some(ikm),
        None,
        &hkdf_label(label, context, len)?,
        len,
    ))
}

/// TLS 1.3 HKDF-Expand-Label with an empty context straight from `prk` (a traffic secret; RFC 8446
/// §7.3 derives the record key and IV this way). Errors if `prk` is shorter than the hash.
pub fn hkdf_expand_label_prk(
    hash: PskHash,
    prk: &[u8],
    label: &str,
    len: usize,
) -> Result<Vec<u8>, PskError> {
    let want = match hash {
        PskHash::Sha256 => 32,
        PskHash::Sha384 => 48,
    };
    if prk.len() < want {
        return Err(PskError::ShortSecret {
            need: want,
            got: prk.len(),
        });
    }
    Ok(hkdf(
        hash,
        None,
        Some(prk),
        &hkdf_label(label, &[], len)?,
        len,
    ))
}

/// HKDF-Expand of `info` to `len` bytes from HKDF-Extract(zero salt, `ikm`), or from `prk` as is.
pub(crate) fn hkdf(
    hash: PskHash,
    ikm: Option<&[u8]>,
    prk: Option<&[u8]>,
    info: &[u8],
    len: usize,
) -> Vec<u8> {
    let mut out = vec![0u8; len];
    match hash {
        PskHash::Sha256 => {
            let h = match (ikm, prk) {
                (Some(k), _) => Hkdf::<Sha256>::new(None, k),
                (None, Some(p)) => Hkdf::<Sha256>::from_prk(p).expect("PRK of the hash's length"),
                (None, None) => unreachable!("ikm or prk"),
            };
            h.expand(info, &mut out).expect("length ≤ 255 × hash")
        }
        PskHash::Sha384 => {
            let h = match (ikm, prk) {
                (Some(k), _) => Hkdf::<Sha384>::new(None, k),
                (None, Some(p)) => Hkdf::<Sha384>::from_prk(p).expect("PRK of the hash's length"),
                (None, None) => unreachable!("ikm or prk"),
            };
            h.expand(info, &mut out).expect("length ≤ 255 × hash")
        }
    }
    out
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
    // written out by hand from RFC 5869 with libnvme's info encoding, zlib.crc32, base64), and
    // `linux_612_vectors` holds what nvme-cli 2.13 / libnvme 1.13 put into a 6.12 guest's .nvme
    // keyring; see docs/TLS.md. `derives_with_rfc8446_labels` holds the spec's (SPDK's) encoding.
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
            "c8304c516f121bc4cd37c9d434635c70ed18c8809004448c3d7ff17b8265ac5e"
        );
        let t = k.tls_psk_v1(HOST, SUB).unwrap();
        assert_eq!(
            t.identity,
            format!("NVMe1R01 {HOST} {SUB} OTZoyzPNylRZQXcv6cV706nolb9wKoYQxJSQwUEQzIk=")
        );
        assert_eq!(
            hex(&t.key),
            "c16d9b7995f45d91ffb25a1decdfb8600eac8e73dcd031168cffd5989619a99c"
        );
        let v0 = k.tls_psk_v0(HOST, SUB).unwrap();
        assert_eq!(v0.identity, format!("NVMe0R01 {HOST} {SUB}"));
        assert_eq!(
            hex(&v0.key),
            "711176a2a435098c943812fe7dc5e523fe4bf36e5f857b194558d657e502152b"
        );
        assert_eq!(t.hash.cipher_suite(), "TLS_AES_128_GCM_SHA256");
    }

    #[test]
    fn derives_sha384() {
        let k = ConfiguredPsk::parse(SHA384_KEY).unwrap();
        assert_eq!(
            hex(&k.retained(HOST).unwrap()),
            "ea105ee8428afdba7ac84740c2acc77a9d5d3226b0b0908931dc92d917dfda80e102f0052555c88af7116d40da771a70"
        );
        let t = k.tls_psk_v1(HOST, SUB).unwrap();
        assert!(t
            .identity
            .ends_with(" OwMaSm+w9NH4EucRiy0HoX5yHBaJ8UFGQqXtgwDz7Zx0zv9EXch6BQ/37IWWt0S0"));
        assert!(t.identity.starts_with("NVMe1R02 "));
        assert_eq!(
            hex(&t.key),
            "ecf481b52ea52e6478aa7966f1570705ec5b2bc366c7b84917562099cd8756bcfeb079ac9010a728fa7303a916baff59"
        );
        assert_eq!(
            hex(&k.tls_psk_v0(HOST, SUB).unwrap().key),
            "622cfda9d49d5e3a78d9819523e6f27e8a7564f85e941aa257d47fc92d7c9855d204a859839dcca6a8f7a4c481e018e1"
        );
    }

    /// Identity (key description) and payload of the keys `nvme check-tls-key --insert
    /// --identity=0|1` (nvme-cli 2.13, libnvme 1.13) put into a Linux 6.12 guest's `.nvme` keyring.
    #[test]
    fn linux_612_vectors() {
        const H: &str = "nqn.2014-08.org.nvmexpress:uuid:6f1b1f3c-0c52-4c6e-9d1e-6e7666d00001";
        const S: &str = "nqn.2016-06.io.nvmfd:tls";
        let k = ConfiguredPsk::parse(EXAMPLE).unwrap();
        let v1 = k.tls_psk_v1(H, S).unwrap();
        assert_eq!(
            v1.identity,
            format!("NVMe1R01 {H} {S} kgnpirqSGMPKX/RMPODGt2hyFvA3VIcx+QVVgrzBkfw=")
        );
        assert_eq!(
            hex(&v1.key),
            "903c56e271f736a3d380acf773e297a8b223b3b17624af2019e0fbb2f2703b05"
        );
        let v0 = k.tls_psk_v0(H, S).unwrap();
        assert_eq!(v0.identity, format!("NVMe0R01 {H} {S}"));
        assert_eq!(
            hex(&v0.key),
            "d9123c26b2fb82996001978e941500bb3d971ee76272bdd653414767200adc52"
        );
        let k = ConfiguredPsk::parse(SHA384_KEY).unwrap();
        let v1 = k.tls_psk_v1(H, S).unwrap();
        assert_eq!(
            v1.identity,
            format!(
                "NVMe1R02 {H} {S} F1bIK7+ZWHfO/QnHzEZhQYlXUYfA8SWoLXkocW96Rdhu29Y9wI+vsadY6rI0lQhm"
            )
        );
        assert_eq!(hex(&v1.key), "2252fb9c78086e4c999f84a1c7db1e0599d120eb0af63d775d4c7c75bcdb0449fd7fdc92e69abca9efb9e3cd9acc8d43");
        assert_eq!(hex(&k.tls_psk_v0(H, S).unwrap().key), "2d8271244a0bf57b08e9de874ae64f6a341659d0c8a5f04cfd9e7b78267e2d6d147d0e0426c7e139dd57ab2d9464fb07");
    }

    /// The spec's encoding (RFC 8446 HkdfLabel), what SPDK's host and target use. Expected values
    /// computed independently from the spec and RFC 8446 §7.1 / RFC 5869 in Python (HMAC by hand,
    /// `struct.pack(">H", L) + bytes([len("tls13 " + label)]) + ... + bytes([len(ctx)]) + ctx`).
    #[test]
    fn derives_with_rfc8446_labels() {
        let r = PskLabels::Rfc8446;
        let k = ConfiguredPsk::parse(EXAMPLE).unwrap();
        assert_eq!(
            hex(&k.retained_with(HOST, r).unwrap()),
            "f0af1bc718d4f23bdd7c1683a3d79bd953ea789d106a0f5207bb574bbe5446ce"
        );
        let v0 = k.tls_psk_v0_with(HOST, SUB, r).unwrap();
        assert_eq!(v0.identity, format!("NVMe0R01 {HOST} {SUB}"));
        assert_eq!(v0.labels, r);
        assert_eq!(
            hex(&v0.key),
            "a6792b468a631fd2717858bd0e3f50a5188b7308e319f1455f623bcaa2a742cb"
        );
        // Same identity string as libnvme's version 0, another key: only the binder tells them apart.
        assert_eq!(v0.identity, k.tls_psk_v0(HOST, SUB).unwrap().identity);
        assert_ne!(v0.key, k.tls_psk_v0(HOST, SUB).unwrap().key);
        let v1 = k.tls_psk_v1_with(HOST, SUB, r).unwrap();
        assert_eq!(
            v1.identity,
            format!("NVMe1R01 {HOST} {SUB} D8KxRam10GjHGSoTiKxD8KYob8CvGws5Syt/kONDl3Y=")
        );
        assert_eq!(
            hex(&v1.key),
            "69b67c0ca20646816b6df9c9df6947041f1334b11f3ff7a1c96b450c720258cc"
        );

        let k = ConfiguredPsk::parse(SHA384_KEY).unwrap();
        assert_eq!(
            hex(&k.retained_with(HOST, r).unwrap()),
            "9199e9844a95310712a6436350cb36769e36bb02461989493acb7f9419f9d1ca81374a176479e87994f6c7c17c5f2800"
        );
        let v0 = k.tls_psk_v0_with(HOST, SUB, r).unwrap();
        assert_eq!(v0.identity, format!("NVMe0R02 {HOST} {SUB}"));
        assert_eq!(
            hex(&v0.key),
            "d438f06b1023efa41e998fc47169d93aca2f78969b0de42fc5745ecece71bde74c1f1f3d1502c9614dea6aad702c5e3b"
        );
        let v1 = k.tls_psk_v1_with(HOST, SUB, r).unwrap();
        assert!(v1
            .identity
            .ends_with(" urSuSitCoxBcxpk6A1vYtN24/I5uNUZTjxBUa5n6iiO9D5LWJQISr0bo4wvB0VuE"));
        assert_eq!(
            hex(&v1.key),
            "6649c7a1bd147854e152850f9362b53bd928bc356978074f53a91687ee76a359f9d32bd990f1b1de4ec85c628faebc35"
        );

        // Hash 00: the configured PSK is the retained PSK in both encodings; the TLS PSK differs.
        let k = ConfiguredPsk::parse(
            "NVMeTLSkey-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
        )
        .unwrap();
        assert_eq!(
            k.retained_with(HOST, r).unwrap(),
            (0u8..32).collect::<Vec<_>>()
        );
        assert_eq!(
            hex(&k.tls_psk_v0_with(HOST, SUB, r).unwrap().key),
            "ed62b6116680f591fe21328fe17abbfeefa96d515a4654a71082b7033b8a84f9"
        );

        // HkdfLabel's layout, byte by byte.
        assert_eq!(
            hkdf_label("HostNQN", b"nq", 32).unwrap(),
            b"\x00\x20\x0dtls13 HostNQN\x02nq".to_vec()
        );
        // A context the one-byte length cannot hold.
        let long = format!("nqn.2014-08.org.x:{}", "h".repeat(200));
        assert!(matches!(
            k.tls_psk_v0_with(&long, &long, r),
            Err(PskError::ContextTooLong { .. })
        ));
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
