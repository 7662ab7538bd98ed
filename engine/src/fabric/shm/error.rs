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
    /// The segment could not be placed as the engine's
    /// [`hugepages`](crate::EngineBuilder::hugepages) policy requires.
    #[error("placing the shm segment")]
    Placement(#[source] crate::placement::PlacementError),
    /// A rendezvous step of an accepted connection failed.
    #[error("shm accept")]
    Accept(#[source] UdsError),
    /// The listener offered parameters that are invalid (the connector aborted).
    #[error("listener offered invalid shm parameters {theirs:?}")]
    OfferInvalid {
        /// The offered parameters.
        theirs: Params,
    },
    /// The listener offered settings this side cannot use (the connector aborted).
    #[error("the listener offered shm settings that differ from ours: {}", Mismatch::list(.mismatches))]
    OfferMismatch {
        /// Each differing setting (`ours`: this side's; `theirs`: the listener's offer).
        mismatches: Vec<Mismatch>,
    },
    /// The listener refused this side's settings: its own differ in pool geometry.
    #[error("the listener refused: its shm settings differ: {}", Mismatch::list(.mismatches))]
    Refused {
        /// Each differing setting (`ours`: this side's; `theirs`: the listener's).
        mismatches: Vec<Mismatch>,
        /// The refusal as the rendezvous received it.
        #[source]
        source: UdsError,
    },
    /// The connector proposed parameters that are invalid (the listener rejected it): out of
    /// the wire's range, or a ring deeper than the listener's pool could fill.
    #[error("connector proposed invalid shm parameters {theirs:?}")]
    ProposalInvalid {
        /// The proposed parameters.
        theirs: Params,
        /// The first field out of range.
        #[source]
        source: WireError,
    },
    /// The connector's settings differ from this listener's in pool geometry (rejected; the
    /// connector is told the listener's values).
    #[error("a connector's shm settings differ from this listener's: {}", Mismatch::list(.mismatches))]
    ProposalMismatch {
        /// Each differing setting (`ours`: the listener's; `theirs`: the connector's).
        mismatches: Vec<Mismatch>,
    },
}

/// One setting on which the two ends of an shm connection differ and cannot settle: the shared
/// segment's pools are sized by them, so both ends must be configured alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mismatch {
    /// The [`EngineBuilder`](crate::EngineBuilder) setting (`"buffer_size"`, `"buffers"`,
    /// `"max_message_size"`, `"large_buffers"`), in the wire's units (sizes rounded up to 64).
    pub setting: &'static str,
    /// This side's value.
    pub ours: u64,
    /// The other side's value.
    pub theirs: u64,
}

impl Mismatch {
    /// `a ours 1 theirs 2, b ...`, for the error messages.
    fn list(m: &[Mismatch]) -> String {
        let items: Vec<String> = m.iter().map(ToString::to_string).collect();
        items.join(", ")
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {} here, {} at the peer",
            self.setting, self.ours, self.theirs
        )
    }
}
