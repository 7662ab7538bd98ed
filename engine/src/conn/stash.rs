//! The connection's stash: where a small received message lives while the application holds
//! it.
//!
//! A [`Message`](super::Message) is a one-word handle, a pointer to its record (the
//! connection, a pointer, the length and the buffer it came in) at the start of the stash slot
//! it holds, so that `try_recv` returns it through `Result<Option<_>>` and the caller's `?` or
//! `if let` without moving its bytes or its record. The handle used to carry the inline payload
//! itself (a 128-byte descriptor), copied whole at each layer, which was most of a receive's
//! cost (`bench cost`, callgrind); then the record itself (24 bytes), which those moves copied
//! with a 16-byte load over the narrow stores that had just written it (a store-forwarding
//! stall per message). A message that arrived inline (its bytes in the shm ring record or in
//! the poller's descriptor) is copied once, into its slot after the record (so an 8-byte
//! message and its record share a line); one in a pool buffer or a large slot stays where the
//! peer wrote it, and its slot holds only the record.
//!
//! The slots are taken and given back last in, first out, so a receive loop that drops each
//! message before the next reuses one slot (one line, hot in the cache). The slot last given
//! back is kept apart (`hot`), so that such a loop takes and gives back with one load, test
//! and store each, without the free list's length, capacity and index arithmetic (callgrind
//! of `bench cost`'s streamed `try_recv`: 21 instructions per message became 13). There are as
//! many slots as the connection has receive buffers and large slots (the most messages in
//! buffers a peer can lend at once), plus as many again, and at least 256, for small ones;
//! holding that many messages at once makes `try_recv` fail with
//! [`Error::TooManyHeld`](crate::Error::TooManyHeld) while a message is waiting (nothing is
//! lost: it stays queued until a held message is dropped), as iceoryx2 bounds the samples a
//! subscriber may borrow.
//!
//! Single-threaded: the connection is `!Sync` and every handle borrowing it is `!Send`, so
//! the free list is used by one thread, and never while another use is in progress (no
//! application code runs inside these calls).

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use crate::desc::INLINE_MAX;

/// Bytes at a slot's start kept for the record of the message that holds it; the payload
/// follows.
pub(super) const RECORD: usize = 32;

/// Bytes of a slot: the record and an inline message's largest payload, rounded up to a power
/// of two (so a slot's index is a shift of its offset).
const SLOT: usize = 256;
const SLOT_SHIFT: u32 = SLOT.trailing_zeros();
const _: () = assert!(SLOT.is_power_of_two() && RECORD + INLINE_MAX <= SLOT);

/// Where the payload of the slot at `slot` (a pointer [`Stash::take`] returned) starts: its
/// `SLOT - RECORD >= INLINE_MAX` bytes after the record.
#[inline(always)]
pub(super) fn payload(slot: NonNull<u8>) -> NonNull<u8> {
    // SAFETY: a slot is `SLOT > RECORD` bytes: the offset stays inside it.
    unsafe { slot.add(RECORD) }
}

/// One slot's storage (aligned to a cache line).
#[repr(C, align(64))]
struct Slot(MaybeUninit<[u8; SLOT]>);

/// The slots and the free list; see the [module docs](self).
pub(super) struct Stash {
    /// `slots` slots, from `Box::into_raw` (freed in `Drop`).
    base: NonNull<Slot>,
    slots: usize,
    /// Free slot indices, the last freed on top. Its capacity is `slots` from the start and it
    /// never holds more (each index is pushed back once, by the message that popped it), so it
    /// never reallocates.
    free: UnsafeCell<Vec<u32>>,
    /// The slot last given back, if it is free and not in `free` (null otherwise): taken
    /// first. Each slot is in exactly one of `hot`, `free`, or a message's hands.
    hot: Cell<*mut u8>,
}

// SAFETY: the stash owns its slots (no other handle points into them while no message is
// held, and held messages borrow the connection that owns the stash, so they cannot be sent
// to another thread; `hot` points to a free slot of its own); `!Sync` is kept by the
// `UnsafeCell` and the `Cell`.
unsafe impl Send for Stash {}

impl Stash {
    /// A stash of `slots` free slots (at least one). Allocates the slots' address space once
    /// (not touched here: a slot's memory is committed when a message is first copied into
    /// it).
    pub(super) fn new(slots: usize) -> Stash {
        let slots = slots.clamp(1, u32::MAX as usize);
        let mem: Box<[Slot]> = (0..slots).map(|_| Slot(MaybeUninit::uninit())).collect();
        let base = NonNull::new(Box::into_raw(mem).cast::<Slot>()).unwrap_or(NonNull::dangling());
        Stash {
            base,
            slots,
            // Popped from the end: slot 0 first.
            free: UnsafeCell::new((0..slots as u32).rev().collect()),
            hot: Cell::new(std::ptr::null_mut()),
        }
    }

    /// The most messages held at once.
    pub(super) fn capacity(&self) -> usize {
        self.slots
    }

    /// Whether every slot is held.
    #[inline(always)]
    pub(super) fn is_full(&self) -> bool {
        // SAFETY: single-threaded and not re-entered (module docs); read for the length only.
        self.hot.get().is_null() && unsafe { &*self.free.get() }.is_empty()
    }

    /// Takes a free slot: a pointer to its `SLOT` writable bytes (the record's room, then the
    /// [`payload`]), owned by the caller until it gives it back with
    /// [`give_back`](Self::give_back). `None`: every slot is held.
    #[inline(always)]
    pub(super) fn take(&self) -> Option<NonNull<u8>> {
        if let Some(p) = NonNull::new(self.hot.get()) {
            self.hot.set(std::ptr::null_mut());
            return Some(p);
        }
        self.take_listed()
    }

    /// [`take`](Self::take) from the free list (`hot` is empty).
    #[inline(never)]
    fn take_listed(&self) -> Option<NonNull<u8>> {
        // SAFETY: single-threaded and not re-entered (module docs): the only reference.
        let i = unsafe { &mut *self.free.get() }.pop()?;
        // SAFETY: `i < slots` (only such indices are in the list), so the slot is inside the
        // allocation.
        Some(unsafe { self.base.add(i as usize) }.cast::<u8>())
    }

    /// Gives back the slot at `p`, a pointer [`take`](Self::take) returned and that is not
    /// given back yet. A pointer that is not a slot's start is ignored.
    #[inline(always)]
    pub(super) fn give_back(&self, p: NonNull<u8>) {
        let off = (p.as_ptr() as usize).wrapping_sub(self.base.as_ptr() as usize);
        // The slot's index, in range only for a slot's start: rotated, the offset's low bits
        // (non-zero inside a slot) land at the top. One rotate and one compare.
        if off.rotate_right(SLOT_SHIFT) >= self.slots {
            return;
        }
        // The last given back is taken first: it becomes `hot`, the one before goes to the
        // list (so the order stays last in, first out).
        let before = self.hot.replace(p.as_ptr());
        if !before.is_null() {
            self.push_listed(before);
        }
    }

    /// Pushes slot `p` (a slot's start, free, in neither `hot` nor the list) onto the list.
    #[inline(never)]
    fn push_listed(&self, p: *mut u8) {
        let i = (p as usize).wrapping_sub(self.base.as_ptr() as usize) >> SLOT_SHIFT;
        // SAFETY: single-threaded and not re-entered (module docs): the only reference.
        let free = unsafe { &mut *self.free.get() };
        // Always true for a taken slot; checked so that a broken caller cannot reallocate.
        if i < self.slots && free.len() < free.capacity() {
            free.push(i as u32);
        }
    }
}

impl Drop for Stash {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.base.as_ptr(), self.slots);
        // SAFETY: `base` and `slots` are the `Box<[Slot]>` made in `new`, given back once here.
        drop(unsafe { Box::from_raw(slice) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_last_in_first_out_and_bounded() {
        let s = Stash::new(3);
        assert_eq!(s.capacity(), 3);
        let a = s.take().expect("a slot");
        let b = s.take().expect("a slot");
        let c = s.take().expect("a slot");
        assert!(s.is_full());
        assert!(s.take().is_none());
        let addrs = [a, b, c].map(|p| p.as_ptr() as usize);
        assert!(addrs.windows(2).all(|w| w[0].abs_diff(w[1]) >= SLOT));
        s.give_back(b);
        assert!(!s.is_full());
        assert_eq!(s.take(), Some(b));
        s.give_back(a);
        s.give_back(b);
        s.give_back(c);
        // A pointer that is not a slot, given back, changes nothing.
        s.give_back(NonNull::dangling());
        assert_eq!(s.take(), Some(c));
        assert_eq!(s.take(), Some(b));
        assert_eq!(s.take(), Some(a));
        assert!(s.take().is_none());
    }

    #[test]
    fn the_slot_last_given_back_is_taken_first_and_each_slot_once() {
        let s = Stash::new(4);
        let taken: Vec<_> = (0..4).map(|_| s.take().expect("a slot")).collect();
        assert!(s.is_full());
        // Given back in an order of their own, interleaved with takes: always the last given
        // back comes out first, and no slot comes out twice.
        s.give_back(taken[2]);
        assert!(!s.is_full());
        s.give_back(taken[0]);
        assert_eq!(s.take(), Some(taken[0]));
        s.give_back(taken[3]);
        s.give_back(taken[0]);
        s.give_back(taken[1]);
        // A pointer inside a slot, or past the last, is not a slot: ignored.
        // SAFETY: inside the stash's allocation (slot 1 has `SLOT` bytes).
        s.give_back(unsafe { taken[1].add(8) });
        // SAFETY: one past the end of the allocation (`4 * SLOT` bytes from slot 0's start).
        s.give_back(unsafe { taken[0].add(4 * SLOT) });
        let order: Vec<_> = (0..4).map(|_| s.take().expect("a slot")).collect();
        assert_eq!(order, [taken[1], taken[0], taken[3], taken[2]]);
        assert!(s.is_full());
        assert!(s.take().is_none());
    }

    #[test]
    fn a_slot_holds_an_inline_message() {
        let s = Stash::new(1);
        let p = s.take().expect("a slot");
        let bytes = [7u8; INLINE_MAX];
        let at = payload(p);
        assert_eq!(at.as_ptr() as usize - p.as_ptr() as usize, RECORD);
        // SAFETY: the slot is ours and has `SLOT - RECORD >= INLINE_MAX` writable bytes after
        // the record's room.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at.as_ptr(), INLINE_MAX) };
        // SAFETY: just written.
        let back = unsafe { std::slice::from_raw_parts(at.as_ptr(), INLINE_MAX) };
        assert_eq!(back, bytes);
        s.give_back(p);
    }
}
