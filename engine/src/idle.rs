//! Idle strategies in action: what a thread does after a cycle that found no work.

use std::time::Duration;

use crate::config::IdleStrategy;

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
