//! Opt-in reconnect: [`Reconnecting`], a helper on top of a [`Connection`] that re-establishes
//! it per a [`ReconnectPolicy`] and tells the application through [`ReconnectEvent`]s.
//!
//! [`Connection`]s stay simple: one connection, one peer, down for good once it fails. A
//! `Reconnecting` owns an [`Engine`] handle, the endpoint and the current connection, forwards
//! the data-path calls to it (`alloc`, `send`, `try_recv`, `poll`, ...) and, in
//! [`maintain`](Reconnecting::maintain) (which the application calls from its loop, or through
//! [`wait_connected`](Reconnecting::wait_connected)), notices a connection that went down and
//! connects again, ZeroMQ-style.
//!
//! # The policy
//!
//! [`ReconnectPolicy::default`] is ZeroMQ's (`ZMQ_RECONNECT_IVL` 100 ms) with a capped
//! exponential backoff: the first attempt after a loss is made `interval` (100 ms) after it, the
//! n-th `min(interval × backoff^(n-1), max_interval)` (×2, capped at 5 s) after the previous one,
//! each delay stretched or shrunk by a random fraction up to `jitter` (±10 %), so that many
//! clients of one restarted server do not reconnect in lock step. Attempts are unlimited
//! (`max_attempts: None`) and each is bounded by `connect_timeout` (1 s).
//! [`ReconnectPolicy::delay_bound`] is the longest the n-th delay can be.
//!
//! # What is reported when a connection is lost
//!
//! Nothing is silently dropped:
//!
//! * **Messages received** on the lost connection are all delivered first: `maintain` replaces
//!   a failed connection only once the application has taken every message that arrived on it
//!   (`try_recv`/`poll` return its error after the last one). So an application that receives
//!   on the connection must keep receiving until it sees that error; until then `maintain`
//!   leaves the down connection in place (and returns `false`).
//! * **Messages sent** whose delivery was not confirmed are counted, never retransmitted:
//!   [`ReconnectEvent::Lost`] carries `unconfirmed`, the messages handed to `send` on the lost
//!   connection whose credit had not come back when it failed (its final
//!   [`ConnStats::in_flight`](crate::ConnStats::in_flight)). A credit comes back when the
//!   receiving side took the message (shm: the peer application consumed its record from the
//!   ring; RDMA: the poller re-posted its receive buffer), so every message not counted reached
//!   the peer. The count is an upper bound of the loss: some unconfirmed messages may have
//!   arrived, because a credit can be in transit when the peer dies (shm reads the peer's
//!   consumer position when `stats` is taken, so its count is exact up to that moment). A message the peer's engine took but its application had not
//!   yet read when it died is confirmed and lost with the peer: an end-to-end guarantee needs
//!   application acknowledgements.
//!
//! # Threading and blocking
//!
//! Like a [`Connection`], a `Reconnecting` is `Send` and not `Sync`. The data-path calls never
//! connect and never block beyond what the forwarded call does; with no connection up they
//! return [`Error::Disconnected`] at once. `maintain` makes at most one connect attempt, bounded
//! by the policy's `connect_timeout` (an attempt that finds nobody listening fails at once;
//! the policy paces the next);
//! `wait_connected(timeout)` bounds every attempt by what is left of its own timeout. Every
//! loss, attempt, reconnect and give-up is logged through `tracing` (this is control-plane code;
//! nothing here runs on the poller).

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use crate::conn::{Connection, Message, SendBuf, SendError};
use crate::engine::Engine;
use crate::error::{Chain, Error};
use crate::idle::{IdleStrategy, Idler};

/// Events kept for [`Reconnecting::try_event`] at most; older ones are dropped (and counted in
/// [`ReconnectStats::events_dropped`]) when the application does not read them.
const EVENT_QUEUE: usize = 256;

/// When and how often [`Reconnecting`] connects again. See the [module docs](self) for the
/// schedule; the setters clamp out-of-range values (documented on each), so every policy is
/// valid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReconnectPolicy {
    interval: Duration,
    jitter: f64,
    backoff: f64,
    max_interval: Duration,
    max_attempts: Option<u32>,
    connect_timeout: Duration,
}

impl Default for ReconnectPolicy {
    /// ZeroMQ-like: 100 ms, ±10 % jitter, backoff ×2 capped at 5 s, unlimited attempts, 1 s per
    /// attempt.
    fn default() -> ReconnectPolicy {
        ReconnectPolicy {
            interval: Duration::from_millis(100),
            jitter: 0.1,
            backoff: 2.0,
            max_interval: Duration::from_secs(5),
            max_attempts: None,
            connect_timeout: Duration::from_secs(1),
        }
    }
}

impl ReconnectPolicy {
    /// The default policy (see [`Default`]).
    pub fn new() -> ReconnectPolicy {
        ReconnectPolicy::default()
    }

    /// The delay before the first attempt after a loss, and the base of the backoff.
    pub fn interval(mut self, interval: Duration) -> ReconnectPolicy {
        self.interval = interval;
        self
    }

    /// The random fraction each delay is stretched or shrunk by, at most (0.1: ±10 %).
    /// Clamped to `0.0 ..= 1.0` (NaN: 0).
    pub fn jitter(mut self, fraction: f64) -> ReconnectPolicy {
        self.jitter = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// The factor each delay grows by after a failed attempt (1.0: a constant interval).
    /// Clamped to `1.0 ..= 1000.0` (NaN: 1).
    pub fn backoff(mut self, multiplier: f64) -> ReconnectPolicy {
        self.backoff = if multiplier.is_nan() {
            1.0
        } else {
            multiplier.clamp(1.0, 1000.0)
        };
        self
    }

    /// The cap on a delay before jitter (the backoff stops growing there).
    pub fn max_interval(mut self, max: Duration) -> ReconnectPolicy {
        self.max_interval = max;
        self
    }

    /// How many attempts after one loss before giving up ([`ReconnectEvent::GaveUp`]); `None`:
    /// never give up. `Some(0)` gives up at the first loss.
    pub fn max_attempts(mut self, max: Option<u32>) -> ReconnectPolicy {
        self.max_attempts = max;
        self
    }

    /// The bound on one connect attempt.
    pub fn connect_timeout(mut self, timeout: Duration) -> ReconnectPolicy {
        self.connect_timeout = timeout;
        self
    }

    /// The configured delay before the first attempt.
    pub fn get_interval(&self) -> Duration {
        self.interval
    }

    /// The configured jitter fraction.
    pub fn get_jitter(&self) -> f64 {
        self.jitter
    }

    /// The configured backoff multiplier.
    pub fn get_backoff(&self) -> f64 {
        self.backoff
    }

    /// The configured cap on a delay before jitter.
    pub fn get_max_interval(&self) -> Duration {
        self.max_interval
    }

    /// The configured maximum number of attempts per loss.
    pub fn get_max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The configured bound on one attempt.
    pub fn get_connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The delay before attempt `attempt` (1-based) before jitter:
    /// `min(interval × backoff^(attempt-1), max_interval)`.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exp = i32::try_from(attempt.saturating_sub(1)).unwrap_or(i32::MAX);
        let max = self.max_interval.as_secs_f64();
        let secs = self.interval.as_secs_f64() * self.backoff.powi(exp);
        let secs = if secs.is_finite() { secs.min(max) } else { max };
        Duration::try_from_secs_f64(secs).unwrap_or(self.max_interval)
    }

    /// The longest the delay before attempt `attempt` (1-based) can be: its
    /// [`base_delay`](Self::base_delay) stretched by the whole jitter.
    pub fn delay_bound(&self, attempt: u32) -> Duration {
        scale(self.base_delay(attempt), 1.0 + self.jitter)
    }

    /// The delay before attempt `attempt` with jitter `u` in `-1.0 ..= 1.0`.
    fn delay(&self, attempt: u32, u: f64) -> Duration {
        let u = if u.is_nan() { 0.0 } else { u.clamp(-1.0, 1.0) };
        scale(self.base_delay(attempt), 1.0 + self.jitter * u)
    }
}

/// `now + d`, saturating far in the future instead of overflowing.
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(1 << 32)))
        .unwrap_or(now)
}

/// `d × f` for `f >= 0`, saturating.
fn scale(d: Duration, f: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * f).unwrap_or(Duration::MAX)
}

/// What [`Reconnecting`] reports, from [`Reconnecting::try_event`].
#[derive(Debug)]
#[non_exhaustive]
pub enum ReconnectEvent {
    /// The connection went down (every message received on it has been taken). A reconnect is
    /// scheduled unless the policy allows no attempt (then [`GaveUp`](Self::GaveUp) follows).
    Lost {
        /// [`Connection::id`] of the lost connection.
        conn: u64,
        /// Messages sent on it whose delivery was not confirmed (see the [module docs](self)):
        /// an upper bound of the messages lost.
        unconfirmed: u64,
        /// Why it went down: [`Error::Disconnected`] or [`Error::Fabric`] (e.g.
        /// [`FabricError::PeerUnresponsive`](crate::FabricError::PeerUnresponsive)).
        error: Error,
    },
    /// A connection is up again.
    Reconnected {
        /// [`Connection::id`] of the new connection.
        conn: u64,
        /// Which attempt succeeded (1 = the first after the loss).
        attempt: u32,
        /// Time from noticing the loss (or, for [`Reconnecting::start`], from the start) to the
        /// connection being up.
        after: Duration,
    },
    /// The policy's `max_attempts` ran out, or an attempt failed for a reason retrying cannot
    /// fix (e.g. the engine shut down); the helper stays down.
    GaveUp {
        /// Attempts made since the loss.
        attempts: u32,
        /// The last attempt's error, if an attempt was made.
        error: Option<Error>,
    },
}

/// Counters of a [`Reconnecting`] helper.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconnectStats {
    /// Connections lost.
    pub lost: u64,
    /// Connect attempts made (failed and successful).
    pub attempts: u64,
    /// Successful reconnects.
    pub reconnects: u64,
    /// Sum of [`ReconnectEvent::Lost`]'s `unconfirmed` over every loss.
    pub unconfirmed: u64,
    /// Events dropped because the application did not read them.
    pub events_dropped: u64,
}

/// Where the helper is between connections.
#[derive(Debug, Clone, Copy)]
struct Down {
    /// When the loss was noticed (or the helper started).
    since: Instant,
    /// Attempts made since.
    attempts: u32,
    /// When the next attempt is due.
    next: Instant,
}

/// A connection that is re-established per a [`ReconnectPolicy`] when it goes down. See the
/// [module docs](self) for the semantics.
///
/// ```
/// use std::time::Duration;
/// use spinwire::{Engine, IdleStrategy, ReconnectEvent, ReconnectPolicy, Reconnecting};
///
/// # fn main() -> Result<(), spinwire::Error> {
/// let engine = Engine::builder().run_to_completion().idle(IdleStrategy::backoff()).build()?;
/// # let name = format!("shm://doc-reconnect-{}", std::process::id());
/// let listener = engine.listen(&name)?;
/// let mut client = Reconnecting::connect(&engine, &name, ReconnectPolicy::default())?;
/// let server = listener.accept_timeout(Duration::from_secs(5))?;
///
/// let mut buf = client.alloc()?;
/// buf.copy_from(b"ping")?;
/// client.send(buf).map_err(spinwire::Error::from)?;
/// client.flush();
/// assert_eq!(&server.recv_timeout(Duration::from_secs(5))?[..], b"ping");
///
/// // In the application's loop: notice a lost connection, reconnect when due.
/// client.maintain();
/// while let Some(ev) = client.try_event() {
///     if let ReconnectEvent::Lost { unconfirmed, .. } = ev {
///         eprintln!("{unconfirmed} messages may not have arrived");
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct Reconnecting {
    engine: Engine,
    endpoint: String,
    policy: ReconnectPolicy,
    /// The current connection: open, or down with messages still to be taken.
    conn: Option<Connection>,
    /// `Some` while no connection is up and attempts continue.
    down: Option<Down>,
    gave_up: bool,
    events: VecDeque<ReconnectEvent>,
    stats: ReconnectStats,
    /// xorshift64* state for the jitter; never 0.
    rng: u64,
}

impl std::fmt::Debug for Reconnecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconnecting")
            .field("endpoint", &self.endpoint)
            .field("conn", &self.conn.as_ref().map(Connection::id))
            .field("gave_up", &self.gave_up)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Whether another attempt may succeed after `e` (the peer may come back), or retrying is
/// pointless (the endpoint, the build or the engine is wrong).
fn retryable(e: &Error) -> bool {
    matches!(
        e,
        Error::Connect { .. }
            | Error::NoListener { .. }
            | Error::Setup(_)
            | Error::Timeout
            | Error::Disconnected
            | Error::Fabric(_)
            | Error::WouldBlock
    )
}

impl Reconnecting {
    /// Connects to `endpoint` now (bounded by the policy's `connect_timeout`) and keeps it
    /// connected per `policy` from then on.
    ///
    /// # Errors
    ///
    /// As [`Engine::connect_timeout`]: the first connection must succeed (use
    /// [`start`](Self::start) to retry that one too).
    pub fn connect(
        engine: &Engine,
        endpoint: &str,
        policy: ReconnectPolicy,
    ) -> Result<Reconnecting, Error> {
        let conn = engine.connect_timeout(endpoint, policy.connect_timeout)?;
        let mut r = Reconnecting::idle(engine, endpoint, policy);
        tracing::info!(endpoint, conn = conn.id(), "reconnecting connection up");
        r.conn = Some(conn);
        Ok(r)
    }

    /// Like [`connect`](Self::connect), but a first attempt that fails for a reason retrying can
    /// fix (nobody listening yet, a timeout) is retried per the policy, as after a loss; the
    /// connection that comes up is reported as [`ReconnectEvent::Reconnected`].
    ///
    /// # Errors
    ///
    /// [`Error::BadEndpoint`], [`Error::FabricNotCompiled`], [`Error::Shutdown`] and other errors
    /// that retrying cannot fix.
    pub fn start(
        engine: &Engine,
        endpoint: &str,
        policy: ReconnectPolicy,
    ) -> Result<Reconnecting, Error> {
        let started = Instant::now();
        match Reconnecting::connect(engine, endpoint, policy) {
            Ok(r) => Ok(r),
            Err(e) if retryable(&e) => {
                let mut r = Reconnecting::idle(engine, endpoint, policy);
                r.stats.attempts = 1;
                tracing::info!(endpoint, error = %Chain(&e), "reconnect: first attempt failed");
                r.after_failure(started, 1, e);
                Ok(r)
            }
            Err(e) => Err(e),
        }
    }

    fn idle(engine: &Engine, endpoint: &str, policy: ReconnectPolicy) -> Reconnecting {
        // A per-instance seed (std's `RandomState` keys are random per process and differ per
        // instance), so that helpers do not share one jitter sequence.
        let mut h = RandomState::new().build_hasher();
        h.write(endpoint.as_bytes());
        Reconnecting {
            engine: engine.clone(),
            endpoint: endpoint.to_owned(),
            policy,
            conn: None,
            down: None,
            gave_up: false,
            events: VecDeque::with_capacity(16),
            stats: ReconnectStats::default(),
            rng: h.finish() | 1,
        }
    }

    /// A uniform sample of `-1.0 .. 1.0` (xorshift64*).
    fn jitter_sample(&mut self) -> f64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11; // 53 random bits
        (r as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }

    fn push_event(&mut self, e: ReconnectEvent) {
        if self.events.len() >= EVENT_QUEUE {
            self.events.pop_front();
            self.stats.events_dropped += 1;
        }
        self.events.push_back(e);
    }

    /// After `attempts` failed attempts since `since` (the last failing with `error`, which
    /// retrying may fix), schedules the next one or gives up.
    fn after_failure(&mut self, since: Instant, attempts: u32, error: Error) {
        if self.policy.max_attempts.is_some_and(|max| attempts >= max) {
            tracing::warn!(endpoint = %self.endpoint, attempts, error = %Chain(&error),
                "reconnect: giving up (max attempts)");
            self.give_up(attempts, Some(error));
        } else {
            self.schedule(since, attempts);
        }
    }

    /// Schedules attempt `attempts + 1` of the outage that began at `since`.
    fn schedule(&mut self, since: Instant, attempts: u32) {
        let u = self.jitter_sample();
        let delay = self.policy.delay(attempts + 1, u);
        tracing::info!(endpoint = %self.endpoint, attempt = attempts + 1, ?delay,
            "reconnect: next attempt scheduled");
        self.down = Some(Down {
            since,
            attempts,
            next: later(Instant::now(), delay),
        });
    }

    /// Stops for good.
    fn give_up(&mut self, attempts: u32, error: Option<Error>) {
        self.down = None;
        self.gave_up = true;
        self.push_event(ReconnectEvent::GaveUp { attempts, error });
    }

    /// Notices a lost connection and, when the next attempt is due, connects again (at most one
    /// attempt, bounded by the policy's `connect_timeout`). Call it from the application's loop;
    /// it is cheap while the connection is up (one state load). Returns whether a connection is
    /// up.
    ///
    /// A down connection is replaced only once every message received on it has been taken
    /// (see the [module docs](self)).
    pub fn maintain(&mut self) -> bool {
        self.maintain_within(self.policy.connect_timeout)
    }

    fn maintain_within(&mut self, limit: Duration) -> bool {
        if let Some(c) = &self.conn {
            let Some(error) = c.down_error() else {
                return true;
            };
            if !c.rx_is_empty() {
                // Messages that arrived before the failure are still the application's.
                return false;
            }
            self.lose(error);
        }
        let Some(down) = self.down else {
            return false;
        };
        let now = Instant::now();
        if now < down.next {
            return false;
        }
        let attempt = down.attempts + 1;
        self.stats.attempts += 1;
        let timeout = self.policy.connect_timeout.min(limit);
        tracing::info!(endpoint = %self.endpoint, attempt, ?timeout, "reconnect: attempt");
        // One attempt: the policy paces the attempts, so none waits for a listener.
        match self.engine.connect_once(&self.endpoint, timeout) {
            Ok(conn) => {
                let after = down.since.elapsed();
                tracing::info!(endpoint = %self.endpoint, attempt, ?after, conn = conn.id(),
                    "reconnect: connection up");
                self.stats.reconnects += 1;
                self.push_event(ReconnectEvent::Reconnected {
                    conn: conn.id(),
                    attempt,
                    after,
                });
                self.conn = Some(conn);
                self.down = None;
                true
            }
            Err(e) if retryable(&e) => {
                tracing::info!(endpoint = %self.endpoint, attempt, error = %Chain(&e),
                    "reconnect: attempt failed");
                self.after_failure(down.since, attempt, e);
                false
            }
            Err(e) => {
                tracing::warn!(endpoint = %self.endpoint, attempt, error = %Chain(&e),
                    "reconnect: giving up (error retrying cannot fix)");
                self.give_up(attempt, Some(e));
                false
            }
        }
    }

    /// Retires the current (down, drained) connection: counts what was not confirmed and
    /// schedules the first attempt.
    fn lose(&mut self, error: Error) {
        let Some(c) = self.conn.take() else {
            return;
        };
        let unconfirmed = c.stats().in_flight;
        let id = c.id();
        drop(c);
        self.stats.lost += 1;
        self.stats.unconfirmed += unconfirmed;
        tracing::warn!(endpoint = %self.endpoint, conn = id, unconfirmed, error = %Chain(&error),
            "reconnect: connection lost");
        self.push_event(ReconnectEvent::Lost {
            conn: id,
            unconfirmed,
            error,
        });
        if self.policy.max_attempts == Some(0) {
            tracing::warn!(endpoint = %self.endpoint, "reconnect: giving up (no attempts allowed)");
            self.give_up(0, None);
            return;
        }
        self.schedule(Instant::now(), 0);
    }

    /// Runs [`maintain`](Self::maintain) until a connection is up or `timeout` passes, bounding
    /// every attempt by what is left of `timeout`. In run-to-completion mode it keeps the engine
    /// turning meanwhile ([`Engine::poll`]); it idles with backoff (parks of at most 1 ms).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`]; [`Error::Disconnected`] once the helper gave up.
    pub fn wait_connected(&mut self, timeout: Duration) -> Result<(), Error> {
        let deadline = later(Instant::now(), timeout);
        let mut idler = Idler::new(IdleStrategy::backoff());
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.maintain_within(left) {
                return Ok(());
            }
            if self.gave_up {
                return Err(Error::Disconnected);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout);
            }
            let w = self.engine.poll();
            idler.idle(w);
        }
    }

    /// The next event, if any.
    pub fn try_event(&mut self) -> Option<ReconnectEvent> {
        self.events.pop_front()
    }

    /// The current connection: open, or down with received messages still to be taken.
    pub fn connection(&self) -> Option<&Connection> {
        self.conn.as_ref()
    }

    /// Whether a connection is up (open) now.
    pub fn is_connected(&self) -> bool {
        self.conn.as_ref().is_some_and(Connection::is_open)
    }

    /// True once the helper gave up ([`ReconnectEvent::GaveUp`]); it makes no more attempts.
    pub fn has_given_up(&self) -> bool {
        self.gave_up
    }

    /// When the next attempt is due, if one is scheduled.
    pub fn next_attempt(&self) -> Option<Instant> {
        self.down.map(|d| d.next)
    }

    /// The endpoint it connects to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The policy.
    pub fn policy(&self) -> &ReconnectPolicy {
        &self.policy
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The helper's counters.
    pub fn stats(&self) -> ReconnectStats {
        self.stats
    }

    /// Stops reconnecting and hands out the current connection, if any.
    pub fn into_connection(self) -> Option<Connection> {
        self.conn
    }

    fn conn(&self) -> Result<&Connection, Error> {
        self.conn.as_ref().ok_or(Error::Disconnected)
    }

    /// [`Connection::alloc`] on the current connection.
    ///
    /// # Errors
    ///
    /// As `Connection::alloc`; [`Error::Disconnected`] with no connection.
    #[inline]
    pub fn alloc(&self) -> Result<SendBuf<'_>, Error> {
        self.conn()?.alloc()
    }

    /// [`Connection::claim`] on the current connection: `len` bytes to write in place (a
    /// large slot above the buffer size).
    ///
    /// # Errors
    ///
    /// As `Connection::claim`; [`Error::Disconnected`] with no connection.
    pub fn claim(&self, len: usize) -> Result<SendBuf<'_>, Error> {
        self.conn()?.claim(len)
    }

    /// [`Connection::alloc_timeout`] on the current connection.
    ///
    /// # Errors
    ///
    /// As `Connection::alloc_timeout`; [`Error::Disconnected`] with no connection.
    #[inline]
    pub fn alloc_timeout(&self, timeout: Duration) -> Result<SendBuf<'_>, Error> {
        self.conn()?.alloc_timeout(timeout)
    }

    /// [`Connection::send`] on the current connection (the buffer's).
    ///
    /// # Errors
    ///
    /// As `Connection::send`.
    #[inline]
    pub fn send<'c>(&'c self, buf: SendBuf<'c>) -> Result<(), SendError<'c>> {
        match &self.conn {
            Some(c) => c.send(buf),
            None => Err(SendError::Closed {
                buf,
                error: Error::Disconnected,
            }),
        }
    }

    /// [`Connection::send_timeout`] on the current connection.
    ///
    /// # Errors
    ///
    /// As `Connection::send_timeout`.
    #[inline]
    pub fn send_timeout<'c>(
        &'c self,
        buf: SendBuf<'c>,
        timeout: Duration,
    ) -> Result<(), SendError<'c>> {
        match &self.conn {
            Some(c) => c.send_timeout(buf, timeout),
            None => Err(SendError::Closed {
                buf,
                error: Error::Disconnected,
            }),
        }
    }

    /// [`Connection::flush`] on the current connection.
    ///
    /// # Errors
    ///
    /// As `Connection::flush`; [`Error::Disconnected`] with no connection.
    pub fn flush(&self) -> Result<(), Error> {
        match &self.conn {
            Some(c) => c.flush(),
            None => Err(Error::Disconnected),
        }
    }

    /// [`Connection::try_recv`] on the current connection.
    ///
    /// # Errors
    ///
    /// As `Connection::try_recv`; [`Error::Disconnected`] with no connection.
    #[inline]
    pub fn try_recv(&self) -> Result<Option<Message<'_>>, Error> {
        self.conn()?.try_recv()
    }

    /// [`Connection::recv_timeout`] on the current connection. It does not reconnect: a loss
    /// ends the wait with the connection's error; call [`maintain`](Self::maintain) (or
    /// [`wait_connected`](Self::wait_connected)) and receive again.
    ///
    /// # Errors
    ///
    /// As `Connection::recv_timeout`; [`Error::Disconnected`] at once with no connection.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message<'_>, Error> {
        self.conn()?.recv_timeout(timeout)
    }

    /// [`Connection::poll`] (the batch receive) on the current connection.
    ///
    /// # Errors
    ///
    /// As `Connection::poll`; [`Error::Disconnected`] with no connection.
    pub fn poll(&self, handler: impl FnMut(&[u8]), limit: usize) -> Result<usize, Error> {
        self.conn()?.poll(handler, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_zeromq_like() {
        let p = ReconnectPolicy::default();
        assert_eq!(p.get_interval(), Duration::from_millis(100));
        assert_eq!(p.get_max_attempts(), None);
        assert_eq!(p.base_delay(1), Duration::from_millis(100));
        assert_eq!(p.base_delay(2), Duration::from_millis(200));
        assert_eq!(p.base_delay(4), Duration::from_millis(800));
        assert_eq!(p.base_delay(100), Duration::from_secs(5));
        assert_eq!(p.base_delay(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn delays_stay_within_jitter() {
        let p = ReconnectPolicy::new()
            .interval(Duration::from_millis(50))
            .jitter(0.25)
            .backoff(3.0)
            .max_interval(Duration::from_secs(1));
        for attempt in 1..20 {
            let base = p.base_delay(attempt);
            for u in [-1.0, -0.5, 0.0, 0.7, 1.0, 7.0, f64::NAN] {
                let d = p.delay(attempt, u);
                assert!(d <= p.delay_bound(attempt), "{attempt} {u}: {d:?}");
                assert!(d >= scale(base, 0.75), "{attempt} {u}: {d:?}");
            }
        }
        assert_eq!(p.base_delay(3), Duration::from_millis(450));
        assert_eq!(p.base_delay(4), Duration::from_secs(1));
    }

    #[test]
    fn setters_clamp() {
        let p = ReconnectPolicy::new()
            .jitter(f64::NAN)
            .backoff(0.5)
            .interval(Duration::MAX)
            .max_interval(Duration::MAX);
        assert_eq!(p.get_jitter(), 0.0);
        assert_eq!(p.get_backoff(), 1.0);
        assert_eq!(p.delay_bound(u32::MAX), Duration::MAX);
        assert_eq!(ReconnectPolicy::new().jitter(5.0).get_jitter(), 1.0);
        assert_eq!(ReconnectPolicy::new().backoff(f64::NAN).get_backoff(), 1.0);
    }
}
