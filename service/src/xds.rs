//! `CONFIG_TYPE=GRPC_XDS_SOTW`: the configuration from an xDS management
//! server, as envoyproxy/ratelimit takes it (its `XdsGrpcSotwProvider`,
//! read for behaviour). One ADS stream
//! (`envoy.service.discovery.v3.AggregatedDiscoveryService`), state of the
//! world, for every `ratelimit.config.ratelimit.v3.RateLimitConfig`
//! resource (a wildcard subscription); each response is the whole
//! configuration. Its resources become the YAML documents the file loader
//! reads ([`crate::config::Config::load`], the resource's `name` as the file
//! name), so the decisions are those of the same files. A response that
//! loads is made live and ACKed (its `version_info` and nonce); one that
//! does not is NACKed with the load error in `error_detail`, and the last
//! good configuration stays live.
//!
//! The connection: `CONFIG_GRPC_XDS_SERVER_URL` (`host:port`), dialled
//! every `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (±50%) until it
//! answers; over TLS with `CONFIG_GRPC_XDS_SERVER_USE_TLS` (the server
//! checked against `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`, named
//! `CONFIG_GRPC_XDS_SERVER_TLS_SAN` or the URL's host; the client
//! certificate `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`/`_KEY` when set);
//! `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` on the stream. A stream that
//! ends or fails is opened again after the `XDS_CLIENT_BACKOFF_*` backoff
//! (jpillora/backoff's formula, as upstream).

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy};
use prost::Message;
use redis_ratelimit_client::Connection;

use crate::config::Config;
use crate::service::Service;
use crate::xds_settings::{unit_random, XdsSettings};

/// The type URL of the resources (go-control-plane's `RateLimitConfigType`).
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

// ---- resources → the loader's YAML ----

fn yaml_of_struct(s: &Struct) -> serde_yaml::Value {
    let mut m = serde_yaml::Mapping::new();
    let mut keys: Vec<_> = s.fields.keys().collect();
    keys.sort();
    for k in keys {
        m.insert(k.clone().into(), yaml_of_value(&s.fields[k]));
    }
    serde_yaml::Value::Mapping(m)
}

fn yaml_of_value(v: &Value) -> serde_yaml::Value {
    use serde_yaml::Value as Y;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Y::Null,
        Some(Kind::NumberValue(n)) => Y::Number((*n).into()),
        Some(Kind::StringValue(s)) => Y::String(s.clone()),
        Some(Kind::BoolValue(b)) => Y::Bool(*b),
        Some(Kind::StructValue(s)) => yaml_of_struct(s),
        Some(Kind::ListValue(l)) => Y::Sequence(l.values.iter().map(yaml_of_value).collect()),
    }
}

/// The unit's name as Go's `String()` gives it (a number outside the enum: its digits).
fn unit_name(u: i32) -> String {
    match u {
        0 => "UNKNOWN",
        1 => "SECOND",
        2 => "MINUTE",
        3 => "HOUR",
        4 => "DAY",
        5 => "MONTH",
        6 => "YEAR",
        7 => "WEEK",
        n => return n.to_string(),
    }
    .to_owned()
}

fn yaml_of_policy(p: &RateLimitPolicy) -> serde_yaml::Value {
    let mut m = serde_yaml::Mapping::new();
    m.insert("unit".into(), unit_name(p.unit).into());
    m.insert("requests_per_unit".into(), u64::from(p.requests_per_unit).into());
    if p.unlimited {
        m.insert("unlimited".into(), true.into());
    }
    if !p.name.is_empty() {
        m.insert("name".into(), p.name.clone().into());
    }
    if !p.replaces.is_empty() {
        let r = p
            .replaces
            .iter()
            .map(|r| {
                let mut e = serde_yaml::Mapping::new();
                e.insert("name".into(), r.name.clone().into());
                serde_yaml::Value::Mapping(e)
            })
            .collect();
        m.insert("replaces".into(), serde_yaml::Value::Sequence(r));
    }
    serde_yaml::Value::Mapping(m)
}

fn yaml_of_descriptors(ds: &[RateLimitDescriptor]) -> serde_yaml::Value {
    serde_yaml::Value::Sequence(
        ds.iter()
            .map(|d| {
                let mut m = serde_yaml::Mapping::new();
                m.insert("key".into(), d.key.clone().into());
                m.insert("value".into(), d.value.clone().into());
                if let Some(p) = &d.rate_limit {
                    m.insert("rate_limit".into(), yaml_of_policy(p));
                }
                if !d.descriptors.is_empty() {
                    m.insert("descriptors".into(), yaml_of_descriptors(&d.descriptors));
                }
                for (k, on) in
                    [("shadow_mode", d.shadow_mode), ("detailed_metric", d.detailed_metric), ("quota_mode", d.quota_mode)]
                {
                    if on {
                        m.insert(k.into(), true.into());
                    }
                }
                if let Some(md) = &d.metadata {
                    m.insert("metadata".into(), yaml_of_struct(md));
                }
                serde_yaml::Value::Mapping(m)
            })
            .collect(),
    )
}

/// A resource as the YAML document the file loader reads (upstream's
/// `ConfigXdsProtoToYaml`): its domain and descriptors.
pub fn to_yaml(c: &RateLimitConfig) -> String {
    let mut m = serde_yaml::Mapping::new();
    m.insert("domain".into(), c.domain.clone().into());
    m.insert("descriptors".into(), yaml_of_descriptors(&c.descriptors));
    serde_yaml::to_string(&serde_yaml::Value::Mapping(m)).unwrap_or_default()
}

/// The configuration of one response: every resource decoded and loaded
/// together (`MERGE_DOMAIN_CONFIG` as for files); the error to NACK with otherwise.
pub fn load_response(resp: &DiscoveryResponse, merge: bool) -> Result<(Config, usize), String> {
    if resp.type_url != TYPE_URL {
        return Err(format!("unexpected type_url {:?} (subscribed to {TYPE_URL})", resp.type_url));
    }
    let mut docs = Vec::with_capacity(resp.resources.len());
    for any in &resp.resources {
        if any.type_url != TYPE_URL {
            return Err(format!("resource of type {:?}, not {TYPE_URL}", any.type_url));
        }
        let c = RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("unmarshalling a RateLimitConfig resource: {e}"))?;
        docs.push((c.name.clone(), to_yaml(&c)));
    }
    let cfg = Config::load(docs.iter().map(|(n, y)| (n.as_str(), y.as_str())), merge).map_err(|e| e.to_string())?;
    Ok((cfg, docs.len()))
}

// ---- the client ----

/// A connection to the server (TCP, or TLS over it), or its error.
async fn dial(x: &XdsSettings) -> Result<tonic::transport::Channel, String> {
    let ep = tonic::transport::Endpoint::from_shared(format!("http://{}", x.server_url))
        .map_err(|e| format!("CONFIG_GRPC_XDS_SERVER_URL: {e}"))?;
    let addr = x.server_url.clone();
    let tls = x.tls.clone();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let (addr, tls) = (addr.clone(), tls.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&addr).await?;
            let _ = tcp.set_nodelay(true);
            let io: Box<dyn Io> = match tls {
                None => Box::new(tcp),
                Some(t) => {
                    let c = tokio_rustls::TlsConnector::from(t.config.clone());
                    Box::new(c.connect(t.server_name.clone(), tcp).await?)
                }
            };
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(io))
        }
    });
    ep.connect_with_connector(connector).await.map_err(|e| {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(inner) = src {
            let more = inner.to_string();
            if !s.contains(&more) {
                s = format!("{s}: {more}");
            }
            src = inner.source();
        }
        s
    })
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> Io for T {}

/// One ADS stream on `channel` until it ends: every response loaded (and
/// ACKed) or refused (and NACKed). `answered` is set, and `first` sent,
/// once a response has been handled.
async fn watch<C: Connection>(
    svc: &Service<C>,
    x: &XdsSettings,
    channel: tonic::transport::Channel,
    acked_version: &mut String,
    answered: &mut bool,
    first: &mut Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<(), String> {
    let (tx, rx) = tokio::sync::mpsc::channel::<DiscoveryRequest>(4);
    let node = x.node();
    let request = |version: &str, nonce: &str, error: Option<String>| DiscoveryRequest {
        version_info: version.to_owned(),
        node: Some(node.clone()),
        type_url: TYPE_URL.to_owned(),
        response_nonce: nonce.to_owned(),
        error_detail: error.map(|message| Status { code: tonic::Code::InvalidArgument as i32, message, details: vec![] }),
        ..DiscoveryRequest::default()
    };
    // the first request: the last version this process applied, no nonce
    tx.send(request(acked_version, "", None)).await.map_err(|e| e.to_string())?;
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    for (k, v) in &x.additional_headers {
        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
            .map_err(|e| format!("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS {k:?}: {e}"))?;
        let val = v.parse().map_err(|e| format!("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS {k:?}: {e}"))?;
        req.metadata_mut().insert(key, val);
    }
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    if let Some(n) = x.max_msg_size {
        client = client.max_decoding_message_size(n);
    }
    let mut stream = client.stream_aggregated_resources(req).await.map_err(|e| e.to_string())?.into_inner();
    log!(crate::logger::Level::Info, "xDS: stream open to {} (node {:?})", x.server_url, x.node_id);
    while let Some(resp) = stream.message().await.map_err(|e| e.to_string())? {
        match load_response(&resp, svc.settings().merge_domains) {
            Ok((cfg, n)) => {
                svc.set_config(cfg);
                log!(crate::logger::Level::Info, "config loaded: {n} xDS resource(s), version {:?}", resp.version_info);
                *acked_version = resp.version_info.clone();
                tx.send(request(acked_version, &resp.nonce, None)).await.map_err(|e| e.to_string())?;
            }
            Err(e) => {
                log!(
                    crate::logger::Level::Error,
                    "config refused: xDS version {:?}: {e}; NACKed, the last good configuration stays live",
                    resp.version_info
                );
                svc.refuse_config(e.clone());
                tx.send(request(acked_version, &resp.nonce, Some(e))).await.map_err(|e| e.to_string())?;
            }
        }
        *answered = true;
        if let Some(tx) = first.take() {
            let _ = tx.send(());
        }
    }
    Err("the xDS server closed the stream".into())
}

/// Runs the xDS client for ever: dials (every
/// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`, ±50%, until the server
/// answers), watches, and after a stream ends waits the backoff and starts
/// again. `first` is sent once the first response has been handled
/// (loaded or refused).
pub fn spawn<C: Connection>(
    svc: Arc<Service<C>>,
    x: XdsSettings,
    first: Option<tokio::sync::oneshot::Sender<()>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut first = first;
        let mut acked_version = String::new();
        let mut attempt: u32 = 0;
        loop {
            let channel = loop {
                match dial(&x).await {
                    Ok(c) => break c,
                    Err(e) => {
                        let wait = x.connect_retry_interval.mul_f64(0.5 + unit_random());
                        log!(crate::logger::Level::Warn, "xDS: connecting to {}: {e}; retrying in {wait:?}", x.server_url);
                        tokio::time::sleep(wait).await;
                    }
                }
            };
            let mut answered = false;
            let r = watch(&svc, &x, channel, &mut acked_version, &mut answered, &mut first).await;
            if answered {
                attempt = 0;
            }
            let wait = x.backoff.wait(attempt, unit_random());
            attempt = attempt.saturating_add(1);
            if let Err(e) = r {
                log!(crate::logger::Level::Warn, "xDS: {e}; reconnecting in {wait:?} (XDS_CLIENT_BACKOFF_*)");
            }
            tokio::time::sleep(wait).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_as_the_files() {
        let c = RateLimitConfig {
            name: "a".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                value: "v".into(),
                rate_limit: Some(RateLimitPolicy { unit: 2, requests_per_unit: 3, ..Default::default() }),
                shadow_mode: true,
                ..Default::default()
            }],
        };
        let y = to_yaml(&c);
        let from_yaml = Config::load([("a", y.as_str())], false).unwrap();
        let m = from_yaml.get_limit("d", &[("k", "v")]).unwrap();
        assert_eq!(m.limit.requests_per_unit, 3);
        assert!(y.contains("unit: MINUTE"), "{y}");
        assert!(y.contains("shadow_mode: true"), "{y}");
        // an unknown unit is the loader's error, named as upstream names it
        let bad = RateLimitConfig {
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: Some(RateLimitPolicy { unit: 0, requests_per_unit: 3, ..Default::default() }),
                ..Default::default()
            }],
            ..c
        };
        assert!(Config::load([("a", to_yaml(&bad).as_str())], false).unwrap_err().to_string().contains("UNKNOWN"));
    }
}
