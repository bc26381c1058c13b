//! RateLimitLayer against a real server: in an axum router (per request
//! and leased: the headers on allowed responses, 429 with the headers,
//! Retry-After and the problem body, the inner service not called on a
//! denial, unlimited requests without a caller, 500 on a limiter error),
//! and in a tonic server (gRPC RESOURCE_EXHAUSTED with the headers as
//! metadata) over a real HTTP/2 connection.
use rl_test_support as common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use common::Server;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use redis_ratelimit_client::*;
use tower::ServiceExt;

const HOUR: u64 = 3_600_000;

fn rl<C: Connection>(c: C) -> RateLimit<C> {
    RateLimit::new(c, Options { timeout_ms: 2000, ..Options::default() }).unwrap()
}

/// The caller: the `x-caller` header, else unlimited.
fn caller(p: &http::request::Parts) -> Option<String> {
    p.headers.get("x-caller").and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn app(layer: RateLimitLayer<impl Connection>, hits: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/api/x",
            get(move || {
                hits.fetch_add(1, SeqCst);
                async { "ok" }
            }),
        )
        .layer(layer)
}

async fn send(app: &Router, who: Option<&str>) -> (StatusCode, http::HeaderMap, String) {
    let mut req = Request::get("/api/x");
    if let Some(w) = who {
        req = req.header("x-caller", w);
    }
    let resp: Response<Body> = app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, String::from_utf8(bytes.to_vec()).unwrap())
}

fn h<'a>(headers: &'a http::HeaderMap, name: &str) -> &'a str {
    headers.get(name).map(|v| v.to_str().unwrap()).unwrap_or("")
}

#[tokio::test]
async fn axum_per_request_allows_with_headers_and_denies_with_429() {
    let s = Server::start(true);
    let r = rl(s.manager().await);
    let lim = r.limiter(token_bucket("api", 2, 1, HOUR).unwrap(), Panic::default()).unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let app = app(RateLimitLayer::new(lim, caller), hits.clone());

    let (st, hd, body) = send(&app, Some("alice")).await;
    assert_eq!((st, body.as_str()), (StatusCode::OK, "ok"));
    assert_eq!(h(&hd, "ratelimit-policy"), "\"api\";q=2;w=7200");
    assert_eq!(h(&hd, "ratelimit"), "\"api\";r=1;t=3600");
    assert_eq!((h(&hd, "x-ratelimit-limit"), h(&hd, "x-ratelimit-remaining")), ("2", "1"));
    assert!(!hd.contains_key("retry-after"));
    let (st, hd, _) = send(&app, Some("alice")).await;
    assert_eq!((st, h(&hd, "x-ratelimit-remaining")), (StatusCode::OK, "0"));

    // the third is denied: 429, the headers, Retry-After, the problem body
    let (st, hd, body) = send(&app, Some("alice")).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(h(&hd, "content-type"), "application/problem+json");
    assert_eq!((h(&hd, "x-ratelimit-remaining"), h(&hd, "retry-after")), ("0", "3600"));
    let want = r#"{"type": "https://iana.org/assignments/http-problem-types#quota-exceeded", "title": "Request cannot be satisfied as assigned quota has been exceeded", "status": 429, "detail": "Rate limit \"api\" exceeded; retry in 3600 s.", "violated-policies": ["api"], "instance": "/api/x"}"#;
    assert_eq!(body, want);
    assert_eq!(hits.load(SeqCst), 2, "the handler ran on a denial");

    // another caller has a bucket of its own; no caller: unlimited, no headers
    assert_eq!(send(&app, Some("bob")).await.0, StatusCode::OK);
    for _ in 0..3 {
        let (st, hd, _) = send(&app, None).await;
        assert!(st == StatusCode::OK && !hd.contains_key("ratelimit"));
    }
    assert_eq!(hits.load(SeqCst), 6);
    let mut c = s.sync();
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    keys.sort();
    assert_eq!(keys, ["rl:{alice}:api", "rl:{bob}:api"]);
    assert_eq!(r.metrics().decisions_module, 4);

    // a limiter error (a caller that cannot be a hash tag): 500, handler not run
    let (st, _, body) = send(&app, Some("a{b")).await;
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.starts_with("rate limit: tag must not contain"), "{body}");
    assert_eq!(hits.load(SeqCst), 6);
}

#[tokio::test]
async fn axum_all_of_and_leased_modes() {
    let s = Server::start(true);
    let r = rl(s.manager().await);
    // all_of: the binding part's headers, one key per part
    let both = all_of(vec![fixed_window("min", 3, HOUR, true).unwrap(), sliding_log("day", 2, HOUR).unwrap()], None);
    let lim = r.limiter(both.unwrap(), Panic::default()).unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let app1 = app(RateLimitLayer::new(lim, caller), hits.clone());
    let got: Vec<_> = [send(&app1, Some("t")).await, send(&app1, Some("t")).await, send(&app1, Some("t")).await].into();
    assert_eq!(got.iter().map(|g| g.0.as_u16()).collect::<Vec<_>>(), [200, 200, 429]);
    assert_eq!(h(&got[2].1, "ratelimit-policy"), "\"min\";q=3;w=3600, \"day\";q=2;w=3600");
    assert!(h(&got[2].1, "ratelimit").starts_with("\"day\";r=0;"), "{:?}", got[2].1);
    assert!(got[2].2.contains("\"violated-policies\": [\"day\"]"), "{}", got[2].2);

    // leased: 3 requests from one lease of 5, 2 given back on close
    let leased = r
        .leased(token_bucket("lease", 20, 1, HOUR).unwrap(), Lease { batch: 5, low_water: 0.0, ..Lease::default() })
        .unwrap();
    let layer = RateLimitLayer::leased(leased, caller);
    let app2 = app(layer.clone(), hits.clone());
    let calls = r.metrics().calls;
    for _ in 0..3 {
        let (st, hd, _) = send(&app2, Some("u")).await;
        assert!(st == StatusCode::OK && hd.contains_key("ratelimit"));
    }
    assert_eq!(r.metrics().calls - calls, 1, "one lease for three requests");
    assert_eq!(layer.close().await.unwrap(), 2);
    let left: Vec<i64> = redis::cmd("RL.TOKENBUCKET")
        .arg("rl:{u}:lease")
        .arg(20)
        .arg(1)
        .arg(HOUR)
        .arg("COST")
        .arg(0)
        .query(&mut s.sync())
        .unwrap();
    assert_eq!(left[2], 17, "granted 3 of the lease, 2 given back");
}

mod grpc {
    use super::*;
    use tonic::transport::{Channel, Server as GrpcServer};
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    #[tokio::test]
    async fn tonic_answers_resource_exhausted_with_the_headers_as_metadata() {
        let s = Server::start(true);
        let r = rl(s.manager().await);
        let lim = r.limiter(sliding_log("rpc", 2, HOUR).unwrap(), Panic::default()).unwrap();
        let (_reporter, health) = tonic_health::server::health_reporter();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server = tokio::spawn(
            GrpcServer::builder()
                .layer(RateLimitLayer::new(lim, caller).grpc())
                .add_service(health)
                .serve_with_incoming(incoming),
        );
        let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
        let mut client = HealthClient::new(channel);
        let ask = || {
            let mut req = tonic::Request::new(HealthCheckRequest { service: String::new() });
            req.metadata_mut().insert("x-caller", "svc".parse().unwrap());
            req
        };
        for left in ["1", "0"] {
            let resp = client.check(ask()).await.unwrap();
            assert_eq!(resp.metadata().get("x-ratelimit-remaining").unwrap(), left);
            assert_eq!(resp.metadata().get("ratelimit-policy").unwrap(), "\"rpc\";q=2;w=3600");
        }
        let st = client.check(ask()).await.unwrap_err();
        assert_eq!(st.code(), tonic::Code::ResourceExhausted, "{st:?}");
        assert!(st.message().starts_with("Rate limit \"rpc\" exceeded; retry in "), "{st:?}");
        let md = st.metadata();
        assert_eq!(md.get("x-ratelimit-remaining").unwrap(), "0");
        let retry: u64 = md.get("retry-after").unwrap().to_str().unwrap().parse().unwrap();
        assert!(retry > 3500 && retry <= 3600, "{retry}");
        // without a caller: not limited
        for _ in 0..3 {
            client.check(HealthCheckRequest { service: String::new() }).await.unwrap();
        }
        server.abort();
    }
}
