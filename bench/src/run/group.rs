//! Running a client-side [`Plan`]: the floor first, then each group of points, loopback (both
//! sides in this process, two pinned app threads) or `--client`.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::{engine, finish, proto, stop_requested, EngineCfg, Plan, Role, STOP};
use crate::cli::{Fabric, Mode, TestKind};
use crate::error::BenchError;
use crate::floor;
use crate::machine::pin_current;
use crate::report::{console, Measured, Point, Report};

/// The most round trips of the wake-up reference before a load run (3 s at 1 k msgs/s).
const WAKE_FLOOR_ITERS: u64 = 3_000;

impl Plan {
    ///
    /// # Errors
    /// Whatever stopped it; the points measured before are still printed and written.
    pub fn execute(self, command: Vec<String>) -> Result<bool, BenchError> {
        if let Role::Server(ep) = &self.role {
            return self.serve(ep.clone());
        }
        let mut report = Report::new(command);
        if !self.quiet_wait.is_zero() {
            let cores = self.local_cores(&self.groups[0]);
            let (others, quiet) =
                crate::quiet::wait_quiet(&cores, self.disturbed_above, self.quiet_wait);
            if quiet {
                eprintln!(
                    "bench: quiet machine: other processes use {:.0} % of a core on cores {cores:?}",
                    others * 100.0
                );
            } else {
                eprintln!(
                    "bench: warning: after --quiet-wait {:.0} s other processes still use {:.0} % of a core on cores {cores:?}; measuring anyway",
                    self.quiet_wait.as_secs_f64(),
                    others * 100.0
                );
            }
        }
        report.notes.extend(self.floor_note.clone());
        if self.floor {
            let iters = self.iters.clamp(1_000, 200_000);
            let warmup = self.warmup.min(iters);
            // The tcp floor's ping-pong carries the smallest size measured.
            let ping = self
                .sizes
                .iter()
                .copied()
                .min()
                .unwrap_or(8)
                .clamp(1, crate::floor_tcp::MAX_CHUNK);
            let measured = match self.fabric {
                _ if self.wake_floor() => crate::floor_wake::measure(
                    self.floor_cores,
                    crate::floor_wake::WakeFloorRun {
                        rate: self.load_rates.iter().copied().min().unwrap_or(1).max(1),
                        spin: crate::floor_wake::block_spin(),
                        iters: iters.min(WAKE_FLOOR_ITERS),
                        warmup: warmup.min(WAKE_FLOOR_ITERS / 10),
                    },
                    &STOP,
                ),
                Fabric::Tcp => crate::floor_tcp::measure_with(
                    self.floor_cores,
                    crate::floor_tcp::TcpFloorRun {
                        iters,
                        warmup,
                        chunk: crate::floor_tcp::CHUNK,
                        ping,
                    },
                    &STOP,
                ),
                _ => floor::measure(self.floor_cores, iters, warmup, &STOP),
            };
            match measured.and_then(|f| {
                report.floor = Some(f);
                self.measure_memcpy(&mut report.memcpy)
            }) {
                Ok(()) => {}
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

    /// The single-core `memcpy` floor of every size a rate point has, on the client's core.
    /// True when the floor to measure is the kernel wake-up one: a load-only run whose every
    /// group sleeps between messages (`--idle block`), which is what that floor bounds.
    fn wake_floor(&self) -> bool {
        self.tests == [TestKind::Load]
            && self
                .groups
                .iter()
                .all(|g| g.idle == crate::cli::Idle::Block)
    }

    fn measure_memcpy(&self, out: &mut Vec<floor::MemcpyFloor>) -> Result<(), BenchError> {
        if !self.tests.contains(&TestKind::Rate) {
            return Ok(());
        }
        let mut sizes = self.sizes.clone();
        sizes.sort_unstable();
        sizes.dedup();
        for size in sizes {
            out.push(floor::memcpy(self.app_cores[0], size, &STOP)?);
        }
        Ok(())
    }

    /// One group: sets up the engines and connection, runs every point, tears down.
    pub(super) fn run_group(
        &self,
        g: &EngineCfg,
        report: &mut Report,
        pb: &indicatif::ProgressBar,
    ) -> Result<(), BenchError> {
        if self.one_thread {
            return self.run_group_one_thread(g, report, pb);
        }
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
                    let mut conn = engine::connect(&engine, g, &endpoint, g.connect_timeout)?;
                    if matches!(self.role, Role::Client(_)) {
                        // A server elsewhere compares them with its own (loopback shares one).
                        proto::client_settings(
                            &mut conn,
                            g.settings(),
                            g.idle,
                            self.stall_timeout,
                        )?;
                    }
                    for &point in &points {
                        if stop_requested() {
                            return Err(BenchError::Interrupted);
                        }
                        let m = self.measure_guarded(&mut conn, g, point, || {
                            base_offset + t_base.elapsed()
                        })?;
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
                if m.point.rate_warning {
                    pb.suspend(|| eprintln!("bench: {}", console::shortfall_warning(&m.point)));
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
}

fn progress_line(p: &Point) -> String {
    if let Some(l) = &p.latency_ns {
        return format!(
            "{} p99 {:.2} us, achieved {:.3} M msgs/s",
            p.label,
            l.p99 / 1e3,
            p.achieved_rate.unwrap_or(0.0) / 1e6
        );
    }
    match (&p.rtt_ns, p.msgs_per_sec) {
        (Some(r), _) => format!("{} p50 {:.2} us", p.label, r.p50 / 1e3),
        (None, Some(m)) => format!("{} {:.2} M msgs/s", p.label, m / 1e6),
        _ => p.label.clone(),
    }
}

/// A private endpoint for a loopback group.
pub(super) fn loopback_endpoint(fabric: Fabric) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    match fabric {
        Fabric::Shm => format!("shm://spinwire-bench-{}-{n}", std::process::id()),
        Fabric::Mem => format!("mem://spinwire-bench-{n}"),
        // A port the kernel just handed out (bound and released): loopback only.
        Fabric::Tcp => format!(
            "tcp://127.0.0.1:{}",
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map_or(20_000 + (std::process::id() % 20_000) as u64 + n, |a| {
                    u64::from(a.port())
                })
        ),
        Fabric::Rdma => format!(
            "rdma://127.0.0.1:{}",
            20_000 + (std::process::id() % 20_000) as u64 + n
        ),
    }
}
