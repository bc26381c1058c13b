//! Proto3 JSON for `POST /json`: a `RateLimitRequest` in, a
//! `RateLimitResponse` out, as `protojson` (envoyproxy/ratelimit's
//! `NewJsonHandler`) reads and writes them: field names in lowerCamelCase
//! or as in the proto, enums by name or number, 64-bit integers as numbers
//! or strings, unknown fields refused; default values left out of the output.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Map, Value};

use crate::config::Unit;

type R<T> = Result<T, String>;

fn obj<'a>(v: &'a Value, what: &str) -> R<&'a Map<String, Value>> {
    v.as_object().ok_or_else(|| format!("{what} must be an object"))
}

/// The fields of `m`, each under one of its two JSON names; any other is an error.
fn fields<'a>(m: &'a Map<String, Value>, names: &[(&str, &str)], what: &str) -> R<Vec<Option<&'a Value>>> {
    for k in m.keys() {
        if !names.iter().any(|(a, b)| k == a || k == b) {
            return Err(format!("unknown field {k:?} in {what}"));
        }
    }
    names
        .iter()
        .map(|(a, b)| match (m.get(*a), m.get(*b)) {
            (Some(_), Some(_)) if a != b => Err(format!("field {a:?} given twice in {what}")),
            (Some(v), _) | (None, Some(v)) => Ok(Some(v).filter(|v| !v.is_null())),
            (None, None) => Ok(None),
        })
        .collect()
}

fn string(v: Option<&Value>, what: &str) -> R<String> {
    match v {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("{what} must be a string")),
    }
}

fn uint(v: Option<&Value>, max: u64, what: &str) -> R<u64> {
    let n = match v {
        None => return Ok(0),
        Some(Value::Number(n)) => {
            n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
        }
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        Some(_) => None,
    };
    n.filter(|&n| n <= max).ok_or_else(|| format!("{what} must be an unsigned integer of at most {max}"))
}

fn boolean(v: Option<&Value>, what: &str) -> R<bool> {
    match v {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{what} must be true or false")),
    }
}

fn unit(v: Option<&Value>) -> R<i32> {
    match v {
        None => Ok(0),
        Some(Value::String(s)) if s == "UNKNOWN" => Ok(0),
        Some(Value::String(s)) => {
            Unit::parse(s).filter(|u| u.name() == s).map(Unit::proto).ok_or_else(|| format!("unknown unit {s:?}"))
        }
        Some(Value::Number(n)) => n.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or_else(|| "bad unit".to_owned()),
        Some(_) => Err("unit must be a name or a number".into()),
    }
}

/// Reads a `RateLimitRequest` from its proto3 JSON.
pub fn parse_request(body: &[u8]) -> R<RateLimitRequest> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let m = obj(&v, "the request")?;
    let f =
        fields(m, &[("domain", "domain"), ("descriptors", "descriptors"), ("hitsAddend", "hits_addend")], "the request")?;
    let mut req = RateLimitRequest {
        domain: string(f[0], "domain")?,
        hits_addend: uint(f[2], u64::from(u32::MAX), "hitsAddend")? as u32,
        ..RateLimitRequest::default()
    };
    let ds = match f[1] {
        None => &[][..],
        Some(Value::Array(a)) => &a[..],
        Some(_) => return Err("descriptors must be a list".into()),
    };
    for d in ds {
        let m = obj(d, "a descriptor")?;
        let f = fields(
            m,
            &[
                ("entries", "entries"),
                ("limit", "limit"),
                ("hitsAddend", "hits_addend"),
                ("isNegativeHits", "is_negative_hits"),
            ],
            "a descriptor",
        )?;
        let mut desc = RateLimitDescriptor::default();
        match f[0] {
            None => {}
            Some(Value::Array(es)) => {
                for e in es {
                    let m = obj(e, "an entry")?;
                    let f = fields(m, &[("key", "key"), ("value", "value")], "an entry")?;
                    desc.entries.push(Entry { key: string(f[0], "key")?, value: string(f[1], "value")? });
                }
            }
            Some(_) => return Err("entries must be a list".into()),
        }
        if let Some(l) = f[1] {
            let m = obj(l, "limit")?;
            let f = fields(m, &[("requestsPerUnit", "requests_per_unit"), ("unit", "unit")], "limit")?;
            desc.limit = Some(RateLimitOverride {
                requests_per_unit: uint(f[0], u64::from(u32::MAX), "requestsPerUnit")? as u32,
                unit: unit(f[1])?,
            });
        }
        if let Some(h) = f[2] {
            // google.protobuf.UInt64Value: the number itself (or a string)
            desc.hits_addend = Some(UInt64Value { value: uint(Some(h), u64::MAX, "hitsAddend")? });
        }
        desc.is_negative_hits = boolean(f[3], "isNegativeHits")?;
        req.descriptors.push(desc);
    }
    Ok(req)
}

fn code_name(c: i32) -> &'static str {
    Code::try_from(c).map(|c| c.as_str_name()).unwrap_or("UNKNOWN")
}

/// Writes a `RateLimitResponse` as proto3 JSON (defaults left out).
pub fn render_response(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    if r.overall_code != 0 {
        out.insert("overallCode".into(), json!(code_name(r.overall_code)));
    }
    if !r.statuses.is_empty() {
        let sts: Vec<Value> = r
            .statuses
            .iter()
            .map(|s| {
                let mut m = Map::new();
                if s.code != 0 {
                    m.insert("code".into(), json!(code_name(s.code)));
                }
                if let Some(l) = &s.current_limit {
                    let mut lm = Map::new();
                    if !l.name.is_empty() {
                        lm.insert("name".into(), json!(l.name));
                    }
                    if l.requests_per_unit != 0 {
                        lm.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                    }
                    if l.unit != 0 {
                        let name = Unit::from_proto(l.unit).map(Unit::name).unwrap_or("UNKNOWN");
                        lm.insert("unit".into(), json!(name));
                    }
                    m.insert("currentLimit".into(), Value::Object(lm));
                }
                if s.limit_remaining != 0 {
                    m.insert("limitRemaining".into(), json!(s.limit_remaining));
                }
                if let Some(d) = &s.duration_until_reset {
                    m.insert("durationUntilReset".into(), json!(format!("{}s", d.seconds)));
                }
                Value::Object(m)
            })
            .collect();
        out.insert("statuses".into(), Value::Array(sts));
    }
    if !r.response_headers_to_add.is_empty() {
        let hs: Vec<Value> = r.response_headers_to_add.iter().map(|h| json!({"key": h.key, "value": h.value})).collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(hs));
    }
    if let Some(md) = &r.dynamic_metadata {
        out.insert("dynamicMetadata".into(), struct_json(md));
    }
    Value::Object(out)
}

/// A `google.protobuf.Struct` as proto3 JSON: the object it stands for
/// (a whole number without a fraction, as Go's protojson writes it).
fn struct_json(s: &envoy_types::pb::google::protobuf::Struct) -> Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    fn value(v: &envoy_types::pb::google::protobuf::Value) -> Value {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => Value::Null,
            Some(Kind::BoolValue(b)) => json!(b),
            Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9e15 => json!(*n as i64),
            Some(Kind::NumberValue(n)) => json!(n),
            Some(Kind::StringValue(s)) => json!(s),
            Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value).collect()),
            Some(Kind::StructValue(s)) => struct_json(s),
        }
    }
    Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), value(v))).collect())
}
