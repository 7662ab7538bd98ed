//! The kernel-TCP fabric: the same engine across hosts without RDMA (`tcp://host:port`, IPv4 or
//! IPv6 `tcp://[::1]:port`).
//!
//! One connection = one TCP socket (`TCP_NODELAY`, non-blocking) carrying the
//! [v2 record format](crate::record) in both directions: `DATA` records are messages, `CREDIT`
//! records return credits, `HEARTBEAT` records prove liveness on an idle connection. The poller
//! busy-polls the socket with `recv` and writes everything queued in one cycle with one
//! `sendmsg` (coalesced; no epoll on the data path). Each side has its own send and receive
//! buffer pools in process memory; see `datapath` for the buffer flow (small messages are copied
//! once into a coalescing stage, larger ones are written straight from the send buffer; the
//! socket is read into the receive pool's chunks, where larger messages are read in place and
//! small ones are copied into the application's ring slot).
//!
//! * `hello`: the 32-byte parameter handshake message.
//! * `setup` (control thread / connecting thread): the handshake steps, the pools,
//!   listening and connecting (non-blocking connect bounded by the connect timeout).
//! * `datapath` (poller): [`TcpFabric`] / [`TcpConn`], the [`Fabric`](super::Fabric)
//!   implementation.
//! * `control` (control thread): listeners and pending handshakes (a table with deadlines),
//!   teardown, behind the engine's control seam (see [`crate::fabric`]).
//! * `sys`: the socket system calls of the data path (the fabric's only FFI).
//!
//! Everything from the peer is validated: a bad hello fails that accept or connect with a typed
//! [`TcpSetupError`]; a bad record fails only that connection with a
//! [`FabricError::Protocol`](crate::FabricError::Protocol); the end of stream or a reset
//! disconnects it.

pub(crate) mod control;
mod datapath;
mod error;
mod hello;
pub(crate) mod setup;
mod sys;

pub use datapath::{TcpConn, TcpFabric};
pub use error::TcpSetupError;
pub use hello::TcpParams;
