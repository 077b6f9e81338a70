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
//! keep-alive and its commands move to the other. Also: paths found through the discovery service, a path set
//! naming two subsystems refused, and a clear failure when every path goes.
//!
//! Every child process is killed on drop and every wait is bounded. The
//! daemons are nvmf-testkit's (nvmfd built on demand if missing).

use nvmf_testkit::process::{spawn_nvmf, wait_bounded};
use nvmf_testkit::{free_port, text, trid, TestDir};
use serde_json::Value;
use std::process::{Child, Output};
use std::time::Duration;

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

/// Run a two-path verify perf for 6 s and call `cut` 2 s in; check the
/// report: exit 0, no error or mismatch, both paths used before the cut,
/// path 0 lost and unused after it, path 1 carrying I/O to the end.
fn run_and_cut(ports: [u16; 2], cut: impl FnOnce()) -> Value {
    let trids = [trid(ports[0], NQN), trid(ports[1], NQN)];
    let args = perf_args(&trids, "6");
    let child = spawn_nvmf(&args);
    std::thread::sleep(Duration::from_secs(2));
    cut();
    let out = nvmf_wait(child, Duration::from_secs(120), &args);
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
    assert!((1.0..5.0).contains(&lost_at), "lost at {lost_at}: {stdout}");
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
    run_and_cut(ports, || {
        d.rpc(&[
            "nvmf_subsystem_remove_listener",
            NQN,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port0,
        ])
    });
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
    run_and_cut(ports, || g0.kill9());
    drop(g1);
}

#[test]
fn every_path_lost_is_a_clear_failure() {
    let ports = [free_port(), free_port()];
    let d = Daemon::start(&config(&malloc_bdev(), &ports, false), &ports);
    let trids = [trid(ports[0], NQN), trid(ports[1], NQN)];
    let args = perf_args(&trids, "6");
    let child = spawn_nvmf(&args);
    std::thread::sleep(Duration::from_secs(2));
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
    let child = spawn_nvmf(&args);
    std::thread::sleep(Duration::from_secs(2));
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
        last0 < 2.5,
        "path 0 used after it went inaccessible: {stdout}"
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
    std::thread::sleep(Duration::from_secs(2));
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

#[test]
fn frozen_gateway_is_lost_by_keep_alive_and_its_commands_move() {
    let dir = TestDir::new("mpath");
    let (_, ports, mut g0, g1) = shared_gateways(&dir, "shared-frozen.img");
    let trids = [trid(ports[0], NQN), trid(ports[1], NQN)];
    let mut args = perf_args(&trids, "8");
    args.extend(["--keep-alive-tmo", "2", "--timeout", "1"]);
    let child = spawn_nvmf(&args);
    std::thread::sleep(Duration::from_secs(2));
    g0.0.signal(libc::SIGSTOP);
    let out = nvmf_wait(child, Duration::from_secs(120), &args);
    g0.0.signal(libc::SIGCONT);
    let (v, stdout) = clean_run(&out);
    let p = v["paths"].as_array().unwrap();
    let why = p[0]["failure"].as_str().expect("frozen path not lost");
    assert!(why.contains("keep alive"), "{why}");
    let lost_at = p[0]["failed_at_s"].as_f64().unwrap();
    // Found within keep-alive interval + command timeout (+ slack).
    assert!(lost_at < 6.0, "lost only at {lost_at}: {stdout}");
    assert!(p[0]["failed_over"].as_u64().unwrap() > 0, "{stdout}");
    assert!(
        p[1]["last_io_s"].as_f64().unwrap() > lost_at + 2.0,
        "{stdout}"
    );
    eprintln!(
        "frozen gateway lost at {lost_at:.2} s ({why}); {} command(s) moved",
        p[0]["failed_over"]
    );
    drop((g0, g1));
}
