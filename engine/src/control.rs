//! The engine's control backend: a dispatcher over the fabrics' control halves.
//!
//! [`Dispatcher`] is the engine's [`cm::control::Backend`]: it runs on the `cm::control` thread,
//! owns the state every fabric shares (configuration, engine-wide ids, the event ring, the
//! engine's counters, the coarse clock) and one [`FabricControl`] per compiled-in fabric (the
//! shared [`Control`] around the fabric's part in `fabric/<name>/control.rs`, built in
//! [`Dispatcher::new`]). Requests from application threads
//! go to the fabric named by the endpoint's scheme (or, for ids, to the fabric that owns them);
//! the control loop's `fds`, `on_ready`, `tick` and shutdown go to every fabric in turn. The
//! dispatcher holds nothing fabric-specific; see [`crate::fabric`] for adding a fabric.
//!
//! Timing: the dispatcher owns the engine's liveness [`Cadence`] (one grid of beats for every
//! fabric) and advances the coarse clock on each turn. Its `tick` answers the earliest of the
//! fabrics' own deadlines and, while any fabric needs it, the next beat; the control thread
//! sleeps until then (or until a request, a descriptor or a poller's notice wakes it). Each
//! turn counts one [`EngineStats::control_wakeups`](crate::EngineStats::control_wakeups).
//!
//! Run-to-completion: on each liveness beat the dispatcher runs one cycle of the engine's
//! [`RunToCompletion`] poller itself when no thread ran one since the previous beat, taking its
//! ownership flag with a non-blocking try (never waiting, never alongside the application's
//! cycle). So heartbeats go out and peers are checked, on every fabric, whether or not the
//! application calls into the engine.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rings::Producer;

use crate::clock::Clock;
use crate::config::Config;
use crate::counters::publish::Publisher;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::event::Event;
use crate::fabric;
use crate::fabric::control::{
    earliest, Accepting, Cadence, Control, Ctx, FabricConnect, FabricControl, NoPollers,
};
use crate::link::ConnParts;
use crate::poller::{AgentLinks, RunToCompletion};
use crate::stats::EngineCounters;

/// Requests from application threads.
pub(crate) enum Request {
    Listen {
        endpoint: Endpoint,
        raw: String,
        reply: mpsc::SyncSender<Result<(u64, mpsc::Receiver<ConnParts>), Error>>,
    },
    Unlisten(u64),
    /// Connections set up by connecting threads wait in the queue of fabric `scheme`'s
    /// control half ([`FabricControl::install`]).
    Register {
        scheme: &'static str,
    },
    Close(u64),
}

/// The engine's [`cm::control::Backend`]: dispatches to each fabric's [`FabricControl`].
pub(crate) struct Dispatcher {
    cfg: Config,
    events: Producer<Event>,
    clock: Arc<Clock>,
    counters: Arc<EngineCounters>,
    next_id: u64,
    fabrics: Vec<Box<dyn FabricControl>>,
    /// How many descriptors each fabric appended in the last `fds`, in `fabrics` order.
    watched: Vec<usize>,
    /// The liveness beats shared by every fabric.
    cadence: Cadence,
    /// The run-to-completion poller, if this engine has one, and its cycle count at the last
    /// beat.
    rtc: Option<(Arc<RunToCompletion>, u64)>,
    /// The counters file, published on the control thread's turns.
    publisher: Option<Arc<Publisher>>,
}

impl Dispatcher {
    pub(crate) fn new(
        cfg: Config,
        links: AgentLinks,
        events: Producer<Event>,
        clock: Arc<Clock>,
        counters: Arc<EngineCounters>,
        rtc: Option<Arc<RunToCompletion>>,
        publisher: Option<Arc<Publisher>>,
    ) -> Dispatcher {
        let mut d = Dispatcher {
            cadence: Cadence::new(&cfg, Instant::now()),
            cfg,
            events,
            clock,
            counters,
            next_id: 1,
            fabrics: Vec::new(),
            watched: Vec::new(),
            rtc: rtc.map(|r| (r, 0)),
            publisher,
        };
        // The fabrics. Adding a fabric adds its line here (and, if it has a poller side, one in
        // `crate::poller`'s agent set).
        d.add::<fabric::shm::control::ShmControl>(NoPollers);
        d.add::<fabric::tcp::control::TcpControl>(links.tcp);
        d.add::<fabric::mem::control::MemControl>(links.mem);
        #[cfg(feature = "rdma")]
        d.add::<fabric::rdma::control::RdmaControl>(links.rdma);
        d
    }

    /// Adds the control half of fabric `A` (the shared [`Control`] around its part), serving
    /// its `pollers`.
    fn add<A: Accepting>(&mut self, pollers: A::Pollers) {
        self.fabrics
            .push(Box::new(Control::<A>::new(pollers, &self.cfg)));
        self.watched.push(0);
    }

    /// The connecting sides of the fabrics, for application threads.
    pub(crate) fn connectors(&self) -> Vec<Arc<dyn FabricConnect>> {
        self.fabrics.iter().map(|f| f.connector()).collect()
    }

    /// The fabrics, each with the context it needs, borrowed together.
    fn split(&mut self) -> (&mut [Box<dyn FabricControl>], Ctx<'_>) {
        let ctx = Ctx {
            cfg: &self.cfg,
            next_id: &mut self.next_id,
            events: &mut self.events,
            counters: &self.counters,
        };
        (&mut self.fabrics, ctx)
    }

    /// The fabric serving `scheme`, with its context.
    fn fabric(&mut self, scheme: &str) -> Option<(&mut dyn FabricControl, Ctx<'_>)> {
        let (fabrics, ctx) = self.split();
        let f = fabrics.iter_mut().find(|f| f.scheme() == scheme)?;
        Some((f.as_mut(), ctx))
    }
}

impl cm::control::Backend for Dispatcher {
    type Request = Request;

    fn on_request(&mut self, request: Request, _now: Instant) {
        match request {
            Request::Listen {
                endpoint,
                raw,
                reply,
            } => {
                let res = match self.fabric(endpoint.scheme()) {
                    Some((f, mut ctx)) => f.listen(&mut ctx, &endpoint, &raw),
                    None => Err(Error::FabricNotCompiled {
                        fabric: endpoint.scheme(),
                    }),
                };
                let _ = reply.send(res);
            }
            Request::Unlisten(id) => {
                let _ = self.fabrics.iter_mut().any(|f| f.unlisten(id));
            }
            Request::Register { scheme } => {
                if let Some((f, mut ctx)) = self.fabric(scheme) {
                    f.install(&mut ctx);
                }
            }
            Request::Close(id) => {
                let (fabrics, mut ctx) = self.split();
                let _ = fabrics.iter_mut().any(|f| f.drop_conn(&mut ctx, id));
            }
        }
    }

    fn fds(&mut self, fds: &mut Vec<libc::pollfd>) {
        for (f, n) in self.fabrics.iter_mut().zip(self.watched.iter_mut()) {
            let before = fds.len();
            f.fds(fds);
            *n = fds.len() - before;
        }
    }

    fn on_ready(&mut self, fds: &[libc::pollfd], _now: Instant) {
        // Each fabric's descriptors follow the previous fabric's, as `fds` appended them.
        let watched = std::mem::take(&mut self.watched);
        let (fabrics, mut ctx) = self.split();
        let mut rest = fds;
        for (f, &n) in fabrics.iter_mut().zip(&watched) {
            let (mine, next) = rest.split_at(n.min(rest.len()));
            rest = next;
            f.on_ready(&mut ctx, mine);
        }
        self.watched = watched;
    }

    fn tick(&mut self, now: Instant) -> Option<Duration> {
        self.clock.update();
        self.counters
            .control_wakeups
            .fetch_add(1, Ordering::Relaxed);
        let beat = self.cadence.due(now);
        if let (Some(b), Some((rtc, seen))) = (beat, self.rtc.as_mut()) {
            // Run-to-completion: an application that ran no poller cycle since the last beat
            // (idle, or busy elsewhere) must not look dead to its peers, nor miss theirs. A
            // cycle it is running makes the try fail: then it is serving everyone anyway.
            if b.check {
                *seen = rtc.poll_if_idle(*seen);
            }
        }
        let (fabrics, mut ctx) = self.split();
        let mut next = None;
        let mut beating = false;
        for f in fabrics.iter_mut() {
            let due = f.tick(&mut ctx, now, beat);
            next = earliest(next, due.at);
            beating |= due.beat;
        }
        if let Some(p) = &self.publisher {
            p.publish(now);
        }
        let next = earliest(next, beating.then(|| self.cadence.next()))?;
        Some(next.saturating_duration_since(Instant::now()))
    }

    fn on_shutdown(&mut self) {
        // The pollers have stopped and retired everything: their notices finish the teardown.
        let (fabrics, mut ctx) = self.split();
        for f in fabrics.iter_mut() {
            f.shutdown(&mut ctx);
        }
        if let Some(p) = &self.publisher {
            p.publish_now();
        }
    }
}
