//! The credits of an [`RdmaConn`]: the peer's returns validated and handed to the engine,
//! the credits owed to the peer piggybacked or sent in an explicit credit message, and the
//! posting of control SENDs (credit messages, acknowledgement frames).

use super::{Outgoing, RdmaConn, RdmaConnParts};
use crate::error::FabricError;
use crate::fabric::rdma::header::{IMM_CREDITS_MAX, IMM_CREDIT_ONLY};
use crate::fabric::rdma::verbs::{self, Sge};
use crate::flow::Policy;

/// A connection's window policies (see [`crate::flow`]), the one place they are sized.
///
/// RDMA has two windows each way, in different units. A *credit* is a posted receive buffer:
/// one pays for one SEND (a message, a frame of many, or a control SEND), so a SEND is posted
/// only with a credit in hand and always finds a receive (no RNR). The engine's own window
/// counts *messages* (`depth`): a returned buffer credit gives the engine back the messages of
/// the SEND it paid for. So the sender keeps the buffer window
/// ([`SendWindow`](crate::flow::SendWindow), the peer's posted receives) and translates returns
/// into message credits for the engine, and the receiver owes both: buffer credits for the
/// buffers it re-posted, message credits for the messages they held.
pub(super) struct Windows {
    /// Our SENDs towards the peer: as many as it posted receives for us (`peer_credits`, at
    /// least `MIN_CREDITS`, validated by setup).
    pub(super) tx_buffers: Policy,
    /// The peer's SENDs towards us: our posted receives; its return batch is the low-water
    /// mark of the peer's window below which owed buffer credits go back on their own.
    pub(super) rx_buffers: Policy,
    /// The peer's messages towards us, as its engine counts them (our `depth`): owed message
    /// credits go back on their own once half of it is owed.
    pub(super) rx_messages: Policy,
}

impl Windows {
    pub(super) fn new(p: &RdmaConnParts) -> Windows {
        Windows {
            tx_buffers: Policy::messages(p.peer_credits as usize),
            rx_buffers: Policy::messages(p.rx_posted as usize),
            rx_messages: Policy::messages(p.depth as usize),
        }
    }
}

impl RdmaConn {
    /// `n` SENDs were posted: each took one of the peer's posted receives (the caller checked
    /// the room: plans are limited to the credits, control SENDs need one in hand).
    #[inline]
    pub(super) fn spend_credits(&mut self, n: u64) {
        debug_assert!(n <= self.tx_window.room(), "a SEND without a credit");
        self.tx_window.on_sent(n);
    }

    #[inline]
    pub(super) fn add_peer_credits(&mut self, credits: u32) {
        if credits == 0 {
            return;
        }
        // A peer can only return credits for messages we sent it.
        if self.tx_window.credit(u64::from(credits)).is_err() {
            self.error = Some(FabricError::Protocol(
                "peer returned more credits than messages it received",
            ));
            return;
        }
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

    /// Takes the credits to piggyback on the next message.
    #[inline]
    pub(super) fn take_owed(&mut self) -> u32 {
        // At most what one credit word carries; the rest rides on the next SEND.
        let n = self.rx_return.take_up_to(u64::from(IMM_CREDITS_MAX)) as u32;
        if self.rx_return.owed() == 0 {
            // Returned in full: the messages those buffers held are credited too.
            self.msg_return.take();
        }
        self.peer_window = self.peer_window.saturating_add(n);
        n
    }

    /// Sends an explicit credit message when we owe some and the peer is low on credits: on
    /// receive buffers (its window at or below half), or on the engine's message credits (the
    /// messages we took since the last return reach half our depth: a few frames can carry a
    /// whole depth of messages in a few receive buffers).
    ///
    /// The test inline, the send out of line: it runs after every direct send and every
    /// direct receive, and almost always finds nothing due (as a call it was two calls a
    /// message; under the VM's emulation a call and its return cost more than their
    /// instructions).
    #[inline(always)]
    pub(super) fn maybe_send_credits(&mut self) -> Result<(), FabricError> {
        if self.rx_return.owed() == 0
            || (self.peer_window > self.low_water && !self.msg_return.due(false))
            || self.tx_window.room() == 0
            || self.sq_room() == 0
        {
            return Ok(());
        }
        self.send_credits_now()
    }

    /// [`maybe_send_credits`](Self::maybe_send_credits) when credits are due.
    #[inline(never)]
    fn send_credits_now(&mut self) -> Result<(), FabricError> {
        self.post_credit_message(false)?;
        self.counters.credit_messages.add(1);
        Ok(())
    }

    /// From [`FabricConn::check_peer`](crate::fabric::FabricConn::check_peer) (every few
    /// milliseconds): credits still owed for messages taken while this side sent nothing since the
    /// last check go back in a credit message, so a peer whose depth is smaller than ours (whose
    /// window `maybe_send_credits` cannot see) waits at most that long, never for a heartbeat.
    pub(super) fn return_idle_credits(&mut self) -> Result<(), FabricError> {
        let idle = self.sq_posted == self.checked_sq;
        self.checked_sq = self.sq_posted;
        // `msg_return` owed: only credits of messages the application took. A buffer that held
        // a credit message is owed too, but returning that alone would answer each credit
        // message with another, a ping-pong at idle.
        if idle
            && self.rx_return.owed() > 0
            && self.msg_return.owed() > 0
            && self.error.is_none()
            && self.tx_window.room() > 0
            && self.sq_room() > 0
        {
            self.post_credit_message(false)?;
            self.counters.credit_messages.add(1);
            self.checked_sq = self.sq_posted;
        }
        Ok(())
    }

    /// Posts one credit message (no payload, the owed credits), spending a credit; `signal`:
    /// signalled whatever the signalling interval.
    pub(super) fn post_credit_message(&mut self, signal: bool) -> Result<(), FabricError> {
        let imm = IMM_CREDIT_ONLY | self.take_owed();
        let out = Outgoing {
            addr: 0,
            len: 0,
            imm,
            inline: true,
            force_signal: signal,
        };
        self.post_control(out, 0)
    }

    /// Posts one control SEND (a credit message, or a control frame of `out.len` bytes at
    /// `out.addr` in a region with key `lkey`), spending a credit, counted as a control send.
    pub(super) fn post_control(&mut self, out: Outgoing, lkey: u32) -> Result<(), FabricError> {
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
        self.spend_credits(1);
        self.ctrl_outstanding += 1;
        // SAFETY: a zero-length send names no memory; a control frame's gather entry is its
        // scratch buffer (registered, key `lkey`), which the caller leaves untouched until this
        // signalled send completes; on iWARP the first gather entry is the send's header slot
        // (see `write_send_hdr`). Inline payloads are copied by the call.
        unsafe { self.qp.post_send(&mut wr) }.map_err(|e| FabricError::Io(e.errno))?;
        Ok(())
    }
}
