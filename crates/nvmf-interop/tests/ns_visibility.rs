//! Per-host namespace visibility with the Linux kernel host
//! (tests/interop/ns-visibility.sh; docs/VISIBILITY.md): namespace 1 is
//! visible to the guest's host NQN, namespace 2 only to another host NQN. The
//! guest lists namespace 1 only; at its checkpoints the host driver runs
//! `nvmf_ns_add_host` (namespace 2 appears on the same controller without a
//! reconnect, write + verify) and `nvmf_ns_remove_host` (the kernel removes
//! it, the controller stays live); a second controller as the other host NQN
//! lists namespace 2 only. On 6.1 and 6.12 (`..._612`). Opt-in with
//! NVMFD_INTEROP=1, like kernel_host.rs.

use std::time::{Duration, Instant};

use nvmf_interop::*;
use serde_json::json;

const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
const NQN: &str = "nqn.2016-06.io.spdk:vis1";

#[test]
fn kernel_host_sees_only_its_namespaces_and_changes_without_reconnect() {
    scenario(
        Kernel::from_env(),
        "kernel_host_sees_only_its_namespaces_and_changes_without_reconnect",
        "ns_visibility",
    );
}

#[test]
fn kernel_host_sees_only_its_namespaces_and_changes_without_reconnect_612() {
    scenario(
        Kernel::Backports612,
        "kernel_host_sees_only_its_namespaces_and_changes_without_reconnect_612",
        "ns_visibility-612",
    );
}

fn scenario(kernel: Kernel, test: &str, work: &str) {
    let Some(_serial) = begin(test) else {
        return;
    };
    let dir = work_dir(work);
    let port = free_port();
    let me = host_nqn(HOST_ID);
    let other = host_nqn(OTHER_HOST_ID);
    let listen = json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    let cfg = json!({"subsystems": [
        {"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "M1", "num_blocks": 65536, "block_size": 512}},
            {"method": "bdev_malloc_create", "params": {"name": "M2", "num_blocks": 65536, "block_size": 512}}]},
        {"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
            {"method": "nvmf_create_subsystem", "params": {"nqn": NQN, "serial_number": "NVMFDVIS01",
                "model_number": "nvmfd visibility test", "allow_any_host": true}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN,
                "namespace": {"bdev_name": "M1", "nsid": 1, "no_auto_visible": true}}},
            {"method": "nvmf_ns_add_host", "params": {"nqn": NQN, "nsid": 1, "host": me}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN,
                "namespace": {"bdev_name": "M2", "nsid": 2, "no_auto_visible": true}}},
            {"method": "nvmf_ns_add_host", "params": {"nqn": NQN, "nsid": 2, "host": other}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": NQN, "listen_address": listen}}]}]});
    let mut nvmfd = Nvmfd::start(&dir, &cfg, port);
    let env = vec![
        ("PORT", port.to_string()),
        ("NQN", NQN.to_string()),
        ("HOSTNQN", me.clone()),
        ("HOSTID", HOST_ID.to_string()),
        ("OTHERNQN", other.clone()),
        ("OTHERID", OTHER_HOST_ID.to_string()),
    ];
    let mut failures = Vec::new();
    let run = run_guest_on(
        kernel,
        &dir,
        "ns-visibility.sh",
        &[port],
        &env,
        GUEST_TIMEOUT,
        |cp, _| {
            let t0 = Instant::now();
            let r = match cp {
                "add-host" => nvmfd
                    .rpc(&["nvmf_ns_add_host", NQN, "2", &me])
                    .map(|_| "ok namespace 2 visible to the guest".to_string()),
                "remove-host" => nvmfd
                    .rpc(&["nvmf_ns_remove_host", NQN, "2", &me])
                    .map(|_| "ok namespace 2 hidden from the guest".to_string()),
                _ => Ok(expect_no_controllers(&nvmfd)),
            };
            say(&format!(
                "interop ns_visibility: checkpoint {cp} answered in {:.2} s",
                t0.elapsed().as_secs_f64()
            ));
            r.unwrap_or_else(|e| {
                failures.push(format!("checkpoint {cp}: {e}"));
                format!("failed: {e}")
            })
        },
    );
    finish(test, &run, &mut nvmfd, &failures);
}
