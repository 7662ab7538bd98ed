//! The records every fabric's control half keeps: its pollers ([`Pollers`]), listeners
//! ([`ListenerRec`]) and connections ([`ConnRec`]), in a [`Registry`], with the one teardown
//! model (see [the module docs](super)).

use std::any::Any;
use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::error::{Error, FabricError, SetupError};
use crate::event::Event;
use crate::fabric::{DirectPath, Fabric};
use crate::link::{conn_pair, direct_parts, ConnParts, ConnShared, Down, Pools};
use crate::poller::{Command, Notice, PollerLink};

use super::{earliest, Ctx, SetupSide, COMMAND_RETRY};

/// The pollers that serve a fabric's connections, as its [`Registry`] drives them: the control
/// thread's ends of their rings ([`PollerLink`]s), or none for a fabric whose connections all
/// take the direct path ([`NoPollers`]).
pub(crate) trait Pollers: Send {
    /// How many pollers there are.
    fn count(&self) -> usize;

    /// Tells poller `pi` to stop serving connection `id` after its last service pass
    /// ([`Command::Remove`]).
    fn remove(&mut self, pi: usize, id: u64);

    /// Tells poller `pi` that the peer of connection `id` closed it: deliver what it sent,
    /// then retire it ([`Command::PeerClosed`]).
    // Used only by a fabric whose control half sees a peer's close out of band (rdma).
    #[allow(dead_code)]
    fn peer_closed(&mut self, pi: usize, id: u64);

    /// Pushes poller `pi`'s commands that did not fit its ring yet, as far as they fit now.
    fn flush(&mut self, pi: usize);

    /// Poller `pi`'s next retired connection, if any: its id and why the data path gave it up
    /// (`None`: the control thread asked). The poller's half of it is dropped here, on the
    /// control thread.
    fn retired(&mut self, pi: usize) -> Option<(u64, Option<FabricError>)>;

    /// Commands wait for room in a poller's ring (the control thread retries them soon).
    fn has_pending(&self) -> bool;
}

impl<F: Fabric> Pollers for Vec<PollerLink<F>> {
    fn count(&self) -> usize {
        self.len()
    }

    fn remove(&mut self, pi: usize, id: u64) {
        if let Some(link) = self.get_mut(pi) {
            link.send(Command::Remove(id));
        }
    }

    fn peer_closed(&mut self, pi: usize, id: u64) {
        if let Some(link) = self.get_mut(pi) {
            link.send(Command::PeerClosed(id));
        }
    }

    fn flush(&mut self, pi: usize) {
        if let Some(link) = self.get_mut(pi) {
            link.flush();
        }
    }

    fn retired(&mut self, pi: usize) -> Option<(u64, Option<FabricError>)> {
        let link = self.get_mut(pi)?;
        let Notice::Retired { conn, error } = link.notices.pop().ok()?;
        link.load = link.load.saturating_sub(1);
        // The poller half (rings, fabric handles) is released here, on the control thread.
        Some((conn.id, error))
    }

    fn has_pending(&self) -> bool {
        self.iter().any(PollerLink::has_pending)
    }
}

/// The pollers of a fabric whose connections all take the direct path (shm): none. Its
/// connections are registered with [`Registry::register_direct`] and never reach a poller.
#[derive(Debug, Default)]
pub(crate) struct NoPollers;

impl Pollers for NoPollers {
    fn count(&self) -> usize {
        0
    }

    fn remove(&mut self, _pi: usize, _id: u64) {}

    fn peer_closed(&mut self, _pi: usize, _id: u64) {}

    fn flush(&mut self, _pi: usize) {}

    fn retired(&mut self, _pi: usize) -> Option<(u64, Option<FabricError>)> {
        None
    }

    fn has_pending(&self) -> bool {
        false
    }
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
    /// The poller that still serves it (no `Retired` notice yet); `None` for a direct path and
    /// once the poller has let go.
    poller: Option<usize>,
    pub(crate) shared: Arc<ConnShared>,
    /// Closing since then: finished on the `Retired` notice or when `grace` has passed.
    closing: Option<Instant>,
    grace: Option<Duration>,
    /// The listener that accepted it, if one did (for its connection maximum).
    listener: Option<u64>,
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

/// The records every fabric's control half keeps: its pollers, listeners and connections.
pub(crate) struct Registry<P, L, R> {
    pub(crate) pollers: P,
    pub(crate) listeners: Vec<ListenerRec<L>>,
    pub(crate) conns: HashMap<u64, ConnRec<R>>,
    watched: Vec<Watched>,
}

impl<P: Pollers, L, R: SetupSide> Registry<P, L, R> {
    pub(crate) fn new(pollers: P) -> Self {
        Registry {
            pollers,
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

    /// Registers an established connection with a direct path (no poller: the application
    /// drives it, see `crate::fabric::DirectPath`) and emits [`Event::Connected`]. Its close
    /// is finished at once (nothing to retire).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn register_direct(
        &mut self,
        ctx: &mut Ctx<'_>,
        direct: DirectPath,
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
                poller: None,
                shared: parts.shared.clone(),
                closing: None,
                grace: None,
                listener: None,
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

    /// Connections accepted by listener `lid` and not closing.
    pub(crate) fn open_on(&self, lid: u64) -> usize {
        self.conns
            .values()
            .filter(|c| c.listener == Some(lid) && !c.is_closing())
            .count()
    }

    /// Hands an accepted connection to listener `lid`'s application side; returns the id back
    /// when nobody will take it (the listener is gone), for the caller to close.
    pub(crate) fn hand_over(&mut self, lid: u64, parts: ConnParts) -> Option<u64> {
        let id = parts.id;
        if let Some(rec) = self.conns.get_mut(&id) {
            rec.listener = Some(lid);
        }
        let sent = self
            .listeners
            .iter()
            .find(|l| l.id == lid)
            .map(|l| l.accepts.send(parts).is_ok());
        (sent != Some(true)).then_some(id)
    }

    /// Begins closing connection `id`: marks it closing, counts it closed and, while its poller
    /// still serves it, tells the poller to remove it; the setup side is finished when the poller lets go or after
    /// `grace` (`Some(ZERO)`: now; `None`: only when the poller lets go). False if `id` is not
    /// a connection of this fabric; closing twice does nothing.
    pub(crate) fn close(&mut self, ctx: &mut Ctx<'_>, id: u64, grace: Option<Duration>) -> bool {
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
        if let Some(pi) = rec.poller {
            self.pollers.remove(pi, id);
            if grace == Some(Duration::ZERO) {
                self.finish(id);
            }
        } else {
            self.finish(id);
        }
        true
    }

    /// The peer of connection `id` closed it, as the fabric's control half saw (not its data
    /// path): its poller delivers what the peer sent first, then retires it as disconnected
    /// (then [`Event::Disconnected`] is emitted and it is closed, as for a close the data path
    /// saw). Without a poller (already retired, or a direct path) it is disconnected, reported
    /// and closed with `grace` now. Nothing happens to a connection already closing.
    // Used only by a fabric whose control half sees a peer's close out of band (rdma).
    #[allow(dead_code)]
    pub(crate) fn peer_closed(&mut self, ctx: &mut Ctx<'_>, id: u64, grace: Option<Duration>) {
        let Some(rec) = self.conns.get(&id) else {
            return;
        };
        if rec.closing.is_some() {
            return;
        }
        match rec.poller {
            Some(pi) => self.pollers.peer_closed(pi, id),
            None => {
                rec.shared.disconnect();
                ctx.emit(Event::Disconnected { conn: id });
                self.close(ctx, id, grace);
            }
        }
    }

    /// Fails connection `id` because its peer stopped proving it is alive: the application sees
    /// [`FabricError::PeerUnresponsive`] from now on, [`Event::PeerUnresponsive`] is emitted and
    /// the connection is closed like a close by the application (removed from its poller, the
    /// setup side finished after `grace`), which tells the peer, should it resume, that it is
    /// gone.
    pub(crate) fn fail_unresponsive(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        silent_for: Duration,
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
        self.close(ctx, id, grace);
    }

    /// Releases the setup side of connection `id` and forgets it; a connection that failed
    /// because of its peer tells the peer why first ([`SetupSide::abort`]).
    pub(crate) fn finish(&mut self, id: u64) {
        if let Some(mut rec) = self.conns.remove(&id) {
            if let Some(Down::Failed(e)) = rec.shared.down() {
                if let Some(reason) = e.abort_reason() {
                    rec.setup.abort(reason);
                }
            }
            rec.setup.finish();
        }
    }

    /// Handles a poller's `Retired` notice: a close the control thread began is finished; a
    /// connection the poller gave up on by itself is reported ([`Event::Disconnected`] for a
    /// clean close by the peer, [`Event::Error`] for a failure; a failure is reported even
    /// while closing, since a poller retires a connection once) and closed.
    fn on_retired(&mut self, ctx: &mut Ctx<'_>, id: u64, error: Option<FabricError>) {
        if let Some(rec) = self.conns.get_mut(&id) {
            rec.poller = None;
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
                self.close(ctx, id, Some(Duration::ZERO));
            }
        }
    }

    /// Drains every poller's notices, then finishes closes whose grace has run out.
    pub(crate) fn drain(&mut self, ctx: &mut Ctx<'_>) {
        for pi in 0..self.pollers.count() {
            self.pollers.flush(pi);
            while let Some((id, error)) = self.pollers.retired(pi) {
                self.on_retired(ctx, id, error);
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
        let retry = self.pollers.has_pending().then(|| now + COMMAND_RETRY);
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
    /// connection, so their notices finish most; the rest are closed with `grace`, and whatever
    /// is still left is finished at the end.
    pub(crate) fn shutdown(&mut self, ctx: &mut Ctx<'_>, grace: Option<Duration>) {
        self.drain(ctx);
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(ctx, id, grace);
        }
        self.listeners.clear();
        self.drain(ctx);
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.finish(id);
        }
    }
}

impl<F: Fabric, L, R: SetupSide> Registry<Vec<PollerLink<F>>, L, R> {
    /// The least-loaded poller below `max` connections.
    ///
    /// # Errors
    ///
    /// [`Error::Setup`] when every poller is at its connection limit.
    pub(crate) fn least_loaded(&self, max: usize) -> Result<usize, Error> {
        self.pollers
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
        if pi >= self.pollers.len() {
            return Err(Error::Setup(SetupError::NoPoller {
                fabric: F::NAME,
                poller: pi,
            }));
        }
        let id = ctx.next_id();
        let (parts, poller_half) =
            conn_pair(id, peer.clone(), new.conn, new.pools, new.keep, ctx.cfg);
        let link = &mut self.pollers[pi];
        if let Some(cmd) = attach {
            link.send(Command::Fabric(cmd));
        }
        link.send(Command::Add(poller_half));
        link.load += 1;
        self.conns.insert(
            id,
            ConnRec {
                poller: Some(pi),
                shared: parts.shared.clone(),
                closing: None,
                grace: None,
                listener: None,
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
}
