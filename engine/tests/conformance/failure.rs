//! A connection that is down fails every data call with the reason it went down: `alloc`,
//! `alloc_large`, `claim` of every size (a ring record, a pool buffer, a large slot), `send`
//! and `send_batched` of a buffer taken before, `send_copy`, `flush`; the receive calls
//! (`try_recv`, `poll`, `recv_timeout`) once every message received before is taken. Its
//! resources are released when the application drops it.

use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, Error};
use spinwire_testkit::data::fill;
use spinwire_testkit::engine::*;
use spinwire_testkit::WAIT;

use super::{Scheme, BUF};

/// Asserts that every data call of `conn` fails with an error that `reason` accepts (the
/// connection is down and its received messages are taken).
///
/// # Panics
///
/// If a call succeeds or fails with another error.
pub fn assert_every_call_fails(conn: &Connection, reason: fn(&Error) -> bool) {
    let check = |what: &str, r: Result<(), Error>| match r {
        Err(e) if reason(&e) => {}
        Err(e) => panic!("{what} on a down connection: unexpected error {e:?}"),
        Ok(()) => panic!("{what} succeeded on a down connection"),
    };
    check("alloc", conn.alloc().map(drop));
    check("alloc_large", conn.alloc_large().map(drop));
    check("alloc_timeout", conn.alloc_timeout(WAIT).map(drop));
    // A ring record (shm), a pool buffer, a large slot.
    for len in [1, 100, BUF - 96, BUF, BUF + 1, 64 << 10] {
        check(&format!("claim({len})"), conn.claim(len).map(drop));
    }
    check("send_copy(100)", conn.send_copy(&[7; 100]));
    check("send_copy(64 KiB)", conn.send_copy(&vec![7; 64 << 10]));
    check("flush", conn.flush());
    check("try_recv", conn.try_recv().map(|m| assert!(m.is_none())));
    check("poll", conn.poll(|_| panic!("a message"), 8).map(drop));
    check(
        "recv_timeout",
        conn.recv_timeout(Duration::from_millis(10)).map(drop),
    );
    check("recv_into", {
        let mut buf = [0u8; 16];
        conn.recv_into(&mut buf).map(drop).map_err(|e| match e {
            spinwire::RecvIntoError::Closed(e) => e,
            e => panic!("recv_into: {e:?}"),
        })
    });
}

fn is_disconnected(e: &Error) -> bool {
    matches!(e, Error::Disconnected)
}

/// Waits (bounded) until `engine` has closed every connection it opened.
fn wait_all_closed(engine: &Engine) {
    let deadline = Instant::now() + WAIT;
    loop {
        engine.poll();
        let c = engine.counters();
        if c.connections_closed == c.connections_opened {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connections not released: {} opened, {} closed",
            c.connections_opened,
            c.connections_closed
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn after_peer_close(s: &'static Scheme, survivor_engine: &Engine, peer_engine: &Engine) {
    let (survivor, peer) = pair(survivor_engine, peer_engine, &(s.endpoint)("dead-calls"));
    for seq in 0..3 {
        send_msg(&peer, seq, 100);
    }
    // Taken before the close: its send must fail afterwards and hand it back.
    let mut held = survivor
        .alloc_timeout(WAIT)
        .expect("alloc before the close");
    held.set_len(100).unwrap();
    fill(&mut held, 9);
    let mut held_batched = survivor
        .alloc_timeout(WAIT)
        .expect("alloc before the close");
    held_batched.set_len(100).unwrap();
    drop(peer);

    // What was sent before the close is delivered first.
    for seq in 0..3 {
        recv_msg(&survivor, seq, 100);
    }
    let err = survivor.recv_timeout(WAIT).unwrap_err();
    assert!(is_disconnected(&err), "{err:?}");
    assert!(!survivor.is_open());

    match survivor.send(held) {
        Err(spinwire::SendError::Closed { error, buf }) => {
            assert!(is_disconnected(&error), "{error:?}");
            assert_eq!(buf.len(), 100, "the buffer is handed back");
        }
        other => panic!("send of a held buffer on a down connection: {other:?}"),
    }
    match survivor.send_batched(held_batched) {
        Err(spinwire::SendError::Closed { error, .. }) => {
            assert!(is_disconnected(&error), "{error:?}")
        }
        other => panic!("send_batched on a down connection: {other:?}"),
    }
    assert_every_call_fails(&survivor, is_disconnected);
    drop(survivor);
    wait_all_closed(survivor_engine);
}

/// The peer closes: the survivor gets what was sent before, then every data call fails with
/// `Disconnected` (run to completion and with a dedicated poller), and dropping it releases
/// it.
pub fn dead_connection_fails_every_data_call(s: &'static Scheme) {
    let rtc = s.build(s.rtc());
    let peer = s.build(s.rtc());
    after_peer_close(s, &rtc, &peer);
    let ded = s.build(s.poller(spinwire_testkit::cores()[0]));
    after_peer_close(s, &ded, &peer);
}
