//! The tool launcher: what `flower tool-exec` does, in a process of its own,
//! before a tool's command (a `Bash` command, an MCP stdio server) runs, so
//! the command cannot see or reach what the service holds.
//!
//! In order, each step degrading (and saying so) where the host refuses it:
//!
//! 0. The launcher dies with the worker thread that started it (parent-death
//!    signal; a worker already gone ends it at once) and joins the launch's
//!    control groups ([`crate::cgroup`]) before anything else runs, so every
//!    process it leads to is counted, limited and killed with them.
//! 1. New namespaces: mount, PID and — unless the operator opened the
//!    network — network. As root directly; otherwise inside a new user
//!    namespace (the same uid mapped).
//! 2. With a PID namespace the launcher starts itself again as the
//!    namespace's pid 1, which reaps and exits with the command's status;
//!    when it ends, the kernel kills everything left in the namespace.
//! 3. Mounts (private to the namespace): every mount read-only; fresh tmpfs
//!    over `/tmp`, `/var/tmp`, `/dev/shm`, the `--hide` directories (the
//!    database's socket directories) and the first ancestor of the task
//!    directory the tool user cannot search; the task directory bound back
//!    writable at its own path; a fresh `/proc` of the new PID namespace (or
//!    an empty one when there is none).
//! 4. Credentials: as root, `setgroups([])`, `setgid`, `setuid` to the tool
//!    user; in a user namespace, a nested one drops the capabilities.
//!    `no_new_privs` in both.
//! 5. Landlock, where the kernel has it: writes only beneath the task
//!    directory, the fresh temporary directories and a few devices; no
//!    signals or abstract sockets outside the sandbox.
//! 6. Seccomp: the kernel's keyrings refused; without a network namespace
//!    where one was wanted, every socket but Unix ones (and io_uring, which
//!    could make them), so no network is left rather than some.
//! 7. Resource limits (`setrlimit`): the largest file (the task's
//!    workspace limit), and processes and memory where no control group
//!    holds them.
//! 8. The command replaces the launcher (or is pid 1's child).
//!
//! With `--report`, the last step prints what is in force, as JSON, instead.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::stat::Mode;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Gid, Pid, Uid};
use serde::{Deserialize, Serialize};

/// Outbound network of a tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkPolicy {
    /// No network at all: an empty network namespace (or, where none can be
    /// made, a seccomp filter leaving Unix sockets only).
    None,
    /// The host's network, unfiltered: for trials on a machine of one's own.
    Open,
}

impl std::str::FromStr for NetworkPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "open" => Ok(Self::Open),
            "loopback-deny" => Err(
                "`loopback-deny` is gone: a list of refused ports left every other door open; tools get no network (`none`)"
                    .into(),
            ),
            _ => Err(format!("`{s}`: expected none or open")),
        }
    }
}

impl std::fmt::Display for NetworkPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Open => "open",
        })
    }
}

/// What every launch must put in force (what the worker's probe found at
/// start): a launch that cannot is refused, never run with less.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Required {
    pub pid_namespace: bool,
    pub mount_namespace: bool,
    pub network_namespace: bool,
    pub read_only: bool,
    pub fresh_proc: bool,
}

impl Required {
    /// What a probe's report requires of later launches.
    pub fn from_applied(a: &Applied) -> Self {
        Self {
            pid_namespace: a.pid_namespace,
            mount_namespace: a.mount_namespace,
            network_namespace: a.network_namespace,
            read_only: a.read_only,
            fresh_proc: a.proc == "fresh",
        }
    }

    /// `Err` naming what `a` lacks of this, and why (its notes).
    fn check(&self, a: &Applied) -> Result<(), String> {
        let missing = self.missing(a);
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "refusing to run with less isolation than at start, without {} ({})",
            missing.join(", "),
            a.notes.join("; ")
        ))
    }

    /// What `a` lacks of this, if anything.
    fn missing(&self, a: &Applied) -> Vec<&'static str> {
        let mut m = Vec::new();
        for (want, have, what) in [
            (self.pid_namespace, a.pid_namespace, "a PID namespace"),
            (self.mount_namespace, a.mount_namespace, "a mount namespace"),
            (self.network_namespace, a.network_namespace, "a network namespace"),
            (self.read_only, a.read_only, "read-only mounts"),
            (self.fresh_proc, a.proc == "fresh", "a fresh /proc"),
        ] {
            if want && !have {
                m.push(what);
            }
        }
        m
    }
}

/// Resource limits (`setrlimit`) of the command and everything it starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    /// Largest file it may write, in bytes (`RLIMIT_FSIZE`).
    pub file_size: Option<u64>,
    /// Processes of its user (`RLIMIT_NPROC`): only where no control group counts them.
    pub processes: Option<u64>,
    /// Address space of each process (`RLIMIT_AS`): only where no control group holds memory.
    pub address_space: Option<u64>,
}

/// The variable a worker hands the launcher its options in (JSON), so that
/// neither the launcher's command line nor its namespace's pid 1's — which
/// a tool can read in `/proc` — shows the hidden paths; the command never
/// gets it.
pub const OPTIONS_ENV: &str = "FLOWER_TOOL_EXEC";

/// What the launcher is asked to do (its command line, or [`OPTIONS_ENV`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchOptions {
    /// Run as this uid:gid (the launcher must be root); `None`: as the launcher's user.
    pub user: Option<(u32, u32)>,
    pub network: NetworkPolicy,
    /// Control group directories to join first (one per hierarchy).
    pub cgroups: Vec<PathBuf>,
    /// The worker's pid: the launcher ends at once if its parent is another.
    pub parent: Option<u32>,
    pub rlimits: Rlimits,
    /// Make no network namespace (the seccomp path, for tests of it).
    pub no_network_namespace: bool,
    /// The task's egress proxy socket ([`crate::egress`]): inside the
    /// network namespace, `127.0.0.1:`[`crate::egress::PROXY_PORT`] leads to it.
    #[serde(default)]
    pub egress: Option<PathBuf>,
    /// What must be in force, or the launch is refused (see [`Required`]).
    #[serde(default)]
    pub require: Option<Required>,
    /// The task directory: the working directory, the only place writable.
    pub confine: PathBuf,
    /// Directories hidden behind an empty tmpfs (e.g. a database's socket directory).
    pub hide: Vec<PathBuf>,
    /// Print what is in force instead of running the command.
    pub report: bool,
    /// Set in the second stage (pid 1 of the new PID namespace): what the first did.
    pub init: Option<Applied>,
    /// The command and its arguments.
    pub argv: Vec<OsString>,
}

impl LaunchOptions {
    /// The options as the value of [`OPTIONS_ENV`].
    pub fn to_env(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read [`LaunchOptions::to_env`]'s output.
    pub fn from_env(value: &str) -> Result<Self, String> {
        let o: Self = serde_json::from_str(value).map_err(|e| format!("{OPTIONS_ENV}: {e}"))?;
        if !o.confine.is_absolute() {
            return Err("confine: an absolute directory is required".into());
        }
        if o.argv.is_empty() && !o.report {
            return Err("no command".into());
        }
        Ok(o)
    }

    /// The launcher's arguments (after `tool-exec`).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        if let Some((u, g)) = self.user {
            a.extend(["--user".into(), format!("{u}:{g}").into()]);
        }
        a.extend(["--network".into(), self.network.to_string().into()]);
        for c in &self.cgroups {
            a.extend(["--cgroup".into(), c.clone().into_os_string()]);
        }
        if let Some(p) = self.parent {
            a.extend(["--parent".into(), p.to_string().into()]);
        }
        let r = &self.rlimits;
        for (flag, v) in [
            ("--max-file-size", r.file_size),
            ("--max-processes", r.processes),
            ("--max-address-space", r.address_space),
        ] {
            if let Some(v) = v {
                a.extend([flag.into(), v.to_string().into()]);
            }
        }
        if self.no_network_namespace {
            a.push("--no-network-namespace".into());
        }
        if let Some(e) = &self.egress {
            a.extend(["--egress".into(), e.clone().into_os_string()]);
        }
        if let Some(r) = &self.require {
            a.extend(["--require".into(), serde_json::to_string(r).unwrap_or_default().into()]);
        }
        a.extend(["--confine".into(), self.confine.clone().into_os_string()]);
        for h in &self.hide {
            a.extend(["--hide".into(), h.clone().into_os_string()]);
        }
        if self.report {
            a.push("--report".into());
        }
        if let Some(init) = &self.init {
            a.extend(["--init".into(), serde_json::to_string(init).unwrap_or_default().into()]);
        }
        a.push("--".into());
        a.extend(self.argv.iter().cloned());
        a
    }

    /// Parse [`LaunchOptions::to_args`]'s output.
    pub fn parse(args: &[OsString]) -> Result<Self, String> {
        let mut o = LaunchOptions {
            user: None,
            network: NetworkPolicy::None,
            cgroups: Vec::new(),
            parent: None,
            rlimits: Rlimits::default(),
            no_network_namespace: false,
            egress: None,
            require: None,
            confine: PathBuf::new(),
            hide: Vec::new(),
            report: false,
            init: None,
            argv: Vec::new(),
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| it.next().cloned().ok_or_else(|| format!("{name}: a value is required"));
            match arg.to_str() {
                Some("--user") => {
                    let v = value("--user")?;
                    let v = v.to_string_lossy();
                    let (u, g) = v.split_once(':').ok_or("--user: expected UID:GID")?;
                    let num = |s: &str| s.parse::<u32>().map_err(|_| format!("--user: `{v}` is not UID:GID"));
                    o.user = Some((num(u)?, num(g)?));
                }
                Some("--network") => o.network = value("--network")?.to_string_lossy().parse()?,
                Some("--cgroup") => o.cgroups.push(PathBuf::from(value("--cgroup")?)),
                Some("--parent") => {
                    o.parent = Some(value("--parent")?.to_string_lossy().parse().map_err(|_| "--parent: not a pid")?)
                }
                Some(flag @ ("--max-file-size" | "--max-processes" | "--max-address-space")) => {
                    let v: u64 = value(flag)?.to_string_lossy().parse().map_err(|_| format!("{flag}: not a number"))?;
                    match flag {
                        "--max-file-size" => o.rlimits.file_size = Some(v),
                        "--max-processes" => o.rlimits.processes = Some(v),
                        _ => o.rlimits.address_space = Some(v),
                    }
                }
                Some("--no-network-namespace") => o.no_network_namespace = true,
                Some("--egress") => o.egress = Some(PathBuf::from(value("--egress")?)),
                Some("--require") => {
                    o.require = Some(
                        serde_json::from_str(&value("--require")?.to_string_lossy())
                            .map_err(|e| format!("--require: {e}"))?,
                    )
                }
                Some("--confine") => o.confine = PathBuf::from(value("--confine")?),
                Some("--hide") => o.hide.push(PathBuf::from(value("--hide")?)),
                Some("--report") => o.report = true,
                Some("--init") => {
                    o.init = Some(
                        serde_json::from_str(&value("--init")?.to_string_lossy())
                            .map_err(|e| format!("--init: {e}"))?,
                    )
                }
                Some("--") => {
                    o.argv = it.cloned().collect();
                    break;
                }
                _ => return Err(format!("unexpected argument `{}`", arg.to_string_lossy())),
            }
        }
        if !o.confine.is_absolute() {
            return Err("--confine: an absolute directory is required".into());
        }
        if o.argv.is_empty() && !o.report {
            return Err("no command after `--`".into());
        }
        Ok(o)
    }
}

/// What is in force for the command (the probe's report).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// `uid:gid` the command runs as, when it is another user than the worker's.
    pub user: Option<String>,
    /// The worker's uid and gid (a user namespace maps them).
    pub outer: (u32, u32),
    pub user_namespace: bool,
    pub pid_namespace: bool,
    pub mount_namespace: bool,
    pub network_namespace: bool,
    /// `fresh` (the new PID namespace's), `hidden` (an empty tmpfs) or `host`.
    pub proc: String,
    /// Every mount but the task directory and the fresh tmpfs is read-only.
    pub read_only: bool,
    /// Fresh tmpfs over /tmp, /var/tmp and /dev/shm.
    pub private_tmp: bool,
    /// Landlock ABI and enforcement, when a ruleset was applied.
    pub landlock: Option<String>,
    pub landlock_fs: bool,
    pub landlock_net: bool,
    pub landlock_scopes: bool,
    pub no_new_privs: bool,
    /// The seccomp filter leaving Unix sockets only is in force.
    #[serde(default)]
    pub seccomp_net: bool,
    /// The seccomp filter refusing the kernel's keyrings is in force.
    #[serde(default)]
    pub seccomp_keyrings: bool,
    /// Control groups joined (one per hierarchy).
    #[serde(default)]
    pub cgroups: usize,
    /// The way to the egress proxy is open inside the network namespace.
    #[serde(default)]
    pub egress: bool,
    /// The launcher dies with the worker (parent-death signal).
    #[serde(default)]
    pub dies_with_worker: bool,
    /// What the network policy became.
    pub network: String,
    /// Resource limits set (`setrlimit`), as `what value`.
    #[serde(default)]
    pub rlimits: Vec<String>,
    /// What could not be put in force, and why.
    pub notes: Vec<String>,
}

/// Exit status when the launcher itself fails before the command runs.
pub const SETUP_FAILED: i32 = 126;

/// Run the launcher; the exit code for the process (the command's, when it ran).
pub fn run(opts: LaunchOptions) -> i32 {
    let result = match opts.init.clone() {
        Some(applied) => init_stage(&opts, applied),
        None => first_stage(&opts),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flower tool-exec: {e}");
            SETUP_FAILED
        }
    }
}

fn first_stage(opts: &LaunchOptions) -> Result<i32, String> {
    let mut a = Applied { outer: (Uid::current().as_raw(), Gid::current().as_raw()), ..Default::default() };
    // Dying with the worker comes first: a worker killed from here on takes
    // the launcher (and through pid 1's own signal, the namespace) along.
    if let Some(parent) = opts.parent {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| format!("parent-death signal: {e}"))?;
        if nix::unistd::getppid().as_raw() as u32 != parent {
            return Err("the worker that started this launch is gone".into());
        }
        a.dies_with_worker = true;
    }
    for dir in &opts.cgroups {
        std::fs::write(dir.join("cgroup.procs"), "0").map_err(|e| format!("joining {}: {e}", dir.display()))?;
        a.cgroups += 1;
    }
    let root = Uid::effective().is_root();
    if opts.user.is_some() && !root {
        return Err("--user needs root".into());
    }
    let want_netns = opts.network == NetworkPolicy::None && !opts.no_network_namespace;
    let mut base = CloneFlags::CLONE_NEWNS;
    if want_netns {
        base |= CloneFlags::CLONE_NEWNET;
    }
    let mut entered = None;
    for flags in [base | CloneFlags::CLONE_NEWPID, base] {
        let r = if root { unshare(flags).map_err(|e| e.to_string()) } else { enter_user_namespace(flags) };
        match r {
            Ok(()) => {
                entered = Some(flags);
                break;
            }
            Err(e) => a.notes.push(format!("namespaces {flags:?}: {e}")),
        }
    }
    if let Some(flags) = entered {
        // Only a refused PID namespace is worth keeping (as why there is none).
        a.notes.truncate(usize::from(!flags.contains(CloneFlags::CLONE_NEWPID)));
        a.user_namespace = !root;
        a.mount_namespace = true;
        a.pid_namespace = flags.contains(CloneFlags::CLONE_NEWPID);
        a.network_namespace = flags.contains(CloneFlags::CLONE_NEWNET);
    } else {
        a.notes.push(if root {
            "no namespaces (unshare refused): the command sees this host's mounts, processes and network".into()
        } else {
            "no user namespace (refused by this host): the command runs as this process's user in its namespaces".into()
        });
    }
    // The namespaces now; the mounts and /proc once made (the last stage).
    if let Some(r) = &opts.require {
        Required { read_only: false, fresh_proc: false, ..*r }.check(&a)?;
    }
    // Its /proc entries (environment, memory) closed to the tool: after the
    // user namespace's maps are written (a process that is not dumpable
    // cannot write its own).
    let _ = nix::sys::prctl::set_dumpable(false);
    if a.pid_namespace {
        // The command's pid 1: this binary again, inside the new PID namespace.
        let mut next = opts.clone();
        next.init = Some(a);
        let status = Command::new("/proc/self/exe")
            .arg0("flower")
            .arg("tool-exec")
            .env(OPTIONS_ENV, next.to_env())
            .status()
            .map_err(|e| format!("starting the namespace's first process: {e}"))?;
        return Ok(exit_code(status));
    }
    final_stage(opts, a, false)
}

fn init_stage(opts: &LaunchOptions, applied: Applied) -> Result<i32, String> {
    // Whatever ends the launcher above ends this process, and with it the namespace.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    final_stage(opts, applied, true)
}

fn final_stage(opts: &LaunchOptions, mut a: Applied, pid1: bool) -> Result<i32, String> {
    let root = Uid::effective().is_root() && !a.user_namespace;
    // `/proc/self/exe` (this binary, as an MCP server spec's `flower`) needs
    // a /proc; where only an empty one is left, its path instead.
    let self_exe = std::env::current_exe().ok();
    a.proc = "host".into();
    if a.mount_namespace
        && let Err(Fatal(e)) = confine_mounts(opts, &mut a, root)
    {
        return Err(e);
    }
    if a.mount_namespace {
        a.proc = mount_proc(pid1);
        if a.proc == "host" {
            a.notes.push("/proc: neither a fresh one nor an empty one could be mounted".into());
        }
    }
    if let Some(r) = &opts.require {
        r.check(&a)?;
    }
    std::env::set_current_dir(&opts.confine).map_err(|e| format!("{}: {e}", opts.confine.display()))?;
    // The way to the egress proxy, made while the namespace's capabilities last.
    let forward = match (&opts.egress, pid1 && a.network_namespace) {
        (Some(socket), true) => match egress_listener() {
            Ok(l) => {
                a.egress = true;
                Some((l, socket.clone()))
            }
            Err(e) => {
                a.notes.push(format!("egress: {e}"));
                None
            }
        },
        (Some(_), false) => {
            a.notes.push("egress needs a PID and a network namespace of the tool's own: none granted".into());
            None
        }
        (None, _) => None,
    };
    if root {
        if let Some((u, g)) = opts.user {
            give_stdio(u, g);
            drop_to(u, g)?;
            a.user = Some(format!("{u}:{g}"));
        }
    } else if a.user_namespace {
        // Capabilities held in the namespace end here: a nested user
        // namespace, the worker's uid inside.
        enter_nested_user_namespace(a.outer)?;
    }
    let _ = nix::sys::prctl::set_dumpable(false);
    if pid1 || a.dies_with_worker {
        // Set again: a change of credentials clears it.
        let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    }
    a.no_new_privs = nix::sys::prctl::set_no_new_privs().is_ok();
    apply_landlock(opts, &mut a);
    match crate::seccomp::no_keyrings() {
        Ok(()) => a.seccomp_keyrings = true,
        Err(e) => a.notes.push(format!("seccomp: {e} (the kernel's keyrings stay open to tools)")),
    }
    if opts.network == NetworkPolicy::None && !a.network_namespace {
        match crate::seccomp::unix_sockets_only() {
            Ok(()) => a.seccomp_net = true,
            Err(e) => {
                return Err(format!(
                    "no network namespace and no seccomp filter ({e}): refusing to run with a network"
                ));
            }
        }
    }
    apply_rlimits(&opts.rlimits, &mut a)?;
    a.network = describe_network(opts, &a);
    if opts.report {
        println!("{}", serde_json::to_string(&a).map_err(|e| e.to_string())?);
        return Ok(0);
    }
    let (program, args) = opts.argv.split_first().ok_or("no command")?;
    let program = match &self_exe {
        Some(exe) if program == "/proc/self/exe" && a.proc == "hidden" => exe.as_os_str(),
        _ => program.as_os_str(),
    };
    let mut cmd = Command::new(program);
    cmd.args(args).env_remove(OPTIONS_ENV);
    if !pid1 {
        let e = cmd.exec();
        return Err(format!("{}: {e}", program.to_string_lossy()));
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("flower tool-exec: {}: {e}", program.to_string_lossy());
            return Ok(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { SETUP_FAILED });
        }
    };
    let pid = Pid::from_raw(child.id() as i32);
    if let Some((listener, socket)) = forward {
        std::thread::spawn(move || forward_egress(listener, &socket));
    }
    // pid 1 reaps every orphan; the command's end is the namespace's end.
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(p, code)) if p == pid => return Ok(code),
            Ok(WaitStatus::Signaled(p, sig, _)) if p == pid => return Ok(128 + sig as i32),
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => return Err(format!("waiting for the command: {e}")),
        }
    }
}

/// Bring the namespace's loopback up and listen where tools find the
/// egress proxy.
fn egress_listener() -> Result<std::net::TcpListener, String> {
    let up = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .env("PATH", crate::isolation::TOOL_PATH)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("`ip link set lo up`: {e} (iproute2 is needed for egress)"))?;
    if !up.status.success() {
        return Err(format!("`ip link set lo up`: {}", String::from_utf8_lossy(&up.stderr).trim()));
    }
    std::net::TcpListener::bind(("127.0.0.1", crate::egress::PROXY_PORT))
        .map_err(|e| format!("127.0.0.1:{}: {e}", crate::egress::PROXY_PORT))
}

/// pid 1's forwarder: each connection to the listener joined to the
/// task's egress proxy socket (in the task folder, pid 1's working
/// directory: reached by its name, a socket's path being at most 107 bytes).
fn forward_egress(listener: std::net::TcpListener, socket: &Path) {
    let name = socket.file_name().map_or_else(|| socket.to_path_buf(), PathBuf::from);
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        let Ok(unix) = std::os::unix::net::UnixStream::connect(&name) else { continue };
        let (Ok(mut tcp_r), Ok(mut unix_w)) = (tcp.try_clone(), unix.try_clone()) else { continue };
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut tcp_r, &mut unix_w);
            let _ = unix_w.shutdown(std::net::Shutdown::Write);
        });
        let (mut unix_r, mut tcp_w) = (unix, tcp);
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut unix_r, &mut tcp_w);
            let _ = tcp_w.shutdown(std::net::Shutdown::Write);
        });
    }
}

/// A fresh /proc for pid 1 of a new PID namespace; elsewhere an empty one
/// (the host's would show the worker's command line).
fn mount_proc(pid1: bool) -> String {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if pid1 && mount(Some("proc"), "/proc", Some("proc"), flags, None::<&str>).is_ok() {
        return "fresh".into();
    }
    let empty = Some("size=4k,mode=0555");
    if mount(Some("tmpfs"), "/proc", Some("tmpfs"), flags | MsFlags::MS_RDONLY, empty).is_ok() {
        return "hidden".into();
    }
    "host".into()
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// A failure that must stop the launch (the command would run unconfined
/// where confinement was set up in part).
struct Fatal(String);

/// Unprivileged: a user namespace with this uid mapped to 0 inside, so the
/// other namespaces can be made and their mounts changed.
fn enter_user_namespace(flags: CloneFlags) -> Result<(), String> {
    let (uid, gid) = (Uid::current().as_raw(), Gid::current().as_raw());
    unshare(flags | CloneFlags::CLONE_NEWUSER).map_err(|e| e.to_string())?;
    write_maps(0, uid, 0, gid).map_err(|e| format!("user namespace mapping: {e}"))
}

/// Drop the namespace's capabilities: a nested user namespace in which
/// the process is the worker's uid again (not 0).
fn enter_nested_user_namespace((uid, gid): (u32, u32)) -> Result<(), String> {
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| format!("dropping capabilities: {e}"))?;
    let inside = if uid == 0 { 65534 } else { uid };
    let inside_gid = if gid == 0 { 65534 } else { gid };
    write_maps(inside, 0, inside_gid, 0).map_err(|e| format!("dropping capabilities: {e}"))
}

fn write_maps(inside_uid: u32, outside_uid: u32, inside_gid: u32, outside_gid: u32) -> std::io::Result<()> {
    std::fs::write("/proc/self/setgroups", "deny")?;
    std::fs::write("/proc/self/uid_map", format!("{inside_uid} {outside_uid} 1"))?;
    std::fs::write("/proc/self/gid_map", format!("{inside_gid} {outside_gid} 1"))
}

/// The pipes the command talks through were made by the worker: the tool
/// user gets them, so reopening one (`/dev/stdout`, `/dev/stderr`) works.
/// Only anonymous pipes and sockets: a named file is never touched.
fn give_stdio(uid: u32, gid: u32) {
    for fd in 0..=2 {
        let anonymous = std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .is_ok_and(|l| l.to_str().is_some_and(|l| l.starts_with("pipe:[") || l.starts_with("socket:[")));
        if anonymous {
            let std_fd = match fd {
                0 => std::io::stdin().as_fd().try_clone_to_owned(),
                1 => std::io::stdout().as_fd().try_clone_to_owned(),
                _ => std::io::stderr().as_fd().try_clone_to_owned(),
            };
            if let Ok(owned) = std_fd {
                let _ = nix::unistd::fchown(&owned, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
            }
        }
    }
}

fn drop_to(uid: u32, gid: u32) -> Result<(), String> {
    let (u, g) = (Uid::from_raw(uid), Gid::from_raw(gid));
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setgid(g).map_err(|e| format!("setgid {gid}: {e}"))?;
    nix::unistd::setuid(u).map_err(|e| format!("setuid {uid}: {e}"))?;
    if Uid::current() != u || Uid::effective() != u || Gid::current() != g {
        return Err(format!("still not {uid}:{gid} after setuid"));
    }
    if uid != 0 && nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
        return Err("root could be regained after setuid".into());
    }
    Ok(())
}

/// The private mount tree described in the module doc.
fn confine_mounts(opts: &LaunchOptions, a: &mut Applied, root: bool) -> Result<(), Fatal> {
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

/// The Landlock ABI the rules are written for (all of its rights are used).
const LANDLOCK_ABI: landlock::ABI = landlock::ABI::V6;

fn apply_landlock(opts: &LaunchOptions, a: &mut Applied) {
    use landlock::{
        Access, AccessFs, AccessNet, PathBeneath, PathFd, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
    };
    let write = AccessFs::from_write(LANDLOCK_ABI);
    let file_write = AccessFs::from_file(LANDLOCK_ABI) & write;
    // `none` without a network namespace: no TCP connect or bind either
    // (the seccomp filter that follows closes every other family).
    let net_rules = opts.network == NetworkPolicy::None && !a.network_namespace;
    let result = (|| -> Result<landlock::RestrictionStatus, landlock::RulesetError> {
        let mut ruleset = landlock::Ruleset::default().handle_access(write)?;
        if net_rules {
            // Best effort: a kernel without network rules leaves it to seccomp.
            ruleset = ruleset.handle_access(AccessNet::from_all(LANDLOCK_ABI))?;
        }
        ruleset = ruleset.scope(Scope::AbstractUnixSocket | Scope::Signal)?;
        let mut created = ruleset.create()?;
        let mut dirs = vec![opts.confine.clone()];
        if a.private_tmp {
            dirs.extend(["/tmp", "/var/tmp", "/dev/shm"].map(PathBuf::from));
        }
        for d in dirs.iter().filter(|d| d.is_dir()) {
            if let Ok(fd) = PathFd::new(d) {
                created = created.add_rule(PathBeneath::new(fd, write))?;
            }
        }
        for dev in ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"] {
            if let Ok(fd) = PathFd::new(dev) {
                created = created.add_rule(PathBeneath::new(fd, file_write))?;
            }
        }
        created.restrict_self()
    })();
    match result {
        Ok(status) => {
            let abi = match status.landlock {
                landlock::LandlockStatus::Available { effective_abi, .. } => {
                    format!("ABI {}", format!("{effective_abi:?}").trim_start_matches('V'))
                }
                other => format!("{other:?}"),
            };
            let enforced = status.ruleset != RulesetStatus::NotEnforced;
            let how = match status.ruleset {
                RulesetStatus::FullyEnforced => "fully enforced",
                RulesetStatus::PartiallyEnforced => "partly enforced",
                RulesetStatus::NotEnforced => "not enforced",
            };
            a.landlock = Some(format!("{abi} {how}"));
            a.landlock_fs = enforced;
            a.landlock_net = enforced && net_rules;
            a.landlock_scopes = status.ruleset == RulesetStatus::FullyEnforced;
            a.no_new_privs |= status.no_new_privs;
            if !enforced {
                a.notes.push(
                    "Landlock: not available on this kernel (writes limited by mounts and permissions only)".into(),
                );
            }
        }
        Err(e) => a.notes.push(format!("Landlock: {e}")),
    }
}

fn describe_network(opts: &LaunchOptions, a: &Applied) -> String {
    match (opts.network, a.network_namespace, a.seccomp_net) {
        (NetworkPolicy::Open, _, _) => "open (the host's network, unfiltered)".into(),
        (NetworkPolicy::None, true, _) => "none (an empty network namespace)".into(),
        (NetworkPolicy::None, false, true) => "none (seccomp: Unix sockets only; no network namespace)".into(),
        (NetworkPolicy::None, false, false) => "open (none could not be enforced)".into(),
    }
}

fn apply_rlimits(r: &Rlimits, a: &mut Applied) -> Result<(), String> {
    use nix::sys::resource::{Resource, setrlimit};
    for (res, v, name) in [
        (Resource::RLIMIT_FSIZE, r.file_size, "largest file"),
        (Resource::RLIMIT_NPROC, r.processes, "processes"),
        (Resource::RLIMIT_AS, r.address_space, "address space"),
    ] {
        if let Some(v) = v {
            setrlimit(res, v, v).map_err(|e| format!("limit on the {name}: {e}"))?;
            a.rlimits.push(format!("{name} {v}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_round_trip_through_the_command_line() {
        let o = LaunchOptions {
            user: Some((65534, 65534)),
            network: NetworkPolicy::None,
            cgroups: vec!["/sys/fs/cgroup/x/l0".into()],
            parent: Some(4242),
            rlimits: Rlimits { file_size: Some(1 << 20), processes: None, address_space: Some(1 << 30) },
            no_network_namespace: true,
            egress: Some("/tmp/task/.egress.sock".into()),
            require: Some(Required { pid_namespace: true, read_only: true, ..Default::default() }),
            confine: "/tmp/task".into(),
            hide: vec!["/run/postgresql".into()],
            report: true,
            init: Some(Applied { pid_namespace: true, notes: vec!["a note".into()], ..Default::default() }),
            argv: vec!["bash".into(), "-c".into(), "echo --user".into()],
        };
        assert_eq!(LaunchOptions::parse(&o.to_args()).unwrap(), o);
        assert_eq!(LaunchOptions::from_env(&o.to_env()).unwrap(), o);
        assert!(LaunchOptions::from_env("{").unwrap_err().contains(OPTIONS_ENV));
        assert!(LaunchOptions::parse(&["--confine".into(), "rel".into(), "--".into(), "x".into()]).is_err());
        assert!(LaunchOptions::parse(&["--confine".into(), "/t".into()]).unwrap_err().contains("no command"));
    }

    #[test]
    fn a_launch_with_less_than_required_is_refused_naming_what_is_missing() {
        let full = Applied {
            pid_namespace: true,
            mount_namespace: true,
            network_namespace: true,
            read_only: true,
            proc: "fresh".into(),
            ..Default::default()
        };
        let required = Required::from_applied(&full);
        assert_eq!(required.check(&full), Ok(()));
        let less = Applied { network_namespace: false, notes: vec!["unshare: ENOSPC".into()], ..full.clone() };
        let e = required.check(&less).unwrap_err();
        assert!(e.contains("without a network namespace (unshare: ENOSPC)"), "{e}");
        let host_proc = Applied { proc: "host".into(), read_only: false, ..full };
        assert!(required.check(&host_proc).unwrap_err().contains("without read-only mounts, a fresh /proc"));
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/mnt/a\040b\134c"), OsString::from("/mnt/a b\\c"));
        assert_eq!(unescape(r"/x\04"), OsString::from(r"/x\04"));
    }
}
