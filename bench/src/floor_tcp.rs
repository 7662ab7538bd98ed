//! The raw kernel-TCP floor (`bench floor --fabric tcp`, and the floor of every `--fabric tcp`
//! run): what two pinned threads achieve over a TCP connection with nothing but busy-polled
//! non-blocking `send` / `recv` (`TCP_NODELAY`), no engine.
//!
//! * Ping-pong: the client sends 8 bytes, the server echoes them, the client spins on `recv`
//!   until they are back; each round trip is timed into an HdrHistogram.
//! * Streaming: the client writes chunks of one size (64 KiB unless told otherwise) with one
//!   `send` each as fast as the socket takes them, and the server reads them with `recv`s of
//!   the same size; the byte rate is measured at the receiver (the bandwidth floor for that
//!   size: the "x floor" rate ratio is meaningful for points of the chunk size, where it
//!   compares messages with chunks of the same size).
//!
//! Roles: in loopback both sides run in this process over `127.0.0.1` (the server on a
//! thread); `--server ADDR:PORT` / `--client ADDR:PORT` put them in two processes (or two
//! network namespaces: `scripts/tcp-netns-bench.sh`). Both use the same wire protocol: each
//! measurement is one connection that opens with a 16-byte request (magic, kind, parameter)
//! answered by the server's 8-byte acknowledgement (its core); a stream ends with the server's
//! measured receive time. Every spin is bounded by [`SPIN_LIMIT`], the connect by a timeout.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::error::BenchError;
use crate::floor::{duration_ns, FloorResult, SPIN_LIMIT};
use crate::machine::pin_current;
use crate::stats::{new_latency_histogram, RateSummary};

/// Streamed chunk size.
pub const CHUNK: usize = 64 << 10;

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> BenchError {
    move |e| BenchError::io(what, e)
}

fn timeout(what: &'static str) -> BenchError {
    BenchError::Timeout {
        what,
        secs: SPIN_LIMIT.as_secs_f64(),
    }
}

fn socket(s: &TcpStream) -> Result<(), BenchError> {
    s.set_nodelay(true).map_err(io_err("TCP_NODELAY"))?;
    s.set_nonblocking(true).map_err(io_err("O_NONBLOCK"))
}

/// Spins until `buf` is filled from `s`; `Ok(false)` at a clean end of stream before any byte.
fn read_full(mut s: &TcpStream, buf: &mut [u8], what: &'static str) -> Result<bool, BenchError> {
    let mut got = 0;
    let mut since: Option<Instant> = None;
    let mut spins = 0u32;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(BenchError::io(what, io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                spins = spins.wrapping_add(1);
                if spins % 4096 == 0
                    && since.get_or_insert_with(Instant::now).elapsed() > SPIN_LIMIT
                {
                    return Err(timeout(what));
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(BenchError::io(what, e)),
        }
    }
    Ok(true)
}

/// Spins until all of `buf` is written to `s`.
fn write_full(mut s: &TcpStream, buf: &[u8], what: &'static str) -> Result<(), BenchError> {
    let mut put = 0;
    let mut since: Option<Instant> = None;
    let mut spins = 0u32;
    while put < buf.len() {
        match s.write(&buf[put..]) {
            Ok(n) => put += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                spins = spins.wrapping_add(1);
                if spins % 4096 == 0
                    && since.get_or_insert_with(Instant::now).elapsed() > SPIN_LIMIT
                {
                    return Err(timeout(what));
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(BenchError::io(what, e)),
        }
    }
    Ok(())
}

/// First 4 bytes of every request (`"SPWF"`, little-endian).
const MAGIC: u32 = u32::from_le_bytes(*b"SPWF");
/// Request kind: ping-pong of the request's parameter bytes (0, from an older client: 8)
/// until the client's end of stream.
const KIND_PING: u32 = 1;
/// Request kind: a stream of the request's parameter bytes, in chunks of the size in the
/// kind's upper 24 bits.
const KIND_STREAM: u32 = 2;
/// Largest streamed chunk (a `--size` above it is refused); the request carries the chunk
/// size in the kind's upper 24 bits.
pub const MAX_CHUNK: usize = 8 << 20;

/// How long a loopback server waits for its client's connections, and a client for a server
/// that is not listening yet (connection refused is retried until then).
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The server side of one measurement connection, as its request asked; `Ok(true)` when it
/// was a stream (the last measurement of a client's run).
fn serve_conn(s: &TcpStream, core: usize) -> Result<bool, BenchError> {
    socket(s)?;
    let mut req = [0u8; 16];
    if !read_full(s, &mut req, "the tcp floor client's request")? {
        return Ok(false);
    }
    let magic = u32::from_le_bytes([req[0], req[1], req[2], req[3]]);
    let kind = u32::from_le_bytes([req[4], req[5], req[6], req[7]]);
    let param = u64::from_le_bytes([
        req[8], req[9], req[10], req[11], req[12], req[13], req[14], req[15],
    ]);
    if magic != MAGIC {
        return Err(BenchError::io(
            "the tcp floor client's request",
            io::Error::new(io::ErrorKind::InvalidData, "not a bench floor client"),
        ));
    }
    write_full(s, &(core as u64).to_le_bytes(), "the tcp floor client")?;
    match kind & 0xff {
        KIND_PING => {
            let size = match usize::try_from(param) {
                Ok(0) => 8,
                Ok(n) if n <= MAX_CHUNK => n,
                _ => {
                    return Err(BenchError::io(
                        "the tcp floor client's request",
                        io::Error::new(io::ErrorKind::InvalidData, "bad ping size"),
                    ))
                }
            };
            let mut b = vec![0u8; size];
            while read_full(s, &mut b, "the tcp floor client")? {
                write_full(s, &b, "the tcp floor client")?;
            }
            Ok(false)
        }
        KIND_STREAM => {
            let chunk = (kind >> 8) as usize;
            if chunk == 0 || chunk > MAX_CHUNK {
                return Err(BenchError::io(
                    "the tcp floor client's request",
                    io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"),
                ));
            }
            let total = param;
            let mut buf = vec![0u8; chunk];
            if total == 0 || !read_full(s, &mut buf[..1], "the tcp floor sender")? {
                return Err(BenchError::io(
                    "the tcp floor sender",
                    io::ErrorKind::UnexpectedEof.into(),
                ));
            }
            let start = Instant::now();
            let mut got = 1u64;
            while got < total {
                let want = ((total - got) as usize).min(chunk);
                if !read_full(s, &mut buf[..want], "the tcp floor sender")? {
                    return Err(BenchError::io(
                        "the tcp floor sender",
                        io::ErrorKind::UnexpectedEof.into(),
                    ));
                }
                got += want as u64;
            }
            let elapsed = duration_ns(start.elapsed());
            write_full(s, &elapsed.to_le_bytes(), "the tcp floor client")?;
            Ok(true)
        }
        _ => Err(BenchError::io(
            "the tcp floor client's request",
            io::Error::new(io::ErrorKind::InvalidData, "unknown request kind"),
        )),
    }
}

/// Waits (bounded by `limit`, polling `stop`) for the next connection on a non-blocking
/// listener; `Ok(None)` when `limit` passed.
fn accept(
    l: &TcpListener,
    limit: Option<std::time::Duration>,
    stop: &AtomicBool,
) -> Result<Option<TcpStream>, BenchError> {
    let since = Instant::now();
    loop {
        match l.accept() {
            Ok((s, _)) => return Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(BenchError::io("tcp floor accept", e)),
        }
        if stop.load(Ordering::Relaxed) {
            return Err(BenchError::Interrupted);
        }
        if limit.is_some_and(|l| since.elapsed() > l) {
            return Ok(None);
        }
        // Control path, not measured: waiting for a client need not spin.
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn listen(addr: &str) -> Result<TcpListener, BenchError> {
    let l = TcpListener::bind(addr).map_err(io_err("tcp floor listen"))?;
    l.set_nonblocking(true)
        .map_err(io_err("tcp floor listen"))?;
    Ok(l)
}

/// `bench floor --fabric tcp --server ADDR`: serves floor clients one connection at a time on
/// `core` until `stop` (or, with `once`, until the first client's stream is done or a
/// connection failed). `on_listen` is told the bound address.
///
/// # Errors
/// [`BenchError::Pin`]; [`BenchError::Io`] when binding or accepting fails; with `once`, the
/// failure of the served connection.
pub fn serve(
    addr: &str,
    core: usize,
    once: bool,
    stop: &AtomicBool,
    on_listen: impl FnOnce(std::net::SocketAddr),
) -> Result<(), BenchError> {
    pin_current(core)?;
    let l = listen(addr)?;
    on_listen(l.local_addr().map_err(io_err("tcp floor listen"))?);
    loop {
        let Some(s) = accept(&l, None, stop)? else {
            continue;
        };
        match serve_conn(&s, core) {
            Ok(true) if once => return Ok(()),
            Ok(_) => {}
            Err(e) if once => return Err(e),
            Err(e) => eprintln!("bench floor server: client failed: {e}"),
        }
    }
}

/// Connects to a floor server and sends a request; returns the connection and the server's
/// core. Connection refused is retried (the server may still be starting) until `timeout`.
fn request(
    addr: &str,
    kind: u32,
    param: u64,
    timeout: std::time::Duration,
) -> Result<(TcpStream, usize), BenchError> {
    use std::net::ToSocketAddrs;
    let target = addr
        .to_socket_addrs()
        .map_err(io_err("tcp floor server address"))?
        .next()
        .ok_or_else(|| BenchError::invalid("--client", format!("`{addr}` resolves to nothing")))?;
    let since = Instant::now();
    let s = loop {
        let left = timeout.saturating_sub(since.elapsed());
        if left.is_zero() {
            return Err(BenchError::Timeout {
                what: "connecting to the tcp floor server",
                secs: timeout.as_secs_f64(),
            });
        }
        match TcpStream::connect_timeout(&target, left) {
            Ok(s) => break s,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(BenchError::Timeout {
                    what: "connecting to the tcp floor server",
                    secs: timeout.as_secs_f64(),
                })
            }
            Err(e) => return Err(BenchError::io("tcp floor connect", e)),
        }
    };
    socket(&s)?;
    let mut req = [0u8; 16];
    req[..4].copy_from_slice(&MAGIC.to_le_bytes());
    req[4..8].copy_from_slice(&kind.to_le_bytes());
    req[8..].copy_from_slice(&param.to_le_bytes());
    write_full(&s, &req, "the tcp floor server")?;
    let mut ack = [0u8; 8];
    if !read_full(&s, &mut ack, "the tcp floor server")? {
        return Err(BenchError::io(
            "the tcp floor server",
            io::ErrorKind::UnexpectedEof.into(),
        ));
    }
    Ok((s, u64::from_le_bytes(ack) as usize))
}

/// Measures the raw TCP floor on loopback between `cores[0]` (client) and `cores[1]` (server)
/// with 8-byte pings and 64 KiB chunks: see [`measure_with`].
///
/// # Errors
/// As [`measure_with`].
pub fn measure(
    cores: [usize; 2],
    iters: u64,
    warmup: u64,
    stop: &AtomicBool,
) -> Result<FloorResult, BenchError> {
    let run = TcpFloorRun {
        iters,
        warmup,
        chunk: CHUNK,
        ping: 8,
    };
    measure_with(cores, run, stop)
}

/// What one raw tcp floor measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpFloorRun {
    /// Measured round trips.
    pub iters: u64,
    /// Unmeasured round trips first.
    pub warmup: u64,
    /// Bytes per streamed chunk.
    pub chunk: usize,
    /// Bytes each way per round trip.
    pub ping: usize,
}

/// Measures the raw TCP floor on loopback between `cores[0]` (client) and `cores[1]` (a
/// server thread): `run.iters` round trips of `run.ping` bytes each way after `run.warmup`
/// unmeasured ones, then `iters / 16` (at least 64) streamed chunks of `run.chunk` bytes.
///
/// # Errors
/// [`BenchError::InvalidArg`] for zero `iters` or a chunk size outside `1..=MAX_CHUNK`;
/// [`BenchError::Pin`]; [`BenchError::Io`] for a socket error; [`BenchError::Timeout`] if a
/// peer stalls for [`SPIN_LIMIT`]; [`BenchError::Interrupted`] when `stop` is raised.
pub fn measure_with(
    cores: [usize; 2],
    run: TcpFloorRun,
    stop: &AtomicBool,
) -> Result<FloorResult, BenchError> {
    check(run.iters, run.chunk)?;
    check_ping(run.ping)?;
    let l = listen("127.0.0.1:0")?;
    let addr = l.local_addr().map_err(io_err("tcp floor listen"))?;
    let server_stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let server = std::thread::Builder::new()
            .name("floor-tcp-server".into())
            .spawn_scoped(scope, || -> Result<(), BenchError> {
                pin_current(cores[1])?;
                // The client's two connections: the ping-pong, then the stream.
                for _ in 0..2 {
                    let s = accept(&l, Some(CONNECT_TIMEOUT), &server_stop)?.ok_or(
                        BenchError::Timeout {
                            what: "the tcp floor client's connection",
                            secs: CONNECT_TIMEOUT.as_secs_f64(),
                        },
                    )?;
                    if serve_conn(&s, cores[1])? {
                        break;
                    }
                }
                Ok(())
            })
            .map_err(|e| BenchError::io("thread spawn", e))?;
        let result = client(&addr.to_string(), cores[0], run, CONNECT_TIMEOUT, stop);
        if result.is_err() {
            server_stop.store(true, Ordering::Relaxed);
        }
        let joined = server
            .join()
            .map_err(|_| BenchError::ThreadPanicked("tcp floor server"))?;
        let f = result?;
        joined?;
        Ok(f)
    })
}

fn check_ping(ping: usize) -> Result<(), BenchError> {
    if ping == 0 || ping > MAX_CHUNK {
        return Err(BenchError::invalid(
            "--size",
            format!(
                "the tcp floor's ping-pong message must be 1 B ..= {} MiB",
                MAX_CHUNK >> 20
            ),
        ));
    }
    Ok(())
}

fn check(iters: u64, chunk: usize) -> Result<(), BenchError> {
    if iters == 0 {
        return Err(BenchError::invalid("--iters", "must be at least 1"));
    }
    if chunk == 0 || chunk > MAX_CHUNK {
        return Err(BenchError::invalid(
            "--size",
            format!(
                "the tcp floor's chunk must be 1 B ..= {} MiB",
                MAX_CHUNK >> 20
            ),
        ));
    }
    Ok(())
}

/// `bench floor --fabric tcp --client ADDR`: the client side against a floor server, pinned to
/// `core`: `run.iters` round trips of `run.ping` bytes after `run.warmup`, then `iters / 16`
/// (at least 64) chunks of `run.chunk` bytes, the rate as the server measured it. The result's cores are this one and the
/// server's.
///
/// # Errors
/// As [`measure_with`], and [`BenchError::Timeout`] when no server answers at `addr` within
/// `connect_timeout`.
pub fn client(
    addr: &str,
    core: usize,
    run: TcpFloorRun,
    connect_timeout: std::time::Duration,
    stop: &AtomicBool,
) -> Result<FloorResult, BenchError> {
    let TcpFloorRun {
        iters,
        warmup,
        chunk,
        ping,
    } = run;
    check(iters, chunk)?;
    check_ping(ping)?;
    pin_current(core)?;
    let (s, server_core) = request(addr, KIND_PING, ping as u64, connect_timeout)?;
    let rtt = ping_pong(&s, ping, iters, warmup, stop);
    let _ = s.shutdown(std::net::Shutdown::Both);
    let rtt = rtt?;
    let chunks = (iters / 16).max(64);
    let rate = stream(addr, chunk, chunks, connect_timeout, stop)?;
    Ok(FloorResult {
        rtt,
        rtt_two_lines: None,
        rings: None,
        rate,
        cores: [core, server_core],
        kind: "tcp-raw",
        ping_bytes: ping as u64,
    })
}

fn ping_pong(
    s: &TcpStream,
    size: usize,
    iters: u64,
    warmup: u64,
    stop: &AtomicBool,
) -> Result<Histogram<u64>, BenchError> {
    let mut hist = new_latency_histogram();
    let mut b = vec![0u8; size];
    for i in 0..warmup + iters {
        if i % 4096 == 0 && stop.load(Ordering::Relaxed) {
            return Err(BenchError::Interrupted);
        }
        let n = b.len().min(8);
        b[..n].copy_from_slice(&i.to_le_bytes()[..n]);
        let t0 = Instant::now();
        write_full(s, &b, "the tcp floor server")?;
        if !read_full(s, &mut b, "the tcp floor server")? {
            return Err(BenchError::io(
                "the tcp floor server",
                io::ErrorKind::UnexpectedEof.into(),
            ));
        }
        if i >= warmup {
            hist.saturating_record(duration_ns(t0.elapsed()));
        }
    }
    Ok(hist)
}

fn stream(
    addr: &str,
    chunk: usize,
    chunks: u64,
    connect_timeout: std::time::Duration,
    stop: &AtomicBool,
) -> Result<RateSummary, BenchError> {
    let total = chunks * chunk as u64;
    // The chunk size rides in the kind's upper 24 bits (`check`: at most `MAX_CHUNK` < 2^24).
    let kind = KIND_STREAM | ((chunk as u32) << 8);
    let (s, _) = request(addr, kind, total, connect_timeout)?;
    let buf = vec![0x5au8; chunk];
    let sent = (|| {
        for i in 0..chunks {
            if i % 64 == 0 && stop.load(Ordering::Relaxed) {
                return Err(BenchError::Interrupted);
            }
            write_full(&s, &buf, "the tcp floor receiver")?;
        }
        Ok(())
    })();
    if let Err(e) = sent {
        let _ = s.shutdown(std::net::Shutdown::Both);
        return Err(e);
    }
    let mut elapsed = [0u8; 8];
    if !read_full(&s, &mut elapsed, "the tcp floor receiver")? {
        return Err(BenchError::io(
            "the tcp floor receiver",
            io::ErrorKind::UnexpectedEof.into(),
        ));
    }
    Ok(RateSummary {
        msgs: chunks,
        bytes: total,
        elapsed_ns: u64::from_le_bytes(elapsed),
    })
}
