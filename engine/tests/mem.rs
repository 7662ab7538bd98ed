//! The `mem://` fabric on the real engine, without sockets: FIFO ping-pong (run-to-completion,
//! one dedicated poller, two engines), a flood into a slow receiver (back-pressure, no loss),
//! large messages, and the faults: a killed peer (also one that this end waits on), a stalled
//! one, a corrupt record.

use std::time::{Duration, Instant};

use spinwire::fabric::mem::{End, Faults};
use spinwire::{AbortReason, Connection, Engine, Error, Event, FabricError, SendError};
use spinwire_testkit::data::{fill, verify};
use spinwire_testkit::engine::*;
use spinwire_testkit::{cores, serial, WAIT};

fn ep(tag: &str) -> String {
    format!("mem://t-{tag}")
}

/// Sends frame `seq` of `len` bytes without waiting: `false` on back-pressure.
fn try_send(conn: &Connection, seq: u32, len: usize) -> bool {
    let mut b = match conn.claim(len) {
        Ok(b) => b,
        Err(Error::WouldBlock) => return false,
        Err(e) => panic!("claim: {e}"),
    };
    fill(&mut b, seq);
    match conn.send(b) {
        Ok(()) => true,
        Err(SendError::WouldBlock(_)) => false,
        Err(e) => panic!("send {seq}: {e:?}"),
    }
}

/// One thread drives both ends: each round trip is verified, in order, across inline, pooled
/// and (with `large`) large sizes.
fn ping_pong(client: &Connection, server: &Connection, rounds: u32, large: bool) {
    let mut sizes = vec![0usize, 1, 8, 64, 116, 117, 1000, 4096];
    if large {
        sizes.push(100_000);
    }
    for i in 0..rounds {
        let len = sizes[i as usize % sizes.len()];
        send_msg(client, i, len);
        let m = server.recv_timeout(WAIT).expect("server recv");
        verify(&m, i, len);
        let mut b = claim_timeout(server, m.len());
        b.copy_from(&m).expect("copy");
        drop(m);
        server.send_timeout(b, WAIT).expect("echo");
        server.flush().expect("flush");
        recv_msg(client, i, len);
    }
}

#[test]
fn ping_pong_run_to_completion_one_thread() {
    let _g = serial();
    let engine = rtc_builder(4096, 32).build().unwrap();
    let (server, client) = pair(&engine, &engine, &ep("rtc"));
    assert_eq!(client.peer(), "mem://t-rtc");
    ping_pong(&client, &server, 2000, false);
    assert!(matches!(engine.try_event(), Some(Event::Connected { .. })));
}

#[test]
fn ping_pong_one_dedicated_poller_one_app_thread() {
    let _g = serial();
    let engine = poller_builder(&[cores()[0]], 4096, 32).build().unwrap();
    let (server, client) = pair(&engine, &engine, &ep("dedicated"));
    ping_pong(&client, &server, 2000, false);
}

#[test]
fn ping_pong_across_two_engines_with_large_messages() {
    let _g = serial();
    let a = rtc_builder(4096, 16)
        .max_message_size(1 << 20)
        .large_buffers(2)
        .build()
        .unwrap();
    let b = rtc_builder(4096, 16)
        .max_message_size(256 << 10)
        .large_buffers(2)
        .build()
        .unwrap();
    let (server, client) = pair(&a, &b, &ep("two-engines"));
    assert_eq!(client.max_message_size(), 256 << 10, "the smaller limit");
    assert_eq!(server.max_message_size(), 256 << 10);
    ping_pong(&client, &server, 200, true);
}

#[test]
fn flood_into_a_slow_receiver_blocks_the_sender_and_loses_nothing() {
    let _g = serial();
    let engine = rtc_builder(4096, 64).depth(16).build().unwrap();
    let (server, client) = pair(&engine, &engine, &ep("flood"));
    const N: u32 = 20_000;
    let (mut sent, mut got, mut blocked) = (0u32, 0u32, 0u64);
    let deadline = Instant::now() + WAIT * 3;
    while got < N {
        assert!(Instant::now() < deadline, "flood stuck at {got}/{N}");
        // Send until back-pressure...
        while sent < N && try_send(&client, sent, [8, 64, 2000][sent as usize % 3]) {
            sent += 1;
        }
        client.flush().expect("flush");
        if sent < N {
            blocked += 1;
        }
        // ... then receive a few: the receiver is slower than the sender.
        for _ in 0..3 {
            engine.poll();
            match server.try_recv().expect("recv") {
                Some(m) => {
                    verify(&m, got, [8, 64, 2000][got as usize % 3]);
                    got += 1;
                }
                None => break,
            }
        }
    }
    assert_eq!(sent, N);
    assert!(blocked > 100, "the sender saw back-pressure ({blocked})");
    let s = client.stats();
    assert_eq!(s.tx_msgs, u64::from(N));
    assert!(server.try_recv().unwrap().is_none(), "nothing extra");
}

fn wait_event(engine: &Engine, what: &str, mut want: impl FnMut(&Event) -> bool) -> Event {
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no {what} event");
        match engine.try_event() {
            Some(e) if want(&e) => return e,
            Some(_) => {}
            None => {
                engine.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

#[test]
fn a_killed_peer_is_a_disconnect_after_what_it_sent() {
    let _g = serial();
    let engine = rtc_builder(4096, 16).build().unwrap();
    let name = ep("kill");
    let (server, client) = pair(&engine, &engine, &name);
    send_msg(&client, 7, 100);
    engine.poll();
    Faults::latest(&name).expect("faults").kill(End::Connecting);
    recv_msg(&server, 7, 100);
    assert!(matches!(
        server.recv_timeout(WAIT),
        Err(Error::Disconnected)
    ));
    let id = server.id();
    wait_event(
        &engine,
        "Disconnected",
        |e| matches!(e, Event::Disconnected { conn } if *conn == id),
    );
}

/// A peer that dies while this end waits on it for something (as an RDMA READ of a large
/// message waits on the peer that lent it): this end delivers what the peer sent, then the
/// disconnect, though its fabric never settles and reports the close on every pass after the
/// first (Soft-iWARP's connections do; a drain that waited for them to settle never ended).
#[test]
fn a_peer_killed_while_this_end_waits_on_it_is_a_disconnect_after_what_it_sent() {
    let _g = serial();
    for (mode, engine) in [
        ("rtc", rtc_builder(4096, 16).build().unwrap()),
        (
            "poller",
            poller_builder(&[cores()[0]], 4096, 16).build().unwrap(),
        ),
    ] {
        let name = ep(&format!("unserved-{mode}"));
        let (server, client) = pair(&engine, &engine, &name);
        let faults = Faults::latest(&name).expect("faults");
        faults.wait_on_peer(End::Accepted);
        send_msg(&client, 1, 8);
        send_msg(&client, 2, 3000);
        client.flush().expect("flush");
        // Both on the wire (a dedicated poller posts them in its own time) before the kill.
        let deadline = Instant::now() + WAIT;
        while client.stats().tx_msgs < 2 {
            assert!(
                Instant::now() < deadline,
                "{mode}: the sends were not posted"
            );
            engine.poll();
            std::thread::sleep(Duration::from_millis(1));
        }
        faults.kill(End::Connecting);
        recv_msg(&server, 1, 8);
        recv_msg(&server, 2, 3000);
        match server.recv_timeout(WAIT) {
            Err(Error::Disconnected) => {}
            other => panic!("{mode}: expected the disconnect, got {other:?}"),
        }
        let id = server.id();
        wait_event(
            &engine,
            "Disconnected",
            |e| matches!(e, Event::Disconnected { conn } if *conn == id),
        );
    }
}

#[test]
fn a_closed_peer_is_a_disconnect_with_a_dedicated_poller() {
    let _g = serial();
    let engine = poller_builder(&[cores()[0]], 4096, 16).build().unwrap();
    let (server, client) = pair(&engine, &engine, &ep("close"));
    send_msg(&client, 1, 3000);
    drop(client);
    recv_msg(&server, 1, 3000);
    assert!(matches!(
        server.recv_timeout(WAIT),
        Err(Error::Disconnected)
    ));
}

#[test]
fn a_stalled_peer_is_unresponsive_after_the_liveness_timeout() {
    let _g = serial();
    let liveness = Duration::from_millis(200);
    let engine = rtc_builder(4096, 16)
        .liveness_timeout(liveness)
        .build()
        .unwrap();
    let name = ep("stall");
    let (server, client) = pair(&engine, &engine, &name);
    send_msg(&client, 1, 10);
    recv_msg(&server, 1, 10);
    // Alive for a few timeouts while both ends serve.
    let until = Instant::now() + liveness * 3;
    while Instant::now() < until {
        engine.poll();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(server.try_recv().unwrap().is_none() && server.is_open());
    let faults = Faults::latest(&name).expect("faults");
    faults.stall(End::Connecting);
    let stalled = Instant::now();
    let id = server.id();
    let ev = wait_event(
        &engine,
        "PeerUnresponsive",
        |e| matches!(e, Event::PeerUnresponsive { conn, .. } if *conn == id),
    );
    let Event::PeerUnresponsive { silent_for, .. } = ev else {
        unreachable!()
    };
    assert!(silent_for >= liveness, "{silent_for:?}");
    assert!(stalled.elapsed() >= liveness);
    assert!(matches!(
        server.try_recv(),
        Err(Error::Fabric(FabricError::PeerUnresponsive { .. }))
    ));
    // Resumed, the stalled end finds its connection gone, not silently resumed, and why.
    faults.resume(End::Connecting);
    let err = client.recv_timeout(WAIT).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Fabric(FabricError::PeerAborted(AbortReason::Unresponsive))
        ),
        "{err:?}"
    );
}

#[test]
fn a_corrupt_record_fails_the_connection_with_a_protocol_error() {
    let _g = serial();
    let engine = rtc_builder(4096, 16).build().unwrap();
    let name = ep("corrupt");
    let (server, client) = pair(&engine, &engine, &name);
    send_msg(&client, 1, 10);
    recv_msg(&server, 1, 10);
    Faults::latest(&name)
        .expect("faults")
        .corrupt_next(End::Connecting);
    send_msg(&client, 2, 10);
    match server.recv_timeout(WAIT) {
        Err(Error::Fabric(FabricError::Protocol(_))) => {}
        Err(e) => panic!("expected a protocol error, got {e}"),
        Ok(m) => panic!("a corrupt record was delivered ({} bytes)", m.len()),
    }
    let id = server.id();
    wait_event(
        &engine,
        "Error",
        |e| matches!(e, Event::Error { conn: Some(c), error: Error::Fabric(FabricError::Protocol(_)) } if *c == id),
    );
    // The connecting end sees the close that follows, and why.
    let err = client.recv_timeout(WAIT).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Fabric(FabricError::PeerAborted(AbortReason::Protocol))
        ),
        "{err:?}"
    );
    let cid = client.id();
    wait_event(
        &engine,
        "Error (peer aborted)",
        |e| matches!(e, Event::Error { conn: Some(c), error: Error::Fabric(FabricError::PeerAborted(AbortReason::Protocol)) } if *c == cid),
    );
}

#[test]
fn setup_errors_are_typed() {
    let _g = serial();
    let engine = rtc_builder(4096, 16).build().unwrap();
    assert!(matches!(
        engine.connect_timeout(&ep("nobody"), std::time::Duration::from_millis(50)),
        Err(Error::NoListener { .. })
    ));
    let l = engine.listen(&ep("taken")).unwrap();
    assert!(matches!(
        engine.listen(&ep("taken")),
        Err(Error::Listen { .. })
    ));
    let other = rtc_builder(8192, 16).build().unwrap();
    match other.connect(&ep("taken")) {
        Err(Error::Connect { source, .. }) => {
            assert!(
                source.to_string().contains("buffer sizes differ"),
                "{source}"
            )
        }
        r => panic!("expected a mismatch, got {r:?}"),
    }
    drop(l);
    // The name is free again.
    let _l = engine.listen(&ep("taken")).unwrap();
}
