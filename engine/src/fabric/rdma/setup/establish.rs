//! Finishing a connection once ESTABLISHED arrived with the peer's flow-control parameters
//! ([`finish`]): checks them, tunes the QP and builds the data-path state ([`RdmaConn`]) and the
//! application's pool views, as an [`Established`] connection for the control thread to hand
//! over.

use std::any::Any;
use std::sync::Arc;

use cm::rdma::{CmId, ConnOptions, FlowParams, PathInfo};

use super::devices::PollerSlot;
use super::large;
use super::prepare::{Pending, MIN_CREDITS};
use super::setup_err;
use crate::config::Config;
use crate::desc::{PoolView, INLINE_MAX};
use crate::error::Error;
use crate::fabric::rdma::datapath::{LargeRegion, RdmaConn, RdmaConnParts, SrqShared};
use crate::fabric::rdma::error::RdmaSetupError;
use crate::fabric::rdma::header::{HdrParts, HDR_LEN};
use crate::fabric::rdma::verbs::CompletionQueue;
use crate::link::Pools;

/// A fully set-up RDMA connection, before it is registered with the engine.
pub(crate) struct Established {
    /// The poller whose CQ the QP uses (the connection must go to that poller).
    pub(crate) poller: PollerSlot,
    pub(crate) conn: RdmaConn,
    /// The application's views: pool buffers and large slots, each direction.
    pub(crate) pools: Pools,
    pub(crate) keep: Arc<dyn Any + Send + Sync>,
    /// The rdma_cm id: its channel fd reports DISCONNECTED / DEVICE_REMOVAL (control thread),
    /// and [`close`](super::close) disconnects it.
    pub(crate) id: Arc<CmId>,
    /// The poller's CQ for this device: send [`RdmaCommand::AttachCq`] before the connection (the
    /// poller ignores a CQ it already polls).
    ///
    /// [`RdmaCommand::AttachCq`]: crate::fabric::rdma::RdmaCommand::AttachCq
    pub(crate) cq: Arc<CompletionQueue>,
    /// The poller's SRQ on this device (SRQ mode), sent along with the CQ.
    pub(crate) srq: Option<SrqShared>,
    /// Device, port, GID index and type rdma_cm chose (for the control thread's log).
    pub(crate) path: Option<PathInfo>,
    /// The peer's address.
    pub(crate) peer: String,
}

impl std::fmt::Debug for Established {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Established")
            .field("peer", &self.peer)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Builds the data-path state once ESTABLISHED arrived with the peer's parameters (its flow
/// parameters and its large send region, both validated by `decode`).
pub(super) fn finish(
    p: Pending,
    peer: FlowParams,
    peer_large: LargeRegion,
    cfg: &Config,
    opts: &ConnOptions,
    peer_addr: String,
) -> Result<Established, Error> {
    p.qp.set_min_rnr_timer(opts.min_rnr_timer)
        .map_err(|e| setup_err("tune QP", e))?;
    let path = p.id.path_info();
    let sz = p.sizing;
    if peer.credits < MIN_CREDITS {
        return Err(RdmaSetupError::TooFewCredits {
            credits: peer.credits,
            min: MIN_CREDITS,
        }
        .into());
    }
    if peer.buffer_size != sz.buffer_size {
        return Err(RdmaSetupError::BufferSizeMismatch {
            peer: peer.buffer_size,
            ours: sz.buffer_size,
        }
        .into());
    }
    large::check_peer(p.pools.large.as_ref(), &peer_large)?;
    let (large, tx_large, rx_large) = large::parts(p.pools.large.as_ref(), peer_large)?;
    let base_tx = std::ptr::NonNull::new(p.pools.tx.as_ptr())
        .ok_or(RdmaSetupError::NullRegion { what: "send pool" })?;
    // SAFETY: the send region is `buffers * buffer_size` bytes, owned by `pools`, which the
    // connection and every user of the view keep alive (`keep`).
    let tx_pool = unsafe { PoolView::new(base_tx, sz.buffer_size as usize, sz.buffers) };
    let (rx_pool, rx_lkey) = match (&p.pools.rx, &p.srq) {
        (Some(rx), _) => {
            let base = std::ptr::NonNull::new(rx.as_ptr()).ok_or(RdmaSetupError::NullRegion {
                what: "receive pool",
            })?;
            // SAFETY: as for the send pool.
            (
                unsafe { PoolView::new(base, sz.buffer_size as usize, sz.buffers) },
                rx.lkey(),
            )
        }
        (None, Some((srq, _))) => (srq.pool, srq.lkey),
        (None, None) => {
            return Err(RdmaSetupError::Missing {
                what: "receive pool",
            }
            .into())
        }
    };
    let hdr = match &p.pools.hdr {
        Some(h) => {
            let base = std::ptr::NonNull::new(h.as_ptr()).ok_or(RdmaSetupError::NullRegion {
                what: "header region",
            })?;
            let slots = sz.buffers + sz.sq_depth.max(2);
            // SAFETY: the header region holds `slots` slots of HDR_LEN bytes (as registered in
            // `prepare`), owned by `pools`, which the connection keeps alive (`keep`).
            let view = unsafe { PoolView::new(base, HDR_LEN as usize, slots) };
            Some(HdrParts {
                view,
                lkey: h.lkey(),
                rx_slots: sz.buffers,
                inline: p.hdr_inline,
            })
        }
        None => None,
    };
    let keep: Arc<dyn Any + Send + Sync> = p.pools.clone();
    let srq_attach = p.srq.as_ref().map(|(s, _)| s.clone());
    let conn = RdmaConn::new(RdmaConnParts {
        counters: Arc::clone(&p.counters),
        qp: p.qp,
        gen: p.gen,
        tx_pool,
        tx_lkey: p.pools.tx.lkey(),
        rx_pool,
        rx_lkey,
        rx_posted: sz.rx_credits,
        srq: p.srq,
        peer_credits: peer.credits,
        peer_buffer_size: peer.buffer_size,
        rx_inline_threshold: u32::try_from(cfg.inline_threshold.min(INLINE_MAX)).unwrap_or(0),
        tx_inline_threshold: p.tx_inline,
        signal_every: u32::try_from(cfg.signal_every).unwrap_or(u32::MAX),
        sq_depth: sz.sq_depth,
        hdr,
        liveness: cfg.liveness(),
        frame_size: cfg.frame_size(),
        depth: u32::try_from(cfg.depth).unwrap_or(u32::MAX),
        large,
        keep: Arc::clone(&keep),
    });
    Ok(Established {
        poller: p.poller,
        conn,
        pools: Pools {
            tx: tx_pool,
            rx: rx_pool,
            tx_large,
            rx_large,
        },
        keep,
        id: p.id,
        cq: p.cq,
        srq: srq_attach,
        path,
        peer: peer_addr,
    })
}
