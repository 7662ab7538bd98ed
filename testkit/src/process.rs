//! Child processes in tests: killed when dropped, waited for with a bound, their output read
//! line by line on a helper thread.

use std::io::{BufRead, BufReader, Read};
use std::ops::{Deref, DerefMut};
use std::process::{Child, ExitStatus};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// A child process that is killed (SIGKILL) and reaped when dropped, so that a failing
/// assertion in the parent never leaks a child. Derefs to the [`Child`].
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // Already exited (and reaped) is fine: kill then fails and wait returns the status.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits up to `limit` for `child` to exit; `None` if it is still running then (it is left
/// running: kill it, or let [`KillOnDrop`] do so).
///
/// # Panics
///
/// If the exit status cannot be read.
pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().expect("read the child's exit status") {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits up to `limit` for `child` to exit and checks that it succeeded.
///
/// # Panics
///
/// If the child failed, or is still running after `limit` (then it is killed first).
pub fn wait_success(child: &mut Child, limit: Duration) {
    match wait_timeout(child, limit) {
        Some(st) => assert!(st.success(), "child failed: {st}"),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("child did not finish within {limit:?}");
        }
    }
}

/// Reads `from` (a child's piped stdout or stderr) line by line on a helper thread; the lines
/// arrive on the returned channel, which closes at end of file. Wait on it with
/// [`Receiver::recv_timeout`] (or [`wait_for_line`]) so that a silent child never hangs the test.
pub fn lines(from: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Keep reading after the receiver is gone: a child blocked on a full pipe would hang.
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// Waits up to `limit` for a line containing `needle` on `lines`, skipping others; returns it.
///
/// # Panics
///
/// If no such line arrives within `limit`, or the stream ends first; the message names `what`.
pub fn wait_for_line(
    lines: &Receiver<String>,
    needle: &str,
    limit: Duration,
    what: &str,
) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(_) => {}
            Err(e) => panic!("{what}: no line containing {needle:?} within {limit:?} ({e})"),
        }
    }
}
