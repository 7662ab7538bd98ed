//! tcp's byte window at the engine's defaults (no `depth` set): a receiver that takes nothing
//! stops a stream of small messages after the byte window's worth of records (far more than
//! the 128 messages of the engine's default depth, and bounded), the sender sees
//! `WouldBlock`, and once the receiver takes everything the stream resumes in order. The
//! application's own window is that byte window: it sends exactly what the fabric may have in
//! flight, small messages or large, and nothing waits in its send ring for credits.
//! (Back-pressure with `depth` set, on every scheme, is the conformance suite's
//! `back_pressure_*` and `send_timeout_without_credits`.)

use std::time::{Duration, Instant};

use spinwire_testkit::engine::*;
use spinwire_testkit::{serial, WAIT};

const BUF: usize = 4096;
const BUFFERS: usize = 256;
/// The defaults' byte window: sixteen 64-KiB receive chunks.
const WINDOW: usize = 1 << 20;
const LEN: usize = 64;
/// A 64-byte message's record: an 8-byte header and the payload (a multiple of 8).
const RECORD: usize = 8 + LEN;

fn ep() -> String {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a free loopback port");
    format!("tcp://127.0.0.1:{}", l.local_addr().unwrap().port())
}

/// Sends `len`-byte messages until the sender has seen `WouldBlock` for a while with both
/// engines running (the receiver's engine reads and delivers what its ring holds, its
/// application takes nothing); returns how many were sent.
fn send_until_stopped(
    c: &spinwire::Connection,
    ce: &spinwire::Engine,
    se: &spinwire::Engine,
    len: usize,
) -> u32 {
    let mut sent = 0u32;
    let mut blocked_since: Option<Instant> = None;
    let end = Instant::now() + WAIT;
    while !matches!(blocked_since, Some(t) if t.elapsed() >= Duration::from_millis(200)) {
        assert!(
            Instant::now() < end,
            "the sender was never stopped ({sent} sent)"
        );
        if try_send_one(c, sent, len) {
            sent += 1;
            blocked_since = None;
        } else {
            blocked_since.get_or_insert_with(Instant::now);
            c.flush().expect("flush");
            ce.poll();
            se.poll();
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    sent
}

#[test]
fn a_stopped_receiver_stops_a_default_sender_at_the_byte_window() {
    let _g = serial();
    let se = rtc_builder(BUF, BUFFERS).build().unwrap();
    let ce = rtc_builder(BUF, BUFFERS).build().unwrap();
    let (srv, c) = pair(&se, &ce, &ep());
    let sent = send_until_stopped(&c, &ce, &se, LEN);
    let by_bytes = (WINDOW / RECORD) as u32;
    assert_eq!(
        sent, by_bytes,
        "the byte window holds {by_bytes} records of {LEN}-byte messages, and the application's \
         window is that byte window (before, a pool's worth more queued in its send ring)"
    );
    assert!(c.stats().in_flight <= u64::from(sent));
    // The receiver takes everything, in order; the sender's engine runs meanwhile.
    let receiver = std::thread::spawn(move || {
        for seq in 0..sent {
            recv_msg(&srv, seq, LEN);
        }
        srv
    });
    let end = Instant::now() + Duration::from_secs(30);
    while !receiver.is_finished() {
        assert!(Instant::now() < end, "the stream did not resume");
        c.flush().expect("flush");
        ce.poll();
        std::thread::sleep(Duration::from_micros(200));
    }
    let srv = receiver.join().expect("receiver");
    // The window is open again.
    send_msg(&c, sent, LEN);
    recv_msg(&srv, sent, LEN);
    assert_eq!(srv.stats().received, u64::from(sent) + 1);
}

/// Large messages at the defaults: the sender stops at the byte window's worth of records
/// (32 of 64 KiB), not at its send pool (64 buffers of 64 KiB here, all of which used to queue
/// in its send ring: 4 MiB more cache footprint, which halved `bench rate --size 64k`'s
/// bandwidth), and the stream resumes in order.
#[test]
fn large_messages_stop_at_the_byte_window_not_the_send_pool() {
    large_messages_stop_at_the_byte_window(&|| rtc_builder(BIG, BIG_BUFFERS));
}

/// The same with a dedicated poller per side: the poller hands the bytes credited back to the
/// application (one poller thread per engine, backoff idle, so the two cores are not
/// oversubscribed by spinning).
#[test]
fn large_messages_stop_at_the_byte_window_dedicated_pollers() {
    large_messages_stop_at_the_byte_window(&|| poller_builder(&[0], BIG, BIG_BUFFERS));
}

const BIG: usize = 64 << 10;
const BIG_BUFFERS: usize = 64;

fn large_messages_stop_at_the_byte_window(builder: &dyn Fn() -> spinwire::EngineBuilder) {
    let _g = serial();
    let se = builder().build().unwrap();
    let ce = builder().build().unwrap();
    let (srv, c) = pair(&se, &ce, &ep());
    let sent = send_until_stopped(&c, &ce, &se, BIG);
    // The receiver's byte window: sixteen chunks of two whole records each (a chunk's size a
    // multiple of 64), so 32 records of 8 + 64 Ki bytes and change.
    let record = 8 + BIG;
    let chunk = (2 * record).next_multiple_of(64);
    let by_bytes = (16 * chunk / record) as u32;
    assert_eq!(by_bytes, 32);
    // What the receiver's engine delivered into its ring was credited (its application owes
    // nothing for it); the rest is the window's, on the wire or in the kernels. Before, up to
    // a pool of buffers more waited in the sender's send ring.
    let delivered = srv.stats().rx_msgs;
    assert!(
        u64::from(sent) <= delivered + u64::from(by_bytes),
        "{sent} sent, {delivered} delivered: the application's window is the byte window of \
         {by_bytes} records, not the pool of {BIG_BUFFERS}"
    );
    assert!(
        u64::from(sent) >= delivered + u64::from(by_bytes / 2),
        "{sent} sent, {delivered} delivered: the sender stopped short of the byte window"
    );
    // The receiver hands its connection back (dropped there, it would close under the
    // sender's next `flush`).
    let receiver = std::thread::spawn(move || {
        for seq in 0..=sent {
            recv_msg(&srv, seq, BIG);
        }
        srv
    });
    send_msg(&c, sent, BIG);
    let end = Instant::now() + Duration::from_secs(30);
    while !receiver.is_finished() {
        assert!(Instant::now() < end, "the stream did not resume");
        c.flush().expect("flush");
        ce.poll();
        std::thread::sleep(Duration::from_micros(200));
    }
    let srv = receiver.join().expect("receiver");
    assert_eq!(srv.stats().received, u64::from(sent) + 1);
}

/// A run-to-completion receiver that always finds a message (its `try_recv` takes each one the
/// direct way and never runs a pass) still returns its credit once half the byte window is
/// owed, so its sender goes on. Nothing here waits on timing: the receiver's engine runs no
/// pass after the message that makes half a window owed (every take after it finds that
/// message or a later one in its ring; liveness is off, so its control thread runs none
/// either), and the sender needs that credit to send more than a window and a pool. (Before
/// the fix it stalls whenever a direct receive delivered that message, as it did in every run;
/// a pass that delivers it returns the credit with its flush. The fabric's own unit test,
/// `poll_rx_writes_the_credit_once_half_the_window_is_owed`, leaves no such case.)
#[test]
fn a_receiver_that_always_finds_a_message_returns_credit_when_half_a_window_is_owed() {
    let _g = serial();
    let se = rtc_builder(BUF, BUFFERS)
        .liveness_timeout(Duration::ZERO)
        .build()
        .unwrap();
    // The sender's liveness is off too: a receiver that writes nothing is not silence here.
    let ce = rtc_builder(BUF, BUFFERS)
        .liveness_timeout(Duration::ZERO)
        .build()
        .unwrap();
    let (srv, c) = pair(&se, &ce, &ep());
    // The receiver owes a credit on its own once half the window's bytes were delivered: at
    // the `half`-th message. It takes exactly that many, so every take after the one that
    // crosses is of a message already delivered (into its receive ring, no pass).
    let half = (WINDOW / 2).div_ceil(RECORD) as u32;
    // Without a credit the sender sends at most a window of records (its application's window
    // is the byte window): one more proves the credit came back.
    let target = (WINDOW / RECORD) as u32 + 1;
    send_past_window_while_taking(&c, &ce, &srv, target, half, LEN);
}
