//! End-to-end tests of the initiator against the real `nvmfd` binary: each
//! test starts its own daemon on a free 127.0.0.1 port with a malloc-backed
//! subsystem, a host-restricted subsystem and the discovery service, then
//! drives it with the library and with the `nvmf` CLI. Every test is bounded
//! in time (daemon start, CLI runs and library calls all have deadlines).
//!
//! The daemon is started with nvmf-testkit, which finds nvmfd in this
//! build's target/<profile>/ (building it with cargo if it is missing).

use nvmf_host::{ConnectOptions, Controller, Error, TransportId};
use nvmf_testkit::{free_port, nvmf, text};
use nvmf_wire::{Command, IoOpcode};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const NQN: &str = "nqn.2024-01.io.nvmfd:host-test";
const RESTRICTED: &str = "nqn.2024-01.io.nvmfd:host-restricted";
const ALLOWED_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6a1b3c52-0000-4000-8000-00000000a11d";
const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6a1b3c52-0000-4000-8000-0000000bad00";
/// Namespace size in 512-byte blocks (32 MiB).
const BLOCKS: u64 = 65536;

fn config_json(port: u16, c2h_success: bool) -> String {
    let listen = |nqn: &str| {
        format!(
            r#"{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{nqn}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}"#
        )
    };
    format!(
        r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":{BLOCKS}}}}},
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc1","block_size":512,"num_blocks":2048}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP","c2h_success":{c2h_success},"in_capsule_data_size":4096,
      "max_io_size":131072,"io_unit_size":131072,"max_queue_depth":128,"max_aq_depth":32,"max_io_qpairs_per_ctrlr":8}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true,
      "serial_number":"NVMFHOST0001","model_number":"nvmf-host test"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{RESTRICTED}","allow_any_host":false,
      "serial_number":"NVMFHOST0002","model_number":"nvmf-host restricted"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{RESTRICTED}","namespace":{{"nsid":1,"bdev_name":"Malloc1"}}}}}},
   {{"method":"nvmf_subsystem_add_host","params":{{"nqn":"{RESTRICTED}","host":"{ALLOWED_HOST}"}}}},
   {},
   {},
   {}
 ]}}]}}"#,
        listen(NQN),
        listen(RESTRICTED),
        listen(nvmf_host::DISCOVERY_NQN)
    )
}

/// A running nvmfd (nvmf-testkit's), killed on drop.
struct Daemon {
    _d: nvmf_testkit::Daemon,
    port: u16,
}

impl Daemon {
    fn start() -> Daemon {
        Daemon::start_with(true)
    }

    /// `c2h_success`: the transport's option. nvmf-host keeps SQ flow
    /// control on, so its reads end with a response capsule either way
    /// (the flag itself is tested in nvmf-tcp's state_machine tests).
    fn start_with(c2h_success: bool) -> Daemon {
        let port = free_port();
        let d = nvmf_testkit::Daemon::builder(config_json(port, c2h_success))
            .args(["-m", "0"])
            .listening(&[port])
            .ready_within(Duration::from_secs(15))
            .start();
        Daemon { _d: d, port }
    }

    fn trid(&self, nqn: &str) -> TransportId {
        TransportId::tcp("127.0.0.1", &self.port.to_string(), nqn)
    }

    fn trid_str(&self, nqn: &str) -> String {
        nvmf_testkit::trid(self.port, nqn)
    }

    fn opts(&self, nqn: &str) -> ConnectOptions {
        let mut o = ConnectOptions::new(self.trid(nqn));
        o.timeout = Duration::from_secs(5);
        o
    }
}

/// Run `f` on a thread; fail the test if it takes longer than `secs`.
fn bounded<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(_) => panic!("test body did not finish within {secs} s"),
    }
}

#[test]
fn discover_lists_the_subsystem() {
    let d = Daemon::start();
    let port = d.port.to_string();
    let out = nvmf(
        &["discover", "-t", "tcp", "-a", "127.0.0.1", "-s", &port],
        Duration::from_secs(30),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("Discovery Log Number of Records"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("subnqn:  {NQN}")), "{stdout}");
    assert!(stdout.contains(&format!("trsvcid: {port}")), "{stdout}");
    assert!(stdout.contains("traddr:  127.0.0.1"), "{stdout}");
    assert!(stdout.contains("subtype: nvme subsystem"), "{stdout}");

    // The same through the library.
    let opts = d.opts(nvmf_host::DISCOVERY_NQN);
    let log = bounded(30, move || {
        let c = Controller::connect(&opts).expect("connect to discovery");
        assert!(c.is_discovery());
        c.discovery_log().expect("discovery log")
    });
    let e = log
        .entries
        .iter()
        .find(|e| e.subnqn == NQN)
        .unwrap_or_else(|| panic!("{NQN} not in {log:?}"));
    assert_eq!(e.traddr, "127.0.0.1");
    assert_eq!(e.trsvcid, d.port.to_string());
    assert_eq!(e.trtype, 3);
}

#[test]
fn connect_identify_and_io_commands() {
    let d = Daemon::start();
    let opts = d.opts(NQN);
    bounded(60, move || {
        let c = Controller::connect(&opts).expect("connect");
        let id = c.identify();
        assert_eq!(id.subnqn(), NQN);
        assert_eq!(id.model(), "nvmf-host test");
        assert_eq!(id.serial(), "NVMFHOST0001");
        assert!(!c.is_discovery());
        assert!(c.max_queue_size() >= 2);
        assert_eq!(c.in_capsule_size(), 4096);
        assert_eq!(c.active_namespaces().unwrap(), vec![1]);
        let ns = c.identify_namespace(1).unwrap();
        assert_eq!(ns.nsze.get(), BLOCKS);
        assert_eq!(ns.block_size(), 512);
        // nvmfd names the namespace after its bdev (vendor-specific area;
        // the host's readable device names, `nvmf udev-name`)
        assert_eq!(ns.vendor_name(), Some("Malloc0"));
        assert!(!c.ns_descriptors(1).unwrap().is_empty());
        assert!(c.set_num_queues(2).unwrap() >= 2);
        c.keep_alive().unwrap();

        let mut q = c.create_io_queue(1, 16, 131072).expect("I/O queue");
        let t = Duration::from_secs(5);
        for (len, pattern) in [(4096u32, 0x5au8), (65536, 0xa7)] {
            // Write (in-capsule for 4 KiB, R2T for 64 KiB), then read back.
            let s = q.alloc().unwrap();
            q.buf_mut(s)[..len as usize].fill(pattern);
            let mut w = Command::new(IoOpcode::Write as u8, 0);
            w.set_nsid(1).set_lba_range(8, len / 512);
            assert!(q.execute(s, w, len, t).unwrap().status.is_success());
            q.buf_mut(s).fill(0);
            let mut r = Command::new(IoOpcode::Read as u8, 0);
            r.set_nsid(1).set_lba_range(8, len / 512);
            assert!(q.execute(s, r, len, t).unwrap().status.is_success());
            assert!(q.buf(s)[..len as usize].iter().all(|&b| b == pattern));
            q.release(s);
        }
        // Write Zeroes, then the range reads as zeroes.
        let s = q.alloc().unwrap();
        q.submit_write_zeroes(s, 1, 8, 8, false).unwrap();
        while q.poll(Some(t)).unwrap() == 0 {}
        let cpl = q.next_completion().unwrap();
        assert!(cpl.status.is_success(), "{}", cpl.status.name());
        q.submit_read(s, 1, 8, 8, 4096).unwrap();
        while q.poll(Some(t)).unwrap() == 0 {}
        assert!(q.next_completion().unwrap().status.is_success());
        assert!(q.buf(s)[..4096].iter().all(|&b| b == 0));
        // Flush and Dataset Management (deallocate).
        q.submit_flush(s, 1).unwrap();
        while q.poll(Some(t)).unwrap() == 0 {}
        assert!(q.next_completion().unwrap().status.is_success());
        q.submit_deallocate(s, 1, &[(0, 8), (100, 16)]).unwrap();
        while q.poll(Some(t)).unwrap() == 0 {}
        assert!(q.next_completion().unwrap().status.is_success());
        // Out of range: an NVMe error status, named.
        q.submit_read(s, 1, BLOCKS, 1, 512).unwrap();
        while q.poll(Some(t)).unwrap() == 0 {}
        let cpl = q.next_completion().unwrap();
        assert_eq!(cpl.status.name(), "LBA Out of Range");
        q.release(s);

        // Pipelined: fill the queue, reap all.
        let mut n = 0;
        while let Some(s) = q.alloc() {
            q.submit_read(s, 1, n * 8, 8, 4096).unwrap();
            n += 1;
        }
        assert_eq!(n, 16);
        let mut got = 0;
        let deadline = Instant::now() + t;
        while got < n && Instant::now() < deadline {
            q.poll(Some(Duration::from_millis(100))).unwrap();
            while let Some(cpl) = q.next_completion() {
                assert!(cpl.status.is_success());
                q.release(cpl.slot);
                got += 1;
            }
        }
        assert_eq!(got, n);
    });
}

fn perf_verify(io: &str, digests: bool, extra: &[&str]) {
    perf_verify_on(&Daemon::start(), io, digests, extra);
}

fn perf_verify_on(d: &Daemon, io: &str, digests: bool, extra: &[&str]) {
    let trid = d.trid_str(NQN);
    let mut args = vec![
        "perf", "-r", &trid, "-w", "randrw", "-o", io, "-q", "8", "-t", "2", "--verify", "--json",
    ];
    if digests {
        args.extend(["--hdr-digest", "--data-digest"]);
    }
    args.extend(extra);
    let out = nvmf(&args, Duration::from_secs(90));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "nvmf {args:?} failed\n{stdout}\n{}",
        text(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON output");
    assert_eq!(v["verify"]["mismatched_blocks"], 0, "{stdout}");
    assert!(
        v["verify"]["blocks_checked"].as_u64().unwrap() > 0,
        "{stdout}"
    );
    assert_eq!(v["total"]["error"], 0, "{stdout}");
    let job = &v["jobs"][0];
    assert!(job["read"]["iops"].as_f64().unwrap() > 0.0, "{stdout}");
    assert!(job["write"]["total_ios"].as_u64().unwrap() > 0, "{stdout}");
    assert!(job["read"]["bw"].as_u64().is_some());
    assert!(
        job["read"]["clat_ns"]["percentile"]["99.000000"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(job["read"]["lat_ns"]["mean"].as_f64().unwrap() > 0.0);
}

#[test]
fn perf_verify_4k_in_capsule() {
    perf_verify("4096", false, &[]);
}

#[test]
fn perf_verify_4k_digests() {
    perf_verify("4096", true, &[]);
}

#[test]
fn perf_verify_4k_forced_r2t() {
    perf_verify("4096", false, &["--in-capsule", "0"]);
}

#[test]
fn perf_verify_128k_r2t() {
    perf_verify("131072", false, &[]);
}

#[test]
fn perf_verify_128k_digests_two_queues() {
    perf_verify("131072", true, &["--queues", "2"]);
}

/// A config with `"c2h_success": false` loads and serves verified I/O.
/// (nvmf-host does not disable SQ flow control, so the SUCCESS flag is not
/// used with either setting: what the option changes on the wire is checked
/// by nvmf-tcp's `c2h_success_off_keeps_response_capsules`.)
#[test]
fn perf_verify_without_c2h_success_flag() {
    let d = Daemon::start_with(false);
    perf_verify_on(&d, "131072", true, &[]);
    perf_verify_on(&d, "4096", false, &[]);
}

#[test]
fn wrong_subnqn_is_connect_invalid_parameters() {
    let d = Daemon::start();
    let opts = d.opts("nqn.2024-01.io.nvmfd:no-such-subsystem");
    let err = bounded(30, move || match Controller::connect(&opts) {
        Ok(_) => panic!("connect to an unknown NQN succeeded"),
        Err(e) => e,
    });
    let msg = err.to_string();
    assert!(matches!(err, Error::Nvme(_)), "{msg}");
    assert!(msg.contains("Connect Invalid Parameters"), "{msg}");

    // `nvmf identify` shows each namespace's nvmfd name.
    let out = nvmf(
        &["identify", "-r", &d.trid_str(NQN)],
        Duration::from_secs(30),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("  name:  Malloc0 (nvmfd)"), "{stdout}");

    // The CLI says the same and exits 1.
    let trid = d.trid_str("nqn.2024-01.io.nvmfd:no-such-subsystem");
    let out = nvmf(&["identify", "-r", &trid], Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("Connect Invalid Parameters"), "{stderr}");
}

#[test]
fn disallowed_host_is_connect_invalid_host() {
    let d = Daemon::start();
    let denied = d.opts(RESTRICTED).with_hostnqn(OTHER_HOST);
    let allowed = d.opts(RESTRICTED).with_hostnqn(ALLOWED_HOST);
    bounded(30, move || {
        let err = match Controller::connect(&denied) {
            Ok(_) => panic!("a host not on the list connected"),
            Err(e) => e,
        };
        assert!(err.to_string().contains("Connect Invalid Host"), "{err}");
        let c = Controller::connect(&allowed).expect("the listed host connects");
        assert_eq!(c.identify().subnqn(), RESTRICTED);
    });

    let trid = d.trid_str(RESTRICTED);
    let out = nvmf(
        &["perf", "-r", &trid, "-t", "1", "--hostnqn", OTHER_HOST],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("Connect Invalid Host"));
}

#[test]
fn connection_refused_is_clear() {
    // No daemon: a port nobody listens on.
    let port = free_port();
    let opts = {
        let mut o = ConnectOptions::new(TransportId::tcp(
            "127.0.0.1",
            &port.to_string(),
            nvmf_host::DISCOVERY_NQN,
        ));
        o.timeout = Duration::from_secs(5);
        o
    };
    let err = bounded(30, move || match Controller::connect(&opts) {
        Ok(_) => panic!("connected to a closed port"),
        Err(e) => e,
    });
    assert!(matches!(err, Error::Connect { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("refused"), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");

    let out = nvmf(
        &["discover", "-a", "127.0.0.1", "-s", &port.to_string()],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("Connection refused"), "{stderr}");
}

/// A target that stops answering (SIGSTOP: connections open, nothing
/// answered) while `perf --verify` runs: with I/Os in flight and no
/// completion for the I/O timeout (`--timeout 2`) the run must fail with an
/// error naming how many I/Os never completed and the path, not wait for the
/// end of the run or for minutes in the read-back. Keep-alive is off so the
/// only limit at work is the I/O timeout.
#[test]
fn perf_verify_against_a_silent_target_fails_within_its_io_timeout() {
    let mut d = Daemon::start();
    let trid = d.trid_str(NQN);
    let args = [
        "perf",
        "-r",
        &trid,
        "-w",
        "randrw",
        "-o",
        "4096",
        "-q",
        "8",
        "-t",
        "30",
        "--verify",
        "--timeout",
        "2",
        "--keep-alive-tmo",
        "0",
    ];
    let t0 = Instant::now();
    let child = nvmf_testkit::process::spawn_nvmf(&args);
    std::thread::sleep(Duration::from_millis(1000));
    d._d.signal(libc::SIGSTOP);
    let out = nvmf_testkit::process::wait_bounded(child, Duration::from_secs(60), "nvmf perf");
    let took = t0.elapsed();
    d._d.signal(libc::SIGCONT);
    let all = format!("{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(
        !out.status.success(),
        "perf passed against a silent target\n{all}"
    );
    let line = all
        .lines()
        .find(|l| l.contains("never completed: no completion for 2s"))
        .unwrap_or_else(|| panic!("no error naming the I/Os that never completed\n{all}"));
    assert!(line.contains(&format!("127.0.0.1:{}", d.port)), "{line}");
    // frozen after 1 s of a 30 s run: the I/O timeout (2 s) plus connect and slack
    assert!(took < Duration::from_secs(10), "took {took:?}\n{all}");
    eprintln!("silent target: perf failed after {took:.1?}: {line}");
}

/// `nvmf perf -c A,B`: one pinned thread per listed CPU, the queues spread
/// over them round-robin, one report. Each queue's job says which thread
/// drove it and the CPU that thread was on (sched_getcpu, after pinning):
/// every listed CPU must have carried I/O, and the jobs must add up to the
/// total.
#[test]
fn perf_cores_runs_one_pinned_thread_per_cpu() {
    let allowed = nvmf_host::perf::allowed_cpus().expect("sched_getaffinity");
    let cpus: Vec<usize> = allowed.iter().copied().take(2).collect();
    if cpus.len() < 2 {
        eprintln!("only CPU {cpus:?} available: checking one thread only");
    }
    let list = cpus
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let d = Daemon::start();
    let trid = d.trid_str(NQN);
    // Default: one queue per CPU; then two queues per CPU.
    for (extra, want_queues) in [(None, cpus.len()), (Some("4"), 4)] {
        let mut args = vec![
            "perf", "-r", &trid, "-w", "randread", "-q", "8", "-t", "1", "-c", &list, "--json",
        ];
        if let Some(q) = extra {
            args.extend(["--queues", q]);
        }
        let want_queues = if extra.is_some() {
            want_queues.max(cpus.len())
        } else {
            want_queues
        };
        let out = nvmf(&args, Duration::from_secs(60));
        let stdout = text(&out.stdout);
        assert!(
            out.status.success(),
            "nvmf {args:?} failed\n{stdout}\n{}",
            text(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON output");
        let jobs = v["jobs"].as_array().expect("jobs");
        assert_eq!(jobs.len(), want_queues, "{stdout}");
        let mut sum = 0;
        for (t, &cpu) in cpus.iter().enumerate() {
            let mine: Vec<_> = jobs.iter().filter(|j| j["thread"] == t).collect();
            assert_eq!(mine.len(), want_queues / cpus.len(), "thread {t}: {stdout}");
            for j in mine {
                assert_eq!(j["cpu"], cpu, "thread {t} pinned to CPU {cpu}: {j}");
                assert_eq!(j["ran_on_cpu"], cpu, "thread {t} ran on CPU {cpu}: {j}");
                let ios = j["read"]["total_ios"].as_u64().unwrap();
                assert!(ios > 0, "queue {} of thread {t} did no I/O: {j}", j["qid"]);
                sum += ios;
            }
        }
        assert_eq!(v["total"]["read"]["total_ios"], sum, "{stdout}");
        assert_eq!(v["total"]["error"], 0, "{stdout}");
    }
}

/// Bad `-c` input is a clear error, never a panic, and before connecting
/// (nothing listens on the port).
#[test]
fn perf_cores_bad_input_is_a_clear_error() {
    let trid = nvmf_testkit::trid(free_port(), NQN);
    for (cores, queues, want) in [
        (
            "4000",
            None,
            "CPU 4000 does not exist or this process may not run on it",
        ),
        ("0,0", None, "CPU 0 is listed twice"),
        (
            "0-1",
            Some("1"),
            "--queues 1 is fewer than the 2 CPUs given with -c",
        ),
        ("x", None, "'x' is not a CPU number or range"),
        ("3-1", None, "'3-1' is not a CPU number or range"),
        ("", None, "empty CPU list"),
    ] {
        let mut args = vec!["perf", "-r", &trid, "-t", "1", "-c", cores];
        if let Some(q) = queues {
            args.extend(["--queues", q]);
        }
        let out = nvmf(&args, Duration::from_secs(30));
        let err = text(&out.stderr);
        assert!(!out.status.success(), "nvmf {args:?} succeeded");
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "nvmf {args:?}: exit {:?}\n{err}",
            out.status
        );
        assert!(err.contains(want), "nvmf {args:?}: want {want:?} in\n{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
