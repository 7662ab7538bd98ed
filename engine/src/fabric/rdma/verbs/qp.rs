//! Reliable-connected queue pairs ([`QueuePair`]) and the resources they are created with.

use std::any::Any;
use std::fmt;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use cm::rdma::{CmError, CmId};
use rdma_sys as ffi;

use super::cq::CompletionQueue;
use super::device::{Context, ProtectionDomain};
use super::error::{last_os_error, post_result, PostError, VerbsError};
use super::srq::SharedReceiveQueue;
use super::wr::{RecvWr, SendWr};

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

    /// The source GID index of the QP's address vector (`ibv_query_qp`, `ah_attr.grh.sgid_index`):
    /// the GID the connection actually sends from, once the QP is connected (RTR or later).
    ///
    /// # Errors
    /// [`VerbsError::QueryQp`].
    pub fn sgid_index(&self) -> Result<u8, VerbsError> {
        let mut attr = MaybeUninit::<ffi::ibv_qp_attr>::zeroed();
        let mut init = MaybeUninit::<ffi::ibv_qp_init_attr>::zeroed();
        // SAFETY: valid QP and out pointers.
        let rc = unsafe {
            ffi::ibv_query_qp(
                self.as_ptr(),
                attr.as_mut_ptr(),
                ffi::ibv_qp_attr_mask::IBV_QP_AV.0 as i32,
                init.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(VerbsError::QueryQp(io::Error::from_raw_os_error(rc)));
        }
        // SAFETY: zeroed then filled by ibv_query_qp.
        let attr = unsafe { attr.assume_init() };
        Ok(attr.ah_attr.grh.sgid_index)
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
    #[inline(always)]
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
    #[inline(always)]
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
