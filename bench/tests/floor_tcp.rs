//! `bench floor --fabric tcp`: the raw TCP floor in loopback with a `--size`, and its
//! `--server` / `--client` roles as two processes on loopback (the shape
//! `scripts/tcp-netns-bench.sh` runs across two network namespaces).
//!
//! Each test spins at most two threads and they run one at a time (the `serial` guard), so a
//! 2-core machine is not oversubscribed; every child process is bounded by a timeout and killed
//! on failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use spinwire_testkit::process::{lines, wait_for_line, wait_timeout, KillOnDrop};
use spinwire_testkit::serial;

fn out_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    d
}

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

/// Waits for the child with a bound (killing it past `limit`) and collects its output.
fn wait(mut g: KillOnDrop, limit: Duration) -> Output {
    let done = wait_timeout(&mut g, limit).is_some();
    if !done {
        let _ = g.kill();
    }
    let out = read_rest(&mut g);
    assert!(
        done,
        "bench did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The exited (or killed) child's status and remaining output.
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

fn summary(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary.json parses")
}

/// The floor point: an RTT, and the stream's byte rate in chunks of `chunk` bytes.
fn check_floor(s: &Value, chunk: u64, iters: u64) {
    let p = &s["points"][0];
    assert_eq!(p["test"], "floor", "{p}");
    assert_eq!(p["fabric"], "tcp-raw", "{p}");
    assert!(p["rtt_ns"]["p50"].as_f64().unwrap() > 0.0, "{p}");
    let msgs = p["msgs_per_sec"].as_f64().unwrap();
    let mb = p["mb_per_sec"].as_f64().unwrap();
    assert!(msgs > 0.0, "{p}");
    // MB/s is msgs/s times the chunk size: the stream really used that size.
    let per_msg = mb * 1e6 / msgs;
    assert!(
        (per_msg - chunk as f64).abs() < 1.0,
        "{per_msg} B per message"
    );
    assert_eq!(p["iters"], iters);
    assert_eq!(s["floor"]["rtt_ns"]["p50"], p["rtt_ns"]["p50"]);
    // The ping-pong carries --size too, and the knobs say what ran (one ping in flight, no
    // engine buffers), not placeholders.
    assert_eq!(p["size_bytes"], chunk, "{p}");
    assert_eq!(p["buffer_size"], chunk, "{p}");
    assert_eq!(p["depth"], 1, "{p}");
    assert_eq!(p["buffers"], 0, "{p}");
}

#[test]
fn loopback_floor_streams_chunks_of_the_given_size() {
    let _s = serial();
    let dir = out_dir("floor-tcp-loopback");
    let out = wait(
        spawn(&[
            "floor",
            "--fabric",
            "tcp",
            "--iters",
            "2000",
            "--warmup",
            "100",
            "--size",
            "4k",
            "--out",
            dir.to_str().unwrap(),
        ]),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("raw tcp RTT p50"), "{stdout}");
    assert!(stdout.contains("floor (4096B)"), "{stdout}");
    let s = summary(&dir);
    check_floor(&s, 4096, 2000);
    assert_eq!(s["points"][0]["role"], "loopback");
}

#[test]
fn server_and_client_as_two_processes() {
    let _s = serial();
    // Endpoint URLs as every subcommand takes them; the scheme selects tcp (no --fabric).
    let mut server = spawn(&[
        "floor",
        "--server",
        "tcp://127.0.0.1:0",
        "--once",
        "--app-cores",
        "1",
    ]);
    let stdout = lines(server.stdout.take().unwrap());
    let line = wait_for_line(
        &stdout,
        "listening on",
        Duration::from_secs(30),
        "the floor server did not start",
    );
    // "bench floor server listening on tcp://127.0.0.1:PORT (raw tcp, core 1; ...); ..."
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("tcp://127.0.0.1:"))
        .expect("the bound address")
        .to_string();
    assert!(!addr.ends_with(":0"), "{line}");
    assert!(line.contains("core 1"), "{line}");
    let dir = out_dir("floor-tcp-client");
    let client = wait(
        spawn(&[
            "floor",
            "--client",
            &addr,
            "--app-cores",
            "0",
            "--iters",
            "2000",
            "--warmup",
            "100",
            "--out",
            dir.to_str().unwrap(),
        ]),
        Duration::from_secs(60),
    );
    assert!(
        client.status.success(),
        "client failed\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    let s = summary(&dir);
    check_floor(&s, 64 << 10, 2000);
    assert_eq!(s["points"][0]["role"], "client");
    // The server's core came back in its acknowledgement.
    let text = String::from_utf8_lossy(&client.stdout);
    assert!(text.contains("cores 0 <-> 1"), "{text}");
    // --once: the server leaves after the client's run, successfully.
    let out = wait(server, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "server failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn client_without_a_server_times_out_and_bad_flags_are_refused() {
    let _s = serial();
    // A port nothing listens on: refused connections are retried until the timeout.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    let out = wait(
        spawn(&[
            "floor",
            "--fabric",
            "tcp",
            "--client",
            &addr,
            "--app-cores",
            "0",
            "--connect-timeout",
            "300ms",
        ]),
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("timed out"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(20));
    for (args, needle) in [
        (
            &["floor", "--fabric", "shm", "--server", "127.0.0.1:0"][..],
            "only for --fabric tcp",
        ),
        (
            &["floor", "--fabric", "shm", "--client", "127.0.0.1:1"][..],
            "only for --fabric tcp",
        ),
        (
            &["floor", "--client", "shm://x"][..],
            "floor roles exist only for tcp",
        ),
        (&["floor", "--fabric", "tcp", "--size", "0"][..], "--size"),
        (&["floor", "--fabric", "tcp", "--size", "16m"][..], "--size"),
    ] {
        let out = wait(spawn(args), Duration::from_secs(30));
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
