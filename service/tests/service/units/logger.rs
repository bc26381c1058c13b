//! The log's lines: logrus's text and upstream's JSON fields, dates, and
//! `LOG_LEVEL` / `LOG_FORMAT` read as logrus names them.

use redis_ratelimit_service::logger::{render, rfc3339, Level, LogSettings};

#[test]
fn dates_and_lines() {
    let t = std::time::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 120_000_000);
    assert_eq!(rfc3339(t, true), "2023-11-14T22:13:20.12Z");
    assert_eq!(rfc3339(t, false), "2023-11-14T22:13:20Z");
    assert_eq!(rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400), false), "2000-02-29T00:00:00Z");
    assert_eq!(
        render(Level::Warn, "a \"b\"", false, t),
        "time=\"2023-11-14T22:13:20Z\" level=warning msg=\"a \\\"b\\\"\"\n"
    );
    assert_eq!(render(Level::Info, "ok", false, t), "time=\"2023-11-14T22:13:20Z\" level=info msg=ok\n");
    let v: serde_json::Value = serde_json::from_str(&render(Level::Error, "x\ny", true, t)).unwrap();
    assert_eq!(v["@message"], "x\ny");
    assert_eq!(v["level"], "error");
    assert_eq!(v["@timestamp"], "2023-11-14T22:13:20.12Z");
}

#[test]
fn settings_are_logrus_names() {
    assert_eq!(LogSettings::parse("", "").unwrap(), LogSettings::default());
    assert_eq!(LogSettings::parse("Debug", "JSON").unwrap(), LogSettings { level: Level::Debug, json: true });
    assert_eq!(LogSettings::parse("warning", "text").unwrap().level, Level::Warn);
    assert!(LogSettings::parse("loud", "").unwrap_err().contains("LOG_LEVEL"));
    assert!(LogSettings::parse("info", "xml").unwrap_err().contains("LOG_FORMAT"));
}
