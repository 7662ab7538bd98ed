//! The shared-memory fabric: processes on one host (or threads of one process).
//!
//! One connection = one shared segment (a sealed mode-0600 memfd passed over the control socket,
//! see [`wire`] and `cm::uds`) holding both directions' descriptor rings, release rings and buffer
//! pools. Each side writes messages into the pool of the direction it sends on; the receiver reads
//! them in place (zero copy) and returns the buffer through the release ring when the application
//! drops the message. Messages up to the inline threshold travel inside the descriptor ring
//! itself (one 64-byte slot for up to 40 bytes): one cache-line transfer per message.
//!
//! * [`wire`]: the segment layout and ring protocol, and validation of everything the peer writes.
//! * `setup` (control thread / connecting thread): rendezvous, parameter negotiation, segment
//!   creation and attachment.
//! * `datapath` (poller): [`ShmFabric`] / [`ShmConn`], the [`Fabric`](super::Fabric) implementation.
//! * `control` (control thread): the fabric's control half behind the engine's control seam (see
//!   [`crate::fabric`]): listeners, hang-up detection, heartbeats, teardown.

pub(crate) mod control;
mod datapath;
pub(crate) mod direct;
mod error;
pub(crate) mod setup;
pub mod wire;

pub use datapath::{ShmConn, ShmFabric};
pub use error::ShmSetupError;
