//! loom model of the pollers' wake-up protocol (`spinwire::wake::SleepFlag`, the flag half of
//! `PollerWake`): every interleaving, up to `LOOM_MAX_PREEMPTIONS` preemptions, of a sleeper
//! (a poller) that waits for each of a waker's publications with announce (store, `SeqCst`
//! fence) / re-check / sleep, and wakers (an application thread's send, the control thread's
//! command) that publish, fence and write the eventfd only when the flag is set. The eventfd
//! is modelled as the kernel has it (a counter: a write before the wait makes the wait return)
//! and without a timeout, so a lost wake-up is a deadlock, which loom reports.
//!
//! Run with `scripts/ci/loom.sh`.
#![cfg(loom)]

use std::sync::atomic::Ordering;

use loom::sync::atomic::AtomicU32;
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use spinwire::wake::SleepFlag;

/// An eventfd: `write` adds one, `wait` blocks until the count is nonzero and takes it.
#[derive(Default)]
struct EventFd {
    count: Mutex<u64>,
    cond: Condvar,
}

impl EventFd {
    fn write(&self) {
        *self.count.lock().unwrap() += 1;
        self.cond.notify_all();
    }

    fn wait(&self) {
        let mut c = self.count.lock().unwrap();
        while *c == 0 {
            c = self.cond.wait(c).unwrap();
        }
        *c = 0;
    }
}

/// The poller's side: waits with the protocol until `ready()`.
fn sleep_until(flag: &SleepFlag, efd: &EventFd, ready: impl Fn() -> bool) {
    loop {
        if ready() {
            return;
        }
        flag.announce();
        if ready() {
            flag.cancel();
            return;
        }
        efd.wait();
        flag.cancel();
    }
}

/// A waker's side: publish `v` (a plain Release store, as a ring push is), then wake only if
/// the flag says so.
fn publish(flag: &SleepFlag, efd: &EventFd, data: &AtomicU32, v: u32) {
    data.store(v, Ordering::Release);
    if flag.must_wake() {
        efd.write();
    }
}

/// One waker publishes twice; the sleeper waits for each publication in turn.
#[test]
fn poller_never_misses_a_publication() {
    loom::model(|| {
        let flag = Arc::new(SleepFlag::default());
        let efd = Arc::new(EventFd::default());
        let data = Arc::new(AtomicU32::new(0));
        let (f, e, d) = (flag.clone(), efd.clone(), data.clone());
        let waker = thread::spawn(move || {
            for i in 1..=2 {
                publish(&f, &e, &d, i);
            }
        });
        for i in 1..=2 {
            sleep_until(&flag, &efd, || data.load(Ordering::Acquire) >= i);
        }
        waker.join().unwrap();
    });
}

/// Two wakers (an application thread and the control thread) publish once each; the sleeper
/// waits for both.
#[test]
fn poller_never_misses_either_of_two_wakers() {
    loom::model(|| {
        let flag = Arc::new(SleepFlag::default());
        let efd = Arc::new(EventFd::default());
        let data = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
        let wakers: Vec<_> = (0..2)
            .map(|i| {
                let (f, e, d) = (flag.clone(), efd.clone(), data.clone());
                thread::spawn(move || publish(&f, &e, &d[i], 1))
            })
            .collect();
        sleep_until(&flag, &efd, || {
            data[0].load(Ordering::Acquire) == 1 && data[1].load(Ordering::Acquire) == 1
        });
        for w in wakers {
            w.join().unwrap();
        }
    });
}
