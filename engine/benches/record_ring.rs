//! Record ring (`spinwire::record::ring`) microbenchmarks, criterion:
//!
//! * `record_ring/same_thread/{single,batch32}_{8,64}B`: claim + fill + commit + poll on one
//!   thread (no cross-core traffic): the ring's software cost per record, one publication per
//!   record or one per 32.
//! * `record_ring/stream/*`: one-way streaming between two pinned threads (cores 0 and 1 when
//!   available), the consumer copying each payload out and publishing its position once per poll
//!   of up to 32: `bare_lines` is the one-64-B-line-per-message floor and `wire_inline_*` the shm
//!   wire (the record ring inside a shared segment, read in place; both shared with the
//!   `shm_wire` bench), `record_*` the record ring on the heap with one publication per record,
//!   `record_batch32_*` with one per 32.
//!
//! Run with `cargo bench -p spinwire --bench record_ring` (`SHM_WIRE_BENCH_NOPIN=1` to leave
//! the threads unpinned); `cargo test --benches` runs each once, unpinned, as a smoke test.
//! Throughput is reported in records (elements) per second.

mod common;

use std::hint::{black_box, spin_loop};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{bare_stream, pin, wire_stream, NO_PIN};
use criterion::{Criterion, Throughput};
use spinwire::record::ring;
use spinwire::record::Record;

/// Streaming ring capacity: 64 KiB, about the shm wire ring's of the `common` helpers.
const STREAM_CAPACITY: usize = 64 << 10;
const MAX_PAYLOAD: usize = 256;

fn same_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("record_ring/same_thread");
    for len in [8usize, 64] {
        let msg = vec![7u8; len];
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("single_{len}B"), |b| {
            let (mut tx, mut rx) = ring::with_capacity(4096, MAX_PAYLOAD).expect("ring");
            let mut out = [0u8; MAX_PAYLOAD];
            b.iter(|| {
                let mut claim = tx.claim(len).expect("claim").expect("room");
                claim.payload_mut().copy_from_slice(black_box(&msg));
                claim.commit();
                rx.poll(1, |r| {
                    if let Record::Data(d) = r {
                        out[..d.len()].copy_from_slice(d);
                    }
                })
                .expect("poll");
                black_box(&out);
            });
        });
        g.throughput(Throughput::Elements(32));
        g.bench_function(format!("batch32_{len}B"), |b| {
            let (mut tx, mut rx) = ring::with_capacity(4096, MAX_PAYLOAD).expect("ring");
            let mut out = [0u8; MAX_PAYLOAD];
            b.iter(|| {
                for _ in 0..32 {
                    let mut claim = tx.claim(len).expect("claim").expect("room");
                    claim.payload_mut().copy_from_slice(black_box(&msg));
                    claim.commit_batched();
                }
                tx.publish();
                let n = rx
                    .poll(32, |r| {
                        if let Record::Data(d) = r {
                            out[..d.len()].copy_from_slice(d);
                        }
                    })
                    .expect("poll");
                assert_eq!(n, 32);
                black_box(&out);
            });
        });
    }
    g.finish();
}

/// One-way stream of `iters` DATA records of `len` bytes; `batch` records per publication.
fn record_stream(iters: u64, len: usize, batch: u64) -> Duration {
    let (mut tx, mut rx) = ring::with_capacity(STREAM_CAPACITY, MAX_PAYLOAD).expect("ring");
    let consumer = std::thread::spawn(move || {
        pin(1);
        let mut out = [0u8; MAX_PAYLOAD];
        let mut got = 0u64;
        while got < iters {
            let n = rx
                .poll(32, |r| {
                    if let Record::Data(d) = r {
                        out[..d.len()].copy_from_slice(d);
                    }
                })
                .expect("poll");
            if n == 0 {
                spin_loop();
            }
            got += n as u64;
        }
        black_box(&out);
    });
    pin(0);
    let msg = vec![7u8; len];
    let t0 = Instant::now();
    let mut sent = 0u64;
    while sent < iters {
        match tx.claim(len).expect("claim") {
            Some(mut c) => {
                c.payload_mut().copy_from_slice(&msg);
                c.commit_batched();
                sent += 1;
                if sent % batch == 0 {
                    tx.publish();
                }
            }
            None => {
                tx.publish();
                spin_loop();
            }
        }
    }
    tx.publish();
    consumer.join().expect("consumer thread");
    t0.elapsed()
}

fn stream(c: &mut Criterion) {
    let mut g = c.benchmark_group("record_ring/stream");
    g.throughput(Throughput::Elements(1));
    g.bench_function("bare_lines", |b| b.iter_custom(bare_stream));
    for len in [8usize, 64] {
        g.bench_function(format!("wire_inline_{len}B"), |b| {
            b.iter_custom(|n| wire_stream(n, len))
        });
        g.bench_function(format!("record_{len}B"), |b| {
            b.iter_custom(|n| record_stream(n, len, 1))
        });
        g.bench_function(format!("record_batch32_{len}B"), |b| {
            b.iter_custom(|n| record_stream(n, len, 32))
        });
    }
    g.finish();
}

/// Runs every benchmark of this file.
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    same_thread(&mut c);
    stream(&mut c);
    c.final_summary();
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        // Smoke test (`cargo test --benches`): criterion runs each benchmark once; unpinned.
        NO_PIN.store(true, Ordering::Relaxed);
    }
    benches();
}
