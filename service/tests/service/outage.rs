//! Redis stopped or slow: UNAVAILABLE within REDIS_TIMEOUT, a slow Redis
//! still decides, PANIC_MODE local, allow and deny.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_is_unavailable_within_redis_timeout() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("stall", CONFIG, &stall_env()).await;
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
    })
    .await;
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
    in_one_window(HOUR_MS, || async {
        let e = Env::start_with("slow", CONFIG, &[("REDIS_TIMEOUT", "1s")], &["--enable-debug-command", "yes"]).await;
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
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_with_local_panic_limits() {
    in_one_window(HOUR_MS, || async {
        let mut env = stall_env().to_vec();
        env.push(("PANIC_MODE", "local"));
        let e = Env::start("panic", CONFIG, &env).await;
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
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_allow_and_deny() {
    in_one_window(HOUR_MS, || async {
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
    })
    .await;
}
