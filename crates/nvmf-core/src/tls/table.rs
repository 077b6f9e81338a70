//! The target's TLS state, installed whole from the configuration: which listen addresses require
//! TLS (`secure_channel`), each (subsystem, host)'s configured PSK read from its keyring file, and
//! the lookup the TLS handshake runs with the PSK identity a host offers. Loading is separate from
//! installing, so a bad key file refuses a change before any of it is live. Errors name the key and
//! its file, never the key.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use nvmf_config::{read_key_file, TargetConfig, DISCOVERY_NQN};

use super::psk::{ConfiguredPsk, PskHash, PskLabels, TlsPsk};

/// What a PSK identity names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// 0 (`NVMe0R0x <hostnqn> <subnqn>`) or 1 (`NVMe1R0x <hostnqn> <subnqn> <digest>`).
    pub version: u8,
    pub hash: PskHash,
    pub hostnqn: String,
    pub subnqn: String,
}

/// Parses `NVMe0R0x <hostnqn> <subnqn>` / `NVMe1R0x <hostnqn> <subnqn> <digest>` (x = 1: SHA-256,
/// 2: SHA-384; `R`: a retained PSK, the only kind configured keys give). None for anything else
/// (generated-PSK identities `G`, unknown versions, wrong field count).
pub fn parse_identity(identity: &str) -> Option<Identity> {
    let mut f = identity.split(' ');
    let head = f.next()?;
    let hostnqn = f.next()?;
    let subnqn = f.next()?;
    let digest = f.next();
    if f.next().is_some() || hostnqn.is_empty() || subnqn.is_empty() {
        return None;
    }
    let version = match (head.get(..6)?, digest) {
        ("NVMe0R", None) => 0,
        ("NVMe1R", Some(d)) if !d.is_empty() => 1,
        _ => return None,
    };
    let hash = match head.get(6..)? {
        "01" => PskHash::Sha256,
        "02" => PskHash::Sha384,
        _ => return None,
    };
    Some(Identity {
        version,
        hash,
        hostnqn: hostnqn.to_string(),
        subnqn: subnqn.to_string(),
    })
}

/// TLS requirements and keys of the running target.
#[derive(Debug, Default)]
pub struct TlsTable {
    /// (traddr, trsvcid) of listen addresses that require TLS.
    secure: HashSet<(String, String)>,
    /// (subsystem NQN, host NQN) → configured PSK.
    psks: HashMap<(String, String), Arc<ConfiguredPsk>>,
}

/// Reads and checks every TLS PSK the configuration's hosts use.
pub fn load_tls(cfg: &TargetConfig) -> Result<TlsTable, String> {
    let mut cache: HashMap<&str, Arc<ConfiguredPsk>> = HashMap::new();
    let mut t = TlsTable::default();
    for s in &cfg.subsystems {
        for l in &s.secure_listeners {
            t.secure.insert((l.traddr.clone(), l.trsvcid.clone()));
        }
        for (host, name) in &s.host_psks {
            let psk = match cache.get(name.as_str()) {
                Some(p) => p.clone(),
                None => {
                    let k = cfg
                        .key(name)
                        .ok_or_else(|| format!("no key named \"{name}\" in the keyring"))?;
                    let text = read_key_file(&k.path)?;
                    let p = Arc::new(ConfiguredPsk::parse(&text).map_err(|e| {
                        format!("key \"{name}\" ({}) is not a TLS PSK: {e}", k.path)
                    })?);
                    cache.insert(name, p.clone());
                    p
                }
            };
            t.psks.insert((s.nqn.clone(), host.clone()), psk);
        }
    }
    for l in &cfg.secure_discovery_listeners {
        t.secure.insert((l.traddr.clone(), l.trsvcid.clone()));
    }
    Ok(t)
}

impl TlsTable {
    /// Whether the listen address `traddr:trsvcid` requires TLS.
    pub fn is_secure(&self, traddr: &str, trsvcid: &str) -> bool {
        !self.secure.is_empty()
            && self
                .secure
                .contains(&(traddr.to_string(), trsvcid.to_string()))
    }

    /// Hosts with a PSK (for logs).
    pub fn hosts(&self) -> usize {
        self.psks.len()
    }

    /// The TLS PSKs for the identity a host offered, derived from the configured key that
    /// derives exactly that identity: the subsystem's key for that host (for the discovery NQN:
    /// any key of that host). One per HKDF label encoding that gives the identity (`PskLabels`:
    /// a version-0 identity, or a version-1 identity of a hash-00 key, is the same string in
    /// both, with different keys; the handshake keeps the one the client's binder verifies
    /// with, `binder::pick`). Unknown hosts, foreign digests and hash mismatches get none (the
    /// handshake is refused).
    pub fn lookup(&self, identity: &str) -> Vec<TlsPsk> {
        let Some(id) = parse_identity(identity) else {
            return Vec::new();
        };
        let derive = |k: &ConfiguredPsk| -> Vec<TlsPsk> {
            let mut out: Vec<TlsPsk> = Vec::new();
            for labels in PskLabels::ALL {
                let p = match id.version {
                    0 => k.tls_psk_v0_with(&id.hostnqn, &id.subnqn, labels),
                    _ => k.tls_psk_v1_with(&id.hostnqn, &id.subnqn, labels),
                };
                if let Ok(p) = p {
                    if p.identity == identity && !out.iter().any(|o| o.key == p.key) {
                        out.push(p);
                    }
                }
            }
            out
        };
        if let Some(k) = self.psks.get(&(id.subnqn.clone(), id.hostnqn.clone())) {
            return derive(k);
        }
        if id.subnqn == DISCOVERY_NQN {
            let mut out: Vec<TlsPsk> = Vec::new();
            for ((_, h), k) in &self.psks {
                if *h == id.hostnqn {
                    for p in derive(k) {
                        if !out.iter().any(|o| o.key == p.key) {
                            out.push(p);
                        }
                    }
                }
            }
            return out;
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6";
    const SUB: &str = "nqn.2024-01.io.nvmfd:t";

    fn table() -> TlsTable {
        let mut t = TlsTable::default();
        t.psks.insert(
            (SUB.into(), HOST.into()),
            Arc::new(ConfiguredPsk::parse(KEY).unwrap()),
        );
        t.secure.insert(("127.0.0.1".into(), "4420".into()));
        t
    }

    #[test]
    fn identities_parse_and_refuse() {
        let v0 = parse_identity(&format!("NVMe0R01 {HOST} {SUB}")).unwrap();
        assert_eq!((v0.version, v0.hash), (0, PskHash::Sha256));
        assert_eq!((v0.hostnqn.as_str(), v0.subnqn.as_str()), (HOST, SUB));
        let v1 = parse_identity(&format!("NVMe1R02 {HOST} {SUB} abc=")).unwrap();
        assert_eq!((v1.version, v1.hash), (1, PskHash::Sha384));
        for bad in [
            format!("NVMe0R01 {HOST} {SUB} extra"),
            format!("NVMe1R01 {HOST} {SUB}"),
            format!("NVMe0G01 {HOST} {SUB}"),
            format!("NVMe0R03 {HOST} {SUB}"),
            format!("NVMe2R01 {HOST} {SUB} x"),
            format!("NVMe0R01 {HOST}"),
            format!("NVMe0R01  {SUB}"),
            String::new(),
            "NVMe".into(),
        ] {
            assert_eq!(parse_identity(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn lookup_derives_the_offered_identity_only() {
        let t = table();
        let k = ConfiguredPsk::parse(KEY).unwrap();
        // Version 1 of a hashed key: the digest differs between the encodings, so one key each.
        let v1 = k.tls_psk_v1(HOST, SUB).unwrap();
        assert_eq!(t.lookup(&v1.identity), vec![v1.clone()]);
        let v1r = k.tls_psk_v1_with(HOST, SUB, PskLabels::Rfc8446).unwrap();
        assert_ne!(v1r.identity, v1.identity);
        assert_eq!(t.lookup(&v1r.identity), vec![v1r]);
        // Version 0 (what SPDK's host offers): one identity, libnvme's key first, then the spec's.
        let v0 = k.tls_psk_v0(HOST, SUB).unwrap();
        let v0r = k.tls_psk_v0_with(HOST, SUB, PskLabels::Rfc8446).unwrap();
        assert_eq!(v0.identity, v0r.identity);
        assert_eq!(t.lookup(&v0.identity), vec![v0, v0r]);
        // A digest from another key, another host, another subsystem, the wrong hash.
        let other = ConfiguredPsk::parse(
            "NVMeTLSkey-1:02:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vcSEgBQ==:",
        )
        .unwrap();
        let foreign = other.tls_psk_v1(HOST, SUB).unwrap();
        assert_eq!(t.lookup(&foreign.identity), vec![]);
        let forged = format!("NVMe1R01 {HOST} {SUB} {}", "A".repeat(44));
        assert_eq!(t.lookup(&forged), vec![]);
        assert_eq!(
            t.lookup(&format!("NVMe0R01 nqn.2014-08.org.x:other {SUB}")),
            vec![]
        );
        assert_eq!(
            t.lookup(&format!("NVMe0R01 {HOST} nqn.2024-01.io.nvmfd:u")),
            vec![]
        );
        assert_eq!(t.lookup(&format!("NVMe0R02 {HOST} {SUB}")), vec![]);
        // Discovery: any key of the host.
        let d = k.tls_psk_v1(HOST, DISCOVERY_NQN).unwrap();
        assert_eq!(t.lookup(&d.identity), vec![d]);
        assert!(t.is_secure("127.0.0.1", "4420"));
        assert!(!t.is_secure("127.0.0.1", "4421"));
    }

    /// A hash-00 key: the retained PSK is the configured one in both encodings, so a version-1
    /// identity (same digest) gets two keys too.
    #[test]
    fn hash_00_key_version_1_gets_both_encodings() {
        let mut t = TlsTable::default();
        let k = ConfiguredPsk::new(None, &[5u8; 32]).unwrap();
        t.psks
            .insert((SUB.into(), HOST.into()), Arc::new(k.clone()));
        let v1 = k.tls_psk_v1(HOST, SUB).unwrap();
        let v1r = k.tls_psk_v1_with(HOST, SUB, PskLabels::Rfc8446).unwrap();
        assert_eq!(v1.identity, v1r.identity);
        assert_eq!(t.lookup(&v1.identity), vec![v1, v1r]);
    }
}
