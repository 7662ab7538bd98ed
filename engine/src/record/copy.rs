//! Copying message bytes: [`copy_bytes`], which copies a small message with a few unaligned
//! word moves instead of a call to `memcpy`.
//!
//! Measured (`bench cost --sizes 8,64`, `perf report`): with a payload length known only at
//! run time, `copy_from_slice` compiles to a call to libc's `memmove`, about 6% of a direct
//! path's streamed 8-byte message (three copies per message: into the send buffer, into the
//! ring record, out of it in `try_recv`). Up to 16 bytes the copy below is two (possibly
//! overlapping) loads and stores of the same width, no call and no loop.

/// Copies `len` bytes from `src` to `dst` (as `ptr::copy_nonoverlapping`): inline word moves
/// up to 16 bytes, `copy_nonoverlapping` (a `memcpy`) above.
///
/// # Safety
///
/// As [`std::ptr::copy_nonoverlapping`]: `src` is valid for reads of `len` bytes, `dst` for
/// writes of `len` bytes, and the two ranges do not overlap. No alignment is required.
#[inline(always)]
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    if len >= 8 {
        if len <= 16 {
            // SAFETY: offsets `0` and `len - 8` (`8 <= len`) with 8-byte accesses stay inside
            // `src .. src + len` and `dst .. dst + len`, valid per the caller's contract;
            // unaligned accesses need no alignment; both loads precede the stores, and the
            // ranges do not overlap anyway.
            unsafe {
                let a = src.cast::<u64>().read_unaligned();
                let b = src.add(len - 8).cast::<u64>().read_unaligned();
                dst.cast::<u64>().write_unaligned(a);
                dst.add(len - 8).cast::<u64>().write_unaligned(b);
            }
        } else {
            // SAFETY: the caller's contract is `copy_nonoverlapping`'s.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
        }
    } else if len >= 4 {
        // SAFETY: as above, with 4-byte accesses at `0` and `len - 4` (`4 <= len`).
        unsafe {
            let a = src.cast::<u32>().read_unaligned();
            let b = src.add(len - 4).cast::<u32>().read_unaligned();
            dst.cast::<u32>().write_unaligned(a);
            dst.add(len - 4).cast::<u32>().write_unaligned(b);
        }
    } else if len > 0 {
        // SAFETY: 1 ..= 3 bytes: offsets `0`, `len / 2` and `len - 1` are all `< len`, inside
        // both ranges (first, middle and last byte, overlapping for 1 and 2).
        unsafe {
            *dst = *src;
            *dst.add(len / 2) = *src.add(len / 2);
            *dst.add(len - 1) = *src.add(len - 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::copy_bytes;

    #[test]
    fn copies_every_length_exactly() {
        let src: Vec<u8> = (1..=64).collect();
        for len in 0..=40 {
            let mut dst = [0u8; 48];
            // SAFETY: `len <= 40` bytes of a 64-byte source into a 48-byte destination.
            unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr().add(3), len) };
            assert_eq!(&dst[3..3 + len], &src[..len], "len {len}");
            assert!(dst[..3].iter().all(|&b| b == 0), "len {len}");
            assert!(dst[3 + len..].iter().all(|&b| b == 0), "len {len}");
        }
    }
}
