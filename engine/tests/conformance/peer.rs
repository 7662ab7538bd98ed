//! The peer goes away: it closes (what it sent first is delivered, then `Disconnected`), its
//! process is SIGKILLed (the survivor sees the disconnect, as an error and an event, within the
//! scheme's bound) or SIGSTOPped (alive but silent: reported within the liveness timeout plus
//! 20 % as `PeerUnresponsive`, and after SIGCONT the stopped side finds its connection failed).
//! The survivor's other connections keep working.

use std::process::Stdio;
use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, Error, Event, FabricError};
use spinwire_testkit::data::{fill, verify};
use spinwire_testkit::engine::*;
use spinwire_testkit::process::{lines, wait_for_line, wait_success, KillOnDrop};
use spinwire_testkit::{cores, role, WAIT};

use super::Scheme;

/// How long a late survivor waits before it calls in: past any fabric's close grace, so that
/// its engine has seen the close (a disconnect, a hang-up) before it takes anything.
const LATE: Duration = Duration::from_millis(500);

/// The closer sends 12 messages and drops its connection; the survivor gets all of them, then
/// `Disconnected`. `late`: the survivor calls in only after [`LATE`].
fn close_delivers_queued(
    s: &'static Scheme,
    se: &Engine,
    ce: &Engine,
    client_closes: bool,
    late: bool,
) {
    let (srv, c) = pair(se, ce, &(s.endpoint)("close"));
    let (closer, survivor) = if client_closes { (c, srv) } else { (srv, c) };
    // Fewer than the window: the survivor takes nothing until the close.
    for seq in 0..12 {
        let mut b = closer.alloc_timeout(WAIT).unwrap();
        b.set_len(100).unwrap();
        fill(&mut b, seq);
        closer.send_timeout(b, WAIT).unwrap();
    }
    drop(closer); // queued sends are posted before the close
    if late {
        std::thread::sleep(LATE);
    }
    for seq in 0..12 {
        recv_msg(&survivor, seq, 100);
    }
    let err = survivor.recv_timeout(WAIT).unwrap_err();
    assert!(matches!(err, Error::Disconnected), "{err}");
    assert!(!survivor.is_open());
    assert!(
        matches!(survivor.alloc(), Err(Error::Disconnected))
            || survivor.send(survivor.alloc().unwrap()).is_err(),
        "sends fail after the close"
    );
}

pub fn close_delivers_queued_then_disconnects(s: &'static Scheme) {
    let rtc = || s.build(s.rtc());
    for client_closes in [true, false] {
        close_delivers_queued(s, &rtc(), &rtc(), client_closes, false);
        // The survivor's engine has seen the close before it is polled at all: what arrived
        // before the close is delivered all the same.
        close_delivers_queued(s, &rtc(), &rtc(), client_closes, true);
        let ded = s.build(s.poller(cores()[0]));
        close_delivers_queued(s, &rtc(), &ded, client_closes, false);
        // A dedicated poller has delivered everything and seen the close before the survivor
        // calls: its receives take the queued messages first (their fast case, a delivered
        // message), then report the close.
        let ded = s.build(s.poller(cores()[0]));
        close_delivers_queued(s, &rtc(), &ded, client_closes, true);
    }
}

pub fn close_surfaces_after_pending_in_poll(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("close-poll"));
    for seq in 0..5 {
        let mut b = c.alloc_timeout(WAIT).expect("alloc");
        b.set_len(8 + seq as usize).unwrap();
        fill(&mut b, seq);
        c.send_timeout(b, WAIT).expect("send");
    }
    drop(c);
    let mut next = 0u32;
    let deadline = Instant::now() + WAIT;
    let err = loop {
        match srv.poll(
            |m| {
                verify(m, next, 8 + next as usize);
                next += 1;
            },
            2,
        ) {
            Ok(_) => {}
            Err(e) => break e,
        }
        assert!(Instant::now() < deadline, "disconnect not reported");
        std::thread::yield_now();
    };
    assert_eq!(next, 5, "messages sent before the close");
    assert!(matches!(err, Error::Disconnected), "{err:?}");
}

/// A second, unrelated connection of `engine` to an in-process peer that echoes until closed
/// (on its own thread): `(keeper, echo thread)`.
fn keeper(
    s: &'static Scheme,
    engine: &Engine,
    liveness: Option<Duration>,
) -> (Connection, std::thread::JoinHandle<u64>) {
    let b = s.rtc();
    let other = s.build(match liveness {
        Some(t) => b.liveness_timeout(t),
        None => b,
    });
    let (keeper, peer) = pair(engine, &other, &(s.endpoint)("keeper"));
    let echo = std::thread::spawn(move || {
        let n = echo_until_closed(&peer);
        drop(peer);
        drop(other);
        n
    });
    (keeper, echo)
}

/// The keeper carries 200 verified round trips; closed, its echo counted them.
fn keeper_works(keeper: Connection, echo: std::thread::JoinHandle<u64>) {
    for seq in 0..200 {
        send_msg(&keeper, seq, 1 + seq as usize);
        recv_msg(&keeper, seq, 1 + seq as usize);
    }
    drop(keeper);
    assert_eq!(echo.join().unwrap(), 200);
}

fn survivor_sees_sigkill(s: &'static Scheme, engine: Engine) {
    let ep = (s.endpoint)("victim");
    let listener = engine.listen(&ep).unwrap();
    let mut child = KillOnDrop(
        role::command(&s.role("role_connect_and_wait"))
            .env(ENDPOINT_ENV, &ep)
            .spawn()
            .expect("spawn child"),
    );
    let victim = listener
        .accept_timeout(Duration::from_secs(30))
        .expect("child connects");
    let (keeper, echo) = keeper(s, &engine, None);

    // The child proves it is alive, then we kill it.
    recv_msg(&victim, 1, 100);
    while engine.try_event().is_some() {}
    child.kill().expect("SIGKILL");
    let killed = Instant::now();
    let err = victim.recv_timeout(Duration::from_secs(10)).unwrap_err();
    let seen = killed.elapsed();
    assert!(matches!(err, Error::Disconnected), "{err}");
    assert!(
        seen < s.death_bound,
        "disconnect seen after {seen:?} (bound {:?})",
        s.death_bound
    );
    // Sends fail too.
    let b = victim.alloc();
    assert!(matches!(b, Err(Error::Disconnected)) || victim.send(b.unwrap()).is_err());
    // And an event says so.
    let deadline = Instant::now() + s.death_bound;
    let mut got_event = false;
    while Instant::now() < deadline && !got_event {
        match engine.try_event() {
            Some(Event::Disconnected { conn }) if conn == victim.id() => got_event = true,
            Some(_) => {}
            None => {
                engine.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    assert!(got_event, "a Disconnected event within {:?}", s.death_bound);
    let _ = child.wait();
    keeper_works(keeper, echo);
}

pub fn sigkill_run_to_completion(s: &'static Scheme) {
    survivor_sees_sigkill(s, s.build(s.rtc()));
}

pub fn sigkill_dedicated_poller(s: &'static Scheme) {
    survivor_sees_sigkill(s, s.build(s.poller(cores()[0])));
}

/// Child role: connect to the endpoint in `ENDPOINT_ENV`, send one message, then wait to be
/// killed (bounded).
pub fn role_connect_and_wait(s: &'static Scheme) {
    let ep = role::env(ENDPOINT_ENV);
    let engine = s.build(s.rtc());
    let conn = engine.connect_timeout(&ep, WAIT).expect("child connect");
    send_msg(&conn, 1, 100);
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        engine.poll();
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends `sig` to our child `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

fn survivor_reports_sigstop(s: &'static Scheme, engine: Engine) {
    let ep = (s.endpoint)("stopped");
    let listener = engine.listen(&ep).unwrap();
    let mut child = KillOnDrop(
        role::command(&s.role("role_connect_then_report"))
            .env(ENDPOINT_ENV, &ep)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child"),
    );
    let out = lines(child.stdout.take().expect("piped stdout"));
    let victim = listener
        .accept_timeout(Duration::from_secs(30))
        .expect("child connects");
    let (keeper, echo) = keeper(s, &engine, Some(s.liveness));

    // The child proves it is alive; past several heartbeat intervals the connection is still
    // up (the heartbeats flow); then we stop the child (alive, silent).
    recv_msg(&victim, 1, 100);
    let until = Instant::now() + s.liveness * 2;
    while Instant::now() < until {
        engine.poll();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(victim.try_recv().unwrap().is_none(), "connection still up");
    while engine.try_event().is_some() {}
    signal(child.id(), libc::SIGSTOP);
    let stopped = Instant::now();

    let deadline = stopped + Duration::from_secs(5);
    let (seen, silent) = loop {
        assert!(
            Instant::now() < deadline,
            "no PeerUnresponsive event within 5 s"
        );
        match engine.try_event() {
            Some(Event::PeerUnresponsive { conn, silent_for }) if conn == victim.id() => {
                break (stopped.elapsed(), silent_for);
            }
            Some(e) => panic!("unexpected event {e:?}"),
            None => {
                engine.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    let limit = s.liveness + s.liveness / 5;
    assert!(
        seen <= limit,
        "reported {seen:?} after SIGSTOP (limit {limit:?})"
    );
    assert!(
        silent >= s.liveness,
        "silent_for {silent:?} below the timeout"
    );
    // The connection failed with the typed reason.
    let err = victim.recv_timeout(Duration::from_secs(1)).unwrap_err();
    assert!(
        matches!(err, Error::Fabric(FabricError::PeerUnresponsive { .. })),
        "{err}"
    );
    super::failure::assert_every_call_fails(&victim, |e| {
        matches!(e, Error::Fabric(FabricError::PeerUnresponsive { .. }))
    });

    // The other connection is unaffected.
    keeper_works(keeper, echo);

    // Resumed, the stopped side sees its connection failed (and says so).
    signal(child.id(), libc::SIGCONT);
    let line = wait_for_line(&out, "CHILD-DOWN", WAIT, "stopped child after SIGCONT");
    assert!(line.contains("received 0"), "{line}");
    wait_success(&mut child, WAIT);
    drop(victim);
    // Nothing else was reported for the victim (e.g. a second, Disconnected event).
    while let Some(e) = engine.try_event() {
        assert!(
            !matches!(&e, Event::Disconnected { .. } | Event::Error { .. }),
            "unexpected event {e:?}"
        );
    }
}

pub fn sigstop_run_to_completion(s: &'static Scheme) {
    survivor_reports_sigstop(s, s.build(s.rtc().liveness_timeout(s.liveness)));
}

pub fn sigstop_dedicated_poller(s: &'static Scheme) {
    survivor_reports_sigstop(
        s,
        s.build(s.poller(cores()[0]).liveness_timeout(s.liveness)),
    );
}

/// Child role: connect to the endpoint in `ENDPOINT_ENV`, send one message, then poll the
/// connection until it goes down (bounded); print `CHILD-DOWN` with the error and the number of
/// messages received, and exit successfully.
pub fn role_connect_then_report(s: &'static Scheme) {
    let ep = role::env(ENDPOINT_ENV);
    let engine = s.build(s.rtc().liveness_timeout(s.liveness));
    let conn = engine.connect_timeout(&ep, WAIT).expect("child connect");
    send_msg(&conn, 1, 100);
    let end = Instant::now() + Duration::from_secs(30);
    let mut received = 0u64;
    while Instant::now() < end {
        match conn.try_recv() {
            Ok(Some(_)) => received += 1,
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => {
                println!("CHILD-DOWN {e} (received {received})");
                return;
            }
        }
    }
    panic!("connection still up after 30 s");
}
