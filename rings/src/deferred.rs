//! Deferred publication: runs of single items whose index store is made once per run
//! ([`Producer::push_deferred`], [`Consumer::pop_deferred`]).

use crate::primitive::sync::atomic::Ordering;
use crate::{Consumer, PopError, Producer, PushError};

impl<T> Producer<T> {
    /// Pushes one item like [`push`](Self::push), but does not publish it: the consumer sees
    /// it, with every item deferred before it, at the next [`publish_deferred`](Self::publish_deferred),
    /// the next publishing call ([`push`](Self::push), [`push_slice`](Self::push_slice), a
    /// chunk's commit), or when the producer is dropped. A run of `n` items then costs one
    /// index store instead of `n`, and the consumer's cache line of the tail moves once.
    ///
    /// Nothing publishes a deferred run by itself: the caller bounds how long it waits.
    ///
    /// # Errors
    ///
    /// [`PushError::Full`] with the item handed back if the ring is full (the deferred items
    /// count as taken slots; they stay deferred).
    #[inline]
    pub fn push_deferred(&mut self, value: T) -> Result<(), PushError<T>> {
        self.write_next(value)
    }

    /// The tail as last published. Relaxed: only this handle stores it, so the load sees its
    /// own last store (an L1 hit in steady state: the consumer only reads that line). Kept
    /// out of the handle so that the publishing calls store nothing more than before (an
    /// extra field zeroed in `publish` cost 32 instructions per `mem://` run-to-completion
    /// send in callgrind, through inlining shifts).
    #[inline(always)]
    fn published_tail(&self) -> usize {
        self.ring().tail.load(Ordering::Relaxed)
    }

    /// Publishes the items [`push_deferred`](Self::push_deferred) wrote (one index store;
    /// nothing when there are none).
    #[inline]
    pub fn publish_deferred(&mut self) {
        if self.published_tail() != self.tail {
            self.publish(0);
        }
    }

    /// Items written by [`push_deferred`](Self::push_deferred) and not published yet.
    #[inline]
    pub fn deferred(&self) -> usize {
        self.tail.wrapping_sub(self.published_tail())
    }
}

impl<T> Consumer<T> {
    /// Pops the oldest item like [`pop`](Self::pop), but gives its slot back to the producer
    /// later, with others: one index store per run instead of one per item, so the producer's
    /// cache line of the head moves once per run. The slots come back
    /// * when a `pop_deferred` finds the ring empty by its cached copy of the producer's index,
    ///   before it re-reads that index (so a consumer that waits has given everything back),
    /// * when a quarter of the capacity (at least 1) is deferred,
    /// * by [`release_deferred`](Self::release_deferred), by any other call that removes items
    ///   ([`pop`](Self::pop), [`pop_slice`](Self::pop_slice), a [`ReadChunk`](crate::ReadChunk)'s release), and
    ///   when the consumer is dropped.
    ///
    /// Until then the producer sees those slots as taken ([`Producer::slots`] counts them
    /// used), so a consumer that stops calling in after a `pop_deferred` holds up to a quarter
    /// of the ring: call [`release_deferred`](Self::release_deferred) before turning to other
    /// work.
    ///
    /// # Errors
    ///
    /// [`PopError::Empty`] if the ring is empty.
    #[inline]
    pub fn pop_deferred(&mut self) -> Result<T, PopError> {
        if self.head == self.cached_tail {
            self.release_deferred();
            if self.refresh_len() == 0 {
                return Err(PopError::Empty);
            }
        }
        // SAFETY: the ring is not empty (checked above), and `head` moves past the item next.
        let value = unsafe { self.read_head() };
        self.head = self.head.wrapping_add(1);
        // A quarter of the ring: the producer never waits on more than that while items flow.
        if self.head.wrapping_sub(self.released_head()) > self.mask >> 2 {
            self.publish(0);
        }
        Ok(value)
    }

    /// Gives back the slots of the items [`pop_deferred`](Self::pop_deferred) took (one index
    /// store; nothing when there are none).
    #[inline]
    pub fn release_deferred(&mut self) {
        if self.released_head() != self.head {
            self.publish(0);
        }
    }

    /// The head as last published. Relaxed: only this handle stores it, so the load sees its
    /// own last store (an L1 hit in steady state: the producer only reads that line); kept
    /// out of the handle for the reason given at `Producer::published_tail`.
    #[inline(always)]
    fn released_head(&self) -> usize {
        self.ring().head.load(Ordering::Relaxed)
    }
}
