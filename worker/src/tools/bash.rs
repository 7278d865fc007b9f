//! `Bash`: a shell command in the working directory, with a timeout, its own
//! process group (killed whole on timeout or cancel), captured output capped,
//! and an environment built from an allowlist — never the service's secrets.
//! With the launcher ([`crate::isolation`]) the command also runs as another
//! user in its own namespaces, unable to write outside the working directory.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use flower_agent::tool::{args, schema_of};
use flower_agent::{Tool, ToolContext, ToolError, ToolOutput};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::cgroup::{Counters, Leaf, TaskGroup};
use crate::isolation::{TOOL_PATH, ToolIsolation};
use crate::sandbox::Sandbox;
use crate::tools::ToolLimits;

/// Variables passed through from the worker's environment when set.
const PASS_THROUGH: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ", "USER", "LOGNAME"];
/// Longest timeout a call may ask for.
const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// The arguments of `Bash`.
#[derive(Debug, Deserialize, JsonSchema)]
struct BashArgs {
    /// The command line
    command: String,
    /// Milliseconds
    #[schemars(range(min = 1))]
    timeout: Option<u64>,
    /// What the command does, in a few words
    #[allow(dead_code, reason = "asked of the model for its own sake; the command is what runs")]
    description: Option<String>,
}

pub struct BashTool {
    sandbox: Sandbox,
    limits: ToolLimits,
}

impl BashTool {
    pub fn new(sandbox: Sandbox, limits: &ToolLimits) -> Self {
        Self { sandbox, limits: limits.clone() }
    }
}

/// What the kernel stopped during one command, as the note the model reads.
fn limits_note(l: &crate::cgroup::TaskLimits, hit: Counters) -> String {
    let mut note = String::new();
    if hit.oom_kills > 0 {
        let max = l.memory.map_or_else(String::new, |m| format!(" ({})", bytesize::ByteSize::b(m)));
        note.push_str(&format!(
            "\n[the task's memory limit{max} was reached: the kernel killed {} process(es)]",
            hit.oom_kills
        ));
    }
    if hit.forks_refused > 0 {
        let max = l.processes.map_or_else(String::new, |n| format!(" ({n})"));
        note.push_str(&format!(
            "\n[the task's process limit{max} was reached: {} new process(es) refused]",
            hit.forks_refused
        ));
    }
    note
}

/// How a command starts, as far as its environment goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via<'a> {
    /// Directly, as the worker's user.
    Directly,
    /// Through the launcher; `user`: the other user it runs as, if any.
    Launcher { user: Option<&'a str> },
}

/// The environment a command gets: the allowlist, plus fixed values
/// (`USER`/`LOGNAME` name the tool user when the command runs as another
/// user). A launched command's `PATH` is the system's ([`TOOL_PATH`]),
/// never the worker's, which may name the service's own directories.
pub fn command_env(workdir: &std::path::Path, via: Via<'_>) -> Vec<(String, String)> {
    let (user, launched) = match via {
        Via::Directly => (None, false),
        Via::Launcher { user } => (user, true),
    };
    let mut env: Vec<(String, String)> = PASS_THROUGH
        .iter()
        .filter(|k| user.is_none() || !matches!(**k, "USER" | "LOGNAME"))
        .filter(|k| !launched || **k != "PATH")
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    if let Some(u) = user {
        env.push(("USER".into(), u.to_string()));
        env.push(("LOGNAME".into(), u.to_string()));
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), TOOL_PATH.into()));
    }
    env.push(("HOME".into(), workdir.display().to_string()));
    env.push(("PWD".into(), workdir.display().to_string()));
    env.push(("TERM".into(), "dumb".into()));
    env.push(("SHELL".into(), "/bin/bash".into()));
    env
}

/// Output of both streams, interleaved as read, capped at `limit` bytes.
#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: usize,
}

async fn pump(mut r: impl AsyncRead + Unpin, sink: Arc<Mutex<Captured>>, limit: usize) {
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut c = sink.lock().unwrap_or_else(|p| p.into_inner());
                let room = limit.saturating_sub(c.bytes.len());
                let take = room.min(n);
                c.bytes.extend_from_slice(&buf[..take]);
                c.dropped += n - take;
            }
        }
    }
}

enum Ended {
    Exited(std::process::ExitStatus),
    TimedOut,
    Cancelled,
}

/// A started command: its process, and when it was launched in a control
/// group, the task's group and the launch's leaf in it.
struct Started {
    child: Child,
    group: Option<Arc<TaskGroup>>,
    leaf: Option<Leaf>,
}

impl BashTool {
    /// `command` started in `root`: directly, or through the launcher (the
    /// directory handed to the tool user first, the launch a new leaf of
    /// the task's control group), in a process group of its own.
    async fn start(&self, root: &Path, command: &str) -> Result<Started, ToolError> {
        let mut leaf = None;
        let mut group: Option<Arc<TaskGroup>> = None;
        let mut cmd = match &*self.limits.isolation {
            ToolIsolation::None => {
                let mut c = Command::new("bash");
                c.arg("-c").arg(command).env_clear().envs(command_env(root, Via::Directly));
                c
            }
            ToolIsolation::Launcher(l) => {
                l.hand_over(root).await.map_err(|e| {
                    ToolError::RespondToModel(format!("could not hand the working directory to the command: {e}"))
                })?;
                let made = self.limits.leaf().await.map_err(|e| {
                    ToolError::RespondToModel(format!("could not make the command's control group: {e}"))
                })?;
                (group, leaf) = made.unzip();
                let launch = self.limits.launch(leaf.as_ref());
                let mut env = command_env(root, Via::Launcher { user: l.user_name() });
                env.extend(self.limits.launch_env());
                l.command(root, vec!["bash".into(), "-c".into(), command.into()], &launch, env)
            }
        };
        let child = cmd
            .current_dir(root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ToolError::RespondToModel(format!("could not start bash: {e}")))?;
        Ok(Started { child, group, leaf })
    }
}

/// Read both of the child's output streams into `captured` (up to `limit`).
fn capture(child: &mut Child, captured: &Arc<Mutex<Captured>>, limit: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(pump(out, captured.clone(), limit)));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(tokio::spawn(pump(err, captured.clone(), limit)));
    }
    readers
}

/// Wait for the command to exit, its timeout, or the call's cancel; on the
/// last two, its process group is killed.
async fn wait_or_kill(child: &mut Child, timeout: Duration, cancel: &CancellationToken) -> Result<Ended, ToolError> {
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let ended = tokio::select! {
        status = child.wait() => Ended::Exited(status.map_err(|e| ToolError::RespondToModel(e.to_string()))?),
        _ = tokio::time::sleep(timeout) => Ended::TimedOut,
        _ = cancel.cancelled() => Ended::Cancelled,
    };
    if !matches!(ended, Ended::Exited(_)) {
        if let Some(pgid) = pgid {
            // The group may already be gone; that is the wanted state.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        let _ = child.wait().await;
    }
    Ok(ended)
}

/// Whatever the command left running (a `setsid` daemon included) ends
/// with it: the launch's leaf is killed whole and removed. What the kernel
/// stopped during the launch (its group's counters since `before`).
async fn close_launch(leaf: Option<Leaf>, group: Option<&Arc<TaskGroup>>, before: Counters) -> Counters {
    let (Some(leaf), Some(g)) = (leaf, group) else { return Counters::default() };
    let hit = Counters::of_launch(leaf.counters(), before, g.counters());
    let _ = tokio::task::spawn_blocking(move || leaf.close()).await;
    hit
}

/// What the model reads of the command: its output, how it ended, what the
/// kernel stopped at a limit; and whether the call failed.
fn verdict(
    c: Captured,
    ended: &Ended,
    timeout: Duration,
    group: Option<&Arc<TaskGroup>>,
    hit: Counters,
) -> (String, bool) {
    let mut text = String::from_utf8_lossy(&c.bytes).into_owned();
    if c.dropped > 0 {
        text.push_str(&format!("\n[output cut: {} more bytes not captured]", c.dropped));
    }
    let (suffix, mut is_error) = match ended {
        Ended::Exited(s) if s.success() => (String::new(), false),
        Ended::Exited(s) => (format!("\n[exit code {}]", s.code().map_or("signal".into(), |c| c.to_string())), true),
        Ended::TimedOut => (format!("\n[timed out after {} ms; process group killed]", timeout.as_millis()), true),
        Ended::Cancelled => ("\n[cancelled; process group killed]".into(), true),
    };
    text.push_str(&suffix);
    if let Some(g) = group {
        text.push_str(&limits_note(g.limits(), hit));
    }
    // A command the kernel stopped at a limit failed, whatever its own status.
    is_error |= hit.oom_kills > 0 || hit.forks_refused > 0;
    if text.trim().is_empty() {
        text = "(no output)".into();
    }
    (text, is_error)
}

#[async_trait]
impl Tool for BashTool {
    fn name(&self) -> &str {
        "Bash"
    }
    fn description(&self) -> String {
        format!(
            "Run a bash command in the working directory. Output (stdout and stderr) is captured up to {} KiB. \
             Optional `timeout` in milliseconds (default {} s, at most {} s); on timeout the whole process group is killed. \
             The environment is minimal: no credentials are available.",
            self.limits.bash_output_limit / 1024,
            self.limits.bash_timeout.as_secs(),
            MAX_TIMEOUT.as_secs()
        )
    }
    fn input_schema(&self) -> Value {
        schema_of::<BashArgs>()
    }
    async fn call(&self, input: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let BashArgs { command, timeout, .. } = args(input)?;
        let timeout = timeout.map_or(self.limits.bash_timeout, Duration::from_millis).min(MAX_TIMEOUT);
        let root = self.sandbox.root().to_path_buf();
        let Started { mut child, group, leaf } = self.start(&root, &command).await?;
        let before = group.as_ref().map(|g| g.counters()).unwrap_or_default();
        let captured = Arc::new(Mutex::new(Captured::default()));
        let readers = capture(&mut child, &captured, self.limits.bash_output_limit);
        let ended = wait_or_kill(&mut child, timeout, &ctx.cancel).await?;
        let hit = close_launch(leaf, group.as_ref(), before).await;
        for r in readers {
            // Background children that kept the pipes open: stop waiting after a moment.
            let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
        }
        let c = std::mem::take(&mut *captured.lock().unwrap_or_else(|p| p.into_inner()));
        let (text, is_error) = verdict(c, &ended, timeout, group.as_ref(), hit);
        // The verdict is recorded when the call is made; a later, different
        // policy never re-judges this entry.
        let mut out = ToolOutput { is_error, ..ToolOutput::text(text) };
        out.markers.ephemeral = Some(flower_agent::glance::is_ephemeral(&command).allowed);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_derived_schema_is_unchanged() {
        assert_eq!(
            schema_of::<BashArgs>(),
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command line"},
                    "timeout": {"type": "integer", "minimum": 1, "description": "Milliseconds"},
                    "description": {"type": "string", "description": "What the command does, in a few words"}
                },
                "required": ["command"]
            })
        );
    }
}
