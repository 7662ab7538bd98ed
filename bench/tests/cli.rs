//! The command line: clap's own consistency check, parsing, and every bad-input path that is
//! caught before anything is measured (each must exit non-zero with a clear message, no panic).

use std::process::{Command, Output};
use std::time::Duration;

use clap::{CommandFactory, Parser};
use spinwire_bench::cli::{
    parse_duration, parse_fraction, parse_rate, parse_size, Cli, Command as Sub, CrossKnob,
    LatencyKind, Mode, TestKind,
};

#[test]
fn clap_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn sizes_and_durations_parse() {
    assert_eq!(parse_size("64"), Ok(64));
    assert_eq!(parse_size("4k"), Ok(4096));
    assert_eq!(parse_size("4KiB"), Ok(4096));
    assert_eq!(parse_size("1m"), Ok(1 << 20));
    assert!(parse_size("4q").unwrap_err().contains("suffix"));
    assert!(parse_size("").is_err());
    assert!(parse_size("k").is_err());
    assert!(parse_size("99999999999999999999g").is_err());
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
    assert!(parse_duration("-1s").is_err());
    assert!(parse_duration("2h").is_err());
    assert_eq!(parse_rate("500"), Ok(500));
    assert_eq!(parse_rate("100k"), Ok(100_000));
    assert_eq!(parse_rate("1m"), Ok(1_000_000));
    assert_eq!(parse_rate("2.5M"), Ok(2_500_000));
    assert!(parse_rate("1x").unwrap_err().contains("suffix"));
    assert!(parse_rate("-1").is_err());
    assert_eq!(parse_fraction("5%"), Ok(0.05));
    assert_eq!(parse_fraction("0.1"), Ok(0.1));
    assert!(parse_fraction("ten").is_err());
}

#[test]
fn load_and_compare_flags_parse() {
    let cli = Cli::try_parse_from([
        "bench",
        "load",
        "--rate",
        "1m",
        "--burst",
        "8",
        "--latency",
        "round-trip",
    ])
    .unwrap();
    let Sub::Load(l) = cli.command else {
        panic!("not load")
    };
    assert_eq!(l.common.rate, 1_000_000);
    assert_eq!(l.open_loop.burst, 8);
    assert_eq!(l.open_loop.latency, Some(LatencyKind::RoundTrip));
    assert_eq!(l.size, 64);
    let cli = Cli::try_parse_from(["bench", "sweep", "--rates", "1m,5m,10m"]).unwrap();
    let Sub::Sweep(s) = cli.command else {
        panic!("not sweep")
    };
    assert_eq!(s.rates, vec![1_000_000, 5_000_000, 10_000_000]);
    let cli =
        Cli::try_parse_from(["bench", "compare", "a.json", "b", "--fail-above", "10%"]).unwrap();
    let Sub::Compare(c) = cli.command else {
        panic!("not compare")
    };
    assert_eq!(c.fail_above, Some(0.1));
    assert_eq!(c.threshold, 0.05);
}

#[test]
fn sweep_flags_parse() {
    let cli = Cli::try_parse_from([
        "bench",
        "sweep",
        "--sizes",
        "8,64,4k",
        "--tests",
        "lat",
        "--cross",
        "batch",
        "--values",
        "1,8,32",
        "--mode",
        "dedicated",
        "--poller-cores",
        "1",
    ])
    .unwrap();
    let Sub::Sweep(s) = cli.command else {
        panic!("not sweep")
    };
    assert_eq!(s.sizes, vec![8, 64, 4096]);
    assert_eq!(s.tests, vec![TestKind::Lat]);
    assert_eq!(s.cross, Some(CrossKnob::Batch));
    assert_eq!(s.values, vec![1, 8, 32]);
    assert_eq!(s.common.mode, Mode::Dedicated);
    assert_eq!(s.common.poller_cores, vec![1]);
    // Defaults.
    let cli = Cli::try_parse_from(["bench", "sweep"]).unwrap();
    let Sub::Sweep(s) = cli.command else {
        panic!("not sweep")
    };
    assert_eq!(s.tests, vec![TestKind::Lat, TestKind::Rate]);
    assert_eq!(s.common.mode, Mode::Rtc);
    assert_eq!(s.common.buffer_size, 4096);
    assert!(s.common.role.server.is_none() && s.common.role.client.is_none());
    // --server takes an optional endpoint: without one, the plan picks the fabric's default.
    let cli = Cli::try_parse_from(["bench", "lat", "--server"]).unwrap();
    let Sub::Lat(l) = cli.command else {
        panic!("not lat")
    };
    assert_eq!(l.common.role.server.as_deref(), Some(""));
}

#[test]
fn large_message_flags_parse() {
    assert_eq!(parse_size("16m"), Ok(16 << 20));
    assert_eq!(parse_size("16MiB"), Ok(16 << 20));
    assert_eq!(parse_size("1g"), Ok(1 << 30));
    let cli = Cli::try_parse_from([
        "bench",
        "rate",
        "--size",
        "1m",
        "--max-size",
        "16m",
        "--large-buffers",
        "4",
        "--large-threshold",
        "2k",
        "--verify",
    ])
    .unwrap();
    let Sub::Rate(r) = cli.command else {
        panic!("not rate")
    };
    assert_eq!(r.size, 1 << 20);
    assert_eq!(r.common.max_size, Some(16 << 20));
    assert_eq!(r.common.large_buffers, Some(4));
    assert_eq!(r.common.large_threshold, Some(2048));
    assert!(r.common.verify);
    // Unset: the engine's defaults apply.
    let cli = Cli::try_parse_from(["bench", "lat", "--size", "64k"]).unwrap();
    let Sub::Lat(l) = cli.command else {
        panic!("not lat")
    };
    assert_eq!(l.size, 64 << 10);
    assert_eq!(l.common.max_size, None);
    assert_eq!(l.common.large_buffers, None);
    assert_eq!(l.common.large_threshold, None);
    assert!(!l.common.verify);
    // A sweep's --max-size is the engine's limit and the top of the powers of two; explicit
    // --sizes may go with it.
    let cli = Cli::try_parse_from(["bench", "sweep", "--sizes", "4k,64k,1m", "--max-size", "1M"])
        .unwrap();
    let Sub::Sweep(s) = cli.command else {
        panic!("not sweep")
    };
    assert_eq!(s.sizes, vec![4096, 64 << 10, 1 << 20]);
    assert_eq!(s.common.max_size, Some(1 << 20));
    assert!(Cli::try_parse_from(["bench", "rate", "--max-size", "1x"]).is_err());
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(args)
        .output()
        .expect("run the bench binary")
}

/// Runs `bench args`, expects exit `code` and `needle` in stderr, and no panic.
fn fails(args: &[&str], code: i32, needle: &str) {
    let out = bench(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "bench {args:?}: stderr:\n{stderr}"
    );
    assert!(
        stderr.contains(needle),
        "bench {args:?}: expected `{needle}` in:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "bench {args:?} panicked:\n{stderr}"
    );
}

#[test]
fn help_explains_every_knob() {
    let out = bench(&["lat", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--server",
        "--client",
        "--loopback",
        "--fabric",
        "--size",
        "--iters",
        "--duration",
        "--warmup",
        "--rate",
        "--poller-cores",
        "--app-cores",
        "--mode",
        "--idle",
        "--batch",
        "--depth",
        "--inline-threshold",
        "--signal-every",
        "--buffers",
        "--buffer-size",
        "--max-size",
        "--large-buffers",
        "--large-threshold",
        "--verify",
        "--out",
        "--floor",
        "--liveness-timeout",
    ] {
        assert!(help.contains(flag), "lat --help lacks {flag}");
    }
    let out = bench(&["rate", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--max-size", "--large-buffers", "--large-threshold"] {
        assert!(help.contains(flag), "rate --help lacks {flag}");
    }
    let out = bench(&["floor", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("memcpy"), "floor --help lacks memcpy");
    let out = bench(&["load", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--rate", "--burst", "--latency", "--size", "--out"] {
        assert!(help.contains(flag), "load --help lacks {flag}");
    }
    let out = bench(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "open loop",
        "coordinated omission",
        "hockey stick",
        "compare",
    ] {
        assert!(help.contains(word), "bench --help lacks `{word}`");
    }
    let out = bench(&["compare", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("--fail-above") && help.contains("--threshold"));
    let out = bench(&["sweep", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--sizes",
        "--max-size",
        "--tests",
        "--cross",
        "--values",
        "--no-floor",
        "--rates",
    ] {
        assert!(help.contains(flag), "sweep --help lacks {flag}");
    }
    assert!(bench(&["--version"]).status.success());
}

#[test]
fn bad_values_are_rejected_before_measuring() {
    // mem:// is in-process; --one-thread is a loopback mode for lat and rate.
    fails(
        &["lat", "--fabric", "mem", "--client", "mem://x"],
        1,
        "runs loopback only",
    );
    fails(
        &["lat", "--fabric", "mem", "--server", "mem://x"],
        1,
        "runs loopback only",
    );
    fails(
        &["lat", "--one-thread", "--client", "shm://x"],
        1,
        "--one-thread",
    );
    fails(
        &["load", "--one-thread", "--rate", "1000"],
        1,
        "lat and rate points only",
    );
    // The engine's own bound on the liveness timeout reaches the user unchanged.
    fails(
        &["lat", "--iters", "100", "--liveness-timeout", "10ms"],
        1,
        "liveness timeout 10ms must be zero (off) or at least 80ms",
    );
    // tcp and mem are measured (`cost_measures_the_poller_path_over_mem_and_tcp`); rdma is not.
    fails(&["cost", "--fabric", "rdma"], 1, "--fabric");
    // Sizes go up to --max-size (the engine's default, 16 MiB, without it).
    fails(
        &["lat", "--size", "32m"],
        1,
        "larger than --max-size 16777216",
    );
    fails(
        &["sweep", "--sizes", "8,2m", "--max-size", "1m"],
        1,
        "larger than --max-size 1048576",
    );
    fails(
        &["rate", "--size", "8k", "--large-buffers", "0"],
        1,
        "larger than --buffer-size 4096 and --large-buffers is 0",
    );
    fails(
        &["rate", "--large-threshold", "8k"],
        1,
        "more than --buffer-size 4096",
    );
    fails(&["rate", "--max-size", "0"], 1, "invalid --max-size");
    fails(&["rate", "--max-size", "2g"], 1, "MAX_MESSAGE_SIZE");
    fails(
        &["rate", "--large-buffers", "100000"],
        1,
        "MAX_LARGE_BUFFERS",
    );
    fails(&["sweep", "--sizes", "0"], 1, "at least 1 byte");
    fails(&["load"], 1, "load needs an offered rate");
    fails(
        &["load", "--rate", "1k", "--size", "8"],
        1,
        "at least 24 bytes",
    );
    fails(&["load", "--rate", "1k", "--burst", "0"], 1, "--burst");
    fails(
        &["sweep", "--tests", "load"],
        1,
        "load needs an offered rate",
    );
    fails(&["sweep", "--rates", "0,1k"], 1, "above 0");
    fails(
        &["compare", "/nonexistent/a.json", "/nonexistent/b.json"],
        1,
        "/nonexistent/a.json",
    );
    fails(
        &["lat", "--iters", "0"],
        1,
        "invalid --iters: must be at least 1",
    );
    fails(&["floor", "--iters", "0"], 1, "invalid --iters");
    fails(&["rate", "--duration", "0s"], 1, "--duration");
    fails(
        &["lat", "--app-cores", "4096"],
        1,
        "core 4096 does not exist",
    );
    fails(
        &["lat", "--mode", "dedicated", "--poller-cores", "4097"],
        1,
        "core 4097",
    );
    fails(&["floor", "--app-cores", "0,0"], 1, "two different cores");
    fails(&["rate", "--depth", "512"], 1, "credits cannot exceed");
    fails(&["rate", "--buffers", "0"], 1, "--buffers");
    fails(
        &["lat", "--buffer-size", "16", "--size", "8"],
        1,
        "too small",
    );
    fails(&["lat", "--client", "ftp://x"], 1, "unknown scheme");
    fails(
        &["lat", "--fabric", "shm", "--client", "rdma://10.0.0.1:7471"],
        1,
        "the endpoint's scheme selects the fabric",
    );
    fails(&["lat", "--client", "nonsense"], 1, "expected shm://NAME");
    fails(
        &["sweep", "--cross", "depth", "--values", "1000"],
        1,
        "depth 1000",
    );
    fails(
        &[
            "sweep",
            "--cross",
            "pollers",
            "--values",
            "3",
            "--poller-cores",
            "0",
        ],
        1,
        "3 pollers",
    );
}

#[test]
fn rdma_without_the_feature_is_a_clear_error() {
    if cfg!(feature = "rdma") {
        return;
    }
    fails(
        &["lat", "--fabric", "rdma"],
        1,
        "fabric rdma not compiled in; rebuild with --features rdma",
    );
}

#[test]
fn malformed_flags_are_usage_errors() {
    fails(&["lat", "--size", "4q"], 2, "unknown size suffix");
    fails(&["lat", "--bogus"], 2, "--bogus");
    fails(&["lat", "--mode", "sideways"], 2, "sideways");
    fails(
        &["lat", "--iters", "5", "--duration", "1s"],
        2,
        "cannot be used with",
    );
    fails(
        &["lat", "--server", "--client", "shm://x"],
        2,
        "cannot be used with",
    );
    fails(&["sweep", "--cross", "batch"], 2, "--values");
    fails(&["sweep", "--tests", "lat,bw"], 2, "bw");
    fails(&[], 2, "Usage");
}
