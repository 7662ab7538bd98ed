//! [`RingError`]: the record ring's failures.

use crate::record::RecordError;

/// Failures of the record ring: setup errors, a caller error, and a peer violating the
/// protocol (the connection is then to be failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The region cannot hold a ring.
    #[error("bad ring region: {reason} ({size_bytes} bytes)")]
    BadGeometry {
        /// What is wrong.
        reason: &'static str,
        /// The region's size.
        size_bytes: usize,
    },
    /// The maximum payload is above [`max_payload_for`](super::max_payload_for) the capacity (or
    /// [`MAX_PAYLOAD`](crate::record::MAX_PAYLOAD)).
    #[error("maximum payload {max} too large for a {capacity}-byte ring (at most {limit})")]
    BadLimit {
        /// The maximum asked for.
        max: usize,
        /// The ring's capacity.
        capacity: usize,
        /// The largest allowed.
        limit: usize,
    },
    /// A claim above the configured maximum payload (a caller error; the ring is unchanged).
    #[error("payload of {len} bytes exceeds the maximum {max}")]
    TooLong {
        /// Bytes asked for.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The peer published a record the codec rejects (or one running past the area's end).
    #[error("invalid record at ring position {position}")]
    Record {
        /// Ring position of the record.
        position: u64,
        /// What the codec found.
        #[source]
        source: RecordError,
    },
    /// The peer published a record ending beyond what an honest producer could have written
    /// (`capacity - 8` bytes past the consumer's published position).
    #[error("record at position {position} ({size} bytes) ends past the producer's limit {limit}")]
    Overrun {
        /// Ring position of the record.
        position: u64,
        /// Its size, padding included.
        size: usize,
        /// The furthest position an honest producer can have reached.
        limit: u64,
    },
    /// A raw claim ([`Producer::claim_raw`](super::Producer::claim_raw)) is open: nothing else
    /// is written until it is committed or aborted (a caller error; the ring is unchanged).
    #[error("a raw claim is open")]
    ClaimOpen,
    /// The consumer's position word is misaligned, went backwards or is past the producer.
    #[error("consumer position {value} is not an 8-aligned value in {low}..={high}")]
    BadConsumerPosition {
        /// The word read.
        value: u64,
        /// The last validated value.
        low: u64,
        /// The producer's position.
        high: u64,
    },
}
