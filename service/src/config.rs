//! envoyproxy/ratelimit's configuration, read unchanged: the YAML files
//! (`domain`, nested `descriptors` with `key`, `value` and wildcard values,
//! `rate_limit` with `unit`, `requests_per_unit`, `unlimited`, `name`,
//! `replaces`; `shadow_mode`, `quota_mode`, `detailed_metric`,
//! `share_threshold`, `metadata`), the
//! same load errors, and the same descriptor matching. Three extension keys
//! of `rate_limit` (`algorithm`, `burst`, `window_ms`) are this service's
//! own; a file without them is read exactly as envoyproxy/ratelimit reads it.
//!
//! The behaviour follows envoyproxy/ratelimit's `src/config/config_impl.go`
//! (read for behaviour; this is an independent implementation).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use ratelimit_core::catalogue::{Kind, KINDS};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_yaml::Value;

/// A rate-limit unit: the length of envoyproxy/ratelimit's fixed windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days (as envoyproxy/ratelimit counts a month).
    Month,
    /// 365 days (as envoyproxy/ratelimit counts a year).
    Year,
}

impl Unit {
    /// The unit of its (case-insensitive) name; `None` for anything else,
    /// `UNKNOWN` included.
    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// The window in seconds (envoyproxy/ratelimit's `UnitToDivider`).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The value of `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`
    /// (and of `envoy.type.v3.RateLimitUnit`).
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit of a proto enum value; `None` for `UNKNOWN` and unknown values.
    pub fn from_proto(v: i32) -> Option<Unit> {
        Some(match v {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    /// The proto enum's name (`SECOND` …), as proto3 JSON writes it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// The largest window (`window_ms`) and `burst` the module takes: 2^53 − 1.
pub const MAX_NUMBER: u64 = (1 << 53) - 1;

/// `algorithm` (an extension key of `rate_limit`): how a limit decides, a
/// kind of the core's catalogue
/// (`ratelimit_core::catalogue`), with its name in the configuration and
/// its key tag. The default is envoyproxy/ratelimit's fixed window, aligned
/// to the epoch (`RL.FIXEDWINDOW`); `token_bucket` (`RL.TOKENBUCKET`) has
/// `burst` tokens (default `requests_per_unit`) and regains
/// `requests_per_unit` per window, continuously; `sliding_log`
/// (`RL.SLIDINGLOG`) is an exact sliding window, `sliding_counter`
/// (`RL.SLIDINGCOUNTER`) its two-counter approximation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Algorithm(pub Kind);

impl Default for Algorithm {
    fn default() -> Algorithm {
        Algorithm(Kind::FixedWindow)
    }
}

impl Algorithm {
    /// The algorithm of its (case-insensitive) name; `None` for anything
    /// else, and for RL.CONCURRENCY's in-flight limit, which is not a rate
    /// limit a descriptor configures (issue 46's service part is to come).
    pub fn parse(s: &str) -> Option<Algorithm> {
        let s = s.to_ascii_lowercase();
        KINDS.into_iter().filter(|&k| k != Kind::Concurrency).map(Algorithm).find(|a| a.name() == s)
    }

    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self.0 {
            Kind::FixedWindow => "fixed_window",
            Kind::TokenBucket => "token_bucket",
            Kind::SlidingLog => "sliding_log",
            Kind::SlidingCounter => "sliding_counter",
            Kind::Concurrency => "concurrency",
        }
    }

    /// What its keys end with after the window: nothing for the fixed
    /// window (envoyproxy/ratelimit's layout), else `_tb`, `_sl`, `_sc`, so
    /// that no two algorithms ever share a key (the module answers
    /// `WRONGTYPE` for a key of another algorithm's type).
    pub fn key_tag(self) -> &'static str {
        match self.0 {
            Kind::FixedWindow => "",
            Kind::TokenBucket => "_tb",
            Kind::SlidingLog => "_sl",
            Kind::SlidingCounter => "_sc",
            Kind::Concurrency => "_cc",
        }
    }
}

/// One configured limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    /// `requests_per_unit` (0: every counted request is over the limit).
    pub requests_per_unit: u32,
    /// `unit`; `None` only with `unlimited` or `window_ms`.
    pub unit: Option<Unit>,
    /// `unlimited: true`: never limited, nothing counted.
    pub unlimited: bool,
    /// `name` (`""` when not given).
    pub name: String,
    /// The names of the limits this one replaces.
    pub replaces: Vec<String>,
    /// `shadow_mode` of its descriptor.
    pub shadow_mode: bool,
    /// `quota_mode` of its descriptor (docs/envoy.md, "Quota mode").
    pub quota_mode: bool,
    /// `metadata` of its descriptor (`RESPONSE_DYNAMIC_METADATA`).
    pub metadata: Option<crate::dynamic_metadata::Metadata>,
    /// `detailed_metric` of its descriptor (metrics only; kept for them).
    pub detailed_metric: bool,
    /// The descriptor path, `domain.key_value.key…` (the stats key).
    pub full_key: String,
    /// `algorithm` (extension; default the fixed window).
    pub algorithm: Algorithm,
    /// `window_ms` (extension): the window in ms, given instead of `unit`.
    pub window_ms: Option<u64>,
    /// `burst` (extension, token bucket only): the bucket's capacity;
    /// `None`: `requests_per_unit`.
    pub burst: Option<u64>,
}

impl RateLimit {
    /// The window in ms: `window_ms`, else the unit's length (`None` only with `unlimited`).
    pub fn window(&self) -> Option<u64> {
        self.window_ms.or(self.unit.map(|u| u.seconds() * 1000))
    }

    /// The unit answered in `current_limit`: `unit`; for `window_ms`, the
    /// unit of exactly that length, else `None` (the proto's `UNKNOWN`: no
    /// unit describes the window, and Envoy then leaves the limit's `w=` out
    /// of its `X-RateLimit-Limit` header rather than state a wrong window).
    pub fn reported_unit(&self) -> Option<Unit> {
        match (self.unit, self.window_ms) {
            (Some(u), _) => Some(u),
            (None, Some(ms)) => [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Month, Unit::Year]
                .into_iter()
                .find(|u| u.seconds() * 1000 == ms),
            (None, None) => None,
        }
    }

    /// The end of the limit's counter key: the window (the unit's length in
    /// seconds, as `…_60`, or `<ms>ms` for `window_ms`, as `…_1500ms`), then
    /// the algorithm's tag ([`Algorithm::key_tag`]). A change of algorithm
    /// or window never reads another one's state.
    pub fn key_suffix(&self) -> String {
        let mut s = String::new();
        self.push_key_suffix(&mut s);
        s
    }

    /// [`RateLimit::key_suffix`] appended to `out` (a key being built).
    pub fn push_key_suffix(&self, out: &mut String) {
        match (self.window_ms, self.unit) {
            (Some(ms), _) => {
                out.push_str(itoa::Buffer::new().format(ms));
                out.push_str("ms");
            }
            (None, u) => out.push_str(itoa::Buffer::new().format(u.unwrap_or(Unit::Second).seconds())),
        }
        out.push_str(self.algorithm.key_tag());
    }
}

/// What a request descriptor matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched {
    /// The limit.
    pub limit: Arc<RateLimit>,
    /// Per entry, the wildcard pattern that replaces the entry's value in
    /// the counter's key (`share_threshold`), or `None`.
    pub share: Vec<Option<String>>,
    /// The stats key `value_to_metric` makes (the request's value in place
    /// of a default key's or a wildcard's), when it differs from the
    /// limit's `full_key`; `None` otherwise.
    pub metric_key: Option<String>,
}

/// A load error: the file's name and what is wrong, as
/// envoyproxy/ratelimit words it (`<file>: <error>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn err(file: &str, msg: impl fmt::Display) -> ConfigError {
    ConfigError(format!("{file}: {msg}"))
}

const VALID_KEYS: [&str; 20] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    // this service's extension keys, valid only in a rate_limit
    "algorithm",
    "burst",
    "window_ms",
    // and the one valid only at a file's top level (crate::spread)
    "hash_tag_key",
];

/// The extension keys: refused anywhere but directly in a `rate_limit`.
const EXTENSION_KEYS: [&str; 3] = ["algorithm", "burst", "window_ms"];

#[derive(Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    /// Wildcard children of this node, in load order: (key_value pattern, parts split at `*`).
    wildcards: Vec<(String, Vec<String>)>,
    limit: Option<Arc<RateLimit>>,
    /// `share_threshold`: the wildcard pattern (`key_value*`).
    share_pattern: Option<String>,
    /// `value_to_metric`: the request's value in the stats key.
    value_to_metric: bool,
    /// This node or one below it has `value_to_metric` (a domain without
    /// any builds no stats key while matching).
    any_value_to_metric: bool,
    /// A domain's root: `hash_tag_key`, the entry whose value is the
    /// Redis Cluster hash tag of its descriptors' keys (crate::spread).
    hash_tag_key: Option<String>,
}

/// A loaded configuration: every domain's descriptor tree.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Node>,
}

/// Whether `value` matches a wildcard pattern split at its `*`s: the
/// first part a prefix, the last a suffix, the middle ones in order.
fn wildcard_match(parts: &[String], value: &str) -> bool {
    if parts.len() == 1 {
        return parts[0] == value;
    }
    let first = &parts[0];
    let last = &parts[parts.len() - 1];
    let fixed: usize = parts.iter().map(|p| p.len()).sum();
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) || value.len() < fixed {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p.as_str()) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

/// A value as the file gives it: absent (the default), or given, `null`
/// included (`unit: ~` is given, and refused where absent is not). The
/// leaves of the typed file below: envoyproxy/ratelimit reads numbers and
/// booleans into string fields (yaml.v2), so a leaf is typed when it is
/// read, with the error that names it.
#[derive(Debug, Default)]
struct Given(Option<Value>);

impl<'de> Deserialize<'de> for Given {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Given, D::Error> {
        Value::deserialize(d).map(|v| Given(Some(v)))
    }
}

impl Given {
    fn is_given(&self) -> bool {
        self.0.is_some()
    }

    /// A scalar as text (absent or null: empty).
    fn text(&self, file: &str, what: &str) -> Result<String, ConfigError> {
        match self.0.as_ref().unwrap_or(&Value::Null) {
            Value::Null => Ok(String::new()),
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            _ => Err(err(file, format!("error loading config file: {what} must be a string"))),
        }
    }

    /// A boolean (absent or null: false).
    fn boolean(&self, file: &str, what: &str) -> Result<bool, ConfigError> {
        match &self.0 {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(err(file, format!("error loading config file: {what} must be true or false"))),
        }
    }

    /// A list of `T` (absent or null: empty); `elem` is the error of an
    /// element `T` does not read.
    fn list<T: DeserializeOwned>(&self, file: &str, what: &str, elem: &str) -> Result<Vec<T>, ConfigError> {
        match &self.0 {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Sequence(s)) => s.iter().map(|v| typed(file, v, elem)).collect(),
            Some(_) => Err(err(file, format!("error loading config file: {what} must be a list"))),
        }
    }

    /// An extension key's number (`window_ms`, `burst`): absent, or an
    /// integer from 1 to 2^53 − 1 (the module's range).
    fn extension_number(&self, file: &str, what: &str) -> Result<Option<u64>, ConfigError> {
        let Some(v) = &self.0 else { return Ok(None) };
        match v {
            Value::Number(n) if n.as_u64().is_some_and(|n| (1..=MAX_NUMBER).contains(&n)) => Ok(n.as_u64()),
            _ => {
                let shown = match v {
                    Value::Number(n) => n.to_string(),
                    Value::String(s) => s.clone(),
                    Value::Bool(b) => b.to_string(),
                    Value::Null => String::new(),
                    _ => format!("{v:?}"),
                };
                Err(err(file, format!("invalid rate limit {what} '{shown}': an integer from 1 to {MAX_NUMBER}")))
            }
        }
    }
}

/// `T` of a map `v`; anything else is `error` (every field of `T` is a
/// [`Given`], so a map always reads).
fn typed<T: DeserializeOwned>(file: &str, v: &Value, error: &str) -> Result<T, ConfigError> {
    match v {
        Value::Mapping(_) => T::deserialize(v.clone()).map_err(|e| err(file, format!("error loading config file: {e}"))),
        _ => Err(err(file, error)),
    }
}

/// A file: its domain and descriptors.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct FileYaml {
    domain: Given,
    descriptors: Given,
    hash_tag_key: Given,
}

/// A descriptor of a file (`metadata` free-form: any map).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DescriptorYaml {
    key: Given,
    value: Given,
    descriptors: Given,
    rate_limit: Given,
    shadow_mode: Given,
    quota_mode: Given,
    detailed_metric: Given,
    value_to_metric: Given,
    share_threshold: Given,
    metadata: Given,
}

/// A descriptor's `rate_limit`, with this service's extension keys.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RateLimitYaml {
    unit: Given,
    requests_per_unit: Given,
    unlimited: Given,
    name: Given,
    replaces: Given,
    algorithm: Given,
    burst: Given,
    window_ms: Given,
}

/// An entry of `replaces`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ReplacesYaml {
    name: Given,
}

/// envoyproxy/ratelimit's key check: every mapping key a known one, lists
/// only of maps, scalars strings, integers, booleans or null (`metadata` free-form).
/// The extension keys only directly in a `rate_limit` (`in_rate_limit`).
fn validate_keys(file: &str, m: &serde_yaml::Mapping, in_rate_limit: bool) -> Result<(), ConfigError> {
    validate_keys_at(file, m, in_rate_limit, false)
}

/// [`validate_keys`], `top` at a file's top level (where `hash_tag_key` is valid).
fn validate_keys_at(file: &str, m: &serde_yaml::Mapping, in_rate_limit: bool, top: bool) -> Result<(), ConfigError> {
    for (k, v) in m {
        let Value::String(k) = k else {
            return Err(err(file, format!("config error, key is not of type string: {k:?}")));
        };
        if !VALID_KEYS.contains(&k.as_str()) {
            return Err(err(file, format!("config error, unknown key '{k}'")));
        }
        if k == "hash_tag_key" && !top {
            return Err(err(file, "config error, key 'hash_tag_key' is only valid at the top of a file, beside domain"));
        }
        if !in_rate_limit && EXTENSION_KEYS.contains(&k.as_str()) {
            return Err(err(file, format!("config error, key '{k}' is only valid in a rate_limit")));
        }
        if k == "metadata" {
            continue;
        }
        match v {
            Value::Sequence(s) => {
                for e in s {
                    let Value::Mapping(e) = e else {
                        return Err(err(
                            file,
                            format!("config error, yaml file contains list of type other than map: {e:?}"),
                        ));
                    };
                    validate_keys(file, e, false)?;
                }
            }
            Value::Mapping(m) => validate_keys(file, m, k == "rate_limit")?,
            Value::String(_) | Value::Bool(_) | Value::Null => {}
            Value::Number(n) if n.is_i64() || n.is_u64() => {}
            _ => return Err(err(file, "error checking config")),
        }
    }
    Ok(())
}

impl Config {
    /// Loads files given as (name, YAML text), in order, into one
    /// configuration. A domain in two files is an error unless `merge`
    /// (`MERGE_DOMAIN_CONFIG`), which adds the second file's descriptors.
    pub fn load<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>, merge: bool) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        for (name, yaml) in files {
            cfg.load_file(name, yaml, merge)?;
        }
        Ok(cfg)
    }

    fn load_file(&mut self, file: &str, yaml: &str, merge: bool) -> Result<(), ConfigError> {
        let root: Value = serde_yaml::from_str(yaml).map_err(|e| err(file, format!("error loading config file: {e}")))?;
        let root = match root {
            Value::Mapping(m) => m,
            Value::Null => serde_yaml::Mapping::new(),
            _ => return Err(err(file, "error loading config file: the file must be a map")),
        };
        validate_keys_at(file, &root, false, true)?;
        let root: FileYaml = typed(file, &Value::Mapping(root), "error loading config file: the file must be a map")?;
        let domain = root.domain.text(file, "domain")?;
        if domain.is_empty() {
            return Err(err(file, "config file cannot have empty domain"));
        }
        let descriptors =
            root.descriptors.list(file, "descriptors", "error loading config file: a descriptor must be a map")?;
        if self.domains.contains_key(&domain) && !merge {
            return Err(err(file, format!("duplicate domain '{domain}' in config file")));
        }
        let text = root.hash_tag_key.text(file, "hash_tag_key").map_err(|e| e.0);
        let tag = check_hash_tag_key(root.hash_tag_key.is_given(), text).map_err(|m| err(file, m))?;
        let node = self.domains.entry(domain.clone()).or_default();
        load_descriptors(file, node, &format!("{domain}."), descriptors)?;
        let old = node.hash_tag_key.take();
        let merged = merge_hash_tag_key(&domain, old, tag, |k| node_uses_key(node, k));
        node.hash_tag_key = merged.map_err(|m| err(file, m))?;
        Ok(())
    }

    /// Whether no domain is loaded.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit a request descriptor (its entries as (key, value)) matches
    /// in `domain`, as envoyproxy/ratelimit's `GetLimit` finds it (without
    /// the per-request `limit` override, which the caller applies): at each
    /// level `key_value` exactly, else the first wildcard pattern that
    /// matches `key_value`, else `key` alone; the limit counts only when it
    /// is on the node of the last entry.
    pub fn get_limit(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched> {
        self.domain(domain)?.get_limit_of(entries.iter().copied())
    }

    /// A configured domain, looked up once for all of a request's descriptors.
    pub fn domain(&self, domain: &str) -> Option<Domain<'_>> {
        self.domains.get_key_value(domain).map(|(name, node)| Domain(node, name))
    }

    /// The configuration as envoyproxy/ratelimit's `Dump()` writes it (the
    /// debug listener's `/rlconfig`): a line per limit,
    /// `domain.key_value…: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false`,
    /// `unit=UNKNOWN` without a unit (`unlimited`, `window_ms`). Sorted by
    /// domain then key (upstream walks Go maps, in no set order); this
    /// service's extension keys follow when set (`, algorithm: token_bucket`,
    /// `, window_ms: 1500`, `, burst: 20`).
    pub fn dump(&self) -> String {
        fn walk(node: &Node, out: &mut String) {
            if let Some(l) = &node.limit {
                let unit = l.unit.map_or("UNKNOWN", Unit::name);
                out.push_str(&format!(
                    "{}: unit={unit} requests_per_unit={}, shadow_mode: {}, quota_mode: {}",
                    l.full_key, l.requests_per_unit, l.shadow_mode, l.quota_mode
                ));
                if l.algorithm != Algorithm::default() {
                    out.push_str(&format!(", algorithm: {}", l.algorithm.name()));
                }
                if let Some(ms) = l.window_ms {
                    out.push_str(&format!(", window_ms: {ms}"));
                }
                if let Some(b) = l.burst {
                    out.push_str(&format!(", burst: {b}"));
                }
                out.push('\n');
            }
            let mut keys: Vec<&String> = node.children.keys().collect();
            keys.sort();
            for k in keys {
                walk(&node.children[k], out);
            }
        }
        let mut out = String::new();
        let mut names: Vec<&String> = self.domains.keys().collect();
        names.sort();
        for d in names {
            walk(&self.domains[d], &mut out);
        }
        out
    }
}

/// A file's `hash_tag_key`: absent, or a non-empty descriptor key.
fn check_hash_tag_key(given: bool, text: Result<String, String>) -> Result<Option<String>, String> {
    if !given {
        return Ok(None);
    }
    let k = text.map_err(|_| "hash_tag_key must be a descriptor key (a string)".to_owned())?;
    if k.is_empty() {
        return Err("hash_tag_key must not be empty (leave it out: every key its own slot)".into());
    }
    Ok(Some(k))
}

/// A domain's `hash_tag_key` after one more file: the same in every file
/// of a merged domain, and the key of one of its descriptors (`used`).
fn merge_hash_tag_key(
    domain: &str,
    old: Option<String>,
    new: Option<String>,
    used: impl Fn(&str) -> bool,
) -> Result<Option<String>, String> {
    let k = match (old, new) {
        (Some(a), Some(b)) if a != b => {
            return Err(format!("domain '{domain}' has two hash_tag_key: '{a}' and '{b}'"));
        }
        (Some(a), _) => return Ok(Some(a)),
        (None, None) => return Ok(None),
        (None, Some(b)) => b,
    };
    if !used(&k) {
        return Err(format!("hash_tag_key '{k}' is the key of no descriptor of domain '{domain}'"));
    }
    Ok(Some(k))
}

/// Whether a descriptor below `node` has the key `k`.
fn node_uses_key(node: &Node, k: &str) -> bool {
    node.children
        .iter()
        .any(|(kv, n)| kv.strip_prefix(k).is_some_and(|r| r.is_empty() || r.starts_with('_')) || node_uses_key(n, k))
}

/// One domain of a [`Config`] ([`Config::domain`]): its tree and its name.
#[derive(Debug, Clone, Copy)]
pub struct Domain<'c>(&'c Node, &'c str);

/// How a request entry found its node: its `key_value`, a wildcard pattern, or its key alone.
enum How<'n> {
    Value,
    Wildcard(&'n str),
    Key,
}

impl<'c> Domain<'c> {
    /// `hash_tag_key`: the entry whose value is its keys' hash tag, if configured.
    pub fn hash_tag_key(&self) -> Option<&'c str> {
        self.0.hash_tag_key.as_deref()
    }
}

impl Domain<'_> {
    /// [`Config::get_limit`] in this domain, over the entries as an
    /// iterator: a request's descriptor is matched without a slice of its
    /// entries built first.
    pub fn get_limit_of<'e>(&self, entries: impl ExactSizeIterator<Item = (&'e str, &'e str)>) -> Option<Matched> {
        let mut node = self.0;
        let mut found = None;
        let mut share: Vec<Option<String>> = Vec::new();
        let count = entries.len();
        // value_to_metric (only in a domain that has it): the stats key, as envoyproxy/ratelimit builds it
        let mut metric = self.0.any_value_to_metric.then(|| self.1.to_owned());
        for (i, (k, v)) in entries.enumerate() {
            let (mut next, by_wildcard) = with_joined(k, v, |kv| {
                if let Some(next) = node.children.get(kv) {
                    return (Some(next), None);
                }
                for (pattern, parts) in &node.wildcards {
                    if wildcard_match(parts, kv) {
                        return (node.children.get(pattern), Some(pattern));
                    }
                }
                (None, None)
            });
            let how = match (next.is_some(), by_wildcard) {
                (true, Some(p)) => How::Wildcard(p),
                (true, None) => How::Value,
                _ => How::Key,
            };
            if next.is_none() {
                next = node.children.get(k);
            }
            let Some(n) = next else { break };
            if let Some(m) = metric.as_mut() {
                m.push('.');
                match how {
                    How::Value => push_kv(m, k, v),
                    How::Wildcard(p) if n.share_pattern.is_some() || !n.value_to_metric => m.push_str(p),
                    How::Wildcard(_) => push_kv(m, k, v),
                    How::Key if n.value_to_metric => push_kv(m, k, v),
                    How::Key => m.push_str(k),
                }
            }
            if let (Some(_), Some(pattern)) = (by_wildcard, &n.share_pattern) {
                if share.len() < count {
                    share.resize(count, None);
                }
                let value = pattern.strip_prefix(k).and_then(|p| p.strip_prefix('_')).unwrap_or(pattern);
                share[i] = Some(value.to_owned());
            }
            if let Some(l) = &n.limit {
                if i == count - 1 {
                    found = Some(l.clone());
                }
            }
            if n.children.is_empty() {
                break;
            }
            node = n;
        }
        found.map(|limit| {
            let metric_key = metric.filter(|m| !limit.detailed_metric && *m != limit.full_key);
            Matched { limit, share, metric_key }
        })
    }
}

/// `key_value`, or `key` alone for an empty value.
fn push_kv(out: &mut String, key: &str, value: &str) {
    out.push_str(key);
    if !value.is_empty() {
        out.push('_');
        out.push_str(value);
    }
}

/// `f` of `key_value` (a descriptor entry's node name), joined on the
/// stack when short enough: matching takes no allocation per entry.
fn with_joined<R>(key: &str, value: &str, f: impl FnOnce(&str) -> R) -> R {
    let mut buf = [0u8; 256];
    let len = key.len() + 1 + value.len();
    if len <= buf.len() {
        buf[..key.len()].copy_from_slice(key.as_bytes());
        buf[key.len()] = b'_';
        buf[key.len() + 1..len].copy_from_slice(value.as_bytes());
        // two strs and an ASCII byte: always UTF-8
        if let Ok(kv) = std::str::from_utf8(&buf[..len]) {
            return f(kv);
        }
    }
    f(&format!("{key}_{value}"))
}

fn load_descriptors(file: &str, node: &mut Node, parent: &str, descriptors: Vec<DescriptorYaml>) -> Result<(), ConfigError> {
    for d in descriptors {
        let key = d.key.text(file, "key")?;
        if key.is_empty() {
            return Err(err(file, "descriptor has empty key"));
        }
        let value = d.value.text(file, "value")?;
        let final_key = if value.is_empty() { key.clone() } else { format!("{key}_{value}") };
        let path = format!("{parent}{final_key}");
        if node.children.contains_key(&final_key) {
            return Err(err(file, format!("duplicate descriptor composite key '{path}'")));
        }
        let shadow_mode = d.shadow_mode.boolean(file, "shadow_mode")?;
        let quota_mode = d.quota_mode.boolean(file, "quota_mode")?;
        let metadata = crate::dynamic_metadata::from_yaml(d.metadata.0.as_ref()).map_err(|e| err(file, e))?;
        let detailed_metric = d.detailed_metric.boolean(file, "detailed_metric")?;
        let value_to_metric = d.value_to_metric.boolean(file, "value_to_metric")?;
        let share_threshold = d.share_threshold.boolean(file, "share_threshold")?;
        let limit = match &d.rate_limit.0 {
            None | Some(Value::Null) => None,
            Some(r) => {
                let r: RateLimitYaml = typed(file, r, "error loading config file: rate_limit must be a map")?;
                let mut l = rate_limit(file, r, &path, shadow_mode, detailed_metric)?;
                (l.quota_mode, l.metadata) = (quota_mode, metadata);
                Some(Arc::new(l))
            }
        };
        if share_threshold && !final_key.contains('*') {
            return Err(err(
                file,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{final_key}'"
                ),
            ));
        }
        if final_key.contains('*') {
            let parts = final_key.split('*').map(str::to_owned).collect();
            node.wildcards.push((final_key.clone(), parts));
        }
        let mut child = Node {
            limit,
            share_pattern: share_threshold.then(|| final_key.clone()),
            value_to_metric,
            any_value_to_metric: value_to_metric,
            ..Node::default()
        };
        let children = d.descriptors.list(file, "descriptors", "error loading config file: a descriptor must be a map")?;
        load_descriptors(file, &mut child, &format!("{path}."), children)?;
        node.any_value_to_metric |= child.any_value_to_metric;
        node.children.insert(final_key, child);
    }
    Ok(())
}

fn rate_limit(
    file: &str,
    r: RateLimitYaml,
    path: &str,
    shadow_mode: bool,
    detailed_metric: bool,
) -> Result<RateLimit, ConfigError> {
    let unlimited = r.unlimited.boolean(file, "unlimited")?;
    let unit_text = r.unit.text(file, "unit")?;
    let unit = Unit::parse(&unit_text);
    // the extension keys (this service's own; see the README)
    let window_ms = r.window_ms.extension_number(file, "window_ms")?;
    let burst = r.burst.extension_number(file, "burst")?;
    let algorithm = match r.algorithm.is_given() {
        false => Algorithm(Kind::FixedWindow),
        true => {
            let a = r.algorithm.text(file, "algorithm")?;
            Algorithm::parse(&a).ok_or_else(|| err(file, format!("invalid rate limit algorithm '{a}'")))?
        }
    };
    if unlimited {
        if unit.is_some() {
            return Err(err(file, "should not specify rate limit unit when unlimited"));
        }
        for (k, given) in [("algorithm", &r.algorithm), ("burst", &r.burst), ("window_ms", &r.window_ms)] {
            if given.is_given() {
                return Err(err(file, format!("should not specify rate limit {k} when unlimited")));
            }
        }
    } else if window_ms.is_some() {
        if r.unit.is_given() {
            return Err(err(file, "should not specify both rate limit unit and window_ms"));
        }
    } else if unit.is_none() {
        return Err(err(file, format!("invalid rate limit unit '{unit_text}'")));
    }
    if burst.is_some() && algorithm != Algorithm(Kind::TokenBucket) {
        return Err(err(
            file,
            format!("rate limit burst only applies to algorithm token_bucket, not '{}'", algorithm.name()),
        ));
    }
    let requests_per_unit = requests_per_unit(file, &r.requests_per_unit)?;
    if burst.is_some() && requests_per_unit == 0 {
        return Err(err(file, "rate limit burst needs requests_per_unit above 0 (0 refuses every request)"));
    }
    let name = r.name.text(file, "name")?;
    let replaces = replaces(file, &r.replaces, &name)?;
    Ok(RateLimit {
        requests_per_unit,
        unit,
        unlimited,
        name,
        replaces,
        shadow_mode,
        quota_mode: false,
        metadata: None,
        detailed_metric,
        full_key: path.to_owned(),
        algorithm,
        window_ms,
        burst,
    })
}

/// `requests_per_unit`: a 32-bit unsigned integer (absent or null: 0).
fn requests_per_unit(file: &str, v: &Given) -> Result<u32, ConfigError> {
    match &v.0 {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
            err(file, format!("error loading config file: requests_per_unit {n} is not a 32-bit unsigned integer"))
        }),
        Some(v) => Err(err(file, format!("error loading config file: requests_per_unit must be an integer, not {v:?}"))),
    }
}

/// The names of `replaces`: none empty, none the limit's own `name`.
fn replaces(file: &str, v: &Given, name: &str) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for e in v.list::<ReplacesYaml>(file, "replaces", "error loading config file: a replaces entry must be a map")? {
        let n = e.name.text(file, "replaces name")?;
        if n.is_empty() {
            return Err(err(file, "should not have an empty replaces entry"));
        }
        if n == name {
            return Err(err(file, "replaces should not contain name of same descriptor"));
        }
        out.push(n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    //! What a key given as `null` means, where absent means something else
    //! (service/tests' units test the rest of the loading).
    use super::*;

    fn refusal(rate_limit: &str) -> String {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{{rate_limit}}}\n");
        Config::load([("f", yaml.as_str())], false).map(|_| ()).unwrap_err().0
    }

    #[test]
    fn a_null_is_given() {
        assert_eq!(refusal("window_ms: 1000, unit: ~"), "f: should not specify both rate limit unit and window_ms");
        assert_eq!(
            refusal("unit: second, window_ms: ~"),
            format!("f: invalid rate limit window_ms '': an integer from 1 to {MAX_NUMBER}")
        );
        assert_eq!(refusal("unit: second, algorithm: ~"), "f: invalid rate limit algorithm ''");
        assert_eq!(
            refusal("unlimited: true, algorithm: token_bucket"),
            "f: should not specify rate limit algorithm when unlimited"
        );
        // absent and null are the same where the file says nothing else
        assert_eq!(refusal("unit: ~"), "f: invalid rate limit unit ''");
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: ~, name: ~, replaces: ~}\n";
        let l = Config::load([("f", yaml)], false).unwrap().get_limit("d", &[("k", "")]).unwrap().limit;
        assert_eq!(
            (l.requests_per_unit, l.name.as_str(), l.replaces.len(), l.algorithm),
            (0, "", 0, Algorithm(Kind::FixedWindow))
        );
    }
}
