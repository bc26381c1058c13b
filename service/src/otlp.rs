//! OTLP on the wire: the few messages of opentelemetry-proto's
//! `collector/trace/v1`, `trace/v1`, `resource/v1` and `common/v1` that an
//! export needs (written here with prost's derive, their field numbers the
//! public definitions'), and one export sent to the collector over
//! OTLP/HTTP (a protobuf `POST`, HTTP/1.1) or OTLP/gRPC
//! (`TraceService/Export`), in the clear or over TLS.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::otlp_settings::{Protocol, TraceSettings};

/// `ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceRequest {
    /// The spans, by resource.
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

/// `ExportTraceServiceResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTraceServiceResponse {
    /// Set when the collector refused some spans.
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportTracePartialSuccess>,
}

/// `ExportTracePartialSuccess`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportTracePartialSuccess {
    /// Spans refused.
    #[prost(int64, tag = "1")]
    pub rejected_spans: i64,
    /// Why.
    #[prost(string, tag = "2")]
    pub error_message: String,
}

/// `ResourceSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResourceSpans {
    /// The process.
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    /// Its spans, by instrumentation scope.
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
    /// The resource's semantic conventions.
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

/// `Resource`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    /// `service.name` and the others.
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
    /// Attributes dropped.
    #[prost(uint32, tag = "2")]
    pub dropped_attributes_count: u32,
}

/// `ScopeSpans`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScopeSpans {
    /// The instrumentation scope (upstream's tracer names).
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    /// The spans.
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
    /// The spans' semantic conventions.
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

/// `InstrumentationScope`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InstrumentationScope {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its version.
    #[prost(string, tag = "2")]
    pub version: String,
}

/// `Span.SpanKind`'s values.
pub mod span_kind {
    /// `SPAN_KIND_INTERNAL`.
    pub const INTERNAL: i32 = 1;
    /// `SPAN_KIND_SERVER`.
    pub const SERVER: i32 = 2;
}

/// `Status.StatusCode`'s values.
pub mod status_code {
    /// `STATUS_CODE_UNSET`.
    pub const UNSET: i32 = 0;
    /// `STATUS_CODE_ERROR`.
    pub const ERROR: i32 = 2;
}

/// `Span`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Span {
    /// 16 bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    /// 8 bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    /// W3C `tracestate`.
    #[prost(string, tag = "3")]
    pub trace_state: String,
    /// 8 bytes, or empty for a root span.
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    /// Its name.
    #[prost(string, tag = "5")]
    pub name: String,
    /// [`span_kind`].
    #[prost(int32, tag = "6")]
    pub kind: i32,
    /// Nanoseconds since the Unix epoch.
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    /// Nanoseconds since the Unix epoch.
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    /// Its attributes.
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    /// Its status.
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
    /// W3C trace flags (low byte), and whether the parent is remote (bits 8 and 9).
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
}

/// `Status`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    /// The error's description.
    #[prost(string, tag = "2")]
    pub message: String,
    /// [`status_code`].
    #[prost(int32, tag = "3")]
    pub code: i32,
}

/// `KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    /// The attribute's name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Its value.
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// `AnyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AnyValue {
    /// One of its kinds.
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 4")]
    pub value: Option<any_value::Value>,
}

/// `AnyValue`'s kinds (the scalar ones).
pub mod any_value {
    /// `AnyValue.value`.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        /// `string_value`.
        #[prost(string, tag = "1")]
        StringValue(String),
        /// `bool_value`.
        #[prost(bool, tag = "2")]
        BoolValue(bool),
        /// `int_value`.
        #[prost(int64, tag = "3")]
        IntValue(i64),
        /// `double_value`.
        #[prost(double, tag = "4")]
        DoubleValue(f64),
    }
}

impl KeyValue {
    /// A string attribute.
    pub fn str(key: &str, v: impl Into<String>) -> KeyValue {
        KeyValue { key: key.to_owned(), value: Some(AnyValue { value: Some(any_value::Value::StringValue(v.into())) }) }
    }

    /// An integer attribute.
    pub fn int(key: &str, v: i64) -> KeyValue {
        KeyValue { key: key.to_owned(), value: Some(AnyValue { value: Some(any_value::Value::IntValue(v)) }) }
    }
}

/// The gRPC method of an OTLP/gRPC export.
pub const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A connection to the collector: TCP, or TLS over it.
async fn dial(s: &TraceSettings) -> std::io::Result<Box<dyn Io>> {
    let tcp = tokio::net::TcpStream::connect(&s.authority).await?;
    let _ = tcp.set_nodelay(true);
    Ok(match &s.tls {
        None => Box::new(tcp),
        Some(t) => {
            let c = tokio_rustls::TlsConnector::from(t.config.clone());
            Box::new(c.connect(t.server_name.clone(), tcp).await?)
        }
    })
}

/// Sends one export (within `OTEL_EXPORTER_OTLP_TIMEOUT`); the error says why it failed.
pub async fn export(s: &TraceSettings, req: &ExportTraceServiceRequest) -> Result<(), String> {
    let sent = async {
        match s.protocol {
            Protocol::Http => export_http(s, req).await,
            Protocol::Grpc => export_grpc(s, req).await,
        }
    };
    match tokio::time::timeout(s.timeout, sent).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {:?} (OTEL_EXPORTER_OTLP_TIMEOUT)", s.timeout)),
    }
}

/// OTLP/HTTP: `POST` of the protobuf body on a connection of its own
/// (`Connection: close`); any 2xx is success.
async fn export_http(s: &TraceSettings, req: &ExportTraceServiceRequest) -> Result<(), String> {
    let body = prost::Message::encode_to_vec(req);
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n\
         User-Agent: redis-ratelimit-service\r\nConnection: close\r\n",
        s.path,
        s.authority,
        body.len()
    );
    for (k, v) in &s.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut io = dial(s).await.map_err(|e| format!("connecting to {}: {e}", s.authority))?;
    io.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
    io.write_all(&body).await.map_err(|e| e.to_string())?;
    io.flush().await.map_err(|e| e.to_string())?;
    // the status line is enough; the rest is read (bounded) so the collector sees a clean close
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    while !buf.windows(2).any(|w| w == b"\r\n") {
        let n = io.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 || buf.len() > 64 * 1024 {
            return Err("the collector closed the connection without an HTTP status".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let line = line.lines().next().unwrap_or_default();
    let code = line.split(' ').nth(1).and_then(|c| c.parse::<u16>().ok());
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Ok(n) = io.read(&mut chunk).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    match code {
        Some(c) if (200..300).contains(&c) => Ok(()),
        _ => Err(format!("the collector answered {line:?}")),
    }
}

/// OTLP/gRPC: one unary `Export` on a new HTTP/2 connection.
async fn export_grpc(s: &TraceSettings, req: &ExportTraceServiceRequest) -> Result<(), String> {
    let scheme = if s.tls.is_some() { "https" } else { "http" };
    let ep = tonic::transport::Endpoint::from_shared(format!("{scheme}://{}", s.authority)).map_err(|e| e.to_string())?;
    let settings = s.clone();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let s = settings.clone();
        async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(dial(&s).await?)) }
    });
    let channel = ep.connect_with_connector(connector).await.map_err(|e| format!("connecting to {}: {e}", s.authority))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| e.to_string())?;
    let mut request = tonic::Request::new(req.clone());
    for (k, v) in &s.headers {
        if let (Ok(k), Ok(v)) = (tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()), v.parse()) {
            request.metadata_mut().insert(k, v);
        }
    }
    let codec = tonic_prost::ProstCodec::<ExportTraceServiceRequest, ExportTraceServiceResponse>::default();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(EXPORT_PATH);
    grpc.unary(request, path, codec).await.map(|_| ()).map_err(|e| format!("{}: {}", e.code(), e.message()))
}
