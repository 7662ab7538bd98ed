//! RDMA fabric (feature `rdma`): RC queue pairs over verbs, connected through rdma_cm.
//!
//! - [`verbs`]: the thin safe layer over libibverbs (the engine's only verbs FFI), one file per
//!   verbs object.
//! - `wr_id` (the `wr_id` encoding and connection generations), `header` (the credit word in the
//!   immediate data or, on iWARP, a header slot) and `counters` ([`RdmaStats`]): small pieces
//!   below the data path, shared with setup.
//! - `setup` (control thread / connecting thread; `setup/`: `devices` for the device table,
//!   `prepare` and `establish` for one connection's resources before and after ESTABLISHED,
//!   `connect`, `listener` and `accept` for the two sides, `events` for an established
//!   connection's rdma_cm events): rdma_cm connect and accept, per-device PD and per-poller CQ,
//!   registered pools, QP creation on the context rdma_cm resolved, receive pre-posting, the
//!   flow-control handshake in the private data. `rdma_connect` and the wait for ESTABLISHED run
//!   on a short-lived helper thread, so a connect returns within its timeout even where the
//!   kernel blocks in `rdma_connect` (soft-iWARP's TCP connect).
//! - [`datapath`] (pollers; `datapath/`: `mod` for the poller, `conn` and `conn/iwarp` for a
//!   connection, `chain` for chained receive posting, `frame` for frames): [`RdmaFabric`] polls
//!   each device's CQ in bursts and files the completions with their connections; [`RdmaConn`]
//!   coalesces runs of small messages into frames of records (one SEND each, split again on
//!   receive) and posts chained SEND_WITH_IMM batches (plain SENDs with a header on iWARP;
//!   inline when they fit), re-posts
//!   receive buffers in chains, and returns credits in the immediate data (iWARP: the header) or, for one-way
//!   traffic, in explicit credit messages.
//!
//! - `control` (control thread): the fabric's control half behind the engine's control seam
//!   (see [`crate::fabric`]): rdma_cm listeners, each connection's event channel
//!   (DISCONNECTED, DEVICE_REMOVAL), the device table, hand-over to the poller that owns the
//!   connection's CQ, and the connecting side run on application threads.
//!
//! # Using it
//!
//! Endpoints are `rdma://host:port`, where `host` is an address of an RDMA device (InfiniBand,
//! RoCE or iWARP). iWARP has no immediate data: on an iWARP device (detected from the verbs
//! transport type) each message is a plain SEND whose 4-byte header (the credit word) is
//! gathered from and scattered into a separate registered header slot, so the application
//! still sees the whole pool buffer ([`Connection::max_message_size`](crate::Connection::max_message_size) is the
//! buffer size on every transport) and the inline limit shrinks by the header. Shared receive
//! queues are not supported on iWARP (refused at connect). Both sides must use the same pool
//! buffer size. Each connection pre-posts `pool`'s buffer count of receives
//! and grants that many credits; [`EngineBuilder::rdma_srq`](crate::EngineBuilder::rdma_srq)
//! switches to one shared receive queue per poller and device instead (credits are then
//! reserved from the SRQ's pool, and a connection that does not fit is refused). Receive
//! buffers an application still holds when its connection dies are not returned to a shared
//! pool (they stay unpromised, so credits never over-commit it). The control thread logs
//! (`tracing`, info) the device, port, GID index, GID type and GID rdma_cm chose per connection.
//! [`EngineBuilder::rdma_gid_index`](crate::EngineBuilder::rdma_gid_index) (or env
//! `SPINWIRE_RDMA_GID_INDEX`) overrides the source GID index of the connections an engine
//! makes: rdma_cm picks a GID only through an address, so connect resolves the route from the
//! address of that GID-table entry and reads back the index the QP uses (a typed error if
//! rdma_cm took another entry of the same address); accepted connections use the GID of the
//! address the client connected to, and a wildcard listener binds to the override's address.
//! Both are logged at info.
//! [`stats`] reports RNR errors (always 0 unless something is broken), error completions and
//! credit messages.
//!
//! # Building and testing
//!
//! Building needs libibverbs-dev, librdmacm-dev and libclang-dev; on Debian 12 that is
//! libclang 14 (rdma-sys 0.3's bindgen fails with libclang >= 16; `cm/build.rs` checks this
//! and names the missing package). The default build (no `rdma` feature) needs none of them.
//!
//! The tests (`engine/tests/rdma_*.rs`) need a real RDMA stack: `scripts/ci/rdma-vm.sh` builds
//! them on the host and runs them inside a Soft-RoCE qemu VM with `--test-threads=1`; outside
//! the VM (no `RXE_VM_IP`) they print that they were skipped. The iWARP header path runs under
//! soft-iWARP: `RXE_VM_RDMA=siw scripts/rxe-vm '<rdma_engine test binary> --test-threads=1
//! iwarp'` (CI runs rxe only; there the iWARP-only tests print `skipped: needs siw`).

// Layers (rustfmt sorts the lines): `verbs`, `wr_id`, `header` and `counters` use none of the
// others; `datapath` uses only those; `setup` and `control` (the control plane) sit on top.
pub(crate) mod control;
mod counters;
pub mod datapath;
mod error;
mod header;
pub(crate) mod setup;
pub mod verbs;
mod wr_id;

pub use counters::{stats, RdmaStats};
pub use datapath::{RdmaCommand, RdmaConn, RdmaFabric};
pub use error::RdmaSetupError;
