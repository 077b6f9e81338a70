//! The user-space initiator `nvmf` against the Linux kernel NVMe/TCP target: nvmet +
//! nvmet-tcp configured through configfs in a QEMU guest (testbed `target-start`), one
//! 64 MiB brd RAM namespace, port-forwarded to 127.0.0.1 on the host. The host's
//! `target/<profile>/nvmf` runs discover, identify, and `perf --verify` (4 KiB randrw
//! 75/25 and 128 KiB sequential write/read, each without and with header+data digests),
//! and a wrong subsystem NQN must fail with Connect Invalid Parameters.
//!
//! Not used against nvmet: `--in-capsule 0` (Linux 6.1's nvmet-tcp sends no R2T for a write
//! no larger than its in-capsule size, so such writes hang; see testbed/README.md).
//! Opt-in with NVMFD_INTEROP=1, like kernel_host.rs.

use std::process::Command;
use std::time::{Duration, Instant};

use nvmf_interop::*;

const NQN: &str = "nqn.2024-01.io.nvmfd:kernel-ref";
const SERIAL: &str = "NVMETREF0001";
const MODEL: &str = "nvmet reference";
const SIZE_MB: u32 = 64;
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
const PERF_TIMEOUT: Duration = Duration::from_secs(60);

fn trid(port: u16, nqn: &str) -> String {
    format!("trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{port} subnqn:{nqn}")
}

#[test]
fn initiator_against_kernel_target() {
    let Some(_serial) = begin("initiator_against_kernel_target") else {
        return;
    };
    let t_all = Instant::now();
    let dir = work_dir("kernel_target_initiator");
    let nvmf = nvmf_binary();
    let hostnqn = host_nqn(HOST_ID);
    let port = free_port();
    let t0 = Instant::now();
    let target = KernelTarget::start(
        &dir,
        port,
        NQN,
        1,
        SIZE_MB,
        &["--serial", SERIAL, "--model", MODEL],
    );
    say(&format!(
        "interop initiator_against_kernel_target: kernel target ready on 127.0.0.1:{port} in {:.1} s",
        t0.elapsed().as_secs_f64()
    ));
    let fail = |what: &str, r: &Bounded| -> ! {
        panic!(
            "{what}\n{}\n---- kernel target dmesg (tail) ----\n{}",
            r.report(),
            target
                .dmesg()
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        )
    };

    // discover: the discovery log lists the subsystem
    let r = run_bounded(
        &dir,
        "discover",
        Command::new(&nvmf)
            .args(["discover", "-t", "tcp", "-a", "127.0.0.1", "-s"])
            .arg(port.to_string())
            .args(["--hostnqn", &hostnqn]),
        STEP_TIMEOUT,
    );
    if r.status != Some(0) {
        fail("nvmf discover failed", &r);
    }
    let listed = r
        .stdout
        .lines()
        .any(|l| l.trim_start().starts_with("subnqn:") && l.trim_end().ends_with(NQN));
    if !listed {
        fail(&format!("the discovery log does not list {NQN}"), &r);
    }
    say(&format!(
        "interop initiator_against_kernel_target: discover lists {NQN} ({:.2} s)",
        r.wall.as_secs_f64()
    ));

    // identify: serial, model, namespace size
    let r = run_bounded(
        &dir,
        "identify",
        Command::new(&nvmf)
            .args(["identify", "-r", &trid(port, NQN)])
            .args(["--hostnqn", &hostnqn]),
        STEP_TIMEOUT,
    );
    if r.status != Some(0) {
        fail("nvmf identify failed", &r);
    }
    let field = |name: &str| {
        r.stdout
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
    };
    let blocks = (SIZE_MB as u64) << 20 >> 9;
    let ns_line = format!("namespace 1: {blocks} blocks of 512 bytes");
    if field("serial:").as_deref() != Some(SERIAL)
        || field("model:").as_deref() != Some(MODEL)
        || field("subnqn:").as_deref() != Some(NQN)
        || !r.stdout.lines().any(|l| l.starts_with(&ns_line))
    {
        fail(
            &format!(
                "identify: expected serial {SERIAL}, model {MODEL}, subnqn {NQN}, `{ns_line}`"
            ),
            &r,
        );
    }
    say(&format!(
        "interop initiator_against_kernel_target: identify: serial {SERIAL}, model {MODEL}, {ns_line} ({:.2} s)",
        r.wall.as_secs_f64()
    ));

    // perf --verify: 4 KiB randrw 75/25 (in-capsule writes) and 128 KiB sequential
    // write/read 50/50 (writes through R2T + H2CData), plain and with both digests
    let workloads: [(&str, &[&str]); 2] = [
        (
            "randrw-4k",
            &["-w", "randrw", "-M", "75", "-o", "4096", "-t", "3"],
        ),
        (
            "rw-128k",
            &["-w", "rw", "-M", "50", "-o", "128k", "-t", "3"],
        ),
    ];
    for (name, args) in workloads {
        for digests in [false, true] {
            let tag = format!("perf-{name}{}", if digests { "-digest" } else { "" });
            let mut cmd = Command::new(&nvmf);
            cmd.args(["perf", "-r", &trid(port, NQN), "-q", "32"])
                .args(args)
                .args(["--verify", "--no-progress", "--hostnqn", &hostnqn]);
            if digests {
                cmd.args(["-g", "-G"]);
            }
            let r = run_bounded(&dir, &tag, &mut cmd, PERF_TIMEOUT);
            if r.status != Some(0) {
                fail(&format!("{tag}: nvmf perf --verify failed"), &r);
            }
            let want_digest = if digests {
                "digests: header+data"
            } else {
                "digests: none"
            };
            if !r.stdout.contains(want_digest) {
                fail(
                    &format!("{tag}: perf header does not say `{want_digest}`"),
                    &r,
                );
            }
            let verify = r
                .stdout
                .lines()
                .find(|l| l.starts_with("verify:"))
                .unwrap_or_default();
            let checked: u64 = verify
                .strip_prefix("verify:")
                .and_then(|v| v.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if checked == 0 || !verify.contains(" 0 mismatched") {
                fail(
                    &format!("{tag}: expected `verify: N blocks checked, 0 mismatched`, N > 0"),
                    &r,
                );
            }
            let total = r
                .stdout
                .lines()
                .find(|l| l.starts_with("total:"))
                .unwrap_or("(no total line)");
            say(&format!(
                "interop initiator_against_kernel_target: {tag}: {total}; {verify} ({:.1} s)",
                r.wall.as_secs_f64()
            ));
        }
    }

    // a subsystem the target does not have: Connect is refused with Invalid Parameters
    let wrong = format!("{NQN}-missing");
    for sub in ["identify", "perf"] {
        let mut cmd = Command::new(&nvmf);
        cmd.args([sub, "-r", &trid(port, &wrong), "--hostnqn", &hostnqn]);
        if sub == "perf" {
            cmd.args(["-w", "randrw", "-t", "1", "--verify", "--no-progress"]);
        }
        let r = run_bounded(&dir, &format!("{sub}-wrong-nqn"), &mut cmd, STEP_TIMEOUT);
        if r.status != Some(1) || !r.stderr.contains("Connect Invalid Parameters") {
            fail(
                &format!("nvmf {sub} with subnqn {wrong}: expected exit status 1 and an error naming Connect Invalid Parameters"),
                &r,
            );
        }
        say(&format!(
            "interop initiator_against_kernel_target: {sub} {wrong}: {}",
            r.stderr.lines().next().unwrap_or_default().trim()
        ));
    }

    // the Drop guard stops the guest; check it is gone
    let state = target.state_dir().to_path_buf();
    drop(target);
    let st = Command::new("bash")
        .arg(testbed())
        .args(["target-status", "--state"])
        .arg(&state)
        .output()
        .expect("run testbed target-status");
    assert!(
        !st.status.success(),
        "kernel target still running after stop: {}",
        String::from_utf8_lossy(&st.stdout)
    );
    say(&format!(
        "interop initiator_against_kernel_target: passed ({:.1} s)",
        t_all.elapsed().as_secs_f64()
    ));
}
