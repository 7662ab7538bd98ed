//! [`SendError`]: a failed [`Connection::send`](crate::Connection::send), handing its
//! [`SendBuf`] back.

use super::SendBuf;
use crate::error::Error;

/// [`Connection::send`](crate::Connection::send) failed; the buffer is handed back so it can be
/// retried or dropped (dropping returns it to the pool).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum SendError<'c> {
    /// No credits, or the send ring is full: retry later (after [`Engine::poll`](crate::Engine::poll)
    /// in run-to-completion mode).
    #[error("would block: no credits or send ring full")]
    WouldBlock(SendBuf<'c>),
    /// [`Connection::send_timeout`](crate::Connection::send_timeout) ran out.
    #[error("send timed out")]
    Timeout(SendBuf<'c>),
    /// The connection is closed or failed.
    #[error("connection closed: {error}")]
    Closed {
        /// The buffer.
        buf: SendBuf<'c>,
        /// Why: [`Error::Disconnected`] or a [`FabricError`](crate::FabricError).
        error: Error,
    },
}

impl<'c> SendError<'c> {
    /// Takes the buffer back.
    pub fn into_buf(self) -> SendBuf<'c> {
        match self {
            SendError::WouldBlock(b) | SendError::Timeout(b) => b,
            SendError::Closed { buf, .. } => buf,
        }
    }

    /// True for [`SendError::WouldBlock`].
    pub fn is_would_block(&self) -> bool {
        matches!(self, SendError::WouldBlock(_))
    }
}

impl std::fmt::Debug for SendError<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::WouldBlock(_) => f.pad("WouldBlock(..)"),
            SendError::Timeout(_) => f.pad("Timeout(..)"),
            SendError::Closed { error, .. } => {
                f.debug_struct("Closed").field("error", error).finish()
            }
        }
    }
}

impl From<SendError<'_>> for Error {
    /// Drops the buffer (back to the pool) and keeps the reason.
    fn from(e: SendError<'_>) -> Error {
        match e {
            SendError::WouldBlock(_) => Error::WouldBlock,
            SendError::Timeout(_) => Error::Timeout,
            SendError::Closed { error, .. } => error,
        }
    }
}
