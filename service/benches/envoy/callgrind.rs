//! The server's (and with `--count-only`, the service's) instructions
//! per decision under callgrind.

use super::*;

/// `callgrind_control args`; `host`: the `HOST` the valgrind'd process
/// saw (valgrind names its vgdb pipes after it), when not this process's.
pub(crate) fn callgrind_control(args: &[&str], host: Option<&str>) {
    let mut c = Command::new("callgrind_control");
    if let Some(h) = host {
        c.env("HOST", h);
    }
    let st = c.args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().expect("callgrind_control");
    assert!(st.success(), "callgrind_control {args:?}: {st}");
}

/// The newest callgrind dump under `dir`.
pub(crate) fn newest_dump(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("callgrind.out."))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).unwrap_or(UNIX_EPOCH))
        .expect("a callgrind dump")
        .path()
}

/// The instructions of the newest callgrind dump under `dir` (its `totals:`).
pub(crate) fn callgrind_totals(dir: &Path) -> f64 {
    dump_totals(&std::fs::read_to_string(newest_dump(dir)).unwrap())
}

/// The instructions of a callgrind dump's text (its `totals:`, or `summary:`).
pub(crate) fn dump_totals(text: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("totals: in the callgrind dump")
}

/// Instructions the server runs per decision under callgrind (deterministic,
/// unlike CPU time on a shared machine): a second redis-server under
/// `valgrind --tool=callgrind` and a second service on it; per cell, the
/// keys are made by a first pass of the same requests, then the counters
/// are zeroed, `--cg-n` decisions sent one at a time (one round trip each:
/// two for the GET-first mode), and the counters dumped. User-space
/// instructions of the whole server (reading, parsing, the commands,
/// replies); the kernel's work is not counted (the reads column shows it).
pub(crate) async fn callgrind_phase(a: &Args, dir: &Path) -> HashMap<(Mode, usize), f64> {
    let cgdir = dir.join("cg");
    std::fs::create_dir_all(&cgdir).unwrap();
    let (redis, rport) = start_redis(a, &cgdir, true);
    let (_svc, gport) = start_service(a, dir, rport);
    let pid = redis.pid().to_string();
    let mut client = RateLimitServiceClient::new(
        Endpoint::from_shared(format!("http://127.0.0.1:{gport}")).unwrap().connect().await.unwrap(),
    );
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{rport}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (keys, count) = (200, a.cg_n);
    let mut out = HashMap::new();
    for n in [1, 2, 4] {
        for mode in [Mode::Service, Mode::IncrExpire, Mode::GetFirst] {
            let base = 500_000_000 + 1_000_000 * n as u64;
            for pass in 0..2 {
                if pass == 1 {
                    callgrind_control(&["-z", &pid], None);
                }
                let m = if pass == 0 { keys } else { count };
                for i in 0..m {
                    let j = base + i % keys;
                    if mode == Mode::Service {
                        let r = client.should_rate_limit(bench_request(j, n, keys)).await.expect("callgrind decision");
                        assert_eq!(r.get_ref().overall_code, OK);
                    } else {
                        let now = now_s();
                        let ks: Vec<String> = bench_entries(j, n, keys)
                            .iter()
                            .map(|e| envoy_key("", "bench", std::slice::from_ref(e), BENCH_UNIT_S, now))
                            .collect();
                        envoy_decide(&mut con, &ks, &vec![BENCH_LIMIT; n], BENCH_UNIT_S, mode == Mode::GetFirst).await;
                    }
                }
            }
            callgrind_control(&["-d", &pid], None);
            let ir = callgrind_totals(&cgdir) / count as f64;
            eprintln!("  callgrind n={n} {:<28} {:8.0} instructions/decision", mode.label(), ir);
            out.insert((mode, n), ir);
        }
    }
    out
}

/// The calls of a callgrind dump to each function named in `names`
/// (every caller's `calls=` lines under a `cfn=` of that name; names are
/// compressed as `(id) name` on first use, `(id)` after).
pub(crate) fn callgrind_calls(text: &str, names: &[&str]) -> HashMap<String, u64> {
    let mut by_id: HashMap<&str, &str> = HashMap::new();
    let mut callee = "";
    let mut out = HashMap::new();
    for l in text.lines() {
        let named = l.strip_prefix("fn=").map(|r| (false, r)).or_else(|| l.strip_prefix("cfn=").map(|r| (true, r)));
        if let Some((is_callee, r)) = named {
            let name = match r.strip_prefix('(').and_then(|r| r.split_once(')')) {
                Some((id, rest)) => {
                    let rest = rest.trim_start();
                    if !rest.is_empty() {
                        by_id.insert(id, rest);
                    }
                    by_id.get(id).copied().unwrap_or("")
                }
                None => r,
            };
            if is_callee {
                callee = name;
            }
        } else if let Some(r) = l.strip_prefix("calls=") {
            if names.contains(&callee) {
                let c: u64 = r.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or(0);
                *out.entry(callee.to_owned()).or_insert(0) += c;
            }
        }
    }
    out
}

/// `--count-only N`: the release service under callgrind on a Redis with
/// the module (the bench's configuration); per descriptor count, a first
/// pass of the requests (connections, the limiter and the statistics' keys
/// made), the counters zeroed, N decisions one at a time, the counters
/// dumped: the service's instructions (user space, the whole process) and
/// heap allocations (malloc-family calls) per decision. Deterministic, so
/// that a change's effect shows on a shared machine.
pub(crate) async fn count_only(a: &Args, dir: &Path) {
    let cgdir = dir.join("cg-service");
    std::fs::create_dir_all(&cgdir).unwrap();
    let (_redis, rport) = start_redis(a, dir, false);
    let wrapper = [
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        "--dump-instr=no".to_owned(),
        format!("--callgrind-out-file={}", cgdir.join("callgrind.out.%p").display()),
    ];
    // no reload polls in the counts (they are wall-clock driven)
    let (svc, gport) = start_service_in(a, dir, rport, &wrapper, &[("RUNTIME_POLL_INTERVAL", "24h")]);
    let pid = svc.pid().to_string();
    // valgrind names its vgdb pipes after $HOST, which the service's
    // environment sets: callgrind_control (vgdb) must see the same one
    let control = |cmd: &str| callgrind_control(&[cmd, &pid], Some("127.0.0.1"));
    let mut client = RateLimitServiceClient::new(
        Endpoint::from_shared(format!("http://127.0.0.1:{gport}")).unwrap().connect().await.unwrap(),
    );
    const ALLOC: [&str; 6] = ["malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign"];
    let (keys, count) = (200, a.count_only);
    println!("service {}, {count} decisions per row, one at a time, under callgrind", a.service);
    println!("| descriptors | instructions/decision | allocations/decision | frees/decision |");
    println!("|---|---|---|---|");
    for n in [1, 2, 4] {
        let base = 700_000_000 + 1_000_000 * n as u64;
        for pass in 0..2 {
            if pass == 1 {
                control("-z");
            }
            for i in 0..if pass == 0 { keys } else { count } {
                let r = client.should_rate_limit(bench_request(base + i % keys, n, keys)).await.expect("decision");
                assert_eq!(r.get_ref().overall_code, OK);
            }
        }
        let dumps = std::fs::read_dir(&cgdir).unwrap().count();
        control("-d");
        // the dump is written by the service: wait for it, complete
        let t0 = Instant::now();
        let text = loop {
            if std::fs::read_dir(&cgdir).unwrap().count() > dumps {
                let t = std::fs::read_to_string(newest_dump(&cgdir)).unwrap();
                if t.lines().any(|l| l.starts_with("totals:") || l.starts_with("summary:")) {
                    break t;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "no callgrind dump from the service");
            std::thread::sleep(Duration::from_millis(50));
        };
        let ir = dump_totals(&text);
        let calls = callgrind_calls(&text, &[&ALLOC[..], &["free"]].concat());
        let allocs: u64 = ALLOC.iter().filter_map(|f| calls.get(*f)).sum();
        let frees = calls.get("free").copied().unwrap_or(0);
        let per = |x: f64| x / count as f64;
        println!("| {n} | {:.0} | {:.2} | {:.2} |", per(ir), per(allocs as f64), per(frees as f64));
        eprintln!("  n={n}: {calls:?}, {}", newest_dump(&cgdir).display());
    }
}
