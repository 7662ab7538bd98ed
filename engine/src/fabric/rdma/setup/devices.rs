//! The device table ([`RdmaDevices`]): one PD per device and one CQ per (device, poller),
//! created on first use on the context rdma_cm resolved; poller choice ([`PollerSlot`]), CQ-entry
//! reservations and, in SRQ mode, each poller's shared receive queue and its credit budget.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cm::rdma::CmId;

use super::setup_err;
use crate::desc::PoolView;
use crate::error::{Error, FabricError, SetupError};
use crate::fabric::rdma::counters::{
    poller_counters, PollerRdmaCounters, Registered, RegisteredBytes,
};
use crate::fabric::rdma::datapath::SrqShared;
use crate::fabric::rdma::error::RdmaSetupError;
use crate::fabric::rdma::verbs::{
    Access, CompletionQueue, Context, DeviceLimits, MemoryRegion, ProtectionDomain,
    SharedReceiveQueue,
};

/// Largest CQ created per (device, poller).
const MAX_CQ_ENTRIES: u32 = 1 << 16;

/// A share of a CQ's entries, returned when the connection's QP is gone.
pub(super) struct CqReservation {
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
    /// The SRQ pool's bytes, counted in `RdmaStats::registered_rx_bytes`.
    _registered: RegisteredBytes,
    /// Posted SRQ buffers not promised to any connection as credits.
    budget: Arc<AtomicU32>,
}

/// Credits a connection holds on its poller's SRQ. Dropped after the QP is destroyed: gives back
/// the credits minus the buffers the connection still held when it was dropped (those are not
/// posted any more, so they must not be promised again).
pub(super) struct SrqReservation {
    budget: Arc<AtomicU32>,
    granted: u32,
    pub(super) held: Arc<AtomicU32>,
}

impl SrqReservation {
    /// Grants `credits` of the unpromised posted buffers `budget`, or returns how many are
    /// left when fewer than `credits`. This is the SRQ's admission and the whole of its
    /// invariant: every grant is taken out of `budget` before the connection exists, and
    /// `budget` starts at the buffers posted, so the credits of all the connections on the SRQ
    /// never add up to more than the buffers posted on it (no SEND can find it empty: no RNR).
    pub(super) fn take(budget: &Arc<AtomicU32>, credits: u32) -> Result<SrqReservation, u32> {
        budget.fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| {
            f.checked_sub(credits)
        })?;
        Ok(SrqReservation {
            budget: Arc::clone(budget),
            granted: credits,
            held: Arc::new(AtomicU32::new(0)),
        })
    }
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
        _registered: RegisteredBytes::new(Registered::Rx, count as usize * buffer_size as usize),
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
    pub(super) counters: Vec<Arc<PollerRdmaCounters>>,
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
pub(super) struct Resources {
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) cq: Arc<CompletionQueue>,
    pub(super) limits: DeviceLimits,
    pub(super) reservation: CqReservation,
    pub(super) srq: Option<(SrqShared, SrqReservation)>,
    /// The device is iWARP: credits travel in a header (no immediate data).
    pub(super) iwarp: bool,
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
    pub(super) fn pick_poller(&self) -> Result<PollerSlot, Error> {
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
    pub(super) fn reserve(
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
                let reservation = SrqReservation::take(&res.budget, credits).map_err(|free| {
                    RdmaSetupError::SrqFull {
                        poller,
                        free,
                        need: credits,
                    }
                })?;
                Some((res.shared.clone(), reservation))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The SRQ's grant policy, pure logic: connections come and go (some dying with buffers
    /// the application still holds), and at every step the credits granted plus the budget
    /// never exceed the buffers posted; a connection that does not fit is refused with what is
    /// left; buffers lost with a dead connection are never promised again.
    #[test]
    fn grants_never_exceed_the_posted_buffers() {
        let posted = 64u32;
        let budget = Arc::new(AtomicU32::new(posted));
        let mut live: Vec<SrqReservation> = Vec::new();
        let mut lost = 0u32; // buffers held by the application when their connection died
        let mut seed = 11u64;
        for step in 0..20_000 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let credits = 4 + ((seed >> 40) % 13) as u32;
            if (seed >> 33) % 3 != 0 {
                let free = budget.load(Ordering::Acquire);
                match SrqReservation::take(&budget, credits) {
                    Ok(r) => {
                        assert!(credits <= free, "step {step}: granted beyond the budget");
                        live.push(r);
                    }
                    Err(left) => {
                        assert!(credits > free, "step {step}: refused with room left");
                        assert_eq!(left, free);
                    }
                }
            } else if !live.is_empty() {
                let r = live.swap_remove((seed >> 20) as usize % live.len());
                let held = ((seed >> 50) % 3) as u32;
                // Now and then the application still holds a buffer or two (never more than
                // the connection's grant).
                let held = if lost + held < posted / 4 {
                    held.min(r.granted)
                } else {
                    0
                };
                r.held.store(held, Ordering::Release);
                lost += held;
                drop(r);
            }
            let granted: u32 = live.iter().map(|r| r.granted).sum();
            assert_eq!(
                granted + budget.load(Ordering::Acquire) + lost,
                posted,
                "step {step}: every posted buffer is granted, free or lost, once"
            );
        }
        drop(live);
        assert_eq!(budget.load(Ordering::Acquire) + lost, posted);
    }

    /// Small grants overcommit nothing: 1000 connections of 4 credits fit an SRQ of 4000
    /// buffers, the 1001st is refused, and closing one lets one more in.
    #[test]
    fn small_grants_fit_many_connections_exactly() {
        let budget = Arc::new(AtomicU32::new(4000));
        let mut live: Vec<_> = (0..1000)
            .map(|_| SrqReservation::take(&budget, 4).expect("fits"))
            .collect();
        assert_eq!(SrqReservation::take(&budget, 4).err(), Some(0));
        live.pop();
        assert!(SrqReservation::take(&budget, 4).is_ok());
    }
}
