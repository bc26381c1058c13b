//! The differential test of issue 31: one scripted sequence through the
//! Rust, Python and Node libraries against one server (each on keys of its
//! own, the three calls of a step back to back), with equal decisions and
//! equal header sets and 429 bodies. The Python and Node libraries run as subprocesses
//! (tests/diff/worker.py with the repo's .venv, tests/diff/worker.mjs with
//! clients/node's node_modules), one JSON line per request.
use rl_test_support as common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use common::Server;
use redis_ratelimit_client::*;
use serde_json::{json, Value as J};

const HOUR: u64 = 3_600_000;
const STEPS: usize = 400;
/// A problem body's instance, with characters JSON must escape.
const INSTANCE: &str = "/v1/\"q\"\\\n\u{1}é";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Worker {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(name: &'static str, program: PathBuf, script: &str, url: &str) -> Worker {
        let mut child = Command::new(&program)
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/diff").join(script))
            .arg(url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} worker ({}): {e}", program.display()));
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Worker { name, child, stdin, stdout }
    }

    fn ask(&mut self, q: &J) -> J {
        writeln!(self.stdin, "{q}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{} worker answered {line:?}: {e}", self.name))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rules() -> Vec<(&'static str, Rule)> {
    let a = token_bucket("a", 3, 1, HOUR).unwrap();
    let b = sliding_log("b", 10, HOUR).unwrap().weighted(2).unwrap();
    let (f, t) = (fixed_window("f", 6, 1 << 40, false).unwrap(), token_bucket("t", 4, 1, HOUR).unwrap());
    vec![
        ("tb", token_bucket("tb", 5, 1, HOUR).unwrap().into()),
        ("log", sliding_log("log", 4, HOUR).unwrap().into()),
        // the windows aligned to the epoch are 2^40 ms long (the current one
        // ends in 2039): no boundary between the three libraries' calls of a
        // step (an hour's counter could turn between them)
        ("ctr", sliding_counter("ctr", 6, 1 << 40).unwrap().into()),
        ("all", all_of(vec![a, b], Some("all")).unwrap().into()),
        // FROMFIRST, and aligned to the epoch on windows of 2^40 ms
        ("fw", fixed_window("fw", 4, HOUR, true).unwrap().into()),
        ("allfw", all_of(vec![f, t], Some("allfw")).unwrap().into()),
    ]
}

fn to_json(d: &Decision) -> J {
    let parts: Vec<J> = d
        .parts
        .iter()
        .map(|p| json!([p.policy, p.granted, p.limit, p.remaining, p.retry_after_ms, p.reset_after_ms]))
        .collect();
    json!({"allowed": d.allowed, "granted": d.granted, "limit": d.limit, "remaining": d.remaining,
           "retry_after_ms": d.retry_after_ms, "reset_after_ms": d.reset_after_ms, "policy": d.policy,
           "binding": d.binding, "source": d.source.as_str(), "parts": parts})
}

fn from_json(x: &J, rule: &Arc<Rule>) -> Decision {
    let u = |k: &str| x[k].as_u64().unwrap();
    let source = match x["source"].as_str().unwrap() {
        "module" => Source::Module,
        "lua" => Source::Lua,
        "local" => Source::Local,
        _ => Source::Panic,
    };
    let parts = x["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Part {
            policy: p[0].as_str().unwrap().into(),
            granted: p[1].as_u64().unwrap(),
            limit: p[2].as_u64().unwrap(),
            remaining: p[3].as_u64().unwrap(),
            retry_after_ms: p[4].as_i64().unwrap(),
            reset_after_ms: p[5].as_u64().unwrap(),
        })
        .collect();
    Decision {
        allowed: x["allowed"].as_bool().unwrap(),
        granted: u("granted"),
        limit: u("limit"),
        remaining: u("remaining"),
        retry_after_ms: x["retry_after_ms"].as_i64().unwrap(),
        reset_after_ms: u("reset_after_ms"),
        policy: x["policy"].as_str().unwrap().into(),
        binding: x["binding"].as_str().unwrap().into(),
        source,
        parts,
        rule: rule.clone(),
    }
}

fn header_list(h: &J) -> Vec<(String, String)> {
    h.as_array().unwrap().iter().map(|kv| (kv[0].as_str().unwrap().to_owned(), kv[1].as_str().unwrap().to_owned())).collect()
}

fn ours(d: &Decision) -> Vec<(String, String)> {
    headers(d).into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// A part's units: policy, granted, limit, remaining.
type PartUnits = (String, u64, u64, u64);
/// A decision's units and names: everything but the times.
type Units<'a> = (bool, u64, u64, u64, &'a str, &'a str, Source, Vec<PartUnits>);

/// Everything but the times, which moved between the three calls.
fn units(d: &Decision) -> Units<'_> {
    let parts = d.parts.iter().map(|p| (p.policy.clone(), p.granted, p.limit, p.remaining)).collect();
    (d.allowed, d.granted, d.limit, d.remaining, &d.policy, &d.binding, d.source, parts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_python_and_node_agree_on_decisions_and_headers() {
    let s = Server::start(true);
    let python = std::env::var_os("RL_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo().join(".venv/bin/python"));
    let mut py = Worker::start("python", python, "worker.py", &s.url());
    let mut js = Worker::start("node", PathBuf::from("node"), "worker.mjs", &s.url());
    let rl = RateLimit::new(s.manager().await, Options { timeout_ms: 2000, ..Options::default() }).unwrap();
    let rules = rules();
    let lims: Vec<_> = rules.iter().map(|(_, r)| rl.limiter(r.clone(), Panic::default()).unwrap()).collect();
    let arcs: Vec<Arc<Rule>> = rules.iter().map(|(_, r)| Arc::new(r.clone())).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let (mut denied, mut partial, mut retries, mut refunds) = (0, 0, 0, 0);
    let mut worst = 0i64;
    for step in 0..STEPS {
        let r = next(rules.len() as u64) as usize;
        let (name, rule) = (&rules[r].0, &arcs[r]);
        let tag = next(3);
        let key = |lib: &str| {
            let base = format!("rl:{{{lib}{tag}}}");
            if name.starts_with("all") {
                base
            } else {
                format!("{base}:{name}")
            }
        };
        let refund = next(6) == 0;
        let call = Call { cost: next(4), partial: next(3) == 0, dry_run: next(8) == 0, ..Call::default() };
        let n = 1 + next(2);
        let q = |lib: &str| {
            if refund {
                json!({"op": "refund", "rule": name, "key": key(lib), "n": n})
            } else {
                json!({"op": "limit", "rule": name, "key": key(lib), "cost": call.cost,
                       "partial": call.partial, "dry_run": call.dry_run})
            }
        };
        let t0 = Instant::now();
        let d = if refund { lims[r].refund(&key("rs"), n).await } else { lims[r].limit(&key("rs"), call).await }.unwrap();
        let a = py.ask(&q("py"));
        let b = js.ask(&q("js"));
        // the keys' earlier writes were as far apart as the slowest step: twice it
        worst = worst.max(t0.elapsed().as_millis() as i64);
        let tol = 2 * worst + 2;
        for (w, ans) in [("python", &a), ("node", &b)] {
            let theirs = from_json(&ans["decision"], rule);
            assert_eq!(units(&d), units(&theirs), "step {step} {name} {q:?}: rust vs {w}", q = q(w));
            assert!((d.retry_after_ms - theirs.retry_after_ms).abs() <= tol, "step {step}: {d:?} vs {w} {theirs:?}");
            assert!(
                (d.reset_after_ms as i64 - theirs.reset_after_ms as i64).abs() <= tol,
                "step {step}: {d:?} vs {w} {theirs:?}"
            );
            for (p, t) in d.parts.iter().zip(&theirs.parts) {
                assert!(
                    (p.retry_after_ms - t.retry_after_ms).abs() <= tol
                        && p.reset_after_ms.abs_diff(t.reset_after_ms) as i64 <= tol
                );
            }
            // their headers of their decision are ours of that decision ...
            assert_eq!(header_list(&ans["headers"]), ours(&theirs), "step {step}: {w}'s own headers");
        }
        // ... and their headers of our decision are ours, field by field
        let mine = ours(&d);
        let body: J = serde_json::from_str(&problem(&d, Some(INSTANCE)).to_json()).unwrap();
        for w in [&mut py, &mut js] {
            let h = w.ask(&json!({"op": "headers", "rule": name, "decision": to_json(&d), "instance": INSTANCE}));
            assert_eq!(header_list(&h["headers"]), mine, "step {step}: {}'s headers of the Rust decision", w.name);
            // the body of a 429: for denials (Python and Node name no policy
            // differently for an allowed all_of decision, which gets no body)
            if !d.allowed {
                assert_eq!(h["problem"], body, "step {step}: {}'s 429 body of the Rust decision {d:?}", w.name);
            }
        }
        denied += usize::from(!d.allowed);
        partial += usize::from(call.partial && !refund && d.granted > 0 && d.granted < call.cost);
        retries += usize::from(mine.iter().any(|(k, _)| k == "Retry-After"));
        refunds += usize::from(refund && d.granted > 0);
    }
    println!("{STEPS} steps: {denied} denied, {partial} partial grants, {retries} with Retry-After, {refunds} refunds");
    // the sequence reached every kind of answer
    assert!(denied > 20 && partial > 5 && retries > 20 && refunds > 10);
    assert_eq!(rl.metrics().decisions_module as usize + rl.metrics().refunds as usize, STEPS);
}
