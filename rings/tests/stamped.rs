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

#[test]
fn write_chunks_in_place_and_partial_commits() {
    let (mut p, mut c) = StampedRing::<u64>::new(4);
    p.push(100).unwrap();
    assert_eq!(c.pop(), Ok(100));
    // Tail at 1: a claim of 4 wraps (slots 1, 2, 3, then 0) and sees only 4 free.
    let mut chunk = p.write_chunk_up_to(8);
    assert_eq!(chunk.len(), 4);
    let runs = chunk.runs();
    assert_eq!((runs[0].1, runs[1].1), (3, 1));
    let stride = rings::StampedWriteChunk::<u64>::STRIDE;
    let mut v = 0;
    for (ptr, n) in runs {
        for k in 0..n {
            // SAFETY: `k < n`: a claimed slot's value, `stride` bytes after the previous one.
            unsafe {
                ptr.cast::<u8>()
                    .add(k * stride)
                    .cast::<std::mem::MaybeUninit<u64>>()
                    .write(std::mem::MaybeUninit::new(v))
            };
            v += 1;
        }
    }
    // Publish 3 of the 4: the fourth is not visible and its slot is claimed again next.
    // SAFETY: all four were written above.
    unsafe { chunk.commit(3) };
    let mut out = [MaybeUninit::uninit(); 8];
    assert_eq!(c.peek_into(&mut out), &[0, 1, 2]);
    {
        let mut chunk = p.write_chunk_up_to(8);
        assert_eq!(chunk.len(), 1);
        chunk.write(0, 42);
        // A chunk that goes out of scope uncommitted publishes nothing.
    }
    assert_eq!(c.peek_into(&mut out), &[0, 1, 2]);
    let mut chunk = p.write_chunk_up_to(1);
    chunk.write(0, 43);
    // SAFETY: slot 0 written just above.
    unsafe { chunk.commit(5) };
    assert_eq!(c.peek_into(&mut out), &[0, 1, 2, 43]);
    assert_eq!(p.write_chunk_up_to(8).len(), 0);
    c.release(4);
    assert_eq!(p.write_chunk_up_to(8).len(), 4);
    assert_eq!(c.peek(), Err(rings::PeekError::Empty));
    p.push(7).unwrap();
    assert_eq!(c.peek(), Ok(&7));
    assert_eq!(c.pop(), Ok(7));
}

#[test]
#[should_panic(expected = "slot 1 of a chunk of 1")]
fn chunk_write_out_of_range_panics() {
    let (mut p, _c) = StampedRing::<u64>::new(1);
    p.write_chunk_up_to(4).write(1, 0);
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
                if rng.below(5) == 0 {
                    // A chunk written in place, partly committed.
                    let want = (n - i).min(1 + rng.below(8)) as usize;
                    let mut chunk = p.write_chunk_up_to(want);
                    let k = chunk.len();
                    for j in 0..k {
                        let v = i + j as u64;
                        chunk.write(j, [v, !v]);
                    }
                    let commit = rng.below(k as u64 + 1) as usize;
                    // SAFETY: every claimed slot was written just above.
                    unsafe { chunk.commit(commit) };
                    i += commit as u64;
                    if k == 0 {
                        thread::yield_now();
                    }
                    continue;
                }
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

#[test]
fn write_chunk_refresh_below_reads_the_head_only_below_its_mark() {
    let (mut p, mut c) = StampedRing::<u32>::new(8);
    // 6 written and taken: the producer's cached head still says 2 free.
    for v in 0..6 {
        p.push(v).unwrap();
    }
    for v in 0..6 {
        assert_eq!(c.pop(), Ok(v));
    }
    // 2 look free, not below 2: the head is not read, the chunk is what the cache says.
    assert_eq!(p.write_chunk_refresh_below(8, 2).len(), 2);
    // 2 look free, below 3: the head is read, all 8 are free.
    assert_eq!(p.write_chunk_refresh_below(8, 3).len(), 8);
    // And the chunk never exceeds `max`.
    assert_eq!(p.write_chunk_refresh_below(4, 1).len(), 4);
    // A full ring (as cached and as read) gives an empty chunk even with `below == 1`.
    for v in 0..8 {
        p.push(v).unwrap();
    }
    assert_eq!(p.write_chunk_refresh_below(8, 1).len(), 0);
    assert_eq!(c.pop(), Ok(0));
    assert_eq!(p.write_chunk_refresh_below(8, 1).len(), 1);
}
