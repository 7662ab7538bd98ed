//! The send and receive calls beyond `send` / `recv`: claims (written in place) and aborts
//! (dropped unsent), `send_batched` + `flush`, `recv_into`, and the batch receive
//! `Connection::poll`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use spinwire::{Connection, Error, RecvIntoError, SendError, INLINE_MAX};
use spinwire_testkit::data::{fill, verify, XorShift};
use spinwire_testkit::engine::*;
use spinwire_testkit::{cores, WAIT};

use super::fifo::recv_into_wait;
use super::{Scheme, BUF, BUFFERS, LIMIT};

/// Nothing arrives on `c` within a short wait.
fn assert_nothing(c: &Connection) {
    match c.recv_timeout(Duration::from_millis(50)) {
        Err(Error::Timeout) => {}
        Ok(m) => panic!("an aborted claim arrived ({} B)", m.len()),
        Err(e) => panic!("recv: {e}"),
    }
}

pub fn claims_and_aborts(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("claim"));
    let sizes = [1, INLINE_MAX, INLINE_MAX + 1, BUF, BUF + 1, LIMIT];
    let mut seq = 0u32;
    for &len in &sizes {
        // Aborted, more often than there are buffers or slots: each abort gives its buffer,
        // record or slot back, and publishes nothing.
        for _ in 0..2 * BUFFERS {
            let mut b = claim_timeout(&c, len);
            assert_eq!(b.len(), len);
            fill(&mut b, 9999);
            drop(b);
        }
        assert_nothing(&srv);
        // Then one committed: exactly it arrives.
        let mut b = claim_timeout(&c, len);
        fill(&mut b, seq);
        c.send_timeout(b, WAIT).expect("send a claim");
        c.flush().expect("flush");
        recv_msg(&srv, seq, len);
        seq += 1;
    }
    // Shorter than claimed: the message carries what was set; never more than the capacity.
    let mut b = claim_timeout(&c, 100);
    b.as_mut_slice()[..2].copy_from_slice(b"ok");
    b.set_len(2).unwrap();
    let cap = b.capacity();
    assert!(cap >= 100, "capacity {cap}");
    assert!(matches!(
        b.set_len(cap + 1),
        Err(Error::MessageTooLarge { size, max }) if size == cap + 1 && max == cap
    ));
    c.send_timeout(b, WAIT).expect("send");
    c.flush().expect("flush");
    assert_eq!(&*srv.recv_timeout(WAIT).unwrap(), b"ok");
    // Above the limit: refused.
    assert!(matches!(
        c.claim(LIMIT + 1),
        Err(Error::MessageTooLarge { size, max }) if size == LIMIT + 1 && max == LIMIT
    ));
    // Nothing aborted was counted; the pool is whole again (what was sent comes back).
    let st = c.stats();
    assert_eq!(st.sent, seq as u64 + 1);
    assert_eq!(srv.stats().received, seq as u64 + 1);
    let held: Vec<_> = (0..BUFFERS)
        .map(|_| c.alloc_timeout(WAIT).expect("every buffer back"))
        .collect();
    assert!(matches!(
        c.alloc(),
        Err(Error::PoolExhausted { count }) if count == BUFFERS
    ));
    drop(held);
    assert!(
        srv.try_recv().unwrap().is_none(),
        "nothing beyond what was sent"
    );
}

/// Messages of the batched stream (debug builds are slower; divided by the scheme's `slow`).
fn stream_count(s: &Scheme) -> u32 {
    s.slow_div(if cfg!(debug_assertions) {
        30_000
    } else {
        200_000
    })
}

fn stream_len(seq: u32) -> usize {
    let mut r = XorShift::new(u64::from(seq).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    match r.below(8) {
        0 => INLINE_MAX + 1 + r.index(BUF - INLINE_MAX - 1),
        _ => 1 + r.index(INLINE_MAX),
    }
}

pub fn send_batched_stream_fifo_no_loss(s: &'static Scheme) {
    let (ea, eb) = (s.build(s.rtc()), s.build(s.rtc()));
    let (srv, c) = pair(&ea, &eb, &(s.endpoint)("batch"));
    batched_stream(s, srv, c);
}

/// [`send_batched_stream_fifo_no_loss`] with both ends on one run-to-completion engine, and a
/// third thread calling [`Engine::poll`](spinwire::Engine::poll) in a loop: the sending, the
/// receiving and the third thread contend for its poller all the time, so each call finds it
/// now free, now taken (on `mem://` a free one posts or takes straight from the fabric, a
/// taken one goes through the rings, and the two ways interleave on both sides). Still FIFO,
/// no loss, no duplicate.
pub fn send_batched_stream_one_engine_contended(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("batch-1e"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poker = {
        let (e, stop) = (e.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                e.poll();
                std::hint::spin_loop();
            }
        })
    };
    batched_stream(s, srv, c);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poker.join().unwrap();
}

/// A stream of [`stream_count`] messages from `c` to `srv` (received on another thread),
/// sent in runs of `send_batched` and `send_copy_batched` mixed (a plain `send` or `send_copy`
/// now and then), flushed or not, received with `poll` and `try_recv` in turn, every message
/// verified in order.
fn batched_stream(s: &'static Scheme, srv: Connection, c: Connection) {
    let n = stream_count(s);
    let rx = std::thread::spawn(move || {
        let mut r = XorShift::new(5);
        let mut next = 0u32;
        let mut last = Instant::now();
        while next < n {
            let got = if r.below(2) == 0 {
                let mut k = 0;
                srv.poll(
                    |m| {
                        verify(m, next + k, stream_len(next + k));
                        k += 1;
                        // Now and then the handler receives the next one itself (a dedicated
                        // poller's receiver may be inside a slot of packed messages; shm's
                        // direct path finds nothing from inside a handler).
                        if (next + k) % 7 == 3 {
                            if let Some(m) = srv.try_recv().unwrap() {
                                verify(&m, next + k, stream_len(next + k));
                                k += 1;
                            }
                        }
                    },
                    1 + r.index(40),
                )
                .unwrap();
                k
            } else {
                match srv.try_recv().unwrap() {
                    Some(m) => {
                        verify(&m, next, stream_len(next));
                        1
                    }
                    None => 0,
                }
            };
            next += got;
            if got > 0 {
                last = Instant::now();
            } else {
                assert!(last.elapsed() < WAIT, "stalled at {next}");
                std::thread::yield_now();
            }
        }
        assert!(srv.try_recv().unwrap().is_none(), "more than sent");
        srv
    });
    let mut r = XorShift::new(9);
    let mut seq = 0u32;
    let mut last = Instant::now();
    while seq < n {
        // A run of random length, flushed or not; a plain send now and then.
        for _ in 0..1 + r.index(16) {
            if seq == n {
                break;
            }
            let len = stream_len(seq);
            let ok = match r.below(3) {
                // The caller's bytes, copied: `send_copy_batched` (on shm straight into the
                // ring record, published with the run), a plain `send_copy` now and then.
                0 => {
                    let mut bytes = [0u8; BUF];
                    fill(&mut bytes[..len], seq);
                    let res = if r.below(10) == 0 {
                        c.send_copy(&bytes[..len])
                    } else {
                        c.send_copy_batched(&bytes[..len])
                    };
                    match res {
                        Ok(()) => true,
                        Err(Error::WouldBlock) => false,
                        Err(e) => panic!("send_copy {seq}: {e}"),
                    }
                }
                _ => match c.alloc() {
                    Ok(mut b) => {
                        b.set_len(len).unwrap();
                        fill(&mut b, seq);
                        let res = if r.below(10) == 0 {
                            c.send(b)
                        } else {
                            c.send_batched(b)
                        };
                        match res {
                            Ok(()) => true,
                            Err(SendError::WouldBlock(_)) => false,
                            Err(e) => panic!("send {seq}: {e:?}"),
                        }
                    }
                    Err(Error::WouldBlock) => false,
                    Err(e) => panic!("alloc {seq}: {e}"),
                },
            };
            if ok {
                seq += 1;
                last = Instant::now();
            } else {
                assert!(last.elapsed() < WAIT, "sender stalled at {seq}");
                c.flush().expect("flush");
                std::thread::yield_now();
            }
        }
        if r.below(2) == 0 {
            c.flush().expect("flush");
        }
    }
    c.flush().expect("flush");
    // Run to completion: this thread drives its engine until the receiver has everything.
    let end = Instant::now() + WAIT;
    while !rx.is_finished() {
        assert!(Instant::now() < end, "the stream's tail stalled");
        c.flush().expect("flush");
        std::thread::sleep(Duration::from_micros(200));
    }
    let srv = rx.join().unwrap();
    assert_eq!(c.stats().sent, u64::from(n));
    assert_eq!(srv.stats().received, u64::from(n));
}

pub fn send_batched_pending_at_close_is_delivered(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("batch-close"));
    for seq in 0..3 {
        let mut b = c.alloc_timeout(WAIT).expect("alloc");
        b.set_len(20).unwrap();
        fill(&mut b, seq);
        c.send_batched(b).expect("send_batched");
    }
    // Dropping the connection sends a pending batch before the close.
    drop(c);
    for seq in 0..3 {
        recv_msg(&srv, seq, 20);
    }
    let err = srv.recv_timeout(WAIT).unwrap_err();
    assert!(matches!(err, Error::Disconnected), "{err}");
}

/// `send_batched` with a dedicated poller: a run is published whole, with one index store,
/// not per message. Nothing of it arrives before its publication, and it arrives in order at
/// `flush`, at the `batch`-th batched send in a row, at a receive on the sending connection
/// that finds nothing, at a plain `send` and at the drop. (A direct path, shm, publishes its
/// batched records at the same points.)
pub fn send_batched_dedicated_poller_publishes_runs(s: &'static Scheme) {
    const BATCH: u32 = 4;
    let se = s.build(s.poller(cores()[0]).batch(BATCH as usize));
    let re = s.build(s.rtc());
    let (srv, c) = pair(&re, &se, &(s.endpoint)("batch-ded"));
    let send_batched = |seq: u32| {
        let mut b = c.alloc_timeout(WAIT).expect("alloc");
        b.set_len(20).unwrap();
        fill(&mut b, seq);
        c.send_batched(b).expect("send_batched");
    };
    let quiet = |what: &str| match srv.recv_timeout(Duration::from_millis(50)) {
        Err(Error::Timeout) => {}
        Ok(m) => panic!(
            "an unpublished batched send arrived before {what} ({} B)",
            m.len()
        ),
        Err(e) => panic!("recv: {e}"),
    };
    let mut seq = 0;
    // Flush.
    for _ in 0..BATCH - 1 {
        send_batched(seq);
        seq += 1;
    }
    quiet("flush");
    c.flush().expect("flush");
    for i in seq - (BATCH - 1)..seq {
        recv_msg(&srv, i, 20);
    }
    // The batch-th.
    for _ in 0..BATCH {
        send_batched(seq);
        seq += 1;
    }
    for i in seq - BATCH..seq {
        recv_msg(&srv, i, 20);
    }
    // A receive that finds nothing.
    send_batched(seq);
    seq += 1;
    quiet("an empty receive");
    assert!(c.try_recv().expect("try_recv").is_none());
    recv_msg(&srv, seq - 1, 20);
    // A plain send, after the run.
    send_batched(seq);
    seq += 1;
    quiet("a plain send");
    let mut b = c.alloc_timeout(WAIT).expect("alloc");
    b.set_len(20).unwrap();
    fill(&mut b, seq);
    c.send(b).expect("send");
    seq += 1;
    recv_msg(&srv, seq - 2, 20);
    recv_msg(&srv, seq - 1, 20);
    // The drop.
    send_batched(seq);
    seq += 1;
    quiet("the drop");
    drop(c);
    recv_msg(&srv, seq - 1, 20);
    let err = srv.recv_timeout(WAIT).unwrap_err();
    assert!(matches!(err, Error::Disconnected), "{err}");
}

/// [`send_batched_stream_fifo_no_loss`] from a connection served by a dedicated poller (the
/// runs published with one index store each).
pub fn send_batched_stream_dedicated_poller(s: &'static Scheme) {
    let se = s.build(s.poller(cores()[0]));
    let re = s.build(s.rtc());
    let (srv, c) = pair(&re, &se, &(s.endpoint)("batch-ded-stream"));
    batched_stream(s, srv, c);
}

/// [`send_batched_stream_fifo_no_loss`] to a connection served by a dedicated poller, which
/// packs small messages that arrive together into shared receive slots: taken apart in order
/// by `poll` (its limit may end inside a slot) and `try_recv`, also from inside a handler.
pub fn send_batched_stream_to_a_dedicated_poller(s: &'static Scheme) {
    let se = s.build(s.poller(cores()[0]));
    let ce = s.build(s.rtc());
    let (srv, c) = pair(&se, &ce, &(s.endpoint)("batch-to-ded"));
    batched_stream(s, srv, c);
}

pub fn recv_into_copies_or_hands_back(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("into"));
    let mut big = vec![0u8; LIMIT];
    let mut small = vec![0u8; 64];
    // More rounds than large slots: each `recv_into` gives its slot back at once.
    for round in 0..5u32 {
        let seq = 10 * round;
        // Fits: copied.
        send_msg(&c, seq, LIMIT);
        assert_eq!(recv_into_wait(&srv, &mut big).expect("fits"), LIMIT);
        verify(&big, seq, LIMIT);
        // Too small: the message comes back intact, still before the next one.
        send_msg(&c, seq + 1, LIMIT - 1);
        send_msg(&c, seq + 2, 64);
        match recv_into_wait(&srv, &mut big[..LIMIT - 2]) {
            Err(RecvIntoError::TooSmall { message, capacity }) => {
                assert_eq!(capacity, LIMIT - 2);
                verify(&message, seq + 1, LIMIT - 1);
            }
            other => panic!("expected TooSmall, got {:?}", other.map(|_| ())),
        }
        match recv_into_wait(&srv, &mut small[..63]) {
            Err(RecvIntoError::TooSmall { message, capacity }) => {
                assert_eq!(capacity, 63);
                verify(&message, seq + 2, 64);
            }
            other => panic!("expected TooSmall, got {:?}", other.map(|_| ())),
        }
        // The other way round, a small one that fits.
        send_msg(&srv, seq + 3, 64);
        assert_eq!(recv_into_wait(&c, &mut small).expect("fits"), 64);
        verify(&small, seq + 3, 64);
    }
    assert_eq!(srv.stats().received, 15);
    assert!(srv.try_recv().unwrap().is_none());
}

fn poll_len(seq: u32) -> usize {
    // Inline and pooled sizes, mixed.
    match seq % 4 {
        0 => 1 + seq as usize % INLINE_MAX,
        1 => INLINE_MAX + 1 + (seq as usize * 31) % 2000,
        2 => 8,
        _ => BUF,
    }
}

/// Polls until `want` messages arrived (within `WAIT`), checking order, content and that no
/// call delivers more than `limit`.
fn poll_all(conn: &Connection, next: &mut u32, want: u32, limit: usize) {
    let deadline = Instant::now() + WAIT;
    let end = *next + want;
    while *next < end {
        let before = *next;
        let n = conn
            .poll(
                |m| {
                    verify(m, *next, poll_len(*next));
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
    b.set_len(poll_len(seq)).unwrap();
    fill(&mut b, seq);
    conn.send_timeout(b, WAIT).expect("send");
}

pub fn poll_fifo_limit_and_recycling(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("poll"));
    let (mut seq, mut next) = (0u32, 0u32);
    // 200 rounds of 12 messages through a pool of 16 buffers: without recycling the sender
    // would run dry within two rounds.
    for round in 0..200u32 {
        for _ in 0..12 {
            send_seq(&c, seq);
            seq += 1;
        }
        c.flush().expect("flush");
        poll_all(&srv, &mut next, 12, 1 + (round as usize % 7));
    }
    // Nothing left; limit 0 delivers nothing.
    assert_eq!(srv.poll(|_| panic!("nothing was sent"), 16).unwrap(), 0);
    send_seq(&c, seq);
    c.flush().expect("flush");
    assert_eq!(srv.poll(|_| panic!("limit 0"), 0).unwrap(), 0);
    poll_all(&srv, &mut next, 1, 4);
    assert_eq!(srv.stats().received, u64::from(next));
}

pub fn poll_handler_panic_recycles(s: &'static Scheme) {
    // One engine at both ends (run to completion, the sender's flush may already deliver into
    // the receiver's ring), then one each (the receiver's own poll takes from the fabric).
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("poll-panic"));
    panic_rounds(&srv, &c);
    let e2 = s.build(s.rtc());
    let (srv, c) = pair(&e, &e2, &(s.endpoint)("poll-panic-2"));
    panic_rounds(&srv, &c);
    // One message at a time (inline and pooled: `poll_len`), each lost to a panicking handler
    // that takes one message a call: four times the pool and the window, each recycled and
    // its space given back (or the sender runs dry).
    for seq in 0..4 * BUFFERS as u32 {
        send_seq(&c, seq);
        c.flush().expect("flush");
        let deadline = Instant::now() + WAIT;
        loop {
            let r = catch_unwind(AssertUnwindSafe(|| srv.poll(|_| panic!("handler"), 1)));
            match r {
                Err(_) => break,
                Ok(n) => assert_eq!(n.expect("poll"), 0, "the panicking handler ran"),
            }
            assert!(Instant::now() < deadline, "message {seq} missing");
            std::thread::yield_now();
        }
    }
    let seq = 4 * BUFFERS as u32;
    let mut next = seq;
    send_seq(&c, seq);
    c.flush().expect("flush");
    poll_all(&srv, &mut next, 1, 1);
}

/// [`poll_handler_panic_recycles`]'s rounds on one pair.
fn panic_rounds(srv: &Connection, c: &Connection) {
    let (mut seq, mut next) = (0u32, 0u32);
    for round in 0..100 {
        for _ in 0..4 {
            send_seq(c, seq);
            seq += 1;
        }
        c.flush().expect("flush");
        // Panic on the second message of the round (a pooled one: `poll_len`): the first is
        // delivered, the second is lost to the panicking handler (and recycled), the other two
        // stay queued. (The four may come over more than one call.) Every other round takes
        // one message a call, which run to completion takes straight from the fabric.
        let limit = if round % 2 == 0 { 4 } else { 1 };
        let mut k = 0;
        let deadline = Instant::now() + WAIT;
        loop {
            let r = catch_unwind(AssertUnwindSafe(|| {
                srv.poll(
                    |m| {
                        k += 1;
                        if k == 2 {
                            panic!("handler");
                        }
                        verify(m, next, poll_len(next));
                        next += 1;
                    },
                    limit,
                )
            }));
            match r {
                Err(_) => break,
                Ok(n) => assert!(n.expect("poll") <= 1, "past the panicking one"),
            }
            assert!(Instant::now() < deadline, "messages missing");
            std::thread::yield_now();
        }
        next += 1; // the one the handler panicked on
        poll_all(srv, &mut next, 2, 4);
    }
    assert_eq!(next, seq);
}

pub fn poll_dedicated_poller(s: &'static Scheme) {
    let e = s.build(s.poller(cores()[0]));
    let (srv, c) = pair(&e, &e, &(s.endpoint)("poll-ded"));
    let (mut seq, mut next) = (0u32, 0u32);
    for _ in 0..50 {
        for _ in 0..10 {
            send_seq(&c, seq);
            seq += 1;
        }
        poll_all(&srv, &mut next, 10, 3);
    }
}

/// Receives the next message on `conn` into `held` (within `WAIT`), or returns the limit
/// `try_recv` reports with `TooManyHeld`.
fn hold_next<'c>(conn: &'c Connection, held: &mut Vec<spinwire::Message<'c>>) -> Option<usize> {
    let deadline = Instant::now() + WAIT;
    loop {
        match conn.try_recv() {
            Ok(Some(m)) => {
                held.push(m);
                return None;
            }
            Ok(None) => {
                assert!(Instant::now() < deadline, "message {} missing", held.len());
                std::thread::yield_now();
            }
            Err(Error::TooManyHeld { max }) => return Some(max),
            Err(e) => panic!("try_recv with {} held: {e}", held.len()),
        }
    }
}

/// An application may hold many received messages at once, small ones among pooled ones, every
/// one reading its own bytes. Past the most it may hold, `try_recv` fails with the typed
/// `TooManyHeld` while a message waits, and loses nothing: dropping one lets the waiting message
/// through, in order.
pub fn held_messages_are_bounded_typed_and_lose_nothing(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("held"));
    // Small messages, with a pooled one among the first (a few of the pool's buffers held).
    let len = |seq: u32| {
        if seq % 8 == 7 && (seq as usize) < BUFFERS * 4 {
            INLINE_MAX + 1
        } else {
            8
        }
    };
    let mut held = Vec::new();
    let mut seq = 0u32;
    let max = loop {
        send_msg(&c, seq, len(seq));
        c.flush().expect("flush");
        if let Some(max) = hold_next(&srv, &mut held) {
            break max;
        }
        seq += 1;
        assert!(seq < 1 << 16, "no limit on held messages");
    };
    // Each held message takes a slot (its record; a small one's bytes too): the limit counts
    // every message held, pooled ones among them, and has room for a message in every buffer
    // and at least 256 small ones besides.
    let small = (0..held.len() as u32).filter(|&i| len(i) == 8).count();
    assert_eq!(max, held.len(), "the limit is the messages held");
    assert!(held.len() > small, "pooled messages held beside them");
    assert!(
        small >= 256,
        "at least 256 small messages may be held, got {small}"
    );
    assert!(
        max >= 256 + BUFFERS,
        "room for every buffer's message too, got {max}"
    );
    for (i, m) in (0u32..).zip(&held) {
        verify(m, i, len(i));
    }
    // Refused again while it waits; nothing is lost.
    assert!(matches!(srv.try_recv(), Err(Error::TooManyHeld { .. })));
    // One dropped: the waiting message arrives, then the next.
    held.swap_remove(held.len() / 2);
    assert!(hold_next(&srv, &mut held).is_none());
    verify(held.last().expect("held"), seq, 8);
    drop(held);
    for next in seq + 1..seq + 4 {
        send_msg(&c, next, 8);
        recv_msg(&srv, next, 8);
    }
}
