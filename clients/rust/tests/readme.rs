//! The top-level README's Rust snippet ("In a gateway") is this test's
//! code, as written: the lines between the markers below must be the
//! README's block (the server's URL put for 6379's), and they run here
//! against a real server, giving the headers the README shows.
use rl_test_support as common;

use common::Server;

const README: &str = include_str!("../../../README.md");
const THIS: &str = include_str!("readme.rs");

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let i = text.find(start).unwrap_or_else(|| panic!("no {start:?}")) + start.len();
    let j = text[i..].find(end).unwrap_or_else(|| panic!("no {end:?} after {start:?}")) + i;
    &text[i..j]
}

#[test]
fn the_snippet_is_this_test() {
    let block = between(between(README, "Rust (`clients/rust`", "All four print"), "```rust\n", "```");
    let ours: String = between(THIS, &format!("// {}\n", "BEGIN"), &format!("// {}", "END"))
        .trim_end()
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .map(|l| format!("{}\n", l.replace("url.as_str()", "\"redis://127.0.0.1:6379\"")))
        .collect();
    assert_eq!(ours, block);
}

async fn snippet(url: String) -> Result<redis_ratelimit_client::Decision, Box<dyn std::error::Error>> {
    use redis_ratelimit_client::{headers, make_key, token_bucket, Call, Options, Panic, RateLimit};
    // BEGIN
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
    let rl = RateLimit::new(conn, Options { timeout_ms: 50, ..Options::default() })?;
    let api = rl.limiter(token_bucket("api", 20, 10, 1000)?, Panic::default())?;
    let d = api.limit(&make_key("alice", &["api"])?, Call::default()).await?;
    println!("{} {:?}", if d.allowed { 200 } else { 429 }, headers(&d));
    // END
    Ok(d)
}

#[tokio::test]
async fn the_snippet_gives_the_readme_headers() {
    let s = Server::start(true);
    let d = snippet(s.url()).await.unwrap();
    let h = redis_ratelimit_client::headers(&d);
    let want = [
        ("RateLimit-Policy", "\"api\";q=20;w=2"),
        ("RateLimit", "\"api\";r=19;t=1"),
        ("X-RateLimit-Limit", "20"),
        ("X-RateLimit-Remaining", "19"),
        ("X-RateLimit-Reset", "1"),
    ];
    assert!(d.allowed);
    assert_eq!(h.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>(), want);
}
