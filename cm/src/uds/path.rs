//! Rendezvous names and the per-user runtime directory their sockets live in (see the
//! [module docs](super) for the rules).

use std::ffi::OsStr;
use std::io;
use std::path::PathBuf;

use super::sys::{cstring, errno, euid};
use super::{UdsError, MAX_NAME_LEN, RUNTIME_DIR_ENV};

/// Checks a rendezvous name (see the module docs for the rules).
///
/// # Errors
/// [`UdsError::BadName`] naming the rule broken.
pub fn validate_name(name: &str) -> Result<(), UdsError> {
    let bad = |reason| {
        Err(UdsError::BadName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_NAME_LEN {
        return bad("longer than 64 bytes");
    }
    if name.starts_with('.') {
        return bad("starts with '.'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return bad("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

/// Returns the runtime directory (see the module docs), creating it with mode 0700 if missing and
/// checking that it is a directory (not a symlink) owned by the effective uid with no group or
/// other permissions.
///
/// # Errors
/// [`UdsError::RuntimeDir`] if it cannot be created or inspected;
/// [`UdsError::InsecureRuntimeDir`] if it fails the checks.
pub fn runtime_dir() -> Result<PathBuf, UdsError> {
    let path = if let Some(p) = std::env::var_os(RUNTIME_DIR_ENV).filter(|p| !p.is_empty()) {
        PathBuf::from(p)
    } else if let Some(p) = std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        PathBuf::from(p).join("spinwire")
    } else {
        PathBuf::from(format!("/tmp/spinwire-{}", euid()))
    };
    let c = cstring(&path)?;
    // SAFETY: `c` is a valid NUL-terminated path.
    if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 && errno() != libc::EEXIST {
        return Err(UdsError::RuntimeDir {
            path,
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: plain-data out struct, filled by lstat or left unused on error.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0 {
        return Err(UdsError::RuntimeDir {
            path,
            source: io::Error::last_os_error(),
        });
    }
    let insecure = |reason| {
        Err(UdsError::InsecureRuntimeDir {
            path: path.clone(),
            reason,
        })
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return insecure("not a directory (or a symlink)");
    }
    if st.st_uid != euid() {
        return insecure("owned by another user");
    }
    if st.st_mode & 0o077 != 0 {
        return insecure("accessible to group or others (needs mode 0700)");
    }
    Ok(path)
}

/// Path of the socket file `name` would use (for diagnostics and tests).
///
/// # Errors
/// [`UdsError::BadName`] and runtime-directory errors.
pub fn socket_path(name: &str) -> Result<PathBuf, UdsError> {
    validate_name(name)?;
    Ok(runtime_dir()?.join(OsStr::new(&format!("{name}.sock"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("a-b_c.1").is_ok());
        for bad in ["", ".x", "a/b", "a b", "é", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(
                matches!(validate_name(bad), Err(UdsError::BadName { .. })),
                "{bad:?}"
            );
        }
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }
}
