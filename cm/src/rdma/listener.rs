//! The passive side: [`CmListener`] (a bound, listening id) and the [`ConnectRequest`]s it
//! yields.

use std::net::SocketAddr;
use std::time::Duration;

use rdma_sys as ffi;

use super::channel::{CmEventKind, EventChannel};
use super::id::CmId;
use super::CmError;

/// A bound, listening id with its own event channel.
#[derive(Debug)]
pub struct CmListener {
    id: CmId,
}

impl CmListener {
    /// Binds to `addr` and listens.
    ///
    /// # Errors
    /// [`CmError::CreateChannel`], [`CmError::CreateId`], [`CmError::Bind`], [`CmError::Listen`].
    pub fn bind(addr: SocketAddr, backlog: i32) -> Result<Self, CmError> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        id.bind(addr)?;
        id.listen(backlog)?;
        Ok(Self { id })
    }

    /// The bound address (with the actual port if 0 was asked for).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        let mut a = self.id.local_addr()?;
        // SAFETY: valid listening id.
        let port = u16::from_be(unsafe { ffi::rdma_get_src_port(self.id.raw()) });
        a.set_port(port);
        Some(a)
    }

    /// The listening id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Waits up to `timeout` (`None`: just check) for the next connection request. The
    /// returned id is already migrated to its own event channel.
    ///
    /// # Errors
    /// [`CmError::GetEvent`], [`CmError::Migrate`], [`CmError::DeviceRemoval`].
    pub fn get_request(
        &self,
        timeout: Option<Duration>,
    ) -> Result<Option<ConnectRequest>, CmError> {
        let Some(ev) = self.id.channel().get_event(timeout)? else {
            return Ok(None);
        };
        match ev.kind {
            CmEventKind::ConnectRequest => {
                let Some(mut id) = ev.new_id else {
                    return Err(CmError::ConnectError { status: ev.status });
                };
                id.migrate(&EventChannel::new()?)?;
                Ok(Some(ConnectRequest {
                    id,
                    private_data: ev.private_data,
                }))
            }
            CmEventKind::DeviceRemoval => Err(CmError::DeviceRemoval),
            _ => Ok(None),
        }
    }
}

/// An incoming connection request: create the QP on [`CmId::device_context`], pre-post receives, then
/// [`CmId::accept`], or [`CmId::reject`].
#[derive(Debug)]
pub struct ConnectRequest {
    /// The new connection's id (on its own event channel).
    pub id: CmId,
    /// The peer's private data (validate with [`FlowParams::decode`](super::FlowParams::decode)).
    pub private_data: Vec<u8>,
}
