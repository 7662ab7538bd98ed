//! The memory a [record ring](super::ring) lives in, and the loom shim.
//!
//! Outside loom a ring works on any caller-supplied byte region ([`RingMemory`]: in shm the
//! memfd segment, in tests a [`HeapRegion`]): the shared words (the two positions and each
//! record's header word) are accessed as `AtomicU64`s cast from 8-aligned addresses of the
//! region, payloads as plain bytes in place.
//!
//! Under `RUSTFLAGS="--cfg loom"` (the crossbeam-style shim of `rings/src/primitive.rs`) loom's
//! atomics cannot be cast from raw memory, so [`HeapRegion`] is then an array of loom
//! `AtomicU64` words, one per 8 bytes, and payload bytes are copied in and out of those words
//! with `Relaxed` loads and stores. Every payload word access (and every header load by the
//! consumer) also holds a loom `UnsafeCell<()>` *tracker* guard on its word for as long as it
//! lasts, so a payload write that is not ordered by happens-before with a conflicting read (the
//! plain, non-atomic accesses of the real build) is reported by loom as a data race. The ring
//! code is the same in both builds except for these two copy points (`Claim::payload_mut` and
//! the consumer's DATA delivery), which are marked `cfg(loom)`.

#[cfg(not(loom))]
use std::ptr::NonNull;
use std::sync::Arc;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

/// Size of each position line: 128 B, as crossbeam's `CachePadded` on x86_64 (the adjacent-line
/// prefetcher pulls pairs of 64-B lines).
pub const POSITION_LINE: usize = 128;
/// Bytes before the record area: the producer's position line, then the consumer's.
pub const RING_HEADER_SIZE: usize = 2 * POSITION_LINE;
/// Offset of the producer's position word (`u64`: bytes published so far).
pub const PRODUCER_POSITION_OFFSET: usize = 0;
/// Offset of the consumer's position word (`u64`: bytes consumed so far).
pub const CONSUMER_POSITION_OFFSET: usize = POSITION_LINE;

/// Smallest record area: room for a wrap of two maximal (half-capacity) records in tests.
pub const MIN_CAPACITY: usize = 32;
/// Largest record area (2 GiB): every record length fits the `u32` length word.
pub const MAX_CAPACITY: usize = 1 << 31;

/// Memory that holds one record ring: [`RING_HEADER_SIZE`] bytes of position lines followed by
/// the record area, whose size (a power of two) is the ring's capacity.
///
/// # Safety
///
/// An implementor guarantees that, for as long as the value lives, [`as_ptr`](Self::as_ptr)
/// returns the same non-null, 128-byte aligned address of [`size_bytes`](Self::size_bytes)
/// bytes that are valid for reads and writes from any thread, and that within this process
/// nothing but the ring handles attached to it accesses those bytes. The memory may be shared
/// with another process (a mapped segment); what that peer writes is validated by the ring,
/// and its payload bytes are delivered, not interpreted (see the ring's trust model).
pub unsafe trait RingMemory: Send + Sync + 'static {
    /// Start of the region.
    fn as_ptr(&self) -> *mut u8;
    /// Length of the region in bytes.
    fn size_bytes(&self) -> usize;
}

/// A zeroed, 128-byte aligned heap region for a ring whose two ends live in this process (tests,
/// in-process queues). Its words can be read and written atomically through
/// [`word`](Self::word), which tests use to play a hostile peer.
#[cfg(not(loom))]
pub struct HeapRegion {
    lines: Box<[Line]>,
    /// The size asked for (`<= lines.len() * 128`).
    size_bytes: usize,
}

#[cfg(not(loom))]
#[repr(C, align(128))]
struct Line([AtomicU64; 16]);

#[cfg(not(loom))]
impl HeapRegion {
    /// A zeroed region of `size_bytes` (allocated in whole 128-byte lines).
    pub fn new(size_bytes: usize) -> HeapRegion {
        let n = size_bytes.div_ceil(POSITION_LINE);
        HeapRegion {
            lines: (0..n)
                .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            size_bytes,
        }
    }

    /// The `index`-th 8-byte word of the region, if in range.
    pub fn word(&self, index: usize) -> Option<&AtomicU64> {
        self.lines.get(index / 16).map(|l| &l.0[index % 16])
    }

    /// Number of 8-byte words.
    pub fn words(&self) -> usize {
        self.lines.len() * 16
    }
}

#[cfg(not(loom))]
impl std::fmt::Debug for HeapRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapRegion")
            .field("size_bytes", &self.size_bytes())
            .finish()
    }
}

// SAFETY: the boxed lines never move and live as long as `self`; every byte is inside an
// `AtomicU64` (an `UnsafeCell`), so writes through the pointer derived from `&self` are allowed;
// the box is 128-aligned by `Line`'s `repr(align(128))`; `AtomicU64` is `Send + Sync`.
#[cfg(not(loom))]
unsafe impl RingMemory for HeapRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.lines.as_ptr().cast::<u8>().cast_mut()
    }

    fn size_bytes(&self) -> usize {
        self.size_bytes
    }
}

/// Under loom: one loom atomic per 8-byte word, plus one race tracker per record-area word.
#[cfg(loom)]
pub struct HeapRegion {
    words: Box<[AtomicU64]>,
    trackers: Box<[loom::cell::UnsafeCell<()>]>,
    size_bytes: usize,
}

#[cfg(loom)]
impl HeapRegion {
    /// A zeroed region of `size_bytes` (rounded up to whole words).
    pub fn new(size_bytes: usize) -> HeapRegion {
        let n = size_bytes.div_ceil(8);
        let area = n.saturating_sub(RING_HEADER_SIZE / 8);
        HeapRegion {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
            trackers: (0..area).map(|_| loom::cell::UnsafeCell::new(())).collect(),
            size_bytes,
        }
    }
}

// SAFETY: the words are loom atomics; the trackers are only touched through loom's guards,
// which is how the model checks that the ring orders every payload access.
#[cfg(loom)]
unsafe impl Send for HeapRegion {}
// SAFETY: as above.
#[cfg(loom)]
unsafe impl Sync for HeapRegion {}

#[cfg(loom)]
impl std::fmt::Debug for HeapRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapRegion")
            .field("words", &self.words.len())
            .finish()
    }
}

/// Geometry problems of a region, as reasons for `RingError::BadGeometry`.
pub(crate) fn check_geometry(base: usize, size_bytes: usize) -> Result<usize, &'static str> {
    if base % POSITION_LINE != 0 {
        return Err("region not 128-byte aligned");
    }
    let Some(cap) = size_bytes.checked_sub(RING_HEADER_SIZE) else {
        return Err("region smaller than the position lines");
    };
    if !cap.is_power_of_two() {
        return Err("record area not a power of two");
    }
    if cap < MIN_CAPACITY {
        return Err("record area below the minimum capacity");
    }
    if cap > MAX_CAPACITY {
        return Err("record area above the maximum capacity");
    }
    Ok(cap)
}

/// A ring's view of its memory: bounds-safe word accessors and the payload copy points.
///
/// `Clone`: each ring end keeps its own copy inline (a clone shares the memory), so a word
/// access is one load of the base off the handle instead of a hop through an `Arc` first.
#[derive(Clone)]
pub(crate) struct Region {
    #[cfg(not(loom))]
    base: NonNull<u8>,
    #[cfg(not(loom))]
    _mem: Arc<dyn RingMemory>,
    #[cfg(loom)]
    mem: Arc<HeapRegion>,
    /// Capacity of the record area (a power of two).
    cap: usize,
    /// `(cap - 1) & !7`: masks any offset to an 8-aligned word inside the record area.
    word_mask: usize,
}

// SAFETY: `base` points into memory that `_mem` keeps alive and that `RingMemory` guarantees is
// usable from any thread; the region only hands out atomics and (to the handles, under their
// protocol) byte slices.
#[cfg(not(loom))]
unsafe impl Send for Region {}
// SAFETY: as above; shared use is through atomics, and the byte accessors are `unsafe fn`s whose
// callers (the producer and the consumer, one each) keep their spans disjoint.
#[cfg(not(loom))]
unsafe impl Sync for Region {}

/// A live tracker guard (zero-sized outside loom).
pub(crate) struct Access {
    #[cfg(loom)]
    _guard: loom::cell::ConstPtr<()>,
}

impl Access {
    /// Ends the access.
    #[inline(always)]
    pub(crate) fn end(self) {}
}

impl Region {
    #[cfg(not(loom))]
    pub(crate) fn new(mem: Arc<dyn RingMemory>) -> Result<Region, &'static str> {
        let ptr = mem.as_ptr();
        let cap = check_geometry(ptr as usize, mem.size_bytes())?;
        let base = NonNull::new(ptr).ok_or("null region")?;
        Ok(Region {
            base,
            _mem: mem,
            cap,
            word_mask: (cap - 1) & !7,
        })
    }

    #[cfg(loom)]
    pub(crate) fn new(mem: Arc<HeapRegion>) -> Result<Region, &'static str> {
        let cap = check_geometry(0, mem.size_bytes)?;
        Ok(Region {
            mem,
            cap,
            word_mask: (cap - 1) & !7,
        })
    }

    #[inline(always)]
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    #[cfg(not(loom))]
    #[inline(always)]
    fn atomic_at(&self, byte: usize) -> &AtomicU64 {
        // SAFETY: every caller passes an 8-aligned `byte < RING_HEADER_SIZE + cap - 7` (a
        // position word, or a masked record-area offset), so the word lies inside the region,
        // which is 128-aligned, valid and alive while `_mem` is (`RingMemory`'s contract).
        // `AtomicU64` has the size and alignment of `u64`; all concurrent accesses to header and
        // position words are atomic.
        unsafe { &*self.base.as_ptr().add(byte).cast::<AtomicU64>() }
    }

    /// The producer's position word.
    #[inline(always)]
    pub(crate) fn producer_pos(&self) -> &AtomicU64 {
        #[cfg(not(loom))]
        return self.atomic_at(PRODUCER_POSITION_OFFSET);
        #[cfg(loom)]
        return &self.mem.words[PRODUCER_POSITION_OFFSET / 8];
    }

    /// The consumer's position word.
    #[inline(always)]
    pub(crate) fn consumer_pos(&self) -> &AtomicU64 {
        #[cfg(not(loom))]
        return self.atomic_at(CONSUMER_POSITION_OFFSET);
        #[cfg(loom)]
        return &self.mem.words[CONSUMER_POSITION_OFFSET / 8];
    }

    /// The record-area word at `off`, masked into the area (so sound for every `off`; the ring
    /// only passes 8-aligned offsets below the capacity, which the mask leaves unchanged).
    #[inline(always)]
    pub(crate) fn word(&self, off: usize) -> &AtomicU64 {
        let off = off & self.word_mask;
        #[cfg(not(loom))]
        return self.atomic_at(RING_HEADER_SIZE + off);
        #[cfg(loom)]
        return &self.mem.words[(RING_HEADER_SIZE + off) / 8];
    }

    /// Marks a read of the record-area word at `off` for loom's race detector (a header load);
    /// a no-op outside loom. Drop the guard when the access is over.
    #[inline(always)]
    pub(crate) fn track_read(&self, off: usize) -> Access {
        #[cfg(loom)]
        return Access {
            _guard: self.mem.trackers[(off & self.word_mask) / 8].get(),
        };
        #[cfg(not(loom))]
        {
            let _ = off;
            Access {}
        }
    }

    /// `len` bytes of the record area at `off`, for writing in place.
    ///
    /// # Safety
    ///
    /// `off + len <= capacity`, and for the lifetime of the slice no other access to those
    /// bytes happens in this process (the producer's claimed span: the consumer does not look at
    /// it until it is published).
    #[cfg(not(loom))]
    #[inline(always)]
    // The region is shared memory: exclusivity comes from the ring protocol, stated as this
    // `unsafe fn`'s contract, not from the borrow of `self`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        debug_assert!(off.checked_add(len).is_some_and(|e| e <= self.cap));
        // SAFETY: in bounds by the caller's contract, inside the live region (see `atomic_at`);
        // exclusive by the caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(self.base.as_ptr().add(RING_HEADER_SIZE + off), len)
        }
    }

    /// `len` bytes of the record area at `off`, read in place.
    ///
    /// # Safety
    ///
    /// `off + len <= capacity`, and for the lifetime of the slice nothing in this process writes
    /// those bytes (a published record: the producer does not reuse it until the consumer
    /// publishes its position past it).
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        debug_assert!(off.checked_add(len).is_some_and(|e| e <= self.cap));
        // SAFETY: in bounds and unaliased by writes, by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(RING_HEADER_SIZE + off), len) }
    }

    /// Loom: copies `src` into the record area at 8-aligned `off` (the last word zero padded),
    /// holding a write guard on each word while it is stored.
    #[cfg(loom)]
    pub(crate) fn write_bytes(&self, off: usize, src: &[u8]) {
        for (i, c) in src.chunks(8).enumerate() {
            let o = (off + 8 * i) & self.word_mask;
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            let _g = self.mem.trackers[o / 8].get_mut();
            self.word(o).store(u64::from_ne_bytes(w), Ordering::Relaxed);
        }
    }

    /// Loom: copies the record area at 8-aligned `off` into `dst`, holding a read guard on each
    /// word while it is loaded.
    #[cfg(loom)]
    pub(crate) fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        for (i, c) in dst.chunks_mut(8).enumerate() {
            let o = (off + 8 * i) & self.word_mask;
            let _g = self.mem.trackers[o / 8].get();
            let w = self.word(o).load(Ordering::Relaxed).to_ne_bytes();
            let n = c.len();
            c.copy_from_slice(&w[..n]);
        }
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("capacity", &self.cap)
            .finish()
    }
}
