//! `nvmf bench run` driving the real Linux kernel target (bench `kind = "kernel"`,
//! crates/nvmf-host/src/bench/targets/kernel.rs) inside ONE testbed guest (Debian 12's 6.1
//! kernel by default): the host's `nvmf` binary is put into the guest's /job, the guest
//! script tests/interop/bench-kernel.sh writes a spec (backing /dev/ram0 from brd, 127.0.0.1,
//! nvmf-perf, 4 KiB randrw QD8 for 2 s after a 1 s ramp, one repetition) and runs it, then a
//! spec whose backing does not exist. The host checks bench.json (one measurement, IOPS > 0,
//! no errors, version = the guest's kernel release, the no-counters note), that each run left
//! configfs empty, and that the bad backing is refused with a message naming it.
//!
//! Opt-in with NVMFD_INTEROP=1, like its siblings.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nvmf_interop::*;

/// The nvmet port inside the guest (this part's range is 4660-4679).
const GUEST_PORT: u16 = 4660;
/// qemu's own limit for the whole guest run (TCG boots slowly; the runs are short).
const GUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// `key: value` from the guest's output.
fn line_value<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    out.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim())
}

#[test]
fn bench_run_against_kernel_target_in_guest() {
    let Some(_serial) = begin("bench_run_against_kernel_target_in_guest") else {
        return;
    };
    let t_all = Instant::now();
    let dir = work_dir("bench_kernel_target");
    let job = dir.join("guest");
    fs::create_dir_all(&job).unwrap();
    let nvmf = nvmf_binary();
    let root = repo_root();
    let mut cmd = Command::new("bash");
    cmd.arg(testbed())
        .args(["run", "--timeout", &GUEST_TIMEOUT.as_secs().to_string()])
        .arg("--out")
        .arg(&job)
        .arg("--put")
        .arg(&nvmf)
        .args(["--modules", "nvmet nvmet-tcp"])
        .arg("--env")
        .arg(format!("PORT={GUEST_PORT}"))
        .arg(root.join("tests/interop/bench-kernel.sh"));
    // bounded twice: qemu's --timeout inside the testbed, and ours around it
    let r = run_bounded(
        &dir,
        "testbed-run",
        &mut cmd,
        GUEST_TIMEOUT + Duration::from_secs(60),
    );
    let out = fs::read_to_string(job.join("stdout")).unwrap_or_default();
    let report = || {
        format!(
            "{}\n---- guest output ----\n{out}\n---- guest dmesg (tail) ----\n{}",
            r.report(),
            tail(
                &fs::read_to_string(job.join("dmesg.log")).unwrap_or_default(),
                40
            )
        )
    };
    assert_eq!(r.status, Some(0), "the guest run failed\n{}", report());
    let release = line_value(&out, "uname-r:")
        .unwrap_or_else(|| panic!("no uname-r in the guest output\n{}", report()))
        .to_string();

    // the good run: exit 0, one measurement with IOPS and no errors, version, notes
    assert_eq!(
        line_value(&out, "exit-good:"),
        Some("0"),
        "nvmf bench run against the kernel target failed\n{}",
        report()
    );
    check_report(&job.join("bench/bench.json"), &release).unwrap_or_else(|e| {
        panic!("bench.json: {e}\n{}", report());
    });
    // teardown left configfs as it found it (empty), and did not warn
    assert!(
        !out.contains("teardown could not remove"),
        "the kernel target's teardown warned\n{}",
        report()
    );
    for run in ["good", "bad"] {
        let want = format!("configfs-after {run}: subsystems=[] ports=[]");
        assert!(
            out.lines().any(|l| l.trim_end() == want),
            "configfs not clean after the {run} run (want `{want}`)\n{}",
            report()
        );
    }
    // a backing that does not exist: refused, naming it
    let bad = line_value(&out, "exit-bad:");
    assert!(
        bad.is_some() && bad != Some("0"),
        "a missing backing was not refused\n{}",
        report()
    );
    assert!(
        out.lines()
            .any(|l| l.contains("/dev/no-such-device") && !l.starts_with("backing")),
        "the refusal does not name the missing backing\n{}",
        report()
    );
    say(&format!(
        "interop bench_run_against_kernel_target_in_guest: ok on {release} in {:.1} s",
        t_all.elapsed().as_secs_f64()
    ));
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The checks on the good run's BenchReport.
fn check_report(path: &Path, release: &str) -> Result<(), String> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let ms = v["measurements"]
        .as_array()
        .ok_or("no measurements array")?;
    if ms.len() != 1 {
        return Err(format!("{} measurements, want 1", ms.len()));
    }
    let m = &ms[0];
    let iops = m["iops"].as_f64().unwrap_or(0.0);
    if iops <= 0.0 {
        return Err(format!("iops {iops}, want > 0"));
    }
    let errors = m["result"]["errors"].as_u64();
    if errors != Some(0) {
        return Err(format!("errors {errors:?}, want 0"));
    }
    if !m["target_ios"].is_null() {
        return Err(format!(
            "target_ios {}, want none (nvmet has no counters)",
            m["target_ios"]
        ));
    }
    let notes: Vec<&str> = m["notes"]
        .as_array()
        .map(|a| a.iter().filter_map(|n| n.as_str()).collect())
        .unwrap_or_default();
    if !notes
        .iter()
        .any(|n| n.contains("kernel target") && n.contains("no target I/O counters"))
    {
        return Err(format!("no kernel-target counters note in {notes:?}"));
    }
    let want = format!("Linux kernel target (nvmet) {release}");
    if !text.contains(&format!("\"{want}\"")) {
        return Err(format!(
            "the target's version `{want}` is not in the report"
        ));
    }
    Ok(())
}
