//! RBD namespaces with the Linux kernel host (issue 10): nvmfd on the host serves images of
//! a real one-node Ceph cluster (nvmf-testkit's [`CephCluster`], one per test binary, one
//! OSD, pool `rbd` of size 1), the kernel host runs in a testbed guest.
//!
//! * `rbd_fio_verify_and_export` (tests/interop/rbd-io.sh): discover, connect, fio crc32c
//!   verify (4k randrw 75/25, 128k sequential), a dd pattern; the guest's SHA-256 of the
//!   whole namespace equals that of `rbd export`, and the pattern's bytes are in the image.
//! * `rbd_resize_seen_by_host` (rbd-resize.sh): the image grows under a connected host,
//!   by `bdev_rbd_resize` over JSON-RPC and by `rbd resize` from outside; the host sees each
//!   new size (block device and NSZE) without reconnecting, and verifies I/O there.
//! * `rbd_two_gateways_kill9` (mp-failover.sh): two nvmfd gateways on one image (no
//!   exclusive-lock), one subsystem, native multipath; one gateway `kill -9` under fio
//!   verify and restarted: 0 errors, 0 verify failures.
//! * `rbd_two_gateways_coherent` (rbd-coherence.sh): two gateways on one image as two
//!   separate subsystems (the guest picks the gateway): 1 MiB written through one is read
//!   through the other at once, both ways, also after the reader held the old data (what a
//!   gateway-side read cache, e.g. `rbd_cache=true`, would break).
//! * `rbd_gateway_group_kill9_failback` (gw-failover.sh): an nvmfd gateway group
//!   (docs/GATEWAY-GROUPS.md) of three members, six namespaces on six images, six ANA
//!   groups, two homed on each member; under fio verify on all six, member a is killed
//!   with SIGKILL (its two groups move to the survivors after the lease, a fenced first)
//!   and restarted (they come back by planned failback); namespace 7 added over JSON-RPC
//!   on one member is served through all three (shared configuration); two members killed
//!   together (the third takes everything), then the Ceph monitor killed and restarted
//!   (nothing moves), then every member killed and started again at once from its file
//!   (all come back with namespace 7 and their home groups): 0 errors, 0 verify failures;
//!   then the rolling upgrade of docs/OPERATIONS.md: each member in turn stopped with
//!   SIGTERM (it hands its groups over before exiting) and started again, its groups back
//!   by failback, fio verify on all seven throughout and no I/O as long as the 5 s lease;
//!   the guest prints the times and fio's longest I/O. `NVMFD_GW_CYCLES=20` repeats the
//!   kill/failback of a 20 times and prints the distribution (BENCHMARKS.md).
//! * `rbd_gateway_group_faults` (gw-faults.sh): the same group of three, three namespaces,
//!   fio verify throughout: a member frozen with SIGSTOP (its group moves; resumed, it
//!   exits as fenced and fio still verifies), a member cut from the Ceph cluster but
//!   reachable (it runs in its own network namespace, whose link to the cluster goes down,
//!   reached by the guest through a relay on 127.0.0.1: its paths go
//!   inaccessible within its lease, a survivor takes over; healed, it exits as fenced), and
//!   Write Exclusive taken by the guest through the multipath head: a second host (this
//!   test's initiator) is refused by the owner and by the survivor after the owner's SIGKILL.
//! * `rbd_osd_restart_under_io` (rbd-osd-restart.sh): the cluster's only OSD stops under a
//!   fio verify loop (I/O stalls, no error) and starts again (I/O resumes, verify clean).
//!   One OSD with pool size 1 is what makes the outage total (every PG inactive), so this
//!   is a real stall, and bluestore on a file keeps every acknowledged write across the
//!   restart; with three replicas a stopped OSD would barely pause I/O.
//!
//! Opt-in with NVMFD_INTEROP=1, like kernel_host.rs; `NVMFD_SKIP_CEPH=1` skips them locally.
//! Each prints its wall time and the cluster's start-up time.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nvmf_interop::multipath::{
    kill9_failover, pause_ms, report_pause, MP_EUI64, MP_NGUID, MP_UUID,
};
use nvmf_interop::*;
use nvmf_testkit::ceph::{ceph_check, SKIP_SWITCH};
use nvmf_testkit::CephCluster;
use serde_json::{json, Value};

const GUEST_TIMEOUT: Duration = Duration::from_secs(300);
const NQN: &str = "nqn.2016-06.io.nvmfd:rbd1";
const POOL: &str = "rbd";

/// Starts an RBD interop test: the interop switch and lock ([`begin`]), then the shared
/// cluster (`None` when Ceph tests are skipped; a panic naming what is missing otherwise).
fn begin_rbd(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, &'static CephCluster)> {
    let guard = begin(test)?;
    match ceph_check() {
        Ok(true) => {}
        Ok(false) => {
            say(&format!("interop {test}: skipped ({SKIP_SWITCH}=1)"));
            return None;
        }
        Err(e) => panic!("interop {test}: {e}"),
    }
    static SAID: AtomicUsize = AtomicUsize::new(0);
    let c = CephCluster::shared();
    if SAID.fetch_add(1, Ordering::Relaxed) == 0 {
        say(&format!(
            "interop rbd: Ceph cluster started in {:.1} s ({})",
            c.start_time.as_secs_f64(),
            c.dir().display()
        ));
    }
    Some((guard, c))
}

/// A fresh image `<test>-<pid>` of `mib` MiB with only the layering feature (no
/// exclusive-lock: several gateways may write it).
fn image(c: &CephCluster, test: &str, mib: u64) -> String {
    let name = format!("{test}-{}", std::process::id());
    let _ = c.remove_image(POOL, &name);
    c.create_image(POOL, &name, mib, "layering")
        .unwrap_or_else(|e| panic!("{e}"));
    name
}

fn listen(port: u16) -> Value {
    listen_at("127.0.0.1", port)
}

fn listen_at(addr: &str, port: u16) -> Value {
    json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": addr, "trsvcid": port.to_string()})
}

/// How nvmfd reaches the cluster.
enum Access {
    /// `bdev_rbd_register_cluster` with the cluster's ceph.conf and keyring, the bdev
    /// naming it (`cluster_name`).
    Registered,
    /// The bdev's own `config` map: `mon_host` and `key` (no files).
    Inline,
}

/// The subsystem a gateway exports the image in.
struct Export {
    nqn: String,
    /// Namespace NGUID, EUI-64, UUID.
    ids: (String, String, String),
}

impl Export {
    /// Subsystem `NQN` with nvmf-interop's multipath namespace identity: every gateway
    /// exporting it looks like one subsystem to the host (native multipath).
    fn multipath() -> Export {
        Export {
            nqn: NQN.into(),
            ids: (MP_NGUID.into(), MP_EUI64.into(), MP_UUID.into()),
        }
    }

    /// Subsystem `NQN-<i>` with namespace identifiers of its own: a separate disk in the
    /// host (the kernel refuses one namespace identity in two subsystems).
    fn own(i: u8) -> Export {
        Export {
            nqn: format!("{NQN}-{i}"),
            ids: (
                format!("6e766d6664726264636f6865720000{i:02x}"),
                format!("6e766d66646372{i:02x}"),
                format!("6e766d66-6472-4264-8368-6572000000{i:02x}"),
            ),
        }
    }
}

/// nvmfd configuration: bdev `Rbd0` on `POOL/image`, subsystem `NQN` (the multipath
/// identity of nvmf-interop's gateways: same serial, model and namespace IDs everywhere;
/// controller IDs from `gateway*1000+1`) with namespace 1 on it, listeners (and discovery)
/// on `port`.
fn config(c: &CephCluster, access: Access, image: &str, port: u16, gateway: u16) -> Value {
    config_for(c, access, image, port, gateway, &Export::multipath())
}

/// [`config`] exporting the image as `export`.
fn config_for(
    c: &CephCluster,
    access: Access,
    image: &str,
    port: u16,
    gateway: u16,
    export: &Export,
) -> Value {
    let nqn = &export.nqn;
    let (nguid, eui64, uuid) = &export.ids;
    let mut bdevs = Vec::new();
    let mut create =
        json!({"name": "Rbd0", "pool_name": POOL, "rbd_name": image, "block_size": 512});
    match access {
        Access::Registered => {
            bdevs.push(json!({"method": "bdev_rbd_register_cluster", "params": {
                "name": "ceph0",
                "config_file": c.conf_path().to_string_lossy(),
                "key_file": c.keyring_path().to_string_lossy()}}));
            create["cluster_name"] = json!("ceph0");
        }
        Access::Inline => {
            let key = c.admin_key().unwrap_or_else(|e| panic!("{e}"));
            create["user_id"] = json!("admin");
            create["config"] = json!({"mon_host": c.mon_addr(), "key": key});
        }
    }
    bdevs.push(json!({"method": "bdev_rbd_create", "params": create}));
    json!({"subsystems": [
        {"subsystem": "bdev", "config": bdevs},
        {"subsystem": "nvmf", "config": [
            {"method": "nvmf_create_transport", "params": {"trtype": "TCP"}},
            {"method": "nvmf_create_subsystem", "params": {"nqn": nqn,
                "serial_number": "NVMFDRBD000001", "model_number": "nvmfd rbd",
                "allow_any_host": true, "min_cntlid": gateway * 1000 + 1,
                "max_cntlid": gateway * 1000 + 999}},
            {"method": "nvmf_subsystem_add_ns", "params": {"nqn": nqn, "namespace": {
                "bdev_name": "Rbd0", "nsid": 1, "nguid": nguid, "eui64": eui64,
                "uuid": uuid}}},
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": nqn, "listen_address": listen(port)}},
            {"method": "nvmf_subsystem_add_listener", "params": {
                "nqn": "nqn.2014-08.org.nvmexpress.discovery", "listen_address": listen(port)}},
        ]},
    ]})
}

fn guest_env(ports: &[u16], extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let mut env = vec![
        ("PORT", ports[0].clone()),
        ("PORTS", ports.join(" ")),
        ("NQN", NQN.to_string()),
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("HOSTID", HOST_ID.to_string()),
    ];
    env.extend(extra.iter().cloned());
    env
}

/// `sha256sum FILE`'s digest.
fn sha256_file(path: &Path) -> Result<String, String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .map_err(|e| format!("sha256sum: {e}"))?;
    if !out.status.success() {
        return Err(format!("sha256sum {} failed", path.display()));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// Checkpoint `compare` of rbd-io.sh: the image exported with `rbd export` must hash to the
/// guest's `sum` and hold the guest's dd pattern (`job/pattern.bin`) at `at_mb` MiB.
fn compare_export(c: &CephCluster, image: &str, dir: &Path, sum: &str, at_mb: usize) -> String {
    let export = dir.join("export.img");
    if let Err(e) = c.export_to(POOL, image, &export) {
        return format!("fail: {e}");
    }
    let check = || -> Result<String, String> {
        let got = sha256_file(&export)?;
        if got != sum {
            return Err(format!(
                "rbd export's sha256 is {got}, the host read {sum} through nvmfd"
            ));
        }
        let pattern = std::fs::read(dir.join("guest/pattern.bin")).map_err(|e| e.to_string())?;
        let bytes = std::fs::read(&export).map_err(|e| e.to_string())?;
        let at = at_mb << 20;
        let stored = bytes
            .get(at..at + pattern.len())
            .ok_or("export too short")?;
        if stored != pattern.as_slice() {
            let first = stored
                .iter()
                .zip(&pattern)
                .position(|(a, b)| a != b)
                .unwrap();
            return Err(format!(
                "the image differs from the host's dd pattern at byte {} of it",
                first
            ));
        }
        Ok(format!(
            "ok rbd export sha256 {got}; the {} MiB pattern is in the image",
            pattern.len() >> 20
        ))
    };
    let r = check().unwrap_or_else(|e| format!("fail: {e}"));
    let _ = std::fs::remove_file(&export);
    r
}

fn done(test: &str, t0: Instant) {
    say(&format!(
        "interop {test}: wall {:.1} s (cluster included when it started here)",
        t0.elapsed().as_secs_f64()
    ));
}

#[test]
fn rbd_fio_verify_and_export() {
    let test = "rbd_fio_verify_and_export";
    let t0 = Instant::now();
    let Some((_serial, c)) = begin_rbd(test) else {
        return;
    };
    let dir = work_dir(test);
    let (size_mb, at_mb) = (64u64, 48usize);
    let img = image(c, "io", size_mb);
    let port = free_port();
    let mut d = Nvmfd::start(&dir, &config(c, Access::Inline, &img, port, 0), port);
    let env = guest_env(
        &[port],
        &[
            ("SIZE_MB", size_mb.to_string()),
            ("FIO_MB", "16".into()),
            ("PATTERN_AT_MB", at_mb.to_string()),
            ("PATTERN_MB", "4".into()),
        ],
    );
    let run = run_guest(
        &dir,
        "rbd-io.sh",
        &[port],
        &env,
        GUEST_TIMEOUT,
        |cp, detail| match cp {
            "compare" => compare_export(c, &img, &dir, detail, at_mb),
            other => format!("fail: unknown checkpoint {other}"),
        },
    );
    finish(test, &run, &mut d, &[]);
    drop(d);
    let _ = c.remove_image(POOL, &img);
    done(test, t0);
}

#[test]
fn rbd_resize_seen_by_host() {
    let test = "rbd_resize_seen_by_host";
    let t0 = Instant::now();
    let Some((_serial, c)) = begin_rbd(test) else {
        return;
    };
    let dir = work_dir(test);
    let sizes = [64u64, 96, 128];
    let img = image(c, "resize", sizes[0]);
    let port = free_port();
    let mut d = Nvmfd::start(&dir, &config(c, Access::Registered, &img, port, 0), port);
    let env = guest_env(
        &[port],
        &[(
            "SIZES_MB",
            sizes
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        )],
    );
    let run = run_guest(
        &dir,
        "rbd-resize.sh",
        &[port],
        &env,
        GUEST_TIMEOUT,
        |cp, detail| match cp {
            "grow-rpc" => match d.rpc(&["bdev_rbd_resize", "Rbd0", detail]) {
                Ok(_) => format!("ok bdev_rbd_resize Rbd0 {detail}"),
                Err(e) => format!("fail: bdev_rbd_resize: {e}"),
            },
            "grow-cli" => match detail.parse() {
                Ok(mb) => match c.resize_image(POOL, &img, mb) {
                    Ok(()) => format!("ok rbd resize to {mb} MiB"),
                    Err(e) => format!("fail: {e}"),
                },
                Err(_) => format!("fail: bad size {detail}"),
            },
            other => format!("fail: unknown checkpoint {other}"),
        },
    );
    let mut failures = Vec::new();
    match c.image_size(POOL, &img) {
        Ok(b) if b == sizes[2] << 20 => {}
        other => failures.push(format!("image size at the end: {other:?}")),
    }
    finish(test, &run, &mut d, &failures);
    drop(d);
    let _ = c.remove_image(POOL, &img);
    done(test, t0);
}

#[test]
fn rbd_two_gateways_kill9() {
    let test = "rbd_two_gateways_kill9";
    let t0 = Instant::now();
    let Some((_serial, c)) = begin_rbd(test) else {
        return;
    };
    let dir = work_dir(test);
    let img = image(c, "mp", 64);
    let (pa, pb) = (free_port(), free_port());
    let cfg_a = config(c, Access::Registered, &img, pa, 0);
    let cfg_b = config(c, Access::Registered, &img, pb, 1);
    let gw_dir = |name: &str| {
        let p = dir.join(name);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let mut a = Nvmfd::start(&gw_dir("gwa-0"), &cfg_a, pa);
    let mut b = Some(Nvmfd::start(&gw_dir("gwb-0"), &cfg_b, pb));
    let env = guest_env(&[pa, pb], &[]);
    let run = kill9_failover(&dir, &[pa, pb], &env, GUEST_TIMEOUT, &mut b, || {
        Nvmfd::start(&gw_dir("gwb-1"), &cfg_b, pb)
    });
    let mut failures = Vec::new();
    report_pause(test, &run, &mut failures);
    if let Some(d) = b.as_mut() {
        if let Err(e) = d.health() {
            failures.push(format!("restarted gateway b: {e}"));
        }
    }
    finish(test, &run, &mut a, &failures);
    drop(a);
    drop(b);
    let _ = c.remove_image(POOL, &img);
    done(test, t0);
}

#[test]
fn rbd_two_gateways_coherent() {
    let test = "rbd_two_gateways_coherent";
    let t0 = Instant::now();
    let Some((_serial, c)) = begin_rbd(test) else {
        return;
    };
    let dir = work_dir(test);
    let img = image(c, "coh", 16);
    let (pa, pb) = (free_port(), free_port());
    let (ea, eb) = (Export::own(1), Export::own(2));
    let gw = |name: &str, port: u16, index: u16, e: &Export| {
        let p = dir.join(name);
        std::fs::create_dir_all(&p).unwrap();
        Nvmfd::start(
            &p,
            &config_for(c, Access::Registered, &img, port, index, e),
            port,
        )
    };
    let mut a = gw("gwa", pa, 0, &ea);
    let mut b = gw("gwb", pb, 1, &eb);
    let env = guest_env(
        &[pa, pb],
        &[
            ("NQNS", format!("{} {}", ea.nqn, eb.nqn)),
            ("ROUNDS", "3".into()),
        ],
    );
    let run = run_guest(
        &dir,
        "rbd-coherence.sh",
        &[pa, pb],
        &env,
        GUEST_TIMEOUT,
        |cp, _| format!("fail: unknown checkpoint {cp}"),
    );
    let mut failures = Vec::new();
    if let Err(e) = b.health() {
        failures.push(format!("gateway b: {e}"));
    }
    finish(test, &run, &mut a, &failures);
    drop(a);
    drop(b);
    let _ = c.remove_image(POOL, &img);
    done(test, t0);
}

#[test]
fn rbd_osd_restart_under_io() {
    let test = "rbd_osd_restart_under_io";
    let t0 = Instant::now();
    let Some((_serial, c)) = begin_rbd(test) else {
        return;
    };
    let dir = work_dir(test);
    let img = image(c, "osd", 64);
    let port = free_port();
    let mut d = Nvmfd::start(&dir, &config(c, Access::Registered, &img, port, 0), port);
    let env = guest_env(&[port], &[("STALL_S", "3".into())]);
    let mut outage = None;
    let run = run_guest(
        &dir,
        "rbd-osd-restart.sh",
        &[port],
        &env,
        GUEST_TIMEOUT,
        |cp, _| match cp {
            "osd-stop" => match c.stop_osd(0) {
                Ok(()) => {
                    outage = Some(Instant::now());
                    "ok osd.0 stopped".into()
                }
                Err(e) => format!("fail: {e}"),
            },
            "osd-start" => match c.start_osd(0) {
                Ok(()) => format!(
                    "ok osd.0 up again, {:.1} s after it stopped",
                    outage.map_or(0.0, |t| t.elapsed().as_secs_f64())
                ),
                Err(e) => format!("fail: {e}"),
            },
            other => format!("fail: unknown checkpoint {other}"),
        },
    );
    let mut failures = Vec::new();
    match pause_ms(&run.stdout) {
        Some(ms) => say(&format!(
            "interop {test}: pause_ms={ms:.0} (longest fio I/O: the stall)"
        )),
        None => failures.push("the guest printed no PAUSE_MS= line".into()),
    }
    if !c.osd_running(0) {
        failures.push("osd.0 is not running at the end".into());
    }
    finish(test, &run, &mut d, &failures);
    drop(d);
    let _ = c.remove_image(POOL, &img);
    done(test, t0);
}

/// A gateway group member's configuration: namespaces 1..=N on `images`, namespace i in
/// ANA group i, the multipath identity shared by all members (serial, model, NGUID/UUID
/// per namespace), controller IDs from `gateway*1000+1`.
fn group_config(c: &CephCluster, images: &[String], port: u16, gateway: u16) -> Value {
    group_config_at(c, images, "127.0.0.1", port, gateway)
}

/// [`group_config`] with the listener on `addr` (a member in a network namespace).
fn group_config_at(
    c: &CephCluster,
    images: &[String],
    addr: &str,
    port: u16,
    gateway: u16,
) -> Value {
    let reg = json!({
        "name": "ceph0",
        "config_file": c.conf_path().to_string_lossy(),
        "key_file": c.keyring_path().to_string_lossy()});
    let mut bdevs = vec![json!({"method": "bdev_rbd_register_cluster", "params": reg})];
    let mut nvmf = vec![
        json!({"method": "nvmf_create_transport", "params": {"trtype": "TCP"}}),
        json!({"method": "nvmf_create_subsystem", "params": {"nqn": NQN,
            "serial_number": "NVMFDGROUP0001", "model_number": "nvmfd group",
            "allow_any_host": true, "ana_reporting": true, "max_namespaces": 8,
            "min_cntlid": gateway * 1000 + 1, "max_cntlid": gateway * 1000 + 999}}),
    ];
    for (i, img) in images.iter().enumerate() {
        let n = i + 1;
        bdevs.push(
            json!({"method": "bdev_rbd_create", "params": {"name": format!("Rbd{n}"),
            "pool_name": POOL, "rbd_name": img, "block_size": 512, "cluster_name": "ceph0"}}),
        );
        nvmf.push(
            json!({"method": "nvmf_subsystem_add_ns", "params": {"nqn": NQN, "namespace": {
            "bdev_name": format!("Rbd{n}"), "nsid": n, "anagrpid": n,
            "nguid": format!("6e766d666467726f7570000000000{n:03x}"),
            "uuid": format!("6e766d66-6467-4072-8f75-7000000000{n:02x}")}}}),
        );
    }
    nvmf.push(json!({"method": "nvmf_subsystem_add_listener", "params": {"nqn": NQN, "listen_address": listen_at(addr, port)}}));
    json!({"subsystems": [
        {"subsystem": "bdev", "config": bdevs},
        {"subsystem": "nvmf", "config": nvmf},
    ]})
}

#[test]
fn rbd_gateway_group_kill9_failback() {
    let test = "rbd_gateway_group_kill9_failback";
    let t0 = Instant::now();
    let Some((_serial, c)) = begin_rbd(test) else {
        return;
    };
    let dir = work_dir(test);
    // Six images served from the start; the seventh is added over JSON-RPC mid-run.
    let images: Vec<String> = (1..=7).map(|i| image(c, &format!("grp{i}"), 32)).collect();
    let group = format!("interop-{}", std::process::id());
    let ports = [free_port(), free_port(), free_port()];
    let start = |i: usize, run: u32| {
        let id = ["a", "b", "c"][i];
        let p = dir.join(format!("gw{id}-{run}"));
        std::fs::create_dir_all(&p).unwrap();
        let home = format!("{},{}", i + 1, i + 4);
        Nvmfd::start_with(
            &p,
            &group_config(c, &images[..6], ports[i], i as u16),
            ports[i],
            &[
                "--gateway-group",
                &group,
                "--gateway-id",
                id,
                "--group-cluster",
                "ceph0",
                "--group-pool",
                POOL,
                "--group-lease-ms",
                "5000",
                "--gateway-ana-groups",
                &home,
            ],
        )
    };
    let mut a = Some(start(0, 0));
    let mut b = start(1, 0);
    let mut cm = start(2, 0);
    let mut runs = 0u32;
    // NVMFD_GW_CYCLES=N: the kill/failback cycle N times (default 1; 20 for BENCHMARKS.md).
    let cycles: u32 = std::env::var("NVMFD_GW_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .clamp(1, 100);
    let env = guest_env(&ports, &[("GW_CYCLES", cycles.to_string())]);
    // Ten steps with fio verifying on six namespaces throughout, under emulation: 191 s on a
    // slow machine of this kind (2026-11-29: guest boot 7.3 s against 4.6-5.6 s elsewhere),
    // since mp-lib.sh reads sysfs without forking (before: 741-860 s there, most of it in the
    // guest's ANA polls). Bounded with room for a slower machine; a cycle adds 45 s.
    let limit = Duration::from_secs(480) + Duration::from_secs(45) * cycles;
    let run = run_guest(
        &dir,
        "gw-failover.sh",
        &ports,
        &env,
        limit,
        // "kill-a.N", "restart-a.N": cycle N (a checkpoint name is answered once).
        |cp, _| match cp.split('.').next().unwrap_or(cp) {
            "kill-a" => {
                if let Some(d) = a.as_mut() {
                    d.kill_hard();
                }
                "ok member a killed (SIGKILL)".into()
            }
            "restart-a" => {
                runs += 1;
                a = Some(start(0, runs));
                "ok member a restarted".into()
            }
            "restart-all" => {
                if let Some(d) = a.as_mut() {
                    d.kill_hard();
                }
                runs += 1;
                // Started one right after the other, each from its own file (without
                // namespace 7), from this thread: a child started by a thread that then
                // ends gets SIGTERM (the "dies with its parent" signal is per thread).
                a = Some(start(0, runs));
                b = start(1, runs);
                cm = start(2, runs);
                "ok members a, b and c killed and started again together".into()
            }
            "add-ns7" => {
                let steps: [&[&str]; 2] = [
                    &[
                        "bdev_rbd_create",
                        "-b",
                        "Rbd7",
                        "-c",
                        "ceph0",
                        POOL,
                        &images[6],
                        "512",
                    ],
                    &[
                        "nvmf_subsystem_add_ns",
                        NQN,
                        "Rbd7",
                        "-n",
                        "7",
                        "-a",
                        "7",
                        "-g",
                        "6e766d666467726f7570000000000007",
                        "-u",
                        "6e766d66-6467-4072-8f75-700000000007",
                    ],
                ];
                for args in steps {
                    if let Err(e) = b.rpc(args) {
                        return format!("fail: nvmf rpc {args:?} on b: {e}");
                    }
                }
                "ok namespace 7 added on member b".into()
            }
            "kill-bc" => {
                b.kill_hard();
                cm.kill_hard();
                "ok members b and c killed (SIGKILL)".into()
            }
            "restart-mon" => match c.restart_mon(true) {
                Ok(()) => "ok monitor killed and restarted".into(),
                Err(e) => format!("fail: {e}"),
            },
            // The rolling upgrade: stopped as `systemctl stop` does (SIGTERM; the member
            // hands its groups over before it exits), then started again.
            up @ ("upgrade-a" | "upgrade-b" | "upgrade-c") => {
                let i = match up {
                    "upgrade-a" => 0,
                    "upgrade-b" => 1,
                    _ => 2,
                };
                let m = match i {
                    0 => match a.as_mut() {
                        Some(m) => m,
                        None => return "fail: member a is not running".into(),
                    },
                    1 => &mut b,
                    _ => &mut cm,
                };
                let t = std::time::Instant::now();
                m.signal(libc::SIGTERM);
                match m.wait_exit(Duration::from_secs(30)) {
                    Some(st) if st.success() => {}
                    Some(st) => return format!("fail: {up}: exited with {st} on SIGTERM"),
                    None => return format!("fail: {up}: still running 30 s after SIGTERM"),
                }
                let stopped = t.elapsed();
                runs += 1;
                let new = start(i, runs);
                match i {
                    0 => a = Some(new),
                    1 => b = new,
                    _ => cm = new,
                }
                format!(
                    "ok {up}: stopped in {:.2} s (groups handed over), started again",
                    stopped.as_secs_f64()
                )
            }
            other => format!("fail: unknown checkpoint {other}"),
        },
    );
    let mut failures = Vec::new();
    report_pause(test, &run, &mut failures);
    for key in [
        "NEWNS_S=",
        "TWO_KILLED_S=",
        "RESTART_ALL_S=",
        "IO_PAUSES_MS=",
        "UPGRADE_S[a]=",
        "UPGRADE_S[b]=",
        "UPGRADE_S[c]=",
        "UPGRADE_PAUSE_MS=",
        "UPGRADE_IO_PAUSES_MS=",
    ] {
        if let Some(l) = run.stdout.lines().find(|l| l.trim().starts_with(key)) {
            say(&format!("interop {test}: {}", l.trim()));
        }
    }
    for key in ["TAKEOVER_S", "FAILBACK_S"] {
        let mut v: Vec<f64> = run
            .stdout
            .lines()
            .filter_map(|l| l.trim().strip_prefix(key)?.split_once("]=")?.1.parse().ok())
            .collect();
        if v.is_empty() {
            continue;
        }
        v.sort_by(f64::total_cmp);
        let all: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
        say(&format!(
            "interop {test}: {key} n={} median={:.2} max={:.2} (sorted: {})",
            v.len(),
            v[v.len() / 2],
            v[v.len() - 1],
            all.join(" ")
        ));
    }
    for (name, d) in [("b", &b), ("c", &cm)] {
        if let Some(l) = d.log().lines().find(|l| l.contains("panicked at")) {
            failures.push(format!("member {name} panicked: {l}"));
        }
    }
    // Every run of b and c (they were restarted since the kill of a): one fenced a.
    let fenced = (0..=runs).any(|r| {
        ["b", "c"].iter().any(|id| {
            std::fs::read_to_string(dir.join(format!("gw{id}-{r}")).join("nvmfd.log"))
                .is_ok_and(|l| l.contains("fenced (blocklisted"))
        })
    });
    if !fenced {
        failures.push("no survivor logged fencing a".into());
    }
    let mut a = a.expect("member a");
    finish(test, &run, &mut a, &failures);
    drop((a, b, cm));
    for i in &images {
        let _ = c.remove_image(POOL, i);
    }
    done(test, t0);
}

/// A write of one block to namespace 3 through `port` by the second host (its own host NQN
/// and ID); the status, or an error when it cannot connect.
fn second_host_write(port: u16) -> Result<nvmf_wire::status::Status, String> {
    use nvmf_host::controller::{ConnectOptions, Controller};
    use nvmf_host::trid::TransportId;
    let mut o = ConnectOptions::new(TransportId::tcp("127.0.0.1", &port.to_string(), NQN));
    o.hostnqn = "nqn.2014-08.org.nvmexpress:uuid:77777777-7777-4777-8777-777777777777".into();
    o.hostid = [0x77; 16];
    let ctrl = Controller::connect(&o).map_err(|e| e.to_string())?;
    ctrl.set_num_queues(1).map_err(|e| e.to_string())?;
    let mut q = ctrl
        .create_io_queue(1, 4, 4096)
        .map_err(|e| e.to_string())?;
    let slot = q.alloc().ok_or("no slot")?;
    let mut c = nvmf_wire::command::Command::new(nvmf_wire::opcode::IoOpcode::Write as u8, 0);
    c.set_nsid(3).set_lba_range(64, 1);
    q.buf_mut(slot)[..512].fill(0x59);
    let r = q
        .execute(slot, c, 512, Duration::from_secs(20))
        .map_err(|e| e.to_string())?;
    Ok(r.status)
}

#[test]
fn rbd_gateway_group_faults() {
    let test = "rbd_gateway_group_faults";
    let t0 = Instant::now();
    let Some((_serial, c)) = begin_rbd(test) else {
        return;
    };
    let dir = work_dir(test);
    let images: Vec<String> = (1..=3).map(|i| image(c, &format!("gf{i}"), 32)).collect();
    let group = format!("faults-{}", std::process::id());
    let ports = [free_port(), free_port(), free_port()];
    // b runs in its own network namespace: its link to the cluster (127.0.0.1) is what
    // "cut-b" takes down. Its listener is on the namespace's address; a relay on
    // 127.0.0.1 gives the guest (whose forwarded ports lead to 127.0.0.1) the same path to
    // it as to the others.
    let net_b = nvmf_testkit::CuttableNetns::new()
        .unwrap_or_else(|e| panic!("a network namespace for member b: {e}"));
    let _relay_b = nvmf_testkit::Process::spawn(Command::new("socat").args([
        format!("TCP4-LISTEN:{},bind=127.0.0.1,reuseaddr,fork", ports[1]),
        format!("TCP4:{}:{}", net_b.addr(), ports[1]),
    ]));
    let start = |i: usize, run: u32| {
        let id = ["a", "b", "c"][i];
        let p = dir.join(format!("gw{id}-{run}"));
        std::fs::create_dir_all(&p).unwrap();
        let home = (i + 1).to_string();
        let (addr, ns) = if i == 1 {
            (net_b.addr(), Some(net_b.name()))
        } else {
            ("127.0.0.1", None)
        };
        Nvmfd::start_in(
            &p,
            &group_config_at(c, &images, addr, ports[i], i as u16),
            ports[i],
            &[
                "--gateway-group",
                &group,
                "--gateway-id",
                id,
                "--group-cluster",
                "ceph0",
                "--group-pool",
                POOL,
                "--group-lease-ms",
                "5000",
                "--gateway-ana-groups",
                &home,
            ],
            ns,
        )
    };
    let mut ms: Vec<Option<Nvmfd>> = (0..3).map(|i| Some(start(i, 0))).collect();
    let mut runs = [0u32; 3];
    let conflict = nvmf_wire::status::Status::RESERVATION_CONFLICT.with_dnr();
    let env = guest_env(&ports, &[]);
    let run = run_guest(
        &dir,
        "gw-faults.sh",
        &ports,
        &env,
        Duration::from_secs(600),
        |cp, _| {
            fn fenced_exit(m: &mut Option<Nvmfd>, i: usize, limit: Duration) -> String {
                let Some(d) = m.as_mut() else {
                    return "fail: no such member".into();
                };
                match d.wait_exit(limit).and_then(|s| s.code()) {
                    Some(3) => format!("ok member {i} exited with status 3 (fenced)"),
                    other => format!(
                        "fail: member {i} did not exit as fenced ({other:?}): {}",
                        d.log_tail(20)
                    ),
                }
            }
            match cp {
                "freeze-a" => {
                    ms[0].as_mut().unwrap().signal(libc::SIGSTOP);
                    "ok a frozen (SIGSTOP)".into()
                }
                "resume-a" => {
                    ms[0].as_mut().unwrap().signal(libc::SIGCONT);
                    fenced_exit(&mut ms[0], 0, Duration::from_secs(60))
                }
                "restart-a" => {
                    runs[0] += 1;
                    ms[0] = Some(start(0, runs[0]));
                    "ok a restarted".into()
                }
                "cut-b" => match net_b.cut(true) {
                    Ok(()) => "ok b cut from the cluster (its link to it is down)".into(),
                    Err(e) => format!("fail: {e}"),
                },
                "heal-b" => {
                    if let Err(e) = net_b.cut(false) {
                        return format!("fail: {e}");
                    }
                    let said = fenced_exit(&mut ms[1], 1, Duration::from_secs(90));
                    if !said.starts_with("ok") {
                        return said;
                    }
                    runs[1] += 1;
                    ms[1] = Some(start(1, runs[1]));
                    format!("{said}; restarted")
                }
                "kill-c" => {
                    ms[2].as_mut().unwrap().kill_hard();
                    ms[2] = None;
                    "ok c killed (SIGKILL)".into()
                }
                "y-conflicts" | "y-writes" => {
                    let want = if cp == "y-conflicts" {
                        conflict
                    } else {
                        nvmf_wire::status::Status::SUCCESS
                    };
                    let mut seen = Vec::new();
                    for (i, m) in ms.iter().enumerate() {
                        if m.is_none() {
                            continue;
                        }
                        match second_host_write(ports[i]) {
                            Ok(st) => seen.push(st),
                            Err(e) => return format!("fail: second host through member {i}: {e}"),
                        }
                    }
                    let owner = seen.iter().filter(|s| **s == want).count();
                    let inaccessible = seen.iter().filter(|s| s.sct == 3 && s.sc == 2).count();
                    if owner == 1 && inaccessible == seen.len() - 1 {
                        format!(
                            "ok the owner answered {}, the others ANA Inaccessible",
                            want.name()
                        )
                    } else {
                        format!("fail: second host's writes: {seen:?}")
                    }
                }
                other => format!("fail: unknown checkpoint {other}"),
            }
        },
    );
    let mut failures = Vec::new();
    report_pause(test, &run, &mut failures);
    for key in ["FROZEN_TAKEOVER_S=", "CUT_FENCED_S=", "CUT_TAKEOVER_S="] {
        if let Some(l) = run.stdout.lines().find(|l| l.trim().starts_with(key)) {
            say(&format!("interop {test}: {}", l.trim()));
        }
    }
    let mut a = ms[0].take().expect("member a");
    finish(test, &run, &mut a, &failures);
    drop((a, ms));
    for i in &images {
        let _ = c.remove_image(POOL, i);
    }
    done(test, t0);
}
