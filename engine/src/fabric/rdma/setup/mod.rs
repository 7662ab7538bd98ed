//! RDMA connection setup: rdma_cm connect/accept, per-device resources (PD, one CQ per poller),
//! registered pools, QP creation on the context rdma_cm resolved, receive pre-posting and the
//! flow-control handshake in the private data. Runs on the control thread (taking requests,
//! events, teardown; an accept is a [`PendingAccept`] entry, never a wait), on an accept's
//! helper thread (its pools, QP and `rdma_accept`) or on the thread calling `connect`, never on
//! a poller.
//!
//! # Files
//!
//! Layers, each using only those above it:
//!
//! - this file: [`setup_err`] and the `From<RdmaSetupError>` conversion, used by all below.
//! - `devices`: the device table ([`RdmaDevices`]): PD per device, CQ per (device, poller),
//!   poller choice ([`PollerSlot`]), CQ and SRQ reservations, each poller's SRQ.
//! - `prepare`: one connection before connect/accept: sizing, registered pools, the QP,
//!   pre-posted receives (a `Pending` connection).
//! - `establish`: [`Established`], built from a `Pending` connection and the peer's parameters
//!   once ESTABLISHED arrived.
//! - `gid`: the GID-index override (find and check the GID-table entry, the source address
//!   that selects it, the read-back of the index a connection uses, the wildcard listener's
//!   address).
//! - `connect`: the active side ([`connect()`]), with `rdma_connect` on a helper thread.
//! - `accept`: [`PendingAccept`], the listening side's accept: the helper's preparation, then
//!   the wait for ESTABLISHED, neither blocking the control thread.
//! - `listener`: [`RdmaListener`], taking and validating requests, and the helper thread that
//!   prepares and accepts each.
//! - `events`: an established connection's rdma_cm events ([`poll_events`]) and [`close`].

use super::error::{AtStep, RdmaSetupError};
use crate::error::{Error, SetupError};

mod accept;
mod connect;
mod devices;
mod establish;
mod events;
mod gid;
mod large;
mod listener;
mod prepare;

pub(crate) use accept::{AcceptStep, PendingAccept, MAX_PENDING_ACCEPTS};
pub(crate) use connect::connect;
pub(crate) use devices::{PollerSlot, RdmaDevices};
pub(crate) use establish::Established;
pub(crate) use events::{close, poll_events, ConnStatus};
pub(crate) use listener::RdmaListener;

// Here rather than in `crate::error`, beside the other `From` impls of `Error`: the whole
// `fabric::rdma` tree is feature-gated already, so this costs no `cfg` line outside it.
impl From<RdmaSetupError> for Error {
    fn from(e: RdmaSetupError) -> Error {
        Error::Setup(SetupError::Rdma(e))
    }
}

/// An [`Error::Setup`] naming the step, with the lower layer's error as its source.
fn setup_err(step: &'static str, e: impl AtStep) -> Error {
    e.at(step).into()
}
