//! The xDS client's settings (`CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*`), read
//! and checked at startup with the other settings; the client itself is
//! [`crate::xds`].

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use rustls::pki_types::ServerName;

use crate::tls::ClientTls;

/// `XDS_CLIENT_BACKOFF_*`: the wait before a stream is opened again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL` (10s).
    pub initial: Duration,
    /// `XDS_CLIENT_BACKOFF_MAX_INTERVAL` (60s).
    pub max: Duration,
    /// `XDS_CLIENT_BACKOFF_RANDOM_FACTOR` (0.5): the growth factor, as
    /// upstream hands it to jpillora/backoff (below 1, every wait is the initial one).
    pub factor: f64,
    /// `XDS_CLIENT_BACKOFF_JITTER` (true): a wait drawn between the
    /// initial interval and the computed one.
    pub jitter: bool,
}

impl Backoff {
    /// The wait before attempt `attempt` (0 first), as jpillora/backoff's
    /// `ForAttempt`: `initial · factor^attempt` (jittered between `initial`
    /// and that), within `[initial, max]`; defaults for unset (0) values.
    pub fn wait(&self, attempt: u32, unit_random: f64) -> Duration {
        let min = if self.initial.is_zero() { Duration::from_millis(100) } else { self.initial };
        let max = if self.max.is_zero() { Duration::from_secs(10) } else { self.max };
        if min >= max {
            return max;
        }
        let factor = if self.factor <= 0.0 { 2.0 } else { self.factor };
        let minf = min.as_secs_f64();
        let mut d = minf * factor.powi(attempt.min(1 << 16) as i32);
        if self.jitter {
            d = unit_random * (d - minf) + minf;
        }
        if !d.is_finite() || d >= max.as_secs_f64() {
            return max;
        }
        Duration::from_secs_f64(d.max(0.0)).max(min)
    }
}

/// A number in [0, 1) that differs from call to call (std's random hash
/// keys: no generator to seed or share).
pub fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The xDS client's settings (`CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct XdsSettings {
    /// `CONFIG_GRPC_XDS_NODE_ID` (`default`).
    pub node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA` (`k1=v1,k2=v2`): the node's metadata, string values.
    pub node_metadata: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_URL` (`localhost:18000`): `host:port`.
    pub server_url: String,
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (3s).
    pub connect_retry_interval: Duration,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS` (`k1:v1,k2:v2`): the stream's metadata.
    pub additional_headers: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files.
    pub tls: Option<ClientTls>,
    /// `XDS_CLIENT_BACKOFF_*`.
    pub backoff: Backoff,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` (unset: gRPC's 4 MiB).
    pub max_msg_size: Option<usize>,
}

/// The xDS variables as set (empty: unset).
pub struct XdsVars<'a> {
    /// `CONFIG_GRPC_XDS_NODE_ID`.
    pub node_id: &'a str,
    /// `CONFIG_GRPC_XDS_NODE_METADATA`.
    pub node_metadata: &'a str,
    /// `CONFIG_GRPC_XDS_SERVER_URL`.
    pub server_url: &'a str,
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`.
    pub connect_retry_interval: &'a str,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`, parsed.
    pub additional_headers: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_USE_TLS`, parsed.
    pub use_tls: bool,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`.
    pub client_cert: &'a str,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_KEY`.
    pub client_key: &'a str,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`.
    pub server_ca: &'a str,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`.
    pub server_san: &'a str,
    /// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL`.
    pub backoff_initial: &'a str,
    /// `XDS_CLIENT_BACKOFF_MAX_INTERVAL`.
    pub backoff_max: &'a str,
    /// `XDS_CLIENT_BACKOFF_RANDOM_FACTOR`.
    pub backoff_factor: &'a str,
    /// `XDS_CLIENT_BACKOFF_JITTER`, parsed (unset: true).
    pub backoff_jitter: bool,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`.
    pub max_msg_size: &'a str,
}

fn or<'a>(v: &'a str, default: &'a str) -> &'a str {
    if v.is_empty() {
        default
    } else {
        v
    }
}

impl XdsSettings {
    /// The settings of the variables, every file read and checked.
    pub fn from_vars(v: &XdsVars<'_>) -> Result<XdsSettings, String> {
        let dur = |name: &str, val: &str, default: &str| {
            crate::gosyntax::parse_go_duration(or(val, default)).map_err(|e| format!("{name}: {e}"))
        };
        let server_url = or(v.server_url, "localhost:18000");
        let server_url = server_url.strip_prefix("dns:///").unwrap_or(server_url).to_owned();
        let host = match server_url.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => h.trim_start_matches('[').trim_end_matches(']'),
            _ => return Err(format!("CONFIG_GRPC_XDS_SERVER_URL={server_url:?}: host:port")),
        };
        let connect_retry_interval = dur("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", v.connect_retry_interval, "3s")?;
        if connect_retry_interval.is_zero() {
            return Err("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL must be above 0".into());
        }
        let backoff = Backoff {
            initial: dur("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", v.backoff_initial, "10s")?,
            max: dur("XDS_CLIENT_BACKOFF_MAX_INTERVAL", v.backoff_max, "60s")?,
            factor: or(v.backoff_factor, "0.5")
                .parse()
                .map_err(|_| format!("XDS_CLIENT_BACKOFF_RANDOM_FACTOR={:?}: not a number", v.backoff_factor))?,
            jitter: v.backoff_jitter,
        };
        let max_msg_size = match v.max_msg_size {
            "" | "0" => None,
            s => Some(
                s.parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES={s:?}: a positive integer"))?,
            ),
        };
        // "k1=v1,k2=v2"; an entry without '=' is skipped, as there
        let node_metadata = v
            .node_metadata
            .split(',')
            .filter_map(|e| e.split_once('='))
            .map(|(k, val)| (k.to_owned(), val.to_owned()))
            .collect();
        for (k, _) in &v.additional_headers {
            tonic::metadata::MetadataKey::<tonic::metadata::Ascii>::from_bytes(k.to_ascii_lowercase().as_bytes())
                .map_err(|_| format!("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: {k:?} is not a header name"))?;
        }
        let tls = if v.use_tls { Some(Self::tls(v, host)?) } else { None };
        Ok(XdsSettings {
            node_id: or(v.node_id, "default").to_owned(),
            node_metadata,
            server_url,
            connect_retry_interval,
            additional_headers: v.additional_headers.clone(),
            tls,
            backoff,
            max_msg_size,
        })
    }

    fn tls(v: &XdsVars<'_>, host: &str) -> Result<ClientTls, String> {
        if v.server_ca.is_empty() {
            return Err("CONFIG_GRPC_XDS_SERVER_USE_TLS=true needs CONFIG_GRPC_XDS_SERVER_TLS_CACERT here (the system's roots are not read)".into());
        }
        let client = match (v.client_cert, v.client_key) {
            ("", "") => None,
            ("", _) | (_, "") => {
                return Err("CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together".into())
            }
            (cert, key) => Some((("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert), ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key))),
        };
        let name = or(v.server_san, host);
        let server_name = ServerName::try_from(name.to_owned()).map_err(|e| {
            format!("the xDS server's name {name:?} (CONFIG_GRPC_XDS_SERVER_TLS_SAN or the URL's host): {e}")
        })?;
        ClientTls::new(("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", v.server_ca), client, true, server_name)
    }

    /// The node of every request: the id, and the metadata as string values.
    pub fn node(&self) -> Node {
        let fields = self
            .node_metadata
            .iter()
            .map(|(k, v)| (k.clone(), Value { kind: Some(Kind::StringValue(v.clone())) }))
            .collect();
        Node { id: self.node_id.clone(), metadata: Some(Struct { fields }), ..Node::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_as_jpillora() {
        let b = Backoff { initial: Duration::from_secs(10), max: Duration::from_secs(60), factor: 0.5, jitter: true };
        // upstream's defaults: a factor below 1 never grows past the initial interval
        for a in 0..5 {
            assert_eq!(b.wait(a, 0.9), Duration::from_secs(10));
        }
        let b = Backoff { factor: 2.0, jitter: false, ..b };
        assert_eq!(b.wait(0, 0.0), Duration::from_secs(10));
        assert_eq!(b.wait(1, 0.0), Duration::from_secs(20));
        assert_eq!(b.wait(3, 0.0), Duration::from_secs(60));
        assert_eq!(b.wait(u32::MAX, 0.0), Duration::from_secs(60));
        let b = Backoff { jitter: true, ..b };
        assert_eq!(b.wait(1, 0.5), Duration::from_secs(15));
        assert!((0..100).map(|_| unit_random()).all(|r| (0.0..1.0).contains(&r)));
    }
}
