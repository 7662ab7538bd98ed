//! Fabrics: the transports a poller is generic over, and the seam between them and the engine.
//!
//! The seam itself is split by concern: `seam.rs` holds the poller's traits ([`Fabric`],
//! [`FabricConn`], [`ConnTable`]), `sink.rs` where a data path meets the application's rings
//! ([`RxSink`], [`TxDone`]), `direct.rs` the direct-path dispatch (`DirectPath`, `Sent`; see
//! [below](#direct-paths)) and `control/` the control thread's seam (see
//! [the control seam](#the-control-seam)); all of them are re-exported here.
//!
//! A fabric has two halves that live in separate files:
//!
//! * **setup** (`fabric/<name>/setup.rs`, or a `setup/` directory, as rdma's): runs on the
//!   control thread. It performs rendezvous (shm: a Unix-socket hello plus memfd passing; RDMA:
//!   rdma_cm), creates the per-connection resources (shm: the segment; RDMA: the queue pair and
//!   the registered pool memory regions) and produces a [`FabricConn`] (or a direct path, see
//!   [below](#direct-paths)) plus the application's views of the pools ([`PoolView`]). The
//!   fabric's control half (`fabric/<name>/control.rs`, see [the control seam](#the-control-seam))
//!   then hands the connection to a poller through its command ring (a direct path goes to the
//!   application instead). Setup code makes syscalls;
//!   on the control thread it never waits on a peer (a handshake step that needs the peer's
//!   answer is a pending entry with a deadline, advanced when its descriptor is ready); on a
//!   connecting thread it blocks, bounded by the connect timeout.
//! * **datapath** (`fabric/<name>/datapath.rs`, or a `datapath/` directory, as rdma's): the
//!   [`Fabric`] and [`FabricConn`] implementations that a poller drives every cycle (a
//!   direct-path fabric, as shm, has a direct data path instead and no poller side). No syscalls
//!   (except the RDMA doorbell write, which is an MMIO store, not a syscall, and the kernel-TCP
//!   fabric's non-blocking `recv` / `sendmsg`, at most one of each per connection per cycle,
//!   which are its data path), no locks, no allocation, no logging: count events, return
//!   [`FabricError`] on a peer's protocol violation.
//!
//! # The poller cycle, as a fabric sees it
//!
//! A poller owns one `F: Fabric` value (per-poller state: RDMA's completion queue shared by all of
//! that poller's connections; nothing for TCP) and a table of connections, each with a
//! `F::Conn: FabricConn`. One call of the poller's `do_work(now)` does:
//!
//! 1. drain at most a bounded number of commands (new connection, remove connection,
//!    [`Fabric::Command`] for the fabric itself, e.g. "here is the CQ of device X");
//! 2. [`Fabric::poll_shared`] once: RDMA polls its CQ in bursts (e.g. 32 `ibv_wc` into a stack
//!    array) and files each completion with its connection through [`ConnTable::get_mut`] (the
//!    `wr_id` carries the slot given to [`FabricConn::attached`]); TCP does nothing here;
//! 3. for every connection:
//!    * [`FabricConn::poll_rx`] delivers received messages into an [`RxSink`] (room for at most
//!      `min(batch, free slots of the application's receive ring)`; a fabric must not consume more
//!      from its peer than the sink has room for: that is how back-pressure reaches the sender);
//!    * [`FabricConn::post_send`] gets the application's send descriptors ([`TxDesc`], a batch
//!      of at most `batch`) and returns how many it accepted; the rest stay queued in the
//!      application's send ring and are offered again next cycle. With dedicated pollers a
//!      message of at most `TX_INLINE_MAX` (16) bytes comes in its descriptor, naming no buffer,
//!      to a fabric that takes that ([`FabricConn::INLINE_SENDS`]: mem, tcp);
//!    * [`FabricConn::release_rx`] gets receive buffers the application dropped (RDMA: re-post
//!      them as receives);
//!    * [`FabricConn::reclaim`] reports send buffers that are free again ([`TxDone::free_buf`])
//!      and credits that came back ([`TxDone::credits`]);
//!    * [`FabricConn::flush`] publishes what was posted (RDMA: one doorbell for the chained work
//!      requests; TCP: one `sendmsg` of the coalesced records).
//!
//! Every `FabricError` fails only that connection: the poller removes it, marks it failed for the
//! application and reports it to the control thread, which emits an [`Event`](crate::Event).
//!
//! # Credits
//!
//! The engine counts credits per connection: the application may have at most `depth` messages
//! "in flight" (handed to `send`, credit not yet returned); `send` returns `WouldBlock` beyond.
//! A fabric returns a credit ([`TxDone::credits`]) only when the *receiver* has made room for one
//! more message: RDMA when the credit count piggybacked in
//! the peer's immediate data (or an explicit credit message when traffic is one-way) says a
//! receive buffer was re-posted. So the sender never has more in flight than the receiver has
//! buffers ready. (shm's direct path keeps the same `depth` window itself: a message counts until
//! the peer application consumed its record from the ring.)
//!
//! # Buffers
//!
//! Send buffers are owned by the application from `alloc` until `send`; then by the poller and
//! fabric until the fabric frees them through [`TxDone::free_buf`] (RDMA: on the send
//! completion; a fabric that copies small messages, [`FabricConn::copies`], right after the
//! copy). The
//! engine tracks ownership in a bitmap and rejects a buffer freed twice or never sent (a
//! [`FabricError::Protocol`]), so a hostile peer can never make two application handles alias one
//! buffer. Receive buffers go the other way: [`RxSink::push_pooled`] lends one to the application,
//! and its index comes back to [`FabricConn::release_rx`] when the `Message` is dropped;
//! [`RxSink::push_pooled_at`] lends a message at an offset inside a buffer, so one buffer can
//! carry several lent messages (TCP), each coming back with the buffer's index.
//!
//! # Direct paths
//!
//! A fabric whose two ends of the data path can be the two applications' threads (shm: each
//! direction's record ring in the shared segment has exactly one producer and one consumer)
//! gives the application a *direct path* instead of a [`FabricConn`]: one variant of
//! `DirectPath` (`direct.rs`, crate private; one line per such fabric). Its setup builds the
//! handle; its control half registers the connection without a poller
//! (`Registry::register_direct`) and keeps only what liveness and the close need (shm: the
//! rendezvous socket and a segment handle for the heartbeat words and the closed flag). The
//! `Connection` branches once per call between its poller path (the application↔poller rings)
//! and its direct path, whose calls dispatch statically and never block, lock, allocate or log.
//! A protocol violation found on a direct path fails the connection's shared state; the control
//! half reports it ([`Event::Error`](crate::Event)) and closes the connection on its next tick.
//! A fabric whose connections all take the direct path has no [`Fabric`] and no poller agent:
//! its control half's registry has no pollers (`NoPollers`) and is dispatched by the control
//! thread like every other.
//!
//! # The control seam
//!
//! The control thread's half of a fabric is a `FabricControl` (`control/`, crate private):
//! listen, install the connections its connecting side set up, close one, the descriptors to
//! watch and what to do when they are ready (including those of handshakes in progress), a tick
//! on every wake-up of the control thread (draining the pollers' notices, expiring handshakes
//! past their deadline, heartbeats on the liveness beat) that says when the fabric next needs
//! one, and shutdown; its `FabricConnect` runs `connect` on the application's thread. Every
//! fabric accepts through a table of pending handshakes, so one generic `Control<A>`
//! (`control/accepting.rs`) is the `FabricControl` of all of them; a fabric writes only its
//! `Accepting` part (`fabric/<name>/control.rs`): its types (pollers, listener, setup side,
//! pending handshake, what a connect or handshake establishes), bind, one accept, one
//! handshake step, install, and the hooks for its connections' descriptors, ticks and closes.
//! What a connecting thread establishes reaches the fabric's `Accepting::install` typed, through
//! a queue of that fabric's own. The shared pieces live beside it: a context with `emit()` for
//! events, the registry of listener and connection records with the least-loaded poller choice
//! (`control/registry.rs`), the handshake table (`control/handshakes.rs`), the liveness cadence
//! (`control/cadence.rs`), and one teardown model (a close removes the connection from its
//! poller and is finished when the poller retires it or the fabric's grace period ends; at once
//! for a direct path). The engine's control backend (`crate::control`) only dispatches: by
//! endpoint scheme for requests, to every fabric for the control loop. The control side may
//! use `dyn` (it is not the data path); the poller never does.
//!
//! # Adding a fabric (as `tcp` was)
//!
//! 1. One directory, `fabric/<name>/`: `datapath.rs` (or a `datapath/` directory, as rdma's)
//!    implements [`Fabric`] + [`FabricConn`] (`NAME` = the URL scheme), `setup.rs` (or a
//!    `setup/` directory) the rendezvous and resource creation, `control.rs` the fabric's
//!    control part (`Accepting`, run by the shared `Control`), `mod.rs` the module docs;
//!    declare it here (`mod <name>;`, behind its cargo feature if it has one). A direct-path
//!    fabric has no `datapath.rs`: it adds its handle as one variant of `DirectPath` instead.
//! 2. For a fabric with a poller side, one line in the poller's agent set (`agent_set!` in
//!    `crate::poller`): `<name>: <Name>Fabric = <Name>Fabric::new(),` (with its `#[cfg]` if
//!    feature-gated). That gives every poller thread a `Poller<<Name>Fabric>` and the control
//!    thread its rings (`links.<name>`).
//! 3. One line in the dispatcher (`Dispatcher::new` in `crate::control`) that adds
//!    `Control::<<Name>Control>` built with `links.<name>` (a direct-path fabric: `NoPollers`).
//! 4. The endpoint syntax of the new scheme in `crate::endpoint` (`Endpoint::parse`,
//!    `Endpoint::scheme`).
//!
//! Nothing else changes: the poller, the handles and the dispatcher are fabric-agnostic, and the
//! data path stays monomorphised (no `dyn`).
//!
//! [`FabricError`]: crate::FabricError
//! [`FabricError::Protocol`]: crate::FabricError::Protocol
//! [`TxDesc`]: crate::desc::TxDesc

pub(crate) mod control;
mod direct;
pub mod mem;
#[cfg(feature = "rdma")]
pub mod rdma;
mod seam;
pub mod shm;
mod sink;
pub mod tcp;

pub use crate::desc::PoolView;

pub use crate::wake::{PollerWake, WaitSet};
pub(crate) use direct::{DirectPath, Sent};
pub use seam::{ConnTable, Fabric, FabricConn};
pub(crate) use sink::SinkTotals;
pub use sink::{RxSink, TxDone};
