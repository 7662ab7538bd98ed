//! HdrHistogram percentile-distribution text (`*.hgrm`), as written by Java's
//! `Histogram.outputPercentileDistribution` / `HistogramLogProcessor` and read by the
//! HdrHistogram plotter.

use std::io::{self, Write};

use hdrhistogram::Histogram;

/// Reporting ticks per half distance, as in the Java tools' default.
pub const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// Writes `h` as a percentile distribution, dividing every value by `scale` (1000.0 turns
/// nanoseconds into microseconds), with the Java tool's exact column layout.
///
/// # Errors
/// Any error of `w`.
pub fn write<W: Write>(w: &mut W, h: &Histogram<u64>, scale: f64) -> io::Result<()> {
    let digits = usize::from(h.sigfig());
    writeln!(
        w,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    )?;
    let mut total = 0u64;
    for v in h.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
        total += v.count_since_last_iteration();
        let q = v.quantile_iterated_to();
        let value = v.value_iterated_to() as f64 / scale;
        if q < 1.0 {
            writeln!(
                w,
                "{value:>12.digits$} {q:>2.12} {total:>10} {:>14.2}",
                1.0 / (1.0 - q)
            )?;
        } else {
            writeln!(w, "{value:>12.digits$} {q:>2.12} {total:>10}")?;
        }
    }
    let (buckets, sub_buckets) = bucket_counts(h);
    writeln!(
        w,
        "#[Mean    = {:>12.digits$}, StdDeviation   = {:>12.digits$}]",
        h.mean() / scale,
        h.stdev() / scale
    )?;
    writeln!(
        w,
        "#[Max     = {:>12.digits$}, Total count    = {:>12}]",
        h.max() as f64 / scale,
        h.len()
    )?;
    writeln!(
        w,
        "#[Buckets = {buckets:>12}, SubBuckets     = {sub_buckets:>12}]"
    )
}

/// Bucket and sub-bucket counts as the Java implementation computes them.
fn bucket_counts(h: &Histogram<u64>) -> (u32, u64) {
    let largest_single_unit = 2 * 10u64.pow(u32::from(h.sigfig()));
    (
        u32::from(h.buckets()),
        largest_single_unit.next_power_of_two(),
    )
}

/// One line of a parsed `.hgrm` file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HgrmLine {
    /// Value, in the file's unit.
    pub value: f64,
    /// Quantile in `0..=1`.
    pub quantile: f64,
    /// Count of values at or below `value`.
    pub total_count: u64,
}

/// A parsed `.hgrm` file.
#[derive(Debug, Clone, PartialEq)]
pub struct Hgrm {
    /// The percentile lines, in file order.
    pub lines: Vec<HgrmLine>,
    /// `#[Mean = ...]`.
    pub mean: f64,
    /// `StdDeviation = ...`.
    pub stdev: f64,
    /// `#[Max = ...]`.
    pub max: f64,
    /// `Total count = ...`.
    pub total_count: u64,
}

impl Hgrm {
    /// The smallest value whose quantile reaches `q` (how the plotter reads the file).
    pub fn value_at_quantile(&self, q: f64) -> Option<f64> {
        self.lines
            .iter()
            .find(|l| l.quantile >= q)
            .or(self.lines.last())
            .map(|l| l.value)
    }
}

/// Parses `.hgrm` text (as [`write()`] and the Java tools produce it).
///
/// # Errors
/// A message naming the first line that does not parse.
pub fn parse(text: &str) -> Result<Hgrm, String> {
    let mut out = Hgrm {
        lines: Vec::new(),
        mean: f64::NAN,
        stdev: f64::NAN,
        max: f64::NAN,
        total_count: 0,
    };
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with("Value") {
            continue;
        }
        let bad = || format!("line {}: cannot parse `{line}`", n + 1);
        if let Some(rest) = t.strip_prefix("#[") {
            let rest = rest.trim_end_matches(']');
            for field in rest.split(',') {
                let (k, v) = field.split_once('=').ok_or_else(bad)?;
                let v = v.trim();
                match k.trim() {
                    "Mean" => out.mean = v.parse().map_err(|_| bad())?,
                    "StdDeviation" => out.stdev = v.parse().map_err(|_| bad())?,
                    "Max" => out.max = v.parse().map_err(|_| bad())?,
                    "Total count" => out.total_count = v.parse().map_err(|_| bad())?,
                    _ => {}
                }
            }
            continue;
        }
        let mut cols = t.split_whitespace();
        let value = cols.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
        let quantile = cols.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
        let total_count = cols.next().and_then(|c| c.parse().ok()).ok_or_else(bad)?;
        out.lines.push(HgrmLine {
            value,
            quantile,
            total_count,
        });
    }
    if out.lines.is_empty() {
        return Err("no percentile lines".into());
    }
    Ok(out)
}
