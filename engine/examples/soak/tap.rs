//! [`EventTap`]: an engine's events, taken as they come on a thread of their own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use spinwire::{Engine, Event};

/// Takes the engine's events on a thread of its own as they come, with the instant each was
/// taken: the driver's thread may be inside a bounded blocking call when one comes (a connect to
/// a stopped peer, a peer's restart), and the mid-record stops are timed by their events. The
/// thread only takes events (it never runs the poller) and sleeps a millisecond when there are
/// none.
pub struct EventTap {
    rx: Receiver<(Instant, Event)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EventTap {
    pub fn new(engine: &Engine) -> EventTap {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let (engine, halt) = (engine.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                match engine.try_event() {
                    Some(e) => {
                        if tx.send((Instant::now(), e)).is_err() {
                            return;
                        }
                    }
                    None => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        EventTap {
            rx,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EventTap {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl EventTap {
    /// The next event and the instant it was taken, if one came.
    pub fn try_recv(&self) -> Option<(Instant, Event)> {
        self.rx.try_recv().ok()
    }
}
