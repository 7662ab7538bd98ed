//! The sink's unit tests: packing, slots and the bounds it checks.

use super::*;
use crate::desc::packed_entry;

/// The messages of the first `slots` descriptors, unpacked as the application does.
fn messages(slots: &[MaybeUninit<RxDesc>]) -> Vec<Result<Vec<u8>, u32>> {
    let mut out = Vec::new();
    for s in slots {
        // SAFETY: the caller passes slots a sink wrote.
        let d = unsafe { s.assume_init_ref() };
        match d.buf {
            BUF_INLINE => out.push(Ok(d.data[..d.len()]
                .iter()
                // SAFETY: an inline descriptor's first `len` bytes are initialised.
                .map(|b| unsafe { b.assume_init() })
                .collect())),
            BUF_PACKED => {
                let (mut left, mut next) = (0, 0);
                loop {
                    // SAFETY: a packed descriptor, its cursor as the earlier calls left it.
                    let (src, len, last) = unsafe { packed_entry(d, &mut left, &mut next) };
                    // SAFETY: `packed_entry` points at `len` initialised bytes of `data`.
                    out.push(Ok(
                        unsafe { std::slice::from_raw_parts(src, len as usize) }.to_vec()
                    ));
                    if last {
                        break;
                    }
                }
            }
            buf => out.push(Err(buf)),
        }
    }
    out
}

fn msg(len: usize, tag: u8) -> Vec<u8> {
    (0..len).map(|i| tag ^ i as u8).collect()
}

/// `m` pushed with `push_inline_with`, its `fill` writing every byte.
fn push_with(sink: &mut RxSink<'_>, m: &[u8]) -> Result<(), FabricError> {
    sink.push_inline_with(m.len(), |d| {
        for (d, s) in d.iter_mut().zip(m) {
            d.write(*s);
        }
        Ok(m.len())
    })
}

#[test]
fn packing_shares_slots_in_order_and_a_pooled_message_or_a_full_slot_starts_a_new_one() {
    let mut mem = vec![0u8; 4 * 256];
    // SAFETY: `mem` holds 4 buffers of 256 bytes and outlives the view.
    let pool = unsafe { PoolView::new(core::ptr::NonNull::new(mem.as_mut_ptr()).unwrap(), 256, 4) };
    let mut slots = [MaybeUninit::<RxDesc>::uninit(); 4];
    let mut scratch = MaybeUninit::uninit();
    let mut sink = RxSink::new(&mut slots, &mut [], &pool).packing(&mut scratch);
    let mut want = Vec::new();
    // 8 + (2 + 8) * 2 + 2 + (2 + 17) = 49 bytes: one slot.
    for (i, len) in [8, 8, 8, 0, 17].into_iter().enumerate() {
        let m = msg(len, i as u8);
        sink.push_inline(&m).unwrap();
        want.push(Ok(m));
    }
    assert_eq!((sink.written(), sink.slots(), sink.room()), (5, 1, 3));
    // 49 + 2 + 100 > INLINE_MAX: a slot of its own, written by `fill`.
    let m = msg(100, 5);
    push_with(&mut sink, &m).unwrap();
    want.push(Ok(m));
    // A `fill` that comes up short changes nothing, packed or not.
    assert!(sink.push_inline_with(10, |_| Ok(9)).is_err());
    assert_eq!((sink.written(), sink.slots()), (6, 2));
    let m = msg(18, 6);
    push_with(&mut sink, &m).unwrap();
    want.push(Ok(m));
    assert_eq!((sink.written(), sink.slots()), (7, 2), "100 + 2 + 18 fits");
    // A pooled message takes a slot, and nothing packs after it into that slot.
    sink.push_pooled(2, 64).unwrap();
    want.push(Err(2));
    let m = msg(8, 7);
    sink.push_inline(&m).unwrap();
    want.push(Ok(m));
    assert_eq!((sink.written(), sink.slots(), sink.room()), (9, 4, 0));
    // No slot left, but room in the last one: still delivered.
    let m = msg(3, 8);
    sink.push_inline(&m).unwrap();
    want.push(Ok(m));
    assert!(sink.push_inline(&[0; 120]).is_err(), "no slot, no room");
    assert_eq!((sink.written(), sink.slots()), (10, 4));
    sink.finish();
    assert_eq!(messages(&slots), want);
}

#[test]
fn without_packing_every_message_has_its_slot() {
    let mut mem = vec![0u8; 256];
    // SAFETY: `mem` holds 1 buffer of 256 bytes and outlives the view.
    let pool = unsafe { PoolView::new(core::ptr::NonNull::new(mem.as_mut_ptr()).unwrap(), 256, 1) };
    let mut slots = [MaybeUninit::<RxDesc>::uninit(); 3];
    let mut sink = RxSink::new(&mut slots, &mut [], &pool);
    for i in 0..3 {
        sink.push_inline(&msg(8, i)).unwrap();
    }
    assert!(sink.push_inline(&msg(8, 3)).is_err(), "full");
    assert_eq!((sink.written(), sink.slots(), sink.room()), (3, 3, 0));
    let want: Vec<_> = (0..3).map(|i| Ok(msg(8, i))).collect();
    assert_eq!(messages(&slots), want);
}

/// A slot's header, `(len, buf)`, as the ring holds it now.
fn header(slot: *const MaybeUninit<RxDesc>) -> (u32, u32) {
    // SAFETY: the caller passes a slot of an initialised array (the test's), which the sink
    // may also write (through its own raw pointers, never while this reads).
    let d = unsafe { (*slot).assume_init_ref() };
    (d.len, d.buf)
}

#[test]
fn a_packing_sink_writes_a_first_message_at_once_and_what_packs_after_it_when_the_slot_is_done() {
    let mut mem = vec![0u8; 2 * 256];
    // SAFETY: `mem` holds 2 buffers of 256 bytes and outlives the view.
    let pool = unsafe { PoolView::new(core::ptr::NonNull::new(mem.as_mut_ptr()).unwrap(), 256, 2) };
    let blank = MaybeUninit::new(RxDesc {
        len: 0xdead_beef,
        buf: 0xdead_beef,
        data: [MaybeUninit::new(0xAA); INLINE_MAX],
    });
    let mut slots = [blank; 3];
    let mut scratch = MaybeUninit::uninit();
    let mut sink = RxSink::new(&mut slots, &mut [], &pool).packing(&mut scratch);
    // The ring's slots, seen through the sink's own pointer to them (its first run).
    let base = sink.first.cast_const();
    let slot = |k: usize| base.wrapping_add(k);
    let mut want = Vec::new();
    let m = msg(8, 0);
    sink.push_inline(&m).unwrap();
    want.push(Ok(m));
    // A lone message is in its slot at once, written as without packing.
    assert_eq!(header(slot(0)), (8, BUF_INLINE));
    for i in 1..3 {
        let m = msg(8, i);
        sink.push_inline(&m).unwrap();
        want.push(Ok(m));
    }
    // The two packed behind it are not written in place while the slot is being packed.
    assert_eq!(header(slot(0)), (8, BUF_INLINE), "packed in place");
    // A pooled message ends the slot: it is written out, with the two.
    sink.push_pooled(1, 100).unwrap();
    want.push(Err(1));
    assert_eq!(header(slot(0)), (8 | 2 << 16, BUF_PACKED));
    assert_eq!(header(slot(1)), (100, 1));
    let m = msg(20, 9);
    push_with(&mut sink, &m).unwrap();
    want.push(Ok(m));
    let m = msg(3, 10);
    sink.push_inline(&m).unwrap();
    want.push(Ok(m));
    assert_eq!(header(slot(2)), (20, BUF_INLINE), "slot 2 is being packed");
    let totals = sink.finish();
    assert_eq!((totals.written, totals.slots, totals.room), (6, 3, 0));
    assert_eq!(totals.bytes, 3 * 8 + 100 + 20 + 3);
    assert_eq!(header(&slots[2]), (20 | 1 << 16, BUF_PACKED));
    assert_eq!(messages(&slots), want);
}
