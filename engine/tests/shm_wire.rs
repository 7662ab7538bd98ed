//! shm wire format: segment creation/attachment checks, ring semantics, hostile-peer
//! validation (targeted values and a seeded fuzz), and two-thread and two-process stress with
//! verified payloads.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use spinwire::fabric::shm::wire::layout::{hdr, slot, CONT_SLOT_INLINE, FIRST_SLOT_INLINE};
use spinwire::fabric::shm::wire::ring::{CONT_BIT, INLINE_BUF};
use spinwire::fabric::shm::wire::{
    Dir, Field, Params, RxPayload, RxRecord, RxRing, Segment, Side, TxRing, WireError,
};

/// Spinning tests run one at a time: the machine has two cores shared with other work.
static SPIN: Mutex<()> = Mutex::new(());

fn spin_guard() -> std::sync::MutexGuard<'static, ()> {
    SPIN.lock().unwrap_or_else(|e| e.into_inner())
}

fn params() -> Params {
    Params {
        buffer_size: 1024,
        buffer_count: 16,
        ring_depth: 32,
        inline_max: 200,
    }
}

struct Pair {
    a: Segment,
    b: Segment,
    tx_a: TxRing,
    rx_a: RxRing,
    tx_b: TxRing,
    rx_b: RxRing,
}

fn pair(p: &Params) -> Pair {
    let (a, fd) = Segment::create(p).unwrap();
    let b = Segment::attach(fd.as_fd(), p).unwrap();
    let (tx_a, rx_a) = a.split().unwrap();
    let (tx_b, rx_b) = b.split().unwrap();
    Pair {
        a,
        b,
        tx_a,
        rx_a,
        tx_b,
        rx_b,
    }
}

/// Writes into the shared mapping as a (hostile) peer would.
fn poke_u64(seg: &Segment, off: usize, v: u64) {
    assert!(off % 8 == 0 && off + 8 <= seg.len());
    // SAFETY: in bounds and 8-aligned (checked above) inside the live mapping; shared words are
    // accessed atomically by the rings, so an atomic store is the peer's legal way to write.
    unsafe { AtomicU64::from_ptr(seg.as_ptr().add(off).cast()) }.store(v, Ordering::Release);
}

fn poke_u32(seg: &Segment, off: usize, v: u32) {
    assert!(off % 4 == 0 && off + 4 <= seg.len());
    // SAFETY: as in `poke_u64`, for a 4-aligned word.
    unsafe { AtomicU32::from_ptr(seg.as_ptr().add(off).cast()) }.store(v, Ordering::Release);
}

fn peek_u64(seg: &Segment, off: usize) -> u64 {
    assert!(off % 8 == 0 && off + 8 <= seg.len());
    // SAFETY: as in `poke_u64`.
    unsafe { AtomicU64::from_ptr(seg.as_ptr().add(off).cast()) }.load(Ordering::Acquire)
}

fn slot_off(seg: &Segment, dir: Dir, pos: u64) -> usize {
    let depth = u64::from(seg.params().ring_depth);
    seg.layout().dir(dir).desc_slots + ((pos % depth) as usize) * 64
}

fn corrupt_field(r: Result<impl std::fmt::Debug, WireError>) -> Field {
    match r {
        Err(WireError::Corrupt { what, .. }) => what,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Segment setup

#[test]
fn segment_fd_is_mode_0600_regular_and_sealed() {
    let (_seg, fd) = Segment::create(&params()).unwrap();
    // SAFETY: plain-data out struct filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFREG);
    assert_eq!(st.st_mode & 0o7777, 0o600);
    // SAFETY: fcntl query on a valid fd.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    assert!(seals & libc::F_SEAL_SHRINK != 0 && seals & libc::F_SEAL_GROW != 0);
    // The peer cannot shrink it under our mapping.
    // SAFETY: ftruncate on a valid fd (expected to fail).
    assert_ne!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) }, 0);
    // SAFETY: fd flags query.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
    assert!(fl & libc::FD_CLOEXEC != 0);
}

#[test]
fn attach_checks_params_against_header_and_size() {
    let p = params();
    let (a, fd) = Segment::create(&p).unwrap();
    // Same layout size, different inline_max: caught by the header check.
    let q = Params {
        inline_max: 100,
        ..p
    };
    match Segment::attach(fd.as_fd(), &q) {
        Err(WireError::HeaderMismatch { what, .. }) => assert_eq!(what, "inline_max"),
        other => panic!("{other:?}"),
    }
    // Different size: caught by fstat before mapping.
    let q = Params {
        buffer_count: 200,
        ..p
    };
    assert!(matches!(
        Segment::attach(fd.as_fd(), &q),
        Err(WireError::SegmentSize { .. })
    ));
    // Invalid params never reach the segment.
    let q = Params { ring_depth: 3, ..p };
    assert!(matches!(
        Segment::attach(fd.as_fd(), &q),
        Err(WireError::InvalidParams {
            what: "ring_depth",
            ..
        })
    ));
    // The good params still attach (the failed attempts did not claim side B).
    let b = Segment::attach(fd.as_fd(), &p).unwrap();
    assert_eq!(b.side(), Side::B);
    // ... nor marked it closed.
    assert!(!a.is_peer_closed());
    assert!(a.peer_state().attached);
    assert!(matches!(
        Segment::attach(fd.as_fd(), &p),
        Err(WireError::AlreadyAttached)
    ));
}

#[test]
fn attach_rejects_bad_magic() {
    let p = params();
    let (a, fd) = Segment::create(&p).unwrap();
    poke_u64(&a, hdr::MAGIC, 0x1234);
    assert!(matches!(
        Segment::attach(fd.as_fd(), &p),
        Err(WireError::HeaderMismatch { what: "magic", .. })
    ));
}

fn memfd(mode: u32, seal: bool, len: usize) -> OwnedFd {
    // SAFETY: NUL-terminated name, valid flags.
    let raw = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_ALLOW_SEALING) };
    assert!(raw >= 0);
    // SAFETY: fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscalls on our fd.
    unsafe {
        assert_eq!(libc::fchmod(raw, mode), 0);
        assert_eq!(libc::ftruncate(raw, len as libc::off_t), 0);
        if seal {
            assert_eq!(libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        }
    }
    fd
}

#[test]
fn attach_rejects_wrong_mode_and_unsealed_files() {
    let p = params();
    let len = spinwire::fabric::shm::wire::Layout::new(&p)
        .unwrap()
        .total_len();
    assert!(matches!(
        Segment::attach(memfd(0o644, true, len).as_fd(), &p),
        Err(WireError::SegmentMode { .. })
    ));
    assert!(matches!(
        Segment::attach(memfd(0o600, false, len).as_fd(), &p),
        Err(WireError::NotSealed { .. })
    ));
    // A zero-filled, sealed, right-sized file still fails the header check (no magic).
    assert!(matches!(
        Segment::attach(memfd(0o600, true, len).as_fd(), &p),
        Err(WireError::HeaderMismatch { what: "magic", .. })
    ));
    let dir = std::fs::File::open("/").unwrap();
    assert!(matches!(
        Segment::attach(dir.as_fd(), &p),
        Err(WireError::SegmentMode { .. })
    ));
}

#[test]
fn split_twice_and_peer_state() {
    let p = params();
    let (a, fd) = Segment::create(&p).unwrap();
    assert!(!a.peer_state().attached);
    let b = Segment::attach(fd.as_fd(), &p).unwrap();
    let st = a.peer_state();
    assert!(st.attached && !st.closed);
    assert_eq!(st.pid, std::process::id());
    let _rings = a.split().unwrap();
    assert!(matches!(a.clone().split(), Err(WireError::AlreadySplit)));
    for _ in 0..3 {
        b.bump_heartbeat();
    }
    assert_eq!(a.peer_state().heartbeat, 3);
    assert!(!a.is_peer_closed());
    drop(b); // last handle of side B: marks it closed
    assert!(a.is_peer_closed());
    assert!(a.peer_state().closed);
}

// ---------------------------------------------------------------------------------------------
// Ring semantics

#[test]
fn inline_round_trip_every_size_across_wraps() {
    let p = Params {
        buffer_size: 64,
        buffer_count: 1,
        ring_depth: 8,
        inline_max: (FIRST_SLOT_INLINE + 6 * CONT_SLOT_INLINE) as u32,
    };
    let mut s = pair(&p);
    let mut out = vec![0u8; p.inline_max as usize];
    for round in 0..3u8 {
        for len in 0..=p.inline_max as usize {
            let msg: Vec<u8> = (0..len).map(|i| (i as u8) ^ round ^ (len as u8)).collect();
            assert!(s.tx_a.try_send_inline(&msg, len as u32).unwrap());
            let d = s.rx_b.poll().unwrap().expect("published");
            assert_eq!(d.len(), len);
            assert_eq!(d.aux(), len as u32);
            assert!(matches!(d.payload(), RxPayload::Inline { .. }));
            assert_eq!(s.rx_b.copy_inline(&d, &mut out).unwrap(), len);
            assert_eq!(&out[..len], &msg[..]);
            // The same payload copied into uninitialised memory (the engine's receive path).
            let mut un = vec![std::mem::MaybeUninit::<u8>::uninit(); p.inline_max as usize];
            assert_eq!(s.rx_b.copy_inline_uninit(&d, &mut un).unwrap(), len);
            // SAFETY: `copy_inline_uninit` returned `len`: it initialised the first `len` bytes.
            let got: Vec<u8> = un[..len]
                .iter()
                .map(|b| unsafe { b.assume_init() })
                .collect();
            assert_eq!(got, msg);
            assert!(
                matches!(
                    s.rx_b
                        .copy_inline_uninit(&d, &mut un[..len.saturating_sub(1)]),
                    Err(WireError::PayloadTooLarge { .. })
                ) || len == 0
            );
            assert!(s.rx_b.poll().unwrap().is_none());
            s.rx_b.commit();
        }
    }
}

#[test]
fn buffers_round_trip_and_reclaim() {
    let p = params();
    let mut s = pair(&p);
    for i in 0..p.buffer_count {
        let b = s.tx_b.buffer_mut(i).unwrap();
        b.fill(i as u8);
        assert!(s.tx_b.try_send_buf(i, 100 + i, 7).unwrap());
    }
    assert_eq!(s.tx_b.in_flight(), p.buffer_count);
    let mut descs = Vec::new();
    while let Some(d) = s.rx_a.poll().unwrap() {
        descs.push(d);
    }
    s.rx_a.commit();
    assert_eq!(descs.len(), p.buffer_count as usize);
    for (i, d) in descs.iter().enumerate() {
        assert_eq!(d.payload(), RxPayload::Buffer { index: i as u32 });
        assert_eq!(d.aux(), 7);
        let data = s.rx_a.buffer(i as u32, d.len()).unwrap();
        assert_eq!(data.len(), 100 + i);
        assert!(data.iter().all(|&x| x == i as u8));
        s.rx_a.release(i as u32).unwrap();
    }
    let mut freed = [0u32; 64];
    // Not published yet.
    assert_eq!(s.tx_b.reclaim(&mut freed).unwrap(), 0);
    s.rx_a.publish_releases();
    assert_eq!(s.tx_b.reclaim(&mut freed[..5]).unwrap(), 5);
    assert_eq!(s.tx_b.reclaim(&mut freed[5..]).unwrap(), 11);
    let mut got: Vec<u32> = freed[..16].to_vec();
    got.sort();
    assert_eq!(got, (0..16).collect::<Vec<_>>());
    assert_eq!(s.tx_b.in_flight(), 0);
}

#[test]
fn ring_full_is_backpressure_until_commit() {
    let p = params();
    let mut s = pair(&p);
    let mut sent = 0;
    while s.tx_a.try_send_inline(b"x", 0).unwrap() {
        sent += 1;
        assert!(sent <= p.ring_depth);
    }
    assert_eq!(sent, p.ring_depth);
    // Polling without committing keeps the slots reserved.
    let d = s.rx_b.poll().unwrap().unwrap();
    assert!(!s.tx_a.try_send_inline(b"y", 0).unwrap());
    // A multi-slot record needs several free slots.
    s.rx_b.commit();
    assert!(!s.tx_a.try_send_inline(&[0u8; 100], 0).unwrap());
    assert!(s.tx_a.try_send_inline(b"y", 0).unwrap());
    assert_eq!(d.len(), 1);
}

#[test]
fn local_misuse_is_typed() {
    let p = params();
    let mut s = pair(&p);
    assert!(matches!(
        s.tx_a.try_send_inline(&[0; 201], 0),
        Err(WireError::PayloadTooLarge { len: 201, max: 200 })
    ));
    assert!(matches!(
        s.tx_a.try_send_buf(16, 1, 0),
        Err(WireError::BadBufferIndex {
            index: 16,
            count: 16
        })
    ));
    assert!(matches!(
        s.tx_a.try_send_buf(0, 1025, 0),
        Err(WireError::PayloadTooLarge { .. })
    ));
    assert!(s.tx_a.try_send_buf(0, 10, 0).unwrap());
    assert!(matches!(
        s.tx_a.try_send_buf(0, 10, 0),
        Err(WireError::BufferInFlight { index: 0 })
    ));
    assert!(matches!(
        s.tx_a.buffer_mut(0),
        Err(WireError::BufferInFlight { index: 0 })
    ));
    assert!(matches!(
        s.rx_b.release(0),
        Err(WireError::BufferNotHeld { index: 0 })
    ));
    assert!(matches!(
        s.rx_b.buffer(0, 10),
        Err(WireError::BufferNotHeld { index: 0 })
    ));
    let d = s.rx_b.poll().unwrap().unwrap();
    assert!(matches!(
        s.rx_b.copy_inline(&d, &mut [0u8; 64]),
        Err(WireError::PayloadTooLarge { .. })
    ));
    assert!(matches!(
        s.rx_b
            .copy_inline_uninit(&d, &mut [std::mem::MaybeUninit::uninit(); 64]),
        Err(WireError::PayloadTooLarge { .. })
    ));
    assert!(matches!(
        s.rx_b.buffer(0, 2000),
        Err(WireError::PayloadTooLarge { .. })
    ));
    s.rx_b.release(0).unwrap();
    assert!(matches!(
        s.rx_b.release(0),
        Err(WireError::BufferNotHeld { index: 0 })
    ));
}

// ---------------------------------------------------------------------------------------------
// Hostile peer: targeted values

#[test]
fn hostile_descriptor_values_are_corrupt() {
    let p = params();
    // Each case: let A send something honest, then overwrite fields as a hostile A would.
    type Case = (&'static str, fn(&Segment), Field);
    let cases: [Case; 7] = [
        (
            "huge inline len",
            |a| poke_u32(a, slot_off(a, Dir::AToB, 0) + slot::LEN, u32::MAX - 1),
            Field::DescLen,
        ),
        (
            "buffer len > size",
            |a| {
                poke_u32(a, slot_off(a, Dir::AToB, 0) + slot::BUF, 3);
                poke_u32(a, slot_off(a, Dir::AToB, 0) + slot::LEN, 4096);
            },
            Field::DescLen,
        ),
        (
            "buffer index out of range",
            |a| poke_u32(a, slot_off(a, Dir::AToB, 0) + slot::BUF, 16),
            Field::DescBufIndex,
        ),
        (
            "flags",
            |a| poke_u32(a, slot_off(a, Dir::AToB, 0) + slot::FLAGS, 1),
            Field::DescFlags,
        ),
        (
            "seq jump",
            |a| poke_u64(a, slot_off(a, Dir::AToB, 0) + slot::SEQ, 5),
            Field::DescSeq,
        ),
        (
            "seq garbage",
            |a| poke_u64(a, slot_off(a, Dir::AToB, 0) + slot::SEQ, u64::MAX),
            Field::DescSeq,
        ),
        (
            "bad continuation stamp",
            |a| poke_u64(a, slot_off(a, Dir::AToB, 1), 2),
            Field::ContStamp,
        ),
    ];
    for (what, corrupt, field) in cases {
        let mut s = pair(&p);
        assert!(s.tx_a.try_send_inline(&[1u8; 100], 0).unwrap(), "{what}");
        corrupt(&s.a);
        assert_eq!(corrupt_field(s.rx_b.poll()), field, "{what}");
    }
}

#[test]
fn buffer_sent_twice_without_release_is_corrupt() {
    let p = params();
    let mut s = pair(&p);
    assert!(s.tx_a.try_send_buf(3, 10, 0).unwrap());
    assert!(s.rx_b.poll().unwrap().is_some());
    // Hostile A re-publishes buffer 3 at position 1.
    let off = slot_off(&s.a, Dir::AToB, 1);
    poke_u32(&s.a, off + slot::LEN, 10);
    poke_u32(&s.a, off + slot::BUF, 3);
    poke_u64(&s.a, off + slot::SEQ, 2);
    assert_eq!(corrupt_field(s.rx_b.poll()), Field::DescBufHeld);
}

#[test]
fn stale_sequence_from_previous_lap_reads_empty() {
    let p = params();
    let mut s = pair(&p);
    for _ in 0..p.ring_depth {
        assert!(s.tx_a.try_send_inline(b"a", 0).unwrap());
        assert!(s.rx_b.poll().unwrap().is_some());
        s.rx_b.commit();
    }
    // Slot 0 still holds seq 1 from lap 0: empty, not corrupt.
    assert!(s.rx_b.poll().unwrap().is_none());
    assert!(!s.rx_b.has_pending());
    assert!(s.tx_a.try_send_inline(b"b", 0).unwrap());
    assert!(s.rx_b.has_pending());
    assert!(s.rx_b.poll().unwrap().is_some());
    assert!(!s.rx_b.has_pending());
    // But a seq from two laps back cannot be there: corrupt (and `has_pending` says so).
    assert_eq!(peek_u64(&s.a, slot_off(&s.a, Dir::AToB, 1)), 2);
    poke_u64(
        &s.a,
        slot_off(&s.a, Dir::AToB, 1),
        2 + u64::from(p.ring_depth) * 2,
    );
    assert!(s.rx_b.has_pending());
    assert_eq!(corrupt_field(s.rx_b.poll()), Field::DescSeq);
}

#[test]
fn hostile_consumer_head_is_corrupt() {
    let p = params();
    let mut s = pair(&p);
    let head = s.a.layout().dir(Dir::AToB).desc_head;
    for _ in 0..p.ring_depth {
        assert!(s.tx_a.try_send_inline(b"a", 0).unwrap());
    }
    // B (hostile) claims to have consumed more than A produced.
    poke_u64(&s.b, head, u64::from(p.ring_depth) + 1);
    assert_eq!(
        corrupt_field(s.tx_a.try_send_inline(b"a", 0)),
        Field::DescHead
    );

    let mut s = pair(&p);
    for _ in 0..p.ring_depth {
        assert!(s.tx_a.try_send_inline(b"a", 0).unwrap());
    }
    poke_u64(&s.b, head, 4);
    assert!(s.tx_a.try_send_inline(b"a", 0).unwrap());
    // Moving backwards is corrupt too.
    for _ in 0..3 {
        assert!(s.tx_a.try_send_inline(b"a", 0).unwrap());
    }
    poke_u64(&s.b, head, 2);
    assert_eq!(
        corrupt_field(s.tx_a.try_send_inline(b"a", 0)),
        Field::DescHead
    );
}

#[test]
fn hostile_release_ring_is_corrupt() {
    let p = params();
    let rel = |s: &Pair| *s.a.layout().dir(Dir::AToB);
    let mut out = [0u32; 32];

    // Index out of range.
    let mut s = pair(&p);
    let l = rel(&s);
    assert!(s.tx_a.try_send_buf(1, 1, 0).unwrap());
    poke_u32(&s.b, l.rel_entries, 99);
    poke_u64(&s.b, l.rel_tail, 1);
    assert_eq!(corrupt_field(s.tx_a.reclaim(&mut out)), Field::ReleaseIndex);

    // Release of a buffer never sent (forged), and a duplicate release.
    let mut s = pair(&p);
    assert!(s.tx_a.try_send_buf(1, 1, 0).unwrap());
    poke_u32(&s.b, l.rel_entries, 1);
    poke_u32(&s.b, l.rel_entries + 4, 1);
    poke_u64(&s.b, l.rel_tail, 2);
    assert_eq!(
        corrupt_field(s.tx_a.reclaim(&mut out)),
        Field::ReleaseDuplicate
    );
    let mut s = pair(&p);
    poke_u32(&s.b, l.rel_entries, 5);
    poke_u64(&s.b, l.rel_tail, 1);
    assert_eq!(
        corrupt_field(s.tx_a.reclaim(&mut out)),
        Field::ReleaseDuplicate
    );

    // Tail jumps past the capacity, or moves backwards.
    let mut s = pair(&p);
    poke_u64(&s.b, l.rel_tail, 1 << 40);
    assert_eq!(corrupt_field(s.tx_a.reclaim(&mut out)), Field::ReleaseTail);
    let mut s = pair(&p);
    for i in 0..2 {
        assert!(s.tx_a.try_send_buf(i, 1, 0).unwrap());
        s.rx_b.poll().unwrap().unwrap();
        s.rx_b.release(i).unwrap();
    }
    s.rx_b.publish_releases();
    assert_eq!(s.tx_a.reclaim(&mut out).unwrap(), 2);
    poke_u64(&s.b, l.rel_tail, 1);
    assert_eq!(corrupt_field(s.tx_a.reclaim(&mut out)), Field::ReleaseTail);
}

#[test]
fn hostile_release_head_and_overflow_are_corrupt() {
    let p = Params {
        buffer_count: 4,
        ..params()
    };
    let mut s = pair(&p);
    let l = *s.a.layout().dir(Dir::AToB);
    // Hostile A sends buffers 0..4, then keeps re-sending them without reclaiming.
    let mut pos = 0u64;
    let mut send = |s: &Pair, idx: u32| {
        let off = slot_off(&s.a, Dir::AToB, pos);
        poke_u32(&s.a, off + slot::LEN, 1);
        poke_u32(&s.a, off + slot::BUF, idx);
        poke_u32(&s.a, off + slot::AUX, 0);
        poke_u32(&s.a, off + slot::FLAGS, 0);
        poke_u64(&s.a, off + slot::SEQ, pos + 1);
        pos += 1;
    };
    for i in 0..4 {
        send(&s, i);
        s.rx_b.poll().unwrap().unwrap();
        s.rx_b.release(i).unwrap();
    }
    s.rx_b.publish_releases();
    send(&s, 0);
    s.rx_b.poll().unwrap().unwrap();
    // Ring (capacity 4) is full and A never reclaimed: overflow.
    assert_eq!(corrupt_field(s.rx_b.release(0)), Field::ReleaseOverflow);
    // A head beyond what was published is corrupt.
    poke_u64(&s.a, l.rel_head, 9);
    assert_eq!(corrupt_field(s.rx_b.release(0)), Field::ReleaseHead);
    let _ = &s.tx_a;
}

// ---------------------------------------------------------------------------------------------
// Hostile peer: seeded fuzz

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Checks a result: Ok, or a Corrupt error (the only error an honest caller can get from a
/// hostile peer). Returns whether the connection must be failed.
fn check<T>(r: Result<T, WireError>) -> (Option<T>, bool) {
    match r {
        Ok(v) => (Some(v), false),
        Err(e) if e.is_corrupt() => (None, true),
        Err(e) => panic!("non-corrupt error from honest use: {e:?}"),
    }
}

/// A hostile value for a random peer-writable word: random bits, or one near a boundary.
fn hostile_value(rng: &mut XorShift, p: &Params) -> u64 {
    match rng.below(8) {
        0 => rng.next(),
        1 => u64::from(p.buffer_count) + rng.below(3),
        2 => u64::from(p.inline_max) + rng.below(3),
        3 => u64::from(p.buffer_size) + rng.below(3),
        4 => rng.below(4 * u64::from(p.ring_depth)),
        5 => rng.below(64) | CONT_BIT,
        6 => u64::from(INLINE_BUF),
        _ => u64::MAX - rng.below(3),
    }
}

fn fuzz_one(seed: u64, steps: u32) -> (u32, u32) {
    let mut rng = XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let p = Params {
        buffer_size: 64 << rng.below(3),
        buffer_count: 1 + rng.below(8) as u32,
        ring_depth: 2 << rng.below(4),
        inline_max: 0,
    };
    let p = Params {
        inline_max: rng.below(
            1 + (FIRST_SLOT_INLINE + (p.ring_depth as usize - 1) * CONT_SLOT_INLINE).min(300)
                as u64,
        ) as u32,
        ..p
    };
    p.validate().unwrap();
    let mut s = pair(&p);
    let len = s.a.len();
    let mut free_a: Vec<u32> = (0..p.buffer_count).collect();
    let mut held_b: Vec<u32> = Vec::new();
    let mut out = vec![0u8; p.inline_max as usize + 1];
    let mut reclaimed = vec![0u32; p.buffer_count as usize];
    let (mut corrupt, mut received) = (0u32, 0u32);
    for _ in 0..steps {
        let failed = match rng.below(16) {
            // Honest traffic A -> B.
            0..=2 => {
                let n = rng.below(u64::from(p.inline_max) + 1) as usize;
                check(s.tx_a.try_send_inline(&out[..n], 0)).1
            }
            3 | 4 => match free_a.pop() {
                Some(i) => {
                    let (ok, f) = check(s.tx_a.try_send_buf(
                        i,
                        rng.below(u64::from(p.buffer_size) + 1) as u32,
                        0,
                    ));
                    if ok != Some(true) {
                        free_a.push(i);
                    }
                    f
                }
                None => false,
            },
            5..=8 => {
                let (d, f) = check(s.rx_b.poll());
                if let Some(Some(d)) = d {
                    received += 1;
                    match d.payload() {
                        RxPayload::Inline { .. } => {
                            assert_eq!(s.rx_b.copy_inline(&d, &mut out).unwrap(), d.len());
                        }
                        RxPayload::Buffer { index } => {
                            let b = s.rx_b.buffer(index, d.len()).unwrap();
                            assert_eq!(b.len(), d.len());
                            held_b.push(index);
                        }
                    }
                }
                if rng.below(2) == 0 {
                    s.rx_b.commit();
                }
                f
            }
            9 | 10 => match held_b.pop() {
                Some(i) => {
                    let f = check(s.rx_b.release(i)).1;
                    s.rx_b.publish_releases();
                    f
                }
                None => false,
            },
            11 | 12 => {
                let (n, f) = check(s.tx_a.reclaim(&mut reclaimed));
                if let Some(n) = n {
                    free_a.extend_from_slice(&reclaimed[..n]);
                }
                f
            }
            // Hostile writes anywhere in the segment (everything in it is peer writable).
            13 => {
                let off = (rng.below(len as u64 / 8) * 8) as usize;
                poke_u64(&s.a, off, hostile_value(&mut rng, &p));
                false
            }
            // Targeted: a field of a descriptor slot near the reader, or a ring index word.
            14 => {
                let pos = rng.below(4 * u64::from(p.ring_depth));
                let base = slot_off(&s.a, Dir::AToB, pos);
                let field = [slot::SEQ, slot::LEN, slot::FLAGS, 32, 56][rng.below(5) as usize];
                if field == slot::LEN || field == slot::FLAGS {
                    poke_u32(&s.a, base + field, hostile_value(&mut rng, &p) as u32);
                } else {
                    poke_u64(&s.a, base + field, hostile_value(&mut rng, &p));
                }
                false
            }
            _ => {
                let l = s.a.layout().dir(Dir::AToB);
                let word = [l.desc_head, l.rel_tail, l.rel_head][rng.below(3) as usize];
                let cur = peek_u64(&s.a, word);
                let v = match rng.below(3) {
                    0 => cur.wrapping_add(rng.below(3)),
                    1 => cur.wrapping_sub(rng.below(3)),
                    _ => hostile_value(&mut rng, &p),
                };
                poke_u64(&s.a, word, v);
                false
            }
        };
        if failed {
            // The connection would be failed; keep poking the dead handles once more to prove
            // they stay memory safe, then start a new connection.
            let _ = s.rx_b.poll();
            let _ = s.tx_a.reclaim(&mut reclaimed);
            let _ = s.tx_a.try_send_inline(&[], 0);
            corrupt += 1;
            s = pair(&p);
            free_a = (0..p.buffer_count).collect();
            held_b.clear();
        }
    }
    let _ = (&s.b, &s.rx_a, &s.tx_b);
    (corrupt, received)
}

#[test]
fn fuzz_hostile_segment_never_panics_or_hangs() {
    let (seeds, steps) = if cfg!(debug_assertions) {
        (150, 400)
    } else {
        (1000, 2000)
    };
    let t0 = Instant::now();
    let (mut corrupt, mut received) = (0, 0);
    for seed in 0..seeds {
        let (c, r) = fuzz_one(seed, steps);
        corrupt += c;
        received += r;
    }
    eprintln!("fuzz: {corrupt} corrupt connections, {received} messages received");
    // The fuzz must exercise both outcomes.
    assert!(corrupt > 0 && received > 0, "{corrupt} {received}");
    assert!(t0.elapsed() < Duration::from_secs(120));
}

// ---------------------------------------------------------------------------------------------
// Stress with verified payloads

/// Deterministic message `seq`: its length, whether it goes inline, and its bytes
/// (seq in the first 8 bytes, an FNV-1a checksum of the rest in the last 4).
fn expected_len(seq: u64, p: &Params) -> (usize, bool) {
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    let inline = x % 4 != 0;
    let max = if inline { p.inline_max } else { p.buffer_size } as u64;
    (12 + ((x >> 8) % (max - 11)) as usize, inline)
}

fn fnv(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

fn fill(seq: u64, buf: &mut [u8]) {
    let n = buf.len();
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in buf[8..n - 4].iter_mut().enumerate() {
        *b = (seq as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
    let c = fnv(&buf[..n - 4]);
    buf[n - 4..].copy_from_slice(&c.to_le_bytes());
}

fn verify(seq: u64, data: &[u8], p: &Params, inline: bool) {
    let (len, want_inline) = expected_len(seq, p);
    assert_eq!(inline, want_inline, "seq {seq}");
    assert_eq!(data.len(), len, "seq {seq}");
    assert_eq!(u64::from_le_bytes(data[..8].try_into().unwrap()), seq);
    let c = u32::from_le_bytes(data[len - 4..].try_into().unwrap());
    assert_eq!(fnv(&data[..len - 4]), c, "checksum of seq {seq}");
}

/// Backoff for test spin loops: spin a little, then yield (never oversubscribes for long).
fn backoff(idle: &mut u32, deadline: Instant, what: &str) {
    *idle += 1;
    if *idle > 64 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
    assert!(Instant::now() < deadline, "{what}: timed out");
}

/// Sends messages `0..n` from `tx`, verifying nothing; reclaims buffers as needed.
fn sender(tx: &mut TxRing, p: &Params, n: u64, deadline: Instant) {
    let mut free: Vec<u32> = (0..p.buffer_count).collect();
    let mut reclaimed = vec![0u32; p.buffer_count as usize];
    let mut scratch = vec![0u8; p.inline_max as usize];
    let mut idle = 0;
    let mut seq = 0;
    while seq < n {
        let (len, inline) = expected_len(seq, p);
        let sent = if inline {
            fill(seq, &mut scratch[..len]);
            tx.try_send_inline(&scratch[..len], seq as u32).unwrap()
        } else {
            if free.is_empty() {
                let k = tx.reclaim(&mut reclaimed).unwrap();
                free.extend_from_slice(&reclaimed[..k]);
            }
            match free.pop() {
                Some(i) => {
                    fill(seq, &mut tx.buffer_mut(i).unwrap()[..len]);
                    let ok = tx.try_send_buf(i, len as u32, seq as u32).unwrap();
                    if !ok {
                        free.push(i);
                    }
                    ok
                }
                None => false,
            }
        };
        if sent {
            seq += 1;
            idle = 0;
        } else {
            backoff(&mut idle, deadline, "sender");
        }
    }
}

/// Receives and verifies messages `0..n`, releasing buffers in small batches.
fn receiver(rx: &mut RxRing, p: &Params, n: u64, deadline: Instant) {
    let mut out = vec![0u8; p.inline_max as usize];
    let mut idle = 0;
    let mut seq = 0;
    let mut desc: Option<RxRecord>;
    while seq < n {
        desc = rx.poll().unwrap();
        match desc {
            Some(d) => {
                assert_eq!(d.aux(), seq as u32);
                match d.payload() {
                    RxPayload::Inline { .. } => {
                        let k = rx.copy_inline(&d, &mut out).unwrap();
                        verify(seq, &out[..k], p, true);
                    }
                    RxPayload::Buffer { index } => {
                        verify(seq, rx.buffer(index, d.len()).unwrap(), p, false);
                        rx.release(index).unwrap();
                    }
                }
                seq += 1;
                idle = 0;
                if seq % 8 == 0 {
                    rx.commit();
                    rx.publish_releases();
                }
            }
            None => {
                rx.commit();
                rx.publish_releases();
                backoff(&mut idle, deadline, "receiver");
            }
        }
    }
    rx.commit();
    rx.publish_releases();
    assert!(rx.poll().unwrap().is_none());
}

/// Both directions at once on one thread: interleaves non-blocking send and receive steps until
/// `n` messages went each way, verifying every received payload.
fn duplex(tx: &mut TxRing, rx: &mut RxRing, p: &Params, n: u64, deadline: Instant) {
    let mut free: Vec<u32> = (0..p.buffer_count).collect();
    let mut reclaimed = vec![0u32; p.buffer_count as usize];
    let mut scratch = vec![0u8; p.inline_max as usize];
    let mut out = vec![0u8; p.inline_max as usize];
    let (mut sent, mut got, mut idle) = (0u64, 0u64, 0u32);
    while sent < n || got < n {
        let mut progress = false;
        if sent < n {
            let (len, inline) = expected_len(sent, p);
            let ok = if inline {
                fill(sent, &mut scratch[..len]);
                tx.try_send_inline(&scratch[..len], sent as u32).unwrap()
            } else {
                if free.is_empty() {
                    let k = tx.reclaim(&mut reclaimed).unwrap();
                    free.extend_from_slice(&reclaimed[..k]);
                }
                match free.pop() {
                    Some(i) => {
                        fill(sent, &mut tx.buffer_mut(i).unwrap()[..len]);
                        let ok = tx.try_send_buf(i, len as u32, sent as u32).unwrap();
                        if !ok {
                            free.push(i);
                        }
                        ok
                    }
                    None => false,
                }
            };
            if ok {
                sent += 1;
                progress = true;
            }
        }
        if let Some(d) = rx.poll().unwrap() {
            assert_eq!(d.aux(), got as u32);
            match d.payload() {
                RxPayload::Inline { .. } => {
                    let k = rx.copy_inline(&d, &mut out).unwrap();
                    verify(got, &out[..k], p, true);
                }
                RxPayload::Buffer { index } => {
                    verify(got, rx.buffer(index, d.len()).unwrap(), p, false);
                    rx.release(index).unwrap();
                }
            }
            got += 1;
            progress = true;
        }
        if got % 4 == 0 || !progress {
            rx.commit();
            rx.publish_releases();
        }
        if progress {
            idle = 0;
        } else {
            backoff(&mut idle, deadline, "duplex");
        }
    }
    rx.commit();
    rx.publish_releases();
}

#[test]
fn two_thread_duplex_stress_verified_payloads() {
    let _g = spin_guard();
    let p = Params {
        buffer_size: 256,
        buffer_count: 4,
        ring_depth: 16,
        inline_max: 120,
    };
    let Pair {
        a: _a,
        b: _b,
        mut tx_a,
        mut rx_a,
        mut tx_b,
        mut rx_b,
    } = pair(&p);
    let n = stress_count() / 4;
    let deadline = Instant::now() + Duration::from_secs(120);
    let t = std::thread::spawn(move || duplex(&mut tx_b, &mut rx_b, &p, n, deadline));
    duplex(&mut tx_a, &mut rx_a, &p, n, deadline);
    t.join().unwrap();
}

fn stress_count() -> u64 {
    if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    }
}

#[test]
fn two_thread_stress_verified_payloads() {
    let _g = spin_guard();
    let p = Params {
        buffer_size: 512,
        buffer_count: 8,
        ring_depth: 64,
        inline_max: 150,
    };
    let Pair {
        a,
        b,
        mut tx_a,
        rx_a: _rx_a,
        tx_b: _tx_b,
        mut rx_b,
    } = pair(&p);
    let n = stress_count();
    let deadline = Instant::now() + Duration::from_secs(120);
    let t = std::thread::spawn(move || {
        receiver(&mut rx_b, &p, n, deadline);
        rx_b
    });
    sender(&mut tx_a, &p, n, deadline);
    let rx_b = t.join().unwrap();
    assert_eq!(rx_b.held(), 0);
    drop((a, b));
}

#[test]
fn two_thread_ping_pong_both_directions() {
    let _g = spin_guard();
    let p = params();
    let Pair {
        a: _a,
        b: _b,
        mut tx_a,
        mut rx_a,
        mut tx_b,
        mut rx_b,
    } = pair(&p);
    let n: u64 = if cfg!(debug_assertions) {
        5_000
    } else {
        50_000
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 200];
        let mut idle = 0;
        for _ in 0..n {
            let d = loop {
                if let Some(d) = rx_b.poll().unwrap() {
                    break d;
                }
                backoff(&mut idle, deadline, "echo");
            };
            let k = rx_b.copy_inline(&d, &mut buf).unwrap();
            rx_b.commit();
            while !tx_b.try_send_inline(&buf[..k], d.aux() + 1).unwrap() {
                backoff(&mut idle, deadline, "echo send");
            }
        }
    });
    let mut buf = [0u8; 200];
    let mut idle = 0;
    for i in 0..n {
        let len = (i % 201) as usize;
        let msg: Vec<u8> = (0..len).map(|j| (i as u8).wrapping_add(j as u8)).collect();
        assert!(tx_a.try_send_inline(&msg, i as u32).unwrap());
        let d = loop {
            if let Some(d) = rx_a.poll().unwrap() {
                break d;
            }
            backoff(&mut idle, deadline, "ping");
        };
        assert_eq!(d.aux(), i as u32 + 1);
        let k = rx_a.copy_inline(&d, &mut buf).unwrap();
        assert_eq!(&buf[..k], &msg[..]);
        rx_a.commit();
    }
    echo.join().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Two processes: rendezvous over cm::uds, segment fd passed with SCM_RIGHTS.

const CHILD_ENV: &str = "SHM_WIRE_TEST_CHILD_NAME";
const T: Duration = Duration::from_secs(20);

fn proc_params() -> Params {
    Params {
        buffer_size: 512,
        buffer_count: 8,
        ring_depth: 64,
        inline_max: 150,
    }
}

fn proc_count() -> u64 {
    if cfg!(debug_assertions) {
        20_000
    } else {
        300_000
    }
}

fn conn_params(p: &Params) -> cm::uds::ConnParams {
    cm::uds::ConnParams {
        buffer_size: p.buffer_size,
        buffer_count: p.buffer_count,
        ring_depth: p.ring_depth,
        inline_max: p.inline_max,
        flags: 0,
    }
}

/// Not a test on its own: the child process of `two_process_stress_over_uds_rendezvous`.
#[test]
fn child_receiver_process() {
    let Ok(name) = std::env::var(CHILD_ENV) else {
        return;
    };
    let p = proc_params();
    let mut c = cm::uds::connect(&name, T).unwrap();
    c.send_hello(&conn_params(&p), T).unwrap();
    let offer = c.recv_offer(T).unwrap();
    assert_eq!(offer.params, conn_params(&p));
    let seg = Segment::attach(offer.segment.as_fd(), &p).unwrap();
    drop(offer);
    c.send_ready(T).unwrap();
    let (mut tx, mut rx) = seg.split().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    receiver(&mut rx, &p, proc_count(), deadline);
    // Report success in-band.
    assert!(tx.try_send_inline(b"verified", 0).unwrap());
    // Wait for the parent to read it and hang up.
    let t0 = Instant::now();
    while !c.poll_hangup().unwrap() && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn two_process_stress_over_uds_rendezvous() {
    let _g = spin_guard();
    let p = proc_params();
    let name = format!("shm-wire-test-{}", std::process::id());
    let l = cm::uds::UdsListener::bind(&name).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_receiver_process", "--nocapture"])
        .env(CHILD_ENV, &name)
        .spawn()
        .unwrap();
    let mut s = l.accept_timeout(T).unwrap();
    let hello = s.recv_hello(T).unwrap();
    assert_eq!(hello.params, conn_params(&p));
    let (seg, fd) = Segment::create(&p).unwrap();
    s.send_accept(&hello.params, fd.as_fd(), T).unwrap();
    drop(fd);
    s.recv_ready(T).unwrap();
    assert!(seg.peer_state().attached);
    assert_eq!(seg.peer_state().pid, child.id());
    let (mut tx, mut rx) = seg.split().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    sender(&mut tx, &p, proc_count(), deadline);
    let mut idle = 0;
    let d = loop {
        if let Some(d) = rx.poll().unwrap() {
            break d;
        }
        assert!(!s.poll_hangup().unwrap(), "child died");
        backoff(&mut idle, deadline, "child report");
    };
    let mut out = [0u8; 16];
    let k = rx.copy_inline(&d, &mut out).unwrap();
    assert_eq!(&out[..k], b"verified");
    drop(s); // hang up: the child exits
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {status:?}");
    assert!(
        seg.is_peer_closed(),
        "child's segment handles dropped at exit"
    );
}

const KILL_CHILD_ENV: &str = "SHM_WIRE_TEST_KILL_CHILD_NAME";

/// Not a test on its own: the child process of `sigkilled_peer_is_seen_and_segment_stays_valid`
/// (attaches, sends one message, then waits to be killed).
#[test]
fn child_attach_and_wait() {
    let Ok(name) = std::env::var(KILL_CHILD_ENV) else {
        return;
    };
    let p = proc_params();
    let mut c = cm::uds::connect(&name, T).unwrap();
    c.send_hello(&conn_params(&p), T).unwrap();
    let offer = c.recv_offer(T).unwrap();
    let seg = Segment::attach(offer.segment.as_fd(), &p).unwrap();
    c.send_ready(T).unwrap();
    let (mut tx, _rx) = seg.split().unwrap();
    assert!(tx.try_send_inline(b"attached", 0).unwrap());
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn sigkilled_peer_is_seen_and_segment_stays_valid() {
    let p = proc_params();
    let name = format!("shm-wire-kill-{}", std::process::id());
    let l = cm::uds::UdsListener::bind(&name).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_attach_and_wait", "--nocapture"])
        .env(KILL_CHILD_ENV, &name)
        .spawn()
        .unwrap();
    let mut s = l.accept_timeout(T).unwrap();
    let hello = s.recv_hello(T).unwrap();
    let (seg, fd) = Segment::create(&p).unwrap();
    s.send_accept(&hello.params, fd.as_fd(), T).unwrap();
    drop(fd);
    s.recv_ready(T).unwrap();
    let (mut tx, mut rx) = seg.split().unwrap();
    let deadline = Instant::now() + T;
    let mut idle = 0;
    let d = loop {
        if let Some(d) = rx.poll().unwrap() {
            break d;
        }
        backoff(&mut idle, deadline, "child message");
    };
    let mut out = [0u8; 16];
    let k = rx.copy_inline(&d, &mut out).unwrap();
    assert_eq!(&out[..k], b"attached");
    rx.commit();

    child.kill().unwrap(); // SIGKILL: no clean close
    let t0 = Instant::now();
    while !s.poll_hangup().unwrap() {
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "hang-up not seen within 1 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    child.wait().unwrap();
    assert!(
        !seg.is_peer_closed(),
        "a killed peer never marks itself closed"
    );
    // Our mapping stays valid: the rings still work (the messages just go nowhere).
    assert!(tx.try_send_inline(b"anyone?", 0).unwrap());
    assert!(rx.poll().unwrap().is_none());
}
