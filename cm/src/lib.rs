//! spinwire's control plane: connection management on a dedicated control thread.
//!
//! spinwire splits every connection's life in two. *Setup and teardown* (rendezvous,
//! parameter negotiation, rdma_cm, hang-up and disconnect detection) happen here, on a thread
//! that may block in `poll(2)` and make system calls; the *data path* runs on the engine's
//! pollers, which never call into this crate. The engine (the `spinwire` crate) plugs its
//! fabric-specific setup into the control thread and talks to its pollers only through rings.
//!
//! # Modules
//! - [`control`]: the fabric-neutral control thread ([`control::ControlThread`]): a loop that
//!   drains requests, `poll(2)`s the backend's descriptors with a bounded sleep, and hands ready
//!   descriptors and timed work to the engine's [`control::Backend`].
//! - [`uds`]: the shm fabric's rendezvous over Unix `SOCK_SEQPACKET` sockets: named listeners in
//!   a private runtime directory, a versioned handshake that passes the shared segment's memfd,
//!   and hang-up detection for the connection's lifetime.
//! - `rdma` (feature `rdma`): rdma_cm event channels and ids, the listener, and the
//!   flow-control parameters exchanged in the private data. It is the workspace's only
//!   librdmacm FFI; libibverbs objects stay in the engine's verbs layer, which gets the device
//!   context and the QP from here only through documented `unsafe fn`s.
//!
//! # Threading
//! Everything here runs on the control thread, or on an application thread that is connecting
//! (a blocking call bounded by its timeout); nothing runs on a poller. Every wait takes a
//! timeout or deadline. [`uds::UdsListener`], [`uds::UdsStream`] and the rdma_cm wrappers are
//! `Send`, so setup may start on one thread and the control thread may own the result.
//!
//! # Errors
//! Each module has its own `thiserror` enum ([`control::ControlError`], [`uds::UdsError`],
//! `rdma::CmError`), `#[non_exhaustive]`, with one variant per failing step and the OS error
//! kept as the `source`.
//!
//! # Features
//! - `rdma`: builds the `rdma` module (needs libibverbs-dev, librdmacm-dev and libclang < 16;
//!   `build.rs` names whatever is missing). The default build needs none of them.

pub mod control;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod uds;
