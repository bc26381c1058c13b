//! The service against a real Redis or Valkey with the module
//! (REDIS_SERVER, RL_MODULE), through a gRPC client generated from Envoy's
//! protos and through `POST /json`. Every test starts its own server and
//! service (in-process: `server::start` with the settings of a map of
//! environment variables, as the binary's `main` does) on free ports, in a
//! temp dir, and stops them. The library's unit tests are in `units/`.

mod tls;
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
        Env::start_with(name, config, extra_env, &[]).await
    }

    /// [`Env::start`] with more arguments for the server.
    async fn start_with(name: &str, config: &str, extra_env: &[(&str, &str)], server_args: &[&str]) -> Env {
        let rport = port();
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let redis = Proc(
            Command::new(bin)
                .args(["--port", &rport.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--loadmodule", &module()])
                .args(server_args)
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
        Env::try_serve(name, configs, extra_env, rport, redis).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Env::serve`], or the error of the settings or of the start (what
    /// the binary prints before it exits 2 or 1).
    async fn try_serve(
        name: &str,
        configs: &[&str],
        extra_env: &[(&str, &str)],
        rport: u16,
        redis: Option<Proc>,
    ) -> Result<Env, String> {
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
        let started = match Settings::from_map(&vars) {
            Ok(settings) => server::start(settings).await,
            Err(e) => Err(format!("settings: {e}")),
        };
        let svc = started.inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        let (grpc, http) = (svc.grpc_addr.port(), svc.http_addr.port());
        Ok(Env { dir, grpc, http, svc, redis_port: rport, redis })
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
    // A port held bound but not listening, so that no other test's server
    // can take it meanwhile: connecting to it is refused. (A port only
    // found free could be bound by a server of a test running alongside.)
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    vars.insert("REDIS_URL".into(), format!("127.0.0.1:{}", held.local_addr().unwrap().port()));
    vars.insert("REDIS_TIMEOUT".into(), "200ms".into());
    let err = server::start(Settings::from_map(&vars).unwrap()).await.err().unwrap();
    assert!(err.contains("connecting to Redis"), "{err}");
}

/// `GET path` on the Prometheus listener: every sample as `name{labels}` → value.
async fn scrape(e: &Env, path: &str) -> HashMap<String, f64> {
    let addr = e.svc.metrics_addr.expect("USE_PROMETHEUS=true binds a listener");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{out}");
    let body = out.split_once("\r\n\r\n").unwrap().1;
    let mut m = HashMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (k, v) = line.rsplit_once(' ').unwrap();
        assert!(m.insert(k.to_owned(), v.parse::<f64>().unwrap()).is_none(), "a sample twice: {line}");
    }
    m
}

const METRICS_CONFIG: &str = r#"
domain: m
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: api
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 50}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_metrics_count_what_requests_did() {
    let mut e = Env::start(
        "metrics",
        METRICS_CONFIG,
        &[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "127.0.0.1:0"),
            ("PROMETHEUS_PATH", "/stats"),
            ("REDIS_TIMEOUT", "300ms"),
        ],
    )
    .await;
    fresh_window(3_600_000, 10_000);
    let user = r#"ratelimit_service_rate_limit_{}{domain="m",key1="user"}"#;
    let get = |m: &HashMap<String, f64>, name: &str, tmpl: &str| m.get(&tmpl.replace("{}", name)).copied().unwrap_or(0.0);
    let m0 = scrape(&e, "/stats").await;
    assert_eq!(m0["ratelimit_service_config_load_success"], 1.0);
    assert_eq!(m0["ratelimit_service_config_load_error"], 0.0);
    assert_eq!(get(&m0, "total_hits", user), 0.0);

    // user: 5 an hour, NEAR_LIMIT_RATIO 0.8: near from the 5th unit on
    for _ in 0..4 {
        assert_eq!(e.ask(req("m", vec![desc(&[("user", "u1")])])).await.overall_code, OK);
    }
    let m1 = scrape(&e, "/stats").await;
    assert_eq!(
        ["total_hits", "within_limit", "near_limit", "over_limit"].map(|n| get(&m1, n, user) - get(&m0, n, user)),
        [4.0, 4.0, 0.0, 0.0]
    );
    // 3 hits on another user: counts 0 → 3, not near; then 2 more: 3 → 5, one near (the 5th)
    let hits = |n: u32| RateLimitRequest { hits_addend: n, ..req("m", vec![desc(&[("user", "u2")])]) };
    e.ask(hits(3)).await;
    e.ask(hits(2)).await;
    // the 5th of u1: near; the 6th: over; then with site, denied by user: site takes nothing
    e.ask(req("m", vec![desc(&[("user", "u1")])])).await;
    assert_eq!(e.ask(req("m", vec![desc(&[("user", "u1")])])).await.overall_code, OVER);
    let a = e.ask(req("m", vec![desc(&[("site", "")]), desc(&[("user", "u1")])])).await;
    assert_eq!((a.overall_code, rem(&a.statuses[0])), (OVER, (OK, 100)));
    let m2 = scrape(&e, "/stats").await;
    assert_eq!(
        ["total_hits", "within_limit", "near_limit", "over_limit", "shadow_mode"]
            .map(|n| get(&m2, n, user) - get(&m1, n, user)),
        [3.0 + 2.0 + 1.0 + 1.0 + 1.0, 3.0 + 2.0 + 1.0, 1.0 + 1.0, 2.0, 0.0]
    );
    let site = r#"ratelimit_service_rate_limit_{}{domain="m",key1="site"}"#;
    assert_eq!(["total_hits", "within_limit", "over_limit"].map(|n| get(&m2, n, site)), [1.0, 1.0, 0.0]);

    // detailed_metric: one series per value (an IPv4 address's dots become _); nested: key2
    for v in ["t1", "t1", "10.0.0.1"] {
        e.ask(req("m", vec![desc(&[("tenant", v)])])).await;
    }
    e.ask(req("m", vec![desc(&[("api", "a"), ("method", "GET")])])).await;
    // shadow mode: the 2nd is over its limit, answered OK, counted over and shadow
    for _ in 0..2 {
        assert_eq!(e.ask(req("m", vec![desc(&[("shadow", "x")])])).await.overall_code, OK);
    }
    // an invalid request: a service error
    assert!(e.client().await.should_rate_limit(req("m", vec![])).await.is_err());
    let m3 = scrape(&e, "/stats").await;
    let t = r#"ratelimit_service_rate_limit_total_hits{domain="m",key1="tenant_t1"}"#;
    assert_eq!(m3[t], 2.0);
    assert_eq!(m3[r#"ratelimit_service_rate_limit_total_hits{domain="m",key1="tenant_10_0_0_1"}"#], 1.0);
    assert!(!m3.contains_key(r#"ratelimit_service_rate_limit_total_hits{domain="m",key1="tenant"}"#));
    assert_eq!(m3[r#"ratelimit_service_rate_limit_within_limit{domain="m",key1="api",key2="method"}"#], 1.0);
    let sh = r#"ratelimit_service_rate_limit_{}{domain="m",key1="shadow"}"#;
    assert_eq!(["total_hits", "within_limit", "over_limit", "shadow_mode"].map(|n| get(&m3, n, sh)), [2.0, 1.0, 1.0, 1.0]);
    assert_eq!(m3[r#"ratelimit_service_should_rate_limit_error{err_type="service_error"}"#], 1.0);
    assert_eq!(m3[r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"}"#], 0.0);
    // every call is in the histogram: 4 + 2 + 3 (user, site) + 3 + 1 + 2 + 1 (the invalid one) = 16
    let count = m3[r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#];
    assert_eq!(count, 16.0);
    let h = r#"ratelimit_service_response_time_seconds"#;
    assert_eq!(m3[&format!(r#"{h}_count{{grpc_method="ShouldRateLimit"}}"#)], count);
    assert_eq!(m3[&format!(r#"{h}_bucket{{grpc_method="ShouldRateLimit",le="+Inf"}}"#)], count);
    assert!(m3[&format!(r#"{h}_sum{{grpc_method="ShouldRateLimit"}}"#)] > 0.0);
    let buckets: Vec<f64> = redis_ratelimit_service::metrics::BUCKETS
        .iter()
        .map(|le| m3[&format!(r#"{h}_bucket{{grpc_method="ShouldRateLimit",le="{le}"}}"#)])
        .collect();
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]) && buckets[buckets.len() - 1] <= count, "{buckets:?}");
    assert!(m3["redis_ratelimit_client_redis_calls"] >= 13.0);

    // configuration loads: a bad file refused, then a good one loaded
    let bad = e.dir.join("v1/ratelimit/config/bad.yaml");
    write(&bad, "domain: b\nbogus: 1\n");
    wait_for("the refusal", Duration::from_secs(10), || e.refusal().is_some());
    std::fs::remove_file(&bad).unwrap();
    write(&e.dir.join("v1/ratelimit/config/more.yaml"), "domain: more\n");
    let t0 = Instant::now();
    while !e.svc.service.config().has_domain("more") {
        assert!(t0.elapsed() < Duration::from_secs(10), "the good file was not loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m4 = scrape(&e, "/stats").await;
    assert_eq!((m4["ratelimit_service_config_load_success"], m4["ratelimit_service_config_load_error"]), (2.0, 1.0));

    // Redis gone: the request is a Redis error, and the client counts the failed call
    let _ = e.redis.as_mut().unwrap().0.kill();
    let _ = e.redis.as_mut().unwrap().0.wait();
    let err = e.client().await.should_rate_limit(req("m", vec![desc(&[("user", "u3")])])).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    let m5 = scrape(&e, "/stats").await;
    assert_eq!(m5[r#"ratelimit_service_should_rate_limit_error{err_type="redis_error"}"#], 1.0);
    assert!(m5["redis_ratelimit_client_redis_failures"] >= 1.0);
    assert_eq!(m5["redis_ratelimit_client_decisions_unavailable"], 1.0);
    // a request without a decision counts in no limit's statistics
    assert_eq!(
        get(&m5, "total_hits", r#"ratelimit_service_rate_limit_{}{domain="m",key1="user"}"#),
        get(&m4, "total_hits", user)
    );
}

/// A mapping's member (`Value::Null` when absent).
fn at<'a>(v: &'a serde_yaml::Value, key: &str) -> &'a serde_yaml::Value {
    v.get(key).unwrap_or(&serde_yaml::Value::Null)
}

fn seq(v: &serde_yaml::Value) -> &[serde_yaml::Value] {
    v.as_sequence().map(Vec::as_slice).unwrap_or(&[])
}

fn s(v: &serde_yaml::Value) -> &str {
    v.as_str().unwrap_or("")
}

/// The descriptors Envoy's HTTP rate-limit filter sends for one request, read
/// from a bootstrap as Envoy documents it (route_components.proto,
/// `RateLimit.Action`): the first route whose prefix matches; each of its
/// `rate_limits` of the filter's stage is one descriptor, its actions' entries
/// in order; `generic_key` gives (`descriptor_key` or "generic_key",
/// `descriptor_value`), `remote_address` ("remote_address", the peer),
/// `request_headers` (`descriptor_key`, the header's value), and a missing
/// header drops the descriptor (unless `skip_if_absent`). Returns (domain,
/// the ratelimit cluster, descriptors).
fn envoy_descriptors(
    bootstrap: &serde_yaml::Value,
    path: &str,
    headers: &[(&str, &str)],
    peer: &str,
) -> (String, String, Vec<Vec<(String, String)>>) {
    let hcm = seq(at(at(bootstrap, "static_resources"), "listeners"))
        .iter()
        .flat_map(|l| seq(at(l, "filter_chains")))
        .flat_map(|c| seq(at(c, "filters")))
        .find(|f| s(at(f, "name")) == "envoy.filters.network.http_connection_manager")
        .map(|f| at(f, "typed_config"))
        .expect("an http_connection_manager");
    let filters = seq(at(hcm, "http_filters"));
    let rl = filters.iter().find(|f| s(at(f, "name")) == "envoy.filters.http.ratelimit").expect("the ratelimit filter");
    let rl = at(rl, "typed_config");
    assert_eq!(s(at(rl, "@type")), "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit");
    assert_eq!(s(at(at(rl, "rate_limit_service"), "transport_api_version")), "V3");
    assert_eq!(s(at(filters.last().unwrap(), "name")), "envoy.filters.http.router", "the router filter comes last");
    let stage = at(rl, "stage").as_u64().unwrap_or(0);
    let cluster = s(at(at(at(at(rl, "rate_limit_service"), "grpc_service"), "envoy_grpc"), "cluster_name")).to_owned();
    let route = seq(at(at(hcm, "route_config"), "virtual_hosts"))
        .iter()
        .flat_map(|vh| seq(at(vh, "routes")))
        .find(|r| path.starts_with(s(at(at(r, "match"), "prefix"))))
        .expect("a route");
    let header = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| (*v).to_owned());
    let mut out = Vec::new();
    'limits: for limit in seq(at(at(route, "route"), "rate_limits")) {
        if at(limit, "stage").as_u64().unwrap_or(0) != stage {
            continue;
        }
        let mut entries = Vec::new();
        for action in seq(at(limit, "actions")) {
            let (kind, a) = action.as_mapping().and_then(|m| m.iter().next()).expect("an action");
            match kind.as_str().unwrap() {
                "generic_key" => entries.push((
                    at(a, "descriptor_key").as_str().unwrap_or("generic_key").to_owned(),
                    s(at(a, "descriptor_value")).to_owned(),
                )),
                "remote_address" => entries.push(("remote_address".to_owned(), peer.to_owned())),
                "request_headers" => match header(s(at(a, "header_name"))) {
                    Some(v) => entries.push((s(at(a, "descriptor_key")).to_owned(), v)),
                    None if at(a, "skip_if_absent").as_bool() == Some(true) => {}
                    None => continue 'limits,
                },
                other => panic!("action {other} is not modelled here"),
            }
        }
        out.push(entries);
    }
    (s(at(rl, "domain")).to_owned(), cluster, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_example_descriptors_are_the_configs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/envoy");
    let bootstrap: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("envoy.yaml")).unwrap()).unwrap();
    let compose: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("compose.yaml")).unwrap()).unwrap();

    // the ratelimit cluster: HTTP/2 (gRPC) to the compose service "ratelimit" on GRPC_PORT
    let (domain, cluster, _) = envoy_descriptors(&bootstrap, "/", &[], "10.0.0.1");
    let c = seq(at(at(&bootstrap, "static_resources"), "clusters"))
        .iter()
        .find(|c| s(at(c, "name")) == cluster)
        .expect("the ratelimit filter's cluster is defined");
    let opts = at(at(c, "typed_extension_protocol_options"), "envoy.extensions.upstreams.http.v3.HttpProtocolOptions");
    assert!(at(at(opts, "explicit_http_config"), "http2_protocol_options").is_mapping(), "gRPC needs HTTP/2");
    let sock = at(
        at(at(&seq(at(&seq(at(at(c, "load_assignment"), "endpoints"))[0], "lb_endpoints"))[0], "endpoint"), "address"),
        "socket_address",
    );
    assert_eq!((s(at(sock, "address")), at(sock, "port_value").as_u64()), ("ratelimit", Some(8081)));

    // compose: this version's images, the service started as envoyproxy/ratelimit's, the config mounted
    let services = at(&compose, "services");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(s(at(at(services, "redis"), "image")), format!("redis-ratelimit:{version}-redis"));
    let svc = at(services, "ratelimit");
    assert_eq!(s(at(svc, "image")), format!("redis-ratelimit-service:{version}"));
    assert_eq!(s(at(svc, "command")), "/bin/ratelimit");
    assert!(seq(at(svc, "volumes")).iter().any(|v| s(v).starts_with("./config:/data/ratelimit/config")));
    let env: Vec<&str> = seq(at(svc, "environment")).iter().map(s).collect();
    for v in ["RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "REDIS_URL=redis:6379", "REDIS_SOCKET_TYPE=tcp"] {
        assert!(env.contains(&v), "{v} in {env:?}");
    }
    // the variables it sets are ones the service accepts
    let vars: HashMap<String, String> =
        env.iter().map(|kv| kv.split_once('=').unwrap()).map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    Settings::from_map(&vars).unwrap();
    assert!(seq(at(at(services, "envoy"), "volumes")).iter().any(|v| s(v).starts_with("./envoy.yaml:")));

    // the service on the example's configuration
    let files: Vec<_> = std::fs::read_dir(dir.join("config")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let e = Env::start("envoy-example", &std::fs::read_to_string(dir.join("config/config.yaml")).unwrap(), &[]).await;
    let ask = |ds: &[Vec<(String, String)>]| {
        let ds = ds.iter().map(|d| desc(&d.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect::<Vec<_>>())).collect();
        e.ask(req(&domain, ds))
    };
    let kv = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<Vec<_>>();
    // (requests_per_unit, unit, name) of each descriptor's status: every descriptor has a limit
    let limits = |a: &RateLimitResponse| {
        a.statuses
            .iter()
            .map(|s| s.current_limit.clone().map(|l| (l.requests_per_unit, l.unit, l.name)).expect("a configured limit"))
            .collect::<Vec<_>>()
    };
    // six calls in one minute: 2 s is plenty
    fresh_window(60_000, 2_000);
    const MINUTE: i32 = 2;

    // GET / without a user: the site and the address (the user's descriptor is dropped)
    let (_, _, ds) = envoy_descriptors(&bootstrap, "/", &[], "10.0.0.1");
    assert_eq!(ds, vec![kv(&[("generic_key", "site")]), kv(&[("remote_address", "10.0.0.1")])]);
    let a = ask(&ds).await;
    assert_eq!(limits(&a), vec![(1000, MINUTE, String::new()), (60, MINUTE, String::new())]);
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[1])), (OK, (OK, 999), (OK, 59)));

    // GET / with x-user-id: the user's 10 a minute too
    let (_, _, ds) = envoy_descriptors(&bootstrap, "/items", &[("X-User-Id", "bob")], "10.0.0.2");
    assert_eq!(ds[2], kv(&[("user", "bob")]));
    let a = ask(&ds).await;
    assert_eq!(limits(&a)[2], (10, MINUTE, String::new()));
    assert_eq!((a.overall_code, rem(&a.statuses[0]), rem(&a.statuses[2])), (OK, (OK, 998), (OK, 9)));

    // /upload: the nested route=upload, user descriptor, 2 a minute per user
    let (_, _, ds) = envoy_descriptors(&bootstrap, "/upload", &[("x-user-id", "alice")], "10.0.0.3");
    assert_eq!(ds.len(), 4);
    assert_eq!(ds[3], kv(&[("route", "upload"), ("user", "alice")]));
    let a = ask(&ds).await;
    assert_eq!(limits(&a)[3], (2, MINUTE, "upload_per_user".to_owned()));
    assert_eq!(a.statuses.iter().map(rem).collect::<Vec<_>>(), vec![(OK, 997), (OK, 59), (OK, 9), (OK, 1)]);
    let a = ask(&ds).await;
    assert_eq!(a.statuses.iter().map(rem).collect::<Vec<_>>(), vec![(OK, 996), (OK, 58), (OK, 8), (OK, 0)]);
    // the third upload is over the upload limit, and (atomic) takes nothing from the site, address or user
    let a = ask(&ds).await;
    assert_eq!(a.overall_code, OVER);
    assert_eq!(a.statuses.iter().map(rem).collect::<Vec<_>>(), vec![(OK, 996), (OK, 58), (OK, 8), (OVER, 0)]);
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

/// A slow Redis that answers within REDIS_TIMEOUT decides every request:
/// for 1.6 s the server sleeps 200 ms of every 205 (DEBUG SLEEP), and the
/// calls are 20 ms apart, so the p95 of the calls stays far above the
/// client's default latency budget (50 ms for 1 s), which opened the
/// breaker and answered
/// UNAVAILABLE; with REDIS_TIMEOUT as the budget, every answer is Redis's
/// decision and every unit is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_within_redis_timeout_still_decides() {
    let e = Env::start_with("slow", CONFIG, &[("REDIS_TIMEOUT", "1s")], &["--enable-debug-command", "yes"]).await;
    fresh_window(3_600_000, 10_000);
    let mut c = e.client().await;
    let site = || req("basic", vec![desc(&[("site", "")])]);
    assert_eq!(rem(&e.ask(site()).await.statuses[0]), (OK, 99));
    let mut admin = e.redis();
    let sleeper = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut pauses = 0;
        while t0.elapsed() < Duration::from_millis(1600) {
            let _: () = redis::cmd("DEBUG").arg("SLEEP").arg("0.2").query(&mut admin).unwrap();
            pauses += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        pauses
    });
    let (mut n, mut slow) = (0u32, 0u32);
    while !sleeper.is_finished() {
        let (a, took) = timed(&mut c, site()).await;
        n += 1;
        slow += u32::from(took > Duration::from_millis(50));
        let a = a.unwrap_or_else(|s| panic!("call {n} after {took:?}: {s:?}"));
        assert_eq!(rem(&a.statuses[0]), (OK, 99 - n), "call {n}");
        // past the 5 ms gap between sleeps: the next call lands in one
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pauses = sleeper.join().unwrap();
    println!("slow Redis: {n} calls, {slow} over 50 ms, {pauses} server sleeps of 200 ms: all decided");
    assert!(slow * 2 > n, "the sleeps did not slow most calls: {slow} of {n}");
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
        // one descriptor: one RL.FIXEDWINDOW, whose decision has no parts
        let one = || req("basic", vec![desc(&[("site", "")])]);
        let a = timed(&mut c_open, one()).await.0.unwrap();
        assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 100)));
        let a = timed(&mut c_closed, one()).await.0.unwrap();
        assert_eq!((a.overall_code, rem(&a.statuses[0])), (OVER, (OVER, 0)));
    }
    sig(open.redis.as_ref().unwrap().0.id(), libc::SIGCONT);
}

/// The gRPC listener caps the streams of a connection: its first SETTINGS
/// frame says `server::MAX_CONCURRENT_STREAMS` (parameter 3). tonic's
/// default is no cap, with which h2 closed every connection of a burst
/// beyond the service's CPU (the constant says why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_caps_the_streams_of_a_connection() {
    let e = Env::start("streams", CONFIG, &[]).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", e.grpc)).await.unwrap();
    // the client's preface, then an empty SETTINGS frame
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await.unwrap();
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!((head[3], head[4]), (4, 0), "the server's first frame is its SETTINGS");
    let mut body = vec![0u8; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
    s.read_exact(&mut body).await.unwrap();
    let settings: HashMap<u16, u32> = body
        .chunks_exact(6)
        .map(|p| (u16::from_be_bytes([p[0], p[1]]), u32::from_be_bytes([p[2], p[3], p[4], p[5]])))
        .collect();
    assert_eq!(settings.get(&3), Some(&server::MAX_CONCURRENT_STREAMS), "SETTINGS_MAX_CONCURRENT_STREAMS: {settings:?}");
}

/// The server-side socket of the connection to `port`: its receive queue
/// in bytes (/proc/net/tcp), or None before the connection is there.
fn rx_queue(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local_port = u16::from_str_radix(f[1].rsplit(':').next()?, 16).ok()?;
        // 01: ESTABLISHED (the listener is 0A)
        (local_port == port && f[3] == "01").then(|| u64::from_str_radix(f[4].rsplit(':').next().unwrap(), 16).unwrap())
    })
}

/// Until the client has sent what it can to the stalled service on `port`:
/// the service's receive queue holds bytes and stays the same 20 polls.
fn wait_sent(port: u16, what: &str) {
    let (mut last, mut same) = (0, 0);
    wait_for(what, Duration::from_secs(20), || {
        let q = rx_queue(port).unwrap_or(0);
        same = if q > 0 && q == last { same + 1 } else { 0 };
        last = q;
        same >= 20
    });
}

/// A service that cannot run, as in a CPU stall: the service's runtime
/// `srt`, its client on a runtime of its own (`crt`), connected with one
/// decision made; both of `srt`'s workers held until `go` is passed.
struct Stalled {
    /// the service's runtime: held, not read
    _srt: tokio::runtime::Runtime,
    crt: tokio::runtime::Runtime,
    e: Option<Env>,
    c: Grpc,
    go: std::sync::Arc<std::sync::Barrier>,
}

type Call = tokio::task::JoinHandle<Result<i32, tonic::Status>>;

impl Stalled {
    fn new(name: &str) -> Stalled {
        let rt = |workers| tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap();
        let (srt, crt) = (rt(2), rt(1));
        let e = srt.block_on(Env::start(name, CONFIG, &[]));
        fresh_window(3_600_000, 60_000);
        let grpc = e.grpc;
        let c =
            crt.block_on(async move { RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await.unwrap() });
        let first = crt.block_on(c.clone().should_rate_limit(Stalled::site())).unwrap().into_inner();
        assert_eq!(rem(&first.statuses[0]), (OK, 99));
        let (held, go) = (std::sync::Arc::new(std::sync::Barrier::new(3)), std::sync::Arc::new(std::sync::Barrier::new(3)));
        for _ in 0..2 {
            let (h, g) = (held.clone(), go.clone());
            srt.spawn(async move {
                h.wait();
                g.wait();
            });
        }
        held.wait();
        Stalled { _srt: srt, crt, e: Some(e), c, go }
    }

    fn site() -> RateLimitRequest {
        req("basic", vec![desc(&[("site", "")])])
    }

    /// `n` concurrent calls on the one connection.
    fn calls(&self, n: usize) -> Vec<Call> {
        let call =
            |mut c: Grpc| async move { c.should_rate_limit(Stalled::site()).await.map(|a| a.into_inner().overall_code) };
        (0..n).map(|_| self.crt.spawn(call(self.c.clone()))).collect()
    }

    fn port(&self) -> u16 {
        self.e.as_ref().unwrap().grpc
    }

    /// The service runs again; the answers of `calls`, none of which may
    /// have failed.
    fn resume(&mut self, calls: Vec<Call>) -> Vec<i32> {
        self.go.wait();
        let n = calls.len();
        let answers = self.crt.block_on(async move {
            let mut answers = Vec::with_capacity(n);
            for c in calls {
                answers.push(c.await.unwrap());
            }
            answers
        });
        let failed: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
        assert!(failed.is_empty(), "{} of {n} failed, the first: {:?}", failed.len(), failed.first());
        answers.into_iter().flatten().collect()
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        // the service's task aborted before its runtime (a field) goes
        drop(self.e.take());
    }
}

/// A burst on one connection while the service cannot run is answered in
/// full once it runs again: every request decided, none lost to a closed
/// connection (without `MAX_CONCURRENT_STREAMS`, 6,000 of 6,000 failed),
/// and the limit's count exact.
#[test]
fn a_burst_on_one_stalled_connection_is_answered_in_full() {
    const N: usize = 6000;
    let mut st = Stalled::new("burst");
    let calls = st.calls(N);
    wait_sent(st.port(), "the burst in the service's receive queue");
    let codes = st.resume(calls);
    let ok = codes.iter().filter(|&&c| c == OK).count();
    assert_eq!((ok, N - ok), (99, N - 99), "the 100/hour limit: 99 granted after the first call");
}

/// Requests the client gives up on while the service cannot run (Envoy's
/// timeout cancels them: RST_STREAM) do not take the others on the
/// connection down with them once it runs again (without
/// `MAX_PENDING_RESETS`, 300 of 300 failed).
#[test]
fn cancelled_requests_of_a_stall_spare_the_others() {
    let mut st = Stalled::new("cancel");
    let kept = st.calls(300);
    let cancelled = st.calls(200);
    wait_sent(st.port(), "the requests in the service's receive queue");
    for c in &cancelled {
        c.abort();
    }
    wait_sent(st.port(), "the resets in the service's receive queue");
    let codes = st.resume(kept);
    assert_eq!(codes.len(), 300);
}
