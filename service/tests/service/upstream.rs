//! The real envoyproxy/ratelimit beside this service: the binary named by
//! `ENVOY_RATELIMIT_BIN` (built by hand from its public source; this
//! repository carries neither its code nor a recipe) on a Redis of its own,
//! this service on one with the module, the same configuration file, and
//! the same gRPC requests to both. Every field of every response is
//! compared: single-descriptor requests answer the same; a
//! multi-descriptor request denied by one descriptor differs only as
//! docs/envoy.md says (the atomic difference: here the others take
//! nothing). Without `ENVOY_RATELIMIT_BIN` the test says why and returns.

use crate::support::*;

const CONFIG: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3, name: per-user}
  - key: tenant
    value: "t*"
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: api
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: big
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100}
"#;

/// envoyproxy/ratelimit on a Redis of its own (no module: it sends INCRBY
/// and EXPIRE), reading `config`.
struct Upstream {
    grpc: u16,
    _proc: Proc,
    _redis: Proc,
    dir: PathBuf,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start_upstream(bin: &str, config: &str) -> Upstream {
    let rport = port();
    let server = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let redis = Proc(
        Command::new(server)
            .args(["--port", &rport.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start REDIS_SERVER"),
    );
    wait_for("redis", Duration::from_secs(60), || std::net::TcpStream::connect(("127.0.0.1", rport)).is_ok());
    let dir = std::env::temp_dir().join(format!("rl-upstream-{}-{}", std::process::id(), port()));
    write(&dir.join("ratelimit/config/config.yaml"), config);
    let (grpc, http, debug) = (port(), port(), port());
    let log = std::fs::File::create(dir.join("upstream.log")).unwrap();
    let proc = Proc(
        Command::new(bin)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs([
                ("DISABLE_STATS", "true".to_owned()),
                ("LOG_LEVEL", "warn".to_owned()),
                ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
                ("REDIS_URL", format!("127.0.0.1:{rport}")),
                ("HOST", "127.0.0.1".to_owned()),
                ("PORT", http.to_string()),
                ("GRPC_HOST", "127.0.0.1".to_owned()),
                ("GRPC_PORT", grpc.to_string()),
                ("DEBUG_HOST", "127.0.0.1".to_owned()),
                ("DEBUG_PORT", debug.to_string()),
                ("RUNTIME_ROOT", dir.to_string_lossy().into_owned()),
                ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
                ("RUNTIME_WATCH_ROOT", "false".to_owned()),
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true".to_owned()),
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("ENVOY_RATELIMIT_BIN={bin}: {e}")),
    );
    let up = Upstream { grpc, _proc: proc, _redis: redis, dir };
    // serving once its configuration is loaded: a request on an unlimited key answers
    let t0 = Instant::now();
    loop {
        if let Ok(mut c) = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await {
            if c.should_rate_limit(req("d", vec![desc(&[("free", "x")])])).await.is_ok() {
                return up;
            }
        }
        let log = std::fs::read_to_string(up.dir.join("upstream.log")).unwrap_or_default();
        assert!(t0.elapsed() < Duration::from_secs(60), "envoyproxy/ratelimit did not serve within 60 s:\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn now_s() -> u64 {
    now_ms() / 1000
}

/// A response with its clock-dependent fields (each `duration_until_reset`,
/// the `RateLimit-Reset` header) taken out, and those fields.
fn split(r: &RateLimitResponse) -> (RateLimitResponse, Vec<i64>) {
    let mut r = r.clone();
    let mut clock = Vec::new();
    for s in &mut r.statuses {
        if let Some(d) = s.duration_until_reset.take() {
            clock.push(d.seconds);
            assert_eq!(d.nanos, 0);
        }
    }
    for h in &mut r.response_headers_to_add {
        if h.key == "RateLimit-Reset" {
            clock.push(h.value.parse().unwrap());
            h.value.clear();
        }
    }
    (r, clock)
}

/// Asks both; the responses with their clock fields checked: equal when
/// both calls fell in one second, else ours (asked first) at most the
/// seconds that passed above theirs.
async fn ask_both(
    ours: &Env,
    up: &mut RateLimitServiceClient<tonic::transport::Channel>,
    r: RateLimitRequest,
) -> (RateLimitResponse, RateLimitResponse) {
    let s0 = now_s();
    let a = ours.ask(r.clone()).await;
    let b =
        up.should_rate_limit(r.clone()).await.unwrap_or_else(|e| panic!("envoyproxy/ratelimit: {e} for {r:?}")).into_inner();
    let passed = (now_s() - s0) as i64;
    let ((a0, ca), (b0, cb)) = (split(&a), split(&b));
    assert_eq!(ca.len(), cb.len(), "the same reset fields: {a:?} / {b:?}");
    for (x, y) in ca.iter().zip(&cb) {
        assert!((0..=passed).contains(&(x - y)), "duration_until_reset {x} here, {y} there, {passed} s apart, for {r:?}");
    }
    (a0, b0)
}

fn with_hits(mut d: RateLimitDescriptor, n: u64) -> RateLimitDescriptor {
    d.hits_addend = Some(UInt64Value { value: n });
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_as_envoyproxy_ratelimit_itself() {
    let Ok(bin) = std::env::var("ENVOY_RATELIMIT_BIN") else {
        println!(
            "skipped: ENVOY_RATELIMIT_BIN is not set (a binary of envoyproxy/ratelimit built by hand: \
             `go build ./src/service_cmd` in its source; see BENCHMARKS.md)"
        );
        return;
    };
    in_one_window(HOUR_MS, || async {
        let ours = Env::start("upstream-diff", CONFIG, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]).await;
        let upstream = start_upstream(&bin, CONFIG).await;
        let mut up = RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", upstream.grpc)).await.unwrap();

        // single descriptors: every field the same, past each limit
        let override_limit = RateLimitDescriptor {
            limit: Some(RateLimitOverride { requests_per_unit: 2, unit: 3 }),
            ..desc(&[("user", "o1")])
        };
        let singles: Vec<(RateLimitDescriptor, u32)> = vec![
            (desc(&[("user", "u1")]), 5),
            (desc(&[("tenant", "t1")]), 6),
            (desc(&[("tenant", "t2")]), 2),
            (desc(&[("tenant", "x")]), 2), // no match: the wildcard needs t*
            (desc(&[("free", "f")]), 3),
            (desc(&[("shadow", "s")]), 3),
            (desc(&[("api", "a"), ("method", "GET")]), 7),
            (desc(&[("api", "a"), ("method", "PUT")]), 2),
            (desc(&[("nothing", "n")]), 2),
            (with_hits(desc(&[("big", "b3")]), 3), 6), // 3, 6, 9, then over each time
            (override_limit, 4),
        ];
        let mut compared = 0;
        for (d, n) in &singles {
            for i in 0..*n {
                let (a, b) = ask_both(&ours, &mut up, req("d", vec![d.clone()])).await;
                assert_eq!(a, b, "call {i} of {d:?}");
                compared += 1;
            }
        }
        // documented: a check (hits_addend 0) of a limit with nothing left
        // is over here, OK there (its count is not above the limit)
        for _ in 0..3 {
            let (a, b) = ask_both(&ours, &mut up, req("d", vec![desc(&[("user", "u5")])])).await;
            assert_eq!(a, b);
        }
        let (a, b) = ask_both(&ours, &mut up, req("d", vec![with_hits(desc(&[("user", "u5")]), 0)])).await;
        assert_eq!((a.overall_code, rem(&a.statuses[0])), (OVER, (OVER, 0)));
        assert_eq!((b.overall_code, rem(&b.statuses[0])), (OK, (OK, 0)));
        // a domain no file has
        let (a, b) = ask_both(&ours, &mut up, req("other", vec![desc(&[("user", "u1")])])).await;
        assert_eq!(a, b);

        // several descriptors: the same answers, but for the atomic
        // difference: once `user` denies, `site` takes nothing here and a
        // unit there for every denied request
        let both = |u: &str| req("d", vec![desc(&[("site", "s1")]), desc(&[("user", u)])]);
        let mut denied = 0u32;
        for i in 0..6 {
            let (a, b) = ask_both(&ours, &mut up, both("m1")).await;
            assert_eq!(a.overall_code, b.overall_code, "call {i}");
            assert_eq!(a.statuses[1], b.statuses[1], "call {i}: the denying descriptor answers the same");
            if a.overall_code == OVER {
                denied += 1;
                assert_eq!(a.response_headers_to_add, b.response_headers_to_add, "call {i}: headers of the denying one");
            }
            let (sa, sb) = (&a.statuses[0], &b.statuses[0]);
            assert_eq!((sa.code, &sa.current_limit), (sb.code, &sb.current_limit), "call {i}");
            assert_eq!(
                sa.limit_remaining,
                sb.limit_remaining + denied,
                "call {i}: {denied} denied requests took from site there"
            );
            compared += 1;
        }
        assert_eq!(denied, 3, "user m1: 3 an hour, 6 asked");
        // within every limit, several descriptors answer the same
        for i in 0..2 {
            let (a, b) = ask_both(&ours, &mut up, req("d", vec![desc(&[("tenant", "t9")]), desc(&[("user", "m2")])])).await;
            assert_eq!(a, b, "call {i}");
            compared += 1;
        }
        println!("compared {compared} responses with envoyproxy/ratelimit's");
    })
    .await;
}
