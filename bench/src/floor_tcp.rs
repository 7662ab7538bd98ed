//! The raw kernel-TCP floor (`bench floor --fabric tcp`, and the floor of every `--fabric tcp`
//! run): what two pinned threads achieve over a loopback TCP connection with nothing but
//! busy-polled non-blocking `send` / `recv` (`TCP_NODELAY`), no engine.
//!
//! * Ping-pong: the client sends 8 bytes, the server echoes them, the client spins on `recv`
//!   until they are back; each round trip is timed into an HdrHistogram.
//! * Streaming: the client writes 64 KiB chunks as fast as the socket takes them and the server
//!   reads them; the byte rate is measured at the receiver (the bandwidth floor for 64 KiB:
//!   the "x floor" rate ratio is meaningful for 64 KiB points, where it compares messages with
//!   chunks of the same size).
//!
//! Only loopback is used. Every spin is bounded by [`SPIN_LIMIT`].

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

/// A connected loopback pair (client, server).
fn pair() -> Result<(TcpStream, TcpStream), BenchError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io_err("tcp floor listen"))?;
    let addr = l.local_addr().map_err(io_err("tcp floor listen"))?;
    let c = TcpStream::connect(addr).map_err(io_err("tcp floor connect"))?;
    let (s, _) = l.accept().map_err(io_err("tcp floor accept"))?;
    socket(&c)?;
    socket(&s)?;
    Ok((c, s))
}

/// Measures the raw TCP floor between `cores[0]` (client) and `cores[1]` (server): `iters`
/// round trips after `warmup` unmeasured ones, then `iters / 16` (at least 64) streamed 64 KiB
/// chunks.
///
/// # Errors
/// [`BenchError::InvalidArg`] for zero `iters`; [`BenchError::Pin`]; [`BenchError::Io`] for a
/// socket error; [`BenchError::Timeout`] if a peer stalls for [`SPIN_LIMIT`];
/// [`BenchError::Interrupted`] when `stop` is raised.
pub fn measure(
    cores: [usize; 2],
    iters: u64,
    warmup: u64,
    stop: &AtomicBool,
) -> Result<FloorResult, BenchError> {
    if iters == 0 {
        return Err(BenchError::invalid("--iters", "must be at least 1"));
    }
    let rtt = ping_pong(cores, iters, warmup, stop)?;
    let rate = stream(cores, (iters / 16).max(64), stop)?;
    Ok(FloorResult {
        rtt,
        rate,
        cores,
        kind: "tcp-raw",
    })
}

fn ping_pong(
    cores: [usize; 2],
    iters: u64,
    warmup: u64,
    stop: &AtomicBool,
) -> Result<Histogram<u64>, BenchError> {
    let (client, server) = pair()?;
    let echo = std::thread::Builder::new()
        .name("floor-tcp-server".into())
        .spawn(move || -> Result<(), BenchError> {
            pin_current(cores[1])?;
            let mut b = [0u8; 8];
            while read_full(&server, &mut b, "the tcp floor client")? {
                write_full(&server, &b, "the tcp floor client")?;
            }
            Ok(())
        })
        .map_err(|e| BenchError::io("thread spawn", e))?;
    let run = || -> Result<Histogram<u64>, BenchError> {
        pin_current(cores[0])?;
        let mut hist = new_latency_histogram();
        let mut b = [0u8; 8];
        for i in 0..warmup + iters {
            if i % 4096 == 0 && stop.load(Ordering::Relaxed) {
                return Err(BenchError::Interrupted);
            }
            b.copy_from_slice(&i.to_le_bytes());
            let t0 = Instant::now();
            write_full(&client, &b, "the tcp floor server")?;
            if !read_full(&client, &mut b, "the tcp floor server")? {
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
    };
    let result = run();
    let _ = client.shutdown(std::net::Shutdown::Both);
    let joined = echo
        .join()
        .map_err(|_| BenchError::ThreadPanicked("tcp floor server"))?;
    let hist = result?;
    joined?;
    Ok(hist)
}

fn stream(cores: [usize; 2], chunks: u64, stop: &AtomicBool) -> Result<RateSummary, BenchError> {
    let (client, server) = pair()?;
    let receiver = std::thread::Builder::new()
        .name("floor-tcp-rx".into())
        .spawn(move || -> Result<RateSummary, BenchError> {
            pin_current(cores[1])?;
            let mut buf = vec![0u8; CHUNK];
            if !read_full(&server, &mut buf[..1], "the tcp floor sender")? {
                return Err(BenchError::Interrupted);
            }
            let start = Instant::now();
            let total = chunks * CHUNK as u64;
            let mut got = 1u64;
            while got < total {
                let want = ((total - got) as usize).min(CHUNK);
                if !read_full(&server, &mut buf[..want], "the tcp floor sender")? {
                    return Err(BenchError::Interrupted);
                }
                got += want as u64;
            }
            Ok(RateSummary {
                msgs: chunks,
                bytes: total,
                elapsed_ns: duration_ns(start.elapsed()),
            })
        })
        .map_err(|e| BenchError::io("thread spawn", e))?;
    let send = || -> Result<(), BenchError> {
        pin_current(cores[0])?;
        let buf = vec![0x5au8; CHUNK];
        for i in 0..chunks {
            if i % 64 == 0 && stop.load(Ordering::Relaxed) {
                return Err(BenchError::Interrupted);
            }
            write_full(&client, &buf, "the tcp floor receiver")?;
        }
        Ok(())
    };
    let sent = send();
    if sent.is_err() {
        let _ = client.shutdown(std::net::Shutdown::Both);
    }
    let received = receiver
        .join()
        .map_err(|_| BenchError::ThreadPanicked("tcp floor receiver"))?;
    sent?;
    received
}
