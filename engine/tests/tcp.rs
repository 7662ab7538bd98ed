//! The `tcp://` fabric on loopback: ping-pong of every size over IPv6, hostile peers speaking
//! raw TCP, connect errors, and the cross-host roles of `scripts/ci/tcp-netns.sh`. Traffic goes
//! only to loopback (the roles: to the namespaces' veth pair). What every scheme does (every
//! size over IPv4 in one and two processes, back-pressure, a killed or stopped peer, reconnect)
//! is the conformance suite's (`conformance/`, `tcp::<case>`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, Error, Event, FabricError, SetupError};
use spinwire_testkit::data::verify;
use spinwire_testkit::engine::*;
use spinwire_testkit::{cores, role, serial, WAIT};

const BUF: usize = 4096;

/// A loopback port that was free a moment ago (bound, read, released).
fn free_port(host: &str) -> Option<u16> {
    let l = TcpListener::bind((host, 0)).ok()?;
    l.local_addr().ok().map(|a| a.port())
}

fn ep4() -> String {
    format!("tcp://127.0.0.1:{}", free_port("127.0.0.1").expect("port"))
}

/// One round trip per size of a pool buffer, 1 ..= `BUF`, both directions verified (larger
/// messages, through large slots, are `tcp_large.rs`'s).
fn every_size(client: &Connection, server: Option<&Connection>) {
    assert!(client.max_message_size() >= BUF);
    for len in 1..=BUF {
        let seq = len as u32;
        send_msg(client, seq, len);
        if let Some(s) = server {
            let m = s.recv_timeout(WAIT).expect("server recv");
            verify(&m, seq, len);
            let mut b = s.alloc_timeout(WAIT).expect("alloc");
            b.copy_from(&m).unwrap();
            drop(m);
            s.send_timeout(b, WAIT).expect("echo");
            s.flush().expect("flush");
        }
        recv_msg(client, seq, len);
    }
}

#[test]
fn loopback_every_size_dedicated_poller_ipv6() {
    let _g = serial();
    // IPv6 loopback where the host has it, else IPv4.
    let ep = match free_port("::1") {
        Some(p) => format!("tcp://[::1]:{p}"),
        None => ep4(),
    };
    let se = poller_engine(cores()[0], BUF, 16);
    let ce = rtc_engine(BUF, 16);
    let (s, c) = pair(&se, &ce, &ep);
    let echo = std::thread::spawn(move || echo_until_closed(&s));
    every_size(&c, None);
    drop(c);
    assert_eq!(echo.join().unwrap(), BUF as u64);
}

/// A hello as a spinwire connector sends it (see `fabric/tcp/setup.rs`).
fn hello(buffer_size: u32, depth: u32) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..4].copy_from_slice(b"SPWT");
    b[4] = spinwire::fabric::tcp::WIRE_VERSION;
    // The byte window (version 2): 64 KiB.
    b[24..28].copy_from_slice(&(64u32 << 10).to_le_bytes());
    b[8..12].copy_from_slice(&buffer_size.to_le_bytes());
    b[12..16].copy_from_slice(&depth.to_le_bytes());
    b
}

/// Connects a raw socket, completes the handshake and accepts the engine's side.
fn raw_peer(engine: &Engine, listener: &spinwire::Listener, addr: &str) -> (TcpStream, Connection) {
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    raw.write_all(&hello(BUF as u32, 16)).unwrap();
    let deadline = Instant::now() + WAIT;
    let conn = loop {
        engine.poll();
        if let Some(c) = listener.try_accept().unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline, "accept");
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut reply = [0u8; 32];
    raw.read_exact(&mut reply).unwrap();
    assert_eq!(&reply[0..4], b"SPWT");
    assert_eq!(reply[5], 0, "accepted");
    (raw, conn)
}

/// Waits for `conn` to fail; returns the error.
fn wait_failed(conn: &Connection) -> Error {
    match conn.recv_timeout(WAIT) {
        Ok(_) => panic!("a message from a hostile peer"),
        Err(e) => e,
    }
}

/// A record of length `len` (header included) and type `ty`, `payload` after the header, zero
/// padding to 8 bytes.
fn record(len: u32, ty: u8, payload: &[u8]) -> Vec<u8> {
    let mut r = len.to_le_bytes().to_vec();
    r.extend_from_slice(&[ty, 0, 0, 0]);
    r.extend_from_slice(payload);
    r.resize(r.len().next_multiple_of(8), 0);
    r
}

/// Reads the engine's stream on `raw` to its end and checks that its last record is a CLOSE
/// blaming the raw peer for a protocol violation (type 9, reason 3): the violator learns why.
fn assert_blamed(raw: &mut TcpStream) {
    let mut bytes = Vec::new();
    raw.read_to_end(&mut bytes)
        .expect("the engine's stream up to its end");
    let mut at = 0;
    let mut last = None;
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        assert!(len >= 8, "a record length below its header: {bytes:?}");
        last = Some(&bytes[at..(at + len).min(bytes.len())]);
        at += len.div_ceil(8) * 8;
    }
    assert_eq!(at, bytes.len(), "the stream ends at a record boundary");
    let last = last.expect("a record before the end of stream");
    assert_eq!(last[4], 9, "the last record is a CLOSE: {last:?}");
    assert_eq!(&last[8..12], &3u32.to_le_bytes(), "reason: protocol");
}

#[test]
fn hostile_peers_fail_only_their_connection() {
    let _g = serial();
    let engine = rtc_engine(BUF, 16);
    let port = free_port("127.0.0.1").unwrap();
    let ep = format!("tcp://127.0.0.1:{port}");
    let addr = format!("127.0.0.1:{port}");
    let listener = engine.listen(&ep).unwrap();
    // A healthy connection through the same listener.
    let peer_engine = rtc_engine(BUF, 16);
    let good_c = peer_engine.connect(&ep).unwrap();
    let good_s = listener.accept_timeout(WAIT).unwrap();

    let protocol = |e: Error| {
        assert!(
            matches!(e, Error::Fabric(FabricError::Protocol(_))),
            "expected a protocol error, got {e:?}"
        );
    };

    // Garbage records after a good handshake.
    let (mut raw, conn) = raw_peer(&engine, &listener, &addr);
    raw.write_all(&[0xAB; 64]).unwrap();
    protocol(wait_failed(&conn));
    assert_blamed(&mut raw);
    drop(raw);

    // A huge DATA length.
    let (mut raw, conn) = raw_peer(&engine, &listener, &addr);
    let mut h = [0u8; 8];
    h[0..4].copy_from_slice(&(u32::MAX - 8).to_le_bytes());
    h[4] = 1;
    raw.write_all(&h).unwrap();
    protocol(wait_failed(&conn));
    assert_blamed(&mut raw);
    drop(raw);

    // A zero length (would stall a stream reader forever).
    let (mut raw, conn) = raw_peer(&engine, &listener, &addr);
    raw.write_all(&[0, 0, 0, 0, 1, 0, 0, 0]).unwrap();
    protocol(wait_failed(&conn));
    assert_blamed(&mut raw);
    drop(raw);

    // A truncated header, then the end of stream.
    let (mut raw, conn) = raw_peer(&engine, &listener, &addr);
    raw.write_all(&[16, 0, 0]).unwrap();
    raw.shutdown(std::net::Shutdown::Write).unwrap();
    protocol(wait_failed(&conn));
    drop(raw);

    // Records whose header looks like the common ones (the receive side reads a small DATA or
    // CREDIT record from its header word): each goes to the checked path and fails there.
    let hostile: [(&str, Vec<u8>); 4] = [
        (
            "a credit for messages never sent",
            record(16, 4, &5u64.to_le_bytes()),
        ),
        ("a small DATA with aux set", {
            let mut r = record(13, 1, b"hello");
            r[6] = 1;
            r
        }),
        ("a small DATA with flags set", {
            let mut r = record(16, 1, &[7; 8]);
            r[5] = 2;
            r
        }),
        ("a CREDIT of 16 bytes", record(24, 4, &[1; 16])),
    ];
    for (what, rec) in hostile {
        let (mut raw, conn) = raw_peer(&engine, &listener, &addr);
        raw.write_all(&rec).unwrap();
        let e = wait_failed(&conn);
        assert!(
            matches!(e, Error::Fabric(FabricError::Protocol(_))),
            "{what}: expected a protocol error, got {e:?}"
        );
        assert_blamed(&mut raw);
        drop(raw);
    }

    // A clean close after one valid message: delivered, then Disconnected.
    let (mut raw, conn) = raw_peer(&engine, &listener, &addr);
    let mut rec = [0u8; 16];
    rec[0] = 13;
    rec[4] = 1;
    rec[8..13].copy_from_slice(b"hello");
    raw.write_all(&rec).unwrap();
    drop(raw);
    assert_eq!(&*conn.recv_timeout(WAIT).unwrap(), b"hello");
    assert!(matches!(wait_failed(&conn), Error::Disconnected));

    // A garbage hello fails the accept only, with a typed error event.
    while engine.try_event().is_some() {}
    let mut raw = TcpStream::connect(&addr).unwrap();
    raw.write_all(&[0x55; 32]).unwrap();
    let deadline = Instant::now() + WAIT;
    let err = loop {
        engine.poll();
        if let Some(Event::Error { conn: None, error }) = engine.try_event() {
            break error;
        }
        assert!(Instant::now() < deadline, "no error event for a bad hello");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert!(
        matches!(err, Error::Setup(SetupError::Tcp(_))),
        "typed setup error: {err:?}"
    );
    drop(raw);

    // A client that never sends its hello costs one entry until the deadline, not the loop.
    let _silent = TcpStream::connect(&addr).unwrap();

    // The healthy connection is unaffected.
    for seq in 0..100u32 {
        send_msg(&good_c, seq, 1 + seq as usize * 30);
        recv_msg(&good_s, seq, 1 + seq as usize * 30);
        send_msg(&good_s, seq, 1 + seq as usize);
        recv_msg(&good_c, seq, 1 + seq as usize);
    }
}

#[test]
fn connect_errors_are_typed_and_bounded() {
    let _g = serial();
    let engine = rtc_engine(BUF, 16);
    let limit = Duration::from_millis(500);

    // A closed port: refused until the deadline (the connect waits for a listener), the last
    // refusal as the source.
    let port = free_port("127.0.0.1").unwrap();
    let t = Instant::now();
    let err = engine
        .connect_timeout(&format!("tcp://127.0.0.1:{port}"), limit)
        .unwrap_err();
    assert!(t.elapsed() < limit + Duration::from_millis(500));
    let Error::NoListener { source, .. } = &err else {
        panic!("expected NoListener, got {err:?}");
    };
    match source.downcast_ref::<Error>().expect("the refusal") {
        Error::Connect { source, .. } => {
            let e = source
                .downcast_ref::<spinwire::fabric::tcp::TcpSetupError>()
                .expect("a TcpSetupError");
            assert!(
                matches!(e, spinwire::fabric::tcp::TcpSetupError::Connect { .. }),
                "{e:?}"
            );
        }
        e => panic!("expected Connect, got {e:?}"),
    }

    // An address no route leads to (the limited broadcast address: refused locally, nothing
    // is sent).
    let t = Instant::now();
    let err = engine
        .connect_timeout("tcp://255.255.255.255:9", limit)
        .unwrap_err();
    assert!(t.elapsed() < limit + Duration::from_millis(500));
    assert!(
        matches!(err, Error::Connect { .. } | Error::Timeout),
        "{err:?}"
    );

    // A listener that never answers the hello: the timeout.
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = mute.local_addr().unwrap().port();
    let t = Instant::now();
    let err = engine
        .connect_timeout(&format!("tcp://127.0.0.1:{port}"), limit)
        .unwrap_err();
    let took = t.elapsed();
    assert!(matches!(err, Error::Timeout), "{err:?}");
    assert!(
        took >= limit - Duration::from_millis(50) && took < limit + Duration::from_millis(500),
        "{took:?}"
    );

    // A mismatched buffer size: refused with a typed error on both sides.
    let other = rtc_engine(BUF * 2, 16);
    let ep = ep4();
    let _l = engine.listen(&ep).unwrap();
    let h = std::thread::spawn(move || other.connect_timeout(&ep, WAIT).map(|_| ()));
    let deadline = Instant::now() + WAIT;
    while !h.is_finished() {
        engine.poll();
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    let err = h.join().unwrap().unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
}

/// Cross-host role (server side): listen on `ENDPOINT_ENV` and echo one client's every-size
/// ping-pong. Run in the first namespace by `scripts/ci/tcp-netns.sh` (through
/// `scripts/netns-two`).
#[test]
#[ignore = "cross-host role: run by scripts/ci/tcp-netns.sh"]
fn netns_server() {
    let ep = role::env(ENDPOINT_ENV);
    let engine = poller_engine(cores()[0], BUF, 16);
    let listener = engine.listen(&ep).expect("listen");
    let conn = listener
        .accept_timeout(Duration::from_secs(60))
        .expect("the client connects");
    assert_eq!(echo_until_closed(&conn), BUF as u64);
}

/// Cross-host role (client side): connect to `ENDPOINT_ENV` (retrying while the server starts)
/// and run the verified every-size ping-pong.
#[test]
#[ignore = "cross-host role: run by scripts/ci/tcp-netns.sh"]
fn netns_client() {
    let ep = role::env(ENDPOINT_ENV);
    let engine = rtc_engine(BUF, 16);
    let deadline = Instant::now() + Duration::from_secs(30);
    let conn = loop {
        match engine.connect_timeout(&ep, Duration::from_secs(2)) {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                eprintln!("connect {ep}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("connect {ep}: {e}"),
        }
    };
    let t = Instant::now();
    every_size(&conn, None);
    eprintln!(
        "netns: {BUF} verified round trips (1..={BUF} B) in {:?}",
        t.elapsed()
    );
}

/// Run-to-completion on `tcp://` posts a `send` straight to the socket only in a ping-pong: a
/// stream of plain `send`s with nothing received between still goes through the send ring, a
/// batch per post (one `sendmsg` each), not a post and a write per message; both arrive whole
/// and in order.
#[test]
fn run_to_completion_stream_is_posted_in_batches_ping_pong_one_by_one() {
    let _g = serial();
    const MSGS: u32 = 2048;
    const BATCH: usize = 32;
    let se = poller_engine(cores()[0], BUF, 256);
    let ce = rtc_builder(BUF, 256).batch(BATCH).build().expect("engine");
    let (s, c) = pair(&se, &ce, &ep4());
    let posted = |e: &Engine| {
        let p = &e.counters().pollers[0];
        (p.tx_msgs, p.tx_batches)
    };
    let (msgs0, batches0) = posted(&ce);
    for seq in 0..MSGS {
        let mut b = claim_timeout(&c, 8);
        spinwire_testkit::data::fill(&mut b, seq);
        c.send_timeout(b, WAIT).expect("send");
    }
    c.flush().expect("flush");
    for seq in 0..MSGS {
        let m = s.recv_timeout(WAIT).expect("stream recv");
        verify(&m, seq, 8);
    }
    let (msgs1, batches1) = posted(&ce);
    assert_eq!(msgs1 - msgs0, u64::from(MSGS));
    assert!(
        batches1 - batches0 <= u64::from(MSGS) / 8,
        "a stream of {MSGS} sends took {} posts",
        batches1 - batches0
    );
    // A ping-pong: every send is posted (and written) on its own, and every reply comes back.
    for seq in 0..64 {
        send_msg(&c, seq, 8);
        let m = s.recv_timeout(WAIT).expect("server recv");
        verify(&m, seq, 8);
        let mut b = s.alloc_timeout(WAIT).expect("alloc");
        b.copy_from(&m).unwrap();
        drop(m);
        s.send_timeout(b, WAIT).expect("echo");
        s.flush().expect("flush");
        recv_msg(&c, seq, 8);
    }
    let (msgs2, batches2) = posted(&ce);
    assert_eq!((msgs2 - msgs1, batches2 - batches1), (64, 64));
}
