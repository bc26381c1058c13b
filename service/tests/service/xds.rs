//! `CONFIG_TYPE=GRPC_XDS_SOTW` against an xDS management server started by
//! the test: a tonic `AggregatedDiscoveryService` (state of the world) in
//! this process, over mutual TLS with certificates the test makes
//! (`tls::Pki`), serving `ratelimit.config.ratelimit.v3.RateLimitConfig`
//! resources and recording every request the service sends (its ACKs and
//! NACKs). Envoy Gateway's deployment runs the service binary with Envoy
//! Gateway's environment, started before the xDS server exists; the other
//! tests run the service in-process.

use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy};
use prost::Message;
use redis_ratelimit_service::xds::TYPE_URL;
use rustls::pki_types::pem::PemObject;

use crate::support::*;
use crate::tls::Pki;

/// What the test's xDS server serves and what it has seen.
#[derive(Default)]
struct Seen {
    /// Every request received, in order, with the stream's metadata.
    requests: Vec<(DiscoveryRequest, tonic::metadata::MetadataMap)>,
    /// The nonce of each version sent.
    nonces: Vec<(String, String)>,
}

struct Ads {
    /// The snapshot: (version, resources); a change is sent on every stream.
    snapshot: tokio::sync::watch::Sender<(String, Vec<RateLimitConfig>)>,
    seen: Arc<Mutex<Seen>>,
    /// Bumped: every open stream ends with UNAVAILABLE (a server restarting).
    cut: tokio::sync::watch::Sender<u32>,
}

impl Ads {
    fn new(version: &str, resources: Vec<RateLimitConfig>) -> Arc<Ads> {
        Arc::new(Ads {
            snapshot: tokio::sync::watch::Sender::new((version.to_owned(), resources)),
            seen: Arc::default(),
            cut: tokio::sync::watch::Sender::new(0),
        })
    }

    /// The subscriptions seen (requests without a nonce), with their metadata.
    fn subscriptions(&self) -> Vec<(DiscoveryRequest, tonic::metadata::MetadataMap)> {
        self.seen.lock().unwrap().requests.iter().filter(|(r, _)| r.response_nonce.is_empty()).cloned().collect()
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = tokio_stream::wrappers::ReceiverStream<Result<DiscoveryResponse, tonic::Status>>;
    type DeltaAggregatedResourcesStream =
        tokio_stream::wrappers::ReceiverStream<Result<DeltaDiscoveryResponse, tonic::Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        let metadata = request.metadata().clone();
        let mut incoming = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let mut snap = self.snapshot.subscribe();
        let mut cut = self.cut.subscribe();
        let seen = self.seen.clone();
        tokio::spawn(async move {
            let mut subscribed = false;
            loop {
                let send = tokio::select! {
                    r = incoming.message() => {
                        let Ok(Some(r)) = r else { return };
                        subscribed = true;
                        // the subscription gets the current snapshot; an ACK or a NACK nothing
                        let first = r.response_nonce.is_empty();
                        seen.lock().unwrap().requests.push((r, metadata.clone()));
                        first
                    }
                    c = snap.changed(), if subscribed => c.is_ok() || return,
                    _ = cut.changed() => {
                        let _ = tx.send(Err(tonic::Status::unavailable("the xDS server restarts"))).await;
                        return;
                    }
                };
                if !send {
                    continue;
                }
                let (version, resources) = snap.borrow_and_update().clone();
                if version.is_empty() {
                    continue;
                }
                // unique across streams: an answer names one response
                let nonce = {
                    let mut s = seen.lock().unwrap();
                    let n = (s.nonces.len() + 1).to_string();
                    s.nonces.push((version.clone(), n.clone()));
                    n
                };
                let resp = DiscoveryResponse {
                    version_info: version.clone(),
                    type_url: TYPE_URL.into(),
                    nonce,
                    resources: resources
                        .iter()
                        .map(|c| Any { type_url: TYPE_URL.into(), value: c.encode_to_vec() })
                        .collect(),
                    ..DiscoveryResponse::default()
                };
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
        });
        Ok(tonic::Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only"))
    }
}

/// The xDS server on `port` without TLS, until the task is aborted.
fn plain_xds_server(port: u16, ads: Arc<Ads>) -> tokio::task::JoinHandle<()> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::from_arc(ads))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    })
}

/// The xDS server on `port`, over mutual TLS (its certificate `server`,
/// client certificates of `ca.crt` required), until the task is aborted.
fn xds_server(pki: &Pki, port: u16, ads: Arc<Ads>) -> tokio::task::JoinHandle<()> {
    use redis_ratelimit_service::tls::{incoming, GrpcTls, GrpcTlsVars};
    let (cert, key, ca) = (pki.path("server.crt"), pki.path("server.key"), pki.path("ca.crt"));
    let tls = GrpcTls::from_vars(&GrpcTlsVars {
        use_tls: true,
        cert: &cert,
        key: &key,
        client_ca: &ca,
        client_san: "",
        server_ca: "",
    })
    .unwrap()
    .unwrap();
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(AggregatedDiscoveryServiceServer::from_arc(ads))
            .serve_with_incoming(incoming(listener, &tls))
            .await
            .unwrap();
    })
}

fn policy(unit: i32, n: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy { unit, requests_per_unit: n, ..RateLimitPolicy::default() })
}

const HOUR: i32 = 3;
const UNKNOWN: i32 = 0;

/// Two domains, as Envoy Gateway names its resources: `gw-a` limits each
/// `user` to `per_user` an hour; `gw-b` limits `path=/x` to 1 an hour.
fn snapshot(per_user: u32) -> Vec<RateLimitConfig> {
    vec![
        RateLimitConfig {
            name: "default/eg/http".into(),
            domain: "gw-a".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "user".into(),
                rate_limit: policy(HOUR, per_user),
                ..RateLimitDescriptor::default()
            }],
        },
        RateLimitConfig {
            name: "default/eg/https".into(),
            domain: "gw-b".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "path".into(),
                value: "/x".into(),
                rate_limit: policy(HOUR, 1),
                ..RateLimitDescriptor::default()
            }],
        },
    ]
}

/// A gRPC channel over TLS to the service (verified against `ca.crt` as `localhost`).
async fn tls_client(pki: &Pki, port: u16) -> RateLimitServiceClient<tonic::transport::Channel> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(pki.path("ca.crt")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

/// Polls (without blocking the runtime) until `f` holds.
async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(120), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The requests the server has seen that answer `version`'s nonce.
fn answers(seen: &Mutex<Seen>, version: &str) -> Vec<DiscoveryRequest> {
    let s = seen.lock().unwrap();
    let nonces: Vec<&String> = s.nonces.iter().filter(|(v, _)| v == version).map(|(_, n)| n).collect();
    s.requests.iter().filter(|(r, _)| nonces.contains(&&r.response_nonce)).map(|(r, _)| r.clone()).collect()
}

/// A redis-server (REDIS_SERVER) with the module, on a free port.
struct RedisProc {
    port: u16,
    _proc: Proc,
}

impl RedisProc {
    fn start() -> RedisProc {
        let port = port();
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let proc = Proc(
            Command::new(bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(common::module_args())
                .current_dir(std::env::temp_dir())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start REDIS_SERVER"),
        );
        wait_for("redis", Duration::from_secs(60), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        RedisProc { port, _proc: proc }
    }
}

/// `GET path` on the HTTP listener: the status.
async fn http_get(port: u16, path: &str) -> u16 {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out[9..12].parse().unwrap()
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n").unwrap().1.to_owned()
}

fn one(domain: &str, k: &str, v: &str) -> RateLimitRequest {
    req(domain, vec![desc(&[(k, v)])])
}

/// Envoy Gateway's deployment: the rate-limit service's environment as
/// Envoy Gateway sets it (xDS over mutual TLS, forced start, gRPC over TLS,
/// Prometheus with its statsd-exporter mapping, no statsd), started before
/// the xDS server; then two domains over xDS, an update, a bad update
/// NACKed with its error while the last good configuration stays live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_deployment_over_xds() {
    in_one_window(HOUR_MS, || async {
        let pki = Pki::new();
        let xds_port = port();
        let mapper = std::env::temp_dir().join(format!("rl-xds-mapper-{}-{}.yaml", std::process::id(), port()));
        write(&mapper, crate::statsd::GATEWAY_MAPPING);
        let (crt, key, ca) = (pki.path("server.crt"), pki.path("server.key"), pki.path("ca.crt"));
        let (ccrt, ckey) = (pki.path("client.crt"), pki.path("client.key"));
        let url = format!("localhost:{xds_port}");
        let mapper_path = mapper.to_string_lossy().into_owned();
        let redis = RedisProc::start();
        let (grpc, http, prom) = (port(), port(), port());
        let (redis_url, grpc_port, http_port, prom_addr) =
            (format!("127.0.0.1:{}", redis.port), grpc.to_string(), http.to_string(), format!("127.0.0.1:{prom}"));
        let data = std::env::temp_dir().join(format!("rl-xds-eg-{}-{}", std::process::id(), port()));
        let data_path = data.to_string_lossy().into_owned();
        // Envoy Gateway's variables (its ports made free ones), nothing else
        let env = [
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &*redis_url),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", &*grpc_port),
            ("HOST", "127.0.0.1"),
            ("PORT", &*http_port),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
            ("RUNTIME_ROOT", &*data_path),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", &*url),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", &*ccrt),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", &*ckey),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", &*ca),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &*crt),
            ("GRPC_SERVER_TLS_KEY", &*key),
            ("GRPC_SERVER_TLS_CA_CERT", &*ca),
            ("USE_STATSD", "false"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("LOG_LEVEL", "info"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &*prom_addr),
            ("PROMETHEUS_MAPPER_YAML", &*mapper_path),
        ];
        // the binary, with no xDS server yet: it starts anyway, every domain unknown
        let log = data.with_extension("log");
        let _svc = Proc(
            Command::new(crate::lifecycle::service_bin())
                .env_clear()
                .envs(env)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("start the service binary"),
        );
        until("the service's listeners", || std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()).await;
        let mut c = tls_client(&pki, grpc).await;
        let r = c.should_rate_limit(one("gw-a", "user", "u1")).await.unwrap().into_inner();
        assert_eq!((r.overall_code, r.statuses[0].current_limit.is_some()), (OK, false));
        assert_eq!(http_get(http, "/healthcheck").await, 200);

        // the service dials the xDS server's address and finds nothing
        // there (a listener that accepts and closes: no xDS server yet)
        let placeholder = std::net::TcpListener::bind(("127.0.0.1", xds_port)).unwrap();
        let (dialled, _) = tokio::task::spawn_blocking(move || placeholder.accept().unwrap()).await.unwrap();
        drop(dialled);

        // the xDS server appears; the service connects and ACKs version 1
        let ads = Ads::new("1", snapshot(2));
        let seen = ads.seen.clone();
        let server = xds_server(&pki, xds_port, ads.clone());
        until("the ACK of version 1", || !answers(&seen, "1").is_empty()).await;
        let ack = &answers(&seen, "1")[0];
        assert_eq!((ack.version_info.as_str(), ack.error_detail.is_none()), ("1", true), "{ack:?}");
        {
            let s = seen.lock().unwrap();
            let (first, _) = &s.requests[0];
            assert_eq!(first.node.as_ref().unwrap().id, "envoy-ratelimit");
            assert_eq!(first.type_url, TYPE_URL);
            assert!(first.resource_names.is_empty(), "a wildcard subscription");
        }

        // decisions for both domains, over TLS
        let mut codes = vec![];
        for _ in 0..3 {
            codes.push(c.should_rate_limit(one("gw-a", "user", "u1")).await.unwrap().into_inner().overall_code);
        }
        assert_eq!(codes, [OK, OK, OVER]);
        let b: Vec<i32> = [
            c.should_rate_limit(one("gw-b", "path", "/x")).await.unwrap().into_inner().overall_code,
            c.should_rate_limit(one("gw-b", "path", "/x")).await.unwrap().into_inner().overall_code,
            c.should_rate_limit(one("gw-b", "path", "/y")).await.unwrap().into_inner().overall_code,
        ]
        .into();
        assert_eq!(b, [OK, OVER, OK]);

        // an update applies: 10 an hour for each user
        ads.snapshot.send_replace(("2".to_owned(), snapshot(10)));
        until("the ACK of version 2", || !answers(&seen, "2").is_empty()).await;
        assert!(answers(&seen, "2")[0].error_detail.is_none());
        let r = c.should_rate_limit(one("gw-a", "user", "u1")).await.unwrap().into_inner();
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 10);

        // a bad one (a limit without a unit) is NACKed with the loader's
        // error, naming the resource; version 2 stays live
        let mut bad = snapshot(10);
        bad[0].descriptors.push(RateLimitDescriptor {
            key: "team".into(),
            rate_limit: policy(UNKNOWN, 1),
            ..RateLimitDescriptor::default()
        });
        ads.snapshot.send_replace(("3".to_owned(), bad));
        until("the NACK of version 3", || !answers(&seen, "3").is_empty()).await;
        let nack = &answers(&seen, "3")[0];
        let detail = nack.error_detail.as_ref().expect("a NACK carries error_detail");
        assert!(detail.message.contains("default/eg/http") && detail.message.contains("UNKNOWN"), "{detail:?}");
        assert_eq!(nack.version_info, "2", "a NACK names the last version applied");
        let logged = std::fs::read_to_string(&log).unwrap();
        // logrus's text: the message quoted, its quotes escaped
        assert!(logged.contains(r#"level=error msg="config refused: xDS version \"3\""#), "{logged}");
        let r = c.should_rate_limit(one("gw-a", "user", "u1")).await.unwrap().into_inner();
        assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 10);
        let r = c.should_rate_limit(one("gw-b", "path", "/x")).await.unwrap().into_inner();
        assert_eq!(r.overall_code, OVER);
        // the team limit of version 3 never applied
        let r = c.should_rate_limit(one("gw-a", "team", "t")).await.unwrap().into_inner();
        assert!(r.statuses[0].current_limit.is_none());

        // the figures through Envoy Gateway's mapping
        let body = scrape(([127, 0, 0, 1], prom).into()).await;
        assert!(body.contains("ratelimit_service_config_load_success 2"), "{body}");
        assert!(body.contains(r#"ratelimit_service_rate_limit_over_limit{domain="gw-a",key1="user"} 1"#), "{body}");
        server.abort();
        let _ = std::fs::remove_file(&mapper);
        let _ = std::fs::remove_file(&log);
    })
    .await;
}

async fn health(e: &Env) -> u16 {
    e.http("GET", "/healthcheck", "").await.0
}

/// The xDS client's own settings: node metadata and extra headers on every
/// stream, HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED following what the server
/// sends (no domain: failing), and a stream the server ends opened again
/// after the backoff, resuming from the version last applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_headers_health_and_reconnect() {
    in_one_window(HOUR_MS, || async {
        let xds_port = port();
        // nothing to send yet: the subscription gets no answer
        let ads = Ads::new("", vec![]);
        let server = plain_xds_server(xds_port, ads.clone());
        let url = format!("127.0.0.1:{xds_port}");
        let e = Env::start(
            "xds-node",
            "",
            &[
                ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
                ("CONFIG_GRPC_XDS_SERVER_URL", &*url),
                ("CONFIG_GRPC_XDS_NODE_METADATA", "cluster=eg,zone=a,skipped"),
                ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-tenant:t1,x-team:rl"),
                ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms"),
                ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "50ms"),
                ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "200ms"),
                ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
                ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ],
        )
        .await;
        until("the subscription", || !ads.subscriptions().is_empty()).await;
        let (sub, md) = ads.subscriptions()[0].clone();
        let node = sub.node.unwrap();
        assert_eq!(node.id, "default", "upstream's default node id");
        let fields = node.metadata.unwrap().fields;
        let text = |k: &str| match fields.get(k).and_then(|v| v.kind.clone()) {
            Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => s,
            other => panic!("metadata {k}: {other:?}"),
        };
        assert_eq!((text("cluster"), text("zone"), fields.len()), ("eg".to_owned(), "a".to_owned(), 2));
        assert_eq!(
            (md.get("x-tenant").unwrap().to_str().unwrap(), md.get("x-team").unwrap().to_str().unwrap()),
            ("t1", "rl")
        );
        // no configuration yet: unhealthy, every domain unknown
        assert_eq!(health(&e).await, 500);
        let r = e.ask(one("gw-a", "user", "u1")).await;
        assert!(r.statuses[0].current_limit.is_none());

        ads.snapshot.send_replace(("1".into(), snapshot(2)));
        until("the ACK of version 1", || !answers(&ads.seen, "1").is_empty()).await;
        assert_eq!(health(&e).await, 200);
        // a configuration without any domain: unhealthy again, as upstream
        ads.snapshot.send_replace(("2".into(), vec![]));
        until("the ACK of version 2", || !answers(&ads.seen, "2").is_empty()).await;
        assert_eq!(health(&e).await, 500);
        ads.snapshot.send_replace(("3".into(), snapshot(4)));
        until("the ACK of version 3", || !answers(&ads.seen, "3").is_empty()).await;
        assert_eq!(health(&e).await, 200);

        // the server ends the stream: the service subscribes again, from version 3
        ads.cut.send_modify(|n| *n += 1);
        until("a second subscription", || ads.subscriptions().len() >= 2).await;
        let (again, md) = ads.subscriptions()[1].clone();
        assert_eq!(again.version_info, "3");
        assert_eq!(md.get("x-tenant").unwrap().to_str().unwrap(), "t1");
        until("version 3 ACKed twice", || answers(&ads.seen, "3").len() >= 2).await;
        ads.snapshot.send_replace(("4".into(), snapshot(1)));
        until("the ACK of version 4", || !answers(&ads.seen, "4").is_empty()).await;
        let r = e.ask(one("gw-a", "user", "u-reconnect")).await;
        assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 1);
        assert_eq!(health(&e).await, 200);
        server.abort();
    })
    .await;
}

/// Without FORCE_START_WITHOUT_INITIAL_CONFIG the service waits for the
/// xDS server's first configuration before it serves, as upstream waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_force_start_the_first_configuration_is_awaited() {
    in_one_window(HOUR_MS, || async {
        let xds_port = port();
        let ads = Ads::new("", vec![]);
        let server = plain_xds_server(xds_port, ads.clone());
        let url = format!("127.0.0.1:{xds_port}");
        let start = tokio::spawn(async move {
            Env::start("xds-wait", "", &[("CONFIG_TYPE", "GRPC_XDS_SOTW"), ("CONFIG_GRPC_XDS_SERVER_URL", &*url)]).await
        });
        until("the subscription", || !ads.subscriptions().is_empty()).await;
        assert!(!start.is_finished(), "the service started before any configuration arrived");
        ads.snapshot.send_replace(("1".into(), snapshot(2)));
        let e = start.await.unwrap();
        // live from the first request on
        let r = e.ask(one("gw-a", "user", "u1")).await;
        assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 2);
        until("the ACK of version 1", || !answers(&ads.seen, "1").is_empty()).await;
        server.abort();
    })
    .await;
}

/// FORCE_START_WITHOUT_INITIAL_CONFIG with the files: a configuration that
/// does not load is no reason not to serve (every domain unknown, the
/// refusal counted); the first good one is picked up as any reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_with_files_that_do_not_load() {
    in_one_window(HOUR_MS, || async {
        let bad = "domain: gw-a\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n";
        let e = Env::start(
            "force-files",
            bad,
            &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"), ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")],
        )
        .await;
        // without it, the same files stop the start
        let err = Env::try_serve("force-off", &[bad], &[], e.redis_port, None).await.err().unwrap();
        assert!(err.contains("fortnight"), "{err}");
        assert!(e.refusal().is_some_and(|r| r.contains("fortnight")));
        assert_eq!(health(&e).await, 500);
        let r = e.ask(one("gw-a", "user", "u1")).await;
        assert_eq!((r.overall_code, r.statuses[0].current_limit.is_none()), (OK, true));
        let good = "domain: gw-a\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
        write(&e.dir.join("v1/ratelimit/config/config.yaml"), good);
        until("the good file loaded", || e.refusal().is_none()).await;
        assert_eq!(health(&e).await, 200);
        let r = e.ask(one("gw-a", "user", "u1")).await;
        assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().requests_per_unit, 1);
    })
    .await;
}
