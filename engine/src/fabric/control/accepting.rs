//! The one [`FabricControl`] of every fabric that accepts through a [`Handshakes`] table:
//! [`Control<A>`](Control), generic over the fabric's own part, an [`Accepting`].
//!
//! `Control` holds what every such fabric keeps (the [`Registry`], the pending handshakes, the
//! queue of connections its connecting side set up) and runs the control loop's calls the same
//! way for all of them: listening, the accept burst, advancing and expiring handshakes, the
//! poll set, the drain of the pollers' notices, closes and shutdown. The fabric supplies its
//! types and the steps that differ (bind, accept, one handshake step, install, what its
//! connections' descriptors and ticks do), as [`Accepting`]'s methods.
//!
//! A connecting thread's result reaches `Control::install` typed: the connecting side
//! ([`Connector<A>`](Connector), the [`FabricConnect`] that [`FabricControl::connector`] hands
//! out) queues the fabric's own [`Accepting::Est`] on a channel that only this fabric's
//! `Control` reads, and the dispatcher's `Register` request only says which fabric to look at.

use std::os::fd::RawFd;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::clock::deadline_after;
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::event::Event;
use crate::link::ConnParts;

use super::{
    earliest, Beat, ConnRec, Ctx, Due, FabricConnect, FabricControl, Handshakes, PendingSetup,
    Pollers, Registry, SetupSide, Step, Watched, ACCEPT_BURST,
};

/// The registry of accepting fabric `A`.
pub(crate) type Reg<A> =
    Registry<<A as Accepting>::Pollers, <A as Accepting>::Listener, <A as Accepting>::Setup>;

/// What one accept on a listener gave.
pub(crate) enum Accept<P> {
    /// Nothing was waiting.
    Empty,
    /// A connection came in and was refused at once (the handshake table is full).
    Refused,
    /// A connection came in; its handshake is under way.
    Started(P),
}

/// A fabric's own part of its control half, run by [`Control`]: its types and the steps that
/// differ between fabrics. Every method runs on the control thread (except
/// [`connect`](Self::connect), on the connecting thread) and never waits on a peer.
pub(crate) trait Accepting: Send + Sized + 'static {
    /// The endpoint scheme this fabric serves (`"shm"`, `"tcp"`, `"rdma"`).
    const SCHEME: &'static str;

    /// Most accepted connections whose handshake is pending at once (over every listener).
    const MAX_PENDING: usize;

    /// Its pollers ([`NoPollers`](super::NoPollers) for a direct-path fabric).
    type Pollers: Pollers;
    /// One bound listener.
    type Listener: Send;
    /// One connection's setup side.
    type Setup: SetupSide;
    /// One accept whose handshake is under way.
    type Pending: PendingSetup + Send;
    /// What a finished handshake or a connect gives: the connection, set up.
    type Est: Send + 'static;
    /// What the connecting side needs on application threads (RDMA: the device table).
    type Connect: Send + Sync + 'static;

    /// The fabric's part, given its pollers.
    fn new(pollers: &Self::Pollers, cfg: &Config) -> Self;

    /// The state its connecting side shares.
    fn connect_side(&self) -> Self::Connect;

    /// Performs the rendezvous and creates the connection's resources on the calling thread,
    /// bounded by `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`], [`Error::Setup`], [`Error::Timeout`].
    fn connect(
        side: &Self::Connect,
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        timeout: Duration,
    ) -> Result<Self::Est, Error>;

    /// Whether `e`, from [`connect`](Self::connect), says that nobody listens on the endpoint
    /// (yet): no listener there, or the connection refused. The connecting side retries those
    /// until its deadline ([`Connector`]); every other error fails the connect at once.
    fn no_listener(_e: &Error) -> bool {
        false
    }

    /// Binds a listener on `endpoint`.
    ///
    /// # Errors
    ///
    /// [`Error::FabricNotCompiled`] for an endpoint of another scheme, [`Error::Listen`] and the
    /// fabric's setup errors.
    fn bind(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<Self::Listener, Error>;

    /// The listener's descriptor (readable when a connection is waiting).
    fn listener_fd(listener: &Self::Listener) -> RawFd;

    /// The descriptor to watch for an established connection, and its events (`None`: not
    /// watched, the default).
    fn conn_fd(conn: &ConnRec<Self::Setup>) -> Option<(RawFd, libc::c_short)> {
        let _ = conn;
        None
    }

    /// Takes one waiting connection off `listener` and starts its handshake; `busy`: the table
    /// is full, refuse it.
    ///
    /// # Errors
    ///
    /// That connection attempt failed (reported, the burst goes on).
    fn try_accept(
        &self,
        listener: &Self::Listener,
        cfg: &Config,
        busy: bool,
        now: Instant,
    ) -> Result<Accept<Self::Pending>, Error>;

    /// Runs the next steps of `pending`, accepted on `listener`, whose input has arrived.
    ///
    /// # Errors
    ///
    /// The handshake failed (that connection attempt only).
    fn step(
        listener: &Self::Listener,
        pending: Self::Pending,
        cfg: &Config,
        now: Instant,
    ) -> Result<Step<Self::Pending, Self::Est>, Error>;

    /// Registers a connection that is set up (accepted or connected): with a poller, or as a
    /// direct path.
    ///
    /// # Errors
    ///
    /// [`Error::Setup`] when no poller can take it.
    fn install(
        &mut self,
        reg: &mut Reg<Self>,
        ctx: &mut Ctx<'_>,
        est: Self::Est,
        raw: String,
    ) -> Result<ConnParts, Error>;

    /// Grace of every close this fabric begins (see [`Registry::close`]).
    fn close_grace(&self) -> Option<Duration>;

    /// Whether its connections need the engine's liveness beats (checked only while it has
    /// connections).
    fn beats(cfg: &Config) -> bool;

    /// Connection `id`'s watched descriptor ([`conn_fd`](Self::conn_fd)) is ready.
    fn on_conn_ready(&mut self, reg: &mut Reg<Self>, ctx: &mut Ctx<'_>, id: u64) {
        let _ = (reg, ctx, id);
    }

    /// The fabric's own timed work on every tick, after the pollers' notices are drained.
    fn on_tick(
        &mut self,
        reg: &mut Reg<Self>,
        ctx: &mut Ctx<'_>,
        now: Instant,
        beat: Option<Beat>,
    ) {
        let _ = (reg, ctx, now, beat);
    }

    /// The application closes connection `id`; runs before its close begins.
    fn on_drop_conn(&mut self, reg: &mut Reg<Self>, ctx: &mut Ctx<'_>, id: u64) {
        let _ = (reg, ctx, id);
    }
}

/// A connection a connecting thread set up, queued for its fabric's [`Control::install`].
struct Arrival<E> {
    est: E,
    raw: String,
    reply: mpsc::SyncSender<Result<ConnParts, Error>>,
}

/// The control half of accepting fabric `A`: its [`FabricControl`].
pub(crate) struct Control<A: Accepting> {
    reg: Reg<A>,
    /// Accepted connections whose handshake is under way; their descriptors follow the
    /// registry's in the poll set.
    handshakes: Handshakes<A::Pending>,
    /// Connections the connecting side set up, not installed yet.
    arrivals: mpsc::Receiver<Arrival<A::Est>>,
    connector: Arc<Connector<A>>,
    fabric: A,
}

impl<A: Accepting> Control<A> {
    pub(crate) fn new(pollers: A::Pollers, cfg: &Config) -> Self {
        let fabric = A::new(&pollers, cfg);
        let (queue, arrivals) = mpsc::channel();
        let connector = Arc::new(Connector {
            side: fabric.connect_side(),
            queue,
        });
        Control {
            reg: Registry::new(pollers),
            handshakes: Handshakes::new(A::MAX_PENDING),
            arrivals,
            connector,
            fabric,
        }
    }

    /// Takes up to [`ACCEPT_BURST`] new connections off listener `lid` and starts their
    /// handshakes (nothing here waits for a peer).
    fn accept_on(&mut self, ctx: &mut Ctx<'_>, lid: u64, now: Instant) {
        for _ in 0..ACCEPT_BURST {
            let Some(l) = self.reg.listeners.iter().find(|l| l.id == lid) else {
                return;
            };
            // The listener's maximum counts its open connections and pending handshakes.
            let max = ctx.cfg.max_connections_per_listener;
            let pending = self.handshakes.entries.iter().filter(|(id, _)| *id == lid);
            let full = self.reg.open_on(lid) + pending.count() >= max;
            let busy = full || self.handshakes.is_full();
            match self.fabric.try_accept(&l.listener, ctx.cfg, busy, now) {
                Ok(Accept::Empty) => return,
                Ok(Accept::Refused) if full => ctx.emit(Event::Error {
                    conn: None,
                    error: Error::ListenerFull {
                        endpoint: l.raw.clone(),
                        max,
                    },
                }),
                Ok(Accept::Refused) => {}
                // A fabric that reports its busy refusal as an error (rdma's reject): the
                // listener's reason instead.
                Err(_) if full => ctx.emit(Event::Error {
                    conn: None,
                    error: Error::ListenerFull {
                        endpoint: l.raw.clone(),
                        max,
                    },
                }),
                // The peer's first message may be there already: try at once.
                Ok(Accept::Started(p)) => self.advance(ctx, lid, p, now),
                // A failed accept fails only that connection attempt.
                Err(error) => ctx.emit(Event::Error { conn: None, error }),
            }
        }
    }

    /// Runs the steps of pending handshake `p` of listener `lid` whose input has arrived: keeps
    /// it pending, or installs the connection and hands it over (closing it when the listener
    /// is gone by then), or reports its failure. Nothing is done (dropping `p` closes the
    /// attempt) when the listener is gone.
    fn advance(&mut self, ctx: &mut Ctx<'_>, lid: u64, p: A::Pending, now: Instant) {
        let Some(l) = self.reg.listeners.iter().find(|l| l.id == lid) else {
            return;
        };
        let step = A::step(&l.listener, p, ctx.cfg, now);
        let raw = l.raw.clone();
        match step {
            Ok(Step::Pending(p)) => self.handshakes.entries.push((lid, p)),
            Ok(Step::Done(est)) => match self.fabric.install(&mut self.reg, ctx, est, raw) {
                Ok(parts) => {
                    if let Some(id) = self.reg.hand_over(lid, parts) {
                        // The listener is gone: nobody will take this connection.
                        self.drop_conn(ctx, id);
                    }
                }
                Err(error) => ctx.emit(Event::Error { conn: None, error }),
            },
            // A failed handshake fails only that connection attempt.
            Err(error) => ctx.emit(Event::Error { conn: None, error }),
        }
    }

    /// Handles the pending handshakes' share of `fds` (the last descriptors, in table order:
    /// nothing changed the table since [`Handshakes::watch`]): those with input are advanced,
    /// in order, and keep their place if still pending. Returns the rest of `fds`, the
    /// registry's.
    fn on_ready_handshakes<'f>(
        &mut self,
        ctx: &mut Ctx<'_>,
        fds: &'f [libc::pollfd],
        now: Instant,
    ) -> &'f [libc::pollfd] {
        let table = &self.handshakes;
        let n = table.watched.min(fds.len()).min(table.entries.len());
        let (fds, hs_fds) = fds.split_at(fds.len() - n);
        if hs_fds.iter().any(|p| p.revents != 0) {
            let mut all = std::mem::take(&mut self.handshakes.entries).into_iter();
            for (p, (lid, h)) in hs_fds.iter().zip(all.by_ref()) {
                if p.revents != 0 {
                    self.advance(ctx, lid, h, now);
                } else {
                    self.handshakes.entries.push((lid, h));
                }
            }
            self.handshakes.entries.extend(all);
        }
        fds
    }
}

impl<A: Accepting> FabricControl for Control<A> {
    fn scheme(&self) -> &'static str {
        A::SCHEME
    }

    fn connector(&self) -> Arc<dyn FabricConnect> {
        self.connector.clone()
    }

    fn listen(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<(u64, mpsc::Receiver<ConnParts>), Error> {
        let listener = self.fabric.bind(ctx, endpoint, raw)?;
        Ok(self.reg.add_listener(ctx, raw, listener))
    }

    fn unlisten(&mut self, id: u64) -> bool {
        // Its pending handshakes go with it (their descriptors close).
        self.handshakes.unlisten(id);
        self.reg.unlisten(id)
    }

    fn install(&mut self, ctx: &mut Ctx<'_>) {
        while let Ok(Arrival { est, raw, reply }) = self.arrivals.try_recv() {
            let res = self.fabric.install(&mut self.reg, ctx, est, raw);
            if let Err(mpsc::TrySendError::Disconnected(Ok(parts))) = reply.try_send(res) {
                // The connecting thread gave up waiting: close it again.
                self.drop_conn(ctx, parts.id);
            }
        }
    }

    fn drop_conn(&mut self, ctx: &mut Ctx<'_>, id: u64) -> bool {
        self.fabric.on_drop_conn(&mut self.reg, ctx, id);
        let grace = self.fabric.close_grace();
        self.reg.close(ctx, id, grace)
    }

    fn fds(&mut self, fds: &mut Vec<libc::pollfd>) {
        self.reg.watch(fds, A::listener_fd, A::conn_fd);
        self.handshakes.watch(fds);
    }

    fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]) {
        let now = Instant::now();
        // The pending handshakes' descriptors come last; those with input run their next step
        // first.
        let fds = self.on_ready_handshakes(ctx, fds, now);
        for w in self.reg.ready(fds) {
            match w {
                Watched::Listener(id) => self.accept_on(ctx, id, now),
                Watched::Conn(id) => self.fabric.on_conn_ready(&mut self.reg, ctx, id),
            }
        }
    }

    fn tick(&mut self, ctx: &mut Ctx<'_>, now: Instant, beat: Option<Beat>) -> Due {
        self.reg.drain(ctx);
        self.fabric.on_tick(&mut self.reg, ctx, now, beat);
        // Handshakes whose step ran past its deadline fail (their descriptors close).
        self.handshakes.expire(ctx, now);
        Due {
            // Pending handshakes' deadlines, closes' grace, command retries.
            at: earliest(self.reg.next_due(now), self.handshakes.next_deadline()),
            beat: A::beats(ctx.cfg) && !self.reg.conns.is_empty(),
        }
    }

    fn shutdown(&mut self, ctx: &mut Ctx<'_>) {
        self.handshakes.clear();
        let grace = self.fabric.close_grace();
        self.reg.shutdown(ctx, grace);
    }
}

/// The first pause of a connect that found no listener; each further pause doubles, up to
/// [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(1);
/// The longest pause between two connect attempts that found no listener: how late a connect
/// may notice a listener that appeared.
const RETRY_MAX: Duration = Duration::from_millis(50);

/// [`Accepting::connect`], retried while nobody listens ([`Accepting::no_listener`]) until
/// `timeout` is spent, pausing [`RETRY_MIN`] doubling to [`RETRY_MAX`] between attempts. Runs
/// on the calling application thread.
///
/// # Errors
///
/// [`Error::NoListener`] (the last refusal as its source) when no listener appeared in time;
/// otherwise the first other error of an attempt.
fn connect_waiting<A: Accepting>(
    side: &A::Connect,
    endpoint: &Endpoint,
    raw: &str,
    cfg: &Config,
    timeout: Duration,
) -> Result<A::Est, Error> {
    let start = Instant::now();
    let deadline = deadline_after(start, timeout);
    let mut pause = RETRY_MIN;
    let gave_up = |refusal: Error| Error::NoListener {
        endpoint: raw.to_owned(),
        waited: start.elapsed(),
        source: Box::new(refusal),
    };
    let mut refusal = match A::connect(side, endpoint, raw, cfg, timeout) {
        Ok(est) => return Ok(est),
        Err(e) if A::no_listener(&e) => e,
        Err(e) => return Err(e),
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(gave_up(refusal));
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(RETRY_MAX);
        let left = deadline.saturating_duration_since(Instant::now());
        refusal = match A::connect(side, endpoint, raw, cfg, left) {
            Ok(est) => return Ok(est),
            Err(e) if A::no_listener(&e) => e,
            // The deadline came during an attempt: still nobody had listened before it.
            Err(Error::Timeout) if Instant::now() >= deadline => return Err(gave_up(refusal)),
            Err(e) => return Err(e),
        };
    }
}

/// The connecting side of accepting fabric `A`, for application threads: runs
/// [`Accepting::connect`] and queues the result for the fabric's [`Control`].
pub(crate) struct Connector<A: Accepting> {
    side: A::Connect,
    queue: mpsc::Sender<Arrival<A::Est>>,
}

impl<A: Accepting> FabricConnect for Connector<A> {
    fn scheme(&self) -> &'static str {
        A::SCHEME
    }

    fn connect(
        &self,
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        timeout: Duration,
        wait: bool,
        reply: mpsc::SyncSender<Result<ConnParts, Error>>,
    ) -> Result<(), Error> {
        let est = if wait {
            connect_waiting::<A>(&self.side, endpoint, raw, cfg, timeout)?
        } else {
            A::connect(&self.side, endpoint, raw, cfg, timeout)?
        };
        self.queue
            .send(Arrival {
                est,
                raw: raw.to_owned(),
                reply,
            })
            .map_err(|_| Error::Shutdown)
    }
}
