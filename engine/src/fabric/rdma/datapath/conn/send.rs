//! The send half of [`FabricConn::post_send`](crate::fabric::FabricConn::post_send) on
//! RoCE/InfiniBand: planning a batch into SENDs (runs of small messages coalesced into frames,
//! larger ones left zero-copy in their buffers, in FIFO order), posting the plan as one chain
//! with immediate data, and freeing the buffers the frames copied.

use std::mem::MaybeUninit;

use super::{Outgoing, Planned, RdmaConn};
use crate::desc::{is_large, TxDesc};
use crate::error::FabricError;
use crate::fabric::rdma::datapath::chain::CHAIN;
use crate::fabric::rdma::datapath::frame::{record_bytes, FrameBuilder};
use crate::fabric::rdma::header::IMM_FRAME;
use crate::fabric::rdma::verbs::{self, SendWr, Sge};
use crate::fabric::TxDone;
use crate::record::FRAME_HEADER;

impl RdmaConn {
    /// Whether a `len`-byte SEND goes out with `IBV_SEND_INLINE` (its buffer free at once).
    /// `tx_inline` already leaves room for the iWARP header (setup).
    #[inline]
    pub(super) fn send_inline(&self, len: u32) -> bool {
        len <= self.tx_inline && !matches!(self.hdr, Some(h) if !h.inline)
    }

    /// The immediate (iWARP: header word) of the next SEND: the owed credits, and the frame
    /// flag.
    #[inline]
    pub(super) fn send_word(&mut self, frame: bool) -> u32 {
        self.take_owed() | if frame { IMM_FRAME } else { 0 }
    }

    /// Plans at most `max_sends` SENDs from the front of `descs` into `plan`; returns the
    /// number of SENDs and of descriptors they carry (a prefix of `descs`).
    ///
    /// A message of at most `frame_record_max` bytes followed by one that fits beside it
    /// starts a frame (when coalescing is on): its own buffer becomes the frame, and the
    /// following small messages are copied in while they fit the frame limit. A lone small
    /// message is a SEND of its own buffer, unframed: nothing waits for a frame to fill, and
    /// its receiver takes it without parsing a frame (a frame of one cost the ping-pong about
    /// 500 instructions a message on both sides, under callgrind on rxe). A larger message
    /// closes the frame and is a SEND of its own buffer.
    ///
    /// Returns the planned SENDs (the front of `plan`) and the number of descriptors they carry.
    pub(super) fn plan_sends<'p>(
        &self,
        descs: &[TxDesc],
        max_sends: usize,
        plan: &'p mut [MaybeUninit<Planned>; CHAIN],
    ) -> Result<(&'p [Planned], usize), FabricError> {
        let limit = self.frame_limit as usize;
        let small = self.frame_record_max;
        let mut n = 0;
        let mut i = 0;
        while i < descs.len() && n < max_sends.min(CHAIN) {
            let d = descs[i];
            if is_large(d.buf) {
                // A large message: one RNDV frame (from the slot's scratch), closing any frame
                // before it; the receiver pulls the slot with RDMA READ.
                let Some(len) = self.plan_rndv(d.buf, d.len)? else {
                    break; // its scratch is still being sent: offered again next cycle
                };
                plan[n].write(Planned {
                    buf: d.buf,
                    len,
                    frame: true,
                    first: i as u16,
                    msgs: 1,
                    rndv: true,
                });
                i += 1;
                n += 1;
                continue;
            }
            if d.len > self.peer_buffer_size {
                return Err(FabricError::Protocol(
                    "message larger than the peer's receive buffer",
                ));
            }
            let fits =
                |e: &TxDesc, used: usize| e.len <= small && used + record_bytes(e.len) <= limit;
            if limit > 0
                && fits(&d, FRAME_HEADER)
                && descs
                    .get(i + 1)
                    .is_some_and(|e| fits(e, FRAME_HEADER + record_bytes(d.len)))
            {
                let base = self.tx_pool.buf_ptr(d.buf).as_ptr();
                // SAFETY: `base` is send-pool buffer `d.buf` (index checked by `buf_ptr`), which
                // the engine handed to the fabric with this batch, `buf_size >= limit` bytes
                // long (`frame_limit`), and the frame's first record fits the limit; `d.len <=
                // small <= INLINE_MAX`.
                let mut f = unsafe { FrameBuilder::start(base, d.len) };
                let mut j = i + 1;
                while let Some(e) = descs.get(j) {
                    if !fits(e, f.len()) {
                        break;
                    }
                    let src = self.tx_pool.buf_ptr(e.buf).as_ptr();
                    // SAFETY: the record fits the limit, inside the frame's buffer (above);
                    // `src` is send-pool buffer `e.buf`, holding `e.len <= buf_size` bytes (the
                    // engine checked), handed over with this batch; `copy` tolerates overlap.
                    unsafe { f.push(src, e.len) };
                    j += 1;
                }
                // SAFETY: the frame header lies in the frame's buffer (above).
                let len = unsafe { f.finish() };
                plan[n].write(Planned {
                    buf: d.buf,
                    len,
                    frame: true,
                    first: i as u16,
                    msgs: (j - i) as u16,
                    rndv: false,
                });
                i = j;
            } else {
                plan[n].write(Planned {
                    buf: d.buf,
                    len: d.len,
                    frame: false,
                    first: i as u16,
                    msgs: 1,
                    rndv: false,
                });
                i += 1;
            }
            n += 1;
        }
        // SAFETY: entries `0..n` were written above (each `write` precedes its `n += 1`), and
        // `MaybeUninit<Planned>` has `Planned`'s layout.
        let planned = unsafe { std::slice::from_raw_parts(plan.as_ptr().cast::<Planned>(), n) };
        Ok((planned, i))
    }

    /// Where planned SEND `p` reads from: (address, lkey); a send-pool buffer, or an RNDV
    /// frame's scratch.
    #[inline]
    pub(super) fn send_source(&self, p: &Planned) -> (u64, u32) {
        if p.rndv {
            self.rndv_source(p.buf)
        } else {
            (self.tx_pool.buf_ptr(p.buf).as_ptr() as u64, self.tx_lkey)
        }
    }

    /// Accounting shared by both transports for one planned SEND with sequence `seq`: the
    /// buffer held until a completion (unless inline) and the messages its credit stands for.
    #[inline]
    pub(super) fn track_send(&mut self, p: &Planned, seq: u64) {
        if p.rndv {
            self.track_rndv(p.buf, seq);
        } else if !self.send_inline(p.len) {
            let ok = self.held.push((seq, p.buf));
            debug_assert!(ok, "held FIFO sized to the pool");
        }
        let ok = self.sent_msgs.push(p.msgs);
        debug_assert!(ok, "sent_msgs sized to the peer's credits");
    }

    /// Whether the batch should end with a signalled send: the connection would hold half its
    /// pool or more until a completion.
    #[inline]
    pub(super) fn hoarding(&self, plan: &[Planned]) -> bool {
        let held_after = self.held.len
            + plan
                .iter()
                .filter(|p| !p.rndv && !self.send_inline(p.len))
                .count();
        self.holds_half_pool(held_after)
    }

    /// Whether `held` send buffers waiting for a completion are half the pool or more (then
    /// the next SEND is signalled, so that a completion frees them).
    #[inline]
    fn holds_half_pool(&self, held: usize) -> bool {
        held * 2 >= self.tx_pool.count() as usize
    }

    /// A SEND's work request and scatter entry for `out`, from zero (`sg_list` and `next`
    /// null: the caller links them where they lie when posted).
    #[inline(always)]
    fn send_request(&mut self, out: Outgoing) -> (SendWr, Sge) {
        let mut wr = verbs::send_wr_zeroed();
        let mut sge = Sge {
            addr: 0,
            length: 0,
            lkey: 0,
        };
        self.fill_send(&mut wr, &mut sge, out);
        (wr, sge)
    }

    /// [`post_plan`](Self::post_plan) of one unframed inline SEND of `len` bytes from send
    /// buffer `buf` (RoCE, InfiniBand): a ping-pong's message, the caller having checked the
    /// credit, the send-queue room, the length and that it goes inline. The same work request,
    /// built where it is posted, without the plan's arrays, loops and per-entry branches:
    /// callgrind in the Soft-RoCE VM (`bench lat --fabric rdma --mode rtc --size 8`, the
    /// client under valgrind) put `post_plan` of one at 490 instructions a call, 261 of them
    /// rxe's own `ibv_post_send`.
    #[inline(always)]
    pub(super) fn post_lone_inline(&mut self, buf: u32, len: u32) -> Result<(), FabricError> {
        let out = Outgoing {
            addr: self.tx_pool.buf_ptr(buf).as_ptr() as u64,
            len,
            imm: self.send_word(false),
            inline: true,
            // `hoarding` of a plan of one inline SEND: it holds no buffer itself.
            force_signal: self.holds_half_pool(self.held.len),
        };
        let (mut wr, mut sge) = self.send_request(out);
        if wr.num_sge > 0 {
            wr.sg_list = &mut sge;
        }
        // `track_send` of an inline, unframed SEND: no buffer held, one message's credit.
        let ok = self.sent_msgs.push(1);
        debug_assert!(ok, "sent_msgs sized to the peer's credits");
        self.spend_credits(1);
        // SAFETY: one work request (`next` null, set by `fill_send`) whose scatter entry, if
        // any, is `sge`, alive until the call returns; the payload is inline, copied by the
        // call, from send-pool buffer `buf` (the index checked by `buf_ptr`), which holds `len`
        // bytes the engine handed over with this send.
        unsafe { self.qp.post_send(&mut wr) }.map_err(|e| FabricError::Io(e.errno))
    }

    /// [`post_send`](crate::fabric::FabricConn::post_send) of what its lone-message case
    /// leaves: `descs` planned (at most `max_sends` SENDs: the credits and the send queue's
    /// room), posted in one chain, and the buffers that are free at once handed back.
    #[inline(never)]
    pub(super) fn post_planned(
        &mut self,
        descs: &[TxDesc],
        max_sends: usize,
        done: &mut TxDone<'_>,
    ) -> Result<usize, FabricError> {
        // Uninitialised: `plan_sends` writes the entries it plans (no 1-KiB zeroing per call).
        let mut plan = [const { std::mem::MaybeUninit::<Planned>::uninit() }; CHAIN];
        let (plan, taken) = self.plan_sends(descs, max_sends, &mut plan)?;
        let nplan = plan.len();
        if taken < descs.len() && nplan == max_sends && max_sends < CHAIN {
            self.counters.credit_stalls.add(1);
        }
        if nplan == 0 {
            return Ok(0);
        }
        match self.hdr {
            Some(h) => self.post_plan_hdr(plan, h)?,
            None => self.post_plan(plan)?,
        }
        self.finish_sends(descs, plan, done)?;
        Ok(taken)
    }

    /// Posts `plan` (already limited to the credits and send-queue room) as one chain of
    /// `SEND_WITH_IMM` work requests (RoCE, InfiniBand).
    pub(super) fn post_plan(&mut self, plan: &[Planned]) -> Result<(), FabricError> {
        let n = plan.len();
        // Only the first `n` entries are written and posted (no 1-KiB zeroing per call).
        let mut wrs = [const { std::mem::MaybeUninit::<SendWr>::uninit() }; CHAIN];
        let mut sges = [const { std::mem::MaybeUninit::<Sge>::uninit() }; CHAIN];
        let hoarding = self.hoarding(plan);
        for (i, p) in plan.iter().enumerate() {
            let imm = self.send_word(p.frame);
            let (addr, lkey) = self.send_source(p);
            let out = Outgoing {
                addr,
                len: p.len,
                imm,
                inline: self.send_inline(p.len),
                force_signal: p.rndv || (i + 1 == n && hoarding),
            };
            let (wr, mut sge) = self.send_request(out);
            sge.lkey = lkey;
            sges[i].write(sge);
            wrs[i].write(wr);
            self.track_send(p, self.sq_posted - 1);
        }
        for i in 0..n {
            let sg: *mut Sge = sges[i].as_mut_ptr();
            let next = if i + 1 < n {
                wrs[i + 1].as_mut_ptr()
            } else {
                std::ptr::null_mut()
            };
            // SAFETY: entry i was initialised in the loop above.
            let w = unsafe { wrs[i].assume_init_mut() };
            w.sg_list = if w.num_sge > 0 {
                sg
            } else {
                std::ptr::null_mut()
            };
            w.next = next;
        }
        self.spend_credits(n as u64);
        // SAFETY: `n` chained, initialised WRs whose scatter entries live in `sges` until the call
        // returns. Inline payloads are copied by the call. Non-inline buffers are send-pool
        // buffers (the poller validated the indices) in the pool's registered region; the engine
        // marked them fabric-owned and they stay so (in `held`) until a later signalled
        // completion frees them in `reclaim`. A frame's buffer is its first message's, written
        // by `plan_sends` before this call; an RNDV frame is its slot's scratch (registered,
        // written by `plan_rndv`, untouched until this signalled send completes).
        unsafe { self.qp.post_send(wrs[0].as_mut_ptr()) }.map_err(|e| FabricError::Io(e.errno))
    }

    /// After a posted `plan`: frees the buffers of inline SENDs and of the messages copied into
    /// frames (not the frame's own buffer, unless inline), and counts.
    pub(super) fn finish_sends(
        &mut self,
        descs: &[TxDesc],
        plan: &[Planned],
        done: &mut TxDone<'_>,
    ) -> Result<(), FabricError> {
        let (mut inl, mut frames, mut framed) = (0u64, 0u64, 0u64);
        let mut rndv = 0u64;
        for p in plan {
            if p.rndv {
                // The slot stays the fabric's until the peer acknowledges it.
                rndv += 1;
                frames += 1;
                framed += 1;
                inl += u64::from(self.send_inline(p.len));
                continue;
            }
            if self.send_inline(p.len) {
                done.free_buf(p.buf)?;
                inl += 1;
            }
            if p.frame {
                frames += 1;
                framed += u64::from(p.msgs);
                let first = usize::from(p.first);
                let copied = descs
                    .get(first + 1..first + usize::from(p.msgs))
                    .unwrap_or(&[]);
                for d in copied {
                    done.free_buf(d.buf)?;
                }
            }
        }
        self.counters.inline_sends.add(inl);
        self.counters.pooled_sends.add(plan.len() as u64 - inl);
        if frames > 0 {
            self.counters.frames.add(frames);
            self.counters.framed_messages.add(framed);
        }
        if rndv > 0 {
            self.counters.rndv_sends.add(rndv);
        }
        Ok(())
    }
}
