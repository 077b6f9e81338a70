//! `nvmf connect` / `connect-all` / `doctor` on the Linux kernel host in a guest (the `nvmf`
//! binary and socat shipped with `--put-bin`; socat makes the discovery log's 127.0.0.1
//! reachable in the guest), against nvmfd on the host: the kernel connects with the
//! option string nvmf writes (ctrl_loss_tmo and kato as asked, the host NQN of
//! /etc/nvme/hostnqn), `--persist` records config.json / discovery.conf once, and nvme-cli's
//! boot-time `nvme connect-all` (no arguments) brings the disk back from each after a
//! disconnect. Guest scenario: tests/interop/host-persist.sh. Opt-in with NVMFD_INTEROP=1.
//!
//! Also: readable device names (`nvmf_names_namespaces_through_udev`, udev-names.sh): nvmfd
//! names each namespace after its bdev in Identify Namespace's vendor-specific area, `nvmf
//! udev-name` reads it through the kernel's disk, and nvmf's udev rule
//! (packaging/udev/70-nvmfd.rules), run by `udevadm test` (this machine's udevadm shipped into
//! the guest, which runs no udevd), makes /dev/disk/by-nvmfd/SUBSYSTEM-NQN/NAME; after a
//! `nvmf connect --persist`, a disconnect and nvme-cli's boot-time `nvme connect-all` the
//! namespace is back under the same name with the data written before.

use std::path::Path;
use std::time::Duration;

use nvmf_interop::*;

const NQN: &str = "nqn.2016-06.io.nvmfd:persist1";

#[test]
fn nvmf_connect_persist_restored_by_nvme_connect_all() {
    let test = "nvmf_connect_persist_restored_by_nvme_connect_all";
    let Some(_serial) = begin(test) else {
        return;
    };
    let dir = work_dir("host_persist");
    let port = free_port();
    let cfg = spdk_config(
        port,
        &[Malloc {
            name: "Malloc0",
            num_blocks: 65536,
            block_size: 512,
        }],
        &[Subsystem {
            nqn: NQN.into(),
            serial: "PERSIST01".into(),
            model: "nvmfd persist test".into(),
            allow_any_host: true,
            hosts: vec![],
            namespaces: vec![(1, "Malloc0")],
        }],
    );
    let mut nvmfd = Nvmfd::start(&dir, &cfg, port);
    let env = [("PORT", port.to_string()), ("NQN", NQN.to_string())];
    let nvmf = nvmf_binary();
    let run = run_guest_with_bins(
        Kernel::from_env(),
        &dir,
        "host-persist.sh",
        &[port],
        &env,
        &[nvmf.as_path(), Path::new("/usr/bin/socat")],
        Duration::from_secs(300),
        |_, _| "ok".into(),
    );
    let mut host_failures = Vec::new();
    if let Err(e) = nvmfd.wait_active_controllers(0, Duration::from_secs(10)) {
        host_failures.push(format!(
            "controllers left after the guest disconnected everything: {e}"
        ));
    }
    finish(test, &run, &mut nvmfd, &host_failures);
}

#[test]
fn nvmf_names_namespaces_through_udev() {
    use base64::Engine;
    let test = "nvmf_names_namespaces_through_udev";
    let Some(_serial) = begin(test) else {
        return;
    };
    let dir = work_dir("udev_names");
    let port = free_port();
    let nqn = "nqn.2016-06.io.nvmfd:names1";
    let cfg = spdk_config(
        port,
        &[
            Malloc {
                name: "Malloc0",
                num_blocks: 32768,
                block_size: 512,
            },
            Malloc {
                name: "vm-101-disk-0",
                num_blocks: 32768,
                block_size: 512,
            },
        ],
        &[Subsystem {
            nqn: nqn.into(),
            serial: "NAMES01".into(),
            model: "nvmfd names test".into(),
            allow_any_host: true,
            hosts: vec![],
            namespaces: vec![(1, "Malloc0"), (2, "vm-101-disk-0")],
        }],
    );
    let mut nvmfd = Nvmfd::start(&dir, &cfg, port);
    let rules = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/udev/70-nvmfd.rules"),
    )
    .unwrap();
    let env = [
        ("PORT", port.to_string()),
        ("NQN", nqn.to_string()),
        (
            "RULES_B64",
            base64::engine::general_purpose::STANDARD.encode(rules),
        ),
    ];
    let nvmf = nvmf_binary();
    let run = run_guest_with_bins(
        Kernel::from_env(),
        &dir,
        "udev-names.sh",
        &[port],
        &env,
        &[
            nvmf.as_path(),
            Path::new("/usr/bin/udevadm"),
            Path::new("/usr/bin/socat"),
        ],
        Duration::from_secs(300),
        |_, _| "ok".into(),
    );
    let mut host_failures = Vec::new();
    if let Err(e) = nvmfd.wait_active_controllers(0, Duration::from_secs(10)) {
        host_failures.push(format!(
            "controllers left after the guest disconnected: {e}"
        ));
    }
    finish(test, &run, &mut nvmfd, &host_failures);
}
