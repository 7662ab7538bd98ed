//! Accepts whose handshake waits on the peer: [`PendingSetup`] entries with deadlines in a
//! fabric's [`Handshakes`] table.

use std::os::fd::RawFd;
use std::time::Instant;

use crate::error::Error;
use crate::event::Event;

use super::Ctx;

/// An accepted connection whose handshake waits on the peer (shm's and TCP's `Handshake`,
/// RDMA's `PendingAccept`): an entry of a [`Handshakes`] table.
pub(crate) trait PendingSetup {
    /// The descriptor that becomes readable when the peer's next message arrives.
    fn fd(&self) -> RawFd;

    /// When the current step fails if the peer has not answered.
    fn deadline(&self) -> Instant;

    /// The error reported ([`Event::Error`], no connection) when the deadline has passed.
    fn timed_out(&self) -> Error;
}

/// Where one step of a pending handshake left it.
pub(crate) enum Step<H, E> {
    /// Still waiting on the peer.
    Pending(H),
    /// Done: the connection is set up (the fabric's `Established`).
    Done(E),
}

/// The pending-handshake table of a fabric's control half: accepted connections whose handshake
/// is under way, each with its listener's id, at most `max` at once (over every listener).
///
/// Their descriptors follow the registry's in the poll set, in table order
/// ([`watch`](Self::watch)); the control half advances those with input, [`expire`](Self::expire)
/// drops those whose deadline passed. Dropping an entry closes its connection attempt.
pub(crate) struct Handshakes<H> {
    /// The entries with their listeners' ids, in poll-set order.
    pub(super) entries: Vec<(u64, H)>,
    /// How many of `entries` the last [`watch`](Self::watch) appended.
    pub(super) watched: usize,
    max: usize,
}

impl<H: PendingSetup> Handshakes<H> {
    pub(crate) fn new(max: usize) -> Self {
        Handshakes {
            entries: Vec::new(),
            watched: 0,
            max,
        }
    }

    /// At the cap: a new connection is to be refused as busy.
    pub(crate) fn is_full(&self) -> bool {
        self.entries.len() >= self.max
    }

    /// Drops listener `lid`'s entries (it is gone).
    pub(crate) fn unlisten(&mut self, lid: u64) {
        self.entries.retain(|(l, _)| *l != lid);
    }

    /// Drops every entry (engine shutdown).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// The earliest deadline of the entries.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.entries.iter().map(|(_, h)| h.deadline()).min()
    }

    /// Appends the entries' descriptors, in table order.
    pub(crate) fn watch(&mut self, fds: &mut Vec<libc::pollfd>) {
        for (_, h) in &self.entries {
            fds.push(libc::pollfd {
                fd: h.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        self.watched = self.entries.len();
    }

    /// Drops the entries whose deadline has passed at `now`, reporting each
    /// ([`PendingSetup::timed_out`]).
    pub(crate) fn expire(&mut self, ctx: &mut Ctx<'_>, now: Instant) {
        if self.entries.iter().any(|(_, h)| h.deadline() <= now) {
            let (late, keep) = std::mem::take(&mut self.entries)
                .into_iter()
                .partition(|(_, h)| h.deadline() <= now);
            self.entries = keep;
            for (_, h) in late {
                ctx.emit(Event::Error {
                    conn: None,
                    error: h.timed_out(),
                });
            }
        }
    }
}
