//! SentinelConnection against real sentinels: a module-loaded primary and
//! replica watched by three sentinels; the primary is killed (or stopped
//! with SIGSTOP), the
//! sentinels promote the replica, and the limiter follows: every decision
//! within the timeout (the panic limits decide meanwhile), then decisions
//! from the promoted replica again, going on from the replicated state.
mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, server_bin, wait_until, Server};
use redis_ratelimit_client::*;

const HOUR: u64 = 3_600_000;
const TIMEOUT_MS: u64 = 100;

struct Sentinel {
    port: u16,
    dir: std::path::PathBuf,
    child: Child,
}

impl Sentinel {
    fn start(primary_port: u16) -> Sentinel {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("rl-rust-sentinel-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds mymaster 1000\n\
                 sentinel failover-timeout mymaster 10000\n\
                 sentinel parallel-syncs mymaster 1\n",
                dir.display()
            ),
        )
        .unwrap();
        let child = Command::new(server_bin())
            .arg(&conf)
            .arg("--sentinel")
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a sentinel (REDIS_SERVER --sentinel)");
        Sentinel { port, dir, child }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `SENTINEL MASTER mymaster` as field → value (empty until it answers).
    fn master(&self) -> std::collections::HashMap<String, String> {
        let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) else {
            return Default::default();
        };
        let v: Vec<String> = redis::cmd("SENTINEL").arg("MASTER").arg("mymaster").query(&mut c).unwrap_or_default();
        v.chunks(2).filter(|kv| kv.len() == 2).map(|kv| (kv[0].clone(), kv[1].clone())).collect()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn role(s: &Server) -> String {
    let info: String = redis::cmd("INFO").arg("replication").query(&mut s.sync()).unwrap();
    info.lines().find_map(|l| l.strip_prefix("role:")).unwrap_or("").trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_follows_a_failover_from_a_killed_primary() {
    failover(false).await;
}

/// A stopped primary (SIGSTOP) answers nothing and closes nothing: the
/// calls the timeout abandons make the connection ask the sentinels again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_follows_a_failover_from_a_stopped_primary() {
    failover(true).await;
}

async fn failover(stop: bool) {
    let mut primary = Server::start(true);
    let replica = Server::start_with(true, &["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(primary.port)).collect();
    wait_until(60, "the sentinels know each other and the replica", || async {
        sentinels.iter().all(|s| {
            let m = s.master();
            m.get("num-other-sentinels").map(String::as_str) == Some("2")
                && m.get("num-slaves").map(String::as_str) == Some("1")
        })
    })
    .await;

    let urls: Vec<String> = sentinels.iter().map(Sentinel::url).collect();
    let conn = SentinelConnection::new(&urls, "mymaster").unwrap();
    let rl = RateLimit::new(conn, Options { timeout_ms: TIMEOUT_MS, ..Options::default() }).unwrap();
    let lim =
        rl.limiter(token_bucket("api", 1000, 1, HOUR).unwrap(), Panic::Fixed { limit: 100_000, window_ms: None }).unwrap();
    for _ in 0..10 {
        let d = lim.limit("k", Call::default()).await.unwrap();
        assert_eq!((d.allowed, d.source), (true, Source::Module), "{d:?}");
    }
    // every grant on the replica before the kill
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut primary.sync()).unwrap();
    assert_eq!(acked, 1);

    if stop {
        primary.sigstop();
    } else {
        primary.kill();
    }
    let t0 = Instant::now();
    let (mut worst, mut panics) = (Duration::ZERO, 0);
    let after = loop {
        let t = Instant::now();
        let d = lim.limit("k", Call::default()).await.unwrap();
        worst = worst.max(t.elapsed());
        if d.source == Source::Module {
            break d;
        }
        assert_eq!(d.source, Source::Panic, "{d:?}");
        panics += 1;
        assert!(t0.elapsed() < Duration::from_secs(60), "no failover within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "{}: failover followed after {:.1} s: {panics} panic decisions, slowest decision {} ms",
        if stop { "SIGSTOP" } else { "SIGKILL" },
        t0.elapsed().as_secs_f64(),
        worst.as_millis()
    );
    // the bound the library promises: a decision within the timeout (+20 ms)
    assert!(worst <= Duration::from_millis(TIMEOUT_MS + 20), "slowest decision {worst:?}");
    assert!(panics > 0, "the kill was seen");
    assert_eq!(role(&replica), "master");
    // the promoted replica goes on from the replicated state: 10 before, this one
    assert_eq!((after.allowed, after.remaining), (true, 1000 - 11), "{after:?}");
}
