//! Result codes, the thread-local error message and the panic guard of every entry point.
//!
//! Every `sw_*` call returns `SW_OK` (0) or a non-negative count on success and one of the
//! negative `SW_*` codes below on failure; the failing call also leaves a message with the whole
//! cause chain (`"sw_connect: connect to \"shm://x\" failed: ...: No such file or directory"`) in
//! a thread-local buffer that [`sw_errmsg`] returns.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_char;
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

use spinwire_rs::{Error, FabricError};

/// Success.
pub const SW_OK: i32 = 0;
/// No room right now: no free buffer (they are in flight) or no credit (the receiver has not
/// made room yet): poll and retry; nothing was sent. From `sw_hold`: the application holds as
/// many messages as it may (`sw_conn_max_held`): release one; nothing was taken.
pub const SW_BACK_PRESSURED: i32 = -1;
/// Connecting failed: nobody listens on the endpoint, the peer refused, or the handshake failed.
pub const SW_NOT_CONNECTED: i32 = -2;
/// The connection is closed: the peer closed it or its process died. Messages it sent before
/// were delivered first. Close the handle.
pub const SW_CLOSED: i32 = -3;
/// The wait ran out (`sw_connect`, `sw_accept`, `sw_next_event` waits).
pub const SW_TIMEOUT: i32 = -4;
/// The message is larger than the connection's maximum message size
/// (`sw_conn_max_message_size`).
pub const SW_TOO_LARGE: i32 = -5;
/// A null or invalid handle or pointer, a claim that is stale or belongs to another connection,
/// or a call made where it is not allowed (closing a connection from inside its `sw_poll`
/// handler).
pub const SW_BAD_ARG: i32 = -6;
/// The endpoint is not a valid `shm://name`, `tcp://host:port` or `rdma://host:port` URL.
pub const SW_BAD_ENDPOINT: i32 = -7;
/// An invalid `sw_config` value (out of range, unknown idle strategy, unusable core).
pub const SW_BAD_CONFIG: i32 = -8;
/// The application itself holds every send buffer of the connection (outstanding claims):
/// commit or abort one.
pub const SW_POOL_EXHAUSTED: i32 = -9;
/// The connection failed on the data path (peer protocol violation, peer unresponsive for the
/// liveness timeout, fabric I/O error, or the peer aborted it because of this side: silent for
/// its liveness timeout, or breaking the protocol). The connection's `SW_EVENT_ERROR` or
/// `SW_EVENT_PEER_UNRESPONSIVE` says which (`sw_event.reason`). Close the handle.
pub const SW_CONN_FAILED: i32 = -10;
/// Setting up a resource failed: listening (name in use), a shared-memory segment, a queue pair,
/// a thread. `sw_errmsg` names the step and the OS error.
pub const SW_SETUP_FAILED: i32 = -11;
/// The endpoint names a fabric this build of the library does not include (`rdma://` without
/// the `rdma` feature).
pub const SW_UNSUPPORTED: i32 = -12;
/// The engine is shutting down or its control thread is gone.
pub const SW_SHUTDOWN: i32 = -13;
/// An internal error: a bug in the library (a panic, caught at the boundary) or an error this
/// version of the C API does not know. The handle involved should be closed.
pub const SW_INTERNAL: i32 = -14;

/// A claim on this connection is still open: commit or abort it first. At most one claim of
/// ring space (`sw_try_claim` of a message up to the inline threshold on shm) is open at a
/// time, and while it is open nothing else is claimed or sent on the connection (`sw_offer`,
/// another `sw_try_claim`, the commit of a pool-buffer claim: that claim stays valid).
pub const SW_CLAIM_OPEN: i32 = -15;

/// A listener refused a connection: it holds its maximum of connections (1024; open ones and
/// handshakes under way). The `code` of an `SW_EVENT_ERROR` on the listener's engine
/// (`has_conn` false); the connector's `sw_connect` fails with `SW_NOT_CONNECTED` (busy).
pub const SW_REFUSED: i32 = -16;

/// The most negative code: every code is between `SW_CODE_MIN` and `SW_OK`, both included.
pub const SW_CODE_MIN: i32 = SW_REFUSED;

/// The code of an engine error.
pub(crate) fn code_of(e: &Error) -> i32 {
    match e {
        Error::BadEndpoint { .. } => SW_BAD_ENDPOINT,
        Error::FabricNotCompiled { .. } => SW_UNSUPPORTED,
        Error::Config(_) | Error::BadCore { .. } => SW_BAD_CONFIG,
        Error::Thread { .. } | Error::Listen { .. } | Error::Setup(_) => SW_SETUP_FAILED,
        Error::Connect { .. } | Error::NoListener { .. } => SW_NOT_CONNECTED,
        Error::ListenerFull { .. } => SW_REFUSED,
        Error::Timeout => SW_TIMEOUT,
        // The application holds the most received messages: back-pressure on its own receives.
        Error::WouldBlock | Error::TooManyHeld { .. } => SW_BACK_PRESSURED,
        Error::ClaimOpen => SW_CLAIM_OPEN,
        Error::PoolExhausted { .. } => SW_POOL_EXHAUSTED,
        Error::MessageTooLarge { .. } => SW_TOO_LARGE,
        Error::Disconnected | Error::Fabric(FabricError::PeerClosed) => SW_CLOSED,
        Error::Fabric(_) => SW_CONN_FAILED,
        Error::ForeignBuffer => SW_BAD_ARG,
        Error::Shutdown => SW_SHUTDOWN,
        // Every variant above has its code; `Error` is `#[non_exhaustive]`, so a variant added
        // later lands here until it gets one (the `codes_of_every_error` test lists them).
        _ => SW_INTERNAL,
    }
}

/// The name of a code (`"SW_CLOSED"`), as a static NUL-terminated string; `"SW_UNKNOWN"` for a
/// value that is not a code. Never fails, never allocates.
#[no_mangle]
pub extern "C" fn sw_strerror(code: i32) -> *const c_char {
    let s: &'static [u8] = match code {
        SW_OK => b"SW_OK\0",
        SW_BACK_PRESSURED => b"SW_BACK_PRESSURED\0",
        SW_NOT_CONNECTED => b"SW_NOT_CONNECTED\0",
        SW_CLOSED => b"SW_CLOSED\0",
        SW_TIMEOUT => b"SW_TIMEOUT\0",
        SW_TOO_LARGE => b"SW_TOO_LARGE\0",
        SW_BAD_ARG => b"SW_BAD_ARG\0",
        SW_BAD_ENDPOINT => b"SW_BAD_ENDPOINT\0",
        SW_BAD_CONFIG => b"SW_BAD_CONFIG\0",
        SW_POOL_EXHAUSTED => b"SW_POOL_EXHAUSTED\0",
        SW_CONN_FAILED => b"SW_CONN_FAILED\0",
        SW_SETUP_FAILED => b"SW_SETUP_FAILED\0",
        SW_UNSUPPORTED => b"SW_UNSUPPORTED\0",
        SW_SHUTDOWN => b"SW_SHUTDOWN\0",
        SW_INTERNAL => b"SW_INTERNAL\0",
        SW_CLAIM_OPEN => b"SW_CLAIM_OPEN\0",
        SW_REFUSED => b"SW_REFUSED\0",
        _ => b"SW_UNKNOWN\0",
    };
    s.as_ptr().cast()
}

thread_local! {
    /// The last failure's message on this thread, NUL-terminated (empty: none yet). Its capacity
    /// is kept, so after the first failures of a thread setting it allocates nothing.
    static ERRMSG: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The message of the last call that failed on this thread: the function, the error and its
/// whole cause chain, `": "`-separated. An empty string if no call failed on this thread yet.
///
/// The pointer stays valid until the next `sw_*` call on this thread that fails; copy the string
/// to keep it. Successful calls leave it alone, so it is meaningful right after a call returned a
/// negative code. Never fails; never returns NULL.
#[no_mangle]
pub extern "C" fn sw_errmsg() -> *const c_char {
    let p = ERRMSG.try_with(|m| match m.try_borrow() {
        Ok(m) if !m.is_empty() => m.as_ptr().cast::<c_char>(),
        _ => std::ptr::null(),
    });
    match p {
        Ok(p) if !p.is_null() => p,
        _ => c"".as_ptr(),
    }
}

/// Records `msg` as this thread's error message (what `sw_errmsg` returns until the next
/// failure) and returns `code`: for a wrapper that fails a call itself, before reaching the
/// library, so that its callers read the right message (spinwire.hpp does). `msg` may be NULL
/// (an empty message); invalid UTF-8 is replaced. Never fails.
///
/// # Safety
///
/// `msg` is NULL or a valid NUL-terminated string.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_set_errmsg(code: i32, msg: *const c_char) -> i32 {
    let text = if msg.is_null() {
        std::borrow::Cow::Borrowed("")
    } else {
        // SAFETY: non-null and NUL-terminated per the contract.
        unsafe { std::ffi::CStr::from_ptr(msg) }.to_string_lossy()
    };
    guard("sw_set_errmsg", || {
        store("", |s| s.push_str(&text));
        code
    })
}

/// Stores `what: <display of e>` and e's source chain as this thread's error message (no
/// prefix when `what` is empty).
fn store(what: &str, write: impl FnOnce(&mut String)) {
    // A `String` that borrows the thread-local buffer's allocation, so its capacity is reused.
    let _ = ERRMSG.try_with(|m| {
        let Ok(mut m) = m.try_borrow_mut() else {
            return;
        };
        let mut buf = std::mem::take(&mut *m);
        buf.clear();
        // The buffer only ever holds UTF-8 (it is written from `str`s below), so this cannot fail.
        let mut s = String::from_utf8(buf).unwrap_or_default();
        if !what.is_empty() {
            s.push_str(what);
            s.push_str(": ");
        }
        write(&mut s);
        // Interior NULs would cut the C string short; they are replaced, not dropped silently.
        let mut bytes = s.into_bytes();
        for b in bytes.iter_mut() {
            if *b == 0 {
                *b = b'?';
            }
        }
        bytes.push(0);
        *m = bytes;
    });
}

/// Records `e` (with its cause chain) as this thread's error and returns its code.
#[cold]
pub(crate) fn fail(what: &str, e: &Error) -> i32 {
    store(what, |s| {
        let _ = write!(s, "{e}");
        let mut source = std::error::Error::source(e);
        while let Some(cause) = source {
            let _ = write!(s, ": {cause}");
            source = cause.source();
        }
    });
    code_of(e)
}

/// Records a failure that has no engine error behind it (a bad argument) and returns `code`.
#[cold]
pub(crate) fn fail_msg(what: &str, code: i32, msg: &str) -> i32 {
    store(what, |s| s.push_str(msg));
    code
}

/// Runs an entry point's body, turning a panic into `SW_INTERNAL` with its message in
/// `sw_errmsg`: no unwind crosses the C boundary.
#[inline]
pub(crate) fn guard<T: From<i32>>(what: &str, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => T::from(panicked(what, payload.as_ref())),
    }
}

#[cold]
fn panicked(what: &str, payload: &(dyn Any + Send)) -> i32 {
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)");
    store(what, |s| {
        s.push_str("internal error (panic caught at the C boundary): ");
        s.push_str(msg);
    });
    SW_INTERNAL
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn errmsg() -> String {
        // SAFETY: `sw_errmsg` returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(sw_errmsg()) }
            .to_str()
            .unwrap()
            .to_owned()
    }

    #[test]
    fn panics_become_internal() {
        let r: i32 = guard("sw_test", || panic!("boom {}", 7));
        assert_eq!(r, SW_INTERNAL);
        assert!(errmsg().contains("sw_test: internal error"), "{}", errmsg());
        assert!(errmsg().contains("boom 7"), "{}", errmsg());
        let r: i64 = guard("sw_test", || -> i64 { panic!("static") });
        assert_eq!(r, i64::from(SW_INTERNAL));
        assert!(errmsg().ends_with("static"), "{}", errmsg());
    }

    #[test]
    fn codes_of_errors_not_reachable_from_c() {
        assert_eq!(
            code_of(&Error::Fabric(FabricError::Protocol("x"))),
            SW_CONN_FAILED
        );
        assert_eq!(code_of(&Error::Fabric(FabricError::Io(5))), SW_CONN_FAILED);
        assert_eq!(
            code_of(&Error::Fabric(FabricError::PeerUnresponsive {
                silent_for: std::time::Duration::from_secs(1)
            })),
            SW_CONN_FAILED
        );
        assert_eq!(code_of(&Error::Fabric(FabricError::PeerClosed)), SW_CLOSED);
        assert_eq!(code_of(&Error::Disconnected), SW_CLOSED);
        assert_eq!(code_of(&Error::Shutdown), SW_SHUTDOWN);
        assert_eq!(code_of(&Error::ForeignBuffer), SW_BAD_ARG);
        assert_eq!(code_of(&Error::ClaimOpen), SW_CLAIM_OPEN);
        assert_eq!(code_of(&Error::BadCore { core: 9999 }), SW_BAD_CONFIG);
    }

    /// Every variant of the engine's `Error` (as of this version) has a code of its own, not
    /// `SW_INTERNAL`. Add a line here with each new variant.
    #[test]
    fn codes_of_every_error() {
        use spinwire_rs::{AbortReason, ConfigError, SetupError};
        let io = || std::io::Error::other("x");
        let boxed = || -> spinwire_rs::BoxError { Box::new(io()) };
        let cases: Vec<(Error, i32)> = vec![
            (
                Error::BadEndpoint {
                    endpoint: "x".into(),
                    reason: "y",
                },
                SW_BAD_ENDPOINT,
            ),
            (Error::FabricNotCompiled { fabric: "rdma" }, SW_UNSUPPORTED),
            (Error::Config(ConfigError::SignalEvery), SW_BAD_CONFIG),
            (
                Error::Thread {
                    what: "poller",
                    source: io(),
                },
                SW_SETUP_FAILED,
            ),
            (Error::BadCore { core: 1 }, SW_BAD_CONFIG),
            (
                Error::Listen {
                    endpoint: "x".into(),
                    source: boxed(),
                },
                SW_SETUP_FAILED,
            ),
            (
                Error::ListenerFull {
                    endpoint: "x".into(),
                    max: 1,
                },
                SW_REFUSED,
            ),
            (
                Error::Connect {
                    endpoint: "x".into(),
                    source: boxed(),
                },
                SW_NOT_CONNECTED,
            ),
            (
                Error::NoListener {
                    endpoint: "x".into(),
                    waited: std::time::Duration::ZERO,
                    source: boxed(),
                },
                SW_NOT_CONNECTED,
            ),
            (Error::Setup(SetupError::PollersFull), SW_SETUP_FAILED),
            (Error::Timeout, SW_TIMEOUT),
            (Error::WouldBlock, SW_BACK_PRESSURED),
            (Error::ClaimOpen, SW_CLAIM_OPEN),
            (Error::PoolExhausted { count: 1 }, SW_POOL_EXHAUSTED),
            (Error::TooManyHeld { max: 1 }, SW_BACK_PRESSURED),
            (Error::MessageTooLarge { size: 2, max: 1 }, SW_TOO_LARGE),
            (Error::Disconnected, SW_CLOSED),
            (Error::Fabric(FabricError::PeerClosed), SW_CLOSED),
            (
                Error::Fabric(FabricError::PeerAborted(AbortReason::Unresponsive)),
                SW_CONN_FAILED,
            ),
            (
                Error::Fabric(FabricError::PeerAborted(AbortReason::Protocol)),
                SW_CONN_FAILED,
            ),
            (Error::ForeignBuffer, SW_BAD_ARG),
            (Error::Shutdown, SW_SHUTDOWN),
        ];
        for (e, code) in cases {
            assert_eq!(code_of(&e), code, "{e:?}");
        }
    }

    #[test]
    fn chain_and_names() {
        let io = std::io::Error::other("inner cause");
        let e = Error::Thread {
            what: "poller",
            source: io,
        };
        assert_eq!(fail("sw_engine_new", &e), SW_SETUP_FAILED);
        assert_eq!(
            errmsg(),
            "sw_engine_new: could not start the poller thread: inner cause"
        );
        for code in SW_CODE_MIN..=SW_OK {
            // SAFETY: `sw_strerror` returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(sw_strerror(code)) }
                .to_str()
                .unwrap();
            assert!(name.starts_with("SW_") && name != "SW_UNKNOWN", "{code}");
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(sw_strerror(1)) };
        assert_eq!(unknown.to_str().unwrap(), "SW_UNKNOWN");
    }
}
