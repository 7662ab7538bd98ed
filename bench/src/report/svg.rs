//! Hand-written SVG line plots (no plotting dependency): the latency percentile distribution
//! on a log "nines" axis, and sweep figures against message size.

use std::fmt::Write as _;

/// How an axis maps data to position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Linear from zero (or the data minimum if negative).
    Linear,
    /// Base-10 logarithm; data must be positive.
    Log10,
    /// Base-2 logarithm with power-of-two tick labels (message sizes).
    Log2,
    /// Quantile `q` in `0..1` placed at `-log10(1 - q)`: ticks 0%, 90%, 99%, 99.9%, ...
    Nines,
}

/// One line of a plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Data points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A line plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    /// Title above the plot.
    pub title: String,
    /// X-axis label.
    pub x_label: String,
    /// Y-axis label.
    pub y_label: String,
    /// X-axis mapping.
    pub x_axis: Axis,
    /// Y-axis mapping.
    pub y_axis: Axis,
    /// The lines.
    pub series: Vec<Series>,
}

/// Width of the plot area (the image grows to the right for a long legend).
const PLOT_W: f64 = 590.0;
/// Height of the plot area (the image grows for a legend of many series).
const PLOT_H: f64 = 440.0;
const LEFT: f64 = 90.0;
/// Least room right of the plot area, for the legend.
const RIGHT: f64 = 220.0;
/// Width of one legend character at font size 12, generously (sans-serif averages ~6.5 px).
const LEGEND_CHAR_W: f64 = 7.5;
/// Legend row height.
const LEGEND_ROW_H: f64 = 20.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
/// Deepest "nines" the x-axis shows when a series reaches quantile 1.0.
const MAX_NINES: f64 = 7.0;

fn transform(axis: Axis, v: f64) -> Option<f64> {
    let t = match axis {
        Axis::Linear => v,
        Axis::Log10 if v > 0.0 => v.log10(),
        Axis::Log2 if v > 0.0 => v.log2(),
        Axis::Nines if (0.0..1.0).contains(&v) => -(1.0 - v).log10(),
        Axis::Nines if v >= 1.0 => f64::INFINITY,
        _ => return None,
    };
    Some(t)
}

/// Ticks over the transformed range `lo..=hi`: (position, label).
fn ticks(axis: Axis, lo: f64, hi: f64) -> Vec<(f64, String)> {
    match axis {
        Axis::Nines => (0..=hi.ceil() as i32)
            .map(|n| {
                let label = match n {
                    0 => "0%".to_string(),
                    1 => "90%".to_string(),
                    2 => "99%".to_string(),
                    _ => format!("99.{}%", "9".repeat(n as usize - 2)),
                };
                (f64::from(n), label)
            })
            .collect(),
        Axis::Log10 => {
            // Decades, plus 2x and 5x marks when the range is short enough to read them.
            let minor: &[f64] = if hi - lo <= 3.0 {
                &[1.0, 2.0, 5.0]
            } else {
                &[1.0]
            };
            (lo.floor() as i32..=hi.ceil() as i32)
                .flat_map(|e| {
                    minor.iter().map(move |m| {
                        let v = m * 10f64.powi(e);
                        (v.log10(), fmt_num(v))
                    })
                })
                .collect()
        }
        Axis::Log2 => {
            let (a, b) = (lo.floor() as i32, hi.ceil() as i32);
            let step = ((b - a) / 12).max(1);
            (a..=b)
                .step_by(step as usize)
                .map(|e| (f64::from(e), fmt_size(2f64.powi(e))))
                .collect()
        }
        Axis::Linear => {
            let span = (hi - lo).max(f64::MIN_POSITIVE);
            let raw = span / 6.0;
            let mag = 10f64.powf(raw.log10().floor());
            let step = [1.0, 2.0, 5.0, 10.0]
                .iter()
                .map(|m| m * mag)
                .find(|s| span / s <= 8.0)
                .unwrap_or(10.0 * mag);
            let mut v = (lo / step).floor() * step;
            let mut out = Vec::new();
            while v <= hi + step * 1e-9 && out.len() < 20 {
                out.push((v, fmt_num(v)));
                v += step;
            }
            out
        }
    }
}

fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e9 {
        format!("{}G", trim(v / 1e9))
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

fn fmt_size(v: f64) -> String {
    let b = v.round() as u64;
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        format!("{}k", b >> 10)
    } else {
        format!("{b}")
    }
}

/// Escapes text for SVG/XML.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

impl Plot {
    /// Renders the plot as a standalone SVG document. Points an axis cannot show (e.g. zero on
    /// a log axis) are skipped; an empty plot renders with a "no data" note.
    pub fn render(&self) -> String {
        // Transformed points per series.
        let mut lines: Vec<Vec<(f64, f64)>> = self
            .series
            .iter()
            .map(|s| {
                s.points
                    .iter()
                    .filter_map(|&(x, y)| {
                        Some((transform(self.x_axis, x)?, transform(self.y_axis, y)?))
                    })
                    .filter(|(x, y)| !x.is_nan() && y.is_finite())
                    .collect()
            })
            .collect();
        let finite_x_max = lines
            .iter()
            .flatten()
            .map(|p| p.0)
            .filter(|x| x.is_finite())
            .fold(f64::NEG_INFINITY, f64::max);
        // Quantile 1.0 goes half a decade past the deepest finite point.
        let inf_x = (finite_x_max + 0.5).clamp(1.0, MAX_NINES);
        for l in &mut lines {
            for p in l.iter_mut() {
                if p.0.is_infinite() {
                    p.0 = inf_x;
                }
            }
        }
        let all = || lines.iter().flatten();
        let (mut x0, mut x1) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
        let (mut y0, mut y1) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.1), b.max(p.1))
        });
        let empty = !x0.is_finite();
        if empty {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        match self.x_axis {
            Axis::Nines => x0 = 0.0,
            Axis::Log10 | Axis::Log2 => {
                x0 = x0.floor();
                x1 = x1.ceil();
            }
            Axis::Linear => x0 = x0.min(0.0),
        }
        match self.y_axis {
            Axis::Log10 | Axis::Log2 => {
                y0 = y0.floor();
                y1 = y1.ceil();
            }
            _ => {
                y0 = y0.min(0.0);
                y1 *= 1.05;
            }
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        // The legend sits right of the plot: the image is as wide as its longest name needs
        // and as tall as its rows need.
        let longest = self
            .series
            .iter()
            .map(|s| s.name.chars().count())
            .max()
            .unwrap_or(0) as f64;
        let right = RIGHT.max(15.0 + 26.0 + longest * LEGEND_CHAR_W + 10.0);
        let pw = PLOT_W;
        let ph = PLOT_H;
        let w = LEFT + pw + right;
        let h =
            (TOP + ph + BOTTOM).max(TOP + 10.0 + LEGEND_ROW_H * self.series.len() as f64 + 10.0);
        let (big_w, big_h) = (w, h);
        let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{big_w}" height="{big_h}" viewBox="0 0 {big_w} {big_h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="28" text-anchor="middle" font-size="16">{}</text>"#,
            LEFT + pw / 2.0,
            escape(&self.title)
        );
        // Grid and ticks.
        for (v, label) in ticks(self.x_axis, x0, x1) {
            if v < x0 - 1e-9 || v > x1 + 1e-9 {
                continue;
            }
            let x = sx(v);
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph + 18.0,
                escape(&label)
            );
        }
        for (v, label) in ticks(self.y_axis, y0, y1) {
            if v < y0 - 1e-9 || v > y1 + 1e-9 {
                continue;
            }
            let y = sy(v);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                escape(&label)
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>
<text transform="translate(22 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"##,
            LEFT + pw / 2.0,
            TOP + ph + BOTTOM - 20.0,
            escape(&self.x_label),
            TOP + ph / 2.0,
            escape(&self.y_label)
        );
        if empty {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">no data</text>"#,
                LEFT + pw / 2.0,
                TOP + ph / 2.0
            );
        }
        for (i, (series, pts)) in self.series.iter().zip(&lines).enumerate() {
            let color = COLORS[i % COLORS.len()];
            if !pts.is_empty() {
                let mut d = String::new();
                for (j, &(x, y)) in pts.iter().enumerate() {
                    let _ = write!(
                        d,
                        "{}{:.1},{:.1}",
                        if j == 0 { "M" } else { " L" },
                        sx(x),
                        sy(y)
                    );
                }
                let _ = writeln!(
                    s,
                    r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.8"/>"#
                );
                if pts.len() <= 40 {
                    for &(x, y) in pts {
                        let _ = writeln!(
                            s,
                            r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                            sx(x),
                            sy(y)
                        );
                    }
                }
            }
            let ly = TOP + 10.0 + LEGEND_ROW_H * i as f64;
            let lx = LEFT + pw + 15.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 20.0,
                lx + 26.0,
                ly + 4.0,
                escape(&series.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_ticks_and_transform() {
        assert_eq!(
            transform(Axis::Nines, 0.99).map(|v| (v * 1e6).round()),
            Some(2e6)
        );
        assert_eq!(transform(Axis::Nines, 1.0), Some(f64::INFINITY));
        assert_eq!(transform(Axis::Log10, 0.0), None);
        let t = ticks(Axis::Nines, 0.0, 4.0);
        assert_eq!(t[3].1, "99.9%");
        assert_eq!(t[4].1, "99.99%");
        assert_eq!(fmt_size(4096.0), "4k");
        assert_eq!(fmt_num(2_500_000.0), "2.5M");
    }

    #[test]
    fn escapes_text() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
