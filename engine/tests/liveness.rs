//! Liveness: a peer process stopped with SIGSTOP (alive, but silent) is reported within the
//! liveness timeout plus 20 %, as [`Event::PeerUnresponsive`] and as
//! [`FabricError::PeerUnresponsive`] from the connection; other connections are unaffected; and
//! after SIGCONT the stopped side finds its connection failed, not silently resumed.

use std::process::Stdio;
use std::time::{Duration, Instant};

use spinwire::{Engine, Error, Event, FabricError};
use spinwire_testkit::engine::*;
use spinwire_testkit::process::{lines, wait_for_line, wait_success, KillOnDrop};
use spinwire_testkit::{cores, role, serial, WAIT};

/// Short, so the test is quick; the default is 1 s.
const LIVENESS: Duration = Duration::from_millis(300);

fn stop(pid: u32, sig: libc::c_int) {
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

fn survivor_reports_stopped_peer(engine: Engine) {
    let ep = endpoint("stopped");
    let listener = engine.listen(&ep).unwrap();
    let mut child = KillOnDrop(
        role::command("child_connect_then_report")
            .env(ENDPOINT_ENV, &ep)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child"),
    );
    let out = lines(child.stdout.take().expect("piped stdout"));
    let victim = listener
        .accept_timeout(Duration::from_secs(30))
        .expect("child connects");
    // A second, unrelated connection on the same engine (in-process peer).
    let other_engine = rtc_builder(4096, 16)
        .liveness_timeout(LIVENESS)
        .build()
        .unwrap();
    let (keeper, peer) = pair(&engine, &other_engine, &endpoint("stopped-keeper"));
    let echo = std::thread::spawn(move || {
        let n = echo_until_closed(&peer);
        drop(peer);
        drop(other_engine);
        n
    });

    // The child proves it is alive, then we stop it (it stays alive, silent).
    recv_msg(&victim, 1, 100);
    // Past several heartbeat intervals: the child's heartbeats are flowing.
    std::thread::sleep(LIVENESS);
    assert!(victim.try_recv().unwrap().is_none(), "connection still up");
    while engine.try_event().is_some() {}
    stop(child.id(), libc::SIGSTOP);
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
    let limit = LIVENESS + LIVENESS / 5;
    assert!(
        seen <= limit,
        "reported {seen:?} after SIGSTOP (limit {limit:?})"
    );
    assert!(
        silent >= LIVENESS,
        "silent_for {silent:?} below the timeout"
    );
    // The connection failed with the typed reason.
    let err = victim.recv_timeout(Duration::from_secs(1)).unwrap_err();
    assert!(
        matches!(err, Error::Fabric(FabricError::PeerUnresponsive { .. })),
        "{err}"
    );
    if let Ok(b) = victim.alloc() {
        assert!(victim.send(b).is_err(), "send on a failed connection");
    }

    // The other connection is unaffected.
    for seq in 0..200 {
        send_msg(&keeper, seq, 1 + seq as usize);
        recv_msg(&keeper, seq, 1 + seq as usize);
    }

    // Resumed, the stopped side sees its connection failed (and says so).
    stop(child.id(), libc::SIGCONT);
    let line = wait_for_line(&out, "CHILD-DOWN", WAIT, "stopped child after SIGCONT");
    assert!(line.contains("received 0"), "{line}");
    wait_success(&mut child, WAIT);
    drop(victim);
    drop(keeper);
    assert_eq!(echo.join().unwrap(), 200);
    // Nothing else was reported for the victim (e.g. a second, Disconnected event).
    while let Some(e) = engine.try_event() {
        assert!(
            !matches!(&e, Event::Disconnected { .. } | Event::Error { .. }),
            "unexpected event {e:?}"
        );
    }
}

#[test]
fn sigstopped_peer_run_to_completion() {
    let _g = serial();
    let engine = rtc_builder(4096, 16)
        .liveness_timeout(LIVENESS)
        .build()
        .unwrap();
    survivor_reports_stopped_peer(engine);
}

#[test]
fn sigstopped_peer_dedicated_poller() {
    let _g = serial();
    let engine = poller_builder(&[cores()[0]], 4096, 16)
        .liveness_timeout(LIVENESS)
        .build()
        .unwrap();
    survivor_reports_stopped_peer(engine);
}

#[test]
fn liveness_timeout_is_validated() {
    let too_short = Engine::builder()
        .liveness_timeout(Duration::from_millis(5))
        .build();
    assert!(matches!(too_short, Err(Error::Config(_))));
    // Zero turns liveness off; the minimum is accepted.
    Engine::builder()
        .liveness_timeout(Duration::ZERO)
        .build()
        .unwrap();
    Engine::builder()
        .liveness_timeout(spinwire::MIN_LIVENESS_TIMEOUT)
        .build()
        .unwrap();
}

/// Child role: connect to the endpoint in `ENDPOINT_ENV`, send one message, then poll the
/// connection until it goes down (bounded); print `CHILD-DOWN` with the error and the number of
/// messages received, and exit successfully.
#[test]
#[ignore = "child role: run by sigstopped_peer_run_to_completion and sigstopped_peer_dedicated_poller"]
fn child_connect_then_report() {
    let ep = role::env(ENDPOINT_ENV);
    let engine = rtc_builder(4096, 16)
        .liveness_timeout(LIVENESS)
        .build()
        .unwrap();
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
