//! The workbench of a job on object storage: `scripts/`, `artifacts/`,
//! `notes/`, `spill/`. Workers see it as `.flower/` in their working directory
//! (a local mirror synced back after every tool call that may write); the
//! coordinator reads it directly.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use flower_model::JobId;
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, path::Path as ObjPath};

use crate::localfs::{self, Manifest, check_relative};
use crate::{Result, StoreError};

/// The folders every workbench has.
pub const FOLDERS: &[&str] = &["scripts", "artifacts", "notes", "spill"];

/// Name of the mirror inside a task's working directory.
pub const MOUNT: &str = ".flower";

#[derive(Clone)]
pub struct Workbench {
    store: Arc<dyn ObjectStore>,
    prefix: String,
}

/// What one sync did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyncReport {
    pub uploaded: Vec<String>,
    pub deleted: Vec<String>,
}

pub(crate) fn obj_err(e: object_store::Error) -> StoreError {
    match e {
        object_store::Error::NotFound { path, .. } => StoreError::NotFound(path),
        other => StoreError::Backend(other.to_string()),
    }
}

impl Workbench {
    pub fn new(store: Arc<dyn ObjectStore>, job: JobId) -> Self {
        Self { store, prefix: format!("jobs/{job}/workbench") }
    }

    fn key(&self, rel: &str) -> Result<ObjPath> {
        check_relative(rel)?;
        ObjPath::parse(format!("{}/{rel}", self.prefix)).map_err(|e| StoreError::Conflict(e.to_string()))
    }

    /// Where this workbench lives, for humans (`<store>/jobs/<id>/workbench`).
    pub fn location(&self) -> &str {
        &self.prefix
    }

    pub async fn put(&self, rel: &str, bytes: impl Into<Bytes>) -> Result<()> {
        let key = self.key(rel)?;
        self.store.put(&key, PutPayload::from(bytes.into())).await.map_err(obj_err)?;
        Ok(())
    }

    pub async fn get(&self, rel: &str) -> Result<Bytes> {
        let key = self.key(rel)?;
        self.store.get(&key).await.map_err(obj_err)?.bytes().await.map_err(obj_err)
    }

    pub async fn delete(&self, rel: &str) -> Result<()> {
        let key = self.key(rel)?;
        self.store.delete(&key).await.map_err(obj_err)
    }

    /// Every file: (relative path, size), sorted by path.
    pub async fn list(&self) -> Result<Vec<(String, u64)>> {
        let prefix = ObjPath::from(self.prefix.as_str());
        let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await.map_err(obj_err)?;
        let strip = format!("{}/", self.prefix);
        let mut out: Vec<(String, u64)> = metas
            .into_iter()
            .filter_map(|m| m.location.as_ref().strip_prefix(&strip).map(|r| (r.to_string(), m.size)))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Download the whole workbench into `dir` (its `.flower/` mirror) and
    /// return what is there, the base the next [`Workbench::sync`] compares to.
    pub async fn materialize(&self, dir: &Path) -> Result<Manifest> {
        let dir = dir.to_path_buf();
        let mkdirs = dir.clone();
        blocking(move || {
            for f in FOLDERS {
                std::fs::create_dir_all(mkdirs.join(f)).map_err(|e| StoreError::Backend(e.to_string()))?;
            }
            Ok(())
        })
        .await?;
        for (rel, _) in self.list().await? {
            let bytes = self.get(&rel).await?;
            let d = dir.clone();
            blocking(move || localfs::write_file(&d, &rel, &bytes)).await?;
        }
        blocking(move || localfs::scan(&dir, &[])).await
    }

    /// Upload what changed in the mirror since `base` and delete what the task
    /// removed; `base` becomes the new state. Files others added meanwhile are
    /// left alone: only deletions of files this mirror had are propagated.
    pub async fn sync(&self, dir: &Path, base: &mut Manifest) -> Result<SyncReport> {
        let d: PathBuf = dir.to_path_buf();
        let now = blocking(move || localfs::scan(&d, &[])).await?;
        let mut report = SyncReport::default();
        for (rel, file) in &now {
            if base.get(rel) != Some(file) {
                let path = dir.join(rel);
                let bytes = tokio::fs::read(&path).await.map_err(|e| StoreError::Backend(e.to_string()))?;
                self.put(rel, bytes).await?;
                report.uploaded.push(rel.clone());
            }
        }
        for rel in base.keys() {
            if !now.contains_key(rel) {
                match self.delete(rel).await {
                    Ok(()) | Err(StoreError::NotFound(_)) => report.deleted.push(rel.clone()),
                    Err(e) => return Err(e),
                }
            }
        }
        *base = now;
        Ok(report)
    }
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| StoreError::Backend(e.to_string()))?
}
