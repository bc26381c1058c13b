//! The configuration directory (`RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY`/
//! `RUNTIME_APPDIRECTORY`): every file under it loaded as one
//! configuration, and reloaded when it changes — a file edited, added or
//! removed, or the root's symlink swapped to another directory (the
//! directory is read through its path each time, so a swap is seen). A
//! configuration that fails to load is refused with its error, and the last
//! good one stays live.

use std::path::Path;
use std::sync::Arc;

use redis_ratelimit_client::Connection;

use crate::config::Config;
use crate::service::Service;
use crate::settings::Settings;

/// The files of a configuration directory: (name, contents), sorted by name.
pub type Files = Vec<(String, String)>;

fn walk(dir: &Path, rel: &str, ignore_dot: bool, out: &mut Files) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if ignore_dot && name.starts_with('.') {
            continue;
        }
        let path = e.path();
        let meta = std::fs::metadata(&path)?; // follows symlinks
        let rel_name = if rel.is_empty() { name } else { format!("{rel}/{name}") };
        if meta.is_dir() {
            walk(&path, &rel_name, ignore_dot, out)?;
        } else if meta.is_file() {
            out.push((rel_name, std::fs::read_to_string(&path)?));
        }
    }
    Ok(())
}

/// Reads every file under `settings.config_dir`.
pub fn read_files(settings: &Settings) -> Result<Files, String> {
    let mut out = Vec::new();
    walk(&settings.config_dir, "", settings.ignore_dot_files, &mut out)
        .map_err(|e| format!("reading {}: {e}", settings.config_dir.display()))?;
    Ok(out)
}

/// Loads the files into one configuration.
pub fn load(settings: &Settings, files: &Files) -> Result<Config, String> {
    Config::load(files.iter().map(|(n, c)| (n.as_str(), c.as_str())), settings.merge_domains).map_err(|e| e.to_string())
}

/// Reads and loads the configuration directory.
pub fn load_dir(settings: &Settings) -> Result<(Config, Files), String> {
    let files = read_files(settings)?;
    let cfg = load(settings, &files)?;
    Ok((cfg, files))
}

/// Checks the directory every `poll_interval` and makes a changed
/// configuration live if it loads; a bad one is logged (`config refused`)
/// and the last good configuration stays. `last` is what is live now.
pub fn spawn_reloader<C: Connection>(svc: Arc<Service<C>>, mut last: Files) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut refused: Option<Files> = None;
        loop {
            tokio::time::sleep(svc.settings().poll_interval).await;
            let files = match read_files(svc.settings()) {
                Ok(f) => f,
                Err(e) => {
                    // a swap in progress, or the directory gone: keep what is live
                    log!(crate::logger::Level::Error, "config refused: {e}");
                    svc.refuse_config(e);
                    continue;
                }
            };
            if files == last || refused.as_ref() == Some(&files) {
                continue;
            }
            match load(svc.settings(), &files) {
                Ok(cfg) => {
                    svc.set_config(cfg);
                    log!(crate::logger::Level::Info, "config loaded: {} file(s)", files.len());
                    last = files;
                    refused = None;
                }
                Err(e) => {
                    log!(crate::logger::Level::Error, "config refused: {e}; the last good configuration stays live");
                    svc.refuse_config(e);
                    refused = Some(files);
                }
            }
        }
    })
}
