//! DH-HMAC-CHAP secrets in the NVMe representation `DHHC-1:xx:<base64>:`:
//! parsing (xx = the transformation hash: 00 none, 01 SHA-256, 02 SHA-384,
//! 03 SHA-512; base64 of the 32/48/64-byte key followed by its CRC-32,
//! little-endian), and the transformed secret a response is keyed with
//! (HMAC over the NQN and "NVMe-over-Fabrics" with the secret's hash). The
//! key bytes are wiped on drop and never printed.

use base64::Engine;

use super::chap::hmac_parts;
use super::AuthError;

/// A parsed DH-HMAC-CHAP secret.
pub struct DhchapSecret {
    /// Transformation hash identifier (0: none).
    hash: u8,
    key: Vec<u8>,
}

impl std::fmt::Debug for DhchapSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DhchapSecret(DHHC-1:{:02x}, {} bytes, redacted)",
            self.hash,
            self.key.len()
        )
    }
}

impl Drop for DhchapSecret {
    fn drop(&mut self) {
        self.key.fill(0);
        std::hint::black_box(&self.key);
    }
}

impl DhchapSecret {
    /// Parse `DHHC-1:xx:base64:` (surrounding whitespace, e.g. a key
    /// file's trailing newline, is ignored).
    pub fn parse(s: &str) -> Result<DhchapSecret, AuthError> {
        let s = s.trim();
        let rest = s
            .strip_prefix("DHHC-1:")
            .ok_or(AuthError::SecretFormat("missing DHHC-1: prefix"))?;
        let (hh, rest) = rest
            .split_once(':')
            .ok_or(AuthError::SecretFormat("missing hash field"))?;
        let b64 = rest
            .strip_suffix(':')
            .ok_or(AuthError::SecretFormat("missing trailing ':'"))?;
        if hh.len() != 2 {
            return Err(AuthError::SecretFormat("hash field is not two hex digits"));
        }
        let hash = u8::from_str_radix(hh, 16)
            .map_err(|_| AuthError::SecretFormat("hash field is not two hex digits"))?;
        if hash > 3 {
            return Err(AuthError::Hash(hash));
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| AuthError::SecretFormat("invalid base64"))?;
        if !matches!(raw.len(), 36 | 52 | 68) {
            return Err(AuthError::SecretFormat("key is not 32, 48 or 64 bytes"));
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(AuthError::SecretCrc);
        }
        if hash != 0 && key.len() != nvmf_wire::auth::hash_len(hash) {
            return Err(AuthError::SecretFormat(
                "key length does not match its transformation hash",
            ));
        }
        Ok(DhchapSecret {
            hash,
            key: key.to_vec(),
        })
    }

    /// The transformation hash identifier (0: none).
    pub fn hash(&self) -> u8 {
        self.hash
    }

    /// The transformed secret for `nqn` (the host NQN for the host's key,
    /// the subsystem NQN for the controller's).
    pub fn transform(&self, nqn: &str) -> Vec<u8> {
        if self.hash == 0 {
            return self.key.clone();
        }
        hmac_parts(
            self.hash,
            &self.key,
            &[nqn.as_bytes(), b"NVMe-over-Fabrics"],
        )
        .expect("hash checked at parse")
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::*;

    #[test]
    fn parse_and_transform_vectors() {
        let s = DhchapSecret::parse(S01).unwrap();
        assert_eq!(s.hash(), 1);
        assert_eq!(s.transform(HOSTNQN), hex(T01));
        let s = DhchapSecret::parse(&format!("{S02}\n")).unwrap();
        assert_eq!(s.transform(HOSTNQN), hex(T02));
        let s = DhchapSecret::parse(S03).unwrap();
        assert_eq!(s.transform(SUBNQN), hex(T03SUB));
        let s = DhchapSecret::parse(S00).unwrap();
        assert_eq!(s.transform(HOSTNQN), (0..32).collect::<Vec<u8>>());
        assert!(!format!("{s:?}").contains("AAEC"));
    }

    #[test]
    fn malformed_secrets_refused() {
        // CRC broken: flip one base64 character of the key.
        let bad = S01.replacen("AAEC", "AAED", 1);
        assert_eq!(DhchapSecret::parse(&bad).unwrap_err(), AuthError::SecretCrc);
        assert!(matches!(
            DhchapSecret::parse("DHHC-2:01:AAAA:"),
            Err(AuthError::SecretFormat(_))
        ));
        assert!(matches!(
            DhchapSecret::parse(&S01.replace("DHHC-1:01", "DHHC-1:04")),
            Err(AuthError::Hash(4))
        ));
        // A 32-byte key marked SHA-512.
        assert!(matches!(
            DhchapSecret::parse(&S01.replace("DHHC-1:01", "DHHC-1:03")),
            Err(AuthError::SecretFormat(_))
        ));
        assert!(matches!(
            DhchapSecret::parse(S01.trim_end_matches(':')),
            Err(AuthError::SecretFormat(_))
        ));
        assert!(matches!(
            DhchapSecret::parse("DHHC-1:01:!!!!:"),
            Err(AuthError::SecretFormat(_))
        ));
    }
}
