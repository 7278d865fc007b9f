//! The launch's private mount tree (step 3 of [`super`]): every mount
//! read-only, fresh temporary directories, hidden directories, the task
//! directory bound back writable, and a fresh (or empty) `/proc`.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::mount::{MsFlags, mount};
use nix::sys::stat::Mode;

use super::{Applied, LaunchOptions, Stage};

/// A fresh /proc for pid 1 of a new PID namespace; elsewhere an empty one
/// (the host's would show the worker's command line).
pub(super) fn mount_proc(stage: Stage) -> String {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if stage == Stage::Pid1 && mount(Some("proc"), "/proc", Some("proc"), flags, None::<&str>).is_ok() {
        return "fresh".into();
    }
    let empty = Some("size=4k,mode=0555");
    if mount(Some("tmpfs"), "/proc", Some("tmpfs"), flags | MsFlags::MS_RDONLY, empty).is_ok() {
        return "hidden".into();
    }
    "host".into()
}

/// A failure that must stop the launch (the command would run unconfined
/// where confinement was set up in part).
pub(super) struct Fatal(pub(super) String);

/// The private mount tree (step 3 of the launcher's stages, [`super`]).
pub(super) fn confine_mounts(opts: &LaunchOptions, a: &mut Applied, root: bool) -> Result<(), Fatal> {
    let none = None::<&str>;
    let keep = nix::fcntl::open(&opts.confine, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| Fatal(format!("{}: {e}", opts.confine.display())))?;
    if let Err(e) = mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none) {
        // Without private propagation our mounts would reach the host: none are made.
        a.mount_namespace = false;
        a.notes.push(format!("mounts left as they are (private propagation refused: {e})"));
        return Ok(());
    }
    let mounts = mountinfo().map_err(|e| Fatal(format!("/proc/self/mountinfo: {e}")))?;
    let mut writable = Vec::new();
    for (point, flags) in &mounts {
        let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | *flags;
        if mount(none, point, none, ro, none).is_ok() {
            if point == Path::new("/") {
                a.read_only = true;
            }
        } else if !point.starts_with("/proc") && !point.starts_with("/sys") {
            writable.push(point.display().to_string());
        }
    }
    if !a.read_only {
        a.notes.push("/ could not be made read-only".into());
    }
    if !writable.is_empty() {
        writable.truncate(5);
        a.notes.push(format!("mounts left writable: {}", writable.join(", ")));
    }
    let tmpfs = |dir: &Path, data: &str| {
        mount(Some("tmpfs"), dir, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(data))
    };
    let mut private = true;
    for (dir, size) in [("/tmp", "1g"), ("/var/tmp", "1g"), ("/dev/shm", "256m")] {
        let dir = Path::new(dir);
        if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
            && let Err(e) = tmpfs(dir, &format!("mode=1777,size={size}"))
        {
            private = false;
            a.notes.push(format!("{}: no private tmpfs ({e})", dir.display()));
        }
    }
    a.private_tmp = private;
    let mut hidden: Vec<PathBuf> = opts.hide.iter().filter_map(|h| h.canonicalize().ok()).collect();
    hidden.sort();
    hidden.dedup();
    for dir in hidden.iter().filter(|d| d.is_dir()) {
        if let Err(e) = tmpfs(dir, "mode=0755,size=64k") {
            a.notes.push(format!("{}: not hidden ({e})", dir.display()));
        }
    }
    // A directory on the way the tool user may not search (a home directory,
    // a private temporary directory): hidden, the path rebuilt inside.
    if let (true, Some((uid, gid))) = (root, opts.user)
        && let Some(blocked) = first_unsearchable(&opts.confine, uid, gid)
        && let Err(e) = tmpfs(&blocked, "mode=0755,size=64k")
    {
        return Err(Fatal(format!("{}: {e}", blocked.display())));
    }
    let old = nix::sys::stat::umask(Mode::from_bits_truncate(0o022));
    let made = std::fs::create_dir_all(&opts.confine);
    nix::sys::stat::umask(old);
    made.map_err(|e| Fatal(format!("{}: {e}", opts.confine.display())))?;
    let source = PathBuf::from(format!("/proc/self/fd/{}", keep.as_raw_fd()));
    mount(Some(&source), &opts.confine, none, MsFlags::MS_BIND, none)
        .map_err(|e| Fatal(format!("binding {}: {e}", opts.confine.display())))?;
    // The bind copied the read-only flag: writable again, keeping the flags
    // of the mount it came from (a user namespace cannot clear them).
    let inherited = mounts
        .iter()
        .filter(|(p, _)| opts.confine.starts_with(p))
        .max_by_key(|(p, _)| p.as_os_str().len())
        .map(|(_, f)| *f)
        .unwrap_or(MsFlags::empty());
    let rw = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | inherited;
    mount(none, &opts.confine, none, rw, none)
        .map_err(|e| Fatal(format!("making {} writable: {e}", opts.confine.display())))?;
    Ok(())
}

/// The first ancestor of `dir` (from `/` down) that `uid:gid` may not search.
fn first_unsearchable(dir: &Path, uid: u32, gid: u32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut at = PathBuf::from("/");
    for part in dir.components().skip(1) {
        at.push(part);
        let Ok(m) = std::fs::metadata(&at) else { return None };
        if at == dir {
            return None;
        }
        let mode = m.mode();
        let ok = if m.uid() == uid {
            mode & 0o100 != 0
        } else if m.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            return Some(at);
        }
    }
    None
}

/// Mount points and their per-mount flags, parents first.
fn mountinfo() -> std::io::Result<Vec<(PathBuf, MsFlags)>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(point), Some(options)) = (fields.get(4), fields.get(5)) else { continue };
        let mut flags = MsFlags::empty();
        for o in options.split(',') {
            flags |= match o {
                "nosuid" => MsFlags::MS_NOSUID,
                "nodev" => MsFlags::MS_NODEV,
                "noexec" => MsFlags::MS_NOEXEC,
                "noatime" => MsFlags::MS_NOATIME,
                "nodiratime" => MsFlags::MS_NODIRATIME,
                "relatime" => MsFlags::MS_RELATIME,
                "strictatime" => MsFlags::MS_STRICTATIME,
                _ => MsFlags::empty(),
            };
        }
        out.push((PathBuf::from(unescape(point)), flags));
    }
    Ok(out)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/mnt/a\040b\134c"), OsString::from("/mnt/a b\\c"));
        assert_eq!(unescape(r"/x\04"), OsString::from(r"/x\04"));
    }
}
