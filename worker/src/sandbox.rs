//! The task's working directory as a capability: every file tool opens paths
//! *beneath* it through `cap-std`, which resolves each component itself and
//! refuses `..` escapes, absolute paths and symlinks that lead outside — no
//! string check a symlink race could defeat.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use flower_agent::ToolError;

#[derive(Clone)]
pub struct Sandbox {
    root: PathBuf,
    dir: Arc<Dir>,
}

impl Sandbox {
    pub fn open(root: &Path) -> std::io::Result<Self> {
        let root = root.canonicalize()?;
        let dir = Dir::open_ambient_dir(&root, ambient_authority())?;
        Ok(Self { root, dir: Arc::new(dir) })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// The path relative to the root, as the model gave it. An absolute path is
    /// accepted only when it names something under the root; the result is
    /// then opened beneath the root by cap-std, which has the last word.
    pub fn relative(&self, given: &str) -> Result<PathBuf, ToolError> {
        let p = Path::new(given);
        let rel = if p.is_absolute() {
            p.strip_prefix(&self.root).map(Path::to_path_buf).map_err(|_| outside(given))?
        } else {
            p.to_path_buf()
        };
        if rel.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(outside(given));
        }
        let rel: PathBuf = rel.components().filter(|c| !matches!(c, Component::CurDir)).collect();
        Ok(if rel.as_os_str().is_empty() { PathBuf::from(".") } else { rel })
    }

    /// Map an I/O error from a beneath-open to what the model should read.
    pub fn io_error(&self, given: &str, e: std::io::Error) -> ToolError {
        use std::io::ErrorKind::*;
        match e.kind() {
            NotFound => ToolError::RespondToModel(format!("{given}: no such file or directory")),
            // cap-std reports an escape (a `..` or a symlink leading outside) as PermissionDenied.
            PermissionDenied => outside(given),
            IsADirectory => ToolError::RespondToModel(format!("{given}: is a directory")),
            _ if e.raw_os_error() == Some(nix::libc::ELOOP) => outside(given),
            _ => ToolError::RespondToModel(format!("{given}: {e}")),
        }
    }
}

pub fn outside(given: &str) -> ToolError {
    ToolError::RespondToModel(format!(
        "refused: `{given}` is outside the task's working directory; file tools only reach paths beneath it"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_normalised_and_escapes_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let sb = Sandbox::open(tmp.path()).unwrap();
        assert_eq!(sb.relative("./a/b.txt").unwrap(), PathBuf::from("a/b.txt"));
        assert_eq!(sb.relative(".").unwrap(), PathBuf::from("."));
        let inside = format!("{}/x.txt", sb.root().display());
        assert_eq!(sb.relative(&inside).unwrap(), PathBuf::from("x.txt"));
        assert!(sb.relative("../outside").is_err());
        assert!(sb.relative("a/../../b").is_err());
        assert!(sb.relative("/etc/passwd").is_err());
    }
}
