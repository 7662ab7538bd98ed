//! The shm direct path: the application's [`Connection`](crate::Connection) writes records
//! straight into this side's record ring in the segment and reads the peer's ring in place. No
//! application↔poller rings, no poller, no engine pass (Aeron IPC's shape: the two ends of a
//! ring are the two applications' threads).
//!
//! [`ShmDirect`] owns this side's [`TxRing`] (ring producer, release-ring reader, buffer
//! ownership), the peer ring's [`RxRing`] (consumer), the [`Releaser`] (buffers held, release
//! ring writer) and a [`Segment`] handle (peer-closed flag; keeps the mapping alive). Its
//! methods take `&self` and keep each half in its own `UnsafeCell`, so that application code
//! called from inside [`ShmDirect::poll`] (a handler that sends a reply, or drops an earlier
//! message) touches only the other halves; a receive call from inside a handler finds nothing
//! (it would alias the consumer being polled).
//!
//! The sender's synchronisation is amortised per run of messages: `send` with `batched` writes
//! records that [`ShmDirect::flush`] publishes with one store (the engine's `send_batched`; a
//! plain `send` publishes at once, and a full window or ring publishes the run before
//! reporting it). The receiving side publishes its consumer position once per call:
//! [`ShmDirect::recv_into`] (the engine's `try_recv`, one message) per message, `poll` once
//! per batch; that is one store to the receiver's own line, which the sender re-reads only
//! when its window is full or its cached free span runs out.
//!
//! The per-message common cases are one step each, inlined into the connection's calls: a
//! small `send` (or `send_copy`) that fits the window and the ring as last seen is the ring's
//! `Producer::try_put_data`, a `claim` its `try_reserve_raw` (the payload staged: [`Stage`]) and
//! its commit `commit_raw_copy`, a `recv_into` that finds a
//! `DATA` record its `Consumer::take_data` (the receive half is in `direct/rx.rs`); each is a
//! few compares against precomputed bounds that a failed ring (or an open claim) sets to 0, and
//! everything else (`send`, `recv_into_slow`, the ring's general calls) is out of line.
//!
//! The window is the connection's [`flow::Policy`](crate::flow::Policy) of `depth` messages:
//! the sender keeps its [`SendWindow`] (a message is in flight from its send until the peer's
//! published consumer position passes its record); the receiver returns the credits of the
//! messages it consumed by publishing its consumer position at the end of each receive call.
//!
//! Everything read from the peer is validated by the wire layer; a violation is a
//! [`FabricError::Protocol`] that the caller turns into a failed connection.

use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use crate::desc::{PoolView, INLINE_MAX};
use crate::doorbell::{Doorbell, Scope};
use crate::error::{Error, FabricError};
use crate::fabric::Sent;
use crate::flow::{Policy, SendWindow};
use crate::record::copy::copy_bytes;
use crate::record::ring::RingError;

use super::error::ShmSetupError;
use super::wire::{Releaser, RxRing, Segment, TxRing, WireError};

mod rx;
use rx::RxSide;

/// Buffers reclaimed per release-ring read.
const RECLAIM_BURST: usize = 32;

/// The sending half: the ring and the credit window over it.
struct TxSide {
    ring: TxRing,
    /// Ring position just past each message in flight (sent, not yet consumed), oldest first:
    /// message `n` (counting from 0, as the window counts) at `ends[n & mask]`, for `n` in
    /// `window.credited() .. window.sent()` (capacity a power of two `>= window`).
    ends: Box<[u64]>,
    /// The messages in flight, at most the policy's window.
    window: SendWindow,
    /// The peer's doorbell word in the segment, when the peer may sleep (it armed the bell
    /// before the handshake ended, so this is known at setup and final): rung after every
    /// publication. `None` (a spinning peer): a publication costs nothing more.
    peer_bell: Option<NonNull<AtomicU32>>,
    /// Where an open claim's payload is written (see [`Stage`]).
    stage: Stage,
}

/// The staging line of a claim ([`ShmDirect::claim`]): the application writes the claimed
/// payload here, and the commit copies it into the claimed ring record together with the
/// record's header ([`Producer::commit_raw_copy`](crate::record::ring::Producer::commit_raw_copy)).
///
/// Written in the ring itself, the payload went into the line the peer spins on (the record's
/// header shares it) some instructions before the header: measured on a 2-core Xeon guest,
/// a ping-pong whose each side claims, writes one byte and commits took 986-1036 TSC cycles a
/// round trip (p50), one that claims and commits without writing 884-886, and `send_copy`
/// (payload and header stored back to back) 852-880: each claim's early store cost about
/// 70 cycles, the line's transfer to the peer made twice. Staged, the line is written once, in
/// one burst, as `send_copy` writes it; the copy out of this line (hot in this core's cache)
/// is a few word moves for a message of up to [`INLINE_MAX`] bytes.
///
/// Its own heap allocation, held by a raw pointer: its address is stable however the
/// connection moves, and the claim's holder writes through its pointer between calls that
/// take `&mut TxSide` (a `Box` would assert unique access each time).
struct Stage(NonNull<StageBytes>);

/// [`Stage`]'s bytes: room for the largest inline payload, on lines of its own.
#[repr(C, align(64))]
struct StageBytes([u8; STAGE_BYTES]);

/// [`StageBytes`]' size: [`INLINE_MAX`] rounded up to whole lines.
const STAGE_BYTES: usize = INLINE_MAX.next_multiple_of(64);
const _: () = assert!(STAGE_BYTES >= INLINE_MAX);

impl Stage {
    fn new() -> Stage {
        Stage(NonNull::from(Box::leak(Box::new(StageBytes(
            [0; STAGE_BYTES],
        )))))
    }

    /// The start of the staging bytes (`STAGE_BYTES` of them, writable while `self` lives).
    #[inline(always)]
    fn ptr(&self) -> NonNull<u8> {
        self.0.cast()
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::leak` in `new` and is freed only here; no claim
        // outlives the connection that holds this side (a `SendBuf` borrows it).
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

impl TxSide {
    /// Credits the messages the peer consumed (those whose record ends at or before its
    /// published position); whether the window has room now.
    #[cold]
    fn collect(&mut self) -> Result<bool, FabricError> {
        let pos = self.ring.consumer_position().map_err(wire_err)?;
        let mask = self.ends.len() - 1;
        let sent = self.window.sent();
        let mut credited = self.window.credited();
        // The common case first: the peer consumed everything in flight (the ends only grow,
        // so the newest decides). One compare instead of a walk over each message, which
        // was ~7 instructions per message sent once the window filled (callgrind of `bench
        // cost`'s stream and claim stage).
        if credited < sent && self.ends[(sent - 1) as usize & mask] <= pos {
            credited = sent;
        }
        while credited < sent && self.ends[credited as usize & mask] <= pos {
            credited += 1;
        }
        // Counted here from this side's own records, never more than was sent.
        self.window.credit_trusted(credited);
        Ok(!self.window.is_full())
    }

    /// The window or the ring is full: publishes what a batch left unpublished first (the peer
    /// must see it to make room), then reports it.
    #[cold]
    #[inline(never)]
    fn full(&mut self) -> Sent {
        self.ring.producer().publish();
        self.published();
        Sent::Full
    }

    /// After a publication: rings the peer's doorbell if it may sleep.
    #[inline(always)]
    fn published(&self) {
        if let Some(word) = self.peer_bell {
            // SAFETY: the word is in the segment, which `self.ring` keeps mapped (it holds the
            // mapping); it is only accessed atomically.
            Doorbell::new(unsafe { word.as_ref() }, Scope::Shared).ring();
        }
    }

    #[inline(always)]
    fn push_end(&mut self) {
        let mask = self.ends.len() - 1;
        let i = self.window.sent() as usize & mask;
        // In flight `< window <= ends.len()` (checked before the send), so this slot holds no
        // message in flight.
        // SAFETY: `ends` is never empty (a power of two, built once), so `mask` is its length
        // less one and `i <= mask` is in bounds. Unchecked: the bounds check was two
        // instructions of every send (callgrind of `bench cost`).
        *unsafe { self.ends.get_unchecked_mut(i) } = self.ring.position();
        self.window.on_sent(1);
    }
}

/// One shm connection's direct data path; see the [module docs](self).
pub(crate) struct ShmDirect {
    tx: UnsafeCell<TxSide>,
    rx: UnsafeCell<RxSide>,
    rel: UnsafeCell<Releaser>,
    /// A poll or receive is using `rx` (re-entrant receive calls find nothing).
    polling: Cell<bool>,
    /// The large send slots' memory is committed ([`ShmDirect::reserve_large`]).
    large_reserved: Cell<bool>,
    seg: Segment,
    inline_max: usize,
    /// The peer's large slots, read in place by `poll` (`LARGE_BIT | slot` references).
    rx_large: PoolView,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: every field is owned by this handle (the rings hold the mapping alive) and nothing is
// tied to the creating thread; `!Sync` is kept, so one thread at a time uses it.
unsafe impl Send for ShmDirect {}

impl std::fmt::Debug for ShmDirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmDirect")
            .field("segment", &self.seg)
            .field("inline_max", &self.inline_max)
            .finish_non_exhaustive()
    }
}

#[cold]
pub(crate) fn wire_err(e: WireError) -> FabricError {
    match e {
        WireError::Corrupt { what, .. } => FabricError::Protocol(what.name()),
        WireError::Ring { source } => FabricError::Protocol(match source {
            RingError::Record { .. } => "invalid record in the shm ring",
            RingError::Overrun { .. } => "shm ring record past the producer's limit",
            RingError::BadConsumerPosition { .. } => "invalid shm ring consumer position",
            _ => "shm ring error",
        }),
        WireError::BufferNotHeld { .. } => FabricError::Protocol("released a buffer not held"),
        WireError::BufferInFlight { .. } => FabricError::Protocol("sent a buffer in flight"),
        WireError::BadBufferIndex { .. } => FabricError::Protocol("buffer index out of range"),
        WireError::PayloadTooLarge { .. } => FabricError::Protocol("payload too large"),
        _ => FabricError::Protocol("shm wire error"),
    }
}

impl ShmDirect {
    /// The direct path over a split segment, with the connection's window `policy` (a
    /// message window: at most `policy.window` messages in flight).
    pub(crate) fn new(
        tx: TxRing,
        rx: RxRing,
        rel: Releaser,
        seg: Segment,
        policy: Policy,
        rx_large: PoolView,
    ) -> ShmDirect {
        debug_assert_eq!(policy.unit, crate::flow::Unit::Messages);
        let inline_max = tx.inline_max().min(INLINE_MAX);
        ShmDirect {
            // Set by the peer before the handshake ended: final now (`hdr::ST_BELL`).
            tx: UnsafeCell::new(TxSide {
                ring: tx,
                ends: vec![0u64; (policy.window as usize).next_power_of_two()].into_boxed_slice(),
                window: policy.send_window(),
                peer_bell: seg
                    .peer_bell()
                    .is_armed()
                    .then(|| NonNull::from(seg.peer_bell_word())),
                stage: Stage::new(),
            }),
            rx: UnsafeCell::new(RxSide { ring: rx }),
            rel: UnsafeCell::new(rel),
            polling: Cell::new(false),
            large_reserved: Cell::new(false),
            seg,
            inline_max,
            rx_large,
            _not_sync: PhantomData,
        }
    }

    /// The send half.
    ///
    /// # Safety
    ///
    /// No other reference to the `TxRing` may be live while the returned one is used; callers
    /// drop it before calling anything that may call `tx` again (no application code runs
    /// while it is held). `ShmDirect` is `!Sync`, so threads cannot overlap.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn tx(&self) -> &mut TxSide {
        // SAFETY: the caller guarantees exclusivity (see above).
        unsafe { &mut *self.tx.get() }
    }

    /// The release half.
    ///
    /// # Safety
    ///
    /// As [`tx`](Self::tx), for the `Releaser`.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    unsafe fn rel(&self) -> &mut Releaser {
        // SAFETY: the caller guarantees exclusivity (see above).
        unsafe { &mut *self.rel.get() }
    }

    /// Commits the memory of this side's large send slots, once, before the first is written
    /// (the segment leaves them unreserved: [`TxRing::reserve_large`]). A failure sends nothing
    /// and leaves the connection up; the next large allocation tries again.
    ///
    /// # Errors
    /// [`Error::Setup`] with [`ShmSetupError::Wire`] and [`WireError::ReserveLarge`] as causes.
    #[cold]
    fn reserve_large_now(&self) -> Result<(), Error> {
        // SAFETY: no other reference to the `TxRing` is live (no send is in progress on this
        // thread, and `ShmDirect` is `!Sync`); the reference ends within this call.
        let tx = unsafe { self.tx() };
        tx.ring
            .reserve_large()
            .map_err(|source| ShmSetupError::Wire {
                step: "reserving the large send slots",
                source,
            })?;
        self.large_reserved.set(true);
        Ok(())
    }

    /// [`reserve_large_now`](Self::reserve_large_now) unless done: one flag check after the
    /// first large message.
    #[inline]
    pub(crate) fn reserve_large(&self) -> Result<(), Error> {
        if self.large_reserved.get() {
            return Ok(());
        }
        self.reserve_large_now()
    }

    /// Largest message sent inline (as a `DATA` record).
    #[inline]
    pub(crate) fn inline_max(&self) -> usize {
        self.inline_max
    }

    /// Moves buffers and large slots the peer released into `free` and `free_large`. Returns
    /// how many. Each list has capacity for every buffer (slot) of its kind, and the wire layer
    /// returns only buffers that were in flight, which are in neither list: no reallocation.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`]: the peer's release ring is invalid.
    pub(crate) fn reclaim_all(
        &self,
        free: &mut Vec<u32>,
        free_large: &mut Vec<u32>,
    ) -> Result<usize, FabricError> {
        // SAFETY: no application code runs while `tx` is borrowed here.
        let tx = &mut unsafe { self.tx() }.ring;
        if tx.in_flight() == 0 {
            return Ok(0);
        }
        let mut out = [0u32; RECLAIM_BURST];
        let k = tx.reclaim(&mut out).map_err(wire_err)?;
        for &i in &out[..k] {
            let list = if crate::desc::is_large(i) {
                &mut *free_large
            } else {
                &mut *free
            };
            // Always true (see above); checked so that a broken count cannot reallocate.
            if list.len() < list.capacity() {
                list.push(i);
            }
        }
        Ok(k)
    }

    /// Sends large slot `idx` (`LARGE_BIT | slot`, owned by the caller), `len` bytes, by
    /// reference.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`]: the peer's consumer position is invalid.
    pub(crate) fn send_ref(&self, idx: u32, len: u32) -> Result<Sent, FabricError> {
        // As `send` by reference: publishes any batched run before it together with this
        // record.
        // SAFETY: no application code runs while `tx` is borrowed here.
        let side = unsafe { self.tx() };
        if side.window.is_full() && !side.collect()? {
            return Ok(side.full());
        }
        if !side.ring.try_send_buf(idx, len).map_err(wire_err)? {
            return Ok(side.full());
        }
        side.published();
        side.push_end();
        Ok(Sent::Referenced)
    }

    /// [`send`](Self::send)'s common case alone, a message copied inline with room in the
    /// window and in the ring as last seen: the ring's `try_put_data` (three compares; no PAD,
    /// no re-read of the consumer's position, no state checks), inlined into the connection's
    /// send. `true`: sent as by `send`'s `Ok(Sent::Copied)`; `false`: nothing done (an open
    /// claim makes the ring refuse: `room_end` is 0 then), `send` does the rest.
    ///
    /// A `bool`, so that the connection's fast case keeps its outcome in a flag: through
    /// `Result<Sent, FabricError>` and the connection's own result it was stored to the
    /// stack and read back (callgrind of `bench cost`'s stream).
    ///
    /// # Safety
    ///
    /// As for `send`: the caller owns send-pool buffer `idx < pool.count()`, and `len <=
    /// pool.buf_size()`.
    #[inline(always)]
    pub(crate) unsafe fn try_send_copied(
        &self,
        pool: &PoolView,
        idx: u32,
        len: u32,
        batched: bool,
    ) -> bool {
        // SAFETY: the caller owns buffer `idx < count` and `len <= buf_size` (this fn's
        // contract), so its first `len` bytes are readable; the pool stays mapped while `self`
        // lives (the rings hold the mapping) and does not overlap the ring.
        unsafe { self.try_send_from(pool.buf_ptr_unchecked(idx).as_ptr(), len as usize, batched) }
    }

    /// Sends `data` (`len <= inline_max`) copied inline and published (with any batch before
    /// it) in one step, when the window and the ring as last seen have room and no claim is
    /// open: `send`'s fast case for the caller's bytes (the engine's `send_copy`). `batched`:
    /// written but not published (see [`flush`](Self::flush)). `false`: nothing sent; the
    /// caller takes its general path ([`claim`](Self::claim), or a pool buffer), which handles
    /// or reports the rest.
    #[inline(always)]
    pub(crate) fn try_send_bytes(&self, data: &[u8], batched: bool) -> bool {
        // SAFETY: `data` is the application's memory, outside the segment.
        unsafe { self.try_send_from(data.as_ptr(), data.len(), batched) }
    }

    /// The common case of [`try_send_copied`](Self::try_send_copied) and
    /// [`try_send_bytes`](Self::try_send_bytes): `len` bytes at `src` copied into a DATA record
    /// (`batched`: not published yet) when `len <= inline_max` and the window and the ring as
    /// last seen have room; `false`, nothing sent, otherwise. An open claim makes the ring
    /// refuse (`room_end` is 0 then).
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len` bytes and does not overlap the ring's region.
    #[inline(always)]
    unsafe fn try_send_from(&self, src: *const u8, len: usize, batched: bool) -> bool {
        // SAFETY: no application code runs while `tx` is borrowed here.
        let side = unsafe { self.tx() };
        if len > self.inline_max
            || side.window.is_full()
            // SAFETY: the caller's contract.
            || !unsafe { side.ring.producer().try_put_copy(src, len, batched) }
        {
            return false;
        }
        if !batched {
            side.published();
        }
        side.push_end();
        true
    }

    /// Sends the first `len` bytes of send-pool buffer `idx` (`idx < count`, `len <=
    /// buf_size`, owned by the caller): copied into a `DATA` record when `len <= inline_max`,
    /// else by reference. `batched`: a `DATA` record is written but not published (see
    /// [`flush`](Self::flush)); a `BUF_REF` is always published, with the batch before it.
    /// `Sent::Full` publishes the batch.
    ///
    /// The general path, out of line: the connection tries
    /// [`try_send_copied`](Self::try_send_copied), the common case, first, and calls this when
    /// that finds no room (a full window, a ring to wrap or whose consumer position to
    /// re-read), for a message by reference, and for the errors, without a second try of the
    /// common case (a send that finds the window full comes here on every retry).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`]: the peer's consumer position is invalid.
    #[inline(never)]
    pub(crate) fn send(
        &self,
        pool: &PoolView,
        idx: u32,
        len: u32,
        batched: bool,
    ) -> Result<Sent, FabricError> {
        // SAFETY: no application code runs while `tx` is borrowed here.
        let side = unsafe { self.tx() };
        if side.window.is_full() && !side.collect()? {
            return Ok(side.full());
        }
        let tx = &mut side.ring;
        let sent = if len as usize <= self.inline_max {
            let Some(mut c) = tx.claim(len as usize).map_err(wire_err)? else {
                return Ok(side.full());
            };
            let dst = c.payload_mut();
            // SAFETY: the caller owns buffer `idx < count` and `len <= buf_size`; the pool stays
            // mapped while `self` lives (the rings hold the mapping). `dst` is the claimed
            // record's `len` payload bytes in the ring, which do not overlap the pool.
            unsafe {
                copy_bytes(
                    pool.buf_ptr_unchecked(idx).as_ptr(),
                    dst.as_mut_ptr(),
                    dst.len(),
                );
            }
            if batched {
                c.commit_batched();
            } else {
                c.commit();
                side.published();
            }
            Sent::Copied
        } else if tx.try_send_buf(idx, len).map_err(wire_err)? {
            side.published();
            Sent::Referenced
        } else {
            return Ok(side.full());
        };
        side.push_end();
        Ok(sent)
    }

    /// Publishes the records [`send`](Self::send) wrote batched (one `Release` store; nothing
    /// when none is pending).
    #[inline]
    pub(crate) fn flush(&self) {
        // SAFETY: no application code runs while `tx` is borrowed here.
        let side = unsafe { self.tx() };
        // Nothing pending (every record already published, and the peer's doorbell rung with
        // it): nothing to do, as after a plain `send`.
        if side.ring.producer().is_pending() {
            side.ring.producer().publish();
            side.published();
        }
    }

    /// Messages in flight: sent and not yet consumed by the peer (re-reads its position).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`]: the peer's consumer position is invalid.
    pub(crate) fn unconsumed(&self) -> Result<usize, FabricError> {
        // SAFETY: borrowed for the call only; no application code runs meanwhile.
        let side = unsafe { self.tx() };
        if side.window.in_flight() > 0 {
            side.collect()?;
        }
        Ok(side.window.in_flight() as usize)
    }

    /// Whether an application claim of ring space is open.
    #[inline]
    pub(crate) fn claim_open(&self) -> bool {
        // The ring's own flag (a copy here was set and cleared with it on every claim and
        // commit: callgrind of `bench cost`'s claim stage).
        // SAFETY: read for the call only; no mutable reference to `tx` is live outside this
        // type's methods, and none of them is running (`!Sync`, no application code inside).
        unsafe { &*self.tx.get() }
            .ring
            .producer_ref()
            .is_claim_open()
    }

    /// Claims a `DATA` record of `len <= inline_max` bytes in the ring and returns where the
    /// application writes its payload: this side's staging line ([`Stage`]), copied into the
    /// record by the commit. `Ok(None)`: the ring is full. The claim stays open until
    /// [`commit_claim`](Self::commit_claim) or [`abort_claim`](Self::abort_claim); meanwhile
    /// [`send`](Self::send) must not be called (the caller checks [`claim_open`](Self::claim_open)).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`]: the peer's consumer position is invalid.
    #[inline(always)]
    pub(crate) fn claim(&self, len: usize) -> Result<Option<std::ptr::NonNull<u8>>, FabricError> {
        debug_assert!(!self.claim_open() && len <= self.inline_max);
        // SAFETY: no application code runs while `tx` is borrowed here.
        let side = unsafe { self.tx() };
        if side.window.is_full() && !side.collect()? {
            side.full();
            return Ok(None);
        }
        match side.ring.producer().claim_raw(len) {
            Ok(Some(_)) => Ok(Some(side.stage.ptr())),
            Ok(None) => {
                side.full();
                Ok(None)
            }
            Err(source) => Err(wire_err(WireError::Ring { source })),
        }
    }

    /// [`claim`](Self::claim)'s common case alone: room in the window and in the ring as last
    /// seen (the ring's `try_reserve_raw`: three compares). `None`: nothing claimed; `claim`
    /// does the rest (also when a claim is open: the ring refuses a second). The caller
    /// checked `len <= inline_max`.
    #[inline(always)]
    pub(crate) fn try_claim(&self, len: usize) -> Option<std::ptr::NonNull<u8>> {
        debug_assert!(len <= self.inline_max);
        // SAFETY: no application code runs while `tx` is borrowed here.
        let side = unsafe { self.tx() };
        if side.window.is_full() {
            return None;
        }
        // The record is reserved; the payload goes to the staging line.
        if !side.ring.producer().try_reserve_raw(len) {
            return None;
        }
        Some(side.stage.ptr())
    }

    /// Publishes the open claim as a `len`-byte `DATA` record: its payload copied from the
    /// staging line, then the header (one `Release` store), back to back.
    #[inline(always)]
    pub(crate) fn commit_claim(&self, len: usize) {
        // SAFETY: no application code runs while `tx` is borrowed here.
        let side = unsafe { self.tx() };
        let src = side.stage.ptr().as_ptr();
        // `false`: no claim open (the ring's flag), nothing published.
        // SAFETY: the claim is of at most `inline_max <= STAGE_BYTES` bytes (`claim`'s
        // contract), all readable in the staging line, which is its own allocation (no overlap
        // with the ring's region).
        if unsafe { side.ring.producer().commit_raw_copy(src, len) } {
            side.published();
            side.push_end();
        }
    }

    /// Drops the open claim: nothing is published (the space is claimed again by the next
    /// record).
    #[inline]
    pub(crate) fn abort_claim(&self) {
        // SAFETY: no application code runs while `tx` is borrowed here.
        unsafe { self.tx() }.ring.producer().abort_raw();
    }

    /// [`IdleStrategy::Block`](crate::IdleStrategy::Block)'s wait: announces on this side's
    /// doorbell that it sleeps, re-checks the ring, the peer's close mark and `down()` (the
    /// connection's state, which the control thread changes before it rings), and sleeps
    /// until the peer (or the control thread) rings or `max` passes. (The consumer position
    /// is already published: every receive publishes before it returns.)
    /// Whether a ring ended the sleep (`None`: it found work and did not sleep).
    pub(crate) fn sleep(&self, max: Duration, down: impl FnOnce() -> bool) -> Option<bool> {
        if self.polling.get() {
            return None;
        }
        let bell = self.seg.bell();
        let announced = bell.announce();
        if self.rx_pending() || self.seg.peer_close_code() != 0 || down() {
            bell.cancel();
            return None;
        }
        Some(bell.sleep(announced, max))
    }

    /// How the peer closed its side of the segment, if it did (one load of its state line;
    /// checked only when the ring is empty): [`FabricError::PeerClosed`], or
    /// [`FabricError::PeerAborted`] when it failed the connection because of this side.
    #[inline]
    pub(crate) fn peer_close(&self) -> Option<FabricError> {
        match self.seg.peer_close_code() {
            0 => None,
            code => Some(FabricError::peer_close(code)),
        }
    }
}
