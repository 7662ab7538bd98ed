//! Unix-domain-socket rendezvous for the shm fabric (control plane only; never on the data path).
//!
//! A listener binds a *name*; a connector connects to it by name. Both ends then run a small
//! versioned handshake over the connected `SOCK_SEQPACKET` socket, which also carries the shared
//! segment's memfd (`SCM_RIGHTS`), and the socket then stays open for the connection's lifetime
//! so that a dead peer is seen as a hang-up ([`UdsStream::poll_hangup`]).
//!
//! # Names and the runtime directory
//! Names are 1 to [`MAX_NAME_LEN`] bytes of `[A-Za-z0-9._-]`, not starting with `.`
//! ([`validate_name`]). Sockets live in a per-user directory of mode 0700 ([`runtime_dir`]):
//! `$SPINWIRE_RUNTIME_DIR` if set, else `$XDG_RUNTIME_DIR/spinwire`, else `/tmp/spinwire-<uid>`.
//! The directory must be owned by the effective uid and not be accessible to group or others,
//! otherwise binding and connecting fail with [`UdsError::InsecureRuntimeDir`].
//!
//! A listener for `name` holds an exclusive `flock` on `<dir>/<name>.lock` for its lifetime, so
//! a socket file left behind by a dead process is recognised as stale and replaced safely, and a
//! second live listener gets [`UdsError::AddrInUse`]. The socket file is unlinked on drop (only if
//! it is still the one this listener created); lock files are left in place on purpose (unlinking
//! a lock file races with a concurrent binder).
//!
//! Both ends check the peer's credentials (`SO_PEERCRED`): a peer with another uid is refused with
//! [`UdsError::ForeignPeer`].
//!
//! # Handshake (protocol version [`PROTOCOL_VERSION`])
//! Every message is one 64-byte datagram (`magic "SPWC"`, version, kind, pid, reason, params,
//! reserved zeros; little endian).
//!
//! ```text
//! connector                         listener
//!   connect(name)      ──────────▶  accept (SO_PEERCRED uid check)
//!   send_hello(params) ──HELLO────▶ recv_hello()     version checked, rejected if different
//!                                   engine validates params, creates the segment
//!   recv_offer()       ◀─ACCEPT+fd─ send_accept(params, fd)   or  ◀─REJECT(reason)─ send_reject
//!   engine validates params, attaches the segment
//!   send_ready()       ──READY────▶ recv_ready()     or ──ABORT(reason)──▶ (attach failed)
//!   ... the socket stays open: poll_hangup() on both ends; send_bye() for a clean close ...
//! ```
//!
//! # Example
//! ```
//! use std::time::Duration;
//! use cm::uds::{self, ConnParams, UdsListener};
//!
//! let name = format!("doc-example-{}", std::process::id());
//! let listener = UdsListener::bind(&name)?;
//! let t = Duration::from_secs(2);
//! let params = ConnParams { buffer_size: 4096, buffer_count: 64, ring_depth: 128, inline_max: 200, flags: 0 };
//!
//! let mut client = uds::connect(&name, t)?;
//! client.send_hello(&params, t)?;
//!
//! let mut server = listener.accept_timeout(t)?;
//! let hello = server.recv_hello(t)?;
//! assert_eq!(hello.params, params);
//! let file = std::fs::File::open("/dev/null").unwrap(); // the engine sends its memfd here
//! server.send_accept(&hello.params, std::os::fd::AsFd::as_fd(&file), t)?;
//!
//! let offer = client.recv_offer(t)?;
//! assert_eq!(offer.params, params);
//! client.send_ready(t)?;
//! server.recv_ready(t)?;
//!
//! assert!(!server.poll_hangup()?);
//! drop(client);
//! assert!(server.poll_hangup()?);
//! # Ok::<(), cm::uds::UdsError>(())
//! ```

use std::ffi::{CString, OsStr};
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest accepted rendezvous name, in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// Version of the handshake protocol; peers must match exactly.
pub const PROTOCOL_VERSION: u16 = 1;
/// Environment variable overriding the runtime directory.
pub const RUNTIME_DIR_ENV: &str = "SPINWIRE_RUNTIME_DIR";

const MAGIC: [u8; 4] = *b"SPWC";
const MSG_LEN: usize = 64;
const LISTEN_BACKLOG: libc::c_int = 128;
/// Room for this many fds in a received control message, so that extra fds are seen (and closed)
/// instead of silently truncated.
const MAX_RECV_FDS: usize = 8;

/// Errors of the rendezvous.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdsError {
    /// The rendezvous name is invalid.
    #[error("bad shm rendezvous name {name:?}: {reason}")]
    BadName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Creating or inspecting the runtime directory failed.
    #[error("runtime directory {path:?}")]
    RuntimeDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The runtime directory is not a private directory of this user.
    #[error("runtime directory {path:?} is insecure: {reason}")]
    InsecureRuntimeDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The socket path does not fit in `sockaddr_un`.
    #[error("socket path {path:?} is too long for a Unix socket address")]
    PathTooLong {
        /// The path.
        path: PathBuf,
    },
    /// Another live listener holds the name.
    #[error("shm name {name:?} is already bound by a live listener")]
    AddrInUse {
        /// The name.
        name: String,
    },
    /// A socket system call failed (`step` names it: `socket`, `lock`, `bind`, `listen`,
    /// `accept`, `connect`, `getsockopt`, `poll`, `sendmsg`, `recvmsg`).
    #[error("unix socket {step} failed")]
    Io {
        /// The failing step.
        step: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Nobody listens on the name (no socket file, or a stale one).
    #[error("no shm listener named {name:?}")]
    NoListener {
        /// The name.
        name: String,
    },
    /// An operation did not complete in time.
    #[error("{op} timed out after {timeout:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The timeout it had.
        timeout: Duration,
    },
    /// The peer runs as another user.
    #[error("peer uid {uid} differs from ours ({expected}); refused")]
    ForeignPeer {
        /// The peer's uid.
        uid: u32,
        /// Our effective uid.
        expected: u32,
    },
    /// The peer closed the socket during the handshake.
    #[error("peer closed the control socket during {op}")]
    PeerClosed {
        /// The handshake step.
        op: &'static str,
    },
    /// The peer sent a malformed or unexpected message.
    #[error("bad handshake message: {reason}")]
    BadMessage {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The peer speaks another protocol version.
    #[error("protocol version mismatch: ours {ours}, peer {theirs}")]
    VersionMismatch {
        /// [`PROTOCOL_VERSION`].
        ours: u16,
        /// The peer's version.
        theirs: u16,
    },
    /// The listener rejected our hello.
    #[error("connection rejected by the listener: {reason}")]
    Rejected {
        /// The reason it gave.
        reason: RejectReason,
    },
    /// The connector aborted after the offer (e.g. it could not attach the segment).
    #[error("connection aborted by the connector: {reason}")]
    Aborted {
        /// The reason it gave.
        reason: RejectReason,
    },
    /// A message carried the wrong number of file descriptors (extras are closed).
    #[error("expected {expected} file descriptor(s) in the message, got {got}")]
    FdCount {
        /// How many were expected.
        expected: usize,
        /// How many arrived (at least; a truncated control message counts as one more).
        got: usize,
    },
}

/// Why a listener rejected a hello or a connector aborted the handshake. Sent on the wire as a
/// `u16` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectReason {
    /// Different protocol versions.
    VersionMismatch,
    /// Params are valid but differ from what this side requires.
    ParamsMismatch,
    /// Params are out of range.
    ParamsInvalid,
    /// The listener accepts no more connections (e.g. at its connection limit).
    Busy,
    /// Setting up the segment failed on this side (create/attach error).
    SegmentFailed,
    /// Some other local failure.
    Internal,
    /// A code this version does not know.
    Unknown(u16),
}

impl RejectReason {
    /// The wire code.
    pub const fn code(self) -> u16 {
        match self {
            RejectReason::VersionMismatch => 1,
            RejectReason::ParamsMismatch => 2,
            RejectReason::ParamsInvalid => 3,
            RejectReason::Busy => 4,
            RejectReason::SegmentFailed => 5,
            RejectReason::Internal => 6,
            RejectReason::Unknown(c) => c,
        }
    }

    /// Decodes a wire code.
    pub const fn from_code(code: u16) -> Self {
        match code {
            1 => RejectReason::VersionMismatch,
            2 => RejectReason::ParamsMismatch,
            3 => RejectReason::ParamsInvalid,
            4 => RejectReason::Busy,
            5 => RejectReason::SegmentFailed,
            6 => RejectReason::Internal,
            c => RejectReason::Unknown(c),
        }
    }
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectReason::VersionMismatch => f.write_str("protocol version mismatch"),
            RejectReason::ParamsMismatch => f.write_str("connection parameters mismatch"),
            RejectReason::ParamsInvalid => f.write_str("connection parameters out of range"),
            RejectReason::Busy => f.write_str("listener busy"),
            RejectReason::SegmentFailed => f.write_str("shared segment setup failed"),
            RejectReason::Internal => f.write_str("internal error"),
            RejectReason::Unknown(c) => write!(f, "unknown reason code {c}"),
        }
    }
}

/// Connection parameters exchanged in the handshake. The wire layer (`spinwire`'s
/// `fabric::shm::wire::Params`) validates the layout-relevant fields; `flags` is reserved for
/// feature negotiation (0 today).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ConnParams {
    /// Bytes per buffer.
    pub buffer_size: u32,
    /// Buffers per direction.
    pub buffer_count: u32,
    /// Descriptor-ring slots per direction.
    pub ring_depth: u32,
    /// Largest inline payload.
    pub inline_max: u32,
    /// Feature flags (reserved, 0).
    pub flags: u32,
}

/// A received hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The connector's pid (as it claims; the kernel-verified one is in [`UdsStream::peer_cred`]).
    pub pid: u32,
    /// The proposed params (not validated here).
    pub params: ConnParams,
}

/// A received accept: the final params and the segment fd.
#[derive(Debug)]
pub struct Offer {
    /// The params the listener chose (not validated here: validate before attaching).
    pub params: ConnParams,
    /// The shared segment (close-on-exec).
    pub segment: OwnedFd,
}

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
enum Kind {
    Hello = 1,
    Accept = 2,
    Reject = 3,
    Ready = 4,
    Abort = 5,
    Bye = 6,
}

impl Kind {
    fn from_u16(v: u16) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Accept,
            3 => Kind::Reject,
            4 => Kind::Ready,
            5 => Kind::Abort,
            6 => Kind::Bye,
            _ => return None,
        })
    }
}

/// A received datagram and the fd it carried, if any.
type RawMsg = ([u8; MSG_LEN], Option<OwnedFd>);

/// A decoded message.
#[derive(Clone, Copy, Debug)]
struct Msg {
    kind: Kind,
    pid: u32,
    reason: u16,
    params: ConnParams,
}

fn encode(kind: Kind, reason: u16, params: &ConnParams) -> [u8; MSG_LEN] {
    let mut m = [0u8; MSG_LEN];
    m[0..4].copy_from_slice(&MAGIC);
    m[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    m[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
    m[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    m[12..14].copy_from_slice(&reason.to_le_bytes());
    let fields = [
        params.buffer_size,
        params.buffer_count,
        params.ring_depth,
        params.inline_max,
        params.flags,
    ];
    for (i, f) in fields.iter().enumerate() {
        m[16 + 4 * i..20 + 4 * i].copy_from_slice(&f.to_le_bytes());
    }
    m
}

fn u32_at(m: &[u8; MSG_LEN], off: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&m[off..off + 4]);
    u32::from_le_bytes(b)
}

fn u16_at(m: &[u8; MSG_LEN], off: usize) -> u16 {
    u16::from_le_bytes([m[off], m[off + 1]])
}

/// Decodes and validates the fixed fields (magic, version, kind, reserved bytes).
fn decode(m: &[u8; MSG_LEN]) -> Result<Msg, UdsError> {
    if m[0..4] != MAGIC {
        return Err(UdsError::BadMessage {
            reason: "bad magic",
        });
    }
    let version = u16_at(m, 4);
    if version != PROTOCOL_VERSION {
        return Err(UdsError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: version,
        });
    }
    let kind = Kind::from_u16(u16_at(m, 6)).ok_or(UdsError::BadMessage {
        reason: "unknown message kind",
    })?;
    if m[14..16] != [0, 0] || m[36..].iter().any(|&b| b != 0) {
        return Err(UdsError::BadMessage {
            reason: "reserved bytes not zero",
        });
    }
    Ok(Msg {
        kind,
        pid: u32_at(m, 8),
        reason: u16_at(m, 12),
        params: ConnParams {
            buffer_size: u32_at(m, 16),
            buffer_count: u32_at(m, 20),
            ring_depth: u32_at(m, 24),
            inline_max: u32_at(m, 28),
            flags: u32_at(m, 32),
        },
    })
}

fn io_err(step: &'static str) -> UdsError {
    UdsError::Io {
        step,
        source: io::Error::last_os_error(),
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

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

fn cstring(path: &Path) -> Result<CString, UdsError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| UdsError::PathTooLong {
        path: path.to_owned(),
    })
}

fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t), UdsError> {
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

fn seqpacket_socket() -> Result<OwnedFd, UdsError> {
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

fn peer_cred(fd: BorrowedFd<'_>) -> Result<PeerCred, UdsError> {
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

fn deadline(timeout: Duration) -> Instant {
    // A timeout too large to represent waits "forever" in practice (about 30 years).
    Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 30))
}

/// Waits for `events` on `fd` until `deadline`. Returns `Ok(revents)`, or `Err(Timeout)`.
fn poll_until(
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

/// A listening rendezvous socket for one name. Unlinks its socket file on drop.
#[derive(Debug)]
pub struct UdsListener {
    fd: OwnedFd,
    /// Held (flocked) for the listener's lifetime.
    _lock: OwnedFd,
    name: String,
    path: PathBuf,
    /// (st_dev, st_ino) of the socket file we created.
    id: (u64, u64),
}

impl UdsListener {
    /// Binds `name` in the [`runtime_dir`]. A stale socket file from a dead listener is replaced.
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
        let lock_path = cstring(&dir.join(format!("{name}.lock")))?;
        // SAFETY: valid NUL-terminated path; flags and mode are valid.
        let lock = unsafe {
            libc::open(
                lock_path.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600 as libc::c_uint,
            )
        };
        if lock < 0 {
            return Err(io_err("lock"));
        }
        // SAFETY: `lock` is a fresh descriptor owned by nobody else.
        let lock = unsafe { OwnedFd::from_raw_fd(lock) };
        // SAFETY: flock on a valid fd.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return if errno() == libc::EWOULDBLOCK {
                Err(UdsError::AddrInUse {
                    name: name.to_owned(),
                })
            } else {
                Err(io_err("lock"))
            };
        }
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
            _lock: lock,
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
            return Ok(Some(UdsStream {
                fd,
                peer,
                hung_up: false,
            }));
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
        let Ok(c) = cstring(&self.path) else { return };
        // SAFETY: plain-data out struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid path and out pointer. Unlink only the socket file we created (it may
        // have been replaced if our lock was somehow lost).
        unsafe {
            if libc::lstat(c.as_ptr(), &mut st) == 0 && (st.st_dev, st.st_ino) == self.id {
                libc::unlink(c.as_ptr());
            }
        }
    }
}

/// Connects to the listener bound to `name`, waiting up to `timeout` if its backlog is full.
/// Checks the listener's uid.
///
/// # Errors
/// [`UdsError::BadName`], runtime-directory errors, [`UdsError::NoListener`] (immediately, if no
/// live listener has the name), [`UdsError::Timeout`], [`UdsError::ForeignPeer`],
/// [`UdsError::Io`].
pub fn connect(name: &str, timeout: Duration) -> Result<UdsStream, UdsError> {
    validate_name(name)?;
    let path = runtime_dir()?.join(format!("{name}.sock"));
    let (addr, addr_len) = sockaddr(&path)?;
    let end = deadline(timeout);
    loop {
        let fd = seqpacket_socket()?;
        // SAFETY: valid socket and a sockaddr_un of `addr_len` bytes.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                addr_len,
            )
        };
        if rc == 0 {
            let peer = peer_cred(fd.as_fd())?;
            return Ok(UdsStream {
                fd,
                peer,
                hung_up: false,
            });
        }
        match errno() {
            libc::ENOENT | libc::ECONNREFUSED => {
                return Err(UdsError::NoListener {
                    name: name.to_owned(),
                })
            }
            // Backlog full: retry until the deadline.
            libc::EAGAIN | libc::EINTR => {
                if Instant::now() >= end {
                    return Err(UdsError::Timeout {
                        op: "connect",
                        timeout,
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            _ => return Err(io_err("connect")),
        }
    }
}

/// An established control socket (either end). Keep it open for the connection's lifetime:
/// closing it (or the process dying) is how the peer learns of the disconnect.
#[derive(Debug)]
pub struct UdsStream {
    fd: OwnedFd,
    peer: PeerCred,
    hung_up: bool,
}

impl AsFd for UdsStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for UdsStream {
    /// For `poll(2)` by the control thread: wait for `POLLIN | POLLRDHUP`; a hang-up shows as
    /// `POLLHUP`/`POLLRDHUP`/`POLLERR` (then call [`UdsStream::poll_hangup`] to confirm).
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl UdsStream {
    /// The peer's kernel-verified credentials (already checked to have our uid).
    pub fn peer_cred(&self) -> PeerCred {
        self.peer
    }

    fn send(
        &mut self,
        msg: &[u8; MSG_LEN],
        fd: Option<BorrowedFd<'_>>,
        op: &'static str,
        timeout: Duration,
    ) -> Result<(), UdsError> {
        let end = deadline(timeout);
        // Control buffer for one fd, u64-aligned as cmsghdr requires.
        let mut cbuf = [0u64; 4];
        loop {
            let mut iov = libc::iovec {
                iov_base: msg.as_ptr() as *mut libc::c_void,
                iov_len: MSG_LEN,
            };
            // SAFETY: msghdr is plain data; all-zero is valid (no name, no control).
            let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
            mh.msg_iov = &mut iov;
            mh.msg_iovlen = 1;
            if let Some(fd) = fd {
                // SAFETY: CMSG_SPACE is a pure size computation.
                let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
                debug_assert!(space <= size_of::<[u64; 4]>());
                mh.msg_control = cbuf.as_mut_ptr().cast();
                mh.msg_controllen = space as _;
                // SAFETY: `mh` has a control buffer of `space` bytes, large enough for one
                // cmsghdr carrying one fd, so CMSG_FIRSTHDR is non-null and CMSG_DATA points at
                // `size_of::<RawFd>()` writable bytes inside `cbuf`.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(&mh);
                    (*c).cmsg_level = libc::SOL_SOCKET;
                    (*c).cmsg_type = libc::SCM_RIGHTS;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd.as_raw_fd());
                }
            }
            // SAFETY: `mh` points at a live iovec and control buffer for the call's duration.
            let n = unsafe {
                libc::sendmsg(
                    self.fd.as_raw_fd(),
                    &mh,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n == MSG_LEN as isize {
                return Ok(());
            }
            if n >= 0 {
                return Err(UdsError::Io {
                    step: "sendmsg",
                    source: io::Error::new(io::ErrorKind::WriteZero, "short datagram"),
                });
            }
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => {
                    poll_until(self.fd.as_fd(), libc::POLLOUT, end, op, timeout)?;
                }
                libc::EPIPE | libc::ECONNRESET => return Err(UdsError::PeerClosed { op }),
                _ => return Err(io_err("sendmsg")),
            }
        }
    }

    /// Receives one message, with at most one fd. Returns `Ok(None)` if the peer closed.
    fn recv_raw(
        &mut self,
        block: Option<(Instant, Duration)>,
        op: &'static str,
    ) -> Result<Option<RawMsg>, UdsError> {
        loop {
            let mut buf = [0u8; MSG_LEN];
            // Control buffer with room for MAX_RECV_FDS fds (u64-aligned).
            let mut cbuf = [0u64; 2 + MAX_RECV_FDS];
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: MSG_LEN,
            };
            // SAFETY: msghdr is plain data; all-zero is valid.
            let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
            mh.msg_iov = &mut iov;
            mh.msg_iovlen = 1;
            mh.msg_control = cbuf.as_mut_ptr().cast();
            mh.msg_controllen = size_of::<[u64; 2 + MAX_RECV_FDS]>() as _;
            // SAFETY: `mh` points at live buffers of the stated sizes.
            let n = unsafe {
                libc::recvmsg(
                    self.fd.as_raw_fd(),
                    &mut mh,
                    libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                match errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => match block {
                        Some((end, timeout)) => {
                            poll_until(self.fd.as_fd(), libc::POLLIN, end, op, timeout)?;
                            continue;
                        }
                        None => {
                            return Err(UdsError::Timeout {
                                op,
                                timeout: Duration::ZERO,
                            })
                        }
                    },
                    libc::ECONNRESET => return Ok(None),
                    _ => return Err(io_err("recvmsg")),
                }
            }
            // Take ownership of every received fd first, so all are closed on any error below.
            let mut fds: [Option<OwnedFd>; MAX_RECV_FDS] = Default::default();
            let mut nfds = 0usize;
            let mut foreign_cmsg = false;
            // SAFETY: `mh` was filled by recvmsg; CMSG_FIRSTHDR/NXTHDR walk only within
            // `msg_controllen` bytes of `cbuf`, and each cmsg's data length is derived from its
            // kernel-written `cmsg_len`, bounded by that walk.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&mh);
                while !c.is_null() {
                    let hdr_len = libc::CMSG_LEN(0) as usize;
                    let clen = (*c).cmsg_len as usize;
                    if (*c).cmsg_level == libc::SOL_SOCKET
                        && (*c).cmsg_type == libc::SCM_RIGHTS
                        && clen >= hdr_len
                    {
                        let count = (clen - hdr_len) / size_of::<RawFd>();
                        let data = libc::CMSG_DATA(c).cast::<RawFd>();
                        for i in 0..count {
                            let raw = std::ptr::read_unaligned(data.add(i));
                            if raw < 0 {
                                continue;
                            }
                            let owned = OwnedFd::from_raw_fd(raw);
                            if nfds < MAX_RECV_FDS {
                                fds[nfds] = Some(owned);
                            } // else: dropped (closed) right here
                            nfds += 1;
                        }
                    } else {
                        foreign_cmsg = true;
                    }
                    c = libc::CMSG_NXTHDR(&mh, c);
                }
            }
            if mh.msg_flags & libc::MSG_CTRUNC != 0 {
                return Err(UdsError::FdCount {
                    expected: 1,
                    got: nfds + 1,
                });
            }
            if foreign_cmsg {
                return Err(UdsError::BadMessage {
                    reason: "unexpected control message",
                });
            }
            if n == 0 && nfds == 0 {
                return Ok(None);
            }
            if n as usize != MSG_LEN || mh.msg_flags & libc::MSG_TRUNC != 0 {
                return Err(UdsError::BadMessage {
                    reason: "message is not 64 bytes",
                });
            }
            if nfds > 1 {
                return Err(UdsError::FdCount {
                    expected: 1,
                    got: nfds,
                });
            }
            return Ok(Some((buf, fds[0].take())));
        }
    }

    /// Receives one message of an expected kind set; `fd_kind` is the only kind allowed to carry
    /// an fd (and must carry exactly one).
    fn recv_msg(
        &mut self,
        op: &'static str,
        timeout: Duration,
        fd_kind: Option<Kind>,
    ) -> Result<(Msg, Option<OwnedFd>), UdsError> {
        let end = deadline(timeout);
        let (raw, fd) = self
            .recv_raw(Some((end, timeout)), op)?
            .ok_or(UdsError::PeerClosed { op })?;
        let msg = decode(&raw)?;
        let want_fd = Some(msg.kind) == fd_kind;
        match (want_fd, fd.is_some()) {
            (true, false) => Err(UdsError::FdCount {
                expected: 1,
                got: 0,
            }),
            (false, true) => Err(UdsError::FdCount {
                expected: 0,
                got: 1,
            }),
            _ => Ok((msg, fd)),
        }
    }

    /// Connector: sends the hello with the proposed `params`.
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_hello(&mut self, params: &ConnParams, timeout: Duration) -> Result<(), UdsError> {
        self.send(&encode(Kind::Hello, 0, params), None, "send hello", timeout)
    }

    /// Listener: receives the connector's hello. On a protocol-version mismatch it replies with a
    /// `VersionMismatch` reject (best effort) and returns the error.
    ///
    /// # Errors
    /// [`UdsError::VersionMismatch`], [`UdsError::BadMessage`] (bad magic, unexpected kind,
    /// nonzero reserved bytes), [`UdsError::FdCount`], [`UdsError::PeerClosed`],
    /// [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn recv_hello(&mut self, timeout: Duration) -> Result<Hello, UdsError> {
        match self.recv_msg("recv hello", timeout, None) {
            Ok((m, _)) if m.kind == Kind::Hello => Ok(Hello {
                pid: m.pid,
                params: m.params,
            }),
            Ok(_) => Err(UdsError::BadMessage {
                reason: "expected hello",
            }),
            Err(e @ UdsError::VersionMismatch { .. }) => {
                let _ = self.send_reject(RejectReason::VersionMismatch, Duration::from_millis(100));
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Listener: accepts with the final `params` and passes the `segment` fd (`SCM_RIGHTS`; the
    /// caller keeps its own copy and may close it after this returns).
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_accept(
        &mut self,
        params: &ConnParams,
        segment: BorrowedFd<'_>,
        timeout: Duration,
    ) -> Result<(), UdsError> {
        self.send(
            &encode(Kind::Accept, 0, params),
            Some(segment),
            "send accept",
            timeout,
        )
    }

    /// Listener: rejects the hello with `reason`. Close the stream afterwards.
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_reject(&mut self, reason: RejectReason, timeout: Duration) -> Result<(), UdsError> {
        self.send(
            &encode(Kind::Reject, reason.code(), &ConnParams::default()),
            None,
            "send reject",
            timeout,
        )
    }

    /// Connector: receives the listener's answer to the hello: the final params and the segment
    /// fd (exactly one; extra fds are closed and refused).
    ///
    /// # Errors
    /// [`UdsError::Rejected`] (with the listener's reason), [`UdsError::VersionMismatch`] if the
    /// listener's reply is of another protocol version, [`UdsError::FdCount`],
    /// [`UdsError::BadMessage`], [`UdsError::PeerClosed`], [`UdsError::Timeout`],
    /// [`UdsError::Io`].
    pub fn recv_offer(&mut self, timeout: Duration) -> Result<Offer, UdsError> {
        let (m, fd) = self.recv_msg("recv offer", timeout, Some(Kind::Accept))?;
        match (m.kind, fd) {
            (Kind::Accept, Some(segment)) => Ok(Offer {
                params: m.params,
                segment,
            }),
            (Kind::Reject, _) => Err(UdsError::Rejected {
                reason: RejectReason::from_code(m.reason),
            }),
            _ => Err(UdsError::BadMessage {
                reason: "expected accept or reject",
            }),
        }
    }

    /// Connector: confirms the segment is attached; the connection is established.
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_ready(&mut self, timeout: Duration) -> Result<(), UdsError> {
        self.send(
            &encode(Kind::Ready, 0, &ConnParams::default()),
            None,
            "send ready",
            timeout,
        )
    }

    /// Connector: aborts after an offer it cannot use (params unacceptable, attach failed).
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_abort(&mut self, reason: RejectReason, timeout: Duration) -> Result<(), UdsError> {
        self.send(
            &encode(Kind::Abort, reason.code(), &ConnParams::default()),
            None,
            "send abort",
            timeout,
        )
    }

    /// Listener: waits for the connector's ready.
    ///
    /// # Errors
    /// [`UdsError::Aborted`] with the connector's reason, [`UdsError::BadMessage`],
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn recv_ready(&mut self, timeout: Duration) -> Result<(), UdsError> {
        let (m, _) = self.recv_msg("recv ready", timeout, None)?;
        match m.kind {
            Kind::Ready => Ok(()),
            Kind::Abort => Err(UdsError::Aborted {
                reason: RejectReason::from_code(m.reason),
            }),
            _ => Err(UdsError::BadMessage {
                reason: "expected ready or abort",
            }),
        }
    }

    /// Announces a clean close (best effort, non-blocking); the peer's
    /// [`UdsStream::poll_hangup`] then reports `true`. Dropping the stream has the same effect
    /// a moment later.
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`] (socket buffer full), [`UdsError::Io`].
    pub fn send_bye(&mut self) -> Result<(), UdsError> {
        self.send(
            &encode(Kind::Bye, 0, &ConnParams::default()),
            None,
            "send bye",
            Duration::ZERO,
        )
    }

    /// Non-blocking check whether the peer is gone: `Ok(true)` once it closed its socket (or its
    /// process died), sent bye, or the socket errored; sticky afterwards. One `poll(2)` with zero
    /// timeout (plus a non-blocking read if something is pending): for the control thread, not
    /// the data path.
    ///
    /// # Errors
    /// [`UdsError::BadMessage`] if the peer sent anything but bye after the handshake,
    /// [`UdsError::Io`] if `poll(2)` fails.
    pub fn poll_hangup(&mut self) -> Result<bool, UdsError> {
        if self.hung_up {
            return Ok(true);
        }
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
        if rc < 0 {
            return if errno() == libc::EINTR {
                Ok(false)
            } else {
                Err(io_err("poll"))
            };
        }
        if rc == 0 {
            return Ok(false);
        }
        if pfd.revents & libc::POLLIN != 0 {
            // Drain one message: bye or EOF mean hang-up; anything else is a protocol error.
            match self.recv_raw(None, "poll hangup") {
                Ok(None) => self.hung_up = true,
                Ok(Some((raw, _fd))) => match decode(&raw) {
                    Ok(m) if m.kind == Kind::Bye => self.hung_up = true,
                    Ok(_) => {
                        return Err(UdsError::BadMessage {
                            reason: "unexpected message after the handshake",
                        })
                    }
                    Err(e) => return Err(e),
                },
                Err(UdsError::Timeout { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if pfd.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0 {
            self.hung_up = true;
        }
        Ok(self.hung_up)
    }
}

/// Path of the socket file `name` would use (for diagnostics and tests).
///
/// # Errors
/// [`UdsError::BadName`] and runtime-directory errors.
pub fn socket_path(name: &str) -> Result<PathBuf, UdsError> {
    validate_name(name)?;
    Ok(runtime_dir()?.join(OsStr::new(&format!("{name}.sock"))))
}

/// Raw access to the wire encoding, for tests that impersonate a peer (e.g. a wrong version).
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// Encodes a message with an arbitrary version and kind code.
    pub fn encode_raw(version: u16, kind: u16, reason: u16, params: &ConnParams) -> [u8; 64] {
        let mut m = encode(Kind::Hello, reason, params);
        m[4..6].copy_from_slice(&version.to_le_bytes());
        m[6..8].copy_from_slice(&kind.to_le_bytes());
        m
    }

    /// Sends raw bytes with any number of fds attached (to exercise the receiver's checks).
    ///
    /// # Errors
    /// [`UdsError::Io`] if `sendmsg` fails.
    pub fn send_raw(
        stream: &UdsStream,
        bytes: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), UdsError> {
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
    pub fn recv_raw(
        stream: &mut UdsStream,
        timeout: Duration,
    ) -> Result<Option<[u8; 64]>, UdsError> {
        Ok(stream
            .recv_raw(Some((deadline(timeout), timeout)), "recv raw")?
            .map(|(m, _)| m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        let p = ConnParams {
            buffer_size: 4096,
            buffer_count: 7,
            ring_depth: 64,
            inline_max: 100,
            flags: 0,
        };
        let m = decode(&encode(Kind::Accept, 0, &p)).unwrap();
        assert_eq!(m.kind, Kind::Accept);
        assert_eq!(m.params, p);
        assert_eq!(m.pid, std::process::id());
    }

    #[test]
    fn decode_rejects_garbage() {
        let p = ConnParams::default();
        let mut m = encode(Kind::Hello, 0, &p);
        m[0] = b'X';
        assert!(matches!(decode(&m), Err(UdsError::BadMessage { .. })));
        let m = testing::encode_raw(PROTOCOL_VERSION + 1, 1, 0, &p);
        assert!(matches!(decode(&m), Err(UdsError::VersionMismatch { .. })));
        let m = testing::encode_raw(PROTOCOL_VERSION, 99, 0, &p);
        assert!(matches!(decode(&m), Err(UdsError::BadMessage { .. })));
        let mut m = encode(Kind::Hello, 0, &p);
        m[63] = 1;
        assert!(matches!(decode(&m), Err(UdsError::BadMessage { .. })));
    }

    #[test]
    fn reject_codes_round_trip() {
        for r in [
            RejectReason::VersionMismatch,
            RejectReason::ParamsMismatch,
            RejectReason::ParamsInvalid,
            RejectReason::Busy,
            RejectReason::SegmentFailed,
            RejectReason::Internal,
            RejectReason::Unknown(77),
        ] {
            assert_eq!(RejectReason::from_code(r.code()), r);
        }
    }

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
