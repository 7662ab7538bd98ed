//! The listening side: [`UdsListener`] binds a name (holding its lock file) and accepts
//! connectors, checking their credentials.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::lock::{sweep, NameLock};
use super::path::{runtime_dir, validate_name};
use super::stream::UdsStream;
use super::sys::{
    cstring, deadline, errno, io_err, peer_cred, poll_until, seqpacket_socket, sockaddr,
};
use super::UdsError;

const LISTEN_BACKLOG: libc::c_int = 128;

/// A listening rendezvous socket for one name. Unlinks its socket file on drop.
#[derive(Debug)]
pub struct UdsListener {
    fd: OwnedFd,
    /// Held for the listener's lifetime; its file is removed on drop.
    lock: NameLock,
    name: String,
    path: PathBuf,
    /// (st_dev, st_ino) of the socket file we created.
    id: (u64, u64),
}

impl UdsListener {
    /// Binds `name` in the [`runtime_dir`]. A stale socket file from a dead listener is replaced,
    /// and the files that dead listeners of other names left behind are removed.
    /// The socket is non-blocking and close-on-exec.
    ///
    /// # Errors
    /// [`UdsError::BadName`], runtime-directory errors, [`UdsError::PathTooLong`],
    /// [`UdsError::AddrInUse`] if a live listener holds the name, [`UdsError::Io`] for a failing
    /// system call.
    pub fn bind(name: &str) -> Result<Self, UdsError> {
        validate_name(name)?;
        let dir = runtime_dir()?;
        let path = dir.join(format!("{name}.sock"));
        let (addr, addr_len) = sockaddr(&path)?;
        // The files of listeners that died (SIGKILL) go first.
        sweep(&dir, name);
        let lock = NameLock::acquire(&dir.join(format!("{name}.lock")), name)?;
        // We hold the name: any existing socket file is stale.
        let c_path = cstring(&path)?;
        // SAFETY: valid NUL-terminated path.
        if unsafe { libc::unlink(c_path.as_ptr()) } != 0 && errno() != libc::ENOENT {
            return Err(io_err("bind"));
        }
        let fd = seqpacket_socket()?;
        // SAFETY: valid socket and a sockaddr_un of `addr_len` bytes.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                addr_len,
            )
        };
        if rc != 0 {
            return Err(if errno() == libc::EADDRINUSE {
                UdsError::AddrInUse {
                    name: name.to_owned(),
                }
            } else {
                io_err("bind")
            });
        }
        // SAFETY: plain-data out struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid path and out pointer.
        if unsafe { libc::lstat(c_path.as_ptr(), &mut st) } != 0 {
            return Err(io_err("bind"));
        }
        // SAFETY: valid bound socket.
        if unsafe { libc::listen(fd.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
            let e = io_err("listen");
            // SAFETY: valid path; removing the socket file we just created.
            unsafe { libc::unlink(c_path.as_ptr()) };
            return Err(e);
        }
        Ok(Self {
            fd,
            lock,
            name: name.to_owned(),
            path,
            id: (st.st_dev, st.st_ino),
        })
    }

    /// The bound name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The socket file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts one pending connection without blocking: `Ok(None)` if none is pending.
    ///
    /// # Errors
    /// [`UdsError::ForeignPeer`] if the connector runs as another user (its socket is closed);
    /// [`UdsError::Io`] for a failing system call.
    pub fn try_accept(&self) -> Result<Option<UdsStream>, UdsError> {
        loop {
            // SAFETY: valid listening socket; null address pointers are allowed.
            let fd = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if fd < 0 {
                match errno() {
                    libc::EINTR => continue,
                    // ECONNABORTED: the connector went away before we accepted; nothing pending.
                    libc::EAGAIN | libc::ECONNABORTED => return Ok(None),
                    _ => return Err(io_err("accept")),
                }
            }
            // SAFETY: fresh descriptor owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let peer = peer_cred(fd.as_fd())?;
            return Ok(Some(UdsStream::new(fd, peer)));
        }
    }

    /// Waits up to `timeout` for a connection.
    ///
    /// # Errors
    /// [`UdsError::Timeout`], plus those of [`UdsListener::try_accept`].
    pub fn accept_timeout(&self, timeout: Duration) -> Result<UdsStream, UdsError> {
        let end = deadline(timeout);
        loop {
            if let Some(s) = self.try_accept()? {
                return Ok(s);
            }
            poll_until(self.fd.as_fd(), libc::POLLIN, end, "accept", timeout)?;
        }
    }
}

impl AsFd for UdsListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for UdsListener {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for UdsListener {
    fn drop(&mut self) {
        let Ok(c) = cstring(&self.path) else {
            self.lock.remove();
            return;
        };
        // SAFETY: plain-data out struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid path and out pointer. Unlink only the socket file we created (it may
        // have been replaced if our lock was somehow lost).
        unsafe {
            if libc::lstat(c.as_ptr(), &mut st) == 0 && (st.st_dev, st.st_ino) == self.id {
                libc::unlink(c.as_ptr());
            }
        }
        // Still holding the lock: nobody else can have taken it.
        self.lock.remove();
    }
}
