//! The SVG plots a report has data for, and the load series' knees.

use std::collections::{BTreeMap, BTreeSet};

use hdrhistogram::Histogram;

use super::{hgrm, svg, Point, Report};
use crate::stats::LatencySummary;

/// Legend of the `memcpy` floor's line in `bandwidth-vs-size.svg`.
pub const MEMCPY_SERIES: &str = "memcpy floor (1 core)";

/// Picks one figure of a latency summary.
type Figure = fn(&LatencySummary) -> f64;

/// Picks one figure of a point, if it has it.
type PointFigure<'a> = &'a dyn Fn(&Point) -> Option<f64>;

/// Load points with a latency, grouped into series by (size, crossed value), in measured order.
type LoadSeries<'a> = BTreeMap<(u64, Option<u64>), Vec<&'a Point>>;

impl Report {
    /// The SVG plots this report has data for, with their file names.
    pub fn plots(&self) -> Vec<(String, svg::Plot)> {
        let mut plots = Vec::new();
        // latency-percentiles.svg: the round trips, else (a one-way-only run) the one-way
        // latencies; with both, the one-way ones go to one-way-latency-percentiles.svg.
        match self.percentile_plots() {
            (Some(rtt), one_way) => {
                plots.push(("latency-percentiles.svg".to_string(), rtt));
                if let Some(p) = one_way {
                    plots.push(("one-way-latency-percentiles.svg".to_string(), p));
                }
            }
            (None, Some(p)) => plots.push(("latency-percentiles.svg".to_string(), p)),
            (None, None) => {}
        }
        if let Some(p) = self.load_plot() {
            plots.push(("latency-vs-load.svg".into(), p));
        }
        let sizes: BTreeSet<u64> = self
            .measured
            .iter()
            .filter(|m| m.point.test != "floor")
            .map(|m| m.point.size_bytes)
            .collect();
        if sizes.len() >= 2 {
            self.size_plots(&mut plots);
        }
        plots
    }

    /// The latency percentile distributions: round trips (the floor, lat points, round-trip
    /// load points) in one plot, one-way load latencies in another (they are different
    /// figures: one direction from the intended send time, not a round trip); `None` for a
    /// kind without data.
    fn percentile_plots(&self) -> (Option<svg::Plot>, Option<svg::Plot>) {
        let mut rtt = Vec::new();
        let mut one_way = Vec::new();
        if let Some(f) = &self.floor {
            let name = if f.kind == "tcp-raw" {
                "floor (raw tcp)"
            } else {
                "floor (cache line)"
            };
            rtt.push(percentile_series(name, &f.rtt));
        }
        for m in &self.measured {
            if let Some(h) = &m.rtt {
                if m.point.latency_kind.as_deref() == Some("one-way") {
                    one_way.push(percentile_series(&m.point.label, h));
                } else {
                    rtt.push(percentile_series(&m.point.label, h));
                }
            }
        }
        let plot = |title: &str, y_label: &str, series: Vec<svg::Series>| {
            (!series.is_empty()).then(|| svg::Plot {
                title: title.into(),
                x_label: "percentile".into(),
                y_label: y_label.into(),
                x_axis: svg::Axis::Nines,
                y_axis: svg::Axis::Log10,
                series,
            })
        };
        (
            plot(
                "Round-trip latency percentile distribution",
                "round-trip time (us; load: from the intended send time)",
                rtt,
            ),
            plot(
                "One-way latency percentile distribution",
                "one-way latency from the intended send time (us)",
                one_way,
            ),
        )
    }

    /// The plots against message size, for a sweep over two or more sizes: rate and bandwidth
    /// (when rate points were measured), then RTT (when lat points were).
    fn size_plots(&self, plots: &mut Vec<(String, svg::Plot)>) {
        let rate = self.size_series("rate", &|p| p.msgs_per_sec, "msgs/s");
        if !rate.is_empty() {
            plots.push((
                "rate-vs-size.svg".into(),
                svg::Plot {
                    title: "Message rate vs message size".into(),
                    x_label: "message size (bytes)".into(),
                    y_label: "messages per second".into(),
                    x_axis: svg::Axis::Log2,
                    y_axis: svg::Axis::Linear,
                    series: rate,
                },
            ));
            plots.push(("bandwidth-vs-size.svg".into(), self.bandwidth_plot()));
        }
        let mut lat = self.size_series("lat", &|p| p.rtt_ns.map(|r| r.p50 / 1e3), "p50");
        lat.extend(self.size_series("lat", &|p| p.rtt_ns.map(|r| r.p99 / 1e3), "p99"));
        lat.extend(self.size_series("lat", &|p| p.rtt_ns.map(|r| r.p99_9 / 1e3), "p99.9"));
        if !lat.is_empty() {
            plots.push((
                "latency-vs-size.svg".into(),
                svg::Plot {
                    title: "RTT vs message size".into(),
                    x_label: "message size (bytes)".into(),
                    y_label: "RTT (us)".into(),
                    x_axis: svg::Axis::Log2,
                    y_axis: svg::Axis::Log10,
                    series: lat,
                },
            ));
        }
    }

    /// Payload MB/s of the rate points against size, with the `memcpy` floor's line when it was
    /// measured.
    fn bandwidth_plot(&self) -> svg::Plot {
        let mut bandwidth = self.size_series("rate", &|p| p.mb_per_sec, "MB/s");
        let mut memcpy: Vec<(f64, f64)> = self
            .memcpy
            .iter()
            .map(|m| (m.size_bytes as f64, m.mb_per_sec()))
            .collect();
        memcpy.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !memcpy.is_empty() {
            bandwidth.push(svg::Series {
                name: MEMCPY_SERIES.into(),
                points: memcpy,
            });
        }
        svg::Plot {
            title: "Bandwidth vs message size".into(),
            x_label: "message size (bytes)".into(),
            y_label: "payload MB/s".into(),
            x_axis: svg::Axis::Log2,
            y_axis: svg::Axis::Linear,
            series: bandwidth,
        }
    }

    /// `f` of the `test` points against their size, one series per crossed knob value (one
    /// series when the sweep crosses nothing), named `suffix` plus the knob and its value.
    fn size_series(&self, test: &str, f: PointFigure<'_>, suffix: &str) -> Vec<svg::Series> {
        let mut by: BTreeMap<Option<u64>, Vec<(f64, f64)>> = BTreeMap::new();
        for m in self.measured.iter().filter(|m| m.point.test == test) {
            if let Some(y) = f(&m.point) {
                by.entry(m.point.cross_value)
                    .or_default()
                    .push((m.point.size_bytes as f64, y));
            }
        }
        by.into_iter()
            .map(|(k, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                let name = match (k, self.measured.iter().find_map(|m| m.point.cross.clone())) {
                    (Some(v), Some(knob)) => format!("{suffix} {knob}={v}"),
                    _ => suffix.to_string(),
                };
                svg::Series { name, points }
            })
            .collect()
    }

    /// The latency-vs-load plot: p50, p99 and p99.9 of every load series (one per size and
    /// crossed value) against the offered rate, when some series has two or more rates.
    fn load_plot(&self) -> Option<svg::Plot> {
        let by = load_series(self.measured.iter().map(|m| &m.point));
        if !by.values().any(|v| v.len() >= 2) {
            return None;
        }
        let mut series = Vec::new();
        for ((size, cross), mut pts) in by {
            pts.sort_by_key(|p| p.knobs.offered_rate);
            let name = |what: &str| match (cross, pts[0].cross.as_deref()) {
                (Some(v), Some(k)) => format!("{size}B {k}={v} {what}"),
                _ => format!("{size}B {what}"),
            };
            let figs: [(&str, Figure); 3] = [
                ("p50", |l| l.p50),
                ("p99", |l| l.p99),
                ("p99.9", |l| l.p99_9),
            ];
            for (what, f) in figs {
                series.push(svg::Series {
                    name: name(what),
                    points: pts
                        .iter()
                        .filter_map(|p| {
                            Some((p.knobs.offered_rate as f64, f(&p.latency_ns?) / 1e3))
                        })
                        .collect(),
                });
            }
        }
        Some(svg::Plot {
            title: "Open-loop latency vs offered load".into(),
            x_label: "offered rate (msgs/s)".into(),
            y_label: "latency from intended send time (us)".into(),
            x_axis: svg::Axis::Log10,
            y_axis: svg::Axis::Log10,
            series,
        })
    }
}

/// The load points of `points` that have a latency, by (size, crossed value).
fn load_series<'a>(points: impl IntoIterator<Item = &'a Point>) -> LoadSeries<'a> {
    let mut by = LoadSeries::new();
    for p in points {
        if p.test == "load" && p.latency_ns.is_some() {
            by.entry((p.size_bytes, p.cross_value)).or_default().push(p);
        }
    }
    by
}

/// Where latency bends up with load: the lowest offered rate at which p99 exceeds twice its
/// value at the lowest offered rate, per load series (size, crossed value). `None` for a series
/// that never bends (or has fewer than two rates).
pub fn knees(points: &[Point]) -> Vec<(u64, Option<u64>, Option<u64>)> {
    load_series(points)
        .into_iter()
        .filter(|(_, v)| v.len() >= 2)
        .map(|((size, cross), mut v)| {
            v.sort_by_key(|p| p.knobs.offered_rate);
            let p99 = |p: &Point| p.latency_ns.map_or(0.0, |l| l.p99);
            let base = p99(v[0]);
            let knee = v
                .iter()
                .find(|p| p99(p) > 2.0 * base)
                .map(|p| p.knobs.offered_rate);
            (size, cross, knee)
        })
        .collect()
}

/// Percentile-distribution points (quantile, microseconds) of `h`.
fn percentile_series(name: &str, h: &Histogram<u64>) -> svg::Series {
    svg::Series {
        name: name.to_string(),
        points: h
            .iter_quantiles(hgrm::TICKS_PER_HALF_DISTANCE)
            .map(|v| (v.quantile_iterated_to(), v.value_iterated_to() as f64 / 1e3))
            .collect(),
    }
}
