//! Error types of the public API.

use std::io;
use std::time::Duration;

use crate::fabric::shm::ShmSetupError;

/// A boxed error from a lower layer (control plane, rendezvous, verbs).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can fail in spinwire, one variant per failing step.
///
/// Data-path failures of one connection (a corrupt peer, a dead peer) fail that connection only; they
/// surface as [`Error::Disconnected`] / [`Error::Fabric`] from its methods and as an
/// [`Event`](crate::Event) from [`Engine::try_event`](crate::Engine::try_event).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The endpoint string is not a valid `shm://name`, `tcp://host:port` or `rdma://host:port`
    /// URL.
    #[error("bad endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The string that was given.
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The endpoint names a fabric this build does not include (e.g. `rdma://` without the `rdma`
    /// feature).
    #[error("fabric {fabric:?} is not compiled into this build (enable the `{fabric}` feature)")]
    FabricNotCompiled {
        /// The URL scheme.
        fabric: &'static str,
    },
    /// The engine configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(ConfigError),
    /// The memory placement asked for cannot be had
    /// ([`EngineBuilder::hugepages`](crate::EngineBuilder::hugepages) with no free hugepages,
    /// [`EngineBuilder::numa`](crate::EngineBuilder::numa) with a node the machine lacks).
    #[error("memory placement")]
    Placement(#[from] crate::placement::PlacementError),
    /// Spawning or pinning a thread failed.
    #[error("could not start the {what} thread")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A poller core id is not a core this process may run on.
    #[error(
        "core {core} is not available to this process (pollers must be pinned to allowed cores)"
    )]
    BadCore {
        /// The core id given to [`EngineBuilder::pollers`](crate::EngineBuilder::pollers).
        core: usize,
    },
    /// Listening on an endpoint failed.
    #[error("listen on {endpoint:?} failed")]
    Listen {
        /// The endpoint.
        endpoint: String,
        /// The cause (rendezvous / rdma_cm error).
        #[source]
        source: BoxError,
    },
    /// A listener refused a connection: it holds
    /// [`max_connections_per_listener`](crate::EngineBuilder::max_connections_per_listener)
    /// already (reported on the listener's engine as an [`Event::Error`](crate::Event::Error);
    /// the connector was told it is busy).
    #[error("listener on {endpoint:?} refused a connection: it holds its maximum of {max}")]
    ListenerFull {
        /// The listener's endpoint.
        endpoint: String,
        /// Its maximum.
        max: usize,
    },
    /// Connecting to an endpoint failed.
    #[error("connect to {endpoint:?} failed")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The cause (rendezvous / rdma_cm error).
        #[source]
        source: BoxError,
    },
    /// Nobody listened on the endpoint until the connect's deadline
    /// ([`Engine::connect_timeout`](crate::Engine::connect_timeout) waits for a listener to
    /// appear). The last refusal is the [`source`](std::error::Error::source).
    #[error("connect to {endpoint:?}: no listener appeared within {waited:?}")]
    NoListener {
        /// The endpoint.
        endpoint: String,
        /// How long the connect waited.
        waited: Duration,
        /// The last attempt's refusal (no listener there, connection refused).
        #[source]
        source: BoxError,
    },
    /// Setting up the fabric resources of a connection failed (shared-memory segment, queue pair).
    /// The step is the message; its cause (errno, verbs, rendezvous error) is the
    /// [`source`](std::error::Error::source).
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The wait ran out.
    #[error("timed out")]
    Timeout,
    /// Nothing available right now (no free buffer yet, no credits): retry.
    #[error("would block")]
    WouldBlock,
    /// A claim of ring space ([`Connection::claim`](crate::Connection::claim)) is open on this
    /// connection: commit (send) or drop it before claiming or sending anything else.
    #[error("a claim is open on this connection")]
    ClaimOpen,
    /// No free buffer: every buffer of the connection's send pool is in flight or held by the
    /// application.
    #[error("send buffer pool exhausted ({count} buffers, all in flight or held)")]
    PoolExhausted {
        /// Buffers in the pool.
        count: usize,
    },
    /// A message is waiting, but the application holds `max` received messages, the most a
    /// connection lends at once: drop one and receive again. Nothing is lost; the message stays
    /// queued. Each held message takes a slot of its own (its record, and a small message's
    /// bytes); there are as many slots as receive buffers and large slots (the most messages in
    /// buffers the peer can lend at once), plus as many again, and at least 256, for small
    /// ones.
    #[error("the application holds {max} received messages, the most at once: drop one")]
    TooManyHeld {
        /// The most messages held at once.
        max: usize,
    },
    /// A message larger than the connection's buffers; segmentation is not supported.
    #[error("message of {size} bytes exceeds the maximum message size of {max} bytes")]
    MessageTooLarge {
        /// The size that was asked for.
        size: usize,
        /// [`Connection::max_message_size`](crate::Connection::max_message_size).
        max: usize,
    },
    /// The connection is closed: the peer went away or closed it.
    #[error("connection disconnected")]
    Disconnected,
    /// The connection failed on the data path (e.g. the peer wrote an invalid descriptor).
    /// Its [`source`](std::error::Error::source) is the reason (printed by a chain printer,
    /// not repeated in this message).
    #[error("connection failed")]
    Fabric(#[from] FabricError),
    /// A [`SendBuf`](crate::SendBuf) was sent on a connection other than the one it was allocated from.
    #[error("buffer belongs to another connection")]
    ForeignBuffer,
    /// The engine is shutting down or its control thread is gone.
    #[error("engine is shut down")]
    Shutdown,
}

/// A data-path failure of one connection, reported by a fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// The peer wrote something invalid into shared state (shm segment, immediate data).
    #[error("peer protocol violation: {0}")]
    Protocol(&'static str),
    /// The peer closed the connection (cleanly, or its process died). Applications see this
    /// as [`Error::Disconnected`]; fabrics report it to the engine with this value.
    #[error("peer closed the connection")]
    PeerClosed,
    /// The peer stopped proving it is alive: nothing from it (shm: no heartbeat; RDMA: no
    /// message, heartbeat or credit) for at least the liveness timeout
    /// ([`EngineBuilder::liveness_timeout`](crate::EngineBuilder::liveness_timeout)). It may be
    /// stopped, hung, or on a host that vanished; its connection is failed on this side and
    /// closed, so it sees a disconnect when it resumes.
    #[error("peer unresponsive: nothing heard for {silent_for:?}")]
    PeerUnresponsive {
        /// How long the peer had been silent when the connection was failed.
        silent_for: std::time::Duration,
    },
    /// The fabric reported an error completion / OS error (errno).
    #[error("fabric I/O error (errno {0})")]
    Io(i32),
    /// The peer failed the connection because of this side and said why when it closed it:
    /// it heard nothing from this side for its liveness timeout (on its side the connection
    /// failed with [`PeerUnresponsive`](Self::PeerUnresponsive)), or this side broke the
    /// protocol ([`Protocol`](Self::Protocol) there). What the peer sent before is delivered
    /// first. `mem://`, `shm://` and `tcp://` carry the reason; over `rdma://` this side sees
    /// [`Error::Disconnected`] instead.
    #[error("peer aborted the connection: {0}")]
    PeerAborted(AbortReason),
}

/// Why a peer aborted a connection ([`FabricError::PeerAborted`]): what it found wrong with
/// this side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AbortReason {
    /// It heard nothing from this side for its liveness timeout (this process was stopped,
    /// hung, or did not serve the connection).
    Unresponsive,
    /// This side broke the protocol (an invalid record, descriptor or credit).
    Protocol,
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AbortReason::Unresponsive => "it heard nothing from this side for its liveness timeout",
            AbortReason::Protocol => "this side broke the protocol",
        })
    }
}

impl AbortReason {
    /// The reason's code on the wire (a fabric's close mark or close record); never 0 or 1,
    /// which the close marks use for "open" and "closed cleanly".
    pub(crate) const fn code(self) -> u32 {
        match self {
            AbortReason::Unresponsive => 2,
            AbortReason::Protocol => 3,
        }
    }

    /// The reason a wire code names; `None` for "open", "closed cleanly" and unknown codes
    /// (treated as a clean close).
    pub(crate) const fn from_code(code: u32) -> Option<AbortReason> {
        match code {
            2 => Some(AbortReason::Unresponsive),
            3 => Some(AbortReason::Protocol),
            _ => None,
        }
    }
}

impl FabricError {
    /// How a peer's close is reported, from the code of its close mark or close record
    /// ([`AbortReason::code`]): [`PeerAborted`](Self::PeerAborted) when it blamed this side,
    /// else (a plain close, no mark, an unknown code) [`PeerClosed`](Self::PeerClosed).
    pub(crate) const fn peer_close(code: u32) -> FabricError {
        match AbortReason::from_code(code) {
            Some(reason) => FabricError::PeerAborted(reason),
            None => FabricError::PeerClosed,
        }
    }

    /// What the peer is told when this side fails a connection with this error, if anything:
    /// an unresponsive peer and a protocol violation are its fault; a close, an I/O error or
    /// an abort by the peer are not news to it.
    pub(crate) const fn abort_reason(&self) -> Option<AbortReason> {
        match self {
            FabricError::PeerUnresponsive { .. } => Some(AbortReason::Unresponsive),
            FabricError::Protocol(_) => Some(AbortReason::Protocol),
            FabricError::PeerClosed | FabricError::Io(_) | FabricError::PeerAborted(_) => None,
        }
    }
}

/// An invalid [`EngineBuilder`](crate::EngineBuilder) knob: its value and the limit it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The buffer size of [`pool`](crate::EngineBuilder::pool) out of range.
    #[error("buffer size {value} must be in 1..={max}")]
    BufferSize {
        /// The value given.
        value: usize,
        /// [`MAX_BUFFER_SIZE`](crate::MAX_BUFFER_SIZE).
        max: usize,
    },
    /// The buffer count of [`pool`](crate::EngineBuilder::pool) out of range.
    #[error("buffers per connection {value} must be in 1..={max}")]
    Buffers {
        /// The value given.
        value: usize,
        /// [`MAX_BUFFERS`](crate::MAX_BUFFERS).
        max: usize,
    },
    /// [`max_message_size`](crate::EngineBuilder::max_message_size) out of range.
    #[error("max message size {value} must be in 1..={max}")]
    MaxMessageSize {
        /// The value given.
        value: usize,
        /// [`MAX_MESSAGE_SIZE`](crate::MAX_MESSAGE_SIZE).
        max: usize,
    },
    /// [`large_buffers`](crate::EngineBuilder::large_buffers) out of range.
    #[error("large buffers per connection {value} must be in 0..={max}")]
    LargeBuffers {
        /// The value given.
        value: usize,
        /// [`MAX_LARGE_BUFFERS`](crate::MAX_LARGE_BUFFERS).
        max: usize,
    },
    /// [`depth`](crate::EngineBuilder::depth) out of range.
    #[error("depth {value} must be in 1..=buffers ({buffers})")]
    Depth {
        /// The value given.
        value: usize,
        /// The buffers per connection, its upper bound.
        buffers: usize,
    },
    /// [`batch`](crate::EngineBuilder::batch) out of range.
    #[error("batch {value} must be in 1..={max}")]
    Batch {
        /// The value given.
        value: usize,
        /// [`MAX_BATCH`](crate::MAX_BATCH).
        max: usize,
    },
    /// [`liveness_timeout`](crate::EngineBuilder::liveness_timeout) is neither zero (off) nor at
    /// least the minimum.
    #[error("liveness timeout {value:?} must be zero (off) or at least {min:?}")]
    LivenessTimeout {
        /// The value given.
        value: std::time::Duration,
        /// [`MIN_LIVENESS_TIMEOUT`](crate::MIN_LIVENESS_TIMEOUT).
        min: std::time::Duration,
    },
    /// The environment variable `SPINWIRE_RDMA_GID_INDEX`
    /// ([`RDMA_GID_INDEX_ENV`](crate::RDMA_GID_INDEX_ENV)) is not a GID index (0..=255).
    #[error("{var}={value:?} is not a GID index (0..=255)", var = crate::RDMA_GID_INDEX_ENV)]
    RdmaGidIndexEnv {
        /// The variable's value.
        value: String,
        /// The parse error.
        #[source]
        source: std::num::ParseIntError,
    },
    /// `signal_every` is zero.
    #[error("signal_every must be at least 1")]
    SignalEvery,
    /// [`max_connections_per_poller`](crate::EngineBuilder::max_connections_per_poller) out of
    /// range.
    #[error("max connections per poller {value} must be in 1..={max}")]
    MaxConnectionsPerPoller {
        /// The value given.
        value: usize,
        /// The largest accepted value.
        max: usize,
    },
    /// [`max_connections_per_listener`](crate::EngineBuilder::max_connections_per_listener) is
    /// zero.
    #[error("max connections per listener must be at least 1")]
    MaxConnectionsPerListener,
    /// The [`IdleStrategy::Backoff`](crate::IdleStrategy::Backoff) park bounds are inconsistent.
    #[error(
        "backoff park durations must satisfy min_park <= max_park <= {limit:?} \
         (got min_park {min_park:?}, max_park {max_park:?})"
    )]
    BackoffPark {
        /// The shortest park given.
        min_park: Duration,
        /// The longest park given.
        max_park: Duration,
        /// The largest `max_park` accepted.
        limit: Duration,
    },
    /// The [`IdleStrategy::Block`](crate::IdleStrategy::Block) durations are out of range:
    /// `max_sleep` must be in `(0, 1 s]` and `spin` at most 1 s.
    // Two fields, not three (the limit is in the message): a third `Duration` made
    // `ConfigError` 56 bytes instead of 48.
    #[error(
        "block idle durations must satisfy 0 < max_sleep <= 1s and spin <= 1s \
         (got spin {spin:?}, max_sleep {max_sleep:?})"
    )]
    BlockSleep {
        /// The spin phase given.
        spin: Duration,
        /// The longest sleep given.
        max_sleep: Duration,
    },
    /// A core is listed twice in [`pollers`](crate::EngineBuilder::pollers).
    #[error("core {core} listed twice in pollers")]
    DuplicateCore {
        /// The core id.
        core: usize,
    },
    /// Internal: run-to-completion mode was built without its one poller agent set.
    #[error("run-to-completion mode needs one poller agent set")]
    RunToCompletionAgents,
}

/// Setting up a connection's fabric resources failed: the step, with the lower layer's error as
/// [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// Every poller already serves
    /// [`max_connections_per_poller`](crate::EngineBuilder::max_connections_per_poller)
    /// connections.
    #[error("fabric setup failed: every poller is at its connection limit")]
    PollersFull,
    /// A connection was assigned to a poller the fabric does not have.
    #[error("fabric setup failed: {fabric}: no poller {poller}")]
    NoPoller {
        /// The fabric.
        fabric: &'static str,
        /// The poller index.
        poller: usize,
    },
    /// The shm fabric failed (its message names the step; the cause is its source).
    #[error(transparent)]
    Shm(ShmSetupError),
    /// The TCP fabric failed (its message names the step; the cause is its source).
    #[error(transparent)]
    Tcp(crate::fabric::tcp::TcpSetupError),
    /// The RDMA fabric failed (its message names the step; the cause is its source).
    #[cfg(feature = "rdma")]
    #[error(transparent)]
    Rdma(crate::fabric::rdma::RdmaSetupError),
}

impl From<ShmSetupError> for Error {
    fn from(e: ShmSetupError) -> Error {
        Error::Setup(SetupError::Shm(e))
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Config(e)
    }
}

/// Displays an error and its [`source`](std::error::Error::source) chain, `: `-separated (for
/// control-plane log lines).
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}
