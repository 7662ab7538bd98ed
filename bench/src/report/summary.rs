//! `summary.json`'s layout: [`Summary`], with the floor's figures.

use serde::{Deserialize, Serialize};

use super::Point;
use crate::floor::MemcpyFloor;
use crate::machine::Machine;
use crate::stats::LatencySummary;

/// Version of the `summary.json` layout. Fields are only ever added; a removal or change of
/// meaning bumps this.
pub const SCHEMA_VERSION: u32 = 1;

/// The floor, as recorded in `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FloorFigures {
    /// Client and server cores.
    pub cores: [usize; 2],
    /// Cache-line ping-pong RTT, nanoseconds.
    pub rtt_ns: LatencySummary,
    /// The same with one line per direction (the floor of a one-ring-per-direction design,
    /// see `bench::floor`); absent for the other floors and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_two_lines_ns: Option<LatencySummary>,
    /// Round trips over a ring of 16-byte records per direction (the cache-line floor only; see
    /// `bench::floor`); absent for the other floors and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_rings_ns: Option<LatencySummary>,
    /// The same records with both directions' paired in shared lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_paired_rings_ns: Option<LatencySummary>,
    /// Round trips through a forwarding thread on the second core over four such rings: the
    /// topology of a dedicated poller with no software (`bench::floor`); absent for the other
    /// floors and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_relay_ns: Option<LatencySummary>,
    /// SPSC streaming rate of 8-byte messages.
    pub msgs_per_sec: f64,
    /// The same in MB/s.
    pub mb_per_sec: f64,
    /// Single-core `memcpy` bandwidth per size (empty when not measured).
    #[serde(default)]
    pub memcpy: Vec<MemcpyFigures>,
    /// What the floor is: `cache-line` (RTT and SPSC rate above), `tcp-raw` (raw busy-polled
    /// TCP), or `futex-wake` (the wake-up reference of `--idle block`: `rtt_ns` is a round trip
    /// with the server asleep, `msgs_per_sec` its paced rate). Empty in files written before it.
    #[serde(default)]
    pub kind: String,
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
    /// What the run says about how it was measured (e.g. why there is no floor).
    #[serde(default)]
    pub notes: Vec<String>,
}
