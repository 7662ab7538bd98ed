//! [`Event`]: what the control thread reports to the application through the event ring.

use std::time::Duration;

use crate::error::Error;

/// A connection-level event, from [`Engine::try_event`](crate::Engine::try_event).
#[derive(Debug)]
#[non_exhaustive]
pub enum Event {
    /// A connection was established (by `connect` or accepted by a listener).
    Connected {
        /// [`Connection::id`](crate::Connection::id).
        conn: u64,
        /// The endpoint.
        peer: String,
        /// The path the fabric chose, where it chooses one: for `rdma`, the device, port, GID
        /// index, GID type and GID rdma_cm resolved (e.g. `device rxe0 port 1 gid index 1
        /// (RoCE v2) gid ::ffff:10.0.2.15`); `None` for `shm`.
        path: Option<String>,
    },
    /// The peer of a connection went away (closed it, or its process died). A peer that failed
    /// the connection because of this side (found it unresponsive, or breaking the protocol)
    /// is an [`Event::Error`] with [`FabricError::PeerAborted`](crate::FabricError::PeerAborted)
    /// instead, where the fabric carries the reason.
    Disconnected {
        /// [`Connection::id`](crate::Connection::id).
        conn: u64,
    },
    /// The peer of a connection stopped proving it is alive for the liveness timeout
    /// ([`EngineBuilder::liveness_timeout`](crate::EngineBuilder::liveness_timeout)): the
    /// connection failed with [`FabricError::PeerUnresponsive`](crate::FabricError::PeerUnresponsive)
    /// and is closed (no further event follows for it).
    PeerUnresponsive {
        /// [`Connection::id`](crate::Connection::id).
        conn: u64,
        /// How long the peer had been silent.
        silent_for: Duration,
    },
    /// A connection (or a listener, `conn: None`) failed.
    Error {
        /// [`Connection::id`](crate::Connection::id), if the error belongs to a connection.
        conn: Option<u64>,
        /// What failed.
        error: Error,
    },
}
