//! The soak's child processes: echo peers (`peer <endpoint>`) and the idler (`idler <shm>
//! <tcp>`), an echo peer that makes no spinwire call at all for [`IDLE_FOR`] every
//! [`IDLE_EVERY`]; and how the driver starts and signals them.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use spinwire::{Connection, Error, Listener, SendError};

use crate::{engine, LIVENESS};

/// How long the idler makes no spinwire call: three liveness timeouts.
pub const IDLE_FOR: Duration = Duration::from_millis(3 * LIVENESS.as_millis() as u64);
/// How long the idler echoes between idle periods.
pub const IDLE_EVERY: Duration = Duration::from_millis(2500);

/// Exits when stdin closes (the driver went away).
fn exit_with_the_driver() {
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(0);
    });
}

/// Echoes every message of every connection accepted on `endpoint` until stdin closes (the
/// driver went away) or it is killed.
pub fn peer(endpoint: &str) -> Result<(), Error> {
    exit_with_the_driver();
    let engine = engine()?;
    let listener = engine.listen(endpoint)?;
    println!("listening");
    let mut conns: Vec<Connection> = Vec::new();
    let mut idler_park = Duration::from_micros(1);
    loop {
        let work = engine.poll() + accept_and_echo(&listener, &mut conns, |_| {})?;
        if work > 0 {
            idler_park = Duration::from_micros(1);
        } else {
            std::thread::sleep(idler_park);
            idler_park = (idler_park * 2).min(Duration::from_millis(1));
        }
    }
}

/// Accepts what is pending on `listener` and echoes what `conns` received; a connection that
/// fails is dropped (after `down` saw its error). Returns the work done.
fn accept_and_echo(
    listener: &Listener,
    conns: &mut Vec<Connection>,
    mut down: impl FnMut(&Error),
) -> Result<usize, Error> {
    let mut work = 0;
    while let Some(c) = listener.try_accept()? {
        conns.push(c);
        work += 1;
    }
    conns.retain(|c| match echo(c) {
        Ok(n) => {
            work += n;
            true
        }
        Err(e) => {
            down(&e);
            false
        }
    });
    Ok(work)
}

/// Echoes the connections accepted on `shm` and `tcp`, and every [`IDLE_EVERY`] makes no
/// spinwire call for [`IDLE_FOR`] (printing `idle-start` and `idle-end`). A connection that
/// goes down prints `down <error>`: its engine took the idle application for a dead one.
pub fn idler(shm: &str, tcp: &str) -> Result<(), Error> {
    exit_with_the_driver();
    let engine = engine()?;
    let listeners = [engine.listen(shm)?, engine.listen(tcp)?];
    println!("listening");
    let mut conns: Vec<Connection> = Vec::new();
    let mut next_idle = Instant::now() + IDLE_EVERY;
    let mut park = Duration::from_micros(1);
    loop {
        if Instant::now() >= next_idle && !conns.is_empty() {
            println!("idle-start");
            // No spinwire call at all: the engine's control thread alone keeps the
            // connections alive (heartbeats) meanwhile.
            std::thread::sleep(IDLE_FOR);
            println!("idle-end");
            next_idle = Instant::now() + IDLE_EVERY;
        }
        let mut work = engine.poll();
        for l in &listeners {
            work += accept_and_echo(l, &mut conns, |e| println!("down {e}"))?;
        }
        if work > 0 {
            park = Duration::from_micros(1);
        } else {
            std::thread::sleep(park);
            park = (park * 2).min(Duration::from_millis(1));
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

/// Starts this binary with `args` and, with `wait`, waits (bounded) for its `listening` line;
/// the lines it prints after that come through the receiver. Without `wait` the driver's thread
/// goes on at once (a restarted peer: its connections retry until it listens), so that it keeps
/// running its engine meanwhile.
pub fn spawn(args: &[&str], wait: bool) -> std::io::Result<(Child, Receiver<String>)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Read to the end, whoever listens: a full pipe would block the child.
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    if !wait {
        return Ok((child, rx));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l == "listening" => return Ok((child, rx)),
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::other(format!(
                    "{args:?} did not start listening"
                )));
            }
        }
    }
}

pub fn signal(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(pid, sig) };
    }
}
