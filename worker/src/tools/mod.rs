//! The hands-on tools of a worker, each confined to the task's working
//! directory ([`crate::sandbox`]). Names and input shapes follow the tools
//! models already know (`Read`, `Write`, `Edit`, `Bash`, `Glob`, `Grep`).

use std::sync::Arc;
use std::time::Duration;

use flower_agent::{Tool, ToolSet};

use crate::sandbox::Sandbox;

pub mod bash;
pub mod edit;
pub mod glob;
pub mod grep;
pub mod read;
pub mod write;

/// Limits the tools apply.
#[derive(Clone, Debug)]
pub struct ToolLimits {
    pub bash_timeout: Duration,
    pub bash_output_limit: usize,
    /// How commands start: through the launcher, or directly (see [`crate::isolation`]).
    pub isolation: Arc<crate::isolation::ToolIsolation>,
    /// The task's control group (every launch of the task a leaf in it).
    pub group: Option<Arc<crate::cgroup::LazyGroup>>,
    /// The largest file a command may write: the job's workspace limit.
    pub max_file_size: Option<u64>,
    /// The task's egress proxy, when its job was granted destinations.
    pub egress: Option<Arc<crate::egress::EgressProxy>>,
}

impl ToolLimits {
    /// What a launch of this task adds to the launcher's options.
    pub fn launch<'a>(&'a self, leaf: Option<&'a crate::cgroup::Leaf>) -> crate::isolation::Launch<'a> {
        crate::isolation::Launch {
            leaf,
            max_file_size: self.max_file_size,
            egress: self.egress.as_deref().map(crate::egress::EgressProxy::socket),
        }
    }

    /// A new leaf of the task's control group for one launch, with the group
    /// (made at the task's first launch); `None` without groups.
    pub async fn leaf(&self) -> std::io::Result<Option<(Arc<crate::cgroup::TaskGroup>, crate::cgroup::Leaf)>> {
        let Some(lazy) = &self.group else { return Ok(None) };
        let group = lazy.get().await?;
        let leaf = group.leaf()?;
        Ok(Some((group, leaf)))
    }

    /// The environment a launch adds: the proxy's address when there is one.
    pub fn launch_env(&self) -> Vec<(String, String)> {
        if self.egress.is_some() { crate::egress::proxy_env() } else { Vec::new() }
    }
}

/// The tools named in a worker spec (names validated with the spec).
pub fn toolset(names: &[String], sandbox: &Sandbox, limits: &ToolLimits) -> ToolSet {
    let mut set = ToolSet::new();
    for name in names {
        let tool: Arc<dyn Tool> = match name.as_str() {
            "Read" => Arc::new(read::ReadTool::new(sandbox.clone())),
            "Write" => Arc::new(write::WriteTool::new(sandbox.clone())),
            "Edit" => Arc::new(edit::EditTool::new(sandbox.clone())),
            "Bash" => Arc::new(bash::BashTool::new(sandbox.clone(), limits)),
            "Glob" => Arc::new(glob::GlobTool::new(sandbox.clone())),
            "Grep" => Arc::new(grep::GrepTool::new(sandbox.clone())),
            _ => continue,
        };
        set.add(tool);
    }
    set
}

/// The worker role's surface, shared by every subagent of a job whatever
/// its worker spec (one cache prefix): the built-in tools any of the job's
/// workers was given, the MCP tools (deferred unless listed as resident),
/// then deferral (docs/design.md section 6). Each worker's own list is
/// enforced at call time by [`WorkerToolsGuard`].
pub fn worker_surface(
    spec: &flower_model::JobSpec,
    sandbox: &Sandbox,
    limits: &ToolLimits,
    mcp: Vec<crate::mcp::McpTool>,
) -> ToolSet {
    let given: Vec<String> = flower_model::spec::WORKER_TOOLS
        .iter()
        .filter(|t| spec.workers.values().any(|w| w.tools.iter().any(|n| n == *t)))
        .map(|t| t.to_string())
        .collect();
    let mut set = toolset(&given, sandbox, limits);
    for t in mcp {
        if t.resident {
            set.add(Arc::new(t));
        } else {
            let category = t.category.clone();
            set.add_deferred(Arc::new(t), &category);
        }
    }
    flower_agent::surface::finish(set, spec.runtime.tool_deferral)
}

/// The `denial_kind` the worker's tools guard writes.
pub const WORKER_TOOLS_GUARD: &str = "worker_tools";

/// Denies a built-in tool the running worker was not given (the shared
/// surface shows the job's union).
pub struct WorkerToolsGuard {
    worker: String,
    given: Vec<String>,
}

impl WorkerToolsGuard {
    pub fn new(worker: &str, given: &[String]) -> Self {
        Self { worker: worker.to_string(), given: given.to_vec() }
    }
}

#[async_trait::async_trait]
impl flower_agent::hooks::PreToolHook for WorkerToolsGuard {
    async fn before(
        &self,
        tool: &str,
        _input: &serde_json::Value,
        _ctx: &flower_agent::hooks::HookContext,
    ) -> flower_agent::hooks::PreDecision {
        if flower_model::spec::WORKER_TOOLS.contains(&tool) && !self.given.iter().any(|g| g == tool) {
            return flower_agent::hooks::PreDecision::Deny {
                kind: WORKER_TOOLS_GUARD.into(),
                reason: format!(
                    "worker `{}` was not given `{tool}` (its tools: {}); report what you could not do instead",
                    self.worker,
                    if self.given.is_empty() { "none".to_string() } else { self.given.join(", ") }
                ),
            };
        }
        flower_agent::hooks::PreDecision::Allow
    }
}

/// Tools whose calls may change files (the workbench is synced after them).
pub fn may_write(tool: &str) -> bool {
    matches!(tool, "Write" | "Edit" | "Bash" | "NotebookEdit")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worker_tools_denial_is_counted_under_its_own_kind() {
        assert_eq!(flower_agent::metrics::denial_label(WORKER_TOOLS_GUARD), WORKER_TOOLS_GUARD);
    }
}
