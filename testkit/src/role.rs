//! Child-process roles: the half of a multi-process test that runs in a child process.
//!
//! A role is an `#[ignore]`d test of the same test binary, so a plain `cargo test` lists it as
//! *ignored*, never as a pass that did nothing. Its parent test starts it explicitly with
//! [`command`] (the running test binary with `--ignored --exact <role>`) and hands it what it
//! needs through environment variables, which the role reads with [`env()`]. A role run by hand
//! without its variables fails loudly instead of passing.
//!
//! ```no_run
//! use spinwire_testkit::role;
//!
//! const NAME_ENV: &str = "MY_TEST_CHILD_NAME";
//!
//! #[test]
//! #[ignore = "child role: run by parent_test"]
//! fn child_role() {
//!     let name = role::env(NAME_ENV);
//!     // ... the child's half, using `name` ...
//! }
//!
//! #[test]
//! fn parent_test() {
//!     let mut child = role::command("child_role").env(NAME_ENV, "t-1").spawn().unwrap();
//!     // ... the parent's half ...
//!     assert!(child.wait().unwrap().success());
//! }
//! # fn main() {}
//! ```
//!
//! Do not run the test binaries with `--include-ignored` or `--ignored` and no filter: the
//! roles would run without their parent and fail.

use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use crate::process::{lines, wait_timeout, KillOnDrop};

/// The command that runs role `test` (an `#[ignore]`d test of the running test binary) in a
/// child process: `<this test binary> --ignored --exact <test> --nocapture --test-threads=1`,
/// stdin from `/dev/null`. Add the role's environment and output redirections, then spawn it.
///
/// # Panics
///
/// If the path of the running executable cannot be read.
pub fn command(test: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("path of the running test binary"));
    cmd.args([
        "--ignored",
        "--exact",
        test,
        "--nocapture",
        "--test-threads=1",
    ])
    .stdin(Stdio::null());
    cmd
}

/// The value of environment variable `var`, which a role's parent sets.
///
/// # Panics
///
/// If `var` is unset or not UTF-8: the role was run without its parent (run the parent test
/// named in the role's `#[ignore]` reason instead).
#[track_caller]
pub fn env(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) => v,
        Err(e) => panic!(
            "{var}: {e}: this test is a child role, started by the parent test named in its \
             #[ignore] reason with its environment set; run that test (or set {var}) instead"
        ),
    }
}

/// Runs the role that `cmd` (from [`command`], with its environment added) starts, to the end
/// and within `limit`, and checks that it *ran* and passed: libtest must report exactly one test
/// passed, so a misspelt role name (which runs nothing and exits 0) fails too. Its stdout and
/// stderr are captured and shown on failure.
///
/// # Panics
///
/// If the role cannot be started, fails, runs no test, or is still running after `limit` (then
/// it is killed).
pub fn run(mut cmd: Command, limit: Duration) {
    let mut child = KillOnDrop(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the child role"),
    );
    let out = lines(child.stdout.take().expect("piped stdout"));
    let err = lines(child.stderr.take().expect("piped stderr"));
    let status = wait_timeout(&mut child, limit);
    // The readers end at end of file, which follows the exit.
    let collect = |rx: Receiver<String>| -> String {
        let mut all = String::new();
        while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
            all.push_str(&line);
            all.push('\n');
        }
        all
    };
    let Some(status) = status else {
        panic!("child role did not finish within {limit:?}");
    };
    let (stdout, stderr) = (collect(out), collect(err));
    assert!(
        status.success(),
        "child role failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "child role ran no test (wrong name?)\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
}
