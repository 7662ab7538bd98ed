//! TCP connection setup: the parameter handshake, the buffer pools, listening and connecting.
//! Runs on the control thread (accepts, as a non-blocking state machine: [`Handshake`]) or on
//! the thread calling `connect` (bounded by its timeout), never on a poller.
//!
//! The handshake (one 32-byte hello each way) is specified in `hello`; it settles the
//! connection's message limit. Each pool (the send buffers, the receive chunks and, with large
//! messages on, each direction's **large pool** of `large_buffers` slots of the limit) is one
//! anonymous `MAP_NORESERVE` mapping, made here and unmapped when the last holder of the
//! connection's memory drops it, whose pages take memory only as messages touch them: an idle
//! connection commits none of them.

use std::any::Any;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::deadline_after;
use crate::config::Config;
use crate::desc::PoolView;
use crate::error::{Error, SetupError};
use crate::link::Pools;
use crate::placement::{PlacedRegion, Placer};
use crate::record;

use super::datapath::{depth_for, rx_chunks, rx_window, ConnSizes, TcpConn};
use super::error::TcpSetupError;
use super::hello::{
    TcpParams, HELLO_LEN, MAX_RX_WINDOW, STATUS_BUSY, STATUS_INVALID, STATUS_MISMATCH, STATUS_OK,
    WIRE_VERSION,
};

/// How long an accepted connection may take to send its hello. The control thread does not
/// wait: the pending handshake is an entry with this deadline (see [`Handshake`]).
pub(crate) const ACCEPT_TIMEOUT: Duration = Duration::from_millis(1000);

impl From<TcpSetupError> for Error {
    fn from(e: TcpSetupError) -> Error {
        Error::Setup(SetupError::Tcp(e))
    }
}

/// The params this engine announces.
pub(crate) fn params_for(cfg: &Config) -> Result<TcpParams, Error> {
    let buffer_size = u32::try_from(cfg.buffer_size)
        .ok()
        .filter(|&b| b as usize <= record::MAX_PAYLOAD)
        .ok_or(TcpSetupError::BufferSize {
            size: cfg.buffer_size,
            max: record::MAX_PAYLOAD,
        })?;
    // Both are in range: the builder checks them against `MAX_MESSAGE_SIZE` (< 2^32) and
    // `MAX_LARGE_BUFFERS`.
    let (max_message_size, large_buffers) = match cfg.large_pool() {
        (0, _) | (_, 0) => (buffer_size, 0),
        (size, slots) => (u32::try_from(size).unwrap_or(u32::MAX), slots),
    };
    let (chunk, _) = rx_chunks(cfg.buffer_size, cfg.buffers)
        .ok_or(TcpSetupError::Alloc { bytes: usize::MAX })?;
    let window = rx_window(chunk);
    Ok(TcpParams {
        version: WIRE_VERSION,
        buffer_size,
        depth: u32::try_from(depth_for(cfg.depth, cfg.depth_set, window)).unwrap_or(u32::MAX),
        max_message_size,
        large_buffers,
        // At most `MAX_RX_WINDOW` (`rx_window`).
        rx_window: u32::try_from(window).unwrap_or(MAX_RX_WINDOW),
    })
}

/// One anonymous mapping holding a pool (send buffers, receive chunks, or large slots), placed
/// by the engine's [`Placer`]: on 4 KiB pages `MAP_NORESERVE` and zero filled by the kernel, so
/// its pages take memory only once a message touches them (an idle connection commits none of
/// its pools); on hugepages rounded up to 2 MiB and reserved when mapped. Unmapped on drop.
struct Mapped {
    region: PlacedRegion,
}

impl Mapped {
    /// `slot_bytes * slots` bytes, or no mapping (a dangling pointer) for zero bytes.
    fn new(placer: &Placer, slot_bytes: usize, slots: u32) -> Result<Mapped, TcpSetupError> {
        let bytes = slot_bytes
            .checked_mul(slots as usize)
            .filter(|&b| b <= isize::MAX as usize / 2)
            .ok_or(TcpSetupError::Alloc { bytes: usize::MAX })?;
        let region = placer.anon(bytes).map_err(TcpSetupError::Placement)?;
        Ok(Mapped { region })
    }
}

/// A connection's buffer pools (send, receive, and the large send and receive pools), kept
/// alive by every holder of their views.
pub(crate) struct TcpPools {
    tx: Mapped,
    rx: Mapped,
    tx_large: Mapped,
    rx_large: Mapped,
}

/// A fully set-up TCP connection, before it is registered with the engine.
pub(crate) struct Established {
    pub(crate) conn: TcpConn,
    pub(crate) pools: Pools,
    pub(crate) keep: Arc<dyn Any + Send + Sync>,
    pub(crate) peer: SocketAddr,
}

fn opt_err(what: &'static str) -> impl FnOnce(io::Error) -> TcpSetupError {
    move |source| TcpSetupError::SocketOption { what, source }
}

/// Builds the pools and the data-path state of a connected, handshaken socket.
fn establish(
    stream: TcpStream,
    peer: SocketAddr,
    ours: &TcpParams,
    theirs: &TcpParams,
    cfg: &Config,
) -> Result<Established, Error> {
    stream
        .set_nonblocking(true)
        .map_err(opt_err("O_NONBLOCK"))?;
    stream.set_nodelay(true).map_err(opt_err("TCP_NODELAY"))?;
    let buf_size = cfg.buffer_size;
    let count = u32::try_from(cfg.buffers).unwrap_or(u32::MAX);
    // The receive pool is the connection's receive chunks (messages are read in place there).
    let (chunk, chunks) =
        rx_chunks(buf_size, cfg.buffers).ok_or(TcpSetupError::Alloc { bytes: usize::MAX })?;
    if chunk > u32::MAX as usize {
        return Err(TcpSetupError::Alloc { bytes: usize::MAX }.into());
    }
    // The large pools: slots of the connection's limit (so that `max_message_size()` reports
    // it); a receive slot also holds the record's padding, which is read into it.
    let (limit, large) = ours.message_limit(theirs);
    let (tx_slot, rx_slot, slots) = if large {
        let rx_slot = record::align8(limit).ok_or(TcpSetupError::Alloc { bytes: usize::MAX })?;
        (limit, rx_slot, cfg.large_buffers as u32)
    } else {
        (0, 0, 0)
    };
    let pools = Arc::new(TcpPools {
        tx: Mapped::new(&cfg.placer, buf_size, count)?,
        rx: Mapped::new(&cfg.placer, chunk, chunks)?,
        tx_large: Mapped::new(&cfg.placer, tx_slot, slots)?,
        rx_large: Mapped::new(&cfg.placer, rx_slot, slots)?,
    });
    // SAFETY: the send mapping is `buf_size * count` bytes, the receive mapping `chunk *
    // chunks`, the large mappings `tx_slot * slots` and `rx_slot * slots` (`Mapped::new` checked
    // each to fit `isize`), page aligned, zeroed and alive while `pools` is, which the
    // connection and the application's handles hold. A view of zero slots reads nothing.
    let pool_views = unsafe {
        Pools {
            tx: PoolView::new(pools.tx.region.ptr(), buf_size, count),
            rx: PoolView::new(pools.rx.region.ptr(), chunk, chunks),
            tx_large: if large {
                PoolView::new(pools.tx_large.region.ptr(), tx_slot, slots)
            } else {
                PoolView::empty()
            },
            rx_large: if large {
                PoolView::new(pools.rx_large.region.ptr(), rx_slot, slots)
            } else {
                PoolView::empty()
            },
        }
    };
    let conn = TcpConn::new(
        Arc::new(stream),
        pools.clone() as Arc<dyn Any + Send + Sync>,
        pool_views,
        ConnSizes {
            copy_max: cfg.inline_threshold,
            depth: ours.depth as usize,
            peer_depth: theirs.depth as usize,
            rx_window: ours.rx_window as usize,
            peer_window: theirs.rx_window as usize,
            app_bytes: !cfg.depth_set,
            batch: cfg.batch,
            liveness: cfg.liveness_timeout,
            max_payload: limit,
        },
    );
    Ok(Established {
        conn,
        pools: pool_views,
        keep: pools,
        peer,
    })
}

/// Resolves `host:port` (an IP literal or a name).
pub(crate) fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, TcpSetupError> {
    let err = |source| TcpSetupError::Resolve {
        host: host.to_owned(),
        source,
    };
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(err)?.collect();
    if addrs.is_empty() {
        return Err(err(io::Error::new(
            io::ErrorKind::NotFound,
            "no address for the host",
        )));
    }
    Ok(addrs)
}

/// Connects to `host:port` (connecting side). Blocks up to `timeout` in total; runs on the
/// calling application thread.
pub(crate) fn connect(
    host: &str,
    port: u16,
    endpoint: &str,
    cfg: &Config,
    timeout: Duration,
) -> Result<Established, Error> {
    let cerr = |e: TcpSetupError| Error::Connect {
        endpoint: endpoint.to_owned(),
        source: Box::new(e),
    };
    let timed_out = |e: &io::Error| {
        matches!(
            e.kind(),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        )
    };
    let ours = params_for(cfg)?;
    let deadline = deadline_after(Instant::now(), timeout);
    let left = || deadline.saturating_duration_since(Instant::now());
    let addrs = resolve(host, port).map_err(cerr)?;
    let mut last = None;
    let mut stream = None;
    for addr in addrs {
        let t = left();
        if t.is_zero() {
            return Err(Error::Timeout);
        }
        match TcpStream::connect_timeout(&addr, t) {
            Ok(s) => {
                stream = Some((s, addr));
                break;
            }
            Err(e) if timed_out(&e) => last = Some(Error::Timeout),
            Err(source) => last = Some(cerr(TcpSetupError::Connect { addr, source })),
        }
    }
    let Some((mut stream, addr)) = stream else {
        return Err(last.unwrap_or(Error::Timeout));
    };
    let step = |step: &'static str| {
        move |source: io::Error| {
            if timed_out(&source) {
                Error::Timeout
            } else {
                cerr(TcpSetupError::Handshake { step, source })
            }
        }
    };
    let bounded = |s: &TcpStream| -> Result<(), Error> {
        let t = left();
        if t.is_zero() {
            return Err(Error::Timeout);
        }
        s.set_write_timeout(Some(t))
            .and_then(|()| s.set_read_timeout(Some(t)))
            .map_err(|e| cerr(opt_err("SO_RCVTIMEO")(e)))
    };
    bounded(&stream)?;
    stream
        .write_all(&ours.encode(STATUS_OK))
        .map_err(step("send hello"))?;
    let mut reply = [0u8; HELLO_LEN];
    bounded(&stream)?;
    stream.read_exact(&mut reply).map_err(step("recv reply"))?;
    let (theirs, status) =
        TcpParams::decode(&reply).map_err(|reason| cerr(TcpSetupError::BadHello { reason }))?;
    match status {
        STATUS_OK => {}
        STATUS_MISMATCH => {
            return Err(cerr(TcpSetupError::Mismatch { theirs, ours }));
        }
        STATUS_BUSY => return Err(cerr(TcpSetupError::Refused { reason: "busy" })),
        _ => {
            return Err(cerr(TcpSetupError::Refused {
                reason: "invalid hello",
            }))
        }
    }
    if theirs.buffer_size != ours.buffer_size {
        return Err(cerr(TcpSetupError::Mismatch { theirs, ours }));
    }
    let _ = stream.set_read_timeout(None);
    let _ = stream.set_write_timeout(None);
    establish(stream, addr, &ours, &theirs, cfg)
}

/// A listening TCP endpoint.
pub(crate) struct TcpListenerState {
    listener: TcpListener,
    params: TcpParams,
}

impl TcpListenerState {
    /// Binds `host:port` (the first address that binds).
    pub(crate) fn bind(
        host: &str,
        port: u16,
        endpoint: &str,
        cfg: &Config,
    ) -> Result<TcpListenerState, Error> {
        let params = params_for(cfg)?;
        let lerr = |e: TcpSetupError| Error::Listen {
            endpoint: endpoint.to_owned(),
            source: Box::new(e),
        };
        let mut last = None;
        for addr in resolve(host, port).map_err(lerr)? {
            match TcpListener::bind(addr) {
                Ok(listener) => {
                    listener
                        .set_nonblocking(true)
                        .map_err(|e| lerr(opt_err("O_NONBLOCK")(e)))?;
                    return Ok(TcpListenerState { listener, params });
                }
                Err(source) => last = Some(TcpSetupError::Bind { addr, source }),
            }
        }
        Err(lerr(last.unwrap_or(TcpSetupError::Resolve {
            host: host.to_owned(),
            source: io::Error::new(io::ErrorKind::NotFound, "no address for the host"),
        })))
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// The bound address (port 0 resolved).
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Takes one pending connection off the listening socket, if any, and starts its handshake
    /// (waiting for the hello until `now + ACCEPT_TIMEOUT`). Never waits.
    pub(crate) fn try_accept(&self, now: Instant) -> Result<Option<Handshake>, Error> {
        match self.listener.accept() {
            Ok((stream, peer)) => {
                stream
                    .set_nonblocking(true)
                    .map_err(TcpSetupError::Accept)?;
                Ok(Some(Handshake {
                    stream,
                    peer,
                    hello: [0; HELLO_LEN],
                    have: 0,
                    deadline: now + ACCEPT_TIMEOUT,
                }))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(TcpSetupError::Accept(e).into()),
        }
    }

    /// Reads what has arrived of `hs`'s hello and, once complete, checks it and answers.
    /// Never waits: the reply (32 bytes) goes into the fresh socket's empty send buffer.
    ///
    /// # Errors
    ///
    /// The handshake failed (the peer's socket is closed when `hs` is dropped with it).
    pub(crate) fn advance(&self, mut hs: Handshake, cfg: &Config) -> Result<Step, Error> {
        while hs.have < HELLO_LEN {
            match hs.stream.read(&mut hs.hello[hs.have..]) {
                Ok(0) => {
                    return Err(TcpSetupError::Handshake {
                        step: "recv hello",
                        source: io::ErrorKind::UnexpectedEof.into(),
                    }
                    .into())
                }
                Ok(n) => hs.have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Step::Pending(hs)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(TcpSetupError::Handshake {
                        step: "recv hello",
                        source,
                    }
                    .into())
                }
            }
        }
        let (theirs, _) = match TcpParams::decode(&hs.hello) {
            Ok(v) => v,
            Err(reason) => {
                hs.reply(&self.params, STATUS_INVALID);
                return Err(TcpSetupError::BadHello { reason }.into());
            }
        };
        if theirs.buffer_size != self.params.buffer_size {
            hs.reply(&self.params, STATUS_MISMATCH);
            return Err(TcpSetupError::Mismatch {
                theirs,
                ours: self.params,
            }
            .into());
        }
        match (&hs.stream).write(&self.params.encode(STATUS_OK)) {
            Ok(HELLO_LEN) => {}
            Ok(_) => {
                return Err(TcpSetupError::Handshake {
                    step: "send reply",
                    source: io::ErrorKind::WriteZero.into(),
                }
                .into())
            }
            Err(source) => {
                return Err(TcpSetupError::Handshake {
                    step: "send reply",
                    source,
                }
                .into())
            }
        }
        let Handshake { stream, peer, .. } = hs;
        establish(stream, peer, &self.params, &theirs, cfg).map(|e| Step::Done(Box::new(e)))
    }
}

/// An accepted connection whose hello has not fully arrived (listening side): the control
/// thread advances it ([`TcpListenerState::advance`]) when its socket is readable and expires it
/// at its deadline. A peer that stalls costs one such entry until then, never time.
pub(crate) struct Handshake {
    stream: TcpStream,
    peer: SocketAddr,
    hello: [u8; HELLO_LEN],
    have: usize,
    deadline: Instant,
}

impl Handshake {
    /// The socket to watch for `POLLIN`.
    pub(crate) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// The deadline.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// A reply with `status`, best effort, never waiting.
    fn reply(&self, params: &TcpParams, status: u8) {
        let _ = (&self.stream).write(&params.encode(status));
    }

    /// Refuses the connection (the table of pending handshakes is full): a `busy` reply, best
    /// effort; dropping `self` closes the socket.
    pub(crate) fn refuse_busy(self, params: &TcpParams) {
        self.reply(params, STATUS_BUSY);
    }

    /// The error for a handshake past its deadline (dropping `self` closes the socket).
    pub(crate) fn timed_out(&self) -> Error {
        TcpSetupError::AcceptTimeout {
            timeout: ACCEPT_TIMEOUT,
        }
        .into()
    }
}

impl TcpListenerState {
    /// This listener's parameters.
    pub(crate) fn params(&self) -> &TcpParams {
        &self.params
    }
}

/// Where [`TcpListenerState::advance`] left a handshake.
pub(crate) enum Step {
    /// Waiting for the rest of the hello.
    Pending(Handshake),
    /// Done: the connection is set up.
    Done(Box<Established>),
}
