//! Hostile shm hellos: a raw Unix-socket client sends a shm listener byte-mutated copies of
//! a real connector's hello (every byte set to edge values and bit-flipped) and hellos with
//! absurd values (ring depth `0xffffffff`, 4096 large slots, a zero or huge buffer size, ...).
//! Each is refused with a typed reason (a reject the client reads, and a typed event on the
//! listener's engine) or settled to values the listener bounds (its own pool geometry, large
//! slots no larger and no more than its own, a ring no deeper than its pool, the inline
//! limit); nothing else is accepted. The listener stays alive throughout, and a good client
//! then connects and exchanges verified messages.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use cm::uds::{self, testing, ConnParams, HandshakeRefusal, UdsError, UdsListener};
use spinwire::{Engine, Error, Event, SetupError};
use spinwire_testkit::engine::*;
use spinwire_testkit::{serial, WAIT};

const BUF: usize = 4096;
const COUNT: usize = 16;
/// The listener's message limit: large slots of 64 KiB (cheap segments, yet settled).
const LIMIT: usize = 64 << 10;
const LARGE: usize = 2;

/// Offset of the params in a handshake message (after magic, version, kind, pid, reason).
const PARAMS_AT: usize = 16;

fn builder() -> spinwire::EngineBuilder {
    rtc_builder(BUF, COUNT)
        .max_message_size(LIMIT)
        .large_buffers(LARGE)
}

/// The hello a real connector of [`builder`]'s configuration sends, captured by a raw
/// listener (the connect then fails, as nobody answers it).
fn real_hello() -> [u8; 64] {
    let name = format!("hello-capture-{}", std::process::id());
    let raw = UdsListener::bind(&name).expect("raw listener");
    let engine = builder().build().unwrap();
    let ep = format!("shm://{name}");
    let connector = std::thread::spawn(move || {
        let _ = engine.connect_timeout(&ep, Duration::from_millis(500));
    });
    let mut s = raw.accept_timeout(WAIT).expect("the connector");
    let hello = testing::recv_raw(&mut s, WAIT)
        .expect("its hello")
        .expect("a message");
    drop(s);
    connector.join().unwrap();
    hello
}

fn params_of(m: &[u8; 64]) -> ConnParams {
    let w = |i: usize| {
        let at = PARAMS_AT + 4 * i;
        u32::from_le_bytes(m[at..at + 4].try_into().unwrap())
    };
    ConnParams {
        buffer_size: w(0),
        buffer_count: w(1),
        ring_depth: w(2),
        inline_max: w(3),
        flags: w(4),
        large_size: w(5),
        large_count: w(6),
    }
}

fn with_params(mut m: [u8; 64], p: &ConnParams) -> [u8; 64] {
    let fields = [
        p.buffer_size,
        p.buffer_count,
        p.ring_depth,
        p.inline_max,
        p.flags,
        p.large_size,
        p.large_count,
    ];
    for (i, f) in fields.iter().enumerate() {
        let at = PARAMS_AT + 4 * i;
        m[at..at + 4].copy_from_slice(&f.to_le_bytes());
    }
    m
}

/// How the listener answered one hello.
#[derive(Debug, Default)]
struct Tally {
    settled: usize,
    rejected: usize,
    dropped: usize,
}

/// The segment's size as the listener made it.
fn fd_len(fd: &impl AsRawFd) -> u64 {
    // SAFETY: fstat on a descriptor we own, into a zeroed stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_size as u64
}

/// Sends `hello` from a raw client and checks the listener's answer: an offer within the
/// listener's bounds (`real`: what its own kind of connector proposes), a typed reject, or a
/// closed socket; then the typed event the listener's engine reports for it.
fn try_hello(engine: &Engine, name: &str, hello: &[u8; 64], real: &ConnParams, t: &mut Tally) {
    let mut s = uds::connect(name, WAIT).expect("raw connect: the listener is alive");
    testing::send_raw(&s, hello, &[]).expect("send the hello");
    match s.recv_offer(WAIT) {
        Ok(offer) => {
            let o = offer.params;
            let ring_max = (COUNT as u32).next_power_of_two();
            assert_eq!(
                (o.buffer_size, o.buffer_count),
                (real.buffer_size, real.buffer_count),
                "the listener's own pool geometry: {o:?} for {hello:?}"
            );
            assert!(
                (2..=ring_max).contains(&o.ring_depth) && o.ring_depth.is_power_of_two(),
                "ring depth {} (at most {ring_max}) for {hello:?}",
                o.ring_depth
            );
            assert!(o.inline_max <= 120, "inline {} for {hello:?}", o.inline_max);
            assert!(
                o.large_count <= real.large_count && o.large_size <= real.large_size,
                "large slots {} x {} for {hello:?}",
                o.large_count,
                o.large_size
            );
            assert_eq!(o.flags, 0, "no feature flags are settled");
            // The segment is as large as these params need, at most what its own connector's
            // deepest ring would take: nothing the client asked for beyond that.
            let len = fd_len(&offer.segment);
            assert!(len <= 4 << 20, "a segment of {len} bytes for {hello:?}");
            t.settled += 1;
            // Never ready: the listener drops the handshake when the socket closes.
        }
        Err(UdsError::Rejected { reason, .. }) => {
            assert!(
                !matches!(reason, HandshakeRefusal::Unknown(_)),
                "a typed refusal: {reason:?}"
            );
            t.rejected += 1;
        }
        // A message the listener cannot read is answered by closing the socket.
        Err(UdsError::PeerClosed { .. } | UdsError::BadMessage { .. }) => t.dropped += 1,
        Err(e) => panic!("hello {hello:?}: unexpected answer {e:?}"),
    }
    drop(s);
    // Every hello ends in one typed accept failure on the listener's side (refused, unreadable,
    // or, settled, never readied).
    let deadline = Instant::now() + WAIT;
    loop {
        match engine.try_event() {
            Some(Event::Error { conn: None, error }) => {
                assert!(
                    matches!(error, Error::Setup(SetupError::Shm(_))),
                    "a typed shm setup error: {error:?}"
                );
                assert!(!error.to_string().is_empty());
                break;
            }
            Some(e) => panic!("hello {hello:?}: unexpected event {e:?}"),
            None => {
                assert!(Instant::now() < deadline, "no event for hello {hello:?}");
                engine.poll();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// A named change to a hello's params.
type Absurd = (&'static str, fn(&mut ConnParams));

#[test]
fn mutated_and_absurd_hellos_are_refused_or_bounded() {
    let _g = serial();
    let hello = real_hello();
    let real = params_of(&hello);
    let engine = builder().build().unwrap();
    let ep = endpoint("hello-mutations");
    let name = ep.strip_prefix("shm://").unwrap().to_owned();
    let listener = engine.listen(&ep).unwrap();
    let mut t = Tally::default();

    // The real hello itself is settled as proposed.
    try_hello(&engine, &name, &hello, &real, &mut t);
    assert_eq!(t.settled, 1, "the real hello is accepted");

    // Every byte set to edge values and bit-flipped.
    for at in 0..hello.len() {
        for value in [
            0x00,
            0x01,
            0x7f,
            0x80,
            0xfe,
            0xff,
            hello[at] ^ 1,
            hello[at] ^ 0x40,
        ] {
            let mut m = hello;
            m[at] = value;
            try_hello(&engine, &name, &m, &real, &mut t);
        }
    }

    // Absurd values, one field at a time.
    let absurd: [Absurd; 18] = [
        ("ring depth 0xffffffff", |p| p.ring_depth = u32::MAX),
        ("ring depth 0", |p| p.ring_depth = 0),
        ("ring depth 3", |p| p.ring_depth = 3),
        ("ring depth 65536", |p| p.ring_depth = 1 << 16),
        ("ring depth 1024", |p| p.ring_depth = 1024),
        ("buffer count 0", |p| p.buffer_count = 0),
        ("buffer count 4096", |p| p.buffer_count = 4096),
        ("buffer count 0xffffffff", |p| p.buffer_count = u32::MAX),
        ("buffer size 0", |p| p.buffer_size = 0),
        ("buffer size 1", |p| p.buffer_size = 1),
        ("buffer size 16 MiB", |p| p.buffer_size = 16 << 20),
        ("buffer size 0xffffffff", |p| p.buffer_size = u32::MAX),
        ("inline 0xffffffff", |p| p.inline_max = u32::MAX),
        ("inline 4096", |p| p.inline_max = 4096),
        ("large count 4096", |p| p.large_count = 4096),
        ("large count 0xffffffff", |p| p.large_count = u32::MAX),
        ("large size 1 GiB x 4096", |p| {
            p.large_size = 1 << 30;
            p.large_count = 4096;
        }),
        ("large size 0xffffffff", |p| p.large_size = u32::MAX),
    ];
    for (what, change) in absurd {
        let mut p = real;
        change(&mut p);
        let before = t.settled;
        try_hello(&engine, &name, &with_params(hello, &p), &real, &mut t);
        if t.settled > before {
            eprintln!("{what}: settled to bounded values");
        }
    }
    eprintln!("hellos: {t:?}");
    assert!(t.rejected > 0 && t.dropped > 0 && t.settled > 1, "{t:?}");

    // The listener still serves: a good client connects and exchanges verified messages.
    let good = builder().build().unwrap();
    let client = good.connect_timeout(&ep, WAIT).expect("a good client");
    let server = listener.accept_timeout(WAIT).expect("accepted");
    for seq in 0..100u32 {
        let len = 1 + (seq as usize * 997) % LIMIT;
        send_msg(&client, seq, len);
        recv_msg(&server, seq, len);
        send_msg(&server, seq, len);
        recv_msg(&client, seq, len);
    }
}
