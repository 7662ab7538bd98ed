//! The direct path of a [`Connection`]: the application drives the fabric's data path itself
//! ([`DirectPath`], shm), with no poller and no application↔poller rings.
//!
//! [`Direct`] owns the fabric's handle, the spare lists (it owns its whole send pool from the
//! start and takes back what the peer released), the open ring claim and the counts (no
//! poller counts for it). Its fast cases (`alloc`, `send`, `send_copy`, `claim`, `try_recv`)
//! are `#[inline(always)]` and thin: one pop or one fabric call and a few counter updates, the
//! fabric's own common case inlined with them (shm: the record ring's `try_put_data`,
//! `claim_raw` and `take_data`, a few compares against precomputed bounds); every slow case
//! (reclaiming, a PAD, a re-read of the peer's position, errors, the connection's state on an
//! empty ring) is out of line.
//! The window is the fabric's (shm: its `flow::SendWindow` over the record ring).

use std::cell::{Cell, UnsafeCell};
use std::ptr::NonNull;

use super::spare::{Counts, Next, Spares, Wait};
use super::stash;
use super::{Connection, Message, SendBuf, SendError, RING_CLAIM};
use crate::desc::BUF_INLINE;
use crate::error::{Error, FabricError};
use crate::fabric::{DirectPath, Sent};
use crate::link::Pools;
use crate::record::copy::copy_bytes;
use crate::stats::ConnStats;

mod poll;

/// What [`Direct::send_parts`] did.
pub(super) enum DirectSend {
    /// Sent (the buffer is accounted for).
    Done,
    /// No room: hand the buffer back with `WouldBlock`.
    Full,
    /// Not sent: hand the buffer back with `Closed`.
    Failed(Error),
}

/// The open ring claim's payload pointer and length (`dangling, 0` while none is open).
pub(super) struct RingClaim(Cell<(NonNull<u8>, usize)>);

// SAFETY: the pointer points into the connection's own segment mapping, which the connection
// keeps alive and which moves with it; it is only dereferenced through a `SendBuf` borrowing
// the connection, on the connection's thread. `Cell` keeps it `!Sync`.
unsafe impl Send for RingClaim {}

impl RingClaim {
    #[inline(always)]
    pub(super) fn get(&self) -> (NonNull<u8>, usize) {
        self.0.get()
    }

    #[inline(always)]
    fn set(&self, v: (NonNull<u8>, usize)) {
        self.0.set(v)
    }
}

/// The direct path's own state (see [`Direct::state`]).
///
/// In declaration order (`repr(C)`), so that the two counters a send updates (`sent`,
/// `tx_bytes`) and the two a receive updates (`counts.received`, `rx_bytes`) are not
/// neighbours: laid out side by side, the pair was added as one 16-byte vector (load, shuffle,
/// add, store: six instructions instead of two, on every send; callgrind of `bench cost`).
#[repr(C)]
struct DirectState {
    sent: u64,
    counts: Counts,
    tx_bytes: u64,
    /// Batched sends written and not yet published.
    unflushed: u32,
    rx_bytes: u64,
    spare: Spares,
    /// `sent + counts.received` at the last [`Direct::publish_counts`].
    published: u64,
}

/// The direct path copies its counts into the connection's shared counters (what the counters
/// file shows, [`crate::counters`]) once per this many messages sent or received, and whenever
/// a receive finds the ring empty after traffic: plain counters on the data path, as before,
/// and a few relaxed stores per 256 messages.
const PUBLISH_EVERY: u64 = 256;

/// The direct path; see the [module docs](self).
pub(super) struct Direct {
    /// The fabric's handle. Outside `state`: it takes `&self` and is used while application
    /// code runs (a `poll` handler that sends, or drops a message).
    fabric: DirectPath,
    state: UnsafeCell<DirectState>,
    /// The open ring claim ([`Connection::claim`]; a `SendBuf` with `idx == RING_CLAIM`
    /// refers to it).
    pub(super) claim: RingClaim,
    /// A run of batched sends is published after this many.
    batch: u32,
}

impl Direct {
    pub(super) fn new(fabric: DirectPath, pools: &Pools, batch: u32) -> Direct {
        Direct {
            fabric,
            state: UnsafeCell::new(DirectState {
                spare: Spares::full(pools),
                unflushed: 0,
                counts: Counts::default(),
                sent: 0,
                tx_bytes: 0,
                rx_bytes: 0,
                published: 0,
            }),
            claim: RingClaim(Cell::new((NonNull::dangling(), 0))),
            batch,
        }
    }

    /// The direct path's state.
    ///
    /// An `unsafe fn` rather than `&mut self` methods: the public API takes `&self` so that
    /// several [`SendBuf`]s and [`Message`]s can borrow the connection at once, and an
    /// `UnsafeCell` read costs nothing on the data path (a `RefCell` would add a flag check and
    /// update per call).
    ///
    /// # Safety
    ///
    /// The returned reference must be the only live reference to the state: the caller drops
    /// it before anything that may call `state` again, and above all before application code
    /// runs, which on this path happens inside the fabric's `poll` (its handler may send or
    /// drop messages on this connection) and in `SendBuf`/`Message` drops. Threads cannot
    /// overlap: `Connection` is `!Sync` and every handle borrowing it is `!Send`. The fabric's
    /// handle is outside the cell, so it may be used while this reference is live.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn state(&self) -> &mut DirectState {
        // SAFETY: the caller guarantees that no other reference to the state is live.
        unsafe { &mut *self.state.get() }
    }

    /// [`Connection::alloc`]: one pop from the free list; the rest (reclaiming what the peer
    /// released, the errors) is out of line.
    #[inline(always)]
    pub(super) fn alloc<'c>(&'c self, conn: &'c Connection) -> Result<SendBuf<'c>, Error> {
        // SAFETY: no other reference to the state is live; it ends before the slow path.
        match unsafe { self.state() }.spare.pop() {
            Some(idx) => Ok(SendBuf::new(conn, idx, 0)),
            None => self.alloc_slow(conn),
        }
    }

    /// The free list is empty: take back what the peer released, then allocate.
    #[cold]
    #[inline(never)]
    fn alloc_slow<'c>(&'c self, conn: &'c Connection) -> Result<SendBuf<'c>, Error> {
        // SAFETY: no other reference to the state is live; no application code runs meanwhile.
        let s = unsafe { self.state() };
        let (bufs, large) = s.spare.lists();
        if let Err(e) = self.fabric.reclaim_all(bufs, large) {
            return Err(conn.fail(e));
        }
        if let Some(idx) = s.spare.pop() {
            return Ok(SendBuf::new(conn, idx, 0));
        }
        s.counts.alloc_failures += 1;
        Err(conn.alloc_error(s.spare.all_held(), conn.tx_pool.count()))
    }

    /// [`Connection::alloc_large`]: the peer's releases of buffers and slots come back
    /// together.
    pub(super) fn alloc_large<'c>(&'c self, conn: &'c Connection) -> Result<SendBuf<'c>, Error> {
        // The slots' memory is committed on first use (the error leaves the connection up).
        self.fabric.reserve_large()?;
        // SAFETY: no other reference to the state is live; no application code runs meanwhile.
        let s = unsafe { self.state() };
        if s.spare.large_is_empty() {
            let (bufs, large) = s.spare.lists();
            if let Err(e) = self.fabric.reclaim_all(bufs, large) {
                return Err(conn.fail(e));
            }
        }
        if let Some(idx) = s.spare.pop_large() {
            return Ok(SendBuf::new(conn, idx, 0));
        }
        s.counts.alloc_failures += 1;
        Err(conn.alloc_error(s.spare.all_large_held(), conn.tx_large.count()))
    }

    /// [`Connection::claim`]: a message up to the inline threshold is claimed in the ring.
    ///
    /// The common case inline (the connection up, no claim open, room in the window and the
    /// ring as last seen), returning the handle from registers; the rest, with the errors, in
    /// [`claim_other`](Self::claim_other), out of line. (With the general case inline, its
    /// several outcomes were merged through the result in memory: each claim stored and
    /// reloaded the handle; callgrind of `bench cost`'s claim stage.)
    #[inline(always)]
    pub(super) fn claim<'c>(
        &'c self,
        conn: &'c Connection,
        len: usize,
    ) -> Result<SendBuf<'c>, Error> {
        // No look at an open claim here: the ring refuses a second one (its `room_end` is 0
        // while one is open), and `claim_other` reports it.
        if conn.shared.down().is_none() && len <= self.fabric.inline_max() {
            if let Some(ptr) = self.fabric.try_claim(len) {
                self.claim.set((ptr, len));
                return Ok(SendBuf::new(conn, RING_CLAIM, len as u32));
            }
        }
        self.claim_other(conn, len)
    }

    /// [`claim`](Self::claim) of what its common case leaves. The connection's state is
    /// looked at first (a down connection's error comes before a claim's own).
    #[inline(never)]
    fn claim_other<'c>(&'c self, conn: &'c Connection, len: usize) -> Result<SendBuf<'c>, Error> {
        if conn.shared.down().is_some() {
            return Err(conn.down_now());
        }
        if self.fabric.claim_open() {
            return Err(Error::ClaimOpen);
        }
        if len > self.fabric.inline_max() {
            return conn.claim_buf(len);
        }
        match self.fabric.claim(len) {
            Ok(Some(ptr)) => {
                self.claim.set((ptr, len));
                Ok(SendBuf::new(conn, RING_CLAIM, len as u32))
            }
            Ok(None) => {
                // SAFETY: no other reference to the state is live.
                unsafe { self.state() }.counts.would_block += 1;
                Err(Error::WouldBlock)
            }
            Err(e) => Err(conn.fail(e)),
        }
    }

    /// [`Connection::send_copy`] of a message up to the inline threshold: `data` is copied
    /// straight into a record claimed in the ring and published (one copy; no pool buffer);
    /// `batched` ([`Connection::send_copy_batched`]): written, and published with its run.
    /// `false`: not sent (above the threshold, no room, a claim open, the connection down):
    /// the caller takes the buffer path, which reports why (it has no side effect here but
    /// publishing a batch of sends).
    #[inline(always)]
    pub(super) fn try_send_copy_inline(
        &self,
        conn: &Connection,
        data: &[u8],
        batched: bool,
    ) -> bool {
        let len = data.len();
        if len > self.fabric.inline_max()
            || self.fabric.claim_open()
            || conn.shared.down().is_some()
        {
            return false;
        }
        // The common case in one step (the ring's `try_put_data`): no claim opened and closed
        // (callgrind of `bench cost`'s `send_copy` stage).
        if self.fabric.try_send_bytes(data, batched) {
            self.count_sent(conn, len as u32, batched);
            return true;
        }
        if batched {
            // The buffer path sends it (and reports why not), batched as well.
            return false;
        }
        let Ok(Some(ptr)) = self.fabric.claim(len) else {
            return false;
        };
        // SAFETY: the claim is `len` writable bytes in the ring, which does not overlap `data`
        // (the application's memory).
        unsafe { copy_bytes(data.as_ptr(), ptr.as_ptr(), len) };
        self.send_parts(conn, RING_CLAIM, len as u32, false);
        true
    }

    /// [`Connection::send`] (`batched`: [`Connection::send_batched`]).
    ///
    /// The common case inline, the rest ([`send_other`](Self::send_other)) out of line: a
    /// buffer of the send pool, of this connection, which is up, copied into the ring with
    /// room in the window and the ring as last seen. Its outcome stays a flag: through
    /// `DirectSend` (which carries an `Error`) and the fabric's `Result<Sent, FabricError>`,
    /// each was stored to the stack and read back; with the ring claim's and the open claim's
    /// checks (the second is the ring's: it refuses while a claim is open), 19 of the ~168
    /// instructions a streamed message's send took (callgrind of `bench cost --sizes 8`:
    /// 233 -> 214 per message with `poll`).
    #[inline(always)]
    pub(super) fn send<'c>(
        &'c self,
        conn: &'c Connection,
        buf: SendBuf<'c>,
        batched: bool,
    ) -> Result<(), SendError<'c>> {
        // Field by field: the buffer is read where it lies and never moved on the way to the
        // ring (a moved `SendBuf` is copied with wide loads over fields its owner just wrote
        // narrowly, which stall on store forwarding: the largest single cost of alloc +
        // copy_from + send in `perf annotate` of `bench cost`). It is handed back whole only
        // when the send fails.
        let (idx, len) = buf.parts();
        // One test for both kinds that are not a pool buffer: a large slot and a ring claim
        // (`RING_CLAIM` has the large bit too).
        if !crate::desc::is_large(idx) {
            // SAFETY: `buf` is this connection's (checked first) and owns send-pool buffer
            // `idx`, `idx < count` and `len <= buf_size` (`SendBuf`'s invariants: its
            // constructors check the index, `copy_from`/`set_len` the length).
            let sent = conn.may_send(buf.conn)
                && unsafe {
                    self.fabric
                        .try_send_copied(&conn.tx_pool, idx, len, batched)
                };
            if sent {
                std::mem::forget(buf);
                self.sent_copied(conn, idx, len, batched);
                return Ok(());
            }
        } else if idx == RING_CLAIM && conn.may_send(buf.conn) {
            // A ring claim's commit, inline too (out of line it was a call and a frame more
            // per `claim` + `send`).
            std::mem::forget(buf);
            self.commit_claim(conn, len);
            return Ok(());
        }
        self.send_other(conn, buf, batched)
    }

    /// [`send`](Self::send) of what its fast case leaves (a large slot, a ring claim, a
    /// message by reference, a full window or ring, a claim open, the errors), out of line.
    #[inline(never)]
    fn send_other<'c>(
        &'c self,
        conn: &'c Connection,
        buf: SendBuf<'c>,
        batched: bool,
    ) -> Result<(), SendError<'c>> {
        if !conn.may_send(buf.conn) {
            return Err(conn.refuse(buf));
        }
        let (idx, len) = buf.parts();
        match self.send_parts(conn, idx, len, batched) {
            DirectSend::Done => {
                std::mem::forget(buf);
                Ok(())
            }
            DirectSend::Full => Err(SendError::WouldBlock(buf)),
            DirectSend::Failed(error) => Err(SendError::Closed { buf, error }),
        }
    }

    /// The accounting of pool buffer `idx`, `len` bytes, copied into the ring: free again at
    /// once, then [`count_sent`](Self::count_sent).
    #[inline(always)]
    fn sent_copied(&self, conn: &Connection, idx: u32, len: u32, batched: bool) {
        // Copied into the ring: the buffer is ours again at once.
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        unsafe { self.state() }.spare.copied(idx);
        self.count_sent(conn, len, batched);
    }

    /// The accounting of a `len`-byte message written into the ring: counted, and published
    /// with any batch before it, or (`batched`) added to the run, which is published once it
    /// is `batch` long.
    #[inline(always)]
    fn count_sent(&self, conn: &Connection, len: u32, batched: bool) {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        s.sent += 1;
        s.tx_bytes += u64::from(len);
        let due = s.sent % PUBLISH_EVERY == 0;
        if batched {
            s.unflushed += 1;
            if s.unflushed >= self.batch {
                s.unflushed = 0;
                self.fabric.flush();
            }
        } else {
            // Published, with any batch before it.
            s.unflushed = 0;
        }
        if due {
            self.publish_counts(conn);
        }
    }

    /// The commit of the open ring claim as a `len`-byte message: the record is in the ring
    /// already, published now (with any batch before it).
    #[inline(always)]
    fn commit_claim(&self, conn: &Connection, len: u32) {
        self.fabric.commit_claim(len as usize);
        self.count_sent(conn, len, false);
    }

    /// The send of the message in buffer `idx` (or the open ring claim, `RING_CLAIM`) of
    /// `len` bytes; on [`DirectSend::Done`] the caller forgets the `SendBuf` (its buffer is
    /// accounted for here).
    #[inline(always)]
    fn send_parts(&self, conn: &Connection, idx: u32, len: u32, batched: bool) -> DirectSend {
        if idx == RING_CLAIM {
            self.commit_claim(conn, len);
            return DirectSend::Done;
        }
        if self.fabric.claim_open() {
            return DirectSend::Failed(Error::ClaimOpen);
        }
        if crate::desc::is_large(idx) {
            return self.send_large(conn, idx, len);
        }
        // A pool buffer gets here only from `send_other`, after `send`'s fast case found no
        // room (a foreign buffer or a down connection is refused before): the fabric's slow
        // path, without a second try of its common case.
        match self.fabric.send(&conn.tx_pool, idx, len, batched) {
            Ok(Sent::Full) => {
                // SAFETY: no other reference to the state is live; none is taken while this one is used.
                let s = unsafe { self.state() };
                // The fabric published the batch before reporting it full.
                s.unflushed = 0;
                s.counts.would_block += 1;
                DirectSend::Full
            }
            Ok(Sent::Copied) => {
                self.sent_copied(conn, idx, len, batched);
                DirectSend::Done
            }
            Ok(_) => {
                // By reference: published, with any batch before it (a reference is never
                // batched).
                // SAFETY: no other reference to the state is live; none is taken while this one is used.
                let s = unsafe { self.state() };
                s.spare.sent(idx);
                s.sent += 1;
                s.tx_bytes += u64::from(len);
                s.unflushed = 0;
                if s.sent % PUBLISH_EVERY == 0 {
                    self.publish_counts(conn);
                }
                DirectSend::Done
            }
            Err(e) => DirectSend::Failed(conn.fail(e)),
        }
    }

    /// The send of large slot `idx`: always by reference.
    #[inline(never)]
    fn send_large(&self, conn: &Connection, idx: u32, len: u32) -> DirectSend {
        match self.fabric.send_ref(idx, len) {
            Ok(Sent::Full) => {
                // SAFETY: no other reference to the state is live; none is taken while this one is used.
                unsafe { self.state() }.counts.would_block += 1;
                DirectSend::Full
            }
            Ok(_) => {
                // SAFETY: no other reference to the state is live; none is taken while this one is used.
                let s = unsafe { self.state() };
                s.spare.sent(idx);
                s.sent += 1;
                s.tx_bytes += u64::from(len);
                if s.sent % PUBLISH_EVERY == 0 {
                    self.publish_counts(conn);
                }
                DirectSend::Done
            }
            Err(e) => DirectSend::Failed(conn.fail(e)),
        }
    }

    /// [`Connection::flush`]: publishes what batched sends wrote.
    #[inline]
    pub(super) fn flush(&self) {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        unsafe { self.state() }.unflushed = 0;
        self.fabric.flush();
    }

    /// One receive: the fabric fills the message where the caller's result lies. The outcome
    /// is made by the caller's constructors: `found` of the message, `failed` of the error,
    /// `empty` when nothing was received, `full` when the application holds every stash slot.
    /// [`try_recv`](Self::try_recv) makes its `Result<Option<Message>, Error>` (its `empty`
    /// the connection's state check, out of line); [`recv_wait`](Self::recv_wait) an
    /// `Option<Message>` that stays in registers.
    ///
    /// Each outcome is built once, in the return slot: with one `recv` returning
    /// `Ok(None)` that `try_recv` then matched and returned, the whole 80-byte result (the
    /// `Error` sets its size) was copied with 16-byte loads over the narrow stores that had
    /// just built it, stalling on store forwarding (callgrind and `bench cost`: about 10 of
    /// the 29 ns a streamed `try_recv` message took).
    #[inline(always)]
    fn recv<'c, R>(
        &'c self,
        conn: &'c Connection,
        found: impl FnOnce(Message<'c>) -> R,
        failed: impl FnOnce(Error) -> R,
        empty: impl FnOnce() -> R,
        full: impl FnOnce() -> R,
    ) -> R {
        let Some(slot) = conn.stash.take() else {
            return full();
        };
        // Filled in place by the fabric: the payload into the slot, `(len, buf)` here.
        let mut got = (0u32, BUF_INLINE);
        // SAFETY: the slot is ours and its payload has room for `INLINE_MAX` bytes, outside
        // the segment.
        match unsafe { self.fabric.recv_into(stash::payload(slot), &mut got) } {
            Ok(true) => {
                let (len, buf) = got;
                self.count_received(conn, 1, u64::from(len));
                if buf == BUF_INLINE {
                    // SAFETY: the slot is ours, with the payload's `len` bytes written.
                    found(unsafe { Message::inline(conn, slot, len) })
                } else {
                    // SAFETY: the wire layer checked the buffer (or large slot) and its length,
                    // and it is held until released (the whole buffer: offset 0); the slot is
                    // ours.
                    found(unsafe { Message::pooled(conn, buf, len, 0, slot) })
                }
            }
            Ok(false) => {
                conn.stash.give_back(slot);
                empty()
            }
            Err(e) => {
                conn.stash.give_back(slot);
                failed(conn.fail(e))
            }
        }
    }

    /// The application holds every stash slot: an error if a message is waiting (it stays
    /// queued), else nothing.
    #[cold]
    #[inline(never)]
    fn recv_stash_full<'c>(&'c self, conn: &'c Connection) -> Result<Option<Message<'c>>, Error> {
        if self.fabric.rx_pending() {
            return Err(Error::TooManyHeld {
                max: conn.stash.capacity(),
            });
        }
        Ok(None)
    }

    /// [`Connection::try_recv`].
    #[inline(always)]
    pub(super) fn try_recv<'c>(
        &'c self,
        conn: &'c Connection,
    ) -> Result<Option<Message<'c>>, Error> {
        self.recv(
            conn,
            |m| Ok(Some(m)),
            Err,
            || self.try_recv_empty(conn),
            || self.recv_stash_full(conn),
        )
    }

    /// What [`try_recv`](Self::try_recv) returns when its look took nothing (the ring empty,
    /// or every stash slot held): out of line, as both cases are.
    #[cold]
    #[inline(never)]
    fn try_recv_nothing<'c>(&'c self, conn: &'c Connection) -> Result<Option<Message<'c>>, Error> {
        if conn.stash.is_full() {
            self.recv_stash_full(conn)
        } else {
            self.try_recv_empty(conn)
        }
    }

    /// The ring was found empty: only now look at the connection's state.
    #[cold]
    #[inline(never)]
    fn try_recv_empty<'c>(&'c self, conn: &'c Connection) -> Result<Option<Message<'c>>, Error> {
        self.publish_if_stale(conn);
        // Nothing to receive: let a batch of sends go out (a reply may depend on it).
        self.flush();
        match self.down(conn) {
            Some(e) => match self.recv(
                conn,
                |m| Ok(Some(m)),
                Err,
                || Ok(None),
                || self.recv_stash_full(conn),
            )? {
                // Published before the state changed: still ours.
                Some(m) => Ok(Some(m)),
                None => Err(e),
            },
            None => Ok(None),
        }
    }

    /// The error the connection is down with, if it is: its shared state, or the peer's
    /// close mark in the fabric (then the connection is marked disconnected, or failed with
    /// [`FabricError::PeerAborted`] when the peer blamed this side). Called only when the ring
    /// was found empty, never per message.
    #[inline]
    fn down(&self, conn: &Connection) -> Option<Error> {
        if let Some(down) = conn.shared.down() {
            return Some(down.to_error());
        }
        match self.fabric.peer_close()? {
            FabricError::PeerClosed => conn.shared.disconnect(),
            e => conn.shared.fail(e),
        }
        conn.down_error()
    }

    /// [`Connection::recv_timeout`]: [`try_recv`](Self::try_recv)'s outcomes, waiting while
    /// it finds nothing. The message is taken as an `Option<Message>` (in registers) and
    /// returned from there, not matched out of `try_recv`'s result: built in memory by the
    /// loop's several outcomes, that was copied with 8- and 16-byte loads over the 4- and
    /// 8-byte stores that had just made it, a store-forwarding stall on every message a wait
    /// ended with. An error is kept aside; nothing taken goes to `try_recv`'s own case.
    #[inline(always)]
    pub(super) fn recv_wait<'c>(
        &'c self,
        conn: &'c Connection,
        mut wait: Wait,
    ) -> Result<Message<'c>, Error> {
        loop {
            let mut error = None;
            let taken = self.recv(
                conn,
                Some,
                |e| {
                    error = Some(e);
                    None
                },
                || None,
                || None,
            );
            if let Some(m) = taken {
                return Ok(m);
            }
            if let Some(e) = error {
                return Err(e);
            }
            match self.try_recv_nothing(conn) {
                Ok(Some(m)) => return Ok(m),
                Ok(None) => {}
                Err(e) => return Err(e),
            }
            match wait.next(0) {
                Next::Again => {}
                Next::Sleep(max) => self.sleep(conn, max),
                Next::Timeout => return Err(Error::Timeout),
            }
        }
    }

    /// `Block`'s sleep: until the peer (or the control thread, taking the connection down)
    /// rings this side's doorbell, or `max`; counted in the stats.
    fn sleep(&self, conn: &Connection, max: std::time::Duration) {
        let rung = self.fabric.sleep(max, || conn.shared.down().is_some());
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        unsafe { self.state() }.counts.slept(rung);
    }

    /// [`Connection::wait_timeout`].
    pub(super) fn wait(&self, conn: &Connection, mut wait: Wait) -> Result<(), Error> {
        loop {
            if !self.rx_is_empty() {
                return Ok(());
            }
            if let Some(e) = self.down(conn) {
                // The peer's last records may have landed before its close mark.
                return if self.rx_is_empty() { Err(e) } else { Ok(()) };
            }
            match wait.next(0) {
                Next::Again => {}
                Next::Sleep(max) => self.sleep(conn, max),
                Next::Timeout => return Err(Error::Timeout),
            }
        }
    }

    /// `n` messages of `bytes` in all received: the counts, published whenever they pass a
    /// multiple of [`PUBLISH_EVERY`]. Called once the fabric's receive has returned (no
    /// handler runs inside).
    #[inline(always)]
    fn count_received(&self, conn: &Connection, n: u64, bytes: u64) {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        s.counts.received += n;
        s.rx_bytes += bytes;
        // The count passed a multiple of `PUBLISH_EVERY` iff its remainder is below `n` (for
        // one message: the count is a multiple, one test, as before).
        if s.counts.received % PUBLISH_EVERY < n {
            self.publish_counts(conn);
        }
    }

    /// Copies the counts into the connection's shared counters (see [`PUBLISH_EVERY`]).
    #[cold]
    #[inline(never)]
    fn publish_counts(&self, conn: &Connection) {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        let a = &conn.shared.app;
        a.sent.set(s.sent);
        a.tx_bytes.set(s.tx_bytes);
        a.received.set(s.counts.received);
        a.rx_bytes.set(s.rx_bytes);
        a.would_block.set(s.counts.would_block);
        a.alloc_failures.set(s.counts.alloc_failures);
        s.published = s.sent.wrapping_add(s.counts.received);
    }

    /// [`publish_counts`](Self::publish_counts) when messages went by since the last time (a
    /// receive found the ring empty: off the path of any message).
    #[inline]
    fn publish_if_stale(&self, conn: &Connection) {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        if s.sent.wrapping_add(s.counts.received) != s.published {
            self.publish_counts(conn);
        }
    }

    /// [`Connection::stats`]: no poller, so the application's own counts are the
    /// connection's.
    pub(super) fn stats(&self, conn: &Connection) -> ConnStats {
        let in_flight = match self.fabric.unconsumed() {
            Ok(n) => n as u64,
            Err(e) => {
                conn.shared.fail(e);
                0
            }
        };
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        ConnStats {
            rx_msgs: s.counts.received,
            rx_bytes: s.rx_bytes,
            tx_msgs: s.sent,
            tx_bytes: s.tx_bytes,
            tx_stalls: s.counts.would_block,
            sent: s.sent,
            received: s.counts.received,
            would_block: s.counts.would_block,
            alloc_failures: s.counts.alloc_failures,
            sleeps: s.counts.sleeps,
            sleeps_unrung: s.counts.sleeps_unrung,
            in_flight,
        }
    }

    /// A `SendBuf` was dropped unsent (a ring claim is aborted: nothing is published).
    pub(super) fn give_back(&self, idx: u32) {
        if idx == RING_CLAIM {
            self.fabric.abort_claim();
            return;
        }
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        unsafe { self.state() }.spare.give_back(idx);
    }

    /// A received message was dropped: its buffer goes back to the peer.
    #[inline]
    pub(super) fn release(&self, conn: &Connection, idx: u32) {
        if let Err(e) = self.fabric.release(idx) {
            conn.fail(e);
        }
    }

    /// Whether no received message waits (a hint).
    pub(super) fn rx_is_empty(&self) -> bool {
        !self.fabric.rx_pending()
    }
}
