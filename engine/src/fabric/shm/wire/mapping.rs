//! The mapped memory of a segment ([`Mapping`]): the owner of the `mmap`, shared through an
//! `Arc` by the [`Segment`](super::Segment) handles and the rings, with typed atomic access to
//! its words; and which end of the segment this process is ([`Side`]).
//!
//! Below the rings and the segment: the rings read the mapping, the segment creates it, and this
//! module knows neither.

use crate::doorbell::{Doorbell, Scope};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use super::layout::{hdr, Dir, Layout};

/// Which end of the segment this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The creator ([`Segment::create`](super::Segment::create)); by convention the listening
    /// side. Sends on A->B.
    A,
    /// The attacher ([`Segment::attach`](super::Segment::attach)); by convention the connecting
    /// side. Sends on B->A.
    B,
}

impl Side {
    /// The other side.
    #[inline]
    pub const fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    /// The direction this side sends on.
    #[inline]
    pub const fn tx_dir(self) -> Dir {
        match self {
            Side::A => Dir::AToB,
            Side::B => Dir::BToA,
        }
    }

    /// The direction this side receives on.
    #[inline]
    pub const fn rx_dir(self) -> Dir {
        self.peer().tx_dir()
    }

    const fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }
}

/// The mapped memory; unmapped when the last [`Segment`](super::Segment),
/// [`TxRing`](super::TxRing) or [`RxRing`](super::RxRing) drops.
///
/// Built by [`Segment::create`](super::Segment::create) and
/// [`Segment::attach`](super::Segment::attach), which own the fields' invariants: `base`/`len`
/// are exactly what `mmap` returned, and `layout` is the locally validated layout of `len` bytes.
pub(crate) struct Mapping {
    pub(super) base: NonNull<u8>,
    pub(super) len: usize,
    pub(super) layout: Layout,
    pub(super) side: Side,
    /// Set once by [`Segment::split`](super::Segment::split).
    pub(super) split: AtomicBool,
    /// Whether this mapping holds its side's slot in the header, so that dropping it marks the
    /// side closed. `false` while an attach is still being validated.
    pub(super) holds_side: bool,
}

// SAFETY: `Mapping` owns a MAP_SHARED mapping that stays valid until `Drop`; all concurrent
// access to it goes through atomics or raw-pointer copies whose contracts are documented at the
// use sites, so sharing the owner between threads adds no data race on Rust-owned memory.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the base pointer, immutable layout data and atomics.
unsafe impl Sync for Mapping {}

impl Mapping {
    #[inline]
    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    #[inline]
    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    #[inline]
    pub(crate) fn side(&self) -> Side {
        self.side
    }

    /// Pointer to an 8-aligned u64 word at `off`, as an atomic.
    ///
    /// Callers pass offsets from [`Layout`], which are multiples of 8 and `+ 8 <= len`.
    #[inline]
    pub(crate) fn atomic_u64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: `off` comes from the locally computed layout (8-aligned, in bounds, checked in
        // debug builds); the mapping is page aligned and lives as long as `self`. The memory is
        // shared with the peer, which may write it concurrently: it is only accessed atomically.
        unsafe { &*self.base().add(off).cast::<AtomicU64>() }
    }

    /// Pointer to a 4-aligned u32 word at `off`, as an atomic.
    #[inline]
    pub(crate) fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= self.len);
        // SAFETY: as in `atomic_u64`, for a 4-aligned in-bounds offset.
        unsafe { &*self.base().add(off).cast::<AtomicU32>() }
    }

    pub(super) fn state_off(&self, side: Side, field: usize) -> usize {
        self.layout.side_state(side.index()) + field
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Clean close: tell the peer (it may also see the control socket hang up).
        if self.holds_side {
            // A mark made before (an abort's reason) stays.
            let _ = self
                .atomic_u32(self.state_off(self.side, hdr::ST_CLOSED))
                .compare_exchange(0, hdr::CLOSED, Ordering::Release, Ordering::Relaxed);
            // A peer asleep in a receive wakes to see the close.
            let bell = self.atomic_u32(self.state_off(self.side.peer(), hdr::ST_BELL));
            Doorbell::new(bell, Scope::Shared).ring();
        }
        // SAFETY: `base`/`len` are exactly what mmap returned; no reference into the mapping
        // outlives `self` (every handle holds an `Arc<Mapping>`).
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}
