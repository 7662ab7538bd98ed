//! Memory placement ([`HugePages`], [`NumaPolicy`]): whatever the machine's hugepage pool holds,
//! `Try` carries messages and reports what each engine's regions got, `Require` either gets
//! hugepages or fails with the typed error, and a NUMA node policy (node 0, the local node with
//! a dedicated poller) carries messages with the node reported. The free pages are read from
//! `/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages` before each case (0 on a host
//! with none reserved; the Soft-RoCE VM boots with some).

use std::error::Error as _;

use spinwire::{
    Connection, Engine, EngineBuilder, Error, HugePages, NumaPolicy, PlacementError, PlacementStats,
};
use spinwire_testkit::engine::*;
use spinwire_testkit::{cores, WAIT};

use super::{Scheme, BUF};

/// Free 2 MiB pages now.
pub fn free_hugepages() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Buffers per connection of the placement cases: a 2 MiB pool (of [`BUF`]-byte buffers), the
/// size from which `HugePages::Try` asks for hugepages, on every fabric.
const HUGE_POOL: usize = (2 << 20) / BUF;

/// `b` with a pool of one huge page and the suite's window.
fn huge_pool(b: EngineBuilder) -> EngineBuilder {
    b.pool(BUF, HUGE_POOL).depth(super::BUFFERS)
}

/// Messages both ways, verified.
fn exchange(server: &Connection, client: &Connection) {
    for seq in 0..8 {
        send_msg(client, seq, 100 + seq as usize);
        recv_msg(server, seq, 100 + seq as usize);
        send_msg(server, seq + 100, BUF);
        recv_msg(client, seq + 100, BUF);
    }
}

/// The placement counts of `e`, checked to count at least one region.
fn placed(e: &Engine, who: &str) -> PlacementStats {
    let p = e.counters().placement;
    assert!(
        p.huge_regions + p.small_regions >= 1,
        "{who}: no region counted: {p:?}"
    );
    p
}

/// `e` and its sources, `: `-separated.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        out.push_str(": ");
        out.push_str(&err.to_string());
        cur = err.source();
    }
    out
}

/// The first [`PlacementError`] in `e`'s source chain.
pub fn placement_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a PlacementError> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(p) = err.downcast_ref::<PlacementError>() {
            return Some(p);
        }
        cur = err.source();
    }
    None
}

/// `HugePages::Try` with 2 MiB pools: messages flow both ways; each engine counts its regions;
/// with no free huge page none is huge and the 2 MiB regions are counted as fallbacks, with
/// free pages some region got them or fell back.
pub fn try_carries_messages_and_reports(s: &'static Scheme) {
    let free = free_hugepages();
    let a = s.build(huge_pool(s.rtc()).hugepages(HugePages::Try));
    let b = s.build(huge_pool(s.rtc()).hugepages(HugePages::Try));
    let (server, client) = pair(&a, &b, &(s.endpoint)("place-try"));
    exchange(&server, &client);
    let (pa, pb) = (placed(&a, "server"), placed(&b, "client"));
    for (p, who) in [(pa, "server"), (pb, "client")] {
        assert_eq!(p.hugepages, HugePages::Try);
        assert_eq!(p.node, None, "{who}: no NUMA policy");
        assert_eq!(
            p.huge_bytes % (2 << 20),
            0,
            "{who}: rounded to 2 MiB: {p:?}"
        );
        if free == 0 {
            assert_eq!((p.huge_regions, p.huge_bytes), (0, 0), "{who}: {p:?}");
        }
    }
    // Some side asked for hugepages for a 2 MiB pool (shm: the listener, which creates the
    // segment; the connector attaches to it).
    let (huge, fallbacks) = (
        pa.huge_regions + pb.huge_regions,
        pa.fallbacks + pb.fallbacks,
    );
    if free == 0 {
        assert!(fallbacks >= 1, "a 2 MiB pool fell back: {pa:?} / {pb:?}");
    } else {
        assert!(
            huge + fallbacks >= 1,
            "a 2 MiB pool asked for hugepages ({free} free): {pa:?} / {pb:?}"
        );
    }
}

/// `HugePages::Require`: with no free huge page the engine is refused at build with the typed
/// error that says how to reserve them; with enough free pages (16, more than a pair of this
/// case's connections takes) every region of both engines is huge and messages flow.
pub fn require_gets_hugepages_or_the_typed_error(s: &'static Scheme) {
    let free = free_hugepages();
    let b = || huge_pool(s.rtc()).hugepages(HugePages::Require);
    if free == 0 {
        let e = b().build().expect_err("Require with no free hugepage");
        let Error::Placement(PlacementError::HugePagesUnavailable { free, .. }) = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*free, 0);
        let msg = chain(&e);
        assert!(msg.contains("/proc/sys/vm/nr_hugepages"), "{msg}");
        assert!(msg.contains("hugepages=N"), "{msg}");
        assert!(e.source().and_then(|p| p.source()).is_some(), "errno kept");
    } else if free >= 16 {
        let a = s.build(b());
        let c = s.build(b());
        let (server, client) = pair(&a, &c, &(s.endpoint)("place-require"));
        exchange(&server, &client);
        for (e, who) in [(&a, "server"), (&c, "client")] {
            let p = placed(e, who);
            assert_eq!(p.small_regions, 0, "{who}: every region huge: {p:?}");
            assert_eq!(p.fallbacks, 0, "{who}: {p:?}");
            assert_eq!(p.huge_bytes % (2 << 20), 0, "{who}: {p:?}");
        }
    } else {
        // A few free pages: either enough for this pair, or the typed error on a side.
        let a = s.build(b());
        let c = s.build(b());
        let ep = (s.endpoint)("place-require-few");
        let l = a.listen(&ep).expect("listen");
        match c.connect(&ep) {
            Ok(client) => {
                let server = l.accept_timeout(WAIT).expect("accept");
                exchange(&server, &client);
            }
            // The connector's error carries it where the connector placed the memory (mem,
            // tcp's connecting side), else the listener's event does (shm's segment).
            Err(e) if placement_error(&e).is_some() => {}
            Err(e) => {
                let listener_side = a.event_timeout(WAIT).ok();
                let typed = matches!(&listener_side, Some(spinwire::Event::Error { error, .. })
                        if placement_error(error as &(dyn std::error::Error + 'static)).is_some());
                assert!(typed, "{e:?} / {listener_side:?}");
            }
        }
    }
}

/// NUMA: both engines on node 0 (every Linux machine has it), run-to-completion; then the local
/// node of a dedicated poller's core. Messages flow and each engine reports its node.
pub fn numa_node_and_local_carry_messages(s: &'static Scheme) {
    let a = s.build(s.rtc().numa(NumaPolicy::Node(0)));
    let b = s.build(s.rtc().numa(NumaPolicy::Node(0)));
    let (server, client) = pair(&a, &b, &(s.endpoint)("place-node0"));
    exchange(&server, &client);
    for (e, who) in [(&a, "server"), (&b, "client")] {
        assert_eq!(placed(e, who).node, Some(0), "{who}");
    }
    drop((server, client));
    let a = s.build(s.poller(cores()[0]).numa(NumaPolicy::Local));
    let b = s.build(s.rtc().numa(NumaPolicy::Local));
    let (server, client) = pair(&a, &b, &(s.endpoint)("place-local"));
    exchange(&server, &client);
    for (e, who) in [(&a, "server"), (&b, "client")] {
        assert!(
            placed(e, who).node.is_some(),
            "{who}: Local resolves a node"
        );
    }
}
