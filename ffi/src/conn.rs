//! The listener and connection handles and the data path: `sw_accept`, `sw_offer`,
//! `sw_try_claim` / `sw_claim_commit` / `sw_claim_abort`, `sw_poll`, `sw_flush`, the
//! connection's counters.
//!
//! The data-path calls allocate nothing and take no lock: they check the handle's tag and call
//! the Rust connection's methods; only a failure writes the thread-local error message (whose
//! buffer keeps its capacity, so after a thread's first failures that allocates nothing either).

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_void;

use spinwire_rs::{Connection, Error, Listener, SendError};

use crate::claim::Claims;
use crate::error::{fail, fail_msg, guard, SW_BAD_ARG, SW_OK, SW_TIMEOUT};
use crate::handle::{check, code, destroy, out_ptr, timeout, Tagged};
use crate::held::Held;

/// The table sizes of a connection handle, fixed by its engine's configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slots {
    /// Claim slots: the send buffers and large slots (the ring claim, shm's, has a slot of its
    /// own, so it may be open while every pool buffer is claimed too).
    pub(crate) claims: usize,
    /// Messages the application may hold (`sw_hold`): the receive buffers and large slots.
    pub(crate) held: usize,
}

/// A listening endpoint. Opaque; made by `sw_listen`, freed by `sw_listener_close`. Use it
/// from one thread at a time.
#[allow(non_camel_case_types)]
pub struct sw_listener {
    tag: u64,
    listener: Listener,
    slots: Slots,
}

impl Tagged for sw_listener {
    const MAGIC: u64 = u64::from_le_bytes(*b"swLISTEN");
    const NAME: &'static str = "sw_listener";
    fn tag(this: *const Self) -> *const u64 {
        // SAFETY: only the field's address is computed; nothing is read.
        unsafe { std::ptr::addr_of!((*this).tag) }
    }
}

impl sw_listener {
    pub(crate) fn new(listener: Listener, slots: Slots) -> *mut sw_listener {
        Box::into_raw(Box::new(sw_listener {
            tag: Self::MAGIC,
            listener,
            slots,
        }))
    }
}

/// Takes the next connection of `listener`, waiting up to `timeout_ns` (0: only look), and
/// stores it in `*out`. Returns `SW_OK`, `SW_TIMEOUT` (none came), `SW_SHUTDOWN` or `SW_BAD_ARG`.
///
/// # Safety
///
/// `listener` is a live listener handle (NULL is caught); `out` points to writable memory for
/// one pointer.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_accept(
    listener: *const sw_listener,
    timeout_ns: u64,
    out: *mut *mut sw_conn,
) -> i32 {
    const WHAT: &str = "sw_accept";
    guard(WHAT, || {
        code((|| {
            // SAFETY: per the contract.
            let l = unsafe { check(WHAT, listener) }?;
            out_ptr(WHAT, "out", out)?;
            let c = if timeout_ns == 0 {
                match l.listener.try_accept() {
                    Ok(Some(c)) => c,
                    Ok(None) => return Err(fail_msg(WHAT, SW_TIMEOUT, "no connection is waiting")),
                    Err(e) => return Err(fail(WHAT, &e)),
                }
            } else {
                l.listener
                    .accept_timeout(timeout(timeout_ns))
                    .map_err(|e| fail(WHAT, &e))?
            };
            // SAFETY: checked non-null and aligned; writable per the contract.
            unsafe { out.write(sw_conn::new(c, l.slots)) };
            Ok(())
        })())
    })
}

/// Stops listening and frees the handle (connections accepted from it stay open). Returns
/// `SW_OK`, or `SW_BAD_ARG` for a NULL or closed handle.
///
/// # Safety
///
/// `listener` is NULL or a live listener handle; it is not used during or after the call.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_listener_close(listener: *mut sw_listener) -> i32 {
    const WHAT: &str = "sw_listener_close";
    guard(WHAT, || {
        // SAFETY: per the contract.
        code(unsafe { check(WHAT, listener) }.map(|_| {
            // SAFETY: checked live, from `Box::into_raw`; the reference above is not used again.
            unsafe { destroy(listener) }
        }))
    })
}

/// A connection. Opaque; made by `sw_connect` or `sw_accept`, freed by `sw_conn_close`.
///
/// Use it from one thread at a time (it may move between threads between calls), like the Rust
/// `Connection` (`Send`, not `Sync`).
//
// Invariants: the handle never moves (it lives in its `Box` until closed); every `SendBuf` in
// `claims` and every `Message` in `held` borrows `conn`, and all of them are dropped before
// `conn` is (by `sw_conn_close`, and by field order should the box be dropped another way):
// dropping a pool buffer returns it to `conn`'s pool, dropping a ring claim aborts it in
// `conn`'s ring, dropping a message recycles its receive buffer, so `conn` must still be alive
// then; the handle is only ever accessed through shared references (its mutable parts are
// `Cell`s / `UnsafeCell`s), so those shared borrows of `conn` stay valid.
#[allow(non_camel_case_types)]
pub struct sw_conn {
    tag: u64,
    /// Set while `sw_poll` runs its handler: closing the connection (and `sw_hold`) then is
    /// refused.
    pub(crate) in_poll: Cell<bool>,
    /// How many `sw_offer_in_place` writers of this connection are running on its thread (one,
    /// or more when a writer offers in place again): closing the connection then is refused.
    pub(crate) in_write: Cell<u32>,
    /// Messages sent through this handle (the value `sw_offer` / `sw_claim_commit` return).
    sent: Cell<u64>,
    max_message_size: usize,
    /// The pool's buffer size: larger messages take a large slot.
    buffer_size: usize,
    /// Declared before `conn`: dropped first.
    claims: UnsafeCell<Claims>,
    /// The messages the application holds (`sw_hold`). Declared before `conn`: dropped first.
    pub(crate) held: UnsafeCell<Held>,
    pub(crate) conn: Connection,
}

impl Tagged for sw_conn {
    const MAGIC: u64 = u64::from_le_bytes(*b"swCONNEC");
    const NAME: &'static str = "sw_conn";
    fn tag(this: *const Self) -> *const u64 {
        // SAFETY: only the field's address is computed; nothing is read.
        unsafe { std::ptr::addr_of!((*this).tag) }
    }
}

impl sw_conn {
    pub(crate) fn new(conn: Connection, sizes: Slots) -> *mut sw_conn {
        Box::into_raw(Box::new(sw_conn {
            tag: Self::MAGIC,
            in_poll: Cell::new(false),
            in_write: Cell::new(0),
            sent: Cell::new(0),
            max_message_size: conn.max_message_size(),
            buffer_size: conn.buffer_size(),
            claims: UnsafeCell::new(Claims::new(sizes.claims)),
            held: UnsafeCell::new(Held::new(sizes.held)),
            conn,
        }))
    }

    /// The claim table.
    ///
    /// # Safety
    ///
    /// No other reference to the table is live while the returned one is used (the handle is
    /// used by one thread at a time, and no call made while it is used re-enters this
    /// connection's claim calls).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn claims(&self) -> &mut Claims {
        // SAFETY: exclusive per the caller's contract.
        unsafe { &mut *self.claims.get() }
    }

    #[inline]
    pub(crate) fn count_sent(&self) -> i64 {
        let n = self.sent.get() + 1;
        self.sent.set(n);
        n as i64
    }
}

/// Closes the connection (the peer sees `SW_CLOSED`) and frees the handle. Outstanding claims
/// (pool buffers and an open ring claim) are aborted and held messages (`sw_hold`) released
/// first, before the connection itself is dropped: their `sw_claim`s and `sw_msg`s become
/// invalid with the handle, and the peer sees none of the claims. Sends queued by
/// `sw_offer` / `sw_claim_commit` are posted first, best effort; call `sw_flush` and let the peer
/// acknowledge if every message must arrive.
///
/// Returns `SW_OK`, or `SW_BAD_ARG` for a NULL or closed handle or when called from inside this
/// connection's own `sw_poll` handler or `sw_offer_in_place` writer (the connection is then
/// left open).
///
/// # Safety
///
/// `conn` is NULL or a live connection handle; it is not used during or after the call (other
/// than by the `sw_poll` or `sw_offer_in_place` that may be running on this thread, which is
/// caught).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_conn_close(conn: *mut sw_conn) -> i32 {
    const WHAT: &str = "sw_conn_close";
    guard(WHAT, || {
        code((|| {
            // SAFETY: per the contract.
            let h = unsafe { check(WHAT, conn) }?;
            if h.in_poll.get() {
                return Err(fail_msg(
                    WHAT,
                    SW_BAD_ARG,
                    "called from inside this connection's sw_poll handler",
                ));
            }
            if h.in_write.get() > 0 {
                return Err(fail_msg(
                    WHAT,
                    SW_BAD_ARG,
                    "called from inside this connection's sw_offer_in_place writer",
                ));
            }
            crate::claim::abort_all(h);
            crate::held::release_all(h);
            // SAFETY: checked live, from `Box::into_raw`; no claim or held message borrows
            // `conn` any more and `h` is not used again.
            unsafe { destroy(conn) };
            Ok(())
        })())
    })
}

/// The largest message the connection carries, or `SW_BAD_ARG`: `sw_config.max_message_size`
/// when the engine has large slots (`large_buffers` > 0 and `max_message_size` >
/// `buffer_size`), else `buffer_size` (tcp may settle a smaller limit with its peer). With the
/// defaults, 16 MiB.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_conn_max_message_size(conn: *const sw_conn) -> i64 {
    const WHAT: &str = "sw_conn_max_message_size";
    guard(WHAT, || {
        // SAFETY: per the contract.
        match unsafe { check(WHAT, conn) } {
            Ok(h) => h.max_message_size as i64,
            Err(c) => i64::from(c),
        }
    })
}

/// The connection's engine-wide id (as in `sw_event.conn_id`), or 0 for a NULL or invalid
/// handle (ids start at 1).
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_conn_id(conn: *const sw_conn) -> u64 {
    const WHAT: &str = "sw_conn_id";
    guard(WHAT, || {
        // SAFETY: per the contract.
        match unsafe { check(WHAT, conn) } {
            Ok(h) => Id(h.conn.id()),
            Err(_) => Id(0),
        }
    })
    .0
}

/// `u64` wrapper so `guard` (which returns a code on panic) can be used: a panic gives id 0.
struct Id(u64);

impl From<i32> for Id {
    fn from(_: i32) -> Id {
        Id(0)
    }
}

/// 1 while the connection is open, 0 once it is closed or failed, `SW_BAD_ARG` for a bad handle.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_conn_is_open(conn: *const sw_conn) -> i32 {
    const WHAT: &str = "sw_conn_is_open";
    guard(WHAT, || {
        // SAFETY: per the contract.
        match unsafe { check(WHAT, conn) } {
            Ok(h) => i32::from(h.conn.is_open()),
            Err(c) => c,
        }
    })
}

/// The code of a failed send (the buffer goes back to the pool).
#[cold]
pub(crate) fn send_failed(what: &str, e: SendError<'_>) -> i64 {
    i64::from(fail(what, &Error::from(e)))
}

/// Sends `len` bytes from `data`, copied: on shm a message up to the inline threshold straight
/// into its ring record (no send buffer), any other into a send buffer. Returns the number of
/// messages sent on this handle so far (>= 1, Aeron's "position") or a negative code:
/// `SW_BACK_PRESSURED` (no free buffer or no credit: poll and retry; nothing was sent),
/// `SW_TOO_LARGE`, `SW_POOL_EXHAUSTED` (a message that needs a send buffer while the
/// application holds every buffer in claims), `SW_CLAIM_OPEN` (a ring claim of this connection
/// is open: commit or abort it first), `SW_CLOSED`, `SW_CONN_FAILED`, `SW_BAD_ARG`.
///
/// On shm the message is visible to the peer when the call returns. In run-to-completion mode
/// on other fabrics it is posted when `batch` sends have queued, on `sw_flush`, or by the next
/// `sw_poll` / `sw_engine_poll`. Allocates nothing; never blocks.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now; `data`
/// points to `len` readable bytes (it may be NULL when `len` is 0).
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_offer(conn: *const sw_conn, data: *const c_void, len: usize) -> i64 {
    // SAFETY: the caller's contract is `offer`'s.
    unsafe { offer::<false>("sw_offer", conn, data, len) }
}

/// `sw_offer` for streams: on shm a message up to the inline threshold is written into the
/// ring but not published yet, so that a run of messages costs one publication instead of one
/// per message. The run is published by `sw_flush`, by the `batch`-th batched offer in a row,
/// by the next `sw_offer` or claim commit (order is kept), by an offer that finds the ring or
/// the window full (before it returns `SW_BACK_PRESSURED`), by an `sw_poll` of this
/// connection that finds nothing, and by `sw_conn_close`. A larger message is published at
/// once, with the run before it. On other fabrics it is `sw_offer`.
///
/// Returns what `sw_offer` returns. A lone message wants `sw_offer`, which publishes at once.
///
/// # Safety
///
/// As `sw_offer`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_offer_batched(
    conn: *const sw_conn,
    data: *const c_void,
    len: usize,
) -> i64 {
    // SAFETY: the caller's contract is `offer`'s.
    unsafe { offer::<true>("sw_offer_batched", conn, data, len) }
}

/// `sw_offer` (`BATCHED`: `sw_offer_batched`).
///
/// # Safety
///
/// As `sw_offer`.
#[inline(always)]
unsafe fn offer<const BATCHED: bool>(
    what: &'static str,
    conn: *const sw_conn,
    data: *const c_void,
    len: usize,
) -> i64 {
    guard(what, || {
        // SAFETY: per the contract.
        let h = match unsafe { check(what, conn) } {
            Ok(h) => h,
            Err(c) => return i64::from(c),
        };
        if data.is_null() && len > 0 {
            return i64::from(fail_msg(what, SW_BAD_ARG, "data is NULL"));
        }
        if len > h.max_message_size {
            return too_large(what, len, h.max_message_size);
        }
        let bytes = if len == 0 {
            &[][..]
        } else {
            // SAFETY: non-null, `len` readable bytes per the contract.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
        };
        // Up to the buffer size, the Rust API's `send_copy` (`send_copy_batched`): on shm a
        // message up to the inline threshold is copied straight into its ring record, with no
        // send buffer (about 60 instructions fewer than `alloc` + `copy_from` + `send`); what
        // that cannot send goes through a buffer.
        if len <= h.buffer_size {
            let sent = if BATCHED {
                h.conn.send_copy_batched(bytes)
            } else {
                h.conn.send_copy(bytes)
            };
            return match sent {
                Ok(()) => h.count_sent(),
                Err(e) => i64::from(fail(what, &e)),
            };
        }
        // Above the buffer size: a large slot (only reached when the connection has them).
        let buf = if len > h.buffer_size {
            h.conn.alloc_large()
        } else {
            h.conn.alloc()
        };
        let mut buf = match buf {
            Ok(b) => b,
            Err(e) => return i64::from(fail(what, &e)),
        };
        if let Err(e) = buf.copy_from(bytes) {
            return i64::from(fail(what, &e));
        }
        let sent = if BATCHED {
            h.conn.send_batched(buf)
        } else {
            h.conn.send(buf)
        };
        match sent {
            Ok(()) => h.count_sent(),
            Err(e) => send_failed(what, e),
        }
    })
}

#[cold]
fn too_large(what: &str, size: usize, max: usize) -> i64 {
    i64::from(fail(what, &Error::MessageTooLarge { size, max }))
}

/// The message handler of `sw_poll`: `data[0 .. len)` is the message, valid only during the
/// call (copy what you keep, or receive with `sw_hold` to keep messages without a copy). It may call `sw_offer`, `sw_try_claim`, `sw_claim_commit` and
/// `sw_flush` on any connection, but must not close the connection being polled (refused with
/// `SW_BAD_ARG`), and must not unwind (C++ exceptions, `longjmp`) out of the call.
#[allow(non_camel_case_types)]
pub type sw_handler =
    Option<unsafe extern "C" fn(clientd: *mut c_void, data: *const u8, len: usize)>;

/// Clears `in_poll` when `sw_poll` returns or unwinds.
struct PollFlag<'a>(&'a Cell<bool>);

impl Drop for PollFlag<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Hands up to `limit` received messages, in order, to `handler(clientd, data, len)`, and
/// recycles each buffer as soon as the handler returns. In run-to-completion mode it runs at
/// most one poller cycle (which also posts queued sends and returns credits). Never waits;
/// allocates nothing. A loop that spins on it calls `sw_spin_pause` after each call that found
/// nothing.
///
/// Returns the number of messages handled (0: none waiting) or `SW_CLOSED` / `SW_CONN_FAILED`
/// once the connection is down and everything received before was handled, or `SW_BAD_ARG`
/// (also for a NULL handler).
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now; `handler`
/// follows the rules of `sw_handler`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_poll(
    conn: *const sw_conn,
    handler: sw_handler,
    clientd: *mut c_void,
    limit: usize,
) -> i64 {
    const WHAT: &str = "sw_poll";
    guard(WHAT, || {
        // SAFETY: per the contract.
        let h = match unsafe { check(WHAT, conn) } {
            Ok(h) => h,
            Err(c) => return i64::from(c),
        };
        let Some(f) = handler else {
            return i64::from(fail_msg(WHAT, SW_BAD_ARG, "handler is NULL"));
        };
        h.in_poll.set(true);
        let _flag = PollFlag(&h.in_poll);
        // SAFETY: the handler's contract is the caller's; the message bytes are valid during the
        // call.
        let r = h
            .conn
            .poll(|m| unsafe { f(clientd, m.as_ptr(), m.len()) }, limit);
        match r {
            Ok(n) => n as i64,
            Err(e) => i64::from(fail(WHAT, &e)),
        }
    })
}

/// One turn of a spin-wait: the CPU's spin-loop hint (`pause` on x86), as the engine's
/// `SW_IDLE_BUSY_SPIN` waits and Aeron's busy-spin idle strategy have it. Call it in a
/// loop that spins on `sw_poll`, `sw_hold` or `sw_offer`, after each call that found nothing
/// to do.
///
/// Without it the CPU runs the loop's next turns ahead while the message lands, and the turn
/// that finds it starts only after a pipeline flush: about 30 ns a round trip per side in a C
/// ping-pong over shm (`ffi/examples/pingpong.c`: 406 ns without it, 341 ns with it; the
/// README's performance section). It takes about 10 ns, and no lock, memory or system call.
#[no_mangle]
pub extern "C" fn sw_spin_pause() {
    core::hint::spin_loop();
}

/// Waits up to `timeout_ns` until a message is ready for `sw_poll` / `sw_hold`, without taking
/// it, idling per `sw_config.idle` (`SW_IDLE_BLOCK`: spins 50 us, then sleeps in the kernel
/// until the arrival wakes the thread). Returns `SW_OK` (at least one message is ready),
/// `SW_TIMEOUT`, `SW_BAD_ARG`, or `SW_CLOSED` / `SW_CONN_FAILED` once the connection is down
/// and nothing received before is left. In run-to-completion mode it drives the engine while
/// it waits.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_wait(conn: *const sw_conn, timeout_ns: u64) -> i32 {
    const WHAT: &str = "sw_wait";
    guard(WHAT, || {
        // SAFETY: per the contract.
        let h = match unsafe { check(WHAT, conn) } {
            Ok(h) => h,
            Err(c) => return c,
        };
        match h.conn.wait_timeout(timeout(timeout_ns)) {
            Ok(()) => SW_OK,
            Err(e) => fail(WHAT, &e),
        }
    })
}

/// Posts queued sends now (run-to-completion: runs a poller cycle; with dedicated pollers it
/// does nothing). Returns `SW_OK`, `SW_BAD_ARG`, or `SW_CLOSED` / `SW_CONN_FAILED` once the
/// connection is down (what was queued may not reach the peer). Allocates nothing; never
/// blocks.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_flush(conn: *const sw_conn) -> i32 {
    const WHAT: &str = "sw_flush";
    guard(WHAT, || {
        // SAFETY: per the contract.
        let h = match unsafe { check(WHAT, conn) } {
            Ok(h) => h,
            Err(c) => return c,
        };
        match h.conn.flush() {
            Ok(()) => SW_OK,
            Err(e) => fail(WHAT, &e),
        }
    })
}

/// A connection's counters (plain data): `sw_conn_get_stats`.
///
/// shm connections have no poller (the direct path): their `rx_msgs` / `tx_msgs` are the
/// messages the application received / sent (as `received` / `sent`), `tx_stalls` the sends
/// refused for a full ring (as `would_block`). These counts are not in `sw_engine_stats`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
#[allow(non_camel_case_types)]
pub struct sw_conn_stats {
    /// Messages the poller delivered to this connection (shm: received by the application).
    pub rx_msgs: u64,
    /// Payload bytes of those.
    pub rx_bytes: u64,
    /// Messages the poller posted to the fabric (shm: sent by the application).
    pub tx_msgs: u64,
    /// Payload bytes of those.
    pub tx_bytes: u64,
    /// Times the fabric accepted fewer sends than offered (shm: sends refused, ring full).
    pub tx_stalls: u64,
    /// Messages the application sent (`sw_offer`, `sw_claim_commit`).
    pub sent: u64,
    /// Messages the application received (`sw_poll`).
    pub received: u64,
    /// Sends refused for lack of credit (`SW_BACK_PRESSURED`).
    pub would_block: u64,
    /// Buffer requests that found no free buffer.
    pub alloc_failures: u64,
    /// Messages in flight now (sent, credit not yet back; collected lazily).
    pub in_flight: u64,
}

/// Stores a snapshot of the connection's counters in `*out`. Returns `SW_OK` or `SW_BAD_ARG`.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now; `out`
/// points to writable memory for one `sw_conn_stats`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_conn_get_stats(conn: *const sw_conn, out: *mut sw_conn_stats) -> i32 {
    const WHAT: &str = "sw_conn_get_stats";
    guard(WHAT, || {
        code((|| {
            // SAFETY: per the contract.
            let h = unsafe { check(WHAT, conn) }?;
            out_ptr(WHAT, "out", out)?;
            let s = h.conn.stats();
            let c = sw_conn_stats {
                rx_msgs: s.rx_msgs,
                rx_bytes: s.rx_bytes,
                tx_msgs: s.tx_msgs,
                tx_bytes: s.tx_bytes,
                tx_stalls: s.tx_stalls,
                sent: s.sent,
                received: s.received,
                would_block: s.would_block,
                alloc_failures: s.alloc_failures,
                in_flight: s.in_flight,
            };
            // SAFETY: checked non-null and aligned; writable per the contract.
            unsafe { out.write(c) };
            Ok(())
        })())
    })
}
