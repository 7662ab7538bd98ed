//! The shm half of the control thread: [`ShmControl`], the [`FabricControl`] of `shm://`.
//!
//! It owns the listeners (Unix-domain sockets by name), every connection's rendezvous socket and
//! segment handle, and the producer ends of the pollers' shm command rings. A hang-up of a
//! rendezvous socket (the peer process closed or died) is reported at once
//! ([`Event::Disconnected`]) and tells the poller to deliver what the peer sent before and then
//! drop the connection (`PeerGone`). The segment's closed mark and the bye on the socket go out
//! only once the poller has let go, after this side's last sends were posted.
//!
//! Accepting runs the handshake on the control thread (each step bounded by
//! `ACCEPT_STEP_TIMEOUT`, 250 ms); connecting runs it on the calling thread ([`ShmConnect`]).

use std::os::fd::AsRawFd;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use cm::uds::UdsStream;

use super::setup::{self, Established, ShmListener};
use super::wire::Segment;
use super::ShmFabric;
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

/// How often this side bumps its heartbeat word in each segment.
const HEARTBEAT_EVERY: Duration = Duration::from_millis(100);

/// The setup side of one shm connection.
pub(crate) struct ShmSetup {
    stream: UdsStream,
    segment: Segment,
}

impl SetupSide for ShmSetup {
    fn finish(&mut self) {
        self.segment.mark_closed();
        let _ = self.stream.send_bye();
    }
}

/// The shm control state.
pub(crate) struct ShmControl {
    reg: Registry<ShmFabric, ShmListener, ShmSetup>,
    /// Grace of a close by the application: with dedicated pollers, none (the poller's
    /// `Retired` notice finishes it, after its last service pass posted the queued sends); in
    /// run-to-completion mode zero (that poller turns only when the application polls, which it
    /// may never do again; `Connection::drop` already flushed the queued sends).
    close_grace: Option<Duration>,
    last_heartbeat: Instant,
}

impl ShmControl {
    pub(crate) fn new(links: Vec<PollerLink<ShmFabric>>, cfg: &Config) -> ShmControl {
        ShmControl {
            reg: Registry::new(links),
            close_grace: cfg.run_to_completion().then_some(Duration::ZERO),
            last_heartbeat: Instant::now(),
        }
    }

    /// Hands an established connection to the least-loaded poller.
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
            segment,
            stream,
        } = est;
        let new = NewConn {
            poller,
            conn,
            tx_pool,
            rx_pool,
            keep,
            setup: ShmSetup { stream, segment },
            path: None,
        };
        self.reg.register(ctx, new, raw, None)
    }

    fn accept_on(&mut self, ctx: &mut Ctx<'_>, lid: u64) {
        for _ in 0..ACCEPT_BURST {
            let Some(l) = self.reg.listeners.iter().find(|l| l.id == lid) else {
                return;
            };
            match l.listener.try_accept(ctx.cfg) {
                Ok(None) => return,
                Ok(Some(est)) => {
                    let raw = l.raw.clone();
                    match self.install_est(ctx, est, raw) {
                        Ok(parts) => {
                            if let Some(id) = self.reg.hand_over(lid, parts) {
                                // The listener is gone: nobody will take this connection.
                                self.drop_conn(ctx, id);
                            }
                        }
                        Err(error) => ctx.emit(Event::Error { conn: None, error }),
                    }
                }
                // A failed handshake fails only that connection attempt.
                Err(error) => ctx.emit(Event::Error { conn: None, error }),
            }
        }
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
            .map_err(|_| Error::Setup(SetupError::WrongFabric { fabric: "shm" }))?;
        self.install_est(ctx, *est, raw)
    }

    fn drop_conn(&mut self, ctx: &mut Ctx<'_>, id: u64) -> bool {
        self.reg
            .close(ctx, id, Command::Remove(id), self.close_grace)
    }

    fn fds(&mut self, fds: &mut Vec<libc::pollfd>) {
        self.reg.watch(fds, ShmListener::fd, |c| {
            (!c.is_closing()).then(|| (c.setup.stream.as_raw_fd(), libc::POLLIN | libc::POLLRDHUP))
        });
    }

    fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]) {
        for w in self.reg.ready(fds) {
            match w {
                Watched::Listener(id) => self.accept_on(ctx, id),
                Watched::Conn(id) => {
                    let gone = match self.reg.conns.get_mut(&id) {
                        Some(c) => !matches!(c.setup.stream.poll_hangup(), Ok(false)),
                        None => false,
                    };
                    if gone {
                        // The poller delivers what the peer sent before, then marks it
                        // disconnected for the application (within microseconds).
                        tracing::debug!(
                            conn = id,
                            cause = "rendezvous socket hung up",
                            "disconnect"
                        );
                        ctx.emit(Event::Disconnected { conn: id });
                        self.reg.close(ctx, id, Command::PeerGone(id), None);
                    }
                }
            }
        }
    }

    fn tick(&mut self, ctx: &mut Ctx<'_>, now: Instant) -> bool {
        self.reg.drain(ctx);
        if now.duration_since(self.last_heartbeat) >= HEARTBEAT_EVERY {
            self.last_heartbeat = now;
            for c in self.reg.conns.values() {
                c.setup.segment.bump_heartbeat();
            }
        }
        !self.reg.conns.is_empty()
    }

    fn shutdown(&mut self, ctx: &mut Ctx<'_>) {
        self.reg.shutdown(ctx, self.close_grace);
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
