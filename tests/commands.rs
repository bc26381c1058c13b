//! The contract of SPEC.md against a real redis-server with the module: one
//! suite, run for each of the three commands where the behaviour is shared.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn exists(con: &mut Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(con).expect("exists") == 1
}

fn pttl(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).expect("pttl")
}

fn dirty(con: &mut Connection) -> i64 {
    info_field(con, "persistence", "rdb_changes_since_last_save").expect("field").parse().expect("int")
}

#[test]
fn fresh_key_draining_and_cost_above_limit() {
    let s = Server::start();
    let mut con = s.con();
    for a in ALGOS {
        let k = format!("fresh:{}", a.name());
        assert_eq!(a.call(&mut con, &k, 3, FOREVER_MS, &[])[..3], [1, 3, 2], "{a:?}");
        assert_eq!(a.call(&mut con, &k, 3, FOREVER_MS, &["COST", "2"])[..4], [1, 3, 0, 0], "{a:?}");
        let r = a.call(&mut con, &k, 3, FOREVER_MS, &[]);
        assert_eq!(r[..3], [0, 3, 0], "{a:?}: denied once drained");
        assert!(r[3] > 0 && r[4] >= r[3], "{a:?}: retry {} and reset {} are in the future", r[3], r[4]);
        // COST above the limit can never be granted: retry -1.
        let r = a.call(&mut con, &format!("big:{}", a.name()), 3, 1000, &["COST", "4"]);
        assert_eq!(r, [0, 3, 3, -1, 0], "{a:?}");
        assert!(!exists(&mut con, &format!("big:{}", a.name())));
    }
}

#[test]
fn token_bucket_reply_values() {
    let s = Server::start();
    let mut con = s.con();
    let tb = Algo::TokenBucket;
    // capacity 10, 1 token per second.
    let r: Vec<i64> = redis::cmd("RL.TOKENBUCKET").arg(&["k", "10", "1", "1000"]).query(&mut con).unwrap();
    assert_eq!(r, [1, 10, 9, 0, 1000]);
    assert_eq!(tb.call(&mut con, "k2", 10, 10_000, &["COST", "10"]), [1, 10, 0, 0, 10_000]);
    // PARTIAL on an empty bucket; cost above capacity with PARTIAL.
    let r: Vec<i64> = redis::cmd("RL.TOKENBUCKET").arg(&["p", "5", "1", "3600000", "COST", "3"]).query(&mut con).unwrap();
    assert_eq!(r[..3], [1, 5, 2]);
    let r: Vec<i64> = redis::cmd("RL.TOKENBUCKET").arg(&["p", "5", "1", "3600000", "COST", "4", "PARTIAL"]).query(&mut con).unwrap();
    assert_eq!(r[..3], [2, 5, 0], "PARTIAL grants the 2 that are there");
    assert!(r[3] > 3 * 3_600_000 && r[3] <= 4 * 3_600_000, "retry for 4 tokens: {}", r[3]);
    assert!(r[4] > 4 * 3_600_000 && r[4] <= 5 * 3_600_000, "reset: {}", r[4]);
}

/// A refill after a known wait: the tokens regained lie between what the
/// shortest and the longest possible server-side elapsed time give.
#[test]
fn token_bucket_refills_after_a_wait() {
    let s = Server::start();
    let mut con = s.con();
    let args = ["r", "1000", "1", "10"]; // one token per 10 ms
    let t0 = Instant::now();
    let r: Vec<i64> = redis::cmd("RL.TOKENBUCKET").arg(&args).arg(&["COST", "1000"]).query(&mut con).unwrap();
    let t1 = Instant::now();
    assert_eq!(r[..3], [1, 1000, 0]);
    std::thread::sleep(Duration::from_millis(200));
    let t2 = Instant::now();
    let r: Vec<i64> = redis::cmd("RL.TOKENBUCKET").arg(&args).arg(&["COST", "0"]).query(&mut con).unwrap();
    let t3 = Instant::now();
    let min = (t2 - t1).as_millis() as i64 / 10;
    let max = (t3 - t0).as_millis() as i64 / 10 + 1;
    assert!(r[2] >= min && r[2] <= max, "remaining {} not in [{min}, {max}]", r[2]);
}

#[test]
fn dryrun_and_partial_for_every_command() {
    let s = Server::start();
    let mut con = s.con();
    for a in ALGOS {
        let k = format!("dp:{}", a.name());
        let r = a.call(&mut con, &k, 5, FOREVER_MS, &["DRYRUN", "COST", "2"]);
        assert_eq!(r[..4], [1, 5, 3, 0], "{a:?}: DRYRUN answers as the call would");
        assert!(!exists(&mut con, &k), "{a:?}: DRYRUN created the key");
        a.call(&mut con, &k, 5, FOREVER_MS, &["COST", "4"]);
        let r = a.call(&mut con, &k, 5, FOREVER_MS, &["partial", "cost", "3"]);
        assert_eq!(r[..3], [1, 5, 0], "{a:?}: PARTIAL grants the one unit left");
        assert!(r[3] > 0, "{a:?}");
        let r = a.call(&mut con, &k, 5, FOREVER_MS, &["PARTIAL"]);
        assert_eq!(r[..3], [0, 5, 0], "{a:?}: nothing left");
    }
}

/// 50 connections × 100 concurrent calls against a limit of 100 with no
/// refill during the test: exactly 100 granted.
#[test]
fn concurrent_calls_grant_exactly_the_limit() {
    let s = Server::start();
    for a in ALGOS {
        let key = format!("conc:{}", a.name());
        let handles: Vec<_> = (0..50)
            .map(|_| {
                let mut con = s.con();
                let key = key.clone();
                std::thread::spawn(move || {
                    let mut pipe = redis::pipe();
                    for _ in 0..100 {
                        pipe.add_command(a.cmd(&key, 100, FOREVER_MS, &[]));
                    }
                    let replies: Vec<Vec<i64>> = pipe.query(&mut con).expect("pipeline");
                    replies.iter().map(|r| r[0]).sum::<i64>()
                })
            })
            .collect();
        let granted: i64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
        assert_eq!(granted, 100, "{a:?}");
    }
}

/// Denied, DRYRUN and COST 0 calls write nothing: no key, no TTL change, no
/// change counted for RDB snapshots.
#[test]
fn calls_that_grant_nothing_write_nothing() {
    let s = Server::start();
    let mut con = s.con();
    for a in ALGOS {
        let k = format!("nw:{}", a.name());
        let before = dirty(&mut con);
        a.call(&mut con, &k, 5, 1000, &["DRYRUN"]);
        a.call(&mut con, &k, 5, 1000, &["COST", "0"]);
        a.call(&mut con, &k, 5, 1000, &["COST", "6"]);
        a.call(&mut con, &k, 5, 1000, &["COST", "6", "DRYRUN", "PARTIAL"]);
        assert!(!exists(&mut con, &k), "{a:?}: key created");
        assert_eq!(dirty(&mut con), before, "{a:?}: counted as a change");

        a.call(&mut con, &k, 2, FOREVER_MS, &["COST", "2"]);
        assert_eq!(dirty(&mut con), before + 1, "{a:?}: a grant is one change");
        let digest0 = digest(&mut con, &k);
        let exp0 = pexpiretime(&mut con, &k);
        for opts in [&["DRYRUN"][..], &["COST", "0"], &[], &["PARTIAL"], &["COST", "1", "DRYRUN"]] {
            let r = a.call(&mut con, &k, 2, FOREVER_MS, opts);
            assert_eq!(r[0], if opts == ["COST", "0"] { 1 } else { 0 }, "{a:?} {opts:?}");
        }
        assert_eq!(digest(&mut con, &k), digest0, "{a:?}: state changed");
        assert_eq!(pexpiretime(&mut con, &k), exp0, "{a:?}: TTL touched");
        assert_eq!(dirty(&mut con), before + 1, "{a:?}: denied calls counted as changes");
    }
}

/// After a write the TTL is reset_after_ms; the key disappears when the
/// limiter is fresh again, and not before.
#[test]
fn ttl_equals_reset_and_key_expires_when_fresh() {
    let s = Server::start();
    let mut con = s.con();
    for a in ALGOS {
        let k = format!("ttl:{}", a.name());
        let t0 = Instant::now();
        let r = a.call(&mut con, &k, 10, 300, &["COST", "3"]);
        let ttl = pttl(&mut con, &k);
        let waited = t0.elapsed().as_millis() as i64;
        assert!(r[4] > 0);
        assert!(ttl <= r[4] && ttl >= r[4] - waited - 1, "{a:?}: pttl {ttl} vs reset {}", r[4]);
        let exp = pexpiretime(&mut con, &k);
        // Before the expiry, the state is not fresh yet: a COST 0 call
        // reports fewer than 10 remaining (token bucket / log), or a
        // nonzero reset (all).
        let r2 = a.call(&mut con, &k, 10, 300, &["COST", "0"]);
        assert!(r2[4] > 0, "{a:?}");
        wait_for("key to expire", Duration::from_secs(5), || (!exists(&mut con, &k)).then_some(()));
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        assert!(now_ms >= exp, "{a:?}: expired before its expiry time");
        assert_eq!(a.call(&mut con, &k, 10, 300, &["COST", "0"]), [1, 10, 10, 0, 0], "{a:?}: fresh again");
    }
}

#[test]
fn bad_input_answers_errors_and_changes_nothing() {
    let s = Server::start();
    let mut con = s.con();
    for a in ALGOS {
        let k = format!("bad:{}", a.name());
        a.call(&mut con, &k, 5, FOREVER_MS, &[]);
        let d0 = digest(&mut con, &k);
        let n = a.limit_args(1, 1).len();
        let mut cases: Vec<(Vec<String>, &str)> = vec![
            (vec![], "wrong number of arguments"),
            (vec![k.clone()], "wrong number of arguments"),
            (std::iter::once(k.clone()).chain(a.limit_args(1, 1).into_iter().take(n - 1)).collect(), "wrong number of arguments"),
        ];
        for bad in ["0", "-1", "abc", "1.5", "9007199254740992", "", " 1", "+1", "99999999999999999999"] {
            for pos in 0..n {
                let mut args = vec![k.clone()];
                args.extend(a.limit_args(5, FOREVER_MS));
                args[pos + 1] = bad.to_string();
                cases.push((args, "must be an integer between 1 and 9007199254740991"));
            }
        }
        let base = || {
            let mut v = vec![k.clone()];
            v.extend(a.limit_args(5, FOREVER_MS));
            v
        };
        for opts in [
            &["COST"][..],
            &["COST", "1", "COST", "1"],
            &["PARTIAL", "PARTIAL"],
            &["DRYRUN", "dryrun"],
            &["FOO"],
            &["COST", "1", "EXTRA"],
        ] {
            let mut v = base();
            v.extend(opts.iter().map(|s| s.to_string()));
            cases.push((v, "syntax error"));
        }
        for bad in ["-1", "x", "9007199254740992"] {
            let mut v = base();
            v.extend(["COST".to_string(), bad.to_string()]);
            cases.push((v, "COST must be an integer between 0 and 9007199254740991"));
        }
        for (args, expect) in cases {
            let err = redis::cmd(a.name()).arg(&args).query::<Value>(&mut con).expect_err("an error");
            let text = format!("{err}");
            assert!(text.contains(expect), "{a:?} {args:?}: {text}");
        }
        // The error names the argument.
        let mut v = base();
        v[1] = "0".into();
        let err = format!("{}", redis::cmd(a.name()).arg(&v).query::<Value>(&mut con).unwrap_err());
        let first = if a == Algo::TokenBucket { "capacity" } else { "limit" };
        assert!(err.contains(first), "{err}");
        assert_eq!(digest(&mut con, &k), d0, "{a:?}: an error changed the key");
    }
    let _: String = redis::cmd("PING").query(&mut con).expect("server still up");
}

#[test]
fn wrongtype_across_all_types() {
    let s = Server::start();
    let mut con = s.con();
    let _: () = con.set("str", "x").unwrap();
    for a in ALGOS {
        a.call(&mut con, &format!("wt:{}", a.name()), 5, FOREVER_MS, &[]);
    }
    let mut keys: Vec<String> = ALGOS.iter().map(|a| format!("wt:{}", a.name())).collect();
    keys.push("str".into());
    for a in ALGOS {
        for k in &keys {
            if k == &format!("wt:{}", a.name()) {
                continue;
            }
            let d0 = digest(&mut con, k);
            for opts in [&[][..], &["DRYRUN"]] {
                let err = a.cmd(k, 5, FOREVER_MS, opts).query::<Value>(&mut con).expect_err("WRONGTYPE");
                assert_eq!(err.code(), Some("WRONGTYPE"), "{a:?} on {k}: {err}");
                assert!(format!("{err}").contains("Operation against a key holding the wrong kind of value"));
            }
            assert_eq!(digest(&mut con, k), d0);
        }
    }
    let t: String = redis::cmd("TYPE").arg("wt:RL.SLIDINGLOG").query(&mut con).unwrap();
    assert_eq!(t, "rl-slilog");
}

/// Parameters may change from call to call; the stored state carries over.
#[test]
fn runtime_rule_changes() {
    let s = Server::start();
    let mut con = s.con();
    // Token bucket: tokens are capped at the new capacity.
    let r: Vec<i64> = redis::cmd("RL.TOKENBUCKET").arg(&["tb", "100", "1", "3600000", "COST", "10"]).query(&mut con).unwrap();
    assert_eq!(r[2], 90);
    let r: Vec<i64> = redis::cmd("RL.TOKENBUCKET").arg(&["tb", "50", "1", "3600000", "COST", "0"]).query(&mut con).unwrap();
    assert_eq!(r[..3], [1, 50, 50]);
    let r: Vec<i64> = redis::cmd("RL.TOKENBUCKET").arg(&["tb", "200", "1", "3600000", "COST", "0"]).query(&mut con).unwrap();
    assert_eq!(r[..3], [1, 200, 90], "raising capacity keeps the 90 tokens");
    // Windows: the units already granted count under the new limit.
    for a in [Algo::SlidingLog, Algo::SlidingCounter] {
        let k = format!("rc:{}", a.name());
        a.call(&mut con, &k, 10, FOREVER_MS, &["COST", "6"]);
        assert_eq!(a.call(&mut con, &k, 5, FOREVER_MS, &["COST", "0"])[..3], [1, 5, 0], "{a:?}");
        assert_eq!(a.call(&mut con, &k, 5, FOREVER_MS, &[])[0], 0, "{a:?}");
        assert_eq!(a.call(&mut con, &k, 20, FOREVER_MS, &["COST", "0"])[2], 14, "{a:?}");
    }
}

#[test]
fn persistence_reload_dump_restore_copy() {
    let s = Server::start();
    let mut con = s.con();
    let mut keys = vec![];
    for a in ALGOS {
        for (i, cost) in [1u64, 3, 7].iter().enumerate() {
            let k = format!("p:{}:{i}", a.name());
            a.call(&mut con, &k, 10, 3_600_000 * (i as u64 + 1), &["COST", &cost.to_string()]);
            a.call(&mut con, &k, 10, 3_600_000 * (i as u64 + 1), &[]);
            keys.push(k);
        }
    }
    let before = snapshot(&mut con, &keys);
    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("DEBUG RELOAD");
    for (k, (d, e)) in keys.iter().zip(&before) {
        assert_eq!(&digest(&mut con, k), d, "{k} after DEBUG RELOAD");
        assert_eq!(pexpiretime(&mut con, k), *e, "{k} TTL after DEBUG RELOAD");
    }
    for (k, (d, e)) in keys.iter().zip(&before) {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut con).unwrap();
        let copy = format!("{k}:restored");
        let _: String = redis::cmd("RESTORE").arg(&copy).arg(*e).arg(dump).arg("ABSTTL").query(&mut con).unwrap();
        assert_eq!(&digest(&mut con, &copy), d, "{k} after DUMP/RESTORE");
        assert_eq!(pexpiretime(&mut con, &copy), *e);
        let copied = format!("{k}:copied");
        let n: i64 = redis::cmd("COPY").arg(k).arg(&copied).query(&mut con).unwrap();
        assert_eq!(n, 1);
        assert_eq!(&digest(&mut con, &copied), d, "{k} after COPY");
        assert_eq!(pexpiretime(&mut con, &copied), *e);
        // The copy is independent of the original.
        let a = ALGOS.iter().find(|a| k.contains(a.name())).copied().unwrap();
        a.call(&mut con, &copied, 10, FOREVER_MS, &["COST", "1"]);
        assert_eq!(&digest(&mut con, k), d, "{k} changed through its copy");
    }
    // MEMORY USAGE works for every type.
    for k in &keys {
        let m: i64 = redis::cmd("MEMORY").arg("USAGE").arg(k).query(&mut con).unwrap();
        assert!(m > 0 && m < 400, "{k}: {m}");
    }
}

#[test]
fn aof_rewrite_and_restart_keep_state() {
    for preamble in ["yes", "no"] {
        let mut s = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always", "--aof-use-rdb-preamble", preamble]);
        let mut con = s.con();
        let mut rng = Rng::new(7);
        let mut keys = vec![];
        for i in 0..60 {
            let a = ALGOS[i % 3];
            let k = format!("aof:{i}");
            for _ in 0..rng.below(5) + 1 {
                let cost = rng.below(4).to_string();
                a.call(&mut con, &k, 10, 3_600_000, &["COST", &cost]);
            }
            keys.push(k);
            if i == 30 {
                let _: String = redis::cmd("BGREWRITEAOF").query(&mut con).unwrap();
                wait_for("AOF rewrite", Duration::from_secs(30), || {
                    let busy = info_field(&mut con, "persistence", "aof_rewrite_in_progress")? != "0"
                        || info_field(&mut con, "persistence", "aof_rewrite_scheduled")? != "0";
                    (!busy).then_some(())
                });
            }
        }
        let before = snapshot(&mut con, &keys);
        drop(con);
        s.restart();
        let mut con = s.con();
        wait_for("AOF load", Duration::from_secs(30), || (info_field(&mut con, "persistence", "loading")? == "0").then_some(()));
        for (k, (d, e)) in keys.iter().zip(&before) {
            assert_eq!(&digest(&mut con, k), d, "{k} after AOF restart (preamble {preamble})");
            assert_eq!(pexpiretime(&mut con, k), *e, "{k} TTL after AOF restart");
        }
    }
}

/// A real replica: after a randomized workload and WAIT, every key's digest
/// and absolute expiry match the master's.
#[test]
fn replica_matches_master_after_random_workload() {
    let master = Server::start();
    let replica = master.replica();
    let mut m = master.con();
    let mut r = replica.con();
    let mut rng = Rng::new(0x5eed);
    for _ in 0..3000 {
        let a = ALGOS[rng.below(3) as usize];
        let k = format!("w:{}:{}", a.name(), rng.below(60));
        let limit = [1, 5, 20, 100][rng.below(4) as usize];
        // FOREVER_MS moves a bucket to its wide form and back (rule change).
        let ms = [50, 1000, 60_000, 3_600_000, 3_600_000, FOREVER_MS][rng.below(6) as usize];
        let mut opts: Vec<String> = vec![];
        if rng.below(3) == 0 {
            opts.extend(["COST".into(), rng.below(8).to_string()]);
        }
        if rng.below(4) == 0 {
            opts.push("PARTIAL".into());
        }
        if rng.below(10) == 0 {
            opts.push("DRYRUN".into());
        }
        let opts: Vec<&str> = opts.iter().map(|s| s.as_str()).collect();
        a.call(&mut m, &k, limit, ms, &opts);
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut m).unwrap();
    assert_eq!(acked, 1);
    let keys: Vec<String> = redis::cmd("KEYS").arg("w:*").query(&mut m).unwrap();
    assert!(keys.len() > 50, "workload wrote {} keys", keys.len());
    let mut compared = 0;
    for k in keys {
        let exp = pexpiretime(&mut m, &k);
        let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        if exp < now_ms + 2000 {
            continue; // may expire while we compare
        }
        assert_eq!(digest(&mut m, &k), digest(&mut r, &k), "{k}: digest differs on the replica");
        assert_eq!(pexpiretime(&mut r, &k), exp, "{k}: expiry differs on the replica");
        compared += 1;
    }
    assert!(compared > 30, "compared {compared} keys");
}

#[test]
fn info_counts_granted_and_denied() {
    let s = Server::start();
    let mut con = s.con();
    for a in ALGOS {
        let k = format!("info:{}", a.name());
        a.call(&mut con, &k, 2, FOREVER_MS, &[]); // granted
        a.call(&mut con, &k, 2, FOREVER_MS, &["COST", "2", "PARTIAL"]); // partial
        a.call(&mut con, &k, 2, FOREVER_MS, &[]); // denied
        a.call(&mut con, &k, 2, FOREVER_MS, &["COST", "0"]); // granted
    }
    for name in ["tokenbucket", "slidinglog", "slidingcounter"] {
        let g = info_field(&mut con, "ratelimit", &format!("ratelimit_{name}_granted"));
        let p = info_field(&mut con, "ratelimit", &format!("ratelimit_{name}_partial"));
        let d = info_field(&mut con, "ratelimit", &format!("ratelimit_{name}_denied"));
        assert_eq!((g.as_deref(), p.as_deref(), d.as_deref()), (Some("2"), Some("1"), Some("1")), "{name}");
    }
}

/// 1,000 grants at distinct times in a sliding log fit in 8 KB, where a
/// sorted-set log of the same grants takes ~127 KB.
#[test]
fn sliding_log_memory_is_compact() {
    let s = Server::start();
    let mut con = s.con();
    let mut last: Vec<i64> = vec![];
    for _ in 0..1000 {
        // One grant per call; successive calls are at distinct µs.
        last = redis::cmd("RL.SLIDINGLOG").arg(&["log", "1000000", "60000"]).query(&mut con).unwrap();
    }
    assert_eq!(last[2], 1_000_000 - 1000);
    let m: i64 = redis::cmd("MEMORY").arg("USAGE").arg("log").query(&mut con).unwrap();
    assert!(m <= 8 * 1024, "MEMORY USAGE of 1,000 grants: {m} bytes");
    eprintln!("sliding log, 1000 grants: MEMORY USAGE = {m} bytes");
    // A grant of COST n costs the same as a grant of 1.
    let _: Vec<i64> = redis::cmd("RL.SLIDINGLOG").arg(&["big", "1000000", "60000", "COST", "1000"]).query(&mut con).unwrap();
    let _: Vec<i64> = redis::cmd("RL.SLIDINGLOG").arg(&["one", "1000000", "60000"]).query(&mut con).unwrap();
    let big: i64 = redis::cmd("MEMORY").arg("USAGE").arg("big").query(&mut con).unwrap();
    let one: i64 = redis::cmd("MEMORY").arg("USAGE").arg("one").query(&mut con).unwrap();
    assert_eq!(big, one);
}

fn mem(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0).query(con).expect("memory usage")
}

/// Bucket and counter states are kept in a 16-byte compact form when they
/// fit it (the usual case) and in full otherwise. The two forms must be
/// invisible: same replies, digests, DUMPs and expiries, across switches
/// between them in both directions, reloads, RESTORE, COPY and replication.
#[test]
fn compact_and_wide_states_behave_the_same() {
    let master = Server::start();
    let replica = master.replica();
    let mut con = master.con();
    let mut r = replica.con();
    let tb = |con: &mut Connection, k: &str, cap: u64, period: u64, cost: u64| -> Vec<i64> {
        redis::cmd("RL.TOKENBUCKET")
            .arg(k)
            .arg(cap)
            .arg(1)
            .arg(period)
            .arg("COST")
            .arg(cost)
            .query(con)
            .expect("RL.TOKENBUCKET")
    };
    // Per-hour bucket: compact. A bucket refilling over 2^40 ms: wide (its
    // level needs more than 128 bits with the time). Same name length.
    assert_eq!(tb(&mut con, "tb:c", 100, 3_600_000, 1)[..3], [1, 100, 99]);
    assert_eq!(tb(&mut con, "tb:w", 100, FOREVER_MS, 1)[..3], [1, 100, 99]);
    assert_eq!(mem(&mut con, "tb:w") - mem(&mut con, "tb:c"), 16, "bucket state: 16 bytes compact, 32 wide");
    // Switch forms both ways through rule changes; the level carries over.
    assert_eq!(tb(&mut con, "tb:c", 100, FOREVER_MS, 1)[..3], [1, 100, 98]);
    assert_eq!(mem(&mut con, "tb:c"), mem(&mut con, "tb:w"), "compact -> wide");
    assert_eq!(tb(&mut con, "tb:c", 100, 3_600_000, 1)[..3], [1, 100, 97]);
    assert_eq!(mem(&mut con, "tb:w") - mem(&mut con, "tb:c"), 16, "wide -> compact");
    assert_eq!(tb(&mut con, "tb:w", 100, FOREVER_MS, 1)[..3], [1, 100, 98]);

    // Counter: compact until a window counts 2^43 units or more.
    let sc = |con: &mut Connection, k: &str, cost: u64| -> Vec<i64> {
        redis::cmd("RL.SLIDINGCOUNTER").arg(k).arg(MAX).arg(3_600_000).arg("COST").arg(cost).query(con).expect("counter")
    };
    let big = 1u64 << 43;
    assert_eq!(sc(&mut con, "sc:c", 5)[..3], [1, MAX as i64, (MAX - 5) as i64]);
    assert_eq!(sc(&mut con, "sc:w", big)[..3], [1, MAX as i64, (MAX - big) as i64]);
    assert_eq!(mem(&mut con, "sc:w") - mem(&mut con, "sc:c"), 8, "counter state: 16 bytes compact, 24 wide");
    assert_eq!(sc(&mut con, "sc:c", big)[..3], [1, MAX as i64, (MAX - big - 5) as i64]);
    assert_eq!(mem(&mut con, "sc:c"), mem(&mut con, "sc:w"), "compact -> wide");

    // Both forms survive every way a value is copied, with equal digests.
    let keys = ["tb:c", "tb:w", "sc:c", "sc:w"];
    let before: Vec<(String, i64, Vec<u8>)> = keys
        .iter()
        .map(|k| (digest(&mut con, k), pexpiretime(&mut con, k), redis::cmd("DUMP").arg(*k).query(&mut con).unwrap()))
        .collect();
    assert_ne!(before[0].0, before[1].0, "different states, different digests");
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut con).unwrap();
    assert_eq!(acked, 1);
    for (k, (d, e, _)) in keys.iter().zip(&before) {
        assert_eq!(&digest(&mut r, k), d, "{k} on the replica");
        assert_eq!(pexpiretime(&mut r, k), *e, "{k} expiry on the replica");
    }
    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).expect("DEBUG RELOAD");
    for (k, (d, e, dump)) in keys.iter().zip(&before) {
        assert_eq!(&digest(&mut con, k), d, "{k} after DEBUG RELOAD");
        let again: Vec<u8> = redis::cmd("DUMP").arg(*k).query(&mut con).unwrap();
        assert_eq!(&again, dump, "{k}: the RDB bytes do not depend on the form");
        let restored = format!("{k}:r");
        let _: String = redis::cmd("RESTORE").arg(&restored).arg(*e).arg(dump).arg("ABSTTL").query(&mut con).unwrap();
        assert_eq!(&digest(&mut con, &restored), d, "{k} after RESTORE");
        let copied = format!("{k}:c");
        let _: i64 = redis::cmd("COPY").arg(*k).arg(&copied).query(&mut con).unwrap();
        assert_eq!(&digest(&mut con, &copied), d, "{k} after COPY");
    }
    // After the reload the compact key is still compact.
    assert_eq!(mem(&mut con, "tb:w") - mem(&mut con, "tb:c"), 16, "forms kept across DEBUG RELOAD");
    // And the restored keys go on from the same state.
    assert_eq!(tb(&mut con, "tb:c:r", 100, 3_600_000, 1)[..3], [1, 100, 96]);
    assert_eq!(tb(&mut con, "tb:w:c", 100, FOREVER_MS, 1)[..3], [1, 100, 97]);
}

fn effects_replicated(con: &mut Connection) -> Option<String> {
    info_field(con, "ratelimit", "ratelimit_effects_replicated")
}

fn snapshot(con: &mut Connection, keys: &[String]) -> Vec<(String, i64)> {
    keys.iter().map(|k| (digest(con, k), pexpiretime(con, k))).collect()
}

/// With no replica, no backlog and no AOF, grants skip building and
/// replicating their effect (it would reach nobody) but still count as
/// changes. Whatever later reads the stream must still see every grant: a
/// replica attached afterwards (its snapshot holds the earlier grants, the
/// fork of the full sync switches effects back on) and an AOF enabled at
/// run time (its rewrite holds the earlier grants, the per-call AOF check
/// the later ones).
#[test]
fn effects_are_skipped_only_while_nothing_can_read_them() {
    let mut master = Server::start();
    let mut m = master.con();
    wait_for("the module to see no listener", Duration::from_secs(30), || {
        (effects_replicated(&mut m)? == "0").then_some(())
    });
    let mut keys = vec![];
    let d0 = dirty(&mut m);
    for i in 0..20 {
        for a in ALGOS {
            let k = format!("e:{}:{i}", a.name());
            a.call(&mut m, &k, 100, 3_600_000, &[]);
            keys.push(k);
        }
    }
    assert_eq!(dirty(&mut m) - d0, 60, "each grant counts toward save points");
    assert_eq!(effects_replicated(&mut m).as_deref(), Some("0"));

    let replica = master.replica();
    let mut r = replica.con();
    assert_eq!(effects_replicated(&mut m).as_deref(), Some("1"), "the full sync's fork switches effects on");
    for (i, k) in keys.clone().iter().enumerate() {
        let a = ALGOS[i % 3];
        a.call(&mut m, k, 100, 3_600_000, &["COST", "2"]);
        let fresh = format!("{k}:after");
        a.call(&mut m, &fresh, 100, 3_600_000, &[]);
        keys.push(fresh);
    }
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(10_000).query(&mut m).unwrap();
    assert_eq!(acked, 1);
    assert_eq!(snapshot(&mut r, &keys), snapshot(&mut m, &keys), "replica attached after skipped effects");
    drop(r);
    drop(replica);

    // AOF switched on at run time, on a server that skips effects.
    let mut s = Server::with_args(&["--appendfsync", "always"]);
    let mut con = s.con();
    wait_for("the module to see no listener", Duration::from_secs(30), || {
        (effects_replicated(&mut con)? == "0").then_some(())
    });
    let mut keys = vec![];
    for i in 0..30 {
        let a = ALGOS[i % 3];
        let k = format!("aof:{i}");
        a.call(&mut con, &k, 100, 3_600_000, &[]);
        keys.push(k);
    }
    let _: String = redis::cmd("CONFIG").arg("SET").arg("appendonly").arg("yes").query(&mut con).unwrap();
    wait_for("AOF on", Duration::from_secs(30), || {
        let on = info_field(&mut con, "persistence", "aof_enabled")? == "1"
            && info_field(&mut con, "persistence", "aof_rewrite_in_progress")? == "0"
            && info_field(&mut con, "persistence", "aof_rewrite_scheduled")? == "0";
        on.then_some(())
    });
    for (i, k) in keys.clone().iter().enumerate() {
        let a = ALGOS[i % 3];
        a.call(&mut con, k, 100, 3_600_000, &["COST", "3"]);
        let fresh = format!("{k}:after");
        a.call(&mut con, &fresh, 100, 3_600_000, &[]);
        keys.push(fresh);
    }
    let before = snapshot(&mut con, &keys);
    drop(con);
    s.restart_with(&["--appendonly", "yes"]);
    let mut con = s.con();
    wait_for("AOF load", Duration::from_secs(30), || (info_field(&mut con, "persistence", "loading")? == "0").then_some(()));
    assert_eq!(snapshot(&mut con, &keys), before, "AOF enabled after skipped effects");
    drop(master.con());
    master.kill();
}
