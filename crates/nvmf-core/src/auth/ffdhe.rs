//! Finite-field Diffie-Hellman over the RFC 7919 groups ffdhe2048..8192
//! (generator 2) for DH-HMAC-CHAP: the controller's ephemeral key pair, the
//! check of the host's public value, and the shared secret, big-endian and
//! zero-padded to the group size (as the Linux host and SPDK compute it).
//! Arithmetic by `num-bigint` (pure Rust). The primes are the RFC's
//! (p = 2^b - 2^(b-64) + (floor(2^(b-130) e) + X) 2^64 - 1); they were
//! computed from that formula and checked against published copies.
//!
//! The private exponent is drawn from the OS with twice the group's
//! security strength in bits (RFC 7919 section 5.2 minimums rounded up to
//! bytes), which keeps the modular exponentiation cheap. `num-bigint`'s
//! `modpow` is not constant-time; each key pair is used for one
//! transaction only.

use std::sync::OnceLock;

use num_bigint::BigUint;
use nvmf_wire::auth::{
    dhgroup_len, DHGROUP_FFDHE2048, DHGROUP_FFDHE3072, DHGROUP_FFDHE4096, DHGROUP_FFDHE6144,
    DHGROUP_FFDHE8192,
};

use super::AuthError;

/// Private exponent length in bytes per group.
fn exponent_len(group: u8) -> usize {
    match group {
        DHGROUP_FFDHE2048 => 32,
        DHGROUP_FFDHE3072 => 40,
        DHGROUP_FFDHE4096 => 48,
        DHGROUP_FFDHE6144 => 56,
        _ => 64,
    }
}

fn prime(group: u8) -> Option<&'static BigUint> {
    static P: [OnceLock<BigUint>; 5] = [const { OnceLock::new() }; 5];
    let (i, hex) = match group {
        DHGROUP_FFDHE2048 => (0, FFDHE2048_HEX),
        DHGROUP_FFDHE3072 => (1, FFDHE3072_HEX),
        DHGROUP_FFDHE4096 => (2, FFDHE4096_HEX),
        DHGROUP_FFDHE6144 => (3, FFDHE6144_HEX),
        DHGROUP_FFDHE8192 => (4, FFDHE8192_HEX),
        _ => return None,
    };
    Some(P[i].get_or_init(|| BigUint::parse_bytes(hex.as_bytes(), 16).expect("ffdhe prime hex")))
}

fn to_padded(v: &BigUint, len: usize) -> Vec<u8> {
    let b = v.to_bytes_be();
    let mut out = vec![0u8; len - b.len()];
    out.extend_from_slice(&b);
    out
}

/// An ephemeral DH key pair in one group.
pub struct DhKey {
    group: u8,
    private: BigUint,
    public: Vec<u8>,
}

impl std::fmt::Debug for DhKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DhKey")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl DhKey {
    /// A fresh key pair (random exponent from the OS).
    pub fn generate(group: u8) -> Result<DhKey, AuthError> {
        let mut x = vec![0u8; exponent_len(group)];
        getrandom::fill(&mut x).map_err(|_| AuthError::Random)?;
        x[0] |= 0x80; // full length, never 0 or 1
        Self::from_private(group, &x)
    }

    /// A key pair from a given private exponent (big-endian; tests).
    pub fn from_private(group: u8, private: &[u8]) -> Result<DhKey, AuthError> {
        let p = prime(group).ok_or(AuthError::DhGroup(group))?;
        let private = BigUint::from_bytes_be(private);
        let public = BigUint::from(2u32).modpow(&private, p);
        Ok(DhKey {
            group,
            public: to_padded(&public, dhgroup_len(group)),
            private,
        })
    }

    /// The public value, big-endian, padded to the group size.
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret with the peer's public value (big-endian, group
    /// size). A peer value of the wrong length or outside 2..p-2 is refused.
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Vec<u8>, AuthError> {
        let p = prime(self.group).ok_or(AuthError::DhGroup(self.group))?;
        let len = dhgroup_len(self.group);
        if peer.len() != len {
            return Err(AuthError::DhValue);
        }
        let y = BigUint::from_bytes_be(peer);
        let one = BigUint::from(1u32);
        if y <= one || y >= p - &one {
            return Err(AuthError::DhValue);
        }
        Ok(to_padded(&y.modpow(&self.private, p), len))
    }
}

include!("ffdhe_primes.rs");

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Vectors from Python's `pow(2, x, p)` with the RFC 7919 prime
    /// (computed independently; see the report of the commit).
    #[test]
    fn ffdhe2048_vectors() {
        let x: Vec<u8> = (1..=32).collect();
        let y: Vec<u8> = (200..232).collect();
        let a = DhKey::from_private(DHGROUP_FFDHE2048, &x).unwrap();
        let b = DhKey::from_private(DHGROUP_FFDHE2048, &y).unwrap();
        assert_eq!(a.public(), hex(super::super::tests::DHX).as_slice());
        assert_eq!(b.public(), hex(super::super::tests::DHY).as_slice());
        let k = a.shared_secret(b.public()).unwrap();
        assert_eq!(k, hex(super::super::tests::DHK));
        assert_eq!(b.shared_secret(a.public()).unwrap(), k);
    }

    #[test]
    fn bad_peer_values_refused() {
        let a = DhKey::generate(DHGROUP_FFDHE2048).unwrap();
        assert_eq!(a.shared_secret(&[0u8; 256]), Err(AuthError::DhValue));
        let mut one = vec![0u8; 256];
        one[255] = 1;
        assert_eq!(a.shared_secret(&one), Err(AuthError::DhValue));
        assert_eq!(a.shared_secret(&[0xffu8; 256]), Err(AuthError::DhValue));
        assert_eq!(a.shared_secret(&[5u8; 255]), Err(AuthError::DhValue));
    }

    #[test]
    fn every_group_agrees() {
        for g in [
            DHGROUP_FFDHE2048,
            DHGROUP_FFDHE3072,
            DHGROUP_FFDHE4096,
            DHGROUP_FFDHE6144,
            DHGROUP_FFDHE8192,
        ] {
            let p = prime(g).unwrap();
            assert_eq!(p.bits() as usize, dhgroup_len(g) * 8);
            if g > DHGROUP_FFDHE3072 && cfg!(debug_assertions) {
                continue; // seconds in a debug build; release runs them
            }
            let a = DhKey::generate(g).unwrap();
            let b = DhKey::generate(g).unwrap();
            assert_eq!(
                a.shared_secret(b.public()).unwrap(),
                b.shared_secret(a.public()).unwrap()
            );
        }
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// The cost of one DH transaction on the target (key generation +
    /// shared secret), per group. Run: `cargo test -p nvmf-core --release
    /// --lib auth::ffdhe::cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "measurement"]
    fn modexp_cost() {
        for g in [
            DHGROUP_FFDHE2048,
            DHGROUP_FFDHE3072,
            DHGROUP_FFDHE4096,
            DHGROUP_FFDHE6144,
            DHGROUP_FFDHE8192,
        ] {
            let peer = DhKey::generate(g).unwrap();
            let n = 20;
            let t = std::time::Instant::now();
            for _ in 0..n {
                let k = DhKey::generate(g).unwrap();
                std::hint::black_box(k.shared_secret(peer.public()).unwrap());
            }
            let per = t.elapsed() / n;
            println!(
                "ffdhe{}: {:?} per transaction (2 modexps)",
                dhgroup_len(g) * 8,
                per
            );
        }
    }
}
