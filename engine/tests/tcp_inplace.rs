//! The `tcp://` receive path reads messages in place, in the connection's receive chunks: held
//! messages stay intact while the stream moves through the chunks (a chunk is reused only once
//! every message lent from it was dropped), records split at any byte, or across a chunk's end,
//! arrive whole and in order, and the number of lent messages is bounded by the pool. Loopback
//! only.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, Message};
use spinwire_testkit::data::{fill, verify, XorShift as Rng};
use spinwire_testkit::engine::*;
use spinwire_testkit::{serial, WAIT};

fn ep4() -> (String, String) {
    let l = TcpListener::bind(("127.0.0.1", 0)).expect("port");
    let port = l.local_addr().unwrap().port();
    (
        format!("tcp://127.0.0.1:{port}"),
        format!("127.0.0.1:{port}"),
    )
}

/// Receives one message, driving `engine` (run to completion) until it comes.
fn recv<'c>(engine: &Engine, conn: &'c Connection) -> Message<'c> {
    let deadline = Instant::now() + WAIT;
    loop {
        engine.poll();
        match conn.try_recv() {
            Ok(Some(m)) => return m,
            Ok(None) => {}
            Err(e) => panic!("recv: {e:?}"),
        }
        assert!(Instant::now() < deadline, "no message within {WAIT:?}");
        std::thread::yield_now();
    }
}

/// Mixed sizes (inline, pooled, above the big-record threshold, the maximum) while the receiver
/// holds up to `buffers - 1` messages at a time: every held message is verified again when it
/// is dropped, so a chunk reused while something is lent from it would show.
#[test]
fn held_messages_of_mixed_sizes_stay_intact_across_chunks() {
    let _g = serial();
    const BUF: usize = 40_000;
    const BUFFERS: usize = 8;
    const N: u32 = 3_000;
    let (ep, _) = ep4();
    let server = rtc_builder(BUF, BUFFERS).depth(BUFFERS).build().unwrap();
    let l = server.listen(&ep).unwrap();
    let sender = std::thread::spawn({
        let ep = ep.clone();
        move || {
            let client = rtc_builder(BUF, BUFFERS).depth(BUFFERS).build().unwrap();
            let c = client.connect_timeout(&ep, WAIT).expect("connect");
            let mut rng = Rng::new(7);
            for seq in 0..N {
                send_msg(&c, seq, size(&mut rng));
            }
            // Until the receiver has everything (it closes first).
            let end = Instant::now() + Duration::from_secs(60);
            while c.is_open() && Instant::now() < end {
                client.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let s = l.accept_timeout(WAIT).expect("accept");
    let mut rng = Rng::new(7);
    let mut hold_rng = Rng::new(99);
    let mut held: VecDeque<(Message<'_>, u32, usize)> = VecDeque::new();
    for seq in 0..N {
        let len = size(&mut rng);
        let m = recv(&server, &s);
        verify(&m, seq, len);
        held.push_back((m, seq, len));
        // Hold a varying number, up to BUFFERS - 1 (the pool bounds what may be lent).
        let keep = hold_rng.index(BUFFERS);
        while held.len() > keep {
            let (m, seq, len) = held.pop_front().unwrap();
            verify(&m, seq, len);
            drop(m);
        }
    }
    for (m, seq, len) in held.drain(..) {
        verify(&m, seq, len);
    }
    drop(held);
    assert_eq!(s.stats().received, u64::from(N));
    drop(s);
    server.poll();
    sender.join().unwrap();
}

/// Sizes: a quarter inline (< 121 B), the rest pooled up to the maximum, some above 16 KiB.
fn size(rng: &mut Rng) -> usize {
    match rng.index(8) {
        0 | 1 => 1 + rng.index(120),
        2 => 40_000,
        3 | 4 => 16_000 + rng.index(24_000),
        _ => 121 + rng.index(6_000),
    }
}

/// A hello as a spinwire connector sends it (see `fabric/tcp/setup.rs`).
fn hello(buffer_size: u32, depth: u32) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[0..4].copy_from_slice(b"SPWT");
    b[4] = spinwire::fabric::tcp::WIRE_VERSION;
    // The byte window (version 2): 64 KiB.
    b[24..28].copy_from_slice(&(64u32 << 10).to_le_bytes());
    b[8..12].copy_from_slice(&buffer_size.to_le_bytes());
    b[12..16].copy_from_slice(&depth.to_le_bytes());
    b
}

/// A DATA record of frame `seq` ([`fill`]) of `len` bytes, padded to 8.
fn data_record(seq: u32, len: usize) -> Vec<u8> {
    let mut r = Vec::with_capacity(len + 16);
    r.extend_from_slice(&((8 + len) as u32).to_le_bytes());
    r.extend_from_slice(&[1, 0, 0, 0]);
    let start = r.len();
    r.resize(start + len, 0);
    fill(&mut r[start..], seq);
    r.resize(r.len() + (8 - len % 8) % 8, 0);
    r
}

/// A raw peer writes DATA records cut at every kind of place: one byte at a time (the header
/// too), in pieces of odd sizes, and in writes larger than a receive chunk (64 KiB here), so that
/// records straddle chunk ends and are moved. The engine delivers each one whole, in order,
/// while the application holds some of them.
#[test]
fn records_split_anywhere_and_across_chunk_ends_arrive_whole_and_in_order() {
    let _g = serial();
    const BUF: usize = 4096;
    const DEPTH: u32 = 16;
    let (ep, addr) = ep4();
    let engine = rtc_builder(BUF, 16).depth(16).build().unwrap();
    let l = engine.listen(&ep).unwrap();
    let mut raw = TcpStream::connect(&addr).unwrap();
    raw.set_nodelay(true).unwrap();
    raw.set_read_timeout(Some(WAIT)).unwrap();
    raw.write_all(&hello(BUF as u32, DEPTH)).unwrap();
    let deadline = Instant::now() + WAIT;
    let conn = loop {
        engine.poll();
        if let Some(c) = l.try_accept().unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline, "accept");
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut reply = [0u8; 32];
    raw.read_exact(&mut reply).unwrap();
    assert_eq!(reply[5], 0, "accepted");
    // The engine's credit records come back on `raw`; nobody reads them (a few hundred bytes).

    let mut rng = Rng::new(3);
    let mut seq = 0u32;
    let mut held: VecDeque<(Message<'_>, u32, usize)> = VecDeque::new();
    for batch in 0..40 {
        // At most DEPTH messages per batch (the credits this peer was granted), all received
        // before the next batch.
        let lens: Vec<usize> = (0..DEPTH)
            .map(|_| match rng.index(4) {
                0 => 1 + rng.index(120),
                1 => BUF,
                _ => 121 + rng.index(BUF - 121),
            })
            .collect();
        let mut bytes = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            bytes.extend_from_slice(&data_record(seq + i as u32, len));
        }
        let mut at = 0;
        while at < bytes.len() {
            let piece = match batch % 4 {
                0 => 1,
                1 => 1 + rng.index(13),
                2 => 1 + rng.index(5000),
                _ => bytes.len() - at,
            }
            .min(bytes.len() - at);
            raw.write_all(&bytes[at..at + piece]).unwrap();
            at += piece;
            if batch % 4 != 3 {
                // Let the engine read what is there (often a partial record).
                engine.poll();
            }
        }
        for &len in &lens {
            let m = recv(&engine, &conn);
            verify(&m, seq, len);
            held.push_back((m, seq, len));
            seq += 1;
            while held.len() > rng.index(8) {
                let (m, s, len) = held.pop_front().unwrap();
                verify(&m, s, len);
            }
        }
    }
    for (m, s, len) in held.drain(..) {
        verify(&m, s, len);
    }
    assert_eq!(conn.stats().received, u64::from(seq));
    assert!(conn.is_open());
}
