//! Liveness of an [`RdmaConn`]: silence detection and heartbeats.

use std::time::Duration;

use super::RdmaConn;
use crate::error::FabricError;

impl RdmaConn {
    /// Liveness, from [`FabricConn::check_peer`](crate::fabric::FabricConn::check_peer): fails the
    /// connection when nothing was received for the timeout while the peer could have sent (it had
    /// credits, as far as we know), and sends a heartbeat when this side sent nothing for a quarter
    /// of the timeout.
    ///
    /// A heartbeat is a credit message (`IMM_CREDIT_ONLY`, carrying whatever credits are owed):
    /// it spends a credit like any message, so a receive is always posted for it (never an
    /// RNR), and the peer's re-post of its buffer returns that credit as usual. Without a credit
    /// (the peer holds all our messages) no heartbeat is sent, and the peer, whose window for
    /// us is then 0, does not expect one.
    pub(super) fn liveness(&mut self, now_ns: u64) -> Result<(), FabricError> {
        if self.liveness_ns == 0 || self.error.is_some() {
            return Ok(());
        }
        // This poller itself did not run for a while (a run-to-completion application that did
        // not call in, a descheduled thread): it cannot tell the peer's silence from its own.
        let stalled = now_ns.saturating_sub(self.checked_ns) > self.liveness_ns / 2;
        self.checked_ns = now_ns;
        match self.heard {
            Some((seen, since)) if seen == self.rx_heard && self.peer_window > 0 && !stalled => {
                let silent = now_ns.saturating_sub(since);
                if silent >= self.liveness_ns {
                    return Err(FabricError::PeerUnresponsive {
                        silent_for: Duration::from_nanos(silent),
                    });
                }
            }
            _ => self.heard = Some((self.rx_heard, now_ns)),
        }
        // What the peer hears from us: SENDs only. Our rendezvous READs are served by its HCA
        // and its engine sees none of them, so a long pull (a 48-MiB message takes 1.2-2.3 s
        // in the VM's Soft-RoCE) must not stop the heartbeats: data moving is not silence.
        let sends = self.sq_posted - self.reads_posted;
        match self.sent {
            Some((seen, since)) if seen == sends => {
                if now_ns.saturating_sub(since) >= self.liveness_ns / 4
                    && self.tx_window.room() > 0
                    && self.sq_room() > 0
                {
                    self.post_credit_message(false)?;
                    self.counters.heartbeats.add(1);
                    self.sent = Some((sends + 1, now_ns));
                }
            }
            _ => self.sent = Some((sends, now_ns)),
        }
        Ok(())
    }
}
