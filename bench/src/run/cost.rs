//! `bench cost`: the engine's own software cost, with both ends of a connection on one pinned
//! thread (one run-to-completion engine), so no cross-core transfer is measured: shm's direct
//! path, or with `--fabric mem` the poller path (application rings, poller, in-process rings),
//! or with `--fabric tcp` the poller path over a loopback TCP connection (its syscalls
//! included).
//!
//! * **stream**: send `--batch` messages (`Connection::send_batched`), flush, receive them; ns per message, once receiving
//!   with `try_recv` in a loop and once with the batch receive `Connection::poll` (limit
//!   `--batch`).
//! * **round trip**: send, receive, echo, receive; ns per round trip.
//!
//! This is the port of `SPINWIRE_BENCH_COST_ONLY=1 cargo bench -p spinwire --bench shm`.
//! Every wait is bounded (10 s); the loops read the clock only at their ends (and every few
//! thousand empty spins, for the bound) and never allocate.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, IdleStrategy, SendError};

use clap::Args;

use crate::cli::{parse_size, Fabric};
use crate::error::BenchError;
use crate::machine::{available_cores, check_cores, Machine};
use crate::report;

/// `bench cost`.
#[derive(Debug, Clone, Args)]
pub struct CostArgs {
    /// Message sizes, comma-separated (k/m suffixes are binary).
    #[arg(long, value_name = "BYTES", value_delimiter = ',', value_parser = parse_size,
          default_values_t = [8usize, 64])]
    pub sizes: Vec<usize>,
    /// Messages sent before they are received (1..=128): the batch that `poll` receives with
    /// one call (its limit) and `try_recv` with one call per message.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub batch: usize,
    /// Measured messages per size and receive style, and measured round trips.
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    pub iters: u64,
    /// Unmeasured messages (and round trips) first.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub warmup: u64,
    /// The core to pin the thread to [default: the first allowed core].
    #[arg(long, value_name = "CORE")]
    pub core: Option<usize>,
    /// The fabric: `shm` (the direct path), `mem` (the poller path, in process) or `tcp` (the
    /// poller path over loopback TCP, its syscalls included).
    #[arg(long, value_enum, default_value_t = Fabric::Shm)]
    pub fabric: Fabric,
    /// Write summary.json here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// The bound on any single wait.
const WAIT: Duration = Duration::from_secs(10);
/// The engine's send depth (credits); `--batch` may not exceed it.
const DEPTH: usize = 128;

/// The figures of one message size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CostPoint {
    /// Payload bytes.
    pub size_bytes: u64,
    /// Messages per batch (and `poll`'s limit).
    pub batch: u64,
    /// Measured messages per receive style; measured round trips.
    pub iters: u64,
    /// Unmeasured messages / round trips first.
    pub warmup: u64,
    /// ns per message, streaming, received with `try_recv` in a loop.
    pub stream_try_recv_ns: f64,
    /// ns per message, streaming, received with `poll`.
    pub stream_poll_ns: f64,
    /// ns per round trip (send, receive, echo, receive).
    pub rtt_ns: f64,
    /// The per-stage breakdown ([`super::cost_stages`]).
    pub stages: Vec<super::cost_stages::Stage>,
}

/// `summary.json` of `bench cost`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CostSummary {
    /// Schema name and version.
    pub schema: &'static str,
    /// `cost`.
    pub test: &'static str,
    /// The command line.
    pub command: Vec<String>,
    /// Where it ran.
    pub machine: Machine,
    /// The core the thread was pinned to.
    pub core: usize,
    /// The fabric (`shm`, `mem` or `tcp`).
    pub fabric: &'static str,
    /// One entry per size.
    pub points: Vec<CostPoint>,
}

/// Runs `bench cost`; `Ok(true)` when Ctrl-C cut it short.
///
/// # Errors
///
/// Bad flags, engine failures, a wait past its bound, or writing `--out`.
pub fn run(a: &CostArgs, command: Vec<String>) -> Result<bool, BenchError> {
    if a.batch == 0 || a.batch > DEPTH {
        return Err(BenchError::invalid(
            "--batch",
            format!("must be 1..={DEPTH} (the engine's depth)"),
        ));
    }
    if a.iters == 0 {
        return Err(BenchError::invalid("--iters", "must be at least 1"));
    }
    if !matches!(a.fabric, Fabric::Shm | Fabric::Mem | Fabric::Tcp) {
        return Err(BenchError::invalid(
            "--fabric",
            "cost measures shm (the direct path), mem (the poller path) or tcp (the poller \
             path over loopback TCP)",
        ));
    }
    if a.sizes.is_empty() || a.sizes.contains(&0) {
        return Err(BenchError::invalid("--sizes", "sizes must be at least 1"));
    }
    if let Some(&big) = a.sizes.iter().find(|&&s| s > spinwire::MAX_BUFFER_SIZE) {
        return Err(BenchError::invalid(
            "--sizes",
            format!(
                "{big} exceeds the largest buffer {}",
                spinwire::MAX_BUFFER_SIZE
            ),
        ));
    }
    let core = match a.core {
        Some(c) => {
            check_cores("--core", &[c])?;
            c
        }
        None => available_cores()[0],
    };
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        return Err(BenchError::Pin { core });
    }
    let mut points = Vec::with_capacity(a.sizes.len());
    let mut interrupted = false;
    for (k, &size) in a.sizes.iter().enumerate() {
        if super::stop_requested() {
            interrupted = true;
            break;
        }
        points.push(measure(a, size, k)?);
    }
    let summary = CostSummary {
        schema: "spinwire-bench-cost/1",
        test: "cost",
        command,
        machine: Machine::detect(),
        core,
        fabric: a.fabric.as_str(),
        points,
    };
    report::print(&render(&summary));
    if let Some(dir) = a.out.as_deref() {
        let path = write(&summary, dir)?;
        report::print(&format!("\nwrote {}\n", path.display()));
    }
    Ok(interrupted)
}

/// The console table.
pub fn render(s: &CostSummary) -> String {
    let mut out = format!(
        "engine software cost, {} connection, both ends on one thread (core {}, {})\n",
        s.fabric, s.core, s.machine.cpu_model
    );
    out.push_str(&format!(
        "{:>8} {:>6} {:>16} {:>13} {:>9} {:>14} {:>12}\n",
        "size", "batch", "try_recv ns/msg", "poll ns/msg", "poll/try", "poll M msgs/s", "RTT ns"
    ));
    for p in &s.points {
        out.push_str(&format!(
            "{:>8} {:>6} {:>16.1} {:>13.1} {:>9.2} {:>14.2} {:>12.1}\n",
            p.size_bytes,
            p.batch,
            p.stream_try_recv_ns,
            p.stream_poll_ns,
            p.stream_poll_ns / p.stream_try_recv_ns,
            1e3 / p.stream_poll_ns,
            p.rtt_ns
        ));
    }
    for p in &s.points {
        out.push_str(&format!(
            "\nstages, {} B (ns per operation, the fastest of {} chunks)\n",
            p.size_bytes,
            super::cost_stages::CHUNKS
        ));
        for st in &p.stages {
            out.push_str(&format!("{:>48} {:>8.1}\n", st.name, st.ns));
        }
    }
    out
}

fn write(s: &CostSummary, dir: &Path) -> Result<PathBuf, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let path = dir.join("summary.json");
    let json = serde_json::to_string_pretty(s).map_err(|e| {
        BenchError::io(
            &path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })?;
    std::fs::write(&path, json + "\n").map_err(|e| BenchError::io(&path, e))?;
    Ok(path)
}

/// Wraps an engine error; the step's text is only made into a `String` on the error path, so
/// the measurement loops do not allocate.
fn engine_err<S: Into<String>>(step: S) -> impl FnOnce(spinwire::Error) -> BenchError {
    move |e| BenchError::Engine {
        step: step.into(),
        source: Box::new(e),
    }
}

fn measure(a: &CostArgs, size: usize, k: usize) -> Result<CostPoint, BenchError> {
    let engine = Engine::builder()
        .run_to_completion()
        .idle(IdleStrategy::BusySpin)
        .pool(size.max(64), 256)
        .depth(DEPTH)
        .batch(32)
        .build()
        .map_err(engine_err("build the engine"))?;
    let ep = match a.fabric {
        // A port the kernel just handed out, on loopback.
        Fabric::Tcp => super::group::loopback_endpoint(Fabric::Tcp),
        f => format!("{}://bench-cost-{}-{k}", f.as_str(), std::process::id()),
    };
    let l = engine
        .listen(&ep)
        .map_err(engine_err(format!("listen on {ep}")))?;
    let c = engine
        .connect(&ep)
        .map_err(engine_err(format!("connect to {ep}")))?;
    let s = l
        .accept_timeout(WAIT)
        .map_err(engine_err(format!("accept on {ep}")))?;
    drop(l);
    let payload = vec![3u8; size];
    let mut echo = vec![0u8; size];
    let batch = a.batch as u64;
    // Whole batches: at least one measured, warm-up rounded up.
    let rounds = a.iters.div_ceil(batch).max(1);
    let warm_rounds = a.warmup.div_ceil(batch);

    let stream = |use_poll: bool| -> Result<f64, BenchError> {
        let mut sum = 0u64;
        let rounds_of = if use_poll {
            stream_poll_rounds
        } else {
            stream_try_recv_rounds
        };
        rounds_of(&c, &s, &payload, a.batch, warm_rounds, &mut sum)?;
        let t0 = Instant::now();
        rounds_of(&c, &s, &payload, a.batch, rounds, &mut sum)?;
        let ns = t0.elapsed().as_nanos() as f64 / (rounds * batch) as f64;
        std::hint::black_box(sum);
        Ok(ns)
    };
    let stream_try_recv_ns = stream(false)?;
    let stream_poll_ns = stream(true)?;

    rtt_rounds(&c, &s, &payload, &mut echo, a.warmup)?;
    let t0 = Instant::now();
    rtt_rounds(&c, &s, &payload, &mut echo, a.iters)?;
    let rtt_ns = t0.elapsed().as_nanos() as f64 / a.iters as f64;
    let stages = super::cost_stages::measure(&c, &s, size, a.iters)?;
    Ok(CostPoint {
        size_bytes: size as u64,
        batch,
        iters: rounds * batch,
        warmup: warm_rounds * batch,
        stream_try_recv_ns,
        stream_poll_ns,
        rtt_ns,
        stages,
    })
}

/// Counts empty spins and fails once [`WAIT`] has passed (checking the clock every 4096). The
/// clock is first read at the first empty spin, so a wait that never spins costs no clock read
/// (one per message would be a good part of what is measured).
struct Bound {
    start: Option<Instant>,
    spins: u32,
    what: &'static str,
}

impl Bound {
    #[inline]
    fn new(what: &'static str) -> Bound {
        Bound {
            start: None,
            spins: 0,
            what,
        }
    }

    #[inline]
    fn spin(&mut self) -> Result<(), BenchError> {
        let start = *self.start.get_or_insert_with(Instant::now);
        self.spins = self.spins.wrapping_add(1);
        if self.spins % 4096 == 0 && start.elapsed() > WAIT {
            return Err(BenchError::Timeout {
                what: self.what,
                secs: WAIT.as_secs_f64(),
            });
        }
        Ok(())
    }
}

/// Sends one message, flushing (which runs the engine) while out of buffers or credits;
/// `batched`: with `Connection::send_batched` (published at the caller's `flush`).
///
/// The calls a sending loop makes (`alloc`, `copy_from`, `send`), inlined into the loop; the
/// waits and errors are [`send_waiting`]'s, out of line. (One function with its retry loops
/// was not inlined: its call, frame and the conversion of each result into `BenchError`
/// were about 45 of the ~200 instructions a streamed message's send took, callgrind.)
#[inline(always)]
fn send(conn: &Connection, payload: &[u8], batched: bool) -> Result<(), BenchError> {
    if let Ok(mut b) = conn.alloc() {
        if b.copy_from(payload).is_ok() {
            let r = if batched {
                conn.send_batched(b)
            } else {
                conn.send(b)
            };
            if r.is_ok() {
                return Ok(());
            }
            // Not sent: the buffer goes back (dropped with the error), the slow way retries.
        }
    }
    send_waiting(conn, payload, batched)
}

/// [`send`] when its first try did not send: waits (bounded) for a buffer and credits.
#[cold]
#[inline(never)]
fn send_waiting(conn: &Connection, payload: &[u8], batched: bool) -> Result<(), BenchError> {
    let mut bound = Bound::new("a send buffer");
    let mut b = loop {
        match conn.alloc() {
            Ok(b) => break b,
            Err(spinwire::Error::WouldBlock) => {
                conn.flush().map_err(engine_err("flush"))?;
                bound.spin()?;
            }
            Err(e) => return Err(engine_err("alloc")(e)),
        }
    };
    b.copy_from(payload)
        .map_err(engine_err("copy the payload"))?;
    loop {
        let r = if batched {
            conn.send_batched(b)
        } else {
            conn.send(b)
        };
        match r {
            Ok(()) => return Ok(()),
            Err(SendError::WouldBlock(back)) => {
                b = back;
                conn.flush().map_err(engine_err("flush"))?;
                bound.spin()?;
            }
            Err(e) => return Err(engine_err("send")(e.into())),
        }
    }
}

/// `rounds` batches of `batch` messages sent with `send_batched` and a flush, then received
/// with `try_recv`, one call per message. Its own function (as [`stream_poll_rounds`]), so that
/// callgrind can count each receive style alone (`--toggle-collect='*cost::stream_try_recv*'`).
/// The result is matched: converted with `map_err` and `?`, the message was copied through a
/// second result with a wide load over its narrow stores, a store-forwarding stall per message
/// that is the bench's, not the engine's (callgrind).
#[inline(never)]
fn stream_try_recv_rounds(
    tx: &Connection,
    rx: &Connection,
    payload: &[u8],
    batch: usize,
    rounds: u64,
    sum: &mut u64,
) -> Result<(), BenchError> {
    for _ in 0..rounds {
        send_run(tx, payload, batch)?;
        let mut got = 0;
        let mut bound = Bound::new("streamed messages");
        while got < batch {
            match rx.try_recv() {
                Ok(Some(m)) => {
                    *sum = sum.wrapping_add(u64::from(m[0]));
                    got += 1;
                }
                Ok(None) => bound.spin()?,
                Err(e) => return Err(engine_err("try_recv")(e)),
            }
        }
    }
    Ok(())
}

/// As [`stream_try_recv_rounds`], received with `poll` (limit: what is still due).
#[inline(never)]
fn stream_poll_rounds(
    tx: &Connection,
    rx: &Connection,
    payload: &[u8],
    batch: usize,
    rounds: u64,
    sum: &mut u64,
) -> Result<(), BenchError> {
    for _ in 0..rounds {
        send_run(tx, payload, batch)?;
        let mut got = 0;
        let mut bound = Bound::new("streamed messages");
        while got < batch {
            let n = rx
                .poll(|m| *sum = sum.wrapping_add(u64::from(m[0])), batch - got)
                .map_err(engine_err("poll"))?;
            if n == 0 {
                bound.spin()?;
            }
            got += n;
        }
    }
    Ok(())
}

/// `batch` messages sent with `send_batched`, then a flush.
#[inline(always)]
fn send_run(tx: &Connection, payload: &[u8], batch: usize) -> Result<(), BenchError> {
    for _ in 0..batch {
        send(tx, payload, true)?;
    }
    tx.flush().map_err(engine_err("flush"))
}

fn rtt_rounds(
    c: &Connection,
    s: &Connection,
    payload: &[u8],
    echo: &mut [u8],
    rounds: u64,
) -> Result<(), BenchError> {
    for _ in 0..rounds {
        send(c, payload, false)?;
        c.flush().map_err(engine_err("flush"))?;
        let mut bound = Bound::new("the ping");
        // The results matched, not converted with `map_err` (see `stream_try_recv_rounds`).
        loop {
            match s.try_recv() {
                Ok(Some(m)) => {
                    echo.copy_from_slice(&m);
                    break;
                }
                Ok(None) => bound.spin()?,
                Err(e) => return Err(engine_err("try_recv")(e)),
            }
        }
        send(s, echo, false)?;
        s.flush().map_err(engine_err("flush"))?;
        let mut bound = Bound::new("the echo");
        loop {
            match c.try_recv() {
                Ok(Some(_)) => break,
                Ok(None) => bound.spin()?,
                Err(e) => return Err(engine_err("try_recv")(e)),
            }
        }
    }
    Ok(())
}
