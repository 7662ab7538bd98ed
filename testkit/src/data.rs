//! Test payloads whose every byte is checked: sequence-numbered, checksummed frames
//! ([`fill`] / [`verify`]), plain byte patterns ([`payload`]) and a seeded PRNG ([`XorShift`]).
//!
//! A frame of `n >= 12` bytes is `[seq: u32 LE][pattern bytes][FNV-1a of the rest: u32 LE]`,
//! where the pattern depends on `seq` and the byte's offset; a shorter frame is the pattern
//! alone (which depends on `seq` too). [`verify`] checks the length, the sequence number, the
//! checksum and every pattern byte, so a lost, reordered, truncated or corrupted message fails
//! with the message and byte that differ.

/// Bytes of a frame needed for the sequence number and the checksum.
pub const FRAME_HEADER_TRAILER: usize = 12;

/// 32-bit FNV-1a of `data`.
pub fn fnv32(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The pattern byte at offset `i` of frame `seq`.
fn pattern(seq: u32, i: usize) -> u8 {
    (seq.wrapping_mul(2_654_435_761)
        .wrapping_add((i as u32).wrapping_mul(97))
        >> 13) as u8
}

/// Fills `buf` as frame `seq` (see the module docs for the layout).
pub fn fill(buf: &mut [u8], seq: u32) {
    let n = buf.len();
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(seq, i);
    }
    if n >= FRAME_HEADER_TRAILER {
        buf[..4].copy_from_slice(&seq.to_le_bytes());
        let c = fnv32(&buf[..n - 4]);
        buf[n - 4..].copy_from_slice(&c.to_le_bytes());
    }
}

/// Checks that `buf` is frame `seq` of `len` bytes, as written by [`fill`].
///
/// # Panics
///
/// On the first difference, naming the message and what differs (length, sequence number,
/// checksum or byte offset).
pub fn verify(buf: &[u8], seq: u32, len: usize) {
    assert_eq!(buf.len(), len, "message {seq}: wrong length");
    let n = buf.len();
    if n >= FRAME_HEADER_TRAILER {
        let got = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
        assert_eq!(got, seq, "sequence number");
        let c = u32::from_le_bytes(buf[n - 4..].try_into().expect("4 bytes"));
        assert_eq!(c, fnv32(&buf[..n - 4]), "message {seq} ({len} B): checksum");
        for (i, &b) in buf[4..n - 4].iter().enumerate() {
            assert_eq!(
                b,
                pattern(seq, i + 4),
                "message {seq} ({len} B): byte {}",
                i + 4
            );
        }
    } else {
        for (i, &b) in buf.iter().enumerate() {
            assert_eq!(b, pattern(seq, i), "message {seq} ({len} B): byte {i}");
        }
    }
}

/// `len` bytes that depend on their offset and on `seed`: the payload of a test that compares
/// whole messages (`assert_eq!(&*msg, payload(len, seed).as_slice())`).
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u64)
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add(seed.wrapping_mul(31)) as u8
        })
        .collect()
}

/// xorshift64*: a small, fast, seeded PRNG for fuzz and stress tests (reproducible from its
/// seed; not for anything that needs real randomness).
#[derive(Clone, Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator seeded with `seed` (0 is replaced: the state must never be zero).
    pub fn new(seed: u64) -> Self {
        XorShift(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n`.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An index in `0..n`.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn index(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_verify_and_differ_by_sequence_number() {
        for len in [0, 1, 11, 12, 13, 100] {
            let mut a = vec![0u8; len];
            fill(&mut a, 7);
            verify(&a, 7, len);
            if len > 0 {
                let mut b = vec![0u8; len];
                fill(&mut b, 8);
                assert_ne!(a, b, "{len} B");
            }
        }
    }

    #[test]
    #[should_panic(expected = "checksum")]
    fn a_flipped_byte_fails_the_checksum() {
        let mut a = vec![0u8; 64];
        fill(&mut a, 3);
        a[20] ^= 1;
        verify(&a, 3, 64);
    }

    #[test]
    fn xorshift_is_reproducible_and_never_stuck() {
        let mut a = XorShift::new(0);
        let mut b = XorShift::new(0);
        let xs: Vec<u64> = (0..4).map(|_| a.next()).collect();
        assert_eq!(xs, (0..4).map(|_| b.next()).collect::<Vec<_>>());
        assert!(xs.iter().all(|&x| x != 0));
        assert!((0..100).all(|_| a.below(5) < 5 && a.index(3) < 3));
    }
}
