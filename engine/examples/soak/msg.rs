//! Message contents: every message's length and bytes derive from (incarnation seed, sequence
//! number), and a message of 12 B or more carries its sequence number and an FNV-1a checksum.

pub fn mix(mut x: u64) -> u64 {
    // splitmix64
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Length of message `seq` of incarnation `seed`: half 1..=64 B, 30 % up to 1 KiB, the rest up
/// to `max`, and every 97th exactly `max`.
pub fn msg_len(seed: u64, seq: u64, max: usize) -> usize {
    let r = mix(seed ^ seq.wrapping_mul(0x1000_0000_01b3));
    if seq % 97 == 96 {
        return max;
    }
    let (lo, hi) = match r % 10 {
        0..=4 => (1, 64),
        5..=7 => (65, 1024),
        _ => (1025, max),
    };
    let hi = hi.min(max);
    let lo = lo.min(hi);
    lo + (r >> 8) as usize % (hi - lo + 1)
}

fn fnv32(data: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in data {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

pub fn fill(buf: &mut [u8], seed: u64, seq: u64) {
    let x = mix(seed ^ seq);
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (x >> ((i & 7) * 8)) as u8 ^ (i as u8);
    }
    if buf.len() >= 12 {
        let n = buf.len();
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        let sum = fnv32(&buf[..n - 4]);
        buf[n - 4..].copy_from_slice(&sum.to_le_bytes());
    }
}

/// The sequence number a message of 12 B or more carries, if its checksum holds.
pub fn carried_seq(m: &[u8]) -> Option<u64> {
    let n = m.len();
    if n < 12 || fnv32(&m[..n - 4]).to_le_bytes() != m[n - 4..] {
        return None;
    }
    Some(u64::from_le_bytes(m[..8].try_into().ok()?))
}
