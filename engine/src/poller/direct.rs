//! The poller's half of a connection driven by the application thread itself in
//! run-to-completion mode, one message at a time ([`RtcConn`]): what the service pass does for
//! that message, without the application↔poller rings and without a whole poller cycle around
//! it. The poller registers where it keeps the half ([`ConnShared::rtc`], its agent's
//! [`rtc_tag`] and table slot); the application thread finds it through the run-to-completion
//! guard ([`super::RtcGuard::direct`] → `Agents::rtc_conn` → [`Poller::rtc_conn`]).

use std::mem::MaybeUninit;

use super::pass::{holds_buf, post_ring, valid_tx, TxStep};
use super::{Fabric, Poller, DIRECT_BURST};
use crate::desc::{RxDesc, TxDesc};
use crate::error::FabricError;
use crate::fabric::{ConnTable, FabricConn, RxSink};
use crate::link::{ConnShared, PollerConn, Posted, RtcConn};

impl<C: FabricConn> PollerConn<C> {
    /// Whether a direct call may bypass the pass now: the connection is open for it (not
    /// closing, not draining a departed peer) and no failure waits for the pass.
    #[inline]
    fn direct_open(&self) -> bool {
        !self.closing && !self.draining && self.deferred.is_none()
    }

    /// After a direct receive delivered: the fabric's receive-side flush
    /// ([`FabricConn::rx_taken`]; nothing for mem and tcp), a failure deferred to the pass.
    #[inline(always)]
    fn rx_taken(&mut self) {
        if let Err(e) = self.fabric.rx_taken() {
            self.defer(e);
        }
    }

    /// A failure met outside the pass: the next pass reports it (the first one wins).
    #[cold]
    fn defer(&mut self, e: FabricError) {
        if self.deferred.is_none() {
            self.deferred = Some(e);
        }
    }

    /// After a direct take delivered and more is pending: a burst of [`DIRECT_BURST`] into the
    /// receive ring, and more bursts while the fabric holds a unit split
    /// ([`FabricConn::rx_split`]) and the ring has room, so that the unit's resources go back
    /// at this take, as the pass (its `batch`, 128 in the bench) does. RDMA: an 8-B stream's
    /// window is one frame of 128 records, whose buffer and credit went back only when the
    /// application took its last record, at the fourth take of 1 + 32; the sender's next
    /// window then left after the receiver had taken three quarters of this one, not when it
    /// arrived.
    #[inline]
    fn recv_rest(&mut self) -> usize {
        let mut n = self.recv_burst(DIRECT_BURST);
        let mut last = n;
        while last > 0 && self.fabric.rx_split() {
            last = self.recv_burst(DIRECT_BURST);
            n += last;
        }
        n
    }
}

/// The tag of fabric `F`'s agent in the run-to-completion registration
/// ([`crate::link::RtcSlot`]): FNV-1a of its name (nonzero; the names differ).
pub(crate) const fn rtc_tag<F: Fabric>() -> u64 {
    let name = F::NAME.as_bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < name.len() {
        h ^= name[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    if h == 0 {
        1
    } else {
        h
    }
}

impl<F: Fabric> Poller<F> {
    /// Run-to-completion's direct way: the half in table slot `slot`, if it is the one of the
    /// connection `shared` (else `None`: the registration was not this agent's or is stale).
    ///
    /// `rx`: the caller takes a receive. For a fabric whose completions are shared
    /// ([`Fabric::SHARED_COMPLETIONS`], RDMA's CQ) and a half with nothing pending, the
    /// agent's shared poll runs first, as the cycle's step 2: what it files with other
    /// connections waits there for the next pass, as a backlog does (and keeps the agent from
    /// sleeping until a pass ran, see `arm`). When that poll leaves the half nothing to deliver
    /// and nothing released to give back, `None`: the receive would find nothing, and every
    /// caller takes `None` as it takes an empty receive (a spinning receiver's turn is one
    /// call shorter; under the rxe VM's emulation a call costs more than its instructions).
    #[inline]
    pub(crate) fn rtc_conn(
        &mut self,
        slot: u32,
        shared: &ConnShared,
        rx: bool,
    ) -> Option<&mut dyn RtcConn> {
        if F::SHARED_COMPLETIONS && rx && !self.direct_shared_poll(slot) {
            return None;
        }
        let c = self.slots.get_mut(slot as usize)?.as_deref_mut()?;
        if !std::ptr::eq(&*c.shared, shared) {
            return None;
        }
        Some(c)
    }

    /// [`rtc_conn`](Self::rtc_conn)'s shared poll, when the half in `slot` is open for the
    /// direct way and has nothing pending. `false`: the half is open for the direct way and,
    /// after the poll, has nothing to deliver and no released buffer to give back (its
    /// `recv_one` and `recv_burst` would return at once, finding nothing). Out of line:
    /// inlined, it kept the whole lookup out of line for every fabric (callgrind, `bench cost
    /// --fabric mem`: `Polled::send` and `try_recv` 16-21 instructions a call more,
    /// `Agents::rtc_conn` a call of its own).
    #[inline(never)]
    fn direct_shared_poll(&mut self, slot: u32) -> bool {
        let poll = match self.slots.get_mut(slot as usize) {
            Some(Some(c)) => c.direct_open() && !c.fabric.rx_pending(),
            _ => false,
        };
        if !poll {
            return true;
        }
        let n = self.fabric.poll_shared(&mut ConnTable {
            slots: &mut self.slots,
        });
        self.unserved |= n > 0;
        match self.slots.get_mut(slot as usize) {
            Some(Some(c)) => c.fabric.rx_pending() || !c.release.is_empty(),
            _ => true,
        }
    }
}

impl<C: FabricConn> RtcConn for PollerConn<C> {
    #[inline]
    fn send_one(&mut self, d: TxDesc) -> Posted {
        // Sends queued in the ring go first (FIFO); the pass posts them.
        if !self.direct_open() || !self.tx.is_empty() {
            return Posted::No;
        }
        let TxStep {
            fabric,
            mut done,
            tx_pool,
            tx_large,
            shared,
            rtc_counters,
            ..
        } = self.tx_step();
        if !valid_tx::<C>(&d, tx_pool, tx_large) {
            // The pass fails the connection with it.
            return Posted::No;
        }
        let held = holds_buf(&*fabric, &d);
        if held {
            done.mark_owned(d.buf, true);
        }
        let mut failed = None;
        let accepted = match fabric.post_one(&d, &mut done) {
            Ok(n) => n.min(1),
            Err(e) => {
                failed = Some(e);
                0
            }
        };
        if accepted == 0 && held {
            done.mark_owned(d.buf, false);
        }
        if C::DIRECT_SEND_AFTER_RECV && accepted == 0 && failed.is_none() {
            // A stream's send: the next ones go through the send ring without asking, until
            // a message is delivered (`clear_stream`).
            shared.rtc.set_stream();
        }
        // Copied and freed by this very post: the caller keeps the buffer, without the free
        // ring's push and pop (callgrind, `bench cost --fabric mem`: 2024 -> 2007 instructions
        // per round trip). Also a buffer marked held above that the post freed at once (rdma's
        // lone inline SEND: `free_buf` cleared its mark): it came back through the free ring,
        // a push, a publication and the next `alloc`'s pop per ping-pong send.
        let free = accepted == 1 && done.take_only(d.buf);
        if let Err(e) = done.publish() {
            failed = failed.or(Some(e));
        }
        let credits = done.returned();
        if accepted == 1 {
            if let Some(c) = rtc_counters {
                c.tx_msgs.add(1);
                c.tx_batches.add(1);
            }
            shared.counters.tx_msgs.add(1);
            shared.counters.tx_bytes.add(u64::from(d.len));
            if let Err(e) = fabric.flush() {
                failed = failed.or(Some(e));
            }
        }
        self.return_credits(credits);
        if let Some(e) = failed {
            self.defer(e);
        }
        match (accepted, free) {
            (0, _) => Posted::No,
            (_, false) => Posted::Held,
            (_, true) => Posted::Free,
        }
    }

    #[inline]
    fn post_queued(&mut self, max: usize) -> bool {
        if !self.direct_open() {
            return false;
        }
        // Moved out and back (no reference count traffic on the data path).
        let Some(counters) = self.rtc_counters.take() else {
            return false;
        };
        let TxStep {
            fabric,
            mut done,
            tx,
            tx_pool,
            tx_large,
            shared,
            ..
        } = self.tx_step();
        let mut res = post_ring(
            fabric, tx, &mut done, tx_pool, tx_large, shared, max, &counters,
        )
        .map(|_| ());
        if let Err(e) = done.publish() {
            res = res.and(Err(e));
        }
        let credits = done.returned();
        if res.is_ok() {
            res = fabric.flush();
        }
        self.rtc_counters = Some(counters);
        self.return_credits(credits);
        if let Err(e) = res {
            self.defer(e);
            return false;
        }
        self.tx.is_empty()
    }

    #[inline]
    fn recv_one(&mut self, out: &mut MaybeUninit<RxDesc>) -> bool {
        // Messages delivered into the ring go first (FIFO): the application takes them there.
        if !self.direct_open() || self.rx.slots() != self.rx.capacity() {
            return false;
        }
        if !self.release.is_empty() {
            // Buffers the application dropped go back as in the pass, so that a receiver that
            // always finds a message still returns them.
            let chunk = self.release.read_chunk_up_to(usize::MAX);
            let (a, b) = chunk.as_slices();
            let mut res = self.fabric.release_rx(a);
            if res.is_ok() && !b.is_empty() {
                res = self.fabric.release_rx(b);
            }
            chunk.release_all();
            if let Err(e) = res {
                self.defer(e);
                return false;
            }
        }
        if !self.fabric.rx_pending() {
            return false;
        }
        let PollerConn {
            fabric,
            rx_pool,
            rx_large,
            shared,
            rtc_counters,
            ..
        } = self;
        let mut sink =
            RxSink::new(std::slice::from_mut(out), &mut [], rx_pool).with_large(rx_large);
        let res = fabric.poll_rx_one(&mut sink);
        let n = sink.written();
        let bytes = sink.bytes();
        if n > 0 {
            if C::DIRECT_SEND_AFTER_RECV {
                shared.rtc.clear_stream();
            }
            if let Some(c) = rtc_counters {
                c.rx_msgs.add(1);
            }
            shared.counters.rx_msgs.add(1);
            shared.counters.rx_bytes.add(bytes);
        }
        if let Err(e) = res {
            // Delivered before it failed: still the application's (as in the pass).
            self.defer(e);
            return n > 0;
        }
        // The rest of a burst: into the ring, so that the next receives take it there (one
        // publication for the burst instead of the poller taken per message); a burst that
        // delivered runs the fabric's receive-side flush itself.
        if n > 0 && !(self.fabric.rx_more() && self.recv_rest() > 0) {
            self.rx_taken();
        }
        n > 0
    }

    #[inline]
    fn recv_burst(&mut self, max: usize) -> usize {
        if !self.direct_open() || !self.fabric.rx_pending() {
            return 0;
        }
        // Moved out and back (no reference count traffic on the data path).
        let Some(counters) = self.rtc_counters.take() else {
            return 0;
        };
        let res = self.receive(max, &counters);
        self.rtc_counters = Some(counters);
        match res {
            Ok(n) => {
                if n > 0 {
                    self.rx_taken();
                }
                n
            }
            Err(e) => {
                // What the sink took before the failure is in the ring; the caller's pass
                // reports the failure, and the ring is drained after it.
                self.defer(e);
                0
            }
        }
    }
}
