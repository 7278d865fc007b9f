//! The embedded mode's home directory.

use std::path::PathBuf;

/// `--home`/`FLOWER_HOME`, else `$XDG_DATA_HOME/flower`, else `~/.local/share/flower`.
pub fn resolve(given: Option<PathBuf>) -> PathBuf {
    if let Some(h) = given {
        return h;
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("flower");
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(h) => PathBuf::from(h).join(".local/share/flower"),
        None => PathBuf::from(".flower-home"),
    }
}
