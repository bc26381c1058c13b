//! The statistics' sinks as envoyproxy/ratelimit has them: statsd (the
//! default) to a UDP and a TCP listener the test binds, DogStatsD with a
//! mogrifier, Prometheus through Envoy Gateway's kind of statsd-exporter
//! mapping (`PROMETHEUS_MAPPER_YAML`), and the startup rules (one sink at
//! most, `DISABLE_STATS`). The counters follow envoyproxy/ratelimit's
//! split (limiter/base_limiter.go): a request that crosses its limit counts
//! its hits up to the limit as near and the rest as over; a shadow-mode
//! limit counts only the over part in `shadow_mode`.

use std::sync::{Arc, Mutex};

use crate::support::*;

const CONFIG: &str = r#"
domain: s
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: route
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: svc
    value: "api*"
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: org
    descriptors:
      - key: team
        value_to_metric: true
        rate_limit: {unit: hour, requests_per_unit: 10}
"#;

/// What a statsd listener received: counters summed by name, and the
/// values of each timer, as lines arrive.
#[derive(Default, Debug)]
struct Received {
    counters: HashMap<String, u64>,
    timers: HashMap<String, Vec<u64>>,
    raw: Vec<String>,
}

impl Received {
    fn add(&mut self, line: &str) {
        if line.is_empty() {
            return;
        }
        self.raw.push(line.to_owned());
        // statsd: name:value|type; DogStatsD: name:value|type|#tags (kept with the name)
        let (head, tags) = line.split_once("|#").map_or((line, None), |(h, t)| (h, Some(t)));
        let (name, rest) = head.rsplit_once(':').unwrap_or_else(|| panic!("a statsd line: {line:?}"));
        let (v, t) = rest.split_once('|').unwrap_or_else(|| panic!("a statsd line: {line:?}"));
        let name = match tags {
            Some(tags) => format!("{name}|#{tags}"),
            None => name.to_owned(),
        };
        let v: u64 = v.parse().unwrap_or_else(|_| panic!("an integer value: {line:?}"));
        match t {
            "c" => *self.counters.entry(name).or_default() += v,
            "ms" => self.timers.entry(name).or_default().push(v),
            other => panic!("type {other:?}: {line:?}"),
        }
    }
}

/// A UDP statsd listener on a free port: its port and what it received.
async fn udp_listener() -> (u16, Arc<Mutex<Received>>) {
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let port = sock.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Received::default()));
    let g = got.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = sock.recv(&mut buf).await {
            assert!(n <= redis_ratelimit_service::statsd::UDP_PAYLOAD, "a datagram of {n} bytes");
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(text.ends_with('\n'), "whole lines: {text:?}");
            let mut r = g.lock().unwrap();
            for l in text.lines() {
                r.add(l);
            }
        }
    });
    (port, got)
}

/// A TCP statsd listener: its port, what it received, and how many connections it took.
async fn tcp_listener() -> (u16, Arc<Mutex<Received>>, Arc<Mutex<u32>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Received::default()));
    let conns = Arc::new(Mutex::new(0));
    let (g, c) = (got.clone(), conns.clone());
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            *c.lock().unwrap() += 1;
            let g = g.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(s);
                let mut line = String::new();
                use tokio::io::AsyncBufReadExt;
                while lines.read_line(&mut line).await.is_ok_and(|n| n > 0) {
                    g.lock().unwrap().add(line.trim_end_matches('\n'));
                    line.clear();
                }
            });
        }
    });
    (port, got, conns)
}

/// Waits (up to 60 s: the flushes run every 20 ms) until the counters
/// received are `want` exactly, then returns what was received.
async fn until_counters(got: &Arc<Mutex<Received>>, want: &HashMap<String, u64>, timers: usize) {
    let t0 = Instant::now();
    loop {
        {
            let r = got.lock().unwrap();
            let n: usize = r.timers.values().map(Vec::len).sum();
            if &r.counters == want && n == timers {
                return;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                let mut have: Vec<_> = r.counters.iter().collect();
                have.sort();
                let mut w: Vec<_> = want.iter().collect();
                w.sort();
                panic!("statsd counters:\n have {have:?}\n want {w:?}\n timers {n} of {timers}\n raw {:?}", r.raw);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn hits(domain: &str, k: &str, v: &str, n: u64) -> RateLimitRequest {
    let mut d = desc(&[(k, v)]);
    d.hits_addend = Some(UInt64Value { value: n });
    req(domain, vec![d])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statsd_over_udp_counts_as_envoyproxy_ratelimit() {
    in_one_window(HOUR_MS, || async {
        let (sport, got) = udp_listener().await;
        let sport = sport.to_string();
        let e = Env::start(
            "statsd-udp",
            CONFIG,
            &[
                ("USE_STATSD", "true"),
                ("STATSD_HOST", "127.0.0.1"),
                ("STATSD_PORT", &sport),
                ("STATSD_PROTOCOL", "udp"),
                ("STATS_FLUSH_INTERVAL", "20ms"),
                ("EXTRA_TAGS", "env:prod.eu,a:b"),
            ],
        )
        .await;
        // user (5 an hour; near above floor(5 × 0.8) = 4): 3 within, then 4
        // more cross the limit: 5 − 3 = 2 would fit, 1 of them near, 2 over
        assert_eq!(e.ask(hits("s", "user", "u1", 3)).await.overall_code, OK);
        assert_eq!(e.ask(hits("s", "user", "u1", 4)).await.overall_code, OVER);
        // shadow (2 an hour; near above 1): 1 within, then 3 cross: 1 near, 2 over and shadow
        assert_eq!(e.ask(hits("s", "shadow", "x", 1)).await.overall_code, OK);
        assert_eq!(e.ask(hits("s", "shadow", "x", 3)).await.overall_code, OK);
        // detailed_metric: the request's value in the name, an IPv4 address's dots made _
        e.ask(hits("s", "tenant", "10.1.2.3", 1)).await;
        // value_to_metric: the request's value in place of a default key's or a wildcard's
        e.ask(hits("s", "route", "r1", 1)).await;
        e.ask(hits("s", "svc", "api7", 1)).await;
        e.ask(req("s", vec![desc(&[("org", "o1"), ("team", "t1")])])).await;
        // a domain no file has: domain_not_found once per descriptor
        e.ask(req("nope", vec![desc(&[("a", "1")]), desc(&[("b", "2")])])).await;
        let tags = ".__a=b.__env=prod_eu";
        let rl = |k: &str, c: &str| format!("ratelimit.service.rate_limit.{k}.{c}{tags}");
        let want: HashMap<String, u64> = [
            (rl("s.user", "total_hits"), 7),
            (rl("s.user", "within_limit"), 3),
            (rl("s.user", "near_limit"), 1),
            (rl("s.user", "over_limit"), 2),
            (rl("s.shadow", "total_hits"), 4),
            (rl("s.shadow", "within_limit"), 1),
            (rl("s.shadow", "near_limit"), 1),
            (rl("s.shadow", "over_limit"), 2),
            (rl("s.shadow", "shadow_mode"), 2),
            (rl("s.tenant_10_1_2_3", "total_hits"), 1),
            (rl("s.tenant_10_1_2_3", "within_limit"), 1),
            (rl("s.route_r1", "total_hits"), 1),
            (rl("s.route_r1", "within_limit"), 1),
            (rl("s.svc_api7", "total_hits"), 1),
            (rl("s.svc_api7", "within_limit"), 1),
            (rl("s.org.team_t1", "total_hits"), 1),
            (rl("s.org.team_t1", "within_limit"), 1),
            (rl("nope", "domain_not_found"), 2),
            (format!("ratelimit.service.config_load_success{tags}"), 1),
            (format!("ratelimit_server.ShouldRateLimit.total_requests{tags}"), 9),
        ]
        .into_iter()
        .collect();
        until_counters(&got, &want, 9).await;
        let r = got.lock().unwrap();
        assert_eq!(r.timers.keys().collect::<Vec<_>>(), [&format!("ratelimit_server.ShouldRateLimit.response_time{tags}")]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statsd_over_tcp_is_the_default_on_one_connection() {
    in_one_window(HOUR_MS, || async {
        let (sport, got, conns) = tcp_listener().await;
        let sport = sport.to_string();
        // USE_STATSD empty (as unset): true, as there; STATSD_PROTOCOL unset: TCP
        let e = Env::start(
            "statsd-tcp",
            CONFIG,
            &[("USE_STATSD", ""), ("STATSD_HOST", "127.0.0.1"), ("STATSD_PORT", &sport), ("STATS_FLUSH_INTERVAL", "20ms")],
        )
        .await;
        assert_eq!(
            e.svc.service.settings().stats_sink,
            redis_ratelimit_service::settings::StatsSink::Statsd { addr: format!("127.0.0.1:{sport}"), udp: false }
        );
        e.ask(hits("s", "user", "u1", 2)).await;
        let mut want: HashMap<String, u64> = [
            ("ratelimit.service.rate_limit.s.user.total_hits".to_owned(), 2),
            ("ratelimit.service.rate_limit.s.user.within_limit".to_owned(), 2),
            ("ratelimit.service.config_load_success".to_owned(), 1),
            ("ratelimit_server.ShouldRateLimit.total_requests".to_owned(), 1),
        ]
        .into_iter()
        .collect();
        until_counters(&got, &want, 1).await;
        assert_eq!(*conns.lock().unwrap(), 1, "one connection for every flush");
        e.ask(hits("s", "user", "u1", 1)).await;
        *want.get_mut("ratelimit.service.rate_limit.s.user.total_hits").unwrap() += 1;
        *want.get_mut("ratelimit.service.rate_limit.s.user.within_limit").unwrap() += 1;
        *want.get_mut("ratelimit_server.ShouldRateLimit.total_requests").unwrap() += 1;
        until_counters(&got, &want, 2).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dogstatsd_tags_and_mogrifiers() {
    in_one_window(HOUR_MS, || async {
        let (sport, got) = udp_listener().await;
        let sport = sport.to_string();
        let e = Env::start(
            "dogstatsd",
            CONFIG,
            &[
                ("USE_STATSD", "false"),
                ("USE_DOG_STATSD", "true"),
                ("STATSD_HOST", "127.0.0.1"),
                ("STATSD_PORT", &sport),
                ("STATS_FLUSH_INTERVAL", "20ms"),
                ("EXTRA_TAGS", "env:prod"),
                ("USE_DOG_STATSD_MOGRIFIERS", "PERKEY"),
                ("DOG_STATSD_MOGRIFIER_PERKEY_PATTERN", r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$"),
                ("DOG_STATSD_MOGRIFIER_PERKEY_NAME", "ratelimit.service.rate_limit.$3"),
                ("DOG_STATSD_MOGRIFIER_PERKEY_TAGS", "domain:$1,descriptor:$2"),
            ],
        )
        .await;
        e.ask(hits("s", "user", "u1", 2)).await;
        let per = |c: &str| format!("ratelimit.service.rate_limit.{c}|#env:prod,domain:s,descriptor:user");
        let want: HashMap<String, u64> = [
            (per("total_hits"), 2),
            (per("within_limit"), 2),
            ("ratelimit.service.config_load_success|#env:prod".to_owned(), 1),
            ("ratelimit_server.ShouldRateLimit.total_requests|#env:prod".to_owned(), 1),
        ]
        .into_iter()
        .collect();
        until_counters(&got, &want, 1).await;
        let r = got.lock().unwrap();
        assert!(r.timers.contains_key("ratelimit_server.ShouldRateLimit.response_time|#env:prod"), "{:?}", r.raw);
    })
    .await;
}

fn settings(vars: &[(&str, &str)]) -> Result<Settings, String> {
    Settings::from_map(&vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
}

#[test]
fn one_sink_at_most_as_envoyproxy_ratelimit_starts() {
    use redis_ratelimit_service::settings::StatsSink;
    // USE_STATSD is true unless set: Prometheus alone is "more than one stats sink"
    for vars in [
        &[("USE_PROMETHEUS", "true")][..],
        &[("USE_DOG_STATSD", "true")],
        &[("USE_DOG_STATSD", "true"), ("USE_STATSD", "false"), ("USE_PROMETHEUS", "true")],
    ] {
        let e = settings(vars).unwrap_err();
        assert!(e.contains("more than one stats sink"), "{vars:?}: {e}");
    }
    let s = settings(&[]).unwrap();
    assert_eq!(s.stats_sink, StatsSink::Statsd { addr: "localhost:8125".into(), udp: false });
    assert_eq!(s.stats_flush_interval, Duration::from_secs(10));
    let s = settings(&[("USE_PROMETHEUS", "true"), ("USE_STATSD", "false")]).unwrap();
    assert_eq!((s.stats_sink, s.prometheus.is_some()), (StatsSink::Prometheus, true));
    // DISABLE_STATS: no sink, no Prometheus listener, no check of the others
    let s = settings(&[("DISABLE_STATS", "true"), ("USE_PROMETHEUS", "true")]).unwrap();
    assert_eq!((s.stats_sink, s.prometheus), (StatsSink::None, None));
    assert_eq!(settings(&[("USE_STATSD", "false")]).unwrap().stats_sink, StatsSink::None);
    // EXTRA_TAGS: sorted, values cleaned, empty ones dropped; a malformed pair refused
    let s = settings(&[("EXTRA_TAGS", "z:1.2,a:x|y,e:")]).unwrap();
    assert_eq!(s.extra_tags, [("a".to_owned(), "x_y".to_owned()), ("z".to_owned(), "1_2".to_owned())]);
    assert!(settings(&[("EXTRA_TAGS", "novalue")]).unwrap_err().contains("EXTRA_TAGS"));
    // mogrifiers: a pattern and a name each, the pattern a regular expression
    let dog = [("USE_DOG_STATSD", "true"), ("USE_STATSD", "false"), ("USE_DOG_STATSD_MOGRIFIERS", "M")];
    let e = settings(&dog).unwrap_err();
    assert!(e.contains("no PATTERN specified for mogrifier M"), "{e}");
    let e = settings(&[&dog[..], &[("DOG_STATSD_MOGRIFIER_M_PATTERN", "(")]].concat()).unwrap_err();
    assert!(e.contains("DOG_STATSD_MOGRIFIER_M_PATTERN"), "{e}");
    let e = settings(&[&dog[..], &[("DOG_STATSD_MOGRIFIER_M_PATTERN", "x")]].concat()).unwrap_err();
    assert!(e.contains("no NAME specified"), "{e}");
    assert!(settings(&[("STATSD_PROTOCOL", "sctp")]).unwrap_err().contains("STATSD_PROTOCOL"));
    assert!(settings(&[("STATS_FLUSH_INTERVAL", "0")]).unwrap_err().contains("STATS_FLUSH_INTERVAL"));
}

/// A mapping file of the kind Envoy Gateway generates for its rate-limit
/// deployment: two- and three-part keys by glob, the service counters, the
/// response time as a histogram without a scale, everything else dropped.
pub(crate) const GATEWAY_MAPPING: &str = r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.over_limit"
    name: "ratelimit_service_rate_limit_over_limit"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.near_limit"
    name: "ratelimit_service_rate_limit_near_limit"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.within_limit"
    name: "ratelimit_service_rate_limit_within_limit"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: "ratelimit.service.call.should_rate_limit.*"
    name: "ratelimit_service_should_rate_limit_error"
    match_metric_type: counter
    labels: {err_type: "$1"}
  - match: "ratelimit_server.*.total_requests"
    name: "ratelimit_service_total_requests"
    match_metric_type: counter
    labels: {grpc_method: "$1"}
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: histogram
    labels: {grpc_method: "$1"}
  - match: "ratelimit.service.config_load_success"
    name: "ratelimit_service_config_load_success"
    match_metric_type: counter
  - match: "."
    match_type: "regex"
    action: "drop"
    name: "dropped"
"#;

async fn scrape(e: &Env) -> String {
    let addr = e.svc.metrics_addr.expect("USE_PROMETHEUS=true binds a listener");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n").unwrap().1.to_owned()
}

fn samples(body: &str) -> HashMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_through_a_statsd_exporter_mapping() {
    in_one_window(HOUR_MS, || async {
        let dir = std::env::temp_dir().join(format!("rl-mapper-{}-{}", std::process::id(), port()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("conf.yaml");
        write(&file, GATEWAY_MAPPING);
        let path = file.to_string_lossy().into_owned();
        let nested = format!("{CONFIG}  - key: api\n    descriptors:\n      - key: method\n        rate_limit: {{unit: hour, requests_per_unit: 9}}\n");
        let e = Env::start(
            "mapper",
            &nested,
            &[
                ("USE_STATSD", "false"),
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_ADDR", "127.0.0.1:0"),
                ("PROMETHEUS_MAPPER_YAML", &path),
            ],
        )
        .await;
        e.ask(hits("s", "user", "u1", 3)).await;
        e.ask(hits("s", "user", "u1", 4)).await;
        e.ask(hits("s", "shadow", "x", 3)).await;
        e.ask(req("s", vec![desc(&[("api", "a"), ("method", "GET")])])).await;
        let body = scrape(&e).await;
        let m = samples(&body);
        let user = |c: &str| m.get(&format!(r#"ratelimit_service_rate_limit_{c}{{domain="s",key1="user"}}"#)).copied();
        assert_eq!(
            ["total_hits", "within_limit", "near_limit", "over_limit"].map(user),
            [Some(7.0), Some(3.0), Some(1.0), Some(2.0)],
            "{body}"
        );
        assert_eq!(m[r#"ratelimit_service_rate_limit_total_hits{domain="s",key1="api",key2="method"}"#], 1.0);
        assert_eq!(m[r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}"#], 4.0);
        assert_eq!(m["ratelimit_service_config_load_success"], 1.0);
        // no scale: the histogram is in whole milliseconds, Prometheus's default buckets
        let h = r#"ratelimit_service_response_time_seconds"#;
        assert_eq!(m[&format!(r#"{h}_count{{grpc_method="ShouldRateLimit"}}"#)], 4.0);
        assert_eq!(m[&format!(r#"{h}_bucket{{grpc_method="ShouldRateLimit",le="+Inf"}}"#)], 4.0);
        assert!(m.contains_key(&format!(r#"{h}_bucket{{grpc_method="ShouldRateLimit",le="0.005"}}"#)), "{body}");
        assert!(body.contains(&format!("# TYPE {h} histogram")), "{body}");
        // no rule for shadow_mode, the shadow limit's own series, or the
        // service's other counters: dropped by the catch-all, as the exporter drops them
        assert!(!body.contains("shadow_mode") && !body.contains("global_shadow_mode"), "{body}");
        assert!(!body.contains("config_load_error") && !body.contains("dropped"), "{body}");
        // the mapping leaves the service's own counters alone
        assert!(m.contains_key("redis_ratelimit_client_redis_calls"), "{body}");
        drop(e);
        // a key this service does not read: refused at startup, naming it
        write(&file, "mappings:\n  - match: a.b\n    name: x\n    ttl: 1m\n");
        let Err(err) = Env::try_serve(
            "mapper-bad",
            &[CONFIG],
            &[("USE_STATSD", "false"), ("USE_PROMETHEUS", "true"), ("PROMETHEUS_MAPPER_YAML", &path)],
            port(),
            None,
        )
        .await
        else {
            panic!("a mapping with ttl was accepted");
        };
        assert!(err.contains("PROMETHEUS_MAPPER_YAML") && err.contains("ttl"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}
