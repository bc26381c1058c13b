//! No setting of envoyproxy/ratelimit silently ignored: every name of
//! `service/upstream-settings.tsv` (the 114 envconfig names of its
//! `src/settings/settings.go`) has a status in `upstream_settings::UPSTREAM`,
//! and the status is what the code does: a "read" name is a field the
//! settings read, a refused one set to a value it does not accept stops the
//! start naming it, an accepted one parses as its type and is reported at
//! startup. docs/envoy.md's table is generated from the same list
//! (`RL_UPDATE_DOCS=1` rewrites it). No server needed.

use std::collections::HashMap;
use std::path::PathBuf;

use redis_ratelimit_service::settings::Settings;
use redis_ratelimit_service::upstream_settings::{describe, status, Accept, Kind, Status, UPSTREAM};

/// This service's own variables (not envoyproxy/ratelimit's).
/// (`STATSD_PROTOCOL` is gostats's, which envoyproxy/ratelimit's statsd client reads.)
const OWN: &[&str] = &[
    "PANIC_MODE",
    "PANIC_INSTANCES",
    "RUNTIME_POLL_INTERVAL",
    "STATSD_PROTOCOL",
    "GRPC_SERVER_TLS_CA_CERT",
    "USAGE_REPORT_DOMAINS",
];

/// Refused names whose upstream default is itself refused (a default this
/// service cannot honour: the docs say so).
const DEFAULT_REFUSED: &[&str] = &[];

struct Row {
    name: String,
    go_type: String,
    default: String,
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn upstream_list() -> Vec<Row> {
    let text = std::fs::read_to_string(manifest().join("upstream-settings.tsv")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 3, "name, type, default: {l:?}");
            Row { name: f[0].to_owned(), go_type: f[1].to_owned(), default: f[2].to_owned() }
        })
        .collect()
}

fn settings(vars: &[(&str, &str)]) -> Result<Settings, String> {
    Settings::from_map(&vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<HashMap<_, _>>())
}

/// A value of `kind` that is not the default `default`, and parses.
fn other_value(kind: Kind, default: &str) -> &'static str {
    match kind {
        Kind::Str => "x-other",
        Kind::Bool if default == "true" => "false",
        Kind::Bool => "true",
        Kind::Int => "17",
        Kind::Duration => "17s",
        Kind::Float => "0.25",
        Kind::List => "a,b",
        Kind::Map => "a:b",
    }
}

/// A value refused by `ok`.
fn refused_value(ok: Accept) -> &'static str {
    match ok {
        Accept::Values(_) => "x-unsupported",
        Accept::False => "true",
        Accept::Duration(_) => "17s",
        Accept::Int(_) => "17",
    }
}

#[test]
fn every_upstream_setting_is_read_refused_or_accepted_with_a_reason() {
    let list = upstream_list();
    assert_eq!(list.len(), 114, "settings.go's envconfig names");
    let names: Vec<&str> = list.iter().map(|r| r.name.as_str()).collect();
    let table: Vec<&str> = UPSTREAM.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, table, "upstream_settings::UPSTREAM lists settings.go's names in its order");
    let read = Settings::read_names();
    let mut failures = Vec::new();
    for row in &list {
        let name = row.name.as_str();
        let st = status(name).unwrap();
        match st {
            Status::Same | Status::Differs(_) => {
                if !read.contains(&name) {
                    failures.push(format!("{name}: said to be read, but the settings do not read it"));
                }
                if let Status::Differs(how) = st {
                    assert!(!how.is_empty(), "{name}: how it differs");
                }
            }
            Status::Refused(ok, why) => {
                assert!(!why.is_empty(), "{name}: why it is refused");
                let v = refused_value(ok);
                match settings(&[(name, v)]) {
                    Err(e) if e.contains(name) => {}
                    other => failures.push(format!("{name}={v}: not refused by name ({:?})", other.map(|_| ()))),
                }
                // refused only when set to a non-default value
                let default_ok = ok.accepts(&row.default) && settings(&[(name, &row.default)]).is_ok();
                if default_ok == DEFAULT_REFUSED.contains(&name) {
                    failures.push(format!("{name}={:?}: upstream's default, accepted: {default_ok}", row.default));
                }
            }
            Status::Accepted(kind, why) => {
                assert!(!why.is_empty(), "{name}: why accepting it is safe");
                if read.contains(&name) {
                    failures.push(format!("{name}: accepted without effect, yet read"));
                }
                if !kind.go_type().contains(&row.go_type.as_str()) {
                    failures.push(format!("{name}: {kind:?} for Go's {}", row.go_type));
                }
                let v = other_value(kind, &row.default);
                match settings(&[(name, v)]) {
                    Ok(s) if s.notices.iter().any(|n| n.starts_with(&format!("{name}="))) => {}
                    other => failures.push(format!("{name}={v}: not accepted with a notice ({other:?})")),
                }
                if !matches!(kind, Kind::Str | Kind::List) && settings(&[(name, "x")]).is_ok() {
                    failures.push(format!("{name}=x: a {kind:?} that does not parse, accepted"));
                }
            }
        }
    }
    // and nothing read that is neither upstream's nor this service's own
    for n in read {
        if status(n).is_none() && !OWN.contains(n) {
            failures.push(format!("{n}: read, but neither envoyproxy/ratelimit's nor listed as this service's own"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const BEGIN: &str =
    "<!-- settings table: generated from service/upstream-settings.tsv and service/src/upstream_settings.rs by \
                     tests/service/settings_table.rs (RL_UPDATE_DOCS=1 rewrites it) -->";
const END: &str = "<!-- end of the settings table -->";

fn generated_table() -> String {
    let list = upstream_list();
    let count = |f: fn(&Status) -> bool| UPSTREAM.iter().filter(|(_, s)| f(s)).count();
    let mut out = format!(
        "{BEGIN}\n\nenvoyproxy/ratelimit reads {} settings; here {} are read with the same meaning, {} read with a \
         difference, {} refused at startup unless set to their accepted values, {} accepted without effect.\n\n\
         | variable | envoyproxy/ratelimit's default | here |\n|---|---|---|\n",
        list.len(),
        count(|s| matches!(s, Status::Same)),
        count(|s| matches!(s, Status::Differs(_))),
        count(|s| matches!(s, Status::Refused(..))),
        count(|s| matches!(s, Status::Accepted(..))),
    );
    for row in &list {
        let default = if row.default.is_empty() { String::new() } else { format!("`{}`", row.default) };
        let here = describe(status(&row.name).unwrap()).replace('|', "\\|");
        out.push_str(&format!("| `{}` | {default} | {here} |\n", row.name));
    }
    out.push('\n');
    out.push_str(END);
    out
}

#[test]
fn docs_envoy_md_has_the_settings_table() {
    let path = manifest().join("../docs/envoy.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let want = generated_table();
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/envoy.md: no settings table between its markers");
    };
    let have = &doc[b..e + END.len()];
    if have != want {
        if std::env::var("RL_UPDATE_DOCS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, format!("{}{want}{}", &doc[..b], &doc[e + END.len()..])).unwrap();
            return;
        }
        panic!("docs/envoy.md's settings table is not the generated one (RL_UPDATE_DOCS=1 rewrites it):\n{want}");
    }
}
