//! What every point of the protocol shares: its parameters ([`PointSpec`]), blocking send and
//! receive with a bounded wait, the READY / RESULT handshake, payload templates, and the
//! `--stall-once-ms` test aid.

use std::time::Duration;

use super::conn::{BenchConn, Waiter};
use super::wire::{unexpected, Hello, ServerResult, TAG_DATA, TAG_READY};
use crate::cli::{Idle, LatencyKind, TestKind};
use crate::error::BenchError;
use crate::floor::duration_ns;

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
    conn.flush();
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
        Some(&TAG_READY) if m.len() >= 2 && m[1] == 1 => Ok(()),
        Some(&TAG_READY) if m.len() >= 2 => Err(BenchError::Protocol(format!(
            "server refused the point: {}",
            String::from_utf8_lossy(&m[2..])
        ))),
        _ => Err(unexpected("READY", &m)),
    }
}

pub(super) fn expect_result<C: BenchConn>(
    conn: &mut C,
    w: &mut Waiter,
) -> Result<ServerResult, BenchError> {
    ServerResult::decode(&recv_blocking(conn, w)?)
}

/// A payload template: `size` bytes, tag first, a recognisable pattern after.
pub(super) fn payload(size: usize) -> Vec<u8> {
    let mut p: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    if let Some(b) = p.first_mut() {
        *b = TAG_DATA;
    }
    p
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
