//! The `mem://` half of the control thread: [`MemControl`], the `mem` part of the shared
//! [`Control`](crate::fabric::control::Control), the [`FabricControl`] of `mem://`.
//!
//! Its registry holds the listeners (each a name in the process-wide table, whose wake-up
//! socket is in the poll set) and the producer ends of the pollers' `mem` command rings. A
//! connecting thread builds both ends of a connection ([`Accepting::connect`], which never
//! waits) and queues the accepted one in the listener's inbox; when the listener's socket is
//! readable, each queued end is taken off it in the accept burst as a [`Queued`] entry, which
//! needs no handshake: its first step installs it and hands it to the listener. Nothing waits
//! on a peer. Liveness runs in the pollers
//! ([`check_peer`](crate::fabric::FabricConn::check_peer), by the coarse clock the beats
//! advance), as for TCP; finishing a connection's setup side marks its end closed, so the peer
//! sees the close even when a run-to-completion poller never runs again.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::datapath::Channel;
use super::setup::{self, Established, MemListenerState};
use super::MemFabric;
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::{AbortReason, Error};
#[cfg(doc)]
use crate::fabric::control::FabricControl;
use crate::fabric::control::{self, Accept, Accepting, Ctx, NewConn, PendingSetup, Reg, SetupSide};
use crate::fabric::Fabric;
use crate::link::ConnParts;
use crate::poller::PollerLink;

/// The setup side of one `mem://` end: the channel, to mark the end closed.
pub(crate) struct MemSetup {
    chan: Arc<Channel>,
    me: usize,
}

impl MemSetup {
    pub(crate) fn new(chan: Arc<Channel>, me: usize) -> MemSetup {
        MemSetup { chan, me }
    }
}

impl SetupSide for MemSetup {
    fn abort(&mut self, reason: AbortReason) {
        self.chan.abort(self.me, reason);
    }

    fn finish(&mut self) {
        self.chan.close(self.me);
    }
}

/// An accepted `mem://` end taken off its listener's inbox. Its connecting thread set it up
/// completely, so it waits on nothing: its first [`Accepting::step`] is done, and it never
/// enters the handshake table (its descriptor and deadline are never watched).
pub(crate) struct Queued {
    est: Box<Established>,
    /// When it was taken off the inbox.
    since: Instant,
}

impl PendingSetup for Queued {
    /// None (a negative descriptor, which `poll` ignores): nothing more arrives for it.
    fn fd(&self) -> RawFd {
        -1
    }

    fn deadline(&self) -> Instant {
        self.since
    }

    fn timed_out(&self) -> Error {
        Error::Timeout
    }
}

/// The `mem` part of the control half (the registry is the shared
/// [`Control`](control::Control)'s).
pub(crate) struct MemControl {
    /// Grace of a close by the application (as for TCP): none with dedicated pollers, zero in
    /// run-to-completion mode.
    close_grace: Option<Duration>,
}

impl Accepting for MemControl {
    const SCHEME: &'static str = MemFabric::NAME;
    /// No accepted end waits on a handshake, so the table never fills (one place suffices).
    const MAX_PENDING: usize = 1;
    type Pollers = Vec<PollerLink<MemFabric>>;
    type Listener = MemListenerState;
    type Setup = MemSetup;
    type Pending = Queued;
    type Est = Box<Established>;
    type Connect = ();

    fn new(_pollers: &Vec<PollerLink<MemFabric>>, cfg: &Config) -> MemControl {
        MemControl {
            close_grace: cfg.run_to_completion().then_some(Duration::ZERO),
        }
    }

    fn connect_side(&self) {}

    /// Builds both ends on the calling thread and queues the accepted one with the listener
    /// (never waits: the listener is in this process).
    fn connect(
        _side: &(),
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        _timeout: Duration,
    ) -> Result<Box<Established>, Error> {
        let Endpoint::Mem { name } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        Ok(Box::new(setup::connect(name, raw, cfg)?))
    }

    fn no_listener(e: &Error) -> bool {
        matches!(e, Error::Connect { source, .. }
            if matches!(source.downcast_ref(), Some(setup::MemSetupError::NoListener { .. })))
    }

    fn bind(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<MemListenerState, Error> {
        let Endpoint::Mem { name } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        MemListenerState::bind(name, raw, ctx.cfg)
    }

    fn listener_fd(listener: &MemListenerState) -> RawFd {
        listener.fd()
    }

    /// Takes the next queued end. `busy` (the listener is at its connection maximum; no end
    /// stays in the handshake table): the end is dropped, so the connector's end sees it
    /// closed.
    fn try_accept(
        &self,
        listener: &MemListenerState,
        _cfg: &Config,
        busy: bool,
        now: Instant,
    ) -> Result<Accept<Queued>, Error> {
        Ok(match listener.take_one() {
            None => Accept::Empty,
            Some(_refused) if busy => Accept::Refused,
            Some(est) => Accept::Started(Queued {
                est: Box::new(est),
                since: now,
            }),
        })
    }

    fn step(
        _listener: &MemListenerState,
        queued: Queued,
        _cfg: &Config,
        _now: Instant,
    ) -> Result<control::Step<Queued, Box<Established>>, Error> {
        Ok(control::Step::Done(queued.est))
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
            chan,
            me,
        } = *est;
        let new = NewConn {
            poller,
            conn,
            pools,
            keep,
            setup: MemSetup::new(chan, me),
            path: Some(peer),
        };
        reg.register(ctx, new, raw, None)
    }

    fn close_grace(&self) -> Option<Duration> {
        self.close_grace
    }

    /// The pollers' liveness checks run by the coarse clock, which the beats advance.
    fn beats(cfg: &Config) -> bool {
        cfg.liveness().is_some()
    }
}
