//! The kernel-TCP fabric: the same engine across hosts without RDMA (`tcp://host:port`, IPv4 or
//! IPv6 `tcp://[::1]:port`).
//!
//! One connection = one TCP socket (`TCP_NODELAY`, non-blocking) carrying the
//! [record format](crate::record) in both directions: `DATA` records are messages, `CREDIT`
//! records return credits (of a byte window each side announces in its hello, and of the
//! engine's message window), `HEARTBEAT` records prove liveness on an idle connection. The poller
//! busy-polls the socket with `recv` and writes everything queued in one cycle with one
//! `sendmsg` (coalesced; no epoll on the data path). Each side has its own send and receive
//! buffer pools in process memory; see `datapath` for the buffer flow (small messages are copied
//! once into a coalescing stage, larger ones are written straight from the send buffer; the
//! socket is read into the receive pool's chunks, where larger messages are read in place and
//! small ones are copied into the application's ring slot).
//!
//! **Large messages**. The hello carries each side's `max_message_size` and large
//! slot count; with large slots on both sides the connection's limit is the smaller
//! `max_message_size` ([`Connection::max_message_size`](crate::Connection::max_message_size)
//! reports it), else the buffer size. A large message is framed like any other: one `DATA`
//! record, an 8-byte header (length = 8 + payload, type `DATA`, reserved bytes 0) and the
//! payload, padded to 8 bytes; there is no fragmentation and no extra round trip. The sender
//! writes it straight from its large slot; the receiver reads a record longer than half a
//! receive chunk straight into a large receive slot and lends it in place (see `datapath`). A
//! header announcing more than the limit fails the connection
//! ([`FabricError::Protocol`](crate::FabricError::Protocol)) before any payload is read.
//!
//! **Memory per connection** with large messages: two large pools (send, receive) of
//! `large_buffers` slots of the limit each, i.e. `2 * large_buffers * max_message_size` bytes
//! of address space (64 MiB at the defaults), mapped once at setup as anonymous private
//! `MAP_NORESERVE` memory and unmapped when the connection's memory is dropped. Pages are
//! touched only as messages use them (a connection that only ever carries 1 MiB messages
//! commits at most 1 MiB per slot), so the resident cost follows the traffic, not the limit.
//!
//! * `hello`: the 32-byte parameter handshake message (wire version, buffer size, depth,
//!   message limit, large slots, byte window).
//! * `setup` (control thread / connecting thread): the handshake steps, the pools (the large
//!   pools' mappings too), listening and connecting (non-blocking connect bounded by the connect timeout).
//! * `datapath` (poller): [`TcpFabric`] / [`TcpConn`], the [`Fabric`](super::Fabric)
//!   implementation.
//! * `control` (control thread): listeners and pending handshakes (a table with deadlines),
//!   teardown, behind the engine's control seam (see [`crate::fabric`]).
//! * `sys`: the socket system calls of the data path and the large pools' `mmap`/`munmap` (the
//!   fabric's only FFI).
//!
//! Everything from the peer is validated: a bad hello fails that accept or connect with a typed
//! [`TcpSetupError`]; a bad record fails only that connection with a
//! [`FabricError::Protocol`](crate::FabricError::Protocol); the end of stream or a reset
//! disconnects it. A side that fails a connection because of its peer (a protocol violation,
//! a silent peer) ends its stream with a `CLOSE` record naming the reason, best effort, and
//! the peer fails with [`FabricError::PeerAborted`](crate::FabricError::PeerAborted).

pub(crate) mod control;
mod datapath;
mod error;
mod hello;
pub(crate) mod setup;
mod sys;

pub use datapath::{TcpConn, TcpFabric};
pub use error::TcpSetupError;
pub use hello::{HelloError, TcpParams, MAX_RX_WINDOW, WIRE_VERSION};
