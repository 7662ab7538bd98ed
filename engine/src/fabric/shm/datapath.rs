//! The shm fabric's poller side: [`ShmFabric`], with no connections.
//!
//! shm connections never reach a poller: both ends of each record ring are the two
//! applications' threads (Aeron IPC's shape), driven through the direct path
//! ([`super::direct`]). `ShmFabric` stays in the poller's agent set so that the control half
//! keeps the same seam as every fabric; its connection type [`ShmConn`] has no values.

use crate::desc::TxDesc;
use crate::error::FabricError;
use crate::fabric::{Fabric, FabricConn, RxSink, TxDone};

/// Per-poller state of the shm fabric: none, and it never serves a connection.
#[derive(Debug, Default)]
pub struct ShmFabric;

impl Fabric for ShmFabric {
    const NAME: &'static str = "shm";
    type Conn = ShmConn;
    type Command = ();

    fn on_command(&mut self, _command: ()) {}
}

/// The poller-side connection of shm: uninhabited (shm connections use the direct path).
#[derive(Debug)]
pub enum ShmConn {}

impl FabricConn for ShmConn {
    fn poll_rx(&mut self, _sink: &mut RxSink<'_>) -> Result<usize, FabricError> {
        match *self {}
    }

    fn post_send(
        &mut self,
        _descs: &[TxDesc],
        _done: &mut TxDone<'_>,
    ) -> Result<usize, FabricError> {
        match *self {}
    }

    fn release_rx(&mut self, _bufs: &[u32]) -> Result<(), FabricError> {
        match *self {}
    }

    fn reclaim(&mut self, _done: &mut TxDone<'_>) -> Result<usize, FabricError> {
        match *self {}
    }

    fn flush(&mut self) -> Result<(), FabricError> {
        match *self {}
    }
}
