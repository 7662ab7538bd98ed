//! The RDMA half of the engine's control backend (`crate::control::Backend` forwards to it).
//!
//! It owns the rdma_cm listeners, every RDMA connection's rdma_cm id (watched for DISCONNECTED
//! and DEVICE_REMOVAL), the device table (PD, one CQ per poller) and the producer ends of the
//! pollers' RDMA command rings. Established connections are split with
//! [`conn_pair`](crate::conn::conn_pair); the poller half goes to the poller whose CQ the QP was
//! created on, preceded by an [`RdmaCommand::AttachCq`] for that CQ.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rings::Producer;

use super::datapath::{RdmaCommand, RdmaConn, RdmaFabric};
use super::setup::{self, ConnStatus, Established, RdmaDevices, RdmaListener};
use crate::config::Config;
use crate::error::{Error, FabricError};
use crate::event::Event;
use crate::link::{conn_pair, ConnParts, ConnShared};
use crate::poller::{Command, Notice};
use crate::stats::EngineCounters;

/// Most connections accepted per listener per control-loop turn.
const ACCEPT_BURST: usize = 16;

/// The control thread's end of one poller's RDMA rings.
pub(crate) type RdmaPollerLink = crate::control::PollerLink<RdmaFabric>;

struct ListenerRec {
    id: u64,
    raw: String,
    listener: RdmaListener,
    accepts: mpsc::Sender<ConnParts>,
}

struct ConnRec {
    poller: usize,
    /// Gives the poller's place back when the record is dropped.
    _slot: setup::PollerSlot,
    shared: Arc<ConnShared>,
    id: Arc<cm::rdma::CmId>,
    /// Still registered with its poller (no `Retired` notice yet).
    live: bool,
    /// Being closed since then: disconnected once the poller retired it (after posting what
    /// the application queued) or after [`CLOSE_GRACE`].
    closing: Option<Instant>,
}

/// Longest a closing connection waits for its poller before it is disconnected anyway (in
/// run-to-completion mode the poller runs only when the application polls).
const CLOSE_GRACE: Duration = Duration::from_millis(100);

/// What the RDMA backend needs from the engine's backend for one call.
pub(crate) struct Ctx<'a> {
    pub(crate) cfg: &'a Config,
    pub(crate) next_id: &'a mut u64,
    pub(crate) events: &'a mut Producer<Event>,
    pub(crate) counters: &'a EngineCounters,
}

impl Ctx<'_> {
    fn event(&mut self, e: Event) {
        if self.events.push(e).is_err() {
            self.counters.events_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn next_id(&mut self) -> u64 {
        let id = *self.next_id;
        *self.next_id += 1;
        id
    }
}

/// A watched descriptor of the RDMA backend.
#[derive(Clone, Copy)]
enum Watched {
    Listener(u64),
    Conn(u64),
}

/// The RDMA control state.
pub(crate) struct RdmaBackend {
    links: Vec<RdmaPollerLink>,
    devices: Arc<RdmaDevices>,
    listeners: Vec<ListenerRec>,
    conns: HashMap<u64, ConnRec>,
    watched: Vec<Watched>,
}

impl RdmaBackend {
    pub(crate) fn new(links: Vec<RdmaPollerLink>, devices: Arc<RdmaDevices>) -> Self {
        Self {
            links,
            devices,
            listeners: Vec::new(),
            conns: HashMap::new(),
            watched: Vec::new(),
        }
    }

    /// Binds an `rdma://host:port` listener.
    pub(crate) fn listen(
        &mut self,
        ctx: &mut Ctx<'_>,
        host: &str,
        port: u16,
        raw: &str,
    ) -> Result<(u64, mpsc::Receiver<ConnParts>), Error> {
        let listener = RdmaListener::bind(host, port, raw)?;
        let id = ctx.next_id();
        let (tx, rx) = mpsc::channel();
        self.listeners.push(ListenerRec {
            id,
            raw: raw.to_owned(),
            listener,
            accepts: tx,
        });
        Ok((id, rx))
    }

    /// Drops listener `id`; false if it is not an RDMA listener.
    pub(crate) fn unlisten(&mut self, id: u64) -> bool {
        let before = self.listeners.len();
        self.listeners.retain(|l| l.id != id);
        before != self.listeners.len()
    }

    /// Registers an established connection with its poller.
    pub(crate) fn install(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: Established,
        endpoint: String,
    ) -> Result<ConnParts, Error> {
        let pi = est.poller.index();
        if pi >= self.links.len() {
            return Err(Error::Setup(format!("rdma: no poller {pi}")));
        }
        let id = ctx.next_id();
        let Established {
            poller,
            conn,
            tx_pool,
            rx_pool,
            keep,
            id: cm_id,
            cq,
            srq,
            path,
            peer,
            ..
        } = est;
        let (parts, poller_half) =
            conn_pair(id, endpoint.clone(), conn, tx_pool, rx_pool, keep, ctx.cfg);
        self.links[pi].send(Command::Fabric(RdmaCommand::AttachCq(cq, srq)));
        self.links[pi].send(Command::Add(poller_half));
        self.conns.insert(
            id,
            ConnRec {
                poller: pi,
                _slot: poller,
                shared: parts.shared.clone(),
                id: cm_id,
                live: true,
                closing: None,
            },
        );
        ctx.counters
            .connections_opened
            .fetch_add(1, Ordering::Relaxed);
        // Which device/port/GID rdma_cm chose: always in the Connected event; also printed on
        // the control thread (never a poller) when SPINWIRE_RDMA_LOG is set.
        let path = path.map(|p| p.to_string());
        if std::env::var_os("SPINWIRE_RDMA_LOG").is_some() {
            match &path {
                Some(p) => eprintln!("spinwire rdma: connection {id} to {peer} via {p}"),
                None => eprintln!("spinwire rdma: connection {id} to {peer}"),
            }
        }
        ctx.event(Event::Connected {
            conn: id,
            peer: endpoint,
            path,
        });
        Ok(parts)
    }

    /// Tears down connection `id`'s setup side; false if it is not an RDMA connection.
    pub(crate) fn drop_conn(&mut self, ctx: &mut Ctx<'_>, id: u64) -> bool {
        let Some(rec) = self.conns.get_mut(&id) else {
            return false;
        };
        if rec.closing.is_some() {
            return true;
        }
        rec.closing = Some(Instant::now());
        ctx.counters
            .connections_closed
            .fetch_add(1, Ordering::Relaxed);
        if rec.live {
            // Disconnect once the poller has retired it: its last service posts what the
            // application queued before closing.
            let poller = rec.poller;
            self.links[poller].send(Command::Remove(id));
        } else {
            self.finish_close(id);
        }
        true
    }

    /// Disconnects and forgets connection `id` (its QP and pools go when the last handle does).
    fn finish_close(&mut self, id: u64) {
        if let Some(rec) = self.conns.remove(&id) {
            setup::close(&rec.id);
        }
    }

    fn accept_on(&mut self, ctx: &mut Ctx<'_>, lid: u64) {
        for _ in 0..ACCEPT_BURST {
            let Some(l) = self.listeners.iter().find(|l| l.id == lid) else {
                return;
            };
            match l.listener.try_accept(ctx.cfg, &self.devices) {
                Ok(None) => return,
                Ok(Some(est)) => {
                    let raw = l.raw.clone();
                    match self.install(ctx, est, raw) {
                        Ok(parts) => {
                            let id = parts.id;
                            let sent = self
                                .listeners
                                .iter()
                                .find(|l| l.id == lid)
                                .map(|l| l.accepts.send(parts).is_ok());
                            if sent != Some(true) {
                                self.drop_conn(ctx, id);
                            }
                        }
                        Err(error) => ctx.event(Event::Error { conn: None, error }),
                    }
                }
                Err(error) => ctx.event(Event::Error { conn: None, error }),
            }
        }
    }

    fn on_notice(&mut self, ctx: &mut Ctx<'_>, n: Notice<RdmaConn>) {
        let Notice::Retired { conn, error } = n;
        let id = conn.id;
        let closing = self.conns.get_mut(&id).map(|rec| {
            rec.live = false;
            rec.closing.is_some()
        });
        match (closing, error) {
            // Already closed and disconnected (reported then).
            (None, _) => {}
            // Closed by the application or after the peer's DISCONNECTED: retired now.
            (Some(true), _) => self.finish_close(id),
            (Some(false), Some(FabricError::PeerClosed)) => {
                conn.shared.disconnect();
                ctx.event(Event::Disconnected { conn: id });
                self.drop_conn(ctx, id);
            }
            (Some(false), Some(e)) => {
                ctx.event(Event::Error {
                    conn: Some(id),
                    error: Error::Fabric(e),
                });
                self.drop_conn(ctx, id);
            }
            // Retired without being asked (not expected): close it.
            (Some(false), None) => {
                self.drop_conn(ctx, id);
            }
        }
        // The poller half (QP handle, pools) is released here, on the control thread.
        drop(conn);
    }

    /// Drains the pollers' notices (call every tick).
    pub(crate) fn drain_notices(&mut self, ctx: &mut Ctx<'_>) {
        for pi in 0..self.links.len() {
            self.links[pi].flush();
            while let Ok(n) = self.links[pi].notices.pop() {
                self.on_notice(ctx, n);
            }
        }
        // Closing connections whose poller has not retired them in time.
        let now = Instant::now();
        let late: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.closing
                    .is_some_and(|t| now.duration_since(t) >= CLOSE_GRACE)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            self.finish_close(id);
        }
    }

    /// Appends the descriptors to watch: listeners' and connections' event channels.
    pub(crate) fn fds(&mut self, fds: &mut Vec<libc::pollfd>) {
        self.watched.clear();
        for l in &self.listeners {
            fds.push(libc::pollfd {
                fd: l.listener.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            self.watched.push(Watched::Listener(l.id));
        }
        for (&id, c) in &self.conns {
            fds.push(libc::pollfd {
                fd: c.id.channel().fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            self.watched.push(Watched::Conn(id));
        }
    }

    /// Handles the ready descriptors among those pushed by [`RdmaBackend::fds`].
    pub(crate) fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]) {
        let ready: Vec<Watched> = fds
            .iter()
            .zip(self.watched.iter())
            .filter(|(p, _)| p.revents != 0)
            .map(|(_, w)| *w)
            .collect();
        for w in ready {
            match w {
                Watched::Listener(id) => self.accept_on(ctx, id),
                Watched::Conn(id) => {
                    let status = match self.conns.get(&id) {
                        Some(c) => setup::poll_events(&c.id),
                        None => continue,
                    };
                    match status {
                        ConnStatus::Alive => {}
                        ConnStatus::Disconnected => {
                            match self.conns.get(&id) {
                                // Closing anyway: the peer just answered our disconnect.
                                Some(c) if c.closing.is_some() => continue,
                                Some(c) => c.shared.disconnect(),
                                None => continue,
                            }
                            ctx.event(Event::Disconnected { conn: id });
                            self.drop_conn(ctx, id);
                        }
                        ConnStatus::DeviceRemoved => {
                            if let Some(c) = self.conns.get(&id) {
                                c.shared.fail(FabricError::PeerClosed);
                            }
                            ctx.event(Event::Error {
                                conn: Some(id),
                                error: Error::Setup("rdma device removed".into()),
                            });
                            self.drop_conn(ctx, id);
                        }
                    }
                }
            }
        }
    }

    /// Whether any connection needs periodic attention.
    pub(crate) fn is_idle(&self) -> bool {
        self.conns.is_empty()
    }

    /// Closes everything (engine shutdown).
    pub(crate) fn shutdown(&mut self, ctx: &mut Ctx<'_>) {
        self.drain_notices(ctx);
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.drop_conn(ctx, id);
        }
        self.listeners.clear();
        self.drain_notices(ctx);
        // The pollers are stopped by now: disconnect whatever is left.
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.finish_close(id);
        }
    }
}
