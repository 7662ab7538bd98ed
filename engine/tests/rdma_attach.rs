//! Receives that arrive before the accepting side's poller attached their connection.
//!
//! The connecting side sees ESTABLISHED first and may send at once; on the accepting side the
//! QP then receives before the control thread handled its ESTABLISHED or the poller took the
//! attach command (a poller takes a few commands a cycle). Those receive completions are
//! parked by the poller and replayed once the connection is attached (`RdmaStats`'
//! `parked_completions` / `replayed_completions`); before that fix they were dropped as stale
//! and the message was lost ("conn 4 lost its message 0").
//!
//! Each test: 64 connections between two run-to-completion engines; every client sends its
//! first message right after its `connect` returns, before anything is accepted and while
//! the server's poller has not run at all, so its receives are all polled before their attach.
//! Then every message must arrive, in order, and nothing may be dropped as stale.
//!
//! Run inside the Soft-RoCE VM: `scripts/ci/rdma-vm.sh --no-smoke --test rdma_attach`; outside
//! it (no `RXE_VM_IP`) every test prints that it was skipped.
#![cfg(feature = "rdma")]

use std::time::{Duration, Instant};

use spinwire::fabric::rdma;
use spinwire::{Connection, EngineBuilder, SendError};
use spinwire_testkit::data::payload;
use spinwire_testkit::engine as kit;
use spinwire_testkit::rdma::{srq_unsupported, vm_ip};

const T: Duration = Duration::from_secs(30);
const CONNS: usize = 64;
/// Messages per connection (the first sent right after `connect`).
const ROUNDS: u64 = 8;

fn builder(srq_buffers: usize) -> EngineBuilder {
    kit::rtc_builder(256, 32)
        .large_buffers(0)
        .depth(16)
        .batch(16)
        .signal_every(4)
        .rdma_srq(srq_buffers)
        .rdma_srq_credits(8)
        .max_connections_per_listener(2048)
        .max_connections_per_poller(2048)
        .connect_timeout(T)
        // TCG is slow and the host shared: no liveness failure between connect and traffic.
        .liveness_timeout(Duration::from_secs(10))
}

/// Sends message `seq` of connection `i` if a buffer and a credit are free; true if sent.
fn try_send(c: &Connection, i: usize, seq: u64) -> bool {
    let Ok(mut b) = c.alloc() else { return false };
    b.copy_from(&payload(16 + i, seq)).expect("copy");
    let sent = match c.send(b) {
        Ok(()) => true,
        Err(SendError::WouldBlock(_)) => false,
        Err(e) => panic!("send {i}/{seq}: {e}"),
    };
    c.flush().expect("flush");
    sent
}

fn first_messages_before_attach(port: u16, srq_buffers: usize) {
    let Some(ip) = vm_ip() else { return };
    let before = rdma::stats();
    let server = builder(srq_buffers).build().expect("server engine");
    let client = builder(srq_buffers).build().expect("client engine");
    let ep = format!("rdma://{ip}:{port}");
    let l = server.listen(&ep).expect("listen");
    // Connect and send at once; accept (and so run the server's poller) only afterwards.
    let mut clients = Vec::with_capacity(CONNS);
    for i in 0..CONNS {
        let c = client
            .connect(&ep)
            .unwrap_or_else(|e| panic!("connect {i}: {e}"));
        kit::send_bytes(&c, &payload(16 + i, 0));
        c.flush().expect("flush");
        clients.push(c);
    }
    let servers: Vec<Connection> = (0..CONNS)
        .map(|i| {
            l.accept_timeout(T)
                .unwrap_or_else(|e| panic!("accept {i}: {e}"))
        })
        .collect();
    let mut sent = vec![1u64; CONNS];
    let mut received = vec![0u64; CONNS];
    let deadline = Instant::now() + Duration::from_secs(120);
    while received.iter().any(|&r| r < ROUNDS) {
        assert!(
            Instant::now() < deadline,
            "stalled: sent {sent:?}, received {received:?}"
        );
        for (i, c) in clients.iter().enumerate() {
            if sent[i] < ROUNDS && try_send(c, i, sent[i]) {
                sent[i] += 1;
            }
        }
        for (i, s) in servers.iter().enumerate() {
            while let Some(m) = s.try_recv().expect("recv") {
                assert_eq!(
                    &*m,
                    payload(16 + i, received[i]).as_slice(),
                    "conn {i}: message {} (a lost or reordered one)",
                    received[i]
                );
                received[i] += 1;
            }
        }
    }
    let after = rdma::stats();
    let parked = after.parked_completions - before.parked_completions;
    let replayed = after.replayed_completions - before.replayed_completions;
    eprintln!(
        "{CONNS} connections (srq {srq_buffers}): {parked} receive completions parked, \
         {replayed} replayed"
    );
    assert_eq!(
        after.park_overflows, before.park_overflows,
        "park overflows"
    );
    assert_eq!(
        after.stale_completions, before.stale_completions,
        "completions dropped as stale"
    );
    assert_eq!(after.completion_errors, before.completion_errors);
    assert_eq!(parked, replayed, "parked completions not replayed");
    // The server's poller did not run before the first accept, and takes only a few attach
    // commands a cycle: most first messages were polled before their connection's attach.
    assert!(
        parked > 0,
        "no receive was parked: the test did not provoke the race"
    );
}

#[test]
fn first_messages_before_attach_arrive_in_order() {
    first_messages_before_attach(20700, 0);
}

#[test]
fn first_messages_before_attach_arrive_in_order_srq() {
    let Some(_) = vm_ip() else { return };
    if srq_unsupported() {
        return;
    }
    first_messages_before_attach(20710, CONNS * 8);
}
