//! The control seam's [`Registry`](crate::fabric::control::Registry) with `mem://` connections
//! and a bare poller: registration, the teardown model (a close finished by the poller's
//! notice, or at once with a zero grace), failures reported as events; and a listener's inbox
//! taken one end at a time, as the shared control half's accept burst does.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rings::RingBuffer;

use super::control::MemSetup;
use super::datapath::Channel;
use super::setup::{self, MemListenerState};
use super::{End, Faults, MemFabric};
use crate::config::Config;
use crate::desc::TxDesc;
use crate::event::Event;
use crate::fabric::control::{Ctx, NewConn, Registry};
use crate::link::{AppPath, ConnParts};
use crate::poller::{Poller, PollerLink};
use crate::stats::EngineCounters;

/// The registry `mem://`'s control half keeps, over one bare poller's link.
type MemRegistry = Registry<Vec<PollerLink<MemFabric>>, MemListenerState, MemSetup>;

fn cfg() -> Config {
    crate::Engine::builder()
        .pool(256, 8)
        .depth(4)
        .validate()
        .expect("config")
}

struct Rig {
    cfg: Config,
    next_id: u64,
    events: rings::Producer<Event>,
    seen: rings::Consumer<Event>,
    counters: EngineCounters,
    reg: MemRegistry,
    poller: Poller<MemFabric>,
}

impl Rig {
    fn new() -> Rig {
        let waker = Arc::new(cm::control::Waker::new().expect("eventfd"));
        let (poller, link) = Poller::with_link(MemFabric, waker, Arc::default(), 4, 8, None, true);
        let (events, seen) = RingBuffer::new(64);
        Rig {
            cfg: cfg(),
            next_id: 1,
            events,
            seen,
            counters: EngineCounters::default(),
            reg: Registry::new(vec![link]),
            poller,
        }
    }

    fn ctx(&mut self) -> (Ctx<'_>, &mut MemRegistry) {
        (
            Ctx {
                cfg: &self.cfg,
                next_id: &mut self.next_id,
                events: &mut self.events,
                counters: &self.counters,
            },
            &mut self.reg,
        )
    }

    /// Registers both ends of a fresh pair; returns their ids and the channel.
    fn register_pair(&mut self, name: &str) -> (u64, u64, Arc<Channel>) {
        let (a, b, chan, _) = self.register_pair_parts(name);
        (a, b, chan)
    }

    /// As [`register_pair`](Self::register_pair), with the connecting end's application parts.
    fn register_pair_parts(&mut self, name: &str) -> (u64, u64, Arc<Channel>, ConnParts) {
        let (a, b) = setup::test_pair(&self.cfg, name);
        let chan = a.chan.clone();
        let mut ids = [0; 2];
        let mut first = None;
        for (i, est) in [a, b].into_iter().enumerate() {
            let (mut ctx, reg) = self.ctx();
            let new = NewConn {
                poller: 0,
                conn: est.conn,
                pools: est.pools,
                keep: est.keep,
                setup: MemSetup::new(est.chan, est.me),
                path: Some(est.peer),
            };
            let parts = reg
                .register(&mut ctx, new, name.into(), None)
                .expect("register");
            ids[i] = parts.id;
            first.get_or_insert(parts);
        }
        (ids[0], ids[1], chan, first.expect("two ends"))
    }

    fn drain(&mut self) {
        let (mut ctx, reg) = self.ctx();
        reg.drain(&mut ctx);
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.seen.pop().ok()).collect()
    }
}

#[test]
fn register_counts_emits_connected_and_hands_the_connection_to_the_poller() {
    let mut rig = Rig::new();
    let (a, b, _) = rig.register_pair("reg-unit-1");
    assert_eq!((a, b), (1, 2));
    assert_eq!(rig.reg.pollers[0].load, 2);
    assert_eq!(rig.counters.connections_opened.load(Ordering::Relaxed), 2);
    assert!(matches!(
        rig.events()[..],
        [
            Event::Connected { conn: 1, .. },
            Event::Connected { conn: 2, .. }
        ]
    ));
    rig.poller.do_work(0);
    assert_eq!(rig.poller.do_work(0), 0, "both served, nothing to do");
}

#[test]
fn a_close_is_finished_by_the_pollers_notice_and_the_peer_reports_a_disconnect() {
    let mut rig = Rig::new();
    let (a, b, chan) = rig.register_pair("reg-unit-2");
    rig.poller.do_work(0);
    rig.events();
    // Dedicated-poller model: no grace, finished only when the poller lets go.
    let (mut ctx, reg) = rig.ctx();
    assert!(reg.close(&mut ctx, a, None));
    assert!(reg.conns[&a].is_closing());
    rig.poller.do_work(0);
    rig.drain();
    assert!(!rig.reg.conns.contains_key(&a), "finished on Retired");
    assert!(chan.ends[0].closed.load(Ordering::Acquire) != 0);
    // The peer's poller sees the close, drains and retires it: reported as a disconnect.
    for _ in 0..4 {
        rig.poller.do_work(0);
    }
    rig.drain();
    assert!(!rig.reg.conns.contains_key(&b));
    assert!(matches!(rig.events()[..], [Event::Disconnected { conn }] if conn == b));
    assert_eq!(rig.reg.pollers[0].load, 0);
    assert_eq!(rig.counters.connections_closed.load(Ordering::Relaxed), 2);
}

#[test]
fn a_zero_grace_finishes_at_once_and_a_failure_is_reported_once() {
    let mut rig = Rig::new();
    let (a, b, chan) = rig.register_pair("reg-unit-3");
    rig.poller.do_work(0);
    rig.events();
    let (mut ctx, reg) = rig.ctx();
    assert!(reg.close(&mut ctx, a, Some(Duration::ZERO)));
    assert!(!reg.conns.contains_key(&a), "finished at once");
    assert!(
        chan.ends[0].closed.load(Ordering::Acquire) != 0,
        "its end marked closed"
    );
    assert!(!reg.close(&mut ctx, a, None), "gone");
    rig.poller.do_work(0);
    rig.drain();

    // A corrupt record from a fresh pair's connecting end fails the accepted end, reported
    // once as an error; its close then fails the connecting end, which learns why (the
    // accepted end aborted it for a protocol violation).
    let (c, d, _, mut parts) = rig.register_pair_parts("reg-unit-4");
    rig.poller.do_work(0);
    rig.events();
    Faults::latest("reg-unit-4")
        .unwrap()
        .corrupt_next(End::Connecting);
    let AppPath::Rings(r) = &mut parts.path else {
        panic!("rings")
    };
    let buf = r.free.pop().unwrap();
    r.tx.push(TxDesc::new(buf, 8)).unwrap();
    for _ in 0..4 {
        rig.poller.do_work(0);
        rig.drain();
    }
    let _ = b;
    let ev = rig.events();
    assert!(
        ev.iter().any(|e| matches!(e, Event::Error { conn: Some(x), error: crate::Error::Fabric(crate::FabricError::Protocol(_)) } if *x == d)),
        "{ev:?}"
    );
    assert!(
        ev.iter().any(|e| matches!(e, Event::Error { conn: Some(x), error: crate::Error::Fabric(crate::FabricError::PeerAborted(crate::AbortReason::Protocol)) } if *x == c)),
        "{ev:?}"
    );
    assert!(rig.reg.conns.is_empty() || rig.reg.conns.keys().all(|&k| k == b));
}

/// Whether `fd` is readable now.
fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid `pollfd`, a zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLIN != 0
}

#[test]
fn a_listener_stays_readable_while_ends_are_queued_past_one_accept_burst() {
    let cfg = cfg();
    let listener = MemListenerState::bind("reg-unit-5", "mem://reg-unit-5", &cfg).expect("bind");
    let burst = crate::fabric::control::ACCEPT_BURST;
    let ours: Vec<_> = (0..burst + 4)
        .map(|_| setup::connect("reg-unit-5", "mem://reg-unit-5", &cfg).expect("connect"))
        .collect();
    assert!(readable(listener.fd()));
    for _ in 0..burst {
        assert!(listener.take_one().is_some());
    }
    assert!(
        readable(listener.fd()),
        "ends left after a burst wake it again"
    );
    let rest = std::iter::from_fn(|| listener.take_one()).count();
    assert_eq!(rest, 4);
    assert!(
        !readable(listener.fd()),
        "the wake-up is cleared with the queue"
    );
    drop(ours);
}
