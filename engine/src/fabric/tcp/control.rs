//! The TCP half of the control thread: [`TcpControl`], the TCP part of the shared
//! [`Control`](crate::fabric::control::Control), the [`FabricControl`] of `tcp://`.
//!
//! Its registry holds the listening sockets and the producer ends of the pollers' TCP command
//! rings.
//! Accepting never waits on a peer: each accepted socket becomes a pending [`Handshake`] entry
//! whose socket is in the poll set; its hello is read when it arrives and the reply goes out at
//! once; [`tick`](FabricControl::tick) expires an entry whose hello did not arrive within
//! `ACCEPT_TIMEOUT` (1 s), closing its socket. At most [`MAX_HANDSHAKES`] are pending; beyond
//! that new connections are refused as busy. Connecting runs on the calling thread
//! ([`Accepting::connect`]), bounded by its timeout.
//!
//! Established connections' sockets are not watched here: the poller sees the peer's end of
//! stream or reset itself (after delivering what came before), and sends heartbeats and checks
//! the peer's liveness in [`check_peer`](crate::fabric::FabricConn::check_peer). Finishing a
//! connection's setup side shuts its socket down, so the peer sees the end of stream even when
//! a run-to-completion poller never runs again.

use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::setup::{self, Established, Handshake, Step, TcpListenerState};
use super::sys;
use super::TcpFabric;
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::Error;
#[cfg(doc)]
use crate::fabric::control::FabricControl;
use crate::fabric::control::{self, Accept, Accepting, Ctx, NewConn, PendingSetup, Reg, SetupSide};
use crate::fabric::Fabric;
use crate::link::ConnParts;
use crate::poller::PollerLink;

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

/// The TCP part of the control half (the registry and the handshakes are the shared
/// [`Control`](control::Control)'s).
pub(crate) struct TcpControl {
    /// Grace of a close by the application (as for shm): none with dedicated pollers, zero in
    /// run-to-completion mode.
    close_grace: Option<Duration>,
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
    const SCHEME: &'static str = TcpFabric::NAME;
    const MAX_PENDING: usize = MAX_HANDSHAKES;
    type Pollers = Vec<PollerLink<TcpFabric>>;
    type Listener = TcpListenerState;
    type Setup = TcpSetup;
    type Pending = Handshake;
    type Est = Box<Established>;
    type Connect = ();

    fn new(_pollers: &Vec<PollerLink<TcpFabric>>, cfg: &Config) -> TcpControl {
        TcpControl {
            close_grace: cfg.run_to_completion().then_some(Duration::ZERO),
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
        let Endpoint::Tcp { host, port } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        Ok(Box::new(setup::connect(host, *port, raw, cfg, timeout)?))
    }

    fn no_listener(e: &Error) -> bool {
        matches!(e, Error::Connect { source, .. }
            if matches!(source.downcast_ref(), Some(super::TcpSetupError::Connect { source, .. })
                if source.kind() == std::io::ErrorKind::ConnectionRefused))
    }

    fn bind(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<TcpListenerState, Error> {
        let Endpoint::Tcp { host, port } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        let listener = TcpListenerState::bind(host, *port, raw, ctx.cfg)?;
        if let Some(addr) = listener.local_addr() {
            tracing::debug!(endpoint = raw, %addr, "tcp listener bound");
        }
        Ok(listener)
    }

    fn listener_fd(listener: &TcpListenerState) -> RawFd {
        listener.fd()
    }

    fn try_accept(
        &self,
        listener: &TcpListenerState,
        _cfg: &Config,
        busy: bool,
        now: Instant,
    ) -> Result<Accept<Handshake>, Error> {
        Ok(match listener.try_accept(now)? {
            None => Accept::Empty,
            Some(hs) if busy => {
                hs.refuse_busy(listener.params());
                Accept::Refused
            }
            Some(hs) => Accept::Started(hs),
        })
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

    fn install(
        &mut self,
        reg: &mut Reg<Self>,
        ctx: &mut Ctx<'_>,
        est: Box<Established>,
        raw: String,
    ) -> Result<ConnParts, Error> {
        let poller = reg.least_loaded(ctx.cfg.max_connections_per_poller)?;
        let Established {
            conn,
            pools,
            keep,
            peer,
        } = *est;
        let sock = conn.socket().clone();
        let new = NewConn {
            poller,
            conn,
            pools,
            keep,
            setup: TcpSetup { sock },
            path: Some(peer.to_string()),
        };
        reg.register(ctx, new, raw, None)
    }

    fn close_grace(&self) -> Option<Duration> {
        self.close_grace
    }

    /// The pollers' liveness checks and heartbeats run by the coarse clock, which the beats
    /// advance.
    fn beats(cfg: &Config) -> bool {
        cfg.liveness().is_some()
    }
}
