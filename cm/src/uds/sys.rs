//! Socket system calls of the rendezvous: `SOCK_SEQPACKET` sockets, Unix socket addresses,
//! peer credentials (`SO_PEERCRED`) and bounded `poll(2)` waits.

use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::UdsError;

/// Kernel-verified credentials of the peer (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// Effective user id.
    pub uid: u32,
    /// Effective group id.
    pub gid: u32,
}

pub(super) fn io_err(step: &'static str) -> UdsError {
    UdsError::Io {
        step,
        source: io::Error::last_os_error(),
    }
}

pub(super) fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub(super) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

pub(super) fn cstring(path: &Path) -> Result<CString, UdsError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| UdsError::PathTooLong {
        path: path.to_owned(),
    })
}

pub(super) fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t), UdsError> {
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // Keep room for the terminating NUL.
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(UdsError::PathTooLong {
            path: path.to_owned(),
        });
    }
    for (dst, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = b as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

pub(super) fn seqpacket_socket() -> Result<OwnedFd, UdsError> {
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io_err("socket"));
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn peer_cred(fd: BorrowedFd<'_>) -> Result<PeerCred, UdsError> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid socket fd, out pointer to a `ucred` and its length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io_err("getsockopt"));
    }
    if len as usize != size_of::<libc::ucred>() {
        return Err(UdsError::Io {
            step: "getsockopt",
            source: io::Error::new(io::ErrorKind::InvalidData, "short SO_PEERCRED"),
        });
    }
    let cred = PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    };
    if cred.uid != euid() {
        return Err(UdsError::ForeignPeer {
            uid: cred.uid,
            expected: euid(),
        });
    }
    Ok(cred)
}

pub(super) fn deadline(timeout: Duration) -> Instant {
    // A timeout too large to represent waits "forever" in practice (about 30 years).
    Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 30))
}

/// Waits for `events` on `fd` until `deadline`. Returns `Ok(revents)`, or `Err(Timeout)`.
pub(super) fn poll_until(
    fd: BorrowedFd<'_>,
    events: libc::c_short,
    deadline: Instant,
    op: &'static str,
    timeout: Duration,
) -> Result<libc::c_short, UdsError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // Round up so a sub-millisecond remainder still waits instead of spinning.
        let ms = left
            .as_micros()
            .div_ceil(1000)
            .min(libc::c_int::MAX as u128) as libc::c_int;
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(io_err("poll"));
        }
        if rc > 0 {
            return Ok(pfd.revents);
        }
        if Instant::now() >= deadline {
            return Err(UdsError::Timeout { op, timeout });
        }
    }
}
