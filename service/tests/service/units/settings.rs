//! The environment variables (service/src/settings.rs).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use redis_ratelimit_service::settings::*;
fn env(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[test]
fn go_durations() {
    let ms = |s: &str| parse_go_duration(s).map(|d| d.as_nanos());
    assert_eq!(ms("50ms"), Ok(50_000_000));
    assert_eq!(ms("10s"), Ok(10_000_000_000));
    assert_eq!(ms("1m30s"), Ok(90_000_000_000));
    assert_eq!(ms("1.5s"), Ok(1_500_000_000));
    assert_eq!(ms(".5ms"), Ok(500_000));
    assert_eq!(ms("2h"), Ok(7_200_000_000_000));
    assert_eq!(ms("300us"), Ok(300_000));
    assert_eq!(ms("300µs"), Ok(300_000));
    assert_eq!(ms("7ns"), Ok(7));
    assert_eq!(ms("0"), Ok(0));
    for bad in ["", "50", "5x", "-1s", "ms", "1..5s", "1.5.s", "s5"] {
        assert!(parse_go_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn defaults_and_values() {
    let s = Settings::from_map(&env(&[])).unwrap();
    assert_eq!((s.port, s.grpc_port), (8080, 8081));
    assert_eq!(s.redis, RedisAddr::Unix("/var/run/nutcracker/ratelimit.sock".into()));
    assert_eq!(s.redis_timeout, Duration::from_secs(10));
    assert_eq!(s.config_dir, PathBuf::from("/srv/runtime_data/current/config"));
    assert_eq!(s.header_limit, "RateLimit-Limit");
    let s = Settings::from_map(&env(&[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "127.0.0.1:7000"),
        ("REDIS_TYPE", "SINGLE"),
        ("REDIS_AUTH", "user:secret"),
        ("REDIS_TIMEOUT", "50ms"),
        ("RUNTIME_ROOT", "/r"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_RESET_HEADER", "X-Reset"),
        ("SHADOW_MODE", "1"),
        ("REDIS_TLS", "false"),
    ]))
    .unwrap();
    assert_eq!(s.redis, RedisAddr::Tcp("127.0.0.1:7000".into()));
    assert_eq!(s.redis_auth, Some((Some("user".into()), "secret".into())));
    assert_eq!(s.redis_timeout, Duration::from_millis(50));
    assert_eq!(s.config_dir, PathBuf::from("/r/ratelimit/config"));
    assert!(s.headers_enabled && s.shadow_mode && s.header_reset == "X-Reset");
    let info = s.redis_info();
    assert_eq!(info.redis_settings().password(), Some("secret"));
}

#[test]
fn refuses_what_it_does_not_support() {
    for (k, v, want) in [
        ("REDIS_TYPE", "replicated", "REDIS_TYPE"),
        ("PANIC_MODE", "open", "PANIC_MODE"),
        ("PANIC_INSTANCES", "0", "PANIC_INSTANCES"),
        ("REDIS_PERSECOND", "true", "REDIS_PERSECOND"),
        ("GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"),
        ("GRPC_SERVER_USE_TLS", "yes", "GRPC_SERVER_USE_TLS"),
        ("PROMETHEUS_MAPPER_YAML", "/m.yaml", "PROMETHEUS_MAPPER_YAML"),
        ("USE_PROMETHEUS", "yes", "USE_PROMETHEUS"),
        ("BACKEND_TYPE", "memcache", "BACKEND_TYPE"),
        ("QUOTA_MODE", "yes", "QUOTA_MODE"),
        ("REDIS_TIMEOUT", "10", "REDIS_TIMEOUT"),
        ("REDIS_SOCKET_TYPE", "udp", "REDIS_SOCKET_TYPE"),
        ("SHADOW_MODE", "yes", "SHADOW_MODE"),
        ("NEAR_LIMIT_RATIO", "1.5", "NEAR_LIMIT_RATIO"),
        ("CACHE_KEY_PREFIX", "a{b", "CACHE_KEY_PREFIX"),
        ("PORT", "http", "PORT"),
    ] {
        let e = Settings::from_map(&env(&[(k, v)])).unwrap_err();
        assert!(e.contains(want), "{k}={v}: {e}");
    }
}

#[test]
fn prometheus_settings() {
    assert_eq!(Settings::from_map(&env(&[])).unwrap().prometheus, None);
    // USE_STATSD is true unless set (envoyproxy/ratelimit's default), and refused with Prometheus
    let p =
        |vars: &[(&str, &str)]| Settings::from_map(&env(&[vars, &[("USE_STATSD", "false")]].concat())).map(|s| s.prometheus);
    // envoyproxy/ratelimit's defaults; Go's ":port" listens on every address
    assert_eq!(p(&[("USE_PROMETHEUS", "true")]), Ok(Some(("0.0.0.0:9090".into(), "/metrics".into()))));
    assert_eq!(
        p(&[("USE_PROMETHEUS", "1"), ("PROMETHEUS_ADDR", "127.0.0.1:9102"), ("PROMETHEUS_PATH", "/m")]),
        Ok(Some(("127.0.0.1:9102".into(), "/m".into())))
    );
    assert!(p(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "m")]).unwrap_err().contains("PROMETHEUS_PATH"));
}

#[test]
fn sentinel_cluster_and_panic_mode() {
    // envoyproxy/ratelimit's syntax: sentinel "master,host:port,...", cluster "host:port,..."
    let s = Settings::from_map(&env(&[
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", "mymaster,10.0.0.1:26379,10.0.0.2:26379"),
        ("REDIS_AUTH", "u:p@ss"),
        ("REDIS_SENTINEL_AUTH", "s3cret"),
    ]))
    .unwrap();
    assert_eq!(
        s.redis_type,
        RedisType::Sentinel { master: "mymaster".into(), sentinels: vec!["10.0.0.1:26379".into(), "10.0.0.2:26379".into()] }
    );
    assert_eq!(s.redis_urls(), vec!["redis://:s3cret@10.0.0.1:26379/", "redis://:s3cret@10.0.0.2:26379/"]);
    // the primary's credentials go to the primary, not the sentinels
    assert_eq!(s.redis_info().redis_settings().password(), Some("p@ss"));
    assert_eq!(s.panic_mode, PanicMode::Error);
    let s = Settings::from_map(&env(&[
        ("REDIS_TYPE", "Cluster"),
        ("REDIS_URL", "10.0.0.1:7000, 10.0.0.2:7001"),
        ("REDIS_AUTH", "u:p@ss"),
        ("PANIC_MODE", "local"),
        ("PANIC_INSTANCES", "3"),
    ]))
    .unwrap();
    assert_eq!(s.redis_type, RedisType::Cluster { nodes: vec!["10.0.0.1:7000".into(), "10.0.0.2:7001".into()] });
    assert_eq!(s.redis_urls(), vec!["redis://u:p%40ss@10.0.0.1:7000/", "redis://u:p%40ss@10.0.0.2:7001/"]);
    assert_eq!(s.panic_mode, PanicMode::Local(3));
    for (m, want) in [("allow", PanicMode::Allow), ("DENY", PanicMode::Deny), ("error", PanicMode::Error)] {
        assert_eq!(Settings::from_map(&env(&[("PANIC_MODE", m)])).unwrap().panic_mode, want);
    }
    for (t, url) in
        [("sentinel", "mymaster"), ("sentinel", ",h:1"), ("sentinel", "m,h"), ("cluster", "h:1,h"), ("cluster", "h:x")]
    {
        let e = Settings::from_map(&env(&[("REDIS_TYPE", t), ("REDIS_URL", url)])).unwrap_err();
        assert!(e.contains("REDIS_URL"), "{t} {url}: {e}");
    }
}
