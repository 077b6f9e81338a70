//! `nvmf bench plan` end to end through the binary: a preset with
//! `--target`, a spec file in a temp dir (nvmfd + trid targets; spdk +
//! kernel targets with the spdk-perf engine), and bad specs (non-zero exit,
//! the field named). Nothing is run against a target.

use std::process::{Command, Output};

const TRID: &str = "trtype:TCP traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.nvmfd:default";

fn nvmf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nvmf"))
        .args(args)
        .output()
        .expect("run nvmf")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn plan_a_preset() {
    let o = nvmf(&[
        "bench",
        "plan",
        "seed-4k-randrw",
        "--target",
        TRID,
        "--sample-ms",
        "50",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("interface lo"), "{out}");
    assert!(out.contains("no NUMA information"), "{out}");
    assert!(out.contains("initiator pinned to CPUs"), "{out}");
    assert!(out.contains("randrw 75% reads, bs 4k, qd 64"), "{out}");
    assert!(
        out.contains("Runs: 1 targets x 1 workloads x 3 rounds = 3"),
        "{out}"
    );
    // 3 × (30 s + 5 s ramp).
    assert!(out.contains("Estimated time: 0h01m45s"), "{out}");
    // A preset without a target says what is missing.
    let o = nvmf(&["bench", "plan", "latency"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("--target"), "{:?}", text(&o));
}

#[test]
fn plan_a_spec_file_and_reject_a_bad_one() {
    let dir = std::env::temp_dir().join(format!("nvmf-bench-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("nvmfd.json"), "{\"subsystems\": []}").unwrap();
    let spec = dir.join("bench.toml");
    std::fs::write(
        &spec,
        format!(
            "repetitions = 2\nbaseline = \"nvmfd\"\ngoal = {{ iops = 10000 }}\n\
             [[target]]\nname = \"nvmfd\"\nkind = \"nvmfd\"\nconfig = \"nvmfd.json\"\n\
             [[target]]\nname = \"other\"\nkind = \"trid\"\ntrid = \"{TRID}\"\n\
             [[workload]]\nname = \"r4k\"\nrw = \"randread\"\nqd = 8\nruntime = 3\n\
             [[workload]]\nrw = \"write\"\nbs = \"128k\"\nqueues = 2\nruntime = \"1m\"\nramp = 2\n"
        ),
    )
    .unwrap();
    let o = nvmf(&["bench", "plan", spec.to_str().unwrap(), "--sample-ms", "0"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("nvmfd: nvmfd started from"), "{out}");
    assert!(out.contains("Goal: 10000 IOPS per client"), "{out}");
    assert!(out.contains("Baseline: nvmfd"), "{out}");
    assert!(
        out.contains("Runs: 2 targets x 2 workloads x 2 rounds = 8"),
        "{out}"
    );
    // Round 1 starts with nvmfd/r4k, round 2 with other/write-128k-qd32x2.
    let cells: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(" round "))
        .map(|l| l.split_whitespace().nth(3).unwrap())
        .collect();
    assert_eq!(cells.len(), 8, "{out}");
    assert_eq!(cells[0], "nvmfd/r4k");
    assert_eq!(cells[4], "other/write-128k-qd32x2");
    // 2 rounds × 2 targets × (3 s + 62 s).
    assert!(out.contains("Estimated time: 0h04m20s"), "{out}");

    // A bad field: non-zero exit, the field and the allowed values named.
    std::fs::write(&spec, "[[target]]\nname = \"t\"\nkind = \"trid\"\ntrid = \"traddr:127.0.0.1 subnqn:nqn.x\"\n[[workload]]\nrw = \"sideways\"\n").unwrap();
    let o = nvmf(&["bench", "plan", spec.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(err.contains("rw = \"sideways\""), "{err}");
    assert!(err.contains("randread"), "{err}");
    assert!(err.contains("bench.toml"), "{err}");
    // An unknown key is named with the keys allowed there.
    std::fs::write(&spec, "[[workload]]\nblocksize = 4096\n").unwrap();
    let o = nvmf(&["bench", "plan", spec.to_str().unwrap()]);
    let err = text(&o).1;
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("blocksize") && err.contains("`bs`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plan_spdk_and_kernel_targets_and_refuse_impossible_engine_fields() {
    let dir = std::env::temp_dir().join(format!("nvmf-bench-cli-sk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("nvmf_tgt"), "").unwrap();
    std::fs::write(dir.join("disk.img"), "").unwrap();
    std::fs::write(
        dir.join("spdk.json"),
        r#"{"subsystems": [{"subsystem": "nvmf", "config": [
            {"method": "nvmf_subsystem_add_listener", "params": {"nqn": "nqn.2016-06.io.spdk:cnode1",
             "listen_address": {"trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1", "trsvcid": "4543"}}}]}]}"#,
    )
    .unwrap();
    let spec = dir.join("bench.toml");
    std::fs::write(
        &spec,
        "engine = \"spdk-perf\"\n\
         [[target]]\nname = \"spdk\"\nkind = \"spdk\"\nbinary = \"nvmf_tgt\"\nconfig = \"spdk.json\"\n\
         [[target]]\nname = \"linux\"\nkind = \"kernel\"\nbacking = \"disk.img\"\nport = 4544\n\
         [[workload]]\nruntime = 1\n",
    )
    .unwrap();
    let o = nvmf(&["bench", "plan", spec.to_str().unwrap(), "--sample-ms", "0"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("spdk: SPDK ")
            && out.contains("trsvcid:4543 subnqn:nqn.2016-06.io.spdk:cnode1"),
        "{out}"
    );
    assert!(
        out.contains("linux: Linux kernel target (configfs)")
            && out.contains("trsvcid:4544 subnqn:nqn.2024-01.io.nvmfd:bench-linux"),
        "{out}"
    );
    assert!(out.contains("Engine: spdk-perf"), "{out}");
    // clients with nvmf-perf, device without fio-kernel: refused, named.
    for (bad, words) in [
        (
            "clients = [\"h1\"]\n",
            &["clients", "not \"nvmf-perf\""][..],
        ),
        (
            "engine = \"fio-kernel\"\n",
            &["fio-kernel\" needs device"][..],
        ),
    ] {
        std::fs::write(
            &spec,
            format!(
                "{bad}[[target]]\nname = \"t\"\nkind = \"trid\"\ntrid = \"{TRID}\"\n[[workload]]\n"
            ),
        )
        .unwrap();
        let o = nvmf(&["bench", "plan", spec.to_str().unwrap(), "--sample-ms", "0"]);
        let err = text(&o).1;
        assert_eq!(o.status.code(), Some(1), "{err}");
        for w in words {
            assert!(err.contains(w), "{bad:?}: {err} lacks {w}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_teaches_the_spec_format() {
    for args in [&["bench", "--help"][..], &["bench", "plan", "--help"][..]] {
        let o = nvmf(args);
        let out = text(&o).0;
        assert!(o.status.success());
        for w in [
            "[[target]]",
            "[[workload]]",
            "seed-4k-randrw",
            "repetitions",
        ] {
            assert!(out.contains(w), "{args:?} lacks {w}: {out}");
        }
    }
}
