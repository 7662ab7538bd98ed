//! The soak (issue #15): connections under churn and peer failures, every message checked.
//!
//! ```text
//! cargo run --release -p spinwire --example soak -- [seconds]      # scripts/soak [minutes]
//! ```
//!
//! The driver (this process) spawns `PEERS` echo peers (this binary with `peer <endpoint>`),
//! each listening on its own shm name, and keeps `CONNS_PER_PEER` [`Reconnecting`] connections
//! to each. Meanwhile it sends messages of mixed sizes, 1 B to the connection's maximum message
//! size (`MAX_MESSAGE`: above the buffer size through large slots), and checks every echo;
//! closes and reopens a random connection every `CHURN_EVERY`; SIGKILLs a random peer every
//! `KILL_EVERY` and restarts it on the same name;
//! and SIGSTOPs another one every `STOP_EVERY` for `STOP_FOR` (longer than the liveness
//! timeout, so the driver sees `PeerUnresponsive`, then reconnects after the SIGCONT).
//!
//! Checks and what they count:
//! * Every message is sequence-checked: the n-th message of a connection (one *incarnation*:
//!   sequence numbers restart with each new connection) has a length and contents derived from
//!   (incarnation seed, n); messages of 12 B or more carry n and an FNV-1a checksum. Echoes must
//!   come back in order, complete and intact.
//! * **lost**: messages that vanished although the connection stayed up: a gap in a connection's
//!   echoes (a later message came back, an earlier one never did), or, for a connection the
//!   driver closed itself, a message never echoed back before the close. Must be 0.
//! * **corrupt**: an echo with the wrong length or contents. Must be 0.
//! * **unconfirmed**: the sum of [`ReconnectEvent::Lost`]'s counts: messages sent on a connection
//!   whose peer died or stopped, whose credit had not come back. Reported, not loss (the peer
//!   died with them).
//! * RSS (`VmRSS`) and open fds (`/proc/self/fd`) are sampled once every connection is up after
//!   a warm-up, and again at the end with every connection up again; the end may exceed the
//!   start by at most `RSS_TOLERANCE_KIB` and `FD_TOLERANCE`.
//!
//! The driver exits non-zero when any check fails. Everything runs in run-to-completion mode
//! with [`IdleStrategy::backoff`], one thread per process, so the soak never hogs the cores.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spinwire::{
    Connection, Engine, Error, Event, FabricError, IdleStrategy, ReconnectEvent, ReconnectPolicy,
    Reconnecting, SendError,
};

const PEERS: usize = 3;
const CONNS_PER_PEER: usize = 2;
const BUFFER_SIZE: usize = 16 * 1024;
const BUFFERS: usize = 32;
/// The largest message: above `BUFFER_SIZE` messages travel through large slots (issue #12),
/// two per connection and direction. Small enough that the slots the soak touches stay inside
/// the RSS tolerance.
const MAX_MESSAGE: usize = 256 * 1024;
/// Messages in flight per connection (sent, echo not yet back).
const WINDOW: u64 = 8;
const LIVENESS: Duration = Duration::from_millis(500);
const CHURN_EVERY: Duration = Duration::from_millis(1500);
const KILL_EVERY: Duration = Duration::from_secs(3);
const STOP_EVERY: Duration = Duration::from_secs(8);
/// 2.5 liveness timeouts: the driver must see the peer unresponsive.
const STOP_FOR: Duration = Duration::from_millis(1250);
const WARMUP: Duration = Duration::from_secs(2);
/// How long a connection being closed waits for its echoes.
const DRAIN: Duration = Duration::from_secs(5);
/// RSS growth allowed from the start sample to the end sample: allocator and page-cache noise
/// (every shm segment is 2 × 32 × 16 KiB = 1 MiB; a leaked connection per churn would show as
/// tens of MiB).
const RSS_TOLERANCE_KIB: u64 = 8 * 1024;
/// Open fds allowed on top of the start count (none expected; a leaked connection per churn or
/// kill would show as dozens).
const FD_TOLERANCE: usize = 2;

fn engine() -> Result<Engine, Error> {
    Engine::builder()
        .name("soak")
        .run_to_completion()
        .idle(IdleStrategy::backoff())
        .pool(BUFFER_SIZE, BUFFERS)
        .max_message_size(MAX_MESSAGE)
        .large_buffers(2)
        .liveness_timeout(LIVENESS)
        .build()
}

fn policy() -> ReconnectPolicy {
    ReconnectPolicy::new()
        .interval(Duration::from_millis(50))
        .backoff(2.0)
        .max_interval(Duration::from_millis(800))
        .jitter(0.2)
        // Short: a connect to a stopped peer waits for a handshake that never comes, and this
        // one thread serves every connection meanwhile.
        .connect_timeout(Duration::from_millis(250))
}

// ---- message contents ----

fn mix(mut x: u64) -> u64 {
    // splitmix64
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Length of message `seq` of incarnation `seed`: half 1..=64 B, 30 % up to 1 KiB, the rest up
/// to `max`, and every 97th exactly `max`.
fn msg_len(seed: u64, seq: u64, max: usize) -> usize {
    let r = mix(seed ^ seq.wrapping_mul(0x1000_0000_01b3));
    if seq % 97 == 96 {
        return max;
    }
    let (lo, hi) = match r % 10 {
        0..=4 => (1, 64),
        5..=7 => (65, 1024),
        _ => (1025, max),
    };
    let hi = hi.min(max);
    let lo = lo.min(hi);
    lo + (r >> 8) as usize % (hi - lo + 1)
}

fn fnv32(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn fill(buf: &mut [u8], seed: u64, seq: u64) {
    let x = mix(seed ^ seq);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (x >> ((i & 7) * 8)) as u8 ^ (i as u8);
    }
    if buf.len() >= 12 {
        let n = buf.len();
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        let sum = fnv32(&buf[..n - 4]);
        buf[n - 4..].copy_from_slice(&sum.to_le_bytes());
    }
}

/// The sequence number a message of 12 B or more carries, if its checksum holds.
fn carried_seq(m: &[u8]) -> Option<u64> {
    let n = m.len();
    if n < 12 || fnv32(&m[..n - 4]).to_le_bytes() != m[n - 4..] {
        return None;
    }
    Some(u64::from_le_bytes(m[..8].try_into().ok()?))
}

// ---- the peer ----

/// Echoes every message of every connection accepted on `endpoint` until stdin closes (the
/// driver went away) or it is killed.
fn peer(endpoint: &str) -> Result<(), Error> {
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
    let engine = engine()?;
    let listener = engine.listen(endpoint)?;
    println!("listening");
    let mut conns: Vec<Connection> = Vec::new();
    let mut idler_park = Duration::from_micros(1);
    loop {
        while let Some(c) = listener.try_accept()? {
            conns.push(c);
        }
        let mut work = engine.poll();
        conns.retain(|c| match echo(c) {
            Ok(n) => {
                work += n;
                true
            }
            Err(_) => false,
        });
        if work > 0 {
            idler_park = Duration::from_micros(1);
        } else {
            std::thread::sleep(idler_park);
            idler_park = (idler_park * 2).min(Duration::from_millis(1));
        }
    }
}

fn echo(c: &Connection) -> Result<usize, Error> {
    let mut n = 0;
    while n < 32 {
        let Some(m) = c.try_recv()? else { break };
        // Room of the message's size (a large slot above the buffer size); the driver keeps
        // consuming, so it comes within the bound.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut b = loop {
            match c.claim(m.len()) {
                Ok(b) => break b,
                Err(Error::WouldBlock) if Instant::now() < deadline => std::thread::yield_now(),
                Err(Error::WouldBlock) => return Err(Error::Timeout),
                Err(e) => return Err(e),
            }
        };
        b.copy_from(&m)?;
        drop(m);
        match c.send_timeout(b, Duration::from_secs(2)) {
            Ok(()) => {}
            Err(SendError::Timeout(_)) => return Err(Error::Timeout),
            Err(e) => return Err(e.into()),
        }
        n += 1;
    }
    c.flush()?;
    Ok(n)
}

// ---- the driver ----

struct Peer {
    endpoint: String,
    child: Child,
    stopped: bool,
}

fn spawn_peer(endpoint: &str) -> std::io::Result<Child> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["peer", endpoint])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    // Wait (bounded) for its "listening" line.
    let mut out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let mut seen = Vec::new();
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            if seen.windows(9).any(|w| w == b"listening") {
                let _ = tx.send(());
                seen.clear();
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other("peer did not start listening"));
    }
    Ok(child)
}

fn signal(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(pid, sig) };
    }
}

/// One connection slot: a reconnecting connection and its current incarnation's counters.
struct Slot {
    peer: usize,
    rc: Reconnecting,
    seed: u64,
    sent: u64,
    echoed: u64,
    /// Closing (churn): no more sends; close once every echo is back or at this deadline.
    closing: Option<Instant>,
}

#[derive(Default)]
struct Totals {
    moved: u64,
    bytes: u64,
    lost: u64,
    corrupt: u64,
    unconfirmed: u64,
    in_doubt: u64,
    losses: u64,
    unresponsive: u64,
    unresponsive_losses: u64,
    reconnects: u64,
    churned: u64,
    kills: u64,
    stops: u64,
    gave_up: u64,
}

impl Slot {
    fn new(peer: usize, endpoint: &str, engine: &Engine, seed: u64) -> Result<Slot, Error> {
        Ok(Slot {
            peer,
            rc: Reconnecting::start(engine, endpoint, policy())?,
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
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

struct Driver {
    engine: Engine,
    peers: Vec<Peer>,
    slots: Vec<Slot>,
    t: Totals,
    rng: u64,
}

impl Driver {
    fn rand(&mut self) -> u64 {
        self.rng = mix(self.rng);
        self.rng
    }

    /// One pass over every slot and the engine's events; returns the work done.
    fn step(&mut self) -> usize {
        let mut work = self.engine.poll();
        while let Some(e) = self.engine.try_event() {
            if matches!(e, Event::PeerUnresponsive { .. }) {
                self.t.unresponsive += 1;
            }
        }
        for i in 0..self.slots.len() {
            let seed = self.rand();
            let s = &mut self.slots[i];
            s.rc.maintain();
            while let Some(ev) = s.rc.try_event() {
                match ev {
                    ReconnectEvent::Lost {
                        unconfirmed, error, ..
                    } => {
                        self.t.losses += 1;
                        self.t.unconfirmed += unconfirmed;
                        self.t.in_doubt += s.sent - s.echoed;
                        if matches!(error, Error::Fabric(FabricError::PeerUnresponsive { .. })) {
                            self.t.unresponsive_losses += 1;
                        }
                        s.closing = None;
                    }
                    ReconnectEvent::Reconnected { .. } => {
                        self.t.reconnects += 1;
                        s.new_incarnation(seed);
                    }
                    ReconnectEvent::GaveUp { .. } => self.t.gave_up += 1,
                    _ => {}
                }
            }
            work += s.pump(&mut self.t);
        }
        work
    }

    /// Closes the connections being churned whose echoes are all back (or whose drain ran out).
    fn finish_closes(&mut self) -> Result<(), Error> {
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

    fn all_connected(&self) -> bool {
        self.slots
            .iter()
            .all(|s| s.rc.is_connected() && s.closing.is_none())
    }

    /// Runs until every connection is up (bounded).
    fn settle(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.all_connected() {
                return true;
            }
            let _ = self.finish_closes();
            if self.step() == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        self.all_connected()
    }
}

fn drive(secs: u64) -> Result<bool, Box<dyn std::error::Error>> {
    let engine = engine()?;
    let mut peers = Vec::new();
    for p in 0..PEERS {
        let endpoint = format!("shm://soak-{}-{p}", std::process::id());
        let child = spawn_peer(&endpoint)?;
        peers.push(Peer {
            endpoint,
            child,
            stopped: false,
        });
    }
    let mut d = Driver {
        engine,
        peers,
        slots: Vec::new(),
        t: Totals::default(),
        rng: u64::from(std::process::id()) ^ 0x5eed,
    };
    for p in 0..PEERS {
        for _ in 0..CONNS_PER_PEER {
            let seed = d.rand();
            let ep = d.peers[p].endpoint.clone();
            d.slots.push(Slot::new(p, &ep, &d.engine, seed)?);
        }
    }
    // Warm-up, then the start sample with every connection up.
    let warm = Instant::now() + WARMUP;
    while Instant::now() < warm {
        if d.step() == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if !d.settle(Duration::from_secs(10)) {
        return Err("connections did not come up".into());
    }
    let (rss0, fds0) = (rss_kib(), fd_count());
    println!(
        "soak: {secs} s, {PEERS} peers, {} connections, sizes 1..={} B; start rss {rss0} KiB, fds {fds0}",
        d.slots.len(),
        d.slots[0].rc.connection().map_or(0, Connection::max_message_size)
    );

    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let (mut next_churn, mut next_kill, mut next_stop) =
        (start + CHURN_EVERY, start + KILL_EVERY, start + STOP_EVERY);
    let mut resume_at: Option<(usize, Instant)> = None;
    let mut next_report = start + Duration::from_secs(10);
    while Instant::now() < end {
        let now = Instant::now();
        if now >= next_churn {
            next_churn = now + CHURN_EVERY;
            let i = d.rand() as usize % d.slots.len();
            if d.slots[i].closing.is_none() {
                d.slots[i].closing = Some(now + DRAIN);
            }
        }
        if now >= next_kill {
            next_kill = now + KILL_EVERY;
            let p = d.rand() as usize % PEERS;
            if !d.peers[p].stopped {
                let _ = d.peers[p].child.kill();
                let _ = d.peers[p].child.wait();
                d.t.kills += 1;
                let ep = d.peers[p].endpoint.clone();
                d.peers[p].child = spawn_peer(&ep)?;
            }
        }
        if now >= next_stop && resume_at.is_none() {
            next_stop = now + STOP_EVERY;
            let p = d.rand() as usize % PEERS;
            signal(&d.peers[p].child, libc::SIGSTOP);
            d.peers[p].stopped = true;
            d.t.stops += 1;
            resume_at = Some((p, now + STOP_FOR));
        }
        if let Some((p, at)) = resume_at {
            if now >= at {
                signal(&d.peers[p].child, libc::SIGCONT);
                d.peers[p].stopped = false;
                resume_at = None;
            }
        }
        if now >= next_report {
            next_report = now + Duration::from_secs(10);
            println!(
                "soak: {:>4} s: moved {} lost {} corrupt {} reconnects {} kills {} stops {}",
                start.elapsed().as_secs(),
                d.t.moved,
                d.t.lost,
                d.t.corrupt,
                d.t.reconnects,
                d.t.kills,
                d.t.stops
            );
        }
        d.finish_closes()?;
        if d.step() == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if let Some((p, _)) = resume_at {
        signal(&d.peers[p].child, libc::SIGCONT);
        d.peers[p].stopped = false;
    }
    let settled = d.settle(Duration::from_secs(15));
    let (rss1, fds1) = (rss_kib(), fd_count());
    let t = &d.t;
    println!("soak: ran {} s", start.elapsed().as_secs());
    println!("  messages moved      {} ({} MiB)", t.moved, t.bytes >> 20);
    println!("  lost                {}", t.lost);
    println!("  corrupt             {}", t.corrupt);
    println!(
        "  unconfirmed         {} (sent on connections whose peer died or stopped; not loss)",
        t.unconfirmed
    );
    println!(
        "  in doubt            {} (echo not seen when such a connection was lost)",
        t.in_doubt
    );
    println!(
        "  connections lost    {} ({} unresponsive; engine events {}), reconnects {}, churned {}, gave up {}",
        t.losses, t.unresponsive_losses, t.unresponsive, t.reconnects, t.churned, t.gave_up
    );
    println!("  peers killed        {}, stopped {}", t.kills, t.stops);
    println!("  rss KiB             start {rss0} end {rss1} (tolerance +{RSS_TOLERANCE_KIB})");
    println!("  fds                 start {fds0} end {fds1} (tolerance +{FD_TOLERANCE})");
    let mut ok = true;
    let mut fail = |why: &str| {
        println!("soak: FAIL: {why}");
        ok = false;
    };
    if t.lost > 0 {
        fail("messages lost");
    }
    if t.corrupt > 0 {
        fail("corrupt messages");
    }
    if t.moved == 0 {
        fail("no message moved");
    }
    if t.kills > 0 && t.reconnects == 0 {
        fail("peers were killed but nothing reconnected");
    }
    if t.stops > 0 && t.unresponsive == 0 {
        fail("peers were stopped but none was reported unresponsive");
    }
    if t.gave_up > 0 {
        fail("a connection gave up");
    }
    if !settled {
        fail("connections did not all come back at the end");
    }
    if rss1 > rss0 + RSS_TOLERANCE_KIB {
        fail("rss grew");
    }
    if fds1 > fds0 + FD_TOLERANCE {
        fail("fd count grew");
    }
    if ok {
        println!("soak: PASS");
    }
    drop(d.slots);
    for mut p in d.peers {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    Ok(ok)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("peer") => {
            let ep = args.get(1).ok_or("usage: soak peer <shm://name>")?;
            peer(ep)?;
            Ok(())
        }
        other => {
            let secs = match other {
                Some(s) => s.parse().map_err(|_| "usage: soak [seconds]")?,
                None => 600,
            };
            if drive(secs)? {
                Ok(())
            } else {
                std::process::exit(1)
            }
        }
    }
}
