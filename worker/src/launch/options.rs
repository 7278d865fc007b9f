//! What the launcher is asked to do ([`LaunchOptions`], on its command line
//! or in [`OPTIONS_ENV`]), what a launch must put in force ([`Required`]),
//! and what it reports it did ([`Applied`]).

use std::ffi::OsString;
use std::path::PathBuf;

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
    pub(super) fn check(&self, a: &Applied) -> Result<(), String> {
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
}
