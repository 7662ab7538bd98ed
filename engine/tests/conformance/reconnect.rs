//! Opt-in reconnect ([`Reconnecting`]): a server process SIGKILLed and restarted while a client
//! with a policy is connected; the client reports exactly the messages whose delivery was not
//! confirmed, reconnects within the policy's interval once the server listens again, and
//! messages flow (verified) on the new connection. Also: received messages are delivered before
//! a loss is reported, and a policy's `max_attempts` ends in `GaveUp`.

use std::process::Stdio;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use spinwire::{Error, ReconnectEvent, ReconnectPolicy, Reconnecting};
use spinwire_testkit::data::verify;
use spinwire_testkit::engine::*;
use spinwire_testkit::process::{lines, wait_for_line, wait_success, KillOnDrop};
use spinwire_testkit::{role, WAIT};

use super::Scheme;

/// Messages the first server receives (and so confirms) before it stops receiving.
const CONFIRMED: u32 = 12;
/// Messages sent after the first server stopped receiving: never taken by its poller, so never
/// confirmed. At least half the depth, so that the client's poller reads the credits of the
/// confirmed ones (shm reads credits once half the window is in flight) and exactly these stay
/// in flight.
const HELD: u32 = 10;
/// Verified round trips on the new connection.
const AFTER: u32 = 50;

/// Scheduling slack on top of the policy's bound: the connect handshake itself, the pipe from
/// the child's "listening" line to this process and a loaded 2-core machine (other test
/// binaries and builds run alongside).
const SLACK: Duration = Duration::from_millis(500);

fn policy() -> ReconnectPolicy {
    ReconnectPolicy::new()
        .interval(Duration::from_millis(50))
        .jitter(0.2)
        .backoff(2.0)
        .max_interval(Duration::from_millis(400))
        .connect_timeout(Duration::from_secs(2))
}

fn spawn_server(s: &'static Scheme, role_name: &str, ep: &str) -> (KillOnDrop, Receiver<String>) {
    let mut child = KillOnDrop(
        role::command(&s.role(role_name))
            .env(ENDPOINT_ENV, ep)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn server"),
    );
    let out = lines(child.stdout.take().expect("piped stdout"));
    wait_for_line(&out, "listening", Duration::from_secs(30), role_name);
    (child, out)
}

/// Runs `maintain` until an event arrives (bounded).
fn next_event(rc: &mut Reconnecting, limit: Duration) -> ReconnectEvent {
    let deadline = Instant::now() + limit;
    loop {
        rc.maintain();
        if let Some(e) = rc.try_event() {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "no reconnect event within {limit:?}"
        );
        rc.engine().poll();
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn exact_unconfirmed(s: &'static Scheme) {
    let ep = (s.endpoint)("reconnect");
    let engine = s.build(s.rtc());
    let (mut first, first_out) = spawn_server(s, "role_server_then_hold", &ep);
    let mut rc = Reconnecting::connect(&engine, &ep, policy()).expect("connect");
    let first_id = rc.connection().expect("connected").id();

    // Phase 1: CONFIRMED messages the server receives; it answers once it has them all.
    for seq in 0..CONFIRMED {
        send_msg(rc.connection().unwrap(), seq, 16 + seq as usize);
    }
    recv_msg(rc.connection().unwrap(), CONFIRMED, 64);
    wait_for_line(&first_out, "holding", WAIT, "first server");

    // Phase 2: the server no longer runs its engine's data path, so nothing more is taken.
    for seq in 0..HELD {
        send_msg(rc.connection().unwrap(), 1000 + seq, 100);
    }
    let deadline = Instant::now() + WAIT;
    while rc.connection().unwrap().stats().in_flight != u64::from(HELD) {
        assert!(
            Instant::now() < deadline,
            "in flight {} != {HELD}",
            rc.connection().unwrap().stats().in_flight
        );
        engine.poll();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(rc.maintain(), "still connected before the kill");
    assert!(rc.try_event().is_none());

    first.kill().expect("SIGKILL the server");
    let _ = first.wait();
    match next_event(&mut rc, Duration::from_secs(5)) {
        ReconnectEvent::Lost {
            conn,
            unconfirmed,
            error,
        } => {
            assert_eq!(conn, first_id);
            assert!(matches!(error, Error::Disconnected), "{error}");
            // Exact: the HELD messages the server never took; every CONFIRMED one came back.
            assert_eq!(unconfirmed, u64::from(HELD));
        }
        e => panic!("expected Lost, got {e:?}"),
    }
    assert!(!rc.is_connected());
    assert!(matches!(rc.alloc(), Err(Error::Disconnected)));
    assert_eq!(rc.stats().unconfirmed, u64::from(HELD));

    // Let a few attempts fail while nobody listens (shm: against the stale socket file), then
    // restart the server on the same endpoint.
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        assert!(!rc.maintain(), "nobody listens");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(rc.try_event().is_none(), "no event while attempts fail");
    assert!(
        rc.stats().attempts >= 1,
        "attempts made while the server was down"
    );
    let (mut second, _second_out) = spawn_server(s, "role_echo_server", &ep);
    let ready = Instant::now();
    let (attempt, after) = match next_event(&mut rc, Duration::from_secs(10)) {
        ReconnectEvent::Reconnected {
            conn,
            attempt,
            after,
        } => {
            assert_ne!(conn, first_id);
            (attempt, after)
        }
        e => panic!("expected Reconnected, got {e:?}"),
    };
    let took = ready.elapsed();
    // The first attempt after the server listens succeeds; the one before it was at most one
    // (jittered, backed-off) delay earlier.
    let bound = rc.policy().delay_bound(attempt) + SLACK;
    assert!(
        took <= bound,
        "reconnected {took:?} after the server listened (attempt {attempt}); bound {bound:?}"
    );
    assert!(attempt >= 2, "attempt {attempt}: earlier ones failed");
    assert!(after >= took, "after {after:?} covers the outage");
    assert!(rc.is_connected());
    assert_eq!(rc.stats().reconnects, 1);

    // Messages flow again, verified, through the helper's own methods.
    for seq in 0..AFTER {
        let len = 12 + (seq as usize * 37) % 4000;
        let mut b = rc.alloc_timeout(WAIT).expect("alloc");
        b.set_len(len).unwrap();
        spinwire_testkit::data::fill(&mut b, seq);
        rc.send_timeout(b, WAIT).expect("send");
        rc.flush().expect("flush");
        let m = rc.recv_timeout(WAIT).expect("echo");
        verify(&m, seq, len);
    }
    drop(rc);
    wait_success(&mut second, WAIT * 2);
}

pub fn delivers_received_before_the_loss(s: &'static Scheme) {
    let ep = (s.endpoint)("reconnect-drain");
    let engine = s.build(s.rtc());
    let listener = engine.listen(&ep).unwrap();
    let mut rc = Reconnecting::connect(&engine, &ep, policy()).expect("connect");
    let server = listener.accept_timeout(WAIT).unwrap();
    drop(listener);
    for seq in 0..3 {
        send_msg(&server, seq, 20);
    }
    drop(server);
    // The close is seen, but three messages wait: the connection is not replaced yet.
    let deadline = Instant::now() + WAIT;
    while rc.connection().unwrap().is_open() {
        assert!(Instant::now() < deadline, "close not seen");
        engine.poll();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(!rc.maintain());
    assert!(rc.try_event().is_none(), "no loss while messages wait");
    for seq in 0..3 {
        let m = rc
            .try_recv()
            .unwrap()
            .expect("message received before the close");
        verify(&m, seq, 20);
    }
    assert!(matches!(rc.try_recv(), Err(Error::Disconnected)));
    match next_event(&mut rc, WAIT) {
        ReconnectEvent::Lost { unconfirmed, .. } => assert_eq!(unconfirmed, 0),
        e => panic!("expected Lost, got {e:?}"),
    }
}

pub fn max_attempts_ends_in_gave_up(s: &'static Scheme) {
    let ep = (s.endpoint)("reconnect-nobody");
    let engine = s.build(s.rtc());
    assert!(Reconnecting::connect(&engine, &ep, policy()).is_err());
    let mut rc = Reconnecting::start(&engine, &ep, policy().max_attempts(Some(3))).unwrap();
    assert!(!rc.is_connected());
    assert!(rc.next_attempt().is_some());
    let started = Instant::now();
    let err = rc.wait_connected(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(err, Error::Disconnected), "{err}");
    // Two delays: 50 ms and 100 ms, each +-20 %; generous slack for the loaded machine.
    assert!(started.elapsed() < Duration::from_secs(2));
    match rc.try_event() {
        Some(ReconnectEvent::GaveUp { attempts, error }) => {
            assert_eq!(attempts, 3);
            assert!(matches!(error, Some(Error::Connect { .. })), "{error:?}");
        }
        e => panic!("expected GaveUp, got {e:?}"),
    }
    assert!(rc.has_given_up());
    assert_eq!(rc.stats().attempts, 3);
    assert!(matches!(
        rc.wait_connected(Duration::from_millis(10)),
        Err(Error::Disconnected)
    ));
}

/// Child role: listen, receive `CONFIRMED` verified messages, answer, then stop running the
/// engine's data path (hold whatever else arrives) until killed (bounded).
pub fn role_server_then_hold(s: &'static Scheme) {
    let ep = role::env(ENDPOINT_ENV);
    let engine = s.build(s.rtc());
    let listener = engine.listen(&ep).expect("listen");
    println!("listening");
    let conn = listener.accept_timeout(WAIT).expect("accept");
    for seq in 0..CONFIRMED {
        recv_msg(&conn, seq, 16 + seq as usize);
    }
    send_msg(&conn, CONFIRMED, 64);
    println!("holding");
    // No engine call from here on: run-to-completion, so nothing is taken off the wire. The
    // control thread keeps the heartbeats going.
    std::thread::sleep(Duration::from_secs(30));
}

/// Child role: listen, accept one connection and echo until it closes.
pub fn role_echo_server(s: &'static Scheme) {
    let ep = role::env(ENDPOINT_ENV);
    let engine = s.build(s.rtc());
    let listener = engine.listen(&ep).expect("listen again on the same name");
    println!("listening");
    let conn = listener.accept_timeout(WAIT).expect("accept");
    assert_eq!(echo_until_closed(&conn), u64::from(AFTER));
}
