//! Live reconfiguration with the Linux kernel host connected
//! (tests/interop/live-ns.sh): the host driver changes the running nvmfd over
//! JSON-RPC at the guest's checkpoints — adds namespace 2 (the kernel shows
//! /dev/nvme0n2 without reconnecting), removes namespace 1 under fio (fio
//! ends, the block device goes away, the daemon keeps serving and still lists
//! the controller), and checks that disconnect frees the controller.
//! Opt-in with NVMFD_INTEROP=1, like kernel_host.rs.

use std::time::{Duration, Instant};

use nvmf_interop::*;

const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
const NQN: &str = "nqn.2016-06.io.spdk:live1";

#[test]
fn live_namespace_add_and_remove_under_io() {
    let Some(_serial) = begin("live_namespace_add_and_remove_under_io") else {
        return;
    };
    let dir = work_dir("live_reconfig");
    let port = free_port();
    let cfg = spdk_config(
        port,
        &[Malloc {
            name: "Malloc0",
            num_blocks: 131072,
            block_size: 512,
        }],
        &[Subsystem {
            nqn: NQN.into(),
            serial: "NVMFDLIVE01".into(),
            model: "nvmfd live test".into(),
            allow_any_host: true,
            hosts: vec![],
            namespaces: vec![(1, "Malloc0")],
        }],
    );
    let mut nvmfd = Nvmfd::start(&dir, &cfg, port);
    let env = vec![
        ("PORT", port.to_string()),
        ("NQN", NQN.to_string()),
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("HOSTID", HOST_ID.to_string()),
    ];
    let mut failures = Vec::new();
    let run = run_guest(&dir, "live-ns.sh", &[port], &env, GUEST_TIMEOUT, |cp, _| {
        let t0 = Instant::now();
        let r = match cp {
            "add-ns2" => nvmfd
                .rpc(&["bdev_malloc_create", "-b", "Malloc1", "32", "512"])
                .and_then(|_| nvmfd.rpc(&["nvmf_subsystem_add_ns", NQN, "Malloc1", "-n", "2"]))
                .map(|_| "ok namespace 2 added".to_string()),
            "remove-ns1" => nvmfd
                .rpc(&["nvmf_subsystem_remove_ns", NQN, "1"])
                .map(|_| "ok namespace 1 removed".to_string()),
            "after-remove" => nvmfd
                .rpc(&["nvmf_subsystem_get_controllers", NQN])
                .and_then(|out| {
                    let v: serde_json::Value =
                        serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
                    match v.as_array().map(Vec::len) {
                        Some(1) => Ok(()),
                        _ => Err(format!("expected one controller, got {out}")),
                    }
                })
                .and_then(|_| nvmfd.rpc(&["nvmf_get_subsystems", NQN]))
                .and_then(|out| {
                    let v: serde_json::Value =
                        serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
                    let nsids: Vec<u64> = v[0]["namespaces"]
                        .as_array()
                        .ok_or_else(|| format!("no namespace list: {out}"))?
                        .iter()
                        .filter_map(|ns| ns["nsid"].as_u64())
                        .collect();
                    if nsids == [2] {
                        Ok("ok daemon serving, controller listed".to_string())
                    } else {
                        Err(format!("expected only namespace 2, got {nsids:?}: {out}"))
                    }
                }),
            _ => Ok(expect_no_controllers(&nvmfd)),
        };
        say(&format!(
            "interop live_reconfig: checkpoint {cp} answered in {:.2} s",
            t0.elapsed().as_secs_f64()
        ));
        r.unwrap_or_else(|e| {
            failures.push(format!("checkpoint {cp}: {e}"));
            format!("failed: {e}")
        })
    });
    finish(
        "live_namespace_add_and_remove_under_io",
        &run,
        &mut nvmfd,
        &failures,
    );
}
