//! Every setting of envoyproxy/ratelimit (the environment variables of its
//! `src/settings/settings.go`; the list, with their types and defaults, is
//! `service/upstream-settings.tsv`) and what this service does with it:
//! read with the same meaning, read with a difference, refused at startup
//! when set to anything but the values it accepts, or accepted without
//! effect for a reason that makes that safe. No name is silently ignored:
//! `tests/service/settings_table.rs` fails when a name of the list has no
//! status here, when a "read" name is not read, or when a refused one is
//! not refused; docs/envoy.md's table is generated from this one.

use crate::gosyntax::{parse_go_duration, FALSE};

/// The type of a variable's value, as envoyproxy/ratelimit parses it
/// (envconfig): a value that does not parse stops its start, and this
/// service's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Any text.
    Str,
    /// Go's `strconv.ParseBool`.
    Bool,
    /// A decimal integer.
    Int,
    /// A Go duration (`time.ParseDuration`).
    Duration,
    /// A decimal number.
    Float,
    /// `a,b,c`.
    List,
    /// `k1:v1,k2:v2`.
    Map,
}

impl Kind {
    /// The Go type's name in `upstream-settings.tsv`.
    pub fn go_type(self) -> &'static [&'static str] {
        match self {
            Kind::Str => &["string"],
            Kind::Bool => &["bool"],
            Kind::Int => &["int", "int64"],
            Kind::Duration => &["duration"],
            Kind::Float => &["float32", "float64"],
            Kind::List => &["[]string"],
            Kind::Map => &["map[string]string"],
        }
    }

    /// Whether `v` parses as this type (empty: the default, always).
    pub fn parses(self, v: &str) -> bool {
        if v.is_empty() {
            return true;
        }
        match self {
            Kind::Str | Kind::List => true,
            Kind::Bool => FALSE.contains(&v) || ["1", "t", "T", "true", "TRUE", "True"].contains(&v),
            Kind::Int => v.parse::<i64>().is_ok(),
            Kind::Duration => parse_go_duration(v.strip_prefix('-').unwrap_or(v)).is_ok(),
            Kind::Float => v.parse::<f64>().is_ok(),
            Kind::Map => v.split(',').all(|kv| kv.split(':').count() == 2),
        }
    }
}

/// The values a refused variable may still have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// Exactly these texts (unset and empty are `""`).
    Values(&'static [&'static str]),
    /// A duration equal to this one (Go syntax), or unset.
    Duration(&'static str),
    /// An integer equal to this one, or unset.
    Int(i64),
    /// `false` as Go's `strconv.ParseBool` reads it, or unset.
    False,
}

impl Accept {
    /// Whether `v` is one of the accepted values.
    pub fn accepts(self, v: &str) -> bool {
        match self {
            Accept::Values(ok) => ok.contains(&v),
            Accept::False => FALSE.contains(&v),
            Accept::Duration(d) => v.is_empty() || parse_go_duration(v).ok() == parse_go_duration(d).ok(),
            Accept::Int(n) => v.is_empty() || v.parse::<i64>().ok() == Some(n),
        }
    }

    /// The accepted values, for the docs.
    pub fn describe(self) -> String {
        match self {
            Accept::Values(ok) => {
                let ok: Vec<String> = ok.iter().filter(|v| !v.is_empty()).map(|v| format!("`{v}`")).collect();
                if ok.is_empty() {
                    "unset or empty".to_owned()
                } else {
                    format!("unset or {}", ok.join(", "))
                }
            }
            Accept::False => "unset or false".to_owned(),
            Accept::Duration(d) => format!("unset or `{d}`"),
            Accept::Int(n) => format!("unset or `{n}`"),
        }
    }
}

/// What this service does with one of envoyproxy/ratelimit's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Read, with the same meaning and default.
    Same,
    /// Read; how it differs.
    Differs(&'static str),
    /// Refused at startup (exit 2, naming it) unless [`Accept`]ed; why.
    Refused(Accept, &'static str),
    /// Accepted (its value must parse as its type, as there) and without
    /// effect; why that is safe.
    Accepted(Kind, &'static str),
}

const PERSECOND: &str = "read by envoyproxy/ratelimit only with `REDIS_PERSECOND=true`, which is refused";
const MEMCACHE: &str = "read by envoyproxy/ratelimit only with `BACKEND_TYPE=memcache`, which is refused";
const POOL: &str = "no pool: one multiplexed connection carries every request (redis-rs writes each \
     call as it comes, and the replies return in order), so there is no pool size to choose";

use Accept as A;
use Kind as K;
use Status::{Accepted, Differs, Refused, Same};

/// Every setting of envoyproxy/ratelimit, in `settings.go`'s order, and its status here.
pub const UPSTREAM: &[(&str, Status)] = &[
    ("HOST", Same),
    ("PORT", Same),
    ("DEBUG_HOST", Same),
    (
        "DEBUG_PORT",
        Differs("bound at startup as there (6070 unless set; 0: a free port), but a port that cannot be bound stops the start, naming `DEBUG_PORT` (upstream logs it and serves without); `/rlconfig` lists the limits sorted, `/stats` this service's counters (upstream's prints Go's expvar), no `/debug/pprof`"),
    ),
    ("GRPC_UDS", Differs("the gRPC listener on that Unix socket instead of `GRPC_HOST:GRPC_PORT`; TLS over the socket is refused at startup")),
    ("GRPC_HOST", Same),
    ("GRPC_PORT", Same),
    ("GRPC_MAX_CONNECTION_AGE", Differs("GOAWAY at exactly that age, without grpc-go's ±10 % jitter")),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", Same),
    ("GRPC_SERVER_USE_TLS", Same),
    ("GRPC_SERVER_TLS_CERT", Differs("read at startup only: upstream reloads the files when they change; here a restart rotates them")),
    ("GRPC_SERVER_TLS_KEY", Differs("read at startup only: upstream reloads the files when they change; here a restart rotates them")),
    ("GRPC_CLIENT_TLS_CACERT", Same),
    ("GRPC_CLIENT_TLS_SAN", Differs("needs `GRPC_CLIENT_TLS_CACERT` (refused at startup without it; upstream checks nothing then)")),
    (
        "LOG_LEVEL",
        Differs("logrus's names in any case, `WARN` unless set, an unknown one refused at startup as there; `trace` reads as `debug` and `panic` as `fatal` (no line here has either level)"),
    ),
    (
        "LOG_FORMAT",
        Differs("`text` (logrus's `time=… level=… msg=…`) or `json` (upstream's fields: `@message`, `@timestamp`, `level`), any case; anything else is refused at startup, where upstream writes text; times in UTC"),
    ),
    ("CONFIG_TYPE", Same),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", Differs("serves at once; until a configuration loads every domain is unknown (no limit applies), where upstream answers each request with the error `no rate limit configuration loaded` (Envoy allows both unless `failure_mode_deny`)")),
    ("CONFIG_GRPC_XDS_NODE_ID", Same),
    ("CONFIG_GRPC_XDS_NODE_METADATA", Same),
    ("CONFIG_GRPC_XDS_SERVER_URL", Differs("`host:port` (or `dns:///host:port`), as Envoy Gateway sets it; gRPC's other target schemes are refused at startup")),
    ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Differs("the wait (±50%) between dials until the server answers; a stream that ends waits `XDS_CLIENT_BACKOFF_*`")),
    ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Same),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", Differs("needs `CONFIG_GRPC_XDS_SERVER_TLS_CACERT` (refused at startup without it: the system's roots are not read)")),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Same),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Same),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Same),
    ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", Same),
    ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", Same),
    ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", Same),
    ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", Same),
    ("XDS_CLIENT_BACKOFF_JITTER", Same),
    ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", Same),
    ("USE_DOG_STATSD", Differs("DogStatsD lines over UDP to `STATSD_HOST:STATSD_PORT`, as there, without datadog-go's own telemetry metrics (`datadog.dogstatsd.client.*`)")),
    ("USE_DOG_STATSD_MOGRIFIERS", Same),
    (
        "USE_STATSD",
        Differs("true unless set, as there (statsd over TCP to `STATSD_HOST:STATSD_PORT`; gostats's `STATSD_PROTOCOL=udp` for UDP); with no sink at all, envoyproxy/ratelimit logs its statistics to stdout, this service writes none"),
    ),
    ("STATSD_HOST", Same),
    ("STATSD_PORT", Same),
    ("EXTRA_TAGS", Same),
    ("STATS_FLUSH_INTERVAL", Differs("how often the statsd counters are sent, as there (the response-time lines go with them); `/metrics` shows every counter live rather than as of the last flush")),
    ("DISABLE_STATS", Same),
    ("USE_PROMETHEUS", Same),
    ("PROMETHEUS_ADDR", Same),
    ("PROMETHEUS_PATH", Same),
    ("PROMETHEUS_MAPPER_YAML", Differs("statsd-exporter's mapping rules, the subset Envoy Gateway's file and envoyproxy/ratelimit's own use (any other key refused at startup, naming it); a summary has no quantiles")),
    ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", Same),
    ("RUNTIME_ROOT", Same),
    ("RUNTIME_SUBDIRECTORY", Same),
    ("RUNTIME_APPDIRECTORY", Same),
    ("RUNTIME_IGNOREDOTFILES", Same),
    (
        "RUNTIME_WATCH_ROOT",
        Differs("read (a boolean) either way: the directory is polled through its path every `RUNTIME_POLL_INTERVAL`, which sees a file change and a swap of the root's symlink alike"),
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        Accepted(K::Int, "the jitter spreads envoyproxy/ratelimit's key expiries; here the module expires each key at its window's end, and no decision reads an expired key"),
    ),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        Differs("a key is marked when its remaining reaches 0 (there: when its count went over), until its window's end or, for the other algorithms, its retry time; a request denied from the cache takes nothing from its other descriptors, which are not read (docs/envoy.md, The local over-limit cache)"),
    ),
    ("NEAR_LIMIT_RATIO", Same),
    ("CACHE_KEY_PREFIX", Differs("prepended to keys of another shape (docs/envoy.md, Key layout); must not contain `{` or `}`")),
    ("BACKEND_TYPE", Refused(A::Values(&["", "redis"]), "only Redis (with the module): memcache is not built")),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        Accepted(K::Bool, "a denied request never increments a key here (one atomic `RL.MULTI`): as if it were true, always"),
    ),
    ("LIMIT_RESPONSE_HEADERS_ENABLED", Same),
    ("LIMIT_LIMIT_HEADER", Same),
    ("LIMIT_REMAINING_HEADER", Same),
    ("LIMIT_RESET_HEADER", Same),
    ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Same),
    ("REDIS_SOCKET_TYPE", Same),
    ("REDIS_TYPE", Same),
    ("REDIS_URL", Same),
    ("REDIS_POOL_SIZE", Accepted(K::Int, POOL)),
    ("REDIS_AUTH", Same),
    ("REDIS_TLS", Same),
    ("REDIS_TLS_CLIENT_CERT", Differs("with `REDIS_TLS_CLIENT_KEY`, both or neither (one alone is refused at startup; there it is ignored)")),
    ("REDIS_TLS_CLIENT_KEY", Differs("with `REDIS_TLS_CLIENT_CERT`, both or neither (one alone is refused at startup; there it is ignored)")),
    ("REDIS_TLS_CACERT", Differs("replaces the system's roots (there it is added to them)")),
    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Differs("refused with `REDIS_TYPE=sentinel`")),
    (
        "REDIS_PIPELINE_WINDOW",
        Accepted(K::Duration, "a flush window batches the writes of several calls; the multiplexed connection already writes each call as it comes, one call per request"),
    ),
    ("REDIS_PIPELINE_LIMIT", Accepted(K::Int, "deprecated and unused by envoyproxy/ratelimit itself")),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        Accepted(K::Int, "the slot groups of one request always run in parallel (docs/envoy.md, Across cluster slots)"),
    ),
    ("REDIS_PERSECOND", Refused(A::False, "a second Redis for per-second limits is not built")),
    ("REDIS_PERSECOND_SOCKET_TYPE", Accepted(K::Str, PERSECOND)),
    ("REDIS_PERSECOND_TYPE", Accepted(K::Str, PERSECOND)),
    ("REDIS_PERSECOND_URL", Accepted(K::Str, PERSECOND)),
    ("REDIS_PERSECOND_POOL_SIZE", Accepted(K::Int, PERSECOND)),
    ("REDIS_PERSECOND_AUTH", Accepted(K::Str, PERSECOND)),
    ("REDIS_PERSECOND_TLS", Differs("read (a boolean) and without effect: `REDIS_PERSECOND` is refused")),
    ("REDIS_SENTINEL_AUTH", Same),
    ("REDIS_PERSECOND_SENTINEL_AUTH", Accepted(K::Str, PERSECOND)),
    ("REDIS_PERSECOND_PIPELINE_WINDOW", Accepted(K::Duration, PERSECOND)),
    ("REDIS_PERSECOND_PIPELINE_LIMIT", Accepted(K::Int, PERSECOND)),
    ("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", Accepted(K::Int, PERSECOND)),
    ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Same),
    ("REDIS_TIMEOUT", Same),
    ("REDIS_PERSECOND_TIMEOUT", Accepted(K::Duration, PERSECOND)),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        Refused(A::Values(&["", "WAIT", "wait", "Wait"]), "no pool: requests share one multiplexed connection, as `WAIT`; `CREATE` and `ERROR` (which envoyproxy/ratelimit refuses too) are refused"),
    ),
    ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", Accepted(K::Str, PERSECOND)),
    ("REDIS_STARTUP_INITIAL_INTERVAL", Differs("the same backoff (each wait 1.5 times the last), without upstream's ±50 % jitter")),
    ("REDIS_STARTUP_MAX_INTERVAL", Differs("the same backoff (each wait 1.5 times the last), without upstream's ±50 % jitter")),
    ("REDIS_STARTUP_MAX_ELAPSED_TIME", Differs("the same backoff (each wait 1.5 times the last), without upstream's ±50 % jitter")),
    ("MEMCACHE_HOST_PORT", Refused(A::Values(&[""]), "memcache is not built")),
    ("MEMCACHE_MAX_IDLE_CONNS", Accepted(K::Int, MEMCACHE)),
    ("MEMCACHE_SRV", Refused(A::Values(&[""]), "memcache is not built")),
    ("MEMCACHE_SRV_REFRESH", Accepted(K::Duration, MEMCACHE)),
    ("MEMCACHE_TLS", Accepted(K::Bool, MEMCACHE)),
    ("MEMCACHE_TLS_CLIENT_CERT", Accepted(K::Str, MEMCACHE)),
    ("MEMCACHE_TLS_CLIENT_KEY", Accepted(K::Str, MEMCACHE)),
    ("MEMCACHE_TLS_CACERT", Accepted(K::Str, MEMCACHE)),
    ("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", Accepted(K::Bool, MEMCACHE)),
    ("SHADOW_MODE", Same),
    ("QUOTA_MODE", Differs("the same answers and statistics; a request denied because its quota descriptors are all over the limit takes nothing, unless it has two or more of them beside other limits (docs/envoy.md, \"Quota mode\")")),
    ("RESPONSE_DYNAMIC_METADATA", Differs("the same fields; a limit's `metadata` is given also for `detailed_metric` and `value_to_metric` limits, which envoyproxy/ratelimit rebuilds without it")),
    ("MERGE_DOMAIN_CONFIG", Same),
    ("TRACING_ENABLED", Differs("the spans of gRPC `ShouldRateLimit` as upstream's, over OTLP; `POST /json` is not traced; TLS to the collector takes its CA from `OTEL_EXPORTER_OTLP_CERTIFICATE` (the system's roots are not read); an `OTEL_` variable not read is refused (docs/envoy.md, Tracing)")),
    ("TRACING_SERVICE_NAME", Same),
    ("TRACING_SERVICE_NAMESPACE", Same),
    ("TRACING_SERVICE_INSTANCE_ID", Same),
    ("TRACING_EXPORTER_PROTOCOL", Same),
    ("TRACING_SAMPLING_RATE", Same),
];

/// The status of one of envoyproxy/ratelimit's settings (`None`: not one of them).
pub fn status(name: &str) -> Option<Status> {
    UPSTREAM.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// Checks the refused and the accepted variables of `env`: a refused one
/// set to a value it does not accept, or an accepted one whose value does
/// not parse, is the error (the first in the table's order). Otherwise the
/// notices of the accepted ones set, each with why it has no effect.
pub fn check(env: &std::collections::HashMap<String, String>) -> Result<Vec<String>, String> {
    let mut notices = Vec::new();
    for (name, st) in UPSTREAM {
        let Some(v) = env.get(*name) else { continue };
        match st {
            Refused(ok, why) if !ok.accepts(v) => {
                return Err(format!(
                    "{name}={v:?} is not supported by this service ({why}; accepted: {}; see docs/envoy.md)",
                    ok.describe()
                ));
            }
            Accepted(kind, why) => {
                if !kind.parses(v) {
                    return Err(format!("{name}={v:?}: not a {} (as envoyproxy/ratelimit reads it)", kind.go_type()[0]));
                }
                if !v.is_empty() {
                    notices.push(format!("{name}={v:?} accepted without effect: {why}"));
                }
            }
            _ => {}
        }
    }
    Ok(notices)
}

/// One row of docs/envoy.md's table: what this service does.
pub fn describe(st: Status) -> String {
    match st {
        Same => "read, same meaning".to_owned(),
        Differs(how) => format!("read, differs: {how}"),
        Refused(ok, why) => format!("refused at startup unless {}: {why}", ok.describe()),
        Accepted(_, why) => format!("accepted without effect: {why}"),
    }
}
