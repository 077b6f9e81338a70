//! From the configuration to the running target: reads the key files the
//! hosts' DH-HMAC-CHAP key names point to (through the file keyring of
//! `nvmf_config`, which refuses files others can read), parses them as
//! secrets, and installs them with the digest/DH group policy. Loading is
//! separate from installing so that a bad key refuses a change before
//! anything of it is live. Errors name the key and the file, never the
//! secret.

use std::collections::HashMap;
use std::sync::Arc;

use nvmf_config::{read_key_file, TargetConfig};

use super::{AuthPolicy, DhchapSecret, HostKeys};
use crate::target::Target;

/// Secrets loaded for a configuration, ready to install.
#[derive(Debug, Default)]
pub struct LoadedKeys {
    /// Subsystem NQN → host NQN → keys.
    by_subsystem: HashMap<String, HashMap<String, HostKeys>>,
    policy: AuthPolicy,
}

fn load_secret(
    cfg: &TargetConfig,
    name: &str,
    cache: &mut HashMap<String, Arc<DhchapSecret>>,
) -> Result<Arc<DhchapSecret>, String> {
    if let Some(s) = cache.get(name) {
        return Ok(s.clone());
    }
    let k = cfg
        .key(name)
        .ok_or_else(|| format!("no key named \"{name}\" in the keyring"))?;
    let text = read_key_file(&k.path)?;
    let s = Arc::new(
        DhchapSecret::parse(&text).map_err(|e| format!("key \"{name}\" ({}): {e}", k.path))?,
    );
    cache.insert(name.to_string(), s.clone());
    Ok(s)
}

/// Reads and checks every key the configuration's hosts use.
pub fn load_keys(cfg: &TargetConfig) -> Result<LoadedKeys, String> {
    let policy = AuthPolicy::from_names(
        cfg.dhchap_digests.as_deref(),
        cfg.dhchap_dhgroups.as_deref(),
    )?;
    let mut cache = HashMap::new();
    let mut by_subsystem = HashMap::new();
    for s in &cfg.subsystems {
        let mut hosts = HashMap::new();
        for (host, names) in &s.host_keys {
            let key = load_secret(cfg, &names.dhchap_key, &mut cache)?;
            let ctrlr_key = match &names.dhchap_ctrlr_key {
                Some(n) => Some(load_secret(cfg, n, &mut cache)?),
                None => None,
            };
            hosts.insert(host.clone(), HostKeys { key, ctrlr_key });
        }
        by_subsystem.insert(s.nqn.clone(), hosts);
    }
    Ok(LoadedKeys {
        by_subsystem,
        policy,
    })
}

impl LoadedKeys {
    /// Makes these keys and the policy the target's (every NVM subsystem's
    /// key table is replaced; a host without keys no longer authenticates).
    pub fn install(self, target: &Target) {
        target.set_auth_policy(self.policy);
        let mut by_subsystem = self.by_subsystem;
        for s in target.subsystems() {
            if s.is_discovery() {
                continue;
            }
            s.replace_host_keys(by_subsystem.remove(s.nqn()).unwrap_or_default());
        }
    }

    /// Hosts with keys (for logs).
    pub fn hosts(&self) -> usize {
        self.by_subsystem.values().map(HashMap::len).sum()
    }
}
