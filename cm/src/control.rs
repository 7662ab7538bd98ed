//! The control thread: connection setup and teardown, off the data path.
//!
//! spinwire splits every connection's life in two (Aeron's conductor / eRPC's session-management
//! thread): *setup and teardown* (rendezvous, segment creation, rdma_cm, hang-up detection) run here,
//! on one control thread per engine that is allowed to block in `poll(2)` and make syscalls; the
//! *data path* runs on pollers that never do. The two talk only through rings owned by the engine.
//!
//! This module is fabric-neutral: it knows nothing about shared memory or verbs. The engine plugs in a
//! [`Backend`] that owns the fabric setup state. The control thread runs this loop:
//!
//! 1. drain the request queue ([`ControlHandle::request`]) into [`Backend::on_request`];
//! 2. ask the backend for the file descriptors it waits on ([`Backend::fds`]: listening sockets,
//!    rendezvous sockets watched for hang-up, an rdma_cm event channel) and `poll(2)` them together
//!    with the thread's own wake-up eventfd, until [`Backend::tick`]'s deadline (the next instant
//!    any timed work is due; with none, until woken, capped at [`MAX_SLEEP`] as a safety net);
//! 3. hand the ready descriptors to [`Backend::on_ready`];
//! 4. call [`Backend::tick`] for timed work (handshake deadlines, heartbeats, liveness checks,
//!    close grace timers, notices from pollers).
//!
//! There is no fixed period: the thread sleeps until something is due or until it is woken. On a
//! machine whose cores are all owned by busy-polling threads, every wake-up of this thread
//! preempts a spinner (that is the ping-pong's tail), so anything that needs the thread's
//! attention wakes it through its eventfd instead of waiting for a periodic turn: requests
//! ([`ControlHandle::request`]) and pollers' notices ([`Waker::wake`], one `write(2)` per
//! notice: notices are per-connection events, never per message).
//! Nothing here is on the data path: a poller never calls into this module except
//! [`Waker::wake`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest the control thread sleeps in `poll(2)` before it runs [`Backend::tick`] again,
/// even with nothing due: a safety net, not a period (timed work sets its own deadline through
/// [`Backend::tick`], and everything else wakes the thread).
pub const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Errors of the control thread itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// Creating the wake-up eventfd failed.
    #[error("eventfd failed")]
    EventFd(#[source] io::Error),
    /// Spawning the thread failed.
    #[error("spawning the control thread failed")]
    Spawn(#[source] io::Error),
    /// The control thread has stopped (engine shut down or the backend panicked).
    #[error("control thread is gone")]
    Gone,
}

/// The fabric-specific half of the control thread, provided by the engine.
///
/// Every method runs on the control thread, which may block briefly (the loop waits in `poll(2)`
/// between calls). A backend must bound every blocking call it makes itself, since a stuck backend
/// delays hang-up detection of every connection.
pub trait Backend: Send + 'static {
    /// A request from an application thread (listen, connect, close, ...).
    type Request: Send + 'static;

    /// Handles one request.
    fn on_request(&mut self, request: Self::Request, now: Instant);

    /// Appends the descriptors to wait on; `events` as for `poll(2)` (`POLLIN`, ...). The indices
    /// given to [`on_ready`](Backend::on_ready) match the order pushed here.
    fn fds(&mut self, fds: &mut Vec<libc::pollfd>);

    /// Called after `poll(2)` with the same descriptors and their `revents` filled in (only when at
    /// least one is ready).
    fn on_ready(&mut self, fds: &[libc::pollfd], now: Instant);

    /// Timed work, run once per loop iteration (every wake-up). Returns how long the thread may
    /// sleep before the next timed work is due (`None`: nothing is due; the thread sleeps until
    /// woken, or [`MAX_SLEEP`]). The thread wakes no earlier than that unless a descriptor or
    /// the waker fires, so work that is not timed must wake it ([`ControlHandle::wake`],
    /// [`Waker::wake`]).
    fn tick(&mut self, now: Instant) -> Option<Duration>;

    /// The thread is stopping: release everything.
    fn on_shutdown(&mut self);
}

/// Wakes the control thread out of `poll(2)` (an eventfd).
///
/// Made before the thread ([`ControlThread::spawn_with_waker`]) so that threads which exist
/// before it (pollers) can hold it: a poller wakes the control thread when it leaves a notice
/// for it, instead of the notice waiting for a periodic turn.
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// A new eventfd waker.
    ///
    /// # Errors
    ///
    /// [`ControlError::EventFd`] when `eventfd(2)` fails.
    pub fn new() -> Result<Waker, ControlError> {
        // SAFETY: eventfd takes no pointers; the return value is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(ControlError::EventFd(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker { fd })
    }

    /// Wakes the thread (one `write(2)`; a wake-up already pending absorbs it).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A full counter (EAGAIN) means a
        // wake-up is already pending, which is all we want, so the result is ignored.
        unsafe {
            libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd.
        unsafe {
            libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A cloneable, thread-safe handle for sending requests to the control thread.
pub struct ControlHandle<R> {
    tx: mpsc::Sender<R>,
    waker: Arc<Waker>,
}

impl<R> Clone for ControlHandle<R> {
    fn clone(&self) -> Self {
        ControlHandle {
            tx: self.tx.clone(),
            waker: self.waker.clone(),
        }
    }
}

impl<R> std::fmt::Debug for ControlHandle<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlHandle").finish_non_exhaustive()
    }
}

impl<R: Send + 'static> ControlHandle<R> {
    /// Queues a request and wakes the control thread.
    ///
    /// # Errors
    ///
    /// [`ControlError::Gone`] when the control thread has stopped; the request is dropped.
    pub fn request(&self, request: R) -> Result<(), ControlError> {
        self.tx.send(request).map_err(|_| ControlError::Gone)?;
        self.waker.wake();
        Ok(())
    }

    /// Wakes the control thread so it runs [`Backend::tick`] now.
    pub fn wake(&self) {
        self.waker.wake();
    }
}

/// The running control thread. Dropping it stops and joins the thread.
pub struct ControlThread<R> {
    handle: ControlHandle<R>,
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
}

impl<R> std::fmt::Debug for ControlThread<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlThread")
            .field("running", &self.join.is_some())
            .finish()
    }
}

impl<R: Send + 'static> ControlThread<R> {
    /// Spawns the control thread (named `name`) running `backend`.
    ///
    /// # Errors
    ///
    /// [`ControlError::EventFd`] or [`ControlError::Spawn`].
    pub fn spawn<B>(name: &str, backend: B) -> Result<ControlThread<R>, ControlError>
    where
        B: Backend<Request = R>,
    {
        Self::spawn_with_waker(name, backend, Arc::new(Waker::new()?))
    }

    /// As [`spawn`](Self::spawn), with a waker made beforehand (and shared with the threads
    /// that must be able to wake this one).
    ///
    /// # Errors
    ///
    /// [`ControlError::Spawn`].
    pub fn spawn_with_waker<B>(
        name: &str,
        backend: B,
        waker: Arc<Waker>,
    ) -> Result<ControlThread<R>, ControlError>
    where
        B: Backend<Request = R>,
    {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let thread_waker = waker.clone();
        let thread_stop = stop.clone();
        let join = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(backend, rx, &thread_waker, &thread_stop))
            .map_err(ControlError::Spawn)?;
        Ok(ControlThread {
            handle: ControlHandle { tx, waker },
            stop,
            join: Some(join),
        })
    }

    /// A handle for sending requests.
    pub fn handle(&self) -> ControlHandle<R> {
        self.handle.clone()
    }

    /// Stops the thread (after it calls [`Backend::on_shutdown`]) and joins it. Idempotent.
    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.handle.waker.wake();
        if let Some(join) = self.join.take() {
            // A panicking backend already printed its message; nothing more to report here.
            let _ = join.join();
        }
    }
}

impl<R> Drop for ControlThread<R> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.handle.waker.wake();
        if let Some(join) = self.join.take() {
            let _ = join.join();
        }
    }
}

fn run<B: Backend>(
    mut backend: B,
    rx: mpsc::Receiver<B::Request>,
    waker: &Waker,
    stop: &AtomicBool,
) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(64);
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        while let Ok(req) = rx.try_recv() {
            backend.on_request(req, now);
        }
        let sleep = backend.tick(now).unwrap_or(MAX_SLEEP).min(MAX_SLEEP);
        fds.clear();
        fds.push(libc::pollfd {
            fd: waker.raw(),
            events: libc::POLLIN,
            revents: 0,
        });
        backend.fds(&mut fds);
        let timeout_ms = timeout_ms(sleep);
        let nfds = libc::nfds_t::try_from(fds.len()).unwrap_or(libc::nfds_t::MAX);
        // SAFETY: `fds` is a live, initialised array of `nfds` pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout_ms) };
        if n > 0 {
            if fds[0].revents != 0 {
                waker.clear();
            }
            if fds[1..].iter().any(|p| p.revents != 0) {
                backend.on_ready(&fds[1..], Instant::now());
            }
        }
        // EINTR and friends: just loop again.
    }
    backend.on_shutdown();
}

/// `poll(2)`'s timeout for `sleep`, rounded *up* to whole milliseconds: rounding down would wake
/// the thread just before the deadline, find nothing due and turn again at once.
fn timeout_ms(sleep: Duration) -> i32 {
    let ms = sleep.as_nanos().div_ceil(1_000_000);
    i32::try_from(ms).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::Sender;

    struct Echo {
        out: Sender<u32>,
        ticks: u32,
    }

    impl Backend for Echo {
        type Request = u32;
        fn on_request(&mut self, request: u32, _now: Instant) {
            let _ = self.out.send(request * 2);
        }
        fn fds(&mut self, _fds: &mut Vec<libc::pollfd>) {}
        fn on_ready(&mut self, _fds: &[libc::pollfd], _now: Instant) {}
        fn tick(&mut self, _now: Instant) -> Option<Duration> {
            self.ticks += 1;
            Some(Duration::from_secs(5))
        }
        fn on_shutdown(&mut self) {
            let _ = self.out.send(u32::MAX);
        }
    }

    #[test]
    fn requests_wake_the_thread_and_shutdown_joins() {
        let (out, results) = mpsc::channel();
        let mut ct = ControlThread::spawn("test-control", Echo { out, ticks: 0 }).unwrap();
        let h = ct.handle();
        let t0 = Instant::now();
        h.request(21).unwrap();
        assert_eq!(results.recv_timeout(Duration::from_secs(5)).unwrap(), 42);
        // Woken by the eventfd, not by the (capped) poll timeout.
        assert!(t0.elapsed() < Duration::from_secs(5));
        ct.shutdown();
        assert_eq!(
            results.recv_timeout(Duration::from_secs(5)).unwrap(),
            u32::MAX
        );
        assert!(matches!(h.request(1), Err(ControlError::Gone)));
    }

    /// Counts its ticks; sleeps `every` between them (`None`: until woken).
    struct Counting {
        ticks: Arc<std::sync::atomic::AtomicU32>,
        every: Option<Duration>,
    }

    impl Backend for Counting {
        type Request = ();
        fn on_request(&mut self, _request: (), _now: Instant) {}
        fn fds(&mut self, _fds: &mut Vec<libc::pollfd>) {}
        fn on_ready(&mut self, _fds: &[libc::pollfd], _now: Instant) {}
        fn tick(&mut self, _now: Instant) -> Option<Duration> {
            self.ticks.fetch_add(1, Ordering::Relaxed);
            self.every
        }
        fn on_shutdown(&mut self) {}
    }

    fn counting(every: Option<Duration>) -> (ControlThread<()>, Arc<std::sync::atomic::AtomicU32>) {
        let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let backend = Counting {
            ticks: ticks.clone(),
            every,
        };
        (ControlThread::spawn("test-quiet", backend).unwrap(), ticks)
    }

    #[test]
    fn with_nothing_due_the_thread_sleeps_until_woken() {
        let (mut ct, ticks) = counting(None);
        std::thread::sleep(Duration::from_millis(300));
        // The first turn only: no period (a loaded machine can only make it fewer).
        assert_eq!(ticks.load(Ordering::Relaxed), 1);
        let h = ct.handle();
        h.wake();
        let end = Instant::now() + Duration::from_secs(5);
        while ticks.load(Ordering::Relaxed) < 2 {
            assert!(Instant::now() < end, "wake() did not run a tick");
            std::thread::sleep(Duration::from_millis(1));
        }
        ct.shutdown();
    }

    #[test]
    fn the_thread_wakes_at_the_deadline_tick_asks_for() {
        let (mut ct, ticks) = counting(Some(Duration::from_millis(50)));
        std::thread::sleep(Duration::from_millis(500));
        let n = ticks.load(Ordering::Relaxed);
        ct.shutdown();
        // About 11 (one every 50 ms, never earlier); late wake-ups on a loaded machine make
        // fewer, never more.
        assert!(
            (2..=12).contains(&n),
            "{n} ticks in 500 ms at a 50-ms deadline"
        );
    }

    #[test]
    fn poll_timeouts_round_up() {
        assert_eq!(timeout_ms(Duration::ZERO), 0);
        assert_eq!(timeout_ms(Duration::from_nanos(1)), 1);
        assert_eq!(timeout_ms(Duration::from_millis(83)), 83);
        assert_eq!(timeout_ms(Duration::from_micros(83_334)), 84);
        assert_eq!(timeout_ms(Duration::from_secs(1 << 40)), i32::MAX);
    }
}
