//! The SPDK pieces of `nvmf bench` against real processes: the spdk target
//! driver (nvmf_tgt started from a spec's JSON config) measured with the
//! spdk-perf engine (spdk_nvme_perf), the target's own counters read at
//! the window's edges; and the spdk-perf engine against a test-started
//! nvmfd (a mixed workload, then a long run stopped early as Ctrl-C does).
//!
//! The tests that run SPDK are `#[ignore]`d (SPDK is not in CI) and run
//! where a built SPDK is: `NVMFD_SPDK_DIR=... cargo test -p nvmf-host
//! --test bench_spdk -- --ignored` (`NVMFD_SPDK_DIR`: an SPDK v26.05 tree
//! with build/bin/nvmf_tgt and spdk_nvme_perf, default /work/spdk/spdk, as
//! crates/nvmfd/tests/spdk_host.rs; ../shared/tools/spdk-build.sh builds
//! one). Run that way without the build, they fail naming what is missing.
//! `spdk_target_refusals` (a target whose port is taken) needs no SPDK and
//! always runs. Ports 4540-4559.
//! SPDK busy-polls a core per reactor, and the ports come from one small
//! range: the tests run one at a time.

use nvmf_host::bench::engine::{EngineJob, Window};
use nvmf_host::bench::engines::{for_spec, EngineOptions};
use nvmf_host::bench::spec::BenchSpec;
use nvmf_host::bench::targets::{for_target, TargetOptions};
use nvmf_host::TransportId;
use nvmf_testkit::{bins::nvmfd_command, Process, TestDir};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

/// The SPDK tree with a build; the test fails naming what is missing
/// without one (it runs only when asked for: `--ignored`).
fn spdk_dir(test: &str) -> PathBuf {
    let dir = std::env::var_os("NVMFD_SPDK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/spdk/spdk"));
    let missing: Vec<String> = ["nvmf_tgt", "spdk_nvme_perf"]
        .iter()
        .map(|b| dir.join("build/bin").join(b))
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "{test}: no SPDK build: {} missing; set NVMFD_SPDK_DIR to a built SPDK v26.05 tree (../shared/tools/spdk-build.sh builds one)",
        missing.join(", ")
    );
    dir
}

/// A port of this file's range (4540-4559) free on 127.0.0.1 now.
fn port() -> u16 {
    (4540..4560)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port in 4540-4559")
}

/// CPUs: the target's reactor and the initiator's (two different ones
/// where there are two).
fn cpus() -> (usize, usize) {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0, if n > 1 { 1 } else { 0 })
}

fn config(port: u16, nqn: &str) -> String {
    format!(
        r#"{{"subsystems":[
{{"subsystem":"bdev","config":[{{"method":"bdev_null_create","params":{{"name":"Null0","num_blocks":262144,"block_size":4096}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{nqn}","allow_any_host":true,"serial_number":"BENCH0001"}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{nqn}","namespace":{{"nsid":1,"bdev_name":"Null0"}}}}}},
{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{nqn}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#
    )
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh); run with --ignored"]
fn spdk_target_measured_with_spdk_perf() {
    let spdk = spdk_dir("spdk_target_measured_with_spdk_perf");
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TestDir::new("bench-spdk");
    let port = port();
    std::fs::write(
        dir.join("spdk.json"),
        config(port, "nqn.2016-06.io.spdk:bench"),
    )
    .unwrap();
    let bin = spdk.join("build/bin");
    let text = format!(
        "engine = \"spdk-perf\"\nspdk_perf = \"{}\"\n\
         [[target]]\nname = \"spdk\"\nkind = \"spdk\"\nbinary = \"{}\"\nconfig = \"spdk.json\"\n\
         [[workload]]\nrw = \"randread\"\nqd = 8\nruntime = 2\nramp = 1\n",
        bin.join("spdk_nvme_perf").display(),
        bin.join("nvmf_tgt").display()
    );
    let spec = BenchSpec::from_toml(&text, dir.path(), &[]).unwrap();
    let (tcpu, icpu) = cpus();
    let topts = TargetOptions {
        node_cpus: vec![tcpu, icpu],
        initiator_cpus: vec![icpu],
        ..Default::default()
    };
    let mut target = for_target(&spec.targets[0], &topts).expect("an spdk target");
    let t0 = Instant::now();
    let ep = target.start().expect("nvmf_tgt starts");
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert_eq!(target.kind(), "spdk");
    assert_eq!(ep.trid.trsvcid, port.to_string());
    assert!(
        target.version().starts_with("SPDK v"),
        "{}",
        target.version()
    );
    let pids = target.pids();
    assert_eq!(pids.len(), 1);
    if tcpu != icpu {
        assert_eq!(target.cpus(), [tcpu]);
    }
    let mut engine = for_spec(&spec, &EngineOptions::default()).unwrap();
    assert_eq!(engine.name(), "spdk-perf");
    assert!(engine.version().contains("SPDK v"), "{}", engine.version());
    let stop = AtomicBool::new(false);
    let job = EngineJob {
        trid: &ep.trid,
        nsid: ep.nsid,
        workload: &spec.workloads[0],
        pin: &[icpu],
        host_nqn: None,
        stop: &stop,
    };
    let mut edges = Vec::new();
    let r = engine
        .run(&job, &mut |w| {
            edges.push((w, Instant::now(), target.io_counters()));
        })
        .expect("spdk_nvme_perf runs");
    assert_eq!(
        edges.iter().map(|e| e.0).collect::<Vec<_>>(),
        [Window::Start, Window::End]
    );
    let window = edges[1].1.duration_since(edges[0].1).as_secs_f64();
    assert!((1.5..3.5).contains(&window), "window {window} s");
    assert!((1.8..3.0).contains(&r.seconds), "{r:?}");
    assert!(r.read.ios > 1000 && r.write.ios == 0, "{r:?}");
    assert!(
        r.all.p50_us > 0.0 && r.all.p99_us >= r.all.p50_us,
        "{:?}",
        r.all
    );
    assert!(r.command.contains("spdk_nvme_perf") && r.command.contains("-LL"));
    assert_eq!(r.initiator_pids.len(), 1);
    // perf busy-polls its one core through the window (less of it when
    // the machine is shared), never more than that one core.
    let cpu = r.initiator_cpu_s.expect("perf's CPU time");
    assert!(
        cpu > 0.05 * window && cpu < 1.2 * window,
        "{cpu} s of CPU in {window} s"
    );
    // The target counted about what perf measured in the window (its
    // edges are perf's, taken from its output: a few % apart).
    let (a, b) = (edges[0].2.unwrap(), edges[1].2.unwrap());
    let counted = (b.0 - a.0) as f64;
    assert_eq!(b.1, a.1, "no writes");
    let ratio = counted / r.read.ios as f64;
    assert!(
        (0.75..1.25).contains(&ratio),
        "target {counted} vs perf {}",
        r.read.ios
    );
    target.stop();
    assert!(!alive(pids[0]), "nvmf_tgt still running");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still open"
    );
    println!(
        "spdk target: {:.0} IOPS over {:.2} s, target counted {counted} of {} reads (version {})",
        r.read.ios as f64 / r.seconds,
        r.seconds,
        r.read.ios,
        target.version()
    );
}

#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh); run with --ignored"]
fn spdk_perf_against_nvmfd_and_stopped_early() {
    let spdk = spdk_dir("spdk_perf_against_nvmfd_and_stopped_early");
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TestDir::new("bench-spdk-nvmfd");
    let port = port();
    let nqn = "nqn.2024-01.io.nvmfd:bench-spdk-perf";
    let cfg = dir.join("nvmfd.json");
    std::fs::write(&cfg, config(port, nqn)).unwrap();
    let (tcpu, icpu) = cpus();
    let mut nvmfd = Process::spawn(
        nvmfd_command()
            .args(["-c", cfg.to_str().unwrap(), "-m", &tcpu.to_string()])
            .arg("-r")
            .arg(dir.join("rpc.sock")),
    );
    assert!(
        nvmfd.wait_ready("listening on", Duration::from_secs(20)),
        "nvmfd did not start:\n{}",
        nvmfd.logs()
    );
    let text = format!(
        "engine = \"spdk-perf\"\nspdk_perf = \"{}\"\n\
         [[target]]\nname = \"nvmfd\"\nkind = \"trid\"\ntrid = \"trtype:TCP traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}\"\n\
         [[workload]]\nname = \"mixed\"\nrw = \"randrw\"\nmix = 70\nqd = 4\nruntime = 1\n\
         [[workload]]\nname = \"long\"\nrw = \"randwrite\"\nqd = 4\nruntime = 60\n",
        spdk.join("build/bin/spdk_nvme_perf").display()
    );
    let spec = BenchSpec::from_toml(&text, dir.path(), &[]).unwrap();
    let mut engine = for_spec(&spec, &EngineOptions::default()).unwrap();
    let trid = TransportId::tcp("127.0.0.1", &port.to_string(), nqn);
    let stop = AtomicBool::new(false);
    let pin = [icpu];
    let job = |w| EngineJob {
        trid: &trid,
        nsid: 1,
        workload: w,
        pin: &pin,
        host_nqn: None,
        stop: &stop,
    };
    let r = engine
        .run(&job(&spec.workloads[0]), &mut |_| {})
        .expect("spdk_nvme_perf against nvmfd");
    let ios = r.read.ios + r.write.ios;
    assert!(ios > 100, "{r:?}");
    let reads = r.read.ios as f64 / ios as f64;
    assert!((reads - 0.7).abs() < 0.01, "{r:?}");
    assert!(r.all.p99_us >= r.all.p50_us && r.all.p50_us > 0.0);
    println!(
        "nvmfd mixed: {:.0} IOPS, p50 {} us, p99 {} us",
        ios as f64 / r.seconds,
        r.all.p50_us,
        r.all.p99_us
    );

    // A 60 s run stopped after about 1.5 s returns what it measured.
    let t0 = Instant::now();
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(1500));
            stop.store(true, Ordering::Relaxed);
        });
        engine.run(&job(&spec.workloads[1]), &mut |_| {})
    })
    .expect("a stopped run still reports");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert!(r.write.ios > 0 && r.seconds < 10.0, "{r:?}");
    assert!(nvmfd.running(), "nvmfd survived:\n{}", nvmfd.logs());
}

/// A port already taken: refused before anything starts (no SPDK needed).
#[test]
fn spdk_target_refusals() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TestDir::new("bench-spdk-refuse");
    let busy = std::net::TcpListener::bind(("127.0.0.1", port())).unwrap();
    let taken = busy.local_addr().unwrap().port();
    std::fs::write(
        dir.join("busy.json"),
        config(taken, "nqn.2016-06.io.spdk:busy"),
    )
    .unwrap();
    std::fs::write(dir.join("nvmf_tgt"), "").unwrap();
    let text = "[[target]]\nname = \"s\"\nkind = \"spdk\"\nbinary = \"nvmf_tgt\"\nconfig = \"busy.json\"\n[[workload]]\n";
    let spec = BenchSpec::from_toml(text, dir.path(), &[]).unwrap();
    let opts = |cpu: usize| TargetOptions {
        node_cpus: vec![cpu],
        ..TargetOptions::default()
    };
    let mut t = for_target(&spec.targets[0], &opts(0)).unwrap();
    let e = t.start().unwrap_err().to_string();
    assert!(
        e.contains("already listens on 127.0.0.1:") && e.contains("another target"),
        "{e}"
    );
}

/// A namespace the config does not have: start fails naming it, and the
/// nvmf_tgt it had started is gone.
#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh); run with --ignored"]
fn spdk_target_without_the_namespace_is_refused() {
    let spdk = spdk_dir("spdk_target_without_the_namespace_is_refused");
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TestDir::new("bench-spdk-refuse-ns");
    let opts = |cpu: usize| TargetOptions {
        node_cpus: vec![cpu],
        ..TargetOptions::default()
    };
    let port = port();
    std::fs::write(
        dir.join("spdk.json"),
        config(port, "nqn.2016-06.io.spdk:ns"),
    )
    .unwrap();
    let text = format!(
        "[[target]]\nname = \"s\"\nkind = \"spdk\"\nbinary = \"{}\"\nconfig = \"spdk.json\"\nnsid = 2\n[[workload]]\n",
        spdk.join("build/bin/nvmf_tgt").display()
    );
    let spec = BenchSpec::from_toml(&text, dir.path(), &[]).unwrap();
    let mut t = for_target(&spec.targets[0], &opts(cpus().0)).unwrap();
    let e = t.start().unwrap_err().to_string();
    assert!(e.contains("has no namespace 2"), "{e}");
    let pid = t.pids()[0];
    assert!(!alive(pid), "nvmf_tgt {pid} left running");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}
