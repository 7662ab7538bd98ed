//! `bench footprint`: what a connection costs when it is made and while it sits idle. The
//! listener runs in this process and the connecting side in a child process (this binary again,
//! with `--connect`), so each side's resident memory is its own:
//!
//! * **connect time**: each of `--connections` connects, timed on the connecting side (median,
//!   p90, max);
//! * **resident memory per connection**, each side: the growth of the memory this process
//!   touched (`RssAnon + RssShmem`: private and shared pages, not the binary's and libraries'
//!   file pages) from before the first connect to after the idle wait, over the connection
//!   count; the code and file pages that the first connect pages in (`RssFile`: once per
//!   process, however many connections, and more or less of it under memory pressure) are
//!   reported on a line of their own;
//! * **committed shared memory per connection**: the growth of the machine's `Shmem`
//!   (`/proc/meminfo`: tmpfs and memfd pages, counted once however many processes map them);
//!   machine-wide, so run it on a quiet machine;
//! * **liveness**: after `--idle` of neither side calling into the engine, how many connections
//!   each side saw go down (should be none).
//!
//! Both engines are built with the defaults (`--buffers` and the large-slot knobs change the
//! pools), run to completion, and idle with backoff, so the run takes no core.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use spinwire::{Connection, Engine, Event, IdleStrategy};

use crate::cli::{parse_size, Fabric};
use crate::error::BenchError;

/// `bench footprint`.
#[derive(Debug, Clone, Args)]
pub struct FootprintArgs {
    /// The fabric: `shm` or `tcp` (loopback).
    #[arg(long, value_enum, default_value_t = Fabric::Shm)]
    pub fabric: Fabric,
    /// Connections to make and hold.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub connections: usize,
    /// How long both sides hold the connections without calling into the engine before the
    /// memory is read (longer than the liveness timeout, so heartbeats run meanwhile).
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub idle: f64,
    /// Pool buffers per connection and direction [default: the engine's].
    #[arg(long, value_name = "N")]
    pub buffers: Option<usize>,
    /// Large slots per connection and direction [default: the engine's].
    #[arg(long, value_name = "N")]
    pub large_buffers: Option<usize>,
    /// The largest message (k/m suffixes) [default: the engine's].
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    pub max_size: Option<usize>,
    /// Internal: run the connecting side against this endpoint (the child process).
    #[arg(long, value_name = "ENDPOINT", hide = true)]
    pub connect: Option<String>,
}

/// The bound on the whole run's waits.
const WAIT: Duration = Duration::from_secs(60);

fn engine_err(step: impl Into<String>, e: spinwire::Error) -> BenchError {
    BenchError::Engine {
        step: step.into(),
        source: Box::new(e),
    }
}

fn build(a: &FootprintArgs) -> Result<Engine, BenchError> {
    let mut b = Engine::builder()
        .run_to_completion()
        .idle(IdleStrategy::backoff());
    if let Some(n) = a.buffers {
        b = b.pool(spinwire::DEFAULT_BUFFER_SIZE, n);
    }
    if let Some(n) = a.large_buffers {
        b = b.large_buffers(n);
    }
    if let Some(n) = a.max_size {
        b = b.max_message_size(n);
    }
    b.build().map_err(|e| engine_err("build the engine", e))
}

/// One `/proc` figure in KiB (`VmRSS:` of `/proc/<pid>/status`, `Shmem:` of `/proc/meminfo`).
fn kib(path: &str, key: &str) -> Result<u64, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| BenchError::Protocol(format!("{path}: no `{key}` figure")))
}

/// A process's resident memory in KiB: (memory it touched, `RssAnon + RssShmem`; file pages,
/// `RssFile`: its code and the libraries').
fn rss_kib(pid: u32) -> Result<(u64, u64), BenchError> {
    let path = format!("/proc/{pid}/status");
    let mem = kib(&path, "RssAnon:")? + kib(&path, "RssShmem:")?;
    Ok((mem, kib(&path, "RssFile:")?))
}

fn shmem_kib() -> Result<u64, BenchError> {
    kib("/proc/meminfo", "Shmem:")
}

/// Runs `bench footprint`.
///
/// # Errors
///
/// Bad flags, engine failures, the child failing, or a wait past its bound.
pub fn run(a: &FootprintArgs) -> Result<bool, BenchError> {
    if let Some(ep) = &a.connect {
        return connecting_side(a, ep).map(|()| false);
    }
    if a.connections == 0 {
        return Err(BenchError::invalid("--connections", "must be at least 1"));
    }
    if !(0.0..=600.0).contains(&a.idle) {
        return Err(BenchError::invalid("--idle", "must be 0..=600 seconds"));
    }
    let endpoint = match a.fabric {
        Fabric::Shm => format!("shm://spinwire-footprint-{}", std::process::id()),
        // A port of its own per run (the listener does not report an ephemeral one).
        Fabric::Tcp => format!("tcp://127.0.0.1:{}", 20_000 + std::process::id() % 20_000),
        other => {
            return Err(BenchError::invalid(
                "--fabric",
                format!("{other:?} is not measured here (shm or tcp)"),
            ))
        }
    };
    let engine = build(a)?;
    let listener = engine
        .listen(&endpoint)
        .map_err(|e| engine_err(format!("listen on {endpoint}"), e))?;
    let endpoint = listener.endpoint().to_owned();
    let me = std::process::id();
    let (rss0, shm0) = (rss_kib(me)?, shmem_kib()?);

    let exe = std::env::current_exe().map_err(|e| BenchError::io("current_exe", e))?;
    let mut cmd = Command::new(exe);
    cmd.args(["footprint", "--connect", &endpoint])
        .args(["--connections", &a.connections.to_string()])
        .args(["--idle", &a.idle.to_string()]);
    for (flag, v) in [
        ("--buffers", a.buffers),
        ("--large-buffers", a.large_buffers),
        ("--max-size", a.max_size),
    ] {
        if let Some(v) = v {
            cmd.args([flag, &v.to_string()]);
        }
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| BenchError::io("spawn the connecting side", e))?;
    let result = listening_side(a, &engine, &listener, &mut child, me, (rss0, shm0));
    drop(child.stdin.take());
    let _ = child.wait();
    result.map(|()| false)
}

fn listening_side(
    a: &FootprintArgs,
    engine: &Engine,
    listener: &spinwire::Listener,
    child: &mut std::process::Child,
    me: u32,
    (rss0, shm0): ((u64, u64), u64),
) -> Result<(), BenchError> {
    let deadline = Instant::now() + WAIT;
    let mut conns: Vec<Connection> = Vec::with_capacity(a.connections);
    while conns.len() < a.connections {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BenchError::Timeout {
                what: "the connections",
                secs: WAIT.as_secs_f64(),
            });
        }
        conns.push(
            listener
                .accept_timeout(left)
                .map_err(|e| engine_err("accept", e))?,
        );
    }
    // The child reports once it has connected and idled; meanwhile this side makes no call.
    let stdout = child
        .stdout
        .take()
        .ok_or(BenchError::Protocol("the connecting side's output".into()))?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| BenchError::io("the connecting side's output", e))?;
    let (rss1, shm1) = (rss_kib(me)?, shmem_kib()?);
    let f: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [c_mem0, c_file0, c_mem1, c_file1, med, p90, max, c_down] = f[..] else {
        return Err(BenchError::Protocol(format!(
            "the connecting side said `{}`",
            line.trim()
        )));
    };
    let (mut closed, mut unresponsive) = (0, 0);
    while let Some(ev) = engine.try_event() {
        match ev {
            Event::Disconnected { .. } => closed += 1,
            Event::PeerUnresponsive { .. } => unresponsive += 1,
            _ => {}
        }
    }
    let n = a.connections as f64;
    let per = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / n;
    println!(
        "footprint: {:?}, {} connections, idle {:.1} s",
        a.fabric, a.connections, a.idle
    );
    println!(
        "  connect time: median {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        med as f64 / 1e6,
        p90 as f64 / 1e6,
        max as f64 / 1e6
    );
    println!(
        "  resident per connection: listener {:.0} KiB, connector {:.0} KiB (listener {} -> {} KiB)",
        per(rss0.0, rss1.0),
        per(c_mem0, c_mem1),
        rss0.0,
        rss1.0
    );
    println!(
        "  code and file pages paged in (once, not per connection): listener {} KiB, \
         connector {} KiB",
        rss1.1.saturating_sub(rss0.1),
        c_file1.saturating_sub(c_file0)
    );
    println!(
        "  committed shared memory per connection: {:.0} KiB",
        per(shm0, shm1)
    );
    println!(
        "  connections that went down while idle: listener {} ({closed} closed by the peer, \
         {unresponsive} peer unresponsive), connector {c_down}",
        closed + unresponsive
    );
    Ok(())
}

/// The child: connects `--connections` times, idles, prints `mem_before file_before mem_after
/// file_after median_ns p90_ns max_ns down` (`mem`, `file`: [`rss_kib`]'s figures; `down`:
/// connections it saw go down), then holds the connections until its stdin closes.
fn connecting_side(a: &FootprintArgs, endpoint: &str) -> Result<(), BenchError> {
    let engine = build(a)?;
    let me = std::process::id();
    let rss0 = rss_kib(me)?;
    let mut times = Vec::with_capacity(a.connections);
    let mut conns = Vec::with_capacity(a.connections);
    for _ in 0..a.connections {
        let t = Instant::now();
        conns.push(
            engine
                .connect_timeout(endpoint, Duration::from_secs(10))
                .map_err(|e| engine_err(format!("connect to {endpoint}"), e))?,
        );
        times.push(t.elapsed().as_nanos() as u64);
    }
    std::thread::sleep(Duration::from_secs_f64(a.idle));
    let rss1 = rss_kib(me)?;
    let down = std::iter::from_fn(|| engine.try_event())
        .filter(|ev| {
            matches!(
                ev,
                Event::Disconnected { .. } | Event::PeerUnresponsive { .. }
            )
        })
        .count();
    times.sort_unstable();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{} {} {} {} {} {} {} {down}",
        rss0.0,
        rss0.1,
        rss1.0,
        rss1.1,
        at(0.5),
        at(0.9),
        times[times.len() - 1]
    )
    .and_then(|()| out.flush())
    .map_err(|e| BenchError::io("stdout", e))?;
    drop(out);
    // Hold until the parent is done (bounded).
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
    drop(conns);
    Ok(())
}
