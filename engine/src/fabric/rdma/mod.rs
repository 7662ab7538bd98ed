//! RDMA fabric (feature `rdma`): RC queue pairs over verbs, connected through rdma_cm.
//!
//! - [`verbs`]: the thin safe layer over libibverbs (the engine's only verbs FFI).
//! - `setup` (control thread / connecting thread): rdma_cm connect and accept, per-device PD and
//!   per-poller CQ, registered pools, QP creation on the context rdma_cm resolved, receive
//!   pre-posting, the flow-control handshake in the private data.
//! - [`datapath`] (pollers): [`RdmaFabric`] polls each device's CQ in bursts and files the
//!   completions with their connections; [`RdmaConn`] posts chained SEND_WITH_IMM batches
//!   (inline when they fit), re-posts receive buffers in chains, and returns credits in the
//!   immediate data or, for one-way traffic, in explicit credit messages.
//!
//! Building needs libibverbs-dev, librdmacm-dev and libclang-dev; on Debian 12 that is
//! libclang 14 (rdma-sys 0.3's bindgen fails with libclang >= 16; `engine/build.rs` checks this
//! and names the missing package).

pub(crate) mod control;
pub mod datapath;
pub(crate) mod setup;
pub mod verbs;

pub use datapath::{stats, RdmaCommand, RdmaConn, RdmaFabric, RdmaStats};
