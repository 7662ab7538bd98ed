//! The liveness timeout's configuration. Its behaviour, a SIGSTOPped peer reported as
//! `PeerUnresponsive` within the timeout over every scheme, is the conformance suite's
//! (`conformance/peer.rs`: `<scheme>::peer_sigstop_*`).

use std::time::Duration;

use spinwire::{Engine, Error};

#[test]
fn liveness_timeout_is_validated() {
    let too_short = Engine::builder()
        .liveness_timeout(Duration::from_millis(5))
        .build();
    assert!(matches!(too_short, Err(Error::Config(_))));
    // Zero turns liveness off; the minimum is accepted.
    Engine::builder()
        .liveness_timeout(Duration::ZERO)
        .build()
        .unwrap();
    Engine::builder()
        .liveness_timeout(spinwire::MIN_LIVENESS_TIMEOUT)
        .build()
        .unwrap();
}
