//! `spinwire-stat` against an engine running in another process: listed, counts grow between
//! two calls, the JSON and Prometheus outputs carry them, a killed process's file is stale.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use spinwire_testkit::engine::{endpoint, recv_msg, rtc_builder, send_msg};
use spinwire_testkit::{process, role};

const T: Duration = Duration::from_secs(10);

#[test]
#[ignore = "child role: run by the tests of this file"]
fn child_streaming_engine() {
    let _ = role::env("SPINWIRE_STAT_CHILD");
    let engine = rtc_builder(256, 16).name("stat-test").build().unwrap();
    let ep = endpoint("stat");
    let l = engine.listen(&ep).unwrap();
    let c = engine.connect(&ep).unwrap();
    let s = l.accept_timeout(T).unwrap();
    println!("READY {}", std::process::id());
    let until = Instant::now() + Duration::from_secs(30);
    let mut i = 0;
    while Instant::now() < until {
        for _ in 0..50 {
            send_msg(&c, i, 16);
            recv_msg(&s, i, 16);
            i += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct Child(std::process::Child, u32);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        // A killed child leaves its counters file: remove it.
        for path in spinwire::counters::list().unwrap_or_default() {
            if spinwire::counters::read(&path).is_ok_and(|s| s.pid == self.1) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

fn start_child() -> Child {
    let mut child = role::command("child_streaming_engine")
        .env("SPINWIRE_STAT_CHILD", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in out.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let line = process::wait_for_line(&rx, "READY ", T, "the child engine");
    let pid = line[line.find("READY ").unwrap() + 6..]
        .trim()
        .parse()
        .unwrap();
    Child(child, pid)
}

fn stat(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_spinwire-stat"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The child's messages sent, from `spinwire-stat --once --json --pid P`.
fn sent(pid: u32) -> (u64, Value) {
    let v: Value =
        serde_json::from_str(&stat(&["--once", "--json", "--pid", &pid.to_string()])).unwrap();
    let engines = v["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 1, "{v}");
    let e = &engines[0];
    let total = e["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sent"].as_u64().unwrap())
        .sum();
    (total, e.clone())
}

#[test]
fn counts_of_another_process_grow() {
    let child = start_child();
    // Connections show from the control thread's next publication on (at most ~100 ms).
    let deadline = Instant::now() + T;
    let (a, e) = loop {
        let (a, e) = sent(child.1);
        if e["connections"].as_array().unwrap().len() == 2 || Instant::now() > deadline {
            break (a, e);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(e["name"], "stat-test");
    assert_eq!(e["state"], "running");
    assert_eq!(e["connections"].as_array().unwrap().len(), 2, "{e}");
    assert_eq!(e["connections"][0]["fabric"], "shm");
    let deadline = Instant::now() + T;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let (b, _) = sent(child.1);
        if b > a {
            break;
        }
        assert!(Instant::now() < deadline, "sent stayed at {a}");
    }
    // Two refreshes: the second has rates.
    let out = stat(&[
        "--json",
        "--pid",
        &child.1.to_string(),
        "--interval",
        "300ms",
        "--count",
        "2",
    ]);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert!(lines[0]["engines"][0]["rates"].is_null());
    let rate = lines[1]["engines"][0]["connections"][0]["rates"]["sent"].as_f64();
    assert!(rate.is_some_and(|r| r > 0.0), "{}", lines[1]);
    let prom = stat(&["--once", "--prometheus", "--pid", &child.1.to_string()]);
    assert!(
        prom.contains("# TYPE spinwire_conn_sent_total counter"),
        "{prom}"
    );
    assert!(
        prom.contains(&format!(
            "spinwire_engine_up{{pid=\"{}\",engine=\"stat-test\"}} 1",
            child.1
        )),
        "{prom}"
    );
    let table = stat(&["--once", "--pid", &child.1.to_string()]);
    assert!(table.contains("engine stat-test pid"), "{table}");
}

#[test]
fn a_killed_process_is_listed_stale() {
    let mut child = start_child();
    let pid = child.1;
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let (_, e) = sent(pid);
    assert_eq!(e["state"], "stale", "{e}");
    let table = stat(&["--once", "--pid", &pid.to_string()]);
    assert!(table.contains("(stale)"), "{table}");
    let v: Value = serde_json::from_str(&stat(&[
        "--once",
        "--json",
        "--running",
        "--pid",
        &pid.to_string(),
    ]))
    .unwrap();
    assert!(v["engines"].as_array().unwrap().is_empty());
    let path = e["path"].as_str().unwrap().to_owned();
    stat(&["--once", "--clean", "--pid", &pid.to_string()]);
    assert!(!std::path::Path::new(&path).exists());
}
