//! Typed setup errors of the shm fabric: one variant per failing step or check, carrying the
//! wire / rendezvous error as `#[source]`.

use cm::uds::UdsError;

use super::wire::{Params, WireError};

/// Setting up an shm connection failed (reported as
/// [`SetupError::Shm`](crate::SetupError::Shm)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmSetupError {
    /// The configured buffer size exceeds what the shm wire supports.
    #[error("shm buffer size {size} exceeds the shm limit of {max} bytes")]
    BufferSize {
        /// The configured buffer size.
        size: usize,
        /// The wire's limit.
        max: u32,
    },
    /// The parameters derived from the configuration are invalid for the wire.
    #[error("shm parameters")]
    Params(#[source] WireError),
    /// A wire-layer step failed (creating, attaching or splitting the segment, a pool).
    #[error("{step}")]
    Wire {
        /// The step (e.g. `"creating the shm segment"`).
        step: &'static str,
        /// The wire error (errno inside for system calls).
        #[source]
        source: WireError,
    },
    /// A rendezvous step of an accepted connection failed.
    #[error("shm accept")]
    Accept(#[source] UdsError),
    /// The listener offered parameters that are invalid (the connector aborted).
    #[error("listener offered invalid shm parameters {theirs:?}")]
    OfferInvalid {
        /// The offered parameters.
        theirs: Params,
    },
    /// The listener offered parameters that differ from ours (the connector aborted).
    #[error("listener offered shm parameters {theirs:?}, we need {ours:?}")]
    OfferMismatch {
        /// The offered parameters.
        theirs: Params,
        /// Ours.
        ours: Params,
    },
    /// The connector proposed parameters that are invalid (the listener rejected it).
    #[error("connector proposed invalid shm parameters {theirs:?}")]
    ProposalInvalid {
        /// The proposed parameters.
        theirs: Params,
    },
    /// The connector proposed parameters that differ from this listener's (rejected).
    #[error("connector proposed shm parameters {theirs:?}, this listener needs {ours:?}")]
    ProposalMismatch {
        /// The proposed parameters.
        theirs: Params,
        /// The listener's.
        ours: Params,
    },
}
