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
    /// Hits denied from the local over-limit cache (`LOCAL_CACHE_SIZE_IN_BYTES`), without Redis.
    pub over_limit_with_local_cache: AtomicU64,
}

/// The statsd name of the requests' counter.
pub const TOTAL_REQUESTS: &str = "ratelimit_server.ShouldRateLimit.total_requests";
/// The statsd name of the response-time timer (whole milliseconds).
pub const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

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
    /// Response times in whole milliseconds (truncated, as
    /// envoyproxy/ratelimit's timer takes them): the count of each value
    /// up to [`MS_DIRECT`], the rest in a map; statsd's timer lines and a
    /// mapping's histograms are made from these.
    ms: MsCounts,
    /// `domain_not_found`, per domain a request named and no file has.
    domains_not_found: RwLock<BTreeMap<String, AtomicU64>>,
    /// `PROMETHEUS_MAPPER_YAML`'s mapping, parsed on the first scrape.
    mapper: std::sync::OnceLock<Option<crate::mapper::Mapper>>,
}

/// Response times counted per whole millisecond below this, in an array.
pub const MS_DIRECT: usize = 1024;

/// The count of each response time in whole milliseconds.
#[derive(Debug)]
struct MsCounts {
    direct: Box<[AtomicU64]>,
    above: std::sync::Mutex<BTreeMap<u64, u64>>,
}

impl Default for MsCounts {
    fn default() -> MsCounts {
        MsCounts { direct: (0..MS_DIRECT).map(|_| AtomicU64::new(0)).collect(), above: Default::default() }
    }
}

/// envoyproxy/ratelimit's `SanitizeStatName` of a stats key: `:` and `|`
/// become `_`, the dots of an IPv4 address too.
pub fn sanitize(stats_key: &str) -> String {
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
    String::from_utf8(s).unwrap_or_default()
}

/// The labels of a stats key: [`sanitize`]d, then the first three
/// dot-separated parts as `domain`, `key1`, `key2`.
fn labels_of(stats_key: &str) -> String {
    let s = sanitize(stats_key);
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
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        match self.ms.direct.get(ms as usize) {
            Some(c) => {
                c.fetch_add(1, Relaxed);
            }
            None => *self.ms.above.lock().unwrap_or_else(|e| e.into_inner()).entry(ms).or_default() += 1,
        }
    }

    /// Every response time so far, in whole milliseconds: (ms, how many), ascending.
    pub fn response_ms(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = (0..MS_DIRECT as u64)
            .zip(self.ms.direct.iter())
            .map(|(ms, c)| (ms, c.load(Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect();
        out.extend(self.ms.above.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(&ms, &n)| (ms, n)));
        out
    }

    /// Counts a descriptor of `domain`, a domain no configuration file has
    /// (envoyproxy/ratelimit's `domain_not_found`, once per descriptor).
    pub fn domain_not_found(&self, domain: &str, descriptors: u64) {
        {
            let d = self.domains_not_found.read().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = d.get(domain) {
                c.fetch_add(descriptors, Relaxed);
                return;
            }
        }
        let mut d = self.domains_not_found.write().unwrap_or_else(|e| e.into_inner());
        d.entry(domain.to_owned()).or_default().fetch_add(descriptors, Relaxed);
    }

    /// Every counter under its statsd name (without envoyproxy/ratelimit's
    /// `EXTRA_TAGS` suffix), cumulative: `f(name, value)`; zeros included.
    pub fn for_each_counter(&self, mut f: impl FnMut(&str, u64)) {
        let mut name = String::with_capacity(128);
        {
            let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
            for (key, k) in keys.iter() {
                let base = format!("ratelimit.service.rate_limit.{}.", sanitize(key));
                for (suffix, c) in [
                    ("total_hits", &k.total_hits),
                    ("over_limit", &k.over_limit),
                    ("near_limit", &k.near_limit),
                    ("within_limit", &k.within_limit),
                    ("shadow_mode", &k.shadow_mode),
                    ("over_limit_with_local_cache", &k.over_limit_with_local_cache),
                ] {
                    name.clear();
                    name.push_str(&base);
                    name.push_str(suffix);
                    f(&name, c.load(Relaxed));
                }
            }
        }
        {
            let d = self.domains_not_found.read().unwrap_or_else(|e| e.into_inner());
            for (domain, c) in d.iter() {
                f(&format!("ratelimit.service.rate_limit.{}.domain_not_found", sanitize(domain)), c.load(Relaxed));
            }
        }
        for (n, c) in [
            ("ratelimit.service.config_load_success", &self.config_load_success),
            ("ratelimit.service.config_load_error", &self.config_load_error),
            ("ratelimit.service.call.should_rate_limit.redis_error", &self.redis_error),
            ("ratelimit.service.call.should_rate_limit.service_error", &self.service_error),
            ("ratelimit.service.global_shadow_mode", &self.global_shadow_mode),
        ] {
            f(n, c.load(Relaxed));
        }
        f(TOTAL_REQUESTS, self.total_requests.load(Relaxed));
    }

    /// The Prometheus text of every statistic as `settings` say: through
    /// `PROMETHEUS_MAPPER_YAML`'s mapping when set (the statsd names with
    /// `EXTRA_TAGS`' suffix, mapped: [`crate::mapper`]), else
    /// [`render`](Self::render) (in milliseconds with
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`); the client's counters
    /// `client` ((name, help, value)) after them.
    pub fn render_as(&self, settings: &crate::settings::Settings, client: &[(&str, &str, u64)]) -> String {
        let Some((_, text)) = &settings.prometheus_mapper else {
            return self.render_scaled(client, if settings.prometheus_response_time_ms { 1000.0 } else { 1.0 });
        };
        let mapper = self.mapper.get_or_init(|| crate::mapper::Mapper::parse(text).ok());
        let Some(mapper) = mapper else { return self.render(client) }; // checked at startup
        let suffix: String = settings.extra_tags.iter().map(|(k, v)| format!(".__{k}={v}")).collect();
        let mut counters = Vec::new();
        self.for_each_counter(|n, v| counters.push((format!("{n}{suffix}"), v)));
        let mut out = mapper.render(&counters, (&format!("{RESPONSE_TIME}{suffix}"), &self.response_ms()));
        for (name, help, v) in client {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        }
        out
    }

    /// The Prometheus text exposition (version 0.0.4) of every statistic,
    /// with the client's counters `client` ((name, help, value)).
    pub fn render(&self, client: &[(&str, &str, u64)]) -> String {
        self.render_scaled(client, 1.0)
    }

    /// [`render`](Self::render) with the response time's unit `unit` per second.
    fn render_scaled(&self, client: &[(&str, &str, u64)], unit: f64) -> String {
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
        self.render_requests(&mut out, unit);
        for (name, help, v) in client {
            counter(&mut out, name, help, *v);
        }
        out
    }

    /// The per-key counters (`ratelimit_service_rate_limit_*`).
    fn render_keys(&self, out: &mut String) {
        // stats keys that share their labels (deeper than key2) are added up, as the mapping does
        let mut per_labels: BTreeMap<&str, [u64; 6]> = BTreeMap::new();
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        for k in keys.values() {
            let e = per_labels.entry(k.labels.as_str()).or_default();
            let all = [
                &k.total_hits,
                &k.over_limit,
                &k.near_limit,
                &k.within_limit,
                &k.shadow_mode,
                &k.over_limit_with_local_cache,
            ];
            for (i, c) in all.iter().enumerate() {
                e[i] = e[i].saturating_add(c.load(Relaxed));
            }
        }
        let names = [
            ("total_hits", "Hits of requests that matched the limit."),
            ("over_limit", "Hits answered OVER_LIMIT by the limit (shadow mode included)."),
            ("near_limit", "Hits within the limit above NEAR_LIMIT_RATIO of it."),
            ("within_limit", "Hits within the limit."),
            ("shadow_mode", "Hits over a shadow-mode limit, answered OK."),
            ("over_limit_with_local_cache", "Hits denied from the local over-limit cache, without Redis."),
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
    fn render_requests(&self, out: &mut String, unit: f64) {
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
                "ratelimit_service_response_time_seconds_bucket{{grpc_method=\"ShouldRateLimit\",le=\"{}\"}} {cum}",
                le * unit
            );
        }
        let count = self.total_requests.load(Relaxed);
        let _ = writeln!(
            out,
            "ratelimit_service_response_time_seconds_bucket{{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"}} {count}\n\
             ratelimit_service_response_time_seconds_sum{{grpc_method=\"ShouldRateLimit\"}} {}\n\
             ratelimit_service_response_time_seconds_count{{grpc_method=\"ShouldRateLimit\"}} {count}",
            self.latency_sum_ns.load(Relaxed) as f64 / 1e9 * unit
        );
    }
}

/// Where a limit's count stood for one descriptor's hits: `before` them
/// and `after` them (`after − before` = the hits; for a request that took
/// nothing, where the hits would have taken it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// The limit (`requests_per_unit`).
    pub limit: u64,
    /// The count before the hits.
    pub before: u64,
    /// The count after them.
    pub after: u64,
    /// The hits.
    pub hits: u64,
}

/// A decided descriptor's `over_limit`, `near_limit`, `within_limit` and
/// `shadow_mode` counters, split as envoyproxy/ratelimit splits them
/// (`limiter/base_limiter.go`, read for behaviour): over the limit when
/// `after > limit`, the hits up to the limit that were above
/// `floor(limit × ratio)` (32-bit float, as there) near, the rest over; a
/// shadow-mode limit counts its over part in `shadow_mode` too. `over`
/// says whether the answer was over (`after > limit` for a fixed window;
/// the module's answer for the others). `total_hits` is counted apart,
/// before Redis is called ([`Metrics::total_hits`]).
pub fn count_hits(k: &KeyStats, c: Counted, ratio: f32, over: bool, shadow: bool) {
    if c.hits == 0 {
        return;
    }
    let threshold = (c.limit as f32 * ratio).floor() as u64;
    if over {
        // all over when the count was at the limit already (or, for the
        // extension algorithms, when the count does not show the crossing)
        let crossed = c.before < c.limit && c.after > c.limit;
        let over_part = if crossed { c.after - c.limit } else { c.hits };
        k.over_limit.fetch_add(over_part, Relaxed);
        if crossed {
            k.near_limit.fetch_add(c.limit - threshold.max(c.before), Relaxed);
        }
        if shadow {
            k.shadow_mode.fetch_add(over_part, Relaxed);
        }
        return;
    }
    if c.after > threshold {
        k.near_limit.fetch_add(if c.before >= threshold { c.hits } else { c.after - threshold }, Relaxed);
    }
    k.within_limit.fetch_add(c.hits, Relaxed);
}

impl Metrics {
    /// Counts `hits` in `total_hits` of `stats_key`: before Redis is called,
    /// as envoyproxy/ratelimit counts them (a request Redis gives no
    /// decision for is counted too).
    pub fn total_hits(&self, stats_key: &str, hits: u64) {
        self.with_key(stats_key, |k| {
            k.total_hits.fetch_add(hits, Relaxed);
        });
    }
}
