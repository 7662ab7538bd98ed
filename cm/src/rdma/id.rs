//! [`CmId`] (one rdma_cm id: a listener or one connection), the [`CmEvent`]s read from its
//! channel, and the mapping of failure events to [`CmError`]s.

use std::any::Any;
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv6Addr, SocketAddr};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys as ffi;

use super::addr::{sockaddr_from, sockaddr_to};
use super::channel::{CmEventKind, EventChannel};
use super::device::DeviceContext;
use super::error::{connect_errno_error, CmError};

/// IB CM reject reason "invalid service id": nobody listens on that port.
const IB_CM_REJ_INVALID_SERVICE_ID: i32 = 8;

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

impl EventChannel {
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
        if unsafe { ffi::rdma_get_cm_event(self.raw(), &mut ev) } != 0 {
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
    /// RDMA READs this side accepts outstanding from the peer (`responder_resources`).
    /// Default 0 (no READs). [`ConnOptions::RD_ATOMIC_MAX`] lets librdmacm pick the most
    /// allowed: the device's `max_qp_rd_atom` on connect, and on accept at most what the
    /// request's initiator asked for.
    pub responder_resources: u8,
    /// RDMA READs this side may have outstanding as the initiator (`initiator_depth`).
    /// Default 0 (no READs). [`ConnOptions::RD_ATOMIC_MAX`]: the device's
    /// `max_qp_init_rd_atom` on connect, and on accept at most the request's responder
    /// resources.
    pub initiator_depth: u8,
}

impl ConnOptions {
    /// librdmacm's `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "as many as the device (and,
    /// on accept, the peer's request) allows".
    pub const RD_ATOMIC_MAX: u8 = 0xFF;
}

impl Default for ConnOptions {
    fn default() -> Self {
        Self {
            retry_count: 7,
            rnr_retry_count: 0,
            min_rnr_timer: 1,
            resolve_timeout_ms: 2000,
            responder_resources: 0,
            initiator_depth: 0,
        }
    }
}

/// Device, port and GID that rdma_cm chose for a connection (for the control thread's log).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathInfo {
    /// Device name (e.g. `rxe0`).
    pub device: String,
    /// Port number.
    pub port: u8,
    /// Source GID index.
    pub gid_index: u8,
    /// GID type from sysfs (e.g. `RoCE v2`, `IB/RoCE v1`), or `unknown`.
    pub gid_type: String,
    /// The source GID of the route (on RoCE the IP address, IPv4 as `::ffff:a.b.c.d`).
    pub gid: Ipv6Addr,
}

impl fmt::Display for PathInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "device {} port {} gid index {} ({}) gid {}",
            self.device, self.port, self.gid_index, self.gid_type, self.gid
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
                channel.raw(),
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
        self.resolve_addr_from(None, dst, timeout_ms)
    }

    /// [`CmId::resolve_addr`] from the local address `src` (port 0: any), if given. rdma_cm
    /// binds the id to `src` and so takes the device, port and source GID that own it (on RoCE
    /// the GID is the IP address); `src` and `dst` must be of the same family.
    ///
    /// # Errors
    /// [`CmError::ResolveAddr`].
    pub fn resolve_addr_from(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> Result<(), CmError> {
        let (mut ss, _) = sockaddr_from(&dst);
        let mut src_ss = src.map(|a| sockaddr_from(&a).0);
        let src_ptr = src_ss.as_mut().map_or(ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        // SAFETY: valid id; `ss` and (if not null) `src_ss` hold valid sockaddrs that outlive
        // the call (rdma_cm copies them).
        let rc = unsafe {
            ffi::rdma_resolve_addr(
                self.raw.as_ptr(),
                src_ptr,
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

    /// The port rdma_cm resolved for this id (0 before address resolution).
    pub fn port_num(&self) -> u8 {
        // SAFETY: valid id.
        unsafe { (*self.raw.as_ptr()).port_num }
    }

    /// The route's source GID (all zero before address resolution). On RoCE it is the source
    /// IP address (IPv4 as `::ffff:a.b.c.d`).
    pub fn source_gid(&self) -> Ipv6Addr {
        // SAFETY: valid id; the route's address union is plain data that rdma_cm keeps
        // initialised (zeroed before resolution); `ibaddr.sgid.raw` is 16 bytes of any value.
        let raw = unsafe { (*self.raw.as_ptr()).route.addr.addr.ibaddr.sgid.raw };
        Ipv6Addr::from(raw)
    }

    /// Whether rdma_cm has resolved a device for this id (after address resolution, or on a
    /// connect request; never for a listener bound to the wildcard address).
    pub fn has_device(&self) -> bool {
        !self.verbs().is_null()
    }

    /// The device context rdma_cm resolved for this id, with a reference on librdmacm's device
    /// list that keeps it open ([`DeviceContext`]). Create the connection's PD, CQs and SRQ on
    /// it, then its QP with [`CmId::create_qp`].
    ///
    /// Returns `None` if no device is resolved ([`CmId::has_device`]) or librdmacm does not
    /// list it.
    pub fn device_context(&self) -> Option<DeviceContext> {
        DeviceContext::of(self.verbs())
    }

    /// The raw device context (null if none); stays inside this crate.
    fn verbs(&self) -> *mut ffi::ibv_context {
        // SAFETY: valid id.
        unsafe { (*self.raw.as_ptr()).verbs }
    }

    /// The raw id, for the rdma_cm calls of this module's siblings.
    pub(super) fn raw(&self) -> *mut ffi::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// The QP rdma_cm created for this id (null before [`CmId::create_qp`]).
    fn qp(&self) -> *mut ffi::ibv_qp {
        // SAFETY: valid id.
        unsafe { (*self.raw.as_ptr()).qp }
    }

    /// Whether [`CmId::create_qp`] created this id's QP.
    pub fn has_qp(&self) -> bool {
        !self.qp().is_null()
    }

    /// The QP rdma_cm created for this id with [`CmId::create_qp`] (null before that), for the
    /// verbs layer that posts on it.
    ///
    /// # Safety
    /// The pointer is valid only while this `CmId` lives: the id destroys the QP
    /// (`rdma_destroy_qp`) when dropped. The caller must keep the id alive for as long as it
    /// uses the pointer (hold an `Arc<CmId>` next to it, as the owner of the wrapping queue
    /// pair), and must not destroy the QP itself.
    pub unsafe fn qp_ptr(&self) -> *mut ffi::ibv_qp {
        self.qp()
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
    /// `pd` and the CQs/SRQ in `attr` must be valid objects on this id's device context
    /// ([`CmId::device_context`]) and stay alive as long as `keep` does.
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
            responder_resources: opts.responder_resources,
            initiator_depth: opts.initiator_depth,
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

    /// Rejects a connection request with optional private data (e.g. a [`CmRejectReason`](super::CmRejectReason)).
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
        if unsafe { ffi::rdma_migrate_id(self.raw.as_ptr(), channel.raw()) } != 0 {
            return Err(CmError::Migrate(errno_io()));
        }
        self.channel = Arc::clone(channel);
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
        // SAFETY: rdma_cm's context of this id, with a valid device whose `name` is a
        // NUL-terminated array (read directly: libibverbs calls stay in the verbs layer).
        let device = unsafe { CStr::from_ptr((*(*ctx).device).name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let port = self.port_num();
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
            gid: self.source_gid(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::CmRejectReason;

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
        let reason = CmRejectReason::NoResources.encode();
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
}
