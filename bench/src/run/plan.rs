//! Validating the flags into a [`Plan`]: roles, cores, engine settings per group, run lengths.

use std::path::PathBuf;
use std::time::Duration;

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
    /// The engine's `max_message_size`, bytes (`--max-size`, else the engine's default).
    pub max_message_size: usize,
    /// Large slots per connection per direction (`--large-buffers`, else the engine's default).
    pub large_buffers: usize,
    /// `--large-threshold` as given (`None`: the engine's default, the buffer size).
    pub large_threshold: Option<usize>,
    /// Connection setup timeout.
    pub connect_timeout: Duration,
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
        if c.fabric == Fabric::Rdma && !cfg!(feature = "rdma") {
            return Err(BenchError::FabricNotCompiled { fabric: "rdma" });
        }
        let role = match (&c.role.server, &c.role.client) {
            (Some(ep), None) => Role::Server(check_endpoint(ep, c.fabric)?),
            (None, Some(ep)) => Role::Client(check_endpoint(ep, c.fabric)?),
            _ => Role::Loopback,
        };
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
        if c.buffer_size < 64 {
            return Err(BenchError::invalid(
                "--buffer-size",
                format!("{} bytes is too small: at least 64 (bench's control messages need {CONTROL_MAX})", c.buffer_size),
            ));
        }
        for (flag, v) in [
            ("--buffers", c.buffers),
            ("--depth", c.depth),
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
        if sizes.is_empty() {
            return Err(BenchError::invalid("--sizes", "no sizes to measure"));
        }
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
        // One-way needs one clock at both ends: one host. shm always is; rdma may not be.
        let latency = open_loop.latency.unwrap_or(match (&role, c.fabric) {
            (Role::Client(_), Fabric::Rdma | Fabric::Tcp) => LatencyKind::RoundTrip,
            _ => LatencyKind::OneWay,
        });
        for &s in &sizes {
            if s == 0 {
                return Err(BenchError::invalid("--size", "must be at least 1 byte"));
            }
            // The connection's limit, as the engine computes it (EngineCfg::message_limit).
            let limit = if large_buffers > 0 && max_message_size > c.buffer_size {
                max_message_size
            } else {
                c.buffer_size
            };
            if s > limit {
                let why = if large_buffers == 0 {
                    format!(
                        "{s} bytes is larger than --buffer-size {} and --large-buffers is 0; raise --buffer-size or --large-buffers, or lower --size",
                        c.buffer_size
                    )
                } else {
                    format!(
                        "{s} bytes is larger than --max-size {limit}; raise --max-size or lower --size"
                    )
                };
                return Err(BenchError::invalid("--size", why));
            }
        }
        let app: Vec<usize> = if c.app_cores.is_empty() {
            default_app_cores()
        } else {
            c.app_cores.clone()
        };
        check_cores("--app-cores", &app)?;
        let app_cores = [app[0], *app.get(1).unwrap_or(&app[0])];
        check_cores("--poller-cores", &c.poller_cores)?;

        let mut mode = c.mode;
        if matches!(cross, Some((CrossKnob::Pollers, _))) {
            mode = Mode::Dedicated;
        }
        let pollers = if mode == Mode::Dedicated && c.poller_cores.is_empty() {
            let avail = available_cores();
            // Cores this process's app threads use: both in loopback, the first otherwise.
            let busy = if role == Role::Loopback {
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
                Some((CrossKnob::Pollers, ref vals)) => {
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
        } else {
            c.poller_cores.clone()
        };

        let base = EngineCfg {
            mode,
            pollers: if mode == Mode::Dedicated {
                pollers.clone()
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
            max_message_size,
            large_buffers,
            large_threshold: c.large_threshold,
            connect_timeout: c.connect_timeout,
            cross: None,
        };
        let groups = match cross {
            None => vec![base],
            Some((knob, values)) => {
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
                        CrossKnob::Depth if v == 0 || v > c.buffers => {
                            return Err(BenchError::invalid(
                                "--values",
                                format!("depth {v} outside 1..={} (--buffers)", c.buffers),
                            ))
                        }
                        CrossKnob::Depth => e.depth = v,
                        CrossKnob::Pollers if v == 0 || v > pollers.len() => {
                            return Err(BenchError::invalid(
                                "--values",
                                format!(
                                    "{v} pollers but only {} poller cores ({pollers:?}); pass more --poller-cores",
                                    pollers.len()
                                ),
                            ))
                        }
                        CrossKnob::Pollers => e.pollers = pollers[..v].to_vec(),
                    }
                    g.push(e);
                }
                g
            }
        };
        let threads = match role {
            Role::Loopback => 2,
            _ => 1,
        } + groups.iter().map(|g| g.pollers.len()).max().unwrap_or(0);
        let ncores = available_cores().len();
        if c.idle == Idle::Spin && threads > ncores && !matches!(role, Role::Server(_)) {
            eprintln!(
                "bench: warning: {threads} busy-polling threads on {ncores} cores: figures will suffer \
                 from oversubscription (use --mode inline, fewer --poller-cores, or --idle backoff)"
            );
        }
        if role == Role::Loopback && app_cores[0] == app_cores[1] && c.idle == Idle::Spin {
            eprintln!(
                "bench: warning: client and server share core {}: use two --app-cores",
                app_cores[0]
            );
        }
        let iters = c.iters.unwrap_or(match tests.as_slice() {
            [TestKind::Rate] => 1_000_000,
            _ => 100_000,
        });
        let rate_iters = match rate_iters {
            Some(0) => return Err(BenchError::invalid("--rate-iters", "must be at least 1")),
            Some(n) => n,
            None if tests.as_slice() == [TestKind::Rate] => iters,
            None => 1_000_000,
        };
        Ok(Self {
            role,
            fabric: c.fabric,
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
            floor: floor && app_cores[0] != app_cores[1],
            app_batch: c.app_batch,
            verify: c.verify,
            progress,
            out: c.out,
            unit: c.unit,
            once: c.once,
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

pub(super) fn default_app_cores() -> Vec<usize> {
    let avail = available_cores();
    vec![avail[0], avail[1 % avail.len()]]
}

/// Checks that `ep`'s scheme matches `fabric`.
pub(super) fn check_endpoint(ep: &str, fabric: Fabric) -> Result<String, BenchError> {
    let Some((scheme, rest)) = ep.split_once("://") else {
        return Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: "expected shm://NAME, tcp://HOST:PORT or rdma://HOST:PORT".into(),
        });
    };
    if rest.is_empty() {
        return Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: "nothing after the scheme".into(),
        });
    }
    match (scheme, fabric) {
        ("shm", Fabric::Shm) | ("rdma", Fabric::Rdma) | ("tcp", Fabric::Tcp) => Ok(ep.to_string()),
        ("shm" | "rdma" | "tcp", _) => Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: format!(
                "a {scheme} endpoint, but --fabric is {}; pass --fabric {scheme}",
                fabric.as_str()
            ),
        }),
        _ => Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: format!("unknown scheme `{scheme}` (expected shm, tcp or rdma)"),
        }),
    }
}
