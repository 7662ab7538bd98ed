//! The polled path's send buffers: [`Connection::alloc`] and [`Connection::alloc_large`] (a
//! spare buffer, else the free ring the poller returns them on), and the returns of unsent
//! send buffers and of received messages' buffers.

use super::Polled;
use crate::conn::{Connection, SendBuf};
use crate::desc::is_large;
use crate::error::Error;

impl Polled {
    /// [`Connection::alloc`]: a spare buffer inline, the rest ([`alloc_other`](Self::alloc_other))
    /// out of line.
    #[inline(always)]
    pub(in crate::conn) fn alloc<'c>(&'c self, conn: &'c Connection) -> Result<SendBuf<'c>, Error> {
        if let Some(idx) = self.take_buf() {
            return Ok(SendBuf::new(conn, idx, 0));
        }
        self.alloc_other(conn)
    }

    /// [`alloc`](Self::alloc) with no spare buffer: the free ring's, else a cycle first.
    #[inline(never)]
    fn alloc_other<'c>(&'c self, conn: &'c Connection) -> Result<SendBuf<'c>, Error> {
        self.alloc_after_cycle(conn, Self::take_buf, false)
    }

    /// A buffer (`large`: a large slot) taken by `take`, else one more try after a cycle,
    /// else the error naming how many the application holds.
    fn alloc_after_cycle<'c>(
        &'c self,
        conn: &'c Connection,
        take: fn(&Polled) -> Option<u32>,
        large: bool,
    ) -> Result<SendBuf<'c>, Error> {
        if let Some(idx) = take(self) {
            return Ok(SendBuf::new(conn, idx, 0));
        }
        self.drive(conn);
        if let Some(idx) = take(self) {
            return Ok(SendBuf::new(conn, idx, 0));
        }
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        // The buffers may be in a batched run nobody published yet: it goes now.
        s.publish_run();
        s.counts.alloc_failures += 1;
        // Out of the way (no buffer): shown in the counters file too.
        conn.shared.app.alloc_failures.add(1);
        let (held, count) = if large {
            (s.spare.all_large_held(), conn.tx_large.count())
        } else {
            (s.spare.all_held(), conn.tx_pool.count())
        };
        Err(conn.alloc_error(held, count))
    }

    /// A free ordinary buffer: a spare one, else the next from the free ring (large slots met
    /// on the way are kept for `alloc_large`).
    #[inline(always)]
    fn take_buf(&self) -> Option<u32> {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        if let Some(idx) = s.spare.pop() {
            return Some(idx);
        }
        // One look at the free ring inline (a stream's buffers come back there); a large slot
        // met first is kept for `alloc_large` and the rest is out of line.
        let i = s.rings.free.pop().ok()?;
        if !is_large(i) {
            return s.spare.hold(i);
        }
        s.spare.keep(i);
        self.take_buf_ring()
    }

    /// [`take_buf`](Self::take_buf) after a large slot: the free ring's next ordinary buffer.
    #[inline(never)]
    fn take_buf_ring(&self) -> Option<u32> {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        loop {
            let i = s.rings.free.pop().ok()?;
            if !is_large(i) {
                return s.spare.hold(i);
            }
            s.spare.keep(i);
        }
    }

    /// [`Connection::alloc_large`].
    pub(in crate::conn) fn alloc_large<'c>(
        &'c self,
        conn: &'c Connection,
    ) -> Result<SendBuf<'c>, Error> {
        self.alloc_after_cycle(conn, Self::take_large, true)
    }

    /// A free large slot, taking back what the poller freed (ordinary buffers met on the way
    /// are kept for `alloc`).
    fn take_large(&self) -> Option<u32> {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let s = unsafe { self.state() };
        if s.spare.large_is_empty() {
            while let Ok(i) = s.rings.free.pop() {
                let large = is_large(i);
                s.spare.keep(i);
                if large {
                    break;
                }
            }
        }
        s.spare.pop_large()
    }

    /// A `SendBuf` was dropped unsent.
    pub(in crate::conn) fn give_back(&self, idx: u32) {
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        unsafe { self.state() }.spare.give_back(idx);
    }

    /// A received message was dropped: its buffer goes back to the poller.
    #[inline]
    pub(in crate::conn) fn release(&self, idx: u32) {
        // The release ring holds the whole receive pool; a peer delivering a buffer twice could
        // overflow it, in which case the buffer is simply not returned (the peer's loss).
        // SAFETY: no other reference to the state is live; none is taken while this one is used.
        let _ = unsafe { self.state() }.rings.release.push(idx);
    }

    /// A received message was dropped: its buffer goes back to the poller, which is woken
    /// if it sleeps (`Block`).
    #[inline]
    pub(in crate::conn) fn release_wake(&self, conn: &Connection, idx: u32) {
        self.release(idx);
        if self.block {
            conn.shared.wake_poller();
        }
    }
}
