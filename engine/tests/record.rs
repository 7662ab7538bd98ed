//! The v2 record codec (`spinwire::record`): round trips of every type and size, FIFO streams
//! split at every byte boundary (TCP partial reads), hostile input (only typed errors), and the
//! reader against a simple model.

use spinwire::record::{
    FrameReader, Record, RecordError, RecordReader, RecordType, RecordWriter, FRAME_HEADER,
    MAX_PAYLOAD, RECORD_HEADER,
};

/// xorshift64*: deterministic, dependency-free randomness.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// An owned record, the model the reader is compared with.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owned {
    Data(Vec<u8>),
    BufRef(u32, u32),
    Pad,
    Credit(u64),
    Heartbeat(u64),
}

impl Owned {
    fn of(r: Record<'_>) -> Owned {
        match r {
            Record::Data(d) => Owned::Data(d.to_vec()),
            Record::BufRef { buf, len } => Owned::BufRef(buf, len),
            Record::Pad => Owned::Pad,
            Record::Credit(c) => Owned::Credit(c),
            Record::Heartbeat(h) => Owned::Heartbeat(h),
            other => panic!("unexpected record {other:?}"),
        }
    }

    fn write(&self, w: &mut RecordWriter<'_>) -> Result<(), RecordError> {
        match self {
            Owned::Data(d) => {
                // Exercise claim + commit in place rather than push_data for half of them.
                if d.len() % 2 == 0 {
                    let mut c = w.claim(d.len())?;
                    c.payload_mut().copy_from_slice(d);
                    c.commit();
                    Ok(())
                } else {
                    w.push_data(d)
                }
            }
            Owned::BufRef(b, l) => w.push_buf_ref(*b, *l),
            Owned::Pad => unreachable!("pads are written with pad_to_end"),
            Owned::Credit(c) => w.push_credit(*c),
            Owned::Heartbeat(h) => w.push_heartbeat(*h),
        }
    }

    /// Encoded size (padding included), per the spec table.
    fn wire_size(&self) -> usize {
        let payload = match self {
            Owned::Data(d) => d.len(),
            Owned::Pad => 0,
            _ => 8,
        };
        (RECORD_HEADER + payload).div_ceil(8) * 8
    }
}

fn random_record(rng: &mut Rng, max: usize) -> Owned {
    match rng.below(10) {
        0 => Owned::BufRef(rng.next() as u32, rng.next() as u32),
        1 => Owned::Credit(rng.next()),
        2 => Owned::Heartbeat(rng.next()),
        _ => {
            // Mostly small, sometimes up to max.
            let len = if rng.below(8) == 0 {
                rng.below(max as u64 + 1)
            } else {
                rng.below(40.min(max as u64 + 1))
            } as usize;
            let seed = rng.next() as u8;
            Owned::Data((0..len).map(|i| seed.wrapping_add(i as u8)).collect())
        }
    }
}

fn encode(recs: &[Owned], max: usize) -> Vec<u8> {
    let size: usize = recs.iter().map(Owned::wire_size).sum();
    let mut buf = vec![0xAAu8; size];
    let mut w = RecordWriter::new(&mut buf, max).unwrap();
    for r in recs {
        r.write(&mut w).unwrap();
    }
    assert_eq!(
        w.remaining(),
        0,
        "wire_size model disagrees with the writer"
    );
    let n = w.finish().unwrap().len();
    assert_eq!(n, size);
    buf
}

fn decode_exact(buf: &[u8], max: usize) -> Result<Vec<Owned>, RecordError> {
    RecordReader::exact(buf, max)
        .unwrap()
        .map(|r| r.map(Owned::of))
        .collect()
}

#[test]
fn round_trip_every_type_and_size() {
    let max = 1024;
    let mut buf = vec![0u8; 2048];
    for len in 0..=max {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let recs = [
            Owned::Data(data),
            Owned::BufRef(len as u32, u32::MAX - len as u32),
            Owned::Credit(u64::MAX - len as u64),
            Owned::Heartbeat(len as u64),
        ];
        let mut w = RecordWriter::new(&mut buf, max).unwrap();
        for r in &recs {
            r.write(&mut w).unwrap();
        }
        w.pad_to_end().unwrap();
        assert_eq!(w.remaining(), 0);
        let out = w.finish().unwrap();
        let got = decode_exact(out, max).unwrap();
        assert_eq!(&got[..4], &recs[..]);
        assert_eq!(got[4], Owned::Pad);
        assert_eq!(got.len(), 5);
    }
}

#[test]
fn max_payload_is_enforced_both_ways() {
    let mut buf = vec![0u8; 256];
    let mut w = RecordWriter::new(&mut buf, 16).unwrap();
    assert!(matches!(
        w.push_data(&[0; 17]),
        Err(RecordError::TooLong {
            len: 17,
            max: 16,
            ..
        })
    ));
    w.push_data(&[1; 16]).unwrap();
    let out = w.finish().unwrap().to_vec();
    assert!(matches!(
        decode_exact(&out, 15),
        Err(RecordError::TooLong {
            len: 16,
            max: 15,
            ..
        })
    ));
    assert!(matches!(
        RecordReader::exact(&out, MAX_PAYLOAD + 1),
        Err(RecordError::BadLimit { .. })
    ));
}

#[test]
fn writer_reports_no_space_and_abort_writes_nothing() {
    let mut buf = [0x55u8; 24];
    let mut w = RecordWriter::new(&mut buf, 64).unwrap();
    w.push_data(&[1; 8]).unwrap(); // 16 bytes
    assert!(matches!(
        w.push_data(&[1; 1]),
        Err(RecordError::NoSpace { need: 16, have: 8 })
    ));
    {
        let mut c = w.claim(0).unwrap();
        c.payload_mut();
        // dropped: aborted
    }
    assert_eq!(w.count(), 1);
    assert_eq!(w.len(), 16);
    let out = w.finish().unwrap();
    assert_eq!(out.len(), 16);
    assert_eq!(&buf[16..], &[0x55; 8], "an aborted claim wrote bytes");
}

#[test]
fn frame_round_trip_and_header_checks() {
    let mut rng = Rng::new(7);
    let max = 256;
    for _ in 0..200 {
        let n = 1 + rng.below(20) as usize;
        let recs: Vec<Owned> = (0..n).map(|_| random_record(&mut rng, max)).collect();
        let mut buf = vec![0u8; 8192];
        let mut w = RecordWriter::frame(&mut buf, max).unwrap();
        for r in &recs {
            r.write(&mut w).unwrap();
        }
        let frame = w.finish().unwrap().to_vec();
        let f = FrameReader::new_checked(&frame, max).unwrap();
        assert_eq!(f.len(), frame.len());
        assert_eq!(usize::from(f.count()), n);
        let mut got = Vec::new();
        assert_eq!(f.for_each(|r| got.push(Owned::of(r))).unwrap(), n);
        assert_eq!(got, recs);

        // Trailing bytes after the frame (the next frame of a stream) are not looked at.
        let mut longer = frame.clone();
        longer.extend_from_slice(&[0xFF; 24]);
        assert_eq!(
            FrameReader::new_checked(&longer, max).unwrap().len(),
            frame.len()
        );

        // A wrong count is caught.
        let mut bad = frame.clone();
        bad[4..6].copy_from_slice(&(n as u16 + 1).to_le_bytes());
        let f = FrameReader::new_checked(&bad, max).unwrap();
        assert!(matches!(
            f.for_each(|_| {}),
            Err(RecordError::CountMismatch { .. })
        ));
        if n > 1 {
            bad[4..6].copy_from_slice(&(n as u16 - 1).to_le_bytes());
            let f = FrameReader::new_checked(&bad, max).unwrap();
            assert!(matches!(
                f.for_each(|_| {}),
                Err(RecordError::CountMismatch { .. })
            ));
        }
        // A truncated buffer is caught.
        let cut = &frame[..frame.len() - 8];
        assert!(matches!(
            FrameReader::new_checked(cut, max),
            Err(RecordError::BadFrame { .. })
        ));
    }
    // Header field checks.
    let mut buf = vec![0u8; 64];
    let mut w = RecordWriter::frame(&mut buf, 64).unwrap();
    w.push_heartbeat(1).unwrap();
    let frame = w.finish().unwrap().to_vec();
    for (at, val) in [(6usize, 2u8), (7, 1), (0, 20), (0, 8)] {
        let mut b = frame.clone();
        b[at] = val;
        assert!(
            matches!(
                FrameReader::new_checked(&b, 64),
                Err(RecordError::BadFrame { .. })
            ),
            "byte {at} = {val} accepted"
        );
    }
    let mut b = frame.clone();
    b[4] = 0;
    assert!(matches!(
        FrameReader::new_checked(&b, 64),
        Err(RecordError::BadFrame { .. })
    ));
    assert!(matches!(
        FrameReader::new_checked(&frame[..5], 64),
        Err(RecordError::BadFrame { .. })
    ));
    let mut empty = [0u8; 16];
    let w = RecordWriter::frame(&mut empty, 64).unwrap();
    assert!(w.finish().is_err(), "a frame without records");
    assert_eq!(FRAME_HEADER, 8);
}

#[test]
fn stream_split_at_every_byte_boundary() {
    let mut rng = Rng::new(42);
    let max = 200;
    let recs: Vec<Owned> = (0..60).map(|_| random_record(&mut rng, max)).collect();
    let wire = encode(&recs, max);
    // Deliver the stream in two pieces split at every offset (and in random chunk sizes): a
    // TCP-like receiver appends to its buffer and parses whole records, keeping the partial one.
    let mut splits: Vec<Vec<usize>> = (0..=wire.len()).map(|s| vec![s]).collect();
    for _ in 0..200 {
        let mut cuts = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            at += 1 + rng.below(37) as usize;
            cuts.push(at.min(wire.len()));
        }
        splits.push(cuts);
    }
    for cuts in splits {
        let mut pending: Vec<u8> = Vec::new();
        let mut got = Vec::new();
        let mut prev = 0;
        for &c in cuts.iter().chain(std::iter::once(&wire.len())) {
            pending.extend_from_slice(&wire[prev..c]);
            prev = c;
            let mut r = RecordReader::stream(&pending, max).unwrap();
            for rec in r.by_ref() {
                got.push(Owned::of(rec.unwrap()));
            }
            let used = r.position();
            assert_eq!(used % 8, 0);
            pending.drain(..used);
        }
        assert!(pending.is_empty());
        assert_eq!(got, recs, "cuts {cuts:?}");
    }
}

#[test]
fn stream_stops_at_uncommitted_header() {
    let recs = [Owned::Heartbeat(9), Owned::Data(vec![1, 2, 3])];
    let mut wire = encode(&recs, 64);
    wire.extend_from_slice(&[0u8; 16]); // a zero length word: not yet committed
    let mut r = RecordReader::stream(&wire, 64).unwrap();
    assert_eq!(r.by_ref().count(), 2);
    assert_eq!(r.position(), 32);
    // The same bytes as a frame body are an error.
    assert!(matches!(
        decode_exact(&wire, 64),
        Err(RecordError::BadLength { offset: 32, len: 0 })
    ));
}

#[test]
fn each_header_violation_has_its_error() {
    let base = encode(&[Owned::Credit(5)], 64);
    let case = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = base.clone();
        f(&mut b);
        decode_exact(&b, 64).unwrap_err()
    };
    assert!(matches!(
        case(&|b| b[0] = 7),
        RecordError::BadLength { len: 7, .. }
    ));
    assert!(matches!(
        case(&|b| b[4] = 0),
        RecordError::UnknownType { ty: 0, .. }
    ));
    assert!(matches!(
        case(&|b| b[4] = 200),
        RecordError::UnknownType { ty: 200, .. }
    ));
    assert!(matches!(
        case(&|b| b[4] = 6),
        RecordError::Unsupported {
            ty: RecordType::Frag,
            ..
        }
    ));
    // RNDV (#12) is defined now: a CREDIT-sized payload is the wrong size for it.
    assert!(matches!(
        case(&|b| b[4] = 7),
        RecordError::BadPayload {
            ty: RecordType::Rndv,
            len: 8,
            expected: 24,
            ..
        }
    ));
    assert!(matches!(
        case(&|b| b[5] = 1),
        RecordError::Reserved { flags: 1, .. }
    ));
    assert!(matches!(
        case(&|b| b[7] = 1),
        RecordError::Reserved { aux: 0x100, .. }
    ));
    assert!(matches!(
        case(&|b| b[0] = 15),
        RecordError::BadPayload {
            ty: RecordType::Credit,
            len: 7,
            ..
        }
    ));
    assert!(matches!(
        case(&|b| b[0] = 17),
        RecordError::Truncated {
            need: 24,
            have: 16,
            ..
        }
    ));
    assert!(matches!(
        case(&|b| b.truncate(12)),
        RecordError::Truncated { .. }
    ));
    // A huge length on a fixed-size record: it runs past the buffer.
    assert!(matches!(
        case(&|b| b[3] = 0x80),
        RecordError::Truncated { .. }
    ));
    // On DATA it exceeds the maximum first.
    let mut data = encode(&[Owned::Data(vec![1; 3])], 64);
    data[3] = 0x80;
    assert!(matches!(
        decode_exact(&data, 64),
        Err(RecordError::TooLong { max: 64, .. })
    ));
}

/// Random bytes, random headers, random lengths and counts: the readers return records or a
/// typed error, never panic, never run past the buffer, and always terminate.
#[test]
fn hostile_input_gets_typed_errors_only() {
    let seeds = if cfg!(debug_assertions) {
        3_000
    } else {
        20_000
    };
    for seed in 0..seeds {
        let mut rng = Rng::new(seed);
        let len = rng.below(300) as usize;
        let mut buf: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Half the seeds: plausible headers, so the deeper checks get exercised.
        if seed % 2 == 0 {
            let mut at = if seed % 4 == 0 { FRAME_HEADER } else { 0 };
            while at + 8 <= buf.len() {
                let l = rng.below(64) as u32;
                buf[at..at + 4].copy_from_slice(&l.to_le_bytes());
                buf[at + 4] = rng.below(9) as u8;
                if rng.below(4) != 0 {
                    buf[at + 5] = 0;
                    buf[at + 6] = 0;
                    buf[at + 7] = 0;
                }
                at += (l as usize).div_ceil(8).max(1) * 8;
            }
            if seed % 4 == 0 && buf.len() >= 8 {
                let fl = (buf.len() as u32).saturating_sub(rng.below(3) as u32 * 8) & !7;
                buf[0..4].copy_from_slice(&fl.to_le_bytes());
                buf[4..6].copy_from_slice(&(rng.below(6) as u16).to_le_bytes());
                buf[6] = 1;
                buf[7] = 0;
            }
        }
        let max = rng.below(128) as usize;
        for stream in [false, true] {
            let mut r = if stream {
                RecordReader::stream(&buf, max).unwrap()
            } else {
                RecordReader::exact(&buf, max).unwrap()
            };
            let mut steps = 0;
            for rec in r.by_ref() {
                steps += 1;
                assert!(steps <= buf.len() / 8 + 1, "reader does not terminate");
                match rec {
                    Ok(Record::Data(d)) => assert!(d.len() <= max),
                    Ok(_) => {}
                    Err(_) => {}
                }
            }
            assert!(r.position() <= buf.len());
        }
        if let Ok(f) = FrameReader::new_checked(&buf, max) {
            assert!(f.len() <= buf.len());
            let _ = f.for_each(|_| {});
        }
    }
}

/// The reader against a model: a random record sequence, encoded, then one byte corrupted at a
/// random place. The reader must return exactly the records that lie wholly before the
/// corrupted record, and then either an error or (for a corruption that keeps the header valid,
/// e.g. in a payload) records whose count and sizes still agree with the wire.
#[test]
fn reader_matches_model() {
    let seeds = if cfg!(debug_assertions) { 500 } else { 5_000 };
    for seed in 0..seeds {
        let mut rng = Rng::new(seed ^ 0xABCD);
        let max = 1 + rng.below(100) as usize;
        let n = rng.below(30) as usize;
        let recs: Vec<Owned> = (0..n).map(|_| random_record(&mut rng, max)).collect();
        let wire = encode(&recs, max);
        assert_eq!(decode_exact(&wire, max).unwrap(), recs);
        if wire.is_empty() {
            continue;
        }
        let at = rng.below(wire.len() as u64) as usize;
        let mut bad = wire.clone();
        bad[at] ^= 1 << rng.below(8);
        // Records that end before `at` are untouched.
        let mut off = 0;
        let mut intact = 0;
        for r in &recs {
            if off + r.wire_size() > at {
                break;
            }
            off += r.wire_size();
            intact += 1;
        }
        let mut r = RecordReader::exact(&bad, max).unwrap();
        for (i, want) in recs.iter().take(intact).enumerate() {
            let got = r.next_record().unwrap().map(Owned::of);
            assert_eq!(got.as_ref(), Some(want), "seed {seed} record {i}");
        }
        assert_eq!(r.position(), off);
        // Whatever follows is validated: every record it still yields fits in the buffer.
        for rec in r.by_ref() {
            if let Ok(Record::Data(d)) = rec {
                assert!(d.len() <= max);
            }
        }
        assert!(r.position() <= bad.len());
    }
}

#[test]
fn rndv_records_round_trip_and_check_their_size() {
    let mut b = [0u8; 64];
    let mut w = RecordWriter::frame(&mut b, 64).unwrap();
    w.push_rndv(3, 1 << 20, 0x7f00_dead_b000, 0x1234).unwrap();
    w.push_rndv_done(3).unwrap();
    let wire = w.finish().unwrap().to_vec();
    assert_eq!(wire.len(), 8 + 32 + 16);
    let f = FrameReader::new_checked(&wire, 64).unwrap();
    let mut got = Vec::new();
    f.for_each(|r| got.push(format!("{r:?}"))).unwrap();
    assert_eq!(
        got,
        [
            format!(
                "{:?}",
                Record::Rndv {
                    slot: 3,
                    len: 1 << 20,
                    addr: 0x7f00_dead_b000,
                    rkey: 0x1234
                }
            ),
            format!("{:?}", Record::RndvDone { slot: 3 }),
        ]
    );
    // RNDV_DONE with an RNDV-sized payload, and the reverse, are BadPayload.
    let mut bad = wire.clone();
    bad[8 + 4] = 8;
    assert!(matches!(
        FrameReader::new_checked(&bad, 64).and_then(|f| f.for_each(|_| ())),
        Err(RecordError::BadPayload {
            ty: RecordType::RndvDone,
            ..
        })
    ));
    let mut bad = wire;
    bad[8 + 32 + 4] = 7;
    assert!(matches!(
        FrameReader::new_checked(&bad, 64).and_then(|f| f.for_each(|_| ())),
        Err(RecordError::BadPayload {
            ty: RecordType::Rndv,
            ..
        })
    ));
}
