//! [`Engine`]: the handle that owns the control thread and the pollers, and everything it does
//! that needs no connection type (the connection modules hold an `Engine`, so they import this
//! file, never the one above it that makes connections).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rings::{Consumer, RingBuffer};

use crate::clock::{deadline_after, Clock, REFRESH_CYCLES};
use crate::config::{Config, EngineBuilder};
use crate::control::{self, Request};
use crate::counters::publish::Publisher;
use crate::error::{ConfigError, Error};
use crate::event::Event;
use crate::fabric::control::FabricConnect;
use crate::idle::{IdleStrategy, Idler, Step};
use crate::poller::{Agents, RtcGuard, RunToCompletion};
use crate::stats::{EngineCounters, EngineStats, PollerCounters};

/// Capacity of the control -> application event ring.
const EVENT_RING: usize = 4096;

struct PollerThread {
    core: usize,
    stop: Arc<AtomicBool>,
    /// `Block`: the poller's wake-up (written to stop a sleeping poller).
    wake: Option<Arc<crate::wake::PollerWake>>,
    join: Option<JoinHandle<Agents>>,
    counters: Arc<PollerCounters>,
}

struct Inner {
    cfg: Config,
    ctl: cm::control::ControlHandle<Request>,
    control: Option<cm::control::ControlThread<Request>>,
    /// The run-to-completion poller (no poller threads; the control thread holds the other
    /// reference), and its counters.
    rtc: Option<Arc<RunToCompletion>>,
    rtc_counters: Option<Arc<PollerCounters>>,
    pollers: Vec<PollerThread>,
    events: Mutex<Consumer<Event>>,
    clock: Arc<Clock>,
    counters: Arc<EngineCounters>,
    /// Each fabric's connecting side.
    connectors: Vec<Arc<dyn FabricConnect>>,
    /// The counters file, if any (also held by the control thread, which publishes).
    publisher: Option<Arc<Publisher>>,
}

/// The spinwire engine: pollers, the control thread, and the connections made through it.
///
/// Cheap to clone (an `Arc` inside), `Send + Sync`. Connections and listeners hold a clone, so the
/// engine shuts down — pollers stopped and joined, control thread stopped, every fabric resource
/// released — when the last `Engine`, [`Connection`](crate::Connection) and [`Listener`](crate::Listener) is dropped.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("pollers", &self.inner.cfg.pollers)
            .field("run_to_completion", &self.inner.cfg.run_to_completion())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// A builder with the defaults (see [`EngineBuilder`]).
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    pub(crate) fn start(cfg: Config) -> Result<Engine, Error> {
        let clock = Arc::new(Clock::new());
        clock.update();
        let counters = Arc::new(EngineCounters::default());
        let (ev_p, ev_c) = RingBuffer::<Event>::new(EVENT_RING);
        let n_pollers = cfg.pollers.len().max(1);
        let mut poller_counters: Vec<Arc<PollerCounters>> =
            (0..n_pollers).map(|_| Arc::default()).collect();
        let control_error = |e| match e {
            cm::control::ControlError::Spawn(source)
            | cm::control::ControlError::EventFd(source) => Error::Thread {
                what: "control",
                source,
            },
            other => Error::Thread {
                what: "control",
                source: std::io::Error::other(other),
            },
        };
        // Made first: the pollers wake the control thread when they leave it a notice.
        let waker = Arc::new(cm::control::Waker::new().map_err(control_error)?);
        // Block: each agent set gets a wake-up, and sleeps at most a quarter of the liveness
        // timeout (heartbeats go out, and peers are judged, from the pollers' checks).
        let sleep = matches!(cfg.idle, IdleStrategy::Block { .. }).then(|| {
            cfg.liveness().map_or(Duration::from_secs(1), |l| {
                (l / 4).max(Duration::from_millis(1))
            })
        });
        let (mut agents, links) = Agents::build(
            &poller_counters,
            &waker,
            cfg.max_connections_per_poller,
            cfg.batch,
            sleep,
            !cfg.run_to_completion(),
        )
        .map_err(|source| Error::Thread {
            what: "poller wake-up",
            source,
        })?;
        let publisher = if cfg.counters_file {
            let cores: Vec<Option<usize>> = if cfg.run_to_completion() {
                vec![None]
            } else {
                cfg.pollers.iter().map(|&c| Some(c)).collect()
            };
            let pollers = cores
                .into_iter()
                .zip(poller_counters.iter().cloned())
                .collect();
            Publisher::create(&cfg.name, counters.clone(), pollers)
        } else {
            None
        };
        // Run-to-completion: the one agent set, shared with the control thread, which runs a
        // cycle on its liveness beats while the application runs none (see `Dispatcher`).
        let mut rtc = None;
        let mut rtc_counters = None;
        if cfg.run_to_completion() {
            // `agents` holds exactly one set in run-to-completion mode (built above).
            let Some(a) = agents.pop() else {
                return Err(Error::Config(ConfigError::RunToCompletionAgents));
            };
            rtc = Some(Arc::new(RunToCompletion::new(a, clock.clone())));
            rtc_counters = poller_counters.pop();
        }
        let backend = control::Dispatcher::new(
            cfg.clone(),
            links,
            ev_p,
            clock.clone(),
            counters.clone(),
            rtc.clone(),
            publisher.clone(),
        );
        let connectors = backend.connectors();
        let control = cm::control::ControlThread::spawn_with_waker(
            &format!("{}-control", cfg.name),
            backend,
            waker,
        )
        .map_err(control_error)?;
        let ctl = control.handle();

        let mut inner = Inner {
            cfg: cfg.clone(),
            ctl,
            control: Some(control),
            rtc,
            rtc_counters,
            pollers: Vec::new(),
            events: Mutex::new(ev_c),
            clock: clock.clone(),
            counters,
            connectors,
            publisher,
        };
        if !cfg.run_to_completion() {
            for ((core, a), pc) in cfg.pollers.iter().zip(agents).zip(poller_counters) {
                // On failure `inner` drops here, stopping the threads started so far.
                let t = spawn_poller(&cfg, *core, a, clock.clone(), pc)?;
                inner.pollers.push(t);
            }
        }
        Ok(Engine {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Each compiled-in fabric's connecting side.
    pub(super) fn connectors(&self) -> &[Arc<dyn FabricConnect>] {
        &self.inner.connectors
    }

    /// True in run-to-completion mode (no poller threads).
    pub fn is_run_to_completion(&self) -> bool {
        self.inner.cfg.run_to_completion()
    }

    pub(super) fn request(&self, r: Request) -> Result<(), Error> {
        self.inner.ctl.request(r).map_err(|_| Error::Shutdown)
    }

    /// Waits up to `timeout` for what the control thread sends on `rx`: a reply, an accepted
    /// connection. In run-to-completion mode it runs poller cycles meanwhile (backing off), so
    /// that the engine's other connections are served.
    pub(crate) fn wait_reply<T>(
        &self,
        rx: &mpsc::Receiver<T>,
        timeout: Duration,
    ) -> Result<T, Error> {
        if !self.is_run_to_completion() {
            return match rx.recv_timeout(timeout) {
                Ok(v) => Ok(v),
                Err(mpsc::RecvTimeoutError::Timeout) => Err(Error::Timeout),
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(Error::Shutdown),
            };
        }
        // Run-to-completion: keep the poller turning while we wait (other connections of this
        // engine may be served by this thread only).
        let deadline = deadline_after(Instant::now(), timeout);
        let mut idler = Idler::new(IdleStrategy::backoff());
        loop {
            match rx.try_recv() {
                Ok(v) => return Ok(v),
                Err(mpsc::TryRecvError::Disconnected) => return Err(Error::Shutdown),
                Err(mpsc::TryRecvError::Empty) => {}
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            let w = self.poll();
            idler.idle(w);
        }
    }

    /// Runs one poller cycle on this thread (run-to-completion mode) and returns the work done.
    /// With dedicated pollers, or while another thread is running the cycle, it returns 0 at once.
    #[inline]
    pub fn poll(&self) -> usize {
        match &self.inner.rtc {
            Some(a) => a.try_poll(self.inner.clock.now_ns()),
            None => 0,
        }
    }

    /// Exclusive use of the run-to-completion poller, if this is one and nobody else has it.
    #[inline]
    pub(crate) fn rtc_guard(&self) -> Option<RtcGuard<'_>> {
        self.inner
            .rtc
            .as_deref()
            .and_then(RunToCompletion::try_lock)
    }

    /// The coarse clock.
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.inner.clock.now_ns()
    }

    /// The next connection event, if any.
    pub fn try_event(&self) -> Option<Event> {
        let mut events = self.inner.events.try_lock().ok()?;
        events.pop().ok()
    }

    /// Waits up to `timeout` for the next connection event (polling in run-to-completion mode).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`].
    pub fn event_timeout(&self, timeout: Duration) -> Result<Event, Error> {
        let deadline = deadline_after(Instant::now(), timeout);
        let mut idler = Idler::new(IdleStrategy::backoff());
        loop {
            if let Some(e) = self.try_event() {
                return Ok(e);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            let w = self.poll();
            idler.idle(w);
        }
    }

    /// A snapshot of the engine's counters.
    pub fn counters(&self) -> EngineStats {
        let mut pollers = Vec::new();
        if let Some(c) = &self.inner.rtc_counters {
            pollers.push(c.snapshot(None));
        }
        for p in &self.inner.pollers {
            pollers.push(p.counters.snapshot(Some(p.core)));
        }
        let c = &self.inner.counters;
        EngineStats {
            pollers,
            events_dropped: c.events_dropped.load(Ordering::Relaxed),
            connections_opened: c.connections_opened.load(Ordering::Relaxed),
            connections_closed: c.connections_closed.load(Ordering::Relaxed),
            control_wakeups: c.control_wakeups.load(Ordering::Relaxed),
            placement: self.inner.cfg.placer.stats(),
        }
    }

    /// The path of this engine's counters file ([`crate::counters`]); `None` when it has none
    /// ([`EngineBuilder::counters_file`] off, or the file could not be made).
    pub fn counters_path(&self) -> Option<std::path::PathBuf> {
        self.inner.publisher.as_ref().map(|p| p.path())
    }

    /// Shows a connection in the counters file.
    pub(crate) fn attach_counters(
        &self,
        shared: &Arc<crate::link::ConnShared>,
        fabric: &str,
        endpoint: &str,
    ) {
        if let Some(p) = &self.inner.publisher {
            p.attach(shared, fabric, endpoint);
        }
    }

    /// Asks the control thread to close connection `id`; false if it is gone (shutdown).
    pub(crate) fn close_connection(&self, id: u64) -> bool {
        self.inner.ctl.request(Request::Close(id)).is_ok()
    }

    pub(crate) fn close_listener(&self, id: u64) {
        let _ = self.inner.ctl.request(Request::Unlisten(id));
    }
}

fn spawn_poller(
    cfg: &Config,
    core: usize,
    mut agents: Agents,
    clock: Arc<Clock>,
    counters: Arc<PollerCounters>,
) -> Result<PollerThread, Error> {
    let stop = Arc::new(AtomicBool::new(false));
    let thread_stop = stop.clone();
    let idle = cfg.idle;
    let wake = agents.wake();
    let (ready_tx, ready_rx) = mpsc::sync_channel::<bool>(1);
    let join = std::thread::Builder::new()
        .name(format!("{}-poller-{core}", cfg.name))
        .spawn(move || {
            let pinned = core_affinity::set_for_current(core_affinity::CoreId { id: core });
            let _ = ready_tx.send(pinned);
            if !pinned {
                return agents;
            }
            // BusySpin: the bare loop, no idle state at all. Measured: with the loop below (the
            // same work, `Idler::step`'s BusySpin case a compare and a pause) `bench lat --fabric
            // mem --mode dedicated --one-thread --app-cores 0 --poller-cores 1 --iters 1000000`
            // had an RTT p99.9 of 3.5-5.8 µs against 2.9-3.1 µs with this one (3 interleaved
            // rounds; 2.2-2.4 µs before `Block` existed), p50 and p99 alike.
            // Each loop advances the coarse clock itself now and then (see `crate::clock`).
            let mut cycles = 0u32;
            if matches!(idle, IdleStrategy::BusySpin) {
                while !thread_stop.load(Ordering::Relaxed) {
                    if agents.do_work(clock.now_ns()) == 0 {
                        core::hint::spin_loop();
                    }
                    cycles = cycles.wrapping_add(1);
                    if cycles % REFRESH_CYCLES == 0 {
                        clock.update();
                    }
                }
                return agents;
            }
            let mut idler = Idler::new(idle);
            while !thread_stop.load(Ordering::Relaxed) {
                let work = agents.do_work(clock.now_ns());
                if let Step::Sleep(max) = idler.step(work) {
                    let _ = agents.sleep(max);
                }
                cycles = cycles.wrapping_add(1);
                if cycles % REFRESH_CYCLES == 0 || idler.gave_up_core() {
                    clock.update();
                }
            }
            agents
        })
        .map_err(|source| Error::Thread {
            what: "poller",
            source,
        })?;
    let mut t = PollerThread {
        core,
        stop,
        wake,
        join: Some(join),
        counters,
    };
    match ready_rx.recv_timeout(Duration::from_secs(10)) {
        Ok(true) => Ok(t),
        Ok(false) => {
            t.stop();
            Err(Error::BadCore { core })
        }
        Err(_) => {
            t.stop();
            Err(Error::Thread {
                what: "poller",
                source: std::io::Error::other("poller thread did not start"),
            })
        }
    }
}

impl PollerThread {
    fn stop(&mut self) -> Option<Agents> {
        self.stop.store(true, Ordering::Relaxed);
        let join = self.join.take()?;
        join.thread().unpark();
        if let Some(w) = &self.wake {
            w.ring();
        }
        join.join().ok()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Data path first: stop the pollers so nothing touches fabric memory any more.
        let mut stopped: Vec<Agents> = self
            .pollers
            .iter_mut()
            .filter_map(PollerThread::stop)
            .collect();
        for a in &mut stopped {
            a.retire_all();
        }
        // The run-to-completion poller: taken from the control thread (which may be running a
        // cycle of it right now: a short wait) and held until the control thread has stopped,
        // so that it runs no cycle on the retired agents.
        let _rtc = self.rtc.as_deref().map(|r| {
            let mut g = r.lock();
            g.retire_all();
            g
        });
        // Then the control plane: it drains the retirement notices, closes sockets and listeners.
        if let Some(mut c) = self.control.take() {
            c.shutdown();
        }
        drop(stopped);
    }
}

impl EngineBuilder {
    /// Validates the configuration, starts the control thread and the poller threads.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an invalid knob, [`Error::BadCore`] for a core this process may not
    /// use, [`Error::Thread`] when a thread cannot be started.
    pub fn build(self) -> Result<Engine, Error> {
        let cfg = self.validate()?;
        Engine::start(cfg)
    }
}
