//! loom model checks: every interleaving of a few operations per side on tiny rings (capacities
//! 1, 2 and 4; 3 rounds up to 4), up to `LOOM_MAX_PREEMPTIONS` preemptions (`scripts/ci/loom.sh`
//! sets 4). Slot accesses are tracked by loom (see `src/primitive.rs`),
//! so a missing happens-before edge between a slot write and its read shows up as a loom panic.
//!
//! Run with `scripts/ci/loom.sh`.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use loom::thread;
use rings::{PopError, PushError, RingBuffer};

/// Pushes `value`, yielding to loom while the ring is full. Returns `false` if the consumer
/// went away.
fn push_wait<T>(p: &mut rings::Producer<T>, mut value: T) -> bool {
    loop {
        match p.push(value) {
            Ok(()) => return true,
            Err(PushError::Full(back)) => {
                if p.is_abandoned() {
                    return false;
                }
                value = back;
                thread::yield_now();
            }
        }
    }
}

/// Pops one item, yielding to loom while the ring is empty; `None` once the producer is gone
/// and the ring is drained.
fn pop_wait<T>(c: &mut rings::Consumer<T>) -> Option<T> {
    loop {
        match c.pop() {
            Ok(v) => return Some(v),
            Err(PopError::Empty) => {
                if c.is_abandoned() {
                    // The producer's last pushes happen before its drop: one more try sees them.
                    return c.pop().ok();
                }
                thread::yield_now();
            }
        }
    }
}

/// For each of `want` in order: `take(ring, false)` (a peek) until it shows the item, then
/// `take(ring, true)` (a pop) must return the same.
fn peek_then_pop_each<R>(
    want: impl IntoIterator<Item = u32>,
    ring: &mut R,
    mut take: impl FnMut(&mut R, bool) -> Option<u32>,
) {
    for want in want {
        loop {
            if let Some(v) = take(ring, false) {
                assert_eq!(v, want);
                break;
            }
            thread::yield_now();
        }
        assert_eq!(take(ring, true), Some(want));
    }
}

/// [`peek_then_pop_each`]'s `take` for a `StampedConsumer`.
fn stamped_take(c: &mut rings::StampedConsumer<u32>, pop: bool) -> Option<u32> {
    if pop {
        c.pop().ok()
    } else {
        c.peek().ok().copied()
    }
}

#[test]
fn push_pop_fifo() {
    for cap in 1..=4 {
        loom::model(move || {
            let (mut p, mut c) = RingBuffer::<u32>::new(cap);
            let t = thread::spawn(move || {
                for i in 0..3 {
                    assert!(push_wait(&mut p, i));
                }
            });
            for i in 0..3 {
                assert_eq!(pop_wait(&mut c), Some(i));
            }
            assert_eq!(pop_wait(&mut c), None);
            t.join().unwrap();
        });
    }
}

/// The spinning checks (`peek_spinning`, `is_empty_spinning`, which count empty polls and
/// prefetch) see what `peek` sees: an item they report is readable, with its contents.
#[test]
fn spinning_checks_then_pop() {
    loom::model(|| {
        let (mut p, mut c) = RingBuffer::<u32>::new(1);
        let t = thread::spawn(move || {
            assert!(push_wait(&mut p, 7));
            assert!(push_wait(&mut p, 8));
        });
        loop {
            if let Ok(v) = c.peek_spinning() {
                assert_eq!(*v, 7);
                break;
            }
            thread::yield_now();
        }
        assert_eq!(c.pop(), Ok(7));
        while c.is_empty_spinning() {
            thread::yield_now();
        }
        assert_eq!(c.pop(), Ok(8));
        t.join().unwrap();
    });
}

#[test]
fn peek_then_pop() {
    loom::model(|| {
        let (mut p, mut c) = RingBuffer::<u32>::new(1);
        let t = thread::spawn(move || {
            assert!(push_wait(&mut p, 7));
            assert!(push_wait(&mut p, 8));
        });
        peek_then_pop_each([7, 8], &mut c, |c, pop| {
            if pop {
                c.pop().ok()
            } else {
                c.peek().ok().copied()
            }
        });
        t.join().unwrap();
    });
}

#[test]
fn chunks_fifo() {
    for cap in [2, 3, 4] {
        loom::model(move || {
            let (mut p, mut c) = RingBuffer::<u32>::new(cap);
            let t = thread::spawn(move || {
                let mut next = 0;
                while next < 4 {
                    let mut chunk = p.write_chunk_uninit_up_to(2);
                    if chunk.is_empty() {
                        thread::yield_now();
                        continue;
                    }
                    let n = chunk.len() as u32;
                    let (a, b) = chunk.as_mut_slices();
                    for (i, slot) in a.iter_mut().chain(b).enumerate() {
                        slot.write(next + i as u32);
                    }
                    // SAFETY: every slot of the chunk was written just above.
                    unsafe { chunk.commit_all() };
                    next += n;
                }
            });
            let mut next = 0;
            while next < 4 {
                let chunk = c.read_chunk_up_to(3);
                if chunk.is_empty() {
                    thread::yield_now();
                    continue;
                }
                let (a, b) = chunk.as_slices();
                for &v in a.iter().chain(b) {
                    assert_eq!(v, next);
                    next += 1;
                }
                chunk.release_all();
            }
            t.join().unwrap();
        });
    }
}

#[test]
fn single_pushes_chunked_reads() {
    for cap in [1, 2] {
        loom::model(move || {
            let (mut p, mut c) = RingBuffer::<u32>::new(cap);
            let t = thread::spawn(move || {
                for i in 0..3 {
                    assert!(push_wait(&mut p, i));
                }
            });
            let mut next = 0;
            while next < 3 {
                let mut it = c.read_chunk_up_to(2).into_iter();
                if it.len() == 0 {
                    drop(it);
                    thread::yield_now();
                    continue;
                }
                for v in it.by_ref() {
                    assert_eq!(v, next);
                    next += 1;
                }
            }
            t.join().unwrap();
        });
    }
}

#[test]
fn write_chunk_partial_commit_and_iter() {
    loom::model(|| {
        let (mut p, mut c) = RingBuffer::<u32>::new(4);
        let t = thread::spawn(move || {
            let mut chunk = p.write_chunk(3).unwrap();
            let (a, _) = chunk.as_mut_slices();
            a[0] = 1;
            a[1] = 2;
            chunk.commit(2);
            assert!(push_wait(&mut p, 3));
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            let chunk = c.read_chunk_up_to(2);
            let mut it = chunk.into_iter();
            if let Some(v) = it.next() {
                got.push(v);
            } else {
                drop(it);
                thread::yield_now();
            }
        }
        assert_eq!(got, [1, 2, 3]);
        t.join().unwrap();
    });
}

/// Counts its drops in a shared counter.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn drop_while_items_remain() {
    for cap in [1, 2] {
        loom::model(move || {
            let drops = Arc::new(AtomicUsize::new(0));
            let (mut p, mut c) = RingBuffer::<Counted>::new(cap);
            let d = drops.clone();
            let t = thread::spawn(move || {
                for _ in 0..2 {
                    if !push_wait(&mut p, Counted(d.clone())) {
                        break;
                    }
                }
                drop(p);
            });
            // Take at most one item, then drop the consumer with the rest still queued.
            drop(pop_wait(&mut c));
            drop(c);
            t.join().unwrap();
            // Two items were made; each is dropped exactly once, by whoever held it last.
            assert_eq!(drops.load(Ordering::Relaxed), 2);
        });
    }
}

#[test]
fn abandoned_consumer_sees_everything() {
    loom::model(|| {
        let (mut p, mut c) = RingBuffer::<u32>::new(2);
        let t = thread::spawn(move || {
            p.push(1).unwrap();
            p.push(2).unwrap();
        });
        while !c.is_abandoned() {
            thread::yield_now();
        }
        assert_eq!(c.pop(), Ok(1));
        assert_eq!(c.pop(), Ok(2));
        assert_eq!(c.pop(), Err(PopError::Empty));
        t.join().unwrap();
    });
}

/// `pop_deferred` gives slots back two at a time on a ring of 8 (a quarter) or when it finds
/// the ring empty: the producer wraps onto slots the consumer read before their release, so a
/// missing happens-before edge between that read and the overwrite is a loom data race; and
/// the producer, waiting for room, is never stuck behind slots the consumer keeps.
#[test]
fn pop_deferred_fifo() {
    loom::model(|| {
        let (mut p, mut c) = RingBuffer::<u32>::new(8);
        let t = thread::spawn(move || {
            // Fill the ring with one publication, then wrap onto the first slots.
            assert_eq!(p.push_slice(&[0, 1, 2, 3, 4, 5, 6, 7]), 8);
            for i in 8..10 {
                assert!(push_wait(&mut p, i));
            }
        });
        let mut next = 0;
        while next < 10 {
            match c.pop_deferred() {
                Ok(v) => {
                    assert_eq!(v, next);
                    next += 1;
                }
                Err(PopError::Empty) => thread::yield_now(),
            }
        }
        t.join().unwrap();
        assert_eq!(c.pop_deferred(), Err(PopError::Empty));
    });
}

/// A consumer dropped with deferred slots: the items it took are not dropped again by the
/// ring, whichever handle goes last.
#[test]
fn drop_with_deferred_slots() {
    loom::model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let (mut p, mut c) = RingBuffer::<Counted>::new(8);
        let d = drops.clone();
        let t = thread::spawn(move || {
            for _ in 0..3 {
                if !push_wait(&mut p, Counted(d.clone())) {
                    break;
                }
            }
            drop(p);
        });
        // Take one item (deferred: a quarter of 8 is 2), then drop the consumer.
        loop {
            match c.pop_deferred() {
                Ok(item) => {
                    drop(item);
                    break;
                }
                Err(PopError::Empty) => thread::yield_now(),
            }
        }
        drop(c);
        t.join().unwrap();
        // Each item made is dropped exactly once.
        assert_eq!(drops.load(Ordering::Relaxed), 3);
    });
}

/// `push_deferred` runs published by `publish_deferred`, by a plain push and by the
/// producer's drop: the consumer sees each run whole, in order, after its writes.
#[test]
fn push_deferred_runs() {
    loom::model(|| {
        let (mut p, mut c) = RingBuffer::<u32>::new(2);
        let t = thread::spawn(move || {
            assert!(p.push_deferred(1).is_ok());
            assert!(p.push_deferred(2).is_ok());
            assert_eq!(p.deferred(), 2);
            p.publish_deferred();
            assert!(push_wait(&mut p, 3));
            // Published by the drop.
            while p.push_deferred(4).is_err() {
                thread::yield_now();
            }
        });
        for want in 1..=4 {
            assert_eq!(pop_wait(&mut c), Some(want));
        }
        assert_eq!(pop_wait(&mut c), None);
        t.join().unwrap();
    });
}

/// `StampedRing`: the producer mixes plain and deferred pushes (through a ring smaller than the
/// run, so it reuses slots whose stamps are from the previous lap), the consumer mixes `pop`
/// and `peek_into`/`release`; items arrive once each, in order, with their contents (loom
/// tracks the slot values: a read not ordered after its write is a loom failure).
#[test]
fn stamped_fifo() {
    for cap in [1, 2] {
        loom::model(move || {
            let (mut p, mut c) = rings::StampedRing::<u32>::new(cap);
            let t = thread::spawn(move || {
                let mut next = 0;
                while next < 3 {
                    let r = if next == 1 {
                        p.push_deferred(next)
                    } else {
                        p.push(next)
                    };
                    if r.is_ok() {
                        next += 1;
                    } else {
                        // The consumer waits for the deferred item before freeing its slot.
                        p.publish_deferred();
                        thread::yield_now();
                    }
                }
            });
            let mut next = 0;
            let mut out = [std::mem::MaybeUninit::uninit(); 2];
            while next < 3 {
                if next == 0 {
                    match c.pop() {
                        Ok(v) => {
                            assert_eq!(v, next);
                            next += 1;
                        }
                        Err(PopError::Empty) => thread::yield_now(),
                    }
                    continue;
                }
                let got = c.peek_into(&mut out);
                let n = got.len();
                for (i, v) in got.iter().enumerate() {
                    assert_eq!(*v, next + i as u32);
                }
                if n == 0 {
                    thread::yield_now();
                }
                c.release(n);
                next += n as u32;
            }
            t.join().unwrap();
            assert!(c.is_abandoned());
            assert!(c.is_empty());
        });
    }
}

/// `StampedRing`: an item deferred when the producer is dropped is published by the drop and
/// seen by a consumer that saw the producer abandoned.
#[test]
fn stamped_drop_publishes_deferred() {
    loom::model(|| {
        let (mut p, mut c) = rings::StampedRing::<u32>::new(2);
        let t = thread::spawn(move || {
            p.push(1).unwrap();
            p.push_deferred(2).unwrap();
        });
        let mut got = Vec::new();
        loop {
            let abandoned = c.is_abandoned();
            while let Ok(v) = c.pop() {
                got.push(v);
            }
            if abandoned {
                break;
            }
            thread::yield_now();
        }
        assert_eq!(got, [1, 2]);
        t.join().unwrap();
    });
}

/// `StampedRing`: chunks written in place and partly committed through a ring of 2 (the
/// uncommitted slot is claimed again), read with `peek`/`pop`.
#[test]
fn stamped_chunks() {
    loom::model(|| {
        let (mut p, mut c) = rings::StampedRing::<u32>::new(2);
        let t = thread::spawn(move || {
            let mut next = 0;
            while next < 3 {
                let mut chunk = p.write_chunk_up_to(2);
                let n = chunk.len();
                for k in 0..n {
                    chunk.write(k, next + k as u32);
                }
                // Commit one of two: the second slot is written again by the next claim.
                let commit = n.min(1 + (next as usize % 2));
                // SAFETY: every claimed slot was written just above.
                unsafe { chunk.commit(commit) };
                next += commit as u32;
                if n == 0 {
                    thread::yield_now();
                }
            }
        });
        peek_then_pop_each(0..3, &mut c, stamped_take);
        t.join().unwrap();
    });
}

/// `StampedRing`: chunks claimed with `write_chunk_refresh_below(2, 1)` through a ring of 2:
/// the producer reads the consumer's head only when its cached copy says no slot is free, so
/// its chunks are often shorter than what is free (a stale cache is never too generous).
#[test]
fn stamped_chunks_read_head_lazily() {
    loom::model(|| {
        let (mut p, mut c) = rings::StampedRing::<u32>::new(2);
        let t = thread::spawn(move || {
            let mut next = 0;
            while next < 3 {
                let mut chunk = p.write_chunk_refresh_below(2, 1);
                let n = chunk.len().min(3 - next as usize);
                for k in 0..n {
                    chunk.write(k, next + k as u32);
                }
                // SAFETY: the first `n` claimed slots were written just above.
                unsafe { chunk.commit(n) };
                next += n as u32;
                if n == 0 {
                    thread::yield_now();
                }
            }
        });
        peek_then_pop_each(0..3, &mut c, stamped_take);
        t.join().unwrap();
    });
}
