//! The few connection operations the benchmark protocol needs, as a trait, so the protocol
//! ([`super::proto`]) is written once for every fabric and can be unit-tested over an
//! in-process fake.

use std::time::{Duration, Instant};

use crate::cli::Idle;
use crate::error::BenchError;
use crate::report::Counters;

/// One side of an established benchmark connection.
///
/// Methods never block: "would block" is `Ok(false)` / `Ok(None)`; the protocol decides how to
/// wait ([`Waiter`]).
pub trait BenchConn {
    /// Sends a message of `len` bytes whose content `fill` writes in place.
    /// `Ok(false)`: no credit or buffer right now, nothing was sent.
    ///
    /// # Errors
    /// The peer is gone, or `len` exceeds the message size limit.
    fn try_send_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, BenchError>;

    /// [`try_send_with`](Self::try_send_with) as part of a batch (`--app-batch`): the message
    /// may wait for [`flush`](Self::flush) (or the fabric's own batch bound) to go out. The
    /// default is `try_send_with`; spinwire connections use `Connection::send_batched`.
    ///
    /// # Errors
    /// As [`try_send_with`](Self::try_send_with).
    fn try_send_batched_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, BenchError> {
        self.try_send_with(len, fill)
    }

    /// Receives one message if one is ready and hands its bytes to `f`.
    ///
    /// # Errors
    /// The peer is gone.
    fn try_recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, BenchError>;

    /// Batch receive (`--app-batch`): hands up to `limit` ready messages, in order, to `f`;
    /// returns how many. The default calls [`try_recv_with`](Self::try_recv_with) per message;
    /// fabric connections override it with their batch receive (spinwire's
    /// `Connection::poll(handler, limit)`).
    ///
    /// # Errors
    /// The peer is gone (after every message received before it was delivered).
    fn poll_batch(&mut self, limit: usize, mut f: impl FnMut(&[u8])) -> Result<usize, BenchError> {
        let mut n = 0;
        while n < limit {
            if self.try_recv_with(&mut f)?.is_none() {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Waits up to `timeout` until a message is ready to receive, sleeping per the engine's
    /// idle strategy (`--idle block`: in the kernel until the arrival wakes it); `Ok(false)`
    /// when none came. The default has nothing to wait on and returns `Ok(false)` at once
    /// (the caller then idles as its [`Waiter`] says).
    ///
    /// # Errors
    /// Never in the default; a fabric connection reports a down connection at its next
    /// receive instead.
    fn wait_readable(&mut self, timeout: Duration) -> Result<bool, BenchError> {
        let _ = timeout;
        Ok(false)
    }

    /// Pushes out a partially filled send batch.
    ///
    /// # Errors
    /// The connection is down.
    fn flush(&mut self) -> Result<(), BenchError> {
        Ok(())
    }

    /// The largest message this connection carries, if it has a limit of its own (spinwire's
    /// `Connection::max_message_size`).
    fn max_message_size(&self) -> Option<usize> {
        None
    }

    /// A snapshot of the engine counters behind this connection, if it has any.
    fn counters(&self) -> Option<Counters> {
        None
    }

    /// Receives one message if one is ready; when it is `size` bytes with first byte `tag`,
    /// sends an identical copy back (waiting on `w` for a buffer or credit) before returning.
    /// Returns the received message's length and first byte (`0xFF` if empty).
    ///
    /// The default copies through a temporary (it allocates); fabric connections override it
    /// to copy straight from the received buffer into the send buffer.
    ///
    /// # Errors
    /// The peer is gone, or `w` gave up.
    fn try_echo(
        &mut self,
        size: usize,
        tag: u8,
        w: &mut Waiter,
    ) -> Result<Option<(usize, u8)>, BenchError> {
        let got = self.try_recv_with(|m| {
            let head = head(m);
            (head, (head == (size, tag)).then(|| m.to_vec()))
        })?;
        let Some((head, copy)) = got else {
            return Ok(None);
        };
        if let Some(copy) = copy {
            while !self.try_send_with(size, |b| b.copy_from_slice(&copy))? {
                w.idle()?;
            }
            self.flush()?;
        }
        Ok(Some(head))
    }
}

/// A received message's head: its length and first byte (`0xFF` if empty). The bench's
/// messages carry their kind in the first byte, so this is what every receive loop matches on.
#[inline(always)]
pub(crate) fn head(m: &[u8]) -> (usize, u8) {
    (m.len(), m.first().copied().unwrap_or(0xFF))
}

/// Fills a message from the bench's template (`dst.len() <= src.len()`), as an application
/// writes a message of known shape: up to 16 bytes in two (overlapping) 8-byte moves, no call.
/// `copy_from_slice` of a length known only at run time is a call to libc's `memcpy`, which
/// `bench lat` timed inside every round trip (the fill comes after the send's timestamp).
#[inline(always)]
pub(crate) fn fill_from(dst: &mut [u8], src: &[u8]) {
    let n = dst.len();
    if (8..=16).contains(&n) && src.len() >= n {
        dst[..8].copy_from_slice(&src[..8]);
        dst[n - 8..n].copy_from_slice(&src[n - 8..n]);
    } else {
        dst.copy_from_slice(&src[..n]);
    }
}

/// How an app thread waits for its connection: a bounded spin that, with `--idle backoff`,
/// escalates to yielding and short sleeps; and a deadline so no wait can hang.
#[derive(Debug)]
pub struct Waiter {
    idle: Idle,
    spins: u32,
    since: Option<Instant>,
    limit: Duration,
    what: &'static str,
}

impl Waiter {
    /// A waiter for `what` that gives up after `limit` without progress.
    pub fn new(idle: Idle, limit: Duration, what: &'static str) -> Self {
        Self {
            idle,
            spins: 0,
            since: None,
            limit,
            what,
        }
    }

    /// Call after progress: resets the backoff and the deadline.
    #[inline]
    pub fn reset(&mut self) {
        self.spins = 0;
        self.since = None;
    }

    /// Call when a poll found nothing. Reads the clock only every 1024 idle turns.
    ///
    /// # Errors
    /// [`BenchError::Timeout`] once `limit` passed without progress; [`BenchError::Interrupted`]
    /// after Ctrl-C.
    #[inline(always)]
    pub fn idle(&mut self) -> Result<(), BenchError> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins % 1024 == 0 {
            self.check()?;
        }
        match self.idle {
            Idle::Spin => std::hint::spin_loop(),
            // Waits with nothing to sleep on (a send without credit, a pacer with no
            // connection) back off; receive waits sleep in the engine (`idle_recv`).
            Idle::Backoff | Idle::Block => {
                if self.spins < 64 {
                    std::hint::spin_loop();
                } else if self.spins < 256 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        Ok(())
    }

    /// Ctrl-C and this waiter's deadline.
    #[inline(never)]
    fn check(&mut self) -> Result<(), BenchError> {
        if super::stop_requested() {
            return Err(BenchError::Interrupted);
        }
        let start = *self.since.get_or_insert_with(Instant::now);
        if start.elapsed() > self.limit {
            return Err(BenchError::Timeout {
                what: self.what,
                secs: self.limit.as_secs_f64(),
            });
        }
        Ok(())
    }

    /// Call when a receive found nothing: with `--idle block` waits in the engine (spin, then
    /// sleep until the arrival rings) for at most 10 ms at a time, so that this waiter's own
    /// deadline and Ctrl-C are still checked; otherwise [`idle`](Self::idle).
    ///
    /// # Errors
    /// As [`idle`](Self::idle).
    #[inline(always)]
    pub fn idle_recv<C: BenchConn>(&mut self, conn: &mut C) -> Result<(), BenchError> {
        // The spinning strategies inline (a call per empty receive of a timed round trip);
        // `--idle block`'s wait out of line.
        if self.idle != Idle::Block {
            return self.idle();
        }
        self.idle_recv_until(conn, None)
    }

    /// As [`idle_recv`](Self::idle_recv), but a `--idle block` wait ends 100 µs before
    /// `until_ns` (the host's monotonic clock, [`crate::sys::mono_ns`]'s): a pacer that must
    /// send then wakes from the kernel early and spins the rest (a futex timeout has tens of
    /// µs of timer slack).
    ///
    /// # Errors
    /// As [`idle`](Self::idle).
    pub fn idle_recv_until<C: BenchConn>(
        &mut self,
        conn: &mut C,
        until_ns: Option<u64>,
    ) -> Result<(), BenchError> {
        if self.idle != Idle::Block {
            return self.idle();
        }
        let mut max = Duration::from_millis(10);
        if let Some(until) = until_ns {
            let left = until.saturating_sub(crate::sys::mono_ns());
            match left.checked_sub(100_000) {
                Some(ns) if ns > 0 => max = max.min(Duration::from_nanos(ns)),
                _ => {
                    std::hint::spin_loop();
                    return Ok(());
                }
            }
        }
        // Every turn here (each may have slept), not every 1024th as in `idle`.
        self.check()?;
        conn.wait_readable(max)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::fill_from;

    #[test]
    fn fill_from_copies_every_length() {
        let src: Vec<u8> = (1..=64).collect();
        for n in 0..=40 {
            let mut dst = vec![0u8; n];
            fill_from(&mut dst, &src);
            assert_eq!(dst, src[..n], "length {n}");
        }
    }
}
