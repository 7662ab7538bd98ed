//! Glue between the benchmark protocol and spinwire's public API: building engines from a
//! [`EngineCfg`], listening, accepting, connecting, and [`BenchConn`] for [`Connection`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use spinwire::{
    Connection, Engine, Error, FabricError, IdleStrategy, Listener, SendBuf, SendError,
};

use super::conn::{head, BenchConn, Waiter};
use super::{proto, EngineCfg};
use crate::cli::{Api, Huge, Idle, Mode};
use crate::error::BenchError;
use crate::machine::pin_current;
use crate::report::Counters;

fn engine_err(step: impl Into<String>, e: Error) -> BenchError {
    match e {
        Error::FabricNotCompiled { fabric } => BenchError::FabricNotCompiled { fabric },
        Error::Disconnected | Error::Fabric(FabricError::PeerClosed) => BenchError::Disconnected,
        e => BenchError::Engine {
            step: step.into(),
            source: Box::new(e),
        },
    }
}

fn send_err(step: &str, e: SendError<'_>) -> BenchError {
    match e {
        SendError::Closed { error, .. } => engine_err(step, error),
        e => BenchError::Engine {
            step: step.into(),
            source: e.to_string().into(),
        },
    }
}

impl Huge {
    /// The engine's policy.
    pub fn policy(self) -> spinwire::HugePages {
        match self {
            Huge::Off => spinwire::HugePages::Off,
            Huge::Try => spinwire::HugePages::Try,
            Huge::Require => spinwire::HugePages::Require,
        }
    }

    /// Lower-case name, as in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Huge::Off => "off",
            Huge::Try => "try",
            Huge::Require => "require",
        }
    }
}

/// Builds an engine for one group of points.
pub(super) fn build(g: &EngineCfg) -> Result<Engine, BenchError> {
    let b = Engine::builder();
    let b = match g.mode {
        Mode::Rtc => b.run_to_completion(),
        Mode::Dedicated => b.pollers(&g.pollers),
    };
    let b = match g.frame_size {
        Some(bytes) => b.frame_size(bytes),
        None => b,
    };
    let b = match g.large_threshold {
        Some(bytes) => b.large_threshold(bytes),
        None => b,
    };
    // 0: the engine's own depth (tcp sizes its message window from its byte window).
    let b = if g.depth > 0 { b.depth(g.depth) } else { b };
    let b = match g.liveness_timeout {
        Some(t) => b.liveness_timeout(t),
        None => b,
    };
    b.idle(match g.idle {
        Idle::Spin => IdleStrategy::BusySpin,
        Idle::Backoff => IdleStrategy::backoff(),
        Idle::Block => IdleStrategy::block(),
    })
    .pool(g.buffer_size, g.buffers)
    .max_message_size(g.max_message_size)
    .large_buffers(g.large_buffers)
    .batch(g.batch)
    .inline_threshold(g.inline_threshold)
    .signal_every(g.signal_every)
    .rdma_srq(g.rdma_srq.0)
    .rdma_srq_credits(g.rdma_srq.1)
    .connect_timeout(g.connect_timeout)
    .hugepages(g.hugepages.policy())
    .build()
    .map_err(|e| engine_err("building the engine", e))
}

/// Listens on `endpoint`.
pub(super) fn listen(engine: &Engine, endpoint: &str) -> Result<Listener, BenchError> {
    engine
        .listen(endpoint)
        .map_err(|e| engine_err(format!("listening on {endpoint}"), e))
}

/// Waits up to `timeout` for a client; `None` when none came.
pub(super) fn accept(
    engine: &Engine,
    g: &EngineCfg,
    listener: &mut Listener,
    timeout: Duration,
) -> Result<Option<EngineConn>, BenchError> {
    match listener.accept_timeout(timeout) {
        Ok(conn) => Ok(Some(EngineConn::new(conn, engine, g))),
        Err(Error::Timeout) => Ok(None),
        Err(e) => Err(engine_err("accepting a client", e)),
    }
}

/// Connects to `endpoint`, waiting at most `timeout`: a connection refused because nobody
/// listens there yet (no socket, refused, reset) is retried every 100 ms until then, so a
/// client may start before its server.
pub(super) fn connect(
    engine: &Engine,
    g: &EngineCfg,
    endpoint: &str,
    timeout: Duration,
) -> Result<EngineConn, BenchError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match engine.connect_timeout(endpoint, left.max(Duration::from_millis(1))) {
            Ok(conn) => return Ok(EngineConn::new(conn, engine, g)),
            Err(e) if no_listener(&e) && Instant::now() + RETRY_EVERY < deadline => {
                if super::stop_requested() {
                    return Err(BenchError::Interrupted);
                }
                std::thread::sleep(RETRY_EVERY);
            }
            Err(Error::FabricNotCompiled { fabric }) => {
                return Err(BenchError::FabricNotCompiled { fabric })
            }
            Err(e) => {
                return Err(BenchError::Engine {
                    step: format!(
                        "connecting to {endpoint} within {:.1} s (is a `bench ... --server` running there, with the same --buffers, --buffer-size, --max-size and --large-buffers?)",
                        timeout.as_secs_f64()
                    ),
                    source: Box::new(e),
                })
            }
        }
    }
}

/// Time between two connection attempts while nobody listens.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// True when `e` says nobody listens at the endpoint (yet): a refused, reset or missing
/// rendezvous, somewhere in its chain of causes.
fn no_listener(e: &Error) -> bool {
    use std::io::ErrorKind as K;
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                K::ConnectionRefused | K::NotFound | K::ConnectionReset | K::ConnectionAborted
            ) {
                return true;
            }
        }
        let text = s.to_string().to_ascii_lowercase();
        if text.contains("refused")
            || text.contains("no such file")
            || text.contains("not connected")
        {
            return true;
        }
        src = s.source();
    }
    false
}

/// The server side of a loopback group: pins to `core`, listens on `endpoint` (on `shared`, or
/// on an engine of its own), reports readiness (or the setup error) on `ready`, accepts one
/// client and serves it.
#[allow(clippy::too_many_arguments)]
pub(super) fn loopback_server(
    g: &EngineCfg,
    shared: Option<Arc<Engine>>,
    endpoint: &str,
    core: usize,
    connect_timeout: Duration,
    stall_timeout: Duration,
    abort: &AtomicBool,
    ready: mpsc::Sender<Result<(), BenchError>>,
) -> Result<(), BenchError> {
    let setup = || -> Result<(Arc<Engine>, Listener), BenchError> {
        pin_current(core)?;
        let engine = match shared {
            Some(e) => e,
            None => Arc::new(build(g)?),
        };
        let listener = listen(&engine, endpoint)?;
        Ok((engine, listener))
    };
    let (engine, mut listener) = match setup() {
        Ok(v) => {
            let _ = ready.send(Ok(()));
            v
        }
        Err(e) => {
            // The client reports it.
            let _ = ready.send(Err(e));
            return Ok(());
        }
    };
    let deadline = Instant::now() + connect_timeout + Duration::from_secs(5);
    let mut conn = loop {
        if abort.load(Ordering::Relaxed) || super::stop_requested() {
            return Ok(());
        }
        if let Some(c) = accept(&engine, g, &mut listener, Duration::from_millis(50))? {
            break c;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Timeout {
                what: "the loopback client to connect",
                secs: (connect_timeout + Duration::from_secs(5)).as_secs_f64(),
            });
        }
    };
    let limit = conn.conn.max_message_size();
    match proto::serve_with(
        &mut conn,
        g.idle,
        limit,
        g.buffer_size,
        stall_timeout,
        Some(g.settings()),
    ) {
        Err(BenchError::Interrupted) | Err(BenchError::Disconnected) => Ok(()),
        r => r,
    }
}

/// A spinwire [`Connection`] as the benchmark protocol sees it.
#[derive(Debug)]
pub(super) struct EngineConn {
    conn: Connection,
    /// For [`Engine::counters`].
    engine: Engine,
    /// A message longer than this is written in place into a large slot
    /// ([`Connection::alloc_large`]), as a zero-copy application would; a shorter one into a
    /// pool buffer. `usize::MAX` when the connection has no large slots (its limit is the
    /// buffer size).
    large_above: usize,
    /// `--api`: which calls send and receive.
    api: Api,
    /// How many times a send refused for credit is tried again at once
    /// ([`SEND_RETRIES`]; 0 with `--one-thread`, see [`one_thread`](Self::one_thread)).
    send_retries: u32,
    /// `--api poll-copy`: where a message is written before `send_copy` copies it, as an
    /// application builds a message in memory of its own. Kept, not a fresh zeroed array per
    /// send: zeroing `COPY_MAX` bytes came after `bench lat`'s send timestamp.
    scratch: Box<[u8; COPY_MAX]>,
}

/// `--api poll-copy`: the largest message sent with `send_copy` from a stack copy (a longer
/// one takes the buffer way, filled in place).
const COPY_MAX: usize = 256;

/// How many times [`EngineConn::send_with`] sends a filled buffer again that came back with
/// `WouldBlock` before it gives up for this try (the caller then idles and fills a new one).
const SEND_RETRIES: u32 = 256;

impl EngineConn {
    /// This thread also runs the peer's end (`--one-thread`): a send refused for credit is not
    /// tried again at once, since only this thread's own receives on the other end make the
    /// credit (the retries spun for nothing: each of up to [`SEND_RETRIES`] a refused send,
    /// about a third of the sends of `bench rate --fabric mem --mode dedicated --one-thread`).
    /// The caller steps the other end and tries again.
    pub(super) fn one_thread(mut self) -> Self {
        self.send_retries = 0;
        self
    }

    fn new(conn: Connection, engine: &Engine, g: &EngineCfg) -> Self {
        let large_above = if conn.max_message_size() > g.buffer_size {
            g.effective_large_threshold()
        } else {
            usize::MAX
        };
        Self {
            conn,
            engine: engine.clone(),
            large_above,
            api: g.api,
            send_retries: SEND_RETRIES,
            scratch: Box::new([0; COPY_MAX]),
        }
    }

    /// A send buffer for a `len`-byte message: a large slot above the large threshold, else a
    /// pool buffer.
    #[inline]
    fn alloc_for(&self, len: usize) -> Result<spinwire::SendBuf<'_>, Error> {
        if len > self.large_above {
            self.conn.alloc_large()
        } else {
            self.conn.alloc()
        }
    }

    /// The send buffer of a `len`-byte message: `--api claim` claims it (the length set: on
    /// shm, up to the inline threshold, the ring record itself), the other APIs allocate it
    /// ([`alloc_for`](Self::alloc_for)).
    #[inline(always)]
    fn buf_for(&self, len: usize) -> Result<spinwire::SendBuf<'_>, Error> {
        if self.api == Api::Claim {
            self.conn.claim(len)
        } else {
            self.alloc_for(len)
        }
    }
}

impl EngineConn {
    /// `--api poll-copy`'s echo: `poll(handler, 1)` whose handler sends the copy back with
    /// `send_copy`; when that finds no room, the message is kept on the stack and sent after
    /// the handler returned (waiting on `w`).
    fn poll_echo(
        &mut self,
        size: usize,
        tag: u8,
        w: &mut Waiter,
    ) -> Result<Option<(usize, u8)>, BenchError> {
        let conn = &self.conn;
        let mut got = None;
        let mut failed = None;
        let mut pending = None;
        conn.poll(
            |m| {
                let h = head(m);
                got = Some(h);
                if h != (size, tag) {
                    return;
                }
                match conn.send_copy(m) {
                    Ok(()) => {}
                    Err(Error::WouldBlock) => {
                        let mut copy = [0u8; COPY_MAX];
                        copy[..m.len()].copy_from_slice(m);
                        pending = Some(copy);
                    }
                    Err(e) => failed = Some(e),
                }
            },
            1,
        )
        .map_err(|e| engine_err("receiving", e))?;
        if let Some(e) = failed {
            return Err(engine_err("sending the echo", e));
        }
        let Some(head) = got else {
            return Ok(None);
        };
        if let Some(copy) = pending {
            loop {
                match conn.send_copy(&copy[..size]) {
                    Ok(()) => break,
                    Err(Error::WouldBlock) => w.idle()?,
                    Err(e) => return Err(engine_err("sending the echo", e)),
                }
            }
        }
        if head == (size, tag) {
            conn.flush()
                .map_err(|e| engine_err("flushing the echo", e))?;
        }
        Ok(Some(head))
    }

    /// alloc + fill + `send` (or `send_batched`).
    #[inline(always)]
    fn send_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
        batched: bool,
    ) -> Result<bool, BenchError> {
        if self.api == Api::PollCopy && len <= COPY_MAX {
            let copy = &mut self.scratch[..len];
            fill(copy);
            // `send_copy` has no batched form: a batched run is flushed per message.
            let _ = batched;
            return match self.conn.send_copy(copy) {
                Ok(()) => Ok(true),
                Err(Error::WouldBlock) => Ok(false),
                Err(e) => Err(engine_err("sending", e)),
            };
        }
        let mut buf = match self.buf_for(len) {
            Ok(b) => b,
            Err(Error::WouldBlock) => return Ok(false),
            Err(e) => return Err(engine_err("allocating a send buffer", e)),
        };
        if len > buf.capacity() {
            return Err(engine_err(
                "filling a send buffer",
                Error::MessageTooLarge {
                    size: len,
                    max: buf.capacity(),
                },
            ));
        }
        fill(&mut buf.as_mut_slice()[..len]);
        buf.set_len(len)
            .map_err(|e| engine_err("filling a send buffer", e))?;
        let mut r = if batched {
            self.conn.send_batched(buf)
        } else {
            self.conn.send(buf)
        };
        if let Err(SendError::WouldBlock(b)) = r {
            r = resend(&self.conn, b, batched, self.send_retries);
        }
        match r {
            Ok(()) => Ok(true),
            Err(e) if e.is_would_block() => Ok(false),
            Err(e) => Err(send_err("sending", e)),
        }
    }
}

/// A full window handed a filled buffer back: send it again while the credits come back (each
/// failed `send` drives the engine in run-to-completion mode), as an application of the
/// zero-copy API does, rather than drop it and fill a new one per try. Refilling 64 KiB per
/// `WouldBlock` burnt the sending core that, across a veth pair, also runs the receive side's
/// softirq (`bench rate --size 64k` across scripts/netns-two). Bounded, so that the caller's
/// deadline and idle strategy still apply to a long stall. Out of line: inlined into
/// `send_with`, the loop took the shm 8-B rate from 37.1 to 33.0 M msgs/s (3 interleaved
/// rounds) without running.
#[cold]
#[inline(never)]
fn resend<'c>(
    conn: &'c Connection,
    buf: SendBuf<'c>,
    batched: bool,
    retries: u32,
) -> Result<(), SendError<'c>> {
    let mut r = Err(SendError::WouldBlock(buf));
    for _ in 0..retries {
        match r {
            Err(SendError::WouldBlock(b)) if batched => r = conn.send_batched(b),
            Err(SendError::WouldBlock(b)) => r = conn.send(b),
            _ => break,
        }
    }
    r
}

impl BenchConn for EngineConn {
    #[inline]
    fn try_send_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, BenchError> {
        self.send_with(len, fill, false)
    }

    #[inline]
    fn try_send_batched_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, BenchError> {
        self.send_with(len, fill, true)
    }

    #[inline]
    fn try_recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, BenchError> {
        if self.api == Api::PollCopy {
            let mut f = Some(f);
            let mut out = None;
            self.conn
                .poll(
                    |m| {
                        if let Some(f) = f.take() {
                            out = Some(f(m));
                        }
                    },
                    1,
                )
                .map_err(|e| engine_err("receiving", e))?;
            return Ok(out);
        }
        match self.conn.try_recv() {
            Ok(Some(m)) => Ok(Some(f(&m))),
            Ok(None) => Ok(None),
            Err(e) => Err(engine_err("receiving", e)),
        }
    }

    fn wait_readable(&mut self, timeout: Duration) -> Result<bool, BenchError> {
        match self.conn.wait_timeout(timeout) {
            Ok(()) => Ok(true),
            Err(spinwire::Error::Timeout) => Ok(false),
            // The next receive reports it, with what is left to take first.
            Err(_) => Ok(true),
        }
    }

    #[inline]
    fn poll_batch(&mut self, limit: usize, f: impl FnMut(&[u8])) -> Result<usize, BenchError> {
        self.conn
            .poll(f, limit)
            .map_err(|e| engine_err("receiving", e))
    }

    #[inline(always)]
    fn flush(&mut self) -> Result<(), BenchError> {
        self.conn.flush().map_err(|e| engine_err("flushing", e))
    }

    fn max_message_size(&self) -> Option<usize> {
        Some(self.conn.max_message_size())
    }

    fn counters(&self) -> Option<Counters> {
        let c = self.conn.stats();
        let e = self.engine.counters();
        let mut out = Counters {
            sent: c.sent,
            received: c.received,
            would_block: c.would_block,
            alloc_failures: c.alloc_failures,
            tx_stalls: c.tx_stalls,
            huge_regions: e.placement.huge_regions,
            huge_bytes: e.placement.huge_bytes,
            small_regions: e.placement.small_regions,
            small_bytes: e.placement.small_bytes,
            hugepage_fallbacks: e.placement.fallbacks,
            sleeps: c.sleeps,
            sleeps_unrung: c.sleeps_unrung,
            ..Counters::default()
        };
        for p in &e.pollers {
            out.tx_batches += p.tx_batches;
            out.busy_cycles += p.busy_cycles;
            out.empty_cycles += p.empty_cycles;
            out.poller_sleeps += p.sleeps;
            out.poller_sleep_timeouts += p.sleep_timeouts;
        }
        Some(out)
    }

    /// One copy, straight from the received buffer into the send buffer; the received message
    /// is held (not recycled) until its echo is sent.
    #[inline(always)]
    fn try_echo(
        &mut self,
        size: usize,
        tag: u8,
        w: &mut Waiter,
    ) -> Result<Option<(usize, u8)>, BenchError> {
        if self.api == Api::PollCopy && size <= COPY_MAX {
            return self.poll_echo(size, tag, w);
        }
        let m = match self.conn.try_recv() {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(None),
            Err(e) => return Err(engine_err("receiving", e)),
        };
        let head = head(&m);
        if head != (size, tag) {
            return Ok(Some(head));
        }
        loop {
            match self.buf_for(m.len()) {
                Ok(mut buf) => {
                    buf.copy_from(&m)
                        .map_err(|e| engine_err("filling the echo", e))?;
                    match self.conn.send(buf) {
                        Ok(()) => break,
                        Err(e) if e.is_would_block() => {}
                        Err(e) => return Err(send_err("sending the echo", e)),
                    }
                }
                Err(Error::WouldBlock) => {}
                Err(e) => return Err(engine_err("allocating the echo buffer", e)),
            }
            w.idle()?;
        }
        self.conn
            .flush()
            .map_err(|e| engine_err("flushing the echo", e))?;
        Ok(Some(head))
    }
}
