//! Per connection: [`RdmaConn`] (one RC queue pair, its registered send and receive pools and
//! its credit state) and the [`FabricConn`] implementation. Its parts by concern: `send`
//! (chained sends, frames), `iwarp` (the header variants of posting), `recv` (receive
//! completions filed by the poller, delivery, re-posting of receive buffers in chains),
//! `credit` (credit validation and returns, control SENDs), `liveness` (silence and
//! heartbeats), `rndv` (large messages) and `fifo` (the fixed-capacity queues).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::chain::{SrqShared, CHAIN};
use super::frame::{frame_limit, FrameCursor};
use crate::desc::{is_large, large_slot, PoolView, TxDesc};
use crate::error::FabricError;
use crate::fabric::rdma::counters::PollerRdmaCounters;
use crate::fabric::rdma::header::HdrParts;
use crate::fabric::rdma::verbs::{self, QueuePair, SendWr, Sge};
use crate::fabric::rdma::wr_id::{WR_GEN_SHIFT, WR_SRQ, WR_VALUE_MASK};
use crate::fabric::{FabricConn, RxSink, TxDone, WaitSet};
use crate::flow::{CreditReturn, SendWindow};

mod credit;
mod fifo;
mod iwarp;
mod liveness;
mod recv;
mod rndv;
mod send;

use credit::Windows;
use fifo::Fifo;
use rndv::Large;
pub(crate) use rndv::{ack_scratch_size, LargeParts, ACK_BUFS, READ_WINDOW, RNDV_SCRATCH};

/// Most lone messages' receive buffers whose re-post waits (see `RdmaConn::repost_later`).
const REPOST_LATER_MAX: usize = 8;

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
    /// Of `sq_posted`, the rendezvous READs: the peer's HCA serves them, its engine sees
    /// nothing of them (liveness counts only the SENDs as this side speaking).
    reads_posted: u64,
    /// Non-inline send buffers posted and not yet known complete: (sequence, buffer).
    held: Fifo<(u64, u32)>,
    /// The receive-buffer window towards the peer: one unit per SEND (a message, a frame of
    /// many, a credit message or an acknowledgement frame), which takes one of the peer's
    /// posted receive buffers. In flight: SENDs whose credit has not come back (the peer has not
    /// re-posted their buffers yet); its room is the sends allowed before the peer runs out of
    /// posted receives. Returned credits are validated against it.
    tx_window: SendWindow,
    /// Credits kept for explicit credit messages.
    reserve: u32,
    /// Run-to-completion's direct send posts only while the SEND window's room is above this:
    /// the reserve and half the window (at least one) are left to the pass's frames.
    direct_floor: u32,
    /// A message was delivered since the last `post_send`: the next single send is a
    /// ping-pong's, which run-to-completion's direct send takes (`post_one`).
    received: bool,
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
    /// Receive buffers of lone messages delivered whose re-post waits off the message's path
    /// (`later[..later_n]`, see `repost_later`): posted, and their credits owed, by the next
    /// `flush` (a direct send's after its doorbell, or the pass's), the general delivery loop,
    /// or once `later_max` are kept, in one chain.
    later: [u32; REPOST_LATER_MAX],
    later_n: u32,
    /// How many re-posts may wait (1: none wait; a shared receive queue's buffers, or a window
    /// too narrow to lend an eighth of it, are re-posted at once).
    later_max: u32,
    /// The receive-buffer credits owed to the peer: buffers re-posted (consumed) and credits
    /// put in an immediate or header (returned, at most
    /// [`IMM_CREDITS_MAX`](crate::fabric::rdma::header::IMM_CREDITS_MAX) a SEND).
    rx_return: CreditReturn,
    /// The engine's message credits owed to the peer: messages whose receive buffers were
    /// re-posted (or, in a frame, delivered) since the buffer credits were last returned in
    /// full (the peer's engine counts messages, not buffers: a few frames can carry a whole
    /// depth of messages in a few buffers). Credits go back explicitly once half our depth is
    /// owed (both sides are expected to use the same depth, as the same buffer size).
    msg_return: CreditReturn,
    /// How many more messages the peer may send us, as far as we know (<= its actual credits).
    peer_window: u32,
    /// The peer's window is low at or below this: half our posted receives.
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
            .field("tx_window", &self.tx_window)
            .field("owed", &self.rx_return.owed())
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
        let windows = Windows::new(&p);
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
            reads_posted: 0,
            held: Fifo::new(p.tx_pool.count() as usize),
            tx_window: windows.tx_buffers.send_window(),
            reserve,
            direct_floor: reserve + (p.peer_credits / 2).max(1),
            received: false,
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
            later: [0; REPOST_LATER_MAX],
            later_n: 0,
            later_max: if p.srq.is_some() {
                1
            } else {
                (p.rx_posted / 8).clamp(1, REPOST_LATER_MAX as u32)
            },
            rx_return: windows.rx_buffers.credit_return(),
            msg_return: windows.rx_messages.credit_return(),
            peer_window: p.rx_posted,
            low_water: windows.rx_buffers.return_batch as u32,
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

    /// Send-queue slots free.
    #[inline]
    fn sq_room(&self) -> u64 {
        u64::from(self.sq_depth).saturating_sub(self.sq_posted - self.sq_completed)
    }

    /// Fills `wr`/`sge` for one send and assigns its sequence number.
    #[inline(always)]
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

    /// What `flush` publishes besides the receives that wait: sends were posted (one doorbell
    /// per batch) in `post_send`; what remains is the rendezvous acknowledgements owed (they
    /// carry owed credits too) and returning credits when traffic is one-way.
    #[inline(always)]
    fn flush_owed(&mut self) -> Result<(), FabricError> {
        self.check()?;
        if self.error.is_some() {
            return Ok(());
        }
        if self.large.acks_owed() {
            self.send_acks()?;
        }
        self.maybe_send_credits()
    }

    /// The connection's error, once everything received before it has been delivered.
    #[inline]
    fn check(&self) -> Result<(), FabricError> {
        match self.error {
            Some(e) if self.rx_pending.len == 0 && self.rx_frame.is_none() => Err(e),
            _ => Ok(()),
        }
    }
}

impl FabricConn for RdmaConn {
    /// Run-to-completion's direct way: a send is posted straight to the QP (`post_send`'s lone
    /// inline SEND, its doorbell) and a receive taken straight from what the poller's shared
    /// poll filed here; the direct receive runs that poll itself when nothing is pending
    /// ([`Fabric::SHARED_COMPLETIONS`](crate::fabric::Fabric::SHARED_COMPLETIONS)). Send
    /// completions and returned credits are reclaimed by the next pass, as before.
    const RTC_DIRECT: bool = true;

    /// `post_one` declines a stream's send (below). Asked per send anyway, the declines (the
    /// guard's compare-and-swap, the lookup) cost the sender of `bench rate --fabric rdma
    /// --size 8` about 7 % of its rate in the VM (a scratch build that never asked: 0.956 M
    /// msgs/s against 0.877-0.905, same boot).
    const DIRECT_SEND_AFTER_RECV: bool = true;

    /// What `deliver` would find: received buffers, a frame being split, or large messages
    /// being read (its own early return, without setting up the sink). Completions still in
    /// the CQ are not seen here: the poller's shared poll files them.
    #[inline]
    fn rx_pending(&mut self) -> bool {
        self.rx_pending.len != 0 || self.rx_frame.is_some() || self.large.reads_pending()
    }

    /// A frame split by a take whose sink had no room for all of it: its buffer is re-posted,
    /// and its records' credit owed, with its last record (see `deliver`).
    #[inline]
    fn rx_split(&mut self) -> bool {
        self.rx_frame.is_some()
    }

    /// The pass's `flush` for the receive side: credits owed go back in a credit message once
    /// due (the same rule as the pass's), rendezvous acknowledgements owed go out. Each direct
    /// take otherwise only re-posts buffers: a receiver that always finds a message runs no
    /// pass, and its peer would wait for the check's idle return. Not the lone messages'
    /// re-posts that wait (`repost_later`): the application has the message once this returns,
    /// and they are posted while it waits for the next one.
    #[inline]
    fn rx_taken(&mut self) -> Result<(), FabricError> {
        self.flush_owed()
    }

    /// Nothing of its own to arm: everything that gives it work (a receive, a send's or a
    /// read's completion, the credits in an immediate) comes through the poller's CQ, which
    /// [`RdmaFabric`](super::RdmaFabric)'s `arm` arms and re-polls; heartbeats and the
    /// liveness check come with the poller's liveness tick.
    fn arm(&mut self, _set: &mut WaitSet) -> bool {
        true
    }

    #[inline(always)]
    fn poll_rx(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        self.deliver(sink)
    }

    /// The lone small message inline (a ping-pong's), the rest ([`RdmaConn::post_planned`])
    /// out of line: under the VM's emulation a call and its return cost more than their
    /// instructions.
    #[inline(always)]
    fn post_send(&mut self, descs: &[TxDesc], done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        self.received = false;
        self.check()?;
        if self.error.is_some() {
            return Ok(0); // failed: deliver what was received first
        }
        let credits = self
            .tx_window
            .room()
            .saturating_sub(u64::from(self.reserve)) as usize;
        let room = self.sq_room().saturating_sub(1) as usize; // keep one for a credit message
        let max_sends = credits.min(room).min(CHAIN);
        if let [d] = descs {
            if max_sends > 0
                && !is_large(d.buf)
                && d.len <= self.peer_buffer_size
                && self.send_inline(d.len)
                && self.hdr.is_none()
            {
                // A lone small message, a ping-pong's: what `plan_sends` and `finish_sends` make
                // of it (one unframed inline SEND, its buffer free at once), without their loops
                // (about 190 of a send's instructions, callgrind on rxe). iWARP's header
                // slots take the plan.
                self.post_lone_inline(d.buf, d.len)?;
                done.free_buf(d.buf)?;
                self.counters.inline_sends.add(1);
                return Ok(1);
            }
        }
        self.post_planned(descs, max_sends, done)
    }

    /// Run-to-completion's direct send: [`post_send`](FabricConn::post_send) of the one
    /// message, for a ping-pong's send only (a message was delivered since the last send, as
    /// tcp's direct send) and while more than half the SEND window is free beside the reserve;
    /// otherwise declined: the message queues in the send ring, and the next `flush` posts it
    /// and what queues behind it in frames, as before. A direct send spends a SEND per
    /// message, and the engine's window (`depth` messages) is usually wider than the peer's
    /// receive buffers: a stream sent directly would leave its tail waiting for a credit that
    /// comes back only after the peer took messages, and a sender that flushes and then waits
    /// elsewhere would never post it (conformance `block_sender_never_blocks_on_a_sleeping_receiver`
    /// on `rdma_srq`, 4 buffers per connection, failed so with direct stream sends, with a
    /// margin of one SEND or of half the window alike). A ping-pong finds its window full again
    /// (each reply carries the credit back).
    #[inline]
    fn post_one(&mut self, desc: &TxDesc, done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        if !self.received || self.tx_window.room() <= u64::from(self.direct_floor) {
            return Ok(0);
        }
        self.post_send(std::slice::from_ref(desc), done)
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
        // The rendezvous bookkeeping is looked at only when it holds something: these two calls
        // ran on every pass (about 45 instructions of a busy poller's empty pass, callgrind).
        let mut work = if self.large.acked_pending() {
            self.reclaim_large(done)?
        } else {
            0
        };
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

    /// Posts the receives that wait (`repost_later`), then [`flush_owed`](RdmaConn::flush_owed).
    #[inline]
    fn flush(&mut self) -> Result<(), FabricError> {
        if self.later_n > 0 {
            self.repost_waiting()?;
        }
        self.flush_owed()
    }

    fn check_peer(&mut self, now_ns: u64) -> Result<(), FabricError> {
        self.return_idle_credits()?;
        self.liveness(now_ns)
    }

    /// Settled once nothing is queued, every large message sent was pulled by the peer and
    /// every posted work request completed: then the peer holds everything sent, and the
    /// disconnect that follows flushes nothing of it. The newest sends may be unsignalled
    /// (selective signalling), so a signalled credit message is posted behind them once; its
    /// completion reports them all. A failed connection completes nothing more: settled.
    fn settled(&mut self, queued: bool) -> bool {
        if self.error.is_some() {
            return true;
        }
        if queued || self.large.tx_pending() {
            return false;
        }
        if self.sq_completed >= self.sq_posted {
            return true;
        }
        if self.unsignalled > 0 && self.tx_window.room() > 0 && self.sq_room() > 0 {
            if let Err(e) = self.post_credit_message(true) {
                self.error = Some(e);
                return true;
            }
        }
        false
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
