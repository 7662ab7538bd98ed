//! Child-process roles: the half of a multi-process test that runs in a child process.
//!
//! A role is an `#[ignore]`d test of the same test binary, so a plain `cargo test` lists it as
//! *ignored*, never as a pass that did nothing. Its parent test starts it explicitly with
//! [`command`] (the running test binary with `--ignored --exact <role>`) and hands it what it
//! needs through environment variables, which the role reads with [`env`]. A role run by hand
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

/// The command that runs role `test` (an `#[ignore]`d test of the running test binary) in a
/// child process: `<this test binary> --ignored --exact <test> --nocapture --test-threads=1`,
/// stdin from `/dev/null`. Add the role's environment and output redirections, then spawn it.
///
/// # Panics
///
/// If the path of the running executable cannot be read.
pub fn command(test: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("path of the running test binary"));
    cmd.args(["--ignored", "--exact", test, "--nocapture", "--test-threads=1"])
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
