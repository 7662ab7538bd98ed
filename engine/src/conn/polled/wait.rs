//! The polled path's waits: [`Connection::recv_timeout`] and [`Connection::wait_timeout`] after
//! their first look found nothing, spinning, backing off or sleeping as the idle strategy says.

use std::time::Duration;

use super::{Polled, RTC_BELL_SLEEP};
use crate::conn::spare::{Next, Wait};
use crate::conn::{Connection, Message};
use crate::error::Error;
use crate::idle::IdleStrategy;
use crate::poller::Slept;

impl Polled {
    /// [`Connection::recv_timeout`] after its first try found nothing.
    pub(in crate::conn) fn recv_wait<'c>(
        &'c self,
        conn: &'c Connection,
        mut wait: Wait,
    ) -> Result<Message<'c>, Error> {
        if self.block {
            return self.recv_block(conn, wait);
        }
        // Run-to-completion and busy-spinning: hold the poller for the whole wait (one
        // ownership CAS per wait, not per cycle). This thread keeps serving other connections.
        let mut guard = if self.run_to_completion && conn.idle == IdleStrategy::BusySpin {
            conn.engine.rtc_guard()
        } else {
            None
        };
        loop {
            let work = match guard.as_mut() {
                Some(g) => {
                    if let Some(m) = self.pop_rx(conn) {
                        return Ok(m);
                    }
                    if !self.direct {
                        g.poll(conn.engine.now_ns())
                    } else if let Some(m) = self.recv_direct(conn, g) {
                        return Ok(m);
                    } else {
                        g.poll_after_empty_take(conn.engine.now_ns())
                    }
                }
                None => 0,
            };
            if work > 0 || guard.is_none() {
                match self.try_recv(conn) {
                    Ok(Some(m)) => return Ok(m),
                    Ok(None) => {}
                    Err(e) => return Err(e),
                }
            } else if let Some(d) = conn.shared.down() {
                if let Some(m) = self.pop_rx(conn) {
                    return Ok(m);
                }
                return Err(d.to_error());
            }
            if !wait.idle(work) {
                return Err(Error::Timeout);
            }
        }
    }

    /// [`Connection::recv_timeout`] with [`IdleStrategy::Block`]: spins for the strategy's spin
    /// phase, then sleeps until a message arrives ([`sleep`](Self::sleep)).
    fn recv_block<'c>(
        &'c self,
        conn: &'c Connection,
        mut wait: Wait,
    ) -> Result<Message<'c>, Error> {
        loop {
            if let Some(m) = self.try_recv(conn)? {
                return Ok(m);
            }
            match wait.next(0) {
                Next::Again => {}
                Next::Sleep(max) => self.sleep(conn, max),
                Next::Timeout => return Err(Error::Timeout),
            }
        }
    }

    /// One sleep of a `Block` wait for a message, for at most `max`. Run-to-completion: this
    /// thread is the poller when nobody else drives it, and sleeps in the poller's `poll(2)`
    /// set (what wakes the poller wakes it). With dedicated pollers (or while another thread
    /// drives the run-to-completion poller) it sleeps on the connection's doorbell, which the
    /// poller rings after delivering into its receive ring; in run-to-completion each such
    /// sleep is bounded by [`RTC_BELL_SLEEP`] (the driving thread may stop driving, and nobody
    /// would ring).
    ///
    /// Counted in [`ConnStats::sleeps`](crate::ConnStats): a sleep that a wake-up ended is
    /// rung, one that ran to `max` unrung; a sleep that ended at a bound of the poller's own
    /// (its liveness tick, a source it polls) or at [`RTC_BELL_SLEEP`] is a turn of the wait,
    /// not counted.
    fn sleep(&self, conn: &Connection, max: Duration) {
        let mut t = max;
        if self.run_to_completion {
            if let Some(mut g) = conn.engine.rtc_guard() {
                let rung = match g.sleep(t) {
                    Slept::No | Slept::Tick => None,
                    Slept::Woken => Some(true),
                    Slept::Timeout => Some(false),
                };
                drop(g);
                // SAFETY: no other reference to the state is live; none is taken while this
                // one is used.
                unsafe { self.state() }.counts.slept(rung);
                return;
            }
            t = t.min(RTC_BELL_SLEEP);
        }
        let bell = conn.shared.bell();
        let announced = bell.announce();
        if !self.rx_is_empty() || conn.shared.down().is_some() {
            bell.cancel();
            return;
        }
        let rung = bell.sleep(announced, t);
        if rung || t == max {
            // SAFETY: as above.
            unsafe { self.state() }.counts.slept(Some(rung));
        }
    }

    /// [`Connection::wait_timeout`].
    pub(in crate::conn) fn wait(&self, conn: &Connection, mut wait: Wait) -> Result<(), Error> {
        loop {
            if !self.rx_is_empty() {
                return Ok(());
            }
            let work = self.drive(conn);
            if !self.rx_is_empty() {
                return Ok(());
            }
            if let Some(d) = conn.shared.down() {
                return if self.rx_is_empty() {
                    Err(d.to_error())
                } else {
                    Ok(())
                };
            }
            match wait.next(work) {
                Next::Again => {}
                // Block: as `recv_timeout` sleeps.
                Next::Sleep(max) => self.sleep(conn, max),
                Next::Timeout => return Err(Error::Timeout),
            }
        }
    }
}
