//! Thin safe layer over libibverbs (through `rdma-sys`): device context, protection domain,
//! completion queue, queue pair, shared receive queue and memory region.
//!
//! This is the only module of the engine that calls verbs FFI (besides the data path in
//! [`super::datapath`], which posts the work requests built here). Modelled on rust-ibverbs and
//! sideway:
//!
//! - Long-lived objects hold an [`Arc`] to their parents (`MemoryRegion -> ProtectionDomain ->
//!   Context`, `CompletionQueue -> Context`, `QueuePair -> {ProtectionDomain, CompletionQueue,
//!   SharedReceiveQueue}`), so a parent is never destroyed before its children, whatever order
//!   the owner drops them in.
//! - Posting is an `unsafe fn`: the caller promises that every buffer named by a work request
//!   stays valid (and, for receives, unaliased) until the work request's completion has been
//!   polled, or the queue pair has been destroyed.
//! - [`CompletionQueue::poll`] fills a caller-provided array (normally on the poller's stack) in
//!   one `ibv_poll_cq` call; it never allocates.
//!
//! libibverbs objects are thread safe (the providers lock internally), so the wrappers are
//! `Send + Sync`; the engine still keeps each queue pair and completion queue on one poller.

use std::any::Any;
use std::ffi::CStr;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use cm::rdma::{CmError, CmId, DeviceContext};
use rdma_sys as ffi;

pub use ffi::{ibv_recv_wr as RecvWr, ibv_send_wr as SendWr, ibv_sge as Sge};

/// Errors from setting up verbs objects (control path only).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// `ibv_get_device_list` failed or returned no device.
    #[error("no RDMA device found (is a driver such as rdma_rxe loaded?)")]
    NoDevice,
    /// No device with the requested name.
    #[error("RDMA device {name:?} not found")]
    DeviceNotFound {
        /// The name that was asked for.
        name: String,
    },
    /// `ibv_open_device` failed.
    #[error("ibv_open_device({name}) failed")]
    OpenDevice {
        /// Device name.
        name: String,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `ibv_alloc_pd` failed.
    #[error("ibv_alloc_pd failed")]
    AllocPd(#[source] io::Error),
    /// `ibv_create_cq` failed.
    #[error("ibv_create_cq with {entries} entries failed")]
    CreateCq {
        /// Requested entries.
        entries: u32,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `ibv_create_srq` failed.
    #[error("ibv_create_srq with {max_wr} work requests failed")]
    CreateSrq {
        /// Requested receive work requests.
        max_wr: u32,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// Allocating the memory behind a memory region failed.
    #[error("allocating {len} bytes for a memory region failed")]
    AllocMemory {
        /// Requested length in bytes.
        len: usize,
    },
    /// `ibv_reg_mr` failed (often `ulimit -l` too small).
    #[error("ibv_reg_mr of {len} bytes failed (check `ulimit -l`)")]
    RegMr {
        /// Length in bytes.
        len: usize,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `ibv_create_qp` failed.
    #[error("ibv_create_qp failed")]
    CreateQp(#[source] io::Error),
    /// `ibv_modify_qp` failed.
    #[error("ibv_modify_qp ({what}) failed")]
    ModifyQp {
        /// Which transition or attribute.
        what: &'static str,
        /// errno.
        #[source]
        source: io::Error,
    },
    /// `ibv_query_qp` failed.
    #[error("ibv_query_qp failed")]
    QueryQp(#[source] io::Error),
    /// `ibv_query_device` failed.
    #[error("ibv_query_device failed")]
    QueryDevice(#[source] io::Error),
    /// `ibv_query_port` failed.
    #[error("ibv_query_port({port}) failed")]
    QueryPort {
        /// Port number.
        port: u8,
        /// errno.
        #[source]
        source: io::Error,
    },
}

/// A failed post: the provider's return code and the index of the first work request that was
/// not posted (all earlier ones in the chain were posted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("post failed with errno {errno} at work request {bad_index}")]
pub struct PostError {
    /// The provider's errno (e.g. `ENOMEM` for a full queue).
    pub errno: i32,
    /// Index in the chain of the first work request not posted.
    pub bad_index: usize,
}

fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}

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
    /// ([`CmId::device_context`]), so the PD, CQs and MRs are created on the very device
    /// rdma_cm picked.
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

/// Memory access rights of a [`MemoryRegion`]. Use the least that works: receive buffers need
/// [`Access::LOCAL_WRITE`]; send-only buffers need nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read (send-only buffers).
    pub const NONE: Self = Self(0);
    /// The HCA may write into the region (receive buffers).
    pub const LOCAL_WRITE: Self = Self(ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
}

/// A registered, page-aligned, zero-initialised memory region that owns its memory.
pub struct MemoryRegion {
    raw: NonNull<ffi::ibv_mr>,
    addr: NonNull<u8>,
    layout: std::alloc::Layout,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the region's memory is owned by this object; access to the bytes goes through raw
// pointers whose use is governed by the data path's ownership protocol.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above; `&MemoryRegion` only hands out raw pointers and keys.
unsafe impl Sync for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("len", &self.len())
            .field("lkey", &self.lkey())
            .finish()
    }
}

impl MemoryRegion {
    /// Allocates `len` bytes (page aligned, zeroed) and registers them with `access`.
    ///
    /// # Errors
    /// [`VerbsError::AllocMemory`], [`VerbsError::RegMr`].
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: Access) -> Result<Self, VerbsError> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| VerbsError::AllocMemory { len })?;
        // SAFETY: layout has non-zero size.
        let addr = unsafe { std::alloc::alloc_zeroed(layout) };
        let addr = NonNull::new(addr).ok_or(VerbsError::AllocMemory { len })?;
        // SAFETY: `addr..addr+len` is a live allocation owned by the returned object and
        // freed only after ibv_dereg_mr in Drop.
        let mr =
            unsafe { ffi::ibv_reg_mr(pd.as_ptr(), addr.as_ptr().cast(), len, access.0 as i32) };
        match NonNull::new(mr) {
            Some(raw) => Ok(Self {
                raw,
                addr,
                layout,
                pd: Arc::clone(pd),
            }),
            None => {
                let source = last_os_error();
                // SAFETY: allocated above with `layout`, never registered.
                unsafe { std::alloc::dealloc(addr.as_ptr(), layout) };
                Err(VerbsError::RegMr { len, source })
            }
        }
    }

    /// Start of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Whether the region is empty (never: at least one byte is allocated).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Local key for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: valid MR.
        unsafe { (*self.raw.as_ptr()).lkey }
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by ibv_reg_mr; the memory is freed only after deregistration.
        unsafe {
            ffi::ibv_dereg_mr(self.raw.as_ptr());
            std::alloc::dealloc(self.addr.as_ptr(), self.layout);
        }
    }
}

/// Work completion status (a subset named; others keep their code).
pub type WcStatus = ffi::ibv_wc_status::Type;
/// Status code of a successful work completion.
pub const WC_SUCCESS: WcStatus = ffi::ibv_wc_status::IBV_WC_SUCCESS;
/// Status code of a receive-not-ready retry-exceeded completion.
pub const WC_RNR_RETRY_EXC_ERR: WcStatus = ffi::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR;
/// Status code of a flushed work request (the QP went to the error state).
pub const WC_WR_FLUSH_ERR: WcStatus = ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR;

/// One work completion (`struct ibv_wc`), read in place from the poll array.
#[repr(transparent)]
pub struct WorkCompletion(ffi::ibv_wc);

impl WorkCompletion {
    /// The work request id given when posting.
    #[inline]
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// Completion status ([`WC_SUCCESS`] or an error).
    #[inline]
    pub fn status(&self) -> WcStatus {
        self.0.status
    }
    /// Whether the status is success.
    #[inline]
    pub fn is_ok(&self) -> bool {
        self.0.status == WC_SUCCESS
    }
    /// Whether this completes a receive (`IBV_WC_RECV*`).
    #[inline]
    pub fn is_recv(&self) -> bool {
        self.0.opcode & ffi::ibv_wc_opcode::IBV_WC_RECV != 0
    }
    /// Bytes received (receives only).
    #[inline]
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// Local QP number.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// Immediate data in host order, if the completion carries any.
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        if self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: IBV_WC_WITH_IMM says the union holds imm_data.
            Some(u32::from_be(unsafe {
                self.0.imm_data_invalidated_rkey_union.imm_data
            }))
        } else {
            None
        }
    }
    /// Provider-specific error code.
    #[inline]
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &status_str(self.status()))
            .field("byte_len", &self.byte_len())
            .field("qp_num", &self.qp_num())
            .field("imm", &self.imm())
            .finish()
    }
}

/// The human-readable name of a completion status (`ibv_wc_status_str`).
pub fn status_str(status: WcStatus) -> &'static str {
    // SAFETY: returns a pointer to a static string for any value.
    unsafe { CStr::from_ptr(ffi::ibv_wc_status_str(status)) }
        .to_str()
        .unwrap_or("?")
}

/// An uninitialised slot for [`CompletionQueue::poll`]; keep arrays of these on the stack.
pub type WcSlot = MaybeUninit<WorkCompletion>;

/// A completion queue.
pub struct CompletionQueue {
    raw: NonNull<ffi::ibv_cq>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects are thread safe.
unsafe impl Send for CompletionQueue {}
// SAFETY: verbs objects are thread safe.
unsafe impl Sync for CompletionQueue {}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue").finish_non_exhaustive()
    }
}

impl CompletionQueue {
    /// Creates a CQ with at least `entries` entries (no completion channel: it is polled).
    ///
    /// # Errors
    /// [`VerbsError::CreateCq`].
    pub fn new(ctx: &Arc<Context>, entries: u32) -> Result<Arc<Self>, VerbsError> {
        // SAFETY: valid context; no channel, no cq_context.
        let raw = unsafe {
            ffi::ibv_create_cq(
                ctx.as_ptr(),
                entries as i32,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::CreateCq {
            entries,
            source: last_os_error(),
        })?;
        Ok(Arc::new(Self {
            raw,
            ctx: Arc::clone(ctx),
        }))
    }

    /// The raw CQ pointer (for `rdma_create_qp`).
    pub fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.raw.as_ptr()
    }

    /// The context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Polls up to `slots.len()` completions in one `ibv_poll_cq` call and returns the ones
    /// found. No allocation, no syscall (for user-space providers such as rxe, mlx5).
    ///
    /// # Errors
    /// `Err(rc)` if the provider reports a polling failure (negative return).
    #[inline]
    pub fn poll<'a>(&self, slots: &'a mut [WcSlot]) -> Result<&'a [WorkCompletion], i32> {
        let len = slots.len().min(i32::MAX as usize) as i32;
        // SAFETY: `slots` has room for `len` ibv_wc (WorkCompletion is repr(transparent)); the
        // CQ is valid.
        let n = unsafe { ffi::ibv_poll_cq(self.as_ptr(), len, slots.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(n);
        }
        // SAFETY: ibv_poll_cq initialised the first `n` entries.
        Ok(unsafe { std::slice::from_raw_parts(slots.as_ptr().cast(), n as usize) })
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq; QPs using it hold Arcs, so none is left.
        unsafe { ffi::ibv_destroy_cq(self.raw.as_ptr()) };
    }
}

/// A shared receive queue.
pub struct SharedReceiveQueue {
    raw: NonNull<ffi::ibv_srq>,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: verbs objects are thread safe.
unsafe impl Send for SharedReceiveQueue {}
// SAFETY: verbs objects are thread safe.
unsafe impl Sync for SharedReceiveQueue {}

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue").finish_non_exhaustive()
    }
}

impl SharedReceiveQueue {
    /// Creates an SRQ holding up to `max_wr` receives of one scatter entry each.
    ///
    /// # Errors
    /// [`VerbsError::CreateSrq`].
    pub fn new(pd: &Arc<ProtectionDomain>, max_wr: u32) -> Result<Arc<Self>, VerbsError> {
        let mut attr = ffi::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        // SAFETY: valid PD and attribute struct.
        let raw = unsafe { ffi::ibv_create_srq(pd.as_ptr(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::CreateSrq {
            max_wr,
            source: last_os_error(),
        })?;
        Ok(Arc::new(Self {
            raw,
            pd: Arc::clone(pd),
        }))
    }

    /// The raw SRQ pointer (for `rdma_create_qp`).
    pub fn as_ptr(&self) -> *mut ffi::ibv_srq {
        self.raw.as_ptr()
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Posts a chain of receive work requests.
    ///
    /// # Errors
    /// [`PostError`] naming the first request not posted.
    ///
    /// # Safety
    /// `wr` must point to a valid, null-terminated chain of receive work requests whose
    /// scatter entries lie inside memory regions registered with [`Access::LOCAL_WRITE`] on this
    /// SRQ's PD. Each buffer must stay valid and must not be read or written by the program until
    /// its completion has been polled (or the SRQ destroyed).
    #[inline]
    pub unsafe fn post_recv(&self, wr: *mut RecvWr) -> Result<(), PostError> {
        let mut bad = ptr::null_mut();
        // SAFETY: forwarded from the caller's contract; the SRQ is valid.
        let rc = unsafe { ffi::ibv_post_srq_recv(self.as_ptr(), wr, &mut bad) };
        // SAFETY: `bad` points into the caller's chain.
        post_result(rc, wr, bad, |w| unsafe { (*w).next })
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_srq; QPs using it hold Arcs, so none is left.
        unsafe { ffi::ibv_destroy_srq(self.raw.as_ptr()) };
    }
}

fn post_result<T>(
    rc: i32,
    first: *mut T,
    bad: *mut T,
    next: impl Fn(*mut T) -> *mut T,
) -> Result<(), PostError> {
    if rc == 0 {
        return Ok(());
    }
    let mut idx = 0;
    let mut w = first;
    while !w.is_null() && w != bad {
        w = next(w);
        idx += 1;
    }
    Err(PostError {
        errno: rc,
        bad_index: idx,
    })
}

/// The resources a QP was created with, kept alive as long as the QP.
#[derive(Clone)]
pub struct QpResources {
    /// Protection domain.
    pub pd: Arc<ProtectionDomain>,
    /// Send completion queue.
    pub send_cq: Arc<CompletionQueue>,
    /// Receive completion queue.
    pub recv_cq: Arc<CompletionQueue>,
    /// Optional shared receive queue.
    pub srq: Option<Arc<SharedReceiveQueue>>,
}

impl fmt::Debug for QpResources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QpResources")
            .field("srq", &self.srq.is_some())
            .finish_non_exhaustive()
    }
}

impl QpResources {
    /// Fills an `ibv_qp_init_attr` for an RC QP with these CQs/SRQ and the given capacities.
    pub fn init_attr(&self, cap: QpCapacity) -> ffi::ibv_qp_init_attr {
        ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: self.send_cq.as_ptr(),
            recv_cq: self.recv_cq.as_ptr(),
            srq: self.srq.as_ref().map_or(ptr::null_mut(), |s| s.as_ptr()),
            cap: ffi::ibv_qp_cap {
                max_send_wr: cap.max_send_wr,
                max_recv_wr: if self.srq.is_some() {
                    0
                } else {
                    cap.max_recv_wr
                },
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: cap.max_inline_data,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        }
    }
}

/// Requested queue sizes of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCapacity {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored with an SRQ).
    pub max_recv_wr: u32,
    /// Requested inline size; the provider may grant more (read it back with
    /// [`QueuePair::max_inline_data`]).
    pub max_inline_data: u32,
}

/// Who destroys the QP.
enum QpOwner {
    /// Created by `ibv_create_qp`; destroyed on drop.
    Verbs,
    /// Owned by someone else (an `rdma_cm_id`), kept alive by this handle.
    External(#[allow(dead_code)] Box<dyn Send + Sync>),
}

/// A reliable-connected queue pair.
pub struct QueuePair {
    raw: NonNull<ffi::ibv_qp>,
    owner: QpOwner,
    res: QpResources,
    max_inline: u32,
}

// SAFETY: verbs objects are thread safe.
unsafe impl Send for QueuePair {}
// SAFETY: verbs objects are thread safe.
unsafe impl Sync for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("max_inline", &self.max_inline)
            .finish()
    }
}

impl QueuePair {
    /// Creates an RC QP with `ibv_create_qp` (state RESET; for rdma_cm use
    /// [`QueuePair::from_external`] instead).
    ///
    /// # Errors
    /// [`VerbsError::CreateQp`], [`VerbsError::QueryQp`].
    pub fn new(res: QpResources, cap: QpCapacity) -> Result<Self, VerbsError> {
        let mut attr = res.init_attr(cap);
        // SAFETY: valid PD and attributes with valid CQ/SRQ pointers kept alive by `res`.
        let raw = unsafe { ffi::ibv_create_qp(res.pd.as_ptr(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::CreateQp(last_os_error()))?;
        let mut qp = Self {
            raw,
            owner: QpOwner::Verbs,
            res,
            max_inline: 0,
        };
        qp.max_inline = qp.query_max_inline()?;
        Ok(qp)
    }

    /// Wraps a QP created by someone else (rdma_cm's `rdma_create_qp`) on `res`.
    ///
    /// # Errors
    /// [`VerbsError::QueryQp`] if reading back the QP's inline size fails.
    ///
    /// # Safety
    /// `raw` must be a valid QP created with `res`'s PD, CQs and SRQ, and it must stay valid as
    /// long as `owner` lives (the owner destroys it when dropped, after this handle).
    pub unsafe fn from_external(
        raw: *mut ffi::ibv_qp,
        res: QpResources,
        owner: Box<dyn Send + Sync>,
    ) -> Result<Self, VerbsError> {
        let raw = NonNull::new(raw)
            .ok_or_else(|| VerbsError::QueryQp(io::Error::from_raw_os_error(libc::EINVAL)))?;
        let mut qp = Self {
            raw,
            owner: QpOwner::External(owner),
            res,
            max_inline: 0,
        };
        qp.max_inline = qp.query_max_inline()?;
        Ok(qp)
    }

    /// Creates the RC queue pair of an rdma_cm id through rdma_cm (`rdma_create_qp`), with
    /// `res`'s PD, CQs and SRQ and `sges` scatter/gather entries per send and per receive.
    /// rdma_cm then drives its state transitions during connect/accept; wrap it with
    /// [`QueuePair::from_cm_id`] once the id is shared. The id keeps `res` and `keep` until it
    /// has destroyed the QP.
    ///
    /// # Errors
    /// [`CmError::NoDevice`] if rdma_cm resolved no device for `id`; [`CmError::CreateQp`] if
    /// `res` is not on the id's device context (`EINVAL`) or `rdma_create_qp` fails.
    pub fn create_on_cm_id(
        id: &mut CmId,
        res: &QpResources,
        cap: QpCapacity,
        sges: u32,
        keep: Box<dyn Any + Send + Sync>,
    ) -> Result<(), CmError> {
        let dev = id.device_context().ok_or(CmError::NoDevice)?;
        let on_dev = |ctx: &Context| ctx.is_cm_device(&dev);
        if !(on_dev(res.pd.context())
            && on_dev(res.send_cq.context())
            && on_dev(res.recv_cq.context())
            && res.srq.as_ref().map_or(true, |s| on_dev(s.pd().context())))
        {
            return Err(CmError::CreateQp(io::Error::from_raw_os_error(
                libc::EINVAL,
            )));
        }
        let mut attr = res.init_attr(cap);
        attr.cap.max_send_sge = sges;
        attr.cap.max_recv_sge = sges;
        let keep: Box<dyn Any + Send + Sync> = Box::new((res.clone(), keep));
        // SAFETY: the PD, CQs and SRQ in `attr` are `res`'s, checked above to be on the id's
        // device context, and `keep` (held by the id until its QP is destroyed) keeps them.
        unsafe { id.create_qp(res.pd.as_ptr(), &mut attr, keep) }
    }

    /// Wraps the QP that [`QueuePair::create_on_cm_id`] created on `id` with `res`. The handle
    /// holds the id, which destroys the QP when its last holder is gone.
    ///
    /// # Errors
    /// [`VerbsError::QueryQp`] (`EINVAL`) if `id` has no QP or its QP was not created with
    /// `res`'s PD, CQs and SRQ; [`VerbsError::QueryQp`] if reading back the inline size fails.
    pub fn from_cm_id(id: &Arc<CmId>, res: QpResources) -> Result<Self, VerbsError> {
        let invalid = || VerbsError::QueryQp(io::Error::from_raw_os_error(libc::EINVAL));
        // SAFETY: the pointer is used only while `id` is alive: below, and then owned by the
        // returned handle, which holds an `Arc` of the id (its `owner`).
        let raw = NonNull::new(unsafe { id.qp_ptr() }).ok_or_else(invalid)?;
        // SAFETY: a valid QP (the id is alive); only reads the object pointers it was created
        // with.
        let created_with_res = unsafe {
            let q = raw.as_ptr();
            (*q).pd == res.pd.as_ptr()
                && (*q).send_cq == res.send_cq.as_ptr()
                && (*q).recv_cq == res.recv_cq.as_ptr()
                && (*q).srq == res.srq.as_ref().map_or(ptr::null_mut(), |s| s.as_ptr())
        };
        if !created_with_res {
            return Err(invalid());
        }
        let owner: Box<dyn Send + Sync> = Box::new(Arc::clone(id));
        // SAFETY: rdma_cm created this QP with `res` (checked above); `owner` keeps the id,
        // which destroys the QP only when dropped, after this handle.
        unsafe { Self::from_external(raw.as_ptr(), res, owner) }
    }

    fn query_max_inline(&self) -> Result<u32, VerbsError> {
        let mut attr = MaybeUninit::<ffi::ibv_qp_attr>::zeroed();
        let mut init = MaybeUninit::<ffi::ibv_qp_init_attr>::zeroed();
        // SAFETY: valid QP and out pointers.
        let rc = unsafe {
            ffi::ibv_query_qp(
                self.as_ptr(),
                attr.as_mut_ptr(),
                ffi::ibv_qp_attr_mask::IBV_QP_CAP.0 as i32,
                init.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(VerbsError::QueryQp(io::Error::from_raw_os_error(rc)));
        }
        // SAFETY: zeroed then filled by ibv_query_qp.
        let init = unsafe { init.assume_init() };
        Ok(init.cap.max_inline_data)
    }

    /// Sets the QP's RNR NAK timer (RTS->RTS transition). The protocol never relies on RNR;
    /// this only keeps a stray RNR from stalling 655 ms (timer value 0).
    ///
    /// # Errors
    /// [`VerbsError::ModifyQp`].
    pub fn set_min_rnr_timer(&self, timer: u8) -> Result<(), VerbsError> {
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut attr: ffi::ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.min_rnr_timer = timer;
        // SAFETY: valid QP; only min_rnr_timer is read.
        let rc = unsafe {
            ffi::ibv_modify_qp(
                self.as_ptr(),
                &mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0 as i32,
            )
        };
        if rc != 0 {
            return Err(VerbsError::ModifyQp {
                what: "min_rnr_timer",
                source: io::Error::from_raw_os_error(rc),
            });
        }
        Ok(())
    }

    /// The raw QP pointer.
    pub fn as_ptr(&self) -> *mut ffi::ibv_qp {
        self.raw.as_ptr()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: valid QP.
        unsafe { (*self.raw.as_ptr()).qp_num }
    }

    /// The inline size the provider actually granted.
    pub fn max_inline_data(&self) -> u32 {
        self.max_inline
    }

    /// The resources (PD, CQs, SRQ) this QP uses.
    pub fn resources(&self) -> &QpResources {
        &self.res
    }

    /// Whether it receives through an SRQ.
    pub fn uses_srq(&self) -> bool {
        self.res.srq.is_some()
    }

    /// Posts a chain of send work requests with one doorbell.
    ///
    /// # Errors
    /// [`PostError`] naming the first request not posted (earlier ones were posted).
    ///
    /// # Safety
    /// `wr` must point to a valid, null-terminated chain of send work requests. Every
    /// non-inline scatter entry must lie inside a memory region of this QP's PD, and that memory
    /// must stay valid and unmodified until the request's completion has been polled (with
    /// selective signalling: until a later signalled completion of this QP), or the QP has been
    /// destroyed. Inline data is copied during the call.
    #[inline]
    pub unsafe fn post_send(&self, wr: *mut SendWr) -> Result<(), PostError> {
        let mut bad = ptr::null_mut();
        // SAFETY: forwarded from the caller's contract; the QP is valid.
        let rc = unsafe { ffi::ibv_post_send(self.as_ptr(), wr, &mut bad) };
        // SAFETY: `bad` points into the caller's chain.
        post_result(rc, wr, bad, |w| unsafe { (*w).next })
    }

    /// Posts a chain of receive work requests to this QP's own receive queue.
    ///
    /// # Errors
    /// [`PostError`] naming the first request not posted.
    ///
    /// # Safety
    /// As [`SharedReceiveQueue::post_recv`], for this QP (which must not use an SRQ).
    #[inline]
    pub unsafe fn post_recv(&self, wr: *mut RecvWr) -> Result<(), PostError> {
        let mut bad = ptr::null_mut();
        // SAFETY: forwarded from the caller's contract; the QP is valid.
        let rc = unsafe { ffi::ibv_post_recv(self.as_ptr(), wr, &mut bad) };
        // SAFETY: `bad` points into the caller's chain.
        post_result(rc, wr, bad, |w| unsafe { (*w).next })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        if let QpOwner::Verbs = self.owner {
            // SAFETY: created by ibv_create_qp; CQs/PD/SRQ are still alive through `res`.
            unsafe { ffi::ibv_destroy_qp(self.raw.as_ptr()) };
        }
        // External: `owner` (declared before `res`) is dropped first by field order, so the
        // rdma_cm id destroys its QP while `res` still keeps the CQs/PD/SRQ alive.
    }
}

/// A zeroed send work request (fill it in place; no allocation).
#[inline]
pub fn send_wr_zeroed() -> SendWr {
    // SAFETY: all-zero is a valid ibv_send_wr (null pointers, zero counts).
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// A zeroed receive work request.
#[inline]
pub fn recv_wr_zeroed() -> RecvWr {
    RecvWr {
        wr_id: 0,
        next: ptr::null_mut(),
        sg_list: ptr::null_mut(),
        num_sge: 0,
    }
}

/// `IBV_WR_SEND_WITH_IMM` opcode.
pub const WR_SEND_WITH_IMM: u32 = ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
/// `IBV_WR_SEND` opcode.
pub const WR_SEND: u32 = ffi::ibv_wr_opcode::IBV_WR_SEND;
/// `IBV_SEND_SIGNALED` flag.
pub const SEND_SIGNALED: u32 = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
/// `IBV_SEND_INLINE` flag.
pub const SEND_INLINE: u32 = ffi::ibv_send_flags::IBV_SEND_INLINE.0;

/// Sets a send WR's immediate data (host order in, network order on the wire).
#[inline]
pub fn set_imm(wr: &mut SendWr, imm: u32) {
    wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
}
