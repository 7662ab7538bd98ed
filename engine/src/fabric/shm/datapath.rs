//! The shm fabric's data path: what a poller runs for each shm connection.
//!
//! Every call does a bounded amount of work, touches only the segment and local state, and turns
//! anything invalid the peer wrote into a [`FabricError`] (through the wire layer's validation).

use crate::desc::{PoolView, TxDesc, INLINE_MAX};
use crate::error::FabricError;
use crate::fabric::{Fabric, FabricConn, RxSink, TxDone};

use super::wire::{RxPayload, RxRing, Segment, TxRing, WireError};

/// Buffers reclaimed per wire call.
const RECLAIM_BURST: usize = 32;

/// Per-poller state of the shm fabric: none (every connection polls its own rings).
#[derive(Debug, Default)]
pub struct ShmFabric;

impl Fabric for ShmFabric {
    const NAME: &'static str = "shm";
    type Conn = ShmConn;
    type Command = ();

    fn on_command(&mut self, _command: ()) {}
}

/// One shm connection's data-path state: this side's send ring, receive ring and the segment.
pub struct ShmConn {
    tx: TxRing,
    rx: RxRing,
    seg: Segment,
    tx_pool: PoolView,
    inline_max: usize,
    /// One entry per posted batch still in flight, oldest first: the ring position just past the
    /// batch's last message and how many messages it holds (a FIFO of `ends.len()` entries, a
    /// power of two >= the ring depth, so it never overflows: every batch takes at least one
    /// slot). A batch's credits return once the receiver consumed all of it.
    ends: Box<[(u64, u32)]>,
    ends_head: usize,
    ends_len: usize,
    /// Messages in the batches of `ends`.
    ends_msgs: usize,
    /// Read the consumer head for credits only once this many messages are in flight (the
    /// application still has `depth - credit_check` credits meanwhile), so an idle or ping-pong
    /// connection does not pull the peer's head cache line every cycle.
    credit_check: usize,
}

impl std::fmt::Debug for ShmConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmConn")
            .field("tx", &self.tx)
            .field("rx", &self.rx)
            .finish()
    }
}

#[inline]
fn wire_err(e: WireError) -> FabricError {
    match e {
        WireError::Corrupt { what, .. } => FabricError::Protocol(what.name()),
        WireError::BufferNotHeld { .. } => FabricError::Protocol("released a buffer not held"),
        WireError::BufferInFlight { .. } => FabricError::Protocol("sent a buffer in flight"),
        WireError::BadBufferIndex { .. } => FabricError::Protocol("buffer index out of range"),
        WireError::PayloadTooLarge { .. } => FabricError::Protocol("payload too large"),
        _ => FabricError::Protocol("shm wire error"),
    }
}

impl ShmConn {
    /// Wraps the split rings of an established segment.
    pub(crate) fn new(
        tx: TxRing,
        rx: RxRing,
        seg: Segment,
        tx_pool: PoolView,
        inline_max: usize,
        depth: usize,
    ) -> ShmConn {
        let ring_depth = seg.params().ring_depth as usize;
        let cap = ring_depth.next_power_of_two().max(1);
        ShmConn {
            tx,
            rx,
            seg,
            tx_pool,
            inline_max: inline_max.min(INLINE_MAX),
            ends: vec![(0u64, 0u32); cap].into_boxed_slice(),
            ends_head: 0,
            ends_len: 0,
            ends_msgs: 0,
            credit_check: (depth / 2).max(1),
        }
    }

    /// Records a posted batch of `n > 0` messages ending at ring position `pos`.
    #[inline]
    fn push_end(&mut self, pos: u64, n: usize) {
        let mask = self.ends.len() - 1;
        // `ends_len < ends.len()`: at most `ring_depth` batches are in flight.
        if let Some(e) = self.ends.get_mut((self.ends_head + self.ends_len) & mask) {
            *e = (pos, n as u32);
            self.ends_len += 1;
            self.ends_msgs += n;
        }
    }
}

impl FabricConn for ShmConn {
    #[inline]
    fn rx_pending(&mut self) -> bool {
        self.rx.has_pending()
    }

    #[inline]
    fn quiescent(&mut self) -> bool {
        // Exactly what `reclaim` and `flush` look at: pooled buffers to reclaim, enough records
        // out to collect credits, releases to publish.
        self.tx.in_flight() == 0
            && self.ends_msgs < self.credit_check
            && !self.rx.has_unpublished_releases()
    }

    #[inline]
    fn copies(&self, len: u32) -> bool {
        // Exactly `post_send`'s inline test.
        len as usize <= self.inline_max
    }

    #[inline]
    fn poll_rx(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        let mut n = 0;
        while sink.room() > 0 {
            let Some(d) = self.rx.poll().map_err(wire_err)? else {
                break;
            };
            match d.payload() {
                RxPayload::Inline { .. } => {
                    // Straight from the segment into the application's ring slot: one copy.
                    let rx = &self.rx;
                    sink.push_inline_with(d.len(), |out| {
                        rx.copy_inline_uninit(&d, out).map_err(wire_err)
                    })?;
                }
                RxPayload::Buffer { index } => sink.push_pooled(index, d.len() as u32)?,
            }
            n += 1;
        }
        if n > 0 {
            // One head store for the whole burst: the sender gets the slots (credits) back.
            self.rx.commit();
        }
        Ok(n)
    }

    #[inline]
    fn post_send(&mut self, descs: &[TxDesc], done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        let mut n = 0;
        for d in descs {
            let len = d.len as usize;
            if self.copies(d.len) {
                // SAFETY: the engine checked `d.buf < count` and `len <= buf_size`; the buffer is
                // owned by the poller now (the application gave it up in `send`) and the segment
                // stays mapped while `self.tx` lives.
                let payload = unsafe {
                    std::slice::from_raw_parts(self.tx_pool.buf_ptr(d.buf).as_ptr(), len)
                };
                if !self.tx.try_send_inline(payload, 0).map_err(wire_err)? {
                    break;
                }
                // Copied into the ring: the buffer is free again at once (`copies` said so, so
                // the engine did not mark it held).
                done.free_copied(d.buf)?;
            } else if !self.tx.try_send_buf(d.buf, d.len, 0).map_err(wire_err)? {
                break;
            }
            n += 1;
        }
        if n > 0 {
            // One credit record per batch, not per message.
            self.push_end(self.tx.position(), n);
        }
        Ok(n)
    }

    #[inline]
    fn release_rx(&mut self, bufs: &[u32]) -> Result<(), FabricError> {
        for &b in bufs {
            self.rx.release(b).map_err(wire_err)?;
        }
        Ok(())
    }

    #[inline]
    fn reclaim(&mut self, done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        let mut work = 0;
        if self.tx.in_flight() > 0 {
            let mut out = [0u32; RECLAIM_BURST];
            loop {
                let k = self.tx.reclaim(&mut out).map_err(wire_err)?;
                for &b in &out[..k] {
                    done.free_buf(b)?;
                }
                work += k;
                if k < RECLAIM_BURST {
                    break;
                }
            }
        }
        if self.ends_msgs >= self.credit_check {
            let head = self.tx.refresh_head().map_err(wire_err)?;
            let mask = self.ends.len() - 1;
            let mut credits = 0u64;
            while self.ends_len > 0 && self.ends[self.ends_head & mask].0 <= head {
                let n = self.ends[self.ends_head & mask].1;
                self.ends_head = (self.ends_head + 1) & mask;
                self.ends_len -= 1;
                self.ends_msgs -= n as usize;
                credits += u64::from(n);
            }
            if credits > 0 {
                done.credits(credits);
                work += 1;
            }
        }
        Ok(work)
    }

    #[inline]
    fn flush(&mut self) -> Result<(), FabricError> {
        self.rx.publish_releases();
        Ok(())
    }

    #[inline]
    fn check_peer(&mut self, _now_ns: u64) -> Result<(), FabricError> {
        if self.seg.is_peer_closed() {
            return Err(FabricError::PeerClosed);
        }
        Ok(())
    }

    fn close(&mut self) {
        self.rx.publish_releases();
        self.seg.mark_closed();
    }
}
