//! bench/html.rs — the HTML pages: the report (`bench.html`) and the page
//! of `bench compare --html`. Each is one self-contained file: inline CSS,
//! charts as inline SVG drawn by `plotters` (SVG backend, no font backend:
//! the SVG carries <text> elements and the browser picks the font), no
//! script, no external reference. Every string that comes from a report
//! is escaped (names come from user specs).

use super::compare::Comparison;
use super::output::{
    cells_of, commands, num, opt_range_text, pct, range_text, warnings, workloads, EFFICIENCY_NOTE,
};
use super::placement::format_cpulist;
use super::results::{BenchReport, Measurement, Range};
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, ValueFormatter};
use plotters::prelude::*;
use std::fmt::Write as _;

/// `s` with the five HTML special characters replaced.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1200px}\
table{border-collapse:collapse;margin:0.5em 0 1.5em}\
th,td{border:1px solid #bbb;padding:3px 7px;text-align:left;vertical-align:top}\
th{background:#eee}td.n{text-align:right;font-variant-numeric:tabular-nums}\
pre{background:#f5f5f5;padding:0.6em;overflow-x:auto;white-space:pre-wrap}\
svg{max-width:100%;height:auto;display:block;margin:0.5em 0 1.5em}\
.warn{color:#a40}.good{color:#070}.bad{color:#a00}";

fn page_start(o: &mut String, title: &str) {
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(title),
        escape(title)
    );
}

/// A table from a header and rows of already-escaped HTML cells; cells
/// that start with a digit are right-aligned.
fn html_table(o: &mut String, head: &[&str], rows: &[Vec<String>]) {
    o.push_str("<table>\n<tr>");
    for h in head {
        let _ = write!(o, "<th>{}</th>", escape(h));
    }
    o.push_str("</tr>\n");
    for r in rows {
        o.push_str("<tr>");
        for c in r {
            let class = if c.starts_with(|ch: char| ch.is_ascii_digit()) {
                " class=\"n\""
            } else {
                ""
            };
            let _ = write!(o, "<td{class}>{c}</td>");
        }
        o.push_str("</tr>\n");
    }
    o.push_str("</table>\n");
}

fn pre(o: &mut String, text: &str) {
    let _ = writeln!(o, "<pre>{}</pre>", escape(text));
}

// ---- charts ----------------------------------------------------------------

/// One series of a bar chart: a value (min–max) per category.
pub struct Series {
    pub name: String,
    pub values: Vec<Option<Range>>,
}

/// Chart labels stay short; the tables carry the full names.
fn short(s: &str) -> String {
    if s.chars().count() > 40 {
        let mut t: String = s.chars().take(39).collect();
        t.push('…');
        t
    } else {
        s.to_string()
    }
}

/// A linear f64 axis whose ticks sit at chosen values with chosen labels
/// (categories of a bar chart, nines of the latency chart).
struct LabelAxis {
    lo: f64,
    hi: f64,
    ticks: Vec<(f64, String)>,
}

impl Ranged for LabelAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;
    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        if span <= 0.0 {
            return (limit.0 + limit.1) / 2;
        }
        let t = (v - self.lo) / span;
        limit.0 + (t * (limit.1 - limit.0) as f64).round() as i32
    }
    fn key_points<H: KeyPointHint>(&self, _hint: H) -> Vec<f64> {
        self.ticks.iter().map(|t| t.0).collect()
    }
    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

impl ValueFormatter<f64> for LabelAxis {
    fn format_ext(&self, v: &f64) -> String {
        self.ticks
            .iter()
            .find(|t| (t.0 - v).abs() < 1e-9)
            .map(|t| t.1.clone())
            .unwrap_or_default()
    }
}

/// An SVG chart, or a short note when it cannot be drawn.
fn svg_or_note(r: Result<String, String>) -> String {
    match r {
        Ok(svg) => svg,
        Err(e) => format!("<p class=\"warn\">(chart not drawn: {})</p>", escape(&e)),
    }
}

/// Horizontal bars, one group per category, one bar per series, each with
/// a min–max whisker; categories top to bottom in the given order.
pub fn bar_chart(title: &str, unit: &str, categories: &[String], series: &[Series]) -> String {
    svg_or_note(draw_bars(title, unit, categories, series))
}

fn draw_bars(
    title: &str,
    unit: &str,
    categories: &[String],
    series: &[Series],
) -> Result<String, String> {
    let n = categories.len();
    let k = series.len().max(1);
    let xmax = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .map(|r| r.max.max(r.mean))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let xmax = if xmax > 0.0 { xmax * 1.1 } else { 1.0 };
    let labels: Vec<String> = categories.iter().map(|c| short(c)).collect();
    let label_w = labels.iter().map(|l| l.chars().count()).max().unwrap_or(4) as u32 * 7 + 16;
    let height = (90 + n as u32 * (k as u32 * 18 + 12)).clamp(160, 4000);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        // Category i (top first) spans y in [n-1-i, n-i].
        // With a legend, one empty row at the bottom holds it.
        let axis = LabelAxis {
            lo: if k > 1 { -1.0 } else { 0.0 },
            hi: n.max(1) as f64,
            ticks: labels
                .iter()
                .enumerate()
                .map(|(i, l)| ((n - 1 - i) as f64 + 0.5, l.clone()))
                .collect(),
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(label_w.min(320))
            .build_cartesian_2d(0f64..xmax, axis)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(unit)
            .x_label_formatter(&|x| axis_num(*x))
            .draw()
            .map_err(|e| e.to_string())?;
        let band = 0.8 / k as f64;
        for (j, s) in series.iter().enumerate() {
            let color = Palette99::pick(j).to_rgba();
            let bars = s.values.iter().enumerate().filter_map(|(i, v)| {
                let v = (*v)?;
                // The first series on top within its group.
                let y0 = (n - 1 - i) as f64 + 0.1 + (k - 1 - j) as f64 * band;
                Some((v, y0))
            });
            let bars: Vec<(Range, f64)> = bars.collect();
            let anno = chart
                .draw_series(bars.iter().map(|(v, y0)| {
                    Rectangle::new([(0.0, *y0), (v.mean, y0 + band)], color.filled())
                }))
                .map_err(|e| e.to_string())?;
            if k > 1 {
                anno.label(s.name.clone()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                });
            }
            chart
                .draw_series(bars.iter().filter(|(v, _)| v.min != v.max).map(|(v, y0)| {
                    ErrorBar::new_horizontal(y0 + band / 2.0, v.min, v.mean, v.max, BLACK, 6)
                }))
                .map_err(|e| e.to_string())?;
        }
        if k > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// An axis tick: up to 3 decimals, trailing zeros dropped.
fn axis_num(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.to_string()
    }
}

/// Percentile → "nines": -log10(1 - p/100): p90 = 1, p99 = 2, p99.9 = 3.
pub fn nines(p: f64) -> f64 {
    -(1.0 - p / 100.0).log10()
}

fn nines_label(k: f64) -> String {
    match k.round() as i64 {
        0 => "p0".into(),
        1 => "p90".into(),
        k => format!(
            "p99{}{}",
            if k > 2 { "." } else { "" },
            "9".repeat(k as usize - 2)
        ),
    }
}

/// The round of a cell whose p99 is the median one (its curve stands for
/// the cell in the latency chart).
fn representative<'a>(ms: &[&'a Measurement]) -> Option<&'a Measurement> {
    let mut v = ms.to_vec();
    v.sort_by(|a, b| a.result.all.p99_us.total_cmp(&b.result.all.p99_us));
    v.get(v.len() / 2).copied()
}

/// (percentile, µs) points of a measurement: its curve, or the summary
/// percentiles when it has none.
fn curve_points(m: &Measurement) -> Vec<(f64, f64)> {
    let l = &m.result.all;
    let pts = if l.curve.is_empty() {
        vec![
            (50.0, l.p50_us),
            (99.0, l.p99_us),
            (99.9, l.p999_us),
            (99.99, l.p9999_us),
        ]
    } else {
        l.curve.clone()
    };
    pts.into_iter()
        .filter(|(p, us)| (0.0..100.0).contains(p) && *us > 0.0 && us.is_finite())
        // At most 6 nines wide, at least 1 ns high: a bounded log axis.
        .map(|(p, us)| (nines(p).min(6.0), us.max(0.001)))
        .collect()
}

/// Latency percentile curves, one line per cell (its median-p99 round),
/// x in nines, y (µs) logarithmic.
pub fn latency_chart(report: &BenchReport, cells: &[String]) -> String {
    let lines: Vec<(String, Vec<(f64, f64)>)> = cells
        .iter()
        .filter_map(|c| {
            let ms: Vec<&Measurement> = report
                .measurements
                .iter()
                .filter(|m| &m.cell == c)
                .collect();
            let pts = curve_points(representative(&ms)?);
            (!pts.is_empty()).then(|| (short(c), pts))
        })
        .collect();
    if lines.is_empty() {
        return "<p>(no latency distribution recorded)</p>".into();
    }
    svg_or_note(draw_latency(&lines))
}

fn draw_latency(lines: &[(String, Vec<(f64, f64)>)]) -> Result<String, String> {
    let all = lines.iter().flat_map(|(_, p)| p.iter());
    let (mut ylo, mut yhi, mut xhi) = (f64::INFINITY, 0.0f64, 2.0f64);
    for (x, y) in all {
        ylo = ylo.min(*y);
        yhi = yhi.max(*y);
        xhi = xhi.max(*x);
    }
    // No finite point: plotters would search ticks of an infinite range.
    if !(ylo.is_finite() && yhi.is_finite() && ylo > 0.0) {
        return Err("no latency points".into());
    }
    let xhi = xhi.ceil();
    let (ylo, yhi) = (ylo * 0.8, (yhi * 1.25).max(ylo * 1.01));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let axis = LabelAxis {
            lo: 0.0,
            hi: xhi,
            ticks: (0..=xhi as i64)
                .map(|k| (k as f64, nines_label(k as f64)))
                .collect(),
        };
        let mut chart = ChartBuilder::on(&root)
            .caption("Latency percentiles", ("sans-serif", 18))
            .margin(10)
            .margin_right(30)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(axis, (ylo..yhi).log_scale())
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("percentile (log scale in nines)")
            .y_desc("latency µs (log)")
            .y_label_formatter(&|y| axis_num(*y))
            .draw()
            .map_err(|e| e.to_string())?;
        for (j, (name, pts)) in lines.iter().enumerate() {
            let color = Palette99::pick(j).to_rgba();
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

// ---- the report page ---------------------------------------------------------

fn opt_num(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), num)
}

fn cpus(v: &[usize]) -> String {
    if v.is_empty() {
        "–".into()
    } else {
        format_cpulist(v)
    }
}

/// The whole `bench.html`.
pub fn report_html(report: &BenchReport) -> String {
    let cells = cells_of(report);
    let mut o = String::new();
    page_start(&mut o, "nvmf bench report");
    let _ = writeln!(
        o,
        "<p>Spec <code>{}</code>; started {}, took {:.0} s.</p>",
        escape(&report.spec_source),
        super::output::utc_time(report.started_unix),
        (report.finished_unix - report.started_unix).max(0.0)
    );
    if report.interrupted {
        o.push_str("<p class=\"warn\"><b>Interrupted:</b> the matrix did not finish; the figures cover the runs done.</p>\n");
    }
    if let Some(b) = &report.baseline {
        let _ = writeln!(o, "<p>Baseline: {}</p>", escape(b));
    }
    if let Some(g) = &report.goal {
        let _ = writeln!(o, "<p>Goal: {}</p>", escape(g));
    }

    // Charts.
    let ids: Vec<String> = cells.iter().map(|c| c.cell.clone()).collect();
    o.push_str("<h2>Charts</h2>\n<p>Bars: mean over the rounds; whiskers: min–max.</p>\n");
    let one = |name: &str, f: fn(&super::results::CellSummary) -> Option<Range>| Series {
        name: name.into(),
        values: cells.iter().map(f).collect(),
    };
    o.push_str(&bar_chart(
        "IOPS per cell",
        "IOPS",
        &ids,
        &[one("IOPS", |c| Some(c.iops))],
    ));
    o.push_str(&bar_chart(
        "MiB/s per cell",
        "MiB/s",
        &ids,
        &[one("MiB/s", |c| Some(c.mibps))],
    ));
    o.push_str(&latency_chart(report, &ids));
    if cells
        .iter()
        .any(|c| c.target_us_per_io.is_some() || c.initiator_us_per_io.is_some())
    {
        o.push_str(&bar_chart(
            "CPU per I/O",
            "CPU µs per I/O",
            &ids,
            &[
                one("target", |c| c.target_us_per_io),
                one("initiator", |c| c.initiator_us_per_io),
            ],
        ));
    } else {
        o.push_str("<p>(no CPU figures recorded)</p>\n");
    }

    // Per-workload tables.
    let _ = writeln!(
        o,
        "<h2>Results</h2>\n<p>Each figure: mean (min–max) over the rounds; latency in µs; CPU in µs per I/O; {}.</p>",
        escape(EFFICIENCY_NOTE)
    );
    for w in workloads(&cells) {
        let _ = writeln!(o, "<h3>{}</h3>", escape(w));
        let rows: Vec<Vec<String>> = cells
            .iter()
            .filter(|c| c.workload == w)
            .map(|c| {
                vec![
                    escape(&c.target),
                    c.runs.to_string(),
                    range_text(&c.iops),
                    range_text(&c.mibps),
                    range_text(&c.gbps),
                    range_text(&c.lat_mean_us),
                    range_text(&c.lat_p50_us),
                    range_text(&c.lat_p99_us),
                    range_text(&c.lat_p999_us),
                    range_text(&c.lat_p9999_us),
                    opt_range_text(&c.target_us_per_io),
                    opt_range_text(&c.initiator_us_per_io),
                    opt_range_text(&c.target_cycles_per_io),
                    c.errors.to_string(),
                    pct(c.efficiency),
                    escape(c.baseline_cell.as_deref().unwrap_or("–")),
                    pct(c.goal_ratio),
                ]
            })
            .collect();
        html_table(
            &mut o,
            &[
                "target",
                "runs",
                "IOPS",
                "MiB/s",
                "Gbit/s",
                "mean µs",
                "p50 µs",
                "p99 µs",
                "p99.9 µs",
                "p99.99 µs",
                "target CPU µs/IO",
                "initiator CPU µs/IO",
                "target cycles/IO",
                "errors",
                "efficiency",
                "baseline cell",
                "goal",
            ],
            &rows,
        );
    }
    if cells.is_empty() {
        o.push_str("<p>No measurements.</p>\n");
    }

    // Every run.
    o.push_str("<h2>Every run</h2>\n");
    let rows: Vec<Vec<String>> = report
        .measurements
        .iter()
        .map(|m| {
            let l = &m.result.all;
            vec![
                escape(&m.cell),
                (m.round + 1).to_string(),
                escape(&m.engine),
                m.clients.to_string(),
                num(m.result.seconds),
                num(m.iops),
                num(m.mibps),
                num(m.gbps),
                m.result.errors.to_string(),
                num(l.mean_us),
                num(l.p50_us),
                num(l.p99_us),
                num(l.p999_us),
                num(l.p9999_us),
                num(l.max_us),
                opt_num(m.cpu.target_us_per_io),
                opt_num(m.cpu.initiator_us_per_io),
                opt_num(m.cpu.target_cores),
                opt_num(m.cpu.initiator_cores),
                opt_num(m.cpu.target_cycles_per_io),
                opt_num(m.cpu.target_instructions_per_io),
                m.target_ios
                    .map_or("–".into(), |(r, w)| format!("{r} / {w}")),
                opt_num(m.load1),
                opt_num(m.steal_pct),
                cpus(&m.pinned),
            ]
        })
        .collect();
    html_table(
        &mut o,
        &[
            "cell",
            "round",
            "engine",
            "clients",
            "seconds",
            "IOPS",
            "MiB/s",
            "Gbit/s",
            "errors",
            "mean µs",
            "p50 µs",
            "p99 µs",
            "p99.9 µs",
            "p99.99 µs",
            "max µs",
            "target CPU µs/IO",
            "initiator CPU µs/IO",
            "target cores",
            "initiator cores",
            "target cycles/IO",
            "target instr/IO",
            "target reads / writes",
            "load1",
            "steal %",
            "pinned",
        ],
        &rows,
    );

    if !report.failures.is_empty() {
        o.push_str("<h2>Failures</h2>\n");
        let rows: Vec<Vec<String>> = report
            .failures
            .iter()
            .map(|(c, r, why)| vec![escape(c), (r + 1).to_string(), escape(why)])
            .collect();
        html_table(&mut o, &["cell", "round", "why"], &rows);
    }
    let warns = warnings(report);
    if !warns.is_empty() {
        o.push_str("<h2>Notes and warnings</h2>\n<ul>\n");
        for w in warns {
            let _ = writeln!(o, "<li class=\"warn\">{}</li>", escape(&w));
        }
        o.push_str("</ul>\n");
    }

    // Machine and placement.
    let m = &report.machine;
    o.push_str("<h2>Machine</h2>\n");
    let rows: Vec<Vec<String>> = super::output::machine_rows(m)
        .into_iter()
        .map(|(k, v)| vec![k.to_string(), escape(&v)])
        .collect();
    html_table(&mut o, &["", ""], &rows);
    if !report.placements.is_empty() {
        o.push_str("<h2>Placement</h2>\n");
        let rows: Vec<Vec<String>> = report
            .placements
            .iter()
            .map(|p| {
                vec![
                    escape(&p.target),
                    escape(p.interface.as_deref().unwrap_or("–")),
                    p.node.map_or("–".into(), |n| n.to_string()),
                    cpus(&p.node_cpus),
                    cpus(&p.pinned),
                    cpus(&p.target_cpus),
                    escape(&p.warnings.join("; ")),
                ]
            })
            .collect();
        html_table(
            &mut o,
            &[
                "target",
                "interface",
                "NUMA node",
                "node CPUs",
                "initiator pinned",
                "target CPUs",
                "warnings",
            ],
            &rows,
        );
    }

    // Commands and spec.
    o.push_str("<h2>Commands</h2>\n<p>The bench:</p>\n");
    pre(&mut o, &report.command);
    let cmds = commands(report);
    if !cmds.is_empty() {
        o.push_str("<p>Each run by hand:</p>\n");
        pre(&mut o, &cmds.join("\n"));
    }
    if !report.spec_text.is_empty() {
        o.push_str("<p>The spec:</p>\n");
        pre(&mut o, &report.spec_text);
    }
    o.push_str("</body>\n</html>\n");
    o
}

// ---- the compare page --------------------------------------------------------

/// The page of `nvmf bench compare --html`: per figure, paired bars (A, B)
/// per common cell, then the side-by-side table with the verdicts.
pub fn compare_html(c: &Comparison) -> String {
    let mut o = String::new();
    page_start(&mut o, "nvmf bench compare");
    let _ = writeln!(
        o,
        "<p>A: <code>{}</code><br>B: <code>{}</code></p>\n<p>Bars: mean over the rounds; whiskers: min–max. A verdict only where the min–max ranges do not overlap.</p>",
        escape(&c.a_label),
        escape(&c.b_label)
    );
    let ids: Vec<String> = c.cells.iter().map(|x| x.cell.clone()).collect();
    if !ids.is_empty() {
        for (i, f) in super::compare::FIGURES.iter().enumerate() {
            let pick = |side: usize| -> Vec<Option<Range>> {
                c.cells
                    .iter()
                    .map(|x| {
                        let fc = &x.figures[i];
                        if side == 0 {
                            fc.a
                        } else {
                            fc.b
                        }
                    })
                    .collect()
            };
            let (a, b) = (pick(0), pick(1));
            if a.iter().chain(&b).all(Option::is_none) {
                continue;
            }
            o.push_str(&bar_chart(
                f.name,
                f.name,
                &ids,
                &[
                    Series {
                        name: format!("A {}", short(&c.a_label)),
                        values: a,
                    },
                    Series {
                        name: format!("B {}", short(&c.b_label)),
                        values: b,
                    },
                ],
            ));
        }
    }
    o.push_str("<h2>Side by side</h2>\n");
    let rows: Vec<Vec<String>> = c
        .cells
        .iter()
        .flat_map(|x| {
            x.figures.iter().map(move |f| {
                let class = match f.verdict {
                    super::compare::Verdict::BBetter => "good",
                    super::compare::Verdict::BWorse => "bad",
                    _ => "",
                };
                vec![
                    escape(&x.cell),
                    escape(f.name),
                    opt_range_text(&f.a),
                    opt_range_text(&f.b),
                    f.ratio.map_or("–".into(), num),
                    format!("<span class=\"{class}\">{}</span>", escape(&f.text)),
                ]
            })
        })
        .collect();
    html_table(
        &mut o,
        &["cell", "figure", "A", "B", "B/A", "verdict"],
        &rows,
    );
    if c.cells.is_empty() {
        o.push_str("<p>No cell is in both reports.</p>\n");
    }
    for (side, list) in [("A", &c.only_a), ("B", &c.only_b)] {
        if !list.is_empty() {
            let names: Vec<String> = list.iter().map(|s| escape(s)).collect();
            let _ = writeln!(o, "<p>Only in {side}: {}</p>", names.join(", "));
        }
    }
    o.push_str("</body>\n</html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::output::tests::sample_report;

    const EVIL: &str = "<script>alert('x')</script>&\"";

    /// No script, no style or resource from elsewhere.
    fn assert_self_contained(h: &str) {
        let l = h.to_ascii_lowercase();
        for bad in [
            "<script", "<link", " src=", "href=", "url(", "@import", "<iframe", "<img",
        ] {
            assert!(!l.contains(bad), "found {bad:?}");
        }
    }

    #[test]
    fn report_page_is_self_contained_with_charts_and_escapes() {
        let mut r = sample_report();
        r.placements[0].target = EVIL.into();
        for m in &mut r.measurements {
            if m.target == "spdk" {
                m.target = EVIL.into();
                m.cell = format!("{EVIL}/4k");
            }
        }
        r.cells = crate::bench::summary::summarize(&r.measurements, None, None);
        r.failures[0].2 = EVIL.into();
        let h = report_html(&r);
        assert!(h.starts_with("<!DOCTYPE html>") && h.ends_with("</html>\n"));
        // IOPS, MiB/s, latency, CPU: four inline SVG charts.
        assert_eq!(h.matches("<svg").count(), 4, "{h}");
        assert!(h.contains("IOPS per cell") && h.contains("Latency percentiles"));
        assert!(h.contains("CPU per I/O"));
        assert_self_contained(&h);
        assert!(!h.contains(EVIL) && !h.contains("<script"));
        assert!(
            h.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"),
            "{h}"
        );
        // The tables carry the figures.
        assert!(h.contains("1050 (1000–1100)"), "{h}");
    }

    #[test]
    fn nines_axis() {
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
        let labels: Vec<String> = (0..5).map(|k| nines_label(k as f64)).collect();
        assert_eq!(labels, ["p0", "p90", "p99", "p99.9", "p99.99"]);
    }

    #[test]
    fn charts_cope_with_empty_and_zero_data() {
        let r = BenchReport::default();
        let h = report_html(&r);
        assert!(h.contains("No measurements") && h.contains("no latency distribution"));
        assert_self_contained(&h);
        let svg = bar_chart(
            "t",
            "u",
            &["a".into()],
            &[Series {
                name: "s".into(),
                values: vec![Some(Range::default())],
            }],
        );
        assert!(svg.starts_with("<svg"), "{svg}");
    }

    #[test]
    fn compare_page_pairs_bars_and_escapes() {
        let a = sample_report();
        let mut b = sample_report();
        for m in &mut b.measurements {
            m.iops *= 3.0;
        }
        b.cells = crate::bench::summary::summarize(&b.measurements, None, None);
        let c = crate::bench::compare::compare(&a, &b, EVIL, "b.json");
        let h = compare_html(&c);
        // IOPS, MiB/s, p99, target CPU, initiator CPU.
        assert_eq!(h.matches("<svg").count(), 5, "{h}");
        assert!(h.contains("B faster"));
        assert_self_contained(&h);
        assert!(!h.contains(EVIL));
    }
}
