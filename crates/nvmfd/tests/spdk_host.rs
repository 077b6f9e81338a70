//! SPDK's host stack against the real daemon: `spdk_nvme_perf`,
//! `spdk_nvme_identify`, `spdk_nvme_discover`, `nvme_fuzz` and an SPDK
//! application (`spdk_tgt`) attaching nvmfd's namespaces through its
//! `bdev_nvme` initiator, and `spdk_nvme_perf` over TLS 1.3 with a PSK
//! interchange key (`-S ssl --psk-path`). Every tool runs against a freshly started nvmfd
//! (malloc + null namespaces, a subsystem with a host allow list, a
//! single-namespace subsystem for the fuzzer, a discovery listener) under a
//! time limit: a tool that hangs (the old bugs: perf and nvme_fuzz never
//! exiting after an AER command-ID clash) is killed and the test fails.
//!
//! SPDK is not in CI, so every test here is `#[ignore]`d (the summary
//! counts them as ignored) and is run where a built SPDK is:
//! `NVMFD_SPDK_DIR=... cargo test -p nvmfd --test spdk_host -- --ignored`
//! (`NVMFD_SPDK_DIR`: an SPDK v26.05 source tree with
//! `build/bin/spdk_nvme_perf`, default /work/spdk/spdk; ../shared/tools/
//! spdk-build.sh builds one). Run that way without the build (or without
//! what a test needs besides, below), a test fails saying what is missing;
//! it never passes without having run. docs/interop/spdk-host.md holds a
//! recorded run.
//!
//! Memory: `spdk_nvme_perf`, `nvme_fuzz` and `spdk_tgt` run with
//! `--no-huge -s N` (plain memory, nothing to clean up). `spdk_nvme_identify`
//! and `spdk_nvme_discover` have no such option and need hugepages
//! (hugetlbfs mounted at /dev/hugepages with free pages); without them those
//! two tests fail naming that. DPDK leaves /var/run/dpdk/spdk_pid<PID> (and
//! hugepage files if killed) behind: every SPDK process started here is
//! killed if still running and those paths removed when its guard drops.
//!
//! SPDK's tools busy-poll a core each, so the tests of this file run one at
//! a time (a lock), and the SPDK apps get their own RPC socket and skip the
//! CPU core lock files (`--disable-cpumask-locks`), so they never clash with
//! another SPDK app on the machine.

use nvmf_testkit::{bins::nvmfd_command, free_port, Process as Nvmfd};
use serde_json::Value;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The subsystem any host may use: ns 1 = malloc (512-byte blocks, bdev
/// UUID given), ns 2 = null (4096-byte blocks, identifiers derived).
const OPEN: &str = "nqn.2024-01.io.nvmfd:spdk-host";
/// Only [`HOST`] may connect; ns 1 = malloc.
const RESTRICTED: &str = "nqn.2024-01.io.nvmfd:spdk-host-restricted";
/// One namespace: nvme_fuzz's admin fuzzing runs 16 commands per namespace
/// on the one admin queue, which overflows SPDK's 32 admin requests with two
/// namespaces (see docs/interop/spdk-host.md).
const FUZZ: &str = "nqn.2024-01.io.nvmfd:spdk-host-fuzz";
const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Only hosts with a TLS PSK, on a listener that requires TLS.
const TLS_SUB: &str = "nqn.2024-01.io.nvmfd:spdk-host-tls";
/// A second host, with a 48-byte (SHA-384) key.
const HOST384: &str = "nqn.2014-08.org.nvmexpress:uuid:5b9a3e7c-1d2f-4a6b-8c9d-000000000384";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:5b9a3e7c-1d2f-4a6b-8c9d-0e1f2a3b4c5d";
const SERIAL: &str = "NVMFDSPDK0001";
const MODEL: &str = "nvmfd SPDK host test";
/// The malloc bdev's UUID (namespace 1 of OPEN: NGUID = UUID = this).
const MALLOC0_UUID: &str = "6f1c0a52-3b7e-4d8a-9c21-5e4f3a2b1c0d";

/// One test at a time: each SPDK tool spins a core at 100%.
static SERIAL_TESTS: Mutex<()> = Mutex::new(());

/// The SPDK source tree with a build; the test fails naming what is
/// missing without one (it runs only when asked for: `--ignored`).
fn spdk_dir(test: &str) -> PathBuf {
    let dir = std::env::var_os("NVMFD_SPDK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/spdk/spdk"));
    let perf = dir.join("build/bin/spdk_nvme_perf");
    assert!(
        perf.is_file(),
        "{test}: no SPDK build: {} is missing; set NVMFD_SPDK_DIR to a built SPDK v26.05 tree (../shared/tools/spdk-build.sh builds one)",
        perf.display()
    );
    dir
}

/// Fails `test` unless hugepages are there (see [`hugepages_free`]).
fn require_hugepages(test: &str, tool: &str) {
    assert!(
        hugepages_free(),
        "{test}: {tool} needs hugepages: mount hugetlbfs at /dev/hugepages and reserve some (e.g. echo 512 > /proc/sys/vm/nr_hugepages)"
    );
}

/// Whether hugetlbfs is mounted at /dev/hugepages with free pages
/// (spdk_nvme_identify and spdk_nvme_discover cannot run without).
fn hugepages_free() -> bool {
    let mounted = std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.contains(" /dev/hugepages ") && l.contains("hugetlbfs"))
        })
        .unwrap_or(false);
    let free = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("HugePages_Free:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    // 64 × 2 MiB is plenty for one identify/discover run.
    mounted && free >= 64
}

/// A fresh directory under target/tmp, removed on drop.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new(tag: &str) -> TmpDir {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "spdk-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TmpDir(d)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running SPDK process whose stdout and stderr go to a file. On drop it
/// is killed if still running, reaped, and DPDK's leftovers for its PID are
/// removed.
struct SpdkProc {
    child: Child,
    name: String,
    out: PathBuf,
    status: Option<ExitStatus>,
}

impl SpdkProc {
    fn spawn(mut cmd: Command, out: PathBuf) -> SpdkProc {
        let name = Path::new(cmd.get_program())
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let f = File::create(&out).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        SpdkProc {
            child,
            name,
            out,
            status: None,
        }
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.out).unwrap_or_default()).into_owned()
    }

    /// Waits up to `limit` for the exit; None if still running.
    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                self.status = Some(st);
                return Some(st);
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `limit` for the exit; kills it and panics (with its
    /// output) if it runs longer: a hang is the bug these tests look for.
    fn finish(&mut self, limit: Duration, nvmfd: &Nvmfd) -> (ExitStatus, String) {
        match self.wait_exit(limit) {
            Some(st) => (st, self.output()),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not exit within {limit:?} (killed)\n--- output ---\n{}\n--- nvmfd ---\n{}",
                    self.name,
                    tail(&self.output(), 80),
                    tail(&nvmfd.logs(), 40)
                );
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on the PID of a child we have not reaped yet.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    /// Waits (bounded) until the output contains `needle`.
    fn wait_output(&mut self, needle: &str, limit: Duration, nvmfd: &Nvmfd) {
        let start = Instant::now();
        while !self.output().contains(needle) {
            if start.elapsed() > limit || self.child.try_wait().unwrap().is_some() {
                panic!(
                    "{} never printed {needle:?}\n--- output ---\n{}\n--- nvmfd ---\n{}",
                    self.name,
                    tail(&self.output(), 80),
                    tail(&nvmfd.logs(), 40)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for SpdkProc {
    fn drop(&mut self) {
        let pid = self.child.id();
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let tag = format!("spdk_pid{pid}");
        let run_dirs = [
            PathBuf::from("/var/run/dpdk"),
            std::env::var_os("XDG_RUNTIME_DIR")
                .map(|d| PathBuf::from(d).join("dpdk"))
                .unwrap_or_else(|| PathBuf::from("/tmp/dpdk")),
        ];
        for d in run_dirs {
            let _ = std::fs::remove_dir_all(d.join(&tag));
        }
        for dir in ["/dev/hugepages", "/dev/shm"] {
            if let Ok(rd) = std::fs::read_dir(dir) {
                for e in rd.flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if n.starts_with(&tag) || n.ends_with(&format!(".pid{pid}")) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
    }
}

/// The last `n` lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A freshly started nvmfd serving OPEN, RESTRICTED, FUZZ and discovery on
/// one port; killed and its directory removed on drop.
struct Target {
    nvmfd: Nvmfd,
    port: u16,
    dir: TmpDir,
    spdk: PathBuf,
}

impl Target {
    fn start(spdk: &Path, tag: &str) -> Target {
        let dir = TmpDir::new(tag);
        let port = free_port();
        let listen = |nqn: &str| {
            format!(
                r#"{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{nqn}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}"#
            )
        };
        let cfg = format!(
            r#"{{"subsystems":[{{"subsystem":"bdev","config":[
{{"method":"bdev_malloc_create","params":{{"name":"Malloc0","num_blocks":131072,"block_size":512,"uuid":"{MALLOC0_UUID}"}}}},
{{"method":"bdev_null_create","params":{{"name":"Null0","num_blocks":262144,"block_size":4096}}}},
{{"method":"bdev_malloc_create","params":{{"name":"Malloc1","num_blocks":32768,"block_size":512}}}},
{{"method":"bdev_malloc_create","params":{{"name":"Malloc2","num_blocks":16384,"block_size":4096}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{OPEN}","allow_any_host":true,"serial_number":"{SERIAL}","model_number":"{MODEL}"}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{OPEN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{OPEN}","namespace":{{"nsid":2,"bdev_name":"Null0"}}}}}},
{},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{RESTRICTED}","allow_any_host":false,"serial_number":"NVMFDSPDK0002"}}}},
{{"method":"nvmf_subsystem_add_host","params":{{"nqn":"{RESTRICTED}","host":"{HOST}"}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{RESTRICTED}","namespace":{{"nsid":1,"bdev_name":"Malloc1"}}}}}},
{},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{FUZZ}","allow_any_host":true,"serial_number":"NVMFDSPDK0003"}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{FUZZ}","namespace":{{"nsid":1,"bdev_name":"Malloc2"}}}}}},
{},
{}]}}]}}"#,
            listen(OPEN),
            listen(RESTRICTED),
            listen(FUZZ),
            listen(DISCOVERY)
        );
        Target::launch(spdk, dir, port, cfg)
    }

    /// nvmfd serving TLS_SUB on a listener that requires TLS (secure_channel): each
    /// (host NQN, interchange key) gets its key file (mode 0600) and `--psk`.
    fn start_tls(spdk: &Path, tag: &str, hosts: &[(&str, &str)]) -> Target {
        use std::os::unix::fs::PermissionsExt;
        let dir = TmpDir::new(tag);
        let port = free_port();
        let mut keys = Vec::new();
        let mut add_hosts = String::new();
        for (i, (host, key)) in hosts.iter().enumerate() {
            let path = dir.path(&format!("key{i}.psk"));
            std::fs::write(&path, key).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            keys.push(format!(
                r#"{{"method":"keyring_file_add_key","params":{{"name":"key{i}","path":"{}"}}}}"#,
                path.display()
            ));
            add_hosts.push_str(&format!(
                r#"{{"method":"nvmf_subsystem_add_host","params":{{"nqn":"{TLS_SUB}","host":"{host}","psk":"key{i}"}}}},"#
            ));
        }
        let cfg = format!(
            r#"{{"subsystems":[{{"subsystem":"keyring","config":[{}]}},
{{"subsystem":"bdev","config":[{{"method":"bdev_malloc_create","params":{{"name":"Malloc0","num_blocks":32768,"block_size":512}}}}]}},
{{"subsystem":"nvmf","config":[{{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
{{"method":"nvmf_create_subsystem","params":{{"nqn":"{TLS_SUB}","allow_any_host":false,"serial_number":"NVMFDSPDK0004"}}}},
{{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{TLS_SUB}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
{add_hosts}
{{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{TLS_SUB}","secure_channel":true,"listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}]}}]}}"#,
            keys.join(",")
        );
        Target::launch(spdk, dir, port, cfg)
    }

    fn launch(spdk: &Path, dir: TmpDir, port: u16, cfg: String) -> Target {
        let cfg_path = dir.path("cfg.json");
        std::fs::write(&cfg_path, cfg).unwrap();
        let mut nvmfd = Nvmfd::spawn(
            nvmfd_command()
                .args(["-c", cfg_path.to_str().unwrap(), "-m", "0"])
                .arg("-r")
                .arg(dir.path("rpc.sock")),
        );
        assert!(
            nvmfd.wait_ready("listening on", Duration::from_secs(20)),
            "nvmfd did not start:\n{}",
            nvmfd.logs()
        );
        Target {
            nvmfd,
            port,
            dir,
            spdk: spdk.to_path_buf(),
        }
    }

    /// SPDK's transport ID string for `nqn` (with `hostnqn:` when given).
    fn trid(&self, nqn: &str, host: Option<&str>) -> String {
        let mut t = format!(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{} subnqn:{nqn}",
            self.port
        );
        if let Some(h) = host {
            t.push_str(&format!(" hostnqn:{h}"));
        }
        t
    }

    fn bin(&self, name: &str) -> Command {
        Command::new(self.spdk.join("build/bin").join(name))
    }

    /// Runs spdk_nvme_perf (2 s, QD 4, 4 KiB, plain memory) and returns
    /// (exit status, output).
    fn perf(&self, trid: &str, workload: &[&str], out: &str) -> (ExitStatus, String) {
        let mut cmd = self.bin("spdk_nvme_perf");
        cmd.args(["--no-huge", "-s", "512", "-q", "4", "-o", "4096", "-t", "2"])
            .args(workload)
            .args(["-r", trid]);
        let mut p = SpdkProc::spawn(cmd, self.dir.path(out));
        p.finish(Duration::from_secs(90), &self.nvmfd)
    }

    /// Waits (bounded) until nvmfd has no controller left, i.e. the host's
    /// detach tore everything down.
    fn wait_no_controllers(&self, after: usize) {
        let start = Instant::now();
        loop {
            let logs = self.nvmfd.log.lock().unwrap()[after..].join("\n");
            let last = logs
                .lines()
                .rev()
                .find(|l| l.contains("active_controllers="));
            if last.is_some_and(|l| l.contains("active_controllers=0")) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nvmfd still has controllers:\n{}",
                tail(&self.nvmfd.logs(), 40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_len(&self) -> usize {
        self.nvmfd.log.lock().unwrap().len()
    }

    /// nvmfd's own view of `nqn`'s namespaces (nvmf_get_subsystems over its
    /// RPC socket).
    fn namespaces(&self, nqn: &str) -> Vec<Value> {
        let mut c = nvmf_rpc::RpcClient::connect(self.dir.path("rpc.sock"), 50)
            .expect("connect to nvmfd's RPC socket");
        let subs = c
            .call("nvmf_get_subsystems", None)
            .expect("nvmf_get_subsystems");
        subs.as_array()
            .unwrap()
            .iter()
            .find(|s| s["nqn"] == nqn)
            .unwrap_or_else(|| panic!("{nqn} not in {subs}"))["namespaces"]
            .as_array()
            .unwrap()
            .clone()
    }
}

/// The "Total" IOPS of a spdk_nvme_perf report.
fn total_iops(out: &str) -> f64 {
    out.lines()
        .find(|l| l.trim_start().starts_with("Total"))
        .and_then(|l| l.split(':').nth(1)?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no Total line in perf output:\n{out}"))
}

fn assert_perf_ok(what: &str, st: ExitStatus, out: &str, t: &Target) {
    assert!(
        st.success(),
        "{what}: spdk_nvme_perf exited {st}\n{out}\n--- nvmfd ---\n{}",
        tail(&t.nvmfd.logs(), 40)
    );
    let iops = total_iops(out);
    assert!(iops > 0.0, "{what}: no I/O done\n{out}");
    println!("{what}: {iops:.0} IOPS");
}

/// NGUID as SPDK's bdev_nvme turns it into a bdev UUID (same 16 bytes).
fn nguid_as_uuid(nguid: &str) -> String {
    let h = nguid.to_ascii_lowercase();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh); run with --ignored"]
fn perf_with_and_without_host_nqn() {
    let spdk = spdk_dir("perf_with_and_without_host_nqn");
    let _one = SERIAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let t = Target::start(&spdk, "perf");

    // No host NQN (SPDK perf's default): the subsystem allows any host.
    let at = t.log_len();
    let (st, out) = t.perf(&t.trid(OPEN, None), &["-w", "randread"], "perf1.out");
    assert_perf_ok("randread, no host NQN", st, &out, &t);
    assert!(out.contains("NSID 1") && out.contains("NSID 2"), "{out}");
    t.wait_no_controllers(at);
    assert!(t.nvmfd.logged(&format!("subnqn={OPEN} hostnqn= ")));

    // With a host NQN, a write workload.
    let at = t.log_len();
    let trid = t.trid(OPEN, Some(HOST));
    let (st, out) = t.perf(&trid, &["-w", "randwrite"], "perf2.out");
    assert_perf_ok("randwrite, host NQN", st, &out, &t);
    t.wait_no_controllers(at);
    assert!(t.nvmfd.logged(&format!("subnqn={OPEN} hostnqn={HOST}")));

    // Mixed 70/30 without a host NQN.
    let at = t.log_len();
    let (st, out) = t.perf(
        &t.trid(OPEN, None),
        &["-w", "randrw", "-M", "70"],
        "perf3.out",
    );
    assert_perf_ok("randrw 70/30, no host NQN", st, &out, &t);
    t.wait_no_controllers(at);
}

#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh); run with --ignored"]
fn perf_against_host_allow_list() {
    let spdk = spdk_dir("perf_against_host_allow_list");
    let _one = SERIAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let t = Target::start(&spdk, "allow");

    // The listed host works.
    let at = t.log_len();
    let trid = t.trid(RESTRICTED, Some(HOST));
    let (st, out) = t.perf(&trid, &["-w", "randread"], "perf1.out");
    assert_perf_ok("allowed host", st, &out, &t);
    t.wait_no_controllers(at);

    // No host NQN: refused at Connect (Connect Invalid Host), and perf ends
    // by itself. SPDK's perf (v24.01, v26.05) exits 0 when it attached nothing (it
    // only prints that no controller was found), so the exit status is not
    // the signal; the output and nvmfd's log are.
    let (_st, out) = t.perf(&t.trid(RESTRICTED, None), &["-w", "randread"], "perf2.out");
    assert!(
        out.contains("No valid NVMe controllers"),
        "perf attached to a restricted subsystem without a host NQN:\n{out}"
    );
    assert!(
        out.contains("sct 1, sc 132"),
        "SPDK did not see Connect Invalid Host (SCT 1h, SC 84h):\n{out}"
    );
    assert!(t.nvmfd.logged("connect from a host not allowed"));
    assert!(!out.contains("IOPS") || total_iops(&out) == 0.0, "{out}");
}

#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh) and free hugepages at /dev/hugepages; run with --ignored"]
fn identify_with_and_without_host_nqn() {
    let spdk = spdk_dir("identify_with_and_without_host_nqn");
    require_hugepages("identify_with_and_without_host_nqn", "spdk_nvme_identify");
    let _one = SERIAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let t = Target::start(&spdk, "identify");
    let ns = t.namespaces(OPEN);
    for (i, host) in [None, Some(HOST)].into_iter().enumerate() {
        let at = t.log_len();
        let mut cmd = t.bin("spdk_nvme_identify");
        cmd.args(["-r", &t.trid(OPEN, host)]);
        let mut p = SpdkProc::spawn(cmd, t.dir.path(&format!("identify{i}.out")));
        let (st, out) = p.finish(Duration::from_secs(60), &t.nvmfd);
        assert!(st.success(), "spdk_nvme_identify exited {st}\n{out}");
        // Every admin command identify sends succeeded (it prints
        // "get_feature(0x..) failed" / "... failed" otherwise).
        assert!(!out.contains("failed"), "a command failed:\n{out}");
        let field = |name: &str| -> String {
            out.lines()
                .find(|l| l.starts_with(name))
                .map(|l| l[name.len()..].trim().to_string())
                .unwrap_or_else(|| panic!("no {name:?} line:\n{out}"))
        };
        assert_eq!(field("Serial Number:"), SERIAL);
        assert_eq!(field("Model Number:"), MODEL);
        assert_eq!(field("Subsystem NQN:"), OPEN);
        assert!(out.contains("Namespace ID:1") && out.contains("Namespace ID:2"));
        assert!(out.contains("Size (in LBAs):                        131072 "));
        assert!(out.contains("Size (in LBAs):                        262144 "));
        assert!(out.contains("LBA Format #00: Data Size:   512"));
        assert!(out.contains("LBA Format #00: Data Size:  4096"));
        assert!(out.contains("Health Information"), "{out}");
        for n in &ns {
            let uuid = n["uuid"].as_str().unwrap();
            let nguid = n["nguid"].as_str().unwrap();
            assert!(out.contains(&format!("UUID:                                  {uuid}")));
            assert!(out.contains(&format!("NGUID:                                 {nguid}")));
        }
        t.wait_no_controllers(at);
    }
}

#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh) and free hugepages at /dev/hugepages; run with --ignored"]
fn discover_with_and_without_host_nqn() {
    let spdk = spdk_dir("discover_with_and_without_host_nqn");
    require_hugepages("discover_with_and_without_host_nqn", "spdk_nvme_discover");
    let _one = SERIAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let t = Target::start(&spdk, "discover");
    // spdk_nvme_discover prints the log page and then keeps watching for
    // discovery-log-change events until SIGINT; stdout line-buffered so
    // the page can be read while it runs.
    for (host, expect_restricted) in [(None, false), (Some(HOST), true)] {
        let at = t.log_len();
        let mut cmd = Command::new("stdbuf");
        cmd.arg("-oL")
            .arg(t.spdk.join("build/bin/spdk_nvme_discover"))
            .args(["-r", &t.trid(DISCOVERY, None)]);
        if let Some(h) = host {
            cmd.args(["-H", h]);
        }
        let mut p = SpdkProc::spawn(cmd, t.dir.path("discover.out"));
        p.wait_output(
            "Current Discovery Subsystem",
            Duration::from_secs(60),
            &t.nvmfd,
        );
        p.signal(libc::SIGINT);
        let (st, out) = p.finish(Duration::from_secs(20), &t.nvmfd);
        assert!(st.success(), "spdk_nvme_discover exited {st}\n{out}");
        let records = if expect_restricted { 4 } else { 3 };
        assert!(
            out.contains(&format!("Number of Records:  {records}")),
            "{out}"
        );
        let nqns: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("NVM Subsystem Qualified Name:"))
            .map(str::trim)
            .collect();
        assert!(nqns.contains(&OPEN) && nqns.contains(&FUZZ), "{nqns:?}");
        assert!(nqns.contains(&DISCOVERY), "{nqns:?}");
        assert_eq!(nqns.contains(&RESTRICTED), expect_restricted, "{nqns:?}");
        assert_eq!(nqns.len(), records);
        assert!(out.contains("Transport Type:                        3 (TCP)"));
        assert!(out.contains(&format!(
            "Transport Service Identifier:          {}",
            t.port
        )));
        t.wait_no_controllers(at);
        if let Some(h) = host {
            assert!(t.nvmfd.logged(&format!("subnqn={DISCOVERY} hostnqn={h}")));
        }
    }
}

#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh); run with --ignored"]
fn nvme_fuzz_runs_to_its_end() {
    let spdk = spdk_dir("nvme_fuzz_runs_to_its_end");
    let fuzz = spdk.join("test/app/fuzz/nvme_fuzz/nvme_fuzz");
    assert!(
        fuzz.is_file(),
        "nvme_fuzz_runs_to_its_end: no {} (make -C test/app/fuzz/nvme_fuzz in the SPDK tree)",
        fuzz.display()
    );
    let _one = SERIAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Target::start(&spdk, "fuzz");
    // (subsystem, seed, admin commands too); -U: no IOMMU check (we use no
    // device). Admin fuzzing only on the one-namespace subsystem.
    let runs = [
        (FUZZ, "1", true),
        (FUZZ, "7", false),
        (OPEN, "2", false),
        (DISCOVERY, "3", true),
    ];
    for (i, (nqn, seed, admin)) in runs.into_iter().enumerate() {
        let at = t.log_len();
        let mut cmd = Command::new(&fuzz);
        cmd.args(["-m", "0x1", "--no-huge", "-s", "512"])
            .arg("-r")
            .arg(t.dir.path("fuzz.sock"))
            .args(["--disable-cpumask-locks", "-U", "-t", "3", "-S", seed]);
        if admin {
            cmd.arg("-a");
        }
        cmd.args(["-F", &t.trid(nqn, None)]);
        let mut p = SpdkProc::spawn(cmd, t.dir.path(&format!("fuzz{i}.out")));
        let (st, out) = p.finish(Duration::from_secs(60), &t.nvmfd);
        if nqn == DISCOVERY {
            // nvme_fuzz fuzzes namespaces; the discovery controller has
            // none, so it connects, finds nothing and stops.
            assert!(out.contains("No valid NVMe Namespaces to fuzz"), "{out}");
        } else {
            assert!(
                st.success() && out.contains("Fuzzing completed"),
                "nvme_fuzz {nqn} seed {seed} exited {st}\n{}",
                tail(&out, 60)
            );
            assert!(!out.contains("has timed out"), "{}", tail(&out, 60));
        }
        t.wait_no_controllers(at);
        assert!(t.nvmfd.running(), "nvmfd died");
    }
    // Still serving.
    let (st, out) = t.perf(
        &t.trid(OPEN, None),
        &["-w", "randrw", "-M", "50"],
        "perf.out",
    );
    assert_perf_ok("after nvme_fuzz", st, &out, &t);
}

/// SPDK's own fused-command test app (`test/nvme/fused_ordering`, SPDK's
/// host library): 1024 rounds of 8 writes too big for the capsule (R2T)
/// followed by a fused Compare (FUSE first) and, after a growing number of
/// polls, its Write (FUSE second), each round on namespace 1 (malloc): every
/// command must succeed (the app exits non-zero on any error). The
/// regression it was written for (SPDK issue 2428) is a fetched write
/// slipping in between the two halves of the pair.
#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh) with test/nvme/fused_ordering built; run with --ignored"]
fn fused_ordering_compare_and_write() {
    let spdk = spdk_dir("fused_ordering_compare_and_write");
    let bin = spdk.join("test/nvme/fused_ordering/fused_ordering");
    assert!(
        bin.is_file(),
        "fused_ordering_compare_and_write: no {} (make -C test/nvme/fused_ordering in the SPDK tree)",
        bin.display()
    );
    let _one = SERIAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let mut t = Target::start(&spdk, "fused");
    let mut cmd = Command::new(&bin);
    cmd.args([
        "-c",
        "0x1",
        "--no-huge",
        "-s",
        "512",
        "-r",
        &t.trid(OPEN, None),
    ]);
    let mut p = SpdkProc::spawn(cmd, t.dir.path("fused.out"));
    let (st, out) = p.finish(Duration::from_secs(180), &t.nvmfd);
    assert!(
        st.success() && out.contains("fused_ordering(1023)"),
        "fused_ordering exited {st}\n{}",
        tail(&out, 40)
    );
    assert!(t.nvmfd.running(), "nvmfd died");
}

/// `scripts/rpc.py -s SOCK args...` (bounded), its stdout parsed as JSON
/// when there is any.
fn rpc_py(spdk: &Path, sock: &Path, args: &[&str]) -> Value {
    let mut cmd = Command::new("python3");
    cmd.arg(spdk.join("scripts/rpc.py"))
        .arg("-s")
        .arg(sock)
        .args(args);
    let start = Instant::now();
    let out = nvmf_testkit::run_bounded(cmd, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "rpc.py {args:?} failed after {:?}:\n{}{}",
        start.elapsed(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&s).unwrap_or(Value::String(s.trim().to_string()))
}

#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh); run with --ignored"]
fn spdk_app_attaches_and_detaches() {
    let spdk = spdk_dir("spdk_app_attaches_and_detaches");
    assert!(
        spdk.join("build/bin/spdk_tgt").is_file(),
        "spdk_app_attaches_and_detaches: no {}/build/bin/spdk_tgt (build SPDK's app too)",
        spdk.display()
    );
    let _one = SERIAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let t = Target::start(&spdk, "app");
    let sock = t.dir.path("tgt.sock");
    let mut cmd = t.bin("spdk_tgt");
    cmd.args([
        "-m",
        "0x1",
        "--no-huge",
        "-s",
        "1024",
        "--disable-cpumask-locks",
    ])
    .arg("-r")
    .arg(&sock);
    let mut app = SpdkProc::spawn(cmd, t.dir.path("spdk_tgt.out"));
    // rpc.py retries the socket until the app listens.
    let v = rpc_py(&spdk, &sock, &["-r", "100", "spdk_get_version"]);
    println!("spdk_tgt {}", v["version"]);

    let port = t.port.to_string();
    let attach = |name: &str, nqn: &str, host: Option<&str>| -> Value {
        let mut a = vec![
            "bdev_nvme_attach_controller",
            "-b",
            name,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &port,
            "-f",
            "ipv4",
            "-n",
            nqn,
        ];
        if let Some(h) = host {
            a.extend(["-q", h]);
        }
        rpc_py(&spdk, &sock, &a)
    };

    // Without a host NQN (SPDK then sends its generated one), both
    // namespaces become bdevs with nvmfd's geometry and identifiers.
    let at = t.log_len();
    let names = attach("N", OPEN, None);
    assert_eq!(names, "Nn1 Nn2");
    let bdevs = rpc_py(&spdk, &sock, &["bdev_get_bdevs"]);
    let ns = t.namespaces(OPEN);
    for (name, bs, blocks, nsid) in [("Nn1", 512, 131072, 1), ("Nn2", 4096, 262144, 2)] {
        let b = bdevs
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .unwrap_or_else(|| panic!("no bdev {name}: {bdevs}"));
        assert_eq!(b["block_size"], bs, "{b}");
        assert_eq!(b["num_blocks"], blocks, "{b}");
        let n = ns.iter().find(|n| n["nsid"] == nsid).unwrap();
        // SPDK's bdev_nvme names the bdev by the NGUID when the namespace
        // reports one; nvmfd's NGUID is the bdev UUID when the bdev has one.
        let bdev_uuid = b["uuid"].as_str().unwrap();
        assert_eq!(
            bdev_uuid,
            nguid_as_uuid(n["nguid"].as_str().unwrap()),
            "{b}\n{n}"
        );
        if nsid == 1 {
            assert_eq!(bdev_uuid, MALLOC0_UUID);
            assert_eq!(n["uuid"], MALLOC0_UUID);
        }
    }

    // I/O through the attached bdev: spdk_tgt re-exports Nn1 over its own
    // NVMe/TCP target and spdk_nvme_perf drives it (perf → spdk_tgt's
    // bdev_nvme → nvmfd).
    let relay_port = free_port().to_string();
    let relay = "nqn.2016-06.io.spdk:relay";
    rpc_py(&spdk, &sock, &["nvmf_create_transport", "-t", "TCP"]);
    rpc_py(&spdk, &sock, &["nvmf_create_subsystem", relay, "-a"]);
    rpc_py(&spdk, &sock, &["nvmf_subsystem_add_ns", relay, "Nn1"]);
    rpc_py(
        &spdk,
        &sock,
        &[
            "nvmf_subsystem_add_listener",
            relay,
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &relay_port,
            "-f",
            "ipv4",
        ],
    );
    let relay_trid =
        format!("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{relay_port} subnqn:{relay}");
    let (st, out) = t.perf(
        &relay_trid,
        &["-w", "randrw", "-M", "50", "-c", "0x2"],
        "relay.out",
    );
    assert_perf_ok("through spdk_tgt's bdev_nvme", st, &out, &t);
    let stat = rpc_py(&spdk, &sock, &["bdev_get_iostat", "--names", "Nn1"]);
    let s = &stat["bdevs"][0];
    assert!(
        s["num_read_ops"].as_u64().unwrap() > 0 && s["num_write_ops"].as_u64().unwrap() > 0,
        "{stat}"
    );
    rpc_py(&spdk, &sock, &["nvmf_delete_subsystem", relay]);

    // Detach: bounded (rpc_py's limit), and nvmfd tears the controller down.
    let start = Instant::now();
    rpc_py(&spdk, &sock, &["bdev_nvme_detach_controller", "N"]);
    println!("detach took {:?}", start.elapsed());
    t.wait_no_controllers(at);
    assert!(t.nvmfd.logged("reason=\"admin queue closed\""));

    // With a host NQN, on the subsystem that lists it.
    let at = t.log_len();
    let names = attach("R", RESTRICTED, Some(HOST));
    assert_eq!(names, "Rn1");
    assert!(t
        .nvmfd
        .logged(&format!("subnqn={RESTRICTED} hostnqn={HOST}")));
    rpc_py(&spdk, &sock, &["bdev_nvme_detach_controller", "R"]);
    t.wait_no_controllers(at);

    // Clean shutdown on SIGINT.
    app.signal(libc::SIGINT);
    let (st, out) = app.finish(Duration::from_secs(30), &t.nvmfd);
    assert!(st.success(), "spdk_tgt exited {st}\n{}", tail(&out, 40));
}

/// TLS 1.3 with a PSK interchange key, as SPDK's host does it: `spdk_nvme_perf -S ssl
/// --psk-path FILE` (the posix sock module's ssl implementation) offers the version-0 identity
/// `NVMe0R0x <hostnqn> <subnqn>` with a TLS PSK derived with RFC 8446's HKDF labels, which
/// differs from the Linux host's key for the same identity (docs/TLS.md). A SHA-256 key
/// (TLS_AES_128_GCM_SHA256) and a SHA-384 key (TLS_AES_256_GCM_SHA384) do I/O; another key for
/// the same host and a clear-text host are refused.
#[test]
#[ignore = "needs a built SPDK v26.05 (NVMFD_SPDK_DIR, see ../shared/tools/spdk-build.sh); run with --ignored"]
fn perf_over_tls_with_a_psk() {
    use nvmf_core::tls::psk::{ConfiguredPsk, PskHash};
    let spdk = spdk_dir("perf_over_tls_with_a_psk");
    let _one = SERIAL_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    let key384 = ConfiguredPsk::new(Some(PskHash::Sha384), &[0x38; 48])
        .unwrap()
        .to_interchange();
    let t = Target::start_tls(&spdk, "tls", &[(HOST, KEY), (HOST384, &key384)]);
    // The host's copies of the keys (SPDK reads the file given to --psk-path).
    let host_key = |name: &str, key: &str| -> String {
        use std::os::unix::fs::PermissionsExt;
        let p = t.dir.path(name);
        std::fs::write(&p, key).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p.to_str().unwrap().to_string()
    };
    let k256 = host_key("host256.psk", KEY);
    let k384 = host_key("host384.psk", &key384);
    let wrong = host_key(
        "wrong.psk",
        &ConfiguredPsk::new(Some(PskHash::Sha256), &[0x42; 32])
            .unwrap()
            .to_interchange(),
    );
    let ssl = |key: &str| -> Vec<String> {
        ["-S", "ssl", "--psk-path", key]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };

    for (what, host, key, suite) in [
        ("SHA-256 key", HOST, &k256, "TLS_AES_128_GCM_SHA256"),
        ("SHA-384 key", HOST384, &k384, "TLS_AES_256_GCM_SHA384"),
    ] {
        let at = t.log_len();
        let mut args = vec!["-w".to_string(), "randrw".into(), "-M".into(), "50".into()];
        args.extend(ssl(key));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (st, out) = t.perf(&t.trid(TLS_SUB, Some(host)), &args, "tls.out");
        assert_perf_ok(&format!("TLS, {what}"), st, &out, &t);
        t.wait_no_controllers(at);
        let logs = t.nvmfd.log.lock().unwrap()[at..].join("\n");
        let established = format!(
            "TLS 1.3 session established ({suite}, identity version 0, RFC 8446 HKDF labels)"
        );
        assert!(
            logs.lines()
                .any(|l| l.contains(&established) && l.contains(host)),
            "{what}: no {established:?} line for {host}:\n{logs}"
        );
    }

    // Another key for the same host: the handshake fails, nothing attaches (SPDK's perf
    // still exits 0 then: the output is the signal).
    let at = t.log_len();
    let mut args = vec!["-w", "randread"];
    let w = ssl(&wrong);
    args.extend(w.iter().map(String::as_str));
    let (_st, out) = t.perf(&t.trid(TLS_SUB, Some(HOST)), &args, "wrong.out");
    assert!(out.contains("No valid NVMe controllers"), "{out}");
    let logs = t.nvmfd.log.lock().unwrap()[at..].join("\n");
    assert!(logs.contains("binder does not verify"), "{logs}");
    assert!(!logs.contains("controller created"), "{logs}");

    // Clear text on the TLS listener: refused before any NVMe/TCP PDU is read.
    let at = t.log_len();
    let (_st, out) = t.perf(
        &t.trid(TLS_SUB, Some(HOST)),
        &["-w", "randread"],
        "clear.out",
    );
    assert!(out.contains("No valid NVMe controllers"), "{out}");
    let logs = t.nvmfd.log.lock().unwrap()[at..].join("\n");
    assert!(logs.contains("refused: a clear-text ICReq"), "{logs}");
}
