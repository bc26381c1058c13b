//! The service's statistics and their Prometheus text exposition
//! (`USE_PROMETHEUS=true`: `PROMETHEUS_ADDR`, `PROMETHEUS_PATH`).
//!
//! envoyproxy/ratelimit keeps gostats counters and, with Prometheus,
//! renames them through a statsd-exporter mapping; the names here are the
//! ones that mapping gives (docs/envoy.md has the table):
//!
//! * per descriptor key, `ratelimit_service_rate_limit_{total_hits,over_limit,
//!   near_limit,within_limit,shadow_mode}` with the labels `domain`, `key1`
//!   and, for nested descriptors, `key2` (the first three dot-separated
//!   parts of the stats key `domain.key_value.key…`, as the mapping splits it);
//! * `ratelimit_service_config_load_success`, `ratelimit_service_config_load_error`;
//! * `ratelimit_service_should_rate_limit_error{err_type="redis_error"|"service_error"}`;
//! * `ratelimit_service_global_shadow_mode`;
//! * `ratelimit_service_total_requests` and the histogram
//!   `ratelimit_service_response_time_seconds` (label `grpc_method="ShouldRateLimit"`,
//!   for gRPC and `/json` calls alike);
//! * this service's own: `redis_ratelimit_client_*`, the Rust client's
//!   counters (Redis calls, calls failed or timed out, breaker trips).
//!
//! The counters of a stats key are created once, on its first request, and
//! found again by a lookup of the key as it stands in the configuration
//! (`detailed_metric` builds the key from the request's values, as
//! envoyproxy/ratelimit does).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::RwLock;
use std::time::Duration;

/// The counters of one stats key.
#[derive(Debug, Default)]
pub struct KeyStats {
    /// The Prometheus labels, rendered once: `domain="…",key1="…"[,key2="…"]`.
    labels: String,
    /// Hits of every request that matched the limit.
    pub total_hits: AtomicU64,
    /// Hits answered `OVER_LIMIT` by this limit (shadow mode included).
    pub over_limit: AtomicU64,
    /// Hits within the limit that took the count above `NEAR_LIMIT_RATIO` of it.
    pub near_limit: AtomicU64,
    /// Hits within the limit.
    pub within_limit: AtomicU64,
    /// Hits over a shadow-mode limit (answered `OK`).
    pub shadow_mode: AtomicU64,
}

/// The upper bounds (seconds) of the response-time histogram's buckets.
pub const BUCKETS: [f64; 16] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Every statistic of one service.
#[derive(Debug, Default)]
pub struct Metrics {
    keys: RwLock<HashMap<String, KeyStats>>,
    /// Configurations loaded (the first one included).
    pub config_load_success: AtomicU64,
    /// Configurations refused.
    pub config_load_error: AtomicU64,
    /// Requests that got no decision because Redis did not give one.
    pub redis_error: AtomicU64,
    /// Requests refused as malformed or unsupported, or failed otherwise.
    pub service_error: AtomicU64,
    /// Requests over a limit answered `OK` because of `SHADOW_MODE`.
    pub global_shadow_mode: AtomicU64,
    /// `ShouldRateLimit` calls (gRPC and `/json`).
    pub total_requests: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
    latency_sum_ns: AtomicU64,
}

/// The labels of a stats key: envoyproxy/ratelimit's `SanitizeStatName`
/// (`:` and `|` become `_`, the dots of an IPv4 address too), then the
/// first three dot-separated parts as `domain`, `key1`, `key2`.
fn labels_of(stats_key: &str) -> String {
    let mut s: Vec<u8> = stats_key.bytes().map(|b| if b == b':' || b == b'|' { b'_' } else { b }).collect();
    // dotted quads: 1-3 digits, '.', three times, 1-3 digits (leftmost match first)
    let mut i = 0;
    while i < s.len() {
        if let Some(end) = ipv4_at(&s, i) {
            for b in &mut s[i..end] {
                if *b == b'.' {
                    *b = b'_';
                }
            }
            i = end;
        } else {
            i += 1;
        }
    }
    let s = String::from_utf8(s).unwrap_or_default();
    let mut out = String::new();
    for (name, part) in ["domain", "key1", "key2"].iter().zip(s.splitn(4, '.')) {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        for c in part.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out
}

/// The end of a regexp `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` match starting at `i` (greedy, as Go's).
fn ipv4_at(s: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    for group in 0..4 {
        let start = j;
        while j < s.len() && j - start < 3 && s[j].is_ascii_digit() {
            j += 1;
        }
        if j == start {
            return None;
        }
        if group < 3 {
            if j >= s.len() || s[j] != b'.' {
                return None;
            }
            j += 1;
        }
    }
    Some(j)
}

impl Metrics {
    /// The statistics of a service that has loaded its first configuration.
    pub fn new() -> Metrics {
        Metrics { config_load_success: 1.into(), ..Metrics::default() }
    }

    /// Runs `f` on the counters of `stats_key`, created on its first use.
    pub fn with_key(&self, stats_key: &str, f: impl FnOnce(&KeyStats)) {
        {
            let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
            if let Some(k) = keys.get(stats_key) {
                f(k);
                return;
            }
        }
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        let k = keys
            .entry(stats_key.to_owned())
            .or_insert_with(|| KeyStats { labels: labels_of(stats_key), ..KeyStats::default() });
        f(k);
    }

    /// Records one `ShouldRateLimit` call's duration.
    pub fn observe(&self, d: Duration) {
        self.total_requests.fetch_add(1, Relaxed);
        let secs = d.as_secs_f64();
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.buckets[i].fetch_add(1, Relaxed);
                break;
            }
        }
        self.latency_sum_ns.fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// The Prometheus text exposition (version 0.0.4) of every statistic,
    /// with the client's counters `client` ((name, help, value)).
    pub fn render(&self, client: &[(&str, &str, u64)]) -> String {
        let mut out = String::with_capacity(4096);
        self.render_keys(&mut out);
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        counter(
            &mut out,
            "ratelimit_service_config_load_success",
            "Configurations loaded.",
            self.config_load_success.load(Relaxed),
        );
        counter(
            &mut out,
            "ratelimit_service_config_load_error",
            "Configurations refused.",
            self.config_load_error.load(Relaxed),
        );
        self.render_requests(&mut out);
        for (name, help, v) in client {
            counter(&mut out, name, help, *v);
        }
        out
    }

    /// The per-key counters (`ratelimit_service_rate_limit_*`).
    fn render_keys(&self, out: &mut String) {
        // stats keys that share their labels (deeper than key2) are added up, as the mapping does
        let mut per_labels: BTreeMap<&str, [u64; 5]> = BTreeMap::new();
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        for k in keys.values() {
            let e = per_labels.entry(k.labels.as_str()).or_default();
            for (i, c) in [&k.total_hits, &k.over_limit, &k.near_limit, &k.within_limit, &k.shadow_mode].iter().enumerate() {
                e[i] = e[i].saturating_add(c.load(Relaxed));
            }
        }
        let names = [
            ("total_hits", "Hits of requests that matched the limit."),
            ("over_limit", "Hits answered OVER_LIMIT by the limit (shadow mode included)."),
            ("near_limit", "Hits within the limit above NEAR_LIMIT_RATIO of it."),
            ("within_limit", "Hits within the limit."),
            ("shadow_mode", "Hits over a shadow-mode limit, answered OK."),
        ];
        for (i, (name, help)) in names.iter().enumerate() {
            let _ = writeln!(out, "# HELP ratelimit_service_rate_limit_{name} {help}");
            let _ = writeln!(out, "# TYPE ratelimit_service_rate_limit_{name} counter");
            for (labels, v) in &per_labels {
                let _ = writeln!(out, "ratelimit_service_rate_limit_{name}{{{labels}}} {}", v[i]);
            }
        }
    }

    /// The requests' counters: errors, global shadow mode, the total and the
    /// response-time histogram.
    fn render_requests(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP ratelimit_service_should_rate_limit_error Requests answered with an error.\n\
             # TYPE ratelimit_service_should_rate_limit_error counter\n\
             ratelimit_service_should_rate_limit_error{{err_type=\"redis_error\"}} {}\n\
             ratelimit_service_should_rate_limit_error{{err_type=\"service_error\"}} {}",
            self.redis_error.load(Relaxed),
            self.service_error.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ratelimit_service_global_shadow_mode Requests over a limit answered OK because of SHADOW_MODE.\n\
             # TYPE ratelimit_service_global_shadow_mode counter\n\
             ratelimit_service_global_shadow_mode {}",
            self.global_shadow_mode.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ratelimit_service_total_requests ShouldRateLimit calls (gRPC and /json).\n\
             # TYPE ratelimit_service_total_requests counter\n\
             ratelimit_service_total_requests{{grpc_method=\"ShouldRateLimit\"}} {}",
            self.total_requests.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ratelimit_service_response_time_seconds The time of a ShouldRateLimit decision.\n\
             # TYPE ratelimit_service_response_time_seconds histogram"
        );
        let mut cum = 0u64;
        for (i, le) in BUCKETS.iter().enumerate() {
            cum += self.buckets[i].load(Relaxed);
            let _ = writeln!(
                out,
                "ratelimit_service_response_time_seconds_bucket{{grpc_method=\"ShouldRateLimit\",le=\"{le}\"}} {cum}"
            );
        }
        let count = self.total_requests.load(Relaxed);
        let _ = writeln!(
            out,
            "ratelimit_service_response_time_seconds_bucket{{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"}} {count}\n\
             ratelimit_service_response_time_seconds_sum{{grpc_method=\"ShouldRateLimit\"}} {}\n\
             ratelimit_service_response_time_seconds_count{{grpc_method=\"ShouldRateLimit\"}} {count}",
            self.latency_sum_ns.load(Relaxed) as f64 / 1e9
        );
    }
}

/// The hits of an `OK` answer above `ratio` × `limit`: the count went from
/// `after − hits` to `after` (envoyproxy/ratelimit's near-limit rule; the
/// threshold is `floor(limit × ratio)` in 32-bit float, as there).
pub fn near_hits(limit: u64, ratio: f32, after: u64, hits: u64) -> u64 {
    let threshold = (limit as f32 * ratio).floor() as u64;
    if after <= threshold {
        return 0;
    }
    let before = after.saturating_sub(hits);
    after - before.max(threshold)
}
