//! Batch access: claim a run of slots, work on them in place, publish with one index store.
//!
//! A chunk covers `len` consecutive ring slots starting at the owner's index; because the ring
//! wraps, they appear as two slices (the second one is empty unless the run wraps around).

use core::mem::MaybeUninit;
use core::ptr;
use core::slice;

use crate::primitive::track::Accesses;
use crate::{prefetch, primitive, ChunkError, Consumer, PrefetchAhead, Producer};

/// The most cache lines [`Producer::prefetch_run`] asks for after one run (8 lines: 512 bytes,
/// 64 `u64`s).
const PREFETCH_RUN_LINES: usize = 8;

impl<T> Producer<T> {
    /// Claims exactly `n` free slots to write in place; publish them with
    /// [`WriteChunkUninit::commit`]. Dropping the chunk publishes nothing.
    ///
    /// # Errors
    ///
    /// [`ChunkError::TooFewSlots`] with the number of free slots if fewer than `n` are free.
    #[inline]
    pub fn write_chunk_uninit(&mut self, n: usize) -> Result<WriteChunkUninit<'_, T>, ChunkError> {
        if self.cached_free() < n {
            let free = self.refresh_free();
            if free < n {
                return Err(ChunkError::TooFewSlots(free));
            }
        }
        self.prefetch_run(n);
        Ok(WriteChunkUninit::new(self, n))
    }

    /// Claims up to `max` free slots (as many as are free, possibly none) to write in place.
    ///
    /// Reads the consumer's index only if the cached one says fewer than `max` are free.
    #[inline]
    pub fn write_chunk_uninit_up_to(&mut self, max: usize) -> WriteChunkUninit<'_, T> {
        let n = self.claim(max);
        self.prefetch_run(n);
        WriteChunkUninit::new(self, n)
    }

    /// Claims exactly `n` free slots, fills them with `T::default()`, and returns them as
    /// initialized slices to overwrite in place; publish them with [`WriteChunk::commit`].
    /// Dropping the chunk drops the defaults and publishes nothing.
    ///
    /// # Errors
    ///
    /// [`ChunkError::TooFewSlots`] with the number of free slots if fewer than `n` are free.
    #[inline]
    pub fn write_chunk(&mut self, n: usize) -> Result<WriteChunk<'_, T>, ChunkError>
    where
        T: Default,
    {
        self.write_chunk_uninit(n).map(WriteChunk::from)
    }

    /// At the claim of a run of `n` slots: asks for the cache lines of the run after it (the
    /// next `n` slots, those known free, at most [`PREFETCH_RUN_LINES`]) to be brought into
    /// this core's cache, owned (x86's `prefetchw`), so that the next run's writes find them
    /// here instead of each stalling the producer on taking back a line the consumer read a
    /// lap ago. Only for a run of at least two slots and a line's bytes. A hint: it changes no
    /// state.
    #[inline(always)]
    fn prefetch_run(&self, n: usize) {
        if self.prefetch && n >= PrefetchAhead::<T>::RUN_SLOTS {
            self.prefetch_lines(n);
        }
    }

    /// [`prefetch_run`](Self::prefetch_run)'s requests, out of line (a claim's caller keeps
    /// its registers).
    #[inline(never)]
    fn prefetch_lines(&self, n: usize) {
        let size = core::mem::size_of::<T>();
        let start = self.tail.wrapping_add(n) & self.mask;
        // The slots known free after the run, not past the end of the array (a run that wraps
        // gets its first part's lines).
        let slots = n
            .min(self.cached_free().saturating_sub(n))
            .min(self.mask + 1 - start);
        let from = self.buf as usize + start * size;
        let end = from + (slots * size).min(PREFETCH_RUN_LINES * primitive::LINE);
        let mut line = from & !(primitive::LINE - 1);
        while line < end {
            // SAFETY: `prefetch` is set only where `prefetchw_supported()` said so.
            unsafe { prefetch::prefetch_write(line as *const u8) };
            line += primitive::LINE;
        }
    }
}

impl<T> Consumer<T> {
    /// Claims exactly the `n` oldest items to read in place; remove them with
    /// [`ReadChunk::release`]. Dropping the chunk leaves them in the ring.
    ///
    /// # Errors
    ///
    /// [`ChunkError::TooFewSlots`] with the number of readable items if fewer than `n` are.
    #[inline]
    pub fn read_chunk(&mut self, n: usize) -> Result<ReadChunk<'_, T>, ChunkError> {
        if self.cached_len() < n {
            let len = self.refresh_len();
            if len < n {
                return Err(ChunkError::TooFewSlots(len));
            }
        }
        Ok(ReadChunk::new(self, n))
    }

    /// Claims up to `max` of the oldest items (as many as are readable, possibly none).
    ///
    /// Reads the producer's index only if the cached one says fewer than `max` are readable.
    #[inline]
    pub fn read_chunk_up_to(&mut self, max: usize) -> ReadChunk<'_, T> {
        let n = self.claim(max);
        ReadChunk::new(self, n)
    }
}

/// Splits the run of `n` slots starting at index `start` into (offset of the first slice,
/// length of the first slice, length of the second slice, which starts at offset 0).
#[inline(always)]
fn split(start: usize, n: usize, mask: usize) -> (usize, usize, usize) {
    let offset = start & mask;
    let first = n.min(mask + 1 - offset);
    (offset, first, n - first)
}

/// Drops items `from .. to` of a chunk in place.
///
/// # Safety
///
/// Items `from .. to` of the run (`first` slots at `first_ptr`, then at `second_ptr`) must be
/// initialized and owned by the caller, and must not be used again.
unsafe fn drop_items<T>(
    first_ptr: *mut T,
    first_len: usize,
    second_ptr: *mut T,
    from: usize,
    to: usize,
) {
    let (a0, a1) = (from.min(first_len), to.min(first_len));
    let (b0, b1) = (
        from.max(first_len) - first_len,
        to.max(first_len) - first_len,
    );
    // SAFETY: the two ranges are exactly items `from .. to` of the run (caller contract).
    unsafe {
        ptr::drop_in_place(ptr::slice_from_raw_parts_mut(first_ptr.add(a0), a1 - a0));
        ptr::drop_in_place(ptr::slice_from_raw_parts_mut(second_ptr.add(b0), b1 - b0));
    }
}

/// Free slots claimed by [`Producer::write_chunk_uninit`], to initialize in place.
///
/// Nothing is published until [`commit`](WriteChunkUninit::commit) /
/// [`commit_all`](WriteChunkUninit::commit_all) / [`fill_from_iter`](WriteChunkUninit::fill_from_iter).
/// Dropping the chunk publishes nothing; values written into it are then forgotten (leaked, not
/// dropped).
#[derive(Debug)]
pub struct WriteChunkUninit<'a, T> {
    /// The producer, borrowed for the chunk's lifetime; its `tail` is the run's first index.
    producer: &'a mut Producer<T>,
    /// Slots in the first slice (starting at `tail & mask`).
    first_len: usize,
    /// Slots in the second slice (starting at slot 0).
    second_len: usize,
    /// Loom's write guards on the run (zero-sized outside loom).
    accesses: Accesses,
}

impl<'a, T> WriteChunkUninit<'a, T> {
    /// Wraps `n` free slots after the producer's tail.
    ///
    /// The caller has checked that `n` slots are free (not doing so is a logic error caught by
    /// a debug assertion; the producer would overwrite unread items).
    #[inline(always)]
    pub(crate) fn new(producer: &'a mut Producer<T>, n: usize) -> Self {
        debug_assert!(n <= producer.cached_free());
        let (offset, first_len, second_len) = split(producer.tail, n, producer.mask);
        let mut accesses = Accesses::new();
        if cfg!(loom) {
            let ring = producer.ring();
            for i in 0..n {
                accesses.add(ring.trackers.write((offset + i) & producer.mask));
            }
        }
        WriteChunkUninit {
            producer,
            first_len,
            second_len,
            accesses,
        }
    }

    #[inline(always)]
    fn first_ptr(&self) -> *mut MaybeUninit<T> {
        // SAFETY: `tail & mask < capacity`, inside the buffer.
        unsafe {
            self.producer
                .buf
                .add(self.producer.tail & self.producer.mask)
        }
    }

    /// The claimed slots, as two slices (the second is empty unless the run wraps).
    #[inline]
    pub fn as_mut_slices(&mut self) -> (&mut [MaybeUninit<T>], &mut [MaybeUninit<T>]) {
        // SAFETY: the two runs are in bounds (`split`), are free slots the consumer does not
        // touch until we publish, and are borrowed exclusively through `&mut self`.
        unsafe {
            (
                slice::from_raw_parts_mut(self.first_ptr(), self.first_len),
                slice::from_raw_parts_mut(self.producer.buf, self.second_len),
            )
        }
    }

    /// The number of claimed slots.
    #[inline]
    pub fn len(&self) -> usize {
        self.first_len + self.second_len
    }

    /// Whether no slots were claimed.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Publishes the first `n` slots of the chunk to the consumer (one index store).
    ///
    /// # Safety
    ///
    /// The first `n` slots (in order: first slice, then second) must have been initialized.
    ///
    /// # Panics
    ///
    /// Panics if `n > self.len()`.
    #[inline]
    pub unsafe fn commit(mut self, n: usize) {
        assert!(
            n <= self.len(),
            "commit({n}) of a {}-slot chunk",
            self.len()
        );
        self.accesses.clear();
        self.producer.publish(n);
    }

    /// Publishes all slots of the chunk.
    ///
    /// # Safety
    ///
    /// Every slot of the chunk must have been initialized.
    #[inline]
    pub unsafe fn commit_all(self) {
        let n = self.len();
        // SAFETY: forwarded caller contract; `n == len`.
        unsafe { self.commit(n) }
    }

    /// Moves items from `iter` into the chunk until it is full or `iter` ends, publishes them
    /// (one index store) and returns how many were published.
    ///
    /// If `iter` panics, nothing is published and the items already moved in are leaked.
    #[inline]
    pub fn fill_from_iter<I>(mut self, iter: I) -> usize
    where
        I: IntoIterator<Item = T>,
    {
        let mut iter = iter.into_iter();
        let mut n = 0;
        let (first, second) = self.as_mut_slices();
        for slot in first.iter_mut().chain(second) {
            match iter.next() {
                Some(item) => {
                    slot.write(item);
                    n += 1;
                }
                None => break,
            }
        }
        // SAFETY: exactly the first `n` slots were written above.
        unsafe { self.commit(n) };
        n
    }
}

/// Free slots claimed by [`Producer::write_chunk`], pre-filled with `T::default()`.
///
/// Publish them with [`commit`](WriteChunk::commit) / [`commit_all`](WriteChunk::commit_all).
/// Items that are not published are dropped with the chunk.
#[derive(Debug)]
pub struct WriteChunk<'a, T> {
    /// The slots, all initialized until published or dropped.
    inner: WriteChunkUninit<'a, T>,
}

impl<'a, T: Default> From<WriteChunkUninit<'a, T>> for WriteChunk<'a, T> {
    /// Fills every slot of `chunk` with `T::default()`.
    ///
    /// If `T::default()` panics, the defaults made so far are leaked and nothing is published.
    fn from(mut chunk: WriteChunkUninit<'a, T>) -> Self {
        let (first, second) = chunk.as_mut_slices();
        for slot in first.iter_mut().chain(second) {
            slot.write(T::default());
        }
        WriteChunk { inner: chunk }
    }
}

impl<T> WriteChunk<'_, T> {
    /// The claimed slots, as two slices (the second is empty unless the run wraps).
    #[inline]
    pub fn as_mut_slices(&mut self) -> (&mut [T], &mut [T]) {
        let (first, second) = self.inner.as_mut_slices();
        // SAFETY: every slot of a `WriteChunk` is initialized (`From` above), and
        // `MaybeUninit<T>` has the layout of `T`.
        unsafe {
            (
                slice::from_raw_parts_mut(first.as_mut_ptr().cast::<T>(), first.len()),
                slice::from_raw_parts_mut(second.as_mut_ptr().cast::<T>(), second.len()),
            )
        }
    }

    /// The number of claimed slots.
    #[inline]
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether no slots were claimed.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// Publishes the first `n` items (one index store) and drops the rest.
    ///
    /// # Panics
    ///
    /// Panics if `n > self.len()`.
    #[inline]
    pub fn commit(mut self, n: usize) {
        let len = self.len();
        assert!(n <= len, "commit({n}) of a {len}-slot chunk");
        let first_ptr = self.inner.first_ptr().cast::<T>();
        let first_len = self.inner.first_len;
        let second_ptr = self.inner.producer.buf.cast::<T>();
        // Nothing left for our `Drop` to drop, even if an item's drop panics below.
        self.inner.first_len = 0;
        self.inner.second_len = 0;
        // SAFETY: items `n .. len` are initialized, ours, and not published.
        unsafe { drop_items(first_ptr, first_len, second_ptr, n, len) };
        self.inner.accesses.clear();
        self.inner.producer.publish(n);
    }

    /// Publishes all items.
    #[inline]
    pub fn commit_all(self) {
        let n = self.len();
        self.commit(n);
    }
}

impl<T> Drop for WriteChunk<'_, T> {
    fn drop(&mut self) {
        let len = self.len();
        // SAFETY: all `len` items are initialized and unpublished (`commit` zeroes the lengths).
        unsafe {
            drop_items(
                self.inner.first_ptr().cast::<T>(),
                self.inner.first_len,
                self.inner.producer.buf.cast::<T>(),
                0,
                len,
            )
        };
    }
}

/// Items claimed by [`Consumer::read_chunk`], to read (or modify) in place.
///
/// Remove them with [`release`](ReadChunk::release) / [`release_all`](ReadChunk::release_all)
/// (one index store), or move them out by iterating (`into_iter`). Dropping the chunk leaves
/// the items in the ring.
#[derive(Debug)]
pub struct ReadChunk<'a, T> {
    /// The consumer, borrowed for the chunk's lifetime; its `head` is the run's first index.
    consumer: &'a mut Consumer<T>,
    /// Items in the first slice (starting at `head & mask`).
    first_len: usize,
    /// Items in the second slice (starting at slot 0).
    second_len: usize,
    /// Loom's write guards on the run (zero-sized outside loom).
    accesses: Accesses,
}

impl<'a, T> ReadChunk<'a, T> {
    /// Wraps the `n` oldest items. The caller has checked that `n` items are readable.
    #[inline(always)]
    pub(crate) fn new(consumer: &'a mut Consumer<T>, n: usize) -> Self {
        debug_assert!(n <= consumer.cached_len());
        let (offset, first_len, second_len) = split(consumer.head, n, consumer.mask);
        let mut accesses = Accesses::new();
        if cfg!(loom) {
            let ring = consumer.ring();
            for i in 0..n {
                accesses.add(ring.trackers.write((offset + i) & consumer.mask));
            }
        }
        ReadChunk {
            consumer,
            first_len,
            second_len,
            accesses,
        }
    }

    #[inline(always)]
    fn first_ptr(&self) -> *mut T {
        // SAFETY: `head & mask < capacity`, inside the buffer.
        unsafe {
            self.consumer
                .buf
                .add(self.consumer.head & self.consumer.mask)
                .cast::<T>()
        }
    }

    /// The claimed items, oldest first, as two slices (the second is empty unless the run
    /// wraps).
    #[inline]
    pub fn as_slices(&self) -> (&[T], &[T]) {
        // SAFETY: the two runs are in bounds (`split`) and hold initialized items that the
        // producer does not touch until we release them.
        unsafe {
            (
                slice::from_raw_parts(self.first_ptr(), self.first_len),
                slice::from_raw_parts(self.consumer.buf.cast::<T>(), self.second_len),
            )
        }
    }

    /// The claimed items as mutable slices.
    #[inline]
    pub fn as_mut_slices(&mut self) -> (&mut [T], &mut [T]) {
        // SAFETY: as in `as_slices`, borrowed exclusively through `&mut self`.
        unsafe {
            (
                slice::from_raw_parts_mut(self.first_ptr(), self.first_len),
                slice::from_raw_parts_mut(self.consumer.buf.cast::<T>(), self.second_len),
            )
        }
    }

    /// The number of claimed items.
    #[inline]
    pub fn len(&self) -> usize {
        self.first_len + self.second_len
    }

    /// Whether no items were claimed.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the `n` oldest items of the chunk and releases their slots to the producer (one
    /// index store). The other items stay in the ring.
    ///
    /// # Panics
    ///
    /// Panics if `n > self.len()`.
    #[inline]
    pub fn release(mut self, n: usize) {
        assert!(
            n <= self.len(),
            "release({n}) of a {}-item chunk",
            self.len()
        );
        if core::mem::needs_drop::<T>() {
            // SAFETY: items `0 .. n` are initialized, ours, and released right after, so they
            // are never used again.
            unsafe {
                drop_items(
                    self.first_ptr(),
                    self.first_len,
                    self.consumer.buf.cast::<T>(),
                    0,
                    n,
                )
            };
        }
        self.accesses.clear();
        self.consumer.publish(n);
    }

    /// Drops all items of the chunk and releases their slots.
    #[inline]
    pub fn release_all(self) {
        let n = self.len();
        self.release(n);
    }
}

impl<'a, T> IntoIterator for ReadChunk<'a, T> {
    type Item = T;
    type IntoIter = ReadChunkIntoIter<'a, T>;

    /// Moves the items out, oldest first. Dropping the iterator releases the items taken so far
    /// (one index store); the rest stay in the ring.
    #[inline]
    fn into_iter(self) -> Self::IntoIter {
        ReadChunkIntoIter {
            chunk: self,
            taken: 0,
        }
    }
}

/// Moves the items of a [`ReadChunk`] out; see [`ReadChunk::into_iter`].
#[derive(Debug)]
pub struct ReadChunkIntoIter<'a, T> {
    /// The chunk being drained.
    chunk: ReadChunk<'a, T>,
    /// Items moved out so far (in range `0 ..= chunk.len()`); released on drop.
    taken: usize,
}

impl<T> Iterator for ReadChunkIntoIter<'_, T> {
    type Item = T;

    #[inline]
    fn next(&mut self) -> Option<T> {
        let i = self.taken;
        let ptr = if i < self.chunk.first_len {
            // SAFETY: `i` is inside the first run.
            unsafe { self.chunk.first_ptr().add(i) }
        } else if i < self.chunk.len() {
            // SAFETY: `i - first_len` is inside the second run.
            unsafe {
                self.chunk
                    .consumer
                    .buf
                    .cast::<T>()
                    .add(i - self.chunk.first_len)
            }
        } else {
            return None;
        };
        self.taken += 1;
        // SAFETY: item `i` is initialized and ours; counting it in `taken` first means it is
        // released (never read or dropped again) when the iterator drops.
        Some(unsafe { ptr.read() })
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.chunk.len() - self.taken;
        (left, Some(left))
    }
}

impl<T> ExactSizeIterator for ReadChunkIntoIter<'_, T> {}

impl<T> Drop for ReadChunkIntoIter<'_, T> {
    fn drop(&mut self) {
        self.chunk.accesses.clear();
        self.chunk.consumer.publish(self.taken);
    }
}
