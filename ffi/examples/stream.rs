//! The Rust equivalent of `pingpong.c`'s `sink` / `source` roles, for `scripts/ci/ffi.sh`'s
//! rate comparison: the same loop on the Rust API (`send_copy_batched`, retried while
//! back-pressured, as the C source's `sw_offer_batched`; the batch receive
//! `Connection::poll` with a limit of 64), the same engine configuration, the same
//! verification.
//!
//! ```text
//! cargo run --release -p spinwire-ffi --example stream -- sink shm://s 1000000 &
//! cargo run --release -p spinwire-ffi --example stream -- source shm://s 1000000 32
//! ```

use std::time::{Duration, Instant};

use spinwire_rs::{Engine, Error};

const WAIT: Duration = Duration::from_secs(10);

fn fill(p: &mut [u8], seq: u64) {
    let n = p.len().min(8);
    p[..n].copy_from_slice(&seq.to_le_bytes()[..n]);
    for (i, b) in p.iter_mut().enumerate().skip(8) {
        *b = (seq.wrapping_mul(31).wrapping_add(i as u64)) as u8;
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(role), Some(ep), Some(count)) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("usage: stream sink|source <endpoint> <messages> [size]");
        std::process::exit(2);
    };
    let count: u64 = count.parse()?;
    let size: usize = args.get(3).map_or(Ok(32), |s| s.parse())?;
    let engine = Engine::builder()
        .run_to_completion()
        .pool(4096, 64)
        .build()?;
    match role.as_str() {
        "sink" => {
            let listener = engine.listen(ep)?;
            eprintln!("listening on {ep}");
            let conn = listener.accept_timeout(Duration::from_secs(30))?;
            let (mut expect, mut bad, mut len) = (0u64, 0u64, 0usize);
            let mut want = vec![0u8; 4096];
            let mut t0 = None;
            let deadline = Instant::now() + 4 * WAIT;
            // The clock is read every 1024th poll, as the C sink reads it.
            let mut polls = 0u32;
            while expect < count {
                let n = conn.poll(
                    |m| {
                        if len == 0 {
                            len = m.len();
                        }
                        fill(&mut want[..len], expect);
                        if m != &want[..len] {
                            bad += 1;
                        }
                        expect += 1;
                    },
                    64,
                )?;
                if n > 0 && t0.is_none() {
                    t0 = Some(Instant::now());
                }
                polls = polls.wrapping_add(1);
                if polls % 1024 == 0 && Instant::now() > deadline {
                    return Err(Error::Timeout.into());
                }
            }
            let secs = t0.map_or(0.0, |t| t.elapsed().as_secs_f64());
            // Drain until the source has closed (bounded).
            let deadline = Instant::now() + WAIT;
            loop {
                match conn.poll(|_| {}, 64) {
                    Err(Error::Disconnected) => break,
                    Err(e) => return Err(e.into()),
                    Ok(_) if Instant::now() > deadline => return Err(Error::Timeout.into()),
                    Ok(_) => {}
                }
            }
            println!(
                "Rust stream (Connection::poll): {expect} messages of {len} B, {bad} bad: {:.2} Mmsg/s",
                count as f64 / secs.max(1e-9) / 1e6
            );
            if bad != 0 {
                std::process::exit(1);
            }
        }
        "source" => {
            let deadline = Instant::now() + WAIT;
            let conn = loop {
                match engine.connect_timeout(ep, Duration::from_secs(2)) {
                    Ok(c) => break c,
                    Err(Error::Connect { .. }) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10))
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            let mut msg = vec![0u8; size];
            for i in 0..count {
                fill(&mut msg, i);
                // The deadline is set by the first refused try only (a clock read per message
                // cost this loop about a fifth of its rate), as the C source's is.
                let mut deadline = None;
                loop {
                    match conn.send_copy_batched(&msg) {
                        Ok(()) => break,
                        Err(Error::WouldBlock)
                            if Instant::now()
                                < *deadline.get_or_insert_with(|| Instant::now() + WAIT) =>
                        {
                            conn.flush()?
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            conn.flush()?;
            let deadline = Instant::now() + WAIT;
            while conn.stats().tx_msgs < count && Instant::now() < deadline {
                engine.poll();
            }
        }
        _ => {
            eprintln!("stream: unknown role {role}");
            std::process::exit(2);
        }
    }
    Ok(())
}
