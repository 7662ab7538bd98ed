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
//!    with the thread's own wake-up eventfd, for at most [`Backend::tick`]'s answer (capped at
//!    [`MAX_SLEEP`]);
//! 3. hand the ready descriptors to [`Backend::on_ready`];
//! 4. call [`Backend::tick`] for timed work (connect deadlines, heartbeats, rings from pollers).
//!
//! Requests wake the thread through an eventfd, so a `connect` does not wait for the poll timeout.
//! Nothing here is on the data path: a poller never calls into this module.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest the control thread sleeps in `poll(2)` before it runs [`Backend::tick`] again.
pub const MAX_SLEEP: Duration = Duration::from_millis(20);

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

    /// Timed work, run every loop iteration. Returns how long the thread may sleep before the next
    /// call (`None`: up to [`MAX_SLEEP`]).
    fn tick(&mut self, now: Instant) -> Option<Duration>;

    /// The thread is stopping: release everything.
    fn on_shutdown(&mut self);
}

/// Wakes the control thread out of `poll(2)` (an eventfd).
#[derive(Debug)]
struct Waker {
    fd: OwnedFd,
}

impl Waker {
    fn new() -> Result<Waker, ControlError> {
        // SAFETY: eventfd takes no pointers; the return value is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(ControlError::EventFd(io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker { fd })
    }

    fn wake(&self) {
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
        let waker = Arc::new(Waker::new()?);
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
        let timeout_ms = i32::try_from(sleep.as_millis()).unwrap_or(i32::MAX);
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
}
