//! Rendezvous state of one connection, and the [`RdmaConn`] methods that drive it:
//! the sender's RNDV frames and its slots awaiting acknowledgement, the receiver's receive
//! slots, its RDMA READs in flight (in order) and the acknowledgements it owes. The protocol
//! is in [`rdma`](crate::fabric::rdma#large-messages-rendezvous); the wire pieces are in
//! `datapath::rndv`.

use super::fifo::Fifo;
use super::{Outgoing, RdmaConn};
use crate::desc::PoolView;
use crate::error::FabricError;
use crate::fabric::rdma::datapath::rndv::{
    ack_frame_len, read_ack_frame, write_ack_frame, write_rndv_frame, LargeRegion, Rndv,
    ACK_RECORD, MAX_LARGE_SLOTS, RNDV_FRAME,
};
use crate::fabric::rdma::header::{IMM_CREDIT_ONLY, IMM_FRAME};
use crate::fabric::rdma::verbs::{self, Sge};
use crate::fabric::rdma::wr_id::WR_VALUE_MASK;
use crate::fabric::{RxSink, TxDone};

pub(crate) use crate::desc::LARGE_BIT;

/// Bytes of one RNDV frame slot in the scratch region (a cache line).
pub(crate) const RNDV_SCRATCH: usize = 64;
/// Control frames of acknowledgements that may be in flight at once (each from its own
/// scratch buffer, reused once its signalled SEND completed).
pub(crate) const ACK_BUFS: usize = 2;
/// Bytes one RDMA READ pulls at most: a large message is read in chunks of this size.
pub(crate) const READ_CHUNK: u32 = 256 << 10;
/// Most READ chunks in flight per connection (2 MiB). The peer's HCA answers READs in order
/// and serves a SEND of ours (an acknowledgement, a credit, a heartbeat) only after the READs
/// posted before it: bounding the bytes in flight bounds that delay (2 MiB: 0.2 ms at
/// 100 Gb/s, 0.1 s at the 20 MB/s of Soft-RoCE under emulation), so the peer's liveness check
/// never sees a long silence while its slots are being pulled. 2 MiB in flight is far above
/// the bandwidth-delay product of one RC connection.
pub(crate) const READ_WINDOW: u32 = 8;

/// The bytes of one acknowledgement scratch buffer for a peer receive buffer of
/// `buffer_size` bytes: a control frame of up to [`MAX_LARGE_SLOTS`] acknowledgements, at
/// most the buffer, rounded up to 64.
pub(crate) fn ack_scratch_size(buffer_size: u32) -> usize {
    let n = ack_frame_len(MAX_LARGE_SLOTS as usize).min(buffer_size as usize);
    (n + 63) & !63
}

/// Everything the rendezvous needs, produced by the setup code (all empty when the
/// connection has no large messages).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LargeParts {
    /// Our large send slots (registered with `REMOTE_READ` only).
    pub(crate) tx: PoolView,
    /// The same region as announced to the peer (base, slot size, slots, rkey).
    pub(crate) tx_region: LargeRegion,
    /// Our large receive slots (registered with `LOCAL_WRITE`; `REMOTE_WRITE` too on iWARP).
    pub(crate) rx: PoolView,
    /// lkey of the receive slots' region.
    pub(crate) rx_lkey: u32,
    /// RNDV frames, one [`RNDV_SCRATCH`]-byte slot per send slot (`tx.count()` of them).
    pub(crate) rndv_scratch: PoolView,
    /// [`ACK_BUFS`] control-frame buffers of [`ack_scratch_size`] bytes.
    pub(crate) ack_scratch: PoolView,
    /// lkey of the scratch region (local access only).
    pub(crate) scratch_lkey: u32,
    /// The peer's large send region, validated by setup.
    pub(crate) peer: LargeRegion,
    /// Most RDMA READ chunks in flight ([`READ_WINDOW`] and the QP's initiator depth).
    pub(crate) max_reads: u32,
}

impl LargeParts {
    /// No large messages.
    pub(crate) fn none() -> Self {
        LargeParts {
            tx: PoolView::empty(),
            tx_region: LargeRegion::NONE,
            rx: PoolView::empty(),
            rx_lkey: 0,
            rndv_scratch: PoolView::empty(),
            ack_scratch: PoolView::empty(),
            scratch_lkey: 0,
            peer: LargeRegion::NONE,
            max_reads: 0,
        }
    }
}

/// One large message being pulled (in [`READ_CHUNK`]s), oldest first.
#[derive(Debug, Clone, Copy, Default)]
struct Read {
    /// Our receive slot it lands in.
    slot: u32,
    len: u32,
    /// Remote address and key of its first byte.
    addr: u64,
    rkey: u32,
    /// Bytes whose READ was posted (`<= len`).
    posted: u32,
    /// Chunks posted whose own completion has not arrived. Never inferred from later send
    /// completions: soft-iWARP completes a SEND posted after a READ before the READ's data
    /// is placed.
    inflight: u32,
    /// The peer's send slot (acknowledged once delivered).
    peer_slot: u32,
}

impl Read {
    /// Every byte has landed.
    #[inline]
    fn done(&self) -> bool {
        self.posted == self.len && self.inflight == 0
    }
}

/// A connection's rendezvous state.
pub(super) struct Large {
    p: LargeParts,
    // ---- send side
    /// Per send slot: waiting for the peer's RNDV_DONE.
    tx_out: Box<[bool]>,
    /// Per send slot: `seq + 1` of the last RNDV SEND from its scratch slot (0: none); the
    /// scratch is rewritten only once `sq_completed` passed it.
    tx_scratch_seq: Box<[u64]>,
    /// Send slots the peer acknowledged, to free in `reclaim`.
    acked: Fifo<u32>,
    // ---- receive side
    rx_free: Fifo<u32>,
    /// Per receive slot: lent to the application.
    rx_lent: Box<[bool]>,
    /// Per peer send slot: pulled (or being pulled) and not yet acknowledged; an RNDV naming
    /// such a slot again is a protocol violation (and bounds `acks`).
    peer_busy: Box<[bool]>,
    /// Large messages being pulled or waiting for delivery (at most one per receive slot).
    reads: Fifo<Read>,
    /// READ chunks in flight (all messages).
    chunks: u32,
    /// Peer send slots to acknowledge.
    acks: Fifo<u32>,
    /// Acknowledgements per control frame (fits the peer's receive buffer and our scratch).
    acks_per_frame: usize,
    /// Per acknowledgement buffer: `seq + 1` of its last SEND (0: none).
    ack_seq: [u64; ACK_BUFS],
}

impl Large {
    pub(super) fn new(p: LargeParts, peer_buffer_size: u32) -> Self {
        let tx = p.tx.count() as usize;
        let rx = p.rx.count() as usize;
        let peer = p.peer.slots as usize;
        let mut rx_free = Fifo::new(rx);
        for s in 0..p.rx.count() {
            rx_free.push(s);
        }
        let room = (peer_buffer_size as usize).min(p.ack_scratch.buf_size());
        Large {
            tx_out: vec![false; tx].into_boxed_slice(),
            tx_scratch_seq: vec![0; tx].into_boxed_slice(),
            acked: Fifo::new(tx),
            rx_free,
            rx_lent: vec![false; rx].into_boxed_slice(),
            peer_busy: vec![false; peer].into_boxed_slice(),
            reads: Fifo::new(rx),
            chunks: 0,
            acks: Fifo::new(peer),
            acks_per_frame: room.saturating_sub(ack_frame_len(0)) / ACK_RECORD,
            ack_seq: [0; ACK_BUFS],
            p,
        }
    }

    /// Large messages sent whose pull the peer has not acknowledged yet (their slots are still
    /// the peer's to read). Linear in the send slots: for a closing connection only.
    pub(super) fn tx_pending(&self) -> bool {
        self.tx_out.iter().any(|&out| out)
    }

    /// Large messages in flight or awaiting delivery on the receive side (records behind
    /// them must wait).
    #[inline]
    pub(super) fn reads_pending(&self) -> bool {
        self.reads.len > 0
    }

    /// Whether send slots wait to be freed ([`RdmaConn::reclaim_large`]).
    #[inline]
    pub(super) fn acked_pending(&self) -> bool {
        self.acked.len > 0
    }

    /// Whether acknowledgements are owed ([`RdmaConn::send_acks`]).
    #[inline]
    pub(super) fn acks_owed(&self) -> bool {
        self.acks.len > 0
    }

    /// Whether the oldest large message has landed (it can be delivered).
    #[inline]
    fn front_done(&self) -> bool {
        self.reads.front().is_some_and(|r| r.done())
    }

    /// A READ chunk completed successfully. Chunks are posted message after message and
    /// complete in the order posted, so it is one of the oldest message with chunks in
    /// flight.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when no chunk was in flight.
    pub(super) fn read_done(&mut self) -> Result<(), FabricError> {
        let mut i = 0;
        while let Some(r) = self.reads.get_mut(i) {
            if r.inflight > 0 {
                r.inflight -= 1;
                self.chunks -= 1;
                return Ok(());
            }
            i += 1;
        }
        Err(FabricError::Protocol("rdma read completion without a read"))
    }

    /// What frames are checked against: the peer's send region and our receive slot size;
    /// `None` when this side cannot receive large messages (every RNDV is then refused).
    #[inline]
    pub(super) fn rndv_check(&self) -> Option<(LargeRegion, u32)> {
        (self.p.peer.is_enabled() && self.p.rx.count() > 0).then(|| {
            (
                self.p.peer,
                u32::try_from(self.p.rx.buf_size()).unwrap_or(u32::MAX),
            )
        })
    }
}

impl RdmaConn {
    /// Plans the SEND of large message `d` (`d.buf` has [`LARGE_BIT`]): writes its RNDV frame
    /// into the slot's scratch. `Ok(None)`: not now (the scratch's previous SEND has not
    /// completed yet; it was signalled, so it will).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the connection has no large messages, the slot is out
    /// of range or already in flight, or the message exceeds the slot.
    pub(super) fn plan_rndv(&self, buf: u32, len: u32) -> Result<Option<u32>, FabricError> {
        let l = &self.large;
        let slot = buf & !LARGE_BIT;
        if slot >= l.p.tx.count() || !l.p.peer.is_enabled() {
            return Err(FabricError::Protocol("large send slot out of range"));
        }
        if len as usize > l.p.tx.buf_size() {
            return Err(FabricError::Protocol("large message longer than its slot"));
        }
        if l.tx_out[slot as usize] {
            return Err(FabricError::Protocol("large send slot sent twice"));
        }
        if l.tx_scratch_seq[slot as usize] > self.sq_completed {
            return Ok(None);
        }
        let r = Rndv {
            slot,
            len,
            addr: l.p.tx_region.slot_addr(slot),
            rkey: l.p.tx_region.rkey,
        };
        let dst =
            l.p.rndv_scratch
                .buf_ptr(slot)
                .as_ptr()
                .cast::<[u8; RNDV_FRAME]>();
        // SAFETY: scratch slot `slot` (index checked by `buf_ptr`) is RNDV_SCRATCH >=
        // RNDV_FRAME bytes of the scratch region, owned by this connection (`_keep`); its last
        // SEND completed (checked above), so the HCA no longer reads it, and nothing else
        // writes it. `[u8; N]` has alignment 1.
        write_rndv_frame(unsafe { &mut *dst }, &r);
        Ok(Some(RNDV_FRAME as u32))
    }

    /// Where the RNDV frame of send slot `buf` (with [`LARGE_BIT`]) is: (address, lkey).
    #[inline]
    pub(super) fn rndv_source(&self, buf: u32) -> (u64, u32) {
        let l = &self.large;
        (
            l.p.rndv_scratch.buf_ptr(buf & !LARGE_BIT).as_ptr() as u64,
            l.p.scratch_lkey,
        )
    }

    /// The RNDV SEND of send slot `buf` was posted with sequence `seq`: the slot waits for
    /// its acknowledgement.
    #[inline]
    pub(super) fn track_rndv(&mut self, buf: u32, seq: u64) {
        let s = (buf & !LARGE_BIT) as usize;
        self.large.tx_out[s] = true;
        self.large.tx_scratch_seq[s] = seq + 1;
    }

    /// An RNDV record at the frame cursor: takes it (a free receive slot, its READs posted
    /// as the window allows) or returns `false` to stop there (no free slot). The record was
    /// checked against the peer's region with the frame.
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the peer reuses a slot not yet acknowledged;
    /// [`FabricError::Io`] when a READ cannot be posted.
    pub(super) fn take_rndv(&mut self, r: Rndv) -> Result<bool, FabricError> {
        let l = &self.large;
        let busy = l
            .peer_busy
            .get(r.slot as usize)
            .copied()
            .ok_or(FabricError::Protocol(
                "rndv record names a large slot out of range",
            ))?;
        if busy {
            return Err(FabricError::Protocol(
                "rndv record reuses a large slot before its acknowledgement",
            ));
        }
        let Some(slot) = self.large.rx_free.pop() else {
            return Ok(false);
        };
        let read = Read {
            slot,
            len: r.len,
            addr: r.addr,
            rkey: r.rkey,
            posted: 0,
            inflight: 0,
            peer_slot: r.slot,
        };
        // A free slot means fewer messages than slots are queued: there is room.
        let ok = self.large.reads.push(read);
        debug_assert!(ok, "reads FIFO sized to the receive slots");
        self.large.peer_busy[r.slot as usize] = true;
        if r.len > 0 {
            self.counters.rndv_reads.add(1);
        }
        self.pump_reads()?;
        Ok(true)
    }

    /// Posts READ chunks, oldest message first, while the window ([`READ_WINDOW`], the QP's
    /// initiator depth) and the send queue have room; returns how many.
    ///
    /// # Errors
    ///
    /// [`FabricError::Io`] when a READ cannot be posted.
    pub(super) fn pump_reads(&mut self) -> Result<usize, FabricError> {
        let mut n = 0;
        if self.error.is_some() {
            return Ok(0); // the QP is failing: nothing more is pulled
        }
        let window = self.large.p.max_reads;
        let mut i = 0;
        while self.large.chunks < window && self.sq_room() > 1 {
            let Some(r) = self.large.reads.get_mut(i) else {
                break;
            };
            if r.posted == r.len {
                i += 1;
                continue;
            }
            let len = (r.len - r.posted).min(READ_CHUNK);
            let (slot, off, addr, rkey) = (r.slot, r.posted, r.addr + u64::from(r.posted), r.rkey);
            r.posted += len;
            r.inflight += 1;
            self.large.chunks += 1;
            self.post_read(slot, off, len, addr, rkey)?;
            n += 1;
        }
        Ok(n)
    }

    /// Posts one signalled RDMA READ of `len` bytes from `addr` into receive slot `slot` at
    /// byte `off`.
    fn post_read(
        &mut self,
        slot: u32,
        off: u32,
        len: u32,
        addr: u64,
        rkey: u32,
    ) -> Result<(), FabricError> {
        let mut sge = Sge {
            addr: self.large.p.rx.buf_ptr(slot).as_ptr() as u64 + u64::from(off),
            length: len,
            lkey: self.large.p.rx_lkey,
        };
        let seq = self.sq_posted;
        self.sq_posted += 1;
        self.reads_posted += 1;
        let mut wr = verbs::send_wr_zeroed();
        wr.wr_id = self.tag | (seq & WR_VALUE_MASK);
        wr.opcode = verbs::WR_RDMA_READ;
        wr.send_flags = verbs::SEND_SIGNALED;
        wr.num_sge = 1;
        wr.sg_list = &mut sge;
        verbs::set_rdma(&mut wr, addr, rkey);
        // SAFETY: one initialised WR whose scatter entry lives until the call returns. Its
        // sink is bytes `off .. off + len` of receive slot `slot` (index checked by `buf_ptr`;
        // `off + len` <= the message's length <= the slot size, checked with the frame) in the
        // large receive region registered with LOCAL_WRITE (and REMOTE_WRITE on iWARP), kept
        // alive by `_keep`; the slot was free (taken from `rx_free`) and is not lent to the
        // application before every chunk's completion. The source is the peer's memory,
        // checked against the region it announced.
        unsafe { self.qp.post_send(&mut wr) }.map_err(|e| FabricError::Io(e.errno))?;
        Ok(())
    }

    /// Delivers the oldest large message if its READ completed; returns whether it did.
    ///
    /// # Errors
    ///
    /// The sink's error.
    pub(super) fn deliver_read(&mut self, sink: &mut RxSink<'_>) -> Result<bool, FabricError> {
        if !self.large.front_done() {
            return Ok(false);
        }
        let Some(r) = self.large.reads.front() else {
            return Ok(false);
        };
        sink.push_large(r.slot, r.len)?;
        self.large.reads.pop();
        self.large.rx_lent[r.slot as usize] = true;
        let ok = self.large.acks.push(r.peer_slot);
        debug_assert!(ok, "acks FIFO sized to the peer's slots (peer_busy)");
        Ok(true)
    }

    /// The application dropped large message slot `slot` (the index without [`LARGE_BIT`]).
    ///
    /// # Errors
    ///
    /// [`FabricError::Protocol`] when the slot is not one lent to the application.
    pub(super) fn release_large(&mut self, slot: u32) -> Result<(), FabricError> {
        match self.large.rx_lent.get_mut(slot as usize) {
            Some(lent) if *lent => {
                *lent = false;
                let ok = self.large.rx_free.push(slot);
                debug_assert!(ok, "rx_free sized to the slots");
                Ok(())
            }
            _ => Err(FabricError::Protocol(
                "released a large receive slot that was not lent",
            )),
        }
    }

    /// A control frame of acknowledgements arrived in receive buffer `buf` (`len` bytes):
    /// each names a send slot waiting for one, which `reclaim` then frees.
    pub(super) fn on_ack_frame(&mut self, bytes: &[u8]) -> Result<(), FabricError> {
        let l = &mut self.large;
        read_ack_frame(bytes, |slot| match l.tx_out.get_mut(slot as usize) {
            Some(out) if *out => {
                *out = false;
                let ok = l.acked.push(slot);
                debug_assert!(ok, "acked FIFO sized to the send slots");
                Ok(())
            }
            _ => Err(FabricError::Protocol(
                "rndv acknowledgement for a large slot not in flight",
            )),
        })?;
        Ok(())
    }

    /// Frees the send slots the peer acknowledged.
    ///
    /// # Errors
    ///
    /// As [`TxDone::free_buf`].
    pub(super) fn reclaim_large(&mut self, done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        let mut n = 0;
        while let Some(slot) = self.large.acked.pop() {
            done.free_buf(LARGE_BIT | slot)?;
            n += 1;
        }
        Ok(n)
    }

    /// Sends the acknowledgements owed, one control frame (a SEND that spends a credit, like
    /// a credit message, and may use the reserved one), when a credit, send-queue room and a
    /// free acknowledgement buffer are at hand; otherwise they wait for the next call.
    pub(super) fn send_acks(&mut self) -> Result<(), FabricError> {
        if self.large.acks.len == 0 || self.tx_window.room() == 0 || self.sq_room() == 0 {
            return Ok(());
        }
        let done = self.sq_completed;
        let Some(b) = (0..ACK_BUFS).find(|&b| self.large.ack_seq[b] <= done) else {
            return Ok(());
        };
        let mut slots = [0u32; MAX_LARGE_SLOTS as usize];
        let mut n = 0;
        while n < self.large.acks_per_frame.min(slots.len()) {
            let Some(s) = self.large.acks.pop() else {
                break;
            };
            self.large.peer_busy[s as usize] = false;
            slots[n] = s;
            n += 1;
        }
        let l = &self.large;
        let base = l.p.ack_scratch.buf_ptr(b as u32).as_ptr();
        let cap = l.p.ack_scratch.buf_size();
        // SAFETY: acknowledgement buffer `b` (< ACK_BUFS, the view's count) is `cap` bytes of
        // the scratch region, owned by this connection (`_keep`); its last SEND completed
        // (checked above), so the HCA no longer reads it, and nothing else writes it.
        let dst = unsafe { std::slice::from_raw_parts_mut(base, cap) };
        let len = write_ack_frame(dst, &slots[..n])
            .ok_or(FabricError::Protocol("acknowledgement frame does not fit"))?;
        let imm = IMM_CREDIT_ONLY | IMM_FRAME | self.take_owed();
        let inline = self.send_inline(len as u32);
        let out = Outgoing {
            addr: base as u64,
            len: len as u32,
            imm,
            inline,
            force_signal: true,
        };
        let seq = self.sq_posted;
        self.post_control(out, self.large.p.scratch_lkey)?;
        self.large.ack_seq[b] = seq + 1;
        self.counters.rndv_acks.add(1);
        Ok(())
    }
}
