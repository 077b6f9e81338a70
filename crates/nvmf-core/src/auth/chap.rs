//! The DH-HMAC-CHAP computations: HMAC and hash by identifier (SHA-256/
//! 384/512 from RustCrypto), the augmented challenge of a DH exchange
//! (HMAC keyed with the hash of the shared secret over the challenge), the
//! host's and the controller's responses, and a constant-time compare.

use hmac::{Hmac, Mac};
use nvmf_wire::auth::{HASH_SHA256, HASH_SHA384, HASH_SHA512};
use sha2::{Digest, Sha256, Sha384, Sha512};
use subtle::ConstantTimeEq;

use super::AuthError;

fn mac_parts<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m =
        <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

/// HMAC with hash `hash_id` over the concatenation of `parts`.
pub fn hmac_parts(hash_id: u8, key: &[u8], parts: &[&[u8]]) -> Result<Vec<u8>, AuthError> {
    Ok(match hash_id {
        HASH_SHA256 => mac_parts::<Hmac<Sha256>>(key, parts),
        HASH_SHA384 => mac_parts::<Hmac<Sha384>>(key, parts),
        HASH_SHA512 => mac_parts::<Hmac<Sha512>>(key, parts),
        other => return Err(AuthError::Hash(other)),
    })
}

/// Plain hash with `hash_id`.
pub fn hash(hash_id: u8, data: &[u8]) -> Result<Vec<u8>, AuthError> {
    Ok(match hash_id {
        HASH_SHA256 => Sha256::digest(data).to_vec(),
        HASH_SHA384 => Sha384::digest(data).to_vec(),
        HASH_SHA512 => Sha512::digest(data).to_vec(),
        other => return Err(AuthError::Hash(other)),
    })
}

/// The challenge a response is computed over: `challenge` itself with the
/// null DH group, else HMAC(H(shared secret), challenge).
pub fn augmented_challenge(
    hash_id: u8,
    challenge: &[u8],
    shared_secret: Option<&[u8]>,
) -> Result<Vec<u8>, AuthError> {
    match shared_secret {
        None => Ok(challenge.to_vec()),
        Some(k) => hmac_parts(hash_id, &hash(hash_id, k)?, &[challenge]),
    }
}

/// Which side a response proves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The host's response to the controller's challenge ("HostHost",
    /// host NQN then subsystem NQN).
    Host,
    /// The controller's response to the host's challenge ("Controller",
    /// subsystem NQN then host NQN).
    Controller,
}

/// Inputs of one response.
#[derive(Debug, Clone, Copy)]
pub struct ResponseInput<'a> {
    pub hash_id: u8,
    /// The transformed secret of the side that answers.
    pub transformed_key: &'a [u8],
    pub challenge: &'a [u8],
    pub seqnum: u32,
    pub t_id: u16,
    /// Secure channel concatenation (0: none).
    pub sc_c: u8,
    pub hostnqn: &'a str,
    pub subnqn: &'a str,
    pub shared_secret: Option<&'a [u8]>,
}

/// The response value for `side`.
pub fn response(side: Side, i: &ResponseInput<'_>) -> Result<Vec<u8>, AuthError> {
    let c = augmented_challenge(i.hash_id, i.challenge, i.shared_secret)?;
    let (kind, nqn1, nqn2): (&[u8], &str, &str) = match side {
        Side::Host => (b"HostHost", i.hostnqn, i.subnqn),
        Side::Controller => (b"Controller", i.subnqn, i.hostnqn),
    };
    hmac_parts(
        i.hash_id,
        i.transformed_key,
        &[
            &c,
            &i.seqnum.to_le_bytes(),
            &i.t_id.to_le_bytes(),
            &[i.sc_c],
            kind,
            nqn1.as_bytes(),
            &[0],
            nqn2.as_bytes(),
        ],
    )
}

/// Constant-time equality of two byte strings.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::DhchapSecret;
    use super::*;

    #[test]
    fn response_vectors() {
        let t1 = DhchapSecret::parse(S01).unwrap().transform(HOSTNQN);
        let mut i = ResponseInput {
            hash_id: HASH_SHA256,
            transformed_key: &t1,
            challenge: &[0x5a; 32],
            seqnum: 0x0102_0304,
            t_id: 7,
            sc_c: 0,
            hostnqn: HOSTNQN,
            subnqn: SUBNQN,
            shared_secret: None,
        };
        assert_eq!(response(Side::Host, &i).unwrap(), hex(R256));

        let k = hex(DHK);
        i.seqnum = 5;
        i.t_id = 9;
        i.shared_secret = Some(&k);
        assert_eq!(response(Side::Host, &i).unwrap(), hex(RDH));

        let t2 = DhchapSecret::parse(S02).unwrap().transform(HOSTNQN);
        let c48: Vec<u8> = (0..48).collect();
        let i = ResponseInput {
            hash_id: HASH_SHA384,
            transformed_key: &t2,
            challenge: &c48,
            seqnum: 0xdead_beef,
            t_id: 0xabcd,
            sc_c: 0,
            hostnqn: HOSTNQN,
            subnqn: SUBNQN,
            shared_secret: None,
        };
        assert_eq!(response(Side::Host, &i).unwrap(), hex(R384));

        let t3 = DhchapSecret::parse(S03).unwrap().transform(SUBNQN);
        let c64: Vec<u8> = (64..128).collect();
        let i = ResponseInput {
            hash_id: HASH_SHA512,
            transformed_key: &t3,
            challenge: &c64,
            seqnum: 42,
            t_id: 3,
            sc_c: 0,
            hostnqn: HOSTNQN,
            subnqn: SUBNQN,
            shared_secret: None,
        };
        assert_eq!(response(Side::Controller, &i).unwrap(), hex(C512));
    }

    #[test]
    fn compare() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert_eq!(hash(9, b""), Err(AuthError::Hash(9)));
    }
}
