//! The configuration: reloaded on a change and on a symlink swap, bad
//! files refused, a bad first one refused at start; the Envoy example's
//! bootstrap, compose file and configuration agree.

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_on_change_and_symlink_swap_refusing_bad_files() {
    let one = "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let e = Env::start("reload", one, &[]).await;
    let ask = || e.ask(req("r", vec![desc(&[("k", "v")])]));
    let limit_now = |a: RateLimitResponse| a.statuses[0].current_limit.clone().map(|l| l.requests_per_unit);
    assert_eq!(limit_now(ask().await), Some(1));
    // the file changes: 5 per hour
    let path = e.dir.join("v1/ratelimit/config/config.yaml");
    write(&path, &one.replace("requests_per_unit: 1", "requests_per_unit: 5"));
    let t0 = Instant::now();
    while limit_now(ask().await) != Some(5) {
        assert!(t0.elapsed() < Duration::from_secs(60), "the change was not loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // a bad file is refused with its error; the last good configuration stays live
    write(
        &e.dir.join("v1/ratelimit/config/bad.yaml"),
        "domain: r2\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let t0 = Instant::now();
    while e.refusal().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the bad file was not refused");
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
        assert!(t0.elapsed() < Duration::from_secs(60), "the swap was not loaded");
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
    vars.insert("REDIS_STARTUP_MAX_ELAPSED_TIME".into(), "1ns".into());
    let err = server::start(Settings::from_map(&vars).unwrap()).await.err().unwrap();
    assert!(err.contains("connecting to Redis"), "{err}");
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
    in_one_window(60_000, || async {
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
        // the six calls below count in one minute (in_one_window)
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
    })
    .await;
}
