//! `bench cost`: runs the built binary (bounded), checks the console table and `summary.json`
//! (schema, one point per size, every figure positive), and that bad flags are refused.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use spinwire_testkit::process::{wait_timeout, KillOnDrop};
use spinwire_testkit::serial;

fn run(args: &[&str]) -> (bool, String, String) {
    let mut g = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn bench"),
    );
    // Output is small (a few lines), so the pipes cannot fill while we wait.
    let status = wait_timeout(&mut g, Duration::from_secs(120)).expect("bench cost finished");
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    if let Some(mut s) = g.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = g.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    (status.success(), out, err)
}

#[test]
fn cost_runs_and_writes_json() {
    let _g = serial();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cost");
    let _ = std::fs::remove_dir_all(&dir);
    let (ok, out, err) = run(&[
        "cost",
        "--sizes",
        "8,200",
        "--batch",
        "8",
        "--iters",
        "2000",
        "--warmup",
        "100",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "bench cost failed\nstdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("poll ns/msg"), "{out}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(json["schema"], "spinwire-bench-cost/1");
    assert_eq!(json["test"], "cost");
    let points = json["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    for (p, size) in points.iter().zip([8, 200]) {
        assert_eq!(p["size_bytes"], size);
        assert_eq!(p["batch"], 8);
        assert!(p["iters"].as_u64().unwrap() >= 2000);
        for k in ["stream_try_recv_ns", "stream_poll_ns", "rtt_ns"] {
            let v = p[k].as_f64().unwrap_or(0.0);
            assert!(v > 0.0 && v.is_finite(), "{k} = {v}");
        }
    }
}

/// The poller path's cost, in process (`mem`) and over loopback TCP (`tcp`): the same report
/// with the fabric named, every figure measured.
#[test]
fn cost_measures_the_poller_path_over_mem_and_tcp() {
    let _g = serial();
    for fabric in ["mem", "tcp"] {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cost-{fabric}"));
        let _ = std::fs::remove_dir_all(&dir);
        let (ok, out, err) = run(&[
            "cost",
            "--fabric",
            fabric,
            "--sizes",
            "8",
            "--iters",
            "500",
            "--warmup",
            "50",
            "--out",
            dir.to_str().unwrap(),
        ]);
        assert!(
            ok,
            "bench cost --fabric {fabric} failed\nstdout:\n{out}\nstderr:\n{err}"
        );
        assert!(out.contains(&format!("{fabric} connection")), "{out}");
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        assert_eq!(json["fabric"], fabric);
        let p = &json["points"][0];
        for k in ["stream_try_recv_ns", "stream_poll_ns", "rtt_ns"] {
            let v = p[k].as_f64().unwrap_or(0.0);
            assert!(v > 0.0 && v.is_finite(), "{fabric} {k} = {v}");
        }
    }
}

#[test]
fn cost_refuses_bad_flags() {
    for args in [
        &["cost", "--batch", "0"][..],
        &["cost", "--batch", "129"],
        &["cost", "--iters", "0"],
        &["cost", "--sizes", "0"],
        &["cost", "--core", "100000"],
        &["cost", "--fabric", "rdma"],
    ] {
        let (ok, out, err) = run(args);
        assert!(!ok, "{args:?} accepted\n{out}");
        assert!(err.contains("bench: error"), "{args:?}: {err}");
    }
}
