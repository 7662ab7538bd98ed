//! Fabrics: the transports the poller is generic over.

pub mod shm;
