//! Completion queues ([`CompletionQueue`]) and the work completions polled from them.

use std::ffi::CStr;
use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
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

/// A completion channel (`ibv_comp_channel`): a descriptor that becomes readable when a CQ
/// armed with [`CompletionQueue::req_notify`] gets a completion. Non-blocking.
struct CompletionChannel {
    raw: NonNull<ffi::ibv_comp_channel>,
}

impl CompletionChannel {
    /// A channel on `ctx` with its descriptor set non-blocking; `None` if either step fails
    /// (the CQ is then polled only).
    fn new(ctx: &Context) -> Option<CompletionChannel> {
        // SAFETY: valid context.
        let raw = NonNull::new(unsafe { ffi::ibv_create_comp_channel(ctx.as_ptr()) })?;
        let ch = CompletionChannel { raw };
        let fd = ch.fd();
        // SAFETY: fcntl on the channel's own descriptor.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        ok.then_some(ch)
    }

    fn fd(&self) -> RawFd {
        // SAFETY: `raw` is a live channel.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel; its CQ was destroyed first (the CQ owns
        // it and destroys itself in its own `drop`, before its fields drop).
        unsafe { ffi::ibv_destroy_comp_channel(self.raw.as_ptr()) };
    }
}

/// A completion queue, with a completion channel when the device gave one (for
/// [`IdleStrategy::Block`](crate::IdleStrategy::Block): a poller arms it and sleeps on the
/// channel's descriptor).
pub struct CompletionQueue {
    raw: NonNull<ffi::ibv_cq>,
    ctx: Arc<Context>,
    // Dropped after the CQ is destroyed (`Drop::drop` runs before the fields drop).
    channel: Option<CompletionChannel>,
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
    /// Creates a CQ with at least `entries` entries and, if the device gives one, a
    /// completion channel. A CQ is polled; the channel only matters once
    /// [`req_notify`](Self::req_notify) arms it (an engine that never sleeps never does, and
    /// pays nothing for it).
    ///
    /// # Errors
    /// [`VerbsError::CreateCq`].
    pub fn new(ctx: &Arc<Context>, entries: u32) -> Result<Arc<Self>, VerbsError> {
        let channel = CompletionChannel::new(ctx);
        let ch_ptr = channel.as_ref().map_or(ptr::null_mut(), |c| c.raw.as_ptr());
        // SAFETY: valid context; the channel (if any) is live and outlives the CQ (the CQ owns
        // it); no cq_context.
        let raw =
            unsafe { ffi::ibv_create_cq(ctx.as_ptr(), entries as i32, ptr::null_mut(), ch_ptr, 0) };
        let raw = NonNull::new(raw).ok_or_else(|| VerbsError::CreateCq {
            entries,
            source: last_os_error(),
        })?;
        Ok(Arc::new(Self {
            raw,
            ctx: Arc::clone(ctx),
            channel,
        }))
    }

    /// The completion channel's descriptor (non-blocking), if the CQ has one.
    pub fn channel_fd(&self) -> Option<RawFd> {
        self.channel.as_ref().map(CompletionChannel::fd)
    }

    /// Arms the CQ: the channel's descriptor becomes readable at its next completion
    /// (`ibv_req_notify_cq`, every completion, not only solicited ones). Poll the CQ once more
    /// after this before sleeping: a completion that came before it raises no event.
    ///
    /// # Errors
    /// `Err(rc)` when the CQ has no channel or the provider refuses.
    pub fn req_notify(&self) -> Result<(), i32> {
        if self.channel.is_none() {
            return Err(-1);
        }
        // SAFETY: valid CQ with a channel.
        let rc = unsafe { ffi::ibv_req_notify_cq(self.as_ptr(), 0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(rc)
        }
    }

    /// Takes every event waiting on the channel and acknowledges it (`ibv_get_cq_event`,
    /// `ibv_ack_cq_events`: a CQ with unacknowledged events cannot be destroyed). Returns how
    /// many. Never blocks (the descriptor is non-blocking).
    pub fn take_events(&self) -> u32 {
        let Some(ch) = &self.channel else {
            return 0;
        };
        let mut n = 0;
        loop {
            let mut cq: *mut ffi::ibv_cq = ptr::null_mut();
            let mut cq_ctx: *mut std::ffi::c_void = ptr::null_mut();
            // SAFETY: live channel; out-pointers to locals. Non-blocking: EAGAIN when empty.
            let rc = unsafe { ffi::ibv_get_cq_event(ch.raw.as_ptr(), &mut cq, &mut cq_ctx) };
            if rc != 0 || cq.is_null() {
                return n;
            }
            // SAFETY: `cq` is the CQ the event came for (this one: the channel is its own);
            // one event taken, one acknowledged.
            unsafe { ffi::ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
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
