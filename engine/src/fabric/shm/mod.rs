//! The shared-memory fabric: processes on one host (or threads of one process).
//!
//! One connection = one shared segment (a sealed mode-0600 memfd passed over the control socket,
//! see [`wire`] and `cm::uds`) holding, per direction, a record ring ([`crate::record::ring`]),
//! a release ring and the sender's buffer pool. Connections take the **direct path**: the
//! application's `Connection` writes records straight into its direction's ring and reads the
//! peer's ring in place; no poller and no application↔poller ring is involved, in
//! run-to-completion and dedicated-poller mode alike (Aeron IPC's shape: the two ends of each
//! ring are the two applications' threads). A message up to the inline threshold is a `DATA`
//! record (header + payload, several small ones per cache line: an 8-byte message takes 16
//! bytes); a larger one stays in a pool buffer (zero copy) and travels as a 16-byte `BUF_REF`
//! record, the buffer coming back through the release ring once the receiving application drops
//! the message. At most `depth` messages are in flight (not yet consumed by the peer); the ring
//! holds at least `depth` records of the inline size (see [`wire::layout`] for its capacity and
//! the segment's footprint).
//!
//! * [`wire`]: the segment layout and ring protocol, and validation of everything the peer writes.
//! * `setup` (control thread / connecting thread): rendezvous, parameter negotiation (the
//!   connector's ring depth and inline size, the smaller message limit and large-slot count;
//!   the pool geometry must match, else both ends name each differing setting, [`Mismatch`]),
//!   segment creation and attachment, the direct path's handle.
//! * `direct` (the application's thread): `ShmDirect`, the direct data path
//!   (`crate::fabric::DirectPath::Shm`): sends, the batch and single receives, claims, releases.
//! * `control` (control thread): the fabric's part of the shared control half behind the
//!   engine's control seam (see [`crate::fabric`]): listeners, hang-up detection, heartbeats,
//!   reporting connections the direct path failed, teardown.
//!
//! shm has no poller side: no [`Fabric`](crate::fabric::Fabric) and no place in the pollers'
//! agent set; its control half's registry has no pollers either (`NoPollers`).

pub(crate) mod control;
pub(crate) mod direct;
mod error;
pub(crate) mod setup;
pub mod wire;

pub use error::{Mismatch, ShmSetupError};
