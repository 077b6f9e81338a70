//! Kernel NVMe/TCP host (nvme-cli, fio in a QEMU guest) against nvmfd on the host: the core
//! interop set (discovery/identify/allow list, fio verify plain + digest, keep-alive/reconnect),
//! each on Debian 12's 6.1 kernel and on the bookworm-backports 6.12 kernel (`..._612`).
//! Opt-in with NVMFD_INTEROP=1; see crates/nvmf-interop/src/lib.rs and testbed/README.md.

use std::io::Write;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use nvmf_interop::*;

const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
const NQN1: &str = "nqn.2016-06.io.spdk:cnode1";
const NQN2: &str = "nqn.2016-06.io.spdk:cnode2";
const SERIAL: &str = "SPDK001";
const MODEL: &str = "nvmfd test";

fn host_env() -> Vec<(&'static str, String)> {
    vec![
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("HOSTID", HOST_ID.to_string()),
    ]
}

/// One subsystem, any host, one 64 MiB namespace.
fn single_ns_config(port: u16) -> serde_json::Value {
    spdk_config(
        port,
        &[Malloc {
            name: "Malloc0",
            num_blocks: 131072,
            block_size: 512,
        }],
        &[Subsystem {
            nqn: NQN1.into(),
            serial: SERIAL.into(),
            model: MODEL.into(),
            allow_any_host: true,
            hosts: vec![],
            namespaces: vec![(1, "Malloc0")],
        }],
    )
}

/// The testbed itself: a guest reaches the host port it was given and nothing else.
#[test]
fn testbed_network_is_restricted() {
    let Some(_serial) = begin("testbed_network_is_restricted") else {
        return;
    };
    let dir = work_dir("network");
    let stop = Arc::new(AtomicBool::new(false));
    let mut listeners = Vec::new();
    let mut ports = Vec::new();
    let mut counts = Vec::new();
    for _ in 0..2 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        ports.push(l.local_addr().unwrap().port());
        let count = Arc::new(AtomicUsize::new(0));
        counts.push(count.clone());
        let stop = stop.clone();
        listeners.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut s, _)) => {
                        count.fetch_add(1, Ordering::Relaxed);
                        let _ = s.write_all(b"hello\n");
                    }
                    Err(_) => thread::sleep(Duration::from_millis(20)),
                }
            }
        }));
    }
    let mut env = vec![
        ("PORT", ports[0].to_string()),
        ("BLOCKED", ports[1].to_string()),
    ];
    env.extend(host_env());
    let run = run_guest(
        &dir,
        "network.sh",
        &ports[..1],
        &env,
        GUEST_TIMEOUT,
        |_, _| "ok".into(),
    );
    stop.store(true, Ordering::Relaxed);
    for t in listeners {
        t.join().unwrap();
    }
    println!("{}", run.report(None));
    say(&format!(
        "interop testbed_network_is_restricted: guest status {}, {:.1} s",
        run.status,
        run.wall.as_secs_f64()
    ));
    assert_eq!(
        run.status,
        0,
        "guest scenario failed:\n{}",
        run.report(None)
    );
    assert!(
        counts[0].load(Ordering::Relaxed) >= 1,
        "named port saw no connection"
    );
    assert_eq!(
        counts[1].load(Ordering::Relaxed),
        0,
        "a port that was not named got a connection"
    );
}

/// Discovery, connect, nvme list / id-ctrl / id-ns / ns-descs with two namespaces, and a
/// subsystem whose allow list refuses an unknown host NQN.
#[test]
fn discovery_identify_and_allow_list() {
    identify_scenario(
        Kernel::from_env(),
        "discovery_identify_and_allow_list",
        "identify",
    );
}

#[test]
fn discovery_identify_and_allow_list_612() {
    identify_scenario(
        Kernel::Backports612,
        "discovery_identify_and_allow_list_612",
        "identify-612",
    );
}

fn identify_scenario(kernel: Kernel, test: &str, work: &str) {
    let Some(_serial) = begin(test) else {
        return;
    };
    let dir = work_dir(work);
    let port = free_port();
    let cfg = spdk_config(
        port,
        &[
            Malloc {
                name: "Malloc0",
                num_blocks: 131072,
                block_size: 512,
            },
            Malloc {
                name: "Malloc1",
                num_blocks: 65536,
                block_size: 512,
            },
            Malloc {
                name: "Malloc2",
                num_blocks: 32768,
                block_size: 512,
            },
        ],
        &[
            Subsystem {
                nqn: NQN1.into(),
                serial: SERIAL.into(),
                model: MODEL.into(),
                allow_any_host: true,
                hosts: vec![],
                namespaces: vec![(1, "Malloc0"), (2, "Malloc1")],
            },
            Subsystem {
                nqn: NQN2.into(),
                serial: "SPDK002".into(),
                model: MODEL.into(),
                allow_any_host: false,
                hosts: vec![host_nqn(HOST_ID)],
                namespaces: vec![(1, "Malloc2")],
            },
        ],
    );
    let mut nvmfd = Nvmfd::start(&dir, &cfg, port);
    let mut env = vec![
        ("PORT", port.to_string()),
        ("NQN", NQN1.to_string()),
        ("SERIAL", SERIAL.to_string()),
        ("MODEL", MODEL.to_string()),
        ("NS1_BLOCKS", "131072".to_string()),
        ("NS2_BLOCKS", "65536".to_string()),
        ("BLOCK_SIZE", "512".to_string()),
        ("ACL_NQN", NQN2.to_string()),
        ("OTHER_HOSTNQN", host_nqn(OTHER_HOST_ID)),
        ("OTHER_HOSTID", OTHER_HOST_ID.to_string()),
    ];
    env.extend(host_env());
    let run = run_guest_on(
        kernel,
        &dir,
        "identify.sh",
        &[port],
        &env,
        GUEST_TIMEOUT,
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

/// fio 4k randrw 75/25 and 128k sequential write+read with crc32c verification, first
/// without, then with header and data digests.
#[test]
fn fio_verify_plain_and_digest() {
    fio_scenario(Kernel::from_env(), "fio_verify_plain_and_digest", "fio");
}

#[test]
fn fio_verify_plain_and_digest_612() {
    fio_scenario(
        Kernel::Backports612,
        "fio_verify_plain_and_digest_612",
        "fio-612",
    );
}

fn fio_scenario(kernel: Kernel, test: &str, work: &str) {
    let Some(_serial) = begin(test) else {
        return;
    };
    let dir = work_dir(work);
    let port = free_port();
    let mut nvmfd = Nvmfd::start(&dir, &single_ns_config(port), port);
    fio_verify_scenario_on(kernel, test, &dir, port, NQN1, &mut nvmfd);
}

/// An idle connection (--keep-alive-tmo=5) survives 12 s; disconnect frees the controller
/// (active_controllers=0); a new connection reads back the data written before.
#[test]
fn keepalive_disconnect_reconnect() {
    keepalive_scenario(
        Kernel::from_env(),
        "keepalive_disconnect_reconnect",
        "keepalive",
    );
}

#[test]
fn keepalive_disconnect_reconnect_612() {
    keepalive_scenario(
        Kernel::Backports612,
        "keepalive_disconnect_reconnect_612",
        "keepalive-612",
    );
}

fn keepalive_scenario(kernel: Kernel, test: &str, work: &str) {
    let Some(_serial) = begin(test) else {
        return;
    };
    let dir = work_dir(work);
    let port = free_port();
    let mut nvmfd = Nvmfd::start(&dir, &single_ns_config(port), port);
    let mut env = vec![
        ("PORT", port.to_string()),
        ("NQN", NQN1.to_string()),
        ("IDLE_S", "12".into()),
    ];
    env.extend(host_env());
    let mut lines_at_idle_start = None;
    let mut host_failures = Vec::new();
    let run = run_guest_on(
        kernel,
        &dir,
        "keepalive.sh",
        &[port],
        &env,
        GUEST_TIMEOUT,
        |name, _| match name {
            "idle-start" => {
                let v = nvmfd.active_controllers();
                lines_at_idle_start = Some(v.len());
                match v.last() {
                Some(n) if *n >= 1 => format!("ok active_controllers={n}"),
                other => format!("fail: expected active_controllers>=1 while connected, last logged value {other:?}"),
            }
            }
            "idle-end" => {
                let v = nvmfd.active_controllers();
                match lines_at_idle_start {
                    Some(n) if v.len() == n => {
                        "ok no controller created or destroyed while idle".into()
                    }
                    _ => {
                        let msg = format!(
                            "fail: nvmfd controller lines while idle (keep-alive?): {:?} -> {:?}",
                            lines_at_idle_start, v
                        );
                        host_failures.push(msg.clone());
                        msg
                    }
                }
            }
            _ => expect_no_controllers(&nvmfd),
        },
    );
    finish(test, &run, &mut nvmfd, &host_failures);
}

/// The testbed's kernel-target mode: nvmet in a guest answers an ICReq on the forwarded
/// host port (the reference target for the user-space initiator's tests).
#[test]
fn testbed_kernel_target_answers() {
    let Some(_serial) = begin("testbed_kernel_target_answers") else {
        return;
    };
    let dir = work_dir("kernel-target");
    let port = free_port();
    let t0 = std::time::Instant::now();
    let target = KernelTarget::start(&dir, port, "nqn.2024-01.io.nvmfd:reference", 1, 16, &[]);
    let resp = icreq_probe(port);
    say(&format!(
        "interop testbed_kernel_target_answers: target up and probed in {:.1} s",
        t0.elapsed().as_secs_f64()
    ));
    let resp = resp
        .unwrap_or_else(|e| panic!("ICReq to the kernel target failed: {e}\n{}", target.dmesg()));
    assert_eq!(
        resp[0],
        1,
        "PDU type of the answer is not ICResp: {:02x?}",
        &resp[..8]
    );
    assert_eq!(
        u32::from_le_bytes(resp[4..8].try_into().unwrap()),
        128,
        "ICResp PLEN"
    );
}
