//! The slot arrays of both rings: allocated from a cache line, never reallocated.

use core::ptr::NonNull;
use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};

use crate::primitive::LINE;

/// The layout of `cap` elements of `size` bytes aligned to `align`, from a cache line (so that
/// a run of whole lines shares none with its neighbours); `None` when it does not fit
/// `isize::MAX` bytes.
pub(crate) fn layout(size: usize, cap: usize, align: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_mul(cap)?, LINE.max(align)).ok()
}

/// Allocates `layout` (from [`layout`]) for elements of `T`, uninitialized; a dangling pointer
/// when it is zero-sized. Aborts through [`handle_alloc_error`] when memory runs out.
pub(crate) fn alloc_array<T>(layout: Layout) -> NonNull<T> {
    if layout.size() == 0 {
        return NonNull::dangling();
    }
    // SAFETY: `layout` has a non-zero size.
    let p = unsafe { alloc(layout) }.cast::<T>();
    NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout))
}

/// Frees an array from [`alloc_array`] (nothing when zero-sized).
///
/// # Safety
///
/// `p` came from `alloc_array(layout)` with this `layout`, and is not used again.
pub(crate) unsafe fn free_array<T>(p: NonNull<T>, layout: Layout) {
    if layout.size() != 0 {
        // SAFETY: allocated with this non-zero-sized layout (caller contract).
        unsafe { dealloc(p.as_ptr().cast(), layout) }
    }
}
