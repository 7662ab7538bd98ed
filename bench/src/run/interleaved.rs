//! `--one-thread` loopback: ONE app thread owns both ends of the connection. The client runs
//! the ordinary protocol ([`super::proto`]) on an [`Interleaved`] connection, which runs one
//! non-blocking step of the server side (READY, echoes, counting, RESULT) before every client
//! operation, so the server's work happens whenever the client would otherwise wait. With
//! `--mode dedicated` that is one app thread plus the poller threads: the dedicated-poller
//! shape on two cores is two spinning threads, not four. lat and rate points only.

use std::time::{Duration, Instant};

use super::conn::{BenchConn, Waiter};
use super::group::loopback_endpoint;
use super::session::{bad_data, corrupt, Check};
use super::wire::{Hello, ServerResult, CONTROL_MAX, TAG_BYE, TAG_DATA, TAG_END, TAG_READY};
use super::{engine, proto, stop_requested, EngineCfg, Plan};
use crate::cli::{Idle, TestKind};
use crate::error::BenchError;
use crate::floor::duration_ns;
use crate::machine::pin_current;
use crate::report::{Measured, Report};
use crate::stats::RateSummary;
use crate::sys::ThreadCpu;

/// What the server side is doing.
enum Serving {
    /// Waiting for a HELLO (or BYE).
    Idle,
    /// Echoing a lat point.
    Lat {
        size: usize,
        echoed: u64,
        start: Instant,
        cpu0: ThreadCpu,
    },
    /// Counting a rate point (the clock starts at message `reference`, as `serve_rate`'s).
    Rate {
        size: usize,
        reference: u64,
        count: u64,
        t0: Option<Instant>,
        cpu0: ThreadCpu,
        check: Check,
    },
    /// BYE received.
    Done,
}

/// Both ends of a loopback connection, driven by one thread: the client's calls, each after
/// one step of the server.
pub(super) struct Interleaved<C> {
    client: C,
    server: C,
    state: Serving,
    /// A control reply that found no credit yet: sent before anything else.
    pending: Option<([u8; CONTROL_MAX], usize)>,
    /// The server's wait for an echo's buffer or credit.
    w: Waiter,
    max_size: usize,
    eager_max: usize,
}

impl<C: BenchConn> Interleaved<C> {
    pub(super) fn new(client: C, server: C, idle: Idle, timeout: Duration, eager: usize) -> Self {
        let max_size = server.max_message_size().unwrap_or(usize::MAX);
        Self {
            client,
            server,
            state: Serving::Idle,
            pending: None,
            w: Waiter::new(idle, timeout, "a credit for the server's echo"),
            max_size,
            eager_max: eager,
        }
    }

    fn reply(&mut self, bytes: &[u8]) {
        let mut b = [0u8; CONTROL_MAX];
        let n = bytes.len().min(CONTROL_MAX);
        b[..n].copy_from_slice(&bytes[..n]);
        self.pending = Some((b, n));
    }

    /// One non-blocking step of the server side.
    fn step(&mut self) -> Result<(), BenchError> {
        if let Some((b, n)) = self.pending {
            if !self
                .server
                .try_send_with(n, |d| d.copy_from_slice(&b[..n]))?
            {
                return Ok(());
            }
            self.server.flush()?;
            self.pending = None;
        }
        match &mut self.state {
            Serving::Done => {}
            Serving::Idle => {
                let got = self.server.try_recv_with(|m| {
                    let mut b = [0u8; CONTROL_MAX];
                    let n = m.len().min(CONTROL_MAX);
                    b[..n].copy_from_slice(&m[..n]);
                    (b, m.len())
                })?;
                let Some((b, len)) = got else {
                    return Ok(());
                };
                let m = &b[..len.min(CONTROL_MAX)];
                if m.first() == Some(&TAG_BYE) {
                    self.state = Serving::Done;
                    return Ok(());
                }
                let hello = Hello::decode(m)?;
                if hello.size == 0 || hello.size > self.max_size as u64 {
                    self.reply(&[TAG_READY, 0]);
                    return Ok(());
                }
                let size = hello.size as usize;
                let cpu0 = ThreadCpu::now();
                self.state = match hello.test {
                    TestKind::Rate => Serving::Rate {
                        size,
                        reference: hello.warmup.max(1) - 1,
                        count: 0,
                        t0: None,
                        cpu0,
                        check: Check::new(hello.verify, size, self.eager_max),
                    },
                    TestKind::Lat => Serving::Lat {
                        size,
                        echoed: 0,
                        start: Instant::now(),
                        cpu0,
                    },
                    TestKind::Load => {
                        return Err(BenchError::invalid(
                            "--one-thread",
                            "load points need a server thread of their own",
                        ))
                    }
                };
                self.reply(&[TAG_READY, 1]);
            }
            Serving::Lat {
                size,
                echoed,
                start,
                cpu0,
            } => match self.server.try_echo(*size, TAG_DATA, &mut self.w)? {
                Some((len, TAG_DATA)) if len == *size => {
                    *echoed += 1;
                    self.w.reset();
                }
                Some((1, TAG_END)) => {
                    let rate = RateSummary {
                        msgs: *echoed,
                        bytes: *echoed * *size as u64,
                        elapsed_ns: duration_ns(start.elapsed()),
                    };
                    let cpu = ThreadCpu::now().since(cpu0);
                    self.state = Serving::Idle;
                    self.reply(&ServerResult { rate, cpu }.encode());
                }
                Some((len, tag)) => return Err(bad_data(*size, len, tag)),
                None => {}
            },
            Serving::Rate {
                size,
                reference,
                count,
                t0,
                cpu0,
                check,
            } => {
                // A burst per step: the receiver keeps up with the sender's batches.
                for _ in 0..64 {
                    let head = |m: &[u8]| {
                        (
                            m.len(),
                            m.first().copied().unwrap_or(0xFF),
                            check.first_bad(m),
                        )
                    };
                    match self.server.try_recv_with(head)? {
                        Some((_, TAG_DATA, Some(at))) => return Err(corrupt(*size, at)),
                        Some((len, TAG_DATA, None)) if len == *size => {
                            if *count == *reference {
                                *t0 = Some(Instant::now());
                            }
                            *count += 1;
                        }
                        Some((1, TAG_END, _)) => {
                            let t_end = Instant::now();
                            let msgs = count.saturating_sub(*reference + 1);
                            let rate = RateSummary {
                                msgs,
                                bytes: msgs * *size as u64,
                                elapsed_ns: t0.map_or(0, |t| duration_ns(t_end - t)),
                            };
                            let cpu = ThreadCpu::now().since(cpu0);
                            self.state = Serving::Idle;
                            self.reply(&ServerResult { rate, cpu }.encode());
                            break;
                        }
                        Some((len, tag, _)) => return Err(bad_data(*size, len, tag)),
                        None => break,
                    }
                }
            }
        }
        Ok(())
    }

    /// Steps the server until it has taken the client's BYE (bounded by `timeout`).
    fn finish(&mut self, timeout: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + timeout;
        while !matches!(self.state, Serving::Done) {
            self.step()?;
            if Instant::now() > deadline {
                return Err(BenchError::Timeout {
                    what: "the server side to take BYE",
                    secs: timeout.as_secs_f64(),
                });
            }
        }
        Ok(())
    }
}

impl<C: BenchConn> BenchConn for Interleaved<C> {
    #[inline]
    fn try_send_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, BenchError> {
        self.step()?;
        self.client.try_send_with(len, fill)
    }

    #[inline]
    fn try_send_batched_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, BenchError> {
        self.step()?;
        self.client.try_send_batched_with(len, fill)
    }

    #[inline]
    fn try_recv_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, BenchError> {
        self.step()?;
        self.client.try_recv_with(f)
    }

    #[inline]
    fn poll_batch(&mut self, limit: usize, f: impl FnMut(&[u8])) -> Result<usize, BenchError> {
        self.step()?;
        self.client.poll_batch(limit, f)
    }

    #[inline]
    fn flush(&mut self) -> Result<(), BenchError> {
        self.client.flush()
    }

    fn max_message_size(&self) -> Option<usize> {
        self.client.max_message_size()
    }

    fn counters(&self) -> Option<crate::report::Counters> {
        self.client.counters()
    }
}

impl Plan {
    /// One group with `--one-thread`: one pinned app thread makes the engine, both ends and
    /// runs every point on them.
    pub(super) fn run_group_one_thread(
        &self,
        g: &EngineCfg,
        report: &mut Report,
        pb: &indicatif::ProgressBar,
    ) -> Result<(), BenchError> {
        let base_offset = report.started.elapsed().unwrap_or_default();
        let t_base = Instant::now();
        let points = self.points();
        let (measured, res) = std::thread::scope(|s| {
            let h = std::thread::Builder::new()
                .name("bench-app".into())
                .spawn_scoped(s, || {
                    let mut out: Vec<Measured> = Vec::new();
                    let r = (|| -> Result<(), BenchError> {
                        pin_current(self.app_cores[0])?;
                        let eng = engine::build(g)?;
                        let endpoint = loopback_endpoint(self.fabric);
                        let mut listener = engine::listen(&eng, &endpoint)?;
                        let client = engine::connect(&eng, g, &endpoint, g.connect_timeout)?;
                        let server = engine::accept(&eng, g, &mut listener, g.connect_timeout)?
                            .ok_or(BenchError::Timeout {
                                what: "the loopback accept",
                                secs: g.connect_timeout.as_secs_f64(),
                            })?;
                        let mut conn = Interleaved::new(
                            client.one_thread(),
                            server.one_thread(),
                            g.idle,
                            self.stall_timeout,
                            g.buffer_size,
                        );
                        for &point in &points {
                            if stop_requested() {
                                return Err(BenchError::Interrupted);
                            }
                            let offset = || base_offset + t_base.elapsed();
                            out.push(self.measure_guarded(&mut conn, g, point, offset)?);
                        }
                        proto::client_bye(&mut conn, g.idle, self.stall_timeout)?;
                        conn.finish(self.stall_timeout)
                    })();
                    (out, r)
                });
            match h {
                Ok(h) => h
                    .join()
                    .unwrap_or((Vec::new(), Err(BenchError::ThreadPanicked("app")))),
                Err(e) => (Vec::new(), Err(BenchError::io("thread spawn", e))),
            }
        });
        for m in measured {
            pb.inc(1);
            report.push(m);
        }
        res
    }
}
