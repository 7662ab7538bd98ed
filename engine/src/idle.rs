//! Idle strategies: [`IdleStrategy`] (the choice) and `Idler` (the state of one thread applying
//! it after each cycle that found no work).

use std::time::{Duration, Instant};

/// What a poller (or a waiting application thread) does when a cycle found no work.
///
/// Idle strategies are Aeron's: each idle cycle advances the strategy one step; any work resets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum IdleStrategy {
    /// Spin with a CPU relax hint (`pause`). Lowest latency; burns the core. The default.
    #[default]
    BusySpin,
    /// Spin `spins` cycles, then `yield` `yields` times, then park for `min_park` doubling up to
    /// `max_park` per idle cycle. Park is bounded, so a parked poller notices new work after at most
    /// `max_park`.
    Backoff {
        /// Idle cycles spent spinning before yielding.
        spins: u32,
        /// Idle cycles spent yielding before parking.
        yields: u32,
        /// First park duration.
        min_park: Duration,
        /// Longest park duration (the bound on added latency once fully backed off).
        max_park: Duration,
    },
    /// Arm-and-sleep: spin for `spin`, then announce that this thread sleeps and sleep in the
    /// kernel until the first arrival wakes it (UCX's `ucp_worker_arm`, verbs'
    /// `ibv_req_notify_cq`). An idle thread costs no CPU, and an arrival wakes it within the
    /// kernel's wake-up latency (microseconds), not a park period.
    ///
    /// What wakes it: a shm connection's peer rings a doorbell in the shared segment, but only
    /// once this side has announced that it sleeps, so a spinning receiver costs its sender
    /// nothing (a sender whose peer may sleep pays one fence per publication). A wait with
    /// nothing to sleep on (accepting, events) parks with [`IdleStrategy::backoff`]'s bounds.
    ///
    /// `max_sleep` bounds one sleep: a thread re-checks its connection (and its deadline)
    /// after at most that long even if nothing rang. Wake-ups do not depend on it; it is the
    /// safety net against a peer that dies between announcing a message and ringing.
    Block {
        /// How long an idle thread spins before it sleeps (a wait that finds work within this
        /// never enters the kernel).
        spin: Duration,
        /// The longest single sleep, in `(0, 1 s]`.
        max_sleep: Duration,
    },
}

impl IdleStrategy {
    /// Backoff with the defaults: 1000 spins, 100 yields, park 1 µs doubling up to 1 ms.
    pub const fn backoff() -> IdleStrategy {
        IdleStrategy::Backoff {
            spins: 1000,
            yields: 100,
            min_park: Duration::from_micros(1),
            max_park: Duration::from_millis(1),
        }
    }

    /// Block with the defaults: spin 50 µs, then sleep for at most 100 ms at a time.
    ///
    /// 50 µs of spin covers a round trip whose reply comes back after the peer's own wake-up
    /// (10-30 µs on a loaded 2-core guest), so a ping-pong at a low rate pays one kernel
    /// wake-up per message, not two.
    pub const fn block() -> IdleStrategy {
        IdleStrategy::Block {
            spin: Duration::from_micros(50),
            max_sleep: Duration::from_millis(100),
        }
    }
}

/// What an idle cycle asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Idled already (spun, yielded or parked): try again.
    Again,
    /// [`IdleStrategy::Block`]'s spin phase is over: arm and sleep for at most this long (the
    /// caller bounds it by its own deadline), then try again.
    Sleep(Duration),
}

/// The state of one thread's idle strategy. Any work resets it.
#[derive(Debug)]
pub(crate) struct Idler {
    strategy: IdleStrategy,
    idle_cycles: u64,
    park: Duration,
    /// Block: when the current idle stretch began (read on its first idle cycle).
    since: Option<Instant>,
}

/// Block: the clock is read every this many idle cycles of the spin phase, not every cycle.
const BLOCK_CLOCK_EVERY: u64 = 32;

impl Idler {
    /// Whether every idle is one spin-loop hint ([`IdleStrategy::BusySpin`]): no sleep, no
    /// yield, so a run of idles is short and bounded by the count.
    #[inline(always)]
    pub(crate) fn busy_spin(&self) -> bool {
        matches!(self.strategy, IdleStrategy::BusySpin)
    }

    pub(crate) fn new(strategy: IdleStrategy) -> Idler {
        let park = match strategy {
            IdleStrategy::Backoff { min_park, .. } => min_park,
            IdleStrategy::BusySpin | IdleStrategy::Block { .. } => Duration::ZERO,
        };
        Idler {
            strategy,
            idle_cycles: 0,
            park,
            since: None,
        }
    }

    /// Called after every cycle with the work it did, by a thread with nothing to sleep on:
    /// [`IdleStrategy::Block`]'s sleep becomes a park bounded as [`IdleStrategy::backoff`]'s.
    #[inline(always)]
    pub(crate) fn idle(&mut self, work: usize) {
        if let Step::Sleep(_) = self.step(work) {
            std::thread::park_timeout(self.park);
            self.park = (self.park * 2).clamp(Duration::from_micros(1), Duration::from_millis(1));
        }
    }

    /// Called after every cycle with the work it did, by a thread that can sleep until woken:
    /// [`Step::Sleep`] once [`IdleStrategy::Block`]'s spin phase is over.
    #[inline(always)]
    pub(crate) fn step(&mut self, work: usize) -> Step {
        // A busy-spinning poller's loop stays as tight as before `Block` existed: one compare
        // and a `pause`; the counting strategies' idle cycles run out of line. (A poller cycle
        // is tens of ns: a helper measured `bench lat --fabric mem --mode dedicated` at 1.07x
        // the base with the whole strategy match inlined here; not re-measured quietly.)
        if matches!(self.strategy, IdleStrategy::BusySpin) {
            if work == 0 {
                core::hint::spin_loop();
            }
            return Step::Again;
        }
        if work > 0 {
            self.reset();
            return Step::Again;
        }
        self.step_idle()
    }

    /// An idle cycle of the strategies that count them (kept out of the busy loop).
    #[inline(never)]
    fn step_idle(&mut self) -> Step {
        match self.strategy {
            IdleStrategy::BusySpin => core::hint::spin_loop(),
            IdleStrategy::Backoff {
                spins,
                yields,
                max_park,
                ..
            } => {
                self.idle_cycles += 1;
                if self.idle_cycles <= u64::from(spins) {
                    core::hint::spin_loop();
                } else if self.idle_cycles <= u64::from(spins) + u64::from(yields) {
                    std::thread::yield_now();
                } else {
                    std::thread::park_timeout(self.park);
                    self.park = (self.park * 2).min(max_park);
                }
            }
            IdleStrategy::Block { spin, max_sleep } => {
                self.idle_cycles += 1;
                let since = match self.since {
                    Some(t) => t,
                    None => {
                        let now = Instant::now();
                        self.since = Some(now);
                        now
                    }
                };
                let sleeping = self.park > Duration::ZERO;
                if sleeping
                    || (self.idle_cycles % BLOCK_CLOCK_EVERY == 0 && since.elapsed() >= spin)
                {
                    // Past the spin phase (or asleep already once): every idle cycle sleeps.
                    if !sleeping {
                        self.park = Duration::from_micros(1);
                    }
                    return Step::Sleep(max_sleep);
                }
                core::hint::spin_loop();
            }
        }
        Step::Again
    }

    /// Whether the last idle cycle gave the core up (a yield or park of
    /// [`IdleStrategy::Backoff`], a sleep of [`IdleStrategy::Block`]): cycles are then far
    /// apart, and a loop that counts them to time something reads the clock instead.
    #[inline]
    pub(crate) fn gave_up_core(&self) -> bool {
        match self.strategy {
            IdleStrategy::BusySpin => false,
            IdleStrategy::Backoff { spins, .. } => self.idle_cycles > u64::from(spins),
            IdleStrategy::Block { .. } => self.park > Duration::ZERO,
        }
    }

    #[inline]
    pub(crate) fn reset(&mut self) {
        if self.idle_cycles != 0 {
            self.idle_cycles = 0;
            self.since = None;
            match self.strategy {
                IdleStrategy::Backoff { min_park, .. } => self.park = min_park,
                IdleStrategy::Block { .. } => self.park = Duration::ZERO,
                IdleStrategy::BusySpin => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_spins_first_then_asks_to_sleep_and_work_resets_it() {
        let spin = Duration::from_millis(2);
        let mut idler = Idler::new(IdleStrategy::Block {
            spin,
            max_sleep: Duration::from_millis(7),
        });
        let start = Instant::now();
        let mut steps = 0u64;
        while idler.step(0) == Step::Again {
            steps += 1;
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "never asked to sleep"
            );
        }
        assert!(
            start.elapsed() >= spin,
            "asked to sleep before the spin phase ended"
        );
        assert!(steps >= BLOCK_CLOCK_EVERY - 1);
        assert!(idler.gave_up_core(), "asked to sleep");
        // Once asleep, every idle cycle sleeps again (no second spin phase) ...
        assert_eq!(idler.step(0), Step::Sleep(Duration::from_millis(7)));
        // ... until work resets it.
        assert_eq!(idler.step(1), Step::Again);
        assert!(!idler.gave_up_core(), "spinning again after work");
        assert_eq!(idler.step(0), Step::Again);
    }

    #[test]
    fn backoff_gives_the_core_up_after_its_spins_and_busy_spin_never() {
        let mut idler = Idler::new(IdleStrategy::Backoff {
            spins: 3,
            yields: 1,
            min_park: Duration::from_micros(1),
            max_park: Duration::from_micros(2),
        });
        for _ in 0..3 {
            idler.step(0);
            assert!(!idler.gave_up_core(), "still spinning");
        }
        idler.step(0); // the yield
        assert!(idler.gave_up_core());
        idler.step(0); // a park
        assert!(idler.gave_up_core());
        idler.step(1);
        assert!(!idler.gave_up_core(), "work resets it");
        let mut spin = Idler::new(IdleStrategy::BusySpin);
        for _ in 0..100 {
            spin.step(0);
            assert!(!spin.gave_up_core());
        }
    }

    #[test]
    fn busy_spin_and_backoff_never_ask_to_sleep() {
        for s in [IdleStrategy::BusySpin, IdleStrategy::backoff()] {
            let mut idler = Idler::new(s);
            for _ in 0..1200 {
                assert_eq!(idler.step(0), Step::Again);
            }
        }
    }
}
