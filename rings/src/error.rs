//! Small hand-written error types. Errors that reject a value hand it back.

use core::fmt;

/// [`Producer::push`](crate::Producer::push) failed; the value is handed back.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PushError<T> {
    /// The ring was full; here is the value that could not be pushed.
    Full(T),
}

impl<T> PushError<T> {
    /// Takes the rejected value back.
    pub fn into_inner(self) -> T {
        match self {
            PushError::Full(value) => value,
        }
    }
}

impl<T> fmt::Debug for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Full(_) => f.pad("Full(_)"),
        }
    }
}

impl<T> fmt::Display for PushError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushError::Full(_) => f.pad("full ring"),
        }
    }
}

impl<T> std::error::Error for PushError<T> {}

/// [`Consumer::pop`](crate::Consumer::pop) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PopError {
    /// The ring was empty.
    Empty,
}

impl fmt::Display for PopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PopError::Empty => f.pad("empty ring"),
        }
    }
}

impl std::error::Error for PopError {}

/// [`Consumer::peek`](crate::Consumer::peek) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeekError {
    /// The ring was empty.
    Empty,
}

impl fmt::Display for PeekError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeekError::Empty => f.pad("empty ring"),
        }
    }
}

impl std::error::Error for PeekError {}

/// Claiming a chunk failed ([`Producer::write_chunk_uninit`](crate::Producer::write_chunk_uninit),
/// [`Producer::write_chunk`](crate::Producer::write_chunk),
/// [`Consumer::read_chunk`](crate::Consumer::read_chunk)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkError {
    /// Fewer slots than requested were available; this many were (free slots for the producer,
    /// readable items for the consumer). Claim at most that many instead.
    TooFewSlots(usize),
}

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChunkError::TooFewSlots(n) => write!(f, "only {n} slots available"),
        }
    }
}

impl std::error::Error for ChunkError {}

/// [`RingBuffer::try_new`](crate::RingBuffer::try_new) rejected the capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityError {
    /// A ring must hold at least one item.
    Zero,
    /// The capacity, rounded up to a power of two, does not fit the address space
    /// (more than `isize::MAX` bytes of slots, or more than `usize::MAX / 2 + 1` slots).
    TooLarge {
        /// The capacity that was asked for.
        requested: usize,
    },
}

impl fmt::Display for CapacityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapacityError::Zero => f.pad("ring capacity must be at least 1"),
            CapacityError::TooLarge { requested } => {
                write!(f, "ring capacity {requested} is too large")
            }
        }
    }
}

impl std::error::Error for CapacityError {}
