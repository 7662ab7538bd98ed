//! The opaque handles' common part: a tag word checked on entry, and the C-string and timeout
//! arguments.
//!
//! A handle is a `Box` turned into a raw pointer (`Box::into_raw`) whose first field is a tag
//! word: the handle type's magic while it is live, [`DEAD`] once it was closed (written just
//! before the memory is freed). Every entry point checks the pointer (null, misaligned, wrong
//! tag) before it touches anything else: a null pointer, a pointer to some other object and,
//! as long as the allocator has not reused the memory, a closed handle give `SW_BAD_ARG`.
//! Using a closed handle is nevertheless undefined behaviour (the memory may have been reused
//! by then); the check is a safety net, not a guarantee.

use std::ffi::{c_char, CStr};
use std::time::Duration;

use crate::error::{fail_msg, SW_BAD_ARG};

/// The tag of a closed handle.
pub(crate) const DEAD: u64 = u64::from_le_bytes(*b"swDEAD!!");

/// A handle type: its tag word and magic.
pub(crate) trait Tagged {
    /// The tag of a live handle of this type.
    const MAGIC: u64;
    /// The handle's name in error messages.
    const NAME: &'static str;
    /// A pointer to the tag word.
    fn tag(this: *const Self) -> *const u64;
}

/// Checks a handle pointer and borrows the handle.
///
/// # Safety
///
/// `ptr` is null, or points to readable memory of at least 8 bytes aligned like `T` (a live
/// handle of type `T` is such memory; a handle closed earlier usually still is, but that is not
/// guaranteed). A returned reference is valid as long as the handle is not closed.
#[inline]
pub(crate) unsafe fn check<'a, T: Tagged>(what: &str, ptr: *const T) -> Result<&'a T, i32> {
    if ptr.is_null() || !ptr.is_aligned() {
        return Err(bad_handle::<T>(what, ptr));
    }
    // SAFETY: non-null and aligned, and readable per the caller's contract; the tag is a plain
    // u64, valid for any bit pattern.
    let tag = unsafe { T::tag(ptr).read_volatile() };
    if tag != T::MAGIC {
        return Err(bad_handle::<T>(what, ptr));
    }
    // SAFETY: the tag says this is a live `T` made by `Box::into_raw`; shared access only (the
    // mutable parts of handles are in `Cell`s / `UnsafeCell`s).
    Ok(unsafe { &*ptr })
}

/// Marks a live, checked handle closed and frees it.
///
/// # Safety
///
/// `ptr` passed `check`, came from `Box::into_raw`, and no reference into it is used after
/// this call.
pub(crate) unsafe fn destroy<T: Tagged>(ptr: *mut T) {
    // SAFETY: a live handle (checked); volatile so the store is not elided before the free.
    unsafe { T::tag(ptr).cast_mut().write_volatile(DEAD) };
    // SAFETY: made by `Box::into_raw`, freed once (the tag is now DEAD, so a second close fails
    // the check while the memory is not reused).
    drop(unsafe { Box::from_raw(ptr) });
}

#[cold]
fn bad_handle<T: Tagged>(what: &str, ptr: *const T) -> i32 {
    let why = if ptr.is_null() {
        "is NULL"
    } else {
        "is not a live handle (closed, or not one at all)"
    };
    let msg = format!("the {} handle {ptr:p} {why}", T::NAME);
    fail_msg(what, SW_BAD_ARG, &msg)
}

/// Reads a NUL-terminated UTF-8 string argument.
///
/// # Safety
///
/// `s` is null or a valid NUL-terminated string that lives for `'a`.
pub(crate) unsafe fn c_str<'a>(what: &str, arg: &str, s: *const c_char) -> Result<&'a str, i32> {
    if s.is_null() {
        return Err(fail_msg(what, SW_BAD_ARG, &format!("{arg} is NULL")));
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str()
        .map_err(|_| fail_msg(what, SW_BAD_ARG, &format!("{arg} is not valid UTF-8")))
}

/// Checks an output pointer. Inline, its failure out of line: callers on the data path
/// (`sw_try_claim`, the claim checks) pay two tests for it.
#[inline(always)]
pub(crate) fn out_ptr<T>(what: &str, arg: &str, p: *mut T) -> Result<(), i32> {
    if p.is_null() || !p.is_aligned() {
        return Err(bad_ptr(what, arg));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn bad_ptr(what: &str, arg: &str) -> i32 {
    fail_msg(what, SW_BAD_ARG, &format!("{arg} is NULL or misaligned"))
}

/// A timeout in nanoseconds, capped at 100 years (so that `now + timeout` never overflows).
pub(crate) fn timeout(ns: u64) -> Duration {
    const MAX_NS: u64 = 100 * 365 * 24 * 3600 * 1_000_000_000;
    Duration::from_nanos(ns.min(MAX_NS))
}

/// Flattens `Result<T, code>` into the code (for entry points returning an `int`).
pub(crate) fn code(r: Result<(), i32>) -> i32 {
    match r {
        Ok(()) => crate::error::SW_OK,
        Err(c) => c,
    }
}
