//! Typed setup errors of the TCP fabric: one variant per failing step or check, carrying the
//! socket error as `#[source]`.

use std::io;
use std::net::SocketAddr;

use super::hello::TcpParams;

/// Setting up a TCP connection failed (reported as
/// [`SetupError::Tcp`](crate::SetupError::Tcp)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpSetupError {
    /// The configured buffer size exceeds the largest record payload of the stream format.
    #[error("tcp buffer size {size} exceeds the record format's limit of {max} bytes")]
    BufferSize {
        /// The configured buffer size.
        size: usize,
        /// [`record::MAX_PAYLOAD`](crate::record::MAX_PAYLOAD).
        max: usize,
    },
    /// Allocating a connection's buffer pools or stream buffers failed.
    #[error("allocating {bytes} bytes of tcp connection memory")]
    Alloc {
        /// The size asked for.
        bytes: usize,
    },
    /// Placing a connection's buffer pools (hugepages, NUMA node) failed.
    #[error("placing tcp buffer pools")]
    Placement(#[source] crate::placement::PlacementError),
    /// The host name did not resolve to any address.
    #[error("resolving {host:?}")]
    Resolve {
        /// The host part of the endpoint.
        host: String,
        /// The resolver's error (or `NotFound` for an empty answer).
        #[source]
        source: io::Error,
    },
    /// Binding the listening socket failed.
    #[error("binding {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The TCP connect failed (refused, unreachable).
    #[error("connecting to {addr}")]
    Connect {
        /// The address tried (the last one, when the name resolved to several).
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A socket option or mode could not be set.
    #[error("setting {what} on the socket")]
    SocketOption {
        /// The option (`"TCP_NODELAY"`, `"O_NONBLOCK"`, ...).
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Sending or receiving a handshake message failed (the peer closed, reset, ...).
    #[error("tcp handshake: {step}")]
    Handshake {
        /// The step (`"send hello"`, `"recv reply"`, ...).
        step: &'static str,
        /// The OS error (`UnexpectedEof` when the peer closed mid-message).
        #[source]
        source: io::Error,
    },
    /// The peer's handshake message is not a valid spinwire TCP hello (bad magic or version,
    /// a value out of range): the field is the [`source`](std::error::Error::source).
    #[error("peer sent an invalid tcp hello")]
    BadHello {
        /// What is wrong.
        #[source]
        reason: super::hello::HelloError,
    },
    /// The peer's parameters differ from ours (buffer size, record format).
    #[error("peer's tcp parameters {theirs:?} do not match ours {ours:?}")]
    Mismatch {
        /// The peer's.
        theirs: TcpParams,
        /// Ours.
        ours: TcpParams,
    },
    /// The listener refused the connection (status code of its reply).
    #[error("listener refused the connection: {reason}")]
    Refused {
        /// The refusal.
        reason: &'static str,
    },
    /// An accepted connection did not complete its handshake in time.
    #[error("tcp accept: no hello within {timeout:?}")]
    AcceptTimeout {
        /// The per-handshake deadline.
        timeout: std::time::Duration,
    },
    /// Accepting a connection failed.
    #[error("tcp accept")]
    Accept(#[source] io::Error),
}
