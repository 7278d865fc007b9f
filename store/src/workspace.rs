//! A job's workspace on object storage: content-addressed blobs
//! (`blobs/<sha256>`, shared by every job) and a manifest per job
//! (`jobs/<id>/workspace/manifest.json`, path → blob).
//!
//! A task checks out the current manifest into its own working directory; when
//! it ends, what it changed (outside `.flower/`) becomes a [`Changeset`] the
//! job's owner applies in completion order. Two tasks that changed the same
//! file from the same base: the later wins and the conflict is reported.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use flower_model::{JobId, TaskId};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, path::Path as ObjPath};
use serde::{Deserialize, Serialize};

use crate::localfs::{self, FileRef, Manifest};
use crate::workbench::{MOUNT, blocking, obj_err};
use crate::{Result, StoreError};

/// One changed path: what the task started from and what it left
/// (`None`: absent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub before: Option<FileRef>,
    pub after: Option<FileRef>,
}

/// Changes of one task, by path.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Changeset {
    pub changes: BTreeMap<String, Change>,
}

impl Changeset {
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

#[derive(Clone)]
pub struct Workspace {
    store: Arc<dyn ObjectStore>,
    job: JobId,
    manifest_key: ObjPath,
}

/// A workspace over `runtime.workspace_limit`, refused before anything is uploaded.
fn too_large(size: u64, limit: u64) -> StoreError {
    StoreError::TooLarge { what: "the workspace", size, limit, setting: "runtime.workspace_limit" }
}

fn blob_key(sha: &str) -> ObjPath {
    ObjPath::from(format!("blobs/{sha}"))
}

impl Workspace {
    pub fn new(store: Arc<dyn ObjectStore>, job: JobId) -> Self {
        Self { manifest_key: ObjPath::from(format!("jobs/{job}/workspace/manifest.json")), job, store }
    }

    fn changeset_key(&self, task: TaskId, attempt: u32) -> ObjPath {
        ObjPath::from(format!("jobs/{}/changesets/{task}-{attempt}.json", self.job))
    }

    /// Store a task attempt's changeset for the job's owner to apply.
    pub async fn put_changeset(&self, task: TaskId, attempt: u32, cs: &Changeset) -> Result<()> {
        let body = serde_json::to_vec(cs).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.store.put(&self.changeset_key(task, attempt), PutPayload::from(body)).await.map_err(obj_err)?;
        Ok(())
    }

    /// The changeset a task attempt left, if it changed anything.
    pub async fn changeset(&self, task: TaskId, attempt: u32) -> Result<Option<Changeset>> {
        match self.store.get(&self.changeset_key(task, attempt)).await {
            Ok(got) => {
                let bytes = got.bytes().await.map_err(obj_err)?;
                serde_json::from_slice(&bytes).map(Some).map_err(|e| StoreError::Corrupt(e.to_string()))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(obj_err(e)),
        }
    }

    /// Upload a local directory as the job's workspace; refuses a tree larger
    /// than `limit` bytes before uploading anything. `.flower/` is never taken.
    pub async fn upload_dir(&self, dir: &Path, limit: u64) -> Result<Manifest> {
        let d = dir.to_path_buf();
        let manifest = blocking(move || localfs::scan(&d, &[MOUNT])).await?;
        let total: u64 = manifest.values().map(|f| f.size).sum();
        if total > limit {
            return Err(too_large(total, limit));
        }
        self.put_blobs(dir, manifest.iter().map(|(p, f)| (p.as_str(), f))).await?;
        self.save(&manifest).await?;
        Ok(manifest)
    }

    /// Store a workspace given as files (what a client sent over the API);
    /// refuses more than `limit` bytes in total and paths that leave the root.
    pub async fn upload_files(&self, files: Vec<(String, Bytes)>, limit: u64) -> Result<Manifest> {
        let total: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
        if total > limit {
            return Err(too_large(total, limit));
        }
        let mut manifest = Manifest::new();
        for (rel, bytes) in files {
            localfs::check_relative(&rel)?;
            let file = FileRef { sha256: localfs::sha256_hex(&bytes), size: bytes.len() as u64 };
            let key = blob_key(&file.sha256);
            if self.store.head(&key).await.is_err() {
                self.store.put(&key, PutPayload::from(bytes)).await.map_err(obj_err)?;
            }
            manifest.insert(rel, file);
        }
        self.save(&manifest).await?;
        Ok(manifest)
    }

    async fn put_blobs<'a>(&self, dir: &Path, files: impl Iterator<Item = (&'a str, &'a FileRef)>) -> Result<()> {
        for (rel, file) in files {
            let key = blob_key(&file.sha256);
            if self.store.head(&key).await.is_ok() {
                continue;
            }
            crate::objects::put_file(self.store.as_ref(), &key, &dir.join(rel)).await?;
        }
        Ok(())
    }

    /// The current manifest (empty when the job has no workspace).
    pub async fn load(&self) -> Result<Manifest> {
        match self.store.get(&self.manifest_key).await {
            Ok(got) => {
                let bytes = got.bytes().await.map_err(obj_err)?;
                serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(Manifest::new()),
            Err(e) => Err(obj_err(e)),
        }
    }

    pub async fn save(&self, manifest: &Manifest) -> Result<()> {
        let body = serde_json::to_vec(manifest).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.store.put(&self.manifest_key, PutPayload::from(body)).await.map_err(obj_err)?;
        Ok(())
    }

    /// The content of one workspace file in the current state.
    pub async fn read(&self, rel: &str) -> Result<Bytes> {
        let manifest = self.load().await?;
        let file = manifest.get(rel).ok_or_else(|| StoreError::NotFound(rel.to_string()))?;
        self.store.get(&blob_key(&file.sha256)).await.map_err(obj_err)?.bytes().await.map_err(obj_err)
    }

    /// Write the files of `manifest` into `dir`.
    pub async fn checkout(&self, manifest: &Manifest, dir: &Path) -> Result<()> {
        for (rel, file) in manifest {
            let bytes =
                self.store.get(&blob_key(&file.sha256)).await.map_err(obj_err)?.bytes().await.map_err(obj_err)?;
            let (d, rel) = (dir.to_path_buf(), rel.clone());
            blocking(move || localfs::write_file(&d, &rel, &bytes)).await?;
        }
        Ok(())
    }

    /// What the task in `dir` changed relative to `base`; new contents are
    /// uploaded as blobs (streamed, in parts when large) so the changeset
    /// can travel by reference. A workspace that has grown past `limit`
    /// bytes is refused before anything is uploaded.
    pub async fn diff(&self, base: &Manifest, dir: &Path, limit: u64) -> Result<Changeset> {
        let d = dir.to_path_buf();
        let now = blocking(move || localfs::scan(&d, &[MOUNT])).await?;
        let total: u64 = now.values().map(|f| f.size).sum();
        if total > limit {
            return Err(too_large(total, limit));
        }
        let mut cs = Changeset::default();
        for (rel, file) in &now {
            if base.get(rel) != Some(file) {
                cs.changes.insert(rel.clone(), Change { before: base.get(rel).cloned(), after: Some(file.clone()) });
            }
        }
        for (rel, file) in base {
            if !now.contains_key(rel) {
                cs.changes.insert(rel.clone(), Change { before: Some(file.clone()), after: None });
            }
        }
        self.put_blobs(dir, cs.changes.iter().filter_map(|(p, c)| c.after.as_ref().map(|f| (p.as_str(), f)))).await?;
        Ok(cs)
    }
}

/// Apply a task's changeset to the job's `current` manifest. Returns the
/// paths that conflicted: changed since the task's start by an
/// earlier-finishing task. The later change wins either way.
pub fn apply(current: &mut Manifest, changeset: &Changeset) -> Vec<String> {
    let mut conflicts = Vec::new();
    for (rel, change) in &changeset.changes {
        let now = current.get(rel);
        if now != change.before.as_ref() && now != change.after.as_ref() {
            conflicts.push(rel.clone());
        }
        match &change.after {
            Some(file) => {
                current.insert(rel.clone(), file.clone());
            }
            None => {
                current.remove(rel);
            }
        }
    }
    conflicts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> FileRef {
        FileRef { sha256: s.into(), size: 1 }
    }

    fn ch(before: Option<&str>, after: Option<&str>) -> Change {
        Change { before: before.map(f), after: after.map(f) }
    }

    #[test]
    fn later_change_wins_and_conflicts_are_reported() {
        let mut current: Manifest = [("a".to_string(), f("1")), ("b".to_string(), f("1"))].into();
        let first = Changeset { changes: [("a".to_string(), ch(Some("1"), Some("2")))].into() };
        let second = Changeset {
            changes: [
                ("a".to_string(), ch(Some("1"), Some("3"))),
                ("b".to_string(), ch(Some("1"), None)),
                ("c".to_string(), ch(None, Some("9"))),
            ]
            .into(),
        };
        assert!(apply(&mut current, &first).is_empty());
        assert_eq!(apply(&mut current, &second), vec!["a".to_string()]);
        assert_eq!(current, [("a".to_string(), f("3")), ("c".to_string(), f("9"))].into());
    }

    #[test]
    fn the_same_change_twice_is_no_conflict() {
        let mut current = Manifest::new();
        let cs = Changeset { changes: [("x".to_string(), ch(None, Some("7")))].into() };
        assert!(apply(&mut current, &cs).is_empty());
        assert!(apply(&mut current, &cs).is_empty());
    }
}
