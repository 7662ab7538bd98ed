//! Start order does not matter: `connect_timeout` waits for a listener to appear (a connect
//! made first succeeds once the listener comes up on another thread), and with nobody
//! listening it ends at its deadline with the typed [`Error::NoListener`], whose source is the
//! last refusal. Ends configured with different message limits settle on the smaller. A
//! listener refuses connections past its maximum.

use std::time::{Duration, Instant};

use spinwire::Error;
use spinwire_testkit::engine::*;
use spinwire_testkit::WAIT;

use super::Scheme;

/// The connect starts first; the listener comes up 200 ms later on another thread; the two
/// exchange verified messages.
pub fn connect_waits_for_a_listener(s: &'static Scheme) {
    let ep = (s.endpoint)("late-listener");
    let client = s.build(s.rtc());
    let server = s.build(s.rtc());
    std::thread::scope(|scope| {
        let srv = scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            let l = server.listen(&ep).expect("listen");
            let c = l.accept_timeout(WAIT).expect("accept");
            recv_msg(&c, 1, 100);
            send_msg(&c, 2, 100);
            // Until the client has taken the reply.
            let _ = c.recv_timeout(WAIT);
        });
        let c = client
            .connect_timeout(&ep, WAIT)
            .unwrap_or_else(|e| panic!("connect before the listener: {e:?}"));
        send_msg(&c, 1, 100);
        recv_msg(&c, 2, 100);
        drop(c);
        srv.join().expect("listener thread");
    });
}

/// With nobody ever listening, the connect waits until its deadline and says what it waited
/// for.
pub fn connect_without_listener_times_out_typed(s: &'static Scheme) {
    let ep = (s.endpoint)("never-listened");
    let e = s.build(s.rtc());
    let timeout = Duration::from_millis(300);
    let t0 = Instant::now();
    let err = e.connect_timeout(&ep, timeout).unwrap_err();
    let took = t0.elapsed();
    match &err {
        Error::NoListener {
            endpoint, waited, ..
        } => {
            assert_eq!(endpoint, &ep);
            assert!(
                *waited >= timeout,
                "gave up after {waited:?}, before {timeout:?}"
            );
        }
        other => panic!("expected NoListener, got {other:?}"),
    }
    assert!(took >= timeout, "returned after {took:?}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the last refusal is the source"
    );
    let text = err.to_string();
    assert!(text.contains("no listener"), "{text}");

    // A bad endpoint still fails at once, not after a wait.
    assert!(matches!(
        e.connect_timeout("tcp://", timeout),
        Err(Error::BadEndpoint { .. })
    ));
}

/// Ends with different `max_message_size`s settle on the smaller: both report it, carry a
/// message of exactly it both ways, and refuse a larger one. Either end may be the smaller.
pub fn different_message_limits_settle_to_the_smaller(s: &'static Scheme) {
    const SMALL: usize = 64 << 10;
    for (tag, server_limit, client_limit) in [
        ("settle-client-small", super::LIMIT, SMALL),
        ("settle-server-small", SMALL, super::LIMIT),
    ] {
        let server = s.build(s.rtc().max_message_size(server_limit));
        let client = s.build(s.rtc().max_message_size(client_limit));
        let (a, b) = pair(&server, &client, &(s.endpoint)(tag));
        assert_eq!(a.max_message_size(), SMALL, "{tag}: the listener's limit");
        assert_eq!(b.max_message_size(), SMALL, "{tag}: the connector's limit");
        send_msg(&b, 1, SMALL);
        recv_msg(&a, 1, SMALL);
        send_msg(&a, 2, SMALL);
        recv_msg(&b, 2, SMALL);
        for c in [&a, &b] {
            assert!(
                c.send_copy(&vec![0; SMALL + 1]).is_err(),
                "{tag}: a message over the settled limit"
            );
        }
        send_msg(&b, 3, 100);
        recv_msg(&a, 3, 100);
    }
}

/// A listener holds at most `max_connections_per_listener` connections: one more is refused
/// (the connect fails, or its connection goes down at once where the connection exists before
/// the listener sees it, `mem://`), and the listener's engine reports `Error::ListenerFull`.
/// Once one is closed, a new connect gets through.
pub fn listener_connection_maximum(s: &'static Scheme) {
    const MAX: usize = 2;
    let ep = (s.endpoint)("listener-max");
    let server = s.build(s.rtc().max_connections_per_listener(MAX));
    let client = s.build(s.rtc());
    let l = server.listen(&ep).expect("listen");
    let mut held = Vec::new();
    for _ in 0..MAX {
        let c = client.connect(&ep).expect("connect under the maximum");
        let a = l.accept_timeout(WAIT).expect("accept under the maximum");
        held.push((c, a));
    }
    while server.try_event().is_some() {}
    match client.connect_timeout(&ep, Duration::from_secs(2)) {
        Err(e) => assert!(matches!(e, Error::Connect { .. }), "{e:?}"),
        Ok(c) => {
            let deadline = Instant::now() + WAIT;
            while c.is_open() {
                assert!(Instant::now() < deadline, "a connection past the maximum");
                server.poll();
                client.poll();
                let _ = c.try_recv();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    let deadline = Instant::now() + WAIT;
    loop {
        server.poll();
        match server.try_event() {
            Some(spinwire::Event::Error {
                conn: None,
                error: Error::ListenerFull { endpoint, max },
            }) => {
                assert_eq!((endpoint.as_str(), max), (ep.as_str(), MAX));
                break;
            }
            Some(_) => {}
            None => {
                assert!(Instant::now() < deadline, "no ListenerFull event");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    assert!(l.try_accept().expect("try_accept").is_none());
    // The held connections are unaffected; closing one makes room.
    for (i, (c, a)) in held.iter().enumerate() {
        send_msg(c, i as u32, 100);
        recv_msg(a, i as u32, 100);
    }
    drop(held.pop());
    let deadline = Instant::now() + WAIT;
    let (c, a) = loop {
        if let Ok(c) = client.connect_timeout(&ep, Duration::from_secs(1)) {
            if let Ok(a) = l.accept_timeout(Duration::from_secs(1)) {
                break (c, a);
            }
        }
        assert!(Instant::now() < deadline, "no room after a close");
    };
    send_msg(&c, 7, 100);
    recv_msg(&a, 7, 100);
}
