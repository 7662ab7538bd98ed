//! The shm half of the control thread: [`ShmControl`], the [`FabricControl`] of `shm://`.
//!
//! It owns the listeners (Unix-domain sockets by name) and every connection's rendezvous socket
//! and segment handle. The data path is the application's (the direct path: no poller is
//! involved; see [`super`]). A hang-up of a rendezvous socket (the peer process closed or died)
//! is reported at once ([`Event::Disconnected`]) and marks the connection disconnected; the
//! application still receives everything the peer published before (its receive calls drain
//! the ring before they report the state). A protocol violation that the application's direct
//! path found (it failed the connection's shared state) is reported on the next
//! [`tick`](FabricControl::tick) ([`Event::Error`]) and the connection closed. The segment's
//! closed mark and the bye on the socket go out when the connection is closed.
//!
//! Accepting never waits on a peer: each accepted socket becomes a pending [`Handshake`] entry
//! whose socket is in the poll set; the control thread runs a step when its message arrives and
//! [`tick`](FabricControl::tick) expires an entry whose step took longer than
//! `ACCEPT_STEP_TIMEOUT` (250 ms), closing its socket. A client that connects and never finishes
//! the handshake costs one entry (at most [`MAX_HANDSHAKES`]; beyond that new connections are
//! refused as busy), not control-thread time. Connecting runs the handshake on the calling
//! thread ([`ShmConnect`]), bounded by its timeout.
//!
//! Liveness: on the engine's liveness beats ([`Beat`], a twelfth of the liveness timeout) it
//! samples the peer's heartbeat word in each segment, and every third beat (a quarter of the
//! timeout) it bumps this side's; a peer whose word has not moved for the timeout fails its
//! connection ([`Event::PeerUnresponsive`]) and the connection is closed as if the application
//! had closed it, so the peer finds it gone when it resumes. Between beats, with no handshake
//! in flight, the control thread sleeps: nothing here runs per message.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use cm::uds::UdsStream;

use super::setup::{self, Established, Handshake, ShmListener, Step};
use super::wire::Segment;
use super::ShmFabric;
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::event::Event;
use crate::fabric::control::{
    self, Accepting, Beat, Ctx, Due, FabricConnect, FabricControl, Handshakes, Liveness,
    PendingSetup, Registry, SetupSide, Watched, ACCEPT_BURST,
};
use crate::fabric::{DirectPath, Fabric};
use crate::link::{ConnParts, Down, Pools};
use crate::poller::{Command, PollerLink};

/// Grace of every close: none. No poller holds an shm connection (the direct path is the
/// application's, and `Connection::drop` has published everything it sent), so a close is
/// finished at once.
const CLOSE_NOW: Option<Duration> = Some(Duration::ZERO);

/// The setup side of one shm connection.
pub(crate) struct ShmSetup {
    stream: UdsStream,
    segment: Segment,
    /// The peer's heartbeat word, as last sampled.
    peer: Liveness,
}

impl SetupSide for ShmSetup {
    fn finish(&mut self) {
        self.segment.mark_closed();
        let _ = self.stream.send_bye();
    }
}

/// Most accepted connections whose handshake is pending at once (over every listener); beyond
/// that a new connection is refused (`Busy`) at once. Bounds what stalled clients can hold.
pub(crate) const MAX_HANDSHAKES: usize = 1024;

/// The shm control state.
pub(crate) struct ShmControl {
    reg: Registry<ShmFabric, ShmListener, ShmSetup>,
    /// Accepted connections whose handshake is under way; their sockets follow the registry's
    /// in the poll set.
    handshakes: Handshakes<Handshake>,
    liveness: Option<Duration>,
    /// The last liveness check (to tell this thread's own stalls from peers' silence).
    last_check: Instant,
}

impl ShmControl {
    pub(crate) fn new(links: Vec<PollerLink<ShmFabric>>, cfg: &Config) -> ShmControl {
        ShmControl {
            reg: Registry::new(links),
            handshakes: Handshakes::new(MAX_HANDSHAKES),
            liveness: cfg.liveness(),
            last_check: Instant::now(),
        }
    }

    /// Registers an established connection: its data path goes to the application (the
    /// direct path), not to a poller; this side keeps the socket and a segment handle for
    /// hang-up detection, heartbeats and the close.
    fn install_est(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: Established,
        raw: String,
    ) -> Result<ConnParts, Error> {
        let Established {
            direct,
            tx_pool,
            rx_pool,
            tx_large,
            rx_large,
            keep,
            segment,
            stream,
        } = est;
        let setup = ShmSetup {
            peer: Liveness::new(segment.peer_state().heartbeat, Instant::now()),
            stream,
            segment,
        };
        let direct: Box<dyn std::any::Any + Send> = Box::new(DirectPath::Shm(direct));
        Ok(self.reg.register_direct(
            ctx,
            direct,
            Pools {
                tx: tx_pool,
                rx: rx_pool,
                tx_large,
                rx_large,
            },
            keep,
            setup,
            raw,
            None,
        ))
    }

    /// Reports and closes connections whose application found a protocol violation on the
    /// direct path (it failed the shared state; there is no poller to retire them).
    fn reap_failed(&mut self, ctx: &mut Ctx<'_>) {
        let failed: Vec<u64> = self
            .reg
            .conns
            .iter()
            .filter(|(_, c)| !c.is_closing() && matches!(c.shared.down(), Some(Down::Failed(_))))
            .map(|(&id, _)| id)
            .collect();
        for id in failed {
            self.report_failed(ctx, id);
            self.reg.close(ctx, id, Command::Remove(id), CLOSE_NOW);
        }
    }

    /// Emits [`Event::Error`] for connection `id` if the application's direct path failed it
    /// and its close has not begun (a failure is reported once: a close begun by the control
    /// thread, e.g. for an unresponsive peer, has reported its own).
    fn report_failed(&mut self, ctx: &mut Ctx<'_>, id: u64) {
        let Some(c) = self.reg.conns.get(&id) else {
            return;
        };
        if c.is_closing() {
            return;
        }
        if let Some(Down::Failed(e)) = c.shared.down() {
            ctx.emit(Event::Error {
                conn: Some(id),
                error: Error::Fabric(e),
            });
        }
    }

    /// Samples every open connection's peer heartbeat word and fails those silent for
    /// `timeout`. After a stall of this control thread itself the observations restart instead.
    fn check_liveness(&mut self, ctx: &mut Ctx<'_>, now: Instant, timeout: Duration) {
        let stalled = control::stalled(self.last_check, now, timeout);
        self.last_check = now;
        let mut silent: Vec<(u64, Duration)> = Vec::new();
        for (&id, c) in self.reg.conns.iter_mut() {
            if c.is_closing() {
                continue;
            }
            let beat = c.setup.segment.peer_state().heartbeat;
            if stalled {
                c.setup.peer = Liveness::new(beat, now);
            } else if let Some(s) = c.setup.peer.observe(beat, now, timeout) {
                silent.push((id, s));
            }
        }
        for (id, silent_for) in silent {
            // Finishing the setup side (at once: no poller holds the connection) marks the
            // segment closed, sends the bye and closes the socket: a peer that resumes sees its
            // connection gone.
            self.reg
                .fail_unresponsive(ctx, id, silent_for, Command::Remove(id), CLOSE_NOW);
        }
    }

    /// Takes up to [`ACCEPT_BURST`] new connections off listener `lid` and starts their
    /// handshakes (nothing here waits for a peer).
    fn accept_on(&mut self, ctx: &mut Ctx<'_>, lid: u64, now: Instant) {
        for _ in 0..ACCEPT_BURST {
            let Some(l) = self.reg.listeners.iter().find(|l| l.id == lid) else {
                return;
            };
            match l.listener.try_accept(now) {
                Ok(None) => return,
                Ok(Some(hs)) if self.handshakes.is_full() => hs.refuse_busy(),
                Ok(Some(hs)) => {
                    // The hello may be there already: try at once.
                    control::advance(self, ctx, lid, hs, now);
                }
                // A failed accept fails only that connection attempt.
                Err(error) => ctx.emit(Event::Error { conn: None, error }),
            }
        }
    }
}

impl PendingSetup for Handshake {
    fn fd(&self) -> RawFd {
        Handshake::fd(self)
    }

    fn deadline(&self) -> Instant {
        Handshake::deadline(self)
    }

    fn timed_out(&self) -> Error {
        Handshake::timed_out(self)
    }
}

impl Accepting for ShmControl {
    type Fabric = ShmFabric;
    type Listener = ShmListener;
    type Setup = ShmSetup;
    type Pending = Handshake;
    type Est = Box<Established>;

    fn reg(&mut self) -> &mut Registry<ShmFabric, ShmListener, ShmSetup> {
        &mut self.reg
    }

    fn pending(&mut self) -> &mut Handshakes<Handshake> {
        &mut self.handshakes
    }

    fn step(
        listener: &ShmListener,
        hs: Handshake,
        cfg: &Config,
        now: Instant,
    ) -> Result<control::Step<Handshake, Box<Established>>, Error> {
        Ok(match listener.advance(hs, cfg, now)? {
            Step::Pending(hs) => control::Step::Pending(hs),
            Step::Done(est) => control::Step::Done(est),
        })
    }

    fn install_accepted(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: Box<Established>,
        raw: String,
    ) -> Result<ConnParts, Error> {
        self.install_est(ctx, *est, raw)
    }
}

impl FabricControl for ShmControl {
    fn scheme(&self) -> &'static str {
        ShmFabric::NAME
    }

    fn connector(&self) -> Arc<dyn FabricConnect> {
        Arc::new(ShmConnect)
    }

    fn listen(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<(u64, mpsc::Receiver<ConnParts>), Error> {
        let Endpoint::Shm { name } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        let listener = ShmListener::bind(name, raw, ctx.cfg)?;
        Ok(self.reg.add_listener(ctx, raw, listener))
    }

    fn unlisten(&mut self, id: u64) -> bool {
        // Its pending handshakes go with it (their sockets close).
        control::unlisten(self, id)
    }

    fn install(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: control::Established,
        raw: String,
    ) -> Result<ConnParts, Error> {
        let est = control::downcast::<Established>(est, ShmFabric::NAME)?;
        self.install_est(ctx, est, raw)
    }

    fn drop_conn(&mut self, ctx: &mut Ctx<'_>, id: u64) -> bool {
        // A connection the application failed and dropped before the next tick: report it now.
        self.report_failed(ctx, id);
        self.reg.close(ctx, id, Command::Remove(id), CLOSE_NOW)
    }

    fn fds(&mut self, fds: &mut Vec<libc::pollfd>) {
        self.reg.watch(fds, ShmListener::fd, |c| {
            (!c.is_closing()).then(|| (c.setup.stream.as_raw_fd(), libc::POLLIN | libc::POLLRDHUP))
        });
        self.handshakes.watch(fds);
    }

    fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]) {
        let now = Instant::now();
        // The pending handshakes' sockets come last, in `handshakes` order (nothing changed the
        // table since `fds`). Those with input run their next step first.
        let fds = control::on_ready(self, ctx, fds, now);
        for w in self.reg.ready(fds) {
            match w {
                Watched::Listener(id) => self.accept_on(ctx, id, now),
                Watched::Conn(id) => {
                    let gone = match self.reg.conns.get_mut(&id) {
                        Some(c) => !matches!(c.setup.stream.poll_hangup(), Ok(false)),
                        None => false,
                    };
                    if gone {
                        tracing::debug!(
                            conn = id,
                            cause = "rendezvous socket hung up",
                            "disconnect"
                        );
                        // The application delivers what the peer sent before (its receive
                        // calls drain the ring before they report the state).
                        if let Some(c) = self.reg.conns.get(&id) {
                            c.shared.disconnect();
                        }
                        ctx.emit(Event::Disconnected { conn: id });
                        self.reg.close(ctx, id, Command::PeerGone(id), CLOSE_NOW);
                    }
                }
            }
        }
    }

    fn tick(&mut self, ctx: &mut Ctx<'_>, now: Instant, beat: Option<Beat>) -> Due {
        self.reg.drain(ctx);
        self.reap_failed(ctx);
        // Handshakes whose step ran past its deadline fail (their sockets close).
        self.handshakes.expire(ctx, now);
        if let Some(beat) = beat {
            if beat.heartbeat {
                for c in self.reg.conns.values() {
                    c.setup.segment.bump_heartbeat();
                }
            }
            if let (true, Some(timeout)) = (beat.check, self.liveness) {
                self.check_liveness(ctx, now, timeout);
            }
        }
        Due {
            // Pending handshakes' deadlines, closes' grace, command retries.
            at: control::earliest(self.reg.next_due(now), self.handshakes.next_deadline()),
            // Heartbeats and liveness checks while there are connections.
            beat: !self.reg.conns.is_empty(),
        }
    }

    fn shutdown(&mut self, ctx: &mut Ctx<'_>) {
        self.handshakes.clear();
        self.reg.shutdown(ctx, CLOSE_NOW);
    }
}

/// The connecting side of `shm://`: the rendezvous on the calling thread.
pub(crate) struct ShmConnect;

impl FabricConnect for ShmConnect {
    fn scheme(&self) -> &'static str {
        ShmFabric::NAME
    }

    fn connect(
        &self,
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        timeout: Duration,
    ) -> Result<control::Established, Error> {
        let Endpoint::Shm { name } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        Ok(Box::new(setup::connect(name, raw, cfg, timeout)?))
    }
}
