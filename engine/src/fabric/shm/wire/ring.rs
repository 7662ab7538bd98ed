//! The data-path handles: [`TxRing`] (send descriptors, reclaim released buffers) and [`RxRing`]
//! (poll descriptors, release buffers).
//!
//! # Descriptor ring protocol
//! Each direction has `ring_depth` 64-B slots. Positions are `u64` counters that never wrap;
//! position `p` lives in slot `p & (ring_depth - 1)`.
//!
//! * A record starts with a *first slot*: `seq: u64 = p + 1` (stored last, with `Release`),
//!   `len: u32`, `buf: u32` (buffer index, or [`INLINE_BUF`]), `aux: u32` (opaque to the wire:
//!   the engine's piggybacked credits/flags), `flags: u32` (reserved, must be 0), then 40 inline
//!   payload bytes.
//! * An inline payload longer than 40 bytes continues in the following slots (wrapping around the
//!   ring end naturally): each *continuation slot* holds a stamp `(q + 1) | CONT_BIT` for its
//!   position `q`, then 56 payload bytes. Continuations are written before the first slot's `seq`.
//! * The receiver polls only the `seq` word of the next expected position: no shared tail
//!   counter, so one small message costs one cache-line transfer, and a burst of records is
//!   naturally batched (each slot is published independently, in order).
//! * The receiver publishes its consumer head (one `AtomicU64` on its own 128-B line) on
//!   [`RxRing::commit`]; the sender re-reads it only when its cached copy says the ring is full.
//!
//! # Release ring protocol
//! Buffers of direction `d` belong to `d`'s sender. The receiver returns each buffer index it
//! was given through a single-producer ring of `u32` entries (capacity `buffer_count` rounded up to
//! a power of two) with a tail (written by the receiver, published in batches by
//! [`RxRing::publish_releases`]) and a head (written by the sender in [`TxRing::reclaim`]).
//!
//! # Performance
//! `cargo bench -p spinwire --bench shm_wire` compares the ring with bare cache-line transfers in
//! the same run. Best of 30 short runs on the 2-core development VM (shared with other builds, so
//! medians were far worse and unreliable): ping-pong RTT bare cache line 260-290 ns; ring inline
//! 8 B 309 ns (1.17x), 40 B 287 ns, 64 B (two slots) 335 ns (1.27x). One-way streaming: bare 64-B
//! lines 72-85 M/s; ring inline 8 B up to 43 M msgs/s, 64 B up to 39 M msgs/s (two slots per
//! message, i.e. about 78 M lines/s). Single-thread cost of send + poll + copy-out: about 8 ns
//! (8 B) to 18 ns (64 B).
//!
//! # Validation
//! Every word read from the peer is checked before use; a bad one yields
//! [`WireError::Corrupt`]. Both sides keep a private bitmap of buffer ownership, so a buffer the
//! peer sends twice, or releases twice or without having it, is detected. Every call does a
//! bounded amount of work; nothing waits for the peer. After a `Corrupt` error the handle's state
//! is unspecified (but memory safe): fail the connection and drop it.

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::error::Field;
use super::layout::{
    slot, slots_for_inline, Dir, CONT_SLOT_HEADER_SIZE, CONT_SLOT_INLINE, FIRST_SLOT_INLINE,
    SLOT_HEADER_SIZE, SLOT_SIZE,
};
use super::segment::Mapping;
use super::WireError;

/// `buf` value of an inline record.
pub const INLINE_BUF: u32 = u32::MAX;
/// Bit set in the stamp of a continuation slot.
pub const CONT_BIT: u64 = 1 << 63;

/// Ring geometry shared by both handle types; pointers are into the `Arc<Mapping>` they hold.
struct DescRing {
    slots: *mut u8,
    mask: u64,
    depth: u64,
    head_word: *const AtomicU64,
}

impl DescRing {
    fn new(map: &Mapping, dir: Dir) -> Self {
        let l = map.layout().dir(dir);
        let depth = u64::from(map.layout().params().ring_depth);
        DescRing {
            // `wrapping_add` keeps this safe; offsets are in bounds by construction of `Layout`.
            slots: map.base().wrapping_add(l.desc_slots),
            mask: depth - 1,
            depth,
            head_word: map.atomic_u64(l.desc_head),
        }
    }

    /// Pointer to the slot of position `pos`.
    #[inline(always)]
    fn slot(&self, pos: u64) -> *mut u8 {
        let index = (pos & self.mask) as usize;
        // `index < depth`, so the slot lies inside the ring: computed without `unsafe`.
        self.slots.wrapping_add(index * SLOT_SIZE)
    }

    /// The word at byte `off` of the slot of position `pos`.
    #[inline(always)]
    fn u64_at(&self, pos: u64, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= SLOT_SIZE);
        // SAFETY: the slot is inside the live mapping (held by the owning handle's Arc), slots
        // are 64-B aligned and `off` is an 8-aligned offset inside the slot (all call sites use
        // constants or 8-B steps bounded by SLOT_SIZE). Shared memory is accessed atomically only.
        unsafe { &*self.slot(pos).add(off).cast::<AtomicU64>() }
    }

    #[inline(always)]
    fn head(&self) -> &AtomicU64 {
        // SAFETY: points at an 8-aligned word of the live mapping (see `DescRing::new`).
        unsafe { &*self.head_word }
    }
}

/// Copies `src` into a slot's payload area starting at 8-aligned `off`, as relaxed u64 stores
/// (the last chunk zero padded; payload areas are multiples of 8 bytes).
#[inline(always)]
fn store_payload(ring: &DescRing, pos: u64, off: usize, src: &[u8]) {
    let mut chunks = src.chunks_exact(8);
    let mut o = off;
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        ring.u64_at(pos, o)
            .store(u64::from_ne_bytes(w), Ordering::Relaxed);
        o += 8;
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        let mut w = [0u8; 8];
        w[..rem.len()].copy_from_slice(rem);
        ring.u64_at(pos, o)
            .store(u64::from_ne_bytes(w), Ordering::Relaxed);
    }
}

/// Copies a slot's payload area starting at 8-aligned `off` into `dst` with relaxed u64 loads.
#[inline(always)]
fn load_payload(ring: &DescRing, pos: u64, off: usize, dst: &mut [u8]) {
    let mut o = off;
    let mut chunks = dst.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&ring.u64_at(pos, o).load(Ordering::Relaxed).to_ne_bytes());
        o += 8;
    }
    let rem = chunks.into_remainder();
    if !rem.is_empty() {
        let w = ring.u64_at(pos, o).load(Ordering::Relaxed).to_ne_bytes();
        let n = rem.len();
        rem.copy_from_slice(&w[..n]);
    }
}

/// [`load_payload`] into uninitialised memory: every byte of `dst` is written.
#[inline(always)]
fn load_payload_uninit(ring: &DescRing, pos: u64, off: usize, dst: &mut [MaybeUninit<u8>]) {
    let mut o = off;
    let mut chunks = dst.chunks_exact_mut(8);
    for c in &mut chunks {
        let w = ring.u64_at(pos, o).load(Ordering::Relaxed).to_ne_bytes();
        c.copy_from_slice(&w.map(MaybeUninit::new));
        o += 8;
    }
    let rem = chunks.into_remainder();
    if !rem.is_empty() {
        let w = ring.u64_at(pos, o).load(Ordering::Relaxed).to_ne_bytes();
        let n = rem.len();
        rem.copy_from_slice(&w.map(MaybeUninit::new)[..n]);
    }
}

/// A fixed bitmap of per-buffer ownership, allocated at setup.
struct Bitmap(Box<[u64]>);

impl Bitmap {
    fn new(bits: u32) -> Self {
        Bitmap(vec![0u64; (bits as usize).div_ceil(64)].into_boxed_slice())
    }
    /// Callers pass `i < bits` (checked before); out-of-range reads as unset and writes are
    /// ignored, so there is no panic path.
    #[inline(always)]
    fn get(&self, i: u32) -> bool {
        self.0
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    #[inline(always)]
    fn set(&mut self, i: u32) {
        if let Some(w) = self.0.get_mut((i / 64) as usize) {
            *w |= 1 << (i % 64);
        }
    }
    #[inline(always)]
    fn clear(&mut self, i: u32) {
        if let Some(w) = self.0.get_mut((i / 64) as usize) {
            *w &= !(1 << (i % 64));
        }
    }
}

/// Release-ring geometry.
struct RelRing {
    entries: *const AtomicU32,
    mask: u64,
    cap: u64,
    tail_word: *const AtomicU64,
    head_word: *const AtomicU64,
}

impl RelRing {
    fn new(map: &Mapping, dir: Dir) -> Self {
        let l = map.layout().dir(dir);
        let cap = u64::from(map.layout().release_capacity());
        RelRing {
            entries: map.atomic_u32(l.rel_entries),
            mask: cap - 1,
            cap,
            tail_word: map.atomic_u64(l.rel_tail),
            head_word: map.atomic_u64(l.rel_head),
        }
    }
    #[inline(always)]
    fn entry(&self, pos: u64) -> &AtomicU32 {
        // SAFETY: `pos & mask < cap`, and the layout reserves `cap` 4-aligned u32 entries inside
        // the live mapping.
        unsafe { &*self.entries.add((pos & self.mask) as usize) }
    }
    #[inline(always)]
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: 8-aligned word of the live mapping (see `RelRing::new`).
        unsafe { &*self.tail_word }
    }
    #[inline(always)]
    fn head(&self) -> &AtomicU64 {
        // SAFETY: 8-aligned word of the live mapping (see `RelRing::new`).
        unsafe { &*self.head_word }
    }
}

/// Buffer-pool geometry of one direction.
struct Pool {
    base: *mut u8,
    size: u32,
    count: u32,
}

impl Pool {
    fn new(map: &Mapping, dir: Dir) -> Self {
        let p = map.layout().params();
        Pool {
            base: map.base().wrapping_add(map.layout().dir(dir).buffers),
            size: p.buffer_size,
            count: p.buffer_count,
        }
    }
    #[inline(always)]
    fn check(&self, index: u32) -> Result<(), WireError> {
        if index < self.count {
            Ok(())
        } else {
            Err(WireError::BadBufferIndex {
                index,
                count: self.count,
            })
        }
    }
    /// Caller guarantees `index < count`.
    #[inline(always)]
    fn ptr(&self, index: u32) -> NonNull<u8> {
        let p = self.base.wrapping_add(index as usize * self.size as usize);
        // The mapping base is non-null and the buffer lies inside it, so `p` is non-null.
        NonNull::new(p).unwrap_or(NonNull::dangling())
    }
}

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

/// What a received descriptor carries.
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

/// A validated received descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxDesc {
    pos: u64,
    len: u32,
    aux: u32,
    payload: RxPayload,
}

impl RxDesc {
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
    pub fn poll(&mut self) -> Result<Option<RxDesc>, WireError> {
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
        Ok(Some(RxDesc {
            pos,
            len,
            aux,
            payload,
        }))
    }

    /// A `seq` other than the expected one: stale (from the previous lap, or 0 before the first
    /// lap) means empty; anything else is corrupt.
    #[cold]
    fn not_ready(&self, seq: u64, pos: u64) -> Result<Option<RxDesc>, WireError> {
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
    pub fn copy_inline(&self, desc: &RxDesc, out: &mut [u8]) -> Result<usize, WireError> {
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
        desc: &RxDesc,
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
