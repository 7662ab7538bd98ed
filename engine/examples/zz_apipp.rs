// throwaway experiment: public-API shm ping-pong between two pinned threads.
use spinwire::{Connection, Engine};
use std::time::{Duration, Instant};
fn snd(c: &Connection, p: &[u8], copy: bool) {
    if copy {
        c.send_copy(p).unwrap();
    } else {
        let mut b = c.alloc().unwrap();
        b.copy_from(p).unwrap();
        c.send(b).unwrap();
    }
}
fn rcv(c: &Connection, out: &mut [u8; 8], poll: bool) -> bool {
    if poll {
        c.poll(|m| out.copy_from_slice(m), 1).unwrap() > 0
    } else {
        match c.try_recv().unwrap() {
            Some(m) => {
                out.copy_from_slice(&m);
                true
            }
            None => false,
        }
    }
}
fn main() {
    let mode: String = std::env::args().nth(1).unwrap_or("try-acs".into());
    let poll = mode.starts_with("poll");
    let copy = mode.ends_with("copy");
    let iters = 2_000_000u64;
    let name = format!("shm://zzpp{}", std::process::id());
    let ids = core_affinity::get_core_ids().unwrap();
    let c1 = ids[1];
    let n2 = name.clone();
    let srv = std::thread::spawn(move || {
        core_affinity::set_for_current(c1);
        let e = Engine::builder().run_to_completion().build().unwrap();
        let l = e.listen(&n2).unwrap();
        let c = l.accept_timeout(Duration::from_secs(5)).unwrap();
        let mut n = 0;
        let mut tmp = [0u8; 8];
        while n < iters {
            if rcv(&c, &mut tmp, poll) {
                n += 1;
                snd(&c, &tmp, copy);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    });
    core_affinity::set_for_current(ids[0]);
    let e = Engine::builder().run_to_completion().build().unwrap();
    let c = e.connect_timeout(&name, Duration::from_secs(5)).unwrap();
    let mut v = Vec::with_capacity(iters as usize);
    let p = [1u8; 8];
    let mut tmp = [0u8; 8];
    for _ in 0..iters {
        let t = Instant::now();
        snd(&c, &p, copy);
        while !rcv(&c, &mut tmp, poll) {}
        v.push(t.elapsed().as_nanos() as u64);
    }
    srv.join().unwrap();
    let v = &mut v[iters as usize / 4..];
    v.sort();
    println!(
        "{mode}: p50 {} p90 {} p99 {} p99.9 {}",
        v[v.len() / 2],
        v[v.len() * 9 / 10],
        v[v.len() * 99 / 100],
        v[v.len() * 999 / 1000]
    );
}
