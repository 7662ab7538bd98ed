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
            let head = (m.len(), m.first().copied().unwrap_or(0xFF));
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
    #[inline]
    pub fn idle(&mut self) -> Result<(), BenchError> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins % 1024 == 0 {
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
        }
        match self.idle {
            Idle::Spin => std::hint::spin_loop(),
            Idle::Backoff => {
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
}
