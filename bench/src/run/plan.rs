//! Validating the flags into a [`Plan`]: roles, cores, engine settings per group, run lengths.

use std::path::PathBuf;
use std::time::Duration;

use super::endpoint::role_of;
use super::proto::{CONTROL_MAX, LOAD_MIN_SIZE};
use super::Role;
use crate::cli::{
    CommonArgs, CrossKnob, Fabric, Idle, LatencyKind, Mode, OpenLoopArgs, TestKind, Unit,
};
use crate::error::BenchError;
use crate::machine::{available_cores, check_cores};

/// Engine settings of one group of points (a sweep's crossed knob changes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineCfg {
    /// inline or dedicated.
    pub mode: Mode,
    /// Poller cores (dedicated).
    pub pollers: Vec<usize>,
    /// Idle strategy of pollers and app threads.
    pub idle: Idle,
    /// Bytes per buffer.
    pub buffer_size: usize,
    /// Buffers per connection per direction.
    pub buffers: usize,
    /// Credits.
    pub depth: usize,
    /// Batch.
    pub batch: usize,
    /// Inline threshold, bytes.
    pub inline_threshold: usize,
    /// Selective signalling period.
    pub signal_every: usize,
    /// RDMA frame size in bytes (`None`: the engine's default, the buffer size; 0: off).
    pub frame_size: Option<usize>,
    /// RDMA SRQ buffers per poller (0: off) and credits per connection (0: the default).
    pub rdma_srq: (usize, usize),
    /// The engine's `max_message_size`, bytes (`--max-size`, else the engine's default).
    pub max_message_size: usize,
    /// Large slots per connection per direction (`--large-buffers`, else the engine's default).
    pub large_buffers: usize,
    /// `--large-threshold` as given (`None`: the engine's default, the buffer size).
    pub large_threshold: Option<usize>,
    /// Connection setup timeout.
    pub connect_timeout: Duration,
    /// `--liveness-timeout` as given (`None`: the engine's default).
    pub liveness_timeout: Option<Duration>,
    /// `--hugepages`.
    pub hugepages: crate::cli::Huge,
    /// `--api`: the application's engine calls.
    pub api: crate::cli::Api,
    /// The crossed knob and its value for this group.
    pub cross: Option<(CrossKnob, usize)>,
}

impl EngineCfg {
    /// The largest message a connection of this engine carries, as the engine computes it:
    /// `max_message_size` when there are large slots (some, and a limit above the buffer
    /// size), else the buffer size.
    pub fn message_limit(&self) -> usize {
        if self.large_buffers > 0 && self.max_message_size > self.buffer_size {
            self.max_message_size
        } else {
            self.buffer_size
        }
    }

    /// The settings a `--client` sends its server (`SETTINGS`), which compares them.
    pub fn settings(&self) -> super::proto::Settings {
        let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        super::proto::Settings {
            depth: n(self.depth),
            batch: n(self.batch),
            inline_threshold: n(self.inline_threshold),
            buffers: n(self.buffers),
        }
    }

    /// The large threshold in effect: a longer message goes through a large slot.
    pub fn effective_large_threshold(&self) -> usize {
        self.large_threshold
            .unwrap_or(self.buffer_size)
            .min(self.buffer_size)
    }
}

/// A large point (a size above the buffer size) sends at most this many payload bytes per rate
/// point (and at least [`LARGE_MIN_MSGS`] messages), so a sweep to 16 MiB ends in reasonable
/// time: 256 messages of 16 MiB.
pub const LARGE_RATE_BYTES: u64 = 4 << 30;
/// ... and per lat or load point (round trips of `size` bytes each way).
pub const LARGE_LAT_BYTES: u64 = 1 << 30;
/// ... and in its warm-up.
pub const LARGE_WARMUP_BYTES: u64 = 256 << 20;
/// Fewest measured messages of a large point.
pub const LARGE_MIN_MSGS: u64 = 32;

/// A validated run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Role of this process.
    pub role: Role,
    /// Fabric.
    pub fabric: Fabric,
    /// App cores: client, server.
    pub app_cores: [usize; 2],
    /// Engine settings per group (one group unless a sweep crosses a knob).
    pub groups: Vec<EngineCfg>,
    /// Tests per point.
    pub tests: Vec<TestKind>,
    /// Sizes per group.
    pub sizes: Vec<usize>,
    /// Measured iterations per lat point.
    pub iters: u64,
    /// Measured messages per rate point.
    pub rate_iters: u64,
    /// Or a fixed duration per point.
    pub duration: Option<Duration>,
    /// Warm-up iterations per point.
    pub warmup: u64,
    /// Offered load (0: unlimited) of lat and rate points.
    pub rate: u64,
    /// Offered loads of the load points (at least one when `tests` has load).
    pub load_rates: Vec<u64>,
    /// Load: messages sharing one intended send time.
    pub burst: u64,
    /// Load: who records the latency.
    pub latency: LatencyKind,
    /// Test aid: the server stalls once for this long (zero: never)...
    pub stall: Duration,
    /// ...after receiving this many messages of a point.
    pub stall_after: u64,
    /// Interval-log period.
    pub interval: Duration,
    /// Measure the floor first.
    pub floor: bool,
    /// The two cores the floor runs between (this process's: the client's app core first).
    pub floor_cores: [usize; 2],
    /// Why the floor asked for is not measured, or what it measures (for the report).
    pub floor_note: Option<String>,
    /// Rate points' application batch (`--app-batch`; 0: per message).
    pub app_batch: usize,
    /// `--verify`: check every payload byte.
    pub verify: bool,
    /// Show a progress bar.
    pub progress: bool,
    /// Report directory.
    pub out: Option<PathBuf>,
    /// Console unit.
    pub unit: Unit,
    /// Server: exit after one client.
    pub once: bool,
    /// `--one-thread`: one app thread drives both ends of the loopback connection.
    pub one_thread: bool,
    /// Wait up to this long for a quiet machine before measuring (zero: don't).
    pub quiet_wait: Duration,
    /// Rerun a disturbed point up to this many times.
    pub retry_disturbed: u32,
    /// Other processes' CPU on the run's cores (in cores) beyond which a point is disturbed.
    pub disturbed_above: f64,
    /// Longest wait without progress inside a point.
    pub stall_timeout: Duration,
}

impl Plan {
    /// Validates the flags of `lat`, `rate`, `load` or `sweep` into a plan. `load_rates` are
    /// the offered rates of load points (`sweep --rates`; empty: `--rate`).
    ///
    /// # Errors
    /// [`BenchError::InvalidArg`], [`BenchError::UnknownCore`], [`BenchError::BadEndpoint`] or
    /// [`BenchError::FabricNotCompiled`] naming what is wrong.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        c: CommonArgs,
        open_loop: OpenLoopArgs,
        load_rates: Vec<u64>,
        tests: Vec<TestKind>,
        sizes: Vec<usize>,
        cross: Option<(CrossKnob, Vec<usize>)>,
        rate_iters: Option<u64>,
        floor: bool,
        progress: bool,
    ) -> Result<Self, BenchError> {
        let (role, fabric) = role_of(&c)?;
        check_loopback_flags(&c, fabric, &role, &tests)?;
        check_run_flags(&c)?;
        check_buffer_flags(&c)?;
        if sizes.is_empty() {
            return Err(BenchError::invalid("--sizes", "no sizes to measure"));
        }
        let limits = MessageLimits::of(&c)?;
        let load_rates = resolve_load_rates(&c, &open_loop, load_rates, &tests, &sizes)?;
        // One-way needs one clock at both ends: one host. shm always is; rdma may not be.
        let latency = open_loop.latency.unwrap_or(match (&role, fabric) {
            (Role::Client(_), Fabric::Rdma | Fabric::Tcp) => LatencyKind::RoundTrip,
            _ => LatencyKind::OneWay,
        });
        check_sizes(&sizes, c.buffer_size, limits)?;
        let app_cores = resolve_app_cores(&c)?;
        check_cores("--poller-cores", &c.poller_cores)?;

        let mut mode = c.mode;
        if matches!(cross, Some((CrossKnob::Pollers, _))) {
            mode = Mode::Dedicated;
        }
        let pollers = resolve_pollers(&c, mode, &role, app_cores, cross.as_ref());
        let base = base_engine_cfg(&c, mode, &pollers, limits);
        let groups = cross_groups(base, cross, c.buffers, &pollers)?;
        warn_oversubscription(&c, &role, &groups, app_cores);
        let (iters, rate_iters) = run_iters(&c, &tests, rate_iters)?;
        let floor_cores = resolve_floor_cores(&c, &role, app_cores, &pollers);
        let is_client = matches!(role, Role::Client(_));
        Ok(Self {
            role,
            fabric,
            app_cores,
            groups,
            tests,
            sizes,
            iters,
            rate_iters,
            duration: c.duration,
            warmup: c.warmup,
            rate: c.rate,
            load_rates,
            burst: open_loop.burst,
            latency,
            stall: Duration::from_millis(c.stall_once_ms),
            stall_after: c.stall_after,
            interval: c.interval,
            floor: floor && floor_cores.is_ok(),
            floor_note: match &floor_cores {
                Err(why) if floor => Some(why.clone()),
                Ok(_) if floor && fabric == Fabric::Tcp && is_client => {
                    Some("the floor is this host's loopback tcp; for the floor across hosts run `bench floor --server` there and `bench floor --client tcp://HOST:7472` here".into())
                }
                _ => None,
            },
            floor_cores: floor_cores.unwrap_or(app_cores),
            app_batch: c.app_batch,
            verify: c.verify,
            progress,
            out: c.out,
            unit: c.unit,
            once: c.once,
            one_thread: c.one_thread,
            quiet_wait: c.quiet_wait,
            retry_disturbed: c.retry_disturbed,
            disturbed_above: c.disturbed_above,
            stall_timeout: c.connect_timeout.max(Duration::from_secs(10)),
        })
    }

    /// Measured iterations and warm-up of a `test` point of `size` bytes in group `g`: the
    /// plan's, except that a large point (above the buffer size) is bounded by bytes
    /// ([`LARGE_RATE_BYTES`], [`LARGE_LAT_BYTES`], [`LARGE_WARMUP_BYTES`]).
    pub(super) fn point_iters(&self, g: &EngineCfg, test: TestKind, size: usize) -> (u64, u64) {
        let iters = match test {
            TestKind::Lat | TestKind::Load => self.iters,
            TestKind::Rate => self.rate_iters,
        };
        if size <= g.buffer_size {
            return (iters, self.warmup);
        }
        let size = size as u64;
        let budget = match test {
            TestKind::Rate => LARGE_RATE_BYTES,
            TestKind::Lat | TestKind::Load => LARGE_LAT_BYTES,
        };
        let iters = iters.min((budget / size).max(LARGE_MIN_MSGS));
        let warmup = self.warmup.min((LARGE_WARMUP_BYTES / size).max(8));
        (iters, warmup)
    }

    /// Points per group: every size crossed with every test (load: with every offered rate),
    /// as (test, size, offered rate).
    pub(super) fn points(&self) -> Vec<(TestKind, usize, u64)> {
        let mut out = Vec::new();
        for &s in &self.sizes {
            for &t in &self.tests {
                match t {
                    TestKind::Load => out.extend(self.load_rates.iter().map(|&r| (t, s, r))),
                    _ => out.push((t, s, self.rate)),
                }
            }
        }
        out
    }
}

/// Checks the flags that need both ends in this process: `--fabric mem` (in-process, so
/// loopback only) and `--one-thread` (loopback, lat and rate points only).
fn check_loopback_flags(
    c: &CommonArgs,
    fabric: Fabric,
    role: &Role,
    tests: &[TestKind],
) -> Result<(), BenchError> {
    if fabric == Fabric::Mem && *role != Role::Loopback {
        return Err(BenchError::invalid(
            if c.role.server.is_some() {
                "--server"
            } else {
                "--client"
            },
            "mem:// is in-process: --fabric mem runs loopback only (both sides in this process)",
        ));
    }
    if c.one_thread && *role != Role::Loopback {
        return Err(BenchError::invalid(
            "--one-thread",
            "is a loopback mode (both ends in this process)",
        ));
    }
    if c.one_thread && tests.contains(&TestKind::Load) {
        return Err(BenchError::invalid(
            "--one-thread",
            "runs lat and rate points only (load needs a server thread of its own)",
        ));
    }
    Ok(())
}

/// Checks the run-length flags: `--app-batch`, `--iters`, `--duration`, `--interval`.
fn check_run_flags(c: &CommonArgs) -> Result<(), BenchError> {
    if u32::try_from(c.app_batch).is_err() {
        return Err(BenchError::invalid("--app-batch", "must fit 32 bits"));
    }
    if c.iters == Some(0) {
        return Err(BenchError::invalid("--iters", "must be at least 1"));
    }
    if c.duration.is_some_and(|d| d.is_zero()) {
        return Err(BenchError::invalid(
            "--duration",
            "must be longer than zero",
        ));
    }
    if c.interval.is_zero() {
        return Err(BenchError::invalid(
            "--interval",
            "must be longer than zero",
        ));
    }
    Ok(())
}

/// Checks the buffer and credit flags: `--buffer-size`, `--buffers`, `--depth`, `--batch`,
/// `--signal-every`.
fn check_buffer_flags(c: &CommonArgs) -> Result<(), BenchError> {
    if c.buffer_size < 64 {
        return Err(BenchError::invalid(
            "--buffer-size",
            format!(
                "{} bytes is too small: at least 64 (bench's control messages need {CONTROL_MAX})",
                c.buffer_size
            ),
        ));
    }
    for (flag, v) in [
        ("--buffers", c.buffers),
        ("--batch", c.batch),
        ("--signal-every", c.signal_every),
    ] {
        if v == 0 {
            return Err(BenchError::invalid(flag, "must be at least 1"));
        }
    }
    if c.depth > c.buffers {
        return Err(BenchError::invalid(
            "--depth",
            format!(
                "{} is more than --buffers {}: credits cannot exceed receive buffers",
                c.depth, c.buffers
            ),
        ));
    }
    Ok(())
}

/// The large-message settings: `--max-size` and `--large-buffers` (else the engine's
/// defaults), checked against the engine's limits.
#[derive(Debug, Clone, Copy)]
struct MessageLimits {
    /// The engine's `max_message_size`, bytes.
    max_message_size: usize,
    /// Large slots per connection per direction.
    large_buffers: usize,
}

impl MessageLimits {
    /// Reads and checks `--max-size`, `--large-buffers` and `--large-threshold`.
    fn of(c: &CommonArgs) -> Result<Self, BenchError> {
        let max_message_size = c.max_size.unwrap_or(spinwire::DEFAULT_MAX_MESSAGE_SIZE);
        if max_message_size == 0 || max_message_size > spinwire::MAX_MESSAGE_SIZE {
            return Err(BenchError::invalid(
                "--max-size",
                format!(
                    "{max_message_size} bytes outside 1..={} (the engine's MAX_MESSAGE_SIZE)",
                    spinwire::MAX_MESSAGE_SIZE
                ),
            ));
        }
        let large_buffers = c.large_buffers.unwrap_or(spinwire::DEFAULT_LARGE_BUFFERS);
        if large_buffers > spinwire::MAX_LARGE_BUFFERS {
            return Err(BenchError::invalid(
                "--large-buffers",
                format!(
                    "{large_buffers} is more than {} (the engine's MAX_LARGE_BUFFERS)",
                    spinwire::MAX_LARGE_BUFFERS
                ),
            ));
        }
        if let Some(t) = c.large_threshold.filter(|&t| t > c.buffer_size) {
            return Err(BenchError::invalid(
                "--large-threshold",
                format!(
                    "{t} bytes is more than --buffer-size {} (a message above the buffer size always goes through a large slot)",
                    c.buffer_size
                ),
            ));
        }
        Ok(Self {
            max_message_size,
            large_buffers,
        })
    }
}

/// The offered rates of the load points (`load_rates`, else `--rate` when above 0), checked
/// when `tests` has load, together with `--burst` and the sizes.
fn resolve_load_rates(
    c: &CommonArgs,
    open_loop: &OpenLoopArgs,
    load_rates: Vec<u64>,
    tests: &[TestKind],
    sizes: &[usize],
) -> Result<Vec<u64>, BenchError> {
    let load_rates = if load_rates.is_empty() && c.rate > 0 {
        vec![c.rate]
    } else {
        load_rates
    };
    if tests.contains(&TestKind::Load) {
        if load_rates.is_empty() {
            return Err(BenchError::invalid(
                "--rate",
                "load needs an offered rate: --rate N (or sweep --rates A,B,...)",
            ));
        }
        if load_rates.contains(&0) {
            return Err(BenchError::invalid(
                "--rates",
                "offered rates must be above 0",
            ));
        }
        if open_loop.burst == 0 {
            return Err(BenchError::invalid("--burst", "must be at least 1"));
        }
        if let Some(&s) = sizes.iter().find(|&&s| s < LOAD_MIN_SIZE) {
            return Err(BenchError::invalid(
                "--size",
                format!(
                    "{s} bytes is too small for load: a message carries its sequence number and intended send time (at least {LOAD_MIN_SIZE} bytes)"
                ),
            ));
        }
    }
    Ok(load_rates)
}

/// Checks that every size is at least 1 byte and fits the connection's limit.
fn check_sizes(
    sizes: &[usize],
    buffer_size: usize,
    limits: MessageLimits,
) -> Result<(), BenchError> {
    let MessageLimits {
        max_message_size,
        large_buffers,
    } = limits;
    for &s in sizes {
        if s == 0 {
            return Err(BenchError::invalid("--size", "must be at least 1 byte"));
        }
        // The connection's limit, as the engine computes it (EngineCfg::message_limit).
        let limit = if large_buffers > 0 && max_message_size > buffer_size {
            max_message_size
        } else {
            buffer_size
        };
        if s > limit {
            let why = if large_buffers == 0 {
                format!(
                    "{s} bytes is larger than --buffer-size {buffer_size} and --large-buffers is 0; raise --buffer-size or --large-buffers, or lower --size"
                )
            } else {
                format!(
                    "{s} bytes is larger than --max-size {limit}; raise --max-size or lower --size"
                )
            };
            return Err(BenchError::invalid("--size", why));
        }
    }
    Ok(())
}

/// The client's and the server's app core: `--app-cores` (one given: both on it), else the
/// first two available cores.
fn resolve_app_cores(c: &CommonArgs) -> Result<[usize; 2], BenchError> {
    let app: Vec<usize> = if c.app_cores.is_empty() {
        default_app_cores()
    } else {
        c.app_cores.clone()
    };
    check_cores("--app-cores", &app)?;
    Ok([app[0], *app.get(1).unwrap_or(&app[0])])
}

/// The two cores the floor runs between: the app cores in loopback (with `--one-thread` and
/// dedicated pollers, the app core and the first poller's: the cores a round trip crosses);
/// with `--client` (one app thread here) the client's core and the second `--app-cores` entry,
/// else the first other core this process may use. `Err` says why there are not two.
fn resolve_floor_cores(
    c: &CommonArgs,
    role: &Role,
    app_cores: [usize; 2],
    pollers: &[usize],
) -> Result<[usize; 2], String> {
    if *role == Role::Loopback && c.one_thread && app_cores[0] == app_cores[1] {
        if let Some(&p) = pollers.first().filter(|&&p| p != app_cores[0]) {
            return Ok([app_cores[0], p]);
        }
    }
    if *role == Role::Loopback || app_cores[0] != app_cores[1] {
        if app_cores[0] == app_cores[1] {
            return Err(format!(
                "floor not measured: client and server share core {} (give two --app-cores)",
                app_cores[0]
            ));
        }
        return Ok(app_cores);
    }
    let other = c
        .app_cores
        .get(1)
        .copied()
        .filter(|&o| o != app_cores[0])
        .or_else(|| available_cores().into_iter().find(|&o| o != app_cores[0]));
    match other {
        Some(o) => Ok([app_cores[0], o]),
        None => Err(format!(
            "floor not measured: this process may run only on core {}, and the floor needs two",
            app_cores[0]
        )),
    }
}

/// The poller cores: `--poller-cores`, else in dedicated mode cores this process's app threads
/// leave free (as many as a `pollers` cross needs, taking busy cores last; else one).
fn resolve_pollers(
    c: &CommonArgs,
    mode: Mode,
    role: &Role,
    app_cores: [usize; 2],
    cross: Option<&(CrossKnob, Vec<usize>)>,
) -> Vec<usize> {
    if mode != Mode::Dedicated || !c.poller_cores.is_empty() {
        return c.poller_cores.clone();
    }
    let avail = available_cores();
    // Cores this process's app threads use: both in loopback (one with --one-thread), the
    // first otherwise.
    let busy = if *role == Role::Loopback && !c.one_thread {
        &app_cores[..]
    } else {
        &app_cores[..1]
    };
    let free: Vec<usize> = avail
        .iter()
        .copied()
        .filter(|x| !busy.contains(x))
        .collect();
    match cross {
        Some((CrossKnob::Pollers, vals)) => {
            let want = vals.iter().copied().max().unwrap_or(1);
            let mut v = free.clone();
            let rest: Vec<usize> = avail
                .iter()
                .rev()
                .copied()
                .filter(|x| !free.contains(x))
                .collect();
            v.extend(rest);
            v.truncate(want);
            v
        }
        _ => vec![*free.first().unwrap_or(avail.last().unwrap_or(&0))],
    }
}

/// The engine settings the flags give, before any crossed knob.
fn base_engine_cfg(
    c: &CommonArgs,
    mode: Mode,
    pollers: &[usize],
    limits: MessageLimits,
) -> EngineCfg {
    EngineCfg {
        mode,
        pollers: if mode == Mode::Dedicated {
            pollers.to_vec()
        } else {
            Vec::new()
        },
        idle: c.idle,
        buffer_size: c.buffer_size,
        buffers: c.buffers,
        depth: c.depth,
        batch: c.batch,
        inline_threshold: c.inline_threshold,
        signal_every: c.signal_every,
        frame_size: c.frame_size,
        rdma_srq: (c.rdma_srq, c.rdma_srq_credits),
        max_message_size: limits.max_message_size,
        large_buffers: limits.large_buffers,
        large_threshold: c.large_threshold,
        connect_timeout: c.connect_timeout,
        liveness_timeout: c.liveness_timeout,
        hugepages: c.hugepages,
        api: c.api,
        cross: None,
    }
}

/// One group per value of the crossed knob (`base` alone when the sweep crosses nothing),
/// each value checked: batch at least 1, depth within `1..=buffers`, pollers within the
/// poller cores.
fn cross_groups(
    base: EngineCfg,
    cross: Option<(CrossKnob, Vec<usize>)>,
    buffers: usize,
    pollers: &[usize],
) -> Result<Vec<EngineCfg>, BenchError> {
    let Some((knob, values)) = cross else {
        return Ok(vec![base]);
    };
    if values.is_empty() {
        return Err(BenchError::invalid("--values", "give at least one value"));
    }
    let mut g = Vec::new();
    for v in values {
        let mut e = base.clone();
        e.cross = Some((knob, v));
        match knob {
            CrossKnob::Batch if v == 0 => {
                return Err(BenchError::invalid("--values", "batch must be at least 1"))
            }
            CrossKnob::Batch => e.batch = v,
            CrossKnob::Depth if v == 0 || v > buffers => {
                return Err(BenchError::invalid(
                    "--values",
                    format!("depth {v} outside 1..={buffers} (--buffers)"),
                ))
            }
            CrossKnob::Depth => e.depth = v,
            CrossKnob::Pollers if v == 0 || v > pollers.len() => {
                let n = pollers.len();
                return Err(BenchError::invalid(
                    "--values",
                    format!("{v} pollers but only {n} poller cores ({pollers:?}); pass more --poller-cores"),
                ));
            }
            CrossKnob::Pollers => e.pollers = pollers[..v].to_vec(),
        }
        g.push(e);
    }
    Ok(g)
}

/// Warns on stderr when spinning threads outnumber the cores, or when the client and server
/// spin on one core.
fn warn_oversubscription(c: &CommonArgs, role: &Role, groups: &[EngineCfg], app_cores: [usize; 2]) {
    let threads = match role {
        Role::Loopback if !c.one_thread => 2,
        _ => 1,
    } + groups.iter().map(|g| g.pollers.len()).max().unwrap_or(0);
    let ncores = available_cores().len();
    if c.idle == Idle::Spin && threads > ncores && !matches!(role, Role::Server(_)) {
        eprintln!(
            "bench: warning: {threads} busy-polling threads on {ncores} cores: figures will suffer \
             from oversubscription (use --mode rtc, fewer --poller-cores, or --idle backoff)"
        );
    }
    if *role == Role::Loopback
        && !c.one_thread
        && app_cores[0] == app_cores[1]
        && c.idle == Idle::Spin
    {
        eprintln!(
            "bench: warning: client and server share core {}: use two --app-cores",
            app_cores[0]
        );
    }
}

/// Measured iterations per lat point (`--iters`, else 1 000 000 for a rate-only run and
/// 100 000 otherwise) and per rate point (`--rate-iters`, else the lat figure for a rate-only
/// run and 1 000 000 otherwise).
fn run_iters(
    c: &CommonArgs,
    tests: &[TestKind],
    rate_iters: Option<u64>,
) -> Result<(u64, u64), BenchError> {
    let iters = c.iters.unwrap_or(match tests {
        [TestKind::Rate] => 1_000_000,
        _ => 100_000,
    });
    let rate_iters = match rate_iters {
        Some(0) => return Err(BenchError::invalid("--rate-iters", "must be at least 1")),
        Some(n) => n,
        None if tests == [TestKind::Rate] => iters,
        None => 1_000_000,
    };
    Ok((iters, rate_iters))
}

pub(super) fn default_app_cores() -> Vec<usize> {
    let avail = available_cores();
    vec![avail[0], avail[1 % avail.len()]]
}
