//! shm wire format (version 3): segment creation/attachment checks, record-ring and release-ring
//! semantics, hostile-peer validation (targeted values and a seeded fuzz), and two-thread and
//! two-process stress with verified payloads.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spinwire::fabric::shm::wire::layout::hdr;
use spinwire::fabric::shm::wire::{
    Dir, Field, Params, Releaser, RxMsg, RxRing, Segment, Side, TxRing, WireError,
};
use spinwire::record::ring::{CONSUMER_POSITION_OFFSET, RING_HEADER_SIZE};
use spinwire_testkit::data::{self, XorShift};
use spinwire_testkit::process::{wait_timeout, KillOnDrop};
use spinwire_testkit::{role, serial};

fn params() -> Params {
    Params {
        buffer_size: 1024,
        buffer_count: 16,
        ring_depth: 32,
        inline_max: 200,
        large_size: 0,
        large_count: 0,
    }
}

struct Pair {
    a: Segment,
    b: Segment,
    tx_a: TxRing,
    rx_a: RxRing,
    rel_a: Releaser,
    tx_b: TxRing,
    rx_b: RxRing,
    rel_b: Releaser,
}

fn pair(p: &Params) -> Pair {
    let (a, fd) = Segment::create(p).unwrap();
    let b = Segment::attach(fd.as_fd(), p).unwrap();
    let (tx_a, rx_a, rel_a) = a.split().unwrap();
    let (tx_b, rx_b, rel_b) = b.split().unwrap();
    Pair {
        a,
        b,
        tx_a,
        rx_a,
        rel_a,
        tx_b,
        rx_b,
        rel_b,
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

/// Offset of ring position `pos` of direction `dir`'s record area.
fn area_off(seg: &Segment, dir: Dir, pos: u64) -> usize {
    let cap = seg.layout().ring_capacity() as u64;
    seg.layout().dir(dir).ring + RING_HEADER_SIZE + (pos % cap) as usize
}

/// A record header word (`len` includes the 8-byte header).
fn header(len: u32, ty: u8) -> u64 {
    u64::from(len) | u64::from(ty) << 32
}

/// Publishes a raw BUF_REF record at `pos` of `dir`, as a (hostile) sender would.
fn raw_buf_ref(seg: &Segment, dir: Dir, pos: u64, index: u32, len: u32) {
    poke_u64(
        seg,
        area_off(seg, dir, pos + 8),
        u64::from(index) | u64::from(len) << 32,
    );
    poke_u64(seg, area_off(seg, dir, pos + 16), 0);
    poke_u64(seg, area_off(seg, dir, pos), header(16, 2));
}

fn corrupt_field(r: Result<impl std::fmt::Debug, WireError>) -> Field {
    match r {
        Err(WireError::Corrupt { what, .. }) => what,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// A message as [`poll1`] got it.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    Inline(Vec<u8>),
    Buffer(u32, Vec<u8>),
}

/// Polls one message; a buffer is held, read and left held (release it with `rel`).
fn poll1(rx: &mut RxRing, rel: &mut Releaser) -> Result<Option<Got>, WireError> {
    let mut got = None;
    let mut err = None;
    rx.poll(1, |m| match m {
        RxMsg::Inline(b) => got = Some(Got::Inline(b.to_vec())),
        RxMsg::Buffer { index, len } => match rel.hold(index) {
            Ok(()) => {
                got = Some(Got::Buffer(
                    index,
                    rel.buffer(index, len as usize).unwrap().to_vec(),
                ))
            }
            Err(e) => err = Some(e),
        },
    })?;
    match err {
        Some(e) => Err(e),
        None => Ok(got),
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

/// Bytes of the memfd's memory committed (its allocated blocks).
fn committed(fd: &OwnedFd) -> u64 {
    // SAFETY: plain-data out struct filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out pointer.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_blocks as u64 * 512
}

#[test]
fn large_slots_are_committed_by_their_sender_on_first_use() {
    let p = Params {
        large_size: 4 << 20,
        large_count: 2,
        ..params()
    };
    let (a, fd) = Segment::create(&p).unwrap();
    let prefix = a.layout().large_start() as u64;
    let large = 2 * (4u64 << 20);
    // Everything before the large slots is reserved; none of the 16 MiB of slots is.
    assert_eq!(committed(&fd), prefix, "after create");
    let b = Segment::attach(fd.as_fd(), &p).unwrap();
    let (tx_a, _rx_a, _rel_a) = a.split().unwrap();
    let (tx_b, _rx_b, _rel_b) = b.split().unwrap();
    assert_eq!(committed(&fd), prefix, "after attach and split");
    // Side A's first large message commits its direction's slots, and only those.
    tx_a.reserve_large().unwrap();
    assert_eq!(committed(&fd), prefix + large, "after A reserved");
    tx_a.reserve_large().unwrap();
    assert_eq!(committed(&fd), prefix + large, "reserving twice");
    tx_b.reserve_large().unwrap();
    assert_eq!(committed(&fd), prefix + 2 * large, "after B reserved");
    // Without large slots there is nothing to reserve.
    let (c, fd) = Segment::create(&params()).unwrap();
    let (tx_c, _, _) = c.split().unwrap();
    tx_c.reserve_large().unwrap();
    assert_eq!(committed(&fd), c.len() as u64);
}

#[test]
fn attach_checks_params_against_header_and_size() {
    let p = params();
    let (a, fd) = Segment::create(&p).unwrap();
    // Same layout size, different inline_max: caught by the header check.
    let q = Params {
        inline_max: 150,
        large_size: 0,
        large_count: 0,
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
fn segment_has_version_3_and_the_ring_capacity_of_the_params() {
    let p = params();
    let (a, _fd) = Segment::create(&p).unwrap();
    assert_eq!(peek_u64(&a, hdr::VERSION) as u32, 3);
    let cap = a.layout().ring_capacity();
    assert!(cap.is_power_of_two());
    // At least `ring_depth` records of `inline_max` payload.
    assert!(cap >= p.ring_depth as usize * (8 + p.inline_max as usize).next_multiple_of(8));
    for dir in [Dir::AToB, Dir::BToA] {
        assert_eq!(a.layout().dir(dir).ring % 128, 0);
    }
}

#[test]
fn inline_round_trip_every_size_across_wraps() {
    let p = Params {
        buffer_size: 64,
        buffer_count: 1,
        ring_depth: 2,
        inline_max: 400,
        large_size: 0,
        large_count: 0,
    };
    let mut s = pair(&p);
    for round in 0..3u8 {
        for len in 0..=p.inline_max as usize {
            let msg: Vec<u8> = (0..len).map(|i| (i as u8) ^ round ^ (len as u8)).collect();
            assert!(s.tx_a.try_send_inline(&msg).unwrap());
            assert_eq!(
                poll1(&mut s.rx_b, &mut s.rel_b).unwrap(),
                Some(Got::Inline(msg))
            );
            assert_eq!(poll1(&mut s.rx_b, &mut s.rel_b).unwrap(), None);
        }
    }
    // The ring wrapped many times.
    assert!(s.rx_b.position() > 10 * s.tx_a.ring_capacity() as u64);
}

#[test]
fn buffers_round_trip_and_reclaim() {
    let p = params();
    let mut s = pair(&p);
    for i in 0..p.buffer_count {
        let b = s.tx_b.buffer_mut(i).unwrap();
        b.fill(i as u8);
        assert!(s.tx_b.try_send_buf(i, 100 + i).unwrap());
    }
    assert_eq!(s.tx_b.in_flight(), p.buffer_count);
    let mut got = Vec::new();
    while let Some(g) = poll1(&mut s.rx_a, &mut s.rel_a).unwrap() {
        got.push(g);
    }
    assert_eq!(got.len(), p.buffer_count as usize);
    assert_eq!(s.rel_a.held(), p.buffer_count);
    for (i, g) in got.iter().enumerate() {
        let Got::Buffer(index, data) = g else {
            panic!("{g:?}");
        };
        assert_eq!(*index, i as u32);
        assert_eq!(data.len(), 100 + i);
        assert!(data.iter().all(|&x| x == i as u8));
        s.rel_a.release(i as u32).unwrap();
    }
    let mut freed = [0u32; 64];
    // Not published yet.
    assert_eq!(s.tx_b.reclaim(&mut freed).unwrap(), 0);
    assert!(s.rel_a.has_unpublished_releases());
    s.rel_a.publish_releases();
    assert_eq!(s.tx_b.reclaim(&mut freed[..5]).unwrap(), 5);
    assert_eq!(s.tx_b.reclaim(&mut freed[5..]).unwrap(), 11);
    let mut got: Vec<u32> = freed[..16].to_vec();
    got.sort();
    assert_eq!(got, (0..16).collect::<Vec<_>>());
    assert_eq!(s.tx_b.in_flight(), 0);
}

#[test]
fn ring_full_is_backpressure_until_poll() {
    let p = params();
    let mut s = pair(&p);
    let mut sent = 0usize;
    while s.tx_a.try_send_inline(&[7u8; 200]).unwrap() {
        sent += 1;
        assert!(sent <= s.tx_a.ring_capacity() / 8);
    }
    // At least `ring_depth` messages of `inline_max` bytes fit.
    assert!(sent >= p.ring_depth as usize, "{sent}");
    // Smaller records fill the rest.
    while s.tx_a.try_send_inline(b"y").unwrap() {
        sent += 1;
    }
    while s.tx_a.try_send_inline(b"").unwrap() {
        sent += 1;
    }
    assert!(!s.tx_a.try_send_buf(0, 1).unwrap());
    // One poll of one record gives its space back.
    assert!(poll1(&mut s.rx_b, &mut s.rel_b).unwrap().is_some());
    assert!(s.tx_a.try_send_inline(b"y").unwrap());
    let mut n = 0;
    while poll1(&mut s.rx_b, &mut s.rel_b).unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, sent);
    assert_eq!(s.tx_a.consumer_position().unwrap(), s.tx_a.position());
}

#[test]
fn local_misuse_is_typed() {
    let p = params();
    let mut s = pair(&p);
    assert!(matches!(
        s.tx_a.try_send_inline(&[0; 201]),
        Err(WireError::PayloadTooLarge { len: 201, max: 200 })
    ));
    assert!(matches!(
        s.tx_a.try_send_buf(16, 1),
        Err(WireError::BadBufferIndex {
            index: 16,
            count: 16
        })
    ));
    assert!(matches!(
        s.tx_a.try_send_buf(0, 1025),
        Err(WireError::PayloadTooLarge { .. })
    ));
    assert!(s.tx_a.try_send_buf(0, 10).unwrap());
    assert!(matches!(
        s.tx_a.try_send_buf(0, 10),
        Err(WireError::BufferInFlight { index: 0 })
    ));
    assert!(matches!(
        s.tx_a.buffer_mut(0),
        Err(WireError::BufferInFlight { index: 0 })
    ));
    assert!(matches!(
        s.rel_b.release(0),
        Err(WireError::BufferNotHeld { index: 0 })
    ));
    assert!(matches!(
        s.rel_b.buffer(0, 10),
        Err(WireError::BufferNotHeld { index: 0 })
    ));
    assert!(matches!(
        s.rel_b.hold(16),
        Err(WireError::BadBufferIndex { .. })
    ));
    assert!(matches!(
        poll1(&mut s.rx_b, &mut s.rel_b).unwrap(),
        Some(Got::Buffer(0, _))
    ));
    assert!(matches!(
        s.rel_b.buffer(0, 2000),
        Err(WireError::PayloadTooLarge { .. })
    ));
    s.rel_b.release(0).unwrap();
    assert!(matches!(
        s.rel_b.release(0),
        Err(WireError::BufferNotHeld { index: 0 })
    ));
}

// ---------------------------------------------------------------------------------------------
// Hostile peer: targeted values

#[test]
fn hostile_record_values_are_corrupt() {
    let p = params();
    // Each case: let A send something honest, then overwrite it as a hostile A would.
    type Case = (&'static str, fn(&Segment), Option<Field>);
    let cases: [Case; 8] = [
        (
            "unknown type",
            |a| poke_u64(a, area_off(a, Dir::AToB, 0), header(16, 10)),
            None,
        ),
        (
            "reserved flags",
            |a| poke_u64(a, area_off(a, Dir::AToB, 0), header(16, 1) | 1 << 40),
            None,
        ),
        (
            "length below the header",
            |a| poke_u64(a, area_off(a, Dir::AToB, 0), header(3, 1)),
            None,
        ),
        (
            "inline longer than inline_max",
            |a| poke_u64(a, area_off(a, Dir::AToB, 0), header(8 + 201, 1)),
            None,
        ),
        (
            "record past the ring's end",
            |a| poke_u64(a, area_off(a, Dir::AToB, 0), header(u32::MAX, 3)),
            None,
        ),
        (
            "reserved type FRAG",
            |a| poke_u64(a, area_off(a, Dir::AToB, 0), header(16, 6)),
            None,
        ),
        (
            "buffer index out of range",
            |a| raw_buf_ref(a, Dir::AToB, 0, 16, 1),
            Some(Field::BufRefIndex),
        ),
        (
            "buffer len > size",
            |a| raw_buf_ref(a, Dir::AToB, 0, 3, 4096),
            Some(Field::BufRefLen),
        ),
    ];
    for (what, corrupt, field) in cases {
        let mut s = pair(&p);
        assert!(s.tx_a.try_send_inline(&[1u8; 100]).unwrap(), "{what}");
        corrupt(&s.a);
        let r = poll1(&mut s.rx_b, &mut s.rel_b);
        match field {
            Some(f) => assert_eq!(corrupt_field(r), f, "{what}"),
            None => assert!(matches!(&r, Err(WireError::Ring { .. })), "{what}: {r:?}"),
        }
        // The handle stays failed.
        assert!(poll1(&mut s.rx_b, &mut s.rel_b).is_err(), "{what}");
    }
}

#[test]
fn buffer_sent_twice_without_release_is_corrupt() {
    let p = params();
    let mut s = pair(&p);
    assert!(s.tx_a.try_send_buf(3, 10).unwrap());
    assert!(poll1(&mut s.rx_b, &mut s.rel_b).unwrap().is_some());
    // Hostile A re-publishes buffer 3 after the first record.
    raw_buf_ref(&s.a, Dir::AToB, 16, 3, 10);
    assert_eq!(
        corrupt_field(poll1(&mut s.rx_b, &mut s.rel_b)),
        Field::BufRefHeld
    );
}

#[test]
fn stale_records_from_the_previous_lap_read_empty() {
    let p = params();
    let mut s = pair(&p);
    let cap = s.tx_a.ring_capacity();
    // Variable sizes, so later laps' headers fall on earlier laps' payload bytes.
    let mut total = 0;
    let mut i = 0usize;
    while total < 3 * cap {
        let len = (i * 37) % 200;
        assert!(s.tx_a.try_send_inline(&vec![0xAB; len]).unwrap());
        assert_eq!(
            poll1(&mut s.rx_b, &mut s.rel_b).unwrap(),
            Some(Got::Inline(vec![0xAB; len]))
        );
        assert_eq!(poll1(&mut s.rx_b, &mut s.rel_b).unwrap(), None);
        total += 8 + len;
        i += 1;
    }
    assert_eq!(s.rx_b.pending_hint(), 0);
}

#[test]
fn hostile_consumer_position_is_corrupt() {
    let p = params();
    let pos_word = |s: &Pair| s.a.layout().dir(Dir::AToB).ring + CONSUMER_POSITION_OFFSET;
    // B (hostile) claims to have consumed more than A produced.
    let mut s = pair(&p);
    while s.tx_a.try_send_inline(&[0; 200]).unwrap() {}
    while s.tx_a.try_send_inline(b"a").unwrap() {}
    poke_u64(&s.b, pos_word(&s), s.tx_a.position() + 8);
    assert!(matches!(
        s.tx_a.try_send_inline(b"a"),
        Err(WireError::Ring { .. })
    ));
    // Misaligned.
    let mut s = pair(&p);
    while s.tx_a.try_send_inline(&[0; 200]).unwrap() {}
    poke_u64(&s.b, pos_word(&s), 4);
    assert!(matches!(
        s.tx_a.consumer_position(),
        Err(WireError::Ring { .. })
    ));
    // Moving backwards.
    let mut s = pair(&p);
    while s.tx_a.try_send_inline(&[0; 200]).unwrap() {}
    poke_u64(&s.b, pos_word(&s), 416);
    assert_eq!(s.tx_a.consumer_position().unwrap(), 416);
    poke_u64(&s.b, pos_word(&s), 208);
    assert!(matches!(
        s.tx_a.consumer_position(),
        Err(WireError::Ring { .. })
    ));
}

#[test]
fn hostile_release_ring_is_corrupt() {
    let p = params();
    let rel = |s: &Pair| *s.a.layout().dir(Dir::AToB);
    let mut out = [0u32; 32];

    // Index out of range.
    let mut s = pair(&p);
    let l = rel(&s);
    assert!(s.tx_a.try_send_buf(1, 1).unwrap());
    poke_u32(&s.b, l.rel_entries, 99);
    poke_u64(&s.b, l.rel_tail, 1);
    assert_eq!(corrupt_field(s.tx_a.reclaim(&mut out)), Field::ReleaseIndex);

    // Release of a buffer never sent (forged), and a duplicate release.
    let mut s = pair(&p);
    assert!(s.tx_a.try_send_buf(1, 1).unwrap());
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
        assert!(s.tx_a.try_send_buf(i, 1).unwrap());
        poll1(&mut s.rx_b, &mut s.rel_b).unwrap().unwrap();
        s.rel_b.release(i).unwrap();
    }
    s.rel_b.publish_releases();
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
    // Hostile A sends buffers 0..4, then re-sends one without reclaiming.
    let mut pos = 0u64;
    for i in 0..4 {
        raw_buf_ref(&s.a, Dir::AToB, pos, i, 1);
        pos += 16;
        poll1(&mut s.rx_b, &mut s.rel_b).unwrap().unwrap();
        s.rel_b.release(i).unwrap();
    }
    s.rel_b.publish_releases();
    raw_buf_ref(&s.a, Dir::AToB, pos, 0, 1);
    poll1(&mut s.rx_b, &mut s.rel_b).unwrap().unwrap();
    // Release ring (capacity 4) is full and A never reclaimed: overflow.
    assert_eq!(corrupt_field(s.rel_b.release(0)), Field::ReleaseOverflow);
    // A head beyond what was published is corrupt.
    poke_u64(&s.a, l.rel_head, 9);
    assert_eq!(corrupt_field(s.rel_b.release(0)), Field::ReleaseHead);
    let _ = &s.tx_a;
}

// ---------------------------------------------------------------------------------------------
// Hostile peer: seeded fuzz

/// Checks a result: Ok, or a corrupt error (the only error an honest caller can get from a
/// hostile peer). Returns whether the connection must be failed.
fn check<T>(r: Result<T, WireError>) -> (Option<T>, bool) {
    match r {
        Ok(v) => (Some(v), false),
        Err(e) if e.is_corrupt() => (None, true),
        Err(e) => panic!("non-corrupt error from honest use: {e:?}"),
    }
}

/// A hostile value for a random peer-writable word: random bits, or one near a boundary.
fn hostile_value(rng: &mut XorShift, p: &Params, cap: u64) -> u64 {
    match rng.below(8) {
        0 => rng.next(),
        1 => u64::from(p.buffer_count) + rng.below(3),
        2 => header(8 + p.inline_max + rng.below(3) as u32, 1),
        3 => header(16, 2) | rng.below(4) << 40,
        4 => rng.below(4 * cap),
        5 => header(rng.below(64) as u32, 1 + rng.below(8) as u8),
        6 => (u64::from(p.buffer_size) + rng.below(3)) | (rng.below(8) << 32),
        _ => u64::MAX - rng.below(3),
    }
}

fn fuzz_one(seed: u64, steps: u32) -> (u32, u32) {
    let mut rng = XorShift::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let p = Params {
        buffer_size: 64 << rng.below(3),
        buffer_count: 1 + rng.below(8) as u32,
        ring_depth: 2 << rng.below(4),
        inline_max: rng.below(300) as u32,
        large_size: 0,
        large_count: 0,
    };
    p.validate().unwrap();
    let mut s = pair(&p);
    let len = s.a.len();
    let cap = s.a.layout().ring_capacity() as u64;
    let mut free_a: Vec<u32> = (0..p.buffer_count).collect();
    let mut held_b: Vec<u32> = Vec::new();
    let out = vec![0u8; p.inline_max as usize + 1];
    let mut reclaimed = vec![0u32; p.buffer_count as usize];
    let (mut corrupt, mut received) = (0u32, 0u32);
    for _ in 0..steps {
        let failed = match rng.below(16) {
            // Honest traffic A -> B.
            0..=2 => {
                let n = rng.below(u64::from(p.inline_max) + 1) as usize;
                check(s.tx_a.try_send_inline(&out[..n])).1
            }
            3 | 4 => match free_a.pop() {
                Some(i) => {
                    let (ok, f) = check(
                        s.tx_a
                            .try_send_buf(i, rng.below(u64::from(p.buffer_size) + 1) as u32),
                    );
                    if ok != Some(true) {
                        free_a.push(i);
                    }
                    f
                }
                None => false,
            },
            5..=8 => {
                let limit = 1 + rng.below(4) as usize;
                let rel = &mut s.rel_b;
                let mut held = Vec::new();
                let mut bad = false;
                let r = s.rx_b.poll(limit, |m| {
                    received += 1;
                    match m {
                        RxMsg::Inline(b) => assert!(b.len() <= p.inline_max as usize),
                        RxMsg::Buffer { index, len } => match rel.hold(index) {
                            Ok(()) => {
                                assert_eq!(
                                    rel.buffer(index, len as usize).unwrap().len(),
                                    len as usize
                                );
                                held.push(index);
                            }
                            Err(e) => {
                                assert!(e.is_corrupt());
                                bad = true;
                            }
                        },
                    }
                });
                held_b.extend(held);
                check(r).1 || bad
            }
            9 | 10 => match held_b.pop() {
                Some(i) => {
                    let f = check(s.rel_b.release(i)).1;
                    s.rel_b.publish_releases();
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
                poke_u64(&s.a, off, hostile_value(&mut rng, &p, cap));
                false
            }
            // Targeted: a record header or payload word near the reader.
            14 => {
                let pos = s.rx_b.position() + rng.below(8) * 8;
                poke_u64(
                    &s.a,
                    area_off(&s.a, Dir::AToB, pos),
                    hostile_value(&mut rng, &p, cap),
                );
                false
            }
            // A position or release-ring word.
            _ => {
                let l = s.a.layout().dir(Dir::AToB);
                let word = [
                    l.ring + CONSUMER_POSITION_OFFSET,
                    l.ring,
                    l.rel_tail,
                    l.rel_head,
                ][rng.below(4) as usize];
                let cur = peek_u64(&s.a, word);
                let v = match rng.below(3) {
                    0 => cur.wrapping_add(rng.below(3) * 8),
                    1 => cur.wrapping_sub(rng.below(3)),
                    _ => hostile_value(&mut rng, &p, cap),
                };
                poke_u64(&s.a, word, v);
                false
            }
        };
        if failed {
            // The connection would be failed; keep poking the dead handles once more to prove
            // they stay memory safe, then start a new connection.
            let _ = s.rx_b.poll(8, |_| {});
            let _ = s.tx_a.reclaim(&mut reclaimed);
            let _ = s.tx_a.try_send_inline(&[]);
            corrupt += 1;
            s = pair(&p);
            free_a = (0..p.buffer_count).collect();
            held_b.clear();
        }
    }
    let _ = (&s.b, &s.rx_a, &s.tx_b, &s.rel_a);
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

/// Deterministic message `seq`: its length and whether it goes inline. Its bytes are the
/// testkit's frame `seq` (sequence number, pattern, FNV-1a checksum: every byte checked).
fn expected_len(seq: u64, p: &Params) -> (usize, bool) {
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    let inline = x % 4 != 0;
    let max = if inline { p.inline_max } else { p.buffer_size } as u64;
    (12 + ((x >> 8) % (max - 11)) as usize, inline)
}

/// Checks that `data`, received inline or not (`inline`), is message `seq`.
fn verify(seq: u64, data: &[u8], p: &Params, inline: bool) {
    let (len, want_inline) = expected_len(seq, p);
    assert_eq!(inline, want_inline, "seq {seq}");
    data::verify(data, seq as u32, len);
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

/// The sending side of a stress run: its free buffers and scratch space.
struct Sending {
    free: Vec<u32>,
    reclaimed: Vec<u32>,
}

impl Sending {
    fn new(p: &Params) -> Self {
        Sending {
            free: (0..p.buffer_count).collect(),
            reclaimed: vec![0u32; p.buffer_count as usize],
        }
    }

    /// Tries once to send message `seq` (inline or in a buffer, reclaiming buffers when none is
    /// free); whether it went.
    fn try_send(&mut self, tx: &mut TxRing, p: &Params, seq: u64) -> bool {
        let (len, inline) = expected_len(seq, p);
        if inline {
            // In place in the ring.
            let Some(mut c) = tx.claim(len).unwrap() else {
                return false;
            };
            data::fill(c.payload_mut(), seq as u32);
            c.commit();
            return true;
        }
        if self.free.is_empty() {
            let k = tx.reclaim(&mut self.reclaimed).unwrap();
            self.free.extend_from_slice(&self.reclaimed[..k]);
        }
        let Some(i) = self.free.pop() else {
            return false;
        };
        data::fill(&mut tx.buffer_mut(i).unwrap()[..len], seq as u32);
        let ok = tx.try_send_buf(i, len as u32).unwrap();
        if !ok {
            self.free.push(i);
        }
        ok
    }
}

/// Polls up to `limit` messages, checking that they are messages `*seq..` (releasing their
/// buffers, published once per batch); returns how many.
fn try_recv(rx: &mut RxRing, rel: &mut Releaser, p: &Params, seq: &mut u64, limit: usize) -> usize {
    let n = rx
        .poll(limit, |m| {
            match m {
                RxMsg::Inline(b) => verify(*seq, b, p, true),
                RxMsg::Buffer { index, len } => {
                    rel.hold(index).unwrap();
                    verify(*seq, rel.buffer(index, len as usize).unwrap(), p, false);
                    rel.release(index).unwrap();
                }
            }
            *seq += 1;
        })
        .unwrap();
    rel.publish_releases();
    n
}

/// Sends messages `0..n` from `tx`, verifying nothing; reclaims buffers as needed.
fn sender(tx: &mut TxRing, p: &Params, n: u64, deadline: Instant) {
    let mut sending = Sending::new(p);
    let mut idle = 0;
    let mut seq = 0;
    while seq < n {
        if sending.try_send(tx, p, seq) {
            seq += 1;
            idle = 0;
        } else {
            backoff(&mut idle, deadline, "sender");
        }
    }
}

/// Receives and verifies messages `0..n` in batches of varying size.
fn receiver(rx: &mut RxRing, rel: &mut Releaser, p: &Params, n: u64, deadline: Instant) {
    let mut idle = 0;
    let mut seq = 0;
    while seq < n {
        let limit = 1 + (seq % 13) as usize;
        let limit = limit.min((n - seq) as usize);
        if try_recv(rx, rel, p, &mut seq, limit) > 0 {
            idle = 0;
        } else {
            backoff(&mut idle, deadline, "receiver");
        }
    }
    assert_eq!(rx.poll(8, |_| {}).unwrap(), 0);
}

/// Both directions at once on one thread: interleaves non-blocking send and receive steps until
/// `n` messages went each way, verifying every received payload.
fn duplex(
    tx: &mut TxRing,
    rx: &mut RxRing,
    rel: &mut Releaser,
    p: &Params,
    n: u64,
    deadline: Instant,
) {
    let mut sending = Sending::new(p);
    let (mut sent, mut got, mut idle) = (0u64, 0u64, 0u32);
    while sent < n || got < n {
        let mut progress = false;
        if sent < n && sending.try_send(tx, p, sent) {
            sent += 1;
            progress = true;
        }
        let limit = (1 + (got % 5) as usize).min((n - got) as usize);
        if limit > 0 && try_recv(rx, rel, p, &mut got, limit) > 0 {
            progress = true;
        }
        if progress {
            idle = 0;
        } else {
            backoff(&mut idle, deadline, "duplex");
        }
    }
}

#[test]
fn two_thread_duplex_stress_verified_payloads() {
    let _g = serial();
    let p = Params {
        buffer_size: 256,
        buffer_count: 4,
        ring_depth: 16,
        inline_max: 120,
        large_size: 0,
        large_count: 0,
    };
    let Pair {
        a: _a,
        b: _b,
        mut tx_a,
        mut rx_a,
        mut rel_a,
        mut tx_b,
        mut rx_b,
        mut rel_b,
    } = pair(&p);
    let n = stress_count() / 4;
    let deadline = Instant::now() + Duration::from_secs(120);
    let t = std::thread::spawn(move || duplex(&mut tx_b, &mut rx_b, &mut rel_b, &p, n, deadline));
    duplex(&mut tx_a, &mut rx_a, &mut rel_a, &p, n, deadline);
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
    let _g = serial();
    let p = Params {
        buffer_size: 512,
        buffer_count: 8,
        ring_depth: 64,
        inline_max: 150,
        large_size: 0,
        large_count: 0,
    };
    let Pair {
        a,
        b,
        mut tx_a,
        rx_a: _rx_a,
        rel_a: _rel_a,
        tx_b: _tx_b,
        mut rx_b,
        mut rel_b,
    } = pair(&p);
    let n = stress_count();
    let deadline = Instant::now() + Duration::from_secs(120);
    let t = std::thread::spawn(move || {
        receiver(&mut rx_b, &mut rel_b, &p, n, deadline);
        rel_b
    });
    sender(&mut tx_a, &p, n, deadline);
    let rel_b = t.join().unwrap();
    assert_eq!(rel_b.held(), 0);
    drop((a, b));
}

#[test]
fn two_thread_ping_pong_both_directions() {
    let _g = serial();
    let p = params();
    let Pair {
        a: _a,
        b: _b,
        mut tx_a,
        mut rx_a,
        mut rel_a,
        mut tx_b,
        mut rx_b,
        mut rel_b,
    } = pair(&p);
    let n: u64 = if cfg!(debug_assertions) {
        5_000
    } else {
        50_000
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let echo = std::thread::spawn(move || {
        let mut idle = 0;
        for _ in 0..n {
            let m = loop {
                if let Some(Got::Inline(m)) = poll1(&mut rx_b, &mut rel_b).unwrap() {
                    break m;
                }
                backoff(&mut idle, deadline, "echo");
            };
            while !tx_b.try_send_inline(&m).unwrap() {
                backoff(&mut idle, deadline, "echo send");
            }
        }
    });
    let mut idle = 0;
    for i in 0..n {
        let len = (i % 201) as usize;
        let msg: Vec<u8> = (0..len).map(|j| (i as u8).wrapping_add(j as u8)).collect();
        assert!(tx_a.try_send_inline(&msg).unwrap());
        let m = loop {
            if let Some(g) = poll1(&mut rx_a, &mut rel_a).unwrap() {
                break g;
            }
            backoff(&mut idle, deadline, "ping");
        };
        assert_eq!(m, Got::Inline(msg));
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
        large_size: 0,
        large_count: 0,
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
        large_size: 0,
        large_count: 0,
    }
}

/// Child role of `two_process_stress_over_uds_rendezvous`: attaches to the parent's segment
/// through the rendezvous named in `CHILD_ENV`, receives and verifies every message, and
/// reports success in-band.
#[test]
#[ignore = "child role: run by two_process_stress_over_uds_rendezvous"]
fn child_receiver_process() {
    let name = role::env(CHILD_ENV);
    let p = proc_params();
    let mut c = cm::uds::connect(&name, T).unwrap();
    c.send_hello(&conn_params(&p), T).unwrap();
    let offer = c.recv_offer(T).unwrap();
    assert_eq!(offer.params, conn_params(&p));
    let seg = Segment::attach(offer.segment.as_fd(), &p).unwrap();
    drop(offer);
    c.send_ready(T).unwrap();
    let (mut tx, mut rx, mut rel) = seg.split().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    receiver(&mut rx, &mut rel, &p, proc_count(), deadline);
    // Report success in-band.
    assert!(tx.try_send_inline(b"verified").unwrap());
    // Wait for the parent to read it and hang up.
    let t0 = Instant::now();
    while !c.poll_hangup().unwrap() && t0.elapsed() < T {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn two_process_stress_over_uds_rendezvous() {
    let _g = serial();
    let p = proc_params();
    let name = format!("shm-wire-test-{}", std::process::id());
    let l = cm::uds::UdsListener::bind(&name).unwrap();
    let mut child = KillOnDrop(
        role::command("child_receiver_process")
            .env(CHILD_ENV, &name)
            .spawn()
            .unwrap(),
    );
    let mut s = l.accept_timeout(T).unwrap();
    let hello = s.recv_hello(T).unwrap();
    assert_eq!(hello.params, conn_params(&p));
    let (seg, fd) = Segment::create(&p).unwrap();
    s.send_accept(&hello.params, fd.as_fd(), T).unwrap();
    drop(fd);
    s.recv_ready(T).unwrap();
    assert!(seg.peer_state().attached);
    assert_eq!(seg.peer_state().pid, child.id());
    let (mut tx, mut rx, mut rel) = seg.split().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    sender(&mut tx, &p, proc_count(), deadline);
    let mut idle = 0;
    let m = loop {
        if let Some(m) = poll1(&mut rx, &mut rel).unwrap() {
            break m;
        }
        assert!(!s.poll_hangup().unwrap(), "child died");
        backoff(&mut idle, deadline, "child report");
    };
    assert_eq!(m, Got::Inline(b"verified".to_vec()));
    drop(s); // hang up: the child exits
    let status = wait_timeout(&mut child, T).expect("child exits after the hang-up");
    assert!(status.success(), "child failed: {status:?}");
    assert!(
        seg.is_peer_closed(),
        "child's segment handles dropped at exit"
    );
}

const KILL_CHILD_ENV: &str = "SHM_WIRE_TEST_KILL_CHILD_NAME";

/// Child role of `sigkilled_peer_is_seen_and_segment_stays_valid`: attaches through the
/// rendezvous named in `KILL_CHILD_ENV`, sends one message, then waits to be killed (bounded).
#[test]
#[ignore = "child role: run by sigkilled_peer_is_seen_and_segment_stays_valid"]
fn child_attach_and_wait() {
    let name = role::env(KILL_CHILD_ENV);
    let p = proc_params();
    let mut c = cm::uds::connect(&name, T).unwrap();
    c.send_hello(&conn_params(&p), T).unwrap();
    let offer = c.recv_offer(T).unwrap();
    let seg = Segment::attach(offer.segment.as_fd(), &p).unwrap();
    c.send_ready(T).unwrap();
    let (mut tx, _rx, _rel) = seg.split().unwrap();
    assert!(tx.try_send_inline(b"attached").unwrap());
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn sigkilled_peer_is_seen_and_segment_stays_valid() {
    let p = proc_params();
    let name = format!("shm-wire-kill-{}", std::process::id());
    let l = cm::uds::UdsListener::bind(&name).unwrap();
    let mut child = KillOnDrop(
        role::command("child_attach_and_wait")
            .env(KILL_CHILD_ENV, &name)
            .spawn()
            .unwrap(),
    );
    let mut s = l.accept_timeout(T).unwrap();
    let hello = s.recv_hello(T).unwrap();
    let (seg, fd) = Segment::create(&p).unwrap();
    s.send_accept(&hello.params, fd.as_fd(), T).unwrap();
    drop(fd);
    s.recv_ready(T).unwrap();
    let (mut tx, mut rx, mut rel) = seg.split().unwrap();
    let deadline = Instant::now() + T;
    let mut idle = 0;
    let m = loop {
        if let Some(m) = poll1(&mut rx, &mut rel).unwrap() {
            break m;
        }
        backoff(&mut idle, deadline, "child message");
    };
    assert_eq!(m, Got::Inline(b"attached".to_vec()));

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
    assert!(tx.try_send_inline(b"anyone?").unwrap());
    assert!(poll1(&mut rx, &mut rel).unwrap().is_none());
}
