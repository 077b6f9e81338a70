//! End-to-end tests of the fio engine (target/nvmf-fio/libnvmf_fio.so, built by
//! scripts/build-fio-engine.sh, which scripts/test.sh runs first): real fio jobs
//! with `--verify=crc32c` against a test-started nvmfd on 127.0.0.1, checked
//! through fio's JSON output (no errors, the expected I/O counts), and the
//! clear errors fio prints for a bad filename, an unreachable target and a
//! missing namespace. Each test skips with a printed reason ONLY when the
//! engine .so (or fio) is missing; `NVMF_FIO_ENGINE` names another .so.

use nvmf_testkit::{bins, run_bounded, text, Daemon};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const NQN: &str = "nqn.2024-01.io.nvmfd:fio-test";
/// Namespace: 32 MiB of 512-byte blocks.
const BLOCKS: u64 = 65536;

/// The engine, or None (with the reason printed) when it was not built.
fn engine() -> Option<PathBuf> {
    let p = match std::env::var_os("NVMF_FIO_ENGINE") {
        Some(p) => PathBuf::from(p),
        None => bins::profile_dir()
            .parent()
            .expect("target dir")
            .join("nvmf-fio/libnvmf_fio.so"),
    };
    if !p.is_file() {
        eprintln!(
            "SKIP: fio engine {} not built (run scripts/build-fio-engine.sh)",
            p.display()
        );
        return None;
    }
    if Command::new("fio").arg("--version").output().is_err() {
        eprintln!("SKIP: no fio on PATH");
        return None;
    }
    Some(p)
}

fn daemon() -> Daemon {
    Daemon::start_on_free_port(|port| {
        let config = format!(
            r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":{BLOCKS}}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP","in_capsule_data_size":4096,
      "max_io_size":131072,"io_unit_size":131072,"max_queue_depth":128,"max_aq_depth":32,"max_io_qpairs_per_ctrlr":8}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}","allow_any_host":true,
      "serial_number":"NVMFFIO0001","model_number":"nvmf-fio test"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}
 ]}}]}}"#
        );
        Daemon::builder(config)
            .args(["-m", "0"])
            .listening(&[port])
            .ready_within(Duration::from_secs(15))
    })
}

/// The engine's filename for namespace `ns` on 127.0.0.1:`port` (':' escaped for fio).
fn filename(port: u16, ns: u32) -> String {
    format!(
        "trtype=tcp traddr=127.0.0.1 trsvcid={port} subnqn={} ns={ns}",
        NQN.replace(':', "\\:")
    )
}

struct FioRun {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn fio(engine: &Path, file: &str, args: &[&str]) -> FioRun {
    let mut cmd = Command::new("fio");
    cmd.arg("--name=nvmf")
        .arg(format!("--ioengine=external:{}", engine.display()))
        .arg(format!("--filename={file}"))
        // no verify state files in the working directory
        .arg("--verify_state_save=0")
        .args(args);
    let out = run_bounded(cmd, Duration::from_secs(60));
    FioRun {
        ok: out.status.success(),
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
    }
}

/// fio's JSON report (it may print warnings before the JSON object).
fn json(r: &FioRun) -> serde_json::Value {
    let start = r
        .stdout
        .find("\n{")
        .map(|i| i + 1)
        .or_else(|| r.stdout.starts_with('{').then_some(0))
        .unwrap_or_else(|| panic!("no JSON in fio output:\n{}\n{}", r.stdout, r.stderr));
    serde_json::from_str(&r.stdout[start..])
        .unwrap_or_else(|e| panic!("fio JSON: {e}\n{}", r.stdout))
}

/// Per job: (error, read ios, write ios, trim ios, sync ios).
fn job_counts(v: &serde_json::Value) -> Vec<(i64, u64, u64, u64, u64)> {
    v["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| {
            let n = |k: &str| j[k]["total_ios"].as_u64().unwrap_or(0);
            (
                j["error"].as_i64().unwrap(),
                n("read"),
                n("write"),
                n("trim"),
                n("sync"),
            )
        })
        .collect()
}

#[test]
fn verify_4k_randwrite_qd32_two_jobs() {
    let Some(e) = engine() else { return };
    let d = daemon();
    // Two jobs, each with its own 4 MiB region (offset_increment), so the
    // verify of one never sees the other's writes.
    let r = fio(
        &e,
        &filename(d.port(), 1),
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--numjobs=2",
            "--size=4m",
            "--offset_increment=4m",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--output-format=json",
        ],
    );
    assert!(r.ok, "fio failed:\n{}\n{}", r.stdout, r.stderr);
    let jobs = job_counts(&json(&r));
    // 4 MiB / 4 KiB = 1024 writes per job, each read back once by verify.
    assert_eq!(jobs, vec![(0, 1024, 1024, 0, 0); 2], "{}", r.stderr);
}

#[test]
fn verify_128k_sequential_qd1_with_flush_and_busy_poll() {
    let Some(e) = engine() else { return };
    let d = daemon();
    let r = fio(
        &e,
        &filename(d.port(), 1),
        &[
            "--rw=write",
            "--bs=128k",
            "--iodepth=1",
            "--size=8m",
            "--fsync=8",
            // the engine's own option (busy-poll before sleeping)
            "--nvmf_poll_us=50",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--output-format=json",
        ],
    );
    assert!(r.ok, "fio failed:\n{}\n{}", r.stdout, r.stderr);
    // fio only warns about an option it does not know
    assert!(!r.stderr.contains("unrecognized option"), "{}", r.stderr);
    let jobs = job_counts(&json(&r));
    // 8 MiB / 128 KiB = 64 writes (a Flush after every 8th), 64 verify reads.
    assert_eq!(jobs.len(), 1);
    let (err, reads, writes, trims, syncs) = jobs[0];
    assert_eq!((err, reads, writes, trims), (0, 64, 64, 0), "{}", r.stderr);
    assert!(syncs >= 7, "{syncs} flushes for 64 writes with fsync=8");
}

#[test]
fn whole_namespace_is_the_file_and_trim_works() {
    let Some(e) = engine() else { return };
    let d = daemon();
    // No size=: the namespace (32 MiB) is the file; trim all of it in 1 MiB ranges.
    let r = fio(
        &e,
        &filename(d.port(), 1),
        &[
            "--rw=trim",
            "--bs=1m",
            "--iodepth=4",
            "--output-format=json",
        ],
    );
    assert!(r.ok, "fio failed:\n{}\n{}", r.stdout, r.stderr);
    let jobs = job_counts(&json(&r));
    assert_eq!(
        jobs,
        vec![(0, 0, 0, BLOCKS * 512 / (1 << 20), 0)],
        "{}",
        r.stderr
    );
}

/// fio must fail with `want` in its output, exit normally (no signal: no crash).
fn assert_clear_failure(r: &FioRun, want: &str) {
    assert!(!r.ok, "fio succeeded:\n{}\n{}", r.stdout, r.stderr);
    let all = format!("{}\n{}", r.stdout, r.stderr);
    assert!(all.contains(want), "fio output lacks '{want}':\n{all}");
    assert!(
        !all.contains("signal") && !all.contains("panic"),
        "fio crashed:\n{all}"
    );
}

#[test]
fn bad_filename_is_a_clear_error() {
    let Some(e) = engine() else { return };
    let r = fio(&e, "/dev/nvme0n1", &["--rw=read", "--size=1m"]);
    assert_clear_failure(&r, "is not key=value");
    let r = fio(
        &e,
        "traddr=127.0.0.1 trsvcid=4530",
        &["--rw=read", "--size=1m"],
    );
    assert_clear_failure(&r, "subnqn (the NQN of an NVM subsystem) is required");
}

#[test]
fn unreachable_target_is_a_clear_error() {
    let Some(e) = engine() else { return };
    // A port nothing listens on: bound, then closed again.
    let port = nvmf_testkit::free_port();
    let r = fio(&e, &filename(port, 1), &["--rw=read", "--size=1m"]);
    assert_clear_failure(&r, "Connection refused");
}

#[test]
fn missing_namespace_is_a_clear_error() {
    let Some(e) = engine() else { return };
    let d = daemon();
    let r = fio(&e, &filename(d.port(), 7), &["--rw=read", "--size=1m"]);
    assert_clear_failure(&r, "namespace 7 is not active");
}

/// TLS 1.3 with a PSK (`tls_key=` in the filename): a verified 4 KiB random write job through a
/// `secure_channel` listener; the same job with another host's key fails with a clear error.
#[test]
fn verify_over_tls() {
    use std::os::unix::fs::PermissionsExt;
    let Some(e) = engine() else { return };
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f10f10f-0000-4000-8000-000000000001";
    let dir = nvmf_testkit::TestDir::new("fio-tls");
    let key = dir.join("psk");
    std::fs::write(
        &key,
        "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:\n",
    )
    .unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let d = Daemon::start_on_free_port(|port| {
        let config = format!(
            r#"{{"subsystems":[
 {{"subsystem":"keyring","config":[{{"method":"keyring_file_add_key","params":{{"name":"k0","path":"{}"}}}}]}},
 {{"subsystem":"bdev","config":[{{"method":"bdev_malloc_create","params":{{"name":"M0","block_size":512,"num_blocks":{BLOCKS}}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP"}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{NQN}"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{NQN}","namespace":{{"nsid":1,"bdev_name":"M0"}}}}}},
   {{"method":"nvmf_subsystem_add_host","params":{{"nqn":"{NQN}","host":"{HOST}","psk":"k0"}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{NQN}","secure_channel":true,"listen_address":{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}}}}}
 ]}}]}}"#,
            key.display()
        );
        Daemon::builder(config)
            .args(["-m", "0"])
            .listening(&[port])
            .ready_within(Duration::from_secs(15))
    });
    let file = |host: &str| {
        format!(
            "{} hostnqn={} tls_key={}",
            filename(d.port(), 1),
            host.replace(':', "\\:"),
            key.display()
        )
    };
    let args = [
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--size=2m",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--output-format=json",
    ];
    let r = fio(&e, &file(HOST), &args);
    assert!(r.ok, "fio over TLS failed:\n{}\n{}", r.stdout, r.stderr);
    assert_eq!(
        job_counts(&json(&r)),
        vec![(0, 512, 512, 0, 0)],
        "{}",
        r.stderr
    );
    d.wait_log_for("TLS 1.3 session established", Duration::from_secs(5));
    // The key is not this host's: the target refuses the handshake.
    let r = fio(
        &e,
        &file("nqn.2014-08.org.nvmexpress:uuid:0f10f10f-0000-4000-8000-000000000002"),
        &args,
    );
    assert_clear_failure(&r, "TLS");
}
