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
//! Accepting waits on the control thread, up to `ACCEPT_TIMEOUT` (2 s), for ESTABLISHED;
//! connecting runs on the calling thread.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::datapath::{RdmaCommand, RdmaFabric};
use super::error::RdmaSetupError;
use super::setup::{self, ConnStatus, Established, RdmaDevices, RdmaListener};
use crate::config::Config;
use crate::endpoint::Endpoint;
use crate::error::{Error, FabricError, SetupError};
use crate::event::Event;
use crate::fabric::control::{
    self, Ctx, FabricConnect, FabricControl, NewConn, Registry, SetupSide, Watched, ACCEPT_BURST,
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
        // Which device/port/GID rdma_cm chose: in the Connected event, and logged on the
        // control thread (never a poller).
        let path = path.map(|p| p.to_string());
        let new = NewConn {
            poller: poller.index(),
            conn,
            tx_pool,
            rx_pool,
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

    fn accept_on(&mut self, ctx: &mut Ctx<'_>, lid: u64) {
        for _ in 0..ACCEPT_BURST {
            let Some(l) = self.reg.listeners.iter().find(|l| l.id == lid) else {
                return;
            };
            match l.listener.try_accept(ctx.cfg, &self.devices) {
                Ok(None) => return,
                Ok(Some(est)) => {
                    let raw = l.raw.clone();
                    match self.install_est(ctx, est, raw) {
                        Ok(parts) => {
                            if let Some(id) = self.reg.hand_over(lid, parts) {
                                self.drop_conn(ctx, id);
                            }
                        }
                        Err(error) => ctx.emit(Event::Error { conn: None, error }),
                    }
                }
                Err(error) => ctx.emit(Event::Error { conn: None, error }),
            }
        }
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
        let listener = RdmaListener::bind(host, *port, raw)?;
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
            .map_err(|_| Error::Setup(SetupError::WrongFabric { fabric: "rdma" }))?;
        self.install_est(ctx, *est, raw)
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
    }

    fn on_ready(&mut self, ctx: &mut Ctx<'_>, fds: &[libc::pollfd]) {
        for w in self.reg.ready(fds) {
            match w {
                Watched::Listener(id) => self.accept_on(ctx, id),
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

    fn tick(&mut self, ctx: &mut Ctx<'_>, _now: Instant) -> bool {
        self.reg.drain(ctx);
        !self.reg.conns.is_empty()
    }

    fn shutdown(&mut self, ctx: &mut Ctx<'_>) {
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
