//! The engine through its public API: builders with test-friendly defaults (backoff idling, so
//! that tests never hog a core), connected pairs, and send/receive of verified frames
//! ([`crate::data::fill`] / [`crate::data::verify`]). Feature `engine`.

use spinwire::{Connection, Engine, EngineBuilder, Error, IdleStrategy, SendError};

use crate::data::{fill, verify};
use crate::WAIT;

/// The environment variable that hands a child role (see [`crate::role`]) the endpoint it
/// connects to.
pub const ENDPOINT_ENV: &str = "SPINWIRE_TEST_ENDPOINT";

/// A unique shm endpoint for this process and `tag`: `shm://t-<tag>-<pid>`.
pub fn endpoint(tag: &str) -> String {
    format!("shm://t-{tag}-{}", std::process::id())
}

/// A run-to-completion builder (no poller thread: the calling thread drives the engine) with
/// the backoff idle strategy and `buffers` buffers of `buffer_size` bytes per connection.
pub fn rtc_builder(buffer_size: usize, buffers: usize) -> EngineBuilder {
    Engine::builder()
        .run_to_completion()
        .idle(IdleStrategy::backoff())
        .pool(buffer_size, buffers)
}

/// A builder with one dedicated poller per core of `cores`, the backoff idle strategy and
/// `buffers` buffers of `buffer_size` bytes per connection.
pub fn poller_builder(cores: &[usize], buffer_size: usize, buffers: usize) -> EngineBuilder {
    Engine::builder()
        .pollers(cores)
        .idle(IdleStrategy::backoff())
        .pool(buffer_size, buffers)
}

/// A run-to-completion engine for shm tests: [`rtc_builder`], ring depth `min(buffers, 32)`,
/// batches of 8.
///
/// # Panics
///
/// If the engine cannot be built.
pub fn rtc_engine(buffer_size: usize, buffers: usize) -> Engine {
    rtc_builder(buffer_size, buffers)
        .depth(buffers.min(32))
        .batch(8)
        .build()
        .expect("engine")
}

/// An engine with one dedicated poller on `core`: [`poller_builder`] with the engine's other
/// defaults.
///
/// # Panics
///
/// If the engine cannot be built.
pub fn poller_engine(core: usize, buffer_size: usize, buffers: usize) -> Engine {
    poller_builder(&[core], buffer_size, buffers)
        .build()
        .expect("engine")
}

/// A connected pair `(server, client)`: `server_engine` listens on `endpoint`,
/// `client_engine` connects, and the listener accepts (within [`WAIT`]). The two engines may be
/// the same. The listener is dropped once the pair is connected.
///
/// # Panics
///
/// If listening, connecting or accepting fails.
pub fn pair(
    server_engine: &Engine,
    client_engine: &Engine,
    endpoint: &str,
) -> (Connection, Connection) {
    let l = server_engine.listen(endpoint).expect("listen");
    let c = client_engine.connect(endpoint).expect("connect");
    let s = l.accept_timeout(WAIT).expect("accept");
    (s, c)
}

/// Sends `data` as one message, waiting (within [`WAIT`]) for a buffer and credits, and
/// flushes.
///
/// # Panics
///
/// If no buffer or credit comes within [`WAIT`], `data` does not fit a buffer, or the
/// connection fails.
pub fn send_bytes(conn: &Connection, data: &[u8]) {
    let mut b = conn.alloc_timeout(WAIT).expect("alloc");
    b.copy_from(data).expect("copy");
    if let Err(e) = conn.send_timeout(b, WAIT) {
        panic!("send: {e}");
    }
    if let Err(e) = conn.flush() {
        panic!("flush: {e}");
    }
}

/// [`Connection::claim`] of `len` bytes (a pool buffer, a ring record or, above the buffer
/// size, a large slot), retried on back-pressure within [`WAIT`].
///
/// # Panics
///
/// If nothing is free within [`WAIT`] or the claim fails otherwise.
pub fn claim_timeout(conn: &Connection, len: usize) -> spinwire::SendBuf<'_> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match conn.claim(len) {
            Ok(b) => return b,
            Err(Error::WouldBlock) if std::time::Instant::now() < deadline => {
                // A connection that went down fails the next claim, with the reason.
                let _ = conn.flush();
                std::thread::yield_now();
            }
            Err(e) => panic!("claim {len}: {e}"),
        }
    }
}

/// Sends frame `seq` of `len` bytes ([`fill`]), waiting (within [`WAIT`]) for a buffer (or,
/// above the buffer size, a large slot) and credits, and flushes.
///
/// # Panics
///
/// As [`send_bytes`].
pub fn send_msg(conn: &Connection, seq: u32, len: usize) {
    let mut b = claim_timeout(conn, len);
    fill(&mut b, seq);
    if let Err(e) = conn.send_timeout(b, WAIT) {
        panic!("send {seq}: {e:?}");
    }
    if let Err(e) = conn.flush() {
        panic!("flush {seq}: {e}");
    }
}

/// One frame `seq` of `len` bytes ([`fill`]) sent with `alloc`/`send`, without waiting;
/// `false`: `WouldBlock` (no buffer or no credit).
///
/// # Panics
///
/// On any other error.
pub fn try_send_one(c: &Connection, seq: u32, len: usize) -> bool {
    match c.alloc() {
        Ok(mut b) => {
            b.set_len(len).unwrap();
            fill(&mut b, seq);
            match c.send(b) {
                Ok(()) => true,
                Err(SendError::WouldBlock(_)) => false,
                Err(e) => panic!("send {seq}: {e:?}"),
            }
        }
        Err(Error::WouldBlock) => false,
        Err(e) => panic!("alloc {seq}: {e:?}"),
    }
}

/// A run-to-completion receiver whose every take finds a message still returns credit: frames
/// of `len` bytes go from `c` (whose engine is `ce`) to `srv` until `target` were sent, while
/// the receiver takes only the first `take` (each take then finds a message already delivered,
/// so no pass runs on its side); then everything arrives in order. `target` is one more than
/// the sender's window, so reaching it proves a credit came back.
///
/// # Panics
///
/// If the sender stalls, or a frame does not arrive, within [`WAIT`]; on any error; if a
/// frame differs.
pub fn send_past_window_while_taking(
    c: &Connection,
    ce: &Engine,
    srv: &Connection,
    target: u32,
    take: u32,
    len: usize,
) {
    let (mut sent, mut taken) = (0u32, 0u32);
    let end = std::time::Instant::now() + WAIT;
    while sent < target {
        assert!(
            std::time::Instant::now() < end,
            "the sender stalled at {sent} sent ({taken} taken of {take}): no credit came back"
        );
        if try_send_one(c, sent, len) {
            sent += 1;
            continue;
        }
        c.flush().expect("flush");
        ce.poll();
        if taken < take {
            if let Some(m) = srv.try_recv().expect("try_recv") {
                verify(&m, taken, len);
                taken += 1;
            }
        }
    }
    // Everything arrives, in order.
    c.flush().expect("flush");
    for seq in taken..sent {
        let end = std::time::Instant::now() + WAIT;
        let m = loop {
            if let Some(m) = srv.try_recv().expect("try_recv") {
                break m;
            }
            assert!(
                std::time::Instant::now() < end,
                "message {seq} did not arrive"
            );
            c.flush().expect("flush");
            ce.poll();
        };
        verify(&m, seq, len);
    }
}

/// Receives (within [`WAIT`]) and [`verify`]s frame `seq` of `len` bytes.
///
/// # Panics
///
/// If nothing arrives within [`WAIT`], the connection fails, or the message differs.
pub fn recv_msg(conn: &Connection, seq: u32, len: usize) {
    let m = conn
        .recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("recv {seq}: {e}"));
    verify(&m, seq, len);
}

/// Echoes every message back until the connection closes or [`WAIT`] passes without traffic;
/// returns how many it echoed.
///
/// # Panics
///
/// On any other receive or send error.
pub fn echo_until_closed(conn: &Connection) -> u64 {
    let mut n = 0;
    loop {
        let m = match conn.recv_timeout(WAIT) {
            Ok(m) => m,
            Err(Error::Disconnected) | Err(Error::Timeout) => return n,
            Err(e) => panic!("echo: {e}"),
        };
        let mut b = claim_timeout(conn, m.len());
        b.copy_from(&m).expect("copy");
        drop(m);
        loop {
            match conn.send_timeout(b, WAIT) {
                Ok(()) => break,
                Err(SendError::Timeout(back)) => b = back,
                Err(e) => panic!("echo send: {e:?}"),
            }
        }
        n += 1;
        match conn.flush() {
            Ok(()) => {}
            // The peer closed after its last message: what was sent is echoed.
            Err(Error::Disconnected) => return n,
            Err(e) => panic!("echo flush: {e}"),
        }
    }
}

/// Frame `seq` of `len` bytes as a vector (for `send_copy`).
pub fn frame(seq: u32, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(&mut v, seq);
    v
}

/// Asserts that `e` is `MessageTooLarge` for `size` bytes, stating the limit `max` (also in
/// its text).
///
/// # Panics
///
/// When it is not.
pub fn assert_too_large(e: &Error, size: usize, max: usize) {
    assert!(
        matches!(e, Error::MessageTooLarge { size: s, max: m } if *s == size && *m == max),
        "expected MessageTooLarge {{ size: {size}, max: {max} }}, got {e:?}"
    );
    assert!(e.to_string().contains(&max.to_string()), "{e}");
}

/// Every way of sending `limit + 1` bytes (`claim`, `send_copy`, a large slot's `set_len`) is
/// refused with the limit, and nothing is sent.
///
/// # Panics
///
/// When one is not refused that way, or no large slot comes within [`WAIT`].
pub fn assert_limit_refused(c: &Connection, limit: usize) {
    assert_too_large(&c.claim(limit + 1).map(drop).unwrap_err(), limit + 1, limit);
    assert_too_large(
        &c.send_copy(&vec![0u8; limit + 1]).unwrap_err(),
        limit + 1,
        limit,
    );
    let mut b = c.alloc_large_timeout(WAIT).expect("alloc_large");
    assert_eq!(b.capacity(), limit, "a large slot holds the limit");
    assert_too_large(&b.set_len(limit + 1).unwrap_err(), limit + 1, limit);
}
