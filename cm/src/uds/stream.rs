//! An established control socket ([`UdsStream`], either end), the connector's [`connect`], and
//! the handshake steps on top of the message layer (`sendmsg`/`recvmsg` with `SCM_RIGHTS`).

use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::path::{runtime_dir, validate_name};
use super::proto::{
    decode, encode, ConnParams, HandshakeRefusal, Hello, Kind, Msg, Offer, MSG_LEN,
};
use super::sys::{
    deadline, errno, io_err, peer_cred, poll_until, seqpacket_socket, sockaddr, PeerCred,
};
use super::UdsError;

/// Room for this many fds in a received control message, so that extra fds are seen (and closed)
/// instead of silently truncated.
pub(super) const MAX_RECV_FDS: usize = 8;

/// A received datagram and the fd it carried, if any.
type RawMsg = ([u8; MSG_LEN], Option<OwnedFd>);

/// Connects to the listener bound to `name`, waiting up to `timeout` if its backlog is full.
/// Checks the listener's uid.
///
/// # Errors
/// [`UdsError::BadName`], runtime-directory errors, [`UdsError::NoListener`] (immediately, if no
/// live listener has the name), [`UdsError::Timeout`], [`UdsError::ForeignPeer`],
/// [`UdsError::Io`].
pub fn connect(name: &str, timeout: Duration) -> Result<UdsStream, UdsError> {
    validate_name(name)?;
    let dir = runtime_dir()?;
    let path = dir.join(format!("{name}.sock"));
    let (addr, addr_len) = sockaddr(&path)?;
    let end = deadline(timeout);
    loop {
        let fd = seqpacket_socket()?;
        // SAFETY: valid socket and a sockaddr_un of `addr_len` bytes.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                addr_len,
            )
        };
        if rc == 0 {
            let peer = peer_cred(fd.as_fd())?;
            return Ok(UdsStream {
                fd,
                peer,
                hung_up: false,
            });
        }
        match errno() {
            libc::ENOENT | libc::ECONNREFUSED => {
                return Err(UdsError::NoListener {
                    name: name.to_owned(),
                    dir,
                })
            }
            // Backlog full: retry until the deadline.
            libc::EAGAIN | libc::EINTR => {
                if Instant::now() >= end {
                    return Err(UdsError::Timeout {
                        op: "connect",
                        timeout,
                    });
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            _ => return Err(io_err("connect")),
        }
    }
}

/// An established control socket (either end). Keep it open for the connection's lifetime:
/// closing it (or the process dying) is how the peer learns of the disconnect.
#[derive(Debug)]
pub struct UdsStream {
    fd: OwnedFd,
    peer: PeerCred,
    hung_up: bool,
}

impl AsFd for UdsStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for UdsStream {
    /// For `poll(2)` by the control thread: wait for `POLLIN | POLLRDHUP`; a hang-up shows as
    /// `POLLHUP`/`POLLRDHUP`/`POLLERR` (then call [`UdsStream::poll_hangup`] to confirm).
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl UdsStream {
    /// Wraps a connected socket whose peer passed the credential check.
    pub(super) fn new(fd: OwnedFd, peer: PeerCred) -> Self {
        Self {
            fd,
            peer,
            hung_up: false,
        }
    }

    /// The peer's kernel-verified credentials (already checked to have our uid).
    pub fn peer_cred(&self) -> PeerCred {
        self.peer
    }

    fn send(
        &mut self,
        msg: &[u8; MSG_LEN],
        fd: Option<BorrowedFd<'_>>,
        op: &'static str,
        timeout: Duration,
    ) -> Result<(), UdsError> {
        let end = deadline(timeout);
        // Control buffer for one fd, u64-aligned as cmsghdr requires.
        let mut cbuf = [0u64; 4];
        loop {
            let mut iov = libc::iovec {
                iov_base: msg.as_ptr() as *mut libc::c_void,
                iov_len: MSG_LEN,
            };
            // SAFETY: msghdr is plain data; all-zero is valid (no name, no control).
            let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
            mh.msg_iov = &mut iov;
            mh.msg_iovlen = 1;
            if let Some(fd) = fd {
                // SAFETY: CMSG_SPACE is a pure size computation.
                let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
                debug_assert!(space <= size_of::<[u64; 4]>());
                mh.msg_control = cbuf.as_mut_ptr().cast();
                mh.msg_controllen = space as _;
                // SAFETY: `mh` has a control buffer of `space` bytes, large enough for one
                // cmsghdr carrying one fd, so CMSG_FIRSTHDR is non-null and CMSG_DATA points at
                // `size_of::<RawFd>()` writable bytes inside `cbuf`.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(&mh);
                    (*c).cmsg_level = libc::SOL_SOCKET;
                    (*c).cmsg_type = libc::SCM_RIGHTS;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd.as_raw_fd());
                }
            }
            // SAFETY: `mh` points at a live iovec and control buffer for the call's duration.
            let n = unsafe {
                libc::sendmsg(
                    self.fd.as_raw_fd(),
                    &mh,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
            if n == MSG_LEN as isize {
                return Ok(());
            }
            if n >= 0 {
                return Err(UdsError::Io {
                    step: "sendmsg",
                    source: io::Error::new(io::ErrorKind::WriteZero, "short datagram"),
                });
            }
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => {
                    poll_until(self.fd.as_fd(), libc::POLLOUT, end, op, timeout)?;
                }
                libc::EPIPE | libc::ECONNRESET => return Err(UdsError::PeerClosed { op }),
                _ => return Err(io_err("sendmsg")),
            }
        }
    }

    /// Receives one message, with at most one fd. Returns `Ok(None)` if the peer closed.
    pub(super) fn recv_raw(
        &mut self,
        block: Option<(Instant, Duration)>,
        op: &'static str,
    ) -> Result<Option<RawMsg>, UdsError> {
        loop {
            let mut buf = [0u8; MSG_LEN];
            // Control buffer with room for MAX_RECV_FDS fds (u64-aligned).
            let mut cbuf = [0u64; 2 + MAX_RECV_FDS];
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: MSG_LEN,
            };
            // SAFETY: msghdr is plain data; all-zero is valid.
            let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
            mh.msg_iov = &mut iov;
            mh.msg_iovlen = 1;
            mh.msg_control = cbuf.as_mut_ptr().cast();
            mh.msg_controllen = size_of::<[u64; 2 + MAX_RECV_FDS]>() as _;
            // SAFETY: `mh` points at live buffers of the stated sizes.
            let n = unsafe {
                libc::recvmsg(
                    self.fd.as_raw_fd(),
                    &mut mh,
                    libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                match errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => match block {
                        Some((end, timeout)) => {
                            poll_until(self.fd.as_fd(), libc::POLLIN, end, op, timeout)?;
                            continue;
                        }
                        None => {
                            return Err(UdsError::Timeout {
                                op,
                                timeout: Duration::ZERO,
                            })
                        }
                    },
                    libc::ECONNRESET => return Ok(None),
                    _ => return Err(io_err("recvmsg")),
                }
            }
            // Take ownership of every received fd first, so all are closed on any error below.
            let mut fds: [Option<OwnedFd>; MAX_RECV_FDS] = Default::default();
            let mut nfds = 0usize;
            let mut foreign_cmsg = false;
            // SAFETY: `mh` was filled by recvmsg; CMSG_FIRSTHDR/NXTHDR walk only within
            // `msg_controllen` bytes of `cbuf`, and each cmsg's data length is derived from its
            // kernel-written `cmsg_len`, bounded by that walk.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&mh);
                while !c.is_null() {
                    let hdr_len = libc::CMSG_LEN(0) as usize;
                    let clen = (*c).cmsg_len as usize;
                    if (*c).cmsg_level == libc::SOL_SOCKET
                        && (*c).cmsg_type == libc::SCM_RIGHTS
                        && clen >= hdr_len
                    {
                        let count = (clen - hdr_len) / size_of::<RawFd>();
                        let data = libc::CMSG_DATA(c).cast::<RawFd>();
                        for i in 0..count {
                            let raw = std::ptr::read_unaligned(data.add(i));
                            if raw < 0 {
                                continue;
                            }
                            let owned = OwnedFd::from_raw_fd(raw);
                            if nfds < MAX_RECV_FDS {
                                fds[nfds] = Some(owned);
                            } // else: dropped (closed) right here
                            nfds += 1;
                        }
                    } else {
                        foreign_cmsg = true;
                    }
                    c = libc::CMSG_NXTHDR(&mh, c);
                }
            }
            if mh.msg_flags & libc::MSG_CTRUNC != 0 {
                return Err(UdsError::FdCount {
                    expected: 1,
                    got: nfds + 1,
                });
            }
            if foreign_cmsg {
                return Err(UdsError::BadMessage {
                    reason: "unexpected control message",
                });
            }
            if n == 0 && nfds == 0 {
                return Ok(None);
            }
            if n as usize != MSG_LEN || mh.msg_flags & libc::MSG_TRUNC != 0 {
                return Err(UdsError::BadMessage {
                    reason: "message is not 64 bytes",
                });
            }
            if nfds > 1 {
                return Err(UdsError::FdCount {
                    expected: 1,
                    got: nfds,
                });
            }
            return Ok(Some((buf, fds[0].take())));
        }
    }

    /// Receives one message of an expected kind set; `fd_kind` is the only kind allowed to carry
    /// an fd (and must carry exactly one).
    fn recv_msg(
        &mut self,
        op: &'static str,
        timeout: Duration,
        fd_kind: Option<Kind>,
    ) -> Result<(Msg, Option<OwnedFd>), UdsError> {
        let end = deadline(timeout);
        let (raw, fd) = self
            .recv_raw(Some((end, timeout)), op)?
            .ok_or(UdsError::PeerClosed { op })?;
        let msg = decode(&raw)?;
        let want_fd = Some(msg.kind) == fd_kind;
        match (want_fd, fd.is_some()) {
            (true, false) => Err(UdsError::FdCount {
                expected: 1,
                got: 0,
            }),
            (false, true) => Err(UdsError::FdCount {
                expected: 0,
                got: 1,
            }),
            _ => Ok((msg, fd)),
        }
    }

    /// Connector: sends the hello with the proposed `params`.
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_hello(&mut self, params: &ConnParams, timeout: Duration) -> Result<(), UdsError> {
        self.send(&encode(Kind::Hello, 0, params), None, "send hello", timeout)
    }

    /// Listener: receives the connector's hello. On a protocol-version mismatch it replies with a
    /// `VersionMismatch` reject (best effort, without waiting) and returns the error.
    ///
    /// With a zero `timeout` it never waits (as every receive step): [`UdsError::Timeout`] then
    /// means the message has not arrived yet, for a caller that polls the socket itself.
    ///
    /// # Errors
    /// [`UdsError::VersionMismatch`], [`UdsError::BadMessage`] (bad magic, unexpected kind,
    /// nonzero reserved bytes), [`UdsError::FdCount`], [`UdsError::PeerClosed`],
    /// [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn recv_hello(&mut self, timeout: Duration) -> Result<Hello, UdsError> {
        match self.recv_msg("recv hello", timeout, None) {
            Ok((m, _)) if m.kind == Kind::Hello => Ok(Hello {
                pid: m.pid,
                params: m.params,
            }),
            Ok(_) => Err(UdsError::BadMessage {
                reason: "expected hello",
            }),
            Err(e @ UdsError::VersionMismatch { .. }) => {
                // Best effort and without waiting: nothing was sent on this socket before, so
                // the reply fits its send buffer (the listener's control thread never blocks).
                let _ = self.send_reject(HandshakeRefusal::VersionMismatch, Duration::ZERO);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Listener: accepts with the final `params` and passes the `segment` fd (`SCM_RIGHTS`; the
    /// caller keeps its own copy and may close it after this returns).
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_accept(
        &mut self,
        params: &ConnParams,
        segment: BorrowedFd<'_>,
        timeout: Duration,
    ) -> Result<(), UdsError> {
        self.send(
            &encode(Kind::Accept, 0, params),
            Some(segment),
            "send accept",
            timeout,
        )
    }

    /// Listener: rejects the hello with `reason`. Close the stream afterwards.
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_reject(
        &mut self,
        reason: HandshakeRefusal,
        timeout: Duration,
    ) -> Result<(), UdsError> {
        self.send_reject_with(reason, &ConnParams::default(), timeout)
    }

    /// Listener: rejects the hello with `reason` and its own `params` (so that the connector
    /// can name what differs). Close the stream afterwards.
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_reject_with(
        &mut self,
        reason: HandshakeRefusal,
        params: &ConnParams,
        timeout: Duration,
    ) -> Result<(), UdsError> {
        tracing::info!(?reason, "uds handshake rejected");
        self.send(
            &encode(Kind::Reject, reason.code(), params),
            None,
            "send reject",
            timeout,
        )
    }

    /// Connector: receives the listener's answer to the hello: the final params and the segment
    /// fd (exactly one; extra fds are closed and refused).
    ///
    /// # Errors
    /// [`UdsError::Rejected`] (with the listener's reason and, for a mismatch, its params), [`UdsError::VersionMismatch`] if the
    /// listener's reply is of another protocol version, [`UdsError::FdCount`],
    /// [`UdsError::BadMessage`], [`UdsError::PeerClosed`], [`UdsError::Timeout`],
    /// [`UdsError::Io`].
    pub fn recv_offer(&mut self, timeout: Duration) -> Result<Offer, UdsError> {
        let (m, fd) = self.recv_msg("recv offer", timeout, Some(Kind::Accept))?;
        match (m.kind, fd) {
            (Kind::Accept, Some(segment)) => Ok(Offer {
                params: m.params,
                segment,
            }),
            (Kind::Reject, _) => Err(UdsError::Rejected {
                reason: HandshakeRefusal::from_code(m.reason),
                params: m.params,
            }),
            _ => Err(UdsError::BadMessage {
                reason: "expected accept or reject",
            }),
        }
    }

    /// Connector: confirms the segment is attached; the connection is established.
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_ready(&mut self, timeout: Duration) -> Result<(), UdsError> {
        self.send(
            &encode(Kind::Ready, 0, &ConnParams::default()),
            None,
            "send ready",
            timeout,
        )
    }

    /// Connector: aborts after an offer it cannot use (params unacceptable, attach failed).
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn send_abort(
        &mut self,
        reason: HandshakeRefusal,
        timeout: Duration,
    ) -> Result<(), UdsError> {
        tracing::info!(?reason, "uds handshake aborted");
        self.send(
            &encode(Kind::Abort, reason.code(), &ConnParams::default()),
            None,
            "send abort",
            timeout,
        )
    }

    /// Listener: waits for the connector's ready.
    ///
    /// # Errors
    /// [`UdsError::Aborted`] with the connector's reason, [`UdsError::BadMessage`],
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`], [`UdsError::Io`].
    pub fn recv_ready(&mut self, timeout: Duration) -> Result<(), UdsError> {
        let (m, _) = self.recv_msg("recv ready", timeout, None)?;
        match m.kind {
            Kind::Ready => Ok(()),
            Kind::Abort => Err(UdsError::Aborted {
                reason: HandshakeRefusal::from_code(m.reason),
            }),
            _ => Err(UdsError::BadMessage {
                reason: "expected ready or abort",
            }),
        }
    }

    /// Announces a clean close (best effort, non-blocking); the peer's
    /// [`UdsStream::poll_hangup`] then reports `true`. Dropping the stream has the same effect
    /// a moment later.
    ///
    /// # Errors
    /// [`UdsError::PeerClosed`], [`UdsError::Timeout`] (socket buffer full), [`UdsError::Io`].
    pub fn send_bye(&mut self) -> Result<(), UdsError> {
        self.send(
            &encode(Kind::Bye, 0, &ConnParams::default()),
            None,
            "send bye",
            Duration::ZERO,
        )
    }

    /// Non-blocking check whether the peer is gone: `Ok(true)` once it closed its socket (or its
    /// process died), sent bye, or the socket errored; sticky afterwards. One `poll(2)` with zero
    /// timeout (plus a non-blocking read if something is pending): for the control thread, not
    /// the data path.
    ///
    /// # Errors
    /// [`UdsError::BadMessage`] if the peer sent anything but bye after the handshake,
    /// [`UdsError::Io`] if `poll(2)` fails.
    pub fn poll_hangup(&mut self) -> Result<bool, UdsError> {
        if self.hung_up {
            return Ok(true);
        }
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
        if rc < 0 {
            return if errno() == libc::EINTR {
                Ok(false)
            } else {
                Err(io_err("poll"))
            };
        }
        if rc == 0 {
            return Ok(false);
        }
        if pfd.revents & libc::POLLIN != 0 {
            // Drain one message: bye or EOF mean hang-up; anything else is a protocol error.
            match self.recv_raw(None, "poll hangup") {
                Ok(None) => self.hung_up = true,
                Ok(Some((raw, _fd))) => match decode(&raw) {
                    Ok(m) if m.kind == Kind::Bye => self.hung_up = true,
                    Ok(_) => {
                        return Err(UdsError::BadMessage {
                            reason: "unexpected message after the handshake",
                        })
                    }
                    Err(e) => return Err(e),
                },
                Err(UdsError::Timeout { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if pfd.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0 {
            self.hung_up = true;
        }
        Ok(self.hung_up)
    }
}
