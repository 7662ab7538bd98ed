//! RDMA fabric (feature `rdma`): RC queue pairs over verbs, connected through rdma_cm.
//!
//! - [`verbs`]: the thin safe layer over libibverbs (the engine's only verbs FFI), one file per
//!   verbs object.
//! - `wr_id` (the `wr_id` encoding and connection generations), `header` (the credit word in the
//!   immediate data or, on iWARP, a header slot) and `counters` ([`RdmaStats`]): small pieces
//!   below the data path, shared with setup.
//! - `setup` (control thread / connecting thread; `setup/`: `devices` for the device table,
//!   `prepare` and `establish` for one connection's resources before and after ESTABLISHED,
//!   `large` for the rendezvous regions and their handshake fields,
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
//!   traffic, in explicit credit messages; large messages go by rendezvous (`rndv` and
//!   `conn/rndv`, [below](#large-messages-rendezvous)).
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
//! still sees the whole pool buffer (without large slots,
//! [`Connection::max_message_size`](crate::Connection::max_message_size) is the buffer size
//! on every transport) and the inline limit shrinks by the header. Shared receive
//! queues are not supported on iWARP (refused at connect). Both sides must use the same pool
//! buffer size. Each connection pre-posts `pool`'s buffer count of receives
//! and grants that many credits; [`EngineBuilder::rdma_srq`](crate::EngineBuilder::rdma_srq)
//! switches to one shared receive queue per poller and device instead, see
//! [below](#shared-receive-queues-overcommit). The control thread logs
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
//! # Shared receive queues (overcommit)
//!
//! With [`EngineBuilder::rdma_srq`](crate::EngineBuilder::rdma_srq)`(S)` each poller has, per
//! device, one SRQ and one registered pool of `S` receive buffers, all posted when the first
//! connection of that poller on that device is set up (`setup/devices`). A connection then
//! has no receive pool of its own: it is *granted* a share of the SRQ,
//! [`rdma_srq_credits`](crate::EngineBuilder::rdma_srq_credits) buffers (default
//! `min(buffers, 16)`), and announces that grant as its credits in the private data, so its
//! peer's send window is the grant, not the per-connection pool. The receive memory is `S`
//! buffers per poller and device whatever the number of connections
//! ([`RdmaStats::registered_rx_bytes`]); each connection still registers its own send pool.
//!
//! The invariant, kept by construction: **the grants of all connections on an SRQ never add
//! up to more than the buffers posted on it.** A poller's SRQ keeps a budget of unpromised
//! posted buffers (`S` at the start); setup takes a connection's grant out of it before the
//! connection exists and refuses the connection with
//! [`RdmaSetupError::SrqFull`] when it does not fit (no waiting: the caller sees the typed
//! error at once); the grant goes back when the connection's QP is destroyed, less the shared
//! buffers its application still held (those are not posted any more, so they are never
//! promised again). Per connection, its grant `g` covers the credits its peer holds, the SENDs
//! in flight towards us, the buffers received and not yet re-posted (queued, being split,
//! lent to the application) and the buffers re-posted whose credits are not returned yet; only
//! the third kind is missing from the SRQ, and it is the connection's own. So the buffers
//! posted are at least the budget plus, per connection, `g` minus what it holds, which is at
//! least every credit a peer can spend: a SEND always finds a posted receive (no RNR, and
//! `rnr_retry = 0` would make one an error, never a stall). A slow receiver holds at most its
//! own grant: its sender runs out of credits and sees `WouldBlock`, while every other
//! connection's grant is untouched.
//!
//! Refill: a consumed buffer goes back to the SRQ when the connection re-posts it (delivered
//! inline, a frame split, or released by the application), in chains, from the poller; the
//! credit goes back to the peer with it. No low-water check or
//! `IBV_EVENT_SRQ_LIMIT_REACHED` is needed: a buffer leaves the SRQ only against a credit
//! spent, and comes back with that credit. The grant is fixed for the connection's life (no
//! growth for busy connections out of the unpromised remainder: see the README).
//!
//! # Large messages (rendezvous)
//!
//! A message above the pool buffer size (up to
//! [`EngineBuilder::max_message_size`](crate::EngineBuilder::max_message_size)) lives in a
//! *large slot*. At setup each connection registers, beside its pools, a **large send region**
//! (`large_buffers` slots of `max_message_size` bytes, page aligned, `IBV_ACCESS_REMOTE_READ`
//! only), a **large receive region** (the same size, `IBV_ACCESS_LOCAL_WRITE` only; on iWARP
//! also `IBV_ACCESS_REMOTE_WRITE`, which an iWARP RDMA READ's sink needs) and a small scratch
//! region for the protocol's own frames (local access only). Nothing is registered or
//! allocated on the data path. The send region's base, slot size, slot count and rkey travel
//! in the connection's private data after the flow parameters (`setup/large`); each side
//! checks the peer's (at most 256 slots, a nonzero size and base, no wrap) and that both
//! sides have large slots of the same size, or neither (a typed setup error otherwise).
//! Connect and accept ask rdma_cm for as many outstanding READs (`initiator_depth`,
//! `responder_resources`) as the device and the peer allow, and the send queue has room for
//! the READs in flight, an RNDV SEND per send slot and the acknowledgements. The default
//! footprint: 2 slots of 16 MiB per direction, 64 MiB registered (pinned) per connection.
//!
//! ```text
//!  sender                                              receiver
//!  post_send(TxDesc { buf: LARGE_BIT | s, len })
//!    RNDV frame in scratch[s] ──SEND (frame bit)──►  frame checked: rkey, slot s,
//!    { slot s, len, addr, rkey }                      addr..addr+len in slot s, len <= its slot
//!    slot s stays the fabric's                        free receive slot r? no: stop here
//!                                                     (the frame waits, back-pressure)
//!                            ◄──RDMA READ (signalled)── READ slot s into slot r
//!                                                     READ complete, in order:
//!                                                     push_large(r, len) -> application
//!    reclaim: free_buf(LARGE_BIT | s) ◄──SEND (credit + frame bits)── RNDV_DONE { s }
//!                                                     ...
//!                                                     application drops the message:
//!                                                     release_rx(LARGE_BIT | r), r free again
//! ```
//!
//! 1. The sender's `post_send` of a large descriptor posts an *RNDV frame*: a frame of one
//!    RNDV record ([`record`](crate::record), type 7: slot, length, address, rkey), written
//!    into the slot's scratch (the slot itself holds the message) and sent signalled; it
//!    closes any frame of small messages before it, so frames and large messages stay in FIFO
//!    order. Like any message it spends one credit (a receive buffer) and one of the engine's
//!    message credits. The slot stays the fabric's.
//! 2. The receiver validates every RNDV record with its frame, before delivering any of it:
//!    the rkey is the one the peer announced, the slot exists, `addr .. addr + len` lies in
//!    that one slot, `len` fits its own receive slot. A violation is a
//!    [`FabricError::Protocol`] of that connection only; so is an RNDV naming a peer slot
//!    that was pulled and not yet acknowledged.
//! 3. It takes a free receive slot and pulls the message into it with signalled RDMA READs
//!    of at most 256 KiB each, at most 8 in flight per connection (and no more than the QP's
//!    READ depth): the peer's HCA serves our SENDs (acknowledgements, credits, heartbeats)
//!    only after the READs posted before them, so bounding the bytes in flight (2 MiB)
//!    bounds that delay, and the peer's liveness check never sees a long silence while its
//!    slots are pulled (16 MiB READs at the 20 MB/s of Soft-RoCE under emulation would be
//!    silent for longer than the default 1 s liveness timeout). Without a free slot (the
//!    application holds them all) it stops at that record; the rest of the frame (and its
//!    receive buffer, hence the sender's credit) waits, and the receive continues when the
//!    application drops a large message. Consecutive RNDV records are pulled in a pipeline
//!    (one message's chunks after the other's), but no other record behind an RNDV is
//!    delivered before its large message: FIFO order holds across small and large messages.
//! 4. Each READ is done on its own completion (`IBV_WC_RDMA_READ`), never inferred from a
//!    later send's: soft-iWARP reports a SEND posted after a READ before the READ's data is
//!    placed. Messages whose every chunk has landed are delivered oldest first: each is lent
//!    to the application ([`RxSink::push_large`](crate::fabric::RxSink::push_large)), and an
//!    acknowledgement is owed: the next `flush` sends a *control frame* of RNDV_DONE records
//!    (type 8, one per slot; the immediate's credit and frame bits both set), a signalled SEND
//!    that spends a credit like a credit message (and may use the reserved one). Only on that
//!    acknowledgement does the sender free the slot
//!    ([`TxDone::free_buf`](crate::fabric::TxDone::free_buf)); an acknowledgement for a slot
//!    not in flight is a protocol error. A failed READ completion fails the connection
//!    ([`FabricError::Io`] with the `ibv_wc_status`).
//!
//! A peer that dies mid-transfer: the READ (or the QP) fails, the survivor gets a typed
//! disconnect, and every slot goes with the connection's regions when it is removed (the
//! engine's own accounting of slots lent and in flight ends with the connection).
//! [`stats`] counts `rndv_sends`, `rndv_reads` and `rndv_acks`.
//!
//! [`FabricError::Protocol`]: crate::FabricError::Protocol
//! [`FabricError::Io`]: crate::FabricError::Io
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
