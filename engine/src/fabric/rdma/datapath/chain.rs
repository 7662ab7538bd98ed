//! Chained receive posting ([`post_recv_chains`], at most [`CHAIN`] work requests per call) and
//! a poller's shared receive queue ([`SrqShared`]), which is posted that way.

use std::sync::Arc;

use crate::desc::PoolView;
use crate::error::FabricError;
use crate::fabric::rdma::verbs::{RecvWr, Sge, SharedReceiveQueue};
use crate::fabric::rdma::wr_id::srq_wr_id;

/// Most work requests chained per post call (bounded stack arrays).
pub(super) const CHAIN: usize = 64;

/// A poller's shared receive queue on one device and its registered pool.
#[derive(Clone)]
pub struct SrqShared {
    pub(crate) srq: Arc<SharedReceiveQueue>,
    pub(crate) pool: PoolView,
    pub(crate) lkey: u32,
    /// Keeps the pool's memory region alive.
    pub(crate) keep: Arc<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for SrqShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SrqShared")
            .field("buffers", &self.pool.count())
            .finish_non_exhaustive()
    }
}

impl SrqShared {
    /// Posts SRQ-pool buffers `bufs` as receives, one chain per [`CHAIN`].
    pub(crate) fn post(&self, bufs: &[u32]) -> Result<(), FabricError> {
        post_recv_chains(&self.pool, self.lkey, bufs, srq_wr_id, |head, _n| {
            // SAFETY: `post_recv_chains` hands over a chain of initialised WRs pointing to
            // SGEs that live until this call returns; each buffer is an SRQ-pool buffer (index
            // checked) in its LOCAL_WRITE region, owned by the fabric until its completion is
            // polled.
            unsafe { self.srq.post_recv(head) }.map_err(|e| FabricError::Io(e.errno))
        })
    }
}

/// Posts `bufs` of `pool` as single-SGE receives, one chained `ibv_post_recv` (through `post`)
/// per [`CHAIN`] buffers. Each index is checked against the pool first; `wr_id` names the
/// buffer in its completion. `post` gets the head of an initialised chain of `n` WRs whose WRs
/// and SGEs live on this stack frame until it returns.
#[inline]
pub(super) fn post_recv_chains(
    pool: &PoolView,
    lkey: u32,
    bufs: &[u32],
    wr_id: impl Fn(u32) -> u64,
    mut post: impl FnMut(*mut RecvWr, u32) -> Result<(), FabricError>,
) -> Result<(), FabricError> {
    let size = recv_len(pool);
    for chunk in bufs.chunks(CHAIN) {
        // Left uninitialised: only the first `n` entries are written and posted. Zeroing both
        // whole arrays was a 2-KiB memset per call, most of a one-buffer re-post's cost under
        // callgrind (rxe, 8-B ping-pong).
        let mut wrs = [const { std::mem::MaybeUninit::<RecvWr>::uninit() }; CHAIN];
        let mut sges = [const { std::mem::MaybeUninit::<Sge>::uninit() }; CHAIN];
        let n = chunk.len();
        for (i, &buf) in chunk.iter().enumerate() {
            sges[i].write(recv_sge(pool, size, lkey, buf)?);
        }
        let base = wrs.as_mut_ptr().cast::<RecvWr>();
        for (i, &buf) in chunk.iter().enumerate() {
            let next = if i + 1 < n {
                // SAFETY: i + 1 < n <= CHAIN: in bounds of `wrs`.
                unsafe { base.add(i + 1) }
            } else {
                std::ptr::null_mut()
            };
            wrs[i].write(RecvWr {
                wr_id: wr_id(buf),
                next,
                sg_list: sges[i].as_mut_ptr(),
                num_sge: 1,
            });
        }
        post(base, n as u32)?;
    }
    Ok(())
}

/// The length a receive of `pool` scatters into: its buffer size (a buffer is never larger
/// than a work request can describe; saturated if it were).
#[inline(always)]
pub(super) fn recv_len(pool: &PoolView) -> u32 {
    u32::try_from(pool.buf_size()).unwrap_or(u32::MAX)
}

/// The scatter entry of a receive into buffer `buf` of `pool` (`len`: [`recv_len`]), its
/// index checked first: a released index comes from the application's side of the pool.
#[inline(always)]
pub(super) fn recv_sge(pool: &PoolView, len: u32, lkey: u32, buf: u32) -> Result<Sge, FabricError> {
    if buf >= pool.count() {
        return Err(FabricError::Protocol(
            "released receive buffer out of range",
        ));
    }
    Ok(Sge {
        // SAFETY: `buf < count`, checked above.
        addr: unsafe { pool.buf_ptr_unchecked(buf) }.as_ptr() as u64,
        length: len,
        lkey,
    })
}
