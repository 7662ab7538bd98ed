//! The synchronization primitives the ring is built from, swapped for loom's under `cfg(loom)`.
//!
//! This is the crossbeam-style shim: the ring code only ever names `primitive::...`, so the same
//! code is compiled against `core` for real use and against loom's model-checked types when the
//! crate is built with `RUSTFLAGS="--cfg loom"`.
//!
//! Slot storage is a plain raw buffer (the chunk API hands out contiguous slices, which a per-slot
//! `UnsafeCell` cannot give). Under loom every slot additionally gets a zero-sized
//! `loom::cell::UnsafeCell<()>` *tracker*, and every slot access holds a read or write guard on its
//! tracker for exactly as long as the access lasts. Loom then reports any access that is not ordered
//! by happens-before with a conflicting one, i.e. a data race on slot contents. Outside loom the
//! trackers are zero-sized no-ops that compile to nothing.

#[cfg(not(loom))]
pub(crate) mod sync {
    pub(crate) mod atomic {
        pub(crate) use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    }
}

#[cfg(loom)]
pub(crate) mod sync {
    pub(crate) mod atomic {
        pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    }
}

/// A cell with loom's closure API (`with`, `with_mut`), so that loom tracks the accesses of
/// the stamped ring's slot values ([`crate::StampedRing`]); a plain `UnsafeCell` outside loom.
#[cfg(not(loom))]
pub(crate) mod cell {
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        #[inline(always)]
        pub(crate) fn new(value: T) -> Self {
            UnsafeCell(core::cell::UnsafeCell::new(value))
        }

        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(loom)]
pub(crate) mod cell {
    pub(crate) use loom::cell::UnsafeCell;
}

#[cfg(not(loom))]
pub(crate) mod track {
    /// Per-slot access trackers; zero-sized outside loom.
    #[derive(Debug)]
    pub(crate) struct SlotTrackers;

    /// Proof of an ongoing slot access; zero-sized outside loom.
    #[derive(Debug)]
    pub(crate) struct Access;

    /// A set of ongoing slot accesses (a chunk); zero-sized outside loom.
    #[derive(Debug)]
    pub(crate) struct Accesses;

    impl SlotTrackers {
        #[inline(always)]
        pub(crate) fn new(_capacity: usize) -> Self {
            SlotTrackers
        }

        #[inline(always)]
        pub(crate) fn write(&self, _slot: usize) -> Access {
            Access
        }

        #[inline(always)]
        pub(crate) fn read(&self, _slot: usize) -> Access {
            Access
        }
    }

    impl Access {
        /// Ends the access.
        #[inline(always)]
        pub(crate) fn end(self) {}
    }

    impl Accesses {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Accesses
        }

        #[inline(always)]
        pub(crate) fn add(&mut self, _access: Access) {}

        #[inline(always)]
        pub(crate) fn clear(&mut self) {}
    }
}

#[cfg(loom)]
pub(crate) mod track {
    /// One loom-tracked cell per slot.
    #[derive(Debug)]
    pub(crate) struct SlotTrackers(Box<[loom::cell::UnsafeCell<()>]>);

    /// A live loom read or write guard on one slot.
    #[derive(Debug)]
    pub(crate) enum Access {
        /// The slot is being written (or moved out of / dropped in place).
        Write(#[allow(dead_code)] loom::cell::MutPtr<()>),
        /// The slot is being read through a shared reference.
        Read(#[allow(dead_code)] loom::cell::ConstPtr<()>),
    }

    /// The live guards of a chunk; dropped before the chunk's index publication.
    #[derive(Debug)]
    pub(crate) struct Accesses(Vec<Access>);

    impl SlotTrackers {
        pub(crate) fn new(capacity: usize) -> Self {
            SlotTrackers(
                (0..capacity)
                    .map(|_| loom::cell::UnsafeCell::new(()))
                    .collect(),
            )
        }

        #[track_caller]
        pub(crate) fn write(&self, slot: usize) -> Access {
            Access::Write(self.0[slot].get_mut())
        }

        #[track_caller]
        pub(crate) fn read(&self, slot: usize) -> Access {
            Access::Read(self.0[slot].get())
        }
    }

    impl Access {
        /// Ends the access.
        pub(crate) fn end(self) {
            drop(self);
        }
    }

    impl Accesses {
        pub(crate) fn new() -> Self {
            Accesses(Vec::new())
        }

        pub(crate) fn add(&mut self, access: Access) {
            self.0.push(access);
        }

        pub(crate) fn clear(&mut self) {
            self.0.clear();
        }
    }
}

/// Bytes per cache line (64 on every target this crate is tuned for): the unit of the slot
/// layouts and of the prefetches.
pub(crate) const LINE: usize = 64;

/// Hints the CPU to start loading the cache line at `ptr` into this core's cache (x86_64 only;
/// a no-op elsewhere, under loom and under Miri). A hint has no effect on program semantics:
/// `ptr` is never dereferenced, so any address is fine, in or out of bounds.
#[inline(always)]
pub(crate) fn prefetch_read<T>(ptr: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    // `_mm_prefetch` is a safe fn on newer compilers and an unsafe one on the MSRV.
    #[allow(unused_unsafe)]
    // SAFETY: PREFETCHT0 never faults and does not access memory in the abstract machine; SSE is
    // part of the x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(ptr.cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    let _ = ptr;
}
