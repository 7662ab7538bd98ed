//! A write prefetch (x86's `prefetchw`): a producer asks for the cache line it writes next
//! while it still writes the current one, so that the line its consumer read last comes back
//! before the write needs it instead of stalling it.

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
