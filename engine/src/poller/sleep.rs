//! [`IdleStrategy::Block`](crate::IdleStrategy::Block) for the pollers: a [`Sleeper`] per agent
//! set (its wake-up and its `poll(2)` set), and each poller's part of arming ([`Poller::arm`]).
//!
//! The protocol ([`crate::wake`]): announce, fence, arm and re-check every source (the command
//! ring, each connection's send and release rings, each fabric's shared and per-connection
//! sources), then one `poll(2)` on the wake-up's eventfd and every descriptor the fabrics
//! added. Whoever hands the poller work (the application's send, flush, release and close; the
//! control thread's command; a `mem://` peer's poller; the kernel, for a socket or a completion
//! channel) wakes it. This runs only once an idle stretch outlasted the strategy's spin phase,
//! so its system calls are off the data path.

use std::sync::Arc;
use std::time::Duration;

use super::Poller;
use crate::fabric::{Fabric, FabricConn};
use crate::stats::PollerCounters;
use crate::wake::{PollerWake, WaitSet};

/// How a [`Sleeper::sleep`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slept {
    /// It did not sleep: work was pending when it armed.
    No,
    /// A wake-up or a descriptor ended it.
    Woken,
    /// It ran to the caller's `max`.
    Timeout,
    /// It ran to a shorter bound of its own: the liveness tick, or a source polled every
    /// [`WaitSet::POLL_INTERVAL`].
    Tick,
}

/// One agent set's sleep: its wake-up and the set it waits on (room allocated once).
pub(crate) struct Sleeper {
    wake: Arc<PollerWake>,
    set: WaitSet,
    counters: Arc<PollerCounters>,
    /// The longest sleep the liveness checks allow (heartbeats, the peer's silence).
    tick: Duration,
}

impl Sleeper {
    /// A sleeper for a set of at most `max_conns` connections per fabric.
    ///
    /// # Errors
    ///
    /// The eventfd could not be made.
    pub(crate) fn new(
        counters: Arc<PollerCounters>,
        max_conns: usize,
        tick: Duration,
    ) -> std::io::Result<Sleeper> {
        Ok(Sleeper {
            wake: Arc::new(PollerWake::new()?),
            // The wake-up, a descriptor per connection and a few shared ones (completion
            // channels); more bounds the sleep rather than growing the set.
            set: WaitSet::with_capacity(max_conns.saturating_add(8)),
            counters,
            tick,
        })
    }

    pub(crate) fn wake(&self) -> Arc<PollerWake> {
        self.wake.clone()
    }

    /// Announces, arms (`arm`: `false` when work is pending) and sleeps at most `max` (and
    /// the tick). Unless [`Slept::No`], the caller lets the fabrics consume what woke them.
    pub(crate) fn sleep(&mut self, max: Duration, arm: impl FnOnce(&mut WaitSet) -> bool) -> Slept {
        self.set.clear();
        self.set.add(self.wake.fd(), true, false);
        self.wake.announce();
        if !arm(&mut self.set) {
            self.wake.cancel();
            return Slept::No;
        }
        self.counters.sleeps.add(1);
        let limited = self.tick < max || self.set.limited(max);
        let ready = self.set.wait(max.min(self.tick));
        self.wake.cancel();
        if self.set.ready(0) {
            self.wake.drain();
        }
        match (ready, limited) {
            (0, false) => {
                self.counters.sleep_timeouts.add(1);
                Slept::Timeout
            }
            (0, true) => {
                self.counters.sleep_timeouts.add(1);
                Slept::Tick
            }
            _ => Slept::Woken,
        }
    }
}

impl<F: Fabric> Poller<F> {
    /// After the announcement: adds this poller's sources to `set` and re-checks them; `false`
    /// when work is pending (a command, something the application queued or released, a
    /// connection closing or draining, a fabric source with work).
    pub(crate) fn arm(&mut self, set: &mut WaitSet) -> bool {
        if !self.commands.is_empty() || !self.backlog.is_empty() || self.unserved {
            return false;
        }
        let mut table = crate::fabric::ConnTable {
            slots: &mut self.slots,
        };
        if !self.fabric.arm(&mut table, set) {
            return false;
        }
        for &slot in &self.active {
            let Some(Some(conn)) = self.slots.get_mut(slot as usize) else {
                continue;
            };
            if conn.closing || conn.draining || !conn.tx.is_empty() || !conn.release.is_empty() {
                return false;
            }
            if !conn.drained {
                // Received messages wait for room in the application's ring, and taking one
                // from it wakes nobody: look again soon.
                set.limit(WaitSet::POLL_INTERVAL);
            }
            if !conn.fabric.arm(set) {
                return false;
            }
        }
        true
    }

    /// After a sleep: the fabric consumes what woke it.
    pub(crate) fn woke(&mut self) {
        self.fabric.woke();
    }
}
