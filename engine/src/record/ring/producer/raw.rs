//! The producer's raw claims: a DATA record reserved across calls (the engine's zero-copy
//! `Connection::claim`), written in place through a pointer ([`Producer::claim_raw`]) or
//! elsewhere and copied in by the commit ([`Producer::try_reserve_raw`],
//! [`Producer::commit_raw_copy`]). While one is open every other write is refused
//! ([`RingError::ClaimOpen`]).

use std::ptr::NonNull;

use super::{padded, Claim, Producer};
use crate::record::ring::RingError;
use crate::record::RecordType;

impl Producer {
    /// Reserves a DATA record of `payload` bytes like [`claim`](Self::claim), but returns a
    /// pointer to its payload instead of a borrowing [`Claim`], for a handle that keeps the
    /// claim open across calls (the engine's zero-copy `Connection::claim`). The claim stays open
    /// until [`commit_raw`](Self::commit_raw) or [`abort_raw`](Self::abort_raw); meanwhile every
    /// other claim or push fails with [`RingError::ClaimOpen`], so nothing else writes those
    /// bytes. `Ok(None)`: the ring is full.
    ///
    /// The pointer is valid for writes of `payload` bytes while the claim is open and the
    /// region lives (the producer holds it).
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim), and [`RingError::ClaimOpen`].
    #[inline(always)]
    pub fn claim_raw(&mut self, payload: usize) -> Result<Option<NonNull<u8>>, RingError> {
        match self.try_claim_raw(payload) {
            Some(ptr) => Ok(Some(ptr)),
            None => self.claim_raw_slow(payload),
        }
    }

    /// [`claim_raw`](Self::claim_raw)'s common case alone, as in
    /// [`try_put_data`](Self::try_put_data): no PAD, room known, no claim open, not failed
    /// (`room_end` is 0 then). `None`: nothing done; `claim_raw` handles or reports the rest.
    /// Returns an `Option`, so that a caller with a slow path of its own keeps the pointer in
    /// a register.
    #[inline(always)]
    pub fn try_claim_raw(&mut self, payload: usize) -> Option<NonNull<u8>> {
        if !self.try_reserve_raw(payload) {
            return None;
        }
        let size = padded(payload);
        let mut claim = Claim {
            p: self,
            ty: RecordType::Data,
            payload,
            size,
        };
        Some(NonNull::from(claim.payload_mut()).cast())
    }

    /// [`try_claim_raw`](Self::try_claim_raw) for a holder that writes the payload elsewhere
    /// and commits it with [`commit_raw_copy`](Self::commit_raw_copy): the record is
    /// reserved (the raw claim open), no pointer into it made. `false`: nothing done.
    #[inline(always)]
    pub fn try_reserve_raw(&mut self, payload: usize) -> bool {
        let size = padded(payload);
        if !self.fits_fast(payload, size) {
            return false;
        }
        self.raw = Some(payload);
        self.room_end = 0;
        true
    }

    /// [`claim_raw`](Self::claim_raw) through [`claim`](Self::claim): a PAD first, the
    /// consumer's position to re-read, the errors.
    #[inline(never)]
    fn claim_raw_slow(&mut self, payload: usize) -> Result<Option<NonNull<u8>>, RingError> {
        let ptr = match self.claim(payload)? {
            Some(mut c) => NonNull::new(c.payload_mut().as_mut_ptr()),
            None => return Ok(None),
        };
        let Some(ptr) = ptr else {
            return Ok(None);
        };
        self.raw = Some(payload);
        self.room_end = 0;
        Ok(Some(ptr))
    }

    /// Whether a raw claim ([`claim_raw`](Self::claim_raw)) is open.
    #[inline(always)]
    pub fn is_claim_open(&self) -> bool {
        self.raw.is_some()
    }

    /// Publishes the open raw claim as a DATA record of `len` bytes (at most the claimed size,
    /// clamped to it). Returns `false` (and writes nothing) when no raw claim is open.
    ///
    /// Always inlined: with the connection's send fast case grown, the compiler left it a call
    /// in `claim` + `send` (3 instructions more per message, callgrind of `bench cost`).
    #[inline(always)]
    pub fn commit_raw(&mut self, len: usize) -> bool {
        let Some(payload) = self.close_raw(len) else {
            return false;
        };
        self.publish_claimed(payload);
        true
    }

    /// Closes the open raw claim for a commit of `len` bytes: the payload length committed
    /// (`len` clamped to the claimed size), or `None` when no raw claim is open.
    #[inline(always)]
    fn close_raw(&mut self, len: usize) -> Option<usize> {
        let claimed = self.raw.take()?;
        self.reopen();
        Some(len.min(claimed))
    }

    /// Publishes the DATA record of `payload` bytes (at most the size of the raw claim just
    /// closed) whose payload is written at the tail: alone, or with the batch before it.
    #[inline(always)]
    fn publish_claimed(&mut self, payload: usize) {
        let size = padded(payload);
        // The claimed record fitted (`reserve`), so the smaller one does: same offset.
        if self.first_word == 0 {
            self.publish_alone(payload, size);
            return;
        }
        Claim {
            p: self,
            ty: RecordType::Data,
            payload,
            size,
        }
        .commit();
    }

    /// [`commit_raw`](Self::commit_raw) of a payload written outside the ring: the first
    /// `len` bytes at `src` (at most the claimed size, clamped to it) are copied into the
    /// claimed record, then it is published as by `commit_raw`, the payload's stores, the
    /// zero-ahead word's and the header's back to back (the payload by size class, as
    /// [`try_put_copy`](Self::try_put_copy) writes it). Returns `false` (and writes nothing)
    /// when no raw claim is open.
    ///
    /// For a holder that lets its user write the payload elsewhere first (the shm direct
    /// path's claim, written in a staging line): the record's line is not written until the
    /// commit, so a consumer spinning on the header takes the line once.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads of `len.min(claimed)` bytes and does not overlap the ring's
    /// region.
    #[inline(always)]
    pub unsafe fn commit_raw_copy(&mut self, src: *const u8, len: usize) -> bool {
        let Some(payload) = self.close_raw(len) else {
            return false;
        };
        // SAFETY: the claimed record fitted at the tail (`reserve`), so the smaller one does:
        // same offset; `src` holds `payload` readable bytes outside the region (the caller's
        // contract).
        unsafe { self.store_claimed(src, payload) };
        self.publish_claimed(payload);
        true
    }

    /// Closes the open raw claim without writing its record (the space is claimed again by
    /// the next record). Does nothing when none is open.
    #[inline]
    pub fn abort_raw(&mut self) {
        if self.raw.take().is_some() {
            self.reopen();
        }
    }

    /// Writes the payload of the DATA record of `payload` bytes claimed at the tail (an open
    /// raw claim's, or a smaller one at its offset) from `src`: by size class in whole words
    /// up to 64 bytes (as [`try_put_copy`](Self::try_put_copy)), else copied; under loom into
    /// the stage, which the commit writes out.
    ///
    /// # Safety
    ///
    /// The record is in the area and in the producer's free span (the claim reserved it);
    /// `src` is valid for reads of `payload` bytes and does not overlap the region.
    #[inline(always)]
    unsafe fn store_claimed(&mut self, src: *const u8, payload: usize) {
        #[cfg(not(loom))]
        {
            // SAFETY: the caller's contract, and `payload` in the arm's class.
            unsafe {
                match payload.wrapping_sub(1) >> 3 {
                    0 => self.store_words::<1>(src, payload),
                    1 => self.store_words::<2>(src, payload),
                    2 => self.store_words::<3>(src, payload),
                    3 => self.store_words::<4>(src, payload),
                    4 => self.store_words::<5>(src, payload),
                    5 => self.store_words::<6>(src, payload),
                    6 => self.store_words::<7>(src, payload),
                    7 => self.store_words::<8>(src, payload),
                    _ => {
                        let size = padded(payload);
                        let dst = Claim {
                            p: self,
                            ty: RecordType::Data,
                            payload,
                            size,
                        }
                        .payload_mut()
                        .as_mut_ptr();
                        crate::record::copy::copy_bytes(src, dst, payload);
                    }
                }
            }
        }
        #[cfg(loom)]
        {
            // SAFETY: `src` holds `payload` readable bytes (the caller's contract).
            let bytes = unsafe { std::slice::from_raw_parts(src, payload) };
            self.stage[..payload].copy_from_slice(bytes);
        }
    }
}
