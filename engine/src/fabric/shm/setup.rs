//! shm connection setup: rendezvous over `cm::uds`, parameter negotiation, segment creation
//! (listening side) and attachment (connecting side). Runs on the control thread (accepts, as a
//! non-blocking state machine: [`Handshake`]) or on the thread calling `connect` (bounded by its
//! timeout), never on a poller.

use std::any::Any;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cm::uds::{self, ConnParams, HandshakeRefusal, UdsListener, UdsStream};

use crate::config::Config;
use crate::desc::{PoolView, INLINE_MAX};
use crate::error::Error;
use crate::flow::Policy;
use crate::placement::Placer;

use super::direct::ShmDirect;
use super::error::{Mismatch, ShmSetupError};
use super::wire::{self, Layout, Params, Segment, WireError};

/// How long the listening side waits for each handshake step of an accepted connection (the
/// hello after the accept, the ready after the offer). The control thread does not wait: the
/// pending handshake is an entry with this deadline (see [`Handshake`]).
pub(crate) const ACCEPT_STEP_TIMEOUT: Duration = Duration::from_millis(250);

/// A fully set-up shm connection, before it is registered with the engine.
pub(crate) struct Established {
    pub(crate) direct: ShmDirect,
    pub(crate) tx_pool: PoolView,
    pub(crate) rx_pool: PoolView,
    pub(crate) tx_large: PoolView,
    pub(crate) rx_large: PoolView,
    pub(crate) keep: Arc<dyn Any + Send + Sync>,
    pub(crate) segment: Segment,
    pub(crate) stream: UdsStream,
}

/// The params this engine proposes (connector) / requires (listener).
pub(crate) fn params_for(cfg: &Config) -> Result<Params, Error> {
    // The wire wants buffer sizes in multiples of 64 and at least 64.
    let buffer_size = cfg.buffer_size.max(64).next_multiple_of(64);
    let buffer_size = u32::try_from(buffer_size)
        .ok()
        .filter(|&b| b <= wire::layout::MAX_BUFFER_SIZE)
        .ok_or(ShmSetupError::BufferSize {
            size: cfg.buffer_size,
            max: wire::layout::MAX_BUFFER_SIZE,
        })?;
    let inline_max = cfg.inline_threshold.min(INLINE_MAX);
    // Large slots: the largest message, in multiples of 64 (the wire's unit).
    let (large_size, large_count) = match cfg.large_pool() {
        (_, 0) => (0, 0),
        (size, count) => {
            let size = size.next_multiple_of(64);
            let size = u32::try_from(size)
                .ok()
                .filter(|&s| s <= wire::layout::MAX_LARGE_SIZE && s > buffer_size)
                .ok_or(ShmSetupError::BufferSize {
                    size,
                    max: wire::layout::MAX_LARGE_SIZE,
                })?;
            (size, count)
        }
    };
    // The record ring holds at least `depth` messages (`wire::ring_capacity`).
    let ring_depth = cfg.depth.next_power_of_two().clamp(
        wire::layout::MIN_RING_DEPTH as usize,
        wire::layout::MAX_RING_DEPTH as usize,
    );
    let p = Params {
        buffer_size,
        buffer_count: cfg.buffers as u32,
        ring_depth: ring_depth as u32,
        inline_max: inline_max as u32,
        large_size,
        large_count,
    };
    p.validate().map_err(ShmSetupError::Params)?;
    Ok(p)
}

/// The pool geometry (`buffer_size`, `buffers`) on which `ours` and `theirs` differ: the
/// segment's memory is sized by it, so neither side accepts one it did not configure itself.
fn geometry_mismatches(ours: &Params, theirs: &Params) -> Vec<Mismatch> {
    let mut m = Vec::new();
    for (setting, a, b) in [
        ("buffer_size", ours.buffer_size, theirs.buffer_size),
        ("buffers", ours.buffer_count, theirs.buffer_count),
    ] {
        if a != b {
            m.push(Mismatch {
                setting,
                ours: a.into(),
                theirs: b.into(),
            });
        }
    }
    m
}

/// The params a listener (`ours`) settles with a connector's proposal (`theirs`), as tcp does:
/// the connector's ring depth and inline size, the smaller message limit (large slot size)
/// and the smaller large-slot count (none when either side has none). The pool geometry must
/// be the same: else the settings that differ.
fn settle(ours: &Params, theirs: &Params) -> Result<Params, Vec<Mismatch>> {
    let m = geometry_mismatches(ours, theirs);
    if !m.is_empty() {
        return Err(m);
    }
    let (large_size, large_count) = if ours.large_count == 0 || theirs.large_count == 0 {
        (0, 0)
    } else {
        (
            ours.large_size.min(theirs.large_size),
            ours.large_count.min(theirs.large_count),
        )
    };
    Ok(Params {
        large_size,
        large_count,
        ..*theirs
    })
}

/// Whether a listener's `offer` is one this connector (`ours`) could have settled: our pool
/// geometry, ring depth and inline size, large slots no larger and no more than ours. Else the
/// settings that differ.
fn offer_mismatches(ours: &Params, offer: &Params) -> Vec<Mismatch> {
    let mut m = geometry_mismatches(ours, offer);
    let mut check = |setting, a: u32, b: u32, ok: bool| {
        if !ok {
            m.push(Mismatch {
                setting,
                ours: a.into(),
                theirs: b.into(),
            });
        }
    };
    check(
        "depth",
        ours.ring_depth,
        offer.ring_depth,
        ours.ring_depth == offer.ring_depth,
    );
    check(
        "inline_threshold",
        ours.inline_max,
        offer.inline_max,
        ours.inline_max == offer.inline_max,
    );
    let none = offer.large_count == 0 && offer.large_size == 0;
    check(
        "max_message_size",
        ours.large_size,
        offer.large_size,
        none || (offer.large_size <= ours.large_size && ours.large_count > 0),
    );
    check(
        "large_buffers",
        ours.large_count,
        offer.large_count,
        none || offer.large_count <= ours.large_count,
    );
    m
}

/// Checks a connector's proposal before anything is settled or created for it: the wire's own
/// limits ([`Params::validate`]), the engine's inline limit, and a ring depth that the
/// proposed pool could use. A connector proposes its credit depth rounded up to a power of
/// two, and its depth is at most its buffer count (which [`settle`] then requires to be this
/// listener's): a deeper ring could never fill, and would only make this side reserve memory
/// for it (up to 16 MiB per direction at the wire's maximum depth).
///
/// # Errors
///
/// [`WireError::InvalidParams`] naming the first field out of range.
fn check_proposal(theirs: &Params) -> Result<(), WireError> {
    theirs.validate()?;
    if theirs.inline_max as usize > INLINE_MAX {
        return Err(WireError::InvalidParams {
            what: "inline_max (above the engine's inline limit)",
            value: theirs.inline_max.into(),
        });
    }
    // `validate` bounds the count (2^16), so this cannot overflow.
    let ring_max = theirs
        .buffer_count
        .next_power_of_two()
        .max(wire::layout::MIN_RING_DEPTH);
    if theirs.ring_depth > ring_max {
        return Err(WireError::InvalidParams {
            what: "ring_depth (deeper than the pool's buffer count, rounded up to a power of two)",
            value: theirs.ring_depth.into(),
        });
    }
    Ok(())
}

fn to_conn_params(p: &Params) -> ConnParams {
    ConnParams {
        buffer_size: p.buffer_size,
        buffer_count: p.buffer_count,
        ring_depth: p.ring_depth,
        inline_max: p.inline_max,
        flags: 0,
        large_size: p.large_size,
        large_count: p.large_count,
    }
}

fn from_conn_params(c: &ConnParams) -> Params {
    Params {
        buffer_size: c.buffer_size,
        buffer_count: c.buffer_count,
        ring_depth: c.ring_depth,
        inline_max: c.inline_max,
        large_size: c.large_size,
        large_count: c.large_count,
    }
}

fn setup_err(step: &'static str, source: WireError) -> Error {
    ShmSetupError::Wire { step, source }.into()
}

/// Creates an accepted connection's segment, placed by the engine's `placer`: on hugepages when
/// it asks for them for the segment's size, falling back to 4 KiB pages under
/// `HugePages::Try`; counted in the placer's statistics.
fn create_segment(settled: &Params, placer: &Placer) -> Result<(Segment, OwnedFd), Error> {
    let len = Layout::new(settled)
        .map_err(|e| setup_err("creating the shm segment", e))?
        .total_len();
    if placer.wants_huge(len) {
        match Segment::create_placed(settled, true, placer) {
            Ok(v) => {
                placer.record(true, v.0.len());
                return Ok(v);
            }
            Err(e) => placer
                .huge_failed(len, io::Error::other(e))
                .map_err(ShmSetupError::Placement)?,
        }
    }
    let v = Segment::create_placed(settled, false, placer)
        .map_err(|e| setup_err("creating the shm segment", e))?;
    placer.record(false, v.0.len());
    Ok(v)
}

/// Builds the direct data path and pool views of a segment both sides are attached to.
fn establish(segment: Segment, stream: UdsStream, policy: Policy) -> Result<Established, Error> {
    let (tx, rx, rel) = segment
        .split()
        .map_err(|e| setup_err("splitting the shm segment", e))?;
    let p = *segment.params();
    let tx_base = tx
        .buffer_ptr(0)
        .map_err(|e| setup_err("shm send pool", e))?;
    let rx_base = rx
        .buffer_ptr(0)
        .map_err(|e| setup_err("shm receive pool", e))?;
    // SAFETY: each direction's pool is `buffer_count` buffers of `buffer_size` bytes contiguous
    // from buffer 0 inside the mapping, which `keep` (a segment handle, held by every user of
    // the views) keeps mapped; `Layout::new` checked the total fits the address space.
    let (tx_pool, rx_pool) = unsafe {
        (
            PoolView::new(tx_base, p.buffer_size as usize, p.buffer_count),
            PoolView::new(rx_base, p.buffer_size as usize, p.buffer_count),
        )
    };
    let (tx_large, rx_large) = if p.large_count == 0 {
        (PoolView::empty(), PoolView::empty())
    } else {
        let tx_large = tx
            .buffer_ptr(crate::desc::LARGE_BIT)
            .map_err(|e| setup_err("shm large send slots", e))?;
        let rx_large = rx
            .buffer_ptr(crate::desc::LARGE_BIT)
            .map_err(|e| setup_err("shm large receive slots", e))?;
        // SAFETY: as above, for the `large_count` slots of `large_size` bytes contiguous from
        // slot 0 in each direction.
        unsafe {
            (
                PoolView::new(tx_large, p.large_size as usize, p.large_count),
                PoolView::new(rx_large, p.large_size as usize, p.large_count),
            )
        }
    };
    let direct = ShmDirect::new(tx, rx, rel, segment.clone(), policy, rx_large);
    Ok(Established {
        direct,
        tx_pool,
        rx_pool,
        tx_large,
        rx_large,
        keep: Arc::new(segment.clone()),
        segment,
        stream,
    })
}

/// Connects to the listener named `name` (connecting side, segment side B). Blocks up to
/// `timeout` in total; runs on the calling application thread.
pub(crate) fn connect(
    name: &str,
    endpoint: &str,
    cfg: &Config,
    timeout: Duration,
) -> Result<Established, Error> {
    let cerr = |e: uds::UdsError| match e {
        uds::UdsError::Timeout { .. } => Error::Timeout,
        e => Error::Connect {
            endpoint: endpoint.to_owned(),
            source: Box::new(e),
        },
    };
    let ours = params_for(cfg)?;
    let deadline = crate::clock::deadline_after(std::time::Instant::now(), timeout);
    let left = || deadline.saturating_duration_since(std::time::Instant::now());
    let mut stream = uds::connect(name, left()).map_err(cerr)?;
    stream
        .send_hello(&to_conn_params(&ours), left())
        .map_err(cerr)?;
    let offer = match stream.recv_offer(left()) {
        Ok(o) => o,
        Err(
            e @ uds::UdsError::Rejected {
                reason: HandshakeRefusal::ParamsMismatch,
                params,
            },
        ) if params != uds::ConnParams::default() => {
            // The listener's values came with the refusal: name what differs.
            let mismatches = geometry_mismatches(&ours, &from_conn_params(&params));
            return Err(Error::Connect {
                endpoint: endpoint.to_owned(),
                source: Box::new(ShmSetupError::Refused {
                    mismatches,
                    source: e,
                }),
            });
        }
        Err(e) => return Err(cerr(e)),
    };
    let theirs = from_conn_params(&offer.params);
    if theirs.validate().is_err() || theirs.inline_max as usize > INLINE_MAX {
        let _ = stream.send_abort(HandshakeRefusal::ParamsInvalid, left());
        return Err(ShmSetupError::OfferInvalid { theirs }.into());
    }
    let mismatches = offer_mismatches(&ours, &theirs);
    if !mismatches.is_empty() {
        let _ = stream.send_abort(HandshakeRefusal::ParamsMismatch, left());
        return Err(ShmSetupError::OfferMismatch { mismatches }.into());
    }
    let segment = match Segment::attach(offer.segment.as_fd(), &theirs) {
        Ok(s) => s,
        Err(e) => {
            let _ = stream.send_abort(HandshakeRefusal::SegmentFailed, left());
            return Err(setup_err("attaching the shm segment", e));
        }
    };
    drop(offer);
    cfg.placer.record(segment.is_huge(), segment.len());
    // Before the ready: the listener rings from its first publication on (doorbell docs).
    if cfg.may_sleep() {
        segment.bell().arm();
    }
    stream.send_ready(left()).map_err(cerr)?;
    establish(segment, stream, Policy::from_config(cfg))
}

/// A listening shm endpoint (segment side A for every accepted connection).
pub(crate) struct ShmListener {
    uds: UdsListener,
    params: Params,
}

impl ShmListener {
    /// Binds `name`.
    pub(crate) fn bind(name: &str, endpoint: &str, cfg: &Config) -> Result<ShmListener, Error> {
        let params = params_for(cfg)?;
        let uds = UdsListener::bind(name).map_err(|e| Error::Listen {
            endpoint: endpoint.to_owned(),
            source: Box::new(e),
        })?;
        Ok(ShmListener { uds, params })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.uds.as_raw_fd()
    }

    /// Takes one pending connection off the listening socket, if any, and starts its handshake
    /// (waiting for the hello until `now + ACCEPT_STEP_TIMEOUT`). Never waits.
    pub(crate) fn try_accept(&self, now: Instant) -> Result<Option<Handshake>, Error> {
        let Some(stream) = self.uds.try_accept().map_err(accept_err)? else {
            return Ok(None);
        };
        Ok(Some(Handshake {
            stream,
            segment: None,
            deadline: now + ACCEPT_STEP_TIMEOUT,
        }))
    }

    /// Runs the handshake steps of `hs` whose input has arrived (its socket was readable) and
    /// returns where it stands. Never waits: replies go into the socket's empty send buffer
    /// without blocking, and a message not there yet leaves the handshake pending.
    ///
    /// # Errors
    ///
    /// The handshake failed (the peer's socket is closed when `hs` is dropped with it).
    pub(crate) fn advance(
        &self,
        mut hs: Handshake,
        cfg: &Config,
        now: Instant,
    ) -> Result<Step, Error> {
        let nowait = Duration::ZERO;
        let Some(segment) = hs.segment.take() else {
            let hello = match hs.stream.recv_hello(nowait) {
                Ok(h) => h,
                Err(uds::UdsError::Timeout { .. }) => return Ok(Step::Pending(hs)),
                Err(e) => return Err(accept_err(e)),
            };
            let stream = &mut hs.stream;
            let theirs = from_conn_params(&hello.params);
            if let Err(source) = check_proposal(&theirs) {
                let _ = stream.send_reject(HandshakeRefusal::ParamsInvalid, nowait);
                return Err(ShmSetupError::ProposalInvalid { theirs, source }.into());
            }
            // Ring depth and inline size: the connector's choice (both validated); large
            // slots: the smaller of both; the pool geometry must be the listener's own.
            let settled = match settle(&self.params, &theirs) {
                Ok(p) => p,
                Err(mismatches) => {
                    let _ = stream.send_reject_with(
                        HandshakeRefusal::ParamsMismatch,
                        &to_conn_params(&self.params),
                        nowait,
                    );
                    return Err(ShmSetupError::ProposalMismatch { mismatches }.into());
                }
            };
            let (segment, fd) = match create_segment(&settled, &cfg.placer) {
                Ok(v) => v,
                Err(e) => {
                    let _ = stream.send_reject(HandshakeRefusal::SegmentFailed, nowait);
                    return Err(e);
                }
            };
            // Before the accept: the connector rings from its first publication on.
            if cfg.may_sleep() {
                segment.bell().arm();
            }
            stream
                .send_accept(&to_conn_params(&settled), fd.as_fd(), nowait)
                .map_err(accept_err)?;
            drop(fd);
            hs.segment = Some(segment);
            hs.deadline = now + ACCEPT_STEP_TIMEOUT;
            return Ok(Step::Pending(hs));
        };
        match hs.stream.recv_ready(nowait) {
            Ok(()) => establish(segment, hs.stream, Policy::from_config(cfg))
                .map(|e| Step::Done(Box::new(e))),
            Err(uds::UdsError::Timeout { .. }) => {
                hs.segment = Some(segment);
                Ok(Step::Pending(hs))
            }
            Err(e) => Err(accept_err(e)),
        }
    }
}

fn accept_err(e: uds::UdsError) -> Error {
    ShmSetupError::Accept(e).into()
}

/// An accepted connection whose handshake is under way (listening side): a small state machine
/// that the control thread advances ([`ShmListener::advance`]) when its socket is readable and
/// expires at its deadline. A peer that stalls costs one such entry until then, never time.
pub(crate) struct Handshake {
    stream: UdsStream,
    /// `None`: waiting for the hello; `Some`: the segment was offered, waiting for ready.
    segment: Option<Segment>,
    /// When the current step times out ([`ACCEPT_STEP_TIMEOUT`] after it began).
    deadline: Instant,
}

impl Handshake {
    /// The socket to watch for `POLLIN`.
    pub(crate) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// The current step's deadline.
    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Refuses the connection without waiting (the table of pending handshakes is full): a
    /// `Busy` reject, best effort; dropping `self` closes the socket.
    pub(crate) fn refuse_busy(mut self) {
        let _ = self
            .stream
            .send_reject(HandshakeRefusal::Busy, Duration::ZERO);
    }

    /// The error for a handshake whose step ran past its deadline (dropping `self` closes the
    /// peer's socket).
    pub(crate) fn timed_out(&self) -> Error {
        let op = if self.segment.is_none() {
            "recv hello"
        } else {
            "recv ready"
        };
        accept_err(uds::UdsError::Timeout {
            op,
            timeout: ACCEPT_STEP_TIMEOUT,
        })
    }
}

/// Where [`ShmListener::advance`] left a handshake.
pub(crate) enum Step {
    /// Waiting for the peer's next message.
    Pending(Handshake),
    /// Done: the connection is set up.
    Done(Box<Established>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(buffer_size: u32, buffers: u32, large_size: u32, large_count: u32) -> Params {
        Params {
            buffer_size,
            buffer_count: buffers,
            ring_depth: 64,
            inline_max: 256,
            large_size,
            large_count,
        }
    }

    #[test]
    fn settle_takes_the_smaller_large_slots_and_refuses_other_geometry() {
        let big = p(4096, 16, 1 << 20, 8);
        let small = p(4096, 16, 64 << 10, 4);
        for (a, b) in [(big, small), (small, big)] {
            let s = settle(&a, &b).unwrap();
            assert_eq!((s.large_size, s.large_count), (64 << 10, 4));
            assert!(offer_mismatches(&b, &s).is_empty());
        }
        let none = p(4096, 16, 0, 0);
        for (a, b) in [(big, none), (none, big)] {
            let s = settle(&a, &b).unwrap();
            assert_eq!((s.large_size, s.large_count), (0, 0));
            assert!(offer_mismatches(&b, &s).is_empty());
        }
        let m = settle(&big, &p(8192, 32, 1 << 20, 8)).unwrap_err();
        assert_eq!(
            m,
            [
                Mismatch {
                    setting: "buffer_size",
                    ours: 4096,
                    theirs: 8192
                },
                Mismatch {
                    setting: "buffers",
                    ours: 16,
                    theirs: 32
                },
            ]
        );
        // An offer larger than what this side configured is not one it could have settled.
        let m = offer_mismatches(&small, &big);
        let names: Vec<_> = m.iter().map(|m| m.setting).collect();
        assert_eq!(names, ["max_message_size", "large_buffers"]);
    }
}
