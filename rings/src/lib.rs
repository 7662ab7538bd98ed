//! Bounded lock-free single-producer/single-consumer rings for spinwire's data plane.
//!
//! A ring of `T` with a power-of-two capacity is created by [`RingBuffer::new`] and split into a
//! [`Producer`] and a [`Consumer`]. Each handle is [`Send`] but not [`Sync`] and all of its
//! methods take `&mut self`, so the type system guarantees there is exactly one producer and one
//! consumer: a handle can move to another thread but can never be shared.
//!
//! # Quick start
//!
//! ```
//! use rings::{PopError, PushError, RingBuffer};
//!
//! let (mut producer, mut consumer) = RingBuffer::<u64>::new(4);
//! assert_eq!(producer.capacity(), 4);
//!
//! // Single items.
//! producer.push(1).unwrap();
//! assert_eq!(consumer.peek(), Ok(&1));
//! assert_eq!(consumer.pop(), Ok(1));
//! assert_eq!(consumer.pop(), Err(PopError::Empty));
//!
//! // Batches: claim slots, write them in place, publish them with one index store.
//! let mut chunk = producer.write_chunk_uninit(3).unwrap();
//! let (first, second) = chunk.as_mut_slices();
//! for (i, slot) in first.iter_mut().chain(second).enumerate() {
//!     slot.write(10 + i as u64);
//! }
//! // SAFETY: all three slots of the chunk were initialized just above.
//! unsafe { chunk.commit_all() };
//! assert_eq!(producer.push_slice(&[13, 14]), 1); // only one slot left
//! assert!(matches!(producer.push(99), Err(PushError::Full(99))));
//!
//! // Read a batch in place and release it with one index store.
//! let chunk = consumer.read_chunk(4).unwrap();
//! let (first, second) = chunk.as_slices();
//! let got: Vec<u64> = first.iter().chain(second).copied().collect();
//! assert_eq!(got, [10, 11, 12, 13]);
//! chunk.release_all();
//!
//! // Across threads.
//! let t = std::thread::spawn(move || {
//!     for i in 0..1000u64 {
//!         while producer.push(i).is_err() {
//!             std::thread::yield_now();
//!         }
//!     }
//! });
//! let mut next = 0;
//! while next < 1000 {
//!     if let Ok(v) = consumer.pop() {
//!         assert_eq!(v, next);
//!         next += 1;
//!     } else {
//!         std::thread::yield_now();
//!     }
//! }
//! t.join().unwrap();
//! assert!(consumer.is_abandoned());
//! ```
//!
//! # Capacity
//!
//! Capacities are powers of two: [`RingBuffer::new`] rounds the requested capacity up (`5`
//! becomes `8`), so a slot is found with one AND. Capacity `0` is rejected: [`RingBuffer::new`]
//! panics with a message, [`RingBuffer::try_new`] returns [`CapacityError::Zero`] (and
//! [`CapacityError::TooLarge`] where `new` would panic on overflow).
//!
//! # Threading
//!
//! * The producer owns the *tail* index and the consumer owns the *head* index. Each index lives
//!   on its own cache line ([`CachePadded`]), and each handle keeps a private copy of its own
//!   index plus a cached copy of the other side's. A handle reads the other side's cache line only
//!   when its cached value says the ring looks full (producer) or empty (consumer), so in steady
//!   state each operation touches the shared lines once per publication.
//! * Publication is a single `Release` store of the owner's index, paired with an `Acquire` load
//!   on the other side. Batch operations ([`WriteChunkUninit::commit`], [`ReadChunk::release`], ...)
//!   publish a whole batch with one store.
//! * Runs of single items can be published once per run too: [`Producer::push_deferred`]
//!   writes an item that [`Producer::publish_deferred`] (or the next publishing call)
//!   publishes, and [`Consumer::pop_deferred`] takes an item whose slot goes back with the
//!   run's (when the ring is found empty, every quarter ring, or at
//!   [`Consumer::release_deferred`]), so the other side's cache line of the index moves once
//!   per run instead of once per item.
//! * A chunk claim of a run of at least two slots and a line's bytes
//!   ([`Producer::write_chunk_uninit`], [`Producer::write_chunk_uninit_up_to`],
//!   [`Producer::write_chunk`]) asks for the cache lines of the next run of the same length,
//!   owned (x86's `prefetchw`, where the CPU has it), so that a streaming producer's next run
//!   finds them in its cache instead of stalling on each line its consumer read a lap ago. The
//!   slot array starts on a cache line, so a run of whole lines shares none with its
//!   neighbours. A lone item (`push`, a one-slot chunk) asks for nothing.
//! * [`Consumer::pop`] prefetches the cache line a few slots ahead of the item it reads, but
//!   only once the producer has published that whole line, so it never pulls a line the
//!   producer is still filling.
//! * A consumer that finds the ring empty three times in a row ([`Consumer::pop`],
//!   [`Consumer::peek_spinning`], [`Consumer::is_empty_spinning`]) prefetches the slot of its head
//!   before re-reading the tail: when an idle producer then writes an item, the two cache
//!   misses of the next poll overlap instead of following each other.
//! * Nothing blocks. `push`/`pop` return an error immediately on a full/empty ring; waiting, and
//!   how to wait (spin, yield, park), is the caller's idle strategy.
//! * No allocation happens after [`RingBuffer::new`]. [`StampedRing`]: `Copy` items, a stamp
//!   in each slot, so that its consumer never reads the producer's index.
//!
//! # Resource cleanup
//!
//! The ring's memory is freed when the second of the two handles is dropped; items still in the
//! ring are dropped then. Once one side is gone the other side sees
//! [`Producer::is_abandoned`] / [`Consumer::is_abandoned`] return `true`. A consumer that sees the
//! producer abandoned can still pop every item the producer pushed before it was dropped.
//!
//! # Model checking
//!
//! All atomics come from the internal `primitive` shim, which switches to [loom]'s under
//! `--cfg loom`; slot accesses are tracked by loom there too, so loom reports data races on slot
//! contents. See `tests/loom.rs` and `scripts/ci/loom.sh`.
//!
//! [loom]: https://docs.rs/loom
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod chunks;
mod deferred;
mod error;
pub mod prefetch;
mod primitive;
mod slots;
mod spinning;
mod stamped;

use core::marker::PhantomData;
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};
use std::alloc::Layout;

use crossbeam_utils::CachePadded;

use crate::primitive::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::primitive::track::SlotTrackers;

pub use crate::chunks::{ReadChunk, ReadChunkIntoIter, WriteChunk, WriteChunkUninit};
pub use crate::error::{CapacityError, ChunkError, PeekError, PopError, PushError};
pub use crate::stamped::{StampedConsumer, StampedProducer, StampedRing, StampedWriteChunk};

/// The shared part of a ring: the two indices and the slot buffer.
///
/// It is never handled directly: [`RingBuffer::new`] returns the two handles, and the ring is
/// freed when both are dropped.
///
/// Indices are free-running `usize` counters (they wrap at `usize::MAX`, not at the capacity);
/// the slot of index `i` is `i & mask`. Because the capacity is a power of two no larger than
/// `usize::MAX / 2 + 1`, the fill level is always `tail.wrapping_sub(head)`, in range
/// `0 ..= capacity`, and locating a slot is one AND (rtrb's indices run in `0 .. 2 * capacity`
/// and need a compare-and-subtract instead).
pub struct RingBuffer<T> {
    /// Index of the oldest item. Written only by the consumer, read by the producer.
    ///
    /// Invariant: `tail.wrapping_sub(head)` is in range `0 ..= capacity`, and the slots of
    /// indices `head .. tail` hold initialized items.
    head: CachePadded<AtomicUsize>,
    /// Index one past the newest item. Written only by the producer, read by the consumer.
    tail: CachePadded<AtomicUsize>,
    /// Set by the first handle to be dropped; the second one frees the ring.
    abandoned: AtomicBool,
    /// `capacity` slots from a cache line (`slots_layout`), allocated in `new` and freed in
    /// `drop`; never reallocated.
    buf: *mut MaybeUninit<T>,
    /// `capacity - 1`; the capacity is a power of two.
    mask: usize,
    /// Loom's per-slot access trackers (zero-sized outside loom).
    trackers: SlotTrackers,
    /// The ring owns the `T`s in its initialized slots (drop check).
    _owns: PhantomData<T>,
}

// SAFETY: the ring only moves `T`s from one thread to another (it never hands out a `&T` to two
// threads at once: `peek`/`as_slices` borrow the consumer exclusively), so `T: Send` suffices.
// The raw `buf` pointer is owned by the ring and accessed under the head/tail protocol.
unsafe impl<T: Send> Send for RingBuffer<T> {}
// SAFETY: as above; the handles share the ring only through atomics and disjoint slot ranges.
unsafe impl<T: Send> Sync for RingBuffer<T> {}

impl<T> RingBuffer<T> {
    /// Creates a ring holding at least `capacity` items and returns its two handles.
    ///
    /// The capacity is rounded up to the next power of two (`5` becomes `8`);
    /// [`Producer::capacity`] reports the real one. This is the only allocation the ring makes.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is `0` or too large (see [`CapacityError`]). Use
    /// [`RingBuffer::try_new`] to get those as an error instead.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(capacity: usize) -> (Producer<T>, Consumer<T>) {
        match Self::try_new(capacity) {
            Ok(handles) => handles,
            Err(e) => panic!("RingBuffer::new({capacity}): {e}"),
        }
    }

    /// Creates a ring holding at least `capacity` items (rounded up to a power of two).
    ///
    /// # Errors
    ///
    /// [`CapacityError::Zero`] if `capacity` is `0`; [`CapacityError::TooLarge`] if the rounded
    /// capacity overflows `usize`, exceeds `usize::MAX / 2 + 1` slots, or needs more than
    /// `isize::MAX` bytes.
    pub fn try_new(capacity: usize) -> Result<(Producer<T>, Consumer<T>), CapacityError> {
        if capacity == 0 {
            return Err(CapacityError::Zero);
        }
        let too_large = CapacityError::TooLarge {
            requested: capacity,
        };
        let cap = capacity.checked_next_power_of_two().ok_or(too_large)?;
        // The fill level `tail - head` must stay unambiguous modulo 2^BITS.
        if cap > (usize::MAX >> 1) + 1 {
            return Err(too_large);
        }
        if core::mem::size_of::<T>()
            .checked_mul(cap)
            .map_or(true, |bytes| bytes > isize::MAX as usize)
        {
            return Err(too_large);
        }
        let layout = Self::slots_layout(cap).ok_or(too_large)?;
        let buf = slots::alloc_array::<MaybeUninit<T>>(layout).as_ptr();
        let ring = Box::new(RingBuffer {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            abandoned: AtomicBool::new(false),
            buf,
            mask: cap - 1,
            trackers: SlotTrackers::new(cap),
            _owns: PhantomData,
        });
        let ring = NonNull::from(Box::leak(ring));
        let producer = Producer {
            ring,
            buf,
            mask: cap - 1,
            tail: 0,
            cached_head: 0,
            prefetch: core::mem::size_of::<T>() != 0 && prefetch::prefetchw_supported(),
            _not_sync: PhantomData,
        };
        let consumer = Consumer {
            ring,
            buf,
            mask: cap - 1,
            head: 0,
            cached_tail: 0,
            empty_polls: 0,
            _not_sync: PhantomData,
        };
        Ok((producer, consumer))
    }

    /// The slot array's layout: `cap` slots from a line boundary (see [`Producer::prefetch_run`]);
    /// `None` when it does not fit `isize::MAX` bytes.
    fn slots_layout(cap: usize) -> Option<Layout> {
        slots::layout(core::mem::size_of::<T>(), cap, core::mem::align_of::<T>())
    }

    /// Drops one handle's share of the ring; the second call frees it.
    ///
    /// # Safety
    ///
    /// `ring` must come from [`RingBuffer::try_new`], and each of its two handles may call this
    /// once, from its `Drop`, after its last access to the ring.
    unsafe fn release_handle(ring: NonNull<Self>) {
        // SAFETY: the ring is alive until the second handle gets here (caller contract).
        let first_gone = unsafe { ring.as_ref() }
            .abandoned
            // AcqRel: the first handle's Release orders all of its slot and index accesses before
            // the flag; the second handle's Acquire makes them visible before it frees the ring.
            .swap(true, Ordering::AcqRel);
        if first_gone {
            // SAFETY: both handles are gone, so nothing else refers to the ring; it was allocated
            // by `Box::new` in `try_new`.
            drop(unsafe { Box::from_raw(ring.as_ptr()) });
        }
    }
}

impl<T> Drop for RingBuffer<T> {
    fn drop(&mut self) {
        // Relaxed: both handles are gone and `release_handle`'s AcqRel swap already ordered
        // their last stores before this point.
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Relaxed);
        let cap = self.mask + 1;
        let len = tail.wrapping_sub(head);
        let start = head & self.mask;
        let first_len = len.min(cap - start);
        #[cfg(loom)]
        let _accesses: Vec<_> = (0..len)
            .map(|i| self.trackers.write(head.wrapping_add(i) & self.mask))
            .collect();
        // SAFETY: the slots of `head .. tail` hold initialized items (field invariant), which are
        // `start .. start + first_len` and `0 .. len - first_len` of the buffer; nobody else can
        // access them any more. The buffer came from `slots::alloc_array(slots_layout(cap))` in
        // `try_new` (non-null, dangling when zero-sized), the same layout as here.
        unsafe {
            ptr::drop_in_place(ptr::slice_from_raw_parts_mut(
                self.buf.add(start).cast::<T>(),
                first_len,
            ));
            ptr::drop_in_place(ptr::slice_from_raw_parts_mut(
                self.buf.cast::<T>(),
                len - first_len,
            ));
            if let Some(layout) = Self::slots_layout(cap) {
                slots::free_array(NonNull::new_unchecked(self.buf), layout);
            }
        }
    }
}

/// The consumer's read-ahead distance for `T` (see `Consumer::prefetch_ahead`).
struct PrefetchAhead<T>(PhantomData<T>);

impl<T> PrefetchAhead<T> {
    /// Bytes per cache line.
    const LINE_BYTES: usize = primitive::LINE;
    /// Slots a cache line holds (at least 1); `0` for zero-sized `T`.
    const LINE_SLOTS: usize = match core::mem::size_of::<T>() {
        0 => 0,
        size if size >= Self::LINE_BYTES => 1,
        size => Self::LINE_BYTES / size,
    };
    /// The shortest run after whose claim the producer asks for the next run's lines
    /// (`Producer::prefetch_run`): two slots and a line's bytes (a lone item, a ping-pong's, asks
    /// for nothing).
    const RUN_SLOTS: usize = if Self::LINE_SLOTS > 2 {
        Self::LINE_SLOTS
    } else {
        2
    };
    /// How far ahead of the read position the consumer prefetches: 4 cache lines' worth of
    /// slots (32 `u64`s), at least 1 slot; `0` (no prefetch) for zero-sized `T`.
    const SLOTS: usize = match core::mem::size_of::<T>() {
        0 => 0,
        size if size >= 4 * Self::LINE_BYTES => 1,
        size => 4 * Self::LINE_BYTES / size,
    };
}

/// The writing end of a ring. Created by [`RingBuffer::new`].
///
/// `Send` (if `T: Send`) but not `Sync`; every method that touches the ring takes `&mut self`.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<rings::Producer<u8>>();
/// ```
pub struct Producer<T> {
    /// The shared ring; valid until this handle's `Drop` releases it.
    ring: NonNull<RingBuffer<T>>,
    /// Copy of `ring.buf`, kept here so the hot path never dereferences `ring` for it.
    buf: *mut MaybeUninit<T>,
    /// Copy of `ring.mask` (`capacity - 1`).
    mask: usize,
    /// The tail index. Authoritative: only this handle writes `ring.tail`, which equals it
    /// outside a method call but for the items [`Producer::push_deferred`] wrote and nothing
    /// published yet (`tail - ring.tail`, in range `0 ..= capacity`).
    tail: usize,
    /// The last head index read from `ring.head`. The real head is never behind it, so
    /// `tail.wrapping_sub(cached_head)` (in range `0 ..= capacity`) is an upper bound of the
    /// fill level; the ring *looks* full when it equals the capacity.
    cached_head: usize,
    /// Whether a claimed run asks for the lines of the next one ([`Producer::prefetch_run`]):
    /// the CPU has `prefetchw` and `T` is not zero-sized.
    prefetch: bool,
    /// Makes the handle `!Sync` (and `!Send`, restored by the `unsafe impl` below).
    _not_sync: PhantomData<*mut T>,
}

// SAFETY: the producer moves `T`s into the ring, to be taken out on another thread, which is
// fine for `T: Send`. The handle itself is `!Sync` (`&mut self` API), so only one thread uses
// it at a time.
unsafe impl<T: Send> Send for Producer<T> {}

/// The reading end of a ring. Created by [`RingBuffer::new`].
///
/// `Send` (if `T: Send`) but not `Sync`; every method that touches the ring takes `&mut self`.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<rings::Consumer<u8>>();
/// ```
pub struct Consumer<T> {
    /// The shared ring; valid until this handle's `Drop` releases it.
    ring: NonNull<RingBuffer<T>>,
    /// Copy of `ring.buf`, kept here so the hot path never dereferences `ring` for it.
    buf: *mut MaybeUninit<T>,
    /// Copy of `ring.mask` (`capacity - 1`).
    mask: usize,
    /// The head index. Authoritative: only this handle writes `ring.head`, which equals it
    /// outside a method call but for the items [`Consumer::pop_deferred`] took and nothing
    /// gave back yet (`head - ring.head`, in range `0 ..= max(capacity / 4, 1)`).
    head: usize,
    /// The last tail index read from `ring.tail`. The real tail is never behind it, so
    /// `cached_tail.wrapping_sub(head)` (in range `0 ..= capacity`) is a lower bound of the
    /// fill level; the ring *looks* empty when it is zero.
    cached_tail: usize,
    /// `pop`, `peek_spinning` and `is_empty_spinning` calls in a row that found the ring empty
    /// (saturating); see `Consumer::refresh_empty`.
    empty_polls: u8,
    /// Makes the handle `!Sync` (and `!Send`, restored by the `unsafe impl` below).
    _not_sync: PhantomData<*mut T>,
}

// SAFETY: the consumer takes `T`s out of the ring that were put in on another thread, which is
// fine for `T: Send`. The handle itself is `!Sync` (`&mut self` API), so only one thread uses
// it at a time.
unsafe impl<T: Send> Send for Consumer<T> {}

impl<T> Producer<T> {
    #[inline(always)]
    fn ring(&self) -> &RingBuffer<T> {
        // SAFETY: the ring stays allocated while this handle exists (freed only after both
        // handles' `Drop`).
        unsafe { self.ring.as_ref() }
    }

    /// Free slots according to the cached head (a lower bound of the real number).
    #[inline(always)]
    fn cached_free(&self) -> usize {
        self.mask + 1 - self.tail.wrapping_sub(self.cached_head)
    }

    /// Re-reads the consumer's head and returns the exact number of free slots.
    #[inline]
    fn refresh_free(&mut self) -> usize {
        // Acquire: pairs with the consumer's Release store of `head`, so its reads of the slots
        // it released happen before we overwrite them.
        self.cached_head = self.ring().head.load(Ordering::Acquire);
        self.cached_free()
    }

    /// Returns `min(want, free slots)`, reading the consumer's index only if the cache says
    /// fewer than `want` are free.
    #[inline]
    fn claim(&mut self, want: usize) -> usize {
        let free = self.cached_free();
        if free >= want {
            want
        } else {
            want.min(self.refresh_free())
        }
    }

    /// Publishes `n` slots after `tail`, which the caller has initialized (and the deferred
    /// ones before them).
    #[inline(always)]
    fn publish(&mut self, n: usize) {
        self.tail = self.tail.wrapping_add(n);
        // Release: the writes into the published slots happen before the consumer's Acquire
        // load of `tail` sees the new value.
        self.ring().tail.store(self.tail, Ordering::Release);
    }

    /// Pushes one item.
    ///
    /// # Errors
    ///
    /// [`PushError::Full`] with the item handed back if the ring is full.
    #[inline]
    pub fn push(&mut self, value: T) -> Result<(), PushError<T>> {
        self.write_next(value)?;
        self.publish(0);
        Ok(())
    }

    /// Writes `value` into `tail`'s slot and advances the private tail past it, publishing
    /// nothing: [`push`](Self::push) publishes it at once, [`push_deferred`](Self::push_deferred)
    /// later.
    ///
    /// # Errors
    ///
    /// [`PushError::Full`] with the item handed back if the ring is full (deferred items count
    /// as taken slots).
    #[inline(always)]
    fn write_next(&mut self, value: T) -> Result<(), PushError<T>> {
        if self.tail.wrapping_sub(self.cached_head) > self.mask && self.refresh_free() == 0 {
            return Err(PushError::Full(value));
        }
        let slot = self.tail & self.mask;
        let access = self.ring().trackers.write(slot);
        // SAFETY: there is a free slot, so `tail`'s slot is outside `head .. tail` (where the
        // deferred items are too): the consumer does not access it until it is published, and
        // it holds no item. `slot < capacity`.
        unsafe { self.buf.add(slot).write(MaybeUninit::new(value)) };
        access.end();
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Pushes as many items of `items` as fit, in order, with one index publication, and
    /// returns how many were pushed.
    #[inline]
    pub fn push_slice(&mut self, items: &[T]) -> usize
    where
        T: Copy,
    {
        let n = self.claim(items.len());
        let mut chunk = chunks::WriteChunkUninit::new(self, n);
        let (first, second) = chunk.as_mut_slices();
        let (a, b) = items[..n].split_at(first.len());
        // SAFETY: `MaybeUninit<T>` has the layout of `T`; `first`/`second` are exactly `a.len()`
        // and `b.len()` long, and do not overlap `items` (they are free ring slots).
        unsafe {
            ptr::copy_nonoverlapping(a.as_ptr(), first.as_mut_ptr().cast::<T>(), a.len());
            ptr::copy_nonoverlapping(b.as_ptr(), second.as_mut_ptr().cast::<T>(), b.len());
        }
        debug_assert_eq!(second.len(), b.len());
        // SAFETY: all `n` slots were initialized by the copies above.
        unsafe { chunk.commit_all() };
        n
    }

    /// The exact number of free slots now (reads the consumer's index). The consumer may free
    /// more at any time.
    #[inline]
    pub fn slots(&mut self) -> usize {
        self.refresh_free()
    }

    /// Whether the ring is full now. Reads the consumer's index only if the cache says full.
    #[inline]
    pub fn is_full(&mut self) -> bool {
        self.claim(1) == 0
    }

    /// The ring's capacity (a power of two).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Whether the consumer has been dropped (nobody will pop any more).
    #[inline]
    pub fn is_abandoned(&self) -> bool {
        // Acquire: pairs with the consumer's AcqRel swap in its `Drop`.
        self.ring().abandoned.load(Ordering::Acquire)
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        // Deferred items are the consumer's (or dropped with the ring), as pushed ones are.
        self.publish_deferred();
        // SAFETY: called once, from this handle's `Drop`; `tail` is published just above.
        unsafe { RingBuffer::release_handle(self.ring) }
    }
}

impl<T> core::fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Producer")
            .field("capacity", &self.capacity())
            .field("tail", &self.tail)
            .field("cached_head", &self.cached_head)
            .finish_non_exhaustive()
    }
}

impl<T> Consumer<T> {
    #[inline(always)]
    fn ring(&self) -> &RingBuffer<T> {
        // SAFETY: the ring stays allocated while this handle exists (freed only after both
        // handles' `Drop`).
        unsafe { self.ring.as_ref() }
    }

    /// Readable items according to the cached tail (a lower bound of the real number).
    #[inline(always)]
    fn cached_len(&self) -> usize {
        self.cached_tail.wrapping_sub(self.head)
    }

    /// Re-reads the producer's tail and returns the exact number of readable items.
    #[inline]
    fn refresh_len(&mut self) -> usize {
        // Acquire: pairs with the producer's Release store of `tail`, so its writes into the
        // published slots happen before we read them.
        self.cached_tail = self.ring().tail.load(Ordering::Acquire);
        self.cached_len()
    }

    /// Returns `min(want, readable items)`, reading the producer's index only if the cache
    /// says fewer than `want` are readable.
    #[inline]
    fn claim(&mut self, want: usize) -> usize {
        let len = self.cached_len();
        if len >= want {
            want
        } else {
            want.min(self.refresh_len())
        }
    }

    /// Prefetches the cache line [`PrefetchAhead::SLOTS`] slots past `head`, if that whole line
    /// is already published (according to the cached tail); a hint only, it changes no state.
    ///
    /// `pop` calls it. Measured on the 2-core CI VM with `RINGS_BENCH_PAIRS=21` (7 interleaved
    /// rounds, this build against the same bench without the call): two-thread single-item
    /// throughput went from a median 1.01x-1.03x rtrb's to 1.26x-1.87x, though single rounds
    /// still land at 0.45x (the run settles into the consumer-catches-up regime; see
    /// `benches/rings.rs`); RTT did not move (at most one item is in flight
    /// in the ping-pong, so the guard never passes). The same call in `ReadChunk::new` moved
    /// 32-item chunks by less than the noise (1.03x-1.16x vs 1.08x-1.09x), so it is not there.
    /// Only lines the producer has finished with are touched: prefetching the slot the producer
    /// is about to fill (the empty path) was tried before and halved single-item throughput,
    /// because a polling consumer then keeps pulling that line away from the producer.
    #[inline(always)]
    fn prefetch_ahead(&self) {
        let ahead = PrefetchAhead::<T>::SLOTS;
        if ahead != 0 && self.cached_len() > ahead + PrefetchAhead::<T>::LINE_SLOTS {
            primitive::prefetch_read(
                self.buf
                    .wrapping_add(self.head.wrapping_add(ahead) & self.mask),
            );
        }
    }

    /// Releases the `n` oldest slots, whose items the caller has moved out or dropped, and
    /// the deferred ones before them.
    #[inline(always)]
    fn publish(&mut self, n: usize) {
        self.head = self.head.wrapping_add(n);
        // Release: our reads of the released slots happen before the producer's Acquire load
        // of `head` lets it overwrite them.
        self.ring().head.store(self.head, Ordering::Release);
    }

    /// Pops the oldest item.
    ///
    /// # Errors
    ///
    /// [`PopError::Empty`] if the ring is empty.
    #[inline]
    pub fn pop(&mut self) -> Result<T, PopError> {
        // On the empty path, prefetch `head`'s slot before the `tail` reload only once the two
        // previous calls found the ring empty: then the producer is idle (a ping-pong), and the
        // slot miss overlaps the `tail` miss instead of following it. Prefetching on every empty
        // call (tried before) cut RTT by ~20% but halved two-thread single-item throughput: a
        // consumer that keeps catching up with a streaming producer then keeps pulling back the
        // line the producer is filling, and a streaming producer rarely leaves two polls in a
        // row empty. Measured on the 2-core CI VM (`RINGS_BENCH_PAIRS=21`, 7 interleaved rounds
        // against the build without it): RTT 0.95x -> 1.08x rtrb's (median of rounds), single-
        // item throughput 1.41x -> 1.30x (within its round-to-round spread of 0.45x-4.7x).
        if self.head == self.cached_tail && self.refresh_empty() == 0 {
            return Err(PopError::Empty);
        }
        // SAFETY: the ring is not empty (checked above).
        let value = unsafe { self.read_head() };
        self.publish(1);
        Ok(value)
    }

    /// Moves the item out of `head`'s slot (prefetching the slots ahead); the caller then
    /// advances `head` and publishes it, at once ([`pop`](Self::pop)) or later
    /// ([`pop_deferred`](Self::pop_deferred)).
    ///
    /// # Safety
    ///
    /// The ring holds an item at `head` (`head != cached_tail`, with `cached_tail` read from the
    /// producer's published tail), and the caller advances `head` past it before reading the
    /// slot again: the slot is the consumer's until it publishes a head past it.
    #[inline(always)]
    unsafe fn read_head(&mut self) -> T {
        self.prefetch_ahead();
        let slot = self.head & self.mask;
        let access = self.ring().trackers.write(slot);
        // SAFETY: per the contract, `head`'s slot holds an initialized item that the producer
        // does not access until a head past it is published. `slot < capacity`.
        let value = unsafe { self.buf.add(slot).read().assume_init() };
        access.end();
        value
    }

    /// Returns the oldest item without removing it.
    ///
    /// # Errors
    ///
    /// [`PeekError::Empty`] if the ring is empty.
    #[inline]
    pub fn peek(&mut self) -> Result<&T, PeekError> {
        if self.head == self.cached_tail && self.refresh_len() == 0 {
            return Err(PeekError::Empty);
        }
        let slot = self.head & self.mask;
        let _access = self.ring().trackers.read(slot);
        // SAFETY: as in `pop`; the item stays in place (and the producer keeps off it) while the
        // returned reference borrows `self`, because only this handle can release it.
        Ok(unsafe { (*self.buf.add(slot)).assume_init_ref() })
    }

    /// Pops as many items as fit into `out` (and are available), oldest first, with one index
    /// publication, and returns how many were popped.
    #[inline]
    pub fn pop_slice(&mut self, out: &mut [T]) -> usize
    where
        T: Copy,
    {
        let n = self.claim(out.len());
        let chunk = chunks::ReadChunk::new(self, n);
        let (first, second) = chunk.as_slices();
        out[..first.len()].copy_from_slice(first);
        out[first.len()..n].copy_from_slice(second);
        chunk.release_all();
        n
    }

    /// The exact number of readable items now (reads the producer's index). The producer may
    /// push more at any time.
    #[inline]
    pub fn slots(&mut self) -> usize {
        self.refresh_len()
    }

    /// Whether the ring is empty now. Reads the producer's index only if the cache says empty.
    #[inline]
    pub fn is_empty(&mut self) -> bool {
        self.claim(1) == 0
    }

    /// The ring's capacity (a power of two).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Whether the producer has been dropped (nothing more will be pushed). Items it pushed
    /// before are still readable.
    #[inline]
    pub fn is_abandoned(&self) -> bool {
        // Acquire: pairs with the producer's AcqRel swap in its `Drop`, so a `pop` after this
        // returned `true` sees every item the producer published.
        self.ring().abandoned.load(Ordering::Acquire)
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        // The deferred items are gone (moved out): the ring's `Drop` must not drop them again.
        self.release_deferred();
        // SAFETY: called once, from this handle's `Drop`; `head` is published just above.
        unsafe { RingBuffer::release_handle(self.ring) }
    }
}

impl<T> core::fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Consumer")
            .field("capacity", &self.capacity())
            .field("head", &self.head)
            .field("cached_tail", &self.cached_tail)
            .finish_non_exhaustive()
    }
}
