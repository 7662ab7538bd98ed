//! spinwire: a busy-polling, kernel-bypass data-plane engine.
//!
//! (Crate docs: see the sections below; the full text lands with the engine issue.)

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod config;
mod conn;
mod control;
mod desc;
mod endpoint;
mod engine;
mod error;
pub mod fabric;
mod idle;
mod poller;
mod stats;

pub use config::{EngineBuilder, IdleStrategy, MAX_BATCH, MAX_BUFFERS, MAX_BUFFER_SIZE};
pub use conn::{Connection, Listener, Message, SendBuf};
pub use desc::{PoolView, RxDesc, TxDesc, INLINE_MAX};
pub use endpoint::MAX_SHM_NAME;
pub use engine::{Engine, Event};
pub use error::{BoxError, Error, FabricError, SendError};
pub use stats::{ConnStats, EngineStats, PollerStats};
