//! `PROMETHEUS_MAPPER_YAML`: a statsd-exporter mapping file, as
//! envoyproxy/ratelimit's Prometheus sink reads it, applied to this
//! service's statsd names. The subset built (what Envoy Gateway's
//! generated file and envoyproxy/ratelimit's own mapping use): `mappings`
//! with `match`, `match_type` (`glob`, the default, or `regex`), `name`,
//! `labels`, `match_metric_type` (`counter`, `gauge`, `observer`/`timer`),
//! `timer_type`/`observer_type` (`histogram` or `summary`), `scale`,
//! `buckets` and `histogram_options.buckets`, `help` and `action`
//! (`map`, `drop`); `defaults` with `match_type`, `timer_type`/
//! `observer_type`, `buckets` and `histogram_options.buckets`. Any other
//! key is refused at startup, naming it.
//!
//! The rules are statsd-exporter's (read for behaviour): globs first, in
//! the file's order (a `*` is any run of characters within one
//! dot-separated part, and each is a group), then the regular expressions
//! (unanchored, Go's RE2 syntax), in order; `$1`, `${1}` in the name and
//! the labels stand for the groups; a metric no rule matches keeps its
//! name with every character outside `[a-zA-Z0-9_]` made `_`; counters of
//! one series add up; timers are a summary unless the rule (or the
//! defaults) say histogram, with Prometheus's default buckets unless
//! given. A summary here has its count and sum, without quantiles.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use regex::Regex;
use serde::Deserialize;

/// Prometheus's default histogram buckets (statsd-exporter's default).
pub const DEFAULT_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A statsd metric's type, as a mapping's `match_metric_type` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// `|c`.
    Counter,
    /// `|g`.
    Gauge,
    /// `|ms` (a timer).
    Observer,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistogramOptions {
    #[serde(default)]
    buckets: Option<Vec<f64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    #[serde(default)]
    match_type: Option<String>,
    #[serde(default, alias = "observer_type")]
    timer_type: Option<String>,
    #[serde(default)]
    buckets: Option<Vec<f64>>,
    #[serde(default)]
    histogram_options: Option<HistogramOptions>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleYaml {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    match_type: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    match_metric_type: Option<String>,
    #[serde(default, alias = "observer_type")]
    timer_type: Option<String>,
    #[serde(default)]
    scale: Option<f64>,
    #[serde(default)]
    buckets: Option<Vec<f64>>,
    #[serde(default)]
    histogram_options: Option<HistogramOptions>,
    #[serde(default)]
    help: Option<String>,
    #[serde(default)]
    action: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    mappings: Vec<RuleYaml>,
}

/// What a rule makes of a timer.
#[derive(Debug, Clone, PartialEq)]
enum Observer {
    Histogram(Vec<f64>),
    Summary,
}

#[derive(Debug)]
struct Rule {
    re: Regex,
    metric_type: Option<MetricType>,
    drop: bool,
    name: String,
    labels: Vec<(String, String)>,
    observer: Observer,
    scale: f64,
    help: Option<String>,
}

/// A parsed mapping file.
#[derive(Debug)]
pub struct Mapper {
    globs: Vec<Rule>,
    regexes: Vec<Rule>,
    /// How an unmatched timer is exported.
    default_observer: Observer,
}

/// A metric as the mapping names it.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped<'m> {
    /// The Prometheus name.
    pub name: String,
    /// The labels, sorted by name.
    pub labels: Vec<(String, String)>,
    scale: f64,
    observer: &'m Observer,
    help: Option<&'m str>,
}

fn observer(kind: Option<&str>, buckets: Option<Vec<f64>>, default: &Observer) -> Result<Observer, String> {
    let buckets = buckets.unwrap_or_else(|| match default {
        Observer::Histogram(b) => b.clone(),
        Observer::Summary => DEFAULT_BUCKETS.to_vec(),
    });
    match kind {
        None | Some("") => Ok(match default {
            Observer::Histogram(_) => Observer::Histogram(buckets),
            Observer::Summary => Observer::Summary,
        }),
        Some("histogram") => Ok(Observer::Histogram(buckets)),
        Some("summary") => Ok(Observer::Summary),
        Some(other) => Err(format!("timer_type {other:?}: histogram or summary")),
    }
}

/// statsd-exporter's name for an unmapped metric: every character outside
/// `[a-zA-Z0-9_]` made `_`, and `_` before a leading digit.
pub fn escape_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    out.extend(name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }));
    out
}

impl Mapper {
    /// Parses a mapping file; an error names what is not supported.
    pub fn parse(text: &str) -> Result<Mapper, String> {
        let f: FileYaml = serde_yaml::from_str(text).map_err(|e| format!("not a mapping file this service reads: {e}"))?;
        let default_buckets =
            f.defaults.histogram_options.and_then(|h| h.buckets).or(f.defaults.buckets).unwrap_or(DEFAULT_BUCKETS.to_vec());
        let default_observer = match f.defaults.timer_type.as_deref() {
            None | Some("") | Some("summary") => Observer::Summary,
            Some("histogram") => Observer::Histogram(default_buckets.clone()),
            Some(other) => return Err(format!("defaults: timer_type {other:?}: histogram or summary")),
        };
        let default_match = f.defaults.match_type.unwrap_or_else(|| "glob".into());
        let mut m = Mapper { globs: Vec::new(), regexes: Vec::new(), default_observer };
        for (i, r) in f.mappings.into_iter().enumerate() {
            let at = |e: String| format!("mapping {} ({:?}): {e}", i + 1, r.pattern);
            let glob = match r.match_type.as_deref().unwrap_or(&default_match) {
                "" | "glob" => true,
                "regex" => false,
                other => return Err(at(format!("match_type {other:?}: glob or regex"))),
            };
            let re = if glob {
                let mut p = String::from("^");
                for (j, part) in r.pattern.split('*').enumerate() {
                    if j > 0 {
                        p.push_str("([^.]*)");
                    }
                    p.push_str(&regex::escape(part));
                }
                p.push('$');
                Regex::new(&p)
            } else {
                Regex::new(&r.pattern)
            }
            .map_err(|e| at(e.to_string()))?;
            let metric_type = match r.match_metric_type.as_deref() {
                None | Some("") => None,
                Some("counter") => Some(MetricType::Counter),
                Some("gauge") => Some(MetricType::Gauge),
                Some("observer" | "timer") => Some(MetricType::Observer),
                Some(other) => return Err(at(format!("match_metric_type {other:?}: counter, gauge or observer"))),
            };
            let drop = match r.action.as_deref() {
                None | Some("") | Some("map") => false,
                Some("drop") => true,
                Some(other) => return Err(at(format!("action {other:?}: map or drop"))),
            };
            if !drop && r.name.is_empty() {
                return Err(at("no name".into()));
            }
            let buckets = r.histogram_options.and_then(|h| h.buckets).or(r.buckets);
            let def = match &m.default_observer {
                Observer::Histogram(_) => Observer::Histogram(default_buckets.clone()),
                Observer::Summary => Observer::Summary,
            };
            let rule = Rule {
                re,
                metric_type,
                drop,
                name: r.name,
                labels: r.labels.into_iter().collect(),
                observer: observer(r.timer_type.as_deref(), buckets, &def).map_err(at)?,
                scale: r.scale.unwrap_or(1.0),
                help: r.help,
            };
            if glob {
                m.globs.push(rule);
            } else {
                m.regexes.push(rule);
            }
        }
        Ok(m)
    }

    /// What the mapping makes of `name` of type `t`: `None` when a rule drops it.
    pub fn map(&self, name: &str, t: MetricType) -> Option<Mapped<'_>> {
        for rule in self.globs.iter().chain(&self.regexes) {
            if rule.metric_type.is_some_and(|mt| mt != t) {
                continue;
            }
            let Some(caps) = rule.re.captures(name) else { continue };
            if rule.drop {
                return None;
            }
            let expand = |tmpl: &str| {
                let mut s = String::new();
                caps.expand(tmpl, &mut s);
                s
            };
            let mut labels: Vec<(String, String)> = rule.labels.iter().map(|(k, v)| (k.clone(), expand(v))).collect();
            labels.sort();
            return Some(Mapped {
                name: expand(&rule.name),
                labels,
                scale: rule.scale,
                observer: &rule.observer,
                help: rule.help.as_deref(),
            });
        }
        Some(Mapped {
            name: escape_name(name),
            labels: Vec::new(),
            scale: 1.0,
            observer: &self.default_observer,
            help: None,
        })
    }

    /// The Prometheus text of `counters` (statsd name, cumulative value)
    /// and of the timer `timer` (statsd name, (value, how many) ascending).
    pub fn render(&self, counters: &[(String, u64)], timer: (&str, &[(u64, u64)])) -> String {
        /// One family: its type, help, and samples (series → value) in order.
        struct Family {
            kind: &'static str,
            help: String,
            samples: Vec<(String, f64)>,
        }
        let mut families: BTreeMap<String, Family> = BTreeMap::new();
        let help_of = |m: &Mapped| m.help.unwrap_or("Metric autogenerated by statsd_exporter.").to_owned();
        for (name, v) in counters {
            let Some(m) = self.map(name, MetricType::Counter) else { continue };
            let f = families.entry(m.name.clone()).or_insert_with(|| Family {
                kind: "counter",
                help: help_of(&m),
                samples: Vec::new(),
            });
            if f.kind != "counter" {
                continue; // a name of another type: statsd-exporter drops it too
            }
            let series = format!("{}{}", m.name, labels_text(&m.labels, None));
            match f.samples.iter_mut().find(|(s, _)| *s == series) {
                Some((_, total)) => *total += *v as f64,
                None => f.samples.push((series, *v as f64)),
            }
        }
        let (tname, values) = timer;
        let count: u64 = values.iter().map(|(_, n)| n).sum();
        if let Some(m) = self.map(tname, MetricType::Observer).filter(|_| count > 0) {
            let scaled = |v: u64| v as f64 * m.scale;
            let sum: f64 = values.iter().map(|&(v, n)| scaled(v) * n as f64).sum();
            let mut samples = Vec::new();
            let kind = match m.observer {
                Observer::Histogram(buckets) => {
                    for le in buckets {
                        let c: u64 = values.iter().filter(|&&(v, _)| scaled(v) <= *le).map(|(_, n)| n).sum();
                        let l = labels_text(&m.labels, Some(le.to_string()));
                        samples.push((format!("{}_bucket{l}", m.name), c as f64));
                    }
                    let l = labels_text(&m.labels, Some("+Inf".into()));
                    samples.push((format!("{}_bucket{l}", m.name), count as f64));
                    "histogram"
                }
                Observer::Summary => "summary",
            };
            let l = labels_text(&m.labels, None);
            samples.push((format!("{}_sum{l}", m.name), sum));
            samples.push((format!("{}_count{l}", m.name), count as f64));
            let f =
                families.entry(m.name.clone()).or_insert_with(|| Family { kind, help: help_of(&m), samples: Vec::new() });
            if f.kind == kind {
                f.samples.extend(samples);
            }
        }
        let mut out = String::new();
        for (name, f) in &families {
            let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {}", f.help, f.kind);
            let mut samples: Vec<&(String, f64)> = f.samples.iter().collect();
            if f.kind == "counter" {
                samples.sort_by(|a, b| a.0.cmp(&b.0));
            }
            for (series, v) in samples {
                let _ = writeln!(out, "{series} {v}");
            }
        }
        out
    }
}

/// `{k="v",...}` (labels sorted; `le` last), or nothing without labels.
fn labels_text(labels: &[(String, String)], le: Option<String>) -> String {
    let mut parts: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape_value(v))).collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
