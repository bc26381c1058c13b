//! The service's log, as envoyproxy/ratelimit writes its own with logrus:
//! `LOG_LEVEL` (default `WARN`; logrus's names, any case: `trace`,
//! `debug`, `info`, `warn`/`warning`, `error`, `fatal`, `panic`) drops the
//! lines below it; `LOG_FORMAT=json` writes each line as a JSON object with
//! upstream's field names (`@message`, `@timestamp` in RFC 3339 with
//! nanoseconds, `level`), otherwise logrus's text
//! (`time="…" level=warning msg="…"`). Lines go to stderr, one write each.
//! Only the process's events are logged (startup, configurations loaded or
//! refused, xDS, Redis retries, SIGTERM): never a request.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};

/// A line's level, lowest first (logrus's, `trace` and `panic` read as
/// the nearest: `debug`, `fatal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Details of the events.
    Debug = 0,
    /// The events (a configuration loaded, SIGTERM).
    Info = 1,
    /// What needs a look (a retry, the listening addresses).
    Warn = 2,
    /// A refusal (a configuration that does not load).
    Error = 3,
    /// The process exits.
    Fatal = 4,
}

impl Level {
    /// The name logrus writes.
    pub fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warning",
            Level::Error => "error",
            Level::Fatal => "fatal",
        }
    }
}

/// `LOG_LEVEL` and `LOG_FORMAT`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogSettings {
    /// The lowest level written.
    pub level: Level,
    /// JSON rather than text.
    pub json: bool,
}

impl Default for LogSettings {
    fn default() -> LogSettings {
        LogSettings { level: Level::Warn, json: false }
    }
}

impl LogSettings {
    /// `LOG_LEVEL` (empty: `WARN`) and `LOG_FORMAT` (empty: `text`); an
    /// unknown value is the error, naming its variable.
    pub fn parse(level: &str, format: &str) -> Result<LogSettings, String> {
        let level = match level.to_ascii_lowercase().as_str() {
            "" | "warn" | "warning" => Level::Warn,
            "trace" | "debug" => Level::Debug,
            "info" => Level::Info,
            "error" => Level::Error,
            "fatal" | "panic" => Level::Fatal,
            _ => {
                return Err(format!(
                    "LOG_LEVEL={level:?}: not a valid logrus Level (trace, debug, info, warn, error, fatal or panic)"
                ))
            }
        };
        let json = match format.to_ascii_lowercase().as_str() {
            "" | "text" => false,
            "json" => true,
            _ => return Err(format!("LOG_FORMAT={format:?}: text or json")),
        };
        Ok(LogSettings { level, json })
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);
static JSON: AtomicBool = AtomicBool::new(false);

/// Makes `s` the process's log settings (the binary's `main`, once).
pub fn init(s: LogSettings) {
    LEVEL.store(s.level as u8, Relaxed);
    JSON.store(s.json, Relaxed);
}

/// Whether a line of `level` is written.
pub fn enabled(level: Level) -> bool {
    level as u8 >= LEVEL.load(Relaxed)
}

/// Writes `msg` at `level` if [`enabled`].
pub fn write(level: Level, msg: &str) {
    if !enabled(level) {
        return;
    }
    let line = render(level, msg, JSON.load(Relaxed), std::time::SystemTime::now());
    // one write of the whole line: lines of several tasks never interleave
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// One line, newline included.
pub fn render(level: Level, msg: &str, json: bool, at: std::time::SystemTime) -> String {
    if json {
        // logrus's JSON: the keys sorted (Go's map encoding), as upstream renames them
        let (m, t) = (serde_json::Value::from(msg), serde_json::Value::from(rfc3339(at, true)));
        format!("{{\"@message\":{m},\"@timestamp\":{t},\"level\":\"{}\"}}\n", level.name())
    } else {
        format!("time=\"{}\" level={} msg={}\n", rfc3339(at, false), level.name(), quoted(msg))
    }
}

/// logrus's text value: as is when it has only `[A-Za-z0-9-._/@^+]`,
/// otherwise quoted as Go's `%q` does (escapes for `"`, `\` and controls).
fn quoted(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-._/@^+".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `at` in UTC as RFC 3339 (`2006-01-02T15:04:05Z`), with Go's
/// `RFC3339Nano` fraction (trailing zeros dropped) when `nanos`.
pub fn rfc3339(at: std::time::SystemTime, nanos: bool) -> String {
    let d = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // days since 1970-01-01 to a civil date (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let mut s = format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60);
    if nanos && d.subsec_nanos() != 0 {
        let frac = format!("{:09}", d.subsec_nanos());
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push('Z');
    s
}

/// `log!(Level::Info, "…", args)`: [`write`] of the formatted message,
/// formatted only when the level is enabled.
macro_rules! log {
    ($level:expr, $($arg:tt)*) => {
        if $crate::logger::enabled($level) {
            $crate::logger::write($level, &format!($($arg)*));
        }
    };
}
