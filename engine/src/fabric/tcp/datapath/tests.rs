//! Unit tests of the TCP data path's sizing, large-record headers and lent descriptors.

use super::*;
use core::mem::MaybeUninit;

use crate::desc::RxDesc;
use crate::fabric::{FabricConn, RxSink};
use crate::record;

use super::large::large_data;
use super::recv::MIN_CHUNK;

#[test]
fn receive_chunks_hold_two_whole_records_and_one_more_than_the_buffers() {
    assert_eq!(rx_chunks(4096, 256), Some((MIN_CHUNK, 257)));
    assert_eq!(rx_chunks(8, 1), Some((MIN_CHUNK, 2)));
    let (chunk, n) = rx_chunks(40_000, 8).unwrap();
    assert_eq!(n, 9);
    assert!(chunk >= 2 * record::record_size(40_000).unwrap() && chunk % 64 == 0);
    let (chunk, _) = rx_chunks(1 << 20, 4).unwrap();
    assert_eq!(
        chunk,
        (2 * ((1 << 20) + RECORD_HEADER)).next_multiple_of(64)
    );
}

#[test]
fn large_headers_are_recognised_and_checked_against_the_limit() {
    let h = |payload: usize, ty: u8| {
        let mut b = [0u8; 8];
        b[0..4].copy_from_slice(&((RECORD_HEADER + payload) as u32).to_le_bytes());
        b[4] = ty;
        b
    };
    let data = RecordType::Data as u8;
    assert_eq!(
        large_data(&h(100, data), 1000, 5000),
        Ok(None),
        "lent in place"
    );
    assert_eq!(
        large_data(&h(1000, data), 1000, 5000),
        Ok(None),
        "the lend limit"
    );
    assert_eq!(large_data(&h(1001, data), 1000, 5000), Ok(Some(1001)));
    assert_eq!(
        large_data(&h(5000, data), 1000, 5000),
        Ok(Some(5000)),
        "the limit"
    );
    assert!(
        large_data(&h(5001, data), 1000, 5000).is_err(),
        "above the limit"
    );
    assert_eq!(
        large_data(&h(5001, data)[..7], 1000, 5000),
        Ok(None),
        "partial header"
    );
    let credit = RecordType::Credit as u8;
    assert_eq!(
        large_data(&h(5001, credit), 1000, 5000),
        Ok(None),
        "the reader's"
    );
    let mut reserved = h(2000, data);
    reserved[7] = 1;
    assert!(large_data(&reserved, 1000, 5000).is_err(), "reserved bytes");
}

#[test]
fn pooled_descriptors_carry_their_offset_and_the_sink_checks_the_bounds() {
    let mut mem = vec![0u8; 4 * 256];
    // SAFETY: `mem` holds 4 buffers of 256 bytes and outlives the view.
    let pool = unsafe { PoolView::new(std::ptr::NonNull::new(mem.as_mut_ptr()).unwrap(), 256, 4) };
    let mut slots = [MaybeUninit::<RxDesc>::uninit(); 4];
    let mut sink = RxSink::new(&mut slots, &mut [], &pool);
    sink.push_pooled_at(3, 200, 56).unwrap();
    sink.push_pooled(1, 256).unwrap();
    assert!(
        sink.push_pooled_at(0, 200, 57).is_err(),
        "past the buffer end"
    );
    assert!(sink.push_pooled_at(0, u32::MAX, 2).is_err(), "no overflow");
    assert!(sink.push_pooled_at(4, 0, 1).is_err(), "buffer out of range");
    assert_eq!(sink.written(), 2);
    // SAFETY: the sink initialised the first two slots.
    let (a, b) = unsafe { (slots[0].assume_init(), slots[1].assume_init()) };
    assert_eq!((a.buf(), a.offset(), a.len()), (Some(3), 200, 56));
    assert_eq!((b.buf(), b.offset(), b.len()), (Some(1), 0, 256));
}

fn sizes(depth: usize, peer_depth: usize, rx_window: usize, peer_window: usize) -> ConnSizes {
    ConnSizes {
        copy_max: 64,
        depth,
        peer_depth,
        rx_window,
        peer_window,
        app_bytes: true,
        batch: 128,
        liveness: Duration::ZERO,
        max_payload: 4096,
    }
}

/// A `CREDIT` record's payload: cumulative messages (low half) and bytes (high half).
fn credit(msgs: u64, bytes: u64) -> u64 {
    ((bytes as u32 as u64) << 32) | msgs as u32 as u64
}

const BAD_CREDIT: FabricError =
    FabricError::Protocol("tcp credit count goes backwards or exceeds what was sent");

#[test]
fn credits_are_validated_counted_for_the_engine_and_returned_by_either_window() {
    let mut f = Flow::new(&sizes(8, 4, 1 << 10, 1 << 10));
    // Three 8-byte messages: 16-byte records.
    for _ in 0..3 {
        assert!(f.has_room(8));
        f.on_sent(8);
    }
    f.on_credit(credit(2, 32)).unwrap();
    f.on_credit(credit(2, 32)).unwrap();
    assert_eq!(
        f.unreported, 2,
        "a repeated cumulative count credits nothing"
    );
    assert_eq!(f.send.in_flight(), 16);
    assert_eq!(f.on_credit(credit(1, 16)), Err(BAD_CREDIT), "backwards");
    assert_eq!(
        f.on_credit(credit(4, 64)),
        Err(BAD_CREDIT),
        "more than sent"
    );
    assert_eq!(f.on_credit(credit(3, 56)), Err(BAD_CREDIT), "bytes beyond");
    assert_eq!(
        f.on_credit(credit(3, 32)),
        Err(BAD_CREDIT),
        "a message without bytes"
    );
    assert_eq!(
        f.on_credit(credit(2, 48)),
        Err(BAD_CREDIT),
        "bytes without a message"
    );
    assert_eq!(f.unreported, 2);
    f.on_credit(credit(3, 48)).unwrap();
    assert_eq!((f.unreported, f.send.in_flight()), (3, 0));
    // Receiving: the peer's depth 4 returns after 2 messages, our 1-KiB window after 512
    // bytes, whichever comes first; sooner with data going out.
    f.on_consumed(8);
    assert!(!f.credit_due(false));
    assert!(f.credit_due(true));
    f.on_consumed(8);
    assert!(f.credit_due(false), "half the peer's message window");
    assert_eq!(f.take_credit(), credit(2, 32));
    assert!(!f.credit_due(true));
    f.on_consumed(600);
    assert!(f.credit_due(false), "half our byte window");
    assert_eq!(f.take_credit(), credit(3, 32 + 608));
}

/// The counts wrap at 2^32 in the record and the sender recovers them from its own.
#[test]
fn credit_counts_survive_the_wrap() {
    let mut tx = Flow::new(&sizes(1 << 16, 1 << 16, 1 << 20, 1 << 20));
    let mut rx = Flow::new(&sizes(1 << 16, 1 << 16, 1 << 20, 1 << 20));
    let len = 4000; // 4008-byte records: past 2^32 bytes after about 1.07 M of them
    for round in 0..5000u64 {
        for _ in 0..256 {
            assert!(tx.has_room(len), "round {round}");
            tx.on_sent(len);
            rx.on_consumed(len);
        }
        let c = rx.take_credit();
        tx.on_credit(c).expect("an honest count, wrapped or not");
        assert_eq!(tx.send.in_flight(), 0);
    }
    assert!(tx.send.credited() > 1 << 32, "the byte count wrapped");
    assert_eq!(tx.unreported, 5000 * 256);
}

/// The byte window, not the message count, stops a stream of small messages: a sender with
/// the default window and depth stops after the window's worth of records.
#[test]
fn the_byte_window_bounds_small_messages_and_defaults_follow_it() {
    let w = rx_window(MIN_CHUNK);
    assert_eq!(w, 1 << 20);
    let depth = depth_for(128, false, w);
    assert_eq!(depth, 65536, "one message per 16-byte record of the window");
    assert_eq!(depth_for(64, true, w), 64, "a depth set is kept");
    let mut f = Flow::new(&sizes(depth, depth, w, w));
    let mut n = 0;
    while f.has_room(64) {
        f.on_sent(64);
        n += 1;
    }
    assert_eq!(n, w / 72, "64-byte messages: 72-byte records");
}

/// A receiver that only ever takes messages (run-to-completion's direct receive: `poll_rx`, no
/// pass, no `flush`) writes its `CREDIT` record as soon as half its byte window is owed, from
/// `poll_rx` itself: else its sender waits for a pass that runs only once the receiver finds
/// nothing. Deterministic: nothing but `poll_rx` runs on the receiver, and the peer reads the
/// record with a timeout.
#[test]
fn poll_rx_writes_the_credit_once_half_the_window_is_owed() {
    use std::io::{Read, Write};

    const LEN: usize = 64;
    const RECORD: usize = RECORD_HEADER + LEN;
    let window = rx_window(MIN_CHUNK);
    let half = (window / 2).div_ceil(RECORD);
    let (mut conn, peer) = loopback_conn(window);

    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut w = &peer;
            let mut rec = [0u8; RECORD];
            rec[..8].copy_from_slice(&header(RecordType::Data, LEN));
            for _ in 0..half {
                w.write_all(&rec).unwrap();
            }
        });
        // Take exactly `half` messages, one per `poll_rx`, and nothing else.
        let mut slot = [MaybeUninit::<RxDesc>::uninit()];
        let rx_pool = conn.rx.rx_pool;
        let mut got = 0;
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while got < half {
            assert!(std::time::Instant::now() < end, "{got} of {half} arrived");
            let mut sink = RxSink::new(&mut slot, &mut [], &rx_pool);
            got += conn.poll_rx(&mut sink).unwrap();
        }
        writer.join().unwrap();
    });
    let mut rec = [0u8; 16];
    (&peer)
        .read_exact(&mut rec)
        .expect("the CREDIT record, written by poll_rx without a flush");
    assert_eq!(rec[..8], header(RecordType::Credit, 8));
    assert_eq!(
        u64::from_le_bytes(rec[8..].try_into().unwrap()),
        credit(half as u64, (half * RECORD) as u64)
    );
}

/// What `rx_pending` remembers of the last `recv`: a short one (fewer bytes than asked: the
/// socket was empty right then) once, so that no `recv` that can only return `EAGAIN` follows a
/// message; an `EAGAIN` not at all, so that a spinning run-to-completion receiver's every
/// direct look asks the socket (its cycle, which would ask too, runs only after every 8th
/// empty look; remembering the `EAGAIN` made every other look skip its `recv`).
#[test]
fn rx_pending_remembers_a_short_recv_once_and_an_empty_one_not() {
    use std::io::Write;

    let (mut conn, peer) = loopback_conn(rx_window(MIN_CHUNK));
    let mut slot = [MaybeUninit::<RxDesc>::uninit()];
    let rx_pool = conn.rx.rx_pool;

    for asked in 1..=2 {
        assert!(conn.rx_pending(), "an empty socket is asked again");
        let mut sink = RxSink::new(&mut slot, &mut [], &rx_pool);
        assert_eq!(conn.poll_rx(&mut sink).unwrap(), 0);
        assert_eq!(conn.recvs, asked, "one recv per look, each finding nothing");
    }

    let mut rec = [0u8; RECORD_HEADER + 8];
    rec[..8].copy_from_slice(&header(RecordType::Data, 8));
    (&peer).write_all(&rec).unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let mut got = 0;
    while got == 0 {
        assert!(std::time::Instant::now() < end, "the message never arrived");
        let mut sink = RxSink::new(&mut slot, &mut [], &rx_pool);
        got = conn.poll_rx(&mut sink).unwrap();
    }
    assert_eq!(got, 1);
    assert!(
        !conn.rx_pending(),
        "the short recv that brought it left the socket empty"
    );
    assert!(
        conn.rx_pending(),
        "said once only: the socket is asked again next"
    );
}

/// A `TcpConn` over one end of a loopback socket pair (non-blocking, small pools, window
/// `window`), and the peer's blocking end (10-s read timeout).
fn loopback_conn(window: usize) -> (TcpConn, std::net::TcpStream) {
    use std::net::{TcpListener, TcpStream};

    let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (sock, _) = listener.accept().unwrap();
    sock.set_nonblocking(true).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();

    let (buf_size, buffers) = (4096, 4);
    let (chunk, chunks) = rx_chunks(buf_size, buffers).unwrap();
    let mut tx_mem = vec![0u64; buf_size * buffers / 8];
    let mut rx_mem = vec![0u64; chunk * chunks as usize / 8];
    // SAFETY: each view covers its vector (`count * buf_size` bytes), whose heap buffer stays
    // where it is (and alive) while the connection holds it in `_pools`.
    let views = unsafe {
        crate::link::Pools::small(
            PoolView::new(
                std::ptr::NonNull::new(tx_mem.as_mut_ptr().cast()).unwrap(),
                buf_size,
                buffers as u32,
            ),
            PoolView::new(
                std::ptr::NonNull::new(rx_mem.as_mut_ptr().cast()).unwrap(),
                chunk,
                chunks,
            ),
        )
    };
    let depth = depth_for(128, false, window);
    let conn = TcpConn::new(
        Arc::new(sock),
        Arc::new((tx_mem, rx_mem)),
        views,
        ConnSizes {
            max_payload: buf_size,
            ..sizes(depth, depth, window, window)
        },
    );
    (conn, peer)
}
