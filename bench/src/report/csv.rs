//! `summary.csv`: one row per point.

use super::Point;

/// Columns of `summary.csv`, in order.
pub const CSV_COLUMNS: &[&str] = &[
    "test",
    "label",
    "fabric",
    "mode",
    "role",
    "size_bytes",
    "iters",
    "warmup",
    "duration_s",
    "elapsed_s",
    "rtt_min_ns",
    "rtt_p50_ns",
    "rtt_p90_ns",
    "rtt_p99_ns",
    "rtt_p99_9_ns",
    "rtt_p99_99_ns",
    "rtt_max_ns",
    "rtt_mean_ns",
    "rtt_stdev_ns",
    "half_rtt_p50_ns",
    "msgs_per_sec",
    "mb_per_sec",
    "gbit_per_sec",
    "rtt_p50_x_floor",
    "rtt_p99_x_floor",
    "msgs_per_sec_x_floor",
    "co_corrected",
    "offered_rate",
    "cross",
    "cross_value",
    "idle",
    "batch",
    "depth",
    "inline_threshold",
    "signal_every",
    "buffers",
    "buffer_size",
    "poller_cores",
    "app_cores",
    "sent",
    "received",
    "would_block",
    "alloc_failures",
    "tx_stalls",
    "tx_batches",
    "busy_cycles",
    "empty_cycles",
    "latency_kind",
    "burst",
    "achieved_rate",
    "rate_shortfall",
    "rate_warning",
    "latency_min_ns",
    "latency_p50_ns",
    "latency_p90_ns",
    "latency_p99_ns",
    "latency_p99_9_ns",
    "latency_p99_99_ns",
    "latency_max_ns",
    "latency_mean_ns",
    "latency_stdev_ns",
    "client_user_s",
    "client_system_s",
    "client_voluntary_csw",
    "client_involuntary_csw",
    "server_user_s",
    "server_system_s",
    "server_voluntary_csw",
    "server_involuntary_csw",
    "floor_msgs_per_sec",
    "app_batch",
    "process_voluntary_csw",
    "process_involuntary_csw",
    "process_involuntary_csw_per_sec",
    "bytes_per_sec",
    "floor_memcpy_bytes_per_sec",
    "bytes_per_sec_x_memcpy",
    "max_message_size",
    "large_buffers",
    "large_threshold",
    "conn_max_message_size",
    "disturbed",
    "others_cpu",
    "disturbed_reason",
    "hugepages",
    "huge_regions",
    "huge_bytes",
    "small_regions",
    "small_bytes",
    "hugepage_fallbacks",
];

/// Renders `points` as CSV with a header row ([`CSV_COLUMNS`]); empty cells for nulls, core
/// lists joined with `;`.
pub fn csv(points: &[Point]) -> String {
    fn opt<T: ToString>(v: Option<T>) -> String {
        v.map(|v| v.to_string()).unwrap_or_default()
    }
    fn field(s: &str) -> String {
        if s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_string()
        }
    }
    fn cores(c: &[usize]) -> String {
        c.iter().map(usize::to_string).collect::<Vec<_>>().join(";")
    }
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    for p in points {
        let rtt = p.rtt_ns.map(|r| r.as_array());
        let rtt_col = |i: usize| opt(rtt.map(|a| a[i]));
        let k = &p.knobs;
        let row: Vec<String> = vec![
            p.test.clone(),
            p.label.clone(),
            p.fabric.clone(),
            p.mode.clone(),
            p.role.clone(),
            p.size_bytes.to_string(),
            p.iters.to_string(),
            p.warmup.to_string(),
            opt(p.duration_s),
            p.elapsed_s.to_string(),
            rtt_col(0),
            rtt_col(1),
            rtt_col(2),
            rtt_col(3),
            rtt_col(4),
            rtt_col(5),
            rtt_col(6),
            rtt_col(7),
            rtt_col(8),
            opt(p.half_rtt_ns.map(|r| r.p50)),
            opt(p.msgs_per_sec),
            opt(p.mb_per_sec),
            opt(p.gbit_per_sec),
            opt(p.rtt_x_floor.map(|r| r.p50)),
            opt(p.rtt_x_floor.map(|r| r.p99)),
            opt(p.msgs_per_sec_x_floor),
            p.co_corrected.to_string(),
            k.offered_rate.to_string(),
            opt(p.cross.clone()),
            opt(p.cross_value),
            k.idle.clone(),
            k.batch.to_string(),
            k.depth.to_string(),
            k.inline_threshold.to_string(),
            k.signal_every.to_string(),
            k.buffers.to_string(),
            k.buffer_size.to_string(),
            cores(&k.poller_cores),
            cores(&k.app_cores),
        ];
        let c = p.counters;
        let mut row = row;
        row.extend([
            opt(c.map(|c| c.sent)),
            opt(c.map(|c| c.received)),
            opt(c.map(|c| c.would_block)),
            opt(c.map(|c| c.alloc_failures)),
            opt(c.map(|c| c.tx_stalls)),
            opt(c.map(|c| c.tx_batches)),
            opt(c.map(|c| c.busy_cycles)),
            opt(c.map(|c| c.empty_cycles)),
            opt(p.latency_kind.clone()),
            opt(p.burst),
            opt(p.achieved_rate),
            opt(p.rate_shortfall),
            p.rate_warning.to_string(),
        ]);
        let lat = p.latency_ns.map(|r| r.as_array());
        row.extend((0..9).map(|i| opt(lat.map(|a| a[i]))));
        let client = p.cpu.map(|c| c.client);
        let server = p.cpu.and_then(|c| c.server);
        for t in [client, server] {
            row.extend([
                opt(t.map(|t| t.user_s)),
                opt(t.map(|t| t.system_s)),
                opt(t.map(|t| t.voluntary_csw)),
                opt(t.map(|t| t.involuntary_csw)),
            ]);
        }
        row.extend([
            opt(p.floor_msgs_per_sec),
            k.app_batch.to_string(),
            opt(p.process.map(|c| c.voluntary_csw)),
            opt(p.process.map(|c| c.involuntary_csw)),
            opt(p.process.map(|c| c.involuntary_csw_per_sec)),
            opt(p.bytes_per_sec),
            opt(p.floor_memcpy_bytes_per_sec),
            opt(p.bytes_per_sec_x_memcpy),
            k.max_message_size.to_string(),
            k.large_buffers.to_string(),
            k.large_threshold.to_string(),
            opt(p.conn_max_message_size),
            opt(p.quiet.as_ref().map(|q| q.disturbed)),
            opt(p.quiet.as_ref().map(|q| q.others_cpu)),
            opt(p.quiet.as_ref().map(|q| q.reason.clone())),
            k.hugepages.clone(),
            opt(c.map(|c| c.huge_regions)),
            opt(c.map(|c| c.huge_bytes)),
            opt(c.map(|c| c.small_regions)),
            opt(c.map(|c| c.small_bytes)),
            opt(c.map(|c| c.hugepage_fallbacks)),
        ]);
        debug_assert_eq!(row.len(), CSV_COLUMNS.len());
        let line: Vec<String> = row.iter().map(|s| field(s)).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    out
}
