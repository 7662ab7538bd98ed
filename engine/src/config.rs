//! Engine configuration: [`EngineBuilder`] and the validated [`Config`] it produces.
//!
//! [`EngineBuilder::build`] lives beside [`Engine`](crate::Engine)(crate::Engine) (it starts the engine), so
//! this module stays below the engine.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{ConfigError, Error};
use crate::idle::IdleStrategy;
use crate::placement::{HugePages, NumaPolicy, Placer};

/// Largest buffer size: descriptors carry lengths as `u32`.
pub const MAX_BUFFER_SIZE: usize = 1 << 30;
/// Largest number of buffers per connection per direction.
pub const MAX_BUFFERS: usize = 1 << 16;
/// Largest [`EngineBuilder::max_message_size`]: lengths travel as `u32`, and a large slot
/// must stay addressable with room to spare.
pub const MAX_MESSAGE_SIZE: usize = 1 << 30;
/// Largest [`EngineBuilder::large_buffers`] (so `LARGE_BIT | slot` never meets the inline
/// marker).
pub const MAX_LARGE_BUFFERS: usize = 1 << 12;

// `LARGE_BIT | slot` (slot below the cap) never equals a receive descriptor's markers.
const _: () = assert!(
    crate::desc::LARGE_BIT as u64 + MAX_LARGE_BUFFERS as u64 <= crate::desc::BUF_PACKED as u64
);

/// Largest send batch (items drained from a send ring and posted per doorbell).
pub const MAX_BATCH: usize = 256;

/// A validated engine configuration (see [`EngineBuilder`] for each knob).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) pollers: Vec<usize>,
    pub(crate) idle: IdleStrategy,
    pub(crate) buffer_size: usize,
    pub(crate) buffers: usize,
    pub(crate) depth: usize,
    pub(crate) batch: usize,
    pub(crate) inline_threshold: usize,
    /// The largest message, with large slots; see [`Config::large_enabled`].
    pub(crate) max_message_size: usize,
    /// Large slots per connection per direction.
    pub(crate) large_buffers: usize,
    /// `send_copy` uses a large slot above this many bytes (`<= buffer_size`).
    pub(crate) large_threshold: Option<usize>,
    pub(crate) signal_every: usize,
    pub(crate) rdma_srq_buffers: usize,
    /// Credits (receive buffers) each connection is granted on its poller's SRQ; 0: the
    /// default, `min(buffers, DEFAULT_RDMA_SRQ_CREDITS)`.
    pub(crate) rdma_srq_credits: usize,
    /// RDMA source GID index override (builder, else env [`RDMA_GID_INDEX_ENV`]).
    pub(crate) rdma_gid_index: Option<u8>,
    /// RDMA frame limit in bytes; `None`: the buffer size.
    pub(crate) frame_size: Option<usize>,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_connections_per_poller: usize,
    pub(crate) max_connections_per_listener: usize,
    /// How long a peer may stay silent before its connection fails; zero: never.
    pub(crate) liveness_timeout: Duration,
    pub(crate) name: String,
    /// Publish the counters into a counters file ([`crate::counters`]).
    pub(crate) counters_file: bool,
    /// `depth` was set explicitly (else it follows `min(128, buffers)`).
    pub(crate) depth_set: bool,
    pub(crate) hugepages: HugePages,
    pub(crate) numa: NumaPolicy,
    /// The placement resolved from `hugepages` and `numa` by [`EngineBuilder::validate`]; every
    /// pool, segment and region of the engine is placed through it.
    pub(crate) placer: Arc<Placer>,
}

impl Config {
    /// Whether this engine's threads may sleep when idle ([`IdleStrategy::Block`]): its
    /// doorbells are armed, so its peers ring them.
    pub(crate) fn may_sleep(&self) -> bool {
        matches!(self.idle, IdleStrategy::Block { .. })
    }

    /// True when no dedicated poller threads run (the application drives the poller).
    pub(crate) fn run_to_completion(&self) -> bool {
        self.pollers.is_empty()
    }

    /// The RDMA frame limit: [`EngineBuilder::frame_size`], by default the buffer size.
    #[allow(dead_code)] // used by the rdma fabric only
    pub(crate) fn frame_size(&self) -> usize {
        self.frame_size.unwrap_or(self.buffer_size)
    }

    /// True when connections get large pools: some large slots and a limit above the buffer
    /// size.
    pub(crate) fn large_enabled(&self) -> bool {
        self.large_buffers > 0 && self.max_message_size > self.buffer_size
    }

    /// The large pool of one direction of a connection: `(slot size, slots)`, `(0, 0)` when
    /// large messages are off. Every fabric sizes its large pools with this.
    #[allow(dead_code)] // not every fabric has large pools in every build
    pub(crate) fn large_pool(&self) -> (usize, u32) {
        if self.large_enabled() {
            (self.max_message_size, self.large_buffers as u32)
        } else {
            (0, 0)
        }
    }

    /// The largest message a connection carries: [`EngineBuilder::max_message_size`] with large
    /// slots, else the buffer size.
    pub(crate) fn message_limit(&self) -> usize {
        if self.large_enabled() {
            self.max_message_size
        } else {
            self.buffer_size
        }
    }

    /// Above this many bytes [`Connection::send_copy`](crate::Connection::send_copy) uses a
    /// large slot: [`EngineBuilder::large_threshold`], by default the buffer size.
    pub(crate) fn large_threshold(&self) -> usize {
        self.large_threshold
            .unwrap_or(self.buffer_size)
            .min(self.buffer_size)
    }

    /// The liveness timeout, `None` when liveness is off.
    pub(crate) fn liveness(&self) -> Option<Duration> {
        (!self.liveness_timeout.is_zero()).then_some(self.liveness_timeout)
    }
}

/// The environment variable that sets [`EngineBuilder::rdma_gid_index`] when the builder does
/// not.
pub const RDMA_GID_INDEX_ENV: &str = "SPINWIRE_RDMA_GID_INDEX";

/// Parses a value of [`RDMA_GID_INDEX_ENV`] (surrounding whitespace allowed).
fn parse_gid_index_env(value: &str) -> Result<u8, ConfigError> {
    value
        .trim()
        .parse::<u8>()
        .map_err(|source| ConfigError::RdmaGidIndexEnv {
            value: value.to_owned(),
            source,
        })
}

/// The GID index from [`RDMA_GID_INDEX_ENV`], if set (an empty value counts as unset).
fn gid_index_from_env(value: Option<std::ffi::OsString>) -> Result<Option<u8>, ConfigError> {
    let Some(value) = value else {
        return Ok(None);
    };
    let value = value.to_string_lossy();
    if value.trim().is_empty() {
        return Ok(None);
    }
    parse_gid_index_env(&value).map(Some)
}

/// Default buffer size of [`EngineBuilder::pool`], in bytes.
pub const DEFAULT_BUFFER_SIZE: usize = 4096;
/// Default buffer count of [`EngineBuilder::pool`] (per connection and direction).
pub const DEFAULT_BUFFERS: usize = 256;
/// Default of [`EngineBuilder::max_message_size`]: 16 MiB.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 16 << 20;
/// Default of [`EngineBuilder::large_buffers`] (per connection and direction).
pub const DEFAULT_LARGE_BUFFERS: usize = 2;
/// Default of [`EngineBuilder::batch`].
pub const DEFAULT_BATCH: usize = 128;
/// Default of [`EngineBuilder::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of [`EngineBuilder::max_connections_per_poller`].
pub const DEFAULT_MAX_CONNECTIONS_PER_POLLER: usize = 1024;
/// Default of [`EngineBuilder::max_connections_per_listener`].
pub const DEFAULT_MAX_CONNECTIONS_PER_LISTENER: usize = 1024;
/// Default of [`EngineBuilder::liveness_timeout`].
pub const DEFAULT_LIVENESS_TIMEOUT: Duration = Duration::from_secs(1);
/// Shortest non-zero [`EngineBuilder::liveness_timeout`]: the control thread's liveness beat is a
/// twelfth of the timeout (under 7 ms here), and the heartbeat interval a quarter.
pub const MIN_LIVENESS_TIMEOUT: Duration = Duration::from_millis(80);

/// Builds an [`Engine`](crate::Engine). Start with [`Engine::builder`](crate::Engine::builder).
///
/// Defaults: run-to-completion (no poller threads), [`IdleStrategy::BusySpin`], 4096-byte buffers,
/// 256 buffers per connection per direction, depth `min(128, buffers)` (tcp: its byte window's
/// worth, see [`EngineBuilder::depth`]), batch 128, inline threshold
/// [`crate::INLINE_MAX`], signal every 16, RDMA frames up to the buffer size, connect timeout
/// 5 s, 1024 connections per poller, liveness timeout 1 s, messages up to 16 MiB through 2 large
/// slots per connection per direction, [`HugePages::Try`], [`NumaPolicy::Off`].
#[derive(Debug, Clone)]
#[must_use]
pub struct EngineBuilder {
    cfg: Config,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        EngineBuilder {
            cfg: Config {
                pollers: Vec::new(),
                idle: IdleStrategy::BusySpin,
                buffer_size: DEFAULT_BUFFER_SIZE,
                buffers: DEFAULT_BUFFERS,
                depth: 128,
                batch: DEFAULT_BATCH,
                inline_threshold: crate::desc::INLINE_MAX,
                max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
                large_buffers: DEFAULT_LARGE_BUFFERS,
                large_threshold: None,
                signal_every: 16,
                rdma_srq_buffers: 0,
                rdma_srq_credits: 0,
                rdma_gid_index: None,
                frame_size: None,
                connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                max_connections_per_poller: DEFAULT_MAX_CONNECTIONS_PER_POLLER,
                max_connections_per_listener: DEFAULT_MAX_CONNECTIONS_PER_LISTENER,
                liveness_timeout: DEFAULT_LIVENESS_TIMEOUT,
                name: "spinwire".to_owned(),
                counters_file: true,
                depth_set: false,
                hugepages: HugePages::default(),
                numa: NumaPolicy::default(),
                placer: Arc::new(Placer::off()),
            },
        }
    }
}

impl EngineBuilder {
    /// One dedicated poller thread per core id in `cores`, pinned to that core. Connections are
    /// spread over the pollers (least loaded first). An empty slice means run-to-completion mode.
    pub fn pollers(mut self, cores: &[usize]) -> Self {
        self.cfg.pollers = cores.to_vec();
        self
    }

    /// Run-to-completion mode: no poller thread; the application thread drives the poller
    /// through [`Engine::poll`](crate::Engine::poll) and implicitly inside `send`, `try_recv` and `recv_timeout`.
    pub fn run_to_completion(mut self) -> Self {
        self.cfg.pollers.clear();
        self
    }

    /// Idle strategy of poller threads and of application threads waiting in `*_timeout` calls.
    pub fn idle(mut self, idle: IdleStrategy) -> Self {
        self.cfg.idle = idle;
        self
    }

    /// Buffer pools: `buffer_size` bytes per buffer (the maximum message size), `buffers` buffers
    /// per connection per direction, allocated once when the connection is set up.
    pub fn pool(mut self, buffer_size: usize, buffers: usize) -> Self {
        self.cfg.buffer_size = buffer_size;
        self.cfg.buffers = buffers;
        self
    }

    /// Credits: the most messages one connection may have in flight (sent, not yet taken by the
    /// receiver). At most the number of buffers. Default: `min(128, buffers)`; on `tcp://`,
    /// whose byte window (sixteen receive chunks, 1 MiB at the defaults) bounds what is in
    /// flight, as many messages as that window holds 16-byte records (65536 at the defaults),
    /// and the application's window is that byte window too: `send` returns `WouldBlock` once
    /// what it sent and the peer has not taken fills it, whatever the messages' size. Set, it
    /// is every fabric's message window, tcp's too (beside its byte window, which then bounds
    /// only what the fabric posts).
    ///
    /// With pollers (not shm's direct path) it is also the number of slots of the application's
    /// receive ring, where a message counts as taken. A dedicated poller packs small messages
    /// that arrive together into shared slots (up to 120 bytes of them, each with a 2-byte
    /// length), so that ring may then hold more than `depth` small messages: its memory, not
    /// its count of messages, is what stays fixed.
    pub fn depth(mut self, depth: usize) -> Self {
        self.cfg.depth = depth;
        self.cfg.depth_set = true;
        self
    }

    /// Most work items a poller moves per connection per step (sends drained and posted per doorbell,
    /// receives delivered per burst); in run-to-completion mode also how many sends queue before
    /// `send` runs a poller cycle itself; on a direct path (shm) how many `send_batched` records
    /// are published together. 1..=256. Default [`DEFAULT_BATCH`] (128, the default window: a
    /// poller pass per 32 sends was most of a tcp sender's syscalls; `bench rate --fabric tcp`
    /// at 8 B went from 3.6-4.0 to 6.4-6.9 M msgs/s, at 64 B from 4.0-4.5 to 9.1-9.4).
    pub fn batch(mut self, batch: usize) -> Self {
        self.cfg.batch = batch;
        self
    }

    /// Messages up to this many bytes are copied into the descriptor (shm: the ring slot; RDMA:
    /// `IBV_SEND_INLINE`) instead of being referenced in the pool. Capped at [`crate::INLINE_MAX`].
    pub fn inline_threshold(mut self, bytes: usize) -> Self {
        self.cfg.inline_threshold = bytes;
        self
    }

    /// The largest message a connection carries (default [`DEFAULT_MAX_MESSAGE_SIZE`], 16 MiB),
    /// independent of the pool's buffer size. A message above the buffer size (or above
    /// [`large_threshold`](Self::large_threshold)) travels through a **large slot**: a buffer
    /// of `bytes` bytes, [`large_buffers`](Self::large_buffers) of them per connection per
    /// direction, allocated (RDMA: registered) once when the connection is set up. At or below
    /// the buffer size there are no large slots and the limit is the buffer size.
    ///
    /// Memory per connection: `2 * large_buffers * bytes` more (64 MiB of address space at the
    /// defaults; shm and tcp touch pages only as messages use them, RDMA registers, so pins, all
    /// of it).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.cfg.max_message_size = bytes;
        self
    }

    /// Large slots per connection per direction (default [`DEFAULT_LARGE_BUFFERS`] = 2; at most
    /// [`MAX_LARGE_BUFFERS`]): how many large messages may be in flight (sent and not yet
    /// dropped by the receiver) at once. `0` turns large messages off (the limit is then the
    /// buffer size).
    pub fn large_buffers(mut self, n: usize) -> Self {
        self.cfg.large_buffers = n;
        self
    }

    /// [`Connection::send_copy`](crate::Connection::send_copy) puts a message longer than
    /// `bytes` into a large slot, a shorter one into a pool buffer (eager). Default and maximum:
    /// the buffer size.
    pub fn large_threshold(mut self, bytes: usize) -> Self {
        self.cfg.large_threshold = Some(bytes);
        self
    }

    /// RDMA selective signalling: request a completion every `n` sends. Ignored by shm.
    pub fn signal_every(mut self, n: usize) -> Self {
        self.cfg.signal_every = n;
        self
    }

    /// RDMA shared receive queue: `buffers > 0` gives each poller one SRQ per device with a
    /// shared pool of `buffers` receive buffers (registered once per poller and device), from
    /// which every RDMA connection on that poller is granted a share as its credits
    /// ([`rdma_srq_credits`](Self::rdma_srq_credits), by default
    /// `min(pool buffers, 16)`), not a full private window: the receive memory is the pool's,
    /// whatever the number of connections. The grants never add up to more than the pool's
    /// posted buffers (no RNR), and a connection that does not fit is refused with a typed
    /// error. 0 (the default): each connection has its own receive queue and pool. Ignored
    /// by shm.
    pub fn rdma_srq(mut self, buffers: usize) -> Self {
        self.cfg.rdma_srq_buffers = buffers;
        self
    }

    /// RDMA with a shared receive queue ([`rdma_srq`](Self::rdma_srq)): the credits each
    /// connection is granted on its poller's SRQ (the receive buffers its peer may fill at
    /// once: its send window), at least 4 and at most the per-connection buffer count
    /// ([`pool`](Self::pool); larger values are clamped to it). 0 (the default):
    /// `min(buffers, 16)`. Smaller grants fit more connections into one SRQ; larger ones give
    /// each connection a deeper window. Ignored without an SRQ, by shm and by TCP.
    pub fn rdma_srq_credits(mut self, credits: usize) -> Self {
        self.cfg.rdma_srq_credits = credits;
        self
    }

    /// RDMA source GID index override: connections this engine makes send from entry `index`
    /// of the GID table of the device port their route goes through, instead of the GID that
    /// rdma_cm derives from the route. rdma_cm picks a GID only through an address, so the
    /// entry must be an IP-based (RoCE) GID of the destination's family; connect reads back the
    /// index the QP really uses and fails with a typed error if rdma_cm took another entry of
    /// the same address (e.g. RoCE v1 instead of v2). Accepted connections use the GID of the
    /// address the client connected to; a listener on the wildcard address binds to the
    /// override's address instead. The override and the GID chosen are logged (`tracing`,
    /// info). Ignored by shm and TCP.
    ///
    /// `None` (the default) leaves the choice to the environment variable
    /// [`RDMA_GID_INDEX_ENV`] (`SPINWIRE_RDMA_GID_INDEX`, a number 0..=255), read by
    /// [`build`](EngineBuilder::build); a value set here wins over the variable. An invalid
    /// value of the variable fails `build` with [`ConfigError::RdmaGidIndexEnv`].
    pub fn rdma_gid_index(mut self, index: Option<u8>) -> Self {
        self.cfg.rdma_gid_index = index;
        self
    }

    /// RDMA message coalescing: consecutive small messages of one send batch (each at most the
    /// inline threshold, itself at most [`crate::INLINE_MAX`]) travel as the records of one
    /// *frame* of at most `bytes` bytes (further bounded by the receive buffer size), one SEND
    /// and one receive buffer for all of them; the receiver splits the frame and delivers each
    /// message inline. A lone message still leaves at once, unframed. Larger messages
    /// keep their zero-copy SEND, in order with the frames. Default: the buffer size. `0` (or
    /// any size too small for two records, under 24 bytes) turns coalescing off: one SEND per
    /// message. Ignored by shm and tcp.
    pub fn frame_size(mut self, bytes: usize) -> Self {
        self.cfg.frame_size = Some(bytes);
        self
    }

    /// Default timeout of [`Engine::connect`](crate::Engine::connect).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.connect_timeout = timeout;
        self
    }

    /// Most connections one poller serves (its connection table is allocated once, up front).
    pub fn max_connections_per_poller(mut self, n: usize) -> Self {
        self.cfg.max_connections_per_poller = n;
        self
    }

    /// Most connections one listener holds open at a time (accepted and not yet closed, and
    /// those whose handshake is under way); default
    /// [`DEFAULT_MAX_CONNECTIONS_PER_LISTENER`]. A connection past it is refused as busy (the
    /// connector's error says so) and reported on the listener's engine as an
    /// [`Event::Error`](crate::Event::Error) with
    /// [`Error::ListenerFull`](crate::Error::ListenerFull).
    pub fn max_connections_per_listener(mut self, n: usize) -> Self {
        self.cfg.max_connections_per_listener = n;
        self
    }

    /// Liveness: a peer that has not proved it is alive for `timeout` fails its connection with
    /// [`FabricError::PeerUnresponsive`](crate::FabricError::PeerUnresponsive), reported as
    /// [`Event::PeerUnresponsive`](crate::Event::PeerUnresponsive). Each side proves it every
    /// `timeout / 4`: shm through the heartbeat word in the segment, bumped by the control
    /// thread; RDMA by a heartbeat message over the queue pair when the connection sent nothing
    /// else for that long. A peer stopped (SIGSTOP, a debugger), hung, or on a host that vanished
    /// is found within `timeout` plus one liveness beat of the control thread (`timeout / 12`).
    /// Between beats the control thread sleeps, so it does not preempt busy-polling threads.
    /// None of this needs the application to call into the engine: in run-to-completion mode
    /// the control thread runs a poller cycle itself on a beat when the application ran none
    /// since the last (tcp, RDMA and `mem://` heartbeats and checks are the poller's), so an
    /// idle application keeps its connections on every fabric.
    ///
    /// Both sides should use the same timeout (each side decides with its own). Default 1 s;
    /// at least [`MIN_LIVENESS_TIMEOUT`]; `Duration::ZERO` turns liveness off (a stopped peer is
    /// then never reported; a dead one still is, by its socket hang-up).
    pub fn liveness_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.liveness_timeout = timeout;
        self
    }

    /// The engine's name: the prefix of its thread names (`<name>-control`,
    /// `<name>-poller-<core>`) and of its counters file (`<name>-<pid>-<n>.counters`, see
    /// [`crate::counters`]). Default `spinwire`.
    pub fn name(mut self, name: &str) -> Self {
        self.cfg.name = name.to_owned();
        self
    }

    /// Whether the engine publishes its counters into a counters file that `spinwire-stat`
    /// reads from outside the process ([`crate::counters`]). Default on; the file costs the
    /// data path nothing (the control thread copies the counters into it at most ten times a
    /// second).
    pub fn counters_file(mut self, on: bool) -> Self {
        self.cfg.counters_file = on;
        self
    }

    /// Hugepages for pools, shm segments and RDMA regions (default [`HugePages::Try`]: regions
    /// of 2 MiB or more on hugepages while the kernel's reserved pool has them, else on 4 KiB
    /// pages with one log line per engine). [`HugePages::Require`] fails
    /// [`build`](EngineBuilder::build) when no huge page is free, and a connection whose
    /// regions cannot all be had with [`PlacementError::HugePagesUnavailable`](crate::PlacementError::HugePagesUnavailable)
    /// in its error's source chain. What the regions got is in
    /// [`EngineStats::placement`](crate::EngineStats::placement).
    pub fn hugepages(mut self, policy: HugePages) -> Self {
        self.cfg.hugepages = policy;
        self
    }

    /// The NUMA node of pools, shm segments and RDMA regions (default [`NumaPolicy::Off`]):
    /// bound with `mbind(MPOL_PREFERRED)` before their first touch. A node the machine does not
    /// have fails [`build`](EngineBuilder::build) with
    /// [`PlacementError::NoSuchNode`](crate::PlacementError::NoSuchNode).
    pub fn numa(mut self, policy: NumaPolicy) -> Self {
        self.cfg.numa = policy;
        self
    }

    /// Checks every knob and returns the configuration [`build`](EngineBuilder::build) starts
    /// the engine with.
    pub(crate) fn validate(self) -> Result<Config, Error> {
        let mut c = self.cfg;
        if !c.depth_set {
            c.depth = c.buffers.clamp(1, 128);
        }
        if c.buffer_size == 0 || c.buffer_size > MAX_BUFFER_SIZE {
            return Err(Error::Config(ConfigError::BufferSize {
                value: c.buffer_size,
                max: MAX_BUFFER_SIZE,
            }));
        }
        if c.buffers == 0 || c.buffers > MAX_BUFFERS {
            return Err(Error::Config(ConfigError::Buffers {
                value: c.buffers,
                max: MAX_BUFFERS,
            }));
        }
        if c.max_message_size == 0 || c.max_message_size > MAX_MESSAGE_SIZE {
            return Err(Error::Config(ConfigError::MaxMessageSize {
                value: c.max_message_size,
                max: MAX_MESSAGE_SIZE,
            }));
        }
        if c.large_buffers > MAX_LARGE_BUFFERS {
            return Err(Error::Config(ConfigError::LargeBuffers {
                value: c.large_buffers,
                max: MAX_LARGE_BUFFERS,
            }));
        }
        if c.depth == 0 || c.depth > c.buffers {
            return Err(Error::Config(ConfigError::Depth {
                value: c.depth,
                buffers: c.buffers,
            }));
        }
        if c.batch == 0 || c.batch > MAX_BATCH {
            return Err(Error::Config(ConfigError::Batch {
                value: c.batch,
                max: MAX_BATCH,
            }));
        }
        if c.signal_every == 0 {
            return Err(Error::Config(ConfigError::SignalEvery));
        }
        if c.max_connections_per_poller == 0 || c.max_connections_per_poller > 1 << 20 {
            return Err(Error::Config(ConfigError::MaxConnectionsPerPoller {
                value: c.max_connections_per_poller,
                max: 1 << 20,
            }));
        }
        if c.max_connections_per_listener == 0 {
            return Err(Error::Config(ConfigError::MaxConnectionsPerListener));
        }
        if !c.liveness_timeout.is_zero() && c.liveness_timeout < MIN_LIVENESS_TIMEOUT {
            return Err(Error::Config(ConfigError::LivenessTimeout {
                value: c.liveness_timeout,
                min: MIN_LIVENESS_TIMEOUT,
            }));
        }
        if let IdleStrategy::Backoff {
            min_park, max_park, ..
        } = c.idle
        {
            if min_park > max_park || max_park > Duration::from_secs(1) {
                return Err(Error::Config(ConfigError::BackoffPark {
                    min_park,
                    max_park,
                    limit: Duration::from_secs(1),
                }));
            }
        }
        if let IdleStrategy::Block { spin, max_sleep } = c.idle {
            let limit = Duration::from_secs(1);
            if max_sleep.is_zero() || max_sleep > limit || spin > limit {
                return Err(Error::Config(ConfigError::BlockSleep { spin, max_sleep }));
            }
        }
        let mut seen = Vec::new();
        for &core in &c.pollers {
            if seen.contains(&core) {
                return Err(Error::Config(ConfigError::DuplicateCore { core }));
            }
            seen.push(core);
        }
        // Only the range is checked here: the calling thread's own affinity (it may be pinned
        // already) says nothing about other cores. A core this process may not use (cpuset)
        // fails when the poller thread pins itself, also as `BadCore`.
        // SAFETY: sysconf has no preconditions.
        let configured = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        let configured = usize::try_from(configured).unwrap_or(0).max(1);
        if let Some(&core) = c.pollers.iter().find(|&&core| core >= configured) {
            return Err(Error::BadCore { core });
        }
        if c.rdma_gid_index.is_none() {
            c.rdma_gid_index = gid_index_from_env(std::env::var_os(RDMA_GID_INDEX_ENV))?;
        }
        let inline_threshold = c
            .inline_threshold
            .min(crate::desc::INLINE_MAX)
            .min(c.buffer_size);
        c.placer = Arc::new(Placer::resolve(c.hugepages, c.numa, &c.pollers)?);
        Ok(Config {
            inline_threshold,
            ..c
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gid_index_env_parses_0_to_255_and_rejects_the_rest_with_a_typed_error() {
        assert_eq!(gid_index_from_env(None), Ok(None));
        assert_eq!(gid_index_from_env(Some("".into())), Ok(None));
        assert_eq!(gid_index_from_env(Some(" ".into())), Ok(None));
        assert_eq!(gid_index_from_env(Some("0".into())), Ok(Some(0)));
        assert_eq!(gid_index_from_env(Some(" 3\n".into())), Ok(Some(3)));
        assert_eq!(gid_index_from_env(Some("255".into())), Ok(Some(255)));
        for bad in ["256", "-1", "x", "0x3", "1.5"] {
            let e = gid_index_from_env(Some(bad.into())).unwrap_err();
            let ConfigError::RdmaGidIndexEnv { value, .. } = &e else {
                panic!("{bad}: {e:?}");
            };
            assert_eq!(value, bad);
            assert!(e.to_string().contains(RDMA_GID_INDEX_ENV), "{e}");
            assert!(
                std::error::Error::source(&e).is_some(),
                "the parse error is kept"
            );
        }
    }

    #[test]
    fn builder_gid_index_wins_over_the_environment() {
        // Whatever the environment holds (it is not changed here: tests run in parallel), a
        // value set on the builder is what the configuration keeps.
        let c = EngineBuilder::default()
            .rdma_gid_index(Some(7))
            .validate()
            .unwrap();
        assert_eq!(c.rdma_gid_index, Some(7));
    }
}
