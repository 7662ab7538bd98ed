//! Prefetches. A write prefetch (x86's `prefetchw`): a producer asks for the cache line it
//! writes next while it still writes the current one, so that the line its consumer read last
//! comes back before the write needs it instead of stalling it. A read prefetch (`prefetcht0`):
//! a consumer that has seen an item of several lines asks for its later lines at once, so that
//! their transfers from the producer's core overlap instead of following one another.

/// Whether this CPU executes `prefetchw` (CPUID 0x8000_0001, ECX bit 8: x86-64 CPUs since
/// Intel's Broadwell and every AMD one); `false` elsewhere and under loom. Ask once, at setup.
pub fn prefetchw_supported() -> bool {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    {
        // `cpuid` exists on every x86-64 CPU; the highest extended leaf is checked first.
        use core::arch::x86_64::__cpuid;
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    false
}

/// Asks for the cache line holding `p` to be brought into this core's cache, owned, for a
/// write that follows. A hint: it reads and writes nothing, and never faults, whatever `p` is.
/// Nothing happens where the instruction is not known (other architectures, loom).
///
/// # Safety
///
/// [`prefetchw_supported`] returned `true` on this machine (the instruction is executed
/// unconditionally on x86-64).
#[inline(always)]
pub unsafe fn prefetch_write<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: `prefetchw` has no architectural effect and does not fault on any address; the
    // caller guarantees the CPU executes it.
    unsafe {
        core::arch::asm!(
            "prefetchw [{}]",
            in(reg) p,
            options(nostack, preserves_flags, readonly)
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// A read prefetch (`prefetcht0`, the crate's one read-prefetch helper) of every
/// cache line of `*p` after the one holding its first byte, a hint on any address: for a
/// consumer that has just read the start of an object of several lines (a receive slot's
/// stamp) and will read the rest, so that the later lines' transfers overlap instead of
/// following one another as the reads reach them.
#[inline(always)]
pub fn prefetch_read_rest<T>(p: *const T) {
    use crate::primitive::LINE;
    let start = p as usize;
    let first_next = (start | (LINE - 1)).wrapping_add(1);
    let mut off = first_next.wrapping_sub(start);
    while off < core::mem::size_of::<T>() {
        crate::primitive::prefetch_read(p.cast::<u8>().wrapping_add(off));
        off += LINE;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn read_prefetches_are_hints_on_any_address() {
        // Objects of one line and of several, at every offset in a line, and addresses that
        // are mapped nowhere: nothing is read, nothing faults.
        let buf = [7u8; 512];
        for at in 0..64 {
            prefetch_read_rest(buf[at..].as_ptr().cast::<[u8; 136]>());
            prefetch_read_rest(buf[at..].as_ptr().cast::<[u8; 8]>());
        }
        prefetch_read_rest(core::ptr::null::<[u8; 256]>());
        prefetch_read_rest(core::ptr::NonNull::<[u8; 256]>::dangling().as_ptr());
        assert_eq!(buf, [7u8; 512]);
    }
}
