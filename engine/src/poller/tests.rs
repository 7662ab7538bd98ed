//! The poller on `mem://` ends, outside any engine: commands, the per-connection pass
//! (descriptors both ways, freed buffers, credits, releases) and retirement.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::*;
use crate::config::Config;
use crate::desc::{packed_entry, RxDesc, TxDesc, BUF_PACKED};
use crate::fabric::mem::{setup, MemFabric};
use crate::link::{conn_pair, AppPath, AppRings, ConnParts};

fn cfg() -> Config {
    crate::Engine::builder()
        .pool(256, 8)
        .depth(4)
        .inline_threshold(64)
        .validate()
        .expect("config")
}

/// A poller whose receive steps pack small messages when `pack` (a dedicated poller's).
fn poller_packing(pack: bool) -> (Poller<MemFabric>, PollerLink<MemFabric>) {
    let waker = Arc::new(Waker::new().expect("eventfd"));
    Poller::with_link(MemFabric, waker, Arc::default(), 4, 8, None, pack)
}

fn poller() -> (Poller<MemFabric>, PollerLink<MemFabric>) {
    poller_packing(false)
}

/// Both ends registered with `poller` (ids 1 and 2): their application parts.
fn connect(link: &mut PollerLink<MemFabric>, cfg: &Config) -> (ConnParts, ConnParts) {
    let (a, b) = setup::test_pair(cfg, "poller-unit");
    let (pa, ha) = conn_pair(1, "a".into(), a.conn, a.pools, a.keep, cfg);
    let (pb, hb) = conn_pair(2, "b".into(), b.conn, b.pools, b.keep, cfg);
    link.send(Command::Add(ha));
    link.send(Command::Add(hb));
    (pa, pb)
}

fn rings(p: &mut ConnParts) -> &mut AppRings {
    match &mut p.path {
        AppPath::Rings(r) => r,
        AppPath::Direct(_) => panic!("a poller connection"),
    }
}

/// Writes `bytes` into send buffer `buf` of `p` and queues it.
fn send(p: &mut ConnParts, buf: u32, bytes: &[u8]) {
    let dst = p.pools.tx.buf_ptr(buf);
    // SAFETY: `buf` is a buffer of the send pool taken from the free ring (the application
    // owns it) and `bytes` fits it (the tests send at most the buffer size).
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.as_ptr(), bytes.len()) };
    rings(p)
        .tx
        .push(TxDesc::new(buf, bytes.len() as u32))
        .expect("send ring room");
}

fn payload(p: &ConnParts, d: &RxDesc) -> Vec<u8> {
    match d.buf() {
        None => {
            // SAFETY: an inline descriptor's first `len` bytes are initialised.
            unsafe { std::slice::from_raw_parts(d.data.as_ptr().cast::<u8>(), d.len()).to_vec() }
        }
        Some(b) => {
            let base = p.pools.rx.buf_ptr(b).as_ptr();
            // SAFETY: the sink checked `offset + len` against the receive pool's buffer size.
            unsafe { std::slice::from_raw_parts(base.add(d.offset() as usize), d.len()).to_vec() }
        }
    }
}

fn run(p: &mut Poller<MemFabric>, cycles: usize) -> usize {
    (0..cycles).map(|_| p.do_work(0)).sum()
}

#[test]
fn commands_add_connections_and_the_pass_moves_messages_both_ways() {
    let cfg = cfg();
    let (mut p, mut link) = poller();
    let (mut a, mut b) = connect(&mut link, &cfg);
    assert!(run(&mut p, 1) >= 2, "two Add commands");
    assert_eq!(p.active.len(), 2);

    // Inline (copied, freed at once) and pooled (lent in place).
    let small = rings(&mut a).free.pop().unwrap();
    let big = rings(&mut a).free.pop().unwrap();
    send(&mut a, small, b"hello");
    send(&mut a, big, &[7u8; 200]);
    run(&mut p, 3);
    let d1 = rings(&mut b).rx.pop().expect("first");
    let d2 = rings(&mut b).rx.pop().expect("second");
    assert_eq!(payload(&b, &d1), b"hello");
    assert_eq!(d1.buf(), None, "inline");
    assert_eq!(payload(&b, &d2), vec![7u8; 200]);
    assert_eq!(d2.buf(), Some(big), "lent in place: the sender's buffer");
    // Two credits came back (delivered), the copied buffer is free, the lent one is not.
    assert_eq!(a.shared.credits.load(Ordering::Acquire), 2);
    let free: Vec<u32> = std::iter::from_fn(|| rings(&mut a).free.pop().ok()).collect();
    assert!(free.contains(&small) && !free.contains(&big), "{free:?}");

    // The receiver drops the lent message: the sender gets its buffer back.
    rings(&mut b).release.push(big).unwrap();
    run(&mut p, 3);
    assert_eq!(rings(&mut a).free.pop(), Ok(big));

    // And the other way.
    let buf = rings(&mut b).free.pop().unwrap();
    send(&mut b, buf, b"back");
    run(&mut p, 3);
    let d = rings(&mut a).rx.pop().expect("reply");
    assert_eq!(payload(&a, &d), b"back");
}

#[test]
fn a_full_receive_ring_holds_records_back_until_there_is_room() {
    let cfg = cfg();
    let (mut p, mut link) = poller();
    let (mut a, mut b) = connect(&mut link, &cfg);
    run(&mut p, 1);
    // depth 4: the receive ring holds 4; send 4 now, 4 once credits return.
    for i in 0..4u8 {
        let buf = rings(&mut a).free.pop().unwrap();
        send(&mut a, buf, &[i; 10]);
    }
    run(&mut p, 4);
    assert_eq!(a.shared.credits.load(Ordering::Acquire), 4);
    for i in 4..8u8 {
        let buf = loop {
            if let Ok(buf) = rings(&mut a).free.pop() {
                break buf;
            }
            run(&mut p, 1);
        };
        send(&mut a, buf, &[i; 10]);
    }
    run(&mut p, 4);
    // The application ring is full: the rest waits in the fabric, no credit for it yet.
    assert_eq!(a.shared.credits.load(Ordering::Acquire), 4);
    assert!(p.counters.rx_ring_full.get() > 0);
    for i in 0..8u8 {
        let d = loop {
            if let Ok(d) = rings(&mut b).rx.pop() {
                break d;
            }
            run(&mut p, 1);
        };
        assert_eq!(payload(&b, &d), vec![i; 10], "in order");
    }
    run(&mut p, 2);
    assert_eq!(a.shared.credits.load(Ordering::Acquire), 8);
}

#[test]
fn remove_retires_and_the_peer_drains_then_sees_the_close() {
    let cfg = cfg();
    let (mut p, mut link) = poller();
    let (mut a, b) = connect(&mut link, &cfg);
    run(&mut p, 1);
    let buf = rings(&mut a).free.pop().unwrap();
    send(&mut a, buf, b"last words");
    // The close: one last pass sends what was queued.
    link.send(Command::Remove(1));
    run(&mut p, 1);
    let Ok(Notice::Retired { conn, error }) = link.notices.pop() else {
        panic!("connection 1 retired")
    };
    assert_eq!((conn.id, error), (1, None));
    drop(conn);
    run(&mut p, 4);
    let Ok(Notice::Retired { conn, error }) = link.notices.pop() else {
        panic!("connection 2 retired after its peer's close")
    };
    assert_eq!((conn.id, error), (2, Some(FabricError::PeerClosed)));
    assert_eq!(b.shared.down(), Some(crate::link::Down::Disconnected));
    // What the peer sent before closing was delivered first.
    let mut b = b;
    let d = rings(&mut b).rx.pop().expect("delivered before the close");
    assert_eq!(payload(&b, &d), b"last words");
    assert!(p.active.is_empty());
}

#[test]
fn inline_descriptors_are_delivered_and_an_overlong_one_fails_the_connection() {
    use crate::desc::TX_INLINE_MAX;
    let cfg = cfg();
    let (mut p, mut link) = poller();
    let (mut a, mut b) = connect(&mut link, &cfg);
    run(&mut p, 1);
    assert!(rings(&mut a).inline_sends, "mem takes inline descriptors");
    // Every inline length, 0 ..= TX_INLINE_MAX, in order; no buffer is taken or freed.
    let free_before = rings(&mut a).free.slots();
    for len in 0..=TX_INLINE_MAX {
        let mut src = [0xeeu8; TX_INLINE_MAX];
        for (i, b) in src[..len].iter_mut().enumerate() {
            *b = i as u8 ^ len as u8;
        }
        let bytes = &src[..len];
        // SAFETY: `len <= TX_INLINE_MAX`, and `src` is `TX_INLINE_MAX` initialised bytes.
        let d = unsafe { TxDesc::inline_from(src.as_ptr(), len as u32) };
        assert_eq!(d.inline_payload(), Some(bytes));
        rings(&mut a).tx.push(d).expect("send ring room");
        // depth 4: take each at once.
        let got = loop {
            if let Ok(d) = rings(&mut b).rx.pop() {
                break d;
            }
            run(&mut p, 1);
        };
        assert_eq!(payload(&b, &got), bytes, "length {len}");
    }
    assert_eq!(
        rings(&mut a).free.slots(),
        free_before,
        "no buffer went through the free ring"
    );
    assert!(a.shared.down().is_none());

    // A descriptor marked inline but longer than a descriptor holds: a protocol failure of
    // the connection, nothing delivered.
    rings(&mut a)
        .tx
        .push(TxDesc::new(u32::MAX, TX_INLINE_MAX as u32 + 1))
        .expect("send ring room");
    run(&mut p, 3);
    assert_eq!(
        a.shared.down(),
        Some(crate::link::Down::Failed(FabricError::Protocol(
            "invalid send descriptor"
        )))
    );
    assert!(rings(&mut b).rx.pop().is_err());
}

/// The messages of a descriptor popped from a receive ring, packed ones unpacked as the
/// application does.
fn unpack(p: &ConnParts, d: &RxDesc) -> Vec<Vec<u8>> {
    if d.buf != BUF_PACKED {
        return vec![payload(p, d)];
    }
    let (mut left, mut next, mut out) = (0, 0, Vec::new());
    loop {
        // SAFETY: a packed descriptor, its cursor as the earlier calls left it.
        let (src, len, last) = unsafe { packed_entry(d, &mut left, &mut next) };
        // SAFETY: `packed_entry` points at `len` initialised bytes of the descriptor.
        out.push(unsafe { std::slice::from_raw_parts(src, len as usize) }.to_vec());
        if last {
            return out;
        }
    }
}

#[test]
fn a_dedicated_pollers_pass_packs_small_messages_and_a_full_ring_still_holds_the_rest_back() {
    let cfg = cfg();
    let (mut p, mut link) = poller_packing(true);
    let (mut a, mut b) = connect(&mut link, &cfg);
    run(&mut p, 1);
    // depth 4: a window of four 10-byte messages (inline descriptors: no buffer to wait for),
    // queued before a pass takes them: one receive slot.
    let mut want = Vec::new();
    for i in 0..4u8 {
        let m = [i; 10];
        // SAFETY: 10 <= TX_INLINE_MAX, and `m` is 10 initialised bytes.
        let d = unsafe { TxDesc::inline_from(m.as_ptr(), 10) };
        rings(&mut a).tx.push(d).expect("send ring room");
        want.push(m.to_vec());
    }
    run(&mut p, 4);
    assert_eq!(a.shared.credits.load(Ordering::Acquire), 4);
    // Four of 60 bytes, which cannot share a slot (2 + 60 more than the 120 bytes hold): three
    // fit the ring's other three slots, the last waits in the fabric, without credit.
    let bufs: Vec<u32> = std::iter::from_fn(|| rings(&mut a).free.pop().ok())
        .filter(|&b| !crate::desc::is_large(b))
        .take(4)
        .collect();
    for (i, &buf) in (4..8u8).zip(&bufs) {
        send(&mut a, buf, &[i; 60]);
        want.push(vec![i; 60]);
    }
    run(&mut p, 4);
    assert_eq!(a.shared.credits.load(Ordering::Acquire), 7);
    assert!(p.counters.rx_ring_full.get() > 0);
    let (mut got, mut slots) = (Vec::new(), 0);
    while got.len() < want.len() && slots < 8 {
        let d = loop {
            if let Ok(d) = rings(&mut b).rx.pop() {
                break d;
            }
            run(&mut p, 1);
        };
        slots += 1;
        got.extend(unpack(&b, &d));
    }
    assert_eq!(got, want, "in order, none lost");
    assert_eq!(slots, 5, "a packed slot of 4, then one slot each");
    run(&mut p, 2);
    assert_eq!(a.shared.credits.load(Ordering::Acquire), 8);
}
