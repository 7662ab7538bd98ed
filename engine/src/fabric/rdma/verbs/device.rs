//! The device context ([`Context`], [`DeviceLimits`]) and the protection domain
//! ([`ProtectionDomain`]).

use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use cm::rdma::DeviceContext;
use rdma_sys as ffi;

use super::error::{last_os_error, VerbsError};

/// How the context's lifetime is managed.
enum ContextOwner {
    /// Opened by us with `ibv_open_device`; closed on drop.
    Opened,
    /// librdmacm's context for a connection; the [`DeviceContext`] holds librdmacm's reference
    /// and releases it on drop.
    RdmaCm(DeviceContext),
}

/// An open RDMA device (`struct ibv_context`).
pub struct Context {
    raw: NonNull<ffi::ibv_context>,
    owner: ContextOwner,
}

// SAFETY: libibverbs contexts may be used from any thread; all mutation goes through the
// provider, which locks internally.
unsafe impl Send for Context {}
// SAFETY: as above, verbs calls on a context are thread safe.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.name())
            .finish()
    }
}

impl Context {
    /// Opens the device called `name`, or the first device if `name` is `None`.
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`], [`VerbsError::DeviceNotFound`], [`VerbsError::OpenDevice`].
    pub fn open(name: Option<&str>) -> Result<Arc<Self>, VerbsError> {
        let mut n = 0;
        // SAFETY: `n` is a valid out pointer; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: list came from ibv_get_device_list.
                unsafe { ffi::ibv_free_device_list(list) };
            }
            return Err(VerbsError::NoDevice);
        }
        let mut found = None;
        for i in 0..n as usize {
            // SAFETY: the list has `n` valid entries.
            let dev = unsafe { *list.add(i) };
            // SAFETY: `dev` is a valid device; the name is NUL terminated.
            let dev_name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if name.map_or(true, |want| want == dev_name) {
                found = Some((dev, dev_name));
                break;
            }
        }
        let result = match found {
            None => Err(VerbsError::DeviceNotFound {
                name: name.unwrap_or_default().to_owned(),
            }),
            Some((dev, dev_name)) => {
                // SAFETY: `dev` is valid while the list is alive.
                let ctx = unsafe { ffi::ibv_open_device(dev) };
                match NonNull::new(ctx) {
                    Some(raw) => Ok(Arc::new(Self {
                        raw,
                        owner: ContextOwner::Opened,
                    })),
                    None => Err(VerbsError::OpenDevice {
                        name: dev_name,
                        source: last_os_error(),
                    }),
                }
            }
        };
        // SAFETY: list came from ibv_get_device_list; opened contexts stay valid after this.
        unsafe { ffi::ibv_free_device_list(list) };
        result
    }

    /// Wraps the context that librdmacm resolved for a connection
    /// ([`CmId::device_context`](cm::rdma::CmId::device_context)), so the PD, CQs and MRs are
    /// created on the very device rdma_cm picked.
    pub fn from_cm(dev: DeviceContext) -> Arc<Self> {
        // SAFETY: `dev` is kept in `owner` for as long as this context lives, and every object
        // created on it holds an `Arc` of this context; the context is never closed here.
        let raw = unsafe { dev.as_ptr() };
        Arc::new(Self {
            raw,
            owner: ContextOwner::RdmaCm(dev),
        })
    }

    /// Whether this is librdmacm's context `dev` (the device of a connection's id).
    pub fn is_cm_device(&self, dev: &DeviceContext) -> bool {
        matches!(&self.owner, ContextOwner::RdmaCm(d) if d == dev)
    }

    /// The raw context pointer (for the verbs calls of this module).
    pub fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.raw.as_ptr()
    }

    /// The device name (e.g. `rxe0`).
    pub fn name(&self) -> String {
        // SAFETY: the context and its device are valid while `self` lives.
        unsafe {
            let dev = (*self.raw.as_ptr()).device;
            CStr::from_ptr(ffi::ibv_get_device_name(dev))
                .to_string_lossy()
                .into_owned()
        }
    }

    /// Whether the device is iWARP (e.g. soft-iWARP `siw`), which has no immediate data.
    pub fn is_iwarp(&self) -> bool {
        // SAFETY: the context and its device are valid while `self` lives.
        let t = unsafe { (*(*self.raw.as_ptr()).device).transport_type };
        t == ffi::ibv_transport_type::IBV_TRANSPORT_IWARP
    }

    /// Queries a port's attributes.
    ///
    /// # Errors
    /// [`VerbsError::QueryPort`].
    pub fn query_port(&self, port: u8) -> Result<ffi::ibv_port_attr, VerbsError> {
        let mut attr = MaybeUninit::<ffi::ibv_port_attr>::zeroed();
        // SAFETY: valid context; `attr` is a valid ibv_port_attr out pointer (the compat type
        // is the same struct in rdma-core 44).
        let rc = unsafe { ffi::ibv_query_port(self.as_ptr(), port, attr.as_mut_ptr().cast()) };
        if rc != 0 {
            return Err(VerbsError::QueryPort {
                port,
                source: io::Error::from_raw_os_error(rc),
            });
        }
        // SAFETY: initialised by ibv_query_port (and zeroed before).
        Ok(unsafe { attr.assume_init() })
    }
}

/// `IBV_LINK_LAYER_ETHERNET` of `enum ibv_link_layer` (bindgen does not export it): the port
/// runs RoCE (or iWARP), so its GIDs are derived from IP addresses.
const LINK_LAYER_ETHERNET: u8 = 2;

/// What a GID-table query needs of a port ([`Context::query_port_gids`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortGids {
    /// Entries in the port's GID table (`gid_tbl_len`).
    pub table_len: u32,
    /// The port's link layer is Ethernet (RoCE, iWARP): its GIDs are IP-based. False on
    /// InfiniBand, where a GID is a subnet prefix and a port GUID.
    pub ethernet: bool,
}

impl Context {
    /// Opens every RDMA device (skipping any that fails to open).
    ///
    /// # Errors
    /// [`VerbsError::NoDevice`].
    pub fn open_all() -> Result<Vec<Arc<Self>>, VerbsError> {
        let mut n = 0;
        // SAFETY: `n` is a valid out pointer; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(VerbsError::NoDevice);
        }
        let mut out = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: the list has `n` valid entries; `dev` is valid while the list is alive.
            let ctx = unsafe { ffi::ibv_open_device(*list.add(i)) };
            if let Some(raw) = NonNull::new(ctx) {
                out.push(Arc::new(Self {
                    raw,
                    owner: ContextOwner::Opened,
                }));
            }
        }
        // SAFETY: list came from ibv_get_device_list; opened contexts stay valid after this.
        unsafe { ffi::ibv_free_device_list(list) };
        if out.is_empty() {
            return Err(VerbsError::NoDevice);
        }
        Ok(out)
    }

    /// The device's number of physical ports (numbered from 1).
    ///
    /// # Errors
    /// [`VerbsError::QueryDevice`].
    pub fn port_count(&self) -> Result<u8, VerbsError> {
        let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
        // SAFETY: valid context and out pointer.
        let rc = unsafe { ffi::ibv_query_device(self.as_ptr(), attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(VerbsError::QueryDevice(io::Error::from_raw_os_error(rc)));
        }
        // SAFETY: zeroed, then filled by ibv_query_device.
        Ok(unsafe { attr.assume_init() }.phys_port_cnt)
    }

    /// The size of `port`'s GID table and whether its GIDs are IP-based.
    ///
    /// # Errors
    /// [`VerbsError::QueryPort`].
    pub fn query_port_gids(&self, port: u8) -> Result<PortGids, VerbsError> {
        let attr = self.query_port(port)?;
        Ok(PortGids {
            table_len: u32::try_from(attr.gid_tbl_len).unwrap_or(0),
            ethernet: attr.link_layer == LINK_LAYER_ETHERNET,
        })
    }

    /// Reads entry `index` of `port`'s GID table (`ibv_query_gid`). An empty entry reads as
    /// all zeros (libibverbs' documented behaviour).
    ///
    /// # Errors
    /// [`VerbsError::QueryGid`] (e.g. `EINVAL` for an index beyond the table).
    pub fn query_gid(&self, port: u8, index: u8) -> Result<[u8; 16], VerbsError> {
        let mut gid = ffi::ibv_gid { raw: [0; 16] };
        // SAFETY: valid context; `gid` is a valid out pointer.
        let rc = unsafe { ffi::ibv_query_gid(self.as_ptr(), port, i32::from(index), &mut gid) };
        if rc != 0 {
            // libibverbs returns -1; errno normally says why (EINVAL beyond the table).
            let e = last_os_error();
            let source = match e.raw_os_error() {
                Some(0) | None => io::Error::from_raw_os_error(libc::EINVAL),
                _ => e,
            };
            return Err(VerbsError::QueryGid {
                port,
                index,
                source,
            });
        }
        // SAFETY: every bit pattern is a valid `[u8; 16]`; the union was initialised above.
        Ok(unsafe { gid.raw })
    }
}

/// Device limits that sizing depends on (from `ibv_query_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Largest work queue (send or receive) of a QP.
    pub max_qp_wr: u32,
    /// Largest completion queue.
    pub max_cqe: u32,
    /// Largest shared receive queue (0: SRQ unsupported).
    pub max_srq_wr: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Most RDMA READs a QP may have outstanding as the target (responder resources).
    pub max_qp_rd_atom: u32,
    /// Most RDMA READs a QP may have outstanding as the initiator (initiator depth).
    pub max_qp_init_rd_atom: u32,
}

impl Context {
    /// Queries the device's limits.
    ///
    /// # Errors
    /// [`VerbsError::QueryDevice`].
    pub fn query_device(&self) -> Result<DeviceLimits, VerbsError> {
        let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
        // SAFETY: valid context and out pointer.
        let rc = unsafe { ffi::ibv_query_device(self.as_ptr(), attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(VerbsError::QueryDevice(io::Error::from_raw_os_error(rc)));
        }
        // SAFETY: zeroed, then filled by ibv_query_device.
        let a = unsafe { attr.assume_init() };
        let nonneg = |v: i32| u32::try_from(v).unwrap_or(0);
        Ok(DeviceLimits {
            max_qp_wr: nonneg(a.max_qp_wr),
            max_cqe: nonneg(a.max_cqe),
            max_srq_wr: nonneg(a.max_srq_wr),
            max_mr_size: a.max_mr_size,
            max_qp_rd_atom: nonneg(a.max_qp_rd_atom),
            max_qp_init_rd_atom: nonneg(a.max_qp_init_rd_atom),
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        match self.owner {
            // SAFETY: opened by ibv_open_device; every child holds an Arc to us, so none is
            // left.
            ContextOwner::Opened => unsafe {
                ffi::ibv_close_device(self.raw.as_ptr());
            },
            // The DeviceContext releases librdmacm's reference when dropped.
            ContextOwner::RdmaCm(_) => {}
        }
    }
}

/// A protection domain.
pub struct ProtectionDomain {
    raw: NonNull<ffi::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread safe.
unsafe impl Send for ProtectionDomain {}
// SAFETY: verbs objects are thread safe.
unsafe impl Sync for ProtectionDomain {}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain").finish_non_exhaustive()
    }
}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    ///
    /// # Errors
    /// [`VerbsError::AllocPd`].
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: valid context.
        let raw = unsafe { ffi::ibv_alloc_pd(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::AllocPd(last_os_error()))?;
        Ok(Arc::new(Self {
            raw,
            ctx: Arc::clone(ctx),
        }))
    }

    /// The context this PD belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw PD pointer (for `rdma_create_qp`).
    pub fn as_ptr(&self) -> *mut ffi::ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; children hold Arcs, so none is left.
        unsafe { ffi::ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}
