//! The control-thread seam: [`FabricControl`], the half of a fabric that runs on the control
//! thread, and the pieces every fabric's control half shares.
//!
//! The engine's control backend (`crate::control`) is a dispatcher: it routes each request to
//! the fabric named by the endpoint's scheme and fans the control loop's calls (`fds`,
//! `on_ready`, `tick`, shutdown) out to every compiled-in fabric. Each fabric implements
//! [`FabricControl`] in `fabric/<name>/control.rs` on top of a [`Registry`], which holds what is
//! common to all of them:
//!
//! * the control thread's ends of the fabric's poller rings ([`PollerLink`]) and the
//!   least-loaded poller choice ([`Registry::least_loaded`]);
//! * listener records ([`ListenerRec`]) and the bounded accept burst ([`ACCEPT_BURST`]);
//! * connection records ([`ConnRec`]) with **one teardown model**: closing a connection marks it
//!   closing, counts it closed and sends its poller a command (`Remove`, or shm's `PeerGone`);
//!   its setup side ([`SetupSide::finish`]: shm's bye, RDMA's disconnect) is released when the
//!   poller's `Retired` notice comes back, or when the fabric's grace period for that close has
//!   run out (zero: at once; `None`: only on the notice);
//! * the handling of `Retired` notices (a failure or disconnect the control thread did not ask
//!   for is reported once as an [`Event`]) and the [`Ctx`] with [`Ctx::emit`], which counts an
//!   event dropped when the application does not drain the event ring.
//!
//! Nothing here waits on a peer. An accept whose handshake is under way (shm: the hello and the
//! ready, `ACCEPT_STEP_TIMEOUT`, 250 ms, per step; TCP: the hello, `ACCEPT_TIMEOUT`, 1 s; RDMA:
//! ESTABLISHED, up to 2 s) is a [`PendingSetup`] entry in its fabric's [`Handshakes`] table,
//! with a deadline, and every fabric drives that table the same way (the fabric is
//! [`Accepting`]): its descriptors are appended after the registry's in
//! [`FabricControl::fds`] ([`Handshakes::watch`]), [`FabricControl::on_ready`] runs an entry's
//! next step when the peer's message arrives ([`on_ready`], [`advance`]: still pending, or
//! installed and handed to the listener, or reported as an [`Event::Error`]), and
//! [`FabricControl::tick`] drops it when the deadline passes ([`Handshakes::expire`]). So a
//! stalled peer costs one entry, never control-thread time.
//!
//! The control thread has no fixed period (`cm::control`): each [`FabricControl::tick`] says
//! when it next needs one ([`Due`]: its earliest handshake deadline, close grace or command
//! retry, and whether it needs the engine's liveness [`Cadence`]), and the thread sleeps until
//! the earliest of them. With established connections and nothing in flight it wakes only at
//! the cadence's [`Beat`]s (a twelfth of the liveness timeout: heartbeats, liveness checks and
//! the coarse clock's advance), and a poller's notice wakes it at once (the poller's
//! `Waker::wake` when it pushes the notice), so teardown and events do not wait for a beat.

use std::any::Any;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rings::Producer;

use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::{Chain, Error, FabricError, SetupError};
use crate::event::Event;
use crate::fabric::Fabric;
use crate::link::{conn_pair, direct_parts, ConnParts, ConnShared, Pools};
use crate::poller::{Command, Notice, PollerLink};
use crate::stats::EngineCounters;

/// Most connections accepted per listener per control-loop turn.
pub(crate) const ACCEPT_BURST: usize = 16;

/// What a connecting thread's setup produced (a fabric's own `Established` type, boxed), on its
/// way to that fabric's [`FabricControl::install`].
pub(crate) type Established = Box<dyn Any + Send>;

/// The half of a fabric that runs on the control thread. Called only by the dispatcher
/// (`crate::control`), on the control thread; must not wait on a peer (setup work such as
/// creating a segment or registering memory is fine; a handshake step that needs the peer's
/// answer waits in the poll set, see the module docs).
pub(crate) trait FabricControl: Send {
    /// The endpoint scheme this fabric serves (`"shm"`, `"rdma"`): its [`Fabric::NAME`].
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

    /// Registers a connection set up by a connecting thread ([`FabricConnect::connect`]) with a
    /// poller.
    ///
    /// # Errors
    ///
    /// [`Error::Setup`] when no poller can take it (or `est` is not this fabric's).
    fn install(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: Established,
        raw: String,
    ) -> Result<ConnParts, Error>;

    /// Closes connection `id` (the application dropped it); false if it is not this fabric's.
    fn drop_conn(&mut self, ctx: &mut Ctx<'_>, id: u64) -> bool;

    /// Appends the descriptors to watch (listeners, connections).
    fn fds(&mut self, fds: &mut Vec<libc::pollfd>);

    /// Handles readiness of exactly the descriptors this fabric appended in [`fds`](Self::fds).
    fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]);

    /// Timed work, run on every wake-up of the control thread: drains the pollers' notices (see
    /// [`Registry::on_notice`]), finishes closes whose grace ran out, expires handshakes and,
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

    /// Performs the rendezvous and creates the connection's resources; the result goes to the
    /// control thread's [`FabricControl::install`].
    ///
    /// # Errors
    ///
    /// [`Error::Connect`], [`Error::Setup`], [`Error::Timeout`].
    fn connect(
        &self,
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        timeout: Duration,
    ) -> Result<Established, Error>;
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

/// One turn of the engine's liveness [`Cadence`], given to every fabric's
/// [`FabricControl::tick`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Beat {
    /// Bump this side's heartbeat now (every [`HEARTBEAT_BEATS`]-th beat with liveness on).
    pub(crate) heartbeat: bool,
    /// Sample the peers' proof of life now (liveness on).
    pub(crate) check: bool,
}

/// Beats per heartbeat with liveness on: a beat every twelfth of the liveness timeout, a
/// heartbeat every quarter.
///
/// A peer's silence is measured from the beat that last saw its counter move, so a dead peer is
/// reported at most one beat (a twelfth, 8 %) after the timeout, inside the promised 20 %; a
/// beat every quarter would allow 25 %. With the default 1-s timeout that is 12 wake-ups of the
/// control thread per second while connections exist, where a fixed 10-ms tick made 100.
pub(crate) const HEARTBEAT_BEATS: u64 = 3;

/// The beat when liveness is off: the shm heartbeat word is then for tooling only.
pub(crate) const BEAT_IDLE: Duration = Duration::from_secs(1);

/// How soon the control thread retries commands that did not fit a poller's ring.
pub(crate) const COMMAND_RETRY: Duration = Duration::from_millis(1);

/// The engine's liveness cadence: one grid of beats shared by every fabric, so that the shm
/// heartbeats and checks and the advance of the coarse clock (which the TCP and RDMA pollers
/// read for their own liveness) cost one wake-up, not one per fabric.
#[derive(Debug)]
pub(crate) struct Cadence {
    every: Duration,
    liveness: bool,
    next: Instant,
    beats: u64,
}

impl Cadence {
    pub(crate) fn new(cfg: &Config, now: Instant) -> Cadence {
        let every = match cfg.heartbeat_every() {
            // `as u32`: HEARTBEAT_BEATS is a small constant.
            Some(hb) => hb / HEARTBEAT_BEATS as u32,
            None => BEAT_IDLE,
        };
        Cadence {
            every,
            liveness: cfg.liveness().is_some(),
            next: now,
            beats: 0,
        }
    }

    /// The beat due at `now`, if one is. The grid is kept (the next beat is one period after
    /// this one's due time), unless the thread was so late that it would be in the past.
    pub(crate) fn due(&mut self, now: Instant) -> Option<Beat> {
        if now < self.next {
            return None;
        }
        self.next += self.every;
        if self.next <= now {
            self.next = now + self.every;
        }
        let heartbeat = !self.liveness || self.beats % HEARTBEAT_BEATS == 0;
        self.beats = self.beats.wrapping_add(1);
        Some(Beat {
            heartbeat,
            check: self.liveness,
        })
    }

    /// When the next beat is due.
    pub(crate) fn next(&self) -> Instant {
        self.next
    }
}

/// The earlier of two optional instants.
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The control thread's watch on one peer's proof of life: a counter the peer advances (shm:
/// its heartbeat word; RDMA: messages heard), sampled once per [`Beat`].
///
/// A peer whose counter has not moved for the liveness timeout is unresponsive. The silence is
/// measured from the beat that last saw the counter move, so it is under-estimated by at most
/// one beat; a peer is never declared dead early.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Liveness {
    seen: u64,
    since: Instant,
}

impl Liveness {
    pub(crate) fn new(seen: u64, now: Instant) -> Liveness {
        Liveness { seen, since: now }
    }

    /// Records the counter's value at `now`; returns how long it has been silent when that is
    /// at least `timeout`.
    pub(crate) fn observe(
        &mut self,
        seen: u64,
        now: Instant,
        timeout: Duration,
    ) -> Option<Duration> {
        if seen != self.seen {
            self.seen = seen;
            self.since = now;
            return None;
        }
        let silent = now.saturating_duration_since(self.since);
        (silent >= timeout).then_some(silent)
    }
}

/// The beat-to-beat gap beyond which this side's own control thread counts as stalled (stopped,
/// descheduled, blocked in a long setup step): liveness observations are restarted rather than
/// blamed on peers.
pub(crate) fn stalled(last_beat: Instant, now: Instant, timeout: Duration) -> bool {
    now.saturating_duration_since(last_beat) > timeout / 2
}

/// One listener of a fabric.
pub(crate) struct ListenerRec<L> {
    pub(crate) id: u64,
    pub(crate) raw: String,
    pub(crate) listener: L,
    accepts: mpsc::Sender<ConnParts>,
}

/// One connection's setup side.
pub(crate) struct ConnRec<R> {
    pub(crate) poller: usize,
    pub(crate) shared: Arc<ConnShared>,
    /// Still registered with its poller (no `Retired` notice yet).
    live: bool,
    /// Closing since then: finished on the `Retired` notice or when `grace` has passed.
    closing: Option<Instant>,
    grace: Option<Duration>,
    pub(crate) setup: R,
}

impl<R> ConnRec<R> {
    /// A close has begun (by the application, the peer or a failure).
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.is_some()
    }
}

/// An established connection, ready to be split and handed to poller `poller`.
pub(crate) struct NewConn<C, R> {
    pub(crate) poller: usize,
    pub(crate) conn: C,
    /// The connection's pools (with its large slots, if any).
    pub(crate) pools: Pools,
    pub(crate) keep: Arc<dyn Any + Send + Sync>,
    pub(crate) setup: R,
    /// What the fabric chose, for [`Event::Connected`].
    pub(crate) path: Option<String>,
}

/// A watched descriptor, in [`Registry::watch`] order.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Watched {
    Listener(u64),
    Conn(u64),
}

/// The records every fabric's control half keeps: listeners, connections and poller links.
pub(crate) struct Registry<F: Fabric, L, R> {
    pub(crate) links: Vec<PollerLink<F>>,
    pub(crate) listeners: Vec<ListenerRec<L>>,
    pub(crate) conns: HashMap<u64, ConnRec<R>>,
    watched: Vec<Watched>,
}

impl<F: Fabric, L, R: SetupSide> Registry<F, L, R> {
    pub(crate) fn new(links: Vec<PollerLink<F>>) -> Self {
        Registry {
            links,
            listeners: Vec::new(),
            conns: HashMap::new(),
            watched: Vec::new(),
        }
    }

    /// Records a bound listener; returns its id and the receiving end of its accepts.
    pub(crate) fn add_listener(
        &mut self,
        ctx: &mut Ctx<'_>,
        raw: &str,
        listener: L,
    ) -> (u64, mpsc::Receiver<ConnParts>) {
        let id = ctx.next_id();
        let (tx, rx) = mpsc::channel();
        self.listeners.push(ListenerRec {
            id,
            raw: raw.to_owned(),
            listener,
            accepts: tx,
        });
        (id, rx)
    }

    /// Drops listener `id`; false if there is none.
    pub(crate) fn unlisten(&mut self, id: u64) -> bool {
        let before = self.listeners.len();
        self.listeners.retain(|l| l.id != id);
        before != self.listeners.len()
    }

    /// The least-loaded poller below `max` connections.
    ///
    /// # Errors
    ///
    /// [`Error::Setup`] when every poller is at its connection limit.
    pub(crate) fn least_loaded(&self, max: usize) -> Result<usize, Error> {
        self.links
            .iter()
            .enumerate()
            .filter(|(_, p)| p.load < max)
            .min_by_key(|(_, p)| p.load)
            .map(|(i, _)| i)
            .ok_or_else(|| Error::Setup(SetupError::PollersFull))
    }

    /// Splits an established connection, hands the poller half to its poller (after `attach`,
    /// a command for the poller's fabric state, if any) and emits [`Event::Connected`].
    ///
    /// # Errors
    ///
    /// [`Error::Setup`] when `new.poller` is not a poller of this fabric.
    pub(crate) fn register(
        &mut self,
        ctx: &mut Ctx<'_>,
        new: NewConn<F::Conn, R>,
        peer: String,
        attach: Option<F::Command>,
    ) -> Result<ConnParts, Error> {
        let pi = new.poller;
        if pi >= self.links.len() {
            return Err(Error::Setup(SetupError::NoPoller {
                fabric: F::NAME,
                poller: pi,
            }));
        }
        let id = ctx.next_id();
        let (parts, poller_half) =
            conn_pair(id, peer.clone(), new.conn, new.pools, new.keep, ctx.cfg);
        let link = &mut self.links[pi];
        if let Some(cmd) = attach {
            link.send(Command::Fabric(cmd));
        }
        link.send(Command::Add(poller_half));
        link.load += 1;
        self.conns.insert(
            id,
            ConnRec {
                poller: pi,
                shared: parts.shared.clone(),
                live: true,
                closing: None,
                grace: None,
                setup: new.setup,
            },
        );
        ctx.counters
            .connections_opened
            .fetch_add(1, Ordering::Relaxed);
        ctx.emit(Event::Connected {
            conn: id,
            peer,
            path: new.path,
        });
        Ok(parts)
    }

    /// Registers an established connection with a direct path (no poller: the application
    /// drives it, see `crate::fabric::DirectPath`) and emits [`Event::Connected`]. Its close
    /// is finished at once (nothing to retire).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn register_direct(
        &mut self,
        ctx: &mut Ctx<'_>,
        direct: Box<dyn Any + Send>,
        pools: Pools,
        keep: Arc<dyn Any + Send + Sync>,
        setup: R,
        peer: String,
        path: Option<String>,
    ) -> ConnParts {
        let id = ctx.next_id();
        let parts = direct_parts(id, peer.clone(), direct, pools, keep);
        self.conns.insert(
            id,
            ConnRec {
                poller: usize::MAX,
                shared: parts.shared.clone(),
                live: false,
                closing: None,
                grace: None,
                setup,
            },
        );
        ctx.counters
            .connections_opened
            .fetch_add(1, Ordering::Relaxed);
        ctx.emit(Event::Connected {
            conn: id,
            peer,
            path,
        });
        parts
    }

    /// Hands an accepted connection to listener `lid`'s application side; returns the id back
    /// when nobody will take it (the listener is gone), for the caller to close.
    pub(crate) fn hand_over(&mut self, lid: u64, parts: ConnParts) -> Option<u64> {
        let id = parts.id;
        let sent = self
            .listeners
            .iter()
            .find(|l| l.id == lid)
            .map(|l| l.accepts.send(parts).is_ok());
        (sent != Some(true)).then_some(id)
    }

    /// Begins closing connection `id`: marks it closing, counts it closed and, while its poller
    /// still serves it, sends `cmd`; the setup side is finished when the poller lets go or after
    /// `grace` (`Some(ZERO)`: now; `None`: only when the poller lets go). False if `id` is not
    /// a connection of this fabric; closing twice does nothing.
    pub(crate) fn close(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        cmd: Command<F>,
        grace: Option<Duration>,
    ) -> bool {
        let Some(rec) = self.conns.get_mut(&id) else {
            return false;
        };
        if rec.closing.is_some() {
            return true;
        }
        rec.closing = Some(Instant::now());
        rec.grace = grace;
        ctx.counters
            .connections_closed
            .fetch_add(1, Ordering::Relaxed);
        if rec.live {
            self.links[rec.poller].send(cmd);
            if grace == Some(Duration::ZERO) {
                self.finish(id);
            }
        } else {
            self.finish(id);
        }
        true
    }

    /// Fails connection `id` because its peer stopped proving it is alive: the application sees
    /// [`FabricError::PeerUnresponsive`] from now on, [`Event::PeerUnresponsive`] is emitted and
    /// the connection is closed like a close by the application (`cmd` to its poller, the setup
    /// side finished after `grace`), which tells the peer, should it resume, that it is gone.
    pub(crate) fn fail_unresponsive(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        silent_for: Duration,
        cmd: Command<F>,
        grace: Option<Duration>,
    ) {
        let Some(rec) = self.conns.get(&id) else {
            return;
        };
        if rec.closing.is_some() {
            return;
        }
        rec.shared
            .fail(FabricError::PeerUnresponsive { silent_for });
        ctx.emit(Event::PeerUnresponsive {
            conn: id,
            silent_for,
        });
        self.close(ctx, id, cmd, grace);
    }

    /// Releases the setup side of connection `id` and forgets it.
    pub(crate) fn finish(&mut self, id: u64) {
        if let Some(mut rec) = self.conns.remove(&id) {
            rec.setup.finish();
        }
    }

    /// Handles a poller's `Retired` notice: a close the control thread began is finished; a
    /// connection the poller gave up on by itself is reported ([`Event::Disconnected`] for a
    /// clean close by the peer, [`Event::Error`] for a failure; a failure is reported even
    /// while closing, since a poller retires a connection once) and closed.
    pub(crate) fn on_notice(&mut self, ctx: &mut Ctx<'_>, pi: usize, n: Notice<F::Conn>) {
        let Notice::Retired { conn, error } = n;
        let id = conn.id;
        if let Some(p) = self.links.get_mut(pi) {
            p.load = p.load.saturating_sub(1);
        }
        if let Some(rec) = self.conns.get_mut(&id) {
            rec.live = false;
            let closing = rec.closing.is_some();
            match error {
                Some(FabricError::PeerClosed) => {
                    rec.shared.disconnect();
                    tracing::debug!(
                        conn = id,
                        cause = "the poller saw the peer close",
                        "disconnect"
                    );
                    if !closing {
                        ctx.emit(Event::Disconnected { conn: id });
                    }
                }
                Some(FabricError::PeerUnresponsive { silent_for }) => {
                    ctx.emit(Event::PeerUnresponsive {
                        conn: id,
                        silent_for,
                    });
                }
                Some(e) => ctx.emit(Event::Error {
                    conn: Some(id),
                    error: Error::Fabric(e),
                }),
                None => {}
            }
            if closing {
                self.finish(id);
            } else {
                // Not live any more: no command is sent, the setup side is finished now.
                self.close(ctx, id, Command::Remove(id), Some(Duration::ZERO));
            }
        }
        // The poller half (rings, fabric handles) is released here, on the control thread.
        drop(conn);
    }

    /// Drains every poller's notices, then finishes closes whose grace has run out.
    pub(crate) fn drain(&mut self, ctx: &mut Ctx<'_>) {
        for pi in 0..self.links.len() {
            self.links[pi].flush();
            while let Ok(n) = self.links[pi].notices.pop() {
                self.on_notice(ctx, pi, n);
            }
        }
        let now = Instant::now();
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| match (c.closing, c.grace) {
                (Some(since), Some(grace)) => now.duration_since(since) >= grace,
                _ => false,
            })
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            self.finish(id);
        }
    }

    /// The earliest instant this registry needs a tick: a close whose grace runs out, or
    /// commands that did not fit a poller's ring yet ([`COMMAND_RETRY`]).
    pub(crate) fn next_due(&self, now: Instant) -> Option<Instant> {
        let grace = self
            .conns
            .values()
            .filter_map(|c| match (c.closing, c.grace) {
                (Some(since), Some(grace)) => Some(since + grace),
                _ => None,
            })
            .min();
        let retry = self
            .links
            .iter()
            .any(PollerLink::has_pending)
            .then(|| now + COMMAND_RETRY);
        earliest(grace, retry)
    }

    /// Appends the listeners' descriptors and those `conn_fd` gives for connections (`None`:
    /// not watched), remembering which is which for [`ready`](Self::ready).
    pub(crate) fn watch(
        &mut self,
        fds: &mut Vec<libc::pollfd>,
        listener_fd: impl Fn(&L) -> RawFd,
        conn_fd: impl Fn(&ConnRec<R>) -> Option<(RawFd, libc::c_short)>,
    ) {
        self.watched.clear();
        for l in &self.listeners {
            fds.push(libc::pollfd {
                fd: listener_fd(&l.listener),
                events: libc::POLLIN,
                revents: 0,
            });
            self.watched.push(Watched::Listener(l.id));
        }
        for (&id, c) in &self.conns {
            if let Some((fd, events)) = conn_fd(c) {
                fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
                self.watched.push(Watched::Conn(id));
            }
        }
    }

    /// The watched records whose descriptors are ready, among those [`watch`](Self::watch)
    /// appended.
    pub(crate) fn ready(&self, fds: &[libc::pollfd]) -> Vec<Watched> {
        fds.iter()
            .zip(self.watched.iter())
            .filter(|(p, _)| p.revents != 0)
            .map(|(_, w)| *w)
            .collect()
    }

    /// Closes everything (engine shutdown): the pollers have stopped and retired every
    /// connection, so their notices finish most; `close` is the fabric's command for the rest,
    /// and whatever is still left is finished at the end.
    pub(crate) fn shutdown(&mut self, ctx: &mut Ctx<'_>, grace: Option<Duration>) {
        self.drain(ctx);
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(ctx, id, Command::Remove(id), grace);
        }
        self.listeners.clear();
        self.drain(ctx);
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.finish(id);
        }
    }
}

/// Unpacks what a connecting thread produced for fabric `fabric`.
///
/// # Errors
///
/// [`Error::Setup`] ([`SetupError::WrongFabric`]) when `est` is not an `E`.
pub(crate) fn downcast<E: 'static>(est: Established, fabric: &'static str) -> Result<E, Error> {
    est.downcast::<E>()
        .map(|e| *e)
        .map_err(|_| Error::Setup(SetupError::WrongFabric { fabric }))
}

/// An accepted connection whose handshake waits on the peer (shm's and TCP's `Handshake`,
/// RDMA's `PendingAccept`): an entry of a [`Handshakes`] table.
pub(crate) trait PendingSetup {
    /// The descriptor that becomes readable when the peer's next message arrives.
    fn fd(&self) -> RawFd;

    /// When the current step fails if the peer has not answered.
    fn deadline(&self) -> Instant;

    /// The error reported ([`Event::Error`], no connection) when the deadline has passed.
    fn timed_out(&self) -> Error;
}

/// Where one step of a pending handshake left it.
pub(crate) enum Step<H, E> {
    /// Still waiting on the peer.
    Pending(H),
    /// Done: the connection is set up (the fabric's `Established`).
    Done(E),
}

/// The pending-handshake table of a fabric's control half: accepted connections whose handshake
/// is under way, each with its listener's id, at most `max` at once (over every listener).
///
/// Their descriptors follow the registry's in the poll set, in table order
/// ([`watch`](Self::watch)); [`on_ready`] advances those with input, [`expire`](Self::expire)
/// drops those whose deadline passed. Dropping an entry closes its connection attempt.
pub(crate) struct Handshakes<H> {
    entries: Vec<(u64, H)>,
    /// How many of `entries` the last [`watch`](Self::watch) appended.
    watched: usize,
    max: usize,
}

impl<H: PendingSetup> Handshakes<H> {
    pub(crate) fn new(max: usize) -> Self {
        Handshakes {
            entries: Vec::new(),
            watched: 0,
            max,
        }
    }

    /// At the cap: a new connection is to be refused as busy.
    pub(crate) fn is_full(&self) -> bool {
        self.entries.len() >= self.max
    }

    /// Drops listener `lid`'s entries (it is gone).
    pub(crate) fn unlisten(&mut self, lid: u64) {
        self.entries.retain(|(l, _)| *l != lid);
    }

    /// Drops every entry (engine shutdown).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }

    /// The earliest deadline of the entries.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.entries.iter().map(|(_, h)| h.deadline()).min()
    }

    /// Appends the entries' descriptors, in table order.
    pub(crate) fn watch(&mut self, fds: &mut Vec<libc::pollfd>) {
        for (_, h) in &self.entries {
            fds.push(libc::pollfd {
                fd: h.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        self.watched = self.entries.len();
    }

    /// Drops the entries whose deadline has passed at `now`, reporting each
    /// ([`PendingSetup::timed_out`]).
    pub(crate) fn expire(&mut self, ctx: &mut Ctx<'_>, now: Instant) {
        if self.entries.iter().any(|(_, h)| h.deadline() <= now) {
            let (late, keep) = std::mem::take(&mut self.entries)
                .into_iter()
                .partition(|(_, h)| h.deadline() <= now);
            self.entries = keep;
            for (_, h) in late {
                ctx.emit(Event::Error {
                    conn: None,
                    error: h.timed_out(),
                });
            }
        }
    }
}

/// A fabric control half that accepts through a [`Handshakes`] table: what [`advance`] and
/// [`on_ready`] need of it.
pub(crate) trait Accepting: FabricControl {
    type Fabric: Fabric;
    type Listener;
    type Setup: SetupSide;
    type Pending: PendingSetup;
    /// What a finished handshake gives (the fabric's boxed `Established`).
    type Est;

    fn reg(&mut self) -> &mut Registry<Self::Fabric, Self::Listener, Self::Setup>;

    fn pending(&mut self) -> &mut Handshakes<Self::Pending>;

    /// Runs the next steps of `p`, accepted on `listener`, whose input has arrived.
    ///
    /// # Errors
    ///
    /// The handshake failed (that connection attempt only).
    fn step(
        listener: &Self::Listener,
        p: Self::Pending,
        cfg: &Config,
        now: Instant,
    ) -> Result<Step<Self::Pending, Self::Est>, Error>;

    /// Hands a connection whose handshake finished to a poller.
    ///
    /// # Errors
    ///
    /// [`Error::Setup`] when no poller can take it.
    fn install_accepted(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: Self::Est,
        raw: String,
    ) -> Result<ConnParts, Error>;
}

/// Runs the steps of pending handshake `p` of listener `lid` whose input has arrived: keeps it
/// pending, or installs the connection and hands it over (closing it when the listener is gone
/// by then), or reports its failure. Nothing is done (dropping `p` closes the attempt) when the
/// listener is gone.
pub(crate) fn advance<A: Accepting>(
    a: &mut A,
    ctx: &mut Ctx<'_>,
    lid: u64,
    p: A::Pending,
    now: Instant,
) {
    let Some(l) = a.reg().listeners.iter().find(|l| l.id == lid) else {
        return;
    };
    let step = A::step(&l.listener, p, ctx.cfg, now);
    let raw = l.raw.clone();
    match step {
        Ok(Step::Pending(p)) => a.pending().entries.push((lid, p)),
        Ok(Step::Done(est)) => match a.install_accepted(ctx, est, raw) {
            Ok(parts) => {
                if let Some(id) = a.reg().hand_over(lid, parts) {
                    // The listener is gone: nobody will take this connection.
                    a.drop_conn(ctx, id);
                }
            }
            Err(error) => ctx.emit(Event::Error { conn: None, error }),
        },
        // A failed handshake fails only that connection attempt.
        Err(error) => ctx.emit(Event::Error { conn: None, error }),
    }
}

/// Handles the pending handshakes' share of `fds` (the last descriptors, in table order: nothing
/// changed the table since [`Handshakes::watch`]): those with input are advanced, in order, and
/// keep their place if still pending. Returns the rest of `fds`, the registry's.
pub(crate) fn on_ready<'f, A: Accepting>(
    a: &mut A,
    ctx: &mut Ctx<'_>,
    fds: &'f [libc::pollfd],
    now: Instant,
) -> &'f [libc::pollfd] {
    let table = a.pending();
    let n = table.watched.min(fds.len()).min(table.entries.len());
    let (fds, hs_fds) = fds.split_at(fds.len() - n);
    if hs_fds.iter().any(|p| p.revents != 0) {
        let mut all = std::mem::take(&mut a.pending().entries).into_iter();
        for (p, (lid, h)) in hs_fds.iter().zip(all.by_ref()) {
            if p.revents != 0 {
                advance(a, ctx, lid, h, now);
            } else {
                a.pending().entries.push((lid, h));
            }
        }
        a.pending().entries.extend(all);
    }
    fds
}

/// Drops listener `id` of `a` with its pending handshakes; false if it is not one of `a`'s.
pub(crate) fn unlisten<A: Accepting>(a: &mut A, id: u64) -> bool {
    a.pending().unlisten(id);
    a.reg().unlisten(id)
}
