//! Why a connection went down, as C sees it: the event kind, its `code` and its `reason` tell
//! a peer's close, a silent peer and a protocol violation apart, on both sides. Driven through
//! the C API over `mem://` (two run-to-completion engines in this process), whose fault
//! injection (the Rust API's `Faults`) stalls an end or corrupts its next record.

use std::ffi::{CStr, CString};
use std::ptr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use spinwire::*;
use spinwire_rs::fabric::mem::{End, Faults};

/// The cases run one at a time: the liveness case is timed.
static SERIAL: Mutex<()> = Mutex::new(());

const LIVENESS_NS: u64 = 200_000_000;
const WAIT_NS: u64 = 10_000_000_000;

fn errmsg() -> String {
    // SAFETY: `sw_errmsg` returns a valid NUL-terminated string.
    unsafe { CStr::from_ptr(sw_errmsg()) }
        .to_string_lossy()
        .into_owned()
}

fn engine() -> *mut sw_engine {
    let mut cfg = sw_config::default();
    // SAFETY: valid config and out pointers.
    unsafe {
        assert_eq!(sw_config_init(&mut cfg), SW_OK);
        cfg.buffers = 16;
        cfg.buffer_size = 512;
        cfg.large_buffers = 0;
        cfg.idle = SW_IDLE_BACKOFF;
        cfg.liveness_timeout_ns = LIVENESS_NS;
        let mut e = ptr::null_mut();
        assert_eq!(sw_engine_new(&cfg, &mut e), SW_OK, "{}", errmsg());
        e
    }
}

/// Two engines and a connection between them over `mem://ffi-reasons-<tag>`.
struct Pair {
    endpoint: String,
    server_engine: *mut sw_engine,
    client_engine: *mut sw_engine,
    listener: *mut sw_listener,
    server: *mut sw_conn,
    client: *mut sw_conn,
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let endpoint = format!("mem://ffi-reasons-{tag}-{}", std::process::id());
        let name = CString::new(endpoint.clone()).unwrap();
        let mut p = Pair {
            endpoint,
            server_engine: engine(),
            client_engine: engine(),
            listener: ptr::null_mut(),
            server: ptr::null_mut(),
            client: ptr::null_mut(),
        };
        // SAFETY: live engine handles, valid out pointers.
        unsafe {
            assert_eq!(
                sw_listen(p.server_engine, name.as_ptr(), &mut p.listener),
                SW_OK,
                "{}",
                errmsg()
            );
            assert_eq!(
                sw_connect(p.client_engine, name.as_ptr(), WAIT_NS, &mut p.client),
                SW_OK,
                "{}",
                errmsg()
            );
            assert_eq!(
                sw_accept(p.listener, WAIT_NS, &mut p.server),
                SW_OK,
                "{}",
                errmsg()
            );
        }
        p
    }

    fn faults(&self) -> Faults {
        Faults::latest(&self.endpoint).expect("the pair's mem:// connection")
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // SAFETY: live handles, closed once each (NULL when a case closed one already).
        unsafe {
            for c in [self.client, self.server] {
                if !c.is_null() {
                    assert_eq!(sw_conn_close(c), SW_OK);
                }
            }
            assert_eq!(sw_listener_close(self.listener), SW_OK);
            assert_eq!(sw_engine_close(self.server_engine), SW_OK);
            assert_eq!(sw_engine_close(self.client_engine), SW_OK);
        }
    }
}

unsafe extern "C" fn ignore(_clientd: *mut std::ffi::c_void, _data: *const u8, _len: usize) {}

/// Sends one 8-byte message on `conn`.
fn offer(conn: *mut sw_conn) {
    // SAFETY: a live handle; 8 readable bytes.
    let r = unsafe { sw_offer(conn, [7u8; 8].as_ptr().cast(), 8) };
    assert!(r > 0, "sw_offer: {r} {}", errmsg());
}

/// Polls `conn` until a call fails (bounded) and returns the code.
fn failed_code(conn: *mut sw_conn) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: a live handle; `ignore` takes any message.
        let r = unsafe { sw_poll(conn, Some(ignore), ptr::null_mut(), 16) };
        if r < 0 {
            return r;
        }
        assert!(Instant::now() < deadline, "the connection stayed up");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The next event of `engine` about connection `conn` other than `SW_EVENT_CONNECTED`
/// (bounded).
fn event_for(engine: *mut sw_engine, conn: *mut sw_conn) -> sw_event {
    // SAFETY: a live handle.
    let id = unsafe { sw_conn_id(conn) };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: all-zero bytes are a valid `sw_event` (integers, a bool, a char array).
        let mut ev: sw_event = unsafe { std::mem::zeroed() };
        // SAFETY: a live handle and a writable event.
        let r = unsafe { sw_next_event(engine, 10_000_000, &mut ev) };
        assert!(r >= 0, "sw_next_event: {r} {}", errmsg());
        if r == 1 && ev.kind != SW_EVENT_CONNECTED && ev.has_conn && ev.conn_id == id {
            return ev;
        }
        assert!(Instant::now() < deadline, "no event for connection {id}");
    }
}

/// The peer closes: `SW_CLOSED`, and `SW_EVENT_DISCONNECTED` with `SW_REASON_PEER_CLOSED`.
#[test]
fn a_peer_close_is_disconnected_with_its_reason() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut p = Pair::new("close");
    // SAFETY: a live handle, closed once (and forgotten).
    assert_eq!(unsafe { sw_conn_close(p.client) }, SW_OK);
    p.client = ptr::null_mut();
    assert_eq!(failed_code(p.server), i64::from(SW_CLOSED));
    let ev = event_for(p.server_engine, p.server);
    assert_eq!(
        (ev.kind, ev.reason, ev.code),
        (SW_EVENT_DISCONNECTED, SW_REASON_PEER_CLOSED, SW_OK)
    );
}

/// A silent peer: the checker gets `SW_EVENT_PEER_UNRESPONSIVE` (`SW_REASON_PEER_UNRESPONSIVE`,
/// `silent_for_ns` at least the timeout); the silent side, resumed, gets `SW_CONN_FAILED` and
/// `SW_EVENT_ERROR` with `SW_REASON_ABORTED_UNRESPONSIVE`.
#[test]
fn a_silent_peer_is_told_why_both_sides_failed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pair::new("stall");
    offer(p.client);
    let faults = p.faults();
    faults.stall(End::Connecting);
    let ev = event_for(p.server_engine, p.server);
    assert_eq!(
        (ev.kind, ev.reason),
        (SW_EVENT_PEER_UNRESPONSIVE, SW_REASON_PEER_UNRESPONSIVE)
    );
    assert!(ev.silent_for_ns >= LIVENESS_NS, "{}", ev.silent_for_ns);
    assert_eq!(failed_code(p.server), i64::from(SW_CONN_FAILED));
    faults.resume(End::Connecting);
    assert_eq!(failed_code(p.client), i64::from(SW_CONN_FAILED));
    assert!(errmsg().contains("peer aborted"), "{}", errmsg());
    let ev = event_for(p.client_engine, p.client);
    assert_eq!(
        (ev.kind, ev.code, ev.reason),
        (
            SW_EVENT_ERROR,
            SW_CONN_FAILED,
            SW_REASON_ABORTED_UNRESPONSIVE
        )
    );
}

/// A protocol violation: the checker gets `SW_EVENT_ERROR` with `SW_REASON_PROTOCOL`, the
/// violator `SW_EVENT_ERROR` with `SW_REASON_ABORTED_PROTOCOL`; both calls `SW_CONN_FAILED`.
#[test]
fn a_protocol_violation_is_told_to_both_sides() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let p = Pair::new("corrupt");
    p.faults().corrupt_next(End::Connecting);
    offer(p.client);
    assert_eq!(failed_code(p.server), i64::from(SW_CONN_FAILED));
    let ev = event_for(p.server_engine, p.server);
    assert_eq!(
        (ev.kind, ev.code, ev.reason),
        (SW_EVENT_ERROR, SW_CONN_FAILED, SW_REASON_PROTOCOL)
    );
    assert_eq!(failed_code(p.client), i64::from(SW_CONN_FAILED));
    let ev = event_for(p.client_engine, p.client);
    assert_eq!(
        (ev.kind, ev.code, ev.reason),
        (SW_EVENT_ERROR, SW_CONN_FAILED, SW_REASON_ABORTED_PROTOCOL)
    );
}

/// `reason` sits in the padding after `has_conn`: the layout C programs built against the
/// header before it was added still read correctly.
#[test]
fn the_event_layout_is_unchanged_by_the_reason() {
    assert_eq!(std::mem::size_of::<sw_event>(), 288);
    assert_eq!(std::mem::offset_of!(sw_event, has_conn), 8);
    assert_eq!(std::mem::offset_of!(sw_event, reason), 12);
    assert_eq!(std::mem::offset_of!(sw_event, conn_id), 16);
    assert_eq!(std::mem::offset_of!(sw_event, silent_for_ns), 24);
    assert_eq!(std::mem::offset_of!(sw_event, peer), 32);
}
