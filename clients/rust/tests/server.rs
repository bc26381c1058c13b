//! The client against real servers (REDIS_SERVER, RL_MODULE): decisions
//! equal to the module's own replies, the Lua twins without the module,
//! NOSCRIPT recovery, the cross-slot refusal before any call.
use rl_test_support as common;

use common::Server;
use redis::Value;
use redis_ratelimit_client::*;

fn rl<C: Connection>(c: C, backend: Backend) -> RateLimit<C> {
    // a generous bound: these tests are about values, not time
    RateLimit::new(c, Options { timeout_ms: 2000, backend, ..Options::default() }).unwrap()
}

fn ints(v: &Value) -> Vec<i64> {
    let Value::Array(a) = v else { panic!("{v:?}") };
    a.iter().map(|x| if let Value::Int(i) = x { *i } else { panic!("{x:?}") }).collect()
}

fn policies() -> Vec<Policy> {
    vec![
        token_bucket("tb", 5, 1, 60_000).unwrap(),
        sliding_log("log", 4, 60_000).unwrap(),
        // aligned to the epoch: 2^40 ms, so no boundary falls between the
        // module's call and the Lua twin's (a minute's could)
        sliding_counter("ctr", 6, 1 << 40).unwrap(),
    ]
}

/// `policies()` and two fixed windows: aligned to the epoch on windows of
/// 2^40 ms (no boundary falls between a test's calls), and `FROMFIRST`.
fn with_fixed_windows() -> Vec<Policy> {
    let mut v = policies();
    v.push(fixed_window("fw", 5, 1 << 40, false).unwrap());
    v.push(fixed_window("ff", 4, 60_000, true).unwrap().weighted(2).unwrap());
    v
}

/// A small deterministic sequence of (cost, partial, dry_run).
fn calls(n: usize) -> Vec<Call> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Call { cost: x % 4, partial: x & 16 != 0, dry_run: x.is_multiple_of(11), ..Call::default() }
        })
        .collect()
}

fn raw_args(c: Call) -> Vec<String> {
    let mut v = vec![];
    if c.cost != 1 {
        v.extend(["COST".to_string(), c.cost.to_string()]);
    }
    if c.partial {
        v.push("PARTIAL".into());
    }
    if c.dry_run {
        v.push("DRYRUN".into());
    }
    v
}

#[tokio::test]
async fn decisions_are_the_modules_replies() {
    let s = Server::start(true);
    let r = rl(s.manager().await, Backend::Auto);
    assert_eq!(r.detect().await.unwrap(), Source::Module);
    let mut raw = s.multiplexed().await;
    for p in policies() {
        let lim = r.limiter(p.clone(), Panic::default()).unwrap();
        for c in calls(40) {
            let d = lim.limit(&format!("rl:{{a}}:{}", p.name()), c).await.unwrap();
            let reply: Value = redis::cmd(p.kind().command())
                .arg(format!("rl:{{b}}:{}", p.name()))
                .arg(p.params())
                .arg(raw_args(c))
                .query_async(&mut raw)
                .await
                .unwrap();
            let e = ints(&reply);
            let granted = if c.partial {
                e[0] as u64
            } else if e[0] == 1 {
                c.cost
            } else {
                0
            };
            assert_eq!(d.source, Source::Module);
            assert_eq!((d.granted, d.allowed), (granted, granted == c.cost), "{p:?} {c:?}");
            assert_eq!((d.limit, d.remaining), (e[1] as u64, e[2] as u64), "{p:?} {c:?}");
            // the two keys were written ms apart: times agree within that
            assert!((d.retry_after_ms - e[3]).abs() <= 50, "{d:?} {e:?}");
            assert!((d.reset_after_ms as i64 - e[4]).abs() <= 50, "{d:?} {e:?}");
            assert_eq!(d.policy, p.name());
        }
    }
    let m = r.metrics();
    assert_eq!(m.decisions_module, 120);
    assert_eq!(m.calls, 121); // one COMMAND INFO, one call per decision
}

#[tokio::test]
async fn all_of_is_rl_multi_and_cross_slot_is_refused_before_any_call() {
    let s = Server::start(true);
    let r = rl(s.manager().await, Backend::Auto);
    let api = token_bucket("api", 3, 1, 60_000).unwrap();
    let day = sliding_log("day", 10, 86_400_000).unwrap().weighted(2).unwrap();
    let lim = r.limiter(all_of(vec![api, day], None).unwrap(), Panic::default()).unwrap();
    let e = lim.limit_keys(&["rl:{a}:x", "rl:{b}:x"], Call::default()).await.unwrap_err();
    assert!(matches!(e, Error::CrossSlot(_)), "{e}");
    assert!(lim.limit("no-tag", Call::default()).await.is_err()); // no:tag:api / :day differ in slot
    assert_eq!(r.metrics().calls, 0);
    let mut got = vec![];
    for _ in 0..6 {
        got.push(lim.limit("rl:{t}", Call::default()).await.unwrap());
    }
    // api allows 3; day (weight 2) allows 5: api binds, then denies
    assert_eq!(got.iter().filter(|d| d.allowed).count(), 3);
    let d = &got[0];
    assert_eq!((d.policy.as_str(), d.binding.as_str(), d.parts.len()), ("api.day", "api", 2));
    assert_eq!((d.parts[1].granted, d.parts[1].remaining), (2, 8));
    let last = got.last().unwrap();
    assert!(!last.allowed && last.retry_after_ms > 0 && last.binding == "api");
    let mut c = s.sync();
    let v: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(v.contains(&"rl:{t}:api".to_string()) && v.contains(&"rl:{t}:day".to_string()), "{v:?}");
}

#[tokio::test]
async fn lua_twins_without_the_module_and_noscript_recovery() {
    let s = Server::start(false);
    let r = rl(s.multiplexed().await, Backend::Auto);
    assert_eq!(r.detect().await.unwrap(), Source::Lua);
    let forced = rl(s.multiplexed().await, Backend::Module);
    assert!(matches!(forced.detect().await, Err(Error::Unsupported(_))));
    let lim = r.limiter(token_bucket("tb", 3, 1, 60_000).unwrap(), Panic::default()).unwrap();
    let mut allowed = vec![];
    for _ in 0..4 {
        let d = lim.limit("k", Call::default()).await.unwrap();
        assert_eq!(d.source, Source::Lua);
        allowed.push(d.allowed);
    }
    assert_eq!(allowed, [true, true, true, false]);
    let mut c = s.sync();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut c).unwrap();
    let d = lim.refund("k", 2).await.unwrap();
    assert_eq!((d.granted, d.remaining, d.source), (2, 2, Source::Lua));
    let m = r.metrics();
    assert_eq!((m.failures, m.refunds, m.refund_tokens), (0, 1, 2));
    // all_of on the Lua twin (multi.lua)
    let both = all_of(vec![token_bucket("a", 2, 1, 60_000).unwrap(), sliding_counter("b", 9, 60_000).unwrap()], None);
    let lim = r.limiter(both.unwrap(), Panic::default()).unwrap();
    let d = lim.limit("rl:{u}", Call::cost(2)).await.unwrap();
    assert!(d.allowed && d.source == Source::Lua && d.binding == "a" && d.remaining == 0);
}

#[tokio::test]
async fn module_and_lua_give_the_same_decisions() {
    let s = Server::start(true);
    let m = rl(s.manager().await, Backend::Module);
    let l = rl(s.manager().await, Backend::Lua);
    let mut rules: Vec<Rule> = with_fixed_windows().into_iter().map(Rule::from).collect();
    rules.push(all_of(policies(), Some("all")).unwrap().into());
    rules.push(all_of(with_fixed_windows(), Some("allfw")).unwrap().into());
    for rule in rules {
        let lm = m.limiter(rule.clone(), Panic::default()).unwrap();
        let ll = l.limiter(rule.clone(), Panic::default()).unwrap();
        let (km, kl) = (format!("rl:{{m}}:{}", rule.name()), format!("rl:{{l}}:{}", rule.name()));
        for (i, c) in calls(30).into_iter().enumerate() {
            let (a, b) = if i % 7 == 6 {
                (lm.refund(&km, 1).await.unwrap(), ll.refund(&kl, 1).await.unwrap())
            } else {
                (lm.limit(&km, c).await.unwrap(), ll.limit(&kl, c).await.unwrap())
            };
            assert_eq!((a.source, b.source), (Source::Module, Source::Lua));
            assert_eq!(
                (a.allowed, a.granted, a.limit, a.remaining),
                (b.allowed, b.granted, b.limit, b.remaining),
                "{rule:?} {c:?}"
            );
            assert_eq!(a.binding, b.binding);
            assert!((a.retry_after_ms - b.retry_after_ms).abs() <= 50 && a.reset_after_ms.abs_diff(b.reset_after_ms) <= 50);
            assert_eq!(a.parts.len(), b.parts.len());
        }
    }
}

#[tokio::test]
async fn refused_arguments_are_errors_not_outages() {
    let s = Server::start(true);
    let r = rl(s.manager().await, Backend::Auto);
    let mut c = s.sync();
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut c).unwrap();
    let lim = r.limiter(token_bucket("tb", 3, 1, 1000).unwrap(), Panic::default()).unwrap();
    let e = lim.limit("str", Call::default()).await.unwrap_err();
    assert!(matches!(e, Error::Reply(ref m) if m.contains("WRONGTYPE")), "{e}");
    assert_eq!(r.metrics().failures, 0);
    assert!(matches!(lim.limit("k", Call::cost(MAX + 1)).await, Err(Error::Invalid(_))));
}

#[tokio::test]
async fn fixed_windows_are_rl_fixedwindow_and_run_on_the_lua_twin() {
    let s = Server::start(true);
    let r = rl(s.manager().await, Backend::Auto);
    let mut raw = s.multiplexed().await;
    for from_first in [false, true] {
        // aligned to the epoch (from_first false) on 2^40 ms: no boundary
        // between the client's call and the raw command's
        let w = if from_first { 60_000 } else { 1 << 40 };
        let p = fixed_window("fw", 5, w, from_first).unwrap();
        let lim = r.limiter(p.clone(), Panic::default()).unwrap();
        let (ka, kb) = (format!("fw:a:{from_first}"), format!("fw:b:{from_first}"));
        for c in calls(30) {
            let d = lim.limit(&ka, c).await.unwrap();
            let mut cmd = redis::cmd("RL.FIXEDWINDOW");
            cmd.arg(&kb).arg(p.params()).arg(raw_args(c));
            if from_first {
                cmd.arg("FROMFIRST");
            }
            let e = ints(&cmd.query_async::<Value>(&mut raw).await.unwrap());
            let granted = if c.partial {
                e[0] as u64
            } else if e[0] == 1 {
                c.cost
            } else {
                0
            };
            assert_eq!((d.granted, d.limit, d.remaining, d.source), (granted, 5, e[2] as u64, Source::Module), "{c:?}");
            assert!((d.retry_after_ms - e[3]).abs() <= 50 && (d.reset_after_ms as i64 - e[4]).abs() <= 50, "{d:?} {e:?}");
        }
        let d = lim.refund(&ka, 1).await.unwrap();
        assert!(d.granted <= 1 && d.source == Source::Module);
        // FROMFIRST keys start their window at the first grant: a key whose
        // TTL is the full window right after its first grant, less the
        // time the grant and the PTTL took (however slow the machine)
        let mut c = s.sync();
        let t0 = std::time::Instant::now();
        let _ = lim.limit("fw:ttl", Call::default()).await.unwrap();
        let ttl: i64 = redis::cmd("PTTL").arg("fw:ttl").query(&mut c).unwrap();
        let took = t0.elapsed().as_millis() as i64;
        if from_first {
            assert!(ttl >= 60_000 - took - 1 && ttl <= 60_000, "{ttl} ({took} ms)");
        }
        let _: () = redis::cmd("DEL").arg("fw:ttl").query(&mut c).unwrap();
    }
    // without the module: lua/fixedwindow.lua, alone and in all_of (multi.lua)
    let lua_only = Server::start(false);
    let l = rl(lua_only.manager().await, Backend::Auto);
    let lim = l.limiter(fixed_window("fw", 3, 60_000, true).unwrap(), Panic::default()).unwrap();
    let mut got = vec![];
    let t0 = std::time::Instant::now();
    for _ in 0..4 {
        let d = lim.limit("k", Call::default()).await.unwrap();
        assert_eq!(d.source, Source::Lua);
        got.push((d.allowed, d.remaining));
    }
    assert_eq!(got, [(true, 2), (true, 1), (true, 0), (false, 0)]);
    let mut c = lua_only.sync();
    let ttl: i64 = redis::cmd("PTTL").arg("k").query(&mut c).unwrap();
    let took = t0.elapsed().as_millis() as i64;
    assert!(ttl >= 60_000 - took - 1 && ttl <= 60_000, "{ttl} ({took} ms)");
    let both = all_of(vec![fixed_window("f", 1, 1 << 40, false).unwrap(), sliding_log("s", 5, 60_000).unwrap()], None);
    let lim = l.limiter(both.unwrap(), Panic::default()).unwrap();
    let (a, b) = (lim.limit("rl:{u}", Call::default()).await.unwrap(), lim.limit("rl:{u}", Call::default()).await.unwrap());
    assert!(a.allowed && !b.allowed && b.binding == "f" && b.source == Source::Lua, "{b:?}");
    // the denial took nothing from the sliding log
    assert_eq!(b.parts[1].remaining, 4);
    assert_eq!(l.metrics().failures, 0);
}
