//! The receive side of an [`RdmaConn`]: completions filed by the poller (the credit word read,
//! the message queued), delivery to the application (messages, frames split into records,
//! large messages), and the re-posting of receive buffers in chains.

use std::sync::atomic::Ordering;

use super::super::chain::{post_recv_chains, recv_len, recv_sge, CHAIN};
use super::super::frame::FrameCursor;
use super::super::rndv::Rndv;
use super::{RdmaConn, RxKind};
use crate::desc::PoolView;
use crate::error::FabricError;
use crate::fabric::rdma::counters::{bump, COUNTERS};
use crate::fabric::rdma::header::{read_hdr, IMM_CREDITS_MAX, IMM_CREDIT_ONLY, IMM_FRAME};
use crate::fabric::rdma::verbs::{self, RecvWr, WorkCompletion};
use crate::fabric::rdma::wr_id::{recv_wr_id, WR_RECV, WR_SRQ, WR_VALUE_MASK};
use crate::fabric::RxSink;
use crate::record::Record;

impl RdmaConn {
    /// Files one completion of this connection (called from
    /// [`Fabric::poll_shared`](crate::fabric::Fabric::poll_shared)).
    #[inline(always)]
    pub(in super::super) fn on_completion(&mut self, wc: &WorkCompletion) {
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
            // Release, after `completion_errors`: `stats` loads these first (Acquire), so no
            // snapshot shows more of them than error completions.
            if status == verbs::WC_RNR_RETRY_EXC_ERR {
                COUNTERS.rnr_errors.fetch_add(1, Ordering::Release);
            } else if status == verbs::WC_WR_FLUSH_ERR {
                COUNTERS.flushed_completions.fetch_add(1, Ordering::Release);
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

    /// [`post_recvs`](Self::post_recvs) of one buffer, inline for a RoCE/InfiniBand QP of
    /// its own (a ping-pong's receive); the shared queue and iWARP's header slots take the
    /// general call.
    #[inline(always)]
    fn repost_one(&mut self, buf: u32) -> Result<(), FabricError> {
        if self.srq.is_some() || self.hdr.is_some() {
            return self.post_recvs(std::slice::from_ref(&buf));
        }
        self.post_one_own(buf)
    }

    /// One receive posted to this QP's own receive queue (no shared queue, no header slot),
    /// its work request built where it is posted: through the chains a one-buffer re-post
    /// paid their arrays, loops and closures (about 40 instructions, callgrind on rxe).
    #[inline(always)]
    fn post_one_own(&mut self, buf: u32) -> Result<(), FabricError> {
        let mut sge = recv_sge(&self.rx_pool, recv_len(&self.rx_pool), self.rx_lkey, buf)?;
        let mut wr = RecvWr {
            wr_id: recv_wr_id(self.gen, buf),
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        // SAFETY: one initialised work request whose scatter entry `sge` lives until the call
        // returns; the buffer is a receive-pool buffer (index checked) inside the region
        // registered with LOCAL_WRITE, owned by the fabric until its completion is polled.
        unsafe { self.qp.post_recv(&mut wr) }.map_err(|e| FabricError::Io(e.errno))?;
        self.rx_return.on_consumed(1);
        Ok(())
    }

    /// The re-post of a delivered lone message's buffer `buf`, kept for later: a ping-pong's
    /// receiver re-posted it between the message's completion and its delivery, on the round
    /// trip's path (about 245 instructions a message, 126 of them rxe's `ibv_post_recv`, where
    /// the whole engine's share of a receive is about 500, callgrind on rxe; on real hardware a
    /// work queue entry written and a doorbell record stored). It is posted, with its buffer
    /// and message credits owed, by the next `flush`: a direct send's, after its doorbell (the
    /// reply of a ping-pong, already on its way), or the pass's (a spinning run-to-completion
    /// receiver runs one every few empty takes, while it waits for the next message; a
    /// dedicated poller at the end of the pass that delivered it); or by the general delivery
    /// loop, or here once `later_max` wait (one chain, one `ibv_post_recv`). The peer's window
    /// is short by the waiting buffers meanwhile (an eighth of it at most, `later_max`); no
    /// credit is granted for a buffer before it is posted, so no RNR.
    #[inline(always)]
    fn repost_later(&mut self, buf: u32) -> Result<(), FabricError> {
        // `later_n < later_max <= REPOST_LATER_MAX`: the last call posted them at the limit.
        if let Some(slot) = self.later.get_mut(self.later_n as usize) {
            *slot = buf;
            self.later_n += 1;
        }
        if self.later_n >= self.later_max {
            self.repost_waiting()?;
        }
        Ok(())
    }

    /// Posts the re-posts that wait ([`repost_later`](Self::repost_later)), in one chain, and
    /// owes their credits (nothing is posted once the QP is in error: `release_bufs`).
    #[inline(never)]
    pub(super) fn repost_waiting(&mut self) -> Result<(), FabricError> {
        let n = std::mem::take(&mut self.later_n) as usize;
        if n == 1 {
            // A ping-pong's: `repost_one`, inline (through `release_bufs` and `post_recvs` it
            // was two calls more, about 100 instructions, callgrind on rxe). Waiting re-posts
            // are never a shared queue's (`later_max`), so an error leaves nothing to post.
            if self.error.is_none() {
                self.repost_one(self.later[0])?;
                self.msg_return.on_consumed(1);
            }
            return Ok(());
        }
        let bufs = self.later;
        self.release_bufs(&bufs[..n.min(bufs.len())])
    }

    /// Re-posts receive buffers `bufs`, one chain (one `ibv_post_recv`) per [`CHAIN`] buffers.
    fn post_recvs(&mut self, bufs: &[u32]) -> Result<(), FabricError> {
        if let Some(srq) = &self.srq {
            srq.post(bufs)?;
            let n = bufs.len() as u32;
            self.srq_held = self.srq_held.saturating_sub(n);
            self.rx_return.on_consumed(u64::from(n));
            return Ok(());
        }
        if let Some(h) = self.hdr {
            return self.post_recvs_hdr(bufs, h);
        }
        if let [buf] = *bufs {
            // A ping-pong's re-post: one work request, without the chains' arrays and loops.
            return self.post_one_own(buf);
        }
        let (qp, gen, owed) = (&self.qp, self.gen, &mut self.rx_return);
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
                owed.on_consumed(u64::from(n));
                Ok(())
            },
        )
    }

    /// Re-posts released ordinary receive buffers (nothing once the QP is in error, unless
    /// they are shared).
    pub(super) fn release_bufs(&mut self, bufs: &[u32]) -> Result<(), FabricError> {
        if bufs.is_empty() || (self.error.is_some() && self.srq.is_none()) {
            return Ok(()); // the QP is in error: nothing to re-post to
        }
        self.post_recvs(bufs)?;
        self.msg_return.on_consumed(bufs.len() as u64);
        Ok(())
    }

    /// [`FabricConn::poll_rx`](crate::fabric::FabricConn::poll_rx): delivers what was received, in
    /// order, and re-posts the buffers that are free again.
    ///
    /// Its two common cases inline, the general loop ([`deliver_all`](Self::deliver_all)) out
    /// of line: under the VM's emulation a call and its return cost more than their
    /// instructions (`scripts/rdma-vm-ab.sh`: fewer calls per message, a shorter round trip).
    #[inline(always)]
    pub(super) fn deliver(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        if self.rx_frame.is_none() && !self.large.reads_pending() {
            // No frame being split and no large message being read: the two common cases.
            if self.rx_pending.len == 0 {
                // Nothing received: what the loop would find at once, without setting it up
                // (a busy-polling receiver takes this way on almost every call: about 100 of
                // its 144 instructions per empty call were the set-up, under callgrind on rxe).
                return self.check().map(|()| 0);
            }
            if self.rx_pending.len == 1 {
                // A ping-pong's receive: one lone message, nothing else queued. What the loop
                // does for it (delivered inline, its buffer re-posted with its credit),
                // without the loop's set-up (the re-post array zeroed, the rendezvous check).
                if let Some((buf, len, RxKind::Message)) = self.rx_pending.front() {
                    if len <= self.rx_inline && sink.room() > 0 {
                        self.rx_pending.pop();
                        let pool = self.rx_pool;
                        // SAFETY: as in the loop: a completed receive of `len <= buf_size`
                        // bytes, ours until re-posted below.
                        let data = unsafe { rx_bytes(&pool, buf, len) };
                        sink.push_inline(data)?;
                        if self.later_max > 1 {
                            self.repost_later(buf)?;
                        } else {
                            if self.error.is_none() || self.srq.is_some() {
                                self.repost_one(buf)?;
                            }
                            self.msg_return.on_consumed(1);
                        }
                        self.received = true;
                        return Ok(1);
                    }
                }
            }
        }
        self.deliver_all(sink)
    }

    /// [`deliver`](Self::deliver) of everything else: frames, large messages, several
    /// messages, credit messages.
    #[inline(never)]
    fn deliver_all(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        if self.later_n > 0 {
            self.repost_waiting()?;
        }
        let mut delivered = 0;
        let mut repost = [0u32; CHAIN];
        let mut nrepost = 0;
        let pool = self.rx_pool;
        let mut failed = None;
        // The engine's messages whose credit goes back with the buffers re-posted below (a
        // frame's records once its buffer is, a lone inline message with its own) or with
        // none (a large message, once delivered: its RNDV frame's buffer went back already).
        let mut credited = 0;
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
                    credited += 1;
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
                cur.data += data as u16;
                if cur.left() == 0 {
                    self.rx_frame = None;
                    repost[nrepost] = cur.buf;
                    nrepost += 1;
                    credited += usize::from(cur.data);
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
                credited += 1;
            } else {
                sink.push_pooled(buf, len)?;
            }
            delivered += 1;
        }
        // Shared buffers always go back to the SRQ (it outlives this connection's QP).
        if nrepost > 0 && (self.error.is_none() || self.srq.is_some()) {
            self.post_recvs(&repost[..nrepost])?;
        }
        // Message credits are owed for exactly the messages the returned buffer credits stand
        // for at the sender (`add_peer_credits` gives back a SEND's messages with its buffer):
        // pooled messages count when the application releases their buffers (`release_rx`),
        // a frame's records when its buffer is re-posted, not record by record. Counted as
        // delivered, a frame split over several calls (run-to-completion's direct take: one
        // record, then a burst of 32) had its first records' credit "returned" with an
        // earlier buffer's, whose SEND gave the sender back only its own messages; the rest
        // stayed below the return threshold while the sender's window was spent, and the
        // stream waited for the liveness check's idle return (every 10 ms) about once in four
        // windows (`bench rate --fabric rdma`, 8 B, in the rxe VM).
        self.msg_return.on_consumed(credited as u64);
        if let Some(e) = failed {
            return Err(e);
        }
        if delivered == 0 {
            // A failed connection's READs never complete: what waits for one is lost.
            if let (true, Some(e)) = (stuck, self.error) {
                return Err(e);
            }
            self.check()?;
        } else {
            self.received = true;
        }
        Ok(delivered)
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
