//! Control groups for tools: every task gets a group of its own under this
//! worker's base (made at its first launch, [`LazyGroup`]), with the
//! kernel's limits on processes, memory and CPU;
//! every tool launch (a `Bash` command, an MCP stdio server) a leaf inside
//! it, joined by the launcher before anything else runs. Ending a launch
//! kills its leaf whole — a process that left its process group or session
//! (`setsid`) included — and a worker that starts kills what a killed
//! predecessor left in its base.
//!
//! Both kernel layouts are used: cgroup v2 (`cgroup.kill`, `pids.max`,
//! `memory.max`, `cpu.max`), and on hosts that still mount v1 controllers
//! beside an empty v2 hierarchy, v1's `pids`, `memory` and `cpu` for what
//! v2 does not control. The base lives under this process's own group in
//! each hierarchy, named after this process (`flower-tools-PID-START`, its
//! pid and start time), so workers of one host never touch each other's
//! tools while they live, and a base whose process is gone is ended by the
//! next worker that starts beside it. Nothing here runs unless the worker
//! may create groups; otherwise [`Cgroups::setup`] says why and the
//! launcher falls back to resource limits (`setrlimit`), which the worker
//! logs.

use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What one task's tools may use at once, all launches of the task together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskLimits {
    /// Processes and threads.
    pub processes: Option<u64>,
    /// Memory in bytes: resident pages, page cache and tmpfs, swap included.
    pub memory: Option<u64>,
    /// CPU time in thousandths of one CPU (1000: one whole CPU).
    pub cpu_millis: Option<u64>,
}

/// The controllers a base directory has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Controls {
    pids: bool,
    memory: bool,
    cpu: bool,
}

/// One hierarchy's base directory for this worker's tools.
#[derive(Clone, Debug)]
struct Base {
    dir: PathBuf,
    v2: bool,
    controls: Controls,
}

/// This worker's groups, one base per hierarchy in use.
#[derive(Clone, Debug)]
pub struct Cgroups {
    bases: Vec<Base>,
}

/// One line of `/proc/self/mountinfo` naming a cgroup file system.
#[derive(Debug, PartialEq, Eq)]
struct CgroupMount {
    point: PathBuf,
    v2: bool,
    /// v1 controllers (`pids`, `memory`, `cpu`, …) of the mount.
    controllers: Vec<String>,
}

fn parse_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let point = left.split(' ').nth(4);
        let mut r = right.split(' ');
        let (Some(fstype), _, Some(opts)) = (r.next(), r.next(), r.next()) else { continue };
        let Some(point) = point else { continue };
        let v2 = fstype == "cgroup2";
        if !v2 && fstype != "cgroup" {
            continue;
        }
        let controllers = if v2 {
            Vec::new()
        } else {
            opts.split(',').filter(|o| matches!(*o, "pids" | "memory" | "cpu")).map(str::to_string).collect()
        };
        out.push(CgroupMount { point: PathBuf::from(point), v2, controllers });
    }
    out
}

/// `/proc/self/cgroup`: (v1 controllers or empty for v2, the group's path).
fn parse_self(text: &str) -> Vec<(Vec<String>, String)> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((ctrl.split(',').filter(|c| !c.is_empty()).map(str::to_string).collect(), path.to_string()))
        })
        .collect()
}

fn read(p: &Path) -> io::Result<String> {
    std::fs::read_to_string(p)
}

fn write(p: &Path, value: &str) -> io::Result<()> {
    std::fs::write(p, value).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))
}

fn mkdir(p: &Path) -> io::Result<()> {
    match std::fs::create_dir(p) {
        Err(e) if e.kind() != ErrorKind::AlreadyExists => {
            Err(io::Error::new(e.kind(), format!("{}: {e}", p.display())))
        }
        _ => Ok(()),
    }
}

impl Cgroups {
    /// This worker's bases, created under this process's groups, with what
    /// workers that died beside it left ended (how many processes).
    /// `Err`: why this host gives no group to tools.
    pub fn setup() -> Result<(Self, usize), String> {
        let me = std::process::id();
        let start = start_time(me).ok_or("/proc/self/stat: no start time")?;
        Self::setup_named(&format!("{PREFIX}{me}-{start}"))
    }

    fn setup_named(name: &str) -> Result<(Self, usize), String> {
        let mounts = parse_mounts(&read(Path::new("/proc/self/mountinfo")).map_err(|e| format!("mountinfo: {e}"))?);
        let own = parse_self(&read(Path::new("/proc/self/cgroup")).map_err(|e| format!("/proc/self/cgroup: {e}"))?);
        let mut bases = Vec::new();
        let mut notes = Vec::new();
        let mut have = Controls::default();
        if let (Some(m), Some((_, path))) = (mounts.iter().find(|m| m.v2), own.iter().find(|(c, _)| c.is_empty())) {
            match v2_base(&m.point, path, name) {
                Ok(b) => {
                    have = b.controls;
                    bases.push(b);
                }
                Err(e) => notes.push(format!("cgroup v2: {e}")),
            }
        }
        for (ctrl, flag) in [("pids", have.pids), ("memory", have.memory), ("cpu", have.cpu)] {
            if flag {
                continue;
            }
            let Some(m) = mounts.iter().find(|m| !m.v2 && m.controllers.iter().any(|c| c == ctrl)) else { continue };
            let Some((_, path)) = own.iter().find(|(c, _)| c.iter().any(|c| c == ctrl)) else { continue };
            if bases.iter().any(|b| b.dir.starts_with(&m.point)) {
                continue;
            }
            let dir = m.point.join(path.trim_start_matches('/')).join(name);
            match mkdir(&dir) {
                Ok(()) => {
                    let controls = Controls {
                        pids: m.controllers.iter().any(|c| c == "pids"),
                        memory: m.controllers.iter().any(|c| c == "memory"),
                        cpu: m.controllers.iter().any(|c| c == "cpu"),
                    };
                    bases.push(Base { dir, v2: false, controls });
                }
                Err(e) => notes.push(format!("cgroup v1 {ctrl}: {e}")),
            }
        }
        if bases.is_empty() {
            return Err(if notes.is_empty() { "no cgroup file system is mounted".into() } else { notes.join("; ") });
        }
        let cg = Self { bases };
        let ended = cg.sweep_dead();
        Ok((cg, ended))
    }

    /// Whether launches can be killed whole through `cgroup.kill`.
    pub fn kills_whole(&self) -> bool {
        self.bases.iter().any(|b| b.v2 && b.dir.join("cgroup.kill").exists())
    }

    /// What the groups control, for the worker's start line.
    pub fn describe(&self) -> String {
        let mut c = Controls::default();
        for b in &self.bases {
            c.pids |= b.controls.pids;
            c.memory |= b.controls.memory;
            c.cpu |= b.controls.cpu;
        }
        let mut parts: Vec<&str> = Vec::new();
        if self.kills_whole() {
            parts.push("kill");
        }
        for (on, n) in [(c.pids, "pids"), (c.memory, "memory"), (c.cpu, "cpu")] {
            if on {
                parts.push(n);
            }
        }
        let v = match (self.bases.iter().any(|b| b.v2), self.bases.iter().any(|b| !b.v2)) {
            (true, true) => "v2 + v1",
            (true, false) => "v2",
            _ => "v1",
        };
        format!("cgroup {v} ({})", parts.join(", "))
    }

    /// Which of `limits` the kernel enforces here (the rest fall back to rlimits).
    pub fn enforces(&self) -> TaskLimits {
        let any = |f: fn(&Controls) -> bool| self.bases.iter().any(|b| f(&b.controls));
        TaskLimits {
            processes: any(|c| c.pids).then_some(1),
            memory: any(|c| c.memory).then_some(1),
            cpu_millis: any(|c| c.cpu).then_some(1),
        }
    }

    /// A task's group with its limits.
    pub fn task_group(&self, name: &str, limits: &TaskLimits) -> io::Result<TaskGroup> {
        let mut dirs = Vec::new();
        for b in &self.bases {
            let dir = b.dir.join(name);
            mkdir(&dir)?;
            dirs.push(Base { dir, v2: b.v2, controls: b.controls });
        }
        let group = TaskGroup { dirs, next: AtomicU64::new(0), limits: *limits };
        for b in &group.dirs {
            set_limits(b, limits)?;
        }
        Ok(group)
    }

    /// End and remove the bases beside this one whose worker is gone, and
    /// whatever is left in this one's (a base of the same name: a process
    /// that had this pid and start time cannot be alive); how many
    /// processes were found running.
    fn sweep_dead(&self) -> usize {
        let mut killed = 0;
        for b in &self.bases {
            let Some(parent) = b.dir.parent() else { continue };
            let Ok(rd) = std::fs::read_dir(parent) else { continue };
            for sibling in rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                let name = sibling.file_name();
                let Some(owner) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else { continue };
                let alive = owner
                    .split_once('-')
                    .and_then(|(pid, start)| Some((pid.parse::<u32>().ok()?, start.parse::<u64>().ok()?)))
                    .is_some_and(|(pid, start)| start_time(pid) == Some(start));
                let dir = sibling.path();
                if dir == b.dir {
                    if let Ok(groups) = std::fs::read_dir(&dir) {
                        for g in groups.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                            killed += remove_tree(&Base { dir: g.path(), v2: b.v2, controls: b.controls });
                        }
                    }
                } else if !alive {
                    killed += remove_tree(&Base { dir, v2: b.v2, controls: b.controls });
                }
            }
        }
        killed
    }
}

/// Base directories are named `PREFIX` + the worker's pid and start time.
const PREFIX: &str = "flower-tools-";

/// A process's start time (clock ticks after boot, `/proc/PID/stat` field 22).
fn start_time(pid: u32) -> Option<u64> {
    let stat = read(Path::new(&format!("/proc/{pid}/stat"))).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The v2 base under this process's own group `path` of the mount `point`.
/// Where this process's group holds processes and its children would need
/// controllers, the worker first moves itself to a leaf (`flower-worker`):
/// a v2 group may hand controllers down only while it holds no process.
fn v2_base(point: &Path, path: &str, name: &str) -> Result<Base, String> {
    let own = point.join(path.trim_start_matches('/'));
    let available = read(&own.join("cgroup.controllers")).map_err(|e| format!("{}: {e}", own.display()))?;
    let wanted: Vec<&str> = available.split_whitespace().filter(|c| matches!(*c, "pids" | "memory" | "cpu")).collect();
    let enabled = read(&own.join("cgroup.subtree_control")).unwrap_or_default();
    let missing: Vec<&str> = wanted.iter().copied().filter(|c| !enabled.split_whitespace().any(|e| e == *c)).collect();
    if !missing.is_empty() {
        if path != "/" {
            let leaf = own.join("flower-worker");
            mkdir(&leaf).map_err(|e| e.to_string())?;
            write(&leaf.join("cgroup.procs"), "0").map_err(|e| e.to_string())?;
        }
        for c in &missing {
            // One at a time: a controller this group may not delegate stays off, the others on.
            let _ = write(&own.join("cgroup.subtree_control"), &format!("+{c}"));
        }
    }
    let dir = own.join(name);
    mkdir(&dir).map_err(|e| e.to_string())?;
    let has = read(&dir.join("cgroup.controllers")).unwrap_or_default();
    for c in has.split_whitespace().filter(|c| matches!(*c, "pids" | "memory" | "cpu")) {
        let _ = write(&dir.join("cgroup.subtree_control"), &format!("+{c}"));
    }
    let on = |c: &str| has.split_whitespace().any(|h| h == c);
    Ok(Base { dir, v2: true, controls: Controls { pids: on("pids"), memory: on("memory"), cpu: on("cpu") } })
}

/// CPU period for quotas (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;

fn set_limits(b: &Base, l: &TaskLimits) -> io::Result<()> {
    let c = b.controls;
    if let (true, Some(n)) = (c.pids, l.processes) {
        write(&b.dir.join("pids.max"), &n.to_string())?;
    }
    if let (true, Some(bytes)) = (c.memory, l.memory) {
        if b.v2 {
            write(&b.dir.join("memory.max"), &bytes.to_string())?;
            let swap = b.dir.join("memory.swap.max");
            if swap.exists() {
                write(&swap, "0")?;
            }
        } else {
            write(&b.dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
            let memsw = b.dir.join("memory.memsw.limit_in_bytes");
            if memsw.exists() {
                write(&memsw, &bytes.to_string())?;
            }
        }
    }
    if let (true, Some(millis)) = (c.cpu, l.cpu_millis) {
        let quota = (millis * CPU_PERIOD_US / 1000).max(1000);
        if b.v2 {
            write(&b.dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
        } else {
            write(&b.dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            write(&b.dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
        }
    }
    Ok(())
}

/// Kernel counters of a group: limits hit so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Processes the kernel killed for the memory limit.
    pub oom_kills: u64,
    /// Forks refused at the process limit.
    pub forks_refused: u64,
}

fn counter(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// One task's group (see the module doc); dropped, it ends every launch
/// left in it and is removed.
#[derive(Debug)]
pub struct TaskGroup {
    dirs: Vec<Base>,
    next: AtomicU64,
    limits: TaskLimits,
}

impl TaskGroup {
    pub fn limits(&self) -> &TaskLimits {
        &self.limits
    }

    /// A new leaf for one launch.
    pub fn leaf(&self) -> io::Result<Leaf> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut dirs = Vec::new();
        for b in &self.dirs {
            let dir = b.dir.join(format!("l{n}"));
            mkdir(&dir)?;
            dirs.push(Base { dir, v2: b.v2, controls: b.controls });
        }
        Ok(Leaf { dirs })
    }

    /// The limits hit so far by any launch of the task.
    pub fn counters(&self) -> Counters {
        counters_of(&self.dirs)
    }
}

/// The counters of `dirs` (one per hierarchy). Where a kernel counts an
/// event (a hierarchy's choice: v1 counts a refused fork in the forking
/// group, v2 in the group whose limit it hit), its group's file says so.
fn counters_of(dirs: &[Base]) -> Counters {
    let mut c = Counters::default();
    for b in dirs {
        if b.controls.memory {
            let file = if b.v2 { "memory.events" } else { "memory.oom_control" };
            c.oom_kills += counter(&read(&b.dir.join(file)).unwrap_or_default(), "oom_kill");
        }
        if b.controls.pids {
            c.forks_refused += counter(&read(&b.dir.join("pids.events")).unwrap_or_default(), "max");
        }
    }
    c
}

impl Counters {
    /// What one launch hit: its leaf's own counts, or the task group's
    /// growth over the launch, whichever the kernel recorded.
    pub fn of_launch(leaf: Counters, group_before: Counters, group_after: Counters) -> Counters {
        Counters {
            oom_kills: leaf.oom_kills.max(group_after.oom_kills.saturating_sub(group_before.oom_kills)),
            forks_refused: leaf.forks_refused.max(group_after.forks_refused.saturating_sub(group_before.forks_refused)),
        }
    }
}

impl Drop for TaskGroup {
    /// Emptying waits for the kernel: done off the caller's thread (which
    /// may be an async runtime's).
    fn drop(&mut self) {
        let dirs = std::mem::take(&mut self.dirs);
        let _ = std::thread::Builder::new().name("cgroup-remove".into()).spawn(move || {
            for b in &dirs {
                remove_tree(b);
            }
        });
    }
}

/// A task's group, made at its first launch: a task whose tools never go
/// through the launcher (`Write`, `Read` only) makes none.
#[derive(Debug)]
pub struct LazyGroup {
    cgroups: std::sync::Arc<Cgroups>,
    name: String,
    limits: TaskLimits,
    made: tokio::sync::OnceCell<std::sync::Arc<TaskGroup>>,
}

impl LazyGroup {
    pub fn new(cgroups: std::sync::Arc<Cgroups>, name: String, limits: TaskLimits) -> Self {
        Self { cgroups, name, limits, made: tokio::sync::OnceCell::new() }
    }

    /// The group, made on first use (off the async threads).
    pub async fn get(&self) -> io::Result<std::sync::Arc<TaskGroup>> {
        self.made
            .get_or_try_init(|| async {
                let (c, name, limits) = (self.cgroups.clone(), self.name.clone(), self.limits);
                tokio::task::spawn_blocking(move || c.task_group(&name, &limits).map(std::sync::Arc::new))
                    .await
                    .map_err(io::Error::other)?
            })
            .await
            .cloned()
    }
}

/// One launch's group in each hierarchy.
#[derive(Debug)]
pub struct Leaf {
    dirs: Vec<Base>,
}

impl Leaf {
    /// The directories the launcher joins (`--cgroup`).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|b| b.dir.clone()).collect()
    }

    /// The limits hit by this launch's processes, as counted in the leaf.
    pub fn counters(&self) -> Counters {
        counters_of(&self.dirs)
    }

    /// Kill every process in the leaf and remove it (blocking: waits, at
    /// most a few seconds, for the kernel to empty it).
    pub fn close(self) -> usize {
        let mut killed = 0;
        for b in &self.dirs {
            killed += remove_tree(b);
        }
        killed
    }
}

/// The processes of a group (v1 and v2 alike).
fn procs(dir: &Path) -> Vec<i32> {
    read(&dir.join("cgroup.procs")).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Kill everything in `b` and beneath, then remove the directories, leaves
/// first; how many processes were found running.
fn remove_tree(b: &Base) -> usize {
    let mut killed = 0;
    if let Ok(rd) = std::fs::read_dir(&b.dir) {
        for sub in rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
            killed += remove_tree(&Base { dir: sub.path(), v2: b.v2, controls: b.controls });
        }
    }
    let kill_file = b.dir.join("cgroup.kill");
    let v2_kill = b.v2 && kill_file.exists();
    for round in 0..200 {
        let left = procs(&b.dir);
        if round == 0 {
            killed += left.len();
        }
        if left.is_empty() {
            match std::fs::remove_dir(&b.dir) {
                Ok(()) => return killed,
                Err(e) if e.kind() == ErrorKind::NotFound => return killed,
                // Processes that were exiting still count until reaped.
                Err(_) => {}
            }
        } else if v2_kill {
            let _ = std::fs::write(&kill_file, "1");
        } else {
            for pid in left {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(if round < 20 { 1 } else { 25 }));
    }
    tracing::warn!(group = %b.dir.display(), "a tool group could not be emptied and removed");
    killed
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    #[test]
    fn mounts_and_own_groups_parse() {
        let mi = "35 24 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                  36 24 0:31 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n\
                  37 24 0:32 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                  38 24 0:33 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n\
                  22 1 8:1 / / rw - ext4 /dev/vda rw";
        let m = parse_mounts(mi);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0], CgroupMount { point: "/sys/fs/cgroup/unified".into(), v2: true, controllers: vec![] });
        assert_eq!(m[1].controllers, vec!["pids"]);
        assert_eq!(m[2].controllers, vec!["cpu"]);
        assert!(m[3].controllers.is_empty());
        let own = parse_self("8:pids:/\n4:memory:/a/b\n0::/user.slice/x\n");
        assert_eq!(own[1], (vec!["memory".to_string()], "/a/b".to_string()));
        assert_eq!(own[2], (vec![], "/user.slice/x".to_string()));
    }

    /// On this host's kernel: a launch's leaf is joined, killed whole (a
    /// process in a session of its own included) and removed; what a worker
    /// that died left in its base is ended by the next one on the same tag.
    #[test]
    fn leaves_die_whole_and_a_new_worker_ends_what_the_last_one_left() {
        assert!(nix::unistd::Uid::effective().is_root(), "this test makes control groups: run the tests as root");
        // A base named as a worker that is gone: pid 0 never is one.
        let name = format!("{PREFIX}0-{}", std::process::id());
        let (cg, _) = Cgroups::setup_named(&name).unwrap();
        assert!(cg.kills_whole() || !cg.bases.is_empty(), "{}", cg.describe());
        let limits = TaskLimits { processes: Some(50), memory: Some(64 << 20), cpu_millis: Some(500) };
        let group = cg.task_group("task-1", &limits).unwrap();
        // A shell moved into the leaf, then told to start a sleep in a
        // session of its own and become another; both are in the leaf.
        let spawn_into = |leaf: &Leaf| {
            use std::io::Write;
            let mut child = std::process::Command::new("sh")
                .arg("-c")
                .arg("read go; setsid sleep 300 & echo started; exec sleep 300")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            for d in leaf.dirs() {
                std::fs::write(d.join("cgroup.procs"), child.id().to_string()).unwrap();
            }
            child.stdin.take().unwrap().write_all(b"go\n").unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
            assert_eq!(line, "started\n");
            child
        };
        let leaf = group.leaf().unwrap();
        let mut child = spawn_into(&leaf);
        let dirs = leaf.dirs();
        assert_eq!(procs(&dirs[0]).len(), 2, "the shell and its setsid child");
        assert!(leaf.close() >= 2, "both were found running");
        assert!(child.wait().unwrap().signal().is_some());
        assert!(dirs.iter().all(|d| !d.exists()), "the leaf is removed");

        // A worker dies: its group and a running leaf stay behind.
        let leaf = group.leaf().unwrap();
        let mut orphan = spawn_into(&leaf);
        std::mem::forget(leaf);
        std::mem::forget(group);
        let left: Vec<PathBuf> = cg.bases.iter().map(|b| b.dir.clone()).collect();
        let (next, ended) = Cgroups::setup().unwrap();
        assert!(ended >= 1, "the next worker ended what was left");
        assert!(orphan.wait().unwrap().signal().is_some());
        assert!(left.iter().all(|d| !d.exists()), "the dead worker's bases are removed");
        for b in &next.bases {
            std::fs::remove_dir(&b.dir).unwrap();
        }
    }

    #[test]
    fn start_times_are_read_past_odd_command_names() {
        assert!(start_time(std::process::id()).is_some_and(|t| t > 0));
        assert_eq!(start_time(0), None);
    }

    #[test]
    fn counters_read_the_kernel_files() {
        assert_eq!(counter("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n", "oom_kill"), 2);
        assert_eq!(counter("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n", "oom_kill"), 5);
        assert_eq!(counter("max 7\n", "max"), 7);
        assert_eq!(counter("", "max"), 0);
    }
}
