//! loom model of the doorbell protocol (`spinwire::doorbell`, the wake-up of
//! `IdleStrategy::Block`): every interleaving, up to `LOOM_MAX_PREEMPTIONS` preemptions, of a
//! sleeper that waits for each of a ringer's publications with announce / re-check / sleep,
//! and of a second ringer (the control thread's close) beside them. The futex is modelled
//! without a timeout, so a lost wake-up is a deadlock, which loom reports; a stale re-check
//! fails the assertions.
//!
//! Run with `scripts/ci/loom.sh`.
#![cfg(loom)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use loom::sync::atomic::AtomicU32;
use loom::sync::Arc;
use loom::thread;
use spinwire::doorbell::{Doorbell, LoomWord, Scope};

/// Waits with the protocol until `ready` says true; returns what it saw.
fn wait_for(bell: &Doorbell<'_, LoomWord>, ready: impl Fn() -> bool) {
    loop {
        if ready() {
            return;
        }
        let a = bell.announce();
        if ready() {
            bell.cancel();
            return;
        }
        bell.sleep(a, Duration::from_secs(1));
    }
}

/// One ringer publishes two values, ringing after each; the sleeper waits for each in turn.
#[test]
fn sleeper_never_misses_a_publication() {
    loom::model(|| {
        let word = Arc::new(LoomWord::default());
        let data = Arc::new(AtomicU32::new(0));
        Doorbell::new(&*word, Scope::Process).arm();
        let (w, d) = (Arc::clone(&word), Arc::clone(&data));
        let ringer = thread::spawn(move || {
            let bell = Doorbell::new(&*w, Scope::Process);
            for i in 1..=2 {
                d.store(i, Ordering::Release);
                bell.ring();
            }
        });
        let bell = Doorbell::new(&*word, Scope::Process);
        wait_for(&bell, || data.load(Ordering::Acquire) >= 1);
        wait_for(&bell, || data.load(Ordering::Acquire) == 2);
        ringer.join().unwrap();
    });
}

/// Two ringers (the sender and the control thread marking a close), each publishing its own
/// flag; the sleeper waits until it has seen both.
#[test]
fn two_ringers_each_wake_the_sleeper() {
    loom::model(|| {
        let word = Arc::new(LoomWord::default());
        let sent = Arc::new(AtomicU32::new(0));
        let closed = Arc::new(AtomicU32::new(0));
        Doorbell::new(&*word, Scope::Process).arm();
        let spawn_ringer = |flag: &Arc<AtomicU32>| {
            let (w, f) = (Arc::clone(&word), Arc::clone(flag));
            thread::spawn(move || {
                f.store(1, Ordering::Release);
                Doorbell::new(&*w, Scope::Process).ring();
            })
        };
        let a = spawn_ringer(&sent);
        let b = spawn_ringer(&closed);
        let bell = Doorbell::new(&*word, Scope::Process);
        wait_for(&bell, || {
            sent.load(Ordering::Acquire) == 1 && closed.load(Ordering::Acquire) == 1
        });
        a.join().unwrap();
        b.join().unwrap();
    });
}

/// An unarmed bell is a plain load for the ringer: it never writes the word.
#[test]
fn an_unarmed_bell_costs_the_ringer_nothing() {
    loom::model(|| {
        let word = Arc::new(LoomWord::default());
        let w = Arc::clone(&word);
        let t = thread::spawn(move || Doorbell::new(&*w, Scope::Process).ring());
        assert!(!t.join().unwrap());
        assert!(!Doorbell::new(&*word, Scope::Process).is_armed());
    });
}
