//! Real redis-server processes for the Rust integration tests: a free port on
//! 127.0.0.1, a temp dir of its own, the built module loaded, and the
//! process killed when the `Server` is dropped (also when a test panics).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use redis::{Commands, Connection, Value};

pub const MAX: u64 = (1 << 53) - 1;

/// The module under test: `RL_MODULE`, or the release build of this crate.
pub fn module_path() -> PathBuf {
    let p = std::env::var_os("RL_MODULE").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_ratelimit.so")
    });
    assert!(p.exists(), "module not built: {} (run `make build`)", p.display());
    p
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

fn temp_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "rl-test-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&d).expect("create temp dir");
    d
}

/// Poll `f` until it returns `Some`, or panic after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    pub fn start() -> Server {
        Server::with_args(&[])
    }

    pub fn with_args(extra: &[&str]) -> Server {
        let mut s = Server {
            port: free_port(),
            dir: temp_dir(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
        };
        s.spawn();
        s
    }

    /// A replica of `self`, returned once its link to `self` is up.
    pub fn replica(&self) -> Server {
        let replica = Server::with_args(&["--replicaof", "127.0.0.1", &self.port.to_string()]);
        let mut r = replica.con();
        wait_for("replication link", Duration::from_secs(30), || {
            (info_field(&mut r, "replication", "master_link_status")? == "up").then_some(())
        });
        replica
    }

    fn spawn(&mut self) {
        let module = module_path();
        let child = Command::new(std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()))
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--save", "", "--appendonly", "no", "--enable-debug-command", "yes"])
            .args(["--logfile", "redis.log", "--protected-mode", "no"])
            .arg("--loadmodule")
            .arg(&module)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed? run `make deps`)");
        self.child = Some(child);
        let port = self.port;
        wait_for("redis-server to accept connections", Duration::from_secs(30), || {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("redis-server exited early ({status}): {}", self.log_tail());
                }
            }
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
            let mut con = client.get_connection().ok()?;
            redis::cmd("PING").query::<String>(&mut con).ok()
        });
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn con(&self) -> Connection {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).expect("client");
        client.get_connection().expect("connect")
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGKILL and wait.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A clean shutdown (SHUTDOWN NOSAVE keeps what AOF already has).
    pub fn shutdown(&mut self) {
        if let Some(mut c) = self.child.take() {
            let mut con = self.con();
            let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut con);
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Restart on the same port and directory, with `extra` arguments added.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self.restart();
    }

    /// Restart on the same port and directory with the same arguments.
    pub fn restart(&mut self) {
        self.shutdown();
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The three commands, with arguments for "`limit` units per `ms`".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    TokenBucket,
    SlidingLog,
    SlidingCounter,
}

pub const ALGOS: [Algo; 3] = [Algo::TokenBucket, Algo::SlidingLog, Algo::SlidingCounter];

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::TokenBucket => "RL.TOKENBUCKET",
            Algo::SlidingLog => "RL.SLIDINGLOG",
            Algo::SlidingCounter => "RL.SLIDINGCOUNTER",
        }
    }

    /// Positional arguments for `limit` per `ms` (the bucket refills its
    /// whole capacity per period).
    pub fn limit_args(self, limit: u64, ms: u64) -> Vec<String> {
        match self {
            Algo::TokenBucket => vec![limit.to_string(), limit.to_string(), ms.to_string()],
            _ => vec![limit.to_string(), ms.to_string()],
        }
    }

    /// A command on `key` with `limit` per `ms` and extra options.
    pub fn cmd(self, key: &str, limit: u64, ms: u64, opts: &[&str]) -> redis::Cmd {
        let mut c = redis::cmd(self.name());
        c.arg(key).arg(self.limit_args(limit, ms)).arg(opts);
        c
    }

    pub fn call(self, con: &mut Connection, key: &str, limit: u64, ms: u64, opts: &[&str]) -> [i64; 5] {
        let v: Vec<i64> = self.cmd(key, limit, ms, opts).query(con).unwrap_or_else(|e| panic!("{}: {e}", self.name()));
        v.try_into().expect("five integers")
    }
}

/// A window so long that no refill or window boundary happens during a test
/// (windows are aligned to multiples of their length on the Unix clock; a
/// 2^40 ms window next turns over in 2039).
pub const FOREVER_MS: u64 = 1 << 40;

pub fn digest(con: &mut Connection, key: &str) -> String {
    redis::cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query::<Vec<String>>(con).expect("digest").remove(0)
}

pub fn pexpiretime(con: &mut Connection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME").arg(key).query(con).expect("pexpiretime")
}

pub fn info_field(con: &mut Connection, section: &str, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO").arg(section).query(con).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_string()))
}

/// A small deterministic PRNG (xorshift64*), so failures reproduce.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
