//! Where counters files live: a memory-backed directory, so that the control thread's stores
//! into a mapped file never wait on a disk.
//!
//! A shared file mapping on a disk file system (ext4, xfs) has its dirty pages written back
//! every few seconds, and the next store to a page under writeback faults and waits for it: a
//! control thread stalled on disk I/O misses heartbeats and its peers declare it unresponsive.
//! tmpfs has no writeback, so the files go to the runtime directory when it is on tmpfs
//! (`$XDG_RUNTIME_DIR` usually is), else to `/dev/shm/spinwire-<uid>/` (Aeron keeps its
//! counters file in `/dev/shm` for the same reason), else to the runtime directory as it is.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Overrides the directory counters files live in (tests, or a chosen tmpfs).
pub const COUNTERS_DIR_ENV: &str = "SPINWIRE_COUNTERS_DIR";

/// `statfs` magic numbers of the memory-backed file systems.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// The effective user id.
pub(super) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// True when `path` lies on tmpfs or ramfs.
pub(super) fn on_memory_fs(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: plain-data out struct, filled by statfs or left unused on error.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a valid out pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)]
    let t = st.f_type as i64;
    t == TMPFS_MAGIC || t == RAMFS_MAGIC
}

/// Creates `path` with mode 0700 if missing and checks that it is a directory (not a
/// symlink) of the effective user with no group or other permissions.
pub(super) fn private_dir(path: &Path) -> io::Result<PathBuf> {
    match std::fs::create_dir(path) {
        Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(path)?;
    if !m.is_dir() {
        return Err(io::Error::other("not a directory (or a symlink)"));
    }
    if m.uid() != euid() {
        return Err(io::Error::other("owned by another user"));
    }
    if m.mode() & 0o077 != 0 {
        return Err(io::Error::other(
            "accessible to group or others (needs mode 0700)",
        ));
    }
    Ok(path.to_owned())
}
