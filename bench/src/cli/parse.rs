//! The value parsers of the command line: sizes, rates, fractions and durations.

use std::time::Duration;

/// Parses a byte count with an optional binary suffix: `64`, `4k`, `4KiB`, `1m`.
///
/// # Errors
/// A message naming the bad input when it is not a number with a known suffix, or overflows.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("`{s}` is not a size in bytes (e.g. 64, 4k, 1m)"));
    }
    let n: usize = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size in bytes (e.g. 64, 4k, 1m)"))?;
    let mult: usize = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size suffix `{other}` in `{s}` (use k, m or g)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

/// Parses a message rate with an optional decimal suffix: `500`, `100k`, `1m`, `2.5m`, `1g`.
///
/// # Errors
/// A message naming the bad input when it is not a non-negative number with a known suffix.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a rate in msgs/s (e.g. 500, 100k, 1m)"))?;
    let mult = match suffix.trim().to_ascii_lowercase().as_str() {
        "" => 1e0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        other => {
            return Err(format!(
                "unknown rate suffix `{other}` in `{s}` (use k, m or g)"
            ))
        }
    };
    let r = (v * mult).round();
    if !r.is_finite() || r > 1e12 {
        return Err(format!("rate `{s}` is too large"));
    }
    Ok(r as u64)
}

/// Parses a fraction: `5%` (= 0.05) or `0.05`.
///
/// # Errors
/// A message naming the bad input when it is not a non-negative number.
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(n) => (n, 100.0),
        None => (t, 1.0),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok(v / scale),
        _ => Err(format!("`{s}` is not a fraction (e.g. 5% or 0.05)")),
    }
}

/// Parses a duration: `2s`, `500ms`, `100us`, `1m`, or plain (fractional) seconds.
///
/// # Errors
/// A message naming the bad input when it is not a non-negative number with a known unit.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 2s, 500ms, 1.5)"))?;
    let secs = match unit.trim() {
        "" | "s" => v,
        "ms" => v / 1e3,
        "us" => v / 1e6,
        "ns" => v / 1e9,
        "m" | "min" => v * 60.0,
        other => {
            return Err(format!(
                "unknown time unit `{other}` in `{s}` (use ns, us, ms, s or m)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is not a valid duration"))
}
