//! The control-thread seam: [`FabricControl`], the half of a fabric that runs on the control
//! thread, and the pieces every fabric's control half shares.
//!
//! The engine's control backend (`crate::control`) is a dispatcher: it routes each request to
//! the fabric named by the endpoint's scheme and fans the control loop's calls (`fds`,
//! `on_ready`, `tick`, shutdown) out to every compiled-in fabric. Every fabric here accepts
//! through a [`Handshakes`] table, so one implementation serves them all: [`Control<A>`]
//! (`accepting`), generic over the fabric's own part, an [`Accepting`] in
//! `fabric/<name>/control.rs` (its types, bind, accept, one handshake step, install, and what
//! its connections' descriptors and ticks do). `Control` keeps, per fabric:
//!
//! * a [`Registry`] (`registry`): the fabric's [`Pollers`] (the control thread's ends of its
//!   poller rings, [`PollerLink`](crate::poller::PollerLink)s, with the least-loaded poller
//!   choice [`Registry::least_loaded`]; or [`NoPollers`] for a direct-path fabric, whose
//!   connections [`Registry::register_direct`] records without a poller), listener records
//!   (`ListenerRec`, with the bounded accept burst [`ACCEPT_BURST`]) and connection records
//!   ([`ConnRec`]) with **one teardown model**: closing a connection marks it closing, counts
//!   it closed and, while a poller serves it, tells the poller to remove it; its setup side
//!   ([`SetupSide::finish`]: shm's bye, RDMA's disconnect) is released when the poller's
//!   `Retired` notice comes back, or when the fabric's grace period for that close has run out
//!   (zero: at once; `None`: only on the notice). A `Retired` notice the control thread did not
//!   ask for (a failure or disconnect) is reported once as an [`Event`];
//! * the pending handshakes (`handshakes`, below);
//! * the queue of connections its connecting side set up: [`FabricControl::connector`] hands
//!   out a `Connector<A>` (a [`FabricConnect`]) that runs [`Accepting::connect`] on the
//!   application's thread and queues the fabric's own [`Accepting::Est`] for
//!   [`FabricControl::install`], typed end to end; the dispatcher's `Register` request only
//!   names the fabric.
//!
//! Every call gets a [`Ctx`] with [`Ctx::emit`], which counts an event dropped when the
//! application does not drain the event ring.
//!
//! Nothing here waits on a peer. An accept whose handshake is under way (shm: the hello and the
//! ready, `ACCEPT_STEP_TIMEOUT`, 250 ms, per step; TCP: the hello, `ACCEPT_TIMEOUT`, 1 s; RDMA:
//! ESTABLISHED, up to 2 s; a `mem://` end needs none, its first step installs it) is a
//! [`PendingSetup`] entry in its fabric's [`Handshakes`] table,
//! with a deadline: its descriptors are appended after the registry's in
//! [`FabricControl::fds`] ([`Handshakes::watch`]), [`FabricControl::on_ready`] runs an entry's
//! next step ([`Accepting::step`]) when the peer's message arrives (still pending, or installed
//! and handed to the listener, or reported as an [`Event::Error`]), and
//! [`FabricControl::tick`] drops it when the deadline passes ([`Handshakes::expire`]). So a
//! stalled peer costs one entry, never control-thread time.
//!
//! The control thread has no fixed period (`cm::control`): each [`FabricControl::tick`] says
//! when it next needs one ([`Due`]: its earliest handshake deadline, close grace or command
//! retry, and whether it needs the engine's liveness [`Cadence`], `cadence`), and the thread
//! sleeps until the earliest of them. With established connections and nothing in flight it
//! wakes only at the cadence's [`Beat`]s (a twelfth of the liveness timeout: heartbeats,
//! liveness checks and the coarse clock's advance), and a poller's notice wakes it at once (the
//! poller's `Waker::wake` when it pushes the notice), so teardown and events do not wait for a
//! beat.

mod accepting;
mod cadence;
mod handshakes;
mod registry;

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rings::Producer;

use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::{AbortReason, Chain, Error};
use crate::event::Event;
use crate::link::ConnParts;
use crate::stats::EngineCounters;

pub(crate) use accepting::{Accept, Accepting, Control, Reg};
pub(crate) use cadence::{earliest, stalled, Beat, Cadence, Liveness};
pub(crate) use handshakes::{Handshakes, PendingSetup, Step};
pub(crate) use registry::{ConnRec, NewConn, NoPollers, Pollers, Registry, Watched};

/// Most connections accepted per listener per control-loop turn.
pub(crate) const ACCEPT_BURST: usize = 16;

/// How soon the control thread retries commands that did not fit a poller's ring.
pub(crate) const COMMAND_RETRY: Duration = Duration::from_millis(1);

/// The half of a fabric that runs on the control thread. Called only by the dispatcher
/// (`crate::control`), on the control thread; must not wait on a peer (setup work such as
/// creating a segment or registering memory is fine; a handshake step that needs the peer's
/// answer waits in the poll set, see the module docs).
pub(crate) trait FabricControl: Send {
    /// The endpoint scheme this fabric serves (`"shm"`, `"tcp"`, `"rdma"`; for a fabric with a
    /// poller side its [`Fabric::NAME`](crate::fabric::Fabric::NAME)).
    fn scheme(&self) -> &'static str;

    /// The connecting side, for application threads (connect runs on the calling thread).
    fn connector(&self) -> Arc<dyn FabricConnect>;

    /// Binds a listener on `endpoint` (of this fabric's scheme).
    ///
    /// # Errors
    ///
    /// [`Error::Listen`] and the fabric's setup errors.
    fn listen(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<(u64, mpsc::Receiver<ConnParts>), Error>;

    /// Drops listener `id`; false if it is not one of this fabric's.
    fn unlisten(&mut self, id: u64) -> bool;

    /// Registers the connections its connecting side ([`FabricConnect::connect`]) set up and
    /// queued since the last call, answering each on its reply channel (a connection whose
    /// connecting thread no longer waits is closed again).
    fn install(&mut self, ctx: &mut Ctx<'_>);

    /// Closes connection `id` (the application dropped it); false if it is not this fabric's.
    fn drop_conn(&mut self, ctx: &mut Ctx<'_>, id: u64) -> bool;

    /// Appends the descriptors to watch (listeners, connections).
    fn fds(&mut self, fds: &mut Vec<libc::pollfd>);

    /// Handles readiness of exactly the descriptors this fabric appended in [`fds`](Self::fds).
    fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]);

    /// Timed work, run on every wake-up of the control thread: drains the pollers' notices (see
    /// [`Registry::drain`]), finishes closes whose grace ran out, expires handshakes and,
    /// when `beat` is set (the engine's liveness [`Cadence`]), heartbeats and liveness checks.
    /// Returns when this fabric next needs a tick ([`Due`]); nothing else wakes the thread
    /// except descriptors, requests and pollers' notices.
    fn tick(&mut self, ctx: &mut Ctx<'_>, now: Instant, beat: Option<Beat>) -> Due;

    /// Closes everything (engine shutdown; the pollers are stopped and have retired every
    /// connection).
    fn shutdown(&mut self, ctx: &mut Ctx<'_>);
}

/// The connecting side of a fabric: runs on application threads, bounded by the timeout.
pub(crate) trait FabricConnect: Send + Sync {
    /// The endpoint scheme this fabric serves.
    fn scheme(&self) -> &'static str;

    /// Performs the rendezvous and creates the connection's resources, then queues the
    /// connection for the control thread's [`FabricControl::install`] (the caller then sends
    /// the `Register` request that runs it), which answers on `reply`. With `wait`, a connect
    /// that finds nobody listening is retried until `timeout` is spent.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`], [`Error::NoListener`], [`Error::Setup`], [`Error::Timeout`];
    /// [`Error::Shutdown`] when the control half is gone.
    fn connect(
        &self,
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        timeout: Duration,
        wait: bool,
        reply: mpsc::SyncSender<Result<ConnParts, Error>>,
    ) -> Result<(), Error>;
}

/// What a fabric's control half needs from the dispatcher for one call.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) next_id: &'a mut u64,
    pub(crate) events: &'a mut Producer<Event>,
    pub(crate) counters: &'a EngineCounters,
}

impl Ctx<'_> {
    /// Emits an event, or counts it dropped when the application's event ring is full.
    /// Every event is also logged here (`tracing`, control thread only).
    pub(crate) fn emit(&mut self, e: Event) {
        match &e {
            Event::Connected { conn, peer, path } => {
                tracing::info!(conn, peer = %peer, path = path.as_deref(), "connection established");
            }
            Event::Disconnected { conn } => tracing::info!(conn, "connection disconnected"),
            Event::PeerUnresponsive { conn, silent_for } => {
                tracing::warn!(conn, ?silent_for, "peer unresponsive: liveness timeout");
            }
            Event::Error { conn, error } => {
                tracing::warn!(conn = *conn, error = %Chain(error), "connection error");
            }
        }
        if self.events.push(e).is_err() {
            self.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A fresh engine-wide id (connections and listeners of every fabric share the space).
    pub(crate) fn next_id(&mut self) -> u64 {
        let id = *self.next_id;
        *self.next_id += 1;
        id
    }
}

/// The setup-side resources of one connection, released when its poller has let go.
pub(crate) trait SetupSide: Send {
    /// The connection failed because of its peer (`reason`): tell the peer why, if this side
    /// can, when [`finish`](Self::finish) (called right after) closes it (shm: the reason goes
    /// in the segment's close mark). The default: nothing (the peer sees a plain close; a
    /// poller fabric tells it from the data path, `FabricConn::abort`).
    fn abort(&mut self, reason: AbortReason) {
        let _ = reason;
    }

    /// Releases them (shm: the segment's closed mark and the bye; RDMA: the disconnect).
    fn finish(&mut self);
}

/// When a fabric's control half next needs the control thread ([`FabricControl::tick`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Due {
    /// The earliest deadline of its own (a handshake step, a close's grace, a command retry).
    pub(crate) at: Option<Instant>,
    /// It needs the engine's liveness [`Cadence`] (it has connections to heartbeat or check, or
    /// whose pollers read the coarse clock for their own liveness checks).
    pub(crate) beat: bool,
}
