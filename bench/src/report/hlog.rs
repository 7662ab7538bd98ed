//! HdrHistogram interval logs (`*.hlog`): one histogram per `--interval`, for jitter over time.
//! Readable by Java's `HistogramLogReader` / `HistogramLogProcessor` and by
//! [`hdrhistogram::serialization::interval_log::IntervalLogIterator`].

use std::io::Write;
use std::time::{Duration, SystemTime};

use hdrhistogram::serialization::interval_log::IntervalLogWriterBuilder;
use hdrhistogram::serialization::V2Serializer;
use hdrhistogram::Histogram;

/// One interval of a run: when it started (relative to the run's start) and what it recorded.
#[derive(Debug, Clone)]
pub struct Interval {
    /// Start, relative to the log's base time.
    pub start: Duration,
    /// Length of the interval.
    pub length: Duration,
    /// Values recorded in it (nanoseconds).
    pub hist: Histogram<u64>,
}

/// Writes `intervals` as an interval log whose base time is `base`. The per-interval max column
/// is in microseconds (values divided by 1000), as the header says.
///
/// # Errors
/// I/O or histogram-serialization errors, as text.
pub fn write<W: Write>(
    w: &mut W,
    base: SystemTime,
    comment: &str,
    intervals: &[Interval],
) -> Result<(), String> {
    let mut serializer = V2Serializer::new();
    // Header as Java's HistogramLogWriter lays it out: comments, version, StartTime, BaseTime,
    // then the CSV legend line (which the writer API cannot emit, so it goes in raw between
    // two writer sessions on the same sink).
    IntervalLogWriterBuilder::new()
        .add_comment(comment)
        .add_comment("values in nanoseconds; interval max column in microseconds")
        .add_comment("[Histogram log format version 1.3]")
        .with_start_time(base)
        .with_base_time(base)
        .begin_log_with(w, &mut serializer)
        .map_err(|e| e.to_string())?;
    w.write_all(
        b"\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"\n",
    )
    .map_err(|e| e.to_string())?;
    let mut log = IntervalLogWriterBuilder::new()
        .with_max_value_divisor(1000.0)
        .begin_log_with(w, &mut serializer)
        .map_err(|e| e.to_string())?;
    for i in intervals {
        log.write_histogram(&i.hist, i.start, i.length, None)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
