//! The rendezvous' error type.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::{ConnParams, HandshakeRefusal};

/// Errors of the rendezvous.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdsError {
    /// The rendezvous name is invalid.
    #[error("bad shm rendezvous name {name:?}: {reason}")]
    BadName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Creating or inspecting the runtime directory failed.
    #[error("runtime directory {path:?}")]
    RuntimeDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The runtime directory is not a private directory of this user.
    #[error("runtime directory {path:?} is insecure: {reason}")]
    InsecureRuntimeDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The socket path does not fit in `sockaddr_un`.
    #[error("socket path {path:?} is too long for a Unix socket address")]
    PathTooLong {
        /// The path.
        path: PathBuf,
    },
    /// Another live listener holds the name.
    #[error("shm name {name:?} is already bound by a live listener")]
    AddrInUse {
        /// The name.
        name: String,
    },
    /// A socket system call failed (`step` names it: `socket`, `lock`, `bind`, `listen`,
    /// `accept`, `connect`, `getsockopt`, `poll`, `sendmsg`, `recvmsg`).
    #[error("unix socket {step} failed")]
    Io {
        /// The failing step.
        step: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Nobody listens on the name (no socket file, or a stale one). Names are per user: the
    /// listener must run as this user, with the same runtime directory.
    #[error(
        "no shm listener named {name:?} in {dir:?} (names are per user: a listener of this \
         user binds its name in this runtime directory)"
    )]
    NoListener {
        /// The name.
        name: String,
        /// The runtime directory looked in ([`runtime_dir`](super::runtime_dir)).
        dir: std::path::PathBuf,
    },
    /// An operation did not complete in time.
    #[error("{op} timed out after {timeout:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The timeout it had.
        timeout: Duration,
    },
    /// The peer runs as another user.
    #[error("peer uid {uid} differs from ours ({expected}); refused")]
    ForeignPeer {
        /// The peer's uid.
        uid: u32,
        /// Our effective uid.
        expected: u32,
    },
    /// The peer closed the socket during the handshake.
    #[error("peer closed the control socket during {op}")]
    PeerClosed {
        /// The handshake step.
        op: &'static str,
    },
    /// The peer sent a malformed or unexpected message.
    #[error("bad handshake message: {reason}")]
    BadMessage {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: ours {ours}, peer {theirs}")]
    VersionMismatch {
        /// [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION).
        ours: u16,
        /// The peer's version.
        theirs: u16,
    },
    /// The listener rejected our hello.
    #[error("connection rejected by the listener: {reason}")]
    Rejected {
        /// The reason it gave.
        reason: HandshakeRefusal,
        /// The listener's own params, where it sent them (a mismatch), else all zero.
        params: ConnParams,
    },
    /// The connector aborted after the offer (e.g. it could not attach the segment).
    #[error("connection aborted by the connector: {reason}")]
    Aborted {
        /// The reason it gave.
        reason: HandshakeRefusal,
    },
    /// A message carried the wrong number of file descriptors (extras are closed).
    #[error("expected {expected} file descriptor(s) in the message, got {got}")]
    FdCount {
        /// How many were expected.
        expected: usize,
        /// How many arrived (at least; a truncated control message counts as one more).
        got: usize,
    },
}
