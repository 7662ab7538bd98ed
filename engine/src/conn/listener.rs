//! [`Listener`]: the application's handle on a listening endpoint; the control thread completes
//! each connection's setup and hands it over through a channel.

use std::sync::mpsc;
use std::time::Duration;

use super::Connection;
use crate::engine::handle::Engine;
use crate::error::Error;
use crate::link::ConnParts;

/// Accepts connections on an endpoint. `Send` but not `Sync`. Dropping it stops listening.
pub struct Listener {
    engine: Engine,
    id: u64,
    endpoint: String,
    accepts: mpsc::Receiver<ConnParts>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl Listener {
    pub(crate) fn new(
        engine: Engine,
        id: u64,
        endpoint: String,
        accepts: mpsc::Receiver<ConnParts>,
    ) -> Listener {
        Listener {
            engine,
            id,
            endpoint,
            accepts,
        }
    }

    /// The endpoint listened on.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Waits up to `timeout` for the next connection (the control thread has already completed
    /// its setup). In run-to-completion mode the wait keeps the poller turning, as every wait
    /// of the engine does: this thread may be the only one that serves the engine's other
    /// connections, and the control thread, which covers for an application that makes no
    /// call, is the one setting the connection up (an RDMA connection's registration holds it
    /// for a second or so in the Soft-RoCE VM, past a short liveness timeout).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`], or [`Error::Shutdown`] when the engine is stopping.
    pub fn accept_timeout(&self, timeout: Duration) -> Result<Connection, Error> {
        let parts = self.engine.wait_reply(&self.accepts, timeout)?;
        Ok(Connection::new(self.engine.clone(), parts))
    }

    /// The next connection, if one is waiting.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] when the engine is stopping.
    pub fn try_accept(&self) -> Result<Option<Connection>, Error> {
        match self.accepts.try_recv() {
            Ok(parts) => Ok(Some(Connection::new(self.engine.clone(), parts))),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => Err(Error::Shutdown),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.engine.close_listener(self.id);
        // Connections accepted by the control thread but never taken are closed here.
        while let Ok(parts) = self.accepts.try_recv() {
            drop(Connection::new(self.engine.clone(), parts));
        }
    }
}
