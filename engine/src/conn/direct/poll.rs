//! The direct path's batch receive, [`Connection::poll`]: one message (`poll(handler, 1)`, a
//! ping-pong's receive) taken inline through the fabric's take, everything else out of line.

use super::Direct;
use crate::conn::Connection;
use crate::error::Error;

impl Direct {
    /// [`Connection::poll`]: read in place in the fabric; nothing runs a poller.
    ///
    /// One message (`limit == 1`, a ping-pong's receive) is taken inline, as `try_recv`
    /// takes it; everything else (batches, a record the take leaves, an empty ring's checks)
    /// is out of line. (Inlined whole, the general poll was too large: an application's
    /// `poll(handler, 1)` paid a call and its result in memory at every spin.)
    #[inline(always)]
    pub(in crate::conn) fn poll(
        &self,
        conn: &Connection,
        handler: &mut impl FnMut(&[u8]),
        limit: usize,
    ) -> Result<usize, Error> {
        if limit == 1 {
            match self.fabric.poll_one(handler) {
                Some(Some(len)) => {
                    // The handler has returned.
                    self.count_received(conn, 1, len as u64);
                    return Ok(1);
                }
                Some(None) => return self.poll_empty(conn, handler, limit),
                None => {}
            }
        }
        self.poll_rest(conn, handler, limit)
    }

    /// [`poll`](Self::poll) of what its inline case leaves.
    #[inline(never)]
    fn poll_rest(
        &self,
        conn: &Connection,
        handler: &mut impl FnMut(&[u8]),
        limit: usize,
    ) -> Result<usize, Error> {
        let n = self.poll_once(conn, handler, limit)?;
        if n > 0 || limit == 0 {
            return Ok(n);
        }
        self.poll_empty(conn, handler, limit)
    }

    /// [`poll`](Self::poll) found nothing: only now look at the connection's state (and
    /// deliver what was published before it went down).
    #[cold]
    #[inline(never)]
    fn poll_empty(
        &self,
        conn: &Connection,
        handler: &mut impl FnMut(&[u8]),
        limit: usize,
    ) -> Result<usize, Error> {
        self.publish_if_stale(conn);
        // Nothing to receive: let a batch of sends go out (a reply may depend on it).
        self.flush();
        match self.down(conn) {
            Some(e) => match self.poll_once(conn, handler, limit)? {
                0 => Err(e),
                n => Ok(n),
            },
            None => Ok(0),
        }
    }

    #[inline]
    fn poll_once(
        &self,
        conn: &Connection,
        handler: &mut impl FnMut(&[u8]),
        limit: usize,
    ) -> Result<usize, Error> {
        // The handlers run inside: no reference to the state is live during the call.
        match self.fabric.poll(&conn.rx_pool, handler, limit) {
            Ok((n, bytes)) => {
                if n > 0 {
                    // The handlers have returned.
                    self.count_received(conn, n as u64, bytes);
                }
                Ok(n)
            }
            Err(e) => Err(conn.fail(e)),
        }
    }
}
