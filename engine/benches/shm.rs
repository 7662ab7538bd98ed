//! shm fabric benchmarks: ping-pong RTT percentiles and 64-byte one-way message rate, in
//! run-to-completion mode and with a dedicated poller, next to the bare cache-line ping-pong
//! floor between the same two cores measured in the same run.
//!
//! `cargo bench -p spinwire --bench shm` (add `-- quick` for a short run). Pins threads to cores
//! `SPINWIRE_BENCH_CORES` (default `0,1`); a third core, if listed, hosts the dedicated poller.
//! Prints one line per measurement and the ratio to the floor.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use spinwire::{Connection, Engine, IdleStrategy, SendError};

struct Opts {
    rtt_iters: u64,
    warmup: u64,
    rate_secs: f64,
    cores: Vec<usize>,
}

fn pin(core: usize) {
    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: core });
}

fn report(name: &str, h: &Histogram<u64>, floor_p50: Option<u64>) {
    let p50 = h.value_at_quantile(0.5);
    let ratio = floor_p50.map_or(String::new(), |f| {
        format!("  ({:.2}x floor p50)", p50 as f64 / f as f64)
    });
    println!(
        "{name:<44} RTT p50 {p50:>6} ns  p99 {:>6} ns  p99.9 {:>7} ns  max {:>8} ns{ratio}",
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max()
    );
}

/// The floor: two threads bouncing one cache line.
fn floor(o: &Opts) -> Histogram<u64> {
    let line = Arc::new(CachePadded::new(AtomicU64::new(0)));
    let n = o.rtt_iters + o.warmup;
    let l2 = line.clone();
    let c1 = o.cores[1];
    let echo = std::thread::spawn(move || {
        pin(c1);
        let mut expect = 1;
        while expect < 2 * n {
            while l2.load(Ordering::Acquire) != expect {
                core::hint::spin_loop();
            }
            l2.store(expect + 1, Ordering::Release);
            expect += 2;
        }
    });
    pin(o.cores[0]);
    let mut h = Histogram::<u64>::new(3).unwrap();
    let mut v = 1;
    for i in 0..n {
        let t = Instant::now();
        line.store(v, Ordering::Release);
        while line.load(Ordering::Acquire) != v + 1 {
            core::hint::spin_loop();
        }
        let ns = t.elapsed().as_nanos() as u64;
        if i >= o.warmup {
            let _ = h.record(ns);
        }
        v += 2;
    }
    echo.join().unwrap();
    h
}

fn engine(pollers: &[usize]) -> Engine {
    Engine::builder()
        .pollers(pollers)
        .idle(IdleStrategy::BusySpin)
        .pool(4096, 256)
        .depth(128)
        .batch(32)
        .build()
        .expect("engine")
}

fn pair(name: &str, server_engine: &Engine, client_engine: &Engine) -> (Connection, Connection) {
    let ep = format!("shm://bench-{name}-{}", std::process::id());
    let l = server_engine.listen(&ep).unwrap();
    let c = client_engine.connect(&ep).unwrap();
    let s = l.accept_timeout(Duration::from_secs(5)).unwrap();
    (s, c)
}

fn send_spin(conn: &Connection, payload: &[u8]) {
    let mut b = loop {
        match conn.alloc() {
            Ok(b) => break b,
            Err(spinwire::Error::WouldBlock) => {
                conn.flush().expect("flush");
            }
            Err(e) => panic!("alloc: {e}"),
        }
    };
    b.copy_from(payload).unwrap();
    let mut b = b;
    loop {
        match conn.send(b) {
            Ok(()) => return,
            Err(SendError::WouldBlock(back)) => {
                b = back;
                conn.flush().expect("flush");
            }
            Err(e) => panic!("send: {e:?}"),
        }
    }
}

/// Ping-pong: the client (core 0) sends `size` bytes, the server (core 1) echoes.
fn pingpong(
    o: &Opts,
    size: usize,
    server_pollers: &[usize],
    client_pollers: &[usize],
) -> Histogram<u64> {
    let se = engine(server_pollers);
    let ce = engine(client_pollers);
    let (s, c) = pair(&format!("pp{size}-{}", server_pollers.len()), &se, &ce);
    let n = o.rtt_iters + o.warmup;
    let c1 = o.cores[1];
    let server = std::thread::spawn(move || {
        pin(c1);
        let mut buf = vec![0u8; size];
        for _ in 0..n {
            let m = s.recv_timeout(Duration::from_secs(10)).unwrap();
            buf.copy_from_slice(&m);
            drop(m);
            send_spin(&s, &buf);
            s.flush().expect("flush");
        }
        drop(s);
        drop(se);
    });
    pin(o.cores[0]);
    let payload = vec![7u8; size];
    let mut h = Histogram::<u64>::new(3).unwrap();
    for i in 0..n {
        let t = Instant::now();
        send_spin(&c, &payload);
        c.flush().expect("flush");
        let m = c.recv_timeout(Duration::from_secs(10)).unwrap();
        debug_assert_eq!(m.len(), size);
        drop(m);
        let ns = t.elapsed().as_nanos() as u64;
        if i >= o.warmup {
            let _ = h.record(ns);
        }
    }
    server.join().unwrap();
    h
}

/// One-way 64-byte flood: messages per second received.
fn rate(o: &Opts, size: usize, rx_pollers: &[usize], tx_pollers: &[usize]) -> f64 {
    let re = engine(rx_pollers);
    let te = engine(tx_pollers);
    let (r, t) = pair(&format!("rate{size}-{}", rx_pollers.len()), &re, &te);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let barrier = Arc::new(Barrier::new(2));
    let b2 = barrier.clone();
    let c1 = o.cores[1];
    let receiver = std::thread::spawn(move || {
        pin(c1);
        b2.wait();
        let mut n = 0u64;
        let mut sum = 0u64;
        let t0 = Instant::now();
        while !stop2.load(Ordering::Relaxed) {
            while let Some(m) = r.try_recv().unwrap() {
                sum = sum.wrapping_add(u64::from(m[0]));
                n += 1;
            }
        }
        let el = t0.elapsed();
        if std::env::var_os("SPINWIRE_BENCH_DEBUG").is_some() {
            eprintln!(
                "receiver {:?}\nreceiver engine {:?}",
                r.stats(),
                re.counters()
            );
            eprintln!("receiver thread: {} cpu {}", ctx_switches(), cpu());
        }
        drop(r);
        drop(re);
        (n, el, sum)
    });
    pin(o.cores[0]);
    barrier.wait();
    let payload = vec![1u8; size];
    let t0 = Instant::now();
    let dur = Duration::from_secs_f64(o.rate_secs);
    let mut i = 0u32;
    loop {
        send_spin(&t, &payload);
        i = i.wrapping_add(1);
        if i % 4096 == 0 && t0.elapsed() >= dur {
            break;
        }
    }
    t.flush().expect("flush");
    stop.store(true, Ordering::Relaxed);
    if std::env::var_os("SPINWIRE_BENCH_DEBUG").is_some() {
        eprintln!("sender {:?}\nsender engine {:?}", t.stats(), te.counters());
        eprintln!("sender thread: {} cpu {}", ctx_switches(), cpu());
    }
    let (n, el, _) = receiver.join().unwrap();
    n as f64 / el.as_secs_f64()
}

/// CPU cost per message with both ends on this thread (one run-to-completion engine): send a
/// batch, then receive it. No cross-core traffic: the engine's own per-message overhead.
fn single_thread_cost(o: &Opts, size: usize) -> f64 {
    pin(o.cores[0]);
    let e = engine(&[]);
    let (r, t) = pair(&format!("cost{size}"), &e, &e);
    let payload = vec![3u8; size];
    let batch = 32;
    let rounds = if o.rate_secs < 0.5 { 2_000 } else { 100_000 };
    let mut got = 0u64;
    let t0 = Instant::now();
    for _ in 0..rounds {
        for _ in 0..batch {
            send_spin(&t, &payload);
        }
        t.flush().expect("flush");
        let mut n = 0;
        while n < batch {
            if let Some(m) = r.try_recv().unwrap() {
                got = got.wrapping_add(u64::from(m[0]));
                n += 1;
            }
        }
    }
    let el = t0.elapsed();
    assert!(got > 0);
    el.as_nanos() as f64 / (rounds * batch) as f64
}

/// CPU cost of one ping-pong round trip with both ends on this thread: the engine's overhead per
/// RTT without any cross-core transfer (compare with the RTT minus the floor).
fn single_thread_rtt(o: &Opts, size: usize) -> f64 {
    pin(o.cores[0]);
    let e = engine(&[]);
    let (s, c) = pair(&format!("strtt{size}"), &e, &e);
    let payload = vec![3u8; size];
    let rounds = if o.rate_secs < 0.5 { 20_000 } else { 1_000_000 };
    let mut buf = vec![0u8; size];
    let t0 = Instant::now();
    for _ in 0..rounds {
        send_spin(&c, &payload);
        c.flush().expect("flush");
        loop {
            if let Some(m) = s.try_recv().unwrap() {
                buf.copy_from_slice(&m);
                break;
            }
        }
        send_spin(&s, &buf);
        s.flush().expect("flush");
        while c.try_recv().unwrap().is_none() {}
    }
    t0.elapsed().as_nanos() as f64 / rounds as f64
}

/// Baseline: the shm wire rings alone (no engine), one thread sending inline records, one
/// receiving; messages per second.
fn wire_rate(o: &Opts, size: usize) -> f64 {
    use spinwire::fabric::shm::wire::{Params, RxMsg, Segment};
    let params = Params {
        buffer_size: 4096,
        buffer_count: 16,
        ring_depth: 512,
        inline_max: 120,
        large_size: 0,
        large_count: 0,
    };
    let (a, fd) = Segment::create(&params).unwrap();
    let b = Segment::attach(std::os::fd::AsFd::as_fd(&fd), &params).unwrap();
    let (mut tx, _rx_a, _rel_a) = a.split().unwrap();
    let (_tx_b, mut rx, _rel_b) = b.split().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let c1 = o.cores[1];
    let receiver = std::thread::spawn(move || {
        pin(c1);
        let mut n = 0u64;
        let t0 = Instant::now();
        let mut out = [0u8; 128];
        while !stop2.load(Ordering::Relaxed) {
            n += rx
                .poll(32, |m| {
                    if let RxMsg::Inline(b) = m {
                        out[..b.len()].copy_from_slice(b);
                    }
                })
                .unwrap() as u64;
        }
        (n, t0.elapsed())
    });
    pin(o.cores[0]);
    let payload = vec![1u8; size];
    let t0 = Instant::now();
    let dur = Duration::from_secs_f64(o.rate_secs);
    let mut i = 0u32;
    loop {
        if tx.try_send_inline(&payload).unwrap() {
            i = i.wrapping_add(1);
            if i % 4096 == 0 && t0.elapsed() >= dur {
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (n, el) = receiver.join().unwrap();
    drop((a, b));
    n as f64 / el.as_secs_f64()
}

/// Dedicated poller on a 2-core machine without oversubscription: one application thread
/// (core 0) owns both ends of a connection whose engine has one poller pinned to core 1. A round
/// trip crosses between application thread and poller four times (send, deliver, echo, deliver),
/// against two core-to-core transfers in the inline ping-pong.
fn dedicated_loop_rtt(o: &Opts, size: usize) -> Histogram<u64> {
    pin(o.cores[0]);
    let e = engine(&[o.cores[1]]);
    let (s, c) = pair(&format!("dedrtt{size}"), &e, &e);
    let payload = vec![5u8; size];
    let mut buf = vec![0u8; size];
    let mut h = Histogram::<u64>::new(3).unwrap();
    for i in 0..o.rtt_iters + o.warmup {
        let t = Instant::now();
        send_spin(&c, &payload);
        let m = s.recv_timeout(Duration::from_secs(10)).unwrap();
        buf.copy_from_slice(&m);
        drop(m);
        send_spin(&s, &buf);
        let m = c.recv_timeout(Duration::from_secs(10)).unwrap();
        drop(m);
        let ns = t.elapsed().as_nanos() as u64;
        if i >= o.warmup {
            let _ = h.record(ns);
        }
    }
    h
}

/// Dedicated poller throughput on 2 cores: the application thread (core 0) sends batches on one
/// end and drains them on the other; the poller (core 1) moves every message twice.
fn dedicated_loop_rate(o: &Opts, size: usize) -> f64 {
    pin(o.cores[0]);
    let e = engine(&[o.cores[1]]);
    let (r, t) = pair(&format!("dedrate{size}"), &e, &e);
    let payload = vec![3u8; size];
    let dur = Duration::from_secs_f64(o.rate_secs);
    let t0 = Instant::now();
    let (mut sent, mut got) = (0u64, 0u64);
    while t0.elapsed() < dur {
        for _ in 0..64 {
            match t.alloc() {
                Ok(mut b) => {
                    b.copy_from(&payload).unwrap();
                    if t.send(b).is_ok() {
                        sent += 1;
                    }
                }
                Err(_) => break,
            }
        }
        while let Some(m) = r.try_recv().unwrap() {
            got += u64::from(m[0] > 0);
        }
    }
    while got < sent {
        let _m = r.recv_timeout(Duration::from_secs(10)).unwrap();
        got += 1;
    }
    got as f64 / t0.elapsed().as_secs_f64()
}

/// The CPU this thread runs on (diagnostics).
fn cpu() -> i32 {
    // SAFETY: sched_getcpu has no preconditions.
    unsafe { libc::sched_getcpu() }
}

/// This thread's context switches (diagnostics for `SPINWIRE_BENCH_DEBUG`).
fn ctx_switches() -> String {
    std::fs::read_to_string("/proc/thread-self/status")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("ctxt_switches"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing special: keep it short.
    let quick = args.iter().any(|a| a == "quick") || !args.iter().any(|a| a == "--bench");
    let cores: Vec<usize> = std::env::var("SPINWIRE_BENCH_CORES")
        .ok()
        .map(|s| s.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![0, 1]);
    let o = Opts {
        rtt_iters: if quick { 2_000 } else { 200_000 },
        warmup: if quick { 200 } else { 20_000 },
        rate_secs: if quick { 0.05 } else { 1.0 },
        cores,
    };
    println!(
        "shm benchmark: cores {:?} ({} RTT samples)",
        o.cores, o.rtt_iters
    );
    let cost_sizes: &[usize] = if std::env::var_os("SPINWIRE_BENCH_RTT_ONLY").is_some() {
        &[]
    } else {
        &[8, 64]
    };
    for &size in cost_sizes {
        let ns = single_thread_cost(&o, size);
        println!(
            "engine cost, both ends on one thread, {size:>4} B: {ns:>6.1} ns/msg ({:.1} M msgs/s)",
            1e3 / ns
        );
    }
    for &size in cost_sizes {
        let ns = single_thread_rtt(&o, size);
        println!("engine cost per round trip, both ends on one thread, {size:>4} B: {ns:>6.1} ns");
    }
    if std::env::var_os("SPINWIRE_BENCH_COST_ONLY").is_some() {
        return;
    }
    let f = floor(&o);
    report("floor: bare cache-line ping-pong", &f, None);
    let fp50 = f.value_at_quantile(0.5);
    let rtt_sizes: &[usize] = if std::env::var_os("SPINWIRE_BENCH_RTT_ONLY").is_some() {
        &[8, 32]
    } else {
        &[8, 32, 64, 256, 1024]
    };
    for &size in rtt_sizes {
        let h = pingpong(&o, size, &[], &[]);
        report(
            &format!("shm run-to-completion ping-pong {size:>4} B"),
            &h,
            Some(fp50),
        );
    }
    if std::env::var_os("SPINWIRE_BENCH_RTT_ONLY").is_some() {
        return;
    }
    if o.cores.len() >= 4 {
        // Dedicated pollers need their own cores: app threads on cores[0..2], pollers on cores[2..4].
        for size in [8usize, 64] {
            let h = pingpong(&o, size, &[o.cores[3]], &[o.cores[2]]);
            report(
                &format!("shm dedicated-poller ping-pong {size:>4} B"),
                &h,
                Some(fp50),
            );
        }
    } else {
        for size in [8usize, 64] {
            let h = dedicated_loop_rtt(&o, size);
            report(
                &format!("shm dedicated poller, 1 app thread {size:>4} B"),
                &h,
                Some(fp50),
            );
        }
        println!("(2 cores: the dedicated-poller ping-pong above has 4 app<->poller hops per round trip; give 4 cores in SPINWIRE_BENCH_CORES for 2 app threads + 2 pollers)");
    }
    for size in [8usize, 64] {
        let r = wire_rate(&o, size);
        println!(
            "shm wire rings alone (no engine) one-way {size:>4} B  {:>8.2} M msgs/s",
            r / 1e6
        );
    }
    for size in [8usize, 64] {
        let r = rate(&o, size, &[], &[]);
        println!(
            "shm run-to-completion one-way {size:>4} B  {:>8.2} M msgs/s",
            r / 1e6
        );
    }
    for size in [8usize, 64] {
        let r = dedicated_loop_rate(&o, size);
        println!(
            "shm dedicated poller, 1 app thread, one-way {size:>4} B  {:>8.2} M msgs/s",
            r / 1e6
        );
    }
    if o.cores.len() >= 4 {
        let r = rate(&o, 64, &[o.cores[3]], &[o.cores[2]]);
        println!(
            "shm dedicated-poller one-way   64 B  {:>8.2} M msgs/s",
            r / 1e6
        );
    }
}
