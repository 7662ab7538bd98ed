//! Shared receive queues ([`SharedReceiveQueue`]).

use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys as ffi;

use super::device::ProtectionDomain;
use super::error::{last_os_error, post_result, PostError, VerbsError};
use super::wr::RecvWr;

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
    /// scatter entries lie inside memory regions registered with
    /// [`Access::LOCAL_WRITE`](super::Access::LOCAL_WRITE) on this SRQ's PD. Each buffer must
    /// stay valid and must not be read or written by the program until its completion has been
    /// polled (or the SRQ destroyed).
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
