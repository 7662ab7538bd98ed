//! Many connections on one poller, and connections spread over several pollers. Over
//! `tcp://` loopback: shm connections take the direct path and never reach a poller (the last
//! test checks that).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use spinwire::{Connection, Engine, IdleStrategy};
use spinwire_testkit::engine::{endpoint, poller_builder, recv_msg, rtc_engine, send_msg};

/// A loopback TCP endpoint on a port that was free a moment ago.
fn tcp_endpoint() -> String {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    format!("tcp://127.0.0.1:{}", l.local_addr().expect("addr").port())
}
use spinwire_testkit::{cores, pin, serial, WAIT};

const CONNS: usize = 16;
const ROUNDS: u32 = 50;

fn many_connections(cores: &[usize]) -> Vec<spinwire::PollerStats> {
    let server = poller_builder(cores, 1024, 8).build().unwrap();
    let client = rtc_engine(1024, 8);
    let ep = tcp_endpoint();
    let listener = server.listen(&ep).unwrap();
    let mut clients = Vec::new();
    let mut servers: Vec<Connection> = Vec::new();
    for _ in 0..CONNS {
        clients.push(client.connect(&ep).unwrap());
        servers.push(listener.accept_timeout(WAIT).unwrap());
    }
    // One thread echoes on every server connection.
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let echo = std::thread::spawn(move || {
        let mut n = 0u64;
        let mut idle = 0u32;
        while !stop2.load(Ordering::Acquire) {
            let mut work = false;
            for s in &servers {
                if let Some(m) = s.try_recv().unwrap() {
                    let mut b = s.alloc_timeout(WAIT).unwrap();
                    b.copy_from(&m).unwrap();
                    drop(m);
                    s.send_timeout(b, WAIT).unwrap();
                    n += 1;
                    work = true;
                }
            }
            if work {
                idle = 0;
            } else {
                idle += 1;
                if idle > 100 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        n
    });
    for round in 0..ROUNDS {
        for (i, c) in clients.iter().enumerate() {
            let seq = round * CONNS as u32 + i as u32;
            send_msg(c, seq, 1 + (seq as usize * 7) % 1000);
        }
        for (i, c) in clients.iter().enumerate() {
            let seq = round * CONNS as u32 + i as u32;
            recv_msg(c, seq, 1 + (seq as usize * 7) % 1000);
        }
    }
    // Snapshot while every connection is still open (the echo thread drops them when it stops).
    let stats = server.counters().pollers;
    stop.store(true, Ordering::Release);
    assert_eq!(echo.join().unwrap(), u64::from(ROUNDS) * CONNS as u64);
    stats
}

#[test]
fn many_connections_on_one_poller() {
    let _g = serial();
    let stats = many_connections(&[cores()[0]]);
    assert_eq!(stats.len(), 1);
    assert_eq!(stats[0].connections, CONNS as u64);
    assert_eq!(stats[0].rx_msgs, u64::from(ROUNDS) * CONNS as u64);
}

#[test]
fn connections_spread_over_several_pollers() {
    let _g = serial();
    let cores = cores();
    if cores.len() < 2 {
        eprintln!("skipped: needs two cores");
        return;
    }
    let stats = many_connections(&cores[..2]);
    assert_eq!(stats.len(), 2);
    for p in &stats {
        assert_eq!(p.connections, (CONNS / 2) as u64, "{stats:?}");
        assert!(p.rx_msgs > 0);
    }
    assert_eq!(
        stats.iter().map(|p| p.rx_msgs).sum::<u64>(),
        u64::from(ROUNDS) * CONNS as u64
    );
}

#[test]
fn shm_connections_bypass_the_pollers() {
    let _g = serial();
    let server = poller_builder(&[cores()[0]], 1024, 8).build().unwrap();
    let client = rtc_engine(1024, 8);
    let ep = endpoint("bypass");
    let listener = server.listen(&ep).unwrap();
    let c = client.connect(&ep).unwrap();
    let s = listener.accept_timeout(WAIT).unwrap();
    for seq in 0..100 {
        send_msg(&c, seq, 1 + (seq as usize * 7) % 1000);
        recv_msg(&s, seq, 1 + (seq as usize * 7) % 1000);
    }
    let stats = server.counters().pollers;
    assert_eq!(stats[0].connections, 0);
    assert_eq!(stats[0].rx_msgs, 0);
    assert_eq!(s.stats().received, 100);
    assert_eq!(c.stats().sent, 100);
}

#[test]
fn pollers_may_use_cores_the_building_thread_is_not_pinned_to() {
    let _g = serial();
    let cores = cores();
    if cores.len() < 2 {
        eprintln!("skipped: needs two cores");
        return;
    }
    let (first, last) = (cores[0], cores[cores.len() - 1]);
    // Build from a thread pinned to `first`; the poller goes to `last`.
    let engine = std::thread::spawn(move || {
        pin(first);
        Engine::builder()
            .pollers(&[last])
            .idle(IdleStrategy::backoff())
            .build()
    })
    .join()
    .unwrap()
    .expect("poller on another core");
    assert_eq!(engine.counters().pollers[0].core, Some(last));
}
