//! Raw access to the wire encoding, for tests that impersonate a peer (e.g. a wrong version).

use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

pub use super::proto::encode_raw;
use super::stream::{UdsStream, MAX_RECV_FDS};
use super::sys::{deadline, io_err};
use super::UdsError;

/// Sends raw bytes with any number of fds attached (to exercise the receiver's checks).
///
/// # Errors
/// [`UdsError::Io`] if `sendmsg` fails.
pub fn send_raw(stream: &UdsStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), UdsError> {
    let mut cbuf = [0u64; 2 + MAX_RECV_FDS];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    let n = fds.len().min(MAX_RECV_FDS);
    if n > 0 {
        // SAFETY: pure size computation.
        let space = unsafe { libc::CMSG_SPACE((n * size_of::<RawFd>()) as u32) } as usize;
        mh.msg_control = cbuf.as_mut_ptr().cast();
        mh.msg_controllen = space as _;
        // SAFETY: the control buffer holds `space` bytes, enough for one cmsghdr with `n`
        // fds (n <= MAX_RECV_FDS), so the header and data pointers stay inside `cbuf`.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN((n * size_of::<RawFd>()) as u32) as _;
            let data = libc::CMSG_DATA(c).cast::<RawFd>();
            for (i, fd) in fds.iter().take(n).enumerate() {
                std::ptr::write_unaligned(data.add(i), fd.as_raw_fd());
            }
        }
    }
    // SAFETY: `mh` points at live buffers for the call's duration.
    let rc = unsafe { libc::sendmsg(stream.as_raw_fd(), &mh, libc::MSG_NOSIGNAL) };
    if rc < 0 {
        return Err(io_err("sendmsg"));
    }
    Ok(())
}

/// Reads the peer's raw bytes written with [`send_raw`] (used to check a peer's reply).
///
/// # Errors
/// As for the handshake receive functions.
pub fn recv_raw(stream: &mut UdsStream, timeout: Duration) -> Result<Option<[u8; 64]>, UdsError> {
    Ok(stream
        .recv_raw(Some((deadline(timeout), timeout)), "recv raw")?
        .map(|(m, _)| m))
}
