//! Scanning a local directory tree into a manifest (path → content hash, size).
//! Shared by the workbench mirror and workspace changesets. Only regular files
//! are taken: a symlink is never followed, so a task cannot smuggle a file from
//! outside its directory into object storage by linking to it.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Component, Path};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Result, StoreError};

/// One file's content identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    pub sha256: String,
    pub size: u64,
}

/// Relative path (with `/`) → file.
pub type Manifest = BTreeMap<String, FileRef>;

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A relative path that stays beneath its root: no `..`, no absolute part, not empty.
pub fn check_relative(rel: &str) -> Result<()> {
    let p = Path::new(rel);
    let ok = !rel.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadPath { path: rel.to_string(), why: "not a relative path beneath the root".into() })
    }
}

/// Walk `root` (blocking), skipping the top-level names in `skip`.
pub fn scan(root: &Path, skip: &[&str]) -> Result<Manifest> {
    let mut out = Manifest::new();
    if !root.exists() {
        return Ok(out);
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd =
            std::fs::read_dir(&dir).map_err(|e| StoreError::backend_in(format_args!("read {}", dir.display()), e))?;
        for item in rd {
            let item = item.map_err(StoreError::backend_from)?;
            let path = item.path();
            let rel = match path.strip_prefix(root) {
                Ok(r) => r.to_string_lossy().replace('\\', "/"),
                Err(_) => continue,
            };
            if dir == root && skip.contains(&rel.as_str()) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).map_err(StoreError::backend_from)?;
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                out.insert(rel, hash_file(&path)?);
            }
        }
    }
    Ok(out)
}

fn hash_file(path: &Path) -> Result<FileRef> {
    let mut f =
        std::fs::File::open(path).map_err(|e| StoreError::backend_in(format_args!("open {}", path.display()), e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(StoreError::backend_from)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok(FileRef { sha256: hex::encode(hasher.finalize()), size })
}

/// Write `bytes` at `root/rel`, creating parents (blocking).
pub fn write_file(root: &Path, rel: &str, bytes: &[u8]) -> Result<()> {
    check_relative(rel)?;
    let path = root.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(StoreError::backend_from)?;
    }
    std::fs::write(&path, bytes).map_err(|e| StoreError::backend_in(format_args!("write {}", path.display()), e))
}
