//! Two-thread streaming measurements shared by the `shm_wire` and `record_ring` benches: the
//! bare one-line-per-message floor and the shm wire (segment v2: the record ring in a shared
//! segment), so that every ring figure can be put next to the floor measured in the same run.

#![allow(dead_code)] // each bench uses a subset

use std::hint::spin_loop;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spinwire::fabric::shm::wire::{Params, Releaser, RxMsg, RxRing, Segment, TxRing};

/// Set in smoke-test mode: pinned spinners on a busy shared host can stall for whole time slices.
pub static NO_PIN: AtomicBool = AtomicBool::new(false);

/// One atomic on its own 128-B line.
#[repr(align(128))]
pub struct Line(pub AtomicU64);

#[repr(align(64))]
struct Line64([AtomicU64; 8]);

/// Whether [`pin`] pins (`SHM_WIRE_BENCH_NOPIN` unset and not in smoke mode).
pub fn pinning() -> bool {
    !NO_PIN.load(Ordering::Relaxed) && std::env::var_os("SHM_WIRE_BENCH_NOPIN").is_none()
}

/// Pins the calling thread to the `which`-th core, unless `SHM_WIRE_BENCH_NOPIN` is set (useful
/// when other pinned spinners share the cores) or in smoke mode.
pub fn pin(which: usize) {
    if !pinning() {
        return;
    }
    if let Some(ids) = core_affinity::get_core_ids() {
        if ids.len() >= 2 {
            core_affinity::set_for_current(ids[which]);
        }
    }
}

/// Both sides' handles of a fresh shm segment (`depth` messages of up to 256 B per direction).
#[allow(clippy::type_complexity)]
pub fn wire_rings(depth: u32) -> ((TxRing, RxRing, Releaser), (TxRing, RxRing, Releaser)) {
    let p = Params {
        buffer_size: 4096,
        buffer_count: 64,
        ring_depth: depth,
        inline_max: 256,
        large_size: 0,
        large_count: 0,
    };
    let (a, fd) = Segment::create(&p).expect("create");
    let b = Segment::attach(fd.as_fd(), &p).expect("attach");
    (a.split().expect("split a"), b.split().expect("split b"))
}

/// The floor: one producer writing 64-B lines with a sequence word into a ring of 1024 lines,
/// one consumer reading them (publishing its head every 32).
pub fn bare_stream(iters: u64) -> Duration {
    const DEPTH: u64 = 1024;
    let ring: Arc<Vec<Line64>> = Arc::new((0..DEPTH).map(|_| Line64(Default::default())).collect());
    let head = Arc::new(Line(AtomicU64::new(0)));
    let (r2, h2) = (Arc::clone(&ring), Arc::clone(&head));
    let consumer = std::thread::spawn(move || {
        pin(1);
        let mut pos = 0u64;
        let mut sum = 0u64;
        while pos < iters {
            let l = &r2[(pos % DEPTH) as usize];
            if l.0[0].load(Ordering::Acquire) == pos + 1 {
                for w in &l.0[1..] {
                    sum = sum.wrapping_add(w.load(Ordering::Relaxed));
                }
                pos += 1;
                if pos % 32 == 0 {
                    h2.0.store(pos, Ordering::Release);
                }
            } else {
                spin_loop();
            }
        }
        std::hint::black_box(sum);
    });
    pin(0);
    let t0 = Instant::now();
    let mut head_cache = 0u64;
    for pos in 0..iters {
        while pos - head_cache >= DEPTH {
            head_cache = head.0.load(Ordering::Acquire);
        }
        let l = &ring[(pos % DEPTH) as usize];
        for w in &l.0[1..] {
            w.store(pos, Ordering::Relaxed);
        }
        l.0[0].store(pos + 1, Ordering::Release);
    }
    consumer.join().expect("consumer thread");
    t0.elapsed()
}

/// The shm wire: one-way inline messages of `len` bytes through the segment's record ring,
/// the consumer reading batches of up to 32 in place (one position store per batch).
pub fn wire_stream(iters: u64, len: usize) -> Duration {
    let ((mut tx_a, _rx_a, _rel_a), (_tx_b, mut rx_b, _rel_b)) = wire_rings(1024);
    let consumer = std::thread::spawn(move || {
        pin(1);
        let mut got = 0u64;
        let mut sum = 0u64;
        while got < iters {
            let k = rx_b
                .poll(32, |m| {
                    if let RxMsg::Inline(b) = m {
                        sum = sum.wrapping_add(b.len() as u64);
                    }
                })
                .expect("poll");
            if k > 0 {
                got += k as u64;
            } else {
                spin_loop();
            }
        }
        std::hint::black_box(sum);
    });
    pin(0);
    let msg = vec![7u8; len];
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < iters {
        if tx_a.try_send_inline(&msg).expect("send") {
            sent += 1;
        } else {
            spin_loop();
        }
    }
    consumer.join().expect("consumer thread");
    t0.elapsed()
}
