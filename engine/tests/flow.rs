//! Resource limits on shm: pool exhaustion, oversized messages, bad endpoints, bad
//! configuration and mismatched pools get typed errors. Back-pressure into a slow receiver,
//! `send_timeout` without credits and a close that delivers what was queued are the conformance
//! suite's, over every scheme (`conformance/flow.rs`, `conformance/peer.rs`).

use std::time::Duration;

use spinwire::{Engine, Error};
use spinwire_testkit::engine::*;
use spinwire_testkit::{serial, WAIT};

#[test]
fn pool_exhaustion_is_typed() {
    let _g = serial();
    let e = rtc_engine(256, 4);
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
    let e = rtc_engine(256, 4);
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
    // Nobody listening: waited for until the deadline.
    let err = e
        .connect_timeout(&endpoint("nobody"), Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(err, Error::NoListener { .. }), "{err}");
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
    let a = rtc_engine(1024, 8);
    let b = rtc_engine(2048, 8);
    let ep = endpoint("mismatch");
    let _l = a.listen(&ep).unwrap();
    assert!(b.connect_timeout(&ep, WAIT).is_err());
}
