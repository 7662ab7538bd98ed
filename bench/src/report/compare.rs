//! `bench compare A B`: two `summary.json` files side by side, point by point (matched by
//! label), with the ratio B/A of each figure.
//!
//! Summaries are read as plain JSON, so files of any schema version compare on the figures
//! both have. Figures: RTT p50 / p99 / p99.9 of lat points, msgs/s of rate points, open-loop
//! latency p50 / p99 / p99.9 and achieved rate of load points. Latency is worse when higher,
//! rates when lower.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cli::CompareArgs;
use crate::error::BenchError;

/// Which way a figure gets worse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Latency: lower is better.
    Lower,
    /// Rate: higher is better.
    Higher,
}

/// The figures compared: name, JSON path within a point, which way is better.
pub const FIGURES: &[(&str, &[&str], Better)] = &[
    ("rtt p50", &["rtt_ns", "p50"], Better::Lower),
    ("rtt p99", &["rtt_ns", "p99"], Better::Lower),
    ("rtt p99.9", &["rtt_ns", "p99_9"], Better::Lower),
    ("msgs/s", &["msgs_per_sec"], Better::Higher),
    ("latency p50", &["latency_ns", "p50"], Better::Lower),
    ("latency p99", &["latency_ns", "p99"], Better::Lower),
    ("latency p99.9", &["latency_ns", "p99_9"], Better::Lower),
    ("achieved/s", &["achieved_rate"], Better::Higher),
];

/// One compared figure.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The point's label.
    pub label: String,
    /// The figure's name ([`FIGURES`]).
    pub figure: &'static str,
    /// Its value in A.
    pub a: f64,
    /// Its value in B.
    pub b: f64,
    /// `b / a` (infinite when `a` is 0 and `b` is not; 1 when both are 0).
    pub ratio: f64,
    /// Beyond the threshold either way.
    pub flagged: bool,
    /// Worse beyond `--fail-above`.
    pub regressed: bool,
}

/// The outcome of comparing two summaries.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Comparison {
    /// Every figure both have, in A's point order.
    pub rows: Vec<Row>,
    /// Labels only A has.
    pub only_a: Vec<String>,
    /// Labels only B has.
    pub only_b: Vec<String>,
}

impl Comparison {
    /// Rows that regressed beyond `--fail-above`.
    pub fn regressions(&self) -> usize {
        self.rows.iter().filter(|r| r.regressed).count()
    }
}

fn points(s: &Value) -> Vec<(&str, &Value)> {
    s["points"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| Some((p["label"].as_str()?, p)))
                .collect()
        })
        .unwrap_or_default()
}

fn figure(p: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(p, |v, k| v.get(k))?.as_f64()
}

/// Compares summaries `a` and `b`: flags ratios off 1 by more than `threshold`, marks as
/// regressed figures worse by more than `fail_above` (a fraction, e.g. 0.1).
pub fn compare(a: &Value, b: &Value, threshold: f64, fail_above: Option<f64>) -> Comparison {
    let pa = points(a);
    let pb = points(b);
    let mut out = Comparison::default();
    for (label, p) in &pa {
        let Some((_, q)) = pb.iter().find(|(l, _)| l == label) else {
            out.only_a.push((*label).to_string());
            continue;
        };
        for &(name, path, better) in FIGURES {
            let (Some(x), Some(y)) = (figure(p, path), figure(q, path)) else {
                continue;
            };
            let ratio = if x != 0.0 {
                y / x
            } else if y == 0.0 {
                1.0
            } else {
                f64::INFINITY
            };
            // How much worse B is, as a fraction (negative: better).
            let worse = match better {
                Better::Lower => ratio - 1.0,
                Better::Higher => 1.0 - ratio,
            };
            out.rows.push(Row {
                label: (*label).to_string(),
                figure: name,
                a: x,
                b: y,
                ratio,
                flagged: (ratio - 1.0).abs() > threshold,
                regressed: fail_above.is_some_and(|f| worse > f),
            });
        }
    }
    out.only_b = pb
        .iter()
        .filter(|(l, _)| !pa.iter().any(|(m, _)| m == l))
        .map(|(l, _)| (*l).to_string())
        .collect();
    out
}

fn cell(name: &str, v: f64) -> String {
    if name.contains('/') {
        format!("{:.0}", v)
    } else {
        format!("{:.3} us", v / 1e3)
    }
}

/// The console table of `c`: `!` marks a flagged figure, `REGRESSED` one beyond
/// `--fail-above`.
pub fn render(c: &Comparison, a: &Path, b: &Path) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A: {}\nB: {}\n", a.display(), b.display());
    let _ = writeln!(
        out,
        "{:<36} {:<14} {:>14} {:>14} {:>9}",
        "point", "figure", "A", "B", "B/A"
    );
    for r in &c.rows {
        let _ = writeln!(
            out,
            "{:<36} {:<14} {:>14} {:>14} {:>8.3}x {}",
            r.label,
            r.figure,
            cell(r.figure, r.a),
            cell(r.figure, r.b),
            r.ratio,
            if r.regressed {
                "! REGRESSED"
            } else if r.flagged {
                "!"
            } else {
                ""
            }
        );
    }
    for l in &c.only_a {
        let _ = writeln!(out, "{l:<36} only in A");
    }
    for l in &c.only_b {
        let _ = writeln!(out, "{l:<36} only in B");
    }
    out
}

/// Reads a summary: `path` itself, or `path/summary.json` for a directory.
///
/// # Errors
/// [`BenchError::Io`] or [`BenchError::BadSummary`].
pub fn read(path: &Path) -> Result<Value, BenchError> {
    let file: PathBuf = if path.is_dir() {
        path.join("summary.json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&file).map_err(|e| BenchError::io(&file, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|source| BenchError::BadSummary {
        path: file.clone(),
        source,
    })?;
    if !v["points"].is_array() {
        return Err(BenchError::BadSummary {
            path: file,
            source: serde::de::Error::custom("no `points` array"),
        });
    }
    Ok(v)
}

/// `bench compare`: prints the table.
///
/// # Errors
/// Unreadable files, or [`BenchError::Regression`] when a figure regressed beyond
/// `--fail-above` (after printing).
pub fn run(args: &CompareArgs) -> Result<(), BenchError> {
    let a = read(&args.a)?;
    let b = read(&args.b)?;
    let c = compare(&a, &b, args.threshold, args.fail_above);
    super::print(&render(&c, &args.a, &args.b));
    match (c.regressions(), args.fail_above) {
        (0, _) | (_, None) => Ok(()),
        (count, Some(limit)) => Err(BenchError::Regression { count, limit }),
    }
}
