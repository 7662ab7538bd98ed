//! What both paths of a [`Connection`](super::Connection) keep the same way: the spare lists
//! of send buffers and large slots ([`Spares`]), the application's counters ([`Counts`]) and
//! the bounded wait of the `*_timeout` calls ([`Wait`]).

use std::time::{Duration, Instant};

use crate::clock::deadline_after;
use crate::desc::{is_large, large_slot, LARGE_BIT};
use crate::idle::{IdleStrategy, Idler, Step};
use crate::link::Pools;

/// The send buffers and large slots the application side owns: free ones in two lists, and
/// counts of those it holds as `SendBuf`s.
///
/// Each list has capacity for every buffer (slot) of its kind and only ever holds ones this
/// side owns, each once, so a push never reallocates (pushes are capacity-checked anyway).
/// Every index a list hands out is checked against its pool's count first, since `SendBuf`
/// relies on it.
pub(super) struct Spares {
    /// The free ordinary buffer freed last, taken before `bufs` ([`NONE`] when there is none):
    /// a send loop's buffer, copied into the ring and free again at once, goes back here and
    /// out again with one load, compare and store each, not through the list's length and
    /// capacity (callgrind of `bench cost`'s streamed send: 8 instructions fewer per message).
    /// Each free buffer is in exactly one of `hot` and `bufs`.
    hot: u32,
    /// Free ordinary buffers (`< tx.count()`), reused first, popped from the end.
    bufs: Vec<u32>,
    /// Ordinary buffers the application holds as `SendBuf`s.
    held: u32,
    /// Free large slots (`LARGE_BIT | slot`).
    large: Vec<u32>,
    /// Large slots the application holds as `SendBuf`s.
    held_large: u32,
    /// The pools' counts: ordinary buffers, large slots.
    count: u32,
    large_count: u32,
}

/// [`Spares::hot`] holding no buffer (above every buffer index: `hot < count` says both that
/// it holds one and that it is in range).
const NONE: u32 = u32::MAX;

impl Spares {
    /// Empty lists for `pools`' send side (the polled path: its buffers start in the free ring).
    pub(super) fn empty(pools: &Pools) -> Spares {
        Spares {
            hot: NONE,
            bufs: Vec::with_capacity(pools.tx.count() as usize),
            held: 0,
            large: Vec::with_capacity(pools.tx_large.count() as usize),
            held_large: 0,
            count: pools.tx.count(),
            large_count: pools.tx_large.count(),
        }
    }

    /// Lists holding every send buffer and large slot of `pools` (a direct path owns its whole
    /// pool from the start). Popped from the end: buffer 0 first.
    pub(super) fn full(pools: &Pools) -> Spares {
        let mut s = Spares::empty(pools);
        s.bufs.extend((0..s.count).rev());
        s.large
            .extend((0..s.large_count).rev().map(|slot| LARGE_BIT | slot));
        s
    }

    /// Takes a free ordinary buffer (now held).
    #[inline(always)]
    pub(super) fn pop(&mut self) -> Option<u32> {
        let idx = self.hot;
        if idx < self.count {
            self.hot = NONE;
            self.held += 1;
            return Some(idx);
        }
        let idx = self.bufs.pop()?;
        self.hold(idx)
    }

    /// Holds ordinary buffer `idx` that came from elsewhere (the poller's free ring), if it is
    /// in range.
    #[inline(always)]
    pub(super) fn hold(&mut self, idx: u32) -> Option<u32> {
        // Only buffers the engine or the wire layer validated get here; checked anyway.
        if idx >= self.count {
            return None;
        }
        self.held += 1;
        Some(idx)
    }

    /// Takes a free large slot (now held).
    #[inline]
    pub(super) fn pop_large(&mut self) -> Option<u32> {
        let idx = self.large.pop()?;
        if large_slot(idx) >= self.large_count {
            return None;
        }
        self.held_large += 1;
        Some(idx)
    }

    /// Whether no large slot is free.
    #[inline]
    pub(super) fn large_is_empty(&self) -> bool {
        self.large.is_empty()
    }

    /// A freed buffer or slot came back (the fabric or the poller returned it): into its
    /// list, not held.
    #[inline]
    pub(super) fn keep(&mut self, idx: u32) {
        let list = if is_large(idx) {
            &mut self.large
        } else {
            &mut self.bufs
        };
        if list.len() < list.capacity() {
            list.push(idx);
        }
    }

    /// The lists, for a fabric that moves what its peer released into them directly.
    #[inline]
    pub(super) fn lists(&mut self) -> (&mut Vec<u32>, &mut Vec<u32>) {
        (&mut self.bufs, &mut self.large)
    }

    /// A held buffer or slot was dropped unsent: free again (an ordinary buffer the next
    /// taken, as by [`copied`](Self::copied)).
    #[inline]
    pub(super) fn give_back(&mut self, idx: u32) {
        if is_large(idx) {
            self.sent(idx);
            self.keep(idx);
        } else {
            self.copied(idx);
        }
    }

    /// A held buffer or slot was sent: no longer the application's.
    #[inline(always)]
    pub(super) fn sent(&mut self, idx: u32) {
        if is_large(idx) {
            self.held_large -= 1;
        } else {
            self.held -= 1;
        }
    }

    /// A held ordinary buffer was copied into the fabric's record: free again at once, and
    /// the next taken (the one it replaces as `hot` goes to the list, so the order stays last
    /// in, first out).
    #[inline(always)]
    pub(super) fn copied(&mut self, idx: u32) {
        self.held -= 1;
        let before = std::mem::replace(&mut self.hot, idx);
        if before != NONE {
            // Capacity for the whole pool, and only buffers we own: no reallocation.
            self.bufs.push(before);
        }
    }

    /// Whether the application holds every ordinary buffer (`alloc` finds none free:
    /// `PoolExhausted`, not back-pressure).
    #[inline]
    pub(super) fn all_held(&self) -> bool {
        self.held >= self.count
    }

    /// As [`all_held`](Self::all_held), for the large slots.
    #[inline]
    pub(super) fn all_large_held(&self) -> bool {
        self.held_large >= self.large_count
    }
}

/// The application's own counts of one connection (the poller counts the fabric's side of a
/// polled connection; a direct path has no poller, so it counts bytes too).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counts {
    pub(super) received: u64,
    pub(super) would_block: u64,
    pub(super) alloc_failures: u64,
    /// Sleeps of a `Block` receive, and those that ended without a ring.
    pub(super) sleeps: u64,
    pub(super) sleeps_unrung: u64,
}

impl Counts {
    /// Counts a `Block` receive's sleep: `rung` whether a ring ended it; `None`: it found
    /// work on its re-check and did not sleep.
    #[inline]
    pub(super) fn slept(&mut self, rung: Option<bool>) {
        if let Some(rung) = rung {
            self.sleeps += 1;
            self.sleeps_unrung += u64::from(!rung);
        }
    }
}

/// The bounded wait of the `*_timeout` calls: idles per the engine's strategy between tries
/// and ends at the deadline (read every 64 tries, not per try, while spinning).
///
/// The clock is first read when a try found nothing, not when the wait is made: a
/// `*_timeout` call whose first try succeeds (a free buffer, a message already there) costs
/// what the call without a timeout does. The two clock reads a message on each side that
/// `alloc_timeout` and `send_timeout` paid were most of the Rust ping-pong example's gap to
/// `bench lat` (32 B: 573-585 against 411-430 ns; 437-459 without them).
///
/// A busy-spinning wait ([`IdleStrategy::BusySpin`]) reads it first at its
/// [`FIRST_LOOK`]-th idle: the deadline is `timeout` from there and is looked at every 64th
/// try, so such a wait may run up to `FIRST_LOOK + 64` tries (each a spin-loop hint and a look,
/// tens of ns) longer than `timeout`. Read
/// at the first idle, the clock (20-30 ns, in which nothing arrives unseen but is not taken
/// either) was inside the wait of nearly every echo: a 2-thread shm ping-pong echoing from
/// `recv_timeout` took 8-11 ns a round trip more than one spinning on `try_recv`.
pub(super) struct Wait {
    /// Set by the first idle (a busy spin's [`FIRST_LOOK`]-th): `timeout` from then.
    deadline: Option<Instant>,
    timeout: Duration,
    idler: Idler,
    spins: u32,
}

/// What a [`Wait`] asks of its caller after a try that found nothing.
pub(super) enum Next {
    /// Try again (the wait has idled per its strategy).
    Again,
    /// [`IdleStrategy::Block`]: sleep on the connection's doorbell for at most this long (the
    /// strategy's `max_sleep`, cut to the deadline), then try again.
    Sleep(Duration),
    /// The deadline has passed.
    Timeout,
}

/// A busy-spinning [`Wait`] reads the clock first at this idle.
pub(super) const FIRST_LOOK: u32 = 64;

impl Wait {
    /// A wait of at most `timeout` from its first idle (the first try that found nothing).
    pub(super) fn new(idle: IdleStrategy, timeout: Duration) -> Wait {
        Wait {
            deadline: None,
            timeout,
            idler: Idler::new(idle),
            spins: 0,
        }
    }

    /// Whether the deadline has passed: set from the clock on the first call (a busy spin's
    /// [`FIRST_LOOK`]-th), then read every 64th (a spinning wait reads the clock once per 64
    /// tries, not per try). A timeout too long for an `Instant` never ends the wait
    /// (`Duration::MAX` is forever).
    #[inline]
    fn expired(&mut self) -> bool {
        match self.deadline {
            Some(d) => self.spins % 64 == 0 && Instant::now() >= d,
            None if self.spins < FIRST_LOOK && self.idler.busy_spin() => false,
            None => {
                self.deadline = Some(deadline_after(Instant::now(), self.timeout));
                false
            }
        }
    }

    /// After a try that did `work` units of work: `false` when the deadline has passed, else
    /// idles (per the strategy, for `work == 0`; a `Block` wait parks as backoff does, for a
    /// caller with nothing to sleep on) and gives `true` to try again.
    #[inline]
    pub(super) fn idle(&mut self, work: usize) -> bool {
        self.spins = self.spins.wrapping_add(1);
        if self.expired() {
            return false;
        }
        self.idler.idle(work);
        true
    }

    /// As [`idle`](Self::idle), for a caller that can sleep until woken: once a `Block`
    /// strategy's spin phase is over, [`Next::Sleep`] instead of parking.
    #[inline]
    pub(super) fn next(&mut self, work: usize) -> Next {
        self.spins = self.spins.wrapping_add(1);
        if self.expired() {
            return Next::Timeout;
        }
        match self.idler.step(work) {
            Step::Again => Next::Again,
            Step::Sleep(max) => match self
                .deadline
                .and_then(|d| d.checked_duration_since(Instant::now()))
            {
                Some(left) if !left.is_zero() => Next::Sleep(left.min(max)),
                _ => Next::Timeout,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_reads_the_clock_at_its_first_idle_and_ends_at_its_deadline() {
        // Strategies that may sleep or yield: the clock at the first idle.
        for idle in [IdleStrategy::backoff(), IdleStrategy::block()] {
            let mut w = Wait::new(idle, Duration::ZERO);
            assert!(w.deadline.is_none(), "made without reading the clock");
            assert!(w.idle(0), "the first idle starts the wait");
            let start = w.deadline.expect("the first idle set the deadline");
            // Past a zero timeout's deadline: over at the next look (every 64th try), not
            // before.
            let over = (2..=64).find(|_| !w.idle(0));
            assert_eq!(over, Some(64));
            assert_eq!(w.deadline, Some(start));
        }
        let mut w = Wait::new(IdleStrategy::block(), Duration::ZERO);
        assert!(!matches!(w.next(0), Next::Timeout));
        assert!((2..=64).any(|_| matches!(w.next(0), Next::Timeout)));
    }

    #[test]
    fn a_busy_spinning_wait_reads_the_clock_at_its_first_look_and_ends_at_its_deadline() {
        let mut w = Wait::new(IdleStrategy::BusySpin, Duration::ZERO);
        // No clock for the first FIRST_LOOK - 1 idles, however short the timeout.
        for i in 1..FIRST_LOOK {
            assert!(w.idle(0), "idle {i} ended the wait");
            assert!(w.deadline.is_none(), "idle {i} read the clock");
        }
        assert!(w.idle(0), "the first look starts the wait");
        let start = w.deadline.expect("the first look set the deadline");
        // Past a zero timeout's deadline: over at the next look, 64 tries on, not before.
        let over = (FIRST_LOOK + 1..=FIRST_LOOK + 64).find(|_| !w.idle(0));
        assert_eq!(over, Some(FIRST_LOOK + 64));
        assert_eq!(w.deadline, Some(start));
        let mut w = Wait::new(IdleStrategy::BusySpin, Duration::ZERO);
        let over = (1..=FIRST_LOOK + 64).find(|_| matches!(w.next(0), Next::Timeout));
        assert_eq!(over, Some(FIRST_LOOK + 64));
        // A real timeout still ends the wait, after the timeout and not unboundedly late.
        let mut w = Wait::new(IdleStrategy::BusySpin, Duration::from_millis(20));
        let t0 = Instant::now();
        while w.idle(0) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the wait did not end"
            );
        }
        assert!(t0.elapsed() >= Duration::from_millis(20));
    }

    #[test]
    fn a_timeout_beyond_an_instant_waits_without_end_and_does_not_panic() {
        let mut w = Wait::new(IdleStrategy::BusySpin, Duration::MAX);
        assert!((0..1000).all(|_| w.idle(0)));
        let left = w.deadline.unwrap() - Instant::now();
        assert!(left > Duration::from_secs(50 * 365 * 24 * 3600), "{left:?}");
        let mut w = Wait::new(IdleStrategy::block(), Duration::MAX);
        for _ in 0..1000 {
            assert!(!matches!(w.next(0), Next::Timeout));
        }
    }

    /// `count` free ordinary buffers, no large slots (as `Spares::full` over such pools).
    fn spares(count: u32) -> Spares {
        let mut s = Spares {
            hot: NONE,
            bufs: Vec::with_capacity(count as usize),
            held: 0,
            large: Vec::new(),
            held_large: 0,
            count,
            large_count: 0,
        };
        s.bufs.extend((0..count).rev());
        s
    }

    #[test]
    fn a_copied_buffer_is_taken_next_and_each_buffer_once() {
        let mut s = spares(3);
        assert_eq!(s.pop(), Some(0));
        s.copied(0);
        assert_eq!(s.pop(), Some(0));
        assert_eq!(s.pop(), Some(1));
        assert_eq!(s.pop(), Some(2));
        assert!(s.all_held());
        assert_eq!(s.pop(), None);
        // Freed in an order of their own: the last freed comes out first, each once.
        s.copied(1);
        s.copied(0);
        s.copied(2);
        assert!(!s.all_held());
        assert_eq!(
            [s.pop(), s.pop(), s.pop(), s.pop()],
            [Some(2), Some(0), Some(1), None]
        );
        assert!(s.all_held());
        // A buffer dropped unsent is taken next too; one copied after it first.
        s.give_back(1);
        assert_eq!(s.pop(), Some(1));
        s.give_back(1);
        s.copied(2);
        assert_eq!([s.pop(), s.pop(), s.pop()], [Some(2), Some(1), None]);
        // Never more than the pool in the list: no reallocation.
        assert_eq!(s.bufs.capacity(), 3);
    }
}
