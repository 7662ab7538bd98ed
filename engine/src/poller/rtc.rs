//! The run-to-completion poller ([`RunToCompletion`]): the agent set driven by the application
//! threads themselves, one at a time, through an [`RtcGuard`].

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

#[cfg(doc)]
use super::COMMAND_BUDGET;
use super::{Agents, IDLE_CYCLES};
use crate::clock::{Clock, RTC_REFRESH_CYCLES};

/// The run-to-completion poller: the same [`Agents`], driven by whichever application thread
/// calls [`Engine::poll`](crate::Engine::poll) (explicitly or inside `send`/`recv`). A
/// non-blocking ownership flag keeps it single-threaded: a thread that finds it taken does not
/// wait (the owner is doing the work for everyone).
///
/// The control thread runs a cycle itself ([`RunToCompletion::poll_if_idle`]) on its liveness
/// beats when no thread has run one since its last look, so that heartbeats go out and peers
/// are checked while the application makes no call.
pub(crate) struct RunToCompletion {
    busy: AtomicBool,
    /// The engine's coarse clock, advanced every [`RTC_REFRESH_CYCLES`] cycles (see
    /// [`crate::clock`]).
    clock: Arc<Clock>,
    /// Cycles run (by any thread), advanced by the owner only.
    cycles: AtomicU64,
    /// Direct takes that found nothing since the last cycle run after one
    /// ([`RtcGuard::poll_after_empty_take`]), advanced by the owner only.
    empty_takes: AtomicU32,
    agents: std::cell::UnsafeCell<Agents>,
}

// SAFETY: `agents` is only accessed while `busy` is held (acquired with an Acquire CAS, released
// with a Release store), so at most one thread touches it at a time; `Agents` is `Send`.
unsafe impl Sync for RunToCompletion {}

impl RunToCompletion {
    pub(crate) fn new(agents: Agents, clock: Arc<Clock>) -> RunToCompletion {
        RunToCompletion {
            busy: AtomicBool::new(false),
            clock,
            cycles: AtomicU64::new(0),
            empty_takes: AtomicU32::new(0),
            agents: std::cell::UnsafeCell::new(agents),
        }
    }

    /// Runs one cycle if no other thread is running one; returns the work done.
    #[inline]
    pub(crate) fn try_poll(&self, now_ns: u64) -> usize {
        match self.try_lock() {
            Some(mut g) => g.poll(now_ns),
            None => 0,
        }
    }

    /// Takes ownership of the poller, unless another thread has it. One atomic
    /// compare-and-swap; a waiting loop holds the guard across many cycles so it pays that (a full
    /// barrier on x86: measured at a large share of a run-to-completion cycle) once per wait.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<RtcGuard<'_>> {
        if self.busy.load(Ordering::Relaxed) {
            return None;
        }
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| RtcGuard {
                owner: self,
                _not_send: std::marker::PhantomData,
            })
    }

    /// When no thread has run a cycle since the cycle count was `seen` (and no thread is
    /// running one now), runs a cycle, and more while commands wait, at most [`IDLE_CYCLES`];
    /// returns the cycle count to pass next time. Never waits. The control thread calls it on
    /// its liveness beats; it advances the engine's coarse clock before each further cycle.
    ///
    /// More than one while commands wait: a cycle takes at most [`COMMAND_BUDGET`] commands,
    /// so one cycle per beat would attach a burst of accepted connections a few per beat, and
    /// those still queued would send no heartbeat (200 connections took 25 beats, two seconds,
    /// and the peers of most declared them unresponsive). Not more while the cycles only find
    /// data work: the application's own calls serve that (and cannot while this runs). Cycles
    /// until one found no work, all by the clock of the beat, starved the liveness checks they
    /// were run for: in the RDMA VM, with a receiver that called in every 100 ms (a cycle at
    /// every 8th empty take) during a 48-MiB rendezvous pull, the control thread's beat ran 9
    /// cycles that each found READ completions and posted READs, about 600 ms in all with the
    /// clock standing still: no check fell due, no heartbeat went out, and the sender declared
    /// the receiver unresponsive at its 500-ms liveness timeout.
    pub(crate) fn poll_if_idle(&self, seen: u64) -> u64 {
        let cycles = self.cycles.load(Ordering::Relaxed);
        if cycles == seen {
            if let Some(mut g) = self.try_lock() {
                g.poll(self.clock.now_ns());
                for _ in 1..IDLE_CYCLES {
                    if !g.commands_pending() {
                        break;
                    }
                    self.clock.update();
                    g.poll(self.clock.now_ns());
                }
            }
        }
        self.cycles.load(Ordering::Relaxed)
    }

    /// Takes ownership of the poller, waiting (yielding) while another thread runs a cycle
    /// (engine shutdown: only the control thread may still hold it, for one cycle).
    pub(crate) fn lock(&self) -> RtcGuard<'_> {
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            std::thread::yield_now();
        }
    }
}

/// How many empty direct takes run one cycle ([`RtcGuard::poll_after_empty_take`]): a
/// spinning receiver's other work runs at least every 8 spins (over `tcp://` a spin is about
/// 200 ns here: one `recv` that finds nothing).
pub(crate) const EMPTY_TAKES_PER_CYCLE: u32 = 8;

/// Exclusive use of the run-to-completion poller; released on drop.
pub(crate) struct RtcGuard<'a> {
    owner: &'a RunToCompletion,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl RtcGuard<'_> {
    /// One cycle.
    #[inline]
    pub(crate) fn poll(&mut self, mut now_ns: u64) -> usize {
        // Only the owner writes `cycles`: a load and a store, no read-modify-write.
        let c = &self.owner.cycles;
        let n = c.load(Ordering::Relaxed).wrapping_add(1);
        c.store(n, Ordering::Relaxed);
        if n % RTC_REFRESH_CYCLES == 0 {
            // The clock must not stop while the control thread is held (see `crate::clock`).
            self.owner.clock.update();
            now_ns = self.owner.clock.now_ns();
        }
        // SAFETY: the guard holds `busy`, so no other thread accesses `agents` until it drops.
        unsafe { (*self.owner.agents.get()).do_work(now_ns) }
    }

    /// Whether a command waits for any agent (see [`RunToCompletion::poll_if_idle`]).
    fn commands_pending(&mut self) -> bool {
        // SAFETY: as in `poll`.
        unsafe { (*self.owner.agents.get()).commands_pending() }
    }

    /// After a direct take that found nothing (an empty run-to-completion `try_recv`, `poll` or
    /// wait on a direct fabric): one cycle, but only on every [`EMPTY_TAKES_PER_CYCLE`]-th such
    /// call of this engine, else nothing. The take itself asked the connection's fabric (over
    /// `tcp://`, the one `recv` of the spin); the cycle serves the rest (commands, the liveness
    /// check, the other connections, sends queued in the rings), which can wait a few spins.
    /// A cycle after every take made a spinning receiver's loop about 185 instructions longer
    /// over `tcp://` (callgrind), and each nanosecond of that loop is on average half a
    /// nanosecond more before a message is seen.
    #[inline]
    pub(crate) fn poll_after_empty_take(&mut self, now_ns: u64) -> usize {
        // Only the owner writes `empty_takes`: a load and a store, no read-modify-write.
        let t = &self.owner.empty_takes;
        let n = t.load(Ordering::Relaxed) + 1;
        if n < EMPTY_TAKES_PER_CYCLE {
            t.store(n, Ordering::Relaxed);
            return 0;
        }
        t.store(0, Ordering::Relaxed);
        self.poll(now_ns)
    }

    /// Runs `f` on the poller's half of the connection `shared` (the direct way without the
    /// rings, [`RtcConn`](crate::link::RtcConn)) to send; `None` when none of these agents has
    /// it registered.
    #[inline]
    pub(crate) fn direct<R>(
        &mut self,
        shared: &crate::link::ConnShared,
        f: impl FnOnce(&mut dyn crate::link::RtcConn) -> R,
    ) -> Option<R> {
        // SAFETY: as in `poll`; the half is reached through the agents the guard owns, and
        // `f` runs no cycle (the guard is borrowed for it).
        unsafe { (*self.owner.agents.get()).rtc_conn(shared, false) }.map(f)
    }

    /// [`direct`](Self::direct) to receive: a fabric whose completions are shared polls them
    /// first when the half has nothing pending (`Poller::rtc_conn`).
    #[inline]
    pub(crate) fn direct_rx<R>(
        &mut self,
        shared: &crate::link::ConnShared,
        f: impl FnOnce(&mut dyn crate::link::RtcConn) -> R,
    ) -> Option<R> {
        // SAFETY: as in `direct`.
        unsafe { (*self.owner.agents.get()).rtc_conn(shared, true) }.map(f)
    }

    /// `Block`: arms and sleeps for at most `max` (see [`Agents::sleep`]).
    pub(crate) fn sleep(&mut self, max: std::time::Duration) -> super::Slept {
        // SAFETY: as in `poll`.
        unsafe { (*self.owner.agents.get()).sleep(max) }
    }

    /// Retires every connection (engine shutdown).
    pub(crate) fn retire_all(&mut self) {
        // SAFETY: as in `poll`.
        unsafe { (*self.owner.agents.get()).retire_all() }
    }
}

impl Drop for RtcGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.owner.busy.store(false, Ordering::Release);
    }
}
