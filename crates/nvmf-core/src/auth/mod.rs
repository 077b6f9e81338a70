//! NVMe in-band authentication (DH-HMAC-CHAP) on the target side.
//!
//! Owns the cryptography and the per-queue protocol: secrets in the NVMe
//! representation and their transformation (`secret.rs`), the HMAC
//! responses and augmented challenges (`chap.rs`), FFDHE key agreement
//! (`ffdhe.rs`) on the `nvmfd-auth` thread (`pool.rs`), keys from the configuration's key files (`config.rs`), the target's policy (digests and DH groups it offers,
//! `AuthPolicy`) and the per-queue state machine (`session.rs`) the queue
//! pair drives with Authentication Send / Receive. Secrets never appear in
//! `Debug` output or logs.

pub mod chap;
pub mod config;
pub mod ffdhe;
pub mod pool;
pub mod secret;
pub(crate) mod session;

pub use config::{load_keys, LoadedKeys};
pub use secret::DhchapSecret;

use nvmf_wire::auth::{
    DHGROUP_FFDHE2048, DHGROUP_FFDHE3072, DHGROUP_FFDHE4096, DHGROUP_FFDHE6144, DHGROUP_FFDHE8192,
    DHGROUP_NULL, HASH_SHA256, HASH_SHA384, HASH_SHA512,
};

/// What went wrong in the authentication cryptography.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("not a DH-HMAC-CHAP secret (expected DHHC-1:xx:base64:): {0}")]
    SecretFormat(&'static str),
    #[error("DH-HMAC-CHAP secret CRC-32 mismatch")]
    SecretCrc,
    #[error("unsupported hash function {0:#x}")]
    Hash(u8),
    #[error("unsupported DH group {0:#x}")]
    DhGroup(u8),
    #[error("invalid DH public value")]
    DhValue,
    #[error("no randomness from the operating system")]
    Random,
}

/// The keys a host authenticates with on one subsystem: its own (the
/// host proves it knows it) and optionally the controller's (the
/// controller proves it knows it: bidirectional authentication).
#[derive(Debug, Clone)]
pub struct HostKeys {
    pub key: std::sync::Arc<DhchapSecret>,
    pub ctrlr_key: Option<std::sync::Arc<DhchapSecret>>,
}

/// Digest and DH group names as SPDK's `nvmf_set_config` spells them.
pub const DIGEST_NAMES: [(&str, u8); 3] = [
    ("sha256", HASH_SHA256),
    ("sha384", HASH_SHA384),
    ("sha512", HASH_SHA512),
];
pub const DHGROUP_NAMES: [(&str, u8); 6] = [
    ("null", DHGROUP_NULL),
    ("ffdhe2048", DHGROUP_FFDHE2048),
    ("ffdhe3072", DHGROUP_FFDHE3072),
    ("ffdhe4096", DHGROUP_FFDHE4096),
    ("ffdhe6144", DHGROUP_FFDHE6144),
    ("ffdhe8192", DHGROUP_FFDHE8192),
];

/// The digests and DH groups the target accepts (bit = identifier), as
/// `nvmf_set_config --dhchap-digests/--dhchap-dhgroups` set them; all by
/// default. The strongest pair the host also offers is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthPolicy {
    pub digests: u8,
    pub dhgroups: u8,
}

impl Default for AuthPolicy {
    fn default() -> Self {
        AuthPolicy {
            digests: (1 << HASH_SHA256) | (1 << HASH_SHA384) | (1 << HASH_SHA512),
            dhgroups: 0x3f,
        }
    }
}

impl AuthPolicy {
    /// A policy from digest and DH group names (`None`: all); an unknown
    /// name is an error naming it.
    pub fn from_names(
        digests: Option<&[String]>,
        dhgroups: Option<&[String]>,
    ) -> Result<AuthPolicy, String> {
        let mut p = AuthPolicy::default();
        if let Some(d) = digests {
            p.digests = mask(d, &DIGEST_NAMES, "digest")?;
        }
        if let Some(g) = dhgroups {
            p.dhgroups = mask(g, &DHGROUP_NAMES, "dhgroup")?;
        }
        Ok(p)
    }
}

fn mask(names: &[String], table: &[(&str, u8)], what: &str) -> Result<u8, String> {
    let mut m = 0u8;
    for n in names {
        let Some((_, id)) = table.iter().find(|(t, _)| t.eq_ignore_ascii_case(n)) else {
            let known: Vec<&str> = table.iter().map(|(t, _)| *t).collect();
            return Err(format!(
                "unknown {what} '{n}' (known: {})",
                known.join(", ")
            ));
        };
        m |= 1 << id;
    }
    if m == 0 {
        return Err(format!("no {what} allowed"));
    }
    Ok(m)
}

#[cfg(test)]
pub(crate) mod tests {
    //! Vectors computed independently with Python's hashlib/hmac/base64/
    //! zlib and pow() (a throw-away script, not committed: secret =
    //! key || CRC-32 LE in base64; transform = HMAC(key, nqn ||
    //! "NVMe-over-Fabrics"); response = HMAC(transformed, C || S LE32 ||
    //! T LE16 || 0 || kind || nqn1 || 0 || nqn2); with DH the challenge is
    //! first HMAC(H(secret), C)).
    pub const HOSTNQN: &str =
        "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
    pub const SUBNQN: &str = "nqn.2016-06.io.nvmfd:auth";
    pub const S01: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    pub const S02: &str =
        "DHHC-1:02:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";
    pub const S03: &str = "DHHC-1:03:AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4/QJn7gCg=:";
    pub const S00: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    pub const T01: &str = "6c7b81cb2a746f74454b1d7140f3153b51ca99459fcef7a86a17f27695b87cd8";
    pub const T02: &str = "b5ab87bc1196160de11992889bae343a69c927bb1722f0959dc564938d4ddd846b3bfef3cd2c3536e3c17bb3aa46defe";
    pub const T03SUB: &str = "4e9b30eba6c12025c4753bb98e51485de976d2e69317fac9fd8d6bd5cb04bf0c0452ddef3266d40b20f152ba63b413fe4b040438939687a3e8868f5ee7f9d561";
    pub const R256: &str = "95869ca10e174a8859074ec0f383019f728f4e7e1d9d2c58356fe9f3e0957140";
    pub const R384: &str = "fabfc4ba49511aaac2d264c319933b8b9722fcb8695f89c921f3d78668e7588540e3ab365b5a58b811edd7443e2c6ba8";
    pub const C512: &str = "8bb72b6663e3f232c72f9e0877bcc8d7aaf39c8f632ed01f553f583adc3bc5fc77b3b99e5ce6949c522e75a4bf26d4253cc892b8408caa335a0a984f01f735c0";
    pub const RDH: &str = "a4c9966ad5a805c8454b9abb1f184405e52ac394ea7ff3c2b559dec654d1c099";
    pub const DHX: &str = "0eef0c0eae9c65a3332cdc742b58561d362c0af526f8ad528b19ff39c91434312f83302ed9dc6f2b84b250482dbd80962154f8a6d683741bf8bf4f3fdee22f80541a77553d1ae7a096c521f869987ae5eca1090d93e7bdea0b4349f17fee34f4775bfb380f426dec937b25825680c6e2b8c4c9eede64b91f5cdc02ba78e75908d47cd27fda4b5188c22baf2acd1e861ed0864e9eb9346640d354eada9f7156a601387ba5f1b8609733707803a5ac866fc1bbe54b15a99934727bc5c157f893d867a89abf0ce3dd0cf3d7ce00073db8b3bbae1486faedc462f7edeb3dc44ba30336de3d4dbfb4f14f143c46b0ba93f316f50c3377b9a38a27ae048f5605a4dcbf";
    pub const DHY: &str = "1891ef3d28a5385b909aea687b9d451225967e98093f2e52c60d8e7524e7152638ca5b42e797b52143a2da6dd53a456c216345c42453a2f33b0c75b85466de69a52d1e6131bafc482b889d0eec270bd8bafedc798b0afe49815258f18bdc3d45de48423e5de11d09666ca98925e7183ae68f8dd255eb1936cd8ef196bc400e3ea46556eee0725924ad7022d07f2acc2d7916e065cd9430e65a889c71f7d165eca3f4e27091e552653c3f4ec204f32fea351a363aa94bcde18c6043b908c5f788230bce92fbcde8befa45538c6f00fb5a7901f31d0152bb90d18a0b4cf8b8d76bad002448ff800076f4e4f2353c71bcdb6b47af005ad15cf5e3ee7c091bb2d3fd";
    pub const DHK: &str = "82f14f92624eb48cb1a1b1a7ede007e1b4b3a1dbec7ac5bae01828e8042aa2be20247438319d8c9ba8219441c7005d2ea4b0c16b8369341823ff7950ec21eaecbddd4e38a3ae3c744dd095c4b740119b7700997154fdccdc637f1d26a380d7bff3b6826907bc4623938ef44205c351b9b9713b4e650c72c1d2debc68bb44cbb25f5ce9858bb4824205e57f934f64e2e7cb1b298f2f312b10d9678d75b24484a657fe597d33a3d743b61dfb52bc7df0b460b4845d36b082fda9c07c10ee90bf7413f6634601c3cea2aeaa18512ebac96cece7d2b3e23e8da6bcc7a4665c0ef83e6f700f0c3955d35edf9bbc9b5d06339227b82a548a1135ee815d217b00b2ccb8";

    pub fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn policy_names() {
        let p = super::AuthPolicy::from_names(
            Some(&["sha256".into()]),
            Some(&["null".into(), "ffdhe2048".into()]),
        )
        .unwrap();
        assert_eq!((p.digests, p.dhgroups), (0b10, 0b11));
        assert!(super::AuthPolicy::from_names(Some(&["md5".into()]), None)
            .unwrap_err()
            .contains("md5"));
    }
}
