//! ANA multipath with the Linux kernel host's native NVMe multipath
//! (tests/interop/ana.sh): one nvmfd, one subsystem with ANA reporting, two
//! listeners, the guest connected through both.
//!
//! - `ana_states_and_round_robin` (issue 9, tests 1 and 6): the paths show the
//!   ANA states the target set (sysfs, `nvme list-subsys`, `nvme ana-log`); a
//!   state set over RPC reaches the kernel through the ANA Change event without
//!   a reconnect; iopolicy round-robin spreads fio crc32c verify over both paths,
//!   and nvmfd's Prometheus endpoint (`--metrics`) shows bytes rising on both
//!   listeners.
//! - `ana_failover_inaccessible_removed_back` (tests 2 and 6): fio crc32c verify
//!   through the multipath device while path A goes inaccessible, its listener
//!   is removed, then added back: 0 errors; while A is out only B's listener
//!   counters move; the kernel uses A again once it is back. The longest I/O
//!   pause fio saw is printed.
//!
//! Opt-in with NVMFD_INTEROP=1, like kernel_host.rs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use nvmf_interop::*;
use serde_json::{json, Value};

const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
const NQN: &str = "nqn.2016-06.io.spdk:ana1";

fn listen(port: u16) -> Value {
    json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()})
}

/// 64 MiB RAM namespace in a subsystem with ANA reporting, listeners on `p1`
/// (optimized) and `p2` (`p2_state`), discovery on `p1`.
fn config(p1: u16, p2: u16, p2_state: &str) -> Value {
    json!({"subsystems": [
        {"subsystem": "bdev", "config": [
            {"method": "bdev_malloc_create", "params": {"name": "Malloc0", "num_blocks": 131072, "block_size": 512}},
        ]},
        {"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
            {"method": "nvmf_create_subsystem", "params": {"nqn": NQN, "serial_number": "NVMFDANA0001",
                "model_number": "nvmfd ANA test", "allow_any_host": true, "ana_reporting": true, "max_namespaces": 4}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN, "namespace": {"bdev_name": "Malloc0", "nsid": 1}}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": NQN, "listen_address": listen(p1)}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": NQN, "listen_address": listen(p2), "ana_state": p2_state}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2014-08.org.nvmexpress.discovery", "listen_address": listen(p1)}},
        ]},
    ]})
}

/// Bytes read + written through listener 127.0.0.1:`port`, from nvmfd's
/// Prometheus endpoint (every namespace series labelled with that listener).
fn listener_bytes(metrics: u16, port: u16) -> Result<u64, String> {
    let mut s = TcpStream::connect(("127.0.0.1", metrics)).map_err(|e| format!("metrics: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: nvmfd\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("metrics: {e}"))?;
    let mut body = String::new();
    s.read_to_string(&mut body)
        .map_err(|e| format!("metrics: {e}"))?;
    let label = format!("listener=\"127.0.0.1:{port}\"");
    let mut sum = 0u64;
    let mut seen = false;
    for l in body.lines() {
        if (l.starts_with("nvmf_ns_read_bytes") || l.starts_with("nvmf_ns_written_bytes"))
            && l.contains(&label)
        {
            seen = true;
            let v = l.rsplit(' ').next().unwrap_or("0");
            sum += v.parse::<f64>().map_err(|e| format!("{e}: {l}"))? as u64;
        }
    }
    if seen || body.contains("# EOF") {
        Ok(sum)
    } else {
        Err(format!("no metrics in the answer:\n{body}"))
    }
}

struct Paths {
    p1: u16,
    p2: u16,
    metrics: u16,
    mark: (u64, u64),
}

impl Paths {
    fn bytes(&self) -> Result<(u64, u64), String> {
        Ok((
            listener_bytes(self.metrics, self.p1)?,
            listener_bytes(self.metrics, self.p2)?,
        ))
    }
}

/// `nvmf rpc METHOD NQN [extra...] -t tcp -a 127.0.0.1 -s PORT`
fn listener_rpc(nvmfd: &Nvmfd, method: &str, port: u16, extra: &[&str]) -> Result<String, String> {
    let port = port.to_string();
    let mut args = vec![method, NQN];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-t", "tcp", "-a", "127.0.0.1", "-s", &port]);
    nvmfd.rpc(&args)
}

fn set_state(nvmfd: &Nvmfd, port: u16, state: &str) -> Result<String, String> {
    listener_rpc(
        nvmfd,
        "nvmf_subsystem_listener_set_ana_state",
        port,
        &["-n", state],
    )
}

fn run_scenario(test: &str, mode: &str, p2_state: &str) {
    let Some(_serial) = begin(test) else {
        return;
    };
    let dir = work_dir(test);
    let (p1, p2, metrics) = (free_port(), free_port(), free_port());
    let maddr = format!("127.0.0.1:{metrics}");
    let mut nvmfd = Nvmfd::start_with(&dir, &config(p1, p2, p2_state), p1, &["--metrics", &maddr]);
    let mut paths = Paths {
        p1,
        p2,
        metrics,
        mark: (0, 0),
    };
    let env = vec![
        ("PORT", p1.to_string()),
        ("PORT2", p2.to_string()),
        ("NQN", NQN.to_string()),
        ("MODE", mode.to_string()),
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("HOSTID", HOST_ID.to_string()),
    ];
    let run = run_guest(&dir, "ana.sh", &[p1, p2], &env, GUEST_TIMEOUT, |cp, _| {
        let r: Result<String, String> = match cp {
            "b-optimized" => set_state(&nvmfd, p2, "optimized").map(|_| "ok B optimized".into()),
            "counters-before" | "a-inaccessible-mark" => paths.bytes().map(|b| {
                paths.mark = b;
                format!("ok listeners at {b:?} bytes")
            }),
            "counters-after" => paths.bytes().and_then(|(a, b)| {
                let (da, db) = (a - paths.mark.0, b - paths.mark.1);
                if da >= 2 << 20 && db >= 2 << 20 {
                    Ok(format!("ok listener bytes +{da} ({p1}) +{db} ({p2})"))
                } else {
                    Err(format!(
                        "per-listener bytes +{da} ({p1}) +{db} ({p2}): not both paths"
                    ))
                }
            }),
            "a-inaccessible" => paths.bytes().and_then(|b| {
                paths.mark = b;
                set_state(&nvmfd, p1, "inaccessible").map(|_| "ok A inaccessible".into())
            }),
            "a-removed" => paths.bytes().and_then(|(a, b)| {
                // A was inaccessible meanwhile: only B's listener moved.
                let (da, db) = (a - paths.mark.0, b - paths.mark.1);
                if da > 256 << 10 || db == 0 {
                    return Err(format!(
                        "while A was inaccessible: +{da} bytes through A, +{db} through B"
                    ));
                }
                paths.mark = (a, b);
                listener_rpc(&nvmfd, "nvmf_subsystem_remove_listener", p1, &[])
                    .map(|_| format!("ok A removed (while inaccessible: A +{da}, B +{db} bytes)"))
            }),
            "a-back" => paths.bytes().and_then(|b| {
                paths.mark = b;
                listener_rpc(&nvmfd, "nvmf_subsystem_add_listener", p1, &[])
                    .map(|_| "ok A back".into())
            }),
            "survivor-counters" => paths.bytes().and_then(|(a, _)| {
                let da = a - paths.mark.0;
                if da > 0 {
                    Ok(format!("ok +{da} bytes through A since it came back"))
                } else {
                    Err("no bytes through listener A since it came back".into())
                }
            }),
            "final" => Ok(expect_no_controllers(&nvmfd)),
            other => Err(format!("unknown checkpoint {other}")),
        };
        r.unwrap_or_else(|e| format!("fail: {e}"))
    });
    if let Some(p) = run.stdout.lines().find_map(|l| l.strip_prefix("pause_ms=")) {
        say(&format!(
            "interop {test}: longest I/O pause seen by fio: {p} ms"
        ));
    }
    finish(test, &run, &mut nvmfd, &[]);
}

#[test]
fn ana_states_and_round_robin() {
    run_scenario("ana_states_and_round_robin", "states", "non_optimized");
}

#[test]
fn ana_failover_inaccessible_removed_back() {
    run_scenario(
        "ana_failover_inaccessible_removed_back",
        "failover",
        "optimized",
    );
}
