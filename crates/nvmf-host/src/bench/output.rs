//! bench/output.rs — the files a bench run leaves behind and the terminal
//! summary: `bench.json` (the whole `BenchReport`), `bench.csv` (one row
//! per measurement, every figure), `bench.md` (Markdown report),
//! `bench.html` (drawn by html.rs), `text_summary` (compact table), and
//! `load_report` (reads a `bench.json` back, for `bench compare`). Also the
//! number formatting the other outputs share.

use super::results::{BenchReport, CellSummary, Measurement, Range, REPORT_FORMAT};
use super::summary;
use anyhow::{bail, Context as _};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Decimals that give a figure of magnitude `a` about four significant
/// digits.
fn decimals(a: f64) -> usize {
    if a >= 1000.0 {
        0
    } else if a >= 100.0 {
        1
    } else if a >= 10.0 {
        2
    } else if a >= 0.01 || a == 0.0 {
        3
    } else {
        6
    }
}

/// A figure with about four significant digits (no exponent).
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    format!("{x:.*}", decimals(x.abs()))
}

/// `mean (min–max)`, or just `mean` when min = max; all three with the
/// decimals of the largest.
pub fn range_text(r: &Range) -> String {
    if r.min == r.max {
        return num(r.mean);
    }
    let big = r.min.abs().max(r.max.abs());
    if !big.is_finite() {
        return format!("{} ({}–{})", num(r.mean), num(r.min), num(r.max));
    }
    let d = decimals(big);
    format!("{:.d$} ({:.d$}–{:.d$})", r.mean, r.min, r.max)
}

/// `range_text` of an optional figure ("–" when absent).
pub fn opt_range_text(r: &Option<Range>) -> String {
    r.as_ref().map_or_else(|| "–".to_string(), range_text)
}

/// A ratio as a percentage (`87.5%`), "–" when absent.
pub fn pct(r: Option<f64>) -> String {
    r.map_or_else(|| "–".to_string(), |v| format!("{:.1}%", v * 100.0))
}

/// The report's cell summaries; summarized from the measurements here when
/// the report carries none (a runner that stopped early, a hand-made file).
/// The goal is only known as text then, so no goal ratio is computed.
pub fn cells_of(report: &BenchReport) -> Cow<'_, [CellSummary]> {
    if report.cells.is_empty() && !report.measurements.is_empty() {
        Cow::Owned(summary::summarize(
            &report.measurements,
            report.baseline.as_deref(),
            None,
        ))
    } else {
        Cow::Borrowed(&report.cells)
    }
}

/// Write bench.json, bench.csv, bench.md and bench.html into `dir`
/// (created if missing); returns the paths written.
pub fn write_outputs(report: &BenchReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files: [(&str, Vec<u8>); 4] = [
        (
            "bench.json",
            serde_json::to_vec_pretty(report).context("encoding the report as JSON")?,
        ),
        ("bench.csv", csv_bytes(&report.measurements)?),
        ("bench.md", markdown(report).into_bytes()),
        ("bench.html", super::html::report_html(report).into_bytes()),
    ];
    let mut written = Vec::new();
    for (name, bytes) in files {
        let p = dir.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        written.push(p);
    }
    Ok(written)
}

/// Read a `bench.json` back. A file that is not a bench report, or one
/// written by a newer format than this build reads, gets a clear error.
pub fn load_report(path: &Path) -> anyhow::Result<BenchReport> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not JSON, so not a bench report", path.display()))?;
    let format = match v.get("format") {
        Some(f) if v.get("measurements").is_some() => f.as_u64(),
        _ => bail!(
            "{}: not a bench report (no \"format\" and \"measurements\" fields; \
             give the bench.json that `nvmf bench run` wrote)",
            path.display()
        ),
    };
    match format {
        Some(f) if f > REPORT_FORMAT as u64 => bail!(
            "{}: report format {f} is newer than this nvmf reads (up to {REPORT_FORMAT}); \
             use a newer nvmf",
            path.display()
        ),
        Some(f) if f >= 1 => {}
        _ => bail!(
            "{}: bench report \"format\" must be a positive integer",
            path.display()
        ),
    }
    serde_json::from_value(v).with_context(|| format!("{}: malformed bench report", path.display()))
}

// ---- CSV -------------------------------------------------------------------

/// CSV columns, in order (one row per measurement).
pub const CSV_HEADER: &[&str] = &[
    "cell",
    "target",
    "workload",
    "round",
    "engine",
    "clients",
    "seconds",
    "iops",
    "mibps",
    "gbps",
    "errors",
    "read_ios",
    "read_bytes",
    "write_ios",
    "write_bytes",
    "lat_mean_us",
    "lat_min_us",
    "lat_p50_us",
    "lat_p99_us",
    "lat_p999_us",
    "lat_p9999_us",
    "lat_max_us",
    "read_lat_mean_us",
    "read_lat_p50_us",
    "read_lat_p99_us",
    "read_lat_p999_us",
    "read_lat_max_us",
    "write_lat_mean_us",
    "write_lat_p50_us",
    "write_lat_p99_us",
    "write_lat_p999_us",
    "write_lat_max_us",
    "initiator_cpu_s",
    "target_cpu_s",
    "initiator_us_per_io",
    "target_us_per_io",
    "initiator_cores",
    "target_cores",
    "target_cycles_per_io",
    "target_instructions_per_io",
    "initiator_cycles_per_io",
    "initiator_instructions_per_io",
    "target_reads",
    "target_writes",
    "load1",
    "steal_pct",
    "pinned",
    "started_unix",
    "notes",
    "command",
];

fn opt(v: Option<f64>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

fn csv_row(m: &Measurement) -> Vec<String> {
    let r = &m.result;
    let (rl, wl) = (&r.read.latency, &r.write.latency);
    let c = &m.cpu;
    vec![
        m.cell.clone(),
        m.target.clone(),
        m.workload.clone(),
        m.round.to_string(),
        m.engine.clone(),
        m.clients.to_string(),
        r.seconds.to_string(),
        m.iops.to_string(),
        m.mibps.to_string(),
        m.gbps.to_string(),
        r.errors.to_string(),
        r.read.ios.to_string(),
        r.read.bytes.to_string(),
        r.write.ios.to_string(),
        r.write.bytes.to_string(),
        r.all.mean_us.to_string(),
        r.all.min_us.to_string(),
        r.all.p50_us.to_string(),
        r.all.p99_us.to_string(),
        r.all.p999_us.to_string(),
        r.all.p9999_us.to_string(),
        r.all.max_us.to_string(),
        rl.mean_us.to_string(),
        rl.p50_us.to_string(),
        rl.p99_us.to_string(),
        rl.p999_us.to_string(),
        rl.max_us.to_string(),
        wl.mean_us.to_string(),
        wl.p50_us.to_string(),
        wl.p99_us.to_string(),
        wl.p999_us.to_string(),
        wl.max_us.to_string(),
        opt(c.initiator_s),
        opt(c.target_s),
        opt(c.initiator_us_per_io),
        opt(c.target_us_per_io),
        opt(c.initiator_cores),
        opt(c.target_cores),
        opt(c.target_cycles_per_io),
        opt(c.target_instructions_per_io),
        opt(c.initiator_cycles_per_io),
        opt(c.initiator_instructions_per_io),
        m.target_ios.map(|t| t.0.to_string()).unwrap_or_default(),
        m.target_ios.map(|t| t.1.to_string()).unwrap_or_default(),
        opt(m.load1),
        opt(m.steal_pct),
        m.pinned
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        m.started_unix.to_string(),
        m.notes.join("; "),
        r.command.clone(),
    ]
}

/// The CSV file: a header row, then one row per measurement (RFC 4180
/// quoting by the `csv` crate).
pub fn csv_bytes(measurements: &[Measurement]) -> anyhow::Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(CSV_HEADER)?;
    for m in measurements {
        w.write_record(csv_row(m))?;
    }
    w.into_inner().context("finishing the CSV")
}

// ---- Markdown --------------------------------------------------------------

/// Text safe inside a Markdown table cell or list item: one line, no
/// column break, no inline HTML or code span (names and notes come from
/// user specs and tools). Backslash escapes, as CommonMark defines them.
fn md_cell(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' | '|' | '<' | '>' | '&' | '`' => {
                o.push('\\');
                o.push(c);
            }
            '\n' | '\r' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// A fenced code block that `text` cannot close early.
fn md_code(o: &mut String, text: &str) {
    let mut fence = "```".to_string();
    while text.contains(&fence) {
        fence.push('`');
    }
    let _ = writeln!(o, "{fence}\n{}\n{fence}\n", text.trim_end());
}

fn cpus(v: &[usize]) -> String {
    if v.is_empty() {
        "–".into()
    } else {
        super::placement::format_cpulist(v)
    }
}

/// Workloads in the order they first appear among the cells.
pub fn workloads(cells: &[CellSummary]) -> Vec<&str> {
    let mut w: Vec<&str> = Vec::new();
    for c in cells {
        if !w.contains(&c.workload.as_str()) {
            w.push(&c.workload);
        }
    }
    w
}

/// Every warning of the report: placement warnings and run notes
/// (deduplicated, in order).
pub fn warnings(report: &BenchReport) -> Vec<String> {
    // The same text for several targets or runs (a perf that cannot count
    // here, no NUMA information on lo) is one line naming them all.
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    let mut add = |who: String, text: &str| match groups.iter_mut().find(|g| g.0 == text) {
        Some(g) => {
            if !g.1.contains(&who) {
                g.1.push(who)
            }
        }
        None => groups.push((text.to_string(), vec![who])),
    };
    for p in &report.placements {
        for w in &p.warnings {
            add(p.target.clone(), w);
        }
    }
    for m in &report.measurements {
        for n in &m.notes {
            add(format!("{} round {}", m.cell, m.round + 1), n);
        }
    }
    let runs = report.measurements.len();
    groups
        .into_iter()
        .map(|(text, who)| {
            let whom = if who.len() > 1
                && who.len() == runs
                && who.iter().all(|w| w.contains(" round "))
            {
                format!("every run ({runs})")
            } else if who.len() > 4 {
                format!("{} runs ({}, ...)", who.len(), who[..3].join(", "))
            } else {
                who.join(", ")
            };
            format!("{whom}: {text}")
        })
        .collect()
}

/// The machine context as (label, value) rows, for the Markdown and HTML
/// tables.
pub fn machine_rows(m: &crate::bench::results::MachineContext) -> Vec<(&'static str, String)> {
    let versions: Vec<String> = m.versions.iter().map(|(k, v)| format!("{k} {v}")).collect();
    vec![
        ("host", m.hostname.clone()),
        ("CPU", m.cpu_model.clone()),
        ("online CPUs", m.cpus.to_string()),
        ("NUMA nodes", m.numa_nodes.to_string()),
        ("kernel", m.kernel.clone()),
        ("memory", format!("{:.1} GiB", m.memory_gib)),
        ("NICs", m.nics.join(", ")),
        ("versions", versions.join(", ")),
        ("load (1 min) before", format!("{:.2}", m.load1_before)),
        (
            "virtualized",
            if m.virtualized { "yes" } else { "no" }.into(),
        ),
    ]
}

/// Seconds since the Unix epoch as `2026-11-23T20:50:27Z`.
pub fn utc_time(unix: f64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0.0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The distinct commands of the runs, in order.
pub fn commands(report: &BenchReport) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for m in &report.measurements {
        let c = m.result.command.as_str();
        if !c.is_empty() && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// What efficiency compares, for the reader.
pub const EFFICIENCY_NOTE: &str = "efficiency = mean IOPS / the baseline cell's mean IOPS \
(mean MiB/s for cells whose I/Os average 64 KiB or more); goal = mean per-client figure / goal";

/// The Markdown report.
pub fn markdown(report: &BenchReport) -> String {
    let mut o = String::new();
    let cells = cells_of(report);
    let _ = writeln!(o, "# nvmf bench report\n");
    let _ = writeln!(o, "- spec: {}", md_cell(&report.spec_source));
    let _ = writeln!(
        o,
        "- started {}, took {:.0} s{}",
        utc_time(report.started_unix),
        (report.finished_unix - report.started_unix).max(0.0),
        if report.interrupted {
            " — INTERRUPTED: the matrix did not finish; the figures cover the runs done"
        } else {
            ""
        }
    );
    if let Some(b) = &report.baseline {
        let _ = writeln!(o, "- baseline: {}", md_cell(b));
    }
    if let Some(g) = &report.goal {
        let _ = writeln!(o, "- goal: {}", md_cell(g));
    }
    let m = &report.machine;
    let _ = writeln!(o, "\n## Machine\n\n| | |\n|---|---|");
    for (k, v) in machine_rows(m) {
        let _ = writeln!(o, "| {k} | {} |", md_cell(&v));
    }
    if !report.placements.is_empty() {
        let _ = writeln!(
            o,
            "\n## Placement\n\n| target | interface | NUMA node | node CPUs | initiator pinned | target CPUs | warnings |\n|---|---|---|---|---|---|---|"
        );
        for p in &report.placements {
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} |",
                md_cell(&p.target),
                md_cell(p.interface.as_deref().unwrap_or("–")),
                p.node.map_or("–".into(), |n| n.to_string()),
                cpus(&p.node_cpus),
                cpus(&p.pinned),
                cpus(&p.target_cpus),
                md_cell(&p.warnings.join("; "))
            );
        }
    }
    let _ = writeln!(
        o,
        "\n## Results\n\nEach figure: mean (min–max) over the rounds. Latency in µs, CPU in µs per I/O; {EFFICIENCY_NOTE}.\n"
    );
    for w in workloads(&cells) {
        let _ = writeln!(
            o,
            "### {}\n\n| target | runs | IOPS | MiB/s | mean µs | p50 µs | p99 µs | p99.9 µs | p99.99 µs | target CPU µs/IO | initiator CPU µs/IO | errors | efficiency | goal |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            md_cell(w)
        );
        for c in cells.iter().filter(|c| c.workload == w) {
            let eff = match (&c.efficiency, &c.baseline_cell) {
                (Some(_), Some(b)) if *b == c.cell => "baseline".to_string(),
                (e, _) => pct(*e),
            };
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                md_cell(&c.target),
                c.runs,
                range_text(&c.iops),
                range_text(&c.mibps),
                range_text(&c.lat_mean_us),
                range_text(&c.lat_p50_us),
                range_text(&c.lat_p99_us),
                range_text(&c.lat_p999_us),
                range_text(&c.lat_p9999_us),
                opt_range_text(&c.target_us_per_io),
                opt_range_text(&c.initiator_us_per_io),
                c.errors,
                eff,
                pct(c.goal_ratio)
            );
        }
        let _ = writeln!(o);
    }
    if cells.is_empty() {
        let _ = writeln!(o, "No measurements.\n");
    }
    if !report.failures.is_empty() {
        let _ = writeln!(o, "## Failures\n\n| cell | round | why |\n|---|---|---|");
        for (cell, round, why) in &report.failures {
            let _ = writeln!(
                o,
                "| {} | {} | {} |",
                md_cell(cell),
                round + 1,
                md_cell(why)
            );
        }
        let _ = writeln!(o);
    }
    let warns = warnings(report);
    if !warns.is_empty() {
        let _ = writeln!(o, "## Notes and warnings\n");
        for w in warns {
            let _ = writeln!(o, "- {}", md_cell(&w));
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(o, "## Commands\n\nThe bench:\n");
    md_code(&mut o, &report.command);
    let cmds = commands(report);
    if !cmds.is_empty() {
        let _ = writeln!(o, "Each run by hand:\n");
        md_code(&mut o, &cmds.join("\n"));
    }
    if !report.spec_text.is_empty() {
        let _ = writeln!(o, "The spec:\n");
        md_code(&mut o, &report.spec_text);
    }
    o
}

// ---- terminal --------------------------------------------------------------

/// A compact table of the cells for the terminal.
pub fn text_summary(report: &BenchReport) -> String {
    let cells = cells_of(report);
    let head = [
        "cell",
        "runs",
        "IOPS",
        "MiB/s",
        "p99 µs",
        "tgt CPU µs/IO",
        "eff",
        "goal",
        "errors",
    ];
    let rows: Vec<Vec<String>> = cells
        .iter()
        .map(|c| {
            vec![
                c.cell.clone(),
                c.runs.to_string(),
                range_text(&c.iops),
                range_text(&c.mibps),
                range_text(&c.lat_p99_us),
                opt_range_text(&c.target_us_per_io),
                pct(c.efficiency),
                pct(c.goal_ratio),
                c.errors.to_string(),
            ]
        })
        .collect();
    let mut o = table(&head, &rows);
    if cells.is_empty() {
        o.push_str("(no measurements)\n");
    }
    if !report.failures.is_empty() {
        let _ = writeln!(o, "{} run(s) failed:", report.failures.len());
        for (cell, round, why) in &report.failures {
            let _ = writeln!(o, "  {cell} round {}: {why}", round + 1);
        }
    }
    if report.interrupted {
        o.push_str("INTERRUPTED: the matrix did not finish.\n");
    }
    o
}

/// Left-aligned columns padded to the widest entry (by characters).
pub fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut o = String::new();
    let mut line = |cols: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cols.enumerate() {
            let _ = write!(l, "{c}{:pad$}  ", "", pad = width[i] - c.chars().count());
        }
        o.push_str(l.trim_end());
        o.push('\n');
    };
    line(&mut head.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    o
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::bench::results::*;

    /// A small report: two targets on one workload, two rounds each.
    #[test]
    fn times_are_utc() {
        assert_eq!(utc_time(1795467028.4), "2026-11-23T20:50:28Z");
        assert_eq!(utc_time(0.0), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn identical_notes_are_one_line_naming_the_runs() {
        let mut r = BenchReport::default();
        for (i, cell) in ["a/w", "b/w", "a/w", "b/w", "a/w", "b/w"]
            .iter()
            .enumerate()
        {
            let mut notes = vec!["perf cannot count".to_string()];
            if i == 3 {
                notes.push("COUNTER MISMATCH".to_string());
            }
            r.measurements.push(Measurement {
                cell: cell.to_string(),
                round: (i / 2) as u32,
                notes,
                ..Default::default()
            });
        }
        for t in ["a", "b"] {
            r.placements.push(PlacementRecord {
                target: t.into(),
                warnings: vec!["no NUMA information".into()],
                ..Default::default()
            });
        }
        let w = warnings(&r);
        assert_eq!(
            w,
            [
                "a, b: no NUMA information",
                "every run (6): perf cannot count",
                "b/w round 2: COUNTER MISMATCH",
            ],
            "{w:?}"
        );
        r.measurements[5].notes.clear();
        assert_eq!(
            warnings(&r)[1],
            "5 runs (a/w round 1, b/w round 1, a/w round 2, ...): perf cannot count"
        );
    }

    pub(crate) fn sample_report() -> BenchReport {
        let mut ms = Vec::new();
        for (t, base) in [("nvmfd", 1000.0), ("spdk", 2000.0)] {
            for round in 0..2u32 {
                let iops = base + 100.0 * round as f64;
                ms.push(Measurement {
                    cell: format!("{t}/4k"),
                    target: t.into(),
                    workload: "4k".into(),
                    round,
                    engine: "nvmf-perf".into(),
                    clients: 1,
                    iops,
                    mibps: iops * 4096.0 / 1048576.0,
                    result: EngineResult {
                        seconds: 1.0,
                        all: Latency {
                            p50_us: 10.0,
                            p99_us: 20.0 + round as f64,
                            curve: vec![(50.0, 10.0), (90.0, 15.0), (99.0, 20.0), (99.9, 40.0)],
                            ..Default::default()
                        },
                        command: format!("nvmf perf --target {t}"),
                        ..Default::default()
                    },
                    cpu: CpuFigures {
                        target_us_per_io: Some(5.0 + round as f64),
                        initiator_us_per_io: Some(3.0),
                        ..Default::default()
                    },
                    notes: vec!["no perf counters".into()],
                    ..Default::default()
                });
            }
        }
        let cells = crate::bench::summary::summarize(&ms, Some("spdk"), None);
        BenchReport {
            format: REPORT_FORMAT,
            spec_source: "quick".into(),
            spec_text: "repetitions = 2\n".into(),
            command: "nvmf bench run quick".into(),
            machine: MachineContext {
                hostname: "box".into(),
                cpus: 2,
                ..Default::default()
            },
            placements: vec![PlacementRecord {
                target: "nvmfd".into(),
                interface: Some("lo".into()),
                pinned: vec![1],
                warnings: vec!["BUSY CORE 1".into()],
                ..Default::default()
            }],
            baseline: Some("spdk".into()),
            measurements: ms,
            cells,
            failures: vec![("spdk/4k".into(), 2, "connect refused".into())],
            ..Default::default()
        }
    }

    #[test]
    fn number_formatting() {
        let r = |min, mean, max| range_text(&Range { min, mean, max });
        assert_eq!(num(123456.7), "123457");
        assert_eq!(num(12.3456), "12.35");
        assert_eq!(num(0.001234), "0.001234");
        assert_eq!(num(0.0), "0.000");
        // The decimals of the largest value, for all three.
        assert_eq!(r(900.0, 1000.0, 1100.0), "1000 (900–1100)");
        assert_eq!(r(1.5, 2.0, 12.25), "2.00 (1.50–12.25)");
        assert_eq!(r(5.0, 5.0, 5.0), "5.000");
        assert_eq!(opt_range_text(&None), "–");
        assert_eq!(pct(Some(0.5)), "50.0%");
    }

    #[test]
    fn csv_has_header_and_quotes_fields() {
        let mut r = sample_report();
        r.measurements[0].result.command = "fio --name=\"a, b\"\nnext".into();
        r.measurements[0].notes = vec!["x, y".into(), "z".into()];
        let bytes = csv_bytes(&r.measurements).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.starts_with("cell,target,workload,round,"), "{text}");
        // RFC 4180: a field with a comma, quote or newline is quoted, quotes doubled.
        assert!(text.contains("\"fio --name=\"\"a, b\"\"\nnext\""), "{text}");
        assert!(text.contains(",\"x, y; z\","), "{text}");
        // Reads back to the same fields, one record per measurement.
        let mut rd = csv::Reader::from_reader(&bytes[..]);
        assert_eq!(rd.headers().unwrap().len(), CSV_HEADER.len());
        let recs: Vec<csv::StringRecord> = rd.records().map(|r| r.unwrap()).collect();
        assert_eq!(recs.len(), 4);
        assert!(recs.iter().all(|r| r.len() == CSV_HEADER.len()));
        let col = |n: &str| CSV_HEADER.iter().position(|h| *h == n).unwrap();
        assert_eq!(&recs[0][col("command")], "fio --name=\"a, b\"\nnext");
        assert_eq!(&recs[1][col("iops")], "1100");
        assert_eq!(&recs[1][col("target_us_per_io")], "6");
        assert_eq!(&recs[1][col("initiator_cycles_per_io")], "");
    }

    #[test]
    fn markdown_shape() {
        let mut r = sample_report();
        r.placements[0].target = "evil|name".into();
        r.placements[0].warnings = vec!["<img src=x>\nnext `x` & y".into()];
        let md = markdown(&r);
        for want in [
            "# nvmf bench report",
            "## Machine",
            "| host | box |",
            "## Placement",
            "| evil\\|name | lo |",
            "| \\<img src=x\\> next \\`x\\` \\& y |",
            "- evil\\|name: \\<img src=x\\> next \\`x\\` \\& y\n",
            "### 4k",
            "## Failures",
            "| spdk/4k | 3 | connect refused |",
            "## Notes and warnings",
            "## Commands",
            "nvmf perf --target spdk",
        ] {
            assert!(md.contains(want), "missing {want:?} in\n{md}");
        }
        // One row per target in the workload table, mean (min–max), efficiency.
        let row = md
            .lines()
            .find(|l| l.starts_with("| nvmfd | 2 |"))
            .expect(&md);
        assert!(row.contains("| 1050 (1000–1100) |"), "{row}");
        // 1050 / 2050 mean IOPS of the baseline target.
        assert!(row.contains("| 51.2% |"), "{row}");
        assert!(md
            .lines()
            .any(|l| l.starts_with("| spdk | 2 |") && l.contains("| baseline |")));
        // Every table row of a table has as many columns as its header.
        let mut cols = None;
        for l in md.lines() {
            if !l.starts_with('|') {
                cols = None;
                continue;
            }
            let n = l.replace("\\|", "").matches('|').count();
            assert_eq!(*cols.get_or_insert(n), n, "ragged row {l}");
        }
    }

    #[test]
    fn text_summary_lists_cells_and_failures() {
        let t = text_summary(&sample_report());
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("cell") && lines[0].contains("IOPS"),
            "{t}"
        );
        assert!(
            lines[1].starts_with("nvmfd/4k") && lines[1].contains("1050 (1000–1100)"),
            "{t}"
        );
        assert!(
            lines[2].starts_with("spdk/4k") && lines[2].contains("100.0%"),
            "{t}"
        );
        assert!(t.contains("1 run(s) failed"), "{t}");
    }

    #[test]
    fn load_report_round_trip_and_errors() {
        struct Gone(std::path::PathBuf);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = std::env::temp_dir().join(format!("nvmf-bench-out-{}", std::process::id()));
        let _gone = Gone(dir.clone()); // removed also when an assertion fails
        let r = sample_report();
        let files = write_outputs(&r, &dir).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["bench.json", "bench.csv", "bench.md", "bench.html"]);
        assert_eq!(load_report(&dir.join("bench.json")).unwrap(), r);
        let bad = dir.join("bad.json");
        for (text, want) in [
            ("{\"hello\": 1}", "not a bench report"),
            ("[1, 2]", "not a bench report"),
            ("not json", "not JSON"),
            (
                "{\"format\": 99, \"measurements\": []}",
                "newer than this nvmf",
            ),
            (
                "{\"format\": 1, \"measurements\": 3}",
                "malformed bench report",
            ),
        ] {
            std::fs::write(&bad, text).unwrap();
            let e = format!("{:#}", load_report(&bad).unwrap_err());
            assert!(e.contains(want) && e.contains("bad.json"), "{text}: {e}");
        }
        let e = format!("{:#}", load_report(&dir.join("missing.json")).unwrap_err());
        assert!(e.contains("reading") && e.contains("missing.json"), "{e}");
    }

    #[test]
    fn cells_are_summarized_when_missing() {
        let mut r = sample_report();
        let want = r.cells.clone();
        r.cells.clear();
        assert_eq!(&*cells_of(&r), &want[..]);
    }
}
