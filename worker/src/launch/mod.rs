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

//!
//! # Layout
//! - this module: the stages, in order, and what each puts in force
//! - `options`: what a launch is asked to do, must put in force, and reports
//! - `mounts`: the private mount tree and `/proc` (step 3)

use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::errno::Errno;
use nix::sched::{CloneFlags, unshare};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Gid, Pid, Uid};

use mounts::{Fatal, confine_mounts, mount_proc};
pub use options::{Applied, LaunchOptions, NetworkPolicy, OPTIONS_ENV, Required, Rlimits};

mod mounts;
mod options;

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
    final_stage(opts, a, Stage::Launcher)
}

fn init_stage(opts: &LaunchOptions, applied: Applied) -> Result<i32, String> {
    // Whatever ends the launcher above ends this process, and with it the namespace.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    final_stage(opts, applied, Stage::Pid1)
}

/// Which process of a launch runs its last stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The launcher itself (there is no PID namespace): the command replaces it.
    Launcher,
    /// Pid 1 of the launch's PID namespace: the command is its child, and
    /// it reaps every orphan until the command ends.
    Pid1,
}

/// Steps 3 to 8 of the module doc: mounts, credentials, Landlock, seccomp,
/// resource limits, then the command (or the report).
fn final_stage(opts: &LaunchOptions, mut a: Applied, stage: Stage) -> Result<i32, String> {
    let root = Uid::effective().is_root() && !a.user_namespace;
    // `/proc/self/exe` (this binary, as an MCP server spec's `flower`) needs
    // a /proc; where only an empty one is left, its path instead.
    let self_exe = std::env::current_exe().ok();
    confine(opts, &mut a, stage, root)?;
    let forward = egress_way(opts, &mut a, stage);
    change_credentials(opts, &mut a, stage, root)?;
    restrict(opts, &mut a)?;
    if opts.report {
        println!("{}", serde_json::to_string(&a).map_err(|e| e.to_string())?);
        return Ok(0);
    }
    run_command(opts, &a, stage, self_exe, forward)
}

/// The private mount tree and /proc (where there is a mount namespace),
/// checked against what is required; the working directory the task's.
fn confine(opts: &LaunchOptions, a: &mut Applied, stage: Stage, root: bool) -> Result<(), String> {
    a.proc = "host".into();
    if a.mount_namespace
        && let Err(Fatal(e)) = confine_mounts(opts, a, root)
    {
        return Err(e);
    }
    if a.mount_namespace {
        a.proc = mount_proc(stage);
        if a.proc == "host" {
            a.notes.push("/proc: neither a fresh one nor an empty one could be mounted".into());
        }
    }
    if let Some(r) = &opts.require {
        r.check(a)?;
    }
    std::env::set_current_dir(&opts.confine).map_err(|e| format!("{}: {e}", opts.confine.display()))
}

/// The way to the egress proxy, made while the namespace's capabilities
/// last: a listener inside the network namespace, and the proxy's socket.
fn egress_way(opts: &LaunchOptions, a: &mut Applied, stage: Stage) -> Option<(std::net::TcpListener, PathBuf)> {
    match (&opts.egress, stage == Stage::Pid1 && a.network_namespace) {
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
    }
}

/// Step 4: the tool user (as root), or a nested user namespace that drops
/// the namespace's capabilities; not dumpable, dying with its parent, and
/// `no_new_privs`.
fn change_credentials(opts: &LaunchOptions, a: &mut Applied, stage: Stage, root: bool) -> Result<(), String> {
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
    if stage == Stage::Pid1 || a.dies_with_worker {
        // Set again: a change of credentials clears it.
        let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    }
    a.no_new_privs = nix::sys::prctl::set_no_new_privs().is_ok();
    Ok(())
}

/// Steps 5 to 7: Landlock, the seccomp filters (no network left where a
/// namespace could not take it away, or the launch is refused), resource
/// limits; and what the network policy became.
fn restrict(opts: &LaunchOptions, a: &mut Applied) -> Result<(), String> {
    apply_landlock(opts, a);
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
    apply_rlimits(&opts.rlimits, a)?;
    a.network = describe_network(opts, a);
    Ok(())
}

/// Step 8: the command replaces the launcher, or runs as pid 1's child
/// (the egress forwarder beside it) until it ends; its exit code.
fn run_command(
    opts: &LaunchOptions,
    a: &Applied,
    stage: Stage,
    self_exe: Option<PathBuf>,
    forward: Option<(std::net::TcpListener, PathBuf)>,
) -> Result<i32, String> {
    let (program, args) = opts.argv.split_first().ok_or("no command")?;
    let program = match &self_exe {
        Some(exe) if program == "/proc/self/exe" && a.proc == "hidden" => exe.as_os_str(),
        _ => program.as_os_str(),
    };
    let mut cmd = Command::new(program);
    cmd.args(args).env_remove(OPTIONS_ENV);
    if stage == Stage::Launcher {
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
    reap_until(pid)
}

/// Pid 1 reaps every orphan; the command's end (`pid`) is the namespace's
/// end: its exit code.
fn reap_until(pid: Pid) -> Result<i32, String> {
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

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

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
