//! Pollers: the data-path agents.
//!
//! A [`Poller<F>`] is an Aeron-style agent: [`Poller::do_work`] runs one cycle and returns how much
//! work it did; the thread driving it (a dedicated pinned poller thread, or an application thread
//! in run-to-completion mode, see [`RunToCompletion`]) applies its idle strategy when that is zero.
//! Both modes run exactly this code.
//!
//! One cycle:
//! 1. drain at most [`COMMAND_BUDGET`] commands from the control thread (add / remove a
//!    connection, a fabric command);
//! 2. poll shared completion sources ([`Fabric::poll_shared`]);
//! 3. for each connection: receive a burst into the application's receive ring, drain the
//!    application's send ring and post it in one batch, return dropped receive buffers, reclaim
//!    send buffers and credits, publish (one index store / doorbell).
//!
//! No locks, allocation, syscalls or logging: connection tables and notice backlogs are allocated
//! up front; failures become counters, connection state and notices to the control thread. The
//! one syscall is the control thread's wake-up (`Waker::wake`, an eventfd `write`) when a notice
//! is pushed: once per retired connection, never per message or per cycle.
//!
//! In run-to-completion mode a fabric that opts in (`FabricConn::RTC_DIRECT`: `mem://`, `tcp://`,
//! `rdma://`) also lets the application thread drive one connection's half between cycles, while
//! it holds the poller: one send posted, one message or a burst received, without the
//! application↔poller rings (`direct`, [`crate::link::RtcConn`]); `pass` holds the steps both
//! share. A fabric whose completions are shared (`Fabric::SHARED_COMPLETIONS`, rdma's CQ) has the
//! direct receive run the agent's shared poll (step 2) first when the half has nothing pending.
//!
//! This module is also the floor between the control thread and the pollers: the [`Command`] and
//! [`Notice`] rings and the control thread's end of them ([`PollerLink`]). The agent set
//! ([`Agents`], declared by `agent_set!`, one line per fabric with a poller side) is what one
//! poller thread drives.

use std::collections::VecDeque;
use std::sync::Arc;

use cm::control::Waker;
use rings::{Consumer, Producer, PushError, RingBuffer};

use crate::error::FabricError;
use crate::fabric::{ConnTable, Fabric, FabricConn};
use crate::link::{PollerConn, RtcConn};
use crate::stats::PollerCounters;
use crate::wake::PollerWake;

use direct::rtc_tag;
use pass::{post_ring, TxStep};
pub(crate) use rtc::{RtcGuard, RunToCompletion};
pub(crate) use sleep::{Sleeper, Slept};

/// Capacity of each control -> poller command ring.
pub(crate) const COMMAND_RING: usize = 1024;
/// Most commands a poller takes per cycle.
pub(crate) const COMMAND_BUDGET: usize = 8;
/// Most cycles the control thread runs for an idle run-to-completion application per beat
/// ([`RunToCompletion::poll_if_idle`]): enough to drain a full command ring.
pub(crate) const IDLE_CYCLES: usize = COMMAND_RING / COMMAND_BUDGET + 1;
/// Most messages a run-to-completion direct receive moves into the receive ring after the one
/// it hands over (`RtcConn::recv_one`), per burst: the engine's default batch. More bursts
/// follow while the fabric holds a unit split (`FabricConn::rx_split`, an rdma frame).
pub(crate) const DIRECT_BURST: usize = 32;
/// A poller runs the per-connection liveness check every this many cycles...
const CHECK_EVERY: u64 = 4096;
/// ... and at least this often by the coarse clock (an idle, parking poller runs few cycles;
/// RDMA heartbeats are sent from this check).
const CHECK_INTERVAL_NS: u64 = 10_000_000;

/// A control-thread -> poller command.
pub(crate) enum Command<F: Fabric> {
    /// Serve a new connection.
    Add(Box<PollerConn<F::Conn>>),
    /// Stop serving connection `id` (closed by the application) after a last service pass, or,
    /// where the fabric asks for it, once what it queued is posted and settled
    /// ([`FabricConn::settled`]).
    Remove(u64),
    /// The peer of connection `id` closed it, as the control thread saw (RDMA: rdma_cm's
    /// DISCONNECTED): deliver everything it sent first, then retire the connection as
    /// disconnected.
    // Sent only by a fabric whose control half sees a peer's close out of band (rdma).
    #[allow(dead_code)]
    PeerClosed(u64),
    /// A command for the poller's fabric state.
    #[allow(dead_code)]
    Fabric(F::Command),
}

/// A poller -> control-thread notice.
pub(crate) enum Notice<C> {
    /// The poller no longer serves this connection; the control thread releases its resources
    /// (unmap, close) off the data path. `error` is set when the data path failed it.
    Retired {
        conn: Box<PollerConn<C>>,
        error: Option<FabricError>,
    },
}

/// The control thread's end of one poller's rings for fabric `F`.
pub(crate) struct PollerLink<F: Fabric> {
    commands: Producer<Command<F>>,
    pub(crate) notices: Consumer<Notice<F::Conn>>,
    /// Commands that did not fit the ring yet (the poller is behind), oldest first.
    pending: VecDeque<Command<F>>,
    /// Connections this poller owns (used to pick the least-loaded poller).
    pub(crate) load: usize,
    /// The poller's wake-up when it may sleep (`Block`): written after a command is pushed.
    wake: Option<Arc<PollerWake>>,
}

impl<F: Fabric> PollerLink<F> {
    pub(crate) fn new(
        commands: Producer<Command<F>>,
        notices: Consumer<Notice<F::Conn>>,
        wake: Option<Arc<PollerWake>>,
    ) -> Self {
        PollerLink {
            commands,
            notices,
            pending: VecDeque::new(),
            load: 0,
            wake,
        }
    }

    /// Wakes the poller if it sleeps (after a command was pushed).
    fn wake(&self) {
        if let Some(w) = &self.wake {
            w.wake();
        }
    }

    /// Queues `cmd` for the poller, keeping order behind commands still pending.
    pub(crate) fn send(&mut self, cmd: Command<F>) {
        if !self.pending.is_empty() {
            self.pending.push_back(cmd);
            self.flush();
            return;
        }
        if let Err(PushError::Full(cmd)) = self.commands.push(cmd) {
            self.pending.push_back(cmd);
        }
        self.wake();
    }

    /// Commands wait for room in the ring (the control thread retries them soon).
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Pushes pending commands until the ring is full again.
    pub(crate) fn flush(&mut self) {
        while let Some(cmd) = self.pending.pop_front() {
            if let Err(PushError::Full(cmd)) = self.commands.push(cmd) {
                self.pending.push_front(cmd);
                break;
            }
        }
        self.wake();
    }
}

impl<C: FabricConn> PollerConn<C> {
    /// Steps 3-5 of the cycle for this connection. Returns the work done.
    ///
    /// An idle connection (nothing received, nothing queued by the application, nothing for the
    /// fabric to collect or publish) costs a few loads here, inlined into the cycle; the full pass
    /// is a separate call.
    #[inline(always)]
    fn service(&mut self, batch: usize, counters: &PollerCounters) -> Result<usize, FabricError> {
        if self.deferred.is_some() {
            return Err(self.take_deferred());
        }
        let rx_pending = self.fabric.rx_pending();
        // The send ring is stamped: the check loads the next slot's stamp, so a send's
        // descriptor arrives with the news of it (one line; see `link::conn_pair`).
        if !rx_pending && self.tx.is_empty() && self.release.is_empty() && self.fabric.quiescent() {
            self.drained = true;
            return Ok(0);
        }
        self.service_pass(rx_pending, batch, counters)
    }

    /// A failure a direct send or receive (run-to-completion) met: this pass reports it.
    #[cold]
    #[inline(never)]
    fn take_deferred(&mut self) -> FabricError {
        self.deferred
            .take()
            .unwrap_or(FabricError::Protocol("deferred failure missing"))
    }

    /// The full pass of [`service`](Self::service); `rx_pending` is the fabric's hint.
    #[inline(never)]
    fn service_pass(
        &mut self,
        rx_pending: bool,
        batch: usize,
        counters: &PollerCounters,
    ) -> Result<usize, FabricError> {
        let mut work = 0;
        // Receive: at most `batch`, and no more than the application's ring can take.
        if !rx_pending {
            self.drained = true;
        } else {
            work += self.receive(batch, counters)?;
        }

        let TxStep {
            fabric,
            mut done,
            tx,
            release,
            tx_pool,
            tx_large,
            shared,
            ..
        } = self.tx_step();

        // Send: drain one batch of the application's send ring.
        work += post_ring(
            fabric, tx, &mut done, tx_pool, tx_large, shared, batch, counters,
        )?;

        // Recycle: receive buffers the application dropped.
        {
            let chunk = release.read_chunk_up_to(batch);
            if !chunk.is_empty() {
                let (a, b) = chunk.as_slices();
                fabric.release_rx(a)?;
                if !b.is_empty() {
                    fabric.release_rx(b)?;
                }
                work += chunk.len();
                chunk.release_all();
            }
        }

        // Reclaim send buffers and credits.
        work += fabric.reclaim(&mut done)?;
        done.publish()?;
        let credits = done.returned();
        self.return_credits(credits);
        self.fabric.flush()?;
        Ok(work)
    }
}

/// One data-path agent: a fabric's per-poller state and the connections it serves.
pub(crate) struct Poller<F: Fabric> {
    fabric: F,
    slots: Vec<Option<Box<PollerConn<F::Conn>>>>,
    active: Vec<u32>,
    free_slots: Vec<u32>,
    commands: Consumer<Command<F>>,
    notices: Producer<Notice<F::Conn>>,
    backlog: Vec<Notice<F::Conn>>,
    /// Wakes the control thread when a notice is pushed (one `write(2)` per notice: notices
    /// are per-connection events, never per message or per cycle).
    waker: Arc<Waker>,
    counters: Arc<PollerCounters>,
    batch: usize,
    cycle: u64,
    /// Coarse time at which the liveness check is due at the latest.
    next_check_ns: u64,
    /// This poller's wake-up when it may sleep (`Block`), given to every connection it serves.
    wake: Option<Arc<PollerWake>>,
    /// A direct receive's shared poll ([`Fabric::SHARED_COMPLETIONS`]) filed completions that
    /// no pass has served yet: the agent does not sleep before its next cycle.
    unserved: bool,
    /// A dedicated poller thread: its connections' receive steps pack small messages
    /// ([`PollerConn::pack_rx`]).
    pack_rx: bool,
}

impl<F: Fabric> Poller<F> {
    /// A poller with room for `max_conns` connections (allocated now, never again) and the
    /// control thread's end of its rings ([`COMMAND_RING`] commands, a notice for every
    /// connection slot plus slack). `wake`: its wake-up, when it may sleep (`Block`).
    /// `pack_rx`: a dedicated poller thread (not run to completion on the application's), whose
    /// receive steps pack small messages into shared receive slots
    /// ([`RxSink::packing`](crate::fabric::RxSink::packing)).
    pub(crate) fn with_link(
        fabric: F,
        waker: Arc<Waker>,
        counters: Arc<PollerCounters>,
        max_conns: usize,
        batch: usize,
        wake: Option<Arc<PollerWake>>,
        pack_rx: bool,
    ) -> (Poller<F>, PollerLink<F>) {
        let (cmd_p, cmd_c) = RingBuffer::new(COMMAND_RING);
        let (note_p, note_c) = RingBuffer::new(max_conns + 64);
        let mut slots = Vec::with_capacity(max_conns);
        slots.resize_with(max_conns, || None);
        let poller = Poller {
            fabric,
            slots,
            active: Vec::with_capacity(max_conns),
            free_slots: (0..max_conns as u32).rev().collect(),
            commands: cmd_c,
            notices: note_p,
            backlog: Vec::with_capacity(max_conns),
            waker,
            counters,
            batch,
            cycle: 0,
            next_check_ns: 0,
            wake: wake.clone(),
            unserved: false,
            pack_rx,
        };
        (poller, PollerLink::new(cmd_p, note_c, wake))
    }

    /// One cycle; returns the work done (0: idle). `now_ns` is the engine's coarse clock.
    #[inline]
    pub(crate) fn do_work(&mut self, now_ns: u64) -> usize {
        if self.active.is_empty() && self.backlog.is_empty() && self.commands.is_empty() {
            // Serving nothing and told nothing: an agent of a fabric the application does not
            // use (every poller cycle visits every fabric's agent). Its cycle would only count
            // itself: about 40 instructions of each run-to-completion poll over rdma, twice.
            return 0;
        }
        let mut work = 0;
        self.cycle = self.cycle.wrapping_add(1);

        // 1. Commands (bounded).
        for _ in 0..COMMAND_BUDGET {
            match self.commands.pop() {
                Ok(cmd) => {
                    work += 1;
                    self.counters.commands.add(1);
                    self.on_command(cmd);
                }
                Err(_) => break,
            }
        }
        if !self.backlog.is_empty() {
            self.flush_backlog();
        }

        // 2. Shared completion sources.
        work += self.fabric.poll_shared(&mut ConnTable {
            slots: &mut self.slots,
        });
        if F::SHARED_COMPLETIONS {
            // What a direct receive's shared poll filed is served by this cycle's passes.
            self.unserved = false;
        }

        // 3-5. Each connection.
        let check = self.cycle % CHECK_EVERY == 0 || now_ns >= self.next_check_ns;
        if check {
            self.next_check_ns = now_ns.saturating_add(CHECK_INTERVAL_NS);
        }
        let mut i = 0;
        while i < self.active.len() {
            let slot = self.active[i] as usize;
            let Some(Some(conn)) = self.slots.get_mut(slot) else {
                i += 1;
                continue;
            };
            let mut res = conn.service(self.batch, &self.counters);
            if check && !conn.draining && !conn.closing {
                if let (Ok(_), Err(e)) = (&res, conn.fabric.check_peer(now_ns)) {
                    res = Err(e);
                }
            }
            // Draining: everything the peer sent is delivered once the fabric is empty and the
            // shared completion source had nothing left this cycle.
            let finished = conn.draining && conn.drained && !self.fabric.backlog();
            // Closing: what the application queued is posted and settled, as the fabric sees it.
            let closed = conn.closing && !finished && conn.fabric.settled(!conn.tx.is_empty());
            if finished && matches!(res, Err(FabricError::PeerClosed)) {
                // Draining, and the fabric reports the close again instead of data: what it
                // could deliver is delivered (a large message whose READ the departed peer can
                // no longer serve is lost with it), so the drain is finished as one that ran
                // dry. Kept draining instead, the connection never finished (nor was its
                // liveness checked: a draining peer is known gone).
                res = Ok(0);
            }
            match res {
                Ok(n) if finished => {
                    // Everything the departed peer sent is delivered: now the application
                    // sees the disconnect.
                    work += n + 1;
                    conn.shared.disconnect();
                    conn.fabric.close();
                    let reason = conn.drain_reason;
                    self.retire(i, reason);
                }
                Ok(n) if closed => {
                    work += n + 1;
                    conn.fabric.close();
                    self.retire(i, None);
                }
                Ok(n) => {
                    work += n;
                    i += 1;
                }
                Err(_) if conn.closing => {
                    // The application closed it: its last pass failing is nobody's news.
                    work += 1;
                    conn.fabric.close();
                    self.retire(i, None);
                }
                Err(FabricError::PeerClosed) => {
                    // A clean close by the peer: deliver what it sent before closing first.
                    conn.draining = true;
                    conn.drain_reason = Some(FabricError::PeerClosed);
                    work += 1;
                    i += 1;
                }
                Err(e) => {
                    self.counters.conn_errors.add(1);
                    self.retire(i, Some(e));
                    work += 1;
                }
            }
        }

        self.counters.cycles.add(1);
        if work > 0 {
            self.counters.busy_cycles.add(1);
        } else {
            self.counters.empty_cycles.add(1);
        }
        work
    }

    fn on_command(&mut self, cmd: Command<F>) {
        match cmd {
            Command::Add(mut conn) => match self.free_slots.pop() {
                Some(slot) => {
                    conn.fabric.attached(slot);
                    conn.pack_rx = self.pack_rx;
                    if let Some(w) = &self.wake {
                        // Before the first service pass, so before it can ever sleep.
                        conn.block = true;
                        conn.shared.bell().arm();
                        conn.shared.set_poller_wake(w);
                        conn.fabric.attach_wake(w);
                    }
                    if <F::Conn as FabricConn>::RTC_DIRECT {
                        // The application thread may drive this half directly while it holds
                        // the run-to-completion guard (`crate::link::RtcConn`).
                        conn.rtc_counters = Some(self.counters.clone());
                        conn.shared.rtc.set(rtc_tag::<F>(), slot);
                    }
                    self.slots[slot as usize] = Some(conn);
                    self.fabric.conn_attached();
                    self.active.push(slot);
                    self.counters.connections.set(self.active.len() as u64);
                }
                None => {
                    // The control thread checks capacity before sending; this is a last resort.
                    self.counters.conn_errors.add(1);
                    conn.shared
                        .fail(FabricError::Protocol("poller connection table full"));
                    conn.shared.set_retired();
                    self.notify(Notice::Retired {
                        conn,
                        error: Some(FabricError::Protocol("poller connection table full")),
                    });
                }
            },
            Command::Remove(id) => {
                // The cycle's service pass posts what the application queued before closing (and
                // delivers what the peer sent); the connection is retired after it, or, where the
                // fabric asks to linger, once that is posted and settled (or it fails). The
                // control thread's close grace bounds the wait.
                if let Some(conn) = self.conn_mut(id) {
                    conn.closing = true;
                }
            }
            Command::PeerClosed(id) => {
                // Like a peer close the data path saw: what arrived before it is delivered
                // first (the cycle's shared poll files it, after this command).
                if let Some(conn) = self.conn_mut(id) {
                    if !conn.draining {
                        conn.draining = true;
                        conn.drained = false;
                        conn.drain_reason = Some(FabricError::PeerClosed);
                    }
                }
            }
            Command::Fabric(c) => self.fabric.on_command(c),
        }
    }

    /// The active connection `id`, if this poller serves it.
    fn conn_mut(&mut self, id: u64) -> Option<&mut PollerConn<F::Conn>> {
        let slots = &mut self.slots;
        let slot = *self
            .active
            .iter()
            .find(|&&s| matches!(&slots[s as usize], Some(c) if c.id == id))?;
        slots[slot as usize].as_deref_mut()
    }

    /// Removes `active[i]` and hands it to the control thread.
    fn retire(&mut self, i: usize, error: Option<FabricError>) {
        let slot = self.active.swap_remove(i);
        self.counters.connections.set(self.active.len() as u64);
        if let Some(mut conn) = self.slots[slot as usize].take() {
            // From here on the half is not found through its registration.
            conn.shared.rtc.clear();
            conn.rtc_counters = None;
            self.free_slots.push(slot);
            if let Some(e) = error {
                conn.shared.fail(e);
                if let Some(reason) = e.abort_reason() {
                    conn.fabric.abort(reason);
                }
                conn.fabric.close();
            }
            conn.shared.set_retired();
            self.notify(Notice::Retired { conn, error });
        }
    }

    /// Hands `notice` to the control thread and wakes it (a connection event, not a per-message
    /// path: the control thread has no periodic turn that would pick the notice up).
    fn notify(&mut self, notice: Notice<F::Conn>) {
        if !self.backlog.is_empty() {
            self.flush_backlog();
        }
        if self.backlog.is_empty() {
            match self.notices.push(notice) {
                Ok(()) => self.waker.wake(),
                Err(rings::PushError::Full(n)) => self.backlog.push(n),
            }
        } else {
            // Capacity reserved up front: at most one notice per connection slot is pending.
            self.backlog.push(notice);
        }
    }

    /// Pushes backlogged notices (only when there are any: the cycle checks first) and wakes
    /// the control thread if any went out.
    fn flush_backlog(&mut self) {
        let mut pushed = false;
        while let Some(n) = self.backlog.pop() {
            if let Err(rings::PushError::Full(n)) = self.notices.push(n) {
                self.backlog.push(n);
                break;
            }
            pushed = true;
        }
        if pushed {
            self.waker.wake();
        }
    }

    /// Retires every connection (engine shutdown).
    pub(crate) fn retire_all(&mut self) {
        while !self.active.is_empty() {
            let slot = self.active[0] as usize;
            if let Some(conn) = self.slots[slot].as_mut() {
                conn.fabric.close();
            }
            self.retire(0, None);
        }
    }
}

/// Declares the agent set: one [`Poller`] per compiled-in fabric, driven together by one poller
/// thread (or by the application threads in run-to-completion mode), and the control thread's
/// ends of their rings ([`AgentLinks`]). Each fabric is one line; its attributes (`cfg`) apply to
/// every use of it.
macro_rules! agent_set {
    ($($(#[$attr:meta])* $name:ident: $fabric:ty = $make:expr,)*) => {
        /// Everything one poller thread drives: one [`Poller`] per compiled-in fabric.
        pub(crate) struct Agents {
            $($(#[$attr])* $name: Poller<$fabric>,)*
            /// `Block`: the set's wake-up and its `poll(2)` set.
            sleeper: Option<Sleeper>,
        }

        /// The control thread's ends of every poller's rings, one `Vec` per fabric (index =
        /// poller), taken apart by the control dispatcher.
        pub(crate) struct AgentLinks {
            $($(#[$attr])* pub(crate) $name: Vec<PollerLink<$fabric>>,)*
        }

        impl Agents {
            /// One agent set per entry of `counters` (the pollers' counters, shared by the
            /// fabrics of one poller), and the control thread's ends of their rings.
            ///
            /// `sleep`: the engine's strategy is `Block`, with `tick` the longest sleep its
            /// liveness checks allow; each set gets a wake-up (an eventfd). `pack_rx`: the
            /// pollers are dedicated threads, and pack small received messages
            /// ([`Poller::with_link`]).
            ///
            /// # Errors
            ///
            /// The eventfd of a wake-up could not be made.
            pub(crate) fn build(
                counters: &[Arc<PollerCounters>],
                waker: &Arc<Waker>,
                max_conns: usize,
                batch: usize,
                sleep: Option<std::time::Duration>,
                pack_rx: bool,
            ) -> std::io::Result<(Vec<Agents>, AgentLinks)> {
                let mut links = AgentLinks {
                    $($(#[$attr])* $name: Vec::with_capacity(counters.len()),)*
                };
                let mut agents = Vec::with_capacity(counters.len());
                for pc in counters {
                    let sleeper = match sleep {
                        Some(tick) => Some(Sleeper::new(pc.clone(), max_conns, tick)?),
                        None => None,
                    };
                    let wake = sleeper.as_ref().map(Sleeper::wake);
                    agents.push(Agents {
                        $($(#[$attr])* $name: {
                            let (poller, link) = Poller::with_link(
                                $make,
                                waker.clone(),
                                pc.clone(),
                                max_conns,
                                batch,
                                wake.clone(),
                                pack_rx,
                            );
                            links.$name.push(link);
                            poller
                        },)*
                        sleeper,
                    });
                }
                Ok((agents, links))
            }

            /// `Block`: the set's wake-up (`None` for other strategies).
            pub(crate) fn wake(&self) -> Option<Arc<PollerWake>> {
                self.sleeper.as_ref().map(Sleeper::wake)
            }

            /// `Block`, after the spin phase: arms every source of work of every agent and
            /// sleeps until one wakes it, for at most `max` (and the liveness tick). Returns at
            /// once when work is pending already, or without a wake-up (other strategies).
            pub(crate) fn sleep(&mut self, max: std::time::Duration) -> Slept {
                let Some(sleeper) = self.sleeper.as_mut() else {
                    return Slept::No;
                };
                let slept = sleeper.sleep(max, |set| {
                    let mut armed = true;
                    $($(#[$attr])* {
                        armed = armed && self.$name.arm(set);
                    })*
                    armed
                });
                if slept != Slept::No {
                    $($(#[$attr])* {
                        self.$name.woke();
                    })*
                }
                slept
            }

            /// Run-to-completion's direct way: the half of the connection `shared` as its
            /// registration ([`crate::link::RtcSlot`]) names it, if one of these agents serves
            /// it there.
            #[inline]
            pub(crate) fn rtc_conn(
                &mut self,
                shared: &crate::link::ConnShared,
                rx: bool,
            ) -> Option<&mut dyn RtcConn> {
                let (tag, slot) = shared.rtc.get()?;
                $($(#[$attr])* {
                    if tag == const { rtc_tag::<$fabric>() } {
                        return self.$name.rtc_conn(slot, shared, rx);
                    }
                })*
                None
            }

            /// One cycle of every agent.
            #[inline]
            pub(crate) fn do_work(&mut self, now_ns: u64) -> usize {
                let mut work = 0;
                $($(#[$attr])* {
                    work += self.$name.do_work(now_ns);
                })*
                work
            }

            /// Whether a command waits for any agent (one a cycle's [`COMMAND_BUDGET`] left).
            pub(crate) fn commands_pending(&mut self) -> bool {
                $($(#[$attr])* {
                    if !self.$name.commands.is_empty() {
                        return true;
                    }
                })*
                false
            }

            /// Retires every connection of every agent (engine shutdown).
            pub(crate) fn retire_all(&mut self) {
                $($(#[$attr])* {
                    self.$name.retire_all();
                })*
            }
        }
    };
}

// The agent set: one line per fabric with a poller side (a direct-path-only fabric, as shm, has
// none). Adding such a fabric adds its line here (and one in `crate::control`'s dispatcher).
agent_set! {
    tcp: crate::fabric::tcp::TcpFabric = crate::fabric::tcp::TcpFabric::new(),
    mem: crate::fabric::mem::MemFabric = crate::fabric::mem::MemFabric,
    #[cfg(feature = "rdma")]
    rdma: crate::fabric::rdma::RdmaFabric = crate::fabric::rdma::RdmaFabric::new(),
}

#[path = "poller/direct.rs"]
mod direct;
#[path = "poller/pass.rs"]
mod pass;
#[path = "poller/rtc.rs"]
mod rtc;
#[path = "poller/sleep.rs"]
mod sleep;
#[cfg(test)]
#[path = "poller/tests.rs"]
mod tests;
