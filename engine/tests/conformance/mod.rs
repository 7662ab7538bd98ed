//! The conformance suite: one body per behaviour, run over every scheme.
//!
//! Each body takes a [`Scheme`] (how to make its endpoints, what it supports, how its engines
//! are tuned) and uses only the public API of `spinwire` and `spinwire-testkit`. The
//! [`conformance!`] macro instantiates every body for one scheme as `#[test] fn
//! <scheme>::<case>()`, and every child-process role as an `#[ignore]`d `<scheme>::role_*`;
//! `engine/tests/conformance.rs` instantiates `shm` and `tcp`, `engine/tests/rdma_conformance.rs`
//! instantiates `rdma` and `rdma_srq` (a shared receive queue per poller, overcommitted; run
//! inside the Soft-RoCE VM by `scripts/ci/rdma-vm.sh`).
//!
//! A behaviour a scheme does not support is listed in its [`Scheme::skips`] with the reason:
//! its test prints `SKIP <scheme>/<case>: <reason>` straight to stderr (never captured) and
//! passes; `<scheme>::skip_report` (ignored; run by `scripts/ci/conformance.sh`) prints every
//! skip. A scheme that cannot run on this machine at all (rdma outside the VM) skips every case
//! the same way, with its reason.
//!
//! | module | behaviours |
//! |---|---|
//! | [`fifo`] | every size from 1 B to the limit (small, buffer, large), in one and two processes, rtc and dedicated pollers; the default limit; small and large interleaved |
//! | [`send`] | claims and aborts, `send_batched`, `recv_into`, `Connection::poll`, the bound on held messages |
//! | [`flow`] | back-pressure into a slow receiver, `send_timeout` without credits, a run-to-completion receiver whose every take finds a message returns credit |
//! | [`connect`] | a connect made before the listener waits for it; with none, the typed timeout; different message limits settle on the smaller; a listener's connection maximum |
//! | [`failure`] | a down connection fails every data call with its reason, and is released when dropped |
//! | [`idle`] | an application that makes no call for several liveness timeouts keeps its connection |
//! | [`block`] | `IdleStrategy::Block`: a sleeping receiver is woken by one message (rung, little CPU while asleep), a sender never waits on it, no lost wake-up over 10 000 bursts and silences |
//! | [`peer`] | peer close, peer SIGKILL, peer SIGSTOP (liveness) |
//! | [`reason`] | the reason of a disconnect reaches both sides: a clean close, a silent peer (the checker sees `PeerUnresponsive`, the silent side `PeerAborted(Unresponsive)` once it resumes) |
//! | [`reconnect`] | reconnect with an exact `unconfirmed`, delivery before the loss, give-up |
//! | [`placement`] | hugepages `Try` carries messages and reports what it got, `Require` gets them or the typed error, NUMA node 0 and the local node carry messages |
//! | [`hostile`] | hostile bytes from a peer, and a peer silent in the middle of a record, where the fabric reads bytes |
//!
//! Every wait is bounded; the cases of one binary run one at a time ([`serial`]), and every
//! engine idles with backoff, so that at most two threads spin at a time.

// Each test binary instantiates some schemes and uses a part of the helpers.
#![allow(dead_code)]

pub mod block;
pub mod connect;
pub mod failure;
pub mod fifo;
pub mod flow;
pub mod hostile;
pub mod idle;
pub mod peer;
pub mod placement;
pub mod reason;
pub mod reconnect;
pub mod schemes;
pub mod send;

use std::io::Write;
use std::time::Duration;

use spinwire::{Connection, Engine, EngineBuilder, Listener};
use spinwire_testkit::engine::{poller_builder, rtc_builder};
pub use spinwire_testkit::serial;

/// Pool buffer size of the suite's engines.
pub const BUF: usize = 4096;
/// Buffers per connection, and the window (depth).
pub const BUFFERS: usize = 16;
/// The message limit of the suite's engines (the default limit has its own case).
pub const LIMIT: usize = 1 << 20;

/// A raw peer that writes hostile bytes: the engine's side of its connection, and whatever
/// keeps the raw peer alive (a socket, a mapping) until dropped.
pub type HostilePeer = (Connection, Box<dyn std::any::Any>);

/// How a scheme makes a [`HostilePeer`]: through `listener` (of `engine`, on `endpoint`),
/// writing random bytes from `seed`.
pub type MakeHostile = fn(&Engine, &Listener, &str, u64) -> HostilePeer;

/// How a scheme makes a raw peer stopped in the middle of a record ([`Scheme::half_record`]).
pub type MakeHalfRecord = fn(&Engine, &Listener, &str) -> HostilePeer;

/// One scheme: everything a body needs to know about it.
pub struct Scheme {
    /// The scheme's name, also the name of the module its tests are in (`shm`, `tcp`, ...).
    pub name: &'static str,
    /// `Err(reason)` when the scheme cannot run on this machine (then every case skips).
    pub available: fn() -> Result<(), &'static str>,
    /// A fresh endpoint for `tag`, unused by any other case or process.
    pub endpoint: fn(tag: &str) -> String,
    /// The scheme's tweaks to an engine builder (timeouts, slots).
    pub tweak: fn(EngineBuilder) -> EngineBuilder,
    /// The cases it does not support, with the reason.
    pub skips: &'static [(&'static str, &'static str)],
    /// The step of the every-size cases through 1 ..= [`BUF`] (1: every size; the slow
    /// emulated RDMA VM takes every size up to 512 B and then every `step`-th, and `BUF`).
    pub size_step: usize,
    /// Connects a raw peer through `listener` (of `engine`, on `endpoint`) and makes it write
    /// random bytes (from `seed`) where the engine reads records.
    pub hostile: Option<MakeHostile>,
    /// Connects a raw peer through `listener` (of `engine`, on `endpoint`) that completes the
    /// handshake and writes part of a record, then nothing, for a scheme whose records can be
    /// half-sent (a byte stream); `None` where records are published whole.
    pub half_record: Option<MakeHalfRecord>,
    /// How soon a SIGKILLed peer must be seen as disconnected.
    pub death_bound: Duration,
    /// The liveness timeout of the SIGSTOP cases (short, so that they are quick; the default
    /// is 1 s).
    pub liveness: Duration,
    /// How many times slower than native the scheme's test machine is: the stress cases'
    /// message counts are divided by it (the emulated RDMA VM is 10-50x slower).
    pub slow: u32,
    /// Stops (`true`) or resumes (`false`) the connecting end of the latest connection to an
    /// endpoint in this process, as SIGSTOP / SIGCONT would stop its process, for a scheme
    /// whose peers can be stalled in process (`mem://`'s fault injection); `None`: the cases
    /// that need a silent peer stop a child process.
    pub stall: Option<fn(endpoint: &str, stop: bool)>,
    /// Whether the scheme's close carries the reason a side failed the connection for, so that
    /// the peer sees `FabricError::PeerAborted` (else it sees `Error::Disconnected`).
    pub carries_abort: bool,
}

impl Scheme {
    /// A run-to-completion builder: the suite's pool, depth and limit, the scheme's tweaks.
    pub fn rtc(&self) -> EngineBuilder {
        (self.tweak)(
            rtc_builder(BUF, BUFFERS)
                .depth(BUFFERS)
                .max_message_size(LIMIT),
        )
    }

    /// As [`rtc`](Self::rtc), with one dedicated (backoff) poller on `core`.
    pub fn poller(&self, core: usize) -> EngineBuilder {
        (self.tweak)(
            poller_builder(&[core], BUF, BUFFERS)
                .depth(BUFFERS)
                .max_message_size(LIMIT),
        )
    }

    /// Builds `b`.
    ///
    /// # Panics
    ///
    /// If the engine cannot be built.
    pub fn build(&self, b: EngineBuilder) -> Engine {
        b.build()
            .unwrap_or_else(|e| panic!("{} engine: {e}", self.name))
    }

    /// `n` divided by [`slow`](Self::slow).
    pub fn slow_div(&self, n: u32) -> u32 {
        n / self.slow
    }

    /// The exact name of this scheme's role `role` (for [`spinwire_testkit::role::command`]).
    pub fn role(&self, role: &str) -> String {
        format!("{}::{role}", self.name)
    }

    /// Why `case` is skipped on this scheme, if it is.
    pub fn skip_reason(&self, case: &str) -> Option<&'static str> {
        if let Err(why) = (self.available)() {
            return Some(why);
        }
        self.skips.iter().find(|(c, _)| *c == case).map(|(_, r)| *r)
    }
}

/// Runs `body` for case `case` of scheme `s` (from module `module`), or prints why it is
/// skipped: straight to stderr, so that the line shows even while libtest captures output.
///
/// # Panics
///
/// If `module` is not the scheme's module (the role names would be wrong), or the body fails.
pub fn run(s: &'static Scheme, module: &str, case: &str, body: fn(&'static Scheme)) {
    assert!(
        module.rsplit("::").next() == Some(s.name),
        "scheme {} instantiated in module {module}: the module must be named after it",
        s.name
    );
    if let Some(why) = s.skip_reason(case) {
        let _ = writeln!(std::io::stderr(), "SKIP {}/{case}: {why}", s.name);
        return;
    }
    let _g = serial();
    let t0 = std::time::Instant::now();
    body(s);
    // Captured (shown with --nocapture): what each case costs on each scheme.
    eprintln!("conformance {}/{case}: {:?}", s.name, t0.elapsed());
}

/// Prints every skipped case of `s` among `cases` (and checks that each skip names a case).
///
/// # Panics
///
/// If a skip names no case of the suite.
pub fn skip_report(s: &Scheme, cases: &[&str]) {
    for (c, _) in s.skips {
        assert!(cases.contains(c), "{}: skip of unknown case {c}", s.name);
    }
    let skipped: Vec<_> = cases
        .iter()
        .filter_map(|c| s.skip_reason(c).map(|r| (c, r)))
        .collect();
    println!(
        "conformance {}: {} cases, {} run, {} skipped",
        s.name,
        cases.len(),
        cases.len() - skipped.len(),
        skipped.len()
    );
    for (c, r) in skipped {
        println!("SKIP {}/{c}: {r}", s.name);
    }
}

/// Instantiates every case and role of the suite for one scheme: `conformance!(name, SCHEME)`
/// makes `mod name { #[test] fn <case>() ... }` (the scheme's `name` must be the module's).
#[macro_export]
macro_rules! conformance {
    ($name:ident, $scheme:expr) => {
        mod $name {
            use $crate::suite as c;
            const S: &c::Scheme = &$scheme;

            $crate::conformance!(@cases
                fifo_every_size_run_to_completion => c::fifo::every_size_run_to_completion,
                fifo_every_size_dedicated_poller => c::fifo::every_size_dedicated_poller,
                fifo_every_size_two_processes => c::fifo::every_size_two_processes,
                fifo_large_boundaries_and_the_limit => c::fifo::large_boundaries_and_the_limit,
                fifo_default_limit_carried_whole => c::fifo::default_limit_carried_whole,
                fifo_small_and_large_interleaved => c::fifo::small_and_large_interleaved,
                fifo_small_and_large_interleaved_dedicated_poller =>
                    c::fifo::small_and_large_interleaved_dedicated_poller,
                claims_and_aborts => c::send::claims_and_aborts,
                send_batched_stream_fifo_no_loss => c::send::send_batched_stream_fifo_no_loss,
                send_batched_stream_one_engine_contended =>
                    c::send::send_batched_stream_one_engine_contended,
                send_batched_pending_at_close_is_delivered =>
                    c::send::send_batched_pending_at_close_is_delivered,
                send_batched_dedicated_poller_publishes_runs =>
                    c::send::send_batched_dedicated_poller_publishes_runs,
                send_batched_stream_dedicated_poller =>
                    c::send::send_batched_stream_dedicated_poller,
                send_batched_stream_to_a_dedicated_poller =>
                    c::send::send_batched_stream_to_a_dedicated_poller,
                recv_into_copies_or_hands_back => c::send::recv_into_copies_or_hands_back,
                poll_fifo_limit_and_recycling => c::send::poll_fifo_limit_and_recycling,
                poll_handler_panic_recycles => c::send::poll_handler_panic_recycles,
                poll_dedicated_poller => c::send::poll_dedicated_poller,
                held_messages_are_bounded_typed_and_lose_nothing =>
                    c::send::held_messages_are_bounded_typed_and_lose_nothing,
                back_pressure_run_to_completion => c::flow::back_pressure_run_to_completion,
                back_pressure_dedicated_pollers => c::flow::back_pressure_dedicated_pollers,
                send_timeout_without_credits => c::flow::send_timeout_without_credits,
                timeouts_of_any_length_wait_and_never_panic =>
                    c::flow::timeouts_of_any_length_wait_and_never_panic,
                rtc_receiver_that_always_finds_a_message_returns_credit =>
                    c::flow::rtc_receiver_that_always_finds_a_message_returns_credit,
                connect_waits_for_a_listener => c::connect::connect_waits_for_a_listener,
                connect_without_listener_times_out_typed =>
                    c::connect::connect_without_listener_times_out_typed,
                different_message_limits_settle_to_the_smaller =>
                    c::connect::different_message_limits_settle_to_the_smaller,
                listener_connection_maximum => c::connect::listener_connection_maximum,
                dead_connection_fails_every_data_call =>
                    c::failure::dead_connection_fails_every_data_call,
                idle_application_keeps_its_connection =>
                    c::idle::idle_application_keeps_its_connection,
                idle_application_keeps_a_burst_of_connections =>
                    c::idle::idle_application_keeps_a_burst_of_connections,
                block_sleeping_receiver_wakes_run_to_completion =>
                    c::block::sleeping_receiver_wakes_for_one_message_run_to_completion,
                block_sleeping_receiver_wakes_dedicated_poller =>
                    c::block::sleeping_receiver_wakes_for_one_message_dedicated_poller,
                block_sender_never_blocks_on_a_sleeping_receiver =>
                    c::block::sender_never_blocks_on_a_sleeping_receiver,
                block_no_lost_wake_up_over_bursts_and_silences =>
                    c::block::no_lost_wake_up_over_bursts_and_silences,
                peer_close_delivers_queued_then_disconnects =>
                    c::peer::close_delivers_queued_then_disconnects,
                peer_close_surfaces_after_pending_in_poll =>
                    c::peer::close_surfaces_after_pending_in_poll,
                peer_sigkill_run_to_completion => c::peer::sigkill_run_to_completion,
                peer_sigkill_dedicated_poller => c::peer::sigkill_dedicated_poller,
                peer_sigstop_run_to_completion => c::peer::sigstop_run_to_completion,
                peer_sigstop_dedicated_poller => c::peer::sigstop_dedicated_poller,
                disconnect_reasons_reach_both_sides =>
                    c::reason::disconnect_reasons_reach_both_sides,
                reconnect_exact_unconfirmed => c::reconnect::exact_unconfirmed,
                reconnect_delivers_received_before_the_loss =>
                    c::reconnect::delivers_received_before_the_loss,
                reconnect_max_attempts_ends_in_gave_up => c::reconnect::max_attempts_ends_in_gave_up,
                placement_try_carries_messages_and_reports =>
                    c::placement::try_carries_messages_and_reports,
                placement_require_gets_hugepages_or_the_typed_error =>
                    c::placement::require_gets_hugepages_or_the_typed_error,
                placement_numa_node_and_local_carry_messages =>
                    c::placement::numa_node_and_local_carry_messages,
                hostile_bytes_fail_only_their_connection =>
                    c::hostile::bytes_fail_only_their_connection,
                peer_silent_mid_record_is_unresponsive =>
                    c::hostile::silent_mid_record_is_unresponsive,
            );

            $crate::conformance!(@roles
                role_echo => c::fifo::role_echo,
                role_connect_and_wait => c::peer::role_connect_and_wait,
                role_connect_then_report => c::peer::role_connect_then_report,
                role_report_down_reason => c::reason::role_report_down_reason,
                role_server_then_hold => c::reconnect::role_server_then_hold,
                role_echo_server => c::reconnect::role_echo_server,
            );
        }
    };
    (@cases $($case:ident => $body:path),* $(,)?) => {
        /// Every case of the suite, by name.
        pub const CASES: &[&str] = &[$(stringify!($case)),*];
        $(
            #[test]
            fn $case() {
                c::run(S, module_path!(), stringify!($case), $body);
            }
        )*

        /// Prints this scheme's case count and every skipped case with its reason.
        #[test]
        #[ignore = "report: run by scripts/ci/conformance.sh"]
        fn skip_report() {
            c::skip_report(S, CASES);
        }
    };
    (@roles $($role:ident => $body:path),* $(,)?) => {
        $(
            #[test]
            #[ignore = "child role: run by this scheme's process cases"]
            fn $role() {
                $body(S);
            }
        )*
    };
}
