//! Two-thread FIFO stress tests: one producer thread, one consumer thread, random batch sizes,
//! handles dropped at random points, and every item's construction and drop counted so leaks and
//! double drops fail the test.
//!
//! Sizes: 1M items per long run in release, 100k in debug. The tests in this file take a global
//! lock so only one pair of spinning threads runs at a time (the CI machine has 2 cores), blocked
//! sides yield instead of spinning hot, and every wait is bounded by `DEADLINE`.
//!
//! Set `RINGS_STRESS_SEED` to replay a failing seed (it is printed on failure).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use rings::{ChunkError, Consumer, PopError, Producer, PushError, RingBuffer};

/// Upper bound on one test's runtime; a blocked side past it panics instead of hanging CI.
const DEADLINE: Duration = Duration::from_secs(120);

fn long_run_items() -> u64 {
    if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    }
}

fn short_rounds() -> u64 {
    if cfg!(debug_assertions) {
        60
    } else {
        300
    }
}

static CREATED: CachePadded<AtomicUsize> = CachePadded::new(AtomicUsize::new(0));
static DROPPED: CachePadded<AtomicUsize> = CachePadded::new(AtomicUsize::new(0));
static SERIAL: Mutex<()> = Mutex::new(());

/// Serializes the tests of this file and resets the item counters.
fn serial() -> MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    CREATED.store(0, Ordering::SeqCst);
    DROPPED.store(0, Ordering::SeqCst);
    guard
}

fn assert_no_leak_no_double_drop() {
    let (created, dropped) = (
        CREATED.load(Ordering::SeqCst),
        DROPPED.load(Ordering::SeqCst),
    );
    assert_eq!(created, dropped, "items created vs dropped");
}

/// An item that counts its constructions and drops.
#[derive(Debug)]
struct Item {
    seq: u64,
}

impl Item {
    fn new(seq: u64) -> Self {
        CREATED.fetch_add(1, Ordering::Relaxed);
        Item { seq }
    }
}

impl Default for Item {
    fn default() -> Self {
        Item::new(u64::MAX)
    }
}

impl Drop for Item {
    fn drop(&mut self) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// xorshift64*: small, deterministic, dependency-free.
#[derive(Clone)]
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0 .. n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform-ish in `0 ..= n`.
    fn upto(&mut self, n: usize) -> usize {
        (self.next() % (n as u64 + 1)) as usize
    }
}

fn base_seed() -> u64 {
    std::env::var("RINGS_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5EED_0F5B_1CE5)
}

/// Panics once the deadline has passed; called from every wait loop.
fn wait(deadline: Instant, what: &str) {
    if Instant::now() > deadline {
        panic!("stress test timed out waiting for {what}");
    }
    thread::yield_now();
}

/// How a run ends: the producer stops after `producer_stop` items, the consumer after
/// `consumer_stop` (if any), each dropping its handle right then.
#[derive(Clone, Copy, Debug)]
struct Plan {
    capacity: usize,
    producer_stop: u64,
    consumer_stop: Option<u64>,
    seed: u64,
    batch: bool,
    /// The single-item producer writes runs with `push_deferred` and the consumer takes with
    /// `pop_deferred` (and now and then `release_deferred`) instead of `push` and `pop`.
    deferred: bool,
}

/// Producer side, single-item API. Returns how many items were pushed.
fn produce_single(mut p: Producer<Item>, plan: Plan, deadline: Instant) -> u64 {
    let mut rng = XorShift(plan.seed ^ 0x3C3C);
    // `deferred`: runs of random length written with `push_deferred`, each published by
    // `publish_deferred` (or a full ring, or the drop).
    let mut run_left = 0;
    for seq in 0..plan.producer_stop {
        let mut item = Item::new(seq);
        if plan.deferred && run_left == 0 {
            p.publish_deferred();
            run_left = 1 + rng.upto(p.capacity().min(64));
        }
        loop {
            let pushed = if plan.deferred {
                p.push_deferred(item)
            } else {
                p.push(item)
            };
            match pushed {
                Ok(()) => {
                    run_left = run_left.saturating_sub(1);
                    break;
                }
                Err(PushError::Full(back)) => {
                    // The consumer cannot free what it cannot see.
                    p.publish_deferred();
                    if p.is_abandoned() {
                        return seq; // `back` is dropped here
                    }
                    item = back;
                    wait(deadline, "a free slot");
                }
            }
        }
    }
    plan.producer_stop
}

/// Producer side, random mix of the batch APIs. Returns how many items were published.
fn produce_batch(mut p: Producer<Item>, plan: Plan, deadline: Instant) -> u64 {
    let mut rng = XorShift(plan.seed ^ 0xA5A5);
    let cap = p.capacity();
    let mut next = 0u64;
    while next < plan.producer_stop {
        let left = (plan.producer_stop - next) as usize;
        let want = 1 + rng.upto(cap.min(64));
        let want = want.min(left);
        let published = match rng.below(4) {
            0 => {
                let mut chunk = p.write_chunk_uninit_up_to(want);
                let n = rng.upto(chunk.len());
                let (a, b) = chunk.as_mut_slices();
                for (i, slot) in a.iter_mut().chain(b).take(n).enumerate() {
                    slot.write(Item::new(next + i as u64));
                }
                // SAFETY: the first `n` slots were written above.
                unsafe { chunk.commit(n) };
                n
            }
            1 => {
                let want = match p.write_chunk(want) {
                    Ok(_) => want, // dropped: its defaults are dropped, nothing published
                    Err(ChunkError::TooFewSlots(free)) => free,
                };
                let mut chunk = p.write_chunk(want).unwrap();
                let n = rng.upto(chunk.len());
                let (a, b) = chunk.as_mut_slices();
                for (i, slot) in a.iter_mut().chain(b).take(n).enumerate() {
                    *slot = Item::new(next + i as u64);
                }
                chunk.commit(n); // the other `len - n` defaults are dropped
                n
            }
            2 => {
                let start = next;
                p.write_chunk_uninit_up_to(want)
                    .fill_from_iter((start..).map(Item::new))
            }
            _ => match p.push(Item::new(next)) {
                Ok(()) => 1,
                Err(_) => 0,
            },
        };
        next += published as u64;
        if published == 0 {
            if p.is_abandoned() {
                return next;
            }
            wait(deadline, "free slots");
        }
    }
    next
}

/// Consumer side. Returns how many items were consumed (checked to be `0, 1, 2, ...`).
fn consume(mut c: Consumer<Item>, plan: Plan, deadline: Instant) -> u64 {
    let mut rng = XorShift(plan.seed ^ 0x5A5A);
    let cap = c.capacity();
    let mut expected = 0u64;
    loop {
        if plan.consumer_stop == Some(expected) {
            return expected;
        }
        let left = plan
            .consumer_stop
            .map_or(usize::MAX, |stop| (stop - expected) as usize);
        let want = (1 + rng.upto(cap.min(64))).min(left);
        let consumed = if plan.deferred {
            if rng.below(8) == 0 {
                c.release_deferred();
            }
            match c.pop_deferred() {
                Ok(item) => {
                    assert_eq!(item.seq, expected, "FIFO order ({plan:?})");
                    1
                }
                Err(PopError::Empty) => 0,
            }
        } else if !plan.batch {
            // `pop`, or one of the spinning checks (which prefetch after empty polls) first;
            // `ready`: that check saw an item.
            let ready = match rng.below(3) {
                0 => false,
                1 => match c.peek_spinning() {
                    Ok(item) => {
                        assert_eq!(item.seq, expected, "FIFO order ({plan:?})");
                        true
                    }
                    Err(_) => false,
                },
                _ => !c.is_empty_spinning(),
            };
            match c.pop() {
                Ok(item) => {
                    assert_eq!(item.seq, expected, "FIFO order ({plan:?})");
                    1
                }
                Err(PopError::Empty) => {
                    assert!(
                        !ready,
                        "an item seen by a spinning check is there ({plan:?})"
                    );
                    0
                }
            }
        } else {
            match rng.below(4) {
                0 => {
                    let chunk = c.read_chunk_up_to(want);
                    let (a, b) = chunk.as_slices();
                    for (i, item) in a.iter().chain(b).enumerate() {
                        assert_eq!(item.seq, expected + i as u64, "FIFO order ({plan:?})");
                    }
                    let n = rng.upto(chunk.len());
                    chunk.release(n);
                    n
                }
                1 => {
                    let chunk = c.read_chunk_up_to(want);
                    let n = rng.upto(chunk.len());
                    for (i, item) in chunk.into_iter().take(n).enumerate() {
                        assert_eq!(item.seq, expected + i as u64, "FIFO order ({plan:?})");
                    }
                    n
                }
                2 => match c.read_chunk(want) {
                    Ok(chunk) => {
                        assert_eq!(chunk.as_slices().0[0].seq, expected);
                        chunk.release_all();
                        want
                    }
                    Err(ChunkError::TooFewSlots(n)) => {
                        assert!(n < want);
                        0
                    }
                },
                _ => match c.peek() {
                    Ok(item) => {
                        assert_eq!(item.seq, expected, "FIFO order ({plan:?})");
                        c.pop().map(|_| 1).unwrap()
                    }
                    Err(_) => 0,
                },
            }
        };
        expected += consumed as u64;
        if consumed == 0 {
            if c.is_abandoned() && c.slots() == 0 {
                return expected;
            }
            wait(deadline, "items");
        }
    }
}

fn run(plan: Plan) {
    let deadline = Instant::now() + DEADLINE;
    let (p, c) = RingBuffer::<Item>::new(plan.capacity);
    let producer = thread::spawn(move || {
        if plan.batch {
            produce_batch(p, plan, deadline)
        } else {
            produce_single(p, plan, deadline)
        }
    });
    let consumed = consume(c, plan, deadline);
    let produced = producer.join().expect("producer thread panicked");
    assert!(consumed <= produced, "{plan:?}");
    match plan.consumer_stop {
        None => assert_eq!(produced, plan.producer_stop, "{plan:?}"),
        Some(stop) => assert_eq!(consumed, stop.min(produced), "{plan:?}"),
    }
    if plan.consumer_stop.is_none() || plan.consumer_stop >= Some(plan.producer_stop) {
        assert_eq!(consumed, produced, "{plan:?}");
    }
    assert_no_leak_no_double_drop();
}

fn long_run(batch: bool, capacity: usize) {
    let _serial = serial();
    run(Plan {
        capacity,
        producer_stop: long_run_items(),
        consumer_stop: None,
        seed: base_seed(),
        batch,
        deferred: false,
    });
}

fn random_drop_rounds(batch: bool, deferred: bool) {
    let _serial = serial();
    let mut rng = XorShift(base_seed() ^ batch as u64 ^ (u64::from(deferred) << 1));
    for round in 0..short_rounds() {
        let total = rng.below(20_000);
        let plan = Plan {
            capacity: 1 << rng.below(9),
            producer_stop: total,
            consumer_stop: (rng.below(2) == 0).then(|| rng.below(total + 2)),
            seed: rng.next(),
            batch,
            deferred,
        };
        CREATED.store(0, Ordering::SeqCst);
        DROPPED.store(0, Ordering::SeqCst);
        let result = std::panic::catch_unwind(|| run(plan));
        if let Err(e) = result {
            eprintln!(
                "round {round} failed: {plan:?} (RINGS_STRESS_SEED={})",
                base_seed()
            );
            std::panic::resume_unwind(e);
        }
    }
}

#[test]
fn single_fifo_long_run() {
    long_run(false, 128);
}

#[test]
fn single_fifo_long_run_capacity_1() {
    let _serial = serial();
    run(Plan {
        capacity: 1,
        producer_stop: long_run_items() / 10,
        consumer_stop: None,
        seed: base_seed(),
        batch: false,
        deferred: false,
    });
}

#[test]
fn batch_fifo_long_run() {
    long_run(true, 64);
}

#[test]
fn single_random_drop_points() {
    random_drop_rounds(false, false);
}

#[test]
fn batch_random_drop_points() {
    random_drop_rounds(true, false);
}

/// `push_deferred` runs against `pop_deferred`: each side sees the other's index move once
/// per run (or quarter ring), and a handle dropped with items deferred drops nothing twice.
#[test]
fn deferred_fifo_long_run() {
    let _serial = serial();
    for capacity in [1, 4, 128] {
        run(Plan {
            capacity,
            producer_stop: long_run_items() / 2,
            consumer_stop: None,
            seed: base_seed(),
            batch: false,
            deferred: true,
        });
    }
}

#[test]
fn deferred_random_drop_points() {
    random_drop_rounds(false, true);
}

/// An element type for the size sweep below: carries its sequence number (except `()`).
trait SizeSweep: Send + 'static {
    fn make(seq: u64) -> Self;
    /// The sequence number, or `None` for a type too small to carry one.
    fn seq(&self) -> Option<u64>;
}

impl SizeSweep for () {
    fn make(_: u64) -> Self {}
    fn seq(&self) -> Option<u64> {
        None
    }
}

impl SizeSweep for u8 {
    fn make(seq: u64) -> Self {
        seq as u8
    }
    fn seq(&self) -> Option<u64> {
        None
    }
}

impl SizeSweep for u64 {
    fn make(seq: u64) -> Self {
        seq
    }
    fn seq(&self) -> Option<u64> {
        Some(*self)
    }
}

/// 40 bytes: a slot size that does not divide the cache line.
impl SizeSweep for [u64; 5] {
    fn make(seq: u64) -> Self {
        [seq, !seq, seq, !seq, seq]
    }
    fn seq(&self) -> Option<u64> {
        assert!(
            self[1] == !self[0] && self[4] == self[0],
            "torn item {self:?}"
        );
        Some(self[0])
    }
}

/// 320 bytes: larger than the consumer's read-ahead distance.
impl SizeSweep for [u64; 40] {
    fn make(seq: u64) -> Self {
        [seq; 40]
    }
    fn seq(&self) -> Option<u64> {
        assert!(self.iter().all(|&x| x == self[0]), "torn item");
        Some(self[0])
    }
}

/// One producer pushing single items, one consumer alternating `pop` and `read_chunk_up_to`,
/// on rings big enough for the consumer's read-ahead prefetch to run (and wrap): every item
/// arrives once, in order, untorn.
fn fifo_sizes<T: SizeSweep>(capacity: usize, items: u64) {
    let deadline = Instant::now() + DEADLINE;
    let (mut p, mut c) = RingBuffer::<T>::new(capacity);
    let producer = thread::spawn(move || {
        for i in 0..items {
            let mut item = T::make(i);
            while let Err(PushError::Full(back)) = p.push(item) {
                item = back;
                wait(deadline, "producer (sizes)");
            }
        }
    });
    let mut rng = XorShift(base_seed() ^ capacity as u64);
    let mut next = 0u64;
    let check = |item: &T, next: &mut u64| {
        if let Some(seq) = item.seq() {
            assert_eq!(seq, *next, "capacity {capacity}");
        }
        *next += 1;
    };
    while next < items {
        if rng.below(2) == 0 {
            match c.pop() {
                Ok(item) => check(&item, &mut next),
                Err(PopError::Empty) => wait(deadline, "consumer (sizes)"),
            }
        } else {
            let chunk = c.read_chunk_up_to(rng.upto(capacity));
            if chunk.is_empty() {
                wait(deadline, "consumer (sizes)");
            }
            for item in chunk {
                check(&item, &mut next);
            }
        }
    }
    producer.join().expect("producer thread panicked");
    assert!(matches!(c.pop(), Err(PopError::Empty)));
}

#[test]
fn fifo_across_element_sizes() {
    let _serial = serial();
    let items = long_run_items() / 10;
    for capacity in [64, 1024] {
        fifo_sizes::<()>(capacity, items);
        fifo_sizes::<u8>(capacity, items);
        fifo_sizes::<u64>(capacity, items);
        fifo_sizes::<[u64; 5]>(capacity, items);
        fifo_sizes::<[u64; 40]>(capacity, items);
    }
}
