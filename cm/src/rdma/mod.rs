//! rdma_cm connection management for the control thread (feature `rdma`).
//!
//! This module is the workspace's only librdmacm FFI. It owns rdma_cm event channels and ids and
//! turns rdma_cm events into typed [`CmEvent`]s and [`CmError`]s:
//!
//! - [`EventChannel`] (`channel`): one rdma_cm event channel; its fd can be made non-blocking and
//!   polled by the control thread's loop ([`EventChannel::try_event`]) or waited on with a
//!   timeout ([`EventChannel::get_event`]).
//! - [`CmId`] (`id`): one rdma_cm id. The listener binds and listens on one; each connection
//!   uses its own id with its own event channel (accepted ids are migrated to a fresh channel),
//!   so the events of one connection never interleave with another's. [`event_error`] maps
//!   failure events to typed errors.
//! - [`CmListener`] (`listener`): a bound, listening id yielding [`ConnectRequest`]s;
//!   [`resolve`] starts the active side ([`resolve_from`] from a given source address, which
//!   is how a source GID is chosen: rdma_cm takes the GID that owns the address).
//! - [`FlowParams`] and [`CmRejectReason`] (`private_data`): the flow-control parameters
//!   (initial credits, buffer size, inline size) exchanged in the connect/accept private data
//!   and validated on receipt, and the reason sent with a reject.
//! - [`ConnOptions`]: deliberate retry settings. The data path's credits guarantee that a
//!   receive is always posted, so RNR must never happen: `rnr_retry_count` defaults to 0, which
//!   turns a (buggy) RNR into an immediate error completion instead of a silent stall, and
//!   `min_rnr_timer` (0.01 ms instead of rdma_cm's 655 ms) is for the verbs layer to set on the
//!   QP after establishment.
//!
//! # The verbs boundary
//!
//! libibverbs objects (PD, CQ, SRQ, QP wrappers) belong to the engine's verbs layer; no raw
//! verbs pointer leaves this module through a safe function. rdma_cm resolves the device:
//! [`CmId::device_context`] hands it out as a [`DeviceContext`], which holds librdmacm's
//! reference on the device and gives its `ibv_context` only through the `unsafe`
//! [`DeviceContext::as_ptr`]. The QP is created by rdma_cm on the id ([`CmId::create_qp`],
//! `unsafe`: the caller vouches for its PD/CQ/SRQ pointers), the id destroys it when dropped,
//! and the verbs layer reaches it through the `unsafe` [`CmId::qp_ptr`] while holding the id.

mod addr;
mod channel;
mod device;
mod error;
mod id;
mod listener;
mod private_data;

use std::net::SocketAddr;
use std::time::Instant;

pub use addr::resolve_host;
pub use channel::{CmEventKind, EventChannel};
pub use device::DeviceContext;
pub use error::CmError;
pub use id::{event_error, CmEvent, CmId, ConnOptions, PathInfo};
pub use listener::{CmListener, ConnectRequest};
pub use private_data::{CmRejectReason, FlowParams, PrivateDataError};

/// Starts an active connection: creates an id on a fresh channel, resolves address and route
/// (each bounded by `opts.resolve_timeout_ms` and `deadline`). The caller then creates the QP,
/// pre-posts receives and calls [`CmId::connect`] + [`CmId::wait_for`] `Established`.
///
/// # Errors
/// [`CmError::ResolveAddr`], [`CmError::AddrError`], [`CmError::ResolveRoute`],
/// [`CmError::RouteError`], [`CmError::Timeout`], and channel/id creation errors.
pub fn resolve(dst: SocketAddr, opts: &ConnOptions, deadline: Instant) -> Result<CmId, CmError> {
    resolve_from(None, dst, opts, deadline)
}

/// [`resolve`] from the local address `src` (see [`CmId::resolve_addr_from`]): rdma_cm then
/// uses the device, port and source GID that own `src`.
///
/// # Errors
/// As [`resolve`].
pub fn resolve_from(
    src: Option<SocketAddr>,
    dst: SocketAddr,
    opts: &ConnOptions,
    deadline: Instant,
) -> Result<CmId, CmError> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    id.resolve_addr_from(src, dst, opts.resolve_timeout_ms)?;
    id.wait_for(CmEventKind::AddrResolved, deadline, dst)?;
    id.resolve_route(opts.resolve_timeout_ms)?;
    id.wait_for(CmEventKind::RouteResolved, deadline, dst)?;
    Ok(id)
}
