//! The `mem://` fabric's data path: what a poller runs for each end of an in-process connection.
//!
//! The two ends of a connection share a [`Channel`]; each direction is a lock-free SPSC ring of
//! [`Record`]s (the sending end's poller produces, the receiving end's poller consumes) and a
//! release ring going back (receive-pool buffers the receiving application dropped). A sender's
//! send pool is its peer's receive pool: the same memory, so a pooled message is lent in place.
//!
//! **Send.** [`post_send`](FabricConn::post_send) writes one record per message into the ring
//! (one chunk per batch, published by its commit): a message up to the inline threshold (at most
//! [`RECORD_INLINE`] bytes) is copied into the record and its buffer is free at once; a larger
//! one (and every large slot) travels by reference, its buffer held until the receiving
//! application drops it and the index comes back through the release ring
//! ([`reclaim`](FabricConn::reclaim) frees it with [`TxDone::free_buf`], which checks it).
//!
//! **Receive.** [`poll_rx`](FabricConn::poll_rx) takes at most the sink's room of records: an
//! inline one is copied into the application's ring slot, a pooled one lent in place
//! ([`RxSink::push_pooled`]), a large one lent from its slot ([`RxSink::push_large`]). Every
//! record carries a sequence number; one out of sequence (a corrupt record) fails the
//! connection with [`FabricError::Protocol`], before anything of it is delivered.
//!
//! **Credits** ([`Credits`], the one place of the flow-control policy). The receiver counts the
//! records it delivered and publishes the count (one atomic store per receive pass); the
//! sender's `reclaim` returns the difference since its last look as credits. So the sender has
//! at most `depth` records in flight, the ring holds `depth` records, and a slow receiver
//! back-pressures the sender (`WouldBlock` at `send`); nothing is ever dropped.
//!
//! **Liveness and close.** Each end bumps its beat word in every liveness check
//! ([`check_peer`](FabricConn::check_peer)); an end whose peer's beat has not moved for the
//! liveness timeout fails the connection with [`FabricError::PeerUnresponsive`]. Closing an
//! end sets its close word; the peer delivers what was published before it, then reports
//! [`FabricError::PeerClosed`] once, or [`FabricError::PeerAborted`] when the end failed the
//! connection because of its peer ([`abort`](FabricConn::abort): the word holds the
//! [`AbortReason`]'s code; the first mark wins).
//!
//! **Faults** (tests, [`Faults`](super::Faults)): an end's fault word can stall it (it does
//! nothing, not even its liveness check), kill it (stalled for good, and closed to its peer) or
//! corrupt the next record it sends. One relaxed load of a word nobody else writes per call.
//!
//! No system call, lock, allocation or logging.

use std::any::Any;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use rings::{Consumer, Producer};

use crate::desc::{is_large, large_slot, PoolView, TxDesc, BUF_INLINE};
use crate::error::{AbortReason, FabricError};
use crate::fabric::{Fabric, FabricConn, RxSink, TxDone};
use crate::record::copy::copy_bytes;
use crate::wake::{PollerWake, WaitSet};

/// Payload bytes a record carries inline (the record is two cache lines).
pub const RECORD_INLINE: usize = 116;

/// Fault bit: the end does nothing.
pub(crate) const FAULT_STALL: u8 = 1;
/// Fault bit: the end is gone for good (also stalled).
pub(crate) const FAULT_DEAD: u8 = 2;
/// Fault bit: the next record the end sends is corrupted.
pub(crate) const FAULT_CORRUPT: u8 = 4;
/// Fault bit: the end holds an operation only its peer could complete, as an RDMA READ of a
/// large message does. Nothing changes while the peer is there; once the end has reported the
/// peer's close, it is never quiescent again and every pass's reclaim reports the close again
/// (what Soft-iWARP's connections do when the peer dies mid-transfer).
pub(crate) const FAULT_UNSERVED: u8 = 8;
/// The fault bits that change what `quiescent` and `reclaim` answer: one test of the fault word
/// on their common path, as `halted` is; the rest in [`MemConn::faulted`], out of line.
const FAULTS_QUIET: u8 = FAULT_STALL | FAULT_DEAD | FAULT_UNSERVED;

/// One message in flight from one end to the other.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Record {
    /// The sender's record count (wrapping): checked by the receiver.
    seq: u32,
    /// Payload bytes.
    len: u32,
    /// [`BUF_INLINE`] (the payload is `data[..len]`), a send-pool buffer index or
    /// `LARGE_BIT | slot`.
    buf: u32,
    data: [MaybeUninit<u8>; RECORD_INLINE],
}

const _: () = assert!(core::mem::size_of::<Record>() == 128);

/// One end's state that its peer reads.
#[derive(Debug, Default)]
pub(crate) struct EndState {
    /// Records this end delivered to its application (cumulative): the credits it returns.
    delivered: CachePadded<AtomicU64>,
    /// Proof of life: advanced by this end's liveness checks.
    beat: CachePadded<AtomicU64>,
    /// Nothing more will be published by this end once nonzero: [`CLOSED`], or the code of
    /// the [`AbortReason`] it failed the connection with. Set once (the first mark wins).
    pub(crate) closed: AtomicU32,
    /// `FAULT_*` bits (tests).
    pub(crate) faults: AtomicU8,
    /// This end's engine uses [`IdleStrategy::Block`](crate::IdleStrategy::Block): its poller
    /// may sleep, so the peer wakes it after handing it work (set at setup, never written).
    pub(crate) may_sleep: bool,
    /// This end's poller's wake-up (`may_sleep` only), registered once by that poller before
    /// it serves the end.
    wake: OnceLock<Arc<PollerWake>>,
}

impl EndState {
    /// Wakes this end's poller if it may sleep and sleeps, after the peer published work for it
    /// (a record, a delivered count, a released buffer, a close). An end that never sleeps
    /// costs one load of a word nobody writes.
    ///
    /// Always inlined, the rest out of line: with the stamped application rings the compiler
    /// stopped inlining the whole of it into the run-to-completion direct send, whose call then
    /// cost 18 instructions per record (callgrind, `bench cost --fabric mem --sizes 8 --iters
    /// 20000 --warmup 0`: 8.2 M -> 12.7 M in `send_one`'s mem lines).
    #[inline(always)]
    fn wake(&self) {
        if self.may_sleep {
            self.wake_sleeper();
        }
    }

    /// [`wake`](Self::wake) for an end that may sleep.
    #[cold]
    #[inline(never)]
    fn wake_sleeper(&self) {
        crate::wake::seq_cst_fence();
        if let Some(w) = self.wake.get() {
            w.wake_fenced();
        }
    }
}

/// What both ends of one connection share: end 0 connected, end 1 accepted. Each end's state
/// is an allocation of its own, which each [`MemConn`] also holds: reached through its own
/// pointer, not indexed from the channel's (see [`MemConn::mine`]).
#[derive(Debug, Default)]
pub(crate) struct Channel {
    pub(crate) ends: [Arc<EndState>; 2],
}

impl Channel {
    /// A channel whose end `i` may sleep when `may_sleep[i]` (its engine uses `Block`).
    pub(crate) fn new(may_sleep: [bool; 2]) -> Channel {
        let end = |may_sleep| {
            Arc::new(EndState {
                may_sleep,
                ..EndState::default()
            })
        };
        Channel {
            ends: [end(may_sleep[0]), end(may_sleep[1])],
        }
    }
}

/// [`EndState::closed`]: the end closed without blaming its peer.
pub(crate) const CLOSED: u32 = 1;

impl Channel {
    /// Marks end `me` closed (idempotent; an earlier abort's reason stays).
    pub(crate) fn close(&self, me: usize) {
        self.mark(me, CLOSED);
    }

    /// Marks end `me` closed because of its peer, for `reason` (a mark made before stays).
    pub(crate) fn abort(&self, me: usize, reason: AbortReason) {
        self.mark(me, reason.code());
    }

    fn mark(&self, me: usize, code: u32) {
        let _ =
            self.ends[me]
                .closed
                .compare_exchange(0, code, Ordering::Release, Ordering::Relaxed);
        self.ends[1 - me].wake();
    }
}

/// The ring ends and pools one end is built from (by setup).
pub(crate) struct EndParts {
    pub(crate) chan: Arc<Channel>,
    /// 0: the connecting end, 1: the accepted end.
    pub(crate) me: usize,
    pub(crate) tx: Producer<Record>,
    pub(crate) rx: Consumer<Record>,
    /// Receive buffers released, to the peer.
    pub(crate) release_out: Producer<u32>,
    /// Send buffers released by the peer.
    pub(crate) release_in: Consumer<u32>,
    pub(crate) tx_pool: PoolView,
    /// Messages up to this many bytes are copied into the record.
    pub(crate) copy_max: usize,
    pub(crate) liveness: Duration,
    pub(crate) keep: Arc<dyn Any + Send + Sync>,
}

/// Per-poller state of the `mem://` fabric: none (every connection polls its own rings).
#[derive(Debug, Default)]
pub struct MemFabric;

impl Fabric for MemFabric {
    const NAME: &'static str = "mem";
    type Conn = MemConn;
    type Command = ();

    fn on_command(&mut self, _command: ()) {}
}

/// The sender's view of the credits: the policy in one place (a record is in flight until the
/// receiver delivered it to its application).
#[derive(Debug, Default)]
struct Credits {
    /// Records sent (the bound for the receiver's count).
    sent: u64,
    /// The receiver's delivered count at the last look.
    seen: u64,
}

impl Credits {
    /// Credits that came back since the last call, given the receiver's delivered count.
    #[inline]
    fn returned(&mut self, delivered: u64) -> Result<u64, FabricError> {
        if delivered < self.seen || delivered > self.sent {
            return Err(FabricError::Protocol(
                "mem credit count goes backwards or exceeds the records sent",
            ));
        }
        let n = delivered - self.seen;
        self.seen = delivered;
        Ok(n)
    }
}

/// One end of a `mem://` connection, as its poller drives it.
pub struct MemConn {
    chan: Arc<Channel>,
    me: usize,
    /// `chan.ends[me]` and the peer's: [`mine`](Self::mine), [`peer`](Self::peer).
    mine: Arc<EndState>,
    peer: Arc<EndState>,
    tx: Producer<Record>,
    rx: Consumer<Record>,
    release_out: Producer<u32>,
    release_in: Consumer<u32>,
    tx_pool: PoolView,
    copy_max: usize,
    seq_out: u32,
    seq_in: u32,
    credits: Credits,
    delivered: u64,
    /// `PeerClosed` was reported: nothing more to receive or send.
    gone: bool,
    liveness_ns: u64,
    /// The peer's beat at the last look, and when that last moved (coarse ns; 0: not yet).
    beat_seen: (u64, u64),
    checked_ns: u64,
    /// Keeps both directions' pools alive.
    _keep: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for MemConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemConn")
            .field("end", &self.me)
            .field("sent", &self.credits.sent)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl MemConn {
    pub(crate) fn new(p: EndParts) -> MemConn {
        let me = p.me & 1;
        MemConn {
            mine: p.chan.ends[me].clone(),
            peer: p.chan.ends[me ^ 1].clone(),
            chan: p.chan,
            me,
            tx: p.tx,
            rx: p.rx,
            release_out: p.release_out,
            release_in: p.release_in,
            tx_pool: p.tx_pool,
            copy_max: p.copy_max.min(RECORD_INLINE).min(p.tx_pool.buf_size()),
            seq_out: 0,
            seq_in: 0,
            credits: Credits::default(),
            delivered: 0,
            gone: false,
            liveness_ns: u64::try_from(p.liveness.as_nanos()).unwrap_or(u64::MAX),
            beat_seen: (0, 0),
            checked_ns: 0,
            _keep: p.keep,
        }
    }

    /// This end's state: one load of a pointer held here. (Indexed from the channel,
    /// `chan.ends[me & 1]`, each use loaded the channel and the index and scaled it: 5-6
    /// instructions, several times a message.)
    #[inline]
    fn mine(&self) -> &EndState {
        &self.mine
    }

    /// The peer's state (see [`mine`](Self::mine)).
    #[inline]
    fn peer(&self) -> &EndState {
        &self.peer
    }

    /// This end is stalled or dead (a fault): it does nothing.
    #[inline]
    fn halted(&self) -> bool {
        self.mine().faults.load(Ordering::Relaxed) & (FAULT_STALL | FAULT_DEAD) != 0
    }

    /// The peer will publish nothing more (Acquire: what it published before is visible).
    #[inline]
    fn peer_closed(&self) -> bool {
        self.peer().closed.load(Ordering::Acquire) != 0 || self.rx.is_abandoned()
    }

    /// How the peer's close is reported: [`FabricError::PeerAborted`] when it blamed this end.
    #[cold]
    fn peer_close_error(&self) -> FabricError {
        FabricError::peer_close(self.peer().closed.load(Ordering::Acquire))
    }

    /// The fault bits in [`FAULTS_QUIET`] (one load, as `halted`).
    #[inline]
    fn quiet_faults(&self) -> u8 {
        self.mine().faults.load(Ordering::Relaxed) & FAULTS_QUIET
    }

    /// What `quiescent` and `reclaim` answer under the faults `f` (nonzero, of
    /// [`FAULTS_QUIET`]): `Some(Ok(()))` for a halted end (quiescent; nothing reclaimed),
    /// `Some(Err(close))` for an end left waiting on a peer that is gone ([`FAULT_UNSERVED`]:
    /// never quiescent; the close reported again), `None` when the faults change nothing yet.
    #[cold]
    #[inline(never)]
    fn faulted(&self, f: u8) -> Option<Result<(), FabricError>> {
        if f & (FAULT_STALL | FAULT_DEAD) != 0 {
            return Some(Ok(()));
        }
        if self.gone {
            return Some(Err(self.peer_close_error()));
        }
        None
    }
}

/// Delivers one record into `sink`, checking it first. Always inlined: out of line (its two
/// callers, the burst and the one-message receive) it cost about 20 instructions per message.
#[inline(always)]
fn deliver(r: &Record, expect: u32, sink: &mut RxSink<'_>) -> Result<(), FabricError> {
    if r.seq != expect {
        return Err(FabricError::Protocol(
            "mem record out of sequence (corrupt record)",
        ));
    }
    let len = r.len as usize;
    if r.buf == BUF_INLINE {
        if len > RECORD_INLINE {
            return Err(FabricError::Protocol(
                "mem inline record longer than a record",
            ));
        }
        sink.push_inline_with(len, |dst| {
            let src = &r.data[..len];
            // SAFETY: `src` and `dst` are `len` bytes each (`len <= RECORD_INLINE`, and the
            // sink hands exactly `len`), a record in the ring and a slot of the application's
            // ring, which do not overlap; `MaybeUninit` bytes may be copied whatever their
            // state (the sender initialised these `len`). `copy_bytes`, not `copy_from_slice`:
            // no `memcpy` call for a small message (callgrind, `bench cost --fabric mem`, one
            // of four calls per round trip).
            unsafe {
                copy_bytes(
                    src.as_ptr().cast::<u8>(),
                    dst.as_mut_ptr().cast::<u8>(),
                    len,
                )
            };
            Ok(len)
        })
    } else if is_large(r.buf) {
        sink.push_large(large_slot(r.buf), r.len)
    } else {
        sink.push_pooled(r.buf, r.len)
    }
}

impl MemConn {
    /// [`FabricConn::poll_rx`]'s body (inlined into `poll_rx` and `poll_rx_one`).
    #[inline(always)]
    fn receive(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        if self.halted() {
            return Ok(0);
        }
        let mut n = 0;
        let mut res = Ok(());
        {
            let chunk = self.rx.read_chunk_up_to(sink.room());
            let (a, b) = chunk.as_slices();
            // The two parts one after the other, not `chain`ed (fewer instructions per record).
            'parts: for part in [a, b] {
                for r in part {
                    if let Err(e) = deliver(r, self.seq_in, sink) {
                        res = Err(e);
                        break 'parts;
                    }
                    self.seq_in = self.seq_in.wrapping_add(1);
                    n += 1;
                }
            }
            chunk.release(n);
        }
        if n > 0 {
            self.delivered += n as u64;
            self.mine()
                .delivered
                .store(self.delivered, Ordering::Release);
            // Credits for the peer.
            self.peer().wake();
        }
        res?;
        // The close only once the ring is empty, and the ring looked at again after the close
        // was seen (Acquire): the peer publishes its last records before its close, so an
        // empty ring then is the end of them. (Read before the ring instead, the close cost
        // every receive two loads that only an empty one needs.)
        if n == 0 && !self.gone && self.peer_closed() && self.rx.is_empty() {
            self.gone = true;
            return Err(self.peer_close_error());
        }
        Ok(n)
    }

    /// [`FabricConn::post_send`]'s body (inlined into `post_send` and `post_one`).
    #[inline(always)]
    fn send(&mut self, descs: &[TxDesc], done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        let faults = self.mine().faults.load(Ordering::Relaxed);
        if faults & (FAULT_STALL | FAULT_DEAD) != 0 || self.gone {
            return Ok(0);
        }
        let MemConn {
            tx,
            tx_pool,
            copy_max,
            seq_out,
            ..
        } = self;
        let first_seq = *seq_out;
        let mut chunk = tx.write_chunk_uninit_up_to(descs.len());
        let (a, b) = chunk.as_mut_slices();
        let mut n = 0;
        let mut res = Ok(());
        for (slot, d) in a.iter_mut().chain(b.iter_mut()).zip(descs) {
            let p = slot.as_mut_ptr();
            let len = d.len as usize;
            // Copied from a small message's buffer, or from the descriptor (the engine checked
            // `len <= TX_INLINE_MAX`), or lent by reference. The inline marker has the large
            // bit set, so `copied` excludes it.
            let copied = !is_large(d.buf) && len <= *copy_max;
            // SAFETY: `p` is a claimed, writable ring slot; fields are written through raw
            // pointers without reading. For an inline descriptor the source is its own `len <=
            // TX_INLINE_MAX <= RECORD_INLINE` initialised bytes; for a copied message the engine
            // checked `d.buf < count` and `len <= buf_size`, and `len <= copy_max <=
            // RECORD_INLINE`: the source is `len` bytes of a send buffer the poller owns now, in
            // the pool `_keep` holds. The destination, the record's data, overlaps neither.
            unsafe {
                core::ptr::addr_of_mut!((*p).seq).write(*seq_out);
                core::ptr::addr_of_mut!((*p).len).write(d.len);
                let dst = core::ptr::addr_of_mut!((*p).data).cast::<u8>();
                if copied {
                    copy_bytes(tx_pool.buf_ptr_unchecked(d.buf).as_ptr(), dst, len);
                    core::ptr::addr_of_mut!((*p).buf).write(BUF_INLINE);
                } else if d.is_inline() {
                    copy_bytes(d.data_ptr(), dst, len);
                    core::ptr::addr_of_mut!((*p).buf).write(BUF_INLINE);
                } else {
                    core::ptr::addr_of_mut!((*p).buf).write(d.buf);
                }
            }
            *seq_out = seq_out.wrapping_add(1);
            n += 1;
            if copied {
                // Copied: free at once (`copies` said so, the engine did not mark it held).
                if let Err(e) = done.free_copied(d.buf) {
                    res = Err(e);
                    break;
                }
            }
        }
        if faults & FAULT_CORRUPT != 0 && n > 0 {
            if let Some(first) = a.first_mut() {
                // SAFETY: slot 0 of the chunk was written above (`n > 0`); the field is
                // overwritten without reading.
                unsafe { core::ptr::addr_of_mut!((*first.as_mut_ptr()).seq).write(!first_seq) };
                // Fields apart (`a` borrows `tx`): not `mine()`.
                self.mine
                    .faults
                    .fetch_and(!FAULT_CORRUPT, Ordering::Relaxed);
            }
        }
        // SAFETY: the first `n` slots of the chunk were initialised above, in order.
        unsafe { chunk.commit(n) };
        self.credits.sent += n as u64;
        if n > 0 {
            self.peer().wake();
        }
        res.map(|()| n)
    }
}

impl FabricConn for MemConn {
    // One record written or read in place per message: `post_send` and `poll_rx` cost about
    // what a pass's share of them does, without the rings and the pass around them.
    const RTC_DIRECT: bool = true;

    // Copied into the record like any small message, from the descriptor instead.
    const INLINE_SENDS: bool = true;

    fn attach_wake(&mut self, wake: &Arc<PollerWake>) {
        let _ = self.mine().wake.set(wake.clone());
    }

    fn arm(&mut self, _set: &mut WaitSet) -> bool {
        // The peer's poller wakes this one (`EndState::wake`) once it sees the announcement;
        // after it, what it published before is here to see.
        !self.rx_pending() && self.quiescent()
    }

    #[inline]
    fn rx_pending(&mut self) -> bool {
        if self.halted() {
            return false;
        }
        !self.rx.is_empty() || (!self.gone && self.peer_closed())
    }

    #[inline]
    fn rx_more(&mut self) -> bool {
        // Records only (one load, often of the cached tail): a close or a fault is for the
        // next receive's `rx_pending`.
        !self.rx.is_empty()
    }

    #[inline]
    fn quiescent(&mut self) -> bool {
        let f = self.quiet_faults();
        if f != 0 {
            if let Some(res) = self.faulted(f) {
                return res.is_ok();
            }
        }
        self.release_in.is_empty()
            && self.peer().delivered.load(Ordering::Relaxed) == self.credits.seen
    }

    #[inline]
    fn copies(&self, len: u32) -> bool {
        // Exactly `post_send`'s test (for a buffer that is not a large slot).
        len as usize <= self.copy_max
    }

    #[inline]
    fn poll_rx(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        self.receive(sink)
    }

    // Inlined whole into the direct receive (callgrind, `bench cost --fabric mem --sizes 8`:
    // about 70 fewer instructions per message received, no call and the one-slot sink's loop
    // folded), not into the pass's burst receive (about 5 more per message streamed there).
    #[inline(always)]
    fn poll_rx_one(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        self.receive(sink)
    }

    #[inline]
    fn post_send(&mut self, descs: &[TxDesc], done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        self.send(descs, done)
    }

    // As `poll_rx_one`: inlined whole into the direct send only (about 70 fewer instructions
    // per message sent there, about 12 more per message streamed if the pass's batch inlined
    // it too).
    #[inline(always)]
    fn post_one(&mut self, desc: &TxDesc, done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        self.send(std::slice::from_ref(desc), done)
    }

    #[inline]
    fn release_rx(&mut self, bufs: &[u32]) -> Result<(), FabricError> {
        // The release ring holds every buffer and slot of the peer's pools, each lent once.
        if self.release_out.push_slice(bufs) != bufs.len() {
            return Err(FabricError::Protocol("mem release ring overflow"));
        }
        self.peer().wake();
        Ok(())
    }

    #[inline]
    fn reclaim(&mut self, done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        let f = self.quiet_faults();
        if f != 0 {
            if let Some(res) = self.faulted(f) {
                return res.map(|()| 0);
            }
        }
        let mut work = 0;
        {
            let chunk = self.release_in.read_chunk_up_to(usize::MAX);
            let (a, b) = chunk.as_slices();
            for &buf in a.iter().chain(b) {
                done.free_buf(buf)?;
            }
            work += chunk.len();
            chunk.release_all();
        }
        let delivered = self.peer().delivered.load(Ordering::Acquire);
        let n = self.credits.returned(delivered)?;
        if n > 0 {
            done.credits(n);
            work += 1;
        }
        Ok(work)
    }

    #[inline]
    fn flush(&mut self) -> Result<(), FabricError> {
        // `post_send` published its batch with the chunk's commit.
        Ok(())
    }

    #[inline]
    fn check_peer(&mut self, now_ns: u64) -> Result<(), FabricError> {
        if self.liveness_ns == 0 || self.halted() {
            // A halted end proves nothing and judges nothing (a stopped process).
            self.checked_ns = 0;
            return Ok(());
        }
        let me = self.mine();
        me.beat.store(
            me.beat.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
        if self.gone || self.peer_closed() {
            return Ok(());
        }
        // This poller itself did not run for a while: it cannot tell the peer's silence from
        // its own.
        let stalled =
            self.checked_ns == 0 || now_ns.saturating_sub(self.checked_ns) > self.liveness_ns / 2;
        self.checked_ns = now_ns;
        let beat = self.peer().beat.load(Ordering::Relaxed);
        if beat != self.beat_seen.0 || stalled || self.beat_seen.1 == 0 {
            self.beat_seen = (beat, now_ns);
        } else {
            let silent = now_ns.saturating_sub(self.beat_seen.1);
            if silent >= self.liveness_ns {
                return Err(FabricError::PeerUnresponsive {
                    silent_for: Duration::from_nanos(silent),
                });
            }
        }
        Ok(())
    }

    fn abort(&mut self, reason: AbortReason) {
        self.chan.abort(self.me, reason);
    }

    fn close(&mut self) {
        self.chan.close(self.me);
    }
}

impl Drop for MemConn {
    fn drop(&mut self) {
        // An end dropped without a close (never installed, engine gone) is closed too.
        self.chan.close(self.me);
    }
}
