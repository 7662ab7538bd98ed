//! Lock files: `<dir>/<name>.lock`, `flock`ed by the live listener of `name` for its lifetime.
//!
//! A lock counts only while its file is still the one at the path: whoever takes a lock checks,
//! after the `flock`, that the descriptor's inode is the path's, and starts again on the
//! current file otherwise. That makes removing a lock file safe for its holder (the listener's
//! close) and for whoever takes the lock of a dead listener ([`sweep`]): a binder that opened
//! the file just before it was removed finds it replaced and takes the new one.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use super::path::validate_name;
use super::sys::{cstring, errno, io_err};
use super::UdsError;

/// How often a bind retries a lock that is held: a [`sweep`] of another process holds a dead
/// listener's lock for a moment, a live listener for its lifetime.
const BUSY_TRIES: u32 = 5;
/// The pause between two of those tries.
const BUSY_PAUSE: Duration = Duration::from_millis(1);
/// How often a bind starts again on a lock file replaced under it (each time someone removed
/// the one it opened: bounded, as each removal needs the lock, which this bind then holds
/// next).
const REPLACED_TRIES: u32 = 16;

/// The lock of one name, held (flocked) while this lives.
#[derive(Debug)]
pub(super) struct NameLock {
    /// Holds the `flock`.
    _fd: OwnedFd,
    path: CString,
    /// (st_dev, st_ino) of the locked file.
    id: (u64, u64),
}

/// `(st_dev, st_ino)` of `path` itself (not following a symlink), if it exists.
fn path_id(path: &CString) -> Option<(u64, u64)> {
    // SAFETY: plain-data out struct, filled by lstat or left unused on error.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated path and out pointer.
    (unsafe { libc::lstat(path.as_ptr(), &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// `(st_dev, st_ino)` of an open file.
fn fd_id(fd: &OwnedFd) -> Result<(u64, u64), UdsError> {
    // SAFETY: plain-data out struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io_err("lock"));
    }
    Ok((st.st_dev, st.st_ino))
}

/// Opens `path` (creating it with `create`) and tries its `flock`: `Ok(None)` while another
/// holds it or it does not exist (without `create`).
fn try_lock(path: &CString, create: bool) -> Result<Option<OwnedFd>, UdsError> {
    let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW;
    let flags = if create { flags | libc::O_CREAT } else { flags };
    // SAFETY: valid NUL-terminated path; flags and mode are valid.
    let fd = unsafe { libc::open(path.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return if !create && errno() == libc::ENOENT {
            Ok(None)
        } else {
            Err(io_err("lock"))
        };
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: flock on a valid fd.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return if errno() == libc::EWOULDBLOCK {
            Ok(None)
        } else {
            Err(io_err("lock"))
        };
    }
    Ok(Some(fd))
}

impl NameLock {
    /// Takes the lock of `name` at `path`.
    ///
    /// # Errors
    /// [`UdsError::AddrInUse`] while a live listener holds it; [`UdsError::Io`].
    pub(super) fn acquire(path: &Path, name: &str) -> Result<NameLock, UdsError> {
        let path = cstring(path)?;
        let in_use = || UdsError::AddrInUse {
            name: name.to_owned(),
        };
        let mut busy = 0;
        let mut replaced = 0;
        loop {
            let Some(fd) = try_lock(&path, true)? else {
                busy += 1;
                if busy >= BUSY_TRIES {
                    return Err(in_use());
                }
                std::thread::sleep(BUSY_PAUSE);
                continue;
            };
            let id = fd_id(&fd)?;
            if path_id(&path) == Some(id) {
                return Ok(NameLock { _fd: fd, path, id });
            }
            // Removed (or replaced) after we opened it: take the current one.
            replaced += 1;
            if replaced >= REPLACED_TRIES {
                return Err(in_use());
            }
        }
    }

    /// Removes the lock file, if it is still ours (the lock itself is released when this is
    /// dropped, after).
    pub(super) fn remove(&self) {
        if path_id(&self.path) == Some(self.id) {
            // SAFETY: valid NUL-terminated path.
            unsafe { libc::unlink(self.path.as_ptr()) };
        }
    }
}

/// Removes the files of every name in `dir` whose listener is gone: for each `<name>.lock`
/// whose lock is free (its holder died or never unlinked it), its `<name>.sock` (a socket
/// only) and the lock file itself, while holding that lock. `skip` (the name being bound) is
/// left alone. Best effort: a file that cannot be read or locked is left.
pub(super) fn sweep(dir: &Path, skip: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(name) = file.to_str().and_then(|f| f.strip_suffix(".lock")) else {
            continue;
        };
        if name == skip || validate_name(name).is_err() {
            continue;
        }
        let (Ok(lock_path), Ok(sock_path)) = (
            cstring(&dir.join(format!("{name}.lock"))),
            cstring(&dir.join(format!("{name}.sock"))),
        ) else {
            continue;
        };
        let Ok(Some(fd)) = try_lock(&lock_path, false) else {
            continue;
        };
        let Ok(id) = fd_id(&fd) else { continue };
        if path_id(&lock_path) != Some(id) {
            continue;
        }
        // We hold the name's valid lock: nobody listens on it.
        // SAFETY: plain-data out struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid path and out pointer; only a socket file is removed.
        unsafe {
            if libc::lstat(sock_path.as_ptr(), &mut st) == 0
                && st.st_mode & libc::S_IFMT == libc::S_IFSOCK
            {
                libc::unlink(sock_path.as_ptr());
            }
            libc::unlink(lock_path.as_ptr());
        }
        drop(fd);
    }
}
