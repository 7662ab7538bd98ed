//! The receiving half of [`ShmDirect`]: [`RxSide`] (the peer's ring), and the receive calls,
//! `poll` (a batch in place) and `recv_into` (one message, the engine's `try_recv`), with the
//! release of held buffers. See the [parent module](super).

use std::cell::Cell;
use std::ptr::NonNull;

use crate::desc::{PoolView, BUF_INLINE, INLINE_MAX};
use crate::error::FabricError;
use crate::record::copy::copy_bytes;
use crate::record::ring::Take;

use super::super::wire::{RxMsg, RxRing};
use super::{wire_err, ShmDirect};

/// The receiving half: the peer's ring. Every receive call publishes the consumer position
/// before it returns (the credits of what it consumed go back), so nothing is left owed
/// between calls.
pub(super) struct RxSide {
    pub(super) ring: RxRing,
}

/// Clears the `polling` flag, also when a handler unwinds.
struct PollGuard<'a>(&'a Cell<bool>);

impl Drop for PollGuard<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Publishes what a receive consumed and released when a handler unwinds out of it (the
/// receive's own publications after the handler are skipped then), so that the peer gets the
/// records' space and the buffers back without waiting for a later receive that returns (an
/// application whose every handler panicked starved its sender). Forgotten on the normal path:
/// it costs nothing there.
struct PublishOnUnwind<'a>(&'a ShmDirect);

impl Drop for PublishOnUnwind<'_> {
    fn drop(&mut self) {
        // SAFETY: runs only while unwinding out of the receive that made it (forgotten
        // otherwise), whose borrow of the consumer half ended with the handler's frame;
        // `polling` is still set (its guard drops after this one), so no other reference to
        // it is live.
        unsafe { &mut *self.0.rx.get() }.ring.publish();
        self.0.publish_releases();
    }
}

/// Releases a held buffer when dropped (after the handler returned, or during its unwind).
struct ReleaseGuard<'a> {
    direct: &'a ShmDirect,
    buf: u32,
    error: &'a mut Option<FabricError>,
}

impl Drop for ReleaseGuard<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.direct.release_staged(self.buf) {
            self.error.get_or_insert(e);
        }
    }
}

impl ShmDirect {
    /// Hands up to `limit` received messages to `handler` in place (DATA payloads in the ring,
    /// `BUF_REF` buffers in the peer's pool, released right after the handler returns for
    /// them), publishes the consumer position and the releases once, and returns the messages
    /// and payload bytes delivered. A call from inside a handler delivers nothing.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`]: the peer broke the protocol (the messages before were
    /// delivered).
    #[inline]
    pub(crate) fn poll<H: FnMut(&[u8])>(
        &self,
        rx_pool: &PoolView,
        handler: &mut H,
        limit: usize,
    ) -> Result<(usize, u64), FabricError> {
        if self.polling.replace(true) {
            return Ok((0, 0));
        }
        let _g = PollGuard(&self.polling);
        // SAFETY: `polling` makes this the only reference to the consumer half: every other
        // use of `rx` checks the flag first (and either sets it or runs no application code
        // while it holds `rx`), and handlers re-entering find it set.
        let rx = unsafe { &mut *self.rx.get() };
        // `rx.poll` publishes the position at its end.
        let mut error: Option<FabricError> = None;
        let mut bytes = 0u64;
        let unwind = PublishOnUnwind(self);
        // Inlined into the loop: as a call per message it cost a frame and the record passed
        // through memory (about 20 of the ~90 instructions a streamed `poll` message took,
        // callgrind of `bench cost`).
        let r = rx.ring.poll(
            limit,
            #[inline(always)]
            |m| {
                if error.is_some() {
                    return;
                }
                match m {
                    RxMsg::Inline(b) => {
                        bytes += b.len() as u64;
                        handler(b);
                    }
                    RxMsg::Buffer { index, len } => {
                        // SAFETY: borrowed for the call only; no application code runs meanwhile.
                        if let Err(e) = unsafe { self.rel() }.hold(index) {
                            error = Some(wire_err(e));
                            return;
                        }
                        bytes += u64::from(len);
                        let guard = ReleaseGuard {
                            direct: self,
                            buf: index,
                            error: &mut error,
                        };
                        // SAFETY: the wire layer checked `index < count` (or, for a large slot,
                        // `slot < large count`) and `len <=` that buffer's size; the
                        // buffer is held by this side until the guard releases it, and the pool
                        // stays mapped while `self` lives. A hostile peer rewriting it changes only
                        // the bytes seen.
                        let b = unsafe {
                            let base = if crate::desc::is_large(index) {
                                self.rx_large
                                    .buf_ptr_unchecked(crate::desc::large_slot(index))
                            } else {
                                rx_pool.buf_ptr_unchecked(index)
                            };
                            std::slice::from_raw_parts(base.as_ptr(), len as usize)
                        };
                        handler(b);
                        drop(guard);
                    }
                }
            },
        );
        std::mem::forget(unwind);
        self.publish_releases();
        let n = r.map_err(wire_err)?;
        if let Some(e) = error {
            return Err(e);
        }
        Ok((n, bytes))
    }

    /// The common case of [`poll`](Self::poll)`(handler, 1)` (a ping-pong's receive): a DATA
    /// record handed to `handler` in place through the ring's take, whose checks are a few
    /// compares against precomputed bounds (as [`recv_into`](Self::recv_into)'s), the take
    /// publishing the position once the handler returned. `Some(Some(len))`: one message of
    /// `len` bytes delivered; `Some(None)`: nothing published (or called from inside a
    /// handler); `None`: anything else (a `BUF_REF`, a PAD, a record to validate in full, a
    /// failed ring), nothing consumed, for `poll`.
    #[inline(always)]
    pub(crate) fn poll_one<H: FnMut(&[u8])>(&self, handler: &mut H) -> Option<Option<usize>> {
        if self.polling.replace(true) {
            return Some(None);
        }
        let _g = PollGuard(&self.polling);
        // SAFETY: as in `poll`: `polling` makes this the only reference to the consumer half.
        let rx = unsafe { &mut *self.rx.get() };
        let mut len = 0usize;
        let unwind = PublishOnUnwind(self);
        let taken = rx.ring.take_inline(
            usize::MAX,
            #[inline(always)]
            |b| {
                len = b.len();
                handler(b);
            },
        );
        std::mem::forget(unwind);
        match taken {
            Take::Data => Some(Some(len)),
            Take::Empty => Some(None),
            Take::Other => None,
        }
    }

    /// Takes the next received message: a `DATA` payload is copied into `slot` (`<=
    /// INLINE_MAX` bytes: only its `len` bytes are written) and `got` set to `(len,
    /// BUF_INLINE)`; a `BUF_REF` buffer stays in place, held until [`release`](Self::release),
    /// and `got` is `(len, buffer)`. `Ok(false)`: nothing received (or called from inside a
    /// [`poll`](Self::poll) handler); nothing is written then.
    ///
    /// The consumer position is published after every message taken: one store to this
    /// side's own line, which the producer reads only when its window is full or its cached
    /// free span runs out. (It was published once per run, when the word after the message
    /// read `0` or a quarter of the window was owed: that look at the next header cost an
    /// 8-B ping-pong 15-25 ns a round trip on the AMD EPYC guest, more than the store it
    /// saved in a stream; see `docs/shm-round-trip.md`.)
    ///
    /// The results are written where the caller keeps them (the payload into the stash slot
    /// the message will own), so nothing is built here and moved through `Option`/`Result`
    /// layers (`perf annotate` of `try_recv` showed those moves as most of its cost).
    ///
    /// # Safety
    ///
    /// `slot` is valid for writes of `INLINE_MAX` bytes and does not overlap the segment.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`]: the peer broke the protocol.
    #[inline(always)]
    pub(crate) unsafe fn recv_into(
        &self,
        slot: NonNull<u8>,
        got: &mut (u32, u32),
    ) -> Result<bool, FabricError> {
        // Only checked, not set: no application code runs inside this call (the handler below
        // copies), so nothing can re-enter while `rx` is borrowed; the flag matters only for
        // a call made from inside a `poll` handler, which must find nothing.
        if self.polling.get() {
            return Ok(false);
        }
        // SAFETY: not polling, so no other reference to `rx` is live, and none is taken while
        // this one is used (no application code runs here).
        let rx = unsafe { &mut *self.rx.get() };
        // The common case, one `DATA` record that fits the slot: the ring's `take_data`, whose
        // checks fold the slow path's (a failed ring, the type dispatch, the `BUF_REF` case) into
        // one compare of the header and three of the range (callgrind of `bench cost`: see
        // `docs/shm-round-trip.md`). Anything else is taken by `recv_into_slow`.
        let taken = rx.ring.take_inline(
            INLINE_MAX,
            #[inline(always)]
            |b| {
                *got = (b.len() as u32, BUF_INLINE);
                // SAFETY: `b.len() <= INLINE_MAX` bytes into `slot`, which has room for that many
                // and does not overlap the ring (the caller's contract).
                unsafe { copy_bytes(b.as_ptr(), slot.as_ptr(), b.len()) };
            },
        );
        match taken {
            // Published by the take, as the slow path publishes below.
            Take::Data => Ok(true),
            // Every call that consumed published its position: nothing to publish here.
            Take::Empty => Ok(false),
            // `got` passed on, so it lives in memory on the fast path too (stored by the
            // closure above, read back by the connection). Through a local of its own for the
            // call it stayed in registers, 4 instructions fewer per streamed `try_recv`
            // message (callgrind of `bench cost`), but `bench rate --size 64` (receiver-bound)
            // fell 3-6 % in 5 of 5 interleaved runs, and recovered with this back: not taken.
            // SAFETY: the caller's contract, passed on.
            Take::Other => unsafe { self.recv_into_slow(slot, got) },
        }
    }

    /// [`recv_into`](Self::recv_into) of what its fast case leaves: a `BUF_REF`, a `PAD`
    /// before the next record, a record to validate in full (and the error it makes).
    ///
    /// # Safety
    ///
    /// As [`recv_into`](Self::recv_into).
    ///
    /// # Errors
    ///
    /// As [`recv_into`](Self::recv_into).
    #[inline(never)]
    unsafe fn recv_into_slow(
        &self,
        slot: NonNull<u8>,
        got: &mut (u32, u32),
    ) -> Result<bool, FabricError> {
        if self.polling.replace(true) {
            return Ok(false);
        }
        let _g = PollGuard(&self.polling);
        // SAFETY: as in `poll`; no application code runs while it is borrowed here.
        let rx = unsafe { &mut *self.rx.get() };
        // Two plain locals rather than one `Result<bool, FabricError>`: the result was built
        // in a temporary and copied into place with a wide load over its narrow stores (a
        // store-forwarding stall, `perf annotate`); the common case now stores one flag.
        let mut taken = false;
        let mut error: Option<FabricError> = None;
        let r = rx.ring.poll_deferred(
            1,
            #[inline(always)]
            |m| match m {
                RxMsg::Inline(b) if b.len() <= INLINE_MAX => {
                    *got = (b.len() as u32, BUF_INLINE);
                    // SAFETY: `b.len() <= INLINE_MAX` bytes into `slot`, which has room for that
                    // many and does not overlap the ring (the caller's contract).
                    unsafe { copy_bytes(b.as_ptr(), slot.as_ptr(), b.len()) };
                    taken = true;
                }
                RxMsg::Inline(_) => {
                    error = Some(FabricError::Protocol(
                        "inline message longer than the inline limit",
                    ));
                }
                // SAFETY: borrowed for the call only; no application code runs meanwhile.
                RxMsg::Buffer { index, len } => match unsafe { self.rel() }.hold(index) {
                    Ok(()) => {
                        *got = (len, index);
                        taken = true;
                    }
                    Err(e) => error = Some(wire_err(e)),
                },
            },
        );
        // Published per message, as by the fast case (a PAD skipped counts: its space goes
        // back too).
        rx.ring.publish();
        r.map_err(wire_err)?;
        match error {
            Some(e) => Err(e),
            None => Ok(taken),
        }
    }

    /// Returns held receive buffer `buf` to the peer and publishes it.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`]: the buffer is not held, or the peer's release head is
    /// invalid.
    #[inline]
    pub(crate) fn release(&self, buf: u32) -> Result<(), FabricError> {
        self.release_staged(buf)?;
        self.publish_releases();
        Ok(())
    }

    #[inline]
    pub(super) fn release_staged(&self, buf: u32) -> Result<(), FabricError> {
        // SAFETY: borrowed for the call only; no application code runs meanwhile.
        unsafe { self.rel() }.release(buf).map_err(wire_err)
    }

    #[inline]
    pub(super) fn publish_releases(&self) {
        // SAFETY: borrowed for the call only; no application code runs meanwhile.
        unsafe { self.rel() }.publish_releases();
    }

    /// Whether the peer published records not yet consumed (a hint: the producer's position
    /// word). `false` while a poll is running.
    #[inline]
    pub(crate) fn rx_pending(&self) -> bool {
        if self.polling.get() {
            return false;
        }
        // SAFETY: not polling, and no application code runs while it is borrowed here.
        unsafe { &*self.rx.get() }.ring.pending_hint() > 0
    }
}
