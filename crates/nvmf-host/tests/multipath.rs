//! Multipath tests of `nvmf perf` against the real `nvmfd` binary: one
//! daemon with one subsystem on two listeners (two ports), and two daemons
//! (gateways) exporting one subsystem over one shared file. A path is taken
//! away mid-run — its listener removed over RPC, or its gateway killed with
//! SIGKILL — and the `--verify` run must end with exit 0, no error, no
//! mismatch, I/O on both paths before the loss and only on the survivor
//! after it. With ANA reporting, a listener set inaccessible mid-run moves
//! the I/O to the other path without an error; with `--reconnect` a killed
//! gateway that is restarted is connected again and used; a gateway frozen
//! with SIGSTOP (connections open, nothing answered) is found by its failing
//! keep-alive and its commands move to the other; once resumed it must not
//! land a stale write (`frozen_gateway_resumed_lands_no_stale_write`,
//! ignored: it does today, until issue 25). Paths are taken away once both
//! carry I/O by the targets' per-path counters, not after a fixed sleep. Also: paths found through the discovery service, a path set
//! naming two subsystems refused, and a clear failure when every path goes.
//!
//! Every child process is killed on drop and every wait is bounded. The
//! daemons are nvmf-testkit's (nvmfd built on demand if missing).

use nvmf_testkit::process::{spawn_nvmf, wait_bounded};
use nvmf_testkit::{free_port, text, trid, TestDir};
use serde_json::Value;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.nvmfd:mpath-test";
const OTHER: &str = "nqn.2024-01.io.nvmfd:mpath-other";

fn listener(nqn: &str, port: u16) -> String {
    format!(
        r#"{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{nqn}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}"#
    )
}

/// A config: `bdev` (one bdev method object named B0), subsystem NQN with
/// namespace B0 on `ports`, optionally the discovery service on the first
/// port and a second subsystem OTHER on it.
fn config(bdev: &str, ports: &[u16], discovery: bool) -> String {
    config_with(bdev, ports, discovery, false)
}

/// `config` with ANA reporting on or off.
fn config_with(bdev: &str, ports: &[u16], discovery: bool, ana: bool) -> String {
    let mut nvmf = vec![
        r#"{"method":"nvmf_create_transport","params":{"trtype":"TCP","max_queue_depth":128,"max_io_qpairs_per_ctrlr":8}}"#.to_string(),
        format!(r#"{{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true,"ana_reporting":{ana},"serial_number":"MPATH0001","model_number":"nvmf-host multipath"}}}}"#),
        format!(r#"{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"B0"}}}}}}"#),
    ];
    for &p in ports {
        nvmf.push(listener(NQN, p));
    }
    let mut bdevs = vec![bdev.to_string()];
    if discovery {
        bdevs.push(r#"{"method":"bdev_malloc_create","params":{"name":"B1","block_size":512,"num_blocks":2048}}"#.into());
        nvmf.push(format!(r#"{{"method":"nvmf_create_subsystem","params":{{"nqn":"{OTHER}","allow_any_host":true}}}}"#));
        nvmf.push(format!(r#"{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{OTHER}","namespace":{{"nsid":1,"bdev_name":"B1"}}}}}}"#));
        nvmf.push(listener(OTHER, ports[0]));
        nvmf.push(listener("nqn.2014-08.org.nvmexpress.discovery", ports[0]));
    }
    format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[{}]}},{{"subsystem":"nvmf","config":[{}]}}]}}"#,
        bdevs.join(","),
        nvmf.join(",")
    )
}

fn malloc_bdev() -> String {
    r#"{"method":"bdev_malloc_create","params":{"name":"B0","block_size":512,"num_blocks":65536}}"#
        .into()
}

/// A running nvmfd (nvmf-testkit's), killed on drop (config and socket
/// removed), ready once listening on `ports`.
struct Daemon(nvmf_testkit::Daemon);

impl Daemon {
    fn start(config: &str, ports: &[u16]) -> Daemon {
        Daemon(
            nvmf_testkit::Daemon::builder(config)
                .args(["-m", "0"])
                .listening(ports)
                .ready_within(Duration::from_secs(15))
                .start(),
        )
    }

    fn rpc(&self, args: &[&str]) {
        self.0.rpc_ok(args);
    }

    fn kill9(&mut self) {
        self.0.kill(); // SIGKILL
    }
}

/// Wait for `child` (killed after `limit`, then the test fails).
fn nvmf_wait(child: Child, limit: Duration, args: &[&str]) -> Output {
    wait_bounded(child, limit, &format!("nvmf {args:?}"))
}

/// I/Os (reads + writes) `d` has served through its listener on `port`.
fn ios_on(d: &Daemon, port: u16) -> u64 {
    let out = d.0.rpc_ok(&["nvmf_get_path_stats"]);
    let v: Value = serde_json::from_str(&out).expect("nvmf_get_path_stats JSON");
    let l = format!("127.0.0.1:{port}");
    v["paths"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["listener"] == l.as_str())
        .map(|p| p["reads"].as_u64().unwrap_or(0) + p["writes"].as_u64().unwrap_or(0))
        .sum()
}

/// Waits until both paths carry I/O (over 100 I/Os each as the target
/// counts them: `ds[i]` serves `ports[i]`), instead of a fixed sleep before
/// a path is taken away; fails after 20 s.
fn wait_io_on_both(ds: [&Daemon; 2], ports: [u16; 2]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = [ios_on(ds[0], ports[0]), ios_on(ds[1], ports[1])];
        if n.iter().all(|&x| x > 100) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no I/O on both paths within 20 s: {n:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A perf run that must have ended well: exit 0, no I/O error, no verify
/// mismatch. Its JSON and stdout.
fn clean_run(out: &Output) -> (Value, String) {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "nvmf perf failed\n{stdout}\n{}",
        text(&out.stderr)
    );
    let v: Value = serde_json::from_str(&stdout).expect("JSON output");
    assert_eq!(v["total"]["error"], 0, "{stdout}");
    assert_eq!(v["verify"]["mismatched_blocks"], 0, "{stdout}");
    (v, stdout)
}

fn perf_args<'a>(trids: &'a [String], secs: &'a str) -> Vec<&'a str> {
    let mut a = vec!["perf"];
    for t in trids {
        a.extend(["-r", t.as_str()]);
    }
    a.extend([
        "-w", "randrw", "-o", "4096", "-q", "16", "--queues", "2", "-t", secs, "--verify", "--json",
    ]);
    a
}

/// A two-path verify perf run for 6 s, started at `t0`.
struct CutRun {
    child: Child,
    trids: [String; 2],
    t0: Instant,
}

/// Starts a two-path verify perf run for 6 s on `ports`.
fn start_two_paths(ports: [u16; 2]) -> CutRun {
    let trids = [trid(ports[0], NQN), trid(ports[1], NQN)];
    let t0 = Instant::now();
    let child = spawn_nvmf(&perf_args(&trids, "6"));
    CutRun { child, trids, t0 }
}

/// Checks the report of a run whose path 0 was taken away `cut_at` after
/// it started (perf's own clock starts later, so its times are no later):
/// exit 0, no error or mismatch, both paths used before the cut, path 0
/// lost within 3 s of the cut and unused after it, path 1 carrying I/O to
/// the end.
fn check_cut(run: CutRun, cut_at: f64) -> Value {
    let args = perf_args(&run.trids, "6");
    let out = nvmf_wait(run.child, Duration::from_secs(120), &args);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "nvmf perf failed over two paths\n{stdout}\n{stderr}"
    );
    let v: Value = serde_json::from_str(&stdout).expect("JSON output");
    assert_eq!(v["verify"]["mismatched_blocks"], 0, "{stdout}");
    assert!(v["verify"]["blocks_checked"].as_u64().unwrap() > 0);
    assert_eq!(v["total"]["error"], 0, "{stdout}");
    let p = v["paths"].as_array().expect("paths[]");
    assert_eq!(p.len(), 2, "{stdout}");
    let f = |k: usize, key: &str| {
        p[k][key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {stdout}"))
    };
    let lost_at = f(0, "failed_at_s");
    assert!(
        p[0]["failure"].is_string(),
        "path 0 not reported lost: {stdout}"
    );
    assert!(
        p[1]["failure"].is_null(),
        "survivor reported lost: {stdout}"
    );
    assert_eq!(p[1]["state"], "optimized");
    assert!(
        lost_at > 0.0 && lost_at < cut_at + 3.0,
        "lost at {lost_at}, cut at {cut_at:.2}: {stdout}"
    );
    // Both paths carried I/O before the loss...
    assert!(p[0]["total_ios"].as_u64().unwrap() > 100, "{stdout}");
    assert!(f(1, "first_io_s") < lost_at, "{stdout}");
    // ... path 0 none after it, the survivor to the end.
    assert!(f(0, "last_io_s") <= lost_at + 0.05, "{stdout}");
    assert!(f(1, "last_io_s") > lost_at + 2.0, "{stdout}");
    // Every command moved off path 0 was re-issued (on path 1).
    let moved = p[0]["failed_over"].as_u64().unwrap();
    assert_eq!(p[1]["retried"].as_u64().unwrap(), moved, "{stdout}");
    eprintln!(
        "path 0: {} I/Os, lost at {lost_at:.2} s, {moved} command(s) failed over; path 1: {} I/Os",
        p[0]["total_ios"], p[1]["total_ios"]
    );
    v
}

#[test]
fn two_listeners_one_removed_mid_run() {
    let ports = [free_port(), free_port()];
    let d = Daemon::start(&config(&malloc_bdev(), &ports, false), &ports);
    let port0 = ports[0].to_string();
    let run = start_two_paths(ports);
    wait_io_on_both([&d, &d], ports);
    let cut_at = run.t0.elapsed().as_secs_f64();
    d.rpc(&[
        "nvmf_subsystem_remove_listener",
        NQN,
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &port0,
    ]);
    check_cut(run, cut_at);
}

/// Two gateways, one listener each, exporting one 32 MiB file `dir/name`
/// (`bdev_aio_create`): (the bdev config entry, their ports, the gateways).
fn shared_gateways(dir: &TestDir, name: &str) -> (String, [u16; 2], Daemon, Daemon) {
    let img = dir.join(name);
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let bdev = format!(
        r#"{{"method":"bdev_aio_create","params":{{"name":"B0","filename":"{}","block_size":512}}}}"#,
        img.display()
    );
    let ports = [free_port(), free_port()];
    let g0 = Daemon::start(&config(&bdev, &ports[..1], false), &ports[..1]);
    let g1 = Daemon::start(&config(&bdev, &ports[1..], false), &ports[1..]);
    (bdev, ports, g0, g1)
}

#[test]
fn two_gateways_on_one_file_one_killed_mid_run() {
    let dir = TestDir::new("mpath");
    let (_, ports, mut g0, g1) = shared_gateways(&dir, "shared.img");
    let run = start_two_paths(ports);
    wait_io_on_both([&g0, &g1], ports);
    let cut_at = run.t0.elapsed().as_secs_f64();
    g0.kill9();
    check_cut(run, cut_at);
    drop(g1);
}

#[test]
fn every_path_lost_is_a_clear_failure() {
    let ports = [free_port(), free_port()];
    let d = Daemon::start(&config(&malloc_bdev(), &ports, false), &ports);
    let trids = [trid(ports[0], NQN), trid(ports[1], NQN)];
    let args = perf_args(&trids, "6");
    let child = spawn_nvmf(&args);
    wait_io_on_both([&d, &d], ports);
    for p in ports {
        d.rpc(&[
            "nvmf_subsystem_remove_listener",
            NQN,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &p.to_string(),
        ]);
    }
    let out = nvmf_wait(child, Duration::from_secs(60), &args);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains("no usable path left"), "{all}");
}

#[test]
fn paths_from_the_discovery_service_and_mixed_subsystems_refused() {
    let ports = [free_port(), free_port()];
    let d = Daemon::start(&config(&malloc_bdev(), &ports, true), &ports);
    // The discovery service on port 0 lists NQN on both ports (and OTHER).
    let disc = format!("traddr:127.0.0.1 trsvcid:{} subnqn:{NQN}", ports[0]);
    let args = [
        "perf",
        "-r",
        &disc,
        "--discover-paths",
        "-w",
        "randrw",
        "-q",
        "8",
        "-t",
        "1",
        "--verify",
        "--json",
        "--policy",
        "queue-depth",
    ];
    let out = nvmf_wait(spawn_nvmf(&args), Duration::from_secs(60), &args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let v: Value = serde_json::from_str(&stdout).expect("JSON output");
    assert_eq!(v["policy"], "queue-depth");
    let p = v["paths"].as_array().unwrap();
    let names: Vec<_> = p.iter().map(|x| x["path"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            format!("127.0.0.1:{}", ports[0]),
            format!("127.0.0.1:{}", ports[1])
        ],
        "{stdout}"
    );
    for x in p {
        assert!(x["total_ios"].as_u64().unwrap() > 0, "{stdout}");
    }
    assert_eq!(v["verify"]["mismatched_blocks"], 0);

    let (a, b) = (trid(ports[0], NQN), trid(ports[0], OTHER));
    let args = ["perf", "-r", &a, "-r", &b, "-t", "1"];
    let out = nvmf_wait(spawn_nvmf(&args), Duration::from_secs(30), &args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("one subsystem") && err.contains(OTHER),
        "{err}"
    );
    drop(d);
}

#[test]
fn listener_set_inaccessible_mid_run_moves_io_without_errors() {
    let ports = [free_port(), free_port()];
    let d = Daemon::start(&config_with(&malloc_bdev(), &ports, false, true), &ports);
    let trids = [trid(ports[0], NQN), trid(ports[1], NQN)];
    let args = perf_args(&trids, "6");
    let t0 = Instant::now();
    let child = spawn_nvmf(&args);
    wait_io_on_both([&d, &d], ports);
    d.rpc(&[
        "nvmf_subsystem_listener_set_ana_state",
        NQN,
        "-n",
        "inaccessible",
        "-t",
        "tcp",
        "-a",
        "127.0.0.1",
        "-s",
        &ports[0].to_string(),
    ]);
    // When the RPC had answered (perf's clock started later: no earlier).
    let set_at = t0.elapsed().as_secs_f64();
    let out = nvmf_wait(child, Duration::from_secs(120), &args);
    let (v, stdout) = clean_run(&out);
    let p = v["paths"].as_array().unwrap();
    for x in p {
        assert_eq!(x["ana_reporting"], true, "{stdout}");
        assert!(x["failure"].is_null(), "a path was lost: {stdout}");
    }
    assert_eq!(p[0]["state"], "inaccessible", "{stdout}");
    assert_eq!(p[1]["state"], "optimized", "{stdout}");
    assert!(p[0]["state_changes"].as_u64().unwrap() >= 1, "{stdout}");
    // Read at start and again on the ANA Change event (or an ANA status).
    assert!(p[0]["ana_log_reads"].as_u64().unwrap() >= 2, "{stdout}");
    assert!(p[0]["total_ios"].as_u64().unwrap() > 100, "{stdout}");
    let last0 = p[0]["last_io_s"].as_f64().unwrap();
    let last1 = p[1]["last_io_s"].as_f64().unwrap();
    assert!(
        last0 < set_at + 0.5,
        "path 0 used after it went inaccessible at {set_at:.2} s: {stdout}"
    );
    assert!(last1 > 5.0, "{stdout}");
    eprintln!(
        "inaccessible path: {} I/Os, last at {last0:.2} s, {} retried elsewhere; survivor {} I/Os",
        p[0]["total_ios"], p[0]["failed_over"], p[1]["total_ios"]
    );
}

#[test]
fn killed_gateway_restarted_is_used_again_with_reconnect() {
    let dir = TestDir::new("mpath");
    let (bdev, ports, mut g0, g1) = shared_gateways(&dir, "shared-rejoin.img");
    let trids = [trid(ports[0], NQN), trid(ports[1], NQN)];
    let mut args = perf_args(&trids, "8");
    args.push("--reconnect");
    let child = spawn_nvmf(&args);
    wait_io_on_both([&g0, &g1], ports);
    g0.kill9();
    std::thread::sleep(Duration::from_secs(1));
    let g0b = Daemon::start(&config(&bdev, &ports[..1], false), &ports[..1]);
    let out = nvmf_wait(child, Duration::from_secs(120), &args);
    let (v, stdout) = clean_run(&out);
    let p = v["paths"].as_array().unwrap();
    let lost_at = p[0]["failed_at_s"].as_f64().expect("path 0 was lost");
    assert!(p[0]["reconnects"].as_u64().unwrap() >= 1, "{stdout}");
    assert_eq!(p[0]["state"], "optimized", "{stdout}");
    // Used again after it came back, until the end.
    let last0 = p[0]["last_io_s"].as_f64().unwrap();
    assert!(
        last0 > lost_at + 3.0,
        "path 0 not used after its return: {stdout}"
    );
    assert!(p[1]["failure"].is_null(), "{stdout}");
    eprintln!(
        "gateway 0 lost at {lost_at:.2} s, connected again, last I/O at {last0:.2} s; {} I/Os on it",
        p[0]["total_ios"]
    );
    drop((g0b, g1));
}

/// Size of the shared file of [`shared_gateways`].
const SHARED_BYTES: usize = 32 << 20;

/// The whole namespace of the gateway on `port` (the shared file), read
/// through that gateway with our initiator, 64 KiB at a time.
fn read_all(port: u16) -> Vec<u8> {
    use nvmf_host::{ConnectOptions, Controller, TransportId};
    use nvmf_wire::command::Command;
    use nvmf_wire::opcode::IoOpcode;
    const CHUNK: usize = 65536;
    let t = TransportId::parse(&trid(port, NQN)).unwrap();
    let ctrl = Controller::connect(&ConnectOptions::new(t))
        .unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"));
    let mut q = ctrl.create_io_queue(1, 4, CHUNK as u32).unwrap();
    let s = q.alloc().unwrap();
    let mut all = Vec::with_capacity(SHARED_BYTES);
    for k in 0..SHARED_BYTES / CHUNK {
        let mut r = Command::new(IoOpcode::Read as u8, 0);
        r.set_nsid(1)
            .set_lba_range((k * CHUNK / 512) as u64, (CHUNK / 512) as u32);
        let c = q
            .execute(s, r, CHUNK as u32, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("read at {} through {port}: {e}", k * CHUNK));
        assert!(c.status.is_success(), "read: {}", c.status.name());
        all.extend_from_slice(&q.buf(s)[..CHUNK]);
    }
    q.release(s);
    all
}

/// Waits until `d` has no queue open and nothing executing in its backend
/// (whatever it had buffered or in flight has been carried out); fails
/// after 15 s.
fn wait_drained(d: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v: Value = serde_json::from_str(&d.0.rpc_ok(&["nvmf_get_stats"])).unwrap();
        let busy: u64 = v["poll_groups"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| {
                [
                    "current_admin_qpairs",
                    "current_io_qpairs",
                    "pending_bdev_io",
                ]
                .iter()
                .map(|k| g[*k].as_u64().unwrap_or(0))
                .sum::<u64>()
            })
            .sum();
        if busy == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "still busy after 15 s: {v:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A gateway frozen mid-run (SIGSTOP): lost by keep-alive, its commands
/// move to the other gateway and the run verifies. With `stale_check`,
/// then: the shared area is read through the survivor, the frozen gateway
/// is resumed and left to carry out whatever it had buffered or in flight
/// (until its queues are closed and nothing executes), and the area is
/// read again through the survivor: any 4 KiB unit that changed was written
/// by a command the host had already moved to the other path, a stale
/// write over newer data.
fn frozen_gateway(stale_check: bool) {
    let dir = TestDir::new("mpath");
    let (_, ports, mut g0, g1) = shared_gateways(&dir, "shared-frozen.img");
    let trids = [trid(ports[0], NQN), trid(ports[1], NQN)];
    let mut args = perf_args(&trids, "8");
    args.extend(["--keep-alive-tmo", "2", "--timeout", "1"]);
    let t0 = Instant::now();
    let child = spawn_nvmf(&args);
    wait_io_on_both([&g0, &g1], ports);
    let frozen_at = t0.elapsed().as_secs_f64();
    g0.0.signal(libc::SIGSTOP);
    let out = nvmf_wait(child, Duration::from_secs(120), &args);
    // What the host last wrote, as the survivor serves it (perf verified
    // it through there just now), while the frozen gateway still sleeps.
    let before = stale_check.then(|| read_all(ports[1]));
    g0.0.signal(libc::SIGCONT);
    let (v, stdout) = clean_run(&out);
    let p = v["paths"].as_array().unwrap();
    let why = p[0]["failure"].as_str().expect("frozen path not lost");
    assert!(why.contains("keep alive"), "{why}");
    let lost_at = p[0]["failed_at_s"].as_f64().unwrap();
    // Found within keep-alive interval + command timeout (+ slack).
    assert!(
        lost_at < frozen_at + 4.0,
        "lost only at {lost_at}, frozen at {frozen_at:.2}: {stdout}"
    );
    assert!(p[0]["failed_over"].as_u64().unwrap() > 0, "{stdout}");
    assert!(
        p[1]["last_io_s"].as_f64().unwrap() > lost_at + 2.0,
        "{stdout}"
    );
    eprintln!(
        "frozen gateway lost at {lost_at:.2} s ({why}); {} command(s) moved",
        p[0]["failed_over"]
    );
    if let Some(before) = before {
        wait_drained(&g0);
        let after = read_all(ports[1]);
        let stale: Vec<usize> = (0..SHARED_BYTES / 4096)
            .filter(|&u| before[u * 4096..(u + 1) * 4096] != after[u * 4096..(u + 1) * 4096])
            .collect();
        assert!(
            stale.is_empty(),
            "the resumed gateway changed {} 4 KiB unit(s) after the run (stale writes), first at byte offsets {:?}",
            stale.len(),
            stale.iter().take(8).map(|u| u * 4096).collect::<Vec<_>>()
        );
    }
    drop((g0, g1));
}

#[test]
fn frozen_gateway_is_lost_by_keep_alive_and_its_commands_move() {
    frozen_gateway(false);
}

/// The same run, then the stale-write check (see [`frozen_gateway`]).
/// Seen failing (twice in two runs: 7 and 15 of 8192 units changed after
/// the resume): a resumed gateway executes the writes still buffered in
/// its sockets.
#[test]
#[ignore = "stale write after a frozen gateway resumes: two gateways on a shared file, which nothing can fence; on Ceph a gateway group prevents it (nvmfd/tests/gateway_group.rs frozen_member_cannot_land_a_stale_write)"]
fn frozen_gateway_resumed_lands_no_stale_write() {
    frozen_gateway(true);
}
