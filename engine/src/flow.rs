//! Flow control: the credit window every path and fabric uses.
//!
//! One policy, two halves, in the shape of Aeron's flow-control strategy object: the sender
//! keeps a [`SendWindow`] (how much it may still put in flight), the receiver keeps a
//! [`CreditReturn`] (how much room it has made since it last told the sender, and whether that
//! is worth telling now). A [`Policy`], derived once from the engine's configuration (and, where
//! a fabric negotiates, the peer's), sizes both halves, so the window of the polled path, of
//! shm's direct path, of tcp and of RDMA is set in this one place.
//!
//! Both halves count *cumulatively* (units sent, units credited back, units consumed, units
//! returned), so a credit report is an absolute count, idempotent and cheap to validate: it can
//! never go backwards and never exceed what was sent. A unit is a message or a byte
//! ([`Unit`]); a byte window suits a byte stream (tcp) whose receiver's room is bytes.
//!
//! Nothing here allocates, locks or makes a syscall; every method is a few integer operations
//! and is meant to be inlined into the data path.
//!
//! ```text
//!   sender                                      receiver
//!   SendWindow::has_room / on_sent  --data-->   CreditReturn::on_consumed
//!   SendWindow::credit_to(total)  <--credits--  CreditReturn::due -> take()
//! ```
//!
//! The invariant the pair keeps: `sent - credited <= window`, and the receiver returns a unit
//! only once it can take one more, so a receiver with `window` units of room is never overrun.
//! One exception, for byte windows, where messages differ in size: a message larger than the
//! room left is still admitted while less than a return batch is in flight
//! ([`SendWindow::has_room`]), so then `sent - credited < return_batch + units` of that message.
//! Without it the pair could deadlock: a sender stalled with less than a return batch in flight
//! waits for credits a receiver returns only once a batch is owed. (A message window, one unit
//! per message, never takes the exception: `in_flight < return_batch <= window` already fits.)

use core::fmt;

use crate::config::Config;

/// What a window counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// One unit per message, whatever its size (the pool-buffer paths: a message takes one
    /// receive buffer).
    Messages,
    /// One unit per payload byte (a byte stream whose receiver's room is bytes).
    Bytes,
}

/// The window policy of one direction of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// What the window counts.
    pub(crate) unit: Unit,
    /// The most units in flight: sent and not yet credited back. At least 1.
    pub(crate) window: u64,
    /// The receiver returns credits on their own once this many are owed (sooner when they
    /// can ride on something it sends anyway). In `1 ..= window`.
    pub(crate) return_batch: u64,
}

/// The fraction of the window owed before a receiver returns credits on their own: half.
/// Half keeps the sender busy while the return travels (the other half is still in flight) and
/// costs one credit message per half window on a one-way stream.
const RETURN_DIVISOR: u64 = 2;

impl Policy {
    /// A window of `depth` messages (at least 1), credits returned after half of it.
    pub(crate) fn messages(depth: usize) -> Policy {
        Policy::new(Unit::Messages, depth as u64)
    }

    /// A window of `bytes` payload bytes (at least 1), credits returned after half of it.
    pub(crate) fn bytes(bytes: usize) -> Policy {
        Policy::new(Unit::Bytes, bytes as u64)
    }

    /// The engine's window of one connection and direction: `depth` messages
    /// ([`EngineBuilder::depth`](crate::EngineBuilder::depth)), credits returned after half
    /// of it. Built once per connection, by whoever sizes its window (the handle for the
    /// polled path, the fabric's setup for a direct path).
    pub(crate) fn from_config(cfg: &Config) -> Policy {
        Policy::messages(cfg.depth)
    }

    /// A connection's window: `depth` messages when its fabric sizes it
    /// ([`FabricConn::app_depth`](crate::fabric::FabricConn::app_depth): tcp, whose byte window
    /// bounds what is in flight), else [`from_config`](Self::from_config)'s.
    pub(crate) fn for_connection(cfg: &Config, depth: Option<usize>) -> Policy {
        match depth {
            Some(d) => Policy::messages(d),
            None => Policy::from_config(cfg),
        }
    }

    fn new(unit: Unit, window: u64) -> Policy {
        let window = window.max(1);
        Policy {
            unit,
            window,
            return_batch: (window / RETURN_DIVISOR).max(1),
        }
    }

    /// The same window with credits returned after `n` owed units (clamped to
    /// `1 ..= window`): the tests' other batches (every fabric returns at the default).
    #[cfg(test)]
    pub(crate) fn return_every(self, n: u64) -> Policy {
        Policy {
            return_batch: n.clamp(1, self.window),
            ..self
        }
    }

    /// The units a message of `len` payload bytes takes in this window.
    #[inline(always)]
    pub(crate) fn units(&self, len: usize) -> u64 {
        match self.unit {
            Unit::Messages => 1,
            Unit::Bytes => len as u64,
        }
    }

    /// The sender's half.
    pub(crate) fn send_window(&self) -> SendWindow {
        SendWindow {
            window: self.window,
            batch: self.return_batch,
            sent: 0,
            credited: 0,
        }
    }

    /// The receiver's half.
    pub(crate) fn credit_return(&self) -> CreditReturn {
        CreditReturn {
            batch: self.return_batch,
            consumed: 0,
            owed: 0,
        }
    }
}

/// A credit report that breaks the window's invariant: a peer's protocol violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlowError {
    /// The cumulative credit count went backwards.
    Backwards {
        /// The count credited before.
        credited: u64,
        /// The count reported now.
        reported: u64,
    },
    /// More credited back than was ever sent.
    Excess {
        /// Units sent so far.
        sent: u64,
        /// The count reported.
        reported: u64,
    },
}

impl FlowError {
    /// A static description, for the fabrics' `FabricError::Protocol(&'static str)`.
    pub(crate) fn what(&self) -> &'static str {
        match self {
            FlowError::Backwards { .. } => "credit count goes backwards",
            FlowError::Excess { .. } => "credit count exceeds what was sent",
        }
    }
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FlowError::Backwards { credited, reported } => {
                write!(f, "credit count goes backwards ({reported} < {credited})")
            }
            FlowError::Excess { sent, reported } => {
                write!(f, "credit count {reported} exceeds the {sent} units sent")
            }
        }
    }
}

impl std::error::Error for FlowError {}

/// The sender's half of a window: units sent and units credited back, both cumulative.
///
/// Invariant: `credited <= sent` and `sent - credited <= window` (the sender checks
/// [`has_room`](Self::has_room) before [`on_sent`](Self::on_sent)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendWindow {
    window: u64,
    /// The receiver's return batch (see [`has_room`](Self::has_room)).
    batch: u64,
    sent: u64,
    credited: u64,
}

impl SendWindow {
    /// Units in flight: sent, not yet credited back.
    #[inline(always)]
    pub(crate) fn in_flight(&self) -> u64 {
        self.sent - self.credited
    }

    /// Units that may still be sent.
    #[inline(always)]
    pub(crate) fn room(&self) -> u64 {
        self.window.saturating_sub(self.in_flight())
    }

    /// Whether `units` more fit: they fit the room left, or less than the receiver's return
    /// batch is in flight. The second case is for messages larger than the room (a byte window;
    /// larger than the whole window too): the receiver returns credits only once a batch is
    /// owed, so a sender stalled with less in flight would wait forever. A message window never
    /// needs it (one unit fits while `in_flight < window`, and the batch is at most the window).
    #[inline(always)]
    pub(crate) fn has_room(&self, units: u64) -> bool {
        let in_flight = self.in_flight();
        in_flight + units <= self.window || in_flight < self.batch
    }

    /// No room for one more unit: `window` units are in flight. The one-unit check of a
    /// message window, one subtraction and one compare (the window is at least 1, so an empty
    /// window is never full and this is `!has_room(1)`).
    #[inline(always)]
    pub(crate) fn is_full(&self) -> bool {
        self.in_flight() >= self.window
    }

    /// `units` were sent.
    #[inline(always)]
    pub(crate) fn on_sent(&mut self, units: u64) {
        self.sent += units;
    }

    /// Units sent so far (cumulative).
    #[inline(always)]
    pub(crate) fn sent(&self) -> u64 {
        self.sent
    }

    /// Units credited back so far (cumulative).
    #[inline(always)]
    pub(crate) fn credited(&self) -> u64 {
        self.credited
    }

    /// The window's size.
    #[inline(always)]
    pub(crate) fn window(&self) -> u64 {
        self.window
    }

    /// The peer's cumulative credit count is now `total`: validates it and returns how many
    /// units it newly credits.
    ///
    /// # Errors
    ///
    /// [`FlowError`] when `total` goes backwards or exceeds the units sent; the window is
    /// unchanged then.
    #[inline]
    pub(crate) fn credit_to(&mut self, total: u64) -> Result<u64, FlowError> {
        if total < self.credited {
            return Err(FlowError::Backwards {
                credited: self.credited,
                reported: total,
            });
        }
        if total > self.sent {
            return Err(FlowError::Excess {
                sent: self.sent,
                reported: total,
            });
        }
        let new = total - self.credited;
        self.credited = total;
        Ok(new)
    }

    /// `n` more units were credited back (a fabric that reports deltas).
    ///
    /// # Errors
    ///
    /// [`FlowError::Excess`] when that would credit more than was sent.
    #[inline]
    pub(crate) fn credit(&mut self, n: u64) -> Result<(), FlowError> {
        match self.credited.checked_add(n) {
            Some(total) => self.credit_to(total).map(|_| ()),
            None => Err(FlowError::Excess {
                sent: self.sent,
                reported: u64::MAX,
            }),
        }
    }

    /// Adopts a credit count from a trusted party (the engine's own poller, through shared
    /// memory), clamped to what was sent: no validation error, no way to break the invariant.
    #[inline(always)]
    pub(crate) fn credit_trusted(&mut self, total: u64) {
        self.credited = total.clamp(self.credited, self.sent);
    }
}

/// The receiver's half of a window: units consumed (room made for the sender, cumulative) and
/// how many of them are not yet returned to it.
///
/// The owed count is kept as such (the returned count is `consumed - owed`), so that the check
/// a receiver makes per message, [`due`](Self::due), is one compare, and [`take`](Self::take)
/// one store (shm's consumer runs both on every receive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CreditReturn {
    batch: u64,
    consumed: u64,
    /// In `0 ..= consumed`.
    owed: u64,
}

impl CreditReturn {
    /// The receiver made room for `units` more.
    #[inline(always)]
    pub(crate) fn on_consumed(&mut self, units: u64) {
        self.consumed += units;
        self.owed += units;
    }

    /// Units of room made and not yet returned.
    #[inline(always)]
    pub(crate) fn owed(&self) -> u64 {
        self.owed
    }

    /// Whether credits should go back now: a full return batch is owed, or some are owed and
    /// `piggyback` (the receiver sends something to the peer anyway, so they ride along).
    #[inline(always)]
    pub(crate) fn due(&self, piggyback: bool) -> bool {
        let owed = self.owed();
        owed >= self.batch || (piggyback && owed > 0)
    }

    /// Marks everything owed as returned and gives the cumulative count to report.
    #[inline(always)]
    pub(crate) fn take(&mut self) -> u64 {
        self.owed = 0;
        self.consumed
    }

    /// Marks `n` owed units as returned (a fabric that reports deltas, bounded by what fits
    /// its message) and gives how many it marked (at most what is owed).
    #[inline(always)]
    pub(crate) fn take_up_to(&mut self, n: u64) -> u64 {
        let n = n.min(self.owed);
        self.owed -= n;
        n
    }

    /// Units consumed so far (cumulative).
    #[inline(always)]
    pub(crate) fn consumed(&self) -> u64 {
        self.consumed
    }

    /// The return batch of the policy.
    #[inline(always)]
    pub(crate) fn batch(&self) -> u64 {
        self.batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_policy_defaults() {
        let p = Policy::messages(128);
        assert_eq!(p.unit, Unit::Messages);
        assert_eq!(p.window, 128);
        assert_eq!(p.return_batch, 64);
        assert_eq!(p.units(4000), 1);
        // Degenerate depths still make a usable window.
        let p0 = Policy::messages(0);
        assert_eq!((p0.window, p0.return_batch), (1, 1));
        assert_eq!(Policy::messages(1).return_batch, 1);
    }

    #[test]
    fn byte_policy_counts_bytes() {
        let p = Policy::bytes(1 << 20);
        assert_eq!(p.units(4000), 4000);
        assert_eq!(p.return_batch, 1 << 19);
    }

    #[test]
    fn return_every_is_clamped_to_the_window() {
        let p = Policy::messages(8);
        assert_eq!(p.return_every(0).return_batch, 1);
        assert_eq!(p.return_every(3).return_batch, 3);
        assert_eq!(p.return_every(100).return_batch, 8);
    }

    #[test]
    fn window_fills_and_drains() {
        let p = Policy::messages(4);
        let mut w = p.send_window();
        for _ in 0..4 {
            assert!(w.has_room(1));
            w.on_sent(1);
        }
        assert!(!w.has_room(1));
        assert_eq!((w.in_flight(), w.room()), (4, 0));
        assert_eq!(w.credit_to(1), Ok(1));
        assert!(w.has_room(1));
        assert_eq!(
            w.credit_to(1),
            Ok(0),
            "the same report twice credits nothing"
        );
        assert_eq!(w.in_flight(), 3);
    }

    #[test]
    fn hostile_credit_reports_are_refused_and_change_nothing() {
        let mut w = Policy::messages(4).send_window();
        w.on_sent(3);
        assert_eq!(w.credit_to(2), Ok(2));
        let before = w;
        assert_eq!(
            w.credit_to(1),
            Err(FlowError::Backwards {
                credited: 2,
                reported: 1
            })
        );
        assert_eq!(
            w.credit_to(4),
            Err(FlowError::Excess {
                sent: 3,
                reported: 4
            })
        );
        assert!(w.credit(2).is_err());
        assert!(w.credit(u64::MAX).is_err());
        assert_eq!(w, before);
        assert_eq!(w.credit(1), Ok(()));
        assert_eq!(w.in_flight(), 0);
    }

    #[test]
    fn trusted_credits_are_clamped() {
        let mut w = Policy::messages(4).send_window();
        w.on_sent(2);
        w.credit_trusted(5);
        assert_eq!(w.credited(), 2);
        w.credit_trusted(1);
        assert_eq!(w.credited(), 2, "never backwards");
    }

    #[test]
    fn byte_window_admits_an_oversized_message_below_a_return_batch() {
        let p = Policy::bytes(1000); // return batch 500
        let mut w = p.send_window();
        assert!(w.has_room(p.units(5000)), "an empty window takes anything");
        w.on_sent(p.units(5000));
        assert!(!w.has_room(1));
        assert_eq!(w.credit_to(5000), Ok(5000));
        w.on_sent(p.units(600));
        assert!(w.has_room(400));
        assert!(
            !w.has_room(401),
            "a return batch is in flight: credits will come"
        );
        assert_eq!(w.credit_to(5200), Ok(200));
        assert!(
            w.has_room(900),
            "less than a batch in flight: the receiver may never return it, so it goes"
        );
    }

    /// A byte window with messages of any size, up to several windows, never deadlocks: with
    /// everything sent delivered and nothing due at the receiver, the sender can always send.
    /// And what is in flight stays within the window, or under a return batch plus the one
    /// oversized message.
    #[test]
    fn byte_window_never_deadlocks_on_mixed_sizes() {
        for window in [1u64, 7, 64, 1000] {
            let p = Policy::bytes(window as usize);
            let mut w = p.send_window();
            let mut r = p.credit_return();
            let mut queued: Vec<u64> = Vec::new(); // at the receiver, not consumed
            let mut seed = window;
            for _ in 0..5000 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let units = 1 + (seed >> 33) % (3 * window);
                if w.has_room(units) {
                    let before = w.in_flight();
                    w.on_sent(units);
                    assert!(
                        w.in_flight() <= window || before < p.return_batch,
                        "{window}: {before} + {units}"
                    );
                    queued.push(units);
                    continue;
                }
                // The sender is stalled: the receiver consumes everything; credits must come.
                for u in queued.drain(..) {
                    r.on_consumed(u);
                }
                assert!(
                    r.due(false),
                    "{window}: stalled with nothing due (deadlock)"
                );
                let total = r.take();
                w.credit_to(total).expect("honest");
                assert!(
                    w.has_room(units),
                    "{window}: everything credited, still no room"
                );
            }
        }
    }

    #[test]
    fn credit_return_batches_and_piggybacks() {
        let p = Policy::messages(8); // return batch 4
        let mut r = p.credit_return();
        assert!(!r.due(true), "nothing owed: nothing to return");
        r.on_consumed(1);
        assert!(!r.due(false));
        assert!(r.due(true), "owed credits ride on outgoing data");
        r.on_consumed(3);
        assert!(r.due(false));
        assert_eq!(r.take(), 4);
        assert_eq!(r.owed(), 0);
        r.on_consumed(2);
        assert_eq!(r.take_up_to(1), 1);
        assert_eq!(r.owed(), 1);
        assert_eq!(r.take_up_to(10), 1);
        assert_eq!(r.owed(), 0);
        // Partial returns and a full one agree on the cumulative count.
        r.on_consumed(5);
        assert_eq!(r.take_up_to(2), 2);
        assert_eq!((r.owed(), r.consumed()), (3, 11));
        assert!(!r.due(false), "3 owed of a batch of 4");
        assert!(r.due(true));
        assert_eq!(r.take(), 11);
        assert_eq!(r.owed(), 0);
    }

    /// The pair never lets more be in flight than the receiver has room for, whatever the
    /// interleaving of sends, consumption and (delayed) returns: a small exhaustive model.
    #[test]
    fn receiver_is_never_overrun() {
        for window in 1..=5u64 {
            for batch in 1..=window {
                let p = Policy::messages(window as usize).return_every(batch);
                // Drive a deterministic pseudo-random schedule of 2000 steps.
                let mut w = p.send_window();
                let mut r = p.credit_return();
                let mut queued = 0u64; // at the receiver, not consumed
                let mut in_transit: Option<u64> = None; // a credit report on the wire
                let mut seed = window * 31 + batch;
                for _ in 0..2000 {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    match (seed >> 33) % 4 {
                        0 if w.has_room(1) => {
                            w.on_sent(1);
                            queued += 1;
                            assert!(queued <= window, "receiver overrun");
                        }
                        1 if queued > 0 => {
                            queued -= 1;
                            r.on_consumed(1);
                        }
                        2 if in_transit.is_none() && r.due(seed & 1 == 0) => {
                            in_transit = Some(r.take());
                        }
                        3 => {
                            if let Some(total) = in_transit.take() {
                                w.credit_to(total).expect("an honest receiver's report");
                            }
                        }
                        _ => {}
                    }
                    assert!(w.in_flight() <= window);
                    assert!(queued <= w.in_flight());
                }
            }
        }
    }

    /// `due(piggyback)` is exactly "something is owed, and a batch is owed or it can ride on
    /// data going out" (a stream fabric's rule: tcp piggybacks on any write).
    #[test]
    fn due_is_a_full_batch_or_a_piggyback() {
        for window in 1..=8u64 {
            for batch in 1..=window {
                let p = Policy::messages(window as usize).return_every(batch);
                for owed in 0..=2 * window {
                    let mut r = p.credit_return();
                    r.on_consumed(owed);
                    for piggyback in [false, true] {
                        let want = owed > 0 && (owed >= batch || piggyback);
                        assert_eq!(
                            r.due(piggyback),
                            want,
                            "{window} {batch} {owed} {piggyback}"
                        );
                    }
                }
            }
        }
    }

    /// A fabric that returns deltas (RDMA's credit word) and one that returns cumulative counts
    /// (tcp's `CREDIT` record) see the same window: room, in flight, and which reports are
    /// refused, against a plain counter of uncredited sends.
    #[test]
    fn delta_and_cumulative_credits_keep_the_same_window() {
        let p = Policy::messages(6);
        let (mut delta, mut total) = (p.send_window(), p.send_window());
        let mut uncredited = 0u64; // the model
        let mut seed = 7u64;
        for _ in 0..5000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = (seed >> 40) % 4;
            if (seed >> 33) % 2 == 0 {
                if n <= delta.room() {
                    delta.on_sent(n);
                    total.on_sent(n);
                    uncredited += n;
                }
            } else {
                let ok = n <= uncredited;
                assert_eq!(delta.credit(n).is_ok(), ok);
                let reported = total.credited() + n;
                assert_eq!(total.credit_to(reported).map(|_| ()).is_ok(), ok);
                if ok {
                    uncredited -= n;
                }
            }
            assert_eq!(delta.in_flight(), uncredited);
            assert_eq!(total.in_flight(), uncredited);
            assert_eq!(delta.room(), 6 - uncredited);
        }
    }

    /// Returns bounded per message (a credit word's width) add up to everything owed, in order.
    #[test]
    fn bounded_returns_add_up() {
        let mut r = Policy::messages(64).credit_return();
        r.on_consumed(10);
        let mut got = Vec::new();
        while r.owed() > 0 {
            got.push(r.take_up_to(3));
        }
        assert_eq!(got, [3, 3, 3, 1]);
        assert_eq!(r.take_up_to(3), 0, "nothing owed: nothing returned");
        r.on_consumed(2);
        assert_eq!(
            r.take(),
            12,
            "the cumulative count covers the bounded returns too"
        );
    }

    #[test]
    fn is_full_is_no_room_for_one() {
        for depth in [0usize, 1, 2, 7] {
            let mut w = Policy::messages(depth).send_window();
            for _ in 0..10 {
                assert_eq!(w.is_full(), !w.has_room(1), "depth {depth}");
                if !w.is_full() {
                    w.on_sent(1);
                }
            }
            assert!(w.is_full());
            assert_eq!(w.in_flight(), w.window());
            w.credit_trusted(w.sent());
            assert!(!w.is_full(), "an empty window is never full");
        }
    }

    #[test]
    fn the_config_sizes_a_message_window_of_depth() {
        let cfg = crate::Engine::builder()
            .depth(64)
            .validate()
            .expect("a valid config");
        let p = Policy::from_config(&cfg);
        assert_eq!((p.unit, p.window, p.return_batch), (Unit::Messages, 64, 32));
    }

    /// A receiver that stops consuming stops the sender within one window.
    #[test]
    fn a_stopped_receiver_stops_the_sender_within_one_window() {
        let p = Policy::messages(16);
        let mut w = p.send_window();
        let mut sent = 0;
        while w.has_room(1) && sent < 1000 {
            w.on_sent(1);
            sent += 1;
        }
        assert_eq!(sent, 16);
    }
}
