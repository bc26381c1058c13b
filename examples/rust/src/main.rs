//! A small rate-limiting HTTP gateway in front of one upstream: axum for
//! the server, hyper for the upstream, and the redis-ratelimit Rust client
//! (`clients/rust`) for the decisions. It behaves like the Python and Node
//! gateways beside it (`examples/python/gateway.py`, `examples/node/gateway.js`):
//! the same options, rules file, Redis keys, headers, 429 body and stats,
//! so instances of all three can share one limit.
//!
//! ```text
//! cargo build --release -p redis-ratelimit-gateway      # or: make gateway-rust
//! target/release/rl-gateway --port 8080 --upstream http://127.0.0.1:9000 \
//!     --redis redis://127.0.0.1:6379/0 --rules examples/rules.json
//! ```
//!
//! * Caller: the X-Api-Key header (hashed before it goes into a Redis key),
//!   or the client's address when there is none. The gateway only
//!   identifies callers; authenticate them in front of it or upstream.
//! * Policy: the first route in the rules file whose "match" prefix fits
//!   the path (and whose "methods", if given, include the method). Paths no
//!   route matches are forwarded unlimited. The file is re-read when it
//!   changes; a version that does not parse or validate is ignored (the
//!   previous rules stay) and counted in the stats.
//! * Granted: forwarded; the response carries the library's headers().
//! * Denied: 429 with Retry-After and the library's problem+json body.
//! * Redis down or slower than --redis-timeout-ms: the library's breaker
//!   opens at the first failure and its panic limits decide (the route's
//!   limit divided by "instances"), counted as a fallback. After
//!   --redis-retry-ms one probe goes to Redis.
//! * GET /_gateway/stats: counters as JSON (not forwarded, not limited).

mod rules;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use axum::serve::ListenerExt;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis_ratelimit_client::{
    headers, make_key, problem, Backend, Breaker, Call, Decision, Lease, LeasedLimiter, Limiter, Metrics, Options, Panic,
    RateLimit, Source,
};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use rules::{Route, RulesFile};

const STATS_PATH: &str = "/_gateway/stats";
/// Request bodies are read whole before forwarding, up to this.
const MAX_BODY: usize = 16 * 1024 * 1024;
const HOP_BY_HOP: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

fn log(msg: &str) {
    eprintln!("gateway[{}]: {msg}", std::process::id());
}

// ------------------------------------------------------------------ stats

/// The gateway's counters (the names of the other two gateways' stats).
#[derive(Default)]
struct Stats {
    requests: AtomicU64,
    granted: AtomicU64,
    denied: AtomicU64,
    unlimited: AtomicU64,
    redis_decisions: AtomicU64,
    fallbacks: AtomicU64,
    upstream_errors: AtomicU64,
    rules_loads: AtomicU64,
    rules_errors: AtomicU64,
}

fn metrics_json(m: &Metrics) -> Value {
    json!({
        "decisions_module": m.decisions_module, "decisions_lua": m.decisions_lua,
        "decisions_local": m.decisions_local, "decisions_panic": m.decisions_panic,
        "denied": m.denied, "calls": m.calls, "failures": m.failures,
        "leases": m.leases, "lease_tokens": m.lease_tokens, "lease_waits": m.lease_waits,
        "refunds": m.refunds, "refund_tokens": m.refund_tokens,
        "trips": m.trips, "trips_failures": m.trips_failures, "trips_latency": m.trips_latency,
        "probes_ok": m.probes_ok, "probes_failed": m.probes_failed,
        "redetects": m.redetects, "unreplicated": m.unreplicated, "state": m.state.as_str(),
    })
}

// --------------------------------------------------------------- limiters

enum Lim {
    PerRequest(Limiter<ConnectionManager>),
    Leased(LeasedLimiter<ConnectionManager>),
}

/// (route name and algorithm, the policy's numbers, instances)
type LimKey = (String, Vec<u64>, u64);

/// The library's RateLimit (backend, breaker, panic limits) and one
/// limiter per route version: a reload that keeps a route's policy keeps
/// its limiter (and, leased, its reservoirs).
struct Limiters {
    rl: RateLimit<ConnectionManager>,
    lease_batch: u64,
    map: Mutex<HashMap<LimKey, Arc<Lim>>>,
}

impl Limiters {
    fn get(&self, route: &Route, instances: u64) -> redis_ratelimit_client::Result<Arc<Lim>> {
        let k = (route.signature.clone(), route.policy.params().to_vec(), instances);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = map.get(&k) {
            return Ok(l.clone());
        }
        if map.len() > 1000 {
            map.clear(); // the rules changed many times
        }
        let panic = Panic::Instances(instances);
        let lim = if self.lease_batch > 0 {
            Lim::Leased(self.rl.leased(route.policy.clone(), Lease { batch: self.lease_batch, panic, ..Lease::default() })?)
        } else {
            Lim::PerRequest(self.rl.limiter(route.policy.clone(), panic)?)
        };
        let lim = Arc::new(lim);
        map.insert(k, lim.clone());
        Ok(lim)
    }

    async fn decide(&self, key: &str, route: &Route, instances: u64) -> redis_ratelimit_client::Result<Decision> {
        match &*self.get(route, instances)? {
            Lim::PerRequest(l) => l.limit(key, Call::cost(route.cost)).await,
            Lim::Leased(l) => l.limit(key, route.cost).await,
        }
    }

    /// Leased mode: give every reservoir's units back (on shutdown).
    async fn close(&self) {
        let all: Vec<Arc<Lim>> = self.map.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for l in all {
            if let Lim::Leased(l) = &*l {
                let _ = tokio::time::timeout(Duration::from_secs(1), l.close()).await;
            }
        }
    }
}

// ------------------------------------------------------------------- HTTP

struct App {
    stats: Arc<Stats>,
    rules: Arc<RulesFile>,
    limiters: Limiters,
    upstream: Uri,
    client: Client<HttpConnector, Full<Bytes>>,
}

fn caller_id(h: &HeaderMap, addr: &SocketAddr) -> String {
    match h.get("x-api-key") {
        Some(v) if !v.is_empty() => {
            let digest = Sha256::digest(v.as_bytes());
            let mut s = String::from("key:");
            for b in &digest[..16] {
                s.push_str(&format!("{b:02x}"));
            }
            s
        }
        _ => format!("ip:{}", addr.ip().to_canonical()),
    }
}

fn json_response(status: StatusCode, ctype: &'static str, body: String, extra: &[(&'static str, String)]) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    add_headers(r.headers_mut(), extra);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

fn add_headers(h: &mut HeaderMap, extra: &[(&'static str, String)]) {
    for (k, v) in extra {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(HeaderName::from_static(lower(k)), v);
        }
    }
}

/// The library's header names, lower-cased for `HeaderName::from_static`.
fn lower(k: &'static str) -> &'static str {
    match k {
        "RateLimit-Policy" => "ratelimit-policy",
        "RateLimit" => "ratelimit",
        "X-RateLimit-Limit" => "x-ratelimit-limit",
        "X-RateLimit-Remaining" => "x-ratelimit-remaining",
        "X-RateLimit-Reset" => "x-ratelimit-reset",
        "Retry-After" => "retry-after",
        _ => "x-ratelimit-other",
    }
}

fn error_problem(
    status: StatusCode,
    title: &str,
    detail: &str,
    path: &str,
    extra: &[(&'static str, String)],
) -> Response<Body> {
    let doc = json!({"type": "about:blank", "title": title, "status": status.as_u16(), "detail": detail, "instance": path});
    json_response(status, "application/problem+json", doc.to_string(), extra)
}

/// 429: the library's problem(decision) body, with the route's numbers.
fn denied(d: &Decision, route: &Route, path: &str, extra: &[(&'static str, String)]) -> Response<Body> {
    let mut body = problem(d, Some(path)).to_json();
    body.pop(); // the closing brace: the members below follow the library's
    body.push_str(&format!(
        ", \"policy\": {}, \"limit\": {}, \"remaining\": {}, \"retry_after_ms\": {}}}",
        Value::from(route.name.as_str()),
        d.limit,
        d.remaining,
        d.retry_after_ms
    ));
    json_response(StatusCode::TOO_MANY_REQUESTS, "application/problem+json", body, extra)
}

async fn handle(
    State(app): State<Arc<App>>,
    ConnectInfo(addr): ConnectInfo<SocketAddr>,
    req: Request<Body>,
) -> Response<Body> {
    let path = req.uri().path().to_owned();
    if path == STATS_PATH && req.method() == Method::GET {
        return stats_page(&app);
    }
    let st = &app.stats;
    st.requests.fetch_add(1, Relaxed);
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return error_problem(StatusCode::PAYLOAD_TOO_LARGE, "Content Too Large", "at most 16777216 bytes", &path, &[]);
        }
    };
    let rules = app.rules.current();
    let mut extra = Vec::new();
    match rules.route_for(parts.method.as_str(), &path) {
        Some(route) => {
            let caller = caller_id(&parts.headers, &addr);
            let d = match make_key(&caller, &[&route.name]) {
                Ok(key) => app.limiters.decide(&key, route, rules.instances).await,
                Err(e) => Err(e),
            };
            let d = match d {
                Ok(d) => d,
                Err(e) => {
                    log(&format!("decision failed: {e}"));
                    return error_problem(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "Internal Server Error",
                        &e.to_string(),
                        &path,
                        &[],
                    );
                }
            };
            if d.source == Source::Panic {
                st.fallbacks.fetch_add(1, Relaxed);
            } else {
                st.redis_decisions.fetch_add(1, Relaxed);
            }
            extra = headers(&d);
            if !d.allowed {
                st.denied.fetch_add(1, Relaxed);
                return denied(&d, route, &path, &extra);
            }
            st.granted.fetch_add(1, Relaxed);
        }
        None => {
            st.unlimited.fetch_add(1, Relaxed);
        }
    }
    forward(&app, parts, body, addr, &path, &extra).await
}

async fn forward(
    app: &App,
    parts: axum::http::request::Parts,
    body: Bytes,
    addr: SocketAddr,
    path: &str,
    extra: &[(&'static str, String)],
) -> Response<Body> {
    let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let uri = match Uri::builder()
        .scheme("http")
        .authority(app.upstream.authority().map(|a| a.as_str()).unwrap_or("127.0.0.1"))
        .path_and_query(pq)
        .build()
    {
        Ok(u) => u,
        Err(e) => return error_problem(StatusCode::BAD_REQUEST, "Bad Request", &e.to_string(), path, &[]),
    };
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    let h = req.headers_mut();
    for (k, v) in &parts.headers {
        if !HOP_BY_HOP.contains(&k.as_str()) {
            h.append(k.clone(), v.clone());
        }
    }
    let client = addr.ip().to_canonical().to_string();
    let xff = match parts.headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prior) => format!("{prior}, {client}"),
        None => client,
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        h.insert("x-forwarded-for", v);
    }
    if let Some(host) = parts.headers.get(header::HOST) {
        h.insert("x-forwarded-host", host.clone());
    }
    let resp = match tokio::time::timeout(Duration::from_secs(30), app.client.request(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return upstream_failed(app, path, &e.to_string(), extra),
        Err(_) => return upstream_failed(app, path, "upstream timeout", extra),
    };
    let (rp, rb) = resp.into_parts();
    let mut out = Response::new(Body::new(rb.map_err(axum::Error::new)));
    *out.status_mut() = rp.status;
    for (k, v) in &rp.headers {
        if !HOP_BY_HOP.contains(&k.as_str()) {
            out.headers_mut().append(k.clone(), v.clone());
        }
    }
    add_headers(out.headers_mut(), extra);
    out
}

fn upstream_failed(app: &App, path: &str, why: &str, extra: &[(&'static str, String)]) -> Response<Body> {
    app.stats.upstream_errors.fetch_add(1, Relaxed);
    error_problem(StatusCode::BAD_GATEWAY, "Bad Gateway", &format!("upstream failed: {why}"), path, extra)
}

fn stats_page(app: &App) -> Response<Body> {
    let s = &app.stats;
    let m = app.limiters.rl.metrics();
    let rules = app.rules.current();
    let mut doc = Map::new();
    for (k, v) in [
        ("requests", &s.requests),
        ("granted", &s.granted),
        ("denied", &s.denied),
        ("unlimited", &s.unlimited),
        ("redis_decisions", &s.redis_decisions),
        ("fallbacks", &s.fallbacks),
        ("upstream_errors", &s.upstream_errors),
        ("rules_loads", &s.rules_loads),
        ("rules_errors", &s.rules_errors),
    ] {
        doc.insert(k.into(), v.load(Relaxed).into());
    }
    doc.insert("redis_errors".into(), m.failures.into());
    doc.insert("limiter".into(), metrics_json(&m));
    doc.insert("redis".into(), (if m.state.as_str() == "closed" { "up" } else { "down" }).into());
    doc.insert("backend".into(), app.limiters.rl.backend().map(|b| Value::from(b.as_str())).unwrap_or(Value::Null));
    doc.insert("instances".into(), rules.instances.into());
    doc.insert("routes".into(), Value::Array(rules.routes.iter().map(Route::describe).collect()));
    json_response(StatusCode::OK, "application/json", Value::Object(doc).to_string(), &[])
}

// ------------------------------------------------------------------- main

struct Opts {
    host: String,
    port: u16,
    upstream: String,
    redis: String,
    rules: String,
    timeout_ms: u64,
    retry_ms: u64,
    backend: Backend,
    lease_batch: u64,
}

const USAGE: &str = "usage: rl-gateway [--host H] [--port N] [--upstream URL] [--redis URL] [--rules FILE] \
[--redis-timeout-ms N] [--redis-retry-ms N] [--backend auto|module|lua] [--lease-batch N]";

fn die(msg: &str) -> ! {
    log(msg);
    std::process::exit(2);
}

fn parse_args() -> Opts {
    let default_rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../rules.json");
    let mut o = Opts {
        host: "127.0.0.1".into(),
        port: 8080,
        upstream: "http://127.0.0.1:9000".into(),
        redis: "redis://127.0.0.1:6379/0".into(),
        rules: default_rules.into(),
        timeout_ms: 50,
        retry_ms: 500,
        backend: Backend::Auto,
        lease_batch: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "-h" || a == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let (k, v) = match a.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (a.clone(), args.next().unwrap_or_else(|| die(&format!("{a} needs a value\n{USAGE}")))),
        };
        let num = |v: &str| v.parse::<u64>().unwrap_or_else(|_| die(&format!("{k}: not an integer >= 0: {v}")));
        match k.as_str() {
            "--host" => o.host = v,
            "--port" => o.port = u16::try_from(num(&v)).unwrap_or_else(|_| die("--port: at most 65535")),
            "--upstream" => o.upstream = v,
            "--redis" => o.redis = v,
            "--rules" => o.rules = v,
            "--redis-timeout-ms" => o.timeout_ms = num(&v),
            "--redis-retry-ms" => o.retry_ms = num(&v),
            "--lease-batch" => o.lease_batch = num(&v),
            "--backend" => {
                o.backend = match v.as_str() {
                    "auto" => Backend::Auto,
                    "module" => Backend::Module,
                    "lua" => Backend::Lua,
                    _ => die("--backend is auto, module or lua"),
                }
            }
            _ => die(&format!("unknown option {k}\n{USAGE}")),
        }
    }
    o
}

#[tokio::main]
async fn main() {
    let o = parse_args();
    let upstream: Uri = o.upstream.parse().unwrap_or_else(|_| die("--upstream must be http://host:port"));
    if upstream.scheme_str() != Some("http") || upstream.host().is_none() {
        die("--upstream must be http://host:port");
    }
    let stats = Arc::new(Stats::default());
    let rules =
        RulesFile::open(o.rules.clone(), stats.clone()).unwrap_or_else(|e| die(&format!("rules file {}: {e}", o.rules)));

    // A lazy connection manager: it connects on first use and reconnects in
    // the background; the library bounds every call by its own timeout.
    let client = redis::Client::open(o.redis.as_str()).unwrap_or_else(|e| die(&format!("--redis: {e}")));
    let cfg = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_millis(o.timeout_ms.max(500))))
        .set_max_delay(Duration::from_millis(o.retry_ms.max(50)));
    let conn = ConnectionManager::new_lazy_with_config(client, cfg).unwrap_or_else(|e| die(&format!("redis: {e}")));
    // Give the first connection a moment before taking traffic; if Redis is
    // down at start, serve anyway on the panic limits.
    let mut c = conn.clone();
    let ping = tokio::time::timeout(Duration::from_secs(2), redis::cmd("PING").query_async::<()>(&mut c)).await;
    let rl = RateLimit::new(
        conn,
        Options {
            timeout_ms: o.timeout_ms,
            backend: o.backend,
            breaker: Breaker {
                failures: 1,
                open_ms: o.retry_ms as f64,
                latency_budget_ms: o.timeout_ms as f64,
                ..Breaker::default()
            },
            strict: None,
        },
    )
    .unwrap_or_else(|e| die(&e.to_string()));
    if matches!(ping, Ok(Ok(()))) {
        // the backend, once; otherwise the first decision finds it
        if let Err(e) = rl.detect().await {
            log(&format!("redis: {e}"));
        }
    } else {
        log("redis unavailable at start; panic limits until it answers");
    }

    let app = Arc::new(App {
        stats,
        rules: rules.clone(),
        limiters: Limiters { rl, lease_batch: o.lease_batch, map: Mutex::new(HashMap::new()) },
        upstream,
        client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
    });
    tokio::spawn(rules.clone().watch(Duration::from_millis(200)));

    let listener = tokio::net::TcpListener::bind((o.host.as_str(), o.port))
        .await
        .unwrap_or_else(|e| die(&format!("listen on {}:{}: {e}", o.host, o.port)));
    let local = listener.local_addr().map(|a| a.port()).unwrap_or(o.port);
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let router = axum::Router::new().fallback(handle).with_state(app.clone());
    log(&format!("listening on http://{}:{local} -> {}", o.host, o.upstream));
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .unwrap_or_else(|e| die(&format!("signal: {e}")));
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let server = axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>());
    tokio::select! {
        r = server => if let Err(e) = r { die(&format!("server: {e}")) },
        _ = shutdown => {}
    }
    // Leased: the reservoirs' units go back to the shared limit.
    app.limiters.close().await;
}
