//! Error types of the public API.

use std::io;

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
    /// The endpoint string is not a valid `shm://name` or `rdma://host:port` URL.
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
    Config(String),
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
    /// Connecting to an endpoint failed.
    #[error("connect to {endpoint:?} failed")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The cause (rendezvous / rdma_cm error).
        #[source]
        source: BoxError,
    },
    /// Setting up the fabric resources of a connection failed (shared-memory segment, queue pair).
    #[error("fabric setup failed: {0}")]
    Setup(String),
    /// The wait ran out.
    #[error("timed out")]
    Timeout,
    /// Nothing available right now (no free buffer yet, no credits): retry.
    #[error("would block")]
    WouldBlock,
    /// No free buffer: every buffer of the connection's send pool is in flight or held by the
    /// application.
    #[error("send buffer pool exhausted ({count} buffers, all in flight or held)")]
    PoolExhausted {
        /// Buffers in the pool.
        count: usize,
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
    #[error("connection failed: {0}")]
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
    /// The peer closed the connection or stopped responding.
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
}
