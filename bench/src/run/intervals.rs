//! Interval histograms (the `.hlog` data): one latency histogram per `--interval`, all
//! allocated before measuring so recording never allocates.

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::report::hlog::Interval;
use crate::stats::{new_latency_histogram, HIGHEST_NS};

/// Most interval histograms one point keeps (each is ~200 KiB, allocated before measuring);
/// later intervals fold into the last one.
pub const MAX_INTERVALS: usize = 256;

/// One interval as (start ns, length ns, histogram).
pub type RawInterval = (u64, u64, Histogram<u64>);

/// Interval histograms over a nanosecond time axis (any clock, as long as one is used).
#[derive(Debug)]
pub struct Intervals {
    pool: Vec<Histogram<u64>>,
    /// Start (ns) of each interval in use; capacity reserved up front (pushing never allocates).
    starts: Vec<u64>,
    period_ns: u64,
    next_ns: u64,
}

impl Intervals {
    /// Enough histograms for `expected` (or 64 when unknown), at most [`MAX_INTERVALS`].
    pub fn new(period: Duration, expected: Option<Duration>) -> Self {
        let n = expected
            .map(|d| (d.as_secs_f64() / period.as_secs_f64()).ceil() as usize + 2)
            .unwrap_or(64)
            .clamp(1, MAX_INTERVALS);
        let period_ns = crate::floor::duration_ns(period).max(1);
        Self {
            pool: (0..n).map(|_| new_latency_histogram()).collect(),
            starts: Vec::with_capacity(n),
            period_ns,
            next_ns: period_ns,
        }
    }

    /// Starts the first interval at `now_ns`, forgetting anything recorded before.
    pub fn begin(&mut self, now_ns: u64) {
        for h in &mut self.pool[..self.starts.len().max(1)] {
            h.reset();
        }
        self.starts.clear();
        self.starts.push(now_ns);
        self.next_ns = now_ns + self.period_ns;
    }

    /// Records `v` at time `now_ns`; with `interval_ns > 0` with coordinated-omission
    /// correction for that expected interval.
    #[inline]
    pub fn record(&mut self, v: u64, interval_ns: u64, now_ns: u64) {
        if self.starts.is_empty() {
            self.begin(now_ns);
        }
        if now_ns >= self.next_ns && self.starts.len() < self.pool.len() {
            // After a stall longer than a period, the new interval starts at the boundary
            // just before `now` (the skipped time has no samples).
            while now_ns >= self.next_ns {
                self.next_ns += self.period_ns;
            }
            self.starts.push(self.next_ns - self.period_ns);
        }
        let h = &mut self.pool[self.starts.len() - 1];
        if interval_ns > 0 {
            let _ = h.record_correct(v.min(HIGHEST_NS), interval_ns);
        } else {
            h.saturating_record(v);
        }
    }

    /// The intervals in use as (start ns, length ns, histogram), the last ending at `end_ns`.
    pub fn into_raw(self, end_ns: u64) -> Vec<RawInterval> {
        let n = self.starts.len();
        let starts = self.starts;
        self.pool
            .into_iter()
            .take(n)
            .enumerate()
            .map(|(i, hist)| {
                let t = starts[i];
                let next = starts.get(i + 1).copied().unwrap_or(end_ns);
                (t, next.saturating_sub(t), hist)
            })
            .collect()
    }

    /// The intervals, timed relative to `origin_ns`, which lies `base_offset` after the log's
    /// base.
    pub fn finish(self, origin_ns: u64, base_offset: Duration, end_ns: u64) -> Vec<Interval> {
        to_log(self.into_raw(end_ns), origin_ns, base_offset)
    }
}

/// Raw intervals as log entries, timed relative to `origin_ns` (`base_offset` after the log's
/// base).
pub fn to_log(raw: Vec<RawInterval>, origin_ns: u64, base_offset: Duration) -> Vec<Interval> {
    raw.into_iter()
        .map(|(t, len, hist)| Interval {
            start: base_offset + Duration::from_nanos(t.saturating_sub(origin_ns)),
            length: Duration::from_nanos(len),
            hist,
        })
        .collect()
}
