//! The debug listener (`DEBUG_HOST:DEBUG_PORT`, envoyproxy/ratelimit's):
//! `/rlconfig` prints the live configuration as upstream's `Dump()` and
//! follows a reload, `/stats` the counters after decisions, any other path
//! the index; a DEBUG_PORT that cannot be bound stops the start, naming it.

use crate::support::*;

const CONFIG: &str = "domain: basic\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n  \
     - key: path\n    value: /x\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 7}\n    descriptors:\n      \
     - key: user\n        rate_limit: {unit: second, requests_per_unit: 2}\n";

/// `GET path` on the debug listener: (status, body).
async fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlconfig_shows_the_live_config_and_follows_a_reload() {
    let e = Env::start("debug-rlconfig", CONFIG, &[]).await;
    let port = e.svc.debug_addr.port();
    // upstream's lines for the same YAML, sorted by key
    let (st, body) = get(port, "/rlconfig").await;
    assert_eq!(st, 200);
    assert_eq!(
        body,
        "basic.path_/x: unit=MINUTE requests_per_unit=7, shadow_mode: true, quota_mode: false\n\
         basic.path_/x.user: unit=SECOND requests_per_unit=2, shadow_mode: false, quota_mode: false\n\
         basic.user: unit=HOUR requests_per_unit=1000000, shadow_mode: false, quota_mode: false\n"
    );
    // a second file, with an unlimited descriptor and an extension key
    write(
        &e.dir.join("v1/ratelimit/config/config1.yaml"),
        "domain: another\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true}\n  \
         - key: tokens\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n  \
         - key: bucket\n    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}\n",
    );
    let want = "another.bucket: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false, \
                algorithm: token_bucket, burst: 20\n\
                another.free: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false\n\
                another.tokens: unit=MINUTE requests_per_unit=1000, shadow_mode: false, quota_mode: true\n";
    let t0 = Instant::now();
    loop {
        let (_, body) = get(port, "/rlconfig").await;
        if body.starts_with(want)
            && body.ends_with("basic.user: unit=HOUR requests_per_unit=1000000, shadow_mode: false, quota_mode: false\n")
        {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the reload never showed in /rlconfig: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // the index: upstream's help lines, for / and any unknown path
    let index = "/rlconfig: print out the currently loaded configuration for debugging\n/stats: print out stats\n";
    assert_eq!(get(port, "/").await, (200, index.to_owned()));
    assert_eq!(get(port, "/debug/pprof/").await, (200, index.to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_shows_the_counters_after_decisions() {
    let e = Env::start("debug-stats", CONFIG, &[]).await;
    let port = e.svc.debug_addr.port();
    let (_, before) = get(port, "/stats").await;
    assert!(before.contains("ratelimit.service.config_load_success: 1\n"), "{before}");
    assert!(!before.contains("basic.user.total_hits"), "{before}");
    for _ in 0..3 {
        assert_eq!(e.ask(req("basic", vec![desc(&[("user", "u1")])])).await.overall_code, OK);
    }
    let (st, after) = get(port, "/stats").await;
    assert_eq!(st, 200);
    for line in [
        "ratelimit.service.rate_limit.basic.user.total_hits: 3",
        "ratelimit.service.rate_limit.basic.user.within_limit: 3",
        "ratelimit.service.rate_limit.basic.user.over_limit: 0",
        "ratelimit.service.config_load_success: 1",
    ] {
        assert!(after.lines().any(|l| l == line), "{line:?} not in:\n{after}");
    }
    let lines: Vec<&str> = after.lines().collect();
    let mut sorted = lines.clone();
    sorted.sort();
    assert_eq!(lines, sorted, "sorted by name");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_port_in_use_or_not_a_port_is_refused_naming_it() {
    // held bound and listening: nothing else can take it meanwhile
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().port().to_string();
    let (_redis, rport) = plain_redis(&[]);
    let err = Env::try_serve("debug-taken", &[CONFIG], &[("DEBUG_PORT", &taken)], rport, None).await.err().unwrap();
    assert!(err.contains(&format!("DEBUG_PORT 127.0.0.1:{taken}")), "{err}");
    let err = Env::try_serve("debug-nan", &[CONFIG], &[("DEBUG_PORT", "debug")], rport, None).await.err().unwrap();
    assert!(err.contains("DEBUG_PORT=\"debug\""), "{err}");
    drop(held);
}
