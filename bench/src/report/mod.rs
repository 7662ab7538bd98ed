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
mod csv;
pub mod hgrm;
pub mod hlog;
mod plots;
mod point;
mod summary;
pub mod svg;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub use self::csv::{csv, CSV_COLUMNS};
pub use plots::{knees, MEMCPY_SERIES};
pub use point::{floor_point, memcpy_point, Counters, Knobs, Measured, Point, SHORTFALL_WARN};
pub use summary::{FloorFigures, MemcpyFigures, Summary, SCHEMA_VERSION};

use crate::error::BenchError;
use crate::floor::{FloorResult, MemcpyFloor};
use crate::machine::Machine;
use crate::stats::LatencySummary;

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
    /// What the report must say about how it was measured (e.g. why the floor is missing).
    pub notes: Vec<String>,
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
            notes: Vec::new(),
        }
    }

    /// The floor's figures, if measured.
    pub fn floor_figures(&self) -> Option<FloorFigures> {
        let f = self.floor.as_ref()?;
        Some(FloorFigures {
            cores: f.cores,
            rtt_ns: LatencySummary::from_histogram(&f.rtt)?,
            rtt_two_lines_ns: f
                .rtt_two_lines
                .as_ref()
                .and_then(LatencySummary::from_histogram),
            rtt_rings_ns: f
                .rings
                .as_ref()
                .and_then(|r| LatencySummary::from_histogram(&r.separate)),
            rtt_paired_rings_ns: f
                .rings
                .as_ref()
                .and_then(|r| LatencySummary::from_histogram(&r.paired)),
            rtt_relay_ns: f
                .rings
                .as_ref()
                .and_then(|r| LatencySummary::from_histogram(&r.relay)),
            msgs_per_sec: f.rate.msgs_per_sec(),
            mb_per_sec: f.rate.mb_per_sec(),
            memcpy: self.memcpy.iter().map(MemcpyFigures::from).collect(),
            kind: f.kind.to_string(),
        })
    }

    /// The `memcpy` floor measured for `size` bytes, if any.
    pub fn memcpy_for(&self, size: u64) -> Option<&MemcpyFloor> {
        self.memcpy.iter().find(|m| m.size_bytes == size)
    }

    /// Adds a point, filling its ratios to the floor when one was measured.
    pub fn push(&mut self, mut m: Measured) {
        let wake = self
            .floor
            .as_ref()
            .is_some_and(|f| f.kind == crate::floor_wake::KIND);
        if let Some(f) = self.floor_figures().filter(|_| wake) {
            // The wake-up reference is a round trip with one kernel wake-up: it compares with a round-trip
            // load latency, and says nothing of rates.
            if m.point.latency_kind.as_deref() == Some("round-trip") {
                m.point.latency_x_floor = m.point.latency_ns.map(|l| l.ratio_to(&f.rtt_ns));
            }
        } else if let Some(f) = self.floor_figures() {
            m.point.rtt_x_floor = m.point.rtt_ns.map(|r| r.ratio_to(&f.rtt_ns));
            if let (Some(r), Some(two)) = (m.point.rtt_ns, f.rtt_two_lines_ns) {
                m.point.rtt_x_floor_two_lines = Some(r.ratio_to(&two));
            }
            // Through a poller, a round trip crosses between the cores four times.
            if let (Some(r), Some(relay)) = (m.point.rtt_ns, f.rtt_relay_ns) {
                if m.point.mode == crate::cli::Mode::Dedicated.as_str() {
                    m.point.rtt_x_relay = Some(r.ratio_to(&relay));
                }
            }
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
            notes: self.notes.clone(),
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
}

/// Writes `s` to stdout, ignoring a closed pipe (e.g. `bench ... | head`).
pub fn print(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}
