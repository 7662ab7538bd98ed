//! The counters file: published from a running engine, removed at close, a killed process's
//! file reported stale, another layout version refused.

use std::io::BufRead;
use std::process::Stdio;
use std::time::{Duration, Instant};

use spinwire::counters::{self, CountersError, Liveness};
use spinwire_testkit::engine::{endpoint, recv_msg, rtc_builder, send_msg};
use spinwire_testkit::{process, role};

const T: Duration = Duration::from_secs(5);

/// Reads `path` until `ok` holds for the snapshot, at most 5 s.
fn read_until(
    path: &std::path::Path,
    ok: impl Fn(&counters::Snapshot) -> bool,
) -> counters::Snapshot {
    let deadline = Instant::now() + T;
    loop {
        let s = counters::read(path).expect("read the counters file");
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "counters never matched: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn published_while_running_and_removed_at_close() {
    let name = format!("ctest-{}", std::process::id());
    let engine = rtc_builder(256, 16).name(&name).build().unwrap();
    let path = engine.counters_path().expect("a counters file");
    assert!(path.starts_with(counters::dir().unwrap()), "{path:?}");
    assert!(counters::list().unwrap().contains(&path));
    let s = counters::read(&path).unwrap();
    assert_eq!(s.pid, std::process::id());
    assert_eq!(s.name, name);
    assert_eq!(s.liveness, Liveness::Running);
    assert_eq!(s.pollers.len(), 1);
    assert_eq!(s.pollers[0].core, None);

    let ep = endpoint("counters");
    let l = engine.listen(&ep).unwrap();
    let client = engine.connect(&ep).unwrap();
    let server = l.accept_timeout(T).unwrap();
    for i in 0..100 {
        send_msg(&client, i, 32);
        recv_msg(&server, i, 32);
    }
    // A direct path copies its counts out every 256 messages and when a receive finds its
    // ring empty, as an idle application's poll does.
    assert!(client.try_recv().unwrap().is_none());
    assert!(server.try_recv().unwrap().is_none());
    let s = read_until(&path, |s| {
        s.conns.len() == 2 && s.conns.iter().any(|c| c.get("sent") == Some(100))
    });
    let c = s.conns.iter().find(|c| c.get("sent") == Some(100)).unwrap();
    assert_eq!(c.fabric, "shm");
    assert_eq!(c.state.as_str(), "open");
    assert_eq!(c.get("tx_bytes"), Some(3200));
    assert!(s.conns.iter().any(|c| c.get("received") == Some(100)));
    assert_eq!(s.engine_counter("connections"), Some(2));

    drop((client, server, l, engine));
    let deadline = Instant::now() + T;
    while path.exists() {
        assert!(Instant::now() < deadline, "{path:?} not removed at close");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "child role: run by killed_process_leaves_a_stale_file"]
fn child_engine_until_killed() {
    let _ = role::env("SPINWIRE_COUNTERS_CHILD");
    let engine = rtc_builder(256, 16).name("ctest-killed").build().unwrap();
    println!("COUNTERS {}", engine.counters_path().unwrap().display());
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn killed_process_leaves_a_stale_file() {
    let mut child = role::command("child_engine_until_killed")
        .env("SPINWIRE_COUNTERS_CHILD", "1")
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
    let line = process::wait_for_line(&rx, "COUNTERS ", T, "the child's counters path");
    let at = line.find("COUNTERS ").unwrap() + "COUNTERS ".len();
    let path = std::path::PathBuf::from(line[at..].trim());
    assert_eq!(counters::read(&path).unwrap().liveness, Liveness::Running);
    child.kill().unwrap();
    child.wait().unwrap();
    let s = counters::read(&path).expect("the file outlives a killed process");
    assert_eq!(s.liveness, Liveness::Dead);
    assert_eq!(s.name, "ctest-killed");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn another_layout_version_is_refused() {
    let engine = rtc_builder(256, 16).name("ctest-version").build().unwrap();
    let path = engine.counters_path().unwrap();
    let mut b = std::fs::read(&path).unwrap();
    b[8..16].copy_from_slice(&(counters::LAYOUT_VERSION + 1).to_le_bytes());
    let copy = path.with_extension("copy");
    std::fs::write(&copy, &b).unwrap();
    let e = counters::read(&copy).unwrap_err();
    std::fs::remove_file(&copy).unwrap();
    assert!(
        matches!(e, CountersError::Version { found, .. } if found == counters::LAYOUT_VERSION + 1),
        "{e:?}"
    );
    assert!(e.to_string().contains("version"), "{e}");
    let off = rtc_builder(256, 16).counters_file(false).build().unwrap();
    assert!(off.counters_path().is_none());
}

#[test]
fn a_polled_connection_is_published_too() {
    let engine = rtc_builder(256, 16).name("ctest-polled").build().unwrap();
    let path = engine.counters_path().unwrap();
    let ep = format!("mem://ctest-{}", std::process::id());
    let l = engine.listen(&ep).unwrap();
    let client = engine.connect(&ep).unwrap();
    let server = l.accept_timeout(T).unwrap();
    for i in 0..100 {
        send_msg(&client, i, 32);
        recv_msg(&server, i, 32);
    }
    let s = read_until(&path, |s| {
        s.conns.iter().any(|c| c.get("tx_msgs") == Some(100))
            && s.conns.iter().any(|c| c.get("received") == Some(100))
    });
    // The poller's counts stand for a polled connection's own.
    assert!(s.conns.iter().any(|c| c.get("sent") == Some(100)), "{s:?}");
    assert!(s.conns.iter().all(|c| c.fabric == "mem"), "{s:?}");
    assert!(s.pollers[0].get("tx_msgs").unwrap() >= 100, "{s:?}");
}

#[test]
fn a_sleeping_pollers_sleeps_are_published() {
    let engine = rtc_builder(256, 16)
        .idle(spinwire::IdleStrategy::block())
        .name("ctest-sleeps")
        .build()
        .unwrap();
    let path = engine.counters_path().unwrap();
    let ep = format!("mem://ctest-sleeps-{}", std::process::id());
    let l = engine.listen(&ep).unwrap();
    let _client = engine.connect(&ep).unwrap();
    let server = l.accept_timeout(T).unwrap();
    // Nothing comes: the run-to-completion poller sleeps in this thread until the timeout.
    assert!(server.recv_timeout(Duration::from_millis(50)).is_err());
    let slept = engine.counters().pollers[0].sleeps;
    assert!(slept >= 1, "{:?}", engine.counters().pollers);
    let s = read_until(&path, |s| {
        s.pollers
            .first()
            .and_then(|p| p.get("sleeps"))
            .is_some_and(|n| n >= slept)
    });
    assert!(
        s.pollers[0].get("sleep_timeouts").is_some(),
        "{:?}",
        s.pollers
    );
}

#[test]
fn a_busy_direct_path_publishes_every_256_messages() {
    let engine = rtc_builder(256, 16).name("ctest-busy").build().unwrap();
    let path = engine.counters_path().unwrap();
    let ep = endpoint("counters-busy");
    let l = engine.listen(&ep).unwrap();
    let client = engine.connect(&ep).unwrap();
    let server = l.accept_timeout(T).unwrap();
    // Never an empty ring on the receiving side: the cadence alone publishes.
    for i in 0..600 {
        send_msg(&client, i, 16);
        recv_msg(&server, i, 16);
    }
    let s = read_until(&path, |s| {
        s.conns.iter().any(|c| c.get("sent") == Some(512))
            && s.conns.iter().any(|c| c.get("received") == Some(512))
    });
    assert_eq!(s.conns.len(), 2);
}

#[test]
fn a_direct_batch_receive_publishes_when_it_passes_256_messages() {
    let engine = rtc_builder(256, 16).name("ctest-batch").build().unwrap();
    let path = engine.counters_path().unwrap();
    let ep = endpoint("counters-batch");
    let l = engine.listen(&ep).unwrap();
    let client = engine.connect(&ep).unwrap();
    let server = l.accept_timeout(T).unwrap();
    // Batches of 7, each taken whole by one `poll` (never an empty ring): the count goes
    // 252 -> 259 in the batch that passes 256, and that batch's receive publishes 259.
    let mut got = 0u64;
    for _ in 0..37 {
        for _ in 0..7 {
            let mut b = client.alloc_timeout(T).unwrap();
            b.copy_from(&[7u8; 16]).unwrap();
            client.send_batched(b).unwrap();
        }
        client.flush().unwrap();
        let n = server.poll(|m| assert_eq!(m.len(), 16), 7).unwrap();
        assert_eq!(n, 7, "a batch is taken whole");
        got += n as u64;
    }
    assert_eq!(got, 259);
    read_until(&path, |s| {
        s.conns.iter().any(|c| c.get("received") == Some(259))
    });
}

#[test]
fn long_dead_files_are_removed_by_the_next_engine() {
    let engine = rtc_builder(256, 16).name("ctest-template").build().unwrap();
    let mut b = std::fs::read(engine.counters_path().unwrap()).unwrap();
    drop(engine);
    // A process id that does not exist, last published at the epoch.
    let pid: u32 = 4_000_000_000 - std::process::id();
    b[16..24].copy_from_slice(&u64::from(pid).to_le_bytes());
    b[48..56].copy_from_slice(&1u64.to_le_bytes());
    let old = counters::dir()
        .unwrap()
        .join(format!("ctest-old-{pid}-0.counters"));
    std::fs::write(&old, &b).unwrap();
    assert_eq!(counters::read(&old).unwrap().liveness, Liveness::Dead);
    let _next = rtc_builder(256, 16).build().unwrap();
    assert!(!old.exists(), "{old:?} not removed");
}

#[test]
#[ignore = "child role: run by the_counters_dir_override_is_checked"]
fn child_counters_dir() {
    let expect = role::env("SPINWIRE_COUNTERS_EXPECT");
    let engine = rtc_builder(256, 16).build().unwrap();
    let dir = std::env::var_os(counters::COUNTERS_DIR_ENV).unwrap();
    if expect == "private" {
        assert!(engine.counters_path().unwrap().starts_with(&dir));
        assert_eq!(counters::dir().unwrap(), std::path::PathBuf::from(dir));
    } else {
        // Refused: the engine runs without a counters file.
        assert!(engine.counters_path().is_none());
        let e = counters::dir().unwrap_err();
        assert!(matches!(e, CountersError::Dir { .. }), "{e:?}");
    }
}

#[test]
fn the_counters_dir_override_is_checked() {
    use std::os::unix::fs::PermissionsExt;
    let base = std::env::temp_dir().join(format!("ctest-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    for (mode, expect) in [(0o755, "open"), (0o700, "private")] {
        let dir = base.join(expect);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut cmd = role::command("child_counters_dir");
        cmd.env("SPINWIRE_COUNTERS_EXPECT", expect)
            .env(counters::COUNTERS_DIR_ENV, &dir);
        role::run(cmd, Duration::from_secs(30));
    }
    std::fs::remove_dir_all(&base).unwrap();
}
