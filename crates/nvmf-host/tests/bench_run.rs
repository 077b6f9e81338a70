//! `nvmf bench run` end to end through the binary, against nvmfd started
//! by the harness itself (malloc bdev on 127.0.0.1, ports 4500-4519): a
//! short real matrix and its outputs and figures, failing targets recorded
//! as failures (a port already taken, nothing listening), and Ctrl-C
//! (SIGINT) mid-run. nvmfd is found (or built) by nvmf-testkit.

use nvmf_host::bench::results::BenchReport;
use nvmf_testkit::{run_bounded, text, TestDir};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn config(port: u16) -> String {
    format!(
        r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":65536}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"nqn.2024-01.io.nvmfd:bench","allow_any_host":true}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"nqn.2024-01.io.nvmfd:bench","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"nqn.2024-01.io.nvmfd:bench",
     "listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}
 ]}}]}}"#
    )
}

/// A port of this part's range (4500-4519) that nothing listens on now,
/// searched from `from` (another run of these tests may hold some).
fn port_from(from: u16) -> u16 {
    (from..4520)
        .chain(4500..from)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port in 4500-4519")
}

/// The `nvmf bench run` command for `spec` with outputs in `out`.
fn bench_cmd(spec: &Path, out: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nvmf"));
    c.arg("bench")
        .arg("run")
        .arg(spec)
        .arg("--out")
        .arg(out)
        .arg("--nvmfd")
        .arg(nvmf_testkit::bins::nvmfd())
        .args(["--sample-ms", "0"]);
    c
}

fn report(out: &Path) -> BenchReport {
    let s = std::fs::read_to_string(out.join("bench.json")).expect("bench.json");
    serde_json::from_str(&s).expect("bench.json is a BenchReport")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn a_short_matrix_against_a_started_nvmfd() {
    let dir = TestDir::new("bench-run");
    std::fs::write(dir.join("nvmfd.json"), config(port_from(4500))).unwrap();
    let spec = dir.join("bench.toml");
    std::fs::write(
        &spec,
        "repetitions = 2\nbaseline = \"nvmfd\"\n\
         [[target]]\nname = \"nvmfd\"\nkind = \"nvmfd\"\nconfig = \"nvmfd.json\"\n\
         [[workload]]\nname = \"mixed\"\nrw = \"randrw\"\nmix = 70\nqd = 8\nruntime = 1\n\
         [[workload]]\nname = \"reads\"\nrw = \"randread\"\nqd = 16\nruntime = 1\nramp = 1\n",
    )
    .unwrap();
    let out = dir.join("out");
    let o = run_bounded(bench_cmd(&spec, &out), Duration::from_secs(60));
    let (so, se) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "stdout:\n{so}\nstderr:\n{se}");
    for f in ["bench.json", "bench.csv", "bench.md", "bench.html"] {
        assert!(out.join(f).is_file(), "{f} missing; stdout:\n{so}");
    }
    assert!(
        so.contains("nvmfd/mixed") && so.contains("nvmfd/reads"),
        "{so}"
    );
    let r = report(&out);
    assert!(!r.interrupted);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.measurements.len(), 4);
    assert_eq!(r.cells.len(), 2);
    assert!(
        r.machine.versions.iter().any(|v| v.0 == "nvmfd"),
        "{:?}",
        r.machine
    );
    assert!(
        !r.placements[0].target_cpus.is_empty(),
        "{:?}",
        r.placements
    );
    for m in &r.measurements {
        let ios = m.result.read.ios + m.result.write.ios;
        let bytes = m.result.read.bytes + m.result.write.bytes;
        let s = m.result.seconds;
        assert!(ios > 0 && (0.9..=1.1).contains(&s), "{m:?}");
        assert!(close(m.iops, ios as f64 / s), "{m:?}");
        assert!(close(m.mibps, bytes as f64 / 1048576.0 / s), "{m:?}");
        assert!(close(m.gbps, m.mibps * 8.0 * 1.048576 / 1000.0), "{m:?}");
        assert_eq!(m.clients, 1);
        assert!(
            m.result.command.starts_with("nvmf perf -r "),
            "{}",
            m.result.command
        );
        let c = &m.cpu;
        for (name, v) in [
            ("initiator_s", c.initiator_s),
            ("target_s", c.target_s),
            ("initiator_us_per_io", c.initiator_us_per_io),
            ("target_us_per_io", c.target_us_per_io),
            ("target_cores", c.target_cores),
        ] {
            assert!(v.is_some_and(|x| x > 0.0), "{name} = {v:?} in {m:?}");
        }
        let (tr, tw) = m.target_ios.expect("nvmfd counters");
        if m.workload == "mixed" {
            // No ramp: the window spans every I/O of the run, so nvmfd's
            // counters and the engine's count agree exactly.
            assert_eq!((tr, tw), (m.result.read.ios, m.result.write.ios), "{m:?}");
            assert!(m.result.write.ios > 0);
            assert!(
                !m.notes.iter().any(|n| n.contains("MISMATCH")),
                "{:?}",
                m.notes
            );
        } else {
            assert!(
                m.result.command.contains("--ramp 1"),
                "{}",
                m.result.command
            );
            assert_eq!(tw, 0);
            // With a ramp the start edge falls amid the load: the counts
            // agree up to what passes while the counters are read (a few
            // ms, tens on a loaded 2-core machine). Counting the 1 s ramp
            // would double the target's count.
            assert!(tr.abs_diff(ios) * 4 <= ios, "{tr} vs {ios}");
        }
    }
    assert_eq!(r.cells[0].efficiency, Some(1.0));
}

#[test]
fn failing_targets_are_recorded_and_the_matrix_goes_on() {
    let dir = TestDir::new("bench-run-fail");
    // A port taken: nvmfd cannot listen and exits.
    // (Bound here and kept: finding a free port and binding it again
    // later races with the other tests of this file.)
    let (taken_port, _taken) = (4505..4520)
        .chain(4500..4505)
        .find_map(|p| {
            std::net::TcpListener::bind(("127.0.0.1", p))
                .ok()
                .map(|l| (p, l))
        })
        .expect("a free port in 4500-4519");
    std::fs::write(dir.join("nvmfd.json"), config(taken_port)).unwrap();
    let nobody_port = port_from(4510);
    let spec = dir.join("bench.toml");
    std::fs::write(
        &spec,
        format!(
            "repetitions = 1\n\
         [[target]]\nname = \"busy\"\nkind = \"nvmfd\"\nconfig = \"nvmfd.json\"\n\
         [[target]]\nname = \"nobody\"\nkind = \"trid\"\n\
         trid = \"trtype:TCP traddr:127.0.0.1 trsvcid:{nobody_port} subnqn:nqn.2024-01.io.nvmfd:none\"\n\
         [[workload]]\nname = \"w\"\nruntime = 1\n"
        ),
    )
    .unwrap();
    let out = dir.join("out");
    let o = run_bounded(bench_cmd(&spec, &out), Duration::from_secs(60));
    let (so, se) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "stdout:\n{so}\nstderr:\n{se}");
    assert!(!se.contains("panicked"), "{se}");
    let r = report(&out);
    assert!(r.measurements.is_empty());
    assert_eq!(r.failures.len(), 2, "{:?}", r.failures);
    let why = |cell: &str| {
        r.failures
            .iter()
            .find(|f| f.0 == cell)
            .map(|f| f.2.clone())
            .unwrap_or_default()
    };
    let busy = why("busy/w");
    assert!(
        busy.contains("did not start")
            && busy.contains("nvmfd exited")
            && busy.contains(&taken_port.to_string()),
        "{busy}"
    );
    let nobody = why("nobody/w");
    assert!(nobody.to_lowercase().contains("refused"), "{nobody}");
    assert!(
        so.contains("run(s) failed") && so.contains("busy/w round 1: target busy did not start"),
        "{so}"
    );
}

#[test]
fn sigint_stops_cleanly_with_what_was_measured() {
    let dir = TestDir::new("bench-run-int");
    let port = port_from(4515);
    std::fs::write(dir.join("nvmfd.json"), config(port)).unwrap();
    let spec = dir.join("bench.toml");
    std::fs::write(
        &spec,
        "repetitions = 1\n\
         [[target]]\nname = \"nvmfd\"\nkind = \"nvmfd\"\nconfig = \"nvmfd.json\"\n\
         [[workload]]\nname = \"short\"\nqd = 4\nruntime = 1\n\
         [[workload]]\nname = \"long\"\nqd = 4\nruntime = 30\n",
    )
    .unwrap();
    let out = dir.join("out");
    let mut child = bench_cmd(&spec, &out)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    // Wait for the first run's line, then interrupt the second run.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.starts_with("[1/2]")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => seen.push(l),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("no first run line; stdout so far: {seen:?}");
            }
        }
    }
    std::thread::sleep(Duration::from_millis(700));
    let t0 = Instant::now();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = nvmf_testkit::process::wait_bounded(child, Duration::from_secs(20), "nvmf bench run");
    assert_eq!(o.status.code(), Some(130), "stderr:\n{}", text(&o.stderr));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let r = report(&out);
    assert!(r.interrupted);
    assert_eq!(r.measurements.len(), 1, "{:?}", r.failures);
    assert_eq!(r.measurements[0].workload, "short");
    assert!(
        r.failures
            .iter()
            .any(|f| f.0 == "nvmfd/long" && f.2.contains("interrupted")),
        "{:?}",
        r.failures
    );
    // The started nvmfd is gone.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "nvmfd still listening"
    );
}
