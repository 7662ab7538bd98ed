//! One measured point: its figures and knobs ([`Point`], [`Knobs`], [`Counters`]), with its raw
//! histograms ([`Measured`]), and the points `bench floor` reports.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::hlog;
use crate::floor::{FloorResult, MemcpyFloor};
use crate::stats::{LatencySummary, RateSummary};
use crate::sys::{CpuUse, ProcessCsw};

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
    /// Dedicated poller cores (empty in run-to-completion mode).
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
    /// `--hugepages`: `off`, `try` or `require` (empty for floors and older summaries).
    #[serde(default)]
    pub hugepages: String,
    /// `--rdma-srq`: receive buffers in each poller's shared receive queue (0: none, each
    /// connection its own receive pool).
    #[serde(default)]
    pub rdma_srq: usize,
    /// `--rdma-srq-credits` as given (0: the engine's default grant, min(buffers, 16)).
    #[serde(default)]
    pub rdma_srq_credits: usize,
    /// `--api`: `buffer` or `poll-copy` (empty for floors and older summaries, which ran
    /// `buffer`).
    #[serde(default)]
    pub api: String,
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
    /// The engine's regions (pools, shm segments) on 2 MiB hugepages: a total, not a
    /// difference over the point (regions are placed when a connection is set up).
    #[serde(default)]
    pub huge_regions: u64,
    /// Their bytes (total).
    #[serde(default)]
    pub huge_bytes: u64,
    /// The engine's regions on 4 KiB pages (total).
    #[serde(default)]
    pub small_regions: u64,
    /// Their bytes (total).
    #[serde(default)]
    pub small_bytes: u64,
    /// Regions that asked for hugepages and got 4 KiB pages (total).
    #[serde(default)]
    pub hugepage_fallbacks: u64,
    /// `--idle block`: the connection's sleeps in the kernel (`ConnStats::sleeps`) ...
    #[serde(default)]
    pub sleeps: u64,
    /// ... and of those, the ones that ended at their bound, not rung (`sleeps_unrung`).
    #[serde(default)]
    pub sleeps_unrung: u64,
    /// `--idle block`: the pollers' sleeps (`PollerStats::sleeps`) ...
    #[serde(default)]
    pub poller_sleeps: u64,
    /// ... and of those, the ones that ended at their bound (`sleep_timeouts`).
    #[serde(default)]
    pub poller_sleep_timeouts: u64,
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
            // Totals: placement happens at setup, before the point.
            huge_regions: self.huge_regions,
            huge_bytes: self.huge_bytes,
            small_regions: self.small_regions,
            small_bytes: self.small_bytes,
            hugepage_fallbacks: self.hugepage_fallbacks,
            sleeps: self.sleeps.saturating_sub(before.sleeps),
            sleeps_unrung: self.sleeps_unrung.saturating_sub(before.sleeps_unrung),
            poller_sleeps: self.poller_sleeps.saturating_sub(before.poller_sleeps),
            poller_sleep_timeouts: self
                .poller_sleep_timeouts
                .saturating_sub(before.poller_sleep_timeouts),
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
    /// Each RTT figure divided by the two-line floor's (one line per direction; null without
    /// it).
    #[serde(default)]
    pub rtt_x_floor_two_lines: Option<LatencySummary>,
    /// Each RTT figure divided by the relay floor's (a dedicated poller's topology with no
    /// software; `--mode dedicated` points only, null otherwise or without it).
    #[serde(default)]
    pub rtt_x_relay: Option<LatencySummary>,
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
    /// Load, round-trip, with the wake-up reference measured (`load --idle block --floor`): each
    /// percentile of `latency_ns` over the floor's RTT percentile (null otherwise).
    #[serde(default)]
    pub latency_x_floor: Option<LatencySummary>,
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
    /// The quiet-machine guard's verdict: other processes' CPU on the run's cores and each
    /// spinner's achieved CPU over the point, and whether that disturbed it (null for the
    /// floor and in summaries that predate it).
    #[serde(default)]
    pub quiet: Option<crate::quiet::Quiet>,
    /// Every knob.
    #[serde(flatten)]
    pub knobs: Knobs,
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

/// What a floor ran with, in the knobs' terms: the cache-line floor's SPSC ring is 4096 slots
/// of one 8-byte word (its depth and buffers); the raw tcp floor has one ping in flight of
/// `ping_bytes` and no engine buffers (0); the memcpy floor has one copy of its size in flight.
fn floor_knobs(f: &FloorResult) -> Knobs {
    let (depth, buffers, size) = match f.kind {
        "cache-line" => (4096, 4096, 8),
        _ => (1, 0, f.ping_bytes as usize),
    };
    Knobs {
        idle: "spin".into(),
        batch: 1,
        depth,
        inline_threshold: 0,
        signal_every: 0,
        buffers,
        buffer_size: size,
        poller_cores: Vec::new(),
        app_cores: f.cores.to_vec(),
        offered_rate: 0,
        app_batch: 0,
        max_message_size: size,
        large_buffers: 0,
        large_threshold: size,
        hugepages: String::new(),
        rdma_srq: 0,
        rdma_srq_credits: 0,
        api: String::new(),
    }
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
            size_bytes: f.ping_bytes,
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
            rtt_x_floor_two_lines: None,
            rtt_x_relay: None,
            msgs_per_sec_x_floor: None,
            floor_msgs_per_sec: None,
            floor_memcpy_bytes_per_sec: None,
            bytes_per_sec_x_memcpy: None,
            conn_max_message_size: None,
            counters: None,
            latency_ns: None,
            latency_kind: None,
            latency_x_floor: None,
            burst: None,
            achieved_rate: None,
            rate_shortfall: None,
            rate_warning: false,
            cpu: None,
            process: None,
            quiet: None,
            knobs: floor_knobs(f),
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
            rtt_two_lines: None,
            rings: None,
            rate,
            cores: [m.core, m.core],
            kind: "memcpy",
            ping_bytes: 0,
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
