//! A listening endpoint ([`RdmaListener`], control thread): takes connection requests, validates
//! the peer's parameters and rejects or accepts each one without waiting: a helper thread
//! prepares and accepts it while the control thread goes on, and the accept then waits for
//! ESTABLISHED, both as a [`PendingAccept`].

use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Instant;

use cm::rdma::{self as rcm, CmError, CmId, CmRejectReason, ConnOptions, FlowParams};

use super::accept::{Accepted, PendingAccept, ACCEPT_TIMEOUT, MAX_PENDING_ACCEPTS};
use super::devices::RdmaDevices;
use super::gid;
use super::large;
use super::prepare::{our_private, prepare, MIN_CREDITS};
use super::setup_err;
use crate::config::Config;
use crate::error::Error;
use crate::fabric::rdma::datapath::LargeRegion;
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

    /// Takes one pending connection request, if any, and validates it (`busy`: rejects it with
    /// [`CmRejectReason::NoResources`] instead); then a helper thread creates its pools and QP
    /// and accepts it ([`prepare_and_accept`]), so that the control thread does not wait while
    /// the pools' memory is registered. Nor does it wait for ESTABLISHED: the returned
    /// [`PendingAccept`] takes the helper's result and then that event (on the id's own
    /// channel) in [`PendingAccept::advance`], and fails at its deadline ([`ACCEPT_TIMEOUT`]
    /// from `now`).
    pub(crate) fn try_accept(
        &self,
        cfg: &Config,
        devices: &Arc<RdmaDevices>,
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
        // The helper sends its result, then closes `wake_tx`: the control thread polls `wake`,
        // readable from then on (end of stream), and takes the result. Closing, not writing: a
        // write after the control thread gave up would raise SIGPIPE in an application that
        // does not ignore it (a C program).
        let (tx, done) = std::sync::mpsc::sync_channel(1);
        let (wake, wake_tx) = UnixStream::pair().map_err(|e| setup_err("accept wake-up", e))?;
        let (id, devices, cfg) = (req.id, Arc::clone(devices), cfg.clone());
        // On error (the thread not started), dropping the closure drops the id, which rejects
        // the request.
        std::thread::Builder::new()
            .name("spinwire-rdma-accept".into())
            .spawn(move || {
                let r = prepare_and_accept(id, &devices, &cfg, peer, peer_large, peer_addr);
                // If the control thread gave up (the deadline passed), the attempt is dropped
                // here, its QP and id destroyed.
                let _ = tx.send(r);
                drop(wake_tx);
            })
            .map_err(|e| setup_err("spawning the accept thread", e))?;
        Ok(Some(Box::new(PendingAccept::preparing(
            done,
            wake,
            now + ACCEPT_TIMEOUT,
        ))))
    }
}

/// A validated connection request's setup, on the accept's helper thread: its pools (their
/// memory registered), the QP and the pre-posted receives, then `rdma_accept`. On error,
/// dropping the id rejects the request.
fn prepare_and_accept(
    id: CmId,
    devices: &RdmaDevices,
    cfg: &Config,
    peer: FlowParams,
    peer_large: LargeRegion,
    peer_addr: String,
) -> Result<Accepted, Error> {
    let aerr = |what: &'static str, e: CmError| setup_err(what, e);
    let pending = prepare(id, devices, cfg)?;
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
    Ok(Accepted {
        pending,
        peer,
        peer_large,
        peer_addr,
        addr,
        opts,
    })
}
