//! A slot-stamped SPSC ring ([`StampedRing`]): the consumer learns that an item is there from
//! a stamp stored in the item's own slot, not from the producer's index.
//!
//! With [`RingBuffer`](crate::RingBuffer) a consumer that waits for the next item re-reads the
//! producer's tail, a cache line the producer writes once per publication, and then the slot:
//! two lines move from the producer's core for each item that arrives alone (a ping-pong, a
//! poller that keeps up with its sender). Here each slot holds a stamp next to its item
//! (FastForward, Aeron's record headers, crossbeam's `ArrayQueue` "stamps"): the producer
//! writes the item, then stores the stamp `index + 1` with `Release`, and the consumer checks
//! the stamp of its head slot with `Acquire`, so one line carries both the item and the news
//! that it is there. The producer still needs the consumer's progress to know which slots are
//! free: the consumer publishes its head once per [`release`](StampedConsumer::release) (one
//! store per batch, on a line of its own), and the producer re-reads it only when its cached
//! copy says the ring is full.
//!
//! Items are `Copy` (descriptors): nothing is ever dropped in place, so a slot needs no
//! ownership bookkeeping when the handles go. The stamps of index `i` are `i + 1` (wrapping),
//! so a slot's stamp from its previous lap never matches.

use core::cell::Cell;
use core::marker::PhantomData;
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};

use std::alloc::Layout;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::primitive::cell::UnsafeCell;
use crate::primitive::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::primitive::LINE;
use crate::{CapacityError, PeekError, PopError, PushError};

/// One slot: the stamp that says which index's item it holds, and the item.
#[repr(C)]
struct Slot<T> {
    /// `i + 1` (wrapping) once the item of index `i` is written and published; written only
    /// by the producer (`Release`), read by the consumer (`Acquire`).
    stamp: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// Bytes from one slot to the next: the slot's size rounded up to a power of two up to a line
/// (16 for an 8-byte item: four slots a line), to whole lines above (192 for a 128-byte item).
/// With the array line-aligned, a slot then never straddles a line it does not need: its stamp
/// and the item's first bytes share one line.
const fn stride<T>() -> usize {
    let size = core::mem::size_of::<Slot<T>>();
    if size <= LINE {
        size.next_power_of_two()
    } else {
        size.div_ceil(LINE) * LINE
    }
}

/// Slots in a line (1 for a slot of a line or more).
const fn slots_per_line<T>() -> usize {
    let n = LINE / stride::<T>();
    if n == 0 {
        1
    } else {
        n
    }
}

/// Slot `s` of the array at `slots`.
///
/// # Safety
///
/// `slots` is a slot array of more than `s` slots (or `T`'s slots are zero-sized).
#[inline(always)]
unsafe fn slot_ptr<T>(slots: *mut Slot<T>, s: usize) -> *mut Slot<T> {
    // SAFETY: per the contract, slot `s` starts `s * stride` bytes into the array.
    unsafe { slots.cast::<u8>().add(s * stride::<T>()).cast() }
}

/// What both handles share.
struct Shared<T> {
    /// The consumer's head as last released (written only by the consumer, `Release`; read by
    /// the producer, `Acquire`, when its cache says the ring is full).
    head: CachePadded<AtomicUsize>,
    /// Set by the first handle to be dropped.
    abandoned: AtomicBool,
    /// `capacity` initialized slots, `stride::<T>()` bytes apart, allocated with
    /// [`Shared::layout`] in `try_new`, freed in `drop`; never reallocated.
    slots: NonNull<Slot<T>>,
    /// `capacity` (a power of two).
    cap: usize,
}

impl<T> Shared<T> {
    /// The slot array's layout, or `None` when it does not fit `isize::MAX` bytes.
    fn layout(cap: usize) -> Option<Layout> {
        crate::slots::layout(stride::<T>(), cap, core::mem::align_of::<Slot<T>>())
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // `layout` succeeded in `try_new` for this `cap`.
        if let Some(layout) = Self::layout(self.cap) {
            // SAFETY: `slots` holds `cap` initialized slots (field invariant) that nothing
            // refers to any more (both handles are gone); the values are `MaybeUninit` and need
            // no drop, the stamps do under loom. The array came from `slots::alloc_array` with
            // this `layout` in `try_new`.
            unsafe {
                for s in 0..self.cap {
                    ptr::drop_in_place(slot_ptr(self.slots.as_ptr(), s));
                }
                crate::slots::free_array(self.slots, layout);
            }
        }
    }
}

// SAFETY: the slots' values move `T`s from the producer's thread to the consumer's, which is
// fine for `T: Send`; each value is accessed by one side at a time under the stamp/head
// protocol (see the handles' methods), everything else is atomics.
unsafe impl<T: Send> Sync for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for Shared<T> {}

/// One handle's view of the ring: the shared part it keeps alive, and the slot array's start
/// and mask kept beside it, so that the hot path does not load them through `shared`.
struct Ring<T> {
    shared: Arc<Shared<T>>,
    /// `shared.slots`' start.
    slots: *const Slot<T>,
    /// `capacity - 1`.
    mask: usize,
}

impl<T> Ring<T> {
    fn new(shared: Arc<Shared<T>>) -> Self {
        Ring {
            slots: shared.slots.as_ptr().cast_const(),
            mask: shared.cap - 1,
            shared,
        }
    }

    /// Slots in the ring.
    #[inline(always)]
    fn capacity(&self) -> usize {
        self.mask + 1
    }

    /// Slot of index `i`.
    #[inline(always)]
    fn slot(&self, i: usize) -> &Slot<T> {
        // SAFETY: `i & mask < capacity`, and the slots live as long as `shared`, which this
        // view keeps alive.
        unsafe { &*slot_ptr(self.slots.cast_mut(), i & self.mask) }
    }
}

/// A bounded SPSC ring of `Copy` items whose slots carry stamps: the consumer learns that an
/// item is there from a stamp stored in its slot after it (one line brings both), never from
/// the producer's index; the consumer publishes its head once per
/// [`release`](StampedConsumer::release) (or [`pop`](StampedConsumer::pop)), and the producer
/// re-reads it only when its cached copy says the ring is full. The capacity is a power of two,
/// as [`RingBuffer`](crate::RingBuffer)'s.
///
/// ```
/// use rings::{PopError, StampedRing};
///
/// let (mut p, mut c) = StampedRing::<u64>::new(4);
/// p.push(1).unwrap();
/// p.push_deferred(2).unwrap(); // written, not visible yet
/// assert_eq!(c.pop(), Ok(1));
/// assert_eq!(c.pop(), Err(PopError::Empty));
/// p.publish_deferred();
/// let mut out = [std::mem::MaybeUninit::uninit(); 4];
/// assert_eq!(c.peek_into(&mut out), &[2]); // still in the ring
/// c.release(1); // now gone, its slot free again
/// assert!(c.is_empty());
/// ```
#[derive(Debug)]
pub struct StampedRing<T>(PhantomData<T>);

impl<T: Copy> StampedRing<T> {
    /// Creates a ring holding at least `capacity` items (rounded up to a power of two) and
    /// returns its two handles. This is the only allocation the ring makes.
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is `0` or too large (see [`CapacityError`]); use
    /// [`StampedRing::try_new`] to get those as an error instead.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(capacity: usize) -> (StampedProducer<T>, StampedConsumer<T>) {
        match Self::try_new(capacity) {
            Ok(handles) => handles,
            Err(e) => panic!("StampedRing::new({capacity}): {e}"),
        }
    }

    /// Creates a ring holding at least `capacity` items (rounded up to a power of two).
    ///
    /// # Errors
    ///
    /// [`CapacityError::Zero`] if `capacity` is `0`; [`CapacityError::TooLarge`] if the rounded
    /// capacity overflows `usize`, exceeds `usize::MAX / 2 + 1` slots, or needs more than
    /// `isize::MAX` bytes.
    pub fn try_new(
        capacity: usize,
    ) -> Result<(StampedProducer<T>, StampedConsumer<T>), CapacityError> {
        if capacity == 0 {
            return Err(CapacityError::Zero);
        }
        let too_large = CapacityError::TooLarge {
            requested: capacity,
        };
        let cap = capacity.checked_next_power_of_two().ok_or(too_large)?;
        if cap > (usize::MAX >> 1) + 1 {
            return Err(too_large);
        }
        let layout = Shared::<T>::layout(cap).ok_or(too_large)?;
        let slots = crate::slots::alloc_array::<Slot<T>>(layout);
        for s in 0..cap {
            // SAFETY: `s < cap`: inside the array just allocated (or a zero-sized slot).
            unsafe {
                slot_ptr(slots.as_ptr(), s).write(Slot {
                    // Index `i`'s item is there when the stamp is `i + 1`; slot `s` first holds
                    // index `s`, so 0 never matches.
                    stamp: AtomicUsize::new(0),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                });
            }
        }
        let shared = Arc::new(Shared {
            head: CachePadded::new(AtomicUsize::new(0)),
            abandoned: AtomicBool::new(false),
            slots,
            cap,
        });
        let mut producer = StampedProducer {
            ring: Ring::new(shared.clone()),
            tail: 0,
            published: 0,
            cached_head: 0,
            prefetch: false,
            can_prefetch: crate::prefetch::prefetchw_supported(),
            _not_sync: PhantomData,
        };
        producer.set_prefetch(true);
        let consumer = StampedConsumer {
            ring: Ring::new(shared),
            head: 0,
            seen: 0,
            _not_sync: PhantomData,
        };
        Ok((producer, consumer))
    }
}

/// The writing end of a [`StampedRing`].
///
/// `Send` (if `T: Send`) but not `Sync`; every method that touches the ring takes `&mut self`.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<rings::StampedProducer<u8>>();
/// ```
pub struct StampedProducer<T> {
    ring: Ring<T>,
    /// Index of the next slot to write. The items of `published .. tail` are written and
    /// their stamps not stored yet ([`push_deferred`](Self::push_deferred)).
    tail: usize,
    /// Every item below this index has its stamp stored.
    published: usize,
    /// The last head read from `shared.head`; the real head is never behind it, so
    /// `tail - cached_head` (in `0 ..= capacity`) bounds the fill level from above.
    cached_head: usize,
    /// Several slots share a line, and the CPU has `prefetchw`: each line is asked for ahead
    /// of its first write ([`prefetch_for_write`](Self::prefetch_for_write)).
    prefetch: bool,
    /// The CPU has `prefetchw` ([`prefetch_next`](Self::prefetch_next)).
    can_prefetch: bool,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the producer moves `T`s to the consumer's thread (`T: Send`); the handle is `!Sync`
// (`&mut self` API), so one thread at a time uses it.
unsafe impl<T: Send> Send for StampedProducer<T> {}

impl<T: Copy> StampedProducer<T> {
    /// Writes `value` into `tail`'s slot and advances `tail`, storing no stamp.
    #[inline(always)]
    fn write_next(&mut self, value: T) -> Result<(), PushError<T>> {
        if self.tail.wrapping_sub(self.cached_head) > self.ring.mask {
            // Acquire: pairs with the consumer's Release store in `release`, so its reads of
            // the slots it released happen before we overwrite them.
            self.cached_head = self.ring.shared.head.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.cached_head) > self.ring.mask {
                return Err(PushError::Full(value));
            }
        }
        // SAFETY: the slot is free (`tail - head < capacity`): the consumer released the item
        // it held (or it never held one) and does not read its value until we store the
        // stamp `tail + 1` below, after this write.
        self.ring
            .slot(self.tail)
            .value
            .with_mut(|p| unsafe { p.write(MaybeUninit::new(value)) });
        // The first slot of a line: the next line is asked for now, so that the write of its
        // first slot finds it owned (see `prefetch_for_write`).
        if self.prefetch && self.tail & (slots_per_line::<T>() - 1) == 0 {
            self.prefetch_for_write(self.tail.wrapping_add(slots_per_line::<T>()));
        }
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Asks for the line of slot `i` to be brought into this core's cache for writing, ahead
    /// of the write: the consumer read that line a lap ago, so the write must first take it
    /// back, and a producer that writes each slot as the consumer follows (a stream through a
    /// ring of small slots) otherwise stalls on that transfer once a line.
    #[inline(always)]
    fn prefetch_for_write(&self, i: usize) {
        let p: *const Slot<T> = self.ring.slot(i);
        // SAFETY: called only where `can_prefetch` (what `prefetchw_supported()` said) holds:
        // `prefetch` implies it.
        unsafe { crate::prefetch::prefetch_write(p) };
    }

    /// Stores the stamps of every written item, in order.
    #[inline(always)]
    fn publish_all(&mut self) {
        while self.published != self.tail {
            let i = self.published;
            self.published = i.wrapping_add(1);
            // Release: the item's write happens before the consumer's Acquire load of the
            // stamp sees it.
            self.ring
                .slot(i)
                .stamp
                .store(self.published, Ordering::Release);
        }
    }

    /// Pushes one item, visible to the consumer at once (with every deferred one before it).
    ///
    /// # Errors
    ///
    /// [`PushError::Full`] with the item handed back if the ring is full.
    #[inline]
    pub fn push(&mut self, value: T) -> Result<(), PushError<T>> {
        self.write_next(value)?;
        self.publish_all();
        Ok(())
    }

    /// Writes one item without making it visible: the consumer sees it, with every item
    /// deferred before it, at the next [`publish_deferred`](Self::publish_deferred) or
    /// [`push`](Self::push), or when the producer is dropped. The consumer then finds the
    /// whole run at once instead of pulling each item's line as it is written.
    ///
    /// # Errors
    ///
    /// [`PushError::Full`] with the item handed back if the ring is full (deferred items count
    /// as taken slots).
    #[inline]
    pub fn push_deferred(&mut self, value: T) -> Result<(), PushError<T>> {
        self.write_next(value)
    }

    /// Makes the items [`push_deferred`](Self::push_deferred) wrote visible (one stamp store
    /// each, in order; nothing when there are none).
    #[inline]
    pub fn publish_deferred(&mut self) {
        self.publish_all();
    }

    /// Claims up to `max` free slots (as many as are free, possibly none) to write in place;
    /// [`StampedWriteChunk::commit`] publishes them. Reads the consumer's index only if the
    /// cached one says fewer than `max` are free.
    #[inline]
    pub fn write_chunk_up_to(&mut self, max: usize) -> StampedWriteChunk<'_, T> {
        self.write_chunk_refresh_below(max, max)
    }

    /// As [`write_chunk_up_to`](Self::write_chunk_up_to), but reads the consumer's index only
    /// when the cached one says fewer than `below` slots are free (`below <= max`): the chunk
    /// may then be shorter than what is free. A producer that writes a few items at a time
    /// into a ring the consumer keeps draining (a ping-pong's deliveries) asks for a large
    /// chunk with a small `below`, and reads the consumer's line once per `capacity - below`
    /// items instead of on every call (every call where anything is unreleased, with
    /// `below == max == capacity`), which would take that line from the consumer each time.
    #[inline]
    pub fn write_chunk_refresh_below(
        &mut self,
        max: usize,
        below: usize,
    ) -> StampedWriteChunk<'_, T> {
        let cap = self.ring.capacity();
        let mut free = cap - self.tail.wrapping_sub(self.cached_head);
        if free < below.min(max) {
            // Acquire: as in `write_next`.
            self.cached_head = self.ring.shared.head.load(Ordering::Acquire);
            free = cap - self.tail.wrapping_sub(self.cached_head);
        }
        let len = free.min(max);
        StampedWriteChunk {
            producer: self,
            len,
        }
    }

    /// Whether the producer asks for each line ahead of its first write (see
    /// [`push`](Self::push)): on by default where slots share a line and the CPU has
    /// `prefetchw`; off for a ring whose consumer runs on the producer's core, where there is
    /// no line to take back. Turning it on does nothing where it was never possible.
    pub fn set_prefetch(&mut self, on: bool) {
        self.prefetch = on && slots_per_line::<T>() > 1 && self.can_prefetch;
    }

    /// Asks for the first line of the next slot to be written to be brought into this core's
    /// cache, owned (x86's `prefetchw`; nothing where the CPU lacks it): for a producer that
    /// knows it is streaming (it just wrote several items), so that its next write does not
    /// stall taking back the line the consumer read a lap ago. Not after a lone item: a
    /// consumer that waits for the next one spins on that very line, and would have to fetch
    /// it back at once (a ping-pong's round trip grew by about 2 %).
    #[inline]
    pub fn prefetch_next(&self) {
        if self.can_prefetch {
            self.prefetch_for_write(self.tail);
        }
    }

    /// Items written by [`push_deferred`](Self::push_deferred) and not visible yet.
    #[inline]
    pub fn deferred(&self) -> usize {
        self.tail.wrapping_sub(self.published)
    }

    /// The exact number of free slots as of the consumer's last release (reads its index).
    #[inline]
    pub fn slots(&mut self) -> usize {
        // Acquire: as in `write_next`.
        self.cached_head = self.ring.shared.head.load(Ordering::Acquire);
        self.ring.capacity() - self.tail.wrapping_sub(self.cached_head)
    }

    /// The ring's capacity (a power of two).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Whether the consumer has been dropped.
    #[inline]
    pub fn is_abandoned(&self) -> bool {
        // Acquire: pairs with the consumer's Release store in its `Drop`.
        self.ring.shared.abandoned.load(Ordering::Acquire)
    }
}

impl<T> Drop for StampedProducer<T> {
    fn drop(&mut self) {
        // Deferred items are the consumer's, as pushed ones are: their stamps go out now.
        while self.published != self.tail {
            let i = self.published;
            self.published = i.wrapping_add(1);
            let slot = self.ring.slot(i);
            // Release: as in `publish_all`.
            slot.stamp.store(self.published, Ordering::Release);
        }
        // Release: the stamps above happen before a consumer's Acquire load of the flag.
        self.ring.shared.abandoned.store(true, Ordering::Release);
    }
}

impl<T> core::fmt::Debug for StampedProducer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StampedProducer")
            .field("capacity", &(self.ring.capacity()))
            .field("tail", &self.tail)
            .field("published", &self.published)
            .field("cached_head", &self.cached_head)
            .finish_non_exhaustive()
    }
}

/// The reading end of a [`StampedRing`].
///
/// `Send` (if `T: Send`) but not `Sync`; every method that touches the ring takes `&mut self`.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<rings::StampedConsumer<u8>>();
/// ```
pub struct StampedConsumer<T> {
    ring: Ring<T>,
    /// Index of the oldest item not released. `shared.head` equals it outside a method call.
    head: usize,
    /// The items of `head .. seen` have had their stamps seen: they are readable without
    /// another stamp load.
    seen: usize,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: the consumer takes `T`s written on the producer's thread (`T: Send`); the handle is
// `!Sync` (`&mut self` API).
unsafe impl<T: Send> Send for StampedConsumer<T> {}

impl<T: Copy> StampedConsumer<T> {
    /// Whether the item of index `seen` is there (one stamp load); advances `seen` past it.
    #[inline(always)]
    fn see_next(&mut self) -> bool {
        let next = self.seen.wrapping_add(1);
        // Acquire: pairs with the producer's Release store of the stamp, so its write of the
        // item happens before our read of it.
        if self.ring.slot(self.seen).stamp.load(Ordering::Acquire) == next {
            self.seen = next;
            true
        } else {
            false
        }
    }

    /// Copies the value of index `i`, which `see_next` saw stamped.
    #[inline(always)]
    fn read(&self, i: usize) -> T {
        // SAFETY: `head <= i < seen`: the stamp `i + 1` was loaded with Acquire, so the
        // producer's write of the value happened before, and it does not write the slot again
        // until we release the index (the head we publish passes `i`).
        self.ring
            .slot(i)
            .value
            .with(|p| unsafe { (*p).assume_init_read() })
    }

    /// Publishes `head` (one `Release` store).
    #[inline(always)]
    fn publish_head(&mut self) {
        // Release: our reads of the released slots happen before the producer's Acquire load
        // of `head` lets it overwrite them.
        self.ring.shared.head.store(self.head, Ordering::Release);
    }

    /// Whether the ring is empty now: one load of the head slot's stamp when no item is
    /// known to be there.
    #[inline]
    pub fn is_empty(&mut self) -> bool {
        self.seen == self.head && !self.see_next()
    }

    /// The oldest item, read in place; it stays in the ring ([`pop`](Self::pop) or
    /// [`release`](Self::release) removes it).
    ///
    /// # Errors
    ///
    /// [`PeekError::Empty`] if the ring is empty.
    #[inline]
    pub fn peek(&mut self) -> Result<&T, PeekError> {
        if self.is_empty() {
            return Err(PeekError::Empty);
        }
        // SAFETY: as in `read`: `head < seen`, so the item is written, ordered before us by the
        // stamp's Acquire load, and the producer keeps off its slot while the reference
        // borrows `self` (only this handle releases it).
        Ok(self
            .ring
            .slot(self.head)
            .value
            .with(|p| unsafe { (*p).assume_init_ref() }))
    }

    /// Removes the oldest item and releases its slot.
    ///
    /// # Errors
    ///
    /// [`PopError::Empty`] if the ring is empty.
    #[inline]
    pub fn pop(&mut self) -> Result<T, PopError> {
        if self.is_empty() {
            return Err(PopError::Empty);
        }
        let value = self.read(self.head);
        self.head = self.head.wrapping_add(1);
        self.publish_head();
        Ok(value)
    }

    /// Copies up to `out.len()` of the oldest items into `out`, in order, without removing
    /// them, and returns the copies; [`release`](Self::release) removes them. Each item not
    /// seen before costs one stamp load; the first one missing ends the run.
    #[inline]
    pub fn peek_into<'o>(&mut self, out: &'o mut [MaybeUninit<T>]) -> &'o [T] {
        let mut n = 0;
        while n < out.len() {
            let i = self.head.wrapping_add(n);
            if i == self.seen && !self.see_next() {
                break;
            }
            out[n].write(self.read(i));
            n += 1;
        }
        // SAFETY: the first `n` elements were written just above; `MaybeUninit<T>` has `T`'s
        // layout.
        unsafe { core::slice::from_raw_parts(out.as_ptr().cast::<T>(), n) }
    }

    /// Removes the `n` oldest items (at most those seen: what [`peek_into`](Self::peek_into)
    /// or [`is_empty`](Self::is_empty) found; a larger `n` is cut to that) and publishes the
    /// head for the producer (one store, none when `n` is 0).
    #[inline]
    pub fn release(&mut self, n: usize) {
        let n = n.min(self.seen.wrapping_sub(self.head));
        if n > 0 {
            self.head = self.head.wrapping_add(n);
            self.publish_head();
        }
    }

    /// The ring's capacity (a power of two).
    #[inline]
    pub fn capacity(&self) -> usize {
        self.ring.capacity()
    }

    /// Whether the producer has been dropped. Items it pushed (or deferred) before are still
    /// readable.
    #[inline]
    pub fn is_abandoned(&self) -> bool {
        // Acquire: pairs with the producer's Release store in its `Drop`, so a check after
        // this returned `true` sees every stamp it stored.
        self.ring.shared.abandoned.load(Ordering::Acquire)
    }
}

impl<T> Drop for StampedConsumer<T> {
    fn drop(&mut self) {
        // Release: pairs with the producer's Acquire load in `is_abandoned`.
        self.ring.shared.abandoned.store(true, Ordering::Release);
    }
}

impl<T> core::fmt::Debug for StampedConsumer<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StampedConsumer")
            .field("capacity", &(self.ring.capacity()))
            .field("head", &self.head)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

/// Free slots of a [`StampedRing`] claimed by [`StampedProducer::write_chunk_up_to`], to be
/// written in place and published by [`commit`](Self::commit); dropping it publishes nothing.
pub struct StampedWriteChunk<'p, T> {
    producer: &'p mut StampedProducer<T>,
    len: usize,
}

impl<T: Copy> StampedWriteChunk<'_, T> {
    /// Slots claimed.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no slot was free.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes the `k`-th claimed slot.
    ///
    /// # Panics
    ///
    /// If `k >= len()`.
    #[inline]
    pub fn write(&mut self, k: usize, value: T) {
        assert!(k < self.len, "slot {k} of a chunk of {}", self.len);
        let p = &*self.producer;
        // SAFETY: a claimed slot is free: the consumer does not read its value until the
        // commit stores its stamp, after this write.
        p.ring
            .slot(p.tail.wrapping_add(k))
            .value
            .with_mut(|v| unsafe { v.write(MaybeUninit::new(value)) });
    }

    /// The claimed slots' values, as up to two runs of `(first value, count)`, in ring order;
    /// consecutive values of a run are [`STRIDE`](Self::STRIDE) bytes apart (a slot: the
    /// stamp and the value). For a writer that fills the slots in place; nothing else may
    /// access them until [`commit`](Self::commit).
    #[inline]
    pub fn runs(&mut self) -> [(*mut MaybeUninit<T>, usize); 2] {
        let p = &*self.producer;
        let start = p.tail & p.ring.mask;
        let first = self.len.min(p.ring.capacity() - start);
        // The values' addresses only; nothing is accessed here.
        let value = |s: usize| p.ring.slot(s).value.with_mut(|v| v);
        [(value(start), first), (value(0), self.len - first)]
    }

    /// Bytes from one slot's value to the next one's in a run of [`runs`](Self::runs).
    pub const STRIDE: usize = stride::<T>();

    /// Publishes the first `n` claimed slots (cut to the claim), with every deferred item
    /// before them: one stamp store each, in order.
    ///
    /// # Safety
    ///
    /// The first `n` claimed slots (`n` cut to [`len`](Self::len)) hold values written since
    /// the claim, through [`write`](Self::write) or [`runs`](Self::runs)' pointers.
    #[inline]
    pub unsafe fn commit(self, n: usize) {
        let n = n.min(self.len);
        self.producer.tail = self.producer.tail.wrapping_add(n);
        self.producer.publish_all();
    }
}

impl<T> core::fmt::Debug for StampedWriteChunk<'_, T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StampedWriteChunk")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slots_per_line_follows_the_stride() {
        assert_eq!(slots_per_line::<u8>(), 4, "16-byte slots");
        assert_eq!(
            slots_per_line::<[u64; 3]>(),
            2,
            "32-byte slots (a send descriptor's)"
        );
        assert_eq!(slots_per_line::<[u64; 7]>(), 1, "one slot a line");
        assert_eq!(slots_per_line::<[u8; 128]>(), 1, "a slot of three lines");
    }

    #[test]
    fn the_producer_prefetches_only_where_slots_share_a_line() {
        let (mut p, _c) = StampedRing::<[u64; 3]>::new(8);
        assert_eq!(p.prefetch, crate::prefetch::prefetchw_supported());
        p.set_prefetch(false);
        assert!(!p.prefetch);
        p.set_prefetch(true);
        assert_eq!(p.prefetch, crate::prefetch::prefetchw_supported());
        let (mut p, mut c) = StampedRing::<[u8; 128]>::new(2);
        assert!(!p.prefetch);
        p.set_prefetch(true);
        assert!(!p.prefetch, "one slot a line: nothing to ask for ahead");
        assert_eq!(p.can_prefetch, crate::prefetch::prefetchw_supported());
        // A hint: the ring goes on as before, wrapping included.
        for i in 0..5u8 {
            p.prefetch_next();
            p.push([i; 128]).unwrap();
            assert_eq!(c.pop().unwrap(), [i; 128]);
        }
    }
}
