//! [`EventChannel`] (one rdma_cm event channel) and the typed event kinds ([`CmEventKind`]).
//!
//! Reading events ([`EventChannel::get_event`], [`EventChannel::try_event`]) is implemented in
//! the `id` module: an event for a connect request carries a new [`CmId`](super::CmId), and
//! ids hold their channel, so this module stays below `id`.

use std::fmt;
use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as ffi;
use rdma_sys::rdma_cm_event_type as et;

use super::CmError;

/// Typed rdma_cm event kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmEventKind {
    /// ADDR_RESOLVED.
    AddrResolved,
    /// ADDR_ERROR.
    AddrError,
    /// ROUTE_RESOLVED.
    RouteResolved,
    /// ROUTE_ERROR.
    RouteError,
    /// CONNECT_REQUEST (passive side; carries the new id).
    ConnectRequest,
    /// CONNECT_RESPONSE (only for ids without a QP; not used here).
    ConnectResponse,
    /// CONNECT_ERROR.
    ConnectError,
    /// UNREACHABLE.
    Unreachable,
    /// REJECTED.
    Rejected,
    /// ESTABLISHED.
    Established,
    /// DISCONNECTED.
    Disconnected,
    /// DEVICE_REMOVAL.
    DeviceRemoval,
    /// ADDR_CHANGE.
    AddrChange,
    /// TIMEWAIT_EXIT.
    TimewaitExit,
    /// Any other event (multicast, unknown).
    Other(u32),
}

impl CmEventKind {
    pub(super) fn from_raw(e: u32) -> Self {
        match e {
            et::RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            et::RDMA_CM_EVENT_ADDR_ERROR => Self::AddrError,
            et::RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            et::RDMA_CM_EVENT_ROUTE_ERROR => Self::RouteError,
            et::RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            et::RDMA_CM_EVENT_CONNECT_RESPONSE => Self::ConnectResponse,
            et::RDMA_CM_EVENT_CONNECT_ERROR => Self::ConnectError,
            et::RDMA_CM_EVENT_UNREACHABLE => Self::Unreachable,
            et::RDMA_CM_EVENT_REJECTED => Self::Rejected,
            et::RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            et::RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            et::RDMA_CM_EVENT_DEVICE_REMOVAL => Self::DeviceRemoval,
            et::RDMA_CM_EVENT_ADDR_CHANGE => Self::AddrChange,
            et::RDMA_CM_EVENT_TIMEWAIT_EXIT => Self::TimewaitExit,
            other => Self::Other(other),
        }
    }

    /// rdma_cm's name for the event (e.g. `"RDMA_CM_EVENT_REJECTED"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            Self::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            Self::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            Self::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            Self::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            Self::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            Self::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            Self::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            Self::Rejected => "RDMA_CM_EVENT_REJECTED",
            Self::Established => "RDMA_CM_EVENT_ESTABLISHED",
            Self::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            Self::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            Self::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            Self::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
            Self::Other(_) => "RDMA_CM_EVENT_OTHER",
        }
    }
}

/// An rdma_cm event channel.
pub struct EventChannel {
    raw: NonNull<ffi::rdma_event_channel>,
}

// SAFETY: rdma_cm event channels may be used from any thread (librdmacm is thread safe).
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

impl EventChannel {
    /// Creates an event channel.
    ///
    /// # Errors
    /// [`CmError::CreateChannel`].
    pub fn new() -> Result<Arc<Self>, CmError> {
        // SAFETY: plain constructor.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        let raw =
            NonNull::new(raw).ok_or_else(|| CmError::CreateChannel(io::Error::last_os_error()))?;
        Ok(Arc::new(Self { raw }))
    }

    /// The raw channel, for the rdma_cm calls of this module.
    pub(super) fn raw(&self) -> *mut ffi::rdma_event_channel {
        self.raw.as_ptr()
    }

    /// The channel's file descriptor (readable when an event is pending).
    pub fn fd(&self) -> RawFd {
        // SAFETY: valid channel.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Makes [`EventChannel::try_event`] usable from a poll loop (`O_NONBLOCK` on the fd).
    ///
    /// # Errors
    /// [`CmError::Fcntl`].
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<(), CmError> {
        let fd = self.fd();
        // SAFETY: fcntl on a valid fd.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(CmError::Fcntl(io::Error::last_os_error()));
        }
        let flags = if nonblocking {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: fcntl on a valid fd.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
            return Err(CmError::Fcntl(io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id holds an Arc to its channel, so none is left; events were acked.
        unsafe { ffi::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}
