//! The listening side's accept as a state machine ([`PendingAccept`]), so that the control
//! thread never waits: the connection's pools and QP are made and the request accepted on a
//! short-lived helper thread (registering the pools pins their memory: about a second for
//! 48-MiB large slots under the Soft-RoCE VM, time in which the control thread keeps beating);
//! then the entry waits for ESTABLISHED on the accepted id's own event channel. The control
//! thread watches the entry's descriptor, advances it when that is readable, and drops it at
//! its deadline.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use cm::rdma::{self as rcm, CmError, CmEventKind, ConnOptions, FlowParams};

use super::establish::{finish, Established};
use super::prepare::Pending;
use super::setup_err;
use crate::config::Config;
use crate::error::Error;
use crate::fabric::rdma::datapath::LargeRegion;
use crate::fabric::rdma::error::RdmaSetupError;

/// How long the listening side gives an accept, from taking the request to ESTABLISHED (the
/// helper's preparation included). The control thread does not wait: the accept is a
/// [`PendingAccept`] entry with this deadline.
pub(crate) const ACCEPT_TIMEOUT: Duration = Duration::from_secs(2);

/// Most accepted requests pending at once (over every listener), preparing or waiting for
/// ESTABLISHED; beyond that a request is rejected at once. Bounds what stalled peers can hold
/// (and how many helper threads prepare at once).
pub(crate) const MAX_PENDING_ACCEPTS: usize = 1024;

/// An accepted connection request on its way to ESTABLISHED (listening side). The control
/// thread watches [`fd`](Self::fd), calls [`advance`](Self::advance) when it is readable and
/// drops the entry at its [`deadline`](Self::deadline) (destroying the QP and the id; a
/// preparation still running drops them on its helper thread when it ends). A peer that never
/// completes costs this entry until then, never control-thread time.
pub(crate) struct PendingAccept {
    state: State,
    deadline: Instant,
}

/// Where a [`PendingAccept`] is.
enum State {
    /// The helper thread makes the pools and the QP, pre-posts the receives and accepts;
    /// `done` gets its result, and then `wake` becomes readable (the helper closes its end).
    Preparing {
        done: Receiver<Result<Accepted, Error>>,
        wake: UnixStream,
    },
    /// Accepted: waiting for ESTABLISHED on the id's own event channel.
    Accepted(Box<Accepted>),
}

/// A prepared and accepted connection request, waiting for ESTABLISHED.
pub(super) struct Accepted {
    pub(super) pending: Pending,
    /// The peer's flow-control parameters from its request (validated).
    pub(super) peer: FlowParams,
    /// The peer's large send region from its request (validated).
    pub(super) peer_large: LargeRegion,
    pub(super) peer_addr: String,
    pub(super) addr: std::net::SocketAddr,
    pub(super) opts: ConnOptions,
}

/// Where [`PendingAccept::advance`] left an accept.
pub(crate) enum AcceptStep {
    /// Still preparing, or no ESTABLISHED yet.
    Pending(Box<PendingAccept>),
    /// Established: the connection is set up.
    Done(Box<Established>),
}

impl PendingAccept {
    /// An accept being prepared on a helper thread, which sends its result on `done` and then
    /// makes `wake` readable (closes the other end of its socket pair).
    pub(super) fn preparing(
        done: Receiver<Result<Accepted, Error>>,
        wake: UnixStream,
        deadline: Instant,
    ) -> PendingAccept {
        PendingAccept {
            state: State::Preparing { done, wake },
            deadline,
        }
    }

    /// The descriptor to watch for `POLLIN`: the helper's wake-up while preparing, then the
    /// id's event channel.
    pub(crate) fn fd(&self) -> RawFd {
        match &self.state {
            State::Preparing { wake, .. } => wake.as_raw_fd(),
            State::Accepted(a) => a.pending.id.channel().fd(),
        }
    }

    /// When the accept fails if ESTABLISHED has not arrived.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Takes the helper's result if it is there, then reads the id's next event without
    /// waiting: ESTABLISHED finishes the setup, any other event fails it, none leaves it
    /// pending.
    ///
    /// # Errors
    ///
    /// The preparation's or the accept's error, the failure event's typed error (REJECTED,
    /// CONNECT_ERROR, DISCONNECTED, ...), or the setup's;
    /// [`RdmaSetupError::AcceptThreadLost`] when the helper ended without a result.
    pub(crate) fn advance(self, cfg: &Config) -> Result<AcceptStep, Error> {
        let deadline = self.deadline;
        let a = match self.state {
            State::Preparing { done, wake } => match done.try_recv() {
                Ok(r) => Box::new(r?),
                Err(TryRecvError::Empty) => {
                    return Ok(AcceptStep::Pending(Box::new(PendingAccept::preparing(
                        done, wake, deadline,
                    ))))
                }
                Err(TryRecvError::Disconnected) => {
                    return Err(RdmaSetupError::AcceptThreadLost.into())
                }
            },
            State::Accepted(a) => a,
        };
        // Accepted (just now, or earlier): ESTABLISHED may be there already.
        let what = "waiting for ESTABLISHED";
        match a.pending.id.channel().try_event() {
            Ok(None) => Ok(AcceptStep::Pending(Box::new(PendingAccept {
                state: State::Accepted(a),
                deadline,
            }))),
            Ok(Some(ev)) if ev.kind == CmEventKind::Established => {
                let Accepted {
                    pending,
                    peer,
                    peer_large,
                    peer_addr,
                    opts,
                    ..
                } = *a;
                finish(pending, peer, peer_large, cfg, &opts, peer_addr)
                    .map(|e| AcceptStep::Done(Box::new(e)))
            }
            Ok(Some(ev)) => Err(setup_err(
                what,
                rcm::event_error(&ev, a.addr).unwrap_or(CmError::UnexpectedEvent {
                    expected: CmEventKind::Established.name(),
                    got: ev.kind.name(),
                }),
            )),
            Err(e) => Err(setup_err(what, e)),
        }
    }

    /// The error for an accept that was not established by the deadline: still preparing
    /// (its memory not registered yet, or `rdma_accept` not returned), or accepted and waiting
    /// for ESTABLISHED.
    pub(crate) fn timed_out(&self) -> Error {
        let (what, step) = match self.state {
            State::Preparing { .. } => ("preparing the accept", "pools, QP and rdma_accept"),
            State::Accepted(_) => ("waiting for ESTABLISHED", CmEventKind::Established.name()),
        };
        setup_err(
            what,
            CmError::Timeout {
                step,
                waited: ACCEPT_TIMEOUT,
            },
        )
    }
}
