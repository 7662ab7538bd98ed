//! Shared receive queues with overcommit (`EngineBuilder::rdma_srq` + `rdma_srq_credits`): many
//! connections on one poller, each granted a small share of the poller's SRQ.
//!
//! - A slow receiver among 100 connections back-pressures only its own sender, and no RNR
//!   counter of the device moves (rxe's `hw_counters`).
//! - Registered receive memory per connection with and without an SRQ, at 1 and 100
//!   connections (`SPINWIRE_SRQ_SCALE_CONNS=1000` for the scale step of
//!   `scripts/rdma-vm-scale.sh`), and the target: with an SRQ, at most 10 % of the figure
//!   without.
//!
//! Run inside the Soft-RoCE VM: `scripts/ci/rdma-vm.sh --no-smoke --test rdma_srq`; outside it
//! (no `RXE_VM_IP`) every test prints that it was skipped.
#![cfg(feature = "rdma")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use spinwire::fabric::rdma;
use spinwire::{Connection, Engine, EngineBuilder, SendError};
use spinwire_testkit::data::payload;
use spinwire_testkit::engine as kit;
use spinwire_testkit::rdma::{srq_unsupported, vm_ip};

const T: Duration = Duration::from_secs(30);
/// Small buffers: these tests are about counts of connections and buffers, not bytes.
const BUF: usize = 256;
/// Per-connection buffers (the private pool without an SRQ, the send pool always).
const BUFFERS: usize = 64;
/// Credits per connection on the SRQ: 1/16 of `BUFFERS`.
const CREDITS: usize = 4;

/// Run-to-completion, large messages off (each large slot would be pinned in the VM's 2 GiB),
/// a long liveness timeout, signalling every 4 sends (a short send queue: the CQ entries each connection reserves stay
/// few, so 1000 of them fit one poller's CQ).
fn builder(srq_buffers: usize) -> EngineBuilder {
    kit::rtc_builder(BUF, BUFFERS)
        .large_buffers(0)
        .depth(16)
        .batch(16)
        .signal_every(4)
        .rdma_srq(srq_buffers)
        .rdma_srq_credits(CREDITS)
        .max_connections_per_listener(2048)
        .max_connections_per_poller(2048)
        .connect_timeout(T)
        // TCG is 10-50x slower than native and other jobs share the host: a 1 s liveness
        // timeout was seen to expire between a connect and its first message.
        .liveness_timeout(Duration::from_secs(10))
}

/// The RNR counters of every RDMA device port (`hw_counters` files whose name has `rnr`:
/// rxe's `rcvd_rnr_err`, `send_rnr_err`, `retry_rnr_exceeded_err`).
///
/// # Panics
///
/// If there is none: the test would assert nothing.
fn rnr_counters() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let devs = std::fs::read_dir("/sys/class/infiniband").expect("/sys/class/infiniband");
    for dev in devs.flatten() {
        let Ok(ports) = std::fs::read_dir(dev.path().join("ports")) else {
            continue;
        };
        for port in ports.flatten() {
            let dir = port.path().join("hw_counters");
            let Ok(files) = std::fs::read_dir(&dir) else {
                continue;
            };
            for f in files.flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                if !name.contains("rnr") {
                    continue;
                }
                if let Ok(v) = std::fs::read_to_string(f.path()) {
                    if let Ok(v) = v.trim().parse::<u64>() {
                        out.insert(format!("{}/{name}", dir.display()), v);
                    }
                }
            }
        }
    }
    assert!(
        !out.is_empty(),
        "no RNR hw_counters under /sys/class/infiniband/*/ports/*/hw_counters"
    );
    out
}

/// Runs `engine`'s run-to-completion poller until it has taken every command the control
/// thread queued (each connection's attach among them; a poller takes 8 commands a cycle, two
/// per RDMA connection), bounded.
///
/// The footprint measurements start traffic only after this, so that they measure a settled
/// set of connections. The slow-receiver test starts at once: receive completions the poller
/// polls from its shared CQ before a connection's attach are parked and replayed (the
/// attach race, `rdma_attach`), and it asserts that none is dropped as stale.
fn attach_all(engine: &Engine, conns: usize) {
    let mut idle = 0;
    for _ in 0..conns + 64 {
        if engine.poll() == 0 {
            idle += 1;
            if idle == 4 {
                return;
            }
        } else {
            idle = 0;
        }
    }
}

/// Connects `n` pairs (server side on `server`, client side on `client`) through one
/// listener, without waiting for either poller to attach them (traffic may start at once);
/// returns them and how long the connects took.
fn connect_pairs(
    server: &Engine,
    client: &Engine,
    ep: &str,
    n: usize,
) -> (Vec<(Connection, Connection)>, Duration) {
    let l = server.listen(ep).expect("listen");
    let start = Instant::now();
    let mut pairs = Vec::with_capacity(n);
    for i in 0..n {
        let c = client
            .connect(ep)
            .unwrap_or_else(|e| panic!("connect {i}: {e}"));
        let s = l
            .accept_timeout(T)
            .unwrap_or_else(|e| panic!("accept {i}: {e}"));
        pairs.push((s, c));
    }
    let took = start.elapsed();
    (pairs, took)
}

/// Pair 0's receiver takes nothing while 99 other pairs on the same SRQ stream: its sender
/// sees `WouldBlock` within its own window, the others deliver every message in order, and
/// once the slow receiver reads, its messages all arrive in order. No RNR anywhere: the
/// engine's counter and the device's.
#[test]
fn slow_receiver_among_100_back_pressures_only_its_sender() {
    let Some(ip) = vm_ip() else { return };
    if srq_unsupported() {
        return;
    }
    const CONNS: usize = 100;
    const ROUNDS: u64 = 40;
    let rnr_before = rnr_counters();
    let before = rdma::stats();
    // One poller per engine; the server's SRQ holds exactly the 100 grants.
    let server = builder(CONNS * CREDITS).build().expect("server engine");
    let client = builder(CONNS * CREDITS).build().expect("client engine");
    let (pairs, took) = connect_pairs(&server, &client, &format!("rdma://{ip}:20600"), CONNS);
    eprintln!("{CONNS} SRQ connections in {took:?}");
    let mut sent = vec![0u64; CONNS];
    let mut received = vec![0u64; CONNS];
    let mut slow_blocked = 0u64;
    let deadline = Instant::now() + Duration::from_secs(90);
    while received[1..].iter().any(|&r| r < ROUNDS) {
        assert!(
            Instant::now() < deadline,
            "the fast connections stalled: sent {sent:?}, received {received:?}"
        );
        for (i, (_, c)) in pairs.iter().enumerate() {
            if sent[i] >= ROUNDS {
                continue;
            }
            let Ok(mut b) = c.alloc() else { continue };
            b.copy_from(&payload(8 + i, sent[i])).expect("copy");
            match c.send(b) {
                Ok(()) => sent[i] += 1,
                Err(SendError::WouldBlock(_)) => {
                    if i == 0 {
                        slow_blocked += 1;
                    }
                }
                Err(e) => panic!("send {i}: {e}"),
            }
            c.flush().expect("flush");
        }
        for (i, (s, _)) in pairs.iter().enumerate().skip(1) {
            while let Some(m) = s.try_recv().expect("recv") {
                assert_eq!(&*m, payload(8 + i, received[i]).as_slice(), "conn {i}");
                received[i] += 1;
            }
        }
    }
    assert!(
        slow_blocked > 0,
        "the slow receiver's sender never saw WouldBlock (sent {})",
        sent[0]
    );
    assert!(
        sent[0] < ROUNDS,
        "the slow receiver's sender was never held back"
    );
    assert_eq!(received[0], 0);
    // The slow receiver reads now: everything its sender got through, in order, then the
    // rest of its messages.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (s0, c0) = &pairs[0];
    while received[0] < ROUNDS {
        assert!(
            Instant::now() < deadline,
            "slow pair stalled at {} sent, {} received",
            sent[0],
            received[0]
        );
        if sent[0] < ROUNDS {
            if let Ok(mut b) = c0.alloc() {
                b.copy_from(&payload(8, sent[0])).expect("copy");
                match c0.send(b) {
                    Ok(()) => sent[0] += 1,
                    Err(SendError::WouldBlock(_)) => {}
                    Err(e) => panic!("send 0: {e}"),
                }
            }
            c0.flush().expect("flush");
        }
        while let Some(m) = s0.try_recv().expect("recv") {
            assert_eq!(&*m, payload(8, received[0]).as_slice(), "slow conn");
            received[0] += 1;
        }
    }
    let after = rdma::stats();
    let rnr_after = rnr_counters();
    eprintln!("device RNR counters: {rnr_after:?}");
    assert_eq!(rnr_after, rnr_before, "an RNR counter of the device moved");
    assert_eq!(after.rnr_errors, before.rnr_errors, "RNR completions");
    assert_eq!(after.completion_errors, before.completion_errors);
    assert_eq!(
        after.stale_completions, before.stale_completions,
        "completions filed as stale (dropped)"
    );
}

/// `e` and its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!(": {c}"));
        cur = c.source();
    }
    s
}

/// Raises the soft limit of open files to the hard one: every rdma_cm id has its own event
/// channel (a file descriptor), two per connection here (both ends in this process), and the
/// VM's default soft limit (1024) would stop at about 500 connections.
fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit for the call to fill and then read.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
    eprintln!("open files limit: {}", r.rlim_cur);
}

/// One measurement: `conns` pairs, both engines with or without an SRQ; the registered
/// receive and send bytes of both engines (from [`rdma::stats`]), per connection (two
/// connection ends per pair).
struct Footprint {
    conns: usize,
    rx_per_end: f64,
    tx_per_end: f64,
    connect: Duration,
}

fn footprint(ip: &str, port: u16, conns: usize, srq: bool) -> Result<Footprint, String> {
    let base = rdma::stats();
    let r = measure(ip, port, conns, srq, &base);
    // Everything of this measurement is released before the next one's base is taken.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rdma::stats().registered_rx_bytes > base.registered_rx_bytes && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    r
}

fn measure(
    ip: &str,
    port: u16,
    conns: usize,
    srq: bool,
    base: &rdma::RdmaStats,
) -> Result<Footprint, String> {
    let srq_buffers = if srq { conns * CREDITS } else { 0 };
    let server = builder(srq_buffers).build().map_err(|e| e.to_string())?;
    let client = builder(srq_buffers).build().map_err(|e| e.to_string())?;
    let ep = format!("rdma://{ip}:{port}");
    let l = server.listen(&ep).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut pairs = Vec::with_capacity(conns);
    for i in 0..conns {
        let c = client
            .connect(&ep)
            .map_err(|e| format!("connect {i} of {conns}: {}", chain(&e)))?;
        let s = l
            .accept_timeout(T)
            .map_err(|e| format!("accept {i}: {e}"))?;
        pairs.push((s, c));
    }
    let connect = start.elapsed();
    attach_all(&server, conns);
    attach_all(&client, conns);
    // Every pair carries a message each way: the connections are really up.
    for (i, (s, c)) in pairs.iter().enumerate() {
        kit::send_bytes(c, &payload(8, i as u64));
        let m = s.recv_timeout(T).map_err(|e| format!("recv {i}: {e}"))?;
        assert_eq!(&*m, payload(8, i as u64).as_slice());
    }
    let now = rdma::stats();
    let ends = (2 * conns) as f64;
    let rx = i128::from(now.registered_rx_bytes) - i128::from(base.registered_rx_bytes);
    let tx = i128::from(now.registered_tx_bytes) - i128::from(base.registered_tx_bytes);
    Ok(Footprint {
        conns,
        rx_per_end: rx as f64 / ends,
        tx_per_end: tx as f64 / ends,
        connect,
    })
}

/// Registered receive memory per connection with and without an SRQ at 1 and 100
/// connections (and `SPINWIRE_SRQ_SCALE_CONNS`, e.g. 1000, when set): with the SRQ sized to
/// the grants (`conns x 4` buffers), at most 10 % of the figure without (which is
/// `buffers x buffer_size` per connection, 64 buffers here). A configuration that does not
/// fit (without an SRQ, 1000 connections exceed the poller's CQ) is reported, not failed.
#[test]
fn registered_receive_memory_per_connection_with_and_without_srq() {
    let Some(ip) = vm_ip() else { return };
    if srq_unsupported() {
        return;
    }
    let mut counts = vec![1usize, 100];
    if let Ok(v) = std::env::var("SPINWIRE_SRQ_SCALE_CONNS") {
        counts.push(v.parse().expect("SPINWIRE_SRQ_SCALE_CONNS: a number"));
    }
    raise_nofile();
    let mut port = 20700u16;
    println!("conns | mode   | rx B/conn | tx B/conn | connect s | rx vs no SRQ");
    for &conns in &counts {
        port += 2;
        let own = footprint(&ip, port, conns, false);
        let own_rx = match &own {
            Ok(f) => {
                println!(
                    "{:5} | no SRQ | {:9.0} | {:9.0} | {:9.2} |",
                    f.conns,
                    f.rx_per_end,
                    f.tx_per_end,
                    f.connect.as_secs_f64()
                );
                assert_eq!(f.rx_per_end, (BUFFERS * BUF) as f64);
                f.rx_per_end
            }
            Err(e) => {
                println!("{conns:5} | no SRQ | does not fit: {e}");
                // What it would have registered: each connection's own pool.
                (BUFFERS * BUF) as f64
            }
        };
        let shared = footprint(&ip, port + 1, conns, true).expect("SRQ connections fit");
        let ratio = shared.rx_per_end / own_rx;
        println!(
            "{:5} | SRQ    | {:9.0} | {:9.0} | {:9.2} | {:.4}",
            shared.conns,
            shared.rx_per_end,
            shared.tx_per_end,
            shared.connect.as_secs_f64(),
            ratio
        );
        // The SRQ pool is `conns x CREDITS` buffers per engine: CREDITS buffers per end.
        assert_eq!(shared.rx_per_end, (CREDITS * BUF) as f64);
        assert!(
            ratio <= 0.10,
            "SRQ receive memory {ratio} of the private pools'"
        );
    }
}
