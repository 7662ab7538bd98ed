//! The benchmark protocol, spoken over one connection by a client and a server.
//!
//! Message layouts are in [`super::wire`]. Per point:
//!
//! ```text
//! client                         server
//! HELLO {test, size, ...}  --->
//!                          <---  READY {ok, max}
//! DATA x (warmup + iters)  --->  (lat, round-trip load: each echoed back; rate: counted;
//!                                 one-way load: latency recorded on arrival)
//! END                      --->
//!                          <---  RESULT {msgs, bytes, elapsed_ns, server CPU}
//!                          <---  (one-way load) INTERVAL + CHUNKs, per interval histogram
//! ... next point ...
//! BYE                      --->  (server waits for the next client)
//! ```
//!
//! Everything read from the peer is checked (length, tag, sizes) before use. `DATA` payloads
//! are checked by length and tag; a large one (above the receiver's buffer size) also at a few
//! words spread over it, and every byte with `--verify` (rate: by the server; lat: the client
//! checks the echoes).

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::conn::{fill_from, head, BenchConn, Waiter};
use super::intervals::Intervals;
pub use super::session::PointSpec;
use super::session::{
    bad_data, corrupt, expect_ready, expect_result, payload, recv_blocking, send_blocking, Check,
    Stall,
};
pub use super::wire::Settings;
use super::wire::{Hello, ServerResult, TAG_BYE, TAG_DATA, TAG_END, TAG_READY, TAG_SETTINGS};
pub use super::wire::{CONTROL_MAX, LOAD_MIN_SIZE};
use crate::cli::{Idle, LatencyKind, TestKind};
use crate::error::BenchError;
use crate::floor::duration_ns;
use crate::report::hlog::Interval;
use crate::stats::{new_latency_histogram, RateSummary};
use crate::sys::ThreadCpu;

/// A `--client`'s engine settings, sent once before its first point; the server reports the
/// ones that differ from its own in every READY (and the client warns).
///
/// # Errors
/// Connection loss, [`BenchError::Timeout`], [`BenchError::Interrupted`].
pub fn client_settings<C: BenchConn>(
    conn: &mut C,
    settings: Settings,
    idle: Idle,
    timeout: Duration,
) -> Result<(), BenchError> {
    let mut w = Waiter::new(idle, timeout, "the server");
    send_blocking(conn, &settings.encode(), &mut w)
}

/// What a lat point measured on the client.
#[derive(Debug, Clone)]
pub struct LatOutcome {
    /// All measured round trips, nanoseconds.
    pub rtt: Histogram<u64>,
    /// The same, per interval.
    pub intervals: Vec<Interval>,
    /// Measured round trips.
    pub count: u64,
    /// Wall time of the measured part.
    pub elapsed: Duration,
    /// The server thread's CPU use over the point.
    pub server_cpu: ThreadCpu,
}

/// What a rate point measured: the receiver's figures and its CPU use.
pub type RateOutcome = ServerResult;

/// Expected interval between sends at `rate` msgs/s (0: unpaced).
fn expected_interval_ns(rate: u64) -> u64 {
    1_000_000_000u64.checked_div(rate).map_or(0, |i| i.max(1))
}

/// Client side of a lat point: `warmup` + `iters` round trips (or `duration`), recording each
/// RTT into HdrHistograms. With `rate > 0`, sends are paced to the offered load and RTTs are
/// recorded with coordinated-omission correction (expected interval `1e9 / rate` ns).
/// `base_offset` is the time from the report's start to now (the interval log's time axis).
///
/// # Errors
/// Connection loss, protocol errors, [`BenchError::Timeout`], [`BenchError::Interrupted`].
pub fn client_lat<C: BenchConn>(
    conn: &mut C,
    spec: &PointSpec,
    base_offset: Duration,
) -> Result<LatOutcome, BenchError> {
    let origin = Instant::now();
    let mut w = Waiter::new(spec.idle, spec.timeout, "the server");
    send_blocking(conn, &spec.hello(TestKind::Lat).encode(), &mut w)?;
    expect_ready(conn, &mut w)?;

    let template = payload(spec.size);
    let check = Check::new(spec.verify, spec.size, spec.eager_max);
    let mut rtt = new_latency_histogram();
    let mut intervals = Intervals::new(spec.interval, spec.duration);
    let interval_ns = expected_interval_ns(spec.rate);
    let mut measured = 0u64;
    let mut i = 0u64;
    let mut t_send = Instant::now();
    let mut measure_start = t_send;
    let mut deadline = None;
    let mut pacer = Waiter::new(spec.idle, Duration::MAX, "the pacer");
    loop {
        // Closed loop: `t_send` is the last echo's arrival here (the bookkeeping below reads
        // it), and the round trip's own timestamp is taken just before its send.
        if i == spec.warmup {
            measure_start = t_send;
            intervals.begin(duration_ns(t_send - origin));
            deadline = spec.duration.map(|d| t_send + d);
        }
        if i >= spec.warmup {
            let done = match deadline {
                Some(d) => t_send >= d,
                None => measured >= spec.iters,
            };
            if done {
                break;
            }
            if measured % 4096 == 0 && super::stop_requested() {
                return Err(BenchError::Interrupted);
            }
            if interval_ns > 0 {
                let intended = measure_start + Duration::from_nanos(measured * interval_ns);
                while Instant::now() < intended {
                    pacer.idle()?;
                }
                pacer.reset();
                t_send = Instant::now();
            }
        }
        if interval_ns == 0 {
            // A round trip starts at its send, as perftest's and Aeron's `cping` do (a
            // timestamp just before the post / the offer): neither the histogram's and the
            // intervals' bookkeeping after the last echo nor the checks above are part of it.
            t_send = Instant::now();
        }
        while !conn.try_send_with(spec.size, |b| fill_from(b, &template))? {
            w.idle()?;
        }
        conn.flush()?;
        loop {
            match conn.try_recv_with(|m| (m.len(), m.first().copied(), check.first_bad(m)))? {
                Some((len, Some(TAG_DATA), None)) if len == spec.size => break,
                Some((_, Some(TAG_DATA), Some(at))) => return Err(corrupt(spec.size, at)),
                Some((len, tag, _)) => {
                    return Err(BenchError::Protocol(format!(
                        "expected a {}-byte echo, got {len} bytes with tag {:#04x}",
                        spec.size,
                        tag.unwrap_or(0)
                    )))
                }
                None => w.idle_recv(conn)?,
            }
        }
        w.reset();
        let t_now = Instant::now();
        if i >= spec.warmup {
            let v = duration_ns(t_now - t_send);
            if interval_ns > 0 {
                let _ = rtt.record_correct(v.min(crate::stats::HIGHEST_NS), interval_ns);
            } else {
                rtt.saturating_record(v);
            }
            intervals.record(v, interval_ns, duration_ns(t_now - origin));
            measured += 1;
        }
        i += 1;
        t_send = t_now;
    }
    let end = t_send;
    send_blocking(conn, &[TAG_END], &mut w)?;
    let res = expect_result(conn, &mut w)?;
    if res.rate.msgs != spec.warmup + measured {
        return Err(BenchError::Protocol(format!(
            "server echoed {} messages, client sent {}",
            res.rate.msgs,
            spec.warmup + measured
        )));
    }
    Ok(LatOutcome {
        rtt,
        intervals: intervals.finish(0, base_offset, duration_ns(end - origin)),
        count: measured,
        elapsed: end - measure_start,
        server_cpu: res.cpu,
    })
}

/// Client side of a rate point: streams `warmup` + `iters` messages (or for `duration`) as fast
/// as credits allow (or paced to `rate`), then asks the server what it counted. The figures are
/// the receiver's.
///
/// # Errors
/// Connection loss, protocol errors, [`BenchError::Timeout`], [`BenchError::Interrupted`].
pub fn client_rate<C: BenchConn>(
    conn: &mut C,
    spec: &PointSpec,
) -> Result<RateOutcome, BenchError> {
    let mut w = Waiter::new(spec.idle, spec.timeout, "send credits from the server");
    send_blocking(conn, &spec.hello(TestKind::Rate).encode(), &mut w)?;
    expect_ready(conn, &mut w)?;

    let template = payload(spec.size);
    let interval_ns = expected_interval_ns(spec.rate);
    let mut pacer = Waiter::new(spec.idle, Duration::MAX, "the pacer");
    let mut sent = 0u64;
    let mut start = Instant::now();
    let mut deadline = None;
    loop {
        if sent == spec.warmup {
            start = Instant::now();
            deadline = spec.duration.map(|d| start + d);
        }
        if sent >= spec.warmup {
            let n = sent - spec.warmup;
            if n % 1024 == 0 {
                if super::stop_requested() {
                    return Err(BenchError::Interrupted);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
            }
            if deadline.is_none() && n >= spec.iters {
                break;
            }
            if interval_ns > 0 {
                let intended = start + Duration::from_nanos(n * interval_ns);
                while Instant::now() < intended {
                    pacer.idle()?;
                }
                pacer.reset();
            }
        }
        let fill = |b: &mut [u8]| fill_from(b, &template);
        let ok = if spec.app_batch > 0 {
            conn.try_send_batched_with(spec.size, fill)?
        } else {
            conn.try_send_with(spec.size, fill)?
        };
        if ok {
            sent += 1;
            w.reset();
            // `--app-batch N`: one flush per N messages.
            if spec.app_batch > 0 && sent % spec.app_batch as u64 == 0 {
                conn.flush()?;
            }
        } else {
            if spec.app_batch > 0 {
                // A partial batch waits on credits: let it go out (the credits come back for
                // what the receiver got).
                conn.flush()?;
            }
            w.idle()?;
        }
    }
    conn.flush()?;
    send_blocking(conn, &[TAG_END], &mut w)?;
    let res = expect_result(conn, &mut w)?;
    if res.rate.msgs == 0 || res.rate.elapsed_ns == 0 {
        return Err(BenchError::Protocol(
            "the server measured no messages (raise --iters or --duration)".into(),
        ));
    }
    Ok(res)
}

/// Tells the server this client is done.
///
/// # Errors
/// Connection loss or [`BenchError::Timeout`].
pub fn client_bye<C: BenchConn>(
    conn: &mut C,
    idle: Idle,
    timeout: Duration,
) -> Result<(), BenchError> {
    let mut w = Waiter::new(idle, timeout, "a send credit for BYE");
    send_blocking(conn, &[TAG_BYE], &mut w)
}

/// Serves one client until it says BYE or disconnects: echoes lat points, counts rate points.
/// `max_size` is the largest payload this side accepts (the connection's limit); a payload
/// above `eager_max` (the buffer size) is a large message, checked at a few words;
/// `idle_timeout` bounds the wait for the client's next message.
///
/// # Errors
/// Protocol errors, [`BenchError::Timeout`], [`BenchError::Interrupted`]. A disconnect between
/// points is a normal end (`Ok`).
pub fn serve<C: BenchConn>(
    conn: &mut C,
    idle: Idle,
    max_size: usize,
    eager_max: usize,
    idle_timeout: Duration,
) -> Result<(), BenchError> {
    serve_with(conn, idle, max_size, eager_max, idle_timeout, None)
}

/// [`serve`], comparing a client's SETTINGS with this server's `mine`: the ones that differ
/// are named on stderr and in every READY to that client (which warns).
///
/// # Errors
/// As [`serve`].
pub fn serve_with<C: BenchConn>(
    conn: &mut C,
    idle: Idle,
    max_size: usize,
    eager_max: usize,
    idle_timeout: Duration,
    mine: Option<Settings>,
) -> Result<(), BenchError> {
    let mut reported = String::new();
    loop {
        let mut w = Waiter::new(idle, idle_timeout, "the client's next request");
        let m = match recv_blocking(conn, &mut w) {
            Ok(m) => m,
            Err(BenchError::Disconnected) => return Ok(()),
            Err(e) => return Err(e),
        };
        if m.first() == Some(&TAG_BYE) {
            return Ok(());
        }
        if m.first() == Some(&TAG_SETTINGS) {
            let theirs = Settings::decode(&m)?;
            reported = mine.map(|m| m.differences(&theirs)).unwrap_or_default();
            if !reported.is_empty() {
                eprintln!(
                    "bench server: warning: the client's engine settings differ: server {reported}"
                );
            }
            continue;
        }
        let hello = Hello::decode(&m)?;
        if hello.size == 0 || hello.size > max_size as u64 {
            let mut reply = vec![TAG_READY, 0];
            let why = format!("size {} outside 1..={max_size} bytes", hello.size);
            reply.extend_from_slice(&why.as_bytes()[..why.len().min(CONTROL_MAX - 2)]);
            send_blocking(conn, &reply, &mut w)?;
            continue;
        }
        let mut ready = vec![TAG_READY, 1];
        let mut cut = reported.len().min(CONTROL_MAX - 2);
        while !reported.is_char_boundary(cut) {
            cut -= 1;
        }
        ready.extend_from_slice(&reported.as_bytes()[..cut]);
        send_blocking(conn, &ready, &mut w)?;
        let size = hello.size as usize;
        let stall = Stall::new(&hello);
        let check = Check::new(hello.verify, size, eager_max);
        let cpu0 = ThreadCpu::now();
        let (rate, shipped) = match (hello.test, hello.latency) {
            (TestKind::Lat, _) | (TestKind::Load, LatencyKind::RoundTrip) => {
                (serve_lat(conn, &mut w, size, stall)?, None)
            }
            (TestKind::Rate, _) if hello.app_batch > 0 => (
                serve_rate_batched(
                    conn,
                    &mut w,
                    size,
                    hello.warmup,
                    hello.app_batch,
                    stall,
                    check,
                )?,
                None,
            ),
            (TestKind::Rate, _) => (
                serve_rate(conn, &mut w, size, hello.warmup, stall, check)?,
                None,
            ),
            (TestKind::Load, LatencyKind::OneWay) => {
                let (rate, raw) = super::load::serve_one_way(conn, &mut w, &hello, stall)?;
                (rate, Some(raw))
            }
        };
        let cpu = ThreadCpu::now().since(&cpu0);
        send_blocking(conn, &ServerResult { rate, cpu }.encode(), &mut w)?;
        if let Some(raw) = shipped {
            super::load::ship_intervals(conn, &mut w, &raw)?;
        }
    }
}

fn serve_lat<C: BenchConn>(
    conn: &mut C,
    w: &mut Waiter,
    size: usize,
    mut stall: Stall,
) -> Result<RateSummary, BenchError> {
    let mut echoed = 0u64;
    let start = Instant::now();
    loop {
        stall.check(echoed);
        match conn.try_echo(size, TAG_DATA, w)? {
            Some((len, TAG_DATA)) if len == size => {
                echoed += 1;
                w.reset();
            }
            Some((1, TAG_END)) => break,
            Some((len, tag)) => return Err(bad_data(size, len, tag)),
            None => w.idle_recv(conn)?,
        }
    }
    Ok(RateSummary {
        msgs: echoed,
        bytes: echoed * size as u64,
        elapsed_ns: duration_ns(start.elapsed()),
    })
}

fn serve_rate<C: BenchConn>(
    conn: &mut C,
    w: &mut Waiter,
    size: usize,
    warmup: u64,
    mut stall: Stall,
    check: Check,
) -> Result<RateSummary, BenchError> {
    // The clock starts when message number `reference` arrives (the last warm-up message, or
    // the first message without warm-up) and stops when END arrives; only messages after the
    // reference count. Two clock reads per point keep the receive loop free of them.
    let reference = warmup.max(1) - 1;
    let mut count = 0u64;
    let mut t0 = None;
    let t_end;
    loop {
        let head = |m: &[u8]| {
            let bad = check.first_bad(m);
            (m.len(), m.first().copied().unwrap_or(0xFF), bad)
        };
        match conn.try_recv_with(head)? {
            Some((_, TAG_DATA, Some(at))) => return Err(corrupt(size, at)),
            Some((len, TAG_DATA, None)) if len == size => {
                stall.check(count);
                if count == reference {
                    t0 = Some(Instant::now());
                }
                count += 1;
                w.reset();
            }
            Some((1, TAG_END, _)) => {
                t_end = Instant::now();
                break;
            }
            Some((len, tag, _)) => return Err(bad_data(size, len, tag)),
            None => w.idle_recv(conn)?,
        }
    }
    let msgs = count.saturating_sub(reference + 1);
    Ok(RateSummary {
        msgs,
        bytes: msgs * size as u64,
        elapsed_ns: t0.map_or(0, |t| duration_ns(t_end - t)),
    })
}

/// [`serve_rate`] with the batch receive: up to `batch` messages per
/// [`BenchConn::poll_batch`] call (`--app-batch`), counted the same way.
fn serve_rate_batched<C: BenchConn>(
    conn: &mut C,
    w: &mut Waiter,
    size: usize,
    warmup: u64,
    batch: u32,
    mut stall: Stall,
    check: Check,
) -> Result<RateSummary, BenchError> {
    let reference = warmup.max(1) - 1;
    let mut count = 0u64;
    let mut t0 = None;
    let mut t_end = None;
    let mut bad = None;
    let mut corrupted = None;
    let limit = batch as usize;
    while t_end.is_none() {
        let n = conn.poll_batch(limit, |m| {
            let head = head(m);
            if t_end.is_some() || bad.is_some() {
                // Nothing may follow END; keep the first offence.
                bad.get_or_insert(head);
            } else if head == (size, TAG_DATA) {
                if let Some(at) = check.first_bad(m) {
                    corrupted.get_or_insert(at);
                }
                stall.check(count);
                if count == reference {
                    t0 = Some(Instant::now());
                }
                count += 1;
            } else if head == (1, TAG_END) {
                t_end = Some(Instant::now());
            } else {
                bad = Some(head);
            }
        })?;
        if let Some((len, tag)) = bad {
            return Err(bad_data(size, len, tag));
        }
        if let Some(at) = corrupted {
            return Err(corrupt(size, at));
        }
        if n == 0 {
            w.idle()?;
        } else {
            w.reset();
        }
    }
    let msgs = count.saturating_sub(reference + 1);
    Ok(RateSummary {
        msgs,
        bytes: msgs * size as u64,
        elapsed_ns: match (t0, t_end) {
            (Some(a), Some(b)) => duration_ns(b - a),
            _ => 0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-process connection: two rtrb rings of owned messages (allocation is fine here; the
    /// point is to check the protocol, not to measure it).
    struct FakeConn {
        tx: rtrb::Producer<Vec<u8>>,
        rx: rtrb::Consumer<Vec<u8>>,
        max: usize,
        /// Test aid: flips this byte of every `DATA` message long enough to have it.
        corrupt_at: Option<usize>,
    }

    fn pair(depth: usize, max: usize) -> (FakeConn, FakeConn) {
        let (atx, brx) = rtrb::RingBuffer::new(depth);
        let (btx, arx) = rtrb::RingBuffer::new(depth);
        (
            FakeConn {
                tx: atx,
                rx: arx,
                max,
                corrupt_at: None,
            },
            FakeConn {
                tx: btx,
                rx: brx,
                max,
                corrupt_at: None,
            },
        )
    }

    impl BenchConn for FakeConn {
        fn try_send_with(
            &mut self,
            len: usize,
            fill: impl FnOnce(&mut [u8]),
        ) -> Result<bool, BenchError> {
            assert!(len <= self.max, "message of {len} bytes over {}", self.max);
            if self.tx.is_abandoned() {
                return Err(BenchError::Disconnected);
            }
            if self.tx.is_full() {
                return Ok(false);
            }
            let mut m = vec![0u8; len];
            fill(&mut m);
            if let Some(at) = self.corrupt_at.filter(|&at| at < len && m[0] == TAG_DATA) {
                m[at] ^= 0x5A;
            }
            self.tx
                .push(m)
                .map(|_| true)
                .map_err(|_| BenchError::Disconnected)
        }

        fn try_recv_with<R>(
            &mut self,
            f: impl FnOnce(&[u8]) -> R,
        ) -> Result<Option<R>, BenchError> {
            match self.rx.pop() {
                Ok(m) => Ok(Some(f(&m))),
                Err(_) if self.rx.is_abandoned() => Err(BenchError::Disconnected),
                Err(_) => Ok(None),
            }
        }
    }

    fn spec(size: usize) -> PointSpec {
        PointSpec {
            size,
            iters: 500,
            duration: None,
            warmup: 50,
            rate: 0,
            interval: Duration::from_millis(1),
            idle: Idle::Backoff,
            timeout: Duration::from_secs(20),
            burst: 1,
            latency: LatencyKind::OneWay,
            stall: Duration::ZERO,
            stall_after: 0,
            app_batch: 0,
            verify: false,
            eager_max: 256,
        }
    }

    #[test]
    fn lat_rate_and_bye_over_a_fake_connection() {
        let (mut client, mut server) = pair(16, 256);
        let srv = std::thread::spawn(move || {
            serve(
                &mut server,
                Idle::Backoff,
                256,
                256,
                Duration::from_secs(20),
            )
        });
        let lat = client_lat(&mut client, &spec(64), Duration::ZERO).unwrap();
        assert_eq!(lat.count, 500);
        assert_eq!(lat.rtt.len(), 500);
        let in_intervals: u64 = lat.intervals.iter().map(|i| i.hist.len()).sum();
        assert_eq!(in_intervals, 500);
        let rate = client_rate(&mut client, &spec(200)).unwrap();
        // The reference message is the last warm-up one: everything after it counts.
        assert_eq!(rate.rate.msgs, 500);
        assert_eq!(rate.rate.bytes, 500 * 200);
        assert!(rate.rate.elapsed_ns > 0);
        // The same with the application batch (flush per 7 sends, poll_batch of 7): the same
        // count, whatever the batches' edges.
        let batched = PointSpec {
            app_batch: 7,
            ..spec(200)
        };
        let rate = client_rate(&mut client, &batched).unwrap();
        assert_eq!(rate.rate.msgs, 500);
        assert_eq!(rate.rate.bytes, 500 * 200);
        // A size over the server's limit is refused with a reason, and the session goes on.
        let err = client_lat(&mut client, &spec(300), Duration::ZERO);
        assert!(
            matches!(err, Err(BenchError::Protocol(ref m)) if m.contains("outside")),
            "{err:?}"
        );
        client_bye(&mut client, Idle::Backoff, Duration::from_secs(5)).unwrap();
        srv.join().unwrap().unwrap();
    }

    #[test]
    fn payloads_are_checked_sampled_above_the_eager_limit_and_fully_with_verify() {
        use super::super::session::Check;
        let p = payload(100_000);
        for c in [Check::Head, Check::Sampled, Check::Full] {
            assert_eq!(c.first_bad(&p), None, "{c:?}");
            assert_eq!(c.first_bad(&p[..1]), None, "{c:?}");
        }
        let mut bad = p.clone();
        bad[99_999] ^= 1;
        assert_eq!(Check::Sampled.first_bad(&bad), Some(99_999));
        assert_eq!(Check::Full.first_bad(&bad), Some(99_999));
        assert_eq!(Check::Head.first_bad(&bad), None);
        let mut bad = p.clone();
        bad[300] ^= 1;
        assert_eq!(Check::Full.first_bad(&bad), Some(300));
        assert_eq!(Check::new(false, 4097, 4096), Check::Sampled);
        assert_eq!(Check::new(false, 4096, 4096), Check::Head);
        assert_eq!(Check::new(true, 8, 4096), Check::Full);

        // Over a connection: a large rate point (above the server's eager limit of 256) is
        // sampled, and a flipped last byte is caught; with --verify any flipped byte is.
        let (mut client, mut server) = pair(16, 4096);
        let srv = std::thread::spawn(move || {
            serve(
                &mut server,
                Idle::Backoff,
                4096,
                256,
                Duration::from_secs(20),
            )
        });
        let r = client_rate(&mut client, &spec(4096)).unwrap();
        assert_eq!(r.rate.bytes, 500 * 4096);
        let verified = PointSpec {
            verify: true,
            ..spec(200)
        };
        let r = client_rate(&mut client, &verified).unwrap();
        assert_eq!(r.rate.msgs, 500);
        client.corrupt_at = Some(4095);
        let err = client_rate(&mut client, &spec(4096));
        assert!(
            matches!(
                err,
                Err(BenchError::Timeout { .. }) | Err(BenchError::Disconnected)
            ),
            "{err:?}"
        );
        let err = srv.join().unwrap();
        assert!(
            matches!(err, Err(BenchError::Protocol(ref m)) if m.contains("differs from what was sent at byte 4095")),
            "{err:?}"
        );

        // The lat client checks the echoes: a byte flipped on the way is caught with --verify.
        let (mut client, mut server) = pair(16, 4096);
        server.corrupt_at = Some(7);
        let srv = std::thread::spawn(move || {
            serve(
                &mut server,
                Idle::Backoff,
                4096,
                4096,
                Duration::from_secs(5),
            )
        });
        let err = client_lat(&mut client, &verified, Duration::ZERO);
        assert!(
            matches!(err, Err(BenchError::Protocol(ref m)) if m.contains("at byte 7")),
            "{err:?}"
        );
        drop(client);
        let _ = srv.join().unwrap();
    }

    #[test]
    fn duration_bounded_and_paced_lat() {
        let (mut client, mut server) = pair(4, 64);
        let srv = std::thread::spawn(move || {
            serve(&mut server, Idle::Backoff, 64, 64, Duration::from_secs(20))
        });
        let mut s = spec(8);
        s.duration = Some(Duration::from_millis(200));
        s.rate = 2_000;
        s.interval = Duration::from_millis(10);
        let lat = client_lat(&mut client, &s, Duration::ZERO).unwrap();
        // ~400 paced sends in 200 ms. A loaded 2-core machine can deschedule the client for
        // tens of ms, so the floor is low; the pacing bound is relative to the time it ran.
        let paced_max = (s.rate as f64 * lat.elapsed.as_secs_f64()) as u64 + 10;
        assert!(lat.count >= 5, "{}", lat.count);
        assert!(lat.count <= paced_max, "{} > {paced_max}", lat.count);
        assert!(lat.elapsed >= Duration::from_millis(200));
        assert!(lat.intervals.len() >= 2, "{}", lat.intervals.len());
        drop(client);
        // A client that vanishes between points ends the session cleanly.
        srv.join().unwrap().unwrap();
    }

    #[test]
    fn server_stall_times_out() {
        let (mut client, _server) = pair(4, 64);
        let mut s = spec(8);
        s.timeout = Duration::from_millis(200);
        let t = Instant::now();
        let err = client_lat(&mut client, &s, Duration::ZERO);
        assert!(matches!(err, Err(BenchError::Timeout { .. })), "{err:?}");
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}
