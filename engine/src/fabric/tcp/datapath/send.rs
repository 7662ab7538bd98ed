//! The send side: the stage (record headers, copied small messages, control records), the
//! FIFO of pooled messages written from their buffers, the gather list of one `sendmsg`, and
//! the accounting of what the kernel took.

use crate::desc::{is_large, large_slot};
use crate::record::RecordType;

use super::super::sys::{Iov, IovList};
use super::{header, pad_of, Entry, TcpConn, ZEROS};

impl TcpConn {
    #[inline]
    pub(super) fn entry(&self, pos: u64) -> Entry {
        let mask = self.entries.len() as u64 - 1;
        self.entries[(pos & mask) as usize]
    }

    /// Anything queued that the kernel has not taken yet.
    #[inline]
    pub(super) fn unwritten(&self) -> bool {
        self.stage_written < self.stage_len || self.wr != self.tail
    }

    /// About how many bytes are queued and not written: the stage's and the payloads of
    /// the pooled messages not yet started (a partial one's counts whole). Cheap: one pass
    /// only when pooled messages are queued.
    #[inline]
    pub(super) fn unwritten_bytes(&self) -> usize {
        let mut n = self.stage_len - self.stage_written;
        let mut pos = self.wr;
        while pos != self.tail && n < super::STREAM_WRITE {
            n += self.entry(pos).len as usize;
            pos = pos.wrapping_add(1);
        }
        n
    }

    /// Appends `bytes` to the stage (the caller checked the room).
    #[inline]
    pub(super) fn stage_put(&mut self, bytes: &[u8]) {
        let end = self.stage_len + bytes.len();
        self.stage[self.stage_len..end].copy_from_slice(bytes);
        self.stage_len = end;
    }

    /// Queues the control records that are due: owed credits (when data goes out anyway, or
    /// enough are owed) and a heartbeat.
    #[inline]
    pub(super) fn queue_control(&mut self) {
        if self.flow.credit_due(self.unwritten()) && self.stage.len() - self.stage_len >= 16 {
            let h = header(RecordType::Credit, 8);
            self.stage_put(&h);
            let c = self.flow.take_credit().to_le_bytes();
            self.stage_put(&c);
        }
        if self.heartbeat_due && self.stage.len() - self.stage_len >= 16 {
            self.heartbeat_due = false;
            self.heartbeats += 1;
            let h = header(RecordType::Heartbeat, 8);
            self.stage_put(&h);
            let s = self.heartbeats.to_le_bytes();
            self.stage_put(&s);
        }
    }

    /// Builds the gather list of everything unwritten, in stream order.
    #[inline]
    pub(super) fn gather(&self, iov: &mut IovList) {
        let stage = self.stage.as_ptr();
        let mut at = self.stage_written;
        let mut pos = self.wr;
        let mut first = true;
        while pos != self.tail {
            let e = self.entry(pos);
            if at < e.stage_end {
                // SAFETY: `at < stage_end <= stage_len <= stage.len()`.
                let base = unsafe { stage.add(at) };
                if !iov.push(Iov {
                    base,
                    len: e.stage_end - at,
                }) {
                    return;
                }
            }
            at = at.max(e.stage_end);
            let skip = if first { self.payload_written } else { 0 };
            first = false;
            let len = e.len as usize;
            if skip < len {
                // SAFETY: `e.buf < count` and `len <= buf_size`, or `e.buf` is `LARGE_BIT |
                // slot` with `slot < large count` and `len <=` the slot size (checked by the
                // engine before `post_send`), so the range lies in the send pool or the large
                // send pool, which `_pools` keeps alive; the poller owns the buffer until it is
                // freed after the write.
                let base = unsafe { self.payload_ptr(e.buf).add(skip) };
                if !iov.push(Iov {
                    base,
                    len: len - skip,
                }) {
                    return;
                }
            }
            let pad = pad_of(len);
            let pad_done = skip.saturating_sub(len);
            if pad > pad_done
                && !iov.push(Iov {
                    base: ZEROS.as_ptr(),
                    len: pad - pad_done,
                })
            {
                return;
            }
            pos = pos.wrapping_add(1);
        }
        if at < self.stage_len {
            // SAFETY: `at < stage_len <= stage.len()`.
            let base = unsafe { stage.add(at) };
            iov.push(Iov {
                base,
                len: self.stage_len - at,
            });
        }
    }

    /// Start of send buffer `buf`: a pool buffer, or with
    /// [`LARGE_BIT`](crate::desc::LARGE_BIT) a large slot.
    ///
    /// # Safety
    ///
    /// `buf` is a valid index of its pool (the engine checks every send descriptor).
    #[inline]
    unsafe fn payload_ptr(&self, buf: u32) -> *const u8 {
        if is_large(buf) {
            // SAFETY: by the caller's contract, `slot < tx_large.count()`.
            unsafe { self.tx_large.buf_ptr_unchecked(large_slot(buf)).as_ptr() }
        } else {
            // SAFETY: by the caller's contract, `buf < tx_pool.count()`.
            unsafe { self.tx_pool.buf_ptr_unchecked(buf).as_ptr() }
        }
    }

    /// Accounts `n` bytes the kernel took, in [`gather`](Self::gather)'s order.
    #[inline]
    pub(super) fn consume(&mut self, mut n: usize) {
        self.wrote += n as u64;
        while self.wr != self.tail {
            let e = self.entry(self.wr);
            if self.stage_written < e.stage_end {
                let k = n.min(e.stage_end - self.stage_written);
                self.stage_written += k;
                n -= k;
                if self.stage_written < e.stage_end {
                    return;
                }
            }
            let total = e.len as usize + pad_of(e.len as usize);
            let k = n.min(total - self.payload_written);
            self.payload_written += k;
            n -= k;
            if self.payload_written < total {
                return;
            }
            self.payload_written = 0;
            self.wr = self.wr.wrapping_add(1);
        }
        self.stage_written = (self.stage_written + n).min(self.stage_len);
    }
}
