//! What an operator and a perftest / sockperf user meet first: the endpoint's scheme selects
//! the fabric, `--server`'s default follows it, clients retry until `--connect-timeout`, the
//! server banner and handshake cover the settings that must match, client reports name the
//! one core they ran on, the machine line under `taskset`, units, the two-process floor, the
//! SVG legend, the quiet-machine guard beside a CPU burner, and `spinwire-stat` beside a
//! running `bench rate`.
//!
//! Each test spins at most two threads at a time (the `serial` guard), and every child is
//! bounded by a timeout and killed on failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::Value;
use spinwire_bench::cli::{Cli, Command as Sub, Fabric};
use spinwire_bench::run::{Plan, Role};
use spinwire_testkit::process::{lines, wait_for_line, wait_timeout, KillOnDrop};
use spinwire_testkit::serial;

fn out_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("ops-{name}"));
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

/// Waits for the child (killing it past `limit`) and collects its output.
fn wait(mut g: KillOnDrop, limit: Duration) -> Output {
    use std::io::Read;
    let done = wait_timeout(&mut g, limit).is_some();
    if !done {
        let _ = g.kill();
    }
    let status = g.wait().expect("wait");
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    if let Some(mut s) = g.stdout.take() {
        let _ = s.read_to_end(&mut stdout);
    }
    if let Some(mut s) = g.stderr.take() {
        let _ = s.read_to_end(&mut stderr);
    }
    let out = Output {
        status,
        stdout,
        stderr,
    };
    assert!(
        done,
        "bench did not finish within {limit:?}: {}",
        text(&out)
    );
    out
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn summary(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn plan(args: &[&str]) -> Result<Plan, spinwire_bench::BenchError> {
    let mut argv = vec!["bench", "lat"];
    argv.extend_from_slice(args);
    let Sub::Lat(l) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("not lat")
    };
    Plan::new(
        l.common,
        Default::default(),
        Vec::new(),
        vec![spinwire_bench::cli::TestKind::Lat],
        vec![l.size],
        None,
        None,
        false,
        false,
    )
}

#[test]
fn the_endpoint_selects_the_fabric_and_the_server_default_follows_it() {
    let p = plan(&["--client", "tcp://10.0.0.1:7471"]).unwrap();
    assert_eq!(p.fabric, Fabric::Tcp);
    let p = plan(&["--server", "tcp://0.0.0.0:9000"]).unwrap();
    assert_eq!(p.fabric, Fabric::Tcp);
    assert_eq!(p.role, Role::Server("tcp://0.0.0.0:9000".into()));
    // --server without a value: the fabric's default endpoint, not shm's.
    let p = plan(&["--server", "--fabric", "tcp"]).unwrap();
    assert_eq!(p.role, Role::Server("tcp://0.0.0.0:7471".into()));
    let p = plan(&["--server"]).unwrap();
    assert_eq!(p.role, Role::Server("shm://spinwire-bench".into()));
    // A contradiction is refused, naming the fix.
    let e = plan(&["--fabric", "shm", "--client", "tcp://10.0.0.1:7471"]).unwrap_err();
    assert!(e.to_string().contains("drop --fabric"), "{e}");
}

/// Two processes over tcp:// without --fabric: the client starts first and retries until the
/// server listens; the server's banner names the settings a client must share and both sides
/// report the --depth that differs; the client's points name its one core; `rate` measures
/// the floor in two-process mode (or the report says why not).
#[test]
fn two_processes_over_tcp_urls() {
    let _s = serial();
    let ep = format!("tcp://127.0.0.1:{}", free_port());
    let dir = out_dir("two-processes");
    let client = spawn(&[
        "rate",
        "--client",
        &ep,
        "--app-cores",
        "0",
        "--depth",
        "64",
        "--iters",
        "20000",
        "--warmup",
        "100",
        "--idle",
        "backoff",
        "--connect-timeout",
        "30s",
        "--out",
        dir.to_str().unwrap(),
    ]);
    // The server comes up only after the client has been refused for a while.
    std::thread::sleep(Duration::from_millis(1500));
    let mut server = spawn(&[
        "rate",
        "--server",
        &ep,
        "--once",
        "--app-cores",
        "1",
        "--depth",
        "128",
        "--idle",
        "backoff",
    ]);
    let stdout = lines(server.stdout.take().unwrap());
    let banner = wait_for_line(&stdout, "listening on", Duration::from_secs(30), "server");
    assert!(banner.contains("fabric tcp"), "{banner}");
    let settings = wait_for_line(
        &stdout,
        "settings a client must share",
        Duration::from_secs(5),
        "banner",
    );
    for knob in [
        "--depth 128",
        "--batch 128",
        "--inline-threshold 64",
        "--buffers 256",
        "--buffer-size 4096",
    ] {
        assert!(settings.contains(knob), "{knob}: {settings}");
    }
    let c = wait(client, Duration::from_secs(120));
    assert!(c.status.success(), "{}", text(&c));
    let s_out = wait(server, Duration::from_secs(30));
    let c_err = String::from_utf8_lossy(&c.stderr);
    assert!(
        c_err.contains("engine settings differ") && c_err.contains("--depth 128 (client 64)"),
        "{}",
        text(&c)
    );
    assert!(
        String::from_utf8_lossy(&s_out.stderr).contains("--depth 128 (client 64)"),
        "{}",
        text(&s_out)
    );
    let s = summary(&dir);
    let p = &s["points"][0];
    assert_eq!(p["fabric"], "tcp");
    assert_eq!(p["role"], "client");
    assert_eq!(p["app_cores"], serde_json::json!([0]), "{p}");
    // The floor ran (on this host) or the report says why not.
    let notes = s["notes"].as_array().unwrap();
    assert!(!s["floor"].is_null() || !notes.is_empty(), "{s}");
    if !s["floor"].is_null() {
        assert!(
            notes
                .iter()
                .any(|n| n.as_str().unwrap().contains("loopback tcp")),
            "{s}"
        );
        assert!(p["floor_msgs_per_sec"].as_f64().is_some(), "{p}");
    }
    let c_out = String::from_utf8_lossy(&c.stdout);
    assert!(c_out.contains("app cores [0]"), "{c_out}");
}

#[test]
fn a_client_gives_up_after_connect_timeout() {
    let ep = format!("tcp://127.0.0.1:{}", free_port());
    let t0 = Instant::now();
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
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("within 1.0 s") && err.contains("refused"),
        "{err}"
    );
    // It retried for the whole timeout rather than failing at once.
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn the_machine_line_under_taskset_and_one_unit_everywhere() {
    let _s = serial();
    let online = spinwire_bench::machine::online_cores().unwrap_or(1);
    let taskset = Command::new("taskset").arg("-V").output().is_ok();
    if online >= 2 && taskset {
        let out = Command::new("taskset")
            .args([
                "-c",
                "0",
                env!("CARGO_BIN_EXE_bench"),
                "lat",
                "--app-cores",
                "0,0",
            ])
            .args(["--idle", "backoff", "--iters", "2000", "--warmup", "100"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let o = String::from_utf8_lossy(&out.stdout);
        assert!(
            o.contains(&format!(
                "({online} cores online; this process may run on cores [0])"
            )),
            "{o}"
        );
        assert!(o.contains("Latency (us)"), "{o}");
    } else {
        eprintln!("skipped the taskset half: {online} cores online, taskset found: {taskset}");
    }
    // floor prints the unit lat and rate print.
    let out = wait(
        spawn(&[
            "floor", "--iters", "2000", "--warmup", "100", "--size", "4k",
        ]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", text(&out));
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(o.contains("Latency (us)") && o.contains(" us,"), "{o}");
}

/// A busy process pinned to one of the run's cores: the guard marks the point disturbed and
/// warns; with bounds no machine can exceed (no spinner check, others up to 64 cores), the
/// same run is not marked.
#[test]
fn a_cpu_burner_marks_points_disturbed() {
    let _s = serial();
    let cores = spinwire_bench::machine::available_cores();
    let stop = Arc::new(AtomicBool::new(false));
    let burner = {
        let stop = Arc::clone(&stop);
        let core = cores[0];
        std::thread::spawn(move || {
            let _ = core_affinity::set_for_current(core_affinity::CoreId { id: core });
            let mut x = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        })
    };
    let dir = out_dir("burner");
    let app = format!("{},{}", cores[0], cores[1 % cores.len()]);
    let out = wait(
        spawn(&[
            "lat",
            "--app-cores",
            &app,
            "--duration",
            "1s",
            "--warmup",
            "100",
            "--out",
            dir.to_str().unwrap(),
        ]),
        Duration::from_secs(60),
    );
    stop.store(true, Ordering::Relaxed);
    burner.join().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(o.contains("WARNING") && o.contains("was disturbed"), "{o}");
    assert!(o.contains("DISTURBED"), "{o}");
    let s = summary(&dir);
    let q = &s["points"][0]["quiet"];
    assert_eq!(q["disturbed"], true, "{q}");
    assert!(!q["reason"].as_str().unwrap().is_empty());
    let csv = std::fs::read_to_string(dir.join("summary.csv")).unwrap();
    let mut rows = csv.lines();
    let head: Vec<&str> = rows.next().unwrap().split(',').collect();
    let col = head.iter().position(|c| *c == "disturbed").unwrap();
    assert_eq!(
        rows.next().unwrap().split(',').nth(col),
        Some("true"),
        "{csv}"
    );

    // Bounds nothing reaches: not marked, no warning.
    let dir = out_dir("not-disturbed");
    let out = wait(
        spawn(&[
            "lat",
            "--idle",
            "backoff",
            "--iters",
            "2000",
            "--warmup",
            "100",
            "--disturbed-above",
            "6400%",
            "--out",
            dir.to_str().unwrap(),
        ]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", text(&out));
    let o = String::from_utf8_lossy(&out.stdout);
    assert!(
        !o.contains("was disturbed") && !o.contains("DISTURBED"),
        "{o}"
    );
    assert_eq!(summary(&dir)["points"][0]["quiet"]["disturbed"], false);
}

#[test]
fn quiet_wait_and_retry_flags() {
    let _s = serial();
    // A wait that cannot succeed on a busy test machine is bounded, says so, and measures.
    let out = wait(
        spawn(&[
            "lat",
            "--idle",
            "backoff",
            "--iters",
            "1000",
            "--warmup",
            "10",
            "--quiet-wait",
            "0.3",
            "--disturbed-above",
            "0%",
            "--retry-disturbed",
            "1",
        ]),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", text(&out));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("quiet machine") || e.contains("--quiet-wait"),
        "{e}"
    );
    // Still disturbed after its retry: marked, and the rerun announced.
    if String::from_utf8_lossy(&out.stdout).contains("was disturbed") {
        assert!(e.contains("rerun 1 of 1"), "{e}");
    }
}

#[test]
fn svg_legend_fits_and_latency_kinds_are_apart() {
    use spinwire_bench::report::Report;
    let dir = out_dir("svg");
    let out = wait(
        spawn(&[
            "sweep",
            "--sizes",
            "64",
            "--tests",
            "lat",
            "--rates",
            "20000",
            "--iters",
            "2000",
            "--warmup",
            "100",
            "--idle",
            "backoff",
            "--no-floor",
            "--out",
            dir.to_str().unwrap(),
        ]),
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", text(&out));
    for (file, label) in [
        ("latency-percentiles.svg", "round-trip time"),
        ("one-way-latency-percentiles.svg", "one-way latency"),
    ] {
        let svg = std::fs::read_to_string(dir.join(file)).unwrap();
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let root = doc.root_element();
        let width: f64 = root.attribute("width").unwrap().parse().unwrap();
        assert!(svg.contains(label), "{file}: {label}");
        // Every legend text ends inside the image (7.5 px per character is generous).
        for t in root.descendants().filter(|n| n.has_tag_name("text")) {
            let x: f64 = t.attribute("x").unwrap_or("0").parse().unwrap();
            let len = t.text().unwrap_or("").chars().count() as f64;
            if t.attribute("text-anchor").is_none() {
                assert!(
                    x + len * 7.5 <= width + 0.5,
                    "{file}: {:?} at {x} in {width}",
                    t.text()
                );
            }
        }
    }
    let _ = Report::new(Vec::new());
}

/// `spinwire-stat --once --json` beside a `bench rate` in another process: that process's
/// engine is listed with a message count that grows between two calls.
#[test]
fn spinwire_stat_beside_bench_rate() {
    let _s = serial();
    let bench = spawn(&[
        "rate",
        "--duration",
        "20s",
        "--idle",
        "backoff",
        "--no-floor",
        "--size",
        "64",
    ]);
    let pid = bench.id();
    let sent = || -> Option<u64> {
        let cli = spinwire_stat::Cli::try_parse_from([
            "spinwire-stat",
            "--once",
            "--json",
            "--pid",
            &pid.to_string(),
        ])
        .unwrap();
        let mut out = Vec::new();
        spinwire_stat::run(&cli, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        // The run's two engines (client and server side): the messages they sent.
        let running: Vec<&Value> = v["engines"]
            .as_array()?
            .iter()
            .filter(|e| e["state"] == "running")
            .collect();
        (!running.is_empty()).then(|| {
            running
                .iter()
                .flat_map(|e| e["connections"].as_array().into_iter().flatten())
                .map(|c| c["sent"].as_u64().unwrap_or(0))
                .sum()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        match sent() {
            Some(n) if n > 100 => break n,
            _ => assert!(
                Instant::now() < deadline,
                "bench's engine never showed messages"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let n = sent().unwrap_or(0);
        if n > first {
            break;
        }
        assert!(Instant::now() < deadline, "sent stayed at {first}");
    }
    drop(bench);
    // Killed: its engines' files stay (stale); remove them.
    for path in spinwire::counters::list().unwrap_or_default() {
        if spinwire::counters::read(&path).is_ok_and(|s| s.pid == pid) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// `bench footprint` over shm and tcp: every figure is printed, each side's resident memory
/// per connection is bounded (no eager pools: tcp stays under 256 KiB, shm under its 8-MiB
/// bound), and no connection went down while both sides idled past the liveness timeout.
#[test]
fn footprint_reports_each_sides_memory_and_no_connection_lost() {
    let _g = serial();
    for (fabric, bound_kib) in [("tcp", 256.0), ("shm", 8192.0)] {
        let out = wait(
            spawn(&[
                "footprint",
                "--fabric",
                fabric,
                "--connections",
                "4",
                "--idle",
                "1.5",
            ]),
            Duration::from_secs(60),
        );
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("connect time: median"), "{t}");
        assert!(
            stdout.contains("committed shared memory per connection"),
            "{t}"
        );
        // The pages of code the first connect runs are reported apart (once per process).
        assert!(
            stdout.contains("code and file pages paged in (once, not per connection)"),
            "{t}"
        );
        let line = stdout
            .lines()
            .find(|l| l.contains("resident per connection"))
            .unwrap_or_else(|| panic!("no resident line: {t}"));
        let kib: Vec<f64> = line
            .split_whitespace()
            .zip(line.split_whitespace().skip(1))
            .filter(|(_, unit)| unit.starts_with("KiB"))
            .filter_map(|(n, _)| n.parse().ok())
            .take(2)
            .collect();
        assert_eq!(kib.len(), 2, "{t}");
        for k in kib {
            assert!(k <= bound_kib, "{fabric}: {k} KiB per connection: {t}");
        }
        assert!(
            stdout.contains("went down while idle: listener 0 (") && stdout.contains("connector 0"),
            "{t}"
        );
    }
}
