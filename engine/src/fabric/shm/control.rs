//! The shm half of the control thread: [`ShmControl`], the shm part of the shared
//! [`Control`](crate::fabric::control::Control), the [`FabricControl`] of `shm://`.
//!
//! It owns the listeners (Unix-domain sockets by name) and every connection's rendezvous socket
//! and segment handle. The data path is the application's (the direct path: no poller is
//! involved; see [`super`]). A hang-up of a rendezvous socket (the peer process closed or died)
//! is reported at once ([`Event::Disconnected`]) and marks the connection disconnected; the
//! application still receives everything the peer published before (its receive calls drain
//! the ring before they report the state). A protocol violation that the application's direct
//! path found (it failed the connection's shared state) is reported on the next
//! [`tick`](FabricControl::tick) ([`Event::Error`]) and the connection closed. The segment's
//! closed mark and the bye on the socket go out when the connection is closed; a connection
//! failed because of its peer (unresponsive, or a protocol violation) puts the reason in the
//! mark, and the peer reports it as [`FabricError::PeerAborted`] (an [`Event::Error`] and the
//! error of its calls) rather than a disconnect.
//!
//! Accepting never waits on a peer: each accepted socket becomes a pending [`Handshake`] entry
//! whose socket is in the poll set; the control thread runs a step when its message arrives and
//! [`tick`](FabricControl::tick) expires an entry whose step took longer than
//! `ACCEPT_STEP_TIMEOUT` (250 ms), closing its socket. A client that connects and never finishes
//! the handshake costs one entry (at most [`MAX_HANDSHAKES`]; beyond that new connections are
//! refused as busy), not control-thread time. Connecting runs the handshake on the calling
//! thread ([`Accepting::connect`]), bounded by its timeout.
//!
//! Liveness: on the engine's liveness beats ([`Beat`], a twelfth of the liveness timeout) it
//! samples the peer's heartbeat word in each segment, and every third beat (a quarter of the
//! timeout) it bumps this side's; a peer whose word has not moved for the timeout fails its
//! connection ([`Event::PeerUnresponsive`]) and the connection is closed as if the application
//! had closed it, so the peer finds it gone when it resumes. Between beats, with no handshake
//! in flight, the control thread sleeps: nothing here runs per message.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cm::uds::UdsStream;

use super::setup::{self, Established, Handshake, ShmListener, Step};
use super::wire::Segment;
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::{AbortReason, Error, FabricError};
use crate::event::Event;
#[cfg(doc)]
use crate::fabric::control::FabricControl;
use crate::fabric::control::{
    self, Accept, Accepting, Beat, ConnRec, Ctx, Liveness, NoPollers, PendingSetup, Reg, SetupSide,
};
use crate::fabric::DirectPath;
use crate::link::{ConnParts, Down, Pools};

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
    fn abort(&mut self, reason: AbortReason) {
        // Before the bye (finish): a peer that sees the hang-up reads the reason.
        self.segment.mark_closed_with(reason.code());
    }

    fn finish(&mut self) {
        self.segment.mark_closed();
        let _ = self.stream.send_bye();
    }
}

/// Most accepted connections whose handshake is pending at once (over every listener); beyond
/// that a new connection is refused (`Busy`) at once. Bounds what stalled clients can hold.
pub(crate) const MAX_HANDSHAKES: usize = 1024;

/// The shm part of the control half: liveness state (the registry and the handshakes are the
/// shared [`Control`](control::Control)'s).
pub(crate) struct ShmControl {
    liveness: Option<Duration>,
    /// The last liveness check (to tell this thread's own stalls from peers' silence).
    last_check: Instant,
}

impl ShmControl {
    /// Reports and closes connections whose application found a protocol violation on the
    /// direct path (it failed the shared state; there is no poller to retire them).
    fn reap_failed(reg: &mut Reg<Self>, ctx: &mut Ctx<'_>) {
        let failed: Vec<u64> = reg
            .conns
            .iter()
            .filter(|(_, c)| !c.is_closing() && matches!(c.shared.down(), Some(Down::Failed(_))))
            .map(|(&id, _)| id)
            .collect();
        for id in failed {
            Self::report_failed(reg, ctx, id);
            reg.close(ctx, id, CLOSE_NOW);
        }
    }

    /// Emits [`Event::Error`] for connection `id` if the application's direct path failed it
    /// and its close has not begun (a failure is reported once: a close begun by the control
    /// thread, e.g. for an unresponsive peer, has reported its own).
    fn report_failed(reg: &Reg<Self>, ctx: &mut Ctx<'_>, id: u64) {
        let Some(c) = reg.conns.get(&id) else {
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
    fn check_liveness(
        &mut self,
        reg: &mut Reg<Self>,
        ctx: &mut Ctx<'_>,
        now: Instant,
        timeout: Duration,
    ) {
        let stalled = control::stalled(self.last_check, now, timeout);
        self.last_check = now;
        let mut silent: Vec<(u64, Duration)> = Vec::new();
        for (&id, c) in reg.conns.iter_mut() {
            if c.is_closing() {
                continue;
            }
            let beat = c.setup.segment.peer_state().heartbeat;
            if stalled {
                c.setup.peer = Liveness::new(beat, now);
            } else if let Some(s) = c.setup.peer.observe(beat, now, timeout) {
                silent.push((id, s));
            }
            // For the counters file: when the peer's heartbeat last moved.
            let ago = now.saturating_duration_since(c.setup.peer.since());
            c.shared.live.last_heard_ns.store(
                crate::counters::unix_ns().saturating_sub(ago.as_nanos() as u64),
                Ordering::Relaxed,
            );
        }
        for (id, silent_for) in silent {
            // Finishing the setup side (at once: no poller holds the connection) marks the
            // segment closed, sends the bye and closes the socket: a peer that resumes sees its
            // connection gone.
            let segment = reg.conns.get(&id).map(|c| c.setup.segment.clone());
            reg.fail_unresponsive(ctx, id, silent_for, CLOSE_NOW);
            // An application asleep in a receive (`IdleStrategy::Block`) wakes to see it.
            if let Some(segment) = segment {
                segment.bell().ring();
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
    const SCHEME: &'static str = "shm";
    const MAX_PENDING: usize = MAX_HANDSHAKES;
    type Pollers = NoPollers;
    type Listener = ShmListener;
    type Setup = ShmSetup;
    type Pending = Handshake;
    type Est = Box<Established>;
    type Connect = ();

    fn new(_pollers: &NoPollers, cfg: &Config) -> ShmControl {
        ShmControl {
            liveness: cfg.liveness(),
            last_check: Instant::now(),
        }
    }

    fn connect_side(&self) {}

    fn connect(
        _side: &(),
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        timeout: Duration,
    ) -> Result<Box<Established>, Error> {
        let Endpoint::Shm { name } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        Ok(Box::new(setup::connect(name, raw, cfg, timeout)?))
    }

    fn no_listener(e: &Error) -> bool {
        matches!(e, Error::Connect { source, .. }
            if matches!(source.downcast_ref(), Some(cm::uds::UdsError::NoListener { .. })))
    }

    fn bind(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<ShmListener, Error> {
        let Endpoint::Shm { name } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        ShmListener::bind(name, raw, ctx.cfg)
    }

    fn listener_fd(listener: &ShmListener) -> RawFd {
        listener.fd()
    }

    /// The rendezvous socket of an open connection: its hang-up is the peer's close or death.
    fn conn_fd(c: &ConnRec<ShmSetup>) -> Option<(RawFd, libc::c_short)> {
        (!c.is_closing()).then(|| (c.setup.stream.as_raw_fd(), libc::POLLIN | libc::POLLRDHUP))
    }

    fn try_accept(
        &self,
        listener: &ShmListener,
        _cfg: &Config,
        busy: bool,
        now: Instant,
    ) -> Result<Accept<Handshake>, Error> {
        Ok(match listener.try_accept(now)? {
            None => Accept::Empty,
            Some(hs) if busy => {
                hs.refuse_busy();
                Accept::Refused
            }
            Some(hs) => Accept::Started(hs),
        })
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

    /// Registers an established connection: its data path goes to the application (the
    /// direct path), not to a poller; this side keeps the socket and a segment handle for
    /// hang-up detection, heartbeats and the close.
    fn install(
        &mut self,
        reg: &mut Reg<Self>,
        ctx: &mut Ctx<'_>,
        est: Box<Established>,
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
        } = *est;
        let setup = ShmSetup {
            peer: Liveness::new(segment.peer_state().heartbeat, Instant::now()),
            stream,
            segment,
        };
        Ok(reg.register_direct(
            ctx,
            DirectPath::Shm(direct),
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

    fn close_grace(&self) -> Option<Duration> {
        CLOSE_NOW
    }

    /// Heartbeats and liveness checks while there are connections (liveness on or not: the
    /// heartbeat word is for tooling too).
    fn beats(_cfg: &Config) -> bool {
        true
    }

    /// The rendezvous socket hung up (the peer process closed or died): the connection is
    /// disconnected and closed.
    fn on_conn_ready(&mut self, reg: &mut Reg<Self>, ctx: &mut Ctx<'_>, id: u64) {
        let gone = match reg.conns.get_mut(&id) {
            Some(c) => !matches!(c.setup.stream.poll_hangup(), Ok(false)),
            None => false,
        };
        if gone {
            // The application delivers what the peer sent before (its receive calls drain the
            // ring before they report the state). The peer's close mark says whether it blamed
            // this side (it is written before the bye; a dead peer left none).
            let Some(c) = reg.conns.get(&id) else {
                return;
            };
            match FabricError::peer_close(c.setup.segment.peer_close_code()) {
                e @ FabricError::PeerAborted(_) => c.shared.fail(e),
                _ => c.shared.disconnect(),
            }
            // An application asleep in a receive (`IdleStrategy::Block`) wakes to see it.
            c.setup.segment.bell().ring();
            match c.shared.down() {
                Some(Down::Failed(e)) => {
                    tracing::debug!(conn = id, error = %e, "peer aborted");
                    ctx.emit(Event::Error {
                        conn: Some(id),
                        error: Error::Fabric(e),
                    });
                }
                _ => {
                    tracing::debug!(conn = id, cause = "rendezvous socket hung up", "disconnect");
                    ctx.emit(Event::Disconnected { conn: id });
                }
            }
            reg.close(ctx, id, CLOSE_NOW);
        }
    }

    fn on_tick(
        &mut self,
        reg: &mut Reg<Self>,
        ctx: &mut Ctx<'_>,
        now: Instant,
        beat: Option<Beat>,
    ) {
        Self::reap_failed(reg, ctx);
        if let Some(beat) = beat {
            if beat.heartbeat {
                for c in reg.conns.values() {
                    c.setup.segment.bump_heartbeat();
                    // Only this thread writes it: a load and a store, no read-modify-write.
                    let n = &c.shared.live.heartbeats;
                    n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                }
            }
            if let (true, Some(timeout)) = (beat.check, self.liveness) {
                self.check_liveness(reg, ctx, now, timeout);
            }
        }
    }

    /// A connection the application failed and dropped before the next tick: report it now.
    fn on_drop_conn(&mut self, reg: &mut Reg<Self>, ctx: &mut Ctx<'_>, id: u64) {
        Self::report_failed(reg, ctx, id);
    }
}
