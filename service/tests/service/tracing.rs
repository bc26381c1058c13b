//! `TRACING_ENABLED=true` against OTLP collectors started by the test: an
//! OTLP/HTTP receiver (HTTP/1.1 written here, in the clear or over TLS with
//! certificates the test makes) and an OTLP/gRPC one (tonic, the
//! `TraceService/Export` method by hand). The spans a request makes, its
//! parent from `traceparent` or B3, the resource, ParentBased sampling, the
//! export's headers, and the spans still queued sent at SIGTERM.

use std::sync::{Arc, Mutex};

use crate::support::*;
use prost::Message;
use redis_ratelimit_service::otlp::{any_value, ExportTraceServiceRequest, ExportTraceServiceResponse, KeyValue, Span};

const CONFIG: &str =
    "domain: traced\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000\n";

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

/// One export the collector received: its path, its headers (lower-case), its body.
#[derive(Clone)]
struct Export {
    path: String,
    headers: Vec<(String, String)>,
    body: ExportTraceServiceRequest,
}

/// A collector: its address and what it received.
struct Collector {
    port: u16,
    got: Arc<Mutex<Vec<Export>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One HTTP/1.1 request on `io`: answered 200 with an empty protobuf.
async fn serve_http<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut io: S, got: Arc<Mutex<Vec<Export>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match io.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next().unwrap_or_default().split(' ').nth(1).unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned())).collect();
    let len: usize = headers.iter().find(|(k, _)| k == "content-length").map_or(0, |(_, v)| v.parse().unwrap());
    while buf.len() < end + len {
        match io.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = ExportTraceServiceRequest::decode(&buf[end..end + len]).expect("an ExportTraceServiceRequest");
    got.lock().unwrap().push(Export { path, headers, body });
    let ok = ExportTraceServiceResponse::default().encode_to_vec();
    let answer = format!("HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\r\n", ok.len());
    let _ = io.write_all(answer.as_bytes()).await;
    let _ = io.write_all(&ok).await;
    let _ = io.shutdown().await;
}

/// An OTLP/HTTP collector on a free port (over TLS with `tls`).
async fn http_collector(tls: Option<tokio_rustls::TlsAcceptor>) -> Collector {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let task = tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (g, tls) = (g.clone(), tls.clone());
            tokio::spawn(async move {
                match tls {
                    None => serve_http(s, g).await,
                    Some(a) => {
                        if let Ok(s) = a.accept(s).await {
                            serve_http(s, g).await
                        }
                    }
                }
            });
        }
    });
    Collector { port, got, task }
}

/// The gRPC `TraceService`: every `Export` recorded.
#[derive(Clone)]
struct TraceService(Arc<Mutex<Vec<Export>>>);

impl tonic::server::NamedService for TraceService {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

struct ExportMethod(Arc<Mutex<Vec<Export>>>);

impl tonic::server::UnaryService<ExportTraceServiceRequest> for ExportMethod {
    type Response = ExportTraceServiceResponse;
    type Future = std::future::Ready<Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status>>;
    fn call(&mut self, r: tonic::Request<ExportTraceServiceRequest>) -> Self::Future {
        let headers = r
            .metadata()
            .iter()
            .filter_map(|kv| match kv {
                tonic::metadata::KeyAndValueRef::Ascii(k, v) => Some((k.to_string(), v.to_str().ok()?.to_owned())),
                _ => None,
            })
            .collect();
        let e = Export { path: redis_ratelimit_service::otlp::EXPORT_PATH.into(), headers, body: r.into_inner() };
        self.0.lock().unwrap().push(e);
        std::future::ready(Ok(tonic::Response::new(ExportTraceServiceResponse::default())))
    }
}

type HttpRequest = tonic::codegen::http::Request<tonic::body::Body>;
type HttpResponse = tonic::codegen::http::Response<tonic::body::Body>;

impl tower::Service<HttpRequest> for TraceService {
    type Response = HttpResponse;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<HttpResponse, Self::Error>> + Send>>;
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: HttpRequest) -> Self::Future {
        let got = self.0.clone();
        Box::pin(async move {
            assert_eq!(req.uri().path(), redis_ratelimit_service::otlp::EXPORT_PATH);
            let codec = tonic_prost::ProstCodec::<ExportTraceServiceResponse, ExportTraceServiceRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(ExportMethod(got), req).await)
        })
    }
}

/// An OTLP/gRPC collector on a free port.
async fn grpc_collector() -> Collector {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let svc = TraceService(got.clone());
    let task = tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(l);
        let _ = tonic::transport::Server::builder().add_service(svc).serve_with_incoming(incoming).await;
    });
    Collector { port, got, task }
}

impl Collector {
    /// Every span received: (its scope's name, the span).
    fn spans(&self) -> Vec<(String, Span)> {
        let got = self.got.lock().unwrap();
        got.iter()
            .flat_map(|e| &e.body.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.iter().map(|sp| (s.scope.clone().unwrap_or_default().name, sp.clone())))
            .collect()
    }

    /// Polls until `n` spans have arrived (a bound for a loaded machine, not a timing claim).
    async fn wait_spans(&self, n: usize) -> Vec<(String, Span)> {
        let t0 = Instant::now();
        loop {
            let s = self.spans();
            if s.len() >= n {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "{} spans of {n} after 60 s", s.len());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn exports(&self) -> Vec<Export> {
        self.got.lock().unwrap().clone()
    }
}

fn attr(attrs: &[KeyValue], key: &str) -> Option<any_value::Value> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.clone()).and_then(|v| v.value)
}

fn s(v: &str) -> Option<any_value::Value> {
    Some(any_value::Value::StringValue(v.into()))
}

fn i(v: i64) -> Option<any_value::Value> {
    Some(any_value::Value::IntValue(v))
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// The service with tracing on, exporting to `c` (`OTEL_BSP_SCHEDULE_DELAY` short: the test polls).
async fn traced(name: &str, c: &Collector, extra: &[(&str, &str)]) -> Env {
    let endpoint = format!("http://127.0.0.1:{}", c.port);
    let mut vars = vec![
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
    ];
    vars.extend_from_slice(extra);
    Env::start(name, CONFIG, &vars).await
}

/// `ShouldRateLimit` with these metadata.
async fn ask_with(env: &Env, r: RateLimitRequest, md: &[(&'static str, &str)]) -> Result<RateLimitResponse, tonic::Status> {
    let mut request = tonic::Request::new(r);
    for (k, v) in md {
        request.metadata_mut().insert(*k, v.parse().unwrap());
    }
    env.client().await.should_rate_limit(request).await.map(|r| r.into_inner())
}

fn user(who: &str) -> RateLimitRequest {
    req("traced", vec![desc(&[("user", who)])])
}

fn by_name<'a>(spans: &'a [(String, Span)], trace: &[u8], name: &str) -> &'a (String, Span) {
    let mut found = spans.iter().filter(|(_, s)| s.trace_id == trace && s.name == name);
    let one = found.next().unwrap_or_else(|| panic!("no span {name:?} in the trace"));
    assert!(found.next().is_none(), "one span {name:?} per request");
    one
}

#[tokio::test]
async fn a_request_s_spans_under_its_traceparent() {
    let c = http_collector(None).await;
    let env = traced(
        "trace-spans",
        &c,
        &[
            ("TRACING_SERVICE_NAMESPACE", "edge"),
            ("TRACING_SERVICE_INSTANCE_ID", "instance-1"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0ken"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,service.name=ignored"),
        ],
    )
    .await;
    let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let r = ask_with(&env, user("alice"), &[("traceparent", &tp), ("tracestate", "vendor=1")]).await.unwrap();
    assert_eq!(r.overall_code, OK);
    let spans = c.wait_spans(3).await;
    let trace = unhex(TRACE_ID);
    let (scope, server) = by_name(&spans, &trace, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    assert_eq!(scope, "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc");
    assert_eq!((server.kind, server.parent_span_id.clone(), server.trace_state.as_str()), (2, unhex(PARENT_ID), "vendor=1"));
    assert_eq!(server.span_id.len(), 8);
    assert_eq!(attr(&server.attributes, "rpc.system"), s("grpc"));
    assert_eq!(attr(&server.attributes, "rpc.service"), s("envoy.service.ratelimit.v3.RateLimitService"));
    assert_eq!(attr(&server.attributes, "rpc.method"), s("ShouldRateLimit"));
    assert_eq!(attr(&server.attributes, "rpc.grpc.status_code"), i(0));
    assert_eq!(attr(&server.attributes, "net.sock.peer.addr"), s("127.0.0.1"));
    assert!(server.start_time_unix_nano > 0 && server.end_time_unix_nano >= server.start_time_unix_nano);
    let (scope, exec) = by_name(&spans, &trace, "ShouldRateLimit Execution");
    assert_eq!((scope.as_str(), exec.kind, &exec.parent_span_id), ("ratelimit", 1, &server.span_id));
    assert_eq!(attr(&exec.attributes, "domain"), s("traced"));
    assert_eq!(
        attr(&exec.attributes, "request string"),
        s(r#"domain:"traced" descriptors:{entries:{key:"user" value:"alice"}}"#)
    );
    let (scope, redis) = by_name(&spans, &trace, "Redis Pipeline Execution");
    // upstream hands the Redis call the server span's context
    assert_eq!((scope.as_str(), redis.kind, &redis.parent_span_id), ("redis.fixedCacheImpl", 1, &server.span_id));
    assert_eq!(attr(&redis.attributes, "pipeline length"), i(1));
    assert!(
        server.start_time_unix_nano <= exec.start_time_unix_nano && exec.end_time_unix_nano <= server.end_time_unix_nano
    );
    let ids: std::collections::HashSet<_> = [&server.span_id, &exec.span_id, &redis.span_id].into_iter().collect();
    assert_eq!(ids.len(), 3, "three span ids");
    // the export: its path, its headers, the resource
    let e = &c.exports()[0];
    assert_eq!(e.path, "/v1/traces");
    assert!(e.headers.contains(&("authorization".into(), "Bearer t0ken".into())), "{:?}", e.headers);
    assert!(e.headers.contains(&("content-type".into(), "application/x-protobuf".into())));
    let res = e.body.resource_spans[0].resource.clone().unwrap().attributes;
    assert_eq!(attr(&res, "service.name"), s("RateLimit"));
    assert_eq!(attr(&res, "service.namespace"), s("edge"));
    assert_eq!(attr(&res, "service.instance.id"), s("instance-1"));
    assert_eq!(attr(&res, "deployment.environment"), s("test"));
    // no parent: a new trace (rate 1), a root server span; an invalid request: its gRPC code
    let r = ask_with(&env, req("", vec![desc(&[("user", "x")])]), &[]).await;
    assert_eq!(r.unwrap_err().code(), tonic::Code::InvalidArgument);
    let spans = c.wait_spans(5).await;
    let root = spans.iter().map(|(_, s)| s).find(|s| s.trace_id != trace && s.kind == 2).expect("a root server span");
    assert!(root.parent_span_id.is_empty() && root.trace_id.len() == 16);
    assert_eq!(attr(&root.attributes, "rpc.grpc.status_code"), i(3));
    // INVALID_ARGUMENT is not a server error for otelgrpc: the status stays unset
    assert_eq!(root.status.clone().unwrap_or_default().code, 0);
}

#[tokio::test]
async fn parent_based_sampling_at_rate_zero() {
    let c = http_collector(None).await;
    let env = traced("trace-rate0", &c, &[("TRACING_SAMPLING_RATE", "0")]).await;
    // no parent, and a parent not sampled: nothing
    ask_with(&env, user("a"), &[]).await.unwrap();
    let unsampled = format!("00-{}-{PARENT_ID}-00", "1".repeat(32));
    ask_with(&env, user("b"), &[("traceparent", &unsampled)]).await.unwrap();
    // a sampled parent: exported (the queue is in order: the two above would have come first)
    let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    ask_with(&env, user("c"), &[("traceparent", &tp)]).await.unwrap();
    let spans = c.wait_spans(3).await;
    assert_eq!(spans.len(), 3, "only the sampled parent's request");
    assert!(spans.iter().all(|(_, s)| s.trace_id == unhex(TRACE_ID)));
    assert_eq!(env.svc.service.tracer().unwrap().dropped(), 0);
    // rate 1: a parent not sampled still decides (ParentBased), nothing
    let c = http_collector(None).await;
    let env = traced("trace-rate1", &c, &[]).await;
    ask_with(&env, user("d"), &[("traceparent", &unsampled)]).await.unwrap();
    ask_with(&env, user("e"), &[("traceparent", &tp)]).await.unwrap();
    let spans = c.wait_spans(3).await;
    assert_eq!(spans.len(), 3, "only the sampled parent's request");
    assert!(spans.iter().all(|(_, s)| s.trace_id == unhex(TRACE_ID)));
}

#[tokio::test]
async fn b3_headers_give_the_parent_and_win_over_traceparent() {
    let c = http_collector(None).await;
    let env = traced("trace-b3", &c, &[]).await;
    let b3_trace = "80f198ee56343ba864fe8b2a57d3eff7";
    let b3 = format!("{b3_trace}-e457b5a2e4d86bd1-1");
    let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    ask_with(&env, user("a"), &[("b3", &b3), ("traceparent", &tp)]).await.unwrap();
    let spans = c.wait_spans(3).await;
    let (_, server) = by_name(&spans, &unhex(b3_trace), "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
    assert_eq!(server.parent_span_id, unhex("e457b5a2e4d86bd1"));
    // the multi-header form, a 64-bit trace id (the high half zero)
    let md = [("x-b3-traceid", "a3ce929d0e0e4736"), ("x-b3-spanid", "00f067aa0ba902b8"), ("x-b3-sampled", "1")];
    ask_with(&env, user("b"), &md).await.unwrap();
    let spans = c.wait_spans(6).await;
    let (_, server) = by_name(
        &spans,
        &unhex("0000000000000000a3ce929d0e0e4736"),
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    assert_eq!(server.parent_span_id, unhex("00f067aa0ba902b8"));
}

#[tokio::test]
async fn otlp_grpc_export() {
    let c = grpc_collector().await;
    let env =
        traced("trace-grpc", &c, &[("TRACING_EXPORTER_PROTOCOL", "grpc"), ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=t1")])
            .await;
    let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    ask_with(&env, user("a"), &[("traceparent", &tp)]).await.unwrap();
    let spans = c.wait_spans(3).await;
    let names: std::collections::BTreeSet<_> = spans.iter().map(|(_, s)| s.name.as_str()).collect();
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        [
            "Redis Pipeline Execution",
            "ShouldRateLimit Execution",
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ]
    );
    assert!(spans.iter().all(|(_, s)| s.trace_id == unhex(TRACE_ID)));
    assert!(c.exports()[0].headers.contains(&("x-tenant".into(), "t1".into())));
}

#[tokio::test]
async fn tracing_settings_refused_by_name() {
    let cases: [(&[(&str, &str)], &str); 4] = [
        (&[("TRACING_EXPORTER_PROTOCOL", "thrift")], "TRACING_EXPORTER_PROTOCOL="),
        (&[("OTEL_TRACES_SAMPLER", "always_off")], "OTEL_TRACES_SAMPLER "),
        (&[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")], "OTEL_EXPORTER_OTLP_COMPRESSION="),
        // TLS without a CA file: the system's roots are not read
        (&[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://127.0.0.1:1")], "OTEL_EXPORTER_OTLP_CERTIFICATE"),
    ];
    for (vars, want) in cases {
        let mut env: HashMap<String, String> =
            [("TRACING_ENABLED", "true"), ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        env.extend(vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let e = Settings::from_map(&env).expect_err(want);
        assert!(e.contains(want), "{want}: {e}");
    }
    // off: no OTEL_ variable is read, as upstream
    let env: HashMap<String, String> = [("OTEL_TRACES_SAMPLER".to_owned(), "x".to_owned())].into();
    assert!(Settings::from_map(&env).unwrap().tracing.is_none());
}

/// A TLS acceptor with `pki`'s server certificate (localhost, 127.0.0.1).
fn acceptor(pki: &crate::tls::Pki) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(pki.path("server.crt")).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(pki.path("server.key")).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

#[tokio::test]
async fn otlp_http_over_tls_with_the_collector_s_ca() {
    let pki = crate::tls::Pki::new();
    let c = http_collector(Some(acceptor(&pki))).await;
    let endpoint = format!("https://localhost:{}/otlp", c.port);
    let ca = pki.path("ca.crt");
    let vars = [
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "20"),
    ];
    let env = Env::start("trace-tls", CONFIG, &vars).await;
    let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    ask_with(&env, user("a"), &[("traceparent", &tp)]).await.unwrap();
    let spans = c.wait_spans(3).await;
    assert!(spans.iter().all(|(_, s)| s.trace_id == unhex(TRACE_ID)));
    // the signal's endpoint as it is
    assert_eq!(c.exports()[0].path, "/otlp");
}

#[tokio::test]
async fn sigterm_sends_the_spans_still_queued() {
    let c = http_collector(None).await;
    let (_redis, rport) = plain_redis(&[]);
    let dir = std::env::temp_dir().join(format!("rl-svc-trace-term-{}-{}", std::process::id(), port()));
    write(&dir.join("rl/config/config.yaml"), CONFIG);
    let grpc = port();
    let endpoint = format!("http://127.0.0.1:{}", c.port);
    let mut child = Proc(
        crate::lifecycle::service_command(
            &dir,
            rport,
            grpc,
            0,
            &[
                ("TRACING_ENABLED", "true"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
                // a batch only at shutdown (10 minutes, as far as this test goes)
                ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the service binary"),
    );
    let t0 = Instant::now();
    let mut client = loop {
        if let Ok(c) = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await {
            break c;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the service did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut r = tonic::Request::new(user("a"));
    r.metadata_mut().insert("traceparent", format!("00-{TRACE_ID}-{PARENT_ID}-01").parse().unwrap());
    client.should_rate_limit(r).await.unwrap();
    drop(client);
    assert!(c.spans().is_empty(), "nothing sent before its batch is due");
    sig(child.0.id(), libc::SIGTERM);
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
    // sent before the process exited
    let names: std::collections::BTreeSet<_> = c.spans().into_iter().map(|(_, s)| s.name).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_stuck_collector_drops_spans_never_a_decision() {
    // a collector that takes connections and never answers
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cport = l.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            conns.push(s);
        }
    });
    let endpoint = format!("http://127.0.0.1:{cport}");
    let vars = [
        ("TRACING_ENABLED", "true"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "1"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1"),
        // the first export waits for the whole test
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "600000"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "600000"),
    ];
    let env = Env::start("trace-stuck", CONFIG, &vars).await;
    let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    for n in 0..20 {
        let r = ask_with(&env, user(&format!("u{n}")), &[("traceparent", &tp)]).await.unwrap();
        assert_eq!(r.overall_code, OK);
    }
    // 60 spans: one in the stuck export, at most one in the queue, the rest dropped
    let t = env.svc.service.tracer().unwrap();
    assert!(t.dropped() >= 58, "{} dropped", t.dropped());
    assert_eq!(t.exported(), 0);
    // and on /metrics
    let m = env.svc.service.render_metrics();
    let line = m.lines().find(|l| l.starts_with("redis_ratelimit_tracing_spans_dropped ")).expect("the dropped spans' line");
    assert_eq!(line, format!("redis_ratelimit_tracing_spans_dropped {}", t.dropped()));
    held.abort();
}
