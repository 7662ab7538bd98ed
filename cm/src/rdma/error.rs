//! [`CmError`]: the typed errors of rdma_cm connection management.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::private_data::{CmRejectReason, PrivateDataError};

/// Errors of rdma_cm connection management. One variant per failing step; rdma_cm's failure
/// events map to [`CmError::AddrError`], [`CmError::RouteError`], [`CmError::Unreachable`],
/// [`CmError::Rejected`]/[`CmError::NoListener`], [`CmError::ConnectError`],
/// [`CmError::Disconnected`] and [`CmError::DeviceRemoval`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// `rdma_create_event_channel` failed (is `rdma_ucm` loaded? `/dev/infiniband/rdma_cm`?).
    #[error("rdma_create_event_channel failed (is the rdma_ucm module loaded?)")]
    CreateChannel(#[source] io::Error),
    /// `rdma_create_id` failed.
    #[error("rdma_create_id failed")]
    CreateId(#[source] io::Error),
    /// Host name resolution failed or gave no address.
    #[error("cannot resolve host {host:?}")]
    Resolve {
        /// The host string.
        host: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// `rdma_bind_addr` failed (address in use, or no RDMA device owns that IP).
    #[error("rdma_bind_addr({addr}) failed")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `rdma_listen` failed.
    #[error("rdma_listen on {addr} failed")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `rdma_resolve_addr` failed immediately.
    #[error("rdma_resolve_addr({addr}) failed")]
    ResolveAddr {
        /// Destination.
        addr: SocketAddr,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// ADDR_ERROR: the destination has no route through an RDMA device, or ARP/ND failed.
    #[error(
        "address resolution for {addr} failed (ADDR_ERROR, status {status}): no RDMA route to host"
    )]
    AddrError {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status (negative errno).
        status: i32,
    },
    /// `rdma_resolve_route` failed immediately.
    #[error("rdma_resolve_route failed")]
    ResolveRoute(#[source] io::Error),
    /// ROUTE_ERROR.
    #[error("route resolution to {addr} failed (ROUTE_ERROR, status {status})")]
    RouteError {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status.
        status: i32,
    },
    /// rdma_cm did not resolve a device context for the id.
    #[error("rdma_cm resolved no device for this connection")]
    NoDevice,
    /// `rdma_create_qp` failed.
    #[error("rdma_create_qp failed")]
    CreateQp(#[source] io::Error),
    /// `rdma_connect` failed immediately.
    #[error("rdma_connect failed")]
    Connect(#[source] io::Error),
    /// `rdma_accept` failed.
    #[error("rdma_accept failed")]
    Accept(#[source] io::Error),
    /// `rdma_reject` failed.
    #[error("rdma_reject failed")]
    Reject(#[source] io::Error),
    /// `rdma_migrate_id` failed.
    #[error("rdma_migrate_id failed")]
    Migrate(#[source] io::Error),
    /// `rdma_disconnect` failed.
    #[error("rdma_disconnect failed")]
    Disconnect(#[source] io::Error),
    /// Nobody listens on the destination port (REJECTED with "invalid service id" or
    /// connection refused).
    #[error("no listener at {addr} (connection rejected, status {status})")]
    NoListener {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status.
        status: i32,
    },
    /// REJECTED by the peer.
    #[error(
        "connection to {addr} rejected by peer (status {status}{})",
        CmRejectReason::decode(private_data).map_or(String::new(), |r| format!(", {r:?}"))
    )]
    Rejected {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status (IB CM reject reason, or negative errno).
        status: i32,
        /// The peer's reject private data, if any (see [`CmRejectReason`]).
        private_data: Vec<u8>,
    },
    /// UNREACHABLE: the peer did not answer the connection request.
    #[error("peer {addr} unreachable (UNREACHABLE, status {status})")]
    Unreachable {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status.
        status: i32,
    },
    /// CONNECT_ERROR.
    #[error("connection error (CONNECT_ERROR, status {status})")]
    ConnectError {
        /// rdma_cm status.
        status: i32,
    },
    /// DISCONNECTED while waiting for something else.
    #[error("connection disconnected")]
    Disconnected,
    /// DEVICE_REMOVAL: the RDMA device went away.
    #[error("RDMA device removed")]
    DeviceRemoval,
    /// An event that the current step did not expect.
    #[error("unexpected rdma_cm event {got} while waiting for {expected}")]
    UnexpectedEvent {
        /// What was awaited.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },
    /// A step did not complete in time.
    #[error("timed out after {waited:?} waiting for {step}")]
    Timeout {
        /// What was awaited.
        step: &'static str,
        /// How long.
        waited: Duration,
    },
    /// `rdma_get_cm_event` or `poll` on the channel failed.
    #[error("reading rdma_cm events failed")]
    GetEvent(#[source] io::Error),
    /// Setting the channel fd's flags failed.
    #[error("fcntl on the event channel fd failed")]
    Fcntl(#[source] io::Error),
    /// The peer's private data is missing or invalid.
    #[error("invalid private data from peer")]
    PrivateData(#[from] PrivateDataError),
}

/// Maps a synchronous `rdma_connect` failure to its typed error: iWARP drivers that connect
/// the TCP stream inside `rdma_connect` (soft-iWARP) report a refused or unreachable peer
/// through errno instead of a REJECTED/UNREACHABLE event.
pub(super) fn connect_errno_error(err: io::Error, peer: Option<SocketAddr>) -> CmError {
    match (err.raw_os_error(), peer) {
        (Some(libc::ECONNREFUSED), Some(addr)) => CmError::NoListener {
            addr,
            status: -libc::ECONNREFUSED,
        },
        (Some(e @ (libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH)), Some(addr)) => {
            CmError::Unreachable { addr, status: -e }
        }
        _ => CmError::Connect(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronous_connect_failures_map_to_typed_errors() {
        let peer: SocketAddr = "10.0.2.15:7471".parse().unwrap();
        let errno = io::Error::from_raw_os_error;
        let e = connect_errno_error(errno(libc::ECONNREFUSED), Some(peer));
        assert!(matches!(e, CmError::NoListener { .. }), "{e:?}");
        assert!(e.to_string().contains("no listener"), "{e}");
        for code in [libc::ETIMEDOUT, libc::EHOSTUNREACH, libc::ENETUNREACH] {
            let e = connect_errno_error(errno(code), Some(peer));
            assert!(
                matches!(e, CmError::Unreachable { status, .. } if status == -code),
                "{e:?}"
            );
        }
        let e = connect_errno_error(errno(libc::EINVAL), Some(peer));
        assert!(matches!(e, CmError::Connect(_)), "{e:?}");
        let e = connect_errno_error(errno(libc::ECONNREFUSED), None);
        assert!(matches!(e, CmError::Connect(_)), "{e:?}");
    }
}
