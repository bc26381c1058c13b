//! The Prometheus metrics count what the requests did.

use crate::support::*;

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
    in_one_window(HOUR_MS, || async {
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
        let user = r#"ratelimit_service_rate_limit_{}{domain="m",key1="user"}"#;
        let get =
            |m: &HashMap<String, f64>, name: &str, tmpl: &str| m.get(&tmpl.replace("{}", name)).copied().unwrap_or(0.0);
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
        assert_eq!(
            ["total_hits", "within_limit", "over_limit", "shadow_mode"].map(|n| get(&m3, n, sh)),
            [2.0, 1.0, 1.0, 1.0]
        );
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
        wait_for("the refusal", Duration::from_secs(60), || e.refusal().is_some());
        std::fs::remove_file(&bad).unwrap();
        write(&e.dir.join("v1/ratelimit/config/more.yaml"), "domain: more\n");
        let t0 = Instant::now();
        while !e.svc.service.config().has_domain("more") {
            assert!(t0.elapsed() < Duration::from_secs(60), "the good file was not loaded");
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
        // a request without a decision: its hits in total_hits (counted before
        // Redis is called, as envoyproxy/ratelimit counts them), and nowhere else
        let u3 = r#"ratelimit_service_rate_limit_{}{domain="m",key1="user"}"#;
        assert_eq!(get(&m5, "total_hits", u3), get(&m4, "total_hits", user) + 1.0);
        assert_eq!(
            ["within_limit", "near_limit", "over_limit"].map(|n| get(&m5, n, u3)),
            ["within_limit", "near_limit", "over_limit"].map(|n| get(&m4, n, u3))
        );
    })
    .await;
}
