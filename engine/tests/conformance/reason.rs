//! Every way a connection goes down reaches both sides with its reason, as the error of their
//! data calls and as an event: a clean close is `Disconnected` on the survivor (no error event,
//! nothing on the closer's side); a peer that goes silent is `PeerUnresponsive` on the side that
//! checked it, and the silent side, once it runs again, finds its calls failing with
//! `PeerAborted(Unresponsive)` and an `Event::Error` saying so (`Disconnected` where the scheme's
//! close carries no reason). A protocol violation is checked from both sides where a peer can be
//! made to commit one: `mem.rs` (fault injection), `corrupt.rs` (shm), `tcp.rs` (a raw peer).

use std::process::Stdio;
use std::time::{Duration, Instant};

use spinwire::{AbortReason, Connection, Engine, Error, Event, FabricError};
use spinwire_testkit::engine::*;
use spinwire_testkit::process::{lines, wait_for_line, wait_success, KillOnDrop};
use spinwire_testkit::{role, WAIT};

use super::failure::assert_every_call_fails;
use super::peer::signal;
use super::Scheme;

/// The next event of `engine` about connection `conn` other than `Connected`, waiting (bounded)
/// and driving the engine meanwhile; `None` if none came within `limit`.
fn next_event_for(engine: &Engine, conn: u64, limit: Duration) -> Option<Event> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match engine.try_event() {
            Some(Event::Connected { .. }) => {}
            Some(e) if event_conn(&e) == Some(conn) => return Some(e),
            Some(_) => {}
            None => {
                engine.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    None
}

fn event_conn(e: &Event) -> Option<u64> {
    match e {
        Event::Connected { conn, .. }
        | Event::Disconnected { conn }
        | Event::PeerUnresponsive { conn, .. } => Some(*conn),
        Event::Error { conn, .. } => *conn,
        _ => None,
    }
}

/// The peer closes cleanly: the survivor's calls fail with `Disconnected` (after what was sent
/// before), its engine reports `Disconnected` for it (not an error), and the closer's engine
/// reports nothing for the connection it closed itself.
fn clean_close(s: &'static Scheme, client_closes: bool) {
    let se = s.build(s.rtc());
    let ce = s.build(s.rtc());
    let (srv, c) = pair(&se, &ce, &(s.endpoint)("reason-close"));
    let ((closer, closer_engine), (survivor, survivor_engine)) = if client_closes {
        ((c, &ce), (srv, &se))
    } else {
        ((srv, &se), (c, &ce))
    };
    let closer_id = closer.id();
    for seq in 0..3 {
        send_msg(&closer, seq, 100);
    }
    drop(closer);
    for seq in 0..3 {
        recv_msg(&survivor, seq, 100);
    }
    let err = survivor.recv_timeout(WAIT).unwrap_err();
    assert!(matches!(err, Error::Disconnected), "survivor: {err:?}");
    assert_every_call_fails(&survivor, |e| matches!(e, Error::Disconnected));
    match next_event_for(survivor_engine, survivor.id(), WAIT) {
        Some(Event::Disconnected { .. }) => {}
        other => panic!("survivor's event: {other:?} (expected Disconnected)"),
    }
    // A close by the application is its own news: no event for it.
    if let Some(e) = next_event_for(closer_engine, closer_id, Duration::from_millis(200)) {
        panic!("closer's engine reported {e:?} for the connection it closed");
    }
}

/// What the silent side must see once it runs again: `PeerAborted(Unresponsive)` where the
/// scheme's close carries the reason, else `Disconnected`.
fn resumed_reason(s: &Scheme) -> fn(&Error) -> bool {
    if s.carries_abort {
        |e| {
            matches!(
                e,
                Error::Fabric(FabricError::PeerAborted(AbortReason::Unresponsive))
            )
        }
    } else {
        |e| matches!(e, Error::Disconnected)
    }
}

/// Waits (bounded) for `engine`'s `PeerUnresponsive` about `victim` and checks it came within
/// the liveness timeout plus 20 % of `stopped`, and that the victim's calls fail with it.
fn checker_sees_unresponsive(s: &Scheme, engine: &Engine, victim: &Connection, stopped: Instant) {
    let ev = next_event_for(engine, victim.id(), Duration::from_secs(5));
    let seen = stopped.elapsed();
    let Some(Event::PeerUnresponsive { silent_for, .. }) = ev else {
        panic!("checker's event: {ev:?} (expected PeerUnresponsive)");
    };
    let limit = s.liveness + s.liveness / 5;
    assert!(
        seen <= limit,
        "reported {seen:?} after the stop (limit {limit:?})"
    );
    assert!(silent_for >= s.liveness, "silent_for {silent_for:?}");
    assert_every_call_fails(victim, |e| {
        matches!(e, Error::Fabric(FabricError::PeerUnresponsive { .. }))
    });
}

/// In process: the scheme stalls the connecting end (`Scheme::stall`).
fn unresponsive_in_process(s: &'static Scheme, stall: fn(&str, bool)) {
    let ep = (s.endpoint)("reason-stall");
    let se = s.build(s.rtc().liveness_timeout(s.liveness));
    let ce = s.build(s.rtc().liveness_timeout(s.liveness));
    let (srv, c) = pair(&se, &ce, &ep);
    send_msg(&c, 1, 100);
    recv_msg(&srv, 1, 100);
    // Alive across several timeouts while both serve.
    let until = Instant::now() + s.liveness * 2;
    while Instant::now() < until {
        se.poll();
        ce.poll();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(srv.is_open() && c.is_open(), "up while both serve");
    stall(&ep, true);
    let stopped = Instant::now();
    checker_sees_unresponsive(s, &se, &srv, stopped);
    stall(&ep, false);
    let reason = resumed_reason(s);
    let err = c.recv_timeout(WAIT).unwrap_err();
    assert!(reason(&err), "resumed side: {err:?}");
    assert_every_call_fails(&c, reason);
    match next_event_for(&ce, c.id(), WAIT) {
        Some(Event::Error { error, .. }) if s.carries_abort && reason(&error) => {}
        Some(Event::Disconnected { .. }) if !s.carries_abort => {}
        other => panic!("resumed side's event: {other:?}"),
    }
}

/// Over processes: the child (role [`role_report_down_reason`]) is SIGSTOPped, then resumed.
fn unresponsive_process(s: &'static Scheme) {
    let ep = (s.endpoint)("reason-stop");
    let engine = s.build(s.rtc().liveness_timeout(s.liveness));
    let listener = engine.listen(&ep).unwrap();
    let mut child = KillOnDrop(
        role::command(&s.role("role_report_down_reason"))
            .env(ENDPOINT_ENV, &ep)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child"),
    );
    let out = lines(child.stdout.take().expect("piped stdout"));
    let victim = listener
        .accept_timeout(Duration::from_secs(30))
        .expect("child connects");
    recv_msg(&victim, 1, 100);
    let until = Instant::now() + s.liveness * 2;
    while Instant::now() < until {
        engine.poll();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(victim.is_open(), "up while the child runs");
    signal(child.id(), libc::SIGSTOP);
    let stopped = Instant::now();
    checker_sees_unresponsive(s, &engine, &victim, stopped);
    signal(child.id(), libc::SIGCONT);
    let line = wait_for_line(&out, "CHILD-DOWN", WAIT, "stopped child after SIGCONT");
    let want = if s.carries_abort {
        "PeerAborted(Unresponsive)"
    } else {
        "Disconnected"
    };
    let (error, event) = line
        .split_once(" event=")
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        error.contains(want),
        "child's calls: {line} (expected {want})"
    );
    assert!(
        event.contains(want),
        "child's event: {line} (expected {want})"
    );
    wait_success(&mut child, WAIT);
}

/// A clean close each way, then a silent peer: both sides learn the reason.
pub fn disconnect_reasons_reach_both_sides(s: &'static Scheme) {
    clean_close(s, true);
    clean_close(s, false);
    match s.stall {
        Some(stall) => unresponsive_in_process(s, stall),
        None => unresponsive_process(s),
    }
}

/// Child role: connect to the endpoint in `ENDPOINT_ENV` (liveness as the scheme's), send one
/// message, take messages until the connection goes down (bounded), then wait for the engine's
/// event about it; print `CHILD-DOWN error=<error> event=<event>` (both `Debug`) and exit.
pub fn role_report_down_reason(s: &'static Scheme) {
    let ep = role::env(ENDPOINT_ENV);
    let engine = s.build(s.rtc().liveness_timeout(s.liveness));
    let conn = engine.connect_timeout(&ep, WAIT).expect("child connect");
    send_msg(&conn, 1, 100);
    let end = Instant::now() + Duration::from_secs(30);
    let error = loop {
        assert!(Instant::now() < end, "connection still up after 30 s");
        match conn.try_recv() {
            Ok(Some(_)) => {}
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => break e,
        }
    };
    let event = next_event_for(&engine, conn.id(), WAIT);
    println!("CHILD-DOWN error={error:?} event={event:?}");
}
