//! The listening side's wait for ESTABLISHED as a state machine ([`PendingAccept`]), so that the
//! control thread never waits: it watches the accepted id's event channel and advances the entry
//! when it is readable, or drops it at its deadline.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use cm::rdma::{self as rcm, CmError, CmEventKind, ConnOptions, FlowParams};

use super::establish::{finish, Established};
use super::prepare::Pending;
use super::setup_err;
use crate::config::Config;
use crate::error::Error;
use crate::fabric::rdma::datapath::LargeRegion;

/// How long the listening side waits for ESTABLISHED after accepting. The control thread does
/// not wait: the accepted id is a [`PendingAccept`] entry with this deadline.
pub(crate) const ACCEPT_TIMEOUT: Duration = Duration::from_secs(2);

/// Most accepted requests waiting for ESTABLISHED at once (over every listener); beyond that a
/// request is rejected at once. Bounds what stalled peers can hold.
pub(crate) const MAX_PENDING_ACCEPTS: usize = 1024;

/// An accepted connection request waiting for ESTABLISHED (listening side). The control thread
/// watches [`fd`](Self::fd) (the id's own event channel), calls [`advance`](Self::advance) when
/// it is readable and drops the entry at its [`deadline`](Self::deadline) (destroying the QP and
/// the id). A peer that never completes costs this entry until then, never control-thread time.
pub(crate) struct PendingAccept {
    pub(super) pending: Pending,
    /// The peer's flow-control parameters from its request (validated).
    pub(super) peer: FlowParams,
    /// The peer's large send region from its request (validated).
    pub(super) peer_large: LargeRegion,
    pub(super) peer_addr: String,
    pub(super) addr: std::net::SocketAddr,
    pub(super) opts: ConnOptions,
    pub(super) deadline: Instant,
}

/// Where [`PendingAccept::advance`] left an accept.
pub(crate) enum AcceptStep {
    /// No ESTABLISHED yet.
    Pending(Box<PendingAccept>),
    /// Established: the connection is set up.
    Done(Box<Established>),
}

impl PendingAccept {
    /// The event channel to watch for `POLLIN`.
    pub(crate) fn fd(&self) -> RawFd {
        self.pending.id.channel().fd()
    }

    /// When the accept fails if ESTABLISHED has not arrived.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Reads the id's next event without waiting: ESTABLISHED finishes the setup, any other
    /// event fails it, none leaves it pending.
    ///
    /// # Errors
    ///
    /// The failure event's typed error (REJECTED, CONNECT_ERROR, DISCONNECTED, ...), or the
    /// setup's.
    pub(crate) fn advance(self: Box<Self>, cfg: &Config) -> Result<AcceptStep, Error> {
        let what = "waiting for ESTABLISHED";
        match self.pending.id.channel().try_event() {
            Ok(None) => Ok(AcceptStep::Pending(self)),
            Ok(Some(ev)) if ev.kind == CmEventKind::Established => {
                let PendingAccept {
                    pending,
                    peer,
                    peer_large,
                    peer_addr,
                    opts,
                    ..
                } = *self;
                finish(pending, peer, peer_large, cfg, &opts, peer_addr)
                    .map(|e| AcceptStep::Done(Box::new(e)))
            }
            Ok(Some(ev)) => Err(setup_err(
                what,
                rcm::event_error(&ev, self.addr).unwrap_or(CmError::UnexpectedEvent {
                    expected: CmEventKind::Established.name(),
                    got: ev.kind.name(),
                }),
            )),
            Err(e) => Err(setup_err(what, e)),
        }
    }

    /// The error for an accept whose ESTABLISHED did not come by the deadline.
    pub(crate) fn timed_out(&self) -> Error {
        setup_err(
            "waiting for ESTABLISHED",
            CmError::Timeout {
                step: CmEventKind::Established.name(),
                waited: ACCEPT_TIMEOUT,
            },
        )
    }
}
