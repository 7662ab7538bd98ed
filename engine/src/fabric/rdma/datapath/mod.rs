//! RDMA data path: [`RdmaFabric`] (per poller: its completion queues) and [`RdmaConn`] (per
//! connection: one RC queue pair and its registered send/receive pools).
//!
//! Everything here runs on a poller thread: no syscalls (posting and polling are user-space
//! provider calls plus an MMIO doorbell on real NICs), no locks, no allocation, no logging.
//!
//! # Files
//!
//! - this file: [`RdmaFabric`] (per poller): CQ polling in bursts, completions filed with their
//!   connections by QP number.
//! - `conn` ([`RdmaConn`], per connection): the [`FabricConn`] implementation; the send
//!   planning and posting (frames, chains) in `conn/send`, its iWARP header variants in
//!   `conn/iwarp`.
//! - `frame`: frames of coalesced messages, built in place in a send buffer and validated and
//!   split on receive (the [`record`](crate::record) frame format).
//! - `rndv`: the rendezvous on the wire (the peer's large region and the checks of RNDV
//!   records against it, RNDV and acknowledgement frames); `conn/rndv` holds a connection's
//!   rendezvous state ([`rdma`](super#large-messages-rendezvous)).
//! - `chain`: chained receive posting and the poller's shared receive queue ([`SrqShared`]).
//! - Below the data path, in [`rdma`](super): `verbs` (FFI), `wr_id` (the `wr_id` encoding),
//!   `header` (the credit word and iWARP header slots), `counters` ([`RdmaStats`]).
//!
//! # Protocol
//!
//! * Every SEND is one `IBV_WR_SEND_WITH_IMM` and consumes one posted receive buffer at the
//!   peer. The 32-bit immediate carries the credits the sender returns (receive buffers it has
//!   re-posted since the last return) in bits 0..=29; bit 31 marks an explicit *credit message*
//!   (no payload, sent only when traffic is one-way); bit 30 marks a *frame*. A SEND is one of
//!   four things, told apart by those two bits alone: a credit message (bit 31), a frame
//!   (bit 30), a control frame of rendezvous acknowledgements (both) or one message whose
//!   bytes are the whole payload (neither).
//! * Frames: in one [`FabricConn::post_send`] batch, a run of consecutive small
//!   messages (each at most the inline threshold, itself at most [`INLINE_MAX`]) becomes one
//!   frame: a frame header, then one DATA record per message ([`record`](crate::record)),
//!   written in place into the first message's send buffer (the others are copied in and their
//!   buffers freed at once, like inline sends), at most [`EngineBuilder::frame_size`] bytes
//!   and never more than the peer's receive buffer. A lone small message still leaves at once,
//!   unframed (a frame of one would cost both sides a frame to build and parse); a larger
//!   message closes the frame and keeps its own zero-copy SEND, so frames and large messages
//!   stay in FIFO order. The receiver validates the whole frame
//!   before delivering any of it (header, version, `count`, every record a DATA record within
//!   the inline limit or a valid RNDV record, the frame exactly the bytes received; anything
//!   else is a
//!   [`FabricError::Protocol`] of that connection only), then delivers each record as an inline
//!   message; a frame larger than the application's receive ring's room is continued on the
//!   next call (a per-connection cursor), and its buffer is re-posted once every record is out.
//! * iWARP (no immediate data): every SEND is a plain `IBV_WR_SEND` of two gather entries,
//!   a 4-byte header holding the same word (frame bit included, little-endian) from the send's header
//!   slot, then the payload; each receive scatters the header into the buffer's own header slot
//!   and the payload into the buffer, so payloads start at the buffer's first byte and may fill
//!   it, exactly as on RoCE. The receiver validates the header (present, credit messages
//!   without payload, credits not above what it sent). The per-connection `hdr` flag is checked
//!   once per send batch and receive chain (and once per receive completion), so RoCE/IB keep
//!   their path unchanged. A credit message is a header-only SEND and, like every message,
//!   spends a credit: iWARP has no RNR retry, and the credits still guarantee a posted receive
//!   for every SEND.
//! * Credits: each side pre-posts all its receive buffers before connecting and grants that many
//!   credits in the connection's private data. A credit is a *receive buffer*, so it pays for
//!   one SEND (a message, a frame of many, or a credit message). A SEND is posted only with a
//!   credit in hand, so a receive is always posted when a SEND arrives: RNR never happens (and
//!   `rnr_retry = 0` makes any RNR an error completion instead of a stall). The engine's own
//!   credits count messages (`depth`): each returned credit gives the engine back the messages
//!   of the oldest data SEND whose credit was still out (a frame: its record count), after the
//!   connection's own credit messages. One credit is kept in reserve for
//!   credit messages, so two sides flooding each other cannot deadlock. A receiver that owes
//!   credits and has nothing to piggyback them on sends an explicit credit message when the
//!   peer is at or below half its window of receive buffers, or when the messages it took
//!   since the last return reach half its own depth (frames: a whole engine window of
//!   messages may sit in a few buffers; both sides are expected to use the same depth), and,
//!   from the every-few-milliseconds check, when it still owes credits for messages it took
//!   and sent nothing since the last check (a peer with a smaller depth waits at most that
//!   long). Credits owed only for received credit messages are never returned on their own,
//!   so credit messages never ping-pong at idle. Both windows, receive buffers and the engine's
//!   messages, are `crate::flow` types, sized in one place (`conn::credit::Windows`).
//! * SENDs (messages or frames) up to the QP's actual `max_inline_data` go out with
//!   `IBV_SEND_INLINE`: their send buffer is free as soon as the post returns. Larger ones hold
//!   their buffer until a later signalled completion.
//! * Selective signalling: one send in `signal_every` is signalled (and the last one of a batch
//!   when the connection holds many buffers, so a quiet connection does not hoard its pool). A
//!   signalled completion frees every earlier send of that QP (completions are in order).
//! * Doorbell batching: each [`FabricConn::post_send`] batch (up to the engine's `batch`
//!   messages, coalesced into frames where small) is one chain of work requests and one
//!   `ibv_post_send`; released receive buffers are re-posted as one chain per call.
//! * Liveness ([`FabricConn::check_peer`], every few milliseconds by the coarse clock): a
//!   connection that sent nothing for a quarter of the liveness timeout sends a *heartbeat*, an
//!   explicit credit message (so it spends a credit and always finds a posted receive); only
//!   SENDs count as sending: the rendezvous READs of a long pull are served by the peer's HCA
//!   and its engine sees none of them, so the puller keeps sending heartbeats. A connection
//!   that received nothing (no message, heartbeat or credit message; a completed READ counts)
//!   for the timeout while the peer had credits fails with
//!   [`FabricError::PeerUnresponsive`]. The receive completion count is a plain field; nothing
//!   is added per message beyond that increment.
//! * Completions of QPs not attached: the accepting side's QP can receive before its poller
//!   attached the connection (the peer got ESTABLISHED first and sent at once, while this
//!   side's control thread had not handled its ESTABLISHED or the poller not yet taken the
//!   attach command). A successful receive completion whose QP no attached connection owns is
//!   therefore *parked* in a preallocated per-poller FIFO (`park`, 4096 entries) and offered
//!   again at the start of the first `poll_shared` after a connection is attached (and every
//!   `ReplayGate::AGE_EVERY` polls, for their ageing), oldest first and before the CQ is
//!   polled, so it reaches its connection once attached, ahead of anything newer of that QP.
//!   One that waits longer than `PARK_MAX_AGE` (its connection never came), or whose QP now
//!   belongs to a connection that does not own its `wr_id`, is dropped as stale (a shared
//!   receive buffer goes back to the SRQ); one that finds the FIFO full is dropped and counted
//!   ([`RdmaStats`]: `parked_completions`, `replayed_completions`, `park_overflows`). Other
//!   completions of unknown QPs (sends, errors, flushes of connections already detached) are
//!   stale at once. With nothing parked the hot path pays one `is_empty` check per cycle; with
//!   something parked, a countdown between looks.
//! * A completion error fails only its connection ([`FabricError::Io`] with the `ibv_wc_status`
//!   code, or [`FabricError::PeerClosed`] for a flush after the peer disconnected); the poller and
//!   the other connections keep running.
//! * Closing ([`FabricConn::settled`]): a connection the application closed stays on its poller
//!   until nothing it queued is left, every large message it sent was pulled and every posted
//!   work request completed (a signalled credit message behind unsignalled sends reports them),
//!   so that the disconnect that follows flushes nothing the peer would have received. When the
//!   peer disconnects (rdma_cm's DISCONNECTED, seen by the control thread), the poller delivers
//!   what the CQ still holds of its sends before it reports the disconnect.
//!
//! [`FabricConn`]: crate::fabric::FabricConn
//! [`INLINE_MAX`]: crate::INLINE_MAX
//! [`EngineBuilder::frame_size`]: crate::EngineBuilder::frame_size
//! [`FabricError::Protocol`]: crate::FabricError::Protocol
//! [`FabricConn::post_send`]: crate::fabric::FabricConn::post_send
//! [`FabricConn::check_peer`]: crate::fabric::FabricConn::check_peer
//! [`FabricConn::settled`]: crate::fabric::FabricConn::settled
//! [`FabricError::PeerUnresponsive`]: crate::FabricError::PeerUnresponsive
//! [`FabricError::Io`]: crate::FabricError::Io
//! [`FabricError::PeerClosed`]: crate::FabricError::PeerClosed

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::fabric::rdma::counters::{bump, COUNTERS};
use crate::fabric::rdma::verbs::{CompletionQueue, WcSlot, WorkCompletion};
use crate::fabric::rdma::wr_id::{WR_SRQ, WR_VALUE_MASK};
use crate::fabric::{ConnTable, Fabric, WaitSet};

mod chain;
mod conn;
mod frame;
mod park;
mod rndv;

use park::{Parking, ReplayGate};

pub use chain::SrqShared;
pub use conn::RdmaConn;
pub(crate) use conn::RdmaConnParts;
pub(crate) use conn::{ack_scratch_size, LargeParts, ACK_BUFS, READ_WINDOW, RNDV_SCRATCH};
pub(crate) use rndv::{LargeRegion, MAX_LARGE_SLOTS, RNDV_FRAME};
// Also reachable here, as before the counters moved to their own file.
#[doc(no_inline)]
pub use crate::fabric::rdma::counters::{stats, RdmaStats};

/// Completions polled per `ibv_poll_cq` call (a stack array).
pub const CQ_BURST: usize = 32;
/// Bursts per CQ per cycle, so one busy CQ cannot starve the connections' service step.
const BURSTS_PER_CYCLE: usize = 4;
/// Entries of a poller's QP-number -> slot cache (direct mapped).
const QPN_CACHE: usize = 4096;
/// Receive completions of not-yet-attached QPs one poller can park (preallocated, about 72
/// bytes each; a burst of connections each receiving a few SENDs before their attach fits).
const PARK_CAPACITY: usize = 4096;
/// How long a parked completion waits for its QP's connection before it is dropped as stale
/// (a QP that never gets attached: its connection failed or closed first). Generous: on a
/// loaded control thread (TCG VM, hundreds of connects) the attach can trail ESTABLISHED by
/// seconds.
const PARK_MAX_AGE: Duration = Duration::from_secs(10);

/// A receive completion parked until its QP's connection is attached.
struct Parked {
    wc: WorkCompletion,
    /// Index of its CQ in [`RdmaFabric::cqs`] (for the SRQ to give a dropped buffer back to).
    dev: u8,
    /// When it was polled.
    at: Instant,
}

/// A command from the control thread to a poller's RDMA state.
#[derive(Debug)]
#[non_exhaustive]
pub enum RdmaCommand {
    /// Poll this completion queue (of a device the poller has not served yet); with the
    /// poller's shared receive queue on that device, if SRQ is on.
    AttachCq(Arc<CompletionQueue>, Option<SrqShared>),
}

/// Per-poller RDMA state: the completion queues of the devices this poller serves (one CQ per
/// device, shared by all the poller's connections on it, for sends and receives).
pub struct RdmaFabric {
    cqs: Vec<(Arc<CompletionQueue>, Option<SrqShared>)>,
    /// QP number -> connection slot, direct mapped, verified on every hit.
    qpn_cache: Box<[(u32, u32)]>,
    /// The last `poll_shared` left completions in a CQ (it stopped at its bound).
    backlog: bool,
    /// Receive completions of QPs not attached yet, in arrival order.
    parked: Parking<Parked>,
    /// When `parked` is worth a look.
    gate: ReplayGate,
}

impl std::fmt::Debug for RdmaFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaFabric")
            .field("cqs", &self.cqs.len())
            .field("parked", &!self.parked.is_empty())
            .finish()
    }
}

impl Default for RdmaFabric {
    fn default() -> Self {
        Self::new()
    }
}

impl RdmaFabric {
    /// Most devices one poller serves.
    pub const MAX_DEVICES: usize = 8;

    /// A poller state with no CQ yet (the control thread attaches one per device).
    pub fn new() -> Self {
        Self {
            cqs: Vec::with_capacity(Self::MAX_DEVICES),
            qpn_cache: vec![(u32::MAX, u32::MAX); QPN_CACHE].into_boxed_slice(),
            backlog: false,
            parked: Parking::new(PARK_CAPACITY),
            gate: ReplayGate::new(),
        }
    }

    /// The slot of the connection owning QP `qpn`: the cache, else a scan of the table (once
    /// per new connection).
    #[inline]
    fn lookup<'c>(
        cache: &mut [(u32, u32)],
        conns: &'c mut ConnTable<'_, RdmaConn>,
        qpn: u32,
    ) -> Option<&'c mut RdmaConn> {
        let e = qpn as usize % QPN_CACHE;
        let (cached_qpn, cached_slot) = cache[e];
        let slot = if cached_qpn == qpn
            && conns
                .get_mut(cached_slot)
                .is_some_and(|c| c.qp.qp_num() == qpn)
        {
            cached_slot
        } else {
            let found = (0..conns.len() as u32)
                .find(|&s| conns.get_mut(s).is_some_and(|c| c.qp.qp_num() == qpn))?;
            cache[e] = (qpn, found);
            found
        };
        conns.get_mut(slot)
    }

    /// Drops a completion no attached connection owns: counted; a shared receive buffer it
    /// consumed goes back to the SRQ.
    #[cold]
    fn stale(srq: Option<&SrqShared>, wc: &WorkCompletion) {
        bump(&COUNTERS.stale_completions, 1);
        if let Some(srq) = srq {
            let id = wc.wr_id();
            if id & WR_SRQ != 0 {
                let buf = (id & WR_VALUE_MASK) as u32;
                if srq.post(&[buf]).is_err() {
                    bump(&COUNTERS.completion_errors, 1);
                }
            }
        }
    }

    /// Offers every parked completion, oldest first, to the connection now owning its QP:
    /// delivered if there is one, dropped as stale if a connection has the QP but not that
    /// `wr_id` (an older connection's) or if it waited longer than [`PARK_MAX_AGE`], kept
    /// otherwise. Returns the completions handled.
    #[cold]
    #[inline(never)]
    fn replay(&mut self, conns: &mut ConnTable<'_, RdmaConn>) -> usize {
        // One clock read per cycle, only while something is parked (connection setup): a vDSO
        // read, no syscall with the usual TSC clocksource.
        let now = Instant::now();
        let cache = &mut self.qpn_cache;
        let cqs = &self.cqs;
        // A QP found unattached in this pass: its later entries skip the table scan.
        let mut missing = None;
        let mut replayed = 0;
        let handled = self.parked.drain_in_order(|p| {
            let qpn = p.wc.qp_num();
            if missing != Some(qpn) {
                match Self::lookup(cache, conns, qpn) {
                    Some(c) if c.owns(p.wc.wr_id()) => {
                        c.on_completion(&p.wc);
                        replayed += 1;
                        return true;
                    }
                    Some(_) => {
                        Self::stale(cqs[usize::from(p.dev)].1.as_ref(), &p.wc);
                        return true;
                    }
                    None => missing = Some(qpn),
                }
            }
            if now.saturating_duration_since(p.at) > PARK_MAX_AGE {
                Self::stale(cqs[usize::from(p.dev)].1.as_ref(), &p.wc);
                return true;
            }
            false
        });
        if replayed > 0 {
            bump(&COUNTERS.replayed_completions, replayed);
        }
        handled
    }
}

impl Fabric for RdmaFabric {
    const NAME: &'static str = "rdma";
    /// Every connection's completions come through the poller's CQ.
    const SHARED_COMPLETIONS: bool = true;
    type Conn = RdmaConn;
    type Command = RdmaCommand;

    #[inline]
    fn conn_attached(&mut self) {
        self.gate.attached();
    }

    fn on_command(&mut self, command: RdmaCommand) {
        match command {
            RdmaCommand::AttachCq(cq, srq) => {
                if !self.cqs.iter().any(|(c, _)| Arc::ptr_eq(c, &cq))
                    && self.cqs.len() < Self::MAX_DEVICES
                {
                    self.cqs.push((cq, srq));
                }
            }
        }
    }

    #[inline(always)]
    fn poll_shared(&mut self, conns: &mut ConnTable<'_, RdmaConn>) -> usize {
        let mut work = 0;
        // Completions parked last cycles go first, before anything newer of their QP: looked
        // at once a connection was attached since (no completion of a QP attached later can
        // have been filed yet: the attach precedes its first poll), and now and then for their
        // ageing.
        if !self.parked.is_empty() && self.gate.due() {
            work += self.replay(conns);
        }
        let mut slots = [const { WcSlot::uninit() }; CQ_BURST];
        let mut backlog = false;
        let mut now = None;
        for (dev, (cq, srq)) in self.cqs.iter().enumerate() {
            for burst in 0..BURSTS_PER_CYCLE {
                let Ok(wcs) = cq.poll(&mut slots) else {
                    bump(&COUNTERS.completion_errors, 1);
                    break;
                };
                let n = wcs.len();
                for wc in wcs {
                    match Self::lookup(&mut self.qpn_cache, conns, wc.qp_num()) {
                        Some(c) if c.owns(wc.wr_id()) => c.on_completion(wc),
                        None if wc.is_ok() && wc.is_recv() => {
                            // A receive of a QP not attached yet: park it (rare: only in the
                            // window between the peer's ESTABLISHED and this side's attach).
                            let at = *now.get_or_insert_with(Instant::now);
                            let p = Parked {
                                wc: wc.clone(),
                                dev: dev as u8,
                                at,
                            };
                            match self.parked.push(p) {
                                Ok(()) => bump(&COUNTERS.parked_completions, 1),
                                Err(p) => {
                                    bump(&COUNTERS.park_overflows, 1);
                                    Self::stale(srq.as_ref(), &p.wc);
                                }
                            }
                        }
                        _ => Self::stale(srq.as_ref(), wc),
                    }
                }
                work += n;
                if n < CQ_BURST {
                    break;
                }
                backlog |= burst + 1 == BURSTS_PER_CYCLE;
            }
        }
        self.backlog = backlog;
        work
    }

    /// The last poll stopped at [`BURSTS_PER_CYCLE`] full bursts of some CQ.
    #[inline]
    fn backlog(&self) -> bool {
        self.backlog
    }

    /// Arms every CQ's completion channel and adds its descriptor, then polls the CQs once
    /// more (a completion that came before the arming raises no event): anything found is
    /// filed and the poller does not sleep. A CQ without a channel bounds the sleep to
    /// [`WaitSet::POLL_INTERVAL`].
    fn arm(&mut self, conns: &mut ConnTable<'_, RdmaConn>, set: &mut WaitSet) -> bool {
        for (cq, _) in &self.cqs {
            match (cq.channel_fd(), cq.req_notify()) {
                (Some(fd), Ok(())) => set.add(fd, true, false),
                _ => set.limit(WaitSet::POLL_INTERVAL),
            }
        }
        self.poll_shared(conns) == 0 && !self.backlog
    }

    /// Takes and acknowledges the channels' events.
    fn woke(&mut self) {
        for (cq, _) in &self.cqs {
            cq.take_events();
        }
    }
}
