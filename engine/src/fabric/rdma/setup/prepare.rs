//! Preparing one connection before connect/accept ([`prepare`]): sizing from the configuration
//! and the device's limits, registered pools, the QP created through rdma_cm on its resolved
//! context, and every receive pre-posted (or, with an SRQ, credits reserved on the poller's
//! pre-posted SRQ). The result is a [`Pending`] connection, finished by
//! [`finish`](super::establish::finish) once ESTABLISHED arrives.

use std::any::Any;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use cm::rdma::{CmId, FlowParams};

use super::devices::{PollerSlot, RdmaDevices};
use super::large::{self, LargeRegions, PRIVATE_LEN};
use super::setup_err;
use crate::config::Config;
use crate::desc::INLINE_MAX;
use crate::error::Error;
use crate::fabric::rdma::counters::{PollerRdmaCounters, Registered, RegisteredBytes};
use crate::fabric::rdma::datapath::SrqShared;
use crate::fabric::rdma::error::RdmaSetupError;
use crate::fabric::rdma::header::HDR_LEN;
use crate::fabric::rdma::verbs::{
    self, Access, CompletionQueue, DeviceLimits, MemoryRegion, QpCapacity, QpResources, QueuePair,
    Sge,
};
use crate::fabric::rdma::wr_id;

/// Fewest receive buffers (credits) per connection. With one credit held back for credit
/// messages and credits returned at half the window, smaller windows would make two idle peers
/// bounce credit messages at each other.
pub(crate) const MIN_CREDITS: u32 = 4;
/// Default credits a connection is granted on its poller's SRQ
/// ([`EngineBuilder::rdma_srq_credits`](crate::EngineBuilder::rdma_srq_credits) 0), at most its
/// buffer count. 16 receive buffers carry the engine's default depth (128) of small messages in
/// a few frames, and keep the receive memory of a connection at 1/16 of the default private
/// pool (256 buffers).
pub(crate) const DEFAULT_SRQ_CREDITS: u32 = 16;
/// Inline size requested from the provider (the engine never sends more inline than
/// [`INLINE_MAX`] bytes; the provider may grant more, and we read back what it granted).
const REQUEST_INLINE: u32 = INLINE_MAX as u32;

/// The registered pools of one connection (kept alive by the application's handles too).
pub(super) struct Pools {
    pub(super) tx: MemoryRegion,
    /// Own receive pool (None with an SRQ: the receive pool is then the SRQ's).
    pub(super) rx: Option<MemoryRegion>,
    /// Keeps the SRQ pool alive for the application's views.
    pub(super) _srq_pool: Option<Arc<dyn Any + Send + Sync>>,
    /// iWARP only: the message headers ([`HDR_LEN`] bytes each), registered with local write:
    /// one receive header per receive buffer, then one send header per send-queue slot.
    pub(super) hdr: Option<MemoryRegion>,
    /// Large messages (rendezvous): the large slots and their frames; `None` without.
    pub(super) large: Option<LargeRegions>,
    /// The registered bytes above, counted in [`RdmaStats`](crate::fabric::rdma::RdmaStats)
    /// while the pools live.
    pub(super) _registered: [RegisteredBytes; 3],
}

/// Sizes derived from the engine configuration.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizing {
    pub(super) buffer_size: u32,
    pub(super) buffers: u32,
    /// The receive credits this side grants the peer: its posted receives (`buffers`), or with
    /// an SRQ its share of the poller's SRQ (see [`srq_credits`]).
    pub(super) rx_credits: u32,
    pub(super) sq_depth: u32,
}

/// The credits a connection is granted on an SRQ: `rdma_srq_credits` (0: the default
/// [`DEFAULT_SRQ_CREDITS`]), clamped to the buffer count.
///
/// # Errors
///
/// [`RdmaSetupError::SrqCredits`] below [`MIN_CREDITS`].
fn srq_credits(cfg: &Config, buffers: u32) -> Result<u32, Error> {
    let asked = match cfg.rdma_srq_credits {
        0 => DEFAULT_SRQ_CREDITS,
        n => u32::try_from(n).unwrap_or(u32::MAX),
    };
    let credits = asked.min(buffers);
    if credits < MIN_CREDITS {
        return Err(RdmaSetupError::SrqCredits {
            count: cfg.rdma_srq_credits,
            min: MIN_CREDITS,
        }
        .into());
    }
    Ok(credits)
}

fn sizing(cfg: &Config, limits: Option<&DeviceLimits>) -> Result<Sizing, Error> {
    let buffer_size = u32::try_from(cfg.buffer_size)
        .ok()
        .filter(|&b| b > 0 && b <= FlowParams::MAX_BUFFER)
        .ok_or(RdmaSetupError::BufferSize {
            size: cfg.buffer_size,
            max: FlowParams::MAX_BUFFER,
        })?;
    let buffers = u32::try_from(cfg.buffers)
        .ok()
        .filter(|&b| (MIN_CREDITS..=FlowParams::MAX_CREDITS).contains(&b))
        .ok_or(RdmaSetupError::BufferCount {
            count: cfg.buffers,
            min: MIN_CREDITS,
            max: FlowParams::MAX_CREDITS,
        })?;
    let rx_credits = if cfg.rdma_srq_buffers > 0 {
        srq_credits(cfg, buffers)?
    } else {
        buffers
    };
    // Sends in flight are bounded by the peer's credits (its grant, normally = ours: its
    // buffers, or its SRQ share), plus unsignalled sends waiting for the next signalled one,
    // plus credit messages. A peer granting more than we do is still safe: a batch is cut to
    // the send queue's room.
    let signal = u32::try_from(cfg.signal_every).unwrap_or(u32::MAX).max(1);
    let mut sq_depth = rx_credits.saturating_add(signal).saturating_add(4);
    // Rendezvous: the READ chunks in flight, an RNDV SEND per large send slot (both
    // signalled) and the acknowledgement frames.
    let (_, large_slots) = cfg.large_pool();
    if large_slots > 0 {
        use crate::fabric::rdma::datapath::{ACK_BUFS, READ_WINDOW};
        sq_depth = sq_depth
            .saturating_add(READ_WINDOW)
            .saturating_add(large_slots)
            .saturating_add(ACK_BUFS as u32);
    }
    if let Some(l) = limits {
        if buffers > l.max_qp_wr {
            return Err(RdmaSetupError::QueueTooDeep {
                count: buffers,
                max: l.max_qp_wr,
            }
            .into());
        }
        sq_depth = sq_depth.min(l.max_qp_wr);
    }
    Ok(Sizing {
        buffer_size,
        buffers,
        rx_credits,
        sq_depth,
    })
}

/// Resources of a connection being set up, between QP creation and ESTABLISHED.
pub(super) struct Pending {
    pub(super) poller: PollerSlot,
    pub(super) counters: Arc<PollerRdmaCounters>,
    pub(super) qp: QueuePair,
    pub(super) id: Arc<CmId>,
    pub(super) cq: Arc<CompletionQueue>,
    pub(super) pools: Arc<Pools>,
    /// SRQ mode: the poller's SRQ and where the connection reports what it still held.
    pub(super) srq: Option<(SrqShared, Arc<AtomicU32>)>,
    pub(super) sizing: Sizing,
    pub(super) tx_inline: u32,
    /// iWARP: whether a header-only send fits inline.
    pub(super) hdr_inline: bool,
    pub(super) gen: u16,
}

/// Creates pools and the QP (through rdma_cm, on its resolved context) and pre-posts every
/// receive buffer (or, with an SRQ, reserves credits on the poller's pre-posted SRQ), before
/// connect/accept.
pub(super) fn prepare(mut id: CmId, devices: &RdmaDevices, cfg: &Config) -> Result<Pending, Error> {
    if !id.has_device() {
        return Err(RdmaSetupError::NoDevice.into());
    }
    let pre = sizing(cfg, None)?;
    let poller = devices.pick_poller()?;
    let srq_req = match u32::try_from(cfg.rdma_srq_buffers) {
        Ok(0) => None,
        Ok(n) => Some((n, pre.rx_credits, pre.buffer_size)),
        Err(_) => {
            return Err(RdmaSetupError::SrqCountTooLarge {
                count: cfg.rdma_srq_buffers,
            }
            .into())
        }
    };
    // CQ entries: the receives this side grants (its own posted ones, or its SRQ share) and
    // the send queue.
    let res = devices.reserve(&id, poller.index(), pre.rx_credits + pre.sq_depth, srq_req)?;
    let sz = sizing(cfg, Some(&res.limits))?;
    let pool_bytes = sz.buffer_size as usize * sz.buffers as usize;
    let (srq, srq_keep) = match res.srq {
        Some((shared, reservation)) => {
            (Some((shared, reservation.held.clone())), Some(reservation))
        }
        None => (None, None),
    };
    let large = large::register(&res.pd, cfg, &res.limits, res.iwarp, sz.buffer_size)?;
    let large_bytes = large
        .as_ref()
        .map_or(0, |l| 2 * l.slots as usize * l.slot_size as usize);
    let own_rx_bytes = if srq.is_some() { 0 } else { pool_bytes };
    let pools = Arc::new(Pools {
        // Send-only memory: no access rights beyond the HCA reading it.
        tx: MemoryRegion::placed(&res.pd, pool_bytes, Access::NONE, &cfg.placer)
            .map_err(|e| setup_err("register send pool", e))?,
        // Receive memory: the HCA writes it.
        rx: match srq {
            Some(_) => None,
            None => Some(
                MemoryRegion::placed(&res.pd, pool_bytes, Access::LOCAL_WRITE, &cfg.placer)
                    .map_err(|e| setup_err("register receive pool", e))?,
            ),
        },
        _srq_pool: srq.as_ref().map(|(s, _)| Arc::clone(&s.keep)),
        hdr: if res.iwarp {
            let slots = sz.buffers as usize + sz.sq_depth.max(2) as usize;
            Some(
                MemoryRegion::new(&res.pd, slots * HDR_LEN as usize, Access::LOCAL_WRITE)
                    .map_err(|e| setup_err("register message headers", e))?,
            )
        } else {
            None
        },
        large,
        _registered: [
            RegisteredBytes::new(Registered::Tx, pool_bytes),
            RegisteredBytes::new(Registered::Rx, own_rx_bytes),
            RegisteredBytes::new(Registered::Large, large_bytes),
        ],
    });
    let qres = QpResources {
        pd: Arc::clone(&res.pd),
        send_cq: Arc::clone(&res.cq),
        recv_cq: Arc::clone(&res.cq),
        srq: srq.as_ref().map(|(s, _)| Arc::clone(&s.srq)),
    };
    // Dropped only after the QP is destroyed: CQ entries and SRQ credits come back then.
    let held = Arc::new((res.reservation, srq_keep));
    // iWARP providers refuse an inline size above their limit (soft-iWARP: 80 bytes) and verbs
    // does not report it: step down until the QP is created.
    let inline_tries: &[u32] = if res.iwarp {
        &[REQUEST_INLINE, 64, 32, 16, 0]
    } else {
        &[REQUEST_INLINE]
    };
    let mut created = Ok(());
    for &max_inline_data in inline_tries {
        let cap = QpCapacity {
            max_send_wr: sz.sq_depth,
            max_recv_wr: sz.buffers,
            max_inline_data,
        };
        // iWARP: header + payload, two scatter/gather entries per send and per receive.
        let sges = if res.iwarp { 2 } else { 1 };
        created =
            QueuePair::create_on_cm_id(&mut id, &qres, cap, sges, Box::new(Arc::clone(&held)));
        if created.is_ok() {
            break;
        }
    }
    drop(held);
    created.map_err(|e| setup_err("create QP", e))?;
    let id = Arc::new(id);
    // The QP holds the Arc<CmId>, which destroys it only when the last handle goes.
    let qp = QueuePair::from_cm_id(&id, qres).map_err(|e| setup_err("query QP", e))?;
    // On iWARP the header is part of every inline send.
    let inline_room = match pools.hdr {
        Some(_) => qp.max_inline_data().checked_sub(HDR_LEN),
        None => Some(qp.max_inline_data()),
    };
    let tx_inline = inline_room.map_or(0, |room| {
        room.min(u32::try_from(cfg.inline_threshold.min(INLINE_MAX)).unwrap_or(0))
    });
    let hdr_inline = inline_room.is_some();
    let gen = wr_id::next_generation();
    if let Some(rx) = &pools.rx {
        // Pre-post every receive (iWARP needs them before the connection is established;
        // RoCE/IB need them before the peer's first send anyway).
        // iWARP: each receive scatters the header into its header slot, then the payload
        // into the buffer (so the payload starts at the buffer's first byte, as on RoCE).
        let per = if pools.hdr.is_some() { 2 } else { 1 };
        let mut sges: Vec<Sge> = Vec::with_capacity(sz.buffers as usize * per);
        for i in 0..sz.buffers {
            if let Some(h) = &pools.hdr {
                sges.push(Sge {
                    // SAFETY: i < buffers: inside the header region (buffers + sq_depth slots).
                    addr: unsafe { h.as_ptr().add(i as usize * HDR_LEN as usize) } as u64,
                    length: HDR_LEN,
                    lkey: h.lkey(),
                });
            }
            sges.push(Sge {
                // SAFETY: i < buffers: inside the receive region.
                addr: unsafe { rx.as_ptr().add(i as usize * sz.buffer_size as usize) } as u64,
                length: sz.buffer_size,
                lkey: rx.lkey(),
            });
        }
        let mut wrs: Vec<verbs::RecvWr> =
            (0..sz.buffers).map(|_| verbs::recv_wr_zeroed()).collect();
        let n = wrs.len();
        for i in 0..n {
            wrs[i].wr_id = wr_id::recv_wr_id(gen, i as u32);
            wrs[i].sg_list = &mut sges[i * per];
            wrs[i].num_sge = per as i32;
        }
        for i in 0..n.saturating_sub(1) {
            let next: *mut verbs::RecvWr = &mut wrs[i + 1];
            wrs[i].next = next;
        }
        // SAFETY: a valid chain over receive-pool buffers registered with LOCAL_WRITE; `pools`
        // is kept alive by the connection (and the application's handles) until the QP is
        // destroyed.
        unsafe { qp.post_recv(wrs.as_mut_ptr()) }.map_err(|e| setup_err("pre-post receives", e))?;
    }
    Ok(Pending {
        counters: Arc::clone(&devices.counters[poller.index()]),
        poller,
        qp,
        id,
        cq: res.cq,
        pools,
        srq,
        sizing: sz,
        tx_inline,
        hdr_inline,
        gen,
    })
}

pub(super) fn our_params(p: &Pending) -> FlowParams {
    FlowParams {
        credits: p.sizing.rx_credits,
        buffer_size: p.sizing.buffer_size,
        inline_size: p.qp.max_inline_data(),
    }
}

/// This side's private data for connect/accept: the flow parameters and the large send
/// region ([`large`](super::large)).
pub(super) fn our_private(p: &Pending) -> [u8; PRIVATE_LEN] {
    large::encode(&our_params(p), p.pools.large.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(buffers: usize, srq: usize, credits: usize) -> Config {
        crate::Engine::builder()
            .pool(4096, buffers)
            .rdma_srq(srq)
            .rdma_srq_credits(credits)
            .validate()
            .expect("a valid config")
    }

    #[test]
    fn srq_grant_is_a_share_not_the_pool() {
        // Default: 16, or the buffer count when smaller.
        assert_eq!(sizing(&cfg(256, 4096, 0), None).unwrap().rx_credits, 16);
        assert_eq!(sizing(&cfg(8, 4096, 0), None).unwrap().rx_credits, 8);
        // Asked for: clamped to the buffer count, at least MIN_CREDITS.
        assert_eq!(sizing(&cfg(256, 4096, 4), None).unwrap().rx_credits, 4);
        assert_eq!(sizing(&cfg(32, 4096, 100), None).unwrap().rx_credits, 32);
        assert!(matches!(
            sizing(&cfg(256, 4096, 3), None),
            Err(Error::Setup(crate::error::SetupError::Rdma(
                RdmaSetupError::SrqCredits { count: 3, .. }
            )))
        ));
        // Without an SRQ the grant is the private pool, whatever rdma_srq_credits says.
        assert_eq!(sizing(&cfg(256, 0, 4), None).unwrap().rx_credits, 256);
    }

    #[test]
    fn the_send_queue_follows_the_grant() {
        let srq = sizing(&cfg(256, 4096, 4), None).unwrap();
        let own = sizing(&cfg(256, 0, 0), None).unwrap();
        assert!(srq.sq_depth < own.sq_depth);
        assert!(
            srq.sq_depth > srq.rx_credits,
            "room for a full window of the peer's"
        );
    }
}
