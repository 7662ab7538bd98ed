//! Histograms and the figures reported from them.
//!
//! Every histogram is sized up front with [`Histogram::new_with_bounds`] and auto-resize off, so
//! recording on the measured path never allocates; out-of-range values saturate at the bound.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Lowest recordable latency, in nanoseconds.
pub const LOWEST_NS: u64 = 1;
/// Highest recordable latency, in nanoseconds (60 s); larger values saturate.
pub const HIGHEST_NS: u64 = 60_000_000_000;
/// Significant figures kept by every latency histogram.
pub const SIGFIG: u8 = 3;

/// A latency histogram in nanoseconds, sized up front.
pub fn new_latency_histogram() -> Histogram<u64> {
    // Bounds are compile-time constants that satisfy new_with_bounds' preconditions
    // (low >= 1, high >= 2 * low, sigfig <= 5), so this cannot fail.
    let mut h = Histogram::new_with_bounds(LOWEST_NS, HIGHEST_NS, SIGFIG)
        .unwrap_or_else(|_| unreachable!("constant histogram bounds are valid"));
    h.auto(false);
    h
}

/// Latency percentiles and moments in nanoseconds, as written to `summary.json` (`rtt_ns`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Smallest value.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// 99.99th percentile.
    pub p99_99: f64,
    /// Largest value.
    pub max: f64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
}

impl LatencySummary {
    /// Figures of `h` (values in nanoseconds). `None` when `h` is empty.
    pub fn from_histogram(h: &Histogram<u64>) -> Option<Self> {
        if h.is_empty() {
            return None;
        }
        Some(Self {
            min: h.min() as f64,
            p50: h.value_at_quantile(0.50) as f64,
            p90: h.value_at_quantile(0.90) as f64,
            p99: h.value_at_quantile(0.99) as f64,
            p99_9: h.value_at_quantile(0.999) as f64,
            p99_99: h.value_at_quantile(0.9999) as f64,
            max: h.max() as f64,
            mean: h.mean(),
            stdev: h.stdev(),
        })
    }

    /// Every figure scaled by `k` (e.g. 0.5 for RTT/2).
    pub fn scaled(&self, k: f64) -> Self {
        Self {
            min: self.min * k,
            p50: self.p50 * k,
            p90: self.p90 * k,
            p99: self.p99 * k,
            p99_9: self.p99_9 * k,
            p99_99: self.p99_99 * k,
            max: self.max * k,
            mean: self.mean * k,
            stdev: self.stdev * k,
        }
    }

    /// Figure-by-figure ratio `self / base` (the "x floor" figures); 0 where `base` is 0.
    pub fn ratio_to(&self, base: &Self) -> Self {
        let r = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        Self {
            min: r(self.min, base.min),
            p50: r(self.p50, base.p50),
            p90: r(self.p90, base.p90),
            p99: r(self.p99, base.p99),
            p99_9: r(self.p99_9, base.p99_9),
            p99_99: r(self.p99_99, base.p99_99),
            max: r(self.max, base.max),
            mean: r(self.mean, base.mean),
            stdev: r(self.stdev, base.stdev),
        }
    }

    /// Figures in column order: min, p50, p90, p99, p99.9, p99.99, max, mean, stdev.
    pub fn as_array(&self) -> [f64; 9] {
        [
            self.min,
            self.p50,
            self.p90,
            self.p99,
            self.p99_9,
            self.p99_99,
            self.max,
            self.mean,
            self.stdev,
        ]
    }

    /// Column names matching [`Self::as_array`].
    pub const COLUMNS: [&'static str; 9] = [
        "min", "p50", "p90", "p99", "p99.9", "p99.99", "max", "mean", "stdev",
    ];
}

/// Throughput measured at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RateSummary {
    /// Messages counted in the measured window.
    pub msgs: u64,
    /// Payload bytes counted in the measured window.
    pub bytes: u64,
    /// Length of the measured window in nanoseconds.
    pub elapsed_ns: u64,
}

impl RateSummary {
    /// Messages per second.
    pub fn msgs_per_sec(&self) -> f64 {
        if self.elapsed_ns == 0 {
            return 0.0;
        }
        self.msgs as f64 * 1e9 / self.elapsed_ns as f64
    }

    /// Bytes per second of payload.
    pub fn bytes_per_sec(&self) -> f64 {
        if self.elapsed_ns == 0 {
            return 0.0;
        }
        self.bytes as f64 * 1e9 / self.elapsed_ns as f64
    }

    /// Megabytes (10^6 bytes) per second of payload.
    pub fn mb_per_sec(&self) -> f64 {
        if self.elapsed_ns == 0 {
            return 0.0;
        }
        self.bytes as f64 * 1e3 / self.elapsed_ns as f64
    }

    /// Gigabits (10^9 bits) per second of payload.
    pub fn gbit_per_sec(&self) -> f64 {
        self.mb_per_sec() * 8.0 / 1e3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_values() {
        let mut h = new_latency_histogram();
        for v in 1..=1000u64 {
            h.saturating_record(v);
        }
        let s = LatencySummary::from_histogram(&h).unwrap();
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 1000.0);
        assert!((s.p50 - 500.0).abs() <= 1.0);
        assert!((s.mean - 500.5).abs() < 1.0);
        assert!(LatencySummary::from_histogram(&new_latency_histogram()).is_none());
        let r = s.ratio_to(&s.scaled(0.5));
        assert!(r.as_array().iter().all(|x| (x - 2.0).abs() < 1e-9));
    }

    #[test]
    fn saturates_instead_of_growing() {
        let mut h = new_latency_histogram();
        let len = h.distinct_values();
        h.saturating_record(u64::MAX);
        assert_eq!(h.distinct_values(), len);
        assert!(h.max() >= HIGHEST_NS);
    }

    #[test]
    fn rate_figures() {
        let r = RateSummary {
            msgs: 2_000_000,
            bytes: 128_000_000,
            elapsed_ns: 1_000_000_000,
        };
        assert_eq!(r.msgs_per_sec(), 2e6);
        assert_eq!(r.mb_per_sec(), 128.0);
        assert_eq!(r.bytes_per_sec(), 128e6);
        assert!((r.gbit_per_sec() - 1.024).abs() < 1e-12);
    }
}
