//! Held messages through the C API (`sw_hold` / `sw_release`): they outlive the call, forward
//! without a copy into the application, stay in place, are bounded by the receive pool, and
//! `sw_conn_close` releases what is left. Also the range checks of `sw_config`.

use std::ffi::{c_void, CStr, CString};
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

/// A connected shm pair: `buffers` buffers of 512 B, no large slots.
fn pair(tag: &str, buffers: usize) -> Pair {
    let cfg = sw_config {
        buffers,
        buffer_size: 512,
        large_buffers: 0,
        idle: SW_IDLE_BACKOFF,
        ..sw_config::default()
    };
    let name = CString::new(format!("shm://ffi-held-{tag}-{}", std::process::id())).unwrap();
    let mut p = Pair {
        engine: ptr::null_mut(),
        listener: ptr::null_mut(),
        client: ptr::null_mut(),
        server: ptr::null_mut(),
    };
    // SAFETY: valid config and out pointers; the handles are used as the header says.
    unsafe {
        assert_eq!(sw_engine_new(&cfg, &mut p.engine), SW_OK, "{}", errmsg());
        assert_eq!(sw_listen(p.engine, name.as_ptr(), &mut p.listener), SW_OK);
        assert_eq!(
            sw_connect(p.engine, name.as_ptr(), 5_000_000_000, &mut p.client),
            SW_OK,
            "{}",
            errmsg()
        );
        assert_eq!(sw_accept(p.listener, 5_000_000_000, &mut p.server), SW_OK);
    }
    p
}

impl Drop for Pair {
    fn drop(&mut self) {
        // SAFETY: live handles, closed once each (one closed by a test is NULL).
        unsafe {
            for c in [self.client, self.server] {
                if !c.is_null() {
                    assert_eq!(sw_conn_close(c), SW_OK);
                }
            }
            assert_eq!(sw_listener_close(self.listener), SW_OK);
            assert_eq!(sw_engine_close(self.engine), SW_OK);
        }
    }
}

/// Offers `data` on `conn`, retrying (bounded) while back-pressured.
fn offer(conn: *mut sw_conn, data: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: a live handle; `data` is readable.
        let r = unsafe { sw_offer(conn, data.as_ptr().cast(), data.len()) };
        if r > 0 {
            return;
        }
        assert_eq!(r, i64::from(SW_BACK_PRESSURED), "{}", errmsg());
        assert!(Instant::now() < deadline, "offer timed out");
        // SAFETY: as above.
        assert_eq!(unsafe { sw_flush(conn) }, SW_OK);
    }
}

/// Holds the next message of `conn` (bounded wait).
fn hold(conn: *mut sw_conn) -> sw_msg {
    // SAFETY: `sw_msg` is plain data.
    let mut m: sw_msg = unsafe { std::mem::zeroed() };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: a live handle and a writable `sw_msg`.
        match unsafe { sw_hold(conn, &mut m) } {
            1 => return m,
            0 => assert!(Instant::now() < deadline, "hold timed out"),
            r => panic!("sw_hold: {r} {}", errmsg()),
        }
    }
}

fn bytes(m: &sw_msg) -> &[u8] {
    // SAFETY: a held message: `len` readable bytes at `data` until released.
    unsafe { std::slice::from_raw_parts(m.data, m.len) }
}

fn payload(seq: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seq.wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

#[test]
fn held_messages_outlive_the_call_and_forward() {
    let p = pair("fwd", 8);
    // Inline (on shm: in the ring record, copied into the table) and pool-buffer messages.
    let sent = [
        payload(1, 16),
        payload(2, 300),
        payload(3, 0),
        payload(4, 120),
    ];
    for m in &sent {
        offer(p.client, m);
    }
    let held: Vec<sw_msg> = (0..sent.len()).map(|_| hold(p.server)).collect();
    // SAFETY: live handles throughout; each message is released once.
    unsafe {
        assert_eq!(sw_conn_outstanding(p.server), 4);
        assert_eq!(sw_conn_max_held(p.server), 8);
        // Every message is intact while the others arrive and are held after it.
        for (m, want) in held.iter().zip(&sent) {
            assert_eq!(bytes(m), &want[..]);
            assert_eq!(m.conn, p.server);
        }
        // Forward each one back without copying it into the application first.
        for m in &held {
            offer(p.server, bytes(m));
        }
        for mut m in held {
            assert_eq!(sw_release(&mut m), SW_OK);
            assert!(m.data.is_null() && m.token == 0, "spent");
            assert_eq!(sw_release(&mut m), SW_BAD_ARG, "released twice");
            assert!(errmsg().contains("stale message"), "{}", errmsg());
        }
        assert_eq!(sw_conn_outstanding(p.server), 0);
        for want in &sent {
            let mut m = hold(p.client);
            assert_eq!(bytes(&m), &want[..]);
            assert_eq!(sw_release(&mut m), SW_OK);
        }
    }
}

#[test]
fn holding_is_bounded_by_the_pool() {
    let p = pair("bound", 8);
    // SAFETY: live handles throughout; each message is released once.
    unsafe {
        let max = sw_conn_max_held(p.server) as usize;
        assert_eq!(max, 8);
        // Inline messages: the bound is the table (the ring slots are free again).
        for i in 0..max {
            offer(p.client, &payload(i as u8, 8));
        }
        let mut held: Vec<sw_msg> = (0..max).map(|_| hold(p.server)).collect();
        // Their ring slots are free again: one more message is sent, but not taken.
        offer(p.client, &payload(max as u8, 8));
        let mut extra: sw_msg = std::mem::zeroed();
        assert_eq!(sw_hold(p.server, &mut extra), SW_BACK_PRESSURED);
        assert!(errmsg().contains("release one"), "{}", errmsg());
        assert_eq!(sw_release(&mut held[0]), SW_OK);
        let mut last = hold(p.server);
        assert_eq!(bytes(&last), &payload(max as u8, 8)[..], "nothing was lost");
        assert_eq!(sw_release(&mut last), SW_OK);
        for m in &mut held[1..] {
            assert_eq!(sw_release(m), SW_OK);
        }
        // Pool-buffer messages: holding them all back-pressures the sender.
        for i in 0..max {
            offer(p.client, &payload(i as u8, 300));
        }
        let mut held: Vec<sw_msg> = (0..max).map(|_| hold(p.server)).collect();
        let big = payload(9, 300);
        let r = sw_offer(p.client, big.as_ptr().cast(), big.len());
        assert_eq!(r, i64::from(SW_BACK_PRESSURED), "{}", errmsg());
        assert_eq!(sw_release(&mut held[0]), SW_OK);
        offer(p.client, &big);
        let mut last = hold(p.server);
        assert_eq!(bytes(&last), &big[..]);
        assert_eq!(sw_release(&mut last), SW_OK);
        for m in &mut held[1..] {
            assert_eq!(sw_release(m), SW_OK);
        }
    }
}

unsafe extern "C" fn hold_inside(clientd: *mut c_void, _data: *const u8, _len: usize) {
    // SAFETY: `clientd` is the `(conn, result)` pair passed to `sw_poll`.
    unsafe {
        let (conn, result) = &mut *clientd.cast::<(*mut sw_conn, i32)>();
        let mut m: sw_msg = std::mem::zeroed();
        *result = sw_hold(*conn, &mut m);
    }
}

#[test]
fn hold_is_refused_inside_a_poll_handler_and_close_releases() {
    let mut p = pair("close", 8);
    offer(p.client, b"one");
    offer(p.client, &payload(2, 300));
    offer(p.client, b"three");
    let mut ctx = (p.server, 1i32);
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: live handles; `hold_inside` matches `clientd`.
    unsafe {
        while sw_poll(
            p.server,
            Some(hold_inside),
            ptr::addr_of_mut!(ctx).cast(),
            1,
        ) == 0
        {
            assert!(Instant::now() < deadline);
        }
        assert_eq!(ctx.1, SW_BAD_ARG);
        let _a = hold(p.server);
        let _b = hold(p.server);
        assert_eq!(sw_conn_outstanding(p.server), 2);
        // Closing with messages held releases them.
        assert_eq!(sw_conn_close(p.server), SW_OK);
        p.server = ptr::null_mut();
        // The peer sees the close.
        let mut m: sw_msg = std::mem::zeroed();
        let deadline = Instant::now() + Duration::from_secs(10);
        let r = loop {
            let r = sw_hold(p.client, &mut m);
            if r != 0 {
                break r;
            }
            assert!(Instant::now() < deadline);
        };
        assert_eq!(r, SW_CLOSED, "{}", errmsg());
    }
}

#[test]
fn every_config_range_is_checked() {
    type Set = fn(&mut sw_config);
    let cases: &[(&str, Set)] = &[
        ("buffer_size", |c| c.buffer_size = 0),
        ("buffer_size", |c| c.buffer_size = SW_MAX_BUFFER_SIZE + 1),
        ("buffers", |c| c.buffers = 0),
        ("buffers", |c| c.buffers = SW_MAX_BUFFERS + 1),
        ("depth", |c| c.depth = c.buffers + 1),
        ("batch", |c| c.batch = 0),
        ("batch", |c| c.batch = SW_MAX_BATCH + 1),
        ("inline_threshold", |c| {
            c.inline_threshold = SW_INLINE_MAX + 1
        }),
        ("inline_threshold", |c| c.inline_threshold = 500),
        ("idle", |c| c.idle = 7),
        ("connect_timeout_ns", |c| c.connect_timeout_ns = 0),
        ("liveness_timeout_ns", |c| {
            c.liveness_timeout_ns = SW_MIN_LIVENESS_TIMEOUT_NS - 1
        }),
        ("max_connections_per_poller", |c| {
            c.max_connections_per_poller = 0
        }),
        ("max_connections_per_poller", |c| {
            c.max_connections_per_poller = SW_MAX_CONNECTIONS_PER_POLLER + 1
        }),
        ("max_message_size", |c| c.max_message_size = 0),
        ("max_message_size", |c| {
            c.max_message_size = SW_MAX_MESSAGE_SIZE + 1
        }),
        ("large_buffers", |c| {
            c.large_buffers = SW_MAX_LARGE_BUFFERS + 1
        }),
    ];
    for (field, set) in cases {
        let mut cfg = sw_config::default();
        set(&mut cfg);
        let mut e = ptr::null_mut();
        // SAFETY: a valid config and out pointer.
        let r = unsafe { sw_engine_new(&cfg, &mut e) };
        assert_eq!(r, SW_BAD_CONFIG, "{field}: {}", errmsg());
        let msg = errmsg();
        assert!(
            msg.starts_with(&format!("sw_engine_new: sw_config.{field} = ")),
            "{msg}"
        );
        assert!(msg.contains("out of range: must be"), "{msg}");
        assert!(e.is_null());
    }
    // The edges themselves are accepted.
    let edges: &[Set] = &[
        |c| c.inline_threshold = SW_INLINE_MAX,
        |c| c.inline_threshold = 0,
        |c| c.liveness_timeout_ns = 0,
        |c| c.liveness_timeout_ns = SW_MIN_LIVENESS_TIMEOUT_NS,
        |c| c.batch = SW_MAX_BATCH,
        |c| c.depth = c.buffers,
        |c| c.large_buffers = 0,
    ];
    for set in edges {
        let mut cfg = sw_config::default();
        set(&mut cfg);
        let mut e = ptr::null_mut();
        // SAFETY: a valid config and out pointer; the engine is closed once.
        unsafe {
            assert_eq!(sw_engine_new(&cfg, &mut e), SW_OK, "{}", errmsg());
            assert_eq!(sw_engine_close(e), SW_OK);
        }
    }
}
