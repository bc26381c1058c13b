//! The environment variables of envoyproxy/ratelimit (its
//! `src/settings/settings.go`), read with the same names and defaults where
//! this service supports them. A variable this service does not support is
//! refused at startup when it asks for something other than the default,
//! or accepted without effect where that is safe, never silently ignored:
//! [`crate::upstream_settings`] has the status of every one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::de::value::MapDeserializer;
use serde::Deserialize;

use crate::gosyntax::parse_bool;
pub use crate::gosyntax::parse_go_duration;

/// How to reach Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisAddr {
    /// `REDIS_SOCKET_TYPE=tcp`: `host:port`.
    Tcp(String),
    /// `REDIS_SOCKET_TYPE=unix`: a socket path.
    Unix(String),
}

/// `REDIS_TYPE` and the addresses of `REDIS_URL` (envoyproxy/ratelimit's syntax).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisType {
    /// `single`: the one address of [`Settings::redis`].
    Single,
    /// `sentinel`: `REDIS_URL=mastername,host:port,host:port…` (the sentinels; TCP).
    Sentinel {
        /// The name the sentinels monitor.
        master: String,
        /// The sentinels' `host:port`.
        sentinels: Vec<String>,
    },
    /// `cluster`: `REDIS_URL=host:port,host:port…` (seed nodes; TCP).
    Cluster {
        /// The seed nodes' `host:port`.
        nodes: Vec<String>,
    },
}

/// What a decision is when Redis is unavailable (no reply within
/// `REDIS_TIMEOUT`, or the client's breaker open): `PANIC_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PanicMode {
    /// `error` (default): gRPC `UNAVAILABLE` (`/json`: 400); Envoy's `failure_mode_deny` decides.
    Error,
    /// `local`: the client's panic limits: each descriptor limited in this
    /// process at its own rate divided by `PANIC_INSTANCES`.
    Local(u64),
    /// `allow`: every descriptor `OK` (fail open).
    Allow,
    /// `deny`: every limited descriptor `OVER_LIMIT` (fail closed).
    Deny,
}

/// `REDIS_TLS=true`: TLS to the Redis servers (and to the sentinels), with
/// the files of its companions read and checked at startup.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTls {
    /// `REDIS_TLS_CACERT`: the PEM of the CA certificates the servers'
    /// certificates must chain to. They replace the system's roots
    /// (envoyproxy/ratelimit adds them to the system's pool); without it,
    /// the system's roots.
    pub ca: Option<Vec<u8>>,
    /// `REDIS_TLS_CLIENT_CERT` and `REDIS_TLS_CLIENT_KEY`: this client's
    /// certificate (chain) and private key in PEM, for servers that verify
    /// their clients (`tls-auth-clients`).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
    /// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`: the server's certificate
    /// must still chain to a trusted CA, but need not name the host.
    pub skip_hostname_verification: bool,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // never the key
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.as_ref().map(|c| c.len()))
            .field("client", &self.client.as_ref().map(|_| "<cert and key>"))
            .field("skip_hostname_verification", &self.skip_hostname_verification)
            .finish()
    }
}

impl RedisTls {
    /// The certificates in redis-rs's form.
    pub fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig { client_cert: cert.clone(), client_key: key.clone() }),
            root_cert: self.ca.clone(),
        }
    }

    /// Reads `REDIS_TLS_*` when `REDIS_TLS` is true, and checks what it
    /// read: every file readable, PEM, the key that of the certificate.
    fn from_vars(vars: &Vars, redis_type: &RedisType) -> Result<Option<RedisTls>, String> {
        // read for parity with envoyproxy/ratelimit (a boolean); the
        // per-second Redis it is for is refused (REDIS_PERSECOND)
        flag("REDIS_PERSECOND_TLS", &vars.redis_persecond_tls)?;
        let skip = flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", &vars.redis_tls_skip_hostname_verification)?;
        if !flag("REDIS_TLS", &vars.redis_tls)? {
            return Ok(None);
        }
        if skip && matches!(redis_type, RedisType::Sentinel { .. }) {
            return Err("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true is not supported with REDIS_TYPE=sentinel \
                 (redis-rs verifies the primary's host name); give the servers certificates naming the \
                 addresses the sentinels announce (see service/README.md)"
                .into());
        }
        let read = |k: &str, path: &str| -> Result<Option<(String, Vec<u8>)>, String> {
            match path {
                "" => Ok(None),
                path => match std::fs::read(path) {
                    Ok(b) => Ok(Some((path.to_owned(), b))),
                    Err(e) => Err(format!("{k}={path:?}: cannot read it: {e}")),
                },
            }
        };
        let certs = |k: &str, path: &str, pem: &[u8]| -> Result<Vec<CertificateDer<'static>>, String> {
            let certs = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{k}={path:?}: not PEM certificates: {e}"))?;
            if certs.is_empty() {
                return Err(format!("{k}={path:?}: no PEM certificate (BEGIN CERTIFICATE) in it"));
            }
            Ok(certs)
        };
        let mut roots = rustls::RootCertStore::empty();
        let ca = match read("REDIS_TLS_CACERT", &vars.redis_tls_cacert)? {
            None => None,
            Some((path, pem)) => {
                for c in certs("REDIS_TLS_CACERT", &path, &pem)? {
                    roots.add(c).map_err(|e| format!("REDIS_TLS_CACERT={path:?}: {e}"))?;
                }
                Some(pem)
            }
        };
        let client = match (
            read("REDIS_TLS_CLIENT_CERT", &vars.redis_tls_client_cert)?,
            read("REDIS_TLS_CLIENT_KEY", &vars.redis_tls_client_key)?,
        ) {
            (None, None) => None,
            (Some((cert_path, cert)), Some((key_path, key))) => {
                let chain = certs("REDIS_TLS_CLIENT_CERT", &cert_path, &cert)?;
                let der = PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
                    format!("REDIS_TLS_CLIENT_KEY={key_path:?}: no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}")
                })?;
                // the key must be usable and be the certificate's
                rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(roots)
                    .with_client_auth_cert(chain, der)
                    .map_err(|e| {
                        format!("REDIS_TLS_CLIENT_CERT={cert_path:?} with REDIS_TLS_CLIENT_KEY={key_path:?}: {e}")
                    })?;
                Some((cert, key))
            }
            _ => return Err("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together: set both or neither".into()),
        };
        Ok(Some(RedisTls { ca, client, skip_hostname_verification: skip }))
    }
}

/// The settings of one service process.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `HOST` (HTTP: `/json`, `/healthcheck`), default `0.0.0.0`.
    pub host: String,
    /// `PORT`, default 8080.
    pub port: u16,
    /// `GRPC_HOST`, default `0.0.0.0`.
    pub grpc_host: String,
    /// `GRPC_PORT`, default 8081.
    pub grpc_port: u16,
    /// `REDIS_SOCKET_TYPE` + `REDIS_URL` (default unix, `/var/run/nutcracker/ratelimit.sock`).
    pub redis: RedisAddr,
    /// `REDIS_TYPE`: single, sentinel or cluster (with their addresses).
    pub redis_type: RedisType,
    /// `REDIS_AUTH`: `password` or `user:password`.
    pub redis_auth: Option<(Option<String>, String)>,
    /// `REDIS_SENTINEL_AUTH`: the sentinels' `password` or `user:password`.
    pub redis_sentinel_auth: Option<(Option<String>, String)>,
    /// `REDIS_TLS=true` (+ `REDIS_TLS_CACERT`, `REDIS_TLS_CLIENT_CERT`,
    /// `REDIS_TLS_CLIENT_KEY`, `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`).
    pub redis_tls: Option<RedisTls>,
    /// `PANIC_MODE` (+ `PANIC_INSTANCES`): the answer while Redis is unavailable.
    pub panic_mode: PanicMode,
    /// `REDIS_TIMEOUT` (Go duration), default 10s: the bound of every Redis call.
    pub redis_timeout: Duration,
    /// `CACHE_KEY_PREFIX`, default empty.
    pub cache_key_prefix: String,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED`.
    pub headers_enabled: bool,
    /// `LIMIT_LIMIT_HEADER`, default `RateLimit-Limit`.
    pub header_limit: String,
    /// `LIMIT_REMAINING_HEADER`, default `RateLimit-Remaining`.
    pub header_remaining: String,
    /// `LIMIT_RESET_HEADER`, default `RateLimit-Reset`.
    pub header_reset: String,
    /// `SHADOW_MODE`: every over-limit answer becomes OK overall.
    pub shadow_mode: bool,
    /// `QUOTA_MODE`: every descriptor a quota one (docs/envoy.md, "Quota mode").
    pub quota_mode: bool,
    /// `RESPONSE_DYNAMIC_METADATA`: the response's dynamic metadata (crate::dynamic_metadata).
    pub response_dynamic_metadata: bool,
    /// `USAGE_REPORT_DOMAINS` (this service's own; `ai-gateway-quota` unless
    /// set, `*` every domain, empty with `none`): the domains in which a
    /// descriptor's own `hits_addend` above 0 is a usage report, taken as a
    /// debit (docs/envoy.md, "Usage reports").
    pub usage_report_domains: Vec<String>,
    /// `NEAR_LIMIT_RATIO`, default 0.8 (metrics only; validated, kept for them).
    pub near_limit_ratio: f32,
    /// `LOCAL_CACHE_SIZE_IN_BYTES`, default 0 (no cache): the memory of
    /// the keys known over their limit ([`crate::overcache`]).
    pub local_cache_bytes: u64,
    /// `RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`/`RUNTIME_APPDIRECTORY`: the directory of the YAML files.
    pub config_dir: PathBuf,
    /// `RUNTIME_IGNOREDOTFILES`: skip files whose name starts with `.`.
    pub ignore_dot_files: bool,
    /// `MERGE_DOMAIN_CONFIG`: a domain in several files is merged.
    pub merge_domains: bool,
    /// How often the configuration directory is checked for changes
    /// (`RUNTIME_POLL_INTERVAL`, this service's own; default 1s).
    pub poll_interval: Duration,
    /// `USE_PROMETHEUS=true`: the address (`PROMETHEUS_ADDR`, default
    /// `:9090`, Go's `host:port` with an empty host for every address) and
    /// the path (`PROMETHEUS_PATH`, default `/metrics`) of the metrics listener.
    pub prometheus: Option<(String, String)>,
    /// The statistics' sink (`USE_STATSD`, `USE_DOG_STATSD`,
    /// `USE_PROMETHEUS`, `DISABLE_STATS`; one at most, as there).
    pub stats_sink: StatsSink,
    /// `EXTRA_TAGS` (`k1:v1,k2:v2`): tags of every statistic, sorted by
    /// name, their values with `.`, `:` and `|` made `_` (gostats's rules).
    pub extra_tags: Vec<(String, String)>,
    /// `STATS_FLUSH_INTERVAL` (Go duration, default 10s): how often the
    /// statsd counters are sent.
    pub stats_flush_interval: Duration,
    /// `PROMETHEUS_MAPPER_YAML`: the statsd-exporter mapping file's path
    /// and text, read (and checked) at startup.
    pub prometheus_mapper: Option<(String, String)>,
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`: the response-time
    /// histogram in milliseconds.
    pub prometheus_response_time_ms: bool,
    /// envoyproxy/ratelimit's variables set here that are accepted without
    /// effect, each with why (`upstream_settings`): printed at startup.
    pub notices: Vec<String>,
    /// `GRPC_SERVER_USE_TLS=true` (+ `GRPC_SERVER_TLS_CERT`, `_KEY`,
    /// `GRPC_CLIENT_TLS_CACERT`, `GRPC_CLIENT_TLS_SAN`; Envoy Gateway's
    /// `GRPC_SERVER_TLS_CA_CERT` checked, without effect as upstream).
    pub grpc_tls: Option<crate::tls::GrpcTls>,
    /// `GRPC_UDS`: the gRPC listener on this Unix socket instead of
    /// `GRPC_HOST:GRPC_PORT`.
    pub grpc_uds: Option<PathBuf>,
    /// `REDIS_STARTUP_INITIAL_INTERVAL` (1s), `REDIS_STARTUP_MAX_INTERVAL`
    /// (30s), `REDIS_STARTUP_MAX_ELAPSED_TIME` (0: retry for ever): the
    /// backoff of the first connection to Redis.
    pub redis_startup: (Duration, Duration, Duration),
    /// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`: the health checks fail while
    /// Redis does not answer.
    pub redis_health_check: bool,
    /// `GRPC_MAX_CONNECTION_AGE` (24h) and `GRPC_MAX_CONNECTION_AGE_GRACE`
    /// (1h): a gRPC connection gets GOAWAY at that age, and is closed after the grace.
    pub grpc_max_connection_age: (Duration, Duration),
    /// `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration from an xDS server
    /// (`CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*`); `None` (`FILE`): the files.
    pub xds: Option<crate::xds_settings::XdsSettings>,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: serve before a first
    /// configuration has loaded (every domain unknown until then).
    pub force_start: bool,
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`: both health checks fail
    /// while the live configuration has no domain.
    pub healthy_with_config: bool,
    /// `LOG_LEVEL` (`WARN`) and `LOG_FORMAT` (`text`): the process's log.
    pub log: crate::logger::LogSettings,
    /// `DEBUG_HOST:DEBUG_PORT` (`0.0.0.0:6070`): the debug listener.
    pub debug_addr: String,
    /// `TRACING_ENABLED=true`: the spans' settings ([`crate::trace`]); `None`: no tracing.
    pub tracing: Option<crate::otlp_settings::TraceSettings>,
}

/// Where the statistics go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatsSink {
    /// Nowhere: `DISABLE_STATS=true`, or every sink turned off.
    None,
    /// `USE_STATSD` (true unless set false): statsd lines to
    /// `STATSD_HOST:STATSD_PORT` (`localhost:8125`) over `STATSD_PROTOCOL`
    /// (gostats's variable: `tcp`, the default, or `udp`).
    Statsd {
        /// `host:port`.
        addr: String,
        /// UDP rather than TCP.
        udp: bool,
    },
    /// `USE_DOG_STATSD=true`: DogStatsD lines (tags after `|#`) over UDP to
    /// `STATSD_HOST:STATSD_PORT`, renamed by `USE_DOG_STATSD_MOGRIFIERS`.
    DogStatsd {
        /// `host:port`.
        addr: String,
        /// The mogrifiers, in the order named.
        mogrifiers: Vec<Mogrifier>,
    },
    /// `USE_PROMETHEUS=true`: [`Settings::prometheus`].
    Prometheus,
}

/// One DogStatsD mogrifier: `DOG_STATSD_MOGRIFIER_<NAME>_PATTERN` (a
/// regular expression), `_NAME` and `_TAGS` (`k:v,...`), where `$1`…
/// stand for the pattern's groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mogrifier {
    /// The pattern (checked to compile at startup).
    pub pattern: String,
    /// The new name.
    pub name: String,
    /// The tags (name, value).
    pub tags: Vec<(String, String)>,
}

/// An envconfig map (`k1:v1,k2:v2`): each pair exactly one `:`.
fn go_map(name: &str, v: &str) -> Result<Vec<(String, String)>, String> {
    if v.is_empty() {
        return Ok(Vec::new());
    }
    v.split(',')
        .map(|kv| match kv.split(':').collect::<Vec<_>>()[..] {
            [k, v] => Ok((k.to_owned(), v.to_owned())),
            _ => Err(format!("{name}={v:?}: key:value pairs separated by commas ({kv:?})")),
        })
        .collect()
}

/// `USE_STATSD`, `USE_DOG_STATSD` (+ mogrifiers), `USE_PROMETHEUS`,
/// `DISABLE_STATS`: the one sink, as envoyproxy/ratelimit's runner picks it.
fn stats_sink(vars: &Vars, env: &HashMap<String, String>) -> Result<StatsSink, String> {
    let use_statsd = match vars.use_statsd.as_str() {
        "" => true,
        v => parse_bool("USE_STATSD", v)?,
    };
    let dog = flag("USE_DOG_STATSD", &vars.use_dog_statsd)?;
    let prom = flag("USE_PROMETHEUS", &vars.use_prometheus)?;
    let port = port("STATSD_PORT", &vars.statsd_port, 8125)?;
    let addr = format!("{}:{port}", or(&vars.statsd_host, "localhost"));
    let udp = match or(&vars.statsd_protocol, "tcp").as_str() {
        "tcp" | "tcp4" | "tcp6" => false,
        "udp" | "udp4" | "udp6" => true,
        other => return Err(format!("STATSD_PROTOCOL={other:?}: tcp or udp")),
    };
    if flag("DISABLE_STATS", &vars.disable_stats)? {
        return Ok(StatsSink::None);
    }
    if (dog && (use_statsd || prom)) || (use_statsd && prom) {
        return Err("unable to use more than one stats sink at the same time. Set one of USE_DOG_STATSD, USE_STATSD, \
                    USE_PROMETHEUS (USE_STATSD is true unless set to false)"
            .into());
    }
    if dog {
        let mut mogrifiers = Vec::new();
        for m in vars.use_dog_statsd_mogrifiers.split(',').filter(|m| !m.is_empty()) {
            let get = |part: &str| env.get(&format!("DOG_STATSD_MOGRIFIER_{m}_{part}")).cloned().unwrap_or_default();
            let (pattern, name) = (get("PATTERN"), get("NAME"));
            if pattern.is_empty() {
                return Err(format!("no PATTERN specified for mogrifier {m} (DOG_STATSD_MOGRIFIER_{m}_PATTERN)"));
            }
            regex::Regex::new(&pattern).map_err(|e| format!("DOG_STATSD_MOGRIFIER_{m}_PATTERN: {e}"))?;
            if name.is_empty() {
                return Err(format!("no NAME specified for mogrifier {m} (DOG_STATSD_MOGRIFIER_{m}_NAME)"));
            }
            let tags = go_map(&format!("DOG_STATSD_MOGRIFIER_{m}_TAGS"), &get("TAGS"))?;
            if let Some((k, v)) = tags.iter().find(|(k, v)| k.is_empty() || v.is_empty()) {
                return Err(format!("DOG_STATSD_MOGRIFIER_{m}_TAGS: tag {k:?}:{v:?} needs a name and a value"));
            }
            mogrifiers.push(Mogrifier { pattern, name, tags });
        }
        return Ok(StatsSink::DogStatsd { addr, mogrifiers });
    }
    Ok(if use_statsd {
        StatsSink::Statsd { addr, udp }
    } else if prom {
        StatsSink::Prometheus
    } else {
        StatsSink::None
    })
}

/// A boolean variable: unset or empty, false.
fn flag(name: &str, v: &str) -> Result<bool, String> {
    if v.is_empty() {
        return Ok(false);
    }
    parse_bool(name, v)
}

/// The variables read, by their names (envoyproxy/ratelimit's, and
/// `RUNTIME_POLL_INTERVAL`): the one table of what a process reads. Unset
/// and empty are the same, the default; [`Vars::settings`] checks and
/// types them, in a fixed order (the first error is the one answered).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "SCREAMING_SNAKE_CASE")]
struct Vars {
    host: String,
    port: String,
    grpc_host: String,
    grpc_port: String,
    redis_url: String,
    redis_type: String,
    redis_socket_type: String,
    redis_auth: String,
    redis_sentinel_auth: String,
    redis_tls: String,
    redis_persecond_tls: String,
    redis_tls_skip_hostname_verification: String,
    redis_tls_cacert: String,
    redis_tls_client_cert: String,
    redis_tls_client_key: String,
    panic_mode: String,
    panic_instances: String,
    redis_timeout: String,
    near_limit_ratio: String,
    local_cache_size_in_bytes: String,
    cache_key_prefix: String,
    limit_response_headers_enabled: String,
    limit_limit_header: String,
    limit_remaining_header: String,
    limit_reset_header: String,
    shadow_mode: String,
    quota_mode: String,
    response_dynamic_metadata: String,
    usage_report_domains: String,
    runtime_root: String,
    runtime_subdirectory: String,
    runtime_appdirectory: String,
    runtime_watch_root: String,
    runtime_poll_interval: String,
    runtime_ignoredotfiles: String,
    merge_domain_config: String,
    use_prometheus: String,
    prometheus_addr: String,
    prometheus_path: String,
    prometheus_mapper_yaml: String,
    prometheus_response_time_as_milliseconds: String,
    use_statsd: String,
    statsd_host: String,
    statsd_port: String,
    /// gostats's own variable (envoyproxy/ratelimit's statsd client reads it)
    statsd_protocol: String,
    use_dog_statsd: String,
    use_dog_statsd_mogrifiers: String,
    extra_tags: String,
    stats_flush_interval: String,
    disable_stats: String,
    grpc_server_use_tls: String,
    grpc_server_tls_cert: String,
    grpc_server_tls_key: String,
    grpc_client_tls_cacert: String,
    grpc_client_tls_san: String,
    grpc_server_tls_ca_cert: String,
    grpc_uds: String,
    redis_startup_initial_interval: String,
    redis_startup_max_interval: String,
    redis_startup_max_elapsed_time: String,
    redis_health_check_active_connection: String,
    healthy_with_at_least_one_config_loaded: String,
    grpc_max_connection_age: String,
    grpc_max_connection_age_grace: String,
    config_type: String,
    force_start_without_initial_config: String,
    config_grpc_xds_node_id: String,
    config_grpc_xds_node_metadata: String,
    config_grpc_xds_server_url: String,
    config_grpc_xds_server_connect_retry_interval: String,
    config_grpc_xds_client_additional_headers: String,
    config_grpc_xds_server_use_tls: String,
    config_grpc_xds_client_tls_cert: String,
    config_grpc_xds_client_tls_key: String,
    config_grpc_xds_server_tls_cacert: String,
    config_grpc_xds_server_tls_san: String,
    xds_client_backoff_initial_interval: String,
    xds_client_backoff_max_interval: String,
    xds_client_backoff_random_factor: String,
    xds_client_backoff_jitter: String,
    xds_client_max_msg_size_in_bytes: String,
    log_level: String,
    log_format: String,
    debug_host: String,
    debug_port: String,
    tracing_enabled: String,
    tracing_service_name: String,
    tracing_service_namespace: String,
    tracing_service_instance_id: String,
    tracing_exporter_protocol: String,
    tracing_sampling_rate: String,
}

/// A variable's value, or its default when unset or empty.
fn or(v: &str, default: &str) -> String {
    if v.is_empty() { default } else { v }.to_owned()
}

fn port(name: &str, v: &str, default: u16) -> Result<u16, String> {
    match v {
        "" => Ok(default),
        v => v.parse().map_err(|_| format!("{name}={v:?}: not a port")),
    }
}

/// `host:port`, an IPv6 host in brackets (Go's `net.JoinHostPort`).
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `password` or `user:password`.
fn auth(v: &str) -> Option<(Option<String>, String)> {
    match v {
        "" => None,
        a => match a.split_once(':') {
            Some((u, p)) => Some((Some(u.to_owned()), p.to_owned())),
            None => Some((None, a.to_owned())),
        },
    }
}

/// The startup backoff, the two health options, the connections' age.
type Lifecycle = ((Duration, Duration, Duration), bool, bool, (Duration, Duration));

impl Vars {
    /// The settings, checked and typed.
    fn settings(self) -> Result<Settings, String> {
        let (redis, redis_type) = self.redis()?;
        let redis_tls = RedisTls::from_vars(&self, &redis_type)?;
        if redis_tls.is_some() && redis_type == RedisType::Single && matches!(redis, RedisAddr::Unix(_)) {
            return Err("REDIS_TLS=true needs REDIS_SOCKET_TYPE=tcp (no TLS over a unix socket here)".into());
        }
        let panic_mode = self.panic_mode()?;
        let redis_timeout = parse_go_duration(&or(&self.redis_timeout, "10s")).map_err(|e| format!("REDIS_TIMEOUT: {e}"))?;
        if redis_timeout.is_zero() || redis_timeout.as_millis() == 0 {
            return Err("REDIS_TIMEOUT must be at least 1ms".into());
        }
        let near_limit_ratio = self.near_limit_ratio()?;
        let cache_key_prefix = self.cache_key_prefix.clone();
        if cache_key_prefix.contains(['{', '}']) {
            return Err(format!(
                "CACHE_KEY_PREFIX={cache_key_prefix:?} must not contain {{ or }} (the keys' hash tag is the domain)"
            ));
        }
        let (config_dir, poll_interval) = self.runtime()?;
        let prometheus = self.prometheus()?;
        let (grpc_tls, grpc_uds) = self.grpc()?;
        let (redis_startup, healthy_with_config, force_start, grpc_max_connection_age) = self.lifecycle()?;
        let xds = self.xds()?;
        Ok(Settings {
            host: or(&self.host, "0.0.0.0"),
            port: port("PORT", &self.port, 8080)?,
            grpc_host: or(&self.grpc_host, "0.0.0.0"),
            grpc_port: port("GRPC_PORT", &self.grpc_port, 8081)?,
            redis,
            redis_type,
            redis_auth: auth(&self.redis_auth),
            redis_sentinel_auth: auth(&self.redis_sentinel_auth),
            redis_tls,
            panic_mode,
            redis_timeout,
            cache_key_prefix,
            headers_enabled: flag("LIMIT_RESPONSE_HEADERS_ENABLED", &self.limit_response_headers_enabled)?,
            header_limit: or(&self.limit_limit_header, "RateLimit-Limit"),
            header_remaining: or(&self.limit_remaining_header, "RateLimit-Remaining"),
            header_reset: or(&self.limit_reset_header, "RateLimit-Reset"),
            shadow_mode: flag("SHADOW_MODE", &self.shadow_mode)?,
            quota_mode: flag("QUOTA_MODE", &self.quota_mode)?,
            response_dynamic_metadata: flag("RESPONSE_DYNAMIC_METADATA", &self.response_dynamic_metadata)?,
            usage_report_domains: match self.usage_report_domains.trim() {
                "" => vec!["ai-gateway-quota".to_owned()],
                "none" => Vec::new(),
                v => v.split(',').map(|d| d.trim().to_owned()).filter(|d| !d.is_empty()).collect(),
            },
            near_limit_ratio,
            local_cache_bytes: match self.local_cache_size_in_bytes.as_str() {
                "" => 0,
                v => v.parse().map_err(|_| format!("LOCAL_CACHE_SIZE_IN_BYTES={v:?}: a number of bytes"))?,
            },
            config_dir,
            ignore_dot_files: flag("RUNTIME_IGNOREDOTFILES", &self.runtime_ignoredotfiles)?,
            merge_domains: flag("MERGE_DOMAIN_CONFIG", &self.merge_domain_config)?,
            poll_interval,
            prometheus,
            stats_sink: StatsSink::None,
            extra_tags: Vec::new(),
            stats_flush_interval: Duration::from_secs(10),
            prometheus_mapper: None,
            prometheus_response_time_ms: false,
            notices: Vec::new(),
            grpc_tls,
            grpc_uds,
            redis_startup,
            redis_health_check: flag("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", &self.redis_health_check_active_connection)?,
            grpc_max_connection_age,
            xds,
            force_start,
            healthy_with_config,
            log: crate::logger::LogSettings::parse(&self.log_level, &self.log_format)?,
            debug_addr: join_host_port(&or(&self.debug_host, "0.0.0.0"), port("DEBUG_PORT", &self.debug_port, 6070)?),
            tracing: None,
        })
    }

    /// `GRPC_SERVER_USE_TLS` and its files; `GRPC_UDS`.
    fn grpc(&self) -> Result<(Option<crate::tls::GrpcTls>, Option<PathBuf>), String> {
        let grpc_tls = crate::tls::GrpcTls::from_vars(&crate::tls::GrpcTlsVars {
            use_tls: flag("GRPC_SERVER_USE_TLS", &self.grpc_server_use_tls)?,
            cert: &self.grpc_server_tls_cert,
            key: &self.grpc_server_tls_key,
            client_ca: &self.grpc_client_tls_cacert,
            client_san: &self.grpc_client_tls_san,
            server_ca: &self.grpc_server_tls_ca_cert,
        })?;
        let grpc_uds = (!self.grpc_uds.is_empty()).then(|| PathBuf::from(&self.grpc_uds));
        if grpc_uds.is_some() && grpc_tls.is_some() {
            return Err("GRPC_UDS with GRPC_SERVER_USE_TLS=true is not supported here (TLS on TCP only)".into());
        }
        Ok((grpc_tls, grpc_uds))
    }

    /// `NEAR_LIMIT_RATIO` (0.8), between 0 and 1.
    fn near_limit_ratio(&self) -> Result<f32, String> {
        let near_limit_ratio: f32 = match self.near_limit_ratio.as_str() {
            "" => 0.8,
            v => v.parse().map_err(|_| format!("NEAR_LIMIT_RATIO={v:?}: not a number"))?,
        };
        if !(0.0..=1.0).contains(&near_limit_ratio) {
            return Err(format!("NEAR_LIMIT_RATIO={near_limit_ratio}: between 0 and 1"));
        }
        Ok(near_limit_ratio)
    }

    /// `REDIS_STARTUP_*`, `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`, `GRPC_MAX_CONNECTION_AGE[_GRACE]`.
    fn lifecycle(&self) -> Result<Lifecycle, String> {
        let dur =
            |name: &str, v: &str, default: &str| parse_go_duration(&or(v, default)).map_err(|e| format!("{name}: {e}"));
        let redis_startup = (
            dur("REDIS_STARTUP_INITIAL_INTERVAL", &self.redis_startup_initial_interval, "1s")?,
            dur("REDIS_STARTUP_MAX_INTERVAL", &self.redis_startup_max_interval, "30s")?,
            dur("REDIS_STARTUP_MAX_ELAPSED_TIME", &self.redis_startup_max_elapsed_time, "0")?,
        );
        if redis_startup.0.is_zero() || redis_startup.1 < redis_startup.0 {
            return Err("REDIS_STARTUP_INITIAL_INTERVAL must be above 0 and at most REDIS_STARTUP_MAX_INTERVAL".into());
        }
        let healthy_with_config =
            flag("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", &self.healthy_with_at_least_one_config_loaded)?;
        let force_start = flag("FORCE_START_WITHOUT_INITIAL_CONFIG", &self.force_start_without_initial_config)?;
        let grpc_max_connection_age = (
            dur("GRPC_MAX_CONNECTION_AGE", &self.grpc_max_connection_age, "24h")?,
            dur("GRPC_MAX_CONNECTION_AGE_GRACE", &self.grpc_max_connection_age_grace, "1h")?,
        );
        Ok((redis_startup, healthy_with_config, force_start, grpc_max_connection_age))
    }

    /// `CONFIG_TYPE` (`FILE` or `GRPC_XDS_SOTW`, as upstream spells them)
    /// with the xDS client's variables.
    fn xds(&self) -> Result<Option<crate::xds_settings::XdsSettings>, String> {
        match self.config_type.as_str() {
            "" | "FILE" => return Ok(None),
            "GRPC_XDS_SOTW" => {}
            other => return Err(format!("CONFIG_TYPE={other:?}: FILE or GRPC_XDS_SOTW")),
        }
        let jitter = match self.xds_client_backoff_jitter.as_str() {
            "" => true,
            v => parse_bool("XDS_CLIENT_BACKOFF_JITTER", v)?,
        };
        crate::xds_settings::XdsSettings::from_vars(&crate::xds_settings::XdsVars {
            node_id: &self.config_grpc_xds_node_id,
            node_metadata: &self.config_grpc_xds_node_metadata,
            server_url: &self.config_grpc_xds_server_url,
            connect_retry_interval: &self.config_grpc_xds_server_connect_retry_interval,
            additional_headers: go_map(
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                &self.config_grpc_xds_client_additional_headers,
            )?,
            use_tls: flag("CONFIG_GRPC_XDS_SERVER_USE_TLS", &self.config_grpc_xds_server_use_tls)?,
            client_cert: &self.config_grpc_xds_client_tls_cert,
            client_key: &self.config_grpc_xds_client_tls_key,
            server_ca: &self.config_grpc_xds_server_tls_cacert,
            server_san: &self.config_grpc_xds_server_tls_san,
            backoff_initial: &self.xds_client_backoff_initial_interval,
            backoff_max: &self.xds_client_backoff_max_interval,
            backoff_factor: &self.xds_client_backoff_random_factor,
            backoff_jitter: jitter,
            max_msg_size: &self.xds_client_max_msg_size_in_bytes,
        })
        .map(Some)
    }

    /// `REDIS_URL` with `REDIS_TYPE` and `REDIS_SOCKET_TYPE`.
    fn redis(&self) -> Result<(RedisAddr, RedisType), String> {
        let url = or(&self.redis_url, "/var/run/nutcracker/ratelimit.sock");
        let list = |from: usize| -> Result<Vec<String>, String> {
            let parts: Vec<String> = url.split(',').skip(from).map(|a| a.trim().to_owned()).collect();
            if parts.is_empty()
                || parts.iter().any(|a| a.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()))
            {
                return Err(format!("REDIS_URL={url:?}: host:port addresses separated by commas"));
            }
            Ok(parts)
        };
        let redis_type = match self.redis_type.to_ascii_lowercase().as_str() {
            "" | "single" => {
                if url.contains(',') {
                    return Err(format!("REDIS_URL={url:?}: one address for REDIS_TYPE=single"));
                }
                RedisType::Single
            }
            "sentinel" => {
                let master = url.split(',').next().unwrap_or("").trim().to_owned();
                if master.is_empty() || !url.contains(',') {
                    return Err(format!(
                        "REDIS_URL={url:?}: REDIS_TYPE=sentinel expects <master name>,<sentinel host:port>,..."
                    ));
                }
                RedisType::Sentinel { master, sentinels: list(1)? }
            }
            "cluster" => RedisType::Cluster { nodes: list(0)? },
            other => return Err(format!("REDIS_TYPE={other:?}: single, sentinel or cluster")),
        };
        let redis = match or(&self.redis_socket_type, "unix").as_str() {
            "unix" => RedisAddr::Unix(url),
            "tcp" => RedisAddr::Tcp(url),
            other => return Err(format!("REDIS_SOCKET_TYPE={other:?}: tcp or unix")),
        };
        Ok((redis, redis_type))
    }

    /// `PANIC_MODE` with `PANIC_INSTANCES`.
    fn panic_mode(&self) -> Result<PanicMode, String> {
        let instances: u64 = match self.panic_instances.as_str() {
            "" => 1,
            v => v.parse().ok().filter(|&n| n >= 1).ok_or_else(|| format!("PANIC_INSTANCES={v:?}: an integer >= 1"))?,
        };
        Ok(match self.panic_mode.to_ascii_lowercase().as_str() {
            "" | "error" => PanicMode::Error,
            "local" => PanicMode::Local(instances),
            "allow" => PanicMode::Allow,
            "deny" => PanicMode::Deny,
            other => return Err(format!("PANIC_MODE={other:?}: error, local, allow or deny")),
        })
    }

    /// The configuration directory and how often it is polled.
    fn runtime(&self) -> Result<(PathBuf, Duration), String> {
        let mut config_dir = PathBuf::from(or(&self.runtime_root, "/srv/runtime_data/current"));
        if !self.runtime_subdirectory.is_empty() {
            config_dir.push(&self.runtime_subdirectory);
        }
        config_dir.push(or(&self.runtime_appdirectory, "config"));
        flag("RUNTIME_WATCH_ROOT", &self.runtime_watch_root)?; // watched either way: the directory is polled
        let poll_interval =
            parse_go_duration(&or(&self.runtime_poll_interval, "1s")).map_err(|e| format!("RUNTIME_POLL_INTERVAL: {e}"))?;
        if poll_interval.as_millis() < 10 {
            return Err("RUNTIME_POLL_INTERVAL must be at least 10ms".into());
        }
        Ok((config_dir, poll_interval))
    }

    /// `TRACING_ENABLED=true`: `TRACING_*` and the `OTEL_` variables of `env`.
    fn tracing(&self, env: &HashMap<String, String>) -> Result<Option<crate::otlp_settings::TraceSettings>, String> {
        if !flag("TRACING_ENABLED", &self.tracing_enabled)? {
            return Ok(None);
        }
        let t = crate::otlp_settings::TracingVars {
            service_name: &self.tracing_service_name,
            service_namespace: &self.tracing_service_namespace,
            service_instance_id: &self.tracing_service_instance_id,
            exporter_protocol: &self.tracing_exporter_protocol,
            sampling_rate: &self.tracing_sampling_rate,
        };
        crate::otlp_settings::TraceSettings::from_vars(&t, env).map(Some)
    }

    /// `USE_PROMETHEUS` with `PROMETHEUS_ADDR` and `PROMETHEUS_PATH`.
    fn prometheus(&self) -> Result<Option<(String, String)>, String> {
        if !flag("USE_PROMETHEUS", &self.use_prometheus)? {
            return Ok(None);
        }
        let addr = or(&self.prometheus_addr, ":9090");
        let addr = if addr.starts_with(':') { format!("0.0.0.0{addr}") } else { addr };
        let path = or(&self.prometheus_path, "/metrics");
        if !path.starts_with('/') {
            return Err(format!("PROMETHEUS_PATH={path:?}: a path starting with /"));
        }
        Ok(Some((addr, path)))
    }
}

impl Settings {
    /// Whether a descriptor's own `hits_addend` is a usage report in `domain`.
    pub fn usage_reports(&self, domain: &str) -> bool {
        self.usage_report_domains.iter().any(|d| d == "*" || d == domain)
    }

    /// The settings of the process environment.
    pub fn from_env() -> Result<Settings, String> {
        Settings::from_map(&std::env::vars().collect())
    }

    /// The settings of a map of variables (the environment, or a test's).
    pub fn from_map(env: &HashMap<String, String>) -> Result<Settings, String> {
        let notices = crate::upstream_settings::check(env)?;
        let vars = env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        let vars = Vars::deserialize(MapDeserializer::<_, serde::de::value::Error>::new(vars)).map_err(|e| e.to_string())?;
        let stats_sink = stats_sink(&vars, env)?;
        let mut extra_tags: Vec<(String, String)> = go_map("EXTRA_TAGS", &vars.extra_tags)?
            .into_iter()
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
            .map(|(k, v)| (k, v.replace(['.', ':', '|'], "_")))
            .collect();
        extra_tags.sort();
        let stats_flush_interval =
            parse_go_duration(&or(&vars.stats_flush_interval, "10s")).map_err(|e| format!("STATS_FLUSH_INTERVAL: {e}"))?;
        if stats_flush_interval.is_zero() {
            return Err("STATS_FLUSH_INTERVAL must be above 0".into());
        }
        let prometheus_mapper = match vars.prometheus_mapper_yaml.as_str() {
            "" => None,
            path => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("PROMETHEUS_MAPPER_YAML={path:?}: cannot read it: {e}"))?;
                crate::mapper::Mapper::parse(&text).map_err(|e| format!("PROMETHEUS_MAPPER_YAML={path:?}: {e}"))?;
                Some((path.to_owned(), text))
            }
        };
        let prometheus_response_time_ms =
            flag("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", &vars.prometheus_response_time_as_milliseconds)?;
        let tracing = vars.tracing(env)?;
        let mut s = vars.settings()?;
        s.tracing = tracing;
        if stats_sink != StatsSink::Prometheus {
            s.prometheus = None; // DISABLE_STATS: no listener either, as there
        }
        Ok(Settings {
            notices,
            stats_sink,
            extra_tags,
            stats_flush_interval,
            prometheus_mapper,
            prometheus_response_time_ms,
            ..s
        })
    }

    /// The names of the variables read (envoyproxy/ratelimit's and this
    /// service's own): the fields of `Vars`, as serde names them.
    pub fn read_names() -> &'static [&'static str] {
        use serde::de::{Error as _, Visitor};
        struct Fields(&'static [&'static str]);
        impl<'de> serde::Deserializer<'de> for &mut Fields {
            type Error = serde::de::value::Error;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
                Err(Self::Error::custom("only a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Self::Error> {
                self.0 = fields;
                Err(Self::Error::custom("fields taken"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
                unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
            }
        }
        let mut f = Fields(&[]);
        let _ = Vars::deserialize(&mut f);
        f.0
    }

    /// The `redis://` URLs (`rediss://` with `REDIS_TLS`) of the sentinels
    /// (with `REDIS_SENTINEL_AUTH`) or of the cluster's seed nodes (with
    /// `REDIS_AUTH`); empty for single.
    pub fn redis_urls(&self) -> Vec<String> {
        fn enc(s: &str) -> String {
            let mut o = String::new();
            for b in s.bytes() {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    o.push(b as char);
                } else {
                    o.push_str(&format!("%{b:02X}"));
                }
            }
            o
        }
        let scheme = if self.redis_tls.is_some() { "rediss" } else { "redis" };
        let url = |addr: &String, auth: &Option<(Option<String>, String)>| match auth {
            None => format!("{scheme}://{addr}/"),
            Some((u, p)) => format!("{scheme}://{}:{}@{addr}/", enc(u.as_deref().unwrap_or("")), enc(p)),
        };
        match &self.redis_type {
            RedisType::Single => Vec::new(),
            RedisType::Sentinel { sentinels, .. } => sentinels.iter().map(|a| url(a, &self.redis_sentinel_auth)).collect(),
            RedisType::Cluster { nodes } => nodes.iter().map(|a| url(a, &self.redis_auth)).collect(),
        }
    }

    /// The redis-rs connection info of `REDIS_*` (`rediss://` with
    /// `REDIS_TLS`; its certificates are [`redis_client`](Self::redis_client)'s).
    pub fn redis_info(&self) -> redis::ConnectionInfo {
        use redis::IntoConnectionInfo;
        let url = match &self.redis {
            RedisAddr::Tcp(a) if self.redis_tls.is_some() => format!("rediss://{a}/"),
            RedisAddr::Tcp(a) => format!("redis://{a}/"),
            RedisAddr::Unix(p) => format!("unix://{p}"),
        };
        // the address was checked to be one address; a malformed one fails at connect time
        let mut info = url
            .as_str()
            .into_connection_info()
            .unwrap_or_else(|_| "redis://127.0.0.1:6379/".into_connection_info().expect("a constant URL"));
        if let Some((user, pass)) = &self.redis_auth {
            let mut r = info.redis_settings().clone().set_password(pass.clone());
            if let Some(u) = user {
                r = r.set_username(u.clone());
            }
            info = info.set_redis_settings(r);
        }
        // TCP_NODELAY (redis-rs leaves Nagle on): a decision is one small
        // write, which Nagle would hold behind an unacknowledged one until
        // Redis's delayed ACK (up to 40 ms)
        info.set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
    }

    /// The redis-rs client of `REDIS_TYPE=single`: [`redis_info`](Self::redis_info)
    /// with `REDIS_TLS`'s certificates and hostname verification.
    pub fn redis_client(&self) -> Result<redis::Client, String> {
        let info = self.redis_info();
        let Some(tls) = &self.redis_tls else {
            return redis::Client::open(info).map_err(|e| format!("REDIS_URL: {e}"));
        };
        let client = redis::Client::build_with_tls(info, tls.certificates()).map_err(|e| format!("REDIS_TLS: {e}"))?;
        if !tls.skip_hostname_verification {
            return Ok(client);
        }
        let info = client.get_connection_info().clone();
        let mut addr = info.addr().clone();
        // the chain is still verified; only the name is not compared
        addr.set_danger_accept_invalid_hostnames(true);
        redis::Client::open(info.set_addr(addr)).map_err(|e| format!("REDIS_TLS: {e}"))
    }
}
