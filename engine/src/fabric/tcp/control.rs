//! The TCP half of the control thread: [`TcpControl`], the [`FabricControl`] of `tcp://`.
//!
//! It owns the listening sockets and the producer ends of the pollers' TCP command rings.
//! Accepting never waits on a peer: each accepted socket becomes a pending [`Handshake`] entry
//! whose socket is in the poll set; its hello is read when it arrives and the reply goes out at
//! once; [`tick`](FabricControl::tick) expires an entry whose hello did not arrive within
//! `ACCEPT_TIMEOUT` (1 s), closing its socket. At most [`MAX_HANDSHAKES`] are pending; beyond
//! that new connections are refused as busy. Connecting runs on the calling thread
//! ([`TcpConnect`]), bounded by its timeout.
//!
//! Established connections' sockets are not watched here: the poller sees the peer's end of
//! stream or reset itself (after delivering what came before), and sends heartbeats and checks
//! the peer's liveness in [`check_peer`](crate::fabric::FabricConn::check_peer). Finishing a
//! connection's setup side shuts its socket down, so the peer sees the end of stream even when
//! a run-to-completion poller never runs again.

use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::setup::{self, Established, Handshake, Step, TcpListenerState};
use super::sys;
use super::TcpFabric;
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::event::Event;
use crate::fabric::control::{
    self, Accepting, Beat, Ctx, Due, FabricConnect, FabricControl, Handshakes, NewConn,
    PendingSetup, Registry, SetupSide, Watched, ACCEPT_BURST,
};
use crate::fabric::Fabric;
use crate::link::ConnParts;
use crate::poller::{Command, PollerLink};

/// Most accepted connections whose handshake is pending at once (over every listener).
pub(crate) const MAX_HANDSHAKES: usize = 1024;

/// The setup side of one TCP connection: the socket, shared with the poller's half.
pub(crate) struct TcpSetup {
    sock: Arc<TcpStream>,
}

impl SetupSide for TcpSetup {
    fn finish(&mut self) {
        sys::shutdown(self.sock.as_raw_fd());
    }
}

/// The TCP control state.
pub(crate) struct TcpControl {
    reg: Registry<TcpFabric, TcpListenerState, TcpSetup>,
    /// Accepted connections whose hello is awaited; their sockets follow the registry's in the
    /// poll set.
    handshakes: Handshakes<Handshake>,
    /// Grace of a close by the application (as for shm): none with dedicated pollers, zero in
    /// run-to-completion mode.
    close_grace: Option<Duration>,
}

impl TcpControl {
    pub(crate) fn new(links: Vec<PollerLink<TcpFabric>>, cfg: &Config) -> TcpControl {
        TcpControl {
            reg: Registry::new(links),
            handshakes: Handshakes::new(MAX_HANDSHAKES),
            close_grace: cfg.run_to_completion().then_some(Duration::ZERO),
        }
    }

    fn install_est(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: Established,
        raw: String,
    ) -> Result<ConnParts, Error> {
        let poller = self.reg.least_loaded(ctx.cfg.max_connections_per_poller)?;
        let Established {
            conn,
            pools,
            keep,
            peer,
        } = est;
        let sock = conn.socket().clone();
        let new = NewConn {
            poller,
            conn,
            pools,
            keep,
            setup: TcpSetup { sock },
            path: Some(peer.to_string()),
        };
        self.reg.register(ctx, new, raw, None)
    }

    fn accept_on(&mut self, ctx: &mut Ctx<'_>, lid: u64, now: Instant) {
        for _ in 0..ACCEPT_BURST {
            let Some(l) = self.reg.listeners.iter().find(|l| l.id == lid) else {
                return;
            };
            match l.listener.try_accept(now) {
                Ok(None) => return,
                Ok(Some(hs)) if self.handshakes.is_full() => {
                    hs.refuse_busy(l.listener.params());
                }
                // The hello may be there already: try at once.
                Ok(Some(hs)) => control::advance(self, ctx, lid, hs, now),
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

impl Accepting for TcpControl {
    type Fabric = TcpFabric;
    type Listener = TcpListenerState;
    type Setup = TcpSetup;
    type Pending = Handshake;
    type Est = Box<Established>;

    fn reg(&mut self) -> &mut Registry<TcpFabric, TcpListenerState, TcpSetup> {
        &mut self.reg
    }

    fn pending(&mut self) -> &mut Handshakes<Handshake> {
        &mut self.handshakes
    }

    fn step(
        listener: &TcpListenerState,
        hs: Handshake,
        cfg: &Config,
        _now: Instant,
    ) -> Result<control::Step<Handshake, Box<Established>>, Error> {
        Ok(match listener.advance(hs, cfg)? {
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

impl FabricControl for TcpControl {
    fn scheme(&self) -> &'static str {
        TcpFabric::NAME
    }

    fn connector(&self) -> Arc<dyn FabricConnect> {
        Arc::new(TcpConnect)
    }

    fn listen(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<(u64, mpsc::Receiver<ConnParts>), Error> {
        let Endpoint::Tcp { host, port } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        let listener = TcpListenerState::bind(host, *port, raw, ctx.cfg)?;
        if let Some(addr) = listener.local_addr() {
            tracing::debug!(endpoint = raw, %addr, "tcp listener bound");
        }
        Ok(self.reg.add_listener(ctx, raw, listener))
    }

    fn unlisten(&mut self, id: u64) -> bool {
        control::unlisten(self, id)
    }

    fn install(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: control::Established,
        raw: String,
    ) -> Result<ConnParts, Error> {
        let est = control::downcast::<Established>(est, TcpFabric::NAME)?;
        self.install_est(ctx, est, raw)
    }

    fn drop_conn(&mut self, ctx: &mut Ctx<'_>, id: u64) -> bool {
        self.reg
            .close(ctx, id, Command::Remove(id), self.close_grace)
    }

    fn fds(&mut self, fds: &mut Vec<libc::pollfd>) {
        self.reg.watch(fds, TcpListenerState::fd, |_| None);
        self.handshakes.watch(fds);
    }

    fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]) {
        let now = Instant::now();
        let fds = control::on_ready(self, ctx, fds, now);
        for w in self.reg.ready(fds) {
            if let Watched::Listener(id) = w {
                self.accept_on(ctx, id, now);
            }
        }
    }

    fn tick(&mut self, ctx: &mut Ctx<'_>, now: Instant, _beat: Option<Beat>) -> Due {
        self.reg.drain(ctx);
        self.handshakes.expire(ctx, now);
        Due {
            at: control::earliest(self.reg.next_due(now), self.handshakes.next_deadline()),
            // The pollers' liveness checks and heartbeats run by the coarse clock, which the
            // beats advance.
            beat: ctx.cfg.liveness().is_some() && !self.reg.conns.is_empty(),
        }
    }

    fn shutdown(&mut self, ctx: &mut Ctx<'_>) {
        self.handshakes.clear();
        self.reg.shutdown(ctx, self.close_grace);
    }
}

/// The connecting side of `tcp://`: connect and handshake on the calling thread.
pub(crate) struct TcpConnect;

impl FabricConnect for TcpConnect {
    fn scheme(&self) -> &'static str {
        TcpFabric::NAME
    }

    fn connect(
        &self,
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        timeout: Duration,
    ) -> Result<control::Established, Error> {
        let Endpoint::Tcp { host, port } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        Ok(Box::new(setup::connect(host, *port, raw, cfg, timeout)?))
    }
}
