//! Large messages: [`Connection::alloc_large`], [`Connection::send_copy`] (and its batched
//! form) and [`Connection::recv_into`], the same on both paths (each path takes its own slots).
//!
//! See [`Connection::alloc_large`] for the model, the protocols by size and an example.

use std::time::Duration;

use super::{Connection, Message, Path, SendBuf, SendError};
use crate::error::Error;

/// Why [`Connection::recv_into`] did not copy a message.
pub enum RecvIntoError<'c> {
    /// The next message is longer than the buffer given: here it is, still unread (read it in
    /// place, or copy it into a larger buffer). Nothing is lost.
    TooSmall {
        /// The message.
        message: Message<'c>,
        /// The length of the buffer that was given.
        capacity: usize,
    },
    /// The connection is down ([`Error::Disconnected`] / [`Error::Fabric`]).
    Closed(Error),
}

impl std::fmt::Debug for RecvIntoError<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvIntoError::TooSmall { message, capacity } => f
                .debug_struct("TooSmall")
                .field("len", &message.len())
                .field("capacity", capacity)
                .finish(),
            RecvIntoError::Closed(e) => f.debug_tuple("Closed").field(e).finish(),
        }
    }
}

impl std::fmt::Display for RecvIntoError<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvIntoError::TooSmall { message, capacity } => write!(
                f,
                "message of {} bytes does not fit a buffer of {capacity} bytes",
                message.len()
            ),
            RecvIntoError::Closed(e) => write!(f, "connection closed: {e}"),
        }
    }
}

impl std::error::Error for RecvIntoError<'_> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecvIntoError::TooSmall { .. } => None,
            RecvIntoError::Closed(e) => Some(e),
        }
    }
}

impl Connection {
    /// Takes a free **large slot** to write a message of up to
    /// [`max_message_size`](Self::max_message_size) bytes in place (capacity: the slot size).
    /// Fill it ([`as_mut_slice`](SendBuf::as_mut_slice), then
    /// [`set_len`](SendBuf::set_len), or [`copy_from`](SendBuf::copy_from)) and
    /// [`send`](Self::send) it; dropping it unsent returns the slot. Zero copy: the receiver
    /// reads the slot's bytes in place (RDMA: after one RDMA READ into its own slot).
    ///
    /// # Large messages
    ///
    /// A message above the pool's buffer size travels through a **large slot**: one of
    /// [`large_buffers`](crate::EngineBuilder::large_buffers) buffers of
    /// [`max_message_size`](crate::EngineBuilder::max_message_size) bytes per connection and
    /// direction, set up with the connection (shm: in the shared segment; tcp: local memory the
    /// socket reads into; RDMA: registered regions for a rendezvous by RDMA READ). A large slot is
    /// a [`SendBuf`] like any other (written in place, then [`send`](Connection::send)), and the
    /// receiver reads it in place as one contiguous [`Message`]. The slot is the sender's again
    /// when the receiver has dropped the message (RDMA: when the READ has landed): until then
    /// `alloc_large` reports back-pressure ([`Error::WouldBlock`]), never loss.
    ///
    /// Order holds across sizes: small and large messages of one connection arrive in the order
    /// they were sent.
    ///
    /// Protocols by size, per message: up to the inline threshold, copied into the fabric's record
    /// (shm: the ring; RDMA: the frame); up to the buffer size, a pool buffer by reference (eager);
    /// above it (or above [`large_threshold`](crate::EngineBuilder::large_threshold) for
    /// `send_copy`), a large slot: shm hands the reader a reference into the shared segment, tcp
    /// `recv`s straight into the receiver's slot, RDMA moves it by rendezvous (the receiver pulls
    /// it with one RDMA READ).
    ///
    /// ```
    /// use std::time::Duration;
    /// use spinwire::{Engine, IdleStrategy};
    ///
    /// # fn main() -> Result<(), spinwire::Error> {
    /// let engine = Engine::builder()
    ///     .run_to_completion()
    ///     .idle(IdleStrategy::backoff())
    ///     .max_message_size(1 << 20) // up to 1 MiB per message
    ///     .large_buffers(2)          // two 1 MiB slots per connection and direction
    ///     .build()?;
    /// # let name = format!("shm://doc-large-{}", std::process::id());
    /// let listener = engine.listen(&name)?;
    /// let client = engine.connect(&name)?;
    /// let server = listener.accept_timeout(Duration::from_secs(5))?;
    ///
    /// // Zero copy: write the message in place in a large slot, then send it.
    /// let mut buf = client.alloc_large()?;
    /// buf.as_mut_slice()[..300_000].fill(0xab);
    /// buf.set_len(300_000)?;
    /// client.send(buf)?;
    /// // Or copy from the application's own bytes.
    /// client.send_copy(&vec![1u8; 700_000])?;
    ///
    /// let m = server.recv_timeout(Duration::from_secs(5))?; // one contiguous message, in place
    /// assert_eq!((m.len(), m[0]), (300_000, 0xab));
    /// drop(m); // gives the slot back to the sender
    /// let mut mine = vec![0u8; 1 << 20];
    /// let n = loop {
    ///     if let Some(n) = server.recv_into(&mut mine).expect("fits") {
    ///         break n;
    ///     }
    /// };
    /// assert_eq!(n, 700_000);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WouldBlock`] while every free slot is in flight (a slot comes back when the
    /// receiver drops its message: retry); [`Error::PoolExhausted`] when the application holds
    /// every slot (`count: 0` on a connection without large slots, see
    /// [`EngineBuilder::large_buffers`](crate::EngineBuilder::large_buffers));
    /// [`Error::Disconnected`] / [`Error::Fabric`] when the connection is down.
    pub fn alloc_large(&self) -> Result<SendBuf<'_>, Error> {
        self.check_up()?;
        let buf = match &self.path {
            Path::Direct(d) => d.alloc_large(self),
            Path::Polled(p) => p.alloc_large(self),
        };
        if buf.is_ok() {
            // Counted when taken (every large send takes one): the send paths stay as they are.
            self.shared.app.large_sent.add(1);
        }
        buf
    }

    /// [`alloc_large`](Self::alloc_large), waiting up to `timeout` for a slot to come back.
    ///
    /// # Errors
    ///
    /// As `alloc_large`, with [`Error::Timeout`] instead of [`Error::WouldBlock`].
    pub fn alloc_large_timeout(&self, timeout: Duration) -> Result<SendBuf<'_>, Error> {
        // Each arm builds its result (see `alloc_timeout`).
        match self.alloc_large() {
            Ok(buf) => Ok(buf),
            Err(Error::WouldBlock) => self.retry_wait(timeout, || self.alloc_large()),
            Err(e) => Err(e),
        }
    }

    /// [`claim`](Self::claim) of more than a pool buffer: a large slot with the length set.
    pub(super) fn claim_large(&self, len: usize) -> Result<SendBuf<'_>, Error> {
        if len > self.message_limit {
            return Err(Error::MessageTooLarge {
                size: len,
                max: self.message_limit,
            });
        }
        let mut b = self.alloc_large()?;
        b.set_len(len)?;
        Ok(b)
    }

    /// Sends a copy of `data`, of any length up to [`max_message_size`](Self::max_message_size):
    /// into a pool buffer (eager) up to the [large threshold](crate::EngineBuilder::large_threshold),
    /// else into a large slot. One copy on the sender; the receiver still reads in place.
    ///
    /// # Errors
    ///
    /// [`Error::MessageTooLarge`] (stating the limit) above `max_message_size`;
    /// [`Error::WouldBlock`] when no buffer or slot is free, or the receiver has no room (retry;
    /// nothing was sent); otherwise as [`alloc`](Self::alloc) and [`send`](Self::send).
    #[inline]
    pub fn send_copy(&self, data: &[u8]) -> Result<(), Error> {
        // A direct path (shm) copies a small message straight into its ring record; what that
        // cannot send goes the buffer way, which also reports why.
        if self.send_copy_direct(data, false) {
            return Ok(());
        }
        self.send_copy_buffered(data, false)
    }

    /// [`send_copy`](Self::send_copy) for streams, published as
    /// [`send_batched`](Self::send_batched) publishes: on shm a message up to the inline
    /// threshold is copied straight into its ring record and published with its run (by
    /// [`flush`](Self::flush), the `batch`-th batched send in a row, the next plain send, ...),
    /// with no pool buffer on the way; any other message as `send_copy` copies it, sent with
    /// `send_batched`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use spinwire::Engine;
    ///
    /// # fn main() -> Result<(), spinwire::Error> {
    /// let engine = Engine::builder().run_to_completion().build()?;
    /// # let name = format!("shm://doc-copy-batched-{}", std::process::id());
    /// let listener = engine.listen(&name)?;
    /// let client = engine.connect(&name)?;
    /// let server = listener.accept_timeout(Duration::from_secs(5))?;
    ///
    /// for i in 0..10u64 {
    ///     client.send_copy_batched(&i.to_le_bytes())?;
    /// }
    /// client.flush()?; // publishes the run
    /// for i in 0..10u64 {
    ///     let m = server.recv_timeout(Duration::from_secs(5))?;
    ///     assert_eq!(&m[..], &i.to_le_bytes());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`send_copy`](Self::send_copy).
    #[inline]
    pub fn send_copy_batched(&self, data: &[u8]) -> Result<(), Error> {
        if self.send_copy_direct(data, true) {
            return Ok(());
        }
        self.send_copy_buffered(data, true)
    }

    /// [`send_copy`](Self::send_copy) (`batched`: [`send_copy_batched`](Self::send_copy_batched))
    /// through a pool buffer or a large slot.
    #[inline(never)]
    fn send_copy_buffered(&self, data: &[u8], batched: bool) -> Result<(), Error> {
        self.check_up()?;
        if data.len() > self.message_limit {
            return Err(Error::MessageTooLarge {
                size: data.len(),
                max: self.message_limit,
            });
        }
        let mut b = if data.len() > self.large_threshold && self.tx_large.count() > 0 {
            self.alloc_large()?
        } else {
            self.alloc()?
        };
        b.copy_from(data)?;
        let sent = if batched {
            self.send_batched(b)
        } else {
            self.send(b)
        };
        sent.map_err(|e| match e {
            SendError::WouldBlock(_) => Error::WouldBlock,
            SendError::Timeout(_) => Error::Timeout,
            SendError::Closed { error, .. } => error,
        })
    }

    /// [`send_copy`](Self::send_copy), waiting up to `timeout` for a buffer and for room.
    ///
    /// # Errors
    ///
    /// As `send_copy`, with [`Error::Timeout`] instead of [`Error::WouldBlock`].
    #[inline]
    pub fn send_copy_timeout(&self, data: &[u8], timeout: Duration) -> Result<(), Error> {
        // The first try inline, the wait out of line (see `retry_wait`); each arm builds its
        // result (see `alloc_timeout`).
        match self.send_copy(data) {
            Ok(()) => Ok(()),
            Err(Error::WouldBlock) => self.retry_wait(timeout, || self.send_copy(data)),
            Err(e) => Err(e),
        }
    }

    /// Receives the next message into a buffer the application supplies (the idiom of UCX's
    /// `ucp_am_recv_data_nbx`): copies it into `buf`, recycles its buffer or slot at once, and
    /// returns its length. `Ok(None)`: nothing is waiting.
    ///
    /// # Errors
    ///
    /// [`RecvIntoError::TooSmall`] hands the message back, unread, when it is longer than
    /// `buf` (nothing is lost); [`RecvIntoError::Closed`] as [`try_recv`](Self::try_recv).
    // The error carries the message itself, as `SendError` carries the buffer:
    // boxing it would allocate on the data path.
    #[allow(clippy::result_large_err)]
    pub fn recv_into<'c>(&'c self, buf: &mut [u8]) -> Result<Option<usize>, RecvIntoError<'c>> {
        let Some(message) = self.try_recv().map_err(RecvIntoError::Closed)? else {
            return Ok(None);
        };
        let n = message.len();
        let Some(dst) = buf.get_mut(..n) else {
            return Err(RecvIntoError::TooSmall {
                message,
                capacity: buf.len(),
            });
        };
        dst.copy_from_slice(&message);
        Ok(Some(n))
    }
}
