//! The `wr_id` encoding of the RDMA data path, and connection generations.
//!
//! Layout: connection generation (16 bits) | receive flag | SRQ flag | value (46 bits: buffer
//! index of a receive, sequence number of a send). Completions are matched to connections by QP
//! number; the generation rejects completions of an earlier QP that reused the number.

use std::sync::atomic::{AtomicU64, Ordering};

/// Shift of the connection generation.
pub(super) const WR_GEN_SHIFT: u32 = 48;
/// A receive (else a send).
pub(super) const WR_RECV: u64 = 1 << 47;
/// A receive posted to a shared receive queue (value = buffer of the SRQ's pool; no generation:
/// SRQ buffers belong to no connection).
pub(super) const WR_SRQ: u64 = 1 << 46;
/// The value bits (buffer index of a receive, low bits of a send's sequence number).
pub(super) const WR_VALUE_MASK: u64 = WR_SRQ - 1;

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// A fresh connection generation for [`RdmaConnParts::gen`](super::datapath::RdmaConnParts::gen) (setup, before pre-posting).
pub(crate) fn next_generation() -> u16 {
    GENERATION.fetch_add(1, Ordering::Relaxed) as u16
}

/// The `wr_id` of a receive of buffer `buf` of a shared receive queue's pool.
#[inline]
pub(crate) fn srq_wr_id(buf: u32) -> u64 {
    WR_RECV | WR_SRQ | u64::from(buf)
}

/// The `wr_id` of a receive of buffer `buf` for a connection of generation `gen`.
#[inline]
pub(crate) fn recv_wr_id(gen: u16, buf: u32) -> u64 {
    (u64::from(gen) << WR_GEN_SHIFT) | WR_RECV | u64::from(buf)
}
