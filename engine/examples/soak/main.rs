//! The soak (issues #15, #23): connections under churn and peer failures, every message
//! checked.
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
//! Alongside (`peer.rs`, `hostile.rs`):
//! * **idle periods**: an idler peer (`idler <shm> <tcp>`), connected over shm and tcp, makes
//!   no spinwire call at all for three liveness timeouts every few seconds, then echoes again.
//! * **mid-record stops** (tcp): every `MID_EVERY` a raw client sends a tcp listener of the
//!   driver (on a second engine: the default 1-s liveness timeout, a dedicated backoff poller) a
//!   real hello and part of a record, then nothing.
//! * **mutated hellos**: every `HELLO_EVERY` one invalid hello to each of the driver's tcp and
//!   shm hello listeners (from a table of mutations).
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
//! * **false liveness reports**: an idle connection reported down, on either side, although
//!   its peer was only idle. Must be 0; and after every idle period each idle connection must
//!   carry a verified echo again.
//! * **mid-record stops**: each must be reported unresponsive within the liveness timeout plus
//!   20 % (reported in time = attempted). `SOAK_DEBUG=1` prints each one's time to the report
//!   and the silence the engine counted.
//! * **mutated hellos**: each must be refused (refused = sent), none may become a connection.
//! * RSS (`VmRSS`) and open fds (`/proc/self/fd`) are sampled once every connection is up after
//!   a warm-up, and again at the end with every connection up again and nothing hostile in
//!   flight; the end may exceed the start by at most `RSS_TOLERANCE_KIB` and `FD_TOLERANCE`.
//!
//! The driver exits non-zero when any check fails. Everything runs in run-to-completion mode
//! with [`IdleStrategy::backoff`], one thread per process (the driver has a second one that
//! only takes its engine's events, sleeping while there are none: `driver::EventTap`), so the
//! soak never hogs the cores.

mod driver;
mod hostile;
mod msg;
mod peer;
mod tap;

use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, EngineBuilder, Error, IdleStrategy, ReconnectPolicy};

#[cfg(doc)]
use spinwire::{ReconnectEvent, Reconnecting};

use driver::{fd_count, rss_kib, Driver, Peer, Slot};
use hostile::{Hostile, MID_BOUND};

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
const MID_EVERY: Duration = Duration::from_secs(5);
const HELLO_EVERY: Duration = Duration::from_secs(2);
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
    builder(LIVENESS).build()
}

/// The soak's engine configuration with liveness timeout `liveness`.
fn builder(liveness: Duration) -> EngineBuilder {
    Engine::builder()
        .name("soak")
        .run_to_completion()
        .idle(IdleStrategy::backoff())
        .pool(BUFFER_SIZE, BUFFERS)
        .max_message_size(MAX_MESSAGE)
        .large_buffers(2)
        .liveness_timeout(liveness)
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

/// Starts the echo peers, the idler and the connections to them.
fn start() -> Result<Driver, Box<dyn std::error::Error>> {
    let engine = engine()?;
    let hostile = Hostile::new(&engine)?;
    let mut peers = Vec::new();
    for p in 0..PEERS {
        let endpoint = format!("shm://soak-{}-{p}", std::process::id());
        let (child, _lines) = peer::spawn(&["peer", &endpoint], true)?;
        peers.push(Peer {
            endpoint,
            child,
            stopped: false,
        });
    }
    let idle_eps = [
        format!("shm://soak-{}-idle", std::process::id()),
        format!(
            "tcp://{}",
            std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?
        ),
    ];
    let idler = peer::spawn(&["idler", &idle_eps[0], &idle_eps[1]], true)?;
    let mut d = Driver::new(engine, peers, idler, hostile);
    for p in 0..PEERS {
        for _ in 0..CONNS_PER_PEER {
            let seed = d.rand();
            let ep = d.peers[p].endpoint.clone();
            d.slots.push(Slot::new(p, &ep, &d.engine, seed)?);
        }
    }
    for ep in &idle_eps {
        let seed = d.rand();
        d.idle.push(Slot::new(usize::MAX, ep, &d.engine, seed)?);
    }
    Ok(d)
}

fn drive(secs: u64) -> Result<bool, Box<dyn std::error::Error>> {
    let mut d = start()?;
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
        "soak: {secs} s, {PEERS} peers, {} connections (+{} idle), sizes 1..={} B; start rss {rss0} KiB, fds {fds0}",
        d.slots.len(),
        d.idle.len(),
        d.slots[0].rc.connection().map_or(0, Connection::max_message_size)
    );

    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let (mut next_churn, mut next_kill, mut next_stop) =
        (start + CHURN_EVERY, start + KILL_EVERY, start + STOP_EVERY);
    let (mut next_mid, mut next_hello) = (start + MID_EVERY, start + HELLO_EVERY);
    let mut resume_at: Option<(usize, Instant)> = None;
    let mut next_report = start + Duration::from_secs(10);
    while Instant::now() < end {
        let now = Instant::now();
        if now >= next_churn {
            next_churn = now + CHURN_EVERY;
            let i = d.rand() as usize % d.slots.len();
            d.churn(i, now);
        }
        if now >= next_kill {
            next_kill = now + KILL_EVERY;
            let p = d.rand() as usize % PEERS;
            if !d.peers[p].stopped {
                let _ = d.peers[p].child.kill();
                let _ = d.peers[p].child.wait();
                d.t.kills += 1;
                let ep = d.peers[p].endpoint.clone();
                d.peers[p].child = peer::spawn(&["peer", &ep], false)?.0;
            }
        }
        if now >= next_stop && resume_at.is_none() {
            next_stop = now + STOP_EVERY;
            let p = d.rand() as usize % PEERS;
            peer::signal(&d.peers[p].child, libc::SIGSTOP);
            d.peers[p].stopped = true;
            d.t.stops += 1;
            resume_at = Some((p, now + STOP_FOR));
        }
        if let Some((p, at)) = resume_at {
            if now >= at {
                peer::signal(&d.peers[p].child, libc::SIGCONT);
                d.peers[p].stopped = false;
                resume_at = None;
            }
        }
        if now >= next_mid {
            next_mid = now + MID_EVERY;
            d.hostile.start_mid_record()?;
        }
        if now >= next_hello {
            next_hello = now + HELLO_EVERY;
            let r = d.rand();
            d.hostile.send_mutated(r)?;
        }
        if now >= next_report {
            next_report = now + Duration::from_secs(10);
            println!(
                "soak: {:>4} s: moved {} lost {} corrupt {} reconnects {} kills {} stops {} idle {} hellos {} mid {}",
                start.elapsed().as_secs(),
                d.t.moved,
                d.t.lost,
                d.t.corrupt,
                d.t.reconnects,
                d.t.kills,
                d.t.stops,
                d.idle_stats.periods,
                d.hostile.stats.hellos_sent,
                d.hostile.stats.mid_attempted,
            );
        }
        d.finish_closes()?;
        if d.step() == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if let Some((p, _)) = resume_at {
        peer::signal(&d.peers[p].child, libc::SIGCONT);
        d.peers[p].stopped = false;
    }
    let settled = d.settle(Duration::from_secs(15));
    let (rss1, fds1) = (rss_kib(), fd_count());
    let ok = report(&d, start.elapsed(), settled, (rss0, rss1), (fds0, fds1));
    drop(d.slots);
    drop(d.idle);
    let _ = d.idler.0.kill();
    let _ = d.idler.0.wait();
    for mut p in d.peers {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    Ok(ok)
}

/// Prints the final report; `true` when every check passed.
fn report(d: &Driver, ran: Duration, settled: bool, rss: (u64, u64), fds: (usize, usize)) -> bool {
    let (t, i, h) = (&d.t, &d.idle_stats, &d.hostile.stats);
    println!("soak: ran {} s", ran.as_secs());
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
    println!(
        "  false liveness reports {} (idle periods {} of {:?} without a call; verified after {})",
        i.false_reports,
        i.periods,
        peer::IDLE_FOR,
        i.verified_after
    );
    println!(
        "  mid-record stops    reported {} / attempted {} (late {}, missed {}; worst {:?}, bound {MID_BOUND:?})",
        h.mid_reported - h.mid_late,
        h.mid_attempted,
        h.mid_late,
        h.mid_missed,
        h.mid_worst
    );
    println!(
        "  mutated hellos      refused {} / sent {} (accepted {}, unanswered {}; listener errors {})",
        h.hellos_refused, h.hellos_sent, h.hellos_accepted, h.hellos_unanswered, h.listener_errors
    );
    println!(
        "  rss KiB             start {} end {} (tolerance +{RSS_TOLERANCE_KIB})",
        rss.0, rss.1
    );
    println!(
        "  fds                 start {} end {} (tolerance +{FD_TOLERANCE})",
        fds.0, fds.1
    );
    let mut ok = true;
    let mut check = |pass: bool, why: &str| {
        if !pass {
            println!("soak: FAIL: {why}");
            ok = false;
        }
    };
    check(t.lost == 0, "messages lost");
    check(t.corrupt == 0, "corrupt messages");
    check(t.moved > 0, "no message moved");
    check(
        t.kills == 0 || t.reconnects > 0,
        "peers were killed but nothing reconnected",
    );
    check(
        t.stops == 0 || t.unresponsive > 0,
        "peers were stopped but none was reported unresponsive",
    );
    check(t.gave_up == 0, "a connection gave up");
    check(i.false_reports == 0, "an idle peer was reported dead");
    check(
        i.verified_after == i.periods,
        "an idle connection carried no verified echo after an idle period",
    );
    check(
        h.mid_attempted == 0 || h.mid_reported - h.mid_late == h.mid_attempted,
        "a mid-record stop was not reported within the liveness timeout + 20 %",
    );
    check(
        h.hellos_refused == h.hellos_sent && h.hellos_accepted == 0,
        "a mutated hello was not refused",
    );
    check(settled, "connections did not all come back at the end");
    check(rss.1 <= rss.0 + RSS_TOLERANCE_KIB, "rss grew");
    check(fds.1 <= fds.0 + FD_TOLERANCE, "fd count grew");
    if ok {
        println!("soak: PASS");
    }
    ok
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("peer") => {
            let ep = args.get(1).ok_or("usage: soak peer <shm://name>")?;
            peer::peer(ep)?;
            Ok(())
        }
        Some("idler") => {
            let (Some(shm), Some(tcp)) = (args.get(1), args.get(2)) else {
                return Err("usage: soak idler <shm://name> <tcp://host:port>".into());
            };
            peer::idler(shm, tcp)?;
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
