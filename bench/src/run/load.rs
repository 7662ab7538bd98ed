//! The open-loop `load` test: the client offers messages at a fixed rate without waiting for
//! replies, and each message's latency counts from the time it was *meant* to be sent, so a
//! stall cannot hide the messages queued behind it (no coordinated omission).
//!
//! Message `i` (warm-up included) is meant to go at `start + floor(i / burst) * burst / rate`;
//! when the sender falls behind it sends at once to catch up, and the lateness shows in the
//! latency. Each `DATA` carries `i` and its intended time ([`crate::sys::mono_ns`]).
//!
//! * One-way (same host): the server records `arrival - intended` per message into interval
//!   histograms and ships them to the client after RESULT (INTERVAL + CHUNK messages).
//! * Round trip: the server echoes (as for `lat`); the client records `echo arrival - intended`
//!   while it sends, in the same loop, never waiting for an echo before the next send.
//!
//! Recording never allocates: the interval histograms are allocated before the first message.

use std::time::Duration;

use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;

use super::conn::{head, BenchConn, Waiter};
use super::intervals::{to_log, Intervals, RawInterval};
use super::session::{
    bad_data, expect_ready, expect_result, payload, recv_blocking, send_blocking, PointSpec, Stall,
};
use super::wire::{
    u64_at, unexpected, Hello, IntervalHeader, CONTROL_MAX, TAG_CHUNK, TAG_DATA, TAG_END,
};
use crate::cli::{LatencyKind, TestKind};
use crate::error::BenchError;
use crate::floor::duration_ns;
use crate::report::hlog::Interval;
use crate::stats::{new_latency_histogram, RateSummary};
use crate::sys::{mono_ns, ThreadCpu};

/// What a load point measured.
#[derive(Debug, Clone)]
pub struct LoadOutcome {
    /// Latency from intended send time of every measured message, nanoseconds.
    pub latency: Histogram<u64>,
    /// The same, per interval.
    pub intervals: Vec<Interval>,
    /// Measured messages (warm-up excluded).
    pub count: u64,
    /// Offered rate, msgs/s.
    pub offered_rate: f64,
    /// Rate the sender achieved over the measured messages, msgs/s.
    pub achieved_rate: f64,
    /// From the first measured message's intended time to the last one's send.
    pub elapsed: Duration,
    /// The server thread's CPU use.
    pub server_cpu: ThreadCpu,
}

/// Reads a load `DATA` message's (sequence number, intended send time).
#[inline]
fn stamp(m: &[u8]) -> (u64, u64) {
    (u64_at(m, 8), u64_at(m, 16))
}

/// A round-trip client drains one echo if there is one, recording its latency when measured;
/// `Ok(true)` when it did. `echoes` counts those received, and checks their order.
#[inline]
fn drain<C: BenchConn>(
    conn: &mut C,
    spec: &PointSpec,
    echoes: &mut u64,
    intervals: &mut Intervals,
) -> Result<bool, BenchError> {
    let size = spec.size;
    let got = conn.try_recv_with(|m| {
        let head = head(m);
        (head, (head == (size, TAG_DATA)).then(|| stamp(m)))
    })?;
    match got {
        None => Ok(false),
        Some((_, Some((seq, intended)))) if seq == *echoes => {
            let now = mono_ns();
            if seq >= spec.warmup {
                intervals.record(now.saturating_sub(intended), 0, now);
            }
            *echoes += 1;
            Ok(true)
        }
        Some((_, Some((seq, _)))) => Err(BenchError::Protocol(format!(
            "expected echo number {echoes}, got {seq}"
        ))),
        Some(((len, tag), None)) => Err(BenchError::Protocol(format!(
            "expected a {size}-byte echo, got {len} bytes with tag {tag:#04x}"
        ))),
    }
}

/// Client side of a load point at `spec.rate` msgs/s. `base_offset` is the time from the
/// report's start to now (the interval log's time axis).
///
/// # Errors
/// Connection loss, protocol errors, [`BenchError::Timeout`], [`BenchError::Interrupted`].
pub fn client_load<C: BenchConn>(
    conn: &mut C,
    spec: &PointSpec,
    base_offset: Duration,
) -> Result<LoadOutcome, BenchError> {
    let origin_ns = mono_ns();
    let mut w = Waiter::new(
        spec.idle,
        spec.timeout,
        "send credits or echoes from the server",
    );
    if spec.rate == 0 {
        return Err(BenchError::invalid("--rate", "load needs an offered rate"));
    }
    if spec.size < super::wire::LOAD_MIN_SIZE {
        return Err(BenchError::invalid(
            "--size",
            format!(
                "load messages carry a timestamp: at least {} bytes",
                super::wire::LOAD_MIN_SIZE
            ),
        ));
    }
    send_blocking(conn, &spec.hello(TestKind::Load).encode(), &mut w)?;
    expect_ready(conn, &mut w)?;

    let round_trip = spec.latency == LatencyKind::RoundTrip;
    let template = payload(spec.size);
    let burst = spec.burst.max(1);
    let burst_ns = burst as f64 * 1e9 / spec.rate as f64;
    // One-way: the server records; the client's two histograms stay empty.
    let expected = if round_trip {
        spec.duration
    } else {
        Some(Duration::ZERO)
    };
    let mut intervals = Intervals::new(spec.interval, expected);
    let mut pacer = Waiter::new(spec.idle, Duration::MAX, "the pacer");
    let mut echoes = 0u64;
    let start_ns = mono_ns();
    let intended_of = |i: u64| start_ns + ((i / burst) as f64 * burst_ns) as u64;
    let measure_start_ns = intended_of(spec.warmup);
    let deadline_ns = spec.duration.map(|d| measure_start_ns + duration_ns(d));
    let mut i = 0u64;
    loop {
        let intended = intended_of(i);
        if i >= spec.warmup {
            let done = match deadline_ns {
                Some(d) => intended >= d,
                None => i - spec.warmup >= spec.iters,
            };
            if done {
                break;
            }
        }
        if i % 4096 == 0 && super::stop_requested() {
            return Err(BenchError::Interrupted);
        }
        // Wait for the intended time (draining echoes meanwhile); late: send at once.
        while mono_ns() < intended {
            if !(round_trip && drain(conn, spec, &mut echoes, &mut intervals)?) {
                // `--idle block`: asleep until an echo or (nearly) the intended time.
                pacer.idle_recv_until(conn, Some(intended))?;
            }
        }
        pacer.reset();
        loop {
            let sent = conn.try_send_with(spec.size, |b| {
                b.copy_from_slice(&template);
                b[8..16].copy_from_slice(&i.to_le_bytes());
                b[16..24].copy_from_slice(&intended.to_le_bytes());
            })?;
            if sent {
                break;
            }
            if !(round_trip && drain(conn, spec, &mut echoes, &mut intervals)?) {
                w.idle()?;
            }
        }
        w.reset();
        i += 1;
        if i % burst == 0 {
            conn.flush()?;
        }
    }
    let end_ns = mono_ns();
    conn.flush()?;
    let sent = i;
    let measured = sent - spec.warmup;
    if round_trip {
        while echoes < sent {
            if drain(conn, spec, &mut echoes, &mut intervals)? {
                w.reset();
            } else {
                w.idle_recv(conn)?;
            }
        }
    }
    send_blocking(conn, &[TAG_END], &mut w)?;
    let res = expect_result(conn, &mut w)?;
    if res.rate.msgs != sent {
        return Err(BenchError::Protocol(format!(
            "server received {} messages, client sent {sent}",
            res.rate.msgs
        )));
    }
    let raw = if round_trip {
        intervals.into_raw(mono_ns())
    } else {
        receive_intervals(conn, &mut w)?
    };
    let mut latency = new_latency_histogram();
    for (_, _, h) in &raw {
        latency
            .add(h)
            .map_err(|e| BenchError::Protocol(format!("merging interval histograms: {e}")))?;
    }
    if latency.len() != measured {
        return Err(BenchError::Protocol(format!(
            "{} latencies recorded for {measured} measured messages",
            latency.len()
        )));
    }
    // The measured messages occupy `measured / rate` of intended time when on time: from the
    // first one's slot to the end of the last one's.
    let elapsed_ns = end_ns.saturating_sub(measure_start_ns);
    let achieved_rate = measured as f64 * 1e9 / (elapsed_ns as f64 + burst_ns).max(1.0);
    Ok(LoadOutcome {
        latency,
        intervals: to_log(raw, origin_ns, base_offset),
        count: measured,
        offered_rate: spec.rate as f64,
        achieved_rate,
        elapsed: Duration::from_nanos(elapsed_ns),
        server_cpu: res.cpu,
    })
}

/// Server side of a one-way load point: records arrival minus intended time of every measured
/// message until END. Returns what it counted (all messages, warm-up included; the window from
/// the first measured arrival to the last) and the raw interval histograms.
pub(super) fn serve_one_way<C: BenchConn>(
    conn: &mut C,
    w: &mut Waiter,
    hello: &Hello,
    mut stall: Stall,
) -> Result<(RateSummary, Vec<RawInterval>), BenchError> {
    let size = hello.size as usize;
    if size < super::wire::LOAD_MIN_SIZE {
        return Err(bad_data(size, size, TAG_DATA));
    }
    let period = Duration::from_nanos(hello.interval_ns.max(1));
    let mut intervals = Intervals::new(period, None);
    let mut count = 0u64;
    let (mut first, mut last) = (None, 0u64);
    loop {
        stall.check(count);
        let got = conn.try_recv_with(|m| {
            let head = head(m);
            (head, (head == (size, TAG_DATA)).then(|| stamp(m)))
        })?;
        match got {
            Some((_, Some((seq, intended)))) => {
                let now = mono_ns();
                if seq != count {
                    return Err(BenchError::Protocol(format!(
                        "expected message number {count}, got {seq}"
                    )));
                }
                if seq >= hello.warmup {
                    intervals.record(now.saturating_sub(intended), 0, now);
                    first.get_or_insert(now);
                    last = now;
                }
                count += 1;
                w.reset();
            }
            Some(((1, TAG_END), None)) => break,
            Some(((len, tag), None)) => return Err(bad_data(size, len, tag)),
            None => w.idle_recv(conn)?,
        }
    }
    let measured = count.saturating_sub(hello.warmup);
    let rate = RateSummary {
        msgs: count,
        bytes: count * size as u64,
        elapsed_ns: first.map_or(0, |f| last - f),
    };
    let raw = if measured == 0 {
        Vec::new()
    } else {
        intervals.into_raw(last + 1)
    };
    Ok((rate, raw))
}

/// Sends interval histograms (after RESULT): per interval an INTERVAL header, then its
/// V2-serialized histogram in CHUNKs of at most [`CONTROL_MAX`] bytes; none: one header of
/// count 0.
pub(super) fn ship_intervals<C: BenchConn>(
    conn: &mut C,
    w: &mut Waiter,
    raw: &[RawInterval],
) -> Result<(), BenchError> {
    let mut ser = V2Serializer::new();
    if raw.is_empty() {
        let h = IntervalHeader {
            count: 0,
            start_ns: 0,
            length_ns: 0,
            bytes: 0,
        };
        return send_blocking(conn, &h.encode(), w);
    }
    let count = u32::try_from(raw.len()).unwrap_or(u32::MAX);
    let mut buf = Vec::new();
    let mut chunk = [0u8; CONTROL_MAX];
    chunk[0] = TAG_CHUNK;
    for (start_ns, length_ns, hist) in raw {
        buf.clear();
        ser.serialize(hist, &mut buf)
            .map_err(|e| BenchError::Protocol(format!("serializing a histogram: {e:?}")))?;
        let header = IntervalHeader {
            count,
            start_ns: *start_ns,
            length_ns: *length_ns,
            bytes: buf.len() as u64,
        };
        send_blocking(conn, &header.encode(), w)?;
        for part in buf.chunks(CONTROL_MAX - 1) {
            chunk[1..=part.len()].copy_from_slice(part);
            send_blocking(conn, &chunk[..=part.len()], w)?;
        }
    }
    Ok(())
}

/// Receives what [`ship_intervals`] sent.
fn receive_intervals<C: BenchConn>(
    conn: &mut C,
    w: &mut Waiter,
) -> Result<Vec<RawInterval>, BenchError> {
    let mut out = Vec::new();
    let mut de = Deserializer::new();
    loop {
        let h = IntervalHeader::decode(&recv_blocking(conn, w)?)?;
        if h.count == 0 {
            return Ok(out);
        }
        if h.bytes > (64 << 20) {
            return Err(BenchError::Protocol(format!(
                "an interval histogram of {} bytes",
                h.bytes
            )));
        }
        let mut buf = Vec::with_capacity(h.bytes as usize);
        while (buf.len() as u64) < h.bytes {
            let m = recv_blocking(conn, w)?;
            if m.len() < 2 || m[0] != TAG_CHUNK || (buf.len() + m.len() - 1) as u64 > h.bytes {
                return Err(unexpected("a histogram CHUNK", &m));
            }
            buf.extend_from_slice(&m[1..]);
        }
        let hist: Histogram<u64> = de
            .deserialize(&mut buf.as_slice())
            .map_err(|e| BenchError::Protocol(format!("a shipped histogram: {e:?}")))?;
        out.push((h.start_ns, h.length_ns, hist));
        if out.len() == h.count as usize {
            return Ok(out);
        }
    }
}
