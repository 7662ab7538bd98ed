//! Single-threaded behaviour of the ring's public API.

use std::cell::Cell;
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::rc::Rc;

use rings::{
    CapacityError, ChunkError, Consumer, PeekError, PopError, Producer, PushError, RingBuffer,
};

#[test]
fn handles_are_send_not_sync() {
    fn send<T: Send>() {}
    send::<Producer<String>>();
    send::<Consumer<String>>();
    // `!Sync` is checked by the `compile_fail` doctests on `Producer` and `Consumer`.
}

#[test]
fn capacity_rounds_up_to_power_of_two() {
    for (asked, got) in [(1, 1), (2, 2), (3, 4), (5, 8), (64, 64), (65, 128)] {
        let (p, c) = RingBuffer::<u8>::new(asked);
        assert_eq!(p.capacity(), got, "asked {asked}");
        assert_eq!(c.capacity(), got);
    }
}

#[test]
fn bad_capacities_are_typed_errors() {
    assert_eq!(
        RingBuffer::<u8>::try_new(0).unwrap_err(),
        CapacityError::Zero
    );
    assert_eq!(
        RingBuffer::<u8>::try_new(usize::MAX).unwrap_err(),
        CapacityError::TooLarge {
            requested: usize::MAX
        }
    );
    assert_eq!(
        RingBuffer::<u64>::try_new(usize::MAX / 4).unwrap_err(),
        CapacityError::TooLarge {
            requested: usize::MAX / 4
        }
    );
    assert!(CapacityError::Zero.to_string().contains("at least 1"));
}

#[test]
#[should_panic(expected = "capacity must be at least 1")]
fn new_zero_panics_with_message() {
    let _ = RingBuffer::<u8>::new(0);
}

#[test]
fn push_pop_peek_full_empty() {
    let (mut p, mut c) = RingBuffer::<String>::new(2);
    assert_eq!(c.pop(), Err(PopError::Empty));
    assert_eq!(c.peek(), Err(PeekError::Empty));
    assert!(c.is_empty());
    assert_eq!(p.slots(), 2);
    p.push("a".into()).unwrap();
    p.push("b".into()).unwrap();
    assert!(p.is_full());
    assert_eq!(p.slots(), 0);
    match p.push("c".into()) {
        Err(PushError::Full(v)) => assert_eq!(v, "c"),
        Ok(()) => panic!("pushed into a full ring"),
    }
    assert_eq!(
        PushError::Full(String::from("x")).into_inner(),
        String::from("x")
    );
    assert_eq!(format!("{:?}", PushError::Full(1)), "Full(_)");
    assert_eq!(c.slots(), 2);
    assert_eq!(c.peek().map(String::as_str), Ok("a"));
    assert_eq!(c.pop().as_deref(), Ok("a"));
    assert_eq!(c.pop().as_deref(), Ok("b"));
    assert_eq!(c.pop(), Err(PopError::Empty));
    assert!(!p.is_full());
}

#[test]
fn wraps_around_many_times() {
    let (mut p, mut c) = RingBuffer::<u64>::new(4);
    for i in 0..1000 {
        p.push(i).unwrap();
        p.push(i + 1).unwrap();
        p.push(i + 2).unwrap();
        assert_eq!(c.pop(), Ok(i));
        assert_eq!(c.pop(), Ok(i + 1));
        assert_eq!(c.pop(), Ok(i + 2));
    }
}

#[test]
fn abandonment_is_visible_and_items_survive() {
    let (mut p, mut c) = RingBuffer::<u8>::new(4);
    assert!(!p.is_abandoned() && !c.is_abandoned());
    p.push(1).unwrap();
    drop(p);
    assert!(c.is_abandoned());
    assert_eq!(c.pop(), Ok(1));
    let (mut p, c) = RingBuffer::<u8>::new(4);
    drop(c);
    assert!(p.is_abandoned());
    p.push(1).unwrap(); // still allowed; dropped with the ring
}

#[test]
fn write_chunk_uninit_wraps_into_two_slices() {
    let (mut p, mut c) = RingBuffer::<u32>::new(8);
    assert_eq!(p.push_slice(&[0; 6]), 6);
    assert_eq!(c.pop_slice(&mut [0; 6]), 6);
    // tail is at slot 6: a 5-slot chunk is slots 6,7 then 0,1,2.
    let mut chunk = p.write_chunk_uninit(5).unwrap();
    assert_eq!(chunk.len(), 5);
    let (a, b) = chunk.as_mut_slices();
    assert_eq!((a.len(), b.len()), (2, 3));
    for (i, slot) in a.iter_mut().chain(b.iter_mut()).enumerate() {
        slot.write(i as u32);
    }
    // SAFETY: the first 4 slots were written above.
    unsafe { chunk.commit(4) };
    assert_eq!(c.slots(), 4);
    let chunk = c.read_chunk(4).unwrap();
    let (a, b) = chunk.as_slices();
    assert_eq!((a, b), (&[0, 1][..], &[2, 3][..]));
    chunk.release(3);
    assert_eq!(c.pop(), Ok(3));
}

#[test]
fn chunk_errors_report_available_slots() {
    let (mut p, mut c) = RingBuffer::<u8>::new(4);
    assert!(matches!(c.read_chunk(1), Err(ChunkError::TooFewSlots(0))));
    p.push(1).unwrap();
    assert!(matches!(
        p.write_chunk_uninit(4),
        Err(ChunkError::TooFewSlots(3))
    ));
    assert!(matches!(p.write_chunk(4), Err(ChunkError::TooFewSlots(3))));
    assert!(matches!(c.read_chunk(2), Err(ChunkError::TooFewSlots(1))));
    assert!(ChunkError::TooFewSlots(3).to_string().contains('3'));
    assert_eq!(c.read_chunk_up_to(10).len(), 1);
    assert_eq!(p.write_chunk_uninit_up_to(10).len(), 3);
    assert!(p.write_chunk_uninit(0).unwrap().is_empty());
}

#[test]
fn fill_from_iter_stops_at_chunk_or_iter_end() {
    let (mut p, mut c) = RingBuffer::<u32>::new(4);
    assert_eq!(p.write_chunk_uninit(3).unwrap().fill_from_iter(10..), 3);
    assert_eq!(p.write_chunk_uninit(1).unwrap().fill_from_iter(0..0), 0);
    let got: Vec<u32> = c.read_chunk(3).unwrap().into_iter().collect();
    assert_eq!(got, [10, 11, 12]);
    assert_eq!(c.pop(), Err(PopError::Empty));
}

#[test]
fn push_slice_and_pop_slice_partial() {
    let (mut p, mut c) = RingBuffer::<u16>::new(4);
    assert_eq!(p.push_slice(&[1, 2, 3, 4, 5, 6]), 4);
    assert_eq!(p.push_slice(&[7]), 0);
    let mut out = [0; 3];
    assert_eq!(c.pop_slice(&mut out), 3);
    assert_eq!(out, [1, 2, 3]);
    assert_eq!(p.push_slice(&[5, 6, 7]), 3);
    let mut out = [0; 8];
    assert_eq!(c.pop_slice(&mut out), 4);
    assert_eq!(out[..4], [4, 5, 6, 7]);
}

#[test]
fn zero_sized_items() {
    let (mut p, mut c) = RingBuffer::<()>::new(3);
    assert_eq!(p.capacity(), 4);
    for _ in 0..4 {
        p.push(()).unwrap();
    }
    assert!(p.push(()).is_err());
    assert_eq!(c.read_chunk(4).unwrap().len(), 4);
    assert_eq!(c.pop(), Ok(()));
}

/// Counts drops through a shared cell, so leaks and double drops show up as wrong counts.
#[derive(Debug)]
struct Counted {
    id: u32,
    drops: Rc<Cell<u32>>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.set(self.drops.get() + 1);
    }
}

fn counted(id: u32, drops: &Rc<Cell<u32>>) -> Counted {
    Counted {
        id,
        drops: drops.clone(),
    }
}

#[test]
fn remaining_items_drop_with_ring_in_either_order() {
    for producer_first in [true, false] {
        let drops = Rc::new(Cell::new(0));
        let (mut p, mut c) = RingBuffer::<Counted>::new(4);
        for i in 0..4 {
            p.push(counted(i, &drops)).unwrap();
        }
        drop(c.pop().unwrap()); // 1 drop
        drop(c.pop().unwrap()); // 2 drops
        p.push(counted(4, &drops)).unwrap(); // wraps
        assert_eq!(drops.get(), 2);
        if producer_first {
            drop(p);
            assert_eq!(drops.get(), 2);
            drop(c);
        } else {
            drop(c);
            assert_eq!(drops.get(), 2);
            drop(p);
        }
        assert_eq!(drops.get(), 5);
    }
}

#[test]
fn write_chunk_drops_uncommitted_defaults() {
    #[derive(Default)]
    struct D(Option<Rc<Cell<u32>>>);
    impl Drop for D {
        fn drop(&mut self) {
            if let Some(d) = &self.0 {
                d.set(d.get() + 1);
            }
        }
    }
    let drops = Rc::new(Cell::new(0));
    let (mut p, mut c) = RingBuffer::<D>::new(4);
    let mut chunk = p.write_chunk(3).unwrap();
    {
        let (a, _) = chunk.as_mut_slices();
        for slot in a.iter_mut() {
            *slot = D(Some(drops.clone()));
        }
    }
    chunk.commit(1); // two items dropped, one published
    assert_eq!(drops.get(), 2);
    let mut chunk = p.write_chunk(2).unwrap();
    chunk.as_mut_slices().0[0] = D(Some(drops.clone()));
    drop(chunk); // dropped, nothing published
    assert_eq!(drops.get(), 3);
    assert_eq!(c.slots(), 1);
    drop(c.pop().unwrap());
    assert_eq!(drops.get(), 4);
    assert_eq!(c.pop().err(), Some(PopError::Empty));
}

#[test]
fn read_chunk_release_and_iter_drop_exactly_once() {
    let drops = Rc::new(Cell::new(0));
    let (mut p, mut c) = RingBuffer::<Counted>::new(8);
    for i in 0..8 {
        p.push(counted(i, &drops)).unwrap();
    }
    // Dropping an unreleased chunk leaves the items.
    assert_eq!(c.read_chunk(3).unwrap().len(), 3);
    assert_eq!(drops.get(), 0);
    // release(2) drops the 2 oldest.
    c.read_chunk(3).unwrap().release(2);
    assert_eq!(drops.get(), 2);
    assert_eq!(c.peek().unwrap().id, 2);
    // Take 2 by value from a 4-item chunk; the other 2 stay.
    let mut it = c.read_chunk(4).unwrap().into_iter();
    assert_eq!(it.len(), 4);
    let a = it.next().unwrap();
    let b = it.next().unwrap();
    drop(it);
    assert_eq!((a.id, b.id), (2, 3));
    drop((a, b));
    assert_eq!(drops.get(), 4);
    assert_eq!(c.slots(), 4);
    c.read_chunk(4).unwrap().as_mut_slices().0[0].id = 40; // chunk dropped unreleased
    assert_eq!(c.pop().unwrap().id, 40);
    assert_eq!(drops.get(), 5);
    drop(p);
    drop(c);
    assert_eq!(drops.get(), 8);
}

#[test]
#[should_panic(expected = "commit(3) of a 2-slot chunk")]
fn commit_more_than_claimed_panics() {
    let (mut p, _c) = RingBuffer::<u8>::new(4);
    let mut chunk = p.write_chunk_uninit(2).unwrap();
    for s in chunk.as_mut_slices().0 {
        *s = MaybeUninit::new(0);
    }
    // SAFETY: panics before publishing anything.
    unsafe { chunk.commit(3) };
}

/// A tiny xorshift64* generator: deterministic, no dependencies.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Random single-threaded operation sequences against a `VecDeque` model.
#[test]
fn matches_vecdeque_model() {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for cap_log in 0..6 {
        let (mut p, mut c) = RingBuffer::<u64>::new(1 << cap_log);
        let cap = p.capacity();
        let mut model = VecDeque::new();
        let mut next = 0u64;
        for _ in 0..20_000 {
            match rng.below(6) {
                0 => match p.push(next) {
                    Ok(()) => {
                        model.push_back(next);
                        next += 1;
                    }
                    Err(PushError::Full(v)) => {
                        assert_eq!(model.len(), cap);
                        assert_eq!(v, next);
                    }
                },
                1 => assert_eq!(c.pop().ok(), model.pop_front()),
                2 => assert_eq!(c.peek().ok(), model.front()),
                3 => {
                    let want = rng.below(cap as u64 + 2) as usize;
                    let mut chunk = p.write_chunk_uninit_up_to(want);
                    assert_eq!(chunk.len(), want.min(cap - model.len()));
                    let n = rng.below(chunk.len() as u64 + 1) as usize;
                    let (a, b) = chunk.as_mut_slices();
                    for slot in a.iter_mut().chain(b).take(n) {
                        slot.write(next);
                        model.push_back(next);
                        next += 1;
                    }
                    // SAFETY: the first `n` slots were written above.
                    unsafe { chunk.commit(n) };
                }
                4 => {
                    let want = rng.below(cap as u64 + 2) as usize;
                    let chunk = c.read_chunk_up_to(want);
                    assert_eq!(chunk.len(), want.min(model.len()));
                    let (a, b) = chunk.as_slices();
                    assert!(a.iter().chain(b).eq(model.iter().take(chunk.len())));
                    let n = rng.below(chunk.len() as u64 + 1) as usize;
                    chunk.release(n);
                    model.drain(..n);
                }
                _ => {
                    assert_eq!(p.slots(), cap - model.len());
                    assert_eq!(c.slots(), model.len());
                }
            }
        }
    }
}

#[test]
fn debug_output_names_the_handles() {
    let (p, c) = RingBuffer::<u8>::new(2);
    assert!(format!("{p:?}").starts_with("Producer"));
    assert!(format!("{c:?}").starts_with("Consumer"));
}

#[test]
fn pop_deferred_gives_slots_back_per_run() {
    let (mut p, mut c) = RingBuffer::<u32>::new(16);
    assert_eq!(p.push_slice(&(0..16).collect::<Vec<_>>()), 16);
    // A quarter of 16 is 4: three deferred pops leave the producer's view full...
    for i in 0..3 {
        assert_eq!(c.pop_deferred(), Ok(i));
    }
    assert_eq!(p.slots(), 0);
    assert!(p.is_full());
    // ... the fourth gives all four back with one store.
    assert_eq!(c.pop_deferred(), Ok(3));
    assert_eq!(p.slots(), 4);
    // release_deferred gives back what is pending; with none pending it does nothing.
    assert_eq!(c.pop_deferred(), Ok(4));
    assert_eq!(p.slots(), 4);
    c.release_deferred();
    assert_eq!(p.slots(), 5);
    c.release_deferred();
    assert_eq!(p.slots(), 5);
    // A plain pop publishes the deferred ones before it too.
    assert_eq!(c.pop_deferred(), Ok(5));
    assert_eq!(c.pop(), Ok(6));
    assert_eq!(p.slots(), 7);
    // Finding the ring empty gives the run back before it reports `Empty`.
    for i in 7..16 {
        assert_eq!(c.pop_deferred(), Ok(i));
    }
    assert_eq!(c.pop_deferred(), Err(PopError::Empty));
    assert_eq!(p.slots(), 16);
    // Capacity 1: nothing is ever deferred (a quarter of it rounds up to one).
    let (mut p, mut c) = RingBuffer::<u32>::new(1);
    p.push(9).unwrap();
    assert_eq!(c.pop_deferred(), Ok(9));
    assert_eq!(p.slots(), 1);
}

#[test]
fn deferred_items_are_not_dropped_again() {
    for consumer_first in [true, false] {
        let drops = Rc::new(Cell::new(0));
        let (mut p, mut c) = RingBuffer::<Counted>::new(8);
        for i in 0..5 {
            p.push(counted(i, &drops)).unwrap();
        }
        // Two taken and dropped, their slots still deferred (a quarter of 8 is 2: the second
        // publishes; the third is deferred alone).
        for i in 0..3 {
            let item = c.pop_deferred().unwrap();
            assert_eq!(item.id, i);
        }
        assert_eq!(drops.get(), 3);
        if consumer_first {
            drop(c);
            drop(p);
        } else {
            drop(p);
            drop(c);
        }
        // The three taken ones once, the two left in the ring once.
        assert_eq!(drops.get(), 5);
    }
}

/// `pop_deferred` and `release_deferred` mixed with the other calls, against a model of
/// the queue and of the slots the producer sees taken.
#[test]
fn deferred_matches_vecdeque_model() {
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    for cap_log in 0..6 {
        let (mut p, mut c) = RingBuffer::<u64>::new(1 << cap_log);
        let cap = p.capacity();
        let quarter = (cap / 4).max(1);
        let mut model = VecDeque::new();
        let mut deferred = 0usize;
        let mut next = 0u64;
        for _ in 0..20_000 {
            match rng.below(7) {
                0 | 1 => match p.push(next) {
                    Ok(()) => {
                        model.push_back(next);
                        next += 1;
                    }
                    Err(PushError::Full(v)) => {
                        assert_eq!(model.len() + deferred, cap);
                        assert_eq!(v, next);
                    }
                },
                2 | 3 => {
                    let got = c.pop_deferred().ok();
                    assert_eq!(got, model.pop_front());
                    // Whether the pop gave the run back first depends on its cached view of
                    // the producer's index (it does when that looked empty): read what the
                    // producer sees, and check it against both cases.
                    let free = p.slots();
                    assert!(free <= cap - model.len(), "a slot still in use looks free");
                    let now = cap - model.len() - free;
                    if got.is_some() {
                        let kept = (deferred + 1) % quarter;
                        assert!(
                            now == kept || now == 1 % quarter,
                            "deferred {now}, was {deferred}"
                        );
                    } else {
                        assert_eq!(now, 0, "an empty ring gave the run back");
                    }
                    deferred = now;
                }
                4 => {
                    c.release_deferred();
                    deferred = 0;
                }
                5 => {
                    // Any other removal publishes the deferred slots with its own.
                    if let Ok(v) = c.pop() {
                        assert_eq!(Some(v), model.pop_front());
                        deferred = 0;
                    } else {
                        assert!(model.is_empty());
                    }
                }
                _ => {
                    assert_eq!(p.slots(), cap - model.len() - deferred);
                    assert_eq!(c.slots(), model.len());
                }
            }
        }
    }
}

#[test]
fn push_deferred_publishes_with_the_run() {
    let (mut p, mut c) = RingBuffer::<u32>::new(4);
    p.push_deferred(1).unwrap();
    p.push_deferred(2).unwrap();
    assert_eq!(p.deferred(), 2);
    assert_eq!(c.slots(), 0);
    assert_eq!(c.pop(), Err(PopError::Empty));
    p.publish_deferred();
    assert_eq!(p.deferred(), 0);
    assert_eq!(c.slots(), 2);
    // A plain push publishes the run before it.
    p.push_deferred(3).unwrap();
    p.push(4).unwrap();
    assert_eq!(c.slots(), 4);
    // Deferred items take slots: a full ring refuses, handing the item back.
    assert!(matches!(p.push_deferred(5), Err(PushError::Full(5))));
    for i in 1..=4 {
        assert_eq!(c.pop(), Ok(i));
    }
    // A chunk's commit publishes the run too, and so does the producer's drop.
    p.push_deferred(6).unwrap();
    assert_eq!(p.push_slice(&[7]), 1);
    assert_eq!(c.slots(), 2);
    p.push_deferred(8).unwrap();
    drop(p);
    assert_eq!((c.pop(), c.pop(), c.pop()), (Ok(6), Ok(7), Ok(8)));
    assert!(c.is_abandoned());
}

#[test]
fn deferred_pushes_drop_once_with_the_ring() {
    for producer_first in [true, false] {
        let drops = Rc::new(Cell::new(0));
        let (mut p, c) = RingBuffer::<Counted>::new(4);
        p.push(counted(0, &drops)).unwrap();
        p.push_deferred(counted(1, &drops)).unwrap();
        if producer_first {
            drop(p);
            drop(c);
        } else {
            drop(c);
            drop(p);
        }
        assert_eq!(drops.get(), 2);
    }
}

#[test]
fn spinning_checks_agree_with_plain_ones() {
    let (mut p, mut c) = RingBuffer::<u64>::new(4);
    for round in 0..10u64 {
        // Enough empty polls to pass the prefetch threshold, through both calls.
        for _ in 0..5 {
            assert!(c.is_empty_spinning());
            assert_eq!(c.peek_spinning(), Err(PeekError::Empty));
        }
        p.push(round).unwrap();
        p.push(round + 100).unwrap();
        assert!(!c.is_empty_spinning());
        assert_eq!(c.peek_spinning(), Ok(&round));
        assert_eq!(c.peek(), Ok(&round));
        assert_eq!(c.pop(), Ok(round));
        assert_eq!(c.peek_spinning(), Ok(&(round + 100)));
        assert_eq!(c.pop(), Ok(round + 100));
        assert!(c.is_empty_spinning());
        assert!(c.is_empty());
    }
}

/// A 128-byte item, aligned beyond a cache line.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(align(128))]
struct Wide([u64; 16]);

#[test]
fn slot_array_starts_on_a_cache_line() {
    fn first_slot<T>(cap: usize) -> usize {
        let (mut p, _c) = RingBuffer::<T>::new(cap);
        let mut chunk = p.write_chunk_uninit(1).unwrap();
        chunk.as_mut_slices().0.as_ptr() as usize
    }
    for cap in [1, 2, 3, 8, 64, 4096] {
        assert_eq!(first_slot::<u8>(cap) % 64, 0, "u8, capacity {cap}");
        assert_eq!(first_slot::<u32>(cap) % 64, 0, "u32, capacity {cap}");
        assert_eq!(first_slot::<[u8; 24]>(cap) % 64, 0, "24 B, capacity {cap}");
        assert_eq!(
            first_slot::<Wide>(cap) % 128,
            0,
            "align 128, capacity {cap}"
        );
    }
}

/// Every chunk length at every position of small rings, the run after it partly or wholly
/// beyond the array's end, partly or wholly taken: a claim's request for the next run's lines
/// (a hint) changes nothing, for items smaller than a line, of odd sizes and of several lines.
#[test]
fn chunk_claims_at_every_position_keep_fifo() {
    fn run<T: Copy + PartialEq + core::fmt::Debug>(make: impl Fn(u64) -> T) {
        for cap in [2usize, 8, 16, 64] {
            for held in 0..cap {
                for n in 1..=cap - held {
                    let (mut p, mut c) = RingBuffer::<T>::new(cap);
                    // Move the indices to every offset, and leave `held` items in the ring.
                    for i in 0..(n + held) as u64 {
                        p.push(make(i)).unwrap();
                        if i >= held as u64 {
                            c.pop().unwrap();
                        }
                    }
                    let mut chunk = p.write_chunk_uninit(n).unwrap();
                    let (a, b) = chunk.as_mut_slices();
                    for (i, slot) in a.iter_mut().chain(b).enumerate() {
                        slot.write(make(1000 + i as u64));
                    }
                    // SAFETY: all `n` slots were written above.
                    unsafe { chunk.commit_all() };
                    let up_to = p.write_chunk_uninit_up_to(cap).len();
                    assert_eq!(up_to, cap - held - n);
                    let start = n as u64;
                    for i in 0..held as u64 {
                        assert_eq!(c.pop(), Ok(make(start + i)));
                    }
                    for i in 0..n as u64 {
                        assert_eq!(c.pop(), Ok(make(1000 + i)));
                    }
                    assert_eq!(c.pop(), Err(PopError::Empty));
                }
            }
        }
    }
    run(|i| i as u8);
    run(|i| i);
    run(|i| [i as u8; 24]);
    run(|i| Wide([i; 16]));
}
