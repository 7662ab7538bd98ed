//! An application that makes no spinwire call keeps its connections: heartbeats go out and peers
//! are checked without it (in run-to-completion mode the control thread runs the poller's cycle
//! on its liveness beats while the application runs none).

use std::time::{Duration, Instant};

use spinwire::{Engine, Event};
use spinwire_testkit::engine::*;
use spinwire_testkit::WAIT;

use super::Scheme;

/// Drains `engine`'s events, failing on any that reports a connection lost.
fn no_loss_reported(engine: &Engine, who: &str) {
    while let Some(e) = engine.try_event() {
        assert!(
            !matches!(
                e,
                Event::PeerUnresponsive { .. } | Event::Disconnected { .. } | Event::Error { .. }
            ),
            "{who}: {e:?} after an idle pause"
        );
    }
}

/// Each end in turn (run-to-completion, a short liveness timeout) makes no call for three
/// liveness timeouts while the other polls, then both; both connections stay open and then
/// carry verified messages both ways.
pub fn idle_application_keeps_its_connection(s: &'static Scheme) {
    let a = s.build(s.rtc().liveness_timeout(s.liveness));
    let b = s.build(s.rtc().liveness_timeout(s.liveness));
    let (server, client) = pair(&a, &b, &(s.endpoint)("idle-app"));
    send_msg(&client, 0, 100);
    recv_msg(&server, 0, 100);
    send_msg(&server, 1, 100);
    recv_msg(&client, 1, 100);
    // One end makes no spinwire call while the other keeps polling (checking it), then the
    // other way round, then neither.
    for (busy, who) in [(&b, "server"), (&a, "client")] {
        let until = Instant::now() + s.liveness * 3;
        while Instant::now() < until {
            busy.poll();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            server.is_open(),
            "{who} idle: the server's connection went down"
        );
        assert!(
            client.is_open(),
            "{who} idle: the client's connection went down"
        );
    }
    std::thread::sleep(s.liveness * 3);
    assert!(server.is_open() && client.is_open());
    no_loss_reported(&a, "server");
    no_loss_reported(&b, "client");
    for seq in 2..10 {
        send_msg(&client, seq, 100 + seq as usize);
        recv_msg(&server, seq, 100 + seq as usize);
        send_msg(&server, seq + 100, 200);
        recv_msg(&client, seq + 100, 200);
    }
    assert!(server.is_open() && client.is_open());
}

/// Connections beyond one beat's attach budget: both ends (run-to-completion, a short liveness
/// timeout) make a burst of connections, then make no call for three liveness timeouts. Every
/// connection stays open on both sides and then carries a verified message each way. (The
/// control thread's cycles for an idle application take a bounded number of commands each: with
/// one cycle per beat a burst of accepted connections was attached a few per beat, and the
/// peers of those still queued declared them unresponsive.)
pub fn idle_application_keeps_a_burst_of_connections(s: &'static Scheme) {
    // More than a poller attaches in the beats of one liveness timeout at one cycle per beat
    // (8 commands per cycle, 12 beats per timeout).
    const N: usize = 128;
    // Small pools and no large slots: RDMA registers (pins) all of it, for every connection.
    let small = |b: spinwire::EngineBuilder| {
        b.liveness_timeout(s.liveness)
            .pool(1024, 16)
            .large_buffers(0)
    };
    let a = s.build(small(s.rtc()));
    let b = s.build(small(s.rtc()));
    let ep = (s.endpoint)("idle-burst");
    let l = a.listen(&ep).expect("listen");
    let mut pairs = Vec::with_capacity(N);
    for _ in 0..N {
        let c = b.connect(&ep).expect("connect");
        let srv = l.accept_timeout(WAIT).expect("accept");
        pairs.push((srv, c));
    }
    std::thread::sleep(s.liveness * 3);
    no_loss_reported(&a, "server");
    no_loss_reported(&b, "client");
    for (i, (srv, c)) in pairs.iter().enumerate() {
        assert!(srv.is_open() && c.is_open(), "connection {i} went down");
    }
    for (i, (srv, c)) in pairs.iter().enumerate() {
        let seq = i as u32;
        send_msg(c, seq, 64);
        recv_msg(srv, seq, 64);
        send_msg(srv, seq, 64);
        recv_msg(c, seq, 64);
    }
}
