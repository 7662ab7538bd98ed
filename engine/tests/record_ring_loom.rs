//! loom model of the record ring (`spinwire::record::ring`): every interleaving, up to
//! `LOOM_MAX_PREEMPTIONS` preemptions, of a producer and a consumer on a 32-byte ring (the
//! minimum) carrying three records, the third of which wraps behind a PAD record and reuses
//! the bytes of the first two. Payload words are tracked by loom (see `record/region.rs`), so a
//! missing happens-before edge between a payload write and a read of the same bytes (in this
//! lap or the next) is reported as a data race, and a stale header or payload value fails the
//! assertions.
//!
//! The models cover the publications the engine uses: per record (`commit`), a batch published
//! by one store (`commit_batched` + `publish`, the engine's `send_batched`), and a consumer that
//! consumes one record per call without publishing its position and publishes it only when the
//! ring looks empty or a run is complete (`poll_deferred` + `publish`, the engine's
//! `try_recv`), so the wrap reuses bytes whose reads the producer learns of only from that
//! later publication; the same with the records written by `try_put_data` and taken by
//! `take_data` (the engine's send and `try_recv` fast cases), `claim` and `poll_deferred`
//! handling what they leave (the PAD before the wrap).
//!
//! Run with `scripts/ci/loom.sh`.
#![cfg(loom)]

use loom::thread;
use spinwire::record::ring::{self, max_payload_for, Consumer, Producer, Take};
use spinwire::record::Record;

const CAP: usize = 32;

/// Payload of record `i`: record 0 is empty (8 bytes), 1 and 2 carry 8 bytes (16 each), so
/// record 2 does not fit before the end (offset 24) and wraps behind an 8-byte PAD.
fn payload(i: u8) -> Vec<u8> {
    if i == 0 {
        Vec::new()
    } else {
        (0..8).map(|k| i * 16 + k).collect()
    }
}

fn push_wait(p: &mut Producer, data: &[u8], batched: bool) {
    loop {
        if let Some(mut c) = p.claim(data.len()).expect("claim") {
            c.payload_mut().copy_from_slice(data);
            if batched {
                c.commit_batched();
            } else {
                c.commit();
            }
            return;
        }
        p.publish();
        thread::yield_now();
    }
}

/// Checks that `rec` is DATA record `*next` and counts it.
fn expect_next(next: &mut u8, rec: Record<'_>) {
    match rec {
        Record::Data(d) => {
            assert_eq!(d, payload(*next).as_slice(), "record {next}");
            *next += 1;
        }
        other => panic!("unexpected {other:?}"),
    }
}

fn consume_all(c: &mut Consumer, n: u8) {
    let mut next = 0u8;
    while next < n {
        let got = c.poll(2, |rec| expect_next(&mut next, rec)).expect("poll");
        if got == 0 {
            thread::yield_now();
        }
    }
    assert_eq!(c.poll(4, |r| panic!("extra {r:?}")), Ok(0));
}

/// A caller that publishes once per run (`Consumer::may_be_empty`), on a small scale: one
/// record per `poll_deferred`, the position published after `run` records, when the ring
/// looks empty, or when nothing came.
/// `take`: each record is tried with `take_data` first.
fn consume_deferred(c: &mut Consumer, n: u8, run: u8, take: bool) {
    let mut next = 0u8;
    let mut unpublished = 0u8;
    while next < n {
        let fast = if take {
            c.take_data(8, |d| expect_next(&mut next, Record::Data(d)))
        } else {
            Take::Other
        };
        let got = match fast {
            Take::Data => 1,
            Take::Empty => 0,
            Take::Other => c
                .poll_deferred(1, |rec| expect_next(&mut next, rec))
                .expect("poll"),
        };
        unpublished += got as u8;
        if got == 0 || unpublished >= run || c.may_be_empty() {
            c.publish();
            unpublished = 0;
        }
        if got == 0 {
            thread::yield_now();
        }
    }
    c.publish();
    assert_eq!(c.unpublished_bytes(), 0);
    assert_eq!(c.poll(4, |r| panic!("extra {r:?}")), Ok(0));
}

#[test]
fn deferred_consumer_publication_then_wrap() {
    loom::model(|| {
        let (mut p, mut c) = ring::with_capacity(CAP, max_payload_for(CAP)).unwrap();
        let t = thread::spawn(move || {
            for i in 0..3 {
                push_wait(&mut p, &payload(i), false);
            }
        });
        consume_deferred(&mut c, 3, 2, false);
        t.join().unwrap();
    });
}

/// Records `0..n` sent the engine's way: `try_put_data`, `claim` for what it leaves (the PAD).
fn send_as_the_engine(p: &mut Producer, n: u8) {
    for i in 0..n {
        let data = payload(i);
        if !p.try_put_data(data.len(), false, |b| b.copy_from_slice(&data)) {
            push_wait(p, &data, false);
        }
    }
}

#[test]
fn take_data_consumer_then_wrap() {
    loom::model(|| {
        let (mut p, mut c) = ring::with_capacity(CAP, max_payload_for(CAP)).unwrap();
        let t = thread::spawn(move || send_as_the_engine(&mut p, 3));
        consume_deferred(&mut c, 3, 2, true);
        t.join().unwrap();
    });
}

/// The engine's `try_recv`: `take_data_published`, and for what it leaves `poll_deferred(1,
/// ..)` then `publish`: the position published after every record (each take's store is the
/// producer's news of the space).
fn consume_published(c: &mut Consumer, n: u8) {
    let mut next = 0u8;
    while next < n {
        let got = match c.take_data_published(8, |d| expect_next(&mut next, Record::Data(d))) {
            Take::Data => 1,
            Take::Empty => 0,
            Take::Other => {
                let k = c
                    .poll_deferred(1, |rec| expect_next(&mut next, rec))
                    .expect("poll");
                c.publish();
                k
            }
        };
        assert_eq!(c.unpublished_bytes(), 0);
        if got == 0 {
            thread::yield_now();
        }
    }
    assert_eq!(c.poll(4, |r| panic!("extra {r:?}")), Ok(0));
}

#[test]
fn take_data_published_consumer_then_wrap() {
    loom::model(|| {
        let (mut p, mut c) = ring::with_capacity(CAP, max_payload_for(CAP)).unwrap();
        let t = thread::spawn(move || send_as_the_engine(&mut p, 3));
        consume_published(&mut c, 3);
        t.join().unwrap();
    });
}

#[test]
fn batch_into_deferred_consumer() {
    loom::model(|| {
        let (mut p, mut c) = ring::with_capacity(CAP, max_payload_for(CAP)).unwrap();
        let t = thread::spawn(move || {
            push_wait(&mut p, &payload(0), true);
            push_wait(&mut p, &payload(1), true);
            p.publish();
            // Batched, and published only because the ring is full until the consumer
            // publishes (push_wait publishes before it waits), or at the end.
            push_wait(&mut p, &payload(2), true);
            p.publish();
        });
        consume_deferred(&mut c, 3, 3, false);
        t.join().unwrap();
    });
}

#[test]
fn three_records_with_wrap() {
    loom::model(|| {
        let (mut p, mut c) = ring::with_capacity(CAP, max_payload_for(CAP)).unwrap();
        let t = thread::spawn(move || {
            for i in 0..3 {
                push_wait(&mut p, &payload(i), false);
            }
        });
        consume_all(&mut c, 3);
        t.join().unwrap();
    });
}

#[test]
fn batch_of_two_then_wrap() {
    loom::model(|| {
        let (mut p, mut c) = ring::with_capacity(CAP, max_payload_for(CAP)).unwrap();
        let t = thread::spawn(move || {
            // Records 0 and 1 published by one store (of record 0's header).
            push_wait(&mut p, &payload(0), true);
            push_wait(&mut p, &payload(1), true);
            p.publish();
            push_wait(&mut p, &payload(2), false);
        });
        consume_all(&mut c, 3);
        t.join().unwrap();
    });
}
