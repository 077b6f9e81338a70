//! The fio engine (crates/nvmf-fio, target/nvmf-fio/libnvmf_fio.so from
//! scripts/build-fio-engine.sh) against the Linux kernel NVMe/TCP target: nvmet in a QEMU
//! guest (testbed `target-start`, one 64 MiB RAM namespace, port-forwarded to 127.0.0.1).
//! fio on the host runs `--verify=crc32c` write+verify jobs through the engine (4 KiB
//! randwrite QD32 in two jobs; 128 KiB sequential QD1 with header+data digests) and must
//! report no errors and the expected I/O counts.
//!
//! Opt-in with NVMFD_INTEROP=1, like its siblings; skipped with a printed reason when the
//! engine .so was not built (scripts/test.sh builds it).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use nvmf_interop::*;

const NQN: &str = "nqn.2024-01.io.nvmfd:fio-kernel-ref";
const SIZE_MB: u32 = 64;
const FIO_TIMEOUT: Duration = Duration::from_secs(90);

fn engine() -> Option<PathBuf> {
    let p = std::env::var_os("NVMF_FIO_ENGINE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/nvmf-fio/libnvmf_fio.so"));
    if p.is_file() {
        Some(p)
    } else {
        say(&format!(
            "interop fio_engine_against_kernel_target: skipped: fio engine {} not built (run scripts/build-fio-engine.sh)",
            p.display()
        ));
        None
    }
}

/// Per job of fio's JSON report: (error, read ios, write ios).
fn job_counts(stdout: &str) -> Result<Vec<(i64, u64, u64)>, String> {
    let start = if stdout.starts_with('{') {
        0
    } else {
        stdout.find("\n{").ok_or("no JSON in fio's output")? + 1
    };
    let v: serde_json::Value =
        serde_json::from_str(&stdout[start..]).map_err(|e| format!("fio JSON: {e}"))?;
    let jobs = v["jobs"].as_array().ok_or("no jobs in fio's JSON")?;
    Ok(jobs
        .iter()
        .map(|j| {
            let n = |k: &str| j[k]["total_ios"].as_u64().unwrap_or(0);
            (j["error"].as_i64().unwrap_or(-1), n("read"), n("write"))
        })
        .collect())
}

#[test]
fn fio_engine_against_kernel_target() {
    let Some(_serial) = begin("fio_engine_against_kernel_target") else {
        return;
    };
    let Some(engine) = engine() else { return };
    let t_all = Instant::now();
    let dir = work_dir("fio_engine_kernel_target");
    let port = free_port();
    let target = KernelTarget::start(&dir, port, NQN, 1, SIZE_MB, &[]);
    let fail = |what: &str, r: &Bounded| -> ! {
        let dmesg = target.dmesg();
        let tail: Vec<&str> = dmesg.lines().rev().take(40).collect();
        panic!(
            "{what}\n{}\n---- kernel target dmesg (tail) ----\n{}",
            r.report(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    };
    // fio splits its filename on ':', so the NQNs' colons are escaped.
    let name = |digests: bool| {
        format!(
            "trtype=tcp traddr=127.0.0.1 trsvcid={port} subnqn={} hostnqn={} ns=1{}",
            NQN.replace(':', "\\:"),
            host_nqn(HOST_ID).replace(':', "\\:"),
            if digests { " hdgst=1 ddgst=1" } else { "" }
        )
    };
    // (tag, digests, fio args, jobs, writes = verify reads per job)
    let runs: [(&str, bool, &[&str], usize, u64); 2] = [
        (
            "fio-randwrite-4k-qd32-2jobs",
            false,
            &[
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=32",
                "--numjobs=2",
                "--size=8m",
                "--offset_increment=8m",
            ],
            2,
            2048,
        ),
        (
            "fio-write-128k-qd1-digests",
            true,
            &["--rw=write", "--bs=128k", "--iodepth=1", "--size=16m"],
            1,
            128,
        ),
    ];
    for (tag, digests, args, njobs, ios) in runs {
        let mut cmd = Command::new("fio");
        cmd.arg(format!("--name={tag}"))
            .arg(format!("--ioengine=external:{}", engine.display()))
            .arg(format!("--filename={}", name(digests)))
            .args(args)
            .args([
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--output-format=json",
                // no verify state files in the working directory
                "--verify_state_save=0",
            ]);
        let r = run_bounded(&dir, tag, &mut cmd, FIO_TIMEOUT);
        if r.status != Some(0) {
            fail(&format!("{tag}: fio failed"), &r);
        }
        match job_counts(&r.stdout) {
            Ok(jobs) if jobs == vec![(0, ios, ios); njobs] => {}
            Ok(jobs) => fail(
                &format!(
                    "{tag}: expected {njobs} job(s) with error 0, {ios} writes and {ios} verify reads; got (error, reads, writes) {jobs:?}"
                ),
                &r,
            ),
            Err(e) => fail(&format!("{tag}: {e}"), &r),
        }
        say(&format!(
            "interop fio_engine_against_kernel_target: {tag}: {njobs} job(s) x {ios} writes verified ({:.1} s)",
            r.wall.as_secs_f64()
        ));
    }
    say(&format!(
        "interop fio_engine_against_kernel_target: passed in {:.1} s",
        t_all.elapsed().as_secs_f64()
    ));
}
