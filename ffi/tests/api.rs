//! The C API driven from Rust through the rlib: a connected pair in one process (one
//! run-to-completion engine), offers, claims, the batch receive, the claim rules and the
//! thread-local error message. `ffi/tests/c/errors.c` covers every code from C.

use std::ffi::{c_void, CStr};
use std::ptr;
use std::time::{Duration, Instant};

use spinwire::*;

fn errmsg() -> String {
    // SAFETY: `sw_errmsg` returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(sw_errmsg()) }
        .to_string_lossy()
        .into_owned()
}

struct Pair {
    engine: *mut sw_engine,
    listener: *mut sw_listener,
    client: *mut sw_conn,
    server: *mut sw_conn,
}

fn pair(tag: &str, buffers: usize) -> Pair {
    pair_idle(tag, buffers, SW_IDLE_BACKOFF)
}

fn pair_idle(tag: &str, buffers: usize, idle: u32) -> Pair {
    let mut cfg = sw_config::default();
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { sw_config_init(&mut cfg) }, SW_OK);
    cfg.buffers = buffers;
    cfg.buffer_size = 512;
    // Pool buffers only: the limit is the buffer size (large messages: tests/c/errors.c).
    cfg.large_buffers = 0;
    cfg.idle = idle;
    let name =
        std::ffi::CString::new(format!("shm://ffi-api-{tag}-{}", std::process::id())).unwrap();
    let mut p = Pair {
        engine: ptr::null_mut(),
        listener: ptr::null_mut(),
        client: ptr::null_mut(),
        server: ptr::null_mut(),
    };
    // SAFETY: valid config and out pointers; the handles are used as the header says.
    unsafe {
        assert_eq!(sw_engine_new(&cfg, &mut p.engine), SW_OK, "{}", errmsg());
        assert_eq!(
            sw_listen(p.engine, name.as_ptr(), &mut p.listener),
            SW_OK,
            "{}",
            errmsg()
        );
        assert_eq!(
            sw_connect(p.engine, name.as_ptr(), 5_000_000_000, &mut p.client),
            SW_OK,
            "{}",
            errmsg()
        );
        assert_eq!(
            sw_accept(p.listener, 5_000_000_000, &mut p.server),
            SW_OK,
            "{}",
            errmsg()
        );
    }
    p
}

impl Drop for Pair {
    fn drop(&mut self) {
        // SAFETY: live handles, closed once each (a handle already closed by a test is NULL).
        unsafe {
            for c in [self.client, self.server] {
                if !c.is_null() {
                    assert_eq!(sw_conn_close(c), SW_OK);
                }
            }
            if !self.listener.is_null() {
                assert_eq!(sw_listener_close(self.listener), SW_OK);
            }
            if !self.engine.is_null() {
                assert_eq!(sw_engine_close(self.engine), SW_OK);
            }
        }
    }
}

unsafe extern "C" fn collect(clientd: *mut c_void, data: *const u8, len: usize) {
    // SAFETY: `clientd` is the `Vec<Vec<u8>>` passed to `sw_poll`; `data` has `len` bytes.
    unsafe {
        let v = &mut *clientd.cast::<Vec<Vec<u8>>>();
        v.push(std::slice::from_raw_parts(data, len).to_vec());
    }
}

/// Polls `conn` until `n` messages arrived (bounded).
fn recv(conn: *mut sw_conn, n: usize) -> Vec<Vec<u8>> {
    let mut got: Vec<Vec<u8>> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < n {
        // SAFETY: a live handle; `collect` matches `clientd`.
        let r = unsafe {
            sw_poll(
                conn,
                Some(collect),
                ptr::addr_of_mut!(got).cast(),
                n - got.len(),
            )
        };
        assert!(r >= 0, "sw_poll: {r} {}", errmsg());
        assert!(
            Instant::now() < deadline,
            "timed out after {} messages",
            got.len()
        );
    }
    got
}

#[test]
fn offer_claim_poll_round_trip() {
    let p = pair("rt", 16);
    // SAFETY: live handles and valid buffers throughout.
    unsafe {
        assert_eq!(sw_conn_max_message_size(p.client), 512);
        assert!(sw_conn_id(p.client) != 0 && sw_conn_id(p.client) != sw_conn_id(p.server));
        assert_eq!(sw_offer(p.client, b"hello".as_ptr().cast(), 5), 1);
        assert_eq!(sw_offer(p.client, ptr::null(), 0), 2, "empty message");
        let mut claim: sw_claim = std::mem::zeroed();
        assert_eq!(sw_try_claim(p.client, 300, &mut claim), SW_OK);
        assert_eq!(claim.len, 300);
        assert_eq!(claim.conn, p.client);
        for i in 0..300 {
            claim.data.add(i).write(i as u8);
        }
        assert_eq!(sw_claim_commit(&mut claim), 3);
        assert!(claim.data.is_null() && claim.token == 0, "spent claim");
        // An aborted claim sends nothing.
        assert_eq!(sw_try_claim(p.client, 8, &mut claim), SW_OK);
        assert_eq!(sw_claim_abort(&mut claim), SW_OK);
        assert_eq!(sw_claim_abort(&mut claim), SW_BAD_ARG);
        assert_eq!(sw_flush(p.client), SW_OK);

        let got = recv(p.server, 3);
        assert_eq!(got[0], b"hello");
        assert!(got[1].is_empty());
        assert_eq!(got[2], (0..300).map(|i| i as u8).collect::<Vec<_>>());

        let mut st = sw_conn_stats::default();
        assert_eq!(sw_conn_get_stats(p.client, &mut st), SW_OK);
        assert_eq!(st.sent, 3);
        let mut st = sw_conn_stats::default();
        assert_eq!(sw_conn_get_stats(p.server, &mut st), SW_OK);
        assert_eq!(st.received, 3);
        let mut es = sw_engine_stats::default();
        assert_eq!(sw_engine_get_stats(p.engine, &mut es), SW_OK);
        assert_eq!(es.pollers, 1);
        // shm connections take the direct path (no poller carries their messages: their
        // counts are the connections' own, checked above); the engine saw both ends open.
        assert_eq!(es.rx_msgs, 0);
        assert!(es.connections_opened >= 2);
    }
}

/// `sw_wait` on an `SW_IDLE_BLOCK` engine: `SW_TIMEOUT` when nothing comes (after sleeping
/// for about the timeout), `SW_OK` at once when a message is ready, which `sw_poll` then takes.
#[test]
fn wait_times_out_or_reports_a_ready_message() {
    let p = pair_idle("wait", 16, SW_IDLE_BLOCK);
    // SAFETY: live handles and valid buffers throughout.
    unsafe {
        let t = Instant::now();
        assert_eq!(sw_wait(p.server, 30_000_000), SW_TIMEOUT);
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(29), "{waited:?}");
        assert_eq!(sw_offer(p.client, b"tick".as_ptr().cast(), 4), 1);
        assert_eq!(sw_wait(p.server, 5_000_000_000), SW_OK, "{}", errmsg());
        let got = recv(p.server, 1);
        assert_eq!(got[0], b"tick");
        assert_eq!(sw_wait(ptr::null(), 0), SW_BAD_ARG);
    }
}

#[test]
fn a_claim_of_one_connection_is_refused_by_another() {
    let p = pair("foreign", 8);
    // SAFETY: live handles; the forged claim names a live connection.
    unsafe {
        let mut claim: sw_claim = std::mem::zeroed();
        assert_eq!(sw_try_claim(p.client, 8, &mut claim), SW_OK);
        let mut forged = sw_claim {
            data: claim.data,
            len: claim.len,
            conn: p.server,
            token: claim.token,
        };
        assert_eq!(sw_claim_commit(&mut forged), i64::from(SW_BAD_ARG));
        assert!(errmsg().contains("stale claim"), "{}", errmsg());
        assert_eq!(sw_claim_commit(&mut claim), 1);
    }
}

/// A copy of a spent claim is refused, also once a later claim of the same kind is open (the
/// ring claim, one at a time, has a slot of its own whose generation tells them apart; a pool
/// claim's slot is reused the same way).
#[test]
fn a_spent_claims_copy_is_stale_after_the_next_claim() {
    let p = pair("stale", 8);
    // SAFETY: live handles and valid buffers throughout; every claim is spent before the close.
    unsafe {
        for len in [RING_CLAIM, POOL_CLAIM] {
            let mut first: sw_claim = std::mem::zeroed();
            assert_eq!(sw_try_claim(p.client, len, &mut first), SW_OK);
            let copy = sw_claim { ..first };
            ptr::write_bytes(first.data, 1, first.len);
            assert!(sw_claim_commit(&mut first) > 0, "{}", errmsg());
            let mut next: sw_claim = std::mem::zeroed();
            assert_eq!(sw_try_claim(p.client, len, &mut next), SW_OK);
            ptr::write_bytes(next.data, 2, next.len);
            let mut stale = copy;
            assert_eq!(sw_claim_commit(&mut stale), i64::from(SW_BAD_ARG));
            assert!(errmsg().contains("stale claim"), "{}", errmsg());
            assert_eq!(sw_claim_abort(&mut stale), SW_BAD_ARG);
            // The open claim is untouched: it commits.
            assert!(sw_claim_commit(&mut next) > 0, "{}", errmsg());
            assert_eq!(sw_flush(p.client), SW_OK);
            let got = recv(p.server, 2);
            assert_eq!(got[0], vec![1; len]);
            assert_eq!(got[1], vec![2; len]);
        }
    }
}

/// Above the inline threshold (120 B by default): a pool-buffer claim on shm.
const POOL_CLAIM: usize = 300;
/// Up to the inline threshold: a ring claim on shm (written in the ring record itself).
const RING_CLAIM: usize = 64;

#[test]
fn close_aborts_outstanding_claims() {
    let mut p = pair("close", 4);
    // SAFETY: live handles; the claims are not used after their connection is closed.
    unsafe {
        let mut claims: [sw_claim; 4] = std::mem::zeroed();
        for c in claims.iter_mut() {
            assert_eq!(sw_try_claim(p.client, POOL_CLAIM, c), SW_OK, "{}", errmsg());
        }
        let mut extra: sw_claim = std::mem::zeroed();
        assert_eq!(
            sw_try_claim(p.client, POOL_CLAIM, &mut extra),
            SW_POOL_EXHAUSTED
        );
        // A ring claim needs no pool buffer: it is open on top of every pool claim, and the
        // close aborts it (with the connection still alive) like the others.
        let mut ring: sw_claim = std::mem::zeroed();
        assert_eq!(
            sw_try_claim(p.client, RING_CLAIM, &mut ring),
            SW_OK,
            "{}",
            errmsg()
        );
        ptr::write_bytes(ring.data, 0xee, ring.len);
        assert_eq!(sw_conn_close(p.client), SW_OK);
        p.client = ptr::null_mut();
        // The peer sees the close, and none of the aborted claims.
        let mut got: Vec<Vec<u8>> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let r = sw_poll(p.server, Some(collect), ptr::addr_of_mut!(got).cast(), 8);
            if r == i64::from(SW_CLOSED) {
                break;
            }
            assert_eq!(r, 0, "{}", errmsg());
            assert!(Instant::now() < deadline, "no SW_CLOSED");
        }
        assert!(got.is_empty(), "aborted claims arrived: {got:?}");
        assert_eq!(sw_conn_is_open(p.server), 0);
    }
}

#[test]
fn one_open_ring_claim_at_a_time() {
    let p = pair("claim-open", 8);
    // SAFETY: live handles and valid buffers throughout; every claim is spent or aborted before
    // its connection is closed.
    unsafe {
        let mut ring: sw_claim = std::mem::zeroed();
        assert_eq!(sw_try_claim(p.client, RING_CLAIM, &mut ring), SW_OK);
        ptr::write_bytes(ring.data, 1, ring.len);
        // Nothing else is claimed or sent while it is open.
        let mut second: sw_claim = std::mem::zeroed();
        assert_eq!(
            sw_try_claim(p.client, RING_CLAIM, &mut second),
            SW_CLAIM_OPEN
        );
        assert!(
            errmsg().starts_with("sw_try_claim: a claim is open"),
            "{}",
            errmsg()
        );
        assert_eq!(
            sw_try_claim(p.client, POOL_CLAIM, &mut second),
            SW_CLAIM_OPEN
        );
        assert_eq!(
            sw_offer(p.client, b"x".as_ptr().cast(), 1),
            i64::from(SW_CLAIM_OPEN)
        );
        assert!(
            errmsg().starts_with("sw_offer: a claim is open"),
            "{}",
            errmsg()
        );
        let mut st = sw_conn_stats::default();
        assert_eq!(sw_conn_get_stats(p.client, &mut st), SW_OK);
        assert_eq!(st.sent, 0, "a refused offer sent nothing");
        // The open claim is still good: it commits, and the connection is free again.
        assert_eq!(sw_claim_commit(&mut ring), 1);
        assert_eq!(sw_offer(p.client, b"after".as_ptr().cast(), 5), 2);

        // A pool-buffer claim may be open under a ring claim, but its commit waits for the ring
        // claim (refused, the claim kept), and an aborted ring claim publishes nothing.
        let mut pool: sw_claim = std::mem::zeroed();
        assert_eq!(sw_try_claim(p.client, POOL_CLAIM, &mut pool), SW_OK);
        ptr::write_bytes(pool.data, 2, pool.len);
        assert_eq!(sw_try_claim(p.client, RING_CLAIM, &mut ring), SW_OK);
        assert_eq!(sw_claim_commit(&mut pool), i64::from(SW_CLAIM_OPEN));
        assert!(
            !pool.data.is_null() && pool.token != 0,
            "the refused claim is kept"
        );
        assert_eq!(sw_claim_abort(&mut ring), SW_OK);
        assert_eq!(sw_claim_commit(&mut pool), 3);
        assert_eq!(sw_flush(p.client), SW_OK);
        let got = recv(p.server, 3);
        assert_eq!(got[0], vec![1; RING_CLAIM]);
        assert_eq!(got[1], b"after");
        assert_eq!(got[2], vec![2; POOL_CLAIM]);
        // Ring claims one after the other, each committed before the next.
        for i in 0..20u8 {
            assert_eq!(sw_try_claim(p.client, 8, &mut ring), SW_OK, "{}", errmsg());
            ptr::write_bytes(ring.data, i, 8);
            assert_eq!(sw_claim_commit(&mut ring), 4 + i64::from(i));
            assert_eq!(recv(p.server, 1), [vec![i; 8]]);
        }
    }
}

/// What an `sw_offer_in_place` writer saw and did.
struct Writer {
    /// The byte it fills the message with.
    byte: u8,
    calls: usize,
    len: usize,
    /// When set, the writer tries to close this connection and to offer on it from inside.
    conn: *mut sw_conn,
    close: i32,
    nested: i64,
}

impl Writer {
    fn new(byte: u8) -> Writer {
        Writer {
            byte,
            calls: 0,
            len: usize::MAX,
            conn: ptr::null_mut(),
            close: 0,
            nested: 0,
        }
    }
}

unsafe extern "C" fn fill(clientd: *mut c_void, data: *mut u8, len: usize) {
    // SAFETY: `clientd` is the test's `Writer`; `data` has `len` writable bytes; `conn` is
    // NULL or the live connection written for.
    unsafe {
        let w = &mut *clientd.cast::<Writer>();
        w.calls += 1;
        w.len = len;
        ptr::write_bytes(data, w.byte, len);
        if !w.conn.is_null() {
            w.close = sw_conn_close(w.conn);
            w.nested = sw_offer(w.conn, b"n".as_ptr().cast(), 1);
        }
    }
}

/// `sw_offer_in_place`: the writer fills the room once, in place, and the message is sent in
/// the same call, in a ring record (shm, up to the inline threshold), in a pool buffer, or
/// empty; refusals call no writer and send nothing; the writer cannot close its connection.
#[test]
fn offer_in_place_sends_what_the_writer_wrote() {
    let p = pair("in-place", 4);
    // SAFETY: live handles; every writer is a `Writer` with `fill`.
    unsafe {
        let mut sent = 0;
        for (len, byte) in [(RING_CLAIM, 1u8), (POOL_CLAIM, 2), (0, 3)] {
            let mut w = Writer::new(byte);
            sent += 1;
            let r = sw_offer_in_place(p.client, len, Some(fill), ptr::addr_of_mut!(w).cast());
            assert_eq!(r, sent, "{}", errmsg());
            assert_eq!((w.calls, w.len), (1, len));
        }
        assert_eq!(
            recv(p.server, 3),
            [vec![1; RING_CLAIM], vec![2; POOL_CLAIM], vec![]]
        );

        // Refused before the writer runs: a NULL writer, too large, every buffer claimed, a
        // full ring. Nothing is sent.
        let mut w = Writer::new(9);
        let wp: *mut c_void = ptr::addr_of_mut!(w).cast();
        assert_eq!(
            sw_offer_in_place(p.client, 8, None, wp),
            i64::from(SW_BAD_ARG)
        );
        assert!(errmsg().contains("write is NULL"), "{}", errmsg());
        assert_eq!(
            sw_offer_in_place(p.client, 513, Some(fill), wp),
            i64::from(SW_TOO_LARGE)
        );
        let mut claims: [sw_claim; 4] = std::mem::zeroed();
        for c in claims.iter_mut() {
            assert_eq!(sw_try_claim(p.client, POOL_CLAIM, c), SW_OK, "{}", errmsg());
        }
        assert_eq!(
            sw_offer_in_place(p.client, POOL_CLAIM, Some(fill), wp),
            i64::from(SW_POOL_EXHAUSTED)
        );
        for c in claims.iter_mut() {
            assert_eq!(sw_claim_abort(c), SW_OK);
        }
        let mut queued = 0;
        loop {
            let r = sw_offer(p.client, b"q".as_ptr().cast(), 1);
            if r == i64::from(SW_BACK_PRESSURED) {
                break;
            }
            assert!(r > 0, "{}", errmsg());
            queued += 1;
            assert!(queued < 1_000_000, "the ring never filled");
        }
        sent += queued;
        assert_eq!(
            sw_offer_in_place(p.client, RING_CLAIM, Some(fill), wp),
            i64::from(SW_BACK_PRESSURED)
        );
        assert_eq!(w.calls, 0, "a refused offer called its writer");
        assert_eq!(recv(p.server, queued as usize).len(), queued as usize);

        // From inside the writer: closing its connection is refused, and so is an offer on it
        // while its ring record is open; the message goes, the connection stays open.
        w.conn = p.client;
        sent += 1;
        assert_eq!(
            sw_offer_in_place(p.client, RING_CLAIM, Some(fill), wp),
            sent
        );
        assert_eq!(w.close, SW_BAD_ARG);
        assert_eq!(w.nested, i64::from(SW_CLAIM_OPEN));
        assert_eq!(sw_conn_is_open(p.client), 1);
        // With a pool buffer open the inner offer (a ring record) goes first.
        sent += 2;
        assert_eq!(
            sw_offer_in_place(p.client, POOL_CLAIM, Some(fill), wp),
            sent
        );
        assert_eq!(w.nested, sent - 1);
        assert_eq!(
            recv(p.server, 3),
            [vec![9; RING_CLAIM], b"n".to_vec(), vec![9; POOL_CLAIM]]
        );
        assert_eq!(sw_conn_outstanding(p.client), 0);
        let mut st = sw_conn_stats::default();
        assert_eq!(sw_conn_get_stats(p.client, &mut st), SW_OK);
        assert_eq!(st.sent, sent as u64);
    }
}

#[test]
fn errmsg_keeps_the_cause_chain_per_thread() {
    let mut e = ptr::null_mut();
    // SAFETY: valid out pointers; the engine is closed once.
    unsafe {
        assert_eq!(sw_engine_new(ptr::null(), &mut e), SW_OK);
        let name = c"shm://ffi-api-nobody-here";
        let mut c = ptr::null_mut();
        // Waits 100 ms for a listener.
        assert_eq!(
            sw_connect(e, name.as_ptr(), 100_000_000, &mut c),
            SW_NOT_CONNECTED
        );
        let msg = errmsg();
        assert!(
            msg.starts_with(
                "sw_connect: connect to \"shm://ffi-api-nobody-here\": no listener appeared \
                 within "
            ),
            "{msg}"
        );
        assert!(
            msg.contains(": connect to \"shm://ffi-api-nobody-here\" failed: "),
            "the last refusal is kept: {msg}"
        );
        assert!(msg.contains("no shm listener"), "the cause is kept: {msg}");
        // Another thread has its own message.
        let other = std::thread::spawn(errmsg).join().unwrap();
        assert_eq!(other, "");
        assert_eq!(sw_engine_close(e), SW_OK);
    }
}

#[test]
fn connections_outlive_a_closed_engine_handle() {
    let mut p = pair("engine-first", 8);
    // SAFETY: live handles; the engine handle is not used after it is closed.
    unsafe {
        assert_eq!(sw_engine_close(p.engine), SW_OK);
        assert_eq!(sw_offer(p.client, b"still here".as_ptr().cast(), 10), 1);
        assert_eq!(sw_flush(p.client), SW_OK);
        assert_eq!(recv(p.server, 1)[0], b"still here");
        assert_eq!(sw_conn_close(p.client), SW_OK);
        assert_eq!(sw_conn_close(p.server), SW_OK);
        assert_eq!(sw_listener_close(p.listener), SW_OK);
    }
    p.client = ptr::null_mut();
    p.server = ptr::null_mut();
    p.listener = ptr::null_mut();
    p.engine = ptr::null_mut();
}
