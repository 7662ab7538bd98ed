//! A hostile peer writes random bytes into the rings it shares with the engine (record headers
//! and payloads of its record ring, the consumer position of ours, the release ring's tail and
//! entries): the connection fails with a typed error (and an event), never a panic or a hang,
//! and the engine keeps serving other connections, during and after. (Wire-level fuzzing of
//! every field lives with the wire format's and the record ring's tests.)

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use cm::uds::{self, ConnParams};
use spinwire::fabric::shm::wire::{Dir, Params, Segment};
use spinwire::record::ring::{CONSUMER_POSITION_OFFSET, RING_HEADER_SIZE};
use spinwire::{Error, Event, FabricError};
use spinwire_testkit::data::XorShift;
use spinwire_testkit::engine::*;
use spinwire_testkit::{serial, WAIT};

const BUF: usize = 4096;
const COUNT: u32 = 16;

/// Connects to `ep` as a raw peer (side B) with the wire API and returns its segment handle
/// (proposing the engine's default large slots, as `rtc_engine` has them).
fn hostile_connect(ep: &str) -> (Segment, uds::UdsStream) {
    hostile_connect_large(
        ep,
        spinwire::DEFAULT_MAX_MESSAGE_SIZE as u32,
        spinwire::DEFAULT_LARGE_BUFFERS as u32,
    )
}

/// [`hostile_connect`] proposing `large_count` large slots of `large_size` bytes.
fn hostile_connect_large(ep: &str, large_size: u32, large_count: u32) -> (Segment, uds::UdsStream) {
    let name = ep.strip_prefix("shm://").unwrap();
    let t = Duration::from_secs(5);
    let params = ConnParams {
        buffer_size: BUF as u32,
        buffer_count: COUNT,
        ring_depth: COUNT,
        inline_max: 120,
        flags: 0,
        large_size,
        large_count,
    };
    let mut s = uds::connect(name, t).expect("uds connect");
    s.send_hello(&params, t).unwrap();
    let offer = s.recv_offer(t).unwrap();
    let p = Params {
        buffer_size: offer.params.buffer_size,
        buffer_count: offer.params.buffer_count,
        ring_depth: offer.params.ring_depth,
        inline_max: offer.params.inline_max,
        large_size: offer.params.large_size,
        large_count: offer.params.large_count,
    };
    let seg = Segment::attach(std::os::fd::AsFd::as_fd(&offer.segment), &p).expect("attach");
    s.send_ready(t).unwrap();
    (seg, s)
}

/// The engine's close mark on `seg` once it is there (bounded wait): 3 when it failed the
/// connection for a protocol violation (it blames the raw peer), 1 for a plain close.
fn close_mark(seg: &Segment) -> u32 {
    let deadline = Instant::now() + WAIT;
    loop {
        let code = seg.peer_close_code();
        if code != 0 {
            return code;
        }
        assert!(
            Instant::now() < deadline,
            "the engine never marked its side closed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The close mark of an engine side that blamed its peer for a protocol violation.
const ABORT_PROTOCOL: u32 = 3;

/// Writes `len` random bytes at `off` (byte-wise atomic stores: the engine reads concurrently).
fn scribble(seg: &Segment, rng: &mut XorShift, off: usize, len: usize) {
    let end = (off + len).min(seg.len());
    for o in off..end {
        // SAFETY: `o < seg.len()`: inside the live mapping; atomic byte stores, as the engine
        // side may read the same memory concurrently.
        let b = unsafe { &*(seg.as_ptr().add(o) as *const AtomicU8) };
        b.store(rng.next() as u8, Ordering::Relaxed);
    }
}

#[test]
fn random_bytes_in_the_peers_rings_fail_only_that_connection() {
    let _g = serial();
    let engine = rtc_engine(BUF, COUNT as usize);
    let ep = endpoint("corrupt");
    let listener = engine.listen(&ep).unwrap();
    let mut rng = XorShift::new(0x5eed_1234_abcd_ef01);
    // A healthy connection on the same engine, exercised every round: unaffected throughout.
    let healthy_peer = rtc_engine(BUF, COUNT as usize);
    let (hs, hc) = pair(&engine, &healthy_peer, &endpoint("corrupt-healthy"));
    let mut failed = 0;
    let rounds = 60;
    for round in 0..rounds {
        let (seg, _stream) = hostile_connect(&ep);
        let conn = listener.accept_timeout(WAIT).expect("accept");
        // Put a pooled buffer in flight (a BUF_REF) so the engine also reads the release ring.
        send_msg(&conn, round, BUF);
        let layout = *seg.layout();
        let incoming = layout.dir(Dir::BToA); // the peer writes, the engine reads
        let outgoing = layout.dir(Dir::AToB); // the peer consumes: position and release ring
        let area = incoming.ring + RING_HEADER_SIZE;
        let area_len = layout.ring_capacity();
        match round % 5 {
            // A random record header where the engine looks first.
            0 => scribble(&seg, &mut rng, area, 8),
            // Random bytes over a random span of records, then a random first header.
            1 => {
                let off = area + rng.index(area_len);
                let len = 1 + rng.index(area_len);
                scribble(&seg, &mut rng, off, len);
                scribble(&seg, &mut rng, area, 8);
            }
            // A random release-ring tail.
            2 => scribble(&seg, &mut rng, outgoing.rel_tail, 8),
            // One release entry with a random index (or one of a buffer never sent).
            3 => {
                scribble(&seg, &mut rng, outgoing.rel_entries, 4);
                let tail = outgoing.rel_tail;
                // SAFETY: `rel_tail` is an 8-aligned word inside the live mapping.
                let w =
                    unsafe { &*(seg.as_ptr().add(tail) as *const std::sync::atomic::AtomicU64) };
                w.store(2, Ordering::Release);
            }
            // A random consumer position of the engine's ring, and a random record header.
            _ => {
                scribble(&seg, &mut rng, outgoing.ring + CONSUMER_POSITION_OFFSET, 8);
                scribble(&seg, &mut rng, area, 8);
            }
        }
        // Drive the engine: receive, and send enough to need credits back.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut outcome = None;
        let mut seq = 1000;
        while Instant::now() < deadline && outcome.is_none() {
            match conn.try_recv() {
                Ok(Some(_garbage_but_bounded)) => {}
                Ok(None) => {}
                Err(e) => outcome = Some(e),
            }
            // Small and pooled sends in turn: the window and the pool run out, so the engine
            // reads the peer's consumer position and its release ring.
            if let Ok(mut b) = conn.alloc() {
                b.set_len(if seq % 2 == 0 { 8 } else { BUF }).unwrap();
                let _ = conn.send(b);
                seq += 1;
            }
            // Hold every free buffer and ask for one more: with the free list empty, `alloc`
            // reclaims from the peer's release ring.
            let held: Vec<_> = (0..=COUNT).map_while(|_| conn.alloc().ok()).collect();
            drop(held);
            engine.poll();
            std::thread::yield_now();
        }
        // The healthy connection is not affected.
        send_msg(&hc, round, 1 + round as usize * 61);
        recv_msg(&hs, round, 1 + round as usize * 61);
        let _ = seq;
        match outcome {
            Some(Error::Fabric(FabricError::Protocol(what))) => {
                assert!(!what.is_empty());
                failed += 1;
            }
            Some(Error::Fabric(FabricError::PeerClosed)) | Some(Error::Disconnected) => failed += 1,
            Some(e) => panic!("round {round}: unexpected error {e}"),
            None => {}
        }
        assert!(conn.try_recv().is_err() || outcome.is_none());
        let protocol = matches!(outcome, Some(Error::Fabric(FabricError::Protocol(_))));
        drop(conn);
        if protocol {
            // The raw peer learns why: the engine's close mark names the violation.
            assert_eq!(
                close_mark(&seg),
                ABORT_PROTOCOL,
                "round {round}: close mark"
            );
        }
        drop(seg);
    }
    // Random words almost never form a valid sequence/head/tail.
    assert!(
        failed >= rounds * 9 / 10,
        "only {failed} of {rounds} corruptions detected"
    );
    // Each failure produced an error event. The control thread emits them on its next tick or
    // when the application drops the failed connection, so they may still be on their way:
    // wait, bounded.
    let mut errors = 0;
    let deadline = Instant::now() + WAIT;
    while errors == 0 && Instant::now() < deadline {
        match engine.try_event() {
            Some(Event::Error {
                conn: Some(_),
                error: Error::Fabric(FabricError::Protocol(_)),
            }) => errors += 1,
            Some(_) => {}
            None => {
                engine.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    assert!(errors > 0, "no Protocol error event within {WAIT:?}");

    // The engine still serves healthy connections.
    let other = rtc_engine(BUF, COUNT as usize);
    let (s, c) = pair(&engine, &other, &endpoint("after-corrupt"));
    for seq in 0..100 {
        send_msg(&c, seq, 1 + seq as usize * 13);
        recv_msg(&s, seq, 1 + seq as usize * 13);
    }
}

/// Publishes one `BUF_REF` record (`buf`, `len`) at the start of the peer's record ring, as a
/// peer writing its own records would: payload first, then the header word with `Release`.
fn publish_buf_ref(seg: &Segment, buf: u32, len: u32) {
    let area = seg.layout().dir(Dir::BToA).ring + RING_HEADER_SIZE;
    // SAFETY: `area .. area + 16` is the first record of the peer's (our) ring, 8-aligned and
    // inside the live mapping; the engine reads it concurrently, so atomic stores.
    unsafe {
        let word =
            |off: usize| &*(seg.as_ptr().add(area + off) as *const std::sync::atomic::AtomicU64);
        word(8).store(u64::from(buf) | u64::from(len) << 32, Ordering::Relaxed);
        // Header: len 16 (header + payload), type 2 (BUF_REF), flags 0, aux 0.
        word(0).store(16 | 2 << 32, Ordering::Release);
    }
}

#[test]
fn a_hostile_large_slot_reference_fails_only_that_connection() {
    let _g = serial();
    const LARGE: u32 = 1 << 20;
    let engine = rtc_builder(BUF, COUNT as usize)
        .max_message_size(LARGE as usize)
        .large_buffers(2)
        .build()
        .expect("engine");
    let ep = endpoint("corrupt-large");
    let listener = engine.listen(&ep).unwrap();
    let healthy_peer = rtc_builder(BUF, COUNT as usize)
        .max_message_size(LARGE as usize)
        .large_buffers(2)
        .build()
        .expect("engine");
    let (hs, hc) = pair(&engine, &healthy_peer, &endpoint("corrupt-large-healthy"));
    let bit = spinwire::LARGE_BIT;
    // A valid reference first (the raw write is a real record), then the bogus ones.
    let cases: [(u32, u32, Option<&str>); 4] = [
        (bit, 100_000, None),
        (bit | 2, 100, Some("slot out of range")),
        (bit | 1, LARGE + 64, Some("length past the slot")),
        (bit | 0x7fff, 8, Some("slot far out of range")),
    ];
    for (round, (buf, len, bad)) in cases.into_iter().enumerate() {
        let (seg, _stream) = hostile_connect_large(&ep, LARGE, 2);
        let conn = listener.accept_timeout(WAIT).expect("accept");
        publish_buf_ref(&seg, buf, len);
        let deadline = Instant::now() + WAIT;
        let outcome = loop {
            match conn.try_recv() {
                Ok(Some(m)) => break Ok(m.len()),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
            assert!(Instant::now() < deadline, "case {round}: no outcome");
            std::thread::sleep(Duration::from_millis(1));
        };
        match (bad, outcome) {
            (None, Ok(n)) => assert_eq!(n, len as usize),
            (Some(_), Err(Error::Fabric(FabricError::Protocol(what)))) => assert!(!what.is_empty()),
            (what, other) => panic!("case {round} ({what:?}): {other:?}"),
        }
        // The other connection of the same engine is unaffected.
        send_msg(&hc, round as u32, 1000 + round);
        recv_msg(&hs, round as u32, 1000 + round);
        drop(conn);
        // The raw peer learns how the engine closed: blaming it for a bad reference, plainly
        // after a good one.
        let want = if bad.is_some() { ABORT_PROTOCOL } else { 1 };
        assert_eq!(close_mark(&seg), want, "case {round}: close mark");
        drop(seg);
    }
}
