//! [`TcpConn`]'s construction and its [`FabricConn`] implementation, which the send side
//! (`send`), the receive side (`recv`) and large records (`large`) serve.

use std::any::Any;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use crate::desc::{is_large, large_slot, TxDesc, INLINE_MAX};
use crate::error::{AbortReason, FabricError};
use crate::fabric::{FabricConn, RxSink, TxDone, WaitSet};
use crate::link::Pools;
use crate::record::copy::copy_bytes;
use crate::record::{self, RecordType, RECORD_HEADER};

use super::super::sys::{self, Iov, IovList};
use super::{
    header, pad_of, sock_err, ConnSizes, Delivery, Entry, Flow, TcpConn, CTL_ROOM, STREAM_WRITE,
    ZEROS,
};

impl TcpConn {
    pub(crate) fn new(
        sock: Arc<TcpStream>,
        pools: Arc<dyn Any + Send + Sync>,
        views: Pools,
        sizes: ConnSizes,
    ) -> TcpConn {
        let Pools {
            tx: tx_pool,
            rx: rx_pool,
            tx_large,
            rx_large,
        } = views;
        let buf_size = tx_pool.buf_size();
        let copy_max = sizes.copy_max.min(INLINE_MAX).min(buf_size);
        let depth = sizes.depth.max(1);
        // The stage holds the queued records (the windows bound them: at most `depth`
        // messages and about the peer's byte window, each a copied record or a header), and
        // the control records. Copied records beyond the stage wait for the next flush.
        let small = record::record_size(copy_max).unwrap_or(INLINE_MAX + 16);
        let stage = (depth.saturating_mul(small.max(16)))
            .min(sizes.peer_window)
            .saturating_add(CTL_ROOM)
            .max(64 << 10);
        let max_record = record::record_size(buf_size).unwrap_or(buf_size + 16);
        // `rx_pool` comes from `rx_chunks` (setup): at least 2 chunks of two whole records.
        let count = rx_pool.count();
        let chunk_size = rx_pool.buf_size();
        debug_assert!(count >= 2 && chunk_size >= 2 * max_record);
        // Without large slots nothing above the buffer size is accepted. With them, records of
        // up to half a chunk are read into the chunks like smaller ones (one contiguous lent
        // message, no slot needed: a record that does not fit the rest of a chunk is moved at
        // most once, as it fits a whole chunk from its start); longer ones go into a large slot.
        // A large record is read with its padding into a slot (setup sizes them `align8(limit)`):
        // capped here too, so the slot writes in `parse`/`fill_large` stay in the slot whatever
        // the sizes given.
        let max_payload = if rx_large.count() > 0 {
            sizes
                .max_payload
                .min(rx_large.buf_size() / 8 * 8)
                .max(buf_size)
        } else {
            buf_size
        };
        let lend_max = (chunk_size / 2 - RECORD_HEADER)
            .min(record::MAX_PAYLOAD)
            .min(max_payload)
            .max(buf_size);
        let lend_record = record::record_size(lend_max).unwrap_or(max_record);
        let large_count = rx_large.count();
        let fd = sock.as_raw_fd();
        TcpConn {
            sock,
            fd,
            _pools: pools,
            tx_pool,
            tx_large,
            max_payload,
            lend_max,
            lend_record,
            copy_max,
            stage: vec![0u8; stage].into_boxed_slice(),
            stage_len: 0,
            stage_written: 0,
            entries: vec![
                Entry::default();
                (tx_pool.count() as usize + tx_large.count() as usize)
                    .max(1)
                    .next_power_of_two()
            ]
            .into_boxed_slice(),
            free_head: 0,
            wr: 0,
            tail: 0,
            payload_written: 0,
            batch: sizes.batch.max(1),
            streaming: false,
            rx_asked: true,
            received: false,
            posted: false,
            tx_dead: false,
            chunk_size,
            head: 0,
            tail_rx: 0,
            max_record,
            eof: false,
            large_rx: None,
            rx_drained: false,
            rx: Delivery {
                copy_max,
                rx_pool,
                // Chunk 0 first; the others on the free stack, lowest on top.
                cur: 0,
                refs: vec![0u32; count as usize].into_boxed_slice(),
                lent: 0,
                free: (1..count).rev().collect(),
                free_len: count.saturating_sub(1) as usize,
                large: rx_large,
                large_out: vec![false; large_count as usize].into_boxed_slice(),
                // Slot 0 on top.
                large_free: (0..large_count).rev().collect(),
                large_free_len: large_count as usize,
            },
            depth,
            app_bytes: sizes.app_bytes.then_some(sizes.peer_window as u64),
            flow: Flow::new(&sizes),
            liveness_ns: u64::try_from(sizes.liveness.as_nanos()).unwrap_or(u64::MAX),
            heard: 0,
            heard_seen: (0, 0),
            recvs: 0,
            recvs_seen: 0,
            wrote: 0,
            wrote_seen: (0, 0),
            checked_ns: 0,
            heartbeat_due: false,
            heartbeats: 0,
        }
    }

    /// Whether a `post_send` of a single message may take it (run-to-completion's direct send,
    /// which writes it at once): the first single post since a message was delivered or since
    /// [`rx_pending`](FabricConn::rx_pending) was asked without a `flush` after it (a direct
    /// receive, or the pass, which asks it first and flushes last). A ping-pong receives
    /// between its sends, so each goes out at once; a second send with nothing received
    /// between is a stream, which the rings coalesce into one `sendmsg` per 8 KiB
    /// ([`STREAM_WRITE`](super::STREAM_WRITE); a `sendmsg` per message would cost the rate:
    /// `bench rate --fabric tcp --size 8` 0.5-0.7 M msgs/s against 12 M through the rings). A
    /// pass offering one message takes it (it asked `rx_pending` first), and so does a second
    /// `post_send` before the `flush` (the rest of a batch that wrapped around the ring).
    #[inline]
    pub(super) fn direct_run(&self) -> bool {
        self.rx_asked || self.received
    }

    /// Writes what is queued, the owed credit with it, without waiting for more
    /// ([`STREAM_WRITE`]); from [`poll_rx`](FabricConn::poll_rx), so what the receive side
    /// knows (a receive under way, a socket found empty) stays as it was.
    #[cold]
    fn flush_credit_now(&mut self) -> Result<(), FabricError> {
        self.streaming = false;
        let (asked, drained) = (self.rx_asked, self.rx_drained);
        let res = self.flush();
        self.rx_asked = asked;
        self.rx_drained = drained;
        res
    }

    /// The socket (for the setup side's shutdown).
    pub(crate) fn socket(&self) -> &Arc<TcpStream> {
        &self.sock
    }
}

impl FabricConn for TcpConn {
    /// Run-to-completion's direct way (see `crate::link::RtcConn`): a ping-pong's send is
    /// copied into the stage and written by the same call, its receive is one `recv` into the
    /// current chunk and the message copied out of it, with no ring, no pass. A stream of
    /// sends keeps the rings ([`TcpConn::direct_run`]), where they coalesce into one
    /// `sendmsg` per batch. Measured (`bench lat --fabric tcp --size 8`, interleaved with the
    /// build before, 3 rounds, loaded 2-core guest): RTT p50 x the raw floor of the same run
    /// 1.19x before, 1.11x direct (6.56 -> 6.10 us).
    const RTC_DIRECT: bool = true;

    // Staged like any copied message, from the descriptor instead of its buffer.
    const INLINE_SENDS: bool = true;

    #[inline]
    fn app_depth(&self) -> Option<usize> {
        Some(self.depth)
    }

    #[inline]
    fn app_bytes(&self) -> Option<u64> {
        self.app_bytes
    }

    fn arm(&mut self, set: &mut WaitSet) -> bool {
        // Something to reclaim or report now: not idle. Bytes still to write (the socket's
        // buffer was full) wait for it to drain: writable wakes it.
        if self.free_head != self.wr
            || self.flow.unreported != 0
            || self.heartbeat_due
            || self.flow.credit_due(false)
        {
            return false;
        }
        let write = !self.tx_dead && self.unwritten();
        // Buffered bytes hold at most a partial record here (complete ones were parsed, or
        // wait for ring room or a released chunk, which the poller looks after): more come
        // with the socket readable. After the end of stream it always is: not watched.
        set.add(self.fd, !self.eof, write);
        true
    }

    #[inline]
    fn rx_pending(&mut self) -> bool {
        self.rx_asked = true;
        let buffered = self.buffered();
        // Asked right after a `poll_rx` whose `recv` found the socket empty (run-to-completion's
        // direct receive asks before it takes the rest of a burst): nothing more, without the
        // `recv` that would only return EAGAIN, once (an `EAGAIN` costs about as much as the
        // `recv` that got the message; on a round trip's path). Else a socket can only be asked
        // (a syscall); after its end only buffered bytes remain.
        if std::mem::take(&mut self.rx_drained) && !buffered {
            return false;
        }
        !self.eof || buffered
    }

    #[inline]
    fn quiescent(&mut self) -> bool {
        !self.unwritten()
            && self.free_head == self.wr
            && self.flow.unreported == 0
            && !self.heartbeat_due
            && !self.flow.credit_due(false)
    }

    #[inline]
    fn copies(&self, len: u32) -> bool {
        // Exactly `post_send`'s test.
        len as usize <= self.copy_max
    }

    #[inline]
    fn poll_rx(&mut self, sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        self.rx_drained = false;
        // What an earlier `recv` left unparsed first; with nothing there (a ping-pong's every
        // receive) the parse is skipped, not entered and left (callgrind: ~20 instructions).
        let (mut n, blocked) = if self.buffered() {
            self.parse(sink)?
        } else {
            (0, false)
        };
        if !blocked && !self.eof && sink.room() > 0 {
            if self.fill()? {
                n += self.parse(sink)?.0;
            }
            self.received |= n > 0;
        }
        if n > 0 && self.flow.credit_due(false) {
            // Half a window is owed: return it now, not at the next pass's flush. A receiver
            // in run-to-completion mode that keeps finding messages takes them the direct way
            // and runs no pass until it finds none, so its sender would wait out the rest of
            // the window (once per half window, 512 KiB at the defaults: one write of a
            // 16-byte record). Checked on every delivery, also one from bytes already read
            // (a direct receive of one message returns before it reads more).
            self.flush_credit_now()?;
        }
        Ok(n)
    }

    #[inline]
    fn post_send(&mut self, descs: &[TxDesc], done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        self.rx_drained = false;
        if self.tx_dead {
            // The application sees the disconnect once the poller retires the connection.
            return Ok(0);
        }
        if descs.len() == 1 && !self.posted && !self.direct_run() {
            // A second single send with no receive or pass between: a stream. It waits in the
            // send ring, for the pass or the batch-th send to post a batch of it (one write).
            return Ok(0);
        }
        let mut n = 0;
        let cap = self.entries.len() as u64;
        for d in descs {
            let len = d.len as usize;
            if !self.flow.has_room(len) {
                // The peer's byte window is full: the rest waits in the send ring for credits.
                break;
            }
            let room = self.stage.len() - self.stage_len;
            // A large slot is always written from the slot (the engine marked it held).
            // (The inline marker has the large bit set.)
            if (!is_large(d.buf) && self.copies(d.len)) || d.is_inline() {
                let need = RECORD_HEADER + len + pad_of(len);
                if room < need + CTL_ROOM {
                    break;
                }
                let h = header(RecordType::Data, len);
                self.stage_put(&h);
                let payload = match d.inline_payload() {
                    Some(p) => p,
                    // SAFETY: the engine checked `d.buf < count` and `len <= buf_size`; the
                    // poller owns the buffer now (the application gave it up in `send`); the
                    // pool stays mapped while `_pools` lives.
                    None => unsafe {
                        std::slice::from_raw_parts(
                            self.tx_pool.buf_ptr_unchecked(d.buf).as_ptr(),
                            len,
                        )
                    },
                };
                // The payload and its pad with `copy_bytes`, not `copy_from_slice`: no `memcpy`
                // call for a small message (callgrind, `bench cost --fabric tcp --sizes 8`).
                let pad = pad_of(len);
                let dst = &mut self.stage[self.stage_len..self.stage_len + len + pad];
                // SAFETY: `dst` is `len + pad` bytes of the stage (the slice is bounds-checked;
                // the room test above keeps it in bounds), which overlaps neither the payload
                // (a pool buffer or the descriptor) nor `ZEROS`; `payload` holds `len` bytes
                // and `ZEROS` at least `pad` (< 8).
                unsafe {
                    copy_bytes(payload.as_ptr(), dst.as_mut_ptr(), len);
                    copy_bytes(ZEROS.as_ptr(), dst.as_mut_ptr().add(len), pad);
                }
                self.stage_len += len + pad;
                if !d.is_inline() {
                    // Copied: free at once (`copies` said so, the engine did not mark it held).
                    done.free_copied(d.buf)?;
                }
            } else {
                if room < RECORD_HEADER + CTL_ROOM || self.tail.wrapping_sub(self.free_head) >= cap
                {
                    break;
                }
                let h = header(RecordType::Data, len);
                self.stage_put(&h);
                let mask = cap - 1;
                self.entries[(self.tail & mask) as usize] = Entry {
                    stage_end: self.stage_len,
                    buf: d.buf,
                    len: d.len,
                };
                self.tail = self.tail.wrapping_add(1);
            }
            self.flow.on_sent(len);
            n += 1;
        }
        self.streaming = n == descs.len() && n >= self.batch;
        self.posted |= n > 0;
        if descs.len() == 1 && n == 1 {
            self.rx_asked = false;
            self.received = false;
        }
        Ok(n)
    }

    #[inline]
    fn release_rx(&mut self, bufs: &[u32]) -> Result<(), FabricError> {
        for &b in bufs {
            let rx = &mut self.rx;
            if is_large(b) {
                rx.release_large(large_slot(b))?;
                continue;
            }
            match rx.refs.get_mut(b as usize) {
                Some(r) if *r > 0 => *r -= 1,
                _ => return Err(FabricError::Protocol("released a receive buffer not lent")),
            }
            rx.lent -= 1;
            if rx.refs[b as usize] == 0 && b != rx.cur {
                rx.push_free(b);
            }
        }
        Ok(())
    }

    #[inline]
    fn reclaim(&mut self, done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        let mut work = 0;
        while self.free_head != self.wr {
            let e = self.entry(self.free_head);
            done.free_buf(e.buf)?;
            self.free_head = self.free_head.wrapping_add(1);
            work += 1;
        }
        if self.flow.unreported > 0 {
            done.credits(self.flow.unreported);
            self.flow.unreported = 0;
            if self.app_bytes.is_some() {
                done.credit_bytes(self.flow.unreported_bytes);
            }
            self.flow.unreported_bytes = 0;
            work += 1;
        }
        Ok(work)
    }

    #[inline]
    fn flush(&mut self) -> Result<(), FabricError> {
        self.rx_drained = false;
        self.rx_asked = false;
        self.posted = false;
        if self.tx_dead {
            return Ok(());
        }
        if self.stage_written == self.stage_len && self.wr == self.tail {
            // Everything is in the kernel: start the stage over.
            self.stage_len = 0;
            self.stage_written = 0;
        }
        let streaming = std::mem::take(&mut self.streaming);
        self.queue_control();
        if !self.unwritten() {
            return Ok(());
        }
        if streaming && self.unwritten_bytes() < STREAM_WRITE {
            // More is queued behind this batch: write it with the next one (`STREAM_WRITE`).
            return Ok(());
        }
        // One entry (a ping-pong's record, with a credit riding on it: both in the stage) is
        // a plain `send`, as the raw loop's, not a `sendmsg` whose header and iovec array the
        // kernel copies in first. Measured (`bench lat --fabric tcp --size 8 --iters 100000
        // --floor`, 12 rounds interleaved with `sendmsg` alone, load 2.7-2.9): RTT p50 lower in
        // 10 of 12, medians 5.61 -> 5.54 and 5.58 -> 5.45 us (1.06x / 1.07x -> 1.06x / 1.04x the
        // floor).
        let wrote = if self.wr == self.tail {
            // Only stage bytes are unwritten (small records copied in, control records): their
            // range is the entry, without building a gather list (callgrind, `bench cost
            // --fabric tcp --sizes 8 --iters 20000`, round trips only: `flush` 150 -> 125
            // instructions a call).
            let one = Iov {
                // SAFETY: `stage_written < stage_len <= stage.len()` (`unwritten` holds and
                // nothing else is queued).
                base: unsafe { self.stage.as_ptr().add(self.stage_written) },
                len: self.stage_len - self.stage_written,
            };
            // SAFETY: stage bytes, owned by `self` and not written during the call.
            unsafe { sys::send(self.fd, one) }
        } else {
            let mut iov = IovList::new();
            self.gather(&mut iov);
            if iov.len() == 0 {
                return Ok(());
            }
            match iov.single() {
                // SAFETY: `gather` described stage bytes (owned by `self`), a payload of a send
                // buffer the poller owns until it is freed after this write, or the static
                // padding.
                Some(one) => unsafe { sys::send(self.fd, one) },
                // SAFETY: as above, for every entry.
                None => unsafe { sys::sendmsg(self.fd, &iov) },
            }
        };
        match wrote {
            Ok(n) => {
                self.consume(n);
            }
            Err(libc::EAGAIN | libc::EINTR) => {}
            Err(e) => {
                // Reported once; the queued buffers go back (`reclaim` frees `[free_head,
                // tail)`), and every later flush has nothing to write.
                self.tx_dead = true;
                self.wr = self.tail;
                self.payload_written = 0;
                self.stage_len = 0;
                self.stage_written = 0;
                return Err(sock_err(e));
            }
        }
        if self.stage_written == self.stage_len && self.wr == self.tail {
            self.stage_len = 0;
            self.stage_written = 0;
        }
        Ok(())
    }

    #[inline]
    fn check_peer(&mut self, now_ns: u64) -> Result<(), FabricError> {
        if self.liveness_ns == 0 || self.eof {
            return Ok(());
        }
        // This poller itself did not run for a while: it cannot tell the peer's silence from
        // its own. And while it is not reading (the application's ring is full, or records wait
        // to be delivered, or no chunk is free) the peer's bytes stay in the kernel: that is
        // not silence either. A partial record is read on (`fill`), so a peer silent in the
        // middle of one is.
        let stalled = now_ns.saturating_sub(self.checked_ns) > self.liveness_ns / 2;
        self.checked_ns = now_ns;
        let reading = self.recvs != self.recvs_seen;
        self.recvs_seen = self.recvs;
        if self.heard != self.heard_seen.0 || stalled || !reading || self.heard_seen.1 == 0 {
            self.heard_seen = (self.heard, now_ns);
        } else {
            let silent = now_ns.saturating_sub(self.heard_seen.1);
            if silent >= self.liveness_ns {
                return Err(FabricError::PeerUnresponsive {
                    silent_for: Duration::from_nanos(silent),
                });
            }
        }
        if self.wrote != self.wrote_seen.0 || self.wrote_seen.1 == 0 {
            self.wrote_seen = (self.wrote, now_ns);
        } else if now_ns.saturating_sub(self.wrote_seen.1) >= self.liveness_ns / 4 {
            self.heartbeat_due = true;
            self.wrote_seen = (self.wrote, now_ns);
        }
        Ok(())
    }

    fn abort(&mut self, reason: AbortReason) {
        // A CLOSE record after everything queued (the stage is only ever appended at a record
        // boundary), written by `close`'s flush, best effort: a full stage or socket buffer
        // (a stopped peer that stopped reading) leaves the peer a plain end of stream.
        if !self.tx_dead && self.stage.len() - self.stage_len >= 16 {
            let h = header(RecordType::Close, 8);
            self.stage_put(&h);
            let mut p = [0u8; 8];
            p[..4].copy_from_slice(&reason.code().to_le_bytes());
            self.stage_put(&p);
        }
    }

    fn close(&mut self) {
        // The last queued bytes, best effort (none left for a later cycle), then our end of
        // stream.
        self.streaming = false;
        let _ = self.flush();
        sys::shutdown_write(self.fd);
    }
}
