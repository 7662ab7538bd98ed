//! Idle strategies: [`IdleStrategy`] (the choice) and `Idler` (the state of one thread applying
//! it after each cycle that found no work).

use std::time::Duration;

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
}

/// The state of one thread's idle strategy. Any work resets it.
#[derive(Debug)]
pub(crate) struct Idler {
    strategy: IdleStrategy,
    idle_cycles: u64,
    park: Duration,
}

impl Idler {
    pub(crate) fn new(strategy: IdleStrategy) -> Idler {
        let park = match strategy {
            IdleStrategy::Backoff { min_park, .. } => min_park,
            IdleStrategy::BusySpin => Duration::ZERO,
        };
        Idler {
            strategy,
            idle_cycles: 0,
            park,
        }
    }

    /// Called after every cycle with the work it did.
    #[inline]
    pub(crate) fn idle(&mut self, work: usize) {
        if work > 0 {
            self.reset();
            return;
        }
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
        }
    }

    #[inline]
    pub(crate) fn reset(&mut self) {
        if self.idle_cycles != 0 {
            self.idle_cycles = 0;
            if let IdleStrategy::Backoff { min_park, .. } = self.strategy {
                self.park = min_park;
            }
        }
    }
}
