//! `StampedRing`: the single-thread contract (capacity, FIFO, deferral, peek and release,
//! wrap-around, abandonment) and a two-thread stress test (random mixes of every call on
//! both sides; every wait bounded by `DEADLINE`; the spinning tests of this file take a lock,
//! so only one pair of threads runs at a time).
//!
//! Set `RINGS_STRESS_SEED` to replay a failing seed (it is printed on failure).

use std::mem::MaybeUninit;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use rings::{CapacityError, PopError, PushError, StampedRing};

const DEADLINE: Duration = Duration::from_secs(120);
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn capacity_rounds_up_and_rejects_zero() {
    let (p, c) = StampedRing::<u64>::new(5);
    assert_eq!(p.capacity(), 8);
    assert_eq!(c.capacity(), 8);
    assert!(matches!(
        StampedRing::<u64>::try_new(0),
        Err(CapacityError::Zero)
    ));
    assert!(matches!(
        StampedRing::<u64>::try_new(usize::MAX),
        Err(CapacityError::TooLarge { .. })
    ));
}

#[test]
fn fifo_full_and_wrap_around() {
    let (mut p, mut c) = StampedRing::<u32>::new(4);
    let mut next_in = 0;
    let mut next_out = 0;
    // Many laps: stamps from earlier laps must never look current.
    for round in 0..100 {
        let burst = 1 + round % 4;
        for _ in 0..burst {
            p.push(next_in).unwrap();
            next_in += 1;
        }
        if burst == 4 {
            assert!(matches!(p.push(99), Err(PushError::Full(99))));
            assert_eq!(p.slots(), 0);
        }
        for _ in 0..burst {
            assert_eq!(c.pop(), Ok(next_out));
            next_out += 1;
        }
        assert_eq!(c.pop(), Err(PopError::Empty));
        assert!(c.is_empty());
        assert_eq!(p.slots(), 4);
    }
}

#[test]
fn deferred_items_are_invisible_until_published() {
    let (mut p, mut c) = StampedRing::<u32>::new(4);
    p.push_deferred(1).unwrap();
    p.push_deferred(2).unwrap();
    assert_eq!(p.deferred(), 2);
    assert!(c.is_empty());
    // A push publishes the run before it, then itself.
    p.push(3).unwrap();
    assert_eq!(p.deferred(), 0);
    assert_eq!(c.pop(), Ok(1));
    p.push_deferred(4).unwrap();
    p.push_deferred(5).unwrap();
    // Deferred items hold their slots: 2 queued + 2 deferred fill the ring.
    assert!(matches!(p.push_deferred(6), Err(PushError::Full(6))));
    assert_eq!(c.pop(), Ok(2));
    assert_eq!(c.pop(), Ok(3));
    assert_eq!(c.pop(), Err(PopError::Empty));
    p.publish_deferred();
    assert_eq!(c.pop(), Ok(4));
    // Dropping the producer publishes what it deferred.
    p.push_deferred(7).unwrap();
    drop(p);
    assert!(c.is_abandoned());
    assert_eq!(c.pop(), Ok(5));
    assert_eq!(c.pop(), Ok(7));
    assert_eq!(c.pop(), Err(PopError::Empty));
}

#[test]
fn peek_into_keeps_items_until_released() {
    let (mut p, mut c) = StampedRing::<u32>::new(8);
    for i in 0..5 {
        p.push(i).unwrap();
    }
    let mut out = [MaybeUninit::uninit(); 3];
    assert_eq!(c.peek_into(&mut out), &[0, 1, 2]);
    // Nothing released: the same items again, and the producer sees the slots taken.
    assert_eq!(c.peek_into(&mut out), &[0, 1, 2]);
    assert_eq!(p.slots(), 3);
    c.release(2);
    assert_eq!(p.slots(), 5);
    let mut big = [MaybeUninit::uninit(); 8];
    assert_eq!(c.peek_into(&mut big), &[2, 3, 4]);
    // A release larger than what was seen is cut to it.
    c.release(100);
    assert_eq!(p.slots(), 8);
    assert!(c.is_empty());
    c.release(1);
    p.push(9).unwrap();
    assert_eq!(c.pop(), Ok(9));
    // The consumer's drop is seen by the producer.
    drop(c);
    assert!(p.is_abandoned());
}

/// A small xorshift generator (no dependency).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    std::env::var("RINGS_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        })
}

fn items() -> u64 {
    if cfg!(debug_assertions) {
        200_000
    } else {
        2_000_000
    }
}

/// One producer thread, one consumer thread, both mixing every call at random, items checked
/// in order (a value that arrives early, late, twice or torn fails). Run for capacities 1, 4
/// and 64.
#[test]
fn two_threads_random_mix() {
    let _g = serial();
    let seed = seed();
    eprintln!("RINGS_STRESS_SEED={seed}");
    for cap in [1usize, 4, 64] {
        let n = items() / if cap == 1 { 4 } else { 1 };
        // Two words per item, derived from each other: a torn copy fails the check.
        let (mut p, mut c) = StampedRing::<[u64; 2]>::new(cap);
        let start = Instant::now();
        let producer = thread::spawn(move || {
            let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
            let mut i = 0u64;
            while i < n {
                assert!(start.elapsed() < DEADLINE, "producer stuck at {i}");
                let item = [i, !i];
                let r = match rng.below(4) {
                    0 | 1 => p.push(item),
                    2 => p.push_deferred(item),
                    _ => {
                        p.publish_deferred();
                        p.push_deferred(item)
                    }
                };
                match r {
                    Ok(()) => i += 1,
                    Err(PushError::Full(_)) => {
                        // The consumer waits for the deferred ones: publish before waiting.
                        p.publish_deferred();
                        thread::yield_now();
                    }
                }
                if p.deferred() > 0 && rng.below(8) == 0 {
                    p.publish_deferred();
                }
            }
            p.publish_deferred();
            // Dropping publishes too; keep the handle until the consumer is done.
            p
        });
        let mut rng = Rng(seed);
        let mut want = 0u64;
        let mut out = vec![MaybeUninit::uninit(); cap + 3];
        while want < n {
            assert!(
                start.elapsed() < DEADLINE,
                "consumer stuck at {want} (seed {seed})"
            );
            match rng.below(3) {
                0 => match c.pop() {
                    Ok(v) => {
                        assert_eq!(v, [want, !want], "seed {seed}");
                        want += 1;
                    }
                    Err(PopError::Empty) => thread::yield_now(),
                },
                1 => {
                    let k = 1 + rng.below(out.len() as u64) as usize;
                    let got = c.peek_into(&mut out[..k]);
                    for (j, v) in got.iter().enumerate() {
                        let w = want + j as u64;
                        assert_eq!(*v, [w, !w], "seed {seed}");
                    }
                    let len = got.len();
                    if len == 0 {
                        thread::yield_now();
                    }
                    let take = rng.below(len as u64 + 1) as usize;
                    c.release(take);
                    want += take as u64;
                }
                _ => {
                    if c.is_empty() {
                        thread::yield_now();
                    }
                }
            }
        }
        let mut p = producer.join().expect("producer");
        assert!(c.is_empty());
        assert_eq!(p.slots(), p.capacity());
        drop(p);
        assert!(c.is_abandoned());
        assert_eq!(c.pop(), Err(PopError::Empty));
    }
}

/// Spinning on both sides (no yields, as the poller and the application do): one item at a
/// time through a ring of 1, then bursts through a ring of 8, in order.
#[test]
fn two_threads_spinning_ping_pong() {
    let _g = serial();
    let rounds = if cfg!(debug_assertions) {
        20_000
    } else {
        200_000
    };
    let (mut ap, mut bc) = StampedRing::<u64>::new(1);
    let (mut bp, mut ac) = StampedRing::<u64>::new(8);
    let start = Instant::now();
    let echo = thread::spawn(move || {
        let mut out = [MaybeUninit::uninit(); 8];
        let mut got = 0u64;
        while got < rounds {
            assert!(start.elapsed() < DEADLINE, "echo stuck at {got}");
            let n = {
                let items = bc.peek_into(&mut out);
                for &v in items {
                    assert_eq!(v, got);
                    got += 1;
                    while bp.push(v).is_err() {
                        assert!(start.elapsed() < DEADLINE, "echo reply stuck");
                    }
                }
                items.len()
            };
            bc.release(n);
        }
    });
    for i in 0..rounds {
        while ap.push(i).is_err() {
            assert!(start.elapsed() < DEADLINE, "send stuck at {i}");
        }
        loop {
            assert!(start.elapsed() < DEADLINE, "reply stuck at {i}");
            if let Ok(v) = ac.pop() {
                assert_eq!(v, i);
                break;
            }
        }
    }
    echo.join().expect("echo");
}
