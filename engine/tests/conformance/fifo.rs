//! FIFO with no loss or duplication over every size from 1 B to the limit: every size up to
//! the pool buffer, then large ones; around every boundary (inline, pool buffer, large slot,
//! the limit, the limit + 1 refused); the default limit; small and large interleaved. In one
//! process (run to completion and with a dedicated poller) and between two processes.

use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, RecvIntoError, DEFAULT_MAX_MESSAGE_SIZE};
use spinwire_testkit::data::{verify, XorShift};
use spinwire_testkit::engine::*;
use spinwire_testkit::process::{wait_success, KillOnDrop};
use spinwire_testkit::{cores, role, WAIT};

use super::{Scheme, BUF, LIMIT};

/// Large sizes after every size up to `BUF`: just past the buffer, odd, and the limit.
const LARGE: [usize; 4] = [BUF + 1, 3 * BUF + 7, LIMIT - 1, LIMIT];
/// The sizes of [`every_size`]: 1 ..= `BUF` (above 512 B in steps of the scheme's
/// `size_step`, and `BUF` itself), then `LARGE`.
fn sizes(s: &Scheme) -> impl Iterator<Item = usize> {
    let step = s.size_step;
    (1..=BUF)
        .filter(move |&n| n <= 512 || n % step == 0 || n == BUF)
        .chain(LARGE)
}

/// Round trips of [`every_size`].
fn trips(s: &Scheme) -> u64 {
    sizes(s).count() as u64
}

/// One round trip per size of [`sizes`], both directions verified; `server` echoes on this
/// thread when given (else a peer echoes).
fn every_size(s: &Scheme, client: &Connection, server: Option<&Connection>) {
    assert_eq!(client.max_message_size(), LIMIT);
    for len in sizes(s) {
        let seq = len as u32;
        send_msg(client, seq, len);
        if let Some(s) = server {
            let m = s.recv_timeout(WAIT).expect("server recv");
            verify(&m, seq, len);
            let mut b = claim_timeout(s, m.len());
            b.copy_from(&m).unwrap();
            drop(m);
            s.send_timeout(b, WAIT).expect("echo");
            s.flush().expect("flush");
        }
        recv_msg(client, seq, len);
    }
}

pub fn every_size_run_to_completion(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("rtc"));
    every_size(s, &c, Some(&srv));
    let st = c.stats();
    assert_eq!(st.sent, trips(s));
    assert_eq!(st.received, trips(s));
    assert_eq!(srv.stats().received, trips(s));
}

pub fn every_size_dedicated_poller(s: &'static Scheme) {
    // One engine with a dedicated (backoff) poller, the other driven by this thread.
    let se = s.build(s.poller(cores()[0]));
    let ce = s.build(s.rtc());
    let (srv, c) = pair(&se, &ce, &(s.endpoint)("ded"));
    let echo = std::thread::spawn(move || echo_until_closed(&srv));
    every_size(s, &c, None);
    drop(c);
    assert_eq!(echo.join().unwrap(), trips(s));
    let pollers = se.counters().pollers;
    assert_eq!(pollers.len(), 1);
    assert_eq!(pollers[0].core, Some(cores()[0]));
}

pub fn every_size_two_processes(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let ep = (s.endpoint)("2p");
    let listener = e.listen(&ep).unwrap();
    let mut child = KillOnDrop(
        role::command(&s.role("role_echo"))
            .env(ENDPOINT_ENV, &ep)
            .spawn()
            .expect("spawn child"),
    );
    let c = listener
        .accept_timeout(Duration::from_secs(30))
        .expect("child connects");
    // The listener side drives: it sends, the child echoes.
    every_size(s, &c, None);
    drop(c);
    wait_success(&mut child, Duration::from_secs(60));
}

/// Child role: connect to the endpoint in `ENDPOINT_ENV` and echo until closed.
pub fn role_echo(s: &'static Scheme) {
    let ep = role::env(ENDPOINT_ENV);
    let e = s.build(s.rtc());
    let conn = e.connect_timeout(&ep, WAIT).expect("child connect");
    assert_eq!(
        echo_until_closed(&conn),
        trips(s),
        "child echoed every message"
    );
}

/// Each size client -> server through `claim`, verified, echoed back (a copy into the server's
/// own buffer or slot) and verified again.
fn round_trips(srv: &Connection, c: &Connection, sizes: &[usize]) {
    for (i, &len) in sizes.iter().enumerate() {
        let seq = i as u32;
        send_msg(c, seq, len);
        let m = srv
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("recv {len} B: {e}"));
        verify(&m, seq, len);
        let mut b = claim_timeout(srv, len);
        b.copy_from(&m).unwrap();
        drop(m);
        srv.send_timeout(b, WAIT).expect("echo");
        srv.flush().expect("flush");
        recv_msg(c, seq, len);
    }
}

pub fn large_boundaries_and_the_limit(s: &'static Scheme) {
    let e = s.build(s.rtc());
    let (srv, c) = pair(&e, &e, &(s.endpoint)("bounds"));
    assert_eq!(c.max_message_size(), LIMIT);
    assert_eq!(srv.max_message_size(), LIMIT);
    let inline = spinwire::INLINE_MAX;
    let sizes = [
        0,
        1,
        inline - 1,
        inline,
        inline + 1,
        BUF - 1,
        BUF,
        BUF + 1,
        (16 << 10) - 1,
        16 << 10,
        (32 << 10) - 9,
        (32 << 10) - 8,
        (32 << 10) - 7,
        (64 << 10) - 1,
        64 << 10,
        (64 << 10) + 1,
        LIMIT - 1,
        LIMIT,
    ];
    round_trips(&srv, &c, &sizes);
    assert_limit_refused(&c, LIMIT);
    assert_limit_refused(&srv, LIMIT);
    // `send_copy` of each size too.
    for (i, &len) in sizes.iter().enumerate() {
        let seq = 100 + i as u32;
        c.send_copy_timeout(&frame(seq, len), WAIT)
            .unwrap_or_else(|e| panic!("send_copy {len} B: {e}"));
        c.flush().expect("flush");
        recv_msg(&srv, seq, len);
    }
    let n = 2 * sizes.len() as u64;
    assert_eq!(srv.stats().received, n);
    assert_eq!(c.stats().sent, n);
    assert!(c.is_open() && srv.is_open());
    assert!(
        matches!(srv.try_recv(), Ok(None)),
        "nothing beyond what was sent"
    );
}

pub fn default_limit_carried_whole(s: &'static Scheme) {
    let e = s.build(s.rtc().max_message_size(DEFAULT_MAX_MESSAGE_SIZE));
    let (srv, c) = pair(&e, &e, &(s.endpoint)("deflimit"));
    assert_eq!(c.max_message_size(), DEFAULT_MAX_MESSAGE_SIZE);
    round_trips(
        &srv,
        &c,
        &[DEFAULT_MAX_MESSAGE_SIZE - 1, DEFAULT_MAX_MESSAGE_SIZE],
    );
    assert_limit_refused(&c, DEFAULT_MAX_MESSAGE_SIZE);
}

/// Inline, pooled, just above the buffer size, large (mostly up to 192 KiB, some at the limit).
fn mixed_size(rng: &mut XorShift) -> usize {
    match rng.index(10) {
        0 | 1 => 1 + rng.index(120),
        2 | 3 => 121 + rng.index(BUF - 120),
        4 | 5 => BUF + 1 + rng.index(28 << 10),
        6 => LIMIT,
        _ => (32 << 10) + rng.index(160 << 10),
    }
}

/// Receives the next message into `buf` with `recv_into`, within `WAIT`.
// The error hands the message back, as `recv_into`'s does.
#[allow(clippy::result_large_err)]
pub fn recv_into_wait<'c>(c: &'c Connection, buf: &mut [u8]) -> Result<usize, RecvIntoError<'c>> {
    let deadline = Instant::now() + WAIT;
    loop {
        match c.recv_into(&mut *buf) {
            Ok(Some(n)) => return Ok(n),
            Ok(None) => {}
            Err(e) => return Err(e),
        }
        assert!(Instant::now() < deadline, "no message within {WAIT:?}");
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// `N` messages of [`mixed_size`] from a sender thread (its own run-to-completion engine; in
/// place and `send_copy` alternately) to `server`'s accepted connection: all arrive, verified,
/// in order, some taken with `recv_into`.
fn interleaved(s: &'static Scheme, server: Engine) {
    const N: u32 = 300;
    let ep = (s.endpoint)("mixed");
    let l = server.listen(&ep).unwrap();
    let sender = std::thread::spawn(move || {
        let ce = s.build(s.rtc());
        let c = ce.connect_timeout(&ep, WAIT).expect("connect");
        let mut rng = XorShift::new(12);
        for seq in 0..N {
            let len = mixed_size(&mut rng);
            if seq % 2 == 0 {
                send_msg(&c, seq, len);
            } else {
                c.send_copy_timeout(&frame(seq, len), WAIT)
                    .unwrap_or_else(|e| panic!("send_copy {seq}: {e}"));
                c.flush().expect("flush");
            }
        }
        // Until the receiver has everything (it closes first).
        let end = Instant::now() + Duration::from_secs(60);
        while c.is_open() && Instant::now() < end {
            ce.poll();
            std::thread::sleep(Duration::from_millis(1));
        }
        c.stats()
    });
    let srv = l.accept_timeout(WAIT).expect("accept");
    let mut rng = XorShift::new(12);
    let mut into = vec![0u8; LIMIT];
    for seq in 0..N {
        let len = mixed_size(&mut rng);
        if seq % 3 == 0 {
            let n = recv_into_wait(&srv, &mut into).unwrap_or_else(|e| panic!("recv_into: {e}"));
            verify(&into[..n], seq, len);
        } else {
            recv_msg(&srv, seq, len);
        }
    }
    assert_eq!(srv.stats().received, u64::from(N));
    drop(srv);
    let st = sender.join().unwrap();
    assert_eq!(st.sent, u64::from(N));
}

pub fn small_and_large_interleaved(s: &'static Scheme) {
    interleaved(s, s.build(s.rtc()));
}

pub fn small_and_large_interleaved_dedicated_poller(s: &'static Scheme) {
    interleaved(s, s.build(s.poller(cores()[0])));
}
