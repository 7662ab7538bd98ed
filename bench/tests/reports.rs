//! Every report format is written and parsed back: `.hgrm`, the interval log, `summary.json`,
//! `summary.csv` and the SVG plots. Histograms are synthetic (no threads spin here).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
use hdrhistogram::serialization::Deserializer;
use hdrhistogram::Histogram;
use spinwire_bench::floor::{FloorResult, RingFloors};
use spinwire_bench::report::hlog::Interval;
use spinwire_bench::report::{hgrm, Knobs, Measured, Point, Report, Summary, CSV_COLUMNS};
use spinwire_bench::stats::{new_latency_histogram, LatencySummary, RateSummary};

fn out_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A spread-out latency distribution: `n` values over `base ..= 5 * base` ns.
fn hist(base: u64, n: u64) -> Histogram<u64> {
    let mut h = new_latency_histogram();
    for i in 0..n {
        h.saturating_record(base + (i * 7919) % (4 * base));
    }
    h
}

fn knobs() -> Knobs {
    Knobs {
        idle: "spin".into(),
        batch: 32,
        depth: 128,
        inline_threshold: 64,
        signal_every: 16,
        buffers: 256,
        buffer_size: 4096,
        poller_cores: vec![],
        app_cores: vec![0, 1],
        offered_rate: 0,
        app_batch: 0,
        max_message_size: 16 << 20,
        large_buffers: 2,
        large_threshold: 4096,
        hugepages: "try".into(),
        rdma_srq: 0,
        rdma_srq_credits: 0,
        api: "buffer".into(),
    }
}

fn point(test: &str, size: u64) -> Point {
    Point {
        test: test.into(),
        label: format!("{test}-shm-rtc-{size}B"),
        fabric: "shm".into(),
        mode: "rtc".into(),
        role: "loopback".into(),
        size_bytes: size,
        iters: 10_000,
        warmup: 100,
        duration_s: None,
        elapsed_s: 0.5,
        rtt_ns: None,
        half_rtt_ns: None,
        msgs_per_sec: None,
        mb_per_sec: None,
        gbit_per_sec: None,
        bytes_per_sec: None,
        co_corrected: false,
        cross: None,
        cross_value: None,
        rtt_x_floor: None,
        rtt_x_floor_two_lines: None,
        rtt_x_relay: None,
        msgs_per_sec_x_floor: None,
        floor_msgs_per_sec: None,
        floor_memcpy_bytes_per_sec: None,
        bytes_per_sec_x_memcpy: None,
        conn_max_message_size: None,
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
        knobs: knobs(),
    }
}

fn sample_report() -> Report {
    let mut r = Report::new(vec![
        "bench".into(),
        "sweep".into(),
        "--label=\"x,y\"".into(),
    ]);
    r.floor = Some(FloorResult {
        rtt: hist(150, 20_000),
        rtt_two_lines: Some(hist(200, 20_000)),
        rings: Some(RingFloors {
            separate: hist(180, 20_000),
            paired: hist(160, 20_000),
            relay: hist(400, 20_000),
        }),
        rate: RateSummary {
            msgs: 1_000_000,
            bytes: 8_000_000,
            elapsed_ns: 50_000_000,
        },
        cores: [0, 1],
        kind: "cache-line",
        ping_bytes: 8,
    });
    for (i, size) in [8u64, 64, 512].into_iter().enumerate() {
        let h = hist(1000 + 300 * i as u64, 10_000);
        let mut p = point("lat", size);
        if size == 512 {
            // Through a dedicated poller: compared with the relay floor too.
            p.mode = "dedicated".into();
        }
        p.rtt_ns = LatencySummary::from_histogram(&h);
        p.half_rtt_ns = p.rtt_ns.map(|s| s.scaled(0.5));
        let intervals = (0..3)
            .map(|k| Interval {
                start: Duration::from_millis(100 * k),
                length: Duration::from_millis(100),
                hist: hist(900 + 100 * k, 1000),
            })
            .collect();
        r.push(Measured {
            point: p,
            rtt: Some(h),
            intervals,
        });
        let rs = RateSummary {
            msgs: 1_000_000,
            bytes: 1_000_000 * size,
            elapsed_ns: 100_000_000 + 10_000_000 * i as u64,
        };
        let mut p = point("rate", size);
        p.msgs_per_sec = Some(rs.msgs_per_sec());
        p.mb_per_sec = Some(rs.mb_per_sec());
        p.gbit_per_sec = Some(rs.gbit_per_sec());
        r.push(Measured {
            point: p,
            rtt: None,
            intervals: vec![],
        });
    }
    r
}

#[test]
fn hgrm_parses_back_to_the_same_percentiles() {
    let r = sample_report();
    let dir = out_dir("reports-hgrm");
    r.write_dir(&dir).unwrap();
    for m in &r.measured {
        let Some(h) = &m.rtt else { continue };
        let text = std::fs::read_to_string(dir.join(format!("{}.hgrm", m.point.label))).unwrap();
        assert!(text.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)\n\n"));
        let parsed = hgrm::parse(&text).unwrap();
        assert_eq!(parsed.total_count, h.len());
        assert_eq!(parsed.lines.last().unwrap().total_count, h.len());
        assert_eq!(parsed.lines.last().unwrap().quantile, 1.0);
        assert!((parsed.max - h.max() as f64 / 1e3).abs() < 1e-3);
        assert!((parsed.mean - h.mean() / 1e3).abs() < 1e-3);
        assert!((parsed.stdev - h.stdev() / 1e3).abs() < 1e-3);
        for q in [0.0, 0.5, 0.9, 0.99, 0.999] {
            let want = h.value_at_quantile(q) as f64 / 1e3;
            let got = parsed.value_at_quantile(q).unwrap();
            // The file holds the value at each reporting tick; within the histogram's 3
            // significant digits of the exact quantile.
            assert!(
                (got - want).abs() <= want * 0.01 + 1e-3,
                "q={q}: {got} vs {want}"
            );
        }
        // Quantiles and counts never go backwards.
        for w in parsed.lines.windows(2) {
            assert!(w[1].quantile >= w[0].quantile && w[1].total_count >= w[0].total_count);
        }
    }
    assert!(dir.join("floor.hgrm").exists());
}

#[test]
fn interval_log_reads_back_with_the_hdrhistogram_reader() {
    let r = sample_report();
    let dir = out_dir("reports-hlog");
    r.write_dir(&dir).unwrap();
    let m = r.measured.iter().find(|m| !m.intervals.is_empty()).unwrap();
    let bytes = std::fs::read(dir.join(format!("{}.hlog", m.point.label))).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(text.contains("\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\""));
    let mut deser = Deserializer::new();
    let mut seen = Vec::new();
    let mut base = None;
    for entry in IntervalLogIterator::new(&bytes) {
        match entry.unwrap() {
            LogEntry::BaseTime(t) => base = Some(t),
            LogEntry::StartTime(_) => {}
            LogEntry::Interval(ilh) => {
                let decoded = base64_decode(ilh.encoded_histogram());
                let h: Histogram<u64> = deser.deserialize(&mut decoded.as_slice()).unwrap();
                // The max column is in microseconds.
                assert!((ilh.max() - h.max() as f64 / 1e3).abs() < 1e-2);
                seen.push((ilh.start_timestamp(), ilh.duration(), h));
            }
        }
    }
    assert!(base.is_some());
    assert_eq!(seen.len(), m.intervals.len());
    for ((start, len, h), want) in seen.iter().zip(&m.intervals) {
        assert_eq!(h.len(), want.hist.len());
        assert_eq!(h.max(), want.hist.max());
        assert!((start.as_secs_f64() - want.start.as_secs_f64()).abs() < 2e-3);
        assert!((len.as_secs_f64() - want.length.as_secs_f64()).abs() < 2e-3);
    }
}

/// Minimal standard base64 decoder (the interval log's histogram encoding).
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("bad base64 byte {c}"),
        }
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= val(c) << (18 - 6 * i);
        }
        let n = chunk.len() * 6 / 8;
        for i in 0..n {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    out
}

#[test]
fn summary_json_has_the_stable_schema() {
    let r = sample_report();
    let dir = out_dir("reports-json");
    r.write_dir(&dir).unwrap();
    let text = std::fs::read_to_string(dir.join("summary.json")).unwrap();
    // Typed round trip (floats to within serde_json's last-digit parsing).
    let s: Summary = serde_json::from_str(&text).unwrap();
    let want = r.summary();
    assert_eq!(s.machine, want.machine);
    assert_eq!(s.points.len(), 6);
    for (got, want) in s.points.iter().zip(&want.points) {
        assert_eq!(
            (&got.test, &got.label, got.size_bytes),
            (&want.test, &want.label, want.size_bytes)
        );
        assert_eq!(got.knobs, want.knobs);
        let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => (a - b).abs() <= b.abs() * 1e-12,
            (a, b) => a.is_none() && b.is_none(),
        };
        assert!(close(got.msgs_per_sec, want.msgs_per_sec));
        assert!(close(
            got.rtt_ns.map(|r| r.p99_9),
            want.rtt_ns.map(|r| r.p99_9)
        ));
    }
    // Untyped: the documented keys, with nulls where not measured.
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["machine"]["cpu_model"].is_string());
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(v["floor"]["rtt_ns"]["p50"].is_number());
    // The two-line floor (hist(200, ..)) above the one-line one (hist(150, ..)), and each
    // latency point's ratio to it.
    let two = v["floor"]["rtt_two_lines_ns"]["p50"].as_f64().unwrap();
    assert!(
        two > v["floor"]["rtt_ns"]["p50"].as_f64().unwrap(),
        "{}",
        v["floor"]
    );
    // The ring floors, each its own histogram.
    let rings = v["floor"]["rtt_rings_ns"]["p50"].as_f64().unwrap();
    let paired = v["floor"]["rtt_paired_rings_ns"]["p50"].as_f64().unwrap();
    assert!(paired < rings && rings < two, "{}", v["floor"]);
    let relay = v["floor"]["rtt_relay_ns"]["p50"].as_f64().unwrap();
    assert!(relay > two, "{}", v["floor"]);
    let mut dedicated = 0;
    for p in v["points"].as_array().unwrap() {
        if let Some(p50) = p["rtt_ns"]["p50"].as_f64() {
            let x = p["rtt_x_floor_two_lines"]["p50"].as_f64().unwrap();
            assert!((x - p50 / two).abs() < 1e-9, "{p}");
            // The relay ratio for the points through a dedicated poller only.
            if p["mode"] == "dedicated" {
                dedicated += 1;
                let x = p["rtt_x_relay"]["p50"].as_f64().unwrap();
                assert!((x - p50 / relay).abs() < 1e-9, "{p}");
            } else {
                assert!(p["rtt_x_relay"].is_null(), "{p}");
            }
        }
    }
    assert_eq!(dedicated, 1);
    for p in v["points"].as_array().unwrap() {
        for key in [
            "test",
            "fabric",
            "mode",
            "size_bytes",
            "iters",
            "rtt_ns",
            "msgs_per_sec",
            "mb_per_sec",
            "batch",
            "depth",
            "inline_threshold",
            "signal_every",
            "buffers",
            "buffer_size",
            "poller_cores",
            "app_cores",
            "idle",
        ] {
            assert!(p.get(key).is_some(), "point lacks {key}: {p}");
        }
        match p["test"].as_str().unwrap() {
            "lat" => {
                for k in [
                    "min", "p50", "p90", "p99", "p99_9", "p99_99", "max", "mean", "stdev",
                ] {
                    assert!(p["rtt_ns"][k].is_number(), "rtt_ns.{k}");
                }
                assert!(p["msgs_per_sec"].is_null() && p["mb_per_sec"].is_null());
                assert!(p["rtt_x_floor"]["p50"].as_f64().unwrap() > 1.0);
            }
            "rate" => {
                assert!(p["rtt_ns"].is_null());
                assert!(p["msgs_per_sec"].as_f64().unwrap() > 0.0);
                assert!(p["mb_per_sec"].as_f64().unwrap() > 0.0);
                assert!(p["msgs_per_sec_x_floor"].as_f64().unwrap() > 0.0);
            }
            t => panic!("unexpected test {t}"),
        }
    }
}

#[test]
fn summary_csv_reads_back() {
    let r = sample_report();
    let dir = out_dir("reports-csv");
    r.write_dir(&dir).unwrap();
    let mut rdr = csv::Reader::from_path(dir.join("summary.csv")).unwrap();
    let headers: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(headers, CSV_COLUMNS);
    let rows: Vec<csv::StringRecord> = rdr.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), r.measured.len());
    let col = |name: &str| CSV_COLUMNS.iter().position(|c| *c == name).unwrap();
    for (row, m) in rows.iter().zip(&r.measured) {
        assert_eq!(&row[col("test")], m.point.test);
        assert_eq!(
            row[col("size_bytes")].parse::<u64>().unwrap(),
            m.point.size_bytes
        );
        assert_eq!(&row[col("app_cores")], "0;1");
        match m.point.rtt_ns {
            Some(rtt) => {
                let p99: f64 = row[col("rtt_p99_ns")].parse().unwrap();
                assert_eq!(p99, rtt.p99);
                assert!(row[col("msgs_per_sec")].is_empty());
            }
            None => {
                assert!(row[col("rtt_p50_ns")].is_empty());
                let mps: f64 = row[col("msgs_per_sec")].parse().unwrap();
                assert_eq!(Some(mps), m.point.msgs_per_sec);
            }
        }
    }
}

#[test]
fn svg_plots_parse_as_xml() {
    let mut r = sample_report();
    // Text that needs escaping must not break the XML.
    r.measured[0].point.label = "lat <&> \"quoted\"".into();
    let dir = out_dir("reports-svg");
    let written = r.write_dir(&dir).unwrap();
    let svgs: Vec<&PathBuf> = written
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        .collect();
    let names: Vec<String> = svgs
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "latency-percentiles.svg",
        "rate-vs-size.svg",
        "bandwidth-vs-size.svg",
        "latency-vs-size.svg",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "missing {want} in {names:?}"
        );
    }
    for p in svgs {
        let text = std::fs::read_to_string(p).unwrap();
        let doc =
            roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let paths = doc.descendants().filter(|n| n.has_tag_name("path")).count();
        assert!(paths >= 1, "{} has no lines", p.display());
    }
    let pct = std::fs::read_to_string(dir.join("latency-percentiles.svg")).unwrap();
    let doc = roxmltree::Document::parse(&pct).unwrap();
    // Floor + three lat points overlaid, and the nines axis labelled.
    assert_eq!(
        doc.descendants().filter(|n| n.has_tag_name("path")).count(),
        4
    );
    assert!(pct.contains("99.9%"));
    assert!(pct.contains("lat &lt;&amp;&gt; &quot;quoted&quot;"));
}

#[test]
fn console_table_shows_every_figure_and_ratio() {
    let r = sample_report();
    let text = spinwire_bench::report::console::render(&r, spinwire_bench::cli::Unit::Us);
    for col in [
        "min", "p50", "p90", "p99", "p99.9", "p99.99", "max", "mean", "stdev",
    ] {
        assert!(text.contains(col), "{col} missing:\n{text}");
    }
    for s in [
        "RTT/2",
        "x floor",
        "msgs/s",
        "MB/s",
        "Gb/s",
        "512B",
        "floor",
        "floor, 2 lines",
        "floor, rings",
        "floor, paired",
        "floor, relay",
        "x 2line",
        "x relay",
        "; two lines (one per direction) RTT p50",
    ] {
        assert!(text.contains(s), "{s} missing:\n{text}");
    }
}

#[test]
fn started_time_is_sane() {
    let r = sample_report();
    assert!(r.started <= SystemTime::now());
}

/// The memcpy floor: its per-size figures in `summary.json`, each rate point's bandwidth
/// against it (`bytes_per_sec_x_memcpy`), the CSV columns, the console, and its line in
/// `bandwidth-vs-size.svg` (log x) next to the measured bandwidth.
#[test]
fn memcpy_floor_and_bandwidth_against_it() {
    use spinwire_bench::floor::MemcpyFloor;
    use spinwire_bench::report::MEMCPY_SERIES;
    let mut r = Report::new(vec!["bench".into(), "sweep".into()]);
    r.floor = sample_report().floor;
    let sizes = [4096u64, 1 << 20, 16 << 20];
    for size in sizes {
        // 8 GB/s: elapsed = bytes / 8.
        r.memcpy.push(MemcpyFloor {
            size_bytes: size,
            copies: 64,
            elapsed_ns: 64 * size / 8,
            core: 0,
        });
    }
    for size in sizes {
        let rs = RateSummary {
            msgs: 100,
            bytes: 100 * size,
            // 4 GB/s: half the floor.
            elapsed_ns: 100 * size / 4,
        };
        let mut p = point("rate", size);
        p.msgs_per_sec = Some(rs.msgs_per_sec());
        p.mb_per_sec = Some(rs.mb_per_sec());
        p.gbit_per_sec = Some(rs.gbit_per_sec());
        p.bytes_per_sec = Some(rs.bytes_per_sec());
        r.push(Measured {
            point: p,
            rtt: None,
            intervals: vec![],
        });
    }
    let s = r.summary();
    let floor = s.floor.as_ref().unwrap();
    assert_eq!(floor.memcpy.len(), 3);
    assert!((floor.memcpy[1].bytes_per_sec - 8e9).abs() < 1e-3);
    assert!((floor.memcpy[1].mb_per_sec - 8e3).abs() < 1e-6);
    for p in &s.points {
        assert!((p.bytes_per_sec.unwrap() - 4e9).abs() < 1e-3, "{p:?}");
        assert!((p.floor_memcpy_bytes_per_sec.unwrap() - 8e9).abs() < 1e-3);
        assert!((p.bytes_per_sec_x_memcpy.unwrap() - 0.5).abs() < 1e-9);
    }
    // JSON round trip keeps the new fields; a summary without them still parses.
    let json = serde_json::to_string(&s).unwrap();
    let back: Summary = serde_json::from_str(&json).unwrap();
    assert_eq!(back.floor.as_ref().unwrap().memcpy, floor.memcpy);
    assert_eq!(
        back.points[2].bytes_per_sec_x_memcpy,
        s.points[2].bytes_per_sec_x_memcpy
    );
    assert_eq!(back.points[2].knobs, s.points[2].knobs);
    let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
    old["floor"].as_object_mut().unwrap().remove("memcpy");
    old["points"][0]
        .as_object_mut()
        .unwrap()
        .remove("bytes_per_sec_x_memcpy");
    let old: Summary = serde_json::from_value(old).unwrap();
    assert!(old.floor.unwrap().memcpy.is_empty());
    let csv = spinwire_bench::report::csv(&s.points);
    let mut rows = csv.lines();
    let header: Vec<&str> = rows.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|c| *c == name).unwrap();
    let row: Vec<&str> = rows.next().unwrap().split(',').collect();
    assert_eq!(row.len(), CSV_COLUMNS.len());
    assert_eq!(row[col("bytes_per_sec_x_memcpy")], "0.5");
    assert_eq!(row[col("max_message_size")], (16 << 20).to_string());
    assert_eq!(row[col("large_threshold")], "4096");
    let text = spinwire_bench::report::console::render(&r, spinwire_bench::cli::Unit::Us);
    for want in [
        "memcpy floor (core 0): 1048576B",
        "x memcpy",
        "0.500x",
        "thresholds: inline <= 64 B | eager <= 4096 B (buffer size) | large slot > 4096 B",
        "max message 16777216 B",
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
    let plots = r.plots();
    let (_, bw) = plots
        .iter()
        .find(|(n, _)| n == "bandwidth-vs-size.svg")
        .expect("the bandwidth plot");
    assert_eq!(bw.x_axis, spinwire_bench::report::svg::Axis::Log2);
    let floor_line = bw
        .series
        .iter()
        .find(|s| s.name == MEMCPY_SERIES)
        .expect("the memcpy floor line");
    assert_eq!(floor_line.points.len(), 3);
    assert!((floor_line.points[2].1 - 8e3).abs() < 1e-6);
    let svg = bw.render();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    assert_eq!(
        doc.descendants().filter(|n| n.has_tag_name("path")).count(),
        2
    );
    assert!(svg.contains(MEMCPY_SERIES));
    assert!(svg.contains(">16M<"), "log x ticks up to 16 MiB: {svg}");
}
