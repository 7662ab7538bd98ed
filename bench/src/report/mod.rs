//! Reports: the console table, and the files `--out DIR` writes.
//!
//! | file | format |
//! |------|--------|
//! | `<label>.hgrm` | HdrHistogram percentile distribution of RTT, in microseconds ([`hgrm`]) |
//! | `floor.hgrm` | the same for the cache-line floor |
//! | `<label>.hlog` | HdrHistogram interval log of RTT in nanoseconds, one histogram per `--interval` ([`hlog`]) |
//! | `summary.json` | [`Summary`]: `machine`, `floor` and one entry of `points` per measured point |
//! | `summary.csv` | one row per point, columns [`CSV_COLUMNS`] |
//! | `latency-percentiles.svg` | latency percentile distribution, log "nines" x-axis, every lat and load point and the floor overlaid |
//! | `rate-vs-size.svg`, `latency-vs-size.svg` | sweeps over more than one size |
//! | `bandwidth-vs-size.svg` | the same: payload MB/s against size (log x), with the single-core `memcpy` floor drawn in when measured |
//! | `latency-vs-load.svg` | load points over more than one offered rate: p50, p99, p99.9 against the offered rate (the "hockey stick") |
//!
//! A load point's `.hgrm` / `.hlog` hold its open-loop latency (from intended send time), not
//! an RTT.

pub mod compare;
pub mod console;
pub mod hgrm;
pub mod hlog;
pub mod svg;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::floor::{FloorResult, MemcpyFloor};
use crate::machine::Machine;
use crate::stats::{LatencySummary, RateSummary};
use crate::sys::{CpuUse, ProcessCsw};

/// Version of the `summary.json` layout. Fields are only ever added; a removal or change of
/// meaning bumps this.
pub const SCHEMA_VERSION: u32 = 1;

/// A load point warns when its achieved rate falls short of the offered one by more than this
/// fraction.
pub const SHORTFALL_WARN: f64 = 0.01;

/// The knobs a point ran with (flattened into each point of `summary.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Knobs {
    /// `spin` or `backoff`.
    pub idle: String,
    /// `--batch`.
    pub batch: usize,
    /// `--depth`.
    pub depth: usize,
    /// `--inline-threshold`, bytes.
    pub inline_threshold: usize,
    /// `--signal-every`.
    pub signal_every: usize,
    /// `--buffers`.
    pub buffers: usize,
    /// `--buffer-size`, bytes.
    pub buffer_size: usize,
    /// Dedicated poller cores (empty in inline mode).
    pub poller_cores: Vec<usize>,
    /// App-thread cores: client, then server.
    pub app_cores: Vec<usize>,
    /// Offered load in msgs/s (`--rate`, or the sweep's `--rates` entry of a load point), 0 for
    /// unlimited.
    pub offered_rate: u64,
    /// `--app-batch`: rate points' application batch (messages per flush and per batch
    /// receive); 0: one send and one `try_recv` per message.
    #[serde(default)]
    pub app_batch: usize,
    /// `--max-size`: the engine's `max_message_size` as configured, bytes (0 in summaries that
    /// predate it).
    #[serde(default)]
    pub max_message_size: usize,
    /// `--large-buffers`: large slots per connection per direction.
    #[serde(default)]
    pub large_buffers: usize,
    /// The large threshold in effect, bytes (`--large-threshold`, at most `buffer_size`): a
    /// longer message goes through a large slot.
    #[serde(default)]
    pub large_threshold: usize,
}

/// Engine counters on the client side over one point (warm-up and the point's few control
/// messages included): the connection's, plus the pollers' of the client's engine (in a
/// dedicated-mode loopback run both sides share that engine).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Messages the application sent.
    pub sent: u64,
    /// Messages the application received.
    pub received: u64,
    /// `send` calls refused for lack of credits.
    pub would_block: u64,
    /// `alloc` calls that found no free buffer.
    pub alloc_failures: u64,
    /// Times the fabric took fewer sends than offered.
    pub tx_stalls: u64,
    /// Send batches posted by the pollers (doorbells); `sent / tx_batches` is the mean batch.
    pub tx_batches: u64,
    /// Poller cycles that did work.
    pub busy_cycles: u64,
    /// Poller cycles that found nothing to do.
    pub empty_cycles: u64,
}

impl Counters {
    /// `self - before`, field by field (saturating).
    pub fn since(&self, before: &Self) -> Self {
        Self {
            sent: self.sent.saturating_sub(before.sent),
            received: self.received.saturating_sub(before.received),
            would_block: self.would_block.saturating_sub(before.would_block),
            alloc_failures: self.alloc_failures.saturating_sub(before.alloc_failures),
            tx_stalls: self.tx_stalls.saturating_sub(before.tx_stalls),
            tx_batches: self.tx_batches.saturating_sub(before.tx_batches),
            busy_cycles: self.busy_cycles.saturating_sub(before.busy_cycles),
            empty_cycles: self.empty_cycles.saturating_sub(before.empty_cycles),
        }
    }
}

/// One measured point: a row of `summary.csv`, an entry of `points` in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// `lat`, `rate`, `load` or `floor`.
    pub test: String,
    /// Unique name of the point; also the stem of its `.hgrm` / `.hlog` files.
    pub label: String,
    /// `shm`, `rdma`, or `cache-line` for the floor.
    pub fabric: String,
    /// `inline`, `dedicated`, or `threads` for the floor.
    pub mode: String,
    /// `loopback` or `client`.
    pub role: String,
    /// Payload bytes per message.
    pub size_bytes: u64,
    /// Measured iterations (round trips for lat, messages for rate).
    pub iters: u64,
    /// Unmeasured warm-up iterations.
    pub warmup: u64,
    /// `--duration` in seconds, when the run was time-bounded.
    pub duration_s: Option<f64>,
    /// Length of the measured window, seconds.
    pub elapsed_s: f64,
    /// Round-trip time, nanoseconds (null for rate points).
    pub rtt_ns: Option<LatencySummary>,
    /// RTT/2, nanoseconds (null for rate points).
    pub half_rtt_ns: Option<LatencySummary>,
    /// Messages per second (null for lat points).
    pub msgs_per_sec: Option<f64>,
    /// Payload megabytes (10^6) per second (null for lat points).
    pub mb_per_sec: Option<f64>,
    /// Payload gigabits (10^9) per second (null for lat points).
    pub gbit_per_sec: Option<f64>,
    /// Payload bytes per second (null for lat points).
    #[serde(default)]
    pub bytes_per_sec: Option<f64>,
    /// RTT recorded with coordinated-omission correction (`--rate` given).
    pub co_corrected: bool,
    /// The sweep's crossed knob, if any.
    pub cross: Option<String>,
    /// Its value at this point.
    pub cross_value: Option<u64>,
    /// Each RTT figure divided by the floor's (null without a floor).
    pub rtt_x_floor: Option<LatencySummary>,
    /// msgs/s divided by the floor's streaming msgs/s (null without a floor or for lat).
    pub msgs_per_sec_x_floor: Option<f64>,
    /// The floor's streaming msgs/s (cache-line SPSC, measured in the same run), stated beside
    /// this point's msgs/s (null without a floor or for lat).
    #[serde(default)]
    pub floor_msgs_per_sec: Option<f64>,
    /// The single-core `memcpy` bandwidth for this point's size, bytes/s (the bandwidth floor
    /// of shm, measured in the same run), stated beside its bytes/s (null without a floor or
    /// for lat).
    #[serde(default)]
    pub floor_memcpy_bytes_per_sec: Option<f64>,
    /// bytes/s divided by [`floor_memcpy_bytes_per_sec`](Self::floor_memcpy_bytes_per_sec)
    /// ("x memcpy"; null without it).
    #[serde(default)]
    pub bytes_per_sec_x_memcpy: Option<f64>,
    /// The connection's limit: the largest message it carries (`Connection::max_message_size`:
    /// `max_message_size` with large slots, else the buffer size); null for the floor.
    #[serde(default)]
    pub conn_max_message_size: Option<u64>,
    /// Engine counters over the point (null for the floor).
    #[serde(default)]
    pub counters: Option<Counters>,
    /// Load: open-loop latency of each message from its intended send time, nanoseconds (null
    /// for other tests).
    #[serde(default)]
    pub latency_ns: Option<LatencySummary>,
    /// Load: `one-way` (receiver's clock) or `round-trip` (echo, client's clock).
    #[serde(default)]
    pub latency_kind: Option<String>,
    /// Load: messages sharing one intended send time (`--burst`).
    #[serde(default)]
    pub burst: Option<u64>,
    /// Load: the rate the sender achieved over the measured messages, msgs/s.
    #[serde(default)]
    pub achieved_rate: Option<f64>,
    /// Load: `1 - achieved_rate / offered_rate`; above 0 the sender fell short.
    #[serde(default)]
    pub rate_shortfall: Option<f64>,
    /// Load: the shortfall exceeded [`SHORTFALL_WARN`] (1 %): the offered rate was not met.
    #[serde(default)]
    pub rate_warning: bool,
    /// User / system seconds and context switches of the client's and the server's app
    /// thread over the point (null for the floor).
    #[serde(default)]
    pub cpu: Option<CpuUse>,
    /// Context switches of this whole process over the point (every thread; in a loopback run
    /// both sides, their pollers and control threads): the involuntary ones are what
    /// preempts spinners (null for the floor).
    #[serde(default)]
    pub process: Option<ProcessCsw>,
    /// Every knob.
    #[serde(flatten)]
    pub knobs: Knobs,
}

/// The floor, as recorded in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloorFigures {
    /// Client and server cores.
    pub cores: [usize; 2],
    /// Cache-line ping-pong RTT, nanoseconds.
    pub rtt_ns: LatencySummary,
    /// SPSC streaming rate of 8-byte messages.
    pub msgs_per_sec: f64,
    /// The same in MB/s.
    pub mb_per_sec: f64,
    /// Single-core `memcpy` bandwidth per size (empty when not measured).
    #[serde(default)]
    pub memcpy: Vec<MemcpyFigures>,
}

/// The single-core `memcpy` floor for one size, as recorded in `summary.json`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemcpyFigures {
    /// Bytes per copy.
    pub size_bytes: u64,
    /// The core it ran on.
    pub core: usize,
    /// Measured copies.
    pub copies: u64,
    /// Bytes copied per second.
    pub bytes_per_sec: f64,
    /// The same in MB/s (10^6 bytes).
    pub mb_per_sec: f64,
}

impl From<&MemcpyFloor> for MemcpyFigures {
    fn from(m: &MemcpyFloor) -> Self {
        Self {
            size_bytes: m.size_bytes,
            core: m.core,
            copies: m.copies,
            bytes_per_sec: m.bytes_per_sec(),
            mb_per_sec: m.mb_per_sec(),
        }
    }
}

/// `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Always `spinwire-bench`.
    pub tool: String,
    /// bench's version.
    pub version: String,
    /// The command line.
    pub command: Vec<String>,
    /// When the run started, seconds since the Unix epoch.
    pub started_unix_s: f64,
    /// True when Ctrl-C cut the run short (points holds what was measured).
    pub interrupted: bool,
    /// Where it ran.
    pub machine: Machine,
    /// The floor, when measured in this run.
    pub floor: Option<FloorFigures>,
    /// The measured points.
    pub points: Vec<Point>,
}

/// A point plus its raw histograms.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Figures and knobs.
    pub point: Point,
    /// Latency histogram: RTT of lat points, open-loop latency of load points.
    pub rtt: Option<Histogram<u64>>,
    /// The same per `--interval`.
    pub intervals: Vec<hlog::Interval>,
}

/// Everything a run produced, ready to print and write.
#[derive(Debug, Clone)]
pub struct Report {
    /// The command line.
    pub command: Vec<String>,
    /// When the run started.
    pub started: SystemTime,
    /// Where it ran.
    pub machine: Machine,
    /// The floor, if measured.
    pub floor: Option<FloorResult>,
    /// The single-core `memcpy` floor per size (measured with the floor, one per rate size).
    pub memcpy: Vec<MemcpyFloor>,
    /// The points, in the order measured.
    pub measured: Vec<Measured>,
    /// Ctrl-C cut the run short.
    pub interrupted: bool,
}

impl Report {
    /// An empty report for a run starting now.
    pub fn new(command: Vec<String>) -> Self {
        Self {
            command,
            started: SystemTime::now(),
            machine: Machine::detect(),
            floor: None,
            memcpy: Vec::new(),
            measured: Vec::new(),
            interrupted: false,
        }
    }

    /// The floor's figures, if measured.
    pub fn floor_figures(&self) -> Option<FloorFigures> {
        let f = self.floor.as_ref()?;
        Some(FloorFigures {
            cores: f.cores,
            rtt_ns: LatencySummary::from_histogram(&f.rtt)?,
            msgs_per_sec: f.rate.msgs_per_sec(),
            mb_per_sec: f.rate.mb_per_sec(),
            memcpy: self.memcpy.iter().map(MemcpyFigures::from).collect(),
        })
    }

    /// The `memcpy` floor measured for `size` bytes, if any.
    pub fn memcpy_for(&self, size: u64) -> Option<&MemcpyFloor> {
        self.memcpy.iter().find(|m| m.size_bytes == size)
    }

    /// Adds a point, filling its ratios to the floor when one was measured.
    pub fn push(&mut self, mut m: Measured) {
        if let Some(f) = self.floor_figures() {
            m.point.rtt_x_floor = m.point.rtt_ns.map(|r| r.ratio_to(&f.rtt_ns));
            m.point.msgs_per_sec_x_floor = m
                .point
                .msgs_per_sec
                .filter(|_| f.msgs_per_sec > 0.0)
                .map(|r| r / f.msgs_per_sec);
            m.point.floor_msgs_per_sec = m.point.msgs_per_sec.map(|_| f.msgs_per_sec);
        }
        if let (Some(bw), Some(mc)) = (m.point.bytes_per_sec, self.memcpy_for(m.point.size_bytes)) {
            let floor = mc.bytes_per_sec();
            m.point.floor_memcpy_bytes_per_sec = Some(floor);
            m.point.bytes_per_sec_x_memcpy = (floor > 0.0).then(|| bw / floor);
        }
        self.measured.push(m);
    }

    /// `summary.json`'s content.
    pub fn summary(&self) -> Summary {
        Summary {
            schema_version: SCHEMA_VERSION,
            tool: "spinwire-bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            command: self.command.clone(),
            started_unix_s: self
                .started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            interrupted: self.interrupted,
            machine: self.machine.clone(),
            floor: self.floor_figures(),
            points: self.measured.iter().map(|m| m.point.clone()).collect(),
        }
    }

    /// Writes every report file into `dir` (created if missing); returns the paths written.
    ///
    /// # Errors
    /// [`BenchError::Io`] naming the file that could not be written.
    pub fn write_dir(&self, dir: &Path) -> Result<Vec<PathBuf>, BenchError> {
        fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
        let mut written = Vec::new();
        let mut put = |name: &str, bytes: &[u8]| -> Result<(), BenchError> {
            let path = dir.join(name);
            fs::write(&path, bytes).map_err(|e| BenchError::io(&path, e))?;
            written.push(path);
            Ok(())
        };
        if let Some(f) = &self.floor {
            let mut buf = Vec::new();
            hgrm::write(&mut buf, &f.rtt, 1000.0).map_err(|e| BenchError::io("floor.hgrm", e))?;
            put("floor.hgrm", &buf)?;
        }
        for m in &self.measured {
            if let Some(h) = &m.rtt {
                let mut buf = Vec::new();
                hgrm::write(&mut buf, h, 1000.0).map_err(|e| BenchError::io(&m.point.label, e))?;
                put(&format!("{}.hgrm", m.point.label), &buf)?;
            }
            if !m.intervals.is_empty() {
                let mut buf = Vec::new();
                hlog::write(&mut buf, self.started, &m.point.label, &m.intervals)
                    .map_err(|e| BenchError::io(&m.point.label, std::io::Error::other(e)))?;
                put(&format!("{}.hlog", m.point.label), &buf)?;
            }
        }
        let summary = self.summary();
        let json = serde_json::to_string_pretty(&summary)
            .map_err(|e| BenchError::io("summary.json", std::io::Error::other(e)))?;
        put("summary.json", format!("{json}\n").as_bytes())?;
        put("summary.csv", csv(&summary.points).as_bytes())?;
        for (name, plot) in self.plots() {
            put(&name, plot.render().as_bytes())?;
        }
        Ok(written)
    }

    /// The SVG plots this report has data for, with their file names.
    pub fn plots(&self) -> Vec<(String, svg::Plot)> {
        let mut plots = Vec::new();
        let mut pct = Vec::new();
        if let Some(f) = &self.floor {
            pct.push(percentile_series("floor (cache line)", &f.rtt));
        }
        for m in &self.measured {
            if let Some(h) = &m.rtt {
                pct.push(percentile_series(&m.point.label, h));
            }
        }
        if !pct.is_empty() {
            plots.push((
                "latency-percentiles.svg".to_string(),
                svg::Plot {
                    title: "Latency percentile distribution".into(),
                    x_label: "percentile".into(),
                    y_label: "RTT, or open-loop latency of load points (us)".into(),
                    x_axis: svg::Axis::Nines,
                    y_axis: svg::Axis::Log10,
                    series: pct,
                },
            ));
        }
        if let Some(p) = self.load_plot() {
            plots.push(("latency-vs-load.svg".into(), p));
        }
        let sizes: std::collections::BTreeSet<u64> = self
            .measured
            .iter()
            .filter(|m| m.point.test != "floor")
            .map(|m| m.point.size_bytes)
            .collect();
        if sizes.len() < 2 {
            return plots;
        }
        // Series keyed by crossed knob value (one series when the sweep crosses nothing).
        let series_by = |test: &str, f: &dyn Fn(&Point) -> Option<f64>, suffix: &str| {
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
                .collect::<Vec<_>>()
        };
        let rate = series_by("rate", &|p| p.msgs_per_sec, "msgs/s");
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
            let mut bandwidth = series_by("rate", &|p| p.mb_per_sec, "MB/s");
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
            plots.push((
                "bandwidth-vs-size.svg".into(),
                svg::Plot {
                    title: "Bandwidth vs message size".into(),
                    x_label: "message size (bytes)".into(),
                    y_label: "payload MB/s".into(),
                    x_axis: svg::Axis::Log2,
                    y_axis: svg::Axis::Linear,
                    series: bandwidth,
                },
            ));
        }
        let mut lat = series_by("lat", &|p| p.rtt_ns.map(|r| r.p50 / 1e3), "p50");
        lat.extend(series_by("lat", &|p| p.rtt_ns.map(|r| r.p99 / 1e3), "p99"));
        lat.extend(series_by(
            "lat",
            &|p| p.rtt_ns.map(|r| r.p99_9 / 1e3),
            "p99.9",
        ));
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
        plots
    }
}

/// Legend of the `memcpy` floor's line in `bandwidth-vs-size.svg`.
pub const MEMCPY_SERIES: &str = "memcpy floor (1 core)";

/// Picks one figure of a latency summary.
type Figure = fn(&LatencySummary) -> f64;

impl Report {
    /// The latency-vs-load plot: p50, p99 and p99.9 of every load series (one per size and
    /// crossed value) against the offered rate, when some series has two or more rates.
    fn load_plot(&self) -> Option<svg::Plot> {
        let mut by: BTreeMap<(u64, Option<u64>), Vec<&Point>> = BTreeMap::new();
        for p in self.measured.iter().map(|m| &m.point) {
            if p.test == "load" && p.latency_ns.is_some() {
                by.entry((p.size_bytes, p.cross_value)).or_default().push(p);
            }
        }
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

/// Where latency bends up with load: the lowest offered rate at which p99 exceeds twice its
/// value at the lowest offered rate, per load series (size, crossed value). `None` for a series
/// that never bends (or has fewer than two rates).
pub fn knees(points: &[Point]) -> Vec<(u64, Option<u64>, Option<u64>)> {
    let mut by: BTreeMap<(u64, Option<u64>), Vec<&Point>> = BTreeMap::new();
    for p in points {
        if p.test == "load" && p.latency_ns.is_some() {
            by.entry((p.size_bytes, p.cross_value)).or_default().push(p);
        }
    }
    by.into_iter()
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

/// Columns of `summary.csv`, in order.
pub const CSV_COLUMNS: &[&str] = &[
    "test",
    "label",
    "fabric",
    "mode",
    "role",
    "size_bytes",
    "iters",
    "warmup",
    "duration_s",
    "elapsed_s",
    "rtt_min_ns",
    "rtt_p50_ns",
    "rtt_p90_ns",
    "rtt_p99_ns",
    "rtt_p99_9_ns",
    "rtt_p99_99_ns",
    "rtt_max_ns",
    "rtt_mean_ns",
    "rtt_stdev_ns",
    "half_rtt_p50_ns",
    "msgs_per_sec",
    "mb_per_sec",
    "gbit_per_sec",
    "rtt_p50_x_floor",
    "rtt_p99_x_floor",
    "msgs_per_sec_x_floor",
    "co_corrected",
    "offered_rate",
    "cross",
    "cross_value",
    "idle",
    "batch",
    "depth",
    "inline_threshold",
    "signal_every",
    "buffers",
    "buffer_size",
    "poller_cores",
    "app_cores",
    "sent",
    "received",
    "would_block",
    "alloc_failures",
    "tx_stalls",
    "tx_batches",
    "busy_cycles",
    "empty_cycles",
    "latency_kind",
    "burst",
    "achieved_rate",
    "rate_shortfall",
    "rate_warning",
    "latency_min_ns",
    "latency_p50_ns",
    "latency_p90_ns",
    "latency_p99_ns",
    "latency_p99_9_ns",
    "latency_p99_99_ns",
    "latency_max_ns",
    "latency_mean_ns",
    "latency_stdev_ns",
    "client_user_s",
    "client_system_s",
    "client_voluntary_csw",
    "client_involuntary_csw",
    "server_user_s",
    "server_system_s",
    "server_voluntary_csw",
    "server_involuntary_csw",
    "floor_msgs_per_sec",
    "app_batch",
    "process_voluntary_csw",
    "process_involuntary_csw",
    "process_involuntary_csw_per_sec",
    "bytes_per_sec",
    "floor_memcpy_bytes_per_sec",
    "bytes_per_sec_x_memcpy",
    "max_message_size",
    "large_buffers",
    "large_threshold",
    "conn_max_message_size",
];

/// Renders `points` as CSV with a header row ([`CSV_COLUMNS`]); empty cells for nulls, core
/// lists joined with `;`.
pub fn csv(points: &[Point]) -> String {
    fn opt<T: ToString>(v: Option<T>) -> String {
        v.map(|v| v.to_string()).unwrap_or_default()
    }
    fn field(s: &str) -> String {
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    }
    fn cores(c: &[usize]) -> String {
        c.iter().map(usize::to_string).collect::<Vec<_>>().join(";")
    }
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    for p in points {
        let rtt = p.rtt_ns.map(|r| r.as_array());
        let rtt_col = |i: usize| opt(rtt.map(|a| a[i]));
        let k = &p.knobs;
        let row: Vec<String> = vec![
            p.test.clone(),
            p.label.clone(),
            p.fabric.clone(),
            p.mode.clone(),
            p.role.clone(),
            p.size_bytes.to_string(),
            p.iters.to_string(),
            p.warmup.to_string(),
            opt(p.duration_s),
            p.elapsed_s.to_string(),
            rtt_col(0),
            rtt_col(1),
            rtt_col(2),
            rtt_col(3),
            rtt_col(4),
            rtt_col(5),
            rtt_col(6),
            rtt_col(7),
            rtt_col(8),
            opt(p.half_rtt_ns.map(|r| r.p50)),
            opt(p.msgs_per_sec),
            opt(p.mb_per_sec),
            opt(p.gbit_per_sec),
            opt(p.rtt_x_floor.map(|r| r.p50)),
            opt(p.rtt_x_floor.map(|r| r.p99)),
            opt(p.msgs_per_sec_x_floor),
            p.co_corrected.to_string(),
            k.offered_rate.to_string(),
            opt(p.cross.clone()),
            opt(p.cross_value),
            k.idle.clone(),
            k.batch.to_string(),
            k.depth.to_string(),
            k.inline_threshold.to_string(),
            k.signal_every.to_string(),
            k.buffers.to_string(),
            k.buffer_size.to_string(),
            cores(&k.poller_cores),
            cores(&k.app_cores),
        ];
        let c = p.counters;
        let mut row = row;
        row.extend([
            opt(c.map(|c| c.sent)),
            opt(c.map(|c| c.received)),
            opt(c.map(|c| c.would_block)),
            opt(c.map(|c| c.alloc_failures)),
            opt(c.map(|c| c.tx_stalls)),
            opt(c.map(|c| c.tx_batches)),
            opt(c.map(|c| c.busy_cycles)),
            opt(c.map(|c| c.empty_cycles)),
            opt(p.latency_kind.clone()),
            opt(p.burst),
            opt(p.achieved_rate),
            opt(p.rate_shortfall),
            p.rate_warning.to_string(),
        ]);
        let lat = p.latency_ns.map(|r| r.as_array());
        row.extend((0..9).map(|i| opt(lat.map(|a| a[i]))));
        let client = p.cpu.map(|c| c.client);
        let server = p.cpu.and_then(|c| c.server);
        for t in [client, server] {
            row.extend([
                opt(t.map(|t| t.user_s)),
                opt(t.map(|t| t.system_s)),
                opt(t.map(|t| t.voluntary_csw)),
                opt(t.map(|t| t.involuntary_csw)),
            ]);
        }
        row.extend([
            opt(p.floor_msgs_per_sec),
            k.app_batch.to_string(),
            opt(p.process.map(|c| c.voluntary_csw)),
            opt(p.process.map(|c| c.involuntary_csw)),
            opt(p.process.map(|c| c.involuntary_csw_per_sec)),
            opt(p.bytes_per_sec),
            opt(p.floor_memcpy_bytes_per_sec),
            opt(p.bytes_per_sec_x_memcpy),
            k.max_message_size.to_string(),
            k.large_buffers.to_string(),
            k.large_threshold.to_string(),
            opt(p.conn_max_message_size),
        ]);
        debug_assert_eq!(row.len(), CSV_COLUMNS.len());
        let line: Vec<String> = row.iter().map(|s| field(s)).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    out
}

/// Writes `s` to stdout, ignoring a closed pipe (e.g. `bench ... | head`).
pub fn print(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}

/// A floor-only point for `bench floor` (test `floor`, fabric `cache-line` or `tcp-raw`).
pub fn floor_point(f: &FloorResult, iters: u64, warmup: u64) -> Measured {
    let rtt = LatencySummary::from_histogram(&f.rtt);
    let rate: &RateSummary = &f.rate;
    Measured {
        point: Point {
            test: "floor".into(),
            label: "floor".into(),
            fabric: f.kind.into(),
            mode: "threads".into(),
            role: "loopback".into(),
            size_bytes: 8,
            iters,
            warmup,
            duration_s: None,
            elapsed_s: rate.elapsed_ns as f64 / 1e9,
            rtt_ns: rtt,
            half_rtt_ns: rtt.map(|r| r.scaled(0.5)),
            msgs_per_sec: Some(rate.msgs_per_sec()),
            mb_per_sec: Some(rate.mb_per_sec()),
            gbit_per_sec: Some(rate.gbit_per_sec()),
            bytes_per_sec: Some(rate.bytes_per_sec()),
            co_corrected: false,
            cross: None,
            cross_value: None,
            rtt_x_floor: None,
            msgs_per_sec_x_floor: None,
            floor_msgs_per_sec: None,
            floor_memcpy_bytes_per_sec: None,
            bytes_per_sec_x_memcpy: None,
            conn_max_message_size: None,
            counters: None,
            latency_ns: None,
            latency_kind: None,
            burst: None,
            achieved_rate: None,
            rate_shortfall: None,
            rate_warning: false,
            cpu: None,
            process: None,
            knobs: Knobs {
                idle: "spin".into(),
                batch: 1,
                depth: 4096,
                inline_threshold: 8,
                signal_every: 1,
                buffers: 4096,
                buffer_size: 8,
                poller_cores: Vec::new(),
                app_cores: f.cores.to_vec(),
                offered_rate: 0,
                app_batch: 0,
                max_message_size: 8,
                large_buffers: 0,
                large_threshold: 8,
            },
        },
        rtt: None,
        intervals: Vec::new(),
    }
}

/// A `memcpy` floor point for `bench floor` (test `floor`, fabric `memcpy`, label
/// `floor-memcpy-<size>B`): its bandwidth in the rate columns.
pub fn memcpy_point(m: &MemcpyFloor) -> Measured {
    let bytes = m.copies * m.size_bytes;
    let rate = RateSummary {
        msgs: m.copies,
        bytes,
        elapsed_ns: m.elapsed_ns,
    };
    let mut out = floor_point(
        &FloorResult {
            rtt: crate::stats::new_latency_histogram(),
            rate,
            cores: [m.core, m.core],
            kind: "memcpy",
        },
        m.copies,
        m.copies / 8 + 1,
    );
    let p = &mut out.point;
    p.label = format!("floor-memcpy-{}B", m.size_bytes);
    p.mode = "one-core".into();
    p.size_bytes = m.size_bytes;
    p.bytes_per_sec = Some(m.bytes_per_sec());
    p.knobs.app_cores = vec![m.core];
    p.knobs.buffer_size = m.size_bytes as usize;
    p.knobs.max_message_size = m.size_bytes as usize;
    p.knobs.large_threshold = m.size_bytes as usize;
    p.knobs.depth = 1;
    p.knobs.buffers = 1;
    out
}
