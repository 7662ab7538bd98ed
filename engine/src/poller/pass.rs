//! Steps of the service pass that the run-to-completion direct way ([`super::direct`]) runs
//! for one connection too: the send-buffer check, the send step (one batch of the send ring,
//! posted) and the receive step (a burst into the receive ring).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use core::mem::MaybeUninit;

use rings::{Consumer, StampedConsumer};

use crate::config::MAX_BATCH;
use crate::desc::{PoolView, RxDesc, TxDesc, TX_INLINE_MAX};
use crate::error::FabricError;
use crate::fabric::{FabricConn, RxSink, SinkTotals, TxDone};
use crate::link::{ConnShared, PollerConn};
use crate::stats::PollerCounters;

/// The poller side of a connection's send buffers: index and length checks (a large slot
/// against the large pool; an inline descriptor, only where the fabric takes them, against
/// [`TX_INLINE_MAX`]).
#[inline]
pub(super) fn valid_tx<C: FabricConn>(d: &TxDesc, pool: &PoolView, large: &PoolView) -> bool {
    // The pool buffer first: one test on the common path (the inline marker, `u32::MAX`, has
    // the large bit set).
    if !crate::desc::is_large(d.buf) {
        d.buf < pool.count() && (d.len as usize) <= pool.buf_size()
    } else if d.is_inline() {
        C::INLINE_SENDS && (d.len as usize) <= TX_INLINE_MAX
    } else {
        crate::desc::large_slot(d.buf) < large.count() && (d.len as usize) <= large.buf_size()
    }
}

/// Whether the engine tracks `d`'s buffer as held by the fabric while it is posted: a large
/// slot, or a buffer the fabric does not copy (an inline descriptor names none).
#[inline(always)]
pub(super) fn holds_buf<C: FabricConn>(fabric: &C, d: &TxDesc) -> bool {
    if crate::desc::is_large(d.buf) {
        !d.is_inline()
    } else {
        !fabric.copies(d.len)
    }
}

/// The send step of the pass: one batch (at most `batch`) of the application's send ring,
/// checked and posted; what the fabric did not accept stays queued. Returns how many it posted.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn post_ring<C: FabricConn>(
    fabric: &mut C,
    tx: &mut StampedConsumer<TxDesc>,
    done: &mut TxDone<'_>,
    tx_pool: &PoolView,
    tx_large: &PoolView,
    shared: &ConnShared,
    batch: usize,
    counters: &PollerCounters,
) -> Result<usize, FabricError> {
    // Copied out of the stamped slots (8 bytes each) into one slice for the fabric; left in
    // the ring until released, so what the fabric does not accept stays queued.
    let mut scratch = [MaybeUninit::<TxDesc>::uninit(); MAX_BATCH];
    let a = tx.peek_into(&mut scratch[..batch.min(MAX_BATCH)]);
    if a.is_empty() {
        return Ok(0);
    }
    let offered = a.len();
    let mut bytes = 0u64;
    for d in a {
        if !valid_tx::<C>(d, tx_pool, tx_large) {
            return Err(FabricError::Protocol("invalid send descriptor"));
        }
        if holds_buf(fabric, d) {
            done.mark_owned(d.buf, true);
        }
        bytes += u64::from(d.len);
    }
    let accepted = fabric.post_send(a, done)?.min(offered);
    if accepted < offered {
        counters.tx_stalls.add(1);
        shared.counters.tx_stalls.add(1);
        // Not accepted: still the application's queue, offered again next cycle.
        for d in a.iter().skip(accepted) {
            if holds_buf(fabric, d) {
                done.mark_owned(d.buf, false);
            }
            bytes -= u64::from(d.len);
        }
    }
    tx.release(accepted);
    if accepted > 0 {
        counters.tx_msgs.add(accepted as u64);
        counters.tx_batches.add(1);
        shared.counters.tx_msgs.add(accepted as u64);
        shared.counters.tx_bytes.add(bytes);
    }
    Ok(accepted)
}

/// A connection's parts for a send step, borrowed apart: the fabric, the sink of send
/// completions over the free ring and the ownership bitmap, and what the step reads beside
/// them (built in one place: [`PollerConn::tx_step`]).
pub(super) struct TxStep<'a, C> {
    pub(super) fabric: &'a mut C,
    pub(super) done: TxDone<'a>,
    pub(super) tx: &'a mut StampedConsumer<TxDesc>,
    pub(super) release: &'a mut Consumer<u32>,
    pub(super) tx_pool: &'a PoolView,
    pub(super) tx_large: &'a PoolView,
    pub(super) shared: &'a ConnShared,
    pub(super) rtc_counters: &'a Option<Arc<PollerCounters>>,
}

impl<C: FabricConn> PollerConn<C> {
    /// Splits the connection for a send step (see [`TxStep`]).
    #[inline(always)]
    pub(super) fn tx_step(&mut self) -> TxStep<'_, C> {
        let PollerConn {
            fabric,
            tx,
            free,
            release,
            tx_owned,
            tx_pool,
            tx_large,
            shared,
            free_scratch,
            rtc_counters,
            ..
        } = self;
        TxStep {
            fabric,
            done: TxDone::new(
                free,
                tx_owned,
                free_scratch,
                tx_pool.count(),
                tx_large.count(),
            ),
            tx,
            release,
            tx_pool,
            tx_large,
            shared,
            rtc_counters,
        }
    }

    /// Publishes the credits the fabric got back (`TxDone::credits`, taken with
    /// [`TxDone::returned`]) to the application (the cumulative counts it reads): messages, and
    /// bytes for a fabric that counts them
    /// ([`FabricConn::app_bytes`](crate::fabric::FabricConn::app_bytes)), if there are any.
    #[inline(always)]
    pub(super) fn return_credits(&mut self, (credits, bytes): (u64, u64)) {
        if credits > 0 {
            self.credits_returned += credits;
            self.shared
                .credits
                .store(self.credits_returned, Ordering::Release);
        }
        if bytes > 0 {
            self.bytes_returned += bytes;
            self.shared
                .credited_bytes
                .store(self.bytes_returned, Ordering::Release);
        }
    }

    /// The receive step of the pass: at most `batch` messages from the fabric into the
    /// application's receive ring (one publication), no more than it can take. Returns how many.
    #[inline(always)]
    pub(super) fn receive(
        &mut self,
        batch: usize,
        counters: &PollerCounters,
    ) -> Result<usize, FabricError> {
        let PollerConn {
            fabric,
            rx,
            rx_pool,
            rx_large,
            shared,
            drained,
            block,
            pack_rx,
            ..
        } = self;
        // The application's head is read only once fewer than a quarter of the slots look
        // free, not whenever anything is unreleased: each read takes the line the application
        // publishes its head on (per message taken), and a ping-pong's every delivery paid it
        // twice, the poller's load before writing the slot and the application's next store
        // (`bench lat --fabric mem --mode dedicated --one-thread --size 8`, cycle stamps: ~80 ns
        // a delivery).
        let refresh = (rx.capacity() / 4).max(1);
        let mut chunk = rx.write_chunk_refresh_below(batch, refresh);
        if chunk.is_empty() {
            counters.rx_ring_full.add(1);
            *drained = false;
            return Ok(0);
        }
        let mut scratch = MaybeUninit::<RxDesc>::uninit();
        let mut sink = RxSink::stamped(&mut chunk, rx_pool).with_large(rx_large);
        if *pack_rx {
            sink = sink.packing(&mut scratch);
        }
        let res = fabric.poll_rx(&mut sink);
        // The slot it was packing is written into the ring as it finishes.
        let SinkTotals {
            written: n,
            slots,
            room,
            bytes,
        } = sink.finish();
        *drained = room > 0;
        // SAFETY: the sink initialised exactly its first `slots` slots, in order (and is gone).
        unsafe { chunk.commit(slots) };
        if *pack_rx && n > 1 {
            // A dedicated poller's stream: the next slot's line, which the application read a
            // lap ago on its core, is asked back now rather than at the next pass's first write.
            rx.prefetch_next();
        }
        res?;
        if n > 0 {
            if C::DIRECT_SEND_AFTER_RECV {
                // The next send may be a ping-pong's (run-to-completion's direct send).
                shared.rtc.clear_stream();
            }
            if *block {
                // An application thread may sleep in `recv_timeout`.
                shared.bell().ring();
            }
            counters.rx_msgs.add(n as u64);
            shared.counters.rx_msgs.add(n as u64);
            shared.counters.rx_bytes.add(bytes);
        }
        Ok(n)
    }
}
