//! `TRACING_ENABLED=true`: the tracing settings, read and checked at
//! startup with the others. envoyproxy/ratelimit's own (`TRACING_*`) and
//! the OpenTelemetry variables its Go SDK and OTLP exporter read
//! (`OTEL_EXPORTER_OTLP_*`, `OTEL_BSP_*`, `OTEL_RESOURCE_ATTRIBUTES`), with
//! the same defaults and precedence. An `OTEL_` variable this service does
//! not read is refused by name while tracing is on (off, none is read,
//! as there). The spans themselves are [`crate::trace`]'s; the wire,
//! [`crate::otlp`]'s.

use std::collections::HashMap;
use std::time::Duration;

use rustls::pki_types::ServerName;

use crate::tls::ClientTls;

/// `TRACING_EXPORTER_PROTOCOL`: how spans reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/HTTP, protobuf body (`http`, the default).
    Http,
    /// OTLP/gRPC (`grpc`).
    Grpc,
}

/// The tracing settings (`TRACING_ENABLED=true`).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// `TRACING_SERVICE_NAME` (`RateLimit`): the resource's `service.name`.
    pub service_name: String,
    /// `TRACING_SERVICE_NAMESPACE` (empty): `service.namespace`.
    pub service_namespace: String,
    /// `TRACING_SERVICE_INSTANCE_ID` (a random UUID when empty): `service.instance.id`.
    pub service_instance_id: String,
    /// `TRACING_EXPORTER_PROTOCOL` (`http`).
    pub protocol: Protocol,
    /// `TRACING_SAMPLING_RATE` (1): ParentBased(TraceIDRatioBased(rate)).
    pub sampling_rate: f64,
    /// The collector's `host:port`.
    pub authority: String,
    /// OTLP/HTTP's path (`/v1/traces` under `OTEL_EXPORTER_OTLP_ENDPOINT`'s,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`'s as it is).
    pub path: String,
    /// TLS to the collector (an `https` endpoint, or `OTEL_EXPORTER_OTLP_INSECURE=false`).
    pub tls: Option<ClientTls>,
    /// `OTEL_EXPORTER_OTLP_HEADERS` / `_TRACES_HEADERS` (`k1=v1,k2=v2`).
    pub headers: Vec<(String, String)>,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT` / `_TRACES_TIMEOUT` (10 s): one export's bound.
    pub timeout: Duration,
    /// `OTEL_BSP_SCHEDULE_DELAY` (5 s): the longest a span waits for its batch.
    pub schedule_delay: Duration,
    /// `OTEL_BSP_EXPORT_TIMEOUT` (30 s): one batch's bound, retries included.
    pub export_timeout: Duration,
    /// `OTEL_BSP_MAX_QUEUE_SIZE` (2048): spans waiting; more are dropped (counted).
    pub max_queue: usize,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512): spans per export.
    pub max_batch: usize,
    /// `OTEL_RESOURCE_ATTRIBUTES` (`k1=v1,k2=v2`, percent-decoded): more
    /// resource attributes; `service.*` above take precedence, as there.
    pub resource_attributes: Vec<(String, String)>,
}

/// The `OTEL_` variables read (any other, set while tracing is on, is refused).
pub const OTEL_READ: &[&str] = &[
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_RESOURCE_ATTRIBUTES",
    // replaced by TRACING_SERVICE_NAME's service.name there too: read, no effect
    "OTEL_SERVICE_NAME",
];

/// envoyproxy/ratelimit's `TRACING_*` as set (empty: unset).
pub struct TracingVars<'a> {
    /// `TRACING_SERVICE_NAME`.
    pub service_name: &'a str,
    /// `TRACING_SERVICE_NAMESPACE`.
    pub service_namespace: &'a str,
    /// `TRACING_SERVICE_INSTANCE_ID`.
    pub service_instance_id: &'a str,
    /// `TRACING_EXPORTER_PROTOCOL`.
    pub exporter_protocol: &'a str,
    /// `TRACING_SAMPLING_RATE`.
    pub sampling_rate: &'a str,
}

/// 128 random bits: a per-thread SplitMix64, seeded from std's random
/// hash keys (no lock, no allocation; ids need to be unique, not secret).
pub fn random_u128() -> u128 {
    use std::cell::Cell;
    use std::hash::{BuildHasher, Hasher};
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x5eed);
            h.finish()
        });
    }
    let next = || {
        STATE.with(|s| {
            let x = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
            s.set(x);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        })
    };
    (u128::from(next()) << 64) | u128::from(next())
}

/// `%XX` decoded (Go's `url.PathUnescape`, as the SDK decodes headers and
/// resource attributes); `None` for a malformed escape.
fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `k1=v1,k2=v2`, each side trimmed and percent-decoded; a malformed entry is refused.
fn pairs(name: &str, v: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for e in v.split(',').filter(|e| !e.trim().is_empty()) {
        let (k, val) = e.split_once('=').ok_or_else(|| format!("{name}={v:?}: {e:?} is not key=value"))?;
        let (Some(k), Some(val)) = (unescape(k.trim()), unescape(val.trim())) else {
            return Err(format!("{name}={v:?}: {e:?} has a malformed %-escape"));
        };
        if k.is_empty() {
            return Err(format!("{name}={v:?}: {e:?} has no key"));
        }
        out.push((k, val));
    }
    Ok(out)
}

/// A random version-4 UUID in its text form (the instance id's default).
pub fn random_uuid(hi: u64, lo: u64) -> String {
    let hi = (hi & !0xf000) | 0x4000; // version 4
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62); // RFC 4122 variant
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// An endpoint URL: whether its scheme asks for TLS, its `host:port`, its host, its path.
fn url(name: &str, v: &str) -> Result<(bool, String, String, String), String> {
    let (secure, rest) = if let Some(r) = v.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = v.strip_prefix("https://") {
        (true, r)
    } else {
        return Err(format!("{name}={v:?}: an http:// or https:// URL here"));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() || authority.contains('@') || path.contains(['?', '#']) {
        return Err(format!("{name}={v:?}: scheme://host[:port][/path], without user, query or fragment"));
    }
    let (host, authority) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') && h.contains(':') => {
            return Err(format!("{name}={v:?}: an IPv6 host goes in brackets ({h}:{p})"))
        }
        Some((h, p)) => {
            p.parse::<u16>().map_err(|_| format!("{name}={v:?}: port {p:?}"))?;
            (h.to_owned(), authority.to_owned())
        }
        None => (authority.to_owned(), format!("{authority}:{}", if secure { 443 } else { 80 })),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    Ok((secure, authority, host, path.to_owned()))
}

/// `a` joined with `b` as Go's `path.Join` joins two absolute paths.
fn join(a: &str, b: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in a.split('/').chain(b.split('/')) {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

fn millis(env: &HashMap<String, String>, name: &str, default: Duration) -> Result<Duration, String> {
    match env.get(name).map(String::as_str) {
        None | Some("") => Ok(default),
        Some(v) => match v.parse::<i64>() {
            // the SDK ignores a negative value (the default stays)
            Ok(n) if n < 0 => Ok(default),
            Ok(n) => Ok(Duration::from_millis(n as u64)),
            Err(_) => Err(format!("{name}={v:?}: a number of milliseconds")),
        },
    }
}

fn count(env: &HashMap<String, String>, name: &str, default: usize) -> Result<usize, String> {
    match env.get(name).map(String::as_str) {
        None | Some("") => Ok(default),
        Some(v) => match v.parse::<i64>() {
            Ok(n) if n <= 0 => Ok(default),
            Ok(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
            Err(_) => Err(format!("{name}={v:?}: a positive integer")),
        },
    }
}

/// The signal's variable when set, else the general one: (its name, its value).
fn either<'e>(env: &'e HashMap<String, String>, what: &str) -> Option<(String, &'e str)> {
    let traces = format!("OTEL_EXPORTER_OTLP_TRACES_{what}");
    let general = format!("OTEL_EXPORTER_OTLP_{what}");
    let get = |n: &str| env.get(n).map(String::as_str).filter(|v| !v.is_empty());
    get(&traces).map(|v| (traces.clone(), v)).or_else(|| get(&general).map(|v| (general.clone(), v)))
}

/// The collector's endpoint, as the Go exporter takes it: whether its
/// scheme asks for TLS, `host:port`, the host, the path.
fn endpoint(env: &HashMap<String, String>, http: bool) -> Result<(bool, String, String, String), String> {
    let traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").filter(|v| !v.is_empty());
    let general = env.get("OTEL_EXPORTER_OTLP_ENDPOINT").filter(|v| !v.is_empty());
    Ok(match (traces, general) {
        (Some(v), _) => {
            let (s, a, h, p) = url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", v)?;
            if !http && !matches!(p.as_str(), "" | "/") {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={v:?}: no path with TRACING_EXPORTER_PROTOCOL=grpc"
                ));
            }
            // the signal's URL as it is ("/" without a path)
            (s, a, h, if p.is_empty() { "/".to_owned() } else { p })
        }
        (None, Some(v)) => {
            let (s, a, h, p) = url("OTEL_EXPORTER_OTLP_ENDPOINT", v)?;
            if !http && !matches!(p.as_str(), "" | "/") {
                return Err(format!("OTEL_EXPORTER_OTLP_ENDPOINT={v:?}: no path with TRACING_EXPORTER_PROTOCOL=grpc"));
            }
            (s, a, h, join(&p, "/v1/traces"))
        }
        // the exporter's default: TLS to localhost
        (None, None) => {
            let port = if http { 4318 } else { 4317 };
            (true, format!("localhost:{port}"), "localhost".into(), "/v1/traces".into())
        }
    })
}

/// `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, or `OTEL_EXPORTER_OTLP_HEADERS`, checked.
fn headers(env: &HashMap<String, String>) -> Result<Vec<(String, String)>, String> {
    let headers = match either(env, "HEADERS") {
        Some((n, v)) => pairs(&n, v)?,
        None => Vec::new(),
    };
    for (k, v) in &headers {
        let bad = |what: &str| format!("OTEL_EXPORTER_OTLP_HEADERS: {k:?}={v:?}: not a valid header {what}");
        tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(k.to_ascii_lowercase().as_bytes())
            .map_err(|_| bad("name"))?;
        if v.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Err(bad("value"));
        }
    }
    Ok(headers)
}

impl TraceSettings {
    /// The settings of `TRACING_*` and of the `OTEL_` variables of `env`,
    /// every file read and checked.
    pub fn from_vars(t: &TracingVars<'_>, env: &HashMap<String, String>) -> Result<TraceSettings, String> {
        if let Some(n) = env.keys().filter(|k| k.starts_with("OTEL_") && !OTEL_READ.contains(&k.as_str())).min() {
            return Err(format!(
                "{n} is not read by this service's tracing (TRACING_ENABLED=true; read: {}; see docs/envoy.md)",
                OTEL_READ.join(", ")
            ));
        }
        let protocol = match t.exporter_protocol {
            "" | "http" => Protocol::Http,
            "grpc" => Protocol::Grpc,
            v => return Err(format!("TRACING_EXPORTER_PROTOCOL={v:?}: http or grpc (Invalid otlptrace client protocol)")),
        };
        let sampling_rate = match t.sampling_rate {
            "" => 1.0,
            v => v.parse::<f64>().ok().filter(|r| !r.is_nan()).ok_or_else(|| {
                format!("TRACING_SAMPLING_RATE={v:?}: a number (1: every trace, 0: none without a sampled parent)")
            })?,
        };
        if let Some((n, v)) = either(env, "COMPRESSION").filter(|(_, v)| *v != "none") {
            return Err(format!("{n}={v:?}: only none here (the spans go uncompressed)"));
        }
        let http = protocol == Protocol::Http;
        let (mut secure, authority, host, path) = endpoint(env, http)?;
        for n in ["OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE"] {
            if let Some(v) = env.get(n).filter(|v| !v.is_empty()) {
                secure = match v.to_ascii_lowercase().as_str() {
                    "true" => false,
                    "false" => true,
                    _ => return Err(format!("{n}={v:?}: true or false")),
                };
            }
        }
        let tls = if secure { Some(Self::tls(env, &host, http)?) } else { None };
        let headers = headers(env)?;
        let timeout_name = match either(env, "TIMEOUT") {
            Some((n, _)) => n,
            None => "OTEL_EXPORTER_OTLP_TIMEOUT".into(),
        };
        let instance = match t.service_instance_id {
            "" => {
                let r = random_u128();
                random_uuid((r >> 64) as u64, r as u64)
            }
            v => v.to_owned(),
        };
        Ok(TraceSettings {
            service_name: if t.service_name.is_empty() { "RateLimit".into() } else { t.service_name.to_owned() },
            service_namespace: t.service_namespace.to_owned(),
            service_instance_id: instance,
            protocol,
            sampling_rate,
            authority,
            path,
            tls,
            headers,
            timeout: millis(env, &timeout_name, Duration::from_secs(10))?,
            schedule_delay: millis(env, "OTEL_BSP_SCHEDULE_DELAY", Duration::from_secs(5))?,
            export_timeout: millis(env, "OTEL_BSP_EXPORT_TIMEOUT", Duration::from_secs(30))?,
            max_queue: count(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)?,
            max_batch: count(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?,
            resource_attributes: match env.get("OTEL_RESOURCE_ATTRIBUTES") {
                Some(v) => pairs("OTEL_RESOURCE_ATTRIBUTES", v)?,
                None => Vec::new(),
            },
        })
    }

    /// TLS to the collector: its CA from `OTEL_EXPORTER_OTLP_CERTIFICATE`
    /// (the system's roots are not read here), a client certificate from
    /// `_CLIENT_CERTIFICATE` and `_CLIENT_KEY`.
    fn tls(env: &HashMap<String, String>, host: &str, http: bool) -> Result<ClientTls, String> {
        let Some((ca_name, ca)) = either(env, "CERTIFICATE") else {
            return Err("TLS to the OTLP collector (an https:// endpoint, no endpoint set, or \
                 OTEL_EXPORTER_OTLP_INSECURE=false) needs OTEL_EXPORTER_OTLP_CERTIFICATE here: the system's roots \
                 are not read (or set an http:// OTEL_EXPORTER_OTLP_ENDPOINT)"
                .into());
        };
        let client = match (either(env, "CLIENT_CERTIFICATE"), either(env, "CLIENT_KEY")) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => return Err("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY go together".into()),
        };
        let server_name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("the OTLP collector's host {host:?} as a TLS name: {e}"))?;
        let client = client.as_ref().map(|((cn, cert), (kn, key))| ((cn.as_str(), *cert), (kn.as_str(), *key)));
        ClientTls::new((&ca_name, ca), client, !http, server_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars() -> TracingVars<'static> {
        TracingVars {
            service_name: "",
            service_namespace: "",
            service_instance_id: "",
            exporter_protocol: "",
            sampling_rate: "",
        }
    }

    fn with(env: &[(&str, &str)], t: &TracingVars<'_>) -> Result<TraceSettings, String> {
        TraceSettings::from_vars(t, &env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
    }

    #[test]
    fn endpoints_as_the_go_exporter_reads_them() {
        let s = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4000/base")], &vars()).unwrap();
        assert_eq!((s.authority.as_str(), s.path.as_str(), s.tls.is_none()), ("c:4000", "/base/v1/traces", true));
        let s = with(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c")], &vars()).unwrap();
        assert_eq!((s.authority.as_str(), s.path.as_str()), ("c:80", "/"));
        let e = with(&[], &vars()).unwrap_err();
        assert!(e.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{e}");
        let e = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1"), ("OTEL_EXPORTER_OTLP_INSECURE", "false")], &vars());
        assert!(e.unwrap_err().contains("OTEL_EXPORTER_OTLP_CERTIFICATE"));
        let s = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:1"), ("OTEL_EXPORTER_OTLP_INSECURE", "true")], &vars());
        assert!(s.unwrap().tls.is_none());
        let e = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")], &vars()).unwrap_err();
        assert!(e.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT="), "{e}");
    }

    #[test]
    fn refusals_name_the_variable() {
        let ok = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1")];
        let t = TracingVars { exporter_protocol: "thrift", ..vars() };
        assert!(with(&ok, &t).unwrap_err().starts_with("TRACING_EXPORTER_PROTOCOL="));
        let t = TracingVars { sampling_rate: "half", ..vars() };
        assert!(with(&ok, &t).unwrap_err().starts_with("TRACING_SAMPLING_RATE="));
        let e = with(&[ok[0], ("OTEL_TRACES_SAMPLER", "always_off")], &vars()).unwrap_err();
        assert!(e.starts_with("OTEL_TRACES_SAMPLER "), "{e}");
        let e = with(&[ok[0], ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")], &vars()).unwrap_err();
        assert!(e.starts_with("OTEL_EXPORTER_OTLP_COMPRESSION="), "{e}");
        let e = with(&[ok[0], ("OTEL_EXPORTER_OTLP_HEADERS", "novalue")], &vars()).unwrap_err();
        assert!(e.starts_with("OTEL_EXPORTER_OTLP_HEADERS="), "{e}");
    }

    #[test]
    fn headers_resource_and_defaults() {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "a=1,b=x%20y"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod"),
        ];
        let s = with(&env, &vars()).unwrap();
        assert_eq!(s.headers, [("a".into(), "1".into()), ("b".into(), "x y".into())]);
        assert_eq!(s.resource_attributes, [("deployment.environment".to_owned(), "prod".to_owned())]);
        assert_eq!((s.service_name.as_str(), s.sampling_rate, s.protocol), ("RateLimit", 1.0, Protocol::Http));
        assert_eq!((s.max_queue, s.max_batch, s.schedule_delay), (2048, 512, Duration::from_secs(5)));
        assert_eq!(s.service_instance_id.len(), 36);
        assert_eq!(&s.service_instance_id[14..15], "4");
    }
}
