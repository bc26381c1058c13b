//! `LOG_LEVEL` and `LOG_FORMAT`, on the real binary (its stderr): JSON
//! lines with upstream's fields (`@message`, `@timestamp`, `level`),
//! logrus's text otherwise, the lines below the level dropped, and an
//! unknown level or format refused at startup, naming the variable.

use crate::support::*;

const CONFIG: &str = "domain: basic\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// The binary on Redis at `rport` with `extra`, stderr to a file; its
/// stderr once SIGTERM has ended it (exit 0), or once it exited alone.
fn run(name: &str, rport: u16, extra: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(format!("rl-svc-log-{}-{name}-{}", std::process::id(), port()));
    let _ = std::fs::remove_dir_all(&dir);
    write(&dir.join("rl/config/config.yaml"), CONFIG);
    let (grpc, http) = (port(), port());
    let log = dir.join("stderr.log");
    let mut child = Proc(
        crate::lifecycle::service_command(&dir, rport, grpc, http, extra)
            // an accepted-without-effect variable: its notice is a warning
            .env("REDIS_POOL_SIZE", "4")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start the service binary"),
    );
    let mut status = None;
    wait_for("the service's listener, or its exit", Duration::from_secs(60), || {
        status = child.0.try_wait().unwrap();
        status.is_some() || std::net::TcpStream::connect(("127.0.0.1", http)).is_ok()
    });
    if status.is_none() {
        sig(child.0.id(), libc::SIGTERM);
        wait_for("the exit after SIGTERM", server::SHUTDOWN_GRACE + Duration::from_secs(30), || {
            status = child.0.try_wait().unwrap();
            status.is_some()
        });
        assert_eq!(status.unwrap().code(), Some(0));
    }
    let out = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (status.unwrap().code(), out)
}

/// Each line parsed as JSON: (level, message); the timestamp checked.
fn json_lines(out: &str) -> Vec<(String, String)> {
    out.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
            let t = v["@timestamp"].as_str().unwrap_or_else(|| panic!("no @timestamp: {l}"));
            assert!(t.len() >= 20 && t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
            (v["level"].as_str().unwrap().to_owned(), v["@message"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_json_and_log_level() {
    let (_redis, rport) = plain_redis(&[]);
    // info: the startup, the notice and SIGTERM's lines, each a JSON object
    let (_, out) = run("json-info", rport, &[("LOG_FORMAT", "json"), ("LOG_LEVEL", "Info")]);
    let lines = json_lines(&out);
    let has = |level: &str, what: &str| lines.iter().any(|(l, m)| l == level && m.contains(what));
    assert!(has("info", "runtime: "), "{out}");
    assert!(has("warning", "listening: grpc 127.0.0.1:"), "{out}");
    assert!(has("warning", "REDIS_POOL_SIZE=\"4\" accepted without effect"), "{out}");
    assert!(has("info", "SIGTERM: health checks failing"), "{out}");
    // the default, WARN: the warnings without the info lines
    let (_, out) = run("json-warn", rport, &[("LOG_FORMAT", "JSON")]);
    let lines = json_lines(&out);
    assert!(lines.iter().any(|(_, m)| m.contains("listening: ")), "{out}");
    assert!(lines.iter().all(|(l, _)| l == "warning"), "{out}");
    // error: nothing of a service that starts and stops well
    let (_, out) = run("json-error", rport, &[("LOG_FORMAT", "json"), ("LOG_LEVEL", "error")]);
    assert_eq!(out, "", "LOG_LEVEL=error wrote lines");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_text_and_unknown_values_refused() {
    let (_redis, rport) = plain_redis(&[]);
    // logrus's text (unset LOG_FORMAT): time, level, msg quoted
    let (_, out) = run("text", rport, &[]);
    let line = out.lines().find(|l| l.contains("listening: ")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.starts_with("time=\"") && line.contains("Z\" level=warning msg=\"listening: grpc "), "{line}");
    assert!(!out.contains("level=info"), "{out}");
    // a refused value exits 2 naming its variable (the line in logrus's text)
    let (code, out) = run("bad-level", rport, &[("LOG_LEVEL", "loud")]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("level=fatal") && out.contains("LOG_LEVEL=\\\"loud\\\""), "{out}");
    let (code, out) = run("bad-format", rport, &[("LOG_FORMAT", "xml")]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("LOG_FORMAT=\\\"xml\\\""), "{out}");
}
