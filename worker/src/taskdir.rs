//! The size bound of a task's folder. Where the worker may mount file
//! systems (it runs as root with the launcher in force), each task folder
//! is a tmpfs of its own, sized once it is filled to what it then holds
//! plus the job's `runtime.workspace_limit`: a task's writes stop at the
//! bound while they happen ("No space left on device"), not after, and a
//! host's disk never fills from a task folder. Elsewhere the folder is a
//! plain directory and the bound is kept at the end, when the changes are
//! collected (the worker says which at start;
//! [`crate::isolation::ToolSetup::bounded_dirs`]).

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// Whether this process may mount a tmpfs (tried once in `scratch`, made
/// and removed here).
pub fn can_mount(scratch: &Path) -> bool {
    if std::fs::create_dir_all(scratch).is_err() {
        return false;
    }
    let ok = mount_at(scratch).is_ok() && umount2(scratch, MntFlags::MNT_DETACH).is_ok();
    let _ = std::fs::remove_dir(scratch);
    ok
}

/// This process's hold on a work root, kept while it runs: shared with
/// every other process using the root. Taking it, a process that finds no
/// other holder unmounts what a dead one left mounted beneath the root;
/// (the file, how many were unmounted).
pub fn hold(root: &Path) -> io::Result<(std::fs::File, usize)> {
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(root.join(LOCK))?;
    let cleaned = match file.try_lock() {
        Ok(()) => {
            let n = unmount_beneath(root);
            file.unlock()?;
            n
        }
        Err(std::fs::TryLockError::WouldBlock) => 0,
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    };
    file.lock_shared()?;
    Ok((file, cleaned))
}

/// Whether no process holds `root` (see [`hold`]); a root without the lock
/// file was never held.
pub fn abandoned(root: &Path) -> bool {
    match std::fs::OpenOptions::new().write(true).open(root.join(LOCK)) {
        Ok(f) => f.try_lock().is_ok(),
        Err(_) => false,
    }
}

/// The lock file a process holds on its work root.
const LOCK: &str = ".flower-hold";

/// Make `path` (an empty directory) a tmpfs, unbounded until [`resize`].
pub fn mount_at(path: &Path) -> io::Result<()> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(Some("tmpfs"), path, Some("tmpfs"), flags, Some("mode=0755")).map_err(io::Error::from)
}

/// Bound the tmpfs at `path` to what it holds plus `room` bytes.
pub fn resize(path: &Path, room: u64) -> io::Result<()> {
    let st = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    let used = (st.blocks() - st.blocks_free()) * st.fragment_size();
    let size = used.saturating_add(room);
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(None::<&str>, path, Some("tmpfs"), flags, Some(format!("size={size}").as_str())).map_err(io::Error::from)
}

/// Whether `path` is a mount point of its own (its device differs from its parent's).
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(m), Some(parent)) = (std::fs::symlink_metadata(path), path.parent()) else { return false };
    std::fs::metadata(parent).is_ok_and(|p| p.dev() != m.dev())
}

/// Remove a task folder, its tmpfs first (blocking).
pub fn remove(path: &Path) -> io::Result<()> {
    if is_mount_point(path) {
        umount2(path, MntFlags::MNT_DETACH).map_err(io::Error::from)?;
    }
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Unmount every file system mounted beneath `root` (what a worker killed
/// before it could clean up left there); how many.
pub fn unmount_beneath(root: &Path) -> usize {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return 0 };
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(&root) && *p != root)
        .collect();
    // Deepest first.
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.into_iter().filter(|p| umount2(p.as_path(), MntFlags::MNT_DETACH).is_ok()).count()
}
