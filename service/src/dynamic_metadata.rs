//! `RESPONSE_DYNAMIC_METADATA` and a descriptor's `metadata`: the
//! response's `dynamic_metadata` (a `google.protobuf.Struct`), with the
//! fields envoyproxy/ratelimit fills (its `src/service/ratelimit.go`,
//! `ratelimitToMetadata`, read for behaviour):
//!
//! * `domain`: the request's domain;
//! * `descriptors`: per request descriptor, `entries` (`"key=value"` each),
//!   `limit` (the request's override, in protobuf text:
//!   `requests_per_unit:10 unit:SECOND`) when given, `hitsAddend` when the
//!   descriptor has one (0 included);
//! * `hitsAddend`: the request's, when not 0;
//! * `metadata`: the `metadata` of the limits of the descriptors that
//!   passed (not `OVER_LIMIT`, not `unlimited`), merged in request order:
//!   maps merged key by key, recursively; on any other clash the first
//!   descriptor's value stays. Left out when empty.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

/// A limit's `metadata`, converted once when the file loads.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata(pub Struct);

// (a YAML `.nan` is the one value not equal to itself: a limit's equality
// is only used by tests)
impl Eq for Metadata {}

/// A descriptor's `metadata` (a map, any depth) as a Struct, as
/// envoyproxy/ratelimit's `structpb.NewStruct` makes it: numbers as
/// doubles, `null` as the null value, keys that are not strings as their
/// text. `None` for an absent, null or empty map.
pub fn from_yaml(v: Option<&serde_yaml::Value>) -> Result<Option<Metadata>, String> {
    match v {
        None | Some(serde_yaml::Value::Null) => Ok(None),
        Some(serde_yaml::Value::Mapping(m)) if m.is_empty() => Ok(None),
        Some(serde_yaml::Value::Mapping(m)) => Ok(Some(Metadata(map(m)?))),
        Some(other) => Err(format!("error parsing metadata: a map, not {other:?}")),
    }
}

fn map(m: &serde_yaml::Mapping) -> Result<Struct, String> {
    let mut s = Struct::default();
    for (k, v) in m {
        let k = match k {
            serde_yaml::Value::String(s) => s.clone(),
            serde_yaml::Value::Number(n) => n.to_string(),
            serde_yaml::Value::Bool(b) => b.to_string(),
            other => return Err(format!("error parsing metadata: invalid key {other:?}")),
        };
        s.fields.insert(k, value(v)?);
    }
    Ok(s)
}

fn value(v: &serde_yaml::Value) -> Result<Value, String> {
    use serde_yaml::Value as Y;
    let kind = match v {
        Y::Null => Kind::NullValue(0),
        Y::Bool(b) => Kind::BoolValue(*b),
        Y::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Y::String(s) => Kind::StringValue(s.clone()),
        Y::Sequence(l) => Kind::ListValue(ListValue { values: l.iter().map(value).collect::<Result<_, _>>()? }),
        Y::Mapping(m) => Kind::StructValue(map(m)?),
        Y::Tagged(t) => return Err(format!("error parsing metadata: invalid value {:?}", t.tag)),
    };
    Ok(Value { kind: Some(kind) })
}

fn string(s: String) -> Value {
    Value { kind: Some(Kind::StringValue(s)) }
}

fn number(n: u64) -> Value {
    Value { kind: Some(Kind::NumberValue(n as f64)) }
}

/// The response's dynamic metadata (this module's header says what it
/// holds): the request, and the metadata of the limits that passed, in
/// request order (crate::respond::dynamic_metadata picks them).
pub fn of_request<'m>(req: &RateLimitRequest, passed_limits: impl IntoIterator<Item = &'m Metadata>) -> Struct {
    let mut out = Struct::default();
    out.fields.insert("domain".into(), string(req.domain.clone()));
    let descriptors = req.descriptors.iter().map(|d| Value { kind: Some(Kind::StructValue(descriptor(d))) });
    let list = ListValue { values: descriptors.collect() };
    out.fields.insert("descriptors".into(), Value { kind: Some(Kind::ListValue(list)) });
    if req.hits_addend != 0 {
        out.fields.insert("hitsAddend".into(), number(req.hits_addend.into()));
    }
    let mut passed = Struct::default();
    for md in passed_limits {
        merge(&mut passed, &md.0);
    }
    if !passed.fields.is_empty() {
        out.fields.insert("metadata".into(), Value { kind: Some(Kind::StructValue(passed)) });
    }
    out
}

/// One request descriptor: its entries, its `limit` override, its `hits_addend`.
fn descriptor(d: &RateLimitDescriptor) -> Struct {
    let mut s = Struct::default();
    let entries = d.entries.iter().map(|e| string(format!("{}={}", e.key, e.value))).collect();
    s.fields.insert("entries".into(), Value { kind: Some(Kind::ListValue(ListValue { values: entries })) });
    if let Some(l) = &d.limit {
        // protobuf's text format of the override: fields at their default left out
        let mut t = Vec::new();
        if l.requests_per_unit != 0 {
            t.push(format!("requests_per_unit:{}", l.requests_per_unit));
        }
        match (l.unit, RateLimitUnit::try_from(l.unit)) {
            (0, _) => {}
            (_, Ok(u)) => t.push(format!("unit:{}", u.as_str_name())),
            (n, Err(_)) => t.push(format!("unit:{n}")),
        }
        s.fields.insert("limit".into(), string(t.join(" ")));
    }
    if let Some(h) = &d.hits_addend {
        s.fields.insert("hitsAddend".into(), number(h.value));
    }
    s
}

/// `src` into `dest`: a key both have as maps merged recursively, else
/// `dest`'s value kept; keys only `src` has added.
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match dest.fields.get_mut(k) {
            Some(Value { kind: Some(Kind::StructValue(d)) }) => {
                if let Some(Kind::StructValue(s)) = &v.kind {
                    merge(d, s);
                }
            }
            Some(_) => {}
            None => {
                dest.fields.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Struct {
        let v: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
        from_yaml(Some(&v)).unwrap().unwrap().0
    }

    #[test]
    fn merged_maps_first_wins_elsewhere() {
        let mut d = yaml("{a: {x: 1}, b: first, l: [1]}");
        merge(&mut d, &yaml("{a: {y: 2, x: 9}, b: second, c: {z: null}, l: [2]}"));
        assert_eq!(d, yaml("{a: {x: 1, y: 2}, b: first, c: {z: null}, l: [1]}"));
        assert!(from_yaml(Some(&serde_yaml::Value::Bool(true))).is_err());
        assert_eq!(from_yaml(Some(&serde_yaml::from_str("{}").unwrap())), Ok(None));
        assert_eq!(yaml("{1: 2.5}").fields["1"].kind, Some(Kind::NumberValue(2.5)));
    }
}
