//! The control thread never waits on one peer: clients that connect to a listener's socket and
//! never finish the handshake cost a pending-table entry each, not control-thread time, and are
//! expired (their sockets closed) after the handshake step timeout.

use std::time::{Duration, Instant};

use cm::uds::{self, UdsStream};
use spinwire_testkit::engine::*;
use spinwire_testkit::{serial, WAIT};

/// Clients that connect and never send their hello, per attempt.
const HOSTILE: usize = 50;
/// The bound on a good client's connect + accept with [`HOSTILE`] stalled clients queued ahead
/// of it (the old, blocking accept took over 10 s: 250 ms per stalled client).
const BOUND: Duration = Duration::from_millis(50);
/// Attempts; the best one must be within [`BOUND`].
const ATTEMPTS: usize = 5;

/// `HOSTILE` raw connects to the listener's socket (`cm::uds` finds the path by name) that
/// never send a hello.
fn hostile_clients(name: &str) -> Vec<UdsStream> {
    (0..HOSTILE)
        .map(|_| uds::connect(name, WAIT).expect("raw connect to the listener's socket"))
        .collect()
}

#[test]
fn stalled_handshakes_do_not_delay_a_good_client_and_expire() {
    let _g = serial();
    let engine = rtc_engine(4096, 16);
    let ep = endpoint("stalled");
    let name = ep.strip_prefix("shm://").expect("an shm endpoint");
    let listener = engine.listen(&ep).expect("listen");

    // The machine this runs on may be loaded (2 cores shared with other builds), so one sample
    // can be delayed by the scheduler: the bound applies to the best of a few attempts, each
    // with a fresh set of stalled clients queued ahead of the good one.
    let mut hostile = Vec::new();
    let mut best = Duration::MAX;
    for _ in 0..ATTEMPTS {
        hostile.extend(hostile_clients(name));
        let t0 = Instant::now();
        let client = engine.connect(&ep).expect("good client connects");
        let server = listener.accept_timeout(WAIT).expect("good client accepted");
        best = best.min(t0.elapsed());
        // The connection works.
        send_bytes(&client, b"ping");
        let m = server.recv_timeout(WAIT).expect("ping arrives");
        assert_eq!(&m[..], b"ping");
    }
    assert!(
        best < BOUND,
        "with {HOSTILE} stalled clients queued ahead, the best of {ATTEMPTS} connect + accept \
         took {best:?} (bound {BOUND:?})"
    );

    // Every stalled client is expired after the handshake step timeout (250 ms): the listener
    // closes its socket. Bounded wait, generous for a loaded machine.
    let deadline = Instant::now() + WAIT;
    for (i, h) in hostile.iter_mut().enumerate() {
        loop {
            if h.poll_hangup().unwrap_or(true) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "stalled client {i} of {} still open after {WAIT:?}",
                HOSTILE * ATTEMPTS
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A client that sends its hello but never its ready (after the listener's offer) is expired as
/// well, and a good client still gets through meanwhile.
#[test]
fn a_client_stalled_after_the_offer_is_expired() {
    let _g = serial();
    let engine = rtc_engine(4096, 16);
    let ep = endpoint("stalled-ready");
    let name = ep.strip_prefix("shm://").expect("an shm endpoint");
    let listener = engine.listen(&ep).expect("listen");

    let params = uds::ConnParams {
        buffer_size: 4096,
        buffer_count: 16,
        ring_depth: 16,
        inline_max: 40,
        flags: 0,
        // The engine's default large slots (the pools must match the listener's).
        large_size: spinwire::DEFAULT_MAX_MESSAGE_SIZE as u32,
        large_count: spinwire::DEFAULT_LARGE_BUFFERS as u32,
    };
    let mut stalled = uds::connect(name, WAIT).expect("raw connect");
    stalled.send_hello(&params, WAIT).expect("hello");
    // The listener offers its segment without waiting for anything else.
    let offer = stalled.recv_offer(WAIT).expect("offer");
    let client = engine.connect(&ep).expect("good client connects");
    let _server = listener.accept_timeout(WAIT).expect("good client accepted");
    drop(client);
    drop(offer);
    // Offered, never readied: expired after the step timeout (socket closed).
    let deadline = Instant::now() + WAIT;
    while !stalled.poll_hangup().unwrap_or(true) {
        assert!(
            Instant::now() < deadline,
            "stalled client still open after {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        matches!(listener.try_accept(), Ok(None)),
        "a stalled handshake must not become a connection"
    );
}
