//! `TRACING_ENABLED=true`: the spans of envoyproxy/ratelimit, exported
//! over OTLP as its Go SDK exports them.
//!
//! Per `ShouldRateLimit` over gRPC, three spans of one trace (upstream's
//! otelgrpc interceptor, `ShouldRateLimit` and its Redis cache):
//! * `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, kind
//!   SERVER, `rpc.system`, `rpc.service`, `rpc.method`,
//!   `rpc.grpc.status_code`, the peer's `net.sock.peer.addr` and
//!   `net.sock.peer.port`; status ERROR (with the message) for the codes
//!   otelgrpc counts as a server's error;
//! * `ShouldRateLimit Execution`, its child: `domain`, `request string`;
//! * `Redis Pipeline Execution`, also the server span's child (upstream
//!   hands the Redis call the server span's context, not the execution
//!   span's): `pipeline length`, `perSecondPipeline length`.
//!
//! The parent comes from the request's metadata: W3C `traceparent` (and
//! `tracestate`), then B3 (`b3`, or `x-b3-traceid`, `x-b3-spanid`,
//! `x-b3-sampled`, `x-b3-flags`), which wins when both are valid, as
//! upstream's composite propagator. Sampling: ParentBased(TraceIDRatioBased
//! (`TRACING_SAMPLING_RATE`)), the Go SDK's rule and threshold.
//!
//! The spans of a sampled request go to a bounded queue (`try_send`: a full
//! queue drops them, counted, and never delays a decision); a task sends
//! them in batches ([`crate::otlp`]) and, at shutdown, sends what is left.
//! With tracing off there is no [`Tracer`]: a request costs one `None` test.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use crate::otlp::{self, span_kind, status_code, KeyValue, Span};
use crate::otlp_settings::{random_u128, TraceSettings};

/// The gRPC service and method of the server span.
pub const SERVER_SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The execution span.
pub const EXECUTION_SPAN: &str = "ShouldRateLimit Execution";
/// The Redis call's span.
pub const REDIS_SPAN: &str = "Redis Pipeline Execution";

/// The resource's semantic conventions (upstream's `semconv/v1.7.0`).
const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.7.0";
/// The instrumentation scopes: upstream's tracers' names.
const SCOPE_GRPC: &str = "go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc";
const SCOPE_SERVICE: &str = "ratelimit";
const SCOPE_REDIS: &str = "redis.fixedCacheImpl";

/// A span's context: its trace, its id, whether it is sampled, and the
/// `tracestate` it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanContext {
    /// 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// 8 bytes, not all zero.
    pub span_id: [u8; 8],
    /// The W3C `sampled` flag.
    pub sampled: bool,
    /// W3C `tracestate`, as received.
    pub trace_state: String,
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out).filter(|o| o.iter().any(|b| *b != 0))
}

/// W3C `traceparent`: `version-traceid-parentid-flags` (a later version
/// may append fields; version `ff` is invalid).
pub fn parse_traceparent(v: &str) -> Option<SpanContext> {
    let v = v.trim();
    let mut f = v.split('-');
    let (ver, tid, sid, flags) = (f.next()?, f.next()?, f.next()?, f.next()?);
    let version = hex::<1>(ver).map(|b| b[0]).or((ver == "00").then_some(0))?;
    if version == 0xff || (version == 0 && v.len() != 55) || flags.len() != 2 {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(SpanContext { trace_id: hex(tid)?, span_id: hex(sid)?, sampled: flags & 1 == 1, trace_state: String::new() })
}

/// A B3 trace id: 16 or 32 hex digits (16: the high half zero).
fn b3_trace_id(s: &str) -> Option<[u8; 16]> {
    match s.len() {
        32 => hex(s),
        16 => {
            let low = hex::<8>(s)?;
            let mut id = [0u8; 16];
            id[8..].copy_from_slice(&low);
            Some(id)
        }
        _ => None,
    }
}

/// B3's single header: `traceid-spanid[-sampling[-parentspanid]]`;
/// sampling `1` or `d` is sampled, `0` or absent (deferred) is not.
pub fn parse_b3_single(v: &str) -> Option<SpanContext> {
    let mut f = v.trim().split('-');
    let (trace_id, span_id) = (b3_trace_id(f.next()?)?, hex(f.next()?)?);
    let sampled = match f.next() {
        None => false,
        Some("1" | "d") => true,
        Some("0") => false,
        Some(_) => return None,
    };
    if let Some(p) = f.next() {
        hex::<8>(p)?;
    }
    if f.next().is_some() {
        return None;
    }
    Some(SpanContext { trace_id, span_id, sampled, trace_state: String::new() })
}

/// B3's headers (`x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled`, `x-b3-flags`).
pub fn parse_b3_multi(trace: &str, span: &str, sampled: Option<&str>, flags: Option<&str>) -> Option<SpanContext> {
    let (trace_id, span_id) = (b3_trace_id(trace.trim())?, hex(span.trim())?);
    let sampled = match (flags, sampled) {
        (Some("1"), _) => true, // debug
        (_, Some("1" | "true")) => true,
        (_, Some("0" | "false") | None) => false,
        (_, Some(_)) => return None,
    };
    Some(SpanContext { trace_id, span_id, sampled, trace_state: String::new() })
}

/// The remote parent of a request's metadata: `traceparent` (with its
/// `tracestate`), replaced by B3's when B3's is valid (the order of
/// upstream's composite propagator: TraceContext, then B3).
pub fn extract(md: &tonic::metadata::MetadataMap) -> Option<SpanContext> {
    let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok());
    let mut parent = get("traceparent").and_then(parse_traceparent).map(|mut sc| {
        sc.trace_state = md.get_all("tracestate").iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(",");
        sc
    });
    let b3 = match get("b3") {
        Some(v) => parse_b3_single(v),
        None => match (get("x-b3-traceid"), get("x-b3-spanid")) {
            (Some(t), Some(s)) => parse_b3_multi(t, s, get("x-b3-sampled"), get("x-b3-flags")),
            _ => None,
        },
    };
    if b3.is_some() {
        parent = b3;
    }
    parent
}

/// TraceIDRatioBased's decision for a root: the trace id's last 8 bytes,
/// shifted right once, below `rate · 2^63` (every trace at 1 or more,
/// none at 0 or less).
pub fn ratio_sampled(rate: f64, trace_id: &[u8; 16]) -> bool {
    if rate >= 1.0 {
        return true;
    }
    if rate <= 0.0 {
        return false;
    }
    let threshold = (rate * (1u64 << 63) as f64) as u64;
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    (u64::from_be_bytes(low) >> 1) < threshold
}

/// Nanoseconds since the Unix epoch (a span's times).
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn span_id() -> [u8; 8] {
    loop {
        let id = (random_u128() as u64).to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

/// The Redis call of one traced request (filled by the service).
#[derive(Debug, Default, Clone, Copy)]
pub struct RedisCall {
    /// When it began (ns since the epoch; 0: not called).
    pub start_ns: u64,
    /// When it ended.
    pub end_ns: u64,
    /// The keys it decided.
    pub keys: usize,
}

impl RedisCall {
    /// Marks the call's start.
    pub fn begin(&mut self, keys: usize) {
        self.start_ns = now_ns();
        self.keys = keys;
    }

    /// Marks its end.
    pub fn end(&mut self) {
        self.end_ns = now_ns();
    }
}

/// A sampled request's server span, begun.
pub struct ServerSpan {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    trace_state: String,
    start_ns: u64,
    peer: Option<std::net::SocketAddr>,
}

/// A span of one of the three scopes, queued for export.
struct Queued {
    scope: u8,
    span: Span,
}

type Flush = tokio::sync::oneshot::Sender<()>;

/// The tracer: the sampler, the queue of spans to export, its counters.
pub struct Tracer {
    settings: TraceSettings,
    queue: tokio::sync::mpsc::Sender<Queued>,
    dropped: AtomicU64,
    exported: AtomicU64,
    failed: AtomicU64,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<Flush>>>,
}

impl Tracer {
    /// A tracer and its exporting task (on the current runtime).
    pub fn start(settings: TraceSettings) -> (Arc<Tracer>, tokio::task::JoinHandle<()>) {
        let (tx, rx) = tokio::sync::mpsc::channel(settings.max_queue.max(1));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let t = Arc::new(Tracer {
            settings,
            queue: tx,
            dropped: AtomicU64::new(0),
            exported: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            stop: Mutex::new(Some(stop_tx)),
        });
        log!(
            crate::logger::Level::Info,
            "tracing: OTLP/{:?} to {}{} (service.name {:?}, service.instance.id {:?}, sampling rate {})",
            t.settings.protocol,
            t.settings.authority,
            if t.settings.tls.is_some() { " over TLS" } else { "" },
            t.settings.service_name,
            t.settings.service_instance_id,
            t.settings.sampling_rate
        );
        let task = tokio::spawn(exporter(t.clone(), rx, stop_rx));
        (t, task)
    }

    /// Spans dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Relaxed)
    }

    /// Spans the collector accepted.
    pub fn exported(&self) -> u64 {
        self.exported.load(Relaxed)
    }

    /// Spans lost to failed exports.
    pub fn failed(&self) -> u64 {
        self.failed.load(Relaxed)
    }

    /// The counters in Prometheus's text format (`/metrics`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, v) in [
            ("redis_ratelimit_tracing_spans_exported", "Spans the OTLP collector accepted.", self.exported()),
            ("redis_ratelimit_tracing_spans_failed", "Spans lost to failed OTLP exports.", self.failed()),
            ("redis_ratelimit_tracing_spans_dropped", "Spans dropped, the export queue full.", self.dropped()),
        ] {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"));
        }
        out
    }

    /// The server span of a request with this metadata, when sampled
    /// (ParentBased: a remote parent's flag decides, else the ratio).
    pub fn begin(&self, md: &tonic::metadata::MetadataMap, peer: Option<std::net::SocketAddr>) -> Option<ServerSpan> {
        let start_ns = now_ns();
        let (trace_id, parent, trace_state) = match extract(md) {
            Some(p) if !p.sampled => return None,
            Some(p) => (p.trace_id, Some(p.span_id), p.trace_state),
            None => {
                let trace_id = loop {
                    let id = random_u128().to_be_bytes();
                    if id != [0; 16] {
                        break id;
                    }
                };
                if !ratio_sampled(self.settings.sampling_rate, &trace_id) {
                    return None;
                }
                (trace_id, None, String::new())
            }
        };
        Some(ServerSpan { trace_id, span_id: span_id(), parent, trace_state, start_ns, peer })
    }

    fn span(&self, s: &ServerSpan, parent: &[u8; 8], name: &str, start: u64, attributes: Vec<KeyValue>) -> Span {
        Span {
            trace_id: s.trace_id.to_vec(),
            span_id: span_id().to_vec(),
            trace_state: s.trace_state.clone(),
            parent_span_id: parent.to_vec(),
            name: name.to_owned(),
            kind: span_kind::INTERNAL,
            start_time_unix_nano: start,
            end_time_unix_nano: now_ns(),
            attributes,
            status: None,
            // sampled; the parent (the server span) is local
            flags: 0x101,
        }
    }

    /// Ends a request's spans: the server span with the gRPC code and
    /// message, the execution span begun at `exec_start_ns`, the Redis
    /// call's span when Redis was called; all queued.
    pub fn end(
        &self,
        s: ServerSpan,
        req: &RateLimitRequest,
        exec_start_ns: u64,
        redis: RedisCall,
        code: tonic::Code,
        message: &str,
    ) {
        let exec = self.span(
            &s,
            &s.span_id,
            EXECUTION_SPAN,
            exec_start_ns,
            vec![KeyValue::str("domain", req.domain.as_str()), KeyValue::str("request string", request_text(req))],
        );
        self.queue(1, exec);
        if redis.start_ns != 0 {
            let attrs =
                vec![KeyValue::int("pipeline length", redis.keys as i64), KeyValue::int("perSecondPipeline length", 0)];
            let mut r = self.span(&s, &s.span_id, REDIS_SPAN, redis.start_ns, attrs);
            r.end_time_unix_nano = redis.end_ns.max(redis.start_ns);
            self.queue(2, r);
        }
        let mut attributes = vec![
            KeyValue::str("rpc.system", "grpc"),
            KeyValue::str("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
            KeyValue::str("rpc.method", "ShouldRateLimit"),
        ];
        if let Some(p) = s.peer {
            attributes.push(KeyValue::str("net.sock.peer.addr", p.ip().to_string()));
            attributes.push(KeyValue::int("net.sock.peer.port", i64::from(p.port())));
        }
        attributes.push(KeyValue::int("rpc.grpc.status_code", code as i64));
        use tonic::Code as C;
        let error =
            matches!(code, C::Unknown | C::DeadlineExceeded | C::Unimplemented | C::Internal | C::Unavailable | C::DataLoss);
        let status = otlp::Status {
            code: if error { status_code::ERROR } else { status_code::UNSET },
            message: if error { message.to_owned() } else { String::new() },
        };
        let server = Span {
            trace_id: s.trace_id.to_vec(),
            span_id: s.span_id.to_vec(),
            trace_state: s.trace_state,
            parent_span_id: s.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: SERVER_SPAN.to_owned(),
            kind: span_kind::SERVER,
            start_time_unix_nano: s.start_ns,
            end_time_unix_nano: now_ns(),
            attributes,
            status: Some(status),
            // sampled; whether the parent is remote is known (bit 8), and is (bit 9)
            flags: 0x101 | if s.parent.is_some() { 0x200 } else { 0 },
        };
        self.queue(0, server);
    }

    fn queue(&self, scope: u8, span: Span) {
        if self.queue.try_send(Queued { scope, span }).is_err() {
            self.dropped.fetch_add(1, Relaxed);
        }
    }

    /// Sends the spans still queued (within 5 s, as upstream's shutdown)
    /// and stops the exporting task; later spans are dropped.
    pub async fn shutdown(&self) {
        let stop = self.stop.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(stop) = stop {
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            if stop.send(done_tx).is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(5), done_rx).await;
            }
        }
    }

    /// One export request of `spans`, grouped by scope under the resource.
    fn request(&self, spans: Vec<Queued>) -> otlp::ExportTraceServiceRequest {
        let s = &self.settings;
        let mut attributes: Vec<KeyValue> = s
            .resource_attributes
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "service.name" | "service.namespace" | "service.instance.id"))
            .map(|(k, v)| KeyValue::str(k, v.as_str()))
            .collect();
        attributes.push(KeyValue::str("service.name", s.service_name.as_str()));
        attributes.push(KeyValue::str("service.namespace", s.service_namespace.as_str()));
        attributes.push(KeyValue::str("service.instance.id", s.service_instance_id.as_str()));
        attributes.sort_by(|a, b| a.key.cmp(&b.key));
        let mut scopes: [Vec<Span>; 3] = Default::default();
        for q in spans {
            scopes[usize::from(q.scope.min(2))].push(q.span);
        }
        let scope_spans = [SCOPE_GRPC, SCOPE_SERVICE, SCOPE_REDIS]
            .iter()
            .zip(scopes)
            .filter(|(_, spans)| !spans.is_empty())
            .map(|(name, spans)| otlp::ScopeSpans {
                scope: Some(otlp::InstrumentationScope { name: (*name).to_owned(), version: String::new() }),
                spans,
                schema_url: String::new(),
            })
            .collect();
        otlp::ExportTraceServiceRequest {
            resource_spans: vec![otlp::ResourceSpans {
                resource: Some(otlp::Resource { attributes, dropped_attributes_count: 0 }),
                scope_spans,
                schema_url: SCHEMA_URL.to_owned(),
            }],
        }
    }

    async fn send(&self, batch: Vec<Queued>) {
        let n = batch.len() as u64;
        let req = self.request(batch);
        match tokio::time::timeout(self.settings.export_timeout, otlp::export(&self.settings, &req)).await {
            Ok(Ok(())) => {
                self.exported.fetch_add(n, Relaxed);
            }
            Ok(Err(e)) => {
                self.failed.fetch_add(n, Relaxed);
                log!(crate::logger::Level::Warn, "tracing: {n} spans not exported to {}: {e}", self.settings.authority);
            }
            Err(_) => {
                self.failed.fetch_add(n, Relaxed);
                log!(crate::logger::Level::Warn, "tracing: {n} spans not exported within OTEL_BSP_EXPORT_TIMEOUT");
            }
        }
    }
}

/// The exporting task: a batch when `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` spans
/// wait or `OTEL_BSP_SCHEDULE_DELAY` has passed since the last; at stop,
/// what is left, then done.
async fn exporter(
    t: Arc<Tracer>,
    mut rx: tokio::sync::mpsc::Receiver<Queued>,
    mut stop: tokio::sync::oneshot::Receiver<Flush>,
) {
    let max = t.settings.max_batch.max(1);
    let mut batch = Vec::with_capacity(max.min(4096));
    let mut tick = tokio::time::interval(t.settings.schedule_delay.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported_drops = 0;
    loop {
        tokio::select! {
            got = rx.recv() => match got {
                Some(q) => {
                    batch.push(q);
                    if batch.len() >= max {
                        t.send(std::mem::take(&mut batch)).await;
                    }
                }
                None => break,
            },
            _ = tick.tick() => {
                if !batch.is_empty() {
                    t.send(std::mem::take(&mut batch)).await;
                }
                let d = t.dropped();
                if d > reported_drops {
                    log!(crate::logger::Level::Warn, "tracing: {} spans dropped (queue full, OTEL_BSP_MAX_QUEUE_SIZE)", d - reported_drops);
                    reported_drops = d;
                }
            }
            done = &mut stop => {
                rx.close();
                while let Ok(q) = rx.try_recv() {
                    batch.push(q);
                    if batch.len() >= max {
                        t.send(std::mem::take(&mut batch)).await;
                    }
                }
                if !batch.is_empty() {
                    t.send(std::mem::take(&mut batch)).await;
                }
                if let Ok(done) = done {
                    let _ = done.send(());
                }
                return;
            }
        }
    }
}

/// The request as Go's protobuf `String()` writes it (the text format,
/// compact): upstream's `request string` attribute.
pub fn request_text(req: &RateLimitRequest) -> String {
    use std::fmt::Write;
    fn quoted(out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
    let mut parts: Vec<String> = Vec::new();
    if !req.domain.is_empty() {
        let mut s = "domain:".to_owned();
        quoted(&mut s, &req.domain);
        parts.push(s);
    }
    for d in &req.descriptors {
        let mut inner: Vec<String> = Vec::new();
        for e in &d.entries {
            let mut s = "entries:{".to_owned();
            let mut kv = Vec::new();
            if !e.key.is_empty() {
                let mut k = "key:".to_owned();
                quoted(&mut k, &e.key);
                kv.push(k);
            }
            if !e.value.is_empty() {
                let mut v = "value:".to_owned();
                quoted(&mut v, &e.value);
                kv.push(v);
            }
            s.push_str(&kv.join(" "));
            s.push('}');
            inner.push(s);
        }
        if let Some(l) = &d.limit {
            let mut f = Vec::new();
            if l.requests_per_unit != 0 {
                f.push(format!("requests_per_unit:{}", l.requests_per_unit));
            }
            if l.unit != 0 {
                let unit = envoy_types::pb::envoy::r#type::v3::RateLimitUnit::try_from(l.unit)
                    .map(|u| u.as_str_name().to_owned())
                    .unwrap_or_else(|_| l.unit.to_string());
                f.push(format!("unit:{unit}"));
            }
            inner.push(format!("limit:{{{}}}", f.join(" ")));
        }
        if let Some(h) = &d.hits_addend {
            inner.push(if h.value == 0 {
                "hits_addend:{}".to_owned()
            } else {
                format!("hits_addend:{{value:{}}}", h.value)
            });
        }
        if d.is_negative_hits {
            inner.push("is_negative_hits:true".to_owned());
        }
        parts.push(format!("descriptors:{{{}}}", inner.join(" ")));
    }
    if req.hits_addend != 0 {
        parts.push(format!("hits_addend:{}", req.hits_addend));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_and_b3() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(tp).unwrap();
        assert_eq!((sc.trace_id[0], sc.span_id[7], sc.sampled), (0x4b, 0xb7, true));
        assert!(!parse_traceparent(&tp.replace("-01", "-00")).unwrap().sampled);
        assert!(parse_traceparent(&tp.replace("4bf9", "4BF9")).is_none(), "lower-case hex only");
        assert!(parse_traceparent("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_none());
        assert!(parse_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
        assert!(parse_traceparent(&format!("{tp}-extra")).is_none(), "version 00 has four fields");
        assert!(parse_traceparent(&format!("01{}-extra", &tp[2..])).is_some(), "a later version may add fields");
        let b = parse_b3_single("80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90").unwrap();
        assert_eq!((b.trace_id[0], b.sampled), (0x80, true));
        let b = parse_b3_single("64fe8b2a57d3eff7-e457b5a2e4d86bd1").unwrap();
        assert_eq!((&b.trace_id[..8], b.trace_id[8], b.sampled), (&[0u8; 8][..], 0x64, false));
        assert!(parse_b3_single("0").is_none());
        let m = parse_b3_multi("64fe8b2a57d3eff7", "e457b5a2e4d86bd1", Some("1"), None).unwrap();
        assert!(m.sampled);
        assert!(parse_b3_multi("64fe8b2a57d3eff7", "e457b5a2e4d86bd1", None, Some("1")).unwrap().sampled);
    }

    #[test]
    fn ratio_as_the_go_sdk() {
        let mut id = [0u8; 16];
        assert!(!ratio_sampled(0.0, &id) && ratio_sampled(1.0, &id));
        assert!(ratio_sampled(0.5, &id));
        id[8] = 0x80; // (0x80.. >> 1) = 2^62: below 0.5·2^63 is false at 0.5, true above
        assert!(!ratio_sampled(0.5, &id) && ratio_sampled(0.51, &id));
    }

    #[test]
    fn request_text_as_prototext() {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
        let req = RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry { key: "k".into(), value: "v\"".into() }],
                ..Default::default()
            }],
            hits_addend: 2,
        };
        assert_eq!(request_text(&req), r#"domain:"d" descriptors:{entries:{key:"k" value:"v\""}} hits_addend:2"#);
    }
}
