//! The system calls of placed memory, the placement module's only FFI: anonymous mappings on
//! 4 KiB or 2 MiB pages (`mmap`, `MAP_HUGETLB | MAP_HUGE_2MB`), `munmap`, and the NUMA policy of
//! a range (`mbind`, through `syscall(2)`: libc has no wrapper). Setup only, never the data
//! path.

use std::io;
use std::ptr::NonNull;

/// `MAP_HUGE_2MB`: log2(2 MiB) in the `MAP_HUGE_SHIFT` bits of the flags.
const MAP_HUGE_2MB: libc::c_int = 21 << libc::MAP_HUGE_SHIFT;
/// `MFD_HUGE_2MB`, the same encoding for `memfd_create`.
pub(crate) const MFD_HUGE_2MB: libc::c_uint = 21 << libc::MFD_HUGE_SHIFT;
/// `MPOL_PREFERRED` (`<linux/mempolicy.h>`).
const MPOL_PREFERRED: libc::c_long = 1;
/// Nodes a node mask holds: node ids below this can be named.
pub(crate) const MAX_NODES: u32 = 1024;

/// Maps `bytes` (nonzero; a multiple of 2 MiB when `huge`) of private anonymous memory,
/// readable and writable and zero filled. On 4 KiB pages without reserving swap
/// (`MAP_NORESERVE`: pages take memory only once touched); on 2 MiB pages with the hugepages
/// reserved now (an `ENOMEM` here, never a `SIGBUS` at first touch).
pub(super) fn map_anon(bytes: usize, huge: bool) -> io::Result<NonNull<u8>> {
    let flags = if huge {
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | MAP_HUGE_2MB
    } else {
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE
    };
    // SAFETY: an anonymous mapping at an address the kernel picks: no existing memory is
    // affected; failure is `MAP_FAILED`, checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Unmaps a mapping of [`map_anon`].
///
/// # Safety
///
/// `ptr` and `bytes` are those of one [`map_anon`] call, unmapped once, and nothing uses the
/// memory afterwards.
pub(super) unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
    // SAFETY: by the caller's contract the range is exactly one live mapping of ours.
    unsafe {
        libc::munmap(ptr.as_ptr().cast(), bytes);
    }
}

/// Sets the NUMA policy of the pages of `ptr .. ptr + bytes` to "prefer `node`"
/// (`MPOL_PREFERRED`): pages faulted in later come from that node while it has free memory,
/// else from another (a strict `MPOL_BIND` would turn a full node into a failed fault, a
/// `SIGBUS` on the data path for hugepages). On a shared mapping the policy is the file's, so
/// every process mapping it allocates its pages by it. Pages already present do not move: call
/// before the first touch.
///
/// # Errors
///
/// The `errno` of `mbind` (`EINVAL` for a node the kernel does not know, `ENOSYS` on a kernel
/// without NUMA).
///
/// # Safety
///
/// `ptr .. ptr + bytes` is a mapping (or part of one) this process owns; `ptr` is page aligned.
/// Changing a policy does not change the contents, so the caller's other uses of the memory
/// stay valid.
pub(super) unsafe fn mbind_preferred(ptr: NonNull<u8>, bytes: usize, node: u32) -> io::Result<()> {
    if node >= MAX_NODES {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut mask = [0u64; (MAX_NODES / 64) as usize];
    mask[(node / 64) as usize] = 1u64 << (node % 64);
    // The kernel reads `maxnode - 1` bits (an old off-by-one every caller honours).
    let maxnode = libc::c_ulong::from(MAX_NODES) + 1;
    // SAFETY: `mbind(addr, len, mode, nodemask, maxnode, flags)`: the range is ours (caller's
    // contract), `mask` is valid for reads of `MAX_NODES` bits for the call; the kernel only
    // changes the range's policy.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr.as_ptr(),
            bytes,
            MPOL_PREFERRED,
            mask.as_ptr(),
            maxnode,
            0 as libc::c_uint,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPU the calling thread runs on now (`sched_getcpu`), `None` when unknown.
pub(super) fn current_cpu() -> Option<usize> {
    // SAFETY: no preconditions; -1 on failure.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}
