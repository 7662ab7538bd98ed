//! The three outputs: a console table, JSON and the Prometheus text format.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{json as j, Map, Value};
use spinwire::counters::{Snapshot, CONN_FIELDS, ENGINE_FIELDS, POLLER_FIELDS};

/// Counters that are levels, not running totals: no rate, and a Prometheus gauge.
const GAUGES: [&str; 4] = [
    "connections",
    "in_flight",
    "last_heard_ms",
    "conns_unlisted",
];

/// Per-second rates of one engine's counters between two snapshots of its file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    /// Seconds between the two publications (0: nothing new was published).
    pub secs: f64,
    /// Engine counters, by name.
    pub engine: HashMap<&'static str, f64>,
    /// Poller counters, by poller index and name.
    pub pollers: Vec<HashMap<&'static str, f64>>,
    /// Connection counters, by connection id and name.
    pub conns: HashMap<u64, HashMap<&'static str, f64>>,
}

fn per_sec(names: &[&'static str], a: &[u64], b: &[u64], secs: f64) -> HashMap<&'static str, f64> {
    names
        .iter()
        .zip(a.iter().zip(b))
        .filter(|(n, _)| !GAUGES.contains(n))
        .map(|(n, (x, y))| (*n, y.wrapping_sub(*x) as f64 / secs))
        .collect()
}

impl Rates {
    /// The rates from `prev` to `cur` (two snapshots of one file).
    pub fn between(prev: &Snapshot, cur: &Snapshot) -> Rates {
        let secs = cur.published_unix_ns.saturating_sub(prev.published_unix_ns) as f64 / 1e9;
        if secs <= 0.0 {
            return Rates::default();
        }
        let pollers = cur
            .pollers
            .iter()
            .zip(&prev.pollers)
            .map(|(c, p)| per_sec(&POLLER_FIELDS, &p.values, &c.values, secs))
            .collect();
        let conns = cur
            .conns
            .iter()
            .filter_map(|c| {
                let p = prev.conns.iter().find(|p| p.id == c.id)?;
                Some((c.id, per_sec(&CONN_FIELDS, &p.values, &c.values, secs)))
            })
            .collect();
        Rates {
            secs,
            engine: per_sec(&ENGINE_FIELDS, &prev.engine, &cur.engine, secs),
            pollers,
            conns,
        }
    }
}

fn counters_obj(names: &[&str], vals: &[u64]) -> Map<String, Value> {
    names
        .iter()
        .zip(vals)
        .map(|(n, v)| ((*n).to_owned(), j!(v)))
        .collect()
}

fn rates_obj(r: Option<&HashMap<&'static str, f64>>) -> Value {
    match r {
        Some(r) => {
            let mut m: Vec<_> = r.iter().collect();
            m.sort_by_key(|(k, _)| **k);
            Value::Object(
                m.into_iter()
                    .map(|(k, v)| ((*k).to_owned(), j!(v)))
                    .collect(),
            )
        }
        None => Value::Null,
    }
}

/// One JSON object: `{"engines": [...], "errors": [...]}`; each engine has its counters, its
/// pollers and connections, and `rates` (per second, `null` on the first refresh).
pub fn json(snaps: &[Snapshot], rates: &[Option<Rates>], errors: &[String]) -> Value {
    let engines: Vec<Value> = snaps
        .iter()
        .zip(rates)
        .map(|(s, r)| {
            let r = r.as_ref().filter(|r| r.secs > 0.0);
            let pollers: Vec<Value> = s
                .pollers
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let mut o = counters_obj(&POLLER_FIELDS, &p.values);
                    o.insert("core".into(), j!(p.core));
                    o.insert("rates".into(), rates_obj(r.and_then(|r| r.pollers.get(i))));
                    Value::Object(o)
                })
                .collect();
            let conns: Vec<Value> = s
                .conns
                .iter()
                .map(|c| {
                    let mut o = counters_obj(&CONN_FIELDS, &c.values);
                    if c.get("last_heard_ms") == Some(u64::MAX) {
                        o.insert("last_heard_ms".into(), Value::Null);
                    }
                    o.insert("id".into(), j!(c.id));
                    o.insert("fabric".into(), j!(c.fabric));
                    o.insert("endpoint".into(), j!(c.endpoint));
                    o.insert("state".into(), j!(c.state.as_str()));
                    o.insert("reason".into(), j!(c.reason));
                    o.insert(
                        "rates".into(),
                        rates_obj(r.and_then(|r| r.conns.get(&c.id))),
                    );
                    Value::Object(o)
                })
                .collect();
            j!({
                "path": s.path.display().to_string(),
                "pid": s.pid,
                "name": s.name,
                "state": s.liveness.as_str(),
                "created_unix_ns": s.created_unix_ns,
                "published_unix_ns": s.published_unix_ns,
                "engine": Value::Object(counters_obj(&ENGINE_FIELDS, &s.engine)),
                "rates": rates_obj(r.map(|r| &r.engine)),
                "pollers": pollers,
                "connections": conns,
            })
        })
        .collect();
    j!({ "engines": engines, "errors": errors })
}

/// A Prometheus label value, escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The Prometheus text format: `spinwire_<scope>_<counter>[_total]{labels} value`, with one
/// `# TYPE` line per metric; `spinwire_engine_up` is 1 for a running engine, 0 for a stale
/// file. Rates are left to Prometheus (`rate()`).
pub fn prometheus(snaps: &[Snapshot], _rates: &[Option<Rates>]) -> String {
    // metric name -> (type, lines)
    let mut metrics: Vec<(String, &'static str, Vec<String>)> = Vec::new();
    let mut add = |scope: &str, name: &str, labels: String, v: u64| {
        let gauge = GAUGES.contains(&name) || name == "up";
        let metric = if gauge {
            format!("spinwire_{scope}_{name}")
        } else {
            format!("spinwire_{scope}_{name}_total")
        };
        let line = format!("{metric}{{{labels}}} {v}");
        match metrics.iter_mut().find(|(m, _, _)| *m == metric) {
            Some((_, _, l)) => l.push(line),
            None => metrics.push((metric, if gauge { "gauge" } else { "counter" }, vec![line])),
        }
    };
    for s in snaps {
        let base = format!("pid=\"{}\",engine=\"{}\"", s.pid, label(&s.name));
        add(
            "engine",
            "up",
            base.clone(),
            u64::from(s.liveness == spinwire::counters::Liveness::Running),
        );
        for (n, v) in ENGINE_FIELDS.iter().zip(&s.engine) {
            add("engine", n, base.clone(), *v);
        }
        for (i, p) in s.pollers.iter().enumerate() {
            let core = p.core.map_or("none".to_owned(), |c| c.to_string());
            let l = format!("{base},poller=\"{i}\",core=\"{core}\"");
            for (n, v) in POLLER_FIELDS.iter().zip(&p.values) {
                add("poller", n, l.clone(), *v);
            }
        }
        for c in &s.conns {
            let l = format!(
                "{base},conn=\"{}\",fabric=\"{}\",endpoint=\"{}\",state=\"{}\"",
                c.id,
                label(&c.fabric),
                label(&c.endpoint),
                c.state.as_str()
            );
            for (n, v) in CONN_FIELDS.iter().zip(&c.values) {
                if *n == "last_heard_ms" && *v == u64::MAX {
                    continue;
                }
                add("conn", n, l.clone(), *v);
            }
        }
    }
    let mut out = String::new();
    for (m, t, lines) in metrics {
        let _ = writeln!(out, "# TYPE {m} {t}");
        for l in lines {
            let _ = writeln!(out, "{l}");
        }
    }
    out
}

fn fmt_rate(r: Option<f64>) -> String {
    match r {
        Some(v) if v >= 1e6 => format!("{:.2}M/s", v / 1e6),
        Some(v) if v >= 1e3 => format!("{:.1}k/s", v / 1e3),
        Some(v) => format!("{v:.0}/s"),
        None => "-".into(),
    }
}

/// The console view: per engine a header line, its counters, then one block per poller and
/// per connection, each counter with its rate per second.
pub fn table(snaps: &[Snapshot], rates: &[Option<Rates>], errors: &[String]) -> String {
    let mut out = String::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    if snaps.is_empty() {
        let _ = writeln!(out, "no spinwire engines of this user");
    }
    for (s, r) in snaps.iter().zip(rates) {
        let r = r.as_ref().filter(|r| r.secs > 0.0);
        let age = now.saturating_sub(s.published_unix_ns) as f64 / 1e9;
        let _ = writeln!(
            out,
            "engine {} pid {} ({}), published {age:.1} s ago: {}",
            s.name,
            s.pid,
            s.liveness.as_str(),
            s.path.display()
        );
        let row = |out: &mut String,
                   names: &[&'static str],
                   vals: &[u64],
                   r: Option<&HashMap<&'static str, f64>>| {
            for (n, v) in names.iter().zip(vals) {
                let v = if *v == u64::MAX {
                    "-".to_owned()
                } else {
                    v.to_string()
                };
                let rate = if GAUGES.contains(n) {
                    String::new()
                } else {
                    fmt_rate(r.and_then(|r| r.get(n).copied()))
                };
                let _ = writeln!(out, "    {n:<20} {v:>16} {rate:>10}");
            }
        };
        row(&mut out, &ENGINE_FIELDS, &s.engine, r.map(|r| &r.engine));
        for (i, p) in s.pollers.iter().enumerate() {
            let core = p
                .core
                .map_or("run-to-completion".to_owned(), |c| format!("core {c}"));
            let _ = writeln!(out, "  poller {i} ({core})");
            row(
                &mut out,
                &POLLER_FIELDS,
                &p.values,
                r.and_then(|r| r.pollers.get(i)),
            );
        }
        for c in &s.conns {
            let reason = if c.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", c.reason)
            };
            let _ = writeln!(
                out,
                "  connection {} {} {} ({}{reason})",
                c.id,
                c.fabric,
                c.endpoint,
                c.state.as_str()
            );
            row(
                &mut out,
                &CONN_FIELDS,
                &c.values,
                r.and_then(|r| r.conns.get(&c.id)),
            );
        }
    }
    for e in errors {
        let _ = writeln!(out, "error: {e}");
    }
    out
}
