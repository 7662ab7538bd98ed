//! Per connection: [`RdmaConn`] (one RC queue pair, its registered send and receive pools and
//! its credit state) and the [`FabricConn`] implementation: chained sends, receive completions
//! filed by the poller, re-posting of receive buffers in chains, credit returns. The iWARP
//! header variants of posting live in `iwarp`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::chain::{post_recv_chains, SrqShared, CHAIN};
use super::frame::{frame_limit, FrameCursor};
use super::rndv::Rndv;
use crate::desc::{is_large, large_slot, PoolView, TxDesc};
use crate::error::FabricError;
use crate::fabric::rdma::counters::{bump, PollerRdmaCounters, COUNTERS};
use crate::fabric::rdma::header::{
    read_hdr, HdrParts, IMM_CREDITS_MAX, IMM_CREDIT_ONLY, IMM_FRAME,
};
use crate::fabric::rdma::verbs::{self, QueuePair, SendWr, Sge, WorkCompletion};
use crate::fabric::rdma::wr_id::{recv_wr_id, WR_GEN_SHIFT, WR_RECV, WR_SRQ, WR_VALUE_MASK};
use crate::fabric::{FabricConn, RxSink, TxDone};
use crate::record::Record;

mod fifo;
mod iwarp;
mod rndv;
mod send;

use fifo::Fifo;
use rndv::Large;
pub(crate) use rndv::{ack_scratch_size, LargeParts, ACK_BUFS, READ_WINDOW, RNDV_SCRATCH};

/// What one received buffer holds.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
enum RxKind {
    /// One message (`len` bytes at the buffer's start).
    #[default]
    Message,
    /// An explicit credit message (no payload) or a failed shared receive to give back.
    Credit,
    /// A frame of DATA and RNDV records ([`IMM_FRAME`]), split by [`FrameCursor`].
    Frame,
}

/// One SEND of a [`FabricConn::post_send`] batch, planned before any work request is built:
/// a message left in its buffer, or a frame written into the first framed message's buffer.
#[derive(Clone, Copy, Default)]
struct Planned {
    /// The send buffer (the message's, or the frame's: its first message's buffer).
    buf: u32,
    /// Bytes to send.
    len: u32,
    /// A frame ([`IMM_FRAME`]).
    frame: bool,
    /// The batch's descriptors it carries: `first .. first + msgs`.
    first: u16,
    msgs: u16,
    /// A large message's RNDV frame (`buf` is `LARGE_BIT | slot`; the frame is in the slot's
    /// scratch, and the slot waits for the peer's acknowledgement).
    rndv: bool,
}

/// One send to build.
#[derive(Clone, Copy)]
struct Outgoing {
    addr: u64,
    len: u32,
    imm: u32,
    inline: bool,
    force_signal: bool,
}

/// Everything [`RdmaConn::new`] needs, produced by the setup code.
pub(crate) struct RdmaConnParts {
    /// The connected QP (its owner, the rdma_cm id, is kept alive inside).
    pub(crate) qp: QueuePair,
    /// The generation the pre-posted receives were tagged with ([`recv_wr_id`]).
    pub(crate) gen: u16,
    /// Send pool (registered, no remote access).
    pub(crate) tx_pool: PoolView,
    /// lkey of the send pool's memory region.
    pub(crate) tx_lkey: u32,
    /// Receive pool (registered with local write).
    pub(crate) rx_pool: PoolView,
    /// lkey of the receive pool's memory region.
    pub(crate) rx_lkey: u32,
    /// Receive buffers already posted (indices `0..posted`), before connecting.
    pub(crate) rx_posted: u32,
    /// The poller's shared receive queue (the receive pool is then its pool) and where to
    /// report, when the connection is dropped, how many SRQ buffers it still held.
    pub(crate) srq: Option<(SrqShared, Arc<AtomicU32>)>,
    /// The counters of the poller that will serve the connection.
    pub(crate) counters: Arc<PollerRdmaCounters>,
    /// Credits the peer granted us (its posted receives), validated by setup.
    pub(crate) peer_credits: u32,
    /// Largest message the peer can receive (its buffer size), validated by setup.
    pub(crate) peer_buffer_size: u32,
    /// Messages up to this size are delivered inline to the application (copied into the
    /// descriptor) and their receive buffer re-posted at once.
    pub(crate) rx_inline_threshold: u32,
    /// Messages up to this size are sent with `IBV_SEND_INLINE` (already capped by the QP's
    /// actual inline size).
    pub(crate) tx_inline_threshold: u32,
    /// Signal one send in this many.
    pub(crate) signal_every: u32,
    /// Send queue depth of the QP.
    pub(crate) sq_depth: u32,
    /// iWARP (no immediate data): the header slots. `None` on RoCE/InfiniBand.
    pub(crate) hdr: Option<HdrParts>,
    /// The liveness timeout (`None`: off); heartbeats go out every quarter of it.
    pub(crate) liveness: Option<Duration>,
    /// The engine's credits per connection (`EngineBuilder::depth`).
    pub(crate) depth: u32,
    /// Largest frame to coalesce small messages into (`EngineBuilder::frame_size`), further
    /// bounded by the buffer sizes; below two records' room, coalescing is off.
    pub(crate) frame_size: usize,
    /// Large messages (rendezvous); [`LargeParts::none`] without.
    pub(crate) large: LargeParts,
    /// Keeps the pools' memory regions alive.
    pub(crate) keep: Arc<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for RdmaConnParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaConnParts")
            .field("qp", &self.qp)
            .finish_non_exhaustive()
    }
}

/// The data-path state of one RDMA connection.
pub struct RdmaConn {
    /// First field: dropped first, so the QP is gone before the pools' regions.
    pub(super) qp: QueuePair,
    /// `gen << WR_GEN_SHIFT`, or-ed into every wr_id.
    tag: u64,
    gen: u16,
    // ---- send side
    tx_pool: PoolView,
    tx_lkey: u32,
    tx_inline: u32,
    peer_buffer_size: u32,
    signal_every: u32,
    unsignalled: u32,
    sq_depth: u32,
    sq_posted: u64,
    sq_completed: u64,
    /// Non-inline send buffers posted and not yet known complete: (sequence, buffer).
    held: Fifo<(u64, u32)>,
    /// Sends allowed before the peer runs out of posted receives.
    peer_credits: u32,
    /// Credits kept for explicit credit messages.
    reserve: u32,
    /// Messages sent whose credit has not come back (validates the peer's returns).
    uncredited: u64,
    /// Control SENDs (credit messages, acknowledgement frames) sent whose credits have not
    /// come back yet (not the engine's).
    ctrl_outstanding: u64,
    /// Per data SEND whose credit has not come back, oldest first: how many of the engine's
    /// messages it carried (1, or a frame's record count). A returned credit (one receive
    /// buffer re-posted) gives the engine the messages of the oldest such SEND.
    sent_msgs: Fifo<u16>,
    /// Frame limit in bytes (0: coalescing off), see [`frame_limit`].
    frame_limit: u32,
    /// Messages up to this size are coalesced into frames (the inline threshold, at most
    /// `INLINE_MAX`: the receiver copies records into its descriptors).
    frame_record_max: u32,
    /// Credits to report to the engine at the next `reclaim`.
    engine_credits: u64,
    // ---- receive side
    rx_pool: PoolView,
    rx_lkey: u32,
    rx_inline: u32,
    /// Received, not yet delivered: (buffer, length, kind).
    rx_pending: Fifo<(u32, u32, RxKind)>,
    /// The frame being delivered (validated; its buffer is re-posted once every record is out).
    rx_frame: Option<FrameCursor>,
    /// Receive buffers re-posted whose credits the peer has not been given yet.
    owed: u32,
    /// Messages whose receive buffers were re-posted (or, in a frame, delivered) since the
    /// credits were last returned in full (the peer's engine counts messages, not buffers).
    owed_msgs: u64,
    /// Return credits explicitly once `owed_msgs` reaches this: half our depth (both sides
    /// are expected to use the same depth, as the same buffer size).
    credit_msgs: u64,
    /// How many more messages the peer may send us, as far as we know (<= its actual credits).
    peer_window: u32,
    low_water: u32,
    error: Option<FabricError>,
    srq: Option<SrqShared>,
    /// SRQ buffers this connection received into and has not re-posted yet.
    srq_held: u32,
    srq_held_out: Option<Arc<AtomicU32>>,
    /// This connection's poller's counters (written only by that poller).
    counters: Arc<PollerRdmaCounters>,
    /// iWARP: credits travel in a header instead of immediate data (checked once per batch).
    hdr: Option<HdrParts>,
    // ---- liveness (poller-owned plain fields; touched once per receive completion and in
    // `check_peer`, never with an atomic)
    /// Liveness timeout in ns; 0: off.
    liveness_ns: u64,
    /// Receive completions so far (any message, heartbeats and credit messages included).
    rx_heard: u64,
    /// `rx_heard` and the coarse time when `check_peer` last saw it move (`None`: not yet).
    heard: Option<(u64, u64)>,
    /// `sq_posted` and the coarse time when `check_peer` last saw it move (`None`: not yet).
    sent: Option<(u64, u64)>,
    /// Coarse time of the last `check_peer`.
    checked_ns: u64,
    /// `sq_posted` at the last `check_peer` (idle credit returns).
    checked_sq: u64,
    /// Rendezvous state (large messages).
    large: Large,
    _keep: Arc<dyn std::any::Any + Send + Sync>,
}

// The raw pointers inside (PoolView, QueuePair) are Send already; RdmaConn is Send by its fields.

impl std::fmt::Debug for RdmaConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaConn")
            .field("qp", &self.qp)
            .field("peer_credits", &self.peer_credits)
            .field("owed", &self.owed)
            .field("peer_window", &self.peer_window)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl RdmaConn {
    /// Builds the data-path state of an established connection (control thread).
    pub(crate) fn new(p: RdmaConnParts) -> Self {
        let gen = p.gen;
        let reserve = u32::from(p.peer_credits >= 2);
        Self {
            qp: p.qp,
            tag: u64::from(gen) << WR_GEN_SHIFT,
            gen,
            tx_pool: p.tx_pool,
            tx_lkey: p.tx_lkey,
            tx_inline: p.tx_inline_threshold,
            peer_buffer_size: p.peer_buffer_size,
            signal_every: p.signal_every.max(1),
            unsignalled: 0,
            sq_depth: p.sq_depth.max(2),
            sq_posted: 0,
            sq_completed: 0,
            held: Fifo::new(p.tx_pool.count() as usize),
            peer_credits: p.peer_credits,
            reserve,
            uncredited: 0,
            ctrl_outstanding: 0,
            sent_msgs: Fifo::new(p.peer_credits as usize),
            frame_limit: frame_limit(p.frame_size, p.peer_buffer_size, p.tx_pool.buf_size()),
            frame_record_max: p.rx_inline_threshold.min(crate::desc::INLINE_MAX as u32),
            engine_credits: 0,
            rx_pool: p.rx_pool,
            rx_lkey: p.rx_lkey,
            rx_inline: p.rx_inline_threshold,
            rx_pending: Fifo::new(p.rx_posted as usize),
            rx_frame: None,
            owed: 0,
            owed_msgs: 0,
            credit_msgs: u64::from(p.depth / 2).max(1),
            peer_window: p.rx_posted,
            low_water: (p.rx_posted / 2).max(1),
            error: None,
            srq_held: 0,
            srq_held_out: p.srq.as_ref().map(|(_, h)| Arc::clone(h)),
            srq: p.srq.map(|(s, _)| s),
            counters: p.counters,
            hdr: p.hdr,
            liveness_ns: p
                .liveness
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            rx_heard: 0,
            heard: None,
            sent: None,
            checked_ns: 0,
            checked_sq: 0,
            large: Large::new(p.large, p.peer_buffer_size),
            _keep: p.keep,
        }
    }

    /// Whether `wr_id` belongs to this connection (its generation, or a shared SRQ buffer).
    #[inline]
    pub(super) fn owns(&self, wr_id: u64) -> bool {
        if wr_id & WR_SRQ != 0 {
            // Shared buffers: the QP number already identified the connection.
            return self.srq.is_some();
        }
        (wr_id >> WR_GEN_SHIFT) as u16 == self.gen
    }

    /// Files one completion of this connection (called from
    /// [`Fabric::poll_shared`](crate::fabric::Fabric::poll_shared)).
    #[inline]
    pub(super) fn on_completion(&mut self, wc: &WorkCompletion) {
        let is_srq_recv = wc.wr_id() & WR_SRQ != 0;
        if is_srq_recv {
            self.srq_held += 1;
        }
        if !wc.is_ok() {
            if is_srq_recv {
                // The shared buffer must go back to the SRQ: queue it as a no-payload entry.
                let buf = (wc.wr_id() & WR_VALUE_MASK) as u32;
                if !self.rx_pending.push((buf, 0, RxKind::Credit)) {
                    self.error = Some(FabricError::Protocol("more receives completed than posted"));
                }
            }
            bump(&COUNTERS.completion_errors, 1);
            let status = wc.status();
            if status == verbs::WC_RNR_RETRY_EXC_ERR {
                bump(&COUNTERS.rnr_errors, 1);
            }
            if self.error.is_none() {
                self.error = Some(if status == verbs::WC_WR_FLUSH_ERR {
                    FabricError::PeerClosed
                } else {
                    FabricError::Io(status as i32)
                });
            }
            return;
        }
        let value = wc.wr_id() & WR_VALUE_MASK;
        if wc.wr_id() & WR_RECV != 0 {
            // RoCE/IB: the word is the immediate; iWARP: the header the peer sent.
            let (imm, len) = match &self.hdr {
                None => match wc.imm() {
                    Some(imm) => (imm, wc.byte_len()),
                    None => {
                        self.error = Some(FabricError::Protocol("receive without immediate"));
                        return;
                    }
                },
                Some(h) => match read_hdr(h, value as u32, wc.byte_len()) {
                    Some(v) => v,
                    None => {
                        self.error = Some(FabricError::Protocol(
                            "receive with a missing or malformed header",
                        ));
                        return;
                    }
                },
            };
            let credits = imm & IMM_CREDITS_MAX;
            self.rx_heard += 1;
            let (kind, control) = match (imm & IMM_CREDIT_ONLY != 0, imm & IMM_FRAME != 0) {
                (false, false) => (RxKind::Message, false),
                (true, false) => (RxKind::Credit, false),
                (false, true) => (RxKind::Frame, false),
                // A control frame: rendezvous acknowledgements, handled here; its buffer is
                // then re-posted like a credit message's.
                (true, true) => (RxKind::Credit, true),
            };
            self.add_peer_credits(credits);
            self.peer_window = self.peer_window.saturating_sub(1);
            if (kind != RxKind::Credit || control) && len > self.rx_pool.buf_size() as u32 {
                self.error = Some(FabricError::Protocol("oversized receive"));
                return;
            }
            if control {
                let pool = self.rx_pool;
                // SAFETY: the receive completed with `len <= buf_size` bytes (checked above)
                // into buffer `value`, which stays ours until it is re-posted from `rx_pending`.
                let bytes = unsafe { rx_bytes(&pool, value as u32, len) };
                if let Err(e) = self.on_ack_frame(bytes) {
                    self.error = Some(e);
                }
            }
            // Cannot overflow: at most `rx_posted` receives are outstanding.
            if !self.rx_pending.push((value as u32, len, kind)) {
                self.error = Some(FabricError::Protocol("more receives completed than posted"));
            }
        } else {
            // A signalled send: it and every earlier send of this QP are complete. Rebuild the
            // full sequence from the 46 bits carried.
            let low = value;
            let back = (self.sq_posted.wrapping_sub(1).wrapping_sub(low)) & WR_VALUE_MASK;
            let seq = self.sq_posted.wrapping_sub(1).wrapping_sub(back);
            self.sq_completed = self.sq_completed.max(seq + 1);
            if wc.is_rdma_read() {
                // A rendezvous READ chunk: its large message may be complete now. The peer's
                // HCA answered, so the peer is alive (liveness).
                self.rx_heard += 1;
                if let Err(e) = self.large.read_done() {
                    self.error.get_or_insert(e);
                }
            }
        }
    }

    #[inline]
    fn add_peer_credits(&mut self, credits: u32) {
        if credits == 0 {
            return;
        }
        // A peer can only return credits for messages we sent it.
        if u64::from(credits) > self.uncredited {
            self.error = Some(FabricError::Protocol(
                "peer returned more credits than messages it received",
            ));
            return;
        }
        self.uncredited -= u64::from(credits);
        self.peer_credits = self.peer_credits.saturating_add(credits);
        // Credits first cover our own credit messages, then the engine's data SENDs, oldest
        // first, each giving back the messages it carried (a frame: its records). Every data
        // SEND is in `sent_msgs` until its credit is back, so the pops cannot run dry.
        let mut n = u64::from(credits);
        let ctrl = n.min(self.ctrl_outstanding);
        self.ctrl_outstanding -= ctrl;
        n -= ctrl;
        for _ in 0..n {
            match self.sent_msgs.pop() {
                Some(m) => self.engine_credits += u64::from(m),
                None => {
                    self.error = Some(FabricError::Protocol(
                        "peer returned more credits than messages it received",
                    ));
                    return;
                }
            }
        }
    }

    /// Send-queue slots free.
    #[inline]
    fn sq_room(&self) -> u64 {
        u64::from(self.sq_depth).saturating_sub(self.sq_posted - self.sq_completed)
    }

    /// Fills `wr`/`sge` for one send and assigns its sequence number.
    #[inline]
    fn fill_send(&mut self, wr: &mut SendWr, sge: &mut Sge, out: Outgoing) {
        let Outgoing {
            addr,
            len,
            imm,
            inline,
            force_signal,
        } = out;
        let lkey = self.tx_lkey;
        let seq = self.sq_posted;
        self.sq_posted += 1;
        self.unsignalled += 1;
        let signal = force_signal || self.unsignalled >= self.signal_every;
        if signal {
            self.unsignalled = 0;
        }
        *sge = Sge {
            addr,
            length: len,
            lkey,
        };
        wr.wr_id = self.tag | (seq & WR_VALUE_MASK);
        wr.next = std::ptr::null_mut();
        wr.num_sge = i32::from(len > 0);
        wr.opcode = verbs::WR_SEND_WITH_IMM;
        wr.send_flags = (if signal { verbs::SEND_SIGNALED } else { 0 })
            | (if inline { verbs::SEND_INLINE } else { 0 });
        verbs::set_imm(wr, imm);
    }

    /// Takes the credits to piggyback on the next message.
    #[inline]
    fn take_owed(&mut self) -> u32 {
        let n = self.owed.min(IMM_CREDITS_MAX);
        self.owed -= n;
        if self.owed == 0 {
            self.owed_msgs = 0;
        }
        self.peer_window = self.peer_window.saturating_add(n);
        n
    }

    /// Re-posts receive buffers `bufs`, one chain (one `ibv_post_recv`) per [`CHAIN`] buffers.
    fn post_recvs(&mut self, bufs: &[u32]) -> Result<(), FabricError> {
        if let Some(srq) = &self.srq {
            srq.post(bufs)?;
            let n = bufs.len() as u32;
            self.srq_held = self.srq_held.saturating_sub(n);
            self.owed += n;
            return Ok(());
        }
        if let Some(h) = self.hdr {
            return self.post_recvs_hdr(bufs, h);
        }
        let (qp, gen, owed) = (&self.qp, self.gen, &mut self.owed);
        post_recv_chains(
            &self.rx_pool,
            self.rx_lkey,
            bufs,
            |buf| recv_wr_id(gen, buf),
            |head, n| {
                // SAFETY: `post_recv_chains` hands over a chain of initialised WRs pointing to
                // SGEs that live until this call returns; each buffer is a receive-pool buffer
                // (index checked) inside the region registered with LOCAL_WRITE, owned by the
                // fabric until its completion is polled (the application released it, or it
                // was never lent).
                unsafe { qp.post_recv(head) }.map_err(|e| FabricError::Io(e.errno))?;
                *owed += n;
                Ok(())
            },
        )
    }

    /// Re-posts released ordinary receive buffers (nothing once the QP is in error, unless
    /// they are shared).
    fn release_bufs(&mut self, bufs: &[u32]) -> Result<(), FabricError> {
        if bufs.is_empty() || (self.error.is_some() && self.srq.is_none()) {
            return Ok(()); // the QP is in error: nothing to re-post to
        }
        self.post_recvs(bufs)?;
        self.owed_msgs += bufs.len() as u64;
        Ok(())
    }

    /// The connection's error, once everything received before it has been delivered.
    #[inline]
    fn check(&self) -> Result<(), FabricError> {
        match self.error {
            Some(e) if self.rx_pending.len == 0 && self.rx_frame.is_none() => Err(e),
            _ => Ok(()),
        }
    }

    /// Sends an explicit credit message when we owe some and the peer is low on credits: on
    /// receive buffers (its window at or below half), or on the engine's message credits (the
    /// messages we took since the last return reach half our depth: a few frames can carry a
    /// whole depth of messages in a few receive buffers).
    fn maybe_send_credits(&mut self) -> Result<(), FabricError> {
        if self.owed == 0
            || (self.peer_window > self.low_water && self.owed_msgs < self.credit_msgs)
            || self.peer_credits == 0
            || self.sq_room() == 0
        {
            return Ok(());
        }
        self.post_credit_message()?;
        self.counters.credit_messages.add(1);
        Ok(())
    }

    /// From [`FabricConn::check_peer`] (every few milliseconds): credits still owed for
    /// messages taken while this side sent nothing since the last check go back in a credit
    /// message, so a peer whose
    /// depth is smaller than ours (whose window `maybe_send_credits` cannot see) waits at most
    /// that long, never for a heartbeat.
    fn return_idle_credits(&mut self) -> Result<(), FabricError> {
        let idle = self.sq_posted == self.checked_sq;
        self.checked_sq = self.sq_posted;
        // `owed_msgs > 0`: only credits of messages the application took. A buffer that held
        // a credit message is owed too, but returning that alone would answer each credit
        // message with another, a ping-pong at idle.
        if idle
            && self.owed > 0
            && self.owed_msgs > 0
            && self.error.is_none()
            && self.peer_credits > 0
            && self.sq_room() > 0
        {
            self.post_credit_message()?;
            self.counters.credit_messages.add(1);
            self.checked_sq = self.sq_posted;
        }
        Ok(())
    }

    /// Liveness, from [`FabricConn::check_peer`]: fails the connection when nothing was received
    /// for the timeout while the peer could have sent (it had credits, as far as we know), and
    /// sends a heartbeat when this side sent nothing for a quarter of the timeout.
    ///
    /// A heartbeat is a credit message (`IMM_CREDIT_ONLY`, carrying whatever credits are owed):
    /// it spends a credit like any message, so a receive is always posted for it (never an
    /// RNR), and the peer's re-post of its buffer returns that credit as usual. Without a credit
    /// (the peer holds all our messages) no heartbeat is sent, and the peer, whose window for
    /// us is then 0, does not expect one.
    fn liveness(&mut self, now_ns: u64) -> Result<(), FabricError> {
        if self.liveness_ns == 0 || self.error.is_some() {
            return Ok(());
        }
        // This poller itself did not run for a while (a run-to-completion application that did
        // not call in, a descheduled thread): it cannot tell the peer's silence from its own.
        let stalled = now_ns.saturating_sub(self.checked_ns) > self.liveness_ns / 2;
        self.checked_ns = now_ns;
        match self.heard {
            Some((seen, since)) if seen == self.rx_heard && self.peer_window > 0 && !stalled => {
                let silent = now_ns.saturating_sub(since);
                if silent >= self.liveness_ns {
                    return Err(FabricError::PeerUnresponsive {
                        silent_for: Duration::from_nanos(silent),
                    });
                }
            }
            _ => self.heard = Some((self.rx_heard, now_ns)),
        }
        match self.sent {
            Some((seen, since)) if seen == self.sq_posted => {
                if now_ns.saturating_sub(since) >= self.liveness_ns / 4
                    && self.peer_credits > 0
                    && self.sq_room() > 0
                {
                    self.post_credit_message()?;
                    self.counters.heartbeats.add(1);
                    self.sent = Some((self.sq_posted, now_ns));
                }
            }
            _ => self.sent = Some((self.sq_posted, now_ns)),
        }
        Ok(())
    }

    /// Posts one credit message (no payload, the owed credits), spending a credit.
    fn post_credit_message(&mut self) -> Result<(), FabricError> {
        let imm = IMM_CREDIT_ONLY | self.take_owed();
        let out = Outgoing {
            addr: 0,
            len: 0,
            imm,
            inline: true,
            force_signal: false,
        };
        self.post_control(out, 0)
    }

    /// Posts one control SEND (a credit message, or a control frame of `out.len` bytes at
    /// `out.addr` in a region with key `lkey`), spending a credit, counted as a control send.
    fn post_control(&mut self, out: Outgoing, lkey: u32) -> Result<(), FabricError> {
        let mut wr = verbs::send_wr_zeroed();
        let zero = Sge {
            addr: 0,
            length: 0,
            lkey: 0,
        };
        let mut sges = [zero; 2];
        let len = out.len;
        let hdr = self.hdr;
        let hdr_sge = hdr.map(|h| self.write_send_hdr(&h, out.imm));
        self.fill_send(&mut wr, &mut sges[1], out);
        sges[1].lkey = lkey;
        wr.sg_list = if len > 0 {
            &mut sges[1]
        } else {
            std::ptr::null_mut()
        };
        if let (Some(h), Some(hs)) = (hdr, hdr_sge) {
            // iWARP: a plain SEND of the header (and the payload, if any).
            sges[0] = hs;
            wr.opcode = verbs::WR_SEND;
            wr.num_sge = 1 + i32::from(len > 0);
            wr.sg_list = sges.as_mut_ptr();
            if !h.inline {
                wr.send_flags &= !verbs::SEND_INLINE;
            }
        }
        self.peer_credits -= 1;
        self.uncredited += 1;
        self.ctrl_outstanding += 1;
        // SAFETY: a zero-length send names no memory; a control frame's gather entry is its
        // scratch buffer (registered, key `lkey`), which the caller leaves untouched until this
        // signalled send completes; on iWARP the first gather entry is the send's header slot
        // (see `write_send_hdr`). Inline payloads are copied by the call.
        unsafe { self.qp.post_send(&mut wr) }.map_err(|e| FabricError::Io(e.errno))?;
        Ok(())
    }
}

/// The first `len` bytes of receive buffer `buf`.
///
/// # Safety
///
/// `buf` is a buffer of `pool` whose receive completed with `len <= buf_size` bytes, not
/// re-posted while the slice lives.
#[inline]
unsafe fn rx_bytes(pool: &PoolView, buf: u32, len: u32) -> &[u8] {
    let len = (len as usize).min(pool.buf_size());
    // SAFETY: per the contract; `buf_ptr` names a buffer of the pool, `len` is clamped to it.
    unsafe { std::slice::from_raw_parts(pool.buf_ptr(buf).as_ptr(), len) }
}

impl FabricConn for RdmaConn {
    #[inline]
    fn poll_rx(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        let mut delivered = 0;
        let mut repost = [0u32; CHAIN];
        let mut nrepost = 0;
        let pool = self.rx_pool;
        let mut failed = None;
        let mut pooled = 0;
        // Stopped at a record that waits for a large message (its READ, or a free slot).
        let mut stuck = false;
        let rndv = self.large.rndv_check();
        while sink.room() > 0 && nrepost < CHAIN {
            // Large messages whose READs completed come first: they precede every record
            // still queued (FIFO); more of their chunks are posted as the window frees up.
            if self.large.reads_pending() {
                self.pump_reads()?;
                if self.deliver_read(sink)? {
                    delivered += 1;
                    continue;
                }
            }
            // Then the rest of the frame being split (the sink had no room for all of it, or
            // a record waits for a large message).
            if let Some(mut cur) = self.rx_frame {
                // SAFETY: the frame's receive completed with `end` bytes (checked on completion
                // and by the cursor); the buffer stays ours until re-posted below.
                let bytes = unsafe { rx_bytes(&pool, cur.buf, cur.end) };
                let room = sink.room();
                let mut data = 0;
                let mut blocked = false;
                cur.next_records(bytes, room, |rec| match rec {
                    Record::Data(p) => {
                        if self.large.reads_pending() {
                            blocked = true;
                            return Ok(false);
                        }
                        sink.push_inline(p)?;
                        data += 1;
                        Ok(true)
                    }
                    Record::Rndv {
                        slot,
                        len,
                        addr,
                        rkey,
                    } => {
                        let took = self.take_rndv(Rndv {
                            slot,
                            len,
                            addr,
                            rkey,
                        })?;
                        blocked |= !took;
                        Ok(took)
                    }
                    _ => Err(FabricError::Protocol("rdma frame changed after validation")),
                })?;
                delivered += data;
                if cur.left() == 0 {
                    self.rx_frame = None;
                    repost[nrepost] = cur.buf;
                    nrepost += 1;
                } else {
                    self.rx_frame = Some(cur);
                }
                if blocked {
                    stuck = true;
                    break;
                }
                continue;
            }
            let Some((buf, len, kind)) = self.rx_pending.front() else {
                break;
            };
            if kind == RxKind::Message && self.large.reads_pending() {
                stuck = true;
                break;
            }
            self.rx_pending.pop();
            match kind {
                RxKind::Message => {}
                RxKind::Credit => {
                    repost[nrepost] = buf;
                    nrepost += 1;
                    continue;
                }
                RxKind::Frame => {
                    // SAFETY: as below: a completed receive of `len <= buf_size` bytes.
                    let bytes = unsafe { rx_bytes(&pool, buf, len) };
                    match FrameCursor::new(buf, bytes, rndv.as_ref().map(|(r, s)| (r, *s))) {
                        Ok(cur) => self.rx_frame = Some(cur),
                        Err(e) => {
                            // A hostile frame fails this connection; its (shared) buffer
                            // still goes back below.
                            self.error = Some(e);
                            failed = Some(e);
                            repost[nrepost] = buf;
                            nrepost += 1;
                            break;
                        }
                    }
                    continue;
                }
            }
            if len <= self.rx_inline {
                // SAFETY: the receive completed, so the buffer holds `len` (<= buf_size, checked
                // on completion) bytes written by the HCA and is ours until re-posted below.
                let data = unsafe { rx_bytes(&pool, buf, len) };
                sink.push_inline(data)?;
                repost[nrepost] = buf;
                nrepost += 1;
            } else {
                sink.push_pooled(buf, len)?;
                pooled += 1;
            }
            delivered += 1;
        }
        // Shared buffers always go back to the SRQ (it outlives this connection's QP).
        if nrepost > 0 && (self.error.is_none() || self.srq.is_some()) {
            self.post_recvs(&repost[..nrepost])?;
        }
        // Pooled messages count when the application releases their buffers (`release_rx`);
        // large ones when delivered (their credit is the frame's buffer, re-posted already).
        self.owed_msgs += (delivered - pooled) as u64;
        if let Some(e) = failed {
            return Err(e);
        }
        if delivered == 0 {
            // A failed connection's READs never complete: what waits for one is lost.
            if let (true, Some(e)) = (stuck, self.error) {
                return Err(e);
            }
            self.check()?;
        }
        Ok(delivered)
    }

    #[inline]
    fn post_send(&mut self, descs: &[TxDesc], done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        self.check()?;
        if self.error.is_some() {
            return Ok(0); // failed: deliver what was received first
        }
        let credits = self.peer_credits.saturating_sub(self.reserve) as usize;
        let room = self.sq_room().saturating_sub(1) as usize; // keep one for a credit message
        let max_sends = credits.min(room).min(CHAIN);
        let mut plan = [Planned::default(); CHAIN];
        let (nplan, taken) = self.plan_sends(descs, max_sends, &mut plan)?;
        if taken < descs.len() && nplan == max_sends && max_sends < CHAIN {
            self.counters.credit_stalls.add(1);
        }
        if nplan == 0 {
            return Ok(0);
        }
        let plan = &plan[..nplan];
        match self.hdr {
            Some(h) => self.post_plan_hdr(plan, h)?,
            None => self.post_plan(plan)?,
        }
        self.finish_sends(descs, plan, done)?;
        Ok(taken)
    }

    #[inline]
    fn release_rx(&mut self, bufs: &[u32]) -> Result<(), FabricError> {
        self.check()?;
        if !bufs.iter().any(|&b| is_large(b)) {
            return self.release_bufs(bufs);
        }
        // Large slots go back to the free slots (a rendezvous waiting for one continues at
        // the next `poll_rx`); the ordinary buffers are re-posted in chains, in order.
        let mut small = [0u32; CHAIN];
        let mut n = 0;
        for &b in bufs {
            if is_large(b) {
                self.release_large(large_slot(b))?;
            } else {
                small[n] = b;
                n += 1;
                if n == CHAIN {
                    self.release_bufs(&small)?;
                    n = 0;
                }
            }
        }
        self.release_bufs(&small[..n])
    }

    #[inline]
    fn reclaim(&mut self, done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        self.check()?;
        let mut work = self.reclaim_large(done)?;
        while let Some((seq, buf)) = self.held.front() {
            if seq >= self.sq_completed {
                break;
            }
            self.held.pop();
            done.free_buf(buf)?;
            work += 1;
        }
        if self.engine_credits > 0 {
            done.credits(self.engine_credits);
            work += 1;
            self.engine_credits = 0;
        }
        Ok(work)
    }

    #[inline]
    fn flush(&mut self) -> Result<(), FabricError> {
        self.check()?;
        if self.error.is_some() {
            return Ok(());
        }
        // Sends were posted (one doorbell per batch) in `post_send`; what remains is the
        // rendezvous acknowledgements owed (they carry owed credits too) and returning credits
        // when traffic is one-way.
        self.send_acks()?;
        self.maybe_send_credits()
    }

    fn check_peer(&mut self, now_ns: u64) -> Result<(), FabricError> {
        self.return_idle_credits()?;
        self.liveness(now_ns)
    }
}

impl Drop for RdmaConn {
    fn drop(&mut self) {
        // Runs on the control thread after the poller retired the connection. Shared buffers
        // still queued here go back to the SRQ; the count the application still holds is
        // reported so the SRQ's credit budget never counts them as posted.
        if let Some(srq) = &self.srq {
            if let Some(cur) = self.rx_frame.take() {
                if srq.post(&[cur.buf]).is_ok() {
                    self.srq_held = self.srq_held.saturating_sub(1);
                }
            }
            let mut bufs = [0u32; CHAIN];
            loop {
                let mut n = 0;
                while n < CHAIN {
                    let Some((buf, _, _)) = self.rx_pending.pop() else {
                        break;
                    };
                    bufs[n] = buf;
                    n += 1;
                }
                if n == 0 {
                    break;
                }
                if srq.post(&bufs[..n]).is_ok() {
                    self.srq_held = self.srq_held.saturating_sub(n as u32);
                }
            }
            if let Some(out) = &self.srq_held_out {
                out.store(self.srq_held, Ordering::Release);
            }
        }
    }
}
