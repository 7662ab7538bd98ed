//! End-to-end runs of the built `bench` binary: the floor, loopback sweeps on shm, dedicated
//! mode, a server and a client as two processes, an unreachable server, and Ctrl-C mid-sweep.
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
        assert_eq!(p["mode"], "inline");
        assert_eq!(p["role"], "loopback");
        assert_eq!(p["idle"], "backoff");
        assert_eq!(p["size_bytes"], size);
        assert_eq!(p["buffer_size"], 4096);
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
        "lat-shm-inline-8B.hgrm",
        "lat-shm-inline-8B.hlog",
        "lat-shm-inline-1024B.hgrm",
        "floor.hgrm",
        "summary.csv",
        "latency-percentiles.svg",
        "rate-vs-size.svg",
        "bandwidth-vs-size.svg",
        "latency-vs-size.svg",
    ] {
        assert!(dir.join(f).exists(), "{f} not written");
    }
    let hgrm = std::fs::read_to_string(dir.join("lat-shm-inline-8B.hgrm")).unwrap();
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
            "16,512",
            "--iters",
            "1000",
            "--rate-iters",
            "20000",
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
    assert_eq!(points.len(), 4);
    for p in points {
        assert_eq!(p["role"], "client");
        match p["test"].as_str().unwrap() {
            "lat" => check_lat(p),
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
