//! Completion queues ([`CompletionQueue`]) and the work completions polled from them.

use std::ffi::CStr;
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys as ffi;

use super::device::Context;
use super::error::{last_os_error, VerbsError};

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
    /// Whether this completes an RDMA READ (`IBV_WC_RDMA_READ`; meaningful for successful
    /// completions only, as every opcode).
    #[inline]
    pub fn is_rdma_read(&self) -> bool {
        self.0.opcode == ffi::ibv_wc_opcode::IBV_WC_RDMA_READ
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

impl Clone for WorkCompletion {
    /// A bitwise copy (`struct ibv_wc` is plain data: integers and a union of integers; bindgen
    /// derives no `Clone` for it because of the union). The poller keeps such copies of
    /// receive completions that arrive before their QP is attached.
    #[inline]
    fn clone(&self) -> Self {
        // SAFETY: `ibv_wc` holds only integers (and a union of two u32s), no pointers or
        // owned resources: any bit pattern copied from a valid value is a valid value.
        Self(unsafe { ptr::read(&self.0) })
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
