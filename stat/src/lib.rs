//! `spinwire-stat`: the running spinwire engines of this user and their live counters, read
//! from their counters files ([`spinwire::counters`]) without stopping or instrumenting them,
//! as Aeron's `AeronStat` reads its counters file.
//!
//! ```text
//! spinwire-stat                     # every engine, refreshed every second, with rates
//! spinwire-stat --once --json       # one JSON snapshot
//! spinwire-stat --pid 4242 --interval 250ms
//! spinwire-stat --once --prometheus # Prometheus text format (for a textfile collector)
//! ```
//!
//! Rates (per second) are computed between two refreshes from the engines' publication times;
//! a one-shot run (`--once`) has none. A file left by a process that died without closing its
//! engine is listed as `stale` (`--clean` removes such files).

mod render;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use spinwire::counters::{self, Liveness, Snapshot};

pub use render::{json, prometheus, table, Rates};

/// Prints the live counters of this user's running spinwire engines.
#[derive(Debug, Parser)]
#[command(name = "spinwire-stat", version, about, long_about = None, max_term_width = 100)]
pub struct Cli {
    /// Print one snapshot and exit.
    #[arg(long)]
    pub once: bool,
    /// One JSON object per refresh (one line each).
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Prometheus text exposition format.
    #[arg(long)]
    pub prometheus: bool,
    /// Only the engines of process P.
    #[arg(long, value_name = "P")]
    pub pid: Option<u32>,
    /// Time between refreshes, e.g. `1s`, `250ms`.
    #[arg(long, value_name = "TIME", default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Stop after this many refreshes (default: until interrupted).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Leave out files of processes that are gone (listed as `stale` otherwise).
    #[arg(long)]
    pub running: bool,
    /// Remove the files of processes that are gone, then continue.
    #[arg(long)]
    pub clean: bool,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a time (e.g. 1s, 250ms)"))?;
    let d = Duration::try_from_secs_f64(v * scale).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(10) {
        return Err("at least 10ms".into());
    }
    Ok(d)
}

/// The engines the flags select, each read once; files that could not be read come back as
/// their error text.
///
/// # Errors
/// The counters directory cannot be listed.
pub fn sample(cli: &Cli) -> Result<(Vec<Snapshot>, Vec<String>), counters::CountersError> {
    let mut snaps = Vec::new();
    let mut errors = Vec::new();
    for path in counters::list()? {
        match counters::read(&path) {
            Ok(s) => {
                if cli.pid.is_some_and(|p| p != s.pid) {
                    continue;
                }
                if s.liveness == Liveness::Dead {
                    if cli.clean {
                        let _ = std::fs::remove_file(&path);
                        continue;
                    }
                    if cli.running {
                        continue;
                    }
                }
                snaps.push(s);
            }
            // Removed between listing and reading: the engine closed.
            Err(counters::CountersError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    Ok((snaps, errors))
}

/// Runs `cli`, writing to `out`: one snapshot with `--once`, else one per `--interval` (with
/// rates from the second on) until `--count` refreshes or an error.
///
/// # Errors
/// The counters directory cannot be listed, or `out` fails.
pub fn run(cli: &Cli, out: &mut dyn Write) -> Result<(), Box<dyn std::error::Error>> {
    let mut prev: HashMap<PathBuf, Snapshot> = HashMap::new();
    let mut n = 0u64;
    loop {
        let (snaps, errors) = sample(cli)?;
        let rates: Vec<Option<Rates>> = snaps
            .iter()
            .map(|s| prev.get(&s.path).map(|p| Rates::between(p, s)))
            .collect();
        let text = if cli.json {
            let mut t = json(&snaps, &rates, &errors).to_string();
            t.push('\n');
            t
        } else if cli.prometheus {
            prometheus(&snaps, &rates)
        } else {
            table(&snaps, &rates, &errors)
        };
        out.write_all(text.as_bytes())?;
        out.flush()?;
        n += 1;
        if cli.once || cli.count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        prev = snaps.into_iter().map(|s| (s.path.clone(), s)).collect();
        std::thread::sleep(cli.interval);
    }
}

/// Parses `args` (the program name first) and runs; the exit code is 0, 2 for bad flags, 1
/// for any other error.
pub fn main_with_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    match run(&cli, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = format!("spinwire-stat: error: {e}");
            let mut src = e.source();
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}
