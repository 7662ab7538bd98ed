//! [`Event`]: what the control thread reports to the application through the event ring.

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
        /// index and GID type rdma_cm resolved (e.g. `device rxe0 port 1 gid index 1 (RoCE
        /// v2)`); `None` for `shm`.
        path: Option<String>,
    },
    /// The peer of a connection went away (closed it, or its process died).
    Disconnected {
        /// [`Connection::id`](crate::Connection::id).
        conn: u64,
    },
    /// A connection (or a listener, `conn: None`) failed.
    Error {
        /// [`Connection::id`](crate::Connection::id), if the error belongs to a connection.
        conn: Option<u64>,
        /// What failed.
        error: Error,
    },
}
