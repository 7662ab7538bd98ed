//! The polled path's send window ([`AppWindow`]): the connection's message window, and beside
//! it, for a fabric that asks for one, a byte window (tcp: its own byte window, so that the
//! application never has more in flight than the fabric may post).

use std::sync::atomic::Ordering;

use crate::flow::{Policy, SendWindow};
use crate::link::ConnShared;
use crate::record::stream_bytes;

/// The application's side of a polled connection's credits: messages sent and not yet credited
/// back, and, with [`FabricConn::app_bytes`], the same in bytes of records
/// ([`stream_bytes`] per message). Credits are the poller's cumulative counts in
/// [`ConnShared`], reloaded only when a window looks full (one shared-line read per window,
/// not per send).
///
/// [`FabricConn::app_bytes`]: crate::fabric::FabricConn::app_bytes
#[derive(Debug)]
pub(super) struct AppWindow {
    msgs: SendWindow,
    bytes: SendWindow,
    /// The byte window is kept (else sends skip it: 1-2 ns a send on `bench cost --fabric
    /// mem`'s stream when they kept an unbounded one).
    by_bytes: bool,
}

impl AppWindow {
    /// A window of `policy` (messages), and of `bytes` bytes of records when given.
    pub(super) fn new(policy: Policy, bytes: Option<u64>) -> AppWindow {
        AppWindow {
            msgs: policy.send_window(),
            bytes: Policy::bytes(bytes.map_or(usize::MAX, |b| b as usize)).send_window(),
            by_bytes: bytes.is_some(),
        }
    }

    /// The units a message of `len` payload bytes takes in the byte window (0 without one).
    #[inline(always)]
    pub(super) fn units(&self, len: usize) -> u64 {
        if self.by_bytes {
            stream_bytes(len)
        } else {
            0
        }
    }

    /// Whether a message of `units` ([`units`](Self::units)) fits now, reloading the credits
    /// only when it looks like it does not. The byte window takes what the fabric's would (a
    /// message larger than the room goes once less than half the window is in flight), so a
    /// message the application may send is one the fabric posts at once.
    #[inline(always)]
    pub(super) fn has_room(&mut self, units: u64, shared: &ConnShared) -> bool {
        if self.fits(units) {
            return true;
        }
        // The engine's own poller writes them: trusted, and clamped to what was sent anyway.
        self.reload(shared);
        self.fits(units)
    }

    #[inline(always)]
    fn fits(&self, units: u64) -> bool {
        !self.msgs.is_full() && (!self.by_bytes || self.bytes.has_room(units))
    }

    /// Adopts the poller's credit counts.
    #[inline]
    pub(super) fn reload(&mut self, shared: &ConnShared) {
        self.msgs
            .credit_trusted(shared.credits.load(Ordering::Acquire));
        if self.by_bytes {
            self.bytes
                .credit_trusted(shared.credited_bytes.load(Ordering::Acquire));
        }
    }

    /// One message of `units` was sent.
    #[inline(always)]
    pub(super) fn on_sent(&mut self, units: u64) {
        self.msgs.on_sent(1);
        if self.by_bytes {
            self.bytes.on_sent(units);
        }
    }

    /// Bytes of records queued in run-to-completion mode after which the queued run is posted
    /// without waiting for a batch of messages: a quarter of the byte window (`u64::MAX`
    /// without one). A stream of large messages never makes a batch within one window, so it
    /// left only when the window was full and the send ran a pass: in bursts of half a window
    /// (the credit), the socket idle while the application filled the next. Measured (`bench
    /// rate --fabric tcp --size 64k --buffer-size 64k`, 2 MiB window, quiet, 2 rounds): across
    /// `scripts/netns-two` 2.7-2.9 GB/s without, 5.8-7.0 with a quarter (64 KiB: 5.4-5.5, a
    /// half: 4.1-6.4); on loopback 5.8-6.5 without, 6.2-6.4 with it (64 KiB: 4.1-4.9).
    #[inline(always)]
    pub(super) fn post_every(&self) -> u64 {
        if self.by_bytes {
            self.bytes.window() / 4
        } else {
            u64::MAX
        }
    }

    /// Messages sent (cumulative).
    pub(super) fn sent(&self) -> u64 {
        self.msgs.sent()
    }

    /// Messages in flight (sent, not yet credited back).
    pub(super) fn in_flight(&self) -> u64 {
        self.msgs.in_flight()
    }
}
