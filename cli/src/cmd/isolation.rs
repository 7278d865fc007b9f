//! How tools run, and what job specs may ask of a worker: the flags of
//! `flower worker`, `flower run` and `flower demo` (isolation and policy) and
//! of `flower coordinator` (policy), and `flower tool-exec`, the launcher
//! every tool command starts through.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;
use flower_model::policy::{McpAllow, ToolPolicy};
use flower_worker::isolation::{
    Cgroups, DEFAULT_HIDE, Launcher, NetworkPolicy, Probed, TaskLimits, ToolSetup, ToolUser,
};

/// What job specs may make a worker start or hand out.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PolicyArgs {
    /// An MCP server jobs may start over stdio, NAME=COMMAND (repeatable): a
    /// spec's `command` must equal COMMAND argument for argument (split on
    /// spaces; `flower` is this binary). `none` allows none
    /// [default: fixture=flower mcp-fixture]
    #[arg(long = "mcp-allow", env = "FLOWER_MCP_ALLOW", value_delimiter = ',')]
    pub mcp_allow: Vec<String>,
    /// A worker environment variable a spec may name in `env_from` (VAR),
    /// or also send as a bearer token with `token_env` to MCP servers whose
    /// URL lies beneath URL (VAR=URL) (repeatable). FLOWER_* and the
    /// service's own credentials are refused [default: none]
    #[arg(long = "env-allow", env = "FLOWER_ENV_ALLOW", value_delimiter = ',')]
    pub env_allow: Vec<String>,
    /// A destination jobs' tools may reach when their spec asks for it
    /// (`network: {egress: [HOST:PORT]}`), through the worker's egress
    /// proxy: HOST:PORT, *.DOMAIN:PORT or HOST:* (repeatable) [default: none]
    #[arg(long = "tool-egress-allow", env = "FLOWER_TOOL_EGRESS_ALLOW", value_delimiter = ',')]
    pub egress_allow: Vec<String>,
}

impl PolicyArgs {
    /// The policy; `service_credentials` are the variables this process
    /// reads its own secrets from (refused in --env-allow, like FLOWER_*).
    pub fn policy(&self, service_credentials: &[String]) -> anyhow::Result<ToolPolicy> {
        let mcp: Vec<McpAllow> = match self.mcp_allow.as_slice() {
            [] => ToolPolicy::default().mcp_allowed().to_vec(),
            [none] if none.trim() == "none" => Vec::new(),
            list => list
                .iter()
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.parse::<McpAllow>().map_err(|e| anyhow::anyhow!("--mcp-allow {e}")))
                .collect::<anyhow::Result<_>>()?,
        };
        let env = self.env_allow.iter().filter(|v| !v.trim().is_empty()).cloned();
        let egress = self
            .egress_allow
            .iter()
            .filter(|v| !v.trim().is_empty())
            .map(|v| v.parse().map_err(|e| anyhow::anyhow!("--tool-egress-allow {e}")))
            .collect::<anyhow::Result<_>>()?;
        Ok(ToolPolicy::new(mcp, env, service_credentials)
            .map_err(|e| anyhow::anyhow!("--env-allow {e}"))?
            .with_egress(egress))
    }
}

/// Variables this process reads credentials from: S3's, the Anthropic key,
/// and `<NAME>_API_KEY` of each configured provider.
pub fn service_credentials(providers: &[String]) -> Vec<String> {
    let mut v: Vec<String> = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "ANTHROPIC_API_KEY"]
        .map(String::from)
        .into();
    for p in providers {
        let name = p.split_once('=').map_or(p.as_str(), |(n, _)| n).trim();
        if !name.is_empty() {
            v.push(format!("{}_API_KEY", name.to_ascii_uppercase().replace('-', "_")));
        }
    }
    v
}

/// How tools (Bash, MCP stdio servers) run on this worker.
#[derive(clap::Args, Clone, Debug)]
pub struct ToolArgs {
    /// Start tools through the launcher (on), or directly as this process's
    /// user with only their environment cleaned (off)
    #[arg(long, env = "FLOWER_TOOL_ISOLATION", default_value = "on", value_parser = super::on_off, action = clap::ArgAction::Set)]
    pub tool_isolation: bool,
    /// The user tools run as when this process is root: NAME, UID or UID:GID
    /// [default: nobody]
    #[arg(long, env = "FLOWER_TOOL_USER")]
    pub tool_user: Option<String>,
    /// Network of tools: none (no network at all: an empty network
    /// namespace, or a seccomp filter leaving Unix sockets only where the
    /// host refuses namespaces), or open (the host's network, unfiltered:
    /// only for trials on a machine of your own)
    #[arg(long, env = "FLOWER_TOOL_NETWORK", default_value = "none")]
    pub tool_network: NetworkPolicy,
    /// Processes and threads one task's tools may run at once (0: no limit)
    #[arg(long, env = "FLOWER_TOOL_MAX_PROCESSES", default_value_t = 512)]
    pub tool_max_processes: u64,
    /// Memory one task's tools may use together, page cache and tmpfs
    /// included (0: no limit)
    #[arg(long, env = "FLOWER_TOOL_MAX_MEMORY", default_value = "2GiB")]
    pub tool_max_memory: bytesize::ByteSize,
    /// CPUs one task's tools may use together, e.g. 1.5 (0: no cap; tasks
    /// then share the CPU evenly)
    #[arg(long, env = "FLOWER_TOOL_CPUS", default_value_t = 0.0)]
    pub tool_cpus: f64,
    /// The launcher executable (a `flower` binary) [default: this one]
    #[arg(long, env = "FLOWER_TOOL_LAUNCHER", hide = true)]
    pub tool_launcher: Option<PathBuf>,
}

impl ToolArgs {
    /// How this process runs tools, with `policy`: the launcher probed once
    /// in `work_root` (an error when it cannot run: tool isolation is not
    /// dropped for want of it), or, with `--tool-isolation off`, tools run
    /// directly; and the line saying what is in force. Whatever of the full
    /// isolation this host refuses is logged as a warning, once. `private`
    /// directories (the work root, a local store) are hidden from tools: a
    /// task sees its own directory, not its neighbours' nor the store's.
    pub fn setup(
        &self,
        work_root: &Path,
        private: &[PathBuf],
        service_urls: &[&str],
        policy: ToolPolicy,
    ) -> anyhow::Result<(ToolSetup, String)> {
        let described = policy.describe();
        if !self.tool_isolation {
            let line = format!(
                "tool isolation off: tools run directly as this process's user, only their environment cleaned; {described}"
            );
            tracing::warn!("{line}");
            flower_worker::isolation::close_own_proc_entries();
            return Ok((ToolSetup::direct(policy), line));
        }
        let (probed, summary) = self.launcher(work_root, private, service_urls)?;
        flower_worker::isolation::close_own_proc_entries();
        let line = format!("tool isolation: {summary}; {described}");
        Ok((ToolSetup::launched(probed, policy), line))
    }

    /// The launcher these flags describe, probed once in `work_root`, and
    /// what it puts in force (each missing part logged as a warning).
    pub fn launcher(
        &self,
        work_root: &Path,
        private: &[PathBuf],
        service_urls: &[&str],
    ) -> anyhow::Result<(Probed, String)> {
        let program = match &self.tool_launcher {
            Some(p) => p.clone(),
            None => std::env::current_exe().context("locating this binary (the tool launcher)")?,
        };
        let user = self.tool_user()?;
        let hide = hidden(work_root, private, service_urls);
        if self.tool_network == NetworkPolicy::Open {
            tracing::warn!(
                "--tool-network open: tools reach the host's network, the service's database, bus and API included"
            );
        }
        let limits = self.task_limits()?;
        let host = Host::prepare(work_root)?;
        let launcher = Launcher {
            program,
            user,
            network: self.tool_network,
            hide,
            cgroups: host.cgroups,
            limits,
            require: None,
            bounded_dirs: host.bounded_dirs,
            hold: Some(std::sync::Arc::new(host.hold)),
        };
        let scratch = work_root.join(format!(".tool-probe-{}", std::process::id()));
        let probed = launcher.probe(&scratch).map_err(|e| {
            anyhow::anyhow!("tool isolation could not start: {e} (--tool-isolation off runs tools without it)")
        })?;
        let summary = in_force(&probed);
        Ok((probed, summary))
    }

    /// Whom tools run as: `--tool-user` (another user only from root), else
    /// `nobody` when this process is root, else this process's user (`None`).
    fn tool_user(&self) -> anyhow::Result<Option<ToolUser>> {
        let root = flower_worker::isolation::effective_uid() == 0;
        let user =
            match (&self.tool_user, root) {
                (Some(u), true) => Some(ToolUser::resolve(u).map_err(|e| anyhow::anyhow!("--tool-user {e}"))?),
                (None, true) => Some(ToolUser::resolve("nobody").map_err(|e| {
                    anyhow::anyhow!("--tool-user: the default user {e}; name one (NAME, UID or UID:GID)")
                })?),
                (Some(u), false) => {
                    let wanted = ToolUser::resolve(u).map_err(|e| anyhow::anyhow!("--tool-user {e}"))?;
                    anyhow::ensure!(
                        wanted.uid == flower_worker::isolation::effective_uid(),
                        "--tool-user {u}: running tools as another user needs this process to run as root"
                    );
                    None
                }
                (None, false) => None,
            };
        if let Some(u) = &user
            && u.uid == 0
        {
            tracing::warn!("--tool-user {}: tools run as root", u.name);
        }
        Ok(user)
    }

    /// Each task's limits (processes, memory, CPUs; 0 is none).
    fn task_limits(&self) -> anyhow::Result<TaskLimits> {
        anyhow::ensure!(
            self.tool_cpus.is_finite() && self.tool_cpus >= 0.0,
            "--tool-cpus {}: a number of CPUs, 0 or more",
            self.tool_cpus
        );
        Ok(TaskLimits {
            processes: Some(self.tool_max_processes).filter(|n| *n > 0),
            memory: Some(self.tool_max_memory.as_u64()).filter(|n| *n > 0),
            cpu_millis: Some((self.tool_cpus * 1000.0).round() as u64).filter(|n| *n > 0),
        })
    }
}

/// What tools never see: the default paths, the work root (other tasks'
/// folders), the process's private paths and the services' sockets.
fn hidden(work_root: &Path, private: &[PathBuf], service_urls: &[&str]) -> Vec<PathBuf> {
    let mut hide: Vec<PathBuf> = DEFAULT_HIDE.iter().map(PathBuf::from).collect();
    hide.push(work_root.to_path_buf());
    hide.extend(private.iter().cloned());
    for url in service_urls {
        hide.extend(url_endpoints(url).1);
    }
    hide
}

/// What the host gives the launcher: the work root held (what a dead
/// worker left there cleaned up), bounded task folders when it can mount,
/// and control groups when it has them.
struct Host {
    hold: std::fs::File,
    bounded_dirs: bool,
    cgroups: Option<std::sync::Arc<Cgroups>>,
}

impl Host {
    fn prepare(work_root: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(work_root).with_context(|| format!("{}", work_root.display()))?;
        // Shared with every live process on this root; the first one after
        // a death unmounts what the dead left.
        let (hold, left) = flower_worker::taskdir::hold(work_root)
            .with_context(|| format!("holding the work root {}", work_root.display()))?;
        if left > 0 {
            tracing::warn!(mounts = left, "unmounted task folders a previous worker left mounted");
        }
        let root = flower_worker::isolation::effective_uid() == 0;
        let bounded_dirs =
            root && flower_worker::taskdir::can_mount(&work_root.join(format!(".mount-probe-{}", std::process::id())));
        let cgroups = match Cgroups::setup() {
            Ok((c, ended)) => {
                if ended > 0 {
                    tracing::warn!(processes = ended, "ended tool processes a previous worker left running");
                }
                Some(std::sync::Arc::new(c))
            }
            Err(e) => {
                tracing::warn!(error = %e, "no control groups for tools: limits fall back to per-process resource limits");
                None
            }
        };
        Ok(Self { hold, bounded_dirs, cgroups })
    }
}

/// What the probed launcher puts in force, in a line; each missing part
/// logged as a warning.
fn in_force(probed: &Probed) -> String {
    let (mut summary, mut missing) = probed.describe();
    let launcher = probed.launcher();
    if launcher.bounded_dirs {
        summary.push_str("; task folders: a bounded tmpfs each");
    } else {
        missing.push("task folders are plain directories: their size is checked when the changes are collected, not as they are written".into());
    }
    if !launcher.egress_possible() {
        missing.push("no network namespace for tools: jobs asking for egress fail (tools have no network)".into());
    }
    for m in &missing {
        tracing::warn!("tool isolation: {m}");
    }
    if missing.is_empty() {
        tracing::info!("tool isolation: {summary}");
    } else {
        tracing::warn!("tool isolation: {summary}");
    }
    summary
}

/// The directory of a `file://` object store URL (hidden from tools).
pub fn local_store(url: &str) -> Option<PathBuf> {
    url.strip_prefix("file://").filter(|p| p.starts_with('/')).map(PathBuf::from)
}

/// The TCP ports and Unix socket directories a service URL names
/// (`postgres://u:p@host:5432/db`, `nats://a:4222,b:4223`,
/// `postgres:///db?host=/run/postgresql`).
pub fn url_endpoints(url: &str) -> (Vec<u16>, Vec<PathBuf>) {
    let default = if url.starts_with("nats") { 4222 } else { 5432 };
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let mut ports = Vec::new();
    let mut sockets = Vec::new();
    for host in authority.split(',').filter(|h| !h.is_empty()) {
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        let port = match host.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') && !p.contains(']') => p.parse().ok(),
            _ => None,
        };
        if host.starts_with("%2F") || host.starts_with("%2f") {
            sockets.push(PathBuf::from(host.replace("%2F", "/").replace("%2f", "/")));
        } else {
            ports.push(port.unwrap_or(default));
        }
    }
    if let Some((_, query)) = tail.split_once('?') {
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some(("host", h)) if h.starts_with('/') => sockets.push(PathBuf::from(h)),
                Some(("port", p)) => ports.extend(p.parse::<u16>().ok()),
                _ => {}
            }
        }
    }
    if ports.is_empty() {
        ports.push(default);
    }
    (ports, sockets)
}

/// `flower tool-exec …`: the launcher (arguments are read before the rest of
/// the command line is parsed). A worker passes no argument and its options
/// in `FLOWER_TOOL_EXEC`; nothing else is read from the environment.
pub fn tool_exec(args: Vec<OsString>) -> std::process::ExitCode {
    use flower_worker::launch::{LaunchOptions, OPTIONS_ENV};
    let opts = match (args.is_empty(), std::env::var(OPTIONS_ENV)) {
        (true, Ok(v)) => LaunchOptions::from_env(&v),
        (true, Err(_)) => Err(format!("no options: give them as arguments or in {OPTIONS_ENV}")),
        (false, _) => LaunchOptions::parse(&args),
    };
    let code = match opts {
        Ok(opts) => flower_worker::launch::run(opts),
        Err(e) => {
            eprintln!("flower tool-exec: {e}");
            flower_worker::launch::SETUP_FAILED
        }
    };
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_urls_give_their_ports_and_sockets() {
        assert_eq!(url_endpoints("postgres://u:p@db.internal:6543/flower").0, vec![6543]);
        assert_eq!(url_endpoints("postgres://postgres@127.0.0.1/postgres").0, vec![5432]);
        assert_eq!(url_endpoints("nats://127.0.0.1:4333").0, vec![4333]);
        assert_eq!(url_endpoints("nats://a:4223,b:4224").0, vec![4223, 4224]);
        let (ports, sockets) = url_endpoints("postgres:///flower?host=/var/run/pg&port=5433");
        assert_eq!((ports, sockets), (vec![5433], vec![PathBuf::from("/var/run/pg")]));
        assert_eq!(url_endpoints("postgresql://%2Frun%2Fpg/db").1, vec![PathBuf::from("/run/pg")]);
    }

    #[test]
    fn the_policy_flags_refuse_the_service_secrets() {
        let creds = service_credentials(&["sim=http://x".into(), "my-llm=https://y".into()]);
        assert!(creds.contains(&"MY_LLM_API_KEY".to_string()) && creds.contains(&"AWS_SECRET_ACCESS_KEY".into()));
        let args = |env: &[&str]| PolicyArgs {
            mcp_allow: vec![],
            env_allow: env.iter().map(|s| s.to_string()).collect(),
            egress_allow: vec![],
        };
        assert!(args(&["FLOWER_DATABASE_URL"]).policy(&creds).unwrap_err().to_string().contains("FLOWER_*"));
        assert!(args(&["MY_LLM_API_KEY"]).policy(&creds).is_err());
        let p = args(&["GITHUB_TOKEN"]).policy(&creds).unwrap();
        assert_eq!(p.mcp_allowed(), ToolPolicy::default().mcp_allowed(), "the fixture by default");
        let none = PolicyArgs { mcp_allow: vec!["none".into()], env_allow: vec![], egress_allow: vec![] }
            .policy(&creds)
            .unwrap();
        assert!(none.mcp_allowed().is_empty());
        let bad = PolicyArgs { mcp_allow: vec!["just-a-command".into()], env_allow: vec![], egress_allow: vec![] };
        assert!(bad.policy(&creds).unwrap_err().to_string().contains("NAME=COMMAND"));
    }
}
