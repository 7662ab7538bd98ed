//! `bench cost`'s per-stage breakdown: the software cost of each step of a message's trip
//! through the public API, both ends on one thread (no cross-core transfer), and the round
//! trip through each of the quick-start send and receive calls.
//!
//! Each stage is timed over a loop of many operations (the clock is read per run of
//! [`RUN`] messages, never per message), in [`CHUNKS`] chunks of which the fastest counts;
//! the stages that cannot be timed alone are the
//! differences of two loops:
//!
//! * `alloc`: `Connection::alloc` and the drop of the unsent buffer;
//! * `copy_from`: `alloc` + `SendBuf::copy_from`, less `alloc`;
//! * `send`: a run of [`RUN`] `alloc` + `copy_from` + `send` (each one publishes its record),
//!   less `alloc` + `copy_from`: the record header, the payload copy into the ring and the
//!   publication;
//! * `receive in a run`: `try_recv` of [`RUN`] waiting messages (the consumer position is
//!   published once per quarter window, or when the ring runs empty), and the drop of the
//!   message;
//! * `receive alone`: one send then one `try_recv` (the ring runs empty at every receive, so
//!   the position is published per message, as in a ping-pong), less `send`;
//! * `empty try_recv` / `empty poll`: one look at an empty ring, the spin loop's iteration;
//! * the round trips: a send and a receive each way, through each quick-start call, and the
//!   receive matched (`match conn.try_recv()`) or converted with `?` (`if let Some(m) =
//!   conn.try_recv().map_err(..)?`), the two forms receive loops are written in.
//!
//! Every wait is bounded (the caller's [`Bound`](super::cost) equivalent: a spin count).

use std::time::Instant;

use spinwire::Connection;

use crate::error::BenchError;

/// Messages per timed run (below the engine's depth and the ring's capacity).
pub const RUN: usize = 32;
/// Chunks per stage, the fastest counted (a shared machine preempts some).
pub const CHUNKS: u64 = 10;
/// Empty spins after which a wait is an error (the peer is on this thread: it never comes).
const SPIN_LIMIT: u32 = 1 << 20;

/// One stage's cost.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stage {
    /// What was timed.
    pub name: &'static str,
    /// ns per operation.
    pub ns: f64,
}

fn err(step: &'static str) -> impl FnOnce(spinwire::Error) -> BenchError {
    move |e| BenchError::Engine {
        step: step.into(),
        source: Box::new(e),
    }
}

// The send helpers match each call's result rather than convert it with `map_err` and `?`:
// converting a `SendBuf` result copies the handle through a second result with a wide load
// over its two narrow stores (a store-forwarding stall per call, callgrind and `bench cost`),
// which is the bench's cost, not the engine's.
#[inline]
fn send(c: &Connection, payload: &[u8]) -> Result<(), BenchError> {
    let mut b = match c.alloc() {
        Ok(b) => b,
        Err(e) => return Err(err("alloc")(e)),
    };
    if let Err(e) = b.copy_from(payload) {
        return Err(err("copy the payload")(e));
    }
    match c.send(b) {
        Ok(()) => Ok(()),
        Err(e) => Err(err("send")(e.into())),
    }
}

#[inline]
fn send_copy(c: &Connection, payload: &[u8]) -> Result<(), BenchError> {
    c.send_copy(payload).map_err(err("send_copy"))
}

#[inline]
fn send_claim(c: &Connection, payload: &[u8]) -> Result<(), BenchError> {
    let mut b = match c.claim(payload.len()) {
        Ok(b) => b,
        Err(e) => return Err(err("claim")(e)),
    };
    // The claim is of `payload.len()` bytes: its message bytes, written in place (with
    // `copy_from`, as the `alloc` stage writes its buffer: `copy_from_slice` of a length
    // known only at run time is a call of `memcpy`).
    if let Err(e) = b.copy_from(payload) {
        return Err(err("copy into the claim")(e));
    }
    match c.send(b) {
        Ok(()) => Ok(()),
        Err(e) => Err(err("send")(e.into())),
    }
}

/// Takes one message with `try_recv`, the result matched; the sum of first bytes keeps the
/// read.
#[inline]
fn recv(s: &Connection, sum: &mut u64) -> Result<(), BenchError> {
    for _ in 0..SPIN_LIMIT {
        match s.try_recv() {
            Ok(Some(m)) => {
                *sum = sum.wrapping_add(u64::from(m[0]));
                return Ok(());
            }
            Ok(None) => {}
            Err(e) => return Err(err("try_recv")(e)),
        }
    }
    Err(BenchError::Timeout {
        what: "a message sent on this thread",
        secs: 0.0,
    })
}

/// [`recv`] written as most receive loops are: the result converted with `map_err` and `?`,
/// the message moved out of it. (With a 24-byte `Message` that move was a store-forwarding
/// stall per message, which `recv`'s match escaped: about twice the round trip. The message is
/// one word now; this stage keeps the two forms side by side.)
#[inline]
fn recv_q(s: &Connection, sum: &mut u64) -> Result<(), BenchError> {
    for _ in 0..SPIN_LIMIT {
        if let Some(m) = s.try_recv().map_err(err("try_recv"))? {
            *sum = sum.wrapping_add(u64::from(m[0]));
            return Ok(());
        }
    }
    Err(BenchError::Timeout {
        what: "a message sent on this thread",
        secs: 0.0,
    })
}

#[inline]
fn recv_poll(s: &Connection, sum: &mut u64) -> Result<(), BenchError> {
    for _ in 0..SPIN_LIMIT {
        if s.poll(|m| *sum = sum.wrapping_add(u64::from(m[0])), 1)
            .map_err(err("poll"))?
            > 0
        {
            return Ok(());
        }
    }
    Err(BenchError::Timeout {
        what: "a message sent on this thread",
        secs: 0.0,
    })
}

/// ns per operation of `op` run `n` times: the fastest of [`CHUNKS`] chunks of `n / CHUNKS`
/// (each chunk timed as a whole), so that a chunk the thread was preempted in does not count.
fn per_op(n: u64, mut op: impl FnMut() -> Result<(), BenchError>) -> Result<f64, BenchError> {
    let per_chunk = (n / CHUNKS).max(1);
    let mut best = f64::INFINITY;
    for _ in 0..CHUNKS {
        let t0 = Instant::now();
        for _ in 0..per_chunk {
            op()?;
        }
        best = best.min(t0.elapsed().as_nanos() as f64 / per_chunk as f64);
    }
    Ok(best)
}

/// The stages of one size (both ends on this thread): see the [module docs](self).
///
/// # Errors
///
/// An engine failure, or a message that does not arrive.
pub fn measure(
    c: &Connection,
    s: &Connection,
    size: usize,
    iters: u64,
) -> Result<Vec<Stage>, BenchError> {
    let payload = vec![3u8; size];
    let mut sum = 0u64;
    let runs = (iters / RUN as u64).max(1);
    let n = runs * RUN as u64;
    // Warm every path once.
    for _ in 0..RUN {
        send(c, &payload)?;
        recv(s, &mut sum)?;
    }
    let alloc = per_op(n, || {
        drop(c.alloc().map_err(err("alloc"))?);
        Ok(())
    })?;
    let alloc_copy = per_op(n, || {
        let mut b = c.alloc().map_err(err("alloc"))?;
        b.copy_from(&payload).map_err(err("copy the payload"))?;
        drop(b);
        Ok(())
    })?;
    // Runs of sends timed, their receipt timed apart (the fastest chunk of each).
    let (mut sent, mut recv_run) = (f64::INFINITY, f64::INFINITY);
    let chunk_runs = (runs / CHUNKS).max(1);
    for _ in 0..CHUNKS {
        let (mut send_ns, mut recv_ns) = (0u128, 0u128);
        for _ in 0..chunk_runs {
            let t0 = Instant::now();
            for _ in 0..RUN {
                send(c, &payload)?;
            }
            let t1 = Instant::now();
            for _ in 0..RUN {
                recv(s, &mut sum)?;
            }
            send_ns += (t1 - t0).as_nanos();
            recv_ns += t1.elapsed().as_nanos();
        }
        let msgs = (chunk_runs * RUN as u64) as f64;
        sent = sent.min(send_ns as f64 / msgs);
        recv_run = recv_run.min(recv_ns as f64 / msgs);
    }
    let one_way = per_op(n, || {
        send(c, &payload)?;
        recv(s, &mut sum)
    })?;
    let empty = per_op(n, || {
        if s.try_recv().map_err(err("try_recv"))?.is_some() {
            sum += 1;
        }
        Ok(())
    })?;
    let empty_poll = per_op(n, || {
        s.poll(|_| sum += 1, 1).map_err(err("poll"))?;
        Ok(())
    })?;
    let rtt = |tx: fn(&Connection, &[u8]) -> Result<(), BenchError>,
               rx: fn(&Connection, &mut u64) -> Result<(), BenchError>,
               sum: &mut u64|
     -> Result<f64, BenchError> {
        per_op(n, || {
            tx(c, &payload)?;
            rx(s, sum)?;
            tx(s, &payload)?;
            rx(c, sum)
        })
    };
    let rtt_send = rtt(send, recv, &mut sum)?;
    let rtt_copy = rtt(send_copy, recv, &mut sum)?;
    let claim_fits = size <= c.max_message_size() && c.claim(size).is_ok();
    let rtt_claim = if claim_fits {
        rtt(send_claim, recv, &mut sum)?
    } else {
        f64::NAN
    };
    let rtt_poll = rtt(send, recv_poll, &mut sum)?;
    let rtt_q = rtt(send, recv_q, &mut sum)?;
    std::hint::black_box(sum);
    Ok(vec![
        Stage {
            name: "alloc (+ drop)",
            ns: alloc,
        },
        Stage {
            name: "copy_from",
            ns: alloc_copy - alloc,
        },
        Stage {
            name: "send (header, copy into the ring, publication)",
            ns: sent - alloc_copy,
        },
        Stage {
            name: "try_recv in a run (read, position per run)",
            ns: recv_run,
        },
        Stage {
            name: "try_recv alone (read, position per message)",
            ns: one_way - sent,
        },
        Stage {
            name: "empty try_recv (one spin)",
            ns: empty,
        },
        Stage {
            name: "empty poll (one spin)",
            ns: empty_poll,
        },
        Stage {
            name: "RTT alloc/copy_from/send + try_recv",
            ns: rtt_send,
        },
        Stage {
            name: "RTT send_copy + try_recv",
            ns: rtt_copy,
        },
        Stage {
            name: "RTT claim/send + try_recv",
            ns: rtt_claim,
        },
        Stage {
            name: "RTT alloc/copy_from/send + poll",
            ns: rtt_poll,
        },
        Stage {
            name: "RTT alloc/copy_from/send + try_recv()?",
            ns: rtt_q,
        },
    ])
}
