//! The RDMA half of the control thread: [`RdmaControl`], the RDMA part of the shared
//! [`Control`](crate::fabric::control::Control), the [`FabricControl`] of `rdma://`.
//!
//! It owns the device table (PD, one CQ per poller; shared with connecting threads as its
//! [`Accepting::Connect`]); its registry holds the rdma_cm listeners, every RDMA connection's
//! rdma_cm id (watched for DISCONNECTED and DEVICE_REMOVAL) and the producer ends of the
//! pollers' RDMA command rings. An established connection goes to the poller whose CQ its QP
//! was created on, preceded by an [`RdmaCommand::AttachCq`] for that CQ. Closing asks the
//! poller to retire the connection (it posts what the application queued and retires it once
//! every send completed, so that the disconnect flushes none of it) and disconnects once it
//! has, or after [`CLOSE_GRACE`]. The peer's disconnect (DISCONNECTED) goes to the poller too:
//! it delivers what the CQ still holds of the peer's sends, then reports the disconnect.
//!
//! Accepting never waits, on a peer or on a registration: a validated request becomes a
//! [`PendingAccept`] entry while a helper thread makes its pools and QP and accepts it (the
//! entry's descriptor is the helper's wake-up until then, the id's event channel after);
//! ESTABLISHED (or a failure) finishes it, and [`tick`](FabricControl::tick) drops it (QP and
//! id destroyed) after `ACCEPT_TIMEOUT` (2 s). At most [`MAX_PENDING_ACCEPTS`] are pending;
//! beyond that requests are rejected at once. Connecting runs on the calling thread.

use std::os::fd::RawFd;
use std::sync::Arc;
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
#[cfg(doc)]
use crate::fabric::control::FabricControl;
use crate::fabric::control::{
    self, Accept, Accepting, ConnRec, Ctx, NewConn, PendingSetup, Reg, SetupSide,
};
use crate::fabric::Fabric;
use crate::link::ConnParts;
use crate::poller::PollerLink;

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

/// The RDMA part of the control half: the device table (the registry and the pending accepts
/// are the shared [`Control`](control::Control)'s).
pub(crate) struct RdmaControl {
    devices: Arc<RdmaDevices>,
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
    const SCHEME: &'static str = RdmaFabric::NAME;
    const MAX_PENDING: usize = MAX_PENDING_ACCEPTS;
    type Pollers = Vec<PollerLink<RdmaFabric>>;
    type Listener = RdmaListener;
    type Setup = RdmaSetup;
    type Pending = Box<PendingAccept>;
    type Est = Box<Established>;
    /// The device table, shared with connecting threads.
    type Connect = Arc<RdmaDevices>;

    fn new(pollers: &Vec<PollerLink<RdmaFabric>>, cfg: &Config) -> Self {
        RdmaControl {
            devices: Arc::new(RdmaDevices::new(
                pollers.len(),
                cfg.max_connections_per_poller,
            )),
        }
    }

    fn connect_side(&self) -> Arc<RdmaDevices> {
        self.devices.clone()
    }

    /// Resolve, QP setup and connect on the calling thread.
    fn connect(
        devices: &Arc<RdmaDevices>,
        endpoint: &Endpoint,
        raw: &str,
        cfg: &Config,
        timeout: Duration,
    ) -> Result<Box<Established>, Error> {
        let Endpoint::Rdma { host, port } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        let est = setup::connect(host, *port, raw, cfg, devices, timeout)?;
        Ok(Box::new(est))
    }

    fn bind(
        &mut self,
        ctx: &mut Ctx<'_>,
        endpoint: &Endpoint,
        raw: &str,
    ) -> Result<RdmaListener, Error> {
        let Endpoint::Rdma { host, port } = endpoint else {
            return Err(Error::FabricNotCompiled {
                fabric: endpoint.scheme(),
            });
        };
        RdmaListener::bind(host, *port, raw, ctx.cfg.rdma_gid_index)
    }

    fn listener_fd(listener: &RdmaListener) -> RawFd {
        listener.fd()
    }

    /// The connection's event channel (closing ones too: the peer's answer to our disconnect
    /// arrives there).
    fn conn_fd(c: &ConnRec<RdmaSetup>) -> Option<(RawFd, libc::c_short)> {
        Some((c.setup.id.channel().fd(), libc::POLLIN))
    }

    /// Accepts one connection request (nothing here waits for a peer: it becomes a
    /// [`PendingAccept`]); `busy`: rejected, and reported as an error.
    fn try_accept(
        &self,
        listener: &RdmaListener,
        cfg: &Config,
        busy: bool,
        now: Instant,
    ) -> Result<Accept<Box<PendingAccept>>, Error> {
        Ok(match listener.try_accept(cfg, &self.devices, busy, now)? {
            None => Accept::Empty,
            Some(pa) => Accept::Started(pa),
        })
    }

    /// Reads the accept's next event (the listener plays no part).
    fn step(
        _listener: &RdmaListener,
        pa: Box<PendingAccept>,
        cfg: &Config,
        _now: Instant,
    ) -> Result<control::Step<Box<PendingAccept>, Box<Established>>, Error> {
        Ok(match (*pa).advance(cfg)? {
            AcceptStep::Pending(pa) => control::Step::Pending(pa),
            AcceptStep::Done(est) => control::Step::Done(est),
        })
    }

    /// Registers an established connection with its poller.
    fn install(
        &mut self,
        reg: &mut Reg<Self>,
        ctx: &mut Ctx<'_>,
        est: Box<Established>,
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
        } = *est;
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
        let parts = reg.register(ctx, new, endpoint, Some(RdmaCommand::AttachCq(cq, srq)))?;
        tracing::info!(conn = parts.id, peer = %peer, path = path.as_deref(), "rdma path chosen");
        Ok(parts)
    }

    /// [`CLOSE_GRACE`].
    fn close_grace(&self) -> Option<Duration> {
        Some(CLOSE_GRACE)
    }

    /// The pollers' liveness checks and heartbeats run by the coarse clock, which the beats
    /// advance.
    fn beats(cfg: &Config) -> bool {
        cfg.liveness().is_some()
    }

    /// An rdma_cm event of an established connection: DISCONNECTED has its poller deliver what
    /// arrived first, then disconnect and close it; DEVICE_REMOVAL fails it.
    fn on_conn_ready(&mut self, reg: &mut Reg<Self>, ctx: &mut Ctx<'_>, id: u64) {
        let status = match reg.conns.get(&id) {
            Some(c) => setup::poll_events(&c.setup.id),
            None => return,
        };
        match status {
            ConnStatus::Alive => {}
            ConnStatus::Disconnected => {
                match reg.conns.get(&id) {
                    // Closing anyway: the peer just answered our disconnect.
                    Some(c) if c.is_closing() => return,
                    Some(_) => {}
                    None => return,
                }
                // The receives of what the peer sent before its disconnect may still be in the
                // CQ: the poller delivers them first, then reports the disconnect.
                tracing::debug!(conn = id, cause = "rdma_cm DISCONNECTED", "peer closed");
                reg.peer_closed(ctx, id, Some(CLOSE_GRACE));
            }
            ConnStatus::DeviceRemoved => {
                if let Some(c) = reg.conns.get(&id) {
                    c.shared.fail(FabricError::PeerClosed);
                }
                ctx.emit(Event::Error {
                    conn: Some(id),
                    error: RdmaSetupError::DeviceRemoved.into(),
                });
                reg.close(ctx, id, Some(CLOSE_GRACE));
            }
        }
    }
}
