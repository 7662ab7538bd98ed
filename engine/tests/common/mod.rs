//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use spinwire::{Connection, Engine, Error, IdleStrategy, SendError};

/// Every wait in these tests is bounded by this.
pub const WAIT: Duration = Duration::from_secs(10);

/// Serialises the tests of one binary: each spins (with backoff) and this machine may have only
/// two cores.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A unique endpoint name for this process and `tag`.
pub fn endpoint(tag: &str) -> String {
    format!("shm://t-{tag}-{}", std::process::id())
}

/// A run-to-completion engine with the backoff idle strategy (tests must not hog cores).
pub fn inline_engine(buffer_size: usize, buffers: usize) -> Engine {
    Engine::builder()
        .run_to_completion()
        .idle(IdleStrategy::backoff())
        .pool(buffer_size, buffers)
        .depth(buffers.min(32))
        .batch(8)
        .build()
        .expect("engine")
}

/// A connected pair `(server, client)` through `server_engine`'s listener.
pub fn pair(server_engine: &Engine, client_engine: &Engine, tag: &str) -> (Connection, Connection) {
    let ep = endpoint(tag);
    let l = server_engine.listen(&ep).expect("listen");
    let c = client_engine.connect(&ep).expect("connect");
    let s = l.accept_timeout(WAIT).expect("accept");
    (s, c)
}

fn fnv32(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn pattern(seq: u32, i: usize) -> u8 {
    (seq.wrapping_mul(2_654_435_761).wrapping_add(i as u32 * 97) >> 13) as u8
}

/// Fills `buf` as message `seq`: `[seq: u32][pattern][fnv32 of the rest: u32]` when there is
/// room, else the pattern alone (which depends on `seq` too).
pub fn fill(buf: &mut [u8], seq: u32) {
    let n = buf.len();
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(seq, i);
    }
    if n >= 12 {
        buf[..4].copy_from_slice(&seq.to_le_bytes());
        let c = fnv32(&buf[..n - 4]);
        buf[n - 4..].copy_from_slice(&c.to_le_bytes());
    }
}

/// Checks that `buf` is message `seq` of length `len`.
pub fn verify(buf: &[u8], seq: u32, len: usize) {
    assert_eq!(buf.len(), len, "message {seq}: wrong length");
    let n = buf.len();
    if n >= 12 {
        assert_eq!(
            u32::from_le_bytes(buf[..4].try_into().unwrap()),
            seq,
            "sequence number"
        );
        let c = u32::from_le_bytes(buf[n - 4..].try_into().unwrap());
        assert_eq!(c, fnv32(&buf[..n - 4]), "message {seq} ({len} B): checksum");
        for (i, &b) in buf[4..n - 4].iter().enumerate() {
            assert_eq!(
                b,
                pattern(seq, i + 4),
                "message {seq} ({len} B): byte {}",
                i + 4
            );
        }
    } else {
        for (i, &b) in buf.iter().enumerate() {
            assert_eq!(b, pattern(seq, i), "message {seq} ({len} B): byte {i}");
        }
    }
}

/// Sends message `seq` of `len` bytes, waiting (bounded) for buffers and credits.
pub fn send_msg(conn: &Connection, seq: u32, len: usize) {
    let mut b = conn.alloc_timeout(WAIT).expect("alloc");
    b.set_len(len).expect("len");
    fill(&mut b, seq);
    match conn.send_timeout(b, WAIT) {
        Ok(()) => {}
        Err(e) => panic!("send {seq}: {e:?}"),
    }
    conn.flush();
}

/// Receives and verifies message `seq` of `len` bytes.
pub fn recv_msg(conn: &Connection, seq: u32, len: usize) {
    let m = conn
        .recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("recv {seq}: {e}"));
    verify(&m, seq, len);
}

/// Echoes every message back until the connection closes or `WAIT` passes without traffic.
pub fn echo_until_closed(conn: &Connection) -> u64 {
    let mut n = 0;
    loop {
        let m = match conn.recv_timeout(WAIT) {
            Ok(m) => m,
            Err(Error::Disconnected) | Err(Error::Timeout) => return n,
            Err(e) => panic!("echo: {e}"),
        };
        let mut b = conn.alloc_timeout(WAIT).expect("alloc");
        b.copy_from(&m).expect("copy");
        drop(m);
        let mut b = b;
        loop {
            match conn.send_timeout(b, WAIT) {
                Ok(()) => break,
                Err(SendError::Timeout(back)) => b = back,
                Err(e) => panic!("echo send: {e:?}"),
            }
        }
        conn.flush();
        n += 1;
    }
}

/// Re-runs this test binary as a child running only test `test` with `role` in
/// `SPINWIRE_TEST_ROLE` (the child test returns at once when the variable is unset).
pub fn spawn_child(test: &str, role: &str) -> Child {
    Command::new(std::env::current_exe().expect("current exe"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("SPINWIRE_TEST_ROLE", role)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn child")
}

/// The role this process was started with, if it is a child.
pub fn role() -> Option<String> {
    std::env::var("SPINWIRE_TEST_ROLE").ok()
}

/// Waits (bounded) for a child to exit and checks it succeeded.
pub fn wait_child(mut child: Child) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            assert!(st.success(), "child failed: {st}");
            return;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child did not finish in time");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
