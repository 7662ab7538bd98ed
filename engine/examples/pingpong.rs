//! Two-process shm ping-pong.
//!
//! ```text
//! cargo run --release -p spinwire --example pingpong -- server shm://pingpong &
//! cargo run --release -p spinwire --example pingpong -- client shm://pingpong 100000 32
//! ```
//!
//! Both sides run in run-to-completion mode (no poller thread: the application thread drives the
//! poller), which suits a 2-core machine: one spinning thread per process. Add `--backoff` to
//! either side to spin, then yield, then park when idle instead of busy-spinning, and
//! `--core N` to pin the process's thread. The client prints round-trip-time percentiles.

use std::time::{Duration, Instant};

use spinwire::{Connection, Engine, Error, IdleStrategy, SendError};

fn usage() -> ! {
    eprintln!(
        "usage: pingpong server <shm://name> [--backoff] [--core N]\n       \
         pingpong client <shm://name> [iterations] [size] [--backoff] [--core N]"
    );
    std::process::exit(2)
}

fn send(conn: &Connection, payload: &[u8]) -> Result<(), Error> {
    let mut buf = conn.alloc_timeout(Duration::from_secs(5))?;
    buf.copy_from(payload)?;
    match conn.send_timeout(buf, Duration::from_secs(5)) {
        Ok(()) => {}
        Err(SendError::Timeout(_)) => return Err(Error::Timeout),
        Err(e) => return Err(e.into()),
    }
    conn.flush()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let backoff = if let Some(i) = args.iter().position(|a| a == "--backoff") {
        args.remove(i);
        true
    } else {
        false
    };
    if let Some(i) = args.iter().position(|a| a == "--core") {
        args.remove(i);
        let core: usize = args
            .get(i)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| usage());
        args.remove(i);
        core_affinity::set_for_current(core_affinity::CoreId { id: core });
    }
    let (role, endpoint) = match (args.first(), args.get(1)) {
        (Some(r), Some(e)) => (r.as_str(), e.as_str()),
        _ => usage(),
    };
    let engine = Engine::builder()
        .run_to_completion()
        .idle(if backoff {
            IdleStrategy::backoff()
        } else {
            IdleStrategy::BusySpin
        })
        .pool(4096, 64)
        .build()?;
    match role {
        "server" => {
            let listener = engine.listen(endpoint)?;
            eprintln!("listening on {endpoint}");
            loop {
                let conn = match listener.accept_timeout(Duration::from_secs(3600)) {
                    Ok(c) => c,
                    Err(Error::Timeout) => continue,
                    Err(e) => return Err(e.into()),
                };
                eprintln!("connection {} accepted", conn.id());
                let mut echoed = 0u64;
                loop {
                    let msg = match conn.recv_timeout(Duration::from_secs(3600)) {
                        Ok(m) => m,
                        Err(Error::Disconnected) => break,
                        Err(e) => return Err(e.into()),
                    };
                    let mut buf = conn.alloc_timeout(Duration::from_secs(5))?;
                    buf.copy_from(&msg)?;
                    drop(msg);
                    if let Err(e) = conn.send_timeout(buf, Duration::from_secs(5)) {
                        return Err(Error::from(e).into());
                    }
                    conn.flush()?;
                    echoed += 1;
                }
                eprintln!("connection {} closed after {echoed} messages", conn.id());
            }
        }
        "client" => {
            let iters: usize = args.get(2).map_or(Ok(100_000), |s| s.parse())?;
            let size: usize = args.get(3).map_or(Ok(32), |s| s.parse())?;
            let conn = engine.connect(endpoint)?;
            let payload = vec![0x5au8; size];
            let warmup = iters / 10;
            let mut rtts = Vec::with_capacity(iters);
            for i in 0..warmup + iters {
                let t = Instant::now();
                send(&conn, &payload)?;
                let reply = conn.recv_timeout(Duration::from_secs(5))?;
                let ns = t.elapsed().as_nanos() as u64;
                assert_eq!(&reply[..], &payload[..], "echo differs");
                if i >= warmup {
                    rtts.push(ns);
                }
            }
            rtts.sort_unstable();
            let q = |p: f64| rtts[((rtts.len() - 1) as f64 * p) as usize];
            // The mean up to the p99 ("tm99"): finer than a p50 where the clock ticks coarsely.
            let upto = &rtts[..=(rtts.len() - 1) * 99 / 100];
            let tm99 = upto.iter().sum::<u64>() as f64 / upto.len() as f64;
            println!(
                "{iters} round trips of {size} B: RTT p50 {} ns, tm99 {tm99:.1} ns, p99 {} ns, \
                 p99.9 {} ns, max {} ns",
                q(0.5),
                q(0.99),
                q(0.999),
                rtts[rtts.len() - 1]
            );
        }
        _ => usage(),
    }
    Ok(())
}
