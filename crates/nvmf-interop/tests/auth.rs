//! DH-HMAC-CHAP with the Linux kernel host (6.12; Debian 12's 6.1 kernel has no
//! CONFIG_NVME_AUTH): refused without a secret and with a wrong one (logged with the host
//! NQN), unidirectional and bidirectional with SHA-256 and the null DH group, SHA-384 and
//! SHA-512 (bidirectional, null group), ffdhe2048
//! with one I/O queue (TCG makes the big groups slow), a wrong controller secret refused by
//! the host, key rotation over RPC followed by the host's re-authentication, fio verify.
//! Opt-in with NVMFD_INTEROP=1 (tests/interop/auth.sh runs in the guest).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use nvmf_interop::*;
use serde_json::json;

const NQN: &str = "nqn.2016-06.io.nvmfd:auth";
// Secrets in the NVMe representation: 32-byte key with SHA-256 transformation (host), the
// same bytes untransformed (a wrong secret), 48-byte SHA-384 (the rotated host key) and
// 64-byte SHA-512 (controller).
const KEY: &str = "DHHC-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const WRONG: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
const KEY2: &str =
    "DHHC-1:02:ZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXp7fH1+f4CBgoOEhYaHiImKi4yNjo+QkZKTvGwQfg==:";
const CKEY: &str = "DHHC-1:03:AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4/QJn7gCg=:";

fn key_file(dir: &Path, name: &str, secret: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn kernel_host_612_dhchap() {
    let Some(_serial) = begin("kernel_host_612_dhchap") else {
        return;
    };
    let dir = work_dir("auth");
    let port = free_port();
    let host = host_nqn(HOST_ID);
    let mut cfg = spdk_config(
        port,
        &[Malloc {
            name: "Malloc0",
            num_blocks: 32768,
            block_size: 512,
        }],
        &[Subsystem {
            nqn: NQN.into(),
            serial: "AUTH001".into(),
            model: "nvmfd auth".into(),
            allow_any_host: false,
            hosts: vec![host.clone()],
            namespaces: vec![(1, "Malloc0")],
        }],
    );
    // The keyring and the host's key names.
    let keyring = json!({"subsystem": "keyring", "config": [
        {"method": "keyring_file_add_key", "params": {"name": "key0", "path": key_file(&dir, "key0", KEY)}},
        {"method": "keyring_file_add_key", "params": {"name": "key1", "path": key_file(&dir, "key1", KEY2)}},
        {"method": "keyring_file_add_key", "params": {"name": "ckey0", "path": key_file(&dir, "ckey0", CKEY)}},
    ]});
    let sections = cfg["subsystems"].as_array_mut().unwrap();
    for e in sections[1]["config"].as_array_mut().unwrap() {
        if e["method"] == "nvmf_subsystem_add_host" {
            e["params"]["dhchap_key"] = json!("key0");
            e["params"]["dhchap_ctrlr_key"] = json!("ckey0");
        }
    }
    sections.insert(0, keyring);
    let mut nvmfd = Nvmfd::start(&dir, &cfg, port);
    let saved = nvmfd.rpc(&["save_config"]).expect("save_config");
    assert!(
        !saved.contains("DHHC-1"),
        "save_config wrote a secret:\n{saved}"
    );

    let env = vec![
        ("PORT", port.to_string()),
        ("NQN", NQN.to_string()),
        ("HOSTNQN", host.clone()),
        ("HOSTID", HOST_ID.to_string()),
        ("KEY", KEY.to_string()),
        ("CKEY", CKEY.to_string()),
        ("WRONG", WRONG.to_string()),
        ("KEY2", KEY2.to_string()),
        ("FIO_MB", "4".to_string()),
    ];
    let mut failures = Vec::new();
    let run = run_guest_on(
        Kernel::Backports612,
        &dir,
        "auth.sh",
        &[port],
        &env,
        Duration::from_secs(420),
        |cp, _| {
            let r = match cp {
                "after-wrong" => {
                    let log = nvmfd.log();
                    if log.lines().any(|l| {
                        l.contains("DH-HMAC-CHAP authentication failed") && l.contains(&host)
                    }) {
                        Ok(())
                    } else {
                        Err("no 'authentication failed' line naming the host".to_string())
                    }
                }
                "digest-sha384" | "digest-sha512" => nvmfd
                    .rpc(&[
                        "nvmf_set_config",
                        "--dhchap-digests",
                        &cp["digest-".len()..],
                        "--dhchap-dhgroups",
                        "null",
                    ])
                    .map(|_| ()),
                "dh-null" | "dh-null-again" => nvmfd
                    .rpc(&[
                        "nvmf_set_config",
                        "--dhchap-digests",
                        "sha256",
                        "--dhchap-dhgroups",
                        "null",
                    ])
                    .map(|_| ()),
                "dh-ffdhe" => nvmfd
                    .rpc(&[
                        "nvmf_set_config",
                        "--dhchap-digests",
                        "sha256",
                        "--dhchap-dhgroups",
                        "ffdhe2048",
                    ])
                    .map(|_| ()),
                "rotate" => nvmfd
                    .rpc(&[
                        "nvmf_subsystem_set_keys",
                        NQN,
                        &host,
                        "--dhchap-key",
                        "key1",
                        "--dhchap-ctrlr-key",
                        "ckey0",
                    ])
                    .map(|_| ()),
                "reauth" => Ok(()),
                _ => {
                    let r = expect_no_controllers(&nvmfd);
                    if r.starts_with("ok") {
                        Ok(())
                    } else {
                        Err(r)
                    }
                }
            };
            match r {
                Ok(()) => "ok".to_string(),
                Err(e) => {
                    failures.push(format!("checkpoint {cp}: {e}"));
                    format!("failed: {e}")
                }
            }
        },
    );
    let log = nvmfd.log();
    if log.contains(KEY.trim_end_matches(':')) || log.contains("AAECAwQF") {
        failures.push("nvmfd logged a secret".to_string());
    }
    finish("kernel_host_612_dhchap", &run, &mut nvmfd, &failures);
}
