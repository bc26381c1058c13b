//! The rules file: the same format, checks and messages as the Python and
//! Node gateways (examples/README.md, "Rules file"), re-read when it changes.

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use redis_ratelimit_client::{sliding_counter, sliding_log, token_bucket, Policy, MAX};
use serde_json::{json, Value};

use crate::{log, Stats};

const ALGORITHMS: [&str; 3] = ["tokenbucket", "slidinglog", "slidingcounter"];

/// One route of the rules file.
pub struct Route {
    pub name: String,
    match_: String,
    methods: Option<Vec<String>>,
    algorithm: String,
    pub policy: Policy,
    pub cost: u64,
    /// What makes two versions of a route the same limiter (with the
    /// policy's numbers and the instances).
    pub signature: String,
}

fn valid_name(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

impl Route {
    fn parse(d: &Value) -> Result<Route, String> {
        let d = d.as_object().ok_or("each route must be an object")?;
        let shown = d.get("name").map(|v| v.to_string()).unwrap_or_else(|| "None".into());
        let integer = |field: &str| -> Result<u64, String> {
            match d.get(field).and_then(Value::as_u64) {
                Some(v) if (1..=MAX).contains(&v) => Ok(v),
                _ => Err(format!("route {shown}: {field} must be an integer from 1 to 2^53-1")),
            }
        };
        let name = match d.get("name").and_then(Value::as_str) {
            Some(n) if valid_name(n) => n.to_owned(),
            _ => return Err(format!("route name {shown}: 1-64 of A-Z a-z 0-9 . _ -")),
        };
        let match_ = match d.get("match").and_then(Value::as_str) {
            Some(m) if m.starts_with('/') => m.to_owned(),
            _ => return Err(format!("route {shown}: match must be a path starting with /")),
        };
        let methods = match d.get("methods") {
            None => None,
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
                Some(a.iter().filter_map(Value::as_str).map(str::to_uppercase).collect())
            }
            Some(_) => return Err(format!("route {shown}: methods must be a list of strings")),
        };
        let algorithm = match d.get("algorithm").and_then(Value::as_str) {
            Some(a) if ALGORITHMS.contains(&a) => a.to_owned(),
            _ => return Err(format!("route {shown}: algorithm must be one of {ALGORITHMS:?}")),
        };
        let policy = match algorithm.as_str() {
            "tokenbucket" => token_bucket(&name, integer("capacity")?, integer("rate")?, integer("period_ms")?),
            "slidinglog" => sliding_log(&name, integer("limit")?, integer("window_ms")?),
            _ => sliding_counter(&name, integer("limit")?, integer("window_ms")?),
        }
        .map_err(|e| format!("route {shown}: {e}"))?;
        let cost = if d.contains_key("cost") { integer("cost")? } else { 1 };
        if cost > policy.limit() {
            return Err(format!("route {shown}: cost is above the limit"));
        }
        let signature = format!("{name}/{algorithm}");
        Ok(Route { name, match_, methods, algorithm, policy, cost, signature })
    }

    fn fits(&self, method: &str, path: &str) -> bool {
        if let Some(ms) = &self.methods {
            if !ms.iter().any(|m| m == method) {
                return false;
            }
        }
        let m = &self.match_;
        path == m || (if m.ends_with('/') { path.starts_with(m.as_str()) } else { path.starts_with(&format!("{m}/")) })
    }

    pub fn describe(&self) -> Value {
        json!({"name": self.name, "match": self.match_, "algorithm": self.algorithm,
               "limit": self.policy.limit(), "window_ms": self.policy.window_ms(), "cost": self.cost})
    }
}

/// One version of the rules file.
pub struct Rules {
    pub instances: u64,
    pub routes: Vec<Route>,
}

impl Rules {
    pub fn parse(doc: &Value) -> Result<Rules, String> {
        let routes = match doc.as_object().and_then(|o| o.get("routes")) {
            Some(Value::Array(a)) => a,
            _ => return Err("the rules file must be an object with a \"routes\" list".into()),
        };
        let instances = match doc.get("instances") {
            None => 1,
            Some(v) => match v.as_u64() {
                Some(n) if (1..=10_000).contains(&n) => n,
                _ => return Err("instances must be an integer from 1 to 10000".into()),
            },
        };
        let routes = routes.iter().map(Route::parse).collect::<Result<Vec<_>, _>>()?;
        for (i, r) in routes.iter().enumerate() {
            if routes[..i].iter().any(|o| o.name == r.name) {
                return Err("route names must be unique".into());
            }
        }
        Ok(Rules { instances, routes })
    }

    pub fn route_for(&self, method: &str, path: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.fits(method, path))
    }
}

type Sig = (i64, i64, u64, u64);

/// The current rules; `watch` re-reads the file when it changes.
pub struct RulesFile {
    path: String,
    stats: Arc<Stats>,
    current: RwLock<Arc<Rules>>,
    /// (the loaded version, the last bad version): each is read once
    sigs: Mutex<(Option<Sig>, Option<Sig>)>,
}

fn signature(path: &str) -> std::io::Result<Sig> {
    let m = std::fs::metadata(path)?;
    Ok((m.mtime(), m.mtime_nsec(), m.size(), m.ino()))
}

fn load(path: &str) -> Result<Rules, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Rules::parse(&doc)
}

impl RulesFile {
    /// The first version; an error if it cannot be read or is invalid.
    pub fn open(path: String, stats: Arc<Stats>) -> Result<Arc<RulesFile>, String> {
        let sig = signature(&path).map_err(|e| e.to_string())?;
        let rules = load(&path)?;
        stats.rules_loads.fetch_add(1, Relaxed);
        log_loaded(&rules);
        Ok(Arc::new(RulesFile { path, stats, current: RwLock::new(Arc::new(rules)), sigs: Mutex::new((Some(sig), None)) }))
    }

    pub fn current(&self) -> Arc<Rules> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn reload(&self) {
        let Ok(sig) = signature(&self.path) else { return }; // missing for a moment: keep the rules
        let mut sigs = self.sigs.lock().unwrap_or_else(|e| e.into_inner());
        if sigs.0 == Some(sig) || sigs.1 == Some(sig) {
            return;
        }
        match std::fs::read_to_string(&self.path) {
            Err(_) => {} // a file-system error: try again at the next poll
            Ok(text) => match serde_json::from_str::<Value>(&text).map_err(|e| e.to_string()).and_then(|d| Rules::parse(&d))
            {
                Ok(rules) => {
                    sigs.0 = Some(sig);
                    log_loaded(&rules);
                    *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rules);
                    self.stats.rules_loads.fetch_add(1, Relaxed);
                }
                Err(e) => {
                    sigs.1 = Some(sig); // report each bad version once
                    self.stats.rules_errors.fetch_add(1, Relaxed);
                    log(&format!("rules file {} ignored, keeping the previous rules: {e}", self.path));
                }
            },
        }
    }

    /// Polls the file every `every`.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            self.reload();
        }
    }
}

fn log_loaded(r: &Rules) {
    let names: Vec<&str> = r.routes.iter().map(|r| r.name.as_str()).collect();
    log(&format!("rules loaded: {} (instances {})", names.join(", "), r.instances));
}
