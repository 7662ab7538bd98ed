//! The shared mapping: creation (memfd), attachment (from a received fd), header checks and the
//! per-side state words (attached, closed, heartbeat).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use super::error::WireError;
use crate::doorbell::{Doorbell, Scope};

use super::layout::{hdr, Layout, Params, SEGMENT_MAGIC, WIRE_VERSION};
use super::mapping::{Mapping, Side};
use super::rx::{Releaser, RxRing};
use super::tx::TxRing;

/// A snapshot of the peer's state words in the segment header.
///
/// These are written by the peer and therefore untrusted: they are hints for liveness only
/// (any value is memory-safe to act on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerState {
    /// The peer has attached (side A is attached from creation).
    pub attached: bool,
    /// The peer marked the segment closed (clean close).
    pub closed: bool,
    /// The peer's heartbeat counter ([`Segment::bump_heartbeat`]).
    pub heartbeat: u64,
    /// The pid the peer wrote at attach time (diagnostics only).
    pub pid: u32,
}

fn os_err(step: &'static str, create: bool) -> WireError {
    let source = io::Error::last_os_error();
    if create {
        WireError::Create { step, source }
    } else {
        WireError::Attach { step, source }
    }
}

/// Maps the segment; its first `populate` bytes (rings, release rings, buffers) are
/// pre-faulted so the data path takes no page faults there. The large slots after them
/// (tens of MiB per connection) fault in on first use instead, so a connection does
/// not pay for mapping slots it may never fill.
fn map_shared(
    fd: BorrowedFd<'_>,
    len: usize,
    populate: usize,
    create: bool,
) -> Result<NonNull<u8>, WireError> {
    let flags = if populate >= len {
        libc::MAP_SHARED | libc::MAP_POPULATE
    } else {
        libc::MAP_SHARED
    };
    // SAFETY: a fresh mapping of `len` bytes at a kernel-chosen address; no existing memory is
    // affected. The result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap", create));
    }
    if populate > 0 && populate < len {
        // SAFETY: replaces the first `populate` bytes of the mapping just made (ours alone,
        // not yet handed out) with the same file range, pre-faulted; `populate < len`.
        let q = unsafe {
            libc::mmap(
                p,
                populate,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if q == libc::MAP_FAILED {
            let err = os_err("mmap", create);
            // SAFETY: unmapping the mapping made above, which nothing else uses.
            unsafe { libc::munmap(p, len) };
            return Err(err);
        }
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| os_err("mmap", create))
}

/// One connection's shared segment: header, both directions' record rings, release rings and
/// buffer pools.
///
/// `Segment` is a cheap handle (`Clone`, `Send + Sync`) to the mapping; the mapping stays valid
/// while any `Segment`, [`TxRing`], [`RxRing`] or [`Releaser`] of it is alive, so holding a clone keeps buffer
/// pointers handed out by the rings valid. The control thread keeps one for liveness
/// ([`Segment::bump_heartbeat`], [`Segment::peer_state`]); the data path uses the rings from
/// [`Segment::split`].
///
/// When the last handle drops, this side's `closed` flag is set and the memory is unmapped.
#[derive(Clone)]
pub struct Segment {
    map: Arc<Mapping>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("side", &self.map.side)
            .field("len", &self.map.len)
            .field("params", self.map.layout.params())
            .finish()
    }
}

impl Segment {
    /// Creates a segment for `params` as [`Side::A`]: `memfd_create(MFD_CLOEXEC |
    /// MFD_ALLOW_SEALING)`, `fchmod 0600`, `ftruncate`, `fallocate` (the memory of all but the
    /// large slots reserved up front; see [`TxRing::reserve_large`]),
    /// seals against shrink/grow, `mmap(MAP_SHARED | MAP_POPULATE)`, then writes the header and
    /// marks side A attached.
    ///
    /// Returns the segment and the memfd to pass to the peer (e.g. with
    /// `cm::uds::UdsStream::send_accept`); drop the fd once sent.
    ///
    /// # Errors
    /// [`WireError::InvalidParams`] for bad `params`; [`WireError::Create`] naming the failing
    /// system call.
    pub fn create(params: &Params) -> Result<(Segment, OwnedFd), WireError> {
        let layout = Layout::new(params)?;
        let len = layout.total_len();
        // SAFETY: the name is a NUL-terminated literal; flags are valid memfd flags.
        let raw = unsafe {
            libc::memfd_create(
                c"spinwire-shm".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(os_err("memfd_create", true));
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscalls on an fd we own; results are checked.
        if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
            return Err(os_err("fchmod", true));
        }
        // SAFETY: as above; `len` <= MAX_SEGMENT_LEN fits in off_t.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os_err("ftruncate", true));
        }
        // Reserve the memory of everything but the large slots now: a later page fault can
        // then not hit a full tmpfs or memory limit, which would raise SIGBUS on the data path.
        // Each direction's large slots are committed by their sender before its first large
        // message (`TxRing::reserve_large`), so an idle connection does not pay for them.
        let reserve = layout.large_start() as libc::off_t;
        // SAFETY: as above; `large_start() <= len`.
        if unsafe { libc::fallocate(fd.as_raw_fd(), 0, 0, reserve) } != 0 {
            return Err(os_err("fallocate", true));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os_err("seal", true));
        }
        let base = map_shared(
            std::os::fd::AsFd::as_fd(&fd),
            len,
            layout.large_start(),
            true,
        )?;
        let map = Mapping {
            base,
            len,
            layout,
            side: Side::A,
            split: AtomicBool::new(false),
            holds_side: true,
        };
        // A fresh memfd is zero filled; write the header.
        map.atomic_u32(hdr::VERSION)
            .store(WIRE_VERSION, Ordering::Relaxed);
        map.atomic_u32(hdr::BUFFER_SIZE)
            .store(params.buffer_size, Ordering::Relaxed);
        map.atomic_u32(hdr::BUFFER_COUNT)
            .store(params.buffer_count, Ordering::Relaxed);
        map.atomic_u32(hdr::RING_DEPTH)
            .store(params.ring_depth, Ordering::Relaxed);
        map.atomic_u32(hdr::INLINE_MAX)
            .store(params.inline_max, Ordering::Relaxed);
        map.atomic_u64(hdr::TOTAL_LEN)
            .store(len as u64, Ordering::Relaxed);
        map.atomic_u32(hdr::LARGE_SIZE)
            .store(params.large_size, Ordering::Relaxed);
        map.atomic_u32(hdr::LARGE_COUNT)
            .store(params.large_count, Ordering::Relaxed);
        map.atomic_u32(map.state_off(Side::A, hdr::ST_PID))
            .store(std::process::id(), Ordering::Relaxed);
        map.atomic_u32(map.state_off(Side::A, hdr::ST_ATTACHED))
            .store(1, Ordering::Relaxed);
        map.atomic_u64(hdr::MAGIC)
            .store(SEGMENT_MAGIC, Ordering::Release);
        Ok((Segment { map: Arc::new(map) }, fd))
    }

    /// Attaches to a segment received from the peer as [`Side::B`].
    ///
    /// `params` must be the parameters *this* side validated during the handshake: the layout is
    /// computed from them, never from the segment. Checks, in order: the file is a regular file
    /// with mode 0600, sealed against shrinking, and exactly `Layout::total_len()` bytes
    /// (`fstat` before `mmap`, so no access can fault); maps it with `MAP_POPULATE`; then checks
    /// that the header magic, version and params match; then marks side B attached (failing if it
    /// already was). A failed attach leaves the header's side-B words untouched.
    ///
    /// # Errors
    /// [`WireError::InvalidParams`], [`WireError::Attach`], [`WireError::SegmentMode`],
    /// [`WireError::NotSealed`], [`WireError::SegmentSize`], [`WireError::HeaderMismatch`],
    /// [`WireError::AlreadyAttached`].
    pub fn attach(fd: BorrowedFd<'_>, params: &Params) -> Result<Segment, WireError> {
        let layout = Layout::new(params)?;
        let len = layout.total_len();
        // SAFETY: `stat` is plain data; fstat fills it or fails (checked).
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd borrowed for the call and a valid out pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(os_err("fstat", false));
        }
        let mode = st.st_mode;
        if mode & libc::S_IFMT != libc::S_IFREG || mode & 0o7777 != 0o600 {
            return Err(WireError::SegmentMode { mode });
        }
        // SAFETY: plain fcntl query on a valid fd.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(os_err("get_seals", false));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(WireError::NotSealed {
                seals: seals as u32,
            });
        }
        if st.st_size as u64 != len as u64 {
            return Err(WireError::SegmentSize {
                expected: len as u64,
                actual: st.st_size as u64,
            });
        }
        let base = map_shared(fd, len, layout.large_start(), false)?;
        let map = Mapping {
            base,
            len,
            layout,
            side: Side::B,
            split: AtomicBool::new(false),
            holds_side: false,
        };
        // Until the attached flag is claimed below, dropping `map` only unmaps: a failed attempt
        // must not mark side B closed for a later, valid attach.
        let checks: [(&'static str, u64, u64); 9] = [
            (
                "magic",
                SEGMENT_MAGIC,
                map.atomic_u64(hdr::MAGIC).load(Ordering::Acquire),
            ),
            (
                "version",
                u64::from(WIRE_VERSION),
                u64::from(map.atomic_u32(hdr::VERSION).load(Ordering::Relaxed)),
            ),
            (
                "buffer_size",
                u64::from(params.buffer_size),
                u64::from(map.atomic_u32(hdr::BUFFER_SIZE).load(Ordering::Relaxed)),
            ),
            (
                "buffer_count",
                u64::from(params.buffer_count),
                u64::from(map.atomic_u32(hdr::BUFFER_COUNT).load(Ordering::Relaxed)),
            ),
            (
                "ring_depth",
                u64::from(params.ring_depth),
                u64::from(map.atomic_u32(hdr::RING_DEPTH).load(Ordering::Relaxed)),
            ),
            (
                "inline_max",
                u64::from(params.inline_max),
                u64::from(map.atomic_u32(hdr::INLINE_MAX).load(Ordering::Relaxed)),
            ),
            (
                "total_len",
                len as u64,
                map.atomic_u64(hdr::TOTAL_LEN).load(Ordering::Relaxed),
            ),
            (
                "large_size",
                u64::from(params.large_size),
                u64::from(map.atomic_u32(hdr::LARGE_SIZE).load(Ordering::Relaxed)),
            ),
            (
                "large_count",
                u64::from(params.large_count),
                u64::from(map.atomic_u32(hdr::LARGE_COUNT).load(Ordering::Relaxed)),
            ),
        ];
        for (what, expected, found) in checks {
            if expected != found {
                return Err(WireError::HeaderMismatch {
                    what,
                    expected,
                    found,
                });
            }
        }
        if map
            .atomic_u32(map.state_off(Side::B, hdr::ST_ATTACHED))
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return Err(WireError::AlreadyAttached);
        }
        let mut map = map;
        map.holds_side = true;
        map.atomic_u32(map.state_off(Side::B, hdr::ST_PID))
            .store(std::process::id(), Ordering::Relaxed);
        Ok(Segment { map: Arc::new(map) })
    }

    /// Splits off this side's data-path handles: the [`TxRing`] for [`Side::tx_dir`], and the
    /// [`RxRing`] and [`Releaser`] for [`Side::rx_dir`]. Allocates the per-buffer ownership
    /// tables (setup time, not the data path).
    ///
    /// # Errors
    /// [`WireError::AlreadySplit`] if called before on any clone of this segment;
    /// [`WireError::Ring`] if a record ring cannot be set up over its region (not with a
    /// layout from validated params).
    pub fn split(&self) -> Result<(TxRing, RxRing, Releaser), WireError> {
        if self.map.split.swap(true, Ordering::AcqRel) {
            return Err(WireError::AlreadySplit);
        }
        let side = self.map.side;
        Ok((
            TxRing::new(Arc::clone(&self.map), side.tx_dir())?,
            RxRing::new(Arc::clone(&self.map), side.rx_dir())?,
            Releaser::new(Arc::clone(&self.map), side.rx_dir()),
        ))
    }

    /// This process's side.
    #[inline]
    pub fn side(&self) -> Side {
        self.map.side
    }

    /// The layout (and through it the validated params).
    #[inline]
    pub fn layout(&self) -> &Layout {
        &self.map.layout
    }

    /// The validated params.
    #[inline]
    pub fn params(&self) -> &Params {
        self.map.layout.params()
    }

    /// Mapped length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.map.len
    }

    /// Always `false`: a segment is never empty. (For clippy's `len_without_is_empty`.)
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Increments this side's heartbeat counter (call from the control thread, e.g. every
    /// 100 ms). The peer watches it with [`Segment::peer_state`].
    #[inline]
    pub fn bump_heartbeat(&self) {
        self.map
            .atomic_u64(self.map.state_off(self.map.side, hdr::ST_HEARTBEAT))
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Marks this side closed (clean close); also done automatically when the last handle drops.
    /// A mark made before ([`mark_closed_with`](Self::mark_closed_with)) stays.
    #[inline]
    pub fn mark_closed(&self) {
        self.mark_closed_with(hdr::CLOSED);
    }

    /// Marks this side closed with `code` (nonzero: the reason this side failed the connection
    /// for, see the layout's `ST_CLOSED`), unless it is marked already (the first mark wins).
    #[inline]
    pub fn mark_closed_with(&self, code: u32) {
        let _ = self
            .map
            .atomic_u32(self.map.state_off(self.map.side, hdr::ST_CLOSED))
            .compare_exchange(0, code.max(1), Ordering::Release, Ordering::Relaxed);
        // A peer asleep in a receive wakes to see the mark.
        self.peer_bell().ring();
    }

    /// The peer's close mark: 0 while it is open, else what it closed with (see
    /// [`mark_closed_with`](Self::mark_closed_with); an untrusted hint).
    #[inline]
    pub fn peer_close_code(&self) -> u32 {
        let peer = self.map.side.peer();
        self.map
            .atomic_u32(self.map.state_off(peer, hdr::ST_CLOSED))
            .load(Ordering::Acquire)
    }

    /// Reads the peer's state words (untrusted hints, see [`PeerState`]).
    pub fn peer_state(&self) -> PeerState {
        let peer = self.map.side.peer();
        let m = &self.map;
        PeerState {
            attached: m
                .atomic_u32(m.state_off(peer, hdr::ST_ATTACHED))
                .load(Ordering::Acquire)
                != 0,
            closed: m
                .atomic_u32(m.state_off(peer, hdr::ST_CLOSED))
                .load(Ordering::Acquire)
                != 0,
            heartbeat: m
                .atomic_u64(m.state_off(peer, hdr::ST_HEARTBEAT))
                .load(Ordering::Relaxed),
            pid: m
                .atomic_u32(m.state_off(peer, hdr::ST_PID))
                .load(Ordering::Relaxed),
        }
    }

    /// `true` once the peer marked itself closed. One relaxed-acquire load: cheap enough for a
    /// poller to check every few hundred cycles.
    #[inline]
    pub fn is_peer_closed(&self) -> bool {
        let peer = self.map.side.peer();
        self.map
            .atomic_u32(self.map.state_off(peer, hdr::ST_CLOSED))
            .load(Ordering::Acquire)
            != 0
    }

    /// This side's doorbell as a receiver (`hdr::ST_BELL`): it arms and sleeps on it; the
    /// peer rings it.
    #[inline]
    pub fn bell(&self) -> Doorbell<'_> {
        let off = self.map.state_off(self.map.side, hdr::ST_BELL);
        Doorbell::new(self.map.atomic_u32(off), Scope::Shared)
    }

    /// The peer's doorbell: rung after publishing to it (and on this side's close).
    #[inline]
    pub fn peer_bell(&self) -> Doorbell<'_> {
        Doorbell::new(self.peer_bell_word(), Scope::Shared)
    }

    /// The peer's doorbell word (valid while the mapping is: any handle of this segment or of
    /// its rings keeps it).
    #[inline]
    pub fn peer_bell_word(&self) -> &AtomicU32 {
        let off = self.map.state_off(self.map.side.peer(), hdr::ST_BELL);
        self.map.atomic_u32(off)
    }

    /// Base address of the mapping. For tests and diagnostics (e.g. fuzzing the peer's rings);
    /// writing through it is the caller's responsibility.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.base()
    }
}
