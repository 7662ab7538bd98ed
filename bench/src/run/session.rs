//! What every point of the protocol shares: its parameters ([`PointSpec`]), blocking send and
//! receive with a bounded wait, the READY / RESULT handshake, payload templates, and the
//! `--stall-once-ms` test aid.

use std::time::Duration;

use super::conn::{BenchConn, Waiter};
use super::wire::{payload_byte, unexpected, Hello, ServerResult, TAG_DATA, TAG_READY};
use crate::cli::{Idle, LatencyKind, TestKind};
use crate::error::BenchError;
use crate::floor::{duration_ns, AlignedBuf};

/// Parameters of one client-side point.
#[derive(Debug, Clone)]
pub struct PointSpec {
    /// Payload bytes.
    pub size: usize,
    /// Measured iterations (ignored when `duration` is set).
    pub iters: u64,
    /// Measure for this long instead.
    pub duration: Option<Duration>,
    /// Unmeasured iterations first.
    pub warmup: u64,
    /// Offered load, msgs/s (0: unlimited).
    pub rate: u64,
    /// Interval-log period.
    pub interval: Duration,
    /// Wait strategy.
    pub idle: Idle,
    /// Longest wait for the peer without progress.
    pub timeout: Duration,
    /// Load: messages sharing one intended send time.
    pub burst: u64,
    /// Load: who records the latency.
    pub latency: LatencyKind,
    /// Test aid: the server stalls once for this long...
    pub stall: Duration,
    /// ...after receiving this many messages.
    pub stall_after: u64,
    /// Rate: the application batch (`--app-batch`): messages sent per flush and received per
    /// `poll(handler, n)` call. 0: one `send` / `try_recv` per message, flushed at the end.
    pub app_batch: usize,
    /// `--verify`: the receiver checks every payload byte (rate: the server; lat: the client's
    /// echoes).
    pub verify: bool,
    /// The eager limit (the buffer size): a payload above it is a large message, which the
    /// receiver checks at a few words even without `verify`.
    pub eager_max: usize,
}

impl PointSpec {
    /// The HELLO announcing a `test` point with this spec.
    pub(super) fn hello(&self, test: TestKind) -> Hello {
        Hello {
            test,
            latency: self.latency,
            size: self.size as u64,
            warmup: self.warmup,
            stall_after: self.stall_after,
            stall_ns: duration_ns(self.stall),
            interval_ns: duration_ns(self.interval),
            app_batch: u32::try_from(self.app_batch).unwrap_or(u32::MAX),
            verify: self.verify,
        }
    }
}

pub(super) fn send_blocking<C: BenchConn>(
    conn: &mut C,
    msg: &[u8],
    w: &mut Waiter,
) -> Result<(), BenchError> {
    while !conn.try_send_with(msg.len(), |b| b.copy_from_slice(msg))? {
        w.idle()?;
    }
    conn.flush()?;
    w.reset();
    Ok(())
}

pub(super) fn recv_blocking<C: BenchConn>(
    conn: &mut C,
    w: &mut Waiter,
) -> Result<Vec<u8>, BenchError> {
    loop {
        if let Some(m) = conn.try_recv_with(|m| m.to_vec())? {
            w.reset();
            return Ok(m);
        }
        w.idle()?;
    }
}

pub(super) fn expect_ready<C: BenchConn>(conn: &mut C, w: &mut Waiter) -> Result<(), BenchError> {
    let m = recv_blocking(conn, w)?;
    match m.first() {
        Some(&TAG_READY) if m.len() > 2 && m[1] == 1 => {
            warn_once(&format!(
                "bench: warning: the server's engine settings differ: {}; its figures are not those of these settings",
                String::from_utf8_lossy(&m[2..])
            ));
            Ok(())
        }
        Some(&TAG_READY) if m.len() >= 2 && m[1] == 1 => Ok(()),
        Some(&TAG_READY) if m.len() >= 2 => Err(BenchError::Protocol(format!(
            "server refused the point: {}",
            String::from_utf8_lossy(&m[2..])
        ))),
        _ => Err(unexpected("READY", &m)),
    }
}

/// Prints `msg` to stderr unless it was printed before.
fn warn_once(msg: &str) {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if !seen.iter().any(|s| s == msg) {
        eprintln!("{msg}");
        seen.push(msg.to_owned());
    }
}

pub(super) fn expect_result<C: BenchConn>(
    conn: &mut C,
    w: &mut Waiter,
) -> Result<ServerResult, BenchError> {
    ServerResult::decode(&recv_blocking(conn, w)?)
}

/// A payload template: `size` bytes, tag first, a recognisable pattern after
/// ([`payload_byte`]); it starts on a page, so the sender's copy into its buffer runs as the
/// memcpy floor's does ([`AlignedBuf`]).
pub(super) fn payload(size: usize) -> AlignedBuf {
    let mut p = AlignedBuf::zeroed(size);
    for (i, b) in p.iter_mut().enumerate() {
        *b = payload_byte(i);
    }
    if let Some(b) = p.first_mut() {
        *b = TAG_DATA;
    }
    p
}

/// How a receiver checks a `DATA` payload beyond its length and tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Length and tag only (what the caller already compares).
    Head,
    /// A few words spread over it (a large message: its bytes are read, as an application
    /// would, at the cost of a few cache lines).
    Sampled,
    /// Every byte (`--verify`).
    Full,
}

/// Bytes a [`Check::Sampled`] looks at, spread evenly from the second to the last.
const SAMPLES: usize = 8;

impl Check {
    /// The check for `size`-byte payloads: `Full` with `verify`, `Sampled` above `eager_max`.
    pub(super) fn new(verify: bool, size: usize, eager_max: usize) -> Self {
        if verify {
            Check::Full
        } else if size > eager_max {
            Check::Sampled
        } else {
            Check::Head
        }
    }

    /// The first byte of `m` (after the tag) that differs from the pattern, if any.
    ///
    /// The default (`Head`: nothing past the tag) inline, the scans out of line: it runs inside
    /// every timed round trip, and under the rxe VM's emulation a call costs more than its
    /// instructions.
    #[inline(always)]
    pub(super) fn first_bad(self, m: &[u8]) -> Option<usize> {
        match self {
            Check::Head => None,
            _ => self.scan(m),
        }
    }

    /// [`first_bad`](Self::first_bad) of the checks that look at the payload.
    #[inline(never)]
    fn scan(self, m: &[u8]) -> Option<usize> {
        match self {
            Check::Head => None,
            Check::Sampled if m.len() > 1 => (1..=SAMPLES)
                .map(|k| 1 + k * (m.len() - 2) / SAMPLES)
                .find(|&i| m[i] != payload_byte(i)),
            Check::Sampled => None,
            // One pattern period (251 bytes) per comparison: a `memcmp` each, not a loop over
            // bytes. The tag (byte 0) is the caller's.
            Check::Full => m.chunks(PERIOD.len()).enumerate().find_map(|(j, c)| {
                let from = usize::from(j == 0);
                (c[from..] != PERIOD[from..c.len()]).then(|| {
                    let at = (from..c.len()).find(|&i| c[i] != PERIOD[i]).unwrap_or(from);
                    j * PERIOD.len() + at
                })
            }),
        }
    }
}

/// One period of the payload pattern: `PERIOD[i] == payload_byte(i)` for `i < 251`.
const PERIOD: [u8; 251] = {
    let mut p = [0u8; 251];
    let mut i = 0;
    while i < p.len() {
        p[i] = i as u8;
        i += 1;
    }
    p
};

/// The protocol error for a payload whose byte `at` is not the pattern's.
pub(super) fn corrupt(size: usize, at: usize) -> BenchError {
    BenchError::Protocol(format!(
        "a {size}-byte DATA payload differs from what was sent at byte {at}"
    ))
}

pub(super) fn bad_data(size: usize, len: usize, tag: u8) -> BenchError {
    BenchError::Protocol(format!(
        "expected {size}-byte DATA or END, got {len} bytes with tag {tag:#04x}"
    ))
}

/// The test aid `--stall-once-ms`: one sleep after a number of received messages.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stall {
    after: u64,
    sleep: Option<Duration>,
}

impl Stall {
    pub(super) fn new(h: &Hello) -> Self {
        Self {
            after: h.stall_after,
            sleep: (h.stall_ns > 0).then(|| Duration::from_nanos(h.stall_ns)),
        }
    }

    /// Call with the count of messages received so far: sleeps once when it reaches `after`.
    #[inline]
    pub(super) fn check(&mut self, received: u64) {
        if received == self.after {
            if let Some(d) = self.sleep.take() {
                std::thread::sleep(d);
            }
        }
    }
}
