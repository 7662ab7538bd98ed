//! Back-pressure: a one-way flood into a slow receiver loses nothing, the sender sees
//! `WouldBlock`, and no more than the window is ever in flight; `send_timeout` times out when
//! the receiver takes nothing; a run-to-completion receiver whose every take finds a message
//! (and so runs no engine pass) still returns credit.

use std::time::{Duration, Instant};

use spinwire::{Engine, Error, SendError};
use spinwire_testkit::data::fill;
use spinwire_testkit::engine::*;
use spinwire_testkit::{cores, WAIT};

use super::Scheme;

/// Messages of the flood (divided by the scheme's `slow`).
const N: u32 = 20_000;
/// Buffer size and count of the flood's engines, and their window.
const FLOOD_BUF: usize = 512;
const FLOOD_BUFFERS: usize = 32;
const FLOOD_DEPTH: usize = 16;

fn flood_len(seq: u32) -> usize {
    1 + (seq as usize * 37) % 300
}

fn flood(s: &'static Scheme, se: Engine, ce: Engine) {
    let (srv, c) = pair(&se, &ce, &(s.endpoint)("flood"));
    let n = N / s.slow;
    // The slow receiver: sleeps now and then, verifies order and content of everything.
    let receiver = std::thread::spawn(move || {
        for seq in 0..n {
            if seq % (2000 / s.slow) == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            recv_msg(&srv, seq, flood_len(seq));
        }
        // Nothing beyond what was sent.
        assert!(matches!(
            srv.try_recv(),
            Ok(None) | Err(Error::Disconnected)
        ));
        srv.stats()
    });
    let mut would_block = 0u64;
    let mut max_in_flight = 0u64;
    let end = Instant::now() + Duration::from_secs(60);
    for seq in 0..n {
        let mut b = c.alloc_timeout(WAIT).expect("alloc");
        b.set_len(flood_len(seq)).unwrap();
        fill(&mut b, seq);
        let mut b = b;
        loop {
            match c.send(b) {
                Ok(()) => break,
                Err(SendError::WouldBlock(back)) => {
                    would_block += 1;
                    b = back;
                    assert!(Instant::now() < end, "sender stuck at {seq}");
                    c.flush().expect("flush");
                    ce.poll();
                    std::thread::yield_now();
                }
                Err(e) => panic!("send: {e:?}"),
            }
        }
        max_in_flight = max_in_flight.max(c.stats().in_flight);
    }
    // Run to completion: this thread drives its engine until the receiver has everything (the
    // last bytes may still wait for room).
    while !receiver.is_finished() {
        assert!(Instant::now() < end, "flood tail stalled");
        // The receiver closes its end once it has everything.
        match c.flush() {
            Ok(()) | Err(Error::Disconnected) => {}
            Err(e) => panic!("flush: {e:?}"),
        }
        ce.poll();
        std::thread::sleep(Duration::from_micros(200));
    }
    let rst = receiver.join().expect("receiver");
    assert_eq!(rst.received, u64::from(n));
    assert!(
        would_block > 0,
        "a slow receiver must push back on the sender"
    );
    assert!(
        max_in_flight <= FLOOD_DEPTH as u64,
        "in flight {max_in_flight} > depth {FLOOD_DEPTH}"
    );
    let st = c.stats();
    assert_eq!(st.sent, u64::from(n));
    assert!(st.would_block >= would_block);
}

pub fn back_pressure_run_to_completion(s: &'static Scheme) {
    let mk = || {
        s.build((s.tweak)(
            rtc_builder(FLOOD_BUF, FLOOD_BUFFERS).depth(FLOOD_DEPTH),
        ))
    };
    flood(s, mk(), mk());
}

pub fn back_pressure_dedicated_pollers(s: &'static Scheme) {
    let cores = cores();
    let mk = |core: usize| {
        s.build((s.tweak)(
            poller_builder(&[core], FLOOD_BUF, FLOOD_BUFFERS).depth(FLOOD_DEPTH),
        ))
    };
    flood(s, mk(cores[0]), mk(cores[cores.len() - 1]));
}

pub fn send_timeout_without_credits(s: &'static Scheme) {
    let e = s.build((s.tweak)(rtc_builder(256, 8).depth(8)));
    let (srv, c) = pair(&e, &e, &(s.endpoint)("credits"));
    // depth = 8: eight messages fit, then there is no credit while the receiver takes nothing
    // (its poller still runs: the receive queue holds the window; nothing is consumed).
    let mut sent = 0;
    loop {
        let b = c.alloc_timeout(WAIT).unwrap();
        match c.send_timeout(b, Duration::from_millis(50)) {
            Ok(()) => sent += 1,
            Err(SendError::Timeout(b)) => {
                drop(b);
                break;
            }
            Err(e) => panic!("{e:?}"),
        }
        assert!(sent <= 64, "credits must run out");
    }
    assert!(sent >= 8, "{sent} sent before the window closed");
    // `send_copy` of a small message (shm: straight into a ring record) waits for the same
    // credits: back-pressure, nothing sent.
    assert!(matches!(c.send_copy(&[1; 8]), Err(Error::WouldBlock)));
    assert!(matches!(
        c.send_copy_timeout(&[1; 8], Duration::from_millis(20)),
        Err(Error::Timeout)
    ));
    c.flush().expect("flush");
    for _ in 0..sent {
        srv.recv_timeout(WAIT).unwrap();
    }
    assert!(
        srv.try_recv().unwrap().is_none(),
        "the refused copies were not sent"
    );
    // Then the window opens again.
    let b = c.alloc_timeout(WAIT).unwrap();
    c.send_timeout(b, WAIT).expect("credits came back");
    c.flush().expect("flush");
    srv.recv_timeout(WAIT).unwrap();
}

/// The window of [`rtc_receiver_that_always_finds_a_message_returns_credit`] (its buffers
/// are twice that, so that the window, not the pool, stops the sender) and its messages' size
/// (small: inline on every fabric).
const CREDIT_DEPTH: usize = 16;
const CREDIT_LEN: usize = 64;

/// A run-to-completion receiver takes exactly half a window and then makes no call: once the
/// window's messages are there, each of its takes finds one (run-to-completion's direct way
/// on a fabric that has it: no engine pass, whose flush would return credits), so the credits
/// owed for half a window must go back from the takes themselves. The sender's engine runs
/// throughout; it must get more than a window out. Liveness is off on both sides: no
/// liveness check's idle return or heartbeat brings the credits instead.
pub fn rtc_receiver_that_always_finds_a_message_returns_credit(s: &'static Scheme) {
    let mk = || {
        s.build(
            (s.tweak)(rtc_builder(FLOOD_BUF, 2 * CREDIT_DEPTH).depth(CREDIT_DEPTH))
                .liveness_timeout(Duration::ZERO),
        )
    };
    let (se, ce) = (mk(), mk());
    let (srv, c) = pair(&se, &ce, &(s.endpoint)("credit-return"));
    let half = (CREDIT_DEPTH / 2) as u32;
    // Without a credit the sender sends at most a window: one more proves one came back.
    let target = CREDIT_DEPTH as u32 + 1;
    send_past_window_while_taking(&c, &ce, &srv, target, half, CREDIT_LEN);
}

/// Every `*_timeout` call takes any `Duration`, `Duration::MAX` (forever) included: a call
/// that can go ahead returns at once, one that must wait waits until what it waits for comes,
/// and none panics (a deadline beyond what an `Instant` holds once overflowed in the wait).
pub fn timeouts_of_any_length_wait_and_never_panic(s: &'static Scheme) {
    const FOREVER: Duration = Duration::MAX;
    let se = s.build((s.tweak)(rtc_builder(256, 8).depth(8)));
    let ce = s.build((s.tweak)(rtc_builder(256, 8).depth(8)));
    let ep = (s.endpoint)("forever");
    let l = se.listen(&ep).expect("listen");
    let c = ce
        .connect_timeout(&ep, FOREVER)
        .expect("connect_timeout(MAX)");
    let srv = l.accept_timeout(FOREVER).expect("accept_timeout(MAX)");
    // Ready at once.
    let mut b = c.alloc_timeout(FOREVER).expect("alloc_timeout(MAX)");
    b.set_len(32).expect("set_len");
    fill(&mut b, 0);
    c.send_timeout(b, FOREVER).expect("send_timeout(MAX)");
    c.flush().expect("flush");
    srv.wait_timeout(FOREVER).expect("wait_timeout(MAX)");
    recv_msg(&srv, 0, 32);
    // Waiting: the message comes 20 ms later from another thread.
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        send_msg(&c, 1, 32);
        c
    });
    let m = srv.recv_timeout(FOREVER).expect("recv_timeout(MAX) waited");
    drop(m);
    let c = sender.join().expect("sender");
    // A full window: the send waits for the credit the receiver returns 20 ms later.
    let mut sent = 2;
    while let Ok(mut b) = c.alloc() {
        b.set_len(32).expect("set_len");
        fill(&mut b, sent);
        match c.send(b) {
            Ok(()) => sent += 1,
            Err(SendError::WouldBlock(_)) => break,
            Err(e) => panic!("{e:?}"),
        }
        assert!(sent < 64, "the window must close");
    }
    c.flush().expect("flush");
    let receiver = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        for seq in 2..=sent {
            recv_msg(&srv, seq, 32);
        }
        srv
    });
    let mut b = c
        .alloc_timeout(FOREVER)
        .expect("alloc_timeout(MAX) with a window full");
    b.set_len(32).expect("set_len");
    fill(&mut b, sent);
    c.send_timeout(b, FOREVER)
        .expect("send_timeout(MAX) waited for credit");
    c.flush().expect("flush");
    let srv = receiver.join().expect("receiver");
    assert!(matches!(srv.try_recv(), Ok(None)));
}
