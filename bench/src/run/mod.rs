//! Turning flags into a validated [`Plan`], and running it: the floor, loopback runs (both
//! sides in this process), `--server` and `--client`.

pub mod conn;
mod engine;
pub mod proto;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use clap::Parser;

use crate::cli::{
    Cli, Command, CommonArgs, CrossKnob, Fabric, FloorArgs, Idle, Mode, TestKind, Unit,
};
use crate::error::BenchError;
use crate::floor;
use crate::machine::{available_cores, check_cores, pin_current};
use crate::report::{self, console, Knobs, Measured, Point, Report};
use crate::stats::LatencySummary;
use proto::{PointSpec, CONTROL_MAX};

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
        Command::Lat(a) => {
            let plan = Plan::new(
                a.common,
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
                vec![TestKind::Rate],
                vec![a.size],
                None,
                None,
                a.floor,
                false,
            )?;
            plan.execute(command)
        }
        Command::Sweep(a) => {
            if a.tests.is_empty() {
                return Err(BenchError::invalid(
                    "--tests",
                    "name at least one of lat, rate",
                ));
            }
            let buffer_size = a.common.buffer_size;
            let sizes = if a.sizes.is_empty() {
                let max = a.max_size.unwrap_or(buffer_size);
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
            let plan = Plan::new(
                a.common,
                a.tests,
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

fn default_app_cores() -> Vec<usize> {
    let avail = available_cores();
    vec![avail[0], avail[1 % avail.len()]]
}

fn run_floor(a: FloorArgs, command: Vec<String>) -> Result<bool, BenchError> {
    let cores = if a.app_cores.is_empty() {
        default_app_cores()
    } else {
        a.app_cores.clone()
    };
    check_cores("--app-cores", &cores)?;
    if cores.len() != 2 || cores[0] == cores[1] {
        return Err(BenchError::invalid(
            "--app-cores",
            format!(
                "floor needs exactly two different cores, got {cores:?} (this machine has {:?})",
                available_cores()
            ),
        ));
    }
    if a.iters == 0 {
        return Err(BenchError::invalid("--iters", "must be at least 1"));
    }
    let mut report = Report::new(command);
    let f = floor::measure([cores[0], cores[1]], a.iters, a.warmup, &STOP)?;
    report
        .measured
        .push(report::floor_point(&f, a.iters, a.warmup));
    report.floor = Some(f);
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

/// Engine settings of one group of points (a sweep's crossed knob changes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineCfg {
    /// inline or dedicated.
    pub mode: Mode,
    /// Poller cores (dedicated).
    pub pollers: Vec<usize>,
    /// Idle strategy of pollers and app threads.
    pub idle: Idle,
    /// Bytes per buffer.
    pub buffer_size: usize,
    /// Buffers per connection per direction.
    pub buffers: usize,
    /// Credits.
    pub depth: usize,
    /// Batch.
    pub batch: usize,
    /// Inline threshold, bytes.
    pub inline_threshold: usize,
    /// Selective signalling period.
    pub signal_every: usize,
    /// Connection setup timeout.
    pub connect_timeout: Duration,
    /// The crossed knob and its value for this group.
    pub cross: Option<(CrossKnob, usize)>,
}

/// A validated run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Role of this process.
    pub role: Role,
    /// Fabric.
    pub fabric: Fabric,
    /// App cores: client, server.
    pub app_cores: [usize; 2],
    /// Engine settings per group (one group unless a sweep crosses a knob).
    pub groups: Vec<EngineCfg>,
    /// Tests per point.
    pub tests: Vec<TestKind>,
    /// Sizes per group.
    pub sizes: Vec<usize>,
    /// Measured iterations per lat point.
    pub iters: u64,
    /// Measured messages per rate point.
    pub rate_iters: u64,
    /// Or a fixed duration per point.
    pub duration: Option<Duration>,
    /// Warm-up iterations per point.
    pub warmup: u64,
    /// Offered load (0: unlimited).
    pub rate: u64,
    /// Interval-log period.
    pub interval: Duration,
    /// Measure the floor first.
    pub floor: bool,
    /// Show a progress bar.
    pub progress: bool,
    /// Report directory.
    pub out: Option<PathBuf>,
    /// Console unit.
    pub unit: Unit,
    /// Server: exit after one client.
    pub once: bool,
    /// Longest wait without progress inside a point.
    pub stall_timeout: Duration,
}

impl Plan {
    /// Validates the flags of `lat`, `rate` or `sweep` into a plan.
    ///
    /// # Errors
    /// [`BenchError::InvalidArg`], [`BenchError::UnknownCore`], [`BenchError::BadEndpoint`] or
    /// [`BenchError::FabricNotCompiled`] naming what is wrong.
    pub fn new(
        c: CommonArgs,
        tests: Vec<TestKind>,
        sizes: Vec<usize>,
        cross: Option<(CrossKnob, Vec<usize>)>,
        rate_iters: Option<u64>,
        floor: bool,
        progress: bool,
    ) -> Result<Self, BenchError> {
        if c.fabric == Fabric::Rdma && !cfg!(feature = "rdma") {
            return Err(BenchError::FabricNotCompiled { fabric: "rdma" });
        }
        let role = match (&c.role.server, &c.role.client) {
            (Some(ep), None) => Role::Server(check_endpoint(ep, c.fabric)?),
            (None, Some(ep)) => Role::Client(check_endpoint(ep, c.fabric)?),
            _ => Role::Loopback,
        };
        if c.iters == Some(0) {
            return Err(BenchError::invalid("--iters", "must be at least 1"));
        }
        if c.duration.is_some_and(|d| d.is_zero()) {
            return Err(BenchError::invalid(
                "--duration",
                "must be longer than zero",
            ));
        }
        if c.interval.is_zero() {
            return Err(BenchError::invalid(
                "--interval",
                "must be longer than zero",
            ));
        }
        if c.buffer_size < 64 {
            return Err(BenchError::invalid(
                "--buffer-size",
                format!("{} bytes is too small: at least 64 (bench's control messages need {CONTROL_MAX})", c.buffer_size),
            ));
        }
        for (flag, v) in [
            ("--buffers", c.buffers),
            ("--depth", c.depth),
            ("--batch", c.batch),
            ("--signal-every", c.signal_every),
        ] {
            if v == 0 {
                return Err(BenchError::invalid(flag, "must be at least 1"));
            }
        }
        if c.depth > c.buffers {
            return Err(BenchError::invalid(
                "--depth",
                format!(
                    "{} is more than --buffers {}: credits cannot exceed receive buffers",
                    c.depth, c.buffers
                ),
            ));
        }
        if sizes.is_empty() {
            return Err(BenchError::invalid("--sizes", "no sizes to measure"));
        }
        for &s in &sizes {
            if s == 0 {
                return Err(BenchError::invalid("--size", "must be at least 1 byte"));
            }
            if s > c.buffer_size {
                return Err(BenchError::invalid(
                    "--size",
                    format!(
                        "{s} bytes is larger than --buffer-size {}; raise --buffer-size or lower --size",
                        c.buffer_size
                    ),
                ));
            }
        }
        let app: Vec<usize> = if c.app_cores.is_empty() {
            default_app_cores()
        } else {
            c.app_cores.clone()
        };
        check_cores("--app-cores", &app)?;
        let app_cores = [app[0], *app.get(1).unwrap_or(&app[0])];
        check_cores("--poller-cores", &c.poller_cores)?;

        let mut mode = c.mode;
        if matches!(cross, Some((CrossKnob::Pollers, _))) {
            mode = Mode::Dedicated;
        }
        let pollers = if mode == Mode::Dedicated && c.poller_cores.is_empty() {
            let avail = available_cores();
            // Cores this process's app threads use: both in loopback, the first otherwise.
            let busy = if role == Role::Loopback {
                &app_cores[..]
            } else {
                &app_cores[..1]
            };
            let free: Vec<usize> = avail
                .iter()
                .copied()
                .filter(|x| !busy.contains(x))
                .collect();
            match cross {
                Some((CrossKnob::Pollers, ref vals)) => {
                    let want = vals.iter().copied().max().unwrap_or(1);
                    let mut v = free.clone();
                    let rest: Vec<usize> = avail
                        .iter()
                        .rev()
                        .copied()
                        .filter(|x| !free.contains(x))
                        .collect();
                    v.extend(rest);
                    v.truncate(want);
                    v
                }
                _ => vec![*free.first().unwrap_or(avail.last().unwrap_or(&0))],
            }
        } else {
            c.poller_cores.clone()
        };

        let base = EngineCfg {
            mode,
            pollers: if mode == Mode::Dedicated {
                pollers.clone()
            } else {
                Vec::new()
            },
            idle: c.idle,
            buffer_size: c.buffer_size,
            buffers: c.buffers,
            depth: c.depth,
            batch: c.batch,
            inline_threshold: c.inline_threshold,
            signal_every: c.signal_every,
            connect_timeout: c.connect_timeout,
            cross: None,
        };
        let groups = match cross {
            None => vec![base],
            Some((knob, values)) => {
                if values.is_empty() {
                    return Err(BenchError::invalid("--values", "give at least one value"));
                }
                let mut g = Vec::new();
                for v in values {
                    let mut e = base.clone();
                    e.cross = Some((knob, v));
                    match knob {
                        CrossKnob::Batch if v == 0 => {
                            return Err(BenchError::invalid("--values", "batch must be at least 1"))
                        }
                        CrossKnob::Batch => e.batch = v,
                        CrossKnob::Depth if v == 0 || v > c.buffers => {
                            return Err(BenchError::invalid(
                                "--values",
                                format!("depth {v} outside 1..={} (--buffers)", c.buffers),
                            ))
                        }
                        CrossKnob::Depth => e.depth = v,
                        CrossKnob::Pollers if v == 0 || v > pollers.len() => {
                            return Err(BenchError::invalid(
                                "--values",
                                format!(
                                    "{v} pollers but only {} poller cores ({pollers:?}); pass more --poller-cores",
                                    pollers.len()
                                ),
                            ))
                        }
                        CrossKnob::Pollers => e.pollers = pollers[..v].to_vec(),
                    }
                    g.push(e);
                }
                g
            }
        };
        let threads = match role {
            Role::Loopback => 2,
            _ => 1,
        } + groups.iter().map(|g| g.pollers.len()).max().unwrap_or(0);
        let ncores = available_cores().len();
        if c.idle == Idle::Spin && threads > ncores && !matches!(role, Role::Server(_)) {
            eprintln!(
                "bench: warning: {threads} busy-polling threads on {ncores} cores: figures will suffer \
                 from oversubscription (use --mode inline, fewer --poller-cores, or --idle backoff)"
            );
        }
        if role == Role::Loopback && app_cores[0] == app_cores[1] && c.idle == Idle::Spin {
            eprintln!(
                "bench: warning: client and server share core {}: use two --app-cores",
                app_cores[0]
            );
        }
        let iters = c.iters.unwrap_or(match tests.as_slice() {
            [TestKind::Rate] => 1_000_000,
            _ => 100_000,
        });
        let rate_iters = match rate_iters {
            Some(0) => return Err(BenchError::invalid("--rate-iters", "must be at least 1")),
            Some(n) => n,
            None if tests.as_slice() == [TestKind::Rate] => iters,
            None => 1_000_000,
        };
        Ok(Self {
            role,
            fabric: c.fabric,
            app_cores,
            groups,
            tests,
            sizes,
            iters,
            rate_iters,
            duration: c.duration,
            warmup: c.warmup,
            rate: c.rate,
            interval: c.interval,
            floor: floor && app_cores[0] != app_cores[1],
            progress,
            out: c.out,
            unit: c.unit,
            once: c.once,
            stall_timeout: c.connect_timeout.max(Duration::from_secs(10)),
        })
    }

    /// Points per group: every size crossed with every test.
    fn points(&self) -> Vec<(TestKind, usize)> {
        self.sizes
            .iter()
            .flat_map(|&s| self.tests.iter().map(move |&t| (t, s)))
            .collect()
    }

    /// Runs the plan; `Ok(true)` when Ctrl-C cut it short.
    ///
    /// # Errors
    /// Whatever stopped it; the points measured before are still printed and written.
    pub fn execute(self, command: Vec<String>) -> Result<bool, BenchError> {
        if let Role::Server(ep) = &self.role {
            return self.serve(ep.clone());
        }
        let mut report = Report::new(command);
        if self.floor {
            let iters = self.iters.clamp(1_000, 200_000);
            match floor::measure(self.app_cores, iters, self.warmup.min(iters), &STOP) {
                Ok(f) => report.floor = Some(f),
                Err(BenchError::Interrupted) => {
                    report.interrupted = true;
                    finish(&report, self.unit, self.out.as_deref())?;
                    return Ok(true);
                }
                Err(e) => return Err(e),
            }
        }
        let total = (self.groups.len() * self.points().len()) as u64;
        let pb = if self.progress && std::io::stderr().is_terminal() {
            let pb = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}",
            ) {
                pb.set_style(style);
            }
            pb
        } else {
            let pb = indicatif::ProgressBar::hidden();
            pb.set_length(total);
            pb
        };
        let mut result = Ok(());
        for g in &self.groups {
            if stop_requested() {
                break;
            }
            result = self.run_group(g, &mut report, &pb);
            if result.is_err() {
                break;
            }
        }
        pb.finish_and_clear();
        let interrupted = stop_requested() || matches!(result, Err(BenchError::Interrupted));
        report.interrupted = interrupted;
        match result {
            Ok(()) | Err(BenchError::Interrupted) => {
                finish(&report, self.unit, self.out.as_deref())?;
                Ok(interrupted)
            }
            Err(e) => {
                if !report.measured.is_empty() {
                    finish(&report, self.unit, self.out.as_deref())?;
                }
                Err(e)
            }
        }
    }

    /// One group: sets up the engines and connection, runs every point, tears down.
    fn run_group(
        &self,
        g: &EngineCfg,
        report: &mut Report,
        pb: &indicatif::ProgressBar,
    ) -> Result<(), BenchError> {
        let (tx, rx) = mpsc::channel::<Measured>();
        let base_offset = report.started.elapsed().unwrap_or_default();
        let t_base = Instant::now();
        let points = self.points();
        let abort = Arc::new(AtomicBool::new(false));
        let (client_res, server_res) = std::thread::scope(|s| {
            let (ready_tx, ready_rx) = mpsc::channel::<Result<(), BenchError>>();
            let endpoint = match &self.role {
                Role::Client(ep) => ep.clone(),
                _ => loopback_endpoint(self.fabric),
            };
            let shared = if g.mode == Mode::Dedicated && self.role == Role::Loopback {
                Some(engine::build(g).map(Arc::new))
            } else {
                None
            };
            let shared = match shared.transpose() {
                Ok(e) => e,
                Err(e) => return (Err(e), Ok(())),
            };
            let server_ready = ready_tx.clone();
            let server = (self.role == Role::Loopback).then(|| {
                let ready_tx = server_ready;
                let ep = endpoint.clone();
                let shared = shared.clone();
                let abort = Arc::clone(&abort);
                let core = self.app_cores[1];
                let timeout = self.stall_timeout;
                let connect_timeout = g.connect_timeout;
                std::thread::Builder::new()
                    .name("bench-server".into())
                    .spawn_scoped(s, move || {
                        engine::loopback_server(
                            g,
                            shared,
                            &ep,
                            core,
                            connect_timeout,
                            timeout,
                            &abort,
                            ready_tx,
                        )
                    })
            });
            let server = match server.transpose() {
                Ok(sv) => sv,
                Err(e) => return (Err(BenchError::io("thread spawn", e)), Ok(())),
            };
            if server.is_none() {
                let _ = ready_tx.send(Ok(()));
            }
            let client = std::thread::Builder::new()
                .name("bench-client".into())
                .spawn_scoped(s, move || -> Result<(), BenchError> {
                    match ready_rx.recv_timeout(g.connect_timeout + Duration::from_secs(5)) {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return Err(e),
                        Err(_) => {
                            return Err(BenchError::Timeout {
                                what: "the loopback server to listen",
                                secs: g.connect_timeout.as_secs_f64() + 5.0,
                            })
                        }
                    }
                    pin_current(self.app_cores[0])?;
                    let engine = match &shared {
                        Some(e) => Arc::clone(e),
                        None => Arc::new(engine::build(g)?),
                    };
                    let mut conn = engine::connect(&engine, &endpoint, g.connect_timeout)?;
                    for &(test, size) in &points {
                        if stop_requested() {
                            return Err(BenchError::Interrupted);
                        }
                        let m = self.measure_point(
                            &mut conn,
                            g,
                            test,
                            size,
                            base_offset + t_base.elapsed(),
                        )?;
                        if tx.send(m).is_err() {
                            break;
                        }
                    }
                    proto::client_bye(&mut conn, g.idle, self.stall_timeout)
                });
            let client = match client {
                Ok(c) => c,
                Err(e) => {
                    abort.store(true, Ordering::Relaxed);
                    return (Err(BenchError::io("thread spawn", e)), Ok(()));
                }
            };
            for m in rx {
                pb.inc(1);
                let line = progress_line(&m.point);
                if self.progress && pb.is_hidden() {
                    // No terminal to draw a bar on (CI, a pipe): one plain line per point.
                    eprintln!(
                        "bench: [{}/{}] {line}",
                        pb.position(),
                        pb.length().unwrap_or(0)
                    );
                } else {
                    pb.set_message(line);
                }
                report.push(m);
            }
            let client_res = client
                .join()
                .unwrap_or(Err(BenchError::ThreadPanicked("client")));
            if client_res.is_err() {
                abort.store(true, Ordering::Relaxed);
            }
            let server_res = server.map_or(Ok(()), |h| {
                h.join()
                    .unwrap_or(Err(BenchError::ThreadPanicked("server")))
            });
            (client_res, server_res)
        });
        // The client's error explains more than the server's (which usually follows from it).
        client_res?;
        server_res
    }

    fn measure_point<C: conn::BenchConn>(
        &self,
        conn: &mut C,
        g: &EngineCfg,
        test: TestKind,
        size: usize,
        base_offset: Duration,
    ) -> Result<Measured, BenchError> {
        let spec = PointSpec {
            size,
            iters: match test {
                TestKind::Lat => self.iters,
                TestKind::Rate => self.rate_iters,
            },
            duration: self.duration,
            warmup: self.warmup,
            rate: self.rate,
            interval: self.interval,
            idle: g.idle,
            timeout: self.stall_timeout,
        };
        let mut label = format!(
            "{}-{}-{}-{}B",
            test.as_str(),
            self.fabric.as_str(),
            g.mode.as_str(),
            size
        );
        if let Some((k, v)) = g.cross {
            label.push_str(&format!("-{}{}", k.as_str(), v));
        }
        let mut point = Point {
            test: test.as_str().into(),
            label,
            fabric: self.fabric.as_str().into(),
            mode: g.mode.as_str().into(),
            role: self.role.as_str().into(),
            size_bytes: size as u64,
            iters: 0,
            warmup: self.warmup,
            duration_s: self.duration.map(|d| d.as_secs_f64()),
            elapsed_s: 0.0,
            rtt_ns: None,
            half_rtt_ns: None,
            msgs_per_sec: None,
            mb_per_sec: None,
            gbit_per_sec: None,
            co_corrected: false,
            cross: g.cross.map(|(k, _)| k.as_str().to_string()),
            cross_value: g.cross.map(|(_, v)| v as u64),
            rtt_x_floor: None,
            msgs_per_sec_x_floor: None,
            counters: None,
            knobs: Knobs {
                idle: g.idle.as_str().into(),
                batch: g.batch,
                depth: g.depth,
                inline_threshold: g.inline_threshold,
                signal_every: g.signal_every,
                buffers: g.buffers,
                buffer_size: g.buffer_size,
                poller_cores: g.pollers.clone(),
                app_cores: self.app_cores.to_vec(),
                offered_rate: self.rate,
            },
        };
        let before = conn.counters();
        let counters = |conn: &C| Some(conn.counters()?.since(&before?));
        match test {
            TestKind::Lat => {
                let out = proto::client_lat(conn, &spec, base_offset)?;
                point.counters = counters(conn);
                let rtt = LatencySummary::from_histogram(&out.rtt);
                point.iters = out.count;
                point.elapsed_s = out.elapsed.as_secs_f64();
                point.rtt_ns = rtt;
                point.half_rtt_ns = rtt.map(|r| r.scaled(0.5));
                point.co_corrected = self.rate > 0;
                Ok(Measured {
                    point,
                    rtt: Some(out.rtt),
                    intervals: out.intervals,
                })
            }
            TestKind::Rate => {
                let r = proto::client_rate(conn, &spec)?;
                point.counters = counters(conn);
                point.iters = r.msgs;
                point.elapsed_s = r.elapsed_ns as f64 / 1e9;
                point.msgs_per_sec = Some(r.msgs_per_sec());
                point.mb_per_sec = Some(r.mb_per_sec());
                point.gbit_per_sec = Some(r.gbit_per_sec());
                Ok(Measured {
                    point,
                    rtt: None,
                    intervals: Vec::new(),
                })
            }
        }
    }

    /// `--server`: serve clients until Ctrl-C (or the first client leaves, with `--once`).
    fn serve(&self, endpoint: String) -> Result<bool, BenchError> {
        let g = &self.groups[0];
        pin_current(self.app_cores[0])?;
        let engine = engine::build(g)?;
        let mut listener = engine::listen(&engine, &endpoint)?;
        report::print(&format!(
            "bench server listening on {endpoint} (fabric {}, mode {}, buffers {} x {} B); Ctrl-C to stop\n",
            self.fabric.as_str(),
            g.mode.as_str(),
            g.buffers,
            g.buffer_size
        ));
        loop {
            if stop_requested() {
                return Ok(true);
            }
            let Some(mut conn) =
                engine::accept(&engine, &mut listener, Duration::from_millis(200))?
            else {
                continue;
            };
            eprintln!("bench server: client connected");
            match proto::serve(&mut conn, g.idle, g.buffer_size, Duration::from_secs(60)) {
                Ok(()) => eprintln!("bench server: client done"),
                Err(BenchError::Interrupted) => return Ok(true),
                Err(e) => eprintln!("bench server: client failed: {e}"),
            }
            if self.once {
                return Ok(false);
            }
        }
    }
}

fn progress_line(p: &Point) -> String {
    match (&p.rtt_ns, p.msgs_per_sec) {
        (Some(r), _) => format!("{} p50 {:.2} us", p.label, r.p50 / 1e3),
        (None, Some(m)) => format!("{} {:.2} M msgs/s", p.label, m / 1e6),
        _ => p.label.clone(),
    }
}

/// A private endpoint for a loopback group.
fn loopback_endpoint(fabric: Fabric) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    match fabric {
        Fabric::Shm => format!("shm://spinwire-bench-{}-{n}", std::process::id()),
        Fabric::Rdma => format!(
            "rdma://127.0.0.1:{}",
            20_000 + (std::process::id() % 20_000) as u64 + n
        ),
    }
}

/// Checks that `ep`'s scheme matches `fabric`.
fn check_endpoint(ep: &str, fabric: Fabric) -> Result<String, BenchError> {
    let Some((scheme, rest)) = ep.split_once("://") else {
        return Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: "expected shm://NAME or rdma://HOST:PORT".into(),
        });
    };
    if rest.is_empty() {
        return Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: "nothing after the scheme".into(),
        });
    }
    match (scheme, fabric) {
        ("shm", Fabric::Shm) | ("rdma", Fabric::Rdma) => Ok(ep.to_string()),
        ("shm" | "rdma", _) => Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: format!(
                "a {scheme} endpoint, but --fabric is {}; pass --fabric {scheme}",
                fabric.as_str()
            ),
        }),
        _ => Err(BenchError::BadEndpoint {
            endpoint: ep.into(),
            reason: format!("unknown scheme `{scheme}` (expected shm or rdma)"),
        }),
    }
}
