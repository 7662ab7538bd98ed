//! The receiving half of a direction: [`RxRing`] polls and validates records ([`RxRecord`]) and
//! releases buffers back to the sender. The protocol is described in [`ring`](super::ring).

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::error::{Field, WireError};
use super::layout::{
    slot, slots_for_inline, Dir, CONT_SLOT_HEADER_SIZE, CONT_SLOT_INLINE, FIRST_SLOT_INLINE,
    SLOT_HEADER_SIZE,
};
use super::mapping::Mapping;
use super::ring::{
    load_payload, load_payload_uninit, Bitmap, DescRing, Pool, RelRing, CONT_BIT, INLINE_BUF,
};

/// What a received record carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxPayload {
    /// Inline payload occupying `slots` descriptor slots; copy it out with
    /// [`RxRing::copy_inline`] before [`RxRing::commit`].
    Inline {
        /// Number of slots the record occupies.
        slots: u32,
    },
    /// A buffer now held by the receiver: read it with [`RxRing::buffer`], return it with
    /// [`RxRing::release`].
    Buffer {
        /// Validated buffer index (`< buffer_count`).
        index: u32,
    },
}

/// A validated record polled from the descriptor ring ([`RxRing::poll`]): its first slot's
/// header words, and where its payload is (inline in the record's slots, or in a buffer).
///
/// Wire-level only: not the engine's application-facing [`crate::RxDesc`], which the shm
/// fabric fills from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxRecord {
    pos: u64,
    len: u32,
    aux: u32,
    payload: RxPayload,
}

impl RxRecord {
    /// Payload length in bytes (validated: `<= inline_max` or `<= buffer_size`).
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// `true` for a zero-length message.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sender's opaque `aux` word (credits/flags): NOT validated by the wire layer.
    #[inline]
    pub fn aux(&self) -> u32 {
        self.aux
    }

    /// Inline or buffer payload.
    #[inline]
    pub fn payload(&self) -> RxPayload {
        self.payload
    }

    /// Ring position of the record (diagnostics).
    #[inline]
    pub fn position(&self) -> u64 {
        self.pos
    }
}

/// The receiving half of this side's direction: polls descriptors and releases buffers back to
/// the sender.
///
/// `Send + !Sync`, methods take `&mut self`. Holds the mapping alive.
///
/// # Inline payload lifetime
/// Slots of descriptors returned by [`RxRing::poll`] stay reserved (the sender cannot reuse
/// them) until [`RxRing::commit`]. Copy inline payloads out with [`RxRing::copy_inline`] before
/// committing; after `commit` the bytes may be overwritten.
pub struct RxRing {
    map: Arc<Mapping>,
    ring: DescRing,
    /// Next position to poll (always a record boundary).
    read: u64,
    /// Last head published to the sender. Invariant: `committed <= read`.
    committed: u64,
    inline_max: u32,
    rel: RelRing,
    /// Next release entry to write.
    rel_tail: u64,
    /// Last tail published with `publish_releases`.
    rel_published: u64,
    /// Last validated release head. Invariant: `rel_head_cache <= rel_tail <= rel_head_cache + cap`.
    rel_head_cache: u64,
    pool: Pool,
    /// Bit set = the receiver holds the buffer (delivered, not yet released).
    held: Bitmap,
    held_count: u32,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: as for `TxRing`: pointers into the mapping kept alive by `map`; `!Sync` is kept.
unsafe impl Send for RxRing {}

impl std::fmt::Debug for RxRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxRing")
            .field("side", &self.map.side())
            .field("read", &self.read)
            .field("committed", &self.committed)
            .field("held", &self.held_count)
            .finish()
    }
}

impl RxRing {
    pub(crate) fn new(map: Arc<Mapping>, dir: Dir) -> Self {
        let ring = DescRing::new(&map, dir);
        let rel = RelRing::new(&map, dir);
        let pool = Pool::new(&map, dir);
        let p = *map.layout().params();
        RxRing {
            ring,
            read: 0,
            committed: 0,
            inline_max: p.inline_max,
            rel,
            rel_tail: 0,
            rel_published: 0,
            rel_head_cache: 0,
            held: Bitmap::new(p.buffer_count),
            held_count: 0,
            pool,
            map,
            _not_sync: PhantomData,
        }
    }

    /// Size of each buffer in bytes.
    #[inline]
    pub fn buffer_size(&self) -> usize {
        self.pool.size as usize
    }

    /// Largest inline payload the peer may send.
    #[inline]
    pub fn inline_max(&self) -> usize {
        self.inline_max as usize
    }

    /// Buffers currently held by the receiver (delivered and not yet released).
    #[inline]
    pub fn held(&self) -> u32 {
        self.held_count
    }

    /// Cheap check before [`RxRing::poll`]: `false` only if the next slot certainly holds no new
    /// record (its `seq` is the stale value of an empty slot). Anything else — a record, or a value
    /// `poll` will reject as corrupt — returns `true`. One load; lets a poller skip its receive
    /// set-up on idle connections.
    #[inline]
    pub fn has_pending(&self) -> bool {
        let pos = self.read;
        let seq = self.ring.u64_at(pos, slot::SEQ).load(Ordering::Acquire);
        if seq == pos + 1 {
            return true;
        }
        let stale = (pos + 1).saturating_sub(self.ring.depth);
        !(seq == stale || (stale != 0 && seq == stale | CONT_BIT))
    }

    /// Polls the next record: `Ok(None)` if none is published yet. On `Ok(Some(desc))` the read
    /// position advances past the record (its slots stay reserved until [`RxRing::commit`]);
    /// a buffer descriptor marks the buffer held by the receiver.
    ///
    /// Reads one `seq` word when nothing is pending. Bounded work: never waits.
    ///
    /// # Errors
    /// [`WireError::Corrupt`] for an invalid `seq` (a jump or garbage), flags, length, buffer
    /// index, a buffer the receiver already holds, or a bad continuation stamp.
    #[inline]
    pub fn poll(&mut self) -> Result<Option<RxRecord>, WireError> {
        let pos = self.read;
        let seq = self.ring.u64_at(pos, slot::SEQ).load(Ordering::Acquire);
        if seq != pos + 1 {
            return self.not_ready(seq, pos);
        }
        let len_buf = self.ring.u64_at(pos, slot::LEN).load(Ordering::Relaxed);
        let aux_flags = self.ring.u64_at(pos, slot::AUX).load(Ordering::Relaxed);
        let (len, buf) = (len_buf as u32, (len_buf >> 32) as u32);
        let (aux, flags) = (aux_flags as u32, (aux_flags >> 32) as u32);
        if flags != 0 {
            return Err(WireError::corrupt(Field::DescFlags, u64::from(flags), pos));
        }
        let payload = if buf == INLINE_BUF {
            if len > self.inline_max {
                return Err(WireError::corrupt(Field::DescLen, u64::from(len), pos));
            }
            // `len <= inline_max`, which `Params::validate` bounds to `<= ring_depth` slots.
            let k = slots_for_inline(len as usize) as u64;
            for q in pos + 1..pos + k {
                let stamp = self.ring.u64_at(q, 0).load(Ordering::Relaxed);
                if stamp != (q + 1) | CONT_BIT {
                    return Err(WireError::corrupt(Field::ContStamp, stamp, q));
                }
            }
            self.read = pos + k;
            RxPayload::Inline { slots: k as u32 }
        } else {
            if buf >= self.pool.count {
                return Err(WireError::corrupt(Field::DescBufIndex, u64::from(buf), pos));
            }
            if len > self.pool.size {
                return Err(WireError::corrupt(Field::DescLen, u64::from(len), pos));
            }
            if self.held.get(buf) {
                return Err(WireError::corrupt(Field::DescBufHeld, u64::from(buf), pos));
            }
            self.held.set(buf);
            self.held_count += 1;
            self.read = pos + 1;
            RxPayload::Buffer { index: buf }
        };
        Ok(Some(RxRecord {
            pos,
            len,
            aux,
            payload,
        }))
    }

    /// A `seq` other than the expected one: stale (from the previous lap, or 0 before the first
    /// lap) means empty; anything else is corrupt.
    #[cold]
    fn not_ready(&self, seq: u64, pos: u64) -> Result<Option<RxRecord>, WireError> {
        let stale = (pos + 1).saturating_sub(self.ring.depth);
        if seq == stale || (stale != 0 && seq == stale | CONT_BIT) {
            Ok(None)
        } else {
            Err(WireError::corrupt(Field::DescSeq, seq, pos))
        }
    }

    /// Copies the inline payload of `desc` (from the last [`RxRing::poll`]s, before
    /// [`RxRing::commit`]) into `out`; returns the length. Uses atomic loads, so a concurrent
    /// write by a hostile peer can tear the bytes but is never undefined behaviour.
    ///
    /// # Errors
    /// [`WireError::PayloadTooLarge`] if `out` is shorter than `desc.len()` (`max` is
    /// `out.len()`), or if `desc` is not an inline descriptor (`max` 0).
    #[inline]
    pub fn copy_inline(&self, desc: &RxRecord, out: &mut [u8]) -> Result<usize, WireError> {
        let len = desc.len as usize;
        if !matches!(desc.payload, RxPayload::Inline { .. }) || out.len() < len {
            let max = if matches!(desc.payload, RxPayload::Inline { .. }) {
                out.len()
            } else {
                0
            };
            return Err(WireError::PayloadTooLarge { len, max });
        }
        let out = &mut out[..len];
        let (first, rest) = out.split_at_mut(len.min(FIRST_SLOT_INLINE));
        load_payload(&self.ring, desc.pos, SLOT_HEADER_SIZE, first);
        for (i, chunk) in rest.chunks_mut(CONT_SLOT_INLINE).enumerate() {
            load_payload(
                &self.ring,
                desc.pos + 1 + i as u64,
                CONT_SLOT_HEADER_SIZE,
                chunk,
            );
        }
        Ok(len)
    }

    /// [`RxRing::copy_inline`] into uninitialised memory (e.g. a descriptor slot of an
    /// application-facing ring), so a receiver can move an inline payload from the segment to
    /// its destination in one copy. On `Ok(len)` the first `len` bytes of `out` are initialised.
    ///
    /// # Errors
    /// As [`RxRing::copy_inline`].
    #[inline]
    pub fn copy_inline_uninit(
        &self,
        desc: &RxRecord,
        out: &mut [MaybeUninit<u8>],
    ) -> Result<usize, WireError> {
        let len = desc.len as usize;
        if !matches!(desc.payload, RxPayload::Inline { .. }) || out.len() < len {
            let max = if matches!(desc.payload, RxPayload::Inline { .. }) {
                out.len()
            } else {
                0
            };
            return Err(WireError::PayloadTooLarge { len, max });
        }
        let out = &mut out[..len];
        let (first, rest) = out.split_at_mut(len.min(FIRST_SLOT_INLINE));
        load_payload_uninit(&self.ring, desc.pos, SLOT_HEADER_SIZE, first);
        for (i, chunk) in rest.chunks_mut(CONT_SLOT_INLINE).enumerate() {
            load_payload_uninit(
                &self.ring,
                desc.pos + 1 + i as u64,
                CONT_SLOT_HEADER_SIZE,
                chunk,
            );
        }
        Ok(len)
    }

    /// Returns the slots of every polled record to the sender (one `Release` store of the
    /// consumer head, skipped if nothing was polled). Inline payloads of those records become
    /// invalid.
    #[inline]
    pub fn commit(&mut self) {
        if self.read != self.committed {
            self.ring.head().store(self.read, Ordering::Release);
            self.committed = self.read;
        }
    }

    /// Shared view of the first `len` bytes of held buffer `index`, read in place (zero copy).
    ///
    /// The protocol gives the sender no write access while the receiver holds the buffer, but a
    /// hostile peer may still write it: treat the bytes as untrusted input that can change while
    /// read (parse, don't trust; never derive memory-safety facts from them).
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`], [`WireError::BufferNotHeld`], or
    /// [`WireError::PayloadTooLarge`] if `len > buffer_size`.
    #[inline]
    pub fn buffer(&self, index: u32, len: usize) -> Result<&[u8], WireError> {
        self.pool.check(index)?;
        if !self.held.get(index) {
            return Err(WireError::BufferNotHeld { index });
        }
        if len > self.pool.size as usize {
            return Err(WireError::PayloadTooLarge {
                len,
                max: self.pool.size as usize,
            });
        }
        let p = self.pool.ptr(index);
        // SAFETY: the buffer lies inside the mapping kept alive by `self.map` and `len` is within
        // it; see the method docs for what concurrent peer writes mean for the contents.
        Ok(unsafe { std::slice::from_raw_parts(p.as_ptr(), len) })
    }

    /// Raw pointer to buffer `index`, for handing a received buffer to another thread (the
    /// engine's `Message`). Valid while any handle of the segment is alive; reading through it
    /// is allowed only while the buffer is held (between `poll` and `release`).
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`].
    #[inline]
    pub fn buffer_ptr(&self, index: u32) -> Result<NonNull<u8>, WireError> {
        self.pool.check(index)?;
        Ok(self.pool.ptr(index))
    }

    /// Returns held buffer `index` to the sender (staged; visible after
    /// [`RxRing::publish_releases`]). The receiver must not read the buffer afterwards.
    ///
    /// # Errors
    /// [`WireError::BadBufferIndex`], [`WireError::BufferNotHeld`] for caller mistakes;
    /// [`WireError::Corrupt`] if the release head read from the segment is invalid or the ring
    /// overflows (impossible with an honest sender, see [`Field::ReleaseOverflow`]).
    #[inline]
    pub fn release(&mut self, index: u32) -> Result<(), WireError> {
        self.pool.check(index)?;
        if !self.held.get(index) {
            return Err(WireError::BufferNotHeld { index });
        }
        if self.rel_tail - self.rel_head_cache >= self.rel.cap {
            let h = self.rel.head().load(Ordering::Acquire);
            if h < self.rel_head_cache || h > self.rel_published {
                return Err(WireError::corrupt(Field::ReleaseHead, h, self.rel_tail));
            }
            self.rel_head_cache = h;
            if self.rel_tail - h >= self.rel.cap {
                return Err(WireError::corrupt(
                    Field::ReleaseOverflow,
                    self.rel_tail - h,
                    self.rel_tail,
                ));
            }
        }
        self.rel
            .entry(self.rel_tail)
            .store(index, Ordering::Relaxed);
        self.rel_tail += 1;
        self.held.clear(index);
        self.held_count -= 1;
        Ok(())
    }

    /// Publishes all staged releases with one `Release` store (skipped if none are staged).
    #[inline]
    pub fn publish_releases(&mut self) {
        if self.has_unpublished_releases() {
            self.rel.tail().store(self.rel_tail, Ordering::Release);
            self.rel_published = self.rel_tail;
        }
    }

    /// Whether [`RxRing::release`]s are waiting for [`RxRing::publish_releases`].
    #[inline]
    pub fn has_unpublished_releases(&self) -> bool {
        self.rel_tail != self.rel_published
    }
}
