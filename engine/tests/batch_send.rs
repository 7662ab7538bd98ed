//! The shm direct path's batch send (`Connection::send_batched` + `flush`) and the receive
//! side's once-per-run publication of its position (`try_recv`): FIFO and no loss, a lone
//! `send` visible at once, what publishes a batch (flush, the engine's `batch` bound, a plain
//! send, a send that finds the window full, an empty receive, a message sent by reference),
//! and when a consumed message's window slot is free again. A batched stream between two
//! threads, FIFO and no loss, is the conformance suite's, over every scheme
//! (`conformance/send.rs`).

use spinwire::{Connection, Engine, SendError};
use spinwire_testkit::data::{fill, verify};
use spinwire_testkit::engine::{endpoint, pair, rtc_builder};
use spinwire_testkit::{serial, WAIT};

const BUF: usize = 1024;
/// Buffers and window (depth).
const DEPTH: usize = 16;
/// The engine's `batch`: a run of batched sends is published at this length.
const BATCH: usize = 8;
/// Inline threshold; larger messages travel by reference.
const INLINE: usize = 64;

fn engine() -> Engine {
    rtc_builder(BUF, DEPTH)
        .depth(DEPTH)
        .batch(BATCH)
        .inline_threshold(INLINE)
        .build()
        .expect("engine")
}

/// Batched send of message `seq` (`len` bytes); `false`: `WouldBlock` (nothing sent).
fn send_batched(c: &Connection, seq: u32, len: usize) -> bool {
    let mut b = c.alloc().expect("a buffer");
    b.set_len(len).unwrap();
    fill(&mut b, seq);
    match c.send_batched(b) {
        Ok(()) => true,
        Err(SendError::WouldBlock(_)) => false,
        Err(e) => panic!("send_batched {seq}: {e:?}"),
    }
}

fn send_now(c: &Connection, seq: u32, len: usize) {
    let mut b = c.alloc().expect("a buffer");
    b.set_len(len).unwrap();
    fill(&mut b, seq);
    c.send(b).expect("send");
}

/// Takes what is visible now (no waiting), checking FIFO order from `*next`.
fn take_visible(s: &Connection, next: &mut u32, len: usize) -> usize {
    let mut n = 0;
    while let Some(m) = s.try_recv().unwrap() {
        verify(&m, *next, len);
        *next += 1;
        n += 1;
    }
    n
}

#[test]
fn batched_sends_are_published_by_flush_and_a_lone_send_at_once() {
    let _g = serial();
    let e = engine();
    let (s, c) = pair(&e, &e, &endpoint("batch-flush"));
    let mut next = 0;
    // A lone send is visible to the peer as soon as it returns.
    send_now(&c, 0, 8);
    assert_eq!(take_visible(&s, &mut next, 8), 1);
    // A run shorter than the batch waits for the flush...
    for seq in 1..4 {
        assert!(send_batched(&c, seq, 8));
    }
    assert!(
        s.try_recv().unwrap().is_none(),
        "published before the flush"
    );
    c.flush().expect("flush");
    assert_eq!(take_visible(&s, &mut next, 8), 3);
    // ...or for the next plain send, which publishes it in order before itself.
    for seq in 4..6 {
        assert!(send_batched(&c, seq, 8));
    }
    send_now(&c, 6, 8);
    assert_eq!(take_visible(&s, &mut next, 8), 3);
    // The `batch`-th batched send in a row publishes the run (bounded latency).
    for seq in 7..7 + BATCH as u32 {
        assert!(send_batched(&c, seq, 8));
    }
    assert_eq!(take_visible(&s, &mut next, 8), BATCH);
    // A flush with nothing pending publishes nothing.
    c.flush().expect("flush");
    assert!(s.try_recv().unwrap().is_none());
    let st = c.stats();
    assert_eq!(st.sent, u64::from(next));
    assert_eq!(st.in_flight, 0);
}

#[test]
fn a_message_by_reference_publishes_the_run_before_it() {
    let _g = serial();
    let e = engine();
    let (s, c) = pair(&e, &e, &endpoint("batch-ref"));
    assert!(send_batched(&c, 0, 8));
    assert!(send_batched(&c, 1, INLINE));
    assert!(send_batched(&c, 2, INLINE + 1)); // a BUF_REF: published at once
    for (seq, len) in [(0, 8), (1, INLINE), (2, INLINE + 1)] {
        let m = s.try_recv().unwrap().expect("published");
        verify(&m, seq, len);
    }
    assert!(s.try_recv().unwrap().is_none());
}

#[test]
fn an_empty_receive_publishes_the_senders_own_batch() {
    let _g = serial();
    let e = engine();
    let (s, c) = pair(&e, &e, &endpoint("batch-rx"));
    assert!(send_batched(&c, 0, 8));
    // A receive call on the sending connection that finds nothing lets the batch out (a
    // reply may depend on it), as a poller cycle does on the poller path.
    assert!(c.try_recv().unwrap().is_none());
    let mut next = 0;
    assert_eq!(take_visible(&s, &mut next, 8), 1);
    assert!(send_batched(&c, 1, 8));
    assert_eq!(c.poll(|_| panic!("nothing was sent to c"), 4).unwrap(), 0);
    assert_eq!(take_visible(&s, &mut next, 8), 1);
    // Dropping the connection publishes a pending batch before the close.
    assert!(send_batched(&c, 2, 8));
    drop(c);
    let m = s.recv_timeout(WAIT).expect("published by the drop");
    verify(&m, 2, 8);
}

#[test]
fn a_batch_interrupted_by_a_full_window_is_published() {
    let _g = serial();
    let e = engine();
    let (s, c) = pair(&e, &e, &endpoint("batch-full"));
    // Batches of `BATCH` publish themselves; make the window run out mid-batch: 3 + 8 + 5.
    let mut sent = 0u32;
    for seq in 0..3 {
        assert!(send_batched(&c, seq, 16));
        sent += 1;
    }
    c.flush().expect("flush");
    loop {
        if !send_batched(&c, sent, 16) {
            break;
        }
        sent += 1;
        assert!(sent as usize <= DEPTH, "the window never ran out");
    }
    assert_eq!(sent as usize, DEPTH, "depth messages fit the window");
    // The refused send published the partial batch: every message is visible, in order.
    let mut next = 0;
    assert_eq!(take_visible(&s, &mut next, 16), DEPTH);
    // The receiver's ring ran empty, so the window is free again without another call on it.
    for seq in next..next + DEPTH as u32 {
        assert!(send_batched(&c, seq, 16), "window slot {seq} not freed");
    }
    assert!(!send_batched(&c, next + DEPTH as u32, 16));
    assert_eq!(take_visible(&s, &mut next, 16), DEPTH);
    assert_eq!(c.stats().sent, 2 * DEPTH as u64);
}

#[test]
fn a_consumed_slot_is_free_by_the_receivers_next_call() {
    let _g = serial();
    let e = engine();
    let (s, c) = pair(&e, &e, &endpoint("batch-slot"));
    for seq in 0..DEPTH as u32 {
        send_now(&c, seq, 8);
    }
    assert!(!send_batched(&c, 99, 8), "window full");
    // Two taken with `try_recv` (fewer than its publication run, the ring not empty): the
    // slots are free at the latest when the receiver calls in again.
    for seq in 0..2 {
        let m = s.try_recv().unwrap().expect("queued");
        verify(&m, seq, 8);
    }
    let _ = s.stats();
    for seq in DEPTH as u32..DEPTH as u32 + 2 {
        assert!(
            send_batched(&c, seq, 8),
            "slot not freed by the receiver's next call"
        );
    }
    assert!(!send_batched(&c, 99, 8));
    let mut next = 2;
    assert_eq!(take_visible(&s, &mut next, 8), DEPTH);
}
