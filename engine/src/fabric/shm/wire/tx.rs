//! The sending half of a direction: [`TxRing`] writes records (inline payloads or buffer
//! references) into the descriptor ring and reclaims the buffers the receiver released. The
//! protocol is described in [`ring`](super::ring).

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::error::{Field, WireError};
use super::layout::{
    slot, slots_for_inline, Dir, CONT_SLOT_HEADER_SIZE, CONT_SLOT_INLINE, FIRST_SLOT_INLINE,
    SLOT_HEADER_SIZE,
};
use super::mapping::Mapping;
use super::ring::{store_payload, Bitmap, DescRing, Pool, RelRing, CONT_BIT, INLINE_BUF};

/// The sending half of this side's direction: writes descriptors (inline payloads or buffer
/// references) and reclaims buffers the receiver released.
///
/// `Send + !Sync`, methods take `&mut self`: exactly one thread (the poller owning the
/// connection) drives it. Holds the mapping alive.
pub struct TxRing {
    map: Arc<Mapping>,
    ring: DescRing,
    /// Next position to write. Invariant: `head_cache <= tail <= head_cache + depth`.
    tail: u64,
    /// Last validated consumer head.
    head_cache: u64,
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
            .field("tail", &self.tail)
            .field("head_cache", &self.head_cache)
            .field("in_flight", &self.in_flight_count)
            .finish()
    }
}

impl TxRing {
    pub(crate) fn new(map: Arc<Mapping>, dir: Dir) -> Self {
        let ring = DescRing::new(&map, dir);
        let rel = RelRing::new(&map, dir);
        let pool = Pool::new(&map, dir);
        let p = *map.layout().params();
        TxRing {
            ring,
            tail: 0,
            head_cache: 0,
            inline_max: p.inline_max,
            rel,
            rel_head: 0,
            rel_tail_cache: 0,
            in_flight: Bitmap::new(p.buffer_count),
            in_flight_count: 0,
            pool,
            map,
            _not_sync: PhantomData,
        }
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

    /// Free descriptor slots according to the cached consumer head (a lower bound).
    #[inline]
    pub fn free_slots_cached(&self) -> u64 {
        self.ring.depth - (self.tail - self.head_cache)
    }

    /// Ring position just past the last record written (the producer tail).
    #[inline]
    pub fn position(&self) -> u64 {
        self.tail
    }

    /// Re-reads the receiver's consumer head (validated) and returns it: every record ending at or
    /// before it has been consumed. The engine's credit accounting uses this.
    ///
    /// # Errors
    /// [`WireError::Corrupt`] if the head moved backwards or past the tail.
    #[inline]
    pub fn refresh_head(&mut self) -> Result<u64, WireError> {
        let h = self.ring.head().load(Ordering::Acquire);
        if h < self.head_cache || h > self.tail {
            return Err(WireError::corrupt(Field::DescHead, h, self.tail));
        }
        self.head_cache = h;
        Ok(h)
    }

    /// Makes sure `k <= depth` slots are free, re-reading the consumer head only when the cached
    /// value says they are not.
    #[inline(always)]
    fn reserve(&mut self, k: u64) -> Result<bool, WireError> {
        if self.tail + k - self.head_cache <= self.ring.depth {
            return Ok(true);
        }
        let h = self.ring.head().load(Ordering::Acquire);
        if h < self.head_cache || h > self.tail {
            return Err(WireError::corrupt(Field::DescHead, h, self.tail));
        }
        self.head_cache = h;
        Ok(self.tail + k - h <= self.ring.depth)
    }

    /// Sends `payload` inline in the descriptor ring, with the opaque `aux` word (credits/flags).
    /// Visible to the receiver when this returns `Ok(true)`.
    ///
    /// Returns `Ok(false)` if the ring has no room for the `slots_for_inline(len)` slots
    /// (back-pressure: retry after the receiver commits).
    ///
    /// # Errors
    /// [`WireError::PayloadTooLarge`] if `payload.len() > inline_max`;
    /// [`WireError::Corrupt`] if the consumer head read from the segment is invalid.
    #[inline]
    pub fn try_send_inline(&mut self, payload: &[u8], aux: u32) -> Result<bool, WireError> {
        let len = payload.len();
        if len > self.inline_max as usize {
            return Err(WireError::PayloadTooLarge {
                len,
                max: self.inline_max as usize,
            });
        }
        let k = slots_for_inline(len) as u64;
        if !self.reserve(k)? {
            return Ok(false);
        }
        let pos = self.tail;
        let (first, rest) = payload.split_at(len.min(FIRST_SLOT_INLINE));
        for (i, chunk) in rest.chunks(CONT_SLOT_INLINE).enumerate() {
            let q = pos + 1 + i as u64;
            self.ring
                .u64_at(q, 0)
                .store((q + 1) | CONT_BIT, Ordering::Relaxed);
            store_payload(&self.ring, q, CONT_SLOT_HEADER_SIZE, chunk);
        }
        self.write_first(pos, len as u32, INLINE_BUF, aux);
        store_payload(&self.ring, pos, SLOT_HEADER_SIZE, first);
        self.ring
            .u64_at(pos, slot::SEQ)
            .store(pos + 1, Ordering::Release);
        self.tail = pos + k;
        Ok(true)
    }

    #[inline(always)]
    fn write_first(&self, pos: u64, len: u32, buf: u32, aux: u32) {
        // Two u64 stores instead of four u32 ones (see `layout::slot` for the word layout).
        self.ring
            .u64_at(pos, slot::LEN)
            .store(u64::from(len) | u64::from(buf) << 32, Ordering::Relaxed);
        self.ring
            .u64_at(pos, slot::AUX)
            .store(u64::from(aux), Ordering::Relaxed);
    }

    /// Sends the first `len` bytes of buffer `index` (already written, e.g. via
    /// [`TxRing::buffer_mut`]) with the opaque `aux` word. The buffer is then in flight: the
    /// sender must not write it until [`TxRing::reclaim`] returns it.
    ///
    /// Returns `Ok(false)` if the descriptor ring is full (the buffer stays with the caller).
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`], [`WireError::BufferInFlight`],
    /// [`WireError::PayloadTooLarge`] (`len > buffer_size`) for caller mistakes;
    /// [`WireError::Corrupt`] if the consumer head read from the segment is invalid.
    #[inline]
    pub fn try_send_buf(&mut self, index: u32, len: u32, aux: u32) -> Result<bool, WireError> {
        self.pool.check(index)?;
        if self.in_flight.get(index) {
            return Err(WireError::BufferInFlight { index });
        }
        if len > self.pool.size {
            return Err(WireError::PayloadTooLarge {
                len: len as usize,
                max: self.pool.size as usize,
            });
        }
        if !self.reserve(1)? {
            return Ok(false);
        }
        let pos = self.tail;
        self.write_first(pos, len, index, aux);
        self.ring
            .u64_at(pos, slot::SEQ)
            .store(pos + 1, Ordering::Release);
        self.tail = pos + 1;
        self.in_flight.set(index);
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
            if index >= self.pool.count {
                return Err(WireError::corrupt(
                    Field::ReleaseIndex,
                    u64::from(index),
                    pos,
                ));
            }
            if !self.in_flight.get(index) {
                return Err(WireError::corrupt(
                    Field::ReleaseDuplicate,
                    u64::from(index),
                    pos,
                ));
            }
            self.in_flight.clear(index);
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
        self.pool.check(index)?;
        if self.in_flight.get(index) {
            return Err(WireError::BufferInFlight { index });
        }
        let p = self.pool.ptr(index);
        // SAFETY: the buffer lies inside the mapping kept alive by `self.map` and is owned by
        // this side (not in flight), so the protocol gives the peer no access; the borrow of
        // `&mut self` prevents another view through this handle while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), self.pool.size as usize) })
    }

    /// Raw pointer to buffer `index` (`buffer_size` bytes), for handing a buffer to another
    /// thread (the engine's `SendBuf`). The pointer stays valid while any handle of the segment
    /// (e.g. a [`crate::fabric::shm::wire::Segment`] clone) is alive; writing through it is
    /// allowed only while the buffer is not in flight.
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`].
    #[inline]
    pub fn buffer_ptr(&self, index: u32) -> Result<NonNull<u8>, WireError> {
        self.pool.check(index)?;
        Ok(self.pool.ptr(index))
    }
}
