//! RDMA message coalescing (issue #10): small messages of one send batch travel as the DATA
//! records of one frame (one SEND, one receive buffer), on a real device (Soft-RoCE in the VM;
//! under soft-iWARP, `RXE_VM_RDMA=siw`, the same tests run the header path).
//!
//! Run inside the RDMA VM (`RXE_VM_IP` set), one test at a time:
//! `cargo test -p spinwire --features rdma --release --test rdma_frames -- --test-threads=1`.
//! Outside the VM every test prints why and returns. The frame counts asserted here are exact:
//! in run-to-completion mode with `batch(32)`, a batch of fewer than 32 sends is posted by the
//! `flush` that follows it, as one `post_send`. The codec's hostile-frame checks are unit tests
//! of `fabric::rdma::datapath::frame` (they need no device).
#![cfg(feature = "rdma")]

use std::time::{Duration, Instant};

use spinwire::fabric::rdma::{self, RdmaStats};
use spinwire::{Connection, Engine, EngineBuilder, SendError};
use spinwire_testkit::data::{payload, XorShift};
use spinwire_testkit::engine::{self as kit, pair};
use spinwire_testkit::rdma::vm_ip;

const T: Duration = Duration::from_secs(10);

/// The kit's builders with large messages off: these tests cover the eager path (the limit is
/// the pool buffer size) and open many connections, and each large slot would be registered
/// (pinned) in the VM's 2 GiB. Large messages: `rdma_large.rs`.
fn rtc_builder(buffer_size: usize, buffers: usize) -> EngineBuilder {
    kit::rtc_builder(buffer_size, buffers).large_buffers(0)
}

fn engine(buffer_size: usize, buffers: usize, frame_size: Option<usize>) -> Engine {
    let b = rtc_builder(buffer_size, buffers)
        .depth(buffers)
        .batch(32)
        .signal_every(8)
        .connect_timeout(T);
    match frame_size {
        Some(f) => b.frame_size(f),
        None => b,
    }
    .build()
    .expect("engine")
}

/// Queues `msgs` on `c` (one send batch: fewer than `batch` sends), then flushes;
/// `send_batched` (run-to-completion's direct way posts a plain `send` after a receive at
/// once), or plain `send` where `plain`.
fn send_batch(c: &Connection, msgs: &[Vec<u8>], plain: bool) {
    for m in msgs {
        let mut b = c.alloc_timeout(T).expect("alloc");
        b.copy_from(m).expect("copy");
        let res = if plain { c.send(b) } else { c.send_batched(b) };
        if let Err(e) = res {
            panic!("send: {e}");
        }
    }
    c.flush().expect("flush");
}

/// Sends `m` from `from` with a plain `send` and a `flush`, and takes it at `to`, verified.
fn send_and_take(from: &Connection, to: &Connection, m: &[u8]) {
    let mut b = from.alloc_timeout(T).expect("alloc");
    b.copy_from(m).expect("copy");
    from.send(b).expect("send");
    from.flush().expect("flush");
    assert_eq!(&*to.recv_timeout(T).expect("the message"), m);
}

/// Receives `msgs`, in order, verified.
fn recv_all(c: &Connection, msgs: &[Vec<u8>]) {
    for (i, m) in msgs.iter().enumerate() {
        let got = c.recv_timeout(T).expect("recv");
        assert_eq!(&*got, m.as_slice(), "message {i} of {}", msgs.len());
    }
}

/// Sends `msgs` from `from` to `to` as one batch and returns how many frames and framed
/// messages that took.
fn frames_of(from: &Connection, to: &Connection, msgs: &[Vec<u8>]) -> (u64, u64) {
    frames_sent(from, to, msgs, false)
}

/// [`frames_of`], sent with plain `send` where `plain`.
fn frames_sent(from: &Connection, to: &Connection, msgs: &[Vec<u8>], plain: bool) -> (u64, u64) {
    let before = rdma::stats();
    send_batch(from, msgs, plain);
    recv_all(to, msgs);
    let after = rdma::stats();
    (
        after.frames - before.frames,
        after.framed_messages - before.framed_messages,
    )
}

fn msgs(n: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..n).map(|i| payload(len, seed + i as u64)).collect()
}

/// No RNR and no error completion but flushes: a connection closed while its engine runs on
/// has its posted receives flushed, in error, on devices that report them (Soft-iWARP does;
/// `frame_size_bounds_frames_and_zero_turns_coalescing_off` closes a pair mid-test, and a
/// test's dropped engines can still be polling when the next one starts). Any other failure
/// completes its first work request with its own status, counted here.
fn assert_clean(before: &RdmaStats) {
    let after = rdma::stats();
    assert_eq!(after.rnr_errors, before.rnr_errors, "no RNR");
    assert_eq!(
        after.completion_errors - after.flushed_completions,
        before.completion_errors - before.flushed_completions,
        "no error completions but flushes"
    );
}

#[test]
fn lone_message_unframed_full_frame_and_frame_ending_at_the_buffer_boundary() {
    let Some(ip) = vm_ip() else { return };
    let before = rdma::stats();
    // 264 = 8 (frame header) + 16 records of an 8-byte message (16 bytes each)
    //     = 8 + 2 records of a 120-byte message (128 bytes each).
    let e = engine(264, 64, None);
    let (server, client) = pair(&e, &e, &format!("rdma://{ip}:20101"));
    // A lone message leaves at once, unframed (also an empty one): a frame of one would only
    // cost both sides a frame to build and parse.
    assert_eq!(frames_of(&client, &server, &msgs(1, 8, 1)), (0, 0));
    assert_eq!(frames_of(&client, &server, &msgs(1, 0, 2)), (0, 0));
    assert_eq!(frames_of(&client, &server, &msgs(1, 120, 3)), (0, 0));
    // Frames that end exactly at the receive buffer's end.
    assert_eq!(frames_of(&client, &server, &msgs(16, 8, 10)), (1, 16));
    assert_eq!(frames_of(&client, &server, &msgs(2, 120, 30)), (1, 2));
    assert_eq!(frames_of(&server, &client, &msgs(16, 8, 50)), (1, 16));
    // One more than fits: a full frame, then the last message alone, unframed.
    assert_eq!(frames_of(&client, &server, &msgs(17, 8, 70)), (1, 16));
    assert_eq!(frames_of(&client, &server, &msgs(3, 120, 90)), (1, 2));
    // Mixed small sizes, padding included (each record takes align8(8 + len) bytes).
    let mixed: Vec<Vec<u8>> = [1usize, 15, 16, 17, 0, 100, 7, 9]
        .iter()
        .enumerate()
        .map(|(i, &l)| payload(l, 200 + i as u64))
        .collect();
    // 8 + (16 + 24 + 24 + 32 + 8 + 112 + 16 + 24) = 264: exactly full.
    assert_eq!(frames_of(&client, &server, &mixed), (1, 8));
    // Messages above the inline limit are not framed, and close the frame before them; the
    // 8-byte message alone between the two large ones is not framed either.
    let around: Vec<Vec<u8>> = [8usize, 8, 121, 8, 264, 8, 8]
        .iter()
        .enumerate()
        .map(|(i, &l)| payload(l, 300 + i as u64))
        .collect();
    assert_eq!(frames_of(&client, &server, &around), (2, 4));
    // Plain sends: the first after a receive is a ping-pong's, which run-to-completion's
    // direct way posts at once, unframed; the rest queue and leave framed at `flush`.
    assert_eq!(
        frames_sent(&client, &server, &msgs(1, 8, 400), true),
        (0, 0)
    );
    assert_eq!(
        frames_sent(&server, &client, &msgs(16, 8, 410), true),
        (1, 15)
    );
    assert_clean(&before);
    assert!(client.is_open() && server.is_open());
}

#[test]
fn frame_size_bounds_frames_and_zero_turns_coalescing_off() {
    let Some(ip) = vm_ip() else { return };
    let before = rdma::stats();
    // 64-byte frames: 8 + 3 * 16 = 56 fit, a fourth record would make 72: five frames of
    // three, and the sixteenth message alone, unframed.
    let e = engine(264, 64, Some(64));
    let (server, client) = pair(&e, &e, &format!("rdma://{ip}:20102"));
    assert_eq!(frames_of(&client, &server, &msgs(16, 8, 1)), (5, 15));
    // A message whose record alone exceeds the frame size goes out unframed.
    assert_eq!(frames_of(&client, &server, &msgs(2, 100, 2)), (0, 0));
    drop((server, client));
    let off = engine(264, 64, Some(0));
    let (server, client) = pair(&off, &off, &format!("rdma://{ip}:20103"));
    assert_eq!(frames_of(&client, &server, &msgs(16, 8, 3)), (0, 0));
    assert_eq!(frames_of(&client, &server, &msgs(1, 8, 4)), (0, 0));
    assert_clean(&before);
}

#[test]
fn mixed_small_and_large_both_ways_fifo_no_loss_with_random_stalls() {
    let Some(ip) = vm_ip() else { return };
    let before = rdma::stats();
    let max = 512;
    let e = engine(max, 32, None);
    let (b, a) = pair(&e, &e, &format!("rdma://{ip}:20104"));
    let total = 2000u64;
    let mut rng = XorShift::new(0x5EED);
    // Per direction, each message's length: small (framed) and large (zero-copy) interleaved.
    let lens: Vec<Vec<usize>> = (0..2)
        .map(|_| {
            (0..total)
                .map(|_| match rng.below(4) {
                    0 => rng.index(9),               // tiny
                    1 | 2 => rng.index(121),         // framed
                    _ => 121 + rng.index(max - 120), // pooled
                })
                .collect()
        })
        .collect();
    let ends = [&a, &b];
    let mut sent = [0u64; 2];
    let mut got = [0u64; 2];
    let mut would_block = 0u64;
    let deadline = Instant::now() + Duration::from_secs(180);
    while got[0] < total || got[1] < total {
        assert!(
            Instant::now() < deadline,
            "stalled: sent {sent:?}, received {got:?}"
        );
        for side in 0..2 {
            let c = ends[side];
            // A random batch (1..=24 sends), sometimes none: this side stalls.
            let burst = if rng.below(5) == 0 {
                0
            } else {
                1 + rng.below(24)
            };
            for _ in 0..burst {
                if sent[side] == total {
                    break;
                }
                let Ok(mut buf) = c.alloc() else { break };
                let seq = sent[side];
                let len = lens[side][seq as usize];
                buf.copy_from(&payload(len, seq + side as u64 * 1_000_000))
                    .unwrap();
                match c.send(buf) {
                    Ok(()) => sent[side] += 1,
                    Err(SendError::WouldBlock(_)) => {
                        would_block += 1;
                        break;
                    }
                    Err(err) => panic!("send: {err}"),
                }
            }
            c.flush().expect("flush");
            // Take a random number of messages (sometimes none: a stalled receiver).
            for _ in 0..rng.below(20) {
                let Some(m) = c.try_recv().expect("recv") else {
                    break;
                };
                let from = 1 - side;
                let seq = got[side];
                let len = lens[from][seq as usize];
                assert_eq!(
                    &*m,
                    payload(len, seq + from as u64 * 1_000_000).as_slice(),
                    "side {side} message {seq} ({len} B)"
                );
                got[side] += 1;
            }
        }
    }
    let after = rdma::stats();
    assert!(after.frames > before.frames, "frames used");
    assert!(
        after.framed_messages - before.framed_messages > after.frames - before.frames,
        "small messages were coalesced"
    );
    assert!(
        after.pooled_sends > before.pooled_sends,
        "zero-copy path used"
    );
    eprintln!(
        "mixed: {} frames carried {} messages; {would_block} WouldBlock",
        after.frames - before.frames,
        after.framed_messages - before.framed_messages
    );
    assert_clean(&before);
    assert!(a.is_open() && b.is_open());
}

#[test]
fn flood_of_small_messages_into_a_slow_receiver_no_rnr_no_loss_back_pressure() {
    let Some(ip) = vm_ip() else { return };
    let before = rdma::stats();
    let e = engine(256, 16, None);
    let (server, client) = pair(&e, &e, &format!("rdma://{ip}:20105"));
    let total = 3000u64;
    let mut sent = 0u64;
    let mut received = 0u64;
    let mut would_block = 0u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while received < total {
        assert!(
            Instant::now() < deadline,
            "flood stalled at {sent} sent, {received} received"
        );
        // Sender: as fast as the credits allow.
        while sent < total {
            let Ok(mut b) = client.alloc() else { break };
            b.copy_from(&sent.to_le_bytes()).unwrap();
            match client.send(b) {
                Ok(()) => sent += 1,
                Err(SendError::WouldBlock(_)) => {
                    would_block += 1;
                    break;
                }
                Err(e) => panic!("send failed: {e}"),
            }
        }
        client.flush().expect("flush");
        // Slow receiver: one message per round, after a pause.
        std::thread::sleep(Duration::from_micros(200));
        if let Some(m) = server.try_recv().expect("recv") {
            let seq = u64::from_le_bytes(m[..].try_into().expect("8 bytes"));
            assert_eq!(seq, received, "in order, none lost");
            received += 1;
        }
    }
    let after = rdma::stats();
    assert!(would_block > 0, "the sender saw back-pressure");
    // Each message travelled exactly once: in a frame, or alone (a SEND that is not a frame:
    // the one message a single returned credit let out).
    let sends =
        (after.inline_sends + after.pooled_sends) - (before.inline_sends + before.pooled_sends);
    let frames = after.frames - before.frames;
    assert_eq!(
        after.framed_messages - before.framed_messages + (sends - frames),
        total,
        "every message sent once, framed or alone ({sends} sends, {frames} frames)"
    );
    assert!(
        after.frames - before.frames < total,
        "frames carried several messages ({} frames)",
        after.frames - before.frames
    );
    assert_clean(&before);
    assert!(client.is_open() && server.is_open());
    assert!(server.try_recv().expect("recv").is_none(), "nothing extra");
}

/// Sends `n` 8-byte messages numbered from `first` with `send_batched`, then flushes; a send
/// without credit waits, driving only the sender's engine `ce` (so no pass of the receiver's
/// engine, and no check of its, can return credits meanwhile).
fn send_run_waiting(c: &Connection, ce: &Engine, first: u64, n: u64) {
    for seq in first..first + n {
        let end = Instant::now() + T;
        loop {
            let mut b = c.alloc_timeout(T).expect("alloc");
            b.copy_from(&seq.to_le_bytes()).expect("copy");
            match c.send_batched(b) {
                Ok(()) => break,
                Err(SendError::WouldBlock(_)) => {
                    c.flush().expect("flush");
                    assert!(
                        Instant::now() < end,
                        "message {seq}: the sender's window did not come back (the receiver \
                         took everything sent; credits for a frame it took over several \
                         receives were not returned)"
                    );
                    ce.poll();
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }
    c.flush().expect("flush");
}

/// Takes messages `first .. first + n` with `try_recv` (run-to-completion's direct take: one
/// message, then the rest of a burst into the ring), which drives only the receiver's engine.
fn take_run(s: &Connection, first: u64, n: u64) {
    for seq in first..first + n {
        let end = Instant::now() + T;
        let m = loop {
            if let Some(m) = s.try_recv().expect("try_recv") {
                break m;
            }
            assert!(Instant::now() < end, "message {seq} did not arrive");
        };
        assert_eq!(u64::from_le_bytes(m[..].try_into().expect("8 bytes")), seq);
    }
}

/// A receiver that takes a large frame in several steps (run-to-completion's direct take: one
/// record, then a burst of 32; its engine's pass: `batch` records) returns the credit of each
/// of its messages with the frame's buffer, as the sender counts them (a returned buffer
/// credit gives back the messages of the sender's oldest SEND): a window sent as a frame of 2
/// and a frame of 126, then one of 128, comes back whole from the takes alone, round after
/// round. Counted record by record, the small frame's buffer went back once 64 messages (half
/// the depth) were owed, 66-68 of them, which gave the sender back only its 2; the frame's
/// other 58-60 stayed below the threshold while the sender's window was spent, until the
/// receiver's periodic check returned them (every 10 ms: `bench rate --fabric rdma` at 8 B
/// fell from 0.4-0.8 to 0.02-0.08 M msgs/s in the VM). Here the receiver's engine runs only
/// when the receiver takes (liveness off: no control-thread cycle either), so that stall is a
/// hang, not a delay. The receiver's `batch` (32)
/// is below the sender's frames, so its passes split them too (this failed the same way
/// before run-to-completion's direct take existed).
#[test]
fn frames_taken_in_several_steps_return_the_whole_window() {
    let Some(ip) = vm_ip() else { return };
    let before = rdma::stats();
    const DEPTH: u64 = 128;
    // The sender's `batch(DEPTH)`: `send_batched` posts a run of up to DEPTH as one frame.
    let mk = |batch: usize| {
        rtc_builder(4096, DEPTH as usize)
            .depth(DEPTH as usize)
            .batch(batch)
            .signal_every(8)
            .connect_timeout(T)
            // No liveness beat: the control thread's cycle of an idle run-to-completion engine
            // (every quarter of the timeout) would return the credits late instead.
            .liveness_timeout(Duration::ZERO)
            .build()
            .expect("engine")
    };
    let (se, ce) = (mk(32), mk(DEPTH as usize));
    let (server, client) = pair(&se, &ce, &format!("rdma://{ip}:20106"));
    let mut seq = 0;
    for round in 0..3 {
        for run in [2, DEPTH - 2, DEPTH] {
            let frames = rdma::stats();
            send_run_waiting(&client, &ce, seq, run);
            take_run(&server, seq, run);
            seq += run;
            let after = rdma::stats();
            if run < DEPTH {
                // The window's two frames (the ring's wrap may split the third run).
                assert_eq!(
                    (
                        after.frames - frames.frames,
                        after.framed_messages - frames.framed_messages
                    ),
                    (1, run),
                    "round {round}: a run of {run} is one frame"
                );
            }
        }
    }
    assert_clean(&before);
    assert!(client.is_open() && server.is_open());
}

/// The engines of the window tests: `batch(depth)` (a sender's run of up to `depth` is one
/// frame), twice as many buffers as the window (as `bench`: a sender never short of buffers,
/// whose `alloc` would run a cycle that posts what is queued), liveness off (no control-thread
/// cycle of an idle run-to-completion engine returns credits behind the test's back: a credit
/// that does not go back is a hang, not a delay).
fn window_engine(depth: usize) -> Engine {
    rtc_builder(4096, 2 * depth)
        .depth(depth)
        .batch(depth)
        .signal_every(8)
        .connect_timeout(T)
        .liveness_timeout(Duration::ZERO)
        .build()
        .expect("engine")
}

/// A direct take that starts a frame moves the rest of it into the receive ring (as far as the
/// ring has room), so that the frame's buffer is re-posted, and its records' credit owed, at
/// that take, as the pass does: a window sent as one frame of 128 comes back to the sender
/// after the receiver's first `try_recv`, the receiver taking nothing more. With a burst of 32
/// only, the credit left with the frame's last record, at the fourth take (`bench rate --fabric
/// rdma`, 8 B, in the VM: the sender's next window left after the receiver had taken three
/// quarters of this one, not when this one arrived).
#[test]
fn a_direct_take_returns_a_whole_frames_credit() {
    let Some(ip) = vm_ip() else { return };
    let before = rdma::stats();
    const DEPTH: u64 = 128;
    let (se, ce) = (window_engine(DEPTH as usize), window_engine(DEPTH as usize));
    let (server, client) = pair(&se, &ce, &format!("rdma://{ip}:20107"));
    // A first message, so that the server's poller serves the connection (before, a take runs
    // a whole cycle, whose pass moves `batch`); the client's sends are batched (never posted
    // directly), so that the window is one frame.
    send_and_take(&server, &client, b"hello");
    let frames = rdma::stats();
    send_run_waiting(&client, &ce, 0, DEPTH);
    // Time for the frame to reach the server's CQ, so that the first take finds it (not the
    // cycle that every 8th empty take runs); a frame still on its way makes this test pass
    // without exercising the direct take, never fail.
    std::thread::sleep(Duration::from_millis(200));
    take_run(&server, 0, 1);
    let after = rdma::stats();
    assert_eq!(
        (
            after.frames - frames.frames,
            after.framed_messages - frames.framed_messages
        ),
        (1, DEPTH),
        "the window is one frame"
    );
    // The whole next window, from the credit of that one take.
    send_run_waiting(&client, &ce, DEPTH, DEPTH);
    take_run(&server, 1, 2 * DEPTH - 1);
    assert!(server.try_recv().expect("recv").is_none(), "nothing extra");
    assert_clean(&before);
    assert!(client.is_open() && server.is_open());
}

/// A plain-`send` stream that starts after a ping-pong's direct send (one message posted
/// alone, straight to the QP) still leaves in whole windows, one frame each: the send that
/// finds the window spent runs the cycle that posts the queued run, and the next run counts
/// from there. Counted on from the direct send, each later window's first send completed a
/// `batch` and went out alone, unframed, and the other 127 as a frame (`bench rate --fabric
/// rdma`, whose client receives the server's ready message first: two SENDs a window).
#[test]
fn a_stream_after_a_direct_send_goes_in_whole_windows() {
    let Some(ip) = vm_ip() else { return };
    let before = rdma::stats();
    const DEPTH: u64 = 128;
    const N: u64 = 6 * DEPTH;
    let (se, ce) = (window_engine(DEPTH as usize), window_engine(DEPTH as usize));
    let (server, client) = pair(&se, &ce, &format!("rdma://{ip}:20108"));
    // A ping: the client's next send is a ping-pong's reply, posted directly and alone.
    send_and_take(&server, &client, b"ping");
    let sent = rdma::stats();
    // One thread: a send refused for credit lets the server take what arrived.
    let mut taken = 0;
    let take = |taken: &mut u64| {
        while let Some(m) = server.try_recv().expect("try_recv") {
            assert_eq!(
                u64::from_le_bytes(m[..].try_into().expect("8 bytes")),
                *taken
            );
            *taken += 1;
        }
    };
    for seq in 0..N {
        let end = Instant::now() + T;
        loop {
            let mut b = client.alloc_timeout(T).expect("alloc");
            b.copy_from(&seq.to_le_bytes()).expect("copy");
            match client.send(b) {
                Ok(()) => break,
                Err(SendError::WouldBlock(_)) => {
                    assert!(Instant::now() < end, "message {seq}: no credit came back");
                    take(&mut taken);
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }
    client.flush().expect("flush");
    let end = Instant::now() + T;
    while taken < N {
        assert!(Instant::now() < end, "message {taken} did not arrive");
        take(&mut taken);
    }
    let after = rdma::stats();
    assert_eq!(
        N - (after.framed_messages - sent.framed_messages),
        1,
        "only the ping-pong's reply travels unframed ({} frames, {} SENDs)",
        after.frames - sent.frames,
        (after.inline_sends + after.pooled_sends) - (sent.inline_sends + sent.pooled_sends)
    );
    // The stream's sends skipped the direct way (`DIRECT_SEND_AFTER_RECV`); a message
    // delivered makes the next plain send a ping-pong's again: it leaves at once, without a
    // flush, and the client's engine runs nothing after it.
    send_and_take(&server, &client, b"ping");
    let mut b = client.alloc_timeout(T).expect("alloc");
    b.copy_from(b"pong").expect("copy");
    client.send(b).expect("send");
    assert_eq!(&*server.recv_timeout(T).expect("pong, unflushed"), b"pong");
    assert_clean(&before);
    assert!(client.is_open() && server.is_open());
}

/// A ping-pong's receive buffers are re-posted while each side waits for the next message, not
/// between a message's completion and its delivery (`RdmaConn::repost_later`), and their
/// credits still come back in time: windows of 16 and 64 receive buffers (2 and 8 re-posts may
/// wait), 1000 round trips each with no `flush` on either side, so that every send must be a
/// ping-pong's direct post (the other engine runs nothing while this thread waits on one: a
/// send left in the send ring never leaves, and the round trip times out). A waiting re-post
/// never posted, or posted without its credit owed, spends the peer's window within a window
/// of round trips; one held past the direct send's floor (half the window) leaves the reply in
/// the ring.
#[test]
fn a_ping_pong_reposts_its_receives_while_it_waits() {
    let Some(ip) = vm_ip() else { return };
    for (depth, port) in [(8u64, 20109), (32, 20110)] {
        // Each window's counts, taken while its engines run.
        let before = rdma::stats();
        let (se, ce) = (window_engine(depth as usize), window_engine(depth as usize));
        let (server, client) = pair(&se, &ce, &format!("rdma://{ip}:{port}"));
        // A first message, so that the client's first send is a ping-pong's (a send before
        // any receive is a stream's: it waits for a flush).
        send_and_take(&server, &client, b"hello");
        for i in 0..1000u64 {
            let mut b = client.alloc_timeout(T).expect("alloc");
            b.copy_from(&i.to_le_bytes()).expect("copy");
            client.send(b).expect("ping");
            let ping = server
                .recv_timeout(T)
                .unwrap_or_else(|e| panic!("window {}, ping {i}: {e}", 2 * depth));
            assert_eq!(*ping, i.to_le_bytes(), "ping {i}");
            drop(ping);
            let mut b = server.alloc_timeout(T).expect("alloc");
            b.copy_from(&(!i).to_le_bytes()).expect("copy");
            server.send(b).expect("pong");
            let pong = client
                .recv_timeout(T)
                .unwrap_or_else(|e| panic!("window {}, pong {i}: {e}", 2 * depth));
            assert_eq!(*pong, (!i).to_le_bytes(), "pong {i}");
        }
        assert!(server.try_recv().expect("recv").is_none(), "nothing extra");
        assert_clean(&before);
        assert!(client.is_open() && server.is_open());
    }
}
