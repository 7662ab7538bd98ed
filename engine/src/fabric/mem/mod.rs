//! The in-process fabric: both ends of a connection in one process (`mem://name`), driven by
//! the real pollers, in run-to-completion and dedicated-poller mode alike, with no system call
//! on the data path. It is what the engine's own tests run on when no sockets are wanted (with
//! [`Faults`] to drop, stall or corrupt an end), and it measures the poller path without a
//! fabric's cost: one application thread can own both ends of a connection, with one poller
//! thread between them.
//!
//! `listen("mem://name")` registers the name in a process-wide table; `connect("mem://name")`
//! from the same engine or another engine of the process finds it. The connecting thread
//! builds both ends at once (each direction's buffer pool sized by its sender's configuration;
//! the two engines' buffer sizes must match; large messages when both have them, of the smaller
//! limit) and queues the accepted end with the listener, whose control thread installs it.
//!
//! Each direction is a lock-free SPSC ring of 128-byte records between the two ends' pollers
//! and a release ring going back. A sender's send pool is the receiver's receive pool (one
//! allocation), so a message above the inline threshold is lent to the receiving application
//! in place; a smaller one is copied into the record and into the receive descriptor. Credits
//! are the receiver's delivered count, read by the sender: a receiver is never overrun and a
//! slow one back-pressures the sender (`WouldBlock`). See `datapath`.
//!
//! * `setup` (control thread / connecting thread): the listener table, the pools and rings.
//! * `datapath` (poller): [`MemFabric`] / [`MemConn`].
//! * `control` (control thread): the `mem` part of the shared control half (listeners, installs,
//!   teardown; an accepted end needs no handshake), see [`crate::fabric`].
//!
//! Liveness and close behave as on the other poller fabrics: an end's close is seen by its peer
//! as [`Error::Disconnected`](crate::Error::Disconnected) (after what was sent before it is
//! delivered); with a liveness timeout, an end whose peer stops serving fails with
//! [`FabricError::PeerUnresponsive`](crate::FabricError::PeerUnresponsive); a corrupt record
//! fails its connection with [`FabricError::Protocol`](crate::FabricError::Protocol).

pub(crate) mod control;
mod datapath;
pub(crate) mod setup;
#[cfg(test)]
mod tests;

use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use datapath::{MemConn, MemFabric, RECORD_INLINE};
pub use setup::MemSetupError;

use datapath::{Channel, FAULT_CORRUPT, FAULT_DEAD, FAULT_STALL, FAULT_UNSERVED};

/// Which end of a `mem://` connection a fault hits.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The end made by `connect`.
    Connecting,
    /// The end handed to the listener.
    Accepted,
}

impl End {
    fn index(self) -> usize {
        match self {
            End::Connecting => 0,
            End::Accepted => 1,
        }
    }
}

/// Fault injection on one `mem://` connection (tests).
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Faults {
    chan: Arc<Channel>,
}

impl Faults {
    /// The latest connection made to `endpoint` (`mem://name` or `name`) in this process, if
    /// it is still alive.
    pub fn latest(endpoint: &str) -> Option<Faults> {
        let name = endpoint.strip_prefix("mem://").unwrap_or(endpoint);
        let chan = setup::latest().get(name)?.upgrade()?;
        Some(Faults { chan })
    }

    /// `end` dies, as if its process did: it stops serving for good and its peer sees its
    /// close.
    pub fn kill(&self, end: End) {
        let e = &self.chan.ends[end.index()];
        e.faults.fetch_or(FAULT_DEAD, Ordering::Relaxed);
        self.chan.close(end.index());
    }

    /// `end` stops serving (as under `SIGSTOP`): it neither sends, receives, returns credits
    /// nor proves it is alive, until [`resume`](Self::resume).
    pub fn stall(&self, end: End) {
        self.chan.ends[end.index()]
            .faults
            .fetch_or(FAULT_STALL, Ordering::Relaxed);
    }

    /// `end` serves again after [`stall`](Self::stall).
    pub fn resume(&self, end: End) {
        self.chan.ends[end.index()]
            .faults
            .fetch_and(!FAULT_STALL, Ordering::Relaxed);
    }

    /// The next record `end` sends is corrupted: its peer must fail the connection with
    /// [`FabricError::Protocol`](crate::FabricError::Protocol).
    pub fn corrupt_next(&self, end: End) {
        self.chan.ends[end.index()]
            .faults
            .fetch_or(FAULT_CORRUPT, Ordering::Relaxed);
    }

    /// `end` holds an operation that only its peer could complete, as an RDMA READ of a large
    /// message does: once it has seen the peer's close, it never settles, and every pass
    /// reports the close again (Soft-iWARP's connections when the peer dies mid-transfer). Its
    /// application must still get what the peer sent, then the disconnect.
    pub fn wait_on_peer(&self, end: End) {
        self.chan.ends[end.index()]
            .faults
            .fetch_or(FAULT_UNSERVED, Ordering::Relaxed);
    }
}
