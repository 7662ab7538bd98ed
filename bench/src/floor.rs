//! The machine's floor: what two pinned threads achieve with nothing but shared cache lines.
//!
//! * Ping-pong: one line holds a counter word. The client writes an odd value, the
//!   server waits for it and writes the next even value, the client waits for that: one round
//!   trip of the line between the two cores. Each round trip is timed with [`Instant`] (the
//!   same clock the engine benchmarks use) and recorded into an HdrHistogram.
//! * Two-line ping-pong: the same with one line per direction (the client writes only the
//!   line the server waits on, the server only the one the client waits on): the least any
//!   design with one ring per direction moves per round trip (Aeron's IPC, spinwire's shm).
//!   On the 2-core Intel guest it is 1.1-1.4x the one-line floor (a bare C ping-pong over two
//!   rings of 16-byte records measured the same), so it is the fairer floor for a
//!   one-ring-per-direction transport. On the AMD EPYC guest the rings (below) measured under
//!   it, near the one-line floor.
//! * Ring ping-pongs ([`RingFloors`]): the two-line ping-pong as transports run it, over
//!   a ring of 16-byte records per direction (an 8-byte header, odd for pings and even for
//!   pongs as above, stored last with `Release`, and an 8-byte payload; 64 KiB a direction;
//!   four records to a line, so three exchanges in four stay
//!   on the lines of the one before, and the fourth moves to fresh ones), and the same records
//!   *paired*: each line holds two records of each direction, exchange `i`'s ping and pong in
//!   the same line. The first is the protocol floor of a one-ring-per-direction transport (Aeron
//!   IPC, spinwire's shm); the second is what a layout sharing lines between the directions
//!   would have under it; neither transport is built that way.
//! * Relay ping-pong: the topology of a dedicated poller ([`RingFloors::relay`]). The client
//!   thread is both ends, as `bench lat --one-thread` runs them, and the server thread forwards
//!   between them, as the poller does: ping `seq` goes client -> relay -> the client's server
//!   end, which echoes it -> relay -> the client end, over four rings of the records above (each
//!   direction of each hop its own). A round trip moves four lines between the cores where the
//!   ping-pongs above move two, so a transport through a poller starts from this floor, about
//!   twice theirs, before any software. All five are one ping-pong over a layout of words.
//! * Streaming: the client pushes `u64`s through an `rtrb` SPSC ring as fast as it can and the
//!   server pops them; the rate is measured at the receiver.
//! * Memcpy ([`memcpy`]): one pinned thread copies a `size`-byte buffer into another of the same
//!   size, again and again (warm): the single-core copy bandwidth, the bandwidth floor of shm
//!   for messages of that size (a message is written once by its sender, as one copy would).
//!   The fastest of [`MEMCPY_ROUNDS`] rounds counts: a floor is the best the machine does.
//!
//! Every spin-wait is bounded by [`SPIN_LIMIT`], so a descheduled peer cannot hang the run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::error::BenchError;
use crate::machine::pin_current;
use crate::stats::{new_latency_histogram, RateSummary};

/// Longest any floor thread waits for its peer before giving up.
pub const SPIN_LIMIT: Duration = Duration::from_secs(10);

/// Value written to the ping-pong line to tell the server to stop.
const STOP: u64 = u64::MAX;

/// What `floor` measured.
#[derive(Debug, Clone)]
pub struct FloorResult {
    /// Cache-line round-trip times in nanoseconds.
    pub rtt: Histogram<u64>,
    /// Round-trip times with one line per direction ([module docs](self)); `None` for the
    /// floors that are not cache lines.
    pub rtt_two_lines: Option<Histogram<u64>>,
    /// The ring ping-pongs ([module docs](self)); `None` for the floors that are not cache
    /// lines.
    pub rings: Option<RingFloors>,
    /// SPSC streaming rate of 8-byte messages.
    pub rate: RateSummary,
    /// The two cores used: client, server.
    pub cores: [usize; 2],
    /// What was measured: `"cache-line"` (this module) or `"tcp-raw"` ([`crate::floor_tcp`]).
    pub kind: &'static str,
    /// Bytes each way per round trip (the cache line's 8-byte word; tcp: the ping size).
    pub ping_bytes: u64,
}

/// Round trips of the ring ping-pongs ([module docs](self)), in nanoseconds.
#[derive(Debug, Clone)]
pub struct RingFloors {
    /// One ring of 16-byte records per direction.
    pub separate: Histogram<u64>,
    /// Both directions' records in shared lines, two of each to a line.
    pub paired: Histogram<u64>,
    /// Through a forwarding thread on the second core, four rings: a dedicated poller's
    /// topology with no software in it.
    pub relay: Histogram<u64>,
}

/// Measures the floor between `cores[0]` (client) and `cores[1]` (server): `iters` round trips
/// after `warmup` unmeasured ones, then `16 * iters` streamed messages.
///
/// # Errors
/// [`BenchError::InvalidArg`] for zero `iters`; [`BenchError::Pin`] if pinning fails;
/// [`BenchError::Timeout`] if a peer stalls for [`SPIN_LIMIT`]; [`BenchError::Interrupted`]
/// when `stop` is raised.
pub fn measure(
    cores: [usize; 2],
    iters: u64,
    warmup: u64,
    stop: &AtomicBool,
) -> Result<FloorResult, BenchError> {
    if iters == 0 {
        return Err(BenchError::invalid("--iters", "must be at least 1"));
    }
    let rtt = ping_pong(cores, iters, warmup, Layout::OneLine, stop)?;
    let rtt_two_lines = ping_pong(cores, iters, warmup, Layout::TwoLines, stop)?;
    let rings = RingFloors {
        separate: ping_pong(cores, iters, warmup, Layout::Separate, stop)?,
        paired: ping_pong(cores, iters, warmup, Layout::Paired, stop)?,
        relay: ping_pong(cores, iters, warmup, Layout::Relay, stop)?,
    };
    let rate = stream(cores, iters.saturating_mul(16), stop)?;
    Ok(FloorResult {
        rtt,
        rtt_two_lines: Some(rtt_two_lines),
        rings: Some(rings),
        rate,
        cores,
        kind: "cache-line",
        ping_bytes: 8,
    })
}

/// Records per direction in a ring ping-pong's ring: 64 KiB a direction, so the lines come
/// back around as a transport's ring's do.
const RING_RECORDS: usize = 4096;

/// Where a ping-pong's words lie ([module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// One counter word, both directions.
    OneLine,
    /// One counter word per direction, each on a line of its own (256 bytes apart).
    TwoLines,
    /// A ring of 16-byte records per direction, four records to a line.
    Separate,
    /// The records of both directions in shared lines, two of each to a line.
    Paired,
    /// Four rings as [`Separate`](Self::Separate)'s: client -> relay, relay -> the client's
    /// server end, that end -> relay, relay -> the client end.
    Relay,
}

impl Layout {
    /// The rings (or line words) a round trip goes through, one per hop between the cores.
    fn hops(self) -> usize {
        match self {
            Layout::Relay => 4,
            _ => 2,
        }
    }
}

/// One 64-byte line of eight words.
#[repr(align(64))]
struct Line([AtomicU64; 8]);

/// A ping-pong's memory: lines of words, addressed per [`Layout`].
struct Words {
    lines: Vec<Line>,
    layout: Layout,
}

impl Words {
    fn new(layout: Layout) -> Words {
        let lines = match layout {
            // Lines 0 and 4, 256 bytes apart, as two `Arc<CachePadded<AtomicU64>>` allocations
            // put the words before.
            Layout::OneLine | Layout::TwoLines => 5,
            Layout::Separate | Layout::Paired => RING_RECORDS / 2,
            Layout::Relay => RING_RECORDS,
        };
        let lines = (0..lines)
            .map(|_| Line(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect();
        Words { lines, layout }
    }

    /// The header word of message `seq` of direction `dir` (0: pings, 1: pongs; the relay's
    /// hops 0 to 3), and its payload word (the rings' records only; the line floors move a
    /// counter and nothing else).
    fn record(&self, dir: usize, seq: u64) -> (&AtomicU64, Option<&AtomicU64>) {
        // `RING_RECORDS` is a power of two: the cast keeps the low bits, the index in the ring.
        let i = (seq as usize) & (RING_RECORDS - 1);
        let (line, word) = match self.layout {
            Layout::OneLine => return (&self.lines[0].0[0], None),
            Layout::TwoLines => return (&self.lines[4 * dir].0[0], None),
            // Four records to a line; direction 1's ring is the second half (the relay's four
            // rings one after the other).
            Layout::Separate | Layout::Relay => (dir * RING_RECORDS / 4 + i / 4, (i % 4) * 2),
            // Line `i / 2` holds records `i & !1` and `i | 1` of both directions.
            Layout::Paired => (i / 2, dir * 4 + (i % 2) * 2),
        };
        let words = &self.lines[line].0;
        (&words[word], Some(&words[word + 1]))
    }
}

/// The ping-pong over `layout` ([module docs](self)): the client writes ping `seq` (its
/// payload, then its header, `2 * seq - 1`, with `Release`) and waits for pong `seq` (header
/// `2 * seq`); the server waits for each ping and answers with the payload plus one. Odd pings
/// and even pongs keep the directions apart where they share a word, and a header from a ring's
/// earlier lap from being taken for this one's. Over the relay's four rings the client does
/// this twice per round trip (hops 0 and 1, then, as the server end echoing what came, hops 2
/// and 3), and the server, the relay, answers each.
fn ping_pong(
    cores: [usize; 2],
    iters: u64,
    warmup: u64,
    layout: Layout,
    stop: &AtomicBool,
) -> Result<Histogram<u64>, BenchError> {
    // The number of hops a constant: with it a run-time count (and with these arguments in a
    // struct), the two-hop floors' means measured 5-30 ns higher (3 interleaved runs each).
    match layout.hops() {
        4 => hops_ping_pong::<4>(cores, iters, warmup, layout, stop),
        _ => hops_ping_pong::<2>(cores, iters, warmup, layout, stop),
    }
}

/// [`ping_pong`] with `HOPS` rings (or words) per round trip, an even number.
fn hops_ping_pong<const HOPS: usize>(
    cores: [usize; 2],
    iters: u64,
    warmup: u64,
    layout: Layout,
    stop: &AtomicBool,
) -> Result<Histogram<u64>, BenchError> {
    let hops = HOPS;
    let words = Arc::new(Words::new(layout));
    let server_words = Arc::clone(&words);
    let server = std::thread::Builder::new()
        .name("floor-server".into())
        .spawn(move || -> Result<(), BenchError> {
            pin_current(cores[1])?;
            for seq in 1u64.. {
                for hop in (0..hops).step_by(2) {
                    let (head, body) = server_words.record(hop, seq);
                    if wait_until(head, |v| v == 2 * seq - 1 || v == STOP)? == STOP {
                        return Ok(());
                    }
                    let v = body.map(|b| b.load(Ordering::Relaxed));
                    let (head, body) = server_words.record(hop + 1, seq);
                    if let (Some(b), Some(v)) = (body, v) {
                        b.store(v.wrapping_add(1), Ordering::Relaxed);
                    }
                    head.store(2 * seq, Ordering::Release);
                }
            }
            Ok(())
        })
        .map_err(|e| BenchError::io("thread spawn", e))?;

    let client = || -> Result<Histogram<u64>, BenchError> {
        pin_current(cores[0])?;
        let mut hist = new_latency_histogram();
        for seq in 1..=warmup + iters {
            if seq % 4096 == 0 && stop.load(Ordering::Relaxed) {
                return Err(BenchError::Interrupted);
            }
            // Timed from just before the stores, as `bench lat` times from just before its
            // send: the histogram's bookkeeping is in neither.
            let t_send = Instant::now();
            // The payload out: the ping's, then (the relay) the echo of what arrived.
            let mut v = seq;
            for hop in (0..hops).step_by(2) {
                if hop > 0 {
                    if let Some(b) = words.record(hop - 1, seq).1 {
                        v = b.load(Ordering::Relaxed);
                    }
                }
                let (head, body) = words.record(hop, seq);
                if let Some(b) = body {
                    b.store(v, Ordering::Relaxed);
                }
                head.store(2 * seq - 1, Ordering::Release);
                wait_until(words.record(hop + 1, seq).0, |h| h == 2 * seq)?;
            }
            let t_now = Instant::now();
            // Each answer adds one.
            let back = words.record(hops - 1, seq).1;
            if back.is_some_and(|b| b.load(Ordering::Relaxed) != seq.wrapping_add(hops as u64 / 2))
            {
                return Err(BenchError::Protocol(format!(
                    "floor pong {seq} carried the wrong payload"
                )));
            }
            if seq > warmup {
                hist.saturating_record(duration_ns(t_now - t_send));
            }
        }
        Ok(hist)
    };
    let result = client();
    // Stop the server wherever it waits: at the next ping of any hop, or (after an error) at
    // any (the line layouts' pings all share one word).
    for hop in (0..hops).step_by(2) {
        for seq in 0..RING_RECORDS as u64 {
            words.record(hop, seq).0.store(STOP, Ordering::Release);
        }
    }
    let joined = server
        .join()
        .map_err(|_| BenchError::ThreadPanicked("floor server"))?;
    let hist = result?;
    joined?;
    Ok(hist)
}

fn stream(cores: [usize; 2], msgs: u64, stop: &AtomicBool) -> Result<RateSummary, BenchError> {
    let (mut tx, mut rx) = rtrb::RingBuffer::<u64>::new(4096);
    let abort = Arc::new(AtomicBool::new(false));
    let rx_abort = Arc::clone(&abort);
    let receiver = std::thread::Builder::new()
        .name("floor-rx".into())
        .spawn(move || -> Result<RateSummary, BenchError> {
            pin_current(cores[1])?;
            let mut got = 0u64;
            let mut sum = 0u64;
            let mut start = None;
            let mut spins = 0u32;
            let mut last_progress = Instant::now();
            while got < msgs {
                match rx.pop() {
                    Ok(v) => {
                        if start.is_none() {
                            start = Some(Instant::now());
                        }
                        sum = sum.wrapping_add(v);
                        got += 1;
                    }
                    Err(_) => {
                        spins = spins.wrapping_add(1);
                        if spins % 4096 == 0 {
                            if rx_abort.load(Ordering::Relaxed) {
                                return Err(BenchError::Interrupted);
                            }
                            let now = Instant::now();
                            if now - last_progress > SPIN_LIMIT {
                                return Err(BenchError::Timeout {
                                    what: "the floor streaming sender",
                                    secs: SPIN_LIMIT.as_secs_f64(),
                                });
                            }
                            if got > 0 {
                                last_progress = now;
                            }
                        }
                        std::hint::spin_loop();
                    }
                }
            }
            let elapsed = start.map_or(0, |s| duration_ns(s.elapsed()));
            std::hint::black_box(sum);
            Ok(RateSummary {
                msgs,
                bytes: msgs * 8,
                elapsed_ns: elapsed,
            })
        })
        .map_err(|e| BenchError::io("thread spawn", e))?;

    let mut send = || -> Result<(), BenchError> {
        pin_current(cores[0])?;
        let mut i = 0u64;
        let mut spins = 0u32;
        let mut last_progress = Instant::now();
        while i < msgs {
            match tx.push(i) {
                Ok(()) => i += 1,
                Err(_) => {
                    spins = spins.wrapping_add(1);
                    if spins % 4096 == 0 {
                        if stop.load(Ordering::Relaxed) {
                            return Err(BenchError::Interrupted);
                        }
                        let now = Instant::now();
                        if now - last_progress > SPIN_LIMIT {
                            return Err(BenchError::Timeout {
                                what: "the floor streaming receiver",
                                secs: SPIN_LIMIT.as_secs_f64(),
                            });
                        }
                        last_progress = now;
                    }
                    std::hint::spin_loop();
                }
            }
        }
        Ok(())
    };
    let sent = send();
    if sent.is_err() {
        abort.store(true, Ordering::Relaxed);
    }
    let received = receiver
        .join()
        .map_err(|_| BenchError::ThreadPanicked("floor receiver"))?;
    sent?;
    received
}

/// Spins until `pred(line)` holds, returning the value seen; gives up after [`SPIN_LIMIT`].
fn wait_until(line: &AtomicU64, pred: impl Fn(u64) -> bool) -> Result<u64, BenchError> {
    let mut spins = 0u32;
    let mut since: Option<Instant> = None;
    loop {
        let v = line.load(Ordering::Acquire);
        if pred(v) {
            return Ok(v);
        }
        spins = spins.wrapping_add(1);
        if spins % 65_536 == 0 {
            let start = *since.get_or_insert_with(Instant::now);
            if start.elapsed() > SPIN_LIMIT {
                return Err(BenchError::Timeout {
                    what: "the floor ping-pong peer",
                    secs: SPIN_LIMIT.as_secs_f64(),
                });
            }
        }
        std::hint::spin_loop();
    }
}

/// Whole nanoseconds of `d`, saturating.
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Bytes one [`memcpy`] measurement copies (its copy count is this over the size, within
/// [`MEMCPY_MIN_COPIES`] ..= [`MEMCPY_MAX_COPIES`]): about a tenth of a second at 10 GB/s.
pub const MEMCPY_BYTES: u64 = 1 << 30;
/// Fewest measured copies (large sizes).
pub const MEMCPY_MIN_COPIES: u64 = 16;
/// Most measured copies (tiny sizes, where the count, not the bytes, bounds the time).
pub const MEMCPY_MAX_COPIES: u64 = 1 << 24;

/// Alignment of [`AlignedBuf`]: a page.
pub const PAGE: usize = 4096;

/// A zeroed byte buffer that starts on a [`PAGE`] boundary: the memcpy floor's source and
/// destination, and the bench's payload templates. Placement matters to `memcpy`: on an AMD
/// EPYC (Zen, `rep movsb`) of the development machine, copies of 4 KiB and 64 KiB between two
/// heap buffers whose distance was 16 bytes modulo 4096 ran at 2 GB/s, between page-aligned
/// ones at 35-45 GB/s (a 1 GiB loop, fastest of 8 rounds); page alignment makes the floor and
/// the sender's copy reproducible.
#[derive(Debug, Clone)]
pub struct AlignedBuf {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes starting on a page.
    pub fn zeroed(len: usize) -> Self {
        let buf = vec![0u8; len + PAGE];
        let start = buf.as_ptr().align_offset(PAGE).min(PAGE);
        Self { buf, start, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// [`memcpy`] times its copies in this many equal rounds and keeps the fastest: on a shared
/// machine one preempted round would otherwise halve a floor that is meant as the best one core
/// does.
pub const MEMCPY_ROUNDS: u64 = 8;

/// What [`memcpy`] measured: the single-core copy bandwidth for one size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemcpyFloor {
    /// Bytes per copy.
    pub size_bytes: u64,
    /// Measured copies.
    pub copies: u64,
    /// Length of the measured copies at the fastest round's pace ([`MEMCPY_ROUNDS`] times the
    /// fastest round), nanoseconds.
    pub elapsed_ns: u64,
    /// The core it ran on.
    pub core: usize,
}

impl MemcpyFloor {
    /// Bytes copied per second.
    pub fn bytes_per_sec(&self) -> f64 {
        if self.elapsed_ns == 0 {
            return 0.0;
        }
        (self.copies * self.size_bytes) as f64 * 1e9 / self.elapsed_ns as f64
    }

    /// Megabytes (10^6 bytes) copied per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes_per_sec() / 1e6
    }
}

/// Measures the single-core `memcpy` bandwidth for `size`-byte copies on `core`: a source and
/// a destination of `size` bytes each (as a sender's payload and its send buffer), both
/// touched first, then a warm-up of an eighth of the copies and the measured copies
/// ([`MEMCPY_BYTES`] in all, bounded by [`MEMCPY_MIN_COPIES`] and [`MEMCPY_MAX_COPIES`]) in
/// [`MEMCPY_ROUNDS`] rounds, of which the fastest sets the rate.
///
/// # Errors
/// [`BenchError::InvalidArg`] for a zero `size`; [`BenchError::Pin`] if pinning fails;
/// [`BenchError::Interrupted`] when `stop` is raised.
pub fn memcpy(core: usize, size: usize, stop: &AtomicBool) -> Result<MemcpyFloor, BenchError> {
    if size == 0 {
        return Err(BenchError::invalid("--size", "must be at least 1 byte"));
    }
    let copies = (MEMCPY_BYTES / size as u64).clamp(MEMCPY_MIN_COPIES, MEMCPY_MAX_COPIES);
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("floor-memcpy".into())
            .spawn_scoped(s, || -> Result<MemcpyFloor, BenchError> {
                pin_current(core)?;
                // Both buffers are written before measuring: every page is touched. Both start
                // on a page, as a pool buffer or large slot does (and the bench's payload
                // template, see `AlignedBuf`).
                let mut src = AlignedBuf::zeroed(size);
                for (i, b) in src.iter_mut().enumerate() {
                    *b = (i % 251) as u8;
                }
                let mut dst = AlignedBuf::zeroed(size);
                let mut copy = |n: u64| -> Result<(), BenchError> {
                    for i in 0..n {
                        if i % 1024 == 0 && stop.load(Ordering::Relaxed) {
                            return Err(BenchError::Interrupted);
                        }
                        // `black_box` on both ends: the copy is neither hoisted nor dropped.
                        std::hint::black_box(&mut dst[..])
                            .copy_from_slice(std::hint::black_box(&src[..]));
                    }
                    Ok(())
                };
                copy(copies / 8 + 1)?;
                let per_round = copies / MEMCPY_ROUNDS;
                let mut best = u64::MAX;
                for _ in 0..MEMCPY_ROUNDS {
                    let start = Instant::now();
                    copy(per_round)?;
                    best = best.min(duration_ns(start.elapsed()));
                }
                std::hint::black_box(&dst);
                Ok(MemcpyFloor {
                    size_bytes: size as u64,
                    copies: per_round * MEMCPY_ROUNDS,
                    elapsed_ns: best.saturating_mul(MEMCPY_ROUNDS).max(1),
                    core,
                })
            })
            .map_err(|e| BenchError::io("thread spawn", e))?
            .join()
            .map_err(|_| BenchError::ThreadPanicked("floor memcpy"))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record of either ring layout is its own pair of words; the separate rings never
    /// share a line between the directions, four records to a line; the paired one puts ping
    /// `i` and pong `i` in one line, two of each direction to it. The line floors move one
    /// counter word: the same for both directions, or one on a line of its own each.
    #[test]
    fn layouts_place_records_as_documented() {
        let addr = |w: &AtomicU64| w as *const AtomicU64 as usize;
        for layout in [Layout::Separate, Layout::Paired, Layout::Relay] {
            let words = Words::new(layout);
            let mut seen = std::collections::HashSet::new();
            let mut per_line = std::collections::HashMap::<(usize, usize), usize>::new();
            for dir in 0..layout.hops() {
                for seq in 0..RING_RECORDS as u64 {
                    let (head, body) = words.record(dir, seq);
                    assert_eq!(body.map(addr), Some(addr(head) + 8));
                    assert!(seen.insert(addr(head)));
                    *per_line.entry((addr(head) / 64, dir)).or_default() += 1;
                    // A lap later, the same record.
                    let again = words.record(dir, seq + RING_RECORDS as u64).0;
                    assert!(std::ptr::eq(head, again));
                }
            }
            for seq in 0..RING_RECORDS as u64 {
                let (ping, pong) = (words.record(0, seq).0, words.record(1, seq).0);
                assert_eq!(addr(ping) / 64 == addr(pong) / 64, layout == Layout::Paired);
            }
            let lines: std::collections::HashSet<usize> =
                per_line.keys().map(|&(line, _)| line).collect();
            // Every line holds the records of one ring but the paired layout's.
            let (per_dir, shared) = match layout {
                Layout::Separate => (4, 2 * RING_RECORDS / 4),
                Layout::Relay => (4, 4 * RING_RECORDS / 4),
                _ => (2, RING_RECORDS / 2),
            };
            assert!(per_line.values().all(|&n| n == per_dir), "{layout:?}");
            assert_eq!(lines.len(), shared, "{layout:?}");
        }
        let one = Words::new(Layout::OneLine);
        let two = Words::new(Layout::TwoLines);
        for seq in [0, 1, 4097] {
            assert!(std::ptr::eq(one.record(0, seq).0, one.record(1, 0).0));
            assert!(one.record(0, seq).1.is_none() && two.record(1, seq).1.is_none());
            assert!(std::ptr::eq(two.record(1, seq).0, two.record(1, 0).0));
        }
        assert_eq!(addr(two.record(1, 0).0) - addr(two.record(0, 0).0), 256);
    }

    #[test]
    fn every_ping_pong_runs() {
        let stop = AtomicBool::new(false);
        let cores = crate::machine::available_cores();
        let cores = [cores[0], *cores.last().unwrap()];
        for layout in [
            Layout::OneLine,
            Layout::TwoLines,
            Layout::Separate,
            Layout::Paired,
            Layout::Relay,
        ] {
            // More round trips than records: the rings come around.
            let h = ping_pong(cores, 2 * RING_RECORDS as u64, 100, layout, &stop).unwrap();
            assert_eq!(h.len(), 2 * RING_RECORDS as u64, "{layout:?}");
        }
    }

    #[test]
    fn memcpy_floor_copies_the_size() {
        let stop = AtomicBool::new(false);
        let core = crate::machine::available_cores()[0];
        let m = memcpy(core, 1 << 20, &stop).unwrap();
        assert_eq!(m.size_bytes, 1 << 20);
        assert_eq!(m.copies, MEMCPY_BYTES >> 20);
        assert!(m.bytes_per_sec() > 0.0);
        assert!((m.mb_per_sec() * 1e6 - m.bytes_per_sec()).abs() < 1.0);
        let mut a = AlignedBuf::zeroed(5000);
        assert_eq!(a.len(), 5000);
        assert_eq!(a.as_ptr() as usize % PAGE, 0);
        a[4999] = 1;
        assert!(AlignedBuf::zeroed(0).is_empty());
        let tiny = memcpy(core, 8, &stop).unwrap();
        assert_eq!(tiny.copies, MEMCPY_MAX_COPIES);
        assert!(memcpy(core, 0, &stop).is_err());
        stop.store(true, Ordering::Relaxed);
        assert!(matches!(
            memcpy(core, 64, &stop),
            Err(BenchError::Interrupted)
        ));
    }
}
