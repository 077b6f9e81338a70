//! bench/compare.rs — `nvmf bench compare A.json B.json`: match two
//! reports' cells by id, put each figure side by side (A and B as mean
//! (min–max), ratio B/A) and call a verdict only where the two min–max
//! ranges do not overlap; otherwise "no clear difference". The text table
//! is here; the HTML page with paired bar charts is drawn by html.rs.

use super::output::{cells_of, num, range_text, table};
use super::results::{BenchReport, CellSummary, Range};
use std::fmt::Write as _;

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// One figure `compare` puts side by side.
pub struct Figure {
    pub name: &'static str,
    pub better: Better,
    /// Words for "B is better" and "B is worse".
    pub words: (&'static str, &'static str),
    pub get: fn(&CellSummary) -> Option<Range>,
}

/// The figures compared, in order.
pub const FIGURES: &[Figure] = &[
    Figure {
        name: "IOPS",
        better: Better::Higher,
        words: ("B faster", "B slower"),
        get: |c| Some(c.iops),
    },
    Figure {
        name: "MiB/s",
        better: Better::Higher,
        words: ("B faster", "B slower"),
        get: |c| Some(c.mibps),
    },
    Figure {
        name: "p99 latency µs",
        better: Better::Lower,
        words: ("B lower latency", "B higher latency"),
        get: |c| Some(c.lat_p99_us),
    },
    Figure {
        name: "target CPU µs/IO",
        better: Better::Lower,
        words: ("B less target CPU per I/O", "B more target CPU per I/O"),
        get: |c| c.target_us_per_io,
    },
    Figure {
        name: "initiator CPU µs/IO",
        better: Better::Lower,
        words: (
            "B less initiator CPU per I/O",
            "B more initiator CPU per I/O",
        ),
        get: |c| c.initiator_us_per_io,
    },
];

/// The outcome for one figure of one cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Ranges apart, B on the better side.
    BBetter,
    /// Ranges apart, B on the worse side.
    BWorse,
    /// The min–max ranges overlap: no call.
    Overlap,
    /// One side lacks the figure.
    Missing,
}

/// Decide from two ranges: a call only when they do not overlap.
pub fn verdict(a: Option<&Range>, b: Option<&Range>, better: Better) -> Verdict {
    let (Some(a), Some(b)) = (a, b) else {
        return Verdict::Missing;
    };
    if a.overlaps(b) {
        return Verdict::Overlap;
    }
    match (b.mean > a.mean, better) {
        (true, Better::Higher) | (false, Better::Lower) => Verdict::BBetter,
        _ => Verdict::BWorse,
    }
}

/// One figure of one cell, both sides.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureCmp {
    pub name: &'static str,
    pub a: Option<Range>,
    pub b: Option<Range>,
    /// B mean / A mean.
    pub ratio: Option<f64>,
    pub verdict: Verdict,
    /// The verdict in words.
    pub text: String,
}

/// One cell present in both reports.
#[derive(Debug, Clone, PartialEq)]
pub struct CellCmp {
    pub cell: String,
    pub runs: (u32, u32),
    pub figures: Vec<FigureCmp>,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// What A and B are (the file names given).
    pub a_label: String,
    pub b_label: String,
    /// Cells in both, in A's order.
    pub cells: Vec<CellCmp>,
    pub only_a: Vec<String>,
    pub only_b: Vec<String>,
}

/// Compare report `a` with report `b` (labels name them in the output).
pub fn compare(a: &BenchReport, b: &BenchReport, a_label: &str, b_label: &str) -> Comparison {
    let (ca, cb) = (cells_of(a), cells_of(b));
    let mut cells = Vec::new();
    let mut only_a = Vec::new();
    for x in ca.iter() {
        let Some(y) = cb.iter().find(|y| y.cell == x.cell) else {
            only_a.push(x.cell.clone());
            continue;
        };
        let figures = FIGURES
            .iter()
            .map(|f| {
                let (ra, rb) = ((f.get)(x), (f.get)(y));
                let v = verdict(ra.as_ref(), rb.as_ref(), f.better);
                let text = match v {
                    Verdict::BBetter => f.words.0.to_string(),
                    Verdict::BWorse => f.words.1.to_string(),
                    Verdict::Overlap => "no clear difference (ranges overlap)".to_string(),
                    Verdict::Missing => format!(
                        "not measured in {}",
                        match (&ra, &rb) {
                            (None, None) => "either",
                            (None, _) => "A",
                            _ => "B",
                        }
                    ),
                };
                let ratio = match (&ra, &rb) {
                    (Some(ra), Some(rb)) if ra.mean != 0.0 => Some(rb.mean / ra.mean),
                    _ => None,
                };
                FigureCmp {
                    name: f.name,
                    a: ra,
                    b: rb,
                    ratio,
                    verdict: v,
                    text,
                }
            })
            .collect();
        cells.push(CellCmp {
            cell: x.cell.clone(),
            runs: (x.runs, y.runs),
            figures,
        });
    }
    let only_b = cb
        .iter()
        .filter(|y| !ca.iter().any(|x| x.cell == y.cell))
        .map(|y| y.cell.clone())
        .collect();
    Comparison {
        a_label: a_label.to_string(),
        b_label: b_label.to_string(),
        cells,
        only_a,
        only_b,
    }
}

fn side(r: &Option<Range>) -> String {
    r.as_ref().map_or_else(|| "–".to_string(), range_text)
}

impl Comparison {
    /// The text `nvmf bench compare` prints.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "A: {}\nB: {}", self.a_label, self.b_label);
        let _ = writeln!(
            o,
            "Figures: mean (min–max) over rounds. A verdict only where the min–max ranges do not overlap."
        );
        for c in &self.cells {
            let _ = writeln!(
                o,
                "\n{}  (A {} run(s), B {} run(s))",
                c.cell, c.runs.0, c.runs.1
            );
            let rows: Vec<Vec<String>> = c
                .figures
                .iter()
                .map(|f| {
                    vec![
                        format!("  {}", f.name),
                        side(&f.a),
                        side(&f.b),
                        f.ratio.map_or("–".into(), |r| format!("x{}", num(r))),
                        f.text.clone(),
                    ]
                })
                .collect();
            o.push_str(&table(&["", "A", "B", "B/A", "verdict"], &rows));
            if c.runs.0 < 2 || c.runs.1 < 2 {
                let _ = writeln!(
                    o,
                    "  (a side with one run has a single-point range: any difference gets a verdict; run more rounds)"
                );
            }
        }
        if self.cells.is_empty() {
            let _ = writeln!(o, "\nNo cell is in both reports.");
        }
        if !self.only_a.is_empty() {
            let _ = writeln!(o, "\nOnly in A: {}", self.only_a.join(", "));
        }
        if !self.only_b.is_empty() {
            let _ = writeln!(o, "\nOnly in B: {}", self.only_b.join(", "));
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::output::tests::sample_report;

    fn r(min: f64, mean: f64, max: f64) -> Range {
        Range { min, mean, max }
    }

    #[test]
    fn verdict_only_when_ranges_apart() {
        let a = r(90.0, 100.0, 110.0);
        // Overlapping ranges: no call, even with a much higher mean.
        let b = r(105.0, 300.0, 400.0);
        assert_eq!(
            verdict(Some(&a), Some(&b), Better::Higher),
            Verdict::Overlap
        );
        // Touching at one value counts as overlap.
        let b = r(110.0, 120.0, 130.0);
        assert_eq!(
            verdict(Some(&a), Some(&b), Better::Higher),
            Verdict::Overlap
        );
        // Apart: higher is better for throughput, worse for latency.
        let b = r(111.0, 120.0, 130.0);
        assert_eq!(
            verdict(Some(&a), Some(&b), Better::Higher),
            Verdict::BBetter
        );
        assert_eq!(verdict(Some(&a), Some(&b), Better::Lower), Verdict::BWorse);
        let b = r(50.0, 60.0, 89.0);
        assert_eq!(verdict(Some(&a), Some(&b), Better::Higher), Verdict::BWorse);
        assert_eq!(verdict(Some(&a), Some(&b), Better::Lower), Verdict::BBetter);
        assert_eq!(verdict(None, Some(&b), Better::Lower), Verdict::Missing);
    }

    #[test]
    fn cells_matched_by_id_with_words() {
        let a = sample_report();
        let mut b = sample_report();
        // B: nvmfd twice as fast, apart; spdk the same; a new cell only in B.
        for m in b.measurements.iter_mut().filter(|m| m.target == "nvmfd") {
            m.iops *= 2.0;
            m.mibps *= 2.0;
        }
        let mut extra = b.measurements[0].clone();
        extra.cell = "kernel/4k".into();
        extra.target = "kernel".into();
        b.measurements.push(extra);
        b.cells.clear(); // summarized on the fly
        let mut a2 = a.clone();
        a2.measurements.retain(|m| m.target != "spdk");
        a2.measurements.push({
            let mut m = a.measurements[0].clone();
            m.cell = "old/4k".into();
            m
        });
        a2.cells.clear();
        let c = compare(&a2, &b, "a.json", "b.json");
        assert_eq!(c.cells.len(), 1);
        assert_eq!(c.only_a, ["old/4k"]);
        assert_eq!(c.only_b, ["spdk/4k", "kernel/4k"]);
        let f = &c.cells[0].figures;
        assert_eq!((f[0].name, f[0].text.as_str()), ("IOPS", "B faster"));
        assert_eq!(f[0].ratio, Some(2.0));
        assert_eq!(f[1].text, "B faster");
        // Same latency ranges: overlap.
        assert_eq!(f[2].text, "no clear difference (ranges overlap)");
        let text = c.render();
        assert!(text.contains("nvmfd/4k"), "{text}");
        assert!(
            text.contains("1050 (1000–1100)") && text.contains("2100 (2000–2200)"),
            "{text}"
        );
        assert!(
            text.contains("x2.000") && text.contains("B faster"),
            "{text}"
        );
        assert!(
            text.contains("Only in A: old/4k") && text.contains("Only in B: spdk/4k, kernel/4k")
        );
        // Same report on both sides: every figure overlaps.
        let c = compare(&a, &a, "a", "a");
        assert!(c
            .cells
            .iter()
            .flat_map(|c| &c.figures)
            .all(|f| f.verdict == Verdict::Overlap));
    }
}
