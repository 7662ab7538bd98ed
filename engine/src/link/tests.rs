//! The link between the three parties of a connection, built around a `mem://` end.

use super::*;
use crate::fabric::mem::setup;

fn cfg() -> Config {
    crate::Engine::builder()
        .pool(512, 6)
        .depth(3)
        .max_message_size(4096)
        .large_buffers(2)
        .validate()
        .expect("config")
}

#[test]
fn conn_pair_starts_with_every_buffer_and_slot_free() {
    let cfg = cfg();
    let (a, _b) = setup::test_pair(&cfg, "link-unit");
    assert_eq!((a.pools.tx.count(), a.pools.tx_large.count()), (6, 2));
    let (mut parts, poller) = conn_pair(9, "p".into(), a.conn, a.pools, a.keep, &cfg);
    let AppPath::Rings(r) = &mut parts.path else {
        panic!("rings")
    };
    let mut free = Vec::new();
    while let Ok(i) = r.free.pop() {
        free.push(i);
    }
    assert_eq!(
        free,
        vec![0, 1, 2, 3, 4, 5, LARGE, LARGE | 1],
        "ordinary buffers, then the large slots"
    );
    assert!(r.rx.is_empty());
    assert_eq!(poller.tx_owned.len(), 1, "8 bits in one word");
    assert_eq!(poller.id, 9);
    assert_eq!(parts.shared.down(), None);
}

const LARGE: u32 = crate::desc::LARGE_BIT;

#[test]
fn ownership_bits_follow_the_buffers_then_the_large_slots() {
    assert_eq!(owned_bit(0, 6, 2), Some((0, 1)));
    assert_eq!(owned_bit(5, 6, 2), Some((0, 1 << 5)));
    assert_eq!(owned_bit(6, 6, 2), None);
    assert_eq!(owned_bit(LARGE, 6, 2), Some((0, 1 << 6)));
    assert_eq!(owned_bit(LARGE | 1, 6, 2), Some((0, 1 << 7)));
    assert_eq!(owned_bit(LARGE | 2, 6, 2), None);
    assert_eq!(owned_bit(LARGE | 1, 64, 2), Some((1, 1 << 1)));
}

#[test]
fn the_first_reason_a_connection_stopped_wins() {
    let s = ConnShared::new(1);
    s.fail(FabricError::Protocol("x"));
    s.disconnect();
    s.close();
    assert_eq!(s.down(), Some(Down::Failed(FabricError::Protocol("x"))));
    assert!(matches!(
        s.down().map(Down::to_error),
        Some(Error::Fabric(FabricError::Protocol("x")))
    ));
    let s = ConnShared::new(2);
    s.disconnect();
    s.fail(FabricError::PeerClosed);
    assert_eq!(s.down(), Some(Down::Disconnected));
    assert!(matches!(
        s.down().map(Down::to_error),
        Some(Error::Disconnected)
    ));
}
