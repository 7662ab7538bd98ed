//! Command-line interface: every subcommand and knob, parsed with clap's derive API.
//!
//! The structs here are plain data; [`crate::run`] turns them into a validated
//! [`crate::run::Plan`] before anything is measured.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod parse;

pub use parse::{parse_duration, parse_fraction, parse_rate, parse_size};

/// Default shared-memory endpoint a `--server` listens on.
pub const DEFAULT_SERVER_ENDPOINT: &str = "shm://spinwire-bench";

/// Default endpoint a `floor --fabric tcp --server` listens on.
pub const DEFAULT_TCP_FLOOR_SERVER: &str = "tcp://0.0.0.0:7472";

/// spinwire benchmark: latency, message rate and bandwidth, with HdrHistogram jitter reports.
///
/// Runs ping-pong latency (`lat`), one-way streaming rate (`rate`), open-loop latency under a
/// fixed offered load (`load`), sweeps over message sizes and offered rates (`sweep`), the
/// machine's own floor (`floor`: bare cache-line ping-pong between two pinned threads), and
/// compares two runs (`compare`). Without `--server` or `--client` both sides run in this
/// process (loopback).
///
/// Why open loop: a ping-pong (`lat`) sends the next message only after the previous reply, so
/// a stall delays the messages that should have been sent during it, and they are never
/// measured (coordinated omission). `load` sends at `--rate` no matter what comes back; each
/// message carries the time it was meant to be sent, and its latency counts from then. A stall
/// shows as the tail it really causes. In a latency-vs-load plot (`sweep --rates`), p50, p99
/// and p99.9 stay flat at low load and bend up ("hockey stick") as the offered rate nears what
/// the transport sustains; the bend, not the unloaded ping-pong, is the usable capacity.
///
/// CPU use: every report gives user and system seconds and voluntary / involuntary context
/// switches of each side's busy app thread; involuntary switches mean a side was descheduled,
/// user + system close to the elapsed time means it was saturated. The `process` line counts
/// the context switches of every thread of this process (control and poller threads too) and
/// their rate: with every core owned by a spinner, involuntary ones are preempted spinners, the
/// usual cause of a ping-pong's p99.9 tail.
///
/// Threads: in loopback `--mode rtc` (the default) runs one app thread per side, pinned to the
/// two `--app-cores`, each driving its own engine: two busy threads in all, which fits a 2-core
/// machine. `--mode dedicated` adds one pinned poller thread per `--poller-cores` entry; it needs
/// at least three cores to avoid oversubscription (or `--idle backoff`).
#[derive(Debug, Parser)]
#[command(name = "bench", version, about, long_about, max_term_width = 100)]
pub struct Cli {
    /// What to measure.
    #[command(subcommand)]
    pub command: Command,
    /// Log the engine's control-plane events to stderr (listen, connect, accept, reject,
    /// disconnect, RDMA path): `-v` info, `-vv` debug, `-vvv` trace. `RUST_LOG` (e.g.
    /// `RUST_LOG=spinwire=debug`) overrides the level.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ping-pong round trip: the client sends `--size` bytes, the server echoes them; reports RTT
    /// and RTT/2 percentiles.
    Lat(LatArgs),
    /// One-way streaming rate: keeps up to `--depth` messages in flight and reports msgs/s, bytes/s,
    /// MB/s and Gb/s measured at the receiver, with the machine's cache-line streaming floor and
    /// the single-core memcpy bandwidth of the size (measured first, in the same run, as `floor`
    /// does) and the ratios to them beside each figure (`--no-floor` skips them). A message above
    /// --buffer-size (up to --max-size) is written in place into a large slot. `--app-batch N`
    /// sends N messages per flush and receives up to N per batch-receive call.
    Rate(RateArgs),
    /// Runs `lat` and/or `rate` over message sizes (powers of two up to `--max-size`, or
    /// `--sizes`), optionally crossed with one other knob, and `load` over `--rates`; measures
    /// `floor` first.
    Sweep(SweepArgs),
    /// Open-loop latency under a fixed offered load: the client sends `--rate` msgs/s (in bursts
    /// of `--burst`) without waiting for replies; each message carries its intended send time
    /// and a sequence number, and its latency is arrival (one-way) or echo arrival (round trip)
    /// minus the intended send time. Reports offered vs achieved rate and warns when the
    /// achieved rate fell more than 1 % short.
    Load(LoadArgs),
    /// Compares two `summary.json` files point by point (matched by label): prints each figure
    /// side by side with the ratio B/A, flags differences beyond `--threshold`, and exits 1 when
    /// a figure regressed beyond `--fail-above` (latency up, rate down).
    Compare(CompareArgs),
    /// The machine's floor on the chosen `--app-cores`: bare cache-line ping-pong RTT and a
    /// minimal SPSC streaming rate between two pinned threads, and the single-core memcpy
    /// bandwidth of `--size` copies (the bandwidth floor of shm); with `--fabric tcp` the raw
    /// busy-polled TCP ping-pong and `--size` send/recv stream, in loopback or across hosts
    /// (`--server` / `--client`).
    Floor(FloorArgs),
    /// The engine's software cost with both ends of a connection on one thread (one
    /// run-to-completion engine, no cross-core traffic): ns per message streamed in batches of
    /// `--batch`, received with `try_recv` in a loop and with the batch receive `poll`, and ns
    /// per round trip. Compare a round trip with `lat` minus the `floor`.
    Cost(crate::run::cost::CostArgs),
    /// What a connection costs: connect time, resident memory per connection on each side and
    /// committed shared memory, after an idle wait (listener here, connector in a child).
    Footprint(crate::run::footprint::FootprintArgs),
}

/// Which side(s) of the benchmark this process runs.
#[derive(Debug, Clone, Args)]
#[group(multiple = false)]
pub struct RoleArgs {
    /// Run only the server side: listen on ENDPOINT and echo / count what clients send, until
    /// Ctrl-C (or the first client leaves, with --once). The endpoint's scheme selects the
    /// fabric. Without a value: the fabric's default endpoint (shm://spinwire-bench,
    /// tcp://0.0.0.0:7471, rdma://0.0.0.0:7471).
    #[arg(long, value_name = "ENDPOINT", num_args = 0..=1, default_missing_value = "")]
    pub server: Option<String>,
    /// Run only the client side against a server at ENDPOINT (e.g. shm://spinwire-bench,
    /// tcp://198.18.0.1:7471 or rdma://10.0.0.1:7471); its scheme selects the fabric. A
    /// refused connection is retried until --connect-timeout.
    #[arg(long, value_name = "ENDPOINT")]
    pub client: Option<String>,
    /// Run both sides in this process (the default when neither --server nor --client is given).
    #[arg(long)]
    pub loopback: bool,
}

/// Fabric to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fabric {
    /// Shared memory between processes on one host.
    Shm,
    /// RDMA verbs (needs the `rdma` feature at build time).
    Rdma,
    /// Kernel TCP (busy-polled non-blocking sockets); loopback runs use `tcp://127.0.0.1:PORT`,
    /// and the floor is the raw busy-polled TCP ping-pong.
    Tcp,
    /// In-process (`mem://`): both ends in this process, driven by the real pollers with no
    /// fabric cost (loopback only).
    Mem,
}

impl Fabric {
    /// Lower-case name, as in endpoints and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Fabric::Shm => "shm",
            Fabric::Rdma => "rdma",
            Fabric::Tcp => "tcp",
            Fabric::Mem => "mem",
        }
    }
}

/// Threading mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Run to completion: no poller thread; each app thread drives its own engine.
    Rtc,
    /// One dedicated pinned poller thread per `--poller-cores` entry; app threads exchange
    /// descriptors with it through SPSC rings.
    Dedicated,
}

impl Mode {
    /// Lower-case name, as in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Rtc => "rtc",
            Mode::Dedicated => "dedicated",
        }
    }
}

/// Which of the engine's calls the application side of `lat` and `rate` points makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// The quick-start calls: `alloc`, `copy_from` (the bench fills the buffer in place) and
    /// `send`; `try_recv` (a `Message`); the echo copies the message into a new buffer.
    #[default]
    Buffer,
    /// `send_copy` (the bench fills a stack copy first; messages over 256 bytes take the
    /// buffer way) and `poll(handler, 1)`; the echo is a `send_copy` from inside the handler:
    /// the shape of Aeron's `cping`/`cpong` (offer a copy; poll with a fragment handler that
    /// offers the echo).
    PollCopy,
    /// `claim` (the bench writes the message in place: on shm, up to the inline threshold,
    /// straight into the ring record) and `send`; `try_recv` (a `Message`); the echo is
    /// claimed and copied from the message the same way.
    Claim,
}

impl Api {
    /// The name as on the command line, as in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Buffer => "buffer",
            Api::PollCopy => "poll-copy",
            Api::Claim => "claim",
        }
    }
}

/// What idle threads do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Idle {
    /// Busy-spin: lowest latency, one core per busy thread.
    Spin,
    /// Spin, then yield, then park briefly: kinder to shared machines, higher tail latency.
    Backoff,
    /// Spin 50 µs, then sleep in the kernel until an arrival wakes it (`IdleStrategy::block`):
    /// no CPU while idle; a message after a silence pays the kernel's wake-up latency.
    Block,
}

impl Idle {
    /// Lower-case name, as in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Idle::Spin => "spin",
            Idle::Backoff => "backoff",
            Idle::Block => "block",
        }
    }
}

/// Hugepages for the engines' pools and shm segments (`EngineBuilder::hugepages`; its
/// conversions are beside the engine glue, `run::engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Huge {
    /// 4 KiB pages only.
    Off,
    /// Regions of 2 MiB or more on hugepages while the kernel's pool has them (the default).
    Try,
    /// Every region on hugepages, or the engine/connection fails.
    Require,
}

/// Knobs shared by `lat`, `rate` and `sweep`.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub role: RoleArgs,

    /// Fabric to measure [default: the --server / --client endpoint's scheme, else shm]. Not
    /// needed with an endpoint (`tcp://...` selects tcp); `rdma` needs a build with
    /// `--features rdma`.
    #[arg(long, value_enum, help_heading = "Fabric")]
    pub fabric: Option<Fabric>,

    /// Measured iterations: round trips for lat, messages for rate (a sweep's rate points use
    /// --rate-iters). A point above --buffer-size is also bounded by bytes: at most 4 GiB per
    /// rate point and 1 GiB per lat or load point (at least 32 messages), and 256 MiB of
    /// warm-up (at least 8). [default: lat 100000, rate 1000000]
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "duration",
        help_heading = "Run length"
    )]
    pub iters: Option<u64>,
    /// Measure for a fixed time instead of a fixed count, e.g. `2s`, `500ms`, `1.5`.
    #[arg(long, value_name = "TIME", value_parser = parse_duration, help_heading = "Run length")]
    pub duration: Option<Duration>,
    /// Unmeasured iterations before measuring (warms caches, pages and branch predictors).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 10_000,
        help_heading = "Run length"
    )]
    pub warmup: u64,
    /// Fixed offered load in messages per second (0 = as fast as possible; k/m/g suffixes are
    /// decimal: 1m = 1000000). lat paces its closed loop and records with HdrHistogram's
    /// expected-interval correction; `load` measures open loop at this rate.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = parse_rate,
          help_heading = "Run length")]
    pub rate: u64,
    /// Test aid: the server's receiving side sleeps this many milliseconds, once per point,
    /// after `--stall-after` messages (a synthetic stall, to see how lat and load record it).
    #[arg(long, value_name = "MS", default_value_t = 0, hide = true)]
    pub stall_once_ms: u64,
    /// Test aid: messages (warm-up included) the server receives before `--stall-once-ms`.
    #[arg(long, value_name = "N", default_value_t = 1000, hide = true)]
    pub stall_after: u64,

    /// Threading mode. `rtc` (run to completion) needs one core per side; `dedicated` adds the poller cores.
    #[arg(long, value_enum, default_value_t = Mode::Rtc, help_heading = "Threads")]
    pub mode: Mode,
    /// Cores for dedicated poller threads, e.g. `2` or `2,3` [default: the first core not in
    /// --app-cores, else the last core].
    #[arg(
        long,
        value_name = "CORES",
        value_delimiter = ',',
        help_heading = "Threads"
    )]
    pub poller_cores: Vec<usize>,
    /// Cores for the app threads: client first, then server (loopback uses both; --server and
    /// --client use the first) [default: 0,1].
    #[arg(
        long,
        value_name = "CORES",
        value_delimiter = ',',
        help_heading = "Threads"
    )]
    pub app_cores: Vec<usize>,
    /// What idle threads do: `spin` (lowest latency), `backoff` (spin, yield, park) or `block`
    /// (spin 50 µs, then sleep in the kernel until an arrival wakes the thread).
    #[arg(long, value_enum, default_value_t = Idle::Spin, help_heading = "Threads")]
    pub idle: Idle,
    /// Loopback with ONE app thread (on the first --app-cores entry) owning both ends: the
    /// server's steps run between the client's. With --mode dedicated: one app thread plus the
    /// poller threads. lat and rate only.
    #[arg(long, help_heading = "Threads")]
    pub one_thread: bool,

    /// Before measuring, wait up to this long for a quiet machine: until other processes use
    /// at most --disturbed-above of a core on this run's cores (0: don't wait).
    #[arg(long, value_name = "SECONDS", default_value = "0", value_parser = parse_duration,
          help_heading = "Quiet machine")]
    pub quiet_wait: Duration,
    /// Rerun a disturbed point up to N times (the last run is reported, marked if still
    /// disturbed).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        help_heading = "Quiet machine"
    )]
    pub retry_disturbed: u32,
    /// A point is disturbed when other processes took more than this share of a core on the
    /// run's cores while it ran (`10%` or `0.1`); with --idle spin also when a spinning thread
    /// got less than 90 % of its core.
    #[arg(long, value_name = "PCT", default_value = "10%", value_parser = parse_fraction,
          help_heading = "Quiet machine")]
    pub disturbed_above: f64,

    /// Max work items posted per doorbell / drained per poller cycle (the engine's batch; the
    /// application's is --app-batch).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 128,
        help_heading = "Data path"
    )]
    pub batch: usize,
    /// Rate points: the application batch. The sender sends with `Connection::send_batched` and
    /// flushes once per N messages sent (shm: one publication per run), the receiver takes up to N messages per batch-receive call (`Connection::poll(handler, N)`).
    /// 0: one `send` and one `try_recv` per message, no flush until the end (the behaviour
    /// before this knob).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        help_heading = "Data path"
    )]
    pub app_batch: usize,
    /// Which engine calls the application makes (spinwire fabrics): `buffer`, the quick-start
    /// calls (`alloc`/`copy_from`/`send`, `try_recv`), `poll-copy` (`send_copy`, `poll`; the
    /// echo sent from inside the poll handler, as Aeron's ping-pong samples do), or `claim`
    /// (`claim`/`send`, `try_recv`). Both ends of a loopback run; across processes each side's
    /// own flag.
    #[arg(long, value_enum, default_value_t = Api::Buffer, help_heading = "Data path")]
    pub api: Api,
    /// Check every byte of every payload against the pattern the sender wrote (the server
    /// checks what it receives, the lat client its echoes). Without it the receiver checks each
    /// payload's length and tag, and a large one (above --buffer-size) also at a few words
    /// spread over it, so the bytes are read.
    #[arg(long, help_heading = "Data path")]
    pub verify: bool,
    /// Credits: max messages in flight per connection (the rate window); at most --buffers.
    /// 0 (the default): the engine's own, `min(128, --buffers)`, and on tcp the message window
    /// of its byte window (65536 at the defaults), and its byte window (1 MiB at the defaults,
    /// 2 MiB with 64-KiB buffers) bounds what the sender has in flight.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        help_heading = "Data path"
    )]
    pub depth: usize,
    /// Messages up to this many bytes are sent inline (copied into the descriptor).
    #[arg(long, value_name = "BYTES", default_value_t = 64, value_parser = parse_size,
          help_heading = "Data path")]
    pub inline_threshold: usize,
    /// RDMA selective signalling: request a completion every N sends.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 16,
        help_heading = "Data path"
    )]
    pub signal_every: usize,
    /// RDMA message coalescing: small messages of one send batch travel as the records of one
    /// frame (one SEND) of at most this many bytes [default: the buffer size]; 0 turns
    /// coalescing off (one SEND per message). Accepts k/m suffixes. Ignored by shm and tcp.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, help_heading = "Data path")]
    pub frame_size: Option<usize>,
    /// Hugepages for pools and shm segments: off, try (regions of 2 MiB or more while the
    /// kernel's pool has them) or require; the report's `placement:` line says what was got.
    #[arg(long, value_enum, default_value_t = Huge::Try, help_heading = "Data path")]
    pub hugepages: Huge,
    /// RDMA shared receive queue: one per poller with N receive buffers, each connection
    /// granted --rdma-srq-credits of them (0: each connection its own receive pool).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        help_heading = "Data path"
    )]
    pub rdma_srq: usize,
    /// With --rdma-srq: receive buffers each connection is granted [0: min(--buffers, 16)].
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        help_heading = "Data path"
    )]
    pub rdma_srq_credits: usize,
    /// Buffers per connection per direction.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 256,
        help_heading = "Data path"
    )]
    pub buffers: usize,
    /// Bytes per buffer: the eager limit (a larger message goes through a large slot, up to
    /// --max-size). Accepts k/m suffixes (4k = 4096).
    #[arg(long, value_name = "BYTES", default_value_t = 4096, value_parser = parse_size,
          help_heading = "Data path")]
    pub buffer_size: usize,
    /// The largest message a connection carries (the engine's `max_message_size`), set on both
    /// sides: a message above --buffer-size travels through a large slot of this size, written
    /// in place. Accepts k/m suffixes (16m). `sweep`: also the top of the powers-of-two sweep.
    /// [default: the engine's, 16m]
    #[arg(long, value_name = "BYTES", value_parser = parse_size, help_heading = "Data path")]
    pub max_size: Option<usize>,
    /// Large slots per connection per direction: large messages in flight at once (0 turns
    /// large messages off: the limit is then --buffer-size). [default: the engine's, 2]
    #[arg(long, value_name = "N", help_heading = "Data path")]
    pub large_buffers: Option<usize>,
    /// A message longer than this goes through a large slot, a shorter one through a pool
    /// buffer (eager). Accepts k/m suffixes. [default and maximum: --buffer-size]
    #[arg(long, value_name = "BYTES", value_parser = parse_size, help_heading = "Data path")]
    pub large_threshold: Option<usize>,

    /// Write reports here: *.hgrm, *.hlog, summary.json, summary.csv and *.svg plots.
    #[arg(long, value_name = "DIR", help_heading = "Output")]
    pub out: Option<PathBuf>,
    /// Interval-log period: one histogram per this much time, for jitter over time.
    #[arg(long, value_name = "TIME", default_value = "1s", value_parser = parse_duration,
          help_heading = "Output")]
    pub interval: Duration,
    /// Print latencies in `ns` or `us`.
    #[arg(long, value_enum, default_value_t = Unit::Us, help_heading = "Output")]
    pub unit: Unit,
    /// Server: exit after the first client disconnects.
    #[arg(long, help_heading = "Roles")]
    pub once: bool,
    /// Seconds to wait for connection setup (connect, accept, server reply).
    #[arg(long, value_name = "TIME", default_value = "5s", value_parser = parse_duration,
          help_heading = "Roles")]
    pub connect_timeout: Duration,
    /// The engine's liveness timeout: a peer silent this long fails its connection
    /// (`EngineBuilder::liveness_timeout`; at least 80ms, `0` turns liveness off). Raise it to
    /// run one side under a profiler or emulator that slows it tens of times (`valgrind`, TCG).
    /// [default: the engine's, 1s]
    #[arg(long, value_name = "TIME", value_parser = parse_duration, help_heading = "Roles")]
    pub liveness_timeout: Option<Duration>,
}

/// Latency unit for the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Unit {
    /// Nanoseconds.
    Ns,
    /// Microseconds.
    Us,
}

/// `bench lat`.
#[derive(Debug, Clone, Args)]
pub struct LatArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Message size in bytes (k/m suffixes accepted); at most --max-size (above --buffer-size
    /// it goes through a large slot).
    #[arg(long, value_name = "BYTES", default_value_t = 8, value_parser = parse_size,
          help_heading = "Run length")]
    pub size: usize,
    /// Also measure `floor` on the app cores first and print each figure's ratio to it.
    #[arg(long, help_heading = "Output")]
    pub floor: bool,
}

/// `bench rate`.
#[derive(Debug, Clone, Args)]
pub struct RateArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Message size in bytes (k/m suffixes accepted); at most --max-size (above --buffer-size
    /// it goes through a large slot).
    #[arg(long, value_name = "BYTES", default_value_t = 8, value_parser = parse_size,
          help_heading = "Run length")]
    pub size: usize,
    /// Measure `floor` on the app cores first and state its streaming rate and the ratio beside
    /// each figure (the default for `rate`; kept for scripts).
    #[arg(long, help_heading = "Output")]
    pub floor: bool,
    /// Skip the floor (no floor or ratio columns then).
    #[arg(long, conflicts_with = "floor", help_heading = "Output")]
    pub no_floor: bool,
}

/// How `load` measures latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LatencyKind {
    /// The receiver records arrival minus intended send time. Needs both ends on one host (one
    /// monotonic clock): loopback, or shm.
    OneWay,
    /// The server echoes; the client records echo arrival minus intended send time. Works
    /// across hosts.
    RoundTrip,
}

impl LatencyKind {
    /// Name, as in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            LatencyKind::OneWay => "one-way",
            LatencyKind::RoundTrip => "round-trip",
        }
    }
}

/// Open-loop knobs of `load` (and of a sweep's load points).
#[derive(Debug, Clone, Args)]
pub struct OpenLoopArgs {
    /// Messages sharing one intended send time: the client sends N back to back every
    /// N / --rate seconds.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        help_heading = "Open loop"
    )]
    pub burst: u64,
    /// `one-way` or `round-trip` [default: one-way in loopback and on shm, round-trip for an
    /// rdma client, whose server may be on another host with another clock].
    #[arg(long, value_enum, value_name = "KIND", help_heading = "Open loop")]
    pub latency: Option<LatencyKind>,
}

impl Default for OpenLoopArgs {
    fn default() -> Self {
        Self {
            burst: 1,
            latency: None,
        }
    }
}

/// `bench load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub open_loop: OpenLoopArgs,
    /// Measure the floor on the app cores first and print each latency's ratio to it: with
    /// `--idle block` the wake-up reference (`floor --wake` at this --rate and block's spin), else the
    /// cache-line (or, for tcp, raw tcp) ping-pong.
    #[arg(long, help_heading = "Output")]
    pub floor: bool,
    /// Message size in bytes (at least 24: tag, sequence number, intended send time).
    #[arg(long, value_name = "BYTES", default_value_t = 64, value_parser = parse_size,
          help_heading = "Run length")]
    pub size: usize,
}

/// `bench compare`.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// The baseline summary.json (or a directory holding one).
    pub a: PathBuf,
    /// The summary.json to compare against it.
    pub b: PathBuf,
    /// Flag (`!`) a figure whose ratio B/A differs from 1 by more than this, e.g. `5%` or `0.05`.
    #[arg(long, value_name = "PCT", default_value = "5%", value_parser = parse_fraction)]
    pub threshold: f64,
    /// Exit 1 when a figure regressed by more than this (latency higher, rate lower), e.g.
    /// `10%`; without it compare only reports.
    #[arg(long, value_name = "PCT", value_parser = parse_fraction)]
    pub fail_above: Option<f64>,
}

/// Which test(s) a sweep runs at each point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TestKind {
    /// Ping-pong latency.
    Lat,
    /// One-way message rate.
    Rate,
    /// Open-loop latency at a fixed offered load.
    Load,
}

impl TestKind {
    /// Lower-case name, as in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            TestKind::Lat => "lat",
            TestKind::Rate => "rate",
            TestKind::Load => "load",
        }
    }
}

/// The knob a sweep crosses with message size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CrossKnob {
    /// `--batch`.
    Batch,
    /// `--depth`.
    Depth,
    /// Number of dedicated pollers (implies `--mode dedicated`): the first N of --poller-cores.
    Pollers,
}

impl CrossKnob {
    /// Lower-case name, as in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            CrossKnob::Batch => "batch",
            CrossKnob::Depth => "depth",
            CrossKnob::Pollers => "pollers",
        }
    }
}

/// `bench sweep`.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub common: CommonArgs,
    /// Explicit message sizes, e.g. `8,64,512,4k,1m`, each at most --max-size [default: powers
    /// of two 1..=--max-size when --max-size is given, else 1..=--buffer-size].
    #[arg(long, value_name = "SIZES", value_delimiter = ',', value_parser = parse_size,
          help_heading = "Sweep")]
    pub sizes: Vec<usize>,
    /// Offered rates for open-loop `load` points, e.g. `100k,500k,1m` (adds `load` to
    /// --tests); writes latency-vs-load.svg (p50, p99, p99.9 against the offered rate).
    #[arg(long, value_name = "RATES", value_delimiter = ',', value_parser = parse_rate,
          help_heading = "Sweep")]
    pub rates: Vec<u64>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub open_loop: OpenLoopArgs,
    /// Tests to run at each point.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "lat,rate",
        help_heading = "Sweep"
    )]
    pub tests: Vec<TestKind>,
    /// Cross the sizes with this knob...
    #[arg(
        long,
        value_enum,
        value_name = "KNOB",
        requires = "values",
        help_heading = "Sweep"
    )]
    pub cross: Option<CrossKnob>,
    /// ...taking these values, e.g. `--cross batch --values 1,8,32`.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        requires = "cross",
        help_heading = "Sweep"
    )]
    pub values: Vec<usize>,
    /// Messages per rate point (--iters counts lat round trips in a sweep; a rate point needs
    /// more to last long enough) [default: 1000000].
    #[arg(
        long,
        value_name = "N",
        conflicts_with = "duration",
        help_heading = "Sweep"
    )]
    pub rate_iters: Option<u64>,
    /// Skip measuring the floor first (no ratio columns then).
    #[arg(long, help_heading = "Sweep")]
    pub no_floor: bool,
    /// No progress bar.
    #[arg(long, help_heading = "Output")]
    pub quiet: bool,
}

/// `bench floor`.
#[derive(Debug, Clone, Args)]
pub struct FloorArgs {
    /// The two cores to ping-pong between [default: 0,1]; with --server or --client, the
    /// first is this side's core.
    #[arg(long, value_name = "CORES", value_delimiter = ',')]
    pub app_cores: Vec<usize>,
    /// Measured round trips (and 16x as many streamed messages; `tcp`: `iters / 16`, at least
    /// 64, streamed chunks) [default: 1000000; with --wake: 3000].
    #[arg(long, value_name = "N")]
    pub iters: Option<u64>,
    /// Unmeasured round trips first.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub warmup: u64,
    /// `tcp`: the raw busy-polled TCP ping-pong and chunk streaming, both of `--size` bytes,
    /// instead of the cache-line one, in loopback or across hosts (`--server` / `--client`)
    /// [default: the --server / --client endpoint's scheme, else shm].
    #[arg(long, value_enum)]
    pub fabric: Option<Fabric>,
    /// The wake-up reference instead (the bare protocol of `--idle block`): a futex ping-pong at
    /// --wake-rate in which the server sleeps in the kernel between pings and each side spins
    /// --wake-spin before it sleeps, so each round trip pays one kernel wake-up.
    #[arg(long, conflicts_with_all = ["fabric", "server", "client"])]
    pub wake: bool,
    /// `--wake`: pings per second (k/m suffixes, decimal).
    #[arg(long, value_name = "N", default_value = "1k", value_parser = parse_rate)]
    pub wake_rate: u64,
    /// `--wake`: how long each side spins before it sleeps [default: `IdleStrategy::block()`'s
    /// spin, as `--idle block` uses].
    #[arg(long, value_name = "TIME", value_parser = parse_duration)]
    pub wake_spin: Option<Duration>,
    /// Bytes per copy of the single-core `memcpy` bandwidth (the bandwidth floor of shm for
    /// messages of this size; source and destination of this size, warm); `tcp`: also bytes per
    /// ping-pong message and per streamed chunk (one `send` / `recv` each, at most 8 MiB). k/m
    /// suffixes accepted.
    #[arg(long, value_name = "BYTES", default_value = "64k", value_parser = parse_size)]
    pub size: usize,
    /// `tcp` only: run only the server side, listening on ENDPOINT (`tcp://ADDR:PORT`, as every
    /// subcommand takes; a bare ADDR:PORT is accepted too) [default: tcp://0.0.0.0:7472], until
    /// Ctrl-C (or the first client's run is done, with --once); pinned to the first --app-cores.
    #[arg(long, value_name = "ENDPOINT", num_args = 0..=1, default_missing_value = "",
          conflicts_with = "client")]
    pub server: Option<String>,
    /// `tcp` only: run only the client side against a `floor --server` at ENDPOINT (e.g.
    /// tcp://198.18.0.1:7472), pinned to the first --app-cores; the server's core is reported.
    /// A refused connection is retried until --connect-timeout.
    #[arg(long, value_name = "ENDPOINT")]
    pub client: Option<String>,
    /// Server: exit after the first client's run (ping-pong and stream).
    #[arg(long)]
    pub once: bool,
    /// Client: how long to wait for the server (a refused connection is retried until then).
    #[arg(long, value_name = "TIME", default_value = "5s", value_parser = parse_duration)]
    pub connect_timeout: Duration,
    /// Write floor.hgrm, summary.json, summary.csv and latency-percentiles.svg here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print latencies in `ns` or `us` (the default of every subcommand).
    #[arg(long, value_enum, default_value_t = Unit::Us)]
    pub unit: Unit,
}
