//! Memory placement at build: a NUMA node the machine lacks is refused with the typed error,
//! node 0 and the local node resolve, `HugePages::Require` is refused at build exactly when no
//! 2 MiB page is free, and the default placement is `Try` without a NUMA policy. (What
//! connections get on every fabric is the conformance suite's `placement` module.)

use spinwire::{Engine, Error, HugePages, NumaPolicy, PlacementError};

fn free_hugepages() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_node_the_machine_lacks_is_refused_typed() {
    for node in [999, 5000] {
        let e = Engine::builder()
            .numa(NumaPolicy::Node(node))
            .build()
            .expect_err("no such node");
        let Error::Placement(PlacementError::NoSuchNode { node: n, online }) = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*n, node);
        assert!(!online.is_empty());
    }
}

#[test]
fn node_0_and_the_local_node_resolve() {
    let e = Engine::builder()
        .numa(NumaPolicy::Node(0))
        .build()
        .expect("node 0");
    assert_eq!(e.counters().placement.node, Some(0));
    for numa in [NumaPolicy::Local, NumaPolicy::Device] {
        let e = Engine::builder().numa(numa).build().expect("local node");
        let node = e.counters().placement.node.expect("a node");
        assert!(
            std::path::Path::new(&format!("/sys/devices/system/node/node{node}")).exists(),
            "{numa:?} resolved node {node}"
        );
    }
}

#[test]
fn the_default_is_try_without_a_node_and_counts_nothing_before_a_connection() {
    let e = Engine::builder().build().expect("engine");
    let p = e.counters().placement;
    assert_eq!((p.hugepages, p.node), (HugePages::Try, None));
    assert_eq!(
        (p.huge_regions, p.small_regions, p.fallbacks),
        (0, 0, 0),
        "{p:?}"
    );
}

#[test]
fn require_is_refused_at_build_exactly_when_no_huge_page_is_free() {
    let free = free_hugepages();
    let r = Engine::builder().hugepages(HugePages::Require).build();
    if free == 0 {
        let e = r.expect_err("no free hugepage");
        let Error::Placement(PlacementError::HugePagesUnavailable { source, .. }) = &e else {
            panic!("{e:?}");
        };
        assert_eq!(source.raw_os_error(), Some(libc::ENOMEM));
        let msg = std::error::Error::source(&e).unwrap().to_string();
        assert!(msg.contains("echo N > /proc/sys/vm/nr_hugepages"), "{msg}");
    } else {
        let e = r.expect("free hugepages");
        assert_eq!(e.counters().placement.hugepages, HugePages::Require);
    }
}
