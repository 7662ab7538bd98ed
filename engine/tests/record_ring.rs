//! The record ring (`spinwire::record::ring`): a two-thread FIFO stress test with mixed sizes,
//! random batches and a stalling consumer (every byte verified), also with the consumer taking
//! one record per call through `Consumer::take_data` (the engine's `try_recv`), and a hostile
//! peer writing random bytes into the record area and the position words (only typed errors,
//! bounded work; `take_data` then `poll_deferred` sees exactly what `poll` sees).
//!
//! Run in debug and release: `cargo test -p spinwire --test record_ring [--release]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spinwire::record::ring::{
    self, max_payload_for, region_size, Consumer, HeapRegion, Producer, RingError, Take,
    CONSUMER_POSITION_OFFSET, PRODUCER_POSITION_OFFSET, RING_HEADER_SIZE,
};
use spinwire::record::{Record, RecordError};

/// xorshift64*: deterministic, dependency-free randomness.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Records per stress run: at least 100k in release, fewer in debug (unoptimised copies).
const RECORDS: u64 = if cfg!(debug_assertions) {
    100_000
} else {
    400_000
};
/// A stalled or broken peer fails the test instead of hanging it.
const DEADLINE: Duration = Duration::from_secs(120);

/// What record number `seq` is: a DATA record of some size, or (1 in 16) a CREDIT record.
/// Both threads derive it from the same seeded stream.
fn shape(rng: &mut Rng, max: usize) -> Option<usize> {
    if rng.below(16) == 0 {
        return None;
    }
    Some(match rng.below(8) {
        0 => 0,
        1 => max,
        2..=4 => rng.below(17) as usize,
        _ => rng.below(max as u64 + 1) as usize,
    })
}

/// The byte at index `i` of record `seq`'s payload.
fn byte(seq: u64, i: usize) -> u8 {
    (seq.wrapping_mul(131) ^ (i as u64).wrapping_mul(7)) as u8
}

/// Checks that `rec` is record number `seq` (its shape drawn from `shapes`).
fn check(shapes: &mut Rng, max: usize, seq: u64, rec: Record<'_>) {
    match (shape(shapes, max), rec) {
        (Some(len), Record::Data(bytes)) => {
            assert_eq!(bytes.len(), len, "record {seq}: length");
            for (i, &b) in bytes.iter().enumerate() {
                assert_eq!(b, byte(seq, i), "record {seq}: byte {i}");
            }
        }
        (None, Record::Credit(c)) => assert_eq!(c, seq, "record {seq}: credit"),
        (want, got) => panic!("record {seq}: wanted {want:?}, got {got:?}"),
    }
}

/// Up to `limit` records one per call, as the engine's `try_recv` takes them: `take_data` (DATA
/// of at most `take_max` bytes) and `poll_deferred(1, ..)` for what it leaves; the position
/// published once per run (when the ring looks empty or every 4 records), the deferred
/// publication the ring offers (the engine publishes after each record, a run of one).
fn take_run(
    rx: &mut Consumer,
    take_max: usize,
    limit: usize,
    mut rec: impl FnMut(Record<'_>),
) -> usize {
    let mut n = 0;
    while n < limit {
        match rx.take_data(take_max, |b| rec(Record::Data(b))) {
            Take::Data => n += 1,
            Take::Empty => break,
            Take::Other => {
                if rx.poll_deferred(1, &mut rec).expect("poll_deferred") == 0 {
                    break;
                }
                n += 1;
            }
        }
        if n % 4 == 0 || rx.may_be_empty() {
            rx.publish();
        }
    }
    rx.publish();
    n
}

fn stress(capacity: usize, max: usize, seed: u64) {
    stress_with(capacity, max, seed, None);
}

/// `take`: the consumer takes records with [`take_run`], `take_data` handling DATA payloads of
/// at most that many bytes.
fn stress_with(capacity: usize, max: usize, seed: u64, take: Option<usize>) {
    let (mut tx, mut rx) = ring::with_capacity(capacity, max).expect("ring");
    let producer = std::thread::spawn(move || produce(&mut tx, max, seed));
    let t0 = Instant::now();
    let mut shapes = Rng::new(seed);
    let mut rng = Rng::new(seed ^ 0xC0FFEE);
    let mut seq = 0u64;
    let mut records = 0u64;
    while seq < RECORDS {
        assert!(t0.elapsed() < DEADLINE, "consumer stuck at record {seq}");
        // Stall at random points so the producer fills the ring and waits on the position.
        if rng.below(64) == 0 {
            for _ in 0..rng.below(2000) {
                std::hint::spin_loop();
            }
        }
        let limit = 1 + rng.below(64) as usize;
        let handle = |rec: Record<'_>| {
            check(&mut shapes, max, seq, rec);
            seq += 1;
        };
        let n = match take {
            None => rx.poll(limit, handle).expect("poll"),
            Some(take_max) => take_run(&mut rx, take_max, limit, handle),
        };
        assert!(n <= limit);
        records += n as u64;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    assert_eq!(records, RECORDS);
    producer.join().expect("producer");
    // Nothing after the last record: no duplicates.
    assert_eq!(rx.poll(64, |r| panic!("extra record {r:?}")), Ok(0));
}

fn produce(tx: &mut Producer, max: usize, seed: u64) {
    let t0 = Instant::now();
    let mut shapes = Rng::new(seed);
    let mut rng = Rng::new(seed ^ 0xBEEF);
    let mut seq = 0u64;
    // `shape` is drawn once per record, so a full ring retries the same one.
    let mut pending = shape(&mut shapes, max);
    while seq < RECORDS {
        let batch = 1 + rng.below(16);
        let mut k = 0;
        while k < batch && seq < RECORDS {
            assert!(t0.elapsed() < DEADLINE, "producer stuck at record {seq}");
            let ok = match pending {
                // Half the time the one-step `try_put_data` first (the engine's send), `claim`
                // for what it leaves (a PAD to write, the consumer's position to re-read).
                Some(len)
                    if rng.below(2) == 0
                        && tx.try_put_data(len, true, |p| {
                            for (i, b) in p.iter_mut().enumerate() {
                                *b = byte(seq, i);
                            }
                        }) =>
                {
                    true
                }
                Some(len) => match tx.claim(len).expect("claim") {
                    Some(mut c) => {
                        for (i, b) in c.payload_mut().iter_mut().enumerate() {
                            *b = byte(seq, i);
                        }
                        c.commit_batched();
                        true
                    }
                    None => false,
                },
                None => tx.push_credit(seq).expect("credit"),
            };
            if ok {
                seq += 1;
                k += 1;
                if seq < RECORDS {
                    pending = shape(&mut shapes, max);
                }
            } else {
                // Full: publish what we have (the consumer cannot free space otherwise), wait.
                tx.publish();
                std::thread::yield_now();
            }
        }
        tx.publish();
    }
}

#[test]
fn fifo_mixed_sizes_small_ring() {
    // 256-B area, records of up to 128 B: wraps every few records.
    stress(256, max_payload_for(256), 1);
}

#[test]
fn fifo_mixed_sizes_larger_ring() {
    stress(4096, 1000, 2);
}

#[test]
fn fifo_tiny_records_many_per_line() {
    stress(1024, 16, 3);
}

#[test]
fn fifo_take_data_one_per_call() {
    // Small records through `take_data`, the larger ones and the CREDITs through
    // `poll_deferred`, wrapping often.
    stress_with(256, max_payload_for(256), 4, Some(64));
    stress_with(1024, 16, 5, Some(16));
    stress_with(4096, 1000, 6, Some(1000));
}

/// Writes `word` at byte `at` of the region.
fn poke(mem: &HeapRegion, at: usize, word: u64) {
    mem.word(at / 8)
        .expect("in range")
        .store(word, std::sync::atomic::Ordering::Relaxed);
}

/// A random header word: mostly plausible lengths and types so that the checks past the
/// first are reached too.
fn hostile_header(rng: &mut Rng, cap: usize) -> u64 {
    let len: u32 = match rng.below(6) {
        0 => rng.next() as u32,
        1 => 0,
        2 => rng.below(8) as u32,
        _ => rng.below(cap as u64 + 32) as u32,
    };
    let ty: u8 = match rng.below(4) {
        0 => rng.next() as u8,
        _ => 1 + rng.below(7) as u8,
    };
    let (flags, aux) = if rng.below(8) == 0 {
        (rng.next() as u8, rng.next() as u16)
    } else {
        (0, 0)
    };
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&len.to_le_bytes());
    b[4] = ty;
    b[5] = flags;
    b[6..].copy_from_slice(&aux.to_le_bytes());
    u64::from_ne_bytes(b)
}

/// Polls a few times; every outcome is a count or a typed error, and each poll hands over at
/// most `capacity / 8` records whatever its limit.
fn poll_hostile(rx: &mut Consumer, rng: &mut Rng, max: usize) -> Option<RingError> {
    let cap = rx.capacity();
    for _ in 0..4 {
        let limit = if rng.below(2) == 0 {
            usize::MAX
        } else {
            rng.below(64) as usize
        };
        let mut seen = 0usize;
        let r = rx.poll(limit, |rec| {
            seen += 1;
            if let Record::Data(d) = rec {
                assert!(d.len() <= max);
            }
        });
        assert!(seen <= cap / 8, "{seen} records from a {cap}-byte ring");
        match r {
            Ok(n) => assert_eq!(n, seen),
            Err(e) => {
                // The consumer stays failed with the same error.
                assert_eq!(rx.poll(8, |_| panic!("failed consumer delivered")), Err(e));
                return Some(e);
            }
        }
    }
    None
}

#[test]
fn hostile_producer_gives_only_typed_errors() {
    let seeds = if cfg!(debug_assertions) { 3000 } else { 20_000 };
    let mut errors = [0usize; 4];
    for seed in 0..seeds {
        let mut rng = Rng::new(seed);
        let cap = 32 << rng.below(4);
        let max = rng.below(max_payload_for(cap) as u64 + 1) as usize;
        let mem = Arc::new(HeapRegion::new(region_size(cap)));
        let mut tx = Producer::attach(mem.clone(), max).expect("producer");
        let mut rx = Consumer::attach(mem.clone(), max).expect("consumer");
        // Some honest records first, so that corruption also meets a consumer mid-ring.
        for _ in 0..rng.below(6) {
            let len = rng.below(max as u64 + 1) as usize;
            let _ = tx.push(&vec![0xAB; len]).expect("push");
        }
        if rng.below(2) == 0 {
            let _ = rx.poll(rng.below(4) as usize, |_| {});
        }
        // The hostile part: random words over the area and both position lines.
        let area = cap / 8;
        for _ in 0..1 + rng.below(area as u64 * 2) {
            let at = RING_HEADER_SIZE + 8 * rng.below(area as u64) as usize;
            let w = match rng.below(3) {
                0 => rng.next(),
                _ => hostile_header(&mut rng, cap),
            };
            poke(&mem, at, w);
        }
        if rng.below(4) == 0 {
            poke(&mem, PRODUCER_POSITION_OFFSET, rng.next());
            assert!(rx.pending_hint() <= cap);
        }
        if rng.below(4) == 0 {
            poke(&mem, CONSUMER_POSITION_OFFSET, rng.next());
        }
        match poll_hostile(&mut rx, &mut rng, max) {
            None => errors[0] += 1,
            Some(RingError::Record { source, .. }) => {
                assert!(!matches!(source, RecordError::NoSpace { .. }));
                errors[1] += 1;
            }
            Some(RingError::Overrun { .. }) => errors[2] += 1,
            Some(e) => panic!("seed {seed}: unexpected {e:?}"),
        }
        // The producer meets a random consumer position: it writes or fails, typed.
        for _ in 0..4 {
            match tx.claim(rng.below(max as u64 + 1) as usize) {
                Ok(Some(c)) => c.commit(),
                Ok(None) => {}
                Err(RingError::BadConsumerPosition { value, low, high }) => {
                    assert!(value % 8 != 0 || value < low || value > high);
                    errors[3] += 1;
                    break;
                }
                Err(e) => panic!("seed {seed}: producer {e:?}"),
            }
        }
    }
    // The generator reaches every outcome.
    assert!(errors.iter().all(|&n| n > 0), "{errors:?}");
}

/// Fills a fresh ring region from `seed` as `hostile_producer_gives_only_typed_errors` does
/// (honest records, some consumed, then random words): the same seed gives the same bytes.
fn hostile_region(seed: u64) -> (Arc<HeapRegion>, Consumer, usize) {
    let mut rng = Rng::new(seed);
    let cap = 32 << rng.below(4);
    let max = rng.below(max_payload_for(cap) as u64 + 1) as usize;
    let mem = Arc::new(HeapRegion::new(region_size(cap)));
    let mut tx = Producer::attach(mem.clone(), max).expect("producer");
    let mut rx = Consumer::attach(mem.clone(), max).expect("consumer");
    for _ in 0..rng.below(6) {
        let len = rng.below(max as u64 + 1) as usize;
        let _ = tx.push(&vec![0xAB; len]).expect("push");
    }
    if rng.below(2) == 0 {
        let _ = rx.poll(rng.below(4) as usize, |_| {});
    }
    let area = cap / 8;
    for _ in 0..1 + rng.below(area as u64 * 2) {
        let at = RING_HEADER_SIZE + 8 * rng.below(area as u64) as usize;
        let w = match rng.below(3) {
            0 => rng.next(),
            _ => hostile_header(&mut rng, cap),
        };
        poke(&mem, at, w);
    }
    if rng.below(4) == 0 {
        poke(&mem, CONSUMER_POSITION_OFFSET, rng.next());
    }
    (mem, rx, max)
}

/// What one consumer saw: each record (as bytes or its `Debug`) or the error that ended it.
fn seen(out: &mut Vec<String>, rec: Record<'_>) {
    out.push(match rec {
        Record::Data(d) => format!("data {d:?}"),
        other => format!("{other:?}"),
    });
}

#[test]
fn take_data_sees_what_poll_sees_on_hostile_input() {
    let seeds = if cfg!(debug_assertions) { 3000 } else { 20_000 };
    let mut taken = 0usize;
    for seed in 0..seeds {
        // The same hostile bytes twice: one consumer polls a record at a time, the other
        // takes them the `try_recv` way (`take_data`, `poll_deferred` for the rest).
        let (_m1, mut a, max) = hostile_region(seed);
        let (_m2, mut b, _) = hostile_region(seed);
        let take_max = [0, 8, max / 2, max, usize::MAX][seed as usize % 5];
        let (mut sa, mut sb) = (Vec::new(), Vec::new());
        for _ in 0..a.capacity() / 8 + 2 {
            let ra = a.poll(1, |r| seen(&mut sa, r));
            let rb = match b.take_data(take_max, |d| {
                assert!(
                    d.len() <= take_max.min(max),
                    "seed {seed}: {} bytes",
                    d.len()
                );
                seen(&mut sb, Record::Data(d));
            }) {
                Take::Data => {
                    taken += 1;
                    Ok(1)
                }
                Take::Empty => Ok(0),
                Take::Other => b.poll_deferred(1, |r| seen(&mut sb, r)),
            };
            b.publish();
            assert_eq!(ra, rb, "seed {seed}: result");
            assert_eq!(sa, sb, "seed {seed}: records");
            if ra.is_err() {
                // Both stay failed: `take_data` delivers nothing more.
                assert_eq!(b.take_data(usize::MAX, |_| panic!("failed")), Take::Other);
                assert_eq!(b.poll_deferred(8, |_| panic!("failed")), ra.map(|_| 0));
                break;
            }
            if ra == Ok(0) {
                assert_eq!(b.take_data(usize::MAX, |_| panic!("empty")), Take::Empty);
                break;
            }
        }
    }
    assert!(taken > 0, "the generator reaches take_data's fast case");
}

#[test]
fn try_put_data_refuses_what_claim_must_handle() {
    let cap = 64;
    let max = max_payload_for(cap);
    let mem = Arc::new(HeapRegion::new(region_size(cap)));
    let mut tx = Producer::attach(mem.clone(), max).expect("producer");
    let mut rx = Consumer::attach(mem.clone(), max).expect("consumer");
    let fill = |p: &mut [u8]| p.fill(7);
    // Over the maximum.
    assert!(!tx.try_put_data(max + 1, false, fill));
    // An open raw claim blocks it until committed or aborted.
    tx.claim_raw(8).expect("claim_raw").expect("room");
    assert!(!tx.try_put_data(8, false, fill));
    tx.abort_raw();
    assert!(tx.try_put_data(8, false, fill));
    tx.claim_raw(0).expect("claim_raw").expect("room");
    assert!(!tx.try_put_data(0, false, fill));
    assert!(tx.commit_raw(0));
    // 16 + 8 bytes written; an 8-byte payload (16) fits with the zero-ahead word, a
    // 16-byte one (24) after it does not.
    assert!(tx.try_put_data(8, false, fill));
    assert!(
        !tx.try_put_data(16, false, fill),
        "full by the cached position"
    );
    assert_eq!(rx.poll(8, |_| {}), Ok(3));
    assert!(
        !tx.try_put_data(16, false, fill),
        "room seen only after a re-read"
    );
    // `claim` re-reads the position (the claim dropped writes nothing); then it fits.
    assert_eq!(tx.claim(16).map(|c| c.is_some()), Ok(true));
    assert!(tx.try_put_data(16, false, fill));
    // A failed producer refuses it.
    poke(&mem, CONSUMER_POSITION_OFFSET, 3);
    assert!(matches!(
        tx.consumer_position(),
        Err(RingError::BadConsumerPosition { .. })
    ));
    assert!(!tx.try_put_data(0, false, fill));
    // Also when it failed while a raw claim was open, after the claim closes.
    let mem2 = Arc::new(HeapRegion::new(region_size(cap)));
    let mut tx2 = Producer::attach(mem2.clone(), max).expect("producer");
    tx2.claim_raw(8).expect("claim_raw").expect("room");
    poke(&mem2, CONSUMER_POSITION_OFFSET, 3);
    assert!(tx2.consumer_position().is_err());
    tx2.abort_raw();
    assert!(!tx2.try_put_data(8, false, fill));
    // What it wrote reads back in order.
    let mut lens = Vec::new();
    assert!(rx
        .poll(8, |r| if let Record::Data(d) = r {
            assert!(d.iter().all(|&b| b == 7));
            lens.push(d.len());
        })
        .is_ok());
    assert_eq!(lens, [16]);
}

#[test]
fn lying_lengths_are_rejected() {
    let cap = 64;
    let max = max_payload_for(cap);
    let area = RING_HEADER_SIZE;
    let case = |word_at_0: u64| {
        let mem = Arc::new(HeapRegion::new(region_size(cap)));
        let mut rx = Consumer::attach(mem.clone(), max).unwrap();
        poke(&mem, area, word_at_0);
        rx.poll(usize::MAX, |_| {}).unwrap_err()
    };
    let hdr = |len: u32, ty: u8| {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&len.to_le_bytes());
        b[4] = ty;
        u64::from_ne_bytes(b)
    };
    // PAD longer than the area.
    assert!(matches!(
        case(hdr(72, 3)),
        RingError::Record {
            source: RecordError::Truncated { .. },
            ..
        }
    ));
    // A whole-area PAD: more than an honest producer may have outstanding.
    assert!(matches!(case(hdr(64, 3)), RingError::Overrun { .. }));
    // DATA above the maximum, an unknown type, a short length.
    assert!(matches!(
        case(hdr(8 + max as u32 + 1, 1)),
        RingError::Record {
            source: RecordError::TooLong { .. },
            ..
        }
    ));
    assert!(matches!(
        case(hdr(16, 99)),
        RingError::Record {
            source: RecordError::UnknownType { ty: 99, .. },
            ..
        }
    ));
    assert!(matches!(
        case(hdr(4, 1)),
        RingError::Record {
            source: RecordError::BadLength { len: 4, .. },
            ..
        }
    ));
    // A CREDIT of the wrong size.
    assert!(matches!(
        case(hdr(12, 4)),
        RingError::Record {
            source: RecordError::BadPayload { .. },
            ..
        }
    ));
}

#[test]
fn fixed_types_round_trip() {
    let (mut tx, mut rx) = ring::with_capacity(256, 64).unwrap();
    assert!(tx.push_credit(u64::MAX).unwrap());
    assert!(tx.push_heartbeat(42).unwrap());
    assert!(tx.push_buf_ref(7, 4096).unwrap());
    assert!(tx.push(b"").unwrap());
    let mut got = Vec::new();
    assert_eq!(
        rx.poll(8, |r| got.push(format!("{r:?}"))).unwrap(),
        4,
        "{got:?}"
    );
    assert_eq!(
        got,
        [
            "Credit(18446744073709551615)",
            "Heartbeat(42)",
            "BufRef { buf: 7, len: 4096 }",
            "Data([])"
        ]
    );
}

#[test]
fn raw_claims_block_other_writes_until_committed_or_aborted() {
    let (mut tx, mut rx) = ring::with_capacity(256, 64).unwrap();
    let p = tx.claim_raw(10).unwrap().expect("room");
    // One open raw claim: every other write is refused (nothing else touches its bytes).
    assert!(matches!(tx.claim(1), Err(RingError::ClaimOpen)));
    assert!(matches!(tx.push(b"x"), Err(RingError::ClaimOpen)));
    assert!(matches!(tx.claim_raw(1), Err(RingError::ClaimOpen)));
    // SAFETY: `p` points to the open claim's 10 payload bytes, which only we write.
    unsafe { std::ptr::copy_nonoverlapping(b"0123456789".as_ptr(), p.as_ptr(), 10) };
    assert_eq!(
        rx.poll(8, |_| {}).unwrap(),
        0,
        "not published before the commit"
    );
    // Committed shorter than claimed.
    assert!(tx.commit_raw(4));
    assert!(!tx.commit_raw(4), "nothing open any more");
    let mut got = Vec::new();
    let n = rx
        .poll(8, |r| {
            if let Record::Data(d) = r {
                got.push(d.to_vec())
            }
        })
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(got, [b"0123".to_vec()]);
    // Aborted: nothing published, the space is claimed by the next record.
    let before = tx.position();
    let _ = tx.claim_raw(20).unwrap().expect("room");
    tx.abort_raw();
    assert_eq!(tx.position(), before);
    assert!(tx.push(b"next").unwrap());
    let mut got = Vec::new();
    rx.poll(8, |r| {
        if let Record::Data(d) = r {
            got.push(d.to_vec())
        }
    })
    .unwrap();
    assert_eq!(got, [b"next".to_vec()]);
    assert_eq!(tx.consumer_position().unwrap(), tx.position());
    // Too long for the ring's maximum.
    assert!(matches!(tx.claim_raw(65), Err(RingError::TooLong { .. })));
}

/// `commit_raw_copy` (the shm claim's commit, its payload staged outside the ring): every
/// length up to the maximum, each size class of its word copy, arrives whole, whatever the
/// claimed bytes held before, shorter than claimed too, and after a batch left unpublished.
#[test]
fn a_raw_claim_commits_a_payload_copied_from_outside_the_ring() {
    let max = 120;
    let (mut tx, mut rx) = ring::with_capacity(1024, max).unwrap();
    let src: Vec<u8> = (0..max as u8)
        .map(|i| i.wrapping_mul(7).wrapping_add(1))
        .collect();
    let take = |rx: &mut ring::Consumer| {
        let mut got = Vec::new();
        rx.poll(8, |r| {
            if let Record::Data(d) = r {
                got.push(d.to_vec())
            }
        })
        .unwrap();
        got
    };
    for len in 0..=max {
        // Claimed longer where there is room, to commit shorter.
        let claimed = (len + 3).min(max);
        if len % 2 == 0 {
            let p = tx.claim_raw(claimed).unwrap().expect("room");
            // SAFETY: `p` points to the open claim's `claimed` payload bytes, which only we
            // write: stale bytes the commit must not carry.
            unsafe { std::ptr::write_bytes(p.as_ptr(), 0xee, claimed) };
        } else if !tx.try_reserve_raw(claimed) {
            // The fast case refuses what needs the general one (a PAD at the wrap, the
            // consumer's position to re-read).
            let _ = tx.claim_raw(claimed).unwrap().expect("room");
        }
        // Reserved: every other write is refused until the commit.
        assert!(matches!(tx.push(b"x"), Err(RingError::ClaimOpen)));
        assert!(!tx.try_reserve_raw(1));
        // SAFETY: `src` holds `max >= len` bytes, outside the ring.
        assert!(unsafe { tx.commit_raw_copy(src.as_ptr(), len) });
        assert_eq!(take(&mut rx), [src[..len].to_vec()], "len {len}");
    }
    // No claim open: nothing written.
    let before = tx.position();
    // SAFETY: as above.
    assert!(!unsafe { tx.commit_raw_copy(src.as_ptr(), 8) });
    assert_eq!(tx.position(), before);
    // A batch written before the claim is published with it, in order.
    assert!(tx.try_put_data(3, true, |d| d.copy_from_slice(b"bat")));
    let _ = tx.claim_raw(9).unwrap().expect("room");
    // SAFETY: as above.
    assert!(unsafe { tx.commit_raw_copy(src.as_ptr(), 9) });
    assert_eq!(take(&mut rx), [b"bat".to_vec(), src[..9].to_vec()]);
    assert_eq!(tx.consumer_position().unwrap(), tx.position());
}

#[test]
fn a_record_is_handed_over_once_even_if_the_handler_unwinds() {
    let (mut tx, mut rx) = ring::with_capacity(256, 64).unwrap();
    for b in [b"a", b"b", b"c"] {
        assert!(tx.push(b).unwrap());
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rx.poll(8, |r| {
            if r == Record::Data(b"b") {
                panic!("handler");
            }
        })
    }));
    assert!(r.is_err());
    let mut got = Vec::new();
    rx.poll(8, |r| {
        if let Record::Data(d) = r {
            got.push(d.to_vec())
        }
    })
    .unwrap();
    assert_eq!(got, [b"c".to_vec()]);
}
