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

/// The generated index of a workbench.
pub const INDEX: &str = "INDEX.md";

/// Files kept for the people following a job, never shown to a session:
/// left out of the index and of workers' mirrors, refused to the
/// coordinator's `Read`, never overwritten by a mirror's sync. Users read
/// them like any workbench file (`flower artifacts JOB get …`).
pub const USER_ONLY: &[&str] = &["notes/qa-log.md"];

/// Whether `rel` names a [`USER_ONLY`] file (however it is spelled: `./`,
/// doubled slashes).
pub fn is_user_only(rel: &str) -> bool {
    let norm: Vec<&str> = rel.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    USER_ONLY.iter().any(|u| u.split('/').eq(norm.iter().copied()))
}

/// Entries listed in the index before "… N more" (the seed's default).
pub const INDEX_ENTRIES: usize = 40;

/// Descriptions already read, by (path, version): the index is rendered before
/// every coordinator turn, and unchanged files are not read again.
pub type DescriptionCache = std::collections::HashMap<(String, String), Option<String>>;

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
        other => StoreError::backend_from(other),
    }
}

impl Workbench {
    pub fn new(store: Arc<dyn ObjectStore>, job: JobId) -> Self {
        Self { store, prefix: format!("jobs/{job}/workbench") }
    }

    fn key(&self, rel: &str) -> Result<ObjPath> {
        check_relative(rel)?;
        ObjPath::parse(format!("{}/{rel}", self.prefix)).map_err(|_| StoreError::BadPath {
            path: rel.to_string(),
            why: "not a valid object key (an empty or `.` part)".into(),
        })
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
        Ok(self.list_versions().await?.into_iter().map(|(p, size, _)| (p, size)).collect())
    }

    /// Every file with its size and a version (e-tag, else modification time), sorted by path.
    async fn list_versions(&self) -> Result<Vec<(String, u64, String)>> {
        let prefix = ObjPath::from(self.prefix.as_str());
        let metas: Vec<_> = self.store.list(Some(&prefix)).try_collect().await.map_err(obj_err)?;
        let strip = format!("{}/", self.prefix);
        let mut out: Vec<(String, u64, String)> = metas
            .into_iter()
            .filter_map(|m| {
                let version = m.e_tag.clone().unwrap_or_else(|| m.last_modified.to_rfc3339());
                m.location.as_ref().strip_prefix(&strip).map(|r| (r.to_string(), m.size, version))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Render `INDEX.md`: a section per folder, each entry `path — description
    /// (size)` (the description from a `# desc:` line near the top), at most
    /// `max_entries` entries, then "… N more".
    pub async fn render_index(&self, max_entries: usize) -> Result<String> {
        self.render_index_with(max_entries, &mut DescriptionCache::new()).await
    }

    /// [`Workbench::render_index`], reading only descriptions `cache` lacks.
    pub async fn render_index_with(&self, max_entries: usize, cache: &mut DescriptionCache) -> Result<String> {
        let files: Vec<(String, u64, String)> =
            self.list_versions().await?.into_iter().filter(|(p, _, _)| p != INDEX && !is_user_only(p)).collect();
        let mut out = String::from("# Workbench index\n");
        let mut shown = 0;
        let mut hidden = 0;
        for folder in FOLDERS {
            let prefix = format!("{folder}/");
            let in_folder: Vec<&(String, u64, String)> =
                files.iter().filter(|(p, _, _)| p.starts_with(&prefix)).collect();
            out.push_str(&format!("\n## {folder}/\n"));
            if in_folder.is_empty() {
                out.push_str("(empty)\n");
            }
            for (path, size, version) in in_folder {
                if shown >= max_entries {
                    hidden += 1;
                    continue;
                }
                shown += 1;
                let desc = if *folder == "spill" {
                    None
                } else {
                    let key = (path.clone(), version.clone());
                    match cache.get(&key) {
                        Some(d) => d.clone(),
                        None => {
                            let d = self.description(path, *size).await;
                            cache.insert(key, d.clone());
                            d
                        }
                    }
                };
                match desc {
                    Some(d) => out.push_str(&format!("- {path} — {d} ({})\n", human_size(*size))),
                    None => out.push_str(&format!("- {path} ({})\n", human_size(*size))),
                }
            }
        }
        if hidden > 0 {
            out.push_str(&format!("\n… {hidden} more\n"));
        }
        Ok(out)
    }

    /// The `# desc:` line among a file's first lines, if any.
    async fn description(&self, rel: &str, size: u64) -> Option<String> {
        let key = self.key(rel).ok()?;
        let head = self.store.get_range(&key, 0..size.min(1024)).await.ok()?;
        let text = String::from_utf8_lossy(&head);
        text.lines().take(5).find_map(|l| {
            let l = l.trim_start_matches(['#', '/', '-', ' ', '*', '<', '!']).trim();
            l.strip_prefix("desc:").map(|d| d.trim().chars().take(120).collect())
        })
    }

    /// Regenerate `INDEX.md`; returns it and whether it changed.
    pub async fn refresh_index(&self) -> Result<(String, bool)> {
        self.refresh_index_with(&mut DescriptionCache::new()).await
    }

    /// [`Workbench::refresh_index`] with a description cache kept by the caller.
    pub async fn refresh_index_with(&self, cache: &mut DescriptionCache) -> Result<(String, bool)> {
        self.refresh_index_after(cache, None).await
    }

    /// [`Workbench::refresh_index_with`] by a caller that knows what `INDEX.md`
    /// held when it last read or wrote it (`stored`): an index rendered the
    /// same is not read again (one read less per coordinator turn).
    pub async fn refresh_index_after(
        &self,
        cache: &mut DescriptionCache,
        stored: Option<&str>,
    ) -> Result<(String, bool)> {
        let index = self.render_index_with(INDEX_ENTRIES, cache).await?;
        if stored == Some(index.as_str()) {
            return Ok((index, false));
        }
        let current = match self.get(INDEX).await {
            Ok(b) => Some(String::from_utf8_lossy(&b).into_owned()),
            Err(StoreError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        let changed = current.as_deref() != Some(index.as_str());
        if changed {
            self.put(INDEX, index.clone().into_bytes()).await?;
        }
        Ok((index, changed))
    }

    /// Download the whole workbench into `dir` (its `.flower/` mirror) and
    /// return what is there, the base the next [`Workbench::sync`] compares to.
    pub async fn materialize(&self, dir: &Path) -> Result<Manifest> {
        let dir = dir.to_path_buf();
        let mkdirs = dir.clone();
        blocking(move || {
            for f in FOLDERS {
                std::fs::create_dir_all(mkdirs.join(f)).map_err(StoreError::backend_from)?;
            }
            Ok(())
        })
        .await?;
        for (rel, _) in self.list().await?.into_iter().filter(|(rel, _)| !is_user_only(rel)) {
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
            if base.get(rel) != Some(file) && !is_user_only(rel) {
                crate::objects::put_file(self.store.as_ref(), &self.key(rel)?, &dir.join(rel)).await?;
                report.uploaded.push(rel.clone());
            }
        }
        for rel in base.keys() {
            if !now.contains_key(rel) && !is_user_only(rel) {
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
    tokio::task::spawn_blocking(f).await.map_err(StoreError::backend_from)?
}

fn human_size(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// A line diff of two index texts: `+ line` added, `- line` removed.
pub fn index_diff(old: &str, new: &str) -> String {
    let old_lines: std::collections::HashSet<&str> = old.lines().collect();
    let new_lines: std::collections::HashSet<&str> = new.lines().collect();
    let mut out = Vec::new();
    for l in old.lines().filter(|l| !new_lines.contains(l) && !l.trim().is_empty()) {
        out.push(format!("- {l}"));
    }
    for l in new.lines().filter(|l| !old_lines.contains(l) && !l.trim().is_empty()) {
        out.push(format!("+ {l}"));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_index_lists_sections_descriptions_and_sizes_with_a_cap() {
        let wb = Workbench::new(Arc::new(object_store::memory::InMemory::new()), JobId::random());
        wb.put("scripts/count.sh", "#!/bin/sh\n# desc: counts files per folder\nfind . | wc -l\n".as_bytes().to_vec())
            .await
            .unwrap();
        wb.put("artifacts/sizes.md", "# desc: per-file sizes\n1 a\n".as_bytes().to_vec()).await.unwrap();
        wb.put("spill/abc.txt", vec![b'x'; 2048]).await.unwrap();
        let (index, changed) = wb.refresh_index().await.unwrap();
        assert!(changed);
        assert_eq!(
            index,
            "# Workbench index\n\n## scripts/\n- scripts/count.sh — counts files per folder (57 B)\n\n## artifacts/\n- artifacts/sizes.md — per-file sizes (27 B)\n\n## notes/\n(empty)\n\n## spill/\n- spill/abc.txt (2.0 KiB)\n"
        );
        assert!(!wb.refresh_index().await.unwrap().1, "unchanged: not rewritten");
        for i in 0..45 {
            wb.put(&format!("notes/n{i:02}.md"), format!("desc: decision {i}").into_bytes()).await.unwrap();
        }
        let capped = wb.render_index(INDEX_ENTRIES).await.unwrap();
        assert_eq!(capped.lines().filter(|l| l.starts_with("- ")).count(), 40);
        assert!(capped.ends_with("… 8 more\n"), "{capped}");
        let diff = index_diff(&index, &wb.render_index(INDEX_ENTRIES).await.unwrap());
        assert!(diff.contains("+ - notes/n00.md — decision 0 (16 B)") && diff.contains("- (empty)"), "{diff}");
    }

    #[tokio::test]
    async fn user_only_files_reach_no_session() {
        assert!(is_user_only("notes/qa-log.md") && is_user_only("./notes//qa-log.md"));
        assert!(!is_user_only("notes/qa-log.md.bak") && !is_user_only("qa-log.md"));
        let wb = Workbench::new(Arc::new(object_store::memory::InMemory::new()), JobId::random());
        wb.put("notes/qa-log.md", b"# Questions\nsecret answer\n".to_vec()).await.unwrap();
        wb.put("notes/plan.md", b"desc: the plan\n".to_vec()).await.unwrap();
        let index = wb.render_index(INDEX_ENTRIES).await.unwrap();
        assert!(index.contains("notes/plan.md") && !index.contains("qa-log"), "{index}");
        let dir = tempfile::tempdir().unwrap();
        let mut base = wb.materialize(dir.path()).await.unwrap();
        assert!(dir.path().join("notes/plan.md").exists() && !dir.path().join("notes/qa-log.md").exists());
        // A session writing the file in its mirror changes nothing.
        std::fs::write(dir.path().join("notes/qa-log.md"), "forged").unwrap();
        let report = wb.sync(dir.path(), &mut base).await.unwrap();
        assert!(report.uploaded.is_empty(), "{report:?}");
        assert_eq!(&wb.get("notes/qa-log.md").await.unwrap()[..], b"# Questions\nsecret answer\n");
    }
}
