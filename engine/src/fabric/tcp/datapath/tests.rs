//! Unit tests of the TCP data path's sizing, large-record headers and lent descriptors.

use super::*;
use core::mem::MaybeUninit;

use crate::desc::RxDesc;
use crate::fabric::RxSink;
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

#[test]
fn credits_are_validated_counted_for_the_engine_and_returned_by_the_peers_depth() {
    let sizes = ConnSizes {
        copy_max: 64,
        depth: 8,
        peer_depth: 4,
        liveness: Duration::ZERO,
        max_payload: 4096,
    };
    let mut f = Flow::new(&sizes);
    f.send.on_sent(3);
    f.on_credit(2).unwrap();
    f.on_credit(2).unwrap();
    assert_eq!(
        f.unreported, 2,
        "a repeated cumulative count credits nothing"
    );
    assert_eq!(
        f.on_credit(1),
        Err(FabricError::Protocol(
            "tcp credit count goes backwards or exceeds the messages sent"
        ))
    );
    assert!(f.on_credit(4).is_err(), "more than was sent");
    assert_eq!(f.unreported, 2);
    // The peer's depth 4: credits go back alone once 2 are owed, sooner with data.
    f.recv.on_consumed(1);
    assert!(!f.recv.due(false));
    assert!(f.recv.due(true));
    f.recv.on_consumed(1);
    assert!(f.recv.due(false));
    assert_eq!(f.recv.take(), 2);
    assert!(!f.recv.due(true));
}
