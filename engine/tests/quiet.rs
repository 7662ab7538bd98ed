//! The control thread stays quiet: with established connections and nothing in flight it wakes
//! only at the liveness beat (a twelfth of the liveness timeout), not on a fixed short period.
//! On a machine whose cores are all owned by busy-polling threads every wake-up preempts a
//! spinner, so this is a latency-tail property. It is asserted on the count of wake-ups
//! ([`EngineStats::control_wakeups`](spinwire::EngineStats)), not on a time: a loaded machine
//! only makes wake-ups late, never more frequent.

use std::time::Duration;

use spinwire::Engine;
use spinwire_testkit::engine::*;
use spinwire_testkit::serial;

const LIVENESS: Duration = Duration::from_secs(1);
const WINDOW: Duration = Duration::from_millis(500);

fn wakeups(e: &Engine) -> u64 {
    e.counters().control_wakeups
}

#[test]
fn established_connections_wake_the_control_thread_only_at_the_liveness_beat() {
    let _g = serial();
    let build = || {
        rtc_builder(4096, 16)
            .liveness_timeout(LIVENESS)
            .build()
            .unwrap()
    };
    let (a, b) = (build(), build());
    let conns: Vec<_> = (0..4)
        .map(|i| pair(&a, &b, &endpoint(&format!("quiet-{i}"))))
        .collect();
    for (seq, (s, c)) in conns.iter().enumerate() {
        send_msg(c, seq as u32, 64);
        recv_msg(s, seq as u32, 64);
    }
    // Let the setup's own turns (accepts, registrations, hello/ready) pass.
    std::thread::sleep(Duration::from_millis(100));
    let before = (wakeups(&a), wakeups(&b));
    std::thread::sleep(WINDOW);
    let after = (wakeups(&a), wakeups(&b));
    // A beat every 83 ms: about 6 in the window. A fixed 10-ms tick would make 50.
    for (side, n) in [("a", after.0 - before.0), ("b", after.1 - before.1)] {
        eprintln!("engine {side}: {n} control-thread wake-ups in {WINDOW:?}");
        assert!(
            n <= 10,
            "engine {side}: {n} control-thread wake-ups in {WINDOW:?} (liveness {LIVENESS:?})"
        );
    }
    // Still alive and serving (the heartbeats kept flowing).
    for (seq, (s, c)) in conns.iter().enumerate() {
        assert!(s.is_open() && c.is_open());
        send_msg(s, seq as u32, 64);
        recv_msg(c, seq as u32, 64);
    }
}

#[test]
fn an_idle_engine_sleeps_until_woken() {
    let _g = serial();
    let e = rtc_builder(4096, 16).build().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let before = wakeups(&e);
    std::thread::sleep(WINDOW);
    // Nothing is due: only the 1-s safety net could turn it.
    assert!(
        wakeups(&e) - before <= 1,
        "an idle engine's control thread turned"
    );
}
