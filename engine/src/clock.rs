//! The engine's coarse clock, advanced by the control thread and read by pollers.
//!
//! It advances on every wake-up of the control thread; with connections open and nothing else
//! going on, that is the liveness beat (a twelfth of the liveness timeout), which bounds its
//! lag. Its readers (the pollers' liveness checks and heartbeats) need no finer resolution.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A deadline for a timeout beyond what an `Instant` holds: about a century.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The instant `timeout` after `now`: every `*_timeout` call's deadline. A timeout too long for
/// an `Instant` (`Duration::MAX`, "forever") gives one a century ahead instead of overflowing
/// (`Instant + Duration` panics there).
pub(crate) fn deadline_after(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout)
        .or_else(|| now.checked_add(FOREVER))
        .unwrap_or(now)
}

/// The engine's coarse clock: nanoseconds since start, advanced by the control thread, read by
/// pollers without a syscall or vDSO call.
#[derive(Debug)]
pub(crate) struct Clock {
    base: Instant,
    now_ns: AtomicU64,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock {
            base: Instant::now(),
            now_ns: AtomicU64::new(0),
        }
    }
    pub(crate) fn update(&self) {
        let ns = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.now_ns.store(ns, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::Relaxed)
    }
}
