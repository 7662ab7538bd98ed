//! The protocol shared by the data-path handles [`TxRing`] (write records, reclaim released
//! buffers) and [`RxRing`] (poll records, release buffers).
//!
//! This module holds the protocol (below) and the geometry both halves share: the record ring
//! region of one direction as [`RingMemory`] over the mapping, typed views of its release ring
//! and buffer pool, and the ownership bitmap. The halves themselves live in `tx` ([`TxRing`])
//! and `rx` ([`RxRing`]); both only read this module, never each other.
//!
//! [`TxRing`]: super::TxRing
//! [`RxRing`]: super::RxRing
//!
//! # Record ring protocol
//! Each direction has one SPSC record ring ([`crate::record::ring`]) in the segment: the sender
//! of the direction is its producer, the receiver its consumer. A message up to `inline_max`
//! bytes is a `DATA` record (header + payload, 8-aligned, several per cache line); a larger one
//! stays in a pool buffer and travels as a 16-byte `BUF_REF` record (`buf`, `len`). The header
//! word is the commit flag (stored last, `Release`), a batch is published with one store, the
//! consumer publishes its position once per poll (or, taking one message per call with
//! [`RxRing::take_inline`], per message; [`RxRing::poll_deferred`] leaves it to
//! [`RxRing::publish`]) and the producer re-reads it only when its cached window runs out.
//! The ring is the credit: a full ring is back-pressure.
//!
//! [`RxRing::poll_deferred`]: super::RxRing::poll_deferred
//! [`RxRing::take_inline`]: super::RxRing::take_inline
//! [`RxRing::publish`]: super::RxRing::publish
//!
//! # Release ring protocol
//! Buffers of direction `d` belong to `d`'s sender. The receiver returns each buffer index it
//! was given through a single-producer ring of `u32` entries (capacity `buffer_count` rounded up to
//! a power of two) with a tail (written by the receiver, published in batches by
//! [`Releaser::publish_releases`]) and a head (written by the sender in [`TxRing::reclaim`]).
//!
//! # Validation
//! Every word read from the peer is checked before use: record headers and the consumer
//! position by the record ring ([`crate::record::ring::RingError`], surfaced as
//! [`WireError::Ring`]), buffer references, release entries and release positions here
//! ([`WireError::Corrupt`]). Both sides keep a private bitmap of buffer ownership, so a buffer
//! the peer sends twice, or releases twice or without having it, is detected. Every call does a
//! bounded amount of work; nothing waits for the peer. After such an error the handle's state
//! is unspecified (but memory safe): fail the connection and drop it.
//!
//! [`Releaser::publish_releases`]: super::Releaser::publish_releases
//! [`TxRing::reclaim`]: super::TxRing::reclaim
//! [`WireError::Corrupt`]: super::WireError::Corrupt
//! [`WireError::Ring`]: super::WireError::Ring

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

use super::error::WireError;
use super::layout::Dir;
use super::mapping::Mapping;
#[cfg(loom)]
use crate::record::ring::RingError;
#[cfg(not(loom))]
use crate::record::ring::{region_size, RingMemory};
use crate::record::ring::{Consumer, Producer};

/// One direction's record ring region, as [`RingMemory`] for the ring handles: the mapping
/// (kept alive by the `Arc`) plus the region's offset and size from the local layout.
#[cfg(not(loom))]
pub(super) struct SegRing {
    map: Arc<Mapping>,
    off: usize,
    len: usize,
}

#[cfg(not(loom))]
impl SegRing {
    pub(super) fn new(map: Arc<Mapping>, dir: Dir) -> SegRing {
        let off = map.layout().dir(dir).ring;
        let len = region_size(map.layout().ring_capacity());
        SegRing { map, off, len }
    }
}

/// The producing end of direction `dir`'s record ring (DATA payloads up to `max_payload`).
#[cfg(not(loom))]
pub(super) fn ring_producer(
    map: &Arc<Mapping>,
    dir: Dir,
    max_payload: usize,
) -> Result<Producer, WireError> {
    Producer::attach(Arc::new(SegRing::new(Arc::clone(map), dir)), max_payload)
        .map_err(|source| WireError::Ring { source })
}

/// The consuming end of direction `dir`'s record ring.
#[cfg(not(loom))]
pub(super) fn ring_consumer(
    map: &Arc<Mapping>,
    dir: Dir,
    max_payload: usize,
) -> Result<Consumer, WireError> {
    Consumer::attach(Arc::new(SegRing::new(Arc::clone(map), dir)), max_payload)
        .map_err(|source| WireError::Ring { source })
}

/// Under `--cfg loom` the ring runs over loom's tracked heap words only (the loom model tests
/// the ring itself): a segment's rings cannot be attached.
#[cfg(loom)]
fn not_modelled() -> WireError {
    WireError::Ring {
        source: RingError::BadGeometry {
            reason: "shm segment rings are not available under loom",
            size_bytes: 0,
        },
    }
}

#[cfg(loom)]
pub(super) fn ring_producer(_: &Arc<Mapping>, _: Dir, _: usize) -> Result<Producer, WireError> {
    Err(not_modelled())
}

#[cfg(loom)]
pub(super) fn ring_consumer(_: &Arc<Mapping>, _: Dir, _: usize) -> Result<Consumer, WireError> {
    Err(not_modelled())
}

// SAFETY: `off .. off + len` is the direction's ring region of the locally computed layout:
// inside the mapping (which the `Arc` keeps mapped for as long as this value lives, at a fixed
// address), 128-byte aligned (`Layout` places it at a multiple of `CACHE_PAD` from the
// page-aligned base). In this process only the ring handle attached to it (one producer or one
// consumer per side) accesses it; the peer process is untrusted, which the ring's trust model
// covers.
#[cfg(not(loom))]
unsafe impl RingMemory for SegRing {
    fn as_ptr(&self) -> *mut u8 {
        self.map.base().wrapping_add(self.off)
    }

    fn size_bytes(&self) -> usize {
        self.len
    }
}

/// A fixed bitmap of per-buffer ownership, allocated at setup.
pub(super) struct Bitmap(Box<[u64]>);

impl Bitmap {
    pub(super) fn new(bits: u32) -> Self {
        Bitmap(vec![0u64; (bits as usize).div_ceil(64)].into_boxed_slice())
    }
    /// Callers pass `i < bits` (checked before); out-of-range reads as unset and writes are
    /// ignored, so there is no panic path.
    #[inline(always)]
    pub(super) fn get(&self, i: u32) -> bool {
        self.0
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }
    #[inline(always)]
    pub(super) fn set(&mut self, i: u32) {
        if let Some(w) = self.0.get_mut((i / 64) as usize) {
            *w |= 1 << (i % 64);
        }
    }
    #[inline(always)]
    pub(super) fn clear(&mut self, i: u32) {
        if let Some(w) = self.0.get_mut((i / 64) as usize) {
            *w &= !(1 << (i % 64));
        }
    }
}

/// Release-ring geometry.
pub(super) struct RelRing {
    entries: *const AtomicU32,
    mask: u64,
    /// Entries in the ring (a power of two).
    pub(super) cap: u64,
    tail_word: *const AtomicU64,
    head_word: *const AtomicU64,
}

impl RelRing {
    pub(super) fn new(map: &Mapping, dir: Dir) -> Self {
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
    pub(super) fn entry(&self, pos: u64) -> &AtomicU32 {
        // SAFETY: `pos & mask < cap`, and the layout reserves `cap` 4-aligned u32 entries inside
        // the live mapping.
        unsafe { &*self.entries.add((pos & self.mask) as usize) }
    }
    #[inline(always)]
    pub(super) fn tail(&self) -> &AtomicU64 {
        // SAFETY: 8-aligned word of the live mapping (see `RelRing::new`).
        unsafe { &*self.tail_word }
    }
    #[inline(always)]
    pub(super) fn head(&self) -> &AtomicU64 {
        // SAFETY: 8-aligned word of the live mapping (see `RelRing::new`).
        unsafe { &*self.head_word }
    }
}

/// Buffer-pool geometry of one direction: `count` buffers of `size` bytes, then
/// `large_count` large slots of `large_size` bytes, named `LARGE_BIT | slot`
/// ([`crate::desc::LARGE_BIT`]). Ownership bitmaps index both with [`Pool::check`]'s dense bit:
/// the buffers first, then the slots.
pub(super) struct Pool {
    base: *mut u8,
    /// Size of each buffer in bytes.
    pub(super) size: u32,
    /// Number of buffers.
    pub(super) count: u32,
    large_base: *mut u8,
    /// Size of each large slot in bytes (0 without).
    pub(super) large_size: u32,
    /// Number of large slots.
    pub(super) large_count: u32,
}

impl Pool {
    pub(super) fn new(map: &Mapping, dir: Dir) -> Self {
        let p = map.layout().params();
        let d = map.layout().dir(dir);
        Pool {
            base: map.base().wrapping_add(d.buffers),
            size: p.buffer_size,
            count: p.buffer_count,
            large_base: map.base().wrapping_add(d.large),
            large_size: p.large_size,
            large_count: p.large_count,
        }
    }

    /// Start and length in bytes of the large slots (page aligned; 0 bytes without slots).
    pub(super) fn large_range(&self) -> (*mut u8, usize) {
        (
            self.large_base,
            self.large_size as usize * self.large_count as usize,
        )
    }

    /// Bits an ownership bitmap needs: every buffer and every large slot.
    pub(super) fn bits(&self) -> u32 {
        self.count + self.large_count
    }

    /// Checks `index` (a buffer, or `LARGE_BIT | slot`) and returns its bit in an ownership
    /// bitmap of [`bits`](Self::bits).
    #[inline(always)]
    pub(super) fn check(&self, index: u32) -> Result<u32, WireError> {
        if index < self.count {
            Ok(index)
        } else if crate::desc::is_large(index) && crate::desc::large_slot(index) < self.large_count
        {
            Ok(self.count + crate::desc::large_slot(index))
        } else {
            Err(WireError::BadBufferIndex {
                index,
                count: self.count,
            })
        }
    }

    /// Size of buffer (or slot) `index`; caller checked `index`.
    #[inline(always)]
    pub(super) fn size_of(&self, index: u32) -> u32 {
        if crate::desc::is_large(index) {
            self.large_size
        } else {
            self.size
        }
    }

    /// Caller guarantees `check(index)` passed.
    #[inline(always)]
    pub(super) fn ptr(&self, index: u32) -> NonNull<u8> {
        let p = if crate::desc::is_large(index) {
            self.large_base
                .wrapping_add(crate::desc::large_slot(index) as usize * self.large_size as usize)
        } else {
            self.base.wrapping_add(index as usize * self.size as usize)
        };
        // The mapping base is non-null and the buffer lies inside it, so `p` is non-null.
        NonNull::new(p).unwrap_or(NonNull::dangling())
    }
}
