//! The service against a real Redis or Valkey with the module
//! (REDIS_SERVER, RL_MODULE), through a gRPC client generated from Envoy's
//! protos and through `POST /json`. Every test starts its own server and
//! service (in-process: `server::start` with the settings of a map of
//! environment variables, as the binary's `main` does) on free ports, in a
//! temp dir, and stops them. The library's unit tests are in `units/`.

mod units;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use redis_ratelimit_service::server;
use redis_ratelimit_service::settings::Settings;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OK: i32 = 1;
const OVER: i32 = 2;

fn port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn module() -> String {
    std::env::var("RL_MODULE").unwrap_or_else(|_| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/libredis_ratelimit.so").to_string_lossy().into()
    })
}

/// A process killed when dropped.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A redis-server (or valkey-server) with the module, and the service on it.
struct Env {
    dir: PathBuf,
    grpc: u16,
    http: u16,
    svc: server::Running,
    redis_port: u16,
    _redis: Proc,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.svc.task.abort();
        // the server is killed right after (its field); it keeps no files
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    // write then rename: the reloader never sees half a file
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

impl Env {
    async fn start(name: &str, config: &str, extra_env: &[(&str, &str)]) -> Env {
        let dir = std::env::temp_dir().join(format!("rl-svc-{}-{name}-{}", std::process::id(), port()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rport = port();
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let redis = Proc(
            Command::new(bin)
                .args(["--port", &rport.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--loadmodule", &module()])
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start REDIS_SERVER"),
        );
        wait_for("redis", Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", rport)).is_ok());
        // RUNTIME_ROOT is a symlink to a versioned directory, as deployments swap it
        write(&dir.join("v1/ratelimit/config/config.yaml"), config);
        std::os::unix::fs::symlink(dir.join("v1"), dir.join("current")).unwrap();
        let mut vars: HashMap<String, String> = [
            ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
            ("REDIS_URL", format!("127.0.0.1:{rport}")),
            ("REDIS_TIMEOUT", "2s".to_owned()),
            ("GRPC_HOST", "127.0.0.1".to_owned()),
            ("GRPC_PORT", "0".to_owned()),
            ("HOST", "127.0.0.1".to_owned()),
            ("PORT", "0".to_owned()),
            ("RUNTIME_ROOT", dir.join("current").to_string_lossy().into_owned()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
            ("RUNTIME_APPDIRECTORY", "config".to_owned()),
            ("RUNTIME_POLL_INTERVAL", "20ms".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        for (k, v) in extra_env {
            vars.insert((*k).to_owned(), (*v).to_owned());
        }
        let svc = server::start(Settings::from_map(&vars).unwrap()).await.unwrap();
        let (grpc, http) = (svc.grpc_addr.port(), svc.http_addr.port());
        Env { dir, grpc, http, svc, redis_port: rport, _redis: redis }
    }

    /// A direct connection to the server (to look at the keys the service wrote).
    fn redis(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.redis_port)).unwrap().get_connection().unwrap()
    }

    fn refusal(&self) -> Option<String> {
        self.svc.service.last_refusal()
    }

    async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc)).await.unwrap()
    }

    async fn ask(&self, req: RateLimitRequest) -> RateLimitResponse {
        self.client().await.should_rate_limit(req).await.unwrap().into_inner()
    }

    /// An HTTP/1.1 request on a fresh connection: (status, body).
    async fn http(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.http)).await.unwrap();
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        (status, body)
    }

    async fn json(&self, req: Value) -> (u16, Value) {
        let (st, body) = self.http("POST", "/json", &req.to_string()).await;
        (st, serde_json::from_str(&body).unwrap_or(Value::String(body)))
    }
}

fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
        ..RateLimitDescriptor::default()
    }
}

fn req(domain: &str, ds: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest { domain: domain.into(), descriptors: ds, hits_addend: 0 }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Waits (polling the clock) until at least `margin_ms` remain in the
/// current window of `window_ms`, so that a few calls share one window.
fn fresh_window(window_ms: u64, margin_ms: u64) {
    wait_for("a fresh window", Duration::from_millis(window_ms + 100), || window_ms - now_ms() % window_ms >= margin_ms);
}

fn rem(s: &DescriptorStatus) -> (i32, u32) {
    (s.code, s.limit_remaining)
}

const CONFIG: &str = r#"
domain: basic
descriptors:
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 5, name: minute_five}
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 10, name: tenant_base}
  - key: vip
    rate_limit: {unit: hour, requests_per_unit: 1000, name: vip, replaces: [{name: tenant_base}]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_match_per_second_per_minute_and_json() {
    let e = Env::start("basic", CONFIG, &[]).await;
    // a domain with no configuration, and a descriptor with no limit: OK, nothing else
    for r in [req("nope", vec![desc(&[("per_second", "")])]), req("basic", vec![desc(&[("unknown", "x")])])] {
        let a = e.ask(r).await;
        assert_eq!(a.overall_code, OK);
        assert_eq!(a.statuses.len(), 1);
        assert_eq!((a.statuses[0].code, a.statuses[0].current_limit.clone(), a.statuses[0].limit_remaining), (OK, None, 0));
    }
    // 3 per second: 2, 1, 0 left, then OVER_LIMIT; one second to the reset
    fresh_window(1000, 600);
    let mut got = Vec::new();
    for _ in 0..4 {
        let a = e.ask(req("basic", vec![desc(&[("per_second", "a")])])).await;
        got.push((a.overall_code, rem(&a.statuses[0])));
        let s = &a.statuses[0];
        assert_eq!(s.duration_until_reset.unwrap().seconds, 1);
        let l = s.current_limit.clone().unwrap();
        assert_eq!((l.requests_per_unit, l.unit, l.name.as_str()), (3, 1, ""));
    }
    assert_eq!(got, vec![(OK, (OK, 2)), (OK, (OK, 1)), (OK, (OK, 0)), (OVER, (OVER, 0))]);
    // and the next second starts afresh
    let second = now_ms() / 1000;
    wait_for("the next second", Duration::from_secs(2), || now_ms() / 1000 > second);
    let a = e.ask(req("basic", vec![desc(&[("per_second", "a")])])).await;
    assert_eq!(rem(&a.statuses[0]), (OK, 2));

    // 5 per minute through /json: 200 with 4 … 0 left, then 429
    fresh_window(60_000, 5_000);
    let body = json!({"domain": "basic", "descriptors": [{"entries": [{"key": "per_minute", "value": "u1"}]}]});
    for left in (0..5).rev() {
        let (st, v) = e.json(body.clone()).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["overallCode"], "OK");
        let s = &v["statuses"][0];
        assert_eq!(s["currentLimit"], json!({"name": "minute_five", "requestsPerUnit": 5, "unit": "MINUTE"}));
        assert_eq!(s["limitRemaining"].as_u64().unwrap_or(0), left);
        let reset: u64 = s["durationUntilReset"].as_str().unwrap().trim_end_matches('s').parse().unwrap();
        assert!((1..=60).contains(&reset), "{reset}");
    }
    let (st, v) = e.json(body.clone()).await;
    assert_eq!(
        (st, v["overallCode"].as_str(), v["statuses"][0]["code"].as_str()),
        (429, Some("OVER_LIMIT"), Some("OVER_LIMIT"))
    );
    assert!(v["statuses"][0].get("limitRemaining").is_none(), "0 is left out in proto3 JSON: {v}");

    // duration_until_reset falls with time (polled, not slept)
    let first =
        e.ask(req("basic", vec![desc(&[("per_minute", "u2")])])).await.statuses[0].duration_until_reset.unwrap().seconds;
    let mut later = first;
    let t0 = Instant::now();
    while later == first && t0.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        later =
            e.ask(req("basic", vec![desc(&[("per_minute", "u3")])])).await.statuses[0].duration_until_reset.unwrap().seconds;
    }
    assert!(later == first - 1 || (first == 1 && later == 60), "{first} then {later}");

    // bad requests: 400 on /json, INVALID_ARGUMENT on gRPC
    assert_eq!(e.json(json!({"domain": "", "descriptors": [{"entries": [{"key": "a"}]}]})).await.0, 400);
    assert_eq!(e.json(json!({"domain": "basic"})).await.0, 400);
    assert_eq!(e.json(json!({"domain": "basic", "bogus": 1})).await.0, 400);
    assert_eq!(e.http("POST", "/json", "{").await.0, 400);
    let err = e.client().await.should_rate_limit(req("basic", vec![])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(e.http("GET", "/healthcheck", "").await, (200, "OK".into()));
    // the gRPC health service answers SERVING
    let ch =
        tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{}", e.grpc)).unwrap().connect().await.unwrap();
    let h = tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(h.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_descriptors_are_atomic() {
    let e = Env::start("atomic", CONFIG, &[]).await;
    fresh_window(3_600_000, 10_000);
    let both = || req("basic", vec![desc(&[("site", "")]), desc(&[("user", "bob")])]);
    let a = e.ask(both()).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 99), (OK, 1)));
    let a = e.ask(both()).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 98), (OK, 0)));
    // user is over: the request is denied and site's count does not move
    // (envoyproxy/ratelimit's INCRBY pipeline would have taken one: 97)
    for _ in 0..3 {
        let a = e.ask(both()).await;
        assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OVER, (OK, 98), (OVER, 0)));
    }
    let a = e.ask(req("basic", vec![desc(&[("site", "")])])).await;
    assert_eq!(rem(&a.statuses[0]), (OK, 97));
    // another user is not affected
    let a = e.ask(req("basic", vec![desc(&[("site", "")]), desc(&[("user", "amy")])])).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 96), (OK, 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_replaces_shadow_unlimited() {
    let e = Env::start("features", CONFIG, &[]).await;
    fresh_window(3_600_000, 10_000);
    // share_threshold: /api/a and /api/b share one counter of 2
    let p = |v: &str| req("basic", vec![desc(&[("path", v)])]);
    assert_eq!(rem(&e.ask(p("/api/a")).await.statuses[0]), (OK, 1));
    assert_eq!(rem(&e.ask(p("/api/b")).await.statuses[0]), (OK, 0));
    assert_eq!(e.ask(p("/api/c")).await.overall_code, OVER);

    // replaces: vip replaces tenant_base, which then neither counts nor answers a limit
    let a = e.ask(req("basic", vec![desc(&[("tenant", "t1")]), desc(&[("vip", "t1")])])).await;
    assert_eq!(a.overall_code, OK);
    assert_eq!((a.statuses[0].code, a.statuses[0].current_limit.is_none()), (OK, true));
    assert_eq!(rem(&a.statuses[1]), (OK, 999));
    assert_eq!(rem(&e.ask(req("basic", vec![desc(&[("tenant", "t1")])])).await.statuses[0]), (OK, 9));

    // shadow mode: over its limit the descriptor still answers OK
    let s = || req("basic", vec![desc(&[("shadow", "x")]), desc(&[("site", "")])]);
    let a = e.ask(s()).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 0), (OK, 99)));
    // the shadow limit is spent: the request passes, and the enforced limit still counts it
    let a = e.ask(s()).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 0), (OK, 98)));

    // unlimited: OK, limit_remaining u32::MAX, no current limit, every time
    for _ in 0..3 {
        let a = e.ask(req("basic", vec![desc(&[("free", "x")])])).await;
        assert_eq!(
            (a.overall_code, a.statuses[0].limit_remaining, a.statuses[0].current_limit.is_none()),
            (OK, u32::MAX, true)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_and_the_limit_override() {
    let e = Env::start("hits", CONFIG, &[]).await;
    fresh_window(3_600_000, 10_000);
    let user = |hits: Option<u64>| {
        let mut d = desc(&[("user", "h")]);
        d.hits_addend = hits.map(|value| UInt64Value { value });
        d
    };
    // the request's hits_addend 0 means 1
    let a = e.ask(RateLimitRequest { hits_addend: 0, ..req("basic", vec![user(None)]) }).await;
    assert_eq!(rem(&a.statuses[0]), (OK, 1));
    // a descriptor's 0 checks without counting
    for _ in 0..3 {
        let a = e.ask(RateLimitRequest { hits_addend: 5, ..req("basic", vec![user(Some(0))]) }).await;
        assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 1)));
    }
    // the request's hits_addend (2) is more than what is left: denied, nothing taken
    let a = e.ask(RateLimitRequest { hits_addend: 2, ..req("basic", vec![user(None)]) }).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0])), (OVER, (OVER, 0)));
    // the descriptor's 1 overrides the request's 7
    let a = e.ask(RateLimitRequest { hits_addend: 7, ..req("basic", vec![user(Some(1))]) }).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 0)));
    // now nothing is left: a check says so
    let a = e.ask(req("basic", vec![user(Some(0))])).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0])), (OVER, (OVER, 0)));
    // per-descriptor hits in one request: site takes 10, another user 1
    let mut site = desc(&[("site", "")]);
    site.hits_addend = Some(UInt64Value { value: 10 });
    let a = e.ask(req("basic", vec![site, desc(&[("user", "other")])])).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 90), (OK, 1)));

    // the limit override: 2 per hour instead of the configured 3 per second
    let over = || {
        let mut d = desc(&[("per_second", "o")]);
        d.limit = Some(RateLimitOverride { requests_per_unit: 2, unit: 3 });
        req("basic", vec![d])
    };
    let a = e.ask(over()).await;
    let l = a.statuses[0].current_limit.clone().unwrap();
    assert_eq!((l.requests_per_unit, l.unit, rem(&a.statuses[0])), (2, 3, (OK, 1)));
    assert_eq!(rem(&e.ask(over()).await.statuses[0]), (OK, 0));
    assert_eq!(e.ask(over()).await.overall_code, OVER);
    // an override with no unit is refused
    let mut d = desc(&[("per_second", "o")]);
    d.limit = Some(RateLimitOverride { requests_per_unit: 2, unit: 0 });
    assert_eq!(
        e.client().await.should_rate_limit(req("basic", vec![d])).await.unwrap_err().code(),
        tonic::Code::InvalidArgument
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_and_global_shadow_mode() {
    let e = Env::start(
        "headers",
        CONFIG,
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true"), ("LIMIT_REMAINING_HEADER", "X-Left"), ("SHADOW_MODE", "true")],
    )
    .await;
    fresh_window(3_600_000, 10_000);
    let both = || req("basic", vec![desc(&[("site", "")]), desc(&[("user", "hd")])]);
    let hdrs = |a: &RateLimitResponse| {
        a.response_headers_to_add.iter().map(|h| (h.key.clone(), h.value.clone())).collect::<Vec<_>>()
    };
    let a = e.ask(both()).await;
    let h = hdrs(&a);
    assert_eq!(h[0], ("RateLimit-Limit".into(), "2".into()));
    assert_eq!(h[1], ("X-Left".into(), "1".into()));
    assert_eq!(h[2].0, "RateLimit-Reset");
    let reset: u64 = h[2].1.parse().unwrap();
    assert!((1..=3600).contains(&reset));
    e.ask(both()).await;
    // over the limit, but SHADOW_MODE: the descriptor says OVER_LIMIT, the request OK
    let a = e.ask(both()).await;
    assert_eq!((a.overall_code, a.statuses[1].code), (OK, OVER));
    assert_eq!(hdrs(&a)[1], ("X-Left".into(), "0".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_on_change_and_symlink_swap_refusing_bad_files() {
    let one = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let e = Env::start("reload", one, &[]).await;
    fresh_window(3_600_000, 20_000);
    let ask = || e.ask(req("r", vec![desc(&[("k", "v")])]));
    let limit_now = |a: RateLimitResponse| a.statuses[0].current_limit.clone().map(|l| l.requests_per_unit);
    assert_eq!(limit_now(ask().await), Some(1));
    // the file changes: 5 per hour
    let path = e.dir.join("v1/ratelimit/config/config.yaml");
    write(&path, &one.replace("requests_per_unit: 1", "requests_per_unit: 5"));
    let t0 = Instant::now();
    while limit_now(ask().await) != Some(5) {
        assert!(t0.elapsed() < Duration::from_secs(10), "the change was not loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // a bad file is refused with its error; the last good configuration stays live
    write(
        &e.dir.join("v1/ratelimit/config/bad.yaml"),
        "domain: r2\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let t0 = Instant::now();
    while e.refusal().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the bad file was not refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let why = e.refusal().unwrap();
    assert!(why.contains("ratelimit/config/bad.yaml") || why.contains("bad.yaml"), "{why}");
    assert!(why.contains("invalid rate limit unit 'fortnight'"), "{why}");
    assert_eq!(limit_now(ask().await), Some(5));
    // a symlink swap to another version of the directory
    write(&e.dir.join("v2/ratelimit/config/config.yaml"), &one.replace("requests_per_unit: 1", "requests_per_unit: 7"));
    std::os::unix::fs::symlink(e.dir.join("v2"), e.dir.join("next")).unwrap();
    std::fs::rename(e.dir.join("next"), e.dir.join("current")).unwrap();
    let t0 = Instant::now();
    while limit_now(ask().await) != Some(7) {
        assert!(t0.elapsed() < Duration::from_secs(10), "the swap was not loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_first_config_or_no_redis_is_refused() {
    let e = Env::start("first", CONFIG, &[]).await;
    write(&e.dir.join("v1/ratelimit/config/config.yaml"), "domain: x\nbogus: 1\n");
    let mut vars: HashMap<String, String> = HashMap::new();
    for (k, v) in [
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{}", e.redis_port)),
        ("GRPC_PORT", "0".to_owned()),
        ("PORT", "0".to_owned()),
        ("RUNTIME_ROOT", e.dir.join("current").to_string_lossy().into_owned()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
    ] {
        vars.insert(k.to_owned(), v);
    }
    let err = server::start(Settings::from_map(&vars).unwrap()).await.err().unwrap();
    assert!(err.contains("config refused") && err.contains("unknown key 'bogus'"), "{err}");
    vars.insert("REDIS_URL".into(), format!("127.0.0.1:{}", port()));
    vars.insert("REDIS_TIMEOUT".into(), "200ms".into());
    let err = server::start(Settings::from_map(&vars).unwrap()).await.err().unwrap();
    assert!(err.contains("connecting to Redis"), "{err}");
}

/// The extension keys (issue 32 point 3; service/README.md "Extension keys").
const EXT_CONFIG: &str = r#"
domain: ext
descriptors:
  - key: tb
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 2, burst: 4}
  - key: log
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: 3}
  - key: ctr
    rate_limit: {algorithm: sliding_counter, unit: hour, requests_per_unit: 3}
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: fast
    rate_limit: {window_ms: 400, requests_per_unit: 2}
"#;

fn type_of(r: &mut redis::Connection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query::<String>(r).unwrap()
}

fn reset_s(a: &RateLimitResponse, i: usize) -> i64 {
    a.statuses[i].duration_until_reset.unwrap().seconds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_burst_and_its_reset() {
    let e = Env::start("tb", EXT_CONFIG, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]).await;
    let ask = || e.ask(req("ext", vec![desc(&[("tb", "u1")])]));
    // 2 an hour with a burst of 4: 4 pass at once (a fixed window of 2
    // would pass 2), then OVER_LIMIT
    let mut got = Vec::new();
    for _ in 0..5 {
        let a = ask().await;
        let l = a.statuses[0].current_limit.clone().unwrap();
        assert_eq!((l.requests_per_unit, l.unit), (2, 3));
        got.push((a.overall_code, rem(&a.statuses[0]), reset_s(&a, 0)));
    }
    // one token short: full again in 30 min
    assert_eq!(got[0], (OK, (OK, 3), 1800), "{got:?}");
    assert_eq!((got[1].1, got[2].1), ((OK, 2), (OK, 1)), "{got:?}");
    // empty: full again in 2 h; over the limit: one more token in 30 min
    assert!(got[3].1 == (OK, 0) && (7190..=7200).contains(&got[3].2), "{got:?}");
    assert!(got[4].0 == OVER && got[4].1 == (OVER, 0) && (1790..=1800).contains(&got[4].2), "{got:?}");
    // the headers follow the descriptor's numbers
    let a = ask().await;
    let h: Vec<(String, String)> = a.response_headers_to_add.iter().map(|h| (h.key.clone(), h.value.clone())).collect();
    assert_eq!(h[..2], [("RateLimit-Limit".into(), "2".into()), ("RateLimit-Remaining".into(), "0".into())]);
    assert_eq!(h[2], ("RateLimit-Reset".into(), reset_s(&a, 0).to_string()));
    assert_eq!(type_of(&mut e.redis(), "{ext}_tb_u1_3600_tb"), "rl-tokbkt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_windows_count_down() {
    let e = Env::start("sliding", EXT_CONFIG, &[]).await;
    fresh_window(3_600_000, 10_000);
    // 3 an hour: 2, 1, 0 left, then OVER_LIMIT
    for (k, t) in [("log", "rl-slilog"), ("ctr", "rl-slicnt")] {
        let mut got = Vec::new();
        for _ in 0..4 {
            let a = e.ask(req("ext", vec![desc(&[(k, "u1")])])).await;
            got.push((rem(&a.statuses[0]), reset_s(&a, 0)));
        }
        let codes: Vec<_> = got.iter().map(|g| g.0).collect();
        assert_eq!(codes, [(OK, 2), (OK, 1), (OK, 0), (OVER, 0)], "{k}");
        if k == "log" {
            // over the limit: one more fits when the oldest grant leaves the hour
            assert!((3590..=3600).contains(&got[3].1), "{got:?}");
        }
        let key = format!("{{ext}}_{k}_u1_3600_{}", if k == "log" { "sl" } else { "sc" });
        assert_eq!(type_of(&mut e.redis(), &key), t);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_algorithms_are_atomic() {
    let e = Env::start("mixed", EXT_CONFIG, &[]).await;
    fresh_window(3_600_000, 10_000);
    // four algorithms in one request, one RL.MULTI: all or nothing
    let mixed = |with_log: bool| {
        let mut ds = vec![desc(&[("tb", "m")]), desc(&[("ctr", "m")]), desc(&[("site", "")])];
        if with_log {
            ds.push(desc(&[("log", "m")]));
        }
        req("ext", ds)
    };
    let st = |a: &RateLimitResponse| a.statuses.iter().map(rem).collect::<Vec<_>>();
    let a = e.ask(mixed(true)).await;
    assert_eq!((a.overall_code, st(&a)), (OK, vec![(OK, 3), (OK, 2), (OK, 99), (OK, 2)]));
    e.ask(req("ext", vec![desc(&[("log", "m")])])).await;
    e.ask(req("ext", vec![desc(&[("log", "m")])])).await;
    // the sliding log is spent: denied, and nothing taken from the other three
    for _ in 0..2 {
        let a = e.ask(mixed(true)).await;
        assert_eq!((a.overall_code, st(&a)), (OVER, vec![(OK, 3), (OK, 2), (OK, 99), (OVER, 0)]));
    }
    let a = e.ask(mixed(false)).await;
    assert_eq!((a.overall_code, st(&a)), (OK, vec![(OK, 2), (OK, 1), (OK, 98)]));
    // a limit override on the sliding counter's descriptor is a fixed window
    // of its unit: another key (a shared one would answer WRONGTYPE)
    let mut d = desc(&[("ctr", "m")]);
    d.limit = Some(RateLimitOverride { requests_per_unit: 5, unit: 3 });
    let a = e.ask(req("ext", vec![d])).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 4)));
    let mut r = e.redis();
    for (k, t) in [
        ("{ext}_tb_m_3600_tb", "rl-tokbkt"),
        ("{ext}_ctr_m_3600_sc", "rl-slicnt"),
        ("{ext}_site__3600", "rl-fixwin"),
        ("{ext}_log_m_3600_sl", "rl-slilog"),
        ("{ext}_ctr_m_3600", "rl-fixwin"),
    ] {
        assert_eq!(type_of(&mut r, k), t, "{k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_in_ms_resets() {
    let e = Env::start("ms", EXT_CONFIG, &[]).await;
    let ask = || e.ask(req("ext", vec![desc(&[("fast", "x")])]));
    // 2 per 400 ms, epoch-aligned: 1, 0 left, then OVER_LIMIT in the same window
    fresh_window(400, 300);
    let mut got = Vec::new();
    for _ in 0..3 {
        let a = ask().await;
        let s = &a.statuses[0];
        let l = s.current_limit.clone().unwrap();
        // no unit is 400 ms: UNKNOWN (0); the reset rounds up to 1 s
        assert_eq!((l.requests_per_unit, l.unit, s.duration_until_reset.unwrap().seconds), (2, 0, 1));
        got.push(rem(s));
    }
    assert_eq!(got, [(OK, 1), (OK, 0), (OVER, 0)]);
    // the module keeps the window: the key expires at its end, within 400 ms
    let pttl: i64 = redis::cmd("PTTL").arg("{ext}_fast_x_400ms").query(&mut e.redis()).unwrap();
    assert!((1..=400).contains(&pttl), "{pttl}");
    // and the next window starts afresh (polled)
    let t0 = Instant::now();
    loop {
        let a = ask().await;
        if a.overall_code == OK {
            assert_eq!(rem(&a.statuses[0]), (OK, 1));
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(2), "the 400 ms window did not reset");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
