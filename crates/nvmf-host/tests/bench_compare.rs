//! `nvmf bench compare` end to end through the binary on two synthetic
//! bench.json files in a temp dir: verdicts where ranges are apart, none
//! where they overlap, cells in one report only, the --html page, and exit
//! 1 with a clear message on a missing file or a file that is no report.

use nvmf_host::bench::results::{BenchReport, EngineResult, Latency, Measurement, REPORT_FORMAT};
use nvmf_host::bench::summary::summarize;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// A report with one measurement per (cell, iops, p99) given.
fn report(runs: &[(&str, f64, f64)]) -> BenchReport {
    let measurements: Vec<Measurement> = runs
        .iter()
        .enumerate()
        .map(|(i, &(cell, iops, p99))| {
            let (t, w) = cell.split_once('/').unwrap();
            Measurement {
                cell: cell.into(),
                target: t.into(),
                workload: w.into(),
                round: i as u32,
                engine: "nvmf-perf".into(),
                clients: 1,
                iops,
                mibps: iops * 4096.0 / 1048576.0,
                result: EngineResult {
                    seconds: 1.0,
                    all: Latency {
                        p50_us: p99 / 2.0,
                        p99_us: p99,
                        ..Default::default()
                    },
                    ..Default::default()
                },
                ..Default::default()
            }
        })
        .collect();
    BenchReport {
        format: REPORT_FORMAT,
        cells: summarize(&measurements, None, None),
        measurements,
        ..Default::default()
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("nvmf-bench-compare-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

fn write(dir: &Path, name: &str, r: &BenchReport) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(r).unwrap()).unwrap();
    p.display().to_string()
}

#[test]
fn compares_two_reports() {
    let d = tempdir("ok");
    // fast/w: B's range (1900–2100 IOPS, 90–110 µs) is apart from A's
    // (900–1100, 190–210): faster and lower latency. same/w: overlapping.
    let a = report(&[
        ("fast/w", 900.0, 210.0),
        ("fast/w", 1100.0, 190.0),
        ("same/w", 1000.0, 100.0),
        ("same/w", 1200.0, 120.0),
        ("gone/w", 5.0, 1.0),
    ]);
    let b = report(&[
        ("fast/w", 1900.0, 110.0),
        ("fast/w", 2100.0, 90.0),
        ("same/w", 1100.0, 110.0),
        ("same/w", 1300.0, 130.0),
        ("new/w", 5.0, 1.0),
    ]);
    let (pa, pb) = (write(&d.0, "a.json", &a), write(&d.0, "b.json", &b));
    let html = d.0.join("cmp.html");
    let o = nvmf(&[
        "bench",
        "compare",
        &pa,
        &pb,
        "--html",
        html.to_str().unwrap(),
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "stdout:\n{out}\nstderr:\n{err}");
    let fast = &out[out.find("fast/w").expect(&out)..out.find("same/w").expect(&out)];
    let line = |block: &str, name: &str| -> String {
        block
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {block}"))
            .to_string()
    };
    let iops = line(fast, "IOPS");
    assert!(
        iops.contains("1000 (900–1100)") && iops.contains("2000 (1900–2100)"),
        "{iops}"
    );
    assert!(
        iops.contains("x2.000") && iops.ends_with("B faster"),
        "{iops}"
    );
    assert!(
        line(fast, "p99 latency").ends_with("B lower latency"),
        "{out}"
    );
    assert!(
        line(fast, "target CPU").ends_with("not measured in either"),
        "{out}"
    );
    let same = &out[out.find("same/w").unwrap()..];
    assert!(
        line(same, "IOPS").ends_with("no clear difference (ranges overlap)"),
        "{out}"
    );
    assert!(
        out.contains("Only in A: gone/w") && out.contains("Only in B: new/w"),
        "{out}"
    );
    let page = std::fs::read_to_string(&html).expect("html written");
    assert!(page.contains("<svg") && page.contains("B faster"), "{page}");
    assert!(!page.to_ascii_lowercase().contains("<script"));
}

#[test]
fn unreadable_input_exits_1() {
    let d = tempdir("bad");
    let a = write(&d.0, "a.json", &report(&[("x/w", 1.0, 1.0)]));
    let missing = d.0.join("missing.json").display().to_string();
    let o = nvmf(&["bench", "compare", &a, &missing]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("reading") && err.contains("missing.json"),
        "{err}"
    );

    let other = d.0.join("other.json");
    std::fs::write(&other, "{\"name\": \"not a report\"}").unwrap();
    let o = nvmf(&["bench", "compare", other.to_str().unwrap(), &a]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("not a bench report") && err.contains("other.json"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
}
