//! The RDMA half of the control thread: [`RdmaControl`], the [`FabricControl`] of `rdma://`.
//!
//! It owns the rdma_cm listeners, every RDMA connection's rdma_cm id (watched for DISCONNECTED
//! and DEVICE_REMOVAL), the device table (PD, one CQ per poller; shared with connecting threads
//! through [`RdmaConnect`]) and the producer ends of the pollers' RDMA command rings. An
//! established connection goes to the poller whose CQ its QP was created on, preceded by an
//! [`RdmaCommand::AttachCq`] for that CQ. Closing asks the poller to retire the connection (its
//! last service posts what the application queued) and disconnects once it has, or after
//! [`CLOSE_GRACE`].
//!
//! Accepting never waits on a peer: an accepted request becomes a [`PendingAccept`] entry whose
//! id's event channel is in the poll set; its ESTABLISHED (or a failure event) finishes it, and
//! [`tick`](FabricControl::tick) drops it (QP and id destroyed) after `ACCEPT_TIMEOUT` (2 s).
//! At most [`MAX_PENDING_ACCEPTS`] are pending; beyond that requests are rejected at once.
//! Connecting runs on the calling thread.

use std::os::fd::RawFd;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::datapath::{RdmaCommand, RdmaFabric};
use super::error::RdmaSetupError;
use super::setup::{
    self, AcceptStep, ConnStatus, Established, PendingAccept, RdmaDevices, RdmaListener,
    MAX_PENDING_ACCEPTS,
};
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::{Error, FabricError};
use crate::event::Event;
use crate::fabric::control::{
    self, Accepting, Beat, Ctx, Due, FabricConnect, FabricControl, Handshakes, NewConn,
    PendingSetup, Registry, SetupSide, Watched, ACCEPT_BURST,
};
use crate::fabric::Fabric;
use crate::link::ConnParts;
use crate::poller::{Command, PollerLink};

/// Longest a closing connection waits for its poller before it is disconnected anyway (in
/// run-to-completion mode the poller runs only when the application polls).
const CLOSE_GRACE: Duration = Duration::from_millis(100);

/// The setup side of one RDMA connection.
pub(crate) struct RdmaSetup {
    /// Gives the poller's place back when the record is dropped.
    _slot: setup::PollerSlot,
    id: Arc<cm::rdma::CmId>,
}

impl SetupSide for RdmaSetup {
    /// Disconnects (the QP and pools go when the last handle does).
    fn finish(&mut self) {
        setup::close(&self.id);
    }
}

/// The RDMA control state.
pub(crate) struct RdmaControl {
    reg: Registry<RdmaFabric, RdmaListener, RdmaSetup>,
    /// Accepted requests waiting for ESTABLISHED; their channels follow the registry's
    /// descriptors in the poll set.
    accepting: Handshakes<Box<PendingAccept>>,
    devices: Arc<RdmaDevices>,
}

impl RdmaControl {
    pub(crate) fn new(links: Vec<PollerLink<RdmaFabric>>, cfg: &Config) -> Self {
        let devices = Arc::new(RdmaDevices::new(
            links.len(),
            cfg.max_connections_per_poller,
        ));
        Self {
            reg: Registry::new(links),
            accepting: Handshakes::new(MAX_PENDING_ACCEPTS),
            devices,
        }
    }

    /// Registers an established connection with its poller.
    fn install_est(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: Established,
        endpoint: String,
    ) -> Result<ConnParts, Error> {
        let Established {
            poller,
            conn,
            pools,
            keep,
            id: cm_id,
            cq,
            srq,
            path,
            peer,
            ..
        } = est;
        // Which device/port/GID rdma_cm chose: in the Connected event, and logged on the
        // control thread (never a poller).
        let path = path.map(|p| p.to_string());
        let new = NewConn {
            poller: poller.index(),
            conn,
            pools,
            keep,
            setup: RdmaSetup {
                _slot: poller,
                id: cm_id,
            },
            path: path.clone(),
        };
        let parts = self
            .reg
            .register(ctx, new, endpoint, Some(RdmaCommand::AttachCq(cq, srq)))?;
        tracing::info!(conn = parts.id, peer = %peer, path = path.as_deref(), "rdma path chosen");
        Ok(parts)
    }

    /// Takes up to [`ACCEPT_BURST`] connection requests off listener `lid` and accepts them
    /// (nothing here waits for a peer: each becomes a [`PendingAccept`]).
    fn accept_on(&mut self, ctx: &mut Ctx<'_>, lid: u64, now: Instant) {
        for _ in 0..ACCEPT_BURST {
            let Some(l) = self.reg.listeners.iter().find(|l| l.id == lid) else {
                return;
            };
            let busy = self.accepting.is_full();
            match l.listener.try_accept(ctx.cfg, &self.devices, busy, now) {
                Ok(None) => return,
                // ESTABLISHED may be there already: try at once.
                Ok(Some(pa)) => control::advance(self, ctx, lid, pa, now),
                Err(error) => ctx.emit(Event::Error { conn: None, error }),
            }
        }
    }
}

impl PendingSetup for Box<PendingAccept> {
    fn fd(&self) -> RawFd {
        PendingAccept::fd(self)
    }

    fn deadline(&self) -> Instant {
        PendingAccept::deadline(self)
    }

    fn timed_out(&self) -> Error {
        PendingAccept::timed_out(self)
    }
}

impl Accepting for RdmaControl {
    type Fabric = RdmaFabric;
    type Listener = RdmaListener;
    type Setup = RdmaSetup;
    type Pending = Box<PendingAccept>;
    type Est = Box<Established>;

    fn reg(&mut self) -> &mut Registry<RdmaFabric, RdmaListener, RdmaSetup> {
        &mut self.reg
    }

    fn pending(&mut self) -> &mut Handshakes<Box<PendingAccept>> {
        &mut self.accepting
    }

    /// Reads the accept's next event (the listener plays no part).
    fn step(
        _listener: &RdmaListener,
        pa: Box<PendingAccept>,
        cfg: &Config,
        _now: Instant,
    ) -> Result<control::Step<Box<PendingAccept>, Box<Established>>, Error> {
        Ok(match pa.advance(cfg)? {
            AcceptStep::Pending(pa) => control::Step::Pending(pa),
            AcceptStep::Done(est) => control::Step::Done(est),
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

impl FabricControl for RdmaControl {
    fn scheme(&self) -> &'static str {
        RdmaFabric::NAME
    }

    fn connector(&self) -> Arc<dyn FabricConnect> {
        Arc::new(RdmaConnect {
            devices: self.devices.clone(),
        })
    }

    fn listen(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<(u64, mpsc::Receiver<ConnParts>), Error> {
        let Endpoint::Rdma { host, port } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        let listener = RdmaListener::bind(host, *port, raw, ctx.cfg.rdma_gid_index)?;
        Ok(self.reg.add_listener(ctx, raw, listener))
    }

    fn unlisten(&mut self, id: u64) -> bool {
        // Its pending accepts go with it.
        control::unlisten(self, id)
    }

    fn install(
        &mut self,
        ctx: &mut Ctx<'_>,
        est: control::Established,
        raw: String,
    ) -> Result<ConnParts, Error> {
        let est = control::downcast::<Established>(est, RdmaFabric::NAME)?;
        self.install_est(ctx, est, raw)
    }

    fn drop_conn(&mut self, ctx: &mut Ctx<'_>, id: u64) -> bool {
        self.reg
            .close(ctx, id, Command::Remove(id), Some(CLOSE_GRACE))
    }

    /// Listeners' and connections' event channels (closing ones too: the peer's answer to our
    /// disconnect arrives there).
    fn fds(&mut self, fds: &mut Vec<libc::pollfd>) {
        self.reg.watch(fds, RdmaListener::fd, |c| {
            Some((c.setup.id.channel().fd(), libc::POLLIN))
        });
        self.accepting.watch(fds);
    }

    fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]) {
        // The pending accepts' channels come last, in `accepting` order (nothing changed the
        // table since `fds`). Those with an event are advanced first.
        let now = Instant::now();
        let fds = control::on_ready(self, ctx, fds, now);
        for w in self.reg.ready(fds) {
            match w {
                Watched::Listener(id) => self.accept_on(ctx, id, now),
                Watched::Conn(id) => {
                    let status = match self.reg.conns.get(&id) {
                        Some(c) => setup::poll_events(&c.setup.id),
                        None => continue,
                    };
                    match status {
                        ConnStatus::Alive => {}
                        ConnStatus::Disconnected => {
                            match self.reg.conns.get(&id) {
                                // Closing anyway: the peer just answered our disconnect.
                                Some(c) if c.is_closing() => continue,
                                Some(c) => c.shared.disconnect(),
                                None => continue,
                            }
                            tracing::debug!(
                                conn = id,
                                cause = "rdma_cm DISCONNECTED",
                                "disconnect"
                            );
                            ctx.emit(Event::Disconnected { conn: id });
                            self.drop_conn(ctx, id);
                        }
                        ConnStatus::DeviceRemoved => {
                            if let Some(c) = self.reg.conns.get(&id) {
                                c.shared.fail(FabricError::PeerClosed);
                            }
                            ctx.emit(Event::Error {
                                conn: Some(id),
                                error: RdmaSetupError::DeviceRemoved.into(),
                            });
                            self.drop_conn(ctx, id);
                        }
                    }
                }
            }
        }
    }

    fn tick(&mut self, ctx: &mut Ctx<'_>, now: Instant, _beat: Option<Beat>) -> Due {
        self.reg.drain(ctx);
        // Accepts whose ESTABLISHED did not come in time fail (QP and id destroyed).
        self.accepting.expire(ctx, now);
        Due {
            // Pending accepts' deadlines, closes' grace ([`CLOSE_GRACE`]), command retries.
            at: control::earliest(self.reg.next_due(now), self.accepting.next_deadline()),
            // The pollers' liveness checks and heartbeats run by the coarse clock, which the
            // beats advance.
            beat: ctx.cfg.liveness().is_some() && !self.reg.conns.is_empty(),
        }
    }

    fn shutdown(&mut self, ctx: &mut Ctx<'_>) {
        self.accepting.clear();
        self.reg.shutdown(ctx, Some(CLOSE_GRACE));
    }
}

/// The connecting side of `rdma://`: resolve, QP setup and connect on the calling thread.
pub(crate) struct RdmaConnect {
    devices: Arc<RdmaDevices>,
}

impl FabricConnect for RdmaConnect {
    fn scheme(&self) -> &'static str {
        RdmaFabric::NAME
    }

    fn connect(
        &self,
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        timeout: Duration,
    ) -> Result<control::Established, Error> {
        let Endpoint::Rdma { host, port } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        let est = setup::connect(host, *port, raw, cfg, &self.devices, timeout)?;
        Ok(Box::new(est))
    }
}
