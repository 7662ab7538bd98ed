//! `bench`: spinwire's benchmark CLI, as a library so its pieces can be tested.
//!
//! # Quick start
//!
//! ```text
//! cargo run --release -p bench -- sweep --sizes 8,64,512,4096 --iters 20000 --out target/bench-out
//! cargo run --release -p bench -- lat --size 64 --floor           # one latency point, with ratios
//! cargo run --release -p bench -- rate --size 4k --duration 2s    # one rate point, beside the floor
//! cargo run --release -p bench -- rate --size 8 --app-batch 32     # 32 msgs per flush / per poll
//! cargo run --release -p bench -- rate --size 1m --max-size 16m    # a large message: bandwidth vs memcpy
//! cargo run --release -p bench -- sweep --sizes 4k,64k,1m,16m --max-size 16m --tests rate --out target/bw call
//! cargo run --release -p bench -- floor                           # the machine's own floor
//! cargo run --release -p bench -- cost --sizes 8,64 --batch 32     # engine cost per message / RTT
//! cargo run --release -p bench -- load --size 64 --rate 1m          # open-loop latency at 1 M msgs/s
//! cargo run --release -p bench -- sweep --sizes 64 --rates 100k,500k,1m,2m --out target/load
//! cargo run --release -p bench -- compare base/summary.json new/summary.json --fail-above 10%
//! bench lat --server shm://pp --once   &   bench sweep --client shm://pp   # two processes
//! ```
//!
//! # Layout
//!
//! * [`cli`]: the clap definitions of every subcommand and knob.
//! * [`floor`]: the machine's own floor (cache-line ping-pong, SPSC streaming, single-core
//!   memcpy bandwidth per size); [`floor_tcp`]: the raw busy-polled TCP one; [`floor_wake`]: the
//!   kernel wake-up reference of `--idle block` (a futex ping-pong with the server asleep).
//! * [`run`]: validation of the flags into a [`run::Plan`], the benchmark protocol
//!   ([`run::proto`], written once over the [`run::conn::BenchConn`] trait; the open-loop load
//!   test in `run/load.rs`, message layouts in `run/wire.rs`), and the runs: loopback in one
//!   process, or `--server` / `--client` in two.
//! * [`report`]: the console table and the files `--out DIR` writes (`.hgrm`, `.hlog`,
//!   `summary.json`, `summary.csv`, SVG plots).
//! * [`stats`]: histograms (all sized up front: recording never allocates) and figures.
//! * [`sys`]: the only `unsafe` (libc): the host-wide monotonic clock that timestamps load
//!   messages, per-thread CPU use (`getrusage(RUSAGE_THREAD)`), and the wake-up reference's futex.
//! * [`report::compare`]: `bench compare A B`.
//! * [`quiet`]: the quiet-machine guard (other processes' CPU on the run's cores, each
//!   spinner's achieved CPU; disturbed points are marked).
//!
//! # Threads
//!
//! A loopback run has one app thread per side, pinned to `--app-cores` (client first); in
//! `--mode rtc` each drives its own engine, in `--mode dedicated` they share one whose
//! pollers are pinned to `--poller-cores`. Measurement loops read the clock once per round trip
//! (load: once per message on each side) and never allocate, lock or log; results travel to the main thread (progress bar, report)
//! over a channel between points.
//!
//! ```
//! use clap::Parser;
//! use spinwire_bench::cli::{Cli, Command};
//!
//! let cli = Cli::try_parse_from(["bench", "lat", "--size", "4k", "--iters", "1000"]).unwrap();
//! let Command::Lat(lat) = cli.command else { unreachable!() };
//! assert_eq!(lat.size, 4096);
//! assert_eq!(lat.common.iters, Some(1000));
//! ```

pub mod cli;
pub mod error;
pub mod floor;
pub mod floor_tcp;
pub mod floor_wake;
pub mod machine;
pub mod quiet;
pub mod report;
pub mod run;
pub mod stats;
pub mod sys;

pub use error::BenchError;
pub use run::main_with_args;
