//! The few OS calls `bench` makes itself (all of its `unsafe` lives here): the host-wide
//! monotonic clock that timestamps open-loop messages, per-thread CPU use, and the whole
//! process's context switches.

use serde::{Deserialize, Serialize};

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every thread and process on this host, so a
/// timestamp written by a sender in one process can be subtracted from one read by a receiver
/// in another (one-way latency). It means nothing on another host.
#[inline]
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux, and
    // clock_gettime writes only through the pointer it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// CPU use of one thread over an interval (`getrusage(RUSAGE_THREAD)`), as written to
/// `summary.json` (`cpu.client`, `cpu.server`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadCpu {
    /// Seconds spent in user mode.
    pub user_s: f64,
    /// Seconds spent in the kernel.
    pub system_s: f64,
    /// Voluntary context switches (the thread blocked or slept).
    pub voluntary_csw: u64,
    /// Involuntary context switches (the scheduler took the core away: descheduled).
    pub involuntary_csw: u64,
}

impl ThreadCpu {
    /// The calling thread's totals so far (zeros where the OS cannot tell).
    pub fn now() -> Self {
        // SAFETY: rusage is plain old data; all-zero bytes are a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `ru` is a valid, writable rusage; RUSAGE_THREAD asks for the calling
        // thread only, and getrusage writes only through the pointer it is given.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        if rc != 0 {
            return Self::default();
        }
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        Self {
            user_s: secs(ru.ru_utime),
            system_s: secs(ru.ru_stime),
            voluntary_csw: ru.ru_nvcsw as u64,
            involuntary_csw: ru.ru_nivcsw as u64,
        }
    }

    /// `self - before`, field by field (saturating at zero).
    pub fn since(&self, before: &Self) -> Self {
        Self {
            user_s: (self.user_s - before.user_s).max(0.0),
            system_s: (self.system_s - before.system_s).max(0.0),
            voluntary_csw: self.voluntary_csw.saturating_sub(before.voluntary_csw),
            involuntary_csw: self.involuntary_csw.saturating_sub(before.involuntary_csw),
        }
    }

    /// Encodes as 32 bytes (user and system time in nanoseconds, then the two switch counts),
    /// for the protocol's RESULT message.
    pub fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&((self.user_s * 1e9) as u64).to_le_bytes());
        b[8..16].copy_from_slice(&((self.system_s * 1e9) as u64).to_le_bytes());
        b[16..24].copy_from_slice(&self.voluntary_csw.to_le_bytes());
        b[24..32].copy_from_slice(&self.involuntary_csw.to_le_bytes());
        b
    }

    /// Decodes [`Self::encode`]'s bytes.
    pub fn decode(b: &[u8; 32]) -> Self {
        let at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        Self {
            user_s: at(0) as f64 / 1e9,
            system_s: at(8) as f64 / 1e9,
            voluntary_csw: at(16),
            involuntary_csw: at(24),
        }
    }
}

/// Context switches of the whole process over one point (`getrusage(RUSAGE_SELF)`: every thread,
/// the app threads, pollers and the engines' control threads included), as written to
/// `summary.json` (`process`).
///
/// With every core owned by a busy-polling thread, an involuntary switch is a spinner
/// preempted (by a control thread's wake-up, another process, a kernel thread): the usual cause
/// of a ping-pong's p99.9 tail. The rate makes runs of different lengths comparable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessCsw {
    /// Voluntary context switches (a thread blocked or slept).
    pub voluntary_csw: u64,
    /// Involuntary context switches (the scheduler took a core away from a thread).
    pub involuntary_csw: u64,
    /// The window they were counted over, seconds.
    pub elapsed_s: f64,
    /// `involuntary_csw / elapsed_s`.
    pub involuntary_csw_per_sec: f64,
}

/// The process's context-switch totals so far, `(voluntary, involuntary)` (zeros where the OS
/// cannot tell).
pub fn process_csw_now() -> (u64, u64) {
    // SAFETY: rusage is plain old data; all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage; RUSAGE_SELF asks for the whole process, and
    // getrusage writes only through the pointer it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return (0, 0);
    }
    (ru.ru_nvcsw as u64, ru.ru_nivcsw as u64)
}

impl ProcessCsw {
    /// The switches between `before` (from [`process_csw_now`]) and now, over `elapsed`.
    pub fn since(before: (u64, u64), elapsed: std::time::Duration) -> Self {
        let (v, iv) = process_csw_now();
        let involuntary_csw = iv.saturating_sub(before.1);
        let elapsed_s = elapsed.as_secs_f64();
        Self {
            voluntary_csw: v.saturating_sub(before.0),
            involuntary_csw,
            elapsed_s,
            involuntary_csw_per_sec: if elapsed_s > 0.0 {
                involuntary_csw as f64 / elapsed_s
            } else {
                0.0
            },
        }
    }
}

/// CPU use of both sides' app threads over one point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    /// The client's measuring thread (the sender; in round-trip load, also the receiver).
    pub client: ThreadCpu,
    /// The server's thread (echoer, counter, or one-way receiver), as it reported it.
    pub server: Option<ThreadCpu>,
}

/// Sleeps while `word` holds `expected`, at most `timeout` (`FUTEX_WAIT_PRIVATE`): returns when
/// woken by [`futex_wake`], when `word` no longer holds `expected` (at once), on a signal or at
/// the timeout. The caller re-reads `word`; every return may be spurious.
pub fn futex_wait(
    word: &std::sync::atomic::AtomicU32,
    expected: u32,
    timeout: std::time::Duration,
) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned 32-bit atomic for the whole call (a borrow), the kernel
    // only reads it; `ts` is a valid relative timeout; the unused arguments are ignored by
    // FUTEX_WAIT. The result (0, EAGAIN, ETIMEDOUT, EINTR) needs no handling: callers re-check.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes one thread asleep in [`futex_wait`] on `word` (`FUTEX_WAKE_PRIVATE`).
pub fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: `word` is a live, aligned 32-bit atomic (a borrow); FUTEX_WAKE only uses its
    // address as a key and reads nothing else through the pointers.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1i32,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_moves_and_cpu_counts() {
        let a = mono_ns();
        let c0 = ThreadCpu::now();
        let mut x = 0u64;
        while mono_ns() < a + 20_000_000 {
            x = x.wrapping_add(1);
        }
        std::hint::black_box(x);
        let d = ThreadCpu::now().since(&c0);
        assert!(d.user_s + d.system_s > 0.0, "{d:?}");
        assert_eq!(
            ThreadCpu::decode(&d.encode()).voluntary_csw,
            d.voluntary_csw
        );
        let r = ThreadCpu::decode(&d.encode());
        assert!((r.user_s - d.user_s).abs() < 1e-6);
    }

    #[test]
    fn process_switches_count_a_sleep() {
        let before = process_csw_now();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let d = ProcessCsw::since(before, std::time::Duration::from_millis(5));
        // The sleep blocked this thread at least once.
        assert!(d.voluntary_csw >= 1, "{d:?}");
        assert!((d.involuntary_csw_per_sec - d.involuntary_csw as f64 / 0.005).abs() < 1e-6);
    }
}
