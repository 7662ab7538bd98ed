//! Zero-copy sends: the claims (`sw_try_claim`, `sw_claim_commit`, `sw_claim_abort`, and the
//! claim table of a connection handle) and the one-call `sw_offer_in_place`.

use std::cell::Cell;
use std::ffi::c_void;

use spinwire_rs::{Connection, Error, SendBuf, SendError};

use crate::conn::{send_failed, sw_conn};
use crate::error::{fail, fail_msg, guard, SW_BAD_ARG, SW_OK, SW_POOL_EXHAUSTED};
use crate::handle::{check, code, out_ptr};

/// One claim slot: a send buffer or ring claim lent to C between `sw_try_claim` and its commit
/// or abort.
struct Slot {
    /// Bumped at every claim of this slot, so a stale token does not match.
    generation: u32,
    /// The claimed buffer. `'static` stands for "the `Connection` of the same `sw_conn`": see
    /// `sw_conn`'s invariants.
    buf: Option<SendBuf<'static>>,
}

/// The claims of one connection: one slot per send buffer and the free slots, both allocated
/// when the connection handle is made (claiming and committing only move indices), and the
/// ring claim's slot apart (one ring claim is open at a time, and it can be open while the
/// application holds every pool buffer). A ring claim, shm's zero-copy small message, moves no
/// index: see [`sw_try_claim`].
pub(crate) struct Claims {
    slots: Box<[Slot]>,
    free: Vec<u32>,
    ring: Slot,
}

/// The slot index in a ring claim's token (no table index is this large).
const RING: u32 = u32::MAX;

impl Claims {
    /// A table of `n` free slots (at least 1), and the ring claim's.
    pub(crate) fn new(n: usize) -> Claims {
        let n = n.clamp(1, RING as usize - 1);
        let slots = (0..n)
            .map(|_| Slot {
                generation: 0,
                buf: None,
            })
            .collect();
        // Popped from the end: slot 0 first.
        let free = (0..n as u32).rev().collect();
        Claims {
            slots,
            free,
            ring: Slot {
                generation: 0,
                buf: None,
            },
        }
    }

    /// Claims open now.
    pub(crate) fn open(&self) -> usize {
        self.slots.len() - self.free.len() + usize::from(self.ring.buf.is_some())
    }

    /// The slot that index `i` of a token names ([`RING`] or a table index), if any.
    #[inline(always)]
    fn slot(&mut self, i: u32) -> Option<&mut Slot> {
        if i == RING {
            Some(&mut self.ring)
        } else {
            self.slots.get_mut(i as usize)
        }
    }

    /// Marks slot `i`, emptied, free again (the ring claim's is free when empty).
    #[inline(always)]
    fn release(&mut self, i: u32) {
        if i != RING {
            self.free.push(i);
        }
    }
}

/// Aborts every outstanding claim (their buffers return to the pool, an open ring claim is
/// aborted: nothing of it is published).
pub(crate) fn abort_all(h: &sw_conn) {
    // SAFETY: called from `sw_conn_close` only, which holds no other reference to the table;
    // dropping a `SendBuf` does not touch the table.
    let claims = unsafe { h.claims() };
    for (i, s) in claims.slots.iter_mut().enumerate() {
        if s.buf.take().is_some() {
            claims.free.push(i as u32);
        }
    }
    drop(claims.ring.buf.take());
}

/// A zero-copy claim: `len` bytes to write a message in place at `data`, then send with
/// `sw_claim_commit` or give back with `sw_claim_abort`. Filled by `sw_try_claim`.
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
/// buffer: see `sw_claim`), and fills `*claim`. Returns `SW_OK` or `SW_BACK_PRESSURED` (no
/// free buffer or ring space yet: poll and retry), `SW_CLAIM_OPEN` (a ring claim of this
/// connection is open: commit or abort it first), `SW_POOL_EXHAUSTED` (every buffer is
/// claimed), `SW_TOO_LARGE`, `SW_CLOSED`, `SW_CONN_FAILED`, `SW_BAD_ARG`. Allocates nothing;
/// never blocks.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now; `claim`
/// points to writable memory for one `sw_claim`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_try_claim(conn: *mut sw_conn, len: usize, claim: *mut sw_claim) -> i32 {
    const WHAT: &str = "sw_try_claim";
    // Written for the ring claim's sake (shm's small message, claimed in the ring record): its
    // claim and commit are two C calls where `sw_offer` is one, so each keeps to the engine's
    // call and a few loads and stores, its failures out of line (callgrind of a one-thread
    // round trip: 121 and 145 instructions a call, against `sw_offer`'s 127, before).
    guard(WHAT, || {
        // SAFETY: per the contract.
        let h = match unsafe { check(WHAT, conn) } {
            Ok(h) => h,
            Err(c) => return c,
        };
        if let Err(c) = out_ptr(WHAT, "claim", claim) {
            return c;
        }
        let mut buf = match claim_buf(&h.conn, len) {
            Ok(b) => b,
            Err(e) => return fail(WHAT, &e),
        };
        // SAFETY: no other reference to the table is live in this call.
        let claims = unsafe { h.claims() };
        let (slot, i) = if buf.is_ring_claim() {
            // Empty: the connection refuses a second ring claim while one is open.
            (&mut claims.ring, RING)
        } else {
            let Some(i) = claims.free.pop() else {
                // More claims than slots: the pool has more buffers than the engine's config
                // said; refuse (the buffer goes back).
                return fail_msg(WHAT, SW_POOL_EXHAUSTED, "every claim slot is in use");
            };
            (&mut claims.slots[i as usize], i)
        };
        let data = buf.as_mut_slice().as_mut_ptr();
        slot.generation = slot.generation.wrapping_add(1).max(1);
        let token = (u64::from(slot.generation) << 32) | u64::from(i);
        // SAFETY: only the lifetime changes. `buf` borrows `h.conn`, which lives in the same
        // never-moving heap handle and is dropped after every slot's buffer (see `sw_conn`).
        slot.buf = Some(unsafe { std::mem::transmute::<SendBuf<'_>, SendBuf<'static>>(buf) });
        let c = sw_claim {
            data,
            len,
            conn,
            token,
        };
        // SAFETY: checked non-null and aligned; writable per the contract.
        unsafe { claim.write(c) };
        SW_OK
    })
}

/// The writer of `sw_offer_in_place`: writes the message, `len` bytes, at `data` (the
/// connection's memory, valid only during the call; its prior content is unspecified). It may
/// call `sw_poll`, `sw_offer` and the other data-path calls on any connection (an offer or
/// claim on the same shm connection while its ring record is open is refused with
/// `SW_CLAIM_OPEN`), but must not close the connection it writes for (refused with
/// `SW_BAD_ARG`), and must not unwind (C++ exceptions, `longjmp`) out of the call.
#[allow(non_camel_case_types)]
pub type sw_writer = Option<unsafe extern "C" fn(clientd: *mut c_void, data: *mut u8, len: usize)>;

/// Sends a `len`-byte message written in place by `write(clientd, data, len)`: one call that
/// claims the room (as `sw_try_claim`: on shm a message up to the inline threshold in its ring
/// record, any other in a send buffer), lets `write` fill it and sends it (as
/// `sw_claim_commit`). Zero-copy like a claim, at the cost of `sw_offer`: no claim is handed out,
/// so none is recorded, checked or retired (a claim and its commit are two calls and about 100
/// instructions more a message).
///
/// Returns what `sw_offer` returns: the number of messages sent on this handle so far (>= 1) or
/// a negative code. `SW_BACK_PRESSURED`: nothing was sent; poll and retry. When the room could
/// not be claimed `write` was not called; a message in a send buffer (not shm's ring record,
/// whose send cannot be refused for credit) may also be refused after `write` ran, for want of
/// credit, and a retry calls `write` again. `SW_TOO_LARGE`, `SW_POOL_EXHAUSTED`,
/// `SW_CLAIM_OPEN`, `SW_CLOSED`, `SW_CONN_FAILED`, `SW_BAD_ARG` (also for a NULL `write`). It
/// publishes as `sw_offer` does. Allocates nothing; never blocks.
///
/// # Safety
///
/// `conn` is a live connection handle (NULL is caught) used by no other thread now; `write`
/// follows the rules of `sw_writer`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_offer_in_place(
    conn: *const sw_conn,
    len: usize,
    write: sw_writer,
    clientd: *mut c_void,
) -> i64 {
    const WHAT: &str = "sw_offer_in_place";
    guard(WHAT, || {
        // SAFETY: per the contract.
        let h = match unsafe { check(WHAT, conn) } {
            Ok(h) => h,
            Err(c) => return i64::from(c),
        };
        let Some(f) = write else {
            return i64::from(fail_msg(WHAT, SW_BAD_ARG, "write is NULL"));
        };
        let mut buf = match claim_buf(&h.conn, len) {
            Ok(b) => b,
            Err(e) => return i64::from(fail(WHAT, &e)),
        };
        {
            let _writing = Writing::enter(&h.in_write);
            // The claim's room: its first `len` bytes (the claim checked `len` against it).
            let data = buf.as_mut_slice().as_mut_ptr();
            // SAFETY: the writer's contract is the caller's; `data` is `len` writable bytes of
            // the claim, which lives until the send below. A writer that closes this
            // connection is refused (`in_write`), so `h` and the claim stay alive through it.
            unsafe { f(clientd, data, len) };
        }
        match h.conn.send(buf) {
            Ok(()) => h.count_sent(),
            Err(e) => send_failed(WHAT, e),
        }
    })
}

/// Counts a running `sw_offer_in_place` writer in the handle's `in_write` until dropped (also
/// when unwinding).
struct Writing<'a>(&'a Cell<u32>);

impl<'a> Writing<'a> {
    #[inline(always)]
    fn enter(depth: &'a Cell<u32>) -> Writing<'a> {
        depth.set(depth.get() + 1);
        Writing(depth)
    }
}

impl Drop for Writing<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

/// The claim of a `len`-byte message on `conn`: `Connection::claim`, so on a direct path
/// (shm) a message up to the inline threshold is claimed in the ring record (written in the
/// connection's staging line, copied into the record by the commit; one such claim open at a
/// time: `Error::ClaimOpen` otherwise), a larger one and every message on other fabrics into
/// a pool buffer.
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
///
/// Inlined into the commit: as a call it returned the handle and index through memory, read
/// back at once (36 instructions and a store-forwarding wait per commit).
#[inline(always)]
unsafe fn check_claim<'a>(what: &str, claim: *mut sw_claim) -> Result<(&'a sw_conn, u32), i32> {
    out_ptr(what, "claim", claim)?;
    // SAFETY: non-null, aligned, readable per the contract.
    let (conn, token) = unsafe { ((*claim).conn, (*claim).token) };
    // SAFETY: per the contract.
    let h = unsafe { check(what, conn.cast_const()) }?;
    let i = token as u32;
    let generation = (token >> 32) as u32;
    // SAFETY: no other reference to the table is live in this call.
    let claims = unsafe { h.claims() };
    match claims.slot(i) {
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
/// `claim` points to an `sw_claim` filled by `sw_try_claim` whose connection is still open (a
/// spent claim is caught), used on the connection's thread.
#[must_use]
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
        let Some(buf) = unsafe { h.claims() }.slot(i).and_then(|s| s.buf.take()) else {
            return i64::from(SW_BAD_ARG);
        };
        match h.conn.send(buf) {
            Ok(()) => {
                // SAFETY: as above (the slot reference is not used any more).
                unsafe { h.claims() }.release(i);
                retire(claim);
                h.count_sent()
            }
            Err(e) => refused(h, i, claim, e),
        }
    })
}

/// A commit that `send` refused: the claim is kept for a retry (no credit yet, or a ring claim
/// open), or released and spent (the connection failed). Out of line, so that the commit's
/// own path carries none of it.
#[cold]
#[inline(never)]
fn refused(h: &sw_conn, i: u32, claim: *mut sw_claim, e: SendError<'_>) -> i64 {
    const WHAT: &str = "sw_claim_commit";
    match e {
        SendError::WouldBlock(buf) => {
            // Keep the claim: the application retries or aborts.
            keep(h, i, buf);
            i64::from(fail(WHAT, &Error::WouldBlock))
        }
        SendError::Closed {
            buf,
            error: Error::ClaimOpen,
        } => {
            // A pool-buffer claim while a ring claim is open: keep it too (the application
            // commits or aborts the ring claim, then retries).
            keep(h, i, buf);
            i64::from(fail(WHAT, &Error::ClaimOpen))
        }
        e => {
            // SAFETY: called from `sw_claim_commit` only, which holds no other reference to
            // the table.
            unsafe { h.claims() }.release(i);
            retire(claim);
            send_failed(WHAT, e)
        }
    }
}

/// Puts a claim whose commit was refused back into its slot `i` (taken by `sw_claim_commit`).
#[cold]
fn keep(h: &sw_conn, i: u32, buf: SendBuf<'_>) {
    // SAFETY: called from `sw_claim_commit` only, which holds no other reference to the table.
    let Some(slot) = unsafe { h.claims() }.slot(i) else {
        return; // not reached: `i` was checked by the commit
    };
    // SAFETY: only the lifetime changes, as in `sw_try_claim`.
    slot.buf = Some(unsafe { std::mem::transmute::<SendBuf<'_>, SendBuf<'static>>(buf) });
}

/// Gives a claimed buffer back unsent; the claim is spent. Returns `SW_OK` or `SW_BAD_ARG`
/// (stale or foreign claim).
///
/// # Safety
///
/// As `sw_claim_commit`.
#[must_use]
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
            drop(claims.slot(i).and_then(|s| s.buf.take()));
            claims.release(i);
            retire(claim);
            Ok(())
        })())
    })
}
