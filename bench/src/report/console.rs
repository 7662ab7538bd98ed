//! The console tables.

use std::fmt::Write as _;

use crate::cli::Unit;
use crate::report::{Point, Report};
use crate::stats::LatencySummary;

fn lat_cell(ns: f64, unit: Unit) -> String {
    match unit {
        Unit::Ns => format!("{ns:.0}"),
        Unit::Us => format!("{:.3}", ns / 1e3),
    }
}

fn unit_name(unit: Unit) -> &'static str {
    match unit {
        Unit::Ns => "ns",
        Unit::Us => "us",
    }
}

fn point_name(p: &Point) -> String {
    let mut s = format!("{}B", p.size_bytes);
    if let (Some(k), Some(v)) = (&p.cross, p.cross_value) {
        let _ = write!(s, " {k}={v}");
    }
    if is_disturbed(p) {
        s.push_str(" !");
    }
    s
}

fn is_disturbed(p: &Point) -> bool {
    p.quiet.as_ref().is_some_and(|q| q.disturbed)
}

/// The warning printed under the tables for a point the quiet-machine guard found disturbed.
pub fn disturbed_warning(p: &Point) -> String {
    let why = p.quiet.as_ref().map_or("", |q| q.reason.as_str());
    format!(
        "WARNING: {} (marked !) was disturbed: {why}; its figures are not the quiet machine's \
         (rerun with --quiet-wait SECONDS and --retry-disturbed N, or on idle cores)",
        p.label
    )
}

/// The quiet-machine table: per point, other processes' CPU on the run's cores and each
/// spinner's share of its core.
fn quiet_table(out: &mut String, points: &[&Point]) {
    let rows: Vec<(&Point, &crate::quiet::Quiet)> = points
        .iter()
        .filter_map(|p| Some((*p, p.quiet.as_ref()?)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "
Quiet machine (others: CPU other processes took on the run's cores, in % of one core; spinners: share of their core)"
    );
    let _ = writeln!(
        out,
        "{:<28} {:<12} {:>9} {:>9}  spinners",
        "point", "cores", "others %", "own %"
    );
    for (p, q) in rows {
        let spin: Vec<String> = q
            .spinners
            .iter()
            .map(|(n, v)| format!("{n} {:.0} %", v * 100.0))
            .collect();
        let _ = writeln!(
            out,
            "{:<28} {:<12} {:>9.1} {:>9.1}  {}{}",
            p.label,
            format!("{:?}", q.cores),
            q.others_cpu * 100.0,
            q.own_cpu * 100.0,
            spin.join(", "),
            if q.disturbed { "  DISTURBED" } else { "" }
        );
    }
}

fn lat_row(out: &mut String, name: &str, what: &str, s: &LatencySummary, unit: Unit) {
    let _ = write!(out, "{name:<16} {what:<7}");
    for v in s.as_array() {
        let _ = write!(out, " {:>10}", lat_cell(v, unit));
    }
    out.push('\n');
}

fn ratio_row(out: &mut String, label: &str, r: &LatencySummary) {
    let _ = write!(out, "{:<16} {:<7}", "", label);
    for v in r.as_array() {
        let _ = write!(out, " {:>10}", format!("{v:.2}x"));
    }
    out.push('\n');
}

fn p_cross(points: &[Point]) -> String {
    points
        .iter()
        .find_map(|p| p.cross.clone())
        .unwrap_or_default()
}

/// The size thresholds a point ran with: what travels inline, eager (in a pool buffer) and
/// through a large slot, and the limit (configured, and the connection's own).
pub fn thresholds_line(p: &Point) -> String {
    let k = &p.knobs;
    let mut s = format!(
        "thresholds: inline <= {} B | eager <= {} B (buffer size) | large slot > {} B ({} slots) | max message {} B",
        k.inline_threshold, k.buffer_size, k.large_threshold, k.large_buffers, k.max_message_size
    );
    if let Some(c) = p.conn_max_message_size {
        let _ = write!(s, " (connection: {c} B)");
    }
    s
}

/// What the client engine's pools and segments got (`--hugepages`): `None` for a point without
/// engine counters (floors).
pub fn placement_line(p: &Point) -> Option<String> {
    let c = p.counters.as_ref()?;
    Some(format!(
        "placement: hugepages {} -> {} regions on 2 MiB pages ({} B), {} on 4 KiB pages ({} B), {} fell back",
        p.knobs.hugepages,
        c.huge_regions,
        c.huge_bytes,
        c.small_regions,
        c.small_bytes,
        c.hugepage_fallbacks
    ))
}

/// The warning printed for a load point whose achieved rate fell short of the offered one.
pub fn shortfall_warning(p: &Point) -> String {
    format!(
        "WARNING: {}: achieved {:.0} msgs/s is {:.1} % below the offered {} msgs/s: the sender could \
         not keep up, so this point measures a growing backlog, not the transport at that rate",
        p.label,
        p.achieved_rate.unwrap_or(0.0),
        p.rate_shortfall.unwrap_or(0.0) * 100.0,
        p.knobs.offered_rate
    )
}

/// Renders the latency and rate tables of `report`, with ratios to the floor when measured.
pub fn render(report: &Report, unit: Unit) -> String {
    let mut out = String::new();
    let floor = report.floor_figures();
    let lat: Vec<&Point> = report
        .measured
        .iter()
        .map(|m| &m.point)
        .filter(|p| p.rtt_ns.is_some() && p.test != "floor")
        .collect();
    let rate: Vec<&Point> = report
        .measured
        .iter()
        .map(|m| &m.point)
        .filter(|p| p.msgs_per_sec.is_some() && p.test != "floor")
        .collect();
    let m = &report.machine;
    let _ = write!(out, "machine: {} ({} cores online", m.cpu_model, m.cores);
    if !m.allowed_cores.is_empty() && m.allowed_cores.len() != m.cores {
        let _ = write!(out, "; this process may run on cores {:?}", m.allowed_cores);
    }
    let _ = writeln!(out, ")");
    for n in &report.notes {
        let _ = writeln!(out, "note: {n}");
    }
    let wake = report
        .floor
        .as_ref()
        .filter(|f| f.kind == crate::floor_wake::KIND);
    if let (Some(f), Some(w)) = (&floor, wake) {
        let _ = writeln!(
            out,
            "wake-up reference (cores {} <-> {}): bare futex ping-pong at {:.0} msgs/s, the server asleep between pings: RTT p50 {} {u}, p99 {} {u}",
            f.cores[0],
            f.cores[1],
            w.rate.msgs_per_sec(),
            lat_cell(f.rtt_ns.p50, unit),
            lat_cell(f.rtt_ns.p99, unit),
            u = unit_name(unit),
        );
    } else if let Some(f) = &floor {
        let tcp = report.floor.as_ref().is_some_and(|f| f.kind == "tcp-raw");
        let _ = writeln!(
            out,
            "floor (cores {} <-> {}): {} RTT p50 {} {u}, {} stream {:.2} M msgs/s{}",
            f.cores[0],
            f.cores[1],
            if tcp { "raw tcp" } else { "cache-line" },
            lat_cell(f.rtt_ns.p50, unit),
            if tcp { "raw tcp" } else { "SPSC" },
            f.msgs_per_sec / 1e6,
            match &f.rtt_two_lines_ns {
                Some(two) => format!(
                    "; two lines (one per direction) RTT p50 {} {}",
                    lat_cell(two.p50, unit),
                    unit_name(unit)
                ),
                None => String::new(),
            },
            u = unit_name(unit),
        );
    }
    for m in &report.memcpy {
        let _ = writeln!(
            out,
            "memcpy floor (core {}): {}B copies {:.1} MB/s ({:.0} bytes/s, one core)",
            m.core,
            m.size_bytes,
            m.mb_per_sec(),
            m.bytes_per_sec()
        );
    }
    let first = report.measured.first().map(|m| &m.point);
    if let Some(p) = first.filter(|p| p.test != "floor") {
        let _ = writeln!(
            out,
            "fabric {} | mode {} | role {} | idle {}{} | batch {} | depth {} | buffers {} x {} B | app cores {:?} | poller cores {:?}{}",
            p.fabric,
            p.mode,
            p.role,
            p.knobs.idle,
            match p.knobs.api.as_str() {
                "" | "buffer" => String::new(),
                api => format!(" | api {api}"),
            },
            p.knobs.batch,
            match p.knobs.depth {
                0 => "default".to_owned(),
                d => d.to_string(),
            },
            p.knobs.buffers,
            p.knobs.buffer_size,
            p.knobs.app_cores,
            p.knobs.poller_cores,
            if p.co_corrected {
                format!(" | offered {} msgs/s (CO-corrected)", p.knobs.offered_rate)
            } else {
                String::new()
            }
        );
        let _ = writeln!(out, "{}", thresholds_line(p));
        if let Some(line) = placement_line(p) {
            let _ = writeln!(out, "{line}");
        }
    }
    let header = |out: &mut String, title: &str| {
        let _ = writeln!(out, "\n{title}");
        let _ = write!(out, "{:<16} {:<7}", "point", "");
        for c in LatencySummary::COLUMNS {
            let _ = write!(out, " {c:>10}");
        }
        out.push('\n');
    };
    let standalone_floor: Vec<&Point> = report
        .measured
        .iter()
        .map(|m| &m.point)
        .filter(|p| p.test == "floor")
        .collect();
    if !lat.is_empty() || !standalone_floor.is_empty() {
        header(&mut out, &format!("Latency ({})", unit_name(unit)));
        if let Some(f) = &floor {
            lat_row(&mut out, "floor", "RTT", &f.rtt_ns, unit);
            lat_row(&mut out, "", "RTT/2", &f.rtt_ns.scaled(0.5), unit);
            if let Some(two) = &f.rtt_two_lines_ns {
                lat_row(&mut out, "floor, 2 lines", "RTT", two, unit);
            }
            if let Some(r) = &f.rtt_rings_ns {
                lat_row(&mut out, "floor, rings", "RTT", r, unit);
            }
            if let Some(r) = &f.rtt_paired_rings_ns {
                lat_row(&mut out, "floor, paired", "RTT", r, unit);
            }
            if let Some(r) = &f.rtt_relay_ns {
                lat_row(&mut out, "floor, relay", "RTT", r, unit);
            }
        }
        for p in &lat {
            if let Some(r) = &p.rtt_ns {
                lat_row(&mut out, &point_name(p), "RTT", r, unit);
            }
            if let Some(h) = &p.half_rtt_ns {
                lat_row(&mut out, "", "RTT/2", h, unit);
            }
            if let Some(x) = &p.rtt_x_floor {
                ratio_row(&mut out, "x floor", x);
            }
            if let Some(x) = &p.rtt_x_floor_two_lines {
                ratio_row(&mut out, "x 2line", x);
            }
            if let Some(x) = &p.rtt_x_relay {
                ratio_row(&mut out, "x relay", x);
            }
        }
    }
    // The wake-up reference has no rate to compare with.
    let floor = floor.filter(|_| wake.is_none());
    if !rate.is_empty() || floor.is_some() {
        let _ = writeln!(
            out,
            "\nRate{}",
            match (floor.is_some(), report.memcpy.is_empty()) {
                (true, false) => " (x floor: msgs/s over the SPSC floor's; x memcpy: bytes/s over one core's memcpy of the size)",
                (true, true) => " (x floor: msgs/s over the SPSC floor's)",
                _ => "",
            }
        );
        let _ = writeln!(
            out,
            "{:<16} {:>14} {:>14} {:>10} {:>12} {:>10} {:>12} {:>16} {:>12} {:>10}",
            "point",
            "msgs/s",
            "floor msgs/s",
            "x floor",
            "MB/s",
            "Gb/s",
            "iters",
            "bytes/s",
            "memcpy MB/s",
            "x memcpy"
        );
        if let Some(f) = &floor {
            let _ = writeln!(
                out,
                "{:<16} {:>14.0} {:>14.0} {:>10} {:>12.1} {:>10.3} {:>12} {:>16.0}",
                match report.floor.as_ref() {
                    Some(f) if f.kind == "tcp-raw" =>
                        format!("floor ({}B)", f.rate.bytes / f.rate.msgs.max(1)),
                    _ => "floor (8B)".to_string(),
                },
                f.msgs_per_sec,
                f.msgs_per_sec,
                "1.00x",
                f.mb_per_sec,
                f.mb_per_sec * 8.0 / 1e3,
                "",
                f.mb_per_sec * 1e6,
            );
        }
        for p in &rate {
            let _ = writeln!(
                out,
                "{:<16} {:>14.0} {:>14} {:>10} {:>12.1} {:>10.3} {:>12} {:>16.0} {:>12} {:>10}",
                point_name(p),
                p.msgs_per_sec.unwrap_or(0.0),
                p.floor_msgs_per_sec
                    .map(|f| format!("{f:.0}"))
                    .unwrap_or_default(),
                p.msgs_per_sec_x_floor
                    .map(|x| format!("{x:.3}x"))
                    .unwrap_or_default(),
                p.mb_per_sec.unwrap_or(0.0),
                p.gbit_per_sec.unwrap_or(0.0),
                p.iters,
                p.bytes_per_sec.unwrap_or(0.0),
                p.floor_memcpy_bytes_per_sec
                    .map(|f| format!("{:.1}", f / 1e6))
                    .unwrap_or_default(),
                p.bytes_per_sec_x_memcpy
                    .map(|x| format!("{x:.3}x"))
                    .unwrap_or_default(),
            );
        }
    }
    let load: Vec<&Point> = report
        .measured
        .iter()
        .map(|m| &m.point)
        .filter(|p| p.latency_ns.is_some())
        .collect();
    if !load.is_empty() {
        let _ = writeln!(
            out,
            "\nOpen-loop load (latency from intended send time, {})",
            unit_name(unit)
        );
        let _ = writeln!(
            out,
            "{:<16} {:<10} {:>12} {:>12} {:>8} {:>10} {:>10} {:>10} {:>10}{}",
            "point",
            "latency",
            "offered/s",
            "achieved/s",
            "short",
            "p50",
            "p99",
            "p99.9",
            "max",
            if wake.is_some() {
                "   p50 x futex ref"
            } else {
                ""
            }
        );
        for p in &load {
            let Some(l) = p.latency_ns else { continue };
            let _ = writeln!(
                out,
                "{:<16} {:<10} {:>12} {:>12.0} {:>7.2}% {:>10} {:>10} {:>10} {:>10}{}",
                format!("{} @{}", point_name(p), p.knobs.offered_rate),
                p.latency_kind.as_deref().unwrap_or(""),
                p.knobs.offered_rate,
                p.achieved_rate.unwrap_or(0.0),
                p.rate_shortfall.unwrap_or(0.0) * 100.0,
                lat_cell(l.p50, unit),
                lat_cell(l.p99, unit),
                lat_cell(l.p99_9, unit),
                lat_cell(l.max, unit),
                match (&p.latency_x_floor, wake) {
                    (Some(x), _) => format!("   {:.2}x", x.p50),
                    (None, Some(_)) => "   - (one-way; the reference is a round trip)".to_string(),
                    (None, None) => String::new(),
                },
            );
        }
        for p in load.iter().filter(|p| p.rate_warning) {
            let _ = writeln!(out, "{}", shortfall_warning(p));
        }
        let points: Vec<Point> = load.iter().map(|p| (*p).clone()).collect();
        for (size, cross, knee) in crate::report::knees(&points) {
            let what = match cross {
                Some(v) => format!("{size}B ({}={v})", p_cross(&points)),
                None => format!("{size}B"),
            };
            let _ = match knee {
                Some(r) => writeln!(
                    out,
                    "knee {what}: p99 first exceeds twice its lowest-load value at {r} msgs/s offered"
                ),
                None => writeln!(out, "knee {what}: none in the offered range (p99 stays within 2x)"),
            };
        }
    }
    let cpu: Vec<&Point> = report
        .measured
        .iter()
        .map(|m| &m.point)
        .filter(|p| p.cpu.is_some())
        .collect();
    if !cpu.is_empty() {
        let _ = writeln!(
            out,
            "\nCPU per side (app threads; ivcsw: descheduled, user+sys near elapsed: saturated; \
             process: every thread of this process, the tail's usual cause)"
        );
        let _ = writeln!(
            out,
            "{:<28} {:<7} {:>10} {:>10} {:>10} {:>8} {:>8}",
            "point", "side", "elapsed s", "user s", "sys s", "vcsw", "ivcsw"
        );
        for p in cpu {
            let c = p.cpu.unwrap_or_default();
            for (side, t) in [("client", Some(c.client)), ("server", c.server)] {
                let Some(t) = t else { continue };
                let _ = writeln!(
                    out,
                    "{:<28} {:<7} {:>10.3} {:>10.3} {:>10.3} {:>8} {:>8}",
                    if side == "client" {
                        p.label.as_str()
                    } else {
                        ""
                    },
                    side,
                    p.elapsed_s,
                    t.user_s,
                    t.system_s,
                    t.voluntary_csw,
                    t.involuntary_csw
                );
            }
            if let Some(c) = p.process {
                let _ = writeln!(
                    out,
                    "{:<28} {:<7} {:>10.3} {:>10} {:>10} {:>8} {:>8}   ({:.0} ivcsw/s)",
                    "",
                    "process",
                    c.elapsed_s,
                    "",
                    "",
                    c.voluntary_csw,
                    c.involuntary_csw,
                    c.involuntary_csw_per_sec
                );
            }
        }
    }
    let all: Vec<&Point> = report.measured.iter().map(|m| &m.point).collect();
    quiet_table(&mut out, &all);
    let disturbed: Vec<&&Point> = all.iter().filter(|p| is_disturbed(p)).collect();
    if !disturbed.is_empty() {
        out.push('\n');
        for p in disturbed {
            let _ = writeln!(out, "{}", disturbed_warning(p));
        }
    }
    if report.interrupted {
        let _ = writeln!(out, "\ninterrupted: showing the points measured so far");
    }
    out
}
