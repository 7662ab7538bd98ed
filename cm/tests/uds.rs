//! Rendezvous tests: connect/accept, handshake, timeouts, bad names, rejection, fd passing,
//! hang-up detection (including a SIGKILLed child process).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cm::uds::{self, testing, ConnParams, HandshakeRefusal, UdsError, UdsListener, UdsStream};
use spinwire_testkit::process::KillOnDrop;
use spinwire_testkit::role;

const T: Duration = Duration::from_secs(5);
const CHILD_ENV: &str = "CM_UDS_TEST_CHILD_NAME";

fn name(test: &str) -> String {
    format!("t-{}-{test}", std::process::id())
}

fn params() -> ConnParams {
    ConnParams {
        buffer_size: 4096,
        buffer_count: 64,
        ring_depth: 128,
        inline_max: 96,
        flags: 0,
        large_size: 0,
        large_count: 0,
    }
}

fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fresh descriptors owned by nobody else.
    unsafe {
        use std::os::fd::FromRawFd;
        (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1]))
    }
}

/// Runs the connector and listener halves of a handshake up to the offer.
fn pair(n: &str) -> (UdsListener, UdsStream, UdsStream) {
    let l = UdsListener::bind(n).unwrap();
    let c = uds::connect(n, T).unwrap();
    let s = l.accept_timeout(T).unwrap();
    (l, c, s)
}

#[test]
fn full_handshake_passes_a_working_fd() {
    let n = name("full");
    let (l, mut c, mut s) = pair(&n);
    assert!(l.path().exists());
    assert!(std::fs::metadata(l.path()).unwrap().file_type().is_socket());
    assert_eq!(s.peer_cred().pid as u32, std::process::id());

    c.send_hello(&params(), T).unwrap();
    let hello = s.recv_hello(T).unwrap();
    assert_eq!(hello.params, params());
    assert_eq!(hello.pid, std::process::id());

    let (mut r, w) = pipe();
    s.send_accept(&hello.params, w.as_fd(), T).unwrap();
    drop(w); // our copy; the peer's copy keeps the pipe open
    let offer = c.recv_offer(T).unwrap();
    assert_eq!(offer.params, params());
    let mut w2 = File::from(offer.segment);
    w2.write_all(b"through SCM_RIGHTS").unwrap();
    drop(w2);
    let mut got = String::new();
    r.read_to_string(&mut got).unwrap();
    assert_eq!(got, "through SCM_RIGHTS");

    c.send_ready(T).unwrap();
    s.recv_ready(T).unwrap();
    assert!(!s.poll_hangup().unwrap());
    assert!(!c.poll_hangup().unwrap());
}

#[test]
fn listener_drop_unlinks_socket() {
    let n = name("unlink");
    let l = UdsListener::bind(&n).unwrap();
    let path = l.path().to_owned();
    assert!(path.exists());
    drop(l);
    assert!(!path.exists());
    assert!(matches!(
        uds::connect(&n, T),
        Err(UdsError::NoListener { .. })
    ));
}

#[test]
fn connect_to_missing_name_fails_fast() {
    let t0 = Instant::now();
    let e = uds::connect(&name("missing"), T).unwrap_err();
    assert!(matches!(e, UdsError::NoListener { .. }), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(1));
}

#[test]
fn accept_timeout_times_out() {
    let l = UdsListener::bind(&name("acc-to")).unwrap();
    assert!(l.try_accept().unwrap().is_none());
    let t0 = Instant::now();
    let e = l.accept_timeout(Duration::from_millis(50)).unwrap_err();
    assert!(matches!(e, UdsError::Timeout { op: "accept", .. }), "{e:?}");
    let el = t0.elapsed();
    assert!(el >= Duration::from_millis(50), "{el:?}");
}

#[test]
fn recv_times_out_without_peer_message() {
    let (_l, mut c, mut s) = pair(&name("recv-to"));
    let e = s.recv_hello(Duration::from_millis(20)).unwrap_err();
    assert!(matches!(e, UdsError::Timeout { .. }), "{e:?}");
    let e = c.recv_offer(Duration::from_millis(20)).unwrap_err();
    assert!(matches!(e, UdsError::Timeout { .. }), "{e:?}");
}

#[test]
fn bad_names_are_typed_errors() {
    let long = "n".repeat(uds::MAX_NAME_LEN + 1);
    for bad in ["", ".hidden", "a/b", "sp ace", "nul\0", long.as_str()] {
        assert!(
            matches!(UdsListener::bind(bad), Err(UdsError::BadName { .. })),
            "{bad:?}"
        );
        assert!(
            matches!(uds::connect(bad, T), Err(UdsError::BadName { .. })),
            "{bad:?}"
        );
    }
}

#[test]
fn second_bind_is_addr_in_use_and_stale_socket_is_replaced() {
    let n = name("inuse");
    let l = UdsListener::bind(&n).unwrap();
    assert!(matches!(
        UdsListener::bind(&n),
        Err(UdsError::AddrInUse { .. })
    ));
    let path = l.path().to_owned();
    drop(l);
    // Leave a stale socket file behind (std's listener does not unlink on drop).
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    assert!(matches!(
        uds::connect(&n, T),
        Err(UdsError::NoListener { .. })
    ));
    let l = UdsListener::bind(&n).unwrap();
    let _c = uds::connect(&n, T).unwrap();
    assert!(l.accept_timeout(T).is_ok());
}

#[test]
fn reject_carries_the_listeners_params() {
    let (_l, mut c, mut s) = pair(&name("reject-params"));
    c.send_hello(&params(), T).unwrap();
    let _ = s.recv_hello(T).unwrap();
    let mut ours = params();
    ours.buffer_size *= 2;
    s.send_reject_with(HandshakeRefusal::ParamsMismatch, &ours, T)
        .unwrap();
    match c.recv_offer(T) {
        Err(UdsError::Rejected {
            reason: HandshakeRefusal::ParamsMismatch,
            params,
        }) => assert_eq!(params, ours),
        other => panic!("{other:?}"),
    }
}

#[test]
fn params_rejected_with_reason() {
    let (_l, mut c, mut s) = pair(&name("reject"));
    c.send_hello(&params(), T).unwrap();
    let _ = s.recv_hello(T).unwrap();
    s.send_reject(HandshakeRefusal::ParamsMismatch, T).unwrap();
    let e = c.recv_offer(T).unwrap_err();
    assert!(
        matches!(
            e,
            UdsError::Rejected {
                reason: HandshakeRefusal::ParamsMismatch,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn connector_abort_is_reported() {
    let (_l, mut c, mut s) = pair(&name("abort"));
    c.send_hello(&params(), T).unwrap();
    let _ = s.recv_hello(T).unwrap();
    let (_r, w) = pipe();
    s.send_accept(&params(), w.as_fd(), T).unwrap();
    let _offer = c.recv_offer(T).unwrap();
    c.send_abort(HandshakeRefusal::SegmentFailed, T).unwrap();
    let e = s.recv_ready(T).unwrap_err();
    assert!(
        matches!(
            e,
            UdsError::Aborted {
                reason: HandshakeRefusal::SegmentFailed
            }
        ),
        "{e:?}"
    );
}

#[test]
fn version_mismatch_is_rejected() {
    let (_l, mut c, mut s) = pair(&name("version"));
    let raw = testing::encode_raw(uds::PROTOCOL_VERSION + 1, 1, 0, &params());
    testing::send_raw(&c, &raw, &[]).unwrap();
    let e = s.recv_hello(T).unwrap_err();
    assert!(
        matches!(e, UdsError::VersionMismatch { theirs, .. } if theirs == uds::PROTOCOL_VERSION + 1),
        "{e:?}"
    );
    // The listener told us why before we hang up.
    let e = c.recv_offer(T);
    assert!(
        matches!(
            e,
            Err(UdsError::Rejected {
                reason: HandshakeRefusal::VersionMismatch,
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn garbage_and_short_messages_are_typed_errors() {
    let (_l, c, mut s) = pair(&name("garbage"));
    testing::send_raw(&c, &[0xAB; 64], &[]).unwrap();
    assert!(matches!(s.recv_hello(T), Err(UdsError::BadMessage { .. })));
    testing::send_raw(&c, &[1, 2, 3], &[]).unwrap();
    assert!(matches!(s.recv_hello(T), Err(UdsError::BadMessage { .. })));
    // A hello carrying an fd is refused (and the fd closed).
    let (_r, w) = pipe();
    let hello = testing::encode_raw(uds::PROTOCOL_VERSION, 1, 0, &params());
    testing::send_raw(&c, &hello, &[w.as_fd()]).unwrap();
    assert!(matches!(
        s.recv_hello(T),
        Err(UdsError::FdCount {
            expected: 0,
            got: 1
        })
    ));
}

#[test]
fn accept_with_zero_or_extra_fds_is_refused() {
    let (_l, mut c, s) = pair(&name("fds"));
    let accept = testing::encode_raw(uds::PROTOCOL_VERSION, 2, 0, &params());
    testing::send_raw(&s, &accept, &[]).unwrap();
    assert!(matches!(
        c.recv_offer(T),
        Err(UdsError::FdCount {
            expected: 1,
            got: 0
        })
    ));
    let (mut r, w) = pipe();
    testing::send_raw(&s, &accept, &[w.as_fd(), w.as_fd(), w.as_fd()]).unwrap();
    assert!(matches!(
        c.recv_offer(T),
        Err(UdsError::FdCount {
            expected: 1,
            got: 3
        })
    ));
    // All received copies were closed: once ours is gone the reader sees EOF.
    drop(w);
    let mut buf = Vec::new();
    assert_eq!(r.read_to_end(&mut buf).unwrap(), 0);
}

#[test]
fn hangup_seen_after_close_and_after_bye() {
    let (_l, c, mut s) = pair(&name("hup"));
    assert!(!s.poll_hangup().unwrap());
    drop(c);
    assert!(s.poll_hangup().unwrap());
    assert!(s.poll_hangup().unwrap(), "sticky");

    let (_l, mut c, mut s) = pair(&name("bye"));
    c.send_bye().unwrap();
    assert!(s.poll_hangup().unwrap());
}

#[test]
fn unexpected_message_after_handshake_is_bad_message() {
    let (_l, mut c, mut s) = pair(&name("late"));
    c.send_ready(T).unwrap();
    assert!(matches!(s.poll_hangup(), Err(UdsError::BadMessage { .. })));
}

/// Child role of `hangup_seen_after_child_is_sigkilled`: connects to the listener named in
/// `CHILD_ENV`, says hello, then waits to be killed (bounded).
#[test]
#[ignore = "child role: run by hangup_seen_after_child_is_sigkilled"]
fn child_connects_and_waits() {
    let n = role::env(CHILD_ENV);
    let mut c = uds::connect(&n, T).unwrap();
    c.send_hello(&params(), T).unwrap();
    // Wait to be killed (bounded, in case the parent dies first).
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn hangup_seen_after_child_is_sigkilled() {
    let n = name("kill");
    let l = UdsListener::bind(&n).unwrap();
    let mut child = KillOnDrop(
        role::command("child_connects_and_waits")
            .env(CHILD_ENV, &n)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut s = l.accept_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(s.peer_cred().pid as u32, child.id());
    s.recv_hello(Duration::from_secs(20)).unwrap();
    assert!(!s.poll_hangup().unwrap());
    child.kill().unwrap(); // SIGKILL
    let t0 = Instant::now();
    let mut seen = false;
    while t0.elapsed() < Duration::from_secs(1) {
        if s.poll_hangup().unwrap() {
            seen = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    child.wait().unwrap();
    assert!(seen, "hang-up not seen within 1 s of SIGKILL");
}

const DIR_CHILD_ENV: &str = "CM_UDS_TEST_EXPECT_INSECURE";

/// Child role of `runtime_dir_override_is_checked`: runs with `SPINWIRE_RUNTIME_DIR`
/// overridden and `DIR_CHILD_ENV` saying whether that directory is "insecure" or "private".
#[test]
#[ignore = "child role: run by runtime_dir_override_is_checked"]
fn child_runtime_dir_checks() {
    let expect = role::env(DIR_CHILD_ENV);
    let n = name("dir");
    if expect == "insecure" {
        let e = UdsListener::bind(&n).unwrap_err();
        assert!(matches!(e, UdsError::InsecureRuntimeDir { .. }), "{e:?}");
        let e = uds::connect(&n, T).unwrap_err();
        assert!(matches!(e, UdsError::InsecureRuntimeDir { .. }), "{e:?}");
    } else {
        assert_eq!(expect, "private", "{DIR_CHILD_ENV}");
        let l = UdsListener::bind(&n).unwrap();
        let dir = std::env::var_os(uds::RUNTIME_DIR_ENV).unwrap();
        assert!(l.path().starts_with(&dir));
        let _c = uds::connect(&n, T).unwrap();
        l.accept_timeout(T).unwrap();
    }
}

#[test]
fn runtime_dir_override_is_checked() {
    use std::os::unix::fs::PermissionsExt;
    let base = std::env::temp_dir().join(format!("cm-uds-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    for (mode, expect) in [(0o755, "insecure"), (0o700, "private")] {
        let dir = base.join(expect);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut cmd = role::command("child_runtime_dir_checks");
        cmd.env(DIR_CHILD_ENV, expect)
            .env(uds::RUNTIME_DIR_ENV, &dir);
        role::run(cmd, Duration::from_secs(30));
    }
    std::fs::remove_dir_all(&base).unwrap();
}

/// The lock file of `name` in the runtime directory.
fn lock_path(name: &str) -> std::path::PathBuf {
    uds::runtime_dir().unwrap().join(format!("{name}.lock"))
}

#[test]
fn listener_drop_removes_its_lock_file_too() {
    let n = name("files");
    let l = UdsListener::bind(&n).unwrap();
    let sock = l.path().to_owned();
    assert!(sock.exists() && lock_path(&n).exists());
    drop(l);
    assert!(!sock.exists(), "socket file left behind");
    assert!(!lock_path(&n).exists(), "lock file left behind");
    // The name binds again.
    drop(UdsListener::bind(&n).unwrap());
    assert!(!lock_path(&n).exists());
}

#[test]
fn no_listener_names_the_per_user_directory() {
    let e = uds::connect(&name("nobody-here"), T).unwrap_err();
    let dir = uds::runtime_dir().unwrap();
    match &e {
        UdsError::NoListener { dir: d, .. } => assert_eq!(d, &dir),
        e => panic!("expected NoListener, got {e:?}"),
    }
    let text = e.to_string();
    assert!(text.contains(&*dir.to_string_lossy()), "{text}");
    assert!(text.contains("per user"), "{text}");
}

const BIND_CHILD_ENV: &str = "CM_UDS_TEST_BIND_NAME";

/// Child role of `files_of_a_sigkilled_listener_are_removed_by_the_next_bind`: binds the name
/// in `BIND_CHILD_ENV`, says so, and waits to be killed (bounded).
#[test]
#[ignore = "child role: run by files_of_a_sigkilled_listener_are_removed_by_the_next_bind"]
fn child_binds_and_waits() {
    let _l = UdsListener::bind(&role::env(BIND_CHILD_ENV)).unwrap();
    println!("bound");
    std::thread::sleep(Duration::from_secs(30));
}

#[test]
fn files_of_a_sigkilled_listener_are_removed_by_the_next_bind() {
    use std::io::BufRead;
    let dead = name("sigkilled");
    let mut child = KillOnDrop(
        role::command("child_binds_and_waits")
            .env(BIND_CHILD_ENV, &dead)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // libtest's own lines come first; the child's stdout ends if it fails.
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child never bound"
        );
        if line.trim_end().ends_with("bound") {
            break;
        }
    }
    let sock = uds::runtime_dir().unwrap().join(format!("{dead}.sock"));
    assert!(sock.exists());
    // A live listener's files are not touched by another bind.
    drop(UdsListener::bind(&name("sigkilled-other")).unwrap());
    assert!(sock.exists() && lock_path(&dead).exists());
    child.kill().unwrap(); // SIGKILL: nothing unlinks
    child.wait().unwrap();
    assert!(sock.exists() && lock_path(&dead).exists());
    let l = UdsListener::bind(&name("sigkilled-next")).unwrap();
    assert!(!sock.exists(), "stale socket file left");
    assert!(!lock_path(&dead).exists(), "stale lock file left");
    drop(l);
}

#[test]
fn one_listener_per_name_while_lock_files_come_and_go() {
    use std::sync::atomic::{AtomicU32, Ordering};
    let n = name("race");
    let holders = AtomicU32::new(0);
    let bound = AtomicU32::new(0);
    std::thread::scope(|s| {
        for t in 0..3 {
            let (n, holders, bound) = (&n, &holders, &bound);
            s.spawn(move || {
                for i in 0..200 {
                    // Binds of other names sweep this one's files concurrently.
                    if (i + t) % 4 == 0 {
                        drop(UdsListener::bind(&format!("{n}-{t}")).unwrap());
                        continue;
                    }
                    match UdsListener::bind(n) {
                        Ok(l) => {
                            assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                            bound.fetch_add(1, Ordering::Relaxed);
                            std::thread::yield_now();
                            holders.fetch_sub(1, Ordering::SeqCst);
                            drop(l);
                        }
                        Err(UdsError::AddrInUse { .. }) => {}
                        Err(e) => panic!("bind: {e:?}"),
                    }
                }
            });
        }
    });
    assert!(bound.load(Ordering::Relaxed) > 0);
    assert!(!lock_path(&n).exists());
}
