//! A listening endpoint ([`RdmaListener`], control thread): takes connection requests, validates
//! the peer's parameters, prepares and accepts (or rejects) each one without waiting; the accept
//! then waits for ESTABLISHED as a [`PendingAccept`].

use std::os::fd::RawFd;
use std::time::Instant;

use cm::rdma::{self as rcm, CmError, CmRejectReason, ConnOptions, FlowParams};

use super::accept::{PendingAccept, ACCEPT_TIMEOUT, MAX_PENDING_ACCEPTS};
use super::devices::RdmaDevices;
use super::gid;
use super::large;
use super::prepare::{our_private, prepare, MIN_CREDITS};
use super::setup_err;
use crate::config::Config;
use crate::error::Error;
use crate::fabric::rdma::error::RdmaSetupError;

/// A listening RDMA endpoint (on the control thread).
pub(crate) struct RdmaListener {
    inner: rcm::CmListener,
    endpoint: String,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaListener")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl RdmaListener {
    /// Binds `host:port` (host must be an address of an RDMA device, or `0.0.0.0`).
    ///
    /// An accepted connection's source GID follows the address the client connected to, so a
    /// GID-index override (`gid_index`) does not apply to accepts; but a wildcard listener with
    /// an override binds to the override's address instead (the first device port whose entry
    /// `gid_index` is a usable IP GID of the wildcard's family), logged at info.
    pub(crate) fn bind(
        host: &str,
        port: u16,
        endpoint: &str,
        gid_index: Option<u8>,
    ) -> Result<Self, Error> {
        let lerr = |e: CmError| Error::Listen {
            endpoint: endpoint.to_owned(),
            source: Box::new(e),
        };
        let mut addr = rcm::resolve_host(host, port).map_err(lerr)?;
        if let Some(index) = gid_index {
            if addr.ip().is_unspecified() {
                let c = gid::for_listener(index, addr.is_ipv4()).map_err(|e| Error::Listen {
                    endpoint: endpoint.to_owned(),
                    source: Box::new(e),
                })?;
                let wildcard = addr;
                addr = c.source_for(addr).map_err(|e| Error::Listen {
                    endpoint: endpoint.to_owned(),
                    source: Box::new(e),
                })?;
                addr.set_port(port);
                tracing::info!(
                    endpoint,
                    %wildcard,
                    bound = %addr,
                    device = %c.device,
                    port = c.port,
                    gid_index = c.index,
                    gid = %c.gid,
                    gid_type = %c.gid_type,
                    "rdma gid index override: wildcard listener bound to the GID's address"
                );
            } else {
                tracing::info!(
                    endpoint,
                    gid_index = index,
                    "rdma gid index override set: accepted connections use the GID of the \
                     address clients connect to"
                );
            }
        }
        let inner = rcm::CmListener::bind(addr, 128).map_err(lerr)?;
        inner.id().channel().set_nonblocking(true).map_err(lerr)?;
        Ok(Self {
            inner,
            endpoint: endpoint.to_owned(),
        })
    }

    /// The event channel fd to poll (readable when a connection request is pending).
    pub(crate) fn fd(&self) -> RawFd {
        self.inner.id().channel().fd()
    }

    /// Takes one pending connection request, if any: validates it, creates the QP and pools and
    /// accepts it (`busy`: rejects it with [`CmRejectReason::NoResources`] instead). Does not
    /// wait for ESTABLISHED: the returned [`PendingAccept`] is finished by
    /// [`PendingAccept::advance`] when that event arrives on the id's own channel, and fails at
    /// its deadline ([`ACCEPT_TIMEOUT`] from `now`).
    pub(crate) fn try_accept(
        &self,
        cfg: &Config,
        devices: &RdmaDevices,
        busy: bool,
        now: Instant,
    ) -> Result<Option<Box<PendingAccept>>, Error> {
        let aerr = |what: &'static str, e: CmError| setup_err(what, e);
        let Some(req) = self
            .inner
            .get_request(None)
            .map_err(|e| aerr("accept", e))?
        else {
            return Ok(None);
        };
        if busy {
            let _ = req.id.reject(&CmRejectReason::NoResources.encode());
            return Err(RdmaSetupError::AcceptsPending {
                pending: MAX_PENDING_ACCEPTS,
            }
            .into());
        }
        let peer = match FlowParams::decode(&req.private_data) {
            Ok(p) => p,
            Err(e) => {
                let _ = req.id.reject(&CmRejectReason::BadParams.encode());
                return Err(RdmaSetupError::BadRequestParams(e).into());
            }
        };
        if peer.buffer_size as usize != cfg.buffer_size || peer.credits < MIN_CREDITS {
            let _ = req.id.reject(&CmRejectReason::BadParams.encode());
            return Err(RdmaSetupError::RequestRejected {
                peer_size: peer.buffer_size,
                peer_credits: peer.credits,
                ours: cfg.buffer_size,
                min: MIN_CREDITS,
            }
            .into());
        }
        let peer_large = match large::decode(&req.private_data) {
            Ok(r) => r,
            Err(e) => {
                let _ = req.id.reject(&CmRejectReason::BadParams.encode());
                return Err(e.into());
            }
        };
        // Large slots must match (the same check `finish` makes): refuse before accepting.
        if let Err(e) = large::check_config(cfg, &peer_large) {
            let _ = req.id.reject(&CmRejectReason::BadParams.encode());
            return Err(e);
        }
        let peer_addr = req
            .id
            .peer_addr()
            .map_or_else(|| "?".to_owned(), |a| a.to_string());
        // On error, dropping the id rejects the request.
        let pending = prepare(req.id, devices, cfg)?;
        // The id's own channel (migrated by `get_request`): read without blocking from here on.
        pending
            .id
            .channel()
            .set_nonblocking(true)
            .map_err(|e| aerr("event channel", e))?;
        // As many outstanding RDMA READs (rendezvous) as the request and the device allow.
        let opts = ConnOptions {
            responder_resources: ConnOptions::RD_ATOMIC_MAX,
            initiator_depth: ConnOptions::RD_ATOMIC_MAX,
            ..ConnOptions::default()
        };
        pending
            .id
            .accept(&opts, &our_private(&pending))
            .map_err(|e| aerr("accept", e))?;
        let addr = pending
            .id
            .peer_addr()
            .unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
        Ok(Some(Box::new(PendingAccept {
            pending,
            peer,
            peer_large,
            peer_addr,
            addr,
            opts,
            deadline: now + ACCEPT_TIMEOUT,
        })))
    }
}
