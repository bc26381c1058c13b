//! Decisions of the default fixed window: no match, per second and per
//! minute, /json, two descriptors atomic, share_threshold, replaces,
//! shadow mode, unlimited, hits_addend, the limit override, the headers.

use crate::support::*;

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
    // (the four calls share a second: made again on another key if one began)
    let (key, got) = burst_in_one_window(1000, 600, |attempt| {
        let e = &e;
        async move {
            let key = format!("a{attempt}");
            let mut got = Vec::new();
            for _ in 0..4 {
                let a = e.ask(req("basic", vec![desc(&[("per_second", &key)])])).await;
                got.push((a.overall_code, rem(&a.statuses[0])));
                let s = &a.statuses[0];
                assert_eq!(s.duration_until_reset.unwrap().seconds, 1);
                let l = s.current_limit.clone().unwrap();
                assert_eq!((l.requests_per_unit, l.unit, l.name.as_str()), (3, 1, ""));
            }
            (key, got)
        }
    })
    .await;
    assert_eq!(got, vec![(OK, (OK, 2)), (OK, (OK, 1)), (OK, (OK, 0)), (OVER, (OVER, 0))]);
    // and the next second starts afresh
    let second = now_ms() / 1000;
    wait_for("the next second", Duration::from_secs(10), || now_ms() / 1000 > second);
    let a = e.ask(req("basic", vec![desc(&[("per_second", &key)])])).await;
    assert_eq!(rem(&a.statuses[0]), (OK, 2));

    // 5 per minute through /json: 200 with 4 … 0 left, then 429 (the six
    // calls share a minute: made again on another key if one began)
    let answers = burst_in_one_window(60_000, 5_000, |attempt| {
        let e = &e;
        async move {
            let user = format!("u1-{attempt}");
            let body = json!({"domain": "basic", "descriptors": [{"entries": [{"key": "per_minute", "value": user}]}]});
            let mut answers = Vec::new();
            for _ in 0..6 {
                answers.push(e.json(body.clone()).await);
            }
            answers
        }
    })
    .await;
    for ((st, v), left) in answers.iter().zip((0..5).rev()) {
        assert_eq!(*st, 200, "{v}");
        assert_eq!(v["overallCode"], "OK");
        let s = &v["statuses"][0];
        assert_eq!(s["currentLimit"], json!({"name": "minute_five", "requestsPerUnit": 5, "unit": "MINUTE"}));
        assert_eq!(s["limitRemaining"].as_u64().unwrap_or(0), left);
        let reset: u64 = s["durationUntilReset"].as_str().unwrap().trim_end_matches('s').parse().unwrap();
        assert!((1..=60).contains(&reset), "{reset}");
    }
    let (st, v) = &answers[5];
    assert_eq!(
        (*st, v["overallCode"].as_str(), v["statuses"][0]["code"].as_str()),
        (429, Some("OVER_LIMIT"), Some("OVER_LIMIT"))
    );
    assert!(v["statuses"][0].get("limitRemaining").is_none(), "0 is left out in proto3 JSON: {v}");

    // duration_until_reset falls with time (polled, not slept): judged on two
    // calls less than a second apart (from the first's start to the second's
    // end) that see it change: by one second, or 1 then 60 as the next minute
    // begins. A pair further apart (a stalled machine) is not judged.
    let reset_of = |who: &'static str| {
        let e = &e;
        async move {
            e.ask(req("basic", vec![desc(&[("per_minute", who)])])).await.statuses[0].duration_until_reset.unwrap().seconds
        }
    };
    let mut start = Instant::now();
    let mut first = reset_of("u2").await;
    let t0 = Instant::now();
    let later = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let this = Instant::now();
        let later = reset_of("u3").await;
        if later != first && start.elapsed() < Duration::from_secs(1) {
            break later;
        }
        (start, first) = (this, later);
        assert!(t0.elapsed() < Duration::from_secs(30), "duration_until_reset stayed {first} for 30 s");
    };
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
    in_one_window(HOUR_MS, || async {
        let e = Env::start("atomic", CONFIG, &[]).await;
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
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_replaces_shadow_unlimited() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("features", CONFIG, &[]).await;
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
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_and_the_limit_override() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("hits", CONFIG, &[]).await;
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
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_and_global_shadow_mode() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start(
            "headers",
            CONFIG,
            &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true"), ("LIMIT_REMAINING_HEADER", "X-Left"), ("SHADOW_MODE", "true")],
        )
        .await;
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
    })
    .await;
}
