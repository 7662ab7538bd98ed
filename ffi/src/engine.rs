//! The engine handle: `sw_engine_new` / `sw_engine_close`, `sw_listen`, `sw_connect`,
//! `sw_engine_poll`, `sw_next_event` and the engine's counters.

use std::ffi::c_char;

use spinwire_rs::{AbortReason, Engine, Error, Event, FabricError};

use crate::config::{builder, sw_config};
use crate::conn::{sw_conn, sw_listener, Slots};
use crate::error::{fail, guard, SW_OK};
use crate::handle::{c_str, check, code, destroy, out_ptr, timeout, Tagged};

/// An engine: its control thread, its pollers (or the run-to-completion poller) and the fabrics.
/// Opaque; made by `sw_engine_new`, freed by `sw_engine_close`.
///
/// Thread-safe: any thread may use an engine handle at the same time as others (but no thread
/// may use it while or after another closes it).
#[allow(non_camel_case_types)]
pub struct sw_engine {
    tag: u64,
    pub(crate) engine: Engine,
    /// The table sizes of each of its connections.
    pub(crate) slots: Slots,
}

impl Tagged for sw_engine {
    const MAGIC: u64 = u64::from_le_bytes(*b"swENGINE");
    const NAME: &'static str = "sw_engine";
    fn tag(this: *const Self) -> *const u64 {
        // SAFETY: only the field's address is computed; nothing is read.
        unsafe { std::ptr::addr_of!((*this).tag) }
    }
}

/// Starts an engine with `cfg` (NULL: the defaults) and stores its handle in `*out`.
///
/// Returns `SW_OK`, `SW_BAD_CONFIG`, `SW_SETUP_FAILED` (a thread could not be started) or
/// `SW_BAD_ARG`.
///
/// # Safety
///
/// `cfg` is NULL or points to a valid `sw_config` (its `poller_cores` pointing to `poller_count`
/// entries, its `name` NULL or a NUL-terminated string); `out` points to writable memory for
/// one pointer.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_engine_new(cfg: *const sw_config, out: *mut *mut sw_engine) -> i32 {
    const WHAT: &str = "sw_engine_new";
    guard(WHAT, || {
        code((|| {
            out_ptr(WHAT, "out", out)?;
            let cfg = if cfg.is_null() {
                sw_config::default()
            } else {
                // SAFETY: non-null; a valid `sw_config` per the contract (plain data, `Copy`).
                unsafe { cfg.read_unaligned() }
            };
            // SAFETY: the pointers in `cfg` are valid per the contract.
            let b = unsafe { builder(WHAT, &cfg) }?;
            let engine = b.build().map_err(|e| fail(WHAT, &e))?;
            let h = Box::new(sw_engine {
                tag: sw_engine::MAGIC,
                engine,
                slots: Slots {
                    claims: cfg.buffers.saturating_add(cfg.large_buffers),
                    held: cfg.buffers.saturating_add(cfg.large_buffers),
                },
            });
            // SAFETY: checked non-null and aligned; writable per the contract.
            unsafe { out.write(Box::into_raw(h)) };
            Ok(())
        })())
    })
}

/// Closes an engine handle. Connections and listeners made from it stay usable (each holds the
/// engine); the engine shuts down (pollers joined, control thread stopped) when the last of
/// them is closed too. Returns `SW_OK`, or `SW_BAD_ARG` for a NULL or closed handle.
///
/// # Safety
///
/// `engine` is NULL or a handle from `sw_engine_new` not closed before (a closed one is caught
/// while its memory is not reused, see the header's preamble); no other thread uses it during
/// or after the call.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_engine_close(engine: *mut sw_engine) -> i32 {
    const WHAT: &str = "sw_engine_close";
    guard(WHAT, || {
        // SAFETY: per the contract.
        code(unsafe { check(WHAT, engine) }.map(|_| {
            // SAFETY: checked live, from `Box::into_raw`; the reference above is not used again.
            unsafe { destroy(engine) }
        }))
    })
}

/// Listens on `endpoint` (`shm://name`, `tcp://host:port`, `rdma://host:port`) and stores the
/// listener in `*out`. Listening does not wait on anyone, so it takes no timeout; take
/// connections with `sw_accept`.
///
/// Returns `SW_OK`, `SW_BAD_ENDPOINT`, `SW_UNSUPPORTED`, `SW_SETUP_FAILED` (name in use, socket
/// errors), `SW_SHUTDOWN` or `SW_BAD_ARG`.
///
/// # Safety
///
/// `engine` is a live engine handle (NULL is caught); `endpoint` is NULL or a NUL-terminated
/// string; `out` points to writable memory for one pointer.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_listen(
    engine: *const sw_engine,
    endpoint: *const c_char,
    out: *mut *mut sw_listener,
) -> i32 {
    const WHAT: &str = "sw_listen";
    guard(WHAT, || {
        code((|| {
            // SAFETY: per the contract.
            let e = unsafe { check(WHAT, engine) }?;
            // SAFETY: per the contract.
            let ep = unsafe { c_str(WHAT, "endpoint", endpoint) }?;
            out_ptr(WHAT, "out", out)?;
            let l = e.engine.listen(ep).map_err(|err| fail(WHAT, &err))?;
            let h = sw_listener::new(l, e.slots);
            // SAFETY: checked non-null and aligned; writable per the contract.
            unsafe { out.write(h) };
            Ok(())
        })())
    })
}

/// Connects to `endpoint`, waiting up to `timeout_ns` (0: the configured connect timeout), and
/// stores the connection in `*out`. While nobody listens on the endpoint it waits for a
/// listener to appear.
///
/// Returns `SW_OK`, `SW_BAD_ENDPOINT`, `SW_UNSUPPORTED`, `SW_NOT_CONNECTED` (nobody listened
/// until the deadline, refused by the listener, handshake failed), `SW_TIMEOUT`, `SW_SETUP_FAILED`, `SW_SHUTDOWN` or `SW_BAD_ARG`.
///
/// # Safety
///
/// As `sw_listen`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_connect(
    engine: *const sw_engine,
    endpoint: *const c_char,
    timeout_ns: u64,
    out: *mut *mut sw_conn,
) -> i32 {
    const WHAT: &str = "sw_connect";
    guard(WHAT, || {
        code((|| {
            // SAFETY: per the contract.
            let e = unsafe { check(WHAT, engine) }?;
            // SAFETY: per the contract.
            let ep = unsafe { c_str(WHAT, "endpoint", endpoint) }?;
            out_ptr(WHAT, "out", out)?;
            let r = if timeout_ns == 0 {
                e.engine.connect(ep)
            } else {
                e.engine.connect_timeout(ep, timeout(timeout_ns))
            };
            let c = r.map_err(|err| fail(WHAT, &err))?;
            let h = sw_conn::new(c, e.slots);
            // SAFETY: checked non-null and aligned; writable per the contract.
            unsafe { out.write(h) };
            Ok(())
        })())
    })
}

/// Runs one poller cycle on this thread (run-to-completion mode) and returns the work it did
/// (0: nothing to do). With dedicated pollers, or while another thread runs the cycle, it
/// returns 0 at once. Never blocks; allocates nothing.
///
/// Returns the work done (>= 0) or `SW_BAD_ARG`.
///
/// # Safety
///
/// `engine` is a live engine handle (NULL is caught).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_engine_poll(engine: *const sw_engine) -> i64 {
    const WHAT: &str = "sw_engine_poll";
    guard(WHAT, || {
        // SAFETY: per the contract.
        match unsafe { check(WHAT, engine) } {
            Ok(e) => e.engine.poll() as i64,
            Err(c) => i64::from(c),
        }
    })
}

/// Event kind: a connection was established (`conn_id`, `peer`).
pub const SW_EVENT_CONNECTED: u32 = 1;
/// Event kind: the peer of `conn_id` went away.
pub const SW_EVENT_DISCONNECTED: u32 = 2;
/// Event kind: the peer of `conn_id` was silent for the liveness timeout (`silent_for_ns`); the
/// connection failed and is closed.
pub const SW_EVENT_PEER_UNRESPONSIVE: u32 = 3;
/// Event kind: a connection (`has_conn`) or a listener failed; `code` says how, and the message
/// with its cause chain is in `sw_errmsg()`.
pub const SW_EVENT_ERROR: u32 = 4;
/// Event kind: an event this version of the C API does not know.
pub const SW_EVENT_OTHER: u32 = 5;

/// Disconnect reason (`sw_event.reason`): none (a connection established, or an error that
/// took no connection down).
pub const SW_REASON_NONE: u32 = 0;
/// Disconnect reason: the peer closed the connection, or its process died
/// (`SW_EVENT_DISCONNECTED`; the connection's calls return `SW_CLOSED`).
pub const SW_REASON_PEER_CLOSED: u32 = 1;
/// Disconnect reason: the peer was silent for the liveness timeout
/// (`SW_EVENT_PEER_UNRESPONSIVE`; calls return `SW_CONN_FAILED`).
pub const SW_REASON_PEER_UNRESPONSIVE: u32 = 2;
/// Disconnect reason: the peer broke the protocol (`SW_EVENT_ERROR`, `SW_CONN_FAILED`).
pub const SW_REASON_PROTOCOL: u32 = 3;
/// Disconnect reason: the fabric reported an I/O error (`SW_EVENT_ERROR`, `SW_CONN_FAILED`).
pub const SW_REASON_IO: u32 = 4;
/// Disconnect reason: the peer aborted the connection because it heard nothing from this side
/// for its liveness timeout (this process was stopped or did not serve the connection; on the
/// peer's side it was `SW_REASON_PEER_UNRESPONSIVE`). `SW_EVENT_ERROR`, `SW_CONN_FAILED`.
/// shm and tcp carry it; over rdma this side sees `SW_REASON_PEER_CLOSED`.
pub const SW_REASON_ABORTED_UNRESPONSIVE: u32 = 5;
/// Disconnect reason: the peer aborted the connection because this side broke the protocol
/// (on the peer's side it was `SW_REASON_PROTOCOL`). `SW_EVENT_ERROR`, `SW_CONN_FAILED`.
pub const SW_REASON_ABORTED_PROTOCOL: u32 = 6;
/// Disconnect reason: one this version of the C API does not know.
pub const SW_REASON_OTHER: u32 = 7;

/// Bytes of `sw_event.peer`, the terminating NUL included.
pub const SW_EVENT_PEER_LEN: usize = 256;

/// A connection-level event (plain data), filled by `sw_next_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct sw_event {
    /// One of the `SW_EVENT_*` kinds.
    pub kind: u32,
    /// `SW_EVENT_ERROR`: the error's code; `SW_OK` otherwise.
    pub code: i32,
    /// Whether `conn_id` names a connection.
    pub has_conn: bool,
    /// Why the connection went down: one of the `SW_REASON_*` values (`SW_REASON_NONE` for
    /// `SW_EVENT_CONNECTED` and for errors that took no connection down). Added in the padding
    /// after `has_conn`: the struct's size and the other fields' offsets are unchanged.
    pub reason: u32,
    /// The connection's id (as `sw_conn_id`).
    pub conn_id: u64,
    /// `SW_EVENT_PEER_UNRESPONSIVE`: how long the peer had been silent.
    pub silent_for_ns: u64,
    /// `SW_EVENT_CONNECTED`: the endpoint, NUL-terminated (truncated to fit); empty otherwise.
    pub peer: [c_char; SW_EVENT_PEER_LEN],
}

/// The `SW_REASON_*` of an error event's error.
fn reason_of(e: &Error) -> u32 {
    match e {
        Error::Disconnected | Error::Fabric(FabricError::PeerClosed) => SW_REASON_PEER_CLOSED,
        Error::Fabric(FabricError::PeerUnresponsive { .. }) => SW_REASON_PEER_UNRESPONSIVE,
        Error::Fabric(FabricError::Protocol(_)) => SW_REASON_PROTOCOL,
        Error::Fabric(FabricError::Io(_)) => SW_REASON_IO,
        Error::Fabric(FabricError::PeerAborted(AbortReason::Unresponsive)) => {
            SW_REASON_ABORTED_UNRESPONSIVE
        }
        Error::Fabric(FabricError::PeerAborted(AbortReason::Protocol)) => {
            SW_REASON_ABORTED_PROTOCOL
        }
        Error::Fabric(_) => SW_REASON_OTHER,
        _ => SW_REASON_NONE,
    }
}

fn event_to_c(ev: Event) -> sw_event {
    let mut out = sw_event {
        kind: SW_EVENT_OTHER,
        code: SW_OK,
        has_conn: false,
        reason: SW_REASON_NONE,
        conn_id: 0,
        silent_for_ns: 0,
        peer: [0; SW_EVENT_PEER_LEN],
    };
    match ev {
        Event::Connected { conn, peer, .. } => {
            out.kind = SW_EVENT_CONNECTED;
            out.has_conn = true;
            out.conn_id = conn;
            let n = peer.len().min(SW_EVENT_PEER_LEN - 1);
            for (d, s) in out.peer.iter_mut().zip(&peer.as_bytes()[..n]) {
                *d = *s as c_char;
            }
        }
        Event::Disconnected { conn } => {
            out.kind = SW_EVENT_DISCONNECTED;
            out.reason = SW_REASON_PEER_CLOSED;
            out.has_conn = true;
            out.conn_id = conn;
        }
        Event::PeerUnresponsive { conn, silent_for } => {
            out.kind = SW_EVENT_PEER_UNRESPONSIVE;
            out.reason = SW_REASON_PEER_UNRESPONSIVE;
            out.has_conn = true;
            out.conn_id = conn;
            out.silent_for_ns = u64::try_from(silent_for.as_nanos()).unwrap_or(u64::MAX);
        }
        Event::Error { conn, error } => {
            out.kind = SW_EVENT_ERROR;
            out.has_conn = conn.is_some();
            out.conn_id = conn.unwrap_or(0);
            out.reason = reason_of(&error);
            out.code = fail("sw_next_event (event)", &error);
        }
        _ => {}
    }
    out
}

/// Takes the next connection event, waiting up to `timeout_ns` for one (0: only look; in
/// run-to-completion mode the wait drives the poller). Returns 1 when an event was stored in
/// `*ev`, 0 when none came, or `SW_BAD_ARG`.
///
/// # Safety
///
/// `engine` is a live engine handle (NULL is caught); `ev` points to writable memory for one
/// `sw_event`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_next_event(
    engine: *const sw_engine,
    timeout_ns: u64,
    ev: *mut sw_event,
) -> i32 {
    const WHAT: &str = "sw_next_event";
    guard(WHAT, || {
        let r = (|| {
            // SAFETY: per the contract.
            let e = unsafe { check(WHAT, engine) }?;
            out_ptr(WHAT, "ev", ev)?;
            let next = if timeout_ns == 0 {
                e.engine.try_event()
            } else {
                match e.engine.event_timeout(timeout(timeout_ns)) {
                    Ok(ev) => Some(ev),
                    Err(Error::Timeout) => None,
                    Err(err) => return Err(fail(WHAT, &err)),
                }
            };
            Ok(next.map(|n| {
                // SAFETY: checked non-null and aligned; writable per the contract.
                unsafe { ev.write(event_to_c(n)) };
            }))
        })();
        match r {
            Ok(Some(())) => 1,
            Ok(None) => 0,
            Err(c) => c,
        }
    })
}

/// Engine-wide counters (plain data), summed over its pollers: `sw_engine_get_stats`.
///
/// shm connections do not pass through the pollers (their messages go straight through the
/// shared-memory rings, on the application's thread), so their traffic is not in `rx_msgs` /
/// `tx_msgs` / `tx_batches` / `tx_stalls` (0 for an engine that only serves shm): read it per
/// connection with `sw_conn_get_stats`. The connection counts (`connections_opened`,
/// `connections_closed`) include them.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct sw_engine_stats {
    /// Pollers (the run-to-completion poller counts as one).
    pub pollers: u64,
    /// Poller cycles run.
    pub cycles: u64,
    /// Cycles that did work.
    pub busy_cycles: u64,
    /// Cycles that found nothing to do.
    pub empty_cycles: u64,
    /// Commands taken from the control thread.
    pub commands: u64,
    /// Messages the pollers delivered to applications (shm connections bypass the pollers on
    /// their direct path: their counts are in `sw_conn_get_stats`).
    pub rx_msgs: u64,
    /// Messages the pollers posted to the fabrics (shm: see `rx_msgs`).
    pub tx_msgs: u64,
    /// Send batches posted (doorbells).
    pub tx_batches: u64,
    /// Times a fabric accepted fewer sends than offered.
    pub tx_stalls: u64,
    /// Times received messages waited for room in an application's receive ring.
    pub rx_ring_full: u64,
    /// Connections failed on the data path.
    pub conn_errors: u64,
    /// Connections served now.
    pub connections: u64,
    /// Events dropped because the application did not take them (`sw_next_event`).
    pub events_dropped: u64,
    /// Connections established since start.
    pub connections_opened: u64,
    /// Connections torn down since start.
    pub connections_closed: u64,
}

/// Stores a snapshot of the engine's counters in `*out` (the pollers' traffic: shm
/// connections' messages are not in it, see `sw_engine_stats`). Control path (it allocates
/// a little). Returns `SW_OK` or `SW_BAD_ARG`.
///
/// # Safety
///
/// `engine` is a live engine handle (NULL is caught); `out` points to writable memory for one
/// `sw_engine_stats`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_engine_get_stats(
    engine: *const sw_engine,
    out: *mut sw_engine_stats,
) -> i32 {
    const WHAT: &str = "sw_engine_get_stats";
    guard(WHAT, || {
        code((|| {
            // SAFETY: per the contract.
            let e = unsafe { check(WHAT, engine) }?;
            out_ptr(WHAT, "out", out)?;
            let c = e.engine.counters();
            let mut s = sw_engine_stats {
                pollers: c.pollers.len() as u64,
                events_dropped: c.events_dropped,
                connections_opened: c.connections_opened,
                connections_closed: c.connections_closed,
                ..sw_engine_stats::default()
            };
            for p in &c.pollers {
                s.cycles += p.cycles;
                s.busy_cycles += p.busy_cycles;
                s.empty_cycles += p.empty_cycles;
                s.commands += p.commands;
                s.rx_msgs += p.rx_msgs;
                s.tx_msgs += p.tx_msgs;
                s.tx_batches += p.tx_batches;
                s.tx_stalls += p.tx_stalls;
                s.rx_ring_full += p.rx_ring_full;
                s.conn_errors += p.conn_errors;
                s.connections += p.connections;
            }
            // SAFETY: checked non-null and aligned; writable per the contract.
            unsafe { out.write(s) };
            Ok(())
        })())
    })
}
