//! One client-side point: runs the protocol for it and turns the outcome into a report
//! [`Point`], with both sides' CPU use.

use std::time::{Duration, Instant};

use super::proto::{self, PointSpec};
use super::{conn, load, EngineCfg, Plan};
use crate::cli::TestKind;
use crate::error::BenchError;
use crate::quiet::{self, CpuSample, Quiet};
use crate::report::{Knobs, Measured, Point, SHORTFALL_WARN};
use crate::stats::LatencySummary;
use crate::sys::{self, CpuUse, ProcessCsw, ThreadCpu};

impl Plan {
    /// [`measure_point`](Self::measure_point), rerun up to `--retry-disturbed` times while the
    /// quiet-machine guard finds it disturbed.
    pub(super) fn measure_guarded<C: conn::BenchConn>(
        &self,
        conn: &mut C,
        g: &EngineCfg,
        point: (TestKind, usize, u64),
        base_offset: impl Fn() -> Duration,
    ) -> Result<Measured, BenchError> {
        let mut m = self.measure_point(conn, g, point, base_offset())?;
        for attempt in 1..=self.retry_disturbed {
            let Some(q) = m.point.quiet.as_ref().filter(|q| q.disturbed) else {
                break;
            };
            eprintln!(
                "bench: {} disturbed ({}): rerun {attempt} of {}",
                m.point.label, q.reason, self.retry_disturbed
            );
            m = self.measure_point(conn, g, point, base_offset())?;
        }
        Ok(m)
    }

    /// The app cores this process's threads run on: client then server in a loopback run
    /// with two threads, else the one app thread's.
    pub(super) fn app_cores_used(&self) -> Vec<usize> {
        if self.role == super::Role::Loopback && !self.one_thread {
            self.app_cores.to_vec()
        } else {
            vec![self.app_cores[0]]
        }
    }

    /// The cores this process's threads spin on: the app cores it runs (both in loopback with
    /// two threads, else the first) and the poller cores.
    pub(super) fn local_cores(&self, g: &EngineCfg) -> Vec<usize> {
        let mut cores = vec![self.app_cores[0]];
        if self.role == super::Role::Loopback && !self.one_thread {
            cores.push(self.app_cores[1]);
        }
        cores.extend(&g.pollers);
        cores.sort_unstable();
        cores.dedup();
        cores
    }

    /// The guard's verdict from `before` to now, with the app threads' CPU as spinners.
    fn judge_quiet(&self, g: &EngineCfg, before: &CpuSample, cpu: Option<CpuUse>) -> Quiet {
        let after = quiet::sample();
        let mut spinners = Vec::new();
        if let Some(c) = cpu {
            spinners.push(("client", c.client.user_s + c.client.system_s));
            // One thread runs both ends with --one-thread; its CPU is the client's.
            if let Some(s) = c.server.filter(|_| !self.one_thread) {
                spinners.push(("server", s.user_s + s.system_s));
            }
        }
        quiet::judge(
            before,
            &after,
            &self.local_cores(g),
            &spinners,
            quiet::Bounds {
                others_max: self.disturbed_above,
                spinning: g.idle == crate::cli::Idle::Spin,
            },
        )
    }

    /// Measures one `test` point of `size` bytes at offered `rate` (0: unlimited) on `conn`.
    pub(super) fn measure_point<C: conn::BenchConn>(
        &self,
        conn: &mut C,
        g: &EngineCfg,
        (test, size, rate): (TestKind, usize, u64),
        base_offset: Duration,
    ) -> Result<Measured, BenchError> {
        let conn_limit = conn.max_message_size();
        if let Some(max) = conn_limit.filter(|&max| size > max) {
            // Refused before the point starts, with the engine's own error (which states the
            // limit): the connection has no large slots, or smaller ones.
            return Err(BenchError::Engine {
                step: format!("a {size}-byte {} point", test.as_str()),
                source: Box::new(spinwire::Error::MessageTooLarge { size, max }),
            });
        }
        let (iters, warmup) = self.point_iters(g, test, size);
        let spec = PointSpec {
            size,
            iters,
            duration: self.duration,
            warmup,
            rate,
            interval: self.interval,
            idle: g.idle,
            timeout: self.stall_timeout,
            burst: self.burst,
            latency: self.latency,
            stall: self.stall,
            stall_after: self.stall_after,
            app_batch: self.app_batch,
            verify: self.verify,
            eager_max: g.buffer_size,
        };
        let mut label = format!(
            "{}-{}-{}-{}B",
            test.as_str(),
            self.fabric.as_str(),
            g.mode.as_str(),
            size
        );
        if test == TestKind::Load {
            label.push_str(&format!("-{rate}mps"));
        }
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
            warmup,
            duration_s: self.duration.map(|d| d.as_secs_f64()),
            elapsed_s: 0.0,
            rtt_ns: None,
            half_rtt_ns: None,
            msgs_per_sec: None,
            mb_per_sec: None,
            gbit_per_sec: None,
            bytes_per_sec: None,
            co_corrected: false,
            cross: g.cross.map(|(k, _)| k.as_str().to_string()),
            cross_value: g.cross.map(|(_, v)| v as u64),
            rtt_x_floor: None,
            rtt_x_floor_two_lines: None,
            rtt_x_relay: None,
            msgs_per_sec_x_floor: None,
            floor_msgs_per_sec: None,
            floor_memcpy_bytes_per_sec: None,
            bytes_per_sec_x_memcpy: None,
            conn_max_message_size: conn_limit.map(|m| m as u64),
            counters: None,
            latency_ns: None,
            latency_kind: None,
            latency_x_floor: None,
            burst: None,
            achieved_rate: None,
            rate_shortfall: None,
            rate_warning: false,
            cpu: None,
            process: None,
            quiet: None,
            knobs: Knobs {
                idle: g.idle.as_str().into(),
                batch: g.batch,
                depth: g.depth,
                inline_threshold: g.inline_threshold,
                signal_every: g.signal_every,
                buffers: g.buffers,
                buffer_size: g.buffer_size,
                poller_cores: g.pollers.clone(),
                app_cores: self.app_cores_used(),
                offered_rate: rate,
                app_batch: self.app_batch,
                max_message_size: g.max_message_size,
                large_buffers: g.large_buffers,
                large_threshold: g.effective_large_threshold(),
                hugepages: g.hugepages.as_str().into(),
                api: g.api.as_str().into(),
                rdma_srq: g.rdma_srq.0,
                rdma_srq_credits: g.rdma_srq.1,
            },
        };
        let before = conn.counters();
        let counters = |conn: &C| Some(conn.counters()?.since(&before?));
        let csw0 = (Instant::now(), sys::process_csw_now());
        let process = || Some(ProcessCsw::since(csw0.1, csw0.0.elapsed()));
        let quiet0 = quiet::sample();
        let cpu0 = ThreadCpu::now();
        let cpu = |server: ThreadCpu| {
            Some(CpuUse {
                client: ThreadCpu::now().since(&cpu0),
                server: Some(server),
            })
        };
        match test {
            TestKind::Lat => {
                let out = proto::client_lat(conn, &spec, base_offset)?;
                point.cpu = cpu(out.server_cpu);
                point.process = process();
                point.quiet = Some(self.judge_quiet(g, &quiet0, point.cpu));
                point.counters = counters(conn);
                let rtt = LatencySummary::from_histogram(&out.rtt);
                point.iters = out.count;
                point.elapsed_s = out.elapsed.as_secs_f64();
                point.rtt_ns = rtt;
                point.half_rtt_ns = rtt.map(|r| r.scaled(0.5));
                point.co_corrected = rate > 0;
                Ok(Measured {
                    point,
                    rtt: Some(out.rtt),
                    intervals: out.intervals,
                })
            }
            TestKind::Rate => {
                let r = proto::client_rate(conn, &spec)?;
                point.cpu = cpu(r.cpu);
                point.process = process();
                point.quiet = Some(self.judge_quiet(g, &quiet0, point.cpu));
                point.counters = counters(conn);
                point.iters = r.rate.msgs;
                point.elapsed_s = r.rate.elapsed_ns as f64 / 1e9;
                point.msgs_per_sec = Some(r.rate.msgs_per_sec());
                point.mb_per_sec = Some(r.rate.mb_per_sec());
                point.gbit_per_sec = Some(r.rate.gbit_per_sec());
                point.bytes_per_sec = Some(r.rate.bytes_per_sec());
                Ok(Measured {
                    point,
                    rtt: None,
                    intervals: Vec::new(),
                })
            }
            TestKind::Load => {
                let out = load::client_load(conn, &spec, base_offset)?;
                point.cpu = cpu(out.server_cpu);
                point.process = process();
                point.quiet = Some(self.judge_quiet(g, &quiet0, point.cpu));
                point.counters = counters(conn);
                point.iters = out.count;
                point.elapsed_s = out.elapsed.as_secs_f64();
                point.latency_ns = LatencySummary::from_histogram(&out.latency);
                point.latency_kind = Some(self.latency.as_str().into());
                point.burst = Some(self.burst);
                point.achieved_rate = Some(out.achieved_rate);
                let shortfall = 1.0 - out.achieved_rate / out.offered_rate;
                point.rate_shortfall = Some(shortfall);
                point.rate_warning = shortfall > SHORTFALL_WARN;
                Ok(Measured {
                    point,
                    rtt: Some(out.latency),
                    intervals: out.intervals,
                })
            }
        }
    }
}
