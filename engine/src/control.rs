//! The engine's control backend: the fabric-specific half of the `cm::control` thread.
//!
//! It owns every connection's setup-side state (rendezvous socket, segment handle), the
//! listeners, and the producer ends of the pollers' command rings. Established connections are
//! split into an application half (sent to `accept`/`connect` callers) and a poller half (sent to
//! the least-loaded poller as [`Command::Add`]). Hang-ups of rendezvous sockets (a peer process
//! died or closed) mark the connection disconnected at once, tell its poller to drop it and emit
//! [`Event::Disconnected`]. Retired connections come back from pollers as notices and are released
//! here, off the data path.
//!
//! # Adding a fabric
//!
//! An RDMA backend adds its listeners (rdma_cm ids) and its event channel fd to [`Backend::fds`],
//! handles them in [`Backend::on_ready`], builds `Poller<RdmaFabric>` halves with
//! [`conn_pair`](crate::conn::conn_pair) and sends them through its own command rings (one per
//! poller thread, like `PollerLink`).

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rings::{Consumer, Producer, PushError};

use crate::clock::Clock;
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::{Error, FabricError};
use crate::event::Event;
use crate::fabric::shm::setup::{Established, ShmListener};
use crate::fabric::shm::wire::Segment;
use crate::fabric::shm::{ShmConn, ShmFabric};
use crate::fabric::Fabric;
use crate::link::{conn_pair, ConnParts};
use crate::poller::{Command, Notice};
use crate::stats::EngineCounters;

/// How often this side bumps its heartbeat word in each shm segment.
const HEARTBEAT_EVERY: Duration = Duration::from_millis(100);
/// Most connections accepted per listener per control-loop turn.
const ACCEPT_BURST: usize = 16;

/// Requests from application threads.
pub(crate) enum Request {
    Listen {
        endpoint: Endpoint,
        raw: String,
        reply: mpsc::SyncSender<Result<(u64, mpsc::Receiver<ConnParts>), Error>>,
    },
    Unlisten(u64),
    /// A connection set up by the connecting thread, to be registered with a poller.
    Register {
        est: Box<Established>,
        raw: String,
        reply: mpsc::SyncSender<Result<ConnParts, Error>>,
    },
    Close(u64),
    /// An RDMA connection set up by the connecting thread, to be registered with its poller.
    #[cfg(feature = "rdma")]
    RegisterRdma {
        est: Box<crate::fabric::rdma::setup::Established>,
        raw: String,
        reply: mpsc::SyncSender<Result<ConnParts, Error>>,
    },
}

/// The control thread's end of one poller's rings for fabric `F` (shm here; the RDMA half of
/// the backend keeps one per poller too).
pub(crate) struct PollerLink<F: Fabric> {
    commands: Producer<Command<F>>,
    pub(crate) notices: Consumer<Notice<F::Conn>>,
    /// Commands that did not fit the ring yet (the poller is behind), oldest first.
    pending: std::collections::VecDeque<Command<F>>,
    /// Connections this poller owns (used to pick the least-loaded poller).
    pub(crate) load: usize,
}

impl<F: Fabric> PollerLink<F> {
    pub(crate) fn new(commands: Producer<Command<F>>, notices: Consumer<Notice<F::Conn>>) -> Self {
        PollerLink {
            commands,
            notices,
            pending: Default::default(),
            load: 0,
        }
    }

    /// Queues `cmd` for the poller, keeping order behind commands still pending.
    pub(crate) fn send(&mut self, cmd: Command<F>) {
        if !self.pending.is_empty() {
            self.pending.push_back(cmd);
            self.flush();
            return;
        }
        if let Err(PushError::Full(cmd)) = self.commands.push(cmd) {
            self.pending.push_back(cmd);
        }
    }

    /// Pushes pending commands until the ring is full again.
    pub(crate) fn flush(&mut self) {
        while let Some(cmd) = self.pending.pop_front() {
            if let Err(PushError::Full(cmd)) = self.commands.push(cmd) {
                self.pending.push_front(cmd);
                break;
            }
        }
    }
}

struct ListenerRec {
    id: u64,
    raw: String,
    shm: ShmListener,
    accepts: mpsc::Sender<ConnParts>,
}

struct ConnRec {
    poller: usize,
    stream: cm::uds::UdsStream,
    segment: Segment,
    /// Still registered with its poller (no `Retired` notice yet).
    live: bool,
    /// A `Remove` was sent; finish the teardown when the poller lets go.
    closing: bool,
}

/// The engine's [`cm::control::Backend`].
pub(crate) struct Backend {
    cfg: Config,
    pollers: Vec<PollerLink<ShmFabric>>,
    events: Producer<Event>,
    clock: Arc<Clock>,
    counters: Arc<EngineCounters>,
    next_id: u64,
    listeners: Vec<ListenerRec>,
    conns: HashMap<u64, ConnRec>,
    /// Which `conns` entry each watched fd belongs to, in `fds` order.
    watched: Vec<Watched>,
    last_heartbeat: Instant,
    #[cfg(feature = "rdma")]
    rdma: Option<crate::fabric::rdma::control::RdmaBackend>,
}

#[derive(Clone, Copy)]
enum Watched {
    Listener(u64),
    Conn(u64),
}

impl Backend {
    pub(crate) fn new(
        cfg: Config,
        pollers: Vec<PollerLink<ShmFabric>>,
        events: Producer<Event>,
        clock: Arc<Clock>,
        counters: Arc<EngineCounters>,
    ) -> Backend {
        Backend {
            cfg,
            pollers,
            events,
            clock,
            counters,
            next_id: 1,
            listeners: Vec::new(),
            conns: HashMap::new(),
            watched: Vec::new(),
            last_heartbeat: Instant::now(),
            #[cfg(feature = "rdma")]
            rdma: None,
        }
    }

    /// Adds the RDMA half (listeners, connections and command rings of `RdmaFabric` pollers).
    #[cfg(feature = "rdma")]
    pub(crate) fn with_rdma(mut self, rdma: crate::fabric::rdma::control::RdmaBackend) -> Backend {
        self.rdma = Some(rdma);
        self
    }

    /// The RDMA half and the context it needs, borrowed together.
    #[cfg(feature = "rdma")]
    fn rdma(
        &mut self,
    ) -> Option<(
        &mut crate::fabric::rdma::control::RdmaBackend,
        crate::fabric::rdma::control::Ctx<'_>,
    )> {
        let ctx = crate::fabric::rdma::control::Ctx {
            cfg: &self.cfg,
            next_id: &mut self.next_id,
            events: &mut self.events,
            counters: &self.counters,
        };
        self.rdma.as_mut().map(|r| (r, ctx))
    }

    fn event(&mut self, e: Event) {
        if self.events.push(e).is_err() {
            self.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Splits an established connection, hands the poller half to the least-loaded poller.
    fn install(&mut self, est: Established, peer: String) -> Result<ConnParts, Error> {
        let Some((pi, _)) = self
            .pollers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.load < self.cfg.max_connections_per_poller)
            .min_by_key(|(_, p)| p.load)
        else {
            return Err(Error::Setup(
                "every poller is at its connection limit".to_owned(),
            ));
        };
        let id = self.next_id;
        self.next_id += 1;
        let Established {
            conn,
            tx_pool,
            rx_pool,
            keep,
            segment,
            stream,
            ..
        } = est;
        let (parts, poller_half) =
            conn_pair(id, peer.clone(), conn, tx_pool, rx_pool, keep, &self.cfg);
        self.pollers[pi].send(Command::Add(poller_half));
        self.pollers[pi].load += 1;
        self.conns.insert(
            id,
            ConnRec {
                poller: pi,
                stream,
                segment,
                live: true,
                closing: false,
            },
        );
        self.counters
            .connections_opened
            .fetch_add(1, Ordering::Relaxed);
        self.event(Event::Connected {
            conn: id,
            peer,
            path: None,
        });
        Ok(parts)
    }

    /// Closes connection `id`: its poller gets a last service pass and lets go (the `Retired`
    /// notice then finishes the teardown), or, if the poller already did, it is finished now.
    fn drop_conn(&mut self, id: u64, peer_gone: bool) {
        let Some(rec) = self.conns.get_mut(&id) else {
            return;
        };
        if rec.closing {
            return;
        }
        if rec.live {
            rec.closing = true;
            self.pollers[rec.poller].send(if peer_gone {
                Command::PeerGone(id)
            } else {
                Command::Remove(id)
            });
            // A run-to-completion poller turns only when the application polls, which it may
            // never do again; its `Connection::drop` already flushed the queued sends.
            if !peer_gone && self.cfg.run_to_completion() {
                self.finish_conn(id);
            }
        } else {
            self.finish_conn(id);
        }
    }

    /// Releases the setup side of a connection its poller has let go: the bye on the rendezvous
    /// socket (the peer's hang-up signal) goes out only after this side's last sends were posted.
    fn finish_conn(&mut self, id: u64) {
        if let Some(mut rec) = self.conns.remove(&id) {
            rec.segment.mark_closed();
            let _ = rec.stream.send_bye();
            self.counters
                .connections_closed
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    fn accept_on(&mut self, lid: u64) {
        for _ in 0..ACCEPT_BURST {
            let Some(l) = self.listeners.iter().find(|l| l.id == lid) else {
                return;
            };
            match l.shm.try_accept(&self.cfg) {
                Ok(None) => return,
                Ok(Some(est)) => {
                    let raw = l.raw.clone();
                    match self.install(est, raw) {
                        Ok(parts) => {
                            let id = parts.id;
                            let sent = self
                                .listeners
                                .iter()
                                .find(|l| l.id == lid)
                                .map(|l| l.accepts.send(parts).is_ok());
                            if sent != Some(true) {
                                // The listener is gone: nobody will take this connection.
                                self.drop_conn(id, false);
                            }
                        }
                        Err(error) => self.event(Event::Error { conn: None, error }),
                    }
                }
                Err(error) => {
                    // A failed handshake fails only that connection attempt.
                    self.event(Event::Error { conn: None, error });
                }
            }
        }
    }

    fn on_notice(&mut self, pi: usize, n: Notice<ShmConn>) {
        let Notice::Retired { conn, error } = n;
        let id = conn.id;
        if let Some(p) = self.pollers.get_mut(pi) {
            p.load = p.load.saturating_sub(1);
        }
        // `closing`: the application closed it or its peer hung up (already reported).
        let closing = match self.conns.get_mut(&id) {
            Some(rec) => {
                rec.live = false;
                rec.closing
            }
            None => true,
        };
        match error {
            Some(FabricError::PeerClosed) => {
                conn.shared.disconnect();
                if !closing {
                    self.event(Event::Disconnected { conn: id });
                }
            }
            Some(e) => {
                // A poller retires a connection once, so this is reported exactly once.
                self.event(Event::Error {
                    conn: Some(id),
                    error: Error::Fabric(e),
                });
            }
            None => {}
        }
        self.finish_conn(id);
        // The poller half (rings, segment handle) is released here, on the control thread.
        drop(conn);
    }

    fn drain_notices(&mut self) {
        for pi in 0..self.pollers.len() {
            self.pollers[pi].flush();
            while let Ok(n) = self.pollers[pi].notices.pop() {
                self.on_notice(pi, n);
            }
        }
    }
}

impl cm::control::Backend for Backend {
    type Request = Request;

    fn on_request(&mut self, request: Request, _now: Instant) {
        match request {
            Request::Listen {
                endpoint,
                raw,
                reply,
            } => {
                let res = match endpoint {
                    Endpoint::Shm { name } => {
                        ShmListener::bind(&name, &raw, &self.cfg).map(|shm| {
                            let id = self.next_id;
                            self.next_id += 1;
                            let (tx, rx) = mpsc::channel();
                            self.listeners.push(ListenerRec {
                                id,
                                raw: raw.clone(),
                                shm,
                                accepts: tx,
                            });
                            (id, rx)
                        })
                    }
                    #[cfg(feature = "rdma")]
                    Endpoint::Rdma { host, port } => match self.rdma() {
                        Some((r, mut ctx)) => r.listen(&mut ctx, &host, port, &raw),
                        None => Err(Error::FabricNotCompiled { fabric: "rdma" }),
                    },
                    #[cfg(not(feature = "rdma"))]
                    Endpoint::Rdma { .. } => Err(Error::FabricNotCompiled { fabric: "rdma" }),
                };
                let _ = reply.send(res);
            }
            Request::Unlisten(id) => {
                self.listeners.retain(|l| l.id != id);
                #[cfg(feature = "rdma")]
                if let Some((r, _)) = self.rdma() {
                    r.unlisten(id);
                }
            }
            #[cfg(feature = "rdma")]
            Request::RegisterRdma { est, raw, reply } => {
                let Some((r, mut ctx)) = self.rdma() else {
                    let _ = reply.try_send(Err(Error::FabricNotCompiled { fabric: "rdma" }));
                    return;
                };
                let res = r.install(&mut ctx, *est, raw);
                if let Err(mpsc::TrySendError::Disconnected(Ok(parts))) = reply.try_send(res) {
                    r.drop_conn(&mut ctx, parts.id);
                }
            }
            Request::Register { est, raw, reply } => {
                let res = self.install(*est, raw);
                if let Err(mpsc::TrySendError::Disconnected(Ok(parts))) = reply.try_send(res) {
                    // The connecting thread gave up waiting: close it again.
                    self.drop_conn(parts.id, false);
                }
            }
            Request::Close(id) => {
                self.drop_conn(id, false);
                #[cfg(feature = "rdma")]
                if let Some((r, mut ctx)) = self.rdma() {
                    r.drop_conn(&mut ctx, id);
                }
            }
        }
    }

    fn fds(&mut self, fds: &mut Vec<libc::pollfd>) {
        self.watched.clear();
        for l in &self.listeners {
            fds.push(libc::pollfd {
                fd: l.shm.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            self.watched.push(Watched::Listener(l.id));
        }
        for (&id, c) in self.conns.iter().filter(|(_, c)| !c.closing) {
            fds.push(libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            });
            self.watched.push(Watched::Conn(id));
        }
        #[cfg(feature = "rdma")]
        if let Some(r) = self.rdma.as_mut() {
            r.fds(fds);
        }
    }

    fn on_ready(&mut self, fds: &[libc::pollfd], _now: Instant) {
        // The RDMA half's descriptors follow the shm ones.
        let (fds, _rdma_fds) = fds.split_at(self.watched.len().min(fds.len()));
        #[cfg(feature = "rdma")]
        if let Some((r, mut ctx)) = self.rdma() {
            r.on_ready(&mut ctx, _rdma_fds);
        }
        let ready: Vec<Watched> = fds
            .iter()
            .zip(self.watched.iter())
            .filter(|(p, _)| p.revents != 0)
            .map(|(_, w)| *w)
            .collect();
        for w in ready {
            match w {
                Watched::Listener(id) => self.accept_on(id),
                Watched::Conn(id) => {
                    let gone = match self.conns.get_mut(&id) {
                        Some(c) => !matches!(c.stream.poll_hangup(), Ok(false)),
                        None => false,
                    };
                    if gone {
                        // The poller delivers what the peer sent before, then marks it
                        // disconnected for the application (within microseconds).
                        self.event(Event::Disconnected { conn: id });
                        self.drop_conn(id, true);
                    }
                }
            }
        }
    }

    fn tick(&mut self, now: Instant) -> Option<Duration> {
        self.clock.update();
        self.drain_notices();
        #[cfg(feature = "rdma")]
        let rdma_busy = match self.rdma() {
            Some((r, mut ctx)) => {
                r.drain_notices(&mut ctx);
                !r.is_idle()
            }
            None => false,
        };
        #[cfg(not(feature = "rdma"))]
        let rdma_busy = false;
        if now.duration_since(self.last_heartbeat) >= HEARTBEAT_EVERY {
            self.last_heartbeat = now;
            for c in self.conns.values() {
                c.segment.bump_heartbeat();
            }
        }
        if self.conns.is_empty() && !rdma_busy {
            None
        } else {
            Some(Duration::from_millis(10))
        }
    }

    fn on_shutdown(&mut self) {
        #[cfg(feature = "rdma")]
        if let Some((r, mut ctx)) = self.rdma() {
            r.shutdown(&mut ctx);
        }
        // The pollers have stopped and retired everything: their notices finish the teardown.
        self.drain_notices();
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.finish_conn(id);
        }
        self.listeners.clear();
    }
}
