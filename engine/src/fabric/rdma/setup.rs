//! RDMA connection setup: rdma_cm connect/accept, per-device resources (PD, one CQ per poller),
//! registered pools, QP creation on the context rdma_cm resolved, receive pre-posting and the
//! flow-control handshake in the private data. Runs on the control thread (accept, events,
//! teardown; an accept waiting for ESTABLISHED is a [`PendingAccept`] entry, never a wait) or on
//! the thread calling `connect`, never on a poller.

use std::any::Any;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cm::rdma::{
    self as rcm, CmError, CmEvent, CmEventKind, CmId, CmRejectReason, ConnOptions, FlowParams,
    PathInfo,
};

use super::counters::{poller_counters, PollerRdmaCounters};
use super::datapath::{RdmaConn, RdmaConnParts, SrqShared};
use super::error::{AtStep, RdmaSetupError};
use super::header::{HdrParts, HDR_LEN};
use super::verbs::{
    self, Access, CompletionQueue, Context, DeviceLimits, MemoryRegion, ProtectionDomain,
    QpCapacity, QpResources, QueuePair, Sge, SharedReceiveQueue,
};
use crate::config::Config;
use crate::desc::{PoolView, INLINE_MAX};
use crate::error::{Error, FabricError, SetupError};

/// Fewest receive buffers (credits) per connection. With one credit held back for credit
/// messages and credits returned at half the window, smaller windows would make two idle peers
/// bounce credit messages at each other.
pub(crate) const MIN_CREDITS: u32 = 4;

/// How long the listening side waits for ESTABLISHED after accepting. The control thread does
/// not wait: the accepted id is a [`PendingAccept`] entry with this deadline.
pub(crate) const ACCEPT_TIMEOUT: Duration = Duration::from_secs(2);

/// Most accepted requests waiting for ESTABLISHED at once (over every listener); beyond that a
/// request is rejected at once. Bounds what stalled peers can hold.
pub(crate) const MAX_PENDING_ACCEPTS: usize = 1024;
/// Largest CQ created per (device, poller).
const MAX_CQ_ENTRIES: u32 = 1 << 16;
/// Inline size requested from the provider (the engine never sends more inline than
/// [`INLINE_MAX`] bytes; the provider may grant more, and we read back what it granted).
const REQUEST_INLINE: u32 = INLINE_MAX as u32;

// Here rather than in `crate::error`, beside the other `From` impls of `Error`: the whole
// `fabric::rdma` tree is feature-gated already, so this costs no `cfg` line outside it.
impl From<RdmaSetupError> for Error {
    fn from(e: RdmaSetupError) -> Error {
        Error::Setup(SetupError::Rdma(e))
    }
}

/// An [`Error::Setup`] naming the step, with the lower layer's error as its source.
fn setup_err(step: &'static str, e: impl AtStep) -> Error {
    e.at(step).into()
}

/// A share of a CQ's entries, returned when the connection's QP is gone.
struct CqReservation {
    free: Arc<AtomicU32>,
    n: u32,
}

impl Drop for CqReservation {
    fn drop(&mut self) {
        self.free.fetch_add(self.n, Ordering::AcqRel);
    }
}

struct PollerCq {
    cq: Arc<CompletionQueue>,
    /// Entries not reserved by a connection (each reserves receives + send queue depth, so the
    /// CQ can never overflow).
    free: Arc<AtomicU32>,
    /// The poller's SRQ on this device (SRQ mode), created with the first connection.
    srq: Option<SrqRes>,
}

struct SrqRes {
    shared: SrqShared,
    /// Posted SRQ buffers not promised to any connection as credits.
    budget: Arc<AtomicU32>,
}

/// Credits a connection holds on its poller's SRQ. Dropped after the QP is destroyed: gives back
/// the credits minus the buffers the connection still held when it was dropped (those are not
/// posted any more, so they must not be promised again).
struct SrqReservation {
    budget: Arc<AtomicU32>,
    granted: u32,
    held: Arc<AtomicU32>,
}

impl Drop for SrqReservation {
    fn drop(&mut self) {
        let held = self.held.load(Ordering::Acquire).min(self.granted);
        self.budget.fetch_add(self.granted - held, Ordering::AcqRel);
    }
}

/// Creates a poller's SRQ on a device, with its pool of `count` buffers all posted.
fn create_srq(
    pd: &Arc<ProtectionDomain>,
    limits: &DeviceLimits,
    count: u32,
    buffer_size: u32,
) -> Result<SrqRes, Error> {
    if limits.max_srq_wr == 0 {
        return Err(RdmaSetupError::NoSrqSupport.into());
    }
    if count > limits.max_srq_wr {
        return Err(RdmaSetupError::SrqTooLarge {
            count,
            max: limits.max_srq_wr,
        }
        .into());
    }
    let srq = SharedReceiveQueue::new(pd, count).map_err(|e| setup_err("create SRQ", e))?;
    let mr = MemoryRegion::new(
        pd,
        count as usize * buffer_size as usize,
        Access::LOCAL_WRITE,
    )
    .map_err(|e| setup_err("register SRQ pool", e))?;
    let base = std::ptr::NonNull::new(mr.as_ptr())
        .ok_or(RdmaSetupError::NullRegion { what: "SRQ pool" })?;
    let lkey = mr.lkey();
    // SAFETY: the region holds `count * buffer_size` bytes and `keep` (held by every user of
    // the view: the poller's fabric, each connection and each application handle) keeps it.
    let pool = unsafe { PoolView::new(base, buffer_size as usize, count) };
    let shared = SrqShared {
        srq,
        pool,
        lkey,
        keep: Arc::new(mr),
    };
    let all: Vec<u32> = (0..count).collect();
    shared.post(&all).map_err(|e| {
        RdmaSetupError::PostSrq(match e {
            FabricError::Io(errno) => std::io::Error::from_raw_os_error(errno),
            e => std::io::Error::other(e),
        })
    })?;
    Ok(SrqRes {
        shared,
        budget: Arc::new(AtomicU32::new(count)),
    })
}

struct Device {
    ctx: Arc<Context>,
    pd: Arc<ProtectionDomain>,
    limits: DeviceLimits,
    cqs: Vec<Option<PollerCq>>,
}

/// The engine's RDMA devices: one PD per device and one CQ per (device, poller), created on first
/// use on the context rdma_cm resolved. Shared by the control thread and connecting threads.
pub(crate) struct RdmaDevices {
    devices: Mutex<Vec<Device>>,
    pollers: usize,
    /// RDMA connections per poller (set up or being set up).
    loads: Arc<[AtomicUsize]>,
    max_per_poller: usize,
    /// Each poller's RDMA counters (written only by that poller).
    counters: Vec<Arc<PollerRdmaCounters>>,
}

/// A connection's place on a poller; gives it back when dropped.
pub(crate) struct PollerSlot {
    loads: Arc<[AtomicUsize]>,
    index: usize,
}

impl PollerSlot {
    /// The poller's index.
    pub(crate) fn index(&self) -> usize {
        self.index
    }
}

impl Drop for PollerSlot {
    fn drop(&mut self) {
        self.loads[self.index].fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for RdmaDevices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaDevices")
            .field("pollers", &self.pollers)
            .finish_non_exhaustive()
    }
}

/// What one connection gets from [`RdmaDevices::reserve`].
struct Resources {
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    limits: DeviceLimits,
    reservation: CqReservation,
    srq: Option<(SrqShared, SrqReservation)>,
    /// The device is iWARP: credits travel in a header (no immediate data).
    iwarp: bool,
}

impl RdmaDevices {
    /// For an engine with `pollers` pollers (1 in run-to-completion mode).
    pub(crate) fn new(pollers: usize, max_per_poller: usize) -> Self {
        let pollers = pollers.max(1);
        Self {
            devices: Mutex::new(Vec::new()),
            pollers,
            loads: (0..pollers).map(|_| AtomicUsize::new(0)).collect(),
            max_per_poller,
            counters: (0..pollers).map(|_| poller_counters()).collect(),
        }
    }

    /// Picks the least-loaded poller with room for one more connection.
    fn pick_poller(&self) -> Result<PollerSlot, Error> {
        let _guard = self
            .devices
            .lock()
            .map_err(|_| RdmaSetupError::DeviceTablePoisoned)?;
        let (index, load) = self
            .loads
            .iter()
            .enumerate()
            .map(|(i, l)| (i, l.load(Ordering::Acquire)))
            .min_by_key(|&(_, l)| l)
            .ok_or(RdmaSetupError::NoPoller { poller: 0 })?;
        if load >= self.max_per_poller {
            return Err(Error::Setup(SetupError::PollersFull));
        }
        self.loads[index].fetch_add(1, Ordering::AcqRel);
        Ok(PollerSlot {
            loads: Arc::clone(&self.loads),
            index,
        })
    }

    /// Finds or creates the device entry for the context of `id` and the CQ of `poller`, and
    /// reserves `entries` CQ entries.
    /// With `srq = Some((pool buffers, credits, buffer size))`, also creates the poller's SRQ
    /// on this device if needed and reserves `credits` of its buffers.
    fn reserve(
        &self,
        id: &CmId,
        poller: usize,
        entries: u32,
        srq: Option<(u32, u32, u32)>,
    ) -> Result<Resources, Error> {
        let dev = id.device_context().ok_or(RdmaSetupError::NoDevice)?;
        let mut devices = self
            .devices
            .lock()
            .map_err(|_| RdmaSetupError::DeviceTablePoisoned)?;
        let idx = match devices.iter().position(|d| d.ctx.is_cm_device(&dev)) {
            Some(i) => i,
            None => {
                let ctx = Context::from_cm(dev);
                let limits = ctx
                    .query_device()
                    .map_err(|e| setup_err("query device", e))?;
                let pd = ProtectionDomain::new(&ctx).map_err(|e| setup_err("alloc PD", e))?;
                let mut cqs = Vec::new();
                cqs.resize_with(self.pollers, || None);
                devices.push(Device {
                    ctx,
                    pd,
                    limits,
                    cqs,
                });
                devices.len() - 1
            }
        };
        let dev = &mut devices[idx];
        let iwarp = dev.ctx.is_iwarp();
        if iwarp && srq.is_some() {
            // Shared receives would need a header slot per SRQ buffer; not implemented.
            return Err(RdmaSetupError::SrqOnIwarp {
                device: dev.ctx.name().to_owned(),
            }
            .into());
        }
        let slot = dev
            .cqs
            .get_mut(poller)
            .ok_or(RdmaSetupError::NoPoller { poller })?;
        if slot.is_none() {
            let n = dev.limits.max_cqe.clamp(1, MAX_CQ_ENTRIES);
            let cq = CompletionQueue::new(&dev.ctx, n).map_err(|e| setup_err("create CQ", e))?;
            *slot = Some(PollerCq {
                cq,
                free: Arc::new(AtomicU32::new(n)),
                srq: None,
            });
        }
        let pd = Arc::clone(&dev.pd);
        let limits = dev.limits;
        let pcq = slot
            .as_mut()
            .ok_or(RdmaSetupError::Missing { what: "CQ" })?;
        let got = pcq
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
                f.checked_sub(entries)
            });
        if got.is_err() {
            return Err(RdmaSetupError::CqFull {
                poller,
                free: pcq.free.load(Ordering::Acquire),
                need: entries,
            }
            .into());
        }
        let reservation = CqReservation {
            free: Arc::clone(&pcq.free),
            n: entries,
        };
        let srq = match srq {
            None => None,
            Some((count, credits, buffer_size)) => {
                if pcq.srq.is_none() {
                    pcq.srq = Some(create_srq(&pd, &limits, count, buffer_size)?);
                }
                let res = pcq
                    .srq
                    .as_ref()
                    .ok_or(RdmaSetupError::Missing { what: "SRQ" })?;
                if res
                    .budget
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
                        f.checked_sub(credits)
                    })
                    .is_err()
                {
                    return Err(RdmaSetupError::SrqFull {
                        poller,
                        free: res.budget.load(Ordering::Acquire),
                        need: credits,
                    }
                    .into());
                }
                Some((
                    res.shared.clone(),
                    SrqReservation {
                        budget: Arc::clone(&res.budget),
                        granted: credits,
                        held: Arc::new(AtomicU32::new(0)),
                    },
                ))
            }
        };
        Ok(Resources {
            pd,
            cq: Arc::clone(&pcq.cq),
            limits,
            reservation,
            srq,
            iwarp,
        })
    }
}

/// The registered pools of one connection (kept alive by the application's handles too).
struct Pools {
    tx: MemoryRegion,
    /// Own receive pool (None with an SRQ: the receive pool is then the SRQ's).
    rx: Option<MemoryRegion>,
    /// Keeps the SRQ pool alive for the application's views.
    _srq_pool: Option<Arc<dyn Any + Send + Sync>>,
    /// iWARP only: the message headers ([`HDR_LEN`] bytes each), registered with local write:
    /// one receive header per receive buffer, then one send header per send-queue slot.
    hdr: Option<MemoryRegion>,
}

/// Sizes derived from the engine configuration.
#[derive(Debug, Clone, Copy)]
struct Sizing {
    buffer_size: u32,
    buffers: u32,
    sq_depth: u32,
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
    // Sends in flight are bounded by the peer's credits (its buffers, normally = ours), plus
    // unsignalled sends waiting for the next signalled one, plus credit messages.
    let signal = u32::try_from(cfg.signal_every).unwrap_or(u32::MAX).max(1);
    let mut sq_depth = buffers.saturating_add(signal).saturating_add(4);
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
        sq_depth,
    })
}

/// A fully set-up RDMA connection, before it is registered with the engine.
pub(crate) struct Established {
    /// The poller whose CQ the QP uses (the connection must go to that poller).
    pub(crate) poller: PollerSlot,
    pub(crate) conn: RdmaConn,
    pub(crate) tx_pool: PoolView,
    pub(crate) rx_pool: PoolView,
    pub(crate) keep: Arc<dyn Any + Send + Sync>,
    /// The rdma_cm id: its channel fd reports DISCONNECTED / DEVICE_REMOVAL (control thread),
    /// and [`close`] disconnects it.
    pub(crate) id: Arc<CmId>,
    /// The poller's CQ for this device: send [`super::RdmaCommand::AttachCq`] before the
    /// connection (the poller ignores a CQ it already polls).
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

/// Resources of a connection being set up, between QP creation and ESTABLISHED.
struct Pending {
    poller: PollerSlot,
    counters: Arc<PollerRdmaCounters>,
    qp: QueuePair,
    id: Arc<CmId>,
    cq: Arc<CompletionQueue>,
    pools: Arc<Pools>,
    /// SRQ mode: the poller's SRQ and where the connection reports what it still held.
    srq: Option<(SrqShared, Arc<AtomicU32>)>,
    sizing: Sizing,
    tx_inline: u32,
    /// iWARP: whether a header-only send fits inline.
    hdr_inline: bool,
    gen: u16,
}

/// Creates pools and the QP (through rdma_cm, on its resolved context) and pre-posts every
/// receive buffer (or, with an SRQ, reserves credits on the poller's pre-posted SRQ), before
/// connect/accept.
fn prepare(mut id: CmId, devices: &RdmaDevices, cfg: &Config) -> Result<Pending, Error> {
    if !id.has_device() {
        return Err(RdmaSetupError::NoDevice.into());
    }
    let pre = sizing(cfg, None)?;
    let poller = devices.pick_poller()?;
    let srq_req = match u32::try_from(cfg.rdma_srq_buffers) {
        Ok(0) => None,
        Ok(n) => Some((n, pre.buffers, pre.buffer_size)),
        Err(_) => {
            return Err(RdmaSetupError::SrqCountTooLarge {
                count: cfg.rdma_srq_buffers,
            }
            .into())
        }
    };
    let res = devices.reserve(&id, poller.index(), pre.buffers + pre.sq_depth, srq_req)?;
    let sz = sizing(cfg, Some(&res.limits))?;
    let pool_bytes = sz.buffer_size as usize * sz.buffers as usize;
    let (srq, srq_keep) = match res.srq {
        Some((shared, reservation)) => {
            (Some((shared, reservation.held.clone())), Some(reservation))
        }
        None => (None, None),
    };
    let pools = Arc::new(Pools {
        // Send-only memory: no access rights beyond the HCA reading it.
        tx: MemoryRegion::new(&res.pd, pool_bytes, Access::NONE)
            .map_err(|e| setup_err("register send pool", e))?,
        // Receive memory: the HCA writes it.
        rx: match srq {
            Some(_) => None,
            None => Some(
                MemoryRegion::new(&res.pd, pool_bytes, Access::LOCAL_WRITE)
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
    let gen = super::wr_id::next_generation();
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
            wrs[i].wr_id = super::wr_id::recv_wr_id(gen, i as u32);
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

fn our_params(p: &Pending) -> FlowParams {
    FlowParams {
        credits: p.sizing.buffers,
        buffer_size: p.sizing.buffer_size,
        inline_size: p.qp.max_inline_data(),
    }
}

/// Builds the data-path state once ESTABLISHED arrived with the peer's parameters.
fn finish(
    p: Pending,
    peer: FlowParams,
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
        rx_posted: sz.buffers,
        srq: p.srq,
        peer_credits: peer.credits,
        peer_buffer_size: peer.buffer_size,
        rx_inline_threshold: u32::try_from(cfg.inline_threshold.min(INLINE_MAX)).unwrap_or(0),
        tx_inline_threshold: p.tx_inline,
        signal_every: u32::try_from(cfg.signal_every).unwrap_or(u32::MAX),
        sq_depth: sz.sq_depth,
        hdr,
        liveness: cfg.liveness(),
        keep: Arc::clone(&keep),
    });
    Ok(Established {
        poller: p.poller,
        conn,
        tx_pool,
        rx_pool,
        keep,
        id: p.id,
        cq: p.cq,
        srq: srq_attach,
        path,
        peer: peer_addr,
    })
}

fn conn_opts(timeout: Duration) -> ConnOptions {
    // Address and route resolution each get a third of the budget (at most 2 s), so an
    // unreachable host is reported as ADDR_ERROR/ROUTE_ERROR before the overall deadline.
    let ms = i32::try_from(timeout.as_millis() / 3)
        .unwrap_or(i32::MAX)
        .clamp(1, 2000);
    ConnOptions {
        resolve_timeout_ms: ms,
        ..ConnOptions::default()
    }
}

fn map_cm(endpoint: &str, e: CmError) -> Error {
    match e {
        CmError::Timeout { .. } => Error::Timeout,
        e => Error::Connect {
            endpoint: endpoint.to_owned(),
            source: Box::new(e),
        },
    }
}

/// Connects to `host:port` (active side), blocking up to `timeout` in total; runs on the
/// calling application thread. The connection will be served by poller `poller`.
pub(crate) fn connect(
    host: &str,
    port: u16,
    endpoint: &str,
    cfg: &Config,
    devices: &RdmaDevices,
    timeout: Duration,
) -> Result<Established, Error> {
    let deadline = Instant::now() + timeout;
    let opts = conn_opts(timeout);
    let addr = rcm::resolve_host(host, port).map_err(|e| map_cm(endpoint, e))?;
    let id = rcm::resolve(addr, &opts, deadline).map_err(|e| map_cm(endpoint, e))?;
    let pending = prepare(id, devices, cfg)?;
    let (pending, ev) = connect_bounded(pending, opts, deadline, addr, endpoint)?;
    let peer =
        FlowParams::decode(&ev.private_data).map_err(|e| map_cm(endpoint, CmError::from(e)))?;
    pending
        .id
        .channel()
        .set_nonblocking(true)
        .map_err(|e| setup_err("event channel", e))?;
    finish(pending, peer, cfg, &opts, addr.to_string())
}

/// Longest a failed or timed-out connect attempt waits for its teardown (QP and rdma_cm id
/// destruction) before returning anyway; the teardown then finishes on the helper thread.
const TEARDOWN_GRACE: Duration = Duration::from_millis(500);

/// What the connecting helper thread reports.
enum Attempt {
    /// ESTABLISHED: the prepared connection and the event (the peer's private data).
    Established(Box<(Pending, CmEvent)>),
    /// The attempt failed; its QP and id are torn down next, then [`Attempt::TornDown`] follows.
    Failed(CmError),
    /// The failed attempt's QP and id are destroyed.
    TornDown,
}

/// Runs `rdma_connect` and the wait for ESTABLISHED on a helper thread, so that the caller
/// returns by `deadline` (plus [`TEARDOWN_GRACE`]) whatever rdma_cm does: on iWARP
/// (soft-iWARP) `rdma_connect` connects the TCP stream synchronously and blocks for as long
/// as the kernel retries its SYNs (130 s measured with Linux's default `tcp_syn_retries` = 6)
/// when the peer does not answer, and destroying a half-connected id may wait on the driver.
/// On a failure the helper reports the error first and then tears the attempt down; the
/// caller waits for that at most [`TEARDOWN_GRACE`]. When the caller gave up, the helper
/// finishes on its own (bounded by the kernel's connect timeout) and drops the attempt.
fn connect_bounded(
    pending: Pending,
    opts: ConnOptions,
    deadline: Instant,
    addr: std::net::SocketAddr,
    endpoint: &str,
) -> Result<(Pending, CmEvent), Error> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Attempt>(2);
    let private = our_params(&pending).encode();
    std::thread::Builder::new()
        .name("spinwire-rdma-connect".into())
        .spawn(move || {
            let res = pending.id.connect(&opts, &private).and_then(|()| {
                pending
                    .id
                    .wait_for(CmEventKind::Established, deadline, addr)
            });
            match res {
                Ok(ev) => {
                    // If the caller gave up (timed out), the attempt is dropped here.
                    let _ = tx.send(Attempt::Established(Box::new((pending, ev))));
                }
                Err(e) => {
                    let _ = tx.send(Attempt::Failed(e));
                    drop(pending);
                    let _ = tx.send(Attempt::TornDown);
                }
            }
        })
        .map_err(|e| setup_err("spawning the connect thread", e))?;
    let start = Instant::now();
    // rdma_cm's own failures arrive by `deadline`; a little slack lets a result that races the
    // deadline through.
    let wait = deadline.saturating_duration_since(start) + TEARDOWN_GRACE / 5;
    match rx.recv_timeout(wait) {
        Ok(Attempt::Established(b)) => Ok(*b),
        Ok(Attempt::Failed(e)) => {
            // Bounded wait for the teardown, so that resources are normally released on return.
            let _ = rx.recv_timeout(TEARDOWN_GRACE);
            Err(map_cm(endpoint, e))
        }
        Ok(Attempt::TornDown) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(RdmaSetupError::ConnectThreadLost.into())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(map_cm(
            endpoint,
            CmError::Timeout {
                step: "rdma_connect (the kernel is still connecting)",
                waited: start.elapsed(),
            },
        )),
    }
}

/// A listening RDMA endpoint (on the control thread).
pub(crate) struct RdmaListener {
    inner: rcm::CmListener,
    endpoint: String,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaListener")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl RdmaListener {
    /// Binds `host:port` (host must be an address of an RDMA device, or `0.0.0.0`).
    pub(crate) fn bind(host: &str, port: u16, endpoint: &str) -> Result<Self, Error> {
        let lerr = |e: CmError| Error::Listen {
            endpoint: endpoint.to_owned(),
            source: Box::new(e),
        };
        let addr = rcm::resolve_host(host, port).map_err(lerr)?;
        let inner = rcm::CmListener::bind(addr, 128).map_err(lerr)?;
        inner.id().channel().set_nonblocking(true).map_err(lerr)?;
        Ok(Self {
            inner,
            endpoint: endpoint.to_owned(),
        })
    }

    /// The event channel fd to poll (readable when a connection request is pending).
    pub(crate) fn fd(&self) -> RawFd {
        self.inner.id().channel().fd()
    }

    /// Takes one pending connection request, if any: validates it, creates the QP and pools and
    /// accepts it (`busy`: rejects it with [`CmRejectReason::NoResources`] instead). Does not
    /// wait for ESTABLISHED: the returned [`PendingAccept`] is finished by
    /// [`PendingAccept::advance`] when that event arrives on the id's own channel, and fails at
    /// its deadline ([`ACCEPT_TIMEOUT`] from `now`).
    pub(crate) fn try_accept(
        &self,
        cfg: &Config,
        devices: &RdmaDevices,
        busy: bool,
        now: Instant,
    ) -> Result<Option<Box<PendingAccept>>, Error> {
        let aerr = |what: &'static str, e: CmError| setup_err(what, e);
        let Some(req) = self
            .inner
            .get_request(None)
            .map_err(|e| aerr("accept", e))?
        else {
            return Ok(None);
        };
        if busy {
            let _ = req.id.reject(&CmRejectReason::NoResources.encode());
            return Err(RdmaSetupError::AcceptsPending {
                pending: MAX_PENDING_ACCEPTS,
            }
            .into());
        }
        let peer = match FlowParams::decode(&req.private_data) {
            Ok(p) => p,
            Err(e) => {
                let _ = req.id.reject(&CmRejectReason::BadParams.encode());
                return Err(RdmaSetupError::BadRequestParams(e).into());
            }
        };
        if peer.buffer_size as usize != cfg.buffer_size || peer.credits < MIN_CREDITS {
            let _ = req.id.reject(&CmRejectReason::BadParams.encode());
            return Err(RdmaSetupError::RequestRejected {
                peer_size: peer.buffer_size,
                peer_credits: peer.credits,
                ours: cfg.buffer_size,
                min: MIN_CREDITS,
            }
            .into());
        }
        let peer_addr = req
            .id
            .peer_addr()
            .map_or_else(|| "?".to_owned(), |a| a.to_string());
        // On error, dropping the id rejects the request.
        let pending = prepare(req.id, devices, cfg)?;
        // The id's own channel (migrated by `get_request`): read without blocking from here on.
        pending
            .id
            .channel()
            .set_nonblocking(true)
            .map_err(|e| aerr("event channel", e))?;
        let opts = ConnOptions::default();
        pending
            .id
            .accept(&opts, &our_params(&pending).encode())
            .map_err(|e| aerr("accept", e))?;
        let addr = pending
            .id
            .peer_addr()
            .unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
        Ok(Some(Box::new(PendingAccept {
            pending,
            peer,
            peer_addr,
            addr,
            opts,
            deadline: now + ACCEPT_TIMEOUT,
        })))
    }
}

/// An accepted connection request waiting for ESTABLISHED (listening side). The control thread
/// watches [`fd`](Self::fd) (the id's own event channel), calls [`advance`](Self::advance) when
/// it is readable and drops the entry at its [`deadline`](Self::deadline) (destroying the QP and
/// the id). A peer that never completes costs this entry until then, never control-thread time.
pub(crate) struct PendingAccept {
    pending: Pending,
    /// The peer's flow-control parameters from its request (validated).
    peer: FlowParams,
    peer_addr: String,
    addr: std::net::SocketAddr,
    opts: ConnOptions,
    deadline: Instant,
}

/// Where [`PendingAccept::advance`] left an accept.
pub(crate) enum AcceptStep {
    /// No ESTABLISHED yet.
    Pending(Box<PendingAccept>),
    /// Established: the connection is set up.
    Done(Box<Established>),
}

impl PendingAccept {
    /// The event channel to watch for `POLLIN`.
    pub(crate) fn fd(&self) -> RawFd {
        self.pending.id.channel().fd()
    }

    /// When the accept fails if ESTABLISHED has not arrived.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Reads the id's next event without waiting: ESTABLISHED finishes the setup, any other
    /// event fails it, none leaves it pending.
    ///
    /// # Errors
    ///
    /// The failure event's typed error (REJECTED, CONNECT_ERROR, DISCONNECTED, ...), or the
    /// setup's.
    pub(crate) fn advance(self: Box<Self>, cfg: &Config) -> Result<AcceptStep, Error> {
        let what = "waiting for ESTABLISHED";
        match self.pending.id.channel().try_event() {
            Ok(None) => Ok(AcceptStep::Pending(self)),
            Ok(Some(ev)) if ev.kind == CmEventKind::Established => {
                let PendingAccept {
                    pending,
                    peer,
                    peer_addr,
                    opts,
                    ..
                } = *self;
                finish(pending, peer, cfg, &opts, peer_addr).map(|e| AcceptStep::Done(Box::new(e)))
            }
            Ok(Some(ev)) => Err(setup_err(
                what,
                rcm::event_error(&ev, self.addr).unwrap_or(CmError::UnexpectedEvent {
                    expected: CmEventKind::Established.name(),
                    got: ev.kind.name(),
                }),
            )),
            Err(e) => Err(setup_err(what, e)),
        }
    }

    /// The error for an accept whose ESTABLISHED did not come by the deadline.
    pub(crate) fn timed_out(&self) -> Error {
        setup_err(
            "waiting for ESTABLISHED",
            CmError::Timeout {
                step: CmEventKind::Established.name(),
                waited: ACCEPT_TIMEOUT,
            },
        )
    }
}

/// What a connection's rdma_cm events said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnStatus {
    /// Nothing that ends the connection.
    Alive,
    /// The peer disconnected (or its process died).
    Disconnected,
    /// The device went away.
    DeviceRemoved,
}

/// Reads every pending rdma_cm event of an established connection (its channel fd was readable).
pub(crate) fn poll_events(id: &CmId) -> ConnStatus {
    let mut status = ConnStatus::Alive;
    while let Ok(Some(ev)) = id.channel().try_event() {
        match ev.kind {
            CmEventKind::Disconnected => status = ConnStatus::Disconnected,
            CmEventKind::DeviceRemoval => return ConnStatus::DeviceRemoved,
            _ => {}
        }
    }
    status
}

/// Disconnects (if still connected). The QP and pools are released when the last handle
/// (poller's [`RdmaConn`], application's pool views, this id) is dropped.
pub(crate) fn close(id: &CmId) {
    let _ = id.disconnect();
}
