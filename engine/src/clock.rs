//! The engine's coarse clock, advanced by the control thread and read by pollers.
//!
//! It advances on every wake-up of the control thread; with connections open and nothing else
//! going on, that is the liveness beat (a twelfth of the liveness timeout), which bounds its
//! lag. Its readers (the pollers' liveness checks and heartbeats) need no finer resolution.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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
