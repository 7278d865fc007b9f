//! Emptied working directories kept for reuse. Creating and removing a
//! directory tree per task costs more than all of a short task's other work
//! on ext4 (directory inodes are placed by scanning past every recently
//! freed one), so a finished attempt's directory is emptied down to its
//! `.flower/` folders and reused by the next attempt of the same job —
//! never another job's: a job's tasks already share its workbench and
//! workspace, jobs share nothing.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use flower_model::JobId;
use flower_store::workbench::MOUNT;

use super::folder::remove_dir;

/// Emptied working directories kept for reuse; the oldest beyond this are removed.
const SPARE_DIRS: usize = 64;

/// Emptied directories of finished attempts, newest last, each reused only
/// by a later attempt of the same job.
#[derive(Default)]
pub(super) struct SpareDirs {
    dirs: Mutex<VecDeque<(JobId, PathBuf)>>,
}

impl SpareDirs {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(JobId, PathBuf)>> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The newest emptied directory of `job`, taken out.
    pub(super) fn take(&self, job: JobId) -> Option<PathBuf> {
        let mut spare = self.lock();
        let at = spare.iter().rposition(|(j, _)| *j == job)?;
        spare.remove(at).map(|(_, path)| path)
    }

    /// Keep `path` for `job`'s next attempt; the oldest kept directory is
    /// removed past [`SPARE_DIRS`].
    pub(super) async fn put(&self, job: JobId, path: PathBuf) {
        let evicted = {
            let mut spare = self.lock();
            spare.push_back((job, path));
            if spare.len() > SPARE_DIRS { spare.pop_front() } else { None }
        };
        if let Some((_, old)) = evicted {
            remove_dir(old).await;
        }
    }

    /// Remove every directory kept (at shutdown).
    pub(super) async fn drop_all(&self) {
        let spare: Vec<(JobId, PathBuf)> = self.lock().drain(..).collect();
        for (_, path) in spare {
            remove_dir(path).await;
        }
    }
}

/// Empty a finished attempt's directory down to its `.flower/` folders, for
/// the next attempt of its job: every other entry is removed (links are
/// removed, never followed), and the kept folders get the directory's own
/// permissions back. An error means the directory is not fit for reuse.
pub(super) fn empty_for_reuse(dir: &Path) -> std::io::Result<()> {
    fn remove(entry: &std::fs::DirEntry) -> std::io::Result<()> {
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())
        } else {
            std::fs::remove_file(entry.path())
        }
    }
    // The permissions the worker gave the job's folder: a task may have
    // changed its own directory's.
    let parent = dir.parent().ok_or_else(|| std::io::Error::other("a working directory has a parent"))?;
    let mode = std::fs::symlink_metadata(parent)?.permissions();
    let mut kept = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() != MOUNT || !entry.file_type()?.is_dir() {
            remove(&entry)?;
            continue;
        }
        for inner in std::fs::read_dir(entry.path())? {
            let inner = inner?;
            let folder = flower_store::workbench::FOLDERS.iter().any(|f| inner.file_name() == *f);
            if !folder || !inner.file_type()?.is_dir() {
                remove(&inner)?;
                continue;
            }
            for leaf in std::fs::read_dir(inner.path())? {
                remove(&leaf?)?;
            }
            kept.push(inner.path());
        }
        kept.push(entry.path());
    }
    kept.push(dir.to_path_buf());
    for path in kept {
        std::fs::set_permissions(path, mode.clone())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_reused_directory_keeps_only_its_workbench_folders() {
        let root = tempfile::tempdir().unwrap();
        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), "x").unwrap();
        let dir = root.path().join("job").join("task-1");
        std::fs::create_dir_all(dir.join("src/deep")).unwrap();
        std::fs::write(dir.join("src/deep/a.rs"), "a").unwrap();
        std::fs::write(dir.join(".hidden"), "h").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        for f in flower_store::workbench::FOLDERS {
            std::fs::create_dir_all(dir.join(MOUNT).join(f)).unwrap();
        }
        std::fs::write(dir.join(MOUNT).join("scripts/run.sh"), "s").unwrap();
        std::fs::create_dir_all(dir.join(MOUNT).join("notes/sub")).unwrap();
        std::fs::write(dir.join(MOUNT).join("INDEX.md"), "i").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join(MOUNT).join("spill/out")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join(MOUNT).join("artifacts"), std::fs::Permissions::from_mode(0o500)).unwrap();

        empty_for_reuse(&dir).unwrap();

        let mut left: Vec<String> = walk(&dir);
        left.sort();
        let mut want: Vec<String> = flower_store::workbench::FOLDERS.iter().map(|f| format!("{MOUNT}/{f}")).collect();
        want.push(MOUNT.to_string());
        want.sort();
        assert_eq!(left, want);
        assert!(outside.join("keep.txt").exists(), "links are removed, not followed");
        let parent = std::fs::metadata(dir.parent().unwrap()).unwrap().permissions().mode();
        let artifacts = std::fs::metadata(dir.join(MOUNT).join("artifacts")).unwrap().permissions().mode();
        assert_eq!(artifacts, parent, "a folder's permissions are given back");
    }

    fn walk(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let rel = e.file_name().to_string_lossy().to_string();
            if e.file_type().unwrap().is_dir() {
                out.extend(walk(&e.path()).into_iter().map(|r| format!("{rel}/{r}")));
            }
            out.push(rel);
        }
        out
    }
}
