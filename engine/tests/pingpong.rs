//! Ping-pong with every message size from 1 byte to the pool's buffer size, then large ones up
//! to the limit ([`LARGE`]), payloads verified by sequence number and checksum: in one process
//! (run-to-completion and dedicated pollers) and between two processes.

use std::time::Duration;

use spinwire_testkit::data::verify;
use spinwire_testkit::engine::*;
use spinwire_testkit::process::{wait_success, KillOnDrop};
use spinwire_testkit::{cores, role, serial, WAIT};

const BUF: usize = 4096;
/// Large sizes after every size up to `BUF`: just past the buffer, odd, and the limit (the
/// engine's default maximum message size).
const LARGE: [usize; 4] = [
    BUF + 1,
    3 * BUF + 7,
    (1 << 20) - 1,
    spinwire::DEFAULT_MAX_MESSAGE_SIZE,
];
/// Round trips per run.
const TRIPS: u64 = BUF as u64 + LARGE.len() as u64;

/// One round trip per size, 1 ..= BUF and then `LARGE`, both directions verified.
fn every_size(client: &spinwire::Connection, server: Option<&spinwire::Connection>) {
    let max = client.max_message_size();
    assert_eq!(max, spinwire::DEFAULT_MAX_MESSAGE_SIZE);
    for len in (1..=BUF).chain(LARGE) {
        let seq = len as u32;
        send_msg(client, seq, len);
        if let Some(s) = server {
            let m = s.recv_timeout(WAIT).expect("server recv");
            verify(&m, seq, len);
            let mut b = claim_timeout(s, m.len());
            b.copy_from(&m).unwrap();
            drop(m);
            s.send_timeout(b, WAIT).expect("echo");
            s.flush();
        }
        recv_msg(client, seq, len);
    }
}

#[test]
fn in_process_every_size_run_to_completion() {
    let _g = serial();
    let engine = inline_engine(BUF, 16);
    let (s, c) = pair(&engine, &engine, &endpoint("rtc"));
    every_size(&c, Some(&s));
    let st = c.stats();
    assert_eq!(st.sent, TRIPS);
    assert_eq!(st.received, TRIPS);
}

#[test]
fn in_process_every_size_two_engines_dedicated_poller() {
    let _g = serial();
    // One engine with a dedicated (backoff) poller, the other driven inline by this thread.
    let core = cores()[0];
    let se = poller_engine(core, BUF, 16);
    let ce = inline_engine(BUF, 16);
    let (s, c) = pair(&se, &ce, &endpoint("ded"));
    let echo = std::thread::spawn(move || echo_until_closed(&s));
    every_size(&c, None);
    drop(c);
    assert_eq!(echo.join().unwrap(), TRIPS);
    let pollers = se.counters().pollers;
    assert_eq!(pollers.len(), 1);
    assert_eq!(pollers[0].core, Some(core));
    // shm connections take the direct path: the application threads write and read the
    // segment's record rings themselves, the poller carries none of it (the echo count above
    // is what the server received).
    assert_eq!(pollers[0].rx_msgs, 0);
    assert_eq!(pollers[0].tx_msgs, 0);
}

#[test]
fn two_process_every_size() {
    let _g = serial();
    let engine = inline_engine(BUF, 16);
    let ep = endpoint("2p");
    let listener = engine.listen(&ep).unwrap();
    let mut child = KillOnDrop(
        role::command("child_echo")
            .env(ENDPOINT_ENV, &ep)
            .spawn()
            .expect("spawn child"),
    );
    let c = listener
        .accept_timeout(Duration::from_secs(30))
        .expect("child connects");
    // Here the listener side drives: it sends, the child echoes.
    every_size(&c, None);
    drop(c);
    wait_success(&mut child, Duration::from_secs(60));
}

/// Child role: connect to the endpoint in `ENDPOINT_ENV` and echo until closed.
#[test]
#[ignore = "child role: run by two_process_every_size"]
fn child_echo() {
    let ep = role::env(ENDPOINT_ENV);
    let engine = inline_engine(BUF, 16);
    let conn = engine.connect_timeout(&ep, WAIT).expect("child connect");
    let n = echo_until_closed(&conn);
    assert_eq!(n, TRIPS, "child echoed every message");
}
