//! The engine's liveness [`Cadence`]: one grid of [`Beat`]s shared by every fabric, and the
//! per-peer [`Liveness`] watch that the beats sample.

use std::time::{Duration, Instant};

use crate::config::Config;

#[cfg(doc)]
use super::FabricControl;

/// One turn of the engine's liveness [`Cadence`], given to every fabric's
/// [`FabricControl::tick`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Beat {
    /// Bump this side's heartbeat now (every [`HEARTBEAT_BEATS`]-th beat with liveness on).
    pub(crate) heartbeat: bool,
    /// Sample the peers' proof of life now (liveness on).
    pub(crate) check: bool,
}

/// Beats per heartbeat with liveness on: a beat every twelfth of the liveness timeout, a
/// heartbeat every quarter.
///
/// A peer's silence is measured from the beat that last saw its counter move, so a dead peer is
/// reported at most one beat (a twelfth, 8 %) after the timeout, inside the promised 20 %; a
/// beat every quarter would allow 25 %. With the default 1-s timeout that is 12 wake-ups of the
/// control thread per second while connections exist, where a fixed 10-ms tick made 100.
pub(crate) const HEARTBEAT_BEATS: u64 = 3;

/// What twelve beats add to the liveness timeout. A peer is unresponsive once the coarse clock
/// (the beats' actual wake-up times) shows the timeout since the beat that last heard it. With
/// the period a plain twelfth of the timeout (truncated to nanoseconds), twelve beats fell a
/// few nanoseconds short of it (or matched it exactly), so whenever the twelfth wake-up was not
/// that much later than the first (about half the time) a thirteenth beat was needed: the peer
/// was reported a beat (8 %) late. A period of a twelfth of the timeout plus this margin makes
/// twelve beats reach it despite ordinary wake-up jitter. Measured by the soak's mid-record
/// stops (500-ms timeout, loaded 2-core machine): the silence reported was 541 ms (13 beats)
/// in 7 of 11 cases before.
const BEAT_MARGIN: Duration = Duration::from_millis(1);

/// The beat when liveness is off: the shm heartbeat word is then for tooling only.
pub(crate) const BEAT_IDLE: Duration = Duration::from_secs(1);

/// The engine's liveness cadence: one grid of beats shared by every fabric, so that the shm
/// heartbeats and checks and the advance of the coarse clock (which the TCP and RDMA pollers
/// read for their own liveness) cost one wake-up, not one per fabric.
#[derive(Debug)]
pub(crate) struct Cadence {
    every: Duration,
    liveness: bool,
    next: Instant,
    beats: u64,
}

impl Cadence {
    pub(crate) fn new(cfg: &Config, now: Instant) -> Cadence {
        let every = match cfg.liveness() {
            Some(timeout) => beat_period(timeout),
            None => BEAT_IDLE,
        };
        Cadence {
            every,
            liveness: cfg.liveness().is_some(),
            next: now,
            beats: 0,
        }
    }

    /// The beat due at `now`, if one is. The grid is kept (the next beat is one period after
    /// this one's due time), unless the thread was so late that it would be in the past.
    pub(crate) fn due(&mut self, now: Instant) -> Option<Beat> {
        if now < self.next {
            return None;
        }
        self.next += self.every;
        if self.next <= now {
            self.next = now + self.every;
        }
        let heartbeat = !self.liveness || self.beats % HEARTBEAT_BEATS == 0;
        self.beats = self.beats.wrapping_add(1);
        Some(Beat {
            heartbeat,
            check: self.liveness,
        })
    }

    /// When the next beat is due.
    pub(crate) fn next(&self) -> Instant {
        self.next
    }
}

/// The beat period for a liveness `timeout`: a twelfth of it and of [`BEAT_MARGIN`] (a
/// heartbeat every [`HEARTBEAT_BEATS`] beats is then a quarter of the timeout, and the margin's).
fn beat_period(timeout: Duration) -> Duration {
    (timeout + BEAT_MARGIN) / (4 * HEARTBEAT_BEATS as u32)
}

/// The earlier of two optional instants.
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The control thread's watch on one peer's proof of life: a counter the peer advances (shm:
/// its heartbeat word; RDMA: messages heard), sampled once per [`Beat`].
///
/// A peer whose counter has not moved for the liveness timeout is unresponsive. The silence is
/// measured from the beat that last saw the counter move, so it is under-estimated by at most
/// one beat; a peer is never declared dead early.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Liveness {
    seen: u64,
    since: Instant,
}

impl Liveness {
    pub(crate) fn new(seen: u64, now: Instant) -> Liveness {
        Liveness { seen, since: now }
    }

    /// When the counter last moved (or observation began).
    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    /// Records the counter's value at `now`; returns how long it has been silent when that is
    /// at least `timeout`.
    pub(crate) fn observe(
        &mut self,
        seen: u64,
        now: Instant,
        timeout: Duration,
    ) -> Option<Duration> {
        if seen != self.seen {
            self.seen = seen;
            self.since = now;
            return None;
        }
        let silent = now.saturating_duration_since(self.since);
        (silent >= timeout).then_some(silent)
    }
}

/// The beat-to-beat gap beyond which this side's own control thread counts as stalled (stopped,
/// descheduled, blocked in a long setup step): liveness observations are restarted rather than
/// blamed on peers.
pub(crate) fn stalled(last_beat: Instant, now: Instant, timeout: Duration) -> bool {
    now.saturating_duration_since(last_beat) > timeout / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Twelve beats reach the liveness timeout with the margin for wake-up jitter, no more.
    #[test]
    fn twelve_beats_reach_the_timeout() {
        for ms in [80u64, 100, 300, 500, 1000, 1500, 7000] {
            let timeout = Duration::from_millis(ms);
            let twelve = beat_period(timeout) * 12;
            assert!(twelve > timeout, "{ms} ms: {twelve:?}");
            assert!(twelve <= timeout + BEAT_MARGIN, "{ms} ms: {twelve:?}");
            assert!(twelve + Duration::from_nanos(12) > timeout + BEAT_MARGIN);
        }
    }
}
