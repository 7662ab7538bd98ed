//! rdma_cm wrappers for the control thread (feature `rdma`).
//!
//! This module is the control plane's only FFI. It owns rdma_cm event channels and ids and turns
//! rdma_cm events into typed [`CmEvent`]s and [`CmError`]s:
//!
//! - [`EventChannel`]: one rdma_cm event channel; its fd can be made non-blocking and polled by
//!   the control thread's loop ([`EventChannel::try_event`]) or waited on with a timeout
//!   ([`EventChannel::get_event`]).
//! - [`CmId`]: one rdma_cm id. The listener binds and listens on one; each connection uses its
//!   own id with its own event channel (accepted ids are migrated to a fresh channel), so the
//!   events of one connection never interleave with another's.
//! - [`FlowParams`]: the flow-control parameters (initial credits, buffer size, inline size)
//!   exchanged in the connect/accept private data and validated on receipt.
//! - [`ConnOptions`]: deliberate retry settings. The data path's credits guarantee that a
//!   receive is always posted, so RNR must never happen: `rnr_retry_count` defaults to 0, which
//!   turns a (buggy) RNR into an immediate error completion instead of a silent stall, and the
//!   QP's `min_rnr_timer` is set to 0.01 ms after establishment instead of rdma_cm's 655 ms.
//!
//! The queue pair is created on the device context that rdma_cm resolved ([`CmId::verbs`]), with
//! the caller's PD, CQs and optional SRQ ([`CmId::create_qp`]).

use std::any::Any;
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem::{self, MaybeUninit};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys as ffi;
use rdma_sys::rdma_cm_event_type as et;

/// IB CM reject reason "invalid service id": nobody listens on that port.
const IB_CM_REJ_INVALID_SERVICE_ID: i32 = 8;

/// Errors of rdma_cm connection management. One variant per failing step; rdma_cm's failure
/// events map to [`CmError::AddrError`], [`CmError::RouteError`], [`CmError::Unreachable`],
/// [`CmError::Rejected`]/[`CmError::NoListener`], [`CmError::ConnectError`],
/// [`CmError::Disconnected`] and [`CmError::DeviceRemoval`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// `rdma_create_event_channel` failed (is `rdma_ucm` loaded? `/dev/infiniband/rdma_cm`?).
    #[error("rdma_create_event_channel failed (is the rdma_ucm module loaded?)")]
    CreateChannel(#[source] io::Error),
    /// `rdma_create_id` failed.
    #[error("rdma_create_id failed")]
    CreateId(#[source] io::Error),
    /// Host name resolution failed or gave no address.
    #[error("cannot resolve host {host:?}")]
    Resolve {
        /// The host string.
        host: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// `rdma_bind_addr` failed (address in use, or no RDMA device owns that IP).
    #[error("rdma_bind_addr({addr}) failed")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `rdma_listen` failed.
    #[error("rdma_listen on {addr} failed")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `rdma_resolve_addr` failed immediately.
    #[error("rdma_resolve_addr({addr}) failed")]
    ResolveAddr {
        /// Destination.
        addr: SocketAddr,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// ADDR_ERROR: the destination has no route through an RDMA device, or ARP/ND failed.
    #[error(
        "address resolution for {addr} failed (ADDR_ERROR, status {status}): no RDMA route to host"
    )]
    AddrError {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status (negative errno).
        status: i32,
    },
    /// `rdma_resolve_route` failed immediately.
    #[error("rdma_resolve_route failed")]
    ResolveRoute(#[source] io::Error),
    /// ROUTE_ERROR.
    #[error("route resolution to {addr} failed (ROUTE_ERROR, status {status})")]
    RouteError {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status.
        status: i32,
    },
    /// rdma_cm did not resolve a device context for the id.
    #[error("rdma_cm resolved no device for this connection")]
    NoDevice,
    /// `rdma_create_qp` failed.
    #[error("rdma_create_qp failed")]
    CreateQp(#[source] io::Error),
    /// `ibv_modify_qp` after establishment failed.
    #[error("ibv_modify_qp ({what}) failed")]
    ModifyQp {
        /// Which attribute.
        what: &'static str,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `rdma_connect` failed immediately.
    #[error("rdma_connect failed")]
    Connect(#[source] io::Error),
    /// `rdma_accept` failed.
    #[error("rdma_accept failed")]
    Accept(#[source] io::Error),
    /// `rdma_reject` failed.
    #[error("rdma_reject failed")]
    Reject(#[source] io::Error),
    /// `rdma_migrate_id` failed.
    #[error("rdma_migrate_id failed")]
    Migrate(#[source] io::Error),
    /// `rdma_disconnect` failed.
    #[error("rdma_disconnect failed")]
    Disconnect(#[source] io::Error),
    /// Nobody listens on the destination port (REJECTED with "invalid service id" or
    /// connection refused).
    #[error("no listener at {addr} (connection rejected, status {status})")]
    NoListener {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status.
        status: i32,
    },
    /// REJECTED by the peer.
    #[error(
        "connection to {addr} rejected by peer (status {status}{})",
        RejectReason::decode(private_data).map_or(String::new(), |r| format!(", {r:?}"))
    )]
    Rejected {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status (IB CM reject reason, or negative errno).
        status: i32,
        /// The peer's reject private data, if any (see [`RejectReason`]).
        private_data: Vec<u8>,
    },
    /// UNREACHABLE: the peer did not answer the connection request.
    #[error("peer {addr} unreachable (UNREACHABLE, status {status})")]
    Unreachable {
        /// Destination.
        addr: SocketAddr,
        /// rdma_cm status.
        status: i32,
    },
    /// CONNECT_ERROR.
    #[error("connection error (CONNECT_ERROR, status {status})")]
    ConnectError {
        /// rdma_cm status.
        status: i32,
    },
    /// DISCONNECTED while waiting for something else.
    #[error("connection disconnected")]
    Disconnected,
    /// DEVICE_REMOVAL: the RDMA device went away.
    #[error("RDMA device removed")]
    DeviceRemoval,
    /// An event that the current step did not expect.
    #[error("unexpected rdma_cm event {got} while waiting for {expected}")]
    UnexpectedEvent {
        /// What was awaited.
        expected: &'static str,
        /// What came.
        got: &'static str,
    },
    /// A step did not complete in time.
    #[error("timed out after {waited:?} waiting for {step}")]
    Timeout {
        /// What was awaited.
        step: &'static str,
        /// How long.
        waited: Duration,
    },
    /// `rdma_get_cm_event` or `poll` on the channel failed.
    #[error("reading rdma_cm events failed")]
    GetEvent(#[source] io::Error),
    /// Setting the channel fd's flags failed.
    #[error("fcntl on the event channel fd failed")]
    Fcntl(#[source] io::Error),
    /// The peer's private data is missing or invalid.
    #[error("invalid private data from peer: {0}")]
    PrivateData(#[from] PrivateDataError),
}

/// Typed rdma_cm event kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmEventKind {
    /// ADDR_RESOLVED.
    AddrResolved,
    /// ADDR_ERROR.
    AddrError,
    /// ROUTE_RESOLVED.
    RouteResolved,
    /// ROUTE_ERROR.
    RouteError,
    /// CONNECT_REQUEST (passive side; carries the new id).
    ConnectRequest,
    /// CONNECT_RESPONSE (only for ids without a QP; not used here).
    ConnectResponse,
    /// CONNECT_ERROR.
    ConnectError,
    /// UNREACHABLE.
    Unreachable,
    /// REJECTED.
    Rejected,
    /// ESTABLISHED.
    Established,
    /// DISCONNECTED.
    Disconnected,
    /// DEVICE_REMOVAL.
    DeviceRemoval,
    /// ADDR_CHANGE.
    AddrChange,
    /// TIMEWAIT_EXIT.
    TimewaitExit,
    /// Any other event (multicast, unknown).
    Other(u32),
}

impl CmEventKind {
    fn from_raw(e: u32) -> Self {
        match e {
            et::RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            et::RDMA_CM_EVENT_ADDR_ERROR => Self::AddrError,
            et::RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            et::RDMA_CM_EVENT_ROUTE_ERROR => Self::RouteError,
            et::RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            et::RDMA_CM_EVENT_CONNECT_RESPONSE => Self::ConnectResponse,
            et::RDMA_CM_EVENT_CONNECT_ERROR => Self::ConnectError,
            et::RDMA_CM_EVENT_UNREACHABLE => Self::Unreachable,
            et::RDMA_CM_EVENT_REJECTED => Self::Rejected,
            et::RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            et::RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            et::RDMA_CM_EVENT_DEVICE_REMOVAL => Self::DeviceRemoval,
            et::RDMA_CM_EVENT_ADDR_CHANGE => Self::AddrChange,
            et::RDMA_CM_EVENT_TIMEWAIT_EXIT => Self::TimewaitExit,
            other => Self::Other(other),
        }
    }

    /// rdma_cm's name for the event (e.g. `"RDMA_CM_EVENT_REJECTED"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            Self::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            Self::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            Self::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            Self::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            Self::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            Self::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            Self::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            Self::Rejected => "RDMA_CM_EVENT_REJECTED",
            Self::Established => "RDMA_CM_EVENT_ESTABLISHED",
            Self::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            Self::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            Self::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            Self::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
            Self::Other(_) => "RDMA_CM_EVENT_OTHER",
        }
    }
}

/// One rdma_cm event, copied out and acknowledged (so ids can be destroyed at any time).
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// Identity of the id the event is for ([`CmId::key`]); for a connect request, the
    /// listener's key.
    pub id: usize,
    /// rdma_cm status (0, a negative errno, or an IB CM reject reason).
    pub status: i32,
    /// The peer's private data (connect request, established, rejected), as delivered (on IB and
    /// RoCE it is zero-padded to the transport's size).
    pub private_data: Vec<u8>,
    /// For [`CmEventKind::ConnectRequest`]: the new connection's id (accept or reject it).
    pub new_id: Option<CmId>,
}

/// An rdma_cm event channel.
pub struct EventChannel {
    raw: NonNull<ffi::rdma_event_channel>,
}

// SAFETY: rdma_cm event channels may be used from any thread (librdmacm is thread safe).
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

impl EventChannel {
    /// Creates an event channel.
    ///
    /// # Errors
    /// [`CmError::CreateChannel`].
    pub fn new() -> Result<Arc<Self>, CmError> {
        // SAFETY: plain constructor.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        let raw =
            NonNull::new(raw).ok_or_else(|| CmError::CreateChannel(io::Error::last_os_error()))?;
        Ok(Arc::new(Self { raw }))
    }

    /// The channel's file descriptor (readable when an event is pending).
    pub fn fd(&self) -> RawFd {
        // SAFETY: valid channel.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// Makes [`EventChannel::try_event`] usable from a poll loop (`O_NONBLOCK` on the fd).
    ///
    /// # Errors
    /// [`CmError::Fcntl`].
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<(), CmError> {
        let fd = self.fd();
        // SAFETY: fcntl on a valid fd.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(CmError::Fcntl(io::Error::last_os_error()));
        }
        let flags = if nonblocking {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        // SAFETY: fcntl on a valid fd.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
            return Err(CmError::Fcntl(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Waits up to `timeout` for the next event (`None` = return at once if none is pending).
    ///
    /// # Errors
    /// [`CmError::GetEvent`].
    pub fn get_event(
        self: &Arc<Self>,
        timeout: Option<Duration>,
    ) -> Result<Option<CmEvent>, CmError> {
        let ms = timeout.map_or(0, |t| t.as_millis().min(i32::MAX as u128) as i32);
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                return Ok(None);
            }
            return Err(CmError::GetEvent(err));
        }
        if rc == 0 {
            return Ok(None);
        }
        self.try_event()
    }

    /// Reads one event if one is pending. On a blocking channel this blocks until one arrives;
    /// call [`EventChannel::set_nonblocking`] first in a poll loop.
    ///
    /// # Errors
    /// [`CmError::GetEvent`].
    pub fn try_event(self: &Arc<Self>) -> Result<Option<CmEvent>, CmError> {
        let mut ev: *mut ffi::rdma_cm_event = ptr::null_mut();
        // SAFETY: valid channel and out pointer.
        if unsafe { ffi::rdma_get_cm_event(self.raw.as_ptr(), &mut ev) } != 0 {
            let err = io::Error::last_os_error();
            if matches!(err.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
                return Ok(None);
            }
            return Err(CmError::GetEvent(err));
        }
        // SAFETY: rdma_get_cm_event returned a valid event, which we copy out and then ack
        // exactly once.
        let out = unsafe {
            let e = &*ev;
            let kind = CmEventKind::from_raw(e.event);
            let conn = &e.param.conn;
            let private_data = if matches!(
                kind,
                CmEventKind::ConnectRequest | CmEventKind::Established | CmEventKind::Rejected
            ) && !conn.private_data.is_null()
            {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len as usize,
                )
                .to_vec()
            } else {
                Vec::new()
            };
            let (id, new_id) = if kind == CmEventKind::ConnectRequest {
                (
                    e.listen_id as usize,
                    NonNull::new(e.id).map(|raw| CmId {
                        raw,
                        channel: Arc::clone(self),
                        qp_keep: None,
                    }),
                )
            } else {
                (e.id as usize, None)
            };
            let status = e.status;
            ffi::rdma_ack_cm_event(ev);
            CmEvent {
                kind,
                id,
                status,
                private_data,
                new_id,
            }
        };
        Ok(Some(out))
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id holds an Arc to its channel, so none is left; events were acked.
        unsafe { ffi::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

/// Retry and resource settings for connect/accept. The defaults are deliberate (see the module
/// docs): the protocol never relies on RNR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnOptions {
    /// Transport retries on packet loss (0..=7).
    pub retry_count: u8,
    /// RNR retries (0..=7; 7 = infinite). Default 0: an RNR is a protocol bug and must surface
    /// as an error completion, never as a stall.
    pub rnr_retry_count: u8,
    /// QP `min_rnr_timer` set after establishment (1 = 0.01 ms; 0 would mean 655 ms).
    pub min_rnr_timer: u8,
    /// Timeout given to `rdma_resolve_addr` / `rdma_resolve_route`, in ms.
    pub resolve_timeout_ms: i32,
}

impl Default for ConnOptions {
    fn default() -> Self {
        Self {
            retry_count: 7,
            rnr_retry_count: 0,
            min_rnr_timer: 1,
            resolve_timeout_ms: 2000,
        }
    }
}

/// Device, port and GID that rdma_cm chose for a connection (for the control thread's log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathInfo {
    /// Device name (e.g. `rxe0`).
    pub device: String,
    /// Port number.
    pub port: u8,
    /// Source GID index.
    pub gid_index: u8,
    /// GID type from sysfs (e.g. `RoCE v2`, `IB/RoCE v1`), or `unknown`.
    pub gid_type: String,
}

impl fmt::Display for PathInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "device {} port {} gid index {} ({})",
            self.device, self.port, self.gid_index, self.gid_type
        )
    }
}

/// An rdma_cm id (listener or connection), with the QP rdma_cm created for it, if any.
pub struct CmId {
    raw: NonNull<ffi::rdma_cm_id>,
    channel: Arc<EventChannel>,
    /// Keeps the PD/CQs/SRQ the QP was created with alive until the QP is destroyed.
    qp_keep: Option<Box<dyn Any + Send + Sync>>,
}

// SAFETY: librdmacm ids may be used from any thread; the QP is thread safe too.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("key", &self.key())
            .field("has_qp", &self.qp_keep.is_some())
            .finish()
    }
}

fn sockaddr_from(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in.
            unsafe { ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is large enough and suitably aligned for sockaddr_in6.
            unsafe { ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Reads a `sockaddr` that rdma_cm filled in.
///
/// # Safety
/// `sa` must point to a valid sockaddr of the family it states (`sockaddr_storage` sized).
unsafe fn sockaddr_to(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: caller guarantees validity.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*sa.cast::<libc::sockaddr_in>();
                Some(SocketAddr::from((
                    u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let sin6 = &*sa.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::from((
                    sin6.sin6_addr.s6_addr,
                    u16::from_be(sin6.sin6_port),
                )))
            }
            _ => None,
        }
    }
}

/// Resolves `host:port` (or a literal address) to a socket address, preferring IPv4.
///
/// # Errors
/// [`CmError::Resolve`].
pub fn resolve_host(host: &str, port: u16) -> Result<SocketAddr, CmError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|source| CmError::Resolve {
            host: host.to_owned(),
            source,
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| CmError::Resolve {
            host: host.to_owned(),
            source: io::Error::new(io::ErrorKind::NotFound, "no address"),
        })
}

fn errno_io() -> io::Error {
    io::Error::last_os_error()
}

impl CmId {
    /// Creates an RC (`RDMA_PS_TCP`) id on `channel`.
    ///
    /// # Errors
    /// [`CmError::CreateId`].
    pub fn new(channel: &Arc<EventChannel>) -> Result<Self, CmError> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid channel and out pointer.
        let rc = unsafe {
            ffi::rdma_create_id(
                channel.raw.as_ptr(),
                &mut raw,
                ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(CmError::CreateId(errno_io()));
        }
        let raw = NonNull::new(raw)
            .ok_or_else(|| CmError::CreateId(io::Error::from_raw_os_error(libc::EINVAL)))?;
        Ok(Self {
            raw,
            channel: Arc::clone(channel),
            qp_keep: None,
        })
    }

    /// A stable identity for matching events ([`CmEvent::id`]) to this id.
    pub fn key(&self) -> usize {
        self.raw.as_ptr() as usize
    }

    /// The event channel this id reports to.
    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    /// Binds to a local address (port 0 = any).
    ///
    /// # Errors
    /// [`CmError::Bind`].
    pub fn bind(&self, addr: SocketAddr) -> Result<(), CmError> {
        let (mut ss, _) = sockaddr_from(&addr);
        // SAFETY: valid id; `ss` holds a valid sockaddr.
        let rc = unsafe {
            ffi::rdma_bind_addr(
                self.raw.as_ptr(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
            )
        };
        if rc != 0 {
            return Err(CmError::Bind {
                addr,
                source: errno_io(),
            });
        }
        Ok(())
    }

    /// Starts listening (after [`CmId::bind`]).
    ///
    /// # Errors
    /// [`CmError::Listen`].
    pub fn listen(&self, backlog: i32) -> Result<(), CmError> {
        // SAFETY: valid id.
        if unsafe { ffi::rdma_listen(self.raw.as_ptr(), backlog) } != 0 {
            return Err(CmError::Listen {
                addr: self
                    .local_addr()
                    .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
                source: errno_io(),
            });
        }
        Ok(())
    }

    /// The local address (after bind/resolve).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: valid id; rdma_cm keeps the route's address storage initialised (zeroed
        // before bind, so the family is 0 and we return None).
        unsafe {
            let addr = &(*self.raw.as_ptr()).route.addr.src_addr_union.src_storage;
            sockaddr_to((addr as *const libc::sockaddr_storage).cast())
        }
    }

    /// The peer's address (after resolve / on a connect request).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in local_addr.
        unsafe {
            let addr = &(*self.raw.as_ptr()).route.addr.dst_addr_union.dst_storage;
            sockaddr_to((addr as *const libc::sockaddr_storage).cast())
        }
    }

    /// Starts address resolution; [`CmEventKind::AddrResolved`] or [`CmEventKind::AddrError`]
    /// follows within `timeout_ms`.
    ///
    /// # Errors
    /// [`CmError::ResolveAddr`].
    pub fn resolve_addr(&self, dst: SocketAddr, timeout_ms: i32) -> Result<(), CmError> {
        let (mut ss, _) = sockaddr_from(&dst);
        // SAFETY: valid id and sockaddr.
        let rc = unsafe {
            ffi::rdma_resolve_addr(
                self.raw.as_ptr(),
                ptr::null_mut(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                timeout_ms,
            )
        };
        if rc != 0 {
            return Err(CmError::ResolveAddr {
                addr: dst,
                source: errno_io(),
            });
        }
        Ok(())
    }

    /// Starts route resolution; [`CmEventKind::RouteResolved`] or [`CmEventKind::RouteError`]
    /// follows within `timeout_ms`.
    ///
    /// # Errors
    /// [`CmError::ResolveRoute`].
    pub fn resolve_route(&self, timeout_ms: i32) -> Result<(), CmError> {
        // SAFETY: valid id.
        if unsafe { ffi::rdma_resolve_route(self.raw.as_ptr(), timeout_ms) } != 0 {
            return Err(CmError::ResolveRoute(errno_io()));
        }
        Ok(())
    }

    /// The device context rdma_cm resolved for this id (null before address resolution, or for
    /// a listener bound to the wildcard address).
    pub fn verbs(&self) -> *mut ffi::ibv_context {
        // SAFETY: valid id.
        unsafe { (*self.raw.as_ptr()).verbs }
    }

    /// The QP rdma_cm created for this id (null before [`CmId::create_qp`]).
    pub fn qp(&self) -> *mut ffi::ibv_qp {
        // SAFETY: valid id.
        unsafe { (*self.raw.as_ptr()).qp }
    }

    /// Creates the connection's RC QP on the context rdma_cm resolved, using the caller's PD,
    /// CQs and optional SRQ (all in `attr`). rdma_cm moves it to INIT at once (so receives can be
    /// pre-posted before connecting, as iWARP requires) and to RTR/RTS during connect/accept.
    /// `keep` (e.g. `Arc`s of the PD, CQs, SRQ) is dropped only after the QP is destroyed.
    ///
    /// # Errors
    /// [`CmError::NoDevice`], [`CmError::CreateQp`].
    ///
    /// # Safety
    /// `pd` and the CQs/SRQ in `attr` must be valid objects on [`CmId::verbs`]'s context and
    /// stay alive as long as `keep` does.
    pub unsafe fn create_qp(
        &mut self,
        pd: *mut ffi::ibv_pd,
        attr: &mut ffi::ibv_qp_init_attr,
        keep: Box<dyn Any + Send + Sync>,
    ) -> Result<(), CmError> {
        if self.verbs().is_null() {
            return Err(CmError::NoDevice);
        }
        // SAFETY: valid id; caller guarantees pd/attr validity.
        if unsafe { ffi::rdma_create_qp(self.raw.as_ptr(), pd, attr) } != 0 {
            return Err(CmError::CreateQp(errno_io()));
        }
        self.qp_keep = Some(keep);
        Ok(())
    }

    fn conn_param(opts: &ConnOptions, private_data: &[u8], use_srq: bool) -> ffi::rdma_conn_param {
        ffi::rdma_conn_param {
            private_data: private_data.as_ptr().cast(),
            private_data_len: private_data.len().min(u8::MAX as usize) as u8,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: 1,
            retry_count: opts.retry_count.min(7),
            rnr_retry_count: opts.rnr_retry_count.min(7),
            srq: u8::from(use_srq),
            qp_num: 0,
        }
    }

    /// Sends the connection request (after [`CmId::create_qp`] and pre-posting receives).
    /// [`CmEventKind::Established`] or a failure event follows.
    ///
    /// On iWARP devices whose driver connects the TCP stream inside this call (soft-iWARP),
    /// a refused or unroutable connection fails here rather than through an event: a refused
    /// one gives [`CmError::NoListener`], an unreachable one [`CmError::Unreachable`].
    ///
    /// # Errors
    /// [`CmError::NoListener`] (`ECONNREFUSED`), [`CmError::Unreachable`] (`ETIMEDOUT`,
    /// `EHOSTUNREACH`, `ENETUNREACH`), [`CmError::Connect`] otherwise.
    pub fn connect(&self, opts: &ConnOptions, private_data: &[u8]) -> Result<(), CmError> {
        let mut p = Self::conn_param(opts, private_data, false);
        // SAFETY: valid id; private data outlives the call (copied by librdmacm).
        if unsafe { ffi::rdma_connect(self.raw.as_ptr(), &mut p) } != 0 {
            return Err(connect_errno_error(errno_io(), self.peer_addr()));
        }
        Ok(())
    }

    /// Accepts a connection request (after [`CmId::create_qp`] and pre-posting receives).
    /// [`CmEventKind::Established`] follows.
    ///
    /// # Errors
    /// [`CmError::Accept`].
    pub fn accept(&self, opts: &ConnOptions, private_data: &[u8]) -> Result<(), CmError> {
        let mut p = Self::conn_param(opts, private_data, false);
        // SAFETY: valid id; private data copied by librdmacm.
        if unsafe { ffi::rdma_accept(self.raw.as_ptr(), &mut p) } != 0 {
            return Err(CmError::Accept(errno_io()));
        }
        Ok(())
    }

    /// Rejects a connection request with optional private data (e.g. a [`RejectReason`]).
    ///
    /// # Errors
    /// [`CmError::Reject`].
    pub fn reject(&self, private_data: &[u8]) -> Result<(), CmError> {
        let len = private_data.len().min(u8::MAX as usize) as u8;
        // SAFETY: valid id; private data copied by librdmacm.
        if unsafe { ffi::rdma_reject(self.raw.as_ptr(), private_data.as_ptr().cast(), len) } != 0 {
            return Err(CmError::Reject(errno_io()));
        }
        Ok(())
    }

    /// Starts a disconnect; the QP moves to the error state (outstanding work requests flush)
    /// and both sides get [`CmEventKind::Disconnected`].
    ///
    /// # Errors
    /// [`CmError::Disconnect`].
    pub fn disconnect(&self) -> Result<(), CmError> {
        // SAFETY: valid id.
        if unsafe { ffi::rdma_disconnect(self.raw.as_ptr()) } != 0 {
            return Err(CmError::Disconnect(errno_io()));
        }
        Ok(())
    }

    /// Moves this id to another event channel (each accepted connection gets its own).
    ///
    /// # Errors
    /// [`CmError::Migrate`].
    pub fn migrate(&mut self, channel: &Arc<EventChannel>) -> Result<(), CmError> {
        // SAFETY: valid id and channel; no events of this id are unacked (we ack at once).
        if unsafe { ffi::rdma_migrate_id(self.raw.as_ptr(), channel.raw.as_ptr()) } != 0 {
            return Err(CmError::Migrate(errno_io()));
        }
        self.channel = Arc::clone(channel);
        Ok(())
    }

    /// Applies the post-establishment QP settings of `opts` (`min_rnr_timer`, RTS->RTS).
    ///
    /// # Errors
    /// [`CmError::ModifyQp`].
    pub fn tune_qp(&self, opts: &ConnOptions) -> Result<(), CmError> {
        let qp = self.qp();
        if qp.is_null() {
            return Ok(());
        }
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut attr: ffi::ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.min_rnr_timer = opts.min_rnr_timer;
        // SAFETY: valid QP in RTS; only min_rnr_timer is read.
        let rc = unsafe {
            ffi::ibv_modify_qp(
                qp,
                &mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0 as i32,
            )
        };
        if rc != 0 {
            return Err(CmError::ModifyQp {
                what: "min_rnr_timer",
                source: io::Error::from_raw_os_error(rc),
            });
        }
        Ok(())
    }

    /// The device, port and GID rdma_cm chose. The GID index is read with
    /// `rdma_init_qp_attr(RTR)`, which needs the peer's parameters: call it once the connection
    /// is established (or on an accepted id). Reads sysfs for the GID type: control thread only.
    pub fn path_info(&self) -> Option<PathInfo> {
        let ctx = self.verbs();
        if ctx.is_null() {
            return None;
        }
        // SAFETY: valid context with a valid device.
        let device = unsafe { CStr::from_ptr(ffi::ibv_get_device_name((*ctx).device)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: valid id.
        let port = unsafe { (*self.raw.as_ptr()).port_num };
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut attr: ffi::ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        let mut mask = 0;
        // SAFETY: valid id and out pointers; rdma_init_qp_attr only fills them.
        let rc = unsafe { ffi::rdma_init_qp_attr(self.raw.as_ptr(), &mut attr, &mut mask) };
        let gid_index = if rc == 0 {
            attr.ah_attr.grh.sgid_index
        } else {
            0
        };
        let gid_type = std::fs::read_to_string(format!(
            "/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types/{gid_index}"
        ))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
        Some(PathInfo {
            device,
            port,
            gid_index,
            gid_type,
        })
    }

    /// Waits on this id's channel (which must carry only this id's events) for `expected`,
    /// mapping failure events to typed errors.
    ///
    /// # Errors
    /// The typed error for a failure event, [`CmError::Timeout`] at `deadline`,
    /// [`CmError::UnexpectedEvent`] for anything else.
    pub fn wait_for(
        &self,
        expected: CmEventKind,
        deadline: Instant,
        peer: SocketAddr,
    ) -> Result<CmEvent, CmError> {
        let start = Instant::now();
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(CmError::Timeout {
                    step: expected.name(),
                    waited: now - start,
                });
            }
            let Some(ev) = self.channel.get_event(Some(deadline - now))? else {
                continue;
            };
            if ev.kind == expected {
                return Ok(ev);
            }
            return Err(event_error(&ev, peer).unwrap_or(CmError::UnexpectedEvent {
                expected: expected.name(),
                got: ev.kind.name(),
            }));
        }
    }
}

/// Maps a synchronous `rdma_connect` failure to its typed error: iWARP drivers that connect
/// the TCP stream inside `rdma_connect` (soft-iWARP) report a refused or unreachable peer
/// through errno instead of a REJECTED/UNREACHABLE event.
fn connect_errno_error(err: io::Error, peer: Option<SocketAddr>) -> CmError {
    match (err.raw_os_error(), peer) {
        (Some(libc::ECONNREFUSED), Some(addr)) => CmError::NoListener {
            addr,
            status: -libc::ECONNREFUSED,
        },
        (Some(e @ (libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH)), Some(addr)) => {
            CmError::Unreachable { addr, status: -e }
        }
        _ => CmError::Connect(err),
    }
}

/// Maps a failure event to its typed error (`None` for non-failure events).
pub fn event_error(ev: &CmEvent, peer: SocketAddr) -> Option<CmError> {
    let status = ev.status;
    Some(match ev.kind {
        CmEventKind::AddrError => CmError::AddrError { addr: peer, status },
        CmEventKind::RouteError => CmError::RouteError { addr: peer, status },
        CmEventKind::Unreachable => CmError::Unreachable { addr: peer, status },
        CmEventKind::ConnectError => CmError::ConnectError { status },
        CmEventKind::Disconnected => CmError::Disconnected,
        CmEventKind::DeviceRemoval => CmError::DeviceRemoval,
        CmEventKind::Rejected
            if status == IB_CM_REJ_INVALID_SERVICE_ID || status == -libc::ECONNREFUSED =>
        {
            CmError::NoListener { addr: peer, status }
        }
        CmEventKind::Rejected => CmError::Rejected {
            addr: peer,
            status,
            private_data: ev.private_data.clone(),
        },
        _ => return None,
    })
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: valid id; all its events were acked when read. The QP (if any) is destroyed
        // before the resources in `qp_keep` are released.
        unsafe {
            if !self.qp().is_null() {
                ffi::rdma_destroy_qp(self.raw.as_ptr());
            }
            self.qp_keep = None;
            ffi::rdma_destroy_id(self.raw.as_ptr());
        }
    }
}

/// Errors decoding a peer's [`FlowParams`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrivateDataError {
    /// Shorter than [`FlowParams::LEN`].
    #[error("private data too short: {len} bytes, need {need}")]
    TooShort {
        /// Received length.
        len: usize,
        /// Needed length.
        need: usize,
    },
    /// Wrong magic: not a spinwire peer.
    #[error("bad magic {0:#010x}: peer is not spinwire")]
    BadMagic(u32),
    /// Unsupported protocol version.
    #[error("unsupported protocol version {0}")]
    Version(u16),
    /// A field is out of range.
    #[error("{field} = {value} out of range {min}..={max}")]
    OutOfRange {
        /// Field name.
        field: &'static str,
        /// Received value.
        value: u32,
        /// Minimum.
        min: u32,
        /// Maximum.
        max: u32,
    },
}

/// Flow-control parameters exchanged in the connect/accept private data: "you may send me up to
/// `credits` messages of up to `buffer_size` bytes; I send inline up to `inline_size`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowParams {
    /// Initial credits = receive buffers the sender of these params has posted for the peer.
    pub credits: u32,
    /// Receive buffer size in bytes (largest message the peer may send).
    pub buffer_size: u32,
    /// The sender's QP inline size (informational).
    pub inline_size: u32,
}

impl FlowParams {
    /// Encoded length in bytes (fits the 56-byte RC connect private data).
    pub const LEN: usize = 20;
    const MAGIC: u32 = u32::from_le_bytes(*b"SPWR");
    const VERSION: u16 = 1;
    /// Largest credit count (credits travel in 16-bit immediate-data fields).
    pub const MAX_CREDITS: u32 = 1 << 15;
    /// Largest buffer size accepted (1 GiB).
    pub const MAX_BUFFER: u32 = 1 << 30;

    /// Encodes into the wire form (little endian).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&Self::MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&Self::VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.credits.to_le_bytes());
        b[12..16].copy_from_slice(&self.buffer_size.to_le_bytes());
        b[16..20].copy_from_slice(&self.inline_size.to_le_bytes());
        b
    }

    /// Decodes and validates a peer's private data (trailing padding is ignored).
    ///
    /// # Errors
    /// [`PrivateDataError`] for short, foreign, unsupported or out-of-range data.
    pub fn decode(b: &[u8]) -> Result<Self, PrivateDataError> {
        if b.len() < Self::LEN {
            return Err(PrivateDataError::TooShort {
                len: b.len(),
                need: Self::LEN,
            });
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = u32_at(0);
        if magic != Self::MAGIC {
            return Err(PrivateDataError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != Self::VERSION {
            return Err(PrivateDataError::Version(version));
        }
        let p = Self {
            credits: u32_at(8),
            buffer_size: u32_at(12),
            inline_size: u32_at(16),
        };
        let check = |field, value, min, max| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(PrivateDataError::OutOfRange {
                    field,
                    value,
                    min,
                    max,
                })
            }
        };
        check("credits", p.credits, 1, Self::MAX_CREDITS)?;
        check("buffer_size", p.buffer_size, 1, Self::MAX_BUFFER)?;
        check("inline_size", p.inline_size, 0, Self::MAX_BUFFER)?;
        Ok(p)
    }
}

/// Why the passive side rejected a connection (sent as reject private data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectReason {
    /// The request's private data was invalid.
    BadParams,
    /// The server is out of resources (pool, QP, connection limit).
    NoResources,
    /// The server is shutting down.
    ShuttingDown,
}

impl RejectReason {
    /// Encodes as 8 bytes: magic + reason code.
    pub fn encode(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..4].copy_from_slice(&FlowParams::MAGIC.to_le_bytes());
        b[4] = match self {
            Self::BadParams => 1,
            Self::NoResources => 2,
            Self::ShuttingDown => 3,
        };
        b
    }

    /// Decodes a peer's reject private data.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < 8 || b[0..4] != FlowParams::MAGIC.to_le_bytes() {
            return None;
        }
        match b[4] {
            1 => Some(Self::BadParams),
            2 => Some(Self::NoResources),
            3 => Some(Self::ShuttingDown),
            _ => None,
        }
    }
}

/// A bound, listening id with its own event channel.
#[derive(Debug)]
pub struct RdmaListener {
    id: CmId,
}

impl RdmaListener {
    /// Binds to `addr` and listens.
    ///
    /// # Errors
    /// [`CmError::CreateChannel`], [`CmError::CreateId`], [`CmError::Bind`], [`CmError::Listen`].
    pub fn bind(addr: SocketAddr, backlog: i32) -> Result<Self, CmError> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        id.bind(addr)?;
        id.listen(backlog)?;
        Ok(Self { id })
    }

    /// The bound address (with the actual port if 0 was asked for).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        let mut a = self.id.local_addr()?;
        // SAFETY: valid listening id.
        let port = u16::from_be(unsafe { ffi::rdma_get_src_port(self.id.raw.as_ptr()) });
        a.set_port(port);
        Some(a)
    }

    /// The listening id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// Waits up to `timeout` (`None`: just check) for the next connection request. The
    /// returned id is already migrated to its own event channel.
    ///
    /// # Errors
    /// [`CmError::GetEvent`], [`CmError::Migrate`], [`CmError::DeviceRemoval`].
    pub fn get_request(
        &self,
        timeout: Option<Duration>,
    ) -> Result<Option<ConnectRequest>, CmError> {
        let Some(ev) = self.id.channel.get_event(timeout)? else {
            return Ok(None);
        };
        match ev.kind {
            CmEventKind::ConnectRequest => {
                let Some(mut id) = ev.new_id else {
                    return Err(CmError::ConnectError { status: ev.status });
                };
                id.migrate(&EventChannel::new()?)?;
                Ok(Some(ConnectRequest {
                    id,
                    private_data: ev.private_data,
                }))
            }
            CmEventKind::DeviceRemoval => Err(CmError::DeviceRemoval),
            _ => Ok(None),
        }
    }
}

/// An incoming connection request: create the QP on [`CmId::verbs`], pre-post receives, then
/// [`CmId::accept`], or [`CmId::reject`].
#[derive(Debug)]
pub struct ConnectRequest {
    /// The new connection's id (on its own event channel).
    pub id: CmId,
    /// The peer's private data (validate with [`FlowParams::decode`]).
    pub private_data: Vec<u8>,
}

/// Starts an active connection: creates an id on a fresh channel, resolves address and route
/// (each bounded by `opts.resolve_timeout_ms` and `deadline`). The caller then creates the QP,
/// pre-posts receives and calls [`CmId::connect`] + [`CmId::wait_for`] `Established`.
///
/// # Errors
/// [`CmError::ResolveAddr`], [`CmError::AddrError`], [`CmError::ResolveRoute`],
/// [`CmError::RouteError`], [`CmError::Timeout`], and channel/id creation errors.
pub fn resolve(dst: SocketAddr, opts: &ConnOptions, deadline: Instant) -> Result<CmId, CmError> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel)?;
    id.resolve_addr(dst, opts.resolve_timeout_ms)?;
    id.wait_for(CmEventKind::AddrResolved, deadline, dst)?;
    id.resolve_route(opts.resolve_timeout_ms)?;
    id.wait_for(CmEventKind::RouteResolved, deadline, dst)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_params_roundtrip_and_validation() {
        let p = FlowParams {
            credits: 128,
            buffer_size: 4096,
            inline_size: 220,
        };
        let mut wire = p.encode().to_vec();
        wire.resize(56, 0); // IB pads private data
        assert_eq!(FlowParams::decode(&wire), Ok(p));
        assert!(matches!(
            FlowParams::decode(&wire[..10]),
            Err(PrivateDataError::TooShort { .. })
        ));
        let mut bad = wire.clone();
        bad[0] ^= 1;
        assert!(matches!(
            FlowParams::decode(&bad),
            Err(PrivateDataError::BadMagic(_))
        ));
        let zero = FlowParams { credits: 0, ..p }.encode();
        assert!(matches!(
            FlowParams::decode(&zero),
            Err(PrivateDataError::OutOfRange {
                field: "credits",
                ..
            })
        ));
        let mut v = p.encode();
        v[4] = 9;
        assert_eq!(FlowParams::decode(&v), Err(PrivateDataError::Version(9)));
    }

    #[test]
    fn reject_reason_roundtrip() {
        for r in [
            RejectReason::BadParams,
            RejectReason::NoResources,
            RejectReason::ShuttingDown,
        ] {
            assert_eq!(RejectReason::decode(&r.encode()), Some(r));
        }
        assert_eq!(RejectReason::decode(&[0; 8]), None);
    }

    #[test]
    fn failure_events_map_to_typed_errors() {
        let peer: SocketAddr = "10.0.2.15:7471".parse().unwrap();
        let ev = |kind, status, private_data: &[u8]| CmEvent {
            kind,
            id: 0,
            status,
            private_data: private_data.to_vec(),
            new_id: None,
        };
        let e = event_error(&ev(CmEventKind::Rejected, 8, &[]), peer).unwrap();
        assert!(matches!(e, CmError::NoListener { .. }), "{e:?}");
        assert!(e.to_string().contains("no listener"));
        let e = event_error(&ev(CmEventKind::Rejected, -libc::ECONNREFUSED, &[]), peer).unwrap();
        assert!(matches!(e, CmError::NoListener { .. }), "{e:?}");
        let reason = RejectReason::NoResources.encode();
        let e = event_error(&ev(CmEventKind::Rejected, 28, &reason), peer).unwrap();
        assert!(matches!(e, CmError::Rejected { .. }), "{e:?}");
        assert!(e.to_string().contains("NoResources"), "{e}");
        let cases = [
            (CmEventKind::AddrError, "ADDR_ERROR"),
            (CmEventKind::RouteError, "ROUTE_ERROR"),
            (CmEventKind::Unreachable, "UNREACHABLE"),
            (CmEventKind::ConnectError, "CONNECT_ERROR"),
        ];
        for (kind, text) in cases {
            let e = event_error(&ev(kind, -110, &[]), peer).unwrap();
            assert!(e.to_string().contains(text), "{e}");
        }
        assert!(matches!(
            event_error(&ev(CmEventKind::Disconnected, 0, &[]), peer),
            Some(CmError::Disconnected)
        ));
        assert!(matches!(
            event_error(&ev(CmEventKind::DeviceRemoval, 0, &[]), peer),
            Some(CmError::DeviceRemoval)
        ));
        assert!(event_error(&ev(CmEventKind::Established, 0, &[]), peer).is_none());
    }

    #[test]
    fn synchronous_connect_failures_map_to_typed_errors() {
        let peer: SocketAddr = "10.0.2.15:7471".parse().unwrap();
        let errno = io::Error::from_raw_os_error;
        let e = connect_errno_error(errno(libc::ECONNREFUSED), Some(peer));
        assert!(matches!(e, CmError::NoListener { .. }), "{e:?}");
        assert!(e.to_string().contains("no listener"), "{e}");
        for code in [libc::ETIMEDOUT, libc::EHOSTUNREACH, libc::ENETUNREACH] {
            let e = connect_errno_error(errno(code), Some(peer));
            assert!(
                matches!(e, CmError::Unreachable { status, .. } if status == -code),
                "{e:?}"
            );
        }
        let e = connect_errno_error(errno(libc::EINVAL), Some(peer));
        assert!(matches!(e, CmError::Connect(_)), "{e:?}");
        let e = connect_errno_error(errno(libc::ECONNREFUSED), None);
        assert!(matches!(e, CmError::Connect(_)), "{e:?}");
    }

    #[test]
    fn sockaddr_roundtrip() {
        for a in ["10.0.2.15:7471", "[::1]:9"] {
            let a: SocketAddr = a.parse().unwrap();
            let (ss, _) = sockaddr_from(&a);
            // SAFETY: ss holds a valid sockaddr of its family.
            let back = unsafe { sockaddr_to((&ss as *const libc::sockaddr_storage).cast()) };
            assert_eq!(back, Some(a));
        }
    }
}
