//! Real servers for the Rust suites: a redis-server / valkey-server
//! process of REDIS_SERVER on a free port, in a temp dir of its own, with
//! the module of RL_MODULE loaded or not. Started, stopped
//! (SIGSTOP/SIGCONT), killed and restarted on the same port. Sentinels
//! (`Sentinel`) and clusters (`start_cluster`) of them. A dev-dependency of
//! the Rust client's tests and bench and of the Envoy service's suite.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};

pub fn server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

pub fn module_path() -> String {
    std::env::var("RL_MODULE").unwrap_or_else(|_| {
        // the workspace's target/, above this crate
        let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let so = "target/release/libredis_ratelimit.so";
        let root = here.ancestors().map(|d| d.join(so)).find(|p| p.exists()).unwrap_or_else(|| here.join("../..").join(so));
        root.to_string_lossy().into_owned()
    })
}

/// The server's arguments that load the module: none when `RL_MODULE` is
/// `none` (a server without it, as managed Redis is: the clients fall back
/// to the Lua twins).
pub fn module_args() -> Vec<String> {
    match std::env::var("RL_MODULE").as_deref() {
        Ok("none") => Vec::new(),
        _ => vec!["--loadmodule".to_owned(), module_path()],
    }
}

/// Whether the servers run without the module (`RL_MODULE=none`).
pub fn without_module() -> bool {
    std::env::var("RL_MODULE").as_deref() == Ok("none")
}

/// A port free now, never handed out before in this process: the suites
/// start servers in parallel, and a port given to two tests before either
/// server bound it would put one test on the other's server.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let p = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !given.contains(&p) {
            given.push(p);
            return p;
        }
    }
}

pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    module: bool,
    extra: Vec<String>,
    child: Option<Child>,
}

impl Server {
    pub fn start(module: bool) -> Server {
        Server::start_with(module, &[])
    }

    /// A server with more arguments (e.g. `--cluster-enabled yes`).
    pub fn start_with(module: bool, extra: &[&str]) -> Server {
        // cluster bus ports are port + 10000: keep the port at most 55535
        let port = loop {
            let p = free_port();
            if p <= 55_535 {
                break p;
            }
        };
        let dir = std::env::temp_dir().join(format!("rl-rust-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let extra = extra.iter().map(|a| (*a).to_owned()).collect();
        let mut s = Server { port, dir, module, extra, child: None };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(server_bin());
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args(["--logfile", "redis.log", "--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.module {
            cmd.args(module_args());
        }
        cmd.args(&self.extra);
        self.child = Some(cmd.spawn().expect("start redis-server (REDIS_SERVER)"));
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                panic!("redis-server exited with {st}: {log}");
            }
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "redis-server on {} did not start", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    pub fn sigstop(&self) {
        unsafe { libc::kill(self.pid(), libc::SIGSTOP) };
    }

    pub fn sigcont(&self) {
        unsafe { libc::kill(self.pid(), libc::SIGCONT) };
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A plain sync connection for checking from outside the library.
    pub fn sync(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }

    /// A ConnectionManager with the driver's default reconnect settings
    /// (retries with backoff): the library's bound must hold anyway.
    pub async fn manager(&self) -> ConnectionManager {
        let cfg = ConnectionManagerConfig::new();
        ConnectionManager::new_with_config(redis::Client::open(self.url()).unwrap(), cfg).await.unwrap()
    }

    pub async fn multiplexed(&self) -> MultiplexedConnection {
        redis::Client::open(self.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.sigcont();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `f` until it is true (never a fixed sleep), at most `secs`.
pub async fn wait_until<F: FnMut() -> Fut, Fut: std::future::Future<Output = bool>>(secs: u64, what: &str, mut f: F) {
    let t0 = Instant::now();
    while !f().await {
        assert!(t0.elapsed() < Duration::from_secs(secs), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A sentinel process (REDIS_SERVER --sentinel) monitoring `mymaster` at
/// a primary on 127.0.0.1, in a temp dir of its own.
pub struct Sentinel {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Child,
}

impl Sentinel {
    pub fn start(primary_port: u16) -> Sentinel {
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

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Three sentinels on the primary, once they know each other and its one replica.
    pub async fn start_three(primary_port: u16) -> Vec<Sentinel> {
        let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(primary_port)).collect();
        wait_until(60, "the sentinels know each other and the replica", || async {
            sentinels.iter().all(|s| {
                let m = s.master();
                m.get("num-other-sentinels").map(String::as_str) == Some("2")
                    && m.get("num-slaves").map(String::as_str) == Some("1")
            })
        })
        .await;
        sentinels
    }

    /// `SENTINEL MASTER mymaster` as field → value (empty until it answers).
    pub fn master(&self) -> std::collections::HashMap<String, String> {
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

/// `role:` of INFO replication (`master`, `slave`).
pub fn role(s: &Server) -> String {
    let info: String = redis::cmd("INFO").arg("replication").query(&mut s.sync()).unwrap();
    info.lines().find_map(|l| l.strip_prefix("role:")).unwrap_or("").trim().to_owned()
}

pub const CLUSTER: [&str; 6] =
    ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"];

/// Runs redis-cli (REDIS_CLI) and returns its output; panics when it fails.
pub fn cli(args: &[String]) -> String {
    let bin = std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into());
    let out = Command::new(&bin).args(args).output().unwrap_or_else(|e| panic!("run {bin}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "redis-cli {args:?} failed: {text}");
    text
}

pub fn node_id(s: &Server) -> String {
    redis::cmd("CLUSTER").arg("MYID").query(&mut s.sync()).unwrap()
}

/// Every node says cluster_state:ok and they agree on the slot map.
pub async fn wait_ok(nodes: &[Server]) {
    wait_until(60, "cluster state ok and consistent", || async {
        let mut maps = vec![];
        for s in nodes {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut s.sync()).unwrap();
            if !info.contains("cluster_state:ok") {
                return false;
            }
            let slots: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut s.sync()).unwrap();
            maps.push(format!("{slots:?}"));
        }
        maps.windows(2).all(|w| w[0] == w[1])
    })
    .await;
}

/// The index in `nodes` of the primary serving `slot` (per the first node).
pub fn slot_owner(nodes: &[Server], slot: u16) -> usize {
    let n = |x: &redis::Value| if let redis::Value::Int(i) = x { *i as u16 } else { panic!("{x:?}") };
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut nodes[0].sync()).unwrap();
    let port = ranges
        .iter()
        .find_map(|r| {
            let redis::Value::Array(a) = r else { panic!("{r:?}") };
            let redis::Value::Array(primary) = &a[2] else { panic!("{a:?}") };
            (n(&a[0])..=n(&a[1])).contains(&slot).then(|| n(&primary[1]))
        })
        .expect("slot assigned");
    nodes.iter().position(|s| s.port == port).unwrap()
}

/// `n` module-loaded primaries made one cluster by `redis-cli --cluster
/// create` (no replicas), once every node agrees on the slot map.
pub async fn start_cluster(n: usize) -> Vec<Server> {
    let nodes: Vec<Server> = (0..n).map(|_| Server::start_with(true, &CLUSTER)).collect();
    let mut create = vec!["--cluster".to_owned(), "create".to_owned()];
    create.extend(nodes.iter().map(|s| format!("127.0.0.1:{}", s.port)));
    create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(str::to_owned));
    cli(&create);
    wait_ok(&nodes).await;
    nodes
}
