//! The processes of a run: Redis and the service started, pinned and
//! measured (CPU time, load), and the scheduling of this process.

use super::*;

/// A child process killed when dropped.
pub(crate) struct Proc(pub(crate) Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub(crate) fn wait_port(port: u16, what: &str, child: &mut Proc) {
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = child.0.try_wait() {
            panic!("{what} exited: {st}");
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CPU time of every thread of `pid`, ns (`/proc/PID/task/*/schedstat`:
/// time on a CPU, user and system, at scheduler resolution).
pub(crate) fn cpu_ns(pid: u32) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s.split_whitespace().next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    total
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

pub(crate) fn uptime() -> String {
    Command::new("uptime").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// 2026-12-03 21:40 UTC, from the epoch (no date crate).
pub(crate) fn utc(t: u64) -> String {
    let days = (t / 86400) as i64;
    let (h, m) = ((t % 86400) / 3600, (t % 3600) / 60);
    // civil from days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y}-{mo:02}-{d:02} {h:02}:{m:02} UTC")
}

/// redis-server with the module on core 0 (under callgrind with `callgrind`).
pub(crate) fn start_redis(a: &Args, dir: &Path, callgrind: bool) -> (Proc, u16) {
    let port = free_port();
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", "0"]);
    if callgrind {
        let out = dir.join("callgrind.out.%p");
        cmd.args(["valgrind", "--tool=callgrind", "--dump-instr=no"]).arg(format!("--callgrind-out-file={}", out.display()));
    }
    let mut p = Proc(
        cmd.args([&a.server, "--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--loadmodule", &a.module])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("taskset redis-server"),
    );
    wait_port(port, "redis-server", &mut p);
    (p, port)
}

/// The release service on core 1, on the Redis at `rport`.
pub(crate) fn start_service(a: &Args, dir: &Path, rport: u16) -> (Proc, u16) {
    start_service_in(a, dir, rport, &[], &[])
}

/// [`start_service`] run by `wrapper` (e.g. `valgrind --tool=callgrind …`),
/// with the variables `env` added.
pub(crate) fn start_service_in(a: &Args, dir: &Path, rport: u16, wrapper: &[String], env: &[(&str, &str)]) -> (Proc, u16) {
    let (gport, hport) = (free_port(), free_port());
    let mut p = Proc(
        Command::new("taskset")
            .args(["-c", "1"])
            .args(wrapper)
            .arg(&a.service)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs([
                ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
                ("REDIS_URL", format!("127.0.0.1:{rport}")),
                ("REDIS_TIMEOUT", "5s".to_owned()),
                ("GRPC_HOST", "127.0.0.1".to_owned()),
                ("GRPC_PORT", gport.to_string()),
                ("HOST", "127.0.0.1".to_owned()),
                ("PORT", hport.to_string()),
                ("DEBUG_HOST", "127.0.0.1".to_owned()),
                ("DEBUG_PORT", "0".to_owned()),
                ("RUNTIME_ROOT", dir.join("runtime").to_string_lossy().into_owned()),
                ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
                ("RUNTIME_APPDIRECTORY", "config".to_owned()),
                // statsd is on unless set off (envoyproxy/ratelimit's default): no sink here
                ("USE_STATSD", "false".to_owned()),
            ])
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("taskset service"),
    );
    wait_port(gport, "redis-ratelimit-service", &mut p);
    (p, gport)
}

/// Puts every thread of each process of `pids` at SCHED_FIFO priority 10
/// (`on`), or back at SCHED_OTHER: the load generator and Redis during the
/// latency cells, so that the machine's other tasks (kernel workers, DAMON)
/// do not delay the harness; the service stays at normal priority. Threads
/// started later by a thread at SCHED_FIFO inherit it (the pacer). Err: the
/// first refusal (EPERM without CAP_SYS_NICE).
pub(crate) fn set_fifo(pids: &[u32], on: bool) -> Result<(), String> {
    for pid in pids {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| format!("/proc/{pid}/task: {e}"))?;
        for t in tasks.flatten() {
            let Ok(tid) = t.file_name().to_string_lossy().parse::<i32>() else { continue };
            set_policy(tid, on).map_err(|e| format!("sched_setscheduler({tid}): {e}"))?;
        }
    }
    Ok(())
}

/// Thread `tid` (0: this one) at SCHED_FIFO priority 10 (`fifo`), or at
/// SCHED_OTHER.
pub(crate) fn set_policy(tid: i32, fifo: bool) -> std::io::Result<()> {
    let (policy, prio) = if fifo { (libc::SCHED_FIFO, 10) } else { (libc::SCHED_OTHER, 0) };
    let param = libc::sched_param { sched_priority: prio };
    // SAFETY: a plain system call on a thread id with a valid sched_param.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Timer wake-ups of this core: a thread (at SCHED_FIFO 10 when `fifo`)
/// sleeps 100 µs again and again for `secs`; (sleeps, late by over 1 ms,
/// late by over 2 ms, the latest in ns). What the machine alone does to a
/// waiting task, at each priority.
pub(crate) fn wake_probe(secs: f64, fifo: bool) -> (u64, u64, u64, u64) {
    std::thread::spawn(move || {
        // (set either way: a thread inherits its creator's policy)
        if set_policy(0, fifo).is_err() {
            return (0, 0, 0, 0);
        }
        let (mut n, mut over1, mut over2, mut max) = (0, 0, 0, 0);
        let end = Instant::now() + Duration::from_secs_f64(secs);
        while Instant::now() < end {
            let t = Instant::now();
            std::thread::sleep(Duration::from_micros(100));
            let late = t.elapsed().as_nanos().saturating_sub(100_000) as u64;
            n += 1;
            over1 += u64::from(late > 1_000_000);
            over2 += u64::from(late > 2_000_000);
            max = max.max(late);
        }
        (n, over1, over2, max)
    })
    .join()
    .unwrap_or((0, 0, 0, 0))
}

/// Pins every thread of this process (and the threads it starts later) to `cpus`.
pub(crate) fn pin_self(cpus: &str) {
    let st = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("taskset -a -p");
    assert!(st.success(), "taskset -a -p -c {cpus}: {st}");
}
