//! The sending half of a direction: [`TxRing`] writes records (`DATA` payloads or `BUF_REF`
//! buffer references) into the direction's record ring and reclaims the buffers the receiver
//! released. The protocol is described in [`ring`](super::ring).

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::error::{Field, WireError};
use super::layout::Dir;
use super::mapping::Mapping;
use super::ring::{ring_producer, Bitmap, Pool, RelRing};
use crate::record::ring::{Claim, Producer};

/// The sending half of this side's direction: writes records (inline payloads or buffer
/// references) and reclaims buffers the receiver released.
///
/// `Send + !Sync`, methods take `&mut self`: exactly one thread (the connection's owner)
/// drives it. Holds the mapping alive.
pub struct TxRing {
    map: Arc<Mapping>,
    ring: Producer,
    inline_max: u32,
    rel: RelRing,
    /// Next release entry to read; published to the receiver after each reclaim.
    rel_head: u64,
    /// Last validated release tail. Invariant: `rel_head <= rel_tail_cache <= rel_head + cap`.
    rel_tail_cache: u64,
    pool: Pool,
    /// Bit set = buffer is in flight to the peer (the peer may read it; we must not write it).
    in_flight: Bitmap,
    in_flight_count: u32,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the raw pointers point into the mapping kept alive by `map`; nothing is tied to the
// creating thread. `!Sync` is kept (raw pointers and `Cell`), so only one thread uses it at a time.
unsafe impl Send for TxRing {}

impl std::fmt::Debug for TxRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxRing")
            .field("side", &self.map.side())
            .field("ring", &self.ring)
            .field("in_flight", &self.in_flight_count)
            .finish()
    }
}

impl TxRing {
    pub(crate) fn new(map: Arc<Mapping>, dir: Dir) -> Result<Self, WireError> {
        let p = *map.layout().params();
        let ring = ring_producer(&map, dir, p.inline_max as usize)?;
        let rel = RelRing::new(&map, dir);
        let pool = Pool::new(&map, dir);
        Ok(TxRing {
            ring,
            inline_max: p.inline_max,
            rel,
            rel_head: 0,
            rel_tail_cache: 0,
            in_flight: Bitmap::new(pool.bits()),
            in_flight_count: 0,
            pool,
            map,
            _not_sync: PhantomData,
        })
    }

    /// Largest inline payload ([`crate::fabric::shm::wire::Params::inline_max`]).
    #[inline]
    pub fn inline_max(&self) -> usize {
        self.inline_max as usize
    }

    /// Size of each buffer in bytes.
    #[inline]
    pub fn buffer_size(&self) -> usize {
        self.pool.size as usize
    }

    /// Size of each large slot in bytes (0 without large slots).
    #[inline]
    pub fn large_size(&self) -> usize {
        self.pool.large_size as usize
    }

    /// Number of large slots in this direction (`LARGE_BIT | slot` indices).
    #[inline]
    pub fn large_count(&self) -> u32 {
        self.pool.large_count
    }

    /// Commits the memory of this direction's large slots, which the segment leaves
    /// unreserved so that a connection that never sends a large message does not pay for them
    /// (see [`Segment::create`](super::Segment::create)). `madvise(MADV_POPULATE_WRITE)`
    /// allocates every page now, or fails with an error where a later first touch would raise
    /// `SIGBUS` (a full tmpfs or memory limit). The receiver's mapping then finds the pages.
    /// Call before the first slot is written; again after a failure. A kernel older than 5.14
    /// lacks the call (`EINVAL`): the pages then fault in on first touch, unreserved.
    ///
    /// # Errors
    /// [`WireError::ReserveLarge`] with the OS error.
    pub fn reserve_large(&self) -> Result<(), WireError> {
        let (base, bytes) = self.pool.large_range();
        if bytes == 0 {
            return Ok(());
        }
        loop {
            // SAFETY: `base..base + bytes` is this direction's large slots, page aligned and
            // inside the mapping `self.map` keeps alive; populating pages changes no contents
            // (the kernel allocates zeroed pages or keeps the present ones).
            let r = unsafe { libc::madvise(base.cast(), bytes, libc::MADV_POPULATE_WRITE) };
            if r == 0 {
                return Ok(());
            }
            let source = std::io::Error::last_os_error();
            match source.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EINVAL) => return Ok(()),
                _ => return Err(WireError::ReserveLarge { bytes, source }),
            }
        }
    }

    /// Number of buffers in this direction's pool.
    #[inline]
    pub fn buffer_count(&self) -> u32 {
        self.pool.count
    }

    /// Buffers currently in flight to the peer (sent and not yet reclaimed).
    #[inline]
    pub fn in_flight(&self) -> u32 {
        self.in_flight_count
    }

    /// Ring position just past the last record written (bytes written so far).
    #[inline]
    pub fn position(&self) -> u64 {
        self.ring.position()
    }

    /// Re-reads the receiver's consumer position (validated) and returns it: every record
    /// ending at or before it has been consumed.
    ///
    /// # Errors
    /// [`WireError::Ring`] if the position read from the segment is invalid.
    #[inline]
    pub fn consumer_position(&mut self) -> Result<u64, WireError> {
        self.ring
            .consumer_position()
            .map_err(|source| WireError::Ring { source })
    }

    /// Capacity of the record ring in bytes.
    #[inline]
    pub fn ring_capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Claims a `DATA` record of `len <= inline_max` payload bytes in place in the ring: fill
    /// [`Claim::payload_mut`], then [`Claim::commit`] (visible at once). `Ok(None)`: the ring is
    /// full (back-pressure: retry after the receiver polls). Dropping the claim writes nothing.
    ///
    /// # Errors
    /// [`WireError::PayloadTooLarge`] if `len > inline_max`; [`WireError::Ring`] if the
    /// consumer position read from the segment is invalid.
    #[inline]
    pub fn claim(&mut self, len: usize) -> Result<Option<Claim<'_>>, WireError> {
        if len > self.inline_max as usize {
            return Err(WireError::PayloadTooLarge {
                len,
                max: self.inline_max as usize,
            });
        }
        self.ring
            .claim(len)
            .map_err(|source| WireError::Ring { source })
    }

    /// The record ring's producer, for callers that manage claims across calls (the engine's
    /// direct path). Claims of more than `inline_max` bytes are refused by the ring itself.
    #[inline]
    pub(crate) fn producer(&mut self) -> &mut Producer {
        &mut self.ring
    }

    /// The record ring's producer, to read.
    #[inline(always)]
    pub(crate) fn producer_ref(&self) -> &Producer {
        &self.ring
    }

    /// Sends `payload` inline as a `DATA` record; visible to the receiver when this returns
    /// `Ok(true)`. `Ok(false)`: the ring is full (back-pressure).
    ///
    /// # Errors
    /// As [`claim`](Self::claim).
    #[inline]
    pub fn try_send_inline(&mut self, payload: &[u8]) -> Result<bool, WireError> {
        match self.claim(payload.len())? {
            Some(mut c) => {
                c.payload_mut().copy_from_slice(payload);
                c.commit();
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Sends the first `len` bytes of buffer `index` (already written, e.g. via
    /// [`TxRing::buffer_mut`]) as a `BUF_REF` record. The buffer is then in flight: the sender
    /// must not write it until [`TxRing::reclaim`] returns it.
    ///
    /// Returns `Ok(false)` if the ring is full (the buffer stays with the caller).
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`], [`WireError::BufferInFlight`],
    /// [`WireError::PayloadTooLarge`] (`len > buffer_size`) for caller mistakes;
    /// [`WireError::Ring`] if the consumer position read from the segment is invalid.
    #[inline]
    pub fn try_send_buf(&mut self, index: u32, len: u32) -> Result<bool, WireError> {
        let bit = self.pool.check(index)?;
        if self.in_flight.get(bit) {
            return Err(WireError::BufferInFlight { index });
        }
        if len > self.pool.size_of(index) {
            return Err(WireError::PayloadTooLarge {
                len: len as usize,
                max: self.pool.size_of(index) as usize,
            });
        }
        if !self
            .ring
            .push_buf_ref(index, len)
            .map_err(|source| WireError::Ring { source })?
        {
            return Ok(false);
        }
        self.in_flight.set(bit);
        self.in_flight_count += 1;
        Ok(true)
    }

    /// Reads released buffer indices into `out` (at most `out.len()`), marking them owned by
    /// this side again, and publishes the new release head. Returns how many were written.
    ///
    /// # Errors
    /// [`WireError::Corrupt`] if the release tail, an index, or the ownership of a released
    /// buffer is invalid (duplicate or forged release).
    #[inline]
    pub fn reclaim(&mut self, out: &mut [u32]) -> Result<usize, WireError> {
        if self.rel_head == self.rel_tail_cache {
            let t = self.rel.tail().load(Ordering::Acquire);
            if t < self.rel_tail_cache || t - self.rel_head > self.rel.cap {
                return Err(WireError::corrupt(Field::ReleaseTail, t, self.rel_head));
            }
            self.rel_tail_cache = t;
        }
        let n = out
            .len()
            .min((self.rel_tail_cache - self.rel_head) as usize);
        for slot_out in &mut out[..n] {
            let pos = self.rel_head;
            let index = self.rel.entry(pos).load(Ordering::Relaxed);
            let Ok(bit) = self.pool.check(index) else {
                return Err(WireError::corrupt(
                    Field::ReleaseIndex,
                    u64::from(index),
                    pos,
                ));
            };
            if !self.in_flight.get(bit) {
                return Err(WireError::corrupt(
                    Field::ReleaseDuplicate,
                    u64::from(index),
                    pos,
                ));
            }
            self.in_flight.clear(bit);
            self.in_flight_count -= 1;
            *slot_out = index;
            self.rel_head = pos + 1;
        }
        if n > 0 {
            self.rel.head().store(self.rel_head, Ordering::Release);
        }
        Ok(n)
    }

    /// Mutable view of buffer `index` (all `buffer_size` bytes) for writing a message in place.
    ///
    /// A hostile peer could write the same memory concurrently; the bytes written here are only
    /// guaranteed to be what the receiver sees if the peer follows the protocol.
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`]; [`WireError::BufferInFlight`] if the peer holds it.
    #[inline]
    pub fn buffer_mut(&mut self, index: u32) -> Result<&mut [u8], WireError> {
        let bit = self.pool.check(index)?;
        if self.in_flight.get(bit) {
            return Err(WireError::BufferInFlight { index });
        }
        let p = self.pool.ptr(index);
        // SAFETY: the buffer lies inside the mapping kept alive by `self.map` and is owned by
        // this side (not in flight), so the protocol gives the peer no access; the borrow of
        // `&mut self` prevents another view through this handle while the slice lives.
        Ok(
            unsafe {
                std::slice::from_raw_parts_mut(p.as_ptr(), self.pool.size_of(index) as usize)
            },
        )
    }

    /// Raw pointer to buffer `index` (`buffer_size` bytes), for handing a buffer to the
    /// application (the engine's `SendBuf`). The pointer stays valid while any handle of the
    /// segment (e.g. a [`crate::fabric::shm::wire::Segment`] clone) is alive; writing through
    /// it is allowed only while the buffer is not in flight.
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`].
    #[inline]
    pub fn buffer_ptr(&self, index: u32) -> Result<NonNull<u8>, WireError> {
        self.pool.check(index)?;
        Ok(self.pool.ptr(index))
    }
}
