//! Thin safe layer over libibverbs (through `rdma-sys`): device context, protection domain,
//! completion queue, queue pair, shared receive queue and memory region.
//!
//! This module tree is the only place in the engine that calls verbs FFI (the data path in
//! [`super::datapath`] posts the work requests built here through these wrappers). Modelled on
//! rust-ibverbs and sideway:
//!
//! - Long-lived objects hold an [`Arc`](std::sync::Arc) to their parents (`MemoryRegion ->
//!   ProtectionDomain -> Context`, `CompletionQueue -> Context`, `QueuePair ->
//!   {ProtectionDomain, CompletionQueue, SharedReceiveQueue}`), so a parent is never destroyed before its children, whatever order
//!   the owner drops them in.
//! - Posting is an `unsafe fn`: the caller promises that every buffer named by a work request
//!   stays valid (and, for receives, unaliased) until the work request's completion has been
//!   polled, or the queue pair has been destroyed.
//! - [`CompletionQueue::poll`] fills a caller-provided array (normally on the poller's stack) in
//!   one `ibv_poll_cq` call; it never allocates.
//!
//! libibverbs objects are thread safe (the providers lock internally), so the wrappers are
//! `Send + Sync`; the engine still keeps each queue pair and completion queue on one poller.
//!
//! # Files
//! One per verbs object, each holding its FFI calls; `error` and `wr` below all of them:
//! - `error`: [`VerbsError`], [`PostError`].
//! - `wr`: work requests ([`SendWr`], [`RecvWr`], [`Sge`]), opcodes and flags.
//! - `device`: [`Context`] (with its port and GID-table queries, [`PortGids`]),
//!   [`DeviceLimits`], [`ProtectionDomain`].
//! - `mr`: [`MemoryRegion`], [`Access`].
//! - `cq`: [`CompletionQueue`], [`WorkCompletion`] and its status codes.
//! - `srq`: [`SharedReceiveQueue`].
//! - `qp`: [`QueuePair`], [`QpResources`], [`QpCapacity`].

mod cq;
mod device;
mod error;
mod mr;
mod qp;
mod srq;
mod wr;

pub use cq::{
    status_str, CompletionQueue, WcSlot, WcStatus, WorkCompletion, WC_RNR_RETRY_EXC_ERR,
    WC_SUCCESS, WC_WR_FLUSH_ERR,
};
pub use device::{Context, DeviceLimits, PortGids, ProtectionDomain};
pub use error::{PostError, VerbsError};
pub use mr::{Access, MemoryRegion};
pub use qp::{QpCapacity, QpResources, QueuePair};
pub use srq::SharedReceiveQueue;
pub use wr::{
    recv_wr_zeroed, send_wr_zeroed, set_imm, set_rdma, RecvWr, SendWr, Sge, SEND_INLINE,
    SEND_SIGNALED, WR_RDMA_READ, WR_SEND, WR_SEND_WITH_IMM,
};
