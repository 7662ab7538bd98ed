//! Ring benchmarks (filled in below).

fn main() {}
