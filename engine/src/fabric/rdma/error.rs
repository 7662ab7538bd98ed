//! Typed setup errors of the RDMA fabric: one variant per failing step or check, carrying the
//! verbs / rdma_cm / OS error as `#[source]`.

use std::io;
use std::net::{Ipv6Addr, SocketAddr};

use cm::rdma::{CmError, PrivateDataError};

use super::verbs::{PostError, VerbsError};

/// Setting up an RDMA connection failed (reported as
/// [`SetupError::Rdma`](crate::SetupError::Rdma)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaSetupError {
    /// A verbs call failed at `step` (create CQ / SRQ / QP, register a pool, query, tune QP).
    #[error("rdma {step}")]
    Verbs {
        /// The step (e.g. `"create CQ"`).
        step: &'static str,
        /// The verbs error (errno inside).
        #[source]
        source: VerbsError,
    },
    /// Posting receives failed at `step`.
    #[error("rdma {step}")]
    Post {
        /// The step (e.g. `"pre-post receives"`).
        step: &'static str,
        /// The provider's error.
        #[source]
        source: PostError,
    },
    /// An rdma_cm call failed at `step` (event channel, accept, QP creation on the CM id).
    #[error("rdma {step}")]
    Cm {
        /// The step.
        step: &'static str,
        /// The rdma_cm error.
        #[source]
        source: CmError,
    },
    /// An OS call failed at `step` (spawning the connect thread).
    #[error("rdma {step}")]
    Io {
        /// The step.
        step: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The connect request's private data (flow-control parameters) did not decode.
    #[error("rdma connect request with invalid parameters")]
    BadRequestParams(#[source] PrivateDataError),
    /// Posting the shared receive queue's buffers failed (the provider's errno).
    #[error("rdma post SRQ receives")]
    PostSrq(#[source] io::Error),
    /// The device has no shared receive queues.
    #[error("rdma: this device has no shared receive queues")]
    NoSrqSupport,
    /// More SRQ buffers than the device's SRQ entries.
    #[error("rdma: {count} SRQ buffers exceed the device's {max} SRQ entries")]
    SrqTooLarge {
        /// Buffers asked for (`rdma_srq`).
        count: u32,
        /// The device's `max_srq_wr`.
        max: u32,
    },
    /// `rdma_srq_credits` (or the buffer count it is clamped to) below the minimum window.
    #[error(
        "rdma: {count} SRQ credits per connection (rdma_srq_credits, clamped to the buffer \
         count) is below the minimum of {min}"
    )]
    SrqCredits {
        /// Credits asked for (`rdma_srq_credits`; 0: the default).
        count: usize,
        /// The fewest credits a connection works with.
        min: u32,
    },
    /// `rdma_srq` does not fit a `u32`.
    #[error("rdma: {count} SRQ buffers is too many")]
    SrqCountTooLarge {
        /// Buffers asked for.
        count: usize,
    },
    /// A memory region's address is null (the provider returned no mapping).
    #[error("rdma {what} is null")]
    NullRegion {
        /// Which region ("send pool", "receive pool", "header region", "SRQ pool").
        what: &'static str,
    },
    /// Internal: a resource expected at this point is missing ("CQ", "SRQ", "receive pool").
    #[error("rdma {what} missing")]
    Missing {
        /// Which resource.
        what: &'static str,
    },
    /// The device table's lock was poisoned by a panicking thread.
    #[error("rdma device table poisoned")]
    DeviceTablePoisoned,
    /// The engine has no poller (or not poller `poller`) for RDMA connections.
    #[error("rdma: no poller {poller}")]
    NoPoller {
        /// The poller index.
        poller: usize,
    },
    /// rdma_cm resolved no device for this connection, or one the engine does not know.
    #[error("rdma_cm resolved no known device for this connection")]
    NoDevice,
    /// Shared receive queues are not supported on iWARP devices.
    #[error(
        "rdma device {device} is iWARP: shared receive queues (rdma_srq) are not supported \
         on iWARP; use per-connection receive buffers (rdma_srq 0)"
    )]
    SrqOnIwarp {
        /// The device name.
        device: String,
    },
    /// The poller's completion queue has too few unreserved entries for another connection.
    #[error(
        "rdma: poller {poller}'s completion queue is full ({free} free entries, need {need}); \
         use fewer connections per poller or smaller pools"
    )]
    CqFull {
        /// The poller index.
        poller: usize,
        /// Unreserved entries.
        free: u32,
        /// Entries one connection needs.
        need: u32,
    },
    /// The poller's SRQ has too few unpromised buffers for another connection.
    #[error(
        "rdma: poller {poller}'s shared receive queue has {free} unpromised buffers, a connection \
         needs {need}; raise rdma_srq or lower rdma_srq_credits"
    )]
    SrqFull {
        /// The poller index.
        poller: usize,
        /// Unpromised buffers.
        free: u32,
        /// Credits one connection is granted (`rdma_srq_credits`).
        need: u32,
    },
    /// A connect request was rejected because the table of accepts waiting for ESTABLISHED is
    /// full.
    #[error("rdma connect request rejected: {pending} accepts already pending")]
    AcceptsPending {
        /// Accepts pending (the table's capacity).
        pending: usize,
    },
    /// The buffer size does not fit the RDMA flow-control parameters.
    #[error("rdma buffer size {size} out of range 1..={max}")]
    BufferSize {
        /// The configured buffer size.
        size: usize,
        /// The largest one RDMA supports.
        max: u32,
    },
    /// The per-connection buffer count is outside what RDMA flow control supports.
    #[error("rdma: {count} buffers per connection is outside {min}..={max}")]
    BufferCount {
        /// The configured count.
        count: usize,
        /// Fewest buffers (credits).
        min: u32,
        /// Most buffers.
        max: u32,
    },
    /// More buffers per connection than the device's receive queue entries.
    #[error(
        "rdma: {count} buffers per connection exceed the device's {max} receive queue entries"
    )]
    QueueTooDeep {
        /// Buffers per connection.
        count: u32,
        /// The device's `max_qp_wr`.
        max: u32,
    },
    /// The peer grants fewer credits than the engine needs.
    #[error("rdma peer grants {credits} credits; at least {min} are needed")]
    TooFewCredits {
        /// Credits the peer grants.
        credits: u32,
        /// Fewest credits needed.
        min: u32,
    },
    /// The peer's pool buffer size differs from ours.
    #[error(
        "rdma peer uses {peer}-byte buffers, this engine {ours} (both sides need the same pool \
         buffer size)"
    )]
    BufferSizeMismatch {
        /// The peer's buffer size.
        peer: u32,
        /// Ours.
        ours: u32,
    },
    /// A connect request's parameters do not match this listener (it was rejected).
    #[error(
        "rdma connect request with {peer_size}-byte buffers and {peer_credits} credits rejected: \
         this listener uses {ours}-byte buffers and needs at least {min} credits"
    )]
    RequestRejected {
        /// The connector's buffer size.
        peer_size: u32,
        /// The connector's credits.
        peer_credits: u32,
        /// This listener's buffer size.
        ours: usize,
        /// Fewest credits needed.
        min: u32,
    },
    /// More large slots than the RDMA rendezvous supports.
    #[error("rdma: {count} large slots per connection exceed the rendezvous limit of {max}")]
    LargeSlots {
        /// `large_buffers`.
        count: usize,
        /// The most the rendezvous handshake carries.
        max: u32,
    },
    /// Large messages need pool buffers that hold an RNDV frame.
    #[error(
        "rdma large messages need pool buffers of at least {min} bytes (the RNDV frame), not \
         {buffer_size}"
    )]
    LargeNeedsBuffer {
        /// The pool's buffer size.
        buffer_size: u32,
        /// The RNDV frame's size.
        min: u32,
    },
    /// The device cannot have an RDMA READ outstanding (as initiator or responder).
    #[error(
        "rdma device allows {initiator} outstanding RDMA READs as initiator and {responder} as \
         responder; large messages need at least 1 of each"
    )]
    NoRdmaRead {
        /// `max_qp_init_rd_atom`.
        initiator: u32,
        /// `max_qp_rd_atom`.
        responder: u32,
    },
    /// The peer announced an invalid large send region in its private data.
    #[error("rdma peer announced an invalid large region: {reason}")]
    BadLargeRegion {
        /// The rule it broke.
        reason: &'static str,
    },
    /// The peer's large slots differ from ours (both sides need the same `max_message_size`,
    /// or neither large slots).
    #[error(
        "rdma peer has {peer_slots} large slots of {peer_slot_size} bytes, this engine slots of \
         {ours} bytes (both sides need the same max_message_size with large slots, or none)"
    )]
    LargeMismatch {
        /// The peer's slot size (0: no large messages).
        peer_slot_size: u32,
        /// The peer's slot count.
        peer_slots: u32,
        /// Our slot size (0: no large messages).
        ours: u32,
    },
    /// The thread running the bounded connect ended without reporting a result.
    #[error("rdma connect thread ended without a result")]
    ConnectThreadLost,
    /// The thread preparing and accepting a connection request ended without reporting a
    /// result.
    #[error("rdma accept thread ended without a result")]
    AcceptThreadLost,
    /// Reading the port or GID table for the GID-index override failed (the verbs errno inside).
    #[error("rdma gid index override {index}: querying device {device} port {port} failed")]
    GidQuery {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// The requested GID index.
        index: u8,
        /// The verbs error.
        #[source]
        source: VerbsError,
    },
    /// The GID-index override is beyond the port's GID table.
    #[error(
        "rdma gid index override {index} is out of range: device {device} port {port} has {table_len} GID entries"
    )]
    GidIndexOutOfRange {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// The requested GID index.
        index: u8,
        /// Entries in the port's GID table.
        table_len: u32,
    },
    /// The GID-table entry of the override is empty (no address configured there).
    #[error("rdma gid index override {index}: device {device} port {port} has no GID there (empty entry)")]
    GidEmpty {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// The requested GID index.
        index: u8,
    },
    /// The GID of the override is not IP-based, so it cannot be chosen through an address.
    #[error("rdma gid index override {index}: GID {gid} on device {device} port {port} is not an IP-based GID ({why})")]
    GidNotIp {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// The requested GID index.
        index: u8,
        /// The GID found there.
        gid: Ipv6Addr,
        /// Why not (InfiniBand link layer, iWARP device).
        why: &'static str,
    },
    /// The GID of the override is of the other address family than the destination.
    #[error(
        "rdma gid index override {index}: GID {gid} on device {device} port {port} cannot reach {dst} (the source and destination address families differ)"
    )]
    GidFamily {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// The requested GID index.
        index: u8,
        /// The GID found there.
        gid: Ipv6Addr,
        /// The destination.
        dst: SocketAddr,
    },
    /// rdma_cm connected from another GID index than the override asked for: another entry
    /// holds the same address (RoCE v1 and v2 entries of one IP), and rdma_cm took the one of
    /// the port's default RoCE mode.
    #[error(
        "rdma gid index override {index} ({requested_type}) on device {device} port {port}: rdma_cm chose gid index {chosen} ({chosen_type}) for the same address; rdma_cm takes the GID type from the port's default RoCE mode (/sys/kernel/config/rdma_cm/{device}/ports/{port}/default_roce_mode): set it to {requested_type}, or use index {chosen}"
    )]
    GidMismatch {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// The requested GID index.
        index: u8,
        /// Its GID type (sysfs), or `unknown`.
        requested_type: String,
        /// The index the connection uses.
        chosen: u8,
        /// Its GID type, or `unknown`.
        chosen_type: String,
    },
    /// A listener on the wildcard address with a GID-index override: no device port has a
    /// usable IP GID of the listener's family at that index.
    #[error(
        "rdma gid index override {index}: no RDMA device port has a usable {family} GID at that index to bind the wildcard listener to"
    )]
    NoGidForListener {
        /// The requested GID index.
        index: u8,
        /// `IPv4` or `IPv6`.
        family: &'static str,
    },
    /// The RDMA device of a connection was removed.
    #[error("rdma device removed")]
    DeviceRemoved,
}

/// A lower-layer error that becomes an [`RdmaSetupError`] at a named step.
pub(crate) trait AtStep {
    /// The error of `step`.
    fn at(self, step: &'static str) -> RdmaSetupError;
}

impl AtStep for VerbsError {
    fn at(self, step: &'static str) -> RdmaSetupError {
        RdmaSetupError::Verbs { step, source: self }
    }
}

impl AtStep for PostError {
    fn at(self, step: &'static str) -> RdmaSetupError {
        RdmaSetupError::Post { step, source: self }
    }
}

impl AtStep for CmError {
    fn at(self, step: &'static str) -> RdmaSetupError {
        RdmaSetupError::Cm { step, source: self }
    }
}

impl AtStep for io::Error {
    fn at(self, step: &'static str) -> RdmaSetupError {
        RdmaSetupError::Io { step, source: self }
    }
}
