//! `sw_config`: the engine knobs as a plain struct, with [`sw_config_init`] for the defaults.

use std::ffi::c_char;

use spinwire_rs::{
    EngineBuilder, IdleStrategy, DEFAULT_BATCH, DEFAULT_BUFFERS, DEFAULT_BUFFER_SIZE,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_LARGE_BUFFERS, DEFAULT_LIVENESS_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS_PER_POLLER, DEFAULT_MAX_MESSAGE_SIZE, INLINE_MAX, MAX_BATCH,
    MAX_BUFFERS, MAX_BUFFER_SIZE, MAX_LARGE_BUFFERS, MAX_MESSAGE_SIZE, MIN_LIVENESS_TIMEOUT,
};

use crate::error::{fail_msg, guard, SW_BAD_CONFIG, SW_OK};
use crate::handle::{c_str, out_ptr, timeout};

/// Idle strategy: spin with a CPU relax hint (lowest latency; burns the core). The default.
pub const SW_IDLE_BUSY_SPIN: u32 = 0;
/// Idle strategy: spin, then yield, then park for 1 us doubling up to 1 ms (for shared cores).
pub const SW_IDLE_BACKOFF: u32 = 1;
/// Idle strategy: spin 50 us, then sleep in the kernel (for at most 100 ms at a time) until an
/// arrival wakes the thread: no CPU while idle, a kernel wake-up's latency after a silence.
/// `sw_wait` and the waits inside the calls sleep this way.
pub const SW_IDLE_BLOCK: u32 = 2;

/// Largest `sw_config.inline_threshold`, in bytes.
pub const SW_INLINE_MAX: usize = 120;
/// Largest `sw_config.buffer_size`, in bytes (1 GiB).
pub const SW_MAX_BUFFER_SIZE: usize = 1_073_741_824;
/// Largest `sw_config.buffers`.
pub const SW_MAX_BUFFERS: usize = 65_536;
/// Largest `sw_config.batch`.
pub const SW_MAX_BATCH: usize = 256;
/// Largest `sw_config.max_message_size`, in bytes (1 GiB).
pub const SW_MAX_MESSAGE_SIZE: usize = 1_073_741_824;
/// Largest `sw_config.large_buffers`.
pub const SW_MAX_LARGE_BUFFERS: usize = 4096;
/// Largest `sw_config.max_connections_per_poller`.
pub const SW_MAX_CONNECTIONS_PER_POLLER: usize = 1_048_576;
/// Smallest non-zero `sw_config.liveness_timeout_ns` (80 ms).
pub const SW_MIN_LIVENESS_TIMEOUT_NS: u64 = 80_000_000;

// The C constants are literals (cbindgen does not read the engine crate); they are the
// engine's limits.
const _: () = assert!(SW_INLINE_MAX == INLINE_MAX);
const _: () = assert!(SW_MAX_BUFFER_SIZE == MAX_BUFFER_SIZE);
const _: () = assert!(SW_MAX_BUFFERS == MAX_BUFFERS);
const _: () = assert!(SW_MAX_BATCH == MAX_BATCH);
const _: () = assert!(SW_MAX_MESSAGE_SIZE == MAX_MESSAGE_SIZE);
const _: () = assert!(SW_MAX_LARGE_BUFFERS == MAX_LARGE_BUFFERS);
const _: () = assert!(SW_MIN_LIVENESS_TIMEOUT_NS as u128 == MIN_LIVENESS_TIMEOUT.as_nanos());

/// Engine configuration. Fill it with `sw_config_init`, then change what you need.
///
/// The defaults are the Rust `EngineBuilder`'s: run-to-completion (no poller thread), busy spin,
/// 256 buffers of 4096 bytes per connection and direction, depth `min(128, buffers)` (tcp: what
/// its 1-MiB byte window holds, 65536), batch 128,
/// inline threshold 120 bytes, connect timeout 5 s, 1024 connections per poller, liveness
/// timeout 1 s, messages up to 16 MiB through 2 large slots.
///
/// Every range below is checked by `sw_engine_new`: a value outside it fails with
/// `SW_BAD_CONFIG`, and `sw_errmsg()` names the field and its range.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct sw_config {
    /// Bytes per buffer, 1 to `SW_MAX_BUFFER_SIZE` (shm rounds it up to a multiple of 64): the
    /// largest message sent through a pool buffer.
    pub buffer_size: usize,
    /// Buffers per connection and direction, 1 to `SW_MAX_BUFFERS`.
    pub buffers: usize,
    /// Credits: most messages in flight per connection, 1 to `buffers`; 0 means
    /// `min(128, buffers)`, and on tcp what its byte window holds of 16-byte records (65536
    /// at the defaults).
    pub depth: usize,
    /// Most sends queued before a send runs a poller cycle itself (run-to-completion), and most
    /// work items a poller moves per connection per step: 1 to `SW_MAX_BATCH`.
    pub batch: usize,
    /// Messages up to this many bytes travel inside the descriptor (on shm, in the ring record):
    /// 0 to `SW_INLINE_MAX`; the engine also caps it at `buffer_size`.
    pub inline_threshold: usize,
    /// `SW_IDLE_BUSY_SPIN`, `SW_IDLE_BACKOFF` or `SW_IDLE_BLOCK`: what pollers and waiting
    /// calls do when idle.
    pub idle: u32,
    /// Default timeout of `sw_connect` (used when its `timeout_ns` is 0): at least 1.
    pub connect_timeout_ns: u64,
    /// A peer silent this long fails its connection (`SW_CONN_FAILED`): 0 (liveness off) or at
    /// least `SW_MIN_LIVENESS_TIMEOUT_NS`.
    pub liveness_timeout_ns: u64,
    /// Most connections one poller serves, 1 to `SW_MAX_CONNECTIONS_PER_POLLER`.
    pub max_connections_per_poller: usize,
    /// Core ids of dedicated poller threads (one pinned thread each), `poller_count` of them,
    /// distinct and below the host's CPU count; NULL / 0 means run-to-completion (the
    /// application thread drives the poller inside the data-path calls and `sw_engine_poll`).
    pub poller_cores: *const usize,
    /// Entries of `poller_cores`.
    pub poller_count: usize,
    /// Prefix of the engine's thread names (UTF-8); NULL means `"spinwire"`.
    pub name: *const c_char,
    /// The largest message, 1 to `SW_MAX_MESSAGE_SIZE` (default 16 MiB): one above
    /// `buffer_size` travels through a large slot (`sw_offer` and `sw_try_claim` pick it by
    /// length). At or below `buffer_size`, or with `large_buffers` 0, the limit is
    /// `buffer_size`.
    pub max_message_size: usize,
    /// Large slots of `max_message_size` bytes per connection and direction, 0 to
    /// `SW_MAX_LARGE_BUFFERS` (default 2): how many large messages may be in flight at once.
    /// Memory per connection: `2 * large_buffers * max_message_size` more.
    pub large_buffers: usize,
}

impl Default for sw_config {
    fn default() -> Self {
        sw_config {
            buffer_size: DEFAULT_BUFFER_SIZE,
            buffers: DEFAULT_BUFFERS,
            depth: 0,
            batch: DEFAULT_BATCH,
            inline_threshold: INLINE_MAX,
            idle: SW_IDLE_BUSY_SPIN,
            connect_timeout_ns: DEFAULT_CONNECT_TIMEOUT.as_nanos() as u64,
            liveness_timeout_ns: DEFAULT_LIVENESS_TIMEOUT.as_nanos() as u64,
            max_connections_per_poller: DEFAULT_MAX_CONNECTIONS_PER_POLLER,
            poller_cores: std::ptr::null(),
            poller_count: 0,
            name: std::ptr::null(),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            large_buffers: DEFAULT_LARGE_BUFFERS,
        }
    }
}

/// Fills `cfg` with the defaults. Returns `SW_OK`, or `SW_BAD_ARG` when `cfg` is NULL.
///
/// # Safety
///
/// `cfg` is NULL or points to writable memory for one `sw_config`.
#[must_use]
#[no_mangle]
pub unsafe extern "C" fn sw_config_init(cfg: *mut sw_config) -> i32 {
    guard("sw_config_init", || {
        if let Err(c) = out_ptr("sw_config_init", "cfg", cfg) {
            return c;
        }
        // SAFETY: non-null, aligned, writable per the contract; `write` does not read the old
        // (possibly uninitialised) value.
        unsafe { cfg.write(sw_config::default()) };
        SW_OK
    })
}

/// The builder for `cfg`; also what `idle` and the pointers say.
///
/// # Safety
///
/// `cfg.poller_cores` is NULL or points to `cfg.poller_count` readable `usize`s; `cfg.name` is
/// NULL or a valid NUL-terminated string.
pub(crate) unsafe fn builder(what: &str, cfg: &sw_config) -> Result<EngineBuilder, i32> {
    check_ranges(what, cfg)?;
    let idle = match cfg.idle {
        SW_IDLE_BUSY_SPIN => IdleStrategy::BusySpin,
        SW_IDLE_BACKOFF => IdleStrategy::backoff(),
        SW_IDLE_BLOCK => IdleStrategy::block(),
        other => {
            return Err(fail_msg(
                what,
                SW_BAD_CONFIG,
                &format!("sw_config.idle = {other} is out of range: must be SW_IDLE_BUSY_SPIN (0), SW_IDLE_BACKOFF (1) or SW_IDLE_BLOCK (2)"),
            ))
        }
    };
    let mut b = EngineBuilder::default()
        .idle(idle)
        .pool(cfg.buffer_size, cfg.buffers)
        .batch(cfg.batch)
        .inline_threshold(cfg.inline_threshold)
        .connect_timeout(timeout(cfg.connect_timeout_ns))
        .liveness_timeout(timeout(cfg.liveness_timeout_ns))
        .max_connections_per_poller(cfg.max_connections_per_poller)
        .max_message_size(cfg.max_message_size)
        .large_buffers(cfg.large_buffers);
    if cfg.depth != 0 {
        b = b.depth(cfg.depth);
    }
    if cfg.poller_count > 0 {
        if cfg.poller_cores.is_null() || !cfg.poller_cores.is_aligned() {
            return Err(fail_msg(
                what,
                SW_BAD_CONFIG,
                "poller_count > 0 but poller_cores is NULL or misaligned",
            ));
        }
        // SAFETY: non-null, aligned, `poller_count` readable entries per the contract.
        let cores = unsafe { std::slice::from_raw_parts(cfg.poller_cores, cfg.poller_count) };
        b = b.pollers(cores);
    } else {
        b = b.run_to_completion();
    }
    if !cfg.name.is_null() {
        // SAFETY: non-null and NUL-terminated per the contract.
        let name = unsafe { c_str(what, "cfg->name", cfg.name) }?;
        b = b.name(name);
    }
    Ok(b)
}

/// Checks every documented range of `cfg` (the engine checks them too, in its own terms): a
/// value outside fails with `SW_BAD_CONFIG` naming the `sw_config` field and its range.
fn check_ranges(what: &str, cfg: &sw_config) -> Result<(), i32> {
    let out = |field: &str, value: &dyn std::fmt::Display, range: &str| {
        Err(fail_msg(
            what,
            SW_BAD_CONFIG,
            &format!("sw_config.{field} = {value} is out of range: must be {range}"),
        ))
    };
    let within = |v: usize, lo: usize, hi: usize| (lo..=hi).contains(&v);
    if !within(cfg.buffer_size, 1, SW_MAX_BUFFER_SIZE) {
        return out(
            "buffer_size",
            &cfg.buffer_size,
            &format!("1 to {SW_MAX_BUFFER_SIZE}"),
        );
    }
    if !within(cfg.buffers, 1, SW_MAX_BUFFERS) {
        return out("buffers", &cfg.buffers, &format!("1 to {SW_MAX_BUFFERS}"));
    }
    if cfg.depth > cfg.buffers {
        return out(
            "depth",
            &cfg.depth,
            &format!("0 (automatic) or 1 to buffers ({})", cfg.buffers),
        );
    }
    if !within(cfg.batch, 1, SW_MAX_BATCH) {
        return out("batch", &cfg.batch, &format!("1 to {SW_MAX_BATCH}"));
    }
    if cfg.inline_threshold > SW_INLINE_MAX {
        return out(
            "inline_threshold",
            &cfg.inline_threshold,
            &format!("0 to {SW_INLINE_MAX}"),
        );
    }
    if cfg.connect_timeout_ns == 0 {
        return out("connect_timeout_ns", &0, "at least 1");
    }
    if cfg.liveness_timeout_ns != 0 && cfg.liveness_timeout_ns < SW_MIN_LIVENESS_TIMEOUT_NS {
        return out(
            "liveness_timeout_ns",
            &cfg.liveness_timeout_ns,
            &format!("0 (off) or at least {SW_MIN_LIVENESS_TIMEOUT_NS}"),
        );
    }
    if !within(
        cfg.max_connections_per_poller,
        1,
        SW_MAX_CONNECTIONS_PER_POLLER,
    ) {
        return out(
            "max_connections_per_poller",
            &cfg.max_connections_per_poller,
            &format!("1 to {SW_MAX_CONNECTIONS_PER_POLLER}"),
        );
    }
    if !within(cfg.max_message_size, 1, SW_MAX_MESSAGE_SIZE) {
        return out(
            "max_message_size",
            &cfg.max_message_size,
            &format!("1 to {SW_MAX_MESSAGE_SIZE}"),
        );
    }
    if cfg.large_buffers > SW_MAX_LARGE_BUFFERS {
        return out(
            "large_buffers",
            &cfg.large_buffers,
            &format!("0 to {SW_MAX_LARGE_BUFFERS}"),
        );
    }
    Ok(())
}
