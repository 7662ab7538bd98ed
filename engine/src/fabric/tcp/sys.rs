//! The system calls of the TCP fabric, its only FFI: on the data path non-blocking `recv`,
//! `send` of one buffer or `sendmsg` of an iovec list (`MSG_NOSIGNAL`: a closed peer is an `EPIPE` error, never a
//! `SIGPIPE`) and `shutdown` (the pools are mapped by `crate::placement`). Errors are raw errno values (no
//! allocation on the data path).

use core::mem::MaybeUninit;
use std::os::fd::RawFd;

/// Most iovec entries one [`sendmsg`] call takes (Linux's `IOV_MAX` is 1024; a poller cycle
/// posts at most a batch of messages, two or three entries each).
pub(crate) const IOV_BATCH: usize = 256;

/// One gather entry: `len` bytes from `base`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Iov {
    pub(crate) base: *const u8,
    pub(crate) len: usize,
}

/// A fixed array of gather entries, filled for one `sendmsg`.
pub(crate) struct IovList {
    iov: [MaybeUninit<libc::iovec>; IOV_BATCH],
    len: usize,
}

impl IovList {
    #[inline]
    pub(crate) fn new() -> IovList {
        IovList {
            iov: [const { MaybeUninit::uninit() }; IOV_BATCH],
            len: 0,
        }
    }

    /// Appends `iov` (empty entries are skipped); false when the list is full.
    #[inline]
    pub(crate) fn push(&mut self, iov: Iov) -> bool {
        if iov.len == 0 {
            return true;
        }
        let Some(slot) = self.iov.get_mut(self.len) else {
            return false;
        };
        slot.write(libc::iovec {
            iov_base: iov.base.cast_mut().cast(),
            iov_len: iov.len,
        });
        self.len += 1;
        true
    }

    /// Entries used.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// `errno` of the last failed call, read directly (`io::Error::last_os_error` builds an error
/// and drops it: about 20 instructions per `EAGAIN` of a spinning receiver, callgrind).
#[inline]
fn errno() -> i32 {
    // SAFETY: `__errno_location` returns the calling thread's `errno`, valid for the thread's
    // life.
    unsafe { *libc::__errno_location() }
}

/// The result of a raw `syscall(2)` that returns a size or -1 with `errno` set.
#[inline]
fn sized(n: libc::c_long) -> Result<usize, i32> {
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// Non-blocking `recv` into `buf`: `Ok(0)` is the peer's end of stream, `Err(EAGAIN)` nothing
/// to read.
#[inline]
pub(crate) fn recv(fd: RawFd, buf: &mut [u8]) -> Result<usize, i32> {
    // `recvfrom(2)` through `syscall(2)`, not libc's `recv`: that one is a thread-cancellation
    // point, and switches asynchronous cancellation on and off around the call (about 30 of its
    // 64 instructions per `EAGAIN` of a spinning receiver, callgrind); no thread here is ever
    // cancelled. Every argument is passed as a `long`, as the kernel reads them.
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the duration of the call; the
    // kernel writes at most that many. An invalid `fd` is an `EBADF` error, not UB; no source
    // address is asked for (null, null).
    sized(unsafe {
        libc::syscall(
            libc::SYS_recvfrom,
            libc::c_long::from(fd),
            buf.as_mut_ptr(),
            buf.len(),
            libc::c_long::from(libc::MSG_DONTWAIT),
            core::ptr::null_mut::<libc::sockaddr>(),
            core::ptr::null_mut::<libc::socklen_t>(),
        )
    })
}

/// Non-blocking `sendmsg` of the gather list; returns the bytes the kernel took (possibly fewer
/// than described: a partial write).
///
/// # Safety
///
/// Every entry of `iov` must describe memory valid for reads for the duration of the call.
#[inline]
pub(crate) unsafe fn sendmsg(fd: RawFd, iov: &IovList) -> Result<usize, i32> {
    // SAFETY: a zeroed `msghdr` is a valid "no name, no control data" header.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = iov.iov.as_ptr().cast_mut().cast();
    msg.msg_iovlen = iov.len as _;
    // SAFETY: the first `iov.len` entries are initialised (`IovList::push`) and, by the
    // caller's contract, describe readable memory; the kernel only reads them.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// Non-blocking `send` of one gather entry (what [`sendmsg`] does for a list of one, without
/// the `msghdr` and iovec array the kernel copies in and imports first); returns the bytes the
/// kernel took.
///
/// # Safety
///
/// `iov` must describe memory valid for reads for the duration of the call.
#[inline]
pub(crate) unsafe fn send(fd: RawFd, iov: Iov) -> Result<usize, i32> {
    // `sendto(2)` through `syscall(2)`, as `recv` above (no cancellation point).
    // SAFETY: by the caller's contract `iov.base` is readable for `iov.len` bytes; the kernel
    // only reads them; no destination address (null, 0).
    sized(unsafe {
        libc::syscall(
            libc::SYS_sendto,
            libc::c_long::from(fd),
            iov.base,
            iov.len,
            libc::c_long::from(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL),
            core::ptr::null::<libc::sockaddr>(),
            0 as libc::c_long,
        )
    })
}

impl IovList {
    /// The only entry, when the list has exactly one.
    #[inline]
    pub(crate) fn single(&self) -> Option<Iov> {
        if self.len != 1 {
            return None;
        }
        // SAFETY: `len == 1`: entry 0 was initialised by `push`.
        let e = unsafe { self.iov[0].assume_init_ref() };
        Some(Iov {
            base: e.iov_base.cast_const().cast(),
            len: e.iov_len,
        })
    }
}

/// `shutdown(fd, SHUT_RDWR)`, best effort: the peer sees the end of stream (control thread).
pub(crate) fn shutdown(fd: RawFd) {
    // SAFETY: plain syscall on a descriptor number; an invalid one is an error, ignored.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// `shutdown(fd, SHUT_WR)`, best effort: our end of stream after the last write (poller close).
pub(crate) fn shutdown_write(fd: RawFd) {
    // SAFETY: as for `shutdown`.
    unsafe {
        libc::shutdown(fd, libc::SHUT_WR);
    }
}
