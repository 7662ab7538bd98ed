//! Hostile peers against the driver's own listeners, from raw sockets in the driver's thread:
//!
//! * **mid-record stops** (tcp): a raw client sends a real hello, then part of a `DATA` record,
//!   then nothing while keeping its socket open. The listener's engine must report it
//!   unresponsive within the liveness timeout plus 20 % of the partial write. That engine is a
//!   second one of the driver's, with the default liveness timeout (1 s) and a dedicated
//!   (backoff) poller: the engine itself reports within the timeout plus a beat (a twelfth) and
//!   the event's way to the application; the rest of the 20 % (110 ms at 1 s, 55 ms at the
//!   soak's 500 ms) is the room left for the scheduling delays of a loaded machine. A
//!   run-to-completion engine would be polled by the driver's thread, which a connect to a
//!   stopped peer holds for up to its 250-ms timeout (then only the control thread's beats run
//!   the poller, and the report is up to two beats later): that is the application's delay,
//!   not the engine's.
//! * **mutated hellos** (tcp and shm): a real connector's hello, changed by one mutation of a
//!   table of mutations that each make it invalid (magic, version, kind, reserved bytes, pool
//!   geometry, absurd depths, counts and sizes, a hello cut short). Each must be refused (a
//!   refusal or a closed socket), none may become a connection, and the driver's other
//!   connections carry on meanwhile.
//!
//! Nothing here blocks for long: a probe's answer is read without waiting, once per pass.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use cm::uds::{self, testing, UdsError, UdsListener, UdsStream};
use spinwire::{Connection, Engine, Error, Event, Listener, DEFAULT_LIVENESS_TIMEOUT};

use crate::tap::EventTap;
use crate::{builder, engine};

/// The liveness timeout of the mid-record listener's engine.
const MID_LIVENESS: Duration = DEFAULT_LIVENESS_TIMEOUT;
/// The bound on reporting a mid-record stop: the liveness timeout plus 20 %.
pub const MID_BOUND: Duration = Duration::from_millis(MID_LIVENESS.as_millis() as u64 * 6 / 5);
/// How long a probe or a mid-record stop may take before it counts as unanswered.
const PROBE_LIMIT: Duration = Duration::from_secs(3);

/// What the hostile peers saw.
#[derive(Debug, Default)]
pub struct HostileStats {
    pub mid_attempted: u64,
    pub mid_reported: u64,
    /// Reported, but later than [`MID_BOUND`].
    pub mid_late: u64,
    /// Not reported within [`PROBE_LIMIT`], or the raw peer could not get connected.
    pub mid_missed: u64,
    pub mid_worst: Duration,
    pub hellos_sent: u64,
    pub hellos_refused: u64,
    /// A mutated hello the listener accepted (an offer, a status-0 reply, a connection).
    pub hellos_accepted: u64,
    pub hellos_unanswered: u64,
    /// `Event::Error`s of the driver's listeners (each refused hello has one).
    pub listener_errors: u64,
}

/// One mutation that makes a hello invalid.
type Mutation<const N: usize> = (&'static str, fn(&mut [u8; N]));

fn put(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Doubles the `u32` at `at`: a pool geometry other than the listener's.
fn double(b: &mut [u8], at: usize) {
    let v = u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    put(b, at, v.wrapping_mul(2));
}

/// A hello cut short is sent as its first half (see [`Probe::start`]).
const CUT: &str = "cut short";

const TCP_MUTATIONS: [Mutation<32>; 13] = [
    ("magic", |b| b[0] ^= 0x20),
    ("magic zero", |b| b[0..4].fill(0)),
    ("version", |b| b[4] = b[4].wrapping_add(1)),
    ("status 0xff", |b| b[5] = 0xff),
    ("reserved byte 6", |b| b[6] = 1),
    ("reserved byte 31", |b| b[31] = 0xff),
    ("buffer size 0", |b| put(b, 8, 0)),
    ("another buffer size", |b| double(b, 8)),
    ("depth 0", |b| put(b, 12, 0)),
    ("depth 0xffffffff", |b| put(b, 12, u32::MAX)),
    ("max message 0xffffffff", |b| put(b, 16, u32::MAX)),
    ("large buffers 0xffffffff", |b| put(b, 20, u32::MAX)),
    (CUT, |_| {}),
];

const SHM_MUTATIONS: [Mutation<64>; 18] = [
    ("magic", |b| b[0] ^= 0x20),
    ("version", |b| b[4] = b[4].wrapping_add(1)),
    ("kind ready", |b| b[6] = 4),
    ("kind 99", |b| b[6] = 99),
    ("reserved byte 15", |b| b[15] = 1),
    ("reserved byte 63", |b| b[63] = 0xff),
    ("buffer size 0", |b| put(b, 16, 0)),
    ("another buffer size", |b| double(b, 16)),
    ("buffer count 0", |b| put(b, 20, 0)),
    ("another buffer count", |b| double(b, 20)),
    ("ring depth 0", |b| put(b, 24, 0)),
    ("ring depth 3", |b| put(b, 24, 3)),
    ("ring depth 0xffffffff", |b| put(b, 24, u32::MAX)),
    ("ring depth 1024 (deeper than the pool)", |b| {
        put(b, 24, 1024)
    }),
    ("inline 4096", |b| put(b, 28, 4096)),
    ("large count 0xffffffff", |b| put(b, 40, u32::MAX)),
    ("large size 0xffffffff", |b| put(b, 36, u32::MAX)),
    (CUT, |_| {}),
];

/// The hello a connector of the soak's configuration sends on `endpoint`'s fabric, captured
/// by `accept` (a raw listener) while a throwaway engine connects (and then fails).
fn capture<T>(endpoint: String, accept: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
    let connector = std::thread::spawn(move || {
        if let Ok(e) = engine() {
            let _ = e.connect_timeout(&endpoint, Duration::from_millis(500));
        }
    });
    let got = accept();
    let _ = connector.join();
    got
}

fn capture_tcp_hello() -> std::io::Result<[u8; 32]> {
    let raw = TcpListener::bind("127.0.0.1:0")?;
    let addr = raw.local_addr()?;
    raw.set_nonblocking(true)?;
    capture(format!("tcp://{addr}"), move || {
        let deadline = Instant::now() + PROBE_LIMIT;
        let mut s = loop {
            match raw.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(std::io::Error::other("no connector"));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e),
            }
        };
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(PROBE_LIMIT))?;
        let mut hello = [0u8; 32];
        s.read_exact(&mut hello)?;
        Ok(hello)
    })
}

fn capture_shm_hello() -> std::io::Result<[u8; 64]> {
    let name = format!("soak-{}-capture", std::process::id());
    let raw = UdsListener::bind(&name).map_err(std::io::Error::other)?;
    capture(format!("shm://{name}"), move || {
        let mut s = raw
            .accept_timeout(PROBE_LIMIT)
            .map_err(std::io::Error::other)?;
        testing::recv_raw(&mut s, PROBE_LIMIT)
            .map_err(std::io::Error::other)?
            .ok_or_else(|| std::io::Error::other("no hello"))
    })
}

/// A mutated hello on its way: the raw socket that sent it and when it must be answered.
enum Probe {
    Tcp {
        sock: TcpStream,
        reply: Vec<u8>,
        what: &'static str,
        deadline: Instant,
    },
    Shm {
        stream: UdsStream,
        what: &'static str,
        deadline: Instant,
    },
}

/// How a probe ended.
enum Answer {
    Refused,
    Accepted,
    Unanswered,
}

impl Probe {
    /// `None` while no answer is in.
    fn answer(&mut self) -> Option<Answer> {
        match self {
            Probe::Tcp {
                sock,
                reply,
                deadline,
                ..
            } => {
                let mut buf = [0u8; 32];
                match sock.read(&mut buf) {
                    // Closed without (the rest of) a reply: refused.
                    Ok(0) => Some(Answer::Refused),
                    Ok(n) => {
                        reply.extend_from_slice(&buf[..n]);
                        (reply.len() >= 32).then(|| match reply[5] {
                            0 => Answer::Accepted,
                            _ => Answer::Refused,
                        })
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        (Instant::now() > *deadline).then_some(Answer::Unanswered)
                    }
                    // Reset: refused.
                    Err(_) => Some(Answer::Refused),
                }
            }
            Probe::Shm {
                stream, deadline, ..
            } => match stream.recv_offer(Duration::ZERO) {
                Ok(_offer) => Some(Answer::Accepted),
                Err(UdsError::Timeout { .. }) => {
                    (Instant::now() > *deadline).then_some(Answer::Unanswered)
                }
                // A refusal, or the socket closed on an unreadable hello.
                Err(_) => Some(Answer::Refused),
            },
        }
    }

    fn what(&self) -> &'static str {
        match self {
            Probe::Tcp { what, .. } | Probe::Shm { what, .. } => what,
        }
    }
}

/// A raw tcp peer stopped in the middle of a record, waiting to be reported.
struct MidRecord {
    _sock: TcpStream,
    conn: Connection,
    /// When the partial record went out.
    since: Instant,
}

/// The driver's hostile side: its listeners for them, the captured hellos, what is in flight.
pub struct Hostile {
    tcp_hello: [u8; 32],
    shm_hello: [u8; 64],
    hello_tcp: (Listener, String),
    hello_shm: (Listener, String),
    /// The mid-record listener (which keeps its engine) and that engine's events.
    mid: (Listener, String),
    mid_events: EventTap,
    probes: Vec<Probe>,
    mids: Vec<MidRecord>,
    pub stats: HostileStats,
}

fn free_tcp_endpoint() -> std::io::Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(format!("tcp://{}", l.local_addr()?))
}

impl Hostile {
    /// Captures the hellos and opens the listeners for the hostile peers: the hello listeners
    /// on the driver's `engine`, the mid-record one on an engine of its own.
    pub fn new(engine: &Engine) -> Result<Hostile, Box<dyn std::error::Error>> {
        let listen = |engine: &Engine, ep: String| -> Result<(Listener, String), Error> {
            Ok((engine.listen(&ep)?, ep))
        };
        // The last core this process may use (the soak's processes are not pinned).
        let core = core_affinity::get_core_ids()
            .and_then(|c| c.last().map(|c| c.id))
            .ok_or("no core to pin the mid-record poller to")?;
        let mid_engine = builder(MID_LIVENESS).pollers(&[core]).build()?;
        Ok(Hostile {
            tcp_hello: capture_tcp_hello()?,
            shm_hello: capture_shm_hello()?,
            hello_tcp: listen(engine, free_tcp_endpoint()?)?,
            hello_shm: listen(engine, format!("shm://soak-{}-hellos", std::process::id()))?,
            mid: listen(&mid_engine, free_tcp_endpoint()?)?,
            mid_events: EventTap::new(&mid_engine),
            probes: Vec::new(),
            mids: Vec::new(),
            stats: HostileStats::default(),
        })
    }

    /// Sends one mutated hello to each hello listener (mutations `r` picks).
    pub fn send_mutated(&mut self, r: u64) -> std::io::Result<()> {
        let deadline = Instant::now() + PROBE_LIMIT;
        let (what, change) = TCP_MUTATIONS[r as usize % TCP_MUTATIONS.len()];
        let mut hello = self.tcp_hello;
        change(&mut hello);
        let mut sock = TcpStream::connect(&self.hello_tcp.1["tcp://".len()..])?;
        if what == CUT {
            sock.write_all(&hello[..16])?;
            sock.shutdown(Shutdown::Write)?;
        } else {
            sock.write_all(&hello)?;
        }
        sock.set_nonblocking(true)?;
        self.probes.push(Probe::Tcp {
            sock,
            reply: Vec::new(),
            what,
            deadline,
        });
        let (what, change) = SHM_MUTATIONS[(r >> 8) as usize % SHM_MUTATIONS.len()];
        let mut hello = self.shm_hello;
        change(&mut hello);
        let name = &self.hello_shm.1["shm://".len()..];
        let stream = uds::connect(name, PROBE_LIMIT).map_err(std::io::Error::other)?;
        let bytes = if what == CUT {
            &hello[..32]
        } else {
            &hello[..]
        };
        testing::send_raw(&stream, bytes, &[]).map_err(std::io::Error::other)?;
        self.probes.push(Probe::Shm {
            stream,
            what,
            deadline,
        });
        self.stats.hellos_sent += 2;
        Ok(())
    }

    /// Connects a raw tcp peer to the mid-record listener (a real hello), sends part of a
    /// `DATA` record and stops. Waits (bounded) for the handshake, not for the report.
    pub fn start_mid_record(&mut self) -> std::io::Result<()> {
        self.stats.mid_attempted += 1;
        let mut sock = TcpStream::connect(&self.mid.1["tcp://".len()..])?;
        sock.set_read_timeout(Some(PROBE_LIMIT))?;
        sock.write_all(&self.tcp_hello)?;
        let mut reply = [0u8; 32];
        sock.read_exact(&mut reply)?;
        let deadline = Instant::now() + PROBE_LIMIT;
        let conn = loop {
            match self.mid.0.try_accept() {
                Ok(Some(c)) => break c,
                Ok(None) if Instant::now() < deadline && reply[5] == 0 => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                _ => {
                    self.stats.mid_missed += 1;
                    return Ok(());
                }
            }
        };
        // A DATA record of 100 bytes: its header and 20 of them.
        let mut partial = [0u8; 28];
        partial[0] = 108;
        partial[4] = 1;
        sock.write_all(&partial)?;
        self.mids.push(MidRecord {
            _sock: sock,
            conn,
            since: Instant::now(),
        });
        Ok(())
    }

    /// Takes the driver's engine's events that are the hostile peers' (a listener's refusal);
    /// `false` for any other.
    pub fn on_event(&mut self, e: &Event) -> bool {
        if matches!(e, Event::Error { conn: None, .. }) {
            self.stats.listener_errors += 1;
            return true;
        }
        false
    }

    /// A mid-record stop reported (`at`: the instant its event came).
    fn on_mid_event(&mut self, e: &Event, at: Instant) {
        let Event::PeerUnresponsive { conn, silent_for } = e else {
            return;
        };
        let Some(i) = self.mids.iter().position(|m| m.conn.id() == *conn) else {
            return;
        };
        let m = self.mids.swap_remove(i);
        let took = at.saturating_duration_since(m.since);
        self.stats.mid_reported += 1;
        self.stats.mid_worst = self.stats.mid_worst.max(took);
        if std::env::var_os("SOAK_DEBUG").is_some() {
            println!("soak: mid-record took {took:?} silent_for {silent_for:?}");
        }
        if took > MID_BOUND {
            self.stats.mid_late += 1;
            println!(
                "soak: mid-record stop reported after {took:?} (bound {MID_BOUND:?}; the \
                 engine counted {silent_for:?} of silence)"
            );
        }
    }

    /// Takes the mid-record engine's events, reads the probes' answers and checks the
    /// deadlines; returns the work done.
    pub fn poll(&mut self) -> usize {
        let mut work = 0;
        while let Some((at, e)) = self.mid_events.try_recv() {
            self.on_mid_event(&e, at);
            work += 1;
        }
        let s = &mut self.stats;
        self.probes.retain_mut(|p| match p.answer() {
            None => true,
            Some(a) => {
                work += 1;
                match a {
                    Answer::Refused => s.hellos_refused += 1,
                    Answer::Accepted => {
                        s.hellos_accepted += 1;
                        println!("soak: FAIL: mutated hello ({}) accepted", p.what());
                    }
                    Answer::Unanswered => {
                        s.hellos_unanswered += 1;
                        println!("soak: mutated hello ({}) unanswered", p.what());
                    }
                }
                false
            }
        });
        // A mutated hello must never become a connection.
        for (l, _) in [&self.hello_tcp, &self.hello_shm] {
            while let Ok(Some(c)) = l.try_accept() {
                s.hellos_accepted += 1;
                println!("soak: FAIL: a mutated hello became connection {}", c.id());
            }
        }
        self.mids.retain(|m| {
            let late = m.since.elapsed() > PROBE_LIMIT;
            if late {
                s.mid_missed += 1;
                println!("soak: mid-record stop not reported within {PROBE_LIMIT:?}");
            }
            !late
        });
        work
    }

    /// Probes or mid-record stops still in flight.
    pub fn pending(&self) -> bool {
        !self.probes.is_empty() || !self.mids.is_empty()
    }
}
