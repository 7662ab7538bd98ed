//! Helpers shared by the spinwire workspace's tests: one place for what every test binary needs,
//! so that each test file holds only its tests. Dev-only (`publish = false`): the `cm`,
//! `spinwire` and `bench` crates list it under `[dev-dependencies]` only, and no library code
//! uses it.
//!
//! | module | what |
//! |---|---|
//! | [`serial`], [`cores`], [`pin`] | spinning tests one at a time; the cores this process may use |
//! | [`role`] | child-process roles: `#[ignore]`d tests a parent test runs in a child process |
//! | [`process`] | child processes killed on drop, bounded waits, line readers |
//! | [`data`] | test payloads: sequence-numbered, checksummed frames; byte patterns; a seeded PRNG |
//! | [`rdma`] | the RDMA VM's address (`RXE_VM_IP`) |
//! | `engine` (feature `engine`) | engine builders, connected pairs, verified send/receive, echo |
//!
//! The `engine` feature pulls in the `spinwire` crate; without it this crate depends on no
//! workspace crate, so `cm`'s tests can use it without building the engine above them.
//!
//! # Waits
//!
//! Every wait here is bounded ([`WAIT`] or an explicit limit) and fails the test with a message
//! when it runs out: a broken peer never hangs a test run.

pub mod data;
#[cfg(feature = "engine")]
pub mod engine;
pub mod process;
pub mod rdma;
pub mod role;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The default bound on a single wait (accept, receive, allocate, send) in these tests.
pub const WAIT: Duration = Duration::from_secs(10);

/// Serialises the spinning tests of one test binary (the lock is per process, and cargo runs
/// each test binary as its own process): each spins, with backoff, and the machine may have only
/// two cores. Hold the guard for the whole test: `let _g = serial();`.
///
/// A test that panicked while holding the lock does not poison it for the others.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The ids of the cores this process may run on, in the order the OS lists them.
///
/// # Panics
///
/// If the affinity mask cannot be read (then no test that pins can run).
pub fn cores() -> Vec<usize> {
    core_affinity::get_core_ids()
        .expect("read this process's CPU affinity")
        .iter()
        .map(|c| c.id)
        .collect()
}

/// Pins the calling thread to core `core`.
///
/// # Panics
///
/// If the OS refuses (e.g. `core` is not in this process's affinity mask).
pub fn pin(core: usize) {
    assert!(
        core_affinity::set_for_current(core_affinity::CoreId { id: core }),
        "pin this thread to core {core}"
    );
}
