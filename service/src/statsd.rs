//! The statsd and DogStatsD sinks (`USE_STATSD`, the default, and
//! `USE_DOG_STATSD`): every `STATS_FLUSH_INTERVAL`, each counter's change
//! since the last flush that reached the sink (nothing for a counter that
//! did not move), under envoyproxy/ratelimit's statsd names
//! ([`Metrics::for_each_counter`]), and one timer line per
//! `ShouldRateLimit` call in whole milliseconds
//! (`ratelimit_server.ShouldRateLimit.response_time`).
//!
//! * statsd, as gostats writes it: `name[.__tag=value…]:delta|c`,
//!   `name[…]:ms|ms`, one per line; `EXTRA_TAGS` in the name; TCP
//!   (`STATSD_PROTOCOL=tcp`, the default; a lost connection is made again
//!   at the next flush) or UDP (datagrams of at most 1,432 bytes, whole
//!   lines).
//! * DogStatsD, as envoyproxy/ratelimit's sink writes it: the tags out of
//!   the name (`EXTRA_TAGS` first), then the first mogrifier whose pattern
//!   matches renames it and adds its tags: `name:delta|c|#k:v,…` over UDP.
//!
//! A flush that cannot be sent (no connection) is not lost: the counters
//! are sent as changes since the last flush that was.

use std::collections::HashMap;
use std::sync::Arc;

use redis_ratelimit_client::Connection;
use regex::Regex;
use tokio::io::AsyncWriteExt;

use crate::metrics::{Metrics, RESPONSE_TIME};
use crate::service::Service;
use crate::settings::{Settings, StatsSink};

/// A UDP datagram's largest payload (gostats's and datadog-go's, for a 1,500-byte MTU).
pub const UDP_PAYLOAD: usize = 1432;

/// A compiled DogStatsD mogrifier.
struct Mogrifier {
    re: Regex,
    name: String,
    tags: Vec<(String, String)>,
}

/// `$0`, `$1`… of `tmpl` replaced by the groups of `caps` (a number beyond
/// them stays as written), as envoyproxy/ratelimit's mogrifiers expand them.
fn expand(tmpl: &str, caps: &regex::Captures<'_>) -> String {
    let mut out = String::with_capacity(tmpl.len());
    let b = tmpl.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' {
            let j = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if j > 0 {
                let digits = &tmpl[i + 1..i + 1 + j];
                match digits.parse::<usize>().ok().filter(|&n| n < caps.len()) {
                    Some(n) => out.push_str(caps.get(n).map_or("", |m| m.as_str())),
                    None => {
                        out.push('$');
                        out.push_str(digits);
                    }
                }
                i += 1 + j;
                continue;
            }
        }
        let c = tmpl[i..].chars().next().unwrap_or('\u{FFFD}');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// How one flush's lines are written.
enum Format {
    /// gostats: the tags in the name (`.__k=v`).
    Statsd { suffix: String },
    /// datadog-go: the tags after `|#`.
    Dog { tags: Vec<String>, mogrifiers: Vec<Mogrifier> },
}

impl Format {
    fn of(settings: &Settings) -> Option<Format> {
        match &settings.stats_sink {
            StatsSink::Statsd { .. } => {
                Some(Format::Statsd { suffix: settings.extra_tags.iter().map(|(k, v)| format!(".__{k}={v}")).collect() })
            }
            StatsSink::DogStatsd { mogrifiers, .. } => Some(Format::Dog {
                tags: settings.extra_tags.iter().map(|(k, v)| format!("{k}:{v}")).collect(),
                mogrifiers: mogrifiers
                    .iter()
                    .filter_map(|m| {
                        // checked at startup
                        Regex::new(&m.pattern).ok().map(|re| Mogrifier { re, name: m.name.clone(), tags: m.tags.clone() })
                    })
                    .collect(),
            }),
            _ => None,
        }
    }

    /// The line of `name` with `value` of `kind` (`c`, `ms`).
    fn line(&self, out: &mut String, name: &str, value: u64, kind: &str) {
        use std::fmt::Write as _;
        match self {
            Format::Statsd { suffix } => {
                let _ = writeln!(out, "{name}{suffix}:{value}|{kind}");
            }
            Format::Dog { tags, mogrifiers } => {
                let mut all = tags.clone();
                let mut name = name.to_owned();
                if let Some((m, caps)) = mogrifiers.iter().find_map(|m| m.re.captures(&name).map(|c| (m, c))) {
                    let renamed = expand(&m.name, &caps);
                    all.extend(m.tags.iter().map(|(k, v)| format!("{k}:{}", expand(v, &caps))));
                    name = renamed;
                }
                if all.is_empty() {
                    let _ = writeln!(out, "{name}:{value}|{kind}");
                } else {
                    let _ = writeln!(out, "{name}:{value}|{kind}|#{}", all.join(","));
                }
            }
        }
    }
}

/// The lines of everything that changed since `last` (counters) and
/// `last_ms` (response times); the new totals to keep once they are sent.
fn lines(
    m: &Metrics,
    f: &Format,
    last: &HashMap<String, u64>,
    last_ms: &HashMap<u64, u64>,
) -> (String, HashMap<String, u64>, HashMap<u64, u64>) {
    let mut out = String::new();
    let mut now = HashMap::with_capacity(last.len());
    m.for_each_counter(|name, v| {
        let delta = v.saturating_sub(last.get(name).copied().unwrap_or(0));
        if delta != 0 {
            f.line(&mut out, name, delta, "c");
        }
        now.insert(name.to_owned(), v);
    });
    let mut now_ms = HashMap::new();
    for (ms, n) in m.response_ms() {
        for _ in 0..n.saturating_sub(last_ms.get(&ms).copied().unwrap_or(0)) {
            f.line(&mut out, RESPONSE_TIME, ms, "ms");
        }
        now_ms.insert(ms, n);
    }
    (out, now, now_ms)
}

/// Where the lines go.
enum Conn {
    Tcp(String, Option<tokio::net::TcpStream>),
    Udp(String, Option<tokio::net::UdpSocket>),
}

impl Conn {
    async fn send(&mut self, text: &str) -> std::io::Result<()> {
        match self {
            Conn::Tcp(addr, s) => {
                if s.is_none() {
                    *s = Some(tokio::net::TcpStream::connect(addr.as_str()).await?);
                }
                let r = match s.as_mut() {
                    Some(c) => c.write_all(text.as_bytes()).await,
                    None => Ok(()),
                };
                if r.is_err() {
                    *s = None;
                }
                r
            }
            Conn::Udp(addr, s) => {
                if s.is_none() {
                    let sock = tokio::net::UdpSocket::bind("0.0.0.0:0").await?;
                    sock.connect(addr.as_str()).await?;
                    *s = Some(sock);
                }
                let Some(sock) = s.as_ref() else { return Ok(()) };
                // whole lines, at most UDP_PAYLOAD bytes a datagram (a longer line alone)
                let mut buf = String::with_capacity(UDP_PAYLOAD);
                for line in text.split_inclusive('\n') {
                    if !buf.is_empty() && buf.len() + line.len() > UDP_PAYLOAD {
                        sock.send(buf.as_bytes()).await?;
                        buf.clear();
                    }
                    buf.push_str(line);
                }
                if !buf.is_empty() {
                    sock.send(buf.as_bytes()).await?;
                }
                Ok(())
            }
        }
    }
}

/// Starts the flusher of `USE_STATSD` / `USE_DOG_STATSD` (none for the other sinks).
pub fn spawn<C: Connection>(svc: Arc<Service<C>>) -> Option<tokio::task::JoinHandle<()>> {
    let settings = svc.settings();
    let format = Format::of(settings)?;
    let mut conn = match &settings.stats_sink {
        StatsSink::Statsd { addr, udp: false } => Conn::Tcp(addr.clone(), None),
        StatsSink::Statsd { addr, udp: true } | StatsSink::DogStatsd { addr, .. } => Conn::Udp(addr.clone(), None),
        _ => return None,
    };
    let every = settings.stats_flush_interval;
    Some(tokio::spawn(async move {
        let (mut last, mut last_ms) = (HashMap::new(), HashMap::new());
        let mut warned = false;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (text, now, now_ms) = lines(svc.metrics(), &format, &last, &last_ms);
            if text.is_empty() {
                continue;
            }
            match conn.send(&text).await {
                Ok(()) => {
                    (last, last_ms, warned) = (now, now_ms, false);
                }
                Err(e) if !warned => {
                    log!(crate::logger::Level::Warn, "stats: cannot send to the statsd sink: {e} (kept for the next flush)");
                    warned = true;
                }
                Err(_) => {}
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mogrifier_expansion_keeps_what_has_no_group() {
        let re = Regex::new(r"^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$").unwrap();
        let caps = re.captures("ratelimit.service.rate_limit.d.k_v.total_hits").unwrap();
        assert_eq!(expand("rl.$3", &caps), "rl.total_hits");
        assert_eq!(expand("domain:$1,x:$5,$", &caps), "domain:d,x:$5,$");
        assert_eq!(expand("$0", &caps), "ratelimit.service.rate_limit.d.k_v.total_hits");
    }
}
