//! The engine's coarse clock, advanced by the control thread and by the pollers, read by
//! pollers.
//!
//! It advances on every wake-up of the control thread; with connections open and nothing else
//! going on, that is the liveness beat (a twelfth of the liveness timeout), which bounds its
//! lag. Its readers (the pollers' liveness checks and heartbeats) need no finer resolution.
//! The pollers advance it too, every [`REFRESH_CYCLES`] cycles (a run-to-completion
//! application, every [`RTC_REFRESH_CYCLES`]) and after each cycle that gave the core up (a
//! park or a sleep), so that it does not stop while the control thread is held
//! by a long turn: setting up an RDMA connection registers its memory there (about a second
//! for 48-MiB large slots in the Soft-RoCE VM), and with the clock stopped no heartbeat fell
//! due on the engine's other connections, whose peers then declared them unresponsive.

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

/// Cycles between a dedicated poller's own advances of the [`Clock`] while it spins: a clock
/// read (tens of ns) and a write of the clock's line, which every poller of the engine reads
/// each cycle, once in 1024 cycles of tens of ns or more (tens of µs apart at the least).
pub(crate) const REFRESH_CYCLES: u32 = 1024;

/// Cycles between a run-to-completion application's advances of the [`Clock`]: its thread the
/// only poller, so more often. A spinning receiver runs a cycle every 8 empty takes
/// ([`crate::poller`]'s `EMPTY_TAKES_PER_CYCLE`), so a clock read every 64 takes; one that
/// calls in every millisecond advances the clock every 64 ms.
pub(crate) const RTC_REFRESH_CYCLES: u64 = 8;

/// The engine's coarse clock: nanoseconds since start, advanced by the control thread (and by
/// the pollers, now and then), read by pollers without a syscall or vDSO call.
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
    /// Advances the clock to now. Any thread may: the clock only moves forward (a thread
    /// that read the time earlier and stores it later does not move it back).
    pub(crate) fn update(&self) {
        let ns = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.now_ns.fetch_max(ns, Ordering::Relaxed);
    }
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::Relaxed)
    }
}
