//! `bench`: spinwire's benchmark CLI, as a library so its pieces can be tested.
//!
//! * [`cli`]: the clap definitions of every subcommand and knob.
//! * [`floor`]: the machine's own floor (cache-line ping-pong, SPSC streaming).
//! * [`run`]: validation of the flags into a plan, and the engine-backed `lat`, `rate` and
//!   `sweep` runs (loopback in one process, or `--server` / `--client` in two).
//! * [`report`]: the console table and the files `--out DIR` writes (`.hgrm`, `.hlog`,
//!   `summary.json`, `summary.csv`, SVG plots).
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
pub mod machine;
pub mod report;
pub mod run;
pub mod stats;

pub use error::BenchError;
pub use run::main_with_args;
