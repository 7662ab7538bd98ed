//! [`Engine`]: the handle that owns the control thread and the pollers, and the calls that make
//! connections and listeners through it.
//!
//! The handle itself, its threads and every call that needs no connection type live in
//! [`handle`]; the connection modules import that, and this module imports them.

use std::sync::mpsc;
use std::time::Duration;

use crate::conn::{Connection, Listener};
use crate::control::Request;
use crate::endpoint::Endpoint;
use crate::error::{Chain, Error};

pub(crate) mod handle;

pub use handle::Engine;

impl Engine {
    /// Listens on `endpoint` (`shm://name`). Connections are set up by the control thread and
    /// taken with [`Listener::accept_timeout`] / [`Listener::try_accept`].
    ///
    /// # Errors
    ///
    /// [`Error::BadEndpoint`], [`Error::FabricNotCompiled`], [`Error::Listen`] (name in use,
    /// socket errors), [`Error::Shutdown`].
    pub fn listen(&self, endpoint: &str) -> Result<Listener, Error> {
        let ep = Endpoint::parse(endpoint)?;
        let (reply, rx) = mpsc::sync_channel(1);
        self.request(Request::Listen {
            endpoint: ep,
            raw: endpoint.to_owned(),
            reply,
        })?;
        let (id, accepts) = self
            .wait_reply(&rx, Duration::from_secs(30))?
            .inspect_err(|e| tracing::warn!(endpoint, error = %Chain(e), "listen failed"))?;
        tracing::info!(endpoint, listener = id, "listening");
        Ok(Listener::new(
            self.clone(),
            id,
            endpoint.to_owned(),
            accepts,
        ))
    }

    /// Connects to `endpoint` with the configured connect timeout.
    ///
    /// # Errors
    ///
    /// As [`connect_timeout`](Self::connect_timeout).
    pub fn connect(&self, endpoint: &str) -> Result<Connection, Error> {
        self.connect_timeout(endpoint, self.config().connect_timeout)
    }

    /// Connects to `endpoint`, giving up after `timeout`. While nobody listens on it (no
    /// listener, the connection refused) it waits for one to appear, retrying every 1 ms at
    /// first and every 50 ms at most, so that the two sides may start in either order (`rdma://`
    /// does not wait: it fails at once). Any other failure ends it at once.
    ///
    /// # Errors
    ///
    /// [`Error::BadEndpoint`], [`Error::FabricNotCompiled`], [`Error::NoListener`] (nobody
    /// listened until the deadline), [`Error::Connect`] (refused by the listener, handshake
    /// failed), [`Error::Setup`], [`Error::Timeout`], [`Error::Shutdown`].
    pub fn connect_timeout(&self, endpoint: &str, timeout: Duration) -> Result<Connection, Error> {
        self.connect_with(endpoint, timeout, true)
    }

    /// One connect attempt, bounded by `timeout`, that fails at once when nobody listens (for
    /// [`Reconnecting`](crate::Reconnecting), whose policy paces its own attempts).
    ///
    /// # Errors
    ///
    /// As [`connect_timeout`](Self::connect_timeout), with [`Error::Connect`] instead of
    /// [`Error::NoListener`].
    pub(crate) fn connect_once(
        &self,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<Connection, Error> {
        self.connect_with(endpoint, timeout, false)
    }

    fn connect_with(
        &self,
        endpoint: &str,
        timeout: Duration,
        wait: bool,
    ) -> Result<Connection, Error> {
        let ep = Endpoint::parse(endpoint)?;
        let Some(connector) = self.connectors().iter().find(|c| c.scheme() == ep.scheme()) else {
            return Err(Error::FabricNotCompiled {
                fabric: ep.scheme(),
            });
        };
        // The rendezvous runs on this (the calling) thread, bounded by `timeout`; the control
        // thread then registers the connection with a poller.
        tracing::info!(endpoint, ?timeout, "connecting");
        let (reply, rx) = mpsc::sync_channel(1);
        connector
            .connect(&ep, endpoint, self.config(), timeout, wait, reply)
            .inspect_err(|e| tracing::warn!(endpoint, error = %Chain(e), "connect failed"))?;
        self.request(Request::Register {
            scheme: ep.scheme(),
        })?;
        let parts = self.wait_reply(&rx, Duration::from_secs(10))??;
        Ok(Connection::new(self.clone(), parts))
    }
}
