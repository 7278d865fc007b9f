//! How this worker process runs tools (`Bash`, MCP stdio servers) and what
//! a job spec may make it start: one value, a [`ToolSetup`], made once at
//! start by the binary and handed to the runner ([`crate::WorkerOptions`]),
//! which hands it on to each task's tools ([`crate::tools::ToolLimits`]) and
//! MCP launches. Nothing here is a process-wide setting: a process that did
//! not say how its tools run has no worker to run them.
//!
//! [`ToolIsolation::Launcher`] starts every command through `flower
//! tool-exec` ([`crate::launch`]): another user when the worker is root,
//! its own PID, mount and network namespaces (no network unless the
//! operator opened it), the rest of the file tree read-only, Landlock where
//! the kernel has it, in a control group of its task ([`crate::cgroup`])
//! with the task's limits. Only a [`Probed`] launcher is put in force: it
//! ran once at start, and every later launch must put in force what that
//! run found, or refuse to run. A launcher that cannot run is an error for
//! the caller (`flower worker` stops), never a quiet fallback.
//! [`ToolIsolation::None`] runs commands directly as this process's user
//! with only their environment cleaned: what `--tool-isolation off` asks
//! for, and what a process that cannot start `flower` chooses (tests
//! running the worker in their own binary).

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flower_model::policy::ToolPolicy;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{Gid, Uid};

pub use crate::cgroup::{Cgroups, Counters, LazyGroup, Leaf, TaskGroup, TaskLimits};
pub use crate::launch::{Applied, NetworkPolicy, Rlimits};

/// Directories hidden from tools: where Postgres puts its Unix sockets.
pub const DEFAULT_HIDE: &[&str] = &["/run/postgresql", "/var/run/postgresql"];

/// `PATH` of a launched tool: the system's directories only, never one of
/// the service's own (its home, a tool directory of its user's).
pub const TOOL_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The user tools run as when the worker is root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl ToolUser {
    /// `NAME`, `UID` or `UID:GID` (a name or uid known to the system gets
    /// its primary group).
    pub fn resolve(spec: &str) -> Result<Self, String> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let known = match user.parse::<u32>() {
            Ok(uid) => nix::unistd::User::from_uid(Uid::from_raw(uid)).ok().flatten(),
            Err(_) => Some(
                nix::unistd::User::from_name(user)
                    .map_err(|e| format!("`{user}`: {e}"))?
                    .ok_or_else(|| format!("`{user}`: no such user"))?,
            ),
        };
        let uid = match (&known, user.parse::<u32>()) {
            (_, Ok(uid)) => uid,
            (Some(u), Err(_)) => u.uid.as_raw(),
            (None, Err(_)) => return Err(format!("`{user}`: no such user")),
        };
        let gid = match group {
            Some(g) => g.parse::<u32>().map_err(|_| format!("`{spec}`: the group must be a number"))?,
            None => known.as_ref().map_or(uid, |u| u.gid.as_raw()),
        };
        let name = known.map_or_else(|| uid.to_string(), |u| u.name);
        Ok(Self { name, uid, gid })
    }
}

/// The launcher and what it is told to put in force.
#[derive(Clone, Debug)]
pub struct Launcher {
    /// The `flower` executable (`tool-exec` is one of its commands).
    pub program: PathBuf,
    /// Another user to run as (the worker must be root); `None`: the worker's.
    pub user: Option<ToolUser>,
    pub network: NetworkPolicy,
    pub hide: Vec<PathBuf>,
    /// This worker's control groups for tools; `None`: resource limits only.
    pub cgroups: Option<Arc<Cgroups>>,
    /// What each task's tools may use.
    pub limits: TaskLimits,
    /// What the probe at start found in force: every launch must match it
    /// or refuse to run (a launch never runs with less, silently).
    pub require: Option<crate::launch::Required>,
    /// Task folders are a tmpfs of their own ([`crate::taskdir`]).
    pub bounded_dirs: bool,
    /// This process's hold on its work root ([`crate::taskdir::hold`]).
    pub hold: Option<Arc<std::fs::File>>,
}

/// How tools are started (see the module doc).
#[derive(Clone, Debug)]
pub enum ToolIsolation {
    /// Directly, as this process's user, with a cleaned environment only.
    None,
    /// Through `flower tool-exec`.
    Launcher(Launcher),
}

impl ToolIsolation {
    pub fn launcher(&self) -> Option<&Launcher> {
        match self {
            Self::Launcher(l) => Some(l),
            Self::None => None,
        }
    }
}

/// What a launch is for: to run its command, or to report what it would
/// put in force (the probe at start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    Run,
    Report,
}

impl Launcher {
    fn options(
        &self,
        cwd: &Path,
        argv: Vec<OsString>,
        purpose: Purpose,
        launch: &Launch,
    ) -> crate::launch::LaunchOptions {
        // What no control group holds falls back to a resource limit.
        let held = self.cgroups.as_ref().map(|c| c.enforces()).unwrap_or_default();
        crate::launch::LaunchOptions {
            user: self.user.as_ref().map(|u| (u.uid, u.gid)),
            network: self.network,
            cgroups: launch.leaf.map(Leaf::dirs).unwrap_or_default(),
            parent: Some(std::process::id()),
            rlimits: Rlimits {
                file_size: launch.max_file_size,
                processes: if held.processes.is_some() { None } else { self.limits.processes },
                address_space: if held.memory.is_some() { None } else { self.limits.memory },
            },
            no_network_namespace: false,
            egress: launch.egress.map(Path::to_path_buf),
            require: self.require,
            confine: cwd.to_path_buf(),
            hide: self.hide.clone(),
            report: purpose == Purpose::Report,
            init: None,
            argv,
        }
    }

    /// `argv` run through the launcher in `cwd` with exactly `env` (the
    /// caller sets stdio; the launcher passes it on).
    pub fn command(
        &self,
        cwd: &Path,
        argv: Vec<OsString>,
        launch: &Launch,
        env: Vec<(String, String)>,
    ) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.program);
        c.arg("tool-exec")
            .current_dir(cwd)
            .env_clear()
            .envs(env)
            .env(crate::launch::OPTIONS_ENV, self.options(cwd, argv, Purpose::Run, launch).to_env());
        c
    }

    /// A task's control group with this worker's limits (made at its first
    /// launch), when this worker has groups.
    pub fn task_group(&self, name: &str) -> Option<Arc<LazyGroup>> {
        self.cgroups.as_ref().map(|c| Arc::new(LazyGroup::new(c.clone(), name.to_string(), self.limits)))
    }

    /// Whether a task's egress proxy can be reached by its tools only: their
    /// own network, mount and PID namespaces (the probe found them).
    pub fn egress_possible(&self) -> bool {
        self.require.is_some_and(|r| r.network_namespace && r.pid_namespace && r.mount_namespace)
    }

    /// The tool user's name, when tools run as another user.
    pub fn user_name(&self) -> Option<&str> {
        self.user.as_ref().map(|u| u.name.as_str())
    }

    /// Make `dir` the tool user's, so the command can work there (files the
    /// worker wrote since the last call included). Symbolic links are not
    /// followed and files with several links are left alone, so nothing
    /// outside `dir` changes owner.
    pub async fn hand_over(&self, dir: &Path) -> std::io::Result<()> {
        let Some(user) = &self.user else { return Ok(()) };
        if Uid::effective().as_raw() == user.uid {
            return Ok(());
        }
        let (dir, uid, gid) = (dir.to_path_buf(), user.uid, user.gid);
        tokio::task::spawn_blocking(move || chown_tree(&dir, Uid::from_raw(uid), Gid::from_raw(gid)))
            .await
            .map_err(std::io::Error::other)?
    }

    /// Run the launcher once in `scratch` (made and removed here) and read
    /// what it put in force: from then on every launch must put in force as
    /// much, or refuse to run. An error: the launcher could not run here.
    pub fn probe(mut self, scratch: &Path) -> Result<Probed, String> {
        let applied = self.report_once(scratch)?;
        self.require = Some(crate::launch::Required::from_applied(&applied));
        Ok(Probed { launcher: self, applied })
    }

    /// One launch that reports what it puts in force instead of running a command.
    fn report_once(&self, scratch: &Path) -> Result<Applied, String> {
        std::fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        let scratch = scratch.canonicalize().map_err(|e| format!("{}: {e}", scratch.display()))?;
        let result = (|| {
            if let Some(u) = &self.user {
                chown_tree(&scratch, Uid::from_raw(u.uid), Gid::from_raw(u.gid))
                    .map_err(|e| format!("handing {} to {}: {e}", scratch.display(), u.name))?;
            }
            let out = std::process::Command::new(&self.program)
                .arg("tool-exec")
                .current_dir(&scratch)
                .env_clear()
                .env("PATH", TOOL_PATH)
                .env(
                    crate::launch::OPTIONS_ENV,
                    self.options(&scratch, vec!["true".into()], Purpose::Report, &Launch::default()).to_env(),
                )
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("starting {}: {e}", self.program.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} tool-exec failed ({}): {}",
                    self.program.display(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            serde_json::from_slice::<Applied>(&out.stdout).map_err(|e| format!("the launcher's report: {e}"))
        })();
        let _ = std::fs::remove_dir_all(&scratch);
        result
    }

    /// What `a` (a probe's report) means, in one line, and what of the full
    /// isolation is missing on this host.
    pub fn describe(&self, a: &Applied) -> (String, Vec<String>) {
        let mut missing = Vec::new();
        let mut parts = Vec::new();
        match (&self.user, &a.user) {
            (Some(u), Some(_)) => parts.push(format!("user {} ({}:{})", u.name, u.uid, u.gid)),
            (Some(u), None) => missing.push(format!("tools were to run as {} but do not", u.name)),
            (None, _) => {
                parts.push("the worker's user".into());
                if !a.user_namespace {
                    missing.push(
                        "no separate user and no user namespace: tools run as the worker's user (its files are theirs)"
                            .into(),
                    );
                }
            }
        }
        let ns: Vec<&str> = [
            (a.user_namespace, "user"),
            (a.pid_namespace, "pid"),
            (a.mount_namespace, "mount"),
            (a.network_namespace, "network"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        parts.push(if ns.is_empty() { "no namespaces".into() } else { format!("{} namespaces", ns.join(", ")) });
        if !a.pid_namespace {
            missing.push("no PID namespace: the worker's processes are visible (their environment is not readable by another user)".into());
        }
        parts.push(format!("/proc {}", a.proc));
        let mut writes = Vec::new();
        if a.read_only {
            writes.push("read-only mounts".to_string());
        }
        if a.private_tmp {
            writes.push("private /tmp".into());
        }
        if a.landlock_fs {
            writes.push(format!("Landlock {}", a.landlock.as_deref().unwrap_or_default()));
        }
        if a.read_only || a.landlock_fs {
            parts.push(format!("writes: the task directory only ({})", writes.join(", ")));
        } else {
            parts.push("writes: wherever the tool user may write".into());
            missing.push("no read-only mounts and no Landlock: writes are limited by file permissions only".into());
        }
        if !a.landlock_fs {
            missing.push("Landlock not in force".into());
        }
        parts.push(format!("network: {}", a.network));
        if a.network.starts_with("open (none") {
            missing.push(format!("network policy {} not enforced", self.network));
        }
        if a.seccomp_net {
            missing.push("no network namespace: a seccomp filter leaves tools Unix sockets only".into());
        }
        match &self.cgroups {
            Some(c) => parts.push(format!("limits per task: {} ({})", describe_limits(&self.limits), c.describe())),
            None => {
                parts.push(format!("limits per task: {} (resource limits per process)", describe_limits(&self.limits)));
                missing.push(
                    "no control groups for tools: limits are per-process resource limits, and a launch that left its process group outlives it unless its PID namespace ends"
                        .into(),
                );
            }
        }
        if !a.dies_with_worker {
            missing.push("the launcher does not die with the worker".into());
        }
        for n in &a.notes {
            if !missing.contains(n) {
                missing.push(n.clone());
            }
        }
        (parts.join("; "), missing)
    }
}

/// What one launch adds to the launcher's options.
#[derive(Clone, Copy, Debug, Default)]
pub struct Launch<'a> {
    /// The launch's control group, joined first.
    pub leaf: Option<&'a Leaf>,
    /// The largest file the command may write (the task's workspace limit).
    pub max_file_size: Option<u64>,
    /// The task's egress proxy socket, when its job was granted destinations.
    pub egress: Option<&'a Path>,
}

/// `512 processes, 2.0 GiB memory, 1.5 CPU` (what is set).
pub fn describe_limits(l: &TaskLimits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = l.processes {
        parts.push(format!("{n} processes"));
    }
    if let Some(m) = l.memory {
        parts.push(format!("{} memory", bytesize::ByteSize::b(m)));
    }
    if let Some(c) = l.cpu_millis {
        parts.push(format!("{} CPU", c as f64 / 1000.0));
    }
    if parts.is_empty() { "none".into() } else { parts.join(", ") }
}

/// Change the owner of `root` and everything beneath it, through file
/// descriptors: no symbolic link is followed, a name swapped meanwhile is
/// seen as what it now is, and a file with several links (possibly to a
/// file elsewhere) is skipped.
pub fn chown_tree(root: &Path, uid: Uid, gid: Gid) -> std::io::Result<()> {
    let open_dir = |at: Option<&OwnedFd>, name: &Path| -> nix::Result<OwnedFd> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match at {
            Some(dir) => nix::fcntl::openat(dir, name, flags, Mode::empty()),
            None => nix::fcntl::open(name, flags, Mode::empty()),
        }
    };
    let top = open_dir(None, root)?;
    let st = nix::sys::stat::fstat(&top)?;
    give(&top, &st, uid, gid)?;
    let mut stack = vec![top];
    while let Some(dir) = stack.pop() {
        let names: Vec<std::ffi::CString> = {
            let copy = dir.try_clone()?;
            let mut d = nix::dir::Dir::from_fd(copy)?;
            d.iter()
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_owned())
                .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
                .collect()
        };
        for name in names {
            let name = Path::new(std::ffi::OsStr::from_bytes(name.as_bytes()));
            let Ok(entry) =
                nix::fcntl::openat(&dir, name, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            else {
                continue;
            };
            let Ok(st) = nix::sys::stat::fstat(&entry) else { continue };
            let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
            if kind == SFlag::S_IFDIR {
                give(&entry, &st, uid, gid)?;
                if let Ok(sub) = open_dir(Some(&dir), name) {
                    stack.push(sub);
                }
            } else if kind == SFlag::S_IFREG && st.st_nlink == 1 {
                give(&entry, &st, uid, gid)?;
            }
        }
    }
    Ok(())
}

use std::os::unix::ffi::OsStrExt;

fn give(fd: impl AsFd, st: &FileStat, uid: Uid, gid: Gid) -> std::io::Result<()> {
    if st.st_uid == uid.as_raw() && st.st_gid == gid.as_raw() {
        return Ok(());
    }
    nix::unistd::fchownat(fd, "", Some(uid), Some(gid), AtFlags::AT_EMPTY_PATH)?;
    Ok(())
}

/// This process's effective uid (tools may run as another user only when it is 0).
pub fn effective_uid() -> u32 {
    Uid::effective().as_raw()
}

/// Make this process's own `/proc` entries root's (not dumpable), so a tool
/// running as the same user cannot read its environment or memory there.
/// Called once at start by a process that runs tools, whatever their isolation.
pub fn close_own_proc_entries() {
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!(error = %e, "this process stays dumpable: a tool running as its user could read its /proc entries");
    }
}

/// A launcher that ran once on this host ([`Launcher::probe`]), and what it
/// put in force there: what every later launch requires.
#[derive(Clone, Debug)]
pub struct Probed {
    launcher: Launcher,
    applied: Applied,
}

impl Probed {
    pub fn launcher(&self) -> &Launcher {
        &self.launcher
    }

    /// What is in force, in one line, and what of the full isolation is
    /// missing on this host (see [`Launcher::describe`]).
    pub fn describe(&self) -> (String, Vec<String>) {
        self.launcher.describe(&self.applied)
    }
}

/// How this worker starts tools, and the policy job specs are checked
/// against (what MCP servers, variables and destinations they may name):
/// made once at start, handed to whatever starts tools (see the module doc).
#[derive(Clone, Debug)]
pub struct ToolSetup {
    isolation: Arc<ToolIsolation>,
    policy: Arc<ToolPolicy>,
}

impl ToolSetup {
    /// Tools start directly, as this process's user, their environment
    /// cleaned and nothing else: the operator's `--tool-isolation off`, or
    /// a process that cannot start the launcher (a test's own binary).
    pub fn direct(policy: ToolPolicy) -> Self {
        Self { isolation: Arc::new(ToolIsolation::None), policy: Arc::new(policy) }
    }

    /// Tools start through the launcher, requiring of every launch what its
    /// probe found in force.
    pub fn launched(probed: Probed, policy: ToolPolicy) -> Self {
        Self { isolation: Arc::new(ToolIsolation::Launcher(probed.launcher)), policy: Arc::new(policy) }
    }

    /// How tools start.
    pub fn isolation(&self) -> &Arc<ToolIsolation> {
        &self.isolation
    }

    /// The launcher, when tools start through one.
    pub fn launcher(&self) -> Option<&Launcher> {
        self.isolation.launcher()
    }

    /// The policy job specs are checked against.
    pub fn policy(&self) -> &ToolPolicy {
        &self.policy
    }

    /// Whether task folders are a tmpfs of their own ([`crate::taskdir`]):
    /// the launcher found at start that this process may mount one.
    pub fn bounded_dirs(&self) -> bool {
        self.launcher().is_some_and(|l| l.bounded_dirs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_resolve_by_name_number_and_pair() {
        let nobody = ToolUser::resolve("nobody").unwrap();
        assert_eq!((nobody.name.as_str(), nobody.uid), ("nobody", 65534));
        assert_eq!(ToolUser::resolve("65534").unwrap(), nobody);
        let pair = ToolUser::resolve("4242:4343").unwrap();
        assert_eq!((pair.uid, pair.gid, pair.name.as_str()), (4242, 4343, "4242"));
        assert!(ToolUser::resolve("no-such-user-here").unwrap_err().contains("no such user"));
        assert!(ToolUser::resolve("1:x").is_err());
    }

    #[test]
    fn chown_tree_stays_inside_and_skips_links() {
        let tmp = tempfile::tempdir().unwrap();
        if !Uid::effective().is_root() {
            // Without root the hand-over is refused, not half done.
            let e = chown_tree(tmp.path(), Uid::from_raw(4242), Gid::from_raw(4343)).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(nix::libc::EPERM), "{e}");
            return;
        }
        let outside = tmp.path().join("outside.txt");
        std::fs::write(&outside, "x").unwrap();
        let root = tmp.path().join("task");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f.txt"), "f").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("up")).unwrap();
        std::fs::hard_link(&outside, root.join("hard")).unwrap();
        chown_tree(&root, Uid::from_raw(4242), Gid::from_raw(4343)).unwrap();
        use std::os::unix::fs::MetadataExt;
        let owner = |p: &Path| {
            let m = std::fs::symlink_metadata(p).unwrap();
            (m.uid(), m.gid())
        };
        assert_eq!(owner(&root), (4242, 4343));
        assert_eq!(owner(&root.join("a/b")), (4242, 4343));
        assert_eq!(owner(&root.join("a/b/f.txt")), (4242, 4343));
        assert_eq!(owner(&outside), (0, 0), "neither the symlink nor the hard link reached it");
        assert_eq!(owner(tmp.path()), (0, 0));
    }
}
