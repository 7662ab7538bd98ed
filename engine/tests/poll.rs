//! `Connection::poll`, the batch receive: FIFO across inline and pooled sizes, the limit is
//! respected, buffers are recycled (also when the handler panics), and a disconnect surfaces
//! after everything sent before it was delivered.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use spinwire::{Connection, Error, INLINE_MAX};
use spinwire_testkit::data::{fill, verify};
use spinwire_testkit::engine::*;
use spinwire_testkit::{cores, serial, WAIT};

fn len_of(seq: u32) -> usize {
    // Inline and pooled sizes, mixed.
    match seq % 4 {
        0 => 1 + seq as usize % INLINE_MAX,
        1 => INLINE_MAX + 1 + (seq as usize * 31) % 2000,
        2 => 8,
        _ => 4096,
    }
}

/// Polls until `want` messages arrived (bounded by `WAIT`), checking order, content and that no
/// call delivers more than `limit`.
fn poll_all(conn: &Connection, next: &mut u32, want: u32, limit: usize) {
    let deadline = Instant::now() + WAIT;
    let end = *next + want;
    while *next < end {
        let before = *next;
        let n = conn
            .poll(
                |m| {
                    verify(m, *next, len_of(*next));
                    *next += 1;
                },
                limit,
            )
            .expect("poll");
        assert!(n <= limit, "poll delivered {n} > limit {limit}");
        assert_eq!(n as u32, *next - before, "poll's count");
        assert!(Instant::now() < deadline, "messages missing");
        if n == 0 {
            std::thread::yield_now();
        }
    }
    assert_eq!(*next, end, "more than sent");
}

fn send_seq(conn: &Connection, seq: u32) {
    let mut b = conn.alloc_timeout(WAIT).expect("alloc");
    b.set_len(len_of(seq)).unwrap();
    fill(&mut b, seq);
    conn.send_timeout(b, WAIT).expect("send");
}

#[test]
fn fifo_limit_and_recycling_run_to_completion() {
    let _g = serial();
    let e = inline_engine(4096, 16);
    let (s, c) = pair(&e, &e, &endpoint("poll-rtc"));
    let mut seq = 0u32;
    let mut next = 0u32;
    // 200 rounds of 12 messages through a pool of 16 buffers: without recycling the sender
    // would run dry within two rounds.
    for round in 0..200u32 {
        for _ in 0..12 {
            send_seq(&c, seq);
            seq += 1;
        }
        c.flush();
        let limit = 1 + (round as usize % 7);
        poll_all(&s, &mut next, 12, limit);
    }
    // Nothing left; limit 0 delivers nothing.
    assert_eq!(s.poll(|_| panic!("nothing was sent"), 16).unwrap(), 0);
    send_seq(&c, seq);
    c.flush();
    assert_eq!(s.poll(|_| panic!("limit 0"), 0).unwrap(), 0);
    poll_all(&s, &mut next, 1, 4);
    assert_eq!(s.stats().received, u64::from(next));
}

#[test]
fn handler_panic_recycles_and_keeps_the_rest() {
    let _g = serial();
    let e = inline_engine(4096, 8);
    let (s, c) = pair(&e, &e, &endpoint("poll-panic"));
    let mut seq = 0u32;
    let mut next = 0u32;
    for _ in 0..100 {
        for _ in 0..4 {
            send_seq(&c, seq);
            seq += 1;
        }
        c.flush();
        // Panic on the second message of the batch: the first is delivered, the second is lost
        // to the panicking handler (and recycled), the other two stay queued.
        let mut k = 0;
        let r = catch_unwind(AssertUnwindSafe(|| {
            s.poll(
                |m| {
                    k += 1;
                    if k == 2 {
                        panic!("handler");
                    }
                    verify(m, next, len_of(next));
                    next += 1;
                },
                4,
            )
        }));
        assert!(r.is_err());
        next += 1; // the one the handler panicked on
        poll_all(&s, &mut next, 2, 4);
    }
    assert_eq!(next, seq);
}

#[test]
fn disconnect_surfaces_after_pending_messages() {
    let _g = serial();
    let e = inline_engine(4096, 16);
    let (s, c) = pair(&e, &e, &endpoint("poll-down"));
    for seq in 0..5 {
        send_seq(&c, seq);
    }
    drop(c);
    let mut next = 0u32;
    let deadline = Instant::now() + WAIT;
    let err = loop {
        match s.poll(
            |m| {
                verify(m, next, len_of(next));
                next += 1;
            },
            2,
        ) {
            Ok(_) => {}
            Err(e) => break e,
        }
        assert!(Instant::now() < deadline, "disconnect not reported");
        std::thread::yield_now();
    };
    assert_eq!(next, 5, "messages sent before the close");
    assert!(matches!(err, Error::Disconnected), "{err:?}");
}

#[test]
fn fifo_with_a_dedicated_poller() {
    let _g = serial();
    let core = cores()[0];
    let e = poller_engine(core, 4096, 16);
    let (s, c) = pair(&e, &e, &endpoint("poll-ded"));
    let mut seq = 0u32;
    let mut next = 0u32;
    for _ in 0..50 {
        for _ in 0..10 {
            send_seq(&c, seq);
            seq += 1;
        }
        poll_all(&s, &mut next, 10, 3);
    }
}
