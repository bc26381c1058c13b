//! The service against a real Redis or Valkey with the module
//! (REDIS_SERVER, RL_MODULE), through a gRPC client generated from Envoy's
//! protos and through `POST /json`. Every test starts its own server and
//! service (in-process: `server::start` with the settings of a map of
//! environment variables, as the binary's `main` does) on free ports, in a
//! temp dir, and stops them. The library's unit tests are in `units/`.

mod units;

// the Rust client's harness: servers, sentinels, clusters
#[path = "../../clients/rust/tests/common/mod.rs"]
mod common;

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
    redis: Option<Proc>,
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
        let rport = port();
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let redis = Proc(
            Command::new(bin)
                .args(["--port", &rport.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--loadmodule", &module()])
                .current_dir(std::env::temp_dir())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start REDIS_SERVER"),
        );
        wait_for("redis", Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", rport)).is_ok());
        Env::serve(name, &[config], extra_env, rport, Some(redis)).await
    }

    /// The service (one file per configuration) on Redis as `extra_env`
    /// says (REDIS_URL defaults to 127.0.0.1:`rport`).
    async fn serve(name: &str, configs: &[&str], extra_env: &[(&str, &str)], rport: u16, redis: Option<Proc>) -> Env {
        let dir = std::env::temp_dir().join(format!("rl-svc-{}-{name}-{}", std::process::id(), port()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // RUNTIME_ROOT is a symlink to a versioned directory, as deployments swap it
        for (i, config) in configs.iter().enumerate() {
            let file = if i == 0 { "config.yaml".to_owned() } else { format!("config{i}.yaml") };
            write(&dir.join("v1/ratelimit/config").join(file), config);
        }
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
        Env { dir, grpc, http, svc, redis_port: rport, redis }
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

// ---- Redis down, Redis Cluster, Sentinel -------------------------------

/// REDIS_TIMEOUT of the stall tests, and the slack the bound allows on top
/// of it (the gRPC round trip and scheduling on a loaded 2-core machine):
/// every answer while Redis is stopped comes within their sum.
const STALL_TIMEOUT_MS: u64 = 250;
const SLACK_MS: u64 = 250;

fn stall_env() -> [(&'static str, &'static str); 1] {
    [("REDIS_TIMEOUT", "250ms")]
}

fn sig(pid: u32, sig: i32) {
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// The sentinel and cluster tests start several servers: `make
/// test-service` runs them on one server line only (RL_SERVICE_TOPOLOGY=0
/// on the others); by default they run.
fn topology() -> bool {
    let on = std::env::var("RL_SERVICE_TOPOLOGY").map_or(true, |v| v != "0");
    if !on {
        println!("skipped: RL_SERVICE_TOPOLOGY=0 (run on another server line)");
    }
    on
}

type Grpc = RateLimitServiceClient<tonic::transport::Channel>;

/// One gRPC call, timed.
async fn timed(c: &mut Grpc, r: RateLimitRequest) -> (Result<RateLimitResponse, tonic::Status>, Duration) {
    let t = Instant::now();
    let a = c.should_rate_limit(r).await.map(|a| a.into_inner());
    (a, t.elapsed())
}

fn within_bound(took: Duration, what: &str) {
    assert!(took <= Duration::from_millis(STALL_TIMEOUT_MS + SLACK_MS), "{what}: answered after {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_is_unavailable_within_redis_timeout() {
    let e = Env::start("stall", CONFIG, &stall_env()).await;
    fresh_window(3_600_000, 20_000);
    let mut c = e.client().await;
    let site = || req("basic", vec![desc(&[("site", "")])]);
    assert_eq!(rem(&e.ask(site()).await.statuses[0]), (OK, 99));
    let pid = e.redis.as_ref().unwrap().0.id();
    sig(pid, libc::SIGSTOP);
    // the first calls wait REDIS_TIMEOUT, then the breaker opens and the
    // answer is at once: UNAVAILABLE either way, never later than the bound
    let mut worst = Duration::ZERO;
    for i in 0..8 {
        let (a, took) = timed(&mut c, site()).await;
        within_bound(took, &format!("call {i}"));
        worst = worst.max(took);
        assert_eq!(a.map(|a| a.overall_code).unwrap_err().code(), tonic::Code::Unavailable);
    }
    // /json: 400, as envoyproxy/ratelimit answers any error, within the bound too
    let t = Instant::now();
    let (st, _) = e.json(json!({"domain": "basic", "descriptors": [{"entries": [{"key": "site"}]}]})).await;
    within_bound(t.elapsed(), "/json");
    assert_eq!(st, 400);
    println!("Redis stopped: slowest answer {} ms (bound {STALL_TIMEOUT_MS} + {SLACK_MS} ms)", worst.as_millis());
    sig(pid, libc::SIGCONT);
    // decisions come from Redis again (polled: the breaker probes after 1 s)
    let t0 = Instant::now();
    let a = loop {
        let (a, took) = timed(&mut c, site()).await;
        within_bound(took, "after SIGCONT");
        if let Ok(a) = a {
            break a;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "no decision from Redis 15 s after SIGCONT");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(a.overall_code, OK);
    // counted in Redis: below the 99 left before (the calls abandoned by the
    // timeout were sent, and Redis may run them once it resumes)
    assert!(a.statuses[0].limit_remaining < 99, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_with_local_panic_limits() {
    let mut env = stall_env().to_vec();
    env.push(("PANIC_MODE", "local"));
    let e = Env::start("panic", CONFIG, &env).await;
    fresh_window(3_600_000, 30_000);
    let mut c = e.client().await;
    // a counter spent in Redis, which the local limits (fresh) would grant
    let big = |hits: u64| {
        let mut d = desc(&[("big", "x")]);
        d.limit = Some(RateLimitOverride { requests_per_unit: 1_000_000, unit: 3 });
        d.hits_addend = Some(UInt64Value { value: hits });
        req("basic", vec![d])
    };
    assert_eq!(rem(&e.ask(big(1_000_000)).await.statuses[0]), (OK, 0));
    assert_eq!(e.ask(big(1)).await.overall_code, OVER);
    let pid = e.redis.as_ref().unwrap().0.id();
    sig(pid, libc::SIGSTOP);
    let mut got = Vec::new();
    // user (2 per hour) limited locally at its own rate: 1, 0 left, then over
    for _ in 0..3 {
        let (a, took) = timed(&mut c, req("basic", vec![desc(&[("user", "p")])])).await;
        within_bound(took, "user");
        let a = a.unwrap();
        got.push((a.overall_code, rem(&a.statuses[0])));
    }
    assert_eq!(got, vec![(OK, (OK, 1)), (OK, (OK, 0)), (OVER, (OVER, 0))]);
    // two descriptors: all or nothing locally too (site keeps 98 when user q is over)
    let mut got = Vec::new();
    for _ in 0..3 {
        let (a, took) = timed(&mut c, req("basic", vec![desc(&[("site", "")]), desc(&[("user", "q")])])).await;
        within_bound(took, "site+user");
        let a = a.unwrap();
        got.push((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])));
    }
    assert_eq!(got, vec![(OK, (OK, 99), (OK, 1)), (OK, (OK, 98), (OK, 0)), (OVER, (OK, 98), (OVER, 0))]);
    // the spent counter: granted locally
    let (a, took) = timed(&mut c, big(1)).await;
    within_bound(took, "big");
    assert_eq!(a.unwrap().overall_code, OK);
    sig(pid, libc::SIGCONT);
    // polled until Redis decides again: it says OVER_LIMIT, the local limits would not
    let t0 = Instant::now();
    loop {
        let (a, took) = timed(&mut c, big(1)).await;
        within_bound(took, "after SIGCONT");
        if a.unwrap().overall_code == OVER {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "no decision from Redis 15 s after SIGCONT");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const DOMAIN_CONFIG: &str = r#"
domain: DOMAIN
descriptors:
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;

/// The atomic scenario of `two_descriptors_are_atomic`, in `domain`.
async fn atomic_in(e: &Env, domain: &str) {
    let both = |u: &str| req(domain, vec![desc(&[("site", "")]), desc(&[("user", u)])]);
    let ask = |r| e.ask(r);
    let mut got = Vec::new();
    for _ in 0..4 {
        let a = ask(both("bob")).await;
        got.push((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])));
    }
    assert_eq!(
        got,
        vec![(OK, (OK, 99), (OK, 1)), (OK, (OK, 98), (OK, 0)), (OVER, (OK, 98), (OVER, 0)), (OVER, (OK, 98), (OVER, 0))],
        "{domain}"
    );
    let a = ask(both("amy")).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 97), (OK, 1)), "{domain}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_requests_are_atomic_and_domains_spread() {
    if !topology() {
        return;
    }
    let nodes = common::start_cluster(3).await;
    // a domain on each primary: the hash tag is the domain
    let mut domains: Vec<Option<String>> = vec![None; 3];
    for i in 0.. {
        let d = format!("dom{i}");
        let owner = common::slot_owner(&nodes, redis_ratelimit_client::key_slot(format!("x{{{d}}}y")));
        domains[owner].get_or_insert(d);
        if domains.iter().all(Option::is_some) {
            break;
        }
    }
    let domains: Vec<String> = domains.into_iter().map(Option::unwrap).collect();
    let configs: Vec<String> = domains.iter().map(|d| DOMAIN_CONFIG.replace("DOMAIN", d)).collect();
    let configs: Vec<&str> = configs.iter().map(String::as_str).collect();
    // two seeds of the three, as REDIS_URL lists them
    let url = format!("127.0.0.1:{},127.0.0.1:{}", nodes[0].port, nodes[1].port);
    let vars = [("REDIS_TYPE", "cluster"), ("REDIS_URL", url.as_str()), ("CACHE_KEY_PREFIX", "rl_")];
    let e = Env::serve("cluster", &configs, &vars, 0, None).await;
    fresh_window(3_600_000, 10_000);
    for d in &domains {
        atomic_in(&e, d).await;
    }
    // each node holds the keys of its domain, and only those
    for (n, d) in nodes.iter().zip(&domains) {
        let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut n.sync()).unwrap();
        keys.sort();
        let want = |u: &str| format!("rl_{{{d}}}_user_{u}_3600");
        assert_eq!(keys, vec![format!("rl_{{{d}}}_site__3600"), want("amy"), want("bob")], "node {}", n.port);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_is_followed() {
    if !topology() {
        return;
    }
    let mut primary = common::Server::start(true);
    let replica = common::Server::start_with(true, &["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let sentinels = common::Sentinel::start_three(primary.port).await;
    let url = std::iter::once("mymaster".to_owned())
        .chain(sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)))
        .collect::<Vec<_>>()
        .join(",");
    let mut vars = stall_env().to_vec();
    vars.extend([("REDIS_TYPE", "sentinel"), ("REDIS_URL", url.as_str())]);
    let e = Env::serve("sentinel", &[CONFIG], &vars, 0, None).await;
    fresh_window(3_600_000, 60_000);
    let mut c = e.client().await;
    let site = || req("basic", vec![desc(&[("site", "")])]);
    for left in [99, 98, 97] {
        assert_eq!(rem(&e.ask(site()).await.statuses[0]), (OK, left));
    }
    // every count on the replica before the kill
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut primary.sync()).unwrap();
    assert_eq!(acked, 1);
    primary.kill();
    let t0 = Instant::now();
    let mut unavailable = 0;
    let a = loop {
        let (a, took) = timed(&mut c, site()).await;
        within_bound(took, "during the failover");
        match a {
            Ok(a) => break a,
            Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        }
        unavailable += 1;
        assert!(t0.elapsed() < Duration::from_secs(60), "no failover within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("failover followed after {:.1} s, {unavailable} UNAVAILABLE answers", t0.elapsed().as_secs_f64());
    assert!(unavailable > 0, "the kill was seen");
    assert_eq!(common::role(&replica), "master");
    // the promoted replica goes on from the replicated count
    assert_eq!(rem(&a.statuses[0]), (OK, 96));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_allow_and_deny() {
    let mut env = stall_env().to_vec();
    env.push(("PANIC_MODE", "allow"));
    let open = Env::start("allow", CONFIG, &env).await;
    let url = format!("127.0.0.1:{}", open.redis_port);
    let closed = Env::serve(
        "deny",
        &[CONFIG],
        &[("REDIS_TIMEOUT", "250ms"), ("PANIC_MODE", "deny"), ("REDIS_URL", url.as_str())],
        open.redis_port,
        None,
    )
    .await;
    fresh_window(3_600_000, 10_000);
    let both = || req("basic", vec![desc(&[("site", "")]), desc(&[("user", "a")])]);
    let a = closed.ask(both()).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 99), (OK, 1)));
    sig(open.redis.as_ref().unwrap().0.id(), libc::SIGSTOP);
    let (mut c_open, mut c_closed) = (open.client().await, closed.client().await);
    for _ in 0..2 {
        // fail open: OK, the full limits left; fail closed: every limited descriptor over
        let (a, took) = timed(&mut c_open, both()).await;
        within_bound(took, "allow");
        let a = a.unwrap();
        assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 100), (OK, 2)));
        let (a, took) = timed(&mut c_closed, both()).await;
        within_bound(took, "deny");
        let a = a.unwrap();
        assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OVER, (OVER, 0), (OVER, 0)));
    }
    sig(open.redis.as_ref().unwrap().0.id(), libc::SIGCONT);
}
