//! Sleeping and waking on the polled path, for [`IdleStrategy::Block`](crate::IdleStrategy):
//! a poller's wake-up ([`PollerWake`], an `eventfd` that can sit in one `poll(2)` set with
//! sockets and completion channels) and the set a sleeping poller waits on ([`WaitSet`]). An
//! application thread waiting on a polled connection sleeps on the connection's doorbell
//! ([`crate::doorbell`], a futex word), which its poller rings after delivering.
//!
//! The poller's wake-up follows this protocol, free of lost wake-ups:
//!
//! * the **sleeper** announces that it sleeps (stores its flag), issues a `SeqCst` fence,
//!   re-checks every source of work it serves, and only then sleeps; it clears the flag when
//!   it wakes;
//! * the **waker** publishes its work (a ring push, a count store), issues a `SeqCst` fence,
//!   loads the flag and makes the system call only if it is set.
//!
//! Either the sleeper's re-check sees the work, or the waker sees the flag (the two fences are
//! ordered one way or the other). A waker whose target never blocks (an engine without
//! `Block`, known from the configuration) skips all of it: the callers gate the fence on that,
//! so a busy-spinning engine pays nothing.
//!
//! This module stands below the fabrics, the pollers and the handles; it imports none of them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crossbeam_utils::CachePadded;

pub use flag::SleepFlag;

/// The flag half of the protocol, over std's atomics, or loom's under `cfg(loom)` so that
/// `engine/tests/poller_wake_loom.rs` model-checks this very code.
mod flag {
    #[cfg(loom)]
    use loom::sync::atomic::{fence, AtomicBool};
    use std::sync::atomic::Ordering;
    #[cfg(not(loom))]
    use std::sync::atomic::{fence, AtomicBool};

    /// A sleeper's "I sleep" flag (see the [module docs](super)).
    #[derive(Debug, Default)]
    pub struct SleepFlag(AtomicBool);

    impl SleepFlag {
        /// Sleeper: announces that it sleeps (store, then a `SeqCst` fence); re-check every
        /// source of work after this.
        #[inline]
        pub fn announce(&self) {
            self.0.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
        }

        /// Sleeper: awake again (or the re-check found work).
        #[inline]
        pub fn cancel(&self) {
            self.0.store(false, Ordering::Relaxed);
        }

        /// Waker, after publishing: whether the sleeper must be woken (a `SeqCst` fence, then
        /// the flag's load).
        #[inline]
        pub fn must_wake(&self) -> bool {
            fence(Ordering::SeqCst);
            self.must_wake_fenced()
        }

        /// [`must_wake`](Self::must_wake) for a waker that issued the fence itself.
        #[inline]
        pub fn must_wake_fenced(&self) -> bool {
            self.0.load(Ordering::Relaxed)
        }
    }

    /// The waker's `SeqCst` fence, for a caller that checks its gate first (see
    /// [`SleepFlag::must_wake_fenced`]).
    #[inline]
    pub(crate) fn seq_cst_fence() {
        fence(Ordering::SeqCst);
    }
}

pub(crate) use flag::seq_cst_fence;

/// One poller's wake-up: the "I sleep" flag and an `eventfd` written only while it is set.
///
/// Made per poller thread (and for the run-to-completion poller) when the engine's idle
/// strategy is [`Block`](crate::IdleStrategy::Block); the fabrics, the application's handles
/// and the control thread hold it to wake that poller after they gave it work.
#[derive(Debug)]
pub struct PollerWake {
    /// Set by the poller from its announcement until it woke (its own line: the wakers only
    /// read it).
    sleeping: CachePadded<SleepFlag>,
    fd: OwnedFd,
}

impl PollerWake {
    /// A new wake-up (a non-blocking, close-on-exec `eventfd`).
    pub(crate) fn new() -> io::Result<PollerWake> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(PollerWake {
            sleeping: CachePadded::new(SleepFlag::default()),
            // SAFETY: `fd` was just returned by `eventfd` and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The descriptor, readable once woken.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The waker's side, after it published work for this poller: fence, then one load of
    /// the flag, and the `write(2)` only when the poller announced that it sleeps.
    #[inline]
    pub(crate) fn wake(&self) {
        if self.sleeping.must_wake() {
            self.ring();
        }
    }

    /// [`wake`](Self::wake) for a caller that issued the `SeqCst` fence itself.
    #[inline]
    pub(crate) fn wake_fenced(&self) {
        if self.sleeping.must_wake_fenced() {
            self.ring();
        }
    }

    /// Writes the eventfd (a syscall: only when the poller sleeps or is about to).
    #[cold]
    #[inline(never)]
    pub(crate) fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to a descriptor this value owns. A full
        // counter (EAGAIN) already means "woken".
        let _ = unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
    }

    /// The sleeper's announcement; the caller re-checks every source of work after it.
    #[inline]
    pub(crate) fn announce(&self) {
        self.sleeping.announce();
    }

    /// The sleeper is awake (or did not sleep after all).
    #[inline]
    pub(crate) fn cancel(&self) {
        self.sleeping.cancel();
    }

    /// Consumes the eventfd's count (after a wake-up it reported).
    pub(crate) fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from a non-blocking descriptor this value
        // owns; EAGAIN (nothing to read) is fine.
        let _ = unsafe { libc::read(self.fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

/// The descriptors a sleeping poller waits on, and how long it may sleep at most.
///
/// Filled by the poller (its [`PollerWake`]) and by each fabric's `arm`
/// ([`Fabric::arm`](crate::fabric::Fabric::arm),
/// [`FabricConn::arm`](crate::fabric::FabricConn::arm)) right before one `poll(2)`. Its room
/// is allocated once, for the poller's connections; a descriptor that does not fit bounds
/// the sleep to [`WaitSet::POLL_INTERVAL`] instead of growing it.
#[derive(Debug)]
pub struct WaitSet {
    fds: Vec<libc::pollfd>,
    /// The longest sleep the armed sources allow (a fabric that cannot be woken by a
    /// descriptor bounds it).
    limit: Option<Duration>,
}

impl WaitSet {
    /// The bound on a sleep when a source cannot wake it (a descriptor that did not fit the
    /// set, a fabric without a wake-up): such a source is polled this often.
    pub const POLL_INTERVAL: Duration = Duration::from_millis(1);

    /// A set with room for `n` descriptors.
    pub(crate) fn with_capacity(n: usize) -> WaitSet {
        WaitSet {
            fds: Vec::with_capacity(n),
            limit: None,
        }
    }

    /// Empties the set for a new sleep.
    pub(crate) fn clear(&mut self) {
        self.fds.clear();
        self.limit = None;
    }

    /// Wakes the sleep when `fd` is readable (`read`) or writable (`write`).
    pub fn add(&mut self, fd: RawFd, read: bool, write: bool) {
        let mut events = 0;
        if read {
            events |= libc::POLLIN;
        }
        if write {
            events |= libc::POLLOUT;
        }
        if self.fds.len() == self.fds.capacity() {
            // Never grow on the poller: poll more often instead.
            self.limit(Self::POLL_INTERVAL);
            return;
        }
        self.fds.push(libc::pollfd {
            fd,
            events,
            revents: 0,
        });
    }

    /// Sleeps at most `d` (a source that no descriptor reports, or a deadline).
    pub fn limit(&mut self, d: Duration) {
        self.limit = Some(self.limit.map_or(d, |l| l.min(d)));
    }

    /// Whether the set's limit is shorter than `timeout` (a sleep for `timeout` would end at
    /// the limit).
    pub(crate) fn limited(&self, timeout: Duration) -> bool {
        self.limit.is_some_and(|l| l < timeout)
    }

    /// One `ppoll(2)` for at most `timeout` (and the set's limit). Returns the number of ready
    /// descriptors (0: timed out; an interrupted wait counts as 1, a wake-up).
    pub(crate) fn wait(&mut self, timeout: Duration) -> usize {
        let t = self.limit.map_or(timeout, |l| l.min(timeout));
        // `ppoll`, not `poll`: a timeout in nanoseconds. `poll`'s whole milliseconds made a
        // caller that sleeps until a point in time (a pacer: until 100 µs before its next send)
        // oversleep by up to a millisecond (`bench load --idle block` at 200 msgs/s: round-trip
        // p50 570 µs on mem://, 51 µs on shm://'s futex).
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: t.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `fds` is a live array of `len` pollfd structures; `ts` a live timespec; no
        // signal mask.
        let n = unsafe {
            libc::ppoll(
                self.fds.as_mut_ptr(),
                self.fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        if n < 0 {
            1
        } else {
            n as usize
        }
    }

    /// Whether descriptor `i` (in the order added) was reported ready by the last wait.
    pub(crate) fn ready(&self, i: usize) -> bool {
        self.fds.get(i).is_some_and(|p| p.revents != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn poller_wake_is_written_only_while_announced() {
        let w = PollerWake::new().unwrap();
        let mut set = WaitSet::with_capacity(1);
        w.wake();
        set.add(w.fd(), true, false);
        assert_eq!(set.wait(Duration::ZERO), 0, "written while nobody slept");
        w.announce();
        w.wake();
        assert_eq!(set.wait(Duration::from_secs(5)), 1);
        assert!(set.ready(0));
        w.cancel();
        w.drain();
        assert_eq!(set.wait(Duration::ZERO), 0, "drain consumed the count");
    }

    #[test]
    fn a_full_wait_set_bounds_the_sleep() {
        let mut set = WaitSet::with_capacity(0);
        set.add(0, true, false);
        let t = Instant::now();
        assert_eq!(set.wait(Duration::from_secs(5)), 0);
        assert!(t.elapsed() < Duration::from_secs(4));
    }
}
