//! [`IdleStrategy::Block`] on the polled path (`mem://`, `tcp://`), in dedicated-poller and
//! run-to-completion modes: an idle poller (and an application thread in `recv_timeout`)
//! sleeps at ≤ 1 % CPU, a message wakes it well within `max_sleep`, and 10 000 bursts and
//! silences lose no wake-up.
//!
//! Each thread's CPU time is read from `/proc/self/task/<tid>/schedstat` (nanoseconds on CPU).

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, EngineBuilder, Error, IdleStrategy};
use spinwire_testkit::engine::{pair, send_bytes};
use spinwire_testkit::{cores, serial};

/// The sleeps are bounded far above any wake-up: a lost wake-up shows as a wait this long.
const MAX_SLEEP: Duration = Duration::from_secs(1);

fn block(spin: Duration) -> IdleStrategy {
    IdleStrategy::Block {
        spin,
        max_sleep: MAX_SLEEP,
    }
}

fn builder(name: &str, rtc: bool, spin: Duration) -> EngineBuilder {
    let b = Engine::builder()
        .name(name)
        .idle(block(spin))
        // No liveness tick: a sleep ends only by a wake-up or `MAX_SLEEP`.
        .liveness_timeout(Duration::ZERO)
        .pool(4096, 64);
    if rtc {
        b.run_to_completion()
    } else {
        b.pollers(&[cores()[0]])
    }
}

fn endpoint(scheme: &str, tag: &str) -> String {
    match scheme {
        "mem" => format!("mem://block-{tag}-{}", std::process::id()),
        _ => {
            let l = TcpListener::bind(("127.0.0.1", 0)).expect("a free loopback port");
            format!("tcp://127.0.0.1:{}", l.local_addr().unwrap().port())
        }
    }
}

/// Nanoseconds thread `tid` of this process has run.
fn cpu_ns(tid: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).expect("schedstat");
    s.split_whitespace().next().unwrap().parse().unwrap()
}

/// The calling thread's id.
fn my_tid() -> String {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) }.to_string()
}

/// The id of this process's thread named `name`.
fn thread_named(name: &str) -> String {
    for e in std::fs::read_dir("/proc/self/task").unwrap() {
        let tid = e.unwrap().file_name().into_string().unwrap();
        let comm =
            std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap_or_default();
        if comm.trim_end() == name {
            return tid;
        }
    }
    panic!("no thread named {name}");
}

fn sleeps(e: &Engine) -> (u64, u64) {
    let c = e.counters();
    c.pollers
        .iter()
        .fold((0, 0), |a, p| (a.0 + p.sleeps, a.1 + p.sleep_timeouts))
}

/// Dedicated pollers: both pollers and the receiving application thread sleep at ≤ 1 % CPU
/// over an idle second, and one message wakes the receiver well within `MAX_SLEEP`.
fn dedicated_sleeps_and_wakes(scheme: &str) {
    let _g = serial();
    let server = builder(&format!("bs{scheme}"), false, Duration::from_micros(50))
        .build()
        .unwrap();
    let client = builder(&format!("bc{scheme}"), false, Duration::from_micros(50))
        .build()
        .unwrap();
    let (s, c) = pair(&server, &client, &endpoint(scheme, "dedicated"));
    send_bytes(&c, b"warm");
    assert_eq!(&*s.recv_timeout(Duration::from_secs(5)).unwrap(), b"warm");
    let pollers = [
        thread_named(&format!("bs{scheme}-poller-{}", cores()[0])),
        thread_named(&format!("bc{scheme}-poller-{}", cores()[0])),
    ];
    std::thread::sleep(Duration::from_millis(50));
    let before: Vec<u64> = pollers.iter().map(|t| cpu_ns(t)).collect();
    let me = my_tid();
    let mine = cpu_ns(&me);
    let t = Instant::now();
    assert!(matches!(
        s.recv_timeout(Duration::from_secs(1)),
        Err(Error::Timeout)
    ));
    let idle = t.elapsed();
    let limit = idle.as_nanos() as u64 / 100;
    let app = cpu_ns(&me) - mine;
    assert!(
        app <= limit,
        "{scheme}: recv_timeout used {app} ns of CPU in {idle:?}"
    );
    for (tid, b) in pollers.iter().zip(before) {
        let used = cpu_ns(tid) - b;
        assert!(
            used <= limit,
            "{scheme}: poller {tid} used {used} ns of CPU in {idle:?}"
        );
    }
    assert!(
        sleeps(&server).0 > 0 && sleeps(&client).0 > 0,
        "the pollers never slept"
    );

    // A receiver asleep (poller and application) wakes for one message.
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        send_bytes(&c, b"wake");
        let sent = Instant::now();
        while !d.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        (c, sent)
    });
    let m = s.recv_timeout(Duration::from_secs(10)).unwrap();
    let got = Instant::now();
    assert_eq!(&*m, b"wake");
    drop(m);
    done.store(true, Ordering::Release);
    let (_c, sent) = sender.join().unwrap();
    let took = got.saturating_duration_since(sent);
    assert!(took < MAX_SLEEP / 4, "{scheme}: woke after {took:?}");
}

#[test]
fn mem_dedicated_poller_sleeps_and_wakes() {
    dedicated_sleeps_and_wakes("mem");
}

#[test]
fn tcp_dedicated_poller_sleeps_and_wakes() {
    dedicated_sleeps_and_wakes("tcp");
}

/// Run-to-completion: the application thread in `recv_timeout` is the poller; it sleeps in
/// the poller's set at ≤ 1 % CPU and wakes for a message from another engine.
fn rtc_sleeps_and_wakes(scheme: &str) {
    let _g = serial();
    let server = builder(&format!("rs{scheme}"), true, Duration::from_micros(50))
        .build()
        .unwrap();
    let client = builder(&format!("rc{scheme}"), false, Duration::from_micros(50))
        .build()
        .unwrap();
    let ep = endpoint(scheme, "rtc");
    let l = server.listen(&ep).unwrap();
    let c = client.connect(&ep).unwrap();
    let s = l.accept_timeout(Duration::from_secs(5)).unwrap();
    send_bytes(&c, b"warm");
    assert_eq!(&*s.recv_timeout(Duration::from_secs(5)).unwrap(), b"warm");
    let me = my_tid();
    let mine = cpu_ns(&me);
    let t = Instant::now();
    assert!(matches!(
        s.recv_timeout(Duration::from_secs(1)),
        Err(Error::Timeout)
    ));
    let idle = t.elapsed();
    let app = cpu_ns(&me) - mine;
    assert!(
        app <= idle.as_nanos() as u64 / 100,
        "{scheme}: recv_timeout (run-to-completion) used {app} ns of CPU in {idle:?}"
    );
    assert!(
        sleeps(&server).0 > 0,
        "the run-to-completion poller never slept"
    );
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        send_bytes(&c, b"wake");
        (c, Instant::now())
    });
    let m = s.recv_timeout(Duration::from_secs(10)).unwrap();
    let got = Instant::now();
    assert_eq!(&*m, b"wake");
    let (_c, sent) = sender.join().unwrap();
    let took = got.saturating_duration_since(sent);
    assert!(took < MAX_SLEEP / 4, "{scheme}: woke after {took:?}");
}

#[test]
fn mem_run_to_completion_sleeps_and_wakes() {
    rtc_sleeps_and_wakes("mem");
}

#[test]
fn tcp_run_to_completion_sleeps_and_wakes() {
    rtc_sleeps_and_wakes("tcp");
}

/// 10 000 cycles of a burst (1 to 8 messages) and a silence long enough for both sides to
/// fall asleep: every burst arrives well before `MAX_SLEEP`, and no poller sleep ends by its
/// timeout (a lost wake-up would).
fn bursts_and_silences(scheme: &str, rtc: bool) {
    let _g = serial();
    let cycles: u64 = if cfg!(debug_assertions) {
        3_000
    } else {
        10_000
    };
    let spin = Duration::from_micros(20);
    let server = builder(&format!("ss{scheme}"), rtc, spin).build().unwrap();
    let client = builder(&format!("sc{scheme}"), false, spin)
        .build()
        .unwrap();
    let ep = endpoint(scheme, if rtc { "stress-rtc" } else { "stress" });
    let l = server.listen(&ep).unwrap();
    let c = client.connect(&ep).unwrap();
    let s = l.accept_timeout(Duration::from_secs(5)).unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let r = received.clone();
    let sender = std::thread::spawn(move || {
        let mut worst = Duration::ZERO;
        let mut total = 0u64;
        for i in 0..cycles {
            let burst = 1 + i % 8;
            let start = Instant::now();
            for k in 0..burst {
                send_bytes(&c, &(i * 8 + k).to_le_bytes());
            }
            total += burst;
            while r.load(Ordering::Acquire) < total {
                // Fails fast: a lost wake-up waits out `MAX_SLEEP`.
                assert!(
                    start.elapsed() < MAX_SLEEP / 2,
                    "cycle {i}: the burst took over {:?} (a lost wake-up)",
                    MAX_SLEEP / 2
                );
                std::hint::spin_loop();
            }
            worst = worst.max(start.elapsed());
            // The silence: longer than the spin phase, so both sides go to sleep.
            std::thread::sleep(Duration::from_micros(300));
        }
        (c, worst)
    });
    let total: u64 = (0..cycles).map(|i| 1 + i % 8).sum();
    for n in 0..total {
        let m = conn_recv(&s);
        assert_eq!(m.len(), 8, "message {n}");
        received.store(n + 1, Ordering::Release);
    }
    let (_c, worst) = sender.join().unwrap();
    let (slept, timeouts) = sleeps(&server);
    assert!(
        worst < MAX_SLEEP / 2,
        "{scheme}: a burst took {worst:?} (a lost wake-up waits out {MAX_SLEEP:?})"
    );
    assert!(
        slept >= cycles / 4,
        "{scheme}: the receiver's poller slept only {slept} times"
    );
    assert_eq!(
        timeouts, 0,
        "{scheme}: {timeouts} of {slept} sleeps ended by timeout"
    );
}

fn conn_recv(s: &Connection) -> Vec<u8> {
    s.recv_timeout(Duration::from_secs(10))
        .expect("recv")
        .to_vec()
}

#[test]
fn mem_bursts_and_silences_lose_no_wake_up() {
    bursts_and_silences("mem", false);
}

#[test]
fn mem_bursts_and_silences_lose_no_wake_up_run_to_completion() {
    bursts_and_silences("mem", true);
}

#[test]
fn tcp_bursts_and_silences_lose_no_wake_up() {
    bursts_and_silences("tcp", false);
}
