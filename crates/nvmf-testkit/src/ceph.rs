//! A throw-away one-node Ceph cluster for tests of RBD namespaces: [`CephCluster`] wraps
//! `testbed/ceph-cluster` (one monitor, one manager, bluestore OSDs over sparse files, all on
//! 127.0.0.1, cephx keyring in the cluster's directory) and runs the `rbd`/`ceph` CLIs
//! against it. The cluster is stopped, and its directory removed, when the value is dropped
//! (also when the test panics) and, through the script's watchdog, when the test process
//! exits without dropping it (a `static` shared cluster, or a killed test binary).
//!
//! Ceph comes from Debian's packages (ceph-mon ceph-mgr ceph-osd ceph-common), which
//! scripts/test.sh installs; [`ceph_check`] says whether a test may run: an error naming
//! what is missing, or a skip when `NVMFD_SKIP_CEPH=1` (local runs only).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::text;

/// Environment switch that skips the tests needing a Ceph cluster (local runs only; CI
/// installs Ceph and runs them).
pub const SKIP_SWITCH: &str = "NVMFD_SKIP_CEPH";

/// The pool every cluster started here has (replicated over its OSDs, `rbd pool init`ed).
pub const POOL: &str = "rbd";

/// Bound on one `rbd`/`ceph` CLI call.
const CLI_LIMIT: Duration = Duration::from_secs(120);
/// Bound on `ceph-cluster start` (each of its steps is bounded by 60 s itself).
const START_LIMIT: Duration = Duration::from_secs(300);

/// Whether Ceph tests may run here: `Ok(true)` run, `Ok(false)` skip (`NVMFD_SKIP_CEPH=1`),
/// `Err(what is missing and how to install it)`.
pub fn ceph_check() -> Result<bool, String> {
    if std::env::var(SKIP_SWITCH).as_deref() == Ok("1") {
        return Ok(false);
    }
    let missing: Vec<&str> = [
        "ceph-mon",
        "ceph-mgr",
        "ceph-osd",
        "ceph",
        "rbd",
        "ceph-authtool",
        "monmaptool",
        "uuidgen",
        "python3",
    ]
    .into_iter()
    .filter(|b| !on_path(b))
    .collect();
    if !missing.is_empty() {
        return Err(format!(
            "Ceph is not installed (missing: {}): apt-get install ceph-mon ceph-mgr ceph-osd \
             ceph-common uuid-runtime, or run scripts/test.sh (as root); {SKIP_SWITCH}=1 skips \
             the Ceph tests locally",
            missing.join(" ")
        ));
    }
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "the test Ceph cluster needs root (bluestore block files, daemons); \
             {SKIP_SWITCH}=1 skips the Ceph tests locally"
        ));
    }
    Ok(true)
}

fn on_path(bin: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .any(|d| d.join(bin).is_file())
}

/// The harness script `testbed/ceph-cluster`.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testbed/ceph-cluster")
}

/// Runs `cmd` (stdin closed, output captured) for at most `limit`; Err past it.
fn bounded(mut cmd: Command, limit: Duration) -> Result<Output, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot spawn {cmd:?}: {e}"))?;
    let start = Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            return Err(format!(
                "{cmd:?} ran past {limit:?}\nstdout:\n{}\nstderr:\n{}",
                text(&out.stdout),
                text(&out.stderr)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().map_err(|e| e.to_string())
}

fn ok_or_report(what: &str, out: Output) -> Result<Output, String> {
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{what} failed ({})\nstdout:\n{}\nstderr:\n{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        ))
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A running test cluster (see the top comment). Dropping it stops every daemon and removes
/// its directory.
pub struct CephCluster {
    dir: PathBuf,
    mon_host: String,
    osds: usize,
    /// How long `start` took.
    pub start_time: Duration,
}

impl CephCluster {
    /// Starts a cluster with `osds` OSDs (1..=9) and the pool [`POOL`] (size min(osds, 3),
    /// min_size 1), in a fresh directory under the temp dir.
    pub fn start(osds: usize) -> Result<CephCluster, String> {
        if !ceph_check()? {
            return Err(format!("{SKIP_SWITCH}=1: Ceph tests are skipped"));
        }
        let dir = std::env::temp_dir().join(format!(
            "nvmf-ceph-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let t0 = Instant::now();
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .arg("start")
            .arg(&dir)
            .args(["--osds", &osds.to_string(), "--pool", POOL])
            .args(["--owner-pid", &std::process::id().to_string()])
            .env("CEPH_CLUSTER_QUIET", "1");
        let out = bounded(cmd, START_LIMIT);
        // from here on the directory (and whatever started) is ours to clean up
        let mut c = CephCluster {
            dir,
            mon_host: String::new(),
            osds,
            start_time: t0.elapsed(),
        };
        ok_or_report("testbed/ceph-cluster start", out?)?;
        let conf = std::fs::read_to_string(c.conf_path()).map_err(|e| e.to_string())?;
        c.mon_host = conf
            .lines()
            .find_map(|l| l.strip_prefix("mon_host = "))
            .ok_or("ceph.conf has no mon_host line")?
            .to_string();
        Ok(c)
    }

    /// One cluster (one OSD) shared by every test of this test binary that asks for it,
    /// started on first use and stopped by the script's watchdog when the binary exits.
    /// Panics if it cannot start. Each call first restarts any OSD a previous test left
    /// stopped.
    pub fn shared() -> &'static CephCluster {
        static SHARED: OnceLock<Result<CephCluster, String>> = OnceLock::new();
        let c = SHARED
            .get_or_init(|| CephCluster::start(1))
            .as_ref()
            .unwrap_or_else(|e| panic!("cannot start the shared test Ceph cluster: {e}"));
        for id in 0..c.osds {
            if !c.osd_running(id) {
                c.start_osd(id)
                    .unwrap_or_else(|e| panic!("cannot restart osd.{id}: {e}"));
            }
        }
        c
    }

    /// The cluster's directory (daemons' data, logs under `log/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `ceph.conf` for clients (`-c`); it names [`keyring_path`](Self::keyring_path).
    pub fn conf_path(&self) -> PathBuf {
        self.dir.join("ceph.conf")
    }

    /// The keyring with `client.admin`'s key.
    pub fn keyring_path(&self) -> PathBuf {
        self.dir.join("keyring")
    }

    /// The monitor's addresses as Ceph's `mon_host` option takes them
    /// (`[v2:127.0.0.1:P2,v1:127.0.0.1:P1]`).
    pub fn mon_addr(&self) -> &str {
        &self.mon_host
    }

    /// `client.admin`'s secret (what Ceph's `key` option takes).
    pub fn admin_key(&self) -> Result<String, String> {
        let out = ok_or_report(
            "ceph auth print-key client.admin",
            self.ceph(&["auth", "print-key", "client.admin"]),
        )?;
        Ok(text(&out.stdout).trim().to_string())
    }

    /// Number of OSDs (ids 0..osds).
    pub fn osds(&self) -> usize {
        self.osds
    }

    /// Runs the `rbd` CLI with this cluster's conf and `args` (bounded: 120 s).
    pub fn rbd(&self, args: &[&str]) -> Output {
        self.cli("rbd", args)
    }

    /// Runs the `ceph` CLI with this cluster's conf and `args` (bounded: 120 s).
    pub fn ceph(&self, args: &[&str]) -> Output {
        self.cli("ceph", args)
    }

    /// Runs the `rados` CLI with this cluster's conf and `args` (bounded: 120 s).
    pub fn rados(&self, args: &[&str]) -> Output {
        self.cli("rados", args)
    }

    fn cli(&self, bin: &str, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin);
        cmd.arg("-c").arg(self.conf_path()).args(args);
        bounded(cmd, CLI_LIMIT).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `rbd create POOL/NAME --size SIZE_MIB M --image-feature FEATURES` (e.g. "layering":
    /// no exclusive-lock, so several gateways can write it).
    pub fn create_image(
        &self,
        pool: &str,
        name: &str,
        size_mib: u64,
        features: &str,
    ) -> Result<(), String> {
        let spec = format!("{pool}/{name}");
        let size = format!("{size_mib}M");
        ok_or_report(
            &format!("rbd create {spec}"),
            self.rbd(&[
                "create",
                &spec,
                "--size",
                &size,
                "--image-feature",
                features,
            ]),
        )
        .map(|_| ())
    }

    /// `rbd resize` to `size_mib` MiB (growing or, with --allow-shrink, shrinking).
    pub fn resize_image(&self, pool: &str, name: &str, size_mib: u64) -> Result<(), String> {
        let spec = format!("{pool}/{name}");
        let size = format!("{size_mib}M");
        ok_or_report(
            &format!("rbd resize {spec}"),
            self.rbd(&["resize", &spec, "--size", &size, "--allow-shrink"]),
        )
        .map(|_| ())
    }

    /// The image's size in bytes (`rbd info`).
    pub fn image_size(&self, pool: &str, name: &str) -> Result<u64, String> {
        let spec = format!("{pool}/{name}");
        let out = ok_or_report(
            &format!("rbd info {spec}"),
            self.rbd(&["info", "--format", "json", &spec]),
        )?;
        let s = text(&out.stdout);
        // {"name":"...","size":67108864,...}: no JSON parser in the kit; the number after
        // the "size" key
        let at = s
            .find("\"size\":")
            .ok_or_else(|| format!("no size in {s}"))?
            + 7;
        s[at..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect::<String>()
            .parse()
            .map_err(|e| format!("size in {s}: {e}"))
    }

    /// The image's bytes (`rbd export` to a file in the cluster's directory, read back).
    pub fn export(&self, pool: &str, name: &str) -> Result<Vec<u8>, String> {
        let path = self.dir.join(format!("export-{name}.img"));
        self.export_to(pool, name, &path)?;
        let bytes = std::fs::read(&path).map_err(|e| e.to_string());
        let _ = std::fs::remove_file(&path);
        bytes
    }

    /// `rbd export POOL/NAME PATH` (PATH is overwritten).
    pub fn export_to(&self, pool: &str, name: &str, path: &Path) -> Result<(), String> {
        let _ = std::fs::remove_file(path);
        let spec = format!("{pool}/{name}");
        let p = path.to_str().ok_or("export path is not UTF-8")?;
        ok_or_report(
            &format!("rbd export {spec}"),
            self.rbd(&["export", "--no-progress", &spec, p]),
        )
        .map(|_| ())
    }

    /// `rbd rm POOL/NAME`.
    pub fn remove_image(&self, pool: &str, name: &str) -> Result<(), String> {
        let spec = format!("{pool}/{name}");
        ok_or_report(
            &format!("rbd rm {spec}"),
            self.rbd(&["rm", "--no-progress", &spec]),
        )
        .map(|_| ())
    }

    fn script_cmd(&self, args: &[&str]) -> Result<Output, String> {
        let mut cmd = Command::new("bash");
        cmd.arg(script())
            .arg(args[0])
            .arg(&self.dir)
            .args(&args[1..])
            .env("CEPH_CLUSTER_QUIET", "1");
        ok_or_report(
            &format!("testbed/ceph-cluster {}", args.join(" ")),
            bounded(cmd, START_LIMIT)?,
        )
    }

    /// Stops osd.`id` cleanly (SIGTERM: it tells the monitor it is going down).
    pub fn stop_osd(&self, id: usize) -> Result<(), String> {
        self.script_cmd(&["osd-stop", &id.to_string()]).map(|_| ())
    }

    /// Kills osd.`id` (SIGKILL: the monitor learns it from missed heartbeats).
    pub fn kill_osd(&self, id: usize) -> Result<(), String> {
        self.script_cmd(&["osd-stop", &id.to_string(), "--kill"])
            .map(|_| ())
    }

    /// Starts osd.`id` again (same data) and waits until the monitor has it up.
    pub fn start_osd(&self, id: usize) -> Result<(), String> {
        self.script_cmd(&["osd-start", &id.to_string()]).map(|_| ())
    }

    /// Stops the monitor (SIGTERM, or SIGKILL with `kill`) and starts it again on the same
    /// store and ports; returns once it answers.
    pub fn restart_mon(&self, kill: bool) -> Result<(), String> {
        let mut args = vec!["mon-restart"];
        if kill {
            args.push("--kill");
        }
        self.script_cmd(&args).map(|_| ())
    }

    /// Whether osd.`id`'s process is alive.
    pub fn osd_running(&self, id: usize) -> bool {
        let Ok(pid) = std::fs::read_to_string(self.dir.join(format!("pids/osd.{id}"))) else {
            return false;
        };
        std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .ok()
            .and_then(|s| {
                // "PID (comm) STATE ...": the state after the last ')'
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().chars().next())
            })
            .flatten()
            .is_some_and(|st| st != 'Z' && st != 'X')
    }

    /// The last `n` lines of daemon `name`'s log (e.g. "osd.0", "mon.a").
    pub fn log_tail(&self, name: &str, n: usize) -> String {
        let s =
            std::fs::read_to_string(self.dir.join(format!("log/{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for CephCluster {
    fn drop(&mut self) {
        let mut cmd = Command::new("bash");
        cmd.arg(script()).arg("stop").arg(&self.dir);
        if let Err(e) = bounded(cmd, Duration::from_secs(60)) {
            eprintln!("ceph-cluster stop {}: {e}", self.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole life of a cluster: start, an image written and read back through the CLI,
    /// an OSD stopped (the data stays unreachable) and restarted (the data is there again),
    /// and drop (no daemon and no directory left).
    #[test]
    fn cluster_starts_serves_an_image_survives_an_osd_restart_and_goes_away() {
        match ceph_check() {
            Ok(true) => {}
            Ok(false) => {
                eprintln!("ceph cluster test: skipped ({SKIP_SWITCH}=1)");
                return;
            }
            Err(e) => panic!("{e}"),
        }
        let c = CephCluster::start(1).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "ceph cluster started in {:.1} s",
            c.start_time.as_secs_f64()
        );
        assert!(
            c.mon_addr().starts_with("[v2:127.0.0.1:"),
            "{}",
            c.mon_addr()
        );
        assert!(!c.admin_key().unwrap().is_empty());
        c.create_image(POOL, "kit", 8, "layering").unwrap();
        assert_eq!(c.image_size(POOL, "kit").unwrap(), 8 << 20);

        // a known pattern in, the same bytes out
        let pattern: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7 + 3) as u8).collect();
        let src = c.dir().join("pattern.bin");
        std::fs::write(&src, &pattern).unwrap();
        let out = c.rbd(&["import", "--no-progress", src.to_str().unwrap(), "rbd/pat"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(c.export(POOL, "pat").unwrap(), pattern);

        // osd.0 down: the pool's only OSD, so the data is out of reach...
        c.stop_osd(0).unwrap();
        assert!(!c.osd_running(0));
        let out = c.rbd(&[
            "info",
            "--rados-osd-op-timeout",
            "3",
            "--rados-mon-op-timeout",
            "3",
            "rbd/pat",
        ]);
        assert!(!out.status.success(), "image readable with its OSD down");
        // ...and back, with bluestore's data intact
        c.start_osd(0).unwrap();
        assert!(c.osd_running(0));
        assert_eq!(c.export(POOL, "pat").unwrap(), pattern);

        c.resize_image(POOL, "kit", 16).unwrap();
        assert_eq!(c.image_size(POOL, "kit").unwrap(), 16 << 20);

        let dir = c.dir().to_path_buf();
        let pids: Vec<String> = std::fs::read_dir(dir.join("pids"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != "watchdog")
            .map(|e| {
                std::fs::read_to_string(e.path())
                    .unwrap()
                    .trim()
                    .to_string()
            })
            .collect();
        assert_eq!(pids.len(), 3, "mon, mgr, one osd: {pids:?}");
        drop(c);
        assert!(!dir.exists(), "cluster directory left behind");
        for p in pids {
            let st = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            assert!(
                st.is_empty() || st.contains(") Z") || !st.contains("(ceph-"),
                "daemon {p} still running: {st}"
            );
        }
    }
}
