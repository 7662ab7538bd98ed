//! The driver's connections: [`Slot`]s (a reconnecting connection and its current incarnation's
//! counters), the [`Totals`] they add up to, and the [`Driver`] that runs them, the idle
//! connections and the hostile peers in one thread.

use std::process::Child;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, Error, Event, FabricError, ReconnectEvent, Reconnecting};

use crate::hostile::Hostile;
use crate::msg::{carried_seq, fill, mix, msg_len};
use crate::tap::EventTap;
use crate::{DRAIN, WINDOW};

/// An echo peer process.
pub struct Peer {
    pub endpoint: String,
    pub child: Child,
    pub stopped: bool,
}

/// One connection slot: a reconnecting connection and its current incarnation's counters.
pub struct Slot {
    pub peer: usize,
    pub rc: Reconnecting,
    seed: u64,
    sent: u64,
    echoed: u64,
    /// Closing (churn): no more sends; close once every echo is back or at this deadline.
    pub closing: Option<Instant>,
}

#[derive(Default)]
pub struct Totals {
    pub moved: u64,
    pub bytes: u64,
    pub lost: u64,
    pub corrupt: u64,
    pub unconfirmed: u64,
    pub in_doubt: u64,
    pub losses: u64,
    pub unresponsive: u64,
    pub unresponsive_losses: u64,
    pub reconnects: u64,
    pub churned: u64,
    pub kills: u64,
    pub stops: u64,
    pub gave_up: u64,
}

/// The idler's connections and what its idle periods showed.
#[derive(Debug, Default)]
pub struct IdleStats {
    /// Idle periods the idler went through (each [`crate::peer::IDLE_FOR`] without a call).
    pub periods: u64,
    /// Periods after which every idle connection carried a verified echo again.
    pub verified_after: u64,
    /// An idle connection reported down (either side): must be 0.
    pub false_reports: u64,
}

impl Slot {
    pub fn new(peer: usize, endpoint: &str, engine: &Engine, seed: u64) -> Result<Slot, Error> {
        Ok(Slot {
            peer,
            rc: Reconnecting::start(engine, endpoint, crate::policy())?,
            seed,
            sent: 0,
            echoed: 0,
            closing: None,
        })
    }

    fn new_incarnation(&mut self, seed: u64) {
        self.seed = seed;
        self.sent = 0;
        self.echoed = 0;
    }

    /// Sends what the window allows and checks the echoes; returns the work done.
    fn pump(&mut self, t: &mut Totals) -> usize {
        let mut work = 0;
        let max = self.rc.connection().map_or(0, Connection::max_message_size);
        if self.closing.is_none() {
            while self.sent - self.echoed < WINDOW {
                let len = msg_len(self.seed, self.sent, max);
                // A pool buffer, a ring record, or above the buffer size a large slot.
                let Ok(mut b) = self.rc.claim(len) else { break };
                fill(&mut b, self.seed, self.sent);
                if self.rc.send(b).is_err() {
                    break;
                }
                self.sent += 1;
                work += 1;
            }
            // A connection that went down is seen (and replaced) by the poll below.
            let _ = self.rc.flush();
        }
        let (seed, sent, echoed) = (self.seed, self.sent, &mut self.echoed);
        let got = self.rc.poll(
            |m| {
                let seq = *echoed;
                let len = msg_len(seed, seq, max);
                let mut want = vec![0u8; len];
                fill(&mut want, seed, seq);
                if m == &want[..] {
                    *echoed += 1;
                } else if let Some(s) = carried_seq(m).filter(|&s| s > seq && s < sent) {
                    // A gap: messages seq..s never came back although s did.
                    t.lost += s - seq;
                    *echoed = s + 1;
                } else {
                    t.corrupt += 1;
                    *echoed += 1;
                }
                t.moved += 1;
                t.bytes += m.len() as u64;
            },
            64,
        );
        work + got.unwrap_or(0)
    }

    /// Runs the helper and the pump once: `Some(error)` when the connection was lost.
    fn service(&mut self, seed: u64, t: &mut Totals) -> (usize, Option<Error>) {
        let mut lost = None;
        self.rc.maintain();
        while let Some(ev) = self.rc.try_event() {
            match ev {
                ReconnectEvent::Lost {
                    unconfirmed, error, ..
                } => {
                    t.losses += 1;
                    t.unconfirmed += unconfirmed;
                    t.in_doubt += self.sent - self.echoed;
                    if matches!(error, Error::Fabric(FabricError::PeerUnresponsive { .. })) {
                        t.unresponsive_losses += 1;
                    }
                    self.closing = None;
                    lost = Some(error);
                }
                ReconnectEvent::Reconnected { .. } => {
                    t.reconnects += 1;
                    self.new_incarnation(seed);
                }
                ReconnectEvent::GaveUp { .. } => t.gave_up += 1,
                _ => {}
            }
        }
        (self.pump(t), lost)
    }
}

pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

pub struct Driver {
    pub engine: Engine,
    events: EventTap,
    pub peers: Vec<Peer>,
    pub slots: Vec<Slot>,
    /// Connections to the idler (shm and tcp), its process and its output lines.
    pub idle: Vec<Slot>,
    pub idler: (Child, Receiver<String>),
    /// Each idle connection's echo count when the last idle period ended, until it echoes
    /// past it.
    idle_marks: Option<Vec<u64>>,
    pub idle_stats: IdleStats,
    pub hostile: Hostile,
    pub t: Totals,
    rng: u64,
}

impl Driver {
    pub fn new(
        engine: Engine,
        peers: Vec<Peer>,
        idler: (Child, Receiver<String>),
        hostile: Hostile,
    ) -> Driver {
        Driver {
            events: EventTap::new(&engine),
            engine,
            peers,
            slots: Vec::new(),
            idle: Vec::new(),
            idler,
            idle_marks: None,
            idle_stats: IdleStats::default(),
            hostile,
            t: Totals::default(),
            rng: u64::from(std::process::id()) ^ 0x5eed,
        }
    }

    pub fn rand(&mut self) -> u64 {
        self.rng = mix(self.rng);
        self.rng
    }

    /// One pass over every slot, the idle connections, the hostile peers and the engine's
    /// events; returns the work done.
    pub fn step(&mut self) -> usize {
        let mut work = self.engine.poll();
        while let Some((_, e)) = self.events.try_recv() {
            if self.hostile.on_event(&e) {
                continue;
            }
            if matches!(e, Event::PeerUnresponsive { .. }) {
                self.t.unresponsive += 1;
            }
        }
        for i in 0..self.slots.len() {
            let seed = self.rand();
            work += self.slots[i].service(seed, &mut self.t).0;
        }
        for i in 0..self.idle.len() {
            let seed = self.rand();
            let (n, lost) = self.idle[i].service(seed, &mut self.t);
            work += n;
            if let Some(e) = lost {
                self.idle_stats.false_reports += 1;
                println!("soak: FAIL: idle connection {i} reported down: {e}");
            }
        }
        work += self.idle_lines() + self.hostile.poll();
        work
    }

    /// Reads the idler's lines and checks that each idle connection echoes after an idle
    /// period; returns the work done.
    fn idle_lines(&mut self) -> usize {
        let mut work = 0;
        while let Ok(line) = self.idler.1.try_recv() {
            work += 1;
            if line == "idle-end" {
                self.idle_stats.periods += 1;
                self.idle_marks = Some(self.idle.iter().map(|s| s.echoed).collect());
            } else if let Some(e) = line.strip_prefix("down ") {
                self.idle_stats.false_reports += 1;
                println!("soak: FAIL: the idler's connection went down: {e}");
            }
        }
        if let Some(marks) = &self.idle_marks {
            if self.idle.iter().zip(marks).all(|(s, &m)| s.echoed > m) {
                self.idle_stats.verified_after += 1;
                self.idle_marks = None;
            }
        }
        work
    }

    /// An idle period ended and not every idle connection echoed since.
    pub fn idle_unverified(&self) -> bool {
        self.idle_marks.is_some()
    }

    /// Closes the connections being churned whose echoes are all back (or whose drain ran out).
    pub fn finish_closes(&mut self) -> Result<(), Error> {
        let now = Instant::now();
        for i in 0..self.slots.len() {
            let Some(deadline) = self.slots[i].closing else {
                continue;
            };
            let s = &self.slots[i];
            let done = s.echoed == s.sent;
            if !done && now < deadline {
                continue;
            }
            if !done && s.rc.is_connected() {
                eprintln!(
                    "soak: connection closed with {} echoes missing",
                    s.sent - s.echoed
                );
                self.t.lost += s.sent - s.echoed;
            }
            let seed = self.rand();
            let peer = self.slots[i].peer;
            let ep = self.peers[peer].endpoint.clone();
            // Dropping the old helper closes its connection; the new one starts from scratch.
            self.slots[i] = Slot::new(peer, &ep, &self.engine, seed)?;
            self.t.churned += 1;
        }
        Ok(())
    }

    /// Starts closing slot `i` (churn), unless it is closing already.
    pub fn churn(&mut self, i: usize, now: Instant) {
        if self.slots[i].closing.is_none() {
            self.slots[i].closing = Some(now + DRAIN);
        }
    }

    fn all_connected(&self) -> bool {
        self.slots
            .iter()
            .chain(&self.idle)
            .all(|s| s.rc.is_connected() && s.closing.is_none())
    }

    /// Runs until every connection is up, no hostile probe is in flight and the last idle
    /// period is verified (bounded).
    pub fn settle(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let done = |d: &Driver| d.all_connected() && !d.hostile.pending() && !d.idle_unverified();
        while Instant::now() < deadline {
            if done(self) {
                return true;
            }
            let _ = self.finish_closes();
            if self.step() == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        done(self)
    }
}
