//! Held messages: `sw_hold` takes the next received message and lends it to the application,
//! read in place, until `sw_release`; the table of a connection handle that keeps them.
//!
//! A held message is the Rust API's `Message`, kept in a fixed table of the handle: a message
//! in a receive buffer (pool buffer or large slot) stays where the peer wrote it, and its buffer
//! is recycled when the message is released, not when a handler returns; a small message
//! (inline: on shm up to the inline threshold, in the ring record) is copied into its table
//! entry by the receive, as the Rust `try_recv` does, which frees its ring slot at once. The
//! table holds as many messages as the connection's receive pool has buffers and large slots;
//! past that `sw_hold` returns `SW_BACK_PRESSURED`. Holding pool-buffer messages also
//! back-pressures the peer: its sends wait for the buffers the application holds.

use spinwire_rs::Message;

use crate::conn::sw_conn;
use crate::error::{fail, fail_msg, guard, SW_BACK_PRESSURED, SW_BAD_ARG};
use crate::handle::{check, code, out_ptr};

/// One table entry: a message lent to C between `sw_hold` and its `sw_release`.
struct Slot {
    /// Bumped at every hold of this entry, so a stale token does not match.
    generation: u32,
    /// The held message. `'static` stands for "the `Connection` of the same `sw_conn`": see
    /// `sw_conn`'s invariants.
    msg: Option<Message<'static>>,
}

/// The messages one connection's application holds, and the free entries. Allocated when the
/// connection handle is made; holding and releasing only move indices.
pub(crate) struct Held {
    slots: Box<[Slot]>,
    free: Vec<u32>,
}

impl Held {
    /// A table of `n` free entries (at least 1).
    pub(crate) fn new(n: usize) -> Held {
        let n = n.clamp(1, u32::MAX as usize);
        let slots = (0..n)
            .map(|_| Slot {
                generation: 0,
                msg: None,
            })
            .collect();
        // Popped from the end: entry 0 first.
        let free = (0..n as u32).rev().collect();
        Held { slots, free }
    }

    /// Messages held now.
    pub(crate) fn count(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// The most messages held at once.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }
}

impl sw_conn {
    /// The held-message table.
    ///
    /// # Safety
    ///
    /// No other reference to the table is live while the returned one is used (the handle is
    /// used by one thread at a time, and no call made while it is used re-enters this
    /// connection's hold calls).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn held(&self) -> &mut Held {
        // SAFETY: exclusive per the caller's contract.
        unsafe { &mut *self.held.get() }
    }
}

/// Releases every held message (their buffers are recycled).
pub(crate) fn release_all(h: &sw_conn) {
    // SAFETY: called from `sw_conn_close` only, which holds no other reference to the table;
    // dropping a `Message` does not touch the table.
    let held = unsafe { h.held() };
    for (i, s) in held.slots.iter_mut().enumerate() {
        if s.msg.take().is_some() {
            held.free.push(i as u32);
        }
    }
}

/// A received message the application holds: `len` bytes at `data`, read in place, valid until
/// `sw_release` (or `sw_conn_close`). Filled by `sw_hold`.
///
/// Ownership: the bytes belong to the connection; the application reads `data[0 .. len)` from
/// `sw_hold` until it releases the message, and not after. Release every held message before
/// closing its connection (`sw_conn_close` releases what is left, which invalidates the
/// `sw_msg`). A held message is used on the connection's thread, like the connection. The
/// fields are outputs: do not change them.
#[repr(C)]
#[derive(Debug)]
#[allow(non_camel_case_types)]
pub struct sw_msg {
    /// The message bytes: `len` of them. NULL once released.
    pub data: *const u8,
    /// The message length.
    pub len: usize,
    /// The connection it was received on.
    pub conn: *mut sw_conn,
    /// Opaque: identifies the message to its connection (0 once released).
    pub token: u64,
}

/// Takes the next received message and holds it: `*msg` then lends it to the application, read
/// in place (a message in a receive buffer is not copied; a small inline one is copied once
/// into the connection's table of held messages), until `sw_release`. Use it instead of
/// `sw_poll` to keep or forward messages without copying them. In run-to-completion mode it
/// runs a poller cycle when none is waiting. Allocates nothing; never blocks.
///
/// Returns 1 (a message is in `*msg`), 0 (none waiting), `SW_BACK_PRESSURED` (the application
/// holds `sw_conn_max_held` messages of this connection already, as many as its receive pool
/// has buffers: release one; nothing was taken), `SW_CLOSED` / `SW_CONN_FAILED` (the connection
/// is down and everything received before was taken) or `SW_BAD_ARG` (also when called from
/// inside this connection's `sw_poll` handler).
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now; `msg`
/// points to writable memory for one `sw_msg`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_hold(conn: *mut sw_conn, msg: *mut sw_msg) -> i32 {
    const WHAT: &str = "sw_hold";
    guard(WHAT, || {
        let r = (|| {
            // SAFETY: per the contract.
            let h = unsafe { check(WHAT, conn.cast_const()) }?;
            out_ptr(WHAT, "msg", msg)?;
            if h.in_poll.get() {
                return Err(fail_msg(
                    WHAT,
                    SW_BAD_ARG,
                    "called from inside this connection's sw_poll handler",
                ));
            }
            // SAFETY: no other reference to the table is live in this call; it ends before the
            // receive below.
            let Some(&i) = (unsafe { h.held() }).free.last() else {
                return Err(held_full(h));
            };
            let Some(m) = h.conn.try_recv().map_err(|e| fail(WHAT, &e))? else {
                return Ok(false);
            };
            // SAFETY: no other reference to the table is live in this call; storing the
            // message does not touch it.
            let held = unsafe { h.held() };
            held.free.pop();
            let slot = &mut held.slots[i as usize];
            slot.generation = slot.generation.wrapping_add(1).max(1);
            // SAFETY: only the lifetime changes. `m` borrows `h.conn`, which lives in the same
            // never-moving heap handle and is dropped after every held message (see `sw_conn`).
            let m = slot
                .msg
                .insert(unsafe { std::mem::transmute::<Message<'_>, Message<'static>>(m) });
            // Taken where the message now lies: an inline message's bytes are inside it.
            let out = sw_msg {
                data: m.as_ptr(),
                len: m.len(),
                conn,
                token: (u64::from(slot.generation) << 32) | u64::from(i),
            };
            // SAFETY: checked non-null and aligned; writable per the contract.
            unsafe { msg.write(out) };
            Ok(true)
        })();
        match r {
            Ok(true) => 1,
            Ok(false) => 0,
            Err(c) => c,
        }
    })
}

#[cold]
fn held_full(h: &sw_conn) -> i32 {
    // SAFETY: no other reference to the table is live in this call.
    let n = unsafe { h.held() }.capacity();
    fail_msg(
        "sw_hold",
        SW_BACK_PRESSURED,
        &format!(
            "the application holds {n} messages of this connection, as many as its receive \
             pool has buffers: release one (sw_release) first"
        ),
    )
}

/// Releases a held message: its receive buffer is recycled (on shm, returned to the peer) and
/// the `sw_msg` is spent (`data` NULL, `token` 0). Returns `SW_OK` or `SW_BAD_ARG` (NULL,
/// already released, or not a message of a live connection). May be called from a `sw_poll`
/// handler. Allocates nothing; never blocks.
///
/// # Safety
///
/// `msg` points to an `sw_msg` filled by `sw_hold` whose connection is still open (a released
/// message is caught), used on the connection's thread.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_release(msg: *mut sw_msg) -> i32 {
    const WHAT: &str = "sw_release";
    guard(WHAT, || {
        code((|| {
            out_ptr(WHAT, "msg", msg)?;
            // SAFETY: non-null, aligned, readable per the contract.
            let (conn, token) = unsafe { ((*msg).conn, (*msg).token) };
            // SAFETY: per the contract.
            let h = unsafe { check(WHAT, conn.cast_const()) }?;
            let i = (token & 0xffff_ffff) as usize;
            let generation = (token >> 32) as u32;
            // SAFETY: no other reference to the table is live in this call.
            let held = unsafe { h.held() };
            let taken = match held.slots.get_mut(i) {
                Some(s) if s.generation == generation && token != 0 => s.msg.take(),
                _ => None,
            };
            let Some(m) = taken else {
                return Err(fail_msg(
                    WHAT,
                    SW_BAD_ARG,
                    "stale message (already released) or not a message of this connection",
                ));
            };
            held.free.push(i as u32);
            // Recycles the buffer; does not touch the table.
            drop(m);
            // SAFETY: checked non-null and aligned; writable (it is the caller's message).
            unsafe {
                (*msg).data = std::ptr::null();
                (*msg).token = 0;
            }
            Ok(())
        })())
    })
}

/// The most messages the application may hold on this connection at once (`sw_hold`): its
/// receive pool's buffers and large slots (`sw_config.buffers + sw_config.large_buffers`), or
/// `SW_BAD_ARG`.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_conn_max_held(conn: *const sw_conn) -> i64 {
    const WHAT: &str = "sw_conn_max_held";
    guard(WHAT, || {
        // SAFETY: per the contract.
        match unsafe { check(WHAT, conn) } {
            // SAFETY: no other reference to the table is live in this call.
            Ok(h) => unsafe { h.held() }.capacity() as i64,
            Err(c) => i64::from(c),
        }
    })
}

/// What the application has open on this connection: its claims (`sw_try_claim`, not yet
/// committed or aborted) plus the messages it holds (`sw_hold`, not yet released), or
/// `SW_BAD_ARG`. `sw_conn_close` aborts and releases them; spinwire.hpp checks it is 0 when a
/// `Connection` closes.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_conn_outstanding(conn: *const sw_conn) -> i64 {
    const WHAT: &str = "sw_conn_outstanding";
    guard(WHAT, || {
        // SAFETY: per the contract.
        match unsafe { check(WHAT, conn) } {
            // SAFETY: no other reference to either table is live in this call.
            Ok(h) => (unsafe { h.claims().open() + h.held().count() }) as i64,
            Err(c) => i64::from(c),
        }
    })
}
