//! Unix-domain-socket rendezvous for the shm fabric (control plane only; never on the data path).
//!
//! A listener binds a *name*; a connector connects to it by name. Both ends then run a small
//! versioned handshake over the connected `SOCK_SEQPACKET` socket, which also carries the shared
//! segment's memfd (`SCM_RIGHTS`), and the socket then stays open for the connection's lifetime
//! so that a dead peer is seen as a hang-up ([`UdsStream::poll_hangup`]).
//!
//! # Names and the runtime directory
//! Names are 1 to [`MAX_NAME_LEN`] bytes of `[A-Za-z0-9._-]`, not starting with `.`
//! ([`validate_name`]). Sockets live in a per-user directory of mode 0700 ([`runtime_dir`]):
//! `$SPINWIRE_RUNTIME_DIR` if set, else `$XDG_RUNTIME_DIR/spinwire`, else `/tmp/spinwire-<uid>`.
//! The directory must be owned by the effective uid and not be accessible to group or others,
//! otherwise binding and connecting fail with [`UdsError::InsecureRuntimeDir`].
//!
//! A listener for `name` holds an exclusive `flock` on `<dir>/<name>.lock` for its lifetime, so
//! a socket file left behind by a dead process is recognised as stale and replaced safely, and a
//! second live listener gets [`UdsError::AddrInUse`]. A listener unlinks its socket file (only if
//! it is still the one it created) and its lock file on drop; a bind also removes the files that
//! dead listeners (SIGKILL) of any name left behind. A lock counts only while its file is still
//! the one at the path (the taker checks after its `flock`), so that removing lock files never
//! lets two listeners hold one name.
//!
//! Both ends check the peer's credentials (`SO_PEERCRED`): a peer with another uid is refused with
//! [`UdsError::ForeignPeer`].
//!
//! # Handshake (protocol version [`PROTOCOL_VERSION`])
//! Every message is one 64-byte datagram (`magic "SPWC"`, version, kind, pid, reason, params,
//! reserved zeros; little endian).
//!
//! ```text
//! connector                         listener
//!   connect(name)      ──────────▶  accept (SO_PEERCRED uid check)
//!   send_hello(params) ──HELLO────▶ recv_hello()     version checked, rejected if different
//!                                   engine validates params, creates the segment
//!   recv_offer()       ◀─ACCEPT+fd─ send_accept(params, fd)   or  ◀─REJECT(reason)─ send_reject
//!   engine validates params, attaches the segment
//!   send_ready()       ──READY────▶ recv_ready()     or ──ABORT(reason)──▶ (attach failed)
//!   ... the socket stays open: poll_hangup() on both ends; send_bye() for a clean close ...
//! ```
//!
//! # Layout
//! - `proto`: the wire format (64-byte messages, [`ConnParams`], [`HandshakeRefusal`]); no
//!   system calls.
//! - `sys`: the socket system calls (`SOCK_SEQPACKET` sockets, addresses, `SO_PEERCRED`,
//!   bounded `poll(2)` waits).
//! - `path`: names and the runtime directory ([`validate_name`], [`runtime_dir`],
//!   [`socket_path`]).
//! - `listener`: [`UdsListener`]; `stream`: [`connect`] and [`UdsStream`] with the handshake
//!   steps; `testing`: raw wire access for tests.
//!
//! # Example
//! ```
//! use std::time::Duration;
//! use cm::uds::{self, ConnParams, UdsListener};
//!
//! let name = format!("doc-example-{}", std::process::id());
//! let listener = UdsListener::bind(&name)?;
//! let t = Duration::from_secs(2);
//! let params = ConnParams { buffer_size: 4096, buffer_count: 64, ring_depth: 128, inline_max: 200, flags: 0, large_size: 0, large_count: 0 };
//!
//! let mut client = uds::connect(&name, t)?;
//! client.send_hello(&params, t)?;
//!
//! let mut server = listener.accept_timeout(t)?;
//! let hello = server.recv_hello(t)?;
//! assert_eq!(hello.params, params);
//! let file = std::fs::File::open("/dev/null").unwrap(); // the engine sends its memfd here
//! server.send_accept(&hello.params, std::os::fd::AsFd::as_fd(&file), t)?;
//!
//! let offer = client.recv_offer(t)?;
//! assert_eq!(offer.params, params);
//! client.send_ready(t)?;
//! server.recv_ready(t)?;
//!
//! assert!(!server.poll_hangup()?);
//! drop(client);
//! assert!(server.poll_hangup()?);
//! # Ok::<(), cm::uds::UdsError>(())
//! ```

/// Longest accepted rendezvous name, in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// Version of the handshake protocol; peers must match exactly.
pub const PROTOCOL_VERSION: u16 = 2;
/// Environment variable overriding the runtime directory.
pub const RUNTIME_DIR_ENV: &str = "SPINWIRE_RUNTIME_DIR";

mod error;
mod listener;
mod lock;
mod path;
mod proto;
mod stream;
mod sys;
#[doc(hidden)]
pub mod testing;

pub use error::UdsError;
pub use listener::UdsListener;
pub use path::{runtime_dir, socket_path, validate_name};
pub use proto::{ConnParams, HandshakeRefusal, Hello, Offer};
pub use stream::{connect, UdsStream};
pub use sys::PeerCred;
