//! `libspinwire`: the C ABI of [spinwire](spinwire_rs), in the idiom of Aeron's C API.
//!
//! Built as `libspinwire.so` (SONAME `libspinwire.so.MAJOR`, set by `build.rs`) and
//! `libspinwire.a` (`cargo build --release -p spinwire-ffi`, then link with `-lspinwire`;
//! `scripts/install-c PREFIX` installs them with the headers, `spinwire.pc` and the CMake
//! package); the header `ffi/include/spinwire.h` is generated from this crate by cbindgen
//! (`ffi/cbindgen.toml`) and checked in (`ffi/tests/header.rs` fails when it is stale).
//! `ffi/include/spinwire.hpp` is a header-only C++14 RAII wrapper.
//!
//! Files: `config` (`sw_config` and its range checks), `engine` (the engine handle, events,
//! counters), `conn` (listeners, connections, offers, `sw_poll`), `claim` (zero-copy claims),
//! `held` (held messages), `error` (codes and the thread-local message), `handle` (the tag
//! check of every handle).
//!
//! # The API
//!
//! * Opaque handles, each a heap object behind a pointer: [`sw_engine`] ([`sw_engine_new`] with
//!   an [`sw_config`] filled by [`sw_config_init`], [`sw_engine_close`]), [`sw_listener`]
//!   ([`sw_listen`], [`sw_accept`] with a timeout, [`sw_listener_close`]) and [`sw_conn`]
//!   ([`sw_connect`] with a timeout, [`sw_conn_close`]).
//! * The data path: [`sw_offer`] (copies; [`sw_offer_batched`] for streams), [`sw_try_claim`] +
//!   [`sw_claim_commit`] / [`sw_claim_abort`] (zero copy: write in place in a send buffer),
//!   [`sw_poll`] (batch receive into a handler, Aeron's `subscription_poll`), [`sw_hold`] +
//!   [`sw_release`] (receive a message and keep it in place beyond the call, bounded by the
//!   receive pool: [`sw_conn_max_held`]), [`sw_flush`], [`sw_engine_poll`]
//!   (run-to-completion). These calls allocate nothing and take no lock.
//! * Events ([`sw_next_event`]) and counters ([`sw_conn_get_stats`], [`sw_engine_get_stats`]) as plain
//!   structs. An event that takes a connection down says why in `sw_event.reason` (the peer
//!   closed, went silent, broke the protocol, or aborted the connection because of this side:
//!   `SW_REASON_*`). The engine's counters are the pollers': shm connections bypass the pollers, so
//!   their messages are counted per connection only.
//!
//! # Errors
//!
//! Every call returns `SW_OK` (0) or a count on success and a negative `SW_*` code on failure
//! (see [`error`]); [`sw_errmsg`] then holds the failure's message with the whole cause chain
//! (thread-local), and [`sw_strerror`] names a code. No panic crosses the boundary: each entry
//! point catches it and returns [`SW_INTERNAL`].
//!
//! # Safety across the boundary
//!
//! * Handles carry a tag word checked on entry: NULL, a pointer to something else and (while
//!   its memory is not reused) a closed handle give [`SW_BAD_ARG`]. Using a closed handle is
//!   still undefined behaviour; the check is a safety net.
//! * Thread affinity is Rust's: an engine handle may be used from any number of threads at once;
//!   a listener or a connection (with its claims) from one thread at a time (it may move between
//!   threads between calls). Nothing checks this.
//! * A claim borrows its connection's memory (on shm, up to the inline threshold, the ring record
//!   itself: at most one such claim open per connection, and nothing else is claimed or sent
//!   on it meanwhile, [`SW_CLAIM_OPEN`]; otherwise a send buffer): commit or abort it before
//!   closing the connection ([`sw_conn_close`] aborts what is left).
//! * An [`sw_poll`] handler sees each message during the call only, must not close the
//!   connection being polled (caught) and must not unwind out of the call.

#![warn(missing_docs)]

pub mod claim;
pub mod config;
pub mod conn;
pub mod engine;
pub mod error;
mod handle;
pub mod held;

pub use claim::{
    sw_claim, sw_claim_abort, sw_claim_commit, sw_offer_in_place, sw_try_claim, sw_writer,
};
pub use config::*;
pub use conn::{
    sw_accept, sw_conn, sw_conn_close, sw_conn_get_stats, sw_conn_id, sw_conn_is_open,
    sw_conn_max_message_size, sw_conn_stats, sw_flush, sw_handler, sw_listener, sw_listener_close,
    sw_offer, sw_offer_batched, sw_poll, sw_spin_pause, sw_wait,
};
pub use engine::{
    sw_connect, sw_engine, sw_engine_close, sw_engine_get_stats, sw_engine_new, sw_engine_poll,
    sw_engine_stats, sw_event, sw_listen, sw_next_event, SW_EVENT_CONNECTED, SW_EVENT_DISCONNECTED,
    SW_EVENT_ERROR, SW_EVENT_OTHER, SW_EVENT_PEER_LEN, SW_EVENT_PEER_UNRESPONSIVE,
    SW_REASON_ABORTED_PROTOCOL, SW_REASON_ABORTED_UNRESPONSIVE, SW_REASON_IO, SW_REASON_NONE,
    SW_REASON_OTHER, SW_REASON_PEER_CLOSED, SW_REASON_PEER_UNRESPONSIVE, SW_REASON_PROTOCOL,
};
pub use error::*;
pub use held::{sw_conn_max_held, sw_conn_outstanding, sw_hold, sw_msg, sw_release};
