//! Turning flags into a validated [`Plan`], and running it: the floor, loopback runs (both
//! sides in this process), `--server` and `--client`.

pub mod conn;
pub mod cost;
pub mod cost_stages;
mod endpoint;
mod engine;
pub mod footprint;
mod group;
mod interleaved;
mod intervals;
mod load;
mod measure;
mod plan;
pub mod proto;
mod server;
mod session;
pub mod wire;

pub use endpoint::{default_server_endpoint, fabric_of};
pub use plan::{EngineCfg, Plan};

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;

use crate::cli::{Cli, Command, FloorArgs, OpenLoopArgs, TestKind, Unit};
use crate::error::BenchError;
use crate::floor;
use crate::machine::{available_cores, check_cores};
use crate::report::{self, console, Report};
use plan::default_app_cores;

static STOP: AtomicBool = AtomicBool::new(false);

/// True once Ctrl-C was pressed: measurement loops stop at their next check.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Raises the stop flag (what Ctrl-C does).
pub fn request_stop() {
    STOP.store(true, Ordering::Relaxed);
}

/// Exit code after Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// With `-v` (or `RUST_LOG` set), logs `tracing` events (the engine's control plane) to stderr.
/// `RUST_LOG` wins over the `-v` level when both are given.
fn install_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let from_env = std::env::var_os(EnvFilter::DEFAULT_ENV).is_some();
    if verbose == 0 && !from_env {
        return;
    }
    let level = match verbose {
        0 | 1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    // Fails only if a subscriber is already installed (main_with_args called twice in one
    // process): keep that one.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Runs the CLI on `args` (the first being the program name) and returns the exit code:
/// 0 on success, 2 for flags clap rejects, 1 for any other error (printed to stderr), 130 after
/// Ctrl-C (having printed and written what was measured).
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    install_ctrlc();
    install_logging(cli.verbose);
    let command = argv
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    match run(cli.command, command) {
        Ok(false) => ExitCode::SUCCESS,
        Ok(true) | Err(BenchError::Interrupted) => ExitCode::from(EXIT_INTERRUPTED),
        Err(e) => {
            // Messages embed their direct cause; print only causes not already shown.
            let mut shown = e.to_string();
            eprintln!("bench: error: {shown}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                let text = s.to_string();
                if !shown.contains(&text) {
                    eprintln!("  caused by: {text}");
                    shown.push_str(&text);
                }
                src = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

fn install_ctrlc() {
    // A second Ctrl-C exits at once, for a run stuck somewhere that does not check the flag.
    let _ = ctrlc::set_handler(|| {
        if STOP.swap(true, Ordering::Relaxed) {
            std::process::exit(i32::from(EXIT_INTERRUPTED));
        }
        eprintln!("\nbench: Ctrl-C: stopping after the current point (again to quit now)");
    });
}

/// Runs one subcommand; `Ok(true)` when Ctrl-C cut it short.
fn run(cmd: Command, command: Vec<String>) -> Result<bool, BenchError> {
    match cmd {
        Command::Floor(a) => run_floor(a, command),
        Command::Cost(a) => cost::run(&a, command),
        Command::Footprint(a) => footprint::run(&a),
        Command::Compare(a) => crate::report::compare::run(&a).map(|()| false),
        Command::Load(a) => {
            let plan = Plan::new(
                a.common,
                a.open_loop,
                Vec::new(),
                vec![TestKind::Load],
                vec![a.size],
                None,
                None,
                a.floor,
                false,
            )?;
            plan.execute(command)
        }
        Command::Lat(a) => {
            let plan = Plan::new(
                a.common,
                OpenLoopArgs::default(),
                Vec::new(),
                vec![TestKind::Lat],
                vec![a.size],
                None,
                None,
                a.floor,
                false,
            )?;
            plan.execute(command)
        }
        Command::Rate(a) => {
            let plan = Plan::new(
                a.common,
                OpenLoopArgs::default(),
                Vec::new(),
                vec![TestKind::Rate],
                vec![a.size],
                None,
                None,
                // The rate report states the floor beside each figure unless told not to.
                !a.no_floor,
                false,
            )?;
            plan.execute(command)
        }
        Command::Sweep(a) => {
            if a.tests.is_empty() {
                return Err(BenchError::invalid(
                    "--tests",
                    "name at least one of lat, rate, load",
                ));
            }
            let buffer_size = a.common.buffer_size;
            let sizes = if a.sizes.is_empty() {
                let max = a.common.max_size.unwrap_or(buffer_size);
                if max == 0 {
                    return Err(BenchError::invalid("--max-size", "must be at least 1"));
                }
                std::iter::successors(Some(1usize), |s| s.checked_mul(2))
                    .take_while(|s| *s <= max)
                    .collect()
            } else {
                a.sizes.clone()
            };
            let cross = a.cross.map(|k| (k, a.values.clone()));
            let mut tests = a.tests;
            if !a.rates.is_empty() && !tests.contains(&TestKind::Load) {
                tests.push(TestKind::Load);
            }
            let plan = Plan::new(
                a.common,
                a.open_loop,
                a.rates,
                tests,
                sizes,
                cross,
                a.rate_iters,
                !a.no_floor,
                !a.quiet,
            )?;
            plan.execute(command)
        }
    }
}

/// A floor role's endpoint: `tcp://ADDR:PORT` (or a bare `ADDR:PORT`) as the socket address;
/// an endpoint of another scheme is refused (the cache-line floor is one process).
fn floor_addr(flag: &'static str, ep: &str) -> Result<String, BenchError> {
    match ep.split_once("://") {
        Some(("tcp", addr)) if !addr.is_empty() => Ok(addr.to_owned()),
        Some((scheme, _)) => Err(BenchError::invalid(
            flag,
            format!("floor roles exist only for tcp (the cache-line floor is one process), got a {scheme}:// endpoint"),
        )),
        None => Ok(ep.to_owned()),
    }
}

/// `floor --wake`'s round trips when --iters is not given: 3 s at its default 1 k/s.
const WAKE_ITERS: u64 = 3_000;

fn run_floor(a: FloorArgs, command: Vec<String>) -> Result<bool, BenchError> {
    let cores = if a.app_cores.is_empty() {
        default_app_cores()
    } else {
        a.app_cores.clone()
    };
    check_cores("--app-cores", &cores)?;
    let remote = a.server.is_some() || a.client.is_some();
    let fabric = a.fabric.unwrap_or(if remote {
        crate::cli::Fabric::Tcp
    } else {
        crate::cli::Fabric::Shm
    });
    if remote && fabric != crate::cli::Fabric::Tcp {
        return Err(BenchError::invalid(
            if a.server.is_some() {
                "--server"
            } else {
                "--client"
            },
            "floor roles exist only for --fabric tcp (the cache-line floor is one process)",
        ));
    }
    let server = match a.server.as_deref() {
        Some("") => Some(floor_addr(
            "--server",
            crate::cli::DEFAULT_TCP_FLOOR_SERVER,
        )?),
        Some(ep) => Some(floor_addr("--server", ep)?),
        None => None,
    };
    let client = a
        .client
        .as_deref()
        .map(|ep| floor_addr("--client", ep))
        .transpose()?;
    if !remote && (cores.len() != 2 || cores[0] == cores[1]) {
        return Err(BenchError::invalid(
            "--app-cores",
            format!(
                "floor needs exactly two different cores, got {cores:?} (this machine has {:?})",
                available_cores()
            ),
        ));
    }
    let iters = a
        .iters
        .unwrap_or(if a.wake { WAKE_ITERS } else { 1_000_000 });
    if iters == 0 {
        return Err(BenchError::invalid("--iters", "must be at least 1"));
    }
    if let Some(addr) = &server {
        crate::floor_tcp::serve(addr, cores[0], a.once, &STOP, |at| {
            report::print(&format!(
                "bench floor server listening on tcp://{at} (raw tcp, core {}; the client's --size sets the ping and chunk size); Ctrl-C to stop\n",
                cores[0]
            ));
        })
        .or_else(|e| match e {
            BenchError::Interrupted => Ok(()),
            e => Err(e),
        })?;
        return Ok(stop_requested());
    }
    let mut report = Report::new(command);
    if a.wake {
        let run = crate::floor_wake::WakeFloorRun {
            rate: a.wake_rate,
            spin: a.wake_spin.unwrap_or_else(crate::floor_wake::block_spin),
            iters,
            warmup: a.warmup.min(iters),
        };
        let f = crate::floor_wake::measure([cores[0], cores[1]], run, &STOP)?;
        report
            .measured
            .push(report::floor_point(&f, iters, run.warmup));
        report.floor = Some(f);
        finish(&report, a.unit, a.out.as_deref())?;
        return Ok(false);
    }
    let tcp = crate::floor_tcp::TcpFloorRun {
        iters,
        warmup: a.warmup,
        chunk: a.size,
        ping: a.size,
    };
    let f = match (fabric, &client) {
        (crate::cli::Fabric::Tcp, Some(addr)) => {
            crate::floor_tcp::client(addr, cores[0], tcp, a.connect_timeout, &STOP)?
        }
        (crate::cli::Fabric::Tcp, None) => {
            crate::floor_tcp::measure_with([cores[0], cores[1]], tcp, &STOP)?
        }
        _ => floor::measure([cores[0], cores[1]], iters, a.warmup, &STOP)?,
    };
    let mut point = report::floor_point(&f, iters, a.warmup);
    if a.client.is_some() {
        point.point.role = Role::Client(String::new()).as_str().into();
    }
    report.measured.push(point);
    report.floor = Some(f);
    // The bandwidth floor of shm for `--size`: one core copying, on this side's core.
    let m = floor::memcpy(cores[0], a.size, &STOP)?;
    report.measured.push(report::memcpy_point(&m));
    report.memcpy.push(m);
    finish(&report, a.unit, a.out.as_deref())?;
    Ok(false)
}

/// Prints the tables and writes `--out`.
fn finish(report: &Report, unit: Unit, out: Option<&std::path::Path>) -> Result<(), BenchError> {
    report::print(&console::render(report, unit));
    if let Some(dir) = out {
        let written = report.write_dir(dir)?;
        report::print(&format!(
            "\nwrote {} files to {}\n",
            written.len(),
            dir.display()
        ));
    }
    Ok(())
}

/// Which side(s) this process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Both sides here, over a private endpoint.
    Loopback,
    /// Serve clients at this endpoint.
    Server(String),
    /// Measure against a server at this endpoint.
    Client(String),
}

impl Role {
    fn as_str(&self) -> &'static str {
        match self {
            Role::Loopback => "loopback",
            Role::Server(_) => "server",
            Role::Client(_) => "client",
        }
    }
}
