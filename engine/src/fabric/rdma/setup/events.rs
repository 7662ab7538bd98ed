//! An established connection's rdma_cm events ([`poll_events`], control thread) and its
//! disconnect ([`close`]).

use cm::rdma::{CmEventKind, CmId};

/// What a connection's rdma_cm events said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnStatus {
    /// Nothing that ends the connection.
    Alive,
    /// The peer disconnected (or its process died).
    Disconnected,
    /// The device went away.
    DeviceRemoved,
}

/// Reads every pending rdma_cm event of an established connection (its channel fd was readable).
pub(crate) fn poll_events(id: &CmId) -> ConnStatus {
    let mut status = ConnStatus::Alive;
    while let Ok(Some(ev)) = id.channel().try_event() {
        match ev.kind {
            CmEventKind::Disconnected => status = ConnStatus::Disconnected,
            CmEventKind::DeviceRemoval => return ConnStatus::DeviceRemoved,
            _ => {}
        }
    }
    status
}

/// Disconnects (if still connected). The QP and pools are released when the last handle
/// (poller's [`RdmaConn`], application's pool views, this id) is dropped.
///
/// [`RdmaConn`]: crate::fabric::rdma::RdmaConn
pub(crate) fn close(id: &CmId) {
    let _ = id.disconnect();
}
