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
use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::setup::{self, Established, Handshake, Step, TcpListenerState};
use super::sys;
use super::TcpFabric;
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::{Error, SetupError};
use crate::event::Event;
use crate::fabric::control::{
    self, Ctx, FabricConnect, FabricControl, NewConn, Registry, SetupSide, Watched, ACCEPT_BURST,
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
    /// Accepted connections whose hello is awaited, with their listener's id; their sockets
    /// follow the registry's in the poll set, in this order.
    handshakes: Vec<(u64, Handshake)>,
    watched_handshakes: usize,
    /// Grace of a close by the application (as for shm): none with dedicated pollers, zero in
    /// run-to-completion mode.
    close_grace: Option<Duration>,
}

impl TcpControl {
    pub(crate) fn new(links: Vec<PollerLink<TcpFabric>>, cfg: &Config) -> TcpControl {
        TcpControl {
            reg: Registry::new(links),
            handshakes: Vec::new(),
            watched_handshakes: 0,
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
            tx_pool,
            rx_pool,
            keep,
            peer,
        } = est;
        let sock = conn.socket().clone();
        let new = NewConn {
            poller,
            conn,
            tx_pool,
            rx_pool,
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
                Ok(Some(hs)) if self.handshakes.len() >= MAX_HANDSHAKES => {
                    hs.refuse_busy(l.listener.params());
                }
                // The hello may be there already: try at once.
                Ok(Some(hs)) => self.advance(ctx, lid, hs),
                Err(error) => ctx.emit(Event::Error { conn: None, error }),
            }
        }
    }

    fn advance(&mut self, ctx: &mut Ctx<'_>, lid: u64, hs: Handshake) {
        let Some(l) = self.reg.listeners.iter().find(|l| l.id == lid) else {
            return;
        };
        let step = l.listener.advance(hs, ctx.cfg);
        let raw = l.raw.clone();
        match step {
            Ok(Step::Pending(hs)) => self.handshakes.push((lid, hs)),
            Ok(Step::Done(est)) => match self.install_est(ctx, *est, raw) {
                Ok(parts) => {
                    if let Some(id) = self.reg.hand_over(lid, parts) {
                        self.drop_conn(ctx, id);
                    }
                }
                Err(error) => ctx.emit(Event::Error { conn: None, error }),
            },
            // A failed handshake fails only that connection attempt.
            Err(error) => ctx.emit(Event::Error { conn: None, error }),
        }
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
        self.handshakes.retain(|(lid, _)| *lid != id);
        self.reg.unlisten(id)
    }

    fn install(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: control::Established,
        raw: String,
    ) -> Result<ConnParts, Error> {
        let est = est
            .downcast::<Established>()
            .map_err(|_| Error::Setup(SetupError::WrongFabric { fabric: "tcp" }))?;
        self.install_est(ctx, *est, raw)
    }

    fn drop_conn(&mut self, ctx: &mut Ctx<'_>, id: u64) -> bool {
        self.reg
            .close(ctx, id, Command::Remove(id), self.close_grace)
    }

    fn fds(&mut self, fds: &mut Vec<libc::pollfd>) {
        self.reg.watch(fds, TcpListenerState::fd, |_| None);
        for (_, hs) in &self.handshakes {
            fds.push(libc::pollfd {
                fd: hs.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        self.watched_handshakes = self.handshakes.len();
    }

    fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]) {
        let now = Instant::now();
        let n = self
            .watched_handshakes
            .min(fds.len())
            .min(self.handshakes.len());
        let (fds, hs_fds) = fds.split_at(fds.len() - n);
        if hs_fds.iter().any(|p| p.revents != 0) {
            let mut all = std::mem::take(&mut self.handshakes).into_iter();
            for (p, (lid, hs)) in hs_fds.iter().zip(all.by_ref()) {
                if p.revents != 0 {
                    self.advance(ctx, lid, hs);
                } else {
                    self.handshakes.push((lid, hs));
                }
            }
            self.handshakes.extend(all);
        }
        for w in self.reg.ready(fds) {
            if let Watched::Listener(id) = w {
                self.accept_on(ctx, id, now);
            }
        }
    }

    fn tick(&mut self, ctx: &mut Ctx<'_>, now: Instant) -> bool {
        self.reg.drain(ctx);
        if self.handshakes.iter().any(|(_, hs)| hs.deadline() <= now) {
            let (late, keep) = std::mem::take(&mut self.handshakes)
                .into_iter()
                .partition(|(_, hs)| hs.deadline() <= now);
            self.handshakes = keep;
            for (_, hs) in late {
                ctx.emit(Event::Error {
                    conn: None,
                    error: hs.timed_out(),
                });
            }
        }
        !self.reg.conns.is_empty() || !self.handshakes.is_empty()
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
