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
                dst.cast::<u64>().write_unaligned(a);
                // Not for 8 bytes: a second store to the same word, at an address computed
                // from `len`, would hold back a load of the word that follows (see
                // `last_word`); the branch is predicted instead.
                if len != 8 {
                    let b = src.add(len - 8).cast::<u64>().read_unaligned();
                    dst.add(len - 8).cast::<u64>().write_unaligned(b);
                }
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

/// The last 8-byte word of a `len`-byte payload copied in whole words, for `8 * (words - 1) <
/// len <= 8 * words`: bytes `8 * (words - 1) .. len` of `src` in memory order, zeros after them
/// (so a record's padding never carries bytes from outside the message).
///
/// A length that fills its words is one load at an address fixed by `words`; otherwise the
/// load's address depends on `len`, but the store the caller makes of the word does not.
///
/// # Safety
///
/// `src` is valid for reads of `len` bytes, and `words` is `len`'s word count as above.
#[inline(always)]
// Under loom the ring copies through its stage instead (`Producer::try_put_copy`).
#[cfg_attr(loom, allow(dead_code))]
pub(crate) unsafe fn last_word(src: *const u8, len: usize, words: usize) -> u64 {
    debug_assert!(len > 8 * (words - 1) && len <= 8 * words);
    let full = 8 * words;
    // SAFETY: each load below reads bytes inside `src .. src + len` (the caller's
    // contract): `full - 8 .. full` with `full == len`; `len - 8 .. len` with `len >= 8`;
    // `0 .. 4` and `len - 4 .. len` with `4 <= len`; single bytes `< len`.
    unsafe {
        if len == full {
            return u64::from_le(src.add(full - 8).cast::<u64>().read_unaligned());
        }
        if len >= 8 {
            // Bytes `len - 8 .. len`; the first `full - len` of them belong to the word before.
            let v = u64::from_le(src.add(len - 8).cast::<u64>().read_unaligned());
            return v >> (8 * (full - len));
        }
        // `len` is 1 ..= 7 (one word).
        if len >= 4 {
            let lo = u64::from(u32::from_le(src.cast::<u32>().read_unaligned()));
            let hi = u64::from(u32::from_le(
                src.add(len - 4).cast::<u32>().read_unaligned(),
            ));
            // Overlapping bytes are the same bytes, at the same places.
            return lo | hi << (8 * (len - 4));
        }
        let mid = len / 2;
        u64::from(*src)
            | u64::from(*src.add(mid)) << (8 * mid)
            | u64::from(*src.add(len - 1)) << (8 * (len - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_bytes, last_word};

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

    #[test]
    fn last_word_holds_the_tail_and_zeros() {
        // A source exactly `len` long at an odd address, so a load past it would be caught by
        // a debug allocator and is ruled out by the asserts' bounds anyway.
        let backing: Vec<u8> = (0..80).map(|i| 0xA0 ^ i as u8).collect();
        for len in 1..=64usize {
            let words = len.div_ceil(8);
            let src = &backing[1..1 + len];
            // SAFETY: `src` is `len` readable bytes and `words` is its word count.
            let w = unsafe { last_word(src.as_ptr(), len, words) }.to_le_bytes();
            let start = 8 * (words - 1);
            let n = len - start;
            assert_eq!(&w[..n], &src[start..], "len {len}");
            assert!(
                w[n..].iter().all(|&b| b == 0),
                "len {len}: padding {:?}",
                &w[n..]
            );
        }
    }
}
