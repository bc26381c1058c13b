//! Real servers for the tests: a redis-server / valkey-server process of
//! REDIS_SERVER on a free port, in a temp dir of its own, with the module
//! of RL_MODULE loaded or not. Started, stopped (SIGSTOP/SIGCONT), killed
//! and restarted on the same port.
#![allow(dead_code)]

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
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/libredis_ratelimit.so");
        root.to_string_lossy().into_owned()
    })
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
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
            cmd.args(["--loadmodule", &module_path()]);
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
