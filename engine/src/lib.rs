//! spinwire: a busy-polling, kernel-bypass data-plane engine for low-latency messaging.
//!
//! Dedicated poller threads, each pinned to a core, spin on their fabric's completions with no fd
//! wake-ups; lock-free single-producer/single-consumer rings ([`rings`]) carry descriptors between
//! pollers and application threads; messages are written and read in place in pre-allocated buffer
//! pools (zero copy); over shared memory the application threads themselves write and read the
//! segment's record rings (the *direct path*: no poller, no application↔poller hop); credit-based flow control means a receiver is never overrun, and
//! back-pressure reaches the sender as [`SendError::WouldBlock`] carrying the buffer back. One
//! engine serves several fabrics selected by endpoint URL: `shm://name` (shared memory between
//! processes on one host, always built), `tcp://host:port` (busy-polled kernel TCP across hosts
//! without RDMA, IPv6 as `tcp://[::1]:port`, always built), `rdma://host:port` (feature
//! `rdma`) and `mem://name` (in-process: both ends in one process, driven by the real pollers with
//! no system call; for tests and for measuring the poller path without a fabric's cost).
//!
//! # Quick start
//!
//! ```
//! use std::time::Duration;
//! use spinwire::{Engine, IdleStrategy};
//!
//! # fn main() -> Result<(), spinwire::Error> {
//! // Run-to-completion: no poller thread; this thread drives the poller inside send/recv.
//! // Backoff (spin -> yield -> park) keeps an idle thread from hogging its core.
//! let engine = Engine::builder()
//!     .run_to_completion()
//!     .idle(IdleStrategy::backoff())
//!     .pool(4096, 64) // 64 buffers of 4 KiB per connection and direction
//!     .build()?;
//! # let name = format!("shm://doc-quickstart-{}", std::process::id());
//! let listener = engine.listen(&name)?; // e.g. "shm://quotes"
//! let client = engine.connect(&name)?;
//! let server = listener.accept_timeout(Duration::from_secs(5))?;
//!
//! // Zero copy: take a buffer of the connection's pool, write in place, send the buffer.
//! let mut buf = client.alloc()?;
//! buf.copy_from(b"ping")?;
//! client.send(buf).map_err(spinwire::Error::from)?;
//!
//! // Read in place; dropping the message recycles its buffer.
//! let msg = server.recv_timeout(Duration::from_secs(5))?;
//! assert_eq!(&msg[..], b"ping");
//! # Ok(())
//! # }
//! ```
//!
//! Two processes: `engine/examples/pingpong.rs` (`cargo run --release -p spinwire --example
//! pingpong -- server shm://pp` and `... -- client shm://pp 100000 32`).
//!
//! # The control/data split
//!
//! * **Data plane — pollers.** A poller is an Aeron-style
//!   agent whose `do_work(now)` runs one cycle: (1) drain a bounded number of commands from the
//!   control thread, (2) poll fabric completions in bursts, (3) move received descriptors into each
//!   connection's receive ring, (4) drain each connection's send ring and post it in one batch,
//!   (5) recycle buffers and credits. That path takes no lock, makes no syscall, allocates nothing
//!   and logs nothing; it counts ([`Engine::counters`], [`Connection::stats`]).
//! * **Control plane — one control thread** (the `cm` crate's `cm::control`) owns setup and
//!   teardown: listeners, rendezvous (shm: a Unix-domain socket by name, memfd passing; RDMA:
//!   rdma_cm), segment creation, hang-up detection, heartbeats. Established connections reach a
//!   poller through its command ring; retired ones come back through a notice ring and are released
//!   on the control thread. Events ([`Event::Connected`], [`Event::Disconnected`],
//!   [`Event::Error`]) reach the application through an event ring ([`Engine::try_event`]).
//!   `connect` runs its rendezvous on the calling thread (bounded by its timeout) and then hands the
//!   connection to the control thread. Accepting runs on the control thread but never waits on
//!   a peer: each accepted connection whose handshake is under way (shm: hello, offer, ready;
//!   RDMA: waiting for ESTABLISHED) is an entry with a deadline, its socket or event channel in
//!   the control thread's poll set; a step runs when the peer's message arrives, and an entry
//!   whose peer is too slow (shm: 250 ms per step; RDMA: 2 s) is dropped, closing its socket.
//!   So a slow or hostile peer costs one table entry, not time: it delays neither other
//!   connects and accepts nor hang-up detection and teardown. The control thread has no fixed
//!   period: it sleeps in `poll(2)` until the next deadline (a handshake step, a close's grace,
//!   the liveness beat, a twelfth of [`EngineBuilder::liveness_timeout`]) or until a request, a
//!   descriptor or a poller's notice wakes it, so on a machine whose cores are all owned by
//!   busy-polling threads it preempts them only at that beat
//!   ([`EngineStats::control_wakeups`] counts its turns).
//! * **Direct path (shm).** An `shm://` connection has no poller: its [`Connection`] writes
//!   records straight into this side's record ring in the shared segment and reads the peer's
//!   ring in place, in run-to-completion and dedicated-poller mode alike (the two ends of each
//!   ring are the two applications' threads, Aeron IPC's shape). The control thread keeps the
//!   rendezvous socket and a segment handle for hang-up detection, heartbeats and the close.
//!   See the `fabric` and `fabric::shm` module docs (`engine/src/fabric/`).
//! * **Fabrics** plug in below the poller through the `fabric::Fabric` / `fabric::FabricConn`
//!   traits: the poller is generic and monomorphised (no `dyn` on the data path), and each fabric
//!   keeps setup code (`fabric/<name>/setup.rs`, or a `setup/` directory, as rdma's) apart
//!   from hot-path code (`fabric/<name>/datapath.rs`, or a `datapath/` directory, as rdma's)
//!   and from its half of the control thread (`fabric/<name>/control.rs`, behind the same
//!   control seam for every fabric). The `fabric` module docs (`engine/src/fabric/mod.rs`) describe the seams and how to add a fabric.
//!
//! # Threading
//!
//! * [`Engine`] is `Send + Sync` and cheap to clone.
//! * [`Connection`] and [`Listener`] are `Send` but not `Sync`: move each to the thread that uses
//!   it. [`SendBuf`] and [`Message`] borrow their connection (`SendBuf<'c>`, `Message<'c>`), so they
//!   stay on that thread and cannot outlive it; that is what lets a message be read in place and a
//!   buffer be written in place without reference counting on the data path.
//! * **Dedicated pollers** ([`EngineBuilder::pollers`]): one thread per listed core, pinned with
//!   `core_affinity`; connections are assigned to the least-loaded poller. Each spins per its
//!   [`IdleStrategy`] ([`IdleStrategy::BusySpin`] by default).
//! * **Run-to-completion** ([`EngineBuilder::run_to_completion`], the default when no pollers are
//!   given): no poller thread; the *same* poller code runs on whichever application thread calls
//!   [`Engine::poll`] — explicitly, or implicitly inside `alloc` (when no buffer is free), `send`
//!   (every `batch` sends or when out of credits), [`Connection::flush`], `try_recv` and
//!   `recv_timeout`. An uncontended, non-blocking ownership flag keeps it single-threaded; a thread
//!   that finds it taken does not wait. Sends queued by `send` are posted at the latest by the next
//!   `flush`/`try_recv`/`recv_timeout`/`poll`. A direct-path (shm) connection's calls never run
//!   the poller: a `send` is visible to the peer when it returns, and `flush` does nothing; other
//!   fabrics' connections on the same engine are served by the application's [`Engine::poll`].
//! * **Run-to-completion without the rings** (`mem://`, `tcp://` and `rdma://`; a fabric opts in through
//!   `FabricConn::RTC_DIRECT`): when the calling thread gets the poller (the same ownership
//!   flag, one compare-and-swap), `send` posts the message straight to the fabric (for `mem://`
//!   the record is in the peer's ring when it returns, for `tcp://` it is written to the socket;
//!   a tcp `send` with nothing received since the last one is a stream and goes through the
//!   send ring, a batch per write; for `rdma://` a ping-pong's send is posted to the QP, and
//!   the sends of a stream skip the direct way until a message is delivered, going through
//!   the send ring into frames), `send_batched` runs are posted at `flush` or the `batch`-th
//!   without a whole poller cycle, and `try_recv`/`poll` take straight from the fabric
//!   (`rdma://`: when nothing is pending, the take polls the poller's shared CQ first and files
//!   other connections' completions for the next cycle; a take that starts a frame moves the
//!   rest of it into the receive ring, so that its credit goes back at once); no
//!   application↔poller ring and no pass for the other connections in between. When another
//!   thread has the poller, or the rings hold anything in
//!   that direction, the call goes through the rings as before, so the order is kept. The full
//!   cycle still runs when a call finds nothing (or no credit, no buffer), so other connections,
//!   commands, credits and liveness are served as before. Not with [`IdleStrategy::Block`]
//!   (its wake-ups live in the pass).
//!
//! # Which configuration for which machine
//!
//! Every spinning thread wants a core of its own; oversubscribed spinning threads take turns at
//! scheduler-tick granularity (milliseconds), which destroys latency.
//!
//! | cores per process | configuration |
//! |---|---|
//! | 1 (e.g. two processes on a 2-core host) | run-to-completion, one application thread; `BusySpin` for latency, `backoff()` when the core is shared |
//! | 2 | one dedicated poller + one application thread, or run-to-completion with two application threads each serving its own connections |
//! | N | N-1 pollers (connections spread over them) + application threads on the remaining cores, or run-to-completion per application thread |
//!
//! Two processes that each run a dedicated poller plus a spinning application thread need four
//! cores; on a 2-core machine use run-to-completion in both (that is also the lowest-latency
//! configuration: no hop between application thread and poller), or [`IdleStrategy::backoff`]
//! everywhere.
//!
//! # Flow control and buffers
//!
//! * Each connection has a send pool of `buffers` buffers of `buffer_size` bytes (shm: inside the
//!   shared segment; RDMA: one registered memory region). [`Connection::alloc`] takes one,
//!   [`Connection::send`] hands it to the poller (shm: writes it to the ring itself), and the
//!   fabric frees it when the message was copied (small messages, up to the inline threshold,
//!   travel inside the descriptor; shm: as a `DATA` record in the ring, the buffer back to the
//!   application at once) or when the receiver released it (shm: a `BUF_REF` record, the buffer
//!   taken back by `alloc` from the release ring when its free list is empty). Buffers move only
//!   through SPSC rings. [`Connection::claim`] writes a message in place without a pool buffer
//!   (shm, up to the inline threshold: its ring record reserved, its bytes staged on a line of
//!   the connection's own and copied into the record with the header by `send`; dropping it
//!   aborts).
//! * At most `depth` messages per connection are in flight (sent, not yet taken by the receiving
//!   poller; shm: not yet consumed from the ring by the receiving application); beyond that
//!   `send` returns [`SendError::WouldBlock`] with the buffer, and [`Connection::send_timeout`]
//!   waits (bounded). A receiving poller only takes messages its application's receive ring has
//!   room for, so credits come back only as the receiver makes room: the sender never has more
//!   in flight than the receiver can hold. shm's ring holds at least `depth` records of the
//!   inline size, so a full ring (also `WouldBlock`) only binds for a peer that does not consume.
//!   shm's sender amortises the synchronisation per run: [`Connection::send_batched`] writes a
//!   run of messages that [`Connection::flush`] (or the `batch`-th of them) publishes with one
//!   store; the receiver gives back the slot of each message `try_recv` takes before the call
//!   returns (one store to its own line), and `poll` once per batch.
//! * Messages are at most [`Connection::max_message_size`] bytes
//!   ([`EngineBuilder::max_message_size`], default 16 MiB; without large slots the buffer
//!   size); larger ones get [`Error::MessageTooLarge`] stating the limit. A message above the
//!   buffer size travels through a large slot ([`Connection::alloc_large`],
//!   [`Connection::send_copy`]; the protocols by size are described there).
//!   `alloc` says [`Error::WouldBlock`] while buffers are in flight and
//!   [`Error::PoolExhausted`] when the application itself holds them all; `alloc_large` the
//!   same for large slots.
//! * A received pooled buffer returns to its sender when the [`Message`] is dropped, in drop
//!   order; holding a message holds its buffer (and so one of the sender's buffers). Every held
//!   message also holds a slot of the connection's own, where its record lies (a small
//!   message, one that travelled inline, is copied once, into its slot): a connection has one
//!   for each receive buffer and large slot, and as many again, at least 256, for small
//!   messages; past that `try_recv` returns [`Error::TooManyHeld`] while a message waits
//!   (nothing is lost). A [`Message`] is one word, a pointer to its record: returned,
//!   matched, `?`-ed and moved as one 8-byte value.
//! * Pools, shm segments and RDMA regions are placed by the engine's [`HugePages`] and
//!   [`NumaPolicy`] ([`EngineBuilder::hugepages`], [`EngineBuilder::numa`]): by default every
//!   region of 2 MiB or more is on 2 MiB hugepages while the kernel's reserved pool has them,
//!   and on 4 KiB pages otherwise (one log line per engine); what they got is
//!   [`EngineStats::placement`]. All of it happens at setup.
//!
//! # Failure handling
//!
//! Everything read from a peer is validated (shm: by its wire layer, again by the engine
//! for buffer indices and lengths); a violation fails that connection only, with
//! [`Error::Fabric`] from its methods and an [`Event::Error`]. A peer that closes or dies (its
//! rendezvous socket hangs up; its segment's closed flag) is reported as [`Error::Disconnected`]
//! and [`Event::Disconnected`] within milliseconds (the control thread wakes on the socket
//! hang-up; the tests require under a second); messages it sent before are still delivered
//! first. Every blocking call has a timeout.
//!
//! **Liveness.** A peer that is alive but silent (stopped with SIGSTOP or by a debugger, hung, or
//! on a host that vanished without a FIN) is found by heartbeats:
//! [`EngineBuilder::liveness_timeout`] (default [`DEFAULT_LIVENESS_TIMEOUT`], 1 s; zero turns it
//! off). Each side proves it is alive every quarter of the timeout: over shm its control thread
//! bumps its heartbeat word in the segment, and reads the peer's every twelfth of the timeout
//! (the control thread's liveness beat, its only periodic wake-up); over
//! RDMA a connection that sent nothing else for that long sends a heartbeat (an explicit credit
//! message, so it spends a credit and never causes an RNR) and the poller counts receive
//! completions. A peer silent for the timeout fails its connection with
//! [`FabricError::PeerUnresponsive`] (`silent_for`) and is reported once as
//! [`Event::PeerUnresponsive`], within the timeout plus a beat; the connection is then closed
//! (shm: the segment's closed flag, the bye and the socket; RDMA: the disconnect), so the peer,
//! should it resume, finds its connection down, never silently resumed: with
//! [`FabricError::PeerAborted`]`(`[`AbortReason::Unresponsive`]`)` from its calls and an
//! [`Event::Error`] saying so (shm: the reason is in the segment's close mark; tcp: a `CLOSE`
//! record ends the stream; RDMA: [`Error::Disconnected`]). A side that fails a connection for a
//! protocol violation tells its peer the same way ([`AbortReason::Protocol`]).
//! Other connections are not affected. A side whose own control thread (shm) or poller (RDMA)
//! did not run for more than half the timeout restarts its observations instead of blaming its
//! peers. Nothing is added to the data path per message (RDMA: one plain counter increment per
//! receive completion; the checks run by the coarse clock, which the control thread advances
//! on each beat).
//!
//! * With RDMA in run-to-completion mode, heartbeats go out only while the application calls
//!   into the engine (`poll`, `send`, `try_recv`, `recv_timeout`, ...): call at least every
//!   quarter of the timeout, use a dedicated poller, or turn liveness off.
//! * A message a dying peer had claimed but not committed: each connection has its own
//!   single-producer rings (shm) or queue pair (RDMA), so nothing else waits on it (no
//!   Aeron-style unblock is needed); it was never published, so it is never delivered, and the
//!   connection fails.
//!
//! **Reconnect (opt in).** A [`Connection`] that failed stays failed. [`Reconnecting`] is a
//! helper on top that owns the engine handle, the endpoint and the current connection, forwards
//! `alloc`/`send`/`try_recv`/`recv_timeout`/`poll`, and in [`Reconnecting::maintain`] connects
//! again per a [`ReconnectPolicy`] (ZeroMQ-like default: 100 ms, ±10 % jitter, backoff ×2 capped
//! at 5 s, unlimited attempts). It reports through [`ReconnectEvent`]s and `tracing`: `Lost`
//! carries `unconfirmed`, the messages sent on the lost connection whose credit had not come
//! back (an upper bound of the loss; nothing is retransmitted or dropped silently), then
//! `Reconnected` or `GaveUp`. Messages received before the loss are delivered first. See
//! [`reconnect`] for the exact semantics.
//!
//! # Resource cleanup
//!
//! Dropping a [`Connection`] posts its queued sends (best effort), closes it (the peer sees a
//! disconnect) and lets the control thread release its segment once the poller has let go (shm:
//! at once; the connection's own mapping goes with the handle).
//! Dropping a [`Listener`] stops listening (its socket file is removed). The engine shuts down when
//! the last [`Engine`], [`Connection`] and [`Listener`] handle is gone: pollers are stopped and
//! joined first, then the control thread closes every socket and segment. shm segments are memfds
//! (nothing left in `/dev/shm`), created mode 0600.
//!
//! # Borrowing rules
//!
//! * `SendBuf` and `Message` carry the connection's lifetime (`SendBuf<'c>`, `Message<'c>`), and
//!   so does `SendError<'c>`; that keeps buffers on the connection's thread with zero
//!   reference-counting cost.
//! * `depth` defaults to `min(128, buffers)`.
//!
//! # Performance
//!
//! `cargo bench -p spinwire --bench shm` measures, in one run, the bare cache-line ping-pong
//! between the two cores (the floor), shm ping-pong RTT percentiles per message size and one-way
//! message rates, in run-to-completion mode and with a dedicated poller.

//! The engine's software cost alone (both ends of a connection on one thread, no cross-core
//! traffic) is `bench cost` (`cargo run --release -p bench -- cost --sizes 8,64 --batch 32`):
//! ns per message streamed and received with [`Connection::try_recv`] in a loop or with the
//! batch receive [`Connection::poll`], and ns per round trip, with a `summary.json` like the
//! other `bench` commands.
//!
//! ## The data path
//!
//! Synchronisation is amortised per batch (as in Aeron, the LMAX Disruptor and UCX's shm FIFO),
//! and several small messages share a cache line:
//!
//! * The record format (`engine/src/record/`) is fabric-neutral: an 8-byte header whose length word is
//!   the commit flag, payloads padded to 8 bytes, the record types DATA, BUF_REF, PAD, CREDIT,
//!   HEARTBEAT, RNDV and RNDV_DONE (FRAG is reserved), and frames of records. One codec parses
//!   rings, receive buffers and byte streams, and rejects hostile input with a typed
//!   `RecordError`.
//! * shm: one record ring per direction in the segment (SPSC, batches published with one
//!   `Release` store, PAD at the wrap), written and read by the applications' threads (the
//!   direct path); inline messages are DATA records, larger ones BUF_REF records naming a pool
//!   buffer or a large slot; [`Connection::claim`] reserves the record itself (its bytes staged,
//!   then copied in with the header by the commit).
//! * tcp: the same records on the byte stream, coalesced into one `sendmsg` per poller cycle.
//! * RDMA: the small messages of a send batch coalesced into one SEND of DATA records
//!   ([`EngineBuilder::frame_size`]); large messages pulled by rendezvous (RNDV / RNDV_DONE
//!   records, RDMA READ in chunks).
//! * [`Connection::poll`] and [`Connection::send_batched`] are the batch calls: one
//!   consumer-position store per receive run, one publication per send run.
//!
//! # Counters
//!
//! [`Engine::counters`] snapshots every poller (cycles, busy and empty cycles, messages, batches,
//! stalls, errors) and [`Connection::stats`] one connection (both the poller's and the
//! application's view). Counters are single-writer atomics: no read-modify-write on the data path.
//! A direct-path (shm) connection has no poller: its traffic shows in [`Connection::stats`]
//! (counters its owning thread writes), not in the pollers' counters.
//!
//! Outside the process: every engine publishes these counters into a memory-mapped counters
//! file that `spinwire-stat` reads while it runs ([`counters`]: the file's layout and reader;
//! [`EngineBuilder::name`] names it, [`EngineBuilder::counters_file`] turns it off). The control
//! thread copies them in at most ten times a second (a direct path hands its counts over every
//! 256 messages and when a receive finds its ring empty).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod clock;
mod config;
mod conn;
mod control;
pub mod counters;
mod desc;
// The doorbell of `IdleStrategy::Block` (futex word protocol): internal, public (hidden) for
// its loom model.
#[doc(hidden)]
pub mod doorbell;
mod endpoint;
mod engine;
mod error;
mod event;
// Not wired into every path yet: the allow goes once every path uses it.
// The fabric seam, the fabrics' wire formats and verbs wrappers: internals, public (and hidden
// from the docs) only for the project's own tests and benchmarks. The types an application
// meets through the API (setup errors in an `Error`'s chain) are re-exported below; the RDMA
// ones (feature `rdma`) stay at `fabric::rdma` (`RdmaSetupError`, `RdmaStats`, `stats`), so that
// the feature's `cfg` lines stay in the fabric's own directory.
#[doc(hidden)]
pub mod fabric;
#[allow(dead_code)]
mod flow;
mod idle;
mod link;
mod placement;
mod poller;
pub mod reconnect;
// The record codec and shm record ring: internals, public (hidden) for the project's tests and
// benchmarks.
#[doc(hidden)]
pub mod record;
mod stats;
// The pollers' wake-up of `IdleStrategy::Block`: internal, public (hidden) for its loom model.
#[doc(hidden)]
pub mod wake;

pub use config::{
    EngineBuilder, DEFAULT_BATCH, DEFAULT_BUFFERS, DEFAULT_BUFFER_SIZE, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LARGE_BUFFERS, DEFAULT_LIVENESS_TIMEOUT, DEFAULT_MAX_CONNECTIONS_PER_LISTENER,
    DEFAULT_MAX_CONNECTIONS_PER_POLLER, DEFAULT_MAX_MESSAGE_SIZE, MAX_BATCH, MAX_BUFFERS,
    MAX_BUFFER_SIZE, MAX_LARGE_BUFFERS, MAX_MESSAGE_SIZE, MIN_LIVENESS_TIMEOUT, RDMA_GID_INDEX_ENV,
};
pub use conn::{Connection, Listener, Message, RecvIntoError, SendBuf, SendError};
pub use desc::INLINE_MAX;
// Descriptors and pool views: the fabric seam's types, hidden like `fabric`.
#[doc(hidden)]
pub use desc::{PoolView, RxDesc, TxDesc, LARGE_BIT, TX_INLINE_MAX};
pub use endpoint::MAX_SHM_NAME;
pub use engine::Engine;
pub use error::{AbortReason, BoxError, ConfigError, Error, FabricError, SetupError};
pub use event::Event;
pub use fabric::mem::MemSetupError;
pub use fabric::shm::{Mismatch, ShmSetupError};
pub use fabric::tcp::TcpSetupError;
pub use idle::IdleStrategy;
pub use placement::{HugePages, NumaPolicy, PlacementError, PlacementStats, HUGE_PAGE_SIZE};
pub use reconnect::{ReconnectEvent, ReconnectPolicy, ReconnectStats, Reconnecting};
pub use stats::{ConnStats, EngineStats, PollerStats};
