//! `bench compare` on two known summaries: the ratios, the flags and the exit code.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};
use spinwire_bench::report::compare::compare;

fn summaries() -> (Value, Value) {
    let lat = |p50: f64, p99: f64| {
        json!({"min": 1.0, "p50": p50, "p90": p50, "p99": p99,
        "p99_9": p99, "p99_99": p99, "max": p99, "mean": p50, "stdev": 0.0})
    };
    let a = json!({"schema_version": 1, "points": [
        {"label": "lat-shm-rtc-64B", "test": "lat", "rtt_ns": lat(1000.0, 2000.0)},
        {"label": "rate-shm-rtc-64B", "test": "rate", "msgs_per_sec": 10e6},
        {"label": "load-shm-rtc-64B-1000000mps", "test": "load",
         "latency_ns": lat(500.0, 1000.0), "achieved_rate": 1e6},
        {"label": "only-in-a", "test": "rate", "msgs_per_sec": 1.0},
    ]});
    let b = json!({"schema_version": 1, "points": [
        // p50 +2 % (within 5 %), p99 and p99.9 +50 %.
        {"label": "lat-shm-rtc-64B", "test": "lat", "rtt_ns": lat(1020.0, 3000.0)},
        // Rate -20 %.
        {"label": "rate-shm-rtc-64B", "test": "rate", "msgs_per_sec": 8e6},
        // Better latency, same rate.
        {"label": "load-shm-rtc-64B-1000000mps", "test": "load",
         "latency_ns": lat(250.0, 1000.0), "achieved_rate": 1e6},
        {"label": "only-in-b", "test": "rate", "msgs_per_sec": 1.0},
    ]});
    (a, b)
}

#[test]
fn ratios_flags_and_regressions() {
    let (a, b) = summaries();
    let c = compare(&a, &b, 0.05, Some(0.10));
    let row = |label: &str, fig: &str| {
        c.rows
            .iter()
            .find(|r| r.label.starts_with(label) && r.figure == fig)
            .unwrap_or_else(|| panic!("no {label} {fig} in {:?}", c.rows))
            .clone()
    };
    let r = row("lat-", "rtt p50");
    assert!(
        (r.ratio - 1.02).abs() < 1e-9 && !r.flagged && !r.regressed,
        "{r:?}"
    );
    let r = row("lat-", "rtt p99");
    assert!(
        (r.ratio - 1.5).abs() < 1e-9 && r.flagged && r.regressed,
        "{r:?}"
    );
    let r = row("rate-", "msgs/s");
    assert!(
        (r.ratio - 0.8).abs() < 1e-9 && r.flagged && r.regressed,
        "{r:?}"
    );
    // Lower latency is flagged (a change) but is no regression.
    let r = row("load-", "latency p50");
    assert!(
        (r.ratio - 0.5).abs() < 1e-9 && r.flagged && !r.regressed,
        "{r:?}"
    );
    let r = row("load-", "achieved/s");
    assert!((r.ratio - 1.0).abs() < 1e-9 && !r.flagged, "{r:?}");
    let r = row("lat-", "rtt p99.9");
    assert!((r.ratio - 1.5).abs() < 1e-9 && r.regressed, "{r:?}");
    // rtt p99, rtt p99.9, msgs/s.
    assert_eq!(c.regressions(), 3);
    assert_eq!(c.only_a, ["only-in-a"]);
    assert_eq!(c.only_b, ["only-in-b"]);
    // Without --fail-above nothing regresses.
    assert_eq!(compare(&a, &b, 0.05, None).regressions(), 0);
}

fn write(name: &str, v: &Value) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("compare");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p
}

#[test]
fn exit_code_follows_fail_above() {
    let (a, b) = summaries();
    let (pa, pb) = (write("a.json", &a), write("b.json", &b));
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_bench"))
            .arg("compare")
            .args([&pa, &pb])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("1.500x !"), "{stdout}");
    assert!(stdout.contains("0.800x !"), "{stdout}");
    assert!(
        stdout.contains("only in A") && stdout.contains("only in B"),
        "{stdout}"
    );
    let out = run(&["--fail-above", "10%"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("3 figure(s) regressed by more than 10.0 %"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("REGRESSED"));
    // A loose limit passes.
    assert_eq!(run(&["--fail-above", "60%"]).status.code(), Some(0));
    // Not a summary: a clear error.
    let bad = write("bad.json", &json!({"nope": 1}));
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["compare".as_ref(), bad.as_os_str(), pb.as_os_str()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a bench summary.json"));
}
