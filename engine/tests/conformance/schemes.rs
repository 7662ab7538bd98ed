//! The schemes the suite runs over: how each makes its endpoints, tunes its engines and feeds
//! hostile bytes, and what it does not support (with the reason).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use spinwire::fabric::mem::{End, Faults};
use spinwire::{Connection, Engine, EngineBuilder, Listener};
use spinwire_testkit::data::XorShift;
use spinwire_testkit::WAIT;

use super::{HostilePeer, Scheme, BUF, BUFFERS};

fn always() -> Result<(), &'static str> {
    Ok(())
}

fn same(b: EngineBuilder) -> EngineBuilder {
    b
}

/// `shm://`: shared-memory rings on this host, connections on the direct path.
pub const SHM: Scheme = Scheme {
    name: "shm",
    available: always,
    endpoint: shm_endpoint,
    tweak: same,
    skips: &[
        (
            "hostile_bytes_fail_only_their_connection",
            "a shm peer writes shared memory, not a byte stream: its hostile records are \
             engine/tests/corrupt.rs (random bytes in the peer's rings)",
        ),
        ("peer_silent_mid_record_is_unresponsive", WHOLE_RECORDS),
    ],
    size_step: 1,
    hostile: None,
    half_record: None,
    death_bound: Duration::from_secs(1),
    liveness: Duration::from_millis(300),
    slow: 1,
    stall: None,
    carries_abort: true,
};

fn shm_endpoint(tag: &str) -> String {
    format!("shm://c-{tag}-{}", std::process::id())
}

/// `tcp://` on IPv4 loopback.
pub const TCP: Scheme = Scheme {
    name: "tcp",
    available: always,
    endpoint: tcp_endpoint,
    tweak: same,
    skips: &[],
    size_step: 1,
    hostile: Some(tcp_hostile),
    half_record: Some(tcp_half_record),
    death_bound: Duration::from_secs(1),
    liveness: Duration::from_millis(300),
    slow: 1,
    stall: None,
    carries_abort: true,
};

/// Why the mid-record case skips where records are published whole.
const WHOLE_RECORDS: &str = "records are published whole (the header is written after the \
     payload, or a work request carries the whole message): no record can be half-sent; a \
     byte stream's partial record is tcp's case";

/// Why the cases that need a second process skip on `mem://`.
const MEM_IN_PROCESS: &str = "mem:// is in-process: no second process can reach it; its \
     peer death, stall and reconnect are fault-injected in engine/tests/mem.rs \
     (Faults::kill, stall, corrupt_next)";

/// `mem://`: the in-process fabric, through the real poller (both ends in this process).
pub const MEM: Scheme = Scheme {
    name: "mem",
    available: always,
    endpoint: mem_endpoint,
    tweak: same,
    skips: &[
        ("peer_silent_mid_record_is_unresponsive", WHOLE_RECORDS),
        ("fifo_every_size_two_processes", MEM_IN_PROCESS),
        ("peer_sigkill_run_to_completion", MEM_IN_PROCESS),
        ("peer_sigkill_dedicated_poller", MEM_IN_PROCESS),
        ("peer_sigstop_run_to_completion", MEM_IN_PROCESS),
        ("peer_sigstop_dedicated_poller", MEM_IN_PROCESS),
        ("reconnect_exact_unconfirmed", MEM_IN_PROCESS),
        (
            "reconnect_delivers_received_before_the_loss",
            MEM_IN_PROCESS,
        ),
        ("reconnect_max_attempts_ends_in_gave_up", MEM_IN_PROCESS),
        (
            "hostile_bytes_fail_only_their_connection",
            "a mem:// peer is this process: a corrupt record is fault-injected \
             (Faults::corrupt_next in engine/tests/mem.rs)",
        ),
    ],
    size_step: 1,
    hostile: None,
    half_record: None,
    death_bound: Duration::from_secs(1),
    liveness: Duration::from_millis(300),
    slow: 1,
    stall: Some(mem_stall),
    carries_abort: true,
};

/// Stalls or resumes the connecting end of the latest `mem://` connection to `endpoint`.
fn mem_stall(endpoint: &str, stop: bool) {
    let faults = Faults::latest(endpoint).expect("a mem:// connection to stall");
    if stop {
        faults.stall(End::Connecting);
    } else {
        faults.resume(End::Connecting);
    }
}

fn mem_endpoint(tag: &str) -> String {
    format!("mem://c-{tag}-{}", std::process::id())
}

/// A loopback endpoint on a port that was free a moment ago (bound, read, released).
fn tcp_endpoint(_tag: &str) -> String {
    let l = TcpListener::bind(("127.0.0.1", 0)).expect("a free loopback port");
    format!(
        "tcp://127.0.0.1:{}",
        l.local_addr().expect("address").port()
    )
}

/// A hello as a spinwire connector sends it (`fabric/tcp/hello.rs`): the suite's pool and
/// window, no large slots.
fn tcp_hello() -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..4].copy_from_slice(b"SPWT");
    b[4] = spinwire::fabric::tcp::WIRE_VERSION;
    b[8..12].copy_from_slice(&(BUF as u32).to_le_bytes());
    b[12..16].copy_from_slice(&(BUFFERS as u32).to_le_bytes());
    // The byte window: 64 KiB.
    b[24..28].copy_from_slice(&(64u32 << 10).to_le_bytes());
    b
}

/// A raw socket completes the handshake, then writes random bytes where records go.
/// A raw tcp peer through `listener` that has completed the hello (the listener accepted it).
fn tcp_raw_peer(engine: &Engine, listener: &Listener, endpoint: &str) -> (Connection, TcpStream) {
    let addr = endpoint.strip_prefix("tcp://").expect("a tcp endpoint");
    let mut raw = TcpStream::connect(addr).expect("raw connect");
    raw.set_read_timeout(Some(WAIT)).unwrap();
    raw.write_all(&tcp_hello()).unwrap();
    let deadline = Instant::now() + WAIT;
    let conn = loop {
        engine.poll();
        if let Some(c) = listener.try_accept().expect("accept") {
            break c;
        }
        assert!(Instant::now() < deadline, "raw peer not accepted");
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut reply = [0u8; 32];
    raw.read_exact(&mut reply).unwrap();
    assert_eq!(reply[5], 0, "raw peer accepted");
    (conn, raw)
}

/// A raw tcp peer that writes the header and half the payload of a 100-byte DATA record, then
/// nothing (the socket stays open).
fn tcp_half_record(engine: &Engine, listener: &Listener, endpoint: &str) -> HostilePeer {
    let (conn, mut raw) = tcp_raw_peer(engine, listener, endpoint);
    let mut rec = [0u8; 58];
    rec[0..4].copy_from_slice(&108u32.to_le_bytes());
    rec[4] = 1;
    raw.write_all(&rec).unwrap();
    (conn, Box::new(raw))
}

fn tcp_hostile(engine: &Engine, listener: &Listener, endpoint: &str, seed: u64) -> HostilePeer {
    let (conn, mut raw) = tcp_raw_peer(engine, listener, endpoint);
    let mut rng = XorShift::new(seed);
    let garbage: Vec<u8> = (0..256).map(|_| rng.next() as u8).collect();
    // The engine may fail the connection and close the socket before all of it is written.
    let _ = raw.write_all(&garbage);
    // Then the end of the stream: a record cut off by it is a protocol error too.
    let _ = raw.shutdown(std::net::Shutdown::Write);
    (conn, Box::new(raw))
}

/// What `rdma://` does not support, with or without a shared receive queue.
#[cfg(feature = "rdma")]
const RDMA_SKIPS: &[(&str, &str)] = &[
    RDMA_SKIP_SILENT,
    RDMA_SKIP_HOSTILE,
    RDMA_SKIP_WAITS,
    RDMA_SKIP_LIMITS,
    RDMA_SKIP_TIMES_OUT,
];

/// What `rdma://` with an overcommitted shared receive queue does not support: as [`RDMA`],
/// and an application holding more pooled messages of one connection than its grant.
#[cfg(feature = "rdma")]
const RDMA_SRQ_SKIPS: &[(&str, &str)] = &[
    RDMA_SKIP_SILENT,
    RDMA_SKIP_HOSTILE,
    RDMA_SKIP_WAITS,
    RDMA_SKIP_LIMITS,
    RDMA_SKIP_TIMES_OUT,
    (
        "held_messages_are_bounded_typed_and_lose_nothing",
        "the case holds 8 pooled messages of one connection; with rdma_srq each connection is \
         granted 4 receive buffers of the shared queue, and an application holding its grant \
         back-pressures its own sender by design (rdma_srq.rs \
         slow_receiver_among_100_back_pressures_only_its_sender); rdma:: runs the case",
    ),
];

#[cfg(feature = "rdma")]
const RDMA_SKIP_SILENT: (&str, &str) = ("peer_silent_mid_record_is_unresponsive", WHOLE_RECORDS);
#[cfg(feature = "rdma")]
const RDMA_SKIP_HOSTILE: (&str, &str) = (
    "hostile_bytes_fail_only_their_connection",
    "a hostile rdma peer needs a raw verbs peer, which the testkit does not have: the \
     validation of hostile frames and RNDV records is unit-tested \
     (fabric::rdma::datapath::frame, ::rndv)",
);
/// Why the cases that wait for a listener skip on rdma.
#[cfg(feature = "rdma")]
const RDMA_CONNECT_NO_WAIT: &str = "an rdma:// connect does not wait for a listener: it fails \
     at once with the rdma_cm rejection (rdma_engine.rs no_listener_and_bad_addresses_are_clear_errors)";
#[cfg(feature = "rdma")]
const RDMA_SKIP_WAITS: (&str, &str) = ("connect_waits_for_a_listener", RDMA_CONNECT_NO_WAIT);
#[cfg(feature = "rdma")]
const RDMA_SKIP_LIMITS: (&str, &str) = (
    "different_message_limits_settle_to_the_smaller",
    "rdma:// does not settle message limits: both ends must agree on buffers and large \
     slots (the request with other settings is rejected)",
);
#[cfg(feature = "rdma")]
const RDMA_SKIP_TIMES_OUT: (&str, &str) = (
    "connect_without_listener_times_out_typed",
    RDMA_CONNECT_NO_WAIT,
);

/// `rdma://` on the Soft-RoCE VM's address (`RXE_VM_IP`); every case skips outside the VM.
#[cfg(feature = "rdma")]
pub const RDMA: Scheme = Scheme {
    name: "rdma",
    available: rdma_available,
    endpoint: rdma_endpoint,
    tweak: rdma_tweak,
    skips: RDMA_SKIPS,
    size_step: 7,
    hostile: None,
    half_record: None,
    death_bound: Duration::from_secs(5),
    // As rdma_engine.rs's SIGSTOP test: 300 ms was reported up to 670 ms late in the VM.
    liveness: Duration::from_millis(500),
    slow: 8,
    stall: None,
    // The rdma close (rdma_cm's disconnect) carries no reason yet: the silent side sees
    // Disconnected.
    carries_abort: false,
};

/// SRQ buffers per poller of the `rdma_srq` scheme's engines (4 MiB registered with the
/// suite's 4 KiB buffers): room for the grants of the largest burst of connections a case
/// makes on one engine (128).
#[cfg(feature = "rdma")]
pub const RDMA_SRQ_BUFFERS: usize = 1024;
/// Credits per connection of the `rdma_srq` scheme: a quarter of the suite's [`BUFFERS`], so
/// every window is an overcommitted share of the poller's SRQ, not a private pool.
#[cfg(feature = "rdma")]
pub const RDMA_SRQ_CREDITS: usize = 4;

/// `rdma://` with a shared receive queue per poller ([`RDMA_SRQ_BUFFERS`]) and small grants
/// ([`RDMA_SRQ_CREDITS`]): the same cases as [`RDMA`].
#[cfg(feature = "rdma")]
pub const RDMA_SRQ: Scheme = Scheme {
    name: "rdma_srq",
    tweak: rdma_srq_tweak,
    skips: RDMA_SRQ_SKIPS,
    ..RDMA
};

#[cfg(feature = "rdma")]
fn rdma_srq_tweak(b: EngineBuilder) -> EngineBuilder {
    rdma_tweak(b)
        .rdma_srq(RDMA_SRQ_BUFFERS)
        .rdma_srq_credits(RDMA_SRQ_CREDITS)
}

#[cfg(feature = "rdma")]
fn rdma_available() -> Result<(), &'static str> {
    match std::env::var("RXE_VM_IP") {
        Ok(_) => Ok(()),
        Err(_) => Err("RXE_VM_IP unset (not inside the RDMA VM: scripts/ci/rdma-vm.sh)"),
    }
}

/// `rdma://<vm ip>:<port>`: ports from 20500 on, one per call, offset by the process so that a
/// child's endpoints never meet its parent's.
#[cfg(feature = "rdma")]
fn rdma_endpoint(_tag: &str) -> String {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let ip = std::env::var("RXE_VM_IP").expect("RXE_VM_IP");
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let port = 20500 + (std::process::id() % 50) as u16 * 200 + n % 200;
    format!("rdma://{ip}:{port}")
}

/// The VM is 10-50x slower than native: longer connect timeouts.
#[cfg(feature = "rdma")]
fn rdma_tweak(b: EngineBuilder) -> EngineBuilder {
    b.connect_timeout(Duration::from_secs(20))
}
