//! Doorbells: how a thread that sleeps ([`IdleStrategy::Block`](crate::IdleStrategy::Block))
//! is woken by the thread that gives it work, without costing anything while it spins.
//!
//! A doorbell is one 32-bit word, owned by the *sleeper* (the receiver), rung by its
//! *ringers* (the sender that publishes to it, and whoever must wake it for another reason:
//! the control thread on a close). The word lives wherever both can reach it: in the shm
//! segment (a cross-process futex) or in the process (a private futex).
//!
//! # Protocol
//!
//! ```text
//! sleeper                                   ringer
//! arm(): word |= MAY_SLEEP   (once, at setup, before the ringer's first ring)
//! ...                                       publish work (Release store)
//! v = announce(): word |= SLEEPING (AcqRel)  ring(): if word == 0 { return }   (plain load)
//! re-check for work (Acquire loads)                 old = word &= !SLEEPING (AcqRel)
//! work?  cancel()                                    if old has SLEEPING { futex_wake }
//! none?  sleep(v, timeout): futex_wait(word, v)
//! ```
//!
//! No lost wake-up: the sleeper's `announce` and the ringer's `ring` are read-modify-writes of
//! the one word, so they are totally ordered. If the ring comes second it reads `SLEEPING`
//! and wakes the sleeper (whose `futex_wait` then either is woken or finds the word changed
//! and does not sleep). If the ring comes first, the sleeper's announce reads from it (an
//! AcqRel RMW reading a Release RMW), so the work published before the ring happens-before
//! the sleeper's re-check, which finds it. The loom model `engine/tests/doorbell_loom.rs`
//! checks exactly this, with the futex modelled as the kernel does it (check the value and
//! queue the waiter atomically with respect to a wake).
//!
//! # What a spinning receiver costs
//!
//! Nothing but one plain load per ring of a line that nobody writes: a receiver that never
//! sleeps never arms, so `ring` sees 0 and returns. `arm` must happen-before the ringer's
//! first ring (shm: the receiver arms before it answers the handshake), which is what makes
//! that plain load enough. An armed receiver costs each publication one locked RMW
//! (~20 cycles), whether it sleeps or not at that moment.
//!
//! The word may be written by an untrusted peer (shm): garbage there causes at most a
//! spurious wake-up or a sleep that ends at its timeout, never a hang (every sleep is
//! bounded).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Set once by a receiver that may sleep: its ringers must ring.
pub const MAY_SLEEP: u32 = 1;
/// Set while the receiver sleeps or is about to.
pub const SLEEPING: u32 = 2;

/// Whose futex the word is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Both sides are threads of this process (a private futex: cheaper to wait and wake).
    Process,
    /// The word is in memory shared with another process (the shm segment).
    Shared,
}

/// The word a doorbell works on: an atomic `u32` and the futex calls on it. Implemented by
/// [`AtomicU32`] (the real futex) and, under `cfg(loom)`, by `LoomWord` (a model of it).
pub trait Word {
    /// As [`AtomicU32::load`].
    fn load(&self, order: Ordering) -> u32;
    /// As [`AtomicU32::fetch_or`].
    fn fetch_or(&self, bits: u32, order: Ordering) -> u32;
    /// As [`AtomicU32::fetch_and`].
    fn fetch_and(&self, bits: u32, order: Ordering) -> u32;
    /// `FUTEX_WAIT`: sleeps while the word is `expected`, for at most `timeout`.
    fn wait(&self, expected: u32, timeout: Duration, scope: Scope);
    /// `FUTEX_WAKE`: wakes every thread waiting on the word.
    fn wake(&self, scope: Scope);
}

/// What [`Doorbell::announce`] saw: the value the sleep waits on.
#[derive(Debug, Clone, Copy)]
#[must_use = "re-check for work, then sleep or cancel"]
pub struct Announced(u32);

/// A doorbell over a word the caller keeps alive (see the [module docs](self)).
#[derive(Debug, Clone, Copy)]
pub struct Doorbell<'a, W: Word = AtomicU32> {
    word: &'a W,
    scope: Scope,
}

impl<'a, W: Word> Doorbell<'a, W> {
    /// The doorbell over `word`.
    #[inline]
    pub fn new(word: &'a W, scope: Scope) -> Doorbell<'a, W> {
        Doorbell { word, scope }
    }

    /// Sleeper: from now on ringers ring. Must happen-before the first ring it is to catch.
    #[inline]
    pub fn arm(&self) {
        self.word.fetch_or(MAY_SLEEP, Ordering::Release);
    }

    /// Sleeper: whether [`arm`](Self::arm) was called (as far as this thread sees).
    #[inline]
    pub fn is_armed(&self) -> bool {
        self.word.load(Ordering::Relaxed) & MAY_SLEEP != 0
    }

    /// Sleeper: announces that it is about to sleep. Re-check every source of work after
    /// this; then [`sleep`](Self::sleep) if there is none, else [`cancel`](Self::cancel).
    #[inline]
    pub fn announce(&self) -> Announced {
        let old = self.word.fetch_or(MAY_SLEEP | SLEEPING, Ordering::AcqRel);
        Announced(old | MAY_SLEEP | SLEEPING)
    }

    /// Sleeper: takes an announcement back (the re-check found work).
    #[inline]
    pub fn cancel(&self) {
        self.word.fetch_and(!SLEEPING, Ordering::Relaxed);
    }

    /// Sleeper: sleeps until rung, or for at most `timeout` (also returns at once if a ring
    /// came after the announcement, and spuriously, as futexes may). Whether a ring woke it
    /// (as far as can be told: a ring that came before the sleep began counts too).
    pub fn sleep(&self, announced: Announced, timeout: Duration) -> bool {
        self.word.wait(announced.0, timeout, self.scope);
        let old = self.word.fetch_and(!SLEEPING, Ordering::Acquire);
        old & SLEEPING == 0
    }

    /// Ringer: call after publishing work. Wakes the sleeper if it announced a sleep; a
    /// plain load when the receiver never armed. Whether it woke one.
    #[inline]
    pub fn ring(&self) -> bool {
        if self.word.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.ring_armed()
    }

    #[inline]
    fn ring_armed(&self) -> bool {
        let old = self.word.fetch_and(!SLEEPING, Ordering::AcqRel);
        if old & SLEEPING != 0 {
            self.word.wake(self.scope);
            return true;
        }
        false
    }
}

#[inline]
fn futex_op(op: libc::c_int, scope: Scope) -> libc::c_int {
    match scope {
        Scope::Process => op | libc::FUTEX_PRIVATE_FLAG,
        Scope::Shared => op,
    }
}

impl Word for AtomicU32 {
    #[inline]
    fn load(&self, order: Ordering) -> u32 {
        AtomicU32::load(self, order)
    }

    #[inline]
    fn fetch_or(&self, bits: u32, order: Ordering) -> u32 {
        AtomicU32::fetch_or(self, bits, order)
    }

    #[inline]
    fn fetch_and(&self, bits: u32, order: Ordering) -> u32 {
        AtomicU32::fetch_and(self, bits, order)
    }

    fn wait(&self, expected: u32, timeout: Duration, scope: Scope) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the word is a live, 4-aligned `AtomicU32` for the duration of the call (the
        // borrow); `ts` is a valid relative timeout; the kernel reads both and writes nothing.
        // Every outcome (woken, EAGAIN: the word changed, ETIMEDOUT, EINTR) is handled the
        // same way by the caller: re-check.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.as_ptr(),
                futex_op(libc::FUTEX_WAIT, scope),
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }

    #[cold]
    fn wake(&self, scope: Scope) {
        // SAFETY: as in `wait`; FUTEX_WAKE only uses the address as a key.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.as_ptr(),
                futex_op(libc::FUTEX_WAKE, scope),
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
}

/// The loom model of a futex word: loom's atomic, and the kernel's side (waiters check the
/// word and queue under the lock that wakers take, as the kernel's hash-bucket lock does).
/// The model never times out: a lost wake-up is a deadlock, which loom reports.
#[cfg(loom)]
#[derive(Debug, Default)]
pub struct LoomWord {
    word: loom::sync::atomic::AtomicU32,
    wakes: loom::sync::Mutex<u64>,
    cond: loom::sync::Condvar,
}

#[cfg(loom)]
impl Word for LoomWord {
    fn load(&self, order: Ordering) -> u32 {
        self.word.load(order)
    }

    fn fetch_or(&self, bits: u32, order: Ordering) -> u32 {
        self.word.fetch_or(bits, order)
    }

    fn fetch_and(&self, bits: u32, order: Ordering) -> u32 {
        self.word.fetch_and(bits, order)
    }

    fn wait(&self, expected: u32, _timeout: Duration, _scope: Scope) {
        let mut wakes = self.wakes.lock().unwrap();
        if self.word.load(Ordering::Relaxed) != expected {
            return;
        }
        let seen = *wakes;
        while *wakes == seen {
            wakes = self.cond.wait(wakes).unwrap();
        }
    }

    fn wake(&self, _scope: Scope) {
        *self.wakes.lock().unwrap() += 1;
        self.cond.notify_all();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn an_unarmed_bell_is_never_rung() {
        let word = AtomicU32::new(0);
        let bell = Doorbell::new(&word, Scope::Process);
        assert!(!bell.ring());
        assert_eq!(word.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_ring_before_the_sleep_makes_the_sleep_return_at_once() {
        let word = AtomicU32::new(0);
        let bell = Doorbell::new(&word, Scope::Process);
        bell.arm();
        let a = bell.announce();
        assert!(bell.ring());
        let t = Instant::now();
        assert!(bell.sleep(a, Duration::from_secs(5)));
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(word.load(Ordering::Relaxed), MAY_SLEEP);
    }

    #[test]
    fn a_sleep_with_no_ring_ends_at_its_timeout() {
        let word = AtomicU32::new(0);
        let bell = Doorbell::new(&word, Scope::Shared);
        bell.arm();
        let a = bell.announce();
        let t = Instant::now();
        assert!(!bell.sleep(a, Duration::from_millis(20)));
        assert!(t.elapsed() >= Duration::from_millis(19));
        assert_eq!(word.load(Ordering::Relaxed), MAY_SLEEP);
    }

    /// Two threads: one publishes a counter and rings, one waits for each value with the
    /// protocol and a long timeout. A lost wake-up shows as a sleep that ran to its timeout.
    #[test]
    fn no_lost_wake_up_over_many_rounds() {
        const ROUNDS: u32 = 20_000;
        let word = Arc::new(AtomicU32::new(0));
        let data = Arc::new(AtomicU32::new(0));
        Doorbell::new(&*word, Scope::Process).arm();
        let (w, d) = (Arc::clone(&word), Arc::clone(&data));
        let ringer = std::thread::spawn(move || {
            let bell = Doorbell::new(&*w, Scope::Process);
            for i in 1..=ROUNDS {
                // Every 64th round lets the sleeper get into the kernel first.
                if i % 64 == 0 {
                    std::thread::sleep(Duration::from_micros(50));
                }
                d.store(i, Ordering::Release);
                bell.ring();
                // Wait for the sleeper to take it (bounded).
                let t = Instant::now();
                while d.load(Ordering::Acquire) != 0 {
                    assert!(t.elapsed() < Duration::from_secs(10), "sleeper stuck");
                    std::hint::spin_loop();
                }
            }
        });
        let bell = Doorbell::new(&*word, Scope::Process);
        let mut timeouts = 0;
        for i in 1..=ROUNDS {
            loop {
                if data.load(Ordering::Acquire) == i {
                    data.store(0, Ordering::Release);
                    break;
                }
                let a = bell.announce();
                if data.load(Ordering::Acquire) == i {
                    bell.cancel();
                    continue;
                }
                let t = Instant::now();
                if !bell.sleep(a, Duration::from_secs(2)) && t.elapsed() >= Duration::from_secs(2) {
                    timeouts += 1;
                }
            }
        }
        ringer.join().unwrap();
        assert_eq!(timeouts, 0, "a sleep ran to its timeout: a lost wake-up");
    }
}
