//! `PoolView` from safe code: an out-of-range index is an error (`get`) or a panic (`buf_ptr`),
//! never an out-of-bounds pointer (issue #15, soundness).

use std::ptr::NonNull;

use spinwire::PoolView;

const BUF_SIZE: usize = 64;
const COUNT: u32 = 4;

/// A view of `mem`, which must outlive every use of the view.
fn view(mem: &mut [u8]) -> PoolView {
    assert_eq!(mem.len(), BUF_SIZE * COUNT as usize);
    let base = NonNull::new(mem.as_mut_ptr()).unwrap();
    // SAFETY: `mem` holds exactly `BUF_SIZE * COUNT` bytes and outlives the view in every test.
    unsafe { PoolView::new(base, BUF_SIZE, COUNT) }
}

#[test]
fn in_range_indices_point_into_the_pool() {
    let mut mem = vec![0u8; BUF_SIZE * COUNT as usize];
    let base = mem.as_ptr() as usize;
    let v = view(&mut mem);
    for i in 0..COUNT {
        let p = v.buf_ptr(i).as_ptr() as usize;
        assert_eq!(p, base + i as usize * BUF_SIZE);
        assert_eq!(v.get(i).map(|p| p.as_ptr() as usize), Some(p));
    }
}

#[test]
fn get_rejects_out_of_range_indices() {
    let mut mem = vec![0u8; BUF_SIZE * COUNT as usize];
    let v = view(&mut mem);
    for i in [COUNT, COUNT + 1, u32::MAX - 1, u32::MAX] {
        assert!(v.get(i).is_none(), "index {i} accepted");
    }
}

#[test]
fn buf_ptr_panics_on_out_of_range_indices_in_every_build() {
    let mut mem = vec![0u8; BUF_SIZE * COUNT as usize];
    let v = view(&mut mem);
    for i in [COUNT, u32::MAX] {
        let r = std::panic::catch_unwind(|| v.buf_ptr(i));
        let msg = match r {
            Ok(p) => panic!("index {i} gave pointer {p:?}"),
            Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
        };
        assert!(msg.contains("out of range"), "unexpected panic: {msg:?}");
    }
}
