//! Flow control and resource limits: a one-way flood into a slow receiver loses nothing and the
//! sender sees back-pressure; pool exhaustion, oversized messages and bad endpoints get typed
//! errors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spinwire::{Engine, Error, SendError};
use spinwire_testkit::data::fill;
use spinwire_testkit::engine::*;
use spinwire_testkit::{cores, serial, WAIT};

const N: u32 = 20_000;

fn flood(server_engine: Engine, client_engine: Engine, tag: &str) {
    let (s, c) = pair(&server_engine, &client_engine, &endpoint(tag));
    let done = Arc::new(AtomicBool::new(false));
    let done2 = done.clone();
    // The slow receiver: sleeps now and then, verifies order and content of everything.
    let receiver = std::thread::spawn(move || {
        for seq in 0..N {
            if seq % 2000 == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            let len = 1 + (seq as usize * 37) % 300;
            recv_msg(&s, seq, len);
        }
        done2.store(true, Ordering::Release);
        // Nothing beyond what was sent.
        assert!(matches!(s.try_recv(), Ok(None) | Err(Error::Disconnected)));
        drop(s);
        server_engine
    });
    let mut would_block = 0u64;
    for seq in 0..N {
        let len = 1 + (seq as usize * 37) % 300;
        let mut b = c.alloc_timeout(WAIT).expect("alloc");
        b.set_len(len).unwrap();
        fill(&mut b, seq);
        let mut b = b;
        let deadline = Instant::now() + WAIT;
        loop {
            match c.send(b) {
                Ok(()) => break,
                Err(SendError::WouldBlock(back)) => {
                    would_block += 1;
                    b = back;
                    assert!(Instant::now() < deadline, "sender stuck");
                    c.flush();
                    std::thread::yield_now();
                }
                Err(e) => panic!("send: {e:?}"),
            }
        }
    }
    c.flush();
    let _server_engine = receiver.join().expect("receiver");
    assert!(done.load(Ordering::Acquire));
    assert!(
        would_block > 0,
        "a slow receiver must push back on the sender"
    );
    let st = c.stats();
    assert_eq!(st.sent, u64::from(N));
    assert!(st.would_block >= would_block);
}

#[test]
fn flood_into_slow_receiver_run_to_completion() {
    let _g = serial();
    flood(inline_engine(512, 32), inline_engine(512, 32), "flood-rtc");
}

#[test]
fn flood_into_slow_receiver_dedicated_pollers() {
    let _g = serial();
    let cores = cores();
    let mk = |core: usize| poller_builder(&[core], 512, 32).depth(16).build().unwrap();
    flood(mk(cores[0]), mk(cores[cores.len() - 1]), "flood-ded");
}

#[test]
fn send_timeout_times_out_without_credits() {
    let _g = serial();
    let e = inline_engine(256, 8);
    let (s, c) = pair(&e, &e, &endpoint("credits"));
    // depth = 8: eight messages fit, the ninth has no credit while the receiver takes nothing.
    // (The receiver's poller still runs: its receive ring holds the window; nothing is consumed.)
    let mut sent = 0;
    loop {
        let b = c.alloc_timeout(WAIT).unwrap();
        match c.send_timeout(b, Duration::from_millis(50)) {
            Ok(()) => sent += 1,
            Err(SendError::Timeout(b)) => {
                drop(b);
                break;
            }
            Err(e) => panic!("{e:?}"),
        }
        assert!(sent <= 64, "credits must run out");
    }
    assert!(sent >= 8);
    for _ in 0..sent {
        s.recv_timeout(WAIT).unwrap();
    }
}

#[test]
fn pool_exhaustion_is_typed() {
    let _g = serial();
    let e = inline_engine(256, 4);
    let (_s, c) = pair(&e, &e, &endpoint("pool"));
    let held: Vec<_> = (0..4).map(|_| c.alloc().expect("four buffers")).collect();
    assert!(matches!(c.alloc(), Err(Error::PoolExhausted { count: 4 })));
    let msg = c.alloc().unwrap_err().to_string();
    assert!(msg.contains('4'), "{msg}");
    drop(held);
    // Dropped unsent: back in the pool.
    let again: Vec<_> = (0..4)
        .map(|_| c.alloc().expect("buffers came back"))
        .collect();
    drop(again);
}

#[test]
fn oversized_messages_are_rejected_with_the_limit() {
    let _g = serial();
    // Without large slots the limit is the buffer size (with them, see `shm_large.rs`).
    let e = rtc_builder(1024, 4)
        .depth(4)
        .batch(8)
        .large_buffers(0)
        .build()
        .unwrap();
    let (_s, c) = pair(&e, &e, &endpoint("big"));
    let max = c.max_message_size();
    assert_eq!(max, 1024);
    let mut b = c.alloc().unwrap();
    assert!(b.copy_from(&vec![0u8; max]).is_ok());
    let err = b.copy_from(&vec![0u8; max + 1]).unwrap_err();
    assert!(matches!(err, Error::MessageTooLarge { size, max: m } if size == max + 1 && m == max));
    assert!(err.to_string().contains("1024"), "{err}");
    assert!(matches!(
        b.set_len(max + 1),
        Err(Error::MessageTooLarge { .. })
    ));
}

#[test]
fn bad_endpoints_are_typed() {
    let _g = serial();
    let e = inline_engine(256, 4);
    for bad in [
        "",
        "shm",
        "shm://",
        "shm://a/b",
        "tcpx://h:1",
        "tcp://h",
        "tcp://::1:5",
        "shm://.x",
        "shm://has space",
    ] {
        assert!(
            matches!(e.listen(bad), Err(Error::BadEndpoint { .. })),
            "listen {bad:?}"
        );
        assert!(
            matches!(e.connect(bad), Err(Error::BadEndpoint { .. })),
            "connect {bad:?}"
        );
    }
    if !cfg!(feature = "rdma") {
        assert!(matches!(
            e.connect("rdma://10.0.0.1:7471"),
            Err(Error::FabricNotCompiled { fabric: "rdma" })
        ));
        assert!(matches!(
            e.listen("rdma://10.0.0.1:7471"),
            Err(Error::FabricNotCompiled { fabric: "rdma" })
        ));
    }
    // Nobody listening.
    let err = e
        .connect_timeout(&endpoint("nobody"), Duration::from_millis(200))
        .unwrap_err();
    assert!(
        matches!(err, Error::Connect { .. } | Error::Timeout),
        "{err}"
    );
    // Name taken.
    let ep = endpoint("taken");
    let _l = e.listen(&ep).unwrap();
    assert!(matches!(e.listen(&ep), Err(Error::Listen { .. })));
}

#[test]
fn bad_configuration_is_typed() {
    assert!(matches!(
        Engine::builder().pool(0, 4).build(),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        Engine::builder().pool(64, 0).build(),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        Engine::builder().pool(64, 4).depth(5).build(),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        Engine::builder().batch(0).build(),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        Engine::builder().pollers(&[100_000]).build(),
        Err(Error::BadCore { .. })
    ));
}

#[test]
fn mismatched_pools_are_refused() {
    let _g = serial();
    let a = inline_engine(1024, 8);
    let b = inline_engine(2048, 8);
    let ep = endpoint("mismatch");
    let _l = a.listen(&ep).unwrap();
    assert!(b.connect_timeout(&ep, WAIT).is_err());
}

fn close_delivers_queued(server_engine: Engine, client_engine: Engine, tag: &str) {
    let (s, c) = pair(&server_engine, &client_engine, &endpoint(tag));
    for seq in 0..20 {
        let mut b = c.alloc_timeout(WAIT).unwrap();
        b.set_len(100).unwrap();
        fill(&mut b, seq);
        c.send_timeout(b, WAIT).unwrap();
    }
    drop(c); // queued sends are posted before the close
    for seq in 0..20 {
        recv_msg(&s, seq, 100);
    }
    let err = s.recv_timeout(WAIT).unwrap_err();
    assert!(matches!(err, Error::Disconnected), "{err}");
    assert!(!s.is_open());
}

#[test]
fn close_delivers_queued_messages_then_disconnects() {
    let _g = serial();
    close_delivers_queued(inline_engine(512, 32), inline_engine(512, 32), "close-rtc");
    let ded = poller_engine(cores()[0], 512, 32);
    close_delivers_queued(inline_engine(512, 32), ded, "close-ded");
}
