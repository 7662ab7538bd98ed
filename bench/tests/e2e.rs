//! End-to-end runs of the built `bench` binary: the floor, loopback sweeps on shm, dedicated
//! mode, a server and a client as two processes, an unreachable server, Ctrl-C mid-sweep, and
//! the open-loop load test (a synthetic stall, an offered rate above capacity, a rate sweep).
//!
//! Each test spins at most two threads (plus a backed-off poller) and they run one at a time
//! (the `SERIAL` guard), so a 2-core machine is never oversubscribed by busy-spinning; every
//! child process is bounded by a timeout and killed on failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use spinwire_testkit::process::{lines, wait_for_line, wait_timeout, KillOnDrop};
use spinwire_testkit::serial;

fn out_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Starts the bench binary (killed when dropped, so a failing assertion never leaks one).
fn spawn(args: &[&str]) -> KillOnDrop {
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn bench"),
    )
}

/// Waits for the child with a bound; kills it (and fails) past `limit`.
fn wait(mut g: KillOnDrop, limit: Duration) -> Output {
    if wait_timeout(&mut g, limit).is_none() {
        let _ = g.kill();
        let out = read_rest(&mut g);
        panic!(
            "bench did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    read_rest(&mut g)
}

fn read_rest(g: &mut KillOnDrop) -> Output {
    use std::io::Read;
    let status = g.wait().expect("wait");
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    if let Some(mut s) = g.stdout.take() {
        let _ = s.read_to_end(&mut stdout);
    }
    if let Some(mut s) = g.stderr.take() {
        let _ = s.read_to_end(&mut stderr);
    }
    Output {
        status,
        stdout,
        stderr,
    }
}

fn run_ok(args: &[&str], limit: Duration) -> Output {
    let out = wait(spawn(args), limit);
    assert!(
        out.status.success(),
        "bench {args:?} failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn summary(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary.json parses")
}

fn check_lat(p: &Value) {
    assert_eq!(p["test"], "lat");
    let rtt = &p["rtt_ns"];
    for k in [
        "min", "p50", "p90", "p99", "p99_9", "p99_99", "max", "mean", "stdev",
    ] {
        assert!(rtt[k].is_number(), "rtt_ns.{k} in {p}");
    }
    let (min, p50, max) = (
        rtt["min"].as_f64().unwrap(),
        rtt["p50"].as_f64().unwrap(),
        rtt["max"].as_f64().unwrap(),
    );
    assert!(min > 0.0 && min <= p50 && p50 <= max, "{rtt}");
    assert!(p["msgs_per_sec"].is_null());
}

fn check_rate(p: &Value) {
    assert_eq!(p["test"], "rate");
    assert!(p["rtt_ns"].is_null());
    let mps = p["msgs_per_sec"].as_f64().unwrap();
    let mbs = p["mb_per_sec"].as_f64().unwrap();
    let size = p["size_bytes"].as_f64().unwrap();
    assert!(mps > 0.0);
    assert!((mbs - mps * size / 1e6).abs() <= mbs * 1e-9 + 1e-9);
}

#[test]
fn floor_measures_two_pinned_threads() {
    let _s = serial();
    let dir = out_dir("e2e-floor");
    let out = run_ok(
        &[
            "floor",
            "--iters",
            "5000",
            "--warmup",
            "100",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cache-line RTT p50"), "{stdout}");
    let s = summary(&dir);
    assert!(s["floor"]["rtt_ns"]["p50"].as_f64().unwrap() > 0.0);
    assert!(s["floor"]["msgs_per_sec"].as_f64().unwrap() > 0.0);
    assert_eq!(s["points"][0]["test"], "floor");
    assert!(dir.join("floor.hgrm").exists());
}

#[test]
fn floor_wake_measures_a_futex_round_trip_with_the_server_asleep() {
    let _s = serial();
    let dir = out_dir("e2e-floor-wake");
    let out = run_ok(
        &[
            "floor",
            "--wake",
            "--wake-rate",
            "2k",
            "--iters",
            "400",
            "--warmup",
            "20",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("wake-up reference"), "{stdout}");
    let s = summary(&dir);
    assert_eq!(s["floor"]["kind"], "futex-wake");
    // A kernel wake-up takes microseconds: most round trips are far above a cache line's.
    assert!(
        s["floor"]["rtt_ns"]["p50"].as_f64().unwrap() > 1000.0,
        "{}",
        s["floor"]
    );
    // Paced: the achieved rate is near the asked 2 k/s, never a spinning ping-pong's millions.
    let rate = s["floor"]["msgs_per_sec"].as_f64().unwrap();
    assert!(rate > 100.0 && rate < 2500.0, "{rate}");
    assert_eq!(s["points"][0]["test"], "floor");
}

#[test]
fn loopback_sweep_on_shm_writes_every_report() {
    let _s = serial();
    let dir = out_dir("e2e-sweep");
    let out = run_ok(
        &[
            "sweep",
            "--sizes",
            "8,1k",
            "--iters",
            "2000",
            "--rate-iters",
            "5000",
            "--warmup",
            "100",
            "--idle",
            "backoff",
            "--interval",
            "20ms",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for s in ["Latency (us)", "RTT/2", "x floor", "msgs/s", "8B", "1024B"] {
        assert!(stdout.contains(s), "`{s}` missing from:\n{stdout}");
    }
    let s = summary(&dir);
    assert_eq!(s["schema_version"], 1);
    assert!(s["machine"]["cpu_model"].is_string());
    assert!(s["machine"]["cores"].as_u64().unwrap() >= 1);
    assert_eq!(s["interrupted"], false);
    assert!(s["floor"].is_object());
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 4, "{points:?}");
    for (p, (test, size)) in
        points
            .iter()
            .zip([("lat", 8), ("rate", 8), ("lat", 1024), ("rate", 1024)])
    {
        assert_eq!(p["fabric"], "shm");
        assert_eq!(p["mode"], "rtc");
        assert_eq!(p["role"], "loopback");
        assert_eq!(p["idle"], "backoff");
        assert_eq!(p["size_bytes"], size);
        assert_eq!(p["buffer_size"], 4096);
        // Both sides' app-thread CPU use over the point.
        assert!(p["cpu"]["client"]["user_s"].is_number(), "{p}");
        assert!(p["cpu"]["server"]["involuntary_csw"].is_u64(), "{p}");
        // Engine counters over the point: at least the measured messages went out.
        let sent = p["counters"]["sent"].as_u64().unwrap();
        assert!(sent >= p["iters"].as_u64().unwrap(), "{p}");
        if test == "lat" {
            check_lat(p);
            assert_eq!(p["iters"], 2000);
            assert!(p["rtt_x_floor"]["p50"].as_f64().unwrap() > 0.0);
        } else {
            check_rate(p);
            assert_eq!(p["iters"], 5000);
            assert!(p["msgs_per_sec_x_floor"].as_f64().unwrap() > 0.0);
        }
    }
    for f in [
        "lat-shm-rtc-8B.hgrm",
        "lat-shm-rtc-8B.hlog",
        "lat-shm-rtc-1024B.hgrm",
        "floor.hgrm",
        "summary.csv",
        "latency-percentiles.svg",
        "rate-vs-size.svg",
        "bandwidth-vs-size.svg",
        "latency-vs-size.svg",
    ] {
        assert!(dir.join(f).exists(), "{f} not written");
    }
    let hgrm = std::fs::read_to_string(dir.join("lat-shm-rtc-8B.hgrm")).unwrap();
    let parsed = spinwire_bench::report::hgrm::parse(&hgrm).unwrap();
    assert_eq!(parsed.total_count, 2000);
}

#[test]
fn dedicated_mode_with_paced_load() {
    let _s = serial();
    let dir = out_dir("e2e-dedicated");
    let cores = spinwire_bench::machine::available_cores();
    let poller = cores[cores.len() - 1].to_string();
    run_ok(
        &[
            "lat",
            "--mode",
            "dedicated",
            "--poller-cores",
            &poller,
            "--idle",
            "backoff",
            "--iters",
            "500",
            "--warmup",
            "50",
            "--rate",
            "2000",
            "--size",
            "100",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let s = summary(&dir);
    let p = &s["points"][0];
    check_lat(p);
    assert_eq!(p["mode"], "dedicated");
    assert_eq!(p["co_corrected"], true);
    assert_eq!(p["offered_rate"], 2000);
    assert_eq!(p["poller_cores"][0].as_u64().unwrap().to_string(), poller);
}

/// `--idle block`: both sides sleep between the messages of a slow open-loop load (their
/// busy threads use a small share of their cores, where spinning would use all of it) and
/// every message is echoed.
#[test]
fn block_idle_load_sleeps_between_messages() {
    let _s = serial();
    let dir = out_dir("e2e-block");
    run_ok(
        &[
            "load",
            "--idle",
            "block",
            "--rate",
            "200",
            "--duration",
            "1s",
            "--warmup",
            "20",
            "--latency",
            "round-trip",
            "--size",
            "32",
            "--floor",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let s = summary(&dir);
    let p = &s["points"][0];
    assert_eq!(p["test"], "load");
    assert_eq!(p["idle"], "block");
    let p50 = p["latency_ns"]["p50"].as_f64().unwrap();
    assert!(p50 > 0.0, "{p}");
    // `--floor` under `--idle block`: the futex wake-up reference at the same rate, and the
    // load's round trip as a ratio to it.
    // The client's engine counted its connection's sleeps (one per silence at least).
    assert!(
        p["counters"]["sleeps"].as_u64().unwrap() > 0,
        "{}",
        p["counters"]
    );
    assert_eq!(s["floor"]["kind"], "futex-wake", "{}", s["floor"]);
    let reference = s["floor"]["rtt_ns"]["p50"].as_f64().unwrap();
    assert!(reference > 0.0);
    let x = p["latency_x_floor"]["p50"].as_f64().unwrap();
    assert!(
        (x - p50 / reference).abs() <= 1e-6 * x.max(1.0),
        "{x} vs {p50}/{reference}"
    );
    // Each side's share of its core over the measured window: a spinning side is near 1.
    for (side, share) in p["quiet"]["spinners"]
        .as_array()
        .expect("quiet.spinners")
        .iter()
        .map(|v| (v[0].as_str().unwrap(), v[1].as_f64().unwrap()))
    {
        assert!(
            share < 0.5,
            "{side} used {:.0} % of its core at 200 msgs/s with --idle block",
            share * 100.0
        );
    }
}

#[test]
fn server_and_client_as_two_processes() {
    let _s = serial();
    let ep = format!("shm://bench-e2e-{}", std::process::id());
    let cores = spinwire_bench::machine::available_cores();
    let (c0, c1) = (cores[0].to_string(), cores[1 % cores.len()].to_string());
    let mut server = spawn(&[
        "lat",
        "--server",
        &ep,
        "--once",
        "--idle",
        "backoff",
        "--app-cores",
        &c1,
    ]);
    // Wait (bounded) for the server to say it listens.
    let line = lines(server.stdout.take().unwrap())
        .recv_timeout(Duration::from_secs(30))
        .expect("server never said it listens");
    assert!(line.contains("listening on"), "{line}");

    let dir = out_dir("e2e-client");
    run_ok(
        &[
            "sweep",
            "--client",
            &ep,
            "--sizes",
            "32,512",
            "--iters",
            "1000",
            "--rate-iters",
            "20000",
            "--rates",
            "5k",
            "--warmup",
            "50",
            "--idle",
            "backoff",
            "--app-cores",
            &c0,
            "--no-floor",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    let s = summary(&dir);
    let points = s["points"].as_array().unwrap();
    // lat, rate and a one-way load point (the server records; one host, one clock) per size.
    assert_eq!(points.len(), 6);
    for p in points {
        assert_eq!(p["role"], "client");
        assert!(p["cpu"]["server"]["user_s"].is_number(), "{p}");
        match p["test"].as_str().unwrap() {
            "lat" => check_lat(p),
            "load" => {
                assert_eq!(p["latency_kind"], "one-way");
                assert_eq!(p["iters"], 1000);
                assert!(p["latency_ns"]["p50"].as_f64().unwrap() > 0.0, "{p}");
            }
            _ => check_rate(p),
        }
    }
    // --once: the server leaves after its client says BYE.
    let out = wait(server, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "server: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn unreachable_server_is_a_clear_error() {
    let _s = serial();
    let ep = format!("shm://bench-nobody-{}", std::process::id());
    let out = wait(
        spawn(&[
            "lat",
            "--client",
            &ep,
            "--connect-timeout",
            "1s",
            "--idle",
            "backoff",
        ]),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("connecting to {ep}")), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn ctrl_c_mid_sweep_writes_what_was_measured() {
    let _s = serial();
    let dir = out_dir("e2e-ctrlc");
    let mut child = spawn(&[
        "sweep",
        "--tests",
        "lat",
        "--max-size",
        "4k",
        "--duration",
        "300ms",
        "--warmup",
        "10",
        "--idle",
        "backoff",
        "--no-floor",
        "--out",
        dir.to_str().unwrap(),
    ]);
    // Progress lines go to stderr when it is not a terminal; interrupt after the second point.
    let progress = lines(child.stderr.take().unwrap());
    wait_for_line(
        &progress,
        "[2/13]",
        Duration::from_secs(60),
        "no progress from the sweep",
    );
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let out = wait(child, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(130));
    let s = summary(&dir);
    assert_eq!(s["interrupted"], true);
    let n = s["points"].as_array().unwrap().len();
    assert!((2..13).contains(&n), "{n} points");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("interrupted"), "{stdout}");
}

#[test]
fn sweep_crossed_with_a_knob() {
    let _s = serial();
    let dir = out_dir("e2e-cross");
    run_ok(
        &[
            "sweep",
            "--sizes",
            "8,64",
            "--cross",
            "depth",
            "--values",
            "4,64",
            "--iters",
            "500",
            "--rate-iters",
            "5000",
            "--warmup",
            "20",
            "--idle",
            "backoff",
            "--no-floor",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    let s = summary(&dir);
    let points = s["points"].as_array().unwrap();
    assert_eq!(points.len(), 8);
    for p in points {
        assert_eq!(p["cross"], "depth");
        assert_eq!(p["depth"], p["cross_value"]);
        assert!(p["label"]
            .as_str()
            .unwrap()
            .ends_with(&format!("-depth{}", p["depth"])));
    }
    let depths: Vec<u64> = points
        .iter()
        .map(|p| p["depth"].as_u64().unwrap())
        .collect();
    assert_eq!(depths, [4, 4, 4, 4, 64, 64, 64, 64]);
    // One series per crossed value in the size plots.
    let svg = std::fs::read_to_string(dir.join("rate-vs-size.svg")).unwrap();
    assert!(svg.contains("depth=4") && svg.contains("depth=64"));
}

#[test]
fn lat_with_floor_prints_ratios() {
    let _s = serial();
    let out = run_ok(
        &[
            "lat", "--floor", "--iters", "2000", "--warmup", "100", "--idle", "backoff", "--unit",
            "ns",
        ],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Latency (ns)"), "{stdout}");
    assert!(stdout.contains("x floor"), "{stdout}");
    assert!(stdout.contains("cache-line RTT p50"), "{stdout}");
}

#[test]
fn rate_states_the_floor_and_the_process_switches_with_an_app_batch() {
    let _s = serial();
    let dir = out_dir("rate-app-batch");
    let out = run_ok(
        &[
            "rate",
            "--app-batch",
            "16",
            "--iters",
            "20000",
            "--warmup",
            "100",
            "--idle",
            "backoff",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The floor is measured by default and stated beside the figure.
    assert!(stdout.contains("floor msgs/s"), "{stdout}");
    assert!(stdout.contains("ivcsw/s"), "{stdout}");
    let s = summary(&dir);
    let p = &s["points"][0];
    check_rate(p);
    assert_eq!(p["app_batch"], 16);
    // Every message was counted through the batch receive.
    assert_eq!(p["iters"], 20000);
    let floor = p["floor_msgs_per_sec"].as_f64().unwrap();
    assert_eq!(Some(floor), s["floor"]["msgs_per_sec"].as_f64());
    let ratio = p["msgs_per_sec_x_floor"].as_f64().unwrap();
    assert!((ratio - p["msgs_per_sec"].as_f64().unwrap() / floor).abs() < 1e-9);
    let process = &p["process"];
    assert!(process["involuntary_csw"].is_u64(), "{p}");
    assert!(process["involuntary_csw_per_sec"].is_number(), "{p}");
    let csv = std::fs::read_to_string(dir.join("summary.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    for col in [
        "floor_msgs_per_sec",
        "app_batch",
        "process_involuntary_csw_per_sec",
    ] {
        assert!(header.split(',').any(|c| c == col), "{col} in {header}");
    }
    // And without the floor, when asked.
    let out = run_ok(
        &[
            "rate",
            "--no-floor",
            "--iters",
            "2000",
            "--warmup",
            "100",
            "--idle",
            "backoff",
        ],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("cache-line RTT p50"), "{stdout}");
}

/// Every latency recorded in a point's `.hlog`, merged.
fn hlog_total(path: &Path) -> hdrhistogram::Histogram<u64> {
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    use hdrhistogram::serialization::Deserializer;
    let text = std::fs::read(path).expect("hlog");
    let mut de = Deserializer::new();
    let mut total = spinwire_bench::stats::new_latency_histogram();
    for e in IntervalLogIterator::new(&text) {
        if let Ok(LogEntry::Interval(i)) = e {
            let bytes = base64_decode(i.encoded_histogram());
            let h: hdrhistogram::Histogram<u64> = de.deserialize(&mut bytes.as_slice()).unwrap();
            total.add(&h).unwrap();
        }
    }
    total
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = s
        .bytes()
        .filter(|&c| c != b'=' && !c.is_ascii_whitespace())
        .collect();
    let mut out = Vec::new();
    for chunk in clean.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= u32::from(val(c)) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

/// A 50 ms stall of the receiver, once: the closed loop (lat) records it as one slow round
/// trip, the open loop (load) as the tail of every message meant to be sent during it.
#[test]
fn open_loop_shows_a_stall_that_closed_loop_records_once() {
    let _s = serial();
    let stall = ["--stall-once-ms", "50", "--stall-after", "1000"];
    let closed = out_dir("e2e-stall-closed");
    let mut args = vec![
        "lat",
        "--iters",
        "3000",
        "--warmup",
        "200",
        "--idle",
        "backoff",
        "--size",
        "64",
        "--out",
        closed.to_str().unwrap(),
    ];
    args.extend(stall);
    run_ok(&args, Duration::from_secs(60));
    let open = out_dir("e2e-stall-open");
    // 20k msgs/s: about 1000 messages are meant to go during the stall; those in its first
    // 10 ms wait 40..50 ms.
    let mut args = vec![
        "load",
        "--rate",
        "20k",
        "--iters",
        "3000",
        "--warmup",
        "200",
        "--idle",
        "backoff",
        "--out",
        open.to_str().unwrap(),
    ];
    args.extend(stall);
    run_ok(&args, Duration::from_secs(60));

    const FORTY_MS: u64 = 40_000_000;
    let closed_h = hlog_total(&closed.join("lat-shm-rtc-64B.hlog"));
    let open_h = hlog_total(&open.join("load-shm-rtc-64B-20000mps.hlog"));
    assert_eq!(closed_h.len(), 3000);
    assert_eq!(open_h.len(), 3000);
    let slow = |h: &hdrhistogram::Histogram<u64>| h.count_between(FORTY_MS, u64::MAX >> 2);
    assert!(slow(&closed_h) >= 1, "the closed loop saw the stall once");
    assert!(
        slow(&closed_h) <= 2,
        "closed loop: {} slow",
        slow(&closed_h)
    );
    assert!(
        slow(&open_h) >= 100,
        "open loop: only {} slow",
        slow(&open_h)
    );
    let s = summary(&open);
    let p = &s["points"][0];
    assert_eq!(p["test"], "load");
    assert_eq!(p["latency_kind"], "one-way");
    assert!(
        p["latency_ns"]["p99"].as_f64().unwrap() >= FORTY_MS as f64,
        "{p}"
    );
    for side in ["client", "server"] {
        let c = &p["cpu"][side];
        assert!(
            c["user_s"].as_f64().unwrap() + c["system_s"].as_f64().unwrap() > 0.0,
            "{p}"
        );
        assert!(
            c["voluntary_csw"].is_u64() && c["involuntary_csw"].is_u64(),
            "{p}"
        );
    }
    // The server slept 50 ms: at least one voluntary switch on its side.
    assert!(p["cpu"]["server"]["voluntary_csw"].as_u64().unwrap() >= 1);
}

/// An offered rate no 2-core machine reaches: the achieved rate falls short, the run warns
/// and says so in the JSON (round-trip latency here, the other recording path).
#[test]
fn offered_rate_above_capacity_warns() {
    let _s = serial();
    let dir = out_dir("e2e-overload");
    let out = run_ok(
        &[
            "load",
            "--rate",
            "1g",
            "--burst",
            "4",
            "--latency",
            "round-trip",
            "--iters",
            "20000",
            "--warmup",
            "100",
            "--idle",
            "backoff",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stderr.contains("WARNING") && stderr.contains("below the offered"),
        "{stderr}"
    );
    assert!(stdout.contains("WARNING"), "{stdout}");
    let s = summary(&dir);
    let p = &s["points"][0];
    assert_eq!(p["latency_kind"], "round-trip");
    assert_eq!(p["burst"], 4);
    assert_eq!(p["offered_rate"], 1_000_000_000u64);
    assert_eq!(p["rate_warning"], true);
    let achieved = p["achieved_rate"].as_f64().unwrap();
    assert!(achieved > 0.0 && achieved < 0.99e9, "{p}");
    assert!(p["rate_shortfall"].as_f64().unwrap() > 0.01, "{p}");
    assert_eq!(p["iters"], 20000);
}

/// `sweep --rates`: one load point per offered rate, and the latency-vs-load plot.
#[test]
fn sweep_over_offered_rates_plots_latency_vs_load() {
    let _s = serial();
    let dir = out_dir("e2e-rates");
    let out = run_ok(
        &[
            "sweep",
            "--sizes",
            "64",
            "--tests",
            "load",
            "--rates",
            "2k,10k",
            "--iters",
            "1000",
            "--warmup",
            "50",
            "--idle",
            "backoff",
            "--no-floor",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Open-loop load") && stdout.contains("knee 64B"),
        "{stdout}"
    );
    let s = summary(&dir);
    let rates: Vec<u64> = s["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["offered_rate"].as_u64().unwrap())
        .collect();
    assert_eq!(rates, [2000, 10000]);
    let svg = std::fs::read_to_string(dir.join("latency-vs-load.svg")).unwrap();
    assert!(
        svg.contains("64B p99.9") && svg.contains("offered rate"),
        "{svg}"
    );
}

#[test]
fn verbose_logs_control_plane_events() {
    let _s = serial();
    let out = run_ok(
        &[
            "-v", "lat", "--iters", "200", "--warmup", "10", "--idle", "backoff",
        ],
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("listening"), "{stderr}");
    assert!(stderr.contains("connection established"), "{stderr}");
    assert!(stderr.contains("shm://"), "{stderr}");
}

/// A 1 MiB rate point, above the 4 KiB buffer size, goes through the default fabric's (shm)
/// large slots and reports its bandwidth beside msgs/s and against the memcpy floor; a 1 MiB
/// lat point echoes with every byte verified.
#[test]
fn rate_above_the_buffer_size_reports_bandwidth() {
    let _s = serial();
    let dir = out_dir("large-rate");
    let args = [
        "rate",
        "--size",
        "1m",
        "--max-size",
        "1m",
        "--iters",
        "64",
        "--warmup",
        "4",
        "--idle",
        "backoff",
        "--out",
        dir.to_str().unwrap(),
    ];
    let out = run_ok(&args, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("x memcpy"), "{stdout}");
    assert!(stdout.contains("large slot > 4096 B"), "{stdout}");
    let s = summary(&dir);
    let p = &s["points"][0];
    check_rate(p);
    assert_eq!(p["size_bytes"], 1 << 20);
    assert_eq!(p["iters"], 64);
    // The connection's own limit: the large slots are there.
    assert_eq!(p["conn_max_message_size"], 1 << 20, "{p}");
    assert_eq!(p["max_message_size"], 1 << 20, "{p}");
    assert_eq!(p["buffer_size"], 4096, "{p}");
    assert_eq!(p["large_threshold"], 4096, "{p}");
    let bps = p["bytes_per_sec"].as_f64().unwrap();
    let mbs = p["mb_per_sec"].as_f64().unwrap();
    assert!(bps > 0.0 && (bps / 1e6 - mbs).abs() <= mbs * 1e-9, "{p}");
    let floor = p["floor_memcpy_bytes_per_sec"].as_f64().unwrap();
    let memcpy = &s["floor"]["memcpy"][0];
    assert_eq!(memcpy["size_bytes"], 1 << 20);
    assert_eq!(Some(floor), memcpy["bytes_per_sec"].as_f64());
    let x = p["bytes_per_sec_x_memcpy"].as_f64().unwrap();
    assert!((x - bps / floor).abs() < 1e-9, "{p}");
    let csv = std::fs::read_to_string(dir.join("summary.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    for col in [
        "bytes_per_sec",
        "floor_memcpy_bytes_per_sec",
        "bytes_per_sec_x_memcpy",
        "max_message_size",
        "large_threshold",
    ] {
        assert!(header.split(',').any(|c| c == col), "{col} in {header}");
    }
    // Round trips of 1 MiB, every echoed byte checked.
    let dir = out_dir("large-lat");
    run_ok(
        &[
            "lat",
            "--size",
            "1m",
            "--max-size",
            "1m",
            "--verify",
            "--iters",
            "32",
            "--warmup",
            "2",
            "--idle",
            "backoff",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    let s = summary(&dir);
    check_lat(&s["points"][0]);
    assert_eq!(s["points"][0]["iters"], 32);
}

#[test]
fn floor_reports_the_memcpy_bandwidth_of_the_size() {
    let _s = serial();
    let dir = out_dir("floor-memcpy");
    let out = run_ok(
        &[
            "floor",
            "--size",
            "64k",
            "--iters",
            "2000",
            "--warmup",
            "100",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("memcpy floor (core"), "{stdout}");
    let s = summary(&dir);
    let m = &s["floor"]["memcpy"][0];
    assert_eq!(m["size_bytes"], 65536, "{m}");
    let bps = m["bytes_per_sec"].as_f64().unwrap();
    assert!(bps > 0.0);
    assert!((m["mb_per_sec"].as_f64().unwrap() - bps / 1e6).abs() < 1e-6);
    assert!(m["copies"].as_u64().unwrap() >= 16);
    // Also a point of its own (summary.csv's rows).
    let p = s["points"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["label"] == "floor-memcpy-65536B")
        .expect("the memcpy floor point");
    assert_eq!(p["test"], "floor");
    assert_eq!(p["fabric"], "memcpy");
    assert_eq!(p["bytes_per_sec"].as_f64(), Some(bps));
}

/// A sweep across the buffer size (64 KiB goes through a large slot) plots its bandwidth with
/// the memcpy floor of each size drawn in.
#[test]
fn sweep_plots_bandwidth_against_the_memcpy_floor() {
    let _s = serial();
    let dir = out_dir("sweep-bandwidth");
    run_ok(
        &[
            "sweep",
            "--sizes",
            "1k,4k,64k",
            "--max-size",
            "64k",
            "--tests",
            "rate",
            "--rate-iters",
            "5000",
            "--iters",
            "2000",
            "--warmup",
            "100",
            "--idle",
            "backoff",
            "--quiet",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    let s = summary(&dir);
    let sizes: Vec<u64> = s["floor"]["memcpy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["size_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, vec![1024, 4096, 65536]);
    for p in s["points"].as_array().unwrap() {
        check_rate(p);
        assert!(p["bytes_per_sec_x_memcpy"].as_f64().unwrap() > 0.0, "{p}");
    }
    let svg = std::fs::read_to_string(dir.join("bandwidth-vs-size.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    assert!(
        doc.descendants()
            .any(|n| n.text() == Some("memcpy floor (1 core)")),
        "no floor legend in {svg}"
    );
    // One line for the rate points, one for the floor.
    let paths = doc.descendants().filter(|n| n.has_tag_name("path")).count();
    assert_eq!(paths, 2, "{svg}");
}

#[test]
fn mem_with_one_app_thread_and_one_dedicated_poller() {
    let _s = serial();
    let dir = out_dir("e2e-mem-one-thread");
    let cores = spinwire_bench::machine::available_cores();
    let poller = cores[cores.len() - 1].to_string();
    run_ok(
        &[
            "sweep",
            "--tests",
            "lat,rate",
            "--sizes",
            "8,5000",
            "--fabric",
            "mem",
            "--mode",
            "dedicated",
            "--one-thread",
            "--app-cores",
            &cores[0].to_string(),
            "--poller-cores",
            &poller,
            "--idle",
            "backoff",
            "--iters",
            "500",
            "--rate-iters",
            "2000",
            "--warmup",
            "50",
            "--no-floor",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let s = summary(&dir);
    let points = s["points"].as_array().expect("points");
    assert_eq!(points.len(), 4, "{points:?}");
    for p in points {
        assert_eq!(p["fabric"], "mem");
        assert_eq!(p["mode"], "dedicated");
        if p["test"] == "lat" {
            check_lat(p);
        } else {
            check_rate(p);
        }
    }
}

#[test]
fn one_thread_floor_runs_between_the_app_and_the_poller_core() {
    let _s = serial();
    let cores = spinwire_bench::machine::available_cores();
    // With one core the app and the poller share it, and the floor is not measured (said so).
    let (app, poller) = (cores[0], cores[cores.len() - 1]);
    let dir = out_dir("e2e-mem-one-thread-floor");
    let out = run_ok(
        &[
            "lat",
            "--fabric",
            "mem",
            "--mode",
            "dedicated",
            "--one-thread",
            "--app-cores",
            &app.to_string(),
            "--poller-cores",
            &poller.to_string(),
            "--idle",
            "backoff",
            "--size",
            "8",
            "--iters",
            "500",
            "--warmup",
            "50",
            "--floor",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let s = summary(&dir);
    let p = &s["points"][0];
    assert_eq!(p["test"], "lat");
    if app == poller {
        assert!(text.contains("floor not measured"), "{text}");
        return;
    }
    assert!(
        text.contains(&format!("floor (cores {app} <-> {poller})")),
        "{text}"
    );
    assert!(
        p["rtt_x_floor"]["p50"].as_f64().expect("x floor") > 0.0,
        "{p}"
    );
}

/// `--hugepages`: `off` reports every region on 4 KiB pages (console line and summary);
/// `require` with no free 2 MiB page fails with the error that says how to reserve them, and
/// with free pages reports the segment on hugepages.
#[test]
fn hugepages_flag_reports_what_the_engines_got() {
    let _s = serial();
    let dir = out_dir("hugepages-off");
    let rate = |policy: &'static str, dir: &Path| {
        [
            "rate",
            "--size",
            "8",
            "--iters",
            "2000",
            "--warmup",
            "100",
            "--no-floor",
            "--idle",
            "backoff",
            "--hugepages",
            policy,
            "--out",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([dir.to_str().unwrap().to_string()])
        .collect::<Vec<_>>()
    };
    let args = rate("off", &dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_ok(&args, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("placement: hugepages off -> 0 regions on 2 MiB pages (0 B), 1 on 4 KiB"),
        "{stdout}"
    );
    let p = &summary(&dir)["points"][0];
    assert_eq!(p["hugepages"], "off", "{p}");
    // No shared receive queue asked for: the SRQ knobs are recorded as off.
    assert_eq!(p["rdma_srq"], 0, "{p}");
    assert_eq!(p["rdma_srq_credits"], 0, "{p}");
    assert_eq!(p["counters"]["huge_regions"], 0, "{p}");
    assert_eq!(p["counters"]["small_regions"], 1, "{p}");
    let free: u64 =
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
    let dir = out_dir("hugepages-require");
    let args = rate("require", &dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = wait(spawn(&args), Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if free == 0 {
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("/proc/sys/vm/nr_hugepages"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    } else if free >= 8 {
        assert!(out.status.success(), "{stderr}");
        let p = &summary(&dir)["points"][0];
        assert_eq!(p["hugepages"], "require", "{p}");
        assert_eq!(p["counters"]["huge_regions"], 1, "{p}");
        assert_eq!(p["counters"]["small_regions"], 0, "{p}");
    } else {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("placement: hugepages require -> 1 regions on 2 MiB pages")
                || stderr.contains("/proc/sys/vm/nr_hugepages"),
            "{stdout}\n{stderr}"
        );
    }
}

#[test]
fn api_poll_copy_and_claim_echo_and_stream_through_their_calls() {
    let _s = serial();
    // `poll-copy`: Aeron's ping-pong shape (`send_copy`, `poll` with the echo sent from its
    // handler); a message over the stack copy's 256 bytes takes the buffer way. `claim`:
    // `claim`/`send` and `try_recv`, the echo claimed too: on shm a message up to the inline
    // threshold (64 B here) is written in the ring record itself, a larger one in a pool
    // buffer, one above the buffer size (4 KiB) in a large slot. On the direct path (shm) and
    // the poller path (mem), each payload checked byte for byte.
    for api in ["poll-copy", "claim"] {
        for fabric in ["shm", "mem"] {
            for (test, size) in [("lat", "8"), ("lat", "1k"), ("lat", "8k"), ("rate", "64")] {
                if api == "poll-copy" && size == "8k" {
                    continue;
                }
                let dir = out_dir(&format!("api-{api}-{fabric}-{test}-{size}"));
                let mut args = vec![
                    test,
                    "--fabric",
                    fabric,
                    "--api",
                    api,
                    "--verify",
                    "--size",
                    size,
                    "--iters",
                    "3000",
                    "--warmup",
                    "100",
                    "--idle",
                    "backoff",
                    "--out",
                    dir.to_str().unwrap(),
                ];
                if test == "rate" {
                    args.push("--no-floor");
                }
                run_ok(&args, Duration::from_secs(60));
                let s = summary(&dir);
                let p = &s["points"][0];
                assert_eq!(p["api"], api, "{api} {fabric} {test} {size}: {p}");
                if test == "lat" {
                    check_lat(p);
                } else {
                    assert!(p["msgs_per_sec"].as_f64().unwrap() > 0.0, "{p}");
                }
            }
        }
    }
}
