//! The active side ([`connect`]): resolve, prepare, then `rdma_connect` and the wait for
//! ESTABLISHED on a short-lived helper thread, so that a connect returns within its timeout
//! whatever the kernel does. Runs on the application thread calling `connect`.

use std::time::{Duration, Instant};

use cm::rdma::{self as rcm, CmError, CmEvent, CmEventKind, ConnOptions, FlowParams};

use super::establish::{finish, Established};
use super::gid;
use super::large;
use super::prepare::{our_private, prepare, Pending};
use super::setup_err;
use super::RdmaDevices;
use crate::clock::deadline_after;
use crate::config::Config;
use crate::error::Error;
use crate::fabric::rdma::error::RdmaSetupError;

fn conn_opts(timeout: Duration) -> ConnOptions {
    // Address and route resolution each get a third of the budget (at most 2 s), so an
    // unreachable host is reported as ADDR_ERROR/ROUTE_ERROR before the overall deadline.
    let ms = i32::try_from(timeout.as_millis() / 3)
        .unwrap_or(i32::MAX)
        .clamp(1, 2000);
    ConnOptions {
        resolve_timeout_ms: ms,
        // Rendezvous pulls large messages with RDMA READ: as many outstanding as the device
        // allows, both ways (a connection without large messages never issues one).
        responder_resources: ConnOptions::RD_ATOMIC_MAX,
        initiator_depth: ConnOptions::RD_ATOMIC_MAX,
        ..ConnOptions::default()
    }
}

fn map_cm(endpoint: &str, e: CmError) -> Error {
    match e {
        CmError::Timeout { .. } => Error::Timeout,
        e => Error::Connect {
            endpoint: endpoint.to_owned(),
            source: Box::new(e),
        },
    }
}

/// Connects to `host:port` (active side), blocking up to `timeout` in total; runs on the
/// calling application thread. The connection will be served by poller `poller`.
///
/// With a GID-index override (`cfg.rdma_gid_index`), a first resolution finds the device and
/// port, the route is resolved again from the address of that GID-table entry, and the QP's
/// source GID index is read back once established (see [`gid`]).
pub(crate) fn connect(
    host: &str,
    port: u16,
    endpoint: &str,
    cfg: &Config,
    devices: &RdmaDevices,
    timeout: Duration,
) -> Result<Established, Error> {
    let deadline = deadline_after(Instant::now(), timeout);
    let opts = conn_opts(timeout);
    let addr = rcm::resolve_host(host, port).map_err(|e| map_cm(endpoint, e))?;
    let (id, choice) = match cfg.rdma_gid_index {
        None => (
            rcm::resolve(addr, &opts, deadline).map_err(|e| map_cm(endpoint, e))?,
            None,
        ),
        Some(index) => {
            let probe = rcm::resolve(addr, &opts, deadline).map_err(|e| map_cm(endpoint, e))?;
            let (choice, src) = gid::for_connect(&probe, index, addr)?;
            drop(probe);
            let id = rcm::resolve_from(Some(src), addr, &opts, deadline)
                .map_err(|e| map_cm(endpoint, e))?;
            (id, Some(choice))
        }
    };
    let pending = prepare(id, devices, cfg)?;
    let (pending, ev) = connect_bounded(pending, opts, deadline, addr, endpoint)?;
    if let Some(choice) = &choice {
        gid::check_readback(choice, &pending.qp)?;
    }
    let peer =
        FlowParams::decode(&ev.private_data).map_err(|e| map_cm(endpoint, CmError::from(e)))?;
    let peer_large = large::decode(&ev.private_data)?;
    pending
        .id
        .channel()
        .set_nonblocking(true)
        .map_err(|e| setup_err("event channel", e))?;
    finish(pending, peer, peer_large, cfg, &opts, addr.to_string())
}

/// Longest a failed or timed-out connect attempt waits for its teardown (QP and rdma_cm id
/// destruction) before returning anyway; the teardown then finishes on the helper thread.
const TEARDOWN_GRACE: Duration = Duration::from_millis(500);

/// What the connecting helper thread reports.
enum Attempt {
    /// ESTABLISHED: the prepared connection and the event (the peer's private data).
    Established(Box<(Pending, CmEvent)>),
    /// The attempt failed; its QP and id are torn down next, then [`Attempt::TornDown`] follows.
    Failed(CmError),
    /// The failed attempt's QP and id are destroyed.
    TornDown,
}

/// Runs `rdma_connect` and the wait for ESTABLISHED on a helper thread, so that the caller
/// returns by `deadline` (plus [`TEARDOWN_GRACE`]) whatever rdma_cm does: on iWARP
/// (soft-iWARP) `rdma_connect` connects the TCP stream synchronously and blocks for as long
/// as the kernel retries its SYNs (130 s measured with Linux's default `tcp_syn_retries` = 6)
/// when the peer does not answer, and destroying a half-connected id may wait on the driver.
/// On a failure the helper reports the error first and then tears the attempt down; the
/// caller waits for that at most [`TEARDOWN_GRACE`]. When the caller gave up, the helper
/// finishes on its own (bounded by the kernel's connect timeout) and drops the attempt.
fn connect_bounded(
    pending: Pending,
    opts: ConnOptions,
    deadline: Instant,
    addr: std::net::SocketAddr,
    endpoint: &str,
) -> Result<(Pending, CmEvent), Error> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Attempt>(2);
    let private = our_private(&pending);
    std::thread::Builder::new()
        .name("spinwire-rdma-connect".into())
        .spawn(move || {
            let res = pending.id.connect(&opts, &private).and_then(|()| {
                pending
                    .id
                    .wait_for(CmEventKind::Established, deadline, addr)
            });
            match res {
                Ok(ev) => {
                    // If the caller gave up (timed out), the attempt is dropped here.
                    let _ = tx.send(Attempt::Established(Box::new((pending, ev))));
                }
                Err(e) => {
                    let _ = tx.send(Attempt::Failed(e));
                    drop(pending);
                    let _ = tx.send(Attempt::TornDown);
                }
            }
        })
        .map_err(|e| setup_err("spawning the connect thread", e))?;
    let start = Instant::now();
    // rdma_cm's own failures arrive by `deadline`; a little slack lets a result that races the
    // deadline through.
    let wait = deadline.saturating_duration_since(start) + TEARDOWN_GRACE / 5;
    match rx.recv_timeout(wait) {
        Ok(Attempt::Established(b)) => Ok(*b),
        Ok(Attempt::Failed(e)) => {
            // Bounded wait for the teardown, so that resources are normally released on return.
            let _ = rx.recv_timeout(TEARDOWN_GRACE);
            Err(map_cm(endpoint, e))
        }
        Ok(Attempt::TornDown) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(RdmaSetupError::ConnectThreadLost.into())
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(map_cm(
            endpoint,
            CmError::Timeout {
                step: "rdma_connect (the kernel is still connecting)",
                waited: start.elapsed(),
            },
        )),
    }
}
