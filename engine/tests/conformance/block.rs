//! [`IdleStrategy::Block`]: a receiver that sleeps in the kernel is woken by the first
//! arrival (a doorbell rung by its sender), costs no CPU while asleep, never makes its sender
//! wait, and never misses a wake-up.
//!
//! Every case reads the receiving connection's [`ConnStats::sleeps`] and
//! [`ConnStats::sleeps_unrung`]: a receive that slept and was rung is what is under test (a
//! receive that only spun, or a sleep that ended at its `max_sleep` and then found the message,
//! would pass a plain delivery check). `max_sleep` is 1 s, the longest allowed, so that a
//! lost wake-up is a sleep that ends unrung after a second, not a short park.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use spinwire::{ConnStats, Connection, Engine, EngineBuilder, IdleStrategy};
use spinwire_testkit::data::{fill, verify};
use spinwire_testkit::engine::*;
use spinwire_testkit::WAIT;

use super::Scheme;

/// The receivers' strategy: a short spin (so that the cases' silences reach the sleep), and
/// the longest `max_sleep` (so that only a ring ends a sleep early).
const BLOCK: IdleStrategy = IdleStrategy::Block {
    spin: Duration::from_micros(20),
    max_sleep: Duration::from_secs(1),
};

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_THREAD_CPUTIME_ID needs nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A server engine that blocks when idle (run-to-completion or with a dedicated poller on the
/// last core) and a backoff client engine, connected on `tag`.
fn block_pair(
    s: &'static Scheme,
    tag: &str,
    dedicated: bool,
) -> (Engine, Engine, Connection, Connection) {
    // Liveness off: nothing but a ring (or `max_sleep`, 1 s) ends a sleeping poller's sleep,
    // so a lost wake-up of a poller shows as a late message, not as one the liveness beat
    // (a quarter of the timeout) happened to pick up.
    let block = |b: EngineBuilder| b.idle(BLOCK).liveness_timeout(Duration::ZERO);
    let server_b = if dedicated {
        let core = *spinwire_testkit::cores().last().expect("a core");
        block(s.poller(core))
    } else {
        block(s.rtc())
    };
    let server = s.build(server_b);
    // Off on both ends: an end that checks liveness fails a peer that sends it no heartbeat.
    let client = s.build(s.rtc().liveness_timeout(Duration::ZERO));
    let (srv, cli) = pair(&server, &client, &(s.endpoint)(tag));
    (server, client, srv, cli)
}

/// The receiving thread of the wake-up cases: receives `n` verified messages (sequence
/// numbers from 0, `len` bytes) with `recv_timeout(per_recv)`, fails when one receive took
/// more than half of `per_recv` (a receive whose sleep missed its ring sleeps until the call's
/// deadline and may still find the message then), reports its CPU time while it waits for
/// the first and when each arrived, and hands the connection back.
fn spawn_receiver(
    conn: Connection,
    n: u32,
    len: usize,
    per_recv: Duration,
    ready: mpsc::Sender<()>,
) -> thread::JoinHandle<(Connection, Duration, Vec<Instant>)> {
    thread::spawn(move || {
        let cpu0 = thread_cpu();
        ready.send(()).expect("ready");
        let mut arrivals = Vec::with_capacity(n as usize);
        let mut first_cpu = Duration::ZERO;
        for seq in 0..n {
            let t = Instant::now();
            let m = conn
                .recv_timeout(per_recv)
                .unwrap_or_else(|e| panic!("recv {seq} (within {per_recv:?}): {e}"));
            let now = Instant::now();
            assert!(
                now - t < per_recv / 2,
                "recv {seq} took {:?}: a lost wake-up (the sender sends without pausing)",
                now - t
            );
            arrivals.push(now);
            if seq == 0 {
                first_cpu = thread_cpu() - cpu0;
            }
            verify(&m, seq, len);
        }
        (conn, first_cpu, arrivals)
    })
}

fn sleeps_rung(st: &ConnStats) -> u64 {
    st.sleeps - st.sleeps_unrung
}

/// The body of the wake-up cases: the receiver waits in `recv_timeout` through 300 ms of
/// silence (it must sleep: little CPU), then one message must wake it well before
/// `max_sleep`, by a ring.
fn sleeping_receiver_wakes_for_one_message(s: &'static Scheme, dedicated: bool) {
    let (_server, _client, srv, cli) = block_pair(s, "block-wake", dedicated);
    let (ready_tx, ready_rx) = mpsc::channel();
    let receiver = spawn_receiver(srv, 1, 64, WAIT, ready_tx);
    ready_rx.recv_timeout(WAIT).expect("receiver started");
    let silence = Duration::from_millis(300);
    thread::sleep(silence);
    let sent_at = Instant::now();
    send_msg(&cli, 0, 64);
    let (srv, cpu, arrivals) = receiver.join().expect("receiver");
    let woke_after = arrivals[0] - sent_at;
    let st = srv.stats();
    eprintln!(
        "{}: asleep {silence:?} using {cpu:?} CPU; woke {woke_after:?} after the send; {st:?}",
        s.name
    );
    assert!(
        cpu < silence / 10,
        "the waiting receiver used {cpu:?} of CPU over {silence:?} of silence: it did not sleep"
    );
    assert!(st.sleeps >= 1, "the receive never slept: {st:?}");
    assert_eq!(
        st.sleeps_unrung, 0,
        "a sleep ended without a ring (max_sleep is 1 s, the silence 300 ms): {st:?}"
    );
    assert!(
        woke_after < Duration::from_millis(500),
        "the message woke the receiver only after {woke_after:?} (max_sleep 1 s)"
    );
}

/// Run-to-completion receiver.
pub fn sleeping_receiver_wakes_for_one_message_run_to_completion(s: &'static Scheme) {
    sleeping_receiver_wakes_for_one_message(s, false);
}

/// Receiver with a dedicated (Block) poller.
pub fn sleeping_receiver_wakes_for_one_message_dedicated_poller(s: &'static Scheme) {
    sleeping_receiver_wakes_for_one_message(s, true);
}

/// A sender whose receiver sleeps is never held up by it: a window of sends each returns at
/// once (the ring of a doorbell is a wake-up call, not a wait), and the receiver then takes
/// them all.
pub fn sender_never_blocks_on_a_sleeping_receiver(s: &'static Scheme) {
    let (_server, _client, srv, cli) = block_pair(s, "block-sender", false);
    let n = super::BUFFERS as u32;
    let (ready_tx, ready_rx) = mpsc::channel();
    let receiver = spawn_receiver(srv, 3 * n, 32, WAIT, ready_tx);
    ready_rx.recv_timeout(WAIT).expect("receiver started");
    let mut slowest = Duration::ZERO;
    let mut seq = 0;
    for _round in 0..3 {
        // Long enough for the receiver to be asleep again.
        thread::sleep(Duration::from_millis(50));
        for _ in 0..n {
            let mut b = claim_timeout(&cli, 32);
            fill(&mut b, seq);
            let t = Instant::now();
            // The window is `n` and the receiver drains between rounds: no WouldBlock here
            // unless the send waited on the receiver (then it would return late, not fail).
            match cli.send_timeout(b, WAIT) {
                Ok(()) => {}
                Err(e) => panic!("send {seq}: {e:?}"),
            }
            slowest = slowest.max(t.elapsed());
            seq += 1;
        }
        cli.flush().expect("flush");
    }
    let (srv, _cpu, _arrivals) = receiver.join().expect("receiver");
    let st = srv.stats();
    eprintln!("{}: slowest send {slowest:?}; receiver {st:?}", s.name);
    assert!(st.sleeps >= 1, "the receiver never slept: {st:?}");
    assert!(
        slowest < Duration::from_millis(200),
        "a send to a sleeping receiver took {slowest:?}"
    );
}

/// 10 000 cycles (fewer on a slow scheme) of a burst of 1-4 messages and a silence of up to
/// 200 µs, against a receiver that sleeps after 20 µs of spin: every message arrives within
/// half of `max_sleep` of its send, and no sleep of the receiving thread ends unrung (a lost
/// wake-up would end at `max_sleep`, 1 s, and show in either).
pub fn no_lost_wake_up_over_bursts_and_silences(s: &'static Scheme) {
    let cycles = s.slow_div(10_000).max(500);
    let (_server, client, srv, cli) = block_pair(s, "block-stress", false);
    // Burst sizes and silences from a fixed sequence (an LCG): the same run every time.
    let mut x: u32 = 0x2545_f491;
    let mut next = move || {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        x >> 8
    };
    let plan: Vec<(u32, u64)> = (0..cycles)
        .map(|_| (1 + next() % 4, u64::from(next() % 200)))
        .collect();
    let total: u32 = plan.iter().map(|(b, _)| b).sum();
    let (ready_tx, ready_rx) = mpsc::channel();
    // Each message comes within 200 us of the last (plus a send): a receive that takes 250 ms
    // (a quarter of max_sleep) missed its wake-up, and fails the case at once rather than
    // after 10 000 cycles of long sleeps.
    let receiver = spawn_receiver(srv, total, 16, Duration::from_millis(500), ready_tx);
    ready_rx.recv_timeout(WAIT).expect("receiver started");
    let start = Instant::now();
    let mut seq = 0;
    let mut sent_at = Vec::with_capacity(total as usize);
    for (burst, silence_us) in plan {
        for _ in 0..burst {
            sent_at.push(Instant::now());
            send_msg(&cli, seq, 16);
            seq += 1;
        }
        let until = Instant::now() + Duration::from_micros(silence_us);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        // Keep the sender's own engine serviced (credits back) between bursts.
        let _ = cli.try_recv();
    }
    // The sender's engine runs to completion: the last messages, waiting in it for credits
    // (a small window, e.g. rdma_srq's 4), move only while this thread drives it. Stopping here
    // would leave them to the control thread's idle beat (liveness is off: a second) and fail
    // the receiver for the sender's reason, not the receiver's.
    let deadline = Instant::now() + WAIT;
    while !receiver.is_finished() && Instant::now() < deadline {
        client.poll();
        let _ = cli.try_recv();
        std::hint::spin_loop();
    }
    let (srv, _cpu, arrivals) = receiver.join().expect("receiver");
    let st = srv.stats();
    let (worst_seq, worst) = arrivals
        .iter()
        .zip(&sent_at)
        .map(|(a, s)| a.saturating_duration_since(*s))
        .enumerate()
        .max_by_key(|&(_, d)| d)
        .expect("messages");
    eprintln!(
        "{}: {cycles} cycles, {total} messages in {:?}, slowest {worst:?} (message {worst_seq}); \
         receiver {st:?}",
        s.name,
        start.elapsed()
    );
    assert!(
        worst < Duration::from_millis(500),
        "message {worst_seq} arrived {worst:?} after its send (max_sleep 1 s): a lost wake-up"
    );
    assert!(
        st.sleeps > u64::from(cycles) / 20,
        "the receiver slept only {} times in {cycles} cycles: the case did not test wake-ups",
        st.sleeps
    );
    assert_eq!(
        st.sleeps_unrung,
        0,
        "{} sleeps ended without a ring ({} rung): lost wake-ups",
        st.sleeps_unrung,
        sleeps_rung(&st)
    );
}
