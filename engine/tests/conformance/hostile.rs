//! Hostile bytes, where the fabric reads bytes: a raw peer that completed the handshake writes
//! random bytes where records go. Its connection fails with a typed error (never a panic, a
//! hang or a message made of garbage), and a healthy connection through the same listener is
//! unaffected, during and after.

use std::time::Instant;

use spinwire::{Error, FabricError};
use spinwire_testkit::engine::*;
use spinwire_testkit::WAIT;

use super::Scheme;

pub fn bytes_fail_only_their_connection(s: &'static Scheme) {
    let hostile = s
        .hostile
        .expect("a scheme without a hostile peer lists this case in its skips");
    let engine = s.build(s.rtc());
    let ep = (s.endpoint)("hostile");
    let listener = engine.listen(&ep).unwrap();
    // A healthy connection through the same listener, its peer on another engine.
    let peer = s.build(s.rtc());
    let good_c = peer.connect_timeout(&ep, WAIT).unwrap();
    let good_s = listener.accept_timeout(WAIT).unwrap();

    for seed in 1..=8u64 {
        let (conn, raw) = hostile(&engine, &listener, &ep, seed);
        let deadline = Instant::now() + WAIT;
        let err = loop {
            // A record that happens to be well-formed may arrive; it is never larger than the
            // connection allows. The rest fails the connection.
            match conn.recv_timeout(WAIT) {
                Ok(m) => assert!(m.len() <= conn.max_message_size(), "seed {seed}"),
                Err(e) => break e,
            }
            assert!(Instant::now() < deadline, "seed {seed}: no failure");
        };
        assert!(
            matches!(
                err,
                Error::Fabric(FabricError::Protocol(_)) | Error::Disconnected
            ),
            "seed {seed}: a typed failure, got {err:?}"
        );
        assert!(!conn.is_open(), "seed {seed}");
        drop(raw);
        // The healthy connection carries traffic both ways in between.
        for seq in 0..10u32 {
            send_msg(&good_c, seq, 1 + seq as usize * 300);
            recv_msg(&good_s, seq, 1 + seq as usize * 300);
            send_msg(&good_s, seq, 1 + seq as usize);
            recv_msg(&good_c, seq, 1 + seq as usize);
        }
    }
    assert!(good_c.is_open() && good_s.is_open());
}

/// A raw peer that completes the handshake and sends part of a record, then goes silent (its
/// socket open), is reported unresponsive after the liveness timeout, as a peer silent between
/// records is: a partial record is read on, so its silence counts. (Before, such a connection
/// stayed open for 10-18 s and more.) The bound here is a hang detector (the timeout plus the
/// scheme's death bound); how soon within the timeout + 20 % is the soak's measurement.
pub fn silent_mid_record_is_unresponsive(s: &'static Scheme) {
    let half_record = s
        .half_record
        .expect("a scheme without half-sent records lists this case in its skips");
    let engine = s.build(s.rtc().liveness_timeout(s.liveness));
    let ep = (s.endpoint)("mid-record");
    let listener = engine.listen(&ep).unwrap();
    let (conn, raw) = half_record(&engine, &listener, &ep);
    let sent = Instant::now();
    let err = match conn.recv_timeout(WAIT) {
        Ok(m) => panic!("a message of {} bytes from part of a record", m.len()),
        Err(e) => e,
    };
    let seen = sent.elapsed();
    let Error::Fabric(FabricError::PeerUnresponsive { silent_for }) = err else {
        panic!("expected PeerUnresponsive, got {err:?}");
    };
    assert!(silent_for >= s.liveness, "silent_for {silent_for:?}");
    let limit = s.liveness + s.death_bound;
    assert!(seen <= limit, "reported after {seen:?} (limit {limit:?})");
    assert!(!conn.is_open());
    drop(raw);
}
