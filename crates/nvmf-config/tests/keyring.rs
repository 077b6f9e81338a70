//! The file keyring and DH-HMAC-CHAP settings in the model: key files with
//! loose permissions refused, key names checked, `save_config` writes names
//! and paths (never a key) and loads back to the same model.

use std::os::unix::fs::PermissionsExt;

use nvmf_config::{HostDhchapKeys, TargetConfig};
use serde_json::json;

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
const SECRET: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

/// A private temporary directory, removed on drop.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("nvmf-config-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn key_file(dir: &Dir, name: &str, mode: u32) -> String {
    let p = dir.0.join(name);
    std::fs::write(&p, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p.to_string_lossy().into_owned()
}

fn base() -> TargetConfig {
    let mut c = TargetConfig::default();
    c.apply_method("nvmf_create_subsystem", Some(&json!({"nqn": NQN})))
        .unwrap();
    c
}

#[test]
fn keys_hosts_and_policy_round_trip_without_secrets() {
    let dir = Dir::new("keyring-round-trip");
    let k0 = key_file(&dir, "k0", 0o600);
    let k1 = key_file(&dir, "k1", 0o400);
    let mut c = base();
    c.apply_method(
        "keyring_file_add_key",
        Some(&json!({"name": "key0", "path": k0})),
    )
    .unwrap();
    c.apply_method(
        "keyring_file_add_key",
        Some(&json!({"name": "ckey0", "path": k1})),
    )
    .unwrap();
    c.apply_method(
        "nvmf_subsystem_add_host",
        Some(&json!({"nqn": NQN, "host": HOST, "dhchap_key": "key0", "dhchap_ctrlr_key": "ckey0"})),
    )
    .unwrap();
    c.apply_method(
        "nvmf_set_config",
        Some(&json!({"dhchap_digests": ["sha256"], "dhchap_dhgroups": ["null", "ffdhe2048"]})),
    )
    .unwrap();
    assert_eq!(
        c.subsystem(NQN).unwrap().host_keys[HOST],
        HostDhchapKeys {
            dhchap_key: "key0".into(),
            dhchap_ctrlr_key: Some("ckey0".into())
        }
    );
    let v = c.to_json_value();
    let text = v.to_string();
    assert!(text.contains(&k0) && text.contains("\"dhchap_ctrlr_key\":\"ckey0\""));
    assert!(!text.contains("DHHC-1"), "a secret was written: {text}");
    let back = TargetConfig::from_json_value(&v).unwrap();
    assert_eq!(back.keyring, c.keyring);
    assert_eq!(back.subsystems, c.subsystems);
    assert_eq!(back.dhchap_digests, Some(vec!["sha256".to_string()]));
    assert_eq!(back.dhchap_dhgroups.as_ref().map(Vec::len), Some(2));

    // Rotation: set_keys replaces, and clears with no keys.
    c.apply_method(
        "nvmf_subsystem_set_keys",
        Some(&json!({"nqn": NQN, "host": HOST, "dhchap_key": "ckey0"})),
    )
    .unwrap();
    assert_eq!(
        c.subsystem(NQN).unwrap().host_keys[HOST].dhchap_key,
        "ckey0"
    );
    let e = c
        .apply_method("keyring_file_remove_key", Some(&json!({"name": "ckey0"})))
        .unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
    c.apply_method(
        "nvmf_subsystem_set_keys",
        Some(&json!({"nqn": NQN, "host": HOST})),
    )
    .unwrap();
    assert!(c.subsystem(NQN).unwrap().host_keys.is_empty());
    c.apply_method("keyring_file_remove_key", Some(&json!({"name": "ckey0"})))
        .unwrap();
    assert_eq!(c.keyring.len(), 1);
}

#[test]
fn bad_key_files_and_names_refused() {
    let dir = Dir::new("keyring-bad");
    let loose = key_file(&dir, "loose", 0o644);
    let mut c = base();
    let e = c
        .apply_method(
            "keyring_file_add_key",
            Some(&json!({"name": "k", "path": loose})),
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("accessible by group or others"),
        "{e}"
    );
    let e = c
        .apply_method(
            "keyring_file_add_key",
            Some(&json!({"name": "k", "path": "rel/path"})),
        )
        .unwrap_err();
    assert!(e.to_string().contains("absolute"), "{e}");
    let e = c
        .apply_method(
            "keyring_file_add_key",
            Some(&json!({"name": "k", "path": "/nonexistent/nvmfd-key"})),
        )
        .unwrap_err();
    assert!(e.to_string().contains("/nonexistent/nvmfd-key"), "{e}");
    let e = c
        .apply_method("nvmf_set_config", Some(&json!({"dhchap_digests": ["md5"]})))
        .unwrap_err();
    assert!(e.to_string().contains("unknown value \"md5\""), "{e}");
    let e = c
        .apply_method(
            "nvmf_set_config",
            Some(&json!({"dhchap_dhgroups": ["ffdhe1024"]})),
        )
        .unwrap_err();
    assert!(e.to_string().contains("ffdhe1024"), "{e}");
    let ok = key_file(&dir, "ok", 0o600);
    c.apply_method(
        "keyring_file_add_key",
        Some(&json!({"name": "k", "path": ok})),
    )
    .unwrap();
    let e = c
        .apply_method(
            "nvmf_subsystem_add_host",
            Some(&json!({"nqn": NQN, "host": HOST, "dhchap_ctrlr_key": "k"})),
        )
        .unwrap_err();
    assert!(e.to_string().contains("needs a host key"), "{e}");
    let e = c
        .apply_method(
            "nvmf_subsystem_set_keys",
            Some(&json!({"nqn": NQN, "host": HOST, "dhchap_key": "k"})),
        )
        .unwrap_err();
    assert!(e.to_string().contains("not allowed"), "{e}");
}

/// TLS in the model: `add_host psk` names a keyring key (unknown names and file paths refused),
/// `secure_channel` listeners, one TLS setting per address across subsystems, keys in use by a
/// PSK host cannot be removed, and `save_config` loads back to the same model.
#[test]
fn tls_psk_hosts_and_secure_listeners() {
    let dir = Dir::new("keyring-tls");
    let k0 = key_file(&dir, "k0", 0o600);
    let mut c = base();
    c.apply_method("nvmf_create_transport", Some(&json!({"trtype": "TCP"})))
        .unwrap();
    c.apply_method(
        "keyring_file_add_key",
        Some(&json!({"name": "key0", "path": k0})),
    )
    .unwrap();
    let e = c
        .apply_method(
            "nvmf_subsystem_add_host",
            Some(&json!({"nqn": NQN, "host": HOST, "psk": "/etc/key"})),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("psk") && e.contains("keyring_file_add_key -n"),
        "{e}"
    );
    c.apply_method(
        "nvmf_subsystem_add_host",
        Some(&json!({"nqn": NQN, "host": HOST, "psk": "key0"})),
    )
    .unwrap();
    assert_eq!(
        c.subsystems[0].host_psks.get(HOST).map(String::as_str),
        Some("key0")
    );
    let la = json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4420"});
    c.apply_method(
        "nvmf_subsystem_add_listener",
        Some(&json!({"nqn": NQN, "listen_address": la, "secure_channel": true})),
    )
    .unwrap();
    assert!(c.listener_secure("127.0.0.1", "4420"));
    assert!(!c.listener_secure("127.0.0.1", "4421"));
    // Another subsystem, same address, clear text: refused; with TLS: fine.
    c.apply_method(
        "nvmf_create_subsystem",
        Some(&json!({"nqn": "nqn.2016-06.io.spdk:cnode2"})),
    )
    .unwrap();
    let e = c
        .apply_method(
            "nvmf_subsystem_add_listener",
            Some(&json!({"nqn": "nqn.2016-06.io.spdk:cnode2", "listen_address": la})),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("secure_channel") && e.contains(NQN), "{e}");
    c.apply_method(
        "nvmf_subsystem_add_listener",
        Some(&json!({"nqn": "nqn.2016-06.io.spdk:cnode2", "listen_address": la, "secure_channel": true})),
    )
    .unwrap();
    // The key is in use.
    let e = c
        .apply_method("keyring_file_remove_key", Some(&json!({"name": "key0"})))
        .unwrap_err()
        .to_string();
    assert!(e.contains("in use"), "{e}");
    // Round trip.
    let saved = c.to_json_value();
    let text = saved.to_string();
    assert!(
        !text.contains("DHHC-1") && text.contains("\"psk\":\"key0\""),
        "{text}"
    );
    let back = TargetConfig::from_json_value(&saved).unwrap();
    assert_eq!(back, c);
}
