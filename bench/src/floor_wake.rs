//! The machine's wake-up reference: what a round trip costs when the receiver is asleep in the
//! kernel, with nothing but two futex words between two pinned threads.
//!
//! It is the bare protocol of `--idle block` (`IdleStrategy::Block`): spinwire's doorbells
//! stripped of everything else, so `bench load --idle block --floor` can state its wake-up
//! latency beside what this machine's kernel takes for the same exchange, in the same run:
//!
//! * Each direction has a word (a sequence number) and an *asleep* flag. A waiter spins on its
//!   word for `spin`, then announces that it sleeps (flag, `SeqCst`), re-checks the word and
//!   sleeps in `FUTEX_WAIT` until it moves (each sleep bounded, so a lost wake-up would show as
//!   a slow round trip, never a hang).
//! * A poster stores the word (`SeqCst`) and calls `FUTEX_WAKE` only if the peer announced that
//!   it sleeps: a spinning peer costs it no syscall (the Dekker pair of `SeqCst` stores and loads
//!   means one of the two always sees the other).
//! * The client paces pings at `rate`: it sleeps until [`PACER_LEAD`] before each intended send
//!   time and spins the rest (as `bench load`'s pacer does), so at low rates the server is
//!   asleep when a ping comes and the client is still spinning when the pong comes: one kernel
//!   wake-up per round trip, the case `--idle block` is measured in.
//!
//! Each round trip is timed from just before the ping is posted to the pong's arrival.
//!
//! It is a reference, not a proven lower bound: on the 2-vCPU KVM guest this was written on,
//! spinwire's shm round trip under `--idle block` measured 0.97-1.03x of it on a quiet machine
//! (44-45 µs against 44-46 µs), but 0.47-0.75x while other jobs kept the vCPUs busy (a busy
//! vCPU is woken without leaving a halt, and the load changes between the two measurements);
//! so compare runs taken on a quiet machine (README: "Idle: spin, back off, or sleep until
//! woken").

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;

use crate::error::BenchError;
use crate::floor::{FloorResult, SPIN_LIMIT};
use crate::machine::pin_current;
use crate::stats::{new_latency_histogram, RateSummary};
use crate::sys::{futex_wait, futex_wake};

/// How long before each intended send time the client stops sleeping and spins (the same lead
/// `bench load`'s pacer keeps under `--idle block`: a timed sleep has tens of µs of slack).
pub const PACER_LEAD: Duration = Duration::from_micros(100);

/// The longest single futex sleep: a safety net, as `IdleStrategy::Block`'s `max_sleep` is.
const MAX_SLEEP: Duration = Duration::from_millis(100);

/// Posted by the client to stop the server.
const STOP: u32 = u32::MAX;

/// What one wake-up reference run does.
#[derive(Debug, Clone, Copy)]
pub struct WakeFloorRun {
    /// Pings per second (at least 1).
    pub rate: u64,
    /// How long each side spins before it sleeps.
    pub spin: Duration,
    /// Measured round trips.
    pub iters: u64,
    /// Unmeasured round trips first.
    pub warmup: u64,
}

/// One direction: the word the waiter sleeps on and its announcement.
#[derive(Default)]
struct Bell {
    word: CachePadded<AtomicU32>,
    asleep: CachePadded<AtomicBool>,
}

impl Bell {
    /// Posts `v` and wakes the waiter only if it announced that it sleeps.
    fn post(&self, v: u32) {
        self.word.store(v, Ordering::SeqCst);
        if self.asleep.load(Ordering::SeqCst) {
            futex_wake(&self.word);
        }
    }

    /// Waits until the word differs from `old`: spins for `spin`, then sleeps. Returns the new
    /// value, or [`BenchError::Timeout`] after [`SPIN_LIMIT`] without one.
    fn wait(&self, old: u32, spin: Duration, stop: &AtomicBool) -> Result<u32, BenchError> {
        let start = Instant::now();
        loop {
            let v = self.word.load(Ordering::Acquire);
            if v != old {
                return Ok(v);
            }
            if start.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        loop {
            self.asleep.store(true, Ordering::SeqCst);
            let v = self.word.load(Ordering::SeqCst);
            if v == old {
                futex_wait(&self.word, old, MAX_SLEEP);
            }
            self.asleep.store(false, Ordering::Relaxed);
            let v = self.word.load(Ordering::Acquire);
            if v != old {
                return Ok(v);
            }
            if stop.load(Ordering::Relaxed) {
                return Err(BenchError::Interrupted);
            }
            if start.elapsed() > SPIN_LIMIT {
                return Err(BenchError::Timeout {
                    what: "the wake-up reference's peer",
                    secs: SPIN_LIMIT.as_secs_f64(),
                });
            }
        }
    }
}

/// Measures the wake-up reference between `cores[0]` (client) and `cores[1]` (server).
///
/// # Errors
/// [`BenchError::InvalidArg`] for zero `iters` or `rate`, or more than `u32::MAX - 1` round
/// trips; [`BenchError::Pin`] if pinning fails; [`BenchError::Timeout`] if a peer stalls for
/// [`SPIN_LIMIT`]; [`BenchError::Interrupted`] when `stop` is raised.
pub fn measure(
    cores: [usize; 2],
    run: WakeFloorRun,
    stop: &'static AtomicBool,
) -> Result<FloorResult, BenchError> {
    if run.iters == 0 {
        return Err(BenchError::invalid("--iters", "must be at least 1"));
    }
    if run.rate == 0 {
        return Err(BenchError::invalid("--rate", "must be at least 1"));
    }
    let total = run.warmup.saturating_add(run.iters);
    if total >= u64::from(STOP) {
        return Err(BenchError::invalid("--iters", "too many round trips"));
    }
    let ping = Arc::new(Bell::default());
    let pong = Arc::new(Bell::default());
    let (s_ping, s_pong) = (Arc::clone(&ping), Arc::clone(&pong));
    let spin = run.spin;
    let server = std::thread::Builder::new()
        .name("floor-wake-server".into())
        .spawn(move || -> Result<(), BenchError> {
            pin_current(cores[1])?;
            let mut seen = 0u32;
            loop {
                seen = s_ping.wait(seen, spin, stop)?;
                if seen == STOP {
                    return Ok(());
                }
                s_pong.post(seen);
            }
        })
        .map_err(|e| BenchError::io("thread spawn", e))?;

    let client = || -> Result<(Histogram<u64>, u64), BenchError> {
        pin_current(cores[0])?;
        let mut hist = new_latency_histogram();
        let interval = Duration::from_secs_f64(1.0 / run.rate as f64);
        let start = Instant::now();
        let mut measure_start = start;
        for i in 0..total {
            let intended = start + interval.mul_f64(i as f64);
            if i == run.warmup {
                measure_start = intended;
            }
            let now = Instant::now();
            if intended > now + PACER_LEAD {
                std::thread::sleep(intended - now - PACER_LEAD);
            }
            while Instant::now() < intended {
                std::hint::spin_loop();
            }
            if stop.load(Ordering::Relaxed) {
                return Err(BenchError::Interrupted);
            }
            let seq = (i + 1) as u32;
            let t0 = Instant::now();
            ping.post(seq);
            let mut got = pong.wait(seq - 1, spin, stop)?;
            while got != seq {
                got = pong.wait(got, spin, stop)?;
            }
            if i >= run.warmup {
                hist.saturating_record(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
            }
        }
        let elapsed = u64::try_from(measure_start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Ok((hist, elapsed))
    };
    let result = client();
    ping.post(STOP);
    let joined = server
        .join()
        .map_err(|_| BenchError::ThreadPanicked("wake-up reference server"))?;
    let (rtt, elapsed_ns) = result?;
    joined?;
    Ok(FloorResult {
        rtt,
        rtt_two_lines: None,
        rings: None,
        rate: RateSummary {
            msgs: run.iters,
            bytes: run.iters.saturating_mul(4),
            elapsed_ns,
        },
        cores,
        kind: KIND,
        ping_bytes: 4,
    })
}

/// [`FloorResult::kind`] of this floor.
pub const KIND: &str = "futex-wake";

/// The spin of `IdleStrategy::block()`, the strategy `--idle block` runs: how long each side of
/// the wake-up reference spins before it sleeps unless told otherwise.
pub fn block_spin() -> Duration {
    match spinwire::IdleStrategy::block() {
        spinwire::IdleStrategy::Block { spin, .. } => spin,
        _ => Duration::from_micros(50),
    }
}
