//! Keys and DH-HMAC-CHAP in the configuration, with SPDK's method names:
//! the file keyring (`keyring_file_add_key {name, path}`,
//! `keyring_file_remove_key {name}`: a key is a name and the path of the
//! file that holds it; the key itself is never part of the model, of
//! `save_config` or of the state file), the key names a host authenticates
//! with on a subsystem (`nvmf_subsystem_add_host ... dhchap_key /
//! dhchap_ctrlr_key`, `nvmf_subsystem_set_keys`), and the digests and DH
//! groups the target allows (`nvmf_set_config dhchap_digests /
//! dhchap_dhgroups`). Key files readable or writable by group or others are
//! refused, as SPDK's file keyring does.

use std::os::unix::fs::PermissionsExt;

use serde_json::{json, Value};

use crate::error::ConfigError;
use crate::params::Params;
use crate::TargetConfig;

/// A key of the file keyring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyringKey {
    pub name: String,
    /// Absolute path of the file holding the key (e.g. `DHHC-1:01:...:`).
    pub path: String,
}

/// The DH-HMAC-CHAP key names of one host on one subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDhchapKeys {
    /// The host's key (it proves it knows it).
    pub dhchap_key: String,
    /// The controller's key (bidirectional authentication), if any.
    pub dhchap_ctrlr_key: Option<String>,
}

/// Digest names `nvmf_set_config dhchap_digests` accepts.
pub const DHCHAP_DIGESTS: [&str; 3] = ["sha256", "sha384", "sha512"];
/// DH group names `nvmf_set_config dhchap_dhgroups` accepts.
pub const DHCHAP_DHGROUPS: [&str; 6] = [
    "null",
    "ffdhe2048",
    "ffdhe3072",
    "ffdhe4096",
    "ffdhe6144",
    "ffdhe8192",
];

/// Largest key file read (keys are under 200 bytes).
const MAX_KEY_FILE: u64 = 4096;

/// Reads a key file: refused when it is not a regular file, is readable or
/// writable by group or others, or is larger than a key can be. The text
/// is returned trimmed; callers must never log it.
pub fn read_key_file(path: &str) -> Result<String, String> {
    let md = std::fs::metadata(path).map_err(|e| format!("key file {path}: {e}"))?;
    if !md.is_file() {
        return Err(format!("key file {path} is not a regular file"));
    }
    let mode = md.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "key file {path} is accessible by group or others (mode {mode:04o}); \
             make it private (chmod 0600)"
        ));
    }
    if md.len() > MAX_KEY_FILE {
        return Err(format!(
            "key file {path} is larger than {MAX_KEY_FILE} bytes"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("key file {path}: {e}"))?;
    Ok(text.trim().to_string())
}

impl TargetConfig {
    /// The keyring key called `name`.
    pub fn key(&self, name: &str) -> Option<&KeyringKey> {
        self.keyring.iter().find(|k| k.name == name)
    }
}

/// `keyring_file_add_key {name, path}`.
pub(crate) fn add_key(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let name = p.req_str("name")?;
    let path = p.req_str("path")?;
    p.finish()?;
    if name.is_empty() {
        return Err(p.err("name", "must not be empty"));
    }
    if cfg.key(name).is_some() {
        return Err(p.err("name", format!("a key named \"{name}\" already exists")));
    }
    if !path.starts_with('/') {
        return Err(p.err("path", "must be an absolute path"));
    }
    read_key_file(path).map_err(|e| p.err("path", e))?;
    cfg.keyring.push(KeyringKey {
        name: name.to_string(),
        path: path.to_string(),
    });
    Ok(())
}

/// `keyring_file_remove_key {name}`: refused while a host uses the key.
pub(crate) fn remove_key(cfg: &mut TargetConfig, mut p: Params<'_>) -> Result<(), ConfigError> {
    let name = p.req_str("name")?;
    p.finish()?;
    if cfg.key(name).is_none() {
        return Err(p.err("name", format!("no key named \"{name}\"")));
    }
    for s in &cfg.subsystems {
        let dhchap = s
            .host_keys
            .iter()
            .filter(|(_, k)| k.dhchap_key == name || k.dhchap_ctrlr_key.as_deref() == Some(name))
            .map(|(h, _)| h);
        let psk = s
            .host_psks
            .iter()
            .filter(|(_, k)| *k == name)
            .map(|(h, _)| h);
        if let Some(host) = dhchap.chain(psk).next() {
            return Err(p.err(
                "name",
                format!(
                    "key \"{name}\" is in use by host {host} on subsystem {} \
                     (nvmf_subsystem_set_keys or remove the host first)",
                    s.nqn
                ),
            ));
        }
    }
    cfg.keyring.retain(|k| k.name != name);
    Ok(())
}

/// The optional `psk` of `nvmf_subsystem_add_host`: the name of a keyring key
/// holding the host's TLS PSK (SPDK's keyring form; a file path, which old
/// SPDK versions took, is refused with a hint).
pub(crate) fn psk_param(
    cfg: &TargetConfig,
    p: &mut Params<'_>,
) -> Result<Option<String>, ConfigError> {
    let Some(k) = p.opt_str("psk")? else {
        return Ok(None);
    };
    if cfg.key(k).is_none() {
        let hint = if k.starts_with('/') {
            " (psk names a key: keyring_file_add_key -n NAME PATH first, then --psk NAME)"
        } else {
            " (add it with keyring_file_add_key first)"
        };
        return Err(p.err("psk", format!("no key named \"{k}\"{hint}")));
    }
    Ok(Some(k.to_string()))
}

/// The optional `dhchap_key` / `dhchap_ctrlr_key` of `nvmf_subsystem_add_host`
/// and `nvmf_subsystem_set_keys`, checked against the keyring.
pub(crate) fn host_keys_param(
    cfg: &TargetConfig,
    p: &mut Params<'_>,
) -> Result<Option<HostDhchapKeys>, ConfigError> {
    let key = p.opt_str("dhchap_key")?;
    let ckey = p.opt_str("dhchap_ctrlr_key")?;
    for (param, k) in [("dhchap_key", key), ("dhchap_ctrlr_key", ckey)] {
        if let Some(k) = k {
            if cfg.key(k).is_none() {
                return Err(p.err(
                    param,
                    format!("no key named \"{k}\" (add it with keyring_file_add_key first)"),
                ));
            }
        }
    }
    match (key, ckey) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(p.err(
            "dhchap_ctrlr_key",
            "a controller key needs a host key (dhchap_key)",
        )),
        (Some(k), c) => Ok(Some(HostDhchapKeys {
            dhchap_key: k.to_string(),
            dhchap_ctrlr_key: c.map(str::to_string),
        })),
    }
}

/// `nvmf_subsystem_set_keys {nqn, host, dhchap_key?, dhchap_ctrlr_key?}`:
/// replaces the host's keys (none: the host no longer authenticates).
pub(crate) fn set_keys(
    cfg: &mut TargetConfig,
    si: usize,
    mut p: Params<'_>,
) -> Result<(), ConfigError> {
    let host = p.req_str("host")?;
    let keys = host_keys_param(cfg, &mut p)?;
    let _ = p.opt_str("tgt_name")?;
    p.finish()?;
    let s = &mut cfg.subsystems[si];
    if !s.hosts.iter().any(|h| h == host) {
        return Err(p.err(
            "host",
            format!("host \"{host}\" is not allowed on subsystem \"{}\"", s.nqn),
        ));
    }
    match keys {
        Some(k) => {
            s.host_keys.insert(host.to_string(), k);
        }
        None => {
            s.host_keys.remove(host);
        }
    }
    Ok(())
}

fn name_list(
    p: &mut Params<'_>,
    name: &'static str,
    known: &[&str],
) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(v) = p.opt_any(name)? else {
        return Ok(None);
    };
    let Some(items) = v.as_array() else {
        return Err(p.err(name, "expected an array of strings"));
    };
    let mut out = Vec::new();
    for it in items {
        let Some(s) = it.as_str() else {
            return Err(p.err(name, "expected an array of strings"));
        };
        if !known.contains(&s) {
            return Err(p.err(
                name,
                format!("unknown value \"{s}\" (known: {})", known.join(", ")),
            ));
        }
        if !out.iter().any(|o| o == s) {
            out.push(s.to_string());
        }
    }
    if out.is_empty() {
        return Err(p.err(name, "must name at least one"));
    }
    Ok(Some(out))
}

/// The DH-HMAC-CHAP part of `nvmf_set_config` (its other parameters tune
/// SPDK internals and are skipped). Returns whether either was present.
pub(crate) fn set_config_dhchap(
    cfg: &mut TargetConfig,
    params: Option<&Value>,
) -> Result<bool, ConfigError> {
    let Some(Value::Object(map)) = params else {
        return Ok(false);
    };
    let sub: serde_json::Map<String, Value> = map
        .iter()
        .filter(|(k, _)| k.starts_with("dhchap_"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if sub.is_empty() {
        return Ok(false);
    }
    let v = Value::Object(sub);
    let mut p = Params::new("nvmf_set_config", Some(&v))?;
    let digests = name_list(&mut p, "dhchap_digests", &DHCHAP_DIGESTS)?;
    let dhgroups = name_list(&mut p, "dhchap_dhgroups", &DHCHAP_DHGROUPS)?;
    p.finish()?;
    if digests.is_some() {
        cfg.dhchap_digests = digests;
    }
    if dhgroups.is_some() {
        cfg.dhchap_dhgroups = dhgroups;
    }
    Ok(true)
}

/// `save_config` entries: the `keyring` section's and, for the `nvmf`
/// section, `nvmf_set_config` with the DH-HMAC-CHAP lists (when set).
pub(crate) fn keyring_entries(cfg: &TargetConfig) -> Vec<Value> {
    cfg.keyring
        .iter()
        .map(|k| {
            json!({"method": "keyring_file_add_key", "params": {"name": k.name, "path": k.path}})
        })
        .collect()
}

pub(crate) fn set_config_entry(cfg: &TargetConfig) -> Option<Value> {
    if cfg.dhchap_digests.is_none() && cfg.dhchap_dhgroups.is_none() {
        return None;
    }
    let mut params = serde_json::Map::new();
    if let Some(d) = &cfg.dhchap_digests {
        params.insert("dhchap_digests".into(), json!(d));
    }
    if let Some(g) = &cfg.dhchap_dhgroups {
        params.insert("dhchap_dhgroups".into(), json!(g));
    }
    Some(json!({"method": "nvmf_set_config", "params": params}))
}
