//! Hugepages for real (issue #26): inside the RDMA VM, which boots with 2 MiB pages reserved
//! (`hugepages=N` on its kernel command line, `RXE_VM_HUGEPAGES` in `scripts/rxe-vm`, 64 by
//! default), `HugePages::Require` places an shm segment and an RDMA connection's pools on them,
//! and a default engine (`HugePages::Try`) places a default shm segment on them. Each test
//! checks the engine's report ([`EngineStats::placement`](spinwire::EngineStats)) and the
//! kernel's (`/proc/self/smaps`: the mapping's `KernelPageSize: 2048 kB` and its hugetlb
//! counters).
//!
//! Run inside the RDMA VM (`RXE_VM_IP` set): `scripts/ci/rdma-vm.sh --no-smoke --test
//! rdma_hugepages`. Outside the VM every test prints why and returns. Pools stay small (64
//! buffers, 1 MiB messages): hugepage memory is finite.
#![cfg(feature = "rdma")]

use std::time::Duration;

use spinwire::{Connection, Engine, EngineBuilder, HugePages, PlacementStats};
use spinwire_testkit::engine::{pair, recv_msg, send_msg};
use spinwire_testkit::rdma::vm_ip;
use spinwire_testkit::serial;

const T: Duration = Duration::from_secs(20);

/// One mapping of `/proc/self/smaps`.
#[derive(Debug, Default)]
struct Smap {
    name: String,
    kernel_page_kb: u64,
    hugetlb_kb: u64,
}

/// Every mapping of this process.
fn smaps() -> Vec<Smap> {
    let text = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
    let mut out: Vec<Smap> = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            out.push(Smap {
                name: words.nth(4).unwrap_or("").to_owned(),
                ..Smap::default()
            });
            continue;
        }
        let (Some(m), Some(v)) = (out.last_mut(), words.next().and_then(|v| v.parse().ok())) else {
            continue;
        };
        match first {
            "KernelPageSize:" => m.kernel_page_kb = v,
            "Private_Hugetlb:" | "Shared_Hugetlb:" => m.hugetlb_kb += v,
            _ => {}
        }
    }
    out
}

/// The 2 MiB-page mappings whose name contains `name`.
fn huge_maps(name: &str) -> Vec<Smap> {
    smaps()
        .into_iter()
        .filter(|m| m.name.contains(name) && m.kernel_page_kb == 2048)
        .collect()
}

fn free_hugepages() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The VM reserved hugepages at boot: fail loudly if not (the test would prove nothing).
fn reserved() {
    let free = free_hugepages();
    assert!(
        free >= 16,
        "the VM boots with hugepages reserved (RXE_VM_HUGEPAGES): {free} free"
    );
}

fn small(b: EngineBuilder) -> EngineBuilder {
    b.pool(4096, 64)
        .depth(16)
        .max_message_size(1 << 20)
        .connect_timeout(T)
}

fn exchange(server: &Connection, client: &Connection) {
    for seq in 0..16 {
        send_msg(client, seq, 64 + seq as usize);
        recv_msg(server, seq, 64 + seq as usize);
        send_msg(server, seq + 100, 4096);
        recv_msg(client, seq + 100, 4096);
    }
}

fn all_huge(p: &PlacementStats, who: &str) {
    assert!(p.huge_regions >= 1, "{who}: {p:?}");
    assert_eq!((p.small_regions, p.fallbacks), (0, 0), "{who}: {p:?}");
    assert_eq!(p.huge_bytes % (2 << 20), 0, "{who}: {p:?}");
}

#[test]
fn require_places_an_shm_segment_on_hugepages() {
    if vm_ip().is_none() {
        return;
    }
    let _g = serial();
    reserved();
    let free = free_hugepages();
    let e = small(Engine::builder().hugepages(HugePages::Require))
        .build()
        .expect("engine");
    let ep = format!("shm://hp-require-{}", std::process::id());
    let (server, client) = pair(&e, &e, &ep);
    exchange(&server, &client);
    // One segment, counted by the side that made it and the side that attached.
    let p = e.counters().placement;
    all_huge(&p, "engine");
    assert_eq!(p.huge_regions, 2, "created and attached: {p:?}");
    // Each side's mapping is two areas (the pre-faulted rings and pools, then the large
    // slots): both on 2 MiB pages, the first one's pages present.
    let maps = huge_maps("memfd:spinwire-shm");
    assert!(maps.len() >= 2, "both sides' mappings: {maps:?}");
    assert_eq!(
        maps.iter().filter(|m| m.hugetlb_kb > 0).count(),
        2,
        "both sides' pre-faulted areas: {maps:?}"
    );
    assert!(
        free_hugepages() < free,
        "the segment took pages from the pool"
    );
}

#[test]
fn require_places_rdma_pools_on_hugepages() {
    let Some(ip) = vm_ip() else { return };
    let _g = serial();
    reserved();
    let e = small(Engine::builder().hugepages(HugePages::Require))
        .signal_every(8)
        .build()
        .expect("engine");
    let (server, client) = pair(&e, &e, &format!("rdma://{ip}:20261"));
    exchange(&server, &client);
    // Per end: the send and receive pools and both large pools.
    let p = e.counters().placement;
    all_huge(&p, "engine");
    assert!(p.huge_regions >= 8, "two ends, four pools each: {p:?}");
    let maps = huge_maps("anon_hugepage");
    assert!(maps.len() >= 8, "{maps:?}");
    assert!(
        maps.iter().filter(|m| m.hugetlb_kb > 0).count() >= 8,
        "registered (pinned) pools are faulted in: {maps:?}"
    );
}

#[test]
fn a_default_shm_connection_uses_free_hugepages() {
    if vm_ip().is_none() {
        return;
    }
    let _g = serial();
    reserved();
    // The default engine (HugePages::Try), the default pool and message limit: a segment of
    // 68 MiB (34 pages), of which the rings and pools take 2 pages at setup and each
    // direction's large slots 16 more before its first large message.
    let e = Engine::builder()
        .connect_timeout(T)
        .build()
        .expect("engine");
    let p0 = e.counters().placement;
    assert_eq!(p0.hugepages, HugePages::Try);
    let free0 = free_hugepages();
    let ep = format!("shm://hp-default-{}", std::process::id());
    let (server, client) = pair(&e, &e, &ep);
    exchange(&server, &client);
    let p = e.counters().placement;
    all_huge(&p, "engine");
    assert_eq!(p.huge_bytes, 2 * (68 << 20), "created and attached: {p:?}");
    let maps = huge_maps("memfd:spinwire-shm");
    assert_eq!(
        maps.iter().filter(|m| m.hugetlb_kb > 0).count(),
        2,
        "both sides' pre-faulted areas: {maps:?}"
    );
    let free1 = free_hugepages();
    assert_eq!(
        free0 - free1,
        2,
        "rings and pools only: {free0} -> {free1} free"
    );
    // A large message commits the sender's direction's slots, on hugepages.
    let big: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7) as u8).collect();
    client.send_copy_timeout(&big, T).expect("large send");
    client.flush().expect("flush");
    let m = server.recv_timeout(T).expect("large recv");
    assert!(*m == big[..], "large payload");
    drop(m);
    let free2 = free_hugepages();
    // 32 MiB of slots from an offset that is not 2 MiB aligned: 16 or 17 pages.
    assert!(
        (16..=17).contains(&(free1 - free2)),
        "one direction's 32 MiB of slots: {free1} -> {free2}"
    );
}
