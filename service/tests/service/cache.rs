//! `LOCAL_CACHE_SIZE_IN_BYTES` (issue 43, item 4): an abusive client's
//! requests against its 10/s limit, with the cache and without it, on the
//! same service build. With it, a key whose remaining reached 0 is denied
//! from memory until its window's end: Redis sees about the limit's calls
//! per window instead of one per request. Never more admitted than
//! without it, and a request denied from the cache takes nothing from its
//! other descriptors. Bounds are per window the run spanned (the test's
//! clock is the server's: one machine), so where the second boundaries
//! fall does not matter.

use crate::support::*;

const ABUSE: &str = r#"
domain: abuse
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - key: slow
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 1, burst: 2}
"#;

fn rl_calls(r: &mut redis::Connection) -> u64 {
    decision_calls(r).0
}

/// `n` requests of the client and the site, one after another: (allowed,
/// Redis calls, seconds spanned, what the site took, the last answer).
async fn abuse(e: &Env, n: usize) -> (u64, u64, u64, u64, RateLimitResponse) {
    let mut r = e.redis();
    let calls0 = rl_calls(&mut r);
    let s0 = now_ms() / 1000;
    let mut allowed = 0;
    let mut last = None;
    let both = || req("abuse", vec![desc(&[("client", "bad")]), desc(&[("site", "")])]);
    for _ in 0..n {
        let a = e.ask(both()).await;
        allowed += u64::from(a.overall_code == OK);
        last = Some(a);
    }
    let spanned = now_ms() / 1000 - s0 + 1;
    let calls = rl_calls(&mut r) - calls0;
    // the site alone: what the client's requests took from it
    let site = e.ask(req("abuse", vec![desc(&[("site", "")])])).await;
    let took = 100_000 - 1 - u64::from(site.statuses[0].limit_remaining);
    (allowed, calls, spanned, took, last.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abusive_client_costs_redis_its_limit_not_its_requests() {
    let n = 1500;
    in_one_window(HOUR_MS, || async {
        let cached = Env::start("cache", ABUSE, &[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")]).await;
        let (allowed, calls, spanned, took, last) = abuse(&cached, n).await;
        println!("with the cache: {allowed} of {n} allowed, {calls} Redis calls over {spanned} s");
        assert!(allowed >= 10 && allowed <= 10 * spanned, "{allowed} allowed in {spanned} s");
        // the denied requests took nothing from the site (from the cache or not)
        assert_eq!(took, allowed);
        // Redis saw the grants and a few denials per window, not every request
        assert!(calls <= 12 * spanned, "{calls} calls in {spanned} s");
        assert_eq!((last.overall_code, rem(&last.statuses[0]).0), (OVER, OVER));
        let m = cached.svc.service.render_metrics();
        let line = m.lines().find(|l| l.starts_with("ratelimit_service_rate_limit_over_limit_with_local_cache{")).unwrap();
        let from_cache: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(from_cache + calls, n as u64, "{line}");

        let plain = Env::start("nocache", ABUSE, &[]).await;
        let (allowed, calls, spanned, took, _) = abuse(&plain, n).await;
        println!("without: {allowed} of {n} allowed, {calls} Redis calls over {spanned} s");
        assert!(allowed >= 10 && allowed <= 10 * spanned && took == allowed);
        assert_eq!(calls, n as u64, "one call per request");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bucket_is_marked_until_its_retry_time_only_when_one_unit_is_denied() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("cache-tb", ABUSE, &[("LOCAL_CACHE_SIZE_IN_BYTES", "4096")]).await;
        let mut r = e.redis();
        let slow = |hits: u64| {
            let mut d = desc(&[("slow", "x")]);
            d.hits_addend = Some(UInt64Value { value: hits });
            req("abuse", vec![d])
        };
        // 2 tokens: a denial of 3 hits marks nothing (one may still fit)
        assert_eq!(e.ask(slow(3)).await.overall_code, OVER);
        assert_eq!(e.ask(slow(1)).await.overall_code, OK);
        assert_eq!(e.ask(slow(1)).await.overall_code, OK);
        // empty; the bucket's own denial of 1 marks it: then Redis is not asked
        let c0 = rl_calls(&mut r);
        let a = e.ask(slow(1)).await;
        assert_eq!((a.overall_code, rem(&a.statuses[0])), (OVER, (OVER, 0)));
        assert_eq!(rl_calls(&mut r), c0 + 1);
        for _ in 0..5 {
            let a = e.ask(slow(1)).await;
            assert_eq!(a.overall_code, OVER);
            // the retry time the bucket gave (a token an hour): within the hour
            let s = a.statuses[0].duration_until_reset.unwrap().seconds;
            assert!((1..=3600).contains(&s), "{s}");
        }
        assert_eq!(rl_calls(&mut r), c0 + 1, "denied from the cache");
    })
    .await;
}
