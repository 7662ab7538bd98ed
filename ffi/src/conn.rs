//! The listener and connection handles and the data path: `sw_accept`, `sw_offer`,
//! `sw_try_claim` / `sw_claim_commit` / `sw_claim_abort`, `sw_poll`, `sw_flush`, the
//! connection's counters.
//!
//! The data-path calls allocate nothing and take no lock: they check the handle's tag and call
//! the Rust connection's methods; only a failure writes the thread-local error message (whose
//! buffer keeps its capacity, so after a thread's first failures that allocates nothing either).

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_void;

use spinwire_rs::{Connection, Error, Listener, SendBuf, SendError};

use crate::error::{fail, fail_msg, guard, SW_BAD_ARG, SW_POOL_EXHAUSTED, SW_TIMEOUT};
use crate::handle::{check, code, destroy, out_ptr, timeout, Tagged};

/// A listening endpoint. Opaque; made by `sw_listen`, freed by [`sw_listener_close`]. Use it
/// from one thread at a time.
#[allow(non_camel_case_types)]
pub struct sw_listener {
    tag: u64,
    listener: Listener,
    claim_slots: usize,
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
    pub(crate) fn new(listener: Listener, claim_slots: usize) -> *mut sw_listener {
        Box::into_raw(Box::new(sw_listener {
            tag: Self::MAGIC,
            listener,
            claim_slots,
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
            unsafe { out.write(sw_conn::new(c, l.claim_slots)) };
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

/// One claim slot: a send buffer or ring claim lent to C between `sw_try_claim` and its commit
/// or abort.
struct Slot {
    /// Bumped at every claim of this slot, so a stale token does not match.
    generation: u32,
    /// The claimed buffer. `'static` stands for "the `Connection` of the same `sw_conn`": see
    /// [`sw_conn`]'s invariants.
    buf: Option<SendBuf<'static>>,
}

/// The claims of one connection: one slot per send buffer plus one for the ring claim (a ring
/// claim can be open while the application holds every pool buffer), and the free slots. Both
/// are allocated when the connection handle is made; claiming and committing only move indices.
struct Claims {
    slots: Box<[Slot]>,
    free: Vec<u32>,
}

/// A connection. Opaque; made by `sw_connect` or `sw_accept`, freed by [`sw_conn_close`].
///
/// Use it from one thread at a time (it may move between threads between calls), like the Rust
/// `Connection` (`Send`, not `Sync`).
///
/// Invariants: the handle never moves (it lives in its `Box` until closed); every `SendBuf` in
/// `claims` borrows `conn`, and all of them are dropped before `conn` is (by `sw_conn_close`,
/// and by field order should the box be dropped another way): dropping a pool buffer returns
/// it to `conn`'s pool, dropping a ring claim aborts it in `conn`'s ring, so `conn` must still
/// be alive then; the handle is only ever accessed
/// through shared references (its mutable parts are `Cell`s / `UnsafeCell`s), so the buffers'
/// shared borrows of `conn` stay valid.
#[allow(non_camel_case_types)]
pub struct sw_conn {
    tag: u64,
    /// Set while `sw_poll` runs its handler: closing the connection then is refused.
    in_poll: Cell<bool>,
    /// Messages sent through this handle (the value `sw_offer` / `sw_claim_commit` return).
    sent: Cell<u64>,
    max_message_size: usize,
    /// The pool's buffer size: larger messages take a large slot.
    buffer_size: usize,
    /// Declared before `conn`: dropped first.
    claims: UnsafeCell<Claims>,
    conn: Connection,
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
    pub(crate) fn new(conn: Connection, claim_slots: usize) -> *mut sw_conn {
        let n = claim_slots.clamp(1, u32::MAX as usize);
        let slots = (0..n)
            .map(|_| Slot {
                generation: 0,
                buf: None,
            })
            .collect();
        // Popped from the end: slot 0 first.
        let free = (0..n as u32).rev().collect();
        Box::into_raw(Box::new(sw_conn {
            tag: Self::MAGIC,
            in_poll: Cell::new(false),
            sent: Cell::new(0),
            max_message_size: conn.max_message_size(),
            buffer_size: conn.buffer_size(),
            claims: UnsafeCell::new(Claims { slots, free }),
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
    unsafe fn claims(&self) -> &mut Claims {
        // SAFETY: exclusive per the caller's contract.
        unsafe { &mut *self.claims.get() }
    }

    #[inline]
    fn count_sent(&self) -> i64 {
        let n = self.sent.get() + 1;
        self.sent.set(n);
        n as i64
    }
}

/// Aborts every outstanding claim (their buffers return to the pool, an open ring claim is
/// aborted: nothing of it is published).
fn abort_all(h: &sw_conn) {
    // SAFETY: called from `sw_conn_close` only, which holds no other reference to the table;
    // dropping a `SendBuf` does not touch the table.
    let claims = unsafe { h.claims() };
    for (i, s) in claims.slots.iter_mut().enumerate() {
        if s.buf.take().is_some() {
            claims.free.push(i as u32);
        }
    }
}

/// Closes the connection (the peer sees `SW_CLOSED`) and frees the handle. Outstanding claims
/// (pool buffers and an open ring claim) are aborted first, before the connection itself is
/// dropped: their `sw_claim`s become invalid with the handle, and the peer sees none of them. Sends queued by
/// `sw_offer` / `sw_claim_commit` are posted first, best effort; call `sw_flush` and let the peer
/// acknowledge if every message must arrive.
///
/// Returns `SW_OK`, or `SW_BAD_ARG` for a NULL or closed handle or when called from inside this
/// connection's own `sw_poll` handler (the connection is then left open).
///
/// # Safety
///
/// `conn` is NULL or a live connection handle; it is not used during or after the call (other
/// than by the `sw_poll` that may be running on this thread, which is caught).
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
            abort_all(h);
            // SAFETY: checked live, from `Box::into_raw`; no claim borrows `conn` any more and
            // `h` is not used again.
            unsafe { destroy(conn) };
            Ok(())
        })())
    })
}

/// The connection's largest message (its buffer size), or `SW_BAD_ARG`.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught).
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

/// The connection's engine-wide id (as in `sw_event::conn_id`), or 0 for a NULL or invalid
/// handle (ids start at 1).
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught).
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
fn send_failed(what: &str, e: SendError<'_>) -> i64 {
    i64::from(fail(what, &Error::from(e)))
}

/// Sends `len` bytes from `data` (copied into a send buffer). Returns the number of messages
/// sent on this handle so far (>= 1, Aeron's "position") or a negative code: `SW_BACK_PRESSURED`
/// (no free buffer or no credit: poll and retry; nothing was sent), `SW_TOO_LARGE`,
/// `SW_POOL_EXHAUSTED` (the application holds every buffer in claims), `SW_CLAIM_OPEN` (a ring
/// claim of this connection is open: commit or abort it first), `SW_CLOSED`, `SW_CONN_FAILED`,
/// `SW_BAD_ARG`.
///
/// In run-to-completion mode the message is posted when `batch` sends have queued, on
/// `sw_flush`, or by the next `sw_poll` / `sw_engine_poll`. Allocates nothing; never blocks.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now; `data`
/// points to `len` readable bytes (it may be NULL when `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn sw_offer(conn: *const sw_conn, data: *const u8, len: usize) -> i64 {
    const WHAT: &str = "sw_offer";
    guard(WHAT, || {
        // SAFETY: per the contract.
        let h = match unsafe { check(WHAT, conn) } {
            Ok(h) => h,
            Err(c) => return i64::from(c),
        };
        if data.is_null() && len > 0 {
            return i64::from(fail_msg(WHAT, SW_BAD_ARG, "data is NULL"));
        }
        if len > h.max_message_size {
            return too_large(WHAT, len, h.max_message_size);
        }
        // Above the buffer size: a large slot (only reached when the connection has them).
        let buf = if len > h.buffer_size {
            h.conn.alloc_large()
        } else {
            h.conn.alloc()
        };
        let mut buf = match buf {
            Ok(b) => b,
            Err(e) => return i64::from(fail(WHAT, &e)),
        };
        let bytes = if len == 0 {
            &[][..]
        } else {
            // SAFETY: non-null, `len` readable bytes per the contract.
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        if let Err(e) = buf.copy_from(bytes) {
            return i64::from(fail(WHAT, &e));
        }
        match h.conn.send(buf) {
            Ok(()) => h.count_sent(),
            Err(e) => send_failed(WHAT, e),
        }
    })
}

#[cold]
fn too_large(what: &str, size: usize, max: usize) -> i64 {
    i64::from(fail(what, &Error::MessageTooLarge { size, max }))
}

/// A zero-copy claim: `len` bytes to write a message in place at `data`, then send with
/// [`sw_claim_commit`] or give back with [`sw_claim_abort`]. Filled by [`sw_try_claim`].
///
/// Where `data` points: on shm, a message up to the inline threshold
/// (`sw_config.inline_threshold`) is claimed straight in the connection's ring record (a *ring claim*:
/// the commit is one store that publishes it, with no copy at all); a larger message, and
/// every message on tcp and rdma, gets a send buffer of the connection's pool.
///
/// One open ring claim at a time: while a ring claim is open nothing else is claimed or sent
/// on the connection (`sw_try_claim`, `sw_offer` and the commit of a pool-buffer claim return
/// `SW_CLAIM_OPEN`): commit or abort it first. Pool-buffer claims may be held several at once
/// (up to the pool's size).
///
/// Ownership: the memory belongs to the connection; the application may write `data[0..len)`
/// from `sw_try_claim` until it commits or aborts, and not after. Commit or abort every claim
/// before closing its connection (`sw_conn_close` aborts what is left, which invalidates the
/// `sw_claim`; the peer never sees an aborted claim). A claim is used on the connection's
/// thread, like the connection. The fields are outputs: do not change them.
#[repr(C)]
#[derive(Debug)]
#[allow(non_camel_case_types)]
pub struct sw_claim {
    /// Where to write the message: `len` bytes. NULL once committed or aborted.
    pub data: *mut u8,
    /// The message length claimed (what commit sends).
    pub len: usize,
    /// The connection it was claimed on.
    pub conn: *mut sw_conn,
    /// Opaque: identifies the claim to its connection (0 once committed or aborted).
    pub token: u64,
}

/// Claims room for a message of `len` bytes, written in place (a ring record or a pool
/// buffer: see [`sw_claim`]), and fills `*claim`. Returns `SW_OK` or `SW_BACK_PRESSURED` (no
/// free buffer or ring space yet: poll and retry), `SW_CLAIM_OPEN` (a ring claim of this
/// connection is open: commit or abort it first), `SW_POOL_EXHAUSTED` (every buffer is
/// claimed), `SW_TOO_LARGE`, `SW_CLOSED`, `SW_CONN_FAILED`, `SW_BAD_ARG`. Allocates nothing;
/// never blocks.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now; `claim`
/// points to writable memory for one `sw_claim`.
#[no_mangle]
pub unsafe extern "C" fn sw_try_claim(conn: *mut sw_conn, len: usize, claim: *mut sw_claim) -> i32 {
    const WHAT: &str = "sw_try_claim";
    guard(WHAT, || {
        code((|| {
            // SAFETY: per the contract.
            let h = unsafe { check(WHAT, conn) }?;
            out_ptr(WHAT, "claim", claim)?;
            let mut buf = claim_buf(&h.conn, len).map_err(|e| fail(WHAT, &e))?;
            // SAFETY: no other reference to the table is live in this call.
            let claims = unsafe { h.claims() };
            let Some(i) = claims.free.pop() else {
                // More claims than slots: the pool has more buffers than the engine's config
                // said; refuse (the buffer goes back).
                return Err(fail_msg(
                    WHAT,
                    SW_POOL_EXHAUSTED,
                    "every claim slot is in use",
                ));
            };
            let data = buf.as_mut_slice().as_mut_ptr();
            let slot = &mut claims.slots[i as usize];
            slot.generation = slot.generation.wrapping_add(1).max(1);
            // SAFETY: only the lifetime changes. `buf` borrows `h.conn`, which lives in the same
            // never-moving heap handle and is dropped after every slot's buffer (see `sw_conn`).
            slot.buf = Some(unsafe { std::mem::transmute::<SendBuf<'_>, SendBuf<'static>>(buf) });
            let c = sw_claim {
                data,
                len,
                conn,
                token: (u64::from(slot.generation) << 32) | u64::from(i),
            };
            // SAFETY: checked non-null and aligned; writable per the contract.
            unsafe { claim.write(c) };
            Ok(())
        })())
    })
}

/// The claim of a `len`-byte message on `conn`: [`Connection::claim`], so on a direct path
/// (shm) a message up to the inline threshold is written straight into the ring record (one
/// such claim open at a time: [`Error::ClaimOpen`] otherwise), a larger one and every message
/// on other fabrics into a pool buffer.
#[inline]
fn claim_buf(conn: &Connection, len: usize) -> Result<SendBuf<'_>, Error> {
    conn.claim(len)
}

/// Checks a claim: its connection handle and its token. Returns the handle and the slot index.
///
/// # Safety
///
/// `claim` is NULL or points to a readable `sw_claim` whose `conn` is NULL or a live connection
/// handle.
unsafe fn check_claim<'a>(what: &str, claim: *mut sw_claim) -> Result<(&'a sw_conn, usize), i32> {
    if claim.is_null() || !claim.is_aligned() {
        return Err(fail_msg(what, SW_BAD_ARG, "claim is NULL or misaligned"));
    }
    // SAFETY: non-null, aligned, readable per the contract.
    let (conn, token) = unsafe { ((*claim).conn, (*claim).token) };
    // SAFETY: per the contract.
    let h = unsafe { check(what, conn.cast_const()) }?;
    let i = (token & 0xffff_ffff) as usize;
    let generation = (token >> 32) as u32;
    // SAFETY: no other reference to the table is live in this call.
    let claims = unsafe { h.claims() };
    match claims.slots.get(i) {
        Some(s) if s.generation == generation && s.buf.is_some() && token != 0 => Ok((h, i)),
        _ => Err(fail_msg(
            what,
            SW_BAD_ARG,
            "stale claim (already committed or aborted) or not a claim of this connection",
        )),
    }
}

fn retire(claim: *mut sw_claim) {
    // SAFETY: checked by `check_claim`: non-null, aligned, writable (it is the caller's claim).
    unsafe {
        (*claim).data = std::ptr::null_mut();
        (*claim).token = 0;
    }
}

/// Sends a claimed message (`claim->len` bytes as written at `claim->data`). Returns the number
/// of messages sent on the connection's handle so far (>= 1) or a negative code:
/// `SW_BACK_PRESSURED` (no credit: the claim stays valid; poll, then commit or abort it),
/// `SW_CLAIM_OPEN` (a pool-buffer claim committed while a ring claim of the connection is
/// open: the claim stays valid; commit or abort the ring claim, then retry), `SW_CLOSED`,
/// `SW_CONN_FAILED` (the claim is released), `SW_BAD_ARG` (stale or foreign claim). On success
/// the claim is spent (`data` NULL, `token` 0); the commit of a ring claim always succeeds
/// while the connection is up. Allocates nothing; never blocks.
///
/// # Safety
///
/// `claim` points to an `sw_claim` filled by [`sw_try_claim`] whose connection is still open (a
/// spent claim is caught), used on the connection's thread.
#[no_mangle]
pub unsafe extern "C" fn sw_claim_commit(claim: *mut sw_claim) -> i64 {
    const WHAT: &str = "sw_claim_commit";
    guard(WHAT, || {
        // SAFETY: per the contract.
        let (h, i) = match unsafe { check_claim(WHAT, claim) } {
            Ok(v) => v,
            Err(c) => return i64::from(c),
        };
        // SAFETY: no other reference to the table is live in this call; `send` does not touch it.
        let slot = &mut unsafe { h.claims() }.slots[i];
        let Some(buf) = slot.buf.take() else {
            return i64::from(SW_BAD_ARG);
        };
        match h.conn.send(buf) {
            Ok(()) => {
                // SAFETY: as above (the slot reference is not used any more).
                unsafe { h.claims() }.free.push(i as u32);
                retire(claim);
                h.count_sent()
            }
            Err(SendError::WouldBlock(buf)) => {
                // Keep the claim: the application retries or aborts.
                keep(h, i, buf);
                i64::from(fail(WHAT, &Error::WouldBlock))
            }
            Err(SendError::Closed {
                buf,
                error: Error::ClaimOpen,
            }) => {
                // A pool-buffer claim while a ring claim is open: keep it too (the application
                // commits or aborts the ring claim, then retries).
                keep(h, i, buf);
                i64::from(fail(WHAT, &Error::ClaimOpen))
            }
            Err(e) => {
                // SAFETY: as above.
                unsafe { h.claims() }.free.push(i as u32);
                retire(claim);
                send_failed(WHAT, e)
            }
        }
    })
}

/// Puts a claim whose commit was refused back into its slot `i` (taken by `sw_claim_commit`).
#[cold]
fn keep(h: &sw_conn, i: usize, buf: SendBuf<'_>) {
    // SAFETY: called from `sw_claim_commit` only, which holds no other reference to the table.
    let slot = &mut unsafe { h.claims() }.slots[i];
    // SAFETY: only the lifetime changes, as in `sw_try_claim`.
    slot.buf = Some(unsafe { std::mem::transmute::<SendBuf<'_>, SendBuf<'static>>(buf) });
}

/// Gives a claimed buffer back unsent; the claim is spent. Returns `SW_OK` or `SW_BAD_ARG`
/// (stale or foreign claim).
///
/// # Safety
///
/// As [`sw_claim_commit`].
#[no_mangle]
pub unsafe extern "C" fn sw_claim_abort(claim: *mut sw_claim) -> i32 {
    const WHAT: &str = "sw_claim_abort";
    guard(WHAT, || {
        code((|| {
            // SAFETY: per the contract.
            let (h, i) = unsafe { check_claim(WHAT, claim) }?;
            // SAFETY: no other reference to the table is live in this call; dropping the buffer
            // does not touch it.
            let claims = unsafe { h.claims() };
            drop(claims.slots[i].buf.take());
            claims.free.push(i as u32);
            retire(claim);
            Ok(())
        })())
    })
}

/// The message handler of [`sw_poll`]: `data[0..len)` is the message, valid only during the
/// call (copy what you keep). It may call `sw_offer`, `sw_try_claim`, `sw_claim_commit` and
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
/// allocates nothing.
///
/// Returns the number of messages handled (0: none waiting) or `SW_CLOSED` / `SW_CONN_FAILED`
/// once the connection is down and everything received before was handled, or `SW_BAD_ARG`
/// (also for a NULL handler).
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now; `handler`
/// follows the rules of [`sw_handler`].
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

/// Posts queued sends now (run-to-completion: runs a poller cycle; with dedicated pollers it
/// does nothing). Returns `SW_OK` or `SW_BAD_ARG`. Allocates nothing; never blocks.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now.
#[no_mangle]
pub unsafe extern "C" fn sw_flush(conn: *const sw_conn) -> i32 {
    const WHAT: &str = "sw_flush";
    guard(WHAT, || {
        // SAFETY: per the contract.
        code(unsafe { check(WHAT, conn) }.map(|h| h.conn.flush()))
    })
}

/// A connection's counters (plain data): [`sw_conn_get_stats`].
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
