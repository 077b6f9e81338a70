//! Harness for nvmfd's kernel-host interop tests.
//!
//! The Linux kernel's NVMe/TCP host driver, nvme-cli and fio are the judges of protocol
//! correctness. They run in a throw-away QEMU guest (`testbed/nvmfd-testbed run`) whose
//! network reaches only the host ports a test names; `nvmfd` runs on the host, started
//! from this workspace's target directory with an SPDK `save_config`-shaped JSON file.
//!
//! Guests boot Debian 12's 6.1 kernel unless a test asks for another one
//! ([`run_guest_on`] with a [`Kernel`]); [`run_guest_tls`] boots the 6.12 kernel with the trixie
//! TLS userland (nvme-cli 2.13, keyctl, tlshd under `/opt/trixie`); [`multipath`] holds the multipath/HA pieces
//! (several gateways on a shared file, a TCP forwarder a test can cut); [`rdma`] joins two
//! guests with soft-RoCE (the kernel NVMe/RDMA target in one, a host scenario in the other);
//! [`rdma_case`] runs one such two-guest case from start to verdict.
//!
//! The tests are opt-in: without `NVMFD_INTEROP=1` each one prints a "skipped" line and
//! passes. With it, a missing prerequisite (testbed, nvmfd binary) is a failure.
//!
//! Guest scenarios live in `tests/interop/*.sh`; they may ask the host to check the daemon
//! at a given point ("checkpoints"): the guest writes `/job/cp-NAME.req` into its 9p job
//! directory, the driver answers in `/job/cp-NAME.resp` with `ok ...` or a failure reason.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

pub mod multipath;
pub use multipath::{Forwarder, Gateway, Kernel};
pub mod rdma;
pub use rdma::{run_guest_rxe, ListenGuest, RxeLink};
pub mod rdma_case;
pub use rdma_case::{guest_passed, RdmaCase};

/// Environment switch that enables the interop tests.
pub const SWITCH: &str = "NVMFD_INTEROP";

/// Host identity every allowed guest connection uses (`--hostnqn`/`--hostid`).
pub const HOST_ID: &str = "6f1b1f3c-0c52-4c6e-9d1e-6e7666d00001";
/// A host identity that is never on an allow list.
pub const OTHER_HOST_ID: &str = "6f1b1f3c-0c52-4c6e-9d1e-6e7666d0dead";

pub fn host_nqn(id: &str) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:{id}")
}

/// Writes to the real stderr, bypassing the test harness' output capture, so progress and
/// skip notices show up in `cargo test` output.
pub fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Starts an interop test: `None` (after printing why) when the switch is off; otherwise
/// serializes with the other interop tests of this process (one guest at a time) and makes
/// sure the testbed is prepared. Panics if a prerequisite is missing.
pub fn begin(test: &str) -> Option<MutexGuard<'static, ()>> {
    if std::env::var(SWITCH).as_deref() != Ok("1") {
        say(&format!(
            "interop {test}: skipped: set {SWITCH}=1 to run the kernel-host interop tests (scripts/test.sh does)"
        ));
        return None;
    }
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    prepare_testbed();
    say(&format!("interop {test}: running"));
    Some(guard)
}

/// The repository root (two levels above this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

pub fn testbed() -> PathBuf {
    repo_root().join("testbed/nvmfd-testbed")
}

fn prepare_testbed() {
    prepare_kernel(Kernel::Debian12);
}

/// Runs `testbed/nvmfd-testbed prepare` with `envs`; `what` names the command in the error.
fn testbed_prepare(envs: &[(&str, &str)], what: &str) -> Result<(), String> {
    let out = Command::new("bash")
        .envs(envs.iter().copied())
        .arg(testbed())
        .arg("prepare")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", testbed().display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{what}` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Prepares (fetches, once per process) the testbed kernel `k`; panics if it cannot.
pub fn prepare_kernel(k: Kernel) {
    static DONE: [OnceLock<Result<(), String>>; 2] = [OnceLock::new(), OnceLock::new()];
    let res = DONE[k as usize].get_or_init(|| {
        testbed_prepare(
            &[("NVMFD_TESTBED_KERNEL", k.series())],
            "testbed/nvmfd-testbed prepare",
        )
        .map_err(|e| {
            format!("{e}\n(as root: testbed/nvmfd-testbed prepare --install-deps, or run scripts/test.sh)")
        })
    });
    if let Err(e) = res {
        panic!("{SWITCH}=1 but the testbed is not usable: {e}");
    }
}

/// Kernel modules the TLS guest image carries beyond the defaults (kTLS, AES-GCM and ChaCha20-Poly1305 for tlshd,
/// nvmet-tcp for testbed/selftest-tls.sh). One list for every TLS guest, so they all share one
/// cached image (`initrd-tls-*`; building another variant would evict it).
pub const TLS_GUEST_MODULES: &str = "tls nvmet-tcp gcm aesni-intel ghash-generic aes-generic chacha20poly1305 chacha-x86_64 poly1305-x86_64";

/// The testbed's environment for a TLS guest (`NVMFD_TESTBED_TLS=1`, 6.12, [`TLS_GUEST_MODULES`]).
pub fn tls_testbed_env() -> [(&'static str, &'static str); 3] {
    [
        ("NVMFD_TESTBED_TLS", "1"),
        ("NVMFD_TESTBED_KERNEL", Kernel::Backports612.series()),
        ("NVMFD_TESTBED_EXTRA_MODULES", TLS_GUEST_MODULES),
    ]
}

/// Prepares (once per process) the 6.12 kernel with the TLS userland image; panics if it cannot.
pub fn prepare_tls() {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    let res = DONE.get_or_init(|| {
        testbed_prepare(
            &tls_testbed_env(),
            "NVMFD_TESTBED_TLS=1 testbed/nvmfd-testbed prepare",
        )
    });
    if let Err(e) = res {
        panic!("{SWITCH}=1 but the TLS testbed is not usable: {e}");
    }
}

/// The `nvmfd` binary under test (nvmf-testkit's: `$NVMFD_BIN`, else
/// `target/<profile>/nvmfd`, built if missing), with a warning when a source file is newer.
pub fn nvmfd_binary() -> PathBuf {
    let bin = nvmf_testkit::bins::nvmfd();
    if let Some(newer) = newest_source_newer_than(&bin) {
        say(&format!(
            "interop: warning: {} is older than {} (rebuild with `cargo build --workspace`)",
            bin.display(),
            newer.display()
        ));
    }
    bin
}

fn newest_source_newer_than(bin: &Path) -> Option<PathBuf> {
    let built = fs::metadata(bin).and_then(|m| m.modified()).ok()?;
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    // library/binary sources only (crates/*/src), not tests, examples, fuzz targets or the
    // test-only crates
    let mut stack: Vec<PathBuf> = fs::read_dir(repo_root().join("crates"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| !e.path().ends_with("nvmf-interop") && !e.path().ends_with("nvmf-testkit"))
        .map(|e| e.path().join("src"))
        .collect();
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
                    if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                        newest = Some((t, p));
                    }
                }
            }
        }
    }
    newest.filter(|(t, _)| *t > built).map(|(_, p)| p)
}

/// A fresh work directory for one test: `target/nvmf-interop/<name>` (kept for debugging).
pub fn work_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let dir = base.join("nvmf-interop").join(name);
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create work dir");
    dir
}

pub use nvmf_testkit::free_port;

// ------------------------------------------------------------------ config --

pub struct Malloc {
    pub name: &'static str,
    pub num_blocks: u64,
    pub block_size: u32,
}

pub struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    /// (nsid, bdev name)
    pub namespaces: Vec<(u32, &'static str)>,
}

/// SPDK `save_config`-shaped configuration: malloc bdevs, a TCP transport, the subsystems
/// with their namespaces and hosts, and one listener per subsystem plus the discovery
/// subsystem on 127.0.0.1:`port`.
pub fn spdk_config(port: u16, bdevs: &[Malloc], subsystems: &[Subsystem]) -> Value {
    let listen = json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": port.to_string()});
    let bdev_cfg: Vec<Value> = bdevs
        .iter()
        .map(|b| json!({"method": "bdev_malloc_create", "params": {"name": b.name, "num_blocks": b.num_blocks, "block_size": b.block_size}}))
        .collect();
    let mut nvmf = vec![json!({"method": "nvmf_create_transport", "params": {"trtype": "TCP"}})];
    for s in subsystems {
        nvmf.push(json!({"method": "nvmf_create_subsystem", "params": {
            "nqn": s.nqn, "serial_number": s.serial, "model_number": s.model,
            "allow_any_host": s.allow_any_host}}));
        for (nsid, bdev) in &s.namespaces {
            nvmf.push(json!({"method": "nvmf_subsystem_add_ns", "params": {
                "nqn": s.nqn, "namespace": {"bdev_name": bdev, "nsid": nsid}}}));
        }
        for h in &s.hosts {
            nvmf.push(
                json!({"method": "nvmf_subsystem_add_host", "params": {"nqn": s.nqn, "host": h}}),
            );
        }
        nvmf.push(json!({"method": "nvmf_subsystem_add_listener", "params": {
            "nqn": s.nqn, "listen_address": listen.clone()}}));
    }
    nvmf.push(json!({"method": "nvmf_subsystem_add_listener", "params": {
        "nqn": "nqn.2014-08.org.nvmexpress.discovery", "listen_address": listen}}));
    json!({"subsystems": [
        {"subsystem": "bdev", "config": bdev_cfg},
        {"subsystem": "nvmf", "config": nvmf},
    ]})
}

// ------------------------------------------------------------------- nvmfd --

use nvmf_testkit::{die_with_parent, stop_child};
const SIGTERM: i32 = libc::SIGTERM;

/// An `nvmfd` process on the host (an nvmf-testkit [`Daemon`](nvmf_testkit::Daemon) in the
/// test's work directory, output kept in `nvmfd.log`), stopped when dropped (SIGTERM, 3 s,
/// then SIGKILL).
pub struct Nvmfd {
    d: nvmf_testkit::Daemon,
    pub port: u16,
    pub log_path: PathBuf,
    /// The daemon's JSON-RPC socket (`-r`).
    pub rpc_socket: PathBuf,
}

impl Nvmfd {
    /// Writes `config` to `dir/nvmfd.json`, starts `nvmfd -c` on it (output in
    /// `dir/nvmfd.log`) and waits (30 s at most) for its `listening on ...:port` line.
    pub fn start(dir: &Path, config: &Value, port: u16) -> Nvmfd {
        Nvmfd::start_with(dir, config, port, &[])
    }

    /// [`Nvmfd::start`] with more command-line arguments (e.g. `--metrics ADDR`).
    pub fn start_with(dir: &Path, config: &Value, port: u16, args: &[&str]) -> Nvmfd {
        Nvmfd::start_in(dir, config, port, args, None)
    }

    /// [`Nvmfd::start_with`], in network namespace `netns` when given (an
    /// nvmf-testkit [`CuttableNetns`](nvmf_testkit::CuttableNetns)).
    pub fn start_in(
        dir: &Path,
        config: &Value,
        port: u16,
        args: &[&str],
        netns: Option<&str>,
    ) -> Nvmfd {
        nvmfd_binary(); // the staleness warning
        let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
        let mut b = nvmf_testkit::Daemon::builder(serde_json::to_string_pretty(config).unwrap());
        if let Some(ns) = netns {
            b = b.in_netns(ns);
        }
        let d = b
            .in_dir(dir)
            .args(args)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", &rust_log)
            .listening(&[port])
            .ready_within(Duration::from_secs(30))
            .stop_grace(Duration::from_secs(3))
            .start();
        Nvmfd {
            port,
            log_path: d.log_path.clone().expect("nvmfd.log"),
            rpc_socket: d.rpc_socket.clone(),
            d,
        }
    }

    /// Runs `nvmf rpc -s SOCKET ARGS...` (the workspace's `nvmf` binary) with a
    /// 30 s bound; Ok(stdout) on exit status 0, Err(stdout + stderr) otherwise.
    pub fn rpc(&self, args: &[&str]) -> Result<String, String> {
        self.d.rpc(args)
    }

    /// `kill -9` (a crash: no teardown, sockets reset by the kernel); reaps it.
    pub fn kill_hard(&mut self) {
        self.d.kill();
    }

    pub fn is_running(&mut self) -> bool {
        self.d.running()
    }

    /// Sends signal `sig` (e.g. `libc::SIGSTOP`, `libc::SIGCONT`).
    pub fn signal(&mut self, sig: i32) {
        self.d.signal(sig);
    }

    /// Waits up to `limit` for the daemon to exit on its own; its exit status.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        self.d.wait_exit(limit)
    }

    /// The daemon's log so far, with ANSI colour sequences removed.
    pub fn log(&self) -> String {
        strip_ansi(&fs::read_to_string(&self.log_path).unwrap_or_default())
    }

    /// The values of every `active_controllers=N` the daemon logged, in order.
    pub fn active_controllers(&self) -> Vec<u64> {
        active_controllers_in(&self.log())
    }

    /// Waits up to `timeout` for the last logged `active_controllers=` value to be `want`.
    pub fn wait_active_controllers(&self, want: u64, timeout: Duration) -> Result<(), String> {
        let until = Instant::now() + timeout;
        loop {
            let v = self.active_controllers();
            if v.last() == Some(&want) {
                return Ok(());
            }
            if Instant::now() > until {
                let log = self.log();
                let last = log
                    .lines()
                    .rev()
                    .find(|l| l.contains("active_controllers="))
                    .unwrap_or("(nvmfd logged no active_controllers= line)");
                return Err(format!(
                    "after {timeout:?} the last nvmfd controller line is: {}",
                    last.trim()
                ));
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.log(), n)
    }

    /// Checks the daemon is still up and logged no panic; returns a description otherwise.
    pub fn health(&mut self) -> Result<(), String> {
        let log = self.log();
        if let Some(l) = log.lines().find(|l| l.contains("panicked at")) {
            return Err(format!("nvmfd panicked: {l}"));
        }
        if let Some(st) = self.d.try_exit() {
            return Err(format!("nvmfd exited: {:?}", Some(st)));
        }
        Ok(())
    }
}

pub fn active_controllers_in(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|l| {
            let at = l.rfind("active_controllers=")? + "active_controllers=".len();
            let digits: String = l[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse().ok()
        })
        .collect()
}

pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' && it.peek() == Some(&'[') {
            it.next();
            for c in it.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ------------------------------------------------------------------- guest --

/// What a guest run left behind.
pub struct GuestRun {
    /// The scenario's exit status (124: timeout, 125: guest died; see testbed/README.md).
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    /// `testbed/nvmfd-testbed`'s own messages (timings, timeouts, console tail).
    pub testbed_log: String,
    /// The guest kernel log at the end of the scenario.
    pub dmesg: String,
    pub wall: Duration,
    pub job_dir: PathBuf,
}

impl GuestRun {
    /// Everything needed to understand a failure.
    pub fn report(&self, nvmfd: Option<&Nvmfd>) -> String {
        let mut r = format!(
            "guest scenario exit status {} after {:.1} s (job dir {})\n---- guest output ----\n{}",
            self.status,
            self.wall.as_secs_f64(),
            self.job_dir.display(),
            self.stdout
        );
        if !self.stderr.trim().is_empty() {
            r += &format!("---- guest stderr ----\n{}\n", self.stderr);
        }
        r += &format!("---- testbed ----\n{}\n", tail(&self.testbed_log, 60));
        r += &format!("---- guest dmesg (tail) ----\n{}\n", tail(&self.dmesg, 40));
        if let Some(d) = nvmfd {
            r += &format!(
                "---- nvmfd log (tail; full log {}) ----\n{}\n",
                d.log_path.display(),
                d.log_tail(80)
            );
        }
        r
    }
}

/// Runs `tests/interop/<script>` in a fresh guest that may reach the given host ports,
/// on Debian 12's 6.1 kernel (`NVMFD_INTEROP_KERNEL=6.12` runs every such scenario on the
/// bookworm-backports 6.12 kernel instead).
/// `env` is exported to the script; `on_checkpoint(name, detail)` answers the script's
/// checkpoints (`ok ...` = pass). Bounded by `timeout` (qemu) plus a grace period here.
pub fn run_guest(
    dir: &Path,
    script: &str,
    host_ports: &[u16],
    env: &[(&str, String)],
    timeout: Duration,
    on_checkpoint: impl FnMut(&str, &str) -> String,
) -> GuestRun {
    run_guest_on(
        Kernel::from_env(),
        dir,
        script,
        host_ports,
        env,
        timeout,
        on_checkpoint,
    )
}

/// `--put-bin B` for each of `bins`: testbed arguments that ship host programs into a guest.
pub(crate) fn put_bin_args(bins: &[&Path]) -> Vec<std::ffi::OsString> {
    bins.iter()
        .flat_map(|b| ["--put-bin".into(), b.as_os_str().to_os_string()])
        .collect()
}

/// [`run_guest_on`] with host programs shipped into the guest (`--put-bin`: each as
/// `/job/NAME`, with the shared libraries the guest image lacks), e.g. this workspace's `nvmf`.
#[allow(clippy::too_many_arguments)]
pub fn run_guest_with_bins(
    kernel: Kernel,
    dir: &Path,
    script: &str,
    host_ports: &[u16],
    env: &[(&str, String)],
    bins: &[&Path],
    timeout: Duration,
    on_checkpoint: impl FnMut(&str, &str) -> String,
) -> GuestRun {
    prepare_kernel(kernel);
    let tb_env = [("NVMFD_TESTBED_KERNEL", kernel.series())];
    let tb_args = put_bin_args(bins);
    guest(
        &tb_env,
        &[],
        &tb_args,
        dir,
        script,
        host_ports,
        env,
        timeout,
        on_checkpoint,
    )
}

/// [`run_guest`] on the guest kernel `kernel` (prepared first if needed). The guest also
/// gets `tests/interop/mp-lib.sh` (multipath helpers) next to `lib.sh`.
pub fn run_guest_on(
    kernel: Kernel,
    dir: &Path,
    script: &str,
    host_ports: &[u16],
    env: &[(&str, String)],
    timeout: Duration,
    on_checkpoint: impl FnMut(&str, &str) -> String,
) -> GuestRun {
    prepare_kernel(kernel);
    let tb_env = [("NVMFD_TESTBED_KERNEL", kernel.series())];
    guest(
        &tb_env,
        &[],
        &[],
        dir,
        script,
        host_ports,
        env,
        timeout,
        on_checkpoint,
    )
}

/// [`run_guest`] on the 6.12 kernel with the trixie TLS userland (`NVMFD_TESTBED_TLS=1`,
/// [`TLS_GUEST_MODULES`]): `/opt/trixie/bin/{nvme,keyctl,tlshd}` in the guest, and
/// `tests/interop/tls-lib.sh` (TLS helpers) next to `lib.sh`.
pub fn run_guest_tls(
    dir: &Path,
    script: &str,
    host_ports: &[u16],
    env: &[(&str, String)],
    timeout: Duration,
    on_checkpoint: impl FnMut(&str, &str) -> String,
) -> GuestRun {
    prepare_tls();
    guest(
        &tls_testbed_env(),
        &["tls-lib.sh"],
        &[],
        dir,
        script,
        host_ports,
        env,
        timeout,
        on_checkpoint,
    )
}

/// [`run_guest_tls`] with host programs shipped into the guest (`--put-bin`, as
/// [`run_guest_with_bins`]): e.g. `nvmfd` and `nvmf`, to run both ends under the 6.12 kernel's TLS.
pub fn run_guest_tls_with_bins(
    dir: &Path,
    script: &str,
    env: &[(&str, String)],
    bins: &[&Path],
    timeout: Duration,
) -> GuestRun {
    prepare_tls();
    let tb_args = put_bin_args(bins);
    guest(
        &tls_testbed_env(),
        &["tls-lib.sh"],
        &tb_args,
        dir,
        script,
        &[],
        env,
        timeout,
        |_, _| "ok".to_string(),
    )
}

/// Builds example `name` of workspace package `package` (the profile of this test build) and
/// returns its path; `env_override` names a variable that points at a prebuilt one instead.
pub fn example_binary(package: &str, name: &str, env_override: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env_override) {
        return PathBuf::from(p);
    }
    let dir = nvmf_testkit::bins::profile_dir();
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", package, "--example", name]);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let st = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {name}: {e}"));
    let p = dir.join("examples").join(name);
    assert!(
        st.success() && p.is_file(),
        "`cargo build -p {package} --example {name}` did not put it at {} (or set {env_override})",
        p.display()
    );
    p
}

/// One `nvmfd-testbed run` with `tb_env` in the testbed's environment; `puts` are more files of
/// `tests/interop` for `/job`; `tb_args` are more `run` options (e.g. `--link ... --rxe`).
#[allow(clippy::too_many_arguments)]
fn guest(
    tb_env: &[(&str, &str)],
    puts: &[&str],
    tb_args: &[std::ffi::OsString],
    dir: &Path,
    script: &str,
    host_ports: &[u16],
    env: &[(&str, String)],
    timeout: Duration,
    mut on_checkpoint: impl FnMut(&str, &str) -> String,
) -> GuestRun {
    let root = repo_root();
    let job = dir.join("guest");
    fs::create_dir_all(&job).unwrap();
    let mut cmd = Command::new("bash");
    cmd.envs(tb_env.iter().copied())
        .arg(testbed())
        .arg("run")
        .arg("--timeout")
        .arg(timeout.as_secs().to_string())
        .arg("--out")
        .arg(&job)
        .arg("--put")
        .arg(root.join("tests/interop/lib.sh"))
        .arg("--put")
        .arg(root.join("tests/interop/mp-lib.sh"))
        .arg("--env")
        .arg("CHECKPOINTS=1");
    for f in puts {
        cmd.arg("--put").arg(root.join("tests/interop").join(f));
    }
    for p in host_ports {
        cmd.arg("--host-port").arg(p.to_string());
    }
    for (k, v) in env {
        cmd.arg("--env").arg(format!("{k}={v}"));
    }
    cmd.args(tb_args);
    cmd.arg(root.join("tests/interop").join(script));
    let tb_log = dir.join("testbed.log");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&tb_log).unwrap());
    // the testbed traps TERM and kills its qemu
    die_with_parent(&mut cmd, SIGTERM);
    let t0 = Instant::now();
    let mut child = cmd.spawn().expect("spawn testbed/nvmfd-testbed run");
    let deadline = t0 + timeout + Duration::from_secs(60);
    let mut answered = HashSet::new();
    let status = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break st.code().unwrap_or(125);
        }
        if Instant::now() > deadline {
            // the testbed traps TERM and kills its qemu
            stop_child(&mut child, Duration::from_secs(10));
            break 124;
        }
        for e in fs::read_dir(&job).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(cp) = name
                .strip_prefix("cp-")
                .and_then(|n| n.strip_suffix(".req"))
            else {
                continue;
            };
            if !answered.insert(cp.to_string()) {
                continue;
            }
            let detail = fs::read_to_string(e.path()).unwrap_or_default();
            let resp = on_checkpoint(cp, detail.trim());
            let part = job.join(format!("cp-{cp}.resp.part"));
            fs::write(&part, format!("{resp}\n")).unwrap();
            fs::rename(&part, job.join(format!("cp-{cp}.resp"))).unwrap();
        }
        sleep(Duration::from_millis(100));
    };
    let read = |n: &str| fs::read_to_string(job.join(n)).unwrap_or_default();
    GuestRun {
        status,
        stdout: read("stdout"),
        stderr: read("stderr"),
        testbed_log: fs::read_to_string(&tb_log).unwrap_or_default(),
        dmesg: read("dmesg.log"),
        wall: t0.elapsed(),
        job_dir: job,
    }
}

// ----------------------------------------------------------- kernel target --

/// The Linux kernel NVMe/TCP target (nvmet) in a background guest, reachable at
/// 127.0.0.1:`port`; stopped when dropped. For testing the user-space initiator against a
/// reference target. [`KernelTarget::start_rdma`] starts the NVMe/RDMA one on a soft-RoCE link.
pub struct KernelTarget {
    state: PathBuf,
    pub port: u16,
    pub nqn: String,
}

impl KernelTarget {
    /// `testbed/nvmfd-testbed target-start` with `namespaces` RAM namespaces of `size_mb` MiB;
    /// extra options (e.g. `--allow-host NQN`, `--serial SN`) go in `extra`.
    pub fn start(
        dir: &Path,
        port: u16,
        nqn: &str,
        namespaces: u32,
        size_mb: u32,
        extra: &[&str],
    ) -> KernelTarget {
        let state = dir.join("kernel-target");
        let out = Command::new("bash")
            .arg(testbed())
            .args([
                "target-start",
                "--lifetime",
                "900",
                "--ready-timeout",
                "120",
            ])
            .arg("--state")
            .arg(&state)
            .args(["--port", &port.to_string(), "--nqn", nqn])
            .args([
                "--namespaces",
                &namespaces.to_string(),
                "--size",
                &size_mb.to_string(),
            ])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .expect("run testbed/nvmfd-testbed target-start");
        let t = KernelTarget {
            state,
            port,
            nqn: nqn.to_string(),
        };
        assert!(
            out.status.success(),
            "kernel target did not start ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        t
    }

    /// The testbed state directory of this target (`target-status --state DIR`).
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// The target guest's kernel log so far.
    pub fn dmesg(&self) -> String {
        fs::read_to_string(self.state.join("target-dmesg.log")).unwrap_or_default()
    }
}

impl Drop for KernelTarget {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(testbed())
            .arg("target-stop")
            .arg("--state")
            .arg(&self.state)
            .stdin(Stdio::null())
            .output();
    }
}

// ------------------------------------------------------- host commands --

/// The workspace's user-space initiator `nvmf` (nvmf-testkit's: `$NVMF_BIN`, else
/// `target/<profile>/nvmf`, built if missing).
pub fn nvmf_binary() -> PathBuf {
    nvmf_testkit::bins::nvmf()
}

/// What a bounded host command left behind.
pub struct Bounded {
    /// The command line, for messages.
    pub cmdline: String,
    /// Exit status; `None` if it was killed at its time limit (or by a signal).
    pub status: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub wall: Duration,
}

impl Bounded {
    pub fn report(&self) -> String {
        format!(
            "$ {}
exit status {:?}{} after {:.1} s
---- stdout ----
{}---- stderr ----
{}",
            self.cmdline,
            self.status,
            if self.timed_out {
                " (killed at its time limit)"
            } else {
                ""
            },
            self.wall.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }
}

/// Runs `cmd` on the host with stdout/stderr in `dir/TAG.out` / `dir/TAG.err` (kept for
/// debugging; files, so a chatty command cannot block on a full pipe), killing it after
/// `timeout`.
pub fn run_bounded(dir: &Path, tag: &str, cmd: &mut Command, timeout: Duration) -> Bounded {
    let out_path = dir.join(format!("{tag}.out"));
    let err_path = dir.join(format!("{tag}.err"));
    let cmdline = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| {
            let a = a.to_string_lossy();
            if a.contains(' ') || a.is_empty() {
                format!("'{a}'")
            } else {
                a.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ");
    cmd.stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).expect("create .out"))
        .stderr(fs::File::create(&err_path).expect("create .err"));
    die_with_parent(cmd, SIGTERM);
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmdline}: {e}"));
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.code(),
            Ok(None) if t0.elapsed() < timeout => sleep(Duration::from_millis(20)),
            _ => {
                timed_out = true;
                stop_child(&mut child, Duration::from_secs(2));
                break None;
            }
        }
    };
    Bounded {
        cmdline,
        status,
        timed_out,
        stdout: fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: fs::read_to_string(&err_path).unwrap_or_default(),
        wall: t0.elapsed(),
    }
}

/// A loop block device (`losetup -f --show`) over a file, detached when dropped (always,
/// also when the test fails). Needs root.
pub struct LoopDevice {
    pub path: PathBuf,
}

impl LoopDevice {
    /// Attaches `file` to the first free loop device with the given logical sector size.
    pub fn attach(file: &Path, sector_size: u32) -> Result<LoopDevice, String> {
        let out = Command::new("losetup")
            .args(["-f", "--show", "--sector-size", &sector_size.to_string()])
            .arg(file)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run losetup: {e}"))?;
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || !dev.starts_with("/dev/loop") {
            if dev.starts_with("/dev/loop") {
                let _ = Command::new("losetup").arg("-d").arg(&dev).output();
            }
            return Err(format!(
                "`losetup -f --show --sector-size {sector_size} {}` failed ({}): {}{}",
                file.display(),
                out.status,
                dev,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(LoopDevice {
            path: PathBuf::from(dev),
        })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let out = Command::new("losetup")
            .arg("-d")
            .arg(&self.path)
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {
                say(&format!("interop: {} detached", self.path.display()))
            }
            Ok(o) => say(&format!(
                "interop: warning: `losetup -d {}` failed: {}",
                self.path.display(),
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => say(&format!(
                "interop: warning: cannot run `losetup -d {}`: {e}",
                self.path.display()
            )),
        }
    }
}

/// Sends an NVMe/TCP ICReq to 127.0.0.1:`port` and returns the 128-byte ICResp.
pub fn icreq_probe(port: u16) -> std::io::Result<[u8; 128]> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut req = [0u8; 128];
    req[2] = 128; // hlen
    req[4..8].copy_from_slice(&128u32.to_le_bytes()); // plen; PFV 0, HPDA 0, no digests, MAXR2T 0
    s.write_all(&req)?;
    let mut resp = [0u8; 128];
    s.read_exact(&mut resp)?;
    Ok(resp)
}

/// Standard checkpoint answer: the daemon must report zero active controllers within 10 s.
pub fn expect_no_controllers(nvmfd: &Nvmfd) -> String {
    match nvmfd.wait_active_controllers(0, Duration::from_secs(10)) {
        Ok(()) => "ok active_controllers=0".into(),
        Err(e) => format!("fail: {e}"),
    }
}

/// The fio verification scenario (`tests/interop/fio-verify.sh`: 4k randrw 75/25 and 128k
/// sequential write + read with crc32c verify, plain and with header/data digests) run by
/// the kernel host as `HOST_ID` against subsystem `nqn` of `nvmfd` on `port`; the daemon
/// must be back to zero controllers after each disconnect. Ends with [`finish`].
pub fn fio_verify_scenario(test: &str, dir: &Path, port: u16, nqn: &str, nvmfd: &mut Nvmfd) {
    fio_verify_scenario_on(Kernel::from_env(), test, dir, port, nqn, nvmfd)
}

/// [`fio_verify_scenario`] on the guest kernel `kernel`.
pub fn fio_verify_scenario_on(
    kernel: Kernel,
    test: &str,
    dir: &Path,
    port: u16,
    nqn: &str,
    nvmfd: &mut Nvmfd,
) {
    let env = vec![
        ("PORT", port.to_string()),
        ("NQN", nqn.to_string()),
        (
            "FIO_MB",
            std::env::var("NVMFD_INTEROP_FIO_MB").unwrap_or_else(|_| "16".into()),
        ),
        ("HOSTNQN", host_nqn(HOST_ID)),
        ("HOSTID", HOST_ID.to_string()),
    ];
    let run = run_guest_on(
        kernel,
        dir,
        "fio-verify.sh",
        &[port],
        &env,
        Duration::from_secs(300),
        |_, _| expect_no_controllers(nvmfd),
    );
    finish(test, &run, nvmfd, &[]);
}

/// Ends a scenario: prints the report (shown by cargo test on failure), checks the guest's
/// status and the daemon's health, and prints a one-line result on the real stderr.
pub fn finish(test: &str, run: &GuestRun, nvmfd: &mut Nvmfd, host_failures: &[String]) {
    let report = run.report(Some(nvmfd));
    println!("{report}");
    let health = nvmfd.health();
    let ok = run.status == 0 && health.is_ok() && host_failures.is_empty();
    say(&format!(
        "interop {test}: {} (guest status {}, {:.1} s)",
        if ok { "passed" } else { "FAILED" },
        run.status,
        run.wall.as_secs_f64()
    ));
    let mut problems = Vec::new();
    if run.status != 0 {
        let first = run
            .stdout
            .lines()
            .find(|l| l.starts_with("FAIL:"))
            .unwrap_or("(no FAIL line; see the report)");
        problems.push(format!("guest scenario failed: {first}"));
    }
    if let Err(e) = health {
        problems.push(e);
    }
    problems.extend(host_failures.iter().cloned());
    assert!(
        problems.is_empty(),
        "interop {test} failed:\n  {}\n\n{report}",
        problems.join("\n  ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_active_controllers() {
        let log = "\u{1b}[2mT\u{1b}[0m INFO controller 1 created active_controllers=1\n\
                   other line\nINFO controller 1 destroyed reason=disconnect active_controllers=0\n";
        assert_eq!(active_controllers_in(&strip_ansi(log)), vec![1, 0]);
    }

    #[test]
    fn config_has_listeners_and_hosts() {
        let cfg = spdk_config(
            4421,
            &[Malloc {
                name: "Malloc0",
                num_blocks: 8,
                block_size: 512,
            }],
            &[Subsystem {
                nqn: "nqn.x:a".into(),
                serial: "S".into(),
                model: "M".into(),
                allow_any_host: false,
                hosts: vec![host_nqn(HOST_ID)],
                namespaces: vec![(1, "Malloc0")],
            }],
        );
        let s = cfg.to_string();
        assert!(s.contains("\"trsvcid\":\"4421\""));
        assert!(s.contains("nvmf_subsystem_add_host"));
        assert!(s.contains("nqn.2014-08.org.nvmexpress.discovery"));
    }
}
